"""Collective schedules (traffic/collective.py): ring order, chunking and step dependencies, then
whole collectives between HostStacks over an in-process frame network that drops and reorders:
the result is what the collective defines, byte-identical at every host."""

import heapq
import random

import numpy as np
import pytest
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import ClosSpec
from mrclab.traffic.collective import (
    KINDS,
    QP_BASE,
    Collective,
    bus_factor,
    chunks,
    expected_result,
    initial_data,
)
from mrclab.traffic.host import HostStack
from mrclab.traffic.settings import TransportSettings

RANKS = ["h0", "h1", "h2", "h3"]


def test_chunks_cover_the_buffer_in_order_the_first_ones_a_byte_longer():
    assert chunks(10, 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert sum(ln for _, ln in chunks(1001, 7)) == 1001


def test_bus_bandwidth_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    with pytest.raises(ValueError, match="allowed: all_reduce, all_gather, all_to_all"):
        bus_factor("broadcast", 8)


def test_ring_all_reduce_sends_what_it_just_reduced_and_ends_owning_its_successor_chunk():
    n = len(RANKS)
    for r, host in enumerate(RANKS):
        c = Collective("all_reduce", RANKS, host, 4000, 1)
        assert c.steps == 2 * (n - 1) and c.to == [RANKS[(r + 1) % n]] and c.frm == [RANKS[(r - 1) % n]]
        for s in range(c.steps - 1):
            assert c.send_chunk(s + 1) == c.recv_chunk(s)  # a step forwards what the last one brought
        assert c.recv_chunk(n - 2) == (r + 1) % n  # after reduce-scatter: owns the reduced chunk r+1
        assert c.send_chunk(n - 1) == (r + 1) % n  # ... and sends it first in the all-gather
        # what my predecessor sends at a step is what I expect to receive at it
        pred = Collective("all_reduce", RANKS, RANKS[(r - 1) % n], 4000, 1)
        assert all(pred.send_chunk(s) == c.recv_chunk(s) for s in range(c.steps))


def test_a_step_waits_for_the_previous_steps_data():
    c = Collective("all_reduce", RANKS, "h1", 4000, 1, qps_per_peer=2)
    c.start(lambda: 0.0)
    src = c.sources()
    first = {k: next(it) for k, it in src.items()}
    assert all(v is not None and v[0] == 0 for v in first.values())  # step 0 needs nothing
    assert all(next(it) is None for it in src.values())  # step 1 waits for h0's step 0
    off, ln = c.parts[c.recv_chunk(0)]
    (a0, l0), (a1, l1) = chunks(ln, 2)
    other = initial_data(1, 0, 0, 4000)
    c.on_message("h0", QP_BASE, 0, other[off + a0 : off + a0 + l0])
    assert all(next(it) is None for it in src.values())  # half the step (one QP of two) is not enough
    c.on_message("h0", QP_BASE + 1, 0, other[off + a1 : off + a1 + l1])
    nxt = [next(it) for it in src.values()]
    assert all(v is not None and v[0] == 1 for v in nxt)
    sent = np.frombuffer(b"".join(v[1] for v in nxt), dtype=np.uint8)
    mine = np.frombuffer(initial_data(1, 1, 0, 4000), dtype=np.uint8)
    assert (sent == mine[off : off + ln] + np.frombuffer(other[off : off + ln], dtype=np.uint8)).all()


def test_bad_collectives_are_refused():
    with pytest.raises(ValueError, match="allowed: all_reduce"):
        Collective("reduce", RANKS, "h0", 100, 1)
    with pytest.raises(ValueError, match="2 or more distinct hosts"):
        Collective("all_reduce", ["h0"], "h0", 100, 1)
    with pytest.raises(ValueError, match="one byte per part"):
        Collective("all_to_all", RANKS, "h0", 7, 1, qps_per_peer=2)


# ---- whole collectives over HostStacks ----------------------------------------------------------
SPEC = ClosSpec.from_dict({"planes": 2, "t0_per_plane": 2, "t1_per_plane": 2, "hosts_per_t0": 2}, source="test")
PLAN = AddressPlan(SPEC)


def run_collective(kind: str, size: int, iterations: int, q: int, transport: str, drop: float, seed: int,
                   limit_s: float = 60.0):
    """Every host of SPEC in one collective; frames cross an in-process network that delays each
    by 0.5-2 ms (so they reorder) and drops ``drop`` of them. Returns the collectives."""
    rng = random.Random(seed)
    hosts = SPEC.hosts()
    st = TransportSettings(region_bytes=1 << 20, min_rto_s=0.005, initial_rto_s=0.05)
    stacks, colls = {}, {}
    for h in hosts:
        stacks[h] = HostStack(PLAN, h, st, transport=transport, seed=seed + hosts.index(h))
        colls[h] = Collective(kind, hosts, h, size, iterations, q, seed=seed)
        stacks[h].add_collective(colls[h])
    now, dt, heap, n = 0.0, 0.0005, [], 0
    for c in colls.values():
        c.start(lambda: now)
    addr = {str(PLAN.nic_address(h)): h for h in hosts}

    def to_host(frame: bytes) -> str:
        import ipaddress

        return addr[str(ipaddress.IPv6Address(frame[14 + 40 + 24 : 14 + 40 + 40]))]

    while now < limit_s and not all(c.finished for c in colls.values()):
        for h, stack in stacks.items():
            for _plane, frame in stack.poll(now):
                if rng.random() >= drop:
                    n += 1
                    heapq.heappush(heap, (now + rng.uniform(0.0005, 0.002), n, to_host(frame), frame))
        while heap and heap[0][0] <= now:
            _, _, h, frame = heapq.heappop(heap)
            for _plane, back in stacks[h].on_frame(frame, now):
                if rng.random() >= drop:
                    n += 1
                    heapq.heappush(heap, (now + rng.uniform(0.0005, 0.002), n, to_host(back), back))
        now += dt
    return colls


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("transport,drop,q", [("mrc", 0.0, 1), ("mrc", 0.02, 2), ("roce", 0.01, 1)])
def test_every_host_ends_with_what_the_collective_defines(kind, transport, drop, q):
    size, iterations = 12_000, 2
    colls = run_collective(kind, size, iterations, q, transport, drop, seed=3)
    hosts = SPEC.hosts()
    assert all(c.finished for c in colls.values()), {h: (c.iteration, c.step) for h, c in colls.items()}
    for r, h in enumerate(hosts):
        c = colls[h]
        assert len(c.done) == iterations
        assert c.buf.tobytes() == expected_result(kind, 3, len(hosts), r, iterations - 1, size)
        assert all(a.end_s >= a.start_s for a in c.done)
    if kind in ("all_reduce", "all_gather"):  # byte-identical everywhere
        assert len({colls[h].buf.tobytes() for h in hosts}) == 1
