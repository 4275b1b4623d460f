"""MRC's congestion control: a per-QP window in bytes. :class:`Nscc` (UET 1.0's network-signal
congestion control, the default congestion-control profile of the OCP MRC API) or a
:class:`FixedWindow` (``nscc: off``, the transport before congestion control, kept for comparison).

NSCC (reference: ultraethernet/uet-htsim ``htsim/sim/uec.cpp``; UET 1.0 specification, NSCC). Each
acknowledgement brings the bytes it newly acknowledges, an RTT sample (queueing delay = RTT - base
RTT) and whether the acknowledged packet carried ECN CE:

===================  =======================  =================================================
ECN echoed?          delay vs target          action
===================  =======================  =================================================
no                   delay >= target          fair increase: ``inc += fi x acked``
no                   delay < target           proportional increase: ``inc += alpha x acked x (target - delay)``;
                                              or, once a window's bytes came at a queueing delay
                                              under 1/14 base RTT in a row, fast increase: ``cwnd +=
                                              fi_scale x acked`` at once (``fi_scale = 0.25 a``)
yes                  delay >= target          multiplicative decrease, at most once per base RTT:
                                              ``cwnd *= max(1 - gamma (avg - target) / avg, 0.5)``
yes                  delay < target           no change: the path is hot, not the QP ("just switch
                                              path": the sender skips the EV instead)
===================  =======================  =================================================

Increases are applied once more than 8 MSS have been acknowledged since the last time, or a base RTT
has passed (``cwnd += inc / cwnd``), and ``eta`` once a base RTT (uet-htsim ``fulfill_adjustment``).
A NACK for a trimmed packet *quick-adapts*, as uet-htsim's ``UecSrc::quick_adapt`` does for a loss:
the bytes acknowledged are counted over windows of a base RTT plus the target delay; a NACK arms
the quick adapt, and the first acknowledgement or NACK after the window in which it came ends that
window: if fewer than an eighth of ``maxwnd`` got through in it (the reference's ``_qa_gate`` of 3),
the window drops to what did, and the NACKs and marked acknowledgements of the bytes then in flight
are ignored (``_bytes_to_ignore``: they tell of the congestion already answered). A NACK that
arrives while nothing is decided takes its bytes off the window. (The reference also quick-adapts on
a delay over four targets: not here, see :meth:`Nscc.on_nack`.)
``avg`` is an EWMA of the queueing delay (weight 0.0125), fed each sample's delay and a base RTT for
a NACK (the trim threshold's delay), as uet-htsim's ``update_delay``. The reference feeds it a
quarter of the base RTT instead for an unmarked sample over the target (a queue that marks nothing
is not long, where marks start below the target: 0.2 BDP in its incasts). Not by default here
(``quarter_unmarked``): the lab's ECN threshold is 2 packets at least, which on its shallow fabrics
lies at or above the target (bmv2's permutation: 0.79 BDP against 0.75), so a standing queue
between them reads as unmarked and over the target, and the average never reached the target to
let a mark cut. Run so on bmv2 (permutation over two servers, 2026-12-07), MRC trimmed 10-40
packets a run and read 5.40-5.68 ports of goodput against its bound of 5.4; each sample's own delay
averaged, 0-3 trims and 5.54-5.65 in 4 runs (the law before the reference's pieces: 0 and 5.60-5.68); a
1-packet ECN threshold instead marked at every BMv2 hiccup and cut goodput to 3.7. This is the
reference's law (held to it acknowledgement by acknowledgement on one of its flows' traces,
tests/test_congestion.py: 0.8% with ``quarter_unmarked``, 2% without) but for those two pieces.

Parameters scale with the fabric as in uet-htsim: reference network 100 Gb/s x 12 us (a BDP of
150,000 bytes); ``a = BDP / reference BDP``, ``b = target / reference RTT``; ``alpha = 4 MSS a b /
target``, ``fi = 5 MSS a``, ``eta = 0.15 MSS a``, ``gamma = 0.8``; ``maxwnd = 1.5 BDP``, min window
1 MSS. The MSS in the gains is the reference's 4 KiB (uet-htsim ``UecSrc::_mss``, the paper's frames),
whatever the lab's frames: a fair increase is then 5 x 4096 / 150,000 = 14% of a BDP per RTT, as in
the reference network, where the lab's 1 KiB frames would make it 3.4% and every recovery from a
cut four times as long in RTTs (t1-blackhole on linux: QPs cut to a tenth of their window by a trim
burst regrew over 3 s, a slowest QP at 0.41 of the mean against its 0.5 bound). The lab's frames
stand in for the paper's: its BDPs, thresholds and windows are read in packets.
An emulated fabric runs about 1000x slower than the reference one (its RTT is milliseconds),
so time is measured in its own base RTTs: ``b`` takes the base RTT as the reference RTT (ours; with
12 us, ``b`` would be ~1000 and the proportional increase 1000x too steep per RTT). Sizes keep
uet-htsim's scaling: a BDP of a few dozen packets gives ``a`` of a few tenths.
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

from dataclasses import dataclass
from functools import cached_property

#: uet-htsim's reference network: 100 Gb/s x 12 us
REF_BDP_BYTES = 100e9 / 8 * 12e-6
DELAY_EWMA = 0.0125
GAMMA = 0.8
#: The MSS NSCC's gains are scaled with (bytes): uet-htsim's ``UecSrc::_mss``, the paper's 4 KiB frames
REF_MSS_BYTES = 4096
#: quick adapt when less than this share of maxwnd got through in a window (uet-htsim ``_qa_gate`` 3: maxwnd >> 3)
QUICK_ADAPT_FRACTION = 1 / 8
#: increases are applied once this many MSS have been acknowledged since the last time, or a base RTT
#: has passed (uet-htsim ``_adjust_bytes_threshold = 8 x _mtu``, ``_adjust_period_threshold``)
ADJUST_PACKETS = 8
#: the fast increase's delay threshold in base RTTs: uet-htsim's 1 us over its default network's
#: 14.02272 us (``fast_increase``; ``_network_rtt`` of its 16-node fat tree at 100 Gb/s)
FAST_INCREASE_DELAY_RTTS = 1 / 14.02272
#: with ``quarter_unmarked``, an unmarked acknowledgement whose delay is over the target feeds the
#: average this share of the base RTT instead (uet-htsim ``update_delay``: ``_base_rtt * 0.25``)
UNMARKED_DELAY_RTTS = 0.25


class FixedWindow:
    """A window of ``packets`` full-size packets that never moves."""

    name = "fixed"

    def __init__(self, packets: int, mss: int) -> None:
        """A window of ``packets`` x ``mss`` bytes."""
        self.cwnd_bytes = float(packets * mss)

    def on_ack(self, acked_bytes: int, rtt_s: float | None, ecn: bool, now: float, in_flight: float = 0.0) -> None:
        """Nothing: the window never moves."""

    def on_nack(self, nacked_bytes: int, now: float, in_flight: float = 0.0) -> None:
        """Nothing: the window never moves."""


@dataclass
class NsccParams:
    """NSCC's parameters for one BDP and base RTT, scaled as in uet-htsim (module docstring):
    ``mss`` and ``bdp_bytes`` in bytes, the target queueing delay ``target_s`` and ``base_rtt_s``
    in seconds. Derived figures are computed once (read on every acknowledgement)."""

    mss: int
    bdp_bytes: float
    target_s: float
    base_rtt_s: float

    @cached_property
    def a(self) -> float:
        """The BDP over uet-htsim's reference BDP (100 Gb/s x 12 us = 150,000 bytes)."""
        return self.bdp_bytes / REF_BDP_BYTES

    @cached_property
    def b(self) -> float:
        """The target delay over the reference RTT, here the base RTT (ours; uet-htsim: 12 us)."""
        return self.target_s / self.base_rtt_s  # time runs slower here: the fabric's own RTT is the reference

    @cached_property
    def alpha(self) -> float:
        """The proportional increase's gain, ``4 MSS a b / target`` (MSS: :data:`REF_MSS_BYTES`)."""
        return 4 * REF_MSS_BYTES * self.a * self.b / self.target_s

    @cached_property
    def fi(self) -> float:
        """The fair increase's gain, ``5 MSS a`` (MSS: :data:`REF_MSS_BYTES`)."""
        return 5 * REF_MSS_BYTES * self.a

    @cached_property
    def eta(self) -> float:
        """Bytes added to the window every adjustment period, ``0.15 MSS a`` (MSS: :data:`REF_MSS_BYTES`)."""
        return 0.15 * REF_MSS_BYTES * self.a

    @cached_property
    def fi_scale(self) -> float:
        """The fast increase's share of each acknowledged byte added to the window, ``0.25 a``
        (uet-htsim ``_fi_scale``)."""
        return 0.25 * self.a

    @cached_property
    def fast_delay_s(self) -> float:
        """The queueing delay under which acknowledgements count towards a fast increase: the
        reference's 1 us in its 14.02 us network RTT (uet-htsim ``fast_increase``), in base RTTs."""
        return FAST_INCREASE_DELAY_RTTS * self.base_rtt_s

    @cached_property
    def maxwnd(self) -> float:
        """The window's ceiling, 1.5 BDP (bytes)."""
        return 1.5 * self.bdp_bytes


