"""The fidelity monitor's invariants and what they do to verdicts: a window the emulator did not
keep up in is void, never pass and never FAIL; windows outside keep their verdicts; and a run
starved on purpose is seen (root)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mrclab.emulation.cleanup import netns_name
from mrclab.experiments.analysis import fidelity
from mrclab.experiments.analysis.expectations import windows
from mrclab.experiments.analysis.metrics import RunData
from mrclab.experiments.run import monitor
from mrclab.experiments.run.endpoints import GO_LEAD_S
from mrclab.experiments.run.runner import exit_code
from mrclab.topologies.addressing import ev_plane, ev_t1, make_ev
from mrclab.traffic.nicqueue import NicQueues


def test_starvation_needs_a_long_wait_per_run_and_real_waiting():
    cpu = [(1.0, "endpoint h0", 0.005, 0.5, 0.25),    # starved: 5 ms for a CPU each time, half the interval waiting
           (2.0, "endpoint h0", 0.005, 0.01, 0.25),   # waited long once or twice: not held back in any way that shows
           (3.0, "endpoint h1", 0.0002, 0.4, 0.25)]   # ten endpoints on two cores: many short waits, no packet notices
    found = fidelity.faults(cpu, [])
    assert [(f.invariant, f.where, f.t0, f.t1) for f in found] == [("CPU starvation", "endpoint h0", 0.75, 1.0)]


def test_a_slow_fabric_starves_only_when_its_waits_are_a_share_of_its_frame_time():
    # lab64 on bmv2 (4 KiB frames at 0.25 Mb/s: 136 ms each) waited 0.5-2 ms per wake-up and read
    # void under the fixed 0.5 ms; a twentieth of its frame time is 6.8 ms. Every shipped scenario
    # runs fast enough to keep 0.5 ms
    from mrclab.experiments.model.scenario import SCENARIO_DIR, load_scenario
    from mrclab.experiments.run.runner import fastest_frame_s
    from mrclab.protocol.headers import DATA_OVERHEAD

    assert fidelity.sched_delay_limit(0.0) == fidelity.SCHED_DELAY_MAX_S
    lab64 = load_scenario(SCENARIO_DIR / "large" / "lab64-quickstart.yaml", dataplane="bmv2")
    frame_s = fastest_frame_s(lab64.spec_for("bmv2"), lab64.settings.frame_bytes)
    assert frame_s == pytest.approx((4096 + DATA_OVERHEAD) * 8 / 0.25e6)
    limit = fidelity.sched_delay_limit(frame_s)
    assert limit == pytest.approx(0.05 * frame_s)
    cpu = [(1.0, "switch t1-4-0", 0.002, 0.5, 0.25), (2.0, "endpoint h0", 0.009, 0.5, 0.25)]
    assert len(fidelity.faults(cpu, [])) == 2
    assert [f.where for f in fidelity.faults(cpu, [], sched_delay_max_s=limit)] == ["endpoint h0"]  # 9 ms: still
    for f in sorted(SCENARIO_DIR.glob("*.yaml")):
        for dp in ("linux", "bmv2"):
            scn = load_scenario(f.stem, dataplane=dp)
            fs = fastest_frame_s(scn.spec_for(dp), scn.settings.frame_bytes)
            assert fidelity.sched_delay_limit(fs) == fidelity.SCHED_DELAY_MAX_S, (f.stem, dp, fs)


def test_a_path_with_propagation_delay_starves_only_at_a_share_of_its_round_trip():
    """The quickstart on bmv2 (15 ms a way) keeps its verdicts with endpoints waiting up to the
    limit its round trip gives, and was void on an idle machine under the fixed 0.5 ms (its
    untouched endpoints wait 0.7-1.9 ms a wake-up beside eight BMv2 switches on two cores); paths
    without delay (incast) keep the 0.5 ms floor, which is where incast's victim moved."""
    from mrclab.experiments.model.scenario import load_scenario
    from mrclab.experiments.run.runner import sched_delay_limit_for

    def limit(name, dp):
        return sched_delay_limit_for(load_scenario(name, dataplane=dp), dp)

    assert limit("quickstart", "bmv2") == pytest.approx(fidelity.SCHED_DELAY_RTT_SHARE * 0.030)
    assert limit("quickstart", "bmv2") > 0.002
    assert limit("incast", "bmv2") == limit("incast", "linux") == fidelity.SCHED_DELAY_MAX_S
    untouched = [(t, "endpoint h0", 0.0019, 0.5, 0.25) for t in (1.0, 1.25)]  # an idle bmv2 quickstart
    assert fidelity.faults(untouched, [])
    assert not fidelity.faults(untouched, [], sched_delay_max_s=limit("quickstart", "bmv2"))
    starved = [(1.0, "endpoint h0", 0.004, 0.5, 0.25)]
    assert fidelity.faults(starved, [], sched_delay_max_s=limit("quickstart", "bmv2"))


def test_a_late_samples_fault_covers_all_the_interval_it_read():
    """A sample taken 1.2 s after the one before (the monitor itself waited for a CPU) says the
    process starved somewhere in those 1.2 s: the fault covers them all, and so voids a verdict
    whose window ends a second before the sample was taken."""
    found = fidelity.faults([(9.0, "switch t1-0-0", 0.002, 0.6, 1.2)], [])
    assert [(f.t0, f.t1) for f in found] == [(pytest.approx(7.8), 9.0)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    assert fidelity.overlapping(windows(d, "evs_retired", {"after": 6, "within_s": 2.0}), found) == found


def test_late_timers_from_the_endpoints_loop_gaps_and_merging():
    gaps = [(1.0, "h0", 0.2), (1.1, "h1", 0.06), (5.0, "h0", 0.01)]
    assert fidelity.loop_gap_limit(0.028) == 0.028 and fidelity.loop_gap_limit(0.005) == fidelity.LOOP_GAP_MIN_S
    assert fidelity.faults([], gaps, loop_gap_max_s=0.3) == []  # a run whose timer floor is 300 ms
    found = fidelity.faults([], gaps, loop_gap_max_s=0.05)
    assert len(found) == 1 and found[0].invariant == "late timers"
    assert found[0].where == "endpoint h0, endpoint h1" and found[0].t0 == pytest.approx(0.8) and found[0].t1 == 1.1
    assert "late timers, endpoint h0, endpoint h1" in found[0].describe()


def test_a_verdict_is_void_only_when_its_window_overlaps_a_fault():
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    f = fidelity.FidelityFault("late timers", "endpoint h0", 16.5, 16.8, 0.3, 0.05)
    assert fidelity.overlapping(windows(d, "capacity_ratio", {"window": [18, 24]}), [f]) == []
    # capacity_ratio also reads the baseline before the first fault: a fault there voids it
    early = fidelity.FidelityFault("CPU starvation", "endpoint h1", 3.0, 3.25, 0.009, 0.002)
    assert fidelity.overlapping(windows(d, "capacity_ratio", {"window": [18, 24]}), [early]) == [early]
    assert fidelity.overlapping(windows(d, "revival_s", {"after": 16}), [f]) == [f]
    assert fidelity.overlapping(windows(d, "evs_retired", {"after": 8, "within_s": 1.0}), [f]) == []
    assert windows(d, "messages_intact", {}) == [(0.0, 24.0)]


def _judged(found, metric, args, d=None):
    from mrclab.experiments.analysis.expectations import judge

    d = d or RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.fidelity_windows = [(f.t0, f.t1) for f in found]
    d.retire_windows = [(f.t0, f.t1) for f in found if f.retires]  # as the runner sets them
    return judge(d, metric, args, found)


def test_correctness_is_never_void_a_corrupt_message_fails_whatever_the_machine_did():
    starved = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 3.0, 3.25, 0.009, 0.002)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.totals = {"h0->h2:1": {"messages_delivered": 10, "messages_corrupt": 1}}
    v = _judged(starved, "messages_intact", {}, d)
    assert v["passed"] is False and v["void"] is None, v
    d.totals = {"h0->h2:1": {"messages_delivered": 10, "messages_corrupt": 0}}
    assert _judged(starved, "messages_intact", {}, d)["passed"] is True


def test_run_long_counts_leave_out_what_happened_in_a_fault_and_say_how_many():
    """evs_retired over the run: a retirement inside a fault's reach is left out (and counted), the
    rest decide: a broken transport that retires EVs all run long still FAILs beside one starved
    sample; a reported figure is never void either."""
    starved = [fidelity.FidelityFault("CPU starvation", "switch t1-0-0", 3.0, 3.25, 0.009, 0.002)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": t, "host": "h0", "qp": 1, "ev": ev, "new": "ASSUMED_BAD"}
                for t, ev in ((3.5, 1), (12.0, 2), (13.0, 3), (14.0, 4))]
    v = _judged(starved, "evs_retired", {"max": 2}, d)
    assert (v["value"], v["passed"], v["void"]) == (3, False, None), v
    assert v["left_out"] == "1 retired EVs in fidelity faults left out" and v["whole"] == 4
    v = _judged(starved, "evs_retired", {"max": 3}, d)
    assert v["passed"] is True
    assert _judged([], "evs_retired", {"max": 3}, d)["passed"] is False  # without the fault: 4 counted
    assert _judged(starved, "mct_s", {"percentile": 99}, d)["void"] is None  # reported, not a verdict


