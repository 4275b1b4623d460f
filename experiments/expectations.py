"""The metric registry: every metric a scenario's expectation can bound, in one table.

Each :class:`Metric` row names its arguments (required and optional, each an :class:`Arg` with its
allowed values), the function that computes its value from a run, its unit and a one-line doc.
The scenario validator (:func:`check_expectation`), the dispatcher (:func:`evaluate`), the command
line's ``mrclab run --help`` (:func:`metric_help`) and the metric list in docs/design.md all read
this table, and a test holds the docs to it: adding a metric is one row here and, if its value is a
new concept, one function where that concept lives (goodput, completion times and EV counts in
:mod:`mrclab.experiments.metrics`, what the faults left of the fabric in
:mod:`mrclab.experiments.verdicts`, a collective's figures in :mod:`mrclab.experiments.collectives`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrclab.experiments import collectives, fidelity, verdicts
from mrclab.experiments.metrics import (
    RETIRE_CAUSE_S,
    RunData,
    baseline_mbps,
    baseline_window,
    ev_share,
    in_fidelity_fault,
    recovery_time_s,
    retired,
    rss_growth,
    retransmit_fraction,
    stalls,
    window_mean,
    worst_qp_ratio,
)
from mrclab.topologies.spec import ClosSpec


@dataclass(frozen=True)
class ArgContext:
    """What an argument is checked against: the scenario's duration (s) and fabric."""

    duration_s: float
    spec: ClosSpec


@dataclass(frozen=True)
class Arg:
    """One argument of a metric: ``ok(value, context)`` says whether a value is allowed and
    ``allowed(context)`` says, in words, what is."""

    name: str
    ok: Callable[[Any, ArgContext], bool]
    allowed: Callable[[ArgContext], str]


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _window(v: Any, c: ArgContext) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v) and 0 <= v[0] < v[1] <= c.duration_s


PERCENTILES = (50, 90, 99, 99.9)
#: the switch port counters (controller/queues.py; pauses: PFC pauses received, lossless ports only)
COUNTERS = ("marked", "trimmed", "queue_full", "pauses")

#: Every argument a metric may take, checked the same way whichever metric takes it.
ARGS: dict[str, Arg] = {a.name: a for a in (
    Arg("window", _window, lambda c: f"[start, end] within 0..duration_s ({c.duration_s:g})"),
    Arg("baseline", _window, lambda c: f"[start, end] within 0..duration_s ({c.duration_s:g})"),
    Arg("after", lambda v, c: _number(v) and 0 <= v <= c.duration_s,
        lambda c: f"a time within 0..duration_s ({c.duration_s:g})"),
    Arg("within_s", lambda v, c: _number(v) and v > 0, lambda c: "a number of seconds > 0"),
    Arg("host", lambda v, c: v in c.spec.hosts(), lambda c: f"a host ({', '.join(c.spec.hosts())})"),
    Arg("switch", lambda v, c: v in c.spec.switches(), lambda c: "a switch of the fabric (mrclab up lists them)"),
    Arg("plane", lambda v, c: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < c.spec.planes,
        lambda c: f"0..{c.spec.planes - 1}"),
    Arg("t1", lambda v, c: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < c.spec.t1_per_plane,
        lambda c: f"0..{c.spec.t1_per_plane - 1}"),
    Arg("percentile", lambda v, c: v in PERCENTILES, lambda c: ", ".join(f"{p:g}" for p in PERCENTILES)),
    Arg("counter", lambda v, c: v in COUNTERS, lambda c: ", ".join(COUNTERS)),
    Arg("fraction", lambda v, c: _number(v) and 0 < v <= 1, lambda c: "a number in (0, 1]"),
    Arg("min", lambda v, c: _number(v), lambda c: "a number"),
    Arg("max", lambda v, c: _number(v), lambda c: "a number"),
    Arg("equals", lambda v, c: v == "all", lambda c: "all"),
)}

