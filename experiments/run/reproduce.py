"""``mrclab reproduce``: every shipped scenario that reproduces a result of the paper, MRC and the
RoCE baseline, into one report folder.

For each scenario (in :data:`ORDER`) the MRC run is judged by ``expect`` and the RoCE run by
``expect_roce``; a sweep (figs. 16-17) runs its whole grid and is judged by its claims. The report
has one row per paper result: the paper's claim (the scenario's ``paper:``), the measured MRC
figure, the measured RoCE figure and the verdict. The figure of a run is its headline expectation:
the first of ``expect`` with a bound, and for RoCE the expectation of ``expect_roce`` on the same
metric (else its first). Files: ``report.md`` (the table, then every expectation of every run),
``summary.json`` (the same as data), ``plots/`` (each row's goodput plot, MRC and RoCE, or its
sweep plot) and one results folder per run beside them.

``--quick`` compresses every scenario to its ``quick_s`` (14 s unless it says otherwise: the soak
keeps 40 s so that its flaps stay longer than an EV takes to be retired and revived; fault times
and windows scale with it) so that the whole table runs in a few minutes; a sweep runs only the
points its claims read (``Sweep.claimed``), each for its ``sweep.quick_s``, else :data:`QUICK_SWEEP_S`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from mrclab.controller.dataplanes import available, here
from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.emulation.nodes import need_root
from mrclab.emulation.placement import Cluster, open_cluster
from mrclab.experiments.analysis.expectations import verdict_word
from mrclab.experiments.analysis.regime import describe as describe_regime
from mrclab.experiments.model.scenario import SCENARIO_DIR, Scenario, load_scenario
from mrclab.experiments.model.sweepspec import size_suffix
from mrclab.experiments.run import runner
from mrclab.experiments.run.repeat import figure, run_repeated
from mrclab.experiments.run.results import results_folder
from mrclab.topologies.errors import BadInput, MrclabError, NotAvailable
from rich.console import Console

console = Console(highlight=False)
#: the paper's results, in its order: failures (figs. 5-13), congestion (14, 18), collectives (16-17), the
#: permutation test (fig. 20)
ORDER = ("nic-links-one-by-one", "nic-links-flap", "t0t1-links-one-by-one", "t0t1-links-flap", "t0-down",
         "quickstart", "t1-blackhole", "transceiver-flap", "flap-soak", "ev-loss", "ecn-load-balancing", "incast",
         "incast-no-trim", "fig16-allreduce", "fig17-alltoall", "permutation")
#: A sweep point's length with ``--quick`` (s) where the sweep sets no ``quick_s`` (both shipped
#: sweeps set theirs). At 6 s the weakest point (fig. 16's MRC held to one path, 1% loss, 128 KiB:
#: about 2 s an iteration) finished one iteration of the two its expectations ask for in one CI run.
QUICK_SWEEP_S = 8.0


def _headline(verdicts: list[dict], metric: str | None = None) -> dict | None:
    if metric is not None:
        for v in verdicts:
            if v["metric"] == metric:
                return v
    bounded = [v for v in verdicts if v["passed"] is not None]
    return (bounded or verdicts)[0] if verdicts else None


def _fmt(v: dict | None) -> str:
    if v is None:
        return "-"
    val = figure(v)
    return f"{v['metric']} {val}" + (f" ({v['bound']})" if v["bound"] != "reported" else "")


def _choose(scn: Scenario, dataplane: str | None, remote: bool = False) -> tuple[str | None, str]:
    """The data plane a scenario runs on here (``remote``: over servers), or None and why not."""
    want = [dataplane] if dataplane else [p.name for p in here()]
    needs = set(scn.needs) | ({"gray_loss"} if scn.sweep is not None and any(x > 0 for x in scn.sweep.loss) else set())
    for dp in want:
        if resolve(dp).missing():
            continue
        if needs <= available(dp, remote):
            return dp, ""
    return None, f"needs {', '.join(sorted(needs))}, which {' / '.join(want)} cannot do " + \
        ("over servers" if remote else "here")


def _prior(folder: Path, dataplane: str | None, quick: bool, repeat: int) -> dict:
    """The summary of the report in ``folder`` that ``--update`` re-runs rows into. Raises
    :class:`BadInput` when there is none, or it was made with other settings (its rows would not
    compare with the new ones)."""
    f = folder / "summary.json"
    if not f.is_file():
        raise BadInput(f"--update {folder}: no report there (no summary.json); "
                       "allowed: a folder mrclab reproduce wrote")
    s = json.loads(f.read_text())
    have = (s.get("dataplane"), bool(s.get("quick")), int(s.get("repeat", 1)))
    want = (dataplane or "best available", quick, repeat)
    if have != want:
        raise BadInput(f"--update {folder}: that report was made with dataplane {have[0]}, quick {have[1]}, repeat "
                       f"{have[2]}; allowed: the same settings (asked: {want[0]}, quick {want[1]}, repeat {want[2]})")
    return s


def _supersede(out: Path, name: str, stamp: str) -> None:
    """Move a row's earlier runs and plots out of the way, into ``superseded/<stamp>/`` (nothing is
    deleted)."""
    dest = out / "superseded" / stamp
    for p in [out / name, out / f"{name}-mrc", out / f"{name}-roce", *(out / "plots").glob(f"{name}*.png")]:
        if p.exists():
            (dest / p.parent.relative_to(out)).mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), str(dest / p.relative_to(out)))


def reproduce(out: Path | None = None, *, dataplane: str | None = None, quick: bool = False,
              only: list[str] | None = None, live: bool = False, repeat: int = 1, update: Path | None = None,
              cluster: Cluster | None = None) -> dict:
    """Run the table (see the module docstring); returns the summary (also ``summary.json``).
    ``update``: an earlier report's folder (same data plane, quick and repeat) to re-run ``only``'s
    rows into: each new row replaces the old one, whose runs move to ``superseded/`` and whose row
    stays in the summary's ``superseded`` list (the report says which rows were re-run). ``cluster``:
    every row's planes on those servers (rows that need what servers lack are skipped, saying so)."""
    names = list(only or ORDER)
    unknown = [n for n in names if not (SCENARIO_DIR / f"{n}.yaml").exists()]
    if unknown:
        raise BadInput(f"no shipped scenario {', '.join(unknown)}; allowed: {', '.join(ORDER)}")
    if update is not None and out is not None:
        raise BadInput("--out and --update both given; allowed: one of them (--update writes into the report it names)")
    prior = _prior(Path(update), dataplane, quick, repeat) if update is not None else None
    out = Path(update) if update is not None else results_folder(out, "reproduce")
    (out / "plots").mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rows, t_start = [], time.monotonic()
    prov = provenance()  # the code that runs: read before the first row, not after the last (a commit made
    # meanwhile, or a file edited, would otherwise name code the rows never ran)
    for k, name in enumerate(names, 1):
        base = load_scenario(name)
        dur = ((base.sweep.quick_s or QUICK_SWEEP_S) if base.sweep is not None else base.quick_s) if quick else None
        dp, why = _choose(base, dataplane, remote=cluster is not None)
        elapsed = time.monotonic() - t_start
        console.print(f"[bold cyan]reproduce {k}/{len(names)}[/bold cyan] {name} "
                      f"({'skipped' if dp is None else dp}; {elapsed:.0f} s so far)")
        row: dict[str, Any] = {"scenario": name, "claim": base.paper, "dataplane": dp}
        if dp is None:
            rows.append({**row, "verdict": "skipped", "why": why})
            continue
        if prior is not None:
            _supersede(out, name, stamp)
            row["rerun"] = stamp
            row["commit"] = prov["commit"]
        try:
            row.update(_run_row(name, base, dur, dp, out, live, repeat, cluster))
        except NotAvailable as e:  # this machine could not run it (endpoints not ready in time, too slow): void
            row.update({"verdict": "void", "why": e.one_line(), "plots": []})
        except MrclabError as e:  # a crash (an endpoint died, a controller error): an error, never void
            row.update({"verdict": "error", "why": e.one_line(), "plots": []})
        rows.append(row)
        console.print(f"  -> {row['verdict']}{' (' + str(row['why']) + ')' if row.get('why') else ''}: "
                      f"MRC {row.get('mrc', '-')}")
        # after every row: an interrupted table keeps its rows
        _write(out, rows, dataplane, quick, t_start, repeat, prior, prov)
    summary = _write(out, rows, dataplane, quick, t_start, repeat, prior, prov)
    console.print(f"report: {out / 'report.md'} ({sum(r['verdict'] == 'pass' for r in rows)} pass, "
                  f"{sum(r['verdict'] == 'FAIL' for r in rows)} fail, "
                  f"{sum(r['verdict'] == 'error' for r in rows)} error, "
                  f"{sum(r['verdict'] == 'void' for r in rows)} void, "
                  f"{sum(r['verdict'] == 'skipped' for r in rows)} skipped, {summary['elapsed_s']:.0f} s)")
    return summary


