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

Warm-up: as nccl-tests (``-w``, 5 by default) times no warm-up iteration, the first ``warmup``
iterations (the collective block's, 5 by default) are not timed, but for the last one a run
finished: the start of a transport (its congestion control from its floor, DCQCN's from line
rate, base RTTs unknown) is not its pace. Every figure below reads the timed iterations.

Expectation metrics: ``busbw_mbps`` (over the timed iterations: their bytes over the time from
the last warm-up iteration's end to the last end, plus the time the unfinished iteration stalled
when it finished fewer iterations than asked (:func:`stalled_tail_s`); in a run with fidelity
faults, over the iterations that met none, nor the second after one: :func:`kept_iterations`),
``iteration_s(percentile)``, ``iterations`` (how many the collective finished, warm-up included),
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
    #: the iterations not timed at the start (nccl-tests ``-w``; see the module docstring)
    warmup: int = 0


def timed(c: CollectiveRun, rows: list[dict]) -> list[dict]:
    """The iterations of ``rows`` (:func:`iterations`) that are timed: all after the first
    ``c.warmup``, and at least the last one finished (a run that finished no more than its
    warm-up is timed on its last iteration and its stalled tail, as nccl-tests would hang)."""
    return rows[min(c.warmup, max(len(rows) - 1, 0)):]


def stalled_tail_s(d: RunData, c: CollectiveRun, rows: list[dict]) -> float:
    """The time (s) the unfinished iteration stalled: when the collective finished fewer
    iterations than it was asked for, the time from its last finished iteration's end to the
    run's end beyond the longest timed iteration (:func:`timed`; 0 otherwise, and 0 for a tail
    shorter than that). nccl-tests times iterations that all finish; a run cut off by its
    timeline must count a stall too, or a transport that stalls after its first iteration reads
    as fast as that iteration (fig. 17's RoCE 1 QP at 128 KiB on bmv2, 2026-12-04: one iteration
    in 0.70 s, then nothing for 6.3 s, read 1.30 Mb/s of busbw against MRC's 0.95). An iteration
    the timeline cut while it ran no longer than one already timed is no stall, and its time
    without its bytes read a steady transport slow by up to an iteration: fig. 17's MRC at 128
    KiB, at a median of 606-622 ms, read 1.34-1.48 Mb/s over 11 or 12 timed iterations by where
    the 12 s timeline cut the next one (2026-12-07, four runs of one tree)."""
    if not rows or not c.iterations or len(rows) >= c.iterations:
        return 0.0  # (none finished: busbw is 0 whatever the time)
    longest = max(r["time_s"] for r in timed(c, rows))
    return max(0.0, d.duration_s - rows[-1]["end_s"] - longest)


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
    """The collective's line of the run's metrics, nccl-tests' columns over the timed iterations
    (:func:`timed`): the time per iteration (median, and p99) and the bandwidths over all of them:
    ``timed x S`` over the time from the last warm-up iteration's end to the last end (a mean,
    steady with few iterations, where the median of a handful of iterations is not: a late
    iteration can finish at once behind a stalled one), plus the time the unfinished iteration
    stalled (:func:`stalled_tail_s`). ``iterations`` counts every finished
    one, ``warmup`` those not timed; ``busbw_run_mbps`` is the busbw over the whole run, warm-up
    included."""
    rows = iterations(d, c)
    t_rows = timed(c, rows)
    times = sorted(r["time_s"] for r in t_rows)
    tail = stalled_tail_s(d, c, rows)
    span = sum(r["time_s"] for r in t_rows) + tail
    algbw = len(t_rows) * c.message_bytes * 8 / span / 1e6 if span > 0 else 0.0
    whole = sum(r["time_s"] for r in rows) + tail
    bus = bus_factor(c.kind, len(c.hosts))
    return {
        "kind": c.kind, "hosts": len(c.hosts), "bytes": c.message_bytes, "qps_per_peer": c.qps_per_peer,
        "iterations": len(rows), "warmup": len(rows) - len(t_rows),
        "time_s": statistics.median(times) if times else None,
        "time_p99_s": percentile(times, 99) if times else None,
        "algbw_mbps": algbw, "busbw_mbps": algbw * bus,
        "busbw_run_mbps": len(rows) * c.message_bytes * 8 / whole / 1e6 * bus if whole > 0 else 0.0,
        "correct": all(r["correct"] for r in rows),  # every iteration that finished (none: vacuously)
    }


def kept_iterations(d: RunData, c: CollectiveRun) -> tuple[list[dict], list[dict]]:
    """(the iterations a windowed figure reads, all of them): those whose time (from the previous
    iteration's end to their own) met no fidelity fault of the run (``d.fidelity_windows``) nor
    the :data:`~experiments.analysis.metrics.SETTLE_S` after one, of the timed ones (:func:`timed`);
    all timed ones in a run without faults."""
    rows = iterations(d, c)
    kept = [r for r in timed(c, rows)
            if not any(f0 < r["end_s"] and f1 + SETTLE_S > r["end_s"] - r["time_s"] for f0, f1 in d.fidelity_windows)]
    return kept, rows


def kept_tail_s(d: RunData, c: CollectiveRun, rows: list[dict]) -> float:
    """The part (s) of the stalled tail (:func:`stalled_tail_s`, the tail's last part) that met no fidelity fault nor
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
    total = sum(r["time_s"] for r in timed(c, rows)) + stalled_tail_s(d, c, rows)
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
        times = sorted(r["time_s"] for r in timed(c, iterations(d, c)))
        return percentile(times, args["percentile"]) if times else float("inf")
    if metric == "collective_correct":
        return 1.0 if s["correct"] else 0.0
    raise KeyError(metric)
