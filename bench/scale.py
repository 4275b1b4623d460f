"""``mrclab bench scale``: the largest fabric, and the highest rate, this machine runs faithfully.

Per data plane, a ladder of fabrics (:data:`FABRICS`: 3 to 64 switches), each with every host
sending one MRC QP to a host of another T0 group (a permutation across the T1s, as the paper's
fig. 20) for :data:`DURATION_S`, at host-port rates from :data:`RATES_MBPS`. The T0-T1 links run
at the rate that keeps each T0 non-blocking (its hosts' rate over its uplinks). A rung is
**faithful** when the run had no fidelity fault (experiments/analysis/fidelity.py: no process starved of
CPU, no endpoint's timers late, no packet held past the model's longest round trip): the emulator
kept up. What the transport made of it is the
goodput column, as a share of the hosts' NIC ports (headers and acknowledgements take at least
0.04 of them with its 4 KiB payloads, 0.14 with 1 KiB; a low share at a faithful rung is the transport's regime,
e.g. too few packets in flight per path at bmv2's low rates, not the machine). The first
fabric climbs the rates from the lowest until a rung is not faithful; each larger fabric starts
from the best rate of the one before and goes down until one is (a larger fabric never carries
more per port on the same machine). A run the admission check refuses (experiments/run/admission.py,
with a calibration) counts as not faithful, with its reason.

Printed per fabric: switches, hosts, the highest faithful host-port rate, the aggregate goodput
there (Mb/s), and the CPU one switch hop costs per data packet: bmv2, the switch processes' CPU
(user + system, psutil) over data packets x 3 hops (their acknowledgements ride in the cost);
linux, the machine's kernel time (system, softirq, irq) over the same, an upper bound (the hosts'
own sending and receiving are in it). Not a test: figures vary with load; the table is what this
machine sustains now.

``--servers [N]`` asks what a server buys, by simulation: the same ladder on one machine, then
over 1 .. N namespace servers on this machine (emulation/nsservers.py, one plane per server in
turn, as ``mrclab run --servers``), each confined to :data:`SERVER_CPUS` while this process (its
hosts and endpoints) keeps the other CPUs, so a server's switch processes no longer take this
machine's CPU, as on separate machines. All of it in one run, side by side. What it cannot
simulate: the kernel's forwarding of a remote plane (softirq) still runs where frames arrive,
and the servers' CPUs are this machine's, shared between them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from mrclab.bench.tables import emit, per_dataplane, progress, run_scenario
from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.controller.dataplanes import here
from mrclab.emulation.nsservers import SSHD
from mrclab.emulation.nsservers import servers as ns_servers
from mrclab.emulation.placement import open_cluster
from mrclab.experiments.model.scenario import parse_scenario
from mrclab.topologies.errors import BadInput, MrclabError
from rich.table import Table

console = progress  # progress to stderr; the tables through emit
#: (planes, T0s per plane, T1s per plane, hosts per T0): 3, 8, 16, 32 and 64 switches.
FABRICS = ((1, 2, 1, 2), (2, 2, 2, 2), (4, 2, 2, 2), (8, 2, 2, 2), (8, 4, 4, 2))
#: Host-port rates tried (Mb/s), per data plane.
#: The lowest rungs are for the largest fabrics (64 switches on 2 cores: linux faithful at 1 Mb/s).
RATES_MBPS = {"bmv2": (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0), "linux": (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)}
DURATION_S = 8.0
#: Bytes of data per packet: the paper's 4 KiB frames (its section 2), as lab64-quickstart sends. A
#: packet is what an emulated switch hop costs, so a quarter of the packets carry the same bytes.
PAYLOAD_BYTES = 4096
#: The steady window the goodput is read over (s): after every QP's window opened.
WINDOW = (3.0, DURATION_S)
#: Data packets cross three switches on a path between T0 groups.
HOPS = 3
#: ``--servers``: the CPUs the namespace servers run on; this process and its hosts keep the rest
SERVER_CPUS = (0,)
#: ``--servers`` without a number: one machine, then 1 and 2 servers (issue 38's comparison)
DEFAULT_SERVERS = 2


def switches(fabric: tuple[int, int, int, int]) -> int:
    """Switches of a (planes, T0s, T1s, hosts per T0) fabric."""
    planes, t0, t1, _ = fabric
    return planes * (t0 + t1)


def hosts(fabric: tuple[int, int, int, int]) -> int:
    """Hosts of a (planes, T0s, T1s, hosts per T0) fabric."""
    return fabric[1] * fabric[3]


def scenario(fabric: tuple[int, int, int, int], mbps: float, dp: str) -> dict:
    """The scenario (as YAML would give it) of one rung: host i writes to host i + n/2 (another T0
    group) over one QP, 64 KiB messages of :data:`PAYLOAD_BYTES` packets, on ``dp`` with host ports
    at ``mbps``."""
    planes, t0, t1, per_t0 = fabric
    n = hosts(fabric)
    return {
        "name": f"bench-scale-{switches(fabric)}sw-{mbps:g}mbps",
        "fabric": {"topo": "lab", "planes": planes, "t0_per_plane": t0, "t1_per_plane": t1, "hosts_per_t0": per_t0,
                   "link": {"bandwidth_mbps": mbps, "t0_t1_bandwidth_mbps": mbps * per_t0 / t1,
                            "queue_packets": 32}},
        "dataplane": dp, "seed": 1, "duration_s": DURATION_S,
        "transport": {"kind": "mrc", "payload_bytes": PAYLOAD_BYTES},
        "workload": [{"src": f"h{i}", "dst": f"h{(i + n // 2) % n}", "qps": 1, "message_bytes": 65536}
                     for i in range(n)],
        "expect": [{"metric": "goodput_ports", "window": list(WINDOW)}],
    }


class SwitchCpu:
    """CPU seconds (user + system) used by the bmv2 switch processes while it runs (sampled every
    0.5 s: a switch's last sample stands for it when it exits), or on linux the machine's kernel
    time (system + softirq + irq) from start to stop."""

    def __init__(self, dp: str) -> None:
        """The counter of data plane ``dp`` (a name of controller/dataplanes.py), not started yet."""
        self.dp = dp
        self.processes = resolve(dp).switch_processes
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._k0 = self._kernel()
        self.total_s = 0.0

    @staticmethod
    def _kernel() -> float:
        t = psutil.cpu_times()
        return t.system + getattr(t, "softirq", 0.0) + getattr(t, "irq", 0.0)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            for p in psutil.process_iter(["name", "cpu_times"]):
                if p.info["name"] == "simple_switch_grpc" and p.info["cpu_times"] is not None:
                    self.seen[p.pid] = p.info["cpu_times"].user + p.info["cpu_times"].system

    def __enter__(self) -> SwitchCpu:
        """Start counting (bmv2: the sampling thread)."""
        if self.processes:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop counting; ``total_s`` holds the CPU seconds."""
        self._stop.set()
        if self.processes:
            self._thread.join(timeout=5)
            self.total_s = sum(self.seen.values())
        else:
            self.total_s = self._kernel() - self._k0


def rung(fabric: tuple[int, int, int, int], mbps: float, dp: str, out: Path, cluster=None) -> dict:
    """Run one rung into ``out`` (``cluster``: its planes on those servers); its figures:
    ``faithful`` (bool), ``why`` (when not), goodput ``mbps`` and ``share`` of the NIC ports in
    :data:`WINDOW`, ``us_per_hop`` (switch CPU µs per data packet per hop), ``faults`` (fidelity
    faults, described)."""
    scn = parse_scenario(scenario(fabric, mbps, dp), f"bench scale {switches(fabric)} switches at {mbps:g} Mb/s")
    ports = hosts(fabric) * fabric[0]
    try:
        with SwitchCpu(dp) as cpu:
            m, data = run_scenario(scn, out, cluster=cluster)
    except MrclabError as e:  # refused by admission, or endpoints not ready in time: this machine cannot
        return {"faithful": False, "why": e.one_line(), "mbps": 0.0, "share": 0.0, "us_per_hop": None, "faults": []}
    share = (m["expectations"][0]["value"] or 0.0) / ports
    sent = sum(x.get("data_packets", 0) for x in data.totals.values())
    faults = sorted({f["invariant"] for f in m["fidelity_faults"]})
    where = sorted({w for f in m["fidelity_faults"] for w in f["where"].split(", ")})
    named = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
    why = f"{' and '.join(faults)} ({named})" if faults else None
    return {"faithful": why is None, "why": why, "mbps": share * ports * mbps, "share": share,
            "us_per_hop": cpu.total_s / (sent * HOPS) * 1e6 if sent else None, "faults": faults}


def ladder(dp: str, work: Path, say=console.print, cluster=None) -> list[dict]:
    """Every fabric of :data:`FABRICS` on ``dp`` (``cluster``: over its servers): its best faithful
    rung (``rate_mbps`` None when even the lowest rate is not faithful) and every rung tried
    (``tried``: rate, faithful, why)."""
    rates = RATES_MBPS[dp]
    rows = []
    start = None  # index into rates the next fabric starts from (going down)
    for fabric in FABRICS:
        best, tried = None, []
        order = (range(len(rates)) if start is None else range(start, -1, -1))
        for i in order:
            mbps = rates[i]
            t0 = time.monotonic()
            say(f"[dim]{dp}: {switches(fabric)} switches, {hosts(fabric)} hosts at {mbps:g} Mb/s ...[/dim]")
            r = rung(fabric, mbps, dp, work / f"{dp}-{switches(fabric)}-{mbps:g}", cluster)
            tried.append((mbps, r["faithful"], r["why"]))
            say(f"[dim]  {'faithful' if r['faithful'] else 'not faithful: ' + r['why']} "
                f"({r['share']:.0%} of the NIC ports, {time.monotonic() - t0:.0f} s)[/dim]")
            if start is None:  # climbing: stop at the first rung that is not faithful
                if not r["faithful"]:
                    break
                best = (i, mbps, r)
            elif r["faithful"]:  # descending: the first faithful rung is the best
                best = (i, mbps, r)
                break
        rows.append({"fabric": fabric, "switches": switches(fabric), "hosts": hosts(fabric),
                     "rate_mbps": best[1] if best else None, "goodput_mbps": best[2]["mbps"] if best else None,
                     "share": best[2]["share"] if best else None,
                     "us_per_hop": best[2]["us_per_hop"] if best else None, "tried": tried})
        if best is None:
            break  # a larger fabric will not be faithful at a rate this one was not
        start = best[0]
    return rows


def table(dp: str, rows: list[dict], where: list[str] | None = None) -> Table:
    """The printed table of one data plane's ladder; ``where`` (one per row): where its switches
    ran (``--servers``), a first column."""
    cost = resolve(dp).hop_cost_words
    t = Table(title=f"mrclab bench scale ({dp}: every host writing across the T1s for {DURATION_S:g} s; the highest "
                    "host-port rate with no fidelity fault)")
    for c in (*(("switches on",) if where else ()), "switches", "hosts", "planes x T0 x T1", "host-port rate",
              "aggregate goodput", "of the NIC ports", cost, "first rate not faithful"):
        t.add_column(c, justify="right")
    for i, r in enumerate(rows):
        p, t0, t1, _ = r["fabric"]
        bad = [f"{mbps:g} Mb/s ({why})" for mbps, ok, why in r["tried"] if not ok]
        t.add_row(*((where[i],) if where else ()), str(r["switches"]), str(r["hosts"]), f"{p} x {t0} x {t1}",
                  "-" if r["rate_mbps"] is None else f"{r['rate_mbps']:g} Mb/s",
                  "-" if r["goodput_mbps"] is None else f"{r['goodput_mbps']:.1f} Mb/s",
                  "-" if r["share"] is None else f"{r['share']:.0%}",
                  "-" if r["us_per_hop"] is None else f"{r['us_per_hop']:.0f} µs",
                  bad[0] if bad else "-")
    return t


@contextlib.contextmanager
def confined(cpus: set[int]) -> Iterator[None]:
    """Every thread of this process on ``cpus`` while it lasts (the processes it starts inherit
    that: hosts, endpoints), then back to what each had."""
    before = {}
    for tid in (int(t) for t in os.listdir("/proc/self/task")):
        with contextlib.suppress(ProcessLookupError):
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid, mask in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, mask)


