"""A data plane as an object: one class per data plane, chosen once (:func:`dataplane`) from a
scenario's or a command's ``dataplane`` name and handed to everything that differs by data plane.
Each class is the emulation's half (emulation/dataplanes.py: how its switches are built) plus the
controller's: what it can do here (:meth:`DataPlane.missing_features`), how its program is compiled,
written and read back, how it queues, how faults are realised (controller/backends.py), how the
PFC agent reaches its queues (controller/pfc.py), what the runner and the benchmarks watch.

* :class:`Bmv2`: P4Runtime (pipeline and table entries), Thrift (egress queue rates and depths), a
  watchdog that reprograms a switch that lost its pipeline, switch processes to watch for CPU;
* :class:`Linux`: IPv6 routes in each switch's namespace, the tc eBPF uN program on every port's
  ingress and the queue program behind an htb on its egress.

Nothing outside these classes compares a data plane's name.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mrclab.controller import bpf, kernel_routes, thrift
from mrclab.controller.backends import Bmv2Faults, LinuxFaults
from mrclab.controller.bpf import QueueAgent, RemoteSwitchBpf, SwitchBpf, htb_lines
from mrclab.controller.compiler import compile_p4
from mrclab.controller.p4runtime import MAX_PORTS, P4Info, P4Switch
from mrclab.controller.pfc import Bmv2Side, LinuxSide, lever_lines
from mrclab.emulation import kernel
from mrclab.emulation.dataplanes import Bmv2Emulated, EmulatedDataPlane, LinuxEmulated
from mrclab.p4src import MRCLAB_P4
from mrclab.topologies.errors import BadInput, RunFailed

#: What every data plane can do: faults, and ``congestion`` (switch queues that ECN-mark and trim).
FEATURES = frozenset({"link", "switch", "blackhole", "gray_loss", "congestion"})

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


class FabricError(RunFailed):
    """A fault, query or set-up the fabric cannot do (a port the program cannot count, tc refusing a
    queue); the message names what and what is allowed."""


class DataPlane(EmulatedDataPlane):
    """The controller's half of a data plane; see the module docstring. ``watchdog``: the fabric
    checks every switch's pipeline and reprograms one that lost it; ``switch_pcaps``: ``--debug``
    writes the switches' own per-port pcaps."""

    features = FEATURES
    #: the switches speak P4Runtime (``mrclab shell``, bulk entry writes)
    p4runtime = False
    watchdog = False
    switch_pcaps = False
    #: what a fabric whose planes run on other servers lacks beyond what this machine does
    #: (emulation/cluster.py), with the reason
    remote_missing: dict[str, str] = {}
    #: how a benchmark names the CPU a forwarded packet costs per hop (bench/scale.py)
    hop_cost_words = ""

    def missing_features(self, remote: bool = False) -> dict[str, str]:
        """Features this machine lacks for the data plane, with the reason; with ``remote``, for a
        fabric whose planes run on other servers (and :attr:`remote_missing`; what a server lacks,
        ``doctor --servers`` says)."""
        return {**self._missing_here(), **(self.remote_missing if remote else {})}

    def _missing_here(self) -> dict[str, str]:
        return {}

    def available(self, remote: bool = False) -> set[str]:
        """The features of :data:`FEATURES` the data plane has on this machine (``remote``: over servers)."""
        return set(self.features) - set(self.missing_features(remote))

    def build_id(self) -> str:
        """What a calibration of this data plane is keyed by beyond the machine ("" for none)."""
        return ""

    def compile(self, fab):
        """What must be compiled before anything is built (None: nothing). Raises CompileError or
        BpfError, leaving nothing behind."""
        return None

    def program(self, fab, compiled) -> None:
        """Program every switch of running fabric ``fab`` (routes, queues, PFC)."""
        raise NotImplementedError

    def reprogram(self, fab, switch: str) -> None:
        """Give a restarted ``switch`` of ``fab`` its program, entries and queues again."""

    def verify(self, fab, entry) -> None:
        """Read one switch's entries back against ``entry`` (its :class:`~controller.routeplan.SwitchEntries`)."""
        raise NotImplementedError

    def switch_packets(self, fab, names: list[str]) -> dict[str, int]:
        """Switch -> packets it has forwarded."""
        raise NotImplementedError

    def faults(self, fab):
        """The :class:`~controller.faults.FaultBackend` that realises faults on ``fab``."""
        raise NotImplementedError

    def pfc_side(self, fab):
        """How the PFC pause agent reads queues and pauses ports on ``fab`` (controller/pfc.py)."""
        raise NotImplementedError

    def sample_period_s(self, switches: int, period_s: float) -> float:
        """Seconds between two reads of one switch's counters when ``switches`` are read in turn
        every ``period_s``."""
        return period_s


