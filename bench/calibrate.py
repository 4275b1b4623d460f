"""``mrclab calibrate``: what this machine sustains, measured once and cached for admission.

Per data plane (and per BMv2 build, by the binary's path and modification time), on this machine
(host name, cores, kernel), it measures:

* ``endpoint_start_cpu_s``: CPU seconds an endpoint spends before it is ready (imports, sockets);
* ``endpoint_idle_cores``: CPU an endpoint with nothing to send uses per second of wall time;
* ``endpoint_tx_us`` / ``endpoint_rx_us``: CPU microseconds per data packet at the sender and at
  the receiver (one MRC QP at full speed over a veth pair, 1 KiB payload; mrclab bench endpoint's
  measurement);
* ``switch_us_per_hop``: CPU microseconds one switch hop costs per packet: on bmv2 the switches'
  own CPU at a fixed rate over a 3-switch path (mrclab bench fabric's figure); on linux the whole
  machine's kernel time (system, softirq, irq) at a fixed rate divided by packets and hops, an
  upper bound (the blaster's sending and the last host's receiving are in it);
* ``switch_idle_cores``: CPU an idle switch process uses per second (bmv2; 0 on linux, where a
  switch is a namespace and costs nothing idle).

The result is cached in ``$MRCLAB_CACHE/calibration.json`` (default ``~/.cache/mrclab``) and read
by the runner's admission check (experiments/run/admission.py) and ``mrclab doctor``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from mrclab.bench import endpoint as bench_endpoint
from mrclab.bench import fabric as bench_fabric
from mrclab.controller.dataplanes import dataplane, here
from mrclab.controller.fabric import Fabric
from mrclab.emulation.cleanup import stop_processes
from mrclab.experiments.run import endpoints
from mrclab.experiments.run.admission import Calibration, machine_key, save_calibration
from mrclab.topologies.spec import load_spec
from mrclab.traffic import contract as C
from rich.console import Console

console = Console(stderr=True, highlight=False)
#: the rate at which the per-hop cost is measured (pps): low enough for any machine to carry
RATE_PPS = 2000


def _start_cost() -> float:
    """CPU seconds (user + system) a fresh Python spends importing the endpoint's module."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    psutil.Popen([sys.executable, "-c", "import mrclab.traffic.endpoint"]).wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _endpoint_figures(log) -> dict:
    """Per-packet and idle CPU of the endpoint over a veth pair."""
    veth = bench_endpoint.VethPair()
    try:
        with tempfile.TemporaryDirectory(prefix="mrclab-calibrate-") as d:
            r = bench_endpoint.one_qp(veth, veth.spec, "h0", "h1", "mrc", 1024, Path(d))
            log(f"endpoint: {r['pps']:,.0f} pps, CPU per data packet: send {r['cpu_us_tx']:.1f} us, "
                f"receive {r['cpu_us_rx']:.1f} us")
            idle = _idle_endpoint_cores(veth, Path(d))
            log(f"endpoint idle: {idle:.3f} cores")
    finally:
        veth.close()
    return {"endpoint_tx_us": r["cpu_us_tx"], "endpoint_rx_us": r["cpu_us_rx"], "endpoint_idle_cores": idle}


def _idle_endpoint_cores(env, tmp: Path, seconds: float = 2.0) -> float:
    """CPU (cores) of an endpoint with no QP, once ready, over ``seconds``."""
    topo = tmp / "idle-topo.yaml"
    topo.write_text(json.dumps(env.spec))
    tel = tmp / "idle.jsonl"
    tel.unlink(missing_ok=True)
    cfg = C.EndpointConfig(topo=str(topo), host="h0", telemetry_path=str(tel), receiver_linger_s=seconds + 30,
                           go_path=str(tmp / endpoints.GO_FILE))
    (tmp / endpoints.GO_FILE).unlink(missing_ok=True)
    (tmp / "idle.json").write_text(cfg.to_json())
    p = env.popen("h0", [sys.executable, "-m", "mrclab.traffic.endpoint", "--config", str(tmp / "idle.json")],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoints.wait_ready({"h0": p}, tmp, endpoints.ready_bound_s(1), telemetry={"h0": tel})
        endpoints.go(tmp, lead_s=0.0)
        time.sleep(0.5)
        proc = psutil.Process(p.pid)
        c0 = sum(proc.cpu_times()[:2])
        time.sleep(seconds)
        return (sum(proc.cpu_times()[:2]) - c0) / seconds
    finally:
        stop_processes([psutil.Process(p.pid)] if p.poll() is None else [])
        p.wait()


def _switch_figures(dataplane: str, log) -> dict:
    """Per-hop and idle CPU of the switches of the default fabric."""
    with Fabric(load_spec(), dataplane, watchdog=False) as fab:
        hops = len(bench_fabric.path_hops(fab))
        if fab.plane.switch_processes:  # each switch a process: its own CPU
            per_hop = bench_fabric.cpu_us_per_packet(fab, RATE_PPS)
            pids = [sw.proc.pid for sw in fab.emu.switches()]
            before = [bench_fabric._cpu_s(p) for p in pids]
            time.sleep(2.0)
            idle = (sum(bench_fabric._cpu_s(p) for p in pids) - sum(before)) / len(pids) / 2.0
        else:
            busy0 = _busy_s()
            achieved, _ = bench_fabric.trial(fab, bench_fabric.path_frame(fab), *bench_fabric.PATH[:3], RATE_PPS)
            per_hop = (_busy_s() - busy0) / (achieved * bench_fabric.TRIAL_S * hops) * 1e6
            idle = 0.0
        log(f"{dataplane} switch: {per_hop:.1f} us per packet per hop, idle {idle:.3f} cores")
    return {"switch_us_per_hop": per_hop, "switch_idle_cores": idle}


def _busy_s() -> float:
    """CPU seconds the whole machine has spent in the kernel (system, softirq, irq): where a linux
    switch forwards; user time (the blaster's, anything else running) is left out."""
    t = psutil.cpu_times()
    return t.system + getattr(t, "softirq", 0.0) + getattr(t, "irq", 0.0)


def calibrate(dataplanes: list[str], log=lambda m: console.print(f"[dim]{m}[/dim]")) -> list[Calibration]:
    """Measure each data plane on this machine and cache it; returns what it measured."""
    out = []
    start = _start_cost()
    log(f"endpoint start: {start:.2f} CPU-s of imports")
    ep = _endpoint_figures(log)
    for dp in dataplanes:
        sw = _switch_figures(dp, log)
        c = Calibration(machine=machine_key(), dataplane=dp, build=dataplane(dp).build_id(),
                        cores=psutil.cpu_count() or 1, endpoint_start_cpu_s=round(start, 3),
                        endpoint_idle_cores=round(ep["endpoint_idle_cores"], 4),
                        endpoint_tx_us=round(ep["endpoint_tx_us"], 2), endpoint_rx_us=round(ep["endpoint_rx_us"], 2),
                        switch_us_per_hop=round(sw["switch_us_per_hop"], 2),
                        switch_idle_cores=round(sw["switch_idle_cores"], 4), when=time.strftime("%Y-%m-%d %H:%M"))
        save_calibration(c)
        out.append(c)
    return out


def main(args) -> int:
    """``mrclab calibrate [--dataplane D]``: prints and caches the figures."""
    planes = args.dataplane or [p.name for p in reversed(here())]
    for c in calibrate(planes):
        console.print(json.dumps(c.as_dict(), indent=1))
    return 0
