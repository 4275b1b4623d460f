"""An expectation's value and verdict: one metric of a run (experiments/metrics.py for the
definitions), bounded by the scenario's ``min`` / ``max``. The metrics live where their concept
does: goodput, completion times and EV counts in :mod:`experiments.metrics`, what the faults left
of the fabric in :mod:`experiments.verdicts`, a collective's figures in
:mod:`experiments.collectives`; this module only dispatches, so none of them imports another's
caller.
"""

from __future__ import annotations

import math

from mrclab.experiments import collectives, verdicts
from mrclab.experiments.metrics import (
    RunData,
    baseline_mbps,
    ev_share,
    recovery_time_s,
    retired,
    window_mean,
    worst_qp_ratio,
)


def evaluate(d: RunData, metric: str, args: dict) -> tuple[float, bool | None, str]:
    """(value, passed or None when unbounded, bound text) of one expectation."""
    host = args.get("host")
    if metric == "goodput_ratio":
        g = d.goodput_mbps(host)
        base = window_mean(g, *args["baseline"]) if "baseline" in args else baseline_mbps(d, host)
        v = window_mean(g, *args["window"]) / base if base > 0 else 0.0
    elif metric == "goodput_ports":
        v = window_mean(d.goodput_mbps(host), *args["window"]) / d.port_mbps if d.port_mbps else math.inf
    elif metric == "mct_s":
        v = d.mct_percentiles(host).get(f"p{args['percentile']:g}", math.inf)
    elif metric == "ev_share":
        v = ev_share(d, host, args["plane"], args.get("t1"), *args["window"])
    elif metric == "port_total":
        v = float(d.port_totals(args.get("switch")).get(args["counter"], 0))
    elif metric == "worst_qp_ratio":
        v = worst_qp_ratio(d, *args["window"])
    elif metric == "goodput_mbps":
        v = window_mean(d.goodput_mbps(host), *args["window"])
    elif metric == "recovery_time_s":
        v = recovery_time_s(d, args["after"], args.get("fraction", 0.9), host)
    elif metric == "retransmit_fraction":
        sent = sum(t.get("data_packets", 0) for t in d.totals.values())
        rtx = sum(t.get("retransmits", 0) for t in d.totals.values())
        v = rtx / sent if sent else 0.0
    elif metric == "messages_intact":
        done = sum(t.get("messages_delivered", 0) for t in d.totals.values())
        bad = sum(t.get("messages_corrupt", 0) for t in d.totals.values())
        v = float(done - bad)
        ok = bad == 0 and done > 0
        return v, ok, f"all intact ({done} delivered, {bad} corrupt)"
    elif metric == "evs_retired":
        after = args.get("after", d.first_fault_s or 0.0) if "after" in args or "within_s" in args else 0.0
        within = args.get("within_s", d.duration_s)
        v = float(len({(e.get("host"), e.get("qp"), e.get("ev")) for e in retired(d, after, within)}))
    elif metric in ("retire_time_rtts", "false_retirements", "revival_s", "capacity_ratio"):
        after = args.get("after", d.first_fault_s or 0.0)
        v = {"retire_time_rtts": lambda: verdicts.retire_time_rtts(d, after),
             "false_retirements": lambda: verdicts.false_retirements(d),
             "revival_s": lambda: verdicts.revival_s(d, after),
             "capacity_ratio": lambda: verdicts.capacity_ratio(d, *args.get("window", (0, 0)), host)}[metric]()
    elif metric in ("busbw_mbps", "iterations", "iteration_s", "collective_correct"):
        v = collectives.evaluate(d, d.collective, metric, args)  # type: ignore[arg-type]
        if metric == "collective_correct":
            return v, v == 1.0, "every host's buffer as the collective defines it, every iteration"
    else:  # validated by the scenario loader
        raise KeyError(metric)
    lo, hi = args.get("min"), args.get("max")
    if lo is None and hi is None:
        return v, None, "reported"
    ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    bound = " and ".join(x for x in [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""] if x)
    return v, ok, bound