class Bmv2(Bmv2Emulated, DataPlane):
    """BMv2 programmed over P4Runtime and Thrift."""

    p4runtime = True
    watchdog = True
    switch_pcaps = True
    hop_cost_words = "switch CPU / data packet / hop"

    def _missing_here(self) -> dict[str, str]:
        why = thrift.thrift_missing()
        return {"congestion": why} if why else {}

    def build_id(self) -> str:
        """The BMv2 binary on PATH as calibrations know it (path and modification time; "" without
        one), so a calibration is per BMv2 build."""
        path = shutil.which("simple_switch_grpc")
        return f"{path}@{int(Path(path).stat().st_mtime)}" if path else ""

    def compile(self, fab):
        """p4src/mrclab.p4 through p4c (cached by content hash)."""
        return compile_p4(MRCLAB_P4)

    def program(self, fab, compiled) -> None:
        """Pipeline and table entries over P4Runtime, then (with queues) each port's egress queues
        over Thrift and the PFC agent's levers."""
        info = P4Info(compiled.p4info)
        widest = max(max(fab.plan.ports(s)) for s in fab.spec.switches())
        if widest >= MAX_PORTS:
            raise FabricError(f"a switch of this fabric has port {widest}; p4src/mrclab.p4 counts ports "
                             f"below {MAX_PORTS} (fewer hosts per T0 or T1s per plane)")
        for sw in fab.emu.switches():
            fab.p4[sw.name] = P4Switch(sw.name, sw.device_id, sw.grpc_addr, info, compiled.bmv2_json,
                                       fab.port_queues(sw.name))
        fab.progress(f"pushing the pipeline to {len(fab.p4)} switches")
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s: (s.connect(), s.push_pipeline()), fab.p4.values()))
        fab.timings["pipeline_s"] = time.monotonic() - t
        fab.progress(f"writing {fab.routes.n_entries} table entries")
        t = time.monotonic()
        for e in fab.routes.switches:
            fab.p4[e.switch].apply(e)
        fab.timings["routes_s"] = time.monotonic() - t
        if fab.congestion:
            t = time.monotonic()
            fab.progress(f"setting {len(fab.queues)} ports' egress queues over Thrift")
            for sw in fab.p4:
                self.set_queues(fab, sw)
            if any(q.lossless for q in fab.queues.values()):
                fab.start_pfc(lever_lines(fab))
            fab.timings["queues_s"] = time.monotonic() - t

    def set_queues(self, fab, switch: str) -> None:
        """Both priority queues of every port of ``switch``, over a new Thrift session: the low one
        at the port's rate in full frames, ``depth`` packets deep, the high one (trimmed and control
        packets) at the same bit rate in trimmed frames, ``depth_high`` deep (controller/queues.py), and
        the drain watch's schedule at the low one's rate (p4src/mrclab.p4 ``q_gap``)."""
        old = fab.thrift.pop(switch, None)
        if old is not None:
            old.close()
        th = fab.thrift[switch] = thrift.session(fab.emu, switch)
        for port, q in fab.port_queues(switch).items():
            th.set_queue(port, 0, q.rate_pps, q.depth)
            th.set_queue(port, 1, q.rate_pps_high, q.depth_high)
            th.set_gap(port, q.rate_pps)

    def reprogram(self, fab, switch: str) -> None:
        """Reconnect, push the pipeline, write and read back the entries, set the queues again."""
        sw = fab.p4[switch]
        sw.connect()
        sw.push_pipeline()
        sw.apply(fab.routes[switch])
        sw.verify(fab.routes[switch])
        if fab.congestion:
            self.set_queues(fab, switch)

    def verify(self, fab, entry) -> None:
        """Read the switch's tables back over P4Runtime."""
        fab.p4[entry.switch].verify(entry)

    def switch_packets(self, fab, names: list[str]) -> dict[str, int]:
        """Each switch's ``port_tx`` counter, summed."""
        return {s: fab.p4[s].forwarded_packets() for s in names}

    def faults(self, fab):
        """:class:`~controller.backends.Bmv2Faults`."""
        return Bmv2Faults(fab)

    def pfc_side(self, fab):
        """:class:`~controller.pfc.Bmv2Side`: queue occupancy over Thrift, pauses by tc levers."""
        return Bmv2Side(fab)

    def sample_period_s(self, switches: int, period_s: float) -> float:
        """A read wakes the switch's gRPC threads: :func:`control_period_s`."""
        return control_period_s(switches, period_s)


