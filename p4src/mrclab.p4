/*
 * mrclab: SRv6 uN (uSID shift) forwarding from static tables, for a multi-plane two-tier Clos.
 *
 * P4_16, v1model (BMv2 simple_switch_grpc). Entries come from controller/routeplan.py.
 *
 *   parse     Ethernet / outer IPv6 / [inner IPv6] / [UDP]
 *   my_sid    exact on the first 48 bits of the outer destination, dst_sid = locator block (32) +
 *             active uSID (16) (RFC 9800 NEXT-C-SID): hit -> uN: the uSIDs after it move up by one
 *             16-bit uSID, the block stays.
 *   routing   LPM on dst_sid after the shift (block + next uSID; the route plan's prefixes are /48)
 *             -> egress port, MAC rewrite, hop limit - 1. Miss -> drop (NO_ROUTE).
 *             "No match on either: drop and count" (docs/mrc.md, SRv6 uN forwarding).
 *   hop limit a packet arriving with hop limit <= 1 is dropped (HOP_LIMIT).
 *   faults    fault_ctl, a keyless table whose default action the controller sets: NoAction (a
 *             healthy switch), check_ports (some port has a port_fault entry: look it up) or
 *             blackhole (drop every packet before any lookup; the switch stays up and answers
 *             P4Runtime: the paper's section 5.1 T1 incident). port_fault: per egress port, drop
 *             with probability threshold / 65536 (gray; 65536: all). The draw is a per-port LCG
 *             (Numerical Recipes constants) XORed with a salt from the entry, so a run is
 *             repeatable for a given seed and packet order.
 *   counters  port_tx (packets, bytes) by egress port, in egress: only packets that leave;
 *             drops by (ingress port << 3 | reason), counted by the action that drops.
 *
 * Cost: BMv2 builds with logging macros (p4lang's packages, the default build) format every table
 * lookup's key and every hit's entry even when nothing is logged, so each table a packet meets is
 * the dearest thing in this program. A healthy switch's packets meet three (fault_ctl, my_sid,
 * routing) and one conditional after the header checks; port_fault is looked up only while some
 * port has a fault. `mrclab bench fabric` measures it against a port-to-port program.
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV6 = 0x86DD;
const bit<8>  PROTO_IPV6     = 41;
const bit<8>  PROTO_UDP      = 17;

/* Drop reasons: index = (port << 3) | reason in the `drops` counter. */
const bit<32> DROP_NOT_IPV6  = 0;
const bit<32> DROP_NO_ROUTE  = 1;
const bit<32> DROP_HOP_LIMIT = 2;
const bit<32> DROP_BLACKHOLE = 3;
const bit<32> DROP_GRAY      = 4;

const bit<32> MAX_PORTS = 512;

header ethernet_t {
    bit<48> dst_addr;
    bit<48> src_addr;
    bit<16> ether_type;
}

header ipv6_t {
    bit<4>   version;
    bit<8>   traffic_class;
    bit<20>  flow_label;
    bit<16>  payload_len;
    bit<8>   next_hdr;
    bit<8>   hop_limit;
    bit<128> src_addr;
    bit<128> dst_addr;
}

/* The outer header with its destination split where uN needs it: the first 48 bits (block +
 * active uSID, what my_sid and routing match) and the 80 bits of uSIDs behind them. The uN shift is
 * then two assignments, and no table key needs a concatenation. */
header outer_ipv6_t {
    bit<4>   version;
    bit<8>   traffic_class;
    bit<20>  flow_label;
    bit<16>  payload_len;
    bit<8>   next_hdr;
    bit<8>   hop_limit;
    bit<128> src_addr;
    bit<48>  dst_sid;
    bit<80>  dst_usids;
}

