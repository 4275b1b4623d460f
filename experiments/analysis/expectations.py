"""An expectation's value and verdict from a run: each claim's value function (:data:`VALUES`, one
per metric of experiments/model/claims.py's ``CLAIMS``, in its order), the dispatcher (:func:`evaluate`)
and the judge (:func:`judge`: pass, FAIL or void, and what a run-long count left out). A value that
is a new concept gets its function where that concept lives (goodput, completion times and EV
counts in :mod:`mrclab.experiments.analysis.metrics`, what the faults left of the fabric in
:mod:`mrclab.experiments.analysis.verdicts`, a collective's figures in :mod:`mrclab.experiments.analysis.collectives`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from mrclab.experiments.analysis import collectives, fidelity, verdicts
from mrclab.experiments.analysis.metrics import (
    KEPT_MIN,
    RETIRE_CAUSE_S,
    SETTLE_S,
    RunData,
    baseline_mbps,
    baseline_window,
    describe_retirements,
    ev_share,
    in_retire_fault,
    kept_mean,
    kept_share,
    recovery_time_s,
    retire_cause_s,
    retired,
    retransmit_fraction,
    rss_growth,
    stalls,
    worst_qp_ratio,
)
from mrclab.experiments.model.claims import LEAVES_OUT, MEANS, NEVER_VOID, RAISED_ONLY, RETIREMENTS


@dataclass(frozen=True)
class Counted:
    """A run-long count that left out what happened inside the run's fidelity faults: ``value``,
    ``whole`` (the count with nothing left out), and how many ``left_out`` of ``what``
    (``"retirements"``, ``"stalls shortened"``)."""

    value: float
    whole: float
    left_out: int
    what: str
    #: what the value counted, in one line (a FAILed count names its evidence); "" when not told
    evidence: str = ""


#: A metric's value: the run and the expectation's arguments -> a number, a :class:`Counted`, or
#: (number, passed, bound text) for a metric that judges itself rather than being bounded by min / max.
Value = Callable[[RunData, dict], "float | Counted | tuple[float, bool, str]"]


def _goodput_ratio(d: RunData, a: dict) -> float:
    g = d.goodput_mbps(a.get("host"))
    base = kept_mean(d, g, *a["baseline"]) if "baseline" in a else baseline_mbps(d, a.get("host"))
    return kept_mean(d, g, *a["window"]) / base if base > 0 else 0.0


def _retransmit_fraction(d: RunData, a: dict) -> float:
    return retransmit_fraction(d.totals)


def _messages_intact(d: RunData, a: dict) -> tuple[float, bool, str]:
    done = sum(t.get("messages_delivered", 0) for t in d.totals.values())
    bad = sum(t.get("messages_corrupt", 0) for t in d.totals.values())
    return float(done - bad), bad == 0 and done > 0, f"all intact ({done} delivered, {bad} corrupt)"


def _evs_retired(d: RunData, a: dict) -> Counted:
    after = a.get("after", d.first_fault_s or 0.0) if "after" in a or "within_s" in a else 0.0
    within = a.get("within_s", d.duration_s)
    seen = retired(d, after, within)
    kept = [e for e in seen if not in_retire_fault(d, e["t"], retire_cause_s(e))]
    evs = {(e.get("host"), e.get("qp"), e.get("ev")) for e in kept}
    every = {(e.get("host"), e.get("qp"), e.get("ev")) for e in seen}
    return Counted(float(len(evs)), float(len(every)), len(every - evs), "retired EVs", describe_retirements(kept, d=d))


def _false_retirements(d: RunData, a: dict) -> Counted:
    counted, left = verdicts.false_retirement_events(d)
    n = float(len(counted))
    return Counted(n, n + left, left, "retirements", describe_retirements(counted, d=d))


def _false_retirements_per_100_flaps(d: RunData, a: dict) -> Counted:
    counted, left = verdicts.false_retirement_events(d)
    per = 100 / max(1, d.timeline.failures if d.timeline is not None else 0)
    return Counted(len(counted) * per, (len(counted) + left) * per, left, "retirements",
                   describe_retirements(counted, d=d))


def _longest_stall(d: RunData, a: dict) -> Counted:
    lo_hi = a["window"] if "window" in a else ()
    worst, met = stalls(d, *lo_hi)
    whole, _ = stalls(dataclasses.replace(d, fidelity_windows=[]), *lo_hi)
    return Counted(worst, whole, met, "stalls shortened")


def _port_total(d: RunData, a: dict) -> Counted:
    whole = d.port_totals(a.get("switch")).get(a["counter"], 0)
    left = min(whole, d.port_left_out(a["counter"], a.get("switch"))) if d.fidelity_windows else 0
    return Counted(float(whole - left), float(whole), left, f"{a['counter']} packets")


def _after(d: RunData, a: dict) -> float:
    return a.get("after", d.first_fault_s or 0.0)


def _collective(name: str) -> Value:
    def value(d: RunData, a: dict) -> float:
        return collectives.evaluate(d, d.collective, name, a)  # type: ignore[arg-type]
    return value


def _collective_correct(d: RunData, a: dict) -> tuple[float, bool, str]:
    v = collectives.evaluate(d, d.collective, "collective_correct", a)  # type: ignore[arg-type]
    return v, v == 1.0, "every host's buffer as the collective defines it, every iteration"


#: How each claim's value is computed from a run (experiments/model/claims.py, ``CLAIMS``, names the same
#: metrics in the same order; a test holds them together).
VALUES: dict[str, Value] = {
    "goodput_ratio": _goodput_ratio,
    "goodput_mbps": lambda d, a: kept_mean(d, d.goodput_mbps(a.get("host")), *a["window"]),
    "goodput_ports": lambda d, a: kept_mean(d, d.goodput_mbps(a.get("host")), *a["window"]) / d.port_mbps
           if d.port_mbps else math.inf,
    "mct_s": lambda d, a: d.mct_percentiles(a.get("host")).get(f"p{a['percentile']:g}", math.inf),
    "ev_share": lambda d, a: ev_share(d, a["host"], a["plane"], a.get("t1"), *a["window"]),
    "port_total": _port_total,
    "worst_qp_ratio": lambda d, a: worst_qp_ratio(d, *a["window"]),
    "longest_stall_s": _longest_stall,
    "rss_growth": lambda d, a: rss_growth(d, a["after"]),
    "recovery_time_s": lambda d, a: recovery_time_s(d, a["after"], a.get("fraction", 0.9), a.get("host")),
    "retransmit_fraction": _retransmit_fraction,
    "messages_intact": _messages_intact,
    "evs_retired": _evs_retired,
    "retire_time_rtts": lambda d, a: verdicts.retire_time_rtts(d, _after(d, a)),
    "false_retirements": _false_retirements,
    "false_retirements_per_100_flaps": _false_retirements_per_100_flaps,
    "revival_s": lambda d, a: verdicts.revival_s(d, a["after"]),
    "slowest_revival_s": lambda d, a: verdicts.slowest_revival(d, *a["window"])[0],
    "capacity_ratio": lambda d, a: verdicts.capacity_ratio(d, a["window"][0], a["window"][1], a.get("host")),
    "busbw_mbps": _collective("busbw_mbps"),
    "iteration_s": _collective("iteration_s"),
    "iterations": _collective("iterations"),
    "collective_correct": _collective_correct,
}


#: Metrics judged against the goodput before the first fault when no ``baseline`` window is given.
_READS_BASELINE = ("goodput_ratio", "recovery_time_s", "capacity_ratio")


#: Times bounded above, read from ``after``: (the seconds one unit of the metric is, the seconds past
#: its value the metric read to find it). A recovery is read from a 0.5 s moving mean
#: (:func:`~experiments.analysis.metrics.recovery_time_s`); a retirement time is in smoothed RTTs.
_TIMES: dict[str, Callable[[RunData], tuple[float, float]]] = {
    "recovery_time_s": lambda d: (1.0, 0.5),
    "revival_s": lambda d: (1.0, 0.0),
    "slowest_revival_s": lambda d: (1.0, 0.0),
    "retire_time_rtts": lambda d: ((d.rtt_us or 0.0) * 1e-6, 0.0),
}


def read_windows(d: RunData, metric: str, args: dict, ok: bool | None) -> list[tuple[float, float]]:
    """The stretches a fidelity fault must meet to void a verdict: :func:`windows`, but for what a
    lapse of the machine can only raise (:data:`~experiments.model.claims.RAISED_ONLY`: a lapse
    slows a recovery, a retirement or a revival, and swells an endpoint, never the reverse), bounded
    above: within its bound (``ok``) only what it is compared with (the reading memory grows from,
    the baseline a recovery is read against where the faults held more than half of it); past it,
    a time only from ``after`` to its bound (a lapse after that cannot have pushed it past)."""
    if metric not in RAISED_ONLY or args.get("max") is None:
        return windows(d, metric, args)
    after = float(args.get("after", d.first_fault_s or 0.0))
    if metric == "slowest_revival_s" and not ok:  # from a late repair, one no lapse met where there is one
        lo, hi = args["window"]
        late = verdicts.late_revival(d, lo, hi, float(args["max"]))
        after = after if late is None else late
    if metric not in _TIMES:  # memory: flat, the reading it grows from (a second either side); grown, all
        return [(after - SETTLE_S, after + SETTLE_S)] if ok else windows(d, metric, args)
    b = baseline_window(d)
    out = [b] if metric in _READS_BASELINE and "baseline" not in args and kept_share(d, *b) < KEPT_MIN else []
    if not ok:
        unit, extra = _TIMES[metric](d)
        out.append((after, after + float(args["max"]) * unit + extra))
    return out


def windows(d: RunData, metric: str, args: dict) -> list[tuple[float, float]]:
    """The stretches of the run (s from t = 0) an expectation's value is read from: its
    ``window`` and ``baseline``; the baseline before the first fault where the metric compares
    against it; [after, after + within_s] (or to the end) for ``after``; the whole run otherwise.
    A fidelity fault inside any of them voids the verdict (experiments/analysis/fidelity.py)."""
    out: list[tuple[float, float]] = []
    if "window" in args:
        out.append((float(args["window"][0]), float(args["window"][1])))
    if "baseline" in args:
        out.append((float(args["baseline"][0]), float(args["baseline"][1])))
    elif metric in _READS_BASELINE:
        out.append(baseline_window(d))
    if "after" in args or (metric == "evs_retired" and "within_s" in args):
        after = float(args.get("after", d.first_fault_s or 0.0))
        out.append((after, after + float(args["within_s"]) if "within_s" in args else d.duration_s))
    return out or [(0.0, d.duration_s)]


def evaluate(d: RunData, metric: str, args: dict) -> tuple[float, bool | None, str]:
    """(value, passed or None when unbounded, bound text) of one expectation. Raises KeyError for
    a metric not in :data:`VALUES` (the scenario loader refuses those before a run)."""
    v, ok, bound, _ = _evaluate(d, metric, args)
    return v, ok, bound


def _evaluate(d: RunData, metric: str, args: dict) -> tuple[float, bool | None, str, Counted | None]:
    got = VALUES[metric](d, args)
    if isinstance(got, tuple):
        return (*got, None)
    counted = got if isinstance(got, Counted) else None
    v = got.value if isinstance(got, Counted) else got
    lo, hi = args.get("min"), args.get("max")
    if lo is None and hi is None:
        return v, None, "reported", counted
    ok = _within(v, lo, hi)
    bound = " and ".join(x for x in [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""] if x)
    return v, ok, bound, counted


def _within(v: float, lo: float | None, hi: float | None) -> bool:
    return (lo is None or v >= lo) and (hi is None or v <= hi)


def judge(d: RunData, metric: str, args: dict, found: list) -> dict:
    """One expectation's verdict in a run whose fidelity faults are ``found``
    (experiments/analysis/fidelity.py :class:`FidelityFault`; ``d.fidelity_windows`` their spans):
    ``{value (None: infinite), bound, passed (True, False, or None: reported or void), void (the
    reason, or None), left_out (events the count left out inside faults, and whole: the count with
    them; both absent where it left none out), evidence (a FAILed count's events in one line: see
    :func:`~experiments.analysis.metrics.describe_retirements`; absent otherwise)}``.

    Void only where the machine could have changed the verdict: a windowed verdict whose window
    (:func:`windows`) a fault meets; a span the hypervisor took the CPU from (``fidelity.STOLEN``)
    only a rate (:data:`MEANS`, busbw), the verdicts ``mrclab`` has measured it move. Never void:
    correctness (:data:`NEVER_VOID`), and a figure that is only reported. The run-long counts
    (:data:`LEAVES_OUT`) are judged on what they count outside the faults: a count over its
    ``max`` FAILs whatever the faults held (more than it counts is more still), and one within its
    bounds passes; void only where the count outside the faults is under its ``min`` and the whole
    count is not (what met the bound happened inside a fault)."""
    if metric == "port_total" and not d.ports and d.ports_unread:
        # not a count of 0: no switch was ever read (the lab's reading failed, not the transport)
        return {"value": None, "bound": _evaluate(d, metric, args)[2], "passed": None,
                "void": f"switch counters never read ({d.ports_unread})"}
    v, ok, bound, counted = _evaluate(d, metric, args)
    if counted is not None and ok is False and _within(counted.whole, args.get("min"), args.get("max")):
        # the faults that reach what it left out: up to RETIRE_CAUSE_S before its window
        broke = fidelity.overlapping([(lo - RETIRE_CAUSE_S, hi) for lo, hi in windows(d, metric, args)],
                                     [f for f in found if f.retires or metric not in RETIREMENTS])
    elif metric in NEVER_VOID or metric in LEAVES_OUT or ok is None or (metric == "iterations" and ok):
        # (a lapse of the machine can only slow a collective: one that finished enough did)
        broke = []
    elif metric == "busbw_mbps":  # the iterations outside the faults: void where they held too many
        broke = found if collectives.kept_share(d, d.collective) < KEPT_MIN else []  # type: ignore[arg-type]
    elif metric in MEANS:  # read outside the faults: void only where they held too much of a window
        broke = fidelity.overlapping([w for w in windows(d, metric, args) if kept_share(d, *w) < KEPT_MIN], found)
    else:  # a steal span moved rates, where the measurement behind it looked, and nothing else yet
        broke = fidelity.overlapping(read_windows(d, metric, args, ok),
                                     [f for f in found if f.invariant != fidelity.STOLEN])
    out = {"value": None if math.isinf(v) else v, "bound": bound, "passed": None if broke else ok,
           "void": fidelity.void_reason(broke)}
    if metric == "busbw_mbps" and not broke and ok is not None and d.collective is not None:
        kept, rows = collectives.kept_iterations(d, d.collective)  # type: ignore[arg-type]
        if len(kept) < len(rows):
            out["left_out"] = f"{len(rows) - len(kept)} of {len(rows)} iterations in fidelity faults left out"
    elif metric in MEANS and not broke and ok is not None:
        held = sum((1 - kept_share(d, lo, hi)) * (hi - lo) for lo, hi in windows(d, metric, args))
        if held > 0:
            out["left_out"] = f"{held:.1f} s in fidelity faults left out"
    if counted is not None and ok is False and counted.evidence:
        out["evidence"] = counted.evidence  # what a FAILed count counted: its causes, times, planes
    if counted is not None and counted.left_out:
        out["left_out"] = f"{counted.left_out} {counted.what} in fidelity faults left out"
        out["whole"] = counted.whole  # the count with nothing left out
    return out


def verdict_word(passed: bool | None, *, rich: bool = False, void: str | None = None) -> str:
    """How a verdict reads: ``pass``, ``FAIL``, ``-`` for a reported (unbounded) figure, or
    ``void (<why>)`` when a fidelity fault overlapped its window (``void`` given); with ``rich``, in
    the terminal's colours (rich markup)."""
    if void:
        return f"[yellow]void ({void})[/yellow]" if rich else f"void ({void})"
    word = {True: "pass", False: "FAIL", None: "-"}[passed]
    if rich and passed is not None:
        return f"[{'green' if passed else 'red'}]{word}[/{'green' if passed else 'red'}]"
    return word
