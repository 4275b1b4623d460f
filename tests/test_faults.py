"""Faults compose (controller/faults.py): with a fake data plane, every pair of overlapping faults on
one element, applied and undone in either order, leaves the data plane as all the faults in force
want it after every step, and healthy at the end. No root needed."""

import itertools

import pytest
from mrclab.controller.faults import FaultInjector, desired
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import load_spec

PLAN = AddressPlan(load_spec())
LINK = ("t0-1-0", "t1-1-0")  # between two switches
HOST_LINK = ("h0", "t0-1-0")
SW = "t0-1-0"  # an end of both links


class FakeDataPlane:
    """Element state as a data plane would hold it. A bmv2 switch loses its drops and blackhole
    when it dies (a new process starts empty); touching a dead bmv2 switch is an error."""

    def __init__(self, dataplane: str) -> None:
        self.fresh_on_restart = dataplane == "bmv2"
        self.switch_ports_follow = dataplane == "linux"
        self.iface: dict = {}
        self.drop: dict = {}
        self.alive: dict = {s: True for s in PLAN.spec.switches()}
        self.blackhole: dict = {s: False for s in PLAN.spec.switches()}
        self.calls: list = []
        self.settled = 0

    def set_iface(self, node, peer, up):
        self.calls.append(("iface", node, peer, up))
        self.iface[(node, peer)] = up

    def _live(self, s):
        if self.fresh_on_restart and not self.alive[s]:
            raise AssertionError(f"{s} is dead: nothing can be written to it")

    def set_drop(self, switch, peer, rate):
        self._live(switch)
        self.calls.append(("drop", switch, peer, rate))
        self.drop[(switch, peer)] = rate

    def set_alive(self, switch, alive):
        self.calls.append(("alive", switch, alive))
        self.alive[switch] = alive
        if alive and self.fresh_on_restart:  # a new process: no fault of the old one survives
            self.blackhole[switch] = False
            for k in [k for k in self.drop if k[0] == switch]:
                del self.drop[k]

    def set_blackhole(self, switch, on):
        self._live(switch)
        self.calls.append(("blackhole", switch, on))
        self.blackhole[switch] = on

    def settle(self, now):
        self.settled += 1

    def matches(self, inj: FaultInjector) -> list[str]:
        """Differences between this data plane and what the faults in force want."""
        want = desired(inj.state, PLAN, inj.backend.switch_ports_follow)
        bad = []
        for k, up in want.iface_up.items():
            if self.iface.get(k, True) != up:
                bad.append(f"interface {k} up={self.iface.get(k, True)}, want {up}")
        for s, alive in want.alive.items():
            if self.alive[s] != alive:
                bad.append(f"{s} alive={self.alive[s]}, want {alive}")
            if alive and self.blackhole[s] != want.blackhole[s]:
                bad.append(f"{s} blackhole={self.blackhole[s]}, want {want.blackhole[s]}")
        for k, rate in want.drop.items():
            if want.alive[k[0]] and self.drop.get(k, 0.0) != rate:
                bad.append(f"drop {k} = {self.drop.get(k, 0.0)}, want {rate}")
        return bad


# (name, on, off, data planes that can do it)
FAULTS = {
    "link_down": (lambda f: f.set_link(*LINK, up=False), lambda f: f.set_link(*LINK, up=True), ("linux", "bmv2")),
    "port_down": (lambda f: f.set_link(*HOST_LINK, up=False), lambda f: f.set_link(*HOST_LINK, up=True),
                  ("linux", "bmv2")),
    "switch_down": (lambda f: f.set_switch(SW, False), lambda f: f.set_switch(SW, True), ("linux", "bmv2")),
    "blackhole": (lambda f: f.set_blackhole(SW, True), lambda f: f.set_blackhole(SW, False), ("linux", "bmv2")),
    "gray_loss": (lambda f: f.set_loss(*LINK, 0.2), lambda f: f.set_loss(*LINK, 0.0), ("linux", "bmv2")),
    "gray_loss_back": (lambda f: f.set_loss(LINK[1], LINK[0], 0.3), lambda f: f.set_loss(LINK[1], LINK[0], 0.0),
                       ("linux", "bmv2")),
}
PAIRS = [(dp, a, b) for dp in ("linux", "bmv2") for a, b in itertools.combinations(FAULTS, 2)
         if dp in FAULTS[a][2] and dp in FAULTS[b][2]]


@pytest.mark.parametrize("dp,a,b", PAIRS, ids=[f"{dp}-{a}+{b}" for dp, a, b in PAIRS])
@pytest.mark.parametrize("undo_first", ["first", "second"])
def test_overlapping_faults_undo_in_any_order(dp, a, b, undo_first):
    fake = FakeDataPlane(dp)
    inj = FaultInjector(PLAN, fake)
    order = [FAULTS[a][0], FAULTS[b][0]] + ([FAULTS[a][1], FAULTS[b][1]] if undo_first == "first"
                                          else [FAULTS[b][1], FAULTS[a][1]])
    for step, fn in enumerate(order):
        fn(inj)
        assert fake.matches(inj) == [], f"after step {step + 1} of {a}+{b} ({undo_first} undone first)"
    assert inj.state.healthy
    assert fake.matches(inj) == []
    assert all(fake.iface.get(k, True) for k in fake.iface) and not any(fake.drop.values())
    assert all(fake.alive.values()) and not any(fake.blackhole.values())


