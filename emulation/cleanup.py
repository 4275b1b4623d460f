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

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from mrclab.emulation import kernel
from mrclab.emulation.servers import OnServer, Server, ServerError, Ssh, TemporarySsh, parse_servers

RUN_ROOT = Path(os.environ.get("MRCLAB_RUN_ROOT", "/run/mrclab"))
#: Where a server's switch queue agent pins a run's programs and maps under bpffs
#: (controller/bpfmaps.py): ``PIN_ROOT/<run id>-on-<address>/<switch>``.
PIN_ROOT = Path("/sys/fs/bpf/mrclab")
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


def _is_node_shell(p: psutil.Process) -> bool:
    """Whether ``p`` is a Mininet node's shell (``bash ... mininet:<node>``, or the ssh client of a
    remote node's)."""
    try:
        return any(a.startswith("mininet:") for a in p.cmdline())
    except psutil.Error:
        return False


def stop_processes(procs: Iterable[psutil.Process], grace_s: float = 2.0) -> None:
    """SIGTERM each process, wait up to ``grace_s`` for all of them, SIGKILL what is left. The one
    way mrclab stops processes (endpoints, switches, what a crashed run left)."""
    procs = [p for p in procs if p.pid != os.getpid()]
    for p in procs:
        try:
            # a Mininet node's shell is an interactive bash, which ignores SIGTERM (it held every
            # teardown for the whole grace): it goes on SIGHUP, as Mininet's own terminate() does
            p.send_signal(signal.SIGHUP if _is_node_shell(p) else signal.SIGTERM)
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
    #: server (``user@address``) -> the namespaces made there (a fabric over several servers)
    remote: dict[str, list[str]] = field(default_factory=dict)
    #: the ssh client configuration (``-F``) that reaches those servers, if any
    ssh_config: str | None = None
    #: server -> folders the run made there (bmv2's sockets)
    remote_dirs: dict[str, list[str]] = field(default_factory=dict)

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

    def add_remote_netns(self, server: Server, name: str) -> None:
        """Record namespace ``name`` on ``server`` as this run's and save (before it is made)."""
        self.remote.setdefault(server.name, []).append(name)
        self.save()

    def add_remote_dir(self, server: Server, path: str) -> None:
        """Record folder ``path`` on ``server`` as this run's and save (before it is made)."""
        self.remote_dirs.setdefault(server.name, []).append(path)
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


def delete_script(names: list[str], dirs: list[str] | None = None) -> str:
    """A shell script that kills every process inside each named namespace and deletes it, then
    removes ``dirs`` (a run's folders: only ones under RUN_ROOT or PIN_ROOT are ever named)."""
    folders = [d for d in dirs or [] if Path(d).parent in (RUN_ROOT, PIN_ROOT)]
    rm = f"rm -rf {' '.join(kernel.command_line([d]) for d in folders)}; " if folders else ""
    return kernel.netns_purge_script(names) + f"{rm}true"


def delete_remote(ssh: Ssh, server: Server, names: list[str], dirs: list[str] | None = None) -> str | None:
    """Stop every process in the named namespaces on ``server`` and delete them, and remove the
    run's ``dirs`` there (one ssh round trip); None when done, else why not (ssh's words)."""
    if not names and not dirs:
        return None
    why = ssh.connect(server)
    if why is not None:
        return why
    on = OnServer(ssh, server)
    try:
        r = on.run(["sh", "-c", delete_script(names, dirs)])
    except ServerError as e:
        return str(e)
    finally:
        on.close()
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


def remote_netns(ssh: Ssh, server: Server) -> list[str]:
    """Every named namespace on ``server``. Raises ServerError when it cannot be asked."""
    why = ssh.connect(server)
    if why is not None:
        raise ServerError(f"{server.name}: unreachable over ssh ({why})")
    on = OnServer(ssh, server)
    try:
        return kernel.netns_list_on(on)
    except kernel.KernelError as e:
        raise ServerError(str(e)) from None
    finally:
        on.close()


