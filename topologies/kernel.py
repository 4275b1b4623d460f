"""Every call mrclab makes into the kernel's network configuration, in one module, per concern:
namespaces, links, qdiscs, routes, sysctls and commands run inside a namespace.

pyroute2 (netlink from Python) where it serves: naming, listing, attaching and deleting network
namespaces, the processes inside one, creating veth pairs and reading a link's counters. The
iproute2 commands stay for four things, each for its reason:

* a link set up or down, or its MTU (:func:`link_set`): a fault flips links while the run goes, and
  pyroute2's ``NetNS`` forks to open its socket in the namespace: 16.2 ms a call here against
  2.7 ms for ``ip`` (20 calls each, one namespace; a cached socket would outlive a namespace that
  a restarted switch re-creates under the same name);
* bulk writes, ``ip -batch`` and ``tc -batch`` (:func:`ip_batch`, :func:`tc_batch`): a switch's
  seg6 routes use the ``next-csid`` flavour of ``End`` (uN, RFC 9800), which pyroute2 0.9 cannot
  encode, and a switch's htb classes, pfifo leaves and tbf shapers are written by the hundreds in
  one fork and one netlink conversation;
* a command run inside a namespace (:func:`netns_exec`, :func:`netns_popen`): ``ip netns exec``
  also gives the command the namespace's own ``/sys`` and ``/etc/netns`` (tcpdump, sysctl and
  ethtool read them), where pyroute2's ``setns`` moves only the calling thread's network namespace;
* sysctls (:func:`sysctl`), which ``/proc/sys/net`` shows per namespace only to a process inside it.

Every failure is a :class:`KernelError` naming the namespace, the command and the kernel's words.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator

from mrclab.topologies.errors import RunFailed
from pyroute2 import NetNS
from pyroute2 import netns as pr_netns
from pyroute2.netlink.exceptions import NetlinkError


class KernelError(RunFailed):
    """The kernel (or iproute2) refused a network configuration call; the message says where and why."""


# ---- namespaces -------------------------------------------------------------------------------------
def netns_list() -> list[str]:
    """Names of the network namespaces under /run/netns (``ip netns list``)."""
    return sorted(pr_netns.listnetns())


def netns_add(name: str) -> None:
    """Create the named network namespace. Raises :class:`KernelError` if it exists or cannot be made."""
    try:
        pr_netns.create(name)
    except OSError as e:
        raise KernelError(f"cannot create namespace {name}: {e.strerror or e}") from None


def netns_attach(name: str, pid: int) -> None:
    """Name the network namespace of process ``pid`` ``name`` (``ip netns attach``). Raises
    :class:`KernelError` when the name exists or the process is gone."""
    try:
        pr_netns.attach(name, pid)
    except OSError as e:
        raise KernelError(f"cannot name namespace {name} (pid {pid}): {e.strerror or e}") from None


def netns_delete(name: str) -> None:
    """Remove the name ``name`` (the namespace goes with its last process). Idempotent."""
    with contextlib.suppress(FileNotFoundError, OSError):
        pr_netns.remove(name)


def netns_pids(name: str) -> list[int]:
    """Processes whose network namespace is the named one (``ip netns pids``); [] if none or unknown."""
    try:
        return sorted(pr_netns.ns_pids().get(name, []))
    except OSError:
        return []


# ---- links --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _netlink(netns: str | None) -> Iterator[NetNS]:
    try:
        with NetNS(netns) as ipr:
            yield ipr
    except NetlinkError as e:
        raise KernelError(f"netlink in {netns}: {e.args[-1] if e.args else e} (errno {e.code})") from None


def _index(ipr, ifname: str, netns: str | None) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise KernelError(f"no interface {ifname} in namespace {netns}")
    return found[0]


def veth_add(netns_a: str, name_a: str, netns_b: str, name_b: str) -> None:
    """A veth pair, ``name_a`` in ``netns_a`` and ``name_b`` in ``netns_b`` (both down)."""
    with _netlink(netns_a) as ipr:
        ipr.link("add", ifname=name_a, kind="veth", peer={"ifname": name_b, "net_ns_fd": netns_b})


def link_set(netns: str, ifname: str, *, up: bool | None = None, mtu: int | None = None) -> None:
    """Set ``ifname`` in ``netns`` administratively up or down and / or its MTU (bytes). Raises
    :class:`KernelError` (no such interface, a refused MTU)."""
    args = ["link", "set", ifname] + (["mtu", str(mtu)] if mtu is not None else []) + \
        ([] if up is None else ["up" if up else "down"])
    ip(netns, args)


def link_stats(netns: str, ifname: str) -> dict[str, int]:
    """The link's 64-bit counters (``rx_packets``, ``tx_packets``, ``rx_dropped``, ``tx_dropped``, ...),
    as ``ip -s link`` shows them."""
    with _netlink(netns) as ipr:
        link = ipr.get_links(_index(ipr, ifname, netns))[0]
    stats = link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS") or {}
    return {k: int(v) for k, v in dict(stats).items()}


# ---- bulk writes: routes and qdiscs --------------------------------------------------------------------
def ip_batch(netns: str, lines: list[str]) -> None:
    """``ip -n NETNS -batch -``: many link / neighbour / route commands in one process (see the module
    docstring for why routes stay here). Raises :class:`KernelError` with iproute2's first error."""
    _batch(["ip", "-n", netns, "-batch", "-"], lines)


