"""An in-process network for testing the pure transports: it drops, duplicates, reorders, delays,
trims and ECN-marks.

``Channel.send(pkt, to, now)`` schedules delivery; ``Channel.due(now)`` returns what arrives by
``now``. Each EV is one path: with ``fifo_per_ev`` (default) packets on the same EV keep their
order, as on a real path, while packets on different EVs overtake each other freely (spraying's
reordering). ``drop_ev`` drops everything on the EVs it names (a dead path). ``trim`` is the share
of data packets a switch would have trimmed (cut to their headers, flagged, sent ahead of the
queue: they overtake the packets of their EV), ``ce`` the share of data packets that arrive ECN CE,
``trim_ev`` trims everything on the EVs it names (a congested path). ``stall_rx`` = (start, end)
s: the receiving host is not scheduled meanwhile, so whatever reaches it waits in its socket until
``end``, and what it sends meanwhile leaves at ``end``. ``hold_ev`` = (EVs, start, end) s: data
packets sent on those EVs meanwhile are held on the way (an emulator's switch thread that did not
run) and arrive after ``end``, in order. ``hold_rev`` = (start, end) s: what the receiver sends
back meanwhile (SACKs, NACKs, probe replies) is held on the way and arrives after ``end`` (a busy
machine's kernel holding the reverse path), while data keeps flowing. Data packets get their send
stamp (protocol/headers.py ``STAMP_HZ``) on the channel's clock. All randomness comes from the seeded ``rng``.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from dataclasses import dataclass, field

from mrclab.protocol import headers as H

_DATA_OPS = (H.OP_WRITE, H.OP_WRITE_IMM)


@dataclass
class Channel:
    rng: random.Random
    drop: float = 0.0
    dup: float = 0.0
    delay_s: tuple[float, float] = (0.0005, 0.002)
    fifo_per_ev: bool = True
    drop_ev: set[int] = field(default_factory=set)
    drop_ev_rate: float = 1.0
    drop_once: dict[int, int] = field(default_factory=dict)  # ev -> how many of its next packets to drop
    trim: float = 0.0
    ce: float = 0.0
    trim_ev: set[int] = field(default_factory=set)
    ce_ev: set[int] = field(default_factory=set)
    drop_op: set[int] = field(default_factory=set)  # opcodes lost on the way (NACKs, say)
    stall_rx: tuple[float, float] | None = None
    hold_ev: tuple[set[int], float, float] | None = None
    hold_rev: tuple[float, float] | None = None
    trimmed: int = 0
    marked: int = 0
    _q: list = field(default_factory=list)
    _last_on_ev: dict = field(default_factory=dict)
    _n: int = 0
    delivered: int = 0
    dropped: int = 0

    def send(self, pkt, to: str, now: float) -> None:
        if self.drop_once.get(pkt.ev, 0) > 0:
            self.drop_once[pkt.ev] -= 1
            self.dropped += 1
            return
        if pkt.ev in self.drop_ev and self.rng.random() < self.drop_ev_rate:
            self.dropped += 1
            return
        if self.rng.random() < self.drop:
            self.dropped += 1
            return
        if pkt.op in self.drop_op:
            self.dropped += 1
            return
        if pkt.op in _DATA_OPS:
            if pkt.stamp < 0:  # the send stamp, on the channel's clock, as the wire's framer takes it
                pkt = dataclasses.replace(pkt, stamp=int(now * H.STAMP_HZ) & 0xFFFF)
            if pkt.ev in self.trim_ev or (self.trim and self.rng.random() < self.trim):
                self.trimmed += 1
                cut = dataclasses.replace(pkt, payload=b"", flags=pkt.flags | H.F_TRIM)
                self._n += 1  # high priority: ahead of its EV's queue, no FIFO with it
                heapq.heappush(self._q, (now + self.delay_s[0], self._n, to, cut))
                return
            if pkt.ev in self.ce_ev or (self.ce and self.rng.random() < self.ce):
                self.marked += 1
                pkt = dataclasses.replace(pkt, ecn_ce=True)
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            t = now + self.rng.uniform(*self.delay_s)
            if to == "tx" and self.stall_rx and self.stall_rx[0] <= now < self.stall_rx[1]:
                t += self.stall_rx[1] - now  # a stalled host sends once it runs again
            if self.hold_ev and pkt.ev in self.hold_ev[0] and self.hold_ev[1] <= now < self.hold_ev[2]:
                t += self.hold_ev[2] - now  # held on the way until the switch runs again
            if to == "tx" and self.hold_rev and self.hold_rev[0] <= now < self.hold_rev[1]:
                t += self.hold_rev[1] - now  # the reverse path held until the kernel runs it
            key = (to, pkt.ev)
            if self.fifo_per_ev:
                t = max(t, self._last_on_ev.get(key, 0.0))
                self._last_on_ev[key] = t
            self._n += 1
            heapq.heappush(self._q, (t, self._n, to, pkt))

    def due(self, now: float) -> list[tuple[str, object]]:
        out = []
        held = []
        while self._q and self._q[0][0] <= now:
            t, n, to, pkt = heapq.heappop(self._q)
            if to == "rx" and self.stall_rx and self.stall_rx[0] <= now < self.stall_rx[1]:
                held.append((self.stall_rx[1], n, to, pkt))  # waits in the stalled host's socket
                continue
            out.append((to, pkt))
            self.delivered += 1
        for h in held:
            heapq.heappush(self._q, h)
        return out

    def next_time(self) -> float | None:
        return self._q[0][0] if self._q else None
