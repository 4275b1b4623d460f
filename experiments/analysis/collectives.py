"""A collective's figures from a run, as nccl-tests reports them (nccl-tests doc/PERFORMANCE.md);
the scenario's ``collective:`` block itself is experiments/model/collective.py's.

Every host reports each iteration it finished (traffic/contract.py ``collective_iteration``: its
start and end on the wall clock and the CRC-32 of its buffer). An iteration of the collective
ends when its last host ends it; its time is that end minus the previous iteration's end (the
first: minus the earliest start), the pace a training step sees. Per iteration:

* ``algbw = S / t`` (S: ``message_bytes``, the buffer per host), in Mb/s here (nccl-tests prints
  GB/s; an emulated fabric runs a thousand times slower);
* ``busbw = algbw x 2(n-1)/n`` (all-reduce) or ``x (n-1)/n`` (all-gather, all-to-all): the
  bandwidth each link would carry, comparable across kinds and host counts.

Correctness: each host's CRC after each iteration against the buffer the collective defines for it
(traffic/collective.py ``expected_result``), so a run shows the transport delivered every byte
of every step, in the right place.

Expectation metrics: ``busbw_mbps`` (over the whole run: every finished iteration's bytes over
the time from the first start to the last end, or to the run's end when it finished fewer
iterations than asked (the unfinished one's time counts); in a run with fidelity faults, over the iterations
that met none, nor the second after one: :func:`kept_iterations`), ``iteration_s(percentile)``, ``iterations`` (how
many the collective finished),
``collective_correct`` (every host's every finished iteration; bound ``iterations`` too, for a
run that must finish some).
"""

from __future__ import annotations

import statistics
import zlib
from dataclasses import dataclass

from mrclab.experiments.analysis.metrics import SETTLE_S, RunData, kept_spans, percentile
from mrclab.traffic.collective import bus_factor, expected_result


@dataclass(frozen=True)
class CollectiveRun:
    """What the runner knows of a run's collective: its kind, ranks, bytes per host and seed."""

    kind: str
    hosts: tuple[str, ...]
    message_bytes: int
    seed: int
    qps_per_peer: int = 1
    #: the iterations the scenario asks for (0: not known; a run that finished fewer stalled or
    #: ran out of time, and the time after its last finished iteration counts: :func:`stalled_tail_s`)
    iterations: int = 0


def stalled_tail_s(d: RunData, c: CollectiveRun, rows: list[dict]) -> float:
    """The time (s) from the last finished iteration's end to the run's end when the collective
    finished fewer iterations than it was asked for (0 otherwise): time it spent on an iteration
    that never ended. nccl-tests times iterations that all finish; a run cut off by its timeline
    must count the unfinished one too, or a transport that stalls after its first iteration reads
    as fast as that iteration (fig. 17's RoCE 1 QP at 128 KiB on bmv2, 2026-12-04: one iteration
    in 0.70 s, then nothing for 6.3 s, read 1.30 Mb/s of busbw against MRC's 0.95)."""
    if not rows or not c.iterations or len(rows) >= c.iterations:
        return 0.0  # (none finished: busbw is 0 whatever the time)
    return max(0.0, d.duration_s - rows[-1]["end_s"])


def iterations(d: RunData, c: CollectiveRun) -> list[dict]:
    """One row per iteration every host finished: ``index``, ``end_s`` (from the timeline's
    start), ``time_s``, ``algbw_mbps``, ``busbw_mbps``, ``correct``."""
    by_index: dict[int, dict[str, dict]] = {}
    for e in d.events:
        if e.get("kind") == "collective_iteration":
            by_index.setdefault(e["index"], {})[e["host"]] = e
    rows, prev_end = [], None
    n = len(c.hosts)
    for k in sorted(by_index):
        got = by_index[k]
        if set(got) != set(c.hosts):
            break  # some host never finished it: the collective stalled here
        end = max(e["end_s"] for e in got.values())
        start = prev_end if prev_end is not None else min(e["start_s"] for e in got.values())
        t = max(end - start, 1e-9)
        algbw = c.message_bytes * 8 / t / 1e6
        correct = all(got[h]["crc"] == zlib.crc32(expected_result(c.kind, c.seed, n, r, k, c.message_bytes))
                      for r, h in enumerate(c.hosts))
        rows.append({"index": k, "end_s": end, "time_s": t, "algbw_mbps": algbw,
                     "busbw_mbps": algbw * bus_factor(c.kind, n), "correct": correct})
        prev_end = end
    return rows


