"""The MRC transport as pure state machines (no I/O): :class:`MrcSender` and :class:`MrcReceiver`.

Both are driven by ``on_packet(pkt, now)`` and ``poll(now)`` (``now`` in seconds, any monotonic
clock) and return the packets to send as :class:`Pkt` objects; the endpoint process
(:mod:`traffic.endpoint`) encodes them onto raw sockets, tests pass them through an in-process
channel that drops, duplicates, reorders and delays (:mod:`traffic.channel`).

Reliability (MRC.md, "The transport"; docs/protocol.md):

* every data packet takes the next active EV; its PSN is recorded per EV in send order;
* the receiver SACKs (cumulative PSN + a 64-bit bitmap ending at the newest arrival it reports +
  the echoed EV and PSN of the last arrival) every ``ack_every`` packets or after ``ack_delay_s``,
  coalesced over a receive batch: a due SACK leaves at the next ``poll`` (at most
  ``SACK_COALESCE_MAX`` late);
* each EV is one FIFO path, so when a SACK echoes PSN q arriving on EV e, every PSN sent on e
  before q and still unacknowledged is lost: its EV is retired at once (untrimmed loss) and the
  PSN is retransmitted on another EV. Spraying's reordering *across* EVs is never taken for loss;
* a retransmission timer (RTO = srtt + 4 rttvar, at least ``min_rto_s``) is the safety net; a
  timeout also retires the EV the packet took;
* a trimmed packet is answered by a NACK; the sender retransmits it at once and marks the EV SKIP.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from topologies.addressing import AddressPlan
from traffic import headers as H
from traffic.evs import ASSUMED_BAD, EvSet

PSN_MOD = 1 << 24
#: Half-life (s) of the RTT peak under the retransmission timer (see :attr:`MrcSender.rto`): a few
#: RTTs of a full queue here, so a dead path is still found within a few RTTs.
RTT_PEAK_HALF_LIFE_S = 0.25
#: A receiver never holds more than this many packets unacknowledged while it works through a
#: receive batch: half the SACK bitmap (64), so one SACK still reports every arrival above cum_psn
#: when the batch arrived in order (ours; NICs coalesce ACKs per interrupt or per poll likewise).
SACK_COALESCE_MAX = 32
#: PSNs a SACK's bitmap covers (MRC.md: "a 64-bit bitmap"). Its 64 end at the newest arrival the SACK
#: reports, and the arrivals one SACK reports always fit in it: an arrival 64 or more away from the
#: pending ones (a retransmission of an old hole) sends those first.
SACK_BITMAP_BITS = 64


@dataclass(frozen=True)
class MrcSettings:
    """Transport settings, with defaults and their sources (docs/protocol.md, "Defaults").

    ``window_packets``: fixed window of unacknowledged data packets (flow control until the
    congestion-control issue), 16 by default: four per plane of the default fabric, several times
    the bandwidth-delay product of its shaped links (one or two packets per NIC port), and no more:
    a window that fills the bottleneck queues only adds RTT, and when a path dies and its lost
    packets hold part of the window, the RTT of a full queue swings by its whole depth, which a
    retransmission timer cannot follow (64 kept bmv2's 16-packet queues full and retired healthy
    EVs in the fig. 9c/9d runs). ``payload_bytes``: data per packet (1024). EV set:
    ``evs_per_plane`` active (4) + ``backup_per_plane`` (2), ``reverse_evs_per_plane`` (1) for
    SACKs. ``probe_successes`` (3) answered probes revive a retired EV; probes every
    ``probe_interval_s`` (0.05). Timers: RTO = max(``min_rto_s``, 2 srtt + 4 rttvar, recent peak
    RTT), capped at ``max_rto_s`` (1.0); ``min_rto_s`` is 0.02 (OCP's local ACK timeout is
    1.024 us x 2^t; the emulated RTT is 1-100 ms, so the floor is coarse). Before the first RTT sample the RTO is
    ``initial_rto_s`` (0.5; RFC 6298 says 1 s for the Internet): the first round trip also pays
    for the peer building its receive state, and a timeout there would retire healthy EVs.
    """

    window_packets: int = 16
    payload_bytes: int = 1024
    evs_per_plane: int = 4
    backup_per_plane: int = 2
    reverse_evs_per_plane: int = 1
    probe_successes: int = 3
    probe_interval_s: float = 0.05
    probe_timeout_s: float = 0.2
    min_rto_s: float = 0.02
    max_rto_s: float = 1.0
    initial_rto_s: float = 0.5
    ack_every: int = 2
    ack_delay_s: float = 0.001
    region_bytes: int = 8 << 20
    max_psn_window: int = 1 << 16

    @classmethod
    def from_dict(cls, d: dict, source: str = "transport") -> MrcSettings:
        import dataclasses

        allowed = {f.name: f for f in dataclasses.fields(cls)}
        bad = sorted(set(d) - set(allowed))
        if bad:
            raise ValueError(f"{source}: unknown setting(s) {', '.join(bad)}; allowed: {', '.join(sorted(allowed))}")
        kw = {}
        for k, v in d.items():
            want = type(getattr(cls(), k))
            if want is float and isinstance(v, int):
                v = float(v)
            if not isinstance(v, want) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{source}.{k} = {v!r}; allowed: a positive {want.__name__}")
            kw[k] = v
        s = cls(**kw)
        if s.payload_bytes > 8192:
            raise ValueError(f"{source}.payload_bytes = {s.payload_bytes}; allowed: 1 to 8192")
        return s


@dataclass(slots=True)
class Pkt:
    """One transport packet in memory. Data: psn/msn/msg_*/va/payload; SACK/NACK: cum_psn,
    base_psn, bitmap, echo_*; probe: probe_id/is_reply/t_send_ns. ``ev`` is the EV it travels on."""

    op: int
    qp: int
    psn: int = 0
    ev: int = 0
    flags: int = 0
    msn: int = 0
    msg_len: int = 0
    msg_crc: int = 0
    msg_offset: int = 0
    va: int = 0
    rkey: int = 0
    dma_len: int = 0
    payload: bytes | memoryview = b""
    imm: int | None = None
    port_state: int = 0xFF
    ecn_ce: bool = False
    cum_psn: int = 0
    base_psn: int = 0
    bitmap: int = 0
    echo_ev: int = 0
    echo_psn: int = 0
    sflags: int = 0
    probe_id: int = 0
    is_reply: int = 0
    t_send_ns: int = 0


#: The data packet's fields, in order: the hot paths (MrcSender.poll, Wire.decode) build data
#: packets positionally, which costs 0.26 us instead of 0.65 us with keywords.
DATA_FIELDS = ("op", "qp", "psn", "ev", "flags", "msn", "msg_len", "msg_crc", "msg_offset", "va", "rkey", "dma_len",
               "payload", "imm", "port_state", "ecn_ce")
if tuple(f.name for f in dataclasses.fields(Pkt))[: len(DATA_FIELDS)] != DATA_FIELDS:
    raise ImportError("traffic.mrc.Pkt: the data fields must come first, in DATA_FIELDS order")


@dataclass(slots=True)
class _Rec:
    msn: int
    offset: int
    length: int
    ev: int
    t_sent: float
    tx: int = 1
    acked: bool = False


class RegionRing:
    """Where each message goes in the receiver's memory region: consecutive, wrapping to 0 when a
    message would cross the end (a message never straddles the wrap). Sender and tests share it.

    ``base`` maps the msn of every placed, not yet released message to its offset (bytes); a
    sender releases a message once all of it is acknowledged, and must not place one that
    :meth:`fits` says would overwrite a message still in flight (the data would be corrupted)."""

    def __init__(self, region_bytes: int) -> None:
        self.size = region_bytes
        self.next = 0
        self.base: dict[int, int] = {}
        self.length: dict[int, int] = {}

    def _start(self, length: int) -> int:
        return 0 if self.next + length > self.size else self.next

    def fits(self, length: int) -> bool:
        """True when a ``length``-byte message placed now overlaps no unreleased message."""
        a = self._start(length)
        return all(a + length <= b or b + self.length[m] <= a for m, b in self.base.items())

    def place(self, msn: int, length: int) -> int:
        if length > self.size:
            raise ValueError(f"a {length}-byte message does not fit the {self.size}-byte memory region")
        self.next = self._start(length)
        self.base[msn] = self.next
        self.length[msn] = length
        self.next += length
        return self.base[msn]

    def release(self, msn: int) -> None:
        self.base.pop(msn, None)
        self.length.pop(msn, None)


def rkey_for(qp: int) -> int:
    return (0x4D52 << 16) | (qp & 0xFFFF)


def message_source(seed: int, size: int, count: int | None) -> Iterator[tuple[int, bytes]]:
    """Deterministic message contents: (msn, bytes). A seeded buffer rotated per message, so every
    message differs and a misplaced packet breaks its CRC."""
    rng = random.Random(seed)
    base = memoryview(rng.randbytes(max(size, 1)))
    n = len(base)
    msn = 0
    while count is None or msn < count:
        r = (msn * 7919) % n
        yield msn, b"".join((base[r:], base[:r]))[:size]  # one copy of the rotated buffer (messages are up to GiBs)
        msn += 1


class MrcSender:
    """Sending side of one QP. ``events(kind, **fields)`` hears retransmits, losses, EV changes."""

    def __init__(self, qp: int, evs: EvSet, messages: Iterator[tuple[int, bytes]], settings: MrcSettings,
                 *, imm: bool = False, events: Callable[..., None] | None = None) -> None:
        self.qp, self.evs, self.s, self.imm = qp, evs, settings, imm
        self.events = events or (lambda kind, **kw: None)
        self._messages = messages
        self._op, self._rkey = (H.OP_WRITE_IMM if imm else H.OP_WRITE), rkey_for(qp)
        self._cur: tuple[int, memoryview, int, int] | None = None  # msn, data, crc, next offset
        self.next_psn = 0
        self.acked_below = 0
        self.recs: dict[int, _Rec] = {}
        self.unacked: set[int] = set()
        self.per_ev: dict[int, deque[int]] = {}
        self.timer_q: deque[tuple[float, int]] = deque()
        self.retx_q: deque[int] = deque()
        self.msg_left: dict[int, int] = {}  # msn -> packets not yet acked
        self.msg_total: dict[int, int] = {}
        self.exhausted = False
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rtt_peak = 0.0  # the largest recent RTT sample, halving every RTT_PEAK_HALF_LIFE_S
        self._peak_at: float | None = None
        self.peer_ports = 0xFF
        self.local_ports = 0xFF
        self.probes: dict[int, tuple[int, float]] = {}  # probe id -> (ev, sent at)
        self.cache: dict[int, tuple[bytes, int]] = {}  # msn -> (message, CRC), until all of it is acked
        self._ports_psn = -1  # echo PSN of the SACK/NACK the peer's port state was last taken from
        self.ring = RegionRing(settings.region_bytes)
        self.sent_at: dict[int, float] = {}  # first transmissions only (Karn), for RTT samples
        self.next_probe_id = 1
        self.last_probe_round = -1.0
        self.stats = {"data_packets": 0, "retransmits": 0, "bytes_acked": 0, "messages_sent": 0,
                      "messages_acked": 0, "losses": 0, "timeouts": 0, "nacks": 0, "probes": 0}

    # ---- state ------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.exhausted and self._cur is None and not self.unacked and not self.retx_q

    def stop(self) -> None:
        """No new messages after the current one (a duration-bound flow at its end)."""
        self.exhausted = True

    @property
    def rto(self) -> float:
        if self.srtt is None:
            return max(self.s.min_rto_s, self.s.initial_rto_s)
        # twice srtt, and never under the recent peak RTT: a fixed window keeps the bottleneck
        # queue full, so the RTT swings with it. When lost packets hold part of the window the
        # queue drains for a moment, srtt follows it down, and the queue refills within an RTT; a
        # timer under the RTT of the full queue would retire healthy EVs.
        return min(self.s.max_rto_s, max(self.s.min_rto_s, 2 * self.srtt + 4 * self.rttvar, self.rtt_peak))

    # ---- sending ----------------------------------------------------------------------------
    def _fetch(self) -> bool:
        """Takes the next message (copy + CRC: tens of ms for a 64 MiB one)."""
        if self.exhausted:
            return False
        try:
            msn, data = next(self._messages)
        except StopIteration:
            self.exhausted = True
            return False
        crc = H.crc32(data)
        self.cache[msn] = (data, crc)
        self._cur = (msn, memoryview(data), crc, 0)
        n = max(1, -(-len(data) // self.s.payload_bytes))
        self.msg_left[msn] = n
        self.msg_total[msn] = len(data)
        self.stats["messages_sent"] += 1
        return True

    def _data_pkt(self, psn: int, ev: int, msn: int, msg_len: int, crc: int, off: int, chunk, flags: int) -> Pkt:
        return Pkt(self._op, self.qp, psn, ev, flags, msn, msg_len, crc, off, self.ring.base[msn] + off,  # DATA_FIELDS
                   self._rkey, len(chunk), chunk, (msn & 0xFFFFFFFF) if self.imm else None, self.local_ports, False)

    def _record(self, psn: int, ev: int, now: float) -> None:
        q = self.per_ev.get(ev)
        if q is None:
            q = self.per_ev[ev] = deque()
        q.append(psn)
        self.timer_q.append((now, psn))
        self.evs.evs[ev].packets += 1

    def poll(self, now: float, budget: int = 64) -> list[Pkt]:
        """Packets to send now: retransmissions first, then new data within the window, then probes."""
        out: list[Pkt] = []
        self._check_timeouts(now)
        while self.retx_q and len(out) < budget:
            psn = self.retx_q.popleft()
            rec = self.recs.get(psn)
            if rec is None or rec.acked:
                continue
            ev = self.evs.next_ev(avoid=rec.ev)
            if ev is None:
                self.retx_q.appendleft(psn)
                break
            rec.ev, rec.t_sent, rec.tx = ev, now, rec.tx + 1
            self._record(psn, ev, now)
            self.sent_at.pop(psn, None)
            self.stats["retransmits"] += 1
            self.evs.evs[ev].retransmits += 1
            out.append(self._rebuild_data(psn, rec, ev, H.F_RETX))
        # new data: the hot path, one packet per turn (names bound once)
        window, payload, unacked, recs, sent_at = self.s.window_packets, self.s.payload_bytes, self.unacked, \
            self.recs, self.sent_at
        ring, evs, info = self.ring, self.evs, self.evs.evs
        sent = 0
        while len(out) < budget and len(unacked) < window:
            ev = evs.next_ev()
            if ev is None:
                break
            cur = self._cur
            if cur is None:
                if not self._fetch():
                    break
                cur = self._cur
            msn, data, crc, off = cur  # type: ignore[misc]
            msg_len = len(data)
            if off == 0 and msn not in ring.base:
                if not ring.fits(msg_len):
                    break  # the region it goes to still holds a message in flight: wait for its acks
                ring.place(msn, msg_len)
            ln = min(payload, msg_len - off)
            self._cur = (msn, data, crc, off + ln) if off + ln < msg_len else None
            psn = self.next_psn
            self.next_psn = psn + 1
            recs[psn] = _Rec(msn, off, ln, ev, now)
            sent_at[psn] = now
            unacked.add(psn)
            self._record(psn, ev, now)
            info[ev].bytes += ln
            sent += 1
            out.append(self._data_pkt(psn, ev, msn, msg_len, crc, off, data[off : off + ln], 0))
            if self._cur is None and msg_len > window * payload:
                # a big next message is fetched *after* these packets are stamped and sent, so the
                # time it takes is not charged to their round trip (which would fire the timer)
                break
        self.stats["data_packets"] += sent
        if self._cur is None and out:
            self._fetch()
        out += self._probes(now)
        return out

    def _rebuild_data(self, psn: int, rec: _Rec, ev: int, flags: int) -> Pkt:
        msg, crc = self.cache[rec.msn]
        chunk = memoryview(msg)[rec.offset : rec.offset + rec.length]
        return self._data_pkt(psn, ev, rec.msn, len(msg), crc, rec.offset, chunk, flags)

    def _check_timeouts(self, now: float) -> None:
        rto = self.rto
        while self.timer_q:
            t, psn = self.timer_q[0]
            rec = self.recs.get(psn)
            if rec is None or rec.acked or rec.t_sent != t:
                self.timer_q.popleft()
                continue
            if now - t < rto * min(8, rec.tx):
                break
            self.timer_q.popleft()
            self.stats["timeouts"] += 1
            self.events("timeout", qp=self.qp, psn=psn, ev=rec.ev)
            self.evs.retire(rec.ev, "retransmission timeout")
            self._lose(psn, rec, "timeout")

    def _lose(self, psn: int, rec: _Rec, why: str) -> None:
        self.stats["losses"] += 1
        self.events("loss", qp=self.qp, psn=psn, ev=rec.ev, reason=why)
        rec.t_sent = -1.0  # no longer timed until resent
        self.retx_q.append(psn)

    # ---- receiving --------------------------------------------------------------------------
    def _ack(self, psn: int, rec: _Rec) -> None:
        """``rec`` (of ``psn``, not yet acknowledged) has arrived."""
        rec.acked = True
        self.unacked.discard(psn)
        self.sent_at.pop(psn, None)
        self.stats["bytes_acked"] += rec.length
        left = self.msg_left.get(rec.msn)
        if left is not None:
            left -= 1
            if left == 0:
                del self.msg_left[rec.msn]
                self.stats["messages_acked"] += 1
                self.cache.pop(rec.msn, None)
                self.ring.release(rec.msn)
            else:
                self.msg_left[rec.msn] = left
        del self.recs[psn]

    def on_packet(self, p: Pkt, now: float) -> None:
        if p.op == H.OP_SACK:
            self._on_sack(p, now)
        elif p.op == H.OP_NACK:
            self._on_nack(p, now)
        elif p.op == H.OP_PROBE and p.is_reply:
            got = self.probes.pop(p.probe_id, None)
            if got is not None:
                self.evs.probe_result(got[0], True, self.s.probe_successes)

    def _full_psn(self, psn24: int) -> int:
        base = self.next_psn
        d = (base - psn24) % PSN_MOD
        return base - d

    def _on_sack(self, p: Pkt, now: float) -> None:
        echo = self._full_psn(p.echo_psn)
        self._peer_ports(p.port_state, echo)
        ev = p.echo_ev
        sent = self.sent_at.get(echo)
        if sent is not None:
            self._rtt_sample(now - sent, now)
        cum = self._full_psn(p.cum_psn) if p.cum_psn != self.next_psn % PSN_MOD else self.next_psn
        newly: list[tuple[int, int, int]] = []  # (psn, ev it was sent on, transmissions)
        if cum > self.acked_below:
            recs = self.recs
            for psn in range(self.acked_below, cum):  # everything below acked_below is acknowledged
                rec = recs.get(psn)
                if rec is not None and not rec.acked:
                    newly.append((psn, rec.ev, rec.tx))
                    self._ack(psn, rec)
            self.acked_below = cum
        base = self._full_psn(p.base_psn)
        bm, i = p.bitmap, 0
        while bm:
            if bm & 1:
                rec = self.recs.get(base + i)
                if rec is not None and not rec.acked:
                    newly.append((base + i, rec.ev, rec.tx))
                    self._ack(base + i, rec)
            bm >>= 1
            i += 1
        if p.sflags & H.S_ECN:
            self.evs.skip(ev, "ECN mark")
        # FIFO inference: every PSN sent on an EV before one that arrived on it, and still not
        # acknowledged, is lost. The EV of an arrival is certain for first transmissions and for
        # the echoed arrival.
        for psn, sent_ev, tx in sorted(newly):
            if tx == 1:
                self._infer(sent_ev, psn, base)
        self._infer(ev, echo, base)

    def _infer(self, ev: int, arrived: int, known_from: int) -> None:
        """PSNs sent on ``ev`` before ``arrived``: unacknowledged ones at or above ``known_from``
        (the SACK's bitmap base: this SACK reports every PSN there) are lost. Below it the SACK
        says nothing, so those are left to later SACKs or the timer."""
        q = self.per_ev.get(ev)
        if not q:
            return
        if q[0] == arrived:  # the usual case: nothing sent on the EV before it is missing
            q.popleft()
            return
        if arrived not in q:
            return
        while q:
            psn = q.popleft()
            if psn == arrived:
                break
            rec = self.recs.get(psn)
            if rec is not None and not rec.acked and rec.ev == ev and rec.t_sent >= 0 and psn >= known_from:
                self.events("gap", qp=self.qp, psn=psn, ev=ev, behind=arrived)
                self.evs.retire(ev, f"untrimmed loss of PSN {psn} behind PSN {arrived}")
                self._lose(psn, rec, "gap on EV")

    def _rtt_sample(self, r: float, now: float) -> None:
        if self._peak_at is not None:
            self.rtt_peak *= 0.5 ** ((now - self._peak_at) / RTT_PEAK_HALF_LIFE_S)
        self.rtt_peak, self._peak_at = max(r, self.rtt_peak), now
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r

    def _on_nack(self, p: Pkt, now: float) -> None:
        psn = self._full_psn(p.echo_psn)
        self._peer_ports(p.port_state, psn)
        rec = self.recs.get(psn)
        self.stats["nacks"] += 1
        if p.sflags & H.S_TRIM:
            self.evs.skip(p.echo_ev, "trimmed packet")
        if rec is not None and not rec.acked:
            self.events("nack", qp=self.qp, psn=psn, ev=p.echo_ev)
            rec.t_sent = -1.0
            self.retx_q.appendleft(psn)

    def _peer_ports(self, state: int, echo_psn: int) -> None:
        """The peer's port-state bitmap, from the newest SACK/NACK only: they come back over
        several paths, and an older one overtaken by a newer one must not flip a plane back."""
        if echo_psn < self._ports_psn:
            return
        self._ports_psn = echo_psn
        if state != self.peer_ports:
            self.peer_ports = state
            self._apply_ports()

    def set_local_ports(self, state: int) -> None:
        if state != self.local_ports:
            self.local_ports = state
            self._apply_ports()

    def _apply_ports(self) -> None:
        up = self.peer_ports & self.local_ports
        for plane in range(self.evs.planes):
            down = not (up >> plane) & 1
            if down != (plane in self.evs.planes_down):
                self.evs.set_plane_down(plane, down)
                self.events("plane", qp=self.qp, plane=plane, up=not down)

    # ---- probes -----------------------------------------------------------------------------
    def _probes(self, now: float) -> list[Pkt]:
        for pid, (ev, t) in list(self.probes.items()):
            if now - t > self.s.probe_timeout_s:
                del self.probes[pid]
                self.evs.probe_result(ev, False, self.s.probe_successes)
        if now - self.last_probe_round < self.s.probe_interval_s:
            return []
        self.last_probe_round = now
        out = []
        pending = {ev for ev, _ in self.probes.values()}
        for ev in self.evs.retired():
            if ev in pending or self.evs.evs[ev].plane in self.evs.planes_down:
                continue
            pid = self.next_probe_id
            self.next_probe_id = (self.next_probe_id + 1) & 0xFFFFFFFF or 1
            self.probes[pid] = (ev, now)
            self.stats["probes"] += 1
            out.append(Pkt(op=H.OP_PROBE, qp=self.qp, ev=ev, probe_id=pid, is_reply=0,
                           t_send_ns=int(now * 1e9), port_state=self.local_ports))
        return out


def make_sender(qp: int, plan: AddressPlan, src: str, dst: str, settings: MrcSettings, rng: random.Random,
                messages: Iterator[tuple[int, bytes]], *, imm: bool = False, denylist: frozenset[int] = frozenset(),
                events: Callable[..., None] | None = None) -> MrcSender:
    """An MRC sender for ``src -> dst`` with a freshly drawn EV set."""
    ev_events = events or (lambda kind, **kw: None)
    evs = EvSet.draw(plan, src, dst, rng, settings.evs_per_plane, settings.backup_per_plane, denylist,
                     on_change=lambda ev, old, new, why: ev_events("ev_state", qp=qp, ev=ev, old=old, new=new,
                                                                   reason=why))
    return MrcSender(qp, evs, messages, settings, imm=imm, events=events)


@dataclass
class _Msg:
    msg_len: int
    crc: int
    base: int
    got: int = 0


@dataclass
class RxStats:
    data_packets: int = 0
    delivered_bytes: int = 0
    messages_delivered: int = 0
    messages_corrupt: int = 0
    duplicates: int = 0
    trimmed: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    completions: list[int] = field(default_factory=list)  # write-with-immediate, in MSN order

    def drop(self, why: str) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + 1


class MrcReceiver:
    """Receiving side of one QP: places packets in any order, SACKs, NACKs trims, completes messages.

    ``region`` is the QP's memory region (``settings.region_bytes``). ``reverse_ev()`` picks the EV
    a SACK/NACK travels on. Malformed or out-of-window packets are counted in ``stats.dropped``
    and never raise.
    """

    def __init__(self, qp: int, settings: MrcSettings, reverse_ev: Callable[[], int],
                 *, events: Callable[..., None] | None = None) -> None:
        self.qp, self.s, self.reverse_ev = qp, settings, reverse_ev
        self._rkey = rkey_for(qp)
        self.events = events or (lambda kind, **kw: None)
        self.region = bytearray(settings.region_bytes)
        self.cum = 0  # every PSN below is received
        self.above: set[int] = set()
        self.newest = -1
        self.msgs: dict[int, _Msg] = {}
        self.done_msns: set[int] = set()
        self.next_completion = 0
        self.imm_done: dict[int, int] = {}
        self.stats = RxStats()
        self.pending_ack = 0  # arrivals not yet SACKed, all within one bitmap: pending_lo..pending_hi
        self.pending_since: float | None = None
        self.pending_lo = self.pending_hi = 0
        self.last = (0, 0, False)  # echo psn, echo ev, ecn
        self.peer_ports = 0xFF
        self.local_ports = 0xFF
        self.msn_floor = 0

    def _full(self, psn24: int) -> int:
        d = (psn24 - self.cum) % PSN_MOD
        return self.cum + d if d < PSN_MOD // 2 else self.cum - ((self.cum - psn24) % PSN_MOD)

    def on_packet(self, p: Pkt, now: float) -> list[Pkt]:
        if p.op not in (H.OP_WRITE, H.OP_WRITE_IMM):
            self.stats.drop("unexpected opcode")
            return []
        self.peer_ports = p.port_state
        cum = self.cum
        psn = self._full(p.psn)
        if psn >= cum + self.s.max_psn_window:
            self.stats.drop("out of window")
            return []
        payload, dma_len = p.payload, p.dma_len
        if p.flags & H.F_TRIM or len(payload) < dma_len:
            self.stats.trimmed += 1
            self.events("trim", qp=self.qp, psn=psn, ev=p.ev)
            return [self._sack(H.OP_NACK, psn, p.ev, H.S_TRIM, self.newest)]
        if psn < cum or psn in self.above:
            self.stats.duplicates += 1
            return [self._sack(H.OP_SACK, psn, p.ev, 0, psn)]
        why = self._check(p)
        if why:
            self.stats.drop(why)
            return []
        msn, va = p.msn, p.va
        m = self.msgs.get(msn)
        base = va - p.msg_offset
        if m is None:
            if msn < self.msn_floor or msn >= self.msn_floor + 4096 or msn in self.done_msns:
                self.stats.drop("message out of window")
                return []
            m = self.msgs[msn] = _Msg(p.msg_len, p.msg_crc, base)
        elif m.msg_len != p.msg_len or m.crc != p.msg_crc or m.base != base:
            self.stats.drop("inconsistent message fields")
            return []
        out = []
        if self.pending_ack and max(self.pending_hi, psn) - min(self.pending_lo, psn) >= SACK_BITMAP_BITS:
            out.append(self._flush())  # this arrival and the pending ones would not fit one bitmap
        self.region[va : va + dma_len] = payload
        st = self.stats
        st.data_packets += 1
        st.delivered_bytes += dma_len
        m.got += dma_len
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
        if m.got >= m.msg_len:
            self._complete(msn, m, p.imm if p.op == H.OP_WRITE_IMM else None)
        self.last = (psn, p.ev, p.ecn_ce)
        if self.pending_ack:
            if psn < self.pending_lo:
                self.pending_lo = psn
            elif psn > self.pending_hi:
                self.pending_hi = psn
        else:
            self.pending_lo = self.pending_hi = psn
            self.pending_since = now
        self.pending_ack += 1
        if p.ecn_ce or self.pending_ack >= SACK_COALESCE_MAX:
            out.append(self._flush())
        return out  # else due at the next poll (the end of the receive batch) once ack_every are pending

    def _check(self, p: Pkt) -> str | None:
        if p.rkey != self._rkey:
            return "bad rkey"
        dma_len, off, msg_len, va, size = p.dma_len, p.msg_offset, p.msg_len, p.va, len(self.region)
        if dma_len != len(p.payload) or (dma_len == 0 and msg_len != 0):  # only an empty message is empty
            return "bad length"
        if not (0 <= off < msg_len and off + dma_len <= msg_len) and (off, msg_len) != (0, 0):
            return "bad message offset"
        if va < off or va + dma_len > size or va - off + msg_len > size:
            return "address outside the memory region"
        return None

    def _complete(self, msn: int, m: _Msg, imm: int | None) -> None:
        del self.msgs[msn]
        if H.crc32(memoryview(self.region)[m.base : m.base + m.msg_len]) == m.crc:
            self.stats.messages_delivered += 1
        else:
            self.stats.messages_corrupt += 1
            self.events("corrupt", qp=self.qp, msn=msn)
        self.done_msns.add(msn)
        if imm is not None:
            self.imm_done[msn] = imm
        while self.next_completion in self.done_msns:
            self.done_msns.discard(self.next_completion)
            if self.next_completion in self.imm_done:
                self.stats.completions.append(self.imm_done.pop(self.next_completion))
            self.next_completion += 1
        self.msn_floor = self.next_completion

    def _sack(self, op: int, echo_psn: int, echo_ev: int, flags: int, top: int) -> Pkt:
        """A SACK/NACK whose bitmap covers the 64 PSNs up to ``top`` (never below cum_psn)."""
        base = max(self.cum, top - (SACK_BITMAP_BITS - 1))
        bm = 0
        for q in self.above:  # PSNs received above cum: few unless the paths reorder a lot
            d = q - base
            if 0 <= d < SACK_BITMAP_BITS:
                bm |= 1 << d
        return Pkt(op=op, qp=self.qp, ev=self.reverse_ev(), cum_psn=self.cum % PSN_MOD, base_psn=base % PSN_MOD,
                   bitmap=bm, echo_ev=echo_ev, echo_psn=echo_psn % PSN_MOD, sflags=flags,
                   port_state=self.local_ports)

    def _flush(self) -> Pkt:
        psn, ev, ecn = self.last
        self.pending_ack = 0
        self.pending_since = None
        return self._sack(H.OP_SACK, psn, ev, H.S_ECN if ecn else 0, self.pending_hi)

    def poll(self, now: float) -> list[Pkt]:
        """The SACK that is due: ``ack_every`` packets pending, or one pending for ``ack_delay_s``."""
        n = self.pending_ack
        if n and (n >= self.s.ack_every or now - self.pending_since >= self.s.ack_delay_s):  # type: ignore[operator]
            return [self._flush()]
        return []


def probe_reply(p: Pkt, reverse_ev: int, port_state: int) -> Pkt:
    """The answer to a probe request, sent back on a reverse EV."""
    return Pkt(op=H.OP_PROBE, qp=p.qp, ev=reverse_ev, probe_id=p.probe_id, is_reply=1, t_send_ns=p.t_send_ns,
               echo_ev=p.ev, port_state=port_state)


__all__ = ["MrcSender", "MrcReceiver", "MrcSettings", "Pkt", "make_sender", "message_source", "probe_reply",
           "rkey_for", "ASSUMED_BAD"]
