"""``mrclab bench congestion``: N MRC flows through one bottleneck port, NSCC against the fixed window.

The fabric: one plane, two T0 groups of 9 hosts, one T1 (3 switches).
N senders of group 1 (h9, h10, ...) each write to h0 over one QP; the bottleneck is h0's T0 down
port, the T0-T1 links being 8x faster. For N = 2, 4, 8 and each window control (NSCC, and
``nscc: off``: the fixed window of 16 packets) one run of :data:`DURATION_S`: all flows but the last start at once, the
last joins at :data:`JOIN_S`. Printed per run, over the last :data:`STEADY_FRACTION` of the run:

* Jain's fairness index of the flows' goodput, (sum x)^2 / (n sum x^2) (Jain, Chiu, Hawe 1984;
  target >= 0.95);
* bottleneck utilisation: the flows' total goodput over the bottleneck port's payload rate
  (its rate x payload / frame bytes; target >= 90%);
* the bottleneck queue's 99th percentile (packets, sampled every second);
* convergence after the last flow joins: the time until the 1 s moving Jain index of all flows
  first reaches 0.9, in RTTs (the flows' median smoothed RTT).

Needs a data plane with switch queues (bmv2 with its Thrift runtime, or linux with its tc eBPF
program). Not a test: figures vary with load; quote ratios within one run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from mrclab.bench.tables import emit, progress, run_scenario
from mrclab.controller.dataplanes import available, here, missing_features
from mrclab.experiments.analysis.metrics import BIN_S, percentile
from mrclab.experiments.model.scenario import parse_scenario
from mrclab.topologies.errors import NotAvailable
from rich.table import Table

console = progress  # progress to stderr; the table through emit
DURATION_S = 24.0
JOIN_S = 10.0
STEADY_FRACTION = 0.4
FLOWS = (2, 4, 8)
HOST_MBPS = {"bmv2": 1.0, "linux": 8.0}


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when every share is equal, 1/n when one flow has it all."""
    s, q = sum(xs), sum(x * x for x in xs)
    return s * s / (len(xs) * q) if q else 0.0


def scenario(n: int, cc: str, dp: str) -> dict:
    """The scenario (as YAML would give it) of one run: ``n`` flows of 64 KiB messages from group 1
    into h0, the last joining at :data:`JOIN_S`; window control ``cc`` (``nscc`` or ``fixed``) on
    data plane ``dp``; host links at :data:`HOST_MBPS`, T0-T1 links 8x faster, 32-packet queues."""
    mbps = HOST_MBPS[dp]
    return {
        "name": f"bench-congestion-{n}-{cc}",
        "fabric": {"topo": "lab", "planes": 1, "t0_per_plane": 2, "t1_per_plane": 1, "hosts_per_t0": 9,
                   "link": {"bandwidth_mbps": mbps, "t0_t1_bandwidth_mbps": 8 * mbps, "queue_packets": 32}},
        "queues": {}, "dataplane": dp, "seed": 11, "duration_s": DURATION_S,
        "transport": {"kind": "mrc", "nscc": cc == "nscc", "evs_per_plane": 1, "backup_per_plane": 1},
        "workload": [{"src": f"h{9 + i}", "dst": "h0", "message_bytes": 65536,
                      "start_s": JOIN_S if i == n - 1 else 0.0} for i in range(n)],
    }


def one(n: int, cc: str, dp: str, out: Path) -> dict:
    """Run one scenario into ``out``; its figures: ``jain`` and ``utilisation`` (0..1) over the last
    :data:`STEADY_FRACTION` of the run, ``p99_queue`` (packets, h0's T0 port, every sample of the
    run), ``converge_rtts`` (None: never), ``rtt_ms`` and ``passed`` (the scenario's own verdict)."""
    scn = parse_scenario(scenario(n, cc, dp), f"bench congestion N={n} {cc}")
    metrics, data = run_scenario(scn, out)
    per_qp = data.qp_goodput_mbps()
    lo = int(len(data.bins()) * (1 - STEADY_FRACTION))
    shares = [sum(v[lo:]) / len(v[lo:]) for v in per_qp.values()]
    frame = scn.settings.frame_bytes
    cap = scn.spec_for(dp).link.bandwidth_mbps * scn.settings.payload_bytes / frame
    port = [r["queue"] for r in data.ports if r["peer"] == "h0"]
    rtt_s = (data.rtt_us or 0) / 1e6  # the flows' median smoothed RTT
    # convergence: from the join, the 1 s moving Jain index of every flow first reaches 0.9
    conv = None
    k = int(round(1.0 / BIN_S))
    j0 = int(round(JOIN_S / BIN_S))
    series = list(per_qp.values())
    for i in range(j0, len(data.bins()) - k):
        if jain([sum(v[i : i + k]) for v in series]) >= 0.9:
            conv = (i - j0) * BIN_S
            break
    return {"n": n, "cc": cc, "jain": jain(shares), "utilisation": sum(shares) / cap if cap else 0.0,
            "p99_queue": percentile(sorted(port), 99) if port else 0,
            "converge_rtts": conv / rtt_s if conv is not None and rtt_s else None,
            "rtt_ms": rtt_s * 1e3, "passed": metrics["passed"]}


def main(args=None) -> int:
    """``mrclab bench congestion``: a run per N of :data:`FLOWS` and window control, on the first data
    plane of ``args.dataplane`` (default: bmv2 where its toolchain is installed, else linux), then
    one table. Returns 0; raises NotAvailable when that data plane has no switch queues here."""
    dps = getattr(args, "dataplane", None) or [here()[0].name]
    dp = dps[0]
    if "congestion" not in available(dp):
        why = missing_features(dp).get("congestion", f"the {dp} data plane has no switch queues")
        raise NotAvailable(f"bench congestion needs switch queues: {why}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="mrclab-bench-cc-") as d:
        for n in FLOWS:
            for cc in ("nscc", "fixed"):
                console.print(f"[dim]N = {n}, {cc}: {DURATION_S:.0f} s on {dp}[/dim]")
                rows.append(one(n, cc, dp, Path(d) / f"{n}-{cc}"))
    t = Table(title=f"mrclab bench congestion ({dp}: N flows into one {HOST_MBPS[dp]} Mb/s port, last "
                    f"{STEADY_FRACTION:.0%} of {DURATION_S:.0f} s)")
    for c in ("N", "window", "Jain index", "utilisation", "p99 queue (pkts)", "RTTs to converge", "smoothed RTT"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["n"]), r["cc"], f"{r['jain']:.3f}", f"{r['utilisation']:.0%}", f"{r['p99_queue']:.0f}",
                  "-" if r["converge_rtts"] is None else f"{r['converge_rtts']:.0f}", f"{r['rtt_ms']:.1f} ms")
    emit([t], ["targets: Jain >= 0.95, utilisation >= 90% (NSCC)"], bool(getattr(args, "markdown", False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
