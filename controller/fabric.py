"""A running fabric: the emulation, programmed from the route plan, verified, with faults to inject.

    with Fabric(load_spec(), "linux", progress=print) as fab:
        fab.set_link("t0-0-0", "t1-0-1", up=False)
        ...

Data flow (docs/design.md): ClosSpec -> AddressPlan -> RoutePlan -> (P4Runtime | seg6) -> running
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
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor

from mrclab.controller import bpf, seg6, thrift
from mrclab.controller.backends import Bmv2Faults, LinuxFaults
from mrclab.controller.bpf import PortConfig, SwitchBpf, htb_lines
from mrclab.controller.compiler import compile_p4
from mrclab.controller.faults import FaultInjector
from mrclab.controller.p4runtime import MAX_PORTS, P4Info, P4Switch
from mrclab.controller.pfc import PauseAgent, lever_lines
from mrclab.controller.queues import DEFAULT_FRAME_BYTES, PortQueue, QueueSettings, queue_plan
from mrclab.controller.routeplan import RoutePlan, route_plan
from mrclab.controller.thrift import THRIFT_PORT, SwitchThrift
from mrclab.emulation import kernel
from mrclab.emulation.network import Emulation
from mrclab.emulation.nodes import default_dataplane
from mrclab.emulation.placement import Placement
from mrclab.emulation.servers import Ssh
from mrclab.p4src import MRCLAB_P4
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import RunFailed
from mrclab.topologies.spec import ClosSpec, is_host

#: Every bmv2 switch is checked for its pipeline once in this many seconds (the watchdog), one
#: switch at a time, spread evenly over the period ...
WATCHDOG_PERIOD_S = 1.0
#: ... and no more than this many switches a second: the runner's Reads cost the switches and the
#: runner CPU that a large fabric's forwarding needs. Idle 64-switch fabric (lab64, 2-core VM, 10 s
#: windows): the switches took 0.075-0.091 cores alone, +0.02 with the watchdog checking every
#: switch each second and +0.025 more with the port sampler reading them too; the runner took
#: 0.05 and 0.095 cores more for them (protobuf 3.20 parses in pure Python here). Up to 16
#: switches the periods stay 1 s.
CONTROL_READS_PER_S = 16


def control_period_s(switches: int, period_s: float = WATCHDOG_PERIOD_S) -> float:
    """Seconds between two reads of one switch when ``switches`` switches are read in turn every
    ``period_s``, at most :data:`CONTROL_READS_PER_S` switches a second."""
    return max(period_s, switches / CONTROL_READS_PER_S)


#: What each data plane can do: faults, and ``congestion`` (switch queues that ECN-mark and trim).
#: bmv2's congestion needs its Thrift runtime; linux's gray loss and congestion need the tc eBPF
#: program (controller/bpf.py: clang and libbpf) (:func:`missing_features`).
FEATURES = {
    "bmv2": {"link", "switch", "blackhole", "gray_loss", "congestion"},
    "linux": {"link", "switch", "blackhole", "gray_loss", "congestion"},
}


#: What a fabric whose planes run on other servers lacks (emulation/cluster.py), with the reason:
#: linux's switch queues and gray loss live in this process's eBPF map descriptors, and bmv2's
#: queues need its Thrift runtime, which listens inside the switch's namespace.
REMOTE_MISSING = {
    "congestion": "switch queues on other servers (linux's tc eBPF program, bmv2's Thrift runtime) are not built yet",
    "gray_loss": "gray loss on other servers is not built yet for linux (its tc eBPF program)",
}


def missing_features(dataplane: str, remote: bool = False) -> dict[str, str]:
    """Features of ``dataplane`` this machine lacks, with the reason; with ``remote``, for a fabric
    whose planes run on other servers (:data:`REMOTE_MISSING`)."""
    if remote:  # bmv2 keeps gray loss on servers: it is a table entry, written over P4Runtime
        return {k: v for k, v in REMOTE_MISSING.items() if not (dataplane == "bmv2" and k == "gray_loss")}
    if dataplane == "bmv2":
        if why := thrift.thrift_missing():
            return {"congestion": why}
    if dataplane == "linux":
        if why := bpf.bpf_missing():
            return {"congestion": why, "gray_loss": why}
    return {}


def available(dataplane: str, remote: bool = False) -> set[str]:
    """The features of :data:`FEATURES` that ``dataplane`` has on this machine (with ``remote``:
    on a fabric over servers)."""
    return FEATURES[dataplane] - set(missing_features(dataplane, remote))


class FabricError(RunFailed):
    """A fault or query the fabric cannot do; the message names what and what is allowed."""


class Fabric:
    """Emulation + controller for one fabric. See module docstring. ``loss_salt`` seeds the
    switches' loss draws (a scenario passes its seed, so a run repeats)."""

    def __init__(self, spec: ClosSpec, dataplane: str | None = None, *, debug: bool = False,
                 progress: Callable[[str], None] | None = None, watchdog: bool = True, loss_salt: int = 0,
                 queues: QueueSettings = QueueSettings(), frame_bytes: int = DEFAULT_FRAME_BYTES,
                 bmv2_build: str | None = None, placement: Placement | None = None,
                 ssh: Ssh | None = None) -> None:
        """Plan the fabric (address, route and queue plans) and its emulation; builds nothing until
        :meth:`start`. ``dataplane`` None: :func:`~emulation.nodes.default_dataplane`;
        ``watchdog``: on bmv2, give a switch that lost its pipeline everything again; ``queues``,
        ``frame_bytes``: the queue plan's settings and frame size (controller/queues.py), used
        where this machine gives the data plane switch queues; ``bmv2_build``: "forwarding" or
        "logging" (emulation/nodes.py bmv2_binary; None: as ``debug`` says); ``placement``, ``ssh``:
        planes on other servers (emulation/cluster.py), where the switches have no queue program
        (:data:`REMOTE_MISSING`). Raises as :class:`~emulation.network.Emulation` does."""
        self.spec = spec
        self.plan = AddressPlan(spec)
        self.routes: RoutePlan = route_plan(self.plan)
        self.dataplane = dataplane or default_dataplane()
        self.progress = progress or (lambda _m: None)
        self.placement = placement
        self.congestion = "congestion" in available(self.dataplane, remote=placement is not None)
        #: every switch port's rate, depth and thresholds (controller/queues.py), where switches queue
        self.queues: dict[tuple[str, int], PortQueue] = queue_plan(self.plan, queues, frame_bytes) \
            if self.congestion else {}
        self.emu = Emulation(spec, self.dataplane, debug=debug, progress=self.progress, bmv2_build=bmv2_build,
                             thrift_port=THRIFT_PORT if self.congestion else None, switch_queues=self.congestion,
                             placement=placement, ssh=ssh, frame_bytes=frame_bytes)
        self.thrift: dict = {}  # switch -> SwitchThrift (bmv2 with queues)
        self.bpf: dict = {}  # switch -> SwitchBpf (linux with queues)
        self.pfc: PauseAgent | None = None  # with lossless (PFC) queues
        #: (switch, port) -> gray loss in force (linux; bmv2 keeps it in its table entries)
        self.port_loss_now: dict[tuple[str, int], float] = {}
        self.p4: dict = {}  # switch -> P4Switch (bmv2)
        self.timings: dict[str, float] = {}
        self.loss_salt = loss_salt
        self._watchdog_on = watchdog
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.faults = FaultInjector(self.plan, self.dataplane,
                                    Bmv2Faults(self) if self.dataplane == "bmv2" else LinuxFaults(self))
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
        queues; linux: seg6 routes and, with the eBPF program, htb and the program on every
        port), read every switch back, and start the bmv2 watchdog; each phase is timed into
        ``timings`` (s, see the module docstring). On any failure everything built is torn down
        and the error (CompileError, BpfError, FabricError, P4RuntimeError, Seg6Error,
        EmulationError, ...) propagates."""
        t0 = time.monotonic()
        try:
            prog = bpf_obj = None
            if self.dataplane == "linux" and self.congestion:
                bpf_obj = bpf.compile_bpf()  # before anything is built, as p4c's
                self.timings["compile_s"] = time.monotonic() - t0
            if self.dataplane == "bmv2":
                prog = compile_p4(MRCLAB_P4)  # before anything is built: a refused program leaves nothing
                self.timings["compile_s"] = time.monotonic() - t0
            t = time.monotonic()
            self.emu.start()
            self.timings["build_s"] = time.monotonic() - t
            if prog is not None:
                self._start_bmv2(prog)
            else:
                t = time.monotonic()
                self.progress(f"writing {self.routes.n_entries} seg6 entries")
                for e in self.routes.switches:
                    seg6.apply(self.emu.netns(e.switch), e, self.routes.block)
                self.timings["routes_s"] = time.monotonic() - t
                if bpf_obj is not None:
                    self._start_linux_queues(bpf_obj)
            t = time.monotonic()
            self.verify()
            self.timings["verify_s"] = time.monotonic() - t
            if prog is not None and self._watchdog_on:
                self._thread = threading.Thread(target=self._watchdog, name="mrclab-watchdog", daemon=True)
                self._thread.start()
        except BaseException:
            self.stop()
            raise
        self.timings["total_s"] = time.monotonic() - t0
        self.progress(f"fabric up and verified on {self.dataplane} in {self.timings['total_s']:.1f} s")

    def _start_bmv2(self, prog) -> None:
        info = P4Info(prog.p4info)
        widest = max(max(self.plan.ports(s)) for s in self.spec.switches())
        if widest >= MAX_PORTS:
            raise FabricError(f"a switch of this fabric has port {widest}; p4src/mrclab.p4 counts ports "
                              f"below {MAX_PORTS} (fewer hosts per T0 or T1s per plane)")
        for sw in self.emu.switches():
            self.p4[sw.name] = P4Switch(sw.name, sw.device_id, sw.grpc_addr, info, prog.bmv2_json,
                                        self.port_queues(sw.name))
        self.progress(f"pushing the pipeline to {len(self.p4)} switches")
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s: (s.connect(), s.push_pipeline()), self.p4.values()))
        self.timings["pipeline_s"] = time.monotonic() - t
        self.progress(f"writing {self.routes.n_entries} table entries")
        t = time.monotonic()
        for e in self.routes.switches:
            self.p4[e.switch].apply(e)
        self.timings["routes_s"] = time.monotonic() - t
        if self.congestion:
            t = time.monotonic()
            self.progress(f"setting {len(self.queues)} ports' egress queues over Thrift")
            for sw in self.p4:
                self._set_queues(sw)
            if any(q.lossless for q in self.queues.values()):
                self._start_pfc(lever_lines(self))
            self.timings["queues_s"] = time.monotonic() - t

    def _start_linux_queues(self, obj) -> None:
        """Every switch port: a two-class htb at the link's rate and the tc eBPF program
        (controller/bpf.py), configured from the queue plan."""
        t = time.monotonic()
        self.progress(f"attaching the queue program to {len(self.queues)} switch ports (tc eBPF, htb)")
        for sw in self.spec.switches():
            ns, ports = self.emu.netns(sw), self.port_queues(sw)
            lines = [x for port, q in sorted(ports.items()) if q.rate_mbps > 0
                     for x in htb_lines(f"{sw}-eth{port}", q.rate_mbps, q.depth, q.depth_high, q.lossless,
                                       self.emu.frame_bytes)]
            try:
                kernel.tc_batch(ns, lines)
            except kernel.KernelError as e:
                raise FabricError(f"{sw}: tc refused the port queues: {e}") from None
            self.bpf[sw] = SwitchBpf(sw, ns, obj, [f"{sw}-eth{p}" for p in sorted(ports)])
            for port in ports:
                self.bpf[sw].configure(f"{sw}-eth{port}", self.port_config(sw, port))
        if any(q.lossless for q in self.queues.values()):
            self._start_pfc([])
        self.timings["queues_s"] = time.monotonic() - t

    def _start_pfc(self, levers: list[tuple[str, str]]) -> None:
        """Install the pause levers (bmv2: (namespace, tc line) each) and start the pause agent."""
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

    def port_config(self, switch: str, port: int) -> PortConfig:
        """The tc eBPF program's settings for one port (linux): its queue plan and gray loss."""
        q = self.queues[(switch, port)]
        return PortConfig(q.rate_pps, q.ecn_k, q.trim_t, q.q_limit, self.port_loss_now.get((switch, port), 0.0),
                          self.loss_salt, q.lossless, port)

    def port_queues(self, switch: str) -> dict[int, PortQueue]:
        """Port -> queue plan of ``switch`` (empty where switches do not queue)."""
        return {port: q for (sw, port), q in self.queues.items() if sw == switch}

    def _set_queues(self, switch: str) -> None:
        """Both priority queues of every port of ``switch``, over a new Thrift session: the low one
        at the port's rate in full frames, ``depth`` packets deep, the high one (trimmed and control
        packets) at the same bit rate in trimmed frames, ``depth_high`` deep (controller/queues.py)."""
        old = self.thrift.pop(switch, None)
        if old is not None:
            old.close()
        th = self.thrift[switch] = SwitchThrift(switch, self.emu.netns(switch))
        for port, q in self.port_queues(switch).items():
            th.set_queue(port, 0, q.rate_pps, q.depth)
            th.set_queue(port, 1, q.rate_pps_high, q.depth_high)
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
        self.p4.clear()
        for th in self.thrift.values():
            th.close()
        self.thrift.clear()
        for b in self.bpf.values():
            b.close()
        self.bpf.clear()
        self.emu.stop()

    def verify(self) -> None:
        """Read every live switch back and compare with the route plan; raises on any difference."""
        for e in self.routes.switches:
            if not self.faults.applied.alive[e.switch]:
                continue
            if self.dataplane == "bmv2":
                self.p4[e.switch].verify(e)
            else:
                seg6.verify(self.emu.netns(e.switch), e, self.routes.block)

    def _watchdog(self) -> None:
        # One switch at a time, spread over the period, not all n at once: a burst of n Reads
        # wakes n switches' gRPC threads together, and on a busy machine the switches forwarding
        # packets then wait behind them (a run's fidelity monitor counts that as starvation).
        while not self._stop.is_set():
            names = list(self.p4)
            for name in names:
                if self._stop.wait(control_period_s(len(names)) / max(1, len(names))):
                    return
                if not self.faults.applied.alive[name]:
                    continue
                with self._lock:
                    if not self.p4[name].has_pipeline():
                        try:
                            self.reprogram(name)
                            self.faults.restarted(name)
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
            if self.congestion:
                self._set_queues(name)
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
        return feature in available(self.dataplane, remote=self.placement is not None)

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
                              f"({missing_features(self.dataplane, self.placement is not None).get('gray_loss')})")
        self._fault(self.faults.set_loss, switch, peer, rate)

    # ---- queries -------------------------------------------------------------------------------
    def switch_packets(self, switches: list[str] | None = None) -> dict[str, int]:
        """Switch -> packets it has forwarded (bmv2: ``port_tx``; linux: its uN SID's counter)."""
        names = switches or self.spec.switches()
        if self.dataplane == "bmv2":
            with self._lock:
                return {s: self.p4[s].forwarded_packets() for s in names}
        return {s: seg6.sid_packets(self.emu.netns(s), self.routes[s], self.routes.block) for s in names}

    def sampled_switches(self) -> list[str]:
        """The switches :meth:`port_samples` reads (those with queues to sample), in fabric order."""
        return list(self.bpf) + list(self.thrift)

    def port_samples(self, switches: Collection[str] | None = None) -> list[dict]:
        """Per switch port now: low-priority packets queued and, since start, packets ECN-marked,
        trimmed and dropped at a full queue, one dict per port (bmv2 with Thrift; linux with the tc
        eBPF program, which adds ``gray``: gray-loss drops); empty where switches do not queue.
        Of ``switches`` only (None: every switch :meth:`sampled_switches` names); bmv2 switches
        that are down are left out."""
        out = []
        with self._lock:
            paused = self.pfc.samples() if self.pfc is not None else {}
            for sw, prog in self.bpf.items():
                if switches is not None and sw not in switches:
                    continue
                for port, q in self.port_queues(sw).items():
                    st = prog.state(f"{sw}-eth{port}")
                    row = {"switch": sw, "port": port, "peer": q.peer, "queue": st["queue"],
                           "marked": st["marked"], "trimmed": st["trimmed"], "queue_full": st["queue_full"],
                           "gray": st["gray"]}
                    if q.lossless:
                        row["pauses"], row["pause_s"] = paused.get((sw, port), (0, 0.0))
                    out.append(row)
            for sw, th in self.thrift.items():
                if (switches is not None and sw not in switches) or not self.faults.applied.alive[sw]:
                    continue
                qocc = th.register("qocc")
                ports = self.port_queues(sw)
                cnt = self.p4[sw].port_counters(sorted(ports))
                for port, q in ports.items():
                    row = {"switch": sw, "port": port, "peer": q.peer, "queue": qocc[port] if port < len(qocc) else 0,
                           "marked": cnt["marked"].get(port, 0), "trimmed": cnt["trimmed"].get(port, 0),
                           "queue_full": cnt["queue_full"].get(port, 0)}
                    if q.lossless:
                        row["pauses"], row["pause_s"] = paused.get((sw, port), (0, 0.0))
                    out.append(row)
        return out

    def netns(self, node: str) -> str:
        """The namespace of node ``node`` (``mrclab-<node>``)."""
        return self.emu.netns(node)
