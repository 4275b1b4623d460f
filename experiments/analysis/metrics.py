"""Metrics of a run and the expectations a scenario can bound.

Input is the normalised record the runner builds from the endpoints' telemetry (a
:class:`RunData`): per-QP cumulative delivered bytes sampled over time, per-QP totals and the event
log (faults, EV state changes, retransmits, losses). Times are seconds from the start of the
timeline. Goodput is bytes delivered into the receiver's memory region per second, in Mb/s, in
:data:`BIN_S` bins.

``baseline``: mean total goodput from ``warmup_s`` after traffic starts until the first fault;
ratios are taken against it (or against a ``baseline=[a, b]`` window where an expectation names one).

Which metrics exist, their arguments, units and one-line definitions are not listed here: they
are rows of one table, :data:`experiments.analysis.expectations.METRICS`, which the scenario validator, the
dispatcher, ``mrclab run --help`` and docs/design.md's metric table all read (a list here went
stale as metrics joined). This module holds the value functions of the goodput, retransmission,
EV, port-counter and message metrics; verdicts against what the faults left of the fabric are in
experiments/analysis/verdicts.py, the collective's in experiments/analysis/collectives.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mrclab.controller.bpf import NIC_SLACK_FRAMES
from mrclab.experiments.analysis.fabricstate import FabricTimeline
from mrclab.experiments.analysis.fidelity import BehindSample, HeldLimits, LateInterval
from mrclab.topologies.addressing import ev_plane

BIN_S = 0.1


@dataclass
class RunData:
    """What a run produced, normalised. ``samples[qp] = [(t_s, delivered_bytes_cumulative), ...]``;
    ``qp_src[qp]`` the sending host; ``events`` dicts with at least ``t`` and ``kind``."""

    duration_s: float
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    qp_src: dict[str, str] = field(default_factory=dict)
    totals: dict[str, dict] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    rtt_us: float | None = None
    first_fault_s: float | None = None
    traffic_start_s: float = 0.0
    #: qp -> [(t_s, window bytes, rate bits/s or None)]
    windows: dict[str, list[tuple[float, float | None, float | None]]] = field(default_factory=dict)
    #: qp -> [(t_s, {ev: data packets sent so far})]
    ev_packets: dict[str, list[tuple[float, dict[int, int]]]] = field(default_factory=dict)
    #: qp -> completion time of each message (s)
    completion_s: dict[str, list[float]] = field(default_factory=dict)
    #: the run's collective (experiments/analysis/collectives.py CollectiveRun), if it ran one
    collective: object | None = None
    #: switch port samples: {t, switch, port, peer, queue, marked, trimmed, queue_full[, gray (linux)]
    #: [, late, late_max_us, gap_us, sent (bmv2: the drain watch, controller/fabric.py port_samples)]}
    ports: list[dict] = field(default_factory=list)
    #: why no switch port was ever read on a fabric whose switches queue (the sampler's last error),
    #: None when one was or none queue: its counts are unknown, never 0
    ports_unread: str | None = None
    #: host NIC port samples, the drain watch (controller/bpf.py NicWatch): {t, host, port (its
    #: interface), backlog (bytes its tbf held), behind_us, gap_us}
    nic_ports: list[dict] = field(default_factory=list)
    port_mbps: float = 0.0  # one NIC port's rate (the fabric's host links), 0: unshaped
    flows: list[tuple[str, str]] = field(default_factory=list)  # (src, dst) of every flow
    timeline: FabricTimeline | None = None  # the faults as played (experiments/analysis/fabricstate.py)
    #: (t_s, host, the most its loop began a turn later than due in the telemetry interval before t, s)
    loop_gaps: list[tuple[float, str, float]] = field(default_factory=list)
    #: (t_s, "endpoint h0" | "switch t1-0-0", scheduling delay per run (s), waited share of the interval
    #: before t, that interval (s))
    run_delays: list[tuple[float, str, float, float, float]] = field(default_factory=list)
    #: (t_s, packets this machine's kernel dropped from its receive backlogs in the interval before t,
    #: that interval (s)): the monitor's ``kernel_drops``, intervals with drops only
    kernel_drops: list[tuple[float, int, float]] = field(default_factory=list)
    #: (t_s, "cpu N", share of the interval before t the hypervisor took that CPU, that interval (s)):
    #: the monitor's ``stolen``, intervals with steal only
    stolen: list[tuple[float, str, float, float]] = field(default_factory=list)
    #: (t_s, receiving host, first transmissions that arrived behind a later one on their EV in the
    #: telemetry interval before t): a FIFO path reordered, samples with some only
    reordered: list[tuple[float, str, int]] = field(default_factory=list)
    #: what the model lets a round trip take (experiments/analysis/fidelity.py): a packet older when it
    #: arrived was held outside the model
    held_limits: HeldLimits = field(default_factory=HeldLimits)
    #: (t_s, host, the endpoint's resident memory in bytes) at each of its telemetry samples
    rss: list[tuple[float, str, int]] = field(default_factory=list)
    #: (t_s, host, frames its sockets dropped since the run began: received into full buffers, or
    #: refused at send by a port's error) at each sample
    socket_drops: list[tuple[float, str, int]] = field(default_factory=list)
    #: [t0, t1] (s) of every fidelity fault of the run (experiments/analysis/fidelity.py): the run-long counts
    #: leave out what happened inside them (experiments/analysis/expectations.py ``LEAVES_OUT``)
    fidelity_windows: list[tuple[float, float]] = field(default_factory=list)
    #: [t0, t1] (s) of the fidelity faults that could have lost a packet or held one past its timer
    #: (:attr:`~experiments.analysis.fidelity.FidelityFault.retires`): the only ones a retirement is
    #: left out for; None: every fidelity fault's
    retire_windows: list[tuple[float, float]] | None = None

    def mct_percentiles(self, host: str | None = None) -> dict[str, float]:
        """p50 / p99 / p99.9 message completion time (s), of ``host``'s QPs if given ({} if none)."""
        xs = sorted(x for qp, v in self.completion_s.items() if host is None or qp.startswith(f"{host}->") for x in v)
        return {f"p{p:g}": percentile(xs, p) for p in (50, 99, 99.9)} if xs else {}

    def socket_drops_between(self, lo: float = 0.0, hi: float = math.inf) -> int:
        """Frames the endpoints' sockets dropped (full receive buffers, port errors at send) between their samples in
        [lo, hi] (s), over all hosts: each host's count at its last sample in the span less its
        count at its last sample before it."""
        before: dict[str, int] = {}
        upto: dict[str, int] = {}
        for t, host, n in sorted(self.socket_drops):
            if t < lo:
                before[host] = n
            elif t <= hi:
                upto[host] = n
        return sum(n - before.get(h, 0) for h, n in upto.items())

    def port_totals(self, switch: str | None = None) -> dict[str, int]:
        """Packets marked, trimmed and dropped at a full queue over the run, all ports ({} if none);
        and ``pauses``, PFC pauses received, where ports are lossless."""
        last: dict[tuple[str, int], dict] = {}
        for r in self.ports:
            if switch is None or r["switch"] == switch:
                last[(r["switch"], r["port"])] = r
        if not last:
            return {}
        out = {k: sum(r[k] for r in last.values()) for k in ("marked", "trimmed", "queue_full")}
        if any("pauses" in r for r in last.values()):
            out["pauses"] = sum(r.get("pauses", 0) for r in last.values())
        return out

    def late_departures(self) -> list[LateInterval]:
        """The drain watch, per switch port and sample interval with late packets (bmv2's
        ``late``, ``late_max_us``, ``gap_us`` and ``sent`` in the port samples; none on linux), as
        :class:`~experiments.analysis.fidelity.LateInterval` rows. The interval runs from the
        port's sample before (0 at the first); a count that fell (a switch restarted) counts from
        0 again."""
        out = []
        last: dict[tuple[str, int], tuple[float, int, int]] = {}
        for r in sorted(self.ports, key=lambda r: float(r["t"])):
            if "late" not in r or r["late"] in ("", None):
                continue
            key, t, n, sent = (r["switch"], int(r["port"])), float(r["t"]), int(r["late"]), int(r.get("sent") or 0)
            prev_t, prev, prev_sent = last.get(key, (0.0, 0, 0))
            last[key] = (t, n, sent)
            new = n - prev if n >= prev else n
            if new > 0:
                out.append(LateInterval(t, f"{r['switch']} port {r['port']}", new, int(r.get("late_max_us") or 0) / 1e6,
                                        int(r.get("gap_us") or 0) / 1e6, t - prev_t,
                                        sent - prev_sent if sent >= prev_sent else sent))
        return out

    def behind_schedule(self) -> tuple[list[BehindSample], int]:
        """The drain watch on linux's switch ports (``behind_us`` and ``gap_us`` in the port samples)
        and on the host NIC ports (:attr:`nic_ports`): every reading that stood behind its shaper's
        schedule, as :class:`~experiments.analysis.fidelity.BehindSample` rows (the span runs from
        the port's reading before, 0 at the first, and what it grew by from that one's, 0 where it
        was on or ahead), and how many readings there were. A NIC port whose tbf refused frames
        since its reading before (``refused``) stood at least :data:`~controller.bpf.NIC_SLACK_FRAMES`
        frames behind, and one more for each frame it refused (the drain it lost, while its sender
        kept it full); the refused frames stay in the schedule, so its reading counts that much
        less behind than it stood: the larger of the two is its reading (a NIC held for 60 ms read
        2 ms behind, and refused 45 frames)."""
        out, readings = [], 0
        last: dict[str, tuple[float, float]] = {}  # place -> (its reading before: t, how far behind, s)
        refused: dict[str, int] = {}  # NIC port -> its tbf's refusals at its reading before
        rows = [(r, f"{r['switch']} port {r['port']}") for r in self.ports] + \
               [(r, f"{r['host']} NIC port {r['port']}") for r in self.nic_ports]
        for r, place in sorted(rows, key=lambda x: float(x[0]["t"])):
            if r.get("behind_us") in ("", None):
                continue
            t, readings = float(r["t"]), readings + 1
            behind = float(r["behind_us"]) / 1e6
            if r.get("refused") not in ("", None):
                now_refused = int(r["refused"])
                more = now_refused - refused.get(place, 0)
                refused[place] = now_refused
                if more > 0:
                    behind = max(behind, (NIC_SLACK_FRAMES + more) * float(r["gap_us"]) / 1e6)
            t_before, before = last.get(place, (0.0, 0.0))
            last[place] = (t, behind)
            if behind > 0:
                out.append(BehindSample(t, place, behind, float(r["gap_us"]) / 1e6, t - t_before,
                                        behind - max(0.0, before)))
        return out, readings

    def port_left_out(self, counter: str, switch: str | None = None) -> int:
        """Packets of ``counter`` (``marked``, ``trimmed``, ``queue_full``, ``pauses``) the switch
        ports counted (of ``switch`` if given) in a sample interval that met one of the run's
        fidelity faults (``fidelity_windows``) or the :data:`SETTLE_S` after one (what a held-back
        sender sent when let go): each port's count at a sample less its count at the
        sample before (from 0 at the first; a count that fell, a switch restarted, counts from 0
        again), where the interval between the two overlaps a fault. The port sampler reads every
        switch once a second (more on a large fabric), so a fault leaves out up to a second each side."""
        per_port: dict[tuple[str, int], list[tuple[float, int]]] = {}
        for r in self.ports:
            if switch is None or r["switch"] == switch:
                per_port.setdefault((r["switch"], r["port"]), []).append((float(r["t"]), int(r.get(counter) or 0)))
        left = 0
        for samples in per_port.values():
            prev_t, prev = -math.inf, 0
            for t, v in sorted(samples):
                if any(f0 <= t and f1 + SETTLE_S >= prev_t for f0, f1 in self.fidelity_windows):
                    left += v - prev if v >= prev else v
                prev_t, prev = t, v
        return left

    def bins(self) -> list[float]:
        """Start time (s) of every :data:`BIN_S` bin of the run."""
        n = int(math.ceil(self.duration_s / BIN_S))
        return [round(i * BIN_S, 6) for i in range(n)]

    def goodput_mbps(self, host: str | None = None) -> list[float]:
        """Goodput per bin (Mb/s), all QPs or those sent by ``host``; bin i covers [i, i+1) x BIN_S."""
        nb = len(self.bins())
        total = [0.0] * nb
        for qp, pts in self.samples.items():
            if host is not None and self.qp_src.get(qp) != host:
                continue
            for (t0, b0), (t1, b1) in zip(pts, pts[1:]):
                if t1 <= t0 or b1 < b0:
                    continue
                # spread the bytes of each sampling interval over the bins it covers
                rate = (b1 - b0) / (t1 - t0)
                i = max(0, int(t0 / BIN_S))
                while i < nb and i * BIN_S < t1:
                    lo, hi = max(t0, i * BIN_S), min(t1, (i + 1) * BIN_S)
                    if hi > lo:
                        total[i] += rate * (hi - lo) * 8 / 1e6 / BIN_S
                    i += 1
        return total

    def qp_goodput_mbps(self) -> dict[str, list[float]]:
        """Goodput (Mb/s) per QP in :data:`BIN_S` bins: QP name -> series."""
        out = {}
        for qp in self.samples:
            sub = RunData(self.duration_s, {qp: self.samples[qp]}, {qp: "x"})
            out[qp] = sub.goodput_mbps("x")
        return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def percentile(sorted_xs: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of an ascending list."""
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def ev_share(d: RunData, host: str, plane: int, t1: int | None, lo: float, hi: float) -> float:
    """Share of ``host``'s data packets in [lo, hi] sent on EVs of (plane, T1)."""
    on = total = 0
    for qp, pts in d.ev_packets.items():
        if not qp.startswith(f"{host}->"):
            continue
        before = next((c for t, c in reversed(pts) if t <= lo), {})
        after = next((c for t, c in reversed(pts) if t <= hi), {})
        for ev, n in after.items():
            k = n - before.get(ev, 0)
            total += k
            if (ev >> 12) & 0xF == plane and (t1 is None or ev & 0xFFF == t1):
                on += k
    return on / total if total else 0.0


def window_mean(series: list[float], lo: float, hi: float) -> float:
    """Mean of a per-bin ``series`` over [lo, hi) seconds (0.0 for an empty window)."""
    i, j = int(round(lo / BIN_S)), int(round(hi / BIN_S))
    return _mean(series[i:j])


#: A windowed mean (:data:`~experiments.model.claims.MEANS`) leaves out each fidelity fault and this
#: long after it (s): a loss the machine caused is found a timer later, at most the timer's ceiling
#: (``max_rto_s``, 1 s), and an EV it retired is probed back well within that.
SETTLE_S = 1.0
#: A windowed mean is decided while at least this share of its window lies outside the faults
#: (:func:`kept_spans`); a window the faults held more of is void.
KEPT_MIN = 0.5


def kept_spans(d: RunData, lo: float, hi: float) -> list[tuple[float, float]]:
    """[lo, hi] (s) less every fidelity fault of the run (``fidelity_windows``) and :data:`SETTLE_S`
    after it: the stretches a windowed mean is read from, in order; [(lo, hi)] when the run had none."""
    spans = [(lo, hi)]
    for f0, f1 in d.fidelity_windows:
        c0, c1 = f0, f1 + SETTLE_S
        spans = [part for a, b in spans
                 for part in ([(a, b)] if c1 <= a or c0 >= b else [(a, c0)] * (c0 > a) + [(c1, b)] * (c1 < b))]
    return spans


def kept_mean(d: RunData, series: list[float], lo: float, hi: float) -> float:
    """Mean of a per-bin ``series`` over the bins of [lo, hi) seconds outside the run's fidelity
    faults (:func:`kept_spans`); :func:`window_mean` for a run without faults (0.0 when none are kept)."""
    return _mean([x for a, b in kept_spans(d, lo, hi) for x in series[int(round(a / BIN_S)) : int(round(b / BIN_S))]])


def kept_share(d: RunData, lo: float, hi: float) -> float:
    """The share of [lo, hi] a windowed mean is read from (:func:`kept_spans`): 1.0 without faults."""
    return sum(b - a for a, b in kept_spans(d, lo, hi)) / (hi - lo) if hi > lo else 1.0


def baseline_window(d: RunData, warmup_s: float = 1.0) -> tuple[float, float]:
    """From ``warmup_s`` after traffic starts to the first fault (or the end)."""
    lo = d.traffic_start_s + warmup_s
    hi = d.first_fault_s if d.first_fault_s is not None else d.duration_s
    if hi - lo < 2 * BIN_S:
        lo = max(0.0, hi - 1.0)
    return lo, hi


def worst_qp_ratio(d: RunData, lo: float, hi: float) -> float:
    """min over QPs of (the QP's mean goodput in [lo, hi]) / (the mean of every QP's): 1.0 when each
    QP got an equal part, 0.0 when one delivered nothing; 0.0 when no QP delivered anything."""
    per_qp = [kept_mean(d, g, lo, hi) for g in d.qp_goodput_mbps().values()]
    mean = _mean(per_qp)
    return min(per_qp) / mean if per_qp and mean > 0 else 0.0


def rss_growth(d: RunData, after: float) -> float:
    """The endpoints' memory growth: max over hosts of (resident memory at its last sample) / (its
    resident memory at its first sample at or after ``after`` s). 1.0 is flat; ``math.inf`` when
    no host has samples both there and later (a run that never sampled memory cannot be flat).
    ``d.rss`` holds each endpoint's own memory: its receive regions' pages are left out (the
    runner, experiments/run/endpoints.py), registered memory an RDMA NIC pins whole and the kernel
    here fills in as messages first land (bmv2's flap-soak at 1.5 Mb/s read 1.47 on that alone:
    two 8 MiB regions still being written at 60 s)."""
    first: dict[str, int] = {}
    last: dict[str, tuple[float, int]] = {}
    for t, host, rss in sorted(d.rss):
        if t >= after:
            first.setdefault(host, rss)
            last[host] = (t, rss)
    growth = [last[h][1] / first[h] for h in first if first[h] > 0]
    return max(growth) if growth else math.inf


def longest_stall_s(d: RunData, lo: float = 0.0, hi: float | None = None) -> float:
    """The longest time (s) any QP delivered nothing between two bins in which it delivered, within
    [lo, hi] (the whole run by default), in :data:`BIN_S` steps: a QP stuck behind a fault it never
    maps out shows the fault's whole length; one that goes on shows a bin or two at most."""
    return stalls(d, lo, hi)[0]


def stalls(d: RunData, lo: float = 0.0, hi: float | None = None) -> tuple[float, int]:
    """(:func:`longest_stall_s` with the time inside the run's fidelity faults (``fidelity_windows``)
    left out of every stall, how many stalls met a fault): a stall the machine lengthened counts only
    its time outside the machine's fault, so a transport that stalls on its own still shows it."""
    end = d.duration_s if hi is None else hi
    worst, met = 0.0, 0
    for g in d.qp_goodput_mbps().values():
        busy = [i for i, x in enumerate(g) if x > 0 and lo <= i * BIN_S < end]
        for a, b in zip(busy, busy[1:]):
            if b - a - 1 <= 0:
                continue
            s0, s1 = (a + 1) * BIN_S, b * BIN_S  # the empty bins
            inside = sum(max(0.0, min(s1, f1) - max(s0, f0)) for f0, f1 in d.fidelity_windows)
            met += inside > 0
            worst = max(worst, s1 - s0 - min(inside, s1 - s0))
    return round(worst, 6), met


def baseline_mbps(d: RunData, host: str | None = None, warmup_s: float = 1.0) -> float:
    """Mean goodput (Mb/s) over :func:`baseline_window` (of ``host``'s flows if given), outside the
    run's fidelity faults (:func:`kept_mean`)."""
    return kept_mean(d, d.goodput_mbps(host), *baseline_window(d, warmup_s))


def recovery_time_s(d: RunData, after: float, fraction: float = 0.9, host: str | None = None) -> float:
    """Seconds from ``after`` until the 0.5 s moving mean of goodput is back above ``fraction`` x
    the baseline (0 if it never fell; inf if it never came back)."""
    g = d.goodput_mbps(host)
    base = baseline_mbps(d, host)
    k = int(round(0.5 / BIN_S))
    start = int(round(after / BIN_S))
    for i in range(start, len(g) - k + 1):
        if _mean(g[i : i + k]) >= fraction * base:
            return max(0.0, i * BIN_S - after)
    return math.inf


def retransmit_fraction(totals: dict[str, dict]) -> float:
    """Retransmitted data packets over data packets sent, summed over ``totals`` (QP -> the
    endpoint's per-QP totals, as in metrics.json); 0.0 when nothing was sent."""
    sent = sum(t.get("data_packets", 0) for t in totals.values())
    rtx = sum(t.get("retransmits", 0) for t in totals.values())
    return rtx / sent if sent else 0.0


def retired(d: RunData, after: float, within_s: float) -> list[dict]:
    """EV state changes to ASSUMED_BAD in [after, after + within_s] (s)."""
    return [e for e in d.events if e.get("kind") == "ev_state" and e.get("new") == "ASSUMED_BAD"
            and after <= e["t"] <= after + within_s]


#: A retirement at t answers losses in [t - RETIRE_CAUSE_S, t] (s) when its event does not say when
#: the packet it answers was sent (endpoints before the ``age_s`` of ``ev_state`` events): a
#: retransmission timeout is at most the timer's ceiling, ``max_rto_s`` (1 s, traffic/settings.py).
RETIRE_CAUSE_S = 1.0


def retire_cause_s(e: dict) -> float:
    """The span before a retirement event ``e`` (an ``ev_state`` event dict) that it answers (s):
    from when the packet whose loss or timeout retired the EV was sent (its ``age_s``), or
    :data:`RETIRE_CAUSE_S` where the event does not say. A fidelity fault outside that span cannot
    have lost or held the packet: the retirement is the transport's."""
    age = e.get("age_s")
    return float(age) if age not in (None, "") else RETIRE_CAUSE_S


def describe_retirements(events: list[dict], shown: int = 3, d: RunData | None = None) -> str:
    """What a count of retirements (``ev_state`` event dicts: ``t``, ``host``, ``ev``, ``reason``)
    was made of, in one line: per cause (the reason's words before a PSN), how many, when (s) and
    on which planes, the commonest first, ``shown`` at most; "" for none. A FAILed count reads,
    say, ``9 by retransmission timeout at 8.02-8.41 s on planes 1, 2``. Given the run ``d``, it
    adds the frames the endpoints' sockets dropped in the :data:`RETIRE_CAUSE_S` before them, a
    loss no switch counts, where there were any."""
    by: dict[str, list[dict]] = {}
    for e in events:
        cause = str(e.get("reason", "?")).split(" of PSN")[0]
        by.setdefault(cause, []).append(e)
    parts = []
    for cause, es in sorted(by.items(), key=lambda kv: -len(kv[1]))[:shown]:
        ts = [e["t"] for e in es]
        planes = sorted({ev_plane(e["ev"]) for e in es if "ev" in e})
        when = f"{min(ts):.2f} s" if min(ts) == max(ts) else f"{min(ts):.2f}-{max(ts):.2f} s"
        parts.append(f"{len(es)} by {cause} at {when} on plane{'s' if len(planes) != 1 else ''} "
                     + ", ".join(map(str, planes)))
    if d is not None and events:
        ts = [e["t"] for e in events]
        lost = d.socket_drops_between(min(ts) - RETIRE_CAUSE_S, max(ts))
        if lost:
            parts.append(f"endpoint sockets dropped {lost} frames (full receive buffers, port errors at send) "
                         f"in the {RETIRE_CAUSE_S:g} s before")
    return "; ".join(parts)


def in_fidelity_fault(d: RunData, t: float, before_s: float = 0.0) -> bool:
    """Whether [t - before_s, t] (s) meets one of the run's fidelity faults (``fidelity_windows``)."""
    return any(f0 <= t and f1 >= t - before_s for f0, f1 in d.fidelity_windows)


def in_retire_fault(d: RunData, t: float, before_s: float = 0.0) -> bool:
    """Whether [t - before_s, t] (s) meets one of the run's fidelity faults that could have lost a
    packet or held one past its timer (``retire_windows``; every fault's where the run does not
    say): a retirement there may be the machine's."""
    spans = d.fidelity_windows if d.retire_windows is None else d.retire_windows
    return any(f0 <= t and f1 >= t - before_s for f0, f1 in spans)
