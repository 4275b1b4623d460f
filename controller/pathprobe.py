"""Path probe: one source-routed probe over every (src, dst, plane, T1) path of a running fabric.

Like MRC's clustermapper (docs/mrc.md, "Clustermapper"), but from outside the hosts: one process
opens a raw ``AF_PACKET`` socket on every host NIC port *inside the host's namespace* (the socket
stays bound to that namespace), sends each probe out of the source's plane port with the path's
uSID container as outer destination, and listens on every destination port.

Probe frame (docs/protocol.md, "Path probes"): Ethernet / outer IPv6 (dst = the path's uSID
container, flow label = EV high bits) / inner IPv6 (NIC to NIC) / UDP (sport = EV low bits,
dport :data:`PROBE_UDP_PORT`) / payload ``b"MRCPATH\\0" | u32 probe id | u32 path index``.

A probe counts as delivered only when it arrives on the destination's port of the path's plane,
with the inner destination of the destination NIC and the outer destination reduced to the
destination's downlink uSID (every uSID consumed), and with the hop limit the path's length
implies (64 minus one per switch).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mrclab.emulation import kernel
from mrclab.topologies.addressing import AddressPlan, Path, ev_to_wire
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

ETH_P_IPV6 = 0x86DD
PROBE_UDP_PORT = 4792
PROBE_MAGIC = b"MRCPATH\0"
HOP_LIMIT = 64
_PAYLOAD = struct.Struct("!8sII")


@dataclass
class ProbeResult:
    """Outcome of one path: ``delivered`` plus what the arriving probe showed, or why it failed."""

    path: Path
    delivered: bool = False
    rtt_us: float | None = None  # one-way send-to-arrival time in this process, microseconds
    arrived_outer_dst: str | None = None
    arrived_hop_limit: int | None = None
    problem: str | None = None
    evidence: dict[str, int] = field(default_factory=dict)  # switch -> packet counter delta


class NicSockets:
    """Raw sockets on every NIC port of every host, opened inside the hosts' namespaces.

    ``netns_of(host)`` gives the namespace name (``mrclab-hN``). Close with :meth:`close`.
    """

    def __init__(self, plan: AddressPlan, netns_of: Callable[[str], str]) -> None:
        """Open a non-blocking raw IPv6 socket on every (host, plane) port, inside the host's
        namespace. Raises OSError (the sockets opened so far are closed first)."""
        self.plan = plan
        self.socks: dict[tuple[str, int], socket.socket] = {}
        try:
            for h in plan.spec.hosts():
                with kernel.inside(netns_of(h)):  # this thread only; the socket keeps the namespace
                    for p in range(plan.spec.planes):
                        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IPV6))
                        self.socks[(h, p)] = s
                        s.bind((plan.host_intf(h, p), ETH_P_IPV6))
                        s.setblocking(False)
        except BaseException:
            self.close()
            raise
        self.by_fd = {s.fileno(): key for key, s in self.socks.items()}

    def close(self) -> None:
        """Close every socket."""
        for s in self.socks.values():
            s.close()
        self.socks.clear()

    def drain(self) -> None:
        """Read and discard whatever every socket holds."""
        for s in self.socks.values():
            while True:
                try:
                    s.recv(65535)
                except BlockingIOError:
                    break


def probe_frame(plan: AddressPlan, path: Path, probe_id: int, index: int) -> bytes:
    """The probe for ``path`` as Ethernet frame bytes."""
    sport, label = ev_to_wire(path.ev)
    frame = (
        Ether(src=plan.host_mac(path.src, path.plane), dst=plan.gateway_mac(path.src, path.plane))
        / IPv6(src=str(plan.port_address(path.src, path.plane)), dst=str(path.outer_dst), fl=label, hlim=HOP_LIMIT)
        / IPv6(src=str(plan.nic_address(path.src)), dst=str(plan.nic_address(path.dst)), hlim=HOP_LIMIT)
        / UDP(sport=sport, dport=PROBE_UDP_PORT)
        / _PAYLOAD.pack(PROBE_MAGIC, probe_id, index)
    )
    return bytes(frame)


def _parse(frame: bytes) -> tuple[str, int, str, int, int] | None:
    """frame -> (outer dst, outer hop limit, inner dst, probe id, path index), None if no probe."""
    if len(frame) < 14 + 40 + 40 + 8 + _PAYLOAD.size or frame[12:14] != b"\x86\xdd":
        return None
    o = 14
    if frame[o + 6] != 41:
        return None
    outer_dst = socket.inet_ntop(socket.AF_INET6, frame[o + 24 : o + 40])
    hlim = frame[o + 7]
    i = o + 40
    if frame[i + 6] != 17:
        return None
    inner_dst = socket.inet_ntop(socket.AF_INET6, frame[i + 24 : i + 40])
    u = i + 40
    if struct.unpack_from("!H", frame, u + 2)[0] != PROBE_UDP_PORT:
        return None
    magic, pid, idx = _PAYLOAD.unpack_from(frame, u + 8)
    if magic != PROBE_MAGIC:
        return None
    return outer_dst, hlim, inner_dst, pid, idx


def probe_paths(
    plan: AddressPlan,
    netns_of: Callable[[str], str],
    paths: Iterable[Path] | None = None,
    *,
    timeout_s: float = 1.0,
    count_packets: Callable[[], dict[str, int]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ProbeResult]:
    """Send one probe per path and collect the results, in ``paths`` order (default: every path
    between distinct hosts and every loop, :meth:`AddressPlan.all_paths`).

    Without ``count_packets`` all probes are sent at once and collected until ``timeout_s`` after
    the last send. With it, paths are probed one at a time and ``count_packets()`` (switch ->
    packets it has forwarded) is read around each probe, so every result carries per-switch
    evidence of where its probe went.
    """
    paths = list(plan.all_paths(loops=True) if paths is None else paths)
    results = [ProbeResult(p) for p in paths]
    run_id = (os.getpid() << 8 | int(time.time()) & 0xFF) & 0xFFFFFFFF
    socks = NicSockets(plan, netns_of)
    try:
        socks.drain()
        frames = [probe_frame(plan, p, run_id, i) for i, p in enumerate(paths)]
        sent_at: dict[int, float] = {}
        if count_packets is None:
            for i, p in enumerate(paths):
                sent_at[i] = time.monotonic()
                socks.socks[(p.src, p.plane)].send(frames[i])
            _collect(plan, socks, results, sent_at, run_id, timeout_s, pending=set(range(len(paths))))
        else:
            for i, p in enumerate(paths):
                before = count_packets()
                sent_at[i] = time.monotonic()
                socks.socks[(p.src, p.plane)].send(frames[i])
                _collect(plan, socks, results, sent_at, run_id, timeout_s, pending={i})
                after = count_packets()
                results[i].evidence = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
                if progress:
                    progress(i + 1, len(paths))
    finally:
        socks.close()
    for r in results:
        if not r.delivered and r.problem is None:
            r.problem = f"no probe arrived within {timeout_s} s"
    return results


def _collect(plan, socks, results, sent_at, run_id, timeout_s, pending: set[int]) -> None:
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    for fd in socks.by_fd:
        poller.register(fd, select.POLLIN)
    while pending and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            host, plane = socks.by_fd[fd]
            s = socks.socks[(host, plane)]
            while True:
                try:
                    frame, addr = s.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] == socket.PACKET_OUTGOING:
                    continue
                parsed = _parse(frame)
                if parsed is None or parsed[3] != run_id or parsed[4] >= len(results):
                    continue
                idx = parsed[4]
                _judge(plan, results[idx], host, plane, parsed, time.monotonic() - sent_at.get(idx, 0.0))
                pending.discard(idx)


def _judge(plan: AddressPlan, r: ProbeResult, host: str, plane: int, parsed, dt: float) -> None:
    outer_dst, hlim, inner_dst, _, _ = parsed
    p = r.path
    r.arrived_outer_dst, r.arrived_hop_limit, r.rtt_us = outer_dst, hlim, dt * 1e6
    want_outer = str(plan.sid_prefix(plan.downlink_usid(p.dst)[p.plane]).network_address)
    want_hlim = HOP_LIMIT - len(p.hops)
    problems = []
    if (host, plane) != (p.dst, p.plane):
        problems.append(f"arrived at {host} port {plane}, expected {p.dst} port {p.plane}")
    if inner_dst != str(plan.nic_address(p.dst)):
        problems.append(f"inner destination {inner_dst}")
    if outer_dst != want_outer:
        problems.append(f"outer destination {outer_dst}, expected {want_outer} (uSIDs not all consumed)")
    if hlim != want_hlim:
        problems.append(f"hop limit {hlim}, expected {want_hlim} ({len(p.hops)} switches)")
    r.delivered = not problems
    r.problem = "; ".join(problems) or None


def implicate(results: list[ProbeResult]) -> list[tuple[str, int]]:
    """Elements (switch names and links ``a:b``) every path through which failed, with the count.

    Network tomography by elimination: an element on any delivered path is exonerated. Links are
    dropped from the answer when one of their ends is an implicated switch, so a dead T1 is
    reported as the T1, not as its links.
    """
    good: set[str] = set()
    bad: dict[str, int] = {}
    for r in results:
        elems = set(r.path.hops) | {f"{a}:{b}" for a, b in r.path.links}
        if r.delivered:
            good.update(elems)
        else:
            for e in elems:
                bad[e] = bad.get(e, 0) + 1
    suspects = {e: n for e, n in bad.items() if e not in good}
    switches = {e for e in suspects if ":" not in e}
    out = [(e, n) for e, n in suspects.items() if ":" not in e or not (set(e.split(":")) & switches)]
    return sorted(out, key=lambda x: (-x[1], x[0]))
