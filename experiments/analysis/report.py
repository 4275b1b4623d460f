"""``mrclab report RESULTS...``: results folders side by side, as a table and an overlaid plot.

Each folder is what ``mrclab run`` wrote. The table has one row per folder: scenario, transport,
data plane, baseline goodput, each expectation's value, retransmitted fraction and the verdict.
The plot (``compare.png`` in ``--out`` or the first folder) overlays total goodput against time,
with the first folder's faults marked, e.g. MRC against RoCE on the same scenario. With ``--frames
HOST`` it compares what one host's NIC ports carried instead, from runs with ``--pcap``
(experiments/analysis/frames.py).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from mrclab.experiments.analysis.expectations import verdict_word
from mrclab.experiments.analysis.frames import host_frames
from mrclab.experiments.analysis.frames import rows as frame_rows
from mrclab.experiments.analysis.metrics import BIN_S, RunData, retransmit_fraction
from mrclab.experiments.analysis.plots import overlay_plot
from mrclab.topologies.errors import BadInput
from rich.console import Console
from rich.table import Table

console = Console(highlight=False)


class ReportError(BadInput):
    """A folder is not a results folder of ``mrclab run``."""


_METRICS_READ = ("duration_s", "scenario", "transport", "dataplane", "totals", "expectations", "baseline_mbps",
                 "passed")


def load_result(folder: Path) -> tuple[dict, RunData, list[dict]]:
    """(metrics.json, goodput series as RunData, faults) of one results folder."""
    m_path, ts_path = folder / "metrics.json", folder / "timeseries.csv"
    if not m_path.exists() or not ts_path.exists():
        raise ReportError(f"{folder}: not a results folder (needs metrics.json and timeseries.csv from `mrclab run`)")
    try:
        m = json.loads(m_path.read_text())
        with open(ts_path) as fh:
            rows = [(float(r["t_s"]), float(r["goodput_mbps"])) for r in csv.DictReader(fh)]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ReportError(f"{folder}: unreadable results ({type(e).__name__}: {e}); "
                          f"is it a folder `mrclab run` wrote?") from None
    missing = [k for k in _METRICS_READ if not isinstance(m, dict) or k not in m]
    if missing:
        raise ReportError(f"{folder}/metrics.json lacks {', '.join(missing)}; is it a folder `mrclab run` wrote?")
    # rebuild a cumulative-bytes series from the binned goodput so RunData can re-bin it
    pts, b = [(0.0, 0)], 0.0
    for t_s, mbps in rows:
        b += mbps * 1e6 / 8 * BIN_S
        pts.append((round(t_s + BIN_S, 6), int(b)))
    d = RunData(duration_s=float(m["duration_s"]), samples={"total": pts}, qp_src={"total": "all"})
    faults = [{"t": f["t"], "label": f["label"]} for f in m.get("faults", [])]
    return m, d, faults


def frames_table(folders: list[Path], host: str) -> Table:
    """``--frames HOST``: one column per folder, what ``host``'s NIC ports carried in its captures
    (experiments/analysis/frames.py). Raises :class:`~experiments.analysis.frames.FramesError`."""
    runs = [host_frames(f, host) for f in folders]
    t = Table(title=f"{host}'s NIC ports, from the captures")
    t.add_column("frames")
    for f in folders:
        t.add_column(f.name, justify="right")
    for name, cells in frame_rows(runs):
        t.add_row(name, *cells)
    return t


def main(args) -> int:
    """``mrclab report``: one table row per results folder and an overlaid goodput plot; with
    ``--frames HOST``, the table of :func:`frames_table` instead."""
    if getattr(args, "frames", None):
        console.print(frames_table([Path(f) for f in args.results], args.frames))
        return 0
    runs = [(Path(f), *load_result(Path(f))) for f in args.results]
    t = Table(title="mrclab report")
    for c in ("results", "scenario", "transport", "data plane", "baseline Mb/s", "expectations", "retransmits",
              "verdict"):
        t.add_column(c)
    for folder, m, d, _ in runs:
        exp = "; ".join(f"{v['metric']}={'inf' if v['value'] is None else format(v['value'], '.3g')}"
                        + ("" if v["passed"] is None else " " + verdict_word(v["passed"])) for v in m["expectations"])
        t.add_row(folder.name, m["scenario"], m["transport"], m["dataplane"], f"{m['baseline_mbps']:.1f}", exp,
                  f"{retransmit_fraction(m['totals']):.2%}", verdict_word(m["passed"], rich=True))
    console.print(t)
    out = Path(args.out) if args.out else runs[0][0]
    out.mkdir(parents=True, exist_ok=True)
    title = " vs ".join(sorted({f"{m['transport']} on {m['dataplane']}" for _, m, _, _ in runs}))
    png = overlay_plot([(f"{m['transport']} ({f.name})", d, fl) for f, m, d, fl in runs], out / "compare.png",
                       f"{runs[0][1]['scenario']}: {title}")
    console.print(f"overlaid goodput: {png}")
    return 0
