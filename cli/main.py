"""mrclab: emulate a multi-plane SRv6 Clos, run MRC (or RoCE) on it, break it and measure.

    mrclab up        [--topo FILE] [--dataplane bmv2|linux] [--debug] [--no-cli]
    mrclab probe     [--topo FILE] [--dataplane bmv2|linux] [--evidence] [--json FILE]
    mrclab size      --ports N [--planes P]
    mrclab shell     SWITCH
    mrclab clean     [--force]
    mrclab bench     fabric|endpoint|congestion|scale|fidelity|qp|nscc [--dataplane bmv2|linux]
    mrclab run       [SCENARIO] [--out DIR] [--duration S] [--dataplane D] [--transport mrc|roce] [--set K=V]
    mrclab reproduce [--quick] [--dataplane D] [--only SCENARIO...] [--out DIR | --update REPORT]
    mrclab calibrate [--dataplane bmv2|linux]
    mrclab doctor
    mrclab report    RESULTS...

Exit codes: 0 success; 1 a run failed or a check did not hold (a path, an expectation); 2 bad
input (the message says which file and field); 3 this machine cannot do it (not root, toolchain
missing); 128 + N killed by signal N (after tearing down).

Every error a user can cause ends here, in :func:`main`, as one line on stderr
(topologies/errors.py): never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from mrclab.bench import calibrate as bench_calibrate
from mrclab.bench import congestion as bench_congestion
from mrclab.bench import endpoint as bench_endpoint
from mrclab.bench import fabric as bench_fabric
from mrclab.bench import fidelity as bench_fidelity
from mrclab.bench import nscc as bench_nscc
from mrclab.bench import qp as bench_qp
from mrclab.bench import scale as bench_scale
from mrclab.controller.dataplanes import DATAPLANES, dataplane
from mrclab.controller.fabric import Fabric
from mrclab.controller.pathprobe import implicate, probe_paths
from mrclab.emulation.cleanup import clean, live_runs
from mrclab.emulation.nodes import bmv2_device, bmv2_grpc_addr, need_root
from mrclab.emulation.placement import open_cluster
from mrclab.emulation.servers import parse_servers
from mrclab.experiments.analysis import report
from mrclab.experiments.model.claims import metric_help
from mrclab.experiments.run import doctor, repeat, reproduce, runner
from mrclab.experiments.run.admission import RATES
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import BadInput, MrclabError, NotAvailable
from mrclab.topologies.sizing import size_clos
from mrclab.topologies.spec import ClosSpec, load_spec
from mrclab.traffic.settings import TransportSettings
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False)


def _progress(msg: str) -> None:
    console.print(f"[dim]·[/dim] {msg}")


def teardown_on_signals() -> dict:
    """SIGTERM and SIGHUP end the command through normal unwinding (SystemExit), so every fabric's
    context manager tears it down; SIGINT raises KeyboardInterrupt even when the shell that started
    us ignored it. Once the first signal arrives the others are ignored, so a second one cannot
    cut the teardown short."""

    def handler(signum, _frame):
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, handler)
    return previous


# ---- up -------------------------------------------------------------------------------------------
def cmd_up(args) -> int:
    """``mrclab up``: bring the fabric up, verify it and hold it (Mininet CLI, or until a signal)."""
    spec = load_spec(args.topo)
    need_root("mrclab up")
    with open_cluster(args.servers, args.ssh_config, files=(args.topo,)) as cluster:
        dp = _choose_dataplane(args.dataplane, cluster is not None)
        with Fabric(spec, dp, debug=args.debug, progress=_progress, **_placed(cluster)) as fab:
            return _hold(spec, dp, fab, args)


def _placed(cluster) -> dict:
    """Fabric keywords that put its planes on ``cluster``'s servers (none for one machine)."""
    return {} if cluster is None else {"placement": cluster.placement, "ssh": cluster.ssh}


