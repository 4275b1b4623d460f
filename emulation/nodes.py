"""The fabric's nodes as Mininet node classes, each in its own network namespace named
``mrclab-<node>`` (so ``ip -n``, ``ip netns exec`` and sockets opened from Python reach it):

* :class:`NicHost`: one interface per plane (``hN-eth{p}``), MAC from the address plan, IPv6 off
  on the NIC ports (the MRC endpoint owns them through raw sockets; no ND or MLD chatter), offloads
  off.
* :class:`LinuxSrv6Switch`: forwarding on, DAD off; the controller writes its routes and loads its
  uN SID (a tc eBPF program on every port's ingress).
* :class:`Bmv2Switch`: ``simple_switch_grpc`` inside the namespace, ports ``{port}@{sw}-eth{port}``,
  P4Runtime on a unix socket in the run directory (no TCP port clashes between 16 switches), no
  per-packet logging unless ``debug``; with its Thrift runtime on a port of its own namespace and
  two strict-priority egress queues per port when the build has Thrift.

Also what decides which data plane this machine can run (:func:`toolchain_missing`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from mininet.node import Host, Switch
from mrclab.emulation import kernel
from mrclab.emulation.cleanup import netns_name
from mrclab.topologies.errors import NotAvailable, RunFailed
from mrclab.topologies.spec import ClosSpec

BMV2_BINARY = "simple_switch_grpc"
#: Where vagrant/build-toolchain.sh installs BMv2's logging build, relative to the prefix of the
#: forwarding build on PATH (``<prefix>/bin/simple_switch_grpc``): p4lang's default flags, with the
#: logging macros and the event logger, for ``--debug``'s per-packet log.
LOGGING_BUILD = Path("lib") / "mrclab" / "bmv2-logging" / "bin" / BMV2_BINARY


class EmulationError(RunFailed):
    """The emulation could not be built or a node misbehaved; the message says which."""


class FabricBusy(EmulationError):
    """Another fabric of this project is running; two would collide on namespace names."""


def need_root(what: str = "building the fabric") -> None:
    """Raise :class:`NotAvailable` unless this process is root (network namespaces need it)."""
    if os.geteuid() != 0:
        raise NotAvailable(f"{what} needs root (network namespaces); run it with sudo")


def bmv2_device(spec: ClosSpec, switch: str) -> int:
    """P4Runtime device id of ``switch``: its index in :meth:`ClosSpec.switches`."""
    return spec.switches().index(switch)


def bmv2_grpc_addr(run_dir: str | Path, switch: str) -> str:
    """P4Runtime address of ``switch``: a unix socket in the run directory (no TCP port clashes
    between 16 switches)."""
    return f"unix:{Path(run_dir) / (switch + '.grpc')}"


def toolchain_missing() -> str | None:
    """None when p4c and simple_switch_grpc are on PATH, else the reason bmv2 cannot run."""
    missing = [b for b in ("p4c", BMV2_BINARY) if shutil.which(b) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def bmv2_binary(debug: bool = False, build: str | None = None) -> tuple[str, str]:
    """(the ``simple_switch_grpc`` to run, which build it is). The one on PATH is the forwarding
    build (vagrant/build-toolchain.sh: ``--disable-logging-macros --disable-elogger``, -O3); with
    ``debug`` the logging build beside it (:data:`LOGGING_BUILD`) when it is installed, since the
    forwarding build compiled its per-packet log out. ``build`` ("forwarding" or "logging") asks
    for one build whatever ``debug`` says (mrclab bench fabric measures both). Raises
    :class:`NotAvailable` when none is on PATH, or the build asked for is not installed."""
    found = shutil.which(BMV2_BINARY)
    if found is None:
        raise NotAvailable(f"{BMV2_BINARY} is not on PATH (vagrant/build-toolchain.sh builds it)")
    logging = Path(found).resolve().parent.parent / LOGGING_BUILD
    if build == "logging" and not logging.exists():
        raise NotAvailable(f"BMv2's logging build is not installed ({logging}); vagrant/build-toolchain.sh builds it")
    if build == "forwarding":
        return found, "forwarding build" if logging.exists() else "the only build installed"
    if (debug or build == "logging") and logging.exists():
        return str(logging), "logging build"
    if logging.exists():
        return found, "forwarding build"
    return found, "the only build installed (its flags unknown: vagrant/build-toolchain.sh builds both)"


class _NsNode:
    """Mixin: the node's namespace under the name ``mrclab-<node>``."""

    name: str
    pid: int

    @property
    def netns(self) -> str:
        return netns_name(self.name)


class NicHost(_NsNode, Host):
    """A host NIC with one port per plane. IP configuration is left to the MRC endpoint."""

    def config(self, **params):
        """Mininet's per-node configuration hook, a no-op: the emulation sets the NIC ports up and
        the endpoint owns them. Returns an empty dict (Mininet's "results")."""
        return {}