class Linux(LinuxEmulated, DataPlane):
    """The kernel's IPv6 forwarding with the tc eBPF uN and queue programs."""

    hop_cost_words = "kernel CPU / data packet / hop (upper bound)"

    def missing(self) -> str | None:
        """Why this machine cannot run the linux data plane: the uN SID is a tc eBPF program, so
        clang, libbpf and the kernel's headers (:func:`~controller.bpf.bpf_missing`), or None."""
        return bpf.bpf_missing()

    def compile(self, fab):
        """The tc eBPF programs through clang (cached): every linux fabric's switches need the uN one."""
        return bpf.compile_bpf()

    def program(self, fab, compiled) -> None:
        """IPv6 routes in every switch's namespace and the uN program on every port's ingress, then
        (where the switches queue) every port's htb and queue program, configured from the queue
        plan, and the PFC agent."""
        t = time.monotonic()
        fab.progress(f"writing {fab.routes.n_entries} entries (IPv6 routes, the uN SID in tc eBPF)")
        for e in fab.routes.switches:
            kernel_routes.apply(fab.emu.netns(e.switch), e, fab.routes.block)
        fab.timings["routes_s"] = time.monotonic() - t
        t = time.monotonic()
        queued = fab.congestion
        if queued:
            fab.progress(f"attaching the queue program to {len(fab.queues)} switch ports (tc eBPF, htb)")
        for sw in fab.spec.switches():
            ns, ports = fab.emu.netns(sw), sorted(fab.plan.ports(sw))
            if queued:
                queues = fab.port_queues(sw)
                lines = [x for port, q in sorted(queues.items()) if q.rate_mbps > 0
                         for x in htb_lines(f"{sw}-eth{port}", q.rate_mbps, q.depth, q.depth_high, q.lossless,
                                            fab.emu.frame_bytes)]
                try:
                    kernel.tc_batch(ns, lines)
                except kernel.KernelError as e:
                    raise FabricError(f"{sw}: tc refused the port queues: {e}") from None
            intfs = [f"{sw}-eth{p}" for p in ports]
            sid = fab.routes[sw].sid.network_address.packed[:6]
            server = fab.emu.server_of(sw)
            if server is None:
                fab.bpf[sw] = SwitchBpf(sw, ns, compiled, intfs, sid=sid, egress=queued)
            else:
                fab.bpf[sw] = RemoteSwitchBpf(sw, ns, compiled, intfs, self.queue_agent(fab, server), sid=sid,
                                              egress=queued)
            if queued:
                for port in fab.port_queues(sw):
                    fab.bpf[sw].configure(f"{sw}-eth{port}", fab.port_config(sw, port))
        if queued and any(q.lossless for q in fab.queues.values()):
            fab.start_pfc([])
        fab.timings["queues_s"] = time.monotonic() - t

    @staticmethod
    def queue_agent(fab, server) -> QueueAgent:
        """``server``'s queue agent (controller/bpfmaps.py), started at first use; the run's pins
        under bpffs there were recorded for cleanup when the servers were prepared."""
        agent = fab.queue_agents.get(server)
        if agent is None:
            agent = fab.queue_agents[server] = QueueAgent(fab.emu.ssh, server, fab.emu.remote_dir(server),
                                                          fab.emu.pin_dir(server))
        return agent

    def verify(self, fab, entry) -> None:
        """Read the switch's routes back from its namespace."""
        kernel_routes.verify(fab.emu.netns(entry.switch), entry, fab.routes.block)

    def switch_packets(self, fab, names: list[str]) -> dict[str, int]:
        """Each switch's uN SID counter (the uN program's)."""
        return {s: fab.bpf[s].sid_packets() for s in names}

    def faults(self, fab):
        """:class:`~controller.backends.LinuxFaults`."""
        return LinuxFaults(fab)

    def pfc_side(self, fab):
        """:class:`~controller.pfc.LinuxSide`: the eBPF program's queue state and pause flag."""
        return LinuxSide(fab)


#: Every data plane by name, in the order commands list them.
DATAPLANES: dict[str, DataPlane] = {p.name: p for p in (Bmv2(), Linux())}


def dataplane(name: str | DataPlane | None = None) -> DataPlane:
    """The data plane named ``name`` (a :class:`DataPlane` is returned as it is; None or ``"auto"``:
    the first this machine can emulate, :func:`here`: bmv2 where its toolchain is installed, else
    linux). Raises BadInput for an unknown name."""
    if isinstance(name, DataPlane):
        return name
    if name in (None, "auto"):
        return here()[0]  # linux needs nothing a root machine lacks: never empty
    if name not in DATAPLANES:
        raise BadInput(f"data plane {name!r}; allowed: {', '.join(DATAPLANES)}")
    return DATAPLANES[name]


def missing_features(name: str | DataPlane, remote: bool = False) -> dict[str, str]:
    """:meth:`DataPlane.missing_features` of the data plane ``name``."""
    return dataplane(name).missing_features(remote)


def available(name: str | DataPlane, remote: bool = False) -> set[str]:
    """:meth:`DataPlane.available` of the data plane ``name``."""
    return dataplane(name).available(remote)


def here() -> list[DataPlane]:
    """Every data plane this machine can emulate (its :meth:`~DataPlane.missing` is None), in
    :data:`DATAPLANES`' order: what commands run on by default."""
    return [p for p in DATAPLANES.values() if p.missing() is None]
