"""Wire format: frames round-trip through the struct codec and dissect with the scapy layers; and
fuzzing: malformed, truncated, unknown-QP and out-of-window frames are counted and dropped, the
stack never raises and never corrupts a delivered message."""

import dataclasses
import random
import struct
import subprocess
import sys
import time
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, ev_plane, ev_t1, make_ev
from mrclab.topologies.spec import load_spec
from mrclab.traffic import layers  # noqa: F401 (binds the MRC layers to UDP 4791 for Ether())
from mrclab.traffic.host import HostStack
from mrclab.traffic.packet import Pkt
from mrclab.traffic.region import message_source
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.wire import Wire
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

PLAN = AddressPlan(load_spec())
S = TransportSettings(payload_bytes=512, window_packets=16, region_bytes=1 << 16)


def data_pkt(**kw):
    base = dict(op=H.OP_WRITE_IMM, qp=3, psn=77, ev=make_ev(2, 1, 0xBEEF), flags=H.F_RETX, msn=5, msg_len=2048,
                msg_crc=0xDEADBEEF, msg_offset=512, va=4096 + 512, rkey=0x4D520003, dma_len=4, payload=b"abcd",
                imm=99, port_state=0x0B)
    base.update(kw)
    return Pkt(**base)


def test_data_frame_roundtrip_and_scapy_dissection():
    tx, rx = Wire(PLAN, "h0"), Wire(PLAN, "h2")
    p = data_pkt()
    plane, f = tx.encode(p, "h2")
    assert plane == 2 and len(f) == H.DATA_HDR + 4 + 4 + 4  # headers, IMM, payload, ICRC
    src, q = rx.decode(f)
    assert src == "h0"
    for k in ("op", "qp", "psn", "ev", "flags", "msn", "msg_len", "msg_crc", "msg_offset", "va", "rkey", "dma_len",
              "imm", "port_state"):
        assert getattr(q, k) == getattr(p, k), k
    assert q.payload == b"abcd"
    # the send stamp: the sender's clock as the frame was made (100 us units, mod 2^16)
    assert (int(time.monotonic() * H.STAMP_HZ) - q.stamp) & 0xFFFF < 10 * H.STAMP_HZ // 1000  # within 10 ms
    e = Ether(f)
    assert e["MRCX"].stamp == q.stamp
    assert e["BTH"].opcode == H.OP_WRITE_IMM and e["BTH"].psn == 77 and e["BTH"].dqpn == 3
    assert e["MRCX"].msn == 5 and e["RETH"].va == 4608 and e["ImmDt"].imm == 99
    outer = e.getlayer("IPv6", 1)
    assert outer.dst == str(PLAN.path("h0", "h2", 2, 1).outer_dst) and outer.fl == 0xBEEF
    assert e["UDP"].sport == make_ev(2, 1, 0xBEEF) & 0xFFFF and e["UDP"].dport == 4791


def test_header_templates_are_byte_identical_to_scapys():
    # the endpoint builds Ethernet .. UDP with struct (no scapy on its start-up path); scapy, the
    # layers' reference, builds the same bytes for every host, peer and plane of the fabric
    for host in PLAN.spec.hosts():
        w = Wire(PLAN, host)
        for peer in PLAN.spec.hosts():
            for plane in range(PLAN.spec.planes):
                ref = bytes(Ether(src=PLAN.host_mac(host, plane), dst=PLAN.gateway_mac(host, plane))
                            / IPv6(src=str(PLAN.port_address(host, plane)), dst="::", nh=41, hlim=64)
                            / IPv6(src=str(PLAN.nic_address(host)), dst=str(PLAN.nic_address(peer)), nh=17, hlim=64)
                            / UDP(sport=0, dport=H.UDP_PORT, chksum=0))
                assert w._template(peer, plane) == ref, (host, peer, plane)