def _hold(spec, dp: str, fab, args) -> int:
    """Say the fabric is up and hold it (Mininet CLI, or until a signal)."""
    t = fab.timings
    console.print(f"[green]fabric {spec.name} up[/green] on [bold]{dp}[/bold]: {spec.n_hosts} hosts, "
                  f"{spec.n_switches} switches, {spec.n_links} links, {fab.routes.n_entries} entries, "
                  f"verified in {t['total_s']:.1f} s")
    console.print("nodes: " + " ".join(spec.hosts() + spec.switches()))
    if fab.placement is not None:
        console.print("placement: " + fab.placement.describe(spec.planes))
    out.print(f"ready {fab.emu.run_dir}", soft_wrap=True)
    sys.stdout.flush()
    if args.no_cli or not sys.stdin.isatty():
        console.print("running until SIGINT/SIGTERM")
        while True:
            signal.pause()
    else:
        from mininet.cli import CLI

        console.print("Mininet CLI: `h0 ip link`, `t0-0-0 ip -6 route`; namespaces are mrclab-<node>")
        CLI(fab.emu.net)
    return 0


def _choose_dataplane(requested: str | None, remote: bool = False) -> str:
    """The data plane to run: ``requested``, else the best here (bmv2 where the toolchain is; the
    servers of a fabric over servers, ``remote``, need it too: `mrclab doctor --servers` checks).
    Raises NotAvailable for bmv2 without the toolchain."""
    plane = dataplane(requested)
    if requested is None:
        away = [f"{p.name} unavailable: {p.missing()}" for p in DATAPLANES.values() if p.missing()]
        console.print(f"data plane: [bold]{plane.name}[/bold]" + (f" ({'; '.join(away)})" if away else
                                                                  " (P4 toolchain found)"))
    elif why := plane.missing():
        raise NotAvailable(f"data plane {plane.name} needs the P4 toolchain: {why}")
    return plane.name


# ---- probe ----------------------------------------------------------------------------------------
def cmd_probe(args) -> int:
    """``mrclab probe``: one probe per path (of the running fabric, or of one it starts); exit 1 if any failed."""
    need_root("mrclab probe")
    running = live_runs()
    if running and args.topo is None and args.dataplane is None:
        st = running[0]

        spec = ClosSpec.from_dict(st.topo, source=f"{st.run_dir}/state.json")
        plan = AddressPlan(spec)
        console.print(f"using the fabric that `mrclab up` runs (pid {st.owner_pid}, {st.dataplane})")
        if args.evidence:
            console.print("[yellow]--evidence needs a fabric this command starts itself; ignored[/yellow]")
        results = probe_paths(plan, lambda n: f"mrclab-{n}", timeout_s=args.timeout)
        return _report_probe(spec, results, implicate, args)
    spec = load_spec(args.topo)

    with open_cluster(args.servers, args.ssh_config, files=(args.topo,)) as cluster:
        dp = _choose_dataplane(args.dataplane, cluster is not None)
        with Fabric(spec, dp, progress=_progress, watchdog=False, **_placed(cluster)) as fab:
            count = (lambda: fab.switch_packets()) if args.evidence else None
            console.print(f"probing {len(fab.plan.all_paths())} paths")
            results = probe_paths(fab.plan, fab.netns, timeout_s=args.timeout, count_packets=count)
    return _report_probe(spec, results, implicate, args)


