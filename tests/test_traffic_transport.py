"""The pure transports over a channel that drops, duplicates, reorders and delays: every message
arrives complete and byte-identical, exactly once, completions in message order, and the sender
finishes. The same for the RoCE-style baseline."""

import dataclasses
import itertools
import random
import time

import pytest
from channel import Channel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, ev_plane, make_ev
from mrclab.traffic.host import HostStack
from mrclab.traffic.packet import Pkt
from mrclab.traffic.receiver import SACK_COALESCE_MAX, MrcReceiver
from mrclab.traffic.roce import RoceSender
from mrclab.traffic.sender import make_sender
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.txstamp import HEAD_BYTES
from mrclab.traffic.wire import Wire
from transport_sim import PLAN, delivered_intact, reverse_evs, run

messages_st = st.lists(st.integers(0, 9000), min_size=1, max_size=6).flatmap(
    lambda sizes: st.tuples(*[st.binary(min_size=n, max_size=n) for n in sizes]))
channel_st = st.fixed_dictionaries({
    "drop": st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    "dup": st.sampled_from([0.0, 0.05, 0.3]),
    "delay": st.sampled_from([(0.0005, 0.001), (0.0001, 0.01), (0.002, 0.05)]),
    "fifo": st.booleans(),
    "trim": st.sampled_from([0.0, 0.05, 0.3]),
    "ce": st.sampled_from([0.0, 0.1, 0.5]),
    "seed": st.integers(0, 2**16),
})
# 50 Mb/s per port: NSCC sizes its window from it, the baseline's DCQCN paces at it
FAST = TransportSettings(payload_bytes=512, window_packets=32, region_bytes=1 << 17, min_rto_s=0.01, port_mbps=50.0,
                         dcqcn_timer_s=0.005)


def _check(o, n_msgs, imm):
    assert o.sender.done, f"sender did not finish by t={o.t_end:.2f} s"
    st_ = o.receiver.stats
    assert st_.messages_delivered == n_msgs and st_.messages_corrupt == 0
    assert delivered_intact(o)
    if imm:
        assert st_.completions == list(range(n_msgs))  # each exactly once, in MSN order


@pytest.mark.parametrize("loop", ["tick", "deadline"])
@pytest.mark.parametrize("transport", ["mrc", "roce"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(msgs=messages_st, ch=channel_st, imm=st.booleans())
def test_any_loss_dup_reorder_pattern_delivers_every_message_exactly_once(transport, loop, msgs, ch, imm):
    # loop "deadline" sleeps as the endpoint does, until the transports' next_due or a frame: if
    # next_due left out a timer (RTO, delayed SACK, SACK repeat, DCQCN), a lossy transfer would
    # stall, since that loop has no other wake-up (the endpoint's 10 ms carrier poll is not
    # modelled); with probes off, whose rounds would wake it every probe interval and hide one
    chan = Channel(random.Random(ch["seed"]), drop=ch["drop"], dup=ch["dup"], delay_s=ch["delay"],
                   fifo_per_ev=ch["fifo"], trim=ch["trim"], ce=ch["ce"])
    s = FAST if loop == "tick" else dataclasses.replace(FAST, probes=False)
    o = run(list(msgs), chan, transport=transport, settings=s, imm=imm, seed=ch["seed"], limit_s=120,
            by_deadline=loop == "deadline")
    _check(o, len(msgs), imm)


@pytest.mark.parametrize("transport", ["mrc", "roce"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(n=st.integers(2, 6), size=st.integers(2000, 9000), ch=channel_st)
def test_a_region_that_holds_one_message_is_reused_without_corrupting_any(transport, n, size, ch):
    # every message wraps to offset 0 of a region just big enough for one: the sender must not
    # start the next until the last is acknowledged, or it overwrites data still in flight
    rng = random.Random(ch["seed"])
    msgs = [rng.randbytes(size) for _ in range(n)]
    chan = Channel(random.Random(ch["seed"]), drop=ch["drop"], dup=ch["dup"], delay_s=ch["delay"],
                   fifo_per_ev=ch["fifo"], trim=ch["trim"], ce=ch["ce"])
    s = TransportSettings(payload_bytes=512, window_packets=32, region_bytes=size + 100, min_rto_s=0.01)
    o = run(msgs, chan, transport=transport, settings=s, imm=True, seed=ch["seed"], limit_s=120)
    assert o.sender.done
    assert o.receiver.stats.messages_corrupt == 0
    assert o.receiver.stats.messages_delivered == n and o.receiver.stats.completions == list(range(n))
    assert bytes(o.receiver.region.mem[:size]) == msgs[-1]


def _lose_one(at_s):
    marks = {}

    def hook(now, tx, rx, chan):
        if "ev" not in marks and now > at_s:
            ev = tx.evs.active()[5]
            marks.update(ev=ev, t=now, shares=tx.evs.plane_shares(), plane=tx.evs.evs[ev].plane)
            chan.drop_once[ev] = 1  # exactly one untrimmed loss on this EV
        if "ev" in marks and "lost_psn" not in marks:
            mine = [psn for psn, r in tx.recs.items() if r.ev == marks["ev"] and r.t_sent >= marks["t"]]
            if mine:
                marks["lost_psn"] = min(mine)
        if "lost_psn" in marks and "visible" not in marks:
            later = [psn for psn, r in tx.recs.items() if r.ev == marks["ev"] and psn > marks["lost_psn"]]
            if later or tx.evs.evs[marks["ev"]].state == "ASSUMED_BAD":
                marks["visible"] = now  # a later packet on the same EV is in flight: its SACK reveals the gap
        if "ev" in marks and "retired" not in marks and tx.evs.evs[marks["ev"]].state == "ASSUMED_BAD":
            marks["retired"] = now

    return marks, hook


def test_untrimmed_loss_retires_its_ev_within_one_rtt_and_a_same_plane_backup_replaces_it():
    marks, hook = _lose_one(0.003)
    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20)
    o = run([random.Random(3).randbytes(2_000_000)], Channel(random.Random(5), delay_s=(0.001, 0.001)),
            settings=s, hook=hook)
    _check(o, 1, False)
    ev = marks["ev"]
    retire = [kw for k, kw in o.events if k == "ev_state" and kw["ev"] == ev and kw["new"] == "ASSUMED_BAD"]
    assert retire and "untrimmed loss" in retire[0]["reason"]  # by a later packet on the same EV, not a timer
    assert o.sender.stats.timeouts == 0
    rtt = o.sender.rtt.srtt
    # detectable when a later packet on the EV is sent; retired when its SACK returns: one RTT
    assert marks["retired"] - marks["visible"] <= rtt + 0.001, (marks, rtt)
    assert o.sender.evs.plane_shares() == marks["shares"]  # a backup of the same plane took its place
    assert ev not in o.sender.evs.active() or o.sender.evs.evs[ev].state == "GOOD"  # or probes revived it


def test_dead_ev_is_retired_by_the_timer_and_the_transfer_completes():
    dead = {}

    def hook(now, tx, rx, chan):
        if not dead and now > 0.003:
            dead["ev"] = tx.evs.active()[5]
            chan.drop_ev.add(dead["ev"])

    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20)
    o = run([bytes(2_000_000)], Channel(random.Random(5)), settings=s, hook=hook)
    _check(o, 1, False)
    reasons = [kw["reason"] for k, kw in o.events if k == "ev_state" and kw["ev"] == dead["ev"]
               and kw["new"] == "ASSUMED_BAD"]
    assert reasons and "timeout" in reasons[0]
    assert o.sender.evs.evs[dead["ev"]].state == "ASSUMED_BAD"  # its probes never come back


def test_a_stalled_receiver_times_packets_out_but_retires_no_ev():
    """The peer's host is not scheduled for 0.3 s (10x the RTO): every packet in flight times out,
    on every EV at once, and nothing came back on any of them. No path is to blame: the sender
    resends and retires nothing, and the transfer completes intact."""
    chan = Channel(random.Random(5), delay_s=(0.001, 0.001))
    chan.stall_rx = (0.02, 0.32)
    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20, min_rto_s=0.02)
    o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s)
    _check(o, 1, False)
    assert o.sender.stats.timeouts > 0  # the stall was seen
    assert o.t_end > 0.32
    retired = [kw for k, kw in o.events if k == "ev_state" and kw["new"] == "ASSUMED_BAD"]
    assert retired == []


