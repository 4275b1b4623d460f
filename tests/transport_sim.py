"""A discrete-time harness that runs one sender and one receiver over a lossy in-process channel."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from channel import Channel
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, make_ev
from mrclab.topologies.spec import load_spec
from mrclab.traffic.contract import event_fields
from mrclab.traffic.receiver import MrcReceiver, probe_reply
from mrclab.traffic.region import RegionRing
from mrclab.traffic.roce import RoceReceiver, RoceSender, ecmp_ev
from mrclab.traffic.sender import make_sender
from mrclab.traffic.settings import TransportSettings

PLAN = AddressPlan(load_spec())


@dataclass
class Outcome:
    sender: object
    receiver: MrcReceiver
    messages: list[bytes]
    t_end: float
    events: list[tuple]
    steps: int = 0


def reverse_evs(planes: int = 4):
    cyc = itertools.cycle([make_ev(p, 0, 7) for p in range(planes)])
    return lambda: next(cyc)


def run(messages: list[bytes], chan: Channel, *, transport: str = "mrc", settings: TransportSettings | None = None,
        imm: bool = False, seed: int = 1, limit_s: float = 60.0, src: str = "h0", dst: str = "h2",
        hook=None, pin_ev: int | None = None, by_deadline: bool = False) -> Outcome:
    """Run ``messages`` from a sender to a receiver over ``chan`` until the sender is done or
    ``limit_s``. Time moves in 0.2 ms steps; ``by_deadline`` moves it as the endpoint's loop does
    instead: after a step with nothing sent or received, to the transports' ``next_due`` (at
    least 1 ms on, poll's unit) or the next arrival, whichever is first, with no other wake-up,
    so a timer a ``next_due`` leaves out is never run and the transfer stalls."""
    s = settings or TransportSettings(region_bytes=max(1 << 16, 2 * sum(len(m) for m in messages) + 4096))
    events: list[tuple] = []
    log = lambda e: events.append((e.kind, event_fields(e)))  # noqa: E731
    msgs = iter(enumerate(messages))
    if transport == "mrc":
        tx = make_sender(1, PLAN, src, dst, s, random.Random(seed), msgs, imm=imm, events=log, pin_ev=pin_ev)
        rx = MrcReceiver(1, s, reverse_evs(), events=log)
    else:
        tx = RoceSender(1, ecmp_ev(PLAN, src, dst, 1, seed), msgs, s, imm=imm, events=log)
        rx = RoceReceiver(1, s, reverse_evs(), events=log)
    now, dt = 0.0, 0.0002
    steps = 0
    while now < limit_s and not tx.done:
        steps += 1
        if hook:
            hook(now, tx, rx, chan)
        work = 0
        for p in tx.poll(now):
            chan.send(p, "rx", now)
            work += 1
        for to, p in chan.due(now):
            work += 1
            if to == "rx":
                if p.op == H.OP_PROBE:
                    chan.send(probe_reply(p, make_ev(0, 0, 9), 0xFF), "tx", now)
                else:
                    for r in rx.on_packet(p, now):
                        chan.send(r, "tx", now)
            else:
                tx.on_packet(p, now)
        for p in rx.poll(now):  # after the step's arrivals, as the endpoint polls after a receive batch
            chan.send(p, "tx", now)
            work += 1
        if tx.done:  # the transfer ends at this step, not at the next wake-up (a receiver's SACK repeat)
            break
        if by_deadline and not work:
            wake = max(now + 0.001, min(tx.next_due(now), rx.next_due(now)))
            arrival = chan.next_time()
            if arrival is not None:
                wake = min(wake, max(arrival, now + dt))
            now = wake
        else:
            now += dt
    return Outcome(tx, rx, messages, now, events, steps)


def delivered_intact(o: Outcome) -> bool:
    """Every message's bytes are in the receiver's region where the sender put them."""
    ring = RegionRing(o.receiver.s.region_bytes)
    for msn, m in enumerate(o.messages):
        base = ring.place(msn, len(m))
        if bytes(o.receiver.region.mem[base : base + len(m)]) != m:
            return False
    return True
