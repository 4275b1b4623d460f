"""MRC wire format: header layouts (struct, for the hot path) and scapy layers (for templates and
dissection). The authoritative description is docs/protocol.md.

Stack of a data packet (docs/mrc.md, "The transport")::

    Ethernet | outer IPv6 (dst = uSID container, flow label = EV[31:16]) | inner IPv6 (NIC -> NIC)
    | UDP (sport = EV[15:0], dport 4791) | BTH (12) | MRCX (20) | RETH (16) | [IMM (4)] | payload | ICRC (4)

Control packets carry BTH and then their own body: SACK/NACK (:data:`SACK`), probe (:data:`PROBE`),
then the ICRC (CRC-32 of BTH..end of body). The UDP checksum is zero (RFC 6935 style: the ICRC
protects the transport); docs/protocol.md has the whole layout.
"""

from __future__ import annotations

import struct

from scapy.fields import BitField, ByteField, FlagsField, IntField, LongField, ShortField, XByteField, XIntField
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers
from zlib_ng import zlib_ng as _zng

UDP_PORT = 4791  # IANA RoCEv2

#: CRC-32 (IEEE 802.3, zlib's) of a bytes-like, with an optional running value: ``crc32(data[,
#: value]) -> int``. zlib-ng's uses carry-less multiplication: the same values as ``zlib.crc32``,
#: about 10x faster on 4 KiB and 13x on 1 MiB here, which matters because every data packet pays
#: it twice (ICRC) and every message twice more (its CRC at both ends).
crc32 = _zng.crc32

# Opcodes (docs/mrc.md: public models use 0xC6-0xCB for Write variants, 0xD1 ACK, 0xDC SACK, 0xDD NACK,
# 0xDE probe). Every MRC data packet is self-describing, so only two Write opcodes are used.
OP_WRITE = 0xC6
OP_WRITE_IMM = 0xC7
OP_ACK = 0xD1  # RoCE baseline: cumulative ACK
OP_SACK = 0xDC
OP_NACK = 0xDD
OP_PROBE = 0xDE
OP_CNP = 0x81  # RoCEv2 Congestion Notification Packet (IBTA Annex A17): the baseline's DCQCN signal

# BTH byte 4 flags (IBTA's reserved byte; MRC keeps its retransmit flag here)
F_RETX = 0x01  # this data packet is a retransmission
F_TRIM = 0x02  # a switch trimmed this packet's payload (congestion, not failure)

# MRCX flags
X_LAST = 0x01  # last packet of its message (informational: every packet says where it goes)

# Outer IPv6 traffic class: DSCP (6 bits) | ECN (2 bits, RFC 3168)
ECN_MASK = 0x03
ECT0 = 0x02  # ECN-capable transport: every data packet is sent with it
ECN_CE = 0x03  # congestion experienced: a switch marked the packet
#: DSCP a switch writes into a trimmed packet (ours; unassigned in RFC 4594's table, a constant of
#: p4src/mrclab.p4 and of the linux data plane's eBPF program alike)
TRIM_DSCP = 0x2A

# SACK/NACK flags
S_ECN = 0x01  # the acknowledged data packet carried ECN CE
S_TRIM = 0x02  # NACK: the packet at echo_psn arrived trimmed
S_SEQ = 0x04  # RoCE baseline NACK: sequence error, go back to cum_psn

ETH = struct.Struct("!6s6sH")
UDPH = struct.Struct("!HHHH")
#: opcode, SE/M/PadCnt/TVer, P_Key, (MRC flags << 24 | destination QP), (AckReq << 24 | PSN)
BTH = struct.Struct("!BBHII")
MRCX = struct.Struct("!IIIIBBH")  # msn, msg_len, msg_crc, msg_offset, flags, port_state, reserved
RETH = struct.Struct("!QII")  # virtual address, r_key, dma length (of this packet)
IMM = struct.Struct("!I")
#: cum_psn, base_psn, bitmap (received), trim_bitmap (arrived trimmed, not since received), echo_ev,
#: echo_psn, flags, port_state, rsvd
SACK = struct.Struct("!IIQQIIBBH")
PROBE = struct.Struct("!IBBHIQ")  # probe_id, is_reply, port_state, rsvd, ev, t_send_ns
CNP = struct.Struct("!16x")  # RoCEv2 CNP: 16 reserved bytes after BTH

L2_L4 = ETH.size + 40 + 40 + UDPH.size  # 102 bytes up to and including UDP
OFF_OUTER = ETH.size
OFF_INNER = OFF_OUTER + 40
OFF_UDP = OFF_INNER + 40
OFF_BTH = OFF_UDP + UDPH.size
BTH_SIZE = BTH.size  # 12
OFF_BODY = OFF_BTH + BTH_SIZE
DATA_HDR = L2_L4 + BTH_SIZE + MRCX.size + RETH.size  # 150 bytes before payload (154 with IMM)
#: A trimmed data packet: its first TRIM_BYTES (Ethernet .. RETH), lengths rewritten by the switch
TRIM_BYTES = DATA_HDR
ICRC_SIZE = 4
#: Bytes a data packet adds to its payload on the wire: headers + ICRC (154; 158 with IMM).
DATA_OVERHEAD = DATA_HDR + ICRC_SIZE


# ---- scapy layers: dissection of captures and building templates ------------------------------
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
                   XByteField("port_state", 0), ShortField("rsvd", 0)]


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
                   IntField("echo_psn", 0), FlagsField("flags", 0, 8, ["ECN", "TRIM", "SEQ", "f3", "f4", "f5", "f6", "f7"]),
                   XByteField("port_state", 0), ShortField("rsvd", 0)]


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
