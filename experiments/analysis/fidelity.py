"""Did the emulator keep up? The invariants of the emulation, watched during every run.

An emulated result counts only while the machine that runs it keeps up (Mininet-HiFi: Handigol et
al., "Reproducible Network Experiments Using Container-Based Emulation", CoNEXT 2012, which
monitors the emulation's own invariants during each run and discards a run that broke them).
mrclab watches seven and records an eighth, each sampled into the results folder (``fidelity.csv``):

* **CPU starvation** (experiments/run/monitor.py): every endpoint's, every BMv2 switch's and
  this machine's softirq threads' (``ksoftirqd/N``: the kernel's forwarding, a linux switch's and
  every veth hop's, once it outgrows the moment it was raised in) time runnable but not running
  (a switch on another server read there, by its server's agent, one round trip per server and
  sample), from the scheduler's own account (``/proc/PID/task/*/schedstat``:
  run-queue delay in ns and the number of times it ran, summed over the process's threads; psutil
  does not read them). In each sample interval the *scheduling delay* is run-queue delay per run:
  how long, on average, the process waited for a CPU each time it became runnable. A process
  starved when that delay was over :data:`SCHED_DELAY_MAX_S` while it waited at least
  :data:`MIN_WAIT` of the interval: its packets left, or were forwarded, that much late each time.
  (A share of waiting alone says nothing here: ten endpoints that each wake a thousand times a
  second share two cores with short waits that no packet notices.)
* **Late timers** (the endpoints' telemetry): the longest an endpoint's loop waited for a CPU
  between the starts of two of its turns, in each telemetry interval (``loop_gap_max_s`` of its
  samples; the kernel's run-queue delay of the loop's thread, read at every turn; in a process
  serving several hosts, a host also waits behind the others' turns, where on separate machines it
  would have a CPU of its own: traffic/endpoint.py ``run_group`` counts that too, per host). That is
  time the machine took: a host's own work (a long turn) and the sleeps it chose are the
  transport's cost, which shows in its results and FAILs where it hurts, and are never counted here. Its
  timers, pacing and retransmission deadlines fire that much later than they would have; later than
  the run's retransmission timer floor (:func:`loop_gap_limit`, at least :data:`LOOP_GAP_MIN_S`)
  late enough to change what the transport does: a timeout that should not have fired, or one
  that fired a whole timer late.

* **Held packets** (the senders' events): a data packet the retransmission timer gave up on that
  arrived after all, the SACK of its arrival echoing it on the EV it timed out on (a *spurious
  timeout*, traffic/sender.py). Its time on its way is measured from stamps: the sender stamps
  every data packet as it hands it to its NIC port, the receiver echoes that arrival's one-way time
  in the SACK (protocol/headers.py ``STAMP_HZ``), so neither the receiver's SACK delay nor the
  reverse path nor another copy of the same PSN counts. Longer than the model allows it
  (:meth:`HeldLimits.one_way`: the NIC queue it met, switch queues, serialisation, propagation),
  it waited outside the model: in a switch's threads, a veth or a qdisc, where neither the CPU
  samples (a thread held by another's lock is not runnable) nor the loop gaps see it. Its fault
  covers its way there. A hold shorter than the timer goes unseen: it changed no verdict's
  mechanism. (The arrival is when the receiving endpoint read it: a receiver busy with its own
  work reads late, which a kernel receive stamp would leave out.)

* **Packets lost outside the model** (experiments/run/monitor.py): packets this machine's kernel
  dropped because a CPU's receive backlog was full (``/proc/net/softnet_stat``; the backlog holds
  ``net.core.netdev_max_backlog`` packets). Every veth hands what it sends to that backlog, and
  when softirq work falls that far behind (a CPU taken from it long enough) packets between two
  emulated ports vanish on every plane at once, a loss no switch program counted: a sender reads it
  as path loss and may retire healthy EVs. Any such drop in a sample interval is a fault over that
  interval (a loss is found up to a retransmission timer later: run-long counts leave out a
  retirement whose packet was sent before the fault ended, ``retire_cause_s``,
  experiments/analysis/metrics.py). Read on this machine
  only: a server's kernel is not read yet.

* **CPU stolen** (experiments/run/monitor.py): the share of each sample interval the hypervisor
  took each of this machine's CPUs (steal time, ``/proc/stat``, 10 ms ticks), in ``fidelity.csv``.
  Everything on a stolen CPU stands still, and the guest's scheduler counts none of it as waiting,
  so the CPU samples above cannot see it, nor the drain watch (a sender that could not run leaves
  its NIC queue empty, not behind). Where the hypervisor took at least :data:`STEAL_SHARE_MAX` of
  the machine (every CPU's steal over the CPUs) over the :data:`STEAL_SPAN_S` before a sample, that
  span is a fault: the lab was denied CPU it was entitled to. It delays and slows; it loses
  nothing the held-packets and backlog watches would not see, so it ``retires`` nothing.

* **Paths reordered** (the receivers' samples): a path is one FIFO (an EV's packets take one
  route, every queue on it first in, first out), so a first transmission that arrives whole behind
  a later first transmission of its EV was reordered by the machine, never by the model (a trimmed
  header overtakes by design, and is not counted). The transport reads that gap as untrimmed loss
  and retires a healthy EV (a false retirement that is the emulator's). Each host's NIC-to-switch
  veth hands frames to the backlog of the CPU that sends them, so frames of one path could take two
  CPUs' backlogs and overtake when one CPU's softirq was held up; the fabric now steers each
  interface's received frames to one CPU (emulation/kernel.py ``steer_rx_script``), and this watch
  says whether a path still reordered. Any such packet in a telemetry interval is a fault over it.

A sample interval where an invariant broke is a :class:`FidelityFault`; overlapping faults of one
invariant merge. A verdict whose window overlaps a fault reads ``void (<invariant>, <where>,
<how long>)``: neither pass nor FAIL (experiments/run/runner.py), and a run with a void verdict and no
failed one exits 3, "this machine could not".

* **Ports behind their schedule** (bmv2's switch ports): the packets that left a port more than a
  frame time after its shaper's schedule, counted by the P4 program (p4src/mrclab.p4 ``q_late``
  beside ``q_sent``: BMv2's queue schedules each departure as the packet joins; the program keeps
  that schedule from the enqueue stamp) and read with the port samples, about a second apart
  (RunData.late_departures, :func:`late_summary`). A port whose late packets were at least
  :data:`LATE_MIN` and more than :data:`LATE_SHARE_MAX` of what it sent in a sample interval fell
  behind: its switch's threads did not keep its rate, whatever the CPU samples' averages say (a
  cgroup quota on the quickstart's switches moved its verdicts while their scheduling delay per
  run stayed under the run's limit).

* **Queues behind their shaper's schedule** (linux's switch ports and every host NIC port):
  the tc eBPF program keeps each port's schedule beside its real shaper, the runner reads the
  real queue (netlink) and the schedule together about once a second (RunData.behind_schedule,
  :func:`behind_summary`); a reading more than :data:`BEHIND_FRAMES_MAX` frames behind, and more
  than the run's starvation limit, means the kernel did not drain the port at its rate
  (controller/bpf.py ``behind_schedule_s``).

Not watched yet (named so nobody reads the silence as a pass): a hold shorter than the
retransmission timer, and the other packets
lost outside the model (a switch port's real qdisc overflowing past the eBPF program's count,
BMv2's input queues, a server's kernel backlog).

Thresholds: :data:`SCHED_DELAY_MAX_S` (:func:`sched_delay_limit` on a slow fabric) and
:func:`loop_gap_limit`; docs/fidelity.md says where each sits and why, and docs/benchmarks.md has
the ``mrclab bench fidelity`` tables that set them.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple
from pathlib import Path

from mrclab.topologies.addressing import ev_plane, ev_t1

#: A process starved: it waited longer than this for a CPU each time it became runnable (s) ...
#: ``mrclab bench fidelity`` (docs/benchmarks.md, 2026-11-27) puts it between what untouched
#: endpoints wait (at worst 0.13-0.20 ms in the quickstart on linux, 0.31-0.46 ms in incast on
#: bmv2) and the least starvation that moved a verdict out of its spread (0.61 ms: the quickstart's
#: capacity on linux; 0.56 ms: incast's victim on bmv2, which FAILed its bound at 0.94 ms). A limit
#: of a quarter of a host port's frame (2.4 ms for incast's 1 Mb/s ports) stayed silent there.
SCHED_DELAY_MAX_S = 0.0005
#: ... or, on a slow fabric, longer than this share of one frame's time on its fastest link, if that
#: is more (:func:`sched_delay_limit`). Mininet-HiFi (CoNEXT 2012) judges an emulation by whether
#: packets leave within a packet's transmission time of when the model says; a packet wakes about
#: five threads a BMv2 hop (receive, ingress, egress, transmit, the next switch's receive), so
#: waits of a twentieth of a frame each keep a hop within a quarter of a frame.
SCHED_DELAY_FRAME_SHARE = 0.05
#: ... or, on paths with a propagation delay, longer than this share of a path's propagation round
#: trip (twice ``path_delay_ms``), if that is more (:func:`sched_delay_limit`). A wake-up late by d
#: reads as d of queueing in an RTT sample, and NSCC acts on queueing over 0.75 base RTTs
#: (traffic/cc.py), the timer on deviations of a quarter RTT: what moves a verdict scales with the
#: RTT, and the 0.5 ms floor was measured on incast, whose paths have no delay. ``mrclab bench
#: fidelity`` on the quickstart (docs/benchmarks.md, 2026-11-28): untouched endpoints waited up to
#: 0.037 of the propagation round trip on linux (0.37 ms of 10 ms) and 0.064 on bmv2 (1.91 ms of
#: 30 ms, beside eight BMv2 switches on two cores, where 0.5 ms voided the main job 2 runs in 5 on an
#: idle machine); the least starvation that moved a verdict toward its bound was 0.30 of it on linux
#: (2.99 ms: retire_time_rtts; FAIL at 4.64 ms) and 0.12 on bmv2 (3.59 ms: recovery_time_s).
SCHED_DELAY_RTT_SHARE = 0.1
#: ... while it waited at least this share of the sample interval (thread-seconds per second).
MIN_WAIT = 0.3
#: The least loop gap that counts as late timers (s), whatever the run's timer floor.
LOOP_GAP_MIN_S = 0.025


def sched_delay_limit(frame_s: float, propagation_rtt_s: float = 0.0) -> float:
    """The scheduling delay per run (s) over which a process starved, in a run whose frames take
    ``frame_s`` on its fastest link (0: unshaped) and whose paths' propagation round trip is
    ``propagation_rtt_s`` (twice the scenario's ``path_delay_ms``; 0: none): the most of
    :data:`SCHED_DELAY_MAX_S`, :data:`SCHED_DELAY_FRAME_SHARE` of a frame (slower than 0.94 Mb/s
    with the default 1 KiB payload; the shipped scenarios all run faster) and
    :data:`SCHED_DELAY_RTT_SHARE` of the propagation round trip (the quickstart on bmv2, 15 ms a
    way: 3 ms). At 0.25 Mb/s a 4 KiB frame
    takes 136 ms and a wait of 2 ms is 1.5% of it, where the fixed 0.5 ms voided every verdict of
    the 64-switch fabric on bmv2 (`mrclab bench scale`, docs/benchmarks.md)."""
    return max(SCHED_DELAY_MAX_S, SCHED_DELAY_FRAME_SHARE * frame_s, SCHED_DELAY_RTT_SHARE * propagation_rtt_s)


def loop_gap_limit(min_rto_s: float) -> float:
    """The loop gap (s) over which an endpoint's timers fired late for a run whose retransmission
    timer floor is ``min_rto_s``: the floor itself, at least :data:`LOOP_GAP_MIN_S`."""
    return max(LOOP_GAP_MIN_S, min_rto_s)
#: The least age (s) at arrival that makes a timed-out packet a held one, whatever the queues allow
#: (traffic/settings.py's default timer floor).
HELD_MIN_S = 0.02


@dataclass(frozen=True)
class HeldLimits:
    """What the model lets a data packet's round trip take, so that an older one was held outside
    it. Fields: ``queue_bound_s``, the longest a path's switch queues hold a data packet
    (controller/queues.py ``path_queue_bound_s``); ``path_delay_s``, the propagation one way (the
    spec's ``path_delay_ms``); ``nic_queue_s``, a full host NIC queue (emulation/network.py
    ``nic_queue_s``, the tbf of a host port); ``frame_s``, one data frame's time on a host port;
    ``data_senders``, the hosts that send data (None: any may)."""

    queue_bound_s: float = 0.0
    path_delay_s: float = 0.0
    nic_queue_s: float = 0.0
    frame_s: float = 0.0
    data_senders: frozenset[str] | None = None

    def limit(self, peer: str | None = None, nic_wait_s: float | None = None) -> float:
        """The age at arrival (s) past which a packet to host ``peer`` that waited ``nic_wait_s``
        in its sender's NIC queue (the sender's model of it, traffic/nicqueue.py) was held: the sum of

        * twice the switch queues' bound, the runner's rule for the timer's floor (the second half
          covers the hops' serialisation and the reverse path, whose packets are an eighth of a
          data packet and queue above it), at least :data:`HELD_MIN_S`;
        * the propagation both ways;
        * the sender's NIC: the wait the packet met there and its own frame time; a full queue
          where the wait is unknown (the port rate was not);
        * the receiver's NIC, where its SACK waits: a full queue when the receiver sends data too
          (one FIFO, no priorities), else one frame (SACKs are an eighth of a data packet and
          come at most one per two arrivals, so they queue behind little but each other)."""
        sender = self.nic_queue_s if nic_wait_s is None else nic_wait_s + self.frame_s
        receiver = self.nic_queue_s if self.data_senders is None or peer in self.data_senders else self.frame_s
        return max(HELD_MIN_S, 2 * self.queue_bound_s) + 2 * self.path_delay_s + sender + receiver

    def one_way(self, nic_wait_s: float | None = None) -> float:
        """The time (s) past which a data packet that waited ``nic_wait_s`` in its sender's NIC queue
        was held on its way from its send stamp to its receiving endpoint: the wait and its frame
        time (a full queue where the wait is unknown), the path's switch queues (their bound), a
        frame's time on each of the :data:`HOPS` links a path crosses (the host port's: no fabric
        link is slower), and the propagation one way; at least :data:`HELD_MIN_S`."""
        sender = self.nic_queue_s if nic_wait_s is None else nic_wait_s + self.frame_s
        return max(HELD_MIN_S, sender + self.queue_bound_s + HOPS * self.frame_s + self.path_delay_s)


#: Links a data packet crosses on the longest path (host -> T0 -> T1 -> T0 -> host).
HOPS = 4


def held_packets(events: list[dict], limits: HeldLimits) -> list[tuple[float, str, float, float]]:
    """``(t, path, time s, its limit s)`` of every spurious timeout among a run's ``events`` (the
    time it covers ends at ``t``;
    runner's event dicts: ``kind``, ``t``, ``host``, ``peer``, ``ev``, ``age_s``, ``nic_wait_s``,
    ``wire_s``): its one-way time from its send stamp to its receiving endpoint (``wire_s``, as the
    SACK echoed it) against :meth:`HeldLimits.one_way`, or where it had no stamp its age when its
    SACK came back against the round trip's :meth:`HeldLimits.limit`. The one-way time leaves out
    the receiver's SACK delay and the reverse path, and is that of the very copy the SACK echoed. The
    path reads ``h0->h2 plane 1 T1 0``."""
    out = []
    for e in events:
        if e.get("kind") != "spurious_timeout":
            continue
        path = f"{e.get('host', '?')}->{e.get('peer', '?')} plane {ev_plane(e['ev'])} T1 {ev_t1(e['ev'])}"
        if e.get("wire_s") is not None:  # t: when it reached its receiver (sent at t - age_s)
            out.append((round(e["t"] - e["age_s"] + e["wire_s"], 6), path, e["wire_s"],
                        limits.one_way(e.get("nic_wait_s"))))
        else:
            out.append((e["t"], path, e["age_s"], limits.limit(e.get("peer"), e.get("nic_wait_s"))))
    return out


#: How often the monitor samples the processes (s).
PERIOD_S = 0.25


#: Places a fault's description names before "and N more" (a 64-switch fabric's starved sample can
#: name 25 switches: a verdict cell, and the run's last line, stay readable).
PLACES_SHOWN = 3


def places(where: str, shown: int = PLACES_SHOWN) -> str:
    """``where`` (places joined by ", ") with at most ``shown`` named: ``a, b, c and 22 more``."""
    parts = where.split(", ")
    return where if len(parts) <= shown else f"{', '.join(parts[:shown])} and {len(parts) - shown} more"


def void_reason(broke: list[FidelityFault]) -> str | None:
    """What a void verdict says of the faults that overlapped its window: the longest described,
    then how many more (fidelity.csv and metrics.json have them all); None for none."""
    if not broke:
        return None
    worst = max(broke, key=lambda f: f.t1 - f.t0)
    more = len(broke) - 1
    return worst.describe() + (f"; and {more} more fault{'s' if more > 1 else ''}" if more else "")


@dataclass(frozen=True)
class FidelityFault:
    """An interval [t0, t1] (s from t = 0) where ``invariant`` broke at ``where``; ``worst`` is the
    worst value seen against ``limit`` (same unit)."""

    invariant: str
    where: str
    t0: float
    t1: float
    worst: float
    limit: float
    #: ``worst`` and ``limit``'s unit as :meth:`describe` writes it after the number
    unit: str = "s"
    #: whether the fault could have lost a packet, or held one past its retransmission timer, so
    #: that an EV retired inside it may be the machine's doing (:func:`faults` ``timer_s``): a delay
    #: shorter than the timer's floor times nothing out, and reorders nothing on a FIFO path, so a
    #: retirement beside it is the transport's (or the scenario's failure's)
    retires: bool = True

    def describe(self) -> str:
        """``<invariant>, <where>, <how long>`` as a void verdict says it (at most
        :data:`PLACES_SHOWN` places named; metrics.json's ``where`` has them all)."""
        unit = self.unit
        return (f"{self.invariant}, {places(self.where)}, {self.t1 - self.t0:.2f} s at {self.t0:.1f}-{self.t1:.1f} s "
                f"(worst {self.worst:.3g}{unit} against {self.limit:g}{unit})")

    def as_dict(self) -> dict:
        """The fault as metrics.json records it (times rounded to ms)."""
        return {"invariant": self.invariant, "where": self.where, "t0": round(self.t0, 3), "t1": round(self.t1, 3),
                "worst": self.worst, "limit": self.limit, "retires": self.retires}


#: The invariant of CPU time the hypervisor took from this machine (steal).
STOLEN = "CPU stolen by the hypervisor"
#: A span where the hypervisor took at least this share of the machine's CPU time is a fault. The
#: quickstart on linux (10 runs and 3 more, 2026-12-03, docs/benchmarks.md "CPU stolen"): seconds
#: with under 0.1 of the machine stolen kept 0.998 of the baseline's goodput (median; tenth
#: percentile 0.937), 0.1-0.2 kept 0.977 (0.895), 0.2-0.3 kept 0.925 (0.841) and 0.3-0.4 kept 0.80:
#: the verdict's reading moves out of its run-to-run spread from 0.2.
STEAL_SHARE_MAX = 0.2
#: ... over this span (s): a second, the drain watch's reading interval; a single 0.25 s sample is
#: one 10-40 ms burst (this workplace's VMs lose a vCPU so about every second) read large.
STEAL_SPAN_S = 1.0


def stolen_spans(stolen: Sequence[tuple[float, str, float, float]], cpus: int,
                 span_s: float = STEAL_SPAN_S, share_max: float = STEAL_SHARE_MAX) -> list[tuple[float, float, float]]:
    """The spans ``(t0, t1, share)`` (s from t = 0) where the hypervisor took at least ``share_max``
    of the machine's CPU time over the ``span_s`` before a sample: from the monitor's ``stolen``
    ``(t, "cpu N", share of the interval before t, interval s)`` (only intervals with steal), over
    ``cpus`` CPUs. Raises ValueError for ``cpus`` < 1."""
    if cpus < 1:
        raise ValueError(f"cpus must be at least 1, got {cpus}")
    rows = sorted((t - span, t, share * span) for t, _, share, span in stolen)  # (from, to, CPU-seconds)
    out = []
    for t in sorted({r[1] for r in rows}):
        lo = t - span_s
        took = sum(cpu_s * max(0.0, min(hi, t) - max(a, lo)) / (hi - a)
                   for a, hi, cpu_s in rows if hi > a and a < t and hi > lo)
        share = took / (cpus * span_s)
        if share >= share_max:
            out.append((lo, t, round(share, 3)))
    return out


#: The invariant of packets lost outside the model, and where the kernel's backlog drops are.
LOST = "packets lost outside the model"
KERNEL_BACKLOG = "the kernel's receive backlog (softnet)"
#: The invariant of a path that did not keep its packets in order.
REORDERED = "paths reordered"
class LateInterval(NamedTuple):
    """One switch port's sample interval with late departures (the drain watch, bmv2;
    RunData.late_departures)."""

    t: float  #: the sample's time (s from t = 0); the interval ends here
    place: str  #: "<switch> port <n>"
    late: int  #: packets that left more than a frame time after their shaper's schedule
    most_s: float  #: the most any left after it (s)
    frame_s: float  #: the port's frame time at its rate (s)
    span_s: float  #: the interval (s)
    sent: int  #: low-priority packets that left in it


#: The invariant of a switch port that fell behind its shaper's schedule (the drain watch, bmv2).
LATE = "ports behind their schedule"
#: A switch port fell behind its schedule in a sample interval when more than this share of the
#: low-priority packets it sent left more than a frame time after their schedule ...
#: ``mrclab bench fidelity --dataplane bmv2 --target switch`` (docs/benchmarks.md, 2026-11-29):
#: untouched, no port's share passed 0.11 in any interval (quickstart; incast: 0.01); the first
#: starvation level, the one where verdicts first moved out of their spread, read 0.17 (incast,
#: whose CPU samples voided it there) and 0.62 (quickstart, whose CPU samples stayed silent up to
#: a 2 ms wait while its capacity, recovery and retirements moved).
LATE_SHARE_MAX = 0.2
#: ... and they were at least this many (one late packet of six sent is noise, not a drain).
LATE_MIN = 3
#: Invariants whose worst is a count of packets, which add up where faults merge.
COUNTED = (LOST, REORDERED)


class BehindSample(NamedTuple):
    """One port's drain-watch reading that stood behind its shaper's schedule (a linux switch
    port's data queue, or a host NIC port's on either data plane; RunData.behind_schedule)."""

    t: float  #: the sample's time (s from t = 0)
    place: str  #: "<switch> port <n>" or "<host> NIC port <interface>"
    behind_s: float  #: how far its real queue stood behind the schedule (s)
    frame_s: float  #: a full frame's time at the port's rate (s)
    span_s: float  #: the time since the port's sample before (s)
    #: how much further behind it stood than at its reading before (s; from 0 where that one was
    #: on or ahead of the schedule): the drain the port did not do in the span
    grew_s: float = 0.0


#: The invariant of a port whose real queue stood behind its shaper's schedule (the drain watch on
#: linux's switch ports and every host NIC port: controller/bpf.py behind_schedule_s).
BEHIND = "queues behind their shaper's schedule"
#: A port's queue fell behind when a reading stood more than this many of its frames further
#: behind the schedule than the reading before (a port that lost some drain once and kept its rate
#: since stands behind by the same amount for as long as its queue holds: the linux quickstart's
#: NIC ports read 1.5-3.0 ms behind for 4 s, two steps of 2.0 and 1.4 ms; judged by its reading it
#: voided a window 6 s long for them), and more than the run's starvation limit (:func:`sched_delay_limit`: the wait per
#: wake-up the monitor allows a process, allowed the kernel's forwarding too). A token bucket
#: that keeps its rate is about one frame behind it at most (the frame whose tokens it waits for;
#: controller/bpf.py behind_schedule_s), plus its timer's latency, and a read errs towards ahead
#: (frames that join between the queue's read and the map's lengthen the schedule read). Measured
#: (docs/benchmarks.md): the linux quickstart untouched, and beside two busy loops at normal
#: priority that voided it for its endpoints' CPU, read 0 frames behind at most (1,152 switch and
#: 368 NIC port readings a run; the NIC ports holding a backlog 0.4-4.3 frames ahead), a compressed
#: run 1.02 frames once; a 16 Mb/s NIC port blasted at 1.5 times its rate up to 1.36 frames (0.80
#: ms), the same port draining at half its rate 2 frames and more within a second.
BEHIND_FRAMES_MAX = 2.0


def faults(cpu: list[tuple[float, str, float, float, float]], gaps: list[tuple[float, str, float]], *,
           period_s: float = PERIOD_S, gap_period_s: float = 0.1, sched_delay_max_s: float = SCHED_DELAY_MAX_S,
           min_wait: float = MIN_WAIT, loop_gap_max_s: float = LOOP_GAP_MIN_S,
           held: Sequence[tuple[float, str, float, float]] = (),
           lost: Sequence[tuple[float, int, float]] = (),
           reordered: Sequence[tuple[float, str, int]] = (),
           late: Sequence[LateInterval] = (),
           late_share_max: float = LATE_SHARE_MAX, late_min: int = LATE_MIN,
           behind: Sequence[BehindSample] = (), behind_frames_max: float = BEHIND_FRAMES_MAX,
           behind_min_s: float | None = None, timer_s: float = 0.0,
           stolen: Sequence[tuple[float, str, float, float]] = (), cpus: int = 0) -> list[FidelityFault]:
    """The fidelity faults of a run: from the monitor's CPU samples ``(t, label, scheduling delay
    per run (s), waited share of the interval, interval s)``, each covering the interval before
    ``t`` (a starved sample's fault is the whole of it: the monitor cannot say when in it the
    process waited), the endpoints' loop gaps ``(t, host, gap s)``,
    each covering the ``gap_period_s`` before ``t``, the held packets (:func:`held_packets`:
    ``(t, path, age s, limit s)``), those older than their limit each covering its round trip, and
    the kernel's backlog drops ``(t, packets, interval s)`` (the monitor's ``kernel_drops``), each
    covering its interval, and the paths that reordered ``(t, receiving host, packets)`` (the
    endpoints' samples: RunData.reordered), each covering the ``gap_period_s`` before ``t``, and the
    drain watch's switch ports (RunData.late_departures, :class:`LateInterval`): a port whose
    packets that left more than a frame time after their shaper's schedule were at least
    ``late_min`` and more than ``late_share_max`` of what it sent in a sample interval covers that
    interval (``worst``: that share), and the drain watch's readings that stood behind their
    shaper's schedule (RunData.behind_schedule, :class:`BehindSample`): one that fell further behind
    than its reading before by more than ``behind_frames_max`` of the port's frames and more than
    ``behind_min_s`` (None: the starvation limit ``sched_delay_max_s``) covers the span since.
    Intervals of one invariant that overlap, or
    are less than half a sample period apart (the samples' own jitter), merge (their ``where``
    lists every place).

    Each fault says whether it ``retires``: could have lost a packet or held one past its
    retransmission timer, whose floor is ``timer_s`` (the run's: :func:`loop_gap_limit`; 0: every
    fault could). Packets lost outside the model, paths reordered, held packets and late timers
    could, by what they are; so could a starved switch or softirq thread (a forwarder held back
    can overflow queues no watch counts: BMv2's input buffers); a drain watch's port only where
    the delay it measured (how far its queue stood behind, or the latest departure) reached
    ``timer_s``; an endpoint's starvation never (its timers are the late-timers watch's, and what
    it read late the held-packets watch times). A port 5 ms behind on a path whose timer waits 28
    ms past its round trip times nothing out: t0-down with port_state off, whose EVs through the
    dead T0 time out as that claim says they must, read 0 retirements where such a reading beside
    the fault's moment had them left out."""
    raw: list[FidelityFault] = []
    for t, label, delay, waited, span in cpu:
        if delay > sched_delay_max_s and waited >= min_wait:
            raw.append(FidelityFault("CPU starvation", label, t - max(span, period_s), t, delay, sched_delay_max_s,
                                     retires=timer_s <= 0 or not label.startswith("endpoint ")))
    for t, host, gap in gaps:
        if gap > loop_gap_max_s:
            raw.append(FidelityFault("late timers", f"endpoint {host}", t - max(gap, gap_period_s), t, gap,
                                     loop_gap_max_s))
    for t, path, age, limit in held:
        if age > limit:
            raw.append(FidelityFault("held packets", path, t - age, t, age, limit))
    for t, n, span in lost:
        if n > 0:
            raw.append(FidelityFault(LOST, KERNEL_BACKLOG, t - max(span, period_s), t, n, 0, " packets"))
    for t, host, n in reordered:
        if n > 0:
            raw.append(FidelityFault(REORDERED, f"paths to {host}", t - gap_period_s, t, n, 0, " packets"))
    for x in map(LateInterval._make, late):  # plain tuples too
        share = x.late / max(1, x.sent)
        if x.late >= late_min and share > late_share_max:
            raw.append(FidelityFault(LATE, x.place, x.t - x.span_s, x.t, round(share, 3), late_share_max, "",
                                     retires=x.most_s >= timer_s))
    floor = sched_delay_max_s if behind_min_s is None else behind_min_s
    for b in map(BehindSample._make, behind):
        limit = max(behind_frames_max * b.frame_s, floor)
        if b.grew_s > limit:
            raw.append(FidelityFault(BEHIND, b.place, b.t - b.span_s, b.t, round(b.grew_s, 6), round(limit, 6),
                                     retires=b.behind_s >= timer_s))
    if cpus > 0:
        for lo, hi, share in stolen_spans(stolen, cpus):
            raw.append(FidelityFault(STOLEN, "this machine", lo, hi, share, STEAL_SHARE_MAX, " of its CPU time",
                                     retires=False))
    merged: list[FidelityFault] = []
    for f in sorted(raw, key=lambda f: (f.invariant, f.t0)):
        last = merged[-1] if merged else None
        if last is not None and last.invariant == f.invariant and f.t0 <= last.t1 + period_s / 2:
            wheres = last.where.split(", ")
            where = ", ".join(wheres + ([f.where] if f.where not in wheres else []))
            worst = last.worst + f.worst if f.invariant in COUNTED else max(last.worst, f.worst)  # packets add up
            merged[-1] = FidelityFault(f.invariant, where, last.t0, max(last.t1, f.t1), worst, f.limit, f.unit,
                                       last.retires or f.retires)
        else:
            merged.append(f)
    return sorted(merged, key=lambda f: f.t0)


def late_summary(late: Sequence[LateInterval]) -> dict:
    """The drain watch over a run, as metrics.json records it (every late departure, whether or
    not a port's share passed :data:`LATE_SHARE_MAX`): from
    RunData.late_departures' :class:`LateInterval` rows, the
    packets that left a switch port more than a frame time after their shaper's schedule, the
    ports they left, the sample intervals with any, and the most one left late (s) with its
    port's frame time (s); {} where nothing was late (or the data plane has no watch: linux)."""
    if not late:
        return {}
    late = [LateInterval._make(x) for x in late]
    worst = max(late, key=lambda x: x.most_s)
    return {"packets": sum(x.late for x in late), "ports": len({x.place for x in late}), "intervals": len(late),
            "worst_s": round(worst.most_s, 6), "worst_where": worst.place, "frame_s": round(worst.frame_s, 6)}


def behind_limit(frame_s: float, sched_delay_max_s: float = SCHED_DELAY_MAX_S) -> float:
    """How far (s) a port's queue may stand behind its shaper's schedule before it fell behind:
    :data:`BEHIND_FRAMES_MAX` of its frames, at least the run's starvation limit."""
    return max(BEHIND_FRAMES_MAX * frame_s, sched_delay_max_s)


def behind_summary(behind: Sequence[BehindSample], readings: int) -> dict:
    """The drain watch on linux's switch ports and the host NIC ports over a run, as metrics.json
    records it: ``readings`` (port readings taken), those that stood behind the schedule at all, the
    ports they were on, and the worst (s) with its port's frame time (s); {} with no reading."""
    if not readings:
        return {}
    out: dict = {"readings": readings, "behind": len(behind)}
    if behind:
        rows = [BehindSample._make(x) for x in behind]
        worst = max(rows, key=lambda x: x.behind_s)
        out |= {"ports": len({x.place for x in rows}), "worst_s": round(worst.behind_s, 6),
                "worst_where": worst.place, "frame_s": round(worst.frame_s, 6)}
    return out


def overlapping(windows: list[tuple[float, float]], found: list[FidelityFault]) -> list[FidelityFault]:
    """The faults that overlap any of ``windows`` ([lo, hi] in s)."""
    return [f for f in found if any(f.t0 < hi and f.t1 > lo for lo, hi in windows)]


def write_csv(path: Path, cpu: list[tuple[float, str, float, float, float]], gaps: list[tuple[float, str, float]],
              loop_gap_max_s: float = LOOP_GAP_MIN_S, held: Sequence[tuple[float, str, float, float]] = (),
              sched_delay_max_s: float = SCHED_DELAY_MAX_S, lost: Sequence[tuple[float, int, float]] = (),
              reordered: Sequence[tuple[float, str, int]] = (),
              stolen: Sequence[tuple[float, str, float, float]] = (),
              late: Sequence[LateInterval] = (), behind: Sequence[BehindSample] = (), cpus: int = 0) -> None:
    """``fidelity.csv``: one row per sample: t_s, invariant, where, value, limit, interval_s (the
    interval before t_s a CPU sample, a backlog drop or a CPU's steal covers; empty for a loop gap, which covers
    its telemetry interval, and for a spurious timeout's age at arrival, which covers its round
    trip)."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "invariant", "where", "value", "limit", "interval_s"])
        for t, label, delay, waited, span in cpu:
            w.writerow([f"{t:.3f}", "scheduling delay per run (s)", label, f"{delay:.6f}", sched_delay_max_s,
                        f"{span:.3f}"])
            w.writerow([f"{t:.3f}", "waited share of interval", label, f"{waited:.4f}", MIN_WAIT, f"{span:.3f}"])
        for t, host, gap in gaps:
            w.writerow([f"{t:.3f}", "loop gap (s)", f"endpoint {host}", f"{gap:.4f}", loop_gap_max_s, ""])
        for t, where, age, limit in held:
            w.writerow([f"{t:.3f}", "timed-out packet's time on its way (s)", where, f"{age:.4f}", f"{limit:.4f}", ""])
        for t, n, span in lost:
            w.writerow([f"{t:.3f}", "packets the kernel dropped (backlog full)", KERNEL_BACKLOG, n, 0, f"{span:.3f}"])
        for t, host, n in reordered:
            w.writerow([f"{t:.3f}", "packets that arrived behind a later one on their path", f"paths to {host}", n, 0,
                        ""])
        for t, place, n, most, frame_s, span, sent in late:
            w.writerow([f"{t:.3f}", "packets that left a switch port over a frame time after their shaper's schedule",
                        place, n, 0, f"{span:.3f}"])
            w.writerow([f"{t:.3f}", "low-priority packets that left that switch port", place, sent, "", f"{span:.3f}"])
            w.writerow([f"{t:.3f}", "the most a packet left a switch port after its shaper's schedule (s)", place,
                        f"{most:.6f}", f"{frame_s:.6f}", f"{span:.3f}"])
        for t, place, behind_s, frame_s, span, grew_s in map(BehindSample._make, behind):
            w.writerow([f"{t:.3f}", "how far a port's queue stood behind its shaper's schedule (s)", place,
                        f"{behind_s:.6f}", "", f"{span:.3f}"])
            w.writerow([f"{t:.3f}", "how much further behind than at its reading before (s)", place,
                        f"{grew_s:.6f}", f"{behind_limit(frame_s, sched_delay_max_s):.6f}", f"{span:.3f}"])
        for t, core, share, span in stolen:
            w.writerow([f"{t:.3f}", "share of the interval the hypervisor took the CPU", core,
                        f"{share:.3f}", "", f"{span:.3f}"])
        if cpus > 0:
            for lo, hi, share in stolen_spans(stolen, cpus):
                w.writerow([f"{hi:.3f}", "share of the machine's CPU time the hypervisor took", "this machine",
                            f"{share:.3f}", STEAL_SHARE_MAX, f"{hi - lo:.3f}"])
