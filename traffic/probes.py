"""Probe rounds for EVs whose health is in doubt (:class:`ProbeScheduler`).

MRC probes retired EVs in the background and brings one back once enough probes in a row are
answered (paper: "background probes on retired EVs"); the reverse EV set of a host is kept fresh
the same way (traffic/host.py). A scheduler hands out probe ids, starts a round every
``interval_s`` over the candidates it is given, and reports each probe as answered or, after
``timeout_s``, lost. What a key stands for (an EV, a (peer, EV) pair) is the caller's business.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ProbeScheduler(Generic[K]):
    """Outstanding probes by id, each for one key; at most one outstanding probe per key."""

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        """No probe outstanding: rounds every ``interval_s``, a probe lost after ``timeout_s`` (s)."""
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.pending: dict[int, tuple[K, float]] = {}  # probe id -> (key, sent at)
        self.next_id = 1
        self.last_round = -1.0
        self.sent = 0

    def expired(self, now: float) -> list[K]:
        """Keys whose probe went unanswered for ``timeout_s`` (each reported once)."""
        late = [(pid, key) for pid, (key, t) in self.pending.items() if now - t > self.timeout_s]
        for pid, _ in late:
            del self.pending[pid]
        return [key for _, key in late]

    def round_due(self, now: float) -> bool:
        """True when a round may start at ``now`` (``interval_s`` since the last): callers test
        it before gathering candidates, which costs more than the test on every other turn."""
        return now - self.last_round >= self.interval_s

    def round(self, now: float, candidates: Iterable[K]) -> list[tuple[int, K]]:
        """(probe id, key) to send now: one per candidate without a probe outstanding, once every
        ``interval_s``; nothing between rounds."""
        if now - self.last_round < self.interval_s:
            return []
        self.last_round = now
        busy = {key for key, _ in self.pending.values()}
        out = []
        for key in candidates:
            if key in busy:
                continue
            pid = self.next_id
            self.next_id = (pid + 1) & 0xFFFFFFFF or 1
            self.pending[pid] = (key, now)
            busy.add(key)
            out.append((pid, key))
        self.sent += len(out)
        return out

    def next_due(self) -> float:
        """When this scheduler next has something to do (s, the callers' clock): the next round
        (``interval_s`` after the last) or the first outstanding probe's expiry, whichever is first."""
        due = self.last_round + self.interval_s
        for _key, t in self.pending.values():
            due = min(due, t + self.timeout_s)
        return due

    def answered(self, probe_id: int) -> K | None:
        """The key of an answered probe, or None for an unknown or already expired id."""
        got = self.pending.pop(probe_id, None)
        return None if got is None else got[0]
