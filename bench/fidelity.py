"""``mrclab bench fidelity``: how much starvation moves a verdict, and when the monitor calls it.

A lab's fidelity monitor (experiments/analysis/fidelity.py) must speak when, and only when, the machine took
enough time from the emulation to change a verdict. This benchmark measures both sides. It runs a
scenario (the quickstart and incast by default, at their ``quick_s``) several times untouched, for
each verdict's run-to-run spread, then once per injected starvation level: from t = :data:`FROM_S`
to the end of the run every process of one kind (the endpoints, or on bmv2 the switches) is put in
a CPU cgroup whose quota lets it run ``Q`` ms of every ``P`` ms period, so that each time the group
used its quota it waits the rest of the period, ``P - Q`` ms, for a CPU: the *injected wait*. The
kernel counts that wait as run-queue delay, as it does a wait behind other processes (CFS bandwidth
control, Documentation/scheduler/sched-bwc.rst), so the monitor sees what it would see on a busy
machine.

Printed per scenario: for each level, the injected wait, the worst scheduling delay per run the
monitor measured on the starved processes (ms), on bmv2 the drain watch's reading from the first
starved second (packets that left a switch port more than a frame time after their shaper's
schedule, the latest in ms, and the largest share they were of one port's departures in a sample
interval: experiments/analysis/fidelity.py ``LATE_SHARE_MAX`` is set from it), the drain watch's
readings of linux's switch ports and the NIC ports from then (how many stood behind their shaper's
schedule, of how many, and the most one fell further behind between two readings, in the port's
frames: ``BEHIND_FRAMES_MAX``), the monitor's call
(``silent``, or how many verdicts it voided and for what), and each bounded verdict's value as the
transport made it (read as if no fault had met it: every window whole, nothing left out; a void
verdict's own figure reads only what the faults left, 0 where they took all), marked ``*`` where it
lies outside the untouched runs' spread (their [min, max] widened by half its width each way, and by
2% of the median at least: two runs of the same seed differ by that much). The first level with a
moved verdict is where the monitor must speak; every level below it is where it must stay silent.
``--markdown`` prints the tables for docs/benchmarks.md, headed with date, machine and commit.

cgroup v1 (``/sys/fs/cgroup/cpu``: ``cpu.cfs_period_us``, ``cpu.cfs_quota_us``) or v2 (a hierarchy
with the cpu controller: ``cpu.max``); the kernel's least period and quota is 1 ms.

``--target nic`` holds the drain of every host NIC port instead, as a kernel whose softirq fell
behind (or a CPU the hypervisor took) does: from t = :data:`FROM_S`, each second, each host's NIC
shapers are set to a trickle for ``D`` ms and back to their rate (emulation/network.py
``reshape_nics``; tbf keeps its queue), so a backlogged port loses ``D`` ms of drain a second and
its queue stands that much further behind its schedule (:data:`NIC_LEVELS`). ``seen`` is then the
drain watch's most fallen behind between two readings, in ms: where it sits against the first level
that moved a verdict is where ``BEHIND_FRAMES_MAX`` and its floor belong.

``--target steal`` injects nothing (a guest cannot take its own CPUs the way its hypervisor does):
it runs each scenario :data:`STEAL_RUNS` times untouched, at its full length, and bins each second
of steady traffic (a second or more from every scripted fault) by the share of the machine's CPU
time the hypervisor took in it (``fidelity.csv``), printing per bin the seconds and their goodput
over the run's baseline (median, tenth percentile, least): where that leaves the lowest bin's spread
is where ``STEAL_SHARE_MAX`` belongs (:func:`steal_bins` reads runs already made as well).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mrclab.bench.tables import header, run_scenario
from mrclab.controller.dataplanes import DATAPLANES, available, here
from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.emulation import kernel
from mrclab.experiments.analysis.expectations import evaluate, verdict_word
from mrclab.experiments.model.claims import NEVER_VOID
from mrclab.experiments.model.scenario import load_scenario
from mrclab.experiments.run.results import results_folder
from mrclab.topologies.errors import BadInput, NotAvailable
from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)  # a log keeps whole rows
progress = Console(stderr=True, highlight=False)
#: The starvation starts here (s from t = 0) and lasts to the end of the run: after the first
#: second, so that every window a verdict reads (its baseline too) is starved throughout.
FROM_S = 1.0
#: (period ms, quota ms) of each level: injected waits of 0.25, 0.5, 1, 2 and 4 ms per period (the
#: kernel's least period and quota are 1 ms, so the group runs 80% of a core at the first level and
#: 20% at the last). The first run of the quickstart on linux moved verdicts at a 1 ms wait (the
#: monitor saw 1.0 ms per run), against 0.10-0.15 ms untouched, so the levels go below it.
LEVELS = ((1.25, 1.0), (1.5, 1.0), (2.0, 1.0), (3.0, 1.0), (5.0, 1.0))
#: ``--target nic``: (period ms, drained ms) of each level, the NICs held for the rest of each
#: period: 5, 10, 20, 40 and 80 ms of every second (the drain watch reads about once a second)
NIC_LEVELS = ((1000.0, 995.0), (1000.0, 990.0), (1000.0, 980.0), (1000.0, 960.0), (1000.0, 920.0))
#: A held NIC's rate: a trickle (a 1 KiB frame in a second and more)
TRICKLE = "8kbit"
SCENARIOS = ("quickstart", "incast")
#: Untouched runs per scenario, for each verdict's spread.
BASELINE_RUNS = 3
#: The spread a moved verdict lies outside: [min, max] of the untouched runs widened by this share
#: of its width on each side, and by :data:`SPREAD_MIN_SHARE` of the median at least.
SPREAD_WIDEN = 0.5
SPREAD_MIN_SHARE = 0.02
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")


@dataclass(frozen=True)
class Level:
    """One starvation level: the group runs ``quota_ms`` of every ``period_ms`` (0, 0: untouched)."""

    period_ms: float = 0.0
    quota_ms: float = 0.0

    @property
    def wait_ms(self) -> float:
        """The wait for a CPU each period once the quota is used (ms)."""
        return self.period_ms - self.quota_ms

    def label(self) -> str:
        """``none`` or ``4 ms (1 of 5 ms)``."""
        return "none" if not self.period_ms else f"{self.wait_ms:g} ms ({self.quota_ms:g} of {self.period_ms:g} ms)"


def _cgroup_root() -> tuple[Path, str]:
    """(the cpu hierarchy's root, ``v1`` or ``v2``); NotAvailable where neither is mounted writable."""
    if (CGROUP_V1 / "cpu.cfs_quota_us").exists() and os.access(CGROUP_V1, os.W_OK):
        return CGROUP_V1, "v1"
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        ctl = root / "cgroup.controllers"
        if ctl.exists() and "cpu" in ctl.read_text().split() and os.access(root, os.W_OK):
            return root, "v2"
    raise NotAvailable("bench fidelity needs a writable CPU cgroup (cgroup v1 /sys/fs/cgroup/cpu, or v2 with the "
                       "cpu controller): none here")


@contextlib.contextmanager
def throttled_group(level: Level) -> Iterator[Path]:
    """A CPU cgroup of its own that runs ``level.quota_ms`` of every ``level.period_ms``; yields its
    folder (write a pid to its ``cgroup.procs`` to starve that process). Every process still in it
    is moved back to the root group and the group removed on the way out, however it ends."""
    root, version = _cgroup_root()
    group = root / f"mrclab-bench-fidelity-{os.getpid()}"
    group.mkdir()
    try:
        if version == "v1":
            (group / "cpu.cfs_period_us").write_text(str(int(level.period_ms * 1000)))
            (group / "cpu.cfs_quota_us").write_text(str(int(level.quota_ms * 1000)))
        else:
            (root / "cgroup.subtree_control").write_text("+cpu")
            (group / "cpu.max").write_text(f"{int(level.quota_ms * 1000)} {int(level.period_ms * 1000)}")
        yield group
    finally:
        release(group, root)
        with contextlib.suppress(OSError):
            group.rmdir()


def release(group: Path, root: Path) -> None:
    """Move every process of ``group`` back to ``root`` (the ones gone already are skipped)."""
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)


