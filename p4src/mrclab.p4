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
 *   faults    the switch's fault mode rides in my_sid, the one table every packet meets first: its
 *             entry's action (and its default action, for a packet addressed elsewhere) is
 *             usid_shift / NoAction on a healthy switch, usid_shift_check / check_ports while some
 *             port has a port_fault entry (look it up), blackhole / blackhole when the switch
 *             drops everything before routing (it stays up and answers P4Runtime: the paper's
 *             section 5.1 T1 incident). The controller rewrites both as faults come and go (a
 *             keyless table of its own did this before: one table more for every packet).
 *             port_fault: per egress port, drop
 *             with probability threshold / 65536 (gray; 65536: all). The draw is a per-port LCG
 *             (Numerical Recipes constants) XORed with a salt from the entry, so a run is
 *             repeatable for a given seed and packet order.
 *   queues    BMv2's own egress queues are the bottleneck (the controller sets their rates and
 *             depths over Thrift; two strict-priority queues per port, 1 above 0). Ingress cannot
 *             see a queue, so a register `qocc` counts each port's low-priority packets: +1 in
 *             ingress when one is routed to the port (undone if it is then trimmed, sent high,
 *             or dropped), -1 in egress when it leaves (the NDP-on-BMv2 way; BMv2
 *             locks the registers an action touches, so each update is atomic). Per port, from
 *             the `forward` entry of its route: a data packet (BTH opcode 0xC6/0xC7) that would
 *             join a low-priority queue holding trim_t or more is trimmed: cut to its headers
 *             (Ethernet .. RETH, TRIM_BYTES), lengths rewritten so it still routes and parses,
 *             DSCP TRIM_DSCP, the BTH's TRIM flag set, sent in the high-priority queue (and kept
 *             there by every switch after). MRC's control packets (SACK, NACK, ACK, probes, CNP:
 *             every BTH opcode but the Writes) take the high-priority queue too, as a fabric's
 *             control traffic class: small, and never behind a data queue. Any other packet
 *             meeting q_limit or more is dropped (QUEUE_FULL). 0 turns either off.
 *   PFC       a route whose port is lossless (`forward`'s lossless = 1; the controller sets its
 *             q_limit to the headroom's end, far above PFC's XOFF) records which ingress port fed its
 *             low-priority queue: bit n of `pfc_feeds[egress port]` for port n, set in ingress,
 *             cleared in egress when the queue empties (so: the ports that fed it since it was
 *             last empty). The controller's pause agent (controller/pfc.py) reads `qocc` and
 *             `pfc_feeds` and pauses the feeders' upstream neighbours.
 *   ECN       in egress, an ECN-capable packet (ECT(0)/ECT(1) in the outer header) that joined its
 *             queue at ecn_k packets or more gets CE. The controller leaves ecn_k 0 on ports down
 *             to hosts: a mark means "this path is hotter", not "the receiver is busy".
 *   drain     in egress, each low-priority packet's departure against its port's schedule at the
 *             queue's rate (q_gap, q_sched): late packets, the most late and the packets sent per
 *             port (q_late, q_late_max, q_sent), read with the port samples (the fidelity watch "ports behind their
 *             schedule", experiments/analysis/fidelity.py).
 *   counters  port_tx (packets, bytes) by egress port, in egress: only packets that leave;
 *             drops by (ingress port << 3 | reason), counted by the action that drops;
 *             ecn_marked, trimmed, queue_full and gray (gray-loss drops) by egress port.
 *
 * Cost: BMv2 builds with logging macros (p4lang's packages, the default build) format every table
 * lookup's key and every hit's entry even when nothing is logged, so each table a packet meets is
 * the dearest thing in this program (an action called from a control's body is a table too). A
 * healthy switch's data packets meet two in ingress (my_sid, routing: forward counts
 * the packet into its queue, so a packet below the thresholds needs no other action) and one in
 * egress (dequeue_low, which also counts it sent); port_fault is looked up only while some port
 * has a fault. `mrclab bench fabric` measures it against a port-to-port program.
 * Metadata is the other cost: BMv2 zeroes every metadata field of every packet before parsing
 * (PHV::reset_metadata, field by field through GMP integers), and p4c makes a metadata temporary
 * of every extern argument that is an expression, e.g. each `(bit<32>) std.egress_port` a
 * counter or register is indexed with (once per inlined copy of an action). So the egress port is
 * kept once as a 32-bit index, meta.port, set by forward and read by every later action (p4c
 * propagates a field into a use only inside the action that set it), and actions keep no locals
 * of their own: 49 metadata fields became 24 (perf: Header::reset and GMP were the program's
 * dearest user-space work, after BMv2's thread hand-offs, which both programs pay).
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV6 = 0x86DD;
/* IEEE 802.3 MAC Control (PFC frames): a MAC consumes them; dropped here uncounted. The pause
 * agent sends one through a resumed bmv2 lever to wake its tbf (controller/pfc.py). */
const bit<16> ETHERTYPE_MAC_CONTROL = 0x8808;
const bit<8>  PROTO_IPV6     = 41;
const bit<8>  PROTO_UDP      = 17;

/* Drop reasons: index = (port << 3) | reason in the `drops` counter. */
const bit<32> DROP_NOT_IPV6  = 0;
const bit<32> DROP_NO_ROUTE  = 1;
const bit<32> DROP_HOP_LIMIT = 2;
const bit<32> DROP_BLACKHOLE = 3;
const bit<32> DROP_GRAY      = 4;
const bit<32> DROP_QUEUE_FULL = 5;

const bit<16> ROCE_UDP_PORT  = 4791;
const bit<8>  OP_WRITE       = 0xC6;
const bit<8>  OP_WRITE_IMM   = 0xC7;
const bit<8>  F_TRIM         = 0x02;   /* BTH byte 4, MRC's flags (protocol/headers.py) */
const bit<6>  TRIM_DSCP      = 0x2A;   /* protocol/headers.py TRIM_DSCP */
/* A trimmed packet: Ethernet 14 + IPv6 40 + IPv6 40 + UDP 8 + BTH 12 + MRCX 20 + RETH 16 */
const bit<32> TRIM_BYTES     = 150;
const bit<16> TRIM_OUTER_LEN = 96;     /* outer IPv6 payload length: TRIM_BYTES - 14 - 40 */
const bit<16> TRIM_INNER_LEN = 56;     /* inner IPv6 payload length = UDP length: TRIM_BYTES - 94 */
const bit<3>  PRIO_LOW       = 0;
const bit<3>  PRIO_HIGH      = 1;

/* Ports per switch, counters' and registers' size: every cell of a counter is read back when
 * the controller reads it (the runner samples them while traffic runs), so no more than a lab
 * switch has (controller/p4runtime.py MAX_PORTS). */
const bit<32> MAX_PORTS = 64;

/* Low-priority packets queued per egress port: shared by ingress (+1) and egress (-1). */
register<bit<32>>(MAX_PORTS) qocc;
/* PFC: per lossless egress port, bit n set when ingress port n fed its low-priority queue since
 * the queue was last empty (ports below MAX_PORTS: 64 bits). */
register<bit<64>>(MAX_PORTS) pfc_feeds;
/* Departures against the shaper's schedule (the drain watch): per egress port, the time between
 * two departures of its low-priority queue at its rate (us, 1e6 / the rate in packets a second; the
 * controller writes it beside the queue's rate; 0: not watched), the schedule's last departure (us,
 * BMv2's clock), the packets that left more than a frame time (one q_gap) after their schedule
 * (since start) and the most any left after it (us, since the controller last reset it). BMv2's
 * queue gives each packet its departure as it joins, max(now, the last one's + 1 / rate)
 * (bm_sim/queueing.h, QueueingLogicPriRL::get_next_tp); the egress pipeline keeps the same schedule
 * from the packet's enqueue stamp, so a packet leaving later than it was due shows where the
 * switch's threads could not keep the port's rate (a late packet is a late drain: its frame time
 * was lost to the port). */
register<bit<32>>(MAX_PORTS) q_gap;
register<bit<32>>(MAX_PORTS) q_sched;
register<bit<32>>(MAX_PORTS) q_late;
register<bit<32>>(MAX_PORTS) q_late_max;
/* ... and the low-priority packets that left, late or not (since start): what q_late is a share of. */
register<bit<32>>(MAX_PORTS) q_sent;

/* Headers keep as few fields as the program needs: each field is a BMv2 parser and deparser step
 * (measured with `mrclab bench fabric`: 10 fields fewer, 9,200 -> 10,000 pps through the path). */
header ethernet_t {
    bit<96> dst_src_addr;  /* destination ++ source MAC, rewritten together */
    bit<16> ether_type;
}

/* The inner IPv6 header: its payload length (rewritten by trim) and next header; the rest opaque.
 * A parser select on a slice costs a metadata temporary, so next header is a field of its own. */
header inner_ipv6_t {
    bit<48>  vcf_len;     /* version, class, flow label 32 | payload length [15:0] */
    bit<8>   next_hdr;
    bit<264> hl_addrs;    /* hop limit ++ source ++ destination: never read here */
}

/* The outer header with its destination split where uN needs it: the first 48 bits (block +
 * active uSID, what my_sid and routing match) and the 80 bits of uSIDs behind them. The uN shift is
 * then two assignments, and no table key needs a concatenation. */
header outer_ipv6_t {
    bit<48>  vtf_len;  /* version 4 | traffic class 8 (DSCP [43:38], ECN [37:36]) | flow label 20 | payload length 16 */
    bit<8>   next_hdr;
    bit<8>   hop_limit;
    bit<128> src_addr;
    bit<48>  dst_sid;
    bit<80>  dst_usids;
}

header udp_t {
    bit<64> ports_len_csum;  /* source port ++ destination port [47:32] ++ length [31:16] ++ checksum */
}

/* InfiniBand Base Transport Header (IBTA vol. 1, 9.2); MRC's flags in its reserved byte. Only
 * the opcode and the flags are read or written here: the rest is two opaque fields. */
header bth_t {
    bit<32> op_pkey;       /* opcode [31:24] ++ SE, M, pad, TVer, P_Key */
    bit<8>  mrc_flags;
    bit<56> dqpn_ackreq_psn;
}

struct headers_t {
    ethernet_t   ethernet;
    outer_ipv6_t ipv6;
    inner_ipv6_t inner_ipv6;
    udp_t      udp;
    bth_t      bth;
}

struct metadata_t {
    bit<1>  check_ports;     /* my_sid: some port has a port_fault entry */
    bit<1>  dropped;         /* an earlier step dropped the packet */
    bit<1>  counted;         /* the packet holds a place in its port's qocc count */
    bit<32> gray_draw;       /* this packet's draw, 0..65535 */
    bit<32> gray_threshold;  /* drop when draw < threshold */
    bit<32> occ;             /* the egress port's low-priority packets when this one arrived */
    bit<32> ecn_k;           /* from forward: mark at or above (0: never) */
    bit<32> trim_t;          /* from forward: trim data at or above (0: never) */
    bit<32> q_limit;         /* from forward: drop at or above (0: never) */
    bit<1>  lossless;        /* from forward: PFC's lossless class; record the feeder */
    bit<32> port;            /* from forward: the egress port, as the index of counters and registers */
    bit<32> drop_idx;        /* drop_with: the drops counter's cell */
    bit<64> feeds;           /* note_feeder: the port's pfc_feeds word */
    bit<32> gap;             /* dequeue_low: the port's q_gap */
    bit<32> sched;           /* dequeue_low: this packet's departure in the schedule (us) */
    bit<32> late;            /* dequeue_low: how long after it the packet left (us) */
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
        transition select(hdr.udp.ports_len_csum[47:32]) {
            ROCE_UDP_PORT: parse_bth;
            default: accept;
        }
    }
    state parse_bth {
        pkt.extract(hdr.bth);
        transition accept;
    }
}

control MrcVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

control MrcIngress(inout headers_t hdr, inout metadata_t meta, inout standard_metadata_t std) {
    counter(MAX_PORTS * 8, CounterType.packets) drops;
    counter(MAX_PORTS, CounterType.packets) trimmed;
    counter(MAX_PORTS, CounterType.packets) queue_full;
    counter(MAX_PORTS, CounterType.packets) gray;
    register<bit<32>>(MAX_PORTS) gray_state;

    action drop_with(bit<32> reason) {
        mark_to_drop(std);
        meta.dropped = 1;
        meta.drop_idx = ((bit<32>) std.ingress_port << 3) | reason;
        drops.count(meta.drop_idx);
    }

    /* The packet does not join the low-priority queue after all: its place in the count goes
     * (a read-modify-write, atomic in its action: egress decrements the same count meanwhile). */
    action uncount() {
        qocc.read(meta.occ, meta.port);  /* occ is not read again once the packet leaves the count */
        meta.occ = meta.occ - 1;
        qocc.write(meta.port, meta.occ);
        meta.counted = 0;
    }

    /* uN: the uSID after the active one becomes active; the rest move up by 16 bits. */
    action usid_shift() {
        hdr.ipv6.dst_sid[15:0] = hdr.ipv6.dst_usids[79:64];
        hdr.ipv6.dst_usids = hdr.ipv6.dst_usids << 16;
    }

    /* uN while some port has a fault: the port_fault lookup follows routing. */
    action usid_shift_check() {
        hdr.ipv6.dst_sid[15:0] = hdr.ipv6.dst_usids[79:64];
        hdr.ipv6.dst_usids = hdr.ipv6.dst_usids << 16;
        meta.check_ports = 1;
    }

    action check_ports() {
        meta.check_ports = 1;
    }

    action blackhole() {
        drop_with(DROP_BLACKHOLE);
    }

    /* the switch's own SID, and its fault mode (see faults above) */
    table my_sid {
        key = { hdr.ipv6.dst_sid : exact @name("dst48"); }
        actions = { usid_shift; usid_shift_check; check_ports; blackhole; NoAction; }
        default_action = NoAction();
        size = 64;
    }

    /* The route names the egress port and that port's queue thresholds (packets). */
    action forward(bit<9> port, bit<48> src_mac, bit<48> dst_mac, bit<16> ecn_k, bit<16> trim_t,
                   bit<16> q_limit, bit<1> lossless) {
        std.egress_spec = port;
        meta.port = (bit<32>) port;
        hdr.ethernet.dst_src_addr = dst_mac ++ src_mac;
        hdr.ipv6.hop_limit = hdr.ipv6.hop_limit - 1;
        meta.ecn_k = (bit<32>) ecn_k;
        meta.trim_t = (bit<32>) trim_t;
        meta.q_limit = (bit<32>) q_limit;
        meta.lossless = lossless;
        /* counted as joining the low-priority queue here, the common case, so that a data packet
         * below the thresholds meets no further action; undone where it does not join it */
        qocc.read(meta.occ, meta.port);
        qocc.write(meta.port, meta.occ + 1);
        meta.counted = 1;
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

    /* BMv2 has no conditionals inside actions: the action draws, the control decides. */
    action gray_loss(bit<32> threshold, bit<32> salt) {
        gray_state.read(meta.gray_draw, meta.port);
        meta.gray_draw = meta.gray_draw * 1664525 + 1013904223;
        gray_state.write(meta.port, meta.gray_draw);
        meta.gray_draw = (meta.gray_draw ^ salt) >> 16;
        meta.gray_threshold = threshold;
    }

    action trim() {
        truncate(TRIM_BYTES);
        hdr.ipv6.vtf_len[15:0] = TRIM_OUTER_LEN;
        hdr.inner_ipv6.vcf_len[15:0] = TRIM_INNER_LEN;
        hdr.udp.ports_len_csum[31:16] = TRIM_INNER_LEN;
        hdr.ipv6.vtf_len[43:38] = TRIM_DSCP;
        hdr.bth.mrc_flags = hdr.bth.mrc_flags | F_TRIM;
        std.priority = PRIO_HIGH;
        uncount();
        trimmed.count(meta.port);
    }

    /* A packet trimmed upstream stays in the high-priority queue all the way; control packets
     * (SACK, NACK, ACK, probe, CNP) take it too, a fabric's control traffic class. */
    action keep_high() {
        std.priority = PRIO_HIGH;
        uncount();
    }

    action drop_queue_full() {
        uncount();
        queue_full.count(meta.port);
        drop_with(DROP_QUEUE_FULL);
    }

    action drop_gray() {
        uncount();
        gray.count(meta.port);
        drop_with(DROP_GRAY);
    }

    /* PFC: this packet's ingress port fed its egress port's lossless queue. */
    action note_feeder() {
        pfc_feeds.read(meta.feeds, meta.port);
        meta.feeds = meta.feeds | ((bit<64>) 1 << (bit<8>) std.ingress_port);
        pfc_feeds.write(meta.port, meta.feeds);
    }

    table port_fault {
        key = { std.egress_spec : exact @name("port"); }
        actions = { gray_loss; NoAction; }
        default_action = NoAction();
        size = MAX_PORTS;
    }

    apply {
        if (!hdr.ipv6.isValid()) {
            if (hdr.ethernet.ether_type == ETHERTYPE_MAC_CONTROL) {
                mark_to_drop(std);
            } else {
                drop_with(DROP_NOT_IPV6);
            }
        } else if (hdr.ipv6.hop_limit <= 1) {
            drop_with(DROP_HOP_LIMIT);
        } else {
            switch (my_sid.apply().action_run) {
                blackhole: { }
                default: {
                    switch (routing.apply().action_run) {
                        forward: {
                            if (meta.check_ports == 1) {
                                switch (port_fault.apply().action_run) {
                                    gray_loss: {
                                        if (meta.gray_draw < meta.gray_threshold) {
                                            drop_gray();
                                        }
                                    }
                                }
                            }
                            if (meta.dropped == 0) {
                                if (hdr.bth.isValid() && ((hdr.bth.mrc_flags & F_TRIM) != 0 ||
                                        (hdr.bth.op_pkey[31:24] != OP_WRITE && hdr.bth.op_pkey[31:24] != OP_WRITE_IMM))) {
                                    keep_high();
                                } else if (meta.trim_t != 0 && meta.occ >= meta.trim_t && hdr.bth.isValid() &&
                                        (hdr.bth.op_pkey[31:24] == OP_WRITE || hdr.bth.op_pkey[31:24] == OP_WRITE_IMM)) {
                                    trim();
                                } else if (meta.q_limit != 0 && meta.occ >= meta.q_limit) {
                                    drop_queue_full();
                                }  /* else it joins the low-priority queue, as forward counted it */
                                if (meta.lossless == 1 && meta.counted == 1) {
                                    note_feeder();
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
    counter(MAX_PORTS, CounterType.packets) ecn_marked;

    /* Left the low-priority queue: one packet less in its port's count; counted as sent; its
     * departure held against the schedule (q_gap above; the ifs are expressions, not tables). */
    action dequeue_low() {
        qocc.read(meta.occ, meta.port);
        meta.occ = meta.occ - 1;
        qocc.write(meta.port, meta.occ);
        port_tx.count(meta.port);
        q_gap.read(meta.gap, meta.port);
        q_sched.read(meta.sched, meta.port);
        meta.sched = meta.sched + meta.gap;
        if (meta.sched < std.enq_timestamp) {
            meta.sched = std.enq_timestamp;
        }
        q_sched.write(meta.port, meta.sched);
        meta.late = std.enq_timestamp + std.deq_timedelta;
        if (meta.gap != 0 && meta.late > meta.sched) {
            meta.late = meta.late - meta.sched;
        } else {
            meta.late = 0;
        }
        q_late_max.read(meta.sched, meta.port);
        if (meta.late > meta.sched) {
            meta.sched = meta.late;
        }
        q_late_max.write(meta.port, meta.sched);
        q_late.read(meta.sched, meta.port);
        if (meta.late > meta.gap) {
            meta.sched = meta.sched + 1;
        }
        q_late.write(meta.port, meta.sched);
        q_sent.read(meta.sched, meta.port);
        q_sent.write(meta.port, meta.sched + 1);
    }

    /* PFC: the lossless queue is empty; whoever feeds it next starts the record afresh. */
    action clear_feeds() {
        pfc_feeds.write(meta.port, 0);
    }

    action count_tx() {
        port_tx.count(meta.port);
    }

    action mark_ce() {
        hdr.ipv6.vtf_len[37:36] = 3;
        ecn_marked.count(meta.port);
    }

    apply {
        /* one action per packet (each is a table in BMv2: see Cost above) */
        if (meta.counted == 1) {
            dequeue_low();
            if (meta.lossless == 1 && meta.occ == 0) {
                clear_feeds();
            }
        } else {
            count_tx();
        }
        if (meta.ecn_k != 0 && hdr.ipv6.vtf_len[37:36] != 0 && (bit<32>) std.enq_qdepth >= meta.ecn_k) {
            mark_ce();
        }
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
        pkt.emit(hdr.bth);
    }
}

V1Switch(MrcParser(), MrcVerifyChecksum(), MrcIngress(), MrcEgress(),
         MrcComputeChecksum(), MrcDeparser()) main;
