"""The fidelity monitor: a thread that samples, every :data:`~mrclab.experiments.analysis.fidelity.PERIOD_S`,
how long each watched process (an endpoint, a BMv2 switch, here or on a server) waited for a CPU,
from the scheduler's own account (``/proc/PID/task/*/schedstat``), and the packets this machine's
kernel dropped from its receive backlogs (``/proc/net/softnet_stat``). What those samples mean (which
are faults, which verdicts they void) is experiments/analysis/fidelity.py's.
"""

from __future__ import annotations

import os
import shlex
import threading
import time

import psutil

from mrclab.experiments.analysis.fidelity import PERIOD_S


def schedstat(pid: int) -> tuple[int, int]:
    """(ns runnable but waiting for a CPU, times it ran) of the process's threads so far; (0, 0) if gone.

    Read with bare ``os`` calls (one open, read and close per thread): a 64-switch fabric's BMv2
    processes have 1,700 threads, which pathlib read in 0.043 s of CPU a sample and these in 0.017."""
    wait = runs = 0
    task_dir = f"/proc/{pid}/task/"
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return 0, 0
    for task in tasks:
        try:
            fd = os.open(f"{task_dir}{task}/schedstat", os.O_RDONLY)
            try:
                f = os.read(fd, 128).split()
            finally:
                os.close(fd)
            wait, runs = wait + int(f[1]), runs + int(f[2])
        except (OSError, IndexError, ValueError):
            continue
    return wait, runs


def softnet_drops(path: str = "/proc/net/softnet_stat") -> int:
    """Packets the kernel dropped so far because a CPU's receive backlog was full, summed over the
    CPUs: the second column of ``/proc/net/softnet_stat`` (hexadecimal, one row per CPU; the
    backlog holds ``net.core.netdev_max_backlog`` packets). A veth hands every packet it sends to
    that backlog, so on one machine this counts the packets lost between emulated ports that no
    switch program counted; 0 where the file cannot be read."""
    try:
        with open(path) as fh:
            return sum(int(row.split()[1], 16) for row in fh if row.strip())
    except (OSError, IndexError, ValueError):
        return 0


def kernel_workers() -> dict[str, int]:
    """``kernel ksoftirqd/N`` -> pid of each CPU's softirq thread on this machine: where the kernel
    forwards packets (every veth hop, a linux switch's route lookup, its tc program and htb) once
    softirq work outgrows the moment it was raised in. A ksoftirqd waiting for a CPU is a fabric
    port forwarding late, which no endpoint's or BMv2 switch's own account shows."""
    out = {}
    for p in psutil.process_iter(["name"]):
        name = p.info.get("name") or ""
        if name.startswith("ksoftirqd/"):
            out[f"kernel {name}"] = p.pid
    return out


def steal_s() -> list[float]:
    """Seconds each of this machine's CPUs was taken by the hypervisor so far (steal time: the
    vCPU was runnable and the host ran something else; psutil reads ``/proc/stat``, counted in
    10 ms ticks). Every thread on a stolen CPU stands still, and the guest's own scheduler, so
    :func:`schedstat`, counts none of it as waiting. Empty where the kernel does not count it."""
    return [getattr(c, "steal", 0.0) for c in psutil.cpu_times(percpu=True)]


SCHEDSTAT_SCRIPT = ("for f in {files}; do echo \"== $f\"; p=$(cat \"$f\" 2>/dev/null) && "
                    "cat /proc/$p/task/*/schedstat 2>/dev/null; done; true")


def remote_schedstat(remote, pid_files: list[str]) -> dict[str, tuple[int, int]]:
    """:func:`schedstat` of processes on another server, each named by the file holding its pid
    there (a restarted switch writes its new pid: it is followed), read in one round trip by
    ``remote`` (a emulation.kernel.Remote); (0, 0) for one that is gone or unreadable."""
    out = {f: (0, 0) for f in pid_files}
    r = remote.run(["sh", "-c", SCHEDSTAT_SCRIPT.format(files=" ".join(shlex.quote(f) for f in pid_files))])
    current = None
    for line in r.stdout.splitlines():
        if line.startswith("== "):
            current = line[3:]
            continue
        f = line.split()
        if current in out and len(f) >= 3 and f[1].isdigit() and f[2].isdigit():
            w, n = out[current]
            out[current] = (w + int(f[1]), n + int(f[2]))
    return out