def _write(out: Path, rows: list[dict], dataplane: str | None, quick: bool, t_start: float, repeat: int = 1,
           prior: dict | None = None, prov: dict | None = None) -> dict:
    """summary.json and report.md of the rows so far (merged into ``prior``'s, a report being
    updated: rows in table order, the replaced ones kept under ``superseded``), headed with
    ``prov`` (:func:`provenance` as the run began; read now without it); returns the summary."""
    prov = prov or provenance()
    elapsed = round(time.monotonic() - t_start, 1)
    superseded = []
    if prior is not None:
        new = {r["scenario"]: r for r in rows}
        superseded = prior.get("superseded", []) + [r for r in prior["rows"] if r["scenario"] in new]
        merged = {r["scenario"]: r for r in prior["rows"]} | new
        rows = sorted(merged.values(),
                      key=lambda r: ORDER.index(r["scenario"]) if r["scenario"] in ORDER else len(ORDER))
        elapsed += prior.get("elapsed_s", 0.0)
    summary = {"dataplane": dataplane or "best available", "quick": quick, "repeat": repeat, "rows": rows,
               "elapsed_s": elapsed, "superseded": superseded,
               # the header names the run that made the table; an update keeps it (each re-run row
               # names its own commit), or the header would name code most rows never ran
               **({k: prior[k] for k in ("commit", "machine") if k in prior} if prior is not None else prov),
               "passed": all(r["verdict"] != "FAIL" for r in rows),
               "errors": sum(r["verdict"] == "error" for r in rows),
               "void": sum(r["verdict"] == "void" for r in rows)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=_json))
    (out / "report.md").write_text(report_md(summary))
    return summary


