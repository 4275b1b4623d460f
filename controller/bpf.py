"""The linux data plane's switch queues: bpfsrc/port_queue.bpf.c compiled by clang into a cache,
loaded with libbpf (through ctypes: libbpf.so.1 is Debian's ``libbpf1``) once per switch, attached
to the egress (tc clsact, direct action) of every switch port, configured from the queue plan.

Each switch port's real queue becomes an ``htb`` with two classes, each at the link's rate on its
own as BMv2's two priority queues are (controller/queues.py): 1:10 (trimmed and control packets)
and 1:20 (data, a ``bfifo``: bytes, as the virtual queue counts), 1:10 a ``pfifo``; the program
puts a packet in one or the other through
``skb->priority``. A trimmed packet thus skips the data queue it would have waited in, and the
headers never slow the data class down (a port passing both can exceed its rate by its headers'
share, as on BMv2; with the classes sharing one rate, measured: trimmed headers took a quarter of
a 3x-overloaded port and the real data queue overflowed behind a virtual one that drained at full
rate). The program's *virtual* queue (per port: bytes in units of a full data frame, drained at
the port's rate in full frames per second) decides marking, trimming and the queue-full drop; htb
does the real rate limiting, also in bytes, so the two agree whatever the frames' sizes, but for
the jitter of htb's token bucket: the data fifo is ``QUEUE_SLACK`` full frames deeper than the
program's limit. Until 2026-11-28 the virtual queue counted packets, as BMv2's queue does (its rate
is in packets per second, so there a short frame takes a full frame's time); where data frames
are short (RoCE's 16 QPs each writing a 64-byte share of a 1 KiB ring step) it read five times the
queue htb held, and marked, trimmed and paused for it. BMv2 keeps that approximation: a queue
rate in packets is all its queues have.

Errors: :class:`BpfError` (a :class:`~topologies.errors.RunFailed`) with the step and the reason;
:func:`bpf_missing` says what this machine lacks (clang, libbpf, the BPF syscall).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from mrclab.controller import bpfmaps
from mrclab.emulation import kernel
from mrclab.emulation.servers import OnServer
from mrclab.topologies.errors import RunFailed

SOURCE = Path(__file__).resolve().parent.parent / "bpfsrc" / "port_queue.bpf.c"
CACHE_ROOT = Path(os.environ.get("MRCLAB_CACHE", Path.home() / ".cache" / "mrclab")) / "bpf"
#: htb classes the program chooses between (bpfsrc/port_queue.bpf.c CLASS_HIGH, CLASS_LOW).
CLASS_HIGH, CLASS_LOW = "1:10", "1:20"
#: map layouts, fixed point and flags (controller/bpfmaps.py: the loader that also runs on servers)
CFG, PFC, STATE, FP_SHIFT = bpfmaps.CFG, bpfmaps.PFC, bpfmaps.STATE, bpfmaps.FP_SHIFT
STATE_FIELDS = bpfmaps.STATE_FIELDS
T = TypeVar("T")


class BpfError(RunFailed):
    """clang or libbpf refused, or the kernel did: the message names the step and the reason."""


@dataclass(frozen=True)
class PortConfig:
    """One port's settings, as the program reads them (see bpfsrc/port_queue.bpf.c)."""

    rate_pps: int = 0
    ecn_k: int = 0
    trim_t: int = 0
    q_limit: int = 0
    loss: float = 0.0  # gray loss probability, in steps of 1/65536
    salt: int = 0
    lossless: bool = False  # PFC: no drop for a full low-priority queue
    port_no: int = 0  # the port's number on its switch (its bit in another port's PFC feeds)
    #: a full data frame (bytes): the virtual queue counts bytes in these units (0: packets)
    frame_bytes: int = 0
    #: the drain watch's schedule: the port's rate in Mb/s (0: none kept; lossless ports keep none)
    watch_mbps: float = 0.0
    #: one FIFO (a host's NIC port): the program keeps the schedule of every packet, nothing else
    fifo: bool = False

    def pack(self) -> bytes:
        """The ``struct port_cfg`` map value: eleven little-endian u32, ``loss`` as a threshold out
        of 65536, ``watch_mbps`` as a byte's time in picoseconds (:func:`ps_per_byte`)."""
        return CFG.pack(self.rate_pps, self.ecn_k, self.trim_t, self.q_limit, round(self.loss * 65536),
                        self.salt & 0xFFFFFFFF, int(self.lossless), self.port_no, self.frame_bytes,
                        ps_per_byte(self.watch_mbps), int(self.fifo))


