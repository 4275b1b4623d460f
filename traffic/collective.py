"""Collectives over the transport, as a collective library drives it: every step's writes wait for
the previous step's data to arrive, so one late message delays the whole step (and, around a
ring, every host).

Kinds (``S`` = ``size`` bytes, the buffer each host holds; ``n`` hosts in ``ranks`` order):

* ``all_reduce``: ring all-reduce, a reduce-scatter then an all-gather around the ring of
  ``ranks``: 2(n-1) steps; at each one a host writes one of n chunks (S/n) to its successor and
  waits for its predecessor's. Reduction: bytes added modulo 256 (exact, so every host ends
  byte-identical and checkable).
* ``all_gather``: the ring's all-gather half: n-1 steps; host r contributes chunk r.
* ``all_to_all``: one step: a host writes chunk k of its buffer to rank k, for every other k.

Each write to a peer is split over ``qps_per_peer`` QPs (``qp_base`` + j), as a library with
several QPs per connection does. The message on a QP with MSN g is the g-th step the schedule sends
there (iterations run back to back: g = iteration x steps + step), so a message names its step by
its MSN alone, in whatever order messages complete. ``iterations`` repeat the collective; the
next starts once this host has received everything of the last.

Figures as nccl-tests reports them (nccl-tests doc/PERFORMANCE.md): algorithm bandwidth
``algbw = S / t``; bus bandwidth ``busbw = algbw x 2(n-1)/n`` for all-reduce and ``algbw x
(n-1)/n`` for all-gather and all-to-all (:func:`bus_factor`).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

KINDS = ("all_reduce", "all_gather", "all_to_all")
#: QP numbers of a collective's writes start here (workload QPs are numbered from 1).
QP_BASE = 0x100


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw for ``kind`` on ``n`` ranks (nccl-tests doc/PERFORMANCE.md)."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "all_to_all"):
        return (n - 1) / n
    raise ValueError(f"collective {kind!r}; allowed: {', '.join(KINDS)}")


def chunks(size: int, n: int) -> list[tuple[int, int]]:
    """``size`` bytes in ``n`` contiguous chunks as (offset, length), the first ``size % n`` one
    byte longer (numpy.array_split's rule)."""
    q, extra = divmod(size, n)
    out, off = [], 0
    for k in range(n):
        ln = q + (1 if k < extra else 0)
        out.append((off, ln))
        off += ln
    return out


def initial_data(seed: int, rank: int, iteration: int, size: int) -> bytes:
    """What rank ``rank`` holds at the start of ``iteration`` (deterministic for ``seed``)."""
    return random.Random(f"{seed}/{rank}/{iteration}").randbytes(size)


def expected_result(kind: str, seed: int, n: int, rank: int, iteration: int, size: int) -> bytes:
    """The buffer rank ``rank`` must hold at the end of ``iteration`` (what a test or the runner
    checks a run against)."""
    import numpy as np  # here and in Collective, not at the top: an endpoint with no collective skips its 0.1 s

    bufs = [np.frombuffer(initial_data(seed, r, iteration, size), dtype=np.uint8) for r in range(n)]
    parts = chunks(size, n)
    if kind == "all_reduce":
        return np.sum(np.stack(bufs), axis=0, dtype=np.uint64).astype(np.uint8).tobytes()
    if kind == "all_gather":
        return b"".join(bytes(bufs[k][o : o + ln]) for k, (o, ln) in enumerate(parts))
    if kind == "all_to_all":  # chunk k of the result is chunk `rank` of rank k's buffer
        o, ln = parts[rank]
        return b"".join(bytes(bufs[k][o : o + ln]) for k in range(n))
    raise ValueError(f"collective {kind!r}; allowed: {', '.join(KINDS)}")


@dataclass(frozen=True)
class Iteration:
    """One finished iteration at one host: when it started and ended (the clock the caller
    passes, s) and the CRC-32 of the buffer it ended with."""

    index: int
    start_s: float
    end_s: float
    crc: int


class Collective:
    """One host's part of a collective (see the module docstring).

    ``sources()`` gives the message iterator of each (peer, QP) it writes on, for the host's
    senders (``None`` while the step waits: traffic/outbox.py); :meth:`on_message` takes each
    message that arrives from a peer; :meth:`start` begins the first iteration. ``on_iteration``
    hears each finished :class:`Iteration`. Raises ValueError for a host not in ``ranks``, fewer
    than 2 ranks, or a buffer too small to split into n x ``qps_per_peer`` parts.
    """

    def __init__(self, kind: str, ranks: list[str], host: str, size: int, iterations: int, qps_per_peer: int = 1,
                 seed: int = 1, on_iteration: Callable[[Iteration], None] | None = None) -> None:
        """Lay out this host's schedule; nothing is posted until :meth:`start`. Raises ValueError for
        an unknown ``kind``, ranks that repeat, and as the class docstring says."""
        if kind not in KINDS:
            raise ValueError(f"collective {kind!r}; allowed: {', '.join(KINDS)}")
        if host not in ranks or len(ranks) < 2 or len(set(ranks)) != len(ranks):
            raise ValueError(f"collective ranks {ranks}: need 2 or more distinct hosts, {host} among them")
        n = len(ranks)
        if size < n * qps_per_peer or qps_per_peer < 1 or iterations < 1:
            raise ValueError(f"collective of {size} bytes on {n} ranks x {qps_per_peer} QPs per peer: "
                             f"need at least one byte per part and one iteration")
        self.kind, self.ranks, self.host, self.size = kind, list(ranks), host, size
        self.n, self.rank = n, ranks.index(host)
        self.iterations, self.q, self.seed = iterations, qps_per_peer, seed
        self.on_iteration = on_iteration or (lambda _i: None)
        self.parts = chunks(size, n)
        succ, pred = ranks[(self.rank + 1) % n], ranks[(self.rank - 1) % n]
        if kind == "all_to_all":
            self.steps = 1
            self.to = [p for p in ranks if p != host]
            self.frm = list(self.to)
        else:
            self.steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
            self.to, self.frm = [succ], [pred]
        self.outq: dict[tuple[str, int], list[bytes]] = {(p, QP_BASE + j): [] for p in self.to for j in range(self.q)}
        self.sent: dict[tuple[str, int], int] = dict.fromkeys(self.outq, 0)
        #: (peer, QP) keys given a message since the host stack last looked (it wakes their senders,
        #: traffic/host.py ``wake``, and clears it)
        self.posted: set[tuple[str, int]] = set()
        # arrived parts not yet used: (peer, global step) -> {j: bytes}
        self.arrived: dict[tuple[str, int], dict[int, bytes]] = {}
        self.iteration = 0
        self.step = 0
        import numpy

        self._np = numpy  # imported with the first collective (see expected_result)
        self.buf = numpy.zeros(size, dtype=numpy.uint8)
        self.started_at = 0.0
        self.finished = False
        self.done: list[Iteration] = []
        self.now: Callable[[], float] = lambda: 0.0

    # ---- the schedule -------------------------------------------------------------------------
    def send_chunk(self, step: int) -> int:
        """Index of the chunk this host writes at ``step`` (ring kinds)."""
        r, n = self.rank, self.n
        if self.kind == "all_reduce" and step >= n - 1:  # all-gather half: the reduced chunks
            return (r + 1 - (step - (n - 1))) % n
        return (r - step) % n

    def recv_chunk(self, step: int) -> int:
        """Index of the chunk that arrives from the predecessor at ``step`` (ring kinds)."""
        r, n = self.rank, self.n
        if self.kind == "all_reduce" and step >= n - 1:
            return (r - (step - (n - 1))) % n
        return (r - step - 1) % n

    def reduces(self, step: int) -> bool:
        """Whether what arrives at ``step`` is added to the buffer (else it replaces the chunk)."""
        return self.kind == "all_reduce" and step < self.n - 1

    # ---- the transport's side -----------------------------------------------------------------
    def sources(self) -> dict[tuple[str, int], Iterator[tuple[int, bytes] | None]]:
        """(peer, QP) -> the messages this host writes there: ``(msn, bytes)``, or None while the next
        one waits on the schedule; each iterator ends after ``iterations`` x steps messages."""
        return {key: self._source(key) for key in self.outq}

    def _source(self, key: tuple[str, int]) -> Iterator[tuple[int, bytes] | None]:
        q = self.outq[key]
        total = self.iterations * self.steps
        while self.sent[key] < total:
            if q:
                msn = self.sent[key]
                self.sent[key] = msn + 1
                yield msn, q.pop(0)
            else:
                yield None

    def start(self, now: Callable[[], float]) -> None:
        """Begin the first iteration; ``now()`` is the clock iteration times are read from."""
        self.now = now
        self._begin_iteration()

    def on_message(self, peer: str, qp: int, msn: int, data) -> None:
        """A message from ``peer`` on ``qp`` arrived whole (``data`` is valid during the call)."""
        j = qp - QP_BASE
        if peer not in self.frm or not 0 <= j < self.q:
            return
        self.arrived.setdefault((peer, msn), {})[j] = bytes(data)
        self._advance()

    # ---- progress -----------------------------------------------------------------------------
    def _split(self, off: int, ln: int) -> list[tuple[int, int]]:
        return [(off + o, part) for o, part in chunks(ln, self.q)]

    def _post(self, peer: str, off: int, ln: int) -> None:
        for j, (o, part) in enumerate(self._split(off, ln)):
            self.outq[(peer, QP_BASE + j)].append(self.buf[o : o + part].tobytes())
            self.posted.add((peer, QP_BASE + j))

    def _begin_iteration(self) -> None:
        np = self._np
        self.buf = np.frombuffer(initial_data(self.seed, self.rank, self.iteration, self.size), dtype=np.uint8).copy()
        self.started_at = self.now()
        self.step = 0
        self._post_step()
        self._advance()

    def _post_step(self) -> None:
        if self.kind == "all_to_all":
            for peer in self.to:
                off, ln = self.parts[self.ranks.index(peer)]
                self._post(peer, off, ln)
        else:
            off, ln = self.parts[self.send_chunk(self.step)]
            self._post(self.to[0], off, ln)

    def _advance(self) -> None:
        """Use every arrived step in order; post the next step's writes; finish iterations."""
        while not self.finished:
            g = self.iteration * self.steps + self.step
            if any(len(self.arrived.get((p, g), {})) < self.q for p in self.frm):
                return
            for p in self.frm:
                got = self.arrived.pop((p, g))
                data = self._np.frombuffer(b"".join(got[j] for j in range(self.q)), dtype=self._np.uint8)
                if self.kind == "all_to_all":
                    off, ln = self.parts[self.ranks.index(p)]
                else:
                    off, ln = self.parts[self.recv_chunk(self.step)]
                if len(data) != ln:
                    raise ValueError(f"{self.host}: step {g} from {p} brought {len(data)} bytes, expected {ln}")
                if self.reduces(self.step):
                    self.buf[off : off + ln] += data  # uint8: modulo 256
                else:
                    self.buf[off : off + ln] = data
            self.step += 1
            if self.step < self.steps:
                self._post_step()
                continue
            it = Iteration(self.iteration, self.started_at, self.now(), zlib.crc32(self.buf.tobytes()))
            self.done.append(it)
            self.on_iteration(it)
            self.iteration += 1
            if self.iteration >= self.iterations:
                self.finished = True
                return
            self._begin_iteration()
            return
