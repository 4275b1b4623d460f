"""``mrclab run``: bring the fabric up, start the endpoints, play the fault timeline on time, sample
goodput every 100 ms, tear everything down whatever happens, and write a results folder.

Results folder (``results/<scenario>-<transport>-<dataplane>-<YYYYmmdd-HHMMSS>`` unless ``--out``):

* ``scenario.yaml``   the scenario as run (after command-line overrides), with the data plane chosen
* ``metrics.json``    baseline, every expectation (value, bound, verdict), totals per QP
* ``timeseries.csv``  t_s, total goodput and goodput per QP (Mb/s, 100 ms bins)
* ``events.csv``      every fault, EV state change, retransmit and loss with its time
* ``goodput.png``     goodput against time, faults marked
* ``ev_state.png``    EV state over time (paper figs. 12-14)
* ``window.png``      each QP's congestion window (NSCC) or rate (DCQCN) over time
* ``queues.png``, ``switches.csv``  where switches queue: each port's queue, ECN marks, trims and
  full-queue drops over time (sampled every second)
* ``endpoints/``      each endpoint's config and raw telemetry (JSON lines)
* ``pcap/``           with ``--pcap``: a capture per host NIC port (and with ``--debug`` on bmv2,
  per switch port), to open with traffic/wireshark/mrc.lua (experiments/run/captures.py)

Exit status: 0 when every expectation holds, 1 when one fails, 2 for an error (a bad scenario, a
crash: an endpoint that died, a controller error), 3 when this machine cannot run it (not root,
data plane missing) or could not keep up (a verdict void, none failed; ``"passed": null`` in
metrics.json).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml
from mrclab.controller.dataplanes import (
    DATAPLANES,
    DataPlane,
    dataplane,
)
from mrclab.controller.fabric import Fabric
from mrclab.emulation.network import nic_queue_s
from mrclab.emulation.nodes import need_root
from mrclab.emulation.placement import Cluster, open_cluster
from mrclab.experiments.analysis import collectives, fidelity
from mrclab.experiments.analysis.collectives import CollectiveRun
from mrclab.experiments.analysis.expectations import judge, verdict_word
from mrclab.experiments.analysis.fabricstate import FabricTimeline
from mrclab.experiments.analysis.metrics import BIN_S, RunData, baseline_mbps
from mrclab.experiments.analysis.plots import (
    cdf_plot,
    ev_state_plot,
    goodput_plot,
    iteration_plot,
    queue_plot,
    window_plot,
)
from mrclab.experiments.analysis.regime import describe as describe_regime
from mrclab.experiments.analysis.regime import regime
from mrclab.experiments.model.faults import FAULTS, play
from mrclab.experiments.model.faults import where as fault_where
from mrclab.experiments.model.scenario import Scenario, load_scenario, parse_set
from mrclab.experiments.run import endpoints
from mrclab.experiments.run import sweep as S
from mrclab.experiments.run.captures import DISSECTOR, HOW_TO_OPEN, Captures, copy_switch_pcaps
from mrclab.experiments.run.monitor import FidelityMonitor, kernel_workers
from mrclab.experiments.run.results import results_folder
from mrclab.experiments.run.settings import RunSettings, resolve
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import BadInput, NotAvailable
from rich.console import Console
from rich.live import Live
from rich.table import Table

console = Console(stderr=True, highlight=False, soft_wrap=True)


class RunRefused(NotAvailable):
    """The scenario is valid but this machine or data plane cannot run it."""


def choose_dataplane(scn: Scenario, remote: bool = False) -> DataPlane:
    """The data plane to use (controller/dataplanes.py): the scenario's, or with ``auto`` the first
    of :data:`~controller.dataplanes.DATAPLANES` this machine can emulate that has every feature the
    scenario needs; ``remote``: on a fabric over servers (emulation/cluster.py). Raises
    :class:`RunRefused` naming what is missing on each candidate and why, and the data planes that
    would have it."""
    wanted = [dataplane(scn.dataplane)] if scn.dataplane != "auto" else list(DATAPLANES.values())
    why_not = []
    for plane in wanted:
        if why := plane.missing():
            why_not.append(f"{plane.name} is unavailable here ({why})")
            continue
        missing = scn.needs - plane.available(remote)
        if not missing:
            return plane
        reasons = plane.missing_features(remote)
        said = ", ".join(f"{m} ({reasons[m]})" if m in reasons else m for m in sorted(missing))
        events = sorted({f.event for f in scn.faults if f.event in _events_needing(missing)})
        others = [p.name for p in DATAPLANES.values() if p is not plane and missing <= p.features]
        hint = f"; run it with dataplane: {others[0]}" if others and scn.dataplane != "auto" else ""
        why_not.append(f"the {plane.name} data plane cannot do {said}"
                       + (f" (needed by {', '.join(events)})" if events else "") + hint)
    raise RunRefused(f"{scn.source}: " + "; ".join(why_not))


def _events_needing(features: set[str]) -> set[str]:
    return {e for e, kind in FAULTS.items() if kind.feature in features}


def run(scn: Scenario, out: Path | None = None, *, live: bool = True, pcap: bool = False,
        debug: bool = False, fit: bool = False, cluster: Cluster | None = None, rates: str = "scenario") -> dict:
    """Run ``scn`` and write its results folder; returns the metrics dict (also ``metrics.json``).
    ``pcap``: capture every host NIC port; ``debug``: BMv2's per-packet log and its port pcaps;
    ``fit``: scale the link rates down to what this machine sustains (experiments/run/admission.py);
    ``rates``: ``"machine"`` scales them, up or down, to this machine's calibration. Raises
    :class:`~mrclab.experiments.run.admission.CannotCarry` (exit 3) for a run this machine's
    calibration says it cannot carry. ``cluster``: the planes on other servers (``--servers``,
    emulation/cluster.py; None: this machine alone)."""
    return run_with_data(scn, out, live=live, pcap=pcap, debug=debug, fit=fit, cluster=cluster, rates=rates)[0]


def run_with_data(scn: Scenario, out: Path | None = None, *, live: bool = True, pcap: bool = False,
                  debug: bool = False, fit: bool = False, cluster: Cluster | None = None,
                  rates: str = "scenario",
                  on_start: Callable[[dict[str, int], float, Fabric], None] | None = None) -> tuple[dict, RunData]:
    """:func:`run`, also returning the run's normalised data (for benchmarks and sweeps).
    ``on_start(pids, t0, fabric)``, if given, is called once the endpoints are started, with the pid of
    every local process the fidelity monitor watches (``endpoint h0``, ``switch t1-0-0``,
    ``kernel ksoftirqd/0``), t = 0 (monotonic s) and the running fabric: bench/fidelity.py starves
    them, or holds the NICs' drain, on purpose from there."""
    plane = choose_dataplane(scn, remote=cluster is not None)
    dp = plane.name
    run = resolve(scn, plane, fit=fit, rates=rates, remote=cluster is not None,
                  say=lambda m: console.print(f"[dim]·[/dim] {m}"))
    scn, spec = run.scenario, run.spec  # frozen from here on: the runner never replaces them
    out, spec_path = _open_results(run, out)

    console.print(f"[bold]{scn.name}[/bold] ({scn.transport} on {dp}, {scn.duration_s:.0f} s, seed {scn.seed})"
                  + (f": {scn.paper}" if scn.paper else ""))
    fault_log: list[dict] = []
    procs: dict[str, subprocess.Popen] = {}
    t0_wall = 0.0
    sampler = monitor = None
    unread: str | None = None
    queues: dict = {}
    try:
        with Fabric(spec, plane, progress=lambda m: console.print(f"[dim]·[/dim] {m}"),
                    loss_salt=scn.seed, queues=scn.queues.for_transport(scn.transport),
                    frame_bytes=scn.settings.frame_bytes, debug=debug,
                    placement=cluster.placement if cluster else None, ssh=cluster.ssh if cluster else None) as fab, \
                (Captures(fab, scn.hosts(), out / "pcap") if pcap else contextlib.nullcontext()):
            queues = dict(fab.queues)
            if fab.placement is not None:
                _write_servers(fab, out / "servers.json")
            assert fab.queues == run.queues, "the fabric's queue plan is the one the settings resolved"
            # start-up is a barrier, not a race: each endpoint reports ready, then t = 0 is fixed for all
            procs = _launch(fab, scn, spec_path, out / "endpoints")
            waited = endpoints.wait_ready(procs, out / "endpoints",
                                          endpoints.ready_bound_s(len(endpoints.processes(procs))))
            t0_wall = endpoints.go(out / "endpoints")
            t0 = time.monotonic() + (t0_wall - time.time())
            console.print(f"[dim]·[/dim] endpoints ready in {waited:.1f} s; t = 0 in {endpoints.GO_LEAD_S:g} s")
            if fab.queues or fab.nic_watch is not None:
                sampler = PortSampler(fab, t0)
            watched, remote = _watched(fab, procs)
            monitor = FidelityMonitor(watched, t0, remote=remote)
            if on_start is not None:
                on_start(dict(watched), t0, fab)
            try:
                _play(fab, scn, procs, out, t0, fault_log, live)
            finally:
                monitor.stop()
                if sampler is not None:
                    sampler.stop()
                    unread = sampler.unread()  # while the fabric still names its switches
            endpoints.stop(procs)
            if pcap and debug and plane.switch_pcaps:
                copy_switch_pcaps(fab.emu.run_dir, out / "pcap" / "switches")
    finally:
        endpoints.stop(procs)

    data = _run_data(run, endpoints.collect(scn, out / "endpoints", t0_wall), fault_log,
                     sampler.samples if sampler is not None else [], monitor.samples if monitor is not None else [],
                     monitor.kernel_drops if monitor is not None else [], monitor.stolen if monitor is not None else [],
                     sampler.nic_samples if sampler is not None else [])
    data.ports_unread = unread
    return _finish(scn, dp, data, fault_log, out, queues), data