def test_a_retirement_is_left_out_only_when_a_fault_met_the_span_since_its_packet_was_sent():
    """An ``ev_state`` retirement carries ``age_s``, how long before it the packet that retired the
    EV was sent: a fault that ended before that packet left cannot have lost or held it, so the
    retirement is the transport's and counts (the main job on bmv2 was void for retirements 0.8 s
    after a starved sample, whose packets left 40 ms before them); one whose packet was sent
    inside the fault is left out; one without ``age_s`` answers the last RETIRE_CAUSE_S."""
    from mrclab.experiments.analysis.metrics import RETIRE_CAUSE_S

    starved = [fidelity.FidelityFault("CPU starvation", "switch t1-0-0", 7.0, 7.25, 0.0006, 0.0005)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": 8.05, "host": "h0", "qp": 1, "ev": ev, "new": "ASSUMED_BAD", "age_s": 0.04}
                for ev in (1, 2)]
    v = _judged(starved, "evs_retired", {"after": 8, "within_s": 1.0, "min": 1}, d)
    assert (v["value"], v["passed"], v["void"], v.get("left_out")) == (2, True, None, None), v
    d.events[0]["age_s"] = 0.9  # its packet left at 7.15 s, inside the fault
    v = _judged(starved, "evs_retired", {"after": 8, "within_s": 1.0, "min": 1}, d)
    assert (v["value"], v["passed"], v["left_out"]) == (1, True, "1 retired EVs in fidelity faults left out"), v
    for e in d.events:
        e["age_s"] = None  # an older endpoint's event: the fallback span reaches the fault
    assert 8.05 - RETIRE_CAUSE_S < 7.25
    v = _judged(starved, "evs_retired", {"after": 8, "within_s": 1.0, "min": 1}, d)
    assert v["passed"] is None and v["void"], v


def test_a_switch_counters_total_leaves_out_what_its_ports_counted_beside_a_fault():
    """``port_total`` is a run-long count: the packets a port counted in a sample interval that met
    a fault (or the second after one) are left out and said, not the whole verdict voided; where
    what met its bound fell only beside faults, it is void; a count that fell (a switch restarted)
    counts from 0 again. Incast on bmv2 at half rate read 3980 trims against at least 1, and was
    void for one starved 0.25 s at 6.5 s."""
    d = RunData(duration_s=10.0)

    def ports(trims_a, trims_b):
        return [{"t": float(t), "switch": sw, "port": 1, "trimmed": n, "marked": 0, "queue_full": 0}
                for sw, trims in (("t0-0-0", trims_a), ("t1-0-0", trims_b)) for t, n in enumerate(trims, 1)]

    d.ports = ports([0, 40, 40, 40, 40, 40, 40, 40, 40], [0, 0, 0, 0, 0, 0, 0, 5, 7])  # 40 in (1, 2] s, 7 late
    starved = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 1.5, 1.75, 0.0008, 0.0005)]
    v = _judged(starved, "port_total", {"counter": "trimmed", "min": 1}, d)
    assert (v["value"], v["passed"], v["void"]) == (7, True, None), v
    assert (v["left_out"], v["whole"]) == ("40 trimmed packets in fidelity faults left out", 47), v
    assert _judged([], "port_total", {"counter": "trimmed", "min": 1}, d)["value"] == 47  # no fault: all of it
    assert _judged(starved, "port_total", {"counter": "trimmed", "switch": "t1-0-0", "min": 1}, d)["value"] == 7
    # the second after a fault is left out too: one ending at 6.5 s reaches the interval (7, 8] (its 5)
    early = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 5.25, 5.5, 0.0008, 0.0005)]
    assert _judged(early, "port_total", {"counter": "trimmed", "switch": "t1-0-0"}, d)["value"] == 7
    late = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 6.25, 6.5, 0.0008, 0.0005)]
    assert _judged(late, "port_total", {"counter": "trimmed", "switch": "t1-0-0"}, d)["value"] == 2
    later = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 7.5, 7.75, 0.0008, 0.0005)]
    assert _judged(later, "port_total", {"counter": "trimmed", "switch": "t1-0-0"}, d)["value"] == 0
    d.ports = ports([0, 40, 40, 40, 40, 40, 40, 40, 40], [0] * 9)  # every trim beside the fault: void
    v = _judged(starved, "port_total", {"counter": "trimmed", "min": 1}, d)
    assert v["passed"] is None and "CPU starvation" in v["void"], v
    assert _judged(starved, "port_total", {"counter": "trimmed", "max": 10}, d)["passed"] is True  # 0 outside
    d.ports = ports([0, 40, 3, 3, 3, 3, 3, 3, 3], [0] * 9)  # restarted at 3 s: 40, then 3 from 0 again
    v = _judged([], "port_total", {"counter": "trimmed"}, d)
    assert v["value"] == 3  # the figure as before: each port's last count
    assert d.port_left_out("trimmed") == 0 and RunData(duration_s=1, ports=d.ports,
                                                        fidelity_windows=[(0, 10)]).port_left_out("trimmed") == 43


def test_the_kernels_backlog_drops_are_read_from_softnet_stat_summed_over_the_cpus(tmp_path):
    stat = tmp_path / "softnet_stat"
    stat.write_text("0015e94c 00000003 00000001 00000000\n001eda38 0000000b 00000007 00000000\n")
    assert monitor.softnet_drops(str(stat)) == 3 + 11
    assert monitor.softnet_drops(str(tmp_path / "none")) == 0


def test_packets_the_kernel_dropped_void_what_they_touch_and_leave_the_retirements_they_caused_out():
    """14 packets dropped from the kernel's backlog in the sample before 18.5 s, on every plane at
    once (a t0t1-links-one-by-one run on linux once timed out 14 packets at 18.51 s with no switch
    or socket drop and retired 3 healthy EVs): a fault over that interval; the retirements within a
    retransmission timer after it are left out of false_retirements, not charged to the transport."""
    lost = [(18.5, 9, 0.25), (18.75, 5, 0.25), (30.0, 0, 0.25)]
    found = fidelity.faults([], [], lost=lost)
    assert [(f.invariant, f.t0, f.t1, f.worst, f.unit) for f in found] == \
        [(fidelity.LOST, 18.25, 18.75, 14, " packets")]
    assert "packets lost outside the model" in found[0].describe() and "14 packets" in found[0].describe()
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": t, "host": "h0", "qp": 1, "ev": ev, "new": "ASSUMED_BAD"}
                for t, ev in ((18.9, 1), (19.0, 2), (19.1, 3))]
    v = _judged(found, "evs_retired", {"max": 2}, d)
    assert (v["value"], v["passed"], v["whole"]) == (0, True, 3), v
    assert _judged([], "evs_retired", {"max": 2}, d)["passed"] is False  # without the watch: 3, FAIL
    assert _judged(found, "goodput_mbps", {"window": [18, 20], "min": 1}, d)["void"]  # a window over it is void
    assert _judged(found, "goodput_mbps", {"window": [20, 24], "min": 1}, d)["void"] is None


def test_the_monitor_records_only_intervals_in_which_the_kernel_dropped(monkeypatch):
    counts = iter([100, 100, 107, 107])
    monkeypatch.setattr(monitor, "softnet_drops", lambda: next(counts))
    m = monitor.FidelityMonitor({}, time.monotonic(), period_s=3600)
    m.stop()
    m._read_drops()  # 100: nothing
    m._read_drops()  # 107: 7 in the interval
    m._read_drops()
    assert [n for _, n, _ in m.kernel_drops] == [7]


def test_a_machine_the_hypervisor_took_a_fifth_of_over_a_second_is_a_fault_that_retires_nothing(tmp_path):
    """Steal time stops everything on its CPU and no process's schedstat counts it. A second where
    the hypervisor took 0.2 of the machine (the quickstart's goodput left its spread there) is a
    fault over that second; single bursts (one CPU, one 0.25 s sample, as this workplace's VMs lose
    about every second) and steady light steal are not."""
    burst = [(5.0, "cpu 0", 0.36, 0.25)]  # 0.09 CPU-s over 2 CPUs x 1 s: 0.045
    assert fidelity.faults([], [], stolen=burst, cpus=2) == []
    light = [(t / 4, f"cpu {c}", 0.15, 0.25) for t in range(40, 60) for c in (0, 1)]  # 0.15 of both
    assert fidelity.faults([], [], stolen=light, cpus=2) == []
    heavy = light + [(t / 4, f"cpu {c}", 0.3, 0.25) for t in range(61, 69) for c in (0, 1)]  # 15.25-17 s
    found = fidelity.faults([], [], stolen=heavy, cpus=2)
    assert [(f.invariant, round(f.t0, 2), round(f.t1, 2), f.retires) for f in found] == \
        [(fidelity.STOLEN, 14.75, 17.0, False)], found  # from 15.75 s: 0.75 s at 0.3 in its second
    assert found[0].worst == pytest.approx(0.3)
    assert fidelity.faults([], [], stolen=heavy) == []  # cpus unknown: not judged
    fidelity.write_csv(tmp_path / "f.csv", [], [], stolen=heavy, cpus=2)
    text = (tmp_path / "f.csv").read_text()
    assert "share of the interval the hypervisor took the CPU,cpu 1,0.300,,0.250" in text
    assert "share of the machine's CPU time the hypervisor took,this machine,0.300,0.2,1.000" in text
    with pytest.raises(ValueError, match="cpus must be at least 1"):
        fidelity.stolen_spans(heavy, 0)


