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

import ctypes
import ctypes.util
import errno
import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from mrclab.emulation import kernel
from mrclab.topologies.errors import RunFailed

SOURCE = Path(__file__).resolve().parent.parent / "bpfsrc" / "port_queue.bpf.c"
CACHE_ROOT = Path(os.environ.get("MRCLAB_CACHE", Path.home() / ".cache" / "mrclab")) / "bpf"
#: htb classes the program chooses between (bpfsrc/port_queue.bpf.c CLASS_HIGH, CLASS_LOW).
CLASS_HIGH, CLASS_LOW = "1:10", "1:20"
BPF_ANY, BPF_NOEXIST, BPF_F_LOCK = 0, 1, 4  # linux/bpf.h
BPF_TC_EGRESS, BPF_TC_F_REPLACE = 2, 1  # libbpf.h
#: struct port_cfg: rate_pps, ecn_k, trim_t, q_limit, loss_threshold (of 65536), salt, lossless, port_no,
#: frame_bytes
CFG = struct.Struct("<9I")
#: struct pfc_state: feeds (bit n: port n fed the low-priority queue), pause_start, pause_end (ns)
PFC = struct.Struct("<3Q")
#: struct port_state: lock, lcg, last_ns, occ, marked, trimmed, queue_full, gray, low, high
STATE = struct.Struct("<II8Q")
STATE_FIELDS = ("marked", "trimmed", "queue_full", "gray", "low", "high")
FP_SHIFT = 20  # the virtual queue's fixed point


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

    def pack(self) -> bytes:
        """The ``struct port_cfg`` map value: nine little-endian u32, ``loss`` as a threshold out of
        65536."""
        return CFG.pack(self.rate_pps, self.ecn_k, self.trim_t, self.q_limit, round(self.loss * 65536),
                        self.salt & 0xFFFFFFFF, int(self.lossless), self.port_no, self.frame_bytes)


def bpf_missing() -> str | None:
    """Why this machine cannot run the program (clang, libbpf, headers), or None."""
    if shutil.which("clang") is None:
        return "clang is not installed (setup.sh installs it: apt-get install clang)"
    if not Path("/usr/include/bpf/bpf_helpers.h").exists():
        return "libbpf's headers are not installed (setup.sh installs them: apt-get install libbpf-dev)"
    if _libbpf_path() is None:
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


def _libbpf_path() -> str | None:
    for name in ("libbpf.so.1", ctypes.util.find_library("bpf")):
        if name:
            try:
                ctypes.CDLL(name)
                return name
            except OSError:
                continue
    return None


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


class _TcHook(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("ifindex", ctypes.c_int), ("attach_point", ctypes.c_int),
                ("parent", ctypes.c_uint32)]


class _TcOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("prog_fd", ctypes.c_int), ("flags", ctypes.c_uint32),
                ("prog_id", ctypes.c_uint32), ("handle", ctypes.c_uint32), ("priority", ctypes.c_uint32)]


def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(_libbpf_path() or "libbpf.so.1", use_errno=True)
    lib.bpf_object__open_file.restype = ctypes.c_void_p
    lib.bpf_object__open_file.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.libbpf_get_error.argtypes = [ctypes.c_void_p]
    lib.libbpf_get_error.restype = ctypes.c_long
    lib.bpf_object__load.argtypes = [ctypes.c_void_p]
    lib.bpf_object__close.argtypes = [ctypes.c_void_p]
    lib.bpf_object__find_program_by_name.restype = ctypes.c_void_p
    lib.bpf_object__find_program_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.bpf_program__fd.argtypes = [ctypes.c_void_p]
    lib.bpf_object__find_map_fd_by_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    for f in (lib.bpf_map_update_elem, lib.bpf_map_lookup_elem_flags):
        f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    lib.bpf_tc_hook_create.argtypes = [ctypes.POINTER(_TcHook)]
    lib.bpf_tc_attach.argtypes = [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]
    lib.bpf_tc_detach.argtypes = [ctypes.POINTER(_TcHook), ctypes.POINTER(_TcOpts)]
    return lib


