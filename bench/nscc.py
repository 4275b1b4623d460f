"""``mrclab bench nscc``: mrclab's NSCC held against UEC's reference simulator, uet-htsim.

UET's NSCC was developed on uet-htsim (``ultraethernet/uet-htsim``, ``htsim/sim/uec.cpp``); mrclab's
(:mod:`traffic.cc`) follows its equations. This benchmark runs the same N-to-1 incast in both, for
N = 8 and 4 (the reference's ``connection_matrices/incast.cm`` is such an incast: every flow 2 MB,
all starting at once), and prints their figures side by side in the units that make a 100 Gb/s,
14 us network and an emulated one comparable: windows over the BDP, time in base RTTs.

The two runs, matched in units of BDP and RTT:

* **reference**: ``htsim_uec`` (built by ``vagrant/build-htsim.sh``; found as ``MRCLAB_HTSIM``, on
  PATH or in /usr/local/bin) on its default 16-node fat tree at 100 Gb/s with 4 KiB MTUs, sender
  NSCC only (``-sender_cc_only``), its automatic queue sizing: a queue of 1 BDP that trims when
  full, ECN marked between 0.2 and 0.8 BDP on the way down to the receiver (RED), NSCC's target
  0.75 base RTT. Every flow starts at t = 0 with its window at its maximum (1.5 BDP). Its
  per-acknowledgement trace is read from ``-debug``: each ``processAck`` line's time, window and
  queueing delay, each ``processNack`` (a trimmed packet) counted to its flow.
* **mrclab**: the ``incast`` fabric with one plane on the linux data plane, N hosts writing to h0
  one QP each, 4 KiB payloads, host ports at :data:`PORT_MBPS` and a path delay that makes the BDP
  :data:`BDP_PACKETS` packets as the reference's is (175,284 bytes over 4,150-byte packets), the
  receiver's port trimming at 1 BDP (``trim_t``) and marking ECN from 0.2 BDP (``ecn_k``, on the
  last hop too: the incast's congested hop is the last one). Windows and smoothed RTTs come from
  the endpoints' telemetry (every 0.1 s, a few base RTTs), the queue from the switch's samples of
  h0's port, trims from the QPs' NACK counts.

Figures (both sides alike, over the steady part: from :data:`STEADY_FROM_RTTS` base RTTs on, while
every flow still sends: a reference flow ends when its 2 MB are through, and the others' windows
then grow into the room it left):

* **window / BDP**: the mean of each flow's window over the BDP; the sum over flows beside it (a
  single bottleneck holds 1 BDP in flight plus its queue);
* **queue / BDP**: the reference's from its queueing delay (delay x link rate = bytes queued at
  the one bottleneck, so queue / BDP = delay / base RTT), mrclab's from the switch's samples of
  the incast port;
* **Jain's fairness** of the flows' mean windows (1: equal shares; 1/N: one flow has it all);
* **converge (RTTs)**: the first base RTT after which the flows' windows stay converged: their sum
  within :data:`CONVERGED_BAND` of its steady mean (the incast's first overshoot is absorbed) and
  Jain's index of them at or above :data:`CONVERGED_JAIN` (None: never);
* **trims per flow**: NACKs for trimmed packets, a flow's mean, and per 100 packets it sent.

Goal (issue 36): each figure within 20% of the reference's, or the difference traced to the
specification. Not a test: the mrclab side is an emulation on a shared machine.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from mrclab.bench.tables import emit, progress, run_scenario
from mrclab.experiments.model.scenario import parse_scenario
from mrclab.experiments.run.results import results_folder
from mrclab.protocol import headers as H
from mrclab.topologies.errors import MrclabError
from mrclab.traffic import contract as C
from mrclab.traffic.cc import Nscc
from rich.table import Table

#: N of each N-to-1 incast: the reference's results name 8-to-1 and 4-to-1 runs.
INCASTS = (8, 4)
#: Every reference flow's size (bytes): ``connection_matrices/incast.cm``'s 2,000,000.
FLOW_BYTES = 2_000_000
#: The reference fat tree's hosts (its smallest: 16, K = 4); the receiver is the last.
REF_NODES = 16
#: How long the reference runs (us): the 8-to-1's 16 MB take about 1.3 ms at 100 Gb/s.
REF_END_US = 3000
#: The reference's header bytes a packet: its MTU (4,150) less its MSS (4,086, uec.cpp _mss)
REF_HEADER_BYTES = 64
#: The reference's BDP in packets (175,284-byte BDP over 4,150-byte packets, its default fat tree).
BDP_PACKETS = 42
#: mrclab's host ports (Mb/s): the incast port's rate; 4 KiB frames at 16 Mb/s are 2.1 ms each.
PORT_MBPS = 16.0
#: mrclab's payload (bytes): the reference's 4 KiB MTU.
PAYLOAD_BYTES = 4096
#: mrclab's run (s): about 100 of its base RTTs.
DURATION_S = 10.0
#: The steady part starts after this many base RTTs (the windows' first descent is over).
STEADY_FROM_RTTS = 20
#: Converged: the windows' sum within this share of its steady mean, and Jain's index of the windows
#: at or above CONVERGED_JAIN (ours: 20%, the issue's tolerance; 0.9)
CONVERGED_BAND = 0.2
CONVERGED_JAIN = 0.9

_ACK = re.compile(r"^At (?P<t>[\d.e+-]+) (?P<flow>\S+) .*processAck: \S+ flow \S+ cwnd (?P<cwnd>\d+) "
                  r"flightsize (?P<flight>-?\d+) delay (?P<delay>[-\d.e+]+) newlyrecvd (?P<acked>\d+) skip (?P<skip>\d)"
                  r"(?: raw rtt (?P<raw>\d+))?")
_NACK = re.compile(r"^(?P<flow>\S+) \S+ \d+ processNack nacked:")
_STATIC = re.compile(r"Initializing static NSCC parameters:.*_network_linkspeed=(?P<speed>\d+) "
                     r"_network_rtt=(?P<rtt>\d+) _network_bdp=(?P<bdp>\d+)")
_MTU = re.compile(r"Packet size \(MTU\) is (\d+)")
_SENT = re.compile(r"^Flow (?P<flow>\S+) flowId \d+ \S+ \d+ finished at .* total packets (?P<pkts>\d+)")


@dataclass
class Trace:
    """One incast's run, either side: ``base_rtt_s`` and ``bdp_bytes`` (the bottleneck's rate x base
    RTT), ``mss`` (bytes a packet); per flow ``windows[flow] = [(t_s, cwnd_bytes)]``; the queue
    ``queue = [(t_s, bytes)]`` at the bottleneck; ``trims[flow]`` and ``packets[flow]`` (sent)."""

    side: str
    base_rtt_s: float
    bdp_bytes: float
    mss: int
    windows: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    queue: list[tuple[float, float]] = field(default_factory=list)
    trims: dict[str, int] = field(default_factory=dict)
    packets: dict[str, int] = field(default_factory=dict)
    note: str = ""


def parse_reference(text: str) -> Trace:
    """The reference's trace from ``htsim_uec -debug``'s output ``text``. Raises ValueError when it
    holds no NSCC parameters or no acknowledgement (not an NSCC run, or one that failed)."""
    m = _STATIC.search(text)
    if not m:
        raise ValueError("no 'Initializing static NSCC parameters' line: not an htsim_uec NSCC run")
    speed_bps, rtt_ps, bdp = int(m["speed"]), int(m["rtt"]), int(m["bdp"])
    mtu = _MTU.search(text)
    tr = Trace("uet-htsim", rtt_ps * 1e-12, float(bdp), int(mtu[1]) if mtu else 4150)
    for line in text.splitlines():
        if a := _ACK.match(line):
            t = float(a["t"]) * 1e-6
            tr.windows.setdefault(a["flow"], []).append((t, float(a["cwnd"])))
            tr.queue.append((t, max(0.0, float(a["delay"])) * 1e-6 * speed_bps / 8))
        elif n := _NACK.match(line):
            tr.trims[n["flow"]] = tr.trims.get(n["flow"], 0) + 1
        elif s := _SENT.match(line):
            tr.packets[s["flow"]] = int(s["pkts"])
    if not tr.windows:
        raise ValueError("no processAck line: run htsim_uec with -debug")
    for f in tr.windows:
        tr.trims.setdefault(f, 0)
    return tr


_QA = re.compile(r"^At (?P<t>[\d.e+-]+) (?P<flow>\S+) quickadapt called is loss 1")


def reference_events(text: str, flow: str) -> tuple[list[tuple], list[float]]:
    """One reference flow's congestion-control inputs and its window after each, in order, from
    ``htsim_uec -debug``'s output: ``("ack", t_s, acked_bytes, delay_s, ecn, cwnd_bytes)`` per
    ``processAck`` and ``("nack", t_s, 0, 0.0, False, None)`` per trimmed packet's NACK (its time
    is that of the quick adapt it calls; its window shows at the next acknowledgement).
    ``delay_s`` is None where the acknowledgement carried no RTT sample (its ``raw rtt`` is 0: a
    retransmission's, whose send time is ambiguous). ``flight[i]``: the bytes in flight after
    event i's acknowledgement (the last one's for a NACK). Returns (events, flight)."""
    events: list[tuple] = []
    flight: list[float] = []
    pending = False
    for line in text.splitlines():
        if (a := _ACK.match(line)) and a["flow"] == flow:
            sample = a["raw"] != "0"  # raw rtt 0: no valid send time (a retransmission's), the average stood in
            events.append(("ack", float(a["t"]) * 1e-6, int(a["acked"]),
                           max(0.0, float(a["delay"])) * 1e-6 if sample else None, a["skip"] == "1", float(a["cwnd"])))
            flight.append(max(0.0, float(a["flight"])))
        elif (n := _NACK.match(line)) and n["flow"] == flow:
            pending = True
        elif pending and (q := _QA.match(line)) and q["flow"] == flow:
            events.append(("nack", float(q["t"]) * 1e-6, 0, 0.0, False, None))
            flight.append(flight[-1] if flight else 0.0)
            pending = False
    return events, flight


def replay(text: str, flow: str, quarter_unmarked: bool = False) -> tuple[Trace, list[tuple[float, float, float]]]:
    """Feed one reference flow's acknowledgements and NACKs (:func:`reference_events` of ``text``,
    htsim_uec -debug's output) to mrclab's NSCC (:class:`traffic.cc.Nscc`, as the transport builds
    it) at the reference's base RTT, BDP and packet size (its payload the MSS), starting where the
    reference's window starts. Returns the reference's trace and ``(t_s, reference cwnd / BDP,
    mrclab cwnd / BDP)`` after each acknowledgement: the two control laws on the same signals,
    open loop. ``quarter_unmarked``: with the reference's average of an unmarked delay, which the
    lab leaves out (:class:`traffic.cc.Nscc`). Raises ValueError as :func:`parse_reference` does."""
    tr = parse_reference(text)
    events, flight = reference_events(text, flow)
    first = next((e[5] for e in events if e[0] == "ack"), 1.5 * tr.bdp_bytes)
    cc = Nscc(tr.mss - REF_HEADER_BYTES, tr.bdp_bytes * 8 / tr.base_rtt_s, first, base_rtt_s=tr.base_rtt_s,
              quarter_unmarked=quarter_unmarked)
    out = []
    for (kind, t, acked, delay, ecn, cwnd), in_flight in zip(events, flight, strict=True):
        if kind == "nack":
            cc.on_nack(tr.mss, t, in_flight)
        else:
            cc.on_ack(acked, None if delay is None else tr.base_rtt_s + delay, ecn, t, in_flight)
            out.append((t, cwnd / tr.bdp_bytes, cc.cwnd_bytes / tr.bdp_bytes))
    return tr, out


def htsim_binary() -> str | None:
    """Where ``htsim_uec`` is: ``MRCLAB_HTSIM``, else on PATH, else /usr/local/bin; None: nowhere."""
    for cand in (os.environ.get("MRCLAB_HTSIM"), shutil.which("htsim_uec"), "/usr/local/bin/htsim_uec"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def connection_matrix(n: int) -> str:
    """The reference's N-to-1 incast in its connection-matrix format (``incast.cm``'s): hosts 0..n-1
    to the last of :data:`REF_NODES`, :data:`FLOW_BYTES` each, all at t = 0."""
    lines = [f"Nodes {REF_NODES}", f"Connections {n}"]
    lines += [f"{i}->{REF_NODES - 1} start 0 size {FLOW_BYTES}" for i in range(n)]
    return "\n".join(lines) + "\n"


def reference_run(n: int, folder: Path) -> Trace:
    """Run the N-to-1 incast in ``htsim_uec`` inside ``folder`` (its connection matrix, output and
    logfile stay there). Raises MrclabError when htsim_uec is missing or fails."""
    binary = htsim_binary()
    if binary is None:
        raise MrclabError("htsim_uec not found (build it: sudo vagrant/build-htsim.sh; or set MRCLAB_HTSIM)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "incast.cm").write_text(connection_matrix(n))
    argv = [binary, "-tm", "incast.cm", "-nodes", str(REF_NODES), "-sender_cc_only", "-end", str(REF_END_US),
            "-seed", "1", "-disable_base_rtt_update_on_nack", "-debug"]
    with open(folder / "htsim.out", "w") as out:
        r = subprocess.run(argv, check=False, cwd=folder, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    text = (folder / "htsim.out").read_text(errors="replace")
    if r.returncode != 0:
        raise MrclabError(f"htsim_uec exited {r.returncode}: {text.strip().splitlines()[-1:] or '(no output)'}")
    try:
        return parse_reference(text)
    except ValueError as e:
        raise MrclabError(f"htsim_uec's output: {e}") from None


def frame_bytes() -> int:
    """mrclab's full data frame at :data:`PAYLOAD_BYTES` (protocol/headers.py DATA_OVERHEAD)."""
    return PAYLOAD_BYTES + H.DATA_OVERHEAD


