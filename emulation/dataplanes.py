"""How the emulation builds each data plane's switches: one class per data plane (the emulation's
half of it; controller/dataplanes.py adds the controller's half and is what callers choose).

* :class:`Bmv2Emulated`: each switch a ``simple_switch_grpc`` process (a Mininet node whose ports
  BMv2 owns), started after the links exist, on this machine or on a server;
* :class:`LinuxEmulated`: each switch a namespace whose kernel forwards on static IPv6 routes, its
  uN SID a tc eBPF program (controller/bpf.py).

Nothing outside these classes asks which data plane it is by name.
"""

from __future__ import annotations

from mrclab.emulation.cluster import RemoteBmv2Switch, RemoteLinuxSrv6Switch
from mrclab.emulation.nodes import Bmv2Switch, LinuxSrv6Switch, bmv2_binary, bmv2_device, toolchain_missing
from mrclab.emulation.servers import BMV2_TOOLS


#: A server's python3 can load libbpf (the linux queue agent's one need beyond the tools: it loads
#: every switch's tc eBPF programs there, the uN SID's among them).
LIBBPF_TEST = "python3 -c 'import ctypes; ctypes.CDLL(\"libbpf.so.1\")'"
#: A server's simple_switch_grpc serves Thrift (bmv2's switch queues there).
BMV2_THRIFT_TEST = "simple_switch_grpc --help 2>&1 | grep -q -- --thrift-port"


class EmulatedDataPlane:
    """The emulation's half of a data plane. ``name`` is what scenarios, results folders and run
    records call it; ``switch_processes``: each switch is a process of its own (started, watched for
    CPU starvation, killed and restarted by faults)."""

    name = ""
    switch_processes = False
    #: what a switch port's queue is, in the emulation's progress line
    queue_words = ""

    def missing(self) -> str | None:
        """What this machine lacks to emulate the data plane (None: nothing)."""
        return None

    def server_tools(self) -> dict[str, str]:
        """Tools a server needs beyond the common ones (emulation/servers.py ``TOOLS``), with why."""
        return {}

    def server_features(self) -> dict[str, tuple[str, str]]:
        """Features that need more of a server than its tools: feature -> (a shell test that
        exits 0 where the server has it, how to mend it)."""
        return {}

    def server_needs(self) -> dict[str, tuple[str, str]]:
        """What a server needs beyond its tools to carry the data plane's switches at all, in the
        shape of :meth:`server_features`; a server that fails a test carries no fabric."""
        return {}

    def local_switch(self, emu, net, sw: str, state):
        """Add switch ``sw`` to Mininet ``net`` on this machine and return its node."""
        raise NotImplementedError

    def remote_switch(self, emu, sw: str, server, ssh, state):
        """Switch ``sw``'s node on ``server`` (reached over ``ssh``)."""
        raise NotImplementedError

    def switch_setup(self, intfs: list[str]) -> tuple[list[str], list[str]]:
        """(extra sysctls, extra ``ip`` lines before the ports come up) for a switch's namespace."""
        return [], []

    def prepare_servers(self, emu, state) -> None:
        """Anything a switch of this data plane needs on each server before it starts."""

    def start_switches(self, emu, state) -> None:
        """Start the switches once their links exist (processes: started and waited for)."""

    def thrift_port(self, port: int | None) -> int | None:
        """The Thrift port the switches serve (None: none)."""
        return None


