"""The baseline: a RoCEv2-style Reliable Connection on the same headers (docs/mrc.md, "Relatives").

One path per QP, chosen by hashing the QP's 5-tuple as ECMP would (deterministic for a seed); the
receiver accepts only the next expected PSN, drops anything else and answers the first
out-of-order packet of a gap with a sequence-error NACK; the sender then goes back N to the NACKed
PSN. A retransmission timer (go back N from the oldest unacknowledged PSN, doubling up to
``max_rto_s``) covers lost NACKs and dead paths: with its one path cut the QP stalls until then.
Where the NIC port stamps its departures (traffic/txstamp.py) the timer runs from when that PSN
left the port, as a NIC's transport timer starts when it sends the request packet (the requester's
Local ACK Timeout, InfiniBand Architecture Specification vol. 1, ch. 9), not from its hand-off.

Rate control is DCQCN (:mod:`traffic.dcqcn`, ``roce_cc: dcqcn``): the receiver answers CE-marked
packets with CNPs, the sender paces itself at DCQCN's rate (its line rate, ``port_mbps``, until the
first CNP; with no known line rate it is held by its window only). ACKs, NACKs and CNPs go back on
the QP's own reverse path (the ECMP hash of the reverse direction), as a single-path transport's do.
A trimmed packet (a switch that trims serves MRC; RoCE NICs know no trimming) is dropped like any
damaged packet, and the gap it leaves is NACKed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, ev_plane
from mrclab.traffic.contract import Event, Nacked, TimedOut
from mrclab.traffic.dcqcn import Dcqcn, Pacer
from mrclab.traffic.evs import EvState
from mrclab.traffic.outbox import Outbox
from mrclab.traffic.packet import PSN_MOD, Pkt, psn_at_or_below, psn_near, rkey_for
from mrclab.traffic.receiver import MrcReceiver
from mrclab.traffic.rtt import RttEstimator
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.stats import SenderStats


def ecmp_ev(plan: AddressPlan, src: str, dst: str, qp: int, seed: int) -> int:
    """The one path an ECMP hash of (src, dst, qp, seed) picks among all paths of the pair."""
    paths = plan.paths(src, dst)
    h = int.from_bytes(hashlib.sha256(f"{seed}:{src}:{dst}:{qp}".encode()).digest()[:4], "big")
    return paths[h % len(paths)].ev


#: How much earlier than its transmission's hand-off a stamp may say it was handed over and still be
#: that transmission's: two units of the frame's send stamp (headers.STAMP_HZ), the clocks' reading
_HAND_SLACK_S = 2 / H.STAMP_HZ


class RoceSender:
    """Go-back-N sender on a single EV."""

    def __init__(self, qp: int, ev: int, messages: Iterator[tuple[int, bytes] | None], settings: TransportSettings,
                 *, imm: bool = False, events: Callable[[Event], None] | None = None) -> None:
        """Sender of QP ``qp`` on the one EV ``ev``, taking messages from ``messages`` (``(msn,
        bytes)``; None: none ready yet). ``imm``: Write-with-Immediate, the MSN as immediate. With
        ``roce_cc: dcqcn`` and a known line rate (``port_mbps``) DCQCN paces it; else only the
        window holds it."""
        self.qp, self.ev, self.s, self.imm = qp, ev, settings, imm
        self.events = events or (lambda _e: None)
        self.stats = SenderStats()
        #: the messages cut into packets, kept until acknowledged (traffic/outbox.py, as MRC's)
        self.box = Outbox(messages, settings, self.stats)
        self.pkts: list[tuple[int, int, int, int, int]] = []  # psn -> (msn, msg_len, crc, offset, length)
        self.una = 0  # oldest unacknowledged PSN
        self.nxt = 0  # next PSN to (re)send
        self.built = 0  # PSNs materialised so far
        self.timer: float | None = None
        self.backoff = 1
        self.local_ports = 0xFF
        self._high = 0  # one past the highest PSN ever sent: below it a send is a retransmission
        self.rtt = RttEstimator(settings)
        self.sent_at: dict[int, float] = {}  # first transmissions, for RTT samples
        #: bit p: the plane-p NIC port stamps its departures (set by the host stack, as
        #: MrcSender.wire_ports): the go-back-N timer then runs from them (:meth:`_timer_expired`)
        self.wire_ports = 0
        self.handed_at: dict[int, float] = {}  # PSN -> when its last transmission was handed to the port
        self.left_at: dict[int, float] = {}  # PSN -> when its port sent that transmission (its stamp)
        #: what :meth:`poll` returns for a data packet, from its fields in DATA_FIELDS order: a
        #: :class:`Pkt`, or the frame where the host stack gives its wire's framer (as MrcSender's)
        self.make_data: Callable[..., Any] = Pkt
        mss = settings.frame_bytes
        line = settings.port_mbps * 1e6
        self.dcqcn = Dcqcn(line, mss, settings.dcqcn_timer_s) if settings.roce_cc == "dcqcn" and line > 0 else None
        self._timer_from_rtt = settings.dcqcn_timer_s == 0  # 5 base RTTs, once an RTT is known
        self.pacer = Pacer(2 * mss)
        #: the PSNs the last :meth:`poll` sent, as (first, count): :meth:`departed` stamps them
        self.new_span = (0, 0)

    @property
    def done(self) -> bool:
        """Every message taken has been acknowledged and no more will be taken."""
        return self.box.exhausted and self.una >= self.built

    def stop(self) -> None:
        """Take no new message; those already cut into packets are still sent."""
        self.box.exhausted = True

    @property
    def completion_s(self) -> list[float]:
        """Completion time (s) of every acknowledged message, first packet sent to last acknowledged."""
        return self.box.completion_s

    def set_local_ports(self, state: int) -> None:
        """This NIC's port bitmap, carried in every data packet (one path: nothing else changes)."""
        self.local_ports = state

    @property
    def srtt_s(self) -> float | None:
        """Smoothed RTT (s; None before the first sample)."""
        return self.rtt.srtt

    @property
    def window_bytes(self) -> float:
        """The fixed window: ``window_packets`` full packets on the wire, in bytes."""
        return float(self.s.window_packets * self.s.frame_bytes)

    @property
    def rate_bps(self) -> float | None:
        """DCQCN's current rate (bits/s), None without DCQCN."""
        return self.dcqcn.rate_bps if self.dcqcn is not None else None

    def ev_states(self) -> dict[int, EvState]:
        """The one EV, always GOOD: a single-path QP never judges its path."""
        return {self.ev: EvState.GOOD}  # one path, never judged

    def ev_packets(self) -> dict[int, int]:
        """Data packets sent on the one EV, first transmissions and retransmissions."""
        return {self.ev: self.stats.data_packets + self.stats.retransmits}

    def _materialise(self) -> bool:
        """The next message from the outbox, placed in the region and cut into PSNs (go-back-N
        resends any of them); False when none is ready or the source is exhausted."""
        if not self.box.fetch():
            return False
        assert self.box.cur is not None  # fetch() took a message
        msn, data, crc, _ = self.box.cur
        self.box.cur = None  # every packet of it is a PSN from now on
        self.box.ring.place(msn, len(data))
        off = 0
        while True:
            ln = min(self.s.payload_bytes, len(data) - off)
            self.pkts.append((msn, len(data), crc, off, ln))
            off += ln
            if off >= len(data):
                break
        self.built = len(self.pkts)
        return True

    def poll(self, now: float, budget: int = 64) -> list:
        """Data packets to send now, at most ``budget`` (what ``make_data`` makes of each). First
        the timer: with PSNs outstanding and
        none acknowledged for ``5 x min_rto_s`` (doubling per timeout, at most ``max_rto_s``), go
        back N to the oldest unacknowledged PSN; then PSNs from the next to send, within the
        window and, with DCQCN, as the pacer allows."""
        out: list[Pkt] = []
        rto = min(self.s.max_rto_s, self.s.min_rto_s * 5 * self.backoff)
        if self.timer is not None and now - self.timer > rto and self.una < self.nxt and self._timer_expired(now, rto):
            self.stats.timeouts += 1
            self.events(TimedOut(qp=self.qp, psn=self.una, ev=self.ev))
            self.nxt = self.una
            self.backoff = min(self.backoff * 2, 64)
            self.timer = now
        cc = self.dcqcn
        if cc is not None:
            cc.tick(now)
        self.new_span = (self.nxt, 0)  # out holds consecutive PSNs from here (after any go-back-N)
        while len(out) < budget and self.nxt - self.una < self.s.window_packets:
            if self.nxt >= self.built and not self._materialise():
                break
            msn, msg_len, crc, off, ln = self.pkts[self.nxt]
            if cc is not None:
                if not self.pacer.allow(ln + H.DATA_OVERHEAD, cc.rate_bps, now):
                    break
                cc.on_sent(ln + H.DATA_OVERHEAD, now)
            data = memoryview(self.box.cache[msn][0])[off : off + ln]
            va = self.box.ring.base[msn] + off
            retx = self.nxt < self._high
            out.append(self.make_data(H.OP_WRITE_IMM if self.imm else H.OP_WRITE, self.qp,  # DATA_FIELDS order
                                      self.nxt % PSN_MOD, self.ev, H.F_RETX if retx else 0, msn, msg_len, crc, off,
                                      va, rkey_for(self.qp), ln, data, msn if self.imm else None, self.local_ports,
                                      False))
            if retx:
                self.stats.retransmits += 1
                self.sent_at.pop(self.nxt, None)  # Karn: no RTT sample from a resent PSN
            else:
                self.stats.data_packets += 1
                self.sent_at[self.nxt] = now
                self.box.started.setdefault(msn, now)
            self.handed_at[self.nxt] = now
            self.left_at.pop(self.nxt, None)
            self.nxt += 1
            self._high = max(self._high, self.nxt)
            if self.timer is None:
                self.timer = now
        self.new_span = (self.new_span[0], len(out))
        return out

    def _timer_expired(self, now: float, rto: float) -> bool:
        """The go-back-N timer, ``rto`` (s) past its start, has run out: always where the port does
        not stamp; else only ``rto`` after the oldest unacknowledged PSN left its port. A PSN its port
        holds still (no stamp yet, the port up, within ``max_rto_s`` of its hand-off) is not timed
        out: the timer restarts now and the stamp re-times it. Re-timing moves the timer's start
        (so :meth:`next_due` follows) and counts ``stats.nic_deferred``."""
        plane = ev_plane(self.ev)
        if not (self.wire_ports >> plane) & 1:
            return True
        una = self.una
        left = self.left_at.get(una)
        if left is None:
            hand = self.handed_at.get(una, self.timer)
            if not (self.local_ports >> plane) & 1 or now - hand >= self.s.max_rto_s:  # type: ignore[operator]
                return True
            left = now
        elif now - left > rto:
            return True
        self.timer = left
        self.stats.nic_deferred += 1
        return False

    def departed(self, waits: list[float], start: int) -> None:
        """The host's NIC model's wait (s) for every frame of a turn, this sender's last
        :meth:`poll` among them from index ``start`` (as :meth:`~traffic.sender.MrcSender.departed`): each first
        transmission is stamped when its port starts to send it, as a NIC stamps a packet on the
        wire, so the RTT samples (and DCQCN's timer, 5 x the smallest, with ``dcqcn_timer_s`` 0)
        leave out the wait behind the host's own frames. Stamped at the hand-off, the 7 QPs of a
        host in fig. 17's 8-host all-to-all each read their shared NIC queue as path RTT and DCQCN's
        timer (5 x the smallest sample) with it: RoCE's busbw at 8 KiB rose from 0.43 to 1.04
        Mb/s on linux and from 0.87 to 1.03 on bmv2 with the departure stamp (docs/benchmarks.md). Resent
        PSNs take no sample (Karn). The go-back-N timer runs from the port's stamps
        (:meth:`left_nic`), never from this model."""
        psn, n = self.new_span
        sent_at = self.sent_at
        for w in waits[start : start + n]:
            if w and psn in sent_at:
                sent_at[psn] += w
            psn += 1

    def left_nic(self, psn24: int, handed: float, t: float) -> None:
        """The NIC port sent PSN ``psn24`` (its low 24 bits) at ``t`` (s), handed to it at
        ``handed``: its departure stamp (traffic/txstamp.py), as MRC's
        (:meth:`~traffic.sender.MrcSender.left_nic`). A first transmission's RTT sample runs from
        it (a resent PSN has none: Karn), and the go-back-N timer from its last transmission's
        (:meth:`_timer_expired`); a stamp of an earlier transmission than the last is ignored."""
        psn = psn_at_or_below(psn24, self._high)
        hand = self.handed_at.get(psn)
        if hand is None or handed < hand - _HAND_SLACK_S:
            return
        self.left_at[psn] = t
        self.stats.wire_stamped += 1
        if psn in self.sent_at:
            self.sent_at[psn] = t

    def next_due(self, now: float) -> float:
        """The earliest time (s, the clock of ``now``) at which :meth:`poll` may have something to
        send with no packet received before then: while the window is open and a PSN or message is
        at hand, ``now``, or with DCQCN when the pacer's bucket holds the next PSN; else the go-back-N timer and
        DCQCN's timers; ``inf`` when only a received packet can give it work."""
        if self.nxt - self.una < self.s.window_packets and (self.nxt < self.built or not self.box.idle):
            cc = self.dcqcn
            if cc is None or self.nxt >= self.built:
                return now
            # paced: when the bucket holds the next packet (its tokens grow with time)
            return self.pacer.ready_at(self.pkts[self.nxt][4] + H.DATA_OVERHEAD, cc.rate_bps, now)
        due = float("inf")
        if self.timer is not None and self.una < self.nxt:
            due = self.timer + min(self.s.max_rto_s, self.s.min_rto_s * 5 * self.backoff)
        cc = self.dcqcn
        if cc is not None:
            for t in (cc.next_timer, cc.next_alpha):
                if t is not None:
                    due = min(due, t)
        return due

    def _full(self, psn24: int) -> int:
        """The full PSN of an acknowledgement: never below the oldest unacknowledged PSN."""
        return self.una + (psn24 - self.una) % PSN_MOD

    def on_packet(self, p: Pkt, now: float) -> None:
        """An ACK (advance), a sequence-error NACK (advance, then go back N to its cumulative PSN) or
        a CNP (DCQCN cuts the rate; with ``dcqcn_timer_s`` 0 its timer is set to 5 x the smallest
        RTT seen, 5 x ``min_rto_s`` before any). Anything else is ignored."""
        if p.op == H.OP_CNP:
            if self.dcqcn is not None:
                if self._timer_from_rtt:
                    self.dcqcn.timer_s = 5 * (self.rtt.min_rtt or self.s.min_rto_s)
                self.dcqcn.on_cnp(now)
        elif p.op == H.OP_ACK:
            self._advance(self._full(p.cum_psn), now)
        elif p.op == H.OP_NACK and p.sflags & H.S_SEQ:
            cum = self._full(p.cum_psn)
            self._advance(cum, now)
            if cum < self.nxt:
                self.stats.nacks += 1
                self.stats.losses += 1
                self.events(Nacked(qp=self.qp, psn=cum, ev=self.ev))
                self.nxt = cum  # go back N

    def _advance(self, cum: int, now: float) -> None:
        if cum <= self.una or cum > self._high:
            return
        sent = self.sent_at.get(cum - 1)
        if sent is not None:
            self.rtt.sample(now - sent, now)
        for psn in range(self.una, cum):
            self.sent_at.pop(psn, None)
            self.handed_at.pop(psn, None)
            self.left_at.pop(psn, None)
            msn, _, _, _, ln = self.pkts[psn]
            self.stats.bytes_acked += ln
            self.box.acked(msn, 1, now)  # the message is released with its last packet
        self.una = cum
        self.nxt = max(self.nxt, cum)
        self.backoff = 1
        self.timer = now if self.una < self.nxt else None