def test_a_retirement_inside_a_steal_fault_stays_counted():
    """A steal span slows the lab; it loses nothing the held-packets and backlog watches would not
    see, so a retirement whose packet left inside it is the transport's and counts (a fault that
    could lose one, a starved switch, leaves it out)."""
    found = fidelity.faults([], [], stolen=[(t / 4, f"cpu {c}", 0.4, 0.25) for t in range(41, 45) for c in (0, 1)],
                            cpus=2)
    assert [(f.t0, f.t1, f.retires) for f in found] == [(9.5, 11.0, False)], found
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": 10.5, "host": "h0", "qp": 1, "ev": 1, "new": "ASSUMED_BAD", "age_s": 0.05}]
    v = _judged(found, "evs_retired", {"max": 0}, d)
    assert (v["value"], v["passed"], v["void"], v.get("left_out")) == (1, False, None, None), v
    starved = [fidelity.FidelityFault("CPU starvation", "switch t1-0-0", 9.5, 11.0, 0.009, 0.002)]
    assert _judged(starved, "evs_retired", {"max": 0}, d)["passed"] is True  # left out beside a lossy fault
    # and it voids nothing but a rate: the measurement behind it saw rates move, not the rest
    assert _judged(found, "retransmit_fraction", {"max": 1.5}, d)["void"] is None
    assert _judged(starved, "retransmit_fraction", {"max": 1.5}, d)["void"].startswith("CPU starvation")


def test_the_monitor_records_each_cpus_steal_as_a_share_of_its_interval(monkeypatch):
    seen = iter([[10.0, 20.0], [10.0, 20.0], [10.1, 20.0]])
    monkeypatch.setattr(monitor, "steal_s", lambda: next(seen))
    m = monitor.FidelityMonitor({}, time.monotonic(), period_s=3600)
    m.stop()
    m._read_steal()  # nothing stolen
    time.sleep(0.2)
    m._read_steal()  # cpu 0: 0.1 s of about 0.2
    assert [(cpu, 0.3 <= share <= 0.55) for _, cpu, share, _ in m.stolen] == [("cpu 0", True)], m.stolen


def test_the_kernels_softirq_threads_are_watched_as_the_fabrics_forwarding():
    """Each ksoftirqd this machine shows is watched, one per CPU (none where a PID namespace hides
    them: the watch is then absent, not silent)."""
    found = monitor.kernel_workers()
    assert all(label == f"kernel {Path(f'/proc/{pid}/comm').read_text().strip()}" for label, pid in found.items())
    assert not found or len(found) == os.cpu_count(), found


def test_a_retirement_is_left_out_only_for_a_fault_that_could_have_lost_its_packet_or_held_it_past_its_timer():
    """t0-down with port_state off (linux, 2026-12-03): its 6 EVs through the dead T0 timed out at
    the switch's death, the claim that FAILs without port_state (evs_retired max 0), and were left
    out for h0's NIC ports standing 4.8 ms behind their schedule beside them (1.2 ms frames): the
    run passed with the mechanism off. A delay shorter than the timer's floor (28 ms there) times
    nothing out and reorders nothing on a FIFO path: such a fault voids the windows it meets, and
    leaves retirements counted. A port held past the floor, a starved switch (a forwarder held back
    overflows queues no watch counts) and the watches of loss, reordering, held packets and late
    timers leave them out; an endpoint's starvation never does (its timers are the late-timers
    watch's)."""
    timer = 0.028
    behind = [fidelity.BehindSample(5.626, "h0 NIC port h0-eth1", 0.0048, 0.00118, 1.04, 0.0048)]
    found = fidelity.faults([], [], behind=behind, timer_s=timer)
    assert [(f.invariant, f.retires) for f in found] == [(fidelity.BEHIND, False)]
    d = RunData(duration_s=14.0, first_fault_s=4.7, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": 4.78 + i / 100, "host": "h0", "qp": 1, "ev": i, "new": "ASSUMED_BAD",
                 "age_s": 0.06} for i in range(6)]
    v = _judged(found, "evs_retired", {"max": 0}, d)
    assert (v["value"], v["passed"], v["void"], v.get("left_out")) == (6, False, None, None), v
    assert _judged(found, "goodput_ratio", {"window": [4.7, 5.7], "baseline": [1, 4], "min": 0.6}, d)["void"]
    held = [fidelity.BehindSample(5.626, "h0 NIC port h0-eth1", 0.030, 0.00118, 1.04, 0.030)]
    found = fidelity.faults([], [], behind=held, timer_s=timer)
    assert found[0].retires
    v = _judged(found, "evs_retired", {"max": 0}, d)
    assert (v["value"], v["whole"], v["passed"]) == (0, 6, True), v
    assert _judged([], "evs_retired", {"max": 0}, d)["passed"] is False
    late = [fidelity.LateInterval(5.6, "t0-1-0 port 3", 40, 0.005, 0.00118, 1.0, 100),
            fidelity.LateInterval(5.6, "t0-2-0 port 3", 40, 0.030, 0.00118, 1.0, 100)]
    assert [f.retires for f in fidelity.faults([], [], late=late[:1], timer_s=timer)] == [False]
    assert [f.retires for f in fidelity.faults([], [], late=late, timer_s=timer)] == [True]  # merged: either
    cpu = [(5.0, "endpoint h0", 0.004, 0.6, 0.25), (9.0, "switch t1-0-0", 0.004, 0.6, 0.25),
           (11.0, "kernel ksoftirqd/0", 0.004, 0.6, 0.25)]
    assert [(f.where, f.retires) for f in fidelity.faults(cpu, [], timer_s=timer)] == \
        [("endpoint h0", False), ("switch t1-0-0", True), ("kernel ksoftirqd/0", True)]
    assert all(f.retires for f in fidelity.faults([], [(5.0, "h0", 0.05)], loop_gap_max_s=timer, timer_s=timer))
    assert fidelity.faults(cpu, [])[0].retires  # no timer given: every fault could, as before


def test_a_count_bounded_below_is_void_only_where_what_met_its_bound_fell_inside_a_fault():
    """evs_retired(after=8, within_s=1, min=1): the dead path's EV retired inside a switch's starved
    stretch is left out, and what is left (0) is under the bound while the whole count (1) is not: void,
    not FAIL. With no retirement at all it FAILs whatever the machine did."""
    f = [fidelity.FidelityFault("CPU starvation", "switch t1-0-0", 8.0, 8.25, 0.009, 0.002)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": 8.2, "host": "h0", "qp": 1, "ev": 5, "new": "ASSUMED_BAD"}]
    v = _judged(f, "evs_retired", {"after": 8, "within_s": 1.0, "min": 1}, d)
    assert v["passed"] is None and "CPU starvation" in v["void"] and v["value"] == 0, v
    d.events = []
    v = _judged(f, "evs_retired", {"after": 8, "within_s": 1.0, "min": 1}, d)
    assert v["passed"] is False and v["void"] is None, v


def test_a_stall_counts_only_its_time_outside_the_machines_faults():
    from mrclab.experiments.analysis.metrics import BIN_S

    d = RunData(duration_s=10.0)
    d.qp_src = {"q": "h0"}
    # delivering every bin but for 4.0-6.0 s: a 2 s stall
    d.samples = {"q": [(round(i * BIN_S, 3), 1000 * (i if i * BIN_S < 4.0 else 40 if i * BIN_S < 6.0 else i - 20))
                       for i in range(101)]}
    whole = _judged([], "longest_stall_s", {"max": 0.5}, d)
    assert whole["value"] == pytest.approx(2.0, abs=0.11) and whole["passed"] is False
    f = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 4.5, 5.0, 0.009, 0.002)]
    v = _judged(f, "longest_stall_s", {"max": 0.5}, d)
    assert v["value"] == pytest.approx(whole["value"] - 0.5, abs=1e-6) and v["passed"] is False and v["void"] is None
    assert v["left_out"] == "1 stalls shortened in fidelity faults left out"


def test_a_windowed_verdict_is_void_only_where_a_fault_meets_its_window_and_the_run_is_undecided():
    from mrclab.experiments.run.runner import run_passed

    f = [fidelity.FidelityFault("late timers", "endpoint h0", 16.5, 16.8, 0.3, 0.05)]
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    inside = _judged(f, "goodput_mbps", {"window": [16, 18], "min": 1}, d)
    outside = _judged(f, "goodput_mbps", {"window": [18, 24], "min": 1}, d)
    assert inside["passed"] is None and "late timers" in inside["void"]
    assert outside["passed"] is False and outside["void"] is None
    assert run_passed([inside]) is None  # undecided: metrics.json says "passed": null, never true
    assert run_passed([inside, outside]) is False
    assert run_passed([{"passed": True, "void": None}]) is True


def test_exit_codes_fail_before_void_before_pass():
    base = {"expectations": [{}, {}], "fidelity_faults": [{"invariant": "late timers", "where": "endpoint h0",
                                                             "t0": 1.0, "t1": 1.3}]}
    assert exit_code({**base, "passed": False, "void": ["x"]}) == 1
    assert exit_code({**base, "passed": None, "void": ["x"]}) == 3
    assert exit_code({**base, "passed": True, "void": []}) == 0