def _open_results(run: RunSettings, out: Path | None) -> tuple[Path, Path]:
    """The run's results folder (made; nothing overwritten) with the scenario as run
    (``scenario.yaml``), its resolved settings (``settings.json``) and its fabric (``fabric.yaml``,
    returned too: the endpoints read it)."""
    scn, dp = run.scenario, run.plane.name
    out = results_folder(out, f"{scn.name}-{scn.transport}-{dp}")
    (out / "endpoints").mkdir(exist_ok=True)
    (out / "scenario.yaml").write_text(yaml.safe_dump(dict(scn.raw, dataplane=dp), sort_keys=False))
    run.write(out)
    spec_path = out / "fabric.yaml"
    spec_path.write_text(yaml.safe_dump(run.spec.to_dict(), sort_keys=False))
    return out, spec_path


def _launch(fab: Fabric, scn: Scenario, spec_path: Path, folder: Path) -> dict[str, subprocess.Popen]:
    """Start every endpoint (grouped into processes where a fabric has many hosts), saying so."""
    cfgs = endpoints.configs(scn, spec_path, folder)
    groups = endpoints.process_groups(list(cfgs), per_core=scn.processes_per_core)
    console.print(f"[dim]·[/dim] starting {len(cfgs)} endpoints ({', '.join(cfgs)})"
                  + (f" in {len(groups)} processes ({' | '.join(' '.join(g) for g in groups)})"
                     if len(groups) < len(cfgs) else ""))
    return endpoints.start(fab, cfgs, folder, groups)