def mrclab_path_delay_ms() -> float:
    """The one-way path delay (ms) that makes the incast port's BDP :data:`BDP_PACKETS` frames:
    half the base RTT, less the serialisation the path adds on its own (three store-and-forward
    hops of a frame at the port rate, a SACK's back)."""
    frame_s = frame_bytes() * 8 / (PORT_MBPS * 1e6)
    rtt_s = BDP_PACKETS * frame_s
    return round(max(0.0, rtt_s - 3 * frame_s) / 2 * 1e3, 1)


def scenario(n: int) -> dict:
    """mrclab's N-to-1 incast (as YAML would give it): hosts h1..hN write to h0, one QP each,
    on the one-plane ``incast`` fabric (see the module docstring)."""
    trim = BDP_PACKETS
    return {
        "name": f"bench-nscc-{n}to1",
        "fabric": {"topo": "incast", "planes": 1,
                   "link": {"bandwidth_mbps": PORT_MBPS, "t0_t1_bandwidth_mbps": 4 * PORT_MBPS,
                            "queue_packets": 2 * trim, "path_delay_ms": mrclab_path_delay_ms()}},
        "queues": {"trim_t": trim, "ecn_k": max(1, round(0.2 * BDP_PACKETS)), "ecn_last_hop": True},
        "dataplane": "linux", "seed": 1, "duration_s": DURATION_S,
        "transport": {"kind": "mrc", "payload_bytes": PAYLOAD_BYTES},
        "workload": [{"src": f"h{i}", "dst": "h0", "qps": 1, "message_bytes": 262144} for i in range(1, n + 1)],
        "expect": [{"metric": "messages_intact"}],
    }


