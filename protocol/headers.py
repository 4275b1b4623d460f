"""MRC wire format: header layouts and constants (struct, for the hot path; no scapy, which costs an
endpoint 0.3 s of start-up: its scapy layers, for dissecting captures, are traffic/layers.py).
The authoritative description is docs/protocol.md.

Stack of a data packet (docs/mrc.md, "The transport")::

    Ethernet | outer IPv6 (dst = uSID container, flow label = EV[31:16]) | inner IPv6 (NIC -> NIC)
    | UDP (sport = EV[15:0], dport 4791) | BTH (12) | MRCX (20) | RETH (16) | [IMM (4)] | payload | ICRC (4)

Control packets carry BTH and then their own body: SACK/NACK (:data:`SACK`), probe (:data:`PROBE`),
then the ICRC (CRC-32 of BTH..end of body). The UDP checksum is zero (RFC 6935 style: the ICRC
protects the transport); docs/protocol.md has the whole layout.
"""

from __future__ import annotations

import struct

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

ETH = struct.Struct("!6s6sH")  # destination MAC, source MAC, ethertype
ETH_P_IPV6 = 0x86DD
#: IPv6 header (RFC 8200): version << 28 | traffic class << 20 | flow label, payload length, next
#: header, hop limit, source, destination
IPV6 = struct.Struct("!IHBB16s16s")
NH_IPV6, NH_UDP = 41, 17  # next header: IPv6 in IPv6 (RFC 2473), UDP
HOP_LIMIT = 64
UDPH = struct.Struct("!HHHH")
#: opcode, SE/M/PadCnt/TVer, P_Key, (MRC flags << 24 | destination QP), (AckReq << 24 | PSN)
BTH = struct.Struct("!BBHII")
MRCX = struct.Struct("!IIIIBBH")  # msn, msg_len, msg_crc, msg_offset, flags, port_state, send stamp
#: Units of a data packet's send stamp (MRCX's last 16 bits: the sender's monotonic clock in these
#: units, mod 2^16, taken as the frame is handed to its NIC port) and of a SACK's echoed one-way
#: time (its last 16 bits): 100 us, so the stamp wraps every 6.55 s, longer than any timer here
#: (``max_rto_s`` 1 s). mrclab's own: the fidelity monitor's held-packet watch reads the time a
#: packet spent between its sender and its receiver's endpoint (experiments/analysis/fidelity.py).
STAMP_HZ = 10_000
#: A SACK's echoed one-way time when the echoed arrival carried no stamp (a Write with immediate).
NO_WIRE = 0xFFFF
RETH = struct.Struct("!QII")  # virtual address, r_key, dma length (of this packet)
IMM = struct.Struct("!I")
#: cum_psn, base_psn, bitmap (received), trim_bitmap (arrived trimmed, not since received), echo_ev,
#: echo_psn, flags, port_state, echo_wire (the echoed arrival's one-way time, STAMP_HZ units; NO_WIRE)
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

#: Every emulated link's MTU (bytes): jumbo frames, so 8 KiB payloads plus a data packet's 158 bytes
#: of headers (with IMM) fit (the paper's fabric runs 4 KiB MTU payloads; 9000 is the common jumbo).
MTU = 9000
#: Largest payload a data packet carries (bytes): 8 KiB, which with its headers fits :data:`MTU`.
MAX_PAYLOAD_BYTES = 8192
#: The default payload of a data packet (bytes; ``TransportSettings.payload_bytes``).
DEFAULT_PAYLOAD_BYTES = 1024


def frame_bytes(payload_bytes: int) -> int:
    """A full data packet's bytes on the wire for ``payload_bytes`` of data: the payload plus
    :data:`DATA_OVERHEAD` (Write without immediate, the data packets' common case)."""
    return payload_bytes + DATA_OVERHEAD


#: The default data packet's bytes on the wire (1,178).
DEFAULT_FRAME_BYTES = frame_bytes(DEFAULT_PAYLOAD_BYTES)