def _why(rc: int) -> str:
    return os.strerror(-rc if rc < 0 else ctypes.get_errno() or errno.EINVAL)


class SwitchBpf:
    """The program loaded for one switch (its maps are this switch's), attached to ``ports``
    (interface names) inside namespace ``netns``. Raises :class:`BpfError`."""

    def __init__(self, name: str, netns: str, obj_path: Path, ports: list[str]) -> None:
        """Open and load ``obj_path`` (:func:`compile_bpf`) for switch ``name`` and attach it to every
        interface of ``ports`` inside ``netns``. Raises BpfError; what was loaded is released first."""
        self.name, self.lib = name, _lib()
        self.obj = self.lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self.obj or self.lib.libbpf_get_error(self.obj):
            self.obj = None
            raise BpfError(f"{name}: libbpf cannot open {obj_path}")
        rc = self.lib.bpf_object__load(self.obj)
        if rc:
            self.close()
            raise BpfError(f"{name}: the kernel refused bpfsrc/port_queue.bpf.c ({_why(rc)}; "
                           "run as root on a kernel with BPF and BTF)")
        prog = self.lib.bpf_object__find_program_by_name(self.obj, b"mrclab_egress")
        self.prog_fd = self.lib.bpf_program__fd(prog)
        self.cfg_fd = self.lib.bpf_object__find_map_fd_by_name(self.obj, b"port_cfg")
        self.state_fd = self.lib.bpf_object__find_map_fd_by_name(self.obj, b"port_state")
        self.pfc_fd = self.lib.bpf_object__find_map_fd_by_name(self.obj, b"pfc")
        self.netns = netns
        self.ifindex: dict[str, int] = {}  # interface name -> ifindex, the maps' key
        self.hooked: set[str] = set()  # interfaces given a clsact qdisc
        try:
            for intf in ports:
                self.attach(intf)
        except BaseException:
            self.close()
            raise

    def attach(self, intf: str) -> None:
        """The program on ``intf``'s egress (again, after :meth:`detach`), its state kept."""
        with kernel.inside(self.netns):
            idx = self.ifindex[intf] = socket.if_nametoindex(intf)
            hook = _TcHook(ctypes.sizeof(_TcHook), idx, BPF_TC_EGRESS, 0)
            if intf not in self.hooked:  # once: a second create makes libbpf print the kernel's EEXIST
                rc = self.lib.bpf_tc_hook_create(ctypes.byref(hook))
                if rc and rc != -errno.EEXIST:
                    raise BpfError(f"{self.name}: no clsact qdisc on {intf} ({_why(rc)})")
                self.hooked.add(intf)
            opts = _TcOpts(ctypes.sizeof(_TcOpts), self.prog_fd, BPF_TC_F_REPLACE, 0, 1, 1)
            rc = self.lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts))
            if rc:
                raise BpfError(f"{self.name}: cannot attach the program to {intf} ({_why(rc)})")
        self._update(self.state_fd, idx, ctypes.create_string_buffer(STATE.size), BPF_NOEXIST, ok_exists=True)
        self._update(self.pfc_fd, idx, ctypes.create_string_buffer(PFC.size), BPF_NOEXIST, ok_exists=True)

    def detach(self, intf: str) -> None:
        """Take the program off ``intf`` (packets pass untouched; the benchmark's yardstick)."""
        with kernel.inside(self.netns):
            hook = _TcHook(ctypes.sizeof(_TcHook), self.ifindex[intf], BPF_TC_EGRESS, 0)
            opts = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, 1, 1)
            rc = self.lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(opts))
            if rc:
                raise BpfError(f"{self.name}: cannot detach the program from {intf} ({_why(rc)})")

    def _update(self, fd: int, idx: int, value, flags: int, ok_exists: bool = False) -> None:
        key = ctypes.c_uint32(idx)
        buf = value if isinstance(value, ctypes.Array) else ctypes.create_string_buffer(value, len(value))
        rc = self.lib.bpf_map_update_elem(fd, ctypes.byref(key), buf, flags)
        if rc and not (ok_exists and rc == -errno.EEXIST):
            raise BpfError(f"{self.name}: map update refused ({_why(rc)})")

    def configure(self, intf: str, cfg: PortConfig) -> None:
        """Port ``intf`` from now on follows ``cfg`` (the queue and counters carry on)."""
        self._update(self.cfg_fd, self.ifindex[intf], cfg.pack(), BPF_ANY)

    def state(self, intf: str) -> dict[str, int]:
        """Port ``intf``'s counters (:data:`STATE_FIELDS`, packets since attach) and ``queue``
        (low-priority packets the virtual queue held at its last packet)."""
        key, buf = ctypes.c_uint32(self.ifindex[intf]), ctypes.create_string_buffer(STATE.size)
        rc = self.lib.bpf_map_lookup_elem_flags(self.state_fd, ctypes.byref(key), buf, BPF_F_LOCK)
        if rc:
            raise BpfError(f"{self.name}: cannot read {intf}'s counters ({_why(rc)})")
        _lock, _lcg, _last, occ, *counts = STATE.unpack(buf.raw)
        return {"queue": occ >> FP_SHIFT, **dict(zip(STATE_FIELDS, counts, strict=True))}

    def queue_now(self, intf: str, rate_pps: int) -> float:
        """PFC: port ``intf``'s low-priority queue now (packets): the program's count at its last
        packet, drained since at ``rate_pps`` but for the time the port was paused (as the program
        drains it at its next packet)."""
        key, buf = ctypes.c_uint32(self.ifindex[intf]), ctypes.create_string_buffer(STATE.size)
        if self.lib.bpf_map_lookup_elem_flags(self.state_fd, ctypes.byref(key), buf, BPF_F_LOCK):
            return 0.0
        last, occ = STATE.unpack(buf.raw)[2:4]
        pbuf = ctypes.create_string_buffer(PFC.size)
        start = end = 0
        if not self.lib.bpf_map_lookup_elem_flags(self.pfc_fd, ctypes.byref(key), pbuf, 0):
            _feeds, start, end = PFC.unpack(pbuf.raw)
        now = time.monotonic_ns()
        dt = max(0, now - last)
        if start:
            hi, lo = min(end or now, now), max(start, last)
            dt -= max(0, hi - lo)
        return max(0.0, occ / (1 << FP_SHIFT) - dt * rate_pps / 1e9)

    def pfc_feeds(self, intf: str) -> int:
        """PFC: the ports that fed ``intf``'s low-priority queue since the last call (bit n: port n),
        cleared by this call (a bit the program sets in between may be lost: the next packet from
        that port sets it again)."""
        key, buf = ctypes.c_uint32(self.ifindex[intf]), ctypes.create_string_buffer(PFC.size)
        if self.lib.bpf_map_lookup_elem_flags(self.pfc_fd, ctypes.byref(key), buf, 0):
            return 0
        feeds, start, end = PFC.unpack(buf.raw)
        if feeds:
            self._update(self.pfc_fd, self.ifindex[intf], PFC.pack(0, start, end), BPF_ANY)
        return feeds

    def set_paused(self, intf: str, paused: bool) -> None:
        """PFC: ``intf`` is paused from now (``paused``) or resumes now: its virtual queue drains
        nothing for the time in between. ``time.monotonic_ns`` is the program's ``bpf_ktime_get_ns``
        clock (CLOCK_MONOTONIC)."""
        key, buf = ctypes.c_uint32(self.ifindex[intf]), ctypes.create_string_buffer(PFC.size)
        if self.lib.bpf_map_lookup_elem_flags(self.pfc_fd, ctypes.byref(key), buf, 0):
            return
        feeds, start, end = PFC.unpack(buf.raw)
        now = time.monotonic_ns()
        start, end = (now, 0) if paused else (start, now)
        self._update(self.pfc_fd, self.ifindex[intf], PFC.pack(feeds, start, end), BPF_ANY)

    def close(self) -> None:
        """Release the object (attached programs stay until their namespace goes)."""
        if self.obj:
            self.lib.bpf_object__close(self.obj)
            self.obj = None


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