def mrclab_run(n: int, folder: Path) -> Trace:
    """Run mrclab's N-to-1 incast into ``folder`` and read its trace (windows, smoothed RTTs, the
    incast port's queue, NACKs). Raises MrclabError as a run does."""
    scn = parse_scenario(scenario(n), f"bench nscc {n}-to-1")
    m, d = run_scenario(scn, folder)
    tel = {h: folder / "endpoints" / f"{h}.telemetry.jsonl" for h in scn.hosts()}
    t0 = min((r.t_wall for h in scn.hosts() for r in C.read_telemetry(tel[h]) if isinstance(r.rec, C.Start)),
             default=0.0)
    srtt: list[float] = []
    windows: dict[str, list[tuple[float, float]]] = {}
    for h in scn.hosts():
        for r in C.read_telemetry(tel[h]):
            if isinstance(r.rec, C.Sample):
                for tq in r.rec.tx:
                    if tq.window_bytes is not None:
                        windows.setdefault(f"{h}->{tq.peer}#{tq.qp}", []).append((r.t_wall - t0, tq.window_bytes))
                    if tq.srtt_us:
                        srtt.append(tq.srtt_us * 1e-6)
    base = min(srtt) if srtt else float("nan")
    bdp = PORT_MBPS * 1e6 / 8 * base
    frame = frame_bytes()
    queue = [(p["t"], float(p["queue"]) * frame) for p in d.ports if p.get("peer") == "h0"]
    tr = Trace("mrclab", base, bdp, PAYLOAD_BYTES, windows, queue)
    for qp, tot in d.totals.items():
        if qp in windows:
            tr.trims[qp] = int(tot.get("nacks", 0))
            tr.packets[qp] = int(tot.get("data_packets", 0))
    faults = sorted({f["invariant"] for f in m["fidelity_faults"]})
    tr.note = f"not faithful: {' and '.join(faults)}" if faults else ""
    if not windows:
        raise MrclabError(f"no window in the endpoints' telemetry under {folder}")
    return tr


