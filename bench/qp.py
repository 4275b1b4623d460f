"""``mrclab bench qp``: one QP against its NIC ports, on shaped links.

One QP writes from h0 to h1 (another T0, across the T1s) over host ports at :data:`PORT_MBPS`, on
a fabric whose T0-T1 links keep every T0 non-blocking, for :data:`DURATION_S`; the figures are
read over :data:`WINDOW`, after the window opened. Rows: MRC on one plane and on four, with 1 KiB
and 4 KiB payloads (the paper's MTU, its section 2), and the RoCE baseline (DCQCN) alone on one
plane with both payloads.

Columns:

* **goodput**: bytes placed in the receiver's memory a second (Mb/s), and over the NIC ports'
  rate (``of the ports``);
* **on the wire**: what the QP's data packets took of its ports, headers included: goodput times
  frame over payload, plus its retransmissions (``DATA_OVERHEAD`` = 154 bytes a packet: Ethernet,
  outer IPv6 with the uSID, inner IPv6, UDP, BTH, RETH, MRC's extension header and ICRC,
  protocol/headers.py). A QP at its ports' line rate reads about 1.0 here;
* **header ceiling**: payload over frame, the most goodput a port can carry at that payload: 0.869
  at 1 KiB, 0.964 at 4 KiB (why a QP at line rate reads under 0.9 of its ports at 1 KiB);
* retransmitted packets, switch marks and trims over the run, and whether the emulator kept up
  (``faithful``: no fidelity fault in the run, experiments/analysis/fidelity.py).

Target (issue 36): one MRC QP at >= 90% of its NIC ports, on one plane and on four; a lone RoCE QP
(DCQCN at its published parameters, traffic/dcqcn.py) at >= 95% of its port. Not a test: figures
vary with load; the table is what this machine sustains now.
"""

from __future__ import annotations

from pathlib import Path

from mrclab.bench.tables import emit, per_dataplane, progress, run_scenario
from mrclab.experiments.model.scenario import parse_scenario
from mrclab.protocol import headers as H
from mrclab.topologies.errors import MrclabError
from rich.table import Table

console = progress  # progress to stderr; the table through emit
#: The host ports' rate (Mb/s): issue 36's 64 Mb/s.
PORT_MBPS = 64.0
DURATION_S = 10.0
#: The steady stretch the figures are read over (s): after the window opened (slow start).
WINDOW = (3.0, DURATION_S)
#: (transport, planes, payload bytes) of each row.
ROWS = (("mrc", 1, 1024), ("mrc", 4, 1024), ("mrc", 1, 4096), ("mrc", 4, 4096), ("roce", 1, 1024),
        ("roce", 1, 4096))


def scenario(transport: str, planes: int, payload: int, dp: str) -> dict:
    """The scenario (as YAML would give it) of one row: h0 writes to h1 over one QP, 256 KiB
    messages, host ports at :data:`PORT_MBPS`, two T1s a plane (a T0's one host over two uplinks at
    the host rate: non-blocking), on ``dp``."""
    return {
        "name": f"bench-qp-{transport}-{planes}p-{payload}",
        "fabric": {"topo": "lab", "planes": planes, "t0_per_plane": 2, "t1_per_plane": 2, "hosts_per_t0": 1,
                   "link": {"bandwidth_mbps": PORT_MBPS, "queue_packets": 32}},
        "dataplane": dp, "seed": 1, "duration_s": DURATION_S,
        "transport": {"kind": transport, "payload_bytes": payload},
        "workload": [{"src": "h0", "dst": "h1", "qps": 1, "message_bytes": 262144}],
        "expect": [{"metric": "goodput_mbps", "window": list(WINDOW)},
                   {"metric": "retransmit_fraction"}],
    }


def row(transport: str, planes: int, payload: int, dp: str, out: Path) -> dict:
    """Run one row into ``out``; its figures: ``mbps`` (goodput in :data:`WINDOW`), ``ports`` (over
    the NIC ports), ``wire`` (the ports' share the data packets took, headers and retransmissions
    in), ``ceiling`` (payload over frame), ``retx`` (retransmitted over sent), ``marked``,
    ``trimmed``, ``faithful`` and ``why`` (an error or the fidelity faults)."""
    scn = parse_scenario(scenario(transport, planes, payload, dp), f"bench qp {transport} {planes} planes {payload} B")
    frame = payload + H.DATA_OVERHEAD
    try:
        m, _ = run_scenario(scn, out)
    except MrclabError as e:
        return {"mbps": 0.0, "ports": 0.0, "wire": 0.0, "ceiling": payload / frame, "retx": 0.0, "marked": 0,
                "trimmed": 0, "faithful": False, "why": e.one_line()}
    mbps = m["expectations"][0]["value"] or 0.0
    retx = m["expectations"][1]["value"] or 0.0
    line = PORT_MBPS * planes
    faults = sorted({f["invariant"] for f in m["fidelity_faults"]})
    return {"mbps": mbps, "ports": mbps / line, "wire": mbps / line * frame / payload * (1 + retx),
            "ceiling": payload / frame, "retx": retx, "marked": m["switch_ports"].get("marked", 0),
            "trimmed": m["switch_ports"].get("trimmed", 0), "faithful": not faults,
            "why": " and ".join(faults) or None}


def table(dp: str, rows: list[tuple[tuple[str, int, int], dict]]) -> Table:
    """The printed table of one data plane's rows."""
    t = Table(title=f"mrclab bench qp ({dp}: one QP h0 -> h1 across the T1s, host ports at {PORT_MBPS:g} Mb/s, "
                    f"read over {WINDOW[0]:g}-{WINDOW[1]:g} s)")
    for c in ("transport", "planes", "payload", "goodput", "of the ports", "on the wire", "header ceiling",
              "retransmitted", "marked / trimmed", "faithful"):
        t.add_column(c, justify="right")
    for (transport, planes, payload), r in rows:
        t.add_row("MRC" if transport == "mrc" else "RoCE (DCQCN)", str(planes), str(payload),
                  f"{r['mbps']:.1f} Mb/s", f"{r['ports']:.3f}", f"{r['wire']:.3f}", f"{r['ceiling']:.3f}",
                  f"{r['retx']:.2%}", f"{r['marked']} / {r['trimmed']}",
                  "yes" if r["faithful"] else f"no ({r['why']})")
    return t


def rows_of(dp: str, folder: Path) -> Table:
    """Every row of :data:`ROWS` on ``dp``, each run into ``folder``; their table."""
    rows = []
    for key in ROWS:
        transport, planes, payload = key
        console.print(f"[dim]{dp}: {transport}, {planes} plane(s), {payload}-byte payload ...[/dim]")
        r = row(transport, planes, payload, dp, folder / f"{dp}-{transport}-{planes}-{payload}")
        console.print(f"[dim]  {r['ports']:.3f} of the ports, {r['wire']:.3f} on the wire[/dim]")
        rows.append((key, r))
    return table(dp, rows)


def main(args=None) -> int:
    """``mrclab bench qp``: every row on every data plane asked for (default: linux, the plane whose
    rates reach the ports' 64 Mb/s), then one table each. Returns 0."""
    tables = per_dataplane(getattr(args, "dataplane", None) or ["linux"], "mrclab-bench-qp-", rows_of)
    notes = ["targets (issue 36): one MRC QP >= 0.90 of its NIC ports on one plane and on four; a lone RoCE QP "
             ">= 0.95 of its port; the header ceiling bounds 'of the ports' at each payload"]
    emit(tables, notes, bool(getattr(args, "markdown", False)))
    return 0
