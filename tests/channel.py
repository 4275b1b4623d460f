"""An in-process network for testing the pure transports: it drops, duplicates, reorders and delays.

``Channel.send(pkt, to, now)`` schedules delivery; ``Channel.due(now)`` returns what arrives by
``now``. Each EV is one path: with ``fifo_per_ev`` (default) packets on the same EV keep their
order, as on a real path, while packets on different EVs overtake each other freely (spraying's
reordering). ``drop_ev`` drops everything on the EVs it names (a dead path). All randomness comes
from the seeded ``rng``.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field


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
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            t = now + self.rng.uniform(*self.delay_s)
            key = (to, pkt.ev)
            if self.fifo_per_ev:
                t = max(t, self._last_on_ev.get(key, 0.0))
                self._last_on_ev[key] = t
            self._n += 1
            heapq.heappush(self._q, (t, self._n, to, pkt))

    def due(self, now: float) -> list[tuple[str, object]]:
        out = []
        while self._q and self._q[0][0] <= now:
            _, _, to, pkt = heapq.heappop(self._q)
            out.append((to, pkt))
            self.delivered += 1
        return out

    def next_time(self) -> float | None:
        return self._q[0][0] if self._q else None