class Bmv2Emulated(EmulatedDataPlane):
    """BMv2 ``simple_switch_grpc``, one process per switch, owning its ports."""

    name = "bmv2"
    switch_processes = True
    queue_words = "BMv2's own queues"

    def missing(self) -> str | None:
        """Why this machine cannot run BMv2 (p4c and simple_switch_grpc on PATH), or None."""
        return toolchain_missing()

    def server_tools(self) -> dict[str, str]:
        """simple_switch_grpc on each server."""
        return dict(BMV2_TOOLS)

    def server_features(self) -> dict[str, tuple[str, str]]:
        """Switch queues: the server's ``simple_switch_grpc`` serves Thrift (queue rates and depths,
        the ``qocc`` register; emulation/cluster.py ``SWITCH_HELPER`` relays it)."""
        return {"congestion": (BMV2_THRIFT_TEST, "its simple_switch_grpc has no Thrift runtime: build BMv2 "
                                                 "--with-thrift (vagrant/build-toolchain.sh does)")}

    def local_switch(self, emu, net, sw: str, state):
        """A :class:`~emulation.nodes.Bmv2Switch` node (started later, by :meth:`start_switches`)."""
        return net.addSwitch(sw, cls=Bmv2Switch, device_id=bmv2_device(emu.spec, sw), run_dir=state.run_dir,
                             debug=emu.debug, thrift_port=emu.thrift_port, build=emu.bmv2_build)

    def remote_switch(self, emu, sw: str, server, ssh, state):
        """A :class:`~emulation.cluster.RemoteBmv2Switch` on ``server``."""
        return RemoteBmv2Switch(sw, server=server, ssh=ssh, remote=emu.remotes[server],
                                remote_dir=emu.remote_dir(server), device_id=bmv2_device(emu.spec, sw),
                                run_dir=state.run_dir, thrift_port=emu.thrift_port, build=emu.bmv2_build)

    def switch_setup(self, intfs: list[str]) -> tuple[list[str], list[str]]:
        """BMv2 owns the ports: the kernel's IPv6 is kept off them."""
        return [f"net.ipv6.conf.{i}.disable_ipv6=1" for i in intfs], []

    def prepare_servers(self, emu, state) -> None:
        """The switches' sockets live in a folder of the run on each server."""
        emu.make_remote_dirs(state)

    def start_switches(self, emu, state) -> None:
        """Start every switch process, record local pids for cleanup, wait until each answers."""
        binary, build = bmv2_binary(emu.debug, emu.bmv2_build)
        emu.progress(f"starting {emu.spec.n_switches} simple_switch_grpc processes ({build}: {binary})")
        for sw in emu.switches():
            sw.start()
            if sw.proc is not None:  # a switch on a server is that server's: cleanup goes there
                state.add_pid(sw.proc.pid)
        for sw in emu.switches():
            sw.wait_ready()

    def thrift_port(self, port: int | None) -> int | None:
        """``port``: BMv2 serves its Thrift runtime there (queue rates, registers)."""
        return port


class LinuxEmulated(EmulatedDataPlane):
    """A namespace per switch: the kernel forwards, tc eBPF programs do uN and the queues."""

    name = "linux"
    queue_words = "htb fed by the tc eBPF program"

    def server_needs(self) -> dict[str, tuple[str, str]]:
        """libbpf: a switch's uN SID is a tc eBPF program (bpfsrc/port_queue.bpf.c ``mrclab_un``),
        which the server's queue agent (controller/bpfmaps.py) loads with the server's own libbpf,
        from its python3; without it no switch there forwards (and none queues: switch queues and
        gray loss are the same agent's)."""
        return {"libbpf": (LIBBPF_TEST, "its switches' uN SID and queues are tc eBPF programs its queue agent "
                                        "loads with libbpf: apt-get install -y libbpf1")}

    def local_switch(self, emu, net, sw: str, state):
        """A :class:`~emulation.nodes.LinuxSrv6Switch` node."""
        return net.addSwitch(sw, cls=LinuxSrv6Switch)

    def remote_switch(self, emu, sw: str, server, ssh, state):
        """A :class:`~emulation.cluster.RemoteLinuxSrv6Switch` on ``server``."""
        return RemoteLinuxSrv6Switch(sw, server=server, ssh=ssh)

    def prepare_servers(self, emu, state) -> None:
        """Where the switches queue, a folder of the run on each server (the queue program's
        object) and its pins under bpffs, recorded for cleanup."""
        if emu.switch_queues:
            emu.make_remote_dirs(state, pins=True)



#: The emulation's data planes by name (controller/dataplanes.py's ``DATAPLANES`` extend these).
EMULATED: dict[str, EmulatedDataPlane] = {p.name: p for p in (Bmv2Emulated(), LinuxEmulated())}