class LinuxSrv6Switch(_NsNode, Switch):
    """A switch that is a namespace whose kernel forwards on static IPv6 routes, its uN SID a tc eBPF
    program on every port's ingress (bpfsrc/port_queue.bpf.c ``mrclab_un``)."""

    def __init__(self, name: str, **params) -> None:
        """Switch node ``name`` in a namespace of its own (Mininet ``params`` pass through)."""
        params["inNamespace"] = True
        super().__init__(name, **params)

    def start(self, controllers) -> None:
        """Mininet's start hook, a no-op: the kernel forwards, and the controller writes the routes."""
        pass

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's name
        """Mininet's stop: the node's shell and, with ``deleteIntfs``, its interfaces."""
        super().stop(deleteIntfs)


class Bmv2Switch(_NsNode, Switch):
    """``simple_switch_grpc`` in the node's namespace, started with no P4 program (``--no-p4``)."""

    def __init__(self, name: str, device_id: int = 0, run_dir: str = "/tmp", debug: bool = False,
                 thrift_port: int | None = None, build: str | None = None, **params) -> None:
        """Switch node ``name`` (nothing started yet): ``device_id`` its P4Runtime device id,
        ``run_dir`` where its socket and logs go, ``debug`` per-packet logs and pcaps,
        ``thrift_port`` its Thrift runtime's port (None: no Thrift, one egress queue per port),
        ``build`` which BMv2 build (:func:`bmv2_binary`; None: as ``debug`` says)."""
        params["inNamespace"] = True
        super().__init__(name, **params)
        self.device_id = device_id
        self.run_dir = Path(run_dir)
        self.debug = debug
        self.thrift_port = thrift_port
        self.build = build
        self.proc: subprocess.Popen | None = None

    @property
    def grpc_addr(self) -> str:
        """Its P4Runtime address: ``unix:<run_dir>/<name>.grpc``."""
        return bmv2_grpc_addr(self.run_dir, self.name)

    @property
    def listen_addr(self) -> str:
        """Where the switch itself listens for P4Runtime: :attr:`grpc_addr` on this machine."""
        return self.grpc_addr

    @property
    def thrift_addr(self) -> str | None:
        """A unix socket here that reaches its Thrift runtime; None: connect to :attr:`thrift_port`
        inside its namespace (this machine's switches)."""
        return None

    @property
    def control_addr(self) -> str | None:
        """A unix socket here for the PFC agent's asks of a switch on a server; None here."""
        return None

    def binary(self) -> str:
        """The ``simple_switch_grpc`` to run (:func:`bmv2_binary`)."""
        return bmv2_binary(self.debug, self.build)[0]

    def command(self) -> list[str]:
        """The ``simple_switch_grpc`` argv: every port as ``N@<intf>``, logs as ``debug`` says, Thrift
        when ``thrift_port`` is set, P4Runtime on :attr:`listen_addr`, two priority queues per port."""
        cmd = [self.binary(), "--no-p4", "--device-id", str(self.device_id)]
        for intf in self.intfList():
            if intf.name != "lo":
                cmd += ["-i", f"{self.ports[intf]}@{intf.name}"]
        if self.debug:
            cmd += ["--log-file", str(self.run_dir / f"{self.name}.log"), "--log-flush",
                    "--pcap", str(self.run_dir)]
        else:
            # BMv2's default level is trace even with no log sink: every log point is formatted and
            # thrown away, which costs more than half of a packet's CPU. Warnings and errors still
            # reach <run_dir>/<switch>.out.
            cmd += ["--log-console", "--log-level", "warn"]
        if self.thrift_port is not None:  # BMv2's Thrift runtime: queue rates and depths (controller/thrift.py)
            cmd += ["--thrift-port", str(self.thrift_port)]
        # a target option, with Thrift or without: p4src/mrclab.p4 puts trimmed packets and every
        # control packet (ACK, SACK, NACK, probes' replies) on priority 1 (keep_high), and BMv2
        # drops a packet whose priority has no queue ("Priority out of range"): with one queue a
        # switch without Thrift dropped every ACK, and no message was ever acknowledged
        cmd += ["--", "--grpc-server-addr", self.listen_addr, "--priority-queues", "2"]
        return cmd

    def start(self, controllers=None) -> None:
        """Start ``simple_switch_grpc`` inside the node's namespace, its output appended to
        ``<run_dir>/<name>.out``; returns at once (:meth:`wait_ready` waits). ``controllers``:
        Mininet's, unused."""
        sock = Path(self.grpc_addr[len("unix:"):])
        sock.unlink(missing_ok=True)
        log = open(self.run_dir / f"{self.name}.out", "ab")
        self.proc = kernel.netns_popen(
            self.netns, self.command(),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        """Wait until the P4Runtime socket exists. Raises EmulationError if the process died."""
        sock = Path(self.grpc_addr[len("unix:"):])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                out = (self.run_dir / f"{self.name}.out").read_text(errors="replace")[-600:]
                raise EmulationError(f"{self.name}: {BMV2_BINARY} exited with {self.proc.returncode}: {out}")
            if sock.exists():
                return
            time.sleep(0.01)
        raise EmulationError(f"{self.name}: {BMV2_BINARY} did not open {sock} within {timeout_s} s")

    def kill(self) -> None:
        """Kill the switch process (a crashed switch); the namespace and links stay."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's name
        """SIGTERM the switch process (SIGKILL if it is still there after 3 s), then Mininet's stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None
        super().stop(deleteIntfs)
