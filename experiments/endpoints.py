"""The runner's side of the endpoint contract (``python -m traffic.endpoint --config FILE``).

:func:`configs` writes one config per host that takes part (senders and receivers); the
endpoint writes JSON-lines telemetry to ``telemetry_path``; :func:`collect` turns every host's
telemetry into a :class:`RunData` with times relative to the timeline's start. The format is
documented in docs/protocol.md ("Endpoint process").
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from experiments.metrics import RunData
from experiments.scenario import Scenario
from topologies.addressing import AddressPlan


def configs(scn: Scenario, plan: AddressPlan, spec_path: Path, folder: Path) -> dict[str, dict]:
    """host -> endpoint config for every host that sends or receives in ``scn``."""
    deny: dict[str, list[int]] = {}
    for f in scn.faults:
        if f.event == "deny":
            p = plan.path(f.args["src"], f.args["dst"], f.args["plane"], f.args.get("t1"))
            deny.setdefault(f.args["src"], []).append(p.ev)
    out = {}
    qp_no: dict[str, int] = {}
    for host in scn.hosts():
        qps = []
        for fl in scn.flows:
            if fl.src != host:
                continue
            for _ in range(fl.qps):
                qp_no[host] = qp_no.get(host, 0) + 1
                qps.append({"qp": qp_no[host], "peer": fl.dst, "message_bytes": fl.message_bytes,
                            "op": fl.op, "start_s": fl.start_s, "duration_s": scn.duration_s - fl.start_s})
        out[host] = {
            "topo": str(spec_path), "host": host, "seed": scn.seed * 1000 + int(host[1:]),
            "transport": scn.transport, "settings": dict(scn.transport_settings),
            "denylist": deny.get(host, []), "qps": qps,
            "telemetry_path": str(folder / f"{host}.telemetry.jsonl"), "telemetry_interval_s": 0.1,
        }
    return out


def stop(procs: dict[str, subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM every endpoint (they write a final summary), then SIGKILL what is left."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_started(procs: dict[str, subprocess.Popen], folder: Path, t0_wall: float) -> None:
    """Wait until every endpoint has opened its sockets (its ``start`` record), at most until
    ``t0_wall``; raises RuntimeError naming an endpoint that died or did not start in time."""
    pending = set(procs)
    while pending:
        for host in list(pending):
            if any(r.get("type") == "start" for r in _lines(folder / f"{host}.telemetry.jsonl")):
                pending.discard(host)
            elif procs[host].poll() is not None:
                raise RuntimeError(f"endpoint on {host} exited with {procs[host].returncode} before starting "
                                   f"(see {folder / (host + '.log')})")
        if pending and time.time() > t0_wall:
            raise RuntimeError(f"endpoints {', '.join(sorted(pending))} not started by t = 0; the machine is overloaded")
        time.sleep(0.05)


def _lines(path: Path):
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill
    except OSError:
        return


class LiveTelemetry:
    """Tails every endpoint's telemetry for the live goodput figure of the progress line."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}
        self.last: dict[str, tuple[float, int]] = {}
        self.rate_mbps = 0.0

    def goodput_mbps(self) -> float:
        rates = []
        for path in self.folder.glob("*.telemetry.jsonl"):
            try:
                with open(path) as fh:
                    fh.seek(self.offsets.get(path, 0))
                    chunk = fh.read()
                    self.offsets[path] = fh.tell()
            except OSError:
                continue
            for line in chunk.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("type") != "sample":
                    continue
                delivered = sum(q.get("delivered_bytes", 0) for q in rec.get("rx_qps", {}).values())
                prev = self.last.get(str(path))
                self.last[str(path)] = (rec["t_wall"], delivered)
                if prev and rec["t_wall"] > prev[0]:
                    rates.append((str(path), (delivered - prev[1]) * 8 / 1e6 / (rec["t_wall"] - prev[0])))
        if rates:
            latest = dict(rates)
            self.rate_mbps = sum(latest.values())
        return self.rate_mbps


def collect(scn: Scenario, folder: Path, t0_wall: float) -> RunData:
    """Normalise every host's telemetry (receive side for goodput, send side for totals)."""
    d = RunData(duration_s=scn.duration_s)
    rtts = []
    for host in scn.hosts():
        for rec in _lines(folder / f"{host}.telemetry.jsonl"):
            t = rec.get("t_wall", t0_wall) - t0_wall
            typ = rec.get("type")
            if typ == "sample":
                for key, q in rec.get("rx_qps", {}).items():
                    name = f"{q.get('src', '?')}->{host}#{q.get('qp', key)}"
                    d.samples.setdefault(name, []).append((t, int(q.get("delivered_bytes", 0))))
                    d.qp_src[name] = q.get("src", "?")
                for q in rec.get("tx_qps", {}).values():
                    if q.get("srtt_us"):
                        rtts.append(float(q["srtt_us"]))
            elif typ == "event":
                e = {k: v for k, v in rec.items() if k not in ("type", "t_wall", "t_mono")}
                e["t"] = round(t, 4)
                e["host"] = host
                d.events.append(e)
            elif typ == "summary":
                for key, q in rec.get("tx_qps", {}).items():
                    name = f"{host}->{q.get('peer', '?')}#{q.get('qp', key)}"
                    tot = d.totals.setdefault(name, {})
                    tot.update({k: q.get(k, 0) for k in ("data_packets", "retransmits", "bytes_acked",
                                                          "messages_sent", "messages_acked")})
                for key, q in rec.get("rx_qps", {}).items():
                    name = f"{q.get('src', '?')}->{host}#{q.get('qp', key)}"
                    tot = d.totals.setdefault(name, {})
                    tot.update({"messages_delivered": q.get("messages_delivered", 0),
                                "messages_corrupt": q.get("messages_corrupt", 0),
                                "bytes_delivered": q.get("delivered_bytes", 0)})
    for pts in d.samples.values():
        pts.sort()
    if rtts:
        rtts.sort()
        d.rtt_us = rtts[len(rtts) // 2]
    return d