class Nscc:
    """NSCC for one QP (see the module docstring). ``line_rate_bps``: the QP's line rate (bits/s,
    0 when unknown); ``initial_bytes``: the window before the first RTT sample and the BDP where
    the line rate is unknown; ``base_rtt_s``: a known base RTT (0: the smallest sample);
    ``quarter_unmarked``: average an unmarked delay over the target as a quarter base RTT, as the
    reference does (off in the lab: see the module docstring)."""

    name = "nscc"

    def __init__(self, mss: int, line_rate_bps: float, initial_bytes: float, base_rtt_s: float = 0.0,
                 min_bdp_bytes: float = 0.0, quarter_unmarked: bool = False) -> None:
        """The window starts at ``initial_bytes``; the parameters are set at once from a known
        ``base_rtt_s``, else at the first RTT sample. ``min_bdp_bytes``: the BDP's floor (never
        under one ``mss``)."""
        self.mss, self.line_rate_bps, self.initial = mss, line_rate_bps, initial_bytes
        self.min_bdp = max(float(mss), min_bdp_bytes)
        self.quarter_unmarked = quarter_unmarked
        self.base_rtt_s = base_rtt_s or None
        self.cwnd_bytes = float(initial_bytes)
        self.avg_delay = 0.0
        self.inc = 0.0
        self.received = 0.0  # bytes acknowledged since increases were last applied
        self.last_adjust: float | None = None  # when eta was last added
        self.fi_count = 0.0  # bytes acknowledged at a near-empty queue in a row (the fast increase's)
        self.increasing = False  # the fast increase is on
        self.last_decrease = -1.0
        # quick adapt (uet-htsim's names): bytes acknowledged in the window ending at qa_end, whether a
        # NACK armed it, and the NACKed and marked bytes to ignore after one (those in flight then)
        self.qa_achieved = 0
        self.qa_end: float | None = None
        self.qa_armed = False
        self.qa_to_ignore = 0.0
        self.qa_ignored = 0.0
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
        return NsccParams(self.mss, max(bdp, self.min_bdp), 0.75 * base_rtt_s, base_rtt_s)

    def on_ack(self, acked_bytes: int, rtt_s: float | None, ecn: bool, now: float, in_flight: float = 0.0) -> None:
        """One acknowledgement at ``now`` (s): ``acked_bytes`` newly acknowledged, its RTT sample
        (``rtt_s``; None: none, e.g. a retransmission's) and whether it echoed ECN CE; the table
        of the module docstring, after the quick adapt a NACK armed (``in_flight``: the bytes in
        flight now, which a quick adapt then ignores the NACKs of). A sample below the base RTT (a
        known one too) becomes the base RTT and rescales the parameters; before any base RTT
        nothing moves."""
        if rtt_s is not None and rtt_s > 0 and (self.base_rtt_s is None or rtt_s < self.base_rtt_s):
            self.base_rtt_s = rtt_s  # the path with the shortest queue so far
            self.p = self._params(rtt_s)
        p = self.p
        if p is None:
            return
        self.qa_achieved += acked_bytes
        self.qa_ignored += acked_bytes
        self.received += acked_bytes
        target = p.target_s
        if rtt_s is not None and rtt_s >= p.base_rtt_s:
            delay = rtt_s - p.base_rtt_s
            # the average (uet-htsim update_delay; :meth:`_update_delay`, inlined: every acknowledgement)
            fed = UNMARKED_DELAY_RTTS * p.base_rtt_s if self.quarter_unmarked and not ecn and delay > target else delay
            self.avg_delay += DELAY_EWMA * (fed - self.avg_delay)
        else:  # no sample: the average stands in (uet-htsim processAck)
            delay = self.avg_delay
        if (self.qa_end is not None and now > self.qa_end) or (ecn and self.qa_ignored < self.qa_to_ignore):
            if self._quick_adapt(now, in_flight, skip=ecn):
                return
        elif self.qa_end is None:
            self.qa_end = now + p.base_rtt_s + target  # the quick adapt's first window starts
        if not ecn and delay >= target:
            self.inc += p.fi * acked_bytes  # fair increase
        elif not ecn:
            if delay >= p.fast_delay_s:  # a queue: no fast increase (uet-htsim fast_increase)
                self.fi_count, self.increasing = 0.0, False
                self.inc += p.alpha * acked_bytes * (target - delay)  # proportional increase
            elif not self._fast_increase(acked_bytes):
                self.inc += p.alpha * acked_bytes * (target - delay)
        elif delay >= target:
            self._multiplicative_decrease(now)
        lo, hi = p.mss, p.maxwnd  # the window's bounds (uet-htsim set_cwnd_bounds), before and after
        cwnd = min(max(self.cwnd_bytes, lo), hi)
        if self.last_adjust is None:
            self.last_adjust = now
        if self.received > ADJUST_PACKETS * lo or now - self.last_adjust > p.base_rtt_s:
            cwnd += self.inc / cwnd
            if now - self.last_adjust >= p.base_rtt_s:
                cwnd += p.eta
                self.last_adjust = now
            self.inc = self.received = 0.0
            cwnd = min(max(cwnd, lo), hi)
        self.cwnd_bytes = cwnd

    def _update_delay(self, delay: float, ecn: bool) -> None:
        """The average queueing delay after a sample of ``delay`` (s): uet-htsim ``update_delay``.
        With ``quarter_unmarked``, an unmarked sample over the target feeds a quarter of the base
        RTT instead."""
        p = self.p
        assert p is not None
        if self.quarter_unmarked and not ecn and delay > p.target_s:
            delay = UNMARKED_DELAY_RTTS * p.base_rtt_s
        self.avg_delay += DELAY_EWMA * (delay - self.avg_delay)

    def _fast_increase(self, acked_bytes: int) -> bool:
        """uet-htsim ``fast_increase``, for an acknowledgement at a near-empty queue (under
        :attr:`NsccParams.fast_delay_s`; a sample over it ends the fast increase, in :meth:`on_ack`):
        once a window's worth of bytes is acknowledged so in a row, each acknowledged byte adds
        ``fi_scale`` of itself to the window at once. True while on."""
        p = self.p
        assert p is not None
        self.fi_count += acked_bytes
        if self.fi_count > self.cwnd_bytes or self.increasing:
            self.cwnd_bytes += acked_bytes * p.fi_scale
            self.increasing = True
            return True
        self.increasing = False
        return False

    def _multiplicative_decrease(self, now: float) -> None:
        """uet-htsim ``multiplicative_decrease``: with the average delay over the target, at most
        once per base RTT, ``cwnd *= max(1 - gamma (avg - target) / avg, 0.5)``."""
        p = self.p
        assert p is not None
        self.increasing, self.fi_count = False, 0.0
        if self.avg_delay > p.target_s and now - self.last_decrease > p.base_rtt_s:
            self.cwnd_bytes *= max(1 - GAMMA * (self.avg_delay - p.target_s) / self.avg_delay, 0.5)
            self.last_decrease = now

    def on_nack(self, nacked_bytes: int, now: float, in_flight: float = 0.0) -> None:
        """A NACK for a trimmed packet of ``nacked_bytes`` at ``now`` (s), ``in_flight`` bytes in
        flight: it arms the quick adapt, which runs if its window is over (see the module
        docstring); a NACK the last quick adapt ignores changes nothing; any other takes its bytes
        off the window (uet-htsim ``updateCwndOnNack_NSCC``).

        Not the reference's delay trigger (a quick adapt on any acknowledgement whose delay passes
        four targets): adopted with the rest of its law (2026-11-29) it held ecn-load-balancing's
        h0 at one packet, where a flow's window is about one BDP of one packet and one of its 16
        EVs read four targets behind a pinned flow's queue (docs/benchmarks.md)."""
        p = self.p
        if p is None:
            return
        self.qa_ignored += nacked_bytes
        # the trim threshold's delay, a base RTT here (uet-htsim: its network RTT), into the average
        self._update_delay(p.base_rtt_s, True)
        self.qa_armed = True
        if self._quick_adapt(now, in_flight, skip=True):
            return
        self.cwnd_bytes = max(p.mss, self.cwnd_bytes - nacked_bytes)

    def _quick_adapt(self, now: float, in_flight: float, skip: bool) -> bool:
        """uet-htsim's ``quick_adapt`` for a loss: True when it ran now, or when this NACK or marked
        acknowledgement (``skip``) is of the bytes in flight at the last one (ignored); the caller
        then leaves the window alone. Otherwise, past the end of its window, a new window starts."""
        p = self.p
        assert p is not None
        if skip and self.qa_ignored < self.qa_to_ignore:
            self.inc = self.received = 0.0
            return True
        if self.qa_end is None:  # the first window starts with the first signal
            self.qa_end = now + p.base_rtt_s + p.target_s
            return False
        if now <= self.qa_end:
            return False
        ran = self.qa_armed and self.qa_achieved < QUICK_ADAPT_FRACTION * p.maxwnd
        if ran:
            self.cwnd_bytes = max(float(self.qa_achieved), float(p.mss))
            self.last_decrease = now
            self.qa_to_ignore, self.qa_ignored, self.qa_armed = in_flight, 0.0, False
            self.inc = self.received = 0.0
        self.qa_achieved = 0
        self.qa_end = now + p.base_rtt_s + p.target_s
        return ran