@dataclass(frozen=True)
class Counted:
    """A run-long count that left out what happened inside the run's fidelity faults: ``value``,
    ``whole`` (the count with nothing left out), and how many ``left_out`` of ``what``
    (``"retirements"``, ``"stalls shortened"``)."""

    value: float
    whole: float
    left_out: int
    what: str


#: A metric's value: the run and the expectation's arguments -> a number, a :class:`Counted`, or
#: (number, passed, bound text) for a metric that judges itself rather than being bounded by min / max.
Value = Callable[[RunData, dict], "float | Counted | tuple[float, bool, str]"]


@dataclass(frozen=True)
class Metric:
    """One row of the registry: name, required and optional argument names (each in :data:`ARGS`),
    the function computing its value, its unit and a one-line doc."""

    name: str
    value: Value
    unit: str
    doc: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = field(default=("min", "max"))


def _goodput_ratio(d: RunData, a: dict) -> float:
    g = d.goodput_mbps(a.get("host"))
    base = window_mean(g, *a["baseline"]) if "baseline" in a else baseline_mbps(d, a.get("host"))
    return window_mean(g, *a["window"]) / base if base > 0 else 0.0


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
    kept = [e for e in seen if not in_fidelity_fault(d, e["t"], RETIRE_CAUSE_S)]
    evs = {(e.get("host"), e.get("qp"), e.get("ev")) for e in kept}
    every = {(e.get("host"), e.get("qp"), e.get("ev")) for e in seen}
    return Counted(float(len(evs)), float(len(every)), len(every - evs), "retired EVs")


def _false_retirements(d: RunData, a: dict) -> Counted:
    n, left = verdicts.false_retirements(d)
    return Counted(n, n + left, left, "retirements")


def _longest_stall(d: RunData, a: dict) -> Counted:
    lo_hi = a["window"] if "window" in a else ()
    worst, met = stalls(d, *lo_hi)
    whole, _ = stalls(dataclasses.replace(d, fidelity_windows=[]), *lo_hi)
    return Counted(worst, whole, met, "stalls shortened")


def _after(d: RunData, a: dict) -> float:
    return a.get("after", d.first_fault_s or 0.0)


def _collective(name: str) -> Value:
    def value(d: RunData, a: dict) -> float:
        return collectives.evaluate(d, d.collective, name, a)  # type: ignore[arg-type]
    return value


def _collective_correct(d: RunData, a: dict) -> tuple[float, bool, str]:
    v = collectives.evaluate(d, d.collective, "collective_correct", a)  # type: ignore[arg-type]
    return v, v == 1.0, "every host's buffer as the collective defines it, every iteration"


_BOUND = ("min", "max")

