"""``mrclab bench endpoint``: how fast the endpoint moves data, against a raw-socket ceiling.

Two settings: a plain veth pair between two namespaces (``mrclab-bench-a``/``-b``, one plane,
jumbo MTU) and the default linux fabric (h0 -> h2, 4 planes, 3 switches per path, unshaped). In
each, with 1 KiB and 4 KiB payloads: one QP of MRC, then of the RoCE-style baseline, for
``DURATION_S`` each; and a raw-socket blaster (``bench/blast.py``) sending frames of the same
size as fast as it can to a sink that reads every frame from a raw socket, as an endpoint does.
The three alternate for ``ROUNDS`` rounds and the median round of each is reported, so a slow spell
of the machine (rates move by +-20% between runs here) hits them alike. Printed: data packets per
second and goodput (Mb/s: bytes placed in the receiver's memory region; for the blaster, payload
bytes of the frames read), MRC / blaster, and the CPU per data packet of MRC's sender and receiver
(user + kernel, from the endpoints' telemetry).

Targets (issue 3, 2 cores): >= 50,000 MRC data packets/s over the veth pair and >= 30% of the
blaster's rate. Not a test: figures vary with load."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import yaml
from mrclab.bench.tables import emit, progress
from mrclab.controller.fabric import Fabric
from mrclab.controller.pathprobe import probe_frame
from mrclab.emulation import kernel
from mrclab.emulation.cleanup import RunState, cleanup_run, netns_name, stop_processes
from mrclab.experiments.run import endpoints
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import ClosSpec, load_spec
from mrclab.traffic import contract as C
from mrclab.traffic.settings import TransportSettings
from rich.table import Table

console = progress  # progress to stderr; the table through emit
DURATION_S = 4.0
ROUNDS = 3  # MRC, RoCE and the blaster alternate; the median round is reported
PAYLOADS = (1024, 4096)
HDR = H.DATA_OVERHEAD  # what a data packet adds to its payload on the wire (headers + ICRC)


class VethPair:
    """Two namespaces joined by one veth (h0-eth0 <-> h1-eth0), recorded for `mrclab clean`."""

    def __init__(self) -> None:
        """Make both namespaces and the veth (MTU 9000, IPv6 off), each namespace recorded before it
        is made. Raises KernelError."""
        self.state = RunState.create("bench", {})
        self.ns = {"h0": netns_name("bench-a"), "h1": netns_name("bench-b")}
        try:
            for ns in self.ns.values():
                self.state.add_netns(ns)  # recorded first: a signal in between still leaves it to cleanup
                kernel.netns_add(ns)
            kernel.veth_add(self.ns["h0"], "h0-eth0", self.ns["h1"], "h1-eth0")
            for h, ns in self.ns.items():
                kernel.sysctl(ns, [f"net.ipv6.conf.{h}-eth0.disable_ipv6=1"])
                kernel.link_set(ns, f"{h}-eth0", mtu=H.MTU, up=True)
        except BaseException:  # a signal or an error half way: nobody holds this object to close it
            cleanup_run(self.state)
            raise
        self.spec = {"name": "veth", "planes": 1, "t0_per_plane": 1, "t1_per_plane": 1, "hosts_per_t0": 2}

    def netns(self, h: str) -> str:
        """The namespace of end ``h`` (``h0`` or ``h1``)."""
        return self.ns[h]

    def popen(self, h: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside end ``h``'s namespace (``subprocess.Popen`` keywords pass through);
        not recorded: :meth:`close` stops whatever runs in the namespaces."""
        return kernel.netns_popen(self.ns[h], argv, **kw)

    def close(self) -> None:
        """Stop what runs in both namespaces and remove them (:func:`cleanup_run`)."""
        cleanup_run(self.state)