@pytest.mark.root
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_a_run_starved_on_purpose_is_void_not_failed(tmp_path, no_leftovers):
    """Every process of the run and six busy loops share one CPU: the monitor sees the endpoints
    starve, every verdict reading those windows is void, and the run exits 3. Two busy loops
    starved nothing on 2026-12-04's AMD EPYC VM (the kernel's forwarding runs on the other CPU,
    where each interface's receive is steered, and a waking endpoint preempts a busy loop): two
    runs, no fidelity fault, every verdict passed. With six: starved 0.05-7.8 s, capacity read 0.0
    and was void, exit 3."""
    spin = [subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"]) for _ in range(6)]
    try:
        r = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "mrclab.cli", "run", "--dataplane", "linux",
                            "--duration", "8", "--out", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=300)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["fidelity_faults"] and m["void"], m["fidelity_faults"]
    assert r.returncode in (1, 3)
    assert r.returncode == 3 or any(v["passed"] is False for v in m["expectations"])
    if r.returncode == 3:
        assert "this machine could not keep up" in r.stderr.strip().splitlines()[-1]
    assert (tmp_path / "r" / "fidelity.csv").read_text().count("\n") > 10


def test_a_void_verdict_names_its_longest_fault_and_counts_the_rest():
    """A starved sample of a 64-switch fabric can name 25 switches and a verdict's window meet ten
    faults: the verdict names three places of the longest fault and counts the others (all stay in
    metrics.json's fidelity_faults)."""
    many = ", ".join(f"switch t0-{i}-0" for i in range(25))
    long_f = fidelity.FidelityFault("CPU starvation", many, 3.0, 4.0, 0.002, 0.0005)
    short_f = fidelity.FidelityFault("late timers", "endpoint h0", 1.0, 1.1, 0.06, 0.05)
    why = fidelity.void_reason([short_f, long_f, short_f])
    assert why.startswith("CPU starvation, switch t0-0-0, switch t0-1-0, switch t0-2-0 and 22 more, "
                          "1.00 s at 3.0-4.0 s")
    assert why.endswith("; and 2 more faults")
    assert fidelity.void_reason([short_f]) == short_f.describe() and fidelity.void_reason([]) is None


def test_a_packet_held_past_the_models_longest_round_trip_voids_the_verdicts_over_its_trip():
    """A spurious timeout (traffic/sender.py) whose packet was older at arrival than the longest
    round trip the model allows it was held outside the model: a "held packets" fault over its
    whole round trip, naming the path. The limit: twice the switch queues' bound (at least 20 ms),
    the propagation both ways, the NIC queue wait the sender's model says the packet met plus its
    frame (a full queue where the sender could not say), and the receiver's NIC: a full queue when
    it sends data too, else one frame. One no older than its limit is the model's own queueing
    (a user's timer floor below the runner's), and is no fault."""
    lim = fidelity.HeldLimits(queue_bound_s=0.05, path_delay_s=0.015, nic_queue_s=0.024, frame_s=0.002,
                              data_senders=frozenset({"h0", "h1"}))
    assert fidelity.HeldLimits().limit() == fidelity.HELD_MIN_S
    assert fidelity.HeldLimits(queue_bound_s=0.05).limit() == pytest.approx(0.1)
    assert lim.limit("h2", None) == pytest.approx(0.1 + 0.03 + 0.024 + 0.002)  # h2 sends no data: one frame
    assert lim.limit("h1", None) == pytest.approx(0.1 + 0.03 + 0.024 + 0.024)  # h1 does: its full queue
    assert lim.limit("h2", 0.005) == pytest.approx(0.1 + 0.03 + 0.005 + 0.002 + 0.002)  # the wait it met
    assert fidelity.HeldLimits(nic_queue_s=0.024).limit("h2", None) == pytest.approx(0.02 + 0.048)  # any may send
    ev = make_ev(1, 2, 7)
    assert (ev_plane(ev), ev_t1(ev)) == (1, 2)
    events = [{"t": 9.0, "kind": "spurious_timeout", "host": "h0", "peer": "h2", "qp": 1, "psn": 5, "ev": ev,
               "age_s": 0.3, "nic_wait_s": None},
              {"t": 12.0, "kind": "spurious_timeout", "host": "h0", "peer": "h2", "qp": 1, "psn": 9, "ev": ev,
               "age_s": 0.15, "nic_wait_s": 0.001},
              {"t": 14.0, "kind": "spurious_timeout", "host": "h0", "peer": "h1", "qp": 2, "psn": 3, "ev": ev,
               "age_s": 0.15, "nic_wait_s": 0.001},
              {"t": 9.5, "kind": "timeout", "host": "h0", "peer": "h2", "qp": 1, "psn": 6, "ev": ev}]
    held = fidelity.held_packets(events, lim)
    assert held == [(9.0, "h0->h2 plane 1 T1 2", 0.3, pytest.approx(0.156)),
                    (12.0, "h0->h2 plane 1 T1 2", 0.15, pytest.approx(0.135)),
                    (14.0, "h0->h1 plane 1 T1 2", 0.15, pytest.approx(0.157))]
    found = fidelity.faults([], [], held=held)
    assert [(f.invariant, f.where, f.t0, f.t1) for f in found] == [
        ("held packets", "h0->h2 plane 1 T1 2", pytest.approx(8.7), 9.0),
        ("held packets", "h0->h2 plane 1 T1 2", pytest.approx(11.85), 12.0)]  # not h0->h1: its SACK may queue
    d = RunData(duration_s=24.0, first_fault_s=8.0, traffic_start_s=0.0)
    assert fidelity.overlapping(windows(d, "capacity_ratio", {"window": [8.8, 10]}), found) == found[:1]
    assert fidelity.overlapping(windows(d, "capacity_ratio", {"window": [13, 15]}), found) == []
    assert fidelity.void_reason(found).startswith("held packets, h0->h2 plane 1 T1 2, 0.30 s")


def test_a_held_packet_is_judged_by_its_one_way_time_from_its_stamps_where_it_has_them():
    """With the one-way time the SACK echoed (``wire_s``), a spurious timeout is judged against
    what the way there allows (NIC wait and frame, switch queues, a frame on each of 4 links, the
    propagation one way), not its age at the SACK: a packet 150 ms old when its SACK came back but
    40 ms on its way is no fault (the rest was its SACK's wait and way back); one 90 ms on its way
    is, and its fault covers its way there, from its send to its arrival."""
    lim = fidelity.HeldLimits(queue_bound_s=0.05, path_delay_s=0.015, nic_queue_s=0.024, frame_s=0.002)
    assert lim.one_way(0.001) == pytest.approx(0.001 + 0.002 + 0.05 + 4 * 0.002 + 0.015)  # 76 ms
    assert lim.one_way(None) == pytest.approx(0.024 + 0.05 + 0.008 + 0.015)
    assert fidelity.HeldLimits().one_way() == fidelity.HELD_MIN_S
    ev = make_ev(1, 2, 7)
    events = [{"t": 12.0, "kind": "spurious_timeout", "host": "h0", "peer": "h2", "qp": 1, "psn": 9, "ev": ev,
               "age_s": 0.15, "nic_wait_s": 0.001, "wire_s": 0.04},
              {"t": 14.0, "kind": "spurious_timeout", "host": "h0", "peer": "h2", "qp": 1, "psn": 3, "ev": ev,
               "age_s": 0.15, "nic_wait_s": 0.001, "wire_s": 0.09}]
    held = fidelity.held_packets(events, lim)
    assert held == [(pytest.approx(11.89), "h0->h2 plane 1 T1 2", 0.04, pytest.approx(0.076)),
                    (pytest.approx(13.94), "h0->h2 plane 1 T1 2", 0.09, pytest.approx(0.076))]
    found = fidelity.faults([], [], held=held)
    assert [(f.where, f.t0, f.t1) for f in found] == [("h0->h2 plane 1 T1 2", pytest.approx(13.85),
                                                       pytest.approx(13.94))]


def test_a_hosts_nic_queue_model_gives_each_frame_the_wait_behind_what_it_sent_before():
    """traffic/nicqueue.py: a port drained at its rate; a frame waits for the bytes still queued
    ahead of it; the history answers per millisecond with the longest wait, per plane, and only
    for what it still holds."""
    q = NicQueues(2, 8e6)  # 1 MB/s: a 1000-byte frame takes 1 ms
    frame = (0, bytes(1000))
    q.add([frame] * 3, 10.0)  # three frames at once: waits 0, 1 and 2 ms
    assert q.wait_at(0, 10.0) == pytest.approx(0.002) and q.wait_at(1, 10.0) is None
    q.add([frame], 10.0025)  # 0.5 ms of the 3 ms queued is left
    assert q.wait_at(0, 10.0025) == pytest.approx(0.0005)
    q.add([(1, bytes(1000))], 10.1)  # the other port: its own queue, empty
    assert q.wait_at(1, 10.1) == 0.0
    q.add([frame], 20.0)  # long drained
    assert q.wait_at(0, 20.0) == 0.0 and q.wait_at(0, 15.0) is None
    assert q.wait_at(0, 10.0) is None  # older than the history
    with pytest.raises(ValueError, match="allowed: > 0"):
        NicQueues(1, 0)