def ps_per_byte(mbps: float) -> int:
    """A byte's time at ``mbps`` Mb/s in picoseconds (0 for no rate), as the program's schedule
    counts it: 8,000,000 at 1 Mb/s, 125,000 at 64 Mb/s. Raises ValueError below 0.002 Mb/s (the
    map's u32)."""
    if mbps <= 0:
        return 0
    ps = round(8e6 / mbps)
    if ps >= 1 << 32:
        raise ValueError(f"drain watch rate {mbps} Mb/s; allowed: at least 0.002 Mb/s")
    return ps


def bpf_missing() -> str | None:
    """Why this machine cannot run the program (clang, libbpf, headers), or None."""
    if shutil.which("clang") is None:
        return "clang is not installed (setup.sh installs it: apt-get install clang)"
    if not Path("/usr/include/bpf/bpf_helpers.h").exists():
        return "libbpf's headers are not installed (setup.sh installs them: apt-get install libbpf-dev)"
    if bpfmaps.libbpf_path() is None:
        return "libbpf.so.1 is not installed (apt-get install libbpf1)"
    if asm_include_dir() is None:
        return ("the kernel's asm headers (/usr/include/<multiarch>/asm/types.h) are not installed "
                "(setup.sh installs them with libbpf-dev: apt-get install linux-libc-dev)")
    return None