class FidelityMonitor:
    """Samples the run-queue delay of named processes every :data:`PERIOD_S` in a thread of its
    own, from ``t0`` (monotonic s of t = 0). ``procs``: label -> pid (``endpoint h0``,
    ``switch t1-0-0``); ``remote``: label -> (the Remote of its server, its pid file there), for
    switches on other servers."""

    def __init__(self, procs: dict[str, int], t0: float, period_s: float = PERIOD_S,
                 remote: dict[str, tuple] | None = None) -> None:
        """Start sampling ``procs`` (label -> pid) and ``remote`` from ``t0`` (monotonic s of t = 0)."""
        self.procs, self.t0, self.period_s = dict(procs), t0, period_s
        self.remote = dict(remote or {})
        #: (t_s, label, scheduling delay per run (s), waited share of the interval, the interval (s)):
        #: each sample covers the interval before t_s, which is longer than ``period_s`` when the
        #: monitor itself was late (a busy machine: its thread shares the runner's interpreter)
        self.samples: list[tuple[float, str, float, float, float]] = []
        #: (t_s, packets the kernel dropped from its receive backlogs in the interval before t_s, the
        #: interval (s)), only intervals that dropped some (:func:`softnet_drops`)
        self.kernel_drops: list[tuple[float, int, float]] = []
        self._drops_last = (time.monotonic(), softnet_drops())
        #: (t_s, "cpu N", share of the interval before t_s the hypervisor took that CPU, the
        #: interval (s)), only intervals where it took some (:func:`steal_s`)
        self.stolen: list[tuple[float, str, float, float]] = []
        self._steal_last = (time.monotonic(), steal_s())
        now = time.monotonic()
        self._last = {label: (now, *stat) for label, stat in self._read().items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mrclab-fidelity", daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, tuple[int, int]]:
        """label -> (wait ns, runs) of every watched process, here and on the servers."""
        got = {label: schedstat(pid) for label, pid in self.procs.items()}
        by_server: dict = {}
        for label, (remote, pid_file) in self.remote.items():
            by_server.setdefault(remote, []).append((label, pid_file))
        for remote, items in by_server.items():
            try:
                stats = remote_schedstat(remote, [f for _, f in items])
            except Exception:  # a server that stopped answering: its switches are not read this turn
                continue
            got.update({label: stats[f] for label, f in items})
        return got

    def _loop(self) -> None:
        # a sample every period_s on the clock, not period_s after the last read ended: reading
        # 64 switches' threads takes 0.1-0.3 s on a busy machine, which would stretch every interval
        due = time.monotonic() + self.period_s
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            due = max(due + self.period_s, time.monotonic())
            self._read_drops()
            self._read_steal()
            stats = self._read()
            for label, (wait, runs) in stats.items():
                now = time.monotonic()
                if label not in self._last:
                    self._last[label] = (now, wait, runs)
                    continue
                t_prev, wait_prev, runs_prev = self._last[label]
                self._last[label] = (now, wait, runs)
                d_wait, d_runs = wait - wait_prev, runs - runs_prev
                if now > t_prev and d_wait >= 0 and d_runs > 0:
                    self.samples.append((round(now - self.t0, 3), label, d_wait / 1e9 / d_runs,
                                         d_wait / 1e9 / (now - t_prev), round(now - t_prev, 3)))

    def _read_drops(self) -> None:
        now, n = time.monotonic(), softnet_drops()
        t_prev, n_prev = self._drops_last
        self._drops_last = (now, n)
        if n > n_prev:
            self.kernel_drops.append((round(now - self.t0, 3), n - n_prev, round(now - t_prev, 3)))

    def _read_steal(self) -> None:
        now, stolen = time.monotonic(), steal_s()
        t_prev, prev = self._steal_last
        self._steal_last = (now, stolen)
        for cpu, (s, s_prev) in enumerate(zip(stolen, prev)):
            if s > s_prev and now > t_prev:
                self.stolen.append((round(now - self.t0, 3), f"cpu {cpu}", round((s - s_prev) / (now - t_prev), 3),
                                    round(now - t_prev, 3)))

    def stop(self) -> None:
        """Stop sampling (the samples stay in :attr:`samples`, :attr:`kernel_drops` and :attr:`stolen`)."""
        self._stop.set()
        self._thread.join(timeout=5)
