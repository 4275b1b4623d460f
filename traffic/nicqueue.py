"""A host's model of its own NIC port queues (:class:`NicQueues`): how long a frame it sends waits
behind the frames it sent before, port by port.

On a shaped fabric every host NIC port is a token bucket filter (the ``tbf`` of emulation/network.py,
and behind it the endpoint's backlog of frames the qdisc had no room for): frames leave in order,
each once the bucket holds its bytes; the bucket fills at the port's rate up to its burst (two
full frames, emulation/kernel.py ``shaper_burst_bytes``), so after a pause the first frames leave
at once. A packet's round trip includes its wait there, up to a full queue (``queue_packets``
frames: 96 ms for 32 packets at 4 Mb/s). A NIC stamps a packet when its port sends it, and the
transport's RTT samples start there (traffic/sender.py, ``departed``); a watch that judges whether
the emulator held a packet (experiments/analysis/fidelity.py, "held packets") needs the wait the
packet actually met, not the worst case. The host knows it: it sent everything in front. The wait
is remembered per millisecond for the last :data:`HISTORY_S` seconds, the longest of the
millisecond's frames.
"""

from __future__ import annotations

import bisect
from collections import deque

#: How far back the wait of a frame sent then can be asked (s): past the longest a timed-out packet
#: can take to be reported (the RTO's 1 s ceiling, resent and echoed).
HISTORY_S = 4.0
#: The history's resolution (s): one entry per port per millisecond in which it sent.
BIN_S = 0.001


class NicQueues:
    """The queues of one host's NIC ports, one per plane: token buckets filled at ``rate_bps``
    (bits/s, > 0) up to ``burst_bytes`` (at least the frame at hand: 0 drains frame by frame)."""

    def __init__(self, planes: int, rate_bps: float, burst_bytes: int = 0) -> None:
        """Every queue empty, every bucket full. Raises ValueError for a rate that is not positive."""
        if rate_bps <= 0:
            raise ValueError(f"NIC port rate {rate_bps} b/s; allowed: > 0")
        self.rate_Bps = rate_bps / 8
        self.burst = float(burst_bytes)
        self.tokens = [self.burst] * planes  # bytes in the bucket at ``at``
        self.at = [0.0] * planes  # when the last frame queued leaves (it is sent then)
        self.times: list[deque[float]] = [deque() for _ in range(planes)]  # millisecond bins' starts
        self.waits: list[deque[float]] = [deque() for _ in range(planes)]  # the longest wait in each

    def add(self, frames: list[tuple[int, bytes]], now: float) -> list[float]:
        """Frames sent at ``now`` (s): ``(plane, frame)`` as the host stack returns them, in the
        order they leave. Returns each frame's wait (s) behind the frames before it, in their
        order: ``now`` plus its wait is when its port sends it (the moment a NIC stamps)."""
        rate, burst = self.rate_Bps, self.burst
        tokens, at = self.tokens, self.at
        out: list[float] = []
        for plane, frame in frames:
            n = len(frame)
            start = at[plane]
            if start < now:
                start = now  # (not before the frame ahead of it has left: a FIFO)
            tok = tokens[plane] + (start - at[plane]) * rate
            cap = burst if burst > n else n
            if tok > cap:
                tok = cap
            if tok >= n:
                tokens[plane], at[plane] = tok - n, start
            else:
                tokens[plane], at[plane] = 0.0, start + (n - tok) / rate
            wait = at[plane] - now
            out.append(wait)
            times, waits = self.times[plane], self.waits[plane]
            if times and now - times[-1] < BIN_S:
                waits[-1] = max(waits[-1], wait)
            else:
                times.append(now)
                waits.append(wait)
                while now - times[0] > HISTORY_S:
                    times.popleft()
                    waits.popleft()
        return out

    def left(self, plane: int, t: float, wait: float) -> None:
        """A frame handed to ``plane``'s port at ``t`` (s) left it ``wait`` s later, by the port's
        own departure stamp (traffic/txstamp.py): the millisecond's longest wait is at least that.
        The model cannot see a port the machine held longer than its rate allows; the stamp can.
        Ignored when the history holds nothing sent in that millisecond."""
        times = self.times[plane]
        i = bisect.bisect_right(times, t) - 1
        if i >= 0 and t - times[i] < BIN_S:
            waits = self.waits[plane]
            if wait > waits[i]:
                waits[i] = wait

    def wait_at(self, plane: int, t: float) -> float | None:
        """The longest wait (s) a frame sent on ``plane`` in the millisecond of ``t`` met; None when
        the history does not reach back to ``t`` or nothing was sent then."""
        times = self.times[plane]
        i = bisect.bisect_right(times, t) - 1
        if i < 0 or t - times[i] >= BIN_S:
            return None
        return self.waits[plane][i]
