"""Run state and cleanup: remove what a run of this project created, and only that.

Every fabric records what it creates in ``/run/mrclab/<run id>/state.json`` as it creates it:
the owning process, the named network namespaces (``mrclab-<node>``) and the pids of the
processes it started. :func:`cleanup_run` undoes one run (idempotent); :func:`clean` undoes every
run whose owner is gone (``mrclab clean``). Nothing is matched by guesswork: a namespace is
deleted only when a state file lists it, or when it carries this project's prefix and a fabric
node's name (``mrclab-h3``, ``mrclab-t1-0-1``) and no live run owns it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

RUN_ROOT = Path(os.environ.get("MRCLAB_RUN_ROOT", "/run/mrclab"))
NETNS_PREFIX = "mrclab-"
_NODE_NS = re.compile(r"^mrclab-(h\d+|t[01]-\d+-\d+)$")


@dataclass
class RunState:
    """What one run created. Written to ``<run_dir>/state.json`` after every change."""

    run_dir: str
    owner_pid: int
    dataplane: str
    topo: dict
    netns: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @classmethod
    def create(cls, dataplane: str, topo: dict) -> RunState:
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        run_dir = RUN_ROOT / f"{int(time.time())}-{os.getpid()}"
        run_dir.mkdir()
        st = cls(run_dir=str(run_dir), owner_pid=os.getpid(), dataplane=dataplane, topo=topo)
        st.save()
        return st

    def save(self) -> None:
        path = Path(self.run_dir) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> RunState | None:
        try:
            return cls(**json.loads((run_dir / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def add_netns(self, name: str) -> None:
        self.netns.append(name)
        self.save()

    def add_pid(self, pid: int) -> None:
        self.pids.append(pid)
        self.save()

    @property
    def alive(self) -> bool:
        return _pid_alive(self.owner_pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def _kill(pids: list[int], grace_s: float = 2.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _netns_pids(name: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def delete_netns(names: list[str]) -> None:
    """Kill every process inside each named namespace, then delete the names (idempotent)."""
    existing = set(list_netns())
    names = [n for n in names if n in existing]
    pids = [p for n in names for p in _netns_pids(n) if p != os.getpid()]
    _kill(pids)
    for n in names:
        subprocess.run(["ip", "netns", "delete", n], capture_output=True)


def list_netns() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def cleanup_run(state: RunState) -> None:
    """Undo one run: its processes, its namespaces, its run directory. Safe to call twice."""
    _kill([p for p in state.pids if p != os.getpid()])
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
            cleanup_run(st)
            removed.append(f"run {d.name} ({len(st.netns)} namespaces, {len(st.pids)} processes)")
    orphans = [n for n in list_netns() if _NODE_NS.match(n) and n not in owned_live]
    if orphans:
        delete_netns(orphans)
        removed.append(f"orphan namespaces: {', '.join(orphans)}")
    return removed
