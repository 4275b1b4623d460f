"""Markers: ``root`` (namespaces, the kernel's IPv6 forwarding, tc eBPF) and ``bmv2`` (p4c +
simple_switch_grpc) are skipped
with the reason when the machine cannot run them; unmarked tests need nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest


def _root_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs iproute2"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True)
    if r.returncode != 0:
        return "cannot use network namespaces here"
    try:
        import mininet  # noqa: F401
    except ImportError:
        return "needs Mininet (apt-get install mininet; venv with --system-site-packages)"
    return None


def _bmv2_reason() -> str | None:
    missing = [b for b in ("p4c", "simple_switch_grpc") if shutil.which(b) is None]
    return f"needs the P4 toolchain: {' and '.join(missing)} not on PATH" if missing else None


def _clear_the_ground(config) -> str | None:
    """Removes what *crashed* runs left behind (as ``mrclab clean`` does) so one killed session
    cannot fail the next; returns a skip reason while another run is live (its namespaces would
    collide with ours)."""
    from mrclab.emulation.cleanup import clean, live_runs

    live = live_runs()
    if live:
        owners = ", ".join(f"pid {r.owner_pid} ({r.run_dir})" for r in live)
        return f"another mrclab run is live: {owners}; stop it or run `mrclab clean --force`"
    removed = clean()
    if removed:
        tr = config.pluginmanager.get_plugin("terminalreporter")
        msg = "mrclab: removed what a crashed run left behind: " + "; ".join(removed)
        if tr is not None:
            tr.write_line(msg, yellow=True)
    return None


def pytest_collection_modifyitems(config, items):
    root_why, bmv2_why = _root_reason(), _bmv2_reason()
    # markers, not keywords: a parametrised test whose id says "bmv2" is not a bmv2 test
    def marked(item, name):
        return item.get_closest_marker(name) is not None

    # not while only collecting (``--collect-only``, e.g. to count a marker's tests): that changes
    # nothing on the machine, and a session running beside it may own the "crashed" run (its
    # test_mrclab_clean_removes_a_crashed_run found its namespaces gone, 2026-12-07)
    if root_why is None and not config.option.collectonly and any(marked(i, "root") or marked(i, "bmv2")
                                                                  for i in items):
        root_why = _clear_the_ground(config)
    for item in items:
        if marked(item, "root") and root_why:
            item.add_marker(pytest.mark.skip(reason=root_why))
        if marked(item, "bmv2") and (bmv2_why or root_why):
            item.add_marker(pytest.mark.skip(reason=bmv2_why or root_why))


@pytest.fixture
def no_leftovers():
    """Asserts that a test leaves no namespace, run directory or process of mrclab behind."""
    from mrclab.emulation.cleanup import RUN_ROOT, list_netns

    before = {n for n in list_netns() if n.startswith("mrclab-")}
    yield
    after = {n for n in list_netns() if n.startswith("mrclab-")}
    assert after <= before, f"left behind namespaces: {sorted(after - before)}"
    runs = list(RUN_ROOT.glob("*/state.json")) if RUN_ROOT.is_dir() else []
    assert not runs, f"left behind run state: {runs}"
    for pattern in ("simple_switch_grpc.*mrclab", "-m mrclab.traffic.endpoint"):
        ps = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        assert not ps.stdout.strip(), f"left behind processes matching {pattern!r}: {ps.stdout}"


VOID_TRIES = 3


def _run_evidence(out) -> str:
    """What a results folder ``out`` says of the machine and the fabric, for a failed test's
    message (CI keeps no folder): each fidelity sample kind's worst value and where and when
    (``fidelity.csv``: endpoints', switches' and ksoftirqd's waits, loop gaps, steal), and each
    second in which switch ports marked or trimmed (``switches.csv``, counts since the one before),
    and each second's EV retirements with their hosts and causes (``events.csv``)."""
    import csv
    from pathlib import Path

    out, lines = Path(out), []
    if (out / "fidelity.csv").exists():
        worst: dict = {}
        for r in csv.DictReader((out / "fidelity.csv").open()):
            kind = (r["invariant"], "kernel" if r["where"].startswith("kernel") else "")
            if kind not in worst or float(r["value"]) > float(worst[kind]["value"]):
                worst[kind] = r
        lines += [f"worst {inv}{' (' + r['where'] + ')'}: {r['value']} at {r['t_s']} s (limit {r['limit']})"
                  for (inv, _), r in sorted(worst.items())]
    if (out / "switches.csv").exists():
        last: dict = {}
        by_t: dict = {}
        for r in csv.DictReader((out / "switches.csv").open()):
            key = (r["switch"], r["port"])
            now = (int(r["marked"] or 0), int(r["trimmed"] or 0))
            prev = last.get(key, (0, 0))
            last[key] = now
            if now != prev:
                by_t.setdefault(r["t"], []).append(f"{key[0]}:{key[1]} +{now[0] - prev[0]}m/+{now[1] - prev[1]}t")
        lines += [f"ports at {t} s: {', '.join(v)}" for t, v in by_t.items()]
        deepest: dict = {}  # (switch, port) -> (deepest queue read, packets dropped full by the end)
        for r in csv.DictReader((out / "switches.csv").open()):
            key, q = (r["switch"], r["port"]), int(float(r["queue"] or 0))
            deepest[key] = (max(q, deepest.get(key, (0, 0))[0]), int(r["queue_full"] or 0))
        lines += [f"deepest queues: " + ", ".join(f"{sw}:{p} {q} (dropped full {d})" for (sw, p), (q, d) in
                                                  sorted(deepest.items(), key=lambda kv: -kv[1][0])[:4])]
    if (out / "events.csv").exists():
        by_s: dict = {}
        for r in csv.DictReader((out / "events.csv").open()):
            if r["kind"] == "ev_state" and r["new"] == "ASSUMED_BAD":
                by_s.setdefault(int(float(r["t"])), []).append(f"{r['host']}:{r['reason'].split(' of PSN')[0]}")
        lines += [f"EVs retired in [{s}, {s + 1}) s: {len(v)} ({', '.join(sorted(set(v)))})"
                  for s, v in sorted(by_s.items())]
    for f in sorted((out / "endpoints").glob("*.telemetry.jsonl")) if (out / "endpoints").exists() else []:
        summaries = [json.loads(x) for x in f.read_text().splitlines() if '"summary"' in x]
        for tx in (summaries[-1]["tx"] if summaries else []):
            st = tx["stats"]
            qp = f"{f.name.split('.')[0]}->{tx['peer']}#{tx['qp']}"
            lines.append(f"QP {qp}: srtt {(tx.get('srtt_us') or 0) / 1e3:.0f} ms, "
                         f"window {tx.get('window_bytes') or 0:.0f} B, {st.get('data_packets')} sent, "
                         f"{st.get('retransmits')} resent, {st.get('timeouts')} timeouts")
    return "\n".join(lines)


@pytest.fixture
def run_evidence():
    """``run_evidence(out) -> str``: see :func:`_run_evidence`."""
    return _run_evidence


@pytest.fixture
def decided_run():
    """``decided_run(scn, folder, with_data=False, decides=(), cluster=None) -> (metrics, data or
    None, out folder)``: runs a scenario until its verdict is decided, and every metric named in ``decides``
    with it (a run that FAILed one claim while the claim a test reads was void decides nothing the
    test asks: transceiver-flap with probes off FAILed its goodput while its revival_s was void).
    A run with no FAIL but a void verdict (the emulator fell behind: the machine paused or starved
    it) says nothing either way, so it is run again, up to
    VOID_TRIES times, each into ``folder/try<n>``; when every try was void the test FAILS with the
    fidelity faults: a shipped scenario this machine (the documented 2-core one) cannot decide is a
    defect of the scenario (too heavy for it), never a skip the suite would accept."""
    from mrclab.experiments.run import runner

    def run(scn, folder, with_data=False, decides=(), cluster=None):
        why = []
        for n in range(1, VOID_TRIES + 1):
            out = folder / f"try{n}"
            m, d = runner.run_with_data(scn, out, live=False, cluster=cluster)
            d = d if with_data else None
            void = {v["metric"] for v in m["expectations"] if v.get("void")}
            if m["passed"] is not None and not void & set(decides):  # decided: pass or FAIL, on what it must
                return m, d, out
            worst = max(m["fidelity_faults"], key=lambda f: f["t1"] - f["t0"])
            why.append(f"try {n}: {len(m['void'])} verdicts void ({worst['invariant']} at {worst['where']}, "
                       f"{worst['t1'] - worst['t0']:.2f} s from {worst['t0']:.1f} s)")
        pytest.fail(f"{scn.name}: void {VOID_TRIES} times, this machine could not keep up: " + "; ".join(why))

    return run