def _report_probe(spec, results, implicate, args) -> int:
    hosts = spec.hosts()
    table = Table(title=f"reachability: delivered / paths ({spec.name})")
    table.add_column("src \\ dst")
    for h in hosts:
        table.add_column(h, justify="center")
    for a in hosts:
        row = []
        for b in hosts:
            rs = [r for r in results if r.path.src == a and r.path.dst == b]
            if not rs:
                row.append("-")
                continue
            ok = sum(r.delivered for r in rs)
            style = "green" if ok == len(rs) else ("red" if ok == 0 else "yellow")
            row.append(f"[{style}]{ok}/{len(rs)}[/{style}]")
        table.add_row(a, *row)
    out.print(table)
    failed = [r for r in results if not r.delivered]
    for r in failed[:20]:
        p = r.path
        out.print(f"[red]FAIL[/red] {p.src}->{p.dst} plane {p.plane} T1 {p.t1} via {' '.join(p.hops)}: {r.problem}")
    if len(failed) > 20:
        out.print(f"... and {len(failed) - 20} more failed paths")
    if args.evidence and results and not failed:
        wrong = [r for r in results if set(r.evidence) != set(r.path.hops)]
        out.print(f"per-switch evidence: {len(results) - len(wrong)}/{len(results)} probes counted by exactly "
                  "the switches their address named")
    if failed:
        for elem, n in implicate(results):
            out.print(f"implicated: [bold]{elem}[/bold] (all {n} probed paths through it failed)")
    out.print(f"{len(results) - len(failed)}/{len(results)} paths delivered")
    if args.json:
        Path(args.json).write_text(json.dumps([
            {"src": r.path.src, "dst": r.path.dst, "plane": r.path.plane, "t1": r.path.t1, "ev": r.path.ev,
             "outer_dst": str(r.path.outer_dst), "hops": r.path.hops, "delivered": r.delivered,
             "problem": r.problem, "evidence": r.evidence} for r in results], indent=1))
    return 1 if failed else 0


# ---- size / clean / shell -------------------------------------------------------------------------
def cmd_size(args) -> int:
    """``mrclab size``: the largest two-tier multi-plane Clos of ``--ports``-port switches, as a table."""
    try:
        s = size_clos(args.ports, args.planes)
    except ValueError as e:
        raise BadInput(str(e)) from None
    t = Table(title=f"largest two-tier Clos of {s.ports}-port switches, {s.planes} planes")
    t.add_column("quantity")
    t.add_column("count", justify="right")
    for k, v in [("hosts (NICs)", s.hosts), ("T0 per plane", s.t0_per_plane), ("T1 per plane", s.t1_per_plane),
                 ("hosts per T0", s.hosts_per_t0), ("switches", s.switches), ("host-T0 links", s.host_links),
                 ("T0-T1 links", s.fabric_links), ("links", s.links)]:
        t.add_row(k, f"{v:,}")
    out.print(t)
    out.print(f"one T0-T1 link is {100 * s.t0_t1_link_share():.2f}% of a node's capacity; "
              f"one NIC-T0 link is 1/{s.planes}")
    out.print(f"hosts: {s.hosts}")
    if not s.encodable:
        out.print("[yellow]note: this size exceeds what mrclab can build (8 planes: a NIC's port-state byte; "
                  "1024 switches per tier per plane: the uSID)[/yellow]")
    return 0


def cmd_clean(args) -> int:
    """``mrclab clean``: remove what crashed runs left behind (only mrclab's own)."""
    need_root("mrclab clean")
    if args.ssh_config and not args.servers:
        raise BadInput("--ssh-config is for --servers; give both, or neither")
    removed = clean(force=args.force, servers=parse_servers(args.servers) if args.servers else None,
                    ssh_config=args.ssh_config)
    for r in removed:
        out.print(f"removed {r}")
    if not removed:
        out.print("nothing of mrclab's left to clean")
    return 0


def cmd_shell(args) -> int:
    """``mrclab shell SWITCH``: replace this process by p4runtime-shell on a switch of the running bmv2 fabric."""
    runs = [r for r in live_runs() if dataplane(r.dataplane).p4runtime]
    if not runs:
        raise NotAvailable("no bmv2 fabric is running; start one with `mrclab up --dataplane bmv2`")
    st = runs[0]
    spec = ClosSpec.from_dict(st.topo)
    if args.switch not in spec.switches():
        raise BadInput(f"unknown switch {args.switch!r}; switches: {', '.join(spec.switches())}")
    dev, addr = bmv2_device(spec, args.switch), bmv2_grpc_addr(st.run_dir, args.switch)
    console.print(f"p4runtime-shell on {args.switch} (device {dev}, {addr}); P4Info is read from the switch")
    os.execvp(sys.executable, [sys.executable, "-m", "p4runtime_sh", "--grpc-addr", addr,
                               "--device-id", str(dev), "--election-id", "0,2"])


