"""Frames <-> :class:`~traffic.mrc.Pkt`: the endpoint's hot path.

:class:`Wire` prebuilds, per (peer, plane), the Ethernet + outer IPv6 + inner IPv6 + UDP headers
with scapy once, then per packet copies that template and patches the EV-dependent fields (outer
destination = the uSID container of the EV's path, flow label, UDP source port) and the lengths
with ``struct.pack_into``. Every packet ends with a 4-byte ICRC, CRC-32 of BTH..payload (RoCEv2
has an ICRC over the invariant fields; this one covers the transport headers and payload only).
:meth:`Wire.decode` parses with ``struct`` and never raises: a frame
that is not a well-formed MRC packet for this NIC returns None and names the reason in
``Wire.rejected``.
"""

from __future__ import annotations

import socket
import struct
import zlib

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from topologies.addressing import AddressPlan, ev_from_wire
from traffic import headers as H
from traffic.mrc import Pkt

_U32 = struct.Struct("!I")
_DATA_OPS = (H.OP_WRITE, H.OP_WRITE_IMM)
# BTH as opcode, flags(se/m/pad/tver), pkey, (MRC flags << 24 | dest QP), (ackreq << 24 | PSN)
_BTH = struct.Struct("!BBHII")


def _concat(*parts: struct.Struct | str) -> struct.Struct:
    """One big-endian struct from the formats of ``parts`` (headers.py layouts or format text)."""
    return struct.Struct("!" + "".join(p.format.lstrip("!") if isinstance(p, struct.Struct) else p for p in parts))


_L3 = struct.Struct("!I")
# Decode in one call: from the ethertype (offset 12) through BTH: ethertype | outer ver/tc/flow,
# (skip len), next header, (skip hop limit, src, dst) | inner (skip ver/len), next header, (skip
# hop limit), src, dst | UDP sport, dport, len, (skip checksum) | BTH opcode, (skip flags, pkey),
# flags << 24 | QP, ackreq << 24 | PSN
_FIXED = struct.Struct("!H" "I2xB33x" "6xB1x16s16s" "HHH2x" "B3xII")
# Encode a data packet's headers in one call: Ethernet | outer IPv6 (ver/tc/flow, len, next header
# + hop limit, src, dst) | inner IPv6 (ver/tc/flow, len, next header + hop limit, src + dst) | UDP |
# BTH | MRCX | RETH [| immediate]. The constant parts come from the scapy-built template.
_DATA_FRAME = _concat("14sIH2s16s16s" "4sH2s32s", H.UDPH, _BTH, H.MRCX, H.RETH)
_DATA_FRAME_IMM = _concat(_DATA_FRAME, H.IMM)
_DATA_BODY = _concat(H.MRCX, H.RETH)
_DATA_BODY_IMM = _concat(H.MRCX, H.RETH, H.IMM)