def jain(xs: list[float]) -> float:
    """Jain's fairness index of ``xs``: (sum x)^2 / (n sum x^2); 1 when all are equal, 1/n when one
    has everything (Jain, Chiu and Hawe, DEC-TR-301, 1984). Raises ValueError on no values."""
    if not xs:
        raise ValueError("Jain's index of no values")
    sq = sum(x * x for x in xs)
    return 1.0 if sq == 0 else sum(xs) ** 2 / (len(xs) * sq)


def _at(series: list[tuple[float, float]], t: float) -> float | None:
    """The last value of ``series`` at or before ``t`` (None: none yet)."""
    v = None
    for ts, x in series:
        if ts > t:
            break
        v = x
    return v


def figures(tr: Trace) -> dict:
    """The normalised figures of one trace (module docstring): ``window`` (mean per flow / BDP),
    ``window_sum``, ``queue`` (/ BDP), ``jain``, ``converge_rtts`` (None: never), ``trims`` (mean
    per flow) and ``trims_per_100`` (per 100 packets sent), ``flows``."""
    rtt = tr.base_rtt_s
    start = STEADY_FROM_RTTS * rtt
    end = min(s[-1][0] for s in tr.windows.values())  # while every flow still sends (the reference's end)
    means = []
    for s in tr.windows.values():
        steady = [w for t, w in s if start <= t <= end] or [s[-1][1]]
        means.append(statistics.fmean(steady) / tr.bdp_bytes)
    q = [b for t, b in tr.queue if start <= t <= end] or [0.0]
    total = sum(means) * tr.bdp_bytes
    # at each base RTT from the first: the windows' sum within CONVERGED_BAND of its steady mean and
    # Jain's index at or above CONVERGED_JAIN; when that last came to stay
    converge = None
    k = 1
    while k * rtt <= end:
        now = [w for s in tr.windows.values() if (w := _at(s, k * rtt)) is not None]
        ok = (len(now) == len(tr.windows) and abs(sum(now) / total - 1) <= CONVERGED_BAND
              and jain(now) >= CONVERGED_JAIN)
        if ok and converge is None:
            converge = k
        elif not ok:
            converge = None
        k += 1
    trims = list(tr.trims.values()) or [0]
    sent = sum(tr.packets.values())
    return {"flows": len(tr.windows), "window": statistics.fmean(means), "window_sum": sum(means),
            "queue": statistics.fmean(q) / tr.bdp_bytes, "jain": jain(means), "converge_rtts": converge,
            "trims": statistics.fmean(trims), "trims_per_100": 100 * sum(trims) / sent if sent else None}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(n: int, ref: Trace | None, ours: Trace | None, why: dict[str, str]) -> Table:
    """The side-by-side table of one N-to-1 incast (a side that could not run: its reason)."""
    t = Table(title=f"mrclab bench nscc: {n}-to-1 incast, normalised (windows and queue over the BDP, "
                    f"time in base RTTs, steady from {STEADY_FROM_RTTS} RTTs)")
    for c in ("side", "base RTT", "BDP (packets)", "window / BDP", "sum of windows / BDP", "queue / BDP",
              "Jain's fairness", "converge (RTTs)", "trims per flow", "trims per 100 packets", "note"):
        t.add_column(c, justify="right")
    for side, tr in (("uet-htsim", ref), ("mrclab", ours)):
        if tr is None:
            t.add_row(side, *["-"] * 9, why.get(side, "not run"))
            continue
        f = figures(tr)
        t.add_row(side, f"{tr.base_rtt_s * 1e6:.1f} us" if tr.base_rtt_s < 1e-3 else f"{tr.base_rtt_s * 1e3:.1f} ms",
                  f"{tr.bdp_bytes / tr.mss:.1f}", f"{f['window']:.3f}", f"{f['window_sum']:.2f}", f"{f['queue']:.2f}",
                  f"{f['jain']:.3f}", _fmt(f["converge_rtts"], "d"), f"{f['trims']:.1f}",
                  _fmt(f["trims_per_100"], ".2f"), tr.note)
    if ref is not None and ours is not None:
        a, b = figures(ref), figures(ours)
        t.add_row("mrclab / reference", "", "", *(_fmt(b[k] / a[k] if a[k] else None, ".2f")
                                                  for k in ("window", "window_sum", "queue", "jain")),
                  _fmt(b["converge_rtts"] / a["converge_rtts"] if a["converge_rtts"] and b["converge_rtts"] else None,
                       ".2f"),
                  _fmt(b["trims"] / a["trims"] if a["trims"] else None, ".2f"),
                  _fmt(b["trims_per_100"] / a["trims_per_100"] if a["trims_per_100"] and b["trims_per_100"] else None,
                       ".2f"), "goal: 0.80-1.20")
    return t