def test_a_resent_packets_longer_timer_holds_up_no_first_transmission_sent_after_it():
    """A packet sent twice times out after 2 x RTO, one sent once after 1 x RTO. PSN 0 is lost and
    resent at 23 ms (timer 44 ms); the packets first sent in that same turn must time out at 45 ms,
    not wait behind the resend until 67 ms (one timer queue did so: a dead EV's first loss was
    found two RTTs late on bmv2)."""
    s = TransportSettings(payload_bytes=1024, window_packets=8, region_bytes=1 << 20, min_rto_s=0.02, nscc=False,
                          probes=False)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(1), iter([(m, bytes(4 * 1024)) for m in range(4)]))
    first = tx.poll(0.0)
    assert [p.psn for p in first] == [0, 1, 2, 3, 4, 5, 6, 7]
    # PSNs 1-3 arrive (an RTT sample of 2 ms: the RTO is its 20 ms floor over it); 0 and 4-7 never do
    tx.on_packet(Pkt(op=H.OP_SACK, qp=1, ev=first[1].ev, cum_psn=0, base_psn=0, bitmap=0b1110, echo_ev=first[1].ev,
                     echo_psn=1, port_state=0xFF), 0.002)
    assert tx.rtt.rto == pytest.approx(0.022)
    again = tx.poll(0.023)  # PSN 0 and 4-7 time out; 0 is resent first, then new data fills the window
    resent = [p.psn for p in again if p.flags & H.F_RETX]
    fresh = [p.psn for p in again if not p.flags & H.F_RETX and p.psn >= 8]
    assert 0 in resent and fresh, (resent, fresh)
    out = tx.poll(0.047)  # the fresh ones are due (23 + 22 ms); the twice-sent PSN 0 is not (23 + 44 ms)
    timed = {p.psn for p in out if p.flags & H.F_RETX}
    assert set(fresh) <= timed and 0 not in timed, (fresh, timed)


def test_a_reverse_path_held_for_a_while_times_packets_out_but_retires_no_ev():
    """Every SACK the receiver sends for 0.1 s (five timer floors) is held on the way back, while
    the data keeps arriving: a busy machine's kernel not running the reverse path. Packets sent
    just before the hold time out with nothing sent after them acknowledged (RACK's evidence, RFC
    8985): no one path is to blame, so none is retired; they are resent and the transfer
    completes. One EV that is dead from the same moment is still retired, once packets sent after
    its lost one are acknowledged."""
    for dead_ev in (False, True):
        # paths of 1-3 ms: SACKs for older packets keep arriving after newer ones left, so packets
        # in flight were sent before the peer last answered (a "heard since" rule blamed them)
        chan = Channel(random.Random(5), delay_s=(0.001, 0.003))
        chan.hold_rev = (0.05, 0.15)
        dead: set[int] = set()

        def hook(now, tx, rx, ch, dead=dead, dead_ev=dead_ev):
            if dead_ev and not dead and now > 0.05:
                dead.add(tx.evs.active()[3])
                ch.drop_ev |= dead

        s = TransportSettings(payload_bytes=1024, window_packets=16, region_bytes=4 << 20, min_rto_s=0.02)
        o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s, hook=hook)
        _check(o, 1, False)
        assert o.sender.stats.timeouts > 0  # the hold was seen
        retired = {kw["ev"] for k, kw in o.events if k == "ev_state" and kw["new"] == "ASSUMED_BAD"}
        assert retired == dead, (dead_ev, retired)


def test_packets_lost_with_a_plane_whose_port_went_down_retire_no_ev():
    """Plane 1's T0 dies with packets inside it: they are lost, and the sender's NIC port on that
    plane loses carrier a moment later (the endpoint polls it). The port state says why those
    packets time out: they are resent on the other planes, no EV is retired, the transfer
    completes. With the port state switched off the same losses retire plane 1's EVs."""
    for port_state, want_retired in ((True, False), (False, True)):
        def hook(now, tx, rx, chan, gone={}):
            if "t" not in gone and now > 0.01:
                gone["t"] = now
                chan.drop_ev.update(e for e, v in tx.evs.evs.items() if v.plane == 1)
            if "t" in gone and now > gone["t"] + 0.002 and tx.ports.local & 0b10:
                tx.set_local_ports(0xFF & ~0b10)

        chan = Channel(random.Random(5), delay_s=(0.001, 0.001))
        s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20, min_rto_s=0.02,
                              port_state=port_state)
        o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s, hook=hook)
        _check(o, 1, False)
        assert o.sender.stats.timeouts > 0  # packets were lost with the plane
        retired = [kw for k, kw in o.events if k == "ev_state" and kw["new"] == "ASSUMED_BAD"]
        assert bool(retired) == want_retired, (port_state, retired[:2])


def test_plane_shares_stay_equal_under_retirements():
    msgs = [bytes(2_000_000)]
    killed = []

    def hook(now, tx, rx, chan):
        if len(killed) < 3 and now > 0.002 * (len(killed) + 1):
            ev = [e for e in tx.evs.active() if e not in killed][0]
            killed.append(ev)
            chan.drop_ev.add(ev)

    o = run(msgs, Channel(random.Random(4)), hook=hook,
            settings=TransportSettings(payload_bytes=1024, window_packets=48, region_bytes=4 << 20))
    assert len(killed) == 3
    _check(o, 1, False)
    assert o.sender.evs.plane_shares() == [4, 4, 4, 4]


def test_denied_evs_are_never_used():
    from mrclab.topologies.addressing import make_ev

    deny = frozenset({make_ev(1, 0)})
    import itertools
    tx = make_sender(1, PLAN, "h0", "h2", TransportSettings(), random.Random(1), iter([(0, bytes(100_000))]),
                     denylist=deny)
    used = set()
    for k in itertools.count():
        pkts = tx.poll(k * 0.001)
        if not pkts:
            break
        used |= {p.ev for p in pkts}
    assert not any((ev >> 12) & 0xF == 1 and ev & 0xFFF == 0 for ev in used)
    assert all(tx.evs.evs[e].state == "DENIED" for e in tx.evs.evs if (e >> 12) & 0xF == 1 and e & 0xFFF == 0)


def test_roce_stalls_on_a_cut_path_until_its_timer_then_completes():
    msgs = [bytes(1_000_000)]
    cut = {}

    def hook(now, tx, rx, chan):
        if 0.01 < now < 0.3:
            chan.drop_ev.add(tx.ev)
            if now > 0.02:  # what was in flight at the cut has drained by now
                cut.setdefault("acked_early", tx.stats.bytes_acked)
                cut["acked_late"] = tx.stats.bytes_acked
        elif now >= 0.3:
            chan.drop_ev.discard(tx.ev)

    o = run(msgs, Channel(random.Random(1)), transport="roce", hook=hook,
            settings=TransportSettings(payload_bytes=1024, window_packets=32, region_bytes=1 << 21))
    _check(o, 1, False)
    assert 0 < cut["acked_early"] == cut["acked_late"] < 1_000_000  # stalled while its one path is cut
    assert o.sender.stats.timeouts >= 1 and o.t_end > 0.3


def test_rto_stays_above_the_recent_peak_rtt_and_follows_a_lasting_drop():
    """A queue that drains for a moment must not pull the timer under the RTT it refills to; a
    queue that stays short must let it come down (traffic/rtt.py, RttEstimator.rto). The samples
    are those of a full 100 ms queue that drains within 40 ms (a SACK every 2 ms)."""
    tx = make_sender(1, PLAN, "h0", "h2", TransportSettings(), random.Random(1), iter([]))
    now = 0.0
    for _ in range(50):
        now += 0.01
        tx.rtt.sample(0.100, now)
    for k in range(40):
        now += 0.002
        tx.rtt.sample(max(0.020, 0.100 - 0.004 * (k + 1)), now)
    assert 2 * tx.rtt.srtt + 4 * tx.rtt.rttvar < 0.06  # what srtt and rttvar alone would allow
    assert tx.rtt.rto > 0.075  # the queue refills within an RTT: the timer stays near its RTT
    for _ in range(200):  # 2 s of short round trips
        now += 0.01
        tx.rtt.sample(0.020, now)
    assert tx.rtt.rto < 0.06


