"""The sending side of one MRC QP as a pure state machine (:class:`MrcSender`): no I/O.

Driven by ``on_packet(pkt, now)`` and ``poll(now)`` (``now`` in seconds, any monotonic clock), it
returns the packets to send as :class:`~traffic.packet.Pkt`; the endpoint process encodes them
onto raw sockets, tests pass them through an in-process channel that drops, duplicates, reorders
and delays.

Reliability (docs/protocol.md, "Sender"):

* every data packet takes the next active EV (:class:`~traffic.evs.EvSet`); its PSN is recorded
  per EV in send order;
* each EV is one FIFO path, so when a SACK echoes PSN q arriving on EV e, every PSN sent on e before
  q, still unacknowledged and inside the SACK's bitmap, is lost: its EV is retired at once
  (untrimmed loss) and the PSN is retransmitted on another EV. Spraying's reordering *across* EVs
  is never taken for loss;
* a retransmission timer (:class:`~traffic.rtt.RttEstimator`) is the safety net; a timeout also
  retires the EV the packet took once a packet sent after it (by more than a quarter of the minimum
  RTT) has arrived on another EV, as RACK infers loss (RFC 8985), unless that EV has since delivered
  a packet sent after it (then the acknowledgement was lost on a reverse path, not the packet on
  this one). Until that evidence comes, nothing says one path is to blame: a stalled peer, or a
  machine holding every path's SACKs at once, is silent on all of them;
* a SACK that echoes a PSN on the EV of a transmission the timer gave up on says that packet
  arrived after all: a spurious timeout (RFC 3522), reported for the run's fidelity watch;
* a trimmed packet (a NACK, or the trim bitmap of a SACK) is retransmitted at once on another EV
  and its EV is skipped once: trimming is congestion, and never retires an EV;
* an EV whose packets come back ECN-marked is skipped for ``ecn_skip_rtts`` smoothed RTTs, so
  traffic moves to cooler paths (ECN as a load-balancing signal);
* the window is NSCC's (:mod:`traffic.cc`) or fixed;
* retired EVs are probed (:class:`~traffic.probes.ProbeScheduler`) and revived by answers;
* a plane whose NIC port is down at either end (:class:`~traffic.ports.PortState`) leaves the
  rotation without its EVs being blamed.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, ev_plane
from mrclab.traffic.cc import FixedWindow, Nscc
from mrclab.traffic.contract import (
    Event,
    EvStateChanged,
    GapFound,
    Nacked,
    PacketLost,
    PlaneChanged,
    SpuriousTimeout,
    TimedOut,
)
from mrclab.traffic.evs import GOOD, EvSet, EvState
from mrclab.traffic.outbox import Outbox
from mrclab.traffic.packet import SACK_BITMAP_BITS, Pkt, psn_at_or_below, rkey_for
from mrclab.traffic.ports import PortState
from mrclab.traffic.probes import ProbeScheduler
from mrclab.traffic.rtt import RttEstimator
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.stats import SenderStats

EventSink = Callable[[Event], None]
#: Timed-out transmissions a sender remembers for spurious-timeout detection (the oldest go first):
#: a held path times out a window at a time, and a window is at most a few hundred packets.
MAX_TIMED_OUT = 1024
#: The largest multiple of the RTO a packet's timer backs off to: a packet sent k times times out
#: after min(k, MAX_BACKOFF) x RTO (ours; the RTO itself is capped at ``max_rto_s``).
MAX_BACKOFF = 8
#: How far a departure stamp's hand-over time (its send stamp, 100 us units) may lie from the
#: transmission it is matched with (s): a frame is stamped as it is framed, within a turn of when
#: the sender recorded it; two transmissions of one PSN are at least a round trip apart.
WIRE_MATCH_S = 0.005


def _ignore(_e: Event) -> None:
    pass


@dataclass(slots=True)
class _Rec:
    """A data packet in flight: its message, offset and length, the EV and time of its last
    transmission (``t_sent`` -1: lost, not timed until resent), the time of its first
    (``t_first``, for RTT samples: when its NIC port started to send it, where the host models its
    port queues; -1 once resent: Karn's rule), how often it was sent, and the
    wait its last transmission met in the host's NIC port queue when its timer was moved past it
    (``nic_wait``, s; 0: not moved; -1: not looked up yet): ``t_sent`` is then when it left; and
    when its port reported sending its last transmission (``t_wire``, s, the NIC's departure stamp,
    traffic/txstamp.py; -1: not reported)."""

    msn: int
    offset: int
    length: int
    ev: int
    t_sent: float
    t_first: float
    tx: int = 1
    acked: bool = False
    nic_wait: float = -1.0
    t_wire: float = -1.0


class MrcSender:
    """Sending side of one QP. ``events`` hears losses, retransmission causes and EV changes."""

    def __init__(self, qp: int, evs: EvSet, messages: Iterator[tuple[int, bytes] | None], settings: TransportSettings,
                 *, imm: bool = False, events: EventSink | None = None) -> None:
        """Sender of QP ``qp`` over ``evs``, taking messages from ``messages`` (``(msn, bytes)``; None:
        none ready yet). ``imm``: Write-with-Immediate, the MSN as immediate. The window is NSCC's
        (``settings.nscc``: line rate ``port_mbps`` x the planes ``evs`` spans, starting at two
        full packets per plane, at most the fixed window, where that rate is known) or the fixed
        ``window_packets``."""
        self.qp, self.evs, self.s, self.imm = qp, evs, settings, imm
        self.events = events or _ignore
        self.stats = SenderStats()
        self.out = Outbox(messages, settings, self.stats)
        self.rtt = RttEstimator(settings)
        self.probes: ProbeScheduler[int] = ProbeScheduler(settings.probe_interval_s, settings.probe_timeout_s)
        self.ports = PortState()
        self.mss = settings.frame_bytes  # a full data packet on the wire
        self._planes = {e.plane for e in evs.evs.values()}  # the planes this QP sprays over
        if settings.nscc:
            planes = len(self._planes)
            line = settings.port_mbps * 1e6 * planes
            # start at the BDP floor (two packets per plane): a window's first burst meets empty
            # queues and an RTO that has only seen empty-queue RTTs
            floor = 2 * planes * self.mss
            initial = min(settings.window_packets * self.mss, floor) if line > 0 else settings.window_packets * self.mss
            self.cc: FixedWindow | Nscc = Nscc(self.mss, line, initial, settings.base_rtt_s, min_bdp_bytes=floor)
        else:
            self.cc = FixedWindow(settings.window_packets, self.mss)
        self._op, self._rkey = (H.OP_WRITE_IMM if imm else H.OP_WRITE), rkey_for(qp)
        #: what :meth:`poll` returns for a data packet, made from its fields in DATA_FIELDS order: a
        #: :class:`Pkt`, or the frame itself where the host stack gives its wire's framer
        #: (:meth:`traffic.wire.Wire.framer`: no Pkt on the hot path)
        self.make_data: Callable[..., Any] = Pkt
        #: (plane, send time) -> the wait (s) its NIC port queue gave a packet sent then, None when
        #: unknown: the host's model of its queues (traffic/nicqueue.py). A packet's timer runs from
        #: when it left the queue, and spurious timeouts report the wait
        self.nic_wait: Callable[[int, float], float | None] | None = None
        #: bit p: the plane-p NIC port reports when it sent each packet (:meth:`left_nic`; set by
        #: the host once a stamp came from that port: a port whose device stamps nothing, a VXLAN
        #: tunnel to a switch on another server, never sets it). A packet there is timed from its
        #: stamp, and one its port has not sent yet is not timed out (as a NIC's transport never
        #: times a packet still in its own queue); elsewhere the host's model of its queues stands in
        self.wire_ports = 0
        #: of the last :meth:`poll`'s packets, (how many resent ones came first, the first new PSN,
        #: how many new ones followed): where :meth:`departed` finds their frames' NIC waits
        self.new_span = (0, 0, 0)
        self.next_psn = 0
        self.acked_below = 0  # every PSN below is acknowledged
        #: PSN -> packet not yet acknowledged: in flight, or lost and awaiting retransmission
        self.recs: dict[int, _Rec] = {}
        self.per_ev: dict[int, deque[int]] = {}  # EV -> PSNs sent on it, in send order
        #: (sent at, PSN) in send order, one queue per timer multiple: a packet sent k times times
        #: out after k x RTO (at most 8x), so one queue per k keeps every queue's head its soonest.
        #: One queue for all let a resent packet's longer timer hold up the first transmissions
        #: sent after it: a dead EV's first loss timed out 0.09 s (two RTTs) late behind a resend
        #: (quickstart on bmv2, 2026-11-27)
        self.timer_qs: list[deque[tuple[float, int]]] = [deque() for _ in range(MAX_BACKOFF)]
        self.timer_q = self.timer_qs[0]  # first transmissions: the hot path appends here
        #: (timed from, PSN, sent at) of resent packets, in send order: their EV is judged one RTO
        #: after they left, though the packet itself times out only after its backoff
        #: (:meth:`_check_paths`)
        self.path_checks: deque[tuple[float, int, float]] = deque()
        self.retx_q: deque[int] = deque()
        self._now = 0.0  # the time of the SACK being read (for the loss events it reveals)
        self.delivered_after: dict[int, float] = {}  # EV -> send time of the latest packet it delivered
        #: send time of the latest packet known to have arrived, on any EV: the evidence a timeout
        #: needs before it blames its EV (RACK, RFC 8985: a packet sent later was delivered)
        self.delivered_latest = -1.0
        #: (EV, PSN, sent at) of timeouts that blamed no EV yet for want of that evidence, oldest first
        self.suspects: deque[tuple[int, int, float]] = deque()
        #: PSN -> (EV, sent at) of a transmission the timer gave up on, until a SACK echoes its
        #: arrival on that EV (a spurious timeout: the packet was held, not lost) or a resend on the
        #: same EV makes an echo ambiguous; the oldest go beyond MAX_TIMED_OUT
        self.timed_out: dict[int, tuple[int, float]] = {}

    # ---- state ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Every message taken has been acknowledged, none is pending retransmission and no more
        will be taken."""
        return self.out.exhausted and self.out.cur is None and not self.recs and not self.retx_q

    def stop(self) -> None:
        """No new messages after the current one (a duration-bound flow at its end)."""
        self.out.exhausted = True

    @property
    def srtt_s(self) -> float | None:
        """Smoothed RTT (s; None before the first sample)."""
        return self.rtt.srtt

    def ev_states(self) -> dict[int, EvState]:
        """EV -> its state, for every EV of the set."""
        return {e.ev: e.state for e in self.evs.evs.values()}

    def ev_packets(self) -> dict[int, int]:
        """EV -> data packets sent on it, first transmissions and retransmissions."""
        return {e.ev: e.packets for e in self.evs.evs.values()}

    @property
    def window_bytes(self) -> float:
        """The congestion window now (bytes on the wire)."""
        return self.cc.cwnd_bytes

    @property
    def rate_bps(self) -> float | None:
        """None: MRC is held by its window, not paced."""
        return None  # a window, not a rate

    @property
    def completion_s(self) -> list[float]:
        """Completion time (s) of every message acknowledged so far, first packet sent to last
        acknowledged."""
        return self.out.completion_s

    # ---- sending ----------------------------------------------------------------------------
    def _data_pkt(self, psn: int, ev: int, msn: int, msg_len: int, crc: int, off: int, chunk, flags: int):
        return self.make_data(self._op, self.qp, psn, ev, flags, msn, msg_len, crc, off,  # DATA_FIELDS
                              self.out.ring.base[msn] + off, self._rkey, len(chunk), chunk,
                              (msn & 0xFFFFFFFF) if self.imm else None, self.ports.local, False)

    def _record(self, psn: int, ev: int, now: float) -> None:
        q = self.per_ev.get(ev)
        if q is None:
            q = self.per_ev[ev] = deque()
        q.append(psn)
        self.timer_qs[min(MAX_BACKOFF, self.recs[psn].tx) - 1].append((now, psn))
        if self.s.ev_health and self.recs[psn].tx > 1:
            self.path_checks.append((now, psn, now))
        self.evs.evs[ev].packets += 1

    # hot path, kept whole on purpose (new data: one call per turn, its per-packet loop inlined)
    def poll(self, now: float, budget: int = 64) -> list:  # noqa: PLR0915
        """Packets to send now: retransmissions first, then new data within the window, then probes.
        Data packets are what ``make_data`` makes of them (a :class:`Pkt`, or a frame), probes are
        :class:`Pkt`."""
        out: list[Pkt] = []
        self._check_timeouts(now)
        if self.retx_q:
            self._retransmit(now, budget, out)
        resent, first = len(out), self.next_psn
        # new data: the hot path, one packet per turn (names bound once)
        window = max(1, int(self.cc.cwnd_bytes // self.mss))
        recs = self.recs
        per_ev, timer_q = self.per_ev, self.timer_q
        box, evs, info = self.out, self.evs, self.evs.evs
        # EvSet.next_ev's usual case inlined (a GOOD EV next in turn): the rotation and its cursor
        # in locals, the cursor written back after; anything else goes through next_ev itself
        rot, ri = evs.rotation, evs.cursor
        nrot = len(rot)
        ring, payload = box.ring, box.payload
        op, qp, rkey, imm, ports, make = self._op, self.qp, self._rkey, self.imm, self.ports.local, self.make_data
        sent = 0
        psn = self.next_psn  # the loop keeps the PSN and the message in hand in locals, written back after
        cur = box.cur
        fresh = cur is not None  # a message to unpack (and place in the region) at its next packet
        msn = crc = off = msg_len = va0 = 0
        data = memoryview(b"")
        while len(out) < budget and len(recs) < window:
            if nrot and (e := info[ev := rot[ri]]).state is GOOD:
                ri = ri + 1 if ri + 1 < nrot else 0
            else:
                evs.cursor = ri
                nxt = evs.next_ev(None, now)  # may change the rotation (an EV back from a skip)
                rot, ri = evs.rotation, evs.cursor
                nrot = len(rot)
                if nxt is None:
                    break
                ev, e = nxt, info[nxt]
            if cur is None:
                if not box.fetch():
                    break
                cur = box.cur
                fresh = True
            if fresh:
                assert cur is not None
                msn, data, crc, off = cur
                msg_len = len(data)
                if off == 0 and msn not in ring.base:
                    if not ring.fits(msg_len):
                        break  # the region it goes to still holds a message in flight: wait for its acks
                    ring.place(msn, msg_len)
                    box.started[msn] = now
                va0 = ring.base[msn]
                fresh = False
            ln = msg_len - off
            if ln > payload:
                ln = payload
            end = off + ln
            recs[psn] = _Rec(msn, off, ln, ev, now, now)
            q = per_ev.get(ev)  # _record, inlined
            if q is None:
                q = per_ev[ev] = deque()
            q.append(psn)
            timer_q.append((now, psn))
            e.packets += 1
            e.bytes += ln
            sent += 1
            out.append(make(op, qp, psn, ev, 0, msn, msg_len, crc, off, va0 + off,  # DATA_FIELDS: _data_pkt
                            rkey, ln, data[off:end], (msn & 0xFFFFFFFF) if imm else None, ports, False))
            psn += 1
            if end < msg_len:
                off = end  # cur stays non-None; its tuple is made again on the way out
            else:
                cur = None
                if msg_len > window * payload:
                    # a big next message is fetched *after* these packets are stamped and sent, so the
                    # time it takes is not charged to their round trip (which would fire the timer)
                    break
        evs.cursor = ri
        self.next_psn = psn
        self.new_span = (resent, first, sent)
        box.cur = cur if cur is None or fresh else (msn, data, crc, off)
        self.stats.data_packets += sent
        if box.cur is None and out:
            box.fetch()
        out += self._probes(now)
        return out

    def departed(self, waits: list[float], start: int) -> None:
        """The host's NIC model's wait (s) for every frame of a turn (traffic/nicqueue.py,
        :meth:`~traffic.nicqueue.NicQueues.add`), this sender's last :meth:`poll` among them from
        index ``start``: each new packet's first transmission is stamped when its port starts to
        send it, as a NIC stamps a packet on the wire, so RTT samples (and NSCC's delay signal,
        and the RTO, from them) leave out the wait behind the host's own frames. Without it the
        8 QPs of a host sized NSCC's BDP for their shared NIC queue (t1-blackhole's RTT samples).
        Resent packets take no RTT sample (Karn) and keep their stamps."""
        resent, psn, n = self.new_span
        if not n:
            return
        recs = self.recs
        i = start + resent
        for w in waits[i : i + n]:
            if w:
                rec = recs.get(psn)
                if rec is not None:
                    rec.t_first += w
            psn += 1

    def next_due(self, now: float) -> float:
        """The earliest time (s, the clock of ``now``) at which :meth:`poll` may have something to
        send with no packet received before then: ``now`` while packets wait for retransmission
        or the window is open with a message in hand (an EV may come off its ECN hold at any
        time), else the retransmission timer of the oldest timed packet and the probes' next
        round or expiry, and a resent packet's EV check (:meth:`_check_paths`); ``inf`` when only a
        received packet can give it work. Drops the timer queues' stale head entries on the way,
        as the timer does."""
        if self.retx_q or (len(self.recs) < max(1, int(self.cc.cwnd_bytes // self.mss)) and not self.out.idle):
            return now
        due = float("inf")
        recs, rto = self.recs, self.rtt.rto
        for k, timer_q in enumerate(self.timer_qs, 1):
            while timer_q:
                t, psn = timer_q[0]
                rec = recs.get(psn)
                if rec is None or rec.acked or rec.t_sent != t:
                    timer_q.popleft()
                    continue
                due = min(due, t + rto * k)
                break
        head = self._path_check_head()
        if head is not None:
            due = min(due, head[0] + rto)
        if self.s.probes:
            due = min(due, self.probes.next_due())
        return due

    def _retransmit(self, now: float, budget: int, out: list) -> None:
        while self.retx_q and len(out) < budget:
            psn = self.retx_q.popleft()
            rec = self.recs.get(psn)
            if rec is None or rec.acked:
                continue
            ev = self.evs.next_ev(rec.ev, now)
            if ev is None:
                self.retx_q.appendleft(psn)
                break
            if ev == self.timed_out.get(psn, (None,))[0]:
                del self.timed_out[psn]  # an echo on this EV could now be either copy
            rec.ev, rec.t_sent, rec.t_first, rec.tx, rec.nic_wait, rec.t_wire = ev, now, -1.0, rec.tx + 1, -1.0, -1.0
            self._record(psn, ev, now)
            self.stats.retransmits += 1
            self.evs.evs[ev].retransmits += 1
            msg, crc = self.out.cache[rec.msn]
            chunk = memoryview(msg)[rec.offset : rec.offset + rec.length]
            out.append(self._data_pkt(psn, ev, rec.msn, len(msg), crc, rec.offset, chunk, H.F_RETX))

    def _check_timeouts(self, now: float) -> None:
        rto = self.rtt.rto
        if self.timer_q:
            self._check_queue(self.timer_q, rto, now)
        if self.path_checks:
            self._check_paths(rto, now)
        if self.stats.retransmits:  # resent packets wait in the other queues
            for k in range(1, MAX_BACKOFF):
                if self.timer_qs[k]:
                    self._check_queue(self.timer_qs[k], rto * (k + 1), now)

    def _check_queue(self, timer_q: deque[tuple[float, int]], timeout: float, now: float) -> None:
        """Time out the packets of one timer queue (all sent the same number of times: their
        ``timeout`` is the same multiple of the RTO) that are due at ``now``."""
        rto = self.rtt.rto
        while timer_q:
            t, psn = timer_q[0]
            rec = self.recs.get(psn)
            if rec is None or rec.acked or rec.t_sent != t:
                timer_q.popleft()
                continue
            if now - t < timeout:
                break
            timer_q.popleft()
            if (rec.nic_wait < 0 or self.wire_ports) and self._left_nic_later(psn, rec, t, now, rto):
                continue
            self.stats.timeouts += 1
            self.events(TimedOut(qp=self.qp, psn=psn, ev=rec.ev))
            self.timed_out[psn] = (rec.ev, t - max(0.0, rec.nic_wait))  # sent then: its NIC wait is looked up there
            if len(self.timed_out) > MAX_TIMED_OUT:
                del self.timed_out[next(iter(self.timed_out))]
            if self.s.ev_health:  # judged by when it was handed to the NIC, as every send time it is compared with
                self._blame(rec.ev, psn, t - max(0.0, rec.nic_wait), now)
            self._lose(psn, rec, "timeout", now)

    def _check_paths(self, rto: float, now: float) -> None:
        """Judge the EV of each resent packet unacknowledged one RTO after it left (its NIC wait
        counted as for a first transmission), as a first transmission's is (:meth:`_blame`), while
        the packet waits out its backoff before it is resent again. A backup EV through a dead T1
        that took over a retired one carried resent packets first (they go before new data), and
        was retired only when their doubled timer fired: t1-blackhole's slowest retirement was two
        timers after its first packet, on both data planes (2026-11-27). A resend its port still
        holds is looked at again a timer later, and then a timer after its stamp, if later."""
        q = self.path_checks
        while (head := self._path_check_head()) is not None:
            t, psn, sent, rec = head
            if now - t < rto:
                break
            q.popleft()
            if self.nic_wait is not None or self.wire_ports:
                w = self._nic_wait_of(rec, sent, now)
                # it waited in its NIC queue: judged a timer after it left (or after now, while its
                # port holds it still; a stamp that comes meanwhile moves it again)
                if w and sent + w > t and now - (sent + w) < rto:
                    i = len(q)
                    while i and q[i - 1][0] > sent + w:
                        i -= 1
                    q.insert(i, (sent + w, psn, sent))
                    continue
            self._blame(rec.ev, psn, sent, now)

    def _nic_wait_of(self, rec: _Rec, sent: float, now: float) -> float | None:
        """How long the transmission handed to its port at ``sent`` waited there (s): to its
        departure stamp where the ports report them (up to now while it has none and its port is
        up: still there), else the host's model's wait for a frame sent then; None: unknown."""
        if (self.wire_ports >> ev_plane(rec.ev)) & 1:
            if rec.t_wire >= 0:
                return rec.t_wire - sent
            if self._still_in_port(rec, sent, now):
                return now - sent
            return None
        return self.nic_wait(ev_plane(rec.ev), sent) if self.nic_wait is not None else None

    def _still_in_port(self, rec: _Rec, hand: float, now: float) -> bool:
        """A transmission handed over at ``hand`` whose port has not stamped it: still in that
        port while the port is up, for at most ``max_rto_s`` (a frame the kernel lost unstamped)."""
        return bool((self.ports.local >> ev_plane(rec.ev)) & 1) and now - hand < self.s.max_rto_s

    def _path_check_head(self) -> tuple[float, int, float, _Rec] | None:
        """The path-check queue's first entry still pending, with its packet's record, dropping those
        whose packet was acknowledged, given up on or sent again since; None when none is left."""
        q, recs = self.path_checks, self.recs
        while q:
            t, psn, sent = q[0]
            rec = recs.get(psn)
            # the same transmission: handed over then (its timer may have re-timed it from its stamp)
            if rec is not None and not rec.acked and abs(rec.t_sent - max(0.0, rec.nic_wait) - sent) < 1e-9:
                return t, psn, sent, rec
            q.popleft()
        return None

    def _blame(self, ev: int, psn: int, t: float, now: float) -> None:
        """The packet ``psn`` sent on ``ev`` at ``t`` (handed to its NIC port then: the send times it is
        compared with are such times, and one that left later for having waited in its NIC queue was
        still sent before everything handed in behind it) timed out: retire ``ev`` when a packet sent
        later than it by more than the reordering window has arrived (on any EV) while nothing sent
        on ``ev`` after it has (RACK's rule, RFC 8985 section 6.2: a loss is inferred from a later
        send delivered, the window a quarter of the minimum RTT). Without that evidence the timeout
        says only that nothing came back: a stalled peer, or every path held at once (a busy
        machine's kernel holding the SACKs), and no one EV is the cause; the timeout is kept as a
        suspect and judged as acknowledgements come (:meth:`_judge_suspects`). The EV did deliver
        something sent after it: the acknowledgement, not the packet, went missing (a reverse path
        failed). An EV of a plane that is down by now is never retired (EvSet.retire)."""
        if self.delivered_after.get(ev, -1.0) > t:
            return
        if self.delivered_latest > t + self._reorder_window():
            self.evs.retire(ev, "retransmission timeout", round(now - t, 6))
            return
        self.suspects.append((ev, psn, t))
        if len(self.suspects) > MAX_TIMED_OUT:
            self.suspects.popleft()

    def _reorder_window(self) -> float:
        """How much later a packet may be sent than another and still arrive first on a healthy
        fabric (s): a quarter of the minimum RTT (RFC 8985 section 6.2's reo_wnd; 0 before any
        sample)."""
        return (self.rtt.min_rtt or 0.0) / 4

    def _judge_suspects(self) -> None:
        """Retire the EVs of suspect timeouts that the latest acknowledgements convict: a packet
        sent after the suspect (beyond the reordering window) arrived, the suspect's PSN still has
        not, nor anything sent on its EV after it. A suspect whose PSN or EV delivered is dropped,
        and so is one older than the longest timer (``max_rto_s``): its evidence never came."""
        reo, latest, after = self._reorder_window(), self.delivered_latest, self.delivered_after
        keep: deque[tuple[int, int, float]] = deque()
        for ev, psn, t in self.suspects:
            if psn not in self.recs or after.get(ev, -1.0) > t or latest - t > self.s.max_rto_s:
                continue
            if latest > t + reo:
                self.evs.retire(ev, "retransmission timeout", round(self._now - t, 6))
            else:
                keep.append((ev, psn, t))
        self.suspects = keep

    def _left_nic_later(self, psn: int, rec: _Rec, t: float, now: float, rto: float) -> bool:
        """Whether the packet sent at ``t`` that is due now had in fact waited in the host's NIC port
        queue: its timer then runs from when it left, as a NIC's does (the paper's NICs time a
        packet from the wire, behind their own queue), and it is timed again from there (True).
        Without it a packet that waited 6 ms behind the frames before it timed out on its 20 ms
        floor with its round trip (26.7 ms) inside what the path allows: t0t1-links-flap on linux
        retired 8 healthy EVs at once (the suite, 2026-11-26).

        Where its port reports its departures (``wire_ports``, :meth:`left_nic`) the stamp says
        when it left; a packet with no stamp yet is still in its port (behind frames, or held by
        the machine) while that port is up, and is timed from now and looked at again then, for at
        most ``max_rto_s`` after it was handed over (a frame the kernel lost unstamped times out
        then). Otherwise the host's model of its queues (``nic_wait``) gives the wait, looked up
        once per transmission."""
        if (self.wire_ports >> ev_plane(rec.ev)) & 1:
            hand = t - max(0.0, rec.nic_wait)  # when it was handed to its port
            left = rec.t_wire
            if left < 0:  # no stamp yet
                if not self._still_in_port(rec, hand, now):
                    return False
                left = now
            elif left <= t or now - left >= rto * min(MAX_BACKOFF, rec.tx):
                return False
            w = left - hand
        else:
            if rec.nic_wait >= 0:  # looked up already
                return False
            modelled = self.nic_wait(ev_plane(rec.ev), t) if self.nic_wait is not None else None
            rec.nic_wait = 0.0
            if not modelled or now - (t + modelled) >= rto * min(MAX_BACKOFF, rec.tx):
                return False
            hand, w = t, modelled
        rec.nic_wait, rec.t_sent = w, hand + w  # t_sent - nic_wait: when it was sent
        q = self.timer_qs[min(MAX_BACKOFF, rec.tx) - 1]  # in time order: entries behind may have left before it
        i = len(q)
        while i and q[i - 1][0] > rec.t_sent:
            i -= 1
        q.insert(i, (rec.t_sent, psn))
        self.stats.nic_deferred += 1
        return True

    def left_nic(self, psn24: int, handed: float, t: float) -> None:
        """The NIC port sent packet ``psn24`` (its PSN's low 24 bits, as the wire carries it) at
        ``t`` (s, this sender's clock), the transmission
        handed to it at ``handed`` (s, within the send stamp's 100 us): its departure stamp
        (traffic/txstamp.py). A first transmission's RTT sample runs from it, and its timer
        (:meth:`_left_nic_later`). A stamp of another transmission than the packet's last, or of
        a packet acknowledged or given up on, is ignored."""
        rec = self.recs.get(psn_at_or_below(psn24, self.next_psn))
        if rec is None or rec.acked or rec.t_sent < 0 or rec.t_wire >= 0:
            return
        if abs(rec.t_sent - max(0.0, rec.nic_wait) - handed) > WIRE_MATCH_S:
            return
        rec.t_wire = t
        self.stats.wire_stamped += 1
        if rec.t_first >= 0:
            rec.t_first = t

    def _lose(self, psn: int, rec: _Rec, why: str, now: float) -> None:
        self.stats.losses += 1
        self.events(PacketLost(qp=self.qp, psn=psn, ev=rec.ev, reason=why, age_s=round(now - rec.t_sent, 6)))
        rec.t_sent = -1.0  # no longer timed until resent
        self.retx_q.append(psn)

    # ---- receiving --------------------------------------------------------------------------
    def on_packet(self, p: Pkt, now: float) -> None:
        """A SACK, a NACK or a probe reply for this QP at ``now`` (s); anything else is ignored."""
        if p.op == H.OP_SACK:
            self._on_sack(p, now)
        elif p.op == H.OP_NACK:
            self._on_nack(p, now)
        elif p.op == H.OP_PROBE and p.is_reply:
            ev = self.probes.answered(p.probe_id)
            if ev is not None:
                self.evs.probe_result(ev, True, self.s.probe_successes)

    def _on_sack(self, p: Pkt, now: float) -> None:
        self._now = now
        top = self.next_psn
        echo = psn_at_or_below(p.echo_psn, top)
        self._peer_ports(p.port_state, echo)
        ev = p.echo_ev
        if self.timed_out:
            gone = self.timed_out.get(echo)
            if gone is not None and gone[0] == ev:  # the copy the timer gave up on has arrived
                del self.timed_out[echo]
                wait = self.nic_wait(ev_plane(ev), gone[1]) if self.nic_wait is not None else None
                self.events(SpuriousTimeout(qp=self.qp, psn=echo, ev=ev, age_s=round(now - gone[1], 6),
                                            nic_wait_s=round(wait, 6) if wait is not None else None,
                                            wire_s=None if p.echo_wire == H.NO_WIRE else p.echo_wire / H.STAMP_HZ))
        rec = self.recs.get(echo)
        rtt = None
        if rec is not None and rec.t_first >= 0:  # a first transmission (Karn)
            rtt = now - rec.t_first
            self.rtt.sample(rtt, now)
        base = psn_at_or_below(p.base_psn, top)
        ecn = bool(p.sflags & H.S_ECN)
        if ecn and self.s.ecn_lb:
            self.evs.skip(ev, "ECN mark", now + self.s.ecn_skip_rtts * (self.rtt.srtt or 0.0))
        if p.trim_bitmap and self.s.nack:  # first: a trimmed PSN is being resent, so it is no gap below
            self._trimmed_in(base, p.trim_bitmap, now)
        cum = psn_at_or_below(p.cum_psn, top) if p.cum_psn != top % (1 << 24) else top
        recs = self.recs
        got: list[int] = []  # newly acknowledged PSNs, ascending (the bitmap starts at or above cum)
        if cum > self.acked_below:
            got = [psn for psn in range(self.acked_below, cum) if psn in recs]  # acknowledged ones are gone
            self.acked_below = cum
        bm = p.bitmap
        if bm:
            i = base
            while bm:
                if bm & 1 and i >= cum and i in recs:  # (a bad SACK's bitmap might overlap cum)
                    got.append(i)
                bm >>= 1
                i += 1
        acked = self._ack(got, base, now, p.trim_bitmap) if got else 0
        self.cc.on_ack(acked, rtt, ecn, now, len(self.recs) * self.mss)
        self._infer(ev, echo, base, p.trim_bitmap)

    def _ack(self, got: list[int], base: int, now: float, trimmed: int = 0) -> int:
        """The PSNs in ``got`` (ascending, each with a record) have arrived: one pass per SACK over
        all of them (names bound once: the sender's hot spot). Returns the bytes acknowledged.

        FIFO inference rides along: every PSN sent on an EV before one that arrived on it, and still
        not acknowledged, is lost. The EV of an arrival is certain for first transmissions (and for
        the echoed arrival, which the caller infers from). Ascending order is enough: a PSN sent on
        an EV before a first transmission is a smaller PSN, so it was acknowledged first if it
        arrived at all. ``trimmed``: the SACK's trim bitmap (from ``base``), whose PSNs are never
        inferred lost (:meth:`_infer`)."""
        recs, after, per_ev, acked = self.recs, self.delivered_after, self.per_ev, self.out.acked
        nbytes = 0
        latest = self.delivered_latest  # of first transmissions only: a resent PSN's copy is unknown (Karn)
        msn, n = -1, 0  # packets acknowledged per message: ascending PSNs come message by message
        for psn in got:
            rec = recs.pop(psn)
            rec.acked = True
            ev = rec.ev
            if rec.t_sent > after.get(ev, -1.0):
                after[ev] = rec.t_sent
            nbytes += rec.length
            if rec.msn == msn:
                n += 1
            else:
                if n:
                    acked(msn, n, now)
                msn, n = rec.msn, 1
            if rec.tx == 1:
                if rec.t_sent > latest:
                    latest = rec.t_sent
                q = per_ev.get(ev)
                if q:
                    if q[0] == psn:  # the usual case: nothing sent on the EV before it is missing
                        q.popleft()
                    else:
                        self._infer(ev, psn, base, trimmed)
        if n:
            acked(msn, n, now)
        self.stats.bytes_acked += nbytes
        if latest > self.delivered_latest:
            self.delivered_latest = latest
            if self.suspects:
                self._judge_suspects()
        return nbytes

    def _infer(self, ev: int, arrived: int, known_from: int, trimmed: int = 0) -> None:
        """PSNs sent on ``ev`` before ``arrived``: unacknowledged ones the SACK reports on, from
        ``known_from`` (its bitmap's base) for the bitmap's 64 PSNs, are lost. Outside that window
        the SACK says nothing, so those are left to later SACKs or the timer. Nor is a PSN its trim
        bitmap (``trimmed``, bit i: PSN ``known_from + i``) reports trimmed: congestion, whose NACK
        is on its way or lost (a first transmission's was answered by :meth:`_trimmed_in` already;
        a resent one's is left to its NACK or the timer). A resent PSN trimmed again had its NACK
        overtaken by the SACK of a packet sent after it on the same EV, the two leaving the
        receiver by NIC ports of two planes (incast on linux, seed 3: the incast receiver's port
        queue of SACKs held the NACK; the EV was retired for an untrimmed loss that was a trim)."""
        known_to = known_from + SACK_BITMAP_BITS
        q = self.per_ev.get(ev)
        if not q:
            return
        if q[0] == arrived:  # the usual case: nothing sent on the EV before it is missing
            q.popleft()
            return
        if arrived not in q:
            return
        last = self.delivered_after.get(ev, -1.0)  # the latest send on ev known to have arrived
        while q:
            psn = q.popleft()
            if psn == arrived:
                break
            rec = self.recs.get(psn)
            # lost only if its last copy left on ev before something that arrived: a trimmed PSN
            # resent on the same EV (a pinned flow) left after the packets now overtaking it
            if rec is not None and not rec.acked and rec.ev == ev and 0 <= rec.t_sent <= last \
                    and known_from <= psn < known_to and not (trimmed >> (psn - known_from)) & 1:
                self.events(GapFound(qp=self.qp, psn=psn, ev=ev, behind=arrived))
                if self.s.ev_health:
                    self.evs.retire(ev, f"untrimmed loss of PSN {psn} behind PSN {arrived}",
                                    round(self._now - rec.t_sent, 6))
                self._lose(psn, rec, "gap on EV", self._now)

    def _on_nack(self, p: Pkt, now: float) -> None:
        psn = psn_at_or_below(p.echo_psn, self.next_psn)
        self._peer_ports(p.port_state, psn)
        self.stats.nacks += 1
        if not self.s.nack:
            return
        self._retransmit_trimmed(psn, p.echo_ev, now)
        if p.trim_bitmap:
            self._trimmed_in(psn_at_or_below(p.base_psn, self.next_psn), p.trim_bitmap, now)

    def _retransmit_trimmed(self, psn: int, ev: int, now: float) -> None:
        """``psn`` arrived trimmed on ``ev``: resend it at once on another EV, pass ``ev`` over once
        (congestion: never retired), and let the window quick-adapt."""
        rec = self.recs.get(psn)
        if rec is None or rec.acked or rec.t_sent < 0 or rec.ev != ev:  # unknown, acknowledged, queued
            return  # again, or resent since on another EV: this trim is old news
        self.events(Nacked(qp=self.qp, psn=psn, ev=ev))
        self.evs.skip(ev, "trimmed packet", now)
        rec.t_sent = -1.0
        self.retx_q.appendleft(psn)
        self.cc.on_nack(rec.length + H.DATA_OVERHEAD, now, len(self.recs) * self.mss)

    def _trimmed_in(self, base: int, bitmap: int, now: float) -> None:
        """The PSNs a SACK's trim bitmap reports (a NACK that was lost or overtaken). Only first
        transmissions are taken from it: a PSN stays in the bitmap until it arrives whole, so for
        one already resent the bit may be about the earlier copy (a trimmed retransmission whose
        NACK is lost is left to the timer)."""
        i = 0
        while bitmap:
            if bitmap & 1:
                rec = self.recs.get(base + i)
                if rec is not None and rec.tx == 1:
                    self._retransmit_trimmed(base + i, rec.ev, now)
            bitmap >>= 1
            i += 1

    # ---- ports ------------------------------------------------------------------------------
    def _peer_ports(self, state: int, echo_psn: int) -> None:
        if self.ports.from_peer(state, echo_psn):
            self._apply_ports()

    def set_local_ports(self, state: int) -> None:
        """This NIC's port-state bitmap (bit p: plane p's port has carrier); planes that change leave
        or rejoin the rotation (unless ``port_state`` is off)."""
        if self.ports.set_local(state):
            self._apply_ports()

    def _apply_ports(self) -> None:
        if not self.s.port_state:
            return
        up = self.ports.usable()
        for plane in range(self.evs.planes):
            down = not (up >> plane) & 1
            if down != (plane in self.evs.planes_down):
                self.evs.set_plane_down(plane, down)
                self.events(PlaneChanged(qp=self.qp, plane=plane, up=not down))
        if isinstance(self.cc, Nscc):  # the line rate is the ports left (at least one port's)
            self.cc.set_line_rate(self.s.port_mbps * 1e6 * max(1, len(self._planes - self.evs.planes_down)))

    # ---- probes -----------------------------------------------------------------------------
    def _probes(self, now: float) -> list[Pkt]:
        if not self.s.probes:
            return []
        if self.probes.pending:
            for ev in self.probes.expired(now):
                self.evs.probe_result(ev, False, self.s.probe_successes)
        if not self.probes.round_due(now):
            return []
        down = self.evs.planes_down
        todo = self.probes.round(now, (ev for ev in self.evs.retired() if self.evs.evs[ev].plane not in down))
        self.stats.probes += len(todo)
        return [Pkt(op=H.OP_PROBE, qp=self.qp, ev=ev, probe_id=pid, is_reply=0, t_send_ns=int(now * 1e9),
                    port_state=self.ports.local) for pid, ev in todo]


def make_sender(qp: int, plan: AddressPlan, src: str, dst: str, settings: TransportSettings, rng: random.Random,
                messages: Iterator[tuple[int, bytes] | None], *, imm: bool = False,
                denylist: frozenset[int] = frozenset(), events: EventSink | None = None,
                pin_ev: int | None = None) -> MrcSender:
    """An MRC sender for ``src -> dst`` with a freshly drawn EV set (seeded by ``rng``), or held
    to the one EV ``pin_ev``."""
    sink = events or _ignore

    def on_change(ev, old, new, why, age_s=None):
        sink(EvStateChanged(qp=qp, ev=ev, old=old, new=new, reason=why, age_s=age_s))

    if pin_ev is not None:
        evs = EvSet.pinned(plan, pin_ev, on_change)
    else:
        evs = EvSet.draw(plan, src, dst, rng, settings.evs_per_plane, settings.backup_per_plane, denylist,
                         on_change=on_change)
    return MrcSender(qp, evs, messages, settings, imm=imm, events=events)