def cleanup_remote(state: RunState, ssh: Ssh | None = None) -> list[str]:
    """Remove what ``state`` recorded on other servers; returns a line per server it could not
    reach (the state keeps those, for ``mrclab clean`` to try again)."""
    failed: list[str] = []
    if not state.remote and not state.remote_dirs:
        return failed
    with contextlib.ExitStack() as stack:
        if ssh is None:
            ssh = stack.enter_context(TemporarySsh(state.ssh_config))
        for name in sorted(set(state.remote) | set(state.remote_dirs)):
            server = parse_servers(name)[0]
            why = delete_remote(ssh, server, state.remote.get(name, []), state.remote_dirs.get(name, []))
            if why is None:
                state.remote.pop(name, None)
                state.remote_dirs.pop(name, None)
            else:
                failed.append(f"{name}: {why}")
    return failed


def cleanup_run(state: RunState, ssh: Ssh | None = None) -> list[str]:
    """Undo one run: its processes, its namespaces (here and on every server it recorded), its run
    directory. Safe to call twice. Returns a line per server it could not reach; the run
    directory is then kept, with what is left there recorded."""
    stop_processes(state.processes())
    delete_netns(state.netns)
    failed = cleanup_remote(state, ssh)
    if failed:
        state.netns, state.pids = [], []
        state.save()
        return failed
    d = Path(state.run_dir)
    for f in d.glob("*"):
        if f.is_file() or f.is_socket():
            f.unlink(missing_ok=True)
    try:
        d.rmdir()
    except OSError:
        pass
    return []


def clean(force: bool = False, servers: list[Server] | None = None, ssh_config: str | None = None) -> list[str]:
    """Remove what crashed runs left behind, here and on every server they recorded; with
    ``force`` also live runs. With ``servers``, also this project's node namespaces on each of
    them that no live run owns (never Mininet's ``mn -c``, which would take other Mininets with
    it). Returns what it removed, and a line per server it could not reach."""
    removed: list[str] = []
    owned_live: set[str] = set()
    owned_remote: dict[str, set[str]] = {}
    with contextlib.ExitStack() as stack:
        ssh = stack.enter_context(TemporarySsh(ssh_config))
        if RUN_ROOT.is_dir():
            for d in sorted(RUN_ROOT.iterdir()):
                st = RunState.load(d)
                if st is None:
                    continue
                if st.alive and not force and st.owner_pid != os.getpid():
                    owned_live.update(st.netns)
                    for name, names in st.remote.items():
                        owned_remote.setdefault(name, set()).update(names)
                    continue
                n, where = len(st.processes()), sorted(st.remote)
                # the run's own ssh configuration, unless one was given here
                run_ssh = stack.enter_context(TemporarySsh(st.ssh_config)) \
                    if st.remote and st.ssh_config and not ssh_config else ssh
                failed = cleanup_run(st, run_ssh)
                on = f", and on {', '.join(where)}" if where else ""
                removed.append(f"run {d.name} ({len(st.netns)} namespaces, {n} processes{on})")
                removed += [f"could not clean {f}; `mrclab clean` tries again" for f in failed]
        orphans = [n for n in list_netns() if _NODE_NS.match(n) and n not in owned_live]
        if orphans:
            delete_netns(orphans)
            removed.append(f"orphan namespaces: {', '.join(orphans)}")
        for server in servers or []:
            try:
                left = [n for n in remote_netns(ssh, server)
                        if _NODE_NS.match(n) and n not in owned_remote.get(server.name, set())]
            except ServerError as e:
                removed.append(f"could not clean {e}")
                continue
            why = delete_remote(ssh, server, left)
            if why is not None:
                removed.append(f"could not clean {server.name}: {why}")
            elif left:
                removed.append(f"orphan namespaces on {server.name}: {', '.join(left)}")
    return removed