def test_sacks_are_coalesced_over_a_receive_batch_and_cover_every_arrival():
    """Due SACKs wait for the end of the batch (the next poll), one per SACK_COALESCE_MAX at most,
    and each reports everything that arrived, out of order too."""
    s = TransportSettings(payload_bytes=1024, window_packets=256, region_bytes=1 << 22)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(3), iter([(0, bytes(range(256)) * 1024)]))
    rx = MrcReceiver(1, s, reverse_evs())
    pkts = []
    while len(pkts) < 2 * SACK_COALESCE_MAX + 5:
        pkts += tx.poll(0.0)
    batch = pkts[: SACK_COALESCE_MAX + 5]
    batch[0], batch[1] = batch[1], batch[0]  # one reordering inside the batch
    sacks = [a for p in batch for a in rx.on_packet(p, 0.0001)]
    assert len(sacks) == 1 and sacks[0].op == H.OP_SACK  # the cap: 32 pending leave at once
    assert sacks[0].cum_psn == SACK_COALESCE_MAX
    assert rx.poll(0.0001)[0].cum_psn == SACK_COALESCE_MAX + 5  # the rest at the end of the batch
    assert rx.poll(0.0001) == []
    one = rx.on_packet(pkts[SACK_COALESCE_MAX + 5], 0.0002)
    assert one == [] and rx.poll(0.0002) == []  # one pending: below ack_every, waits for ack_delay_s
    late = rx.poll(0.0002 + s.ack_delay_s)
    assert len(late) == 1 and late[0].cum_psn == SACK_COALESCE_MAX + 6


def test_the_last_sack_is_repeated_only_once_arrivals_stop_for_half_the_timer_floor():
    """A QP whose packets come 50 ms apart against a 113 ms timer floor (fig. 17's all-to-all at
    2 Mb/s: 7 QPs to a port) gets one SACK per arrival and no repeat: each next arrival's SACK
    reports the last one. When arrivals stop, both repeats leave together, half the floor after the
    last SACK (inside the sender's timer, which is min_rtt + min_rto_s at least), through other T1s
    than the SACK before each. (Repeats 4 and 8 ack delays after each SACK sent two per arrival
    there: SACKs took 0.42 of the data bytes, 2026-12-07 captures.)"""
    from mrclab.topologies.addressing import ev_t1
    from mrclab.traffic.receiver import SACK_REFRESHES

    s = TransportSettings(payload_bytes=1024, region_bytes=1 << 20, min_rto_s=0.1132)
    backs = itertools.cycle([make_ev(0, t1, 7) for t1 in range(4)])
    rx = MrcReceiver(3, s, lambda: next(backs))

    def arrive(psn: int, now: float) -> None:
        p = Pkt(H.OP_WRITE, 3, psn, make_ev(0, 1, 2), 0, psn, 1024, H.crc32(bytes(1024)), 0, psn * 1024, rx._rkey,
                1024, bytes(1024), None, 0xFF, False)
        rx.on_packet(p, now)

    sent: list[tuple[float, Pkt]] = []
    now, psn, step = 0.0, 0, 0.0005
    while now < 1.0:
        if psn < 10 and now >= psn * 0.050:
            arrive(psn, now)
            psn += 1
        sent += [(now, x) for x in rx.poll(now)]
        now = round(now + step, 6)
    last = 9 * 0.050  # the last arrival; its SACK leaves an ack delay later
    while_flowing = [x for t, x in sent if t < last + 0.01]
    assert len(while_flowing) == 10 and [x.cum_psn for x in while_flowing] == list(range(1, 11))
    repeats = [(t, x) for t, x in sent if t >= last + 0.01]
    assert len(repeats) == SACK_REFRESHES and all(x.cum_psn == 10 for _, x in repeats)
    first_at = repeats[0][0] - (last + s.ack_delay_s)
    assert s.min_rto_s / 2 <= first_at < s.min_rto_s / 2 + 2 * step and repeats[-1][0] == repeats[0][0]
    t1s = [ev_t1(x.ev) for x in [while_flowing[-1]] + [x for _, x in repeats]]
    assert all(a != b for a, b in itertools.pairwise(t1s)), t1s


def test_a_retransmission_far_behind_the_newest_arrival_is_in_its_sacks_bitmap():
    """cum_psn is held by a hole while 100 later PSNs arrive; when the hole's neighbour (also lost,
    now retransmitted) arrives, the SACK must report it, or its sender times it out and blames a
    healthy EV."""
    s = TransportSettings(payload_bytes=1024, window_packets=256, region_bytes=1 << 22)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(3), iter([(0, bytes(300 * 1024))]))
    rx = MrcReceiver(1, s, reverse_evs())
    pkts = []
    while len(pkts) < 120:
        pkts += tx.poll(0.0)
    for p in pkts[2:110]:  # PSNs 0 and 1 lost
        rx.on_packet(p, 0.001)
    rx.poll(0.001)
    sack = rx.on_packet(pkts[1], 0.002) + rx.poll(0.003)  # the retransmission of PSN 1
    # the batch's SACK, and (arrivals span more than a bitmap) one reporting a chunk of the span again
    assert len(sack) == 2 and sack[0].cum_psn == 0 and sack[0].echo_psn == 1
    assert (sack[0].bitmap >> (1 - sack[0].base_psn)) & 1
    tx.on_packet(sack[0], 0.003)
    assert 1 not in tx.recs and 0 in tx.recs



def test_while_cum_is_held_back_every_arrival_is_reported_again_through_each_t1():
    """PSN 0 and every PSN 8k+1 are lost (a dead path's share), the others up to 199 arrive and
    their SACKs are lost; then only the retransmissions of PSNs 8k+1 arrive (the sender's window is
    full), one SACK each, while PSN 0 holds cum_psn. Within a few SACKs every
    received PSN of the span must be reported again, through both T1s of the reverse EV set (one
    T1 may be dead), however the SACK types and the reverse EVs' rotation line up. Reporting again
    only the chunk at cum_psn left PSNs 64-199 to the sender's timer, which blamed their healthy
    EVs (t0t1-links-flap with a path delay)."""
    from mrclab.topologies.addressing import ev_t1, make_ev

    s = TransportSettings(payload_bytes=1024, window_packets=256, region_bytes=1 << 22)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(3), iter([(0, bytes(300 * 1024))]))
    # the receiving host's reverse set: plane-interleaved, the k-th T1 of each plane (traffic/host.py)
    cyc = itertools.cycle([make_ev(p, t1, 7) for t1 in (0, 1) for p in range(4)])
    rx = MrcReceiver(1, s, lambda: next(cyc))
    pkts = []
    while len(pkts) < 220:
        pkts += tx.poll(0.0)
    now = 0.001
    for p in pkts[1:200]:  # their SACKs: lost
        if p.psn % 8 != 1:
            rx.on_packet(p, now)
    rx.poll(now + s.ack_delay_s)
    got = {0: set(), 1: set()}  # PSNs reported, per T1 the SACK took
    for psn in range(1, 8 * 12, 8):  # 12 retransmissions, an arrival near cum_psn each
        now += 0.002
        for sack in rx.on_packet(pkts[psn], now) + rx.poll(now + s.ack_delay_s):
            assert sack.cum_psn == 0
            got[ev_t1(sack.ev)] |= {sack.base_psn + i for i in range(64) if (sack.bitmap >> i) & 1}
    arrived = {q for q in range(1, 200) if q % 8 != 1}
    for t1 in (0, 1):
        assert got[t1] >= arrived, f"T1 {t1}: not reported again: {sorted(arrived - got[t1])[:8]}"


@pytest.mark.parametrize("transport", ["mrc", "roce"])
def test_zero_length_writes_complete_in_order(transport):
    """A zero-length Write-with-Immediate (RDMA's pure notification) is one packet with no payload:
    it completes at once, in MSN order among the others, and is not taken for a bad packet."""
    msgs = [b"", b"abc" * 500, b"", b"x"]
    o = run(msgs, Channel(random.Random(2), drop=0.05), transport=transport, imm=True, limit_s=10.0)
    _check(o, len(msgs), True)
    assert "bad length" not in o.receiver.stats.dropped


