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

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_DATA_OPS = (H.OP_WRITE, H.OP_WRITE_IMM)
# BTH as opcode, flags(se/m/pad/tver), pkey, (MRC flags << 24 | dest QP), (ackreq << 24 | PSN)
_BTH = struct.Struct("!BBHII")
_DATA_HDR = struct.Struct("!BBHII" "IIIIBBH" "QII")  # BTH + MRCX + RETH
_DATA_HDR_IMM = struct.Struct("!BBHII" "IIIIBBH" "QII" "I")
_L3 = struct.Struct("!I")


class Wire:
    """Encoder/decoder for one host NIC (``host``) of an address plan."""

    def __init__(self, plan: AddressPlan, host: str) -> None:
        self.plan, self.host = plan, host
        self.my_nic = plan.nic_address(host).packed
        self._tpl: dict[tuple[str, int], bytes] = {}
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

    def encode(self, p: Pkt, peer: str) -> tuple[int, list[bytes | memoryview]]:
        """(plane to send on, buffers for ``sendmsg``) of packet ``p`` to host ``peer``."""
        plane = (p.ev >> 12) & 0xF
        op = p.op
        tail: bytes | memoryview = b""
        if op in _DATA_OPS:
            st = _DATA_HDR_IMM if op == H.OP_WRITE_IMM else _DATA_HDR
            buf = bytearray(H.L2_L4 + st.size)
            args = [op, 0, 0xFFFF, (p.flags << 24) | (p.qp & 0xFFFFFF), p.psn & 0xFFFFFF,
                    p.msn & 0xFFFFFFFF, p.msg_len, p.msg_crc, p.msg_offset, 0, p.port_state, 0, p.va, p.rkey, p.dma_len]
            if op == H.OP_WRITE_IMM:
                args.append((p.imm or 0) & 0xFFFFFFFF)
            st.pack_into(buf, H.L2_L4, *args)
            tail = p.payload
        elif op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
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
        if tail:
            crc = zlib.crc32(tail, crc)
        n = len(buf) - H.L2_L4 + len(tail) + 4
        buf[: H.L2_L4] = self._template(peer, plane)
        ev = p.ev
        _L3.pack_into(buf, H.OFF_OUTER, 0x60000000 | ((ev >> 16) & 0xFFFF))  # version 6, flow label = EV high
        struct.pack_into("!H", buf, H.OFF_OUTER + 4, 48 + n)
        buf[H.OFF_OUTER + 24 : H.OFF_OUTER + 40] = self._dst.get((peer, ev)) or self._outer_dst(peer, ev)
        struct.pack_into("!H", buf, H.OFF_INNER + 4, 8 + n)
        struct.pack_into("!HHH", buf, H.OFF_UDP, ev & 0xFFFF, H.UDP_PORT, 8 + n)
        return plane, [buf, tail, _U32.pack(crc)] if tail else [buf, _U32.pack(crc)]

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
        if len(f) < H.OFF_BODY or f[12:14] != b"\x86\xdd":
            self._reject("not IPv6 or too short")
            return None
        o = H.OFF_OUTER
        if f[o] >> 4 != 6 or f[o + 6] != 41 or f[H.OFF_INNER + 6] != 17:
            self._reject("not IPv6-in-IPv6 / UDP")
            return None
        i = H.OFF_INNER
        if f[i + 24 : i + 40] != self.my_nic:
            self._reject("not for this NIC")
            return None
        src = self.nic_to_host.get(bytes(f[i + 8 : i + 24]))
        if src is None:
            self._reject("unknown source NIC")
            return None
        sport, dport, ulen = struct.unpack_from("!HHH", f, H.OFF_UDP)
        if dport != H.UDP_PORT:
            self._reject("not MRC's UDP port")
            return None
        end = H.OFF_UDP + ulen - 4  # the last 4 bytes are the ICRC
        if ulen < 8 + H.BTH_SIZE + 4 or end + 4 > len(f):
            self._reject("bad UDP length")
            return None
        if zlib.crc32(f[H.OFF_BTH : end]) != _U32.unpack_from(f, end)[0]:
            self._reject("bad ICRC")
            return None
        first = _U32.unpack_from(f, o)[0]
        ev = ev_from_wire(sport, first & 0xFFFFF)
        ecn_ce = ((first >> 20) & 0x3) == 0x3
        op, _, _, fq, psn = _BTH.unpack_from(f, H.OFF_BTH)
        flags, qp, psn = fq >> 24, fq & 0xFFFFFF, psn & 0xFFFFFF
        x = H.OFF_BODY
        if op in _DATA_OPS:
            need = H.MRCX.size + H.RETH.size + (H.IMM.size if op == H.OP_WRITE_IMM else 0)
            if end - x < need:
                self._reject("truncated data header")
                return None
            msn, msg_len, crc, moff, _xf, ports, _ = H.MRCX.unpack_from(f, x)
            va, rkey, dma_len = H.RETH.unpack_from(f, x + H.MRCX.size)
            imm = H.IMM.unpack_from(f, x + H.MRCX.size + H.RETH.size)[0] if op == H.OP_WRITE_IMM else None
            pay = bytes(f[x + need : end])
            return src, Pkt(op=op, qp=qp, psn=psn, ev=ev, flags=flags, msn=msn, msg_len=msg_len, msg_crc=crc,
                            msg_offset=moff, va=va, rkey=rkey, dma_len=dma_len, payload=pay, imm=imm,
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
