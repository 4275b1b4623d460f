"""Servers on one machine, for tests: each a network namespace with its own sshd, on a bridge in
the root namespace, addressed from 198.18.0.0/15 (RFC 2544's benchmarking range: no real network
routes it). Logins use a throwaway key pair and host key; an ssh client configuration (``-F``)
names them. A server may be given its own PATH (``SetEnv``): a folder of chosen tools, to play a
server that lacks one, or whose ``date`` is off.

Each server's sshd runs in a mount namespace of its own with a private ``/run/netns``, as on a
machine of its own: a namespace made on a server is named there only, so this machine cannot
reach it but through that server's ssh. Its root's login rc files read empty, as on a fresh
server (none of this machine's run at each login). Its underlay carries jumbo frames (:data:`MTU`), as
VXLAN links between servers need.

``servers(n, tmp)`` is a context manager that yields :class:`NsServers`; everything it made (sshd
processes, namespaces, the bridge) is removed when it exits, however it exits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BRIDGE = "mrclabsrvbr"
PREFIX = "198.18.0."
BRIDGE_ADDRESS = PREFIX + "254"
#: Root's login rc files, hidden on the servers (an empty file over each that exists)
RC_FILES = ("/root/.bashrc", "/root/.profile", "/root/.bash_profile", "/root/.bash_login")
#: The underlay's MTU: the fabric's 9000-byte frames plus VXLAN's 50 bytes, with room
MTU = 9100


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@dataclass
class NsServers:
    """``addresses`` of the servers, the ``ssh_config`` that reaches them, and the folder ``tmp``."""

    tmp: Path
    addresses: list[str] = field(default_factory=list)
    ssh_config: Path | None = None
    pids: list[int] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)


def _start_sshd(s: NsServers, i: int, path: str) -> None:
    ns, addr = f"mrclabsrv{i}", PREFIX + str(i)
    _sh("ip", "netns", "add", ns)
    s.netns.append(ns)
    _sh("ip", "link", "add", f"{ns}a", "type", "veth", "peer", "name", "eth0", "netns", ns)
    _sh("ip", "link", "set", f"{ns}a", "master", BRIDGE, "mtu", str(MTU), "up")
    _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "mtu", str(MTU))
    _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
    _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
    _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
    conf = s.tmp / f"sshd{i}.conf"
    pid = s.tmp / f"sshd{i}.pid"
    conf.write_text(f"ListenAddress {addr}\nPidFile {pid}\nHostKey {s.tmp / 'host_key'}\n"
                    f"AuthorizedKeysFile {s.tmp / 'client_key.pub'}\nPermitRootLogin prohibit-password\n"
                    "UsePAM no\nUseDNS no\nStrictModes no\nPermitTunnel yes\nMaxStartups 100:30:200\n"
                    f"SetEnv PATH={path}\n")
    # a private /run/netns: the server's namespaces are its own (the sshd daemonises, and its
    # mount namespace lives on with it); and no rc files in root's home, as on a fresh server:
    # this machine's own (a pyenv init: 90 ms) would otherwise run at every ssh session. The rest
    # of the home stays: a checkout under it (CI's /root/mrclab) is where the tests' tools live
    hide = "; ".join(f"[ -f {f} ] && mount --bind /dev/null {f}" for f in RC_FILES)
    _sh("ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f"mount -t tmpfs mrclabsrv /run/netns; {hide}; exec /usr/sbin/sshd -f {conf}")
    for _ in range(100):  # sshd writes its pid file once it listens
        if pid.exists() and pid.read_text().strip():
            s.pids.append(int(pid.read_text()))
            break
        time.sleep(0.02)
    s.addresses.append(addr)


@contextlib.contextmanager
def servers(n: int, tmp: Path, paths: dict[int, str] | None = None):
    """``n`` namespace servers (1..n) with sshd; ``paths``: server number -> its PATH (default
    this process's)."""
    s = NsServers(tmp)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    try:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "client_key"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host_key"))
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "mtu", str(MTU), "up")
        for i in range(1, n + 1):
            _start_sshd(s, i, (paths or {}).get(i, os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")))
        s.ssh_config = tmp / "ssh_config"
        s.ssh_config.write_text(f"Host *\n  User root\n  IdentityFile {tmp / 'client_key'}\n  IdentitiesOnly yes\n"
                                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        yield s
    finally:
        for ns in s.netns:  # sshd and every session it forked: a namespace lives while they do
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in {int(p) for p in pids} | set(s.pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run(["ip", "link", "del", f"{ns}a"], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def fake_bin(folder: Path, tools: list[str], date_offset_s: float = 0.0) -> str:
    """A folder holding links to ``tools`` (found on this PATH) and, if ``date_offset_s``, a ``date``
    that is that far off; returns it as a PATH (with /bin for the shell's own needs left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    for t in tools:
        where = shutil.which(t)
        assert where, t
        (folder / t).symlink_to(where)
    if date_offset_s:
        (folder / "date").write_text(f"#!{sys.executable}\nimport time\n"
                                     f"print(f'{{time.time() + {date_offset_s}:.9f}}')\n")
        (folder / "date").chmod(0o755)
    return str(folder)