def test_the_endpoint_starts_without_scapy_or_numpy():
    # numpy is imported by a collective's hosts only, when their config names one
    r = subprocess.run([sys.executable, "-c", "import sys, mrclab.traffic.endpoint; "
                        "print(sorted({m.split('.')[0] for m in sys.modules} & {'scapy', 'numpy'}))"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_cached_prefixes_follow_each_packets_ev_and_length():
    """One Wire, packets of several EVs, lengths and opcodes interleaved (so cached prefixes are
    reused): every frame decodes to its own fields and its length fields match its size."""
    tx, rx = Wire(PLAN, "h0"), Wire(PLAN, "h2")
    rng = random.Random(7)
    evs = [make_ev(pl, t1, rng.randrange(1, 1 << 16)) for pl in range(4) for t1 in range(2)]
    for k in range(60):
        ev, n = rng.choice(evs), rng.choice([1, 3, 512, 1024])
        op = rng.choice([H.OP_WRITE, H.OP_WRITE_IMM, H.OP_SACK])
        if op == H.OP_SACK:
            p = Pkt(op=op, qp=3, ev=ev, cum_psn=k, base_psn=k, bitmap=k, echo_ev=ev, echo_psn=k, port_state=0x0F)
        else:
            p = data_pkt(op=op, ev=ev, psn=k, dma_len=n, payload=rng.randbytes(n),
                         imm=k if op == H.OP_WRITE_IMM else None)
        f = tx.encode(p, "h2")[1]
        src, q = rx.decode(f)
        assert src == "h0" and (q.op, q.ev, q.psn if op != H.OP_SACK else q.echo_psn) == (op, ev, k)
        if op != H.OP_SACK:
            assert bytes(q.payload) == p.payload and q.imm == p.imm and q.dma_len == n
        e = Ether(f)
        outer, inner = e.getlayer("IPv6", 1), e.getlayer("IPv6", 2)
        assert outer.plen == len(f) - 14 - 40 and inner.plen == len(f) - 14 - 80 == e["UDP"].len
        assert outer.fl == ev >> 16 and e["UDP"].sport == ev & 0xFFFF
        assert outer.dst == str(PLAN.path("h0", "h2", ev >> 12 & 0xF, ev & 0xFFF).outer_dst)


def test_sack_and_probe_roundtrip():
    tx, rx = Wire(PLAN, "h2"), Wire(PLAN, "h0")
    s = Pkt(op=H.OP_SACK, qp=3, ev=make_ev(1, 0, 4), cum_psn=10, base_psn=12, bitmap=(1 << 63) | 5,
            echo_ev=make_ev(3, 1, 9), echo_psn=75, sflags=H.S_ECN, port_state=0x0E)
    _, q = rx.decode(tx.encode(s, "h0")[1])
    assert (q.op, q.cum_psn, q.base_psn, q.bitmap, q.echo_ev, q.echo_psn, q.sflags, q.port_state, q.echo_wire) == \
        (H.OP_SACK, 10, 12, (1 << 63) | 5, make_ev(3, 1, 9), 75, H.S_ECN, 0x0E, H.NO_WIRE)
    s.echo_wire = 1234  # 123.4 ms on the way
    assert (rx.decode(tx.encode(s, "h0")[1])[1].echo_wire == 1234
            and Ether(tx.encode(s, "h0")[1])["SACK"].echo_wire == 1234)
    pr = Pkt(op=H.OP_PROBE, qp=3, ev=make_ev(0, 1, 2), probe_id=42, is_reply=0, t_send_ns=123456789)
    e = Ether(tx.encode(pr, "h0")[1])
    assert e["MRCProbe"].probe_id == 42 and e["MRCProbe"].ev == make_ev(0, 1, 2)


def _reseal(f: bytearray) -> bytes:
    """Recompute the ICRC of a frame whose transport fields a test rewrote (a well-formed hostile packet)."""
    ulen = struct.unpack_from("!H", f, H.OFF_UDP + 4)[0]
    end = H.OFF_UDP + ulen - 4
    struct.pack_into("!I", f, end, zlib.crc32(bytes(f[H.OFF_BTH:end])))
    return bytes(f)


def _stack_pair():
    a = HostStack(PLAN, "h0", S, seed=1)
    b = HostStack(PLAN, "h2", S, seed=2)
    msgs = [m for _, m in zip(range(3), message_source(7, 3000, None))]
    a.add_sender(1, "h2", iter(enumerate([m[1] for m in msgs])))
    return a, b, [m[1] for m in msgs]


def _valid_frames(n=12):
    a, b, _ = _stack_pair()
    frames = []
    for plane, frame in a.poll(0.0)[:n]:
        frames.append(frame)
    return frames


FRAMES = _valid_frames()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_fuzzed_frames_are_dropped_and_never_corrupt_delivered_messages(data):
    a, b, msgs = _stack_pair()
    kind = data.draw(st.sampled_from(["random", "truncate", "flip", "qp", "window", "field"]))
    base = bytearray(data.draw(st.sampled_from(FRAMES)))
    if kind == "random":
        junk = data.draw(st.binary(min_size=0, max_size=400))
    elif kind == "truncate":
        junk = bytes(base[: data.draw(st.integers(0, len(base) - 1))])
    elif kind == "flip":
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] ^= data.draw(st.integers(1, 255))
        junk = bytes(base)
    elif kind == "qp":
        base[H.OFF_BTH + 5 : H.OFF_BTH + 8] = data.draw(st.integers(2, 0xFFFFFF)).to_bytes(3, "big")
        junk = _reseal(base)
    elif kind == "window":
        base[H.OFF_BTH + 9 : H.OFF_BTH + 12] = data.draw(st.integers(S.max_psn_window, 0x7FFFFF)).to_bytes(3, "big")
        junk = _reseal(base)
    else:  # well-formed, sealed, with a hostile length, offset or rkey
        off = H.OFF_BODY + data.draw(st.sampled_from([4, 12, 24, 32]))
        base[off : off + 4] = data.draw(st.integers(0, 0xFFFFFFFF)).to_bytes(4, "big")
        junk = _reseal(base)
    # the hostile frame first, then the real transfer, both ways, until done
    for plane, frame in b.on_frame(junk, 0.0):
        pass
    now = 0.0
    for _ in range(4000):
        for _, frame in a.poll(now):
            for _, rb in b.on_frame(frame, now):
                a.on_frame(rb, now)
        for _, rb in b.poll(now):
            a.on_frame(rb, now)
        if a.done:
            break
        now += 0.001
    rx = b.receivers[("h0", 1)]
    if kind == "field":
        # sealed and plausible (e.g. a false msg_len): not detectable per packet. The message
        # CRC still stops it being delivered as intact; liveness of that message is not promised.
        assert rx.stats.messages_delivered + rx.stats.messages_corrupt <= 3
        return
    assert a.done
    assert rx.stats.messages_corrupt == 0
    assert rx.stats.messages_delivered == 3  # exactly once each
    if kind in ("random", "truncate"):
        assert sum(b.dropped().values()) >= 1  # refused and counted (a flip may hit an unchecked MAC byte)


def test_unknown_qp_and_out_of_window_are_counted():
    a, b, _ = _stack_pair()
    f = bytearray(FRAMES[0])
    f[H.OFF_BTH + 9 : H.OFF_BTH + 12] = (S.max_psn_window + 5).to_bytes(3, "big")
    b.on_frame(_reseal(f), 0.0)
    assert b.dropped().get("out of window") == 1
    sack = Pkt(op=H.OP_SACK, qp=999, ev=make_ev(0, 0, 1))
    a.on_frame(Wire(PLAN, "h2").encode(sack, "h0")[1], 0.0)
    assert a.dropped().get("unknown QP") == 1
    b.on_frame(b"\x00" * 20, 0.0)
    assert b.dropped().get("not IPv6 or too short") == 1


def test_reverse_evs_through_a_dead_path_leave_the_rotation_and_come_back():
    from mrclab.topologies.addressing import ev_from_wire, ev_plane, ev_t1

    a = HostStack(PLAN, "h0", S, seed=1)
    b = HostStack(PLAN, "h2", S, seed=2)
    a.add_sender(1, "h2", message_source(3, 4096, None))
    dead = {"on": True}

    def path_of(f):
        ev = ev_from_wire(struct.unpack_from("!H", f, H.OFF_UDP)[0], struct.unpack_from("!I", f, H.OFF_OUTER)[0])
        return ev_plane(ev), ev_t1(ev)

    now = 0.0
    for step in range(1500):
        if step == 800:
            dead["on"] = False
        for _, f in a.poll(now):
            if dead["on"] and path_of(f) == (1, 0):
                continue
            for _, g in b.on_frame(f, now):
                if not (dead["on"] and path_of(g) == (1, 0)):
                    a.on_frame(g, now)
        for _, g in b.poll(now):
            if not (dead["on"] and path_of(g) == (1, 0)):
                for _, h in a.on_frame(g, now):
                    if not (dead["on"] and path_of(h) == (1, 0)):
                        b.on_frame(h, now)
        if step == 700:
            r = b.reverse["h0"]
            cut = [ev for ev in r.evs if (ev_plane(ev), ev_t1(ev)) == (1, 0)]
            assert cut and set(cut) <= r.bad  # probed, unanswered, out of the rotation
            assert all(b._reverse_ev("h0") not in cut for _ in range(3 * len(r.evs)))
        now += 0.001
    assert not b.reverse["h0"].bad  # answered again once the path healed


def _both_ways_over_a_dead_path(back: bool) -> tuple[HostStack, list[set[int]]]:
    """h0 sends to h2 (and h2 to h0 when ``back``) while plane 1's path through T1 0 drops every
    frame for the first 0.8 s; h2's stack and its reverse EVs towards h0 that are out of the
    rotation at 0.7 s and at the end (1.5 s)."""
    from mrclab.topologies.addressing import ev_from_wire

    a = HostStack(PLAN, "h0", S, seed=1)
    b = HostStack(PLAN, "h2", S, seed=2)
    a.add_sender(1, "h2", message_source(3, 4096, None))
    if back:
        b.add_sender(1, "h0", message_source(4, 4096, None))

    def lost(f, now):
        ev = ev_from_wire(struct.unpack_from("!H", f, H.OFF_UDP)[0], struct.unpack_from("!I", f, H.OFF_OUTER)[0])
        return now < 0.8 and (ev_plane(ev), ev_t1(ev)) == (1, 0)

    bad = []
    now = 0.0
    line = [(src, f) for src in (a, b) for _, f in src.poll(now)]
    for step in range(1500):
        now = step * 0.001
        line += [(src, f) for src in (a, b) for _, f in src.poll(now)]
        while line:
            src, f = line.pop(0)
            if lost(f, now):
                continue
            dst = b if src is a else a
            line += [(dst, g) for _, g in dst.on_frame(f, now)]
        if step == 700:
            bad.append(set(b.reverse["h0"].bad))
    bad.append(set(b.reverse["h0"].bad))
    return b, bad


def test_reverse_evs_on_the_paths_a_hosts_own_data_crosses_are_judged_by_it_not_probed():
    """MRC keeps the reverse EV set fresh by probes "when no data flows back": where h2 also sends
    to h0, the paths its data crosses say which reverse EVs work, and h2 probes only the rest. A
    path that drops everything is out of the rotation either way, and back once it heals."""
    one_way, bad_one_way = _both_ways_over_a_dead_path(back=False)
    both, bad_both = _both_ways_over_a_dead_path(back=True)
    for b, (at_700, at_end) in ((one_way, bad_one_way), (both, bad_both)):
        cut = {ev for ev in b.reverse["h0"].evs if (ev_plane(ev), ev_t1(ev)) == (1, 0)}
        assert cut and at_700 == cut, (at_700, cut)  # out of the rotation while dead, nothing else
        assert not at_end  # back once healed
    assert both.rev_probes.sent < one_way.rev_probes.sent / 4, (both.rev_probes.sent, one_way.rev_probes.sent)
    judged = both.data_paths(1.5)["h0"]
    assert judged and all(judged.values())  # h2's data vouches for its paths once all work


def test_a_path_whose_evs_an_ecn_mark_skips_is_judged_by_its_delivery_before_the_skip():
    """A SKIP EV is congested, not broken (the mark that skipped it came back on a delivered
    packet), and passed over for its hold: its path's delivery from before the hold judges the
    reverse EVs through it until the hold ends, rather than leaving them to probes (fig. 17's
    incast marks every EV at its last hop: skips left paths unused and their reverse EVs probed,
    0.036 of the data bytes, 2026-12-07). After the hold, nothing judges it."""
    from mrclab.traffic.evs import EvState

    b = HostStack(PLAN, "h2", S, seed=2)
    b.add_sender(1, "h0", message_source(3, 4096, None))
    tx = b.senders[("h0", 1)]
    tx.rtt.sample(0.02, 0.0)
    hold = S.ecn_skip_rtts * tx.rtt.srtt
    same = PLAN.spec.group_of("h2") == PLAN.spec.group_of("h0")
    path = lambda ev: (ev_plane(ev), None if same else ev_t1(ev))  # noqa: E731
    active = [ev for ev, st in tx.ev_states().items() if st is EvState.GOOD and tx.evs.evs[ev].active]
    hot = path(active[0])
    t0 = 1.0
    for ev in tx.ev_states():
        tx.delivered_after[ev] = t0
        if path(ev) == hot:
            tx.evs.skip(ev, "ECN mark", t0 + hold)
    assert {path(ev) for ev in tx.ev_states()} != {hot}  # other paths: their EVs keep delivering
    for now in (t0 + S.probe_timeout_s + hold / 2, t0 + S.probe_timeout_s + hold + 0.01):
        for ev in tx.ev_states():
            if path(ev) != hot:
                tx.delivered_after[ev] = now
        judged = b.data_paths(now)["h0"]
        if now < t0 + S.probe_timeout_s + hold:
            assert judged.get(hot) is True, judged  # within the hold: the skip's path still works
        else:
            assert hot not in judged, judged  # after it: nothing says, its reverse EVs are probed
        assert all(judged.get(path(ev)) for ev in tx.ev_states() if path(ev) != hot)


def _reverse_evs_over_a_slow_path(settings: TransportSettings, one_way_s: float, until_s: float):
    """h0 sends to h2 over frames that take ``one_way_s`` each way; h2's reverse EV set towards
    h0 after ``until_s`` and the probes it sent."""
    import heapq

    a = HostStack(PLAN, "h0", settings, seed=1)
    b = HostStack(PLAN, "h2", settings, seed=2)
    a.add_sender(1, "h2", message_source(50, 4096, None))
    line: list = []  # (arrival, n, to, frame)
    n, now = 0, 0.0
    while now < until_s:
        for src, dst in ((a, b), (b, a)):
            for _, frame in src.poll(now):
                heapq.heappush(line, (now + one_way_s, n := n + 1, dst, frame))
        while line and line[0][0] <= now:
            _, _, dst, f = heapq.heappop(line)
            for _, rb in dst.on_frame(f, now):
                heapq.heappush(line, (now + one_way_s, n := n + 1, a if dst is b else b, rb))
        now += 0.005
    return b.reverse["h0"], b.rev_probes.sent


def test_a_round_trip_longer_than_the_probe_timeout_keeps_its_reverse_evs_once_the_runner_raises_it():
    # a slow fabric (lab64 on bmv2: 0.54 s RTT) answered every reverse probe after its 0.2 s
    # timeout: each counted as lost, every reverse EV left the rotation, and rounds every 50 ms
    # sent more probes than data. The runner raises the probe timers to the retransmission floor
    from mrclab.experiments.run.settings import slow_path_timers

    slow = dataclasses.replace(S, min_rto_s=1.2)
    r, sent_default = _reverse_evs_over_a_slow_path(slow, 0.25, 3.0)
    assert r.bad == set(r.evs)  # all answered late: all out of the rotation
    raised, said = slow_path_timers(slow, {})
    assert said == {"max_rto_s": 1.2, "probe_timeout_s": 1.2, "probe_interval_s": 0.3}
    assert (raised.probe_timeout_s, raised.probe_interval_s, raised.max_rto_s) == (1.2, 0.3, 1.2)
    r, sent_raised = _reverse_evs_over_a_slow_path(raised, 0.25, 3.0)
    assert not r.bad and sent_raised < sent_default / 2, (r.bad, sent_raised, sent_default)
    assert slow_path_timers(S, {}) == (S, {})  # a floor under the probe timeout and the ceiling: as given
    given, _ = slow_path_timers(dataclasses.replace(slow, probe_timeout_s=0.3),
                                {"probe_timeout_s": 0.3, "max_rto_s": 1})
    assert (given.probe_timeout_s, given.probe_interval_s, given.max_rto_s) == (0.3, S.probe_interval_s, 1.0)


def test_spray_off_holds_each_mrc_qp_to_the_baselines_hashed_path():
    """``spray: off`` (the permutation test's ablation): an MRC QP keeps to the one EV the RoCE
    baseline's ECMP hash gives the same (src, dst, QP, seed); on, it sprays over every plane."""
    from mrclab.traffic.roce import ecmp_ev

    msgs = iter([(0, b"x" * 4096)])
    on = HostStack(PLAN, "h0", S, seed=1).add_sender(1, "h2", msgs)
    assert {ev_plane(ev) for ev in on.evs.active()} == set(range(PLAN.spec.planes))
    off_stack = HostStack(PLAN, "h0", dataclasses.replace(S, spray=False), seed=1)
    for qp in (1, 2, 3):
        off = off_stack.add_sender(qp, "h2", iter([(0, b"x" * 4096)]))
        assert off.evs.active() == [ecmp_ev(PLAN, "h0", "h2", qp, 1)]


def test_a_receive_regions_resident_pages_are_counted_once_as_messages_first_land():
    """The pages a receive region has been written in are counted (whole pages, once: a wrapped
    ring writes the same pages again), up to the region's size: the part of an endpoint's
    resident memory that is registered memory, not state (rss_growth leaves it out)."""
    from mrclab.traffic.region import PAGE_BYTES, ReceiveRegion
    from mrclab.traffic.stats import ReceiverStats

    size = 16 * PAGE_BYTES
    region = ReceiveRegion(size, ReceiverStats(), lambda msn: None)
    before = ReceiveRegion.resident_total
    msg = PAGE_BYTES + 100  # a page and a bit: each message ends inside a page
    data = bytes(msg)
    crc = H.crc32(data)
    placed = []
    for msn in range(40):  # wraps twice
        va = (msn * msg) % (size - size % msg)
        assert region.receive(msn, msg, crc, 0, va, data, msg, None) is None
        placed.append(va + msg)
        assert ReceiveRegion.resident_total - before == \
            -(-min(max(placed), size) // PAGE_BYTES) * PAGE_BYTES
    assert ReceiveRegion.resident_total - before <= size
    assert region.stats.messages_delivered == 40


def test_a_stamped_frame_says_whose_data_packet_it_was_behind_a_vxlan_tunnel_too():
    """A NIC departure stamp (traffic/txstamp.py) comes back with the frame's first bytes: a data
    packet names its peer, QP, PSN and send stamp; a control frame nothing. A host port that is a
    VXLAN tunnel to a switch on another server is stamped by its underlay port, the frame inside
    the tunnel's headers (scapy's VXLAN, RFC 7348): read through them."""
    from mrclab.traffic.txstamp import HEAD_BYTES
    from scapy.layers.inet import IP
    from scapy.layers.vxlan import VXLAN

    tx = Wire(PLAN, "h0")
    p = data_pkt()
    _plane, f = tx.encode(p, "h2")
    assert tx.sent_data(f[:HEAD_BYTES]) == ("h2", p.qp, p.psn, Ether(f)["MRCX"].stamp)
    tunnelled = bytes(Ether() / IP(src="198.18.0.1", dst="198.18.0.2") / UDP(sport=40000, dport=4789)
                      / VXLAN(vni=7) / Ether(f))
    assert tx.sent_data(tunnelled[:HEAD_BYTES]) == tx.sent_data(f[:HEAD_BYTES])
    other_udp = bytes(Ether() / IP() / UDP(dport=4790) / VXLAN(vni=7) / Ether(f))
    assert tx.sent_data(other_udp[:HEAD_BYTES]) is None
    sack = Pkt(H.OP_SACK, 3, 10, make_ev(1, 0, 5))
    assert tx.sent_data(tx.encode(sack, "h2")[1][:HEAD_BYTES]) is None
    assert tx.sent_data(f[:100]) is None  # too short to hold the transport headers


def test_an_endpoint_counts_the_frames_a_port_refused_at_send_and_keeps_those_it_had_no_room_for():
    """A port down (ENETDOWN) drops the frame, counted; a full qdisc (ENOBUFS) keeps it in the
    backlog to send later, not counted."""
    import errno
    from collections import deque
    from types import SimpleNamespace

    from mrclab.traffic.endpoint import Endpoint

    def refuse(code):
        def send(frame):
            raise OSError(code, "refused")
        return send

    def frame(op: int, tag: bytes) -> bytes:  # a frame whose BTH opcode is ``op``
        return bytes(H.OFF_BTH) + bytes([op]) + tag

    a, b, c, d = (frame(H.OP_SACK, x) for x in (b"a", b"b", b"c", b"d"))
    ep = SimpleNamespace(_send_fn={0: refuse(errno.ENETDOWN), 1: refuse(errno.ENOBUFS)}, send_drops=0)
    ep._data_fn = ep._send_fn
    backlog = {0: deque(), 1: deque()}
    Endpoint._send(ep, [(0, a), (1, b)], backlog)
    assert ep.send_drops == 1 and list(backlog[1]) == [b] and not backlog[0]
    assert Endpoint._sent(ep, 0, c) is True and ep.send_drops == 2  # gone: dropped
    assert Endpoint._sent(ep, 1, d) is False and ep.send_drops == 2  # still to send
    # a stamped port: data frames leave through the stamped socket, control frames through the port's own
    sent: list[tuple[str, bytes]] = []
    ep._send_fn = {0: lambda f: sent.append(("port", f))}
    ep._data_fn = {0: lambda f: sent.append(("stamped", f))}
    data, imm = frame(H.OP_WRITE, b"w"), frame(H.OP_WRITE_IMM, b"i")
    Endpoint._send(ep, [(0, data), (0, a), (0, imm)], {0: deque()})
    assert Endpoint._sent(ep, 0, b) is True
    assert sent == [("stamped", data), ("port", a), ("stamped", imm), ("port", b)]