class Starver:
    """``on_start`` for :func:`mrclab.experiments.run.runner.run_with_data`: at t = :data:`FROM_S` it
    moves the run's processes of ``target`` (``endpoint`` or ``switch``) into ``group``; they stay
    there to the end of the run."""

    def __init__(self, group: Path | None, target: str) -> None:
        """Starve the ``target`` processes in ``group`` (None: leave them alone)."""
        self.group, self.target = group, target
        self.pids: list[int] = []

    def __call__(self, watched: dict[str, int], t0: float, fab=None) -> None:
        """Start the timer that starves the watched processes of the target kind."""
        self.pids = [pid for label, pid in watched.items() if label.startswith(self.target)]
        if self.group is not None:
            threading.Thread(target=self._starve, args=(t0,), daemon=True, name="mrclab-starver").start()

    def _starve(self, t0: float) -> None:
        time.sleep(max(0.0, t0 + FROM_S - time.monotonic()))
        assert self.group is not None
        for pid in self.pids:
            with contextlib.suppress(OSError):
                (self.group / "cgroup.procs").write_text(str(pid))


class NicHolder:
    """``on_start`` for :func:`mrclab.experiments.run.runner.run_with_data` with ``--target nic``:
    from t = :data:`FROM_S` to the end of the run, each ``level.period_ms``, every host's NIC ports
    are held (a trickle, :data:`TRICKLE`) for ``level.wait_ms`` and then set back to their rate,
    through a ``tc`` left running in each host's namespace (emulation/kernel.py ``TcStream``: a
    line takes effect within about 2 ms, where a tc process each time took 20-40 ms to start).
    ``held_ms``: each hold, from the first host's trickle written to the last host's rate written."""

    def __init__(self, level: Level) -> None:
        """Hold the NICs at ``level`` (untouched: do nothing)."""
        self.level = level
        self.held_ms: list[float] = []
        self.stopped = threading.Event()

    def __call__(self, watched: dict[str, int], t0: float, fab=None) -> None:
        """Start the thread that holds the fabric's NICs from t = FROM_S."""
        if self.level.period_ms and fab is not None:
            threading.Thread(target=self._hold, args=(t0, fab), daemon=True, name="mrclab-nic-holder").start()

    def _hold(self, t0: float, fab) -> None:
        emu = fab.emu
        hosts = list(fab.spec.hosts())
        hold = [(kernel.TcStream(emu.netns(h)), "\n".join(emu.nic_shaper_lines(h, TRICKLE)) + "\n",
                 "\n".join(emu.nic_shaper_lines(h, fab.spec.link.bandwidth_mbps)) + "\n") for h in hosts]
        period, wait = self.level.period_ms / 1e3, self.level.wait_ms / 1e3
        nxt = t0 + FROM_S
        try:
            while not self.stopped.is_set():
                time.sleep(max(0.0, nxt - time.monotonic()))
                start = time.monotonic()
                for tc, trickle, _ in hold:
                    tc.write(trickle)
                time.sleep(max(0.0, start + wait - time.monotonic()))
                for tc, _, rate in hold:
                    tc.write(rate)
                self.held_ms.append((time.monotonic() - start) * 1e3)
                nxt += period
        except (OSError, ValueError):  # the run ended and its fabric went: nothing left to hold
            pass
        finally:
            for tc, _, _ in hold:
                tc.close()