@pytest.mark.parametrize("dp", ["linux", "bmv2"])
def test_switch_up_does_not_bring_back_a_link_another_fault_holds_down(dp):
    fake = FakeDataPlane(dp)
    inj = FaultInjector(PLAN, fake)
    inj.set_link(*LINK, up=False)
    inj.set_switch(SW, False)
    inj.set_switch(SW, True)
    if dp == "linux":
        assert fake.iface[LINK] is False and fake.iface[LINK[::-1]] is False
        assert all(fake.iface[(SW, peer)] for peer in PLAN.ports(SW).values() if peer != LINK[1])
    else:  # the restarted switch is given the link's drop again
        assert fake.drop[(SW, LINK[1])] == 1.0 and fake.drop[(LINK[1], SW)] == 1.0
    inj.set_link(*LINK, up=True)
    assert fake.matches(inj) == [] and inj.state.healthy


@pytest.mark.parametrize("dp", ["linux", "bmv2"])
def test_a_dying_switch_takes_its_hosts_carrier_first_and_gives_it_back_last(dp):
    """A NIC sees its carrier go the moment its T0 dies, before the switch is killed (a BMv2
    process takes a while to go: meanwhile its hosts would send into it), and sees it come back
    only once the switch is alive again."""
    fake = FakeDataPlane(dp)
    inj = FaultInjector(PLAN, fake)
    inj.set_switch(SW, False)
    kinds = [(c[0], c[1]) for c in fake.calls]
    host_down = [i for i, c in enumerate(fake.calls) if c[0] == "iface" and c[1].startswith("h") and not c[3]]
    assert host_down and max(host_down) < kinds.index(("alive", SW)), fake.calls
    fake.calls.clear()
    inj.set_switch(SW, True)
    host_up = [i for i, c in enumerate(fake.calls) if c[0] == "iface" and c[1].startswith("h") and c[3]]
    assert host_up and min(host_up) > [(c[0], c[1]) for c in fake.calls].index(("alive", SW)), fake.calls


def test_restored_link_gives_back_the_gray_loss_it_covered():
    """A link cut over a gray loss drops everything; restored, it drops the gray share again,
    not nothing (the bug this module fixed)."""
    fake = FakeDataPlane("bmv2")
    inj = FaultInjector(PLAN, fake)
    inj.set_loss(*LINK, 0.2)
    inj.set_link(*LINK, up=False)
    assert fake.drop[LINK] == 1.0
    inj.set_link(*LINK, up=True)
    assert fake.drop[LINK] == 0.2


def test_a_bmv2_switch_restarted_behind_the_controllers_back_gets_its_faults_again():
    fake = FakeDataPlane("bmv2")
    inj = FaultInjector(PLAN, fake)
    inj.set_blackhole(SW, True)
    inj.set_loss(*LINK, 0.5)
    fake.set_alive(SW, True)  # the watchdog found it restarted: empty
    assert fake.matches(inj) != []
    inj.restarted(SW)
    assert fake.matches(inj) == []


def test_unknown_elements_are_refused():
    inj = FaultInjector(PLAN, FakeDataPlane("linux"))
    with pytest.raises(ValueError, match="no link between h0 and t1-0-0"):
        inj.set_link("h0", "t1-0-0", up=False)
    with pytest.raises(ValueError, match="unknown switch 't9-0-0'"):
        inj.set_switch("t9-0-0", False)
    with pytest.raises(ValueError, match="allowed: 0.0 to 1.0"):
        inj.set_loss(*LINK, 1.5)
    assert inj.state.healthy


def test_every_fault_kind_says_what_it_does_to_the_fabric():
    """The fault table alone decides what the verdicts read: every event that fails an element has
    exactly one repair that undoes it, every repair undoes a failing event, a loss has a rate, and
    each event that touches the fabric names its elements."""
    from mrclab.experiments.model.faults import EFFECTS, FAULTS, UNDO
    from mrclab.topologies.addressing import AddressPlan
    from mrclab.topologies.spec import load_spec

    plan = AddressPlan(load_spec(None))
    sample = {"link": ("t0-0-0", "t1-0-0"), "links": [("t0-0-0", "t1-0-0")], "switch": "t1-0-0", "host": "h0",
              "plane": 0, "src": "h0", "dst": "h2", "rate": 0.5, "t1": 0}
    for name, k in FAULTS.items():
        assert k.effect in EFFECTS, name
        if k.effect == "fail":
            assert [r for r, x in FAULTS.items() if x.undoes == name] == [UNDO[name]], name
        if k.effect == "repair":
            assert FAULTS[k.undoes].effect == "fail" and set(FAULTS[k.undoes].required) == set(k.required), name
        if k.effect == "loss":
            assert "rate" in k.required, name
        if k.effect != "none":
            els = k.elements(plan, {f: sample[f] for f in (*k.required, *k.optional) if f in sample})
            assert els and all(e[0] in ("switch", "link") for e in els), name