def test_a_nic_port_with_a_burst_sends_its_first_frames_at_once_then_at_its_rate():
    """A tbf shaper's bucket (two frames' worth after a pause) lets the first frames leave at once;
    the next waits for the bucket to refill with its bytes, and every later one a frame time."""
    q = NicQueues(1, 8e6, burst_bytes=2500)  # 1 MB/s: 1000 bytes a ms; 2.5 frames in the bucket
    waits = q.add([(0, bytes(1000))] * 4, 10.0)
    assert waits == pytest.approx([0.0, 0.0, 0.0005, 0.0015])  # 500 bytes left, then 500 more to fill
    assert q.wait_at(0, 10.0) == pytest.approx(0.0015)
    assert q.add([(0, bytes(1000))], 10.001) == pytest.approx([0.0015])  # behind the last: 10.0015 + 1 ms
    assert q.add([(0, bytes(1000))] * 3, 20.0) == pytest.approx([0.0, 0.0, 0.0005])  # refilled, to its burst
    assert NicQueues(1, 8e6).add([(0, bytes(1000))] * 2, 1.0) == pytest.approx([0.0, 0.001])  # no burst


#: Two cross-T1 flows over the quickstart's bmv2 fabric, no fault played: any EV retired is false.
HELD_SCENARIO = """
name: held-switch
fabric: {topo: lab, link: {bandwidth_mbps: 1.5, t0_t1_bandwidth_mbps: 3, queue_packets: 16, path_delay_ms: 15}}
dataplane: bmv2
seed: 1
duration_s: 8
transport: {kind: mrc}
workload:
  - {src: h0, dst: h2, qps: 1, message_bytes: 262144}
  - {src: h3, dst: h1, qps: 1, message_bytes: 262144}
expect:
  - {metric: false_retirements, max: 2}
  - {metric: goodput_mbps, window: [1, 4], min: 0.1}
  - {metric: messages_intact}
"""


NIC_HELD_SCENARIO = """
name: held-nic
fabric: {topo: lab, link: {bandwidth_mbps: 4, queue_packets: 16, path_delay_ms: 2}}
dataplane: linux
seed: 1
duration_s: 7
transport: {kind: mrc, nic_stamps: STAMPS}
workload:
  - {src: h0, dst: h2, qps: 1, message_bytes: 262144}
expect:
  - {metric: false_retirements, max: 2}
  - {metric: messages_intact}
"""


def _run_with_h0_nic_held(tmp_path, stamps: bool, roce: bool = False) -> tuple[dict, list[float]]:
    """NIC_HELD_SCENARIO with h0's plane-1 NIC port held (a trickle, as ``mrclab bench fidelity
    --target nic`` holds them: tbf keeps its queue) for 150 ms at t = 2, 3.5 and 5 s while its
    other ports send: (metrics, each hold's length in ms). ``roce``: the baseline's one QP
    instead, and every port of h0 held (its one path is on whichever plane its hash gave it)."""
    import threading

    from mrclab.emulation import kernel
    from mrclab.experiments.model.scenario import load_scenario
    from mrclab.experiments.run.runner import run_with_data

    path = tmp_path / f"held-{stamps}-{roce}.yaml"
    text = NIC_HELD_SCENARIO.replace("STAMPS", str(stamps).lower())
    if roce:
        # its timer at 5 x 20 ms, not 5 x the lab's floor for this path (1 s, max_rto_s: longer than a hold)
        text = text.replace("kind: mrc", "kind: roce, min_rto_s: 0.02").replace(
            "  - {metric: false_retirements, max: 2}\n", "")
    path.write_text(text)
    held: list[float] = []

    def port1(lines: list[str]) -> str:  # the plane-1 port's line alone (every port's for RoCE)
        return "".join(f"{x}\n" for x in lines if roce or " dev h0-eth1 " in x)

    def hold(_watched, t0: float, fab=None) -> None:
        def run() -> None:
            tc = kernel.TcStream(fab.emu.netns("h0"))
            try:
                for at in (2.0, 3.5, 5.0):
                    time.sleep(max(0.0, t0 + at - time.monotonic()))
                    start = time.monotonic()
                    tc.write(port1(fab.emu.nic_shaper_lines("h0", "8kbit")))
                    time.sleep(0.15)
                    tc.write(port1(fab.emu.nic_shaper_lines("h0", fab.spec.link.bandwidth_mbps)))
                    held.append((time.monotonic() - start) * 1e3)
            except (OSError, ValueError):  # the run ended first
                pass
            finally:
                tc.close()
        threading.Thread(target=run, daemon=True).start()

    m, _ = run_with_data(load_scenario(path), tmp_path / f"r-{stamps}-{roce}", live=False, on_start=hold)
    return m, held


@pytest.mark.root
def test_a_nic_port_the_machine_held_retires_no_ev_where_packets_are_timed_from_their_departure_stamps(
        tmp_path, no_leftovers):
    """h0's plane-1 NIC port held three times for 150 ms (a machine that did not run its shaper:
    a busy machine held a flap-soak packet in its plane-2 port 72 ms, 2026-12-06) while the other
    ports send, with no fault on any path. With the
    ports' departure stamps (traffic/txstamp.py) the sender's timer runs from when each packet
    left: no timeout, no EV retired, nothing for the monitor to leave out. With them off, the
    host's model of its queues cannot see the holds: the timer fires on packets still in the port,
    and EVs are retired for it (counted, or left out as the machine's)."""
    m, held = _run_with_h0_nic_held(tmp_path, stamps=True)
    assert len(held) == 3 and all(140 <= h <= 200 for h in held), held
    tot = m["totals"]["h0->h2#1"]
    # (a last few are acknowledged before their stamps are read)
    assert tot["wire_stamped"] >= 0.99 * tot["data_packets"] > 0, tot
    assert tot["timeouts"] == 0 and tot["nic_deferred"] > 0, tot
    false_ret = next(v for v in m["expectations"] if v["metric"] == "false_retirements")
    assert false_ret["value"] == 0 and not false_ret.get("left_out"), false_ret
    assert m["ev_state_changes"] == 0, m["ev_state_changes"]
    assert all(v["passed"] for v in m["expectations"]), m["expectations"]

    m, held = _run_with_h0_nic_held(tmp_path, stamps=False)
    tot = m["totals"]["h0->h2#1"]
    assert len(held) == 3 and tot["wire_stamped"] == 0 and tot["timeouts"] > 0, tot
    false_ret = next(v for v in m["expectations"] if v["metric"] == "false_retirements")
    left = int(false_ret["left_out"].split()[0]) if false_ret.get("left_out") else 0
    assert false_ret["value"] + left > 0, false_ret


@pytest.mark.root
def test_roce_s_go_back_n_timer_runs_from_the_departure_stamps_of_a_port_the_machine_held(tmp_path, no_leftovers):
    """The baseline as a NIC runs it: its Local ACK Timeout (5 x min_rto_s, 100 ms) starts as the
    port sends the request packet. h0's ports held three times for 150 ms (the QP's telemetry saw
    nothing acknowledged for about 0.5 s each time, 2026-12-07): with the stamps no go-back-N,
    without them one at each hold (3 timeouts, 43 PSNs resent), on packets still in the port."""
    m, held = _run_with_h0_nic_held(tmp_path, stamps=True, roce=True)
    assert len(held) == 3 and all(140 <= h <= 200 for h in held), held
    tot = m["totals"]["h0->h2#1"]
    assert tot["wire_stamped"] >= 0.99 * tot["data_packets"] > 0, tot
    assert tot["timeouts"] == 0 and tot["nic_deferred"] > 0, tot
    assert all(v["passed"] for v in m["expectations"]), m["expectations"]

    m, held = _run_with_h0_nic_held(tmp_path, stamps=False, roce=True)
    tot = m["totals"]["h0->h2#1"]
    assert len(held) == 3 and tot["wire_stamped"] == 0 and tot["timeouts"] > 0, tot


@pytest.mark.root
@pytest.mark.bmv2
def test_a_switch_stopped_for_a_while_holds_packets_and_voids_what_they_touch(tmp_path, no_leftovers):
    """Two flows across the T1s on bmv2, and the T1 0 of planes 0 and 1 stopped (SIGSTOP) for
    0.6 s from about t = 1.5 s: the packets inside them wait, the senders' timers give up on them and
    retire their EVs, and then they arrive. A stopped process is not runnable, so no CPU sample sees
    it, and no endpoint's loop waited for a CPU: only the held-packets watch does. Without it
    ``false_retirements`` FAILs (no fault was played; the stop retired every EV through those T1s
    with a packet in flight); with it the retirements the holds caused are left out of that count
    (and counted apart), the windowed verdict over the holds is void, none FAILs, and the run exits 3."""
    scn = tmp_path / "held.yaml"
    scn.write_text(HELD_SCENARIO)
    p = subprocess.Popen([sys.executable, "-m", "mrclab.cli", "run", str(scn), "--out", str(tmp_path / "r")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})  # progress lines as they come
    stopped: list[int] = []
    try:
        assert p.stderr is not None
        for line in p.stderr:  # the runner's progress
            if "t = 0 in" in line:
                break
        time.sleep(GO_LEAD_S + 1.5)
        for sw in ("t1-0-0", "t1-1-0"):
            pids = subprocess.run(["ip", "netns", "pids", netns_name(sw)], capture_output=True, text=True,
                                  check=False).stdout.split()
            assert pids, f"no process in {netns_name(sw)}"
            for pid in map(int, pids):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        time.sleep(0.6)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    out, err = p.communicate(timeout=300)
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    held = [f for f in m["fidelity_faults"] if f["invariant"] == "held packets"]
    assert held, (m["fidelity_faults"], out[-2000:])
    assert any(("plane 0 T1 0" in f["where"] or "plane 1 T1 0" in f["where"]) and f["t1"] > 1.5 and f["t0"] < 3.5
               for f in held), held
    assert all(v["passed"] is not False for v in m["expectations"]), m["expectations"]
    false_ret = next(v for v in m["expectations"] if v["metric"] == "false_retirements")
    assert false_ret["passed"] is True and "retirements in fidelity faults left out" in false_ret["left_out"], false_ret
    assert int(false_ret["left_out"].split()[0]) + false_ret["value"] > 2  # FAIL but for the watch
    assert next(v for v in m["expectations"] if v["metric"] == "goodput_mbps")["void"], m["expectations"]
    assert p.returncode == 3, err[-2000:]


