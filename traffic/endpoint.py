"""The MRC endpoint process: one per host, inside the host's network namespace, or one for several
hosts where a fabric has more hosts than this machine has cores for (:func:`run_group`).

    python -m mrclab.traffic.endpoint --config CONFIG.json [--config CONFIG2.json --netns NETNS2 ...]

The config is a :class:`traffic.contract.EndpointConfig` (the runner writes it); the endpoint writes
the telemetry records of :mod:`traffic.contract` to ``telemetry_path``: ``start`` once its sockets
are open, a ``sample`` every ``telemetry_interval_s``, events as they happen, ``summary`` last.
Every endpoint also receives: QPs peers open to it are created on their first packet.

The process exits 0 once every QP it sends has finished (count reached, or duration over and
everything acknowledged), or on SIGTERM/SIGINT, after writing the summary; 2 for a config it cannot
use (one line on stderr naming the field).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import errno
import fcntl
import math
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import BadInput
from mrclab.topologies.spec import load_spec
from mrclab.traffic import contract as C
from mrclab.traffic.collective import Collective, Iteration
from mrclab.traffic.host import HostStack
from mrclab.traffic.region import ReceiveRegion, message_source
from mrclab.traffic.transport import Sender
from mrclab.traffic.txstamp import drain as drain_stamps
from mrclab.traffic.txstamp import open_stamped

ETH_P_ALL = 0x0003
PACKET_IGNORE_OUTGOING = 23
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # linux <asm-generic/socket.h>; Python does not export them
SOL_PACKET = 263
PACKET_STATISTICS = 6  # linux <linux/if_packet.h>: struct tpacket_stats {tp_packets, tp_drops}, reset when read
#: How often the NIC ports' carrier is read (s): well inside the smallest RTO (20 ms), so a port that
#: goes down is announced before the packets lost with it time out and blame their EVs.
PORT_POLL_S = 0.01
#: Bytes of a memory page (/proc/self/statm counts pages).
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
#: linux <linux/sockios.h>, <linux/ethtool.h>: an ethtool request, and the one that reads the link
SIOCETHTOOL = 0x8946
ETHTOOL_GLINK = 0x0000000A
#: linux <sched.h>: setns(2)'s namespace type
CLONE_NEWNET = 0x40000000
#: Where ``ip netns`` keeps a named namespace.
NETNS_RUN_DIR = "/var/run/netns"
#: Frames are read into one buffer and handed on as views of it: nothing keeps a view past
#: on_frame (payloads are copied into the memory region), and no 9 KiB buffer is made per frame;
#: one per process, shared by the hosts it serves (a turn handles a frame whole before the next).
_RXBUF = bytearray(65536)
#: Where a frame's BTH opcode is, and the opcodes of data packets: the frames a stamped port sends
#: through its stamped socket (traffic/txstamp.py); control frames go through the port's own socket
_OP_AT = H.OFF_BTH
_DATA_OPS = frozenset((H.OP_WRITE, H.OP_WRITE_IMM))
#: How often the departure stamps are read (s): every turn cost a failed read per port when none
#: had come; a stamp read this much late only moves a timer due within it by one RTO at most, and
#: re-times it from about when the packet left (traffic/sender.py ``_left_nic_later``).
STAMP_READ_S = 0.001
_RXVIEW = memoryview(_RXBUF)
_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the block in network namespace ``name`` (``ip netns``'s name), back in this process's
    own after, however it ends; None: stay. setns(2) through ctypes, not pyroute2: importing
    pyroute2.netns costs an endpoint 0.24 s of start-up (``python -X importtime``). Raises
    OSError for a namespace that does not exist."""
    if name is None:
        yield
        return
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        target = os.open(os.path.join(NETNS_RUN_DIR, name), os.O_RDONLY)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, f"setns into {name}: {os.strerror(e)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            _libc.setns(own, CLONE_NEWNET)
    finally:
        os.close(own)


def _cpu_s() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


