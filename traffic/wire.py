"""Frames <-> :class:`~traffic.packet.Pkt`: the endpoint's hot path.

:class:`Wire` prebuilds, per (peer, plane), the Ethernet + outer IPv6 + inner IPv6 + UDP headers
once, with ``struct`` (scapy, the layers' reference, would cost an endpoint 0.3 s of start-up to
import; tests/test_traffic_wire.py holds every template byte-identical to scapy's). Into a copy of
that template it patches the EV-dependent fields (outer destination
= the uSID container of the EV's path, flow label, UDP source port) and the lengths with
``struct.pack_into``, and keeps that prefix per (peer, EV, length); per packet only the transport
headers are packed (one ``struct`` call), and the frame is the prefix, headers, payload and ICRC
joined into one ``bytes`` (a copy in user space: handing the parts to sendmsg as a scatter list
cost more than the join). Every packet ends with a 4-byte ICRC, CRC-32 of BTH..payload
(RoCEv2 has an ICRC over the invariant fields; this one covers the transport headers and payload
only). :meth:`Wire.decode` parses with ``struct`` and never raises: a frame that is not a
well-formed MRC packet for this NIC returns None and names the reason in ``Wire.rejected``."""

from __future__ import annotations

import struct
from collections.abc import Callable
from time import monotonic as _monotonic
from typing import TypeVar, overload

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, PathTemplate
from mrclab.traffic.packet import Pkt

_U32 = struct.Struct("!I")
#: What :meth:`Wire.decode`'s ``on_write`` returns, handed back as it is.
_W = TypeVar("_W")
_crc32 = H.crc32
# headers.py constants the decoder reads per packet, bound once
_OFF_BODY, _OFF_UDP, _OFF_BTH, _UDP_PORT, _OP_WRITE = H.OFF_BODY, H.OFF_UDP, H.OFF_BTH, H.UDP_PORT, H.OP_WRITE
_MIN_ULEN = 8 + H.BTH_SIZE + 4  # UDP header + BTH + ICRC
_DATA_OPS = (H.OP_WRITE, H.OP_WRITE_IMM)
_OP_WRITE_IMM, _X_LAST = H.OP_WRITE_IMM, H.X_LAST
_ECT0, _TRIM_DSCP = H.ECT0, H.TRIM_DSCP
_TRIM_ULEN = H.TRIM_BYTES - _OFF_UDP  # UDP length a switch writes into a trimmed packet
_BTH = H.BTH
#: The UDP port of the VXLAN tunnels between servers (IANA's, RFC 7348; emulation/cluster.py)
_VXLAN_DPORT = (4789).to_bytes(2, "big")


def _concat(*parts: struct.Struct | str) -> struct.Struct:
    """One big-endian struct from the formats of ``parts`` (headers.py layouts or format text)."""
    return struct.Struct("!" + "".join(p.format.lstrip("!") if isinstance(p, struct.Struct) else p for p in parts))


_L3 = struct.Struct("!I")
# Decode in one call: from the ethertype (offset 12) through BTH: ethertype | outer ver/tc/flow,
# (skip len), next header, (skip hop limit, src, dst) | inner (skip ver/len), next header, (skip
# hop limit), src, dst | UDP sport, dport, len, (skip checksum) | BTH opcode, (skip flags, pkey),
# flags << 24 | QP, ackreq << 24 | PSN
_FIXED = struct.Struct("!H" "I2xB33x" "6xB1x16s16s" "HHH2x" "B3xII")
# A data packet's transport headers in one call: BTH | MRCX | RETH [| immediate]. Everything in
# front of them (Ethernet .. UDP) depends only on the peer, the EV and the length, and is cached.
_DATA_TH = _concat(_BTH, H.MRCX, H.RETH)
_DATA_TH_IMM = _concat(_DATA_TH, H.IMM)
_DATA_BODY = _concat(H.MRCX, H.RETH)
_DATA_BODY_IMM = _concat(H.MRCX, H.RETH, H.IMM)
# Every frame's fixed part and a Write's transport headers, read in one call when the frame is long
# enough (the receive path's usual case); _DATA_END: where a Write's payload starts
_FIXED_DATA = _concat(_FIXED, _DATA_BODY)
_DATA_END = H.OFF_BODY + _DATA_BODY.size
if _FIXED.size + 12 != H.OFF_BODY:
    raise ImportError("traffic.wire: _FIXED must end where the transport body starts (headers.OFF_BODY)")