def test_the_timeline_follows_the_fault_table():
    """A fault kind's effect is all FabricTimeline needs: a fail opens, its repair closes, a loss
    at rate 0 closes, an event of effect none fails nothing."""
    from mrclab.experiments.analysis.fabricstate import FabricTimeline
    from mrclab.experiments.model.faults import Fault
    from mrclab.topologies.addressing import AddressPlan
    from mrclab.topologies.spec import load_spec

    plan = AddressPlan(load_spec(None))
    link = ("t0-0-0", "t1-0-0")
    played = [(1.0, Fault(1.0, "blackhole_on", {"switch": "t1-0-0"})),
              (2.0, Fault(2.0, "blackhole_off", {"switch": "t1-0-0"})),
              (3.0, Fault(3.0, "gray_loss", {"link": link, "rate": 0.2})),
              (4.0, Fault(4.0, "gray_loss", {"link": link, "rate": 0})),
              (5.0, Fault(5.0, "random_loss", {"rate": 0.01}))]
    tl = FabricTimeline.from_played(plan, played)
    assert tl.failed(("switch", "t1-0-0"), 1.5, 1.6) and not tl.failed(("switch", "t1-0-0"), 2.5, 9)
    assert tl.failed(("link", *link), 3.5, 3.6) and not tl.failed(("link", *link), 4.5, 9)
    assert set(tl.intervals) == {("switch", "t1-0-0"), ("link", *link)}


def test_the_watchdog_outlives_a_switch_that_is_still_starting():
    """A bmv2 switch restarted behind the controller's back may refuse the first session the
    watchdog opens (still starting): the watchdog says so and asks again, until the switch takes
    its pipeline. (Under a loaded machine its thread once died on that refusal, and the switch was
    never reprogrammed.)"""
    import threading
    import time as _time
    from types import SimpleNamespace

    from mrclab.controller import fabric as F

    class Starting:
        def __init__(self):
            self.asked = 0

        def has_pipeline(self):
            self.asked += 1
            if self.asked <= 2:
                raise RuntimeError("no P4Runtime session: still starting")
            return False

    fab = F.Fabric.__new__(F.Fabric)
    fab.p4 = {"t1-0-1": Starting()}
    fab.faults = SimpleNamespace(applied=SimpleNamespace(alive={"t1-0-1": True}), restarted=lambda n: None)
    fab.plane = SimpleNamespace(reprogram=lambda f, n: None)
    fab.routes = {"t1-0-1": SimpleNamespace(n_entries=3)}
    fab._stop, fab._lock, fab.reprogrammed, said = threading.Event(), threading.RLock(), [], []
    fab.progress = said.append
    t = threading.Thread(target=fab._watchdog, daemon=True)
    t.start()
    deadline = _time.monotonic() + 10
    while not fab.reprogrammed and _time.monotonic() < deadline:
        _time.sleep(0.05)
    fab._stop.set()
    t.join(timeout=5)
    assert [n for _, n in fab.reprogrammed] == ["t1-0-1"], said
    assert sum("not reprogrammed yet" in m for m in said) == 2, said


def test_the_watchdog_leaves_a_switch_killed_while_it_waited_for_the_lock_alone():
    """A fault that kills a switch holds the fabric's lock; a watchdog pass that read the switch
    alive just before waits for that lock and must not then reconnect to the dead switch: a failed
    connect leaves gRPC's subchannel to that socket backing off, and the restart's own connect
    failed after it (quickstart on bmv2 over servers, the suite, 2026-12-06)."""
    import threading
    import time as _time
    from types import SimpleNamespace

    from mrclab.controller import dataplanes
    from mrclab.controller import fabric as F

    asked = []
    fab = F.Fabric.__new__(F.Fabric)
    fab.p4 = {"t1-0-0": SimpleNamespace(has_pipeline=lambda: asked.append(1) or False)}
    alive = {"t1-0-0": True}
    fab.faults = SimpleNamespace(applied=SimpleNamespace(alive=alive), restarted=lambda n: None)
    fab.plane = SimpleNamespace(reprogram=lambda f, n: asked.append("reprogram"))
    fab.routes = {"t1-0-0": SimpleNamespace(n_entries=3)}
    fab._stop, fab._lock, fab.reprogrammed, said = threading.Event(), threading.RLock(), [], []
    fab.progress = said.append
    fab._lock.acquire()  # the kill's fault holds the lock ...
    t = threading.Thread(target=fab._watchdog, daemon=True)
    t.start()
    _time.sleep(dataplanes.control_period_s(1) + 0.3)  # ... while the pass comes to the switch
    alive["t1-0-0"] = False  # killed
    fab._lock.release()
    _time.sleep(0.3)
    fab._stop.set()
    t.join(timeout=5)
    assert asked == [], (asked, said)
