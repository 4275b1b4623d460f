"""BMv2's Thrift runtime: what P4Runtime cannot do. Egress queue rates and depths per (port,
priority) (``set_egress_priority_queue_rate`` / ``_depth``, BMv2's ``simple_switch.thrift``) and
reading a whole register array (``bm_register_read_all``), for the per-port queue count.

Each switch serves Thrift on :data:`THRIFT_PORT` inside its own network namespace, so a client's
socket is opened from inside that namespace (pyroute2's ``pushns``, which moves only the calling
thread) and used from here. The client classes are those BMv2 generates and installs with its
Thrift runtime (Python packages ``bm_runtime`` and ``sswitch_runtime``, in the Python site-packages
of the prefix ``simple_switch_grpc`` was installed into: :func:`client_path` finds them there, so a
toolchain built after setup.sh needs nothing more); :func:`thrift_missing` says why they cannot be
used.
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from mrclab.emulation import kernel
from mrclab.topologies.errors import RunFailed

#: The Thrift port of every switch (one per namespace, so they never clash).
THRIFT_PORT = 9090
#: Name of the register array of low-priority packets per port (p4src/mrclab.p4).
QOCC_REGISTER = "qocc"
#: The drain watch's register arrays (p4src/mrclab.p4): the schedule's gap per port (us, written
#: here), packets that left more than a gap late (since start), the most any left late (us, since
#: the last reset) and the low-priority packets that left (since start).
GAP_REGISTER, LATE_REGISTER, LATE_MAX_REGISTER, SENT_REGISTER = "q_gap", "q_late", "q_late_max", "q_sent"


def gap_us(rate_pps: int) -> int:
    """The time between two departures of a queue at ``rate_pps`` packets a second (us, rounded
    down as BMv2 rounds its own to whole nanoseconds: never later than BMv2's schedule); 0 for an
    unlimited queue (not watched)."""
    return 1_000_000 // rate_pps if rate_pps > 0 else 0


class ThriftError(RunFailed):
    """A switch's Thrift runtime could not be reached or refused a call."""


def client_path(binary: str | None = None) -> Path | None:
    """The folder holding BMv2's Thrift client (``sswitch_runtime``, ``bm_runtime``) beside the prefix
    of ``binary`` (default: ``simple_switch_grpc`` on PATH; BMv2's ``make install`` puts them in
    ``<prefix>/lib/python3.X/site-packages`` or ``dist-packages``), put on ``sys.path`` if it was not;
    None where there is none."""
    binary = binary or shutil.which("simple_switch_grpc")
    if binary is None:
        return None
    prefix = Path(binary).resolve().parent.parent
    found = sorted(prefix.glob("lib/python3*/*-packages/sswitch_runtime"), reverse=True)
    if not found:
        return None
    folder = found[0].parent
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    return folder


@functools.cache
def thrift_missing() -> str | None:
    """None when BMv2 serves Thrift and its Python client is importable, else why not."""
    if shutil.which("simple_switch_grpc") is None:
        return "simple_switch_grpc is not on PATH"
    client_path()
    r = subprocess.run(["simple_switch_grpc", "--help"], capture_output=True, text=True)
    if "--thrift-port" not in r.stdout + r.stderr:
        return "this simple_switch_grpc was built --without-thrift (rebuild BMv2 with its Thrift runtime)"
    try:
        import sswitch_runtime.SimpleSwitch  # noqa: F401
        import thrift  # noqa: F401
        from bm_runtime.standard import Standard  # noqa: F401
    except ImportError as e:
        return (f"BMv2's Thrift client is not importable ({e}): its sswitch_runtime is looked for in the "
                "site-packages of simple_switch_grpc's prefix, thrift is Debian's python3-thrift (setup.sh)")
    return None


class SwitchThrift:
    """A Thrift session with the BMv2 switch in namespace ``netns``, or, for a switch on a server,
    through the unix socket ``unix_path`` that ssh forwards to its Thrift runtime there
    (emulation/cluster.py ``SWITCH_HELPER``)."""

    def __init__(self, name: str, netns: str, port: int = THRIFT_PORT, unix_path: str | None = None) -> None:
        """Connect to switch ``name``'s Thrift runtime on ``port`` inside ``netns`` (or at
        ``unix_path``). Raises ThriftError when nothing answers within 5 s, ImportError without
        BMv2's Python client (:func:`thrift_missing` says why)."""
        client_path()
        from bm_runtime.standard import Standard
        from sswitch_runtime import SimpleSwitch
        from thrift.protocol import TBinaryProtocol, TMultiplexedProtocol
        from thrift.transport import TSocket, TTransport

        self.name = name
        try:
            if unix_path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(5)
                sock.connect(unix_path)
            else:
                with kernel.inside(netns):
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as e:
            where = f"through {unix_path}" if unix_path is not None else f"on port {port} in {netns}"
            raise ThriftError(f"{name}: no Thrift runtime {where} ({e})") from None
        sock.settimeout(10)
        tsock = TSocket.TSocket()
        tsock.handle = sock  # already connected, inside the switch's namespace
        self.transport = TTransport.TBufferedTransport(tsock)
        proto = TBinaryProtocol.TBinaryProtocol(self.transport)
        self.sswitch = SimpleSwitch.Client(TMultiplexedProtocol.TMultiplexedProtocol(proto, "simple_switch"))
        self.standard = Standard.Client(TMultiplexedProtocol.TMultiplexedProtocol(proto, "standard"))

    def set_queue(self, port: int, priority: int, rate_pps: int, depth: int) -> None:
        """Egress queue (``port``, ``priority``): ``rate_pps`` (0: unlimited) and ``depth`` packets."""
        try:
            self.sswitch.set_egress_priority_queue_depth(port, priority, depth)
            self.sswitch.set_egress_priority_queue_rate(port, priority, rate_pps)
        except Exception as e:  # thrift raises its own exception types
            raise ThriftError(f"{self.name}: queue ({port}, {priority}) refused: {e}") from None

    def set_gap(self, port: int, rate_pps: int) -> None:
        """Tell the drain watch ``port``'s low-priority rate (:func:`gap_us`). Raises ThriftError."""
        try:
            self.standard.bm_register_write(0, GAP_REGISTER, port, gap_us(rate_pps))
        except Exception as e:
            raise ThriftError(f"{self.name}: register {GAP_REGISTER}[{port}] refused: {e}") from None

    def late(self) -> tuple[list[int], list[int], list[int]]:
        """The drain watch now: per port, packets that left more than a frame time after their
        schedule (since start), the most any left after it since the last call (us; that maximum
        starts again from 0), and the low-priority packets that left (since start). Raises
        ThriftError."""
        late, most = self.register(LATE_REGISTER), self.register(LATE_MAX_REGISTER)
        sent = self.register(SENT_REGISTER)
        try:
            self.standard.bm_register_reset(0, LATE_MAX_REGISTER)
        except Exception as e:
            raise ThriftError(f"{self.name}: register {LATE_MAX_REGISTER} not reset: {e}") from None
        return late, most, sent

    def register(self, name: str) -> list[int]:
        """Every cell of register array ``name``."""
        try:
            return list(self.standard.bm_register_read_all(0, name))
        except Exception as e:
            raise ThriftError(f"{self.name}: register {name} unreadable: {e}") from None

    def close(self) -> None:
        """Close the session (errors ignored)."""
        try:
            self.transport.close()
        except Exception:
            pass


def session(emu, switch: str) -> SwitchThrift:
    """A new Thrift session with ``switch`` of emulation ``emu``, wherever it runs (here: inside its
    namespace; on a server: through its forwarded socket). Raises as :class:`SwitchThrift`."""
    return SwitchThrift(switch, emu.netns(switch), unix_path=emu.node(switch).thrift_addr)
