"""Where messages live: the layout of a QP's memory region (:class:`RegionRing`, shared by both
ends), the receiver's region and the messages it assembles (:class:`ReceiveRegion`), and the
deterministic message contents endpoints send (:func:`message_source`).

Messages are laid out consecutively in the region, wrapping to offset 0 when a message would cross
the end; a message never straddles the wrap. Every data packet carries its RETH address, so the
receiver places it whatever order it arrives in.
"""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mrclab.protocol import headers as H
from mrclab.traffic.stats import ReceiverStats

#: Messages a receiver assembles at once beyond the next one to complete (an MSN window).
MSN_WINDOW = 4096

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


class RegionRing:
    """The offset of each message in the receiver's memory region.

    ``base`` maps the msn of every placed, not yet released message to its offset (bytes); a
    sender releases a message once all of it is acknowledged, and must not place one that
    :meth:`fits` says would overwrite a message still in flight (the data would be corrupted).
    """

    def __init__(self, region_bytes: int) -> None:
        """An empty ring over a region of ``region_bytes``."""
        self.size = region_bytes
        self.next = 0
        self.base: dict[int, int] = {}
        self.length: dict[int, int] = {}

    def _start(self, length: int) -> int:
        return 0 if self.next + length > self.size else self.next

    def fits(self, length: int) -> bool:
        """True when a ``length``-byte message placed now overlaps no unreleased message."""
        a = self._start(length)
        return all(a + length <= b or b + self.length[m] <= a for m, b in self.base.items())

    def place(self, msn: int, length: int) -> int:
        """Offset of message ``msn``; raises ValueError when it is larger than the region."""
        if length > self.size:
            raise ValueError(f"a {length}-byte message does not fit the {self.size}-byte memory region")
        self.next = self._start(length)
        self.base[msn] = self.next
        self.length[msn] = length
        self.next += length
        return self.base[msn]

    def release(self, msn: int) -> None:
        """Free message ``msn``'s bytes for later messages (an unknown ``msn``: nothing)."""
        self.base.pop(msn, None)
        self.length.pop(msn, None)


def message_source(seed: int, size: int, count: int | None) -> Iterator[tuple[int, memoryview]]:
    """Deterministic message contents: (msn, a read-only view of its ``size`` bytes), ``count`` of
    them (None: unbounded). A seeded buffer rotated per message, so every message differs and a
    misplaced packet breaks its CRC. The buffer is held twice over, back to back, so every rotation
    is a view of it and no message is copied: a copy of each 1 MiB message cost the sender about
    0.2 us a packet (5.43 -> 5.20 us over a veth pair, side by side), and messages still
    unacknowledged held a copy each."""
    rng = random.Random(seed)
    n = max(size, 1)
    base = rng.randbytes(n)
    twice = memoryview(base + base).toreadonly()
    msn = 0
    while count is None or msn < count:
        r = (msn * 7919) % n
        yield msn, twice[r : r + size]
        msn += 1


@dataclass(slots=True)
class _Msg:
    msg_len: int
    crc: int
    base: int
    got: int = 0


class ReceiveRegion:
    """A receiver's memory region and the messages being assembled in it.

    :meth:`receive` checks a data packet's message fields against the message they belong to (naming
    the reason when it must be dropped) and writes its payload, completing the message once every
    byte is in: delivered when its CRC-32 matches, else counted corrupt.
    Write-with-Immediate completions are released in MSN order (``stats.completions``).
    ``on_corrupt(msn)`` hears corrupt messages.
    """

    def __init__(self, region_bytes: int, stats: ReceiverStats, on_corrupt: Callable[[int], None]) -> None:
        """A zeroed region of ``region_bytes``; ``stats`` counts delivered and corrupt messages.

        The region is an anonymous mapping, zeroed by the kernel page by page as packets first
        touch it: a ``bytearray`` is zeroed whole when made, 3 ms for 8 MiB, and a receiver made by
        its QP's first packet made the endpoint's loop that much late (the fidelity monitor's late
        timers at t = 0, when every QP's receiver appears at once)."""
        self.mem = mmap.mmap(-1, max(region_bytes, 1))
        #: bytes from the region's start that messages have been placed in so far: its resident
        #: part (messages are laid out from offset 0 up, wrapping; :class:`RegionRing`)
        self.touched = 0
        self.stats = stats
        self.on_corrupt = on_corrupt
        self.msgs: dict[int, _Msg] = {}
        self.done_msns: set[int] = set()
        self.imm_done: dict[int, int] = {}
        self.next_completion = 0
        #: called with (msn, its bytes) as each intact message completes, in any order; the
        #: view is valid only during the call (the sender reuses the region once it is acknowledged)
        self.on_message: Callable[[int, memoryview], None] | None = None

    def receive(self, msn: int, msg_len: int, crc: int, off: int, va: int, payload, dma_len: int,
                imm: int | None) -> str | None:
        """Check a data packet's fields against the message ``msn`` (created on its first packet)
        and place its payload; returns why the packet must be dropped, or None once placed. One
        call per data packet: the receive path's hot spot."""
        n = len(payload)
        size = len(self.mem)
        if dma_len != n or (n == 0 and msg_len != 0):  # only an empty message is empty
            return "bad length"
        if not (0 <= off < msg_len and off + n <= msg_len) and (off, msg_len) != (0, 0):
            return "bad message offset"
        base = va - off
        if va < off or va + n > size or base + msg_len > size:
            return "address outside the memory region"
        m = self.msgs.get(msn)
        if m is None:
            floor = self.next_completion
            if msn < floor or msn >= floor + MSN_WINDOW or msn in self.done_msns:
                return "message out of window"
            m = self.msgs[msn] = _Msg(msg_len, crc, base)
            if base + msg_len > self.touched:
                self._touch(base + msg_len)
        elif m.msg_len != msg_len or m.crc != crc or m.base != base:
            return "inconsistent message fields"
        self.mem[va : va + n] = payload
        m.got += n
        if m.got >= msg_len:
            self._complete(msn, m, imm)
        return None

    #: Of every ReceiveRegion in this process, the bytes whose pages have been written (whole
    #: pages): an endpoint's resident memory holds them, and they are no state kept per packet or
    #: message. An RDMA NIC's memory registration pins a region whole when it is registered; here
    #: the kernel zero-fills it page by page as messages first land, so a slow run's resident
    #: memory grows with them until each region has wrapped once (the soak's "memory flat" leaves
    #: them out: experiments/analysis/metrics.py, rss_growth).
    resident_total = 0

    def _touch(self, end: int) -> None:
        pages = -(-min(end, len(self.mem)) // PAGE_BYTES) * PAGE_BYTES
        ReceiveRegion.resident_total += max(0, pages - -(-self.touched // PAGE_BYTES) * PAGE_BYTES)
        self.touched = min(end, len(self.mem))

    def _complete(self, msn: int, m: _Msg, imm: int | None) -> None:
        del self.msgs[msn]
        data = memoryview(self.mem)[m.base : m.base + m.msg_len]
        if H.crc32(data) == m.crc:
            self.stats.messages_delivered += 1
            if self.on_message is not None:  # a collective reads what arrived (traffic/collective.py)
                self.on_message(msn, data)
        else:
            self.stats.messages_corrupt += 1
            self.on_corrupt(msn)
        self.done_msns.add(msn)
        if imm is not None:
            self.imm_done[msn] = imm
        while self.next_completion in self.done_msns:
            self.done_msns.discard(self.next_completion)
            if self.next_completion in self.imm_done:
                self.stats.completions.append(self.imm_done.pop(self.next_completion))
            self.next_completion += 1
