"""One host NIC's transport stack, still without I/O: its senders, its receivers, reverse EVs,
probe answers and port state. Frames in, frames out (:class:`HostStack`).

* Data for a QP this host receives creates its receiver on first sight (peer, QP).
* SACKs, NACKs and probe replies travel on a small reverse EV set: ``reverse_evs_per_plane`` EVs
  per plane (random T1, seeded), rotated over the planes that are up at both ends.
* The port-state bitmap (bit p = plane p's NIC port is up) goes out in every data packet, SACK and
  probe; a sender stops using a plane that is down at either end (MRC.md, "Reverse path").
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from topologies.addressing import AddressPlan, ev_plane, make_ev
from traffic import headers as H
from traffic.mrc import MrcReceiver, MrcSender, MrcSettings, Pkt, make_sender, probe_reply
from traffic.roce import RoceReceiver, RoceSender, ecmp_ev
from traffic.wire import Wire


@dataclass
class _Reverse:
    evs: list[int]
    i: int = 0


@dataclass
class HostStack:
    plan: AddressPlan
    host: str
    settings: MrcSettings
    transport: str = "mrc"
    seed: int = 1
    events: Callable[..., None] = field(default=lambda kind, **kw: None)
    denylist: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.transport not in ("mrc", "roce"):
            raise ValueError(f"transport {self.transport!r}; allowed: mrc, roce")
        self.rng = random.Random(self.seed)
        self.wire = Wire(self.plan, self.host)
        self.senders: dict[tuple[str, int], MrcSender | RoceSender] = {}
        self.receivers: dict[tuple[str, int], MrcReceiver] = {}
        self.reverse: dict[str, _Reverse] = {}
        self.local_ports = (1 << self.plan.spec.planes) - 1
        self.peer_ports: dict[str, int] = {}
        self.unknown_qp = 0
        self.probes_answered = 0

    # ---- set-up -------------------------------------------------------------------------------
    def add_sender(self, qp: int, peer: str, messages, *, imm: bool = False) -> MrcSender | RoceSender:
        ev_log = lambda kind, **kw: self.events(kind, peer=peer, **kw)  # noqa: E731
        if self.transport == "mrc":
            s: MrcSender | RoceSender = make_sender(qp, self.plan, self.host, peer, self.settings, self.rng, messages,
                                                   imm=imm, denylist=self.denylist, events=ev_log)
        else:
            s = RoceSender(qp, ecmp_ev(self.plan, self.host, peer, qp, self.seed), messages, self.settings,
                           imm=imm, events=ev_log)
        s.set_local_ports(self.local_ports)
        self.senders[(peer, qp)] = s
        return s

    def _reverse_ev(self, peer: str) -> int:
        r = self.reverse.get(peer)
        if r is None:
            same = self.plan.spec.group_of(self.host) == self.plan.spec.group_of(peer)
            evs = [make_ev(p, 0 if same else self.rng.randrange(self.plan.spec.t1_per_plane), self.rng.randrange(1, 1 << 16))
                   for _ in range(self.settings.reverse_evs_per_plane) for p in range(self.plan.spec.planes)]
            r = self.reverse[peer] = _Reverse(evs)
        up = self.local_ports & self.peer_ports.get(peer, 0xFF)
        for _ in range(len(r.evs)):
            ev = r.evs[r.i]
            r.i = (r.i + 1) % len(r.evs)
            if (up >> ev_plane(ev)) & 1:
                return ev
        return r.evs[0]

    # ---- frames -------------------------------------------------------------------------------
    def _out(self, peer: str, pkts: list[Pkt], out: list) -> None:
        for p in pkts:
            out.append(self.wire.encode(p, peer))

    def on_frame(self, frame, now: float) -> list[tuple[int, list]]:
        """Handle one received frame; returns frames to send as (plane, buffers). Never raises."""
        got = self.wire.decode(frame)
        if got is None:
            return []
        peer, p = got
        out: list = []
        if p.op in (H.OP_WRITE, H.OP_WRITE_IMM):
            self.peer_ports[peer] = p.port_state
            rx = self.receivers.get((peer, p.qp))
            if rx is None:
                if len(self.receivers) >= 1024:
                    self.unknown_qp += 1
                    return []
                cls = MrcReceiver if self.transport == "mrc" else RoceReceiver
                rx = self.receivers[(peer, p.qp)] = cls(p.qp, self.settings, lambda: self._reverse_ev(peer),
                                                        events=lambda kind, **kw: self.events(kind, peer=peer, **kw))
                rx.local_ports = self.local_ports
            self._out(peer, rx.on_packet(p, now), out)
        elif p.op == H.OP_PROBE and not p.is_reply:
            self.peer_ports[peer] = p.port_state
            self.probes_answered += 1
            self._out(peer, [probe_reply(p, self._reverse_ev(peer), self.local_ports)], out)
        else:
            s = self.senders.get((peer, p.qp))
            if s is None:
                self.unknown_qp += 1
                return []
            s.on_packet(p, now)
        return out

    def poll(self, now: float, budget: int = 64) -> list[tuple[int, list]]:
        out: list = []
        for (peer, _), s in self.senders.items():
            self._out(peer, s.poll(now, budget), out)
        for (peer, _), r in self.receivers.items():
            self._out(peer, r.poll(now), out)
        return out

    def set_local_ports(self, state: int) -> None:
        """Bit p = this NIC's plane-p port is up (from the interfaces' carrier)."""
        if state == self.local_ports:
            return
        self.events("ports", state=state)
        self.local_ports = state
        for s in self.senders.values():
            s.set_local_ports(state)
        for r in self.receivers.values():
            r.local_ports = state

    @property
    def done(self) -> bool:
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
