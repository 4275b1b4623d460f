"""Figures of a run (matplotlib, Agg): goodput against time with the faults marked, and EV state
over time (one row per EV, coloured by state, as the paper's figures 12-14)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from mrclab.experiments.analysis.metrics import BIN_S, RunData  # noqa: E402
from mrclab.experiments.model.sweepspec import size_text  # noqa: E402

STATE_COLORS = {"GOOD": "#4caf50", "SKIP": "#ffc107", "ASSUMED_BAD": "#e53935", "DENIED": "#757575",
                "UNKNOWN": "#bdbdbd"}


def _save(fig, ax, path: Path, title: str) -> Path:
    """Title the figure, write it to ``path`` and free it."""
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _fault_marks(ax, faults: list[dict]) -> None:
    """Faults as dashed red lines with their labels; fidelity faults (``kind: fidelity``, with
    ``t_end``) as grey shaded spans: the emulator did not keep up there (experiments/analysis/fidelity.py)."""
    ymax = ax.get_ylim()[1]
    spans = [f for f in faults if f.get("kind") == "fidelity"]
    for f in spans:
        ax.axvspan(f["t"], f["t_end"], color="#9e9e9e", alpha=0.35, lw=0)
    if spans:
        ax.text(spans[0]["t"], ymax * 0.03, " emulator fell behind (void)", fontsize=7, color="#424242",
                va="bottom", ha="left")
    for i, f in enumerate(x for x in faults if x.get("kind") != "fidelity"):
        ax.axvline(f["t"], color="#b71c1c", lw=0.8, ls="--", alpha=0.7)
        ax.text(f["t"], ymax * (0.97 - 0.06 * (i % 4)), " " + f["label"], fontsize=7, color="#b71c1c",
                va="top", ha="left")


def goodput_plot(d: RunData, faults: list[dict], path: Path, title: str) -> Path:
    """Total and per-sending-host goodput (Mb/s) in 100 ms bins, faults as dashed lines."""
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    t = [b + BIN_S / 2 for b in d.bins()]
    hosts = sorted(set(d.qp_src.values()), key=lambda h: int(h[1:]) if h[1:].isdigit() else 0)
    if len(hosts) > 1:
        for h in hosts:
            ax.plot(t, d.goodput_mbps(h), lw=1.0, alpha=0.8, label=f"from {h}")
    ax.plot(t, d.goodput_mbps(), lw=1.8, color="black", label="total")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("goodput (Mb/s)")
    ax.set_xlim(0, d.duration_s)
    ax.set_ylim(0, max(1.0, max(d.goodput_mbps() or [1.0]) * 1.25))
    ax.grid(alpha=0.3)
    _fault_marks(ax, faults)
    ax.legend(loc="lower left", fontsize=8)
    return _save(fig, ax, path, title)


def ev_state_plot(d: RunData, faults: list[dict], path: Path, title: str, max_rows: int = 64) -> Path:
    """One row per (QP, EV) that the run saw, coloured by its state over time."""
    changes: dict[tuple[str, int], list[tuple[float, str]]] = {}
    for e in d.events:
        if e.get("kind") == "ev_state":
            qp = f"{e.get('host', '?')}->{e.get('peer', '?')}#{e.get('qp')}"
            changes.setdefault((qp, int(e.get("ev", 0))), []).append((e["t"], e["new"]))
    rows = sorted(changes)[:max_rows]
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.18 * len(rows) + 1.5)), dpi=100)
    for i, key in enumerate(rows):
        seq = sorted(changes[key])
        spans = []
        state, start = "GOOD", 0.0
        for t, new in seq:
            spans.append((start, t, state))
            state, start = new, t
        spans.append((start, d.duration_s, state))
        for a, b, s in spans:
            if b > a:
                ax.barh(i, b - a, left=a, height=0.8, color=STATE_COLORS.get(s, "#bdbdbd"), linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{qp} ev {ev:#x}" for qp, ev in rows], fontsize=6)
    ax.set_xlim(0, d.duration_s)
    ax.set_xlabel("time (s)")
    ax.set_title(title + ("" if rows else " (no EV changed state)"), fontsize=10)
    if rows:
        _fault_marks(ax, faults)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATE_COLORS.items() if s != "UNKNOWN"],
              loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(rows) < 12 else -0.08), fontsize=7, ncol=4,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def overlay_plot(runs: list[tuple[str, RunData, list[dict]]], path: Path, title: str) -> Path:
    """Total goodput of several runs on one set of axes (``mrclab report``)."""
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    for label, d, _ in runs:
        t = [b + BIN_S / 2 for b in d.bins()]
        ax.plot(t, d.goodput_mbps(), lw=1.5, label=label)
    if runs:
        ax.set_ylim(0, max(1.0, max(max(d.goodput_mbps() or [1.0]) for _, d, _ in runs) * 1.25))
        _fault_marks(ax, runs[0][2])
    ax.set_xlabel("time (s)")
    ax.set_ylabel("goodput (Mb/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return _save(fig, ax, path, title)


def window_plot(d: RunData, faults: list[dict], path: Path, title: str) -> Path:
    """Each sending QP's congestion window (KiB, NSCC or fixed) and, for DCQCN, its rate (Mb/s,
    right axis) against time."""
    fig, ax = plt.subplots(figsize=(9, 3.8), dpi=100)
    ax2 = None
    for qp, pts in sorted(d.windows.items()):
        t = [p[0] for p in pts]
        if any(p[2] is not None for p in pts):
            ax2 = ax2 or ax.twinx()
            ax2.plot(t, [(p[2] or 0) / 1e6 for p in pts], lw=1.0, ls="--", label=f"{qp} rate")
        ax.plot(t, [(p[1] or 0) / 1024 for p in pts], lw=1.0, label=qp)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("window (KiB)")
    ax.set_xlim(0, d.duration_s)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if ax2 is not None:
        ax2.set_ylabel("DCQCN rate (Mb/s)")
        ax2.set_ylim(bottom=0)
    _fault_marks(ax, faults)
    if d.windows and len(d.windows) <= 12:
        ax.legend(loc="upper right", fontsize=7)
    return _save(fig, ax, path, title)


def queue_plot(d: RunData, faults: list[dict], path: Path, title: str, max_ports: int = 8) -> Path:
    """The busiest switch ports: queue (packets) over time above; ECN marks, trims and full-queue
    drops per second below (sums over every port)."""
    by_port: dict[str, list[dict]] = {}
    for r in d.ports:
        by_port.setdefault(f"{r['switch']}:{r['port']} (to {r['peer']})", []).append(r)
    busiest = sorted(by_port, key=lambda k: -max(r["queue"] for r in by_port[k]))[:max_ports]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 6), dpi=100, sharex=True)
    for k in busiest:
        rows = by_port[k]
        ax.plot([r["t"] for r in rows], [r["queue"] for r in rows], lw=1.0, label=k)
    ax.set_ylabel("queue (packets)")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    if busiest:
        ax.legend(loc="upper right", fontsize=7)
    ts = sorted({r["t"] for r in d.ports})
    for counter, color in (("marked", "#fb8c00"), ("trimmed", "#8e24aa"), ("queue_full", "#e53935")):
        totals = [sum(r[counter] for r in d.ports if r["t"] == t) for t in ts]
        rates = [max(0.0, (b - a) / (t1 - t0)) for (t0, a), (t1, b) in zip(zip(ts, totals), zip(ts[1:], totals[1:]))]
        bx.plot(ts[1:], rates, lw=1.2, color=color, label=counter.replace("_", " "))
    bx.set_ylabel("packets / s, all ports")
    bx.set_xlabel("time (s)")
    bx.set_xlim(0, d.duration_s)
    bx.set_ylim(bottom=0)
    bx.grid(alpha=0.3)
    bx.legend(loc="upper right", fontsize=7)
    _fault_marks(ax, faults)
    return _save(fig, ax, path, title)


def iteration_plot(rows: list[dict], faults: list[dict], path: Path, title: str) -> Path:
    """A collective's time per iteration (ms) against when it ended, faults as dashed lines
    (experiments/analysis/collectives.py ``iterations``)."""
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=100)
    ax.plot([r["end_s"] for r in rows], [r["time_s"] * 1e3 for r in rows], marker="o", ms=3, lw=1.2)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("time per iteration (ms)")
    ax.set_ylim(0, max([r["time_s"] * 1e3 for r in rows] or [1.0]) * 1.25)
    ax.grid(alpha=0.3)
    _fault_marks(ax, faults)
    return _save(fig, ax, path, title)


def cdf_plot(series: dict[str, list[float]], path: Path, title: str, xlabel: str) -> Path:
    """Empirical CDF of each named series (message completion times, s, on a log axis)."""
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for name, xs in series.items():
        xs = sorted(x for x in xs if x > 0)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=name)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, ax, path, title)


def sweep_plot(points: list[dict], variants: list[str], losses: list[float], path: Path, title: str,
               sizes: list[int] | None = None) -> Path:
    """Bus bandwidth (Mb/s) per variant, grouped by loss rate; where ``sizes`` (bytes per host) are
    swept, against message size as the paper's figs. 16-17 plot it: a colour per variant, a line
    style per loss rate, message size on a log axis."""
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    if sizes:
        at3 = {(p["variant"], p["loss"], p.get("message_bytes")): p for p in points}
        styles = ["-", "--", ":", "-."]
        for i, v in enumerate(variants):
            for j, x in enumerate(losses):
                got = [at3.get((v, x, b), {}) for b in sizes]
                ax.plot(sizes, [g.get("busbw_mbps") or 0.0 for g in got], styles[j % len(styles)], marker="o",
                        color=f"C{i}", label=f"{v}, {x * 100:g}% loss")
                void = [(b, g.get("busbw_mbps") or 0.0) for b, g in zip(sizes, got, strict=True)
                        if g.get("void") or g.get("held")]
                if void:  # a point where the emulator fell behind: drawn hollow, it proves nothing
                    ax.plot(*zip(*void, strict=True), "o", markersize=9, markerfacecolor="white", color=f"C{i}")
        if any(p.get("void") or p.get("held") for p in points):
            title += " (hollow: void or held, the emulator fell behind)"
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [size_text(b) for b in sizes])
        ax.set_xlabel("message size per host")
        ax.set_ylabel("bus bandwidth (Mb/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        return _save(fig, ax, path, title)
    width = 0.8 / max(1, len(variants))
    at = {(p["variant"], p["loss"]): p.get("busbw_mbps") or 0.0 for p in points}
    for i, v in enumerate(variants):
        xs = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(losses))]
        ax.bar(xs, [at.get((v, x), 0.0) for x in losses], width=width * 0.95, label=v)
    ax.set_xticks(range(len(losses)), [f"{x:.1%} loss" for x in losses])
    ax.set_ylabel("bus bandwidth (Mb/s)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _save(fig, ax, path, title)
