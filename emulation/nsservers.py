"""Servers on one machine, for tests and ``mrclab bench scale --servers``: each a network
namespace with its own sshd, on a bridge in the root namespace, addressed from 198.18.0.0/15
(RFC 2544's benchmarking range: no real network routes it). Logins use a throwaway key pair and
host key; an ssh client configuration (``-F``) names them. A server may be given its own PATH
(``SetEnv``): a folder of chosen tools, to play a server that lacks one, or whose ``date`` is off.

Each server's sshd runs in a mount namespace of its own with a private ``/run/netns``, as on a
machine of its own: a namespace made on a server is named there only, so this machine cannot
reach it but through that server's ssh. Its root's login rc files read empty, as on a fresh
server (none of this machine's run at each login). Its underlay carries jumbo frames (:data:`MTU`), as
VXLAN links between servers need.

A server may be confined to chosen CPUs (``cpus``): its sshd starts under ``taskset``, and every
process a login starts there (a plane's switch processes, its agent) inherits that affinity, as
a separate machine's processes never take this one's CPU. The kernel's forwarding for a remote
plane (softirq, on linux's data plane) is not confined: it runs where its frames are received.

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

from mrclab.emulation import kernel

BRIDGE = "mrclabsrvbr"
PREFIX = "198.18.0."
BRIDGE_ADDRESS = PREFIX + "254"
#: Root's login rc files, hidden on the servers (an empty file over each that exists)
RC_FILES = ("/root/.bashrc", "/root/.profile", "/root/.bash_profile", "/root/.bash_login")
#: The sshd every server runs (Debian's openssh-server)
SSHD = "/usr/sbin/sshd"
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


def _start_sshd(s: NsServers, i: int, path: str, cpus: list[int] | None = None) -> None:
    ns, addr = f"mrclabsrv{i}", PREFIX + str(i)
    kernel.netns_add(ns)
    s.netns.append(ns)
    kernel.underlay_batch(None, [f"link add {ns}a type veth peer name eth0 netns {ns}",
                                 f"link set {ns}a master {BRIDGE} mtu {MTU} up"])
    kernel.ip_batch(ns, [f"link set eth0 mtu {MTU}", f"addr add {addr}/24 dev eth0", "link set eth0 up",
                         "link set lo up"])
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
    pin = f"taskset -c {','.join(map(str, cpus))} " if cpus else ""
    boot = f"mount -t tmpfs mrclabsrv /run/netns; {hide}; exec {pin}{SSHD} -f {conf}"
    _sh(*kernel.netns_exec_argv(ns, ["unshare", "--mount", "--propagation", "private", "sh", "-c", boot]))
    for _ in range(100):  # sshd writes its pid file once it listens
        if pid.exists() and pid.read_text().strip():
            s.pids.append(int(pid.read_text()))
            break
        time.sleep(0.02)
    s.addresses.append(addr)


@contextlib.contextmanager
def servers(n: int, tmp: Path, paths: dict[int, str] | None = None, cpus: list[int] | None = None):
    """``n`` namespace servers (1..n) with sshd; ``paths``: server number -> its PATH (default
    this process's); ``cpus``: the CPU numbers every server's processes run on (default: any).
    Raises kernel.KernelError (a namespace or link) or subprocess.CalledProcessError (a key, sshd)
    when one cannot be made, after removing what was made."""
    s = NsServers(tmp)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    try:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "client_key"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host_key"))
        kernel.underlay_batch(None, [f"link add {BRIDGE} type bridge", f"addr add {BRIDGE_ADDRESS}/24 dev {BRIDGE}",
                                     f"link set {BRIDGE} mtu {MTU} up"])
        for i in range(1, n + 1):
            _start_sshd(s, i, (paths or {}).get(i, os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")), cpus)
        s.ssh_config = tmp / "ssh_config"
        s.ssh_config.write_text(f"Host *\n  User root\n  IdentityFile {tmp / 'client_key'}\n  IdentitiesOnly yes\n"
                                "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        yield s
    finally:
        for ns in s.netns:  # sshd and every session it forked: a namespace lives while they do
            for pid in set(kernel.netns_pids(ns)) | set(s.pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kernel.delete_links(None, [(ns, "eth0")])  # and its peer on the bridge
            kernel.netns_delete(ns)
        with contextlib.suppress(kernel.KernelError):  # not made: nothing to remove
            kernel.underlay_batch(None, [f"link del {BRIDGE}"])


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
