"""The tc eBPF queue program's loader and maps (bpfsrc/port_queue.bpf.c), over libbpf through
ctypes, in one file that needs nothing but Python's standard library and ``libbpf.so.1``.

It runs in two places: imported here, for switches on this machine (controller/bpf.py
``SwitchBpf``), and as the *queue agent* on a server that holds a remote plane's switches
(controller/bpf.py ``RemoteSwitchBpf``): the file's own source is started there with ``python3 -c``
over the server's ssh connection (emulation/servers.py ``OnServer``), reads one JSON request a line
and answers each with one JSON line (:func:`serve`). The agent loads the program for each switch,
attaches it to the switch's ports inside the switch's namespace there, and *pins* the program and
its maps under bpffs (``/sys/fs/bpf``, mounted if the server has none): the pins outlive the agent,
so an agent started again reopens them (:meth:`Agent.maps`), any tool can read them
(``bpftool map dump pinned ...``), and cleanup removes them with the run's folders. Everything
that reads or computes from a map (a port's counters, its queue now, PFC's feeds and pause
window) runs where the map is, so the program's clock (``bpf_ktime_get_ns``, CLOCK_MONOTONIC of
that kernel) is the clock it is compared with.

Map layouts (bpfsrc/port_queue.bpf.c): ``port_cfg`` (:data:`CFG`), ``port_state`` (:data:`STATE`,
a spin lock first: read with ``BPF_F_LOCK``), ``pfc`` (:data:`PFC`); every key is the port's
ifindex in its switch's namespace. Errors: :class:`MapError` with the step and the kernel's reason.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import socket
import struct
import sys
import time

#: struct port_cfg: rate_pps, ecn_k, trim_t, q_limit, loss_threshold (of 65536), salt, lossless, port_no,
#: frame_bytes, ps_per_byte (the drain watch's schedule), fifo (a host NIC port: the schedule only)
CFG = struct.Struct("<11I")
#: struct pfc_state: feeds (bit n: port n fed the low-priority queue), pause_start, pause_end (ns)
PFC = struct.Struct("<3Q")
#: struct port_state: lock, lcg, last_ns, occ, marked, trimmed, queue_full, gray, low, high, sched_ns
STATE = struct.Struct("<II9Q")
#: struct un_sid: the switch's uN SID (block | own uSID: 6 bytes of 8) and the packets it shifted
UN = struct.Struct("<8sQ")
#: the counters of a port's state, in its order (then ``sched_ns``: the drain watch's schedule, monotonic ns)
STATE_FIELDS = ("marked", "trimmed", "queue_full", "gray", "low", "high")
FP_SHIFT = 20  # the virtual queue's fixed point
PROGRAM = b"mrclab_egress"
#: the uN SID program (every switch port's ingress) and its map
PROGRAM_UN, UN_MAP = b"mrclab_un", "un_sid"
MAPS = ("port_cfg", "port_state", "pfc", UN_MAP)
BPF_ANY, BPF_NOEXIST, BPF_F_LOCK = 0, 1, 4  # linux/bpf.h
BPF_TC_INGRESS, BPF_TC_EGRESS, BPF_TC_F_REPLACE = 1, 2, 1  # libbpf.h
CLONE_NEWNET = 0x40000000  # linux/sched.h
#: Where bpffs is mounted (the kernel's documented place, as iproute2 and bpftool use it).
BPFFS = "/sys/fs/bpf"


class MapError(Exception):
    """libbpf or the kernel refused a step; the message names it and the reason."""


class _TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int), ("attach_point", ctypes.c_int),
                ("parent", ctypes.c_uint32)]


class _TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("handle", ctypes.c_uint32), ("priority", ctypes.c_uint32)]


def libbpf_path() -> str | None:
    """The libbpf this process can load (``libbpf.so.1``, Debian's ``libbpf1``), or None."""
    for name in ("libbpf.so.1", ctypes.util.find_library("bpf")):
        if name:
            try:
                ctypes.CDLL(name)
                return name
            except OSError:
                continue
    return None


_LIB: ctypes.CDLL | None = None


def lib() -> ctypes.CDLL:
    """libbpf with the signatures this module calls. Raises MapError where it is missing."""
    global _LIB
    if _LIB is not None:
        return _LIB
    path = libbpf_path()
    if path is None:
        raise MapError("libbpf.so.1 is not installed (apt-get install libbpf1)")
    b = ctypes.CDLL(path, use_errno=True)
    vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    b.bpf_object__open_file.restype = vp
    b.bpf_object__open_file.argtypes = [cp, vp]
    b.libbpf_get_error.argtypes = [vp]
    b.libbpf_get_error.restype = ctypes.c_long
    b.bpf_object__load.argtypes = [vp]
    b.bpf_object__close.argtypes = [vp]
    b.bpf_object__find_program_by_name.restype = vp
    b.bpf_object__find_program_by_name.argtypes = [vp, cp]
    b.bpf_program__fd.argtypes = [vp]
    b.bpf_program__pin.argtypes = [vp, cp]
    b.bpf_object__find_map_fd_by_name.argtypes = [vp, cp]
    b.bpf_object__pin_maps.argtypes = [vp, cp]
    b.bpf_obj_get.argtypes = [cp]
    for f in (b.bpf_map_update_elem, b.bpf_map_lookup_elem_flags):
        f.argtypes = [i, vp, vp, ctypes.c_uint64]
    b.bpf_tc_hook_create.argtypes = [ctypes.POINTER(_TcHook)]
    b.bpf_tc_attach.argtypes = [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]
    b.bpf_tc_detach.argtypes = [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]
    _LIB = b
    return b


def why(rc: int) -> str:
    """The kernel's words for a libbpf return code (negative errno) or the last errno."""
    return os.strerror(-rc if rc < 0 else ctypes.get_errno() or errno.EINVAL)


@contextlib.contextmanager
def netns_path(path: str):
    """Run the block's calling thread in the network namespace at ``path`` (``/run/netns/<name>``),
    back where it was after. Raises MapError if it cannot enter."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            there = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise MapError(f"no namespace at {path} ({e.strerror})") from None
        try:
            if libc.setns(there, CLONE_NEWNET):
                raise MapError(f"cannot enter the namespace at {path} ({os.strerror(ctypes.get_errno())})")
        finally:
            os.close(there)
        try:
            yield
        finally:
            libc.setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


class Maps:
    """One switch's four maps by their descriptors; every key of the first three is a port's
    ifindex, ``un_sid`` has the one key 0."""

    def __init__(self, cfg_fd: int, state_fd: int, pfc_fd: int, un_fd: int) -> None:
        """Maps ``port_cfg``, ``port_state``, ``pfc`` and ``un_sid`` at those descriptors."""
        self.cfg_fd, self.state_fd, self.pfc_fd, self.un_fd = cfg_fd, state_fd, pfc_fd, un_fd
        #: ifindex -> (start, end) of its pause as :meth:`set_paused` last wrote it to ``pfc``
        #: (monotonic ns; the program reads them, never writes them), so a look needs no read of them
        self._pause: dict[int, tuple[int, int]] = {}
        #: ifindex -> its ``low`` count when its feeds were last read or cleared (:meth:`pfc_look`)
        self._low_seen: dict[int, int] = {}

    @classmethod
    def pinned(cls, pin_dir: str) -> Maps:
        """The maps pinned under ``pin_dir`` (:meth:`Program.pin`). Raises MapError."""
        fds: list[int] = []
        for name in MAPS:
            fd = lib().bpf_obj_get(f"{pin_dir}/{name}".encode())
            if fd < 0:
                for f in fds:
                    os.close(f)
                raise MapError(f"no map pinned at {pin_dir}/{name} ({why(fd)})")
            fds.append(fd)
        return cls(*fds)

    def close(self) -> None:
        """Close the descriptors (the maps live on while a program or a pin holds them)."""
        for fd in (self.cfg_fd, self.state_fd, self.pfc_fd, self.un_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _update(self, fd: int, idx: int, value: bytes, flags: int, ok_exists: bool = False) -> None:
        key = ctypes.c_uint32(idx)
        buf = ctypes.create_string_buffer(value, len(value))
        rc = lib().bpf_map_update_elem(fd, ctypes.byref(key), buf, flags)
        if rc and not (ok_exists and rc == -errno.EEXIST):
            raise MapError(f"map update refused ({why(rc)})")

    def _lookup(self, fd: int, idx: int, size: int, flags: int = 0) -> bytes | None:
        key, buf = ctypes.c_uint32(idx), ctypes.create_string_buffer(size)
        return None if lib().bpf_map_lookup_elem_flags(fd, ctypes.byref(key), buf, flags) else buf.raw

    def set_sid(self, sid: bytes) -> None:
        """The switch's uN SID from now on: ``sid``, the first 6 bytes of its /48 (block | own
        uSID); the count of packets shifted starts again from 0. Raises MapError."""
        if len(sid) != 6:
            raise MapError(f"uN SID of {len(sid)} bytes; allowed: 6 (a /48)")
        self._update(self.un_fd, 0, UN.pack(sid, 0), BPF_ANY)

    def sid_packets(self) -> int:
        """Packets the uN SID program shifted since :meth:`set_sid`. Raises MapError."""
        raw = self._lookup(self.un_fd, 0, UN.size)
        if raw is None:
            raise MapError(f"cannot read the uN SID's counter ({why(-1)})")
        return UN.unpack(raw)[1]

    def init_port(self, idx: int) -> None:
        """Zeroed counters and PFC state for port ``idx``, unless it has them (a re-attach keeps them)."""
        self._update(self.state_fd, idx, bytes(STATE.size), BPF_NOEXIST, ok_exists=True)
        self._update(self.pfc_fd, idx, bytes(PFC.size), BPF_NOEXIST, ok_exists=True)

    def configure(self, idx: int, cfg: bytes) -> None:
        """Port ``idx`` follows ``cfg`` (a packed ``struct port_cfg``, :data:`CFG`) from now on."""
        self._update(self.cfg_fd, idx, cfg, BPF_ANY)

    def state(self, idx: int) -> dict[str, int]:
        """Port ``idx``'s counters (:data:`STATE_FIELDS`, packets since attach), ``queue``
        (low-priority frames the virtual queue held at its last packet) and ``sched_ns`` (when the
        low-priority bytes queued so far leave at the port's rate, ``time.monotonic_ns``: the drain
        watch's schedule; 0 where none is kept). Raises MapError."""
        raw = self._lookup(self.state_fd, idx, STATE.size, BPF_F_LOCK)
        if raw is None:
            raise MapError(f"cannot read port {idx}'s counters ({why(-1)})")
        _lock, _lcg, _last, occ, *counts, sched = STATE.unpack(raw)
        return {"queue": occ >> FP_SHIFT, **dict(zip(STATE_FIELDS, counts, strict=True)), "sched_ns": sched}

    def pfc_look(self, idx: int, rate_pps: int, xoff: float, held: bool) -> tuple[float, int]:
        """PFC: (port ``idx``'s low-priority queue now in frames, the ports that fed it as a bit mask).

        The queue is the program's count at its last packet, drained since at ``rate_pps`` but for
        the time the port was paused (as the program drains it at its next packet;
        ``time.monotonic_ns`` is the program's clock). The feeds are read, and cleared, only where
        the pause agent acts on them: a queue at or above ``xoff`` frames or one it ``held``;
        below, the program keeps OR-ing them into the map, and a queue seen empty has them cleared
        if a packet was queued since they last were (its ``low`` count moved). So the mask is
        every port that fed the queue since it was last seen empty or its feeds last read, as
        when every look read them, at one map lookup per port where that took three: the agent
        looks every millisecond, and fig. 16's 24 lossless ports cost its runner a third of a core."""
        raw = self._lookup(self.state_fd, idx, STATE.size, BPF_F_LOCK)
        if raw is None:
            return 0.0, 0
        f = STATE.unpack(raw)
        last, occ, low = f[2], f[3], f[8]
        pause = self._pause.get(idx)
        if pause is None:
            praw = self._lookup(self.pfc_fd, idx, PFC.size)
            pause = self._pause[idx] = PFC.unpack(praw)[1:] if praw is not None else (0, 0)
        start, end = pause
        now = time.monotonic_ns()
        dt = max(0, now - last)
        if start:
            hi, lo = min(end or now, now), max(start, last)
            dt -= max(0, hi - lo)
        depth = max(0.0, occ / (1 << FP_SHIFT) - dt * rate_pps / 1e9)
        feeds = 0
        if depth >= xoff or held:
            feeds = self.pfc_feeds(idx)
            self._low_seen[idx] = low
        elif depth < 1 and self._low_seen.get(idx) != low:
            self._update(self.pfc_fd, idx, PFC.pack(0, start, end), BPF_ANY)
            self._low_seen[idx] = low
        return depth, feeds

    def pfc_feeds(self, idx: int) -> int:
        """PFC: the ports that fed port ``idx``'s low-priority queue since the last call (bit n:
        port n), cleared by this call (a bit the program sets in between may be lost: the next
        packet from that port sets it again)."""
        raw = self._lookup(self.pfc_fd, idx, PFC.size)
        if raw is None:
            return 0
        feeds, start, end = PFC.unpack(raw)
        if feeds:
            self._update(self.pfc_fd, idx, PFC.pack(0, start, end), BPF_ANY)
        return feeds

    def set_paused(self, idx: int, paused: bool) -> None:
        """PFC: port ``idx`` is paused from now (``paused``) or resumes now: its virtual queue
        drains nothing for the time in between."""
        raw = self._lookup(self.pfc_fd, idx, PFC.size)
        if raw is None:
            return
        feeds, start, end = PFC.unpack(raw)
        now = time.monotonic_ns()
        start, end = (now, 0) if paused else (start, now)
        self._update(self.pfc_fd, idx, PFC.pack(feeds, start, end), BPF_ANY)
        self._pause[idx] = (start, end)


class Program:
    """The program loaded once for one switch (``name``, for messages) from object file
    ``obj_path``: its descriptor ``prog_fd`` and its :class:`Maps`. Raises MapError; what was
    loaded is released first."""

    def __init__(self, name: str, obj_path: str) -> None:
        """Open and load ``obj_path`` (compiled bpfsrc/port_queue.bpf.c)."""
        self.name, self.b = name, lib()
        self.obj = self.b.bpf_object__open_file(str(obj_path).encode(), None)
        if not self.obj or self.b.libbpf_get_error(self.obj):
            self.obj = None
            raise MapError(f"{name}: libbpf cannot open {obj_path}")
        rc = self.b.bpf_object__load(self.obj)
        if rc:
            self.close()
            raise MapError(f"{name}: the kernel refused bpfsrc/port_queue.bpf.c ({why(rc)}; "
                           "run as root on a kernel with BPF and BTF)")
        self.prog = self.b.bpf_object__find_program_by_name(self.obj, PROGRAM)
        self.prog_fd = self.b.bpf_program__fd(self.prog)
        self.un_prog_fd = self.b.bpf_program__fd(self.b.bpf_object__find_program_by_name(self.obj, PROGRAM_UN))
        self.maps = Maps(*(self.b.bpf_object__find_map_fd_by_name(self.obj, m.encode()) for m in MAPS))
        self.hooked: set[int] = set()  # ifindexes given a clsact qdisc

    def pin(self, pin_dir: str) -> None:
        """Pin the program (``pin_dir/prog``) and each map (``pin_dir/<map>``) under bpffs."""
        try:
            os.makedirs(pin_dir, exist_ok=True)
        except OSError as e:  # bpffs refuses a name with a dot (kernel/bpf/inode.c bpf_lookup)
            raise MapError(f"{self.name}: cannot make {pin_dir} under bpffs ({e.strerror})") from None
        rc = self.b.bpf_object__pin_maps(self.obj, pin_dir.encode())
        if rc:
            raise MapError(f"{self.name}: cannot pin its maps under {pin_dir} ({why(rc)})")
        rc = self.b.bpf_program__pin(self.prog, f"{pin_dir}/prog".encode())
        if rc:
            raise MapError(f"{self.name}: cannot pin its program under {pin_dir} ({why(rc)})")

    def close(self) -> None:
        """Release the object (attached and pinned programs and maps stay)."""
        if self.obj:
            self.b.bpf_object__close(self.obj)
            self.obj = None


def attach(name: str, prog_fd: int, intf: str, hooked: set[int] | None = None, ingress: bool = False) -> int:
    """Attach program ``prog_fd`` to ``intf``'s egress (``ingress``: its ingress; tc clsact, direct
    action) in the calling thread's namespace, replacing what is there; returns its ifindex.
    ``hooked``: ifindexes that have their clsact qdisc already (one is made for the others, and
    added). Raises MapError."""
    b = lib()
    try:
        idx = socket.if_nametoindex(intf)
    except OSError as e:
        raise MapError(f"{name}: no interface {intf} ({e})") from None
    hook = _TcHook(ctypes.sizeof(_TcHook), idx, BPF_TC_INGRESS if ingress else BPF_TC_EGRESS, 0)
    if hooked is None or idx not in hooked:  # once: a second create makes libbpf print the kernel's EEXIST
        rc = b.bpf_tc_hook_create(ctypes.byref(hook))
        if rc and rc != -errno.EEXIST:
            raise MapError(f"{name}: no clsact qdisc on {intf} ({why(rc)})")
        if hooked is not None:
            hooked.add(idx)
    opts = _TcOpts(ctypes.sizeof(_TcOpts), prog_fd, BPF_TC_F_REPLACE, 0, 1, 1)
    rc = b.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
    if rc:
        raise MapError(f"{name}: cannot attach the {'uN' if ingress else 'queue'} program to {intf} ({why(rc)})")
    return idx


def detach(name: str, intf: str) -> None:
    """Take the program off ``intf``'s egress in the calling thread's namespace. Raises MapError."""
    try:
        idx = socket.if_nametoindex(intf)
    except OSError as e:
        raise MapError(f"{name}: no interface {intf} ({e})") from None
    hook = _TcHook(ctypes.sizeof(_TcHook), idx, BPF_TC_EGRESS, 0)
    opts = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, 1, 1)
    rc = lib().bpf_tc_detach(ctypes.byref(hook), ctypes.byref(opts))
    if rc:
        raise MapError(f"{name}: cannot detach the program from {intf} ({why(rc)})")


