"""Run state and cleanup: remove what a run of this project created, and only that.

Every fabric records what it creates in ``/run/mrclab/<run id>/state.json`` as it creates it: the
owning process, the named network namespaces (``mrclab-<node>``) and the processes it started, each
as (pid, start time). :func:`cleanup_run` undoes one run (idempotent); :func:`clean` undoes every
run whose owner is gone (``mrclab clean``). Nothing is matched by guesswork: a process is signalled
only while it is still the one the run recorded (same pid *and* same start time, so a reused pid
is left alone), and a namespace is deleted only when a state file lists it, or when it carries this
project's prefix and a fabric node's name (``mrclab-h3``, ``mrclab-t1-0-1``) and no live run owns it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from mrclab.topologies import kernel

RUN_ROOT = Path(os.environ.get("MRCLAB_RUN_ROOT", "/run/mrclab"))
#: Every namespace this project creates carries this prefix (``mrclab-h0``, ``mrclab-bench-a``).
NETNS_PREFIX = "mrclab-"
_NODE_NS = re.compile(r"^mrclab-(h\d+|t[01]-\d+-\d+|bench-[ab])$")


def netns_name(node: str) -> str:
    """The network namespace of fabric node (or bench end) ``node``."""
    return NETNS_PREFIX + node


def started_at(pid: int) -> float | None:
    """The start time of process ``pid`` (psutil's create_time, seconds), None if it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def recorded(pid: int, start: float | None) -> psutil.Process | None:
    """Process ``pid`` if it is still the one that started at ``start``, else None (also when the
    start time was never known: such a process is never signalled)."""
    if not start:
        return None
    try:
        p = psutil.Process(pid)
        if abs(p.create_time() - start) > 0.01:
            return None  # the pid was reused by another process
        return p if p.status() != psutil.STATUS_ZOMBIE else None
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def stop_processes(procs: Iterable[psutil.Process], grace_s: float = 2.0) -> None:
    """SIGTERM each process, wait up to ``grace_s`` for all of them, SIGKILL what is left. The one
    way mrclab stops processes (endpoints, switches, what a crashed run left)."""
    procs = [p for p in procs if p.pid != os.getpid()]
    for p in procs:
        try:
            p.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    psutil.wait_procs(alive, timeout=grace_s)


@dataclass
class RunState:
    """What one run created. Written to ``<run_dir>/state.json`` after every change.
    ``pids``: [pid, start time] of every process the run started."""

    run_dir: str
    owner_pid: int
    dataplane: str
    topo: dict
    netns: list[str] = field(default_factory=list)
    pids: list[list[float]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    owner_started: float | None = None

    @classmethod
    def create(cls, dataplane: str, topo: dict) -> RunState:
        """A new run owned by this process: its directory ``RUN_ROOT/<unix time>-<pid>`` made and its
        state file written. Raises OSError when the directory cannot be made (FileExistsError
        for a second run of this process in the same second whose directory is still there)."""
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        run_dir = RUN_ROOT / f"{int(time.time())}-{os.getpid()}"
        run_dir.mkdir()
        st = cls(run_dir=str(run_dir), owner_pid=os.getpid(), dataplane=dataplane, topo=topo,
                 owner_started=started_at(os.getpid()))
        st.save()
        return st

    def save(self) -> None:
        """Write ``<run_dir>/state.json`` atomically (a temporary file renamed over it)."""
        path = Path(self.run_dir) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> RunState | None:
        """The state recorded in ``run_dir``, or None when its state file is missing or unreadable."""
        try:
            return cls(**json.loads((run_dir / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def add_netns(self, name: str) -> None:
        """Record namespace ``name`` as this run's and save (callers record it before making it)."""
        self.netns.append(name)
        self.save()

    def add_pid(self, pid: int) -> None:
        """Record process ``pid`` with its start time and save; a process already gone is recorded
        with start time 0, and so is never signalled."""
        self.pids.append([pid, started_at(pid) or 0.0])
        self.save()

    def processes(self) -> list[psutil.Process]:
        """The recorded processes that are still the ones the run started."""
        out = []
        for entry in self.pids:
            if not isinstance(entry, list) or len(entry) != 2:
                continue  # a state file of an older mrclab: without a start time, nothing is signalled
            pid, start = entry
            p = recorded(int(pid), start)
            if p is not None:
                out.append(p)
        return out

    @property
    def alive(self) -> bool:
        """The owner still runs (the same process, not a reuse of its pid)."""
        return recorded(self.owner_pid, self.owner_started) is not None


def live_runs(include_own: bool = False) -> list[RunState]:
    """Runs whose owner process is alive (e.g. a ``mrclab up`` in another terminal); this
    process's own runs only with ``include_own``."""
    out = []
    if RUN_ROOT.is_dir():
        for d in sorted(RUN_ROOT.iterdir()):
            st = RunState.load(d)
            if st is not None and st.alive and (include_own or st.owner_pid != os.getpid()):
                out.append(st)
    return out


def delete_netns(names: list[str]) -> None:
    """Stop every process inside each named namespace, then delete the names (idempotent)."""
    existing = set(list_netns())
    names = [n for n in names if n in existing]
    procs = []
    for pid in (p for n in names for p in kernel.netns_pids(n)):
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    stop_processes(procs)
    for n in names:
        kernel.netns_delete(n)


def list_netns() -> list[str]:
    """Every named network namespace on the machine (mrclab's and others')."""
    return kernel.netns_list()


def cleanup_run(state: RunState) -> None:
    """Undo one run: its processes, its namespaces, its run directory. Safe to call twice."""
    stop_processes(state.processes())
    delete_netns(state.netns)
    d = Path(state.run_dir)
    for f in d.glob("*"):
        if f.is_file() or f.is_socket():
            f.unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass


def clean(force: bool = False) -> list[str]:
    """Remove what crashed runs left behind; with ``force`` also live runs. Returns what it removed."""
    removed: list[str] = []
    owned_live: set[str] = set()
    if RUN_ROOT.is_dir():
        for d in sorted(RUN_ROOT.iterdir()):
            st = RunState.load(d)
            if st is None:
                continue
            if st.alive and not force and st.owner_pid != os.getpid():
                owned_live.update(st.netns)
                continue
            n = len(st.processes())
            cleanup_run(st)
            removed.append(f"run {d.name} ({len(st.netns)} namespaces, {n} processes)")
    orphans = [n for n in list_netns() if _NODE_NS.match(n) and n not in owned_live]
    if orphans:
        delete_netns(orphans)
        removed.append(f"orphan namespaces: {', '.join(orphans)}")
    return removed
