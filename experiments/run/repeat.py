"""Repeated runs: one scenario run with seeds 1..N, every figure reported as the median with its
min-max, and a verdict that holds when the median of the runs that decided it meets the bound and
more than half of the runs decided it (a void run is left out of the median, never read as a pass).

One run is one draw of the emulation (scheduling, EV draws, the gray-loss generator): a bound one
run meets and the next misses says little. ``mrclab run --repeat N`` and ``mrclab reproduce
--repeat N`` run every seed into its own folder (``seed-<k>/``) and write ``repeat.json`` and
``repeat.md`` beside them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mrclab.emulation.placement import Cluster, open_cluster
from mrclab.experiments.analysis.expectations import verdict_word
from mrclab.experiments.model.scenario import Scenario, load_scenario, parse_set
from mrclab.experiments.run import runner
from mrclab.experiments.run.results import results_folder
from rich.console import Console
from rich.table import Table

console = Console(stderr=True, highlight=False)


def _bound_holds(value: float | None, bound: str, passed_any: list[bool | None]) -> bool | None:
    """Whether the median meets a ``>= x``, ``<= y`` or ``>= x and <= y`` bound; a metric that
    judges itself (its bound is text) holds when every run held."""
    if bound == "reported" or all(p is None for p in passed_any):
        return None
    if value is None:
        value = float("inf")
    ok, parsed = True, False
    for part in bound.split(" and "):
        op, _, num = part.strip().partition(" ")
        try:
            x = float(num)
        except ValueError:
            continue
        parsed = True
        ok &= value >= x if op == ">=" else value <= x if op == "<=" else True
    return ok if parsed else all(p is not False for p in passed_any)


def aggregate(runs: list[dict]) -> dict:
    """Metrics of N runs of one scenario -> one metrics-shaped dict: each expectation's ``value`` is
    the median over the runs where it was decided (``min``, ``max``, ``values`` of every run beside
    it, None where a run was void), ``passed`` is that median against the bound. A verdict is
    decided while more than half of the runs decided it (``void_runs`` counts the others; 1 of 3 may
    be void); else it is void, with ``void`` saying which runs and why."""
    first = runs[0]
    out = []
    for i, v0 in enumerate(first["expectations"]):
        col = [m["expectations"][i] for m in runs]
        decided = [c for c in col if not c.get("void")]
        vals = [c["value"] for c in col]  # None: infinite (never recovered, never retired)
        kept = [c["value"] for c in decided] or vals
        finite = [x for x in kept if x is not None]
        med: float | None = statistics.median([float("inf") if x is None else x for x in kept])
        voids = [f"seed {m['seed']}: {c['void']}" for m, c in zip(runs, col, strict=True) if c.get("void")]
        undecided = 2 * len(decided) <= len(runs)
        passed = None if undecided else _bound_holds(med, v0["bound"], [c["passed"] for c in decided])
        out.append({**v0, "value": None if med is None or med == float("inf") else med,
                    "min": min(finite) if finite else None, "max": max(finite) if finite else None,
                    "values": vals, "passed": passed, "void_runs": len(voids),
                    "void": "; ".join(voids) if undecided else None})
    return {**first, "seed": [m["seed"] for m in runs], "expectations": out, "runs": len(runs),
            "passed": runner.run_passed(out),
            "void": [v["expectation"] for v in out if v["void"]],
            "fidelity_faults": [f for m in runs for f in m.get("fidelity_faults", [])]}


def figure(v: dict) -> str:
    """``median [min-max]`` of one aggregated expectation."""
    if v["value"] is None:
        return "inf"
    if v.get("min") is None or f"{v['min']:.3g}" == f"{v['max']:.3g}":
        return f"{v['value']:.3g}"
    return f"{v['value']:.3g} [{v['min']:.3g}-{v['max']:.3g}]"


def run_repeated(load, n: int, out: Path | str | None, name: str, *, live: bool = False, fit: bool = False,
                 rates: str = "scenario", cluster: Cluster | None = None) -> dict:
    """Run ``load(seed)`` (a :class:`Scenario` per seed) for seeds 1..``n`` into ``out/seed-<k>``;
    returns :func:`aggregate` of them, also written as ``repeat.json`` and ``repeat.md``."""
    folder = results_folder(out, f"{name}-x{n}")
    runs = []
    for k in range(1, n + 1):
        scn: Scenario = load(k)
        console.print(f"[bold]repeat {k}/{n}[/bold]: {scn.name} seed {k}")
        runs.append(runner.run(scn, folder / f"seed-{k}", live=live, fit=fit, cluster=cluster, rates=rates))
    agg = aggregate(runs)
    (folder / "repeat.json").write_text(json.dumps(agg, indent=1, default=str))
    rows = ["| expectation | median [min-max] | bound | verdict |", "| --- | --- | --- | --- |"]
    rows += [f"| {v['expectation']} | {figure(v)} | {v['bound']} | {verdict_word(v['passed'], void=v['void'])} |"
             for v in agg["expectations"]]
    (folder / "repeat.md").write_text(f"# {name}: {n} runs (seeds 1..{n})\n\n" + "\n".join(rows) + "\n")
    t = Table(title=f"{name}: {n} runs, seeds 1..{n} (median [min-max])")
    for c in ("expectation", "median [min-max]", "bound", "verdict"):
        t.add_column(c)
    for v in agg["expectations"]:
        t.add_row(v["expectation"], figure(v), v["bound"], verdict_word(v["passed"], rich=True, void=v["void"]))
    Console(highlight=False).print(t)
    Console(highlight=False).print(f"results in {folder}/ (repeat.md, repeat.json, seed-1 .. seed-{n})")
    return agg


def main(args) -> int:
    """``mrclab run SCENARIO --repeat N``: exit 1 when a median FAILs, 3 when a verdict was void, else 0.
    A sweep (figs. 16-17) takes ``--repeat N`` as ``mrclab reproduce`` does: each point runs once,
    and again with the next seed where the machine voided it, up to N runs (:func:`runner.run_sweep`)."""
    from_args = dict(duration_s=args.duration, dataplane=args.dataplane, transport=args.transport,
                     settings=parse_set(args.set))
    first = load_scenario(args.scenario, **from_args)
    with open_cluster(getattr(args, "servers", None), getattr(args, "ssh_config", None),
                      files=(first.source,)) as cluster:
        if first.sweep is not None:
            console.print(f"{first.name} is a sweep: each point runs again with the next seed where the machine "
                          f"voided it, up to {args.repeat} runs")
            s = runner.run_sweep(first, Path(args.out) if args.out else None, live=False, cluster=cluster,
                                 tries=args.repeat)
            return {True: 0, False: 1, None: 3}[s["passed"]]
        agg = run_repeated(lambda k: load_scenario(args.scenario, seed=k, **from_args), args.repeat, args.out,
                           first.name, live=False, fit=args.fit, rates=args.rates, cluster=cluster)
    return runner.exit_code(agg)