def plot(n: int, ref: Trace | None, ours: Trace | None, path: Path) -> None:
    """Each flow's window over the BDP against time in base RTTs, both sides one above the other,
    into ``path`` (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = [tr for tr in (ref, ours) if tr is not None]
    if not sides:
        return
    fig, axes = plt.subplots(len(sides), 1, figsize=(8, 3 * len(sides)), sharex=True, squeeze=False)
    for ax, tr in zip(axes[:, 0], sides, strict=True):
        for name, s in sorted(tr.windows.items()):
            ax.plot([t / tr.base_rtt_s for t, _ in s], [w / tr.bdp_bytes for _, w in s], lw=0.8, label=name)
        ax.axhline(1 / n, color="grey", ls="--", lw=0.8, label="fair share (1/N BDP)")
        ax.set_ylabel("window / BDP")
        ax.set_title(f"{tr.side}: {n}-to-1 incast")
    axes[-1, 0].set_xlabel("time (base RTTs)")
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args=None) -> int:
    """``mrclab bench nscc``: each incast of :data:`INCASTS` in the reference and on linux, a table
    each, and their plots (``--out``, default results/bench-nscc-<time>). A side that cannot run
    (no htsim_uec; a run that fails) is named in its row. Returns 0; raises BadInput for an ``--out``
    that holds files (nothing is overwritten)."""
    out = results_folder(getattr(args, "out", None), "bench-nscc")
    tables = []
    for n in INCASTS:
        why: dict[str, str] = {}
        ref = ours = None
        progress.print(f"[dim]{n}-to-1: uet-htsim ...[/dim]")
        try:
            ref = reference_run(n, out / f"htsim-{n}to1")
        except MrclabError as e:
            why["uet-htsim"] = e.one_line()
        progress.print(f"[dim]{n}-to-1: mrclab on linux ({DURATION_S:g} s) ...[/dim]")
        try:
            ours = mrclab_run(n, out / f"mrclab-{n}to1")
        except MrclabError as e:
            why["mrclab"] = e.one_line()
        plot(n, ref, ours, out / f"nscc-{n}to1.png")
        tables.append(table(n, ref, ours, why))
    notes = [f"plots and every run's files: {out}",
             ("goal (issue 36): each mrclab figure within 20% of the reference's, or the difference traced to the "
              "specification")]
    emit(tables, notes, bool(getattr(args, "markdown", False)))
    return 0
