"""The receiving side of one MRC QP as a pure state machine (:class:`MrcReceiver`): no I/O.

It places every data packet at its RETH address in any order (:class:`~traffic.region.ReceiveRegion`),
counts each PSN once, SACKs, NACKs trimmed packets and completes messages (docs/protocol.md,
"Receiver"):

* a SACK carries the cumulative PSN, a 64-bit bitmap ending at the newest arrival it reports, a
  64-bit bitmap of the PSNs in that window that arrived trimmed (and not since), and the echoed EV
  and PSN of the last arrival (with its ECN mark);
* a trimmed packet (a switch cut its payload: congestion) is answered at once by a NACK naming its
  PSN and EV, and stays in the trim bitmap of later SACKs until it arrives whole, so a lost or
  overtaken NACK cannot make it look like an untrimmed loss;
* SACKs are due every ``ack_every`` packets or after ``ack_delay_s``, coalesced over a receive
  batch: a due SACK leaves at the next ``poll`` (the end of the batch), at most
  :data:`SACK_COALESCE_MAX` arrivals late, and at once for an arrival with ECN CE;
* while the PSNs received above the cumulative PSN span more than a bitmap (64), each SACK of a
  batch has a second one beside it that reports the next 64-PSN chunk of that span again, in
  turn, each chunk through another T1 than its last report (ours): the batch's own SACK reports
  only its own 64 PSNs, and one lost with a dying reverse path left the middle of the span to the
  sender's timer, which blamed healthy EVs;
* when arrivals stop for ``min_rto_s`` / 2, the last SACK is sent again, :data:`SACK_REFRESHES`
  times at once, each through another T1 than the one before (ours): SACKs leave on a rotation of
  reverse paths, and a burst's one SACK lost on a path that just died would otherwise leave every
  packet of the burst, on healthy paths too, to its sender's timer, which would blame their EVs.
  Half the timer floor is the latest a repeat is sure to beat the timer (see
  :data:`SACK_REFRESH_SHARE`), and the latest is what a QP needs whose packets come further apart
  than a few ack delays but closer than its timer floor: its next arrival's SACK reports the last
  one instead. (Repeats 4 and 8 ack delays after each SACK sent two per arrival in an all-to-all
  at 2 Mb/s, 7 QPs to a port and one arrival every ~50 ms each: SACKs were 0.42 of the data bytes.)
* malformed or out-of-window packets are counted in ``stats.dropped`` and never raise.
"""

from __future__ import annotations

from collections.abc import Callable

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import ev_t1
from mrclab.traffic.contract import Event, MessageCorrupt, Trimmed
from mrclab.traffic.packet import PSN_MOD, SACK_BITMAP_BITS, Pkt, rkey_for
from mrclab.traffic.ports import ALL_UP
from mrclab.traffic.region import ReceiveRegion
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.stats import ReceiverStats

#: A receiver never holds more than this many arrivals unacknowledged while it works through a
#: receive batch: half the SACK bitmap, so one SACK still reports every arrival above cum_psn when
#: the batch arrived in order (ours; NICs coalesce ACKs per interrupt or per poll likewise).
SACK_COALESCE_MAX = 32
#: How many repeats of the last SACK leave once arrivals stop (ours).
SACK_REFRESHES = 2
#: They leave when no arrival came for ``min_rto_s`` / SACK_REFRESH_SHARE since the last SACK (ours).
#: The sender's timer runs from the packet's NIC departure and is max(min_rtt + min_rto_s,
#: 2 srtt + 4 rttvar) at least (traffic/rtt.py), and a repeat reaches it an RTT plus this delay
#: after that departure: with the delay at half of min_rto_s, an RTT under min_rtt + min_rto_s / 2
#: is within the first bound and a longer one within the second (2 srtt), so the repeat beats the
#: timer at any queueing.
SACK_REFRESH_SHARE = 2
_DATA_OPS = frozenset((H.OP_WRITE, H.OP_WRITE_IMM))
_F_TRIM = H.F_TRIM
_F_RETX = H.F_RETX
_HALF_PSN = PSN_MOD // 2
_STAMP_HZ, _NO_WIRE = H.STAMP_HZ, H.NO_WIRE


