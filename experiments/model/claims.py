"""What a scenario may claim: every metric an expectation can bound, with its arguments, unit and
meaning, in one table (:data:`CLAIMS`). This is the scenario's model of its own claims, read before
anything runs: the scenario loader checks each expectation against it (:func:`check_expectation`),
``mrclab run --help`` prints it (:func:`metric_help`) and docs/design.md's metric list is its text
(:func:`metric_table`; a test holds the two together). How each value is computed from a run is
the analysis' (experiments/analysis/expectations.py, ``VALUES``, one entry per claim: a test holds
the two tables to the same names). Adding a metric is a row here and a value there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
class Claim:
    """One metric a scenario may bound: its name, unit, a one-line doc, and its required and optional
    argument names (each in :data:`ARGS`)."""

    name: str
    unit: str
    doc: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = field(default=("min", "max"))


_BOUND = ("min", "max")

#: Every metric a scenario may bound, by name, in the order docs and help list them.
CLAIMS: dict[str, Claim] = {c.name: c for c in (
    Claim("goodput_ratio", "ratio",
          "mean goodput in window over the baseline (the mean before the first fault, or over baseline=[a, b])",
          ("window",), (*_BOUND, "host", "baseline")),
    Claim("goodput_mbps", "Mb/s", "mean goodput in window", ("window",), (*_BOUND, "host")),
    Claim("goodput_ports", "NIC ports",
          "mean goodput in window in units of one NIC port's rate",
          ("window",), (*_BOUND, "host")),
    Claim("mct_s", "s",
          "message completion time (first packet sent to last acknowledged) at a percentile",
          ("percentile",), (*_BOUND, "host")),
    Claim("ev_share", "ratio",
          "share of host's data packets in window sent on EVs of that plane (and T1)",
          ("host", "plane", "window"), ("t1", *_BOUND)),
    Claim("port_total", "packets",
          "switch ports' marked | trimmed | queue_full packets (or PFC pauses) over the run (of one switch if "
          "given)",
          ("counter",), (*_BOUND, "switch")),
    Claim("worst_qp_ratio", "ratio",
          "the slowest QP's goodput in window over the mean QP's (0 when a QP stalls)",
          ("window",)),
    Claim("longest_stall_s", "s",
          "the longest time a QP delivered nothing between two moments it did (in window, or the run)",
          (), ("window", *_BOUND)),
    Claim("rss_growth", "ratio",
          "the endpoints' resident memory at the end over at after, the largest of any host (1.0 is flat), "
          "their receive regions' pages apart",
          ("after",), _BOUND),
    Claim("recovery_time_s", "s",
          "from after until the 0.5 s moving mean of goodput is back above fraction x baseline",
          ("after",), ("fraction", "max", "host")),
    Claim("retransmit_fraction", "ratio", "retransmitted data packets over data packets sent", (), ("max", "min")),
    Claim("messages_intact", "messages",
          "every message that completed arrived byte-identical (and at least one did)",
          (), ("equals",)),
    Claim("evs_retired", "EVs",
          "EVs that went ASSUMED_BAD in [after, after + within_s] (over the run with neither)",
          (), ("after", "within_s", *_BOUND)),
    Claim("retire_time_rtts", "RTTs",
          "smoothed RTTs from the first packet lost through an element failed at after to its EV's retirement; "
          "the slowest",
          (), ("after", "max")),
    Claim("false_retirements", "EVs",
          "EVs retired while their path crossed no failed element in the last second",
          (), ("max",)),
    Claim("false_retirements_per_100_flaps", "EVs per 100 flaps",
          "false_retirements per 100 failures played (each flap's down, a link, port or switch down, a blackhole)",
          (), ("max",)),
    Claim("revival_s", "s",
          "from the repair at after until every EV retired through a repaired element is GOOD again",
          ("after",), ("max",)),
    Claim("slowest_revival_s", "s",
          "revival_s of every repair in window (a soak's flaps); the slowest",
          ("window",), ("max",)),
    Claim("capacity_ratio", "ratio",
          "goodput in window as a share of the capacity the faults left, over that share before the first fault",
          ("window",), (*_BOUND, "host")),
    Claim("busbw_mbps", "Mb/s", "the collective's bus bandwidth (nccl-tests)"),
    Claim("iteration_s", "s", "the collective's iteration time at a percentile", ("percentile",)),
    Claim("iterations", "iterations", "the collective's completed iterations"),
    Claim("collective_correct", "-", "every host's buffer as the collective defines it, every iteration", (), ()),
)}


def check_expectation(metric: Any, args: dict, ctx: ArgContext) -> list[str]:
    """Every problem of one expectation (an unknown metric, missing or unknown arguments, values
    not allowed), each as ``field ...; allowed: ...`` text without the location; [] when fine."""
    if metric not in CLAIMS:
        return [f"metric = {metric!r}; allowed: {', '.join(CLAIMS)}"]
    m = CLAIMS[metric]
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


#: Correctness: a corrupt or missing message FAILs whatever the machine did, so these are never void.
NEVER_VOID = frozenset({"messages_intact", "collective_correct"})
#: Run-long counts: what happened inside a fidelity fault is left out of them (and counted), instead
#: of the whole run's verdict being void for one starved sample. A switch counter's total
#: (``port_total``) leaves out what its ports counted in the sample intervals a fault met: incast on
#: bmv2 at half rate read 3980 trims against its bound of at least 1, void for a starved 0.25 s.
LEAVES_OUT = frozenset({"false_retirements", "false_retirements_per_100_flaps", "evs_retired", "longest_stall_s",
                        "port_total"})
#: The run-long counts of retirements: they leave out only what a fault that could have lost a packet,
#: or held one past its timer, met (experiments/analysis/fidelity.py ``FidelityFault.retires``)
RETIREMENTS = frozenset({"false_retirements", "false_retirements_per_100_flaps", "evs_retired"})
#: What a lapse of the machine can only raise: it slows a recovery, a retirement and a revival, and
#: swells an endpoint (a backlog), never the reverse. Bounded above, one within its bound passes
#: whatever the machine did (unless a lapse met what it is compared with); one past it is void where
#: a lapse met the time it ran past its bound in (experiments/analysis/expectations.py ``read_windows``).
RAISED_ONLY = frozenset({"rss_growth", "recovery_time_s", "retire_time_rtts", "revival_s", "slowest_revival_s"})
#: Windowed means: read over their window less each fidelity fault and the second after it
#: (experiments/analysis/metrics.py ``kept_spans``), saying how long they left out; void only where
#: the faults held more than half of a window they read (``KEPT_MIN``). A collective's busbw reads the
#: iterations outside them, void where they held more than half of its time
#: (experiments/analysis/collectives.py ``kept_iterations``).
MEANS = frozenset({"goodput_ratio", "goodput_mbps", "goodput_ports", "capacity_ratio", "worst_qp_ratio",
                   "busbw_mbps"})


def metric_help() -> str:
    """The registry as plain text, one metric a line: ``name(args) [unit]: doc``."""
    lines = []
    for m in CLAIMS.values():
        args = ", ".join([*m.required, *(f"[{o}]" for o in m.optional)])
        lines.append(f"  {m.name}({args}) [{m.unit}]: {m.doc}")
    return "\n".join(lines)


def metric_table() -> str:
    """The registry as a Markdown table (the metric list in docs/design.md is this text)."""
    rows = ["| metric | arguments | unit | what it is |", "| --- | --- | --- | --- |"]
    for m in CLAIMS.values():
        args = ", ".join([*m.required, *(f"[{o}]" for o in m.optional)])
        rows.append(f"| `{m.name}` | {args} | {m.unit} | {m.doc} |")
    return "\n".join(rows)