def test_the_port_sampler_reads_one_switch_at_a_time_spread_over_its_period():
    """A round reads each switch once, the reads spread evenly over the period (not all at once:
    a burst of reads wakes every switch's control threads together), and stamps the round's rows
    with one time; a round where a read failed is dropped whole."""
    from mrclab.controller.dataplanes import DATAPLANES
    from mrclab.experiments.run.runner import PortSampler

    class Fab:
        plane = DATAPLANES["bmv2"]  # its switches' reads are capped (16 a second)

        def __init__(self) -> None:
            self.reads: list[tuple[float, str]] = []

        def sampled_switches(self) -> list[str]:
            return ["a", "b", "c", "d"]

        def port_samples(self, switches=None):
            if switches is None:  # the last sample, at stop: every switch at once
                return [{"switch": sw, "port": 1, "queue": 0, "last": True} for sw in self.sampled_switches()]
            (sw,) = switches
            self.reads.append((time.monotonic(), sw))
            if sw == "c" and sum(1 for _, s in self.reads if s == "c") == 2:
                raise RuntimeError("restarting")
            return [{"switch": sw, "port": 1, "queue": 0}]

    fab = Fab()
    sampler = PortSampler(fab, time.monotonic(), period_s=0.4)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while len(sampler.samples) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    # round 2's read of c failed: the rest of that round is not read
    assert [s for _, s in fab.reads[:11]] == ["a", "b", "c", "d", "a", "b", "c", "a", "b", "c", "d"]
    gaps = [b - a for (a, _), (b, _) in zip(fab.reads, fab.reads[1:])]
    assert min(gaps[:3]) >= 0.09, gaps  # 0.4 s / 4 switches
    spread = [r for r in sampler.samples if not r.get("last")]
    rounds = sorted({r["t"] for r in spread})
    by_t = {t: [r["switch"] for r in spread if r["t"] == t] for t in rounds}
    assert list(by_t.values())[:2] == [["a", "b", "c", "d"]] * 2  # rounds 1 and 3: round 2 is not kept
    assert rounds[1] - rounds[0] >= 0.7  # round 3 ended two periods after round 1
    last = sampler.samples[len(spread):]  # stop read every switch once more, after every round
    assert [r["switch"] for r in last] == ["a", "b", "c", "d"] and all(r.get("last") for r in last)
    assert last[0]["t"] >= rounds[-1]


def test_a_large_bmv2_fabric_is_read_by_the_runner_16_switches_a_second_at_most():
    from mrclab.controller.dataplanes import control_period_s

    assert control_period_s(3) == control_period_s(16) == 1.0
    assert control_period_s(64) == 4.0
    assert control_period_s(32, 2.5) == 2.5


# ---- mrclab bench fidelity: starvation on purpose --------------------------------------------------
def test_bench_fidelity_marks_a_verdict_that_left_its_untouched_spread():
    from mrclab.bench.fidelity import Level, moved, spread

    band = spread([0.5, 0.7, 0.6])
    assert band == (pytest.approx(0.4), pytest.approx(0.8))  # widened by half its width (0.1 each way)
    assert not moved(0.75, band) and moved(0.35, band) and moved(None, band)  # None: infinite
    assert spread([2.0, 2.0, 2.0]) == (pytest.approx(1.96), pytest.approx(2.04))  # 2% of the median at least
    assert spread([1.0, None]) is None and not moved(5.0, None)
    assert Level(5.0, 1.0).wait_ms == 4.0 and Level().label() == "none" and Level(20, 4).label() == "16 ms (4 of 20 ms)"


def test_bench_fidelity_table_names_the_first_level_that_moved_and_the_first_the_monitor_voided():
    from mrclab.bench.fidelity import Level, table

    def row(level, value, void=0):
        return {"level": level, "values": {"capacity_ratio(...)": value}, "verdicts": {}, "void": void, "of": 1,
                "seen_ms": 0.2, "faults": {"CPU starvation": 1} if void else {}}

    rows = [row(Level(), 0.95), row(Level(), 0.96), row(Level(2, 1), 0.955), row(Level(5, 1), 0.80),
            row(Level(10, 2), 0.7, void=1)]
    md = table("quickstart", "linux", "endpoint", rows, markdown=True)
    assert "first level that moved a verdict: 4 ms; first the monitor voided: 8 ms" in md
    assert "| 4 ms (1 of 5 ms) | 0.20 | silent | 0.8* |" in md and "| 1 ms (1 of 2 ms) | 0.20 | silent | 0.955 |" in md
    # with the drain watch's readings (linux's switch ports, the NIC ports): a column of its own
    rows = [dict(r, behind=(n, 400, worst)) for r, (n, worst) in zip(rows, [(0, 0.0)] * 3 + [(3, 2.5), (40, 9.0)])]
    md = table("quickstart", "linux", "endpoint", rows, markdown=True)
    assert "readings behind schedule (of all; most fallen behind in frames)" in md
    assert "| 4 ms (1 of 5 ms) | 0.20 | 3 of 400 (2.50) | silent | 0.8* |" in md


@pytest.mark.root
def test_a_throttled_group_starves_what_it_holds_and_always_lets_go(tmp_path):
    """A busy loop in a group that runs 2 ms of every 10 waits about 8 ms each time it runs (the
    kernel's run-queue delay, which the monitor reads), and is back in the root group afterwards,
    the group gone, even when the block raises."""
    from mrclab.bench.fidelity import Level, throttled_group
    from mrclab.topologies.errors import NotAvailable

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        w0, r0 = monitor.schedstat(busy.pid)
        try:
            with throttled_group(Level(10.0, 2.0)) as g:
                (g / "cgroup.procs").write_text(str(busy.pid))
                time.sleep(1.0)
                w1, r1 = monitor.schedstat(busy.pid)
                raise KeyError("on the way out")
        except KeyError:
            pass
        except NotAvailable as e:
            pytest.skip(str(e))
        assert (w1 - w0) / max(1, r1 - r0) > 0.004, ((w1 - w0) / 1e6, r1 - r0)  # > 4 ms a run
        assert not g.exists()
    finally:
        busy.kill()
        busy.wait()


def test_a_windowed_mean_reads_its_window_outside_the_faults_and_fails_a_transport_that_slows_outside_them():
    """goodput over the whole of a 20 s run with one starved sample at 10.0-10.25 s, while the
    flows delivered nothing for 1 s from it: the mean leaves the fault and the second after it out
    (1.25 s), says so, and passes, where voiding the whole run's window for one sample decided
    nothing. A fault holding more than half of the window leaves it void; a transport that slows
    down outside the faults FAILs whatever the machine did."""
    from mrclab.experiments.analysis.metrics import BIN_S

    def run(rate_after_15: int) -> RunData:
        d = RunData(duration_s=20.0)
        d.qp_src = {"q": "h0"}
        total, pts = 0, []
        for i in range(201):
            t = i * BIN_S
            pts.append((round(t, 3), total))
            total += 0 if 10.0 <= t < 11.0 else (1000 if t < 15.0 else rate_after_15)
        d.samples = {"q": pts}
        return d

    full = 1000 * 8 / BIN_S / 1e6  # Mb/s
    starved = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 10.0, 10.25, 0.009, 0.002)]
    whole = _judged([], "goodput_mbps", {"window": [0, 20], "min": 0.97 * full}, run(1000))
    assert whole["passed"] is False and whole["value"] == pytest.approx(0.95 * full, rel=0.01)  # the dip, read
    v = _judged(starved, "goodput_mbps", {"window": [0, 20], "min": 0.97 * full}, run(1000))
    assert (v["passed"], v["void"]) == (True, None) and v["value"] == pytest.approx(full, rel=0.01), v
    assert v["left_out"] == "1.2 s in fidelity faults left out"
    slow = _judged(starved, "goodput_mbps", {"window": [0, 20], "min": 0.97 * full}, run(500))
    assert (slow["passed"], slow["void"]) == (False, None), slow
    long_f = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 2.0, 12.0, 0.009, 0.002)]
    held = _judged(long_f, "goodput_mbps", {"window": [0, 20], "min": 0.97 * full}, run(1000))
    assert held["passed"] is None and "CPU starvation" in held["void"], held
    # a recovery time, which a lapse can only lengthen: within its bound it passes beside the fault
    # in the dip it read (10-11 s); past its bound it is void where a fault met the time up to the
    # bound, and FAILs where the fault came later (it had run past its bound by then)
    v = _judged(starved, "recovery_time_s", {"after": 10, "max": 2}, run(1000))
    assert (v["passed"], v["void"]) == (True, None) and v["value"] == pytest.approx(1.0, abs=0.11), v
    assert _judged(starved, "recovery_time_s", {"after": 10, "max": 0.5}, run(1000))["void"]
    late = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 15.0, 15.25, 0.009, 0.002)]
    v = _judged(late, "recovery_time_s", {"after": 10, "max": 0.5}, run(1000))
    assert (v["passed"], v["void"]) == (False, None), v


