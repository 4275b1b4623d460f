"""Sweeps: one scenario run over a grid, written up as one table and one plot (the paper's
figures 16-17 are sweeps of transport x QPs x loss).

A scenario's ``sweep:`` block::

    sweep:
      variants:                 # each a run of the scenario with these overrides; label names it
        - {label: "MRC 1 QP", transport: mrc, qps_per_peer: 1}
        - {label: "RoCE 16 QPs", transport: roce, qps_per_peer: 16}
      loss: [0, 0.001, 0.01]    # random loss on every switch port (the random_loss fault at t = 0)
    expect_sweep:               # claims across the grid
      - {metric: busbw_ratio, variant: "MRC 1 QP", baseline: "RoCE 1 QP", loss: 0, min: 1.2}

A variant may set ``transport`` (mrc | roce), ``qps_per_peer`` and ``message_bytes`` (of the
scenario's collective). Every point runs with the scenario's own expectations (``expect`` for MRC,
``expect_roce`` for RoCE) into ``<out>/<label>-loss<rate>/``; the sweep writes ``sweep.csv``,
``sweep.md`` and ``sweep.png`` (bus bandwidth per variant against loss) beside them, and
``sweep.json`` with every point and every claim's verdict.

Claims: ``busbw_ratio`` (``variant``'s bus bandwidth over ``baseline``'s at ``loss``) and
``busbw_retained`` (``variant``'s bus bandwidth at ``loss`` over its own at loss 0), each with
``min`` / ``max``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.faults import Fault
from experiments.scenario import Scenario, ScenarioError
from topologies.schema import Problems, Rule, check_mapping

_VARIANT = {"label": Rule(kind=str, required=True), "transport": Rule(choices=("mrc", "roce")),
            "qps_per_peer": Rule(kind=int, lo=1, hi=64), "message_bytes": Rule(kind=int, lo=1, hi=1 << 30)}
_CLAIM = {"metric": Rule(choices=("busbw_ratio", "busbw_retained"), required=True),
          "variant": Rule(kind=str, required=True), "baseline": Rule(kind=str),
          "loss": Rule(kind=float, lo=0, hi=1, required=True), "min": Rule(kind=float), "max": Rule(kind=float)}


@dataclass(frozen=True)
class Sweep:
    variants: tuple[dict, ...]
    loss: tuple[float, ...]
    claims: tuple[dict, ...]


def parse_sweep(raw: dict, src: str) -> Sweep | None:
    """The scenario's ``sweep:`` and ``expect_sweep:`` (None without a sweep). Raises
    :class:`~experiments.scenario.ScenarioError` naming every bad field."""
    if "sweep" not in raw:
        return None
    problems = Problems(src)
    sw = raw["sweep"] if isinstance(raw["sweep"], dict) else {}
    variants = []
    for i, v in enumerate(sw.get("variants") or [{"label": "as is"}]):
        variants.append(check_mapping(v, _VARIANT, f"sweep.variants[{i}]", problems))
    labels = [v.get("label") for v in variants]
    if len(set(labels)) != len(labels):
        problems.add(f"sweep.variants: labels must differ ({labels})")
    loss = sw.get("loss", [0.0])
    if not isinstance(loss, list) or not loss or not all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in loss):
        problems.add(f"sweep.loss = {loss!r}; allowed: a list of probabilities 0.0 to 1.0")
        loss = [0.0]
    if (set(sw) - {"variants", "loss"}) or not isinstance(raw["sweep"], dict):
        problems.add(f"sweep: {raw['sweep']!r}; allowed: {{variants: [...], loss: [...]}}")
    if "collective" not in raw and any("qps_per_peer" in v or "message_bytes" in v for v in variants):
        problems.add("sweep.variants set qps_per_peer / message_bytes, which need a collective:")
    claims = []
    for i, c in enumerate(raw.get("expect_sweep") or []):
        got = check_mapping(c, _CLAIM, f"expect_sweep[{i}]", problems)
        for key in ("variant", "baseline"):
            if key in got and got[key] not in labels:
                problems.add(f"expect_sweep[{i}].{key} = {got[key]!r}; allowed: {', '.join(map(str, labels))}")
        if got.get("metric") == "busbw_ratio" and "baseline" not in got:
            problems.add(f"expect_sweep[{i}]: busbw_ratio needs a baseline variant")
        if "loss" in got and float(got["loss"]) not in [float(x) for x in loss]:
            problems.add(f"expect_sweep[{i}].loss = {got['loss']}; allowed: one of the sweep's {loss}")
        claims.append(got)
    problems.raise_if_any(ScenarioError)
    return Sweep(tuple(variants), tuple(float(x) for x in loss), tuple(claims))


def point(scn: Scenario, variant: dict, loss: float) -> Scenario:
    """The scenario of one point of the grid."""
    from experiments.scenario import parse_scenario

    raw = copy.deepcopy(scn.raw)
    raw.pop("sweep", None)
    raw.pop("expect_sweep", None)
    if "transport" in variant:
        raw["transport"] = {**(raw.get("transport") or {}), "kind": variant["transport"]}
    for key in ("qps_per_peer", "message_bytes"):
        if key in variant:
            raw["collective"][key] = variant[key]
    raw["name"] = f"{scn.name} [{label(variant, loss)}]"
    out = parse_scenario(raw, scn.source)
    if loss > 0:
        out = dataclasses.replace(out, faults=(Fault(0.0, "random_loss", {"rate": loss}), *out.faults))
    return out


def label(variant: dict, loss: float) -> str:
    return f"{variant['label']}, loss {loss:g}"


def folder_name(variant: dict, loss: float) -> str:
    return "".join(c if c.isalnum() else "-" for c in variant["label"]).strip("-").lower() + f"-loss{loss:g}"


def judge(sw: Sweep, points: list[dict]) -> list[dict]:
    """Every claim of the sweep against its points (``{variant, loss, busbw_mbps, ...}``)."""
    at = {(p["variant"], p["loss"]): p.get("busbw_mbps") or 0.0 for p in points}
    out = []
    for c in sw.claims:
        loss = float(c["loss"])
        if c["metric"] == "busbw_ratio":
            num, den = at.get((c["variant"], loss), 0.0), at.get((c["baseline"], loss), 0.0)
            what = f"busbw {c['variant']} / {c['baseline']} at loss {loss:g}"
        else:
            num, den = at.get((c["variant"], loss), 0.0), at.get((c["variant"], 0.0), 0.0)
            what = f"busbw {c['variant']} at loss {loss:g} / at loss 0"
        v = num / den if den > 0 else (float("inf") if num > 0 else 0.0)
        lo, hi = c.get("min"), c.get("max")
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
        bound = " and ".join(x for x in [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else ""] if x)
        out.append({"claim": what, "value": v, "bound": bound or "reported",
                    "passed": ok if (lo is not None or hi is not None) else None})
    return out


def write(out: Path, scn: Scenario, sw: Sweep, points: list[dict], claims: list[dict]) -> None:
    """sweep.csv, sweep.md, sweep.png and sweep.json in ``out``."""
    import csv

    from experiments.plots import sweep_plot

    cols = ["variant", "loss", "transport", "qps_per_peer", "iterations", "time_s", "algbw_mbps", "busbw_mbps",
            "correct", "passed", "folder"]
    with open(out / "sweep.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(points)
    lines = [f"# {scn.name}", "", scn.paper, "", "| variant | loss | iterations | time per iteration (ms) | "
             "algbw (Mb/s) | busbw (Mb/s) | correct | expectations |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        t = "-" if p.get("time_s") is None else f"{p['time_s'] * 1e3:.0f}"
        lines.append(f"| {p['variant']} | {p['loss']:g} | {p.get('iterations', 0)} | {t} | "
                     f"{p.get('algbw_mbps', 0):.2f} | {p.get('busbw_mbps', 0):.2f} | "
                     f"{'yes' if p.get('correct') else 'NO'} | {'pass' if p['passed'] else 'FAIL'} |")
    if claims:
        lines += ["", "| claim | value | bound | verdict |", "| --- | --- | --- | --- |"]
        lines += [f"| {c['claim']} | {c['value']:.2f} | {c['bound']} | "
                  f"{ {True: 'pass', False: 'FAIL', None: '-'}[c['passed']]} |" for c in claims]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    sweep_plot(points, [v["label"] for v in sw.variants], list(sw.loss), out / "sweep.png", scn.name)
    (out / "sweep.json").write_text(json.dumps({"scenario": scn.name, "paper": scn.paper, "points": points,
                                                "claims": claims}, indent=1, default=str))


def summarise(variant: dict, loss: float, m: dict, folder: str) -> dict[str, Any]:
    """One row of the sweep from a point's metrics."""
    c = m.get("collective") or {}
    return {"variant": variant["label"], "loss": loss, "transport": m["transport"],
            "qps_per_peer": c.get("qps_per_peer"), "iterations": c.get("iterations", 0), "time_s": c.get("time_s"),
            "algbw_mbps": c.get("algbw_mbps", 0.0), "busbw_mbps": c.get("busbw_mbps", 0.0),
            "correct": c.get("correct", False), "passed": m["passed"], "folder": folder}
