"""A running fabric: the emulation, programmed from the route plan, verified, with faults to inject.

    with Fabric(load_spec(), "linux", progress=print) as fab:
        fab.set_link("t0-0-0", "t1-0-1", up=False)
        ...

Data flow (DESIGN.md): ClosSpec -> AddressPlan -> RoutePlan -> (P4Runtime | seg6) -> running fabric.
``start()`` times each phase into ``timings`` (seconds): ``build_s`` (namespaces, links, switch
processes), ``compile_s``, ``pipeline_s``, ``routes_s``, ``verify_s``, ``total_s``.
On bmv2 a watchdog thread checks every switch once a second and gives a switch that lost its
pipeline (it was restarted under the controller) its pipeline and entries again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller import seg6
from controller.routeplan import RoutePlan, route_plan
from topologies.addressing import AddressPlan
from topologies.emulation import Bmv2Switch, Emulation, EmulationError, default_dataplane
from topologies.spec import ClosSpec, parse_switch

#: Faults each data plane can inject (DESIGN.md: the kernel here has no netem/RED, so gray loss,
#: ECN and trimming are bmv2-only).
FEATURES = {
    "bmv2": {"link", "switch", "blackhole", "gray_loss"},
    "linux": {"link", "switch", "blackhole"},
}


class FabricError(RuntimeError):
    """A fault or query the fabric cannot do; the message names what and what is allowed."""


class Fabric:
    """Emulation + controller for one fabric. See module docstring."""

    def __init__(
        self,
        spec: ClosSpec,
        dataplane: str | None = None,
        *,
        debug: bool = False,
        progress: Callable[[str], None] | None = None,
        watchdog: bool = True,
    ) -> None:
        self.spec = spec
        self.plan = AddressPlan(spec)
        self.routes: RoutePlan = route_plan(self.plan)
        self.dataplane = dataplane or default_dataplane()
        self.progress = progress or (lambda _m: None)
        self.emu = Emulation(spec, self.dataplane, debug=debug, progress=self.progress)
        self.p4: dict = {}  # switch -> P4Switch (bmv2)
        self.timings: dict[str, float] = {}
        self.entries_written = 0
        self._watchdog_on = watchdog
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.down_switches: set[str] = set()
        self.reprogrammed: list[tuple[float, str]] = []

    # ---- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.monotonic()
        try:
            self.emu.start()
            self.timings["build_s"] = time.monotonic() - t0
            if self.dataplane == "bmv2":
                self._start_bmv2()
            else:
                t = time.monotonic()
                self.progress(f"writing {self.routes.n_entries} seg6 entries")
                for e in self.routes.switches:
                    self.entries_written += seg6.apply(self.emu.netns(e.switch), e, self.routes.block)
                self.timings["routes_s"] = time.monotonic() - t
                t = time.monotonic()
                self.verify()
                self.timings["verify_s"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["total_s"] = time.monotonic() - t0
        self.progress(f"fabric up and verified on {self.dataplane} in {self.timings['total_s']:.1f} s")

    def _start_bmv2(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from controller.compiler import compile_p4
        from controller.p4runtime import P4Info, P4Switch
        from p4src import MRCLAB_P4

        t = time.monotonic()
        prog = compile_p4(MRCLAB_P4)
        self.timings["compile_s"] = time.monotonic() - t
        info = P4Info(prog.p4info)
        for sw in self.emu.switches():
            self.p4[sw.name] = P4Switch(sw.name, sw.device_id, sw.grpc_addr, info, prog.bmv2_json)
        self.progress(f"pushing the pipeline to {len(self.p4)} switches")
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s: (s.connect(), s.push_pipeline()), self.p4.values()))
        self.timings["pipeline_s"] = time.monotonic() - t
        self.progress(f"writing {self.routes.n_entries} table entries")
        t = time.monotonic()
        for e in self.routes.switches:
            self.entries_written += self.p4[e.switch].apply(e)
        self.timings["routes_s"] = time.monotonic() - t
        t = time.monotonic()
        self.verify()
        self.timings["verify_s"] = time.monotonic() - t
        if self._watchdog_on:
            self._thread = threading.Thread(target=self._watchdog, name="mrclab-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Tear everything down (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for s in self.p4.values():
            s.close()
        self.p4.clear()
        self.emu.stop()

    def verify(self) -> None:
        """Read every switch back and compare with the route plan; raises on any difference."""
        for e in self.routes.switches:
            if e.switch in self.down_switches:
                continue
            if self.dataplane == "bmv2":
                self.p4[e.switch].verify(e)
            else:
                seg6.verify(self.emu.netns(e.switch), e, self.routes.block)

    def _watchdog(self) -> None:
        while not self._stop.wait(1.0):
            for name, sw in list(self.p4.items()):
                if self._stop.is_set() or name in self.down_switches:
                    continue
                with self._lock:
                    if not sw.has_pipeline():
                        try:
                            self.reprogram(name)
                        except Exception as e:  # the switch may still be starting
                            self.progress(f"watchdog: {name} not reprogrammed yet ({e})")

    def reprogram(self, name: str) -> None:
        """Reconnect to a (restarted) bmv2 switch and give it its pipeline and entries again."""
        with self._lock:
            sw = self.p4[name]
            sw.connect()
            sw.push_pipeline()
            sw.apply(self.routes[name])
            sw.verify(self.routes[name])
            self.reprogrammed.append((time.monotonic(), name))
            self.progress(f"{name}: pipeline and {self.routes[name].n_entries} entries installed again")

    # ---- faults --------------------------------------------------------------------------------
    def supports(self, feature: str) -> bool:
        return feature in FEATURES[self.dataplane]

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Cut (``up=False``) or restore the cable between nodes ``a`` and ``b``.

        On linux the kernel flushes the routes of a port set down; a switch's static routes are
        configuration that outlives a link flap, so restoring a link re-applies (a diff) the
        entries of its switch ends.
        """
        if self.dataplane == "bmv2":
            self._bmv2_link(a, b, up)
            return
        self.emu.set_link(a, b, up)
        if up and self.dataplane == "linux":
            for sw in (a, b):
                if not sw.startswith("h") and sw not in self.down_switches:
                    seg6.apply(self.emu.netns(sw), self.routes[sw], self.routes.block)

    def _bmv2_link(self, a: str, b: str, up: bool) -> None:
        """BMv2 loses a port whose interface is set administratively down (its packet I/O on that
        port does not come back), so on bmv2 a cut never downs a switch's interface: a host link is
        cut at the host's end (the switch sees its carrier go), a link between two switches by
        dropping everything both switches send on it (the switches' own view of a dead cable:
        nothing arrives). A restored link clears that drop, and with it any gray loss on the port."""
        if a.startswith("h") or b.startswith("h"):
            host = a if a.startswith("h") else b
            self.emu.set_link(a, b, up, ends=(host,))
            return
        for sw, peer in ((a, b), (b, a)):
            self._check_switch(sw)
            with self._lock:
                self.p4[sw].set_port_loss(self.plan.port_to(sw, peer), 0.0 if up else 1.0)

    def blackhole(self, switch: str, on: bool) -> None:
        """The switch stays up (answers its controller) but forwards nothing."""
        self._check_switch(switch)
        if self.dataplane == "bmv2":
            with self._lock:
                self.p4[switch].set_blackhole(on)
        else:
            seg6.set_blackhole(self.emu.netns(switch), on)

    def switch_down(self, switch: str) -> None:
        """The switch dies: bmv2 process killed; linux: every port down (its links go dark)."""
        self._check_switch(switch)
        self.down_switches.add(switch)
        if self.dataplane == "bmv2":
            with self._lock:
                self.p4[switch].close()
                node = self.emu.node(switch)
                assert isinstance(node, Bmv2Switch)
                node.kill()
        else:
            for peer in self.plan.ports(switch).values():
                self.emu.set_link(switch, peer, up=False)

    def switch_up(self, switch: str) -> None:
        """Restart the switch and reprogram it from the route plan."""
        self._check_switch(switch)
        if self.dataplane == "bmv2":
            self.emu.restart_switch(switch)
            self.reprogram(switch)
        else:
            for peer in self.plan.ports(switch).values():
                self.emu.set_link(switch, peer, up=True)
                if not peer.startswith("h") and peer not in self.down_switches:
                    seg6.apply(self.emu.netns(peer), self.routes[peer], self.routes.block)
            e = self.routes[switch]
            seg6.apply(self.emu.netns(switch), e, self.routes.block)
            seg6.verify(self.emu.netns(switch), e, self.routes.block)
        self.down_switches.discard(switch)

    def link_loss(self, a: str, b: str, rate: float, salt: int = 0) -> None:
        """Gray failure: drop ``rate`` of the packets each switch end of link ``a``-``b`` sends on it."""
        for sw in (n for n in (a, b) if not n.startswith("h")):
            self.port_loss(sw, b if sw == a else a, rate, salt)

    def port_loss(self, switch: str, peer: str, rate: float, salt: int = 0) -> None:
        """Drop ``rate`` (0..1) of the packets ``switch`` sends towards ``peer`` (one direction)."""
        if not self.supports("gray_loss"):
            raise FabricError(f"gray loss needs the bmv2 data plane; this fabric runs {self.dataplane}")
        self._check_switch(switch)
        with self._lock:
            self.p4[switch].set_port_loss(self.plan.port_to(switch, peer), rate, salt)

    def switch_packets(self, switches: list[str] | None = None) -> dict[str, int]:
        """Switch -> packets it has forwarded (bmv2: ``port_tx``; linux: its uN SID's counter)."""
        names = switches or self.spec.switches()
        if self.dataplane == "bmv2":
            with self._lock:
                return {s: self.p4[s].forwarded_packets() for s in names}
        return {s: seg6.sid_packets(self.emu.netns(s), self.routes[s], self.routes.block) for s in names}

    def _check_switch(self, name: str) -> None:
        try:
            parse_switch(name)
            self.plan.switch_usid(name)
        except Exception:
            raise FabricError(f"unknown switch {name!r}; switches are {', '.join(self.spec.switches())}") from None

    def netns(self, node: str) -> str:
        return self.emu.netns(node)


__all__ = ["Fabric", "FabricError", "FEATURES", "EmulationError"]