def summary(d: RunData, c: CollectiveRun) -> dict:
    """The collective's line of the run's metrics, nccl-tests' columns: the time per iteration
    (median, and p99) and the bandwidths over the whole run: ``iterations x S`` over the time from
    the first start to the last end (a mean, steady with few iterations, where the median of a
    handful of iterations is not: a late iteration can finish at once behind a stalled one), and
    on to the run's end when it finished fewer than it was asked for (:func:`stalled_tail_s`)."""
    rows = iterations(d, c)
    times = sorted(r["time_s"] for r in rows)
    starts = [e["start_s"] for e in d.events if e.get("kind") == "collective_iteration" and e["index"] == 0]
    span = rows[-1]["end_s"] - min(starts) + stalled_tail_s(d, c, rows) if rows and starts else 0.0
    algbw = len(rows) * c.message_bytes * 8 / span / 1e6 if span > 0 else 0.0
    return {
        "kind": c.kind, "hosts": len(c.hosts), "bytes": c.message_bytes, "qps_per_peer": c.qps_per_peer,
        "iterations": len(rows),
        "time_s": statistics.median(times) if times else None,
        "time_p99_s": percentile(times, 99) if times else None,
        "algbw_mbps": algbw, "busbw_mbps": algbw * bus_factor(c.kind, len(c.hosts)),
        "correct": all(r["correct"] for r in rows),  # every iteration that finished (none: vacuously)
    }


def kept_iterations(d: RunData, c: CollectiveRun) -> tuple[list[dict], list[dict]]:
    """(the iterations a windowed figure reads, all of them): those whose time (from the previous
    iteration's end to their own) met no fidelity fault of the run (``d.fidelity_windows``) nor
    the :data:`~experiments.analysis.metrics.SETTLE_S` after one; all of them in a run without faults."""
    rows = iterations(d, c)
    kept = [r for r in rows
            if not any(f0 < r["end_s"] and f1 + SETTLE_S > r["end_s"] - r["time_s"] for f0, f1 in d.fidelity_windows)]
    return kept, rows


def kept_tail_s(d: RunData, c: CollectiveRun, rows: list[dict]) -> float:
    """The part (s) of the stalled tail (:func:`stalled_tail_s`) that met no fidelity fault nor
    the :data:`~experiments.analysis.metrics.SETTLE_S` after one: time the machine left the
    transport to finish an iteration, and it finished none."""
    tail = stalled_tail_s(d, c, rows)
    if not tail:
        return 0.0
    return sum(b - a for a, b in kept_spans(d, d.duration_s - tail, d.duration_s))


def kept_share(d: RunData, c: CollectiveRun | None) -> float:
    """The share of the collective's time, its stalled tail's included, that
    :func:`kept_iterations` and :func:`kept_tail_s` keep (1.0 with no iteration)."""
    if c is None:
        return 1.0
    kept, rows = kept_iterations(d, c)
    total = sum(r["time_s"] for r in rows) + stalled_tail_s(d, c, rows)
    return (sum(r["time_s"] for r in kept) + kept_tail_s(d, c, rows)) / total if total > 0 else 1.0


def evaluate(d: RunData, c: CollectiveRun | None, metric: str, args: dict) -> float:
    """The value of a collective expectation metric (0 when the run had no collective)."""
    if c is None:
        return 0.0
    s = summary(d, c)
    if metric == "busbw_mbps":
        if not d.fidelity_windows:
            return s["busbw_mbps"]
        kept, rows = kept_iterations(d, c)  # the pace of the iterations the machine left alone
        t = sum(r["time_s"] for r in kept) + kept_tail_s(d, c, rows)  # and the unfinished one's, unfaulted
        return len(kept) * c.message_bytes * 8 / t / 1e6 * bus_factor(c.kind, len(c.hosts)) if t > 0 else 0.0
    if metric == "iterations":
        return float(s["iterations"])
    if metric == "iteration_s":
        times = sorted(r["time_s"] for r in iterations(d, c))
        return percentile(times, args["percentile"]) if times else float("inf")
    if metric == "collective_correct":
        return 1.0 if s["correct"] else 0.0
    raise KeyError(metric)