class OnTheWire(Channel):
    """The channel, each packet first encoded to its frame and decoded back as the peer's NIC would
    (so PSNs travel as the 24 bits the BTH has room for)."""

    def send(self, p, to, now):
        src, dst = ("h0", "h2") if to == "rx" else ("h2", "h0")
        _, frame = Wire(PLAN, src).encode(p, dst)
        got = Wire(PLAN, dst).decode(frame)
        assert got is not None and got[0] == src
        super().send(got[1], to, now)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(ch=channel_st, before=st.integers(1, 30))
def test_psns_wrap_at_24_bits_without_losing_or_repeating_a_message(ch, before):
    # the wire carries 24-bit PSNs (BTH): both ends extend them to full PSNs, the receiver nearest to
    # its cum_psn, the sender at or below its next PSN. Start `before` PSNs short of the wrap.
    from mrclab.traffic.packet import PSN_MOD

    start = PSN_MOD - before

    def at_the_wrap(now, tx, rx, _chan):
        if now == 0.0:
            tx.next_psn = tx.acked_below = start
            rx.cum, rx.newest = start, start - 1

    rng = random.Random(ch["seed"])
    msgs = [rng.randbytes(rng.randint(3000, 6000)) for _ in range(6)]  # >= 36 packets of 512 B
    chan = OnTheWire(random.Random(ch["seed"]), drop=ch["drop"], dup=ch["dup"], delay_s=ch["delay"],
                     fifo_per_ev=ch["fifo"], trim=ch["trim"], ce=ch["ce"])
    o = run(msgs, chan, settings=FAST, seed=ch["seed"], limit_s=30, hook=at_the_wrap)
    _check(o, len(msgs), False)
    assert o.sender.next_psn > PSN_MOD  # it did cross


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_trimmed_packets_overtaking_on_a_pinned_ev_never_retire_it(seed):
    """One EV (a flow pinned to a path, paper fig. 14): a trimmed header jumps its queue, its
    retransmission goes back on the same EV behind packets sent before it. Those arriving first is
    FIFO, not a loss: the EV must never be retired, and every message arrives."""
    ev = PLAN.paths("h0", "h2")[0].ev | (5 << 16)
    o = run([random.Random(seed).randbytes(300_000)], Channel(random.Random(seed), trim=0.15, delay_s=(0.001, 0.003)),
            pin_ev=ev, limit_s=30)
    assert o.sender.done and delivered_intact(o)
    assert not [e for e in o.events if e[0] == "ev_state" and e[1]["new"] == "ASSUMED_BAD"], \
        [e for e in o.events if e[0] in ("ev_state", "gap")][:5]


@pytest.mark.parametrize("transport", ["mrc", "roce"])
def test_next_due_lets_a_window_bound_transfer_sleep_between_arrivals(transport):
    # 20 ms one-way paths and a 2-packet window (the lab's bmv2 regime: a few packets per RTT):
    # most of the time the sender waits for acknowledgements with nothing due, so a loop on
    # next_due takes under half the turns of the 1 ms tick it replaces, and ends no later
    s = TransportSettings(payload_bytes=1024, window_packets=2, region_bytes=1 << 18, min_rto_s=0.2)
    msgs = [random.Random(7).randbytes(30_000)]
    tick = run(msgs, Channel(random.Random(3), delay_s=(0.02, 0.02)), transport=transport, settings=s)
    dl = run(msgs, Channel(random.Random(3), delay_s=(0.02, 0.02)), transport=transport, settings=s,
             by_deadline=True)
    _check(dl, 1, False)
    assert dl.t_end <= tick.t_end + 0.001
    assert dl.steps < (tick.t_end / 0.001) / 2, (dl.steps, tick.t_end)


def test_next_due_is_the_timer_of_the_oldest_packet_in_flight():
    s = TransportSettings(payload_bytes=1024, window_packets=2, region_bytes=1 << 16, min_rto_s=0.05, probes=False)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(1), iter([(0, bytes(4096))]))
    assert tx.next_due(0.0) == 0.0  # a message in hand and the window open: at once
    sent = tx.poll(0.0)
    assert len(sent) == 2 and not tx.poll(0.001)  # window full
    due = tx.next_due(0.001)
    assert due == pytest.approx(0.0 + tx.rtt.rto)
    assert not tx.poll(due - 1e-6)  # nothing before it ...
    assert tx.poll(due + 1e-6)  # ... a retransmission after it
    rx = MrcReceiver(1, s, reverse_evs())
    assert rx.next_due(0.0) == float("inf")  # nothing received: no SACK owed
    rx.on_packet(sent[0], 0.002)
    assert rx.next_due(0.002) == pytest.approx(0.002 + s.ack_delay_s)


def _spurious(o) -> list[dict]:
    return [kw for k, kw in o.events if k == "spurious_timeout"]


def test_a_packet_held_past_its_timer_and_delivered_is_reported_as_a_spurious_timeout():
    """Two EVs' data is held on the way for 0.1 s (five timer floors): it times out, is resent on
    other EVs, and then arrives, after its resend: a duplicate, which the receiver echoes at once
    on the EV it came by. Each tells the sender the timer gave up on a packet that was only late: a
    spurious timeout (RFC 3522), on a held EV, at least a timer after it was sent. The fidelity
    watch voids the verdicts that overlap it (experiments/analysis/fidelity.py, "held packets")."""
    chan = Channel(random.Random(5), delay_s=(0.001, 0.001))
    held: set[int] = set()

    asked: list[tuple[int, float]] = []

    def hook(now, tx, rx, ch):
        if not held and now > 0.01:
            held.update(tx.evs.active()[2:4])
            ch.hold_ev = (held, now, now + 0.1)
            tx.nic_wait = lambda plane, t: asked.append((plane, t)) or 0.004  # the host's NIC model says

    s = TransportSettings(payload_bytes=1024, window_packets=16, region_bytes=4 << 20, min_rto_s=0.02)
    o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s, hook=hook)
    _check(o, 1, False)
    assert o.sender.stats.timeouts > 0 and o.receiver.stats.duplicates > 0
    got = _spurious(o)
    assert len(got) == o.receiver.stats.duplicates, (got, o.receiver.stats.duplicates)
    assert {e["ev"] for e in got} <= held
    assert all(0.02 <= e["age_s"] <= 0.11 for e in got), got
    # ... and the one-way time the SACK echoed: the hold, from the stamp at send to the arrival
    # (not the SACK's round trip: it is the time the copy that arrived spent on its way)
    assert all(e["wire_s"] is not None and 0.02 <= e["wire_s"] <= e["age_s"] for e in got), got
    assert all(e["nic_wait_s"] == 0.004 for e in got)  # each reports the wait its NIC gave it ...
    assert {ev_plane(e["ev"]) for e in got} <= {p for p, _ in asked}  # ... asked on its plane
    assert all(0.01 < t < 0.11 for _, t in asked)  # ... at its send time (and by the timer: below)


def _nic_queue_for_a_while(nic: bool, dead_ev: bool):
    """Every packet sent in 25 ms waits in the sender's NIC queue until they end (the host's model
    says so when ``nic``), then crosses a 1 ms path: a round trip of up to 27 ms against a 20 ms
    timer floor and 2 ms RTT samples. With ``dead_ev``, one EV also drops everything from then."""
    chan = Channel(random.Random(5), delay_s=(0.001, 0.001))
    queue: dict = {}
    dead: set[int] = set()

    def hook(now, tx, rx, ch):
        if not queue and now > 0.05:
            queue.update(start=now, end=now + 0.025)
            ch.hold_ev = (set(tx.evs.evs), now, now + 0.025)  # held as a NIC queue holds them
            if dead_ev:
                dead.add(tx.evs.active()[3])
                ch.drop_ev |= dead
            if nic:
                tx.nic_wait = lambda plane, t: queue["end"] - t if queue["start"] <= t < queue["end"] else 0.0

    s = TransportSettings(payload_bytes=1024, window_packets=16, region_bytes=4 << 20, min_rto_s=0.02)
    o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s, hook=hook)
    _check(o, 1, False)
    return o, dead