def tc_batch(netns: str, lines: list[str]) -> None:
    """``tc -n NETNS -batch -``: a switch's qdiscs and classes in one process. Raises
    :class:`KernelError` with tc's first error."""
    _batch(["tc", "-n", netns, "-batch", "-"], lines)


def _batch(argv: list[str], lines: list[str]) -> None:
    if not lines:
        return
    r = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        said = r.stderr.strip().splitlines()
        raise KernelError(f"{' '.join(argv[:3])}: {said[0] if said else f'exit {r.returncode}'}")


def ip(netns: str, args: list[str], *, check: bool = True) -> str:
    """One ``ip -n NETNS ARGS...`` (a policy rule, a read-back in JSON); its stdout. With ``check``,
    raises :class:`KernelError` on failure, else returns "" then."""
    r = subprocess.run(["ip", "-n", netns, *args], capture_output=True, text=True)
    if r.returncode != 0:
        if check:
            raise KernelError(f"ip -n {netns} {' '.join(args)}: {r.stderr.strip()}")
        return ""
    return r.stdout


def ip_json(netns: str, args: list[str]) -> list:
    """``ip -j -n NETNS ARGS...`` parsed ([] when it prints nothing)."""
    out = ip(netns, ["-j", *args])
    return json.loads(out) if out.strip() else []


def tc(netns: str, args: list[str]) -> None:
    """One ``tc -n NETNS ARGS...``. Raises :class:`KernelError` with tc's words."""
    r = subprocess.run(["tc", "-n", netns, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise KernelError(f"tc -n {netns} {' '.join(args)}: {r.stderr.strip()}")


# ---- inside a namespace --------------------------------------------------------------------------------
def sysctl(netns: str, settings: list[str]) -> None:
    """``sysctl -w`` each ``key=value`` inside ``netns``. Raises :class:`KernelError`."""
    r = subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-qw", *settings], capture_output=True, text=True)
    if r.returncode != 0:
        raise KernelError(f"sysctl in {netns}: {r.stderr.strip()}")


def netns_exec(netns: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``netns`` to completion (``subprocess.run`` keywords pass through)."""
    return subprocess.run(["ip", "netns", "exec", netns, *argv], **kw)


def netns_popen(netns: str, argv: list[str], **kw) -> subprocess.Popen:
    """Start ``argv`` inside ``netns`` (``subprocess.Popen`` keywords pass through)."""
    return subprocess.Popen(["ip", "netns", "exec", netns, *argv], **kw)

