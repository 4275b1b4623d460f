"""Figures of a run (matplotlib, Agg): goodput against time with the faults marked, and EV state
over time (one row per EV, coloured by state, as the paper's figures 12-14)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from experiments.metrics import BIN_S, RunData  # noqa: E402

STATE_COLORS = {"GOOD": "#4caf50", "SKIP": "#ffc107", "ASSUMED_BAD": "#e53935", "DENIED": "#757575",
                "UNKNOWN": "#bdbdbd"}


def _fault_marks(ax, faults: list[dict]) -> None:
    ymax = ax.get_ylim()[1]
    for i, f in enumerate(faults):
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
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