def _write_servers(fab: Fabric, path: Path) -> None:
    """``servers.json``: which plane ran on which server, and each server's clock offset (ms)."""
    assert fab.placement is not None
    path.write_text(json.dumps([{"server": s.name, "planes": fab.placement.planes_of(s, fab.spec.planes),
                                 "clock_offset_ms": round(fab.emu.clock_offset_s.get(s, 0.0) * 1e3, 2)}
                                for s in fab.placement.servers], indent=1))


def _watched(fab: Fabric, procs: dict) -> tuple[dict[str, int], dict[str, tuple]]:
    """What the fidelity monitor watches: label -> pid of every endpoint process, local switch
    process and this machine's softirq thread (monitor.kernel_workers: the kernel's forwarding), and
    label -> (server, pid file) of every switch process on a server (read by its agent)."""
    watched = {f"endpoint {hs}": p.pid for hs, p in endpoints.processes(procs).items()} | kernel_workers()
    watched |= {f"switch {sw.name}": sw.proc.pid for sw in fab.emu.switches() if getattr(sw, "proc", None) is not None}
    remote = {f"switch {sw.name}": (sw.on_server, sw.pid_file) for sw in fab.emu.switches() if hasattr(sw, "pid_file")}
    return watched, remote


def _run_data(run: RunSettings, data: RunData, fault_log: list[dict], ports: list[dict], delays: list,
              kernel_drops: list | None = None, stolen: list | None = None, nic_ports: list | None = None) -> RunData:
    """What the endpoints reported (``data``), completed with what the runner knows of the run: the
    faults played, the switch and NIC port samples and the monitor's CPU samples and kernel backlog
    drops, the held-packet limits the model allows, the flows, the collective and the fabric's timeline."""
    scn, spec = run.scenario, run.spec
    senders = {f.src for f in scn.flows} | set(scn.collective.hosts if scn.collective is not None else ())
    frame, link = scn.settings.frame_bytes, spec.link
    cc = scn.collective
    return dataclasses.replace(
        data, events=sorted(fault_log + data.events, key=lambda e: e["t"]),
        first_fault_s=min((f["t"] for f in fault_log), default=None),
        traffic_start_s=min((f.start_s for f in scn.flows), default=0.0), ports=ports, run_delays=delays,
        kernel_drops=list(kernel_drops or []), stolen=list(stolen or []), nic_ports=list(nic_ports or []),
        held_limits=fidelity.HeldLimits(run.queue_bound_s, link.path_delay_ms / 1e3, nic_queue_s(link, frame),
                                        frame * 8 / (link.bandwidth_mbps * 1e6) if link.bandwidth_mbps > 0 else 0.0,
                                        frozenset(senders)),
        port_mbps=link.bandwidth_mbps, flows=[(f.src, f.dst) for f in scn.flows],
        collective=CollectiveRun(cc.kind, cc.hosts, cc.message_bytes, scn.seed, cc.qps_per_peer, cc.iterations,
                                 cc.warmup)
        if cc else None,
        timeline=FabricTimeline.from_played(AddressPlan(spec), [(x["t"], f) for x, f in zip(fault_log, scn.faults)]))


