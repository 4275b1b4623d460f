"""A sweep as a scenario declares it: the grid and the claims across it, validated with the rest of
the scenario (:mod:`experiments.sweep` runs it and writes it up).

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

from dataclasses import dataclass

from mrclab.topologies.schema import Problems, Rule, check_mapping

_VARIANT = {"label": Rule(kind=str, required=True), "transport": Rule(choices=("mrc", "roce")),
            "qps_per_peer": Rule(kind=int, lo=1, hi=64), "message_bytes": Rule(kind=int, lo=1, hi=1 << 30)}
_CLAIM = {"metric": Rule(choices=("busbw_ratio", "busbw_retained"), required=True),
          "variant": Rule(kind=str, required=True), "baseline": Rule(kind=str),
          "loss": Rule(kind=float, lo=0, hi=1, required=True), "min": Rule(kind=float), "max": Rule(kind=float)}


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: transport / QP variants, random-loss rates, and the claims between points."""
    variants: tuple[dict, ...]
    loss: tuple[float, ...]
    claims: tuple[dict, ...]


def parse_sweep(raw: dict, problems: Problems) -> Sweep | None:
    """The scenario's ``sweep:`` and ``expect_sweep:`` (None without a sweep); every bad field is
    added to ``problems`` (the scenario loader raises them all at once)."""
    if "sweep" not in raw:
        return None
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
    return Sweep(tuple(variants), tuple(float(x) for x in loss), tuple(claims))
