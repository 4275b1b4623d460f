"""Verdicts that judge a run against what its faults left of the fabric (experiments/analysis/fabricstate.py):
an EV retired while its path was whole, an EV through a repaired element still retired, the time an
EV through a failed element took to be retired, goodput against the capacity the faults left.

Each function takes the run's :class:`~experiments.analysis.metrics.RunData` (its events and its
``timeline``) and returns one number; the metric registry (experiments/analysis/expectations.py) names them.
"""

from __future__ import annotations

import math

from mrclab.experiments.analysis.fabricstate import FabricTimeline
from mrclab.experiments.analysis.metrics import (
    RETIRE_CAUSE_S,
    RunData,
    baseline_window,
    in_retire_fault,
    kept_mean,
    retire_cause_s,
    kept_spans,
)
from mrclab.topologies.addressing import Path

#: A retirement answers a loss that may have happened up to this long before it (a retransmission
#: timeout is at most max_rto_s, 1 s, and is usually a few RTTs): a path failed in [t - grace, t]
#: explains a retirement at t.
RETIRE_GRACE_S = RETIRE_CAUSE_S
#: A repair and a failure are matched to an expectation's ``after`` within this much.
MATCH_S = 0.5
def _ev_changes(d: RunData) -> dict[tuple, list[tuple[float, str]]]:
    """(host, peer, qp, ev) -> [(t, new state)] in time order."""
    out: dict[tuple, list[tuple[float, str]]] = {}
    for e in d.events:
        if e.get("kind") == "ev_state":
            out.setdefault((e["host"], e["peer"], e["qp"], e["ev"]), []).append((e["t"], str(e["new"])))
    return out


def _timeline(d: RunData) -> FabricTimeline:
    """The run's fault timeline; ValueError for run data made without one (a bug of the caller)."""
    if d.timeline is None:
        raise ValueError("run data without a fault timeline: verdicts judge a run against its faults")
    return d.timeline


def _path(d: RunData, host: str, peer: str, ev: int) -> Path:
    return _timeline(d).plan.path_for_ev(host, peer, ev)


def false_retirements(d: RunData) -> tuple[float, int]:
    """(EVs retired (ASSUMED_BAD) while their path crossed no failed element in the last
    :data:`RETIRE_GRACE_S`: healthy paths taken for broken ones; how many such retirements were left
    out because a fidelity fault of the run met the span each answers (from when the packet that
    retired it was sent, :func:`~experiments.analysis.metrics.retire_cause_s`): the machine, not the
    transport, may have lost or held that packet)."""
    counted, left_out = false_retirement_events(d)
    return float(len(counted)), left_out


def false_retirement_events(d: RunData) -> tuple[list[dict], int]:
    """The state-change events of :func:`false_retirements`' count (each a runner's ``ev_state``
    event dict: ``t``, ``host``, ``ev``, ``reason``), and how many it left out in fidelity faults."""
    counted: list[dict] = []
    left_out = 0
    for e in d.events:
        if e.get("kind") != "ev_state" or e.get("new") != "ASSUMED_BAD":
            continue
        t = e["t"]
        if _timeline(d).path_failed(_path(d, e["host"], e["peer"], e["ev"]), t - RETIRE_GRACE_S, t):
            continue
        if in_retire_fault(d, t, retire_cause_s(e)):
            left_out += 1
        else:
            counted.append(e)
    return counted, left_out


def revival_s(d: RunData, after: float) -> float:
    """Seconds from the repair at ``after`` until every EV retired through a repaired element is
    GOOD again (the slowest); inf when one never is; 0 when no such EV was retired."""
    repaired = set(_timeline(d).repaired_at(after, MATCH_S))
    worst = 0.0
    for (host, peer, _qp, ev), changes in _ev_changes(d).items():
        state = next((s for t, s in reversed(changes) if t <= after), "GOOD")
        if state != "ASSUMED_BAD":
            continue
        if not repaired & set(_timeline(d).path_elements(_path(d, host, peer, ev))):
            continue
        back = next((t for t, s in changes if t > after and s == "GOOD"), None)
        worst = max(worst, math.inf if back is None else back - after)
    return worst


