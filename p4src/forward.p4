/*
 * Trivial port-to-port program: BMv2's own forwarding ceiling, the yardstick of
 * `mrclab bench fabric`. Table `port_map`: ingress port -> egress port, nothing else.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_t { bit<48> dst_addr; bit<48> src_addr; bit<16> ether_type; }
struct headers_t { ethernet_t ethernet; }
struct metadata_t { }

parser P(packet_in pkt, out headers_t hdr, inout metadata_t m, inout standard_metadata_t s) {
    state start { pkt.extract(hdr.ethernet); transition accept; }
}
control VC(inout headers_t hdr, inout metadata_t m) { apply { } }
control I(inout headers_t hdr, inout metadata_t m, inout standard_metadata_t s) {
    action set_port(bit<9> port) { s.egress_spec = port; }
    table port_map {
        key = { s.ingress_port : exact @name("port"); }
        actions = { set_port; NoAction; }
        default_action = NoAction();
        size = 64;
    }
    apply { port_map.apply(); }
}
control E(inout headers_t hdr, inout metadata_t m, inout standard_metadata_t s) { apply { } }
control CC(inout headers_t hdr, inout metadata_t m) { apply { } }
control D(packet_out pkt, in headers_t hdr) { apply { pkt.emit(hdr.ethernet); } }
V1Switch(P(), VC(), I(), E(), CC(), D()) main;
