"""One host NIC's transport stack, still without I/O: its senders, its receivers, reverse EVs,
probe answers and port state. Frames in, frames out (:class:`HostStack`).

* Data for a QP this host receives creates its receiver on first sight (peer, QP).
* SACKs and NACKs travel on a small reverse EV set per peer (per plane up to
  ``reverse_evs_per_plane + 1`` paths, random T1s, seeded), rotated over the planes up at both ends.
  The set is kept fresh by probes when no data flows back (docs/mrc.md, "Reverse path"): every
  ``probe_interval_s`` each reverse EV is probed; one unanswered within ``probe_timeout_s`` takes it
  out of the rotation, and ``probe_successes`` answers in a row bring it back. A reverse EV whose
  path (plane and T1) this host's own data to that peer crosses is judged by that data instead
  (:meth:`HostStack.data_paths`) and not probed: where data flows both ways (a collective), probes
  of every reverse EV every 50 ms took a quarter of a 2 Mb/s NIC port (fig. 17's all-to-all,
  280 requests and as many answers a second per host, 2026-12-06 captures).
* A probe is answered on its *mirror* path (same plane and T1, the other direction), so a probe's
  round trip tests exactly the links of the EV it probes.
* The port-state bitmap (bit p = plane p's NIC port is up) goes out in every data packet, SACK and
  probe; a sender stops using a plane that is down at either end (docs/mrc.md, "Reverse path").
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan, ev_entropy, ev_plane, ev_t1, make_ev
from mrclab.traffic.contract import Event, PortsChanged, ReverseEvChanged
from mrclab.traffic.evs import EvState
from mrclab.traffic.nicqueue import NicQueues
from mrclab.traffic.packet import Pkt
from mrclab.traffic.ports import ALL_UP
from mrclab.traffic.probes import ProbeScheduler
from mrclab.traffic.receiver import MrcReceiver, probe_reply
from mrclab.traffic.roce import RoceReceiver, RoceSender, ecmp_ev
from mrclab.traffic.sender import make_sender
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.transport import Receiver, Sender
from mrclab.traffic.wire import Wire

_DATA_OPS = (H.OP_WRITE, H.OP_WRITE_IMM)
#: A path from this host: (plane, T1), T1 None towards a peer under the same T0s (no T1 on the way).
_Path = tuple[int, int | None]
#: Receivers one host creates at most (one per (peer, QP) that sends to it).
MAX_RECEIVERS = 1024


@dataclass
class _Reverse:
    """Reverse EVs towards one peer: per plane one EV per path (T1), up to
    ``reverse_evs_per_plane + 1`` paths; ``bad`` holds those whose last probe went unanswered."""

    evs: list[int]
    i: int = 0
    bad: set[int] = field(default_factory=set)
    ok_streak: dict[int, int] = field(default_factory=dict)


@dataclass
class HostStack:
    """See the module docstring. ``events`` hears every event of every QP, with ``peer`` set."""

    plan: AddressPlan
    host: str
    settings: TransportSettings
    transport: str = "mrc"
    seed: int = 1
    events: Callable[[Event], None] = field(default=lambda _e: None)
    denylist: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        """Set up the wire, the QP tables, the reverse EV sets and their probes, every port up.
        Raises ValueError unless ``transport`` is ``mrc`` or ``roce``."""
        if self.transport not in ("mrc", "roce"):
            raise ValueError(f"transport {self.transport!r}; allowed: mrc, roce")
        self.rng = random.Random(self.seed)
        self.wire = Wire(self.plan, self.host)
        self.senders: dict[tuple[str, int], Sender] = {}
        self.receivers: dict[tuple[str, int], Receiver] = {}
        self.reverse: dict[str, _Reverse] = {}
        self.local_ports = (1 << self.plan.spec.planes) - 1
        self.peer_ports: dict[str, int] = {}
        self.unknown_qp = 0
        self.rev_probes: ProbeScheduler[tuple[str, int]] = ProbeScheduler(self.settings.probe_interval_s,
                                                                          self.settings.probe_timeout_s)
        #: hears (peer, QP, MSN, bytes) of every message that arrives whole (a collective's input)
        self.on_message: Callable[[str, int, int, memoryview], None] | None = None
        self._now = 0.0  # the time of the frame being handled (on_frame), for _write_in
        self._write_handler = self._write_in  # bound once: on_frame hands it to every decode
        #: the model of this host's NIC port queues, where the port rate is known (traffic/nicqueue.py)
        self.nic = NicQueues(self.plan.spec.planes, self.settings.port_mbps * 1e6, self.settings.port_burst_bytes) \
            if self.settings.port_mbps > 0 else None
        #: whether the NIC is modelled: each sender (MRC's or RoCE's) is then told when its packets
        #: left the port (:meth:`MrcSender.departed`, :meth:`RoceSender.departed`)
        self.nic_model = self.nic is not None
        #: bit p: a departure stamp came from the plane-p port (:meth:`left_port`): the senders
        #: time their packets there from the stamps (MrcSender.wire_ports, RoceSender.wire_ports)
        self.stamped_ports = 0
        #: id() of a sender or receiver -> its next_due as last computed: until then, with no packet
        #: for it and nothing :meth:`wake` says, its poll has nothing, and :meth:`poll` skips it. A
        #: host of a collective holds a QP per peer; polling every one at every wake-up cost the
        #: endpoints of an 8-host all-to-all (14 QPs a host) most of their CPU (py-spy, 2026-11-28)
        self._due: dict[int, float] = {}
        self._colls: list = []  # the collectives feeding this host's senders (their ``posted`` wakes them)

    def _events_for(self, peer: str) -> Callable[[Event], None]:
        sink = self.events
        return lambda e: sink(dataclasses.replace(e, peer=peer))

    # ---- set-up -------------------------------------------------------------------------------
    def add_sender(self, qp: int, peer: str, messages, *, imm: bool = False, pin_ev: int | None = None) -> Sender:
        """A sender of QP ``qp`` to ``peer``; ``pin_ev`` holds an MRC QP to that one EV (with
        ``spray`` off, every MRC QP is held to the EV the baseline's ECMP hash gives it)."""
        ev_log = self._events_for(peer)
        if self.transport == "mrc" and pin_ev is None and not self.settings.spray:
            pin_ev = ecmp_ev(self.plan, self.host, peer, qp, self.seed)
        if self.transport == "mrc":
            mrc = make_sender(qp, self.plan, self.host, peer, self.settings, self.rng, messages,
                              imm=imm, denylist=self.denylist, events=ev_log, pin_ev=pin_ev)
            mrc.make_data = self.wire.framer(peer)  # data packets come out as frames: no Pkt per packet
            if self.nic is not None:
                mrc.nic_wait = self.nic.wait_at
            mrc.wire_ports = self.stamped_ports
            s: Sender = mrc
        else:
            roce = RoceSender(qp, ecmp_ev(self.plan, self.host, peer, qp, self.seed), messages, self.settings,
                              imm=imm, events=ev_log)
            roce.make_data = self.wire.framer(peer)  # as MRC's: the baseline pays what MRC pays per frame
            roce.wire_ports = self.stamped_ports
            s = roce
        s.set_local_ports(self.local_ports)
        self.senders[(peer, qp)] = s
        return s

    def add_collective(self, coll) -> list[Sender]:
        """This host's part of a collective (traffic/collective.py): a Write-with-Immediate sender
        per (peer, QP) it writes on, fed by the collective's schedule, and every message that
        arrives whole handed to it. Call ``coll.start`` to begin."""
        self.on_message = coll.on_message
        self._colls.append(coll)
        return [self.add_sender(qp, peer, src, imm=True) for (peer, qp), src in coll.sources().items()]

    def wake(self, key: tuple[str, int] | None = None) -> None:
        """Something outside the packets gave the sender of ``key`` (peer, QP), or with None every
        sender and receiver, work to look at (a message, a stop, a port): :meth:`poll` polls it
        next time whatever its last next_due said."""
        if key is None:
            self._due.clear()
        elif (s := self.senders.get(key)) is not None:
            self._due.pop(id(s), None)

    def _wake_posted(self) -> None:
        for c in self._colls:
            if c.posted:
                for key in c.posted:
                    self.wake(key)
                c.posted.clear()

    def _reverse_set(self, peer: str) -> _Reverse:
        r = self.reverse.get(peer)
        if r is None:
            spec = self.plan.spec
            same = spec.group_of(self.host) == spec.group_of(peer)
            n = 1 if same else min(spec.t1_per_plane, self.settings.reverse_evs_per_plane + 1)
            # one random order of the T1s per plane, drawn once, so a plane's reverse EVs take n
            # distinct T1s (a T1 that dies then leaves the plane a reverse path)
            order = [self.rng.sample(range(spec.t1_per_plane), spec.t1_per_plane) if not same else [0]
                     for _ in range(spec.planes)]
            evs = []
            for k in range(n):  # plane-interleaved, the k-th T1 of each plane's order
                for p in range(spec.planes):
                    evs.append(make_ev(p, order[p][k % len(order[p])], self.rng.randrange(1, 1 << 16)))
            r = self.reverse[peer] = _Reverse(evs)
        return r

    def _reverse_ev(self, peer: str) -> int:
        r = self._reverse_set(peer)
        up = self.local_ports & self.peer_ports.get(peer, ALL_UP)
        for avoid_bad in (True, False):
            for _ in range(len(r.evs)):
                ev = r.evs[r.i]
                r.i = (r.i + 1) % len(r.evs)
                if (up >> ev_plane(ev)) & 1 and not (avoid_bad and ev in r.bad):
                    return ev
        return r.evs[0]

    def data_paths(self, now: float) -> dict[str, dict[_Path, bool]]:
        """What this host's own data says of its paths to each peer it sends to: peer -> {(plane,
        T1): working}. A path is working when an EV of a sender to that peer through it delivered a
        packet sent within ``probe_timeout_s`` of ``now`` (the probe's own deadline); broken when
        every EV of those senders through it is retired or denied while another of their EVs
        delivered in that time (the data flows, and not there). A path neither says is absent: its
        reverse EVs are probed. T1 is None towards a peer of this host's own T0 group (no T1 on
        the way)."""
        out: dict[str, dict[_Path, bool]] = {}
        since = now - self.settings.probe_timeout_s
        spec = self.plan.spec
        for (peer, _), s in self.senders.items():
            delivered = getattr(s, "delivered_after", None)
            if not delivered:
                continue
            # a SKIP EV (an ECN mark came back on it: congested, and delivering) is passed over for
            # its hold, ecn_skip_rtts smoothed RTTs; its delivery before the hold still judges its
            # path through it (an incast's last hop marks every EV: fig. 17's skips left paths
            # unused and their reverse EVs probed, 0.036 of the data bytes, 2026-12-07 captures)
            rtt = getattr(s, "rtt", None)  # an MRC sender's (delivered_after is too)
            skip_since = since - self.settings.ecn_skip_rtts * ((rtt.srtt if rtt is not None else None) or 0.0)
            states = s.ev_states()
            fresh = {ev for ev, st in states.items()
                     if delivered.get(ev, -1.0) >= (skip_since if st is EvState.SKIP else since)}
            if not fresh:
                continue  # no data of it delivered lately: it says nothing
            same = spec.group_of(self.host) == spec.group_of(peer)
            seen: dict[_Path, bool | None] = {}  # None: an EV in use there with nothing lately
            for ev, state in states.items():
                path: _Path = (ev_plane(ev), None if same else ev_t1(ev))
                if ev in fresh:
                    seen[path] = True
                elif state in (EvState.ASSUMED_BAD, EvState.DENIED):
                    seen.setdefault(path, False)
                elif seen.get(path) is not True:
                    seen[path] = None
            paths = out.setdefault(peer, {})
            for path, ok in seen.items():
                if ok is not None:
                    paths[path] = paths.get(path, False) or ok
        return out

    def _judge_reverse(self, peer: str, r: _Reverse, ev: int, working: bool) -> None:
        """Reverse EV ``ev`` towards ``peer`` judged by this host's data (:meth:`data_paths`)."""
        if working and ev in r.bad:
            r.bad.discard(ev)
            r.ok_streak[ev] = 0
            self.events(ReverseEvChanged(peer=peer, ev=ev, state=EvState.GOOD))
        elif not working and ev not in r.bad:
            r.bad.add(ev)
            r.ok_streak[ev] = 0
            self.events(ReverseEvChanged(peer=peer, ev=ev, state=EvState.ASSUMED_BAD))

    def _to_probe(self, now: float):
        """(peer, reverse EV) to probe this round: those on a port that is up and on a path this
        host's data does not judge (each one it judges is judged here)."""
        up = self.local_ports
        judged = self.data_paths(now)
        spec = self.plan.spec
        for peer in self.receivers_peers():
            r = self._reverse_set(peer)
            paths = judged.get(peer, {})
            same = spec.group_of(self.host) == spec.group_of(peer)
            for ev in r.evs:
                if not (up >> ev_plane(ev)) & 1:
                    continue
                working = paths.get((ev_plane(ev), None if same else ev_t1(ev)))
                if working is None:
                    yield peer, ev
                else:
                    self._judge_reverse(peer, r, ev, working)

    def probe_reverse(self, now: float) -> list:
        """Probes of the reverse EVs towards the peers that send to this host, one round every
        ``probe_interval_s``, but for those this host's own data judges (module docstring); an
        unanswered one takes its EV out of the rotation."""
        out: list = []
        if not self.rev_probes.pending and not self.rev_probes.round_due(now):
            return out
        for peer, ev in self.rev_probes.expired(now):
            r = self.reverse[peer]
            r.ok_streak[ev] = 0
            if ev not in r.bad:
                r.bad.add(ev)
                self.events(ReverseEvChanged(peer=peer, ev=ev, state=EvState.ASSUMED_BAD))
        todo = self.rev_probes.round(now, self._to_probe(now)) if self.rev_probes.round_due(now) else []
        for pid, (peer, ev) in todo:
            self._out(peer, [Pkt(op=H.OP_PROBE, qp=0, ev=ev, probe_id=pid, is_reply=0, t_send_ns=int(now * 1e9),
                                 port_state=self.local_ports)], out)
        return out

    def receivers_peers(self) -> list[str]:
        """Every peer that sends to this host (it has a receiver for), sorted."""
        return sorted({peer for peer, _ in self.receivers})

    def _on_reverse_reply(self, p: Pkt) -> None:
        got = self.rev_probes.answered(p.probe_id)
        if got is None:
            return
        peer, ev = got
        r = self.reverse[peer]
        if ev in r.bad:
            r.ok_streak[ev] = r.ok_streak.get(ev, 0) + 1
            if r.ok_streak[ev] >= self.settings.probe_successes:
                r.bad.discard(ev)
                self.events(ReverseEvChanged(peer=peer, ev=ev, state=EvState.GOOD))

    # ---- frames -------------------------------------------------------------------------------
    def _out(self, peer: str, pkts: list, out: list) -> None:
        """``pkts`` as frames onto ``out``: each :class:`Pkt` encoded, each frame a sender's framer
        already built (a tuple) as it is."""
        if pkts:
            encode = self.wire.encode
            out += [p if type(p) is tuple else encode(p, peer) for p in pkts]

    def on_frame(self, frame, now: float) -> list[tuple[int, bytes]]:
        """Handle one received frame; returns frames to send as (plane, frame). Never raises."""
        self._now = now
        got = self.wire.decode(frame, self._write_handler)
        if got is None:
            return []
        if isinstance(got, tuple):  # else an untrimmed Write, taken by _write_in: its frames to send
            peer, p = got
            out = self._packet_in(peer, p, now)
        else:
            out = got
        if out and self.nic is not None:
            self.nic.add(out, now)
        return out

    def _packet_in(self, peer: str, p: Pkt, now: float) -> list[tuple[int, bytes]]:
        """:meth:`on_frame` of a decoded packet from ``peer``; returns the frames to send."""
        out: list = []
        if p.op in _DATA_OPS:
            return self._data_in(peer, p, now)
        if p.op == H.OP_PROBE and not p.is_reply:
            self.peer_ports[peer] = p.port_state
            mirror = make_ev(ev_plane(p.ev), ev_t1(p.ev), ev_entropy(p.ev))  # same plane and T1, back
            self._out(peer, [probe_reply(p, mirror, self.local_ports)], out)
        elif p.op == H.OP_PROBE and p.qp == 0:
            self._on_reverse_reply(p)
        else:
            s = self.senders.get((peer, p.qp))
            if s is None:
                self.unknown_qp += 1
                return []
            s.on_packet(p, now)
            self._due.pop(id(s), None)
        return out

    def _write_in(self, peer: str, qp: int, psn: int, ev: int, flags: int, msn: int, msg_len: int, msg_crc: int,
                  off: int, va: int, rkey: int, dma_len: int, payload, port_state: int,
                  ecn_ce: bool, stamp: int = -1) -> list[tuple[int, bytes]]:
        """An untrimmed Write from ``peer``, as :meth:`Wire.decode` hands its fields over: straight
        to its MRC receiver (the receive path's hot spot: no Pkt); a Write for a QP with no receiver
        yet, or for the baseline's, goes the general way (:meth:`_data_in`)."""
        rx = self.receivers.get((peer, qp))
        if type(rx) is not MrcReceiver:
            p = Pkt(H.OP_WRITE, qp, psn, ev, flags, msn, msg_len, msg_crc, off, va, rkey, dma_len, payload, None,
                    port_state, ecn_ce)
            p.stamp = stamp
            return self._data_in(peer, p, self._now)
        self.peer_ports[peer] = port_state
        self._due.pop(id(rx), None)
        acks = rx.on_write(psn, ev, flags, msn, msg_len, msg_crc, off, va, rkey, dma_len, payload, None, port_state,
                           ecn_ce, self._now, stamp)
        if not acks:  # usually none: SACKs leave at the end of the receive batch
            return []
        encode = self.wire.encode
        return [encode(a, peer) for a in acks]

    def _data_in(self, peer: str, p: Pkt, now: float) -> list[tuple[int, bytes]]:
        """A data packet from ``peer`` to its QP's receiver, made on the QP's first packet (at most
        MAX_RECEIVERS; more are counted as unknown QPs and dropped); returns the frames to send."""
        self.peer_ports[peer] = p.port_state
        rx = self.receivers.get((peer, p.qp))
        if rx is None:
            if len(self.receivers) >= MAX_RECEIVERS:
                self.unknown_qp += 1
                return []
            if self.transport == "mrc":
                rx = MrcReceiver(p.qp, self.settings, lambda: self._reverse_ev(peer), events=self._events_for(peer))
            else:  # the baseline answers on its own single path: the ECMP hash of the reverse direction
                back = ecmp_ev(self.plan, self.host, peer, p.qp, self.seed)
                rx = RoceReceiver(p.qp, self.settings, lambda: back, events=self._events_for(peer))
            self.receivers[(peer, p.qp)] = rx
            rx.local_ports = self.local_ports
            if self.on_message is not None:
                hear, qp = self.on_message, p.qp
                rx.region.on_message = lambda msn, data: hear(peer, qp, msn, data)
        out: list = []
        self._due.pop(id(rx), None)
        acks = rx.on_packet(p, now)
        if acks:  # usually none: SACKs leave at the end of the receive batch
            self._out(peer, acks, out)
        return out

    def poll(self, now: float, budget: int = 64, active: set[int] | None = None) -> list[tuple[int, bytes]]:
        """Every frame due at ``now`` (monotonic s): senders' data (at most ``budget`` packets each),
        receivers' acknowledgements, reverse-EV probes; as ``[(plane, frame)]``. With
        ``active``, only the senders whose ``id()`` is in it send (QPs whose start time has come).
        A sender or receiver whose last next_due is still ahead, with no packet for it since and
        nothing woken (:meth:`wake`), is not polled: it has nothing."""
        out: list = []
        stamped = []  # (sender, the index of its first frame in out): each told its frames' waits
        due = self._due
        if self._colls:
            self._wake_posted()
        for (peer, _), s in self.senders.items():
            if active is None or id(s) in active:
                d = due.get(id(s))
                if d is not None and d > now:
                    continue
                due.pop(id(s), None)
                start = len(out)
                self._out(peer, s.poll(now, budget), out)
                if self.nic_model and len(out) > start:
                    stamped.append((s, start))
        for (peer, _), r in self.receivers.items():
            d = due.get(id(r))
            if d is not None and d > now:
                continue
            due.pop(id(r), None)
            self._out(peer, r.poll(now), out)
        if self.receivers and self.transport == "mrc":
            out += self.probe_reverse(now)
        if out and self.nic is not None:
            waits = self.nic.add(out, now)
            for s, start in stamped:
                s.departed(waits, start)
        return out

    def left_port(self, plane: int, head: bytes, t: float) -> None:
        """The plane-``plane`` port sent the frame whose first bytes are ``head`` at ``t``
        (monotonic s; a departure stamp, traffic/txstamp.py). The port's first stamped data packet says
        its packets are stamped: the senders time their packets there from the stamps (a port
        whose stamps come back as nothing this NIC sent never is). For a data packet: the NIC model's
        history takes the wait it met (traffic/nicqueue.py :meth:`~NicQueues.left`), and its
        sender the stamp. Anything else is ignored."""
        got = self.wire.sent_data(head)
        if got is None:
            return
        if not (self.stamped_ports >> plane) & 1:  # the port's first data packet stamped: it stamps them
            self.stamped_ports |= 1 << plane
            for x in self.senders.values():
                x.wire_ports = self.stamped_ports
        peer, qp, psn, stamp = got
        # handed over at its send stamp (mod 2^16 x 100 us, 6.55 s: far longer than any port holds a
        # frame); a stamp a unit ahead of its departure is the two clocks' reading, not 6.55 s of wait
        d = (int(t * H.STAMP_HZ) - stamp) & 0xFFFF
        handed = t - ((d - 0x10000 if d > 0xFFF0 else d) / H.STAMP_HZ)
        if self.nic is not None:
            self.nic.left(plane, handed, t - handed)
        s = self.senders.get((peer, qp))
        if s is not None:
            s.left_nic(psn, handed, t)

    def next_due(self, now: float, active: set[int] | None = None) -> float:
        """The earliest time (monotonic s) :meth:`poll` may have a frame to send with no frame
        received before then (``now``: at once; ``inf``: only a received frame can give it work):
        the soonest of its senders' (those in ``active``, as for :meth:`poll`), its receivers'
        and, with receivers, the reverse-EV probes'. Each sender's and receiver's is kept until a
        packet for it, :meth:`poll` or :meth:`wake` drops it."""
        due = float("inf")
        cache = self._due
        if self._colls:
            self._wake_posted()
        for s in self.senders.values():
            if active is None or id(s) in active:
                d = cache.get(id(s))
                if d is None:
                    d = cache[id(s)] = s.next_due(now)
                if d < due:
                    due = d
                if due <= now:
                    return now
        for r in self.receivers.values():
            d = cache.get(id(r))
            if d is None:
                d = cache[id(r)] = r.next_due(now)
            if d < due:
                due = d
        if self.receivers and self.transport == "mrc":
            due = min(due, self.rev_probes.next_due())
        return due

    def set_local_ports(self, state: int) -> None:
        """Bit p = this NIC's plane-p port is up (from the interfaces' carrier)."""
        if state == self.local_ports:
            return
        self.events(PortsChanged(state=state))
        self.local_ports = state
        self.wake()
        for s in self.senders.values():
            s.set_local_ports(state)
        for r in self.receivers.values():
            r.local_ports = state

    @property
    def done(self) -> bool:
        """True when every sender of this host is done."""
        return all(s.done for s in self.senders.values())

    def dropped(self) -> dict[str, int]:
        """Every packet this host refused, by reason (wire + receivers + unknown QPs)."""
        out = dict(self.wire.rejected)
        for r in self.receivers.values():
            for k, v in r.stats.dropped.items():
                out[k] = out.get(k, 0) + v
        if self.unknown_qp:
            out["unknown QP"] = self.unknown_qp
        return out
