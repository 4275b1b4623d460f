"""The servers a fabric may span, and what each must have before anything is built on it.

A server is named ``[user@]address`` (``--servers A,B,...``; user ``root`` unless given). mrclab
reaches it over ssh with key-based, non-interactive logins (``BatchMode``), one multiplexed
connection per server (``ControlMaster``, kept ``CONTROL_PERSIST_S``) so that a command costs a
round trip, not a handshake; ``ssh_config`` (``-F``) adds what a site needs (keys, jump hosts).

:func:`preflight` asks every server, in parallel, for what a fabric on it needs, and says in one
line per problem what is wrong and how to mend it:

* reachable over ssh within ``CONNECT_TIMEOUT_S``;
* Mininet's ``mnexec`` on PATH (Debian's ``mininet`` package), iproute2's ``ip`` and ``tc``;
* for the bmv2 data plane, ``simple_switch_grpc`` (vagrant/build-toolchain.sh);
* a clock within ``CLOCK_SKEW_MAX_S`` of this machine's: events from several servers are laid on
  one timeline, and faults are timed from here. The offset is read as NTP does (the server's
  time against the midpoint of the round trip, :func:`clock_offset`), so the error bound is half
  the round trip.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ipaddress
import json
import re
import select
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from mrclab.topologies.errors import BadInput, NotAvailable

#: How long an ssh connection may take to open (s).
CONNECT_TIMEOUT_S = 5
#: How long a multiplexed connection stays open after its last command (s).
CONTROL_PERSIST_S = 60
#: The largest clock offset between a server and this machine that a run accepts (s): a fault is
#: timed to the lab's 10 ms carrier poll, so a few ms of skew is invisible and 50 ms is not.
CLOCK_SKEW_MAX_S = 0.05
#: Longest path of a Unix domain socket (sun_path is 108 bytes with its terminating NUL).
_SUN_PATH_MAX = 107
_NAME = re.compile(r"^(?:(?P<user>[a-z_][a-z0-9_-]*)@)?(?P<address>[A-Za-z0-9.:_-]+)$")


class ServerError(NotAvailable):
    """A server cannot carry a fabric: unreachable, missing a tool, or its clock too far off
    (exit 3, one line per server)."""


@dataclass(frozen=True)
class Server:
    """One machine a fabric may span: its ssh ``address`` and ``user``."""

    address: str
    user: str = "root"

    @property
    def name(self) -> str:
        """``user@address``, as ssh is given it."""
        return f"{self.user}@{self.address}"


def parse_servers(text: str) -> list[Server]:
    """``A,B,...`` (each ``[user@]address``) as servers, in order. Raises BadInput naming the
    entry that is not one, or a server given twice."""
    out: list[Server] = []
    for item in (x.strip() for x in text.split(",")):
        m = _NAME.match(item)
        if not m:
            raise BadInput(f"--servers: {item!r} is not a server; give [user@]address, comma-separated "
                           f"(e.g. --servers 10.0.0.1,root@10.0.0.2)")
        s = Server(m["address"], m["user"] or "root")
        if s in out:
            raise BadInput(f"--servers: {s.name} is given twice")
        out.append(s)
    if not out:
        raise BadInput("--servers: no server given")
    return out


class Ssh:
    """Commands on servers over one multiplexed ssh connection each. ``control_dir``: where the
    connections' sockets live (a short path: a socket path is at most 108 bytes);
    ``ssh_config``: an ssh client configuration (``-F``) or None for the user's own."""

    def __init__(self, control_dir: Path, ssh_config: Path | None = None) -> None:
        """No connection is opened until the first command. Raises BadInput for a ``control_dir``
        whose sockets' paths would be too long (ssh names each by a 40-character hash, and adds a
        17-character suffix while it opens one)."""
        if len(str(control_dir)) + 1 + 40 + 17 > _SUN_PATH_MAX:
            raise BadInput(f"ssh control folder {control_dir} is too long for a socket path (at most "
                           f"{_SUN_PATH_MAX - 58} characters)")
        self.control_dir = control_dir
        self.ssh_config = ssh_config
        control_dir.mkdir(parents=True, exist_ok=True)

    def base_argv(self) -> list[str]:
        """``ssh`` with this object's configuration and connection socket, no server yet."""
        out = ["ssh"]
        if self.ssh_config is not None:
            out += ["-F", str(self.ssh_config)]
        return out + ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                      "-o", f"ControlPath={self.control_dir}/%C"]

    def argv(self, server: Server, command: str | None, master: bool = False) -> list[str]:
        """The ssh command line that runs shell ``command`` on ``server`` over its multiplexed
        connection (``master``: the line that opens that connection, in the background)."""
        out = self.base_argv()
        if master:
            out += ["-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-f", "-N"]
        else:
            out += ["-o", "ControlMaster=no"]
        out.append(server.name)
        if command is not None:
            out.append(command)
        return out

    def connect(self, server: Server) -> str | None:
        """Open ``server``'s multiplexed connection (a background ssh master, ``-f -N``) unless it
        is open; None when it is, else ssh's last words. Its output goes to a file, not a pipe:
        the master lives on after this returns and would hold a pipe open."""
        check = self.argv(server, None)
        check[-1:-1] = ["-O", "check"]
        if subprocess.run(check, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=10).returncode == 0:
            return None  # open already: a second master would find the socket taken and linger unowned
        with tempfile.TemporaryFile("w+") as err:
            try:
                r = subprocess.run(self.argv(server, None, master=True), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=err, timeout=CONNECT_TIMEOUT_S + 10)
            except subprocess.TimeoutExpired:
                return f"no answer within {CONNECT_TIMEOUT_S + 10} s"
            if r.returncode == 0:
                return None
            err.seek(0)
            return (err.read().strip().splitlines() or [f"ssh exited with {r.returncode}"])[-1]

    def forward(self, server: Server, local: str, remote: str) -> str | None:
        """Forward unix socket ``local`` here to ``remote`` on ``server``, over its multiplexed
        connection (``ssh -O forward -L``); None when done, else ssh's words."""
        argv = self.argv(server, None)
        argv[-1:-1] = ["-O", "forward", "-L", f"{local}:{remote}"]
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")

    def run(self, server: Server, command: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
        """Run ``command`` on ``server``; the completed process (text output). Never raises for
        the command's own failure (look at ``returncode``; ssh's own is 255); raises
        subprocess.TimeoutExpired after ``timeout_s``."""
        return subprocess.run(self.argv(server, command), capture_output=True, text=True, timeout=timeout_s)

    def close(self) -> None:
        """Close every multiplexed connection this object opened (``ssh -O exit``)."""
        for sock in self.control_dir.glob("*"):
            if sock.is_socket():
                subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)