def one(name: str, dp: str, level: Level, target: str, out: Path, seed: int = 1) -> dict:
    """One run of scenario ``name`` on ``dp`` at ``level`` (starving ``target``) into ``out`` (its
    printout in ``out.log``): ``{level, values (expectation -> value), verdicts (expectation ->
    pass / FAIL / void), seen_ms (the worst scheduling delay per run of the starved kind, ms),
    faults (invariant -> count)}``."""
    base = load_scenario(name)
    scn = load_scenario(name, duration_s=base.quick_s, dataplane=dp, seed=seed)
    cpu = level.period_ms and target != "nic"
    with throttled_group(level) if cpu else contextlib.nullcontext() as group, \
            open(f"{out}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        starver = NicHolder(level) if target == "nic" else Starver(group, target)
        try:
            m, data = run_scenario(scn, out, on_start=starver)
        finally:
            if isinstance(starver, NicHolder):
                starver.stopped.set()
    held = statistics.median(starver.held_ms) if isinstance(starver, NicHolder) and starver.held_ms else None
    # the verdicts a fault can move: bounded, and not correctness (a count of messages delivered is
    # throughput, and whether they are intact never depends on the machine)
    bounded = [v for v in m["expectations"] if v["bound"] != "reported" and v["metric"] not in NEVER_VOID]
    late = [x for x in data.late_departures() if x.t > FROM_S]  # the drain watch (bmv2), while starved
    behind, readings = data.behind_schedule()  # ... on linux's switch ports and the NIC ports
    behind = [x for x in behind if x.t > FROM_S]
    if target == "nic":  # the drain watch's most fallen behind on the held NICs between readings
        seen = max((x.grew_s for x in behind if " NIC port " in x.place), default=0.0)
    else:
        seen = max((d for _t, label, d, _w, _s in data.run_delays if label.startswith(target)), default=0.0)
    faults: dict[str, int] = {}
    for f in m["fidelity_faults"]:
        faults[f["invariant"]] = faults.get(f["invariant"], 0) + 1
    # what the transport did, read as if the machine had kept up: every window whole, nothing left
    # out (a void verdict's own value reads only what the faults left, 0 where they took it all)
    whole = dataclasses.replace(data, fidelity_windows=[])
    values = {x.describe(): evaluate(whole, x.metric, x.args)[0] for x in scn.expect}
    return {"level": level, "values": {v["expectation"]: _finite(values[v["expectation"]]) for v in bounded},
            "verdicts": {v["expectation"]: verdict_word(v["passed"], void="void" if v.get("void") else None)
                         for v in bounded},
            "void": len(m["void"]), "of": len(bounded), "seen_ms": seen * 1e3, "faults": faults, "held_ms": held,
            "late": (sum(x.late for x in late), max((x.most_s for x in late), default=0.0) * 1e3,
                     max((x.late / max(1, x.sent) for x in late), default=0.0))
            if data.ports and "late" in data.ports[0] else None,
            "behind": (len(behind), readings, max((x.grew_s / x.frame_s for x in behind), default=0.0))
            if readings else None}


#: Untouched runs per scenario for ``--target steal``: the hypervisor takes what it takes, so the
#: bins fill only over many runs (10 quickstarts held 2-6 seconds in each bin over 0.2).
STEAL_RUNS = 10
#: The bins' width, a share of the machine's CPU time.
STEAL_BIN = 0.1


def steal_bins(folders: list[Path], bin_width: float = STEAL_BIN) -> list[dict]:
    """Each second of steady traffic in the runs' results ``folders`` (``timeseries.csv``,
    ``fidelity.csv``, ``events.csv``), binned by the share of the machine's CPU time the hypervisor
    took in it: ``[{lo, hi (shares), seconds, median, p10, least (goodput over the run's
    baseline)}]``, lowest bin first, empty bins left out. A run's baseline is its median goodput over
    the seconds before its first scripted fault (every second of it without one); a second within one
    of a scripted fault is not steady, and the first second never is. CPUs: this machine's. Raises
    FileNotFoundError for a folder without those files."""
    import csv
    import psutil

    cpus = psutil.cpu_count() or 1
    got: dict[int, list[float]] = {}
    for f in folders:
        per_s: dict[int, list[float]] = {}
        for r in csv.DictReader(open(f / "timeseries.csv")):
            per_s.setdefault(int(float(r["t_s"])), []).append(float(r["goodput_mbps"]))
        took: dict[int, float] = {}
        for r in csv.DictReader(open(f / "fidelity.csv")):
            # (runs before steal was judged wrote "... the CPU (recorded only)")
            if r["invariant"].startswith("share of the interval the hypervisor took the CPU"):
                t, share, span = float(r["t_s"]), float(r["value"]), float(r["interval_s"] or 0.25)
                took[int(t - span / 2)] = took.get(int(t - span / 2), 0.0) + share * span
        faults = [float(r["t"]) for r in csv.DictReader(open(f / "events.csv")) if r["kind"] == "fault"]
        mean = {sec: sum(v) / len(v) for sec, v in per_s.items() if len(v) >= 5}
        before = [v for sec, v in mean.items() if sec >= 1 and (not faults or sec + 1 <= min(faults))]
        if not before:
            continue
        base = statistics.median(before)
        for sec, rate in mean.items():
            if sec < 1 or any(x - 1 <= sec + 0.5 <= x + 2 for x in faults) or base <= 0:
                continue
            got.setdefault(int(took.get(sec, 0.0) / cpus / bin_width + 1e-9), []).append(rate / base)
    out = []
    for k in sorted(got):
        v = sorted(got[k])
        out.append({"lo": round(k * bin_width, 2), "hi": round((k + 1) * bin_width, 2), "seconds": len(v),
                    "median": statistics.median(v), "p10": v[len(v) // 10], "least": v[0]})
    return out


def steal_table(name: str, dp: str, bins: list[dict], markdown: bool) -> str | None:
    """Print (or, with ``markdown``, return) :func:`steal_bins`' table for ``name`` on ``dp``."""
    head = ["machine's CPU stolen", "seconds", "goodput / baseline, median", "tenth percentile", "least"]
    rows = [[f"{b['lo']:.1f}-{b['hi']:.1f}", str(b["seconds"]), f"{b['median']:.3f}", f"{b['p10']:.3f}",
             f"{b['least']:.3f}"] for b in bins]
    if markdown:
        lines = [f"**{name} on {dp}**, {STEAL_RUNS} untouched runs, each second of steady traffic:", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    t = Table(title=f"{name} on {dp}: goodput per second against the CPU the hypervisor took")
    for h in head:
        t.add_column(h)
    for r in rows:
        t.add_row(*r)
    console.print(t)
    return None


def _finite(v: float) -> float | None:
    return None if math.isinf(v) else v


def spread(values: list[float | None]) -> tuple[float, float] | None:
    """The band a verdict's untouched values span (:data:`SPREAD_WIDEN`, :data:`SPREAD_MIN_SHARE`);
    None when a value was infinite (no band)."""
    if any(v is None for v in values) or not values:
        return None
    xs = [float(v) for v in values if v is not None]
    lo, hi, med = min(xs), max(xs), statistics.median(xs)
    pad = max(SPREAD_WIDEN * (hi - lo), SPREAD_MIN_SHARE * abs(med))
    return lo - pad, hi + pad


def moved(value: float | None, band: tuple[float, float] | None) -> bool:
    """Whether ``value`` lies outside ``band`` (None: an infinite value against a finite band)."""
    if band is None:
        return False
    return value is None or not band[0] <= value <= band[1]


def table(name: str, dp: str, target: str, rows: list[dict], markdown: bool) -> str | None:
    """Print (or with ``markdown`` return) one scenario's table; the first level that moved a verdict
    and the first the monitor voided are stated below it."""
    exps = list(rows[0]["values"])
    bands = {e: spread([r["values"][e] for r in rows if not r["level"].period_ms]) for e in exps}
    watched = any(r.get("late") is not None for r in rows)
    drain_head = ["late departures (worst ms; largest share of a port's in a second)"] if watched else []
    read_behind = any(r.get("behind") is not None for r in rows)
    drain_head += ["readings behind schedule (of all; most fallen behind in frames)"] if read_behind else []
    nic = target == "nic"
    head = ["NIC held a second" if nic else "injected wait", "fallen behind (ms)" if nic else "seen (ms)",
            *drain_head, "monitor", *exps]
    body = []
    first_moved = first_called = None
    for r in rows:
        lvl: Level = r["level"]
        cells = []
        any_moved = False
        for e in exps:
            v = r["values"][e]
            mv = bool(lvl.period_ms) and moved(v, bands[e])
            any_moved |= mv
            cells.append(("inf" if v is None else f"{v:.3g}") + ("*" if mv else ""))
        call = "silent" if not r["void"] else f"void {r['void']}/{r['of']} (" + ", ".join(
            f"{k} x{n}" for k, n in r["faults"].items()) + ")"
        if lvl.period_ms and any_moved and first_moved is None:
            first_moved = lvl.wait_ms
        if lvl.period_ms and r["void"] and first_called is None:
            first_called = lvl.wait_ms
        late = r.get("late")
        drain = ([f"{late[0]} ({late[1]:.1f}; {late[2]:.0%})" if late else "-"] if watched else [])
        b = r.get("behind")
        drain += ([f"{b[0]} of {b[1]} ({b[2]:.2f})" if b else "-"] if read_behind else [])
        held = r.get("held_ms")
        label = ((f"{lvl.wait_ms:g} ms" + (f" ({held:.1f} held)" if held else "")) if lvl.period_ms else "none") \
            if nic else lvl.label()
        body.append([label, f"{r['seen_ms']:.2f}", *drain, call, *cells])
    verdict = (f"first level that moved a verdict: {first_moved:g} ms" if first_moved is not None else
               "no level moved a verdict") + "; " + (f"first the monitor voided: {first_called:g} ms"
                                                     if first_called is not None else "the monitor never voided")
    title = (f"{name} on {dp}, every host's NIC ports held from {FROM_S:g} s" if nic else
             f"{name} on {dp}, {target}s starved from {FROM_S:g} s")
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        lines += ["| " + " | ".join(c) + " |" for c in body]
        return "\n".join(lines + ["", verdict + ".", ""])
    t = Table(title=title)
    for c in head:
        t.add_column(c, justify="right" if c != "monitor" else "left")
    for c in body:
        t.add_row(*c)
    console.print(t)
    console.print(verdict)
    return None


def main(args=None) -> int:
    """``mrclab bench fidelity [--dataplane D] [--target endpoint|switch] [--only S ...] [--markdown]``:
    the tables above. Returns 0; raises BadInput for a target the data plane has no process of and
    NotAvailable without a CPU cgroup or data plane."""
    dps = getattr(args, "dataplane", None) or [here()[0].name]
    target = getattr(args, "target", None) or "endpoint"
    names = getattr(args, "only", None) or list(SCENARIOS)
    markdown = bool(getattr(args, "markdown", False))
    if target not in ("nic", "steal"):
        _cgroup_root()  # refuse before any run
    folder = results_folder(Path(args.out) if getattr(args, "out", None) else None, "bench-fidelity")
    out_md = []
    if markdown:
        out_md.append(header() + "\n")
    for dp in dps:
        plane = resolve(dp)
        if target == "switch" and not plane.switch_processes:
            raise BadInput(f"--target switch on {dp}: its switches are the kernel's, no process to starve; "
                           "allowed: --target endpoint, or --dataplane "
                           + " | ".join(p.name for p in DATAPLANES.values() if p.switch_processes))
        if why := plane.missing():
            raise NotAvailable(f"bench fidelity on {dp}: {why}")
        for name in names:
            if not load_scenario(name).needs <= available(dp):
                console.print(f"[dim]{name}: needs what {dp} lacks here; skipped[/dim]")
                continue
            if target == "steal":
                scn = load_scenario(name, dataplane=dp)
                runs = []
                for k in range(STEAL_RUNS):
                    progress.print(f"[dim]{name} on {dp}: untouched run {k + 1}/{STEAL_RUNS}[/dim]")
                    f = folder / f"{name}-{dp}-{k}"
                    with open(f"{f}.log", "w") as log, contextlib.redirect_stdout(log), \
                            contextlib.redirect_stderr(log):
                        run_scenario(scn, f)
                    runs.append(f)
                got = steal_table(name, dp, steal_bins(runs), markdown)
                if got:
                    out_md.append(got)
                continue
            rows = []
            levels = [Level()] * BASELINE_RUNS + [Level(p, q) for p, q in (NIC_LEVELS if target == "nic" else LEVELS)]
            for k, lvl in enumerate(levels):
                progress.print(f"[dim]{name} on {dp}: {lvl.label()} ({k + 1}/{len(levels)})[/dim]")
                rows.append(one(name, dp, lvl, target, folder / f"{name}-{dp}-{k}"))
            got = table(name, dp, target, rows, markdown)
            if got:
                out_md.append(got)
    if markdown:
        print("\n".join(out_md))
    progress.print(f"every run's results folder and printout: {folder}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