# ---- bench / run / report (experiments) -----------------------------------------------------------
def cmd_bench(args) -> int:
    """``mrclab bench fabric|endpoint|congestion|scale|fidelity|qp|nscc``: the benchmark's own main."""
    if getattr(args, "servers", None) is not None and args.what != "scale":
        raise BadInput(f"--servers is for mrclab bench scale, not bench {args.what}")
    need_root(f"mrclab bench {args.what}")
    bench = {"fabric": bench_fabric, "congestion": bench_congestion, "endpoint": bench_endpoint,
             "scale": bench_scale, "fidelity": bench_fidelity, "qp": bench_qp, "nscc": bench_nscc}[args.what]
    return bench.main(args)


def cmd_calibrate(args) -> int:
    """``mrclab calibrate``: measure and cache what this machine sustains (bench/calibrate.py)."""
    need_root("mrclab calibrate")
    return bench_calibrate.main(args)


def cmd_run(args) -> int:
    """``mrclab run``: one run, or ``--repeat N`` seeds (experiments/run/repeat.py)."""
    if args.repeat > 1:
        need_root("mrclab run")
        if args.pcap or args.debug:
            raise BadInput("--repeat runs each seed without captures; drop --pcap / --debug, or run one seed")
        return repeat.main(args)
    return runner.main(args)


def cmd_reproduce(args) -> int:
    """``mrclab reproduce``: the paper's table (experiments/run/reproduce.py)."""
    return reproduce.main(args)


def cmd_doctor(args) -> int:
    """``mrclab doctor``: what this machine has and can run."""
    return doctor.main(args)


def cmd_report(args) -> int:
    """``mrclab report``: several results folders side by side."""
    return report.main(args)


