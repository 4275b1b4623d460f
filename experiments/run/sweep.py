"""Sweeps: one scenario run over a grid, written up as one table and one plot (the paper's
figures 16-17 are sweeps of transport x QPs x loss). The ``sweep:`` block and its claims are
declared and validated in :mod:`experiments.model.sweepspec`; here each point of the grid becomes a
scenario, runs with the scenario's own expectations (``expect`` for MRC, ``expect_roce`` for
RoCE) into ``<out>/<label>-loss<rate>/``, and the sweep writes ``sweep.csv``, ``sweep.md`` and
``sweep.png`` (bus bandwidth per variant against loss) beside them, and ``sweep.json`` with every
point and every claim's verdict.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from mrclab.experiments.analysis import fidelity
from mrclab.experiments.analysis.expectations import verdict_word
from mrclab.experiments.analysis.metrics import KEPT_MIN
from mrclab.experiments.analysis.plots import sweep_plot
from mrclab.experiments.model.faults import Fault
from mrclab.experiments.model.scenario import Scenario, parse_scenario
from mrclab.experiments.model.sweepspec import Sweep, claim_reads, size_suffix, size_text


def point(scn: Scenario, variant: dict, loss: float, message_bytes: int | None = None,
          seed: int | None = None) -> Scenario:
    """The scenario of one point of the grid (``message_bytes``: the collective's size per host, None
    for the scenario's own; ``seed``: in place of the scenario's, None to keep it)."""
    raw = copy.deepcopy(scn.raw)
    if seed is not None:
        raw["seed"] = seed
    raw.pop("sweep", None)
    raw.pop("expect_sweep", None)
    if "transport" in variant:
        raw["transport"] = {**(raw.get("transport") or {}), "kind": variant["transport"]}
    if "set" in variant:  # transport settings, checked with the rest of the point's scenario
        raw["transport"] = {**(raw.get("transport") or {}), **variant["set"]}
    for key in ("qps_per_peer", "message_bytes"):
        if key in variant:
            raw["collective"][key] = variant[key]
    if message_bytes is not None:
        raw["collective"]["message_bytes"] = message_bytes
    raw["name"] = f"{scn.name} [{label(variant, loss, message_bytes)}]"
    out = parse_scenario(raw, scn.source)
    if loss > 0:
        out = dataclasses.replace(out, faults=(Fault(0.0, "random_loss", {"rate": loss}), *out.faults))
    return out


def label(variant: dict, loss: float, message_bytes: int | None = None) -> str:
    """How a sweep point is named in tables: ``<variant>, loss <x>[, <size>]``."""
    return f"{variant['label']}, loss {loss:g}{size_suffix(message_bytes)}"


def folder_name(variant: dict, loss: float, message_bytes: int | None = None) -> str:
    """A sweep point's results folder: the variant's label made path-safe, then ``-loss<x>`` (and
    ``-<bytes>b`` where sizes are swept)."""
    return ("".join(c if c.isalnum() else "-" for c in variant["label"]).strip("-").lower() + f"-loss{loss:g}"
            + (f"-{message_bytes}b" if message_bytes else ""))


def judge(sw: Sweep, points: list[dict]) -> list[dict]:
    """Every claim of the sweep against its points (``{variant, loss, busbw_mbps, void, held, ...}``).
    A claim that reads a point where the emulator fell behind (its run void, or its busbw ``held``:
    the faults held most of its iterations) is void (with that point's reason), neither pass nor
    FAIL. A point's ``message_bytes`` is None (or absent) where sizes are not swept."""
    at = {(p["variant"], p["loss"], p.get("message_bytes")): p.get("busbw_mbps") or 0.0 for p in points}
    # a point's busbw no claim can trust: its run was void, or the faults held most of its iterations
    void_at = {(p["variant"], p["loss"], p.get("message_bytes")): p.get("void") or p.get("held") for p in points}
    out = []
    for c in sw.claims:
        loss, size = float(c["loss"]), c.get("message_bytes")
        at_size = size_suffix(size)
        read = claim_reads(c)
        if c["metric"] == "busbw_ratio":
            what = f"busbw {c['variant']} / {c['baseline']} at loss {loss:g}{at_size}"
        else:
            what = f"busbw {c['variant']} at loss {loss:g} / at loss 0{at_size}"
        num, den = at.get(read[0], 0.0), at.get(read[1], 0.0)
        void = next((f"{k[0]} at loss {k[1]:g}{at_size}: {void_at[k]}" for k in read if void_at.get(k)), None)
        v = num / den if den > 0 else (float("inf") if num > 0 else 0.0)
        lo, hi = c.get("min"), c.get("max")
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
        bound = " and ".join(x for x in [f">= {lo}" if lo is not None else "",
                                         f"<= {hi}" if hi is not None else ""] if x)
        out.append({"claim": what, "value": v, "bound": bound or "reported",
                    "passed": ok if (lo is not None or hi is not None) and void is None else None, "void": void})
    return out


def _replaced_text(p: dict) -> str:
    """``; seed S, re-run after: <each earlier run's void>`` where the machine voided a point's
    earlier runs (:func:`~experiments.run.runner.run_sweep` ``tries``), else empty."""
    if not p.get("replaced"):
        return ""
    return f"; seed {p['seed']}, re-run after: " + "; ".join(p["replaced"])


def write(out: Path, scn: Scenario, sw: Sweep, points: list[dict], claims: list[dict]) -> None:
    """sweep.csv, sweep.md, sweep.png and sweep.json in ``out``."""
    import csv

    cols = ["variant", "loss", "message_bytes", "transport", "qps_per_peer", "iterations", "time_s", "algbw_mbps",
            "busbw_mbps", "correct", "passed", "void", "held", "folder", "seed"]
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(points)
    lines = [f"# {scn.name}", "", scn.paper, "", "| variant | loss | message size | iterations | "
             "time per iteration (ms) | algbw (Mb/s) | busbw (Mb/s) | correct | expectations |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        t = "-" if p.get("time_s") is None else f"{p['time_s'] * 1e3:.0f}"
        lines.append(f"| {p['variant']} | {p['loss']:g} | {size_text(p.get('message_bytes'))} | "
                     f"{p.get('iterations', 0)} | {t} | "
                     f"{p.get('algbw_mbps', 0):.2f} | {p.get('busbw_mbps', 0):.2f} | "
                     f"{'yes' if p.get('correct') else 'NO'} | {verdict_word(p['passed'], void=p.get('void'))}"
                     f"{f'; busbw not read ({held})' if (held := p.get('held')) else ''}{_replaced_text(p)} |")
    if claims:
        lines += ["", "| claim | value | bound | verdict |", "| --- | --- | --- | --- |"]
        lines += [f"| {c['claim']} | {c['value']:.2f} | {c['bound']} | "
                  f"{verdict_word(c['passed'], void=c.get('void'))} |" for c in claims]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    sweep_plot(points, [v["label"] for v in sw.variants], list(sw.loss), out / "sweep.png", scn.name,
               sizes=[b for b in sw.sizes if b])
    (out / "sweep.json").write_text(json.dumps({"scenario": scn.name, "paper": scn.paper, "points": points,
                                                "claims": claims}, indent=1, default=str))


def summarise(variant: dict, loss: float, m: dict, folder: str, message_bytes: int | None = None) -> dict[str, Any]:
    """One row of the sweep from a point's metrics (``message_bytes``: the swept size, None if none).

    ``void``: the point's own first void verdict (None: every one decided). ``held``: where the
    iterations the fidelity faults left alone are less than :data:`KEPT_MIN` of their time, why (its busbw then
    reads too few iterations to stand for the point). A held busbw is a figure, only reported at the
    point: it voids the claims that read it (:func:`judge`), not the point, so a point no claim
    reads (fig. 16's RoCE with 16 QPs at 8 KiB: 64-byte packets, endpoint-bound) never leaves the
    sweep undecided."""
    c = m.get("collective") or {}
    void = next((v["void"] for v in m.get("expectations", []) if v.get("void")), None)
    held = None
    if c.get("kept_share", 1.0) < KEPT_MIN:  # the machine held most of its iterations
        why = fidelity.void_reason([fidelity.FidelityFault(**f) for f in m.get("fidelity_faults", [])])
        held = f"fidelity faults held {1 - c['kept_share']:.0%} of its iterations: {why}"
    # its busbw: the iterations the machine left alone (experiments/analysis/collectives.py kept_iterations)
    busbw = c.get("busbw_kept_mbps", c.get("busbw_mbps", 0.0))
    return {"variant": variant["label"], "loss": loss, "message_bytes": message_bytes, "transport": m["transport"],
            "void": void, "held": held,
            "qps_per_peer": c.get("qps_per_peer"), "iterations": c.get("iterations", 0), "time_s": c.get("time_s"),
            "algbw_mbps": c.get("algbw_mbps", 0.0), "busbw_mbps": busbw, "busbw_whole_mbps": c.get("busbw_mbps", 0.0),
            "iterations_kept": c.get("iterations_kept", c.get("iterations", 0)),
            "correct": c.get("correct", False), "passed": m["passed"], "folder": folder}
