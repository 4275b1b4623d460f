"""What one host's NIC ports carried, read from a run's captures (``mrclab run --pcap``):
``mrclab report RESULTS... --frames HOST``.

A transport's control frames share the host's ports with its data, and on the lab's slow links
they can fill a port: the incast's receiver sends a 154-byte NACK for every trimmed packet, a SACK
per two arrivals and probes, 1.00 Mb/s of frames out of each 1 Mb/s port (2026-12-07). This module counts
a host's frames by direction and kind, finds each port's busiest second, and times the answers:
from a data packet's arrival to the departure of the SACK or NACK that echoes it. tcpdump taps a
port as the kernel hands it a frame to send, after the port's ``tbf`` queue, so an answer's lag is
the receiver's endpoint plus the port's queue.

Frames are read with scapy's ``RawPcapReader`` and decoded by the endpoints' own codec
(:class:`traffic.wire.Wire`), so what counts as a SACK, a NACK or a trimmed packet here is what
the endpoints made of it. Errors: :class:`FramesError` (a :class:`BadInput`), one line naming the
folder or host and what is allowed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mrclab.experiments.analysis.metrics import percentile
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import BadInput
from mrclab.topologies.spec import SpecError, load_spec
from mrclab.traffic.wire import Wire

#: The kinds of frame, in the order a table lists them (data first, then what answers it).
KINDS = ("data", "data, resent", "data, trimmed", "SACK", "NACK", "ACK", "CNP", "probe", "probe answer", "other")
#: Percentiles of an answer's lag the report gives (nearest rank).
LAG_PERCENTILES = (10, 50, 90, 99)


class FramesError(BadInput):
    """A results folder has no captures of the host asked for, or is not a results folder."""


@dataclass
class HostFrames:
    """A host's frames over a run: ``frames[(direction, kind)]`` and ``bytes[(direction, kind)]``
    (direction "out" or "in", kind one of :data:`KINDS`; bytes as captured, Ethernet header to
    ICRC); ``busiest_mbps[port]``: the most bits a port sent in one whole second of the capture,
    Mb/s; ``sack_lag_s`` / ``nack_lag_s``: for each data packet that arrived whole / trimmed and
    was answered, seconds from its arrival to the departure of the first SACK / NACK that echoes
    its PSN (ascending)."""

    host: str
    frames: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    busiest_mbps: dict[str, float] = field(default_factory=dict)
    sack_lag_s: list[float] = field(default_factory=list)
    nack_lag_s: list[float] = field(default_factory=list)


def _kind(p) -> str:
    op = p.op
    if op in (H.OP_WRITE, H.OP_WRITE_IMM):
        if p.flags & H.F_TRIM:
            return "data, trimmed"
        return "data, resent" if p.flags & H.F_RETX else "data"
    if op == H.OP_PROBE:
        return "probe answer" if p.is_reply else "probe"
    return {H.OP_SACK: "SACK", H.OP_NACK: "NACK", H.OP_ACK: "ACK", H.OP_CNP: "CNP"}.get(op, "other")


def _pcap_frames(path: Path):
    """(time in s, frame bytes) of every frame of one pcap, in file order."""
    from scapy.utils import RawPcapReader  # scapy's import is slow: only when captures are read

    with RawPcapReader(str(path)) as reader:
        for data, meta in reader:
            yield meta.sec + meta.usec / 1e6, data


def host_frames(results: Path, host: str) -> HostFrames:
    """Count and time ``host``'s frames from ``results/pcap/<host>-eth<plane>.pcap`` (every plane
    port captured), decoding with the fabric of ``results/fabric.yaml``.

    Raises :class:`FramesError` when the folder has no fabric or no captures of ``host``, or when
    ``host`` is not one of the fabric's hosts."""
    try:
        spec = load_spec(results / "fabric.yaml")
    except SpecError as e:
        raise FramesError(f"{results}: not a results folder of `mrclab run` ({e.one_line()})") from None
    if host not in spec.hosts():
        raise FramesError(f"unknown host {host!r}: {results.name}'s fabric has {', '.join(spec.hosts())}")
    pcaps = sorted((results / "pcap").glob(f"{host}-eth*.pcap"))
    if not pcaps:
        raise FramesError(f"{results}: no capture of {host}'s ports (pcap/{host}-eth*.pcap); run it with --pcap")
    plan = AddressPlan(spec)
    me = plan.nic_address(host).packed
    wires = {plan.nic_address(h).packed: Wire(plan, h) for h in spec.hosts()}  # inner destination -> its codec
    out = HostFrames(host)
    #: (time, 0 arrival / 1 answer, peer, QP, PSN, trimmed arrival / NACK): both directions of
    #: every port, put in time order below
    timeline: list[tuple[float, int, str, int, int, bool]] = []
    src_at, dst_at = H.OFF_INNER + 8, H.OFF_INNER + 24
    for pcap in pcaps:
        per_second: Counter = Counter()
        for t, f in _pcap_frames(pcap):
            direction = "out" if bytes(f[src_at:src_at + 16]) == me else "in"
            wire = wires.get(bytes(f[dst_at:dst_at + 16]))
            got = wire.decode(f) if wire is not None else None
            kind = "other" if got is None else _kind(got[1])
            out.frames[(direction, kind)] += 1
            out.bytes[(direction, kind)] += len(f)
            if direction == "out":
                per_second[int(t)] += len(f) * 8
            if got is None:
                continue
            peer, p = got
            if direction == "out" and p.op in (H.OP_SACK, H.OP_NACK):
                timeline.append((t, 1, wire.host, p.qp, p.echo_psn, p.op == H.OP_NACK))  # type: ignore[union-attr]
            elif direction == "in" and kind.startswith("data"):
                timeline.append((t, 0, peer, p.qp, p.psn, kind == "data, trimmed"))
        if per_second:  # whole seconds only: the capture cuts the first and the last
            whole = sorted(per_second)[1:-1] or sorted(per_second)
            out.busiest_mbps[pcap.stem] = max(per_second[s] for s in whole) / 1e6
    timeline.sort()
    waiting: dict[tuple[str, int, int, bool], float] = {}  # an arrival not answered yet -> when it came
    for t, answer, peer, qp, psn, trimmed in timeline:
        key = (peer, qp, psn, trimmed)
        if not answer:
            waiting.setdefault(key, t)  # the first of several copies waiting is what the answer is late for
            continue
        came = waiting.pop(key, None)
        if came is not None:
            (out.nack_lag_s if trimmed else out.sack_lag_s).append(t - came)
    out.sack_lag_s.sort()
    out.nack_lag_s.sort()
    return out