def test_memory_within_its_bound_passes_whatever_the_machine_did_and_growth_beside_a_fault_is_void():
    """rss_growth(after=6, max=1.1): a lapse of the machine can swell an endpoint (a backlog), never
    shrink it, so a flat run passes beside a starved sample at 30 s; a run that grew beside one is
    void (the machine may have grown it), and FAILs without one; a lapse at the first reading, which
    could swell it and hide growth, leaves a flat run void too."""
    d = RunData(duration_s=60.0, first_fault_s=10.0, traffic_start_s=0.0)
    starved = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 30.0, 30.25, 0.009, 0.002)]
    d.rss = [(t, "h0", 100) for t in range(6, 61)]
    assert _judged(starved, "rss_growth", {"after": 6, "max": 1.1}, d)["passed"] is True
    d.rss = [(t, "h0", 100 + 2 * t) for t in range(6, 61)]
    grew = _judged(starved, "rss_growth", {"after": 6, "max": 1.1}, d)
    assert grew["passed"] is None and "CPU starvation" in grew["void"], grew
    assert _judged([], "rss_growth", {"after": 6, "max": 1.1}, d)["passed"] is False
    d.rss = [(t, "h0", 100) for t in range(6, 61)]
    at_start = [fidelity.FidelityFault("CPU starvation", "endpoint h0", 5.5, 6.0, 0.009, 0.002)]
    assert _judged(at_start, "rss_growth", {"after": 6, "max": 1.1}, d)["void"]


def test_a_path_that_reordered_is_a_fault_over_its_sample_and_its_retirements_are_left_out():
    """Receivers counted 3 then 2 first transmissions behind later ones on their EV (a FIFO path
    reordered: the quick reproduce table's ev-loss once had 52 "gaps" and 27 duplicates with no
    switch drop) in the samples ending 1.0 s and 1.1 s: one fault over both, whose retirements are
    not charged to the transport."""
    reordered = [(1.0, "h2", 3), (1.1, "h2", 2), (5.0, "h2", 0)]
    found = fidelity.faults([], [], reordered=reordered)
    assert [(f.invariant, f.where, round(f.t0, 3), f.t1, f.worst) for f in found] == \
        [(fidelity.REORDERED, "paths to h2", 0.9, 1.1, 5)]
    d = RunData(duration_s=10.0, first_fault_s=6.0, traffic_start_s=0.0)
    d.events = [{"kind": "ev_state", "t": t, "host": "h0", "qp": 1, "ev": ev, "new": "ASSUMED_BAD"}
                for t, ev in ((1.05, 1), (1.06, 2), (3.5, 3))]
    v = _judged(found, "evs_retired", {"max": 2}, d)
    assert (v["value"], v["passed"], v["whole"]) == (1, True, 3), v  # the one 2.4 s after it stays
    assert _judged([], "evs_retired", {"max": 2}, d)["passed"] is False  # without the watch: 3, FAIL


def test_the_drain_watch_counts_each_ports_late_packets_per_interval_and_judges_their_share():
    """RunData.late_departures turns the bmv2 port samples' running ``late`` and ``sent`` counts
    into each interval's new ones (a count that fell, a restarted switch, counts from 0), skips rows
    without the watch (linux), and late_summary sums them. A port behind its schedule is a fault
    over its interval only where its late packets were at least LATE_MIN and more than
    LATE_SHARE_MAX of what it sent then."""
    row = {"switch": "t0-0-0", "peer": "t1-0-0", "queue": 0, "marked": 0, "trimmed": 0, "queue_full": 0,
           "gap_us": 4716}
    data = RunData(duration_s=5.0, ports=[
        {**row, "t": 1.0, "port": 3, "late": 0, "late_max_us": 900, "sent": 100},
        {**row, "t": 2.0, "port": 3, "late": 2, "late_max_us": 12_000, "sent": 300},
        {**row, "t": 3.0, "port": 3, "late": 2, "late_max_us": 1_000, "sent": 500},
        {**row, "t": 4.0, "port": 3, "late": 1, "late_max_us": 30_000, "sent": 40},  # restarted: 1 new
        {**row, "t": 2.0, "port": 4, "late": 5, "late_max_us": 8_000, "sent": 50},
        {"t": 2.0, "switch": "t1-0-0", "port": 1, "peer": "t0-0-0", "queue": 0, "marked": 0, "trimmed": 0,
         "queue_full": 0, "gray": 0},  # linux: no watch
    ])
    late = data.late_departures()
    assert [(t, where, n) for t, where, n, *_ in late] == [(2.0, "t0-0-0 port 3", 2), (2.0, "t0-0-0 port 4", 5),
                                                             (4.0, "t0-0-0 port 3", 1)]
    assert late[0][3:] == (0.012, 0.004716, 1.0, 200) and late[1][5:] == (2.0, 50) and late[2][6] == 40
    s = fidelity.late_summary(late)
    assert s == {"packets": 8, "ports": 2, "intervals": 3, "worst_s": 0.03, "worst_where": "t0-0-0 port 3",
                 "frame_s": 0.004716}
    assert fidelity.late_summary([]) == {} and RunData(duration_s=1.0).late_departures() == []
    # judged: 2 of 200 (1%), 5 of 50 (10%) and 1 of 40 are not behind; 3 of 12 (25%) is, and 30 of 100
    assert fidelity.faults([], [], late=late) == []
    behind = [(5.0, "t1-0-0 port 2", 3, 0.03, 0.0047, 1.0, 12), (6.5, "t1-0-0 port 2", 30, 0.04, 0.0047, 1.5, 100)]
    found = fidelity.faults([], [], late=[*late, *behind])
    assert [(f.invariant, f.where, f.t0, f.t1, f.worst) for f in found] == [
        (fidelity.LATE, "t1-0-0 port 2", 4.0, 6.5, 0.3)]  # two intervals, merged
    assert not fidelity.faults([], [], late=behind[:1], late_min=4)


def test_the_drain_watch_reads_a_queue_against_its_shapers_schedule():
    """behind_schedule_s (controller/bpf.py): the real queue's bytes at the port's rate less what the
    schedule still owes. At 8 Mb/s a byte is 1 us (1,000,000 ps): 3,000 bytes queued with 1 ms
    scheduled ahead stand 2 ms behind; the same bytes with 4 ms ahead stand 1 ms ahead (a token
    bucket's burst); a schedule already past owes nothing."""
    from mrclab.controller.bpf import behind_schedule_s, ps_per_byte

    ps = ps_per_byte(8.0)
    assert ps == 1_000_000 and ps_per_byte(64.0) == 125_000 and ps_per_byte(0) == 0
    now = 10**12
    assert behind_schedule_s(3000, now + 1_000_000, now, ps) == pytest.approx(0.002)
    assert behind_schedule_s(3000, now + 4_000_000, now, ps) == pytest.approx(-0.001)
    assert behind_schedule_s(3000, now - 5_000_000, now, ps) == pytest.approx(0.003)
    assert behind_schedule_s(0, now - 1, now, ps) == 0
    with pytest.raises(ValueError, match="allowed: at least 0.002 Mb/s"):
        ps_per_byte(0.001)


def test_a_drain_watch_read_is_taken_again_until_its_two_reads_lie_close():
    """read_tight (controller/bpf.py): frames that join between the queue's read and the map's
    lengthen the schedule read; a read whose stamps lie too far apart is taken again, and after
    the tries none is kept."""
    from mrclab.controller.bpf import read_tight

    class Slow:
        def __init__(self, slow: int) -> None:
            self.slow, self.calls = slow, 0

        def backlogs(self) -> dict:
            self.calls += 1
            if self.calls <= self.slow:
                time.sleep(0.003)  # a thread of this process held up between the two reads
            return {(2, 0xFFFFFFFF): (1, 1178)}

    nl = Slow(2)
    got = read_tight(nl, lambda: "maps", tries=5, span_max_s=0.001)
    assert got is not None and got[1:] == ({(2, 0xFFFFFFFF): (1, 1178)}, "maps") and nl.calls == 3
    nl = Slow(9)
    assert read_tight(nl, lambda: "maps", tries=3, span_max_s=0.001) is None and nl.calls == 3


