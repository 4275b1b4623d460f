"""Linux seg6 writer: the route plan as kernel SRv6 state inside a switch's network namespace.

For each switch (docs/mrc.md: "Linux implements the same behaviour"):

* the uN SID: ``ip -6 route replace <block:uSID::/48> encap seg6local action End
  flavors next-csid lblen 32 nflen 16 count dev sid0`` (RFC 9800 NEXT-C-SID; ``sid0`` is the
  anchor device :data:`emulation.nodes.SID_DEV`; ``count`` keeps per-SID packet
  counters, the per-switch evidence of which probes crossed it);
* each route: ``ip -6 route replace <prefix> via fe80::1 dev <port intf>`` with a permanent
  neighbour ``fe80::1 -> peer MAC`` on that interface, so no neighbour discovery is needed.

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
from mrclab.emulation.nodes import SID_DEV

NEXTHOP = "fe80::1"


class Seg6Error(kernel.KernelError):
    """The kernel refused an SRv6 route or the read-back differs from the plan."""


def intf_name(switch: str, port: int) -> str:
    """The interface of ``switch``'s port ``port``: ``<switch>-eth<port>``."""
    return f"{switch}-eth{port}"


@dataclass(frozen=True)
class KernelRoute:
    """One route of the locator block as the kernel holds it: ``sid`` True for the uN SID."""

    prefix: str
    sid: bool
    dev: str
    packets: int = 0

    def key(self) -> tuple[str, bool, str]:
        """(prefix, is the uN SID, device): what verification compares, the counter left out."""
        return (self.prefix, self.sid, self.dev)


def batch_lines(entries: SwitchEntries) -> list[str]:
    """``ip -batch`` lines that install ``entries`` (without the leading ``ip``)."""
    lines = [
        f"route replace {entries.sid} encap seg6local action End flavors next-csid "
        f"lblen 32 nflen 16 count dev {SID_DEV}"
    ]
    for r in entries.routes:
        dev = intf_name(entries.switch, r.port)
        lines.append(f"neigh replace {NEXTHOP} lladdr {r.dst_mac} dev {dev} nud permanent")
        lines.append(f"route replace {r.prefix} via {NEXTHOP} dev {dev}")
    return lines


def expected(entries: SwitchEntries) -> set[tuple[str, bool, str]]:
    """The :meth:`KernelRoute.key` of every route ``entries`` put in the kernel."""
    out = {(str(entries.sid), True, SID_DEV)}
    out |= {(str(r.prefix), False, intf_name(entries.switch, r.port)) for r in entries.routes}
    return out


def read_back(netns: str, block: ipaddress.IPv6Network) -> list[KernelRoute]:
    """Every route of ``block`` in ``netns``'s main table, with SID packet counters."""
    data = kernel.ip_json(netns, ["-s", "-6", "route", "show"])
    out = []
    for r in data:
        dst = r.get("dst", "")
        try:
            net = ipaddress.IPv6Network(dst if "/" in dst else f"{dst}/128")
        except ValueError:
            continue
        if not net.subnet_of(block):
            continue
        sid = r.get("encap") == "seg6local"
        pkts = int(r.get("stats64", {}).get("packets", r.get("packets", 0)) or 0) if sid else 0
        out.append(KernelRoute(prefix=str(net), sid=sid, dev=r.get("dev", ""), packets=pkts))
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
    kernel.ip_batch(netns, lines)  # bulk, and uN's next-csid flavour (emulation/kernel.py)
    return len(lines)


def verify(netns: str, entries: SwitchEntries, block: ipaddress.IPv6Network) -> None:
    """Raise :class:`Seg6Error` naming the differences when the kernel's routes differ from the plan."""
    have = {r.key() for r in read_back(netns, block)}
    want = expected(entries)
    if have != want:
        raise Seg6Error(
            f"{entries.switch}: kernel routes differ from the route plan; "
            f"missing {sorted(want - have)}, unexpected {sorted(have - want)}"
        )


def sid_packets(netns: str, entries: SwitchEntries, block: ipaddress.IPv6Network) -> int:
    """Packets the switch's uN SID has processed (the kernel's seg6local ``count``)."""
    for r in read_back(netns, block):
        if r.sid and r.prefix == str(entries.sid):
            return r.packets
    return 0


def set_blackhole(netns: str, on: bool) -> None:
    """Make the switch forward nothing (a policy rule that blackholes every IPv6 lookup) or undo it."""
    if on:
        kernel.ip(netns, ["-6", "rule", "add", "pref", "10", "blackhole"])
    else:
        kernel.ip(netns, ["-6", "rule", "del", "pref", "10"], check=False)