def _repeats(text: str) -> int:
    """``--repeat N``: a whole number of runs from 1 to 50."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 50:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of runs from 1 to 50")
    return n


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option reported as one line (what is wrong, what is allowed)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _servers_args(s) -> None:
    """``--servers`` and ``--ssh-config`` on a command that builds a fabric."""
    s.add_argument("--servers", metavar="A,B,...|FILE",
                   help="run the planes on these servers, one plane per server round-robin ([user@]address, "
                        "comma-separated, reached over ssh), or as FILE's servers: block places them (also read "
                        "from the fabric or scenario file); hosts, endpoints and the controller stay here")
    s.add_argument("--ssh-config", metavar="FILE", help="ssh client configuration for the servers (ssh -F)")


#: --dataplane's help where a command picks one for itself
DP_HELP = "data plane (default: the first this machine can run: bmv2 where p4c and simple_switch_grpc are installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``mrclab`` argument parser: one subcommand per command, bad options as one line."""
    p = _Parser(prog="mrclab", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _fabric_commands(sub)
    _bench_command(sub)
    _run_commands(sub)
    _machine_commands(sub)
    return p


def _fabric_commands(sub) -> None:
    """``up``, ``probe``, ``size``, ``clean``, ``shell``: the fabric itself."""
    s = sub.add_parser("up", help="bring the fabric up, verify it and open the Mininet CLI")
    s.add_argument("--topo", help="fabric spec YAML (default: topologies/lab.yaml)")
    s.add_argument("--dataplane", choices=list(DATAPLANES), default=None, help=DP_HELP)
    s.add_argument("--debug", action="store_true", help="BMv2 per-packet logging and pcaps in the run directory")
    s.add_argument("--no-cli", action="store_true", help="no CLI: stay up until SIGINT/SIGTERM")
    _servers_args(s)
    s.set_defaults(fn=cmd_up)

    s = sub.add_parser("probe", help="probe every path; exit 1 when any fails")
    s.add_argument("--topo")
    s.add_argument("--dataplane", choices=list(DATAPLANES), default=None, help=DP_HELP)
    s.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for probes (default 1)")
    s.add_argument("--evidence", action="store_true", help="probe paths one by one and read per-switch counters")
    s.add_argument("--json", help="also write the results as JSON to this file")
    _servers_args(s)
    s.set_defaults(fn=cmd_probe)

    s = sub.add_parser("size", help="size the largest two-tier multi-plane Clos for a switch radix")
    s.add_argument("--ports", type=int, required=True)
    s.add_argument("--planes", type=int, default=8)
    s.set_defaults(fn=cmd_size)

    s = sub.add_parser("clean", help="remove what crashed runs left behind (only mrclab's own)")
    s.add_argument("--force", action="store_true", help="also stop runs whose owner is still alive")
    s.add_argument("--servers", metavar="A,B,...", help="also remove mrclab's node namespaces that no live run owns "
                   "on these servers ([user@]address, comma-separated; never `mn -c`)")
    s.add_argument("--ssh-config", metavar="FILE", help="ssh client configuration for the servers (ssh -F)")
    s.set_defaults(fn=cmd_clean)

    s = sub.add_parser("shell", help="p4runtime-shell on a switch of the running bmv2 fabric")
    s.add_argument("switch")
    s.set_defaults(fn=cmd_shell)



def _bench_command(sub) -> None:
    """``bench``: the benchmarks."""
    s = sub.add_parser("bench", help="benchmarks: fabric bring-up and forwarding, endpoint rates, congestion control, "
                                     "the largest fabric and rate this machine runs faithfully, "
                                     "one QP against its ports, NSCC against UEC's reference simulator")
    s.add_argument("what", choices=["fabric", "endpoint", "congestion", "scale", "fidelity", "qp", "nscc"])
    s.add_argument("--dataplane", action="append", choices=list(DATAPLANES),
                   help="data plane(s) to measure (default: every available one)")
    s.add_argument("--target", choices=["endpoint", "switch", "nic", "steal"],
                   help="fidelity: what is held back on purpose (default: endpoint; switch: bmv2's switch "
                        "processes; nic: every host NIC port's drain, a set time each second; steal: nothing, "
                        "untouched runs binned by the CPU the hypervisor took)")
    s.add_argument("--only", action="append", metavar="SCENARIO",
                   help="fidelity: the scenario(s) to starve (default: quickstart and incast)")
    s.add_argument("--markdown", action="store_true",
                   help="print the tables as Markdown headed with the command, date, commit and machine "
                        "(docs/benchmarks.md); progress goes to stderr")
    s.add_argument("--out", help="fidelity, nscc: the folder for every run and plot "
                                 "(default: results/bench-<what>-<time>)")
    s.add_argument("--servers", type=int, nargs="?", const=bench_scale.DEFAULT_SERVERS, metavar="N",
                   help="scale: the ladder on this machine, then over 1 .. N namespace servers (default 2) confined "
                        "to CPU 0 while this machine's hosts keep the others: what a server buys")
    s.set_defaults(fn=cmd_bench)



def _run_commands(sub) -> None:
    """``run`` and ``reproduce``: scenarios and the paper's table."""
    s = sub.add_parser("run", help="run a failure-injection scenario (default: the quickstart)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="metrics a scenario's expectations can bound (expect: [{metric: NAME, ...}]):\n"
                              + metric_help())
    s.add_argument("scenario", nargs="?", help="scenario YAML or the name of a shipped one")
    s.add_argument("--out", help="results folder (default: results/<scenario>-<transport>-<dataplane>-<time>)")
    s.add_argument("--duration", type=float,
                   help="run the timeline compressed (or stretched) to this many seconds: fault times, "
                        "windows and start times scale with it")
    s.add_argument("--dataplane", choices=list(DATAPLANES), help="override the scenario's data plane")
    s.add_argument("--transport", choices=["mrc", "roce"], help="override the scenario's transport")
    s.add_argument("--pcap", action="store_true",
                   help="capture every host NIC port into <results>/pcap/ (with --debug on bmv2, every switch "
                        "port too)")
    s.add_argument("--debug", action="store_true", help="bmv2: per-packet logging and switch port pcaps")
    s.add_argument("--fit", action="store_true",
                   help="scale every link rate down to what this machine sustains (mrclab calibrate) instead of "
                        "refusing a run it cannot carry")
    s.add_argument("--rates", choices=RATES, default="scenario",
                   help="the link rates: the scenario's (default), or this machine's: every rate scaled, up or "
                        "down, so that the traffic fills half of what its calibration says idling leaves "
                        "(mrclab calibrate first)")
    s.add_argument("--repeat", type=_repeats, default=1, metavar="N",
                   help="run seeds 1..N and report every figure as median [min-max]; a verdict holds when the "
                        "median meets it and no run was void; on a sweep, run a point the machine voided again "
                        "with the next seed, up to N runs (default 1)")
    _servers_args(s)
    s.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="set a transport setting, e.g. --set ev_health=off to switch a mechanism off "
                        f"({', '.join(TransportSettings.MECHANISMS)}); repeatable")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("reproduce", help="run every scenario of the paper, MRC and RoCE, into one report")
    s.add_argument("--dataplane", choices=list(DATAPLANES), help="data plane (default: the best one each "
                   "scenario can run on here)")
    s.add_argument("--quick", action="store_true", help="compress every scenario: the whole table in minutes")
    s.add_argument("--out", help="report folder (default: results/reproduce-<time>)")
    s.add_argument("--update", metavar="REPORT", help="re-run --only's rows into this earlier report (same "
                   "--dataplane, "
                   "--quick and --repeat); their earlier runs move to REPORT/superseded/")
    s.add_argument("--only", nargs="+", metavar="SCENARIO", help="just these shipped scenarios")
    s.add_argument("--repeat", type=_repeats, default=1, metavar="N",
                   help="run every row's MRC and RoCE runs with seeds 1..N: figures as median [min-max] "
                        "(sweeps run once)")
    _servers_args(s)
    s.set_defaults(fn=cmd_reproduce)



