"""The Mininet builder: hosts and switches of a :class:`ClosSpec` as network namespaces and veths.

Every node runs in its own network namespace, attached under the name ``mrclab-<node>``
(topologies/nodes.py has the node classes), and every namespace and process is recorded as it is
made (topologies/cleanup.py), so cleanup finds exactly what this project made.

This module only builds and runs the emulation; programming the switches is the controller's job.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mrclab.topologies import kernel
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.cleanup import RunState, cleanup_run, list_netns, live_runs, stop_processes
from mrclab.topologies.errors import NotAvailable
from mrclab.topologies.nodes import (
    SID_DEV,
    Bmv2Switch,
    EmulationError,
    FabricBusy,
    LinuxSrv6Switch,
    NicHost,
    bmv2_binary,
    bmv2_device,
    need_root,
    toolchain_missing,
)
from mrclab.topologies.spec import ClosSpec, is_host

DATAPLANES = ("bmv2", "linux")
#: Every emulated link carries jumbo frames, so 8 KiB payloads plus MRC's 158 bytes of headers (with IMM) fit.
MTU = 9000


def _node_shells() -> list:
    """This process's Mininet node shells (``bash ... mininet:<node>``) that are still running."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if any(a.startswith("mininet:") for a in p.cmdline()):
                out.append(p)
        except psutil.Error:
            pass
    return out


