"""MRC's congestion control: a per-QP window in bytes. :class:`Nscc` (UET 1.0's network-signal
congestion control, the default congestion-control profile of the OCP MRC API) or a
:class:`FixedWindow` (``nscc: off``, the transport before congestion control, kept for comparison).

NSCC follows the reference implementation the UET specification's NSCC was developed on,
ultraethernet/uet-htsim ``htsim/sim/uec.cpp`` at 40ccb0526bb6 (``updateCwndOnAck_NSCC``,
``updateCwndOnNack_NSCC``, ``quick_adapt``, ``fast_increase``, ``multiplicative_decrease``,
``fulfill_adjustment``, ``update_delay``), line for line; ``mrclab bench nscc`` replays the
reference's own acknowledgements through it (tests/test_congestion.py holds it to a trace of
them). Each acknowledgement brings the bytes it newly acknowledges, an RTT sample (queueing
delay = RTT - base RTT; without a sample, e.g. a retransmission's, the average delay stands in)
and whether the acknowledged packet carried ECN CE:

===================  =======================  =================================================
ECN echoed?          delay vs target          action
===================  =======================  =================================================
no                   delay >= target          fair increase: ``inc += fi x acked``
no                   delay < target           fast increase while the delay stays under 1/12 of
                                              the reference RTT for more than a window's bytes
                                              (``cwnd += fi_scale x acked`` each), else
                                              proportional increase: ``inc += alpha x acked x
                                              (target - delay)``
yes                  delay >= target          multiplicative decrease, at most once per base RTT
                                              and when the average delay is over the target:
                                              ``cwnd *= max(1 - gamma (avg - target) / avg, 0.5)``
yes                  delay < target           no change: the path is hot, not the QP ("just switch
                                              path": the sender skips the EV instead)
===================  =======================  =================================================

Increases are applied (``cwnd += inc / cwnd``) once 8 packets' bytes were acknowledged since the
last time or a base RTT passed, with ``eta`` once per base RTT. *Quick adapt*: once per window of
a base RTT plus the target, if a NACK (a trimmed packet) came or a delay over 4 x target was seen,
and the bytes acknowledged in that window are under ``maxwnd / 8``, the window drops to them, and
the NACKs of the bytes then in flight are ignored. A NACK that quick adapt neither took nor ignored takes its
packet's bytes off the window, and counts as a queueing delay of one base RTT in the average.
``avg`` is an EWMA of the queueing delay (weight 0.0125); an unmarked sample over the target
counts as a quarter of a base RTT (the reference's ``update_delay``).

Parameters scale with the fabric as in uet-htsim's ``initNsccParams``: reference network 100 Gb/s
x 12 us (a BDP of 150,000 bytes); ``a = BDP / reference BDP``, ``b = target / reference RTT``;
``alpha = 4 MSS a b / target``, ``fi = 5 MSS a``, ``eta = 0.15 MSS a``, ``fi_scale = 0.25 a``,
``gamma = 0.8``; ``maxwnd = 1.5 BDP``, min window 1 MSS. An emulated fabric runs about 1000x slower
than the reference one (its RTT is milliseconds), so time is measured in its own base RTTs: the
reference RTT is the base RTT (ours; with 12 us, ``b`` would be ~1000 and the proportional
increase 1000x too steep per RTT), and the fast increase's 1 us of the reference's 12 us is a
twelfth of it (``ref_rtt_s`` sets the reference RTT where it is known: a replay of the reference).
Sizes keep uet-htsim's scaling: a BDP of a few dozen packets gives ``a`` of a few tenths.
The target queueing delay is 0.75 x the base RTT (with trimming, as UET's default). The BDP is the
QP's line rate (every plane's NIC port that is up at both ends: :meth:`Nscc.set_line_rate`) x the
base RTT; the base RTT is the smallest RTT sampled (an emulated fabric's RTT is not known before
it runs). Where the line rate is not known (unshaped
links), the BDP is taken to be the fixed window. The BDP is never less than ``min_bdp_bytes`` (the
sender passes two full packets per plane, ours): an emulated link serialises a packet in
milliseconds while its switches forward an empty queue's packet at once, so the smallest RTT
leaves the serialisation out and rate x RTT would be a fraction of a packet per plane, too little
to keep every plane's port busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: uet-htsim's reference network: 100 Gb/s x 12 us
REF_BDP_BYTES = 100e9 / 8 * 12e-6
DELAY_EWMA = 0.0125  # uec.cpp _delay_alpha
GAMMA = 0.8  # uec.cpp _gamma
#: quick adapt acts when a window's acknowledged bytes are under maxwnd >> _qa_gate (3): an eighth
QUICK_ADAPT_FRACTION = 1 / 8
#: quick adapt also acts on a queueing delay over this many targets (uec.cpp _qa_threshold)
QUICK_ADAPT_DELAY_TARGETS = 4
#: increases are applied once this many packets' bytes were acknowledged (uec.cpp
#: _adjust_bytes_threshold = 8 MTU), or a base RTT passed
ADJUST_PACKETS = 8
#: the fast increase acts under this share of the reference RTT (uec.cpp: 1 us of 12 us)
FAST_INCREASE_DELAY_SHARE = 1 / 12
#: the reference RTT of uet-htsim's parameter scaling (uec.cpp _reference_network_rtt)
REF_RTT_S = 12e-6


class FixedWindow:
    """A window of ``packets`` full-size packets that never moves."""

    name = "fixed"

    def __init__(self, packets: int, mss: int) -> None:
        """A window of ``packets`` x ``mss`` bytes."""
        self.cwnd_bytes = float(packets * mss)

    def on_ack(self, acked_bytes: int, rtt_s: float | None, ecn: bool, now: float) -> None:
        """Nothing: the window never moves."""

    def on_nack(self, nacked_bytes: int, now: float) -> None:
        """Nothing: the window never moves."""


@dataclass
class NsccParams:
    """NSCC's parameters for one BDP and base RTT, scaled as in uet-htsim (module docstring):
    ``mss`` and ``bdp_bytes`` in bytes, the target queueing delay ``target_s``, ``base_rtt_s`` and
    the reference RTT ``ref_rtt_s`` in seconds (None: the base RTT, as an emulated fabric's). The
    derived gains are computed once (each acknowledgement reads them):

    * ``a``: the BDP over uet-htsim's reference BDP (100 Gb/s x 12 us = 150,000 bytes);
    * ``ref_rtt``: ``ref_rtt_s``, else the base RTT (ours: time runs slower here); ``b``: the
      target over it;
    * ``alpha = 4 MSS a b / target`` (the proportional increase's gain), ``fi = 5 MSS a`` (the fair
      increase's), ``eta = 0.15 MSS a`` (bytes each adjustment period), ``fi_scale = 0.25 a`` (the
      fast increase's share of each acknowledged byte);
    * ``fast_delay``: the delay under which the fast increase acts (s); ``maxwnd = 1.5 BDP``."""

    mss: int
    bdp_bytes: float
    target_s: float
    base_rtt_s: float
    ref_rtt_s: float | None = None

    def __post_init__(self) -> None:
        """The derived gains (the class docstring)."""
        self.a = self.bdp_bytes / REF_BDP_BYTES
        self.ref_rtt = self.ref_rtt_s or self.base_rtt_s
        self.b = self.target_s / self.ref_rtt
        self.alpha = 4 * self.mss * self.a * self.b / self.target_s
        self.fi = 5 * self.mss * self.a
        self.eta = 0.15 * self.mss * self.a
        self.fi_scale = 0.25 * self.a
        self.fast_delay = FAST_INCREASE_DELAY_SHARE * self.ref_rtt
        self.maxwnd = 1.5 * self.bdp_bytes


class Nscc:
    """NSCC for one QP (see the module docstring). ``line_rate_bps``: the QP's line rate (bits/s,
    0 when unknown); ``initial_bytes``: the window before the first RTT sample and the BDP where
    the line rate is unknown; ``base_rtt_s``: a known base RTT (0: the smallest sample);
    ``ref_rtt_s``: the reference RTT of the parameters' scaling (0: the base RTT)."""

    name = "nscc"

    def __init__(self, mss: int, line_rate_bps: float, initial_bytes: float, base_rtt_s: float = 0.0,
                 min_bdp_bytes: float = 0.0, ref_rtt_s: float = 0.0,
                 in_flight: Callable[[], float] | None = None) -> None:
        """The window starts at ``initial_bytes``; the parameters are set at once from a known
        ``base_rtt_s``, else at the first RTT sample. ``min_bdp_bytes``: the BDP's floor (never
        under one ``mss``). ``in_flight``: the QP's bytes in flight now, asked at a quick adapt
        (None: the window's bytes)."""
        self.mss, self.line_rate_bps, self.initial = mss, line_rate_bps, initial_bytes
        self.in_flight = in_flight
        self.min_bdp = max(float(mss), min_bdp_bytes)
        self.ref_rtt_s = ref_rtt_s or None
        self.base_rtt_s = base_rtt_s or None
        self.cwnd_bytes = float(initial_bytes)
        self.avg_delay = 0.0
        self.inc = 0.0  # increase owed, applied at the next adjustment (bytes^2)
        self.received = 0  # bytes acknowledged since the last adjustment
        self.last_adjust = 0.0  # when eta was last added
        self.achieved = 0  # bytes acknowledged in the current quick-adapt window
        self.qa_end = 0.0  # the current quick-adapt window's end (0: none opened yet)
        self.qa_trigger = False  # a NACK came since the last quick adapt
        self.ignored = 0  # bytes acknowledged or NACKed since the last quick adapt ...
        self.to_ignore = 0.0  # ... and how many of them the quick adapt's in-flight bytes were
        self.fi_count = 0  # bytes acknowledged with a delay under the fast increase's
        self.fast = False  # the fast increase is on
        self.last_decrease = 0.0
        self.p: NsccParams | None = None if base_rtt_s <= 0 else self._params(base_rtt_s)

    def set_line_rate(self, line_rate_bps: float) -> None:
        """The QP's line rate changed (bit/s): a plane's NIC port went down or came back at either
        end. The BDP, maxwnd and the other parameters follow at once, and a window over the new
        maxwnd is cut to it. A NIC whose ports go down loses their rate: a window kept at every
        port's BDP would sit in the ports left (the emulated NIC queues what its tbf cannot send
        yet), its RTT samples would read that queue, and once a port is back the samples of the
        empty one would pull the RTO under the full one's RTT (spurious timeouts retired its EVs)."""
        if line_rate_bps == self.line_rate_bps or self.line_rate_bps <= 0:
            return
        self.line_rate_bps = line_rate_bps
        if self.p is not None:
            self.p = self._params(self.p.base_rtt_s)
            self.cwnd_bytes = max(self.p.mss, min(self.cwnd_bytes, self.p.maxwnd))

    def _params(self, base_rtt_s: float) -> NsccParams:
        bdp = self.line_rate_bps / 8 * base_rtt_s if self.line_rate_bps > 0 else self.initial
        return NsccParams(self.mss, max(bdp, self.min_bdp), 0.75 * base_rtt_s, base_rtt_s, self.ref_rtt_s)

    def _bound(self, p: NsccParams) -> None:
        self.cwnd_bytes = min(max(self.cwnd_bytes, float(p.mss)), p.maxwnd)

    def _update_delay(self, delay: float, ecn: bool, p: NsccParams) -> None:
        """uec.cpp ``update_delay``: the average's EWMA; an unmarked sample over the target counts
        as a quarter of a base RTT (a queue the QP's own marks do not confirm)."""
        sample = p.base_rtt_s * 0.25 if not ecn and delay > p.target_s else delay
        self.avg_delay += DELAY_EWMA * (sample - self.avg_delay)

    def _quick_adapt(self, loss: bool, ecn: bool, delay: float, now: float, p: NsccParams) -> bool:
        """uec.cpp ``quick_adapt``: True when it acted or the signal is one it ignores (the caller
        then does nothing more)."""
        done = False
        if self.ignored < self.to_ignore and ecn:
            done = True
        elif now > self.qa_end:
            if (self.qa_end and (self.qa_trigger or loss or delay > QUICK_ADAPT_DELAY_TARGETS * p.target_s)
                    and self.achieved < QUICK_ADAPT_FRACTION * p.maxwnd):
                self.to_ignore = self.in_flight() if self.in_flight else self.cwnd_bytes
                self.ignored = 0
                self.cwnd_bytes = max(float(self.achieved), float(p.mss))
                self.qa_trigger = False
                done = True
            self.achieved = 0
            self.qa_end = now + p.base_rtt_s + p.target_s
        if done:
            self.inc, self.received = 0.0, 0
        return done

    def on_ack(self, acked_bytes: int, rtt_s: float | None, ecn: bool, now: float) -> None:
        """One acknowledgement at ``now`` (s): ``acked_bytes`` newly acknowledged, its RTT sample
        (``rtt_s``; None: none, e.g. a retransmission's) and whether it echoed ECN CE; the table
        of the module docstring. A sample below the base RTT (a known one too) becomes the base
        RTT and rescales the parameters; before any base RTT nothing moves."""
        if rtt_s is not None and rtt_s > 0 and (self.base_rtt_s is None or rtt_s < self.base_rtt_s):
            self.base_rtt_s = rtt_s  # the path with the shortest queue so far
            self.p = self._params(rtt_s)
        p = self.p
        if p is None:
            return
        self.achieved += acked_bytes
        self.received += acked_bytes
        self.ignored += acked_bytes
        if rtt_s is not None:
            delay = rtt_s - p.base_rtt_s
            delay = max(delay, 0.0)
            # _update_delay, inlined (once per SACK)
            sample = p.base_rtt_s * 0.25 if not ecn and delay > p.target_s else delay
            self.avg_delay += DELAY_EWMA * (sample - self.avg_delay)
        else:
            delay = self.avg_delay
        qa_due = now > self.qa_end or (ecn and self.ignored < self.to_ignore)
        if qa_due and self._quick_adapt(False, ecn, delay, now, p):
            return
        target = p.target_s
        if not ecn and delay >= target:
            self.inc += p.fi * acked_bytes
        elif not ecn:
            if delay < p.fast_delay:
                self.fi_count += acked_bytes
                self.fast = self.fi_count > self.cwnd_bytes or self.fast
                if self.fast:
                    self.cwnd_bytes += acked_bytes * p.fi_scale
            else:
                self.fi_count, self.fast = 0, False
            if not self.fast:
                self.inc += p.alpha * acked_bytes * (target - delay)
        elif delay >= target:
            self.fast, self.fi_count = False, 0
            if self.avg_delay > target and now - self.last_decrease > p.base_rtt_s:
                self.cwnd_bytes *= max(1 - GAMMA * (self.avg_delay - target) / self.avg_delay, 0.5)
                self.last_decrease = now
        self._bound(p)
        if self.received > ADJUST_PACKETS * p.mss or now - self.last_adjust > p.base_rtt_s:
            self.cwnd_bytes += self.inc / self.cwnd_bytes
            if now - self.last_adjust >= p.base_rtt_s:
                self.cwnd_bytes += p.eta
                self.last_adjust = now
            self.inc, self.received = 0.0, 0
            self._bound(p)

    def on_nack(self, nacked_bytes: int, now: float) -> None:
        """A NACK for a trimmed packet of ``nacked_bytes`` at ``now`` (s): quick adapt, else the
        packet's bytes off the window (see the module docstring)."""
        p = self.p
        if p is None:
            return
        self.ignored += nacked_bytes
        self._update_delay(p.base_rtt_s, True, p)  # the reference: its network RTT, our base RTT
        self.qa_trigger = True
        if not self._quick_adapt(True, True, 0.0, now, p):
            self.cwnd_bytes -= nacked_bytes
            self._bound(p)