def _machine_commands(sub) -> None:
    """``calibrate``, ``doctor``, ``report``: this machine, and results side by side."""
    s = sub.add_parser("calibrate", help="measure what this machine sustains per data plane (endpoint and switch "
                                         "CPU per packet, idle cost) and cache it for admission")
    s.add_argument("--dataplane", action="append", choices=list(DATAPLANES),
                   help="data plane(s) to calibrate (default: every available one)")
    s.set_defaults(fn=cmd_calibrate)

    s = sub.add_parser("doctor", help="what this machine has, which data planes and features run here, "
                                      "and how to install what is missing")
    s.add_argument("--servers", metavar="A,B,...",
                   help="check these servers instead ([user@]address, comma-separated): reachable over ssh, "
                        "Mininet and the toolchain there, clock against this machine's")
    s.add_argument("--ssh-config", metavar="FILE", help="ssh client configuration for the servers (ssh -F)")
    s.set_defaults(fn=cmd_doctor)

    s = sub.add_parser("report", help="compare results folders side by side")
    s.add_argument("results", nargs="+")
    s.add_argument("--out", help="where to write the overlaid plot (default: first folder)")
    s.add_argument("--frames", metavar="HOST",
                   help="instead: what HOST's NIC ports carried in each folder's captures (runs with --pcap): "
                        "frames by kind, each port's busiest second, how long SACKs and NACKs took to leave")
    s.set_defaults(fn=cmd_report)


def main(argv: list[str] | None = None) -> int:
    """The command line, and its one error boundary: a :class:`MrclabError` is one line on stderr
    and its exit code; a signal tears down and exits 128 + its number."""
    args = build_parser().parse_args(argv)
    previous = teardown_on_signals()
    try:
        return int(args.fn(args) or 0)
    except MrclabError as e:
        console.print(f"[red]error:[/red] {escape(e.one_line())}")
        return e.exit_code
    except KeyboardInterrupt:
        console.print("interrupted; cleaned up")
        return 130
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


if __name__ == "__main__":
    sys.exit(main())