def _row_verdict(runs: dict[str, dict]) -> tuple[str, str | None]:
    """A row's verdict from its runs' metrics (``{"mrc": metrics, "roce": metrics}``): FAIL, with
    the expectations that failed, when a verdict decided outside every fidelity fault failed; void
    (with the first reason) when one was void; else pass."""
    ms = list(runs.values())
    if any(m["passed"] is False for m in ms):
        return "FAIL", "; ".join(f"{tr.upper()} {v['expectation']} = {figure(v)} ({v['bound']})"
                                 + (f": {v['evidence']}" if v.get("evidence") else "")
                                 for tr, m in runs.items() for v in m["expectations"]
                                 if v["passed"] is False and not v.get("void"))
    voids = [v["void"] for m in ms for v in m["expectations"] if v.get("void")]
    return ("void", voids[0]) if voids else ("pass", None)


def _point_text(p: dict) -> str:
    """A sweep point in a report row: ``<variant> @ <loss>[, <size>]: busbw <x> Mb/s``."""
    size = size_suffix(p.get("message_bytes"))
    return f"{p['variant']} @ {p['loss']:g}{size}: busbw {p['busbw_mbps']:.2f} Mb/s"


def _run_row(name: str, base: Scenario, dur: float | None, dp: str, out: Path, live: bool, repeat: int = 1,
             cluster: Cluster | None = None) -> dict:
    """Run one row (MRC and RoCE, each ``repeat`` times with seeds 1..N; or the sweep once, a point
    the machine voided re-run with the next seed, up to ``repeat`` runs) and return its figures
    (median [min-max] when repeated) and verdict."""
    row: dict = {}
    if base.sweep is not None:
        scn = load_scenario(name, duration_s=dur, dataplane=dp)
        # --quick (a length given): only the points the claims read
        res = runner.run_sweep(scn, out / name, live=live, cluster=cluster, tries=repeat, claimed=dur is not None)
        shutil.copy2(out / name / "sweep.png", out / "plots" / f"{name}.png")
        mrc = [p for p in res["points"] if p["transport"] == "mrc"]
        roce = [p for p in res["points"] if p["transport"] == "roce"]
        row.update({
            "mrc": "; ".join(_point_text(p) for p in mrc), "roce": "; ".join(_point_text(p) for p in roce),
            "verdict": "void" if res["passed"] is None else verdict_word(res["passed"]),
            "claims": res["claims"], **({"why": res["void"]} if res["passed"] is None else {}),
            **({} if res["passed"] is not False else {"why": "; ".join(
                [f"{_point_text(p)}: expectations not met" for p in res["points"] if p["passed"] is False]
                + [f"{c['claim']} = {c['value']:.2f} ({c['bound']})" for c in res["claims"] if c["passed"] is False])}),
            "points": res["points"], "plots": [f"plots/{name}.png"]})
    else:
        runs = {}
        for tr in ("mrc", "roce"):
            scn = load_scenario(name, duration_s=dur, dataplane=dp, transport=tr)
            if repeat > 1:
                runs[tr] = run_repeated(lambda k, tr=tr: load_scenario(name, duration_s=dur, dataplane=dp, transport=tr,
                                                                       seed=k), repeat, out / f"{name}-{tr}",
                                        f"{name}-{tr}", live=live, cluster=cluster)
                shutil.copy2(out / f"{name}-{tr}" / "seed-1" / "goodput.png", out / "plots" / f"{name}-{tr}.png")
            else:
                runs[tr] = runner.run(scn, out / f"{name}-{tr}", live=live, cluster=cluster)
                shutil.copy2(out / f"{name}-{tr}" / "goodput.png", out / "plots" / f"{name}-{tr}.png")
        h_mrc = _headline(runs["mrc"]["expectations"])
        h_roce = _headline(runs["roce"]["expectations"], h_mrc["metric"] if h_mrc else None)
        verdict, why = _row_verdict(runs)
        row.update({"mrc": _fmt(h_mrc), "roce": _fmt(h_roce), "verdict": verdict,
                    "regime": runs["mrc"].get("regime"),
                    "expectations": {tr: m["expectations"] for tr, m in runs.items()},
                    "plots": [f"plots/{name}-mrc.png", f"plots/{name}-roce.png"]})
        if why:
            row["why"] = why
    return row