@dataclass(frozen=True)
class ServerCheck:
    """What :func:`preflight` found on one server: ``problems`` (one line each, empty when it can
    carry a fabric), its clock ``offset_s`` against this machine's (None if not read), the
    round trip it was read over (s) and the features it ``lacks`` (feature -> how to mend it:
    a fabric there runs without them)."""

    server: Server
    problems: tuple[str, ...]
    offset_s: float | None = None
    rtt_s: float | None = None
    lacks: tuple[tuple[str, str], ...] = ()

    def lacking(self, features) -> list[str]:
        """One line per feature of ``features`` this server lacks, naming the feature and the mend."""
        return [f"{self.server.name}: lacks {f} ({why})" for f, why in self.lacks if f in features]


#: What a server must have on PATH, and how to install it there.
TOOLS = {"mnexec": "apt-get install -y mininet", "ip": "apt-get install -y iproute2",
         "tc": "apt-get install -y iproute2", "sudo": "apt-get install -y sudo",
         "python3": "apt-get install -y python3"}
BMV2_TOOLS = {"simple_switch_grpc": "vagrant/build-toolchain.sh (the P4 toolchain)"}
_PROBE = "for t in {tools}; do command -v $t >/dev/null || echo missing $t; done"
#: One feature's test on a server (a shell command that exits 0 when the server has it).
_FEATURE_PROBE = "; ({test}) >/dev/null 2>&1 || echo lacks {name}"
#: Clock samples read from one remote shell: its start-up (a login shell's rc files, 0.2 s on
#: some machines) is paid once, and each sample's round trip is the connection's alone.
CLOCK_SAMPLES = 5


