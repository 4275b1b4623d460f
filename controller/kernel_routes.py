"""Linux route writer: the route plan as kernel IPv6 routes inside a switch's network namespace.

For each switch (docs/mrc.md, "SRv6 uN forwarding"), each route of the plan: ``ip -6 route replace
<block:uSID::/48> via fe80::1 dev <port intf>`` with a permanent neighbour ``fe80::1 -> peer MAC``
on that interface, so no neighbour discovery is needed. The switch's own uN SID is not a route: the
uN program on every port's ingress (bpfsrc/port_queue.bpf.c ``mrclab_un``, loaded by
controller/bpf.py) shifts a packet addressed to it before the kernel looks the packet up, and the
kernel forwards it on the next uSID by these routes.

Writing is idempotent (``replace``) and a diff: routes of the locator block that the plan does not
hold are deleted. :func:`read_back` returns what the kernel holds in the plan's own terms, so
verification is an equality check.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from mrclab.controller.routeplan import SwitchEntries
from mrclab.emulation import kernel

NEXTHOP = "fe80::1"


class RouteError(kernel.KernelError):
    """The kernel refused a route or the read-back differs from the plan."""


def intf_name(switch: str, port: int) -> str:
    """The interface of ``switch``'s port ``port``: ``<switch>-eth<port>``."""
    return f"{switch}-eth{port}"


@dataclass(frozen=True)
class KernelRoute:
    """One route of the locator block as the kernel holds it."""

    prefix: str
    dev: str

    def key(self) -> tuple[str, str]:
        """(prefix, device): what verification compares."""
        return (self.prefix, self.dev)


def batch_lines(entries: SwitchEntries) -> list[str]:
    """``ip -batch`` lines that install ``entries``' routes (without the leading ``ip``)."""
    lines = []
    for r in entries.routes:
        dev = intf_name(entries.switch, r.port)
        lines.append(f"neigh replace {NEXTHOP} lladdr {r.dst_mac} dev {dev} nud permanent")
        lines.append(f"route replace {r.prefix} via {NEXTHOP} dev {dev}")
    return lines


def expected(entries: SwitchEntries) -> set[tuple[str, str]]:
    """The :meth:`KernelRoute.key` of every route ``entries`` put in the kernel."""
    return {(str(r.prefix), intf_name(entries.switch, r.port)) for r in entries.routes}


def read_back(netns: str, block: ipaddress.IPv6Network) -> list[KernelRoute]:
    """Every route of ``block`` in ``netns``'s main table."""
    data = kernel.ip_json(netns, ["-6", "route", "show"])
    out = []
    for r in data:
        dst = r.get("dst", "")
        try:
            net = ipaddress.IPv6Network(dst if "/" in dst else f"{dst}/128")
        except ValueError:
            continue
        if not net.subnet_of(block):
            continue
        out.append(KernelRoute(prefix=str(net), dev=r.get("dev", "")))
    return out


def apply(netns: str, entries: SwitchEntries, block: ipaddress.IPv6Network,
          ports_up: set[int] | None = None) -> int:
    """Install ``entries`` in ``netns`` and delete stale routes of ``block``. Returns lines written.
    With ``ports_up``, routes out of other ports are left out (the kernel refuses a route through
    an interface that is down, and flushes those it had)."""
    if ports_up is not None:
        entries = dataclasses.replace(entries, routes=tuple(r for r in entries.routes if r.port in ports_up))
    want = expected(entries)
    stale = [r for r in read_back(netns, block) if r.key() not in want]
    lines = [f"route del {r.prefix} dev {r.dev}" for r in stale] + batch_lines(entries)
    kernel.ip_batch(netns, lines)  # bulk (emulation/kernel.py)
    return len(lines)


def verify(netns: str, entries: SwitchEntries, block: ipaddress.IPv6Network) -> None:
    """Raise :class:`RouteError` naming the differences when the kernel's routes differ from the plan."""
    have = {r.key() for r in read_back(netns, block)}
    want = expected(entries)
    if have != want:
        raise RouteError(
            f"{entries.switch}: kernel routes differ from the route plan; "
            f"missing {sorted(want - have)}, unexpected {sorted(have - want)}"
        )


def set_blackhole(netns: str, on: bool) -> None:
    """Make the switch forward nothing (a policy rule that blackholes every IPv6 lookup) or undo it."""
    if on:
        kernel.ip(netns, ["-6", "rule", "add", "pref", "10", "blackhole"])
    else:
        kernel.ip(netns, ["-6", "rule", "del", "pref", "10"], check=False)
