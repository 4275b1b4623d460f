"""A raw-socket blaster: send one prebuilt frame at a paced rate for a duration (benchmarks only).

    python -m experiments.blast --iface h0-eth0 --frame HEX --rate PPS --duration S

Run inside the sender's namespace. Prints ``sent N in T s`` on stdout. Pacing: every 1 ms it sends
the frames the schedule owes so far; if the machine cannot keep up the achieved rate is lower and
the caller sees it in N / T.
"""

from __future__ import annotations

import argparse
import socket
import time


def blast(iface: str, frame: bytes, rate_pps: float, duration_s: float) -> tuple[int, float]:
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
        owed = int((now - start) * rate_pps) - sent
        for _ in range(max(0, owed)):
            try:
                send(frame)
                sent += 1
            except OSError:  # ENOBUFS: the queue is full; the packet was not sent
                break
        if owed <= 0:
            time.sleep(0.0005)
    return sent, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", required=True)
    ap.add_argument("--frame", required=True, help="the frame in hex")
    ap.add_argument("--rate", type=float, required=True, help="packets per second")
    ap.add_argument("--duration", type=float, default=1.0)
    a = ap.parse_args()
    n, t = blast(a.iface, bytes.fromhex(a.frame), a.rate, a.duration)
    print(f"sent {n} in {t:.4f} s", flush=True)


if __name__ == "__main__":
    main()