def revivals(d: RunData, lo: float, hi: float) -> list[tuple[float, float]]:
    """``[(repair time (s), its :func:`revival_s`)]`` for every repair in [lo, hi], in time order."""
    ends = sorted({b for ivs in _timeline(d).intervals.values() for _a, b in ivs if lo <= b <= hi})
    return [(b, revival_s(d, b)) for b in ends]


def slowest_revival(d: RunData, lo: float, hi: float) -> tuple[float, float | None]:
    """(the slowest :func:`revival_s` of every repair in [lo, hi] (s): a soak's "probes bring every
    EV back each time its link returns"; the first repair it was read from, None when [lo, hi]
    holds no repair, whose value is then 0.0)."""
    worst, at = 0.0, None
    for b, v in revivals(d, lo, hi):
        if at is None or v > worst:
            worst, at = v, b
    return worst, at


def late_revival(d: RunData, lo: float, hi: float, max_s: float) -> float | None:
    """The repair in [lo, hi] a revival later than ``max_s`` is judged at: the first whose
    [repair, repair + max_s] met no fidelity fault of the run (``d.fidelity_windows``), else the
    first late one; None when none is late. A machine's lapse can hold one revival past its bound,
    not one it never met: with probes off, every return of every flapping link reads inf."""
    late = [b for b, v in revivals(d, lo, hi) if v > max_s]
    clear = [b for b in late if not any(a <= b + max_s and z >= b for a, z in d.fidelity_windows)]
    return (clear or late)[0] if late else None


def retire_time_rtts(d: RunData, after: float) -> float:
    """For every EV retired whose path crosses an element that failed at ``after``: the time from
    the first packet lost on it (sent, that is: the loss events say how long before they were
    found each packet had left) to its retirement, in smoothed RTTs; the slowest (inf if none was
    retired). A lost packet counts if it was sent after the failure and before the retirement,
    whenever its loss was found: a resent packet's loss is found only after its backoff, after
    the EV it was resent on has been retired for it (traffic/sender.py, ``_check_paths``); with
    no such loss, from the failure."""
    failed = set(_timeline(d).failed_at(after, MATCH_S))
    lost: dict[tuple, list[tuple[float, float]]] = {}  # EV -> [(found at, sent at)]
    for e in d.events:
        if e.get("kind") == "loss":
            lost.setdefault((e["host"], e["peer"], e["qp"], e["ev"]), []).append((e["t"], e["t"] - e.get("age_s", 0)))
    times = []
    for key, changes in _ev_changes(d).items():
        host, peer, _qp, ev = key
        if not failed & set(_timeline(d).path_elements(_path(d, host, peer, ev))):
            continue
        t = next((t for t, s in changes if t >= after and s == "ASSUMED_BAD"), None)
        if t is None:
            continue
        sent = [s for _found, s in lost.get(key, []) if after - MATCH_S <= s <= t]
        times.append(t - (min(sent) if sent else after))
    if not times or not d.rtt_us:
        return math.inf
    return max(times) * 1e6 / d.rtt_us


def capacity_ratio(d: RunData, lo: float, hi: float, host: str | None = None) -> float:
    """Goodput in [lo, hi] as a share of the capacity the faults left there, relative to the same
    share before the first fault: 1.0 means the transport used all that was left as well as it used
    the whole fabric (paper: goodput steps down by 1/P per NIC port, not at all for a T1 of two)."""
    flows = [f for f in d.flows if host is None or f[0] == host]
    g = d.goodput_mbps(host)
    b0, b1 = baseline_window(d)
    cap_base, cap = _kept_capacity(d, flows, b0, b1), _kept_capacity(d, flows, lo, hi)
    base = kept_mean(d, g, b0, b1)
    if not cap or not base or not cap_base:
        return 0.0
    return (kept_mean(d, g, lo, hi) / cap) / (base / cap_base)


def _kept_capacity(d: RunData, flows: list[tuple[str, str]], lo: float, hi: float) -> float:
    """The capacity the faults left (NIC ports, :meth:`FabricTimeline.capacity`) over the stretches
    of [lo, hi] outside the run's fidelity faults (:func:`kept_spans`), weighted by their length."""
    spans = kept_spans(d, lo, hi)
    total = sum(b - a for a, b in spans)
    return sum(_timeline(d).capacity(flows, a, b) * (b - a) for a, b in spans) / total if total > 0 else 0.0
