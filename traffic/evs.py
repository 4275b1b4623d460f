"""The EV set of one QP and the health of each EV (docs/mrc.md, "EV health").

States: GOOD (in rotation), SKIP (skip once: ECN or a trim, then GOOD), ASSUMED_BAD (an untrimmed
loss or a timeout: retired, probed in the background), DENIED (operator denylist: never used, never
probed). An *active* set of ``evs_per_plane`` EVs per plane carries data in rotation, planes
interleaved; a *backup* set of ``backup_per_plane`` per plane waits. A retired active EV is replaced
at once by a GOOD backup **of the same plane**, so planes stay equally loaded. A retired EV that
answers ``probe_successes`` probes in a row becomes GOOD again and joins the backups.

EVs are drawn per plane at random (seeded) among that plane's paths, stratified: a random
permutation of the plane's paths is cycled, so every path gets an EV before any gets two; random
entropy bits keep EVs distinct when a small fabric has fewer paths than EVs
(topologies.addressing: EV layout).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from mrclab.topologies.addressing import AddressPlan, ev_plane, ev_t1, make_ev


class EvState(StrEnum):
    """The health of one EV (OCP MRC API's EV states; SKIP is the transport's own "skip once")."""

    GOOD = "GOOD"
    SKIP = "SKIP"
    ASSUMED_BAD = "ASSUMED_BAD"
    DENIED = "DENIED"


GOOD, SKIP, ASSUMED_BAD, DENIED = EvState.GOOD, EvState.SKIP, EvState.ASSUMED_BAD, EvState.DENIED


@dataclass
class EvInfo:
    """One EV of a QP: its plane and state, whether it is in the active set, probes answered in a
    row (``probe_ok``), data packets and payload bytes sent on it, times it was retired
    (``losses``), retransmissions sent on it, state changes, and its SKIP hold."""

    ev: int
    plane: int
    state: EvState = GOOD
    active: bool = False
    probe_ok: int = 0
    packets: int = 0
    bytes: int = 0
    losses: int = 0
    retransmits: int = 0
    changes: int = 0
    skip_until: float = 0.0  # SKIP: passed over until this time (seconds) ...
    skip_pass: bool = False  # ... and at least once


@dataclass
class EvSet:
    """Active + backup EVs of one QP. ``on_change(ev, old, new, reason, age_s)`` hears every
    transition (``age_s``: a retirement's, see :meth:`retire`; None for every other)."""

    evs: dict[int, EvInfo]
    planes: int
    evs_per_plane: int
    on_change: Callable[[int, EvState, EvState, str, float | None], None] = field(default=lambda *a: None)
    #: the rotation (active EVs of the planes that are up, planes interleaved) and the index of the
    #: next in turn; a sender's hot loop may take GOOD EVs from it itself and write the cursor back
    rotation: list[int] = field(default_factory=list)
    cursor: int = 0
    planes_down: set[int] = field(default_factory=set)
    _fb: int = -1

    @classmethod
    def draw(cls, plan: AddressPlan, src: str, dst: str, rng: random.Random, evs_per_plane: int,
             backup_per_plane: int, denylist: frozenset[int] = frozenset(), on_change=None) -> EvSet:
        """Draw ``evs_per_plane`` active and ``backup_per_plane`` backup EVs per plane."""
        paths = plan.paths(src, dst)
        evs: dict[int, EvInfo] = {}
        for plane in range(plan.spec.planes):
            in_plane = [p for p in paths if p.plane == plane]
            want = evs_per_plane + backup_per_plane
            chosen: list[int] = []
            # explicitly denied EVs of this pair are part of the set (and stay DENIED)
            for ev in sorted(denylist):
                if ev_plane(ev) == plane and ev not in evs:
                    evs[ev] = EvInfo(ev, plane, state=DENIED)
            order = rng.sample(in_plane, len(in_plane))  # random, but every path before any repeats
            while len(chosen) < want:
                p = order[len(chosen) % len(order)]
                ev = make_ev(plane, p.t1 or 0, rng.randrange(1, 1 << 16))
                if ev not in evs and ev not in chosen:
                    chosen.append(ev)
            for k, ev in enumerate(chosen):
                evs[ev] = EvInfo(ev, plane, active=k < evs_per_plane)
        # a denied path (entropy 0 or not) also denies every drawn EV that names the same path
        denied_paths = {(ev_plane(d), ev_t1(d)) for d in denylist}
        for e in evs.values():
            if (e.plane, ev_t1(e.ev)) in denied_paths:
                e.state, e.active = DENIED, False
        s = cls(evs=evs, planes=plan.spec.planes, evs_per_plane=evs_per_plane,
                on_change=on_change or (lambda *a: None))
        for plane in range(s.planes):
            s._refill(plane)
        s._rebuild()
        return s

    @classmethod
    def pinned(cls, plan: AddressPlan, ev: int, on_change=None) -> EvSet:
        """A set of one EV and no backups: a flow held to one path (paper fig. 14's second flow)."""
        s = cls(evs={ev: EvInfo(ev, ev_plane(ev), active=True)}, planes=plan.spec.planes, evs_per_plane=1,
                on_change=on_change or (lambda *a: None))
        s._rebuild()
        return s

    # ---- rotation -----------------------------------------------------------------------------
    def _rebuild(self) -> None:
        per_plane = [[e.ev for e in self.evs.values() if e.active and e.plane == p and p not in self.planes_down]
                     for p in range(self.planes)]
        rot = []
        for k in range(max((len(x) for x in per_plane), default=0)):
            for x in per_plane:
                if k < len(x):
                    rot.append(x[k])
        self.rotation = rot
        self.cursor = self.cursor % len(rot) if rot else 0

    def next_ev(self, avoid: int | None = None, now: float = 0.0) -> int | None:
        """The next EV to carry a packet at time ``now``: passing over SKIP EVs (at least once, and
        until their hold ends) and ``avoid`` when possible."""
        rot = self.rotation
        n = len(rot)
        if n:  # the usual case, a GOOD EV next in turn: one look, no loop (the sender's hot path)
            i = self.cursor
            ev = rot[i]
            if self.evs[ev].state is GOOD and (ev != avoid or n == 1):
                self.cursor = i + 1 if i + 1 < n else 0
                return ev
        for _ in range(2 * n):
            ev = self.rotation[self.cursor]
            self.cursor = (self.cursor + 1) % n
            e = self.evs[ev]
            if e.state is SKIP:
                if e.skip_pass or now < e.skip_until:
                    e.skip_pass = False
                    continue
                self._set(e, GOOD, "skip over")
            if e.state is not GOOD or (ev == avoid and n > 1):
                continue
            return ev
        return self._fallback()

    def _fallback(self) -> int | None:
        """No GOOD active EV: keep the QP alive on a GOOD backup, else on a skipped EV, else on a
        retired EV of an up plane (never a DENIED one), round robin, until probes bring EVs back."""
        up = [e for e in self.evs.values() if e.plane not in self.planes_down]
        cands = [e for e in up if e.state is GOOD] or [e for e in up if e.state is SKIP] or \
            [e for e in up if e.state is ASSUMED_BAD]
        if not cands:
            return None
        self._fb = (self._fb + 1) % len(cands)
        return cands[self._fb].ev

    def active(self) -> list[int]:
        """The rotation: the active EVs of the planes that are up, planes interleaved."""
        return list(self.rotation)

    def plane_shares(self) -> list[int]:
        """Active, usable EVs per plane."""
        out = [0] * self.planes
        for ev in self.rotation:
            if self.evs[ev].state in (GOOD, SKIP):
                out[self.evs[ev].plane] += 1
        return out

    # ---- health -------------------------------------------------------------------------------
    def _set(self, e: EvInfo, new: EvState, reason: str, age_s: float | None = None) -> None:
        if e.state != new:
            old, e.state = e.state, new
            e.changes += 1
            self.on_change(e.ev, old, new, reason, age_s)

    def _refill(self, plane: int) -> None:
        """Top the plane's active set up from its GOOD backups: first on a path (T1) none of whose
        EVs is retired (a path that just lost one is likely to lose the next: a dead T1 takes all
        of them), then on the path with the fewest active EVs, so one retirement does not leave a
        path of the plane unused."""
        live = [e for e in self.evs.values() if e.active and e.plane == plane and e.state in (GOOD, SKIP)]
        spare = [e for e in self.evs.values() if e.plane == plane and not e.active and e.state == GOOD]
        suspect = {ev_t1(e.ev) for e in self.evs.values() if e.plane == plane and e.state == ASSUMED_BAD}
        while len(live) < self.evs_per_plane and spare:
            use: dict[int, int] = {}  # T1 -> live EVs on it
            for e in live:
                use[ev_t1(e.ev)] = use.get(ev_t1(e.ev), 0) + 1
            best = min(spare, key=lambda e: (ev_t1(e.ev) in suspect, use.get(ev_t1(e.ev), 0)))
            spare.remove(best)
            best.active = True
            live.append(best)

    def skip(self, ev: int, reason: str, until: float = 0.0) -> None:
        """Pass ``ev`` over at least once and until time ``until`` (an ECN echo or a trim: the path
        is congested, not broken). A GOOD EV becomes SKIP; a SKIP EV's hold is extended."""
        e = self.evs.get(ev)
        if e is None or e.state not in (GOOD, SKIP):
            return
        e.skip_until = max(e.skip_until, until)
        e.skip_pass = True
        self._set(e, SKIP, reason)

    def retire(self, ev: int, reason: str, age_s: float | None = None) -> bool:
        """An untrimmed loss or timeout on ``ev``: ASSUMED_BAD, replaced by a same-plane backup.
        ``age_s``: how long before now the packet whose loss retires it was sent (s), so that the
        retirement says which span of time it answers (its event carries it). Returns True when the
        EV was retired now (False if already retired, denied, unknown, or of a plane that is down)."""
        e = self.evs.get(ev)
        if e is None or e.state in (ASSUMED_BAD, DENIED) or e.plane in self.planes_down:
            return False
        e.losses += 1
        e.active = False
        e.probe_ok = 0
        self._set(e, ASSUMED_BAD, reason, age_s)
        self._refill(e.plane)
        self._rebuild()
        return True

    def probe_result(self, ev: int, ok: bool, needed: int) -> None:
        """A probe on a retired EV answered (ok) or timed out; ``needed`` successes revive it."""
        e = self.evs.get(ev)
        if e is None or e.state != ASSUMED_BAD:
            return
        e.probe_ok = e.probe_ok + 1 if ok else 0
        if e.probe_ok >= needed:
            self._set(e, GOOD, f"{needed} probes answered")
            self._refill(e.plane)
            self._rebuild()

    def retired(self) -> list[int]:
        """Every ASSUMED_BAD EV: the ones to probe."""
        return [e.ev for e in self.evs.values() if e.state == ASSUMED_BAD]

    def set_plane_down(self, plane: int, down: bool) -> None:
        """Local port or the peer's port of ``plane`` down: its EVs leave the rotation (their health
        is not blamed for losses on a dead port), and come back with it."""
        if down:
            self.planes_down.add(plane)
        else:
            self.planes_down.discard(plane)
        self._rebuild()