def rows(runs: list[HostFrames]) -> list[tuple[str, list[str]]]:
    """Table rows comparing ``runs`` (one column each): frames and bytes per (direction, kind) any
    run saw, each port's busiest second, and the answers' lag percentiles (ms)."""
    out: list[tuple[str, list[str]]] = []
    for direction in ("out", "in"):
        for kind in KINDS:
            key = (direction, kind)
            if any(r.frames[key] for r in runs):
                out.append((f"{direction}: {kind}", [f"{r.frames[key]:,} ({r.bytes[key]:,} B)" for r in runs]))
    ports = sorted({p for r in runs for p in r.busiest_mbps})
    for port in ports:
        out.append((f"{port}: busiest second out (Mb/s)",
                    [f"{r.busiest_mbps[port]:.2f}" if port in r.busiest_mbps else "-" for r in runs]))
    for name, attr in (("SACK after a whole arrival", "sack_lag_s"), ("NACK after a trimmed arrival", "nack_lag_s")):
        lags = [getattr(r, attr) for r in runs]
        if not any(lags):
            continue
        cells = []
        for v in lags:
            text = " / ".join(f"{1e3 * percentile(v, q):.1f}" for q in LAG_PERCENTILES) if v else ""
            cells.append(f"n={len(v):,}: {text}" if v else "-")
        out.append((f"{name}, ms (p{'/p'.join(map(str, LAG_PERCENTILES))})", cells))
    return out
