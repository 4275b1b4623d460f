"""The MRC endpoint process: one per host, inside the host's network namespace.

    python -m traffic.endpoint --config CONFIG.json

Config (JSON; experiments/endpoints.py writes it)::

    topo                  path of the fabric YAML (topologies.spec.load_spec)
    host                  this host ("h0")
    seed                  seeds the EV draws and message contents
    transport             "mrc" | "roce"
    settings              MrcSettings fields (traffic/mrc.py), e.g. {"evs_per_plane": 2}
    denylist              EVs this host must not use (DENIED)
    qps                   QPs this host sends: [{qp, peer, message_bytes, op: write|write_imm,
                          start_s, duration_s, count?}] (count: number of messages, else unbounded)
    telemetry_path        JSON-lines output
    telemetry_interval_s  sample period (0.1)
    start_at_wall         time.time() at which t = 0 (senders start at start_at_wall + start_s)

Every endpoint also receives: QPs peers open to it are created on first packet.

Telemetry, one JSON object per line, each with ``t_wall`` (time.time()) and ``t_mono``:

* ``{"type": "sample", "tx_qps": {qp: {peer, qp, bytes_acked, data_packets, retransmits,
  srtt_us, evs: {ev: state}}}, "rx_qps": {"peer#qp": {src, qp, delivered_bytes,
  messages_delivered, messages_corrupt}}, "ports": bitmap}`` every ``telemetry_interval_s``;
* ``{"type": "event", "kind": ev_state|loss|gap|timeout|nack|trim|plane|ports, ...}`` as they
  happen (ev_state: qp, ev, old, new, reason);
* ``{"type": "summary", "tx_qps": {... totals ...}, "rx_qps": {...}, "dropped": {reason: n}, "cpu_s": s,
  "cpu_sys_s": s}`` last (cpu_s: user + system CPU seconds of the run loop, kernel work done on its
  behalf included; cpu_sys_s: the system part).

The process exits 0 once every QP it sends has finished (count reached, or duration over and
everything acknowledged), or on SIGTERM/SIGINT, after writing the summary.
"""

from __future__ import annotations

import argparse
import errno
import json
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

from topologies.addressing import AddressPlan
from topologies.spec import load_spec
from traffic.host import HostStack
from traffic.mrc import MrcSettings, message_source

ETH_P_ALL = 0x0003
PACKET_IGNORE_OUTGOING = 23
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # linux <asm-generic/socket.h>; Python does not export them
SOL_PACKET = 263


def _cpu_s() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime


class EndpointConfigError(ValueError):
    """A config field is missing or wrong; the message names it."""


def _need(cfg: dict, key: str, typ):
    if key not in cfg:
        raise EndpointConfigError(f"config: missing {key!r}")
    if not isinstance(cfg[key], typ):
        raise EndpointConfigError(f"config: {key!r} must be {typ}")
    return cfg[key]


