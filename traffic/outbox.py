"""The messages of one QP cut into packets (:class:`Outbox`): the message being sent, the messages
still unacknowledged (their bytes and CRC, for retransmissions), where each goes in the peer's
memory region, and how long each took from its first packet sent to its last acknowledged."""

from __future__ import annotations

from collections.abc import Iterator

from mrclab.protocol import headers as H
from mrclab.traffic.region import RegionRing
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.stats import SenderStats


class Outbox:
    """The messages of one QP cut into packets: the message being sent, the messages still
    unacknowledged (their bytes and CRC, for retransmissions) and where each goes in the peer's
    region. ``fetch`` takes the next message from ``messages`` (``(msn, bytes)``; ``None``: none is
    ready yet, ask again later; exhausted when it stops); ``acked`` releases an acknowledged one."""

    __slots__ = ("cache", "completion_s", "cur", "exhausted", "left", "messages", "payload", "ring", "started",
                 "stats", "waiting")

    def __init__(self, messages: Iterator[tuple[int, bytes | memoryview] | None], settings: TransportSettings,
                 stats: SenderStats) -> None:
        """Nothing fetched yet: packets of ``settings.payload_bytes``, a region of
        ``settings.region_bytes``; ``stats`` counts messages sent and acknowledged."""
        self.messages = messages
        self.payload = settings.payload_bytes
        self.ring = RegionRing(settings.region_bytes)
        self.cache: dict[int, tuple[bytes | memoryview, int]] = {}  # msn -> (message, CRC), until all of it is acked
        self.left: dict[int, int] = {}  # msn -> packets not yet acked
        self.cur: tuple[int, memoryview, int, int] | None = None  # msn, data, crc, next offset
        self.exhausted = False
        #: the last fetch found no message ready (a source that waits on something: a collective's
        #: step waits on a peer's data, so only a received frame makes it ready, never the clock)
        self.waiting = False
        self.stats = stats
        self.started: dict[int, float] = {}  # msn -> when its first packet left
        self.completion_s: list[float] = []  # message completion times, first packet sent to last acked

    def fetch(self) -> bool:
        """Take the next message (a copy and a CRC: tens of ms for a 64 MiB one); True when one was
        taken, False when none is ready or the source is exhausted."""
        if self.exhausted:
            return False
        try:
            item = next(self.messages)
        except StopIteration:
            self.exhausted = True
            return False
        if item is None:  # a source that waits on something (a collective's step): nothing yet
            self.waiting = True
            return False
        self.waiting = False
        msn, data = item
        crc = H.crc32(data)
        self.cache[msn] = (data, crc)
        self.cur = (msn, memoryview(data), crc, 0)
        self.left[msn] = max(1, -(-len(data) // self.payload))
        self.stats.messages_sent += 1
        return True

    @property
    def idle(self) -> bool:
        """True when no message is in hand and none can come by the clock alone: the source is
        exhausted, or waiting on something a received frame brings (see ``waiting``)."""
        return self.cur is None and (self.exhausted or self.waiting)

    def acked(self, msn: int, n: int, now: float) -> None:
        """``n`` more packets of ``msn`` acknowledged; the message is released with its last."""
        left = self.left.get(msn)
        if left is None:
            return
        if left > n:
            self.left[msn] = left - n
            return
        del self.left[msn]
        self.stats.messages_acked += 1
        self.cache.pop(msn, None)
        self.ring.release(msn)
        t0 = self.started.pop(msn, None)
        if t0 is not None:
            self.completion_s.append(now - t0)
