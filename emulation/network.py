"""The Mininet builder: hosts and switches of a :class:`ClosSpec` as network namespaces and veths.

Every node runs in its own network namespace, attached under the name ``mrclab-<node>``
(emulation/nodes.py has the node classes), and every namespace and process is recorded as it is
made (emulation/cleanup.py), so cleanup finds exactly what this project made.

This module only builds and runs the emulation; programming the switches is the controller's job.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mrclab.emulation import kernel
from mrclab.emulation.cleanup import PIN_ROOT, RUN_ROOT, RunState, cleanup_run, live_runs, netns_name, stop_processes
from mrclab.emulation.cluster import (
    PreMadeLink,
    RemoteBmv2Switch,
    check_underlay,
    veth_line,
    vxlan_lines,
)
from mrclab.emulation.dataplanes import EMULATED, EmulatedDataPlane
from mrclab.emulation.nodes import (
    Bmv2Switch,
    EmulationError,
    FabricBusy,
    NicHost,
    need_root,
)
from mrclab.emulation.placement import Placement
from mrclab.emulation.servers import OnServer, Server, ServerError, Ssh, preflight, require
from mrclab.protocol.headers import MTU
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import NotAvailable
from mrclab.topologies.spec import ClosSpec, is_host

#: Remote switch shells started at once (:meth:`Emulation._start_remote_switches`): each waits on
#: ssh and its server, not on this machine's CPU.
REMOTE_STARTS = 8


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



#: The largest frame a fabric carries unless told otherwise (bytes): an Ethernet MTU's, which the
#: default 1 KiB payload's frames (1,178 bytes) fit.
FRAME_BYTES = 1500


def nic_queue_bytes(link, frame_bytes: int = FRAME_BYTES) -> int:
    """Bytes a shaped link's ``tbf`` holds (a host NIC port's queue: :meth:`Emulation._shape`): the
    link's ``queue_packets`` frames of ``frame_bytes`` (at least :data:`FRAME_BYTES`)."""
    return link.queue_packets * max(FRAME_BYTES, frame_bytes)


def nic_queue_s(link, frame_bytes: int = FRAME_BYTES) -> float:
    """The longest a packet can wait in a host NIC port's ``tbf`` (s): :func:`nic_queue_bytes` at
    the host links' rate; 0 when they are unshaped."""
    return nic_queue_bytes(link, frame_bytes) * 8 / (link.bandwidth_mbps * 1e6) if link.bandwidth_mbps > 0 else 0.0