def ensure_bpffs(root: str = BPFFS) -> None:
    """Mount bpffs at ``root`` unless one is there (as ``bpftool`` and ``tc`` do). Raises MapError."""
    with open("/proc/self/mounts") as f:
        if any(line.split()[1:3] == [root, "bpf"] for line in f):
            return
    if not os.path.isdir(root):
        raise MapError(f"{root} does not exist: this kernel has no sysfs bpf folder")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", root.encode(), b"bpf", 0, None):
        raise MapError(f"cannot mount bpffs at {root} ({os.strerror(ctypes.get_errno())})")


class Agent:
    """The queue agent on a server (module docstring): the switches' maps by pin folder, opened
    from their pins when first asked for."""

    def __init__(self) -> None:
        """No maps open yet."""
        self._maps: dict[str, Maps] = {}
        self._hooked: dict[str, set[int]] = {}

    def maps(self, pin: str) -> Maps:
        """The maps pinned under ``pin`` (opened once)."""
        m = self._maps.get(pin)
        if m is None:
            m = self._maps[pin] = Maps.pinned(pin)
        return m

    def put(self, path: str, data: str) -> None:
        """Write ``data`` (base64) to file ``path``, made whole before it is named."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.part"
        with open(tmp, "wb") as f:
            f.write(base64.b64decode(data))
        os.replace(tmp, path)

    def load(self, name: str, obj: str, netns: str, ports: list[str], pin: str, sid: str | None = None,
             egress: bool = True) -> dict[str, int]:
        """Load ``obj`` for switch ``name``, pin it under ``pin``, attach it to ``ports`` in the
        namespace at ``netns`` (a path): with ``sid`` (hex of the switch's uN SID, 6 bytes) the uN
        program on each port's ingress, with ``egress`` the queue program on each port's egress with
        zeroed counters; interface -> ifindex."""
        ensure_bpffs()
        prog = Program(name, obj)
        try:
            prog.pin(pin)
            hooked = self._hooked.setdefault(pin, set())
            out = {}
            with netns_path(netns):
                for intf in ports:
                    if sid is not None:
                        out[intf] = attach(name, prog.un_prog_fd, intf, hooked, ingress=True)
                    if egress:
                        out[intf] = attach(name, prog.prog_fd, intf, hooked)
            if sid is not None:
                prog.maps.set_sid(bytes.fromhex(sid))
            for idx in out.values():
                prog.maps.init_port(idx)
        finally:
            prog.close()
        return out

    def attach(self, name: str, netns: str, intf: str, pin: str) -> int:
        """The pinned program on ``intf`` again; its ifindex."""
        fd = lib().bpf_obj_get(f"{pin}/prog".encode())
        if fd < 0:
            raise MapError(f"{name}: no program pinned at {pin}/prog ({why(fd)})")
        try:
            with netns_path(netns):
                return attach(name, fd, intf, self._hooked.setdefault(pin, set()))
        finally:
            os.close(fd)

    def detach(self, name: str, netns: str, intf: str) -> None:
        """The program off ``intf``."""
        with netns_path(netns):
            detach(name, intf)

    def configure(self, pin: str, idx: int, cfg: str) -> None:
        """Port ``idx`` follows ``cfg`` (hex of a packed ``struct port_cfg``)."""
        self.maps(pin).configure(idx, bytes.fromhex(cfg))

    def sid_packets(self, pin: str) -> int:
        """:meth:`Maps.sid_packets` of the switch pinned under ``pin``."""
        return self.maps(pin).sid_packets()

    def states(self, items: list[list]) -> list[dict[str, int]]:
        """Each ``[pin, ifindex]``'s :meth:`Maps.state`, in order."""
        return [self.maps(pin).state(idx) for pin, idx in items]

    def pfc_look(self, items: list[list]) -> list[list]:
        """Each ``[pin, ifindex, rate_pps, xoff, held]``'s ``[queue now, feeds]``
        (:meth:`Maps.pfc_look`), in order."""
        return [list(self.maps(pin).pfc_look(idx, rate, xoff, held)) for pin, idx, rate, xoff, held in items]

    def set_paused(self, pin: str, idx: int, paused: bool) -> None:
        """:meth:`Maps.set_paused`."""
        self.maps(pin).set_paused(idx, paused)

    def forget(self, pin: str) -> None:
        """Close ``pin``'s maps (the pins stay until the run's folders are removed)."""
        m = self._maps.pop(pin, None)
        if m is not None:
            m.close()
        self._hooked.pop(pin, None)


#: The requests :func:`serve` answers: op -> the :class:`Agent` method.
OPS = ("put", "load", "attach", "detach", "configure", "sid_packets", "states", "pfc_look", "set_paused", "forget")


def serve(rfile=None, wfile=None) -> None:
    """Answer JSON requests, one a line (``{"op": name, ...arguments}``), with one JSON line each:
    ``{"ok": result}`` or ``{"error": words}``; until end of input."""
    rfile, wfile = rfile or sys.stdin, wfile or sys.stdout
    agent = Agent()
    for line in rfile:
        try:
            req = json.loads(line)
            op = req.pop("op")
            if op not in OPS:
                raise MapError(f"unknown request {op!r}")
            out = {"ok": getattr(agent, op)(**req)}
        except (MapError, OSError, TypeError, ValueError, KeyError) as e:
            out = {"error": str(e) or type(e).__name__}
        wfile.write(json.dumps(out) + "\n")
        wfile.flush()


if __name__ == "__main__":
    serve()