def asm_include_dir(root: Path = Path("/usr/include")) -> Path | None:
    """The directory that holds ``asm/types.h`` for this machine's architecture, or None.

    ``<linux/types.h>`` includes ``<asm/types.h>``, which Debian installs under the multiarch
    triplet (``/usr/include/x86_64-linux-gnu``); clang's BPF target does not search there by itself.
    The triplet comes from Python's own build (``sysconfig`` ``MULTIARCH``), not from gcc, which a
    fresh root that has clang does not have; failing that, the one triplet directory under
    ``root`` that has the header."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    if arch and (root / arch / "asm" / "types.h").exists():
        return root / arch
    found = sorted(d.parent.parent for d in root.glob("*/asm/types.h"))
    return found[0] if len(found) == 1 else None


def _clang_version() -> str:
    return subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def compile_bpf(src: Path = SOURCE) -> Path:
    """``src`` compiled for the BPF target, from the cache (keyed by sha256 of the source and
    clang's version) or by clang. Raises :class:`BpfError` with clang's first error."""
    if why := bpf_missing():
        raise BpfError(why)
    digest = hashlib.sha256(src.read_bytes() + _clang_version().encode()).hexdigest()[:20]
    out = CACHE_ROOT / f"{src.name.split('.')[0]}-{digest}.o"
    if out.exists():
        return out
    CACHE_ROOT.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".o", dir=CACHE_ROOT)
    os.close(fd)
    try:
        inc = [f"-I{asm_include_dir()}"]
        r = subprocess.run(["clang", "-O2", "-g", "-Wall", "-target", "bpf", *inc, "-c", str(src), "-o", tmp],
                           capture_output=True, text=True)
        if r.returncode != 0:
            said = [x for x in r.stderr.splitlines() if x.strip()]
            first = next((x for x in said if "error" in x), said[0] if said else f"exit {r.returncode}")
            raise BpfError(f"clang failed on {src}: {first.strip()}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


class SwitchBpf:
    """The programs loaded for one switch on this machine (its maps are this switch's), attached to
    ``ports`` (interface names) inside namespace ``netns``. Raises :class:`BpfError`."""

    def __init__(self, name: str, netns: str, obj_path: Path, ports: list[str], sid: bytes | None = None,
                 egress: bool = True) -> None:
        """Open and load ``obj_path`` (:func:`compile_bpf`) for switch ``name``; with ``sid`` (its uN
        SID: the 6 bytes of block | own uSID) attach the uN program to the ingress of every
        interface of ``ports`` inside ``netns``, with ``egress`` the queue program to their egress.
        Raises BpfError; what was loaded is released first."""
        self.name, self.netns, self.egress = name, netns, egress
        try:
            self.prog: bpfmaps.Program | None = bpfmaps.Program(name, str(obj_path))
        except bpfmaps.MapError as e:
            raise BpfError(str(e)) from None
        self.maps = self.prog.maps
        self.ifindex: dict[str, int] = {}  # interface name -> ifindex, the maps' key
        try:
            if sid is not None:
                try:
                    self.maps.set_sid(sid)
                except bpfmaps.MapError as e:
                    raise BpfError(f"{name}: {e}") from None
            for intf in ports:
                if sid is not None:
                    self.attach(intf, ingress=True)
                if egress:
                    self.attach(intf)
        except BaseException:
            self.close()
            raise

    def attach(self, intf: str, ingress: bool = False) -> None:
        """The queue program on ``intf``'s egress (again, after :meth:`detach`), its state kept; with
        ``ingress``, the uN program on its ingress."""
        assert self.prog is not None
        fd = self.prog.un_prog_fd if ingress else self.prog.prog_fd
        try:
            with kernel.inside(self.netns):
                idx = self.ifindex[intf] = bpfmaps.attach(self.name, fd, intf, self.prog.hooked, ingress=ingress)
            if not ingress:
                self.maps.init_port(idx)
        except bpfmaps.MapError as e:
            raise BpfError(str(e)) from None

    def detach(self, intf: str) -> None:
        """Take the program off ``intf`` (packets pass untouched; the benchmark's yardstick)."""
        try:
            with kernel.inside(self.netns):
                bpfmaps.detach(self.name, intf)
        except bpfmaps.MapError as e:
            raise BpfError(str(e)) from None

    def sid_packets(self) -> int:
        """Packets the switch's uN SID shifted (the uN program's count)."""
        try:
            return self.maps.sid_packets()
        except bpfmaps.MapError as e:
            raise BpfError(f"{self.name}: {e}") from None

    def configure(self, intf: str, cfg: PortConfig) -> None:
        """Port ``intf`` from now on follows ``cfg`` (the queue and counters carry on)."""
        try:
            self.maps.configure(self.ifindex[intf], cfg.pack())
        except bpfmaps.MapError as e:
            raise BpfError(f"{self.name}: {e}") from None

    def states(self, intfs: list[str]) -> list[dict[str, int]]:
        """Each port's counters (:data:`STATE_FIELDS`, packets since attach) and ``queue``
        (low-priority frames the virtual queue held at its last packet), in ``intfs``' order."""
        try:
            return [self.maps.state(self.ifindex[i]) for i in intfs]
        except bpfmaps.MapError as e:
            raise BpfError(f"{self.name}: {e}") from None

    def state(self, intf: str) -> dict[str, int]:
        """:meth:`states` of one port."""
        return self.states([intf])[0]

    def pfc_look(self, items: list[tuple[str, int, float, bool]]) -> list[tuple[float, int]]:
        """PFC: for each (port, its rate in frames/s, its XOFF in frames, whether the agent holds
        it), its low-priority queue now (frames) and the ports that fed it (a bit mask, read and
        cleared at or above XOFF or while held): see :meth:`bpfmaps.Maps.pfc_look`."""
        return [self.maps.pfc_look(self.ifindex[intf], rate, xoff, held) for intf, rate, xoff, held in items]

    def set_paused(self, intf: str, paused: bool) -> None:
        """PFC: ``intf`` is paused from now (``paused``) or resumes now: its virtual queue drains
        nothing for the time in between."""
        self.maps.set_paused(self.ifindex[intf], paused)

    def close(self) -> None:
        """Release the object (attached programs stay until their namespace goes)."""
        if self.prog is not None:
            self.prog.close()
            self.prog = None


class QueueAgent:
    """The queue agent on one server (controller/bpfmaps.py run there: its own source, over the
    server's ssh connection), for the switches of the run's planes on it. ``run_dir``: the run's
    folder there; ``pin_dir``: the run's folder under bpffs there (both removed by cleanup)."""

    def __init__(self, ssh, server, run_dir: str, pin_dir: str) -> None:
        """Nothing started until the first request."""
        self.on = OnServer(ssh, server, script=Path(bpfmaps.__file__).read_text())
        self.server, self.run_dir, self.pin_dir = server, run_dir, pin_dir
        self._objects: dict[Path, str] = {}  # object here -> its copy there

    def ask(self, op: str, **args):
        """Request ``op`` of the agent; its result. Raises BpfError with the agent's words, or
        ServerError when the server stops answering."""
        got = self.on.call({"op": op, **args})
        if "error" in got:
            raise BpfError(f"{self.server.name}: {got['error']}")
        return got["ok"]

    def object_there(self, obj_path: Path) -> str:
        """``obj_path``'s copy on the server (sent once)."""
        there = self._objects.get(obj_path)
        if there is None:
            there = f"{self.run_dir}/{obj_path.name}"
            self.ask("put", path=there, data=base64.b64encode(obj_path.read_bytes()).decode())
            self._objects[obj_path] = there
        return there

    def close(self) -> None:
        """Stop the agent (the programs stay attached, their maps pinned, until cleanup)."""
        self.on.close()


class RemoteSwitchBpf:
    """:class:`SwitchBpf` for a switch whose namespace ``netns`` is on a server: the same calls,
    each a request to that server's :class:`QueueAgent`, which loads the program there and pins
    it under ``<agent's pin_dir>/<name>``. Raises :class:`BpfError` (and ServerError when the
    server stops answering)."""

    def __init__(self, name: str, netns: str, obj_path: Path, ports: list[str], agent: QueueAgent,
                 sid: bytes | None = None, egress: bool = True) -> None:
        """Load ``obj_path`` for switch ``name`` on the agent's server, attached to ``ports`` as
        :class:`SwitchBpf` says of ``sid`` and ``egress``."""
        self.name, self.netns, self.agent, self.egress = name, netns, agent, egress
        self.ns_path = f"/run/netns/{netns}"
        self.pin = f"{agent.pin_dir}/{name}"
        self.ifindex: dict[str, int] = agent.ask("load", name=name, obj=agent.object_there(obj_path),
                                                 netns=self.ns_path, ports=ports, pin=self.pin,
                                                 sid=sid.hex() if sid is not None else None, egress=egress)

    def sid_packets(self) -> int:
        """:meth:`SwitchBpf.sid_packets`, read on the server."""
        return int(self.agent.ask("sid_packets", pin=self.pin))

    def attach(self, intf: str) -> None:
        """The program on ``intf``'s egress again (after :meth:`detach`), its state kept."""
        self.ifindex[intf] = self.agent.ask("attach", name=self.name, netns=self.ns_path, intf=intf, pin=self.pin)

    def detach(self, intf: str) -> None:
        """Take the program off ``intf``."""
        self.agent.ask("detach", name=self.name, netns=self.ns_path, intf=intf)

    def configure(self, intf: str, cfg: PortConfig) -> None:
        """Port ``intf`` from now on follows ``cfg``."""
        self.agent.ask("configure", pin=self.pin, idx=self.ifindex[intf], cfg=cfg.pack().hex())

    def states(self, intfs: list[str]) -> list[dict[str, int]]:
        """:meth:`SwitchBpf.states`, in one request."""
        return self.agent.ask("states", items=[[self.pin, self.ifindex[i]] for i in intfs])

    def state(self, intf: str) -> dict[str, int]:
        """:meth:`states` of one port."""
        return self.states([intf])[0]

    def pfc_look(self, items: list[tuple[str, int, float, bool]]) -> list[tuple[float, int]]:
        """:meth:`SwitchBpf.pfc_look`, in one request (computed on the server, against its clock)."""
        got = self.agent.ask("pfc_look", items=[[self.pin, self.ifindex[i], rate, xoff, held]
                                                for i, rate, xoff, held in items])
        return [(float(q), int(f)) for q, f in got]

    def set_paused(self, intf: str, paused: bool) -> None:
        """:meth:`SwitchBpf.set_paused`, on the server's clock."""
        self.agent.ask("set_paused", pin=self.pin, idx=self.ifindex[intf], paused=paused)

    def close(self) -> None:
        """Nothing held here (the agent keeps the maps' descriptors)."""


#: htb's data class (1:20): its leaf (handle 20:) is the real low-priority queue of a switch port,
#: the queue the drain watch's schedule is held against (:func:`htb_lines`).
LOW_LEAF_PARENT = 0x00010020
#: Frames a watched host NIC port's tbf holds beyond the queue the program admits at
#: (emulation/network.py ``nic_slack_bytes``): a token bucket that keeps its rate holds at most
#: one frame more than the schedule (:func:`behind_schedule_s`), so with two the tbf never refuses
#: a frame the program scheduled.
NIC_SLACK_FRAMES = 2
#: A drain-watch read is the real queue (netlink) and then the schedule (the map), each stamped;
#: a frame that joins between the two lengthens the schedule read, so the reading errs towards
#: ahead by what joined in between. A read whose two stamps lie further apart than this (s) is
#: taken again (a thread of this process held up between them: 5-25 ms seen in a run's sampler,
#: where packets joining meanwhile read 10-20 frames ahead), at most :data:`READ_TRIES` times.
READ_SPAN_MAX_S = 0.0005
READ_TRIES = 5


def behind_schedule_s(real_bytes: int, sched_ns: int, now_ns: int, ps: int) -> float:
    """How far a port's real queue stood behind its shaper's schedule at ``now_ns`` (s; 0 or less:
    on it or ahead of it): the time ``real_bytes`` queued (netlink's backlog, read at ``now_ns``)
    take at the port's rate (``ps`` picoseconds a byte) less the time the program's schedule says
    the bytes queued so far still take (``sched_ns`` - ``now_ns``, nothing where it is past).

    A shaper that keeps its rate holds at most one frame more than its schedule: tbf and htb send a
    frame once their bucket holds its bytes and refill at the rate (a token bucket serves at least
    rate x time + burst - one frame over any busy stretch), so they run ahead of the schedule by up
    to their burst (two frames) and behind it by at most the frame whose tokens they are waiting
    for (the schedule drains it byte by byte); what they hold beyond that is drain the kernel did
    not do in time (its softirq, which dequeues at the qdisc watchdog's timer, waiting for a CPU).
    A packet joining after ``now_ns`` (the map is read after netlink) only lengthens the schedule:
    the reading errs towards ahead, never behind."""
    return real_bytes * ps / 1e12 - max(0, sched_ns - now_ns) / 1e9


def read_tight(nl: kernel.QdiscBacklog, schedule: Callable[[], T], tries: int = READ_TRIES,
               span_max_s: float = READ_SPAN_MAX_S) -> tuple[int, dict, T] | None:
    """One drain-watch read: (monotonic ns of the real queues' read, every qdisc's backlog from
    ``nl``, ``schedule()``'s answer read right after), or None when no try of ``tries`` kept the two
    reads within ``span_max_s`` (:data:`READ_SPAN_MAX_S`)."""
    for _ in range(tries):
        t0 = time.monotonic_ns()
        queued = nl.backlogs()
        got = schedule()
        if time.monotonic_ns() - t0 <= span_max_s * 1e9:
            return t0, queued, got
    return None


class NicWatch:
    """The drain watch on the hosts' NIC ports (both data planes: every host NIC port is a tbf,
    emulation/network.py ``_shape``): the program loaded once per host, on each NIC port's egress
    as a FIFO (:attr:`PortConfig.fifo`: it keeps the schedule of every frame the host sends at the
    port's rate and does nothing else to it), and a netlink socket inside each host's namespace to
    read the tbf's backlog. ``hosts``: host -> (its namespace, its NIC ports' interface names);
    ``mbps``: the host links' rate; ``frame_bytes``: the run's largest frame. Raises
    :class:`BpfError` (what was loaded is released first)."""

    def __init__(self, hosts: dict[str, tuple[str, list[str]]], obj_path: Path, mbps: float,
                 frame_bytes: int, limit_bytes: int) -> None:
        """Load and attach the program for every host of ``hosts``, each port admitting at
        ``limit_bytes`` scheduled ahead (the NIC queue: emulation/network.py ``nic_queue_bytes``;
        the tbf behind holds :data:`NIC_SLACK_FRAMES` more)."""
        self.ps = ps_per_byte(mbps)
        self.frame_s = frame_bytes * self.ps / 1e12
        self.progs: dict[str, SwitchBpf] = {}
        self.ports: dict[str, list[str]] = {}
        self.netlink: dict[str, kernel.QdiscBacklog] = {}
        try:
            for host, (ns, intfs) in hosts.items():
                prog = self.progs[host] = SwitchBpf(host, ns, obj_path, intfs)
                self.ports[host] = intfs
                cfg = PortConfig(q_limit=limit_bytes, frame_bytes=frame_bytes, watch_mbps=mbps, fifo=True)
                for intf in intfs:
                    prog.configure(intf, cfg)
                self.netlink[host] = kernel.QdiscBacklog(ns)
        except BaseException:
            self.close()
            raise

    def samples(self) -> list[dict]:
        """Each host NIC port now: ``host``, ``port`` (its interface), ``behind_us`` (how far its tbf's
        queue stood behind the shaper's schedule, :func:`behind_schedule_s`, µs; 0 or less: on or
        ahead of it; empty where no read was tight, :func:`read_tight`), ``backlog`` (bytes the tbf
        held), ``refused`` (frames the tbf refused since it was made: the program admits at the NIC
        queue's limit and the tbf holds :data:`NIC_SLACK_FRAMES` more, so each one it refused came
        while its queue stood that far behind the schedule, and stays in the schedule: a backlogged
        port held long enough reads at most that far behind, and refuses the rest) and ``gap_us`` (a
        full frame's time at the port's rate). Raises BpfError or KernelError."""
        out = []
        for host, prog in self.progs.items():
            nl, ports = self.netlink[host], self.ports[host]
            got = read_tight(nl, functools.partial(prog.states, ports))
            for intf in ports:
                row = {"host": host, "port": intf, "backlog": "", "gap_us": round(self.frame_s * 1e6, 1),
                       "behind_us": "", "refused": ""}
                if got is not None:
                    now, queued, states = got
                    st = states[ports.index(intf)]
                    _, real, refused = queued.get((nl.ifindex(intf), kernel.TC_H_ROOT), (0, 0, 0))
                    row["backlog"], row["refused"] = real, refused
                    row["behind_us"] = round(behind_schedule_s(real, st["sched_ns"], now, self.ps) * 1e6, 1)
                out.append(row)
        return out

    def close(self) -> None:
        """Release the programs (they stay attached until the namespaces go) and the sockets."""
        for prog in self.progs.values():
            prog.close()
        for nl in self.netlink.values():
            nl.close()
        self.progs, self.netlink = {}, {}


def _many(op: str, asks: list[tuple], local, remote_item) -> list[list]:
    """Each (program, its items)'s answers, in order: a program here answers at once
    (``local(prog, items)``); those on servers are asked together, one ``op`` request per
    server's agent (``remote_item(prog, item)``: the request's item)."""
    out: list[list | None] = [None] * len(asks)
    by_agent: dict[QueueAgent, list[int]] = {}
    for n, (prog, items) in enumerate(asks):
        if isinstance(prog, RemoteSwitchBpf):
            by_agent.setdefault(prog.agent, []).append(n)
        else:
            out[n] = local(prog, items)
    def ask(agent: QueueAgent) -> list:
        return agent.ask(op, items=[remote_item(asks[n][0], it) for n in by_agent[agent] for it in asks[n][1]])

    # the servers answer at once: a turn costs the slowest round trip, not their sum
    answers = list(_pool().map(ask, by_agent)) if len(by_agent) > 1 else [ask(a) for a in by_agent]
    for (_agent, ns), got_list in zip(by_agent.items(), answers, strict=True):
        got = iter(got_list)
        for n in ns:
            out[n] = [next(got) for _ in asks[n][1]]
    return [x if x is not None else [] for x in out]


_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """Threads that ask several servers' queue agents at once (made once, kept)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mrclab-queue-agents")
    return _POOL


def states_many(asks: list[tuple[SwitchBpf | RemoteSwitchBpf, list[str]]]) -> list[list[dict[str, int]]]:
    """Each (switch's program, its ports)'s :meth:`SwitchBpf.states`: one request per server for
    the switches on servers (a sample of a whole plane costs one round trip)."""
    return _many("states", asks, lambda p, items: p.states(items), lambda p, i: [p.pin, p.ifindex[i]])


def pfc_look_many(asks: list[tuple[SwitchBpf | RemoteSwitchBpf, list[tuple[str, int, float, bool]]]]
                  ) -> list[list[tuple[float, int]]]:
    """Each (switch's program, its (port, rate, XOFF, held) items)'s :meth:`SwitchBpf.pfc_look`: one
    request per server for the switches on servers."""
    got = _many("pfc_look", asks, lambda p, items: p.pfc_look(items),
                lambda p, it: [p.pin, p.ifindex[it[0]], it[1], it[2], it[3]])
    return [[(float(q), int(f)) for q, f in x] for x in got]


def htb_lines(intf: str, mbps: float, low_packets: int, high_packets: int, lossless: bool = False,
              frame_bytes: int = 0) -> list[str]:
    """``tc -batch`` lines giving ``intf`` the two htb classes the program feeds (module
    docstring), each at the link's rate on its own; the data class a bfifo of ``low_packets``
    frames of 1,600 bytes (or ``frame_bytes``), the high class a pfifo of ``high_packets``.
    ``lossless`` (PFC): the low class's leaf is a tbf at the link's rate instead of a bfifo, the
    lever the pause agent pulls (controller/pfc.py: tbf starts afresh when its rate changes, where
    htb would keep the debt of a packet charged at the paused rate). ``frame_bytes``: the largest
    frame the run sends, which sets the burst (:func:`~emulation.kernel.shaper_burst_bytes`)."""
    rate = f"{mbps}mbit"
    burst = kernel.shaper_burst_bytes(frame_bytes)  # as the host ports' tbf
    low_leaf = (f"qdisc replace dev {intf} parent {CLASS_LOW} handle 20: {tbf_leaf(mbps, low_packets, frame_bytes)}"
                if lossless else f"qdisc replace dev {intf} parent {CLASS_LOW} handle 20: "
                            f"bfifo limit {low_packets * max(1600, frame_bytes)}")
    return [
        f"qdisc replace dev {intf} root handle 1: htb default 20",
        f"class replace dev {intf} parent 1: classid {CLASS_HIGH} htb rate {rate} ceil {rate} burst {burst} "
        f"cburst {burst} prio 0",
        f"class replace dev {intf} parent 1: classid {CLASS_LOW} htb rate {rate} ceil {rate} burst {burst} "
        f"cburst {burst} prio 1",
        f"qdisc replace dev {intf} parent {CLASS_HIGH} handle 10: pfifo limit {high_packets}",
        low_leaf,
    ]


def tbf_leaf(mbps: float | None, packets: int, frame_bytes: int = 0) -> str:
    """The tbf a lossless port's low class drains through: at ``mbps`` (None: paused, 8 bit/s), a
    burst of :func:`~emulation.kernel.shaper_burst_bytes` for frames of up to ``frame_bytes`` (a
    larger frame would be dropped), ``packets`` frames of 1,600 bytes (or ``frame_bytes``) of
    queue. Under htb it is a non-work-conserving leaf (the kernel says so once): htb asks again
    when tbf's timer fires."""
    return kernel.tbf("8bit" if mbps is None else mbps, packets * max(1600, frame_bytes), frame_bytes)
