"""DCQCN, the RoCE baseline's rate control (Zhu et al., "Congestion Control for Large-Scale RDMA
Deployments", SIGCOMM 2015), and the pacer that holds a sender to its rate.

Reaction point (the sender, :class:`Dcqcn`): on a CNP the target rate takes the current rate and
the current rate is cut, ``Rc *= 1 - alpha / 2``, with ``alpha = (1 - g) alpha + g``; every
period (``timer_s``) without a CNP, ``alpha *= 1 - g``. The rate then recovers on two clocks, a timer
(every ``timer_s``) and a byte counter (every ``byte_counter`` bytes sent); each event moves a stage
counter. While both counters are under ``F`` (5) the rate is in *fast recovery*,
``Rc = (Rt + Rc) / 2``; once one passes ``F`` *additive increase* adds ``Rai`` to the target first;
once both do, *hyper increase* adds ``i x Rhai``. Rates stay within [line rate / 100, line rate].

Notification point (the receiver, traffic/roce.py): a CNP for a CE-marked packet, at most one per
QP per period (the paper's 50 us).

One cut per CNP interval: the paper's NP sends at most one CNP per N = 50 us, against a rate-increase
timer T and an alpha timer K of 55 us, so a QP is cut at most about once per timer period (K was
chosen at 55 us for that reason). Our receiver knows no RTT and spaces its CNPs by 1 ms only, while
the timer follows the RTT (5 base RTTs, tens of ms at a few Mb/s): fig. 17's 8-host all-to-all at 128
KiB on linux cut each of its 56 QPs from the line rate to the floor (1/100) within 0.5 s, several
CNPs a timer period each halving the rate (alpha still near 1), and RoCE moved 0.17 Mb/s busbw of 2
(2026-12-06). So the reaction point applies at most one cut per ``timer_s x 50/55`` (the paper's N/T)
and counts the CNPs it let pass; ConnectX's reaction point has the same guard
(``rate_reduce_monitor_period``, the least time between two rate reductions of a flow).

Scale: an emulated fabric is about 1000x slower than hardware (its RTT is milliseconds, not
microseconds), so the paper's timers (55 us, 50 us) are scaled by the fabric's RTT: one period,
``timer_s`` (the ``dcqcn_timer_s`` setting, about 5 base RTTs, as 55 us is about 5 RTTs of the
paper's fabric), serves as rate-increase timer, alpha timer and CNP interval. g = 1/256 and F = 5
are the paper's. Rai and Rhai are 1/200 and 1/20 of the line rate
(40 Mb/s of 40 Gb/s in the paper, 1/1000; ours recover faster, within runs of a few hundred RTTs),
and the byte counter is 64 full packets (ours: the paper's 10 MB is sized for 40 Gb/s).
"""

from __future__ import annotations

G = 1 / 256
F_STAGES = 5
RAI_FRACTION = 1 / 200
RHAI_FRACTION = 1 / 20
BYTE_COUNTER_PACKETS = 64
MIN_RATE_FRACTION = 1 / 100
#: The least time between two cuts of a QP, as a fraction of the timer: the paper's CNP interval N
#: (50 us) over its timers T and K (55 us), Zhu et al. 2015, section 5.
CNP_INTERVAL_FRACTION = 50 / 55


