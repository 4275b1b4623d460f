"""Round-trip time and the retransmission timeout of one QP (:class:`RttEstimator`).

srtt and rttvar follow RFC 6298 (alpha 1/8, beta 1/4; the first sample sets srtt = R, rttvar =
R/2). The RTO is ``max(min_rtt + min_rto_s, 2 srtt + 4 rttvar, recent peak RTT)``, at most
``max_rto_s``, and ``initial_rto_s`` before the first sample. The floor sits on top of the path's
base RTT (the smallest sample, timed from the NIC's departure): it is the allowance for queueing
and for a peer that answers late (the run's floor is twice the longest queueing a path allows,
experiments/run/settings.py), and a floor that counted the path's own RTT against it left a 5 ms
path (12 ms RTT, 28 ms floor) 16 ms for both: a receiver that waited 20 ms for a CPU, under the
28 ms the fidelity monitor lets an endpoint wait, timed out 11 healthy EVs at once (quickstart,
linux, once RTT samples left the host's NIC queue out). Twice srtt (RFC 6298 has one) and the peak term are
ours: a window that keeps the bottleneck queue full makes the RTT swing with the queue; when lost
packets hold part of the window the queue drains for a moment, srtt follows it down, and the queue
refills within an RTT, so a timer under the RTT of the full queue would retire healthy EVs. The
peak decays, halving every :data:`RTT_PEAK_HALF_LIFE_S`, so a queue that stays short lets the
timer come down.
"""

from __future__ import annotations

from mrclab.traffic.settings import TransportSettings

#: Half-life (s) of the RTT peak under the retransmission timer: a few RTTs of a full queue in this
#: lab, so a dead path is still found within a few RTTs.
RTT_PEAK_HALF_LIFE_S = 0.25


class RttEstimator:
    """RTT samples (seconds) in, RTO (seconds) out. Feed only first transmissions (Karn)."""

    __slots__ = ("_peak_at", "initial_rto_s", "max_rto_s", "min_rto_s", "min_rtt", "peak", "rttvar", "srtt")

    def __init__(self, settings: TransportSettings) -> None:
        """No sample yet; the RTO's bounds and initial value come from ``settings``."""
        self.min_rto_s, self.max_rto_s = settings.min_rto_s, settings.max_rto_s
        self.initial_rto_s = settings.initial_rto_s
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.peak = 0.0  # the largest recent sample, halving every RTT_PEAK_HALF_LIFE_S
        self._peak_at: float | None = None
        self.min_rtt: float | None = None  # the smallest sample: the base RTT as seen from here

    def sample(self, r: float, now: float) -> None:
        """One RTT sample ``r`` taken at time ``now`` (both seconds)."""
        if self._peak_at is not None:
            self.peak *= 0.5 ** ((now - self._peak_at) / RTT_PEAK_HALF_LIFE_S)
        self.peak, self._peak_at = max(r, self.peak), now
        if self.min_rtt is None or r < self.min_rtt:
            self.min_rtt = r
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r

    @property
    def rto(self) -> float:
        """The retransmission timeout now, seconds (see the module docstring)."""
        if self.srtt is None:
            return max(self.min_rto_s, self.initial_rto_s)
        return min(self.max_rto_s, max(self.min_rto_s + (self.min_rtt or 0.0), 2 * self.srtt + 4 * self.rttvar,
                                       self.peak))