def test_a_packet_that_waited_in_its_nic_queue_is_timed_from_when_it_left():
    # a NIC times a packet from the wire: a host whose port queue held a burst for 25 ms (its
    # model, traffic/nicqueue.py, knows how long) does not time it out on a 20 ms floor whose
    # round trips are otherwise 2 ms (t0t1-links-flap on linux retired 8 healthy EVs so)
    o, _ = _nic_queue_for_a_while(nic=False, dead_ev=False)
    assert o.sender.stats.timeouts > 0 and _spurious(o)  # without the model: spurious timeouts
    o, _ = _nic_queue_for_a_while(nic=True, dead_ev=False)
    assert o.sender.stats.timeouts == 0 and not _spurious(o)
    retired = [kw for k, kw in o.events if k == "ev_state" and kw.get("new") == "ASSUMED_BAD"]
    assert not retired
    # a dead path's packets still time out, a timer after they left, and retire their EV
    o, dead = _nic_queue_for_a_while(nic=True, dead_ev=True)
    retired = {kw["ev"] for k, kw in o.events if k == "ev_state" and kw.get("new") == "ASSUMED_BAD"}
    assert o.sender.stats.timeouts > 0 and retired == dead and not _spurious(o)


def _nic_held_by_the_machine(stamps: bool, dead_ev: bool = False, port_down: bool = False):
    """Every data packet handed over in a 60 ms span leaves its NIC port only when it ends (the
    machine held the port: no model of the queue can know it), then crosses a 1 ms path: round
    trips of up to 62 ms against a 20 ms timer floor. With ``stamps`` the port reports each
    packet's departure as the kernel's stamp would (MrcSender.left_nic); ``dead_ev``: one EV also
    drops everything from then; ``port_down``: the held plane-0 port is down, as the host reads its
    carrier, for the span and a timer after it."""
    chan = Channel(random.Random(5), delay_s=(0.001, 0.001))
    span: dict = {}
    dead: set[int] = set()
    leaving: list[tuple[float, int, float]] = []  # (departure, PSN, handed over)
    reported = [0]

    def hook(now, tx, rx, ch):
        if not span and now > 0.05:
            span.update(start=now, end=now + 0.06)
            ch.hold_ev = (set(tx.evs.evs), now, now + 0.06)  # the port's frames leave at its end
            tx.wire_ports = (1 << PLAN.spec.planes) - 1 if stamps else 0
            if dead_ev:
                dead.add(tx.evs.active()[3])
                ch.drop_ev |= dead
            send = ch.send

            def sent(pkt, to, t):  # the port's departure of each data packet
                if to == "rx" and pkt.op in (H.OP_WRITE, H.OP_WRITE_IMM):
                    leaving.append((max(t, span["end"]) if span["start"] <= t < span["end"] else t, pkt.psn, t))
                send(pkt, to, t)
            ch.send = sent
        if port_down and span:
            up = not span["start"] <= now < span["end"] + 0.03
            tx.ports.local = tx.ports.local | 1 if up else tx.ports.local & ~1
        if stamps and span:
            while leaving and min(leaving)[0] <= now:
                t, psn, handed = min(leaving)
                leaving.remove((t, psn, handed))
                tx.left_nic(psn, handed, t)
                reported[0] += 1

    s = TransportSettings(payload_bytes=1024, window_packets=16, region_bytes=4 << 20, min_rto_s=0.02)
    o = run([random.Random(3).randbytes(1_000_000)], chan, settings=s, hook=hook)
    _check(o, 1, False)
    o.reported = reported[0]
    return o, dead


def test_a_packet_its_nic_port_has_not_sent_is_never_timed_out_and_its_timer_runs_from_the_stamp():
    # a NIC times a packet from the wire: a port the machine held for 60 ms (three timer floors;
    # a busy machine held a flap-soak packet 72 ms, 2026-12-06) sends its packets late, and their
    # departure stamps say so. Without them the timer fires on packets still in the port, and
    # the retransmissions are spurious
    o, _ = _nic_held_by_the_machine(stamps=False)
    assert o.sender.stats.timeouts > 0 and _spurious(o)
    o, _ = _nic_held_by_the_machine(stamps=True)
    assert o.sender.stats.timeouts == 0 and not _spurious(o), (o.sender.stats, _spurious(o))
    assert o.sender.stats.nic_deferred > 0 and o.sender.stats.wire_stamped == o.reported > 0  # each stamp its packet's
    assert not [kw for k, kw in o.events if k == "ev_state" and kw.get("new") == "ASSUMED_BAD"]
    # the RTT samples ran from the stamps: the 60 ms in the port never reached NSCC's base RTT
    assert o.sender.rtt.min_rtt < 0.005 and o.sender.rtt.srtt < 0.01, (o.sender.rtt.min_rtt, o.sender.rtt.srtt)


def test_a_dead_path_behind_a_held_nic_port_still_times_out_a_timer_after_its_packets_left():
    o, dead = _nic_held_by_the_machine(stamps=True, dead_ev=True)
    retired = {kw["ev"] for k, kw in o.events if k == "ev_state" and kw.get("new") == "ASSUMED_BAD"}
    assert o.sender.stats.timeouts > 0 and retired == dead and not _spurious(o)
    lost = [kw for k, kw in o.events if k == "loss" and kw["reason"] == "timeout"]
    assert lost and all(kw["ev"] in dead for kw in lost), lost
    # ... each a timer after it left the port (the span's end), not after it was handed over
    assert all(kw["age_s"] >= 0.02 for kw in lost)


def test_a_packet_on_a_port_that_is_down_is_timed_out_without_waiting_for_its_stamp():
    # a port that lost its carrier sends nothing and stamps nothing: its packets time out on their
    # timers (and are resent on the planes still up), never waiting for a stamp that cannot come
    o, _ = _nic_held_by_the_machine(stamps=True, port_down=True)
    lost = [kw for k, kw in o.events if k == "loss" and kw["reason"] == "timeout"]
    assert lost and {ev_plane(kw["ev"]) for kw in lost} == {0}, lost
    assert max(kw["age_s"] for kw in lost) < 0.2, lost  # on their timers: not the 1 s a stamp is waited for


def test_a_departure_stamp_counts_only_for_the_transmission_it_was_handed_over_with():
    s = TransportSettings(payload_bytes=1024, window_packets=4, region_bytes=4 << 20)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(1), iter([(0, bytes(8192))]))
    tx.wire_ports = (1 << PLAN.spec.planes) - 1
    tx.poll(1.0)
    rec = tx.recs[0]
    tx.left_nic(0, 1.0 - 0.02, 1.03)  # another transmission's (handed over 20 ms before this one)
    assert rec.t_wire < 0 and rec.t_first == 1.0
    tx.left_nic(0, 1.0 + 0.00005, 1.03)  # this one's: its send stamp is within the stamp's 100 us
    assert rec.t_wire == 1.03 and rec.t_first == 1.03 and tx.stats.wire_stamped == 1
    tx.left_nic(0, 1.0, 1.05)  # a second stamp for it changes nothing
    assert rec.t_wire == 1.03


def test_a_sender_waits_for_stamps_only_on_ports_whose_device_stamps():
    """A port's first departure stamp tells the host its device stamps (a veth does; a VXLAN port
    to a switch on another server stamps nothing): only there is a packet with no stamp yet
    taken to be still in its port. Eight packets over four planes, plane 0's stamped as they are
    handed over, nothing acknowledged: at 0.9 s, past the first RTO (0.5 s) and inside the 1 s a
    stamp is waited for, all eight time out, plane 0's from their stamps and the others' on the
    host's model; none waits for a stamp that cannot come."""
    s = TransportSettings(payload_bytes=1024, window_packets=8, region_bytes=4 << 20, port_mbps=1000.0, nscc=False)
    a = HostStack(PLAN, "h0", s, seed=1)
    tx = a.add_sender(1, "h2", iter([(0, bytes(8 * 1024))]))
    t0 = time.monotonic()  # the frames' send stamps read the monotonic clock
    out = a.poll(t0)
    assert len(out) == 8 and {p for p, _ in out} == set(range(PLAN.spec.planes))
    assert tx.wire_ports == 0 and a.stamped_ports == 0
    for plane, frame in out:
        if plane == 0:
            a.left_port(plane, frame[:HEAD_BYTES], t0)
    assert a.stamped_ports == 1 and tx.wire_ports == 1  # plane 0's device stamps
    assert a.add_sender(2, "h2", iter([])).wire_ports == 1  # ... and a sender added later knows it
    assert tx.stats.wire_stamped == 2
    a.poll(t0 + 0.9)
    assert tx.stats.timeouts == 8, tx.stats