#: Shortest gap between two CNPs of one QP where the DCQCN timer follows the RTT (the receiver
#: knows no RTT): a ceiling on CNPs, not a clock of DCQCN's.
CNP_MIN_GAP_S = 0.001


class RoceReceiver(MrcReceiver):
    """In-order receiver: only the expected PSN is placed; a gap is NACKed once (sequence error); a
    CE-marked packet is answered by a CNP, at most one per ``dcqcn_timer_s``."""

    def __init__(self, *a, **kw) -> None:
        """As :class:`~traffic.receiver.MrcReceiver` (same arguments); no NACK or CNP sent yet."""
        super().__init__(*a, **kw)
        self.nacked_at: int | None = None
        self.last_cnp = float("-inf")
        self.cnps = 0

    def on_packet(self, p: Pkt, now: float) -> list[Pkt]:
        """A data packet; returns what to send at once. A CNP when it carries ECN CE (at most one per
        ``dcqcn_timer_s``, or :data:`CNP_MIN_GAP_S` when that is 0); then a trimmed packet is
        dropped, the expected PSN or a duplicate goes through MRC's receiver (its SACKs sent as
        ACKs), and a PSN beyond a gap is dropped, the first such one NACKed (sequence error)."""
        if p.op not in (H.OP_WRITE, H.OP_WRITE_IMM):
            self.stats.drop("unexpected opcode")
            return []
        cnp = []
        if p.ecn_ce and self.s.roce_cc == "dcqcn" and now - self.last_cnp >= (self.s.dcqcn_timer_s or CNP_MIN_GAP_S):
            self.last_cnp = now
            self.cnps += 1
            cnp = [Pkt(op=H.OP_CNP, qp=self.qp, ev=self.reverse_ev(), port_state=self.local_ports)]
        if p.flags & H.F_TRIM:
            self.stats.drop("trimmed (go-back-N)")
            return cnp
        return cnp + self._in_order(p, now)

    def _in_order(self, p: Pkt, now: float) -> list[Pkt]:
        psn = psn_near(p.psn, self.cum)
        if psn > self.cum:
            self.stats.drop("out of order (go-back-N)")
            if self.nacked_at != self.cum:
                self.nacked_at = self.cum
                return [self._sack(H.OP_NACK, psn, p.ev, H.S_SEQ, self.cum)]
            return []
        out = super().on_packet(p, now)
        return [self._as_ack(x) for x in out]

    @staticmethod
    def _as_ack(x: Pkt) -> Pkt:
        if x.op == H.OP_SACK:
            x.op = H.OP_ACK
        return x

    def poll(self, now: float) -> list[Pkt]:
        """The acknowledgements that are due (MRC's receiver's SACKs, sent as ACKs)."""
        return [self._as_ack(x) for x in super().poll(now)]