#: The registry: metric name -> :class:`Metric`.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("goodput_ratio", _goodput_ratio, "ratio",
           "mean goodput in window over the baseline (the mean before the first fault, or over baseline=[a, b])",
           ("window",), (*_BOUND, "host", "baseline")),
    Metric("goodput_mbps", lambda d, a: window_mean(d.goodput_mbps(a.get("host")), *a["window"]), "Mb/s",
           "mean goodput in window", ("window",), (*_BOUND, "host")),
    Metric("goodput_ports",
           lambda d, a: window_mean(d.goodput_mbps(a.get("host")), *a["window"]) / d.port_mbps
           if d.port_mbps else math.inf, "NIC ports",
           "mean goodput in window in units of one NIC port's rate", ("window",), (*_BOUND, "host")),
    Metric("mct_s", lambda d, a: d.mct_percentiles(a.get("host")).get(f"p{a['percentile']:g}", math.inf), "s",
           "message completion time (first packet sent to last acknowledged) at a percentile",
           ("percentile",), (*_BOUND, "host")),
    Metric("ev_share", lambda d, a: ev_share(d, a["host"], a["plane"], a.get("t1"), *a["window"]), "ratio",
           "share of host's data packets in window sent on EVs of that plane (and T1)",
           ("host", "plane", "window"), ("t1", *_BOUND)),
    Metric("port_total", lambda d, a: float(d.port_totals(a.get("switch")).get(a["counter"], 0)), "packets",
           "switch ports' marked | trimmed | queue_full packets (or PFC pauses) over the run (of one switch if given)",
           ("counter",), (*_BOUND, "switch")),
    Metric("worst_qp_ratio", lambda d, a: worst_qp_ratio(d, *a["window"]), "ratio",
           "the slowest QP's goodput in window over the mean QP's (0 when a QP stalls)", ("window",)),
    Metric("longest_stall_s", _longest_stall, "s",
           "the longest time a QP delivered nothing between two moments it did (in window, or the run)",
           (), ("window", *_BOUND)),
    Metric("rss_growth", lambda d, a: rss_growth(d, a["after"]), "ratio",
           "the endpoints' resident memory at the end over at after, the largest of any host (1.0 is flat)",
           ("after",), _BOUND),
    Metric("recovery_time_s", lambda d, a: recovery_time_s(d, a["after"], a.get("fraction", 0.9), a.get("host")),
           "s", "from after until the 0.5 s moving mean of goodput is back above fraction x baseline",
           ("after",), ("fraction", "max", "host")),
    Metric("retransmit_fraction", _retransmit_fraction, "ratio",
           "retransmitted data packets over data packets sent", (), ("max", "min")),
    Metric("messages_intact", _messages_intact, "messages",
           "every message that completed arrived byte-identical (and at least one did)", (), ("equals",)),
    Metric("evs_retired", _evs_retired, "EVs",
           "EVs that went ASSUMED_BAD in [after, after + within_s] (over the run with neither)",
           (), ("after", "within_s", *_BOUND)),
    Metric("retire_time_rtts", lambda d, a: verdicts.retire_time_rtts(d, _after(d, a)), "RTTs",
           "smoothed RTTs from the first packet lost through an element failed at after to its EV's retirement; the slowest", (), ("after", "max")),
    Metric("false_retirements", _false_retirements, "EVs",
           "EVs retired while their path crossed no failed element in the last second", (), ("max",)),
    Metric("revival_s", lambda d, a: verdicts.revival_s(d, a["after"]), "s",
           "from the repair at after until every EV retired through a repaired element is GOOD again", ("after",), ("max",)),
    Metric("capacity_ratio", lambda d, a: verdicts.capacity_ratio(d, a["window"][0], a["window"][1], a.get("host")), "ratio",
           "goodput in window as a share of the capacity the faults left, over that share before the first fault", ("window",), (*_BOUND, "host")),
    Metric("busbw_mbps", _collective("busbw_mbps"), "Mb/s", "the collective's bus bandwidth (nccl-tests)"),
    Metric("iteration_s", _collective("iteration_s"), "s", "the collective's iteration time at a percentile",
           ("percentile",)),
    Metric("iterations", _collective("iterations"), "iterations", "the collective's completed iterations"),
    Metric("collective_correct", _collective_correct, "-",
           "every host's buffer as the collective defines it, every iteration", (), ()),
)}


def check_expectation(metric: Any, args: dict, ctx: ArgContext) -> list[str]:
    """Every problem of one expectation (an unknown metric, missing or unknown arguments, values
    not allowed), each as ``field ...; allowed: ...`` text without the location; [] when fine."""
    if metric not in METRICS:
        return [f"metric = {metric!r}; allowed: {', '.join(METRICS)}"]
    m = METRICS[metric]
    missing = sorted(set(m.required) - set(args))
    bad = sorted(set(args) - set(m.required) - set(m.optional))
    out = []
    if missing or bad:
        out.append(f"({metric}): missing {missing or 'nothing'}, unknown {bad or 'nothing'}; "
                   f"allowed: {', '.join(sorted({*m.required, *m.optional}))}")
    for k, v in args.items():
        if k in ARGS and k not in bad and not ARGS[k].ok(v, ctx):
            out.append(f".{k} = {v!r}; allowed: {ARGS[k].allowed(ctx)}")
    return out