def test_a_host_stack_on_a_shaped_port_tells_its_senders_the_nic_queue_wait_each_packet_met():
    """With the port rate known, the host stack models its NIC queues (traffic/nicqueue.py) with
    every frame it sends, and its MRC senders read the wait a packet sent at a given time met
    there: the bytes sent before it on its plane, less what the port drained since. Unshaped: no
    model, and the senders report none."""
    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20, port_mbps=8.0)
    a = HostStack(PLAN, "h0", s, seed=1)
    tx = a.add_sender(1, "h2", iter([(0, bytes(64 * 1024))]))
    out = a.poll(1.0)
    per_plane: dict[int, list[int]] = {}
    for plane, frame in out:
        per_plane.setdefault(plane, []).append(len(frame))
    assert len(per_plane) == PLAN.spec.planes
    for plane, sizes in per_plane.items():  # 8 Mb/s: 1 byte a microsecond; the last frame waits for the rest
        assert tx.nic_wait(plane, 1.0) == pytest.approx(sum(sizes[:-1]) / 1e6)
        assert tx.nic_wait(plane, 1.0005) == pytest.approx(sum(sizes[:-1]) / 1e6)  # the same millisecond
        assert tx.nic_wait(plane, 1.002) is None  # nothing sent then
    assert HostStack(PLAN, "h0", TransportSettings(), seed=1).add_sender(1, "h2", iter([])).nic_wait is None


class _Counted:
    """A sender double: counts its polls, says it has nothing until ``due``."""

    def __init__(self, due: float) -> None:
        self.due, self.polls = due, 0

    def poll(self, now, budget=64):
        self.polls += 1
        return []

    def next_due(self, now):
        return self.due

    def set_local_ports(self, state):
        pass

    def on_packet(self, p, now):
        pass


def test_a_host_stack_polls_a_qp_only_when_due_or_given_work():
    """A host of a collective holds a QP per peer; polling all at every wake-up cost an 8-host
    all-to-all's endpoints most of their CPU. A sender whose next_due is ahead is skipped until then,
    unless a packet for it, a message for it (a collective's post) or a wake-up (a port, a stop)
    gives it work."""
    a = HostStack(PLAN, "h0", TransportSettings(), seed=1)
    idle, busy = _Counted(5.0), _Counted(0.0)
    a.senders[("h2", 1)], a.senders[("h2", 2)] = idle, busy
    assert a.next_due(1.0) == 1.0  # busy is due at once
    for t in (1.0, 1.1, 1.2):
        a.poll(t)
        a.next_due(t)
    assert (idle.polls, busy.polls) == (0, 3)
    a.poll(5.0)
    assert idle.polls == 1  # its time came
    a.next_due(5.0)
    idle.due = 9.0
    a.poll(5.1)
    assert idle.polls == 2  # still cached at 5.0: due, polled, then 9.0
    a.next_due(5.1)
    a.poll(5.2)
    assert idle.polls == 2
    a._packet_in("h2", Pkt(op=H.OP_SACK, qp=1), 5.3)  # a SACK for it
    a.poll(5.3)
    assert idle.polls == 3
    a.next_due(5.3)

    class Coll:
        posted: set = set()

    a._colls.append(Coll)
    Coll.posted.add(("h2", 1))  # the collective gave it a message
    a.poll(5.4)
    assert idle.polls == 4 and not Coll.posted
    a.next_due(5.4)
    a.set_local_ports(0b1)  # a port went down: every QP looks
    a.poll(5.5)
    assert idle.polls == 5


def test_a_dead_path_times_out_but_never_reports_a_spurious_timeout():
    """Packets a dead EV swallowed never arrive: their timeouts were right, and none is reported
    as spurious."""
    dead: set[int] = set()

    def hook(now, tx, rx, chan):
        if not dead and now > 0.003:
            dead.add(tx.evs.active()[5])
            chan.drop_ev |= dead

    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20)
    o = run([bytes(2_000_000)], Channel(random.Random(5)), settings=s, hook=hook)
    _check(o, 1, False)
    assert o.sender.stats.timeouts > 0
    assert _spurious(o) == []


def test_a_resend_on_the_same_ev_makes_an_echo_ambiguous_and_is_not_reported():
    """A pinned QP's only packet is lost; the timer resends it on the same (only) EV, and the
    resend's arrival echoes that EV. It is the resend that arrived, not the packet the timer gave
    up on: no spurious timeout."""
    ev = PLAN.paths("h0", "h2")[0].ev | (5 << 16)
    chan = Channel(random.Random(5), delay_s=(0.001, 0.001), drop_once={ev: 1})
    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=1 << 16, min_rto_s=0.02)
    o = run([random.Random(3).randbytes(1000)], chan, settings=s, pin_ev=ev, limit_s=5)
    assert o.sender.done and delivered_intact(o)
    assert o.sender.stats.timeouts == 1
    assert _spurious(o) == []


def test_the_receiver_echoes_each_arrivals_one_way_time_from_its_send_stamp():
    """A SACK carries the one-way time of the arrival it echoes: its send stamp (headers.STAMP_HZ
    units, mod 2^16) to the receiver's clock, across the stamp's wrap; NO_WIRE for an arrival that
    carried none, and 0 for a stamp the receiver's batch clock has not reached yet."""
    rx = MrcReceiver(3, TransportSettings(ack_every=1), lambda: make_ev(0, 0, 1))

    def sack_of(psn, stamp, now):
        p = Pkt(H.OP_WRITE, 3, psn, make_ev(1, 0, 2), 0, psn, 1024, H.crc32(bytes(1024)), 0, psn * 1024, rx._rkey,
                1024, bytes(1024), None, 0xFF, False)  # message psn: one packet each
        p.stamp = stamp
        rx.on_packet(p, now)
        return rx.poll(now)[0]

    now = 6.5535  # the stamp wraps at 6.5536 s: sent at 6.5000 (65000), read at 65535 units
    assert sack_of(0, 65000, now).echo_wire == 535  # 53.5 ms
    assert sack_of(1, 65500, 6.5536 + 0.0100).echo_wire == 136  # across the wrap: 13.6 ms
    assert sack_of(2, -1, 7.0).echo_wire == H.NO_WIRE
    assert sack_of(3, int(7.1 * H.STAMP_HZ) & 0xFFFF, 7.0).echo_wire == 0


def _rtt_samples_behind_a_nic_queue(stamps: bool | str, transport: str = "mrc") -> list[float]:
    """A 64-packet window handed to a shaped 8 Mb/s port at once: each frame leaves when the
    frames before it on its plane have (the host's NIC model), then crosses 1 ms each way; the
    receiver acknowledges each arrival at once. Returns the sender's RTT samples (s). RoCE's
    (``transport`` roce) runs on its window alone (``roce_cc`` none), so all 64 leave at once.
    ``stamps`` "wire": no model, the port's departure stamp of each frame instead (its first
    bytes and when it left, as the endpoint reads them: HostStack.left_port), read before the
    acknowledgements."""
    s = TransportSettings(payload_bytes=1024, window_packets=64, region_bytes=4 << 20, port_mbps=8.0, nscc=False,
                          roce_cc="none")
    a, b = HostStack(PLAN, "h0", s, transport, seed=1), HostStack(PLAN, "h2", s, transport, seed=2)
    a.nic_model = stamps is True
    tx = a.add_sender(1, "h2", iter([(0, bytes(64 * 1024))]))

    got: list[float] = []

    class Heard:  # MRC's congestion control or RoCE's RTT estimator, hearing each RTT sample
        def __init__(self, inner):
            self.inner = inner

        def on_ack(self, acked, rtt, ecn, now, in_flight=0.0):
            if rtt is not None:
                got.append(rtt)
            self.inner.on_ack(acked, rtt, ecn, now, in_flight)

        def sample(self, rtt, now):
            got.append(rtt)
            self.inner.sample(rtt, now)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    if transport == "mrc":
        tx.cc = Heard(tx.cc)
    else:  # RoCE's samples go to its RTT estimator (and from it to DCQCN's timer)
        tx.rtt = Heard(tx.rtt)
    # the clock the frames' send stamps read (the wire's framer stamps on the monotonic clock)
    t0 = time.monotonic() if stamps == "wire" else 1.0
    gone = {p: t0 for p in range(PLAN.spec.planes)}  # when each port is free again
    back: list[tuple[float, bytes]] = []
    for plane, frame in a.poll(t0):
        if stamps == "wire":  # the kernel stamps it as the port's shaper hands it on
            a.left_port(plane, frame[:HEAD_BYTES], gone[plane])
        gone[plane] = gone[plane] + len(frame) * 8 / 8e6  # 8 Mb/s, in order
        arrive = gone[plane] + 0.001
        back += [(arrive + 0.001, f) for _, f in b.on_frame(frame, arrive) + b.poll(arrive)]
    for t, f in sorted(back, key=lambda x: x[0]):
        a.on_frame(f, t)
    return got


