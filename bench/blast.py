"""A raw-socket blaster and sink with no protocol: the ceiling the endpoint is measured against
(benchmarks only).

    python -m mrclab.bench.blast --iface h0-eth0 --frame HEX --rate PPS --duration S
    python -m mrclab.bench.blast --sink --iface h1-eth0 --length BYTES

Run inside the sender's / receiver's namespace. The blaster prints ``sent N in T s``. Pacing: it
sends the frames the schedule owes so far, in bites of at most 256 so that it keeps looking at the
clock; if the machine cannot keep up the achieved rate is lower and the caller sees it in N / T.
The sink reads every frame of ``--length`` bytes from a raw socket, as an endpoint would, prints
``ready`` once bound, and ``received N in T s`` (first to last frame) once none has come for
``--idle`` seconds.
"""

from __future__ import annotations

import argparse
import socket
import time

ETH_P_ALL = 0x0003


def blast(iface: str, frames: list[bytes], rate_pps: float, duration_s: float) -> tuple[int, float]:
    """Send ``frames`` in turn at ``rate_pps`` for ``duration_s``; (frames sent, seconds)."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    sent = 0
    start = time.perf_counter()
    end = start + duration_s
    send = s.send
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        owed = min(int((now - start) * rate_pps) - sent, 256)
        for _ in range(max(0, owed)):
            try:
                send(frames[sent % len(frames)])
                sent += 1
            except OSError:  # ENOBUFS: the queue is full; the packet was not sent
                break
        if owed <= 0:
            time.sleep(0.0005)
    return sent, time.perf_counter() - start


def sink(iface: str, length: int, idle_s: float = 0.5, wait_s: float = 30.0) -> tuple[int, float]:
    """Count frames of ``length`` bytes read from ``iface`` until ``idle_s`` without one."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
    s.bind((iface, ETH_P_ALL))
    print("ready", flush=True)
    n, first, last = 0, None, None
    s.settimeout(wait_s)
    buf = bytearray(65536)
    recv_into = s.recv_into  # into one buffer, as the endpoint reads
    while True:
        try:
            got = recv_into(buf)
        except TimeoutError:
            break
        if got == length:
            n += 1
            last = time.perf_counter()
            if first is None:
                first = last
                s.settimeout(idle_s)
    return n, (last - first) if first is not None and last is not None else 0.0


def main() -> None:
    """The command line (module docstring): with ``--sink`` count frames and print ``ready``, then
    ``received N in T s``; else send ``--frame`` or ``--frames`` at ``--rate`` pps for ``--duration``
    s and print ``sent N in T s``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", required=True)
    ap.add_argument("--sink", action="store_true", help="count received frames instead of sending")
    ap.add_argument("--length", type=int, help="with --sink: the frame length to count")
    ap.add_argument("--idle", type=float, default=0.5, help="with --sink: seconds without a frame that end it")
    ap.add_argument("--frame", help="the frame in hex")
    ap.add_argument("--frames", help="a file of frames in hex, one per line, sent in turn")
    ap.add_argument("--rate", type=float, help="packets per second")
    ap.add_argument("--duration", type=float, default=1.0)
    a = ap.parse_args()
    if a.sink:
        if a.length is None:
            ap.error("--sink needs --length")
        n, t = sink(a.iface, a.length, a.idle)
        print(f"received {n} in {t:.4f} s", flush=True)
        return
    if (a.frame is None and a.frames is None) or a.rate is None:
        ap.error("sending needs --frame or --frames, and --rate")
    frames = [bytes.fromhex(a.frame)] if a.frame else \
        [bytes.fromhex(x) for x in open(a.frames).read().split() if x]
    n, t = blast(a.iface, frames, a.rate, a.duration)
    print(f"sent {n} in {t:.4f} s", flush=True)


if __name__ == "__main__":
    main()