class Telemetry:
    """Telemetry records as JSON lines (nothing without a path), buffered: written to the file at
    each :meth:`flush` (the endpoint flushes after every sample, so a reader is at most one
    ``telemetry_interval_s`` behind) and at :meth:`close`. Line buffering cost a write(2) per record:
    a tenth of a flap-soak sender's CPU (py-spy), in its thousands of loss and EV events."""

    def __init__(self, path: str | None) -> None:
        """Append to ``path``, or write nothing when it is None."""
        self.fh = open(path, "a") if path else None  # noqa: SIM115 (closed by close())

    def write(self, rec: C.Record) -> None:
        """One record as a JSON line (in the file by the next :meth:`flush`)."""
        if self.fh is not None:
            self.fh.write(C.encode(rec) + "\n")

    def flush(self) -> None:
        """Hand what was written to the file."""
        if self.fh is not None:
            self.fh.flush()

    def close(self) -> None:
        """Close the file (records written so far stay)."""
        if self.fh is not None:
            self.fh.close()


class Endpoint:
    """Raw sockets + :class:`HostStack` + telemetry for one host. ``run()`` returns an exit code."""

    def __init__(self, cfg: C.EndpointConfig) -> None:
        """The endpoint of ``cfg``: its fabric's address plan, a :class:`HostStack` with its QPs
        and collective, telemetry; sockets are opened by :meth:`run`. Raises ContractError for a bad config."""
        self.cfg = cfg
        spec = load_spec(cfg.topo)
        self.plan = AddressPlan(spec)
        self.host = cfg.host
        spec.host_index(self.host)
        self.settings = cfg.settings
        self.tel = Telemetry(cfg.telemetry_path)
        self.stack = HostStack(self.plan, self.host, self.settings, transport=cfg.transport, seed=cfg.seed,
                               events=self.tel.write, denylist=frozenset(cfg.denylist))
        self.t0_wall = cfg.start_at_wall if cfg.start_at_wall is not None else time.time()
        self.flows: list[tuple[Sender, float, float | None]] = []  # (sender, start_s, duration_s)
        for q in cfg.qps:
            spec.host_index(q.peer)
            msgs = message_source(cfg.seed * 7919 + q.qp, q.message_bytes, q.count)
            s = self.stack.add_sender(q.qp, q.peer, msgs, imm=q.op == "write_imm", pin_ev=q.pin_ev)
            self.flows.append((s, q.start_s, q.duration_s))
        self.coll: Collective | None = None
        if (cc := cfg.collective) is not None:
            for h in cc.ranks:
                spec.host_index(h)
            try:
                self.coll = Collective(cc.kind, list(cc.ranks), self.host, cc.message_bytes, cc.iterations,
                                       cc.qps_per_peer, seed=cc.seed, on_iteration=self._iteration_done)
            except ValueError as e:
                raise C.ContractError(f"collective: {e}") from None
            for (peer, _qp), s in zip(self.coll.outq, self.stack.add_collective(self.coll), strict=True):
                self.flows.append((s, cc.start_s, None))
        self.socks: dict[int, socket.socket] = {}
        #: plane -> the send-only socket whose frames the port stamps as it sends them (shaped ports
        #: only; traffic/txstamp.py): this host's frames leave through it
        self.stamped: dict[int, socket.socket] = {}
        self._stamps: list[tuple[bytes, float]] = []
        self._send_fn: dict[int, Callable] = {}
        self._data_fn: dict[int, Callable] = {}  # plane -> how a data frame is sent (stamped where it can be)
        self._next_stamps = 0.0
        self._ifreq: dict[int, bytes] = {}  # plane -> struct ifreq naming its port (SIOCETHTOOL)
        self._glink = array.array("I", [ETHTOOL_GLINK, 0])  # struct ethtool_value {cmd, data} the ioctl fills
        #: the host's network namespace, where this process serves several hosts: it enters it to
        #: open the host's sockets (None: the process's own, as for one host)
        self.netns: str | None = None
        self.stop_requested = False
        self.loop_gap_max_s = 0.0  # since the last sample: the longest wait for a CPU between two turns (s)
        self._statm: int | None = None  # fd of /proc/self/statm
        self.socket_drops = 0  # frames the kernel dropped because a socket's receive buffer was full
        self.send_drops = 0  # frames a port refused with an error other than "no room yet" (dropped)
        #: the path's one-way propagation delay (s; topologies.spec.LinkParams.path_delay_ms), applied
        #: here: a received frame waits in ``_line`` (arrival order, so due times ascend) until then
        self.delay_s = spec.link.path_delay_ms / 1000
        self._line: deque[tuple[float, bytearray]] = deque()

    def _iteration_done(self, it: Iteration) -> None:
        """A finished iteration, on the wall clock (the runner lines hosts up by it)."""
        to_wall = time.time() - time.monotonic()
        self.tel.write(C.CollectiveIteration(index=it.index, start_wall=it.start_s + to_wall,
                                             end_wall=it.end_s + to_wall, crc=it.crc))

    # ---- sockets and ports -----------------------------------------------------------------
    def socks_by_fd(self) -> dict[int, socket.socket]:
        """This host's open sockets by file descriptor."""
        return {sk.fileno(): sk for sk in self.socks.values()}

    def open(self) -> None:
        """One raw AF_PACKET socket per plane, bound to the host's NIC port there, non-blocking;
        opened inside the host's namespace (``netns``, when this process serves several hosts
        and was started in another's), where each stays for good."""
        with in_netns(self.netns):
            for p in range(self.plan.spec.planes):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                try:
                    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    pass
                for opt in (SO_RCVBUFFORCE, SO_SNDBUFFORCE):
                    try:
                        s.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
                    except OSError:
                        pass
                s.bind((self.plan.host_intf(self.host, p), ETH_P_ALL))
                s.setblocking(False)
                self.socks[p] = s
                self._send_fn[p] = self._data_fn[p] = s.send
                # struct ifreq: the port's name, then ifr_data pointing at the ethtool_value
                self._ifreq[p] = struct.pack("16sP", self.plan.host_intf(self.host, p).encode(),
                                             self._glink.buffer_info()[0]).ljust(40, b"\0")
            if self.stack.nic is not None and self.stack.settings.nic_stamps:
                self._open_stamped()

    def _open_stamped(self) -> None:
        """A stamped send-only socket per port, every data frame sent through it (traffic/txstamp.py):
        the senders time their packets from a port's stamps once the first comes (a device that
        stamps nothing, a VXLAN port to another server, leaves its port to the host's model of
        its queues). Where the kernel refuses stamps on any port, none."""
        try:
            for p in range(self.plan.spec.planes):
                self.stamped[p] = open_stamped(self.plan.host_intf(self.host, p))
        except OSError:
            for sk in self.stamped.values():
                sk.close()
            self.stamped.clear()
            return
        for p, sk in self.stamped.items():
            self._data_fn[p] = sk.send

    def read_stamps(self) -> int:
        """Hand the stack every departure stamp the ports queued since the last read (each a frame
        this host sent, with when its port sent it: :meth:`HostStack.left_port`). Returns how many."""
        got = self._stamps
        n = 0
        to_mono = 0.0
        for plane, sk in self.stamped.items():
            if not drain_stamps(sk, got):
                continue
            if not n:
                to_mono = time.monotonic() - time.time()
            n += len(got)
            left = self.stack.left_port
            for head, t in got:
                left(plane, head, t + to_mono)
            got.clear()
        return n

    def port_state(self) -> int:
        """Bit p = the plane-p port has carrier (ETHTOOL_GLINK, the kernel's netif_carrier_ok, as
        sysfs's ``carrier`` reads it; a port set administratively down has none), read every
        PORT_POLL_S with an ioctl on the port's own socket: the socket's namespace answers,
        whichever namespace this process is in. Not IFF_RUNNING: the operational state follows
        the carrier only when the kernel's link watch gets to it, up to a second later."""
        state = 0
        link = self._glink
        for p, sock in self.socks.items():
            link[0], link[1] = ETHTOOL_GLINK, 0
            try:
                fcntl.ioctl(sock.fileno(), SIOCETHTOOL, self._ifreq[p])
            except OSError:  # the interface is gone (its namespace is being torn down)
                link[1] = 0
            state |= int(link[1] != 0) << p
        return state

    # ---- loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        """Open the sockets, say ready, wait for t = 0, then move frames until every QP is done (or a
        stop is requested); writes samples and a summary to telemetry. Returns the exit code (0)."""
        return run_group([self])

    def begin(self, t0_wall: float) -> None:
        """Set t = 0 (``t0_wall``, as time.time()) and the loop's state; the sockets are open."""
        self.t0_wall = t0_wall
        self.mono0 = time.monotonic() + (t0_wall - time.time())  # monotonic time of t = 0
        self.next_tel = self.next_ports = 0.0
        self.backlog: dict[int, deque] = {p: deque() for p in self.socks}
        self.started: set[int] = set()
        self.stopped: set[int] = set()
        self.finished_at: float | None = None
        self.finished = False
        self.coll_started = False
        self.max_end = max([st + (d or 0) for _, st, d in self.flows] or [0.0])
        self._active: set[int] | None = set()
        self._recv = {sk.fileno(): sk.recv_into for sk in self.socks.values()}
        self._cpu0 = _cpu_s()

    # hot path, kept whole on purpose (the endpoint loop: one turn per wake-up, every frame read and sent in it)
    def turn(self, now: float, ready: Iterable[int] = ()) -> int:  # noqa: PLR0915
        """One turn of the loop at monotonic ``now``: port state, starts and stops, the frames
        waiting in the sockets whose descriptors are in ``ready`` (poll found them readable; at
        most 256 per port), what the stack has due, telemetry. Returns the frames moved (0: an
        idle turn, see :meth:`due`); sets ``finished`` when done."""
        stack = self.stack
        t = now - self.mono0
        if now >= self.next_ports:
            stack.set_local_ports(self.port_state())
            self.next_ports = now + PORT_POLL_S
        if self.coll is not None and self.cfg.collective is not None and not self.coll_started \
                and t >= self.cfg.collective.start_s:
            self.coll_started = True
            self.coll.start(time.monotonic)
        started, stopped = self.started, self.stopped
        for i, (s, start, dur) in enumerate(self.flows):
            if i not in started and t >= start:
                started.add(i)
            if dur is not None and i not in stopped and t >= start + dur:
                s.stop()
                stopped.add(i)
                stack.wake()
        if self.stamped and now >= self._next_stamps:  # first: a timer due now is judged by when its packet left
            self.read_stamps()
            self._next_stamps = now + STAMP_READ_S
        work = 0
        rxview = _RXVIEW
        delay, line = self.delay_s, self._line
        clock = time.monotonic
        for fd in ready:
            rv = self._recv[fd]
            for _ in range(256):
                try:
                    n = rv(_RXBUF)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # ENETDOWN once when the port goes down: the carrier poll handles it
                    break
                work += 1
                # stamped as read, never before: a frame that came while this turn ran (or while
                # the machine held it) stamped with the turn's start would read an RTT shorter
                # than its path's, and NSCC's base RTT, the least sample, never forgets one (a
                # 3 ms stall cut a QP's window by a third for the rest of a quickstart run)
                rx_now = clock()
                if delay:
                    line.append((rx_now + delay, _RXBUF[:n]))
                    continue
                r = stack.on_frame(rxview[:n], rx_now)
                if r:
                    self._send(r, self.backlog)
        while line and line[0][0] <= now:  # frames whose propagation delay is over
            work += 1
            r = stack.on_frame(line.popleft()[1], now)
            if r:
                self._send(r, self.backlog)
        # every QP once all have started; until then only those whose start time has come
        self._active = None if len(started) == len(self.flows) else {id(self.flows[i][0]) for i in started}
        out = stack.poll(now, active=self._active)
        self._send(out, self.backlog)
        work += len(out)
        for plane, q in self.backlog.items():
            while q and self._sent(plane, q[0]):
                q.popleft()
        if now >= self.next_tel:
            self._sample()
            self.next_tel = now + self.cfg.telemetry_interval_s
        if self.flows and all(s.done for s, _, _ in self.flows) and (self.coll is None or self.coll.finished):
            if self.finished_at is None:
                self.finished_at = now
            if now - self.finished_at > 0.2:  # linger: acknowledge the peer's last packets
                self.finished = True
        if not self.flows and t > self.max_end + self.cfg.receiver_linger_s:
            self.finished = True
        return work

    def due(self, now: float) -> float:
        """After an idle turn: when this host next has something to do with no frame received
        (monotonic s): a delayed frame's arrival, a QP's timer (delayed SACK, RTO, probes, DCQCN), the carrier poll,
        telemetry, a flow's start or end, the collective's start, the linger's end."""
        due = min(self.stack.next_due(now, self._active), self.next_ports, self.next_tel)
        if self._line:
            due = min(due, self._line[0][0])
        mono0 = self.mono0
        for i, (_s, start, dur) in enumerate(self.flows):
            if i not in self.started:
                due = min(due, mono0 + start)
            elif dur is not None and i not in self.stopped:
                due = min(due, mono0 + start + dur)
        if self.coll is not None and self.cfg.collective is not None and not self.coll_started:
            due = min(due, mono0 + self.cfg.collective.start_s)
        if self.finished_at is not None:
            due = min(due, self.finished_at + 0.2)
        if not self.flows:
            due = min(due, mono0 + self.max_end + self.cfg.receiver_linger_s)
        return due

    def finish(self, share: int = 1) -> None:
        """The last sample and the summary (this process's CPU since :meth:`begin` over ``share``,
        the hosts it served), then close the telemetry, sockets and files."""
        self._sample()
        cpu1 = _cpu_s()
        cpu0 = self._cpu0
        self.tel.write(C.Summary(self._tx(final=True), self._rx(), self.stack.dropped(),
                                 (sum(cpu1) - sum(cpu0)) / share, (cpu1[1] - cpu0[1]) / share))
        self.tel.close()
        for sock in [*self.socks.values(), *self.stamped.values()]:
            sock.close()
        if self._statm is not None:
            os.close(self._statm)

    def _send(self, frames: list[tuple[int, bytes]], backlog: dict[int, deque]) -> None:
        """Send each (plane, frame) now, or queue it behind what its port has not taken yet
        (frames leave in order). :meth:`_sent`, inlined: a call less per frame on the hot path."""
        send_fn, data_fn = self._send_fn, self._data_fn
        for plane, frame in frames:
            q = backlog[plane]
            if q:
                q.append(frame)
                continue
            try:
                (data_fn if frame[_OP_AT] in _DATA_OPS else send_fn)[plane](frame)
            except (BlockingIOError, InterruptedError):
                q.append(frame)
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    q.append(frame)
                else:
                    self.send_drops += 1

    def _sent(self, plane: int, frame: bytes) -> bool:
        """True when the frame is gone: sent, or dropped because the port is down (the transport
        recovers). False when the port cannot take it yet: a NIC holds frames its port has no room
        for (ENOBUFS: the qdisc is full) rather than losing them, so they wait in the backlog."""
        try:
            (self._data_fn if frame[_OP_AT] in _DATA_OPS else self._send_fn)[plane](frame)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            if e.errno == errno.ENOBUFS:
                return False
            self.send_drops += 1
        return True

    def _tx(self, final: bool = False) -> tuple[C.TxQp, ...]:
        out = []
        for (peer, qp), s in self.stack.senders.items():
            srtt = s.srtt_s
            out.append(C.TxQp(peer, qp, s.stats, srtt * 1e6 if srtt else None, s.ev_states(), s.window_bytes,
                              s.rate_bps, tuple(s.completion_s) if final else (), s.ev_packets()))
        return tuple(out)

    def _rx(self) -> tuple[C.RxQp, ...]:
        return tuple(C.RxQp.of(peer, qp, r.stats) for (peer, qp), r in self.stack.receivers.items())

    def _sample(self) -> None:
        self.tel.write(C.Sample(self._tx(), self._rx(), self.stack.local_ports, round(self.loop_gap_max_s, 6),
                                self._rss_bytes(), ReceiveRegion.resident_total, self._socket_drops(),
                                self.send_drops))
        self.tel.flush()
        self.loop_gap_max_s = 0.0

    def _socket_drops(self) -> int:
        """Frames the kernel dropped, since the run began, because one of this host's sockets had no
        room for them (PACKET_STATISTICS' tp_drops, packet(7); each read resets it): a loss no
        switch counts, a receiver that fell that far behind its ports."""
        for sock in self.socks.values():
            try:
                self.socket_drops += struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
            except OSError:  # the socket is gone (its namespace is being torn down)
                pass
        return self.socket_drops

    def _rss_bytes(self) -> int:
        """Resident memory (bytes): /proc/self/statm's second field in pages, read from a file
        opened once (the soak's "memory flat" reads it); 0 where there is no such file."""
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            return int(os.pread(self._statm, 128, 0).split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            return 0


def _wait_for_go(path: str, eps: list[Endpoint]) -> float:
    """The start-up barrier: wait (10 ms polls) until the runner writes ``path`` (every endpoint
    is ready) and return the t = 0 it holds, as time.time(). A stop request ends the wait."""
    while not any(ep.stop_requested for ep in eps):
        try:
            return float(Path(path).read_text())
        except (FileNotFoundError, ValueError):  # not yet, or not yet whole (it is renamed into place)
            time.sleep(0.01)
    return time.time()


def cpu_wait_reader() -> Callable[[], int]:
    """A function returning the calling thread's time so far runnable but waiting for a CPU (ns), from
    the scheduler's account (``/proc/thread-self/schedstat``, second field: run-queue delay; one
    ``pread`` of a descriptor kept open, about 1 us); a function returning 0 where the kernel keeps no
    schedstats (CONFIG_SCHED_INFO off), so no lateness is ever reported there."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return lambda: 0
    return lambda: int(os.pread(fd, 128, 0).split()[1])


def _poller(eps: list[Endpoint]) -> tuple[select.poll, dict[int, Endpoint]]:
    """A poll object with every socket of ``eps`` registered for input, and each socket's
    descriptor -> the host it belongs to."""
    owner: dict[int, Endpoint] = {}
    poller = select.poll()
    for ep in eps:
        for sk in ep.socks.values():
            poller.register(sk.fileno(), select.POLLIN)
            owner[sk.fileno()] = ep
    return poller, owner


def run_group(eps: list[Endpoint]) -> int:
    """Serve the hosts of ``eps`` in one loop (one process for several hosts costs one interpreter
    and one wake-up where each would cost its own): open each host's sockets, say ready, wait
    for t = 0, then turn the hosts until all are finished or a stop is requested, sleeping when
    a turn moved nothing until a frame comes or the soonest deadline of any host (at least 1 ms,
    poll's unit; at most the carrier poll's 10 ms). A wake-up turns only the hosts it is for: those
    a frame came for, those whose own deadline (:meth:`Endpoint.due`, taken after an idle turn)
    has come, and those whose last turn moved frames (their window may still be open); the others'
    state cannot have changed. Each host keeps its own telemetry, and its own lateness (the "late
    timers" invariant): a host whose deadline came reads the time from its deadline, or from the
    end of its own last turn if later, to the start of this one (the machine's waits, the poll's
    rounding and the other hosts' turns: on separate machines each host has a CPU of its own); a
    host a frame woke reads the process's wait for a CPU since the loop began and the turns of the
    hosts before it. Its own turns are never counted: they are the transport's cost. Each turn runs
    at the clock read as it starts. Returns the exit code (0)."""
    for ep in eps:
        ep.open()
        ep.tel.write(C.Start(ep.host, ep.stack.transport, tuple(s.qp for s, _, _ in ep.flows)))
        ep.tel.flush()  # the runner counts the hosts that started
    poller, owner = _poller(eps)
    t0_wall = eps[0].t0_wall
    first = eps[0].cfg
    if first.start_at_wall is None and first.go_path:
        t0_wall = _wait_for_go(first.go_path, eps)
    for ep in eps:
        ep.begin(t0_wall)
    live = list(eps)
    waited = cpu_wait_reader()
    wait_prev = waited()
    # which sockets to read this turn: those poll found readable (every one at first). Trying each
    # socket until it would block cost an exception per port per turn: 16 a turn for a process
    # serving two hosts of an 8-plane fabric
    ready: dict[Endpoint, list[int]] = {ep: list(ep.socks_by_fd()) for ep in eps}
    # when each host next needs a turn with no frame for it (monotonic s; 0: at once). Turning every
    # host at every wake-up turned hosts with nothing to do: most wake-ups are one host's frame or
    # deadline (lab64-quickstart on linux, two hosts a process: 9% of the endpoints' CPU)
    due_at: dict[Endpoint, float] = {ep: 0.0 for ep in eps}
    # when each host's last turn ended: its own work is the transport's, never its lateness
    own_end: dict[Endpoint, float] = dict.fromkeys(eps, time.monotonic())
    while live and not any(ep.stop_requested for ep in eps):
        now = time.monotonic()
        # the fidelity monitor's "late timers" invariant: how long since the last turn began this
        # loop was runnable but waited for a CPU (the kernel's account): time the machine took
        wait = waited()
        late, wait_prev = (wait - wait_prev) * 1e-9, wait
        work = 0
        finished = False
        for ep in live:
            fds = ready.get(ep)
            due = due_at[ep]
            if fds is None and due > now:
                continue
            start = time.monotonic()
            # its deadline came (0: at once): late by all that ran since, but its own turn; a frame
            # woke it: the machine's wait and the hosts turned before it (module docstring)
            behind = start - max(due, own_end[ep]) if due <= now else late + (start - now)
            if behind > ep.loop_gap_max_s:
                ep.loop_gap_max_s = behind
            moved = ep.turn(start, fds or ())
            own_end[ep] = end = time.monotonic()
            work += moved
            due_at[ep] = 0.0 if moved else ep.due(end)
            finished = finished or ep.finished
        if finished:
            for ep in [ep for ep in live if ep.finished]:
                for sk in ep.socks.values():
                    poller.unregister(sk.fileno())
            live = [ep for ep in live if not ep.finished]
        if not live:
            break
        if work:  # what arrived meanwhile, without waiting
            events = poller.poll(0)
        else:
            due = min(due_at[ep] for ep in live)
            sleep_ms = max(1, min(int(PORT_POLL_S * 1000), math.ceil((due - time.monotonic()) * 1000)))
            events = poller.poll(sleep_ms)
        ready = {}
        for fd, _ in events:
            ready.setdefault(owner[fd], []).append(fd)
    for ep in eps:
        ep.finish(share=len(eps))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m mrclab.traffic.endpoint --config FILE [--config FILE --netns NAME ...]``: one host,
    or several served by this process (every ``--config`` after the first with its host's
    ``--netns``, in order; the first host's namespace is the one the process runs in). Exit 0,
    or 2 for a bad config or namespace list (one line on stderr)."""
    ap = argparse.ArgumentParser(description="MRC endpoint (run inside a host namespace)")
    ap.add_argument("--config", required=True, action="append", help="a host's endpoint config (repeatable)")
    ap.add_argument("--netns", action="append", default=[],
                    help="network namespace of the second, third, ... config's host (one per extra --config)")
    a = ap.parse_args(argv)
    if len(a.netns) != len(a.config) - 1:
        print(f"endpoint: {len(a.config)} configs need {len(a.config) - 1} --netns (one for every config after "
              f"the first), got {len(a.netns)}", file=sys.stderr)
        return 2
    try:
        eps = [Endpoint(C.EndpointConfig.load(path)) for path in a.config]
    except BadInput as e:
        print(f"endpoint: {e.one_line()}", file=sys.stderr)
        return 2
    for ep, ns in zip(eps[1:], a.netns, strict=True):
        ep.netns = ns

    def stop(_sig, _frame):
        for ep in eps:
            ep.stop_requested = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return run_group(eps)


if __name__ == "__main__":
    sys.exit(main())
