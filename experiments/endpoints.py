"""The runner's side of the endpoint contract (traffic/contract.py).

:func:`configs` builds one :class:`~traffic.contract.EndpointConfig` per host that takes part
(senders and receivers); :func:`start` writes them and starts ``python -m mrclab.traffic.endpoint`` in
each host's namespace; :func:`collect` turns every host's telemetry into a :class:`RunData` with
times relative to the timeline's start.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mrclab.experiments.faults import endpoint_seed, ev_path
from mrclab.experiments.metrics import RunData
from mrclab.experiments.scenario import Scenario
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.cleanup import stop_processes
from mrclab.topologies.errors import RunFailed
from mrclab.traffic import contract as C


class EndpointDied(RunFailed):
    """An endpoint process exited before its time; the message names the host and its last words."""


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


def start(fab, cfgs: dict[str, C.EndpointConfig], folder: Path, t0_wall: float) -> dict[str, subprocess.Popen]:
    """Write each config (with ``start_at_wall`` = ``t0_wall``) and start its endpoint in its host's
    namespace; output goes to ``<host>.log``."""
    procs = {}
    for host, cfg in cfgs.items():
        cpath = folder / f"{host}.json"
        cpath.write_text(dataclasses.replace(cfg, start_at_wall=t0_wall).to_json())
        with open(folder / f"{host}.log", "wb") as log:
            procs[host] = fab.emu.popen(host, [sys.executable, "-m", "mrclab.traffic.endpoint", "--config", str(cpath)],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return procs


def stop(procs: dict[str, subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM every endpoint (they write a final summary), then SIGKILL what is left."""
    live = []
    for p in procs.values():
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


def wait_started(procs: dict[str, subprocess.Popen], folder: Path, t0_wall: float) -> None:
    """Wait until every endpoint has opened its sockets (its ``start`` record), at most until
    ``t0_wall``; raises :class:`EndpointDied` naming an endpoint that died or did not start in time."""
    pending = set(procs)
    while pending:
        for host in list(pending):
            if any(isinstance(r.rec, C.Start) for r in C.read_telemetry(folder / f"{host}.telemetry.jsonl")):
                pending.discard(host)
            elif procs[host].poll() is not None:
                raise EndpointDied(f"endpoint on {host} exited with {procs[host].returncode} before starting: "
                                   f"{_last_words(folder, host)} (log: {folder / (host + '.log')})")
        if pending and time.time() > t0_wall:
            raise EndpointDied(f"endpoints {', '.join(sorted(pending))} not started by t = 0; the machine is overloaded")
        time.sleep(0.05)


class LiveTelemetry:
    """Tails every endpoint's telemetry for the live goodput figure of the progress line."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.last: dict[Path, tuple[float, int]] = {}
        self.latest: dict[Path, float] = {}

    def goodput_mbps(self) -> float:
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
        for r in C.read_telemetry(folder / f"{host}.telemetry.jsonl"):
            t, rec = r.t_wall - t0_wall, r.rec
            if isinstance(rec, C.Sample):
                for q in rec.rx:
                    name = f"{q.src}->{host}#{q.qp}"
                    d.samples.setdefault(name, []).append((t, q.delivered_bytes))
                    d.qp_src[name] = q.src
                for q in rec.tx:
                    name = f"{host}->{q.peer}#{q.qp}"
                    d.windows.setdefault(name, []).append((t, q.window_bytes, q.rate_bps))
                    d.ev_packets.setdefault(name, []).append((t, q.ev_packets))
                rtts += [q.srtt_us for q in rec.tx if q.srtt_us]
            elif isinstance(rec, C.CollectiveIteration):
                d.events.append({**C.event_fields(rec), "t": round(t, 4), "host": host,
                                 "start_s": rec.start_wall - t0_wall, "end_s": rec.end_wall - t0_wall})
            elif isinstance(rec, C.Event):
                d.events.append({**C.event_fields(rec), "t": round(t, 4), "host": host})
            elif isinstance(rec, C.Summary):
                for q in rec.tx:
                    tot = d.totals.setdefault(f"{host}->{q.peer}#{q.qp}", {})
                    tot.update({k: getattr(q.stats, k) for k in ("data_packets", "retransmits", "bytes_acked",
                                                                 "messages_sent", "messages_acked", "nacks")})
                    d.completion_s[f"{host}->{q.peer}#{q.qp}"] = list(q.completion_s)
                for q in rec.rx:
                    tot = d.totals.setdefault(f"{q.src}->{host}#{q.qp}", {})
                    tot.update({"messages_delivered": q.messages_delivered, "messages_corrupt": q.messages_corrupt,
                                "bytes_delivered": q.delivered_bytes})
    for pts in d.samples.values():
        pts.sort()
    if rtts:
        rtts.sort()
        d.rtt_us = rtts[len(rtts) // 2]
    return d