class Wire:
    """Encoder/decoder for one host NIC (``host``) of an address plan."""

    def __init__(self, plan: AddressPlan, host: str) -> None:
        self.plan, self.host = plan, host
        self.my_nic = plan.nic_address(host).packed
        self._tpl: dict[tuple[str, int], bytes] = {}
        self._parts: dict[tuple[str, int], tuple[bytes, ...]] = {}
        self._dst: dict[tuple[str, int], bytes] = {}
        self._templates: dict[str, object] = {}
        self.nic_to_host = {plan.nic_address(h).packed: h for h in plan.spec.hosts()}
        self.rejected: dict[str, int] = {}

    # ---- encode -------------------------------------------------------------------------------
    def _template(self, peer: str, plane: int) -> bytes:
        key = (peer, plane)
        t = self._tpl.get(key)
        if t is None:
            p = self.plan
            t = bytes(
                Ether(src=p.host_mac(self.host, plane), dst=p.gateway_mac(self.host, plane))
                / IPv6(src=str(p.port_address(self.host, plane)), dst="::", nh=41, hlim=64)
                / IPv6(src=str(p.nic_address(self.host)), dst=str(p.nic_address(peer)), nh=17, hlim=64)
                / UDP(sport=0, dport=H.UDP_PORT, chksum=0)
            )[: H.L2_L4]
            self._tpl[key] = t
        return t

    def _outer_dst(self, peer: str, ev: int) -> bytes:
        key = (peer, ev)
        d = self._dst.get(key)
        if d is None:
            tpl = self._templates.get(peer)
            if tpl is None:
                tpl = self._templates[peer] = self.plan.template(self.host, peer)
            d = self._dst[key] = tpl.outer_dst_int(ev).to_bytes(16, "big")  # type: ignore[attr-defined]
        return d

    def _template_parts(self, peer: str, plane: int) -> tuple[bytes, ...]:
        """The constant fields of :meth:`_template` as :data:`_DATA_FRAME` takes them: Ethernet,
        outer next header + hop limit, outer src, inner ver/tc/flow, inner next header + hop limit,
        inner src + dst."""
        t = self._template(peer, plane)
        o, i = H.OFF_OUTER, H.OFF_INNER
        parts = (t[:o], t[o + 6 : o + 8], t[o + 8 : o + 24], t[i : i + 4], t[i + 6 : i + 8], t[i + 8 : i + 40])
        self._parts[(peer, plane)] = parts
        return parts

    def encode(self, p: Pkt, peer: str) -> tuple[int, list[bytes | memoryview]]:
        """(plane to send on, buffers for ``sendmsg``) of packet ``p`` to host ``peer``."""
        plane = (p.ev >> 12) & 0xF
        op = p.op
        ev = p.ev
        if op in _DATA_OPS:
            tail = p.payload
            imm_op = op == H.OP_WRITE_IMM
            # UDP payload: BTH..payload + ICRC
            n = H.DATA_HDR - H.L2_L4 + (H.IMM.size if imm_op else 0) + len(tail) + 4
            eth, onh, osrc, ivtf, inh, iaddr = self._parts.get((peer, plane)) or self._template_parts(peer, plane)
            dst = self._dst.get((peer, ev)) or self._outer_dst(peer, ev)
            fields = (eth, 0x60000000 | ((ev >> 16) & 0xFFFF), 48 + n, onh, osrc, dst, ivtf, 8 + n, inh, iaddr,
                      ev & 0xFFFF, H.UDP_PORT, 8 + n, 0, op, 0, 0xFFFF, (p.flags << 24) | (p.qp & 0xFFFFFF),
                      p.psn & 0xFFFFFF, p.msn & 0xFFFFFFFF, p.msg_len, p.msg_crc, p.msg_offset, 0, p.port_state, 0,
                      p.va, p.rkey, p.dma_len)
            hdr = _DATA_FRAME_IMM.pack(*fields, (p.imm or 0) & 0xFFFFFFFF) if imm_op else _DATA_FRAME.pack(*fields)
            crc = zlib.crc32(tail, zlib.crc32(memoryview(hdr)[H.OFF_BTH :]))
            return plane, [hdr, tail, _U32.pack(crc)]
        if op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
            buf = bytearray(H.L2_L4 + 12 + H.SACK.size)
            _BTH.pack_into(buf, H.L2_L4, op, 0, 0xFFFF, p.qp & 0xFFFFFF, 0)
            H.SACK.pack_into(buf, H.OFF_BODY, p.cum_psn, p.base_psn, p.bitmap, p.echo_ev, p.echo_psn, p.sflags,
                             p.port_state, 0)
        elif op == H.OP_PROBE:
            buf = bytearray(H.L2_L4 + 12 + H.PROBE.size)
            _BTH.pack_into(buf, H.L2_L4, op, 0, 0xFFFF, p.qp & 0xFFFFFF, 0)
            H.PROBE.pack_into(buf, H.OFF_BODY, p.probe_id, p.is_reply, p.port_state, 0, p.echo_ev or p.ev, p.t_send_ns)
        else:
            raise ValueError(f"cannot encode opcode {op:#x}")
        crc = zlib.crc32(memoryview(buf)[H.L2_L4:])
        n = len(buf) - H.L2_L4 + 4
        buf[: H.L2_L4] = self._template(peer, plane)
        _L3.pack_into(buf, H.OFF_OUTER, 0x60000000 | ((ev >> 16) & 0xFFFF))  # version 6, flow label = EV high
        struct.pack_into("!H", buf, H.OFF_OUTER + 4, 48 + n)
        buf[H.OFF_OUTER + 24 : H.OFF_OUTER + 40] = self._dst.get((peer, ev)) or self._outer_dst(peer, ev)
        struct.pack_into("!H", buf, H.OFF_INNER + 4, 8 + n)
        struct.pack_into("!HHH", buf, H.OFF_UDP, ev & 0xFFFF, H.UDP_PORT, 8 + n)
        return plane, [buf, _U32.pack(crc)]

    # ---- decode -------------------------------------------------------------------------------
    def _reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1

    def decode(self, f: bytes | memoryview) -> tuple[str, Pkt] | None:
        """(sending host, packet) of an MRC frame for this NIC; None (counted) for anything else."""
        try:
            return self._decode(f)
        except (struct.error, IndexError, ValueError):
            self._reject("malformed")
            return None

    def _decode(self, f) -> tuple[str, Pkt] | None:
        if len(f) < H.OFF_BODY:
            self._reject("not IPv6 or too short")
            return None
        (ethertype, first, onh, inh, isrc, idst, sport, dport, ulen,
         op, fq, psn) = _FIXED.unpack_from(f, 12)
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
        if dport != H.UDP_PORT:
            self._reject("not MRC's UDP port")
            return None
        end = H.OFF_UDP + ulen - 4  # the last 4 bytes are the ICRC
        if ulen < 8 + H.BTH_SIZE + 4 or end + 4 > len(f):
            self._reject("bad UDP length")
            return None
        v = memoryview(f)
        if zlib.crc32(v[H.OFF_BTH : end]) != _U32.unpack_from(f, end)[0]:
            self._reject("bad ICRC")
            return None
        ev = ev_from_wire(sport, first & 0xFFFFF)
        ecn_ce = ((first >> 20) & 0x3) == 0x3
        flags, qp, psn = fq >> 24, fq & 0xFFFFFF, psn & 0xFFFFFF
        x = H.OFF_BODY
        if op in _DATA_OPS:
            imm_op = op == H.OP_WRITE_IMM
            st = _DATA_BODY_IMM if imm_op else _DATA_BODY
            if end - x < st.size:
                self._reject("truncated data header")
                return None
            if imm_op:
                msn, msg_len, crc, moff, _xf, ports, _, va, rkey, dma_len, imm = st.unpack_from(f, x)
            else:
                msn, msg_len, crc, moff, _xf, ports, _, va, rkey, dma_len = st.unpack_from(f, x)
                imm = None
            return src, Pkt(op=op, qp=qp, psn=psn, ev=ev, flags=flags, msn=msn, msg_len=msg_len, msg_crc=crc,
                            msg_offset=moff, va=va, rkey=rkey, dma_len=dma_len, payload=v[x + st.size : end], imm=imm,
                            port_state=ports, ecn_ce=ecn_ce)
        if op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
            if end - x < H.SACK.size:
                self._reject("truncated SACK")
                return None
            cum, base, bm, eev, epsn, sfl, ports, _ = H.SACK.unpack_from(f, x)
            return src, Pkt(op=op, qp=qp, ev=ev, cum_psn=cum, base_psn=base, bitmap=bm, echo_ev=eev, echo_psn=epsn,
                            sflags=sfl, port_state=ports)
        if op == H.OP_PROBE:
            if end - x < H.PROBE.size:
                self._reject("truncated probe")
                return None
            pid, rep, ports, _, pev, tns = H.PROBE.unpack_from(f, x)
            return src, Pkt(op=op, qp=qp, ev=ev, probe_id=pid, is_reply=rep, port_state=ports, echo_ev=pev,
                            t_send_ns=tns)
        self._reject("unknown opcode")
        return None


def frame_bytes(bufs: list) -> bytes:
    return b"".join(bytes(x) for x in bufs)


__all__ = ["Wire", "frame_bytes", "socket"]
