"""Faults that compose: what each fault holds, what the data plane must look like because of all of
them together, and the least set of changes that gets it there.

Each fault is a *hold* on an element (:class:`FaultState`): a link held down, a switch held down, a
switch blackholed, a direction of a link losing a share of its packets. The data plane's state is a
pure function of every hold at once (:func:`desired`), so faults undo in any order: a ``switch_up``
does not bring back a link that a separate ``link_down`` still holds, and a blackhole, a gray loss
and a link down on the same element each come off on their own.

How each data plane realises a hold (:class:`Desired`):

* ``linux``: a link is up when no hold covers it: not held down and neither end a switch held down
  (a dead Linux switch is all its ports down). Both ends' interfaces follow. A direction's drop
  probability is its gray loss (the port's tc eBPF program draws it).
* ``bmv2``: a switch held down is its process killed, and the host ports cabled to it see their
  carrier go (a dead switch's ports go dark; the host's end of the link is set down). A link between
  switches held down drops every packet both switches send on it (BMv2 loses a port whose interface
  goes down, so a cut never downs a switch's interface); a host link held down is the host's
  interface down (the switch sees its carrier go). A direction's drop probability is 1 while its
  link is held down, else its gray loss.

:class:`FaultInjector` keeps the holds and the last state it applied, and after every change asks
its :class:`FaultBackend` for the elements that differ; a switch that comes back to life gets every
hold on it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import is_host

Link = tuple[str, str]  # (lower-tier end, upper-tier end), as ClosSpec.links() names them


@dataclass
class FaultState:
    """Every fault in force: links and switches held down, switches blackholed, gray loss per
    direction ((switch, peer) -> drop probability of what the switch sends to the peer)."""

    links_down: set[Link] = field(default_factory=set)
    switches_down: set[str] = field(default_factory=set)
    blackholed: set[str] = field(default_factory=set)
    loss: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """True when no fault is held."""
        return not (self.links_down or self.switches_down or self.blackholed or self.loss)


@dataclass(frozen=True)
class Desired:
    """The data plane as the faults in force want it. ``iface_up[(node, peer)]``: the interface of
    ``node`` facing ``peer`` is administratively up; ``drop[(switch, peer)]``: share of what
    ``switch`` sends to ``peer`` it drops (0..1); ``alive``/``blackhole`` per switch."""

    iface_up: dict[tuple[str, str], bool]
    drop: dict[tuple[str, str], float]
    alive: dict[str, bool]
    blackhole: dict[str, bool]


def desired(state: FaultState, plan: AddressPlan, ports_follow: bool) -> Desired:
    """What every element must be under ``state`` (see the module docstring): ``ports_follow``, the
    switches' interfaces follow their links and their own death (linux), else a cut between switches
    is a drop and a dead switch a dead process (bmv2; the backend's ``switch_ports_follow``)."""
    spec = plan.spec
    iface: dict[tuple[str, str], bool] = {}
    drop: dict[tuple[str, str], float] = {}
    for a, b in spec.links():
        held = (a, b) in state.links_down
        if ports_follow:
            up = not held and a not in state.switches_down and b not in state.switches_down
            iface[(a, b)] = iface[(b, a)] = up
            for sw, peer in ((a, b), (b, a)):
                if not is_host(sw):
                    drop[(sw, peer)] = state.loss.get((sw, peer), 0.0)
            continue
        if is_host(a):  # the host's end; the switch keeps its interface
            iface[(a, b)] = not held and b not in state.switches_down
        for sw, peer in ((a, b), (b, a)):
            if not is_host(sw):
                drop[(sw, peer)] = 1.0 if held and not is_host(peer) else state.loss.get((sw, peer), 0.0)
    switches = spec.switches()
    return Desired(iface, drop, {s: s not in state.switches_down for s in switches},
                   {s: s in state.blackholed for s in switches})


class FaultBackend(Protocol):
    """What a data plane does for each kind of change (controller/fabric.py has both).
    ``fresh_on_restart``: a switch brought back to life has lost every fault set on it (bmv2: a
    new process) and is given them again; otherwise (linux) a dead switch keeps them.
    ``switch_ports_follow``: a switch's interfaces follow its links and its own death (linux);
    otherwise a cut between switches is a drop entry and a dead switch a killed process (bmv2)."""

    fresh_on_restart: bool
    switch_ports_follow: bool

    def set_iface(self, node: str, peer: str, up: bool) -> None:
        """Set ``node``'s interface facing ``peer`` administratively up or down."""

    def set_drop(self, switch: str, peer: str, rate: float) -> None:
        """Make ``switch`` drop ``rate`` (0..1) of what it sends to ``peer``."""

    def set_alive(self, switch: str, alive: bool) -> None:
        """Kill switch ``switch`` (``alive`` False) or bring it back."""

    def set_blackhole(self, switch: str, on: bool) -> None:
        """Make ``switch`` forward nothing (``on``) or forward again."""

    def settle(self, now: Desired) -> None:
        """Called once every change of one fault is made, with the state they add up to."""


class FaultInjector:
    """The faults of one running fabric. Each method adds or removes one hold and applies what
    changed. Raises ValueError for a link or switch the fabric does not have."""

    def __init__(self, plan: AddressPlan, backend: FaultBackend) -> None:
        """No holds yet: the healthy state is the one applied."""
        self.plan, self.backend = plan, backend
        self.state = FaultState()
        self.healthy = desired(self.state, plan, backend.switch_ports_follow)
        self.applied = self.healthy
        self._links = set(plan.spec.links())
        self._switches = set(plan.spec.switches())

    # ---- holds ----------------------------------------------------------------------------------
    def link(self, a: str, b: str) -> Link:
        """Link ``a``-``b`` named as ClosSpec.links() names it; ValueError if there is none."""
        if (a, b) in self._links:
            return (a, b)
        if (b, a) in self._links:
            return (b, a)
        raise ValueError(f"no link between {a} and {b}")

    def _switch(self, s: str) -> str:
        if s not in self._switches:
            raise ValueError(f"unknown switch {s!r}; switches are {', '.join(self.plan.spec.switches())}")
        return s

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Hold link ``a``-``b`` down (``up`` False) or release that hold."""
        link = self.link(a, b)
        (self.state.links_down.discard if up else self.state.links_down.add)(link)
        self._apply()

    def set_switch(self, s: str, up: bool) -> None:
        """Hold switch ``s`` down (``up`` False) or release that hold."""
        (self.state.switches_down.discard if up else self.state.switches_down.add)(self._switch(s))
        self._apply()

    def set_blackhole(self, s: str, on: bool) -> None:
        """Blackhole switch ``s`` (``on``) or release that hold."""
        (self.state.blackholed.add if on else self.state.blackholed.discard)(self._switch(s))
        self._apply()

    def set_loss(self, switch: str, peer: str, rate: float) -> None:
        """``switch`` drops ``rate`` (0..1) of what it sends to ``peer``; 0 removes the hold. Raises
        ValueError for a rate outside 0..1 too."""
        self.link(switch, peer)
        self._switch(switch)
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"drop probability {rate}; allowed: 0.0 to 1.0")
        if rate:
            self.state.loss[(switch, peer)] = rate
        else:
            self.state.loss.pop((switch, peer), None)
        self._apply()

    # ---- applying -------------------------------------------------------------------------------
    def _apply(self) -> None:
        new, old, b = desired(self.state, self.plan, self.backend.switch_ports_follow), self.applied, self.backend
        fresh = set()  # switches restarted with none of their faults
        changed = [(key, up) for key, up in new.iface_up.items() if up != old.iface_up[key]]
        # a host's end of a link goes dark first: a NIC loses carrier the moment its switch dies
        # or its cable is cut, before anything else about the failure is done (killing a BMv2
        # process takes a while: meanwhile the host would send into a dead switch)
        for key, up in changed:
            if is_host(key[0]) and not up:
                b.set_iface(*key, up)
        for s, alive in new.alive.items():
            if alive != old.alive[s]:
                b.set_alive(s, alive)
                if alive and b.fresh_on_restart:
                    fresh.add(s)
        for key, up in changed:
            if not is_host(key[0]):
                b.set_iface(*key, up)
        dead = {s for s, alive in new.alive.items() if not alive} if b.fresh_on_restart else set()
        for key, rate in new.drop.items():
            before = self.healthy.drop[key] if key[0] in fresh else old.drop[key]
            if key[0] not in dead and rate != before:
                b.set_drop(*key, rate)
        for s, on in new.blackhole.items():
            before = self.healthy.blackhole[s] if s in fresh else old.blackhole[s]
            if s not in dead and on != before:
                b.set_blackhole(s, on)
        b.settle(new)
        # and comes back last, after its switch is whole again (routes settled): its NIC sees
        # carrier only once the switch can forward what it sends
        for key, up in changed:
            if is_host(key[0]) and up:
                b.set_iface(*key, up)
        # a dead switch that loses its faults on restart has none applied meanwhile
        self.applied = Desired(new.iface_up,
                               {k: (old.drop[k] if k[0] in dead else v) for k, v in new.drop.items()},
                               new.alive,
                               {s: (old.blackhole[s] if s in dead else v) for s, v in new.blackhole.items()})

    def restarted(self, s: str) -> None:
        """Switch ``s`` came back with none of its faults (restarted behind the controller's back):
        give it every hold on it again."""
        if not self.backend.fresh_on_restart or not self.applied.alive[s]:
            return
        for (sw, peer), rate in self.applied.drop.items():
            if sw == s and rate != self.healthy.drop[(sw, peer)]:
                self.backend.set_drop(sw, peer, rate)
        if self.applied.blackhole[s]:
            self.backend.set_blackhole(s, True)