class Emulation:
    """A running fabric's nodes and links. Use as a context manager; :meth:`stop` always cleans up.

    ``progress`` receives one short line per step. Raises :class:`EmulationError` when another
    fabric of this project is running or a node fails to start; what was built is removed first.
    """

    def __init__(
        self,
        spec: ClosSpec,
        dataplane: str | EmulatedDataPlane = "linux",
        *,
        debug: bool = False,
        progress: Callable[[str], None] | None = None,
        thrift_port: int | None = None,
        switch_queues: bool = False,
        bmv2_build: str | None = None,
        placement: Placement | None = None,
        ssh: Ssh | None = None,
        frame_bytes: int = FRAME_BYTES,
        nic_slack_bytes: int = 0,
    ) -> None:
        """Check what the fabric needs; builds nothing until :meth:`start`.

        ``dataplane``: one of :data:`DATAPLANES`; ``debug``: BMv2 per-packet logs and pcaps in the
        run directory; ``thrift_port``: BMv2's Thrift runtime port in each switch's namespace
        (bmv2 only; None: no Thrift); ``switch_queues``: the switches queue themselves, so only
        host NIC ports get a ``tbf`` (implied by a Thrift port); ``bmv2_build``: "forwarding" or
        "logging" (None: the forwarding build, the logging one with ``debug``); ``placement``: the
        planes on other servers (emulation/cluster.py; None: all on this machine), reached over
        ``ssh``; ``frame_bytes``: the largest frame the run sends (bytes), which the shapers' burst
        and queues are sized for (:func:`~emulation.kernel.shaper_burst_bytes`); ``nic_slack_bytes``:
        bytes each host NIC port's ``tbf`` holds beyond its queue (:func:`nic_queue_bytes`), where
        the NIC drain watch's program admits frames at that queue itself (controller/bpf.py
        ``NicWatch``: the tbf must never refuse a frame the program scheduled). Raises
        EmulationError for an unknown data plane, NotAvailable without root or, for
        bmv2, without p4c and simple_switch_grpc, or for ``debug`` with a placement (not built yet).
        """
        if isinstance(dataplane, str):
            if dataplane not in EMULATED:
                raise EmulationError(f"data plane {dataplane!r}; allowed: {', '.join(EMULATED)}")
            dataplane = EMULATED[dataplane]
        if placement is not None and debug:
            raise NotAvailable("--debug (BMv2's per-packet log) is not built for a fabric over servers; "
                               "drop --debug or --servers")
        if placement is not None and ssh is None:
            raise EmulationError("a placement on servers needs the ssh connections to reach them")
        if placement is not None:
            placement.check(spec.planes)
        if why := dataplane.missing():
            raise NotAvailable(f"data plane {dataplane.name} needs the P4 toolchain: {why}")
        need_root()
        self.spec = spec
        self.plan = AddressPlan(spec)
        #: the data plane's emulation (emulation/dataplanes.py); :attr:`dataplane` is its name
        self.plane = dataplane
        self.dataplane = dataplane.name
        self.debug = debug
        self.bmv2_build = bmv2_build
        #: the largest frame the run sends (bytes): shapers' bursts and queues hold it
        self.frame_bytes = max(FRAME_BYTES, frame_bytes)
        self.nic_slack_bytes = nic_slack_bytes
        self.thrift_port = dataplane.thrift_port(thrift_port)
        #: the switches queue themselves (bmv2 with Thrift; linux: the controller's htb and eBPF):
        #: only host NIC ports get a tbf
        self.switch_queues = switch_queues or self.thrift_port is not None
        self.progress = progress or (lambda _msg: None)
        self.placement = placement
        self.ssh = ssh
        #: server -> how commands reach it; this machine's source address towards it
        self.remotes: dict[Server, OnServer] = {}
        self._tunnel_ports: dict[Server | None, list[tuple[str, str]]] = {}  # where -> (netns, VXLAN port)
        self.local_ip: dict[Server, str] = {}
        self.server_ip: dict[Server, str] = {}
        #: (node, peer) -> whether node's end of that link was last set up (:meth:`set_iface`)
        self.admin_up: dict[tuple[str, str], bool] = {}
        #: server -> its clock minus this machine's (s), read before the build (servers.py preflight)
        self.clock_offset_s: dict[Server, float] = {}
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
            if self.placement is not None:
                self._reach_servers()
            self._build()
        except BaseException:
            self.stop()
            raise
        self.timings["build_s"] = time.monotonic() - t0

    def _reach_servers(self) -> None:
        """Ask every server whether it can carry its planes (emulation/servers.py preflight, in
        parallel), check the underlay's MTU both ways and place each remote switch's namespace on
        its server (emulation/kernel.py). Raises ServerError, one line per problem."""
        placement, ssh, state = self.placement, self.ssh, self.state
        assert placement is not None and ssh is not None and state is not None
        self.progress(f"asking {len(placement.servers)} servers over ssh: {placement.describe(self.spec.planes)}")
        checks = preflight(ssh, list(placement.servers), self.plane.server_tools(), self.plane.server_features(),
                           self.plane.server_needs())
        require(checks)
        if self.switch_queues:  # the switches queue on their servers: each needs what that takes
            lacking = [line for c in checks for line in c.lacking({"congestion"})]
            if lacking:
                raise ServerError("; ".join(lacking))
        self.clock_offset_s = {c.server: c.offset_s or 0.0 for c in checks}
        for c in checks:
            self.progress(f"{c.server.name}: clock {c.offset_s * 1e3:+.1f} ms from here (read over a "
                          f"{(c.rtt_s or 0) * 1e3:.1f} ms round trip)" if c.offset_s is not None else c.server.name)
        state.ssh_config = str(ssh.ssh_config) if ssh.ssh_config else None
        state.save()
        for server in placement.servers:
            remote = self.remotes[server] = OnServer(ssh, server)
            self.server_ip[server] = remote.address()
            self.local_ip[server] = check_underlay(remote, self.server_ip[server], MTU)
        for sw in self.spec.switches():
            if (on := placement.server_of(sw)) is not None:
                kernel.place(netns_name(sw), self.remotes[on])
        self.plane.prepare_servers(self, state)

    def make_remote_dirs(self, state, pins: bool = False) -> None:
        """A folder of the run on each server (recorded for cleanup first; with ``pins``, its folder
        of pinned programs and maps under bpffs too, which the queue agent makes). Raises
        ServerError when a server cannot make it."""
        assert self.placement is not None
        for server in self.placement.servers:
            state.add_remote_dir(server, self.remote_dir(server))
            if pins:
                state.add_remote_dir(server, self.pin_dir(server))
            r = self.remotes[server].run(["mkdir", "-p", self.remote_dir(server)])
            if r.returncode != 0:
                raise ServerError(f"{server.name}: cannot make {self.remote_dir(server)}: {r.stderr.strip()}")

    def _build(self) -> None:
        spec, plan = self.spec, self.plan
        state = self.state
        assert state is not None, "start() records the run before it builds"
        self.net = net = Mininet(topo=None, build=False, controller=None, link=Link, autoSetMacs=False)
        self.progress(f"creating {spec.n_hosts} hosts and {spec.n_switches} {self.dataplane} switches")
        for h in spec.hosts():
            self._track(net.addHost(h, cls=NicHost))
        remote = self._start_remote_switches()
        for sw in spec.switches():
            server = self.server_of(sw)
            if server is not None:
                node = remote[sw]
                net.switches.append(node)  # Mininet's addSwitch, for a node made beforehand
                net.nameToNode[sw] = node
            else:
                node = self.plane.local_switch(self, net, sw, state)
            self._track(node, server)
        self.progress(f"creating {spec.n_links} links")
        links = []
        tunnels: dict[Server | None, list[str]] = {}
        for vni, (a, b) in enumerate(spec.links(), start=1):
            if is_host(a):
                plane = int(b.split("-")[1])
                pa, pb = plane, plan.port_to(b, a)
                maca, macb = plan.host_mac(a, plane), plan.switch_mac(b, pb)
            else:
                pa, pb = plan.port_to(a, b), plan.port_to(b, a)
                maca, macb = plan.switch_mac(a, pa), plan.switch_mac(b, pb)
            na, nb = f"{a}-eth{pa}", f"{b}-eth{pb}"
            sa, sb = self.server_of(a), self.server_of(b)
            if sa != sb:  # across servers: a VXLAN port at each end, made below in one batch per server
                for here, name, mac, there in ((sa, na, maca, sb), (sb, nb, macb, sa)):
                    far = self.server_ip[there] if there is not None else self.local_ip[here]  # type: ignore[index]
                    tunnels.setdefault(here, []).extend(vxlan_lines(name, mac, vni, far,
                                                                    net[a if name == na else b].pid))
                    self._tunnel_ports.setdefault(here, []).append((netns_name(a if name == na else b), name))
            elif sa is not None:  # both ends on one server: a veth pair, in that server's batch too
                tunnels.setdefault(sa, []).append(veth_line(na, maca, net[a].pid, nb, macb, net[b].pid))
            links.append((a, b, pa, pb, na, nb, maca, macb, sa is not None or sb is not None))
        if tunnels:
            n = sum(1 for lines in tunnels.values() for line in lines if "type vxlan" in line)
            self.progress(f"making {n} VXLAN ports for the links between servers and the links on them "
                          f"(one ip -batch per server)")
            with ThreadPoolExecutor(max_workers=len(tunnels)) as pool:  # the servers work in parallel
                list(pool.map(lambda item: kernel.underlay_batch(self.remotes[item[0]] if item[0] is not None
                                                                 else None, item[1]), tunnels.items()))
        for a, b, pa, pb, na, nb, maca, macb, made in links:
            # made beforehand: Mininet records the ports (up later, with the rest)
            net.addLink(a, b, port1=pa, port2=pb, intfName1=na, intfName2=nb, addr1=maca, addr2=macb,
                        **({"cls": PreMadeLink, "params1": {"up": None}, "params2": {"up": None}} if made else {}))
        net.build()
        self._configure_interfaces()
        if spec.link.bandwidth_mbps > 0 or spec.link.t0_t1_bandwidth_mbps > 0:
            self._shape()
        self.plane.start_switches(self, state)

    def _start_remote_switches(self) -> dict:
        """Every remote switch node (:class:`RemoteLinuxSrv6Switch`: a shell on its server over
        ssh), :data:`REMOTE_STARTS` at a time: each costs an ssh session's start, a round trip and
        the server's ``mnexec``, and the servers answer in parallel. Raises EmulationError when a
        server refuses one."""
        todo = [sw for sw in self.spec.switches() if self.server_of(sw) is not None]
        if not todo:
            return {}
        self.progress(f"starting {len(todo)} remote switch shells over ssh, {REMOTE_STARTS} at a time")

        ssh = self.ssh
        assert ssh is not None

        state = self.state
        assert state is not None

        def start(sw: str):
            server = self.server_of(sw)
            assert server is not None
            return self.plane.remote_switch(self, sw, server, ssh, state)

        with ThreadPoolExecutor(max_workers=REMOTE_STARTS) as pool:
            futures = {sw: pool.submit(start, sw) for sw in todo}
        made, failed = {}, []
        for sw, f in futures.items():
            try:
                made[sw] = f.result()
            except Exception as e:  # Mininet raises bare Exceptions
                failed.append(f"{sw} on {self.server_of(sw).name}: {e}")  # type: ignore[union-attr]
        if failed:
            for node in made.values():
                node.terminate()
            raise EmulationError("could not start remote switches: " + "; ".join(failed))
        return made

    def remote_dir(self, server: Server) -> str:
        """This run's folder on ``server`` (bmv2's P4Runtime sockets): ``RUN_ROOT/<run id>-on-<address>``,
        a name of its own even where servers share a file system with this machine (tests)."""
        assert self.state is not None
        return str(RUN_ROOT / f"{Path(self.state.run_dir).name}-on-{server.address}")

    def pin_dir(self, server: Server) -> str:
        """This run's folder under bpffs on ``server`` (linux's queue programs and maps, pinned
        there by its queue agent): ``PIN_ROOT/<run id>-on-<address>``, the address's dots as
        underscores (bpffs refuses a name with a dot: kernel/bpf/inode.c ``bpf_lookup``)."""
        assert self.state is not None
        return str(PIN_ROOT / f"{Path(self.state.run_dir).name}-on-{server.address}".replace(".", "_"))

    def server_of(self, node: str) -> Server | None:
        """The server node ``node`` runs on; None for this machine."""
        return self.placement.server_of(node) if self.placement is not None else None

    def _track(self, node, server: Server | None = None) -> None:
        """Record the node's process and name its namespace ``mrclab-<node>``. The name is recorded
        before it is made, so a signal between the two still leaves it to cleanup; a name that
        already exists is another run's, and is left alone. A node on a ``server`` is recorded as
        that server's (its pid is the server's: never signalled from here)."""
        assert self.state is not None
        if server is None:
            self.state.add_pid(node.pid)
        if kernel.netns_exists(node.netns):
            where = f" on {server.name}" if server is not None else ""
            clean = f"`mrclab clean --servers {server.name}`" if server is not None else "`mrclab clean`"
            raise EmulationError(f"namespace {node.netns} exists{where}, left by a crashed run: {clean} removes it")
        if server is None:
            self.state.add_netns(node.netns)
        else:
            self.state.add_remote_netns(server, node.netns)
        try:
            kernel.netns_attach(node.netns, node.pid)
        except kernel.KernelError as e:
            raise EmulationError(f"{e} (try `mrclab clean`)") from None

    def _configure_interfaces(self) -> None:
        """One ``ip -batch`` and one sysctl call per node (one script per server for the nodes on
        other servers): fast and deterministic. Each interface's received frames are steered to one
        CPU, the interfaces dealt round this machine's CPUs (kernel.steer_rx_script says why: else a
        path reorders under load); on a server, to a CPU chosen by the flow's hash."""
        assert self.net is not None
        cpus = sorted(os.sched_getaffinity(0))
        turn = itertools.count()  # every interface's received frames on one CPU, the interfaces dealt round

        def rx_cpus(intfs: list[str], remote: bool = False) -> list[int]:
            # a server's CPUs are not this machine's: there each path's frames go to one CPU by flow hash
            return [-1 if remote else cpus[next(turn) % len(cpus)] for _ in intfs]

        for node in self.net.hosts:
            intfs = [i.name for i in node.intfList() if i.name != "lo"]
            sysctls = [f"net.ipv6.conf.{i}.disable_ipv6=1" for i in intfs]
            kernel.sysctl(node.netns, sysctls)
            kernel.offloads_off(node.netns, intfs, rx_cpus(intfs))
            kernel.ip_batch(node.netns, ["link set lo up"] + [f"link set {i} mtu {MTU} up" for i in intfs])
        items = []
        rx: dict[str, tuple[list[str], list[int]]] = {}
        for node in self.net.switches:
            intfs = [i.name for i in node.intfList() if i.name != "lo"]
            sysctls = ["net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0"]
            sysctls += [f"net.ipv6.conf.{i}.accept_dad=0" for i in intfs]
            more, anchor = self.plane.switch_setup(intfs)
            sysctls += more
            items.append((node.netns, sysctls,
                          ["link set lo up"] + anchor + [f"link set {i} mtu {MTU} up" for i in intfs]))
            rx[node.netns] = (intfs, rx_cpus(intfs, self.server_of(node.name) is not None))
        kernel.configure_many(items, rx=rx)  # one script per server for the switches there

    def _shape(self) -> None:
        """``tbf`` on both ends of every link (Mininet's TCLink needs netem for the queue limit,
        which this kernel lacks): host links at ``bandwidth_mbps``, T0-T1 links at
        ``t0_t1_bandwidth_mbps`` (or the same). Burst: two of the run's largest frames, at least
        3,000 bytes (:func:`~emulation.kernel.shaper_burst_bytes`).
        Where the switches queue themselves (BMv2's own egress queues with Thrift; on linux the
        controller's htb fed by the tc eBPF program, controller/bpf.py), only the hosts' NIC
        ports are shaped here: a qdisc behind a BMv2 port would hide the queue from the P4 program."""
        link = self.spec.link
        limit = nic_queue_bytes(link, self.frame_bytes)
        per_ns: dict[str, list[str]] = {}
        switch_queues = self.switch_queues
        for a, b in self.spec.links():
            mbps = link.bandwidth_mbps if is_host(a) else (link.t0_t1_bandwidth_mbps or link.bandwidth_mbps)
            if mbps <= 0:
                continue
            for ns, intf in self.link_intfs(a, b):
                if switch_queues and not is_host(intf):
                    continue
                deeper = self.nic_slack_bytes if is_host(intf) else 0
                per_ns.setdefault(ns, []).append(f"qdisc replace dev {intf} root "
                                                 f"{kernel.tbf(mbps, limit + deeper, self.frame_bytes)}")
        where = f"host NIC ports (tbf); switch ports are {self.plane.queue_words}" if switch_queues else "tbf"
        self.progress(f"shaping links: hosts {link.bandwidth_mbps or 'unshaped'} Mb/s, T0-T1 "
                      f"{link.t0_t1_bandwidth_mbps or link.bandwidth_mbps or 'unshaped'} Mb/s ({where}, "
                      f"{link.queue_packets} packets of queue)")
        for ns, lines in per_ns.items():
            kernel.tc_batch(ns, lines)

    def nic_shaper_lines(self, host: str, mbps: float | str) -> list[str]:
        """The tc lines that set host ``host``'s NIC ports' shapers to ``mbps`` (Mb/s, or a tc rate
        such as ``"8kbit"``), their burst and queue as :meth:`_shape` made them (a tbf changed in
        place keeps its queue): ``mrclab bench fidelity --target nic`` holds a NIC's drain on
        purpose (a trickle for a set time, then the link's rate again), as a kernel whose softirq
        fell behind does."""
        limit = nic_queue_bytes(self.spec.link, self.frame_bytes) + self.nic_slack_bytes
        return [f"qdisc change dev {intf} root {kernel.tbf(mbps, limit, self.frame_bytes)}"
                for ns, intf in (x for a, b in self.spec.links() if host in (a, b) for x in self.link_intfs(a, b))
                if is_host(intf)]

    def stop(self) -> None:
        """Stop every process and remove every namespace and link this emulation made. Idempotent."""
        net, self.net = self.net, None
        if net is not None:
            for sw in net.switches:  # those on servers go with their namespaces, below
                if isinstance(sw, Bmv2Switch) and not isinstance(sw, RemoteBmv2Switch):
                    sw.kill()
        self._remove_tunnel_ports()
        state, self.state = self.state, None
        if state is not None:
            failed = cleanup_run(state, self.ssh)
            stop_processes(_node_shells())  # a node made but not yet recorded; remote nodes' ssh clients
            for line in failed:
                self.progress(f"could not clean {line}: `mrclab clean --servers ...` tries again")
        for sw in self.spec.switches():
            kernel.place(netns_name(sw), None)
        for remote in self.remotes.values():
            remote.close()
        if net is not None:
            for node in net.hosts + net.switches:
                try:
                    node.shell = None  # the namespaces are gone: nothing left to talk to
                except Exception:
                    pass

    def _remove_tunnel_ports(self) -> None:
        """Delete every VXLAN port this emulation made, before its namespaces go. A VXLAN port's
        VNI is held in the underlay namespace (the one its batch ran in) until the port is gone, and
        a namespace's ports go only when the kernel frees the namespace: in its own time, and never
        while anything still holds it. The next run's ports, with the same VNIs, then met "A VXLAN
        device with the specified VNI already exists" (CI, runs over servers one after another).
        Deleted here, the VNIs are free when :meth:`stop` returns. A port already gone is no error;
        a server that does not answer is left to :func:`cleanup_run`."""
        ports, self._tunnel_ports = self._tunnel_ports, {}
        for server, items in ports.items():
            remote = self.remotes.get(server) if server is not None else None
            if server is not None and remote is None:
                continue
            try:
                kernel.delete_links(remote, items)
            except Exception as e:  # cleanup goes on: the namespaces below take the ports with them
                self.progress(f"could not delete the VXLAN ports{f' on {server.name}' if server else ''}: {e}")

    # ---- access ----------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        """The run directory (``RUN_ROOT/<run id>``, emulation/cleanup.py); AssertionError before
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
        sees its carrier go). A link between servers is VXLAN, whose ports have no carrier: its
        host's end is up only while both ends were set up, as a veth's carrier is, and the host's
        endpoint reads that as its carrier (ETHTOOL_GLINK); the switch's end follows its own
        setting (its routes go out of it, and what it sends a host that is down is lost there)."""
        self.admin_up[(node, peer)] = up
        crossing = self.server_of(node) != self.server_of(peer)
        for ns, intf in self.link_intfs(node, peer):
            if not crossing:
                if ns == self.netns(node):
                    kernel.link_set(ns, intf, up=up)
            elif is_host(intf):
                host, switch = (node, peer) if is_host(node) else (peer, node)
                kernel.link_set(ns, intf, up=self.admin_up.get((host, switch), True)
                                and self.admin_up.get((switch, host), True))
            elif ns == self.netns(node):
                kernel.link_set(ns, intf, up=up)

    def restart_switch(self, name: str) -> None:
        """Start a killed BMv2 switch again (no pipeline: the controller must reprogram it)."""
        sw = self.node(name)
        if not isinstance(sw, Bmv2Switch):
            raise EmulationError(f"{name} is not a bmv2 switch")
        sw.kill()
        sw.start()
        assert self.state is not None
        if sw.proc is not None:  # one on a server is that server's
            self.state.add_pid(sw.proc.pid)
        sw.wait_ready()