#: Metrics judged against the goodput before the first fault when no ``baseline`` window is given.
_READS_BASELINE = ("goodput_ratio", "recovery_time_s", "capacity_ratio")


def windows(d: RunData, metric: str, args: dict) -> list[tuple[float, float]]:
    """The stretches of the run (s from t = 0) an expectation's value is read from: its
    ``window`` and ``baseline``; the baseline before the first fault where the metric compares
    against it; [after, after + within_s] (or to the end) for ``after``; the whole run otherwise.
    A fidelity fault inside any of them voids the verdict (experiments/fidelity.py)."""
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
    a metric not in :data:`METRICS` (the scenario loader refuses those before a run)."""
    v, ok, bound, _ = _evaluate(d, metric, args)
    return v, ok, bound


def _evaluate(d: RunData, metric: str, args: dict) -> tuple[float, bool | None, str, Counted | None]:
    got = METRICS[metric].value(d, args)
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


#: Correctness: a corrupt or missing message FAILs whatever the machine did, so these are never void.
NEVER_VOID = frozenset({"messages_intact", "collective_correct"})
#: Run-long counts: what happened inside a fidelity fault is left out of them (and counted), instead
#: of the whole run's verdict being void for one starved sample.
LEAVES_OUT = frozenset({"false_retirements", "evs_retired", "longest_stall_s"})


def judge(d: RunData, metric: str, args: dict, found: list) -> dict:
    """One expectation's verdict in a run whose fidelity faults are ``found``
    (experiments/fidelity.py :class:`FidelityFault`; ``d.fidelity_windows`` their spans):
    ``{value (None: infinite), bound, passed (True, False, or None: reported or void), void (the
    reason, or None), left_out (events the count left out inside faults, and whole: the count with
    them; both absent where it left none out)}``.

    Void only where the machine could have changed the verdict: a windowed verdict whose window
    (:func:`windows`) a fault meets. Never void: correctness (:data:`NEVER_VOID`), and a figure that
    is only reported. The run-long counts (:data:`LEAVES_OUT`) are judged on what they count outside
    the faults: a count over its ``max`` FAILs whatever the faults held (more than it counts is
    more still), and one within its bounds passes; void only where the count outside the faults is
    under its ``min`` and the whole count is not (what met the bound happened inside a fault)."""
    v, ok, bound, counted = _evaluate(d, metric, args)
    if counted is not None and ok is False and _within(counted.whole, args.get("min"), args.get("max")):
        # the faults that reach what it left out: up to RETIRE_CAUSE_S before its window
        broke = fidelity.overlapping([(lo - RETIRE_CAUSE_S, hi) for lo, hi in windows(d, metric, args)], found)
    elif metric in NEVER_VOID or metric in LEAVES_OUT or ok is None:
        broke = []
    else:
        broke = fidelity.overlapping(windows(d, metric, args), found)
    out = {"value": None if math.isinf(v) else v, "bound": bound, "passed": None if broke else ok,
           "void": fidelity.void_reason(broke)}
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


def metric_help() -> str:
    """The registry as plain text, one metric a line: ``name(args) [unit]: doc``."""
    lines = []
    for m in METRICS.values():
        args = ", ".join([*m.required, *(f"[{o}]" for o in m.optional)])
        lines.append(f"  {m.name}({args}) [{m.unit}]: {m.doc}")
    return "\n".join(lines)


def metric_table() -> str:
    """The registry as a Markdown table (the metric list in docs/design.md is this text)."""
    rows = ["| metric | arguments | unit | what it is |", "| --- | --- | --- | --- |"]
    for m in METRICS.values():
        args = ", ".join([*m.required, *(f"[{o}]" for o in m.optional)])
        rows.append(f"| `{m.name}` | {args} | {m.unit} | {m.doc} |")
    return "\n".join(rows)
