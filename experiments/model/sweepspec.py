"""A sweep as a scenario declares it: the grid and the claims across it, validated with the rest of
the scenario (:mod:`experiments.run.sweep` runs it and writes it up).

A scenario's ``sweep:`` block::

    sweep:
      variants:                 # each a run of the scenario with these overrides; label names it
        - {label: "MRC 1 QP", transport: mrc, qps_per_peer: 1}
        - {label: "RoCE 16 QPs", transport: roce, qps_per_peer: 16}
      loss: [0, 0.001, 0.01]    # random loss on every switch port (the random_loss fault at t = 0)
      message_bytes: [8192, 32768, 131072]   # optional: the collective's size per host, swept too
      quick_s: 60               # optional: a point's length under ``mrclab reproduce --quick`` (s)
    expect_sweep:               # claims across the grid
      - {metric: busbw_ratio, variant: "MRC 1 QP", baseline: "RoCE 1 QP", loss: 0, min: 1.2}

The grid is every variant at every loss rate and every message size (the paper's figs. 16-17 plot
bus bandwidth against message size, a curve per transport and loss). A variant may set
``transport`` (mrc | roce), ``qps_per_peer``, ``set`` (transport settings, as ``mrclab run --set``
sets them: ``{spray: false}`` holds MRC's QPs to one ECMP path) and, where the sweep does not sweep
sizes, ``message_bytes`` (of the scenario's collective). Every point runs with the scenario's own
expectations (``expect`` for MRC, ``expect_roce`` for RoCE) into
``<out>/<label>-loss<rate>[-<size>]/``; the sweep writes ``sweep.csv``, ``sweep.md`` and
``sweep.png`` (bus bandwidth per variant against loss, or against message size where sizes are
swept) beside them, and ``sweep.json`` with every point and every claim's verdict.

``--quick`` runs only the points the claims read (:meth:`Sweep.claimed`), each for ``quick_s``: the
shortest point at which the claims decide; without it for ``experiments.run.reproduce.QUICK_SWEEP_S``.
A sweep whose baseline has a slow start sets it (fig. 17: RoCE's DCQCN takes about 10 s to settle,
and an 8 s point read only that start; fig. 16: RoCE with 16 QPs at 1% loss runs three fast
iterations, then 3-7 s each).

Claims: ``busbw_ratio`` (``variant``'s bus bandwidth over ``baseline``'s at ``loss``) and
``busbw_retained`` (``variant``'s bus bandwidth at ``loss`` over its own at loss 0), each with
``min`` / ``max``, read at ``message_bytes`` (default: the collective's own size, which must then
be one of the swept sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from mrclab.topologies.schema import Problems, Rule, build, check_mapping
from mrclab.traffic.settings import TransportSettings

_VARIANT = {"label": Rule(kind=str, required=True), "transport": Rule(choices=("mrc", "roce")),
            "qps_per_peer": Rule(kind=int, lo=1, hi=64), "message_bytes": Rule(kind=int, lo=1, hi=1 << 30),
            "set": Rule(kind=dict)}
_CLAIM = {"metric": Rule(choices=("busbw_ratio", "busbw_retained"), required=True),
          "variant": Rule(kind=str, required=True), "baseline": Rule(kind=str),
          "loss": Rule(kind=float, lo=0, hi=1, required=True), "message_bytes": Rule(kind=int, lo=1, hi=1 << 30),
          "min": Rule(kind=float), "max": Rule(kind=float)}


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: transport / QP variants, random-loss rates, message sizes (bytes per host;
    ``(None,)`` where sizes are not swept: the collective's own) and the claims between points (each
    with its ``message_bytes`` filled in: None where sizes are not swept)."""
    variants: tuple[dict, ...]
    loss: tuple[float, ...]
    claims: tuple[dict, ...]
    sizes: tuple[int | None, ...] = (None,)
    #: a point's length (s) under ``mrclab reproduce --quick``; None: reproduce's own default
    quick_s: float | None = None

    def grid(self) -> list[tuple[dict, float, int | None]]:
        """Every point, ``(variant, loss, message_bytes)``: loss rates outermost, then sizes, then variants."""
        return [(v, x, b) for x in self.loss for b in self.sizes for v in self.variants]

    def claimed(self) -> list[tuple[dict, float, int | None]]:
        """The points of :meth:`grid` some claim reads (:func:`claim_reads`), in grid order; the whole
        grid where the sweep has no claims. ``mrclab reproduce --quick`` runs these only."""
        read = {k for c in self.claims for k in claim_reads(c)}
        return [(v, x, b) for v, x, b in self.grid() if (v["label"], x, b) in read] or self.grid()