class Dcqcn:
    """DCQCN's reaction point for one QP: ``rate_bps`` is the rate the pacer holds it to."""

    def __init__(self, line_rate_bps: float, mss: int, timer_s: float) -> None:
        """At line rate ``line_rate_bps`` (bits/s), alpha 1, until the first CNP; the byte counter is
        :data:`BYTE_COUNTER_PACKETS` packets of ``mss`` bytes, ``timer_s`` the timers' period (s)."""
        self.line = line_rate_bps
        self.rate_bps = self.target_bps = line_rate_bps
        self.alpha = 1.0
        self.timer_s = timer_s
        self.byte_counter = BYTE_COUNTER_PACKETS * mss
        self.t_stage = self.b_stage = 0
        self.bytes_since = 0
        self.next_timer: float | None = None
        self.next_alpha: float | None = None
        self.cnps = 0
        self.cnps_within_interval = 0
        self.last_cut: float | None = None

    def on_cnp(self, now: float) -> None:
        """A congestion notification: cut the rate, raise alpha, restart recovery; a CNP within
        ``timer_s x`` :data:`CNP_INTERVAL_FRACTION` of the last cut is only counted
        (``cnps_within_interval``)."""
        self.cnps += 1
        if self.last_cut is not None and now - self.last_cut < self.timer_s * CNP_INTERVAL_FRACTION:
            self.cnps_within_interval += 1
            return
        self.last_cut = now
        self.target_bps = self.rate_bps
        self.rate_bps = max(self.line * MIN_RATE_FRACTION, self.rate_bps * (1 - self.alpha / 2))
        self.alpha = (1 - G) * self.alpha + G
        self.t_stage = self.b_stage = 0
        self.bytes_since = 0
        self.next_timer = now + self.timer_s
        self.next_alpha = now + self.timer_s

    def _increase(self) -> None:
        t, b = self.t_stage, self.b_stage
        if max(t, b) < F_STAGES:
            pass  # fast recovery: towards the target only
        elif min(t, b) >= F_STAGES:  # hyper increase, i = stages past F
            self.target_bps += (min(t, b) - F_STAGES + 1) * self.line * RHAI_FRACTION
        else:
            self.target_bps += self.line * RAI_FRACTION
        self.target_bps = min(self.target_bps, self.line)
        self.rate_bps = min(self.line, (self.target_bps + self.rate_bps) / 2)

    def on_sent(self, nbytes: int, now: float) -> None:
        """``nbytes`` left at time ``now``: the byte counter and the timers advance."""
        if self.next_timer is None:  # never cut: nothing to recover from
            return
        self.bytes_since += nbytes
        if self.bytes_since >= self.byte_counter:
            self.bytes_since = 0
            self.b_stage += 1
            self._increase()
        self.tick(now)

    def tick(self, now: float) -> None:
        """Run the timers up to ``now``."""
        if self.next_alpha is not None and now >= self.next_alpha:
            self.alpha *= 1 - G
            self.next_alpha = now + self.timer_s
        if self.next_timer is not None and now >= self.next_timer:
            self.t_stage += 1
            self._increase()
            self.next_timer = now + self.timer_s


#: The pacer's bucket holds this long of its rate (s), two frames at least: the endpoint's loop
#: sleeps in whole milliseconds (poll(2)'s resolution, traffic/endpoint.py), so a bucket of two
#: frames overflowed between turns at 64 Mb/s (a frame every 0.15 ms) and a lone QP at DCQCN's
#: line rate sent 0.70 of it (mrclab bench qp, linux, 2026-11-28). A hardware pacer works at
#: nanoseconds; the NIC port's own shaper still holds the wire to the port's rate.
PACER_HORIZON_S = 0.002


class Pacer:
    """A token bucket that lets a sender send at ``rate_bps``: ``burst_bytes`` at most at once, or
    :data:`PACER_HORIZON_S` of the rate where that is more."""

    def __init__(self, burst_bytes: int) -> None:
        """A full bucket of ``burst_bytes``."""
        self.burst = burst_bytes
        self.tokens = float(burst_bytes)
        self.last: float | None = None

    def _fill(self, rate_bps: float, now: float) -> None:
        if self.last is not None:
            cap = max(self.burst, rate_bps / 8 * PACER_HORIZON_S)
            self.tokens = min(cap, self.tokens + (now - self.last) * rate_bps / 8)
        self.last = now

    def allow(self, nbytes: int, rate_bps: float, now: float) -> bool:
        """True (and the tokens spent) when ``nbytes`` may leave at ``now``."""
        self._fill(rate_bps, now)
        if self.tokens >= nbytes:
            self.tokens -= nbytes
            return True
        return False

    def ready_at(self, nbytes: int, rate_bps: float, now: float) -> float:
        """When (s, the clock of ``now``) the bucket will hold ``nbytes`` at ``rate_bps``: ``now``
        if it does already."""
        self._fill(rate_bps, now)
        return now if self.tokens >= nbytes else now + (nbytes - self.tokens) * 8 / rate_bps