@pytest.mark.parametrize("transport", ["mrc", "roce"])
def test_rtt_samples_run_from_when_the_nic_port_sent_the_packet(transport):
    # a NIC stamps a packet on the wire: the packets a plane queued behind each other (up to 18 ms
    # for MRC's 16 a plane, 70 ms for RoCE's 64 on its one path, at 8 Mb/s) are no part of their
    # round trips, which are their serialisation and 2 ms
    got = _rtt_samples_behind_a_nic_queue(stamps=True, transport=transport)
    assert len(got) >= 16 and max(got) < 0.002 + 2 * 1182 * 8 / 8e6
    wire = _rtt_samples_behind_a_nic_queue(stamps="wire", transport=transport)  # the port's own stamps
    assert len(wire) >= 16 and max(wire) < 0.002 + 2 * 1182 * 8 / 8e6
    queued = _rtt_samples_behind_a_nic_queue(stamps=False, transport=transport)  # stamped when handed over
    assert max(queued) > 0.015


def test_dcqcn_timer_follows_the_fabric_rtt_not_the_hosts_own_nic_queue():
    """With ``dcqcn_timer_s`` 0 DCQCN's timer is 5 x the smallest RTT sample. Four QPs of a host
    hand their windows (8 packets each) to their one 8 Mb/s port at once, as a collective's QPs do: from
    NIC departure every QP's smallest sample is the path's (2 ms and a frame, 3.2 ms: a 16 ms
    timer); stamped at the hand-off the last QP's first packet already sat behind the others'
    24 frames, and a CNP gave it a timer over 5 x 30 ms."""
    one_plane = AddressPlan(dataclasses.replace(PLAN.spec, planes=1))  # the four QPs share one port

    def timers_after_a_cnp(stamps: bool) -> list[float]:
        s = TransportSettings(payload_bytes=1024, window_packets=8, region_bytes=4 << 20, port_mbps=8.0, nscc=False)
        a, b = HostStack(one_plane, "h0", s, "roce", seed=1), HostStack(one_plane, "h2", s, "roce", seed=2)
        a.nic_model = stamps
        txs = [a.add_sender(qp, "h2", iter([(0, bytes(64 * 1024))])) for qp in (1, 2, 3, 4)]
        for tx in txs:
            tx.pacer.tokens = 1e9  # each window leaves at once: 32 frames queue at the ports
        gone: dict[int, float] = {}
        back = []
        for plane, frame in a.poll(1.0):
            gone[plane] = gone.get(plane, 1.0) + len(frame) * 8 / 8e6
            at = gone[plane] + 0.001
            back += [(at + 0.001, f) for _, f in b.on_frame(frame, at) + b.poll(at)]
        for t, f in sorted(back, key=lambda x: x[0]):
            a.on_frame(f, t)
        for tx in txs:
            tx.on_packet(Pkt(op=H.OP_CNP, qp=tx.qp, ev=tx.ev), 1.5)
        return [tx.dcqcn.timer_s for tx in txs]

    frame = 1182 * 8 / 8e6
    assert max(timers_after_a_cnp(True)) == pytest.approx(5 * (0.002 + frame), rel=0.05)
    assert max(timers_after_a_cnp(False)) > 5 * (0.002 + 8 * frame)


def test_roce_departure_stamps_skip_a_go_back_n_resend_and_land_on_the_new_psns():
    """After a timeout the poll's frames are the resent PSNs, then new ones: the NIC's waits
    stamp the new PSNs only (a resent PSN takes no RTT sample, Karn), each by its own wait."""
    s = TransportSettings(payload_bytes=1024, window_packets=4, region_bytes=1 << 20, roce_cc="none")
    tx = RoceSender(1, make_ev(1, 0, 2), iter([(0, bytes(8 * 1024))]), s)
    assert len(tx.poll(1.0)) == 4  # PSNs 0-3
    tx.departed([0.0, 0.01, 0.02, 0.03], 0)
    assert tx.sent_at == pytest.approx({0: 1.0, 1: 1.01, 2: 1.02, 3: 1.03})
    tx.on_packet(Pkt(op=H.OP_ACK, qp=1, ev=tx.ev, cum_psn=2), 1.1)  # PSNs 0-1 acknowledged
    later = 1.1 + 5 * s.min_rto_s + 0.001  # past the timer: go back to PSN 2
    out = tx.poll(later)
    assert [p.psn for p in out] == [2, 3, 4, 5] and tx.stats.timeouts == 1
    tx.departed([0.5, 0.5, 0.004, 0.006], 0)
    assert 2 not in tx.sent_at and 3 not in tx.sent_at
    assert tx.sent_at[4] == pytest.approx(later + 0.004) and tx.sent_at[5] == pytest.approx(later + 0.006)


def _roce_held(stamps: bool, window: int = 4) -> RoceSender:
    """A RoCE QP on plane 1 whose 4 PSNs were handed to its port at 1.0 s; that port stamps its
    departures when ``stamps``."""
    s = TransportSettings(payload_bytes=1024, window_packets=window, region_bytes=1 << 20, roce_cc="none")
    tx = RoceSender(1, make_ev(1, 0, 2), iter([(0, bytes(8 * 1024))]), s)
    tx.wire_ports = 0b10 if stamps else 0
    assert [p.psn for p in tx.poll(1.0)] == [0, 1, 2, 3]
    return tx


def test_roce_s_go_back_n_timer_runs_from_when_its_port_sent_the_oldest_psn():
    # the Local ACK Timeout starts as the NIC sends the request packet: a port the machine held
    # 150 ms (past the timer, 5 x min_rto_s = 100 ms) sends its PSNs late, and the baseline must
    # not go back N on packets still in it. From the hand-off it did
    rto = 5 * TransportSettings().min_rto_s
    tx = _roce_held(stamps=False)
    assert tx.poll(1.0 + rto + 0.01) and tx.stats.timeouts == 1  # the hand-off's timer: a spurious go-back-N
    tx = _roce_held(stamps=True)
    assert not tx.poll(1.0 + rto + 0.01) and tx.stats.timeouts == 0  # no stamp yet: still in its port
    assert tx.stats.nic_deferred == 1 and tx.next_due(1.0 + rto + 0.01) > 1.0 + rto + 0.01  # no busy loop
    for psn in range(4):
        tx.left_nic(psn, 1.0, 1.15)  # the port let them go at 150 ms
    assert tx.stats.wire_stamped == 4
    assert not tx.poll(1.15 + rto - 0.005) and tx.stats.timeouts == 0  # a timer after they left: not yet
    tx.on_packet(Pkt(op=H.OP_ACK, qp=1, ev=tx.ev, cum_psn=4), 1.16)
    assert tx.una == 4 and tx.stats.timeouts == 0 and not tx.left_at and not tx.handed_at
    # the RTT sample ran from the stamp, not from the hand-off
    assert tx.rtt.min_rtt == pytest.approx(0.01)