class Emulation:
    """A running fabric's nodes and links. Use as a context manager; :meth:`stop` always cleans up.

    ``progress`` receives one short line per step. Raises :class:`EmulationError` when another
    fabric of this project is running or a node fails to start; what was built is removed first.
    """

    def __init__(
        self,
        spec: ClosSpec,
        dataplane: str = "linux",
        *,
        debug: bool = False,
        progress: Callable[[str], None] | None = None,
        thrift_port: int | None = None,
        switch_queues: bool = False,
        bmv2_build: str | None = None,
    ) -> None:
        """Check what the fabric needs; builds nothing until :meth:`start`.

        ``dataplane``: one of :data:`DATAPLANES`; ``debug``: BMv2 per-packet logs and pcaps in the
        run directory; ``thrift_port``: BMv2's Thrift runtime port in each switch's namespace
        (bmv2 only; None: no Thrift); ``switch_queues``: the switches queue themselves, so only
        host NIC ports get a ``tbf`` (implied by a Thrift port); ``bmv2_build``: "forwarding" or
        "logging" (None: the forwarding build, the logging one with ``debug``). Raises EmulationError for an
        unknown data plane, NotAvailable without root or, for bmv2, without p4c and
        simple_switch_grpc.
        """
        if dataplane not in DATAPLANES:
            raise EmulationError(f"data plane {dataplane!r}; allowed: {', '.join(DATAPLANES)}")
        if dataplane == "bmv2" and (why := toolchain_missing()):
            raise NotAvailable(f"data plane bmv2 needs the P4 toolchain: {why}")
        need_root()
        self.spec = spec
        self.plan = AddressPlan(spec)
        self.dataplane = dataplane
        self.debug = debug
        self.bmv2_build = bmv2_build
        self.thrift_port = thrift_port if dataplane == "bmv2" else None
        #: the switches queue themselves (bmv2 with Thrift; linux: the controller's htb and eBPF):
        #: only host NIC ports get a tbf
        self.switch_queues = switch_queues or self.thrift_port is not None
        self.progress = progress or (lambda _msg: None)
        self.net: Mininet | None = None
        self.state: RunState | None = None
        self.timings: dict[str, float] = {}

    # ---- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Emulation:
        """Start the fabric (:meth:`start`) and return it."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the fabric and remove everything it made (:meth:`stop`), however the block ended."""
        self.stop()

    def start(self) -> None:
        """Build the fabric: record the run, make every node's namespace and every link, configure
        and shape the interfaces and, on bmv2, start every switch process and wait for its
        P4Runtime socket; ``timings["build_s"]`` is how long it took (s). Raises FabricBusy
        when a fabric of this project is already running, EmulationError or KernelError when a
        step fails (what was built is removed first)."""
        running = live_runs(include_own=True)
        if running:
            raise FabricBusy(
                f"a fabric of this project is already running (pid {running[0].owner_pid}, "
                f"{running[0].run_dir}); stop it or run `mrclab clean --force`"
            )
        setLogLevel("error")
        t0 = time.monotonic()
        self.state = RunState.create(self.dataplane, self.spec.to_dict())
        try:
            self._build()
        except BaseException:
            self.stop()
            raise
        self.timings["build_s"] = time.monotonic() - t0

    def _build(self) -> None:
        spec, plan = self.spec, self.plan
        state = self.state
        assert state is not None, "start() records the run before it builds"
        self.net = net = Mininet(topo=None, build=False, controller=None, link=Link, autoSetMacs=False)
        self.progress(f"creating {spec.n_hosts} hosts and {spec.n_switches} {self.dataplane} switches")
        for h in spec.hosts():
            self._track(net.addHost(h, cls=NicHost))
        for sw in spec.switches():
            if self.dataplane == "bmv2":
                node = net.addSwitch(sw, cls=Bmv2Switch, device_id=bmv2_device(spec, sw), run_dir=state.run_dir,
                                     debug=self.debug, thrift_port=self.thrift_port, build=self.bmv2_build)
            else:
                node = net.addSwitch(sw, cls=LinuxSrv6Switch)
            self._track(node)
        self.progress(f"creating {spec.n_links} links")
        for a, b in spec.links():
            if is_host(a):
                plane = int(b.split("-")[1])
                pa, pb = plane, plan.port_to(b, a)
                maca, macb = plan.host_mac(a, plane), plan.switch_mac(b, pb)
            else:
                pa, pb = plan.port_to(a, b), plan.port_to(b, a)
                maca, macb = plan.switch_mac(a, pa), plan.switch_mac(b, pb)
            net.addLink(a, b, port1=pa, port2=pb, intfName1=f"{a}-eth{pa}", intfName2=f"{b}-eth{pb}",
                        addr1=maca, addr2=macb)
        net.build()
        self._configure_interfaces()
        if spec.link.bandwidth_mbps > 0 or spec.link.t0_t1_bandwidth_mbps > 0:
            self._shape()
        if self.dataplane == "bmv2":
            binary, build = bmv2_binary(self.debug, self.bmv2_build)
            self.progress(f"starting {spec.n_switches} simple_switch_grpc processes ({build}: {binary})")
            for sw in self.switches():
                sw.start()
                assert sw.proc is not None
                state.add_pid(sw.proc.pid)
            for sw in self.switches():
                sw.wait_ready()

    def _track(self, node) -> None:
        """Record the node's process and name its namespace ``mrclab-<node>``. The name is recorded
        before it is made, so a signal between the two still leaves it to cleanup; a name that
        already exists is another run's, and is left alone."""
        assert self.state is not None
        self.state.add_pid(node.pid)
        if node.netns in list_netns():
            raise EmulationError(f"namespace {node.netns} exists, left by a crashed run: `mrclab clean` removes it")
        self.state.add_netns(node.netns)
        try:
            kernel.netns_attach(node.netns, node.pid)
        except kernel.KernelError as e:
            raise EmulationError(f"{e} (try `mrclab clean`)") from None

    def _configure_interfaces(self) -> None:
        """One ``ip -batch`` and one sysctl call per node: fast and deterministic."""
        assert self.net is not None
        for node in self.net.hosts:
            intfs = [i.name for i in node.intfList() if i.name != "lo"]
            sysctls = [f"net.ipv6.conf.{i}.disable_ipv6=1" for i in intfs]
            kernel.sysctl(node.netns, sysctls)
            script = "".join(f"ethtool -K {i} tx off rx off tso off gso off gro off >/dev/null 2>&1; " for i in intfs)
            kernel.netns_exec(node.netns, ["sh", "-c", script], capture_output=True)
            kernel.ip_batch(node.netns, ["link set lo up"] + [f"link set {i} mtu {MTU} up" for i in intfs])
        for node in self.net.switches:
            intfs = [i.name for i in node.intfList() if i.name != "lo"]
            sysctls = ["net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0"]
            sysctls += [f"net.ipv6.conf.{i}.accept_dad=0" for i in intfs]
            anchor = []
            if self.dataplane == "bmv2":  # BMv2 owns the ports: keep the kernel out of the way
                sysctls += [f"net.ipv6.conf.{i}.disable_ipv6=1" for i in intfs]
            else:
                anchor = [f"link add {SID_DEV} type veth peer {SID_DEV}p", f"link set {SID_DEV}p up",
                          f"link set {SID_DEV} up"]
            kernel.sysctl(node.netns, sysctls)
            kernel.ip_batch(node.netns, ["link set lo up"] + anchor + [f"link set {i} mtu {MTU} up" for i in intfs])

    def _shape(self) -> None:
        """``tbf`` on both ends of every link (Mininet's TCLink needs netem for the queue limit,
        which this kernel lacks): host links at ``bandwidth_mbps``, T0-T1 links at
        ``t0_t1_bandwidth_mbps`` (or the same). Burst: 4 ms of line rate, at least 3000 bytes.
        Where the switches queue themselves (BMv2's own egress queues with Thrift; on linux the
        controller's htb fed by the tc eBPF program, controller/bpf.py), only the hosts' NIC
        ports are shaped here: a qdisc behind a BMv2 port would hide the queue from the P4 program."""
        link = self.spec.link
        limit = link.queue_packets * 1500
        per_ns: dict[str, list[str]] = {}
        switch_queues = self.switch_queues
        for a, b in self.spec.links():
            mbps = link.bandwidth_mbps if is_host(a) else (link.t0_t1_bandwidth_mbps or link.bandwidth_mbps)
            if mbps <= 0:
                continue
            burst = max(3000, int(mbps * 1e6 / 8 / 250))
            for ns, intf in self.link_intfs(a, b):
                if switch_queues and not is_host(intf):
                    continue
                per_ns.setdefault(ns, []).append(f"qdisc replace dev {intf} root tbf rate {mbps}mbit burst {burst} limit {limit}")
        where = ("host NIC ports (tbf); switch ports are " +
                 ("BMv2's own queues" if self.dataplane == "bmv2" else "htb fed by the tc eBPF program")) \
            if switch_queues else "tbf"
        self.progress(f"shaping links: hosts {link.bandwidth_mbps or 'unshaped'} Mb/s, T0-T1 "
                      f"{link.t0_t1_bandwidth_mbps or link.bandwidth_mbps or 'unshaped'} Mb/s ({where}, "
                      f"{link.queue_packets} packets of queue)")
        for ns, lines in per_ns.items():
            kernel.tc_batch(ns, lines)

    def stop(self) -> None:
        """Stop every process and remove every namespace and link this emulation made. Idempotent."""
        net, self.net = self.net, None
        if net is not None:
            for sw in net.switches:
                if isinstance(sw, Bmv2Switch):
                    sw.kill()
        state, self.state = self.state, None
        if state is not None:
            cleanup_run(state)
            stop_processes(_node_shells())  # a node made but not yet recorded when a signal came
        if net is not None:
            for node in net.hosts + net.switches:
                try:
                    node.shell = None  # the namespaces are gone: nothing left to talk to
                except Exception:
                    pass

    # ---- access ----------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        """The run directory (``RUN_ROOT/<run id>``, topologies/cleanup.py); AssertionError before
        :meth:`start`."""
        assert self.state is not None, "emulation not started"
        return Path(self.state.run_dir)

    def node(self, name: str):
        """The Mininet node named ``name``. Raises EmulationError for an unknown name or a fabric
        that is not running."""
        if self.net is None or name not in self.net.nameToNode:
            raise EmulationError(f"unknown node {name!r}")
        return self.net.nameToNode[name]

    def switches(self) -> list:
        """Every switch node, in the order they were added (:meth:`ClosSpec.switches`)."""
        assert self.net is not None
        return list(self.net.switches)

    def netns(self, name: str) -> str:
        """The namespace of node ``name`` (``mrclab-<name>``). Raises EmulationError for an unknown
        node."""
        return self.node(name).netns

    def popen(self, node: str, argv: list[str], **kw) -> subprocess.Popen:
        """Start a process inside ``node``'s namespace, tracked for cleanup."""
        p = kernel.netns_popen(self.netns(node), argv, **kw)
        assert self.state is not None
        self.state.add_pid(p.pid)
        return p

    # ---- faults the emulation itself can do --------------------------------------------------
    def link_intfs(self, a: str, b: str) -> list[tuple[str, str]]:
        """(netns, interface) of both ends of the link between nodes ``a`` and ``b``."""
        assert self.net is not None
        links = self.net.linksBetween(self.node(a), self.node(b))
        if not links:
            raise EmulationError(f"no link between {a} and {b}")
        link = links[0]
        return [(link.intf1.node.netns, link.intf1.name), (link.intf2.node.netns, link.intf2.name)]

    def set_iface(self, node: str, peer: str, up: bool) -> None:
        """Set ``node``'s interface facing ``peer`` administratively up or down (the far end then
        sees its carrier go)."""
        for ns, intf in self.link_intfs(node, peer):
            if ns == self.netns(node):
                kernel.link_set(ns, intf, up=up)

    def restart_switch(self, name: str) -> None:
        """Start a killed BMv2 switch again (no pipeline: the controller must reprogram it)."""
        sw = self.node(name)
        if not isinstance(sw, Bmv2Switch):
            raise EmulationError(f"{name} is not a bmv2 switch")
        sw.kill()
        sw.start()
        assert sw.proc is not None and self.state is not None
        self.state.add_pid(sw.proc.pid)
        sw.wait_ready()
