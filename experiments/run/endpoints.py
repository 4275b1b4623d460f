"""The runner's side of the endpoint contract (traffic/contract.py).

:func:`configs` builds one :class:`~traffic.contract.EndpointConfig` per host that takes part
(senders and receivers); :func:`start` writes them and starts ``python -m mrclab.traffic.endpoint`` in
each host's namespace (one process for several hosts where a fabric has many:
:func:`process_groups`); :func:`collect` turns every host's telemetry into a :class:`RunData` with
times relative to the timeline's start.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mrclab.emulation.cleanup import stop_processes
from mrclab.experiments.analysis.metrics import RunData
from mrclab.experiments.model.faults import endpoint_seed, ev_path
from mrclab.experiments.model.scenario import Scenario
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import NotAvailable, RunFailed
from mrclab.traffic import contract as C


class EndpointDied(RunFailed):
    """An endpoint process exited before its time; the message names the host and its last words."""


class EndpointsNotReady(NotAvailable):
    """Endpoints were not ready within the start-up bound: this machine could not carry them (exit 3)."""


def configs(scn: Scenario, spec_path: Path, folder: Path) -> dict[str, C.EndpointConfig]:
    """host -> endpoint config for every host that sends or receives in ``scn``."""
    plan = AddressPlan(scn.spec)
    deny: dict[str, list[int]] = {}
    for f in scn.faults:
        if f.event == "deny":
            deny.setdefault(f.args["src"], []).append(ev_path(plan, f.args).ev)
    out = {}
    qp_no: dict[str, int] = {}
    for host in scn.hosts():
        qps = []
        for fl in scn.flows:
            if fl.src != host:
                continue
            for _ in range(fl.qps):
                qp_no[host] = qp_no.get(host, 0) + 1
                pin = plan.path(fl.src, fl.dst, fl.pin[0], fl.pin[1]).ev if fl.pin else None
                qps.append(C.QpConfig(qp=qp_no[host], peer=fl.dst, message_bytes=fl.message_bytes, op=fl.op,
                                      start_s=fl.start_s, duration_s=scn.duration_s - fl.start_s, pin_ev=pin))
        cc = scn.collective
        coll = C.CollectiveConfig(cc.kind, cc.hosts, cc.message_bytes, cc.iterations, cc.qps_per_peer, cc.start_s,
                                  seed=scn.seed) if cc is not None and host in cc.hosts else None
        out[host] = C.EndpointConfig(
            topo=str(spec_path), host=host, seed=endpoint_seed(scn.seed, host), transport=scn.transport,
            settings=scn.settings, denylist=tuple(deny.get(host, [])), qps=tuple(qps),
            telemetry_path=str(folder / f"{host}.telemetry.jsonl"), telemetry_interval_s=0.1, collective=coll)
    return out


#: The file of the start-up barrier in a run's endpoints folder: t = 0 as time.time(), written once
#: every endpoint is ready (:func:`go`).
GO_FILE = "go"
#: Lead between the go and t = 0: every endpoint polls for the go every 10 ms, and sees it in time
#: on a loaded machine too.
GO_LEAD_S = 0.5


#: Endpoint processes per core before hosts share one: each host has its own process while a
#: fabric has at most this many hosts per core (every shipped scenario on this 2-core machine up
#: to 4 hosts ran so when its bounds were set); beyond, this many processes per core serve them
#: all. Eight hosts each with its own interpreter starved two cores at a collective's start
#: (docs/report's fig. 17, bmv2: every endpoint 0.6-0.9 ms late per wake-up).
PROCESSES_PER_CORE = 2


def process_groups(hosts: list[str], cores: int | None = None, per_core: int | None = None) -> list[list[str]]:
    """The hosts each endpoint process serves, in order: one host each while there are at most
    :data:`PROCESSES_PER_CORE` x ``cores`` (default: this machine's) hosts, else ``per_core``
    (default :data:`PROCESSES_PER_CORE`) processes per core with the hosts dealt round-robin (h0,
    h4 | h1, h5 | ...), so that senders and receivers spread over the processes. A scenario sets
    ``per_core`` (its ``processes_per_core``) where its hosts' processes starved each other: fig.
    16's RoCE with 16 QPs at 8 KiB waited 0.80 ms a wake-up (median) in four processes on two
    cores and 0.17 ms in two, at the same busbw (0.37 and 0.38 Mb/s)."""
    cores = cores or os.cpu_count() or 1
    if len(hosts) <= PROCESSES_PER_CORE * cores:
        return [[h] for h in hosts]
    n = (per_core or PROCESSES_PER_CORE) * cores
    return [hosts[i::n] for i in range(n)]


def start(fab, cfgs: dict[str, C.EndpointConfig], folder: Path,
          groups: list[list[str]] | None = None) -> dict[str, subprocess.Popen]:
    """Write each config (no start time: each waits for :func:`go` after it is ready) and start
    the endpoint processes, each in the namespace of the first host of its group (``groups``,
    default :func:`process_groups`) and given the others' namespaces; returns host -> its
    process (hosts of one group share it). A process's output goes to ``<first host>.log``, which
    every other host of its group links to as ``<host>.log``."""
    procs = {}
    (folder / GO_FILE).unlink(missing_ok=True)
    for host, cfg in cfgs.items():
        (folder / f"{host}.json").write_text(
            dataclasses.replace(cfg, start_at_wall=None, go_path=str(folder / GO_FILE)).to_json())
    for group in groups or process_groups(list(cfgs)):
        argv = [sys.executable, "-m", "mrclab.traffic.endpoint"]
        for h in group:
            argv += ["--config", str(folder / f"{h}.json")]
        for h in group[1:]:
            argv += ["--netns", fab.emu.netns(h)]
        with open(folder / f"{group[0]}.log", "wb") as log:
            p = fab.emu.popen(group[0], argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for h in group:
            procs[h] = p
            if h != group[0]:
                (folder / f"{h}.log").unlink(missing_ok=True)
                (folder / f"{h}.log").symlink_to(f"{group[0]}.log")
    return procs


def processes(procs: dict[str, subprocess.Popen]) -> dict[str, subprocess.Popen]:
    """Each endpoint process once, labelled by the hosts it serves (``h0`` or ``h0+h4``)."""
    hosts: dict[int, list[str]] = {}
    by_pid: dict[int, subprocess.Popen] = {}
    for h, p in procs.items():
        hosts.setdefault(p.pid, []).append(h)
        by_pid[p.pid] = p
    return {"+".join(hs): by_pid[pid] for pid, hs in hosts.items()}


def stop(procs: dict[str, subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM every endpoint process (they write a final summary), then SIGKILL what is left."""
    live = []
    for p in processes(procs).values():
        if p.poll() is None:
            try:
                live.append(psutil.Process(p.pid))
            except psutil.NoSuchProcess:
                pass
    stop_processes(live, grace_s)
    for p in procs.values():
        p.poll()  # reap


def _last_words(folder: Path, host: str) -> str:
    try:
        lines = [x for x in (folder / f"{host}.log").read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    return lines[-1].strip() if lines else "no output"


def check_alive(procs: dict[str, subprocess.Popen], folder: Path) -> None:
    """Raise :class:`EndpointDied` for an endpoint that exited with an error."""
    for host, p in procs.items():
        if p.poll() is not None and p.returncode != 0:
            raise EndpointDied(f"endpoint on {host} exited with {p.returncode}: {_last_words(folder, host)} "
                               f"(log: {folder / (host + '.log')})")


def ready_bound_s(n_endpoints: int, cores: int | None = None) -> float:
    """How long the runner waits for ``n_endpoints`` endpoint processes to be ready, in seconds:
    each was measured at about 0.8 CPU-s importing Python and opening its sockets before it is
    (``python -X importtime``, mostly scapy, which has since left its path: its imports take 0.2
    CPU-s now against 0.4 side by side; the bound keeps the old figure as margin), on this
    machine's cores, with a factor of 4 for a machine busy with other work and 5 s of grace."""
    cores = cores or os.cpu_count() or 1
    return 5.0 + 4 * 0.8 * n_endpoints / cores


def wait_ready(procs: dict[str, subprocess.Popen], folder: Path, bound_s: float,
               telemetry: dict[str, Path] | None = None) -> float:
    """The start-up barrier, runner's side: wait until every endpoint has opened its sockets (its
    ``start`` record), at most ``bound_s``; returns the seconds it took. Raises
    :class:`EndpointDied` naming an endpoint that exited, and :class:`EndpointsNotReady` (exit 3,
    this machine could not) naming those not ready in time. ``telemetry``: host -> its telemetry
    file, where not ``<folder>/<host>.telemetry.jsonl``."""
    tel = telemetry or {h: folder / f"{h}.telemetry.jsonl" for h in procs}
    pending, t_start = set(procs), time.monotonic()
    while pending:
        for host in list(pending):
            if any(isinstance(r.rec, C.Start) for r in C.read_telemetry(tel[host])):
                pending.discard(host)
            elif procs[host].poll() is not None:
                raise EndpointDied(f"endpoint on {host} exited with {procs[host].returncode} before starting: "
                                   f"{_last_words(folder, host)} (log: {folder / (host + '.log')})")
        waited = time.monotonic() - t_start
        if pending and waited > bound_s:
            raise EndpointsNotReady(
                f"endpoints {', '.join(sorted(pending))} not ready after {waited:.1f} s (bound {bound_s:.1f} s for "
                f"{len(procs)} endpoints on {os.cpu_count()} cores): this machine could not start them in time")
        if pending:
            time.sleep(0.05)
    return time.monotonic() - t_start


def go(folder: Path, lead_s: float = GO_LEAD_S) -> float:
    """Release every endpoint waiting at the barrier: t = 0 is ``lead_s`` from now. Writes the go
    file whole (a temporary file renamed into place) and returns t = 0 as time.time()."""
    t0_wall = time.time() + lead_s
    tmp = folder / f".{GO_FILE}.tmp"
    tmp.write_text(repr(t0_wall))
    os.replace(tmp, folder / GO_FILE)
    return t0_wall


class LiveTelemetry:
    """Tails every endpoint's telemetry for the live goodput figure of the progress line."""

    def __init__(self, folder: Path) -> None:
        """Tail every ``*.telemetry.jsonl`` in ``folder`` from where the last call stopped."""
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.last: dict[Path, tuple[float, int]] = {}
        self.latest: dict[Path, float] = {}

    def goodput_mbps(self) -> float:
        """Total goodput (Mb/s) received since the last call, from the newest samples of every host."""
        for path in self.folder.glob("*.telemetry.jsonl"):
            try:
                with open(path) as fh:
                    fh.seek(self.offsets.get(path, 0))
                    chunk = fh.read()
            except OSError:
                continue
            done = chunk.rfind("\n") + 1  # a line still being written is read next time
            self.offsets[path] = self.offsets.get(path, 0) + len(chunk[:done].encode())
            for line in chunk[:done].splitlines():
                try:
                    r = C.decode(line, str(path))
                except ValueError:
                    continue
                if not isinstance(r.rec, C.Sample):
                    continue
                delivered = sum(q.delivered_bytes for q in r.rec.rx)
                prev = self.last.get(path)
                self.last[path] = (r.t_wall, delivered)
                if prev and r.t_wall > prev[0]:
                    self.latest[path] = (delivered - prev[1]) * 8 / 1e6 / (r.t_wall - prev[0])
        return sum(self.latest.values())


def collect(scn: Scenario, folder: Path, t0_wall: float) -> RunData:
    """Normalise every host's telemetry (receive side for goodput, send side for totals)."""
    d = RunData(duration_s=scn.duration_s)
    rtts = []
    for host in scn.hosts():
        reordered = 0
        for r in C.read_telemetry(folder / f"{host}.telemetry.jsonl"):
            t, rec = r.t_wall - t0_wall, r.rec
            if isinstance(rec, C.Sample):
                d.loop_gaps.append((round(t, 3), host, rec.loop_gap_max_s))
                now = sum(q.reordered for q in rec.rx)
                if now > reordered:
                    d.reordered.append((round(t, 3), host, now - reordered))
                reordered = now
                if rec.rss_bytes:  # the endpoint's own memory: its receive regions' pages apart
                    d.rss.append((round(t, 3), host, rec.rss_bytes - rec.region_bytes))
                if rec.socket_drops or rec.send_drops:
                    d.socket_drops.append((round(t, 3), host, rec.socket_drops + rec.send_drops))
                for rq in rec.rx:
                    name = f"{rq.src}->{host}#{rq.qp}"
                    d.samples.setdefault(name, []).append((t, rq.delivered_bytes))
                    d.qp_src[name] = rq.src
                for tq in rec.tx:
                    name = f"{host}->{tq.peer}#{tq.qp}"
                    d.windows.setdefault(name, []).append((t, tq.window_bytes, tq.rate_bps))
                    d.ev_packets.setdefault(name, []).append((t, tq.ev_packets))
                rtts += [tq.srtt_us for tq in rec.tx if tq.srtt_us]
            elif isinstance(rec, C.CollectiveIteration):
                d.events.append({**C.event_fields(rec), "t": round(t, 4), "host": host,
                                 "start_s": rec.start_wall - t0_wall, "end_s": rec.end_wall - t0_wall})
            elif isinstance(rec, C.Event):
                d.events.append({**C.event_fields(rec), "t": round(t, 4), "host": host})
            elif isinstance(rec, C.Summary):
                for tq in rec.tx:
                    tot = d.totals.setdefault(f"{host}->{tq.peer}#{tq.qp}", {})
                    tot.update({k: getattr(tq.stats, k) for k in ("data_packets", "retransmits", "bytes_acked",
                                                                  "messages_sent", "messages_acked", "nacks",
                                                                  "timeouts", "wire_stamped", "nic_deferred")})
                    d.completion_s[f"{host}->{tq.peer}#{tq.qp}"] = list(tq.completion_s)
                for rq in rec.rx:
                    tot = d.totals.setdefault(f"{rq.src}->{host}#{rq.qp}", {})
                    tot.update({"messages_delivered": rq.messages_delivered, "messages_corrupt": rq.messages_corrupt,
                                "bytes_delivered": rq.delivered_bytes})
    for pts in d.samples.values():
        pts.sort()
    if rtts:
        rtts.sort()
        d.rtt_us = rtts[len(rtts) // 2]
    return d
