"""A running fabric: the emulation, programmed from the route plan, verified, with faults to inject.

    with Fabric(load_spec(), "linux", progress=print) as fab:
        fab.set_link("t0-0-0", "t1-0-1", up=False)
        ...

Data flow (docs/design.md): ClosSpec -> AddressPlan -> RoutePlan -> (P4Runtime | IPv6 routes + tc eBPF uN) -> running
fabric. ``start()`` compiles the P4 program first (bmv2: nothing is built when p4c refuses it), then
times each phase into ``timings`` (seconds): ``compile_s``, ``build_s`` (namespaces, links, switch
processes), ``pipeline_s``, ``routes_s``, ``verify_s``, ``total_s``.

Faults go through a :class:`~controller.faults.FaultInjector`, so they compose (see there). On
bmv2 a watchdog thread checks every switch once a second (one at a time; 16 a second at most)
and gives a switch that lost its pipeline (restarted behind the controller's back) its pipeline,
entries and faults again. Every method that touches switches holds the fabric's lock;
:meth:`exclusive` lends it to callers that talk to switches themselves (the benchmarks).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Collection, Iterator

from mrclab.controller import bpf
from mrclab.controller.bpf import PortConfig
from mrclab.controller.dataplanes import DataPlane, FabricError, control_period_s
from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.controller.faults import FaultInjector
from mrclab.controller.pfc import PauseAgent
from mrclab.controller.queues import DEFAULT_FRAME_BYTES, PortQueue, QueueSettings, queue_plan
from mrclab.controller.routeplan import RoutePlan, route_plan
from mrclab.controller.thrift import THRIFT_PORT, ThriftError, gap_us
from mrclab.controller.thrift import session as thrift_session
from mrclab.emulation import kernel
from mrclab.emulation.network import Emulation, nic_queue_bytes
from mrclab.emulation.placement import Placement
from mrclab.emulation.servers import Ssh
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import ClosSpec, is_host


class Fabric:
    """Emulation + controller for one fabric. See module docstring. ``loss_salt`` seeds the
    switches' loss draws (a scenario passes its seed, so a run repeats)."""

    def __init__(self, spec: ClosSpec, dataplane: str | DataPlane | None = None, *, debug: bool = False,
                 progress: Callable[[str], None] | None = None, watchdog: bool = True, loss_salt: int = 0,
                 queues: QueueSettings = QueueSettings(), frame_bytes: int = DEFAULT_FRAME_BYTES,
                 bmv2_build: str | None = None, placement: Placement | None = None,
                 ssh: Ssh | None = None) -> None:
        """Plan the fabric (address, route and queue plans) and its emulation; builds nothing until
        :meth:`start`. ``dataplane``: a :class:`~controller.dataplanes.DataPlane` or its name (None:
        :func:`~controller.dataplanes.dataplane` chooses);
        ``watchdog``: on bmv2, give a switch that lost its pipeline everything again; ``queues``,
        ``frame_bytes``: the queue plan's settings and frame size (controller/queues.py), used
        where this machine gives the data plane switch queues; ``bmv2_build``: "forwarding" or
        "logging" (emulation/nodes.py bmv2_binary; None: as ``debug`` says); ``placement``, ``ssh``:
        planes on other servers (emulation/cluster.py; what the data plane lacks there:
        its ``remote_missing``). Raises as :class:`~emulation.network.Emulation` does."""
        self.spec = spec
        self.plan = AddressPlan(spec)
        self.routes: RoutePlan = route_plan(self.plan)
        #: the data plane (controller/dataplanes.py); :attr:`dataplane` is its name
        self.plane = resolve(dataplane)
        self.dataplane = self.plane.name
        self.progress = progress or (lambda _m: None)
        self.placement = placement
        self.congestion = "congestion" in self.plane.available(remote=placement is not None)
        #: every switch port's rate, depth and thresholds (controller/queues.py), where switches queue
        self.queues: dict[tuple[str, int], PortQueue] = queue_plan(self.plan, queues, frame_bytes) \
            if self.congestion else {}
        #: a full data frame (bytes): the queue plan's packet, the linux queues' unit of bytes
        self.frame_bytes = frame_bytes
        #: why the hosts' NIC ports are not watched against their shapers' schedule (None: they are)
        self.nic_watch_missing = self._nic_watch_missing()
        self.emu = Emulation(spec, self.plane, debug=debug, progress=self.progress, bmv2_build=bmv2_build,
                             thrift_port=THRIFT_PORT if self.congestion else None, switch_queues=self.congestion,
                             placement=placement, ssh=ssh, frame_bytes=frame_bytes,
                             nic_slack_bytes=0 if self.nic_watch_missing else bpf.NIC_SLACK_FRAMES * frame_bytes)
        self.thrift: dict = {}  # switch -> SwitchThrift (bmv2 with queues)
        self.bpf: dict = {}  # switch -> SwitchBpf or RemoteSwitchBpf (linux: uN, and queues where it has them)
        self.queue_agents: dict = {}  # server -> its QueueAgent (linux with queues, planes on servers)
        self.pfc: PauseAgent | None = None  # with lossless (PFC) queues
        #: (switch, port) -> gray loss in force (linux; bmv2 keeps it in its table entries)
        self.port_loss_now: dict[tuple[str, int], float] = {}
        self.p4: dict = {}  # switch -> P4Switch (bmv2)
        #: the drain watch on the hosts' NIC ports (controller/bpf.py NicWatch), where their links are
        #: shaped and this machine loads the tc eBPF program; None otherwise
        self.nic_watch: bpf.NicWatch | None = None
        self._netlink: dict[str, kernel.QdiscBacklog] = {}  # linux switch here -> netlink inside it
        self.timings: dict[str, float] = {}
        self.loss_salt = loss_salt
        self._watchdog_on = watchdog
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.faults = FaultInjector(self.plan, self.plane.faults(self))
        self.reprogrammed: list[tuple[float, str]] = []

    # ---- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        """Start the fabric (:meth:`start`) and return it."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        """Tear the fabric down (:meth:`stop`), however the block ended."""
        self.stop()

    def start(self) -> None:
        """Compile (p4c on bmv2, clang for linux's queue program: before anything is built), build the
        emulation, program every switch (bmv2: pipeline, table entries and, with Thrift, egress
        queues; linux: IPv6 routes, the uN program and, where switches queue, htb and the program on every
        port), read every switch back, and start the bmv2 watchdog; each phase is timed into
        ``timings`` (s, see the module docstring). On any failure everything built is torn down
        and the error (CompileError, BpfError, FabricError, P4RuntimeError, RouteError,
        EmulationError, ...) propagates."""
        t0 = time.monotonic()
        try:
            compiled = self.plane.compile(self)  # before anything is built: a refused program leaves nothing
            if compiled is not None:
                self.timings["compile_s"] = time.monotonic() - t0
            t = time.monotonic()
            self.emu.start()
            self.timings["build_s"] = time.monotonic() - t
            self.plane.program(self, compiled)
            self._watch_nics()
            t = time.monotonic()
            self.verify()
            self.timings["verify_s"] = time.monotonic() - t
            if self.plane.watchdog and self._watchdog_on:
                self._thread = threading.Thread(target=self._watchdog, name="mrclab-watchdog", daemon=True)
                self._thread.start()
        except BaseException:
            self.stop()
            raise
        self.timings["total_s"] = time.monotonic() - t0
        self.progress(f"fabric up and verified on {self.dataplane} in {self.timings['total_s']:.1f} s")

    def start_pfc(self, levers: list[tuple[str, str]]) -> None:
        """Install the pause levers (bmv2: (namespace, tc line) each) and start the pause agent (the data
        plane's :meth:`~controller.dataplanes.DataPlane.program` calls it where queues are lossless)."""
        by_ns: dict[str, list[str]] = {}
        for ns, line in levers:
            by_ns.setdefault(ns, []).append(line)
        for ns, lines in by_ns.items():
            try:
                kernel.tc_batch(ns, lines)
            except kernel.KernelError as e:
                raise FabricError(f"{ns}: tc refused the PFC pause levers: {e}") from None
        self.pfc = PauseAgent(self)
        self.pfc.start()
        self.progress(f"PFC: pause agent on {len(self.pfc.watched)} lossless ports")

    def _nic_watch_missing(self) -> str | None:
        """Why the drain watch cannot watch the hosts' NIC ports (None: it can): their links are
        unshaped, a port is lossless (PFC pauses a host's tbf on purpose) or the tc eBPF program
        does not load here (clang, libbpf)."""
        if self.spec.link.bandwidth_mbps <= 0:
            return "their links are unshaped"
        if any(q.lossless for q in self.queues.values()):
            return "PFC pauses them"
        return bpf.bpf_missing()

    def _watch_nics(self) -> None:
        """The drain watch on every host NIC port (:class:`~controller.bpf.NicWatch`), or a line
        saying why not (:attr:`nic_watch_missing`)."""
        if self.nic_watch_missing:
            self.progress(f"host NIC ports not watched against their shapers' schedule: {self.nic_watch_missing}")
            return
        hosts = {h: (self.emu.netns(h), [self.plan.host_intf(h, p) for p in range(self.spec.planes)])
                 for h in self.spec.hosts()}
        self.nic_watch = bpf.NicWatch(hosts, bpf.compile_bpf(), self.spec.link.bandwidth_mbps, self.frame_bytes,
                                      nic_queue_bytes(self.spec.link, self.emu.frame_bytes))

    def port_config(self, switch: str, port: int) -> PortConfig:
        """The tc eBPF program's settings for one port (linux): its queue plan and gray loss."""
        q = self.queues[(switch, port)]
        return PortConfig(q.rate_pps, q.ecn_k, q.trim_t, q.q_limit, self.port_loss_now.get((switch, port), 0.0),
                          self.loss_salt, q.lossless, port, self.frame_bytes,
                          0.0 if q.lossless else q.rate_mbps)  # a paused port drains nothing on purpose

    def port_queues(self, switch: str) -> dict[int, PortQueue]:
        """Port -> queue plan of ``switch`` (empty where switches do not queue)."""
        return {port: q for (sw, port), q in self.queues.items() if sw == switch}

    def stop(self) -> None:
        """Tear everything down (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.pfc is not None:
            self.pfc.stop()
            if self.pfc.errors:  # a turn that failed is retried the next, but say it happened
                self.progress(f"PFC: {len(self.pfc.errors)} pause agent turns failed; first: {self.pfc.errors[0]}")
            self.pfc = None
        for s in self.p4.values():
            s.close()
        if self.nic_watch is not None:
            self.nic_watch.close()
            self.nic_watch = None
        for nl in self._netlink.values():
            nl.close()
        self._netlink = {}
        self.p4.clear()
        for th in self.thrift.values():
            th.close()
        self.thrift.clear()
        for b in self.bpf.values():
            b.close()
        self.bpf.clear()
        for agent in self.queue_agents.values():
            agent.close()
        self.queue_agents.clear()
        self.emu.stop()

    def verify(self) -> None:
        """Read every live switch back and compare with the route plan; raises on any difference."""
        for e in self.routes.switches:
            if not self.faults.applied.alive[e.switch]:
                continue
            self.plane.verify(self, e)

    def _watchdog(self) -> None:
        # One switch at a time, spread over the period, not all n at once: a burst of n Reads
        # wakes n switches' gRPC threads together, and on a busy machine the switches forwarding
        # packets then wait behind them (a run's fidelity monitor counts that as starvation).
        while not self._stop.is_set():
            names = list(self.p4)
            for name in names:
                if self._stop.wait(control_period_s(len(names)) / max(1, len(names))):
                    return
                with self._lock:
                    # asked under the lock: a switch killed while this pass waited for the lock
                    # is not reconnected to (a failed connect leaves gRPC's shared subchannel to
                    # that socket backing off, and the restart's own connect then failed 3 tries
                    # over servers: quickstart on bmv2, the suite, 2026-12-06)
                    if not self.faults.applied.alive[name]:
                        continue
                    try:  # nothing a switch does may end the watchdog: it asks again next period
                        if not self.p4[name].has_pipeline():
                            self.reprogram(name)
                            self.faults.restarted(name)
                    except Exception as e:  # the switch may still be starting
                        self.progress(f"watchdog: {name} not reprogrammed yet ({e})")

    def reprogram(self, name: str) -> None:
        """Reconnect to a (restarted) bmv2 switch and give it its pipeline and entries again."""
        with self._lock:
            self.plane.reprogram(self, name)
            self.reprogrammed.append((time.monotonic(), name))
            self.progress(f"{name}: pipeline and {self.routes[name].n_entries} entries installed again")

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the fabric's lock: no fault, watchdog pass or reprogramming interleaves with what
        the caller does to the switches meanwhile."""
        with self._lock:
            yield

    # ---- faults (controller/faults.py: they compose) ------------------------------------------
    def supports(self, feature: str) -> bool:
        """True when this machine gives the fabric's data plane ``feature`` (of :data:`FEATURES`)."""
        return feature in self.plane.available(remote=self.placement is not None)

    def _fault(self, fn, *args) -> None:
        with self._lock:
            try:
                fn(*args)
            except ValueError as e:
                raise FabricError(str(e)) from None

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Cut (``up=False``) or restore the cable between nodes ``a`` and ``b``."""
        self._fault(self.faults.set_link, a, b, up)

    def blackhole(self, switch: str, on: bool) -> None:
        """The switch stays up (answers its controller) but forwards nothing."""
        self._fault(self.faults.set_blackhole, switch, on)

    def switch_down(self, switch: str) -> None:
        """The switch dies: bmv2 process killed; linux: every port down (its links go dark)."""
        self._fault(self.faults.set_switch, switch, False)

    def switch_up(self, switch: str) -> None:
        """Restart the switch, reprogram it from the route plan and give it the faults still held."""
        self._fault(self.faults.set_switch, switch, True)

    def link_loss(self, a: str, b: str, rate: float) -> None:
        """Gray failure: drop ``rate`` of the packets each switch end of link ``a``-``b`` sends on it."""
        for sw in (n for n in (a, b) if not is_host(n)):
            self.port_loss(sw, b if sw == a else a, rate)

    def port_loss(self, switch: str, peer: str, rate: float) -> None:
        """Drop ``rate`` (0..1) of the packets ``switch`` sends towards ``peer`` (one direction)."""
        if not self.supports("gray_loss"):
            raise FabricError(f"gray loss needs the tc eBPF program on this machine's linux data plane "
                              f"({self.plane.missing_features(self.placement is not None).get('gray_loss')})")
        self._fault(self.faults.set_loss, switch, peer, rate)

    # ---- queries -------------------------------------------------------------------------------
    def switch_packets(self, switches: list[str] | None = None) -> dict[str, int]:
        """Switch -> packets it has forwarded (bmv2: ``port_tx``; linux: its uN SID's counter)."""
        names = switches or self.spec.switches()
        with self._lock:
            return self.plane.switch_packets(self, names)

    def sampled_switches(self) -> list[str]:
        """The switches :meth:`port_samples` reads (those with queues to sample), in fabric order."""
        return [sw for sw, prog in self.bpf.items() if prog.egress] + list(self.thrift)

    def port_samples(self, switches: Collection[str] | None = None) -> list[dict]:
        """Per switch port now: low-priority packets queued and, since start, packets ECN-marked,
        trimmed and dropped at a full queue, one dict per port (bmv2 with Thrift, which adds the
        drain watch's ``late``: packets that left more than a frame time after their shaper's
        schedule, since start, ``late_max_us``: the most any left after it since the last
        sample, ``gap_us``: its frame time at the port's rate, and ``sent``: its low-priority
        packets that left, since start; linux with the tc eBPF program); both add ``gray``:
        gray-loss drops at the port, since start; empty where switches do not queue.
        Of ``switches`` only (None: every switch :meth:`sampled_switches` names); bmv2 switches
        that are down are left out."""
        out = []
        with self._lock:
            paused = self.pfc.samples() if self.pfc is not None else {}
            asks = [(sw, prog, self.port_queues(sw)) for sw, prog in self.bpf.items()
                    if prog.egress and (switches is None or sw in switches)]
            # a switch here: its real queues (netlink) and then its maps, read close together (the drain
            # watch); those on servers: every server's maps in one request each
            real: dict[str, tuple[int, dict] | None] = {}  # switch here -> (ns, its qdiscs) or no tight read
            here: dict[str, list[dict[str, int]]] = {}
            for sw, prog, ports in asks:
                if isinstance(prog, bpf.SwitchBpf):
                    intfs = [f"{sw}-eth{port}" for port in ports]
                    got = bpf.read_tight(self._netlink_of(sw), functools.partial(prog.states, intfs))
                    real[sw], here[sw] = (got[:2], got[2]) if got is not None else (None, prog.states(intfs))
            rest = bpf.states_many([(prog, [f"{sw}-eth{port}" for port in ports]) for sw, prog, ports in asks
                                    if sw not in here])
            read = [here[sw] if sw in here else rest.pop(0) for sw, _prog, _ports in asks]
            for (sw, _prog, ports), states in zip(asks, read, strict=True):
                for (port, q), st in zip(ports.items(), states, strict=True):
                    row = {"switch": sw, "port": port, "peer": q.peer, "queue": st["queue"],
                           "marked": st["marked"], "trimmed": st["trimmed"], "queue_full": st["queue_full"],
                           "gray": st["gray"]}
                    if q.lossless:
                        row["pauses"], row["pause_s"] = paused.get((sw, port), (0, 0.0))
                    elif sw in here and q.rate_mbps > 0:  # the drain watch (a paused port keeps no schedule)
                        ps = bpf.ps_per_byte(q.rate_mbps)
                        row["gap_us"] = round(self.frame_bytes * ps / 1e6, 1)
                        if (tight := real[sw]) is not None:  # else no read was tight: no reading
                            now, queued = tight
                            nl = self._netlink_of(sw)
                            got = queued.get((nl.ifindex(f"{sw}-eth{port}"), bpf.LOW_LEAF_PARENT), (0, 0, 0))[1]
                            row["behind_us"] = round(bpf.behind_schedule_s(got, st["sched_ns"], now, ps) * 1e6, 1)
                    out.append(row)
            for sw, th in self.thrift.items():
                if (switches is not None and sw not in switches) or not self.faults.applied.alive[sw]:
                    continue
                try:
                    qocc = th.register("qocc")
                    late, late_max, sent = th.late()
                except ThriftError:  # a session the relay or the switch closed: one new session, once
                    th.close()
                    th = self.thrift[sw] = thrift_session(self.emu, sw)
                    qocc = th.register("qocc")
                    late, late_max, sent = th.late()
                ports = self.port_queues(sw)
                cnt = self.p4[sw].port_counters(sorted(ports))
                for port, q in ports.items():
                    row = {"switch": sw, "port": port, "peer": q.peer, "queue": qocc[port] if port < len(qocc) else 0,
                           "marked": cnt["marked"].get(port, 0), "trimmed": cnt["trimmed"].get(port, 0),
                           "queue_full": cnt["queue_full"].get(port, 0), "gray": cnt["gray"].get(port, 0),
                           "late": late[port] if port < len(late) else 0,
                           "late_max_us": late_max[port] if port < len(late_max) else 0,
                           "gap_us": gap_us(q.rate_pps), "sent": sent[port] if port < len(sent) else 0}
                    if q.lossless:
                        row["pauses"], row["pause_s"] = paused.get((sw, port), (0, 0.0))
                    out.append(row)
        return out

    def _netlink_of(self, switch: str) -> kernel.QdiscBacklog:
        """The netlink reader inside a linux switch's namespace on this machine (made at first use):
        the real queues its drain watch holds against the program's schedule."""
        nl = self._netlink.get(switch)
        if nl is None:
            nl = self._netlink[switch] = kernel.QdiscBacklog(self.emu.netns(switch))
        return nl

    def nic_samples(self) -> list[dict]:
        """The drain watch on every host NIC port now (:meth:`~controller.bpf.NicWatch.samples`);
        empty where the hosts' links are unshaped or this machine cannot load the program."""
        return self.nic_watch.samples() if self.nic_watch is not None else []

    def netns(self, node: str) -> str:
        """The namespace of node ``node`` (``mrclab-<node>``)."""
        return self.emu.netns(node)
