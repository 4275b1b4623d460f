"""A host's model of its own NIC port queues (:class:`NicQueues`): how long a frame it sends waits
behind the frames it sent before, port by port.

On a shaped fabric every host NIC port is a FIFO drained at the port's rate (the ``tbf`` of
emulation/network.py, and behind it the endpoint's backlog of frames the qdisc had no room for).
A packet's round trip includes its wait there, up to a full queue (``queue_packets`` frames: 96 ms
for 32 packets at 4 Mb/s), and a watch that judges whether the emulator held a packet
(experiments/analysis/fidelity.py, "held packets") needs the wait the packet actually met, not the worst
case. The host knows it: it sent everything in front. Each port is modelled as a queue with no
limit drained at the port rate since the last frame (a token bucket's burst lets frames leave
sooner, so the model's wait is an upper bound), and the wait is remembered per millisecond for the
last :data:`HISTORY_S` seconds, the longest of the millisecond's frames.
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
    """The queues of one host's NIC ports, one per plane, drained at ``rate_bps`` (bits/s, > 0)."""

    def __init__(self, planes: int, rate_bps: float) -> None:
        """Every queue empty. Raises ValueError for a rate that is not positive."""
        if rate_bps <= 0:
            raise ValueError(f"NIC port rate {rate_bps} b/s; allowed: > 0")
        self.rate_Bps = rate_bps / 8
        self.backlog = [0.0] * planes  # bytes still queued at ``at``
        self.at = [0.0] * planes
        self.times: list[deque[float]] = [deque() for _ in range(planes)]  # millisecond bins' starts
        self.waits: list[deque[float]] = [deque() for _ in range(planes)]  # the longest wait in each

    def add(self, frames: list[tuple[int, bytes]], now: float) -> None:
        """Frames sent at ``now`` (s): ``(plane, frame)`` as the host stack returns them, in the
        order they leave."""
        rate = self.rate_Bps
        for plane, frame in frames:
            queued = self.backlog[plane] - (now - self.at[plane]) * rate
            if queued < 0:
                queued = 0.0
            wait = queued / rate  # until this frame starts to leave
            self.backlog[plane] = queued + len(frame)
            self.at[plane] = now
            times, waits = self.times[plane], self.waits[plane]
            if times and now - times[-1] < BIN_S:
                waits[-1] = max(waits[-1], wait)
            else:
                times.append(now)
                waits.append(wait)
                while now - times[0] > HISTORY_S:
                    times.popleft()
                    waits.popleft()

    def wait_at(self, plane: int, t: float) -> float | None:
        """The longest wait (s) a frame sent on ``plane`` in the millisecond of ``t`` met; None when
        the history does not reach back to ``t`` or nothing was sent then."""
        times = self.times[plane]
        i = bisect.bisect_right(times, t) - 1
        if i < 0 or t - times[i] >= BIN_S:
            return None
        return self.waits[plane][i]