#: A data packet's fields (DATA_FIELDS order) -> (plane, the frame): :meth:`Wire.framer`
DataFramer = Callable[..., tuple[int, bytes]]


def _mac(text: str) -> bytes:
    """``aa:bb:cc:dd:ee:ff`` as its 6 bytes."""
    return bytes.fromhex(text.replace(":", ""))


class Wire:
    """Encoder/decoder for one host NIC (``host``) of an address plan."""

    def __init__(self, plan: AddressPlan, host: str) -> None:
        """Codec of ``host``'s NIC; header templates are built on first use."""
        self.plan, self.host = plan, host
        self.my_nic = plan.nic_address(host).packed
        self._tpl: dict[tuple[str, int], bytes] = {}
        self._prefixes: dict[str, dict[int, bytes]] = {}  # peer -> (EV << 16 | UDP payload length) -> prefix
        self._templates: dict[str, PathTemplate] = {}
        self._framers: dict[str, DataFramer] = {}
        self.nic_to_host = {plan.nic_address(h).packed: h for h in plan.spec.hosts()}
        self.rejected: dict[str, int] = {}

    # ---- encode -------------------------------------------------------------------------------
    def _template(self, peer: str, plane: int) -> bytes:
        """Ethernet .. UDP of a frame to ``peer`` on ``plane`` with the lengths of an empty UDP
        payload and an all-zero outer destination (:meth:`_prefix` writes both per EV and length);
        as scapy builds ``Ether / IPv6(nh=41) / IPv6(nh=17) / UDP(dport=4791, chksum=0)``."""
        key = (peer, plane)
        t = self._tpl.get(key)
        if t is None:
            p = self.plan
            t = (H.ETH.pack(_mac(p.gateway_mac(self.host, plane)), _mac(p.host_mac(self.host, plane)), H.ETH_P_IPV6)
                 + H.IPV6.pack(0x60000000, 40 + H.UDPH.size, H.NH_IPV6, H.HOP_LIMIT,
                               p.port_address(self.host, plane).packed, bytes(16))
                 + H.IPV6.pack(0x60000000, H.UDPH.size, H.NH_UDP, H.HOP_LIMIT, p.nic_address(self.host).packed,
                               p.nic_address(peer).packed)
                 + H.UDPH.pack(0, H.UDP_PORT, H.UDPH.size, 0))
            self._tpl[key] = t
        return t

    def _outer_dst(self, peer: str, ev: int) -> bytes:
        tpl = self._templates.get(peer)
        if tpl is None:
            tpl = self._templates[peer] = self.plan.template(self.host, peer)
        return tpl.outer_dst_int(ev).to_bytes(16, "big")

    def _prefix(self, peer: str, ev: int, n: int, ect: int) -> bytes:
        """Ethernet .. UDP of a packet to ``peer`` on ``ev`` whose UDP payload is ``n`` bytes:
        the template with the EV's outer destination, flow label, source port and the lengths; the
        outer traffic class carries ECN ``ect`` (ECT(0) for data, 0 for control packets)."""
        buf = bytearray(self._template(peer, (ev >> 12) & 0xF))
        # version 6 | traffic class (DSCP 0, ECN) | flow label = EV high
        _L3.pack_into(buf, H.OFF_OUTER, 0x60000000 | (ect << 20) | ((ev >> 16) & 0xFFFF))
        struct.pack_into("!H", buf, H.OFF_OUTER + 4, 48 + n)
        buf[H.OFF_OUTER + 24 : H.OFF_OUTER + 40] = self._outer_dst(peer, ev)
        struct.pack_into("!H", buf, H.OFF_INNER + 4, 8 + n)
        struct.pack_into("!HHH", buf, H.OFF_UDP, ev & 0xFFFF, H.UDP_PORT, 8 + n)
        pfx = bytes(buf)
        by_peer = self._prefixes.setdefault(peer, {})
        if len(by_peer) >= 65536:  # bounded: EVs x lengths in use are a few hundred
            by_peer.clear()
        by_peer[(ev << 17) | (ect << 15) | n] = pfx
        return pfx

    def framer(self, peer: str) -> DataFramer:
        """The frame builder of data packets (Writes) to host ``peer``: it takes a data packet's
        fields positionally, in :data:`~traffic.packet.DATA_FIELDS` order (as :class:`Pkt` does), and
        returns (plane to send on, the frame), as :meth:`encode`
        does. The sender's hot path builds its frames with it and never makes a :class:`Pkt`
        (0.3 us a packet, and as much again for :meth:`encode` to read it back)."""
        f = self._framers.get(peer)
        if f is not None:
            return f
        prefixes = self._prefixes.setdefault(peer, {})  # cleared in place when full, never replaced
        prefix, pack, pack_imm, u32, crc32, join = (self._prefix, _DATA_TH.pack, _DATA_TH_IMM.pack, _U32.pack, _crc32,
                                                    b"".join)
        ect_key = _ECT0 << 15
        clock, hz = _monotonic, H.STAMP_HZ

        def frame(op: int, qp: int, psn: int, ev: int, flags: int, msn: int, msg_len: int, msg_crc: int,
                  off: int, va: int, rkey: int, dma_len: int, payload: bytes | memoryview, imm: int | None,
                  port_state: int, _ecn_ce: bool = False) -> tuple[int, bytes]:
            stamp = int(clock() * hz) & 0xFFFF  # headers.STAMP_HZ: when it is handed to its NIC port
            if op == _OP_WRITE:
                head = pack(op, 0, 0xFFFF, (flags << 24) | (qp & 0xFFFFFF), psn & 0xFFFFFF, msn & 0xFFFFFFFF,
                            msg_len, msg_crc, off, _X_LAST if off + dma_len >= msg_len else 0, port_state, stamp,
                            va, rkey, dma_len)
            else:
                head = pack_imm(op, 0, 0xFFFF, (flags << 24) | (qp & 0xFFFFFF), psn & 0xFFFFFF, msn & 0xFFFFFFFF,
                                msg_len, msg_crc, off, _X_LAST if off + dma_len >= msg_len else 0, port_state, stamp,
                                va, rkey, dma_len, (imm or 0) & 0xFFFFFFFF)
            n = len(head) + len(payload) + 4  # UDP payload: BTH..payload + ICRC
            pfx = prefixes.get((ev << 17) | ect_key | n)
            if pfx is None:
                pfx = prefix(peer, ev, n, _ECT0)
            return (ev >> 12) & 0xF, join((pfx, head, payload, u32(crc32(payload, crc32(head)))))

        self._framers[peer] = frame
        return frame

    def encode(self, p: Pkt, peer: str) -> tuple[int, bytes]:
        """(plane to send on, the frame) of packet ``p`` to host ``peer``."""
        op = p.op
        if op == _OP_WRITE or op == _OP_WRITE_IMM:
            return self.framer(peer)(op, p.qp, p.psn, p.ev, p.flags, p.msn, p.msg_len, p.msg_crc, p.msg_offset,
                                     p.va, p.rkey, p.dma_len, p.payload, p.imm, p.port_state)
        head = self._control_head(p)
        n = len(head) + 4  # UDP payload: BTH..body + ICRC
        ev = p.ev
        by_peer = self._prefixes.get(peer)
        pfx = by_peer.get((ev << 17) | n) if by_peer is not None else None
        if pfx is None:
            pfx = self._prefix(peer, ev, n, 0)
        return (ev >> 12) & 0xF, pfx + head + _U32.pack(_crc32(head))

    @staticmethod
    def _control_head(p: Pkt) -> bytes:
        """BTH and body of a control packet (SACK, NACK, ACK, probe, CNP). Raises ValueError for
        another opcode."""
        op = p.op
        if op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
            head = _BTH.pack(op, 0, 0xFFFF, p.qp & 0xFFFFFF, 0) + H.SACK.pack(
                p.cum_psn, p.base_psn, p.bitmap, p.trim_bitmap, p.echo_ev, p.echo_psn, p.sflags, p.port_state,
                p.echo_wire)
        elif op == H.OP_PROBE:
            head = _BTH.pack(op, 0, 0xFFFF, p.qp & 0xFFFFFF, 0) + H.PROBE.pack(
                p.probe_id, p.is_reply, p.port_state, 0, p.echo_ev or p.ev, p.t_send_ns)
        elif op == H.OP_CNP:
            head = _BTH.pack(op, 0, 0xFFFF, p.qp & 0xFFFFFF, 0) + H.CNP.pack()
        else:
            raise ValueError(f"cannot encode opcode {op:#x}")
        return head

    # ---- decode -------------------------------------------------------------------------------
    def _reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1

    def sent_data(self, head: bytes) -> tuple[str, int, int, int] | None:
        """Whose data packet the first bytes of a frame this NIC sent are (a NIC departure stamp's
        frame, traffic/txstamp.py; a frame a VXLAN port to another server sent comes back as its
        underlay port stamped it, in its tunnel's headers): ``(peer, QP, PSN's low 24 bits, send
        stamp)``, the send stamp in headers.STAMP_HZ units mod 2^16 (when it was handed to its port); None for anything
        else (a SACK, a probe, a frame too short). Never raises."""
        off = 0
        if len(head) > 42 and head[12:14] == b"\x08\x00" and head[23] == 17:  # IPv4 / UDP: a tunnel's?
            udp = 14 + (head[14] & 0xF) * 4
            if head[udp + 2 : udp + 4] == _VXLAN_DPORT:  # stamped as its underlay port sent it
                off = udp + 16  # UDP and VXLAN headers (RFC 7348 section 5)
        if len(head) < off + _DATA_END:
            return None
        (ethertype, first, onh, inh, _isrc, idst, _sport, _dport, _ulen, op, fq, psn,
         _msn, _len, _crc, _moff, _xf, _ports, stamp, _va, _rkey, _dma) = _FIXED_DATA.unpack_from(head, off + 12)
        if ethertype != 0x86DD or onh != 41 or inh != 17 or op not in _DATA_OPS:
            return None
        peer = self.nic_to_host.get(idst)
        if peer is None:
            return None
        return peer, fq & 0xFFFFFF, psn & 0xFFFFFF, stamp

    @overload
    def decode(self, f: bytes | memoryview, on_write: None = None) -> tuple[str, Pkt] | None: ...

    @overload
    def decode(self, f: bytes | memoryview, on_write: Callable[..., _W]) -> tuple[str, Pkt] | _W | None: ...

    def decode(self, f: bytes | memoryview, on_write: Callable[..., _W] | None = None) -> tuple[str, Pkt] | _W | None:
        """(sending host, packet) of an MRC frame for this NIC; None (counted) for anything else.
        With ``on_write``, an untrimmed Write (the receive path's hot spot) makes no :class:`Pkt`:
        its sending host and fields go to ``on_write(src, qp, psn, ev, flags, msn, msg_len,
        msg_crc, msg_offset, va, rkey, dma_len, payload, port_state, ecn_ce, stamp)`` (PSN's low 24 bits,
        the payload a view of ``f``), and decode returns what that returns."""
        try:  # one function, not a wrapper around one: a call less per frame (a try costs nothing)
            n = len(f)
            if n < _OFF_BODY:
                self._reject("not IPv6 or too short")
                return None
            if n >= _DATA_END:  # long enough for a data packet's headers: read them in the same call
                (ethertype, first, onh, inh, isrc, idst, sport, dport, ulen, op, fq, psn,
                 msn, msg_len, crc, moff, _xf, ports, stamp, va, rkey, dma_len) = _FIXED_DATA.unpack_from(f, 12)
            else:
                (ethertype, first, onh, inh, isrc, idst, sport, dport, ulen,
                 op, fq, psn) = _FIXED.unpack_from(f, 12)
                msn = -1
            if ethertype != 0x86DD:
                self._reject("not IPv6 or too short")
                return None
            if first >> 28 != 6 or onh != 41 or inh != 17:
                self._reject("not IPv6-in-IPv6 / UDP")
                return None
            if idst != self.my_nic:
                self._reject("not for this NIC")
                return None
            src = self.nic_to_host.get(isrc)
            if src is None:
                self._reject("unknown source NIC")
                return None
            if dport != _UDP_PORT:
                self._reject("not MRC's UDP port")
                return None
            if op == _OP_WRITE and msn >= 0 and (first >> 22) & 0x3F != _TRIM_DSCP:  # the hot path: a Write
                end = _OFF_UDP + ulen - 4  # the last 4 bytes are the ICRC
                if ulen < _MIN_ULEN or end + 4 > n:
                    self._reject("bad UDP length")
                    return None
                v = f if type(f) is memoryview else memoryview(f)
                if _crc32(v[_OFF_BTH:end]) != _U32.unpack_from(f, end)[0]:
                    self._reject("bad ICRC")
                    return None
                if end < _DATA_END:
                    self._reject("truncated data header")
                    return None
                if on_write is not None:
                    return on_write(src, fq & 0xFFFFFF, psn & 0xFFFFFF, ((first & 0xFFFF) << 16) | sport, fq >> 24,
                                    msn, msg_len, crc, moff, va, rkey, dma_len, v[_DATA_END:end], ports,
                                    ((first >> 20) & 0x3) == 0x3, stamp)
                p = Pkt(op, fq & 0xFFFFFF, psn & 0xFFFFFF, ((first & 0xFFFF) << 16) | sport,  # DATA_FIELDS
                        fq >> 24, msn, msg_len, crc, moff, va, rkey, dma_len, v[_DATA_END:end], None, ports,
                        ((first >> 20) & 0x3) == 0x3)
                p.stamp = stamp
                return src, p
            return self._decode(f, first, isrc, sport, ulen, op, fq, psn, src)
        except (struct.error, IndexError, ValueError):
            self._reject("malformed")
            return None

    def _decode(self, f, first: int, isrc: bytes, sport: int, ulen: int, op: int, fq: int, psn: int,
                src: str) -> tuple[str, Pkt] | None:
        """The rest of :meth:`decode`, past the checks every frame meets: every packet but an
        untrimmed Write."""
        v = memoryview(f)
        if (first >> 22) & 0x3F == _TRIM_DSCP:  # a switch cut it to its headers: no payload, no ICRC
            return self._trimmed(f, src, first, sport, ulen, op, fq, psn)
        end = _OFF_UDP + ulen - 4  # the last 4 bytes are the ICRC
        if ulen < _MIN_ULEN or end + 4 > len(f):
            self._reject("bad UDP length")
            return None
        if _crc32(v[_OFF_BTH:end]) != _U32.unpack_from(f, end)[0]:
            self._reject("bad ICRC")
            return None
        ev = ((first & 0xFFFF) << 16) | sport  # topologies.addressing.ev_from_wire, inlined
        ecn_ce = ((first >> 20) & 0x3) == 0x3
        flags, qp, psn = fq >> 24, fq & 0xFFFFFF, psn & 0xFFFFFF
        x = _OFF_BODY
        if op in _DATA_OPS:
            st = _DATA_BODY if op == _OP_WRITE else _DATA_BODY_IMM
            if end - x < st.size:
                self._reject("truncated data header")
                return None
            msn, msg_len, crc, moff, _xf, ports, stamp, va, rkey, dma_len, *imm = st.unpack_from(f, x)
            p = Pkt(op, qp, psn, ev, flags, msn, msg_len, crc, moff, va, rkey, dma_len,  # DATA_FIELDS order
                    v[x + st.size : end], imm[0] if imm else None, ports, ecn_ce)
            p.stamp = stamp
            return src, p
        if op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
            if end - x < H.SACK.size:
                self._reject("truncated SACK")
                return None
            cum, base, bm, tbm, eev, epsn, sfl, ports, wire = H.SACK.unpack_from(f, x)
            return src, Pkt(op=op, qp=qp, ev=ev, cum_psn=cum, base_psn=base, bitmap=bm, trim_bitmap=tbm, echo_ev=eev,
                            echo_psn=epsn, sflags=sfl, port_state=ports, echo_wire=wire)
        if op == H.OP_CNP:
            return src, Pkt(op=op, qp=qp, ev=ev)
        if op == H.OP_PROBE:
            if end - x < H.PROBE.size:
                self._reject("truncated probe")
                return None
            pid, rep, ports, _, pev, tns = H.PROBE.unpack_from(f, x)
            return src, Pkt(op=op, qp=qp, ev=ev, probe_id=pid, is_reply=rep, port_state=ports, echo_ev=pev,
                            t_send_ns=tns)
        self._reject("unknown opcode")
        return None

    def _trimmed(self, f, src: str, first: int, sport: int, ulen: int, op: int, fq: int,
                 psn: int) -> tuple[str, Pkt] | None:
        """A data packet a switch trimmed (docs/protocol.md, "Trimmed packets"): its headers up to
        RETH, lengths rewritten, no payload and no ICRC. Only its identity is used: it becomes a
        NACK, so a header damaged on the way costs at most one spurious retransmission."""
        if op not in _DATA_OPS or ulen != _TRIM_ULEN or len(f) < H.TRIM_BYTES:
            self._reject("malformed trimmed packet")
            return None
        msn, msg_len, crc, moff, _xf, ports, stamp, va, rkey, dma_len = _DATA_BODY.unpack_from(f, _OFF_BODY)
        ev = ((first & 0xFFFF) << 16) | sport
        p = Pkt(op, fq & 0xFFFFFF, psn & 0xFFFFFF, ev, (fq >> 24) | H.F_TRIM, msn, msg_len, crc, moff, va,
                rkey, dma_len, b"", None, ports, ((first >> 20) & 0x3) == 0x3)
        p.stamp = stamp  # the headers a switch keeps carry it: the trim's one-way time is echoed too
        return src, p