def claim_reads(claim: dict) -> list[tuple[str, float, int | None]]:
    """The points a claim reads, ``[(variant label, loss, message_bytes)]``, numerator first:
    ``busbw_ratio`` its variant's and its baseline's at its loss, ``busbw_retained`` its variant's
    at its loss and at loss 0, both at its ``message_bytes`` (None where sizes are not swept)."""
    loss, size = float(claim["loss"]), claim.get("message_bytes")
    other = (claim["baseline"], loss, size) if claim["metric"] == "busbw_ratio" else (claim["variant"], 0.0, size)
    return [(claim["variant"], loss, size), other]


def size_text(message_bytes: int | None) -> str:
    """A message size as people write it: ``512 B``, ``32 KiB``, ``1 MiB`` (binary units); ``-``
    for None (a sweep that sweeps no sizes)."""
    if not message_bytes:
        return "-"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if message_bytes >= scale and message_bytes % scale == 0:
            return f"{message_bytes // scale} {unit}"
    return f"{message_bytes} B"


def size_suffix(message_bytes: int | None) -> str:
    """``, <size>`` to follow a point's or a claim's name where sizes are swept, else nothing."""
    return f", {size_text(message_bytes)}" if message_bytes else ""


def parse_sweep(raw: dict, problems: Problems) -> Sweep | None:
    """The scenario's ``sweep:`` and ``expect_sweep:`` (None without a sweep); every bad field is
    added to ``problems`` (the scenario loader raises them all at once)."""
    if "sweep" not in raw:
        return None
    sw = raw["sweep"] if isinstance(raw["sweep"], dict) else {}
    variants = []
    for i, v in enumerate(sw.get("variants") or [{"label": "as is"}]):
        variants.append(check_mapping(v, _VARIANT, f"sweep.variants[{i}]", problems))
        if isinstance(variants[-1].get("set"), dict):  # refused now, not when the grid reaches the point
            build(TransportSettings, variants[-1]["set"], "", problems, prefix=f"sweep.variants[{i}].set.")
    labels = [v.get("label") for v in variants]
    if len(set(labels)) != len(labels):
        problems.add(f"sweep.variants: labels must differ ({labels})")
    loss = sw.get("loss", [0.0])
    if not isinstance(loss, list) or not loss or not all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in loss):
        problems.add(f"sweep.loss = {loss!r}; allowed: a list of probabilities 0.0 to 1.0")
        loss = [0.0]
    if (set(sw) - {"variants", "loss", "message_bytes", "quick_s"}) or not isinstance(raw["sweep"], dict):
        problems.add(f"sweep: {raw['sweep']!r}; allowed: {{variants: [...], loss: [...], message_bytes: [...], "
                     f"quick_s: seconds}}")
    if "collective" not in raw and any("qps_per_peer" in v or "message_bytes" in v for v in variants):
        problems.add("sweep.variants set qps_per_peer / message_bytes, which need a collective:")
    sizes = _sizes(raw, sw, variants, problems)
    coll = raw.get("collective")
    own = coll.get("message_bytes") if isinstance(coll, dict) else None
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
        if sizes == (None,):
            if "message_bytes" in got:
                problems.add(f"expect_sweep[{i}].message_bytes: the sweep sweeps no sizes; allowed: no message_bytes")
            got["message_bytes"] = None
        else:
            got.setdefault("message_bytes", own)
            if got["message_bytes"] not in sizes:
                problems.add(f"expect_sweep[{i}].message_bytes = {got['message_bytes']}; allowed: one of the sweep's "
                             f"message_bytes {list(sizes)}")
        claims.append(got)
    return Sweep(tuple(variants), tuple(float(x) for x in loss), tuple(claims), sizes, _quick_s(sw, problems))


def _sizes(raw: dict, sw: dict, variants: list[dict], problems: Problems) -> tuple[int | None, ...]:
    """The swept message sizes (``(None,)``: sizes are not swept), their problems added."""
    sizes: tuple[int | None, ...] = (None,)
    if "message_bytes" in sw:
        got_sizes = sw["message_bytes"]
        if (not isinstance(got_sizes, list) or not got_sizes or len(set(got_sizes)) != len(got_sizes)
                or not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 1 << 30 for b in got_sizes)):
            problems.add(f"sweep.message_bytes = {got_sizes!r}; allowed: a list of different sizes, 1 to 2^30 bytes")
        elif "collective" not in raw:
            problems.add("sweep.message_bytes sweeps a collective's size, which needs a collective:")
        elif any("message_bytes" in v for v in variants):
            problems.add("sweep.variants set message_bytes while sweep.message_bytes sweeps it; "
                         "allowed: one of the two")
        else:
            sizes = tuple(got_sizes)
    return sizes


def _quick_s(sw: dict, problems: Problems) -> float | None:
    """``sweep.quick_s`` (s), None where it is not given or is refused (added to ``problems``)."""
    quick_s = sw.get("quick_s")
    if quick_s is None:
        return None
    if isinstance(quick_s, bool) or not isinstance(quick_s, (int, float)) or not 1 <= quick_s <= 3600:
        problems.add(f"sweep.quick_s = {quick_s!r}; allowed: 1 to 3600 seconds")
        return None
    return float(quick_s)