def one_qp(env, spec: dict, src: str, dst: str, transport: str, payload: int, tmp: Path) -> dict:
    """One QP from src to dst for DURATION_S. Returns ``pps`` and ``mbps`` (goodput) measured at the
    receiver from its first sample with data to its last that grew, and each end's CPU per data
    packet delivered: ``cpu_us_tx``/``cpu_us_rx`` (user + kernel) and ``sys_us_tx``/``sys_us_rx``
    (kernel), microseconds. All 0 when no data arrived."""
    topo = tmp / "fabric.yaml"
    topo.write_text(yaml.safe_dump(spec))
    settings = TransportSettings(payload_bytes=payload, region_bytes=64 << 20, window_packets=256)
    procs = {}
    (tmp / endpoints.GO_FILE).unlink(missing_ok=True)
    tel = {h: tmp / f"{h}-{transport}-{payload}.jsonl" for h in (src, dst)}
    for path in tel.values():  # endpoints append to their telemetry: start each run from none
        path.unlink(missing_ok=True)
    for host, qps in ((dst, ()), (src, (C.QpConfig(qp=1, peer=dst, message_bytes=1 << 20, duration_s=DURATION_S),))):
        cfg = C.EndpointConfig(topo=str(topo), host=host, seed=5, transport=transport, settings=settings, qps=qps,
                               telemetry_path=str(tel[host]), telemetry_interval_s=0.25,
                               go_path=str(tmp / endpoints.GO_FILE))
        (tmp / f"{host}.json").write_text(cfg.to_json())
        procs[host] = env.popen(host, [sys.executable, "-m", "mrclab.traffic.endpoint", "--config",
                                       str(tmp / f"{host}.json")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoints.wait_ready(procs, tmp, endpoints.ready_bound_s(2), telemetry=tel)
        endpoints.go(tmp)
        procs[src].wait(timeout=DURATION_S + 30)
    finally:
        stop_processes([psutil.Process(p.pid) for p in procs.values() if p.poll() is None], grace_s=10)
        for p in procs.values():
            p.poll()
    recs = {h: list(C.read_telemetry(path)) for h, path in tel.items()}
    samples = [(r.t_wall, sum(q.delivered_bytes for q in r.rec.rx)) for r in recs[dst] if isinstance(r.rec, C.Sample)]
    moving = [(t, b) for t, b in samples if b > 0]
    # steady state: from the first sample with data to the last one that grew
    grew = [moving[i] for i in range(1, len(moving)) if moving[i][1] > moving[i - 1][1]]
    if len(moving) < 2 or not grew:
        return {"pps": 0.0, "mbps": 0.0, "cpu_us_tx": 0.0, "cpu_us_rx": 0.0, "sys_us_tx": 0.0, "sys_us_rx": 0.0}
    (t0, b0), (t1, b1) = moving[0], grew[-1]
    dt = max(t1 - t0, 1e-6)
    # CPU per data packet of each endpoint (its run loop, kernel work on its behalf included): a
    # figure that, unlike the rate, does not move with what else the machine is doing
    cpu, sys_ = {}, {}
    for host in (src, dst):
        last = next((r.rec for r in reversed(recs[host]) if isinstance(r.rec, C.Summary)), None)
        cpu[host], sys_[host] = (last.cpu_s, last.cpu_sys_s) if last else (0.0, 0.0)
    n = b1 / payload
    return {"pps": (b1 - b0) / payload / dt, "mbps": (b1 - b0) * 8 / 1e6 / dt,
            "cpu_us_tx": cpu[src] / n * 1e6, "cpu_us_rx": cpu[dst] / n * 1e6,
            "sys_us_tx": sys_[src] / n * 1e6, "sys_us_rx": sys_[dst] / n * 1e6}


def sized_frame(frame: bytes, length: int) -> bytes:
    """``frame`` (Ethernet / IPv6 / IPv6 / UDP / payload) grown to ``length`` bytes by padding its UDP
    payload, every length field rewritten: routers trim a frame to its IPv6 payload length."""
    from scapy.layers.inet import UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    pkt = Ether(frame)
    body = bytes(pkt[UDP].payload)
    pkt[UDP].remove_payload()
    pkt = pkt / Raw(body + bytes(length - len(frame)))
    for layer in (pkt[IPv6], pkt[IPv6].payload):
        del layer.plen
    del pkt[UDP].len
    del pkt[UDP].chksum
    out = bytes(pkt)
    assert len(out) == length, (len(out), length)
    return out


def blaster(env, src: str, dst: str, intf_src: str, intf_dst: str, frame: bytes) -> float:
    """Frames per second a receiving process reads while a raw-socket sender sends as fast as it can
    for 3 s: sockets and kernel with no protocol, the ceiling of a raw-socket endpoint."""
    rx = env.popen(dst, [sys.executable, "-m", "mrclab.bench.blast", "--sink", "--iface", intf_dst,
                         "--length", str(len(frame))], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert rx.stdout is not None
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError(f"blaster sink on {dst} did not start")
        kernel.netns_exec(env.netns(src), [sys.executable, "-m", "mrclab.bench.blast",
                        "--iface", intf_src, "--frame", frame.hex(), "--rate", "10000000", "--duration", "3"],
                       capture_output=True, text=True, check=True)
        out, _ = rx.communicate(timeout=35)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    m = re.search(r"received (\d+) in ([\d.]+) s", out)
    return int(m.group(1)) / float(m.group(2)) if m and float(m.group(2)) > 0 else 0.0


def _median_run(runs: list[dict]) -> dict:
    """The run with the median rate (its CPU figures with it)."""
    return sorted(runs, key=lambda r: r["pps"])[len(runs) // 2]


def measure(env, spec: dict, src: str, dst: str, log) -> dict:
    """Per payload: MRC, RoCE and the blaster in ``ROUNDS`` alternating rounds (so that a slow spell
    of the machine hits all three alike); each figure is the median round."""
    plan = AddressPlan(ClosSpec.from_dict(spec))
    res = {}
    with tempfile.TemporaryDirectory(prefix="mrclab-bench-") as d:
        for payload in PAYLOADS:
            frame = sized_frame(probe_frame(plan, plan.paths(src, dst)[0], 0, 0), payload + HDR)
            runs: dict[str, list] = {"mrc": [], "roce": [], "blaster": []}
            for k in range(ROUNDS):
                for transport in ("mrc", "roce"):
                    r = one_qp(env, spec, src, dst, transport, payload, Path(d))
                    runs[transport].append(r)
                    log(f"  {k + 1}/{ROUNDS} {transport} {payload} B: {r['pps']:,.0f} pps; CPU us/pkt: send "
                        f"{r['cpu_us_tx']:.1f} (kernel {r['sys_us_tx']:.1f}), recv {r['cpu_us_rx']:.1f} "
                        f"(kernel {r['sys_us_rx']:.1f})")
                pps = blaster(env, src, dst, plan.host_intf(src, 0), plan.host_intf(dst, 0), frame)
                runs["blaster"].append(pps)
                log(f"  {k + 1}/{ROUNDS} blaster {payload} B: {pps:,.0f} pps")
            res[payload] = {"mrc": _median_run(runs["mrc"]), "roce": _median_run(runs["roce"]),
                            "blaster_pps": sorted(runs["blaster"])[ROUNDS // 2],
                            "rounds": {t: [x if t == "blaster" else x["pps"] for x in v] for t, v in runs.items()}}
    return res


def run(args=None) -> dict:
    """:func:`measure` over the veth pair (h0 -> h1), then over the default linux fabric (h0 -> h2):
    {setting: its result}. ``args`` is unused."""
    out = {}
    console.print("[dim]veth pair (one plane)[/dim]")
    veth = VethPair()
    try:
        out["veth pair"] = measure(veth, veth.spec, "h0", "h1", lambda m: console.print(f"[dim]{m}[/dim]"))
    finally:
        veth.close()
    console.print("[dim]default linux fabric, h0 -> h2 (4 planes, 3 switches per path)[/dim]")
    spec = load_spec()
    with Fabric(spec, "linux", watchdog=False) as fab:
        out["linux fabric"] = measure(fab.emu, spec.to_dict(), "h0", "h2", lambda m: console.print(f"[dim]{m}[/dim]"))
    return out


def main(args=None) -> int:
    """``mrclab bench endpoint``: :func:`run`, then one table of its figures. Returns 0."""
    res = run(args)
    t = Table(title=f"mrclab bench endpoint (one QP, {DURATION_S:.0f} s per run, "
                    f"median of {ROUNDS} alternating rounds)")
    for c in ("setting", "payload", "MRC pps", "MRC Mb/s", "blaster pps", "blaster Mb/s", "MRC / blaster", "RoCE pps",
              "RoCE Mb/s", "MRC CPU us/pkt send / recv"):
        t.add_column(c, justify="right")
    for setting, rows in res.items():
        for payload, r in rows.items():
            ratio = r["mrc"]["pps"] / r["blaster_pps"] if r["blaster_pps"] else 0.0
            t.add_row(setting, f"{payload}", f"{r['mrc']['pps']:,.0f}", f"{r['mrc']['mbps']:,.0f}",
                      f"{r['blaster_pps']:,.0f}", f"{r['blaster_pps'] * payload * 8 / 1e6:,.0f}", f"{ratio:.0%}",
                      f"{r['roce']['pps']:,.0f}", f"{r['roce']['mbps']:,.0f}",
                      f"{r['mrc']['cpu_us_tx']:.1f} / {r['mrc']['cpu_us_rx']:.1f}")
    emit([t], ["targets: >= 50,000 MRC data packets/s over the veth pair, >= 30% of the blaster"],
         bool(getattr(args, "markdown", False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