def provenance() -> dict:
    """``{commit, machine}`` of this run: the repository's commit (``git describe --always --dirty``;
    None outside a checkout) and the machine (``<cores> cores, <GiB> GiB, <CPU model>, <kernel>``),
    so that a report says what produced it."""
    try:
        commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, timeout=10, check=False).stdout.strip() or None
    except OSError:
        commit = None
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.machine())
    return {"commit": commit, "machine": f"{os.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB, {model}, Linux {platform.release()}"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _json(x):
    return None if isinstance(x, float) and math.isinf(x) else str(x)


def report_md(s: dict) -> str:
    """The report: one row per paper result, then each row's detail."""
    lines = ["# mrclab: the MRC paper's results, reproduced", "",
             f"Commit {s.get('commit') or 'unknown'}; machine: {s.get('machine') or 'unknown'}.", "",
             f"Data plane: {s['dataplane']}; {'quick (compressed timelines)' if s['quick'] else 'full timelines'}; "
             f"{s['elapsed_s']:.0f} s" + (f"; every run {s['repeat']} times (seeds 1..{s['repeat']}): figures are "
             "median [min-max] of the runs that decided it, a verdict holds when that median meets it and more than "
             "half of the runs decided it; a sweep's points run once, a point the machine voided again with the "
             f"next seed, up to {s['repeat']} runs" if s.get("repeat", 1) > 1
             else "") + ". Each row: the paper's claim, the measured MRC and RoCE figures (the "
             "scenario's headline expectation) and the verdict (MRC's and RoCE's expectations, or the sweep's "
             "claims, all met).", ""]
    reruns = [r for r in s["rows"] if r.get("rerun")]
    if reruns:
        lines += ["Rows re-run into this report later (`mrclab reproduce --update`): "
                  + ", ".join(f"{r['scenario']} ({r['rerun']}, commit {r.get('commit') or 'unknown'}; "
                              f"before: {old['verdict']})" for r in reruns
                              for old in [next((o for o in reversed(s.get("superseded", []))
                                                if o["scenario"] == r["scenario"]), {"verdict": "-"})])
                  + ". Their earlier runs are in `superseded/`.", ""]
    lines += ["| scenario | the paper's claim | MRC | RoCE | verdict |", "| --- | --- | --- | --- | --- |"]
    for r in s["rows"]:
        verdict = f"{r['verdict']} ({r['why']})" if r.get("why") else r["verdict"]
        lines.append(f"| {r['scenario']} | {r['claim']} | {r.get('mrc', '-')} | {r.get('roce', '-')} | {verdict} |")
    for r in s["rows"]:
        if r["verdict"] == "skipped" or not r.get("plots") and "expectations" not in r and "claims" not in r:
            continue
        lines += ["", f"## {r['scenario']} ({r['dataplane']})", "", r["claim"], ""]
        lines += [f"![{p}]({p})" for p in r["plots"]]
        if r.get("regime"):
            lines += ["", describe_regime(r["regime"]) + "."]
            lines += [f"- weakens: {w}" for w in r["regime"]["weakens"]]
        if "claims" in r:
            lines += ["", "| claim | value | bound | verdict |", "| --- | --- | --- | --- |"]
            lines += [f"| {c['claim']} | {c['value']:.2f} | {c['bound']} | "
                      f"{verdict_word(c['passed'], void=c.get('void'))} |" for c in r["claims"]]
        for tr, exps in r.get("expectations", {}).items():
            lines += ["", f"{tr.upper()}:", "", "| expectation | value | bound | verdict |",
                      "| --- | --- | --- | --- |"]
            for v in exps:
                val = figure(v)
                lines.append(f"| {v['expectation']} | {val} | {v['bound']} | "
                             f"{verdict_word(v['passed'], void=v.get('void'))} |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    """``mrclab reproduce``: errors propagate to the command line's one error boundary."""
    need_root("mrclab reproduce")
    with open_cluster(getattr(args, "servers", None), getattr(args, "ssh_config", None)) as cluster:
        s = reproduce(Path(args.out) if args.out else None, dataplane=args.dataplane, quick=args.quick,
                      only=args.only, live=False, repeat=args.repeat, update=getattr(args, "update", None),
                      cluster=cluster)
    return 1 if not s["passed"] else 2 if s.get("errors") else 3 if s["void"] else 0
