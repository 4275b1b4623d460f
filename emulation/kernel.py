"""Every call mrclab makes into the kernel's network configuration, in one module, per concern:
namespaces, links, qdiscs, routes, sysctls and commands run inside a namespace.

pyroute2 where it serves: listing, naming (attaching), deleting network namespaces and finding
the processes inside one, all done in this process with no fork. Anything that has to *enter* a
namespace stays on iproute2, which forks and execs: pyroute2 enters one by forking without exec
(``NetNS``, ``netns.create``), which deadlocks in a process with other threads (gRPC's, in a bmv2
fabric's controller: ``mrclab bench fabric`` hung in its first trial reading a link's counters)
and costs 16.2 ms a call here against 2.7 ms for ``ip`` (20 link flips each, one namespace). So
iproute2 does, each for that reason or its own:

* creating a namespace and a veth pair, setting a link up / down / its MTU and reading its
  counters (:func:`netns_add`, :func:`veth_add`, :func:`link_set`, :func:`link_stats`);
* bulk writes, ``ip -batch`` and ``tc -batch`` (:func:`ip_batch`, :func:`tc_batch`): a switch's
  routes, htb classes, pfifo leaves and tbf shapers are written by the hundreds in
  one fork and one netlink conversation;
* a command run inside a namespace (:func:`netns_exec`, :func:`netns_popen`): ``ip netns exec``
  also gives the command the namespace's own ``/sys`` and ``/etc/netns`` (tcpdump, sysctl and
  ethtool read them), where pyroute2's ``setns`` moves only the calling thread's network namespace;
* sysctls (:func:`sysctl`), which ``/proc/sys/net`` shows per namespace only to a process inside it.

Every failure is a :class:`KernelError` naming the namespace, the command and the kernel's words.

A namespace may live on another server (a plane placed there, emulation/cluster.py). Once
:func:`place` has named the :class:`Remote` that reaches it, every call here on that namespace runs
its ``ip`` / ``tc`` / ``sysctl`` on that server over ssh: the same command line, batched the same
way (one ssh round trip per batch), so callers never know where a node is. What cannot cross a
machine refuses with a KernelError: entering a remote namespace from this process (:func:`inside`:
sockets and eBPF map descriptors are this machine's).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import socket
import struct
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from mrclab.topologies.errors import RunFailed
from pyroute2 import netns as pr_netns


class KernelError(RunFailed):
    """The kernel (or iproute2) refused a network configuration call; the message says where and why."""


class Remote(Protocol):
    """How a namespace on another server is reached: ``run`` a command line there to completion
    (text output, ``input`` fed to its stdin; never raising for the command's own failure) and
    ``popen`` one (``subprocess.Popen`` keywords pass through). ``name`` names the server in errors."""

    name: str

    def run(self, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        """``argv`` to completion on the server (text output captured)."""
        ...

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` on the server."""
        ...


#: Bytes every shaper (tbf, and the switch ports' htb classes) may send back to back at the
#: interface's own speed: two full frames of the default payload. It was 4 ms of line rate
#: (rate / HZ, tc-tbf(8)'s rule for timers that tick at HZ; the qdisc watchdog here is an
#: hrtimer): at 18.8 Mb/s that let 8 frames through at once, twice the trim threshold of the
#: next hop, and the quickstart trimmed 3,572 packets and moved a third of its goodput; at 3,000
#: bytes it trimmed none (docs/fidelity.md, "Shaper bursts").
SHAPER_BURST_BYTES = 3000


def shaper_burst_bytes(frame_bytes: int = 0) -> int:
    """The burst (bytes) of a shaper whose link carries frames of up to ``frame_bytes``: two such
    frames, at least :data:`SHAPER_BURST_BYTES`. tbf drops outright a frame larger than its burst
    (tc-tbf(8): "burst ... must be at least as large as the MTU"): with a fixed 3,000 bytes, a run
    of 4 KiB payloads (the paper's frame size) delivered nothing over shaped links."""
    return max(SHAPER_BURST_BYTES, 2 * frame_bytes)


def tbf(mbps: float | str, limit_bytes: int, frame_bytes: int = 0) -> str:
    """A tbf qdisc's parameters: ``mbps`` (Mb/s, or a tc rate such as ``"8bit"``), a burst of
    :func:`shaper_burst_bytes` for frames of up to ``frame_bytes``, ``limit_bytes`` of queue
    (raised to hold one burst: tbf needs its queue to hold a whole frame)."""
    rate = mbps if isinstance(mbps, str) else f"{mbps}mbit"
    burst = shaper_burst_bytes(frame_bytes)
    return f"tbf rate {rate} burst {burst} limit {max(limit_bytes, burst)}"


#: namespace name -> the server it lives on (:func:`place`); absent: this machine
_REMOTE: dict[str, Remote] = {}


def place(netns: str, remote: Remote | None) -> None:
    """From now on, calls on namespace ``netns`` run on ``remote`` (None: on this machine again)."""
    if remote is None:
        _REMOTE.pop(netns, None)
    else:
        _REMOTE[netns] = remote


def where(netns: str) -> Remote | None:
    """The server namespace ``netns`` was placed on (:func:`place`), None for this machine."""
    return _REMOTE.get(netns)


def _run_on(remote: Remote | None, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` to completion on ``remote`` (None: this machine); text output captured."""
    if remote is not None:
        return remote.run(argv, input=input)
    return subprocess.run(argv, input=input, capture_output=True, text=True)


def _run(netns: str, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    """``argv`` to completion on the machine that holds ``netns``; text output captured."""
    return _run_on(_REMOTE.get(netns), argv, input)


def _on(netns: str) -> str:
    remote = _REMOTE.get(netns)
    return f" on {remote.name}" if remote is not None else ""


# ---- namespaces -------------------------------------------------------------------------------------
def netns_list() -> list[str]:
    """Names of the network namespaces under /run/netns (``ip netns list``)."""
    return sorted(pr_netns.listnetns())


def netns_exists(name: str) -> bool:
    """Whether namespace ``name`` exists on the machine that holds it (:func:`place`)."""
    if name in _REMOTE:
        return name in _run(name, ["ip", "netns", "list"]).stdout.split()
    return name in pr_netns.listnetns()


def netns_add(name: str) -> None:
    """Create the named network namespace. Raises :class:`KernelError` if it exists or cannot be made."""
    r = _run(name, ["ip", "netns", "add", name])
    if r.returncode != 0:
        raise KernelError(f"cannot create namespace {name}{_on(name)}: {r.stderr.strip()}")


def netns_attach(name: str, pid: int) -> None:
    """Name the network namespace of process ``pid`` ``name`` (``ip netns attach``). Raises
    :class:`KernelError` when the name exists or the process is gone. On a remote namespace
    ``pid`` is the process's pid on that server."""
    if name in _REMOTE:
        r = _run(name, ["ip", "netns", "attach", name, str(pid)])
        if r.returncode != 0:
            raise KernelError(f"cannot name namespace {name}{_on(name)} (pid {pid}): {r.stderr.strip()}")
        return
    try:
        pr_netns.attach(name, pid)
    except OSError as e:
        raise KernelError(f"cannot name namespace {name} (pid {pid}): {e.strerror or e}") from None


@contextlib.contextmanager
def inside(netns: str):
    """Run the ``with`` block's calling thread inside namespace ``netns`` (setns(2) on that thread;
    other threads stay where they are), back in the namespace it was in after, however the block
    ends. A socket opened in the block stays in ``netns`` for good. Raises :class:`KernelError` for
    a namespace on another server or one that cannot be entered.

    Not pyroute2's ``pushns``/``popns``: they keep one stack for the whole process and save
    ``/proc/self/ns/net``, the main thread's namespace, so a thread entering a namespace while the
    main thread was inside another came back to the main thread's (the port sampler, the PFC
    agent and a Thrift session each enter namespaces from threads of their own)."""
    if netns in _REMOTE:
        raise KernelError(f"namespace {netns} is on {_REMOTE[netns].name}: this process cannot enter it")
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            there = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        except OSError as e:
            raise KernelError(f"no namespace {netns} to enter ({e.strerror})") from None
        try:
            _setns(there, f"cannot enter namespace {netns}")
        finally:
            os.close(there)
        try:
            yield
        finally:
            _setns(home, "cannot return to this thread's namespace")
    finally:
        os.close(home)


_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNET = 0x40000000  # linux/sched.h


def _setns(fd: int, what: str) -> None:
    """setns(2) the calling thread into the network namespace at descriptor ``fd``. Raises KernelError."""
    if _LIBC.setns(fd, _CLONE_NEWNET):
        raise KernelError(f"{what} ({os.strerror(ctypes.get_errno())})")


def netns_delete(name: str) -> None:
    """Remove the name ``name`` (the namespace goes with its last process). Idempotent."""
    if name in _REMOTE:
        _run(name, ["ip", "netns", "delete", name])
        return
    with contextlib.suppress(FileNotFoundError, OSError):
        pr_netns.remove(name)


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is the named one (``ip netns pids``); [] if none or unknown.
    On a remote namespace these are that server's pids."""
    if name in _REMOTE:
        return sorted(int(p) for p in _run(name, ["ip", "netns", "pids", name]).stdout.split() if p.isdigit())
    try:
        return sorted(pr_netns.ns_pids().get(name, []))
    except OSError:
        return []


def netns_purge_script(names: list[str]) -> str:
    """A shell script (for a server, one ssh round trip) that kills every process inside each named
    namespace and deletes the name; names that do not exist are passed over."""
    quoted = " ".join(shlex.quote(n) for n in names)
    return (f"for n in {quoted}; do [ -e /run/netns/$n ] || continue; p=$(ip netns pids $n); "
            f"[ -n \"$p\" ] && kill -9 $p; ip netns delete $n; done; ")


def netns_list_on(remote: Remote) -> list[str]:
    """Names of the network namespaces on ``remote``'s server (``ip netns list`` there). Raises
    :class:`KernelError` when the server cannot say."""
    r = remote.run(["ip", "netns", "list"])
    if r.returncode != 0:
        raise KernelError(f"{remote.name}: ip netns list: {r.stderr.strip()}")
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def netns_exec_argv(netns: str, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` inside namespace ``netns`` (``ip netns exec``: with the
    namespace's own ``/sys`` and ``/etc/netns``), for a caller that starts it its own way (a
    detached switch on a server)."""
    return ["ip", "netns", "exec", netns, *argv]


# ---- links --------------------------------------------------------------------------------------------
def veth_add(netns_a: str, name_a: str, netns_b: str, name_b: str) -> None:
    """A veth pair, ``name_a`` in ``netns_a`` and ``name_b`` in ``netns_b`` (both down)."""
    ip(netns_a, ["link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", netns_b])


def link_set(netns: str, ifname: str, *, up: bool | None = None, mtu: int | None = None) -> None:
    """Set ``ifname`` in ``netns`` administratively up or down and / or its MTU (bytes). Raises
    :class:`KernelError` (no such interface, a refused MTU)."""
    args = ["link", "set", ifname] + (["mtu", str(mtu)] if mtu is not None else []) + \
        ([] if up is None else ["up" if up else "down"])
    ip(netns, args)


def link_stats(netns: str, ifname: str) -> dict[str, int]:
    """The link's 64-bit counters as ``ip -s link`` shows them, flattened: ``rx_packets``,
    ``tx_packets``, ``rx_bytes``, ``rx_dropped``, ``tx_dropped``, ... Raises :class:`KernelError`."""
    got = ip_json(netns, ["-s", "link", "show", ifname])
    if not got:
        raise KernelError(f"no interface {ifname} in namespace {netns}")
    stats = got[0].get("stats64", {})
    return {f"{d}_{k}": int(v) for d in ("rx", "tx") for k, v in stats.get(d, {}).items() if isinstance(v, int)}


# ---- bulk writes: routes and qdiscs --------------------------------------------------------------------
def offloads_off(netns: str, intfs: list[str], rx_cpus: list[int] | None = None) -> None:
    """Turn checksum and segmentation offloads off on ``intfs`` of ``netns`` (``ethtool -K``, one
    fork for all; an interface that has none is passed over): frames reach raw sockets as sent.
    With ``rx_cpus`` (one CPU per interface), steer each one's received frames there in the same
    fork (:func:`steer_rx_script`). Raises :class:`KernelError` when the steering is refused."""
    script = "".join(f"ethtool -K {shlex.quote(i)} tx off rx off tso off gso off gro off >/dev/null 2>&1; "
                     for i in intfs)
    if rx_cpus is not None:
        script += steer_rx_script(intfs, rx_cpus)
    r = netns_exec(netns, ["sh", "-c", script + "true"], capture_output=True, text=True)
    if rx_cpus is not None and r.returncode != 0:
        raise KernelError(f"steering received frames in {netns}{_on(netns)}: {r.stderr.strip() or r.returncode}")


def cpu_mask(cpu: int) -> str:
    """The sysfs CPU bitmap (hex, 32-bit groups from the highest, comma-separated) of CPU ``cpu``
    alone; -1: ``"$ALL"``, the shell variable :func:`steer_rx_script` sets to the machine's first
    32 CPUs (a mask naming a CPU it lacks is refused), where RPS picks one per flow by the frame's
    hash (the same CPU for every frame of a path, whose headers are the same)."""
    if cpu < 0:
        return '"$ALL"'
    groups = [0] * (cpu // 32 + 1)
    groups[0] = 1 << (cpu % 32)
    return ",".join(f"{g:08x}" for g in groups)


def steer_rx_script(intfs: list[str], rx_cpus: list[int]) -> str:
    """Shell that steers the frames each of ``intfs`` receives to its CPU in ``rx_cpus`` (Receive
    Packet Steering: the interface's ``queues/rx-0/rps_cpus``, Documentation/networking/scaling.rst),
    each write failing the script (run inside the namespace: ``ip netns exec`` gives it that
    namespace's ``/sys``).

    Why: a veth hands each frame to the backlog of the CPU that sends it, and each CPU drains its
    own. A host or switch whose frames leave from both CPUs in turn (a process moved between them,
    a shaper's timer firing on either) puts the frames of one path on two backlogs, and when one
    CPU's is held up (its softirq deferred to a ksoftirqd that waits for the CPU) the later frames
    overtake: a FIFO path reorders, which the transport rightly reads as loss. The quick reproduce
    table on a loaded 2-core machine (2026-11-28) showed it in ev-loss: 52 "gaps" on EVs no switch
    dropped from, in bursts of consecutive PSNs across all four planes, and 27 of their "lost"
    packets reached the receiver twice. With each interface's frames on one CPU's backlog, in the
    order they were sent, a path is a FIFO again."""
    if len(rx_cpus) != len(intfs):
        raise ValueError(f"{len(rx_cpus)} CPUs for {len(intfs)} interfaces; allowed: one each")
    every = ""
    if min(rx_cpus, default=0) < 0:  # "$ALL": the first 32 of the machine's CPUs
        every = 'n=$(nproc); [ "$n" -gt 32 ] && n=32; ALL=$(printf %x $(( (1 << n) - 1 ))); '
    return every + "".join(f"echo {cpu_mask(c)} > /sys/class/net/{shlex.quote(i)}/queues/rx-0/rps_cpus || exit 1; "
                           for i, c in zip(intfs, rx_cpus, strict=True))


class QdiscBacklog:
    """Reads the queues of the qdiscs on interfaces of a local namespace over netlink, from a plain
    NETLINK_ROUTE socket opened inside it: about 0.1 ms a read, where ``tc -s`` forks. One socket
    per calling thread (two threads' dumps on one socket would interleave), opened inside ``netns``
    at that thread's first call; :meth:`close` closes every thread's from any thread.

    Not pyroute2's ``IPRoute``: pyroute2 0.9 keeps each thread's socket in that thread's own
    state and its ``close`` closes only the calling thread's, so a socket the port sampler's thread
    opened stayed open after the fabric closed its reader from the main thread, as long as that
    thread lived. An open socket holds its namespace, and a host's namespace holds its VXLAN ports'
    VNIs, which the next run over servers makes again. Raises :class:`KernelError` for a namespace on another server."""

    def __init__(self, netns: str) -> None:
        """A reader of ``netns`` (its sockets opened at each thread's first call)."""
        if netns in _REMOTE:
            raise KernelError(f"namespace {netns} is on {_REMOTE[netns].name}: this process cannot read it")
        self.netns = netns
        self._local = threading.local()
        self._lock = threading.Lock()
        self._raw: list[socket.socket] = []  # every thread's socket, for close()
        self._index: dict[str, int] = {}

    def _sock(self) -> socket.socket:
        sock = getattr(self._local, "raw", None)
        if sock is None:
            with inside(self.netns):
                sock = self._local.raw = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
            with self._lock:
                self._raw.append(sock)
        return sock

    def qlen(self, ifname: str, kind: str = "tbf") -> int:
        """Packets queued in ``ifname``'s qdisc of ``kind`` (0 when it has none)."""
        idx = self.ifindex(ifname)
        for (i, _parent), queued in qdisc_dump(self._sock(), qdisc_kind=kind).items():
            if i == idx:
                return queued[0]
        return 0

    def backlogs(self) -> dict[tuple[int, int], tuple[int, int, int]]:
        """Every qdisc of the namespace now, in one netlink dump: (ifindex, parent handle) ->
        (packets queued, bytes queued, packets dropped so far). The root's parent is
        :data:`TC_H_ROOT`; a class's leaf has its class's handle (htb class 1:20: ``0x10020``).
        Bytes are each packet's length as the qdisc counts it (``qdisc_pkt_len``: the frame from
        its Ethernet header on). See :func:`qdisc_dump` for why this is not pyroute2's ``get_qdiscs``."""
        return qdisc_dump(self._sock())

    def ifindex(self, ifname: str) -> int:
        """``ifname``'s index in the namespace (looked up once). Raises :class:`KernelError` for
        an interface the namespace has not."""
        idx = self._index.get(ifname)
        if idx is None:
            with inside(self.netns):
                try:
                    idx = socket.if_nametoindex(ifname)
                except OSError as e:
                    raise KernelError(f"no interface {ifname} in namespace {self.netns} ({e.strerror or e})") from None
            self._index[ifname] = idx
        return idx

    def close(self) -> None:
        """Close every thread's netlink socket (the namespace is no longer held by this reader)."""
        with self._lock:
            socks, self._raw = self._raw, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        self._local = threading.local()


#: rtnetlink's numbers (linux/netlink.h, linux/rtnetlink.h, linux/gen_stats.h, linux/pkt_sched.h)
_RTM_GETQDISC, _RTM_NEWQDISC, _NLMSG_DONE, _NLMSG_ERROR = 38, 36, 3, 2
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_TCA_KIND, _TCA_STATS2, _TCA_STATS_QUEUE = 1, 7, 3
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
_NLA = struct.Struct("=HH")  # nlattr: length, type
_QUEUE = struct.Struct("=III")  # gnet_stats_queue's first fields: qlen, backlog (bytes), drops


def qdisc_dump(sock: socket.socket, qdisc_kind: str | None = None) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Every qdisc's queue in the namespace of netlink socket ``sock`` (NETLINK_ROUTE, opened
    there): (ifindex, parent) -> (packets, bytes, packets it dropped since it was made), from one
    RTM_GETQDISC dump, read in place: the
    tcmsg header and, of its attributes, TCA_STATS2's TCA_STATS_QUEUE (struct gnet_stats_queue).
    ``qdisc_kind`` (e.g. ``"tbf"``, TCA_KIND) keeps only the qdiscs of that kind.

    Not pyroute2's ``IPRoute.get_qdiscs``: the drain watch holds a queue read against a map read
    taken right after it, and pyroute2 0.9 took 1.7-5.2 ms a dump here (its asyncio core), its
    ``tcmsg`` decoder 0.3 ms for two qdiscs, long enough for frames to join in between; this reads
    a switch's 25 qdiscs in about a tenth of that. Raises OSError for a refused request."""
    seq = (getattr(sock, "_mrclab_seq", 0) + 1) & 0xFFFFFFFF
    body = _TCMSG.pack(0, 0, 0, 0, 0)
    sock.send(_NLMSG.pack(_NLMSG.size + len(body), _RTM_GETQDISC, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + body)
    out: dict[tuple[int, int], tuple[int, int, int]] = {}
    while True:
        buf = sock.recv(1 << 16)
        off = 0
        while off + _NLMSG.size <= len(buf):
            length, kind, _flags, got_seq, _pid = _NLMSG.unpack_from(buf, off)
            if length < _NLMSG.size:
                return out
            if got_seq == seq:
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", buf, off + _NLMSG.size)[0]
                    raise OSError(err, f"netlink refused the qdisc dump ({os.strerror(err)})")
                if kind == _RTM_NEWQDISC:
                    _fam, ifindex, _handle, parent, _info = _TCMSG.unpack_from(buf, off + _NLMSG.size)
                    attrs = off + _NLMSG.size + _TCMSG.size
                    q = _stats_queue(buf, attrs, off + length)
                    if q is not None and (qdisc_kind is None or _kind(buf, attrs, off + length) == qdisc_kind):
                        out[(ifindex, parent)] = q
            off += (length + 3) & ~3


def _kind(buf: bytes, off: int, end: int) -> str | None:
    """The qdisc's kind (TCA_KIND, a NUL-ended string) among the attributes in ``buf[off:end]``."""
    while off + _NLA.size <= end:
        length, kind = _NLA.unpack_from(buf, off)
        if length < _NLA.size:
            return None
        if kind & 0x3FFF == _TCA_KIND:
            return bytes(buf[off + _NLA.size:off + length]).split(b"\0", 1)[0].decode("ascii", "replace")
        off += (length + 3) & ~3
    return None


def _stats_queue(buf: bytes, off: int, end: int) -> tuple[int, int, int] | None:
    """(qlen, backlog, drops) of the TCA_STATS2 / TCA_STATS_QUEUE attribute in ``buf[off:end]``, or None."""
    for nest in (_TCA_STATS2, _TCA_STATS_QUEUE):
        while off + _NLA.size <= end:
            length, kind = _NLA.unpack_from(buf, off)
            if length < _NLA.size:
                return None
            if kind & 0x3FFF == nest:  # NLA_TYPE_MASK: the nested / byte-order flags off
                end, off = off + length, off + _NLA.size
                break
            off += (length + 3) & ~3
        else:
            return None
    return _QUEUE.unpack_from(buf, off) if off + _QUEUE.size <= end else None


#: A root qdisc's parent handle (linux/pkt_sched.h TC_H_ROOT).
TC_H_ROOT = 0xFFFFFFFF


def ip_batch(netns: str, lines: list[str]) -> None:
    """``ip -n NETNS -batch -``: many link / neighbour / route commands in one process (see the module
    docstring for why routes stay here). Raises :class:`KernelError` with iproute2's first error."""
    _batch(["ip", "-n", netns, "-batch", "-"], lines)


def tc_batch(netns: str, lines: list[str]) -> None:
    """``tc -n NETNS -batch -``: a switch's qdiscs and classes in one process. Raises
    :class:`KernelError` with tc's first error."""
    _batch(["tc", "-n", netns, "-batch", "-"], lines)


class TcStream:
    """A ``tc -n NETNS -force -batch -`` left running: each line :meth:`write` gives it runs as it
    arrives, without a process's start for each (20-40 ms on a busy 2-core machine: bench fidelity
    holds NIC ports for a few ms). :meth:`close` ends it; tc's own errors are not read."""

    def __init__(self, netns: str) -> None:
        """Start tc in batch mode on ``netns`` (on its server where it was placed there)."""
        argv = ["tc", "-n", netns, "-force", "-batch", "-"]
        remote = _REMOTE.get(netns)
        self.proc = remote.popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, text=True, bufsize=1) if remote is not None else \
            subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             text=True, bufsize=1)

    def write(self, lines: str) -> None:
        """Run ``lines`` (newline-ended tc commands). Raises OSError once tc has gone."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(lines)

    def close(self) -> None:
        """End tc (its input closed) and wait for it."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        self.proc.wait()


def _batch(argv: list[str], lines: list[str]) -> None:
    if not lines:
        return
    r = _run(argv[2], argv, input="\n".join(lines) + "\n")
    if r.returncode != 0:
        said = r.stderr.strip().splitlines()
        raise KernelError(f"{' '.join(argv[:3])}{_on(argv[2])}: {said[0] if said else f'exit {r.returncode}'}")


def delete_links(remote: Remote | None, links: list[tuple[str, str]]) -> None:
    """Delete each (namespace, interface) of ``links`` on ``remote`` (None: this machine), in one
    shell there (``ip -n NS link del DEV`` each; one fork of a shell, not one ssh session per port).
    A namespace or an interface already gone is no error. Raises :class:`KernelError` when the
    shell itself fails."""
    if not links:
        return
    script = "".join(f"ip -n {shlex.quote(ns)} link del {shlex.quote(dev)} 2>/dev/null\n" for ns, dev in links)
    r = _run_on(remote, ["sh", "-s"], script + "exit 0\n")
    if r.returncode != 0:
        where = f" on {remote.name}" if remote is not None else ""
        raise KernelError(f"deleting {len(links)} links{where}: {r.stderr.strip() or f'exit {r.returncode}'}")


def underlay_batch(remote: Remote | None, lines: list[str]) -> None:
    """``ip -batch -`` in the own namespace of ``remote`` (None: this process's): the underlay
    where tunnels between servers are made. Raises :class:`KernelError` with iproute2's first error."""
    if not lines:
        return
    r = _run_on(remote, ["ip", "-batch", "-"], "\n".join(lines) + "\n")
    if r.returncode != 0:
        said = r.stderr.strip().splitlines()
        where = f" on {remote.name}" if remote is not None else ""
        first = said[0] if said else f"exit {r.returncode}"
        if "VNI already exists" in first:  # an earlier run's port, in a namespace not yet freed
            first += " (an earlier run's VXLAN port is still there: `mrclab clean` removes it)"
        raise KernelError(f"ip -batch{where}: {first}")


def configure_many(items: list[tuple[str, list[str], list[str]]],
                   rx: dict[str, tuple[list[str], list[int]]] | None = None) -> None:
    """For each (namespace, sysctls, ``ip -batch`` lines): :func:`sysctl`, then :func:`ip_batch`.
    ``rx`` maps a namespace to (interfaces, one CPU each) whose received frames are steered there
    (:func:`steer_rx_script`), in the sysctl's fork. Namespaces on this machine go one by one; those
    on a server in one shell script per server (one round trip, however many). Raises
    :class:`KernelError` naming the namespace that refused."""
    rx = rx or {}
    by_remote: dict[Remote, list[tuple[str, list[str], list[str]]]] = {}
    for item in items:
        remote = _REMOTE.get(item[0])
        if remote is None:
            ns, settings = item[0], item[1]
            if ns in rx:
                script = (f"sysctl -qw {shlex.join(settings)} || exit 1; " if settings else "") \
                    + steer_rx_script(*rx[ns])
                r = netns_exec(ns, ["sh", "-c", script], capture_output=True, text=True)
                if r.returncode != 0:
                    raise KernelError(f"sysctl / steering received frames in {ns}: {r.stderr.strip() or r.returncode}")
            elif settings:
                sysctl(ns, settings)
            ip_batch(ns, item[2])
        else:
            by_remote.setdefault(remote, []).append(item)
    def configure(remote: Remote, todo: list[tuple[str, list[str], list[str]]]) -> None:
        script = []
        for ns, settings, lines in todo:
            fail = shlex.quote(f"in {ns}: ")
            if settings:
                script.append(f"ip netns exec {shlex.quote(ns)} sysctl -qw {shlex.join(settings)} "
                              f"|| {{ echo {fail}sysctl >&2; exit 1; }}")
            if ns in rx:
                script.append(f"ip netns exec {shlex.quote(ns)} sh -c {shlex.quote(steer_rx_script(*rx[ns]))} "
                              f"|| {{ echo {fail}rps_cpus >&2; exit 1; }}")
            if lines:
                script.append(f"ip -n {shlex.quote(ns)} -batch - <<'MRCLAB_END' || {{ echo {fail}ip >&2; exit 1; }}")
                script += lines + ["MRCLAB_END"]
        r = remote.run(["sh", "-s"], input="\n".join(script) + "\n")
        if r.returncode != 0:
            said = r.stderr.strip().splitlines()
            raise KernelError(f"configuring namespaces on {remote.name}: "
                              f"{' / '.join(said[-2:]) or f'exit {r.returncode}'}")

    if by_remote:  # the servers work in parallel
        with ThreadPoolExecutor(max_workers=len(by_remote)) as pool:
            list(pool.map(lambda item: configure(*item), by_remote.items()))


def route_to(address: str, remote: Remote | None = None) -> tuple[str, str, int]:
    """(device, source address, device MTU in bytes) of the route from ``remote``'s own namespace
    (None: this process's) to ``address`` (``ip route get``, ``ip link show``). Raises
    :class:`KernelError` when there is no route."""
    where = f" on {remote.name}" if remote is not None else ""
    r = _run_on(remote, ["ip", "-j", "route", "get", address])
    try:
        route = json.loads(r.stdout)[0]
        link = json.loads(_run_on(remote, ["ip", "-j", "link", "show", "dev", route["dev"]]).stdout)[0]
        return route["dev"], route.get("prefsrc", ""), int(link["mtu"])
    except (ValueError, LookupError):
        raise KernelError(f"no route to {address}{where}: {r.stderr.strip() or 'ip route get said nothing'}") from None


def ip(netns: str, args: list[str], *, check: bool = True) -> str:
    """One ``ip -n NETNS ARGS...`` (a policy rule, a read-back in JSON); its stdout. With ``check``,
    raises :class:`KernelError` on failure, else returns "" then."""
    r = _run(netns, ["ip", "-n", netns, *args])
    if r.returncode != 0:
        if check:
            raise KernelError(f"ip -n {netns} {' '.join(args)}{_on(netns)}: {r.stderr.strip()}")
        return ""
    return r.stdout


def ip_json(netns: str, args: list[str]) -> list:
    """``ip -j -n NETNS ARGS...`` parsed ([] when it prints nothing)."""
    out = ip(netns, ["-j", *args])
    return json.loads(out) if out.strip() else []


def tc(netns: str, args: list[str]) -> None:
    """One ``tc -n NETNS ARGS...``. Raises :class:`KernelError` with tc's words."""
    r = _run(netns, ["tc", "-n", netns, *args])
    if r.returncode != 0:
        raise KernelError(f"tc -n {netns} {' '.join(args)}{_on(netns)}: {r.stderr.strip()}")


# ---- inside a namespace --------------------------------------------------------------------------------
def sysctl(netns: str, settings: list[str]) -> None:
    """``sysctl -w`` each ``key=value`` inside ``netns``. Raises :class:`KernelError`."""
    r = _run(netns, ["ip", "netns", "exec", netns, "sysctl", "-qw", *settings])
    if r.returncode != 0:
        raise KernelError(f"sysctl in {netns}{_on(netns)}: {r.stderr.strip()}")


def netns_exec(netns: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``netns`` to completion (``subprocess.run`` keywords pass through; on a
    remote namespace the output is captured as text whatever they say)."""
    if netns in _REMOTE:
        return _REMOTE[netns].run(["ip", "netns", "exec", netns, *argv], input=kw.get("input"))
    return subprocess.run(["ip", "netns", "exec", netns, *argv], **kw)


def netns_popen(netns: str, argv: list[str], **kw) -> subprocess.Popen:
    """Start ``argv`` inside ``netns`` (``subprocess.Popen`` keywords pass through; on a remote
    namespace the process here is the ssh client that runs it there)."""
    if netns in _REMOTE:
        return _REMOTE[netns].popen(["ip", "netns", "exec", netns, *argv], **kw)
    return subprocess.Popen(["ip", "netns", "exec", netns, *argv], **kw)


def command_line(argv: list[str]) -> str:
    """``argv`` as one shell command line (what ssh hands the remote shell)."""
    return shlex.join(argv)