def test_the_qdisc_dump_is_read_in_place_from_rtnetlinks_messages():
    """kernel.qdisc_dump on the bytes the kernel sends (linux/rtnetlink.h): a tcmsg header, then
    TCA_KIND and TCA_STATS2 nesting TCA_STATS_BASIC and TCA_STATS_QUEUE; one message per qdisc, a
    dump ending in NLMSG_DONE; messages of another request are passed over; an error says so."""
    import struct

    from mrclab.emulation import kernel

    def nla(kind: int, body: bytes) -> bytes:
        raw = struct.pack("=HH", 4 + len(body), kind) + body
        return raw + bytes(-len(raw) % 4)

    def qdisc(seq: int, ifindex: int, parent: int, qlen: int, backlog: int) -> bytes:
        stats = nla(1, struct.pack("=QI", 99, 7)) + nla(3, struct.pack("=5I", qlen, backlog, 0, 0, 0))
        body = struct.pack("=BxxxiIII", 0, ifindex, 0x200000, parent, 1) + nla(1, b"bfifo\0") + nla(0x8007, stats)
        return struct.pack("=IHHII", 16 + len(body), 36, 2, seq, 0) + body

    class Sock:
        def __init__(self, replies: list[bytes]) -> None:
            self.replies, self.sent = replies, []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

        def recv(self, n: int) -> bytes:
            return self.replies.pop(0)

    done = struct.pack("=IHHII", 20, 3, 2, 1, 0) + bytes(4)
    sock = Sock([qdisc(0, 9, 0x10020, 50, 50_000) + qdisc(1, 2, 0x10020, 3, 3534),
                 qdisc(1, 2, 0xFFFFFFFF, 0, 0) + done])
    assert kernel.qdisc_dump(sock) == {(2, 0x10020): (3, 3534, 0), (2, 0xFFFFFFFF): (0, 0, 0)}
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", sock.sent[0])
    assert (length, kind, flags & 0x301, seq) == (36, 38, 0x301, 1)  # RTM_GETQDISC, a dump request
    err = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -1) + bytes(16)
    with pytest.raises(OSError, match="refused the qdisc dump"):
        kernel.qdisc_dump(Sock([err]))


def test_a_port_behind_its_schedule_by_more_than_two_frames_voids_the_span_since_its_reading_before():
    """The drain watch on linux's switch ports and every host NIC port (RunData.behind_schedule,
    fidelity.faults' ``behind``): a reading a frame behind (a token bucket waiting for its frame's
    tokens) is recorded and judged nothing; one that fell further behind than the port's reading
    before by more than two frames and the run's starvation limit covers the span since; ahead
    (negative) and unread (empty) readings are no samples, and a lag that only stands where it
    stood (drain lost once, the rate kept since) is judged once, where it grew."""
    d = RunData(duration_s=10.0)
    d.ports = [{"t": 1.0, "switch": "t0-0-0", "port": 3, "behind_us": -500.0, "gap_us": 1000.0},
               {"t": 2.0, "switch": "t0-0-0", "port": 3, "behind_us": 1000.0, "gap_us": 1000.0},
               {"t": 3.0, "switch": "t0-0-0", "port": 3, "behind_us": "", "gap_us": 1000.0},
               {"t": 4.0, "switch": "t0-0-0", "port": 3, "behind_us": 4000.0, "gap_us": 1000.0},
               {"t": 5.0, "switch": "t0-0-0", "port": 3, "behind_us": 4100.0, "gap_us": 1000.0},
               {"t": 2.0, "switch": "t1-0-0", "port": 1}]  # bmv2's rows and lossless ports have no reading
    d.nic_ports = [{"t": 1.5, "host": "h0", "port": "h0-eth1", "behind_us": 0.0, "gap_us": 1000.0},
                   {"t": 2.5, "host": "h0", "port": "h0-eth1", "behind_us": 2500.0, "gap_us": 1000.0}]
    behind, readings = d.behind_schedule()
    assert readings == 6
    assert [(x.t, x.place, x.behind_s, x.span_s, round(x.grew_s, 6)) for x in behind] == [
        (2.0, "t0-0-0 port 3", 0.001, 1.0, 0.001), (2.5, "h0 NIC port h0-eth1", 0.0025, 1.0, 0.0025),
        (4.0, "t0-0-0 port 3", 0.004, 2.0, 0.003), (5.0, "t0-0-0 port 3", 0.0041, 1.0, 0.0001)]
    # the run's starvation limit is the floor: past 3 ms none of them; at the default 0.5 ms, two frames
    assert fidelity.faults([], [], behind=behind, sched_delay_max_s=0.0035) == []
    assert fidelity.faults([], [], behind=behind, behind_min_s=0.0035) == []
    assert fidelity.faults([], [], behind=behind) == fidelity.faults([], [], behind=behind, behind_min_s=0.0) != []
    found = fidelity.faults([], [], behind=behind[:2], behind_min_s=0.0)  # the NIC port's alone: [1.5, 2.5]
    assert [(f.invariant, f.where, f.t0, f.t1, f.worst, f.limit) for f in found] == [
        (fidelity.BEHIND, "h0 NIC port h0-eth1", 1.5, 2.5, 0.0025, 0.002)]
    found = fidelity.faults([], [], behind=behind, behind_min_s=0.0)  # the switch port's [2, 4] overlaps it
    assert [(f.where, f.t0, f.t1, f.worst) for f in found] == [("h0 NIC port h0-eth1, t0-0-0 port 3", 1.5, 4.0, 0.003)]
    # the switch port standing 4.1 ms behind at 5 s grew 0.1 ms since 4 s: nothing new after 4 s
    assert max(f.t1 for f in found) == 4.0
    assert fidelity.faults([], [], behind=behind, behind_frames_max=3.0, behind_min_s=0.0) == []
    s = fidelity.behind_summary(behind, readings)
    assert s == {"readings": 6, "behind": 4, "ports": 2, "worst_s": 0.0041, "worst_where": "t0-0-0 port 3",
                 "frame_s": 0.001}
    assert fidelity.behind_summary([], 0) == {} and fidelity.behind_summary([], 7) == {"readings": 7, "behind": 0}


def test_a_nic_port_whose_tbf_refused_frames_stood_behind_by_its_slack_and_one_frame_a_refusal():
    """A NIC port's reading can stand at most the tbf's slack (two frames) behind: the program's
    schedule keeps draining while the real queue is held, admits what comes, and the tbf, full,
    refuses it; those frames stay in the schedule (a NIC held 60 ms read 2 ms behind and refused
    45 frames). So each refusal since the port's reading before counts a frame behind, beside the
    slack: 10 refused at 1.2 ms frames read 14.1 ms behind, a fault over the span since, where the
    reading alone (1.0 ms) judged nothing."""
    from mrclab.controller.bpf import NIC_SLACK_FRAMES

    d = RunData(duration_s=10.0)
    gap_us = 1178.0
    d.nic_ports = [{"t": 1.0, "host": "h0", "port": "h0-eth0", "backlog": 1178, "behind_us": -500.0,
                    "refused": 3, "gap_us": gap_us},
                   {"t": 2.0, "host": "h0", "port": "h0-eth0", "backlog": 20000, "behind_us": 1000.0,
                    "refused": 13, "gap_us": gap_us},
                   {"t": 3.0, "host": "h0", "port": "h0-eth0", "backlog": 0, "behind_us": 0.0,
                    "refused": 13, "gap_us": gap_us}]
    behind, readings = d.behind_schedule()
    assert readings == 3
    assert [(b.t, round(b.behind_s, 6), round(b.grew_s, 6)) for b in behind] == \
        [(1.0, round((NIC_SLACK_FRAMES + 3) * gap_us / 1e6, 6), round((NIC_SLACK_FRAMES + 3) * gap_us / 1e6, 6)),
         (2.0, round((NIC_SLACK_FRAMES + 10) * gap_us / 1e6, 6), round(7 * gap_us / 1e6, 6))]
    found = fidelity.faults([], [], behind=behind)
    assert [(f.t0, f.t1) for f in found] == [(0.0, 2.0)]
    for r in d.nic_ports:  # no refusal: the reading alone, a frame behind, judges nothing
        r["refused"] = 0
    assert not fidelity.faults([], [], behind=d.behind_schedule()[0])


def test_bench_fidelitys_steal_bins_read_goodput_per_second_against_the_cpu_the_hypervisor_took(tmp_path, monkeypatch):
    """Seconds of steady traffic binned by the machine's stolen share: a second where the
    hypervisor took 0.3 of two CPUs sits in 0.3-0.4 with its goodput over the run's baseline (the
    median before the first scripted fault); seconds beside that fault are left out."""
    import psutil

    from mrclab.bench import fidelity as bench_fidelity

    monkeypatch.setattr(psutil, "cpu_count", lambda *a, **k: 2)
    f = tmp_path / "run"
    f.mkdir()
    rows = ["t_s,goodput_mbps"] + [f"{t / 10:.1f},{40.0 if 120 <= t < 130 else 50.0}" for t in range(0, 200)]
    (f / "timeseries.csv").write_text("\n".join(rows) + "\n")
    stolen = ["t_s,invariant,where,value,limit,interval_s"] + \
        [f"{12 + k / 4:.2f},share of the interval the hypervisor took the CPU,cpu {c},0.300,,0.250"
         for k in range(1, 5) for c in (0, 1)]
    (f / "fidelity.csv").write_text("\n".join(stolen) + "\n")
    (f / "events.csv").write_text("t,kind\n8.0,fault\n")
    bins = bench_fidelity.steal_bins([f])
    assert [(b["lo"], b["seconds"]) for b in bins] == [(0.0, 15), (0.3, 1)], bins  # 1-19 s less 7-9 (beside the fault)
    assert bins[1]["median"] == pytest.approx(0.8) and bins[0]["least"] == pytest.approx(1.0)
    assert "| 0.3-0.4 | 1 | 0.800 |" in bench_fidelity.steal_table("q", "linux", bins, markdown=True)