def sched_delay_limit_for(scn: Scenario, dp: str) -> float:
    """The starvation limit (s) of a run of ``scn`` on data plane ``dp``: its fastest link's frame
    time and its paths' propagation round trip (twice ``path_delay_ms``) through
    :func:`~experiments.analysis.fidelity.sched_delay_limit`."""
    spec = scn.spec_for(dp)
    return fidelity.sched_delay_limit(fastest_frame_s(spec, scn.settings.frame_bytes),
                                      2 * spec.link.path_delay_ms / 1e3)


def fastest_frame_s(spec, frame_bytes: int) -> float:
    """The time (s) a ``frame_bytes`` frame takes on the fabric's fastest shaped link (host ports,
    or T0-T1 links where they are faster); 0 when the host ports are unshaped."""
    link = spec.link
    mbps = max(link.bandwidth_mbps, link.t0_t1_bandwidth_mbps)
    return frame_bytes * 8 / (mbps * 1e6) if link.bandwidth_mbps > 0 and mbps > 0 else 0.0


class PortSampler:
    """Samples every switch port's queue and counters once every ``period_s`` in a thread of its
    own, so the fault timeline keeps its time (a sample of 16 bmv2 switches takes tens of ms); on
    bmv2, no more than 16 switches a second (controller/fabric.py ``control_period_s``: 4 s on 64).

    A round reads one switch at a time, spread evenly over the period, and stamps every row with
    the round's end (s from t = 0), so a round's rows share one ``t``. Read all at once, 64 bmv2
    switches answered within ~0.25 s every second: their control threads woke together while the
    switches forwarding packets waited for a CPU. (lab64-quickstart on bmv2 at 0.5 Mb/s, two runs
    each on a busy machine: with this sampler and the fabric's watchdog off, the slowest 0.1% of
    the switches' scheduling delays were 3.0-3.2 ms, against 4.7-5.1 ms with them reading every
    switch at once.)"""

    def __init__(self, fab: Fabric, t0: float, period_s: float = 1.0) -> None:
        """Start sampling ``fab``'s switch ports every ``period_s`` from ``t0`` (monotonic s of t = 0)."""
        self.fab, self.t0, self.period_s = fab, t0, period_s
        self.samples: list[dict] = []
        #: the last read that failed ("switch: error"), None while none has
        self.last_error: str | None = None
        #: the drain watch on the host NIC ports (Fabric.nic_samples), read at each round's end
        self.nic_samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mrclab-ports", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            switches = self.fab.sampled_switches()
            # bmv2: every read costs the switch and this process a P4Runtime and a Thrift call
            period = self.fab.plane.sample_period_s(len(switches), self.period_s)
            rows: list[dict] | None = []
            for sw in switches:
                if self._stop.wait(period / max(1, len(switches))):
                    return
                try:
                    if rows is not None:
                        rows += self.fab.port_samples([sw])
                except Exception as e:  # a switch restarting: the next round will do
                    self.last_error = f"{sw}: {type(e).__name__}: {e}"
                    console.print(f"[dim]· port sample skipped ({self.last_error})[/dim]")
                    rows = None  # a round is whole or not kept: plots sum a round's ports
            if not switches and self._stop.wait(self.period_s):
                return
            self._nics()
            if rows is not None:
                t = round(time.monotonic() - self.t0, 3)
                self.samples += [{"t": t, **r} for r in rows]

    def _nics(self) -> None:
        try:
            rows = self.fab.nic_samples()
        except Exception as e:  # a netlink or map read refused: the next round will do
            console.print(f"[dim]· NIC port sample skipped ({type(e).__name__}: {e})[/dim]")
            return
        t = round(time.monotonic() - self.t0, 3)
        self.nic_samples += [{"t": t, **r} for r in rows]

    def unread(self) -> str | None:
        """Why no switch port was ever read (the last error), on a fabric with switches to read;
        None when one was, or there is none to read."""
        if self.samples or not self.fab.sampled_switches():
            return None
        return self.last_error or "no round of reads completed"

    def stop(self) -> None:
        """Stop sampling and read every switch once more, at once, so the run's totals count to its
        end (the last spread round can be a period old); the samples stay in :attr:`samples`."""
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            rows = self.fab.port_samples()
        except Exception as e:  # a switch restarting: the totals end at the last round
            self.last_error = f"{type(e).__name__}: {e}"
            console.print(f"[dim]· last port sample skipped ({self.last_error})[/dim]")
            return
        t = round(time.monotonic() - self.t0, 3)
        self.samples += [{"t": t, **r} for r in rows]