def check_servers(n: int | None) -> None:
    """Raise BadInput unless ``--servers n`` can run here: n from 1 to 8, sshd installed, and a CPU
    left for this machine besides :data:`SERVER_CPUS`."""
    if n is None:
        return
    if not 1 <= n <= 8:
        raise BadInput(f"--servers {n}: allowed: 1 to 8 namespace servers")
    if not os.path.exists(SSHD):
        raise BadInput(f"--servers: the namespace servers need {SSHD} (apt-get install -y openssh-server)")
    left = os.sched_getaffinity(0) - set(SERVER_CPUS)
    if not left or not set(SERVER_CPUS) <= os.sched_getaffinity(0):
        raise BadInput(f"--servers: needs CPUs {', '.join(map(str, SERVER_CPUS))} for the servers and another for this "
                       f"machine; this process may use CPUs {sorted(os.sched_getaffinity(0))}")


def over_servers(dp: str, work: Path, n: int, say=console.print) -> tuple[list[dict], list[str]]:
    """The ladder on ``dp`` on one machine, then over 1 .. ``n`` namespace servers confined to
    :data:`SERVER_CPUS` (this process on the other CPUs meanwhile): every row, and where each
    ran ("this machine", "1 server", ...)."""
    rows, where = ladder(dp, work / "local", say), []
    where += ["this machine"] * len(rows)
    mine = os.sched_getaffinity(0) - set(SERVER_CPUS)
    for k in range(1, n + 1):
        label = f"{k} server{'s' if k > 1 else ''}"
        say(f"[dim]{dp}: over {label} on CPU {', '.join(map(str, SERVER_CPUS))}, this machine on "
            f"{', '.join(map(str, sorted(mine)))} ...[/dim]")
        with tempfile.TemporaryDirectory(prefix="mrclab-nsservers-") as tmp, \
                ns_servers(k, Path(tmp), cpus=list(SERVER_CPUS)) as srv, \
                open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster, confined(mine):
            got = ladder(dp, work / label.replace(" ", "-"), say, cluster)
        rows += got
        where += [label] * len(got)
    return rows, where


def main(args=None) -> int:
    """``mrclab bench scale``: the ladder on every data plane asked for (default: every one this
    machine has), then one table each; with ``--servers [N]``, each table holds the ladder on one
    machine and over 1 .. N namespace servers. Returns 0; raises BadInput for a bad ``--servers``."""
    dps = getattr(args, "dataplane", None) or [p.name for p in here()]
    n = getattr(args, "servers", None)
    check_servers(n)
    if n:
        tables = per_dataplane(dps, "mrclab-bench-scale-", lambda dp, d: table(dp, *over_servers(dp, d, n)))
    else:
        tables = per_dataplane(dps, "mrclab-bench-scale-", lambda dp, d: table(dp, ladder(dp, d)))
    notes = ([f"Servers: namespaces on this machine with their own sshd, confined to CPU "
              f"{', '.join(map(str, SERVER_CPUS))}; this machine's hosts and endpoints on the others. A remote "
              "plane's kernel forwarding (softirq) is not confined."] if n else [])
    emit(tables, notes, bool(getattr(args, "markdown", False)))
    return 0