header udp_t {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

struct headers_t {
    ethernet_t   ethernet;
    outer_ipv6_t ipv6;
    ipv6_t     inner_ipv6;
    udp_t      udp;
}

struct metadata_t {
    bit<1>  check_ports;     /* fault_ctl: some port has a port_fault entry */
    bit<32> gray_draw;       /* this packet's draw, 0..65535 */
    bit<32> gray_threshold;  /* drop when draw < threshold */
}

parser MrcParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                 inout standard_metadata_t std) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            ETHERTYPE_IPV6: parse_ipv6;
            default: accept;
        }
    }
    state parse_ipv6 {
        pkt.extract(hdr.ipv6);
        transition select(hdr.ipv6.next_hdr) {
            PROTO_IPV6: parse_inner_ipv6;
            PROTO_UDP: parse_udp;
            default: accept;
        }
    }
    state parse_inner_ipv6 {
        pkt.extract(hdr.inner_ipv6);
        transition select(hdr.inner_ipv6.next_hdr) {
            PROTO_UDP: parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition accept;
    }
}

control MrcVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control MrcIngress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    counter(MAX_PORTS * 8, CounterType.packets) drops;
    register<bit<32>>(MAX_PORTS) gray_state;

    action drop_with(bit<32> reason) {
        mark_to_drop(std);
        drops.count(((bit<32>) std.ingress_port << 3) | reason);
    }

    /* uN: the uSID after the active one becomes active; the rest move up by 16 bits. */
    action usid_shift() {
        hdr.ipv6.dst_sid[15:0] = hdr.ipv6.dst_usids[79:64];
        hdr.ipv6.dst_usids = hdr.ipv6.dst_usids << 16;
    }

    table my_sid {
        key = { hdr.ipv6.dst_sid : exact @name("dst48"); }
        actions = { usid_shift; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    action forward(bit<9> port, bit<48> src_mac, bit<48> dst_mac) {
        std.egress_spec = port;
        hdr.ethernet.src_addr = src_mac;
        hdr.ethernet.dst_addr = dst_mac;
        hdr.ipv6.hop_limit = hdr.ipv6.hop_limit - 1;
    }

    action no_route() {
        drop_with(DROP_NO_ROUTE);
    }

    /* LPM on block + next uSID: the route plan's prefixes are /48 (block | uSID). */
    table routing {
        key = { hdr.ipv6.dst_sid : lpm @name("dst48"); }
        actions = { forward; no_route; }
        default_action = no_route();
        size = 4096;
    }

    action blackhole() {
        drop_with(DROP_BLACKHOLE);
    }

    action check_ports() {
        meta.check_ports = 1;
    }

    table fault_ctl {
        key = { }
        actions = { NoAction; check_ports; blackhole; }
        default_action = NoAction();
        size = 1;
    }

    /* BMv2 has no conditionals inside actions: the action draws, the control decides. */
    action gray_loss(bit<32> threshold, bit<32> salt) {
        bit<32> state;
        bit<32> idx = (bit<32>) std.egress_spec;
        gray_state.read(state, idx);
        state = state * 1664525 + 1013904223;
        gray_state.write(idx, state);
        meta.gray_draw = (state ^ salt) >> 16;
        meta.gray_threshold = threshold;
    }

    table port_fault {
        key = { std.egress_spec : exact @name("port"); }
        actions = { gray_loss; NoAction; }
        default_action = NoAction();
        size = MAX_PORTS;
    }

    apply {
        if (!hdr.ipv6.isValid()) {
            drop_with(DROP_NOT_IPV6);
        } else if (hdr.ipv6.hop_limit <= 1) {
            drop_with(DROP_HOP_LIMIT);
        } else {
            switch (fault_ctl.apply().action_run) {
                blackhole: { }
                default: {
                    my_sid.apply();
                    switch (routing.apply().action_run) {
                        forward: {
                            if (meta.check_ports == 1) {
                                switch (port_fault.apply().action_run) {
                                    gray_loss: {
                                        if (meta.gray_draw < meta.gray_threshold) {
                                            drop_with(DROP_GRAY);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

control MrcEgress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    counter(MAX_PORTS, CounterType.packets_and_bytes) port_tx;

    apply {
        port_tx.count((bit<32>) std.egress_port);
    }
}

control MrcComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control MrcDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.ipv6);
        pkt.emit(hdr.inner_ipv6);
        pkt.emit(hdr.udp);
    }
}

V1Switch(MrcParser(), MrcVerifyChecksum(), MrcIngress(), MrcEgress(),
         MrcComputeChecksum(), MrcDeparser()) main;