def _play(fab: Fabric, scn: Scenario, procs, out: Path, t0: float, fault_log: list[dict], live: bool) -> None:
    pending = list(scn.faults)
    last = "waiting for the first fault"
    telemetry = endpoints.LiveTelemetry(out / "endpoints")
    last_print = -10.0
    with (Live(console=console, refresh_per_second=4, transient=True) if live else contextlib.nullcontext()) as lv:
        while True:
            now = time.monotonic() - t0
            if now >= scn.duration_s:
                break
            while pending and pending[0].at <= now:
                f = pending.pop(0)
                at = time.monotonic() - t0
                desc = play(fab, f)
                event = {"t": round(at, 4), "kind": "fault", "event": f.event, "label": desc,
                         "late_ms": round((at - f.at) * 1e3, 1)}
                if servers := fault_where(fab, f):  # the same moment on each server's own clock
                    event["server_t"] = {name: round(at + offset, 4) for name, offset in servers.items()}
                fault_log.append(event)
                last = f"{at:6.1f} s  {desc}"
                console.print(f"[red]![/red] {last}")
            endpoints.check_alive(procs, out / "endpoints")
            mbps = telemetry.goodput_mbps()
            bar_n = int(30 * max(0.0, now) / scn.duration_s)
            line = (f"{'█' * bar_n}{'░' * (30 - bar_n)} {max(0.0, now):5.1f}/{scn.duration_s:.0f} s   "
                    f"goodput {mbps:7.1f} Mb/s")
            if lv is not None:
                lv.update(f"[cyan]{line}[/cyan]   last: {last}")
            elif now - last_print >= 2.0:  # not a terminal: a progress line every 2 s
                console.print(line)
                last_print = now
            nxt = min([pending[0].at if pending else scn.duration_s, scn.duration_s, now + BIN_S])
            time.sleep(max(0.0, min(BIN_S, nxt - now)))


def _write_port_csvs(data: RunData, out: Path) -> None:
    """``switches.csv`` (every switch port sample) and ``nics.csv`` (every host NIC port reading of
    the drain watch), where the run has them."""
    if data.ports:
        with open(out / "switches.csv", "w", newline="") as fh:
            # gray: packets dropped by a gray loss (linux's program counts them per port; bmv2: empty);
            # pauses, pause_s: PFC pauses this port received and its time paused (lossless ports only);
            # late, late_max_us, sent: the drain watch on bmv2 (empty on linux): packets that left more
            # than a frame time (gap_us) after their shaper's schedule since start, the most any left
            # after it since the port's sample before (us), low-priority packets that left since start;
            # behind_us: the drain watch on linux (lossless ports: empty): how far the port's real data
            # queue stood behind its shaper's schedule at the sample (us; 0 or less: on or ahead of it)
            w = csv.DictWriter(fh, fieldnames=["t", "switch", "port", "peer", "queue", "marked", "trimmed",
                                               "queue_full", "gray", "pauses", "pause_s", "late", "late_max_us",
                                               "gap_us", "sent", "behind_us"], restval="")
            w.writeheader()
            w.writerows(data.ports)
    if data.nic_ports:
        with open(out / "nics.csv", "w", newline="") as fh:
            # the drain watch on the host NIC ports: the bytes each port's tbf held at the sample, how
            # far that stood behind its shaper's schedule (us; 0 or less: on or ahead of it; empty: no
            # tight read), the frames its tbf refused so far (each while it stood two frames behind),
            # a full frame's time at the port's rate (us)
            w = csv.DictWriter(fh, fieldnames=["t", "host", "port", "backlog", "behind_us", "refused", "gap_us"])
            w.writeheader()
            w.writerows(data.nic_ports)