def clock_offset(ssh: Ssh, server: Server) -> tuple[float, float]:
    """(offset, round trip) in seconds: ``server``'s clock minus this machine's, as NTP reads it
    (the server's time against the midpoint of the round trip that fetched it), from the fastest
    of :data:`CLOCK_SAMPLES` exchanges with one remote shell that prints its time for each line it
    reads. The error is at most half the round trip. Raises OSError if the shell stops answering."""
    p = subprocess.Popen(ssh.argv(server, "while read -r _; do date +%s.%N; done"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    assert p.stdin is not None and p.stdout is not None
    best: tuple[float, float] | None = None
    waiter = select.poll()  # not select(): a descriptor past 1023 (a busy process) is out of its range
    waiter.register(p.stdout, select.POLLIN)
    try:
        for _ in range(CLOCK_SAMPLES + 1):  # the first exchange also waits for the shell to start
            t0 = time.time()
            p.stdin.write("\n")
            p.stdin.flush()
            if not waiter.poll((CONNECT_TIMEOUT_S + 10) * 1000):
                raise OSError(f"no time within {CONNECT_TIMEOUT_S + 10} s")
            line = p.stdout.readline()
            t1 = time.time()
            if not line:
                raise OSError("the shell reading its clock stopped")
            sample = (float(line) - (t0 + t1) / 2, t1 - t0)
            if best is None or sample[1] < best[1]:
                best = sample
    finally:
        p.kill()
        p.wait()
    assert best is not None
    return best


def check_server(ssh: Ssh, server: Server, more_tools: dict[str, str] | None = None,
                 features: dict[str, tuple[str, str]] | None = None,
                 needs: dict[str, tuple[str, str]] | None = None) -> ServerCheck:
    """Ask ``server`` what :func:`preflight` needs (one round trip) and judge it: :data:`TOOLS`
    and ``more_tools`` (name -> why; a data plane's, emulation/dataplanes.py ``server_tools``),
    ``features`` (name -> (shell test, how to mend); a data plane's ``server_features``: a
    fabric there runs without them) and ``needs`` (the same shape, a data plane's
    ``server_needs``: without one the server carries no fabric, a problem)."""
    tools = dict(TOOLS) | dict(more_tools or {})
    features = dict(features or {})
    needs = dict(needs or {})
    command = _PROBE.format(tools=" ".join(shlex.quote(t) for t in tools)) + "".join(
        _FEATURE_PROBE.format(test=test, name=shlex.quote(name))
        for name, (test, _fix) in (features | needs).items())
    why = ssh.connect(server)
    if why is None:
        try:
            r = ssh.run(server, command, timeout_s=CONNECT_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            why = f"no answer within {CONNECT_TIMEOUT_S + 10} s"
        else:
            if r.returncode == 255:
                why = (r.stderr.strip().splitlines() or ["ssh failed"])[-1]
    if why is not None:
        return ServerCheck(server, (f"{server.name}: unreachable over ssh ({why}); it needs sshd and this "
                                    f"machine's key in its authorized_keys",))
    lines = r.stdout.split()
    problems = [f"{server.name}: lacks {t}: {tools[t]}" for t in
                (lines[i + 1] for i, w in enumerate(lines[:-1]) if w == "missing")]
    lacked = [lines[i + 1] for i, w in enumerate(lines[:-1]) if w == "lacks"]
    problems += [f"{server.name}: lacks {f}: {needs[f][1]}" for f in lacked if f in needs]
    lacks = tuple((f, features[f][1]) for f in lacked if f in features and f not in needs)
    try:
        offset, rtt = clock_offset(ssh, server)
    except (OSError, ValueError) as e:
        problems.append(f"{server.name}: could not read its clock (date +%s.%N): {e}")
        return ServerCheck(server, tuple(problems), lacks=lacks)
    if abs(offset) > CLOCK_SKEW_MAX_S:
        problems.append(f"{server.name}: clock {offset * 1e3:+.0f} ms from this machine's (at most "
                        f"{CLOCK_SKEW_MAX_S * 1e3:.0f} ms): synchronise it (chrony or systemd-timesyncd)")
    return ServerCheck(server, tuple(problems), offset, rtt, lacks)


def preflight(ssh: Ssh, servers: list[Server], more_tools: dict[str, str] | None = None,
              features: dict[str, tuple[str, str]] | None = None,
              needs: dict[str, tuple[str, str]] | None = None) -> list[ServerCheck]:
    """Every server's :class:`ServerCheck` (:data:`TOOLS`, ``more_tools``, ``features`` and
    ``needs``, as :func:`check_server`), asked in parallel, in the order given."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        return list(pool.map(lambda s: check_server(ssh, s, more_tools, features, needs), servers))


def require(checks: list[ServerCheck]) -> None:
    """Raise :class:`ServerError` with every problem found (one line each), if there is any."""
    problems = [p for c in checks for p in c.problems]
    if problems:
        raise ServerError("; ".join(problems))


#: The agent a server runs for :class:`OnServer` (``python3 -c``; Mininet needs python3 there): it
#: reads one JSON request a line ({"argv": [...], "input": text or null}), runs it, and writes one
#: JSON line back ({"rc": exit status, "out": stdout, "err": stderr}).
AGENT = ("import json,subprocess,sys\n"
         "for line in sys.stdin:\n"
         " r=json.loads(line)\n"
         " try:\n"
         "  p=subprocess.run(r['argv'],input=r['input'],capture_output=True,text=True)\n"
         "  a=(p.returncode,p.stdout,p.stderr)\n"
         " except OSError as e:\n"
         "  a=(127,'',str(e))\n"
         " sys.stdout.write(json.dumps({'rc':a[0],'out':a[1],'err':a[2]})+'\\n')\n"
         " sys.stdout.flush()\n")


class OnServer:
    """A :class:`~emulation.kernel.Remote`: command lines run on ``server`` by one agent process
    there (:data:`AGENT`), started over ``ssh``'s multiplexed connection the first time and kept:
    a command then costs the server's fork and exec, not an ssh session (90 ms here, mostly the
    remote login shell's start-up). Thread-safe (one request at a time per server); an agent
    that died is started again once. ``script``: another agent of the same shape (Python source
    run with ``python3 -c``, one JSON request a line, one JSON answer a line), asked with
    :meth:`call` (controller/bpfmaps.py, the switch queues' agent)."""

    def __init__(self, ssh: Ssh, server: Server, script: str = AGENT) -> None:
        """Requests to ``server`` through ``ssh``; nothing is opened until the first."""
        self.ssh, self.server, self.name = ssh, server, server.name
        self.script = script
        self._agent: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        why = self.ssh.connect(self.server)
        if why is not None:
            raise ServerError(f"{self.server.name}: unreachable over ssh ({why})")
        return subprocess.Popen(self.ssh.argv(self.server, shlex.join(["python3", "-c", self.script])),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1, start_new_session=True)

    def call(self, request: dict, what: str = "") -> dict:
        """``request`` to the agent, its answer (one JSON object each way). Raises ServerError
        when the server stops answering (``what``: the request, in words, for the message)."""
        line_out = json.dumps(request) + "\n"
        with self._lock:
            for _attempt in (1, 2):
                if self._agent is None or self._agent.poll() is not None:
                    self._agent = self._start()
                assert self._agent.stdin is not None and self._agent.stdout is not None
                try:
                    self._agent.stdin.write(line_out)
                    self._agent.stdin.flush()
                    line = self._agent.stdout.readline()
                except OSError:
                    line = ""
                if line:
                    return json.loads(line)
                self.close()
            raise ServerError(f"{self.server.name}: stopped answering over ssh ({what or request.get('op', '?')})")

    def run(self, argv: list[str], input: str | None = None) -> subprocess.CompletedProcess:
        """``argv`` to completion on the server, text output captured (never raising for the
        command's own failure: look at ``returncode``). Raises ServerError when the server stops
        answering."""
        got = self.call({"argv": argv, "input": input}, f"running {shlex.join(argv)}")
        return subprocess.CompletedProcess(argv, got["rc"], got["out"], got["err"])

    def close(self) -> None:
        """Stop the agent (a command after this starts it again)."""
        agent, self._agent = self._agent, None
        if agent is not None:
            with contextlib.suppress(OSError):
                agent.kill()
            agent.wait()

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        """Start ``argv`` on the server; the process here is its ssh client."""
        return subprocess.Popen(self.ssh.argv(self.server, shlex.join(argv)), **kw)

    def address(self) -> str:
        """The server's IP address as this machine reaches it (ssh's own resolution of its name,
        ``ssh -G``, then the resolver). Raises ServerError when it has none."""
        argv = self.ssh.argv(self.server, None)
        argv[1:1] = ["-G"]
        host = self.server.address
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        for line in r.stdout.splitlines():
            if line.startswith("hostname "):
                host = line.split()[1]
        try:
            return ipaddress.ip_address(host).compressed
        except ValueError:
            pass
        try:
            return str(socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)[0][4][0])
        except OSError as e:
            raise ServerError(f"{self.server.name}: cannot resolve {host}: {e}") from None


class TemporarySsh(Ssh):
    """An :class:`Ssh` whose sockets live in a fresh folder under /tmp, closed and removed on exit
    (cleanup of a run whose own connections went with it)."""

    def __init__(self, ssh_config: str | Path | None) -> None:
        """Connections over ``ssh_config`` (None: the user's own); nothing opened yet."""
        super().__init__(Path(tempfile.mkdtemp(prefix="mrcssh-", dir="/tmp")),
                         Path(ssh_config) if ssh_config else None)

    def __enter__(self) -> TemporarySsh:
        """This object."""
        return self

    def __exit__(self, *exc) -> None:
        """Close the connections and remove their folder."""
        self.close()
        shutil.rmtree(self.control_dir, ignore_errors=True)