class Telemetry:
    def __init__(self, path: str | None) -> None:
        self.fh = open(path, "a", buffering=1) if path else None

    def write(self, rec: dict) -> None:
        if self.fh is not None:
            rec.setdefault("t_wall", time.time())
            rec.setdefault("t_mono", time.monotonic())
            self.fh.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class Endpoint:
    """Raw sockets + :class:`HostStack` + telemetry for one host. ``run()`` returns an exit code."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        spec = load_spec(_need(cfg, "topo", str))
        self.plan = AddressPlan(spec)
        self.host = _need(cfg, "host", str)
        spec.host_index(self.host)
        try:
            self.settings = MrcSettings.from_dict(cfg.get("settings", {}) or {}, "config.settings")
        except ValueError as e:
            raise EndpointConfigError(str(e)) from None
        self.tel = Telemetry(cfg.get("telemetry_path"))
        self.stack = HostStack(self.plan, self.host, self.settings, transport=cfg.get("transport", "mrc"),
                               seed=int(cfg.get("seed", 1)), events=self._event,
                               denylist=frozenset(int(x) for x in cfg.get("denylist", [])))
        self.t0_wall = float(cfg.get("start_at_wall", time.time()))
        self.flows = []
        for q in cfg.get("qps", []):
            peer = q["peer"]
            spec.host_index(peer)
            msgs = message_source(int(cfg.get("seed", 1)) * 7919 + int(q["qp"]), int(q["message_bytes"]), q.get("count"))
            s = self.stack.add_sender(int(q["qp"]), peer, msgs, imm=q.get("op") == "write_imm")
            self.flows.append((s, float(q.get("start_s", 0.0)), q.get("duration_s")))
        self.socks: dict[int, socket.socket] = {}
        self._send_fn: dict[int, Callable] = {}
        self.stop_requested = False

    def _event(self, kind: str, **kw) -> None:
        self.tel.write({"type": "event", "kind": kind, **kw})

    # ---- sockets and ports -----------------------------------------------------------------
    def open(self) -> None:
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
        state = 0
        for p in range(self.plan.spec.planes):
            try:
                up = Path(f"/sys/class/net/{self.plan.host_intf(self.host, p)}/carrier").read_text().strip() == "1"
            except OSError:
                up = False
            state |= int(up) << p
        return state

    # ---- loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        self.open()
        cpu0 = _cpu_s()
        stack, socks = self.stack, self.socks
        by_fd = {s.fileno(): s for s in socks.values()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        mono0 = time.monotonic() + (self.t0_wall - time.time())  # monotonic time of t = 0
        interval = float(self.cfg.get("telemetry_interval_s", 0.1))
        next_tel = next_ports = 0.0
        backlog: dict[int, deque] = {p: deque() for p in socks}
        started: set[int] = set()
        stopped: set[int] = set()
        finished_at: float | None = None
        max_end = max([st + (d or 0) for _, st, d in self.flows] or [0.0])
        # frames are read into one buffer and handed on as views of it: nothing keeps a view past
        # on_frame (payloads are copied into the memory region), and no 9 KiB buffer is made per frame
        rxbuf = bytearray(65536)
        rxview = memoryview(rxbuf)
        recv = [s.recv_into for s in socks.values()]
        self.tel.write({"type": "start", "host": self.host, "transport": stack.transport,
                        "qps": [s.qp for s, _, _ in self.flows]})
        while not self.stop_requested:
            now = time.monotonic()
            t = now - mono0
            if now >= next_ports:
                stack.set_local_ports(self.port_state())
                next_ports = now + 0.05
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
            if len(started) == len(self.flows) or not self.flows:
                out = stack.poll(now)
            else:  # only the QPs whose start time has come
                out = []
                for i, (s, _, _) in enumerate(self.flows):
                    if i in started:
                        peer = next(k[0] for k, v in stack.senders.items() if v is s)
                        for p in s.poll(now):
                            out.append(stack.wire.encode(p, peer))
                for (peer, _), r in stack.receivers.items():
                    for p in r.poll(now):
                        out.append(stack.wire.encode(p, peer))
                if stack.receivers:
                    out += stack.probe_reverse(now)
            self._send(out, backlog)
            work += len(out)
            for plane, q in backlog.items():
                while q and self._sent(plane, q[0]):
                    q.popleft()
            if now >= next_tel:
                self._sample()
                next_tel = now + interval
            if self.flows and all(s.done for s, _, _ in self.flows):
                if finished_at is None:
                    finished_at = now
                if now - finished_at > 0.2:  # linger: acknowledge the peer's last packets
                    break
            if not self.flows and t > max_end + float(self.cfg.get("receiver_linger_s", 3600)):
                break
            if not work:
                poller.poll(1)
        self._sample()
        self.tel.write({"type": "summary", "tx_qps": self._tx(), "rx_qps": self._rx(), "dropped": stack.dropped(),
                        "cpu_s": sum(_cpu_s()) - sum(cpu0), "cpu_sys_s": _cpu_s()[1] - cpu0[1]})
        self.tel.close()
        for s in socks.values():
            s.close()
        return 0

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

    def _tx(self) -> dict:
        out = {}
        for (peer, qp), s in self.stack.senders.items():
            d = {"peer": peer, "qp": qp, **s.stats, "srtt_us": (s.srtt * 1e6) if getattr(s, "srtt", None) else None}
            evs = getattr(s, "evs", None)
            if evs is not None:
                d["evs"] = {str(e.ev): e.state for e in evs.evs.values()}
            out[str(qp)] = d
        return out

    def _rx(self) -> dict:
        return {f"{peer}#{qp}": {"src": peer, "qp": qp, "delivered_bytes": r.stats.delivered_bytes,
                                 "messages_delivered": r.stats.messages_delivered,
                                 "messages_corrupt": r.stats.messages_corrupt, "duplicates": r.stats.duplicates,
                                 "trimmed": r.stats.trimmed}
                for (peer, qp), r in self.stack.receivers.items()}

    def _sample(self) -> None:
        self.tel.write({"type": "sample", "tx_qps": self._tx(), "rx_qps": self._rx(), "ports": self.stack.local_ports})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="MRC endpoint (run inside a host namespace)")
    ap.add_argument("--config", required=True)
    a = ap.parse_args(argv)
    try:
        cfg = json.loads(Path(a.config).read_text())
        ep = Endpoint(cfg)
    except (OSError, ValueError, KeyError) as e:
        print(f"endpoint: bad config {a.config}: {e}", file=sys.stderr)
        return 2

    def stop(_sig, _frame):
        ep.stop_requested = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    os.nice(0)
    return ep.run()


if __name__ == "__main__":
    sys.exit(main())