def test_roce_behind_a_held_port_still_goes_back_n_a_timer_after_its_psns_left():
    # nothing comes back (its one path is dead): the timer fires one timeout after the stamp
    rto = 5 * TransportSettings().min_rto_s
    tx = _roce_held(stamps=True)
    tx.left_nic(0, 1.0, 1.15)
    assert not tx.poll(1.15 + rto - 0.005) and tx.stats.timeouts == 0
    assert [p.psn for p in tx.poll(1.15 + rto + 0.005)] == [0, 1, 2, 3] and tx.stats.timeouts == 1
    # the resent PSN 0's timer runs from the resend's stamp; the first transmission's is ignored
    tx.left_nic(0, 1.0, 1.4)
    assert 0 not in tx.left_at
    tx.left_nic(0, 1.15 + rto + 0.005, 1.3)
    assert tx.left_at[0] == 1.3


def test_roce_on_a_port_that_is_down_goes_back_n_without_waiting_for_a_stamp():
    rto = 5 * TransportSettings().min_rto_s
    tx = _roce_held(stamps=True)
    tx.set_local_ports(0b1101)  # plane 1's port lost its carrier: it sends and stamps nothing
    assert tx.poll(1.0 + rto + 0.01) and tx.stats.timeouts == 1


def test_a_receiver_late_by_less_than_the_timer_floor_times_nothing_out():
    """The floor is an allowance on top of the path's RTT: a 12 ms round trip with a 28 ms floor, and
    the receiving host not scheduled for 24 ms (less than the floor, which the fidelity monitor
    lets an endpoint wait): its SACKs come up to 37 ms after the packets left, and none times out.
    A floor that counted the RTT against it timed out every packet in flight."""
    chan = Channel(random.Random(5), delay_s=(0.006, 0.006))
    chan.stall_rx = (0.1, 0.124)
    s = TransportSettings(payload_bytes=1024, window_packets=16, region_bytes=4 << 20, min_rto_s=0.028, nscc=False)
    o = run([random.Random(3).randbytes(300_000)], chan, settings=s)
    _check(o, 1, False)
    assert o.t_end > 0.124 and o.sender.rtt.min_rtt == pytest.approx(0.012, abs=0.002)
    assert o.sender.stats.timeouts == 0


def _lost_packet_sender():
    """(sender, sack) for the two tests below: one QP h0 -> h2 with an 8-packet window, a 20 ms
    timer floor, no NSCC and no probes; ``sack(pkts, now, skip_ev)`` acknowledges the first
    transmissions among ``pkts``, but those sent on ``skip_ev``, in one SACK at ``now``."""
    s = TransportSettings(payload_bytes=1024, window_packets=8, region_bytes=1 << 20, min_rto_s=0.02, nscc=False,
                          probes=False)
    tx = make_sender(1, PLAN, "h0", "h2", s, random.Random(1), iter([(m, bytes(16 * 1024)) for m in range(8)]))

    def sack(pkts, now, skip_ev=None):
        got = [p for p in pkts if not p.flags & H.F_RETX and p.ev != skip_ev]
        base = min(p.psn for p in got)
        bm = sum(1 << (p.psn - base) for p in got)
        tx.on_packet(Pkt(op=H.OP_SACK, qp=1, ev=got[0].ev, cum_psn=0, base_psn=base, bitmap=bm, echo_ev=got[0].ev,
                         echo_psn=got[0].psn, port_state=0xFF), now)

    return tx, sack


def test_an_ev_a_resent_packet_died_on_is_retired_one_timer_after_it_left_not_after_its_backoff():
    """PSN 0 is lost and resent at 23 ms onto another EV, which is dead: nothing sent on it comes
    back, while packets sent later on the others do (RACK's evidence). The resend's own timer is
    twice the RTO (44 ms: it is resent at 67 ms), but its EV is judged one RTO after it left
    (45 ms): a backup EV through a dead T1 carries resent packets first and was retired a timer
    late (t1-blackhole, both data planes)."""
    tx, sack = _lost_packet_sender()

    first = tx.poll(0.0)
    sack(first[1:], 0.002)  # an RTT of 2 ms: the RTO is 22 ms; PSN 0 never arrives
    again = tx.poll(0.023)  # PSN 0 times out and is resent first, new data behind it
    dead = next(p.ev for p in again if p.psn == 0 and p.flags & H.F_RETX)
    sack(again, 0.026, skip_ev=dead)
    later = tx.poll(0.030)
    sack(later, 0.033, skip_ev=dead)  # packets sent 7 ms after the resend arrive; none on its EV
    assert tx.evs.evs[dead].state == "GOOD"
    tx.poll(0.044)
    assert tx.evs.evs[dead].state == "GOOD"  # not yet one RTO since the resend left
    tx.poll(0.046)
    assert tx.evs.evs[dead].state == "ASSUMED_BAD"
    assert tx.recs[0].tx == 2  # the resend itself still waits out its backoff


def test_a_resend_its_port_held_has_its_ev_judged_a_timer_after_its_stamp():
    """As above, with the ports stamping: the resend of PSN 0 (handed over at 23 ms) is held in its
    port until 50 ms. At 46 ms it has no stamp (still there), at 68 ms it has left 18 ms before:
    its EV is judged a timer after it left (72 ms), not a timer after the first look (68 ms)."""
    tx, sack = _lost_packet_sender()
    tx.wire_ports = (1 << PLAN.spec.planes) - 1

    def sent(pkts, t, hold=()):  # every packet leaves its port as it is handed over, but those held
        for p in pkts:
            if p.psn not in hold:
                tx.left_nic(p.psn, t, t)

    first = tx.poll(0.0)
    sent(first, 0.0)
    sack(first[1:], 0.002)  # an RTT of 2 ms: the RTO is 22 ms; PSN 0 never arrives
    again = tx.poll(0.023)  # PSN 0 times out and is resent first, new data behind it
    dead = next(p.ev for p in again if p.psn == 0 and p.flags & H.F_RETX)
    sent(again, 0.023, hold={0})
    sack(again, 0.026, skip_ev=dead)
    later = tx.poll(0.030)
    sent(later, 0.030)
    sack(later, 0.033, skip_ev=dead)  # packets sent 7 ms after the resend arrive; none on its EV
    tx.poll(0.046)
    assert tx.evs.evs[dead].state == "GOOD"  # one RTO since its hand-off, but still in its port
    tx.left_nic(0, 0.023, 0.050)  # its port lets it go
    assert tx.recs[0].t_wire == 0.050
    tx.poll(0.069)
    assert tx.evs.evs[dead].state == "GOOD"  # a timer after the first look, 19 ms after it left
    tx.poll(0.073)
    assert tx.evs.evs[dead].state == "ASSUMED_BAD"  # a timer after it left: nothing came back


def test_the_receiver_counts_first_transmissions_that_arrive_behind_a_later_one_on_their_ev():
    """A path is one FIFO: a first transmission arriving whole behind a later first transmission of
    its EV is the network reordering (the emulator's fault, experiments/analysis/fidelity.py "paths
    reordered"). Reordering across EVs (spraying), a retransmission and a trimmed header are not."""
    rx = MrcReceiver(3, TransportSettings(ack_every=1), lambda: make_ev(0, 0, 1))
    ev_a, ev_b = make_ev(1, 0, 2), make_ev(2, 1, 3)

    def arrive(psn, ev, flags=0, payload=1024):
        p = Pkt(H.OP_WRITE, 3, psn, ev, flags, psn, 1024, H.crc32(bytes(1024)), 0, psn * 1024, rx._rkey,
                1024, bytes(payload), None, 0xFF, False)  # message psn: one packet each
        rx.on_packet(p, 1.0)
        return rx.stats.reordered

    assert arrive(1, ev_b) == 0
    assert arrive(0, ev_a) == 0  # behind PSN 1, but on another EV: spraying's reordering
    assert arrive(4, ev_a) == 0
    assert arrive(2, ev_a, H.F_TRIM, payload=0) == 0  # a trimmed header overtakes by design
    assert arrive(3, ev_a) == 1  # sent on ev_a before PSN 4, arrived after it
    assert arrive(2, ev_a, H.F_RETX) == 1  # a retransmission is sent after what it follows
    assert arrive(5, ev_a) == 1
    assert rx.stats.duplicates == 0