def _finish(scn: Scenario, dp: str, data: RunData, fault_log: list[dict], out: Path,
            queues: dict | None = None) -> dict:
    gap_limit = fidelity.loop_gap_limit(scn.settings.min_rto_s)
    delay_limit = sched_delay_limit_for(scn, dp)
    held = fidelity.held_packets(data.events, data.held_limits)
    late = data.late_departures()
    behind, readings = data.behind_schedule()
    cpus = psutil.cpu_count() or 1  # the monitor read steal on this machine's CPUs
    found = fidelity.faults(data.run_delays, data.loop_gaps, loop_gap_max_s=gap_limit, held=held,
                            sched_delay_max_s=delay_limit, lost=data.kernel_drops, reordered=data.reordered,
                            late=late, behind=behind, timer_s=gap_limit, stolen=data.stolen, cpus=cpus)
    fidelity.write_csv(out / "fidelity.csv", data.run_delays, data.loop_gaps, gap_limit, held, delay_limit,
                       data.kernel_drops, data.reordered, data.stolen, late, behind, cpus)
    faults = [{"t": f["t"], "label": f["label"]} for f in fault_log] + \
        [{"t": f.t0, "t_end": f.t1, "kind": "fidelity", "label": f.describe()} for f in found]
    title = f"{scn.name}: {scn.transport} on {dp}"
    goodput_plot(data, faults, out / "goodput.png", title)
    ev_state_plot(data, faults, out / "ev_state.png", title + ", EV state")
    window_plot(data, faults, out / "window.png", title + ", congestion window / rate per QP")
    if data.ports:
        queue_plot(data, faults, out / "queues.png", title + ", switch ports")
    _write_port_csvs(data, out)
    series = data.goodput_mbps()
    per_qp = data.qp_goodput_mbps()
    with open(out / "timeseries.csv", "w", newline="") as fh:
        table = csv.writer(fh)
        table.writerow(["t_s", "goodput_mbps", *[f"{qp}_mbps" for qp in per_qp]])
        for i, t in enumerate(data.bins()):
            table.writerow([f"{t:.1f}", f"{series[i]:.3f}", *[f"{v[i]:.3f}" for v in per_qp.values()]])
    keys = ["t", "kind", "host", "qp", "ev", "old", "new", "reason", "psn", "label", "event", "late_ms", "age_s",
            "nic_wait_s", "wire_s"]
    with open(out / "events.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for e in data.events:
            w.writerow(e)
    coll = None
    if isinstance(data.collective, CollectiveRun):
        rows = collectives.iterations(data, data.collective)
        coll = collectives.summary(data, data.collective)
        iteration_plot(rows, faults, out / "iterations.png", title + f", {data.collective.kind} time per iteration")
        cdf_plot({"all QPs": [x for xs in data.completion_s.values() for x in xs]}, out / "completion_cdf.png",
                 title + ", message completion time", "message completion time (s)")
        with open(out / "collective.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=["index", "end_s", "time_s", "algbw_mbps", "busbw_mbps", "correct"])
            w.writeheader()
            w.writerows(rows)
    data.fidelity_windows = [(f.t0, f.t1) for f in found]
    data.retire_windows = [(f.t0, f.t1) for f in found if f.retires]
    if coll is not None and found:  # the pace of the iterations the machine left alone, and how much that was
        assert isinstance(data.collective, CollectiveRun)
        kept, _ = collectives.kept_iterations(data, data.collective)
        coll.update(busbw_kept_mbps=collectives.evaluate(data, data.collective, "busbw_mbps", {}),
                    iterations_kept=len(kept), kept_share=collectives.kept_share(data, data.collective))
    verdicts = [{"expectation": x.describe(), "metric": x.metric, **judge(data, x.metric, x.args, found)}
                for x in scn.expect]
    metrics = {
        "scenario": scn.name, "paper": scn.paper, "transport": scn.transport, "dataplane": dp, "seed": scn.seed,
        "duration_s": scn.duration_s, "baseline_mbps": baseline_mbps(data), "rtt_us": data.rtt_us,
        "faults": fault_log, "expectations": verdicts, "totals": data.totals,
        "ev_state_changes": sum(1 for e in data.events if e.get("kind") == "ev_state"),
        "message_completion_s": data.mct_percentiles(), "switch_ports": data.port_totals(),
        "socket_drops": data.socket_drops_between(),
        "collective": coll,
        "passed": run_passed(verdicts),
        "void": [v["expectation"] for v in verdicts if v.get("void")],
        "regime": regime(scn.spec_for(dp), scn.settings, queues or {}, data.rtt_us),
        "fidelity_faults": [f.as_dict() for f in found],
        # the drain watch, judged or not (its faults are above): bmv2's switch ports' late departures;
        # linux's switch ports' and every host NIC port's readings against their shaper's schedule
        "late_departures": fidelity.late_summary(late),
        "behind_schedule": fidelity.behind_summary(behind, readings),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
    _summary(metrics, out)
    return metrics


def run_passed(verdicts: list[dict]) -> bool | None:
    """A run's verdict from its expectations' (``passed``, ``void``): False when one decided verdict
    FAILed, None (undecided) when none FAILed but one was void, else True."""
    if any(v["passed"] is False for v in verdicts):
        return False
    return None if any(v.get("void") for v in verdicts) else True


def _summary(m: dict, out: Path) -> None:
    t = Table(title=f"{m['scenario']} ({m['transport']} on {m['dataplane']}): baseline {m['baseline_mbps']:.1f} Mb/s")
    t.add_column("expectation")
    t.add_column("value", justify="right")
    t.add_column("bound")
    t.add_column("verdict")
    for v in m["expectations"]:
        val = "inf" if v["value"] is None else f"{v['value']:.3g}"
        verdict = verdict_word(v["passed"], rich=True, void=v.get("void"))
        if v.get("evidence"):
            verdict += f" ({v['evidence']})"
        t.add_row(v["expectation"], val, v["bound"] + (f" ({v['left_out']})" if v.get("left_out") else ""), verdict)
    Console(highlight=False).print(t)
    tot = m["totals"]
    sent = sum(x.get("data_packets", 0) for x in tot.values())
    rtx = sum(x.get("retransmits", 0) for x in tot.values())
    stamped = sum(x.get("wire_stamped", 0) for x in tot.values())
    deferred = sum(x.get("nic_deferred", 0) for x in tot.values())
    mct = m["message_completion_s"]
    sw = m["switch_ports"]
    Console(highlight=False).print(
        f"data packets {sent}, retransmits {rtx}, EV state changes {m['ev_state_changes']}"
        + (f"; {stamped} transmissions timed from their NIC port's departure stamp, {deferred} timer "
           f"expiries put off for packets that left their port late" if stamped else "")
        + (f"; message completion p50/p99/p99.9 {mct['p50']:.3f}/{mct['p99']:.3f}/{mct['p99.9']:.3f} s"
           if mct else "")
        + (f"; switch ports: {sw['marked']} marked, {sw['trimmed']} trimmed, {sw['queue_full']} dropped full"
           if sw else "")
        + (f"; endpoint sockets dropped {m['socket_drops']} frames (full receive buffers, port errors at send)"
           if m.get("socket_drops") else "")
        + (f"; {late['packets']} packets left a switch port over a frame time after their shaper's schedule "
           f"(worst {late['worst_s'] * 1e3:.1f} ms at {late['worst_where']}, frame {late['frame_s'] * 1e3:.1f} ms)"
           if (late := m.get("late_departures")) else "")
        + (f"; {b['behind']} of {b['readings']} port readings stood behind their shaper's schedule (worst "
           f"{b['worst_s'] * 1e3:.1f} ms at {b['worst_where']}, frame {b['frame_s'] * 1e3:.1f} ms)"
           if (b := m.get("behind_schedule")) and b.get("behind") else "")
        + f"; results in {out}/ (plot: {out / 'goodput.png'})")
    if m.get("regime"):
        Console(highlight=False).print(describe_regime(m["regime"]))
        for w in m["regime"]["weakens"]:
            Console(highlight=False).print(f"  [dim]weakens: {w}[/dim]")
    if m.get("collective"):
        _collective_table(m["collective"])
    if (out / "pcap").is_dir():
        Console(highlight=False, soft_wrap=True).print(
            "captures: " + HOW_TO_OPEN.format(lua=DISSECTOR, pcap=f"{out / 'pcap'}/<port>.pcap"))


def _collective_table(c: dict) -> None:
    """The collective's line as nccl-tests prints it (its columns; Mb/s where it prints GB/s)."""
    t = Table(title=f"{c['kind']} over {c['hosts']} hosts, {c['qps_per_peer']} QP(s) per peer "
                    f"(nccl-tests columns over the iterations after {c.get('warmup', 0)} of warm-up; time: "
                    "median; bandwidths: over them all)")
    for col in ("size (B)", "iterations", "time (ms)", "p99 time (ms)", "algbw (Mb/s)", "busbw (Mb/s)", "correct"):
        t.add_column(col, justify="right")
    ms = lambda x: "-" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    t.add_row(f"{c['bytes']:,}", str(c["iterations"]), ms(c["time_s"]), ms(c["time_p99_s"]),
              f"{c['algbw_mbps']:.2f}", f"{c['busbw_mbps']:.2f}",
              "-" if not c["iterations"] else "yes" if c["correct"] else "[red]NO[/red]")
    Console(highlight=False).print(t)


def main(args) -> int:
    """``mrclab run``: errors propagate to the command line's one error boundary."""
    scn = load_scenario(args.scenario, duration_s=args.duration, dataplane=args.dataplane, transport=args.transport,
                        settings=parse_set(args.set))
    need_root("mrclab run")
    with open_cluster(getattr(args, "servers", None), getattr(args, "ssh_config", None),
                      files=(scn.source,)) as cluster:
        if scn.sweep is not None:
            s = run_sweep(scn, Path(args.out) if args.out else None, live=sys.stderr.isatty(), cluster=cluster)
            return {True: 0, False: 1, None: 3}[s["passed"]]
        m = run(scn, Path(args.out) if args.out else None, live=sys.stderr.isatty(), pcap=args.pcap,
                debug=args.debug, fit=args.fit, cluster=cluster, rates=args.rates)
    return exit_code(m)


def exit_code(m: dict) -> int:
    """1 when a verdict decided outside every fidelity fault FAILed; else 3 when one was void (this
    machine could not keep up; one line says with what); else 0."""
    if m["passed"] is False:
        return 1
    if m.get("void"):
        worst = max(m["fidelity_faults"], key=lambda f: f["t1"] - f["t0"])
        console.print(f"[yellow]void:[/yellow] {len(m['void'])} of {len(m['expectations'])} verdicts read a "
                      f"window where the emulator fell behind ({len(m['fidelity_faults'])} fidelity faults; longest: "
                      f"{worst['invariant']} at {fidelity.places(worst['where'])}, "
                      f"{worst['t1'] - worst['t0']:.2f} s from {worst['t0']:.1f} s): this machine could not keep up; "
                      "no verdict (exit 3)")
        return 3
    return 0


def run_sweep(scn: Scenario, out: Path | None = None, *, live: bool = True, cluster: Cluster | None = None,
              tries: int = 1, claimed: bool = False) -> dict:
    """Every point of ``scn``'s sweep (experiments/run/sweep.py), each its own run in a subfolder of
    ``out``, then the sweep's table, plot and claims. Returns ``{points, claims, passed}``.
    ``claimed``: only the points some claim reads (``Sweep.claimed``; ``mrclab reproduce --quick``).

    ``tries``: runs a point may take. A point whose run the machine voided (a void verdict, or its
    busbw held: the fidelity faults held most of its iterations) runs again with the next seed (its
    folder suffixed ``-seed<S>``), up to ``tries`` runs; the point keeps the last run, and
    ``replaced`` says each earlier run's seed and cause. A FAIL is never re-run: only a run the
    machine broke is (``mrclab reproduce --repeat N`` gives N)."""
    sw = scn.sweep
    if sw is None:
        raise BadInput(f"{scn.source}: {scn.name} has no sweep: block to run")
    out = results_folder(out, f"{scn.name}-sweep")
    grid = sw.claimed() if claimed else sw.grid()
    points = []
    for k, (v, x, b) in enumerate(grid, 1):
        console.print(f"[bold]sweep point {k}/{len(grid)}[/bold]: {S.label(v, x, b)}")
        replaced: list[str] = []
        for n in range(tries):
            folder = S.folder_name(v, x, b) + (f"-seed{scn.seed + n}" if n else "")
            m = run(S.point(scn, v, x, b, seed=scn.seed + n), out / folder, live=live, cluster=cluster)
            p = S.summarise(v, x, m, folder, b)
            p["seed"] = scn.seed + n
            why = p["void"] or p["held"]
            if not why or p["passed"] is False or n == tries - 1:
                break
            replaced.append(f"seed {scn.seed + n}: {why}")
            console.print(f"[yellow]void[/yellow] ({why}): run {n + 2} of at most {tries}, seed {scn.seed + n + 1}")
        p["replaced"] = replaced
        points.append(p)
    claims = S.judge(sw, points)
    S.write(out, scn, sw, points, claims)
    t = Table(title=f"{scn.name}: sweep ({len(points)} runs)")
    for col in ("variant", "loss", "size", "iterations", "busbw (Mb/s)", "correct", "expectations"):
        t.add_column(col)
    for p in points:
        t.add_row(p["variant"], f"{p['loss']:g}", S.size_text(p.get("message_bytes")), str(p["iterations"]),
                  f"{p['busbw_mbps']:.2f}",
                  "yes" if p["correct"] else "[red]NO[/red]", verdict_word(p["passed"], rich=True, void=p.get("void")))
    for c in claims:
        t.add_row(c["claim"], "", "", "", f"{c['value']:.2f}", c["bound"],
                  verdict_word(c["passed"], rich=True, void=c.get("void")))
    console.print(t)
    console.print(f"sweep results in {out}/ (sweep.md, sweep.png)")
    # a void point is void in the sweep's verdict, never passed: FAIL where a point or claim failed,
    # else undecided (None) where one was void
    void = next((c["void"] for c in claims if c.get("void")), None) or \
        next((f"{p['variant']} at loss {p['loss']:g}: {p['void']}" for p in points if p.get("void")), None)
    failed = any(p["passed"] is False for p in points) or any(c["passed"] is False for c in claims)
    passed = False if failed else None if void else True
    return {"points": points, "claims": claims, "passed": passed, "void": void}
