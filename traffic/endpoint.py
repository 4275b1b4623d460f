"""The MRC endpoint process: one per host, inside the host's network namespace.

    python -m mrclab.traffic.endpoint --config CONFIG.json

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
import errno
import math
import os
import resource
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.errors import BadInput
from mrclab.topologies.spec import load_spec
from mrclab.traffic import contract as C
from mrclab.traffic.collective import Collective, Iteration
from mrclab.traffic.host import HostStack
from mrclab.traffic.region import message_source
from mrclab.traffic.transport import Sender

ETH_P_ALL = 0x0003
PACKET_IGNORE_OUTGOING = 23
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # linux <asm-generic/socket.h>; Python does not export them
SOL_PACKET = 263
#: How often the NIC ports' carrier is read (s): well inside the smallest RTO (20 ms), so a port that
#: goes down is announced before the packets lost with it time out and blame their EVs.
PORT_POLL_S = 0.01
#: Bytes of a memory page (/proc/self/statm counts pages).
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _cpu_s() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


class Telemetry:
    """Telemetry records as JSON lines (nothing without a path)."""

    def __init__(self, path: str | None) -> None:
        """Append to ``path`` (line-buffered), or write nothing when it is None."""
        self.fh = open(path, "a", buffering=1) if path else None

    def write(self, rec: C.Record) -> None:
        """One record as a JSON line."""
        if self.fh is not None:
            self.fh.write(C.encode(rec) + "\n")

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
        self._send_fn: dict[int, Callable] = {}
        self._carrier: dict[int, int] = {}  # plane -> fd of its port's sysfs carrier file
        self.stop_requested = False
        self.loop_gap_max_s = 0.0  # since the last sample
        self._statm: int | None = None  # fd of /proc/self/statm

    def _iteration_done(self, it: Iteration) -> None:
        """A finished iteration, on the wall clock (the runner lines hosts up by it)."""
        to_wall = time.time() - time.monotonic()
        self.tel.write(C.CollectiveIteration(index=it.index, start_wall=it.start_s + to_wall,
                                             end_wall=it.end_s + to_wall, crc=it.crc))

    # ---- sockets and ports -----------------------------------------------------------------
    def open(self) -> None:
        """One raw AF_PACKET socket per plane, bound to the host's NIC port there, non-blocking."""
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
            self._send_fn[p] = s.send

    def port_state(self) -> int:
        """Bit p = the plane-p port has carrier. Read every PORT_POLL_S from files opened once:
        a sysfs attribute read at offset 0 is generated afresh (0.5 us against 9 us to open it)."""
        if not self._carrier:
            for p in range(self.plan.spec.planes):
                self._carrier[p] = os.open(f"/sys/class/net/{self.plan.host_intf(self.host, p)}/carrier", os.O_RDONLY)
        state = 0
        for p, fd in self._carrier.items():
            try:
                up = os.pread(fd, 8, 0)[:1] == b"1"
            except OSError:  # EINVAL: the interface is administratively down
                up = False
            state |= int(up) << p
        return state

    # ---- loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        """Open the sockets, say ready, wait for t = 0, then move frames until every QP is done (or a
        stop is requested); writes samples and a summary to telemetry. Returns the exit code (0)."""
        self.open()
        cpu0 = _cpu_s()
        stack, socks = self.stack, self.socks
        by_fd = {s.fileno(): s for s in socks.values()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        mono0 = time.monotonic() + (self.t0_wall - time.time())  # monotonic time of t = 0
        interval = self.cfg.telemetry_interval_s
        next_tel = next_ports = 0.0
        backlog: dict[int, deque] = {p: deque() for p in socks}
        started: set[int] = set()
        stopped: set[int] = set()
        finished_at: float | None = None
        coll_started = False
        max_end = max([st + (d or 0) for _, st, d in self.flows] or [0.0])
        # frames are read into one buffer and handed on as views of it: nothing keeps a view past
        # on_frame (payloads are copied into the memory region), and no 9 KiB buffer is made per frame
        rxbuf = bytearray(65536)
        rxview = memoryview(rxbuf)
        recv = [s.recv_into for s in socks.values()]
        self.tel.write(C.Start(self.host, stack.transport, tuple(s.qp for s, _, _ in self.flows)))
        if self.cfg.start_at_wall is None and self.cfg.go_path:
            self.t0_wall = self._wait_for_go(self.cfg.go_path)
            mono0 = time.monotonic() + (self.t0_wall - time.time())
        prev = time.monotonic()
        slept_s = 0.0  # how long the previous turn chose to sleep (0 when it had work)
        while not self.stop_requested:
            now = time.monotonic()
            # the fidelity monitor's "late timers" invariant: how much later than it was due this
            # turn began. A turn is due when the previous one ends if that one worked, or after the
            # sleep it chose (a frame wakes it earlier): a deliberate idle sleep is never late, a
            # long turn or a sleep overrun (a descheduled process) is
            late = now - prev - slept_s
            if late > self.loop_gap_max_s:
                self.loop_gap_max_s = late
            prev, slept_s = now, 0.0
            t = now - mono0
            if now >= next_ports:
                stack.set_local_ports(self.port_state())
                next_ports = now + PORT_POLL_S
            if self.coll is not None and self.cfg.collective is not None and not coll_started \
                    and t >= self.cfg.collective.start_s:
                coll_started = True
                self.coll.start(time.monotonic)
            for i, (s, start, dur) in enumerate(self.flows):
                if i not in started and t >= start:
                    started.add(i)
                if dur is not None and i not in stopped and t >= start + dur:
                    s.stop()
                    stopped.add(i)
            work = 0
            for rv in recv:
                for _ in range(256):
                    try:
                        n = rv(rxbuf)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:  # ENETDOWN once when the port goes down: the carrier poll handles it
                        break
                    work += 1
                    r = stack.on_frame(rxview[:n], now)
                    if r:
                        self._send(r, backlog)
            # every QP once all have started; until then only those whose start time has come
            active = None if len(started) == len(self.flows) else {id(self.flows[i][0]) for i in started}
            out = stack.poll(now, active=active)
            self._send(out, backlog)
            work += len(out)
            for plane, q in backlog.items():
                while q and self._sent(plane, q[0]):
                    q.popleft()
            if now >= next_tel:
                self._sample()
                next_tel = now + interval
            if self.flows and all(s.done for s, _, _ in self.flows) and (self.coll is None or self.coll.finished):
                if finished_at is None:
                    finished_at = now
                if now - finished_at > 0.2:  # linger: acknowledge the peer's last packets
                    break
            if not self.flows and t > max_end + self.cfg.receiver_linger_s:
                break
            if not work:
                # sleep until a frame comes or the next deadline: a QP's timer (delayed SACK, RTO,
                # probes, DCQCN), the carrier poll, telemetry, a flow's start or end, the
                # collective's start, the linger's end; at least 1 ms (poll's unit), at most the
                # carrier poll's 10 ms
                due = min(stack.next_due(now, active), next_ports, next_tel)
                for i, (_s, start, dur) in enumerate(self.flows):
                    if i not in started:
                        due = min(due, mono0 + start)
                    elif dur is not None and i not in stopped:
                        due = min(due, mono0 + start + dur)
                if self.coll is not None and self.cfg.collective is not None and not coll_started:
                    due = min(due, mono0 + self.cfg.collective.start_s)
                if finished_at is not None:
                    due = min(due, finished_at + 0.2)
                if not self.flows:
                    due = min(due, mono0 + max_end + self.cfg.receiver_linger_s)
                sleep_ms = max(1, math.ceil((due - time.monotonic()) * 1000))
                slept_s = sleep_ms / 1000
                poller.poll(sleep_ms)
        self._sample()
        cpu1 = _cpu_s()
        self.tel.write(C.Summary(self._tx(final=True), self._rx(), stack.dropped(), sum(cpu1) - sum(cpu0),
                                 cpu1[1] - cpu0[1]))
        self.tel.close()
        for sock in socks.values():
            sock.close()
        for fd in self._carrier.values():
            os.close(fd)
        if self._statm is not None:
            os.close(self._statm)
        return 0

    def _wait_for_go(self, path: str) -> float:
        """The start-up barrier: wait (10 ms polls) until the runner writes ``path`` (every endpoint
        is ready) and return the t = 0 it holds, as time.time(). A stop request ends the wait."""
        while not self.stop_requested:
            try:
                return float(Path(path).read_text())
            except (FileNotFoundError, ValueError):  # not yet, or not yet whole (it is renamed into place)
                time.sleep(0.01)
        return time.time()

    def _send(self, frames: list[tuple[int, list]], backlog: dict[int, deque]) -> None:
        """Send each (plane, buffers) now, or queue it behind what its port has not taken yet
        (frames leave in order)."""
        for plane, bufs in frames:
            q = backlog[plane]
            if q or not self._sent(plane, bufs):
                q.append(bufs)

    def _sent(self, plane: int, bufs: list) -> bool:
        """True when the frame is gone: sent, or dropped because the port is down (the transport
        recovers). False when the port cannot take it yet: a NIC holds frames its port has no room
        for (ENOBUFS: the qdisc is full) rather than losing them, so they wait in the backlog."""
        try:
            self._send_fn[plane](b"".join(bufs))  # one buffer: cheaper than sendmsg's scatter list here
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            return e.errno != errno.ENOBUFS
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
                                self._rss_bytes()))
        self.loop_gap_max_s = 0.0

    def _rss_bytes(self) -> int:
        """Resident memory (bytes): /proc/self/statm's second field in pages, read from a file
        opened once (the soak's "memory flat" reads it); 0 where there is no such file."""
        try:
            if self._statm is None:
                self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            return int(os.pread(self._statm, 128, 0).split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m mrclab.traffic.endpoint --config FILE``: exit 0, or 2 for a bad config."""
    ap = argparse.ArgumentParser(description="MRC endpoint (run inside a host namespace)")
    ap.add_argument("--config", required=True)
    a = ap.parse_args(argv)
    try:
        ep = Endpoint(C.EndpointConfig.load(a.config))
    except BadInput as e:
        print(f"endpoint: {e.one_line()}", file=sys.stderr)
        return 2

    def stop(_sig, _frame):
        ep.stop_requested = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return ep.run()


if __name__ == "__main__":
    sys.exit(main())