def _ignore(_e: Event) -> None:
    pass


class MrcReceiver:
    """Receiving side of one QP. ``reverse_ev()`` picks the EV each SACK/NACK travels on."""

    def __init__(self, qp: int, settings: TransportSettings, reverse_ev: Callable[[], int],
                 *, events: Callable[[Event], None] | None = None) -> None:
        """Nothing received yet, every port up. ``events`` hears trimmed arrivals and corrupt
        messages."""
        self.qp, self.s, self.reverse_ev = qp, settings, reverse_ev
        self._rkey = rkey_for(qp)
        self._max_window = settings.max_psn_window
        self.events = events or _ignore
        self.stats = ReceiverStats()
        self.region = ReceiveRegion(settings.region_bytes, self.stats,
                                    lambda msn: self.events(MessageCorrupt(qp=qp, msn=msn)))
        self.cum = 0  # every PSN below is received
        self.above: set[int] = set()
        self.trimmed: set[int] = set()  # PSNs that arrived trimmed and not since whole
        self.newest = -1
        self.pending_ack = 0  # arrivals not yet SACKed, all within one bitmap: pending_lo..pending_hi
        self.pending_since: float | None = None
        self.pending_lo = self.pending_hi = 0
        self.last = (0, 0, False, _NO_WIRE)  # echo psn, echo ev, ecn, its one-way time
        self.peer_ports = ALL_UP
        self.local_ports = ALL_UP
        self._rereport_at = 0  # the next 64-PSN chunk above cum_psn that a flush reports again
        self._rereport_t1: dict[int, int] = {}  # a chunk (its index from cum_psn) -> T1 of its last report
        self.last_sack_at = 0.0
        self.refreshes_left = 0
        self._refresh_s = settings.min_rto_s / SACK_REFRESH_SHARE  # the delay of each repeat (s)
        self._last_back = 0  # the reverse EV of the last SACK/NACK
        self._ev_newest: dict[int, int] = {}  # EV -> the newest first transmission that arrived whole on it

    def on_packet(self, p: Pkt, now: float) -> list[Pkt]:
        """Take one arriving packet; returns SACKs/NACKs to send at once (usually none)."""
        if p.op not in _DATA_OPS:
            self.stats.drop("unexpected opcode")
            return []
        return self.on_write(p.psn, p.ev, p.flags, p.msn, p.msg_len, p.msg_crc, p.msg_offset, p.va, p.rkey, p.dma_len,
                             p.payload, p.imm if p.op == H.OP_WRITE_IMM else None, p.port_state, p.ecn_ce, now, p.stamp)

    # hot path, kept whole on purpose (a data packet's arrival: one call per packet, its bookkeeping inlined)
    def on_write(self, psn24: int, ev: int, flags: int, msn: int, msg_len: int, msg_crc: int, msg_offset: int,  # noqa: PLR0915
                 va: int, rkey: int, dma_len: int, payload, imm: int | None, port_state: int, ecn_ce: bool,
                 now: float, stamp: int = -1) -> list[Pkt]:
        """:meth:`on_packet` of a data packet from its fields (a :class:`Pkt`'s, ``imm`` None for a
        plain Write), as the host stack's receive path hands them over without making a Pkt.
        ``stamp``: its send stamp (headers.STAMP_HZ units mod 2^16; -1: none), whose one-way time
        to ``now`` the SACK echoing this arrival carries."""
        self.peer_ports = port_state
        if stamp < 0:
            wire = _NO_WIRE
        else:  # its one-way time; a stamp "after" now (now is the receive batch's start) is 0
            wire = (int(now * _STAMP_HZ) - stamp) & 0xFFFF
            if wire >= 0x8000:
                wire = 0
        cum = self.cum
        d = (psn24 - cum) % PSN_MOD  # psn_near(psn24, cum), inlined: the receiver's hot path
        psn = cum + d if d < _HALF_PSN else cum + d - PSN_MOD
        if psn >= cum + self._max_window:
            self.stats.drop("out of window")
            return []
        if flags & _F_TRIM or len(payload) < dma_len:
            self.stats.trimmed += 1
            self.events(Trimmed(qp=self.qp, psn=psn, ev=ev))
            if psn < cum or psn in self.above:  # a trimmed copy of what already arrived whole
                return []
            self.trimmed.add(psn)
            if len(self.trimmed) > SACK_BITMAP_BITS:  # bounded: the oldest ones are in no bitmap anyway
                self.trimmed.discard(min(self.trimmed))
            return [self._sack(H.OP_NACK, psn, ev, H.S_TRIM, max(self.newest, psn), wire=wire)]
        if not flags & _F_RETX:  # a first transmission: on its EV, behind none sent after it (one FIFO path)
            newest = self._ev_newest.get(ev, -1)
            if psn < newest:
                self.stats.reordered += 1
            else:
                self._ev_newest[ev] = psn
        if psn < cum or psn in self.above:
            self.stats.duplicates += 1
            return [self._sack(H.OP_SACK, psn, ev, 0, psn, wire=wire)]
        if rkey != self._rkey:
            self.stats.drop("bad rkey")
            return []
        why = self.region.receive(msn, msg_len, msg_crc, msg_offset, va, payload, dma_len, imm)
        if why:
            self.stats.drop(why)
            return []
        out = []
        if self.pending_ack and ((psn if psn > self.pending_hi else self.pending_hi)
                                 - (psn if psn < self.pending_lo else self.pending_lo)) >= SACK_BITMAP_BITS:
            out += self._flush()  # this arrival and the pending ones would not fit one bitmap
        st = self.stats
        st.data_packets += 1
        st.delivered_bytes += dma_len
        if self.trimmed:
            self.trimmed.discard(psn)
        if psn == cum:
            cum += 1
            above = self.above
            while cum in above:
                above.discard(cum)
                cum += 1
            self.cum = cum
        else:
            self.above.add(psn)
        if psn > self.newest:  # noqa: PLR1730 (the hot path: max() is a call)
            self.newest = psn
        self.last = (psn, ev, ecn_ce, wire)
        if self.pending_ack:
            if psn < self.pending_lo:
                self.pending_lo = psn
            elif psn > self.pending_hi:
                self.pending_hi = psn
        else:
            self.pending_lo = self.pending_hi = psn
            self.pending_since = now
        self.pending_ack += 1
        if ecn_ce or self.pending_ack >= SACK_COALESCE_MAX:
            out += self._flush()
        return out  # else due at the next poll (the end of the receive batch) once ack_every are pending

    def _sack(self, op: int, echo_psn: int, echo_ev: int, flags: int, top: int, base: int | None = None,
              avoid_t1: int | None = None, wire: int = 0xFFFF) -> Pkt:
        """A SACK/NACK whose bitmap covers the 64 PSNs up to ``top`` (never below cum_psn), or from
        ``base``; ``avoid_t1``: through another T1 than that one, if the reverse set has one;
        ``wire``: the echoed arrival's one-way time (headers.STAMP_HZ units; NO_WIRE: unknown)."""
        if base is None:
            base = max(self.cum, top - (SACK_BITMAP_BITS - 1))
        bm = tbm = 0
        for q in self.above:  # PSNs received above cum: few unless the paths reorder a lot
            d = q - base
            if 0 <= d < SACK_BITMAP_BITS:
                bm |= 1 << d
        for q in self.trimmed:
            d = q - base
            if 0 <= d < SACK_BITMAP_BITS:
                tbm |= 1 << d
        back = self.reverse_ev()
        if avoid_t1 is not None:
            for _ in range(8):
                if ev_t1(back) != avoid_t1:
                    break
                back = self.reverse_ev()
        self._last_back = back
        return Pkt(op=op, qp=self.qp, ev=back, cum_psn=self.cum % PSN_MOD, base_psn=base % PSN_MOD,
                   bitmap=bm, trim_bitmap=tbm, echo_ev=echo_ev, echo_psn=echo_psn % PSN_MOD, sflags=flags,
                   port_state=self.local_ports, echo_wire=wire)

    def _flush(self) -> list[Pkt]:
        """The SACK of the pending arrivals; and, while arrivals span more than a bitmap above
        cum_psn, a second one that reports the next 64-PSN chunk of that span again (from cum_psn
        up, and round again), each chunk through another T1 than its last report. The pending
        batch's SACK reports only its own 64 PSNs: when it is lost (a reverse path dying), the
        arrivals it reported would otherwise wait for cum_psn to pass them, which the lost
        packets holding it back do only after their sender's timer, and that timer then blames
        their healthy EVs too. (Every other SACK reporting the 64 PSNs from cum_psn instead, as
        before, left the rest of the span unreported: t0t1-links-flap with a 5 ms path delay
        retired healthy EVs whose packets had arrived, 2026-11-26 captures.)"""
        psn, ev, ecn, wire = self.last
        self.pending_ack = 0
        self.pending_since = None
        self.refreshes_left = SACK_REFRESHES
        self.last_sack_at = -1.0  # stamped by poll, which knows the time
        flags = H.S_ECN if ecn else 0  # both echo the same arrival: the first to reach the sender samples it
        out = [self._sack(H.OP_SACK, psn, ev, flags, self.pending_hi, wire=wire)]
        cum = self.cum
        if self.newest - cum >= SACK_BITMAP_BITS:
            at = self._rereport_at
            if at < cum or at > self.newest:
                at = cum
            self._rereport_at = at + SACK_BITMAP_BITS
            chunk = (at - cum) // SACK_BITMAP_BITS
            again = self._sack(H.OP_SACK, psn, ev, flags, 0, base=at, avoid_t1=self._rereport_t1.get(chunk), wire=wire)
            self._rereport_t1[chunk] = ev_t1(again.ev)
            out.append(again)
        return out

    def poll(self, now: float) -> list[Pkt]:
        """The SACK that is due: ``ack_every`` packets pending, or one pending for ``ack_delay_s``;
        or, arrivals having stopped, a repeat of the last one (see the module docstring)."""
        n = self.pending_ack
        if n and (n >= self.s.ack_every or now - self.pending_since >= self.s.ack_delay_s):  # type: ignore[operator]
            out = self._flush()
            self.last_sack_at = now
            return out
        if self.refreshes_left and not n:
            if self.last_sack_at < 0:
                self.last_sack_at = now
            elif now - self.last_sack_at >= self._refresh_s:
                psn, ev, _, wire = self.last
                out = []
                while self.refreshes_left:  # each through another T1 than the SACK before it
                    self.refreshes_left -= 1
                    out.append(self._sack(H.OP_SACK, psn, ev, 0, max(self.newest, 0),
                                          avoid_t1=ev_t1(self._last_back), wire=wire))
                self.last_sack_at = now
                return out
        return []


    def next_due(self, now: float) -> float:
        """The earliest time (s, the clock of ``now``) at which :meth:`poll` may have a SACK to
        send with no packet received before then: the delayed SACK of pending arrivals, or the
        next repeat of the last SACK; ``inf`` when neither is owed."""
        n = self.pending_ack
        if n:
            if n >= self.s.ack_every or self.pending_since is None:
                return now
            return self.pending_since + self.s.ack_delay_s
        if self.refreshes_left:
            if self.last_sack_at < 0:
                return now
            return self.last_sack_at + self._refresh_s
        return float("inf")


def probe_reply(p: Pkt, reverse_ev: int, port_state: int) -> Pkt:
    """The answer to probe request ``p``, sent back on ``reverse_ev``; it echoes the probed EV."""
    return Pkt(op=H.OP_PROBE, qp=p.qp, ev=reverse_ev, probe_id=p.probe_id, is_reply=1, t_send_ns=p.t_send_ns,
               echo_ev=p.ev, port_state=port_state)
