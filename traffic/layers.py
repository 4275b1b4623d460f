"""The MRC headers as scapy layers, for dissecting captures and tests (the wire format's reference
beside the struct layouts of :mod:`protocol.headers`, which the endpoint uses alone): importing this
module binds them to UDP port 4791, so ``Ether(frame)`` dissects BTH, MRCX, RETH, ImmDt, SACK,
probe and CNP bodies."""

from __future__ import annotations

from mrclab.protocol.headers import OP_ACK, OP_CNP, OP_NACK, OP_PROBE, OP_SACK, OP_WRITE, OP_WRITE_IMM, UDP_PORT
from scapy.fields import BitField, ByteField, FlagsField, IntField, LongField, ShortField, XByteField, XIntField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers


class BTHdr(Packet):
    """InfiniBand Base Transport Header (IBTA vol. 1, 9.2), MRC flags in the reserved byte."""

    name = "BTH"
    fields_desc = [
        XByteField("opcode", OP_WRITE),
        BitField("se", 0, 1), BitField("migreq", 0, 1), BitField("padcnt", 0, 2), BitField("tver", 0, 4),
        ShortField("pkey", 0xFFFF),
        FlagsField("mrc_flags", 0, 8, ["RETX", "TRIM", "r2", "r3", "r4", "r5", "BECN", "FECN"]),
        BitField("dqpn", 0, 24),
        BitField("ackreq", 0, 1), BitField("rsvd", 0, 7),
        BitField("psn", 0, 24),
    ]


class MRCXHdr(Packet):
    """MRC extension header: message sequence number and the message this packet belongs to."""

    name = "MRCX"
    fields_desc = [IntField("msn", 0), IntField("msg_len", 0), XIntField("msg_crc", 0), IntField("msg_offset", 0),
                   FlagsField("flags", 0, 8, ["LAST", "f1", "f2", "f3", "f4", "f5", "f6", "f7"]),
                   XByteField("port_state", 0), ShortField("stamp", 0)]


class ImmDt(Packet):
    """Immediate data (IBTA ImmDt, 4 bytes) of a Write-with-Immediate, after RETH."""

    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class RETHdr(Packet):
    """RDMA Extended Transport Header (IBTA 9.3.3): where this packet's payload goes."""

    name = "RETH"
    fields_desc = [LongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]

    def guess_payload_class(self, payload):
        """:class:`ImmDt` when the packet's BTH opcode is Write-with-Immediate, else scapy's guess."""
        under = self.underlayer
        while under is not None and not isinstance(under, BTHdr):
            under = under.underlayer
        if under is not None and under.opcode == OP_WRITE_IMM:
            return ImmDt
        return super().guess_payload_class(payload)




class SackHdr(Packet):
    """SACK / NACK body: cumulative PSN, a 64-bit bitmap of PSNs base_psn..base_psn+63 received, a
    64-bit bitmap of those that arrived trimmed (and not since), the echoed EV and PSN of the arrival
    that triggered it, flags and the receiver's port-state bitmap."""

    name = "SACK"
    fields_desc = [IntField("cum_psn", 0), IntField("base_psn", 0), LongField("bitmap", 0),
                   LongField("trim_bitmap", 0), XIntField("echo_ev", 0),
                   IntField("echo_psn", 0),
                   FlagsField("flags", 0, 8, ["ECN", "TRIM", "SEQ", "f3", "f4", "f5", "f6", "f7"]),
                   XByteField("port_state", 0), ShortField("echo_wire", 0xFFFF)]


class ProbeHdr(Packet):
    """EV probe (request or reply) for retired EVs."""

    name = "MRCProbe"
    fields_desc = [IntField("probe_id", 0), ByteField("is_reply", 0), XByteField("port_state", 0),
                   ShortField("rsvd", 0), XIntField("ev", 0), LongField("t_send_ns", 0)]


class CnpHdr(Packet):
    """RoCEv2 Congestion Notification Packet body (16 reserved bytes; the QP is in the BTH)."""

    name = "CNP"
    fields_desc = [LongField("rsvd0", 0), LongField("rsvd1", 0)]


bind_layers(UDP, BTHdr, dport=UDP_PORT)
bind_layers(BTHdr, MRCXHdr, opcode=OP_WRITE)
bind_layers(BTHdr, MRCXHdr, opcode=OP_WRITE_IMM)
bind_layers(MRCXHdr, RETHdr)
bind_layers(BTHdr, SackHdr, opcode=OP_SACK)
bind_layers(BTHdr, SackHdr, opcode=OP_NACK)
bind_layers(BTHdr, SackHdr, opcode=OP_ACK)
bind_layers(BTHdr, ProbeHdr, opcode=OP_PROBE)
bind_layers(BTHdr, CnpHdr, opcode=OP_CNP)
