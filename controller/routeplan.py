"""Route plan: a pure function from the fabric to every switch's static entries.

Each switch gets (docs/mrc.md, "SRv6 uN forwarding"; RFC 9800 NEXT-C-SID):

* one **uN SID**: ``block | own uSID`` as a /48. A packet whose destination matches it has its
  uSID part shifted left by 16 bits (the block stays);
* **routes**: /48 prefixes ``block | next uSID`` -> egress port, with the MACs to write.
  A T0 routes each T1 uSID of its plane up and each downlink uSID of its hosts down; a T1 routes
  each T0 uSID of its plane down.

The same plan feeds both data planes: P4Runtime table entries on ``bmv2``
(:mod:`controller.p4runtime`) and IPv6 routes plus the tc eBPF uN program on ``linux``
(:mod:`controller.kernel_routes`, :mod:`controller.bpf`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import is_host, parse_switch


@dataclass(frozen=True)
class Route:
    """``prefix`` (a /48 of the locator block) leaves on ``port`` with these MACs."""

    prefix: ipaddress.IPv6Network
    port: int
    src_mac: str
    dst_mac: str
    peer: str  # the node on the far end, for reports


@dataclass(frozen=True)
class SwitchEntries:
    """Everything one switch holds: its uN SID (a /48) and its routes."""

    switch: str
    usid: int
    sid: ipaddress.IPv6Network
    routes: tuple[Route, ...]

    @property
    def n_entries(self) -> int:
        """Entries on the switch: its uN SID plus one per route."""
        return 1 + len(self.routes)


@dataclass(frozen=True)
class RoutePlan:
    """Per-switch entries of a whole fabric, keyed by switch name in :meth:`ClosSpec.switches` order."""

    block: ipaddress.IPv6Network
    switches: tuple[SwitchEntries, ...]

    def __getitem__(self, switch: str) -> SwitchEntries:
        """The entries of ``switch``. Raises KeyError for an unknown switch."""
        for e in self.switches:
            if e.switch == switch:
                return e
        raise KeyError(f"unknown switch {switch!r}")

    @property
    def n_entries(self) -> int:
        """Entries of every switch together."""
        return sum(e.n_entries for e in self.switches)


def route_plan(plan: AddressPlan) -> RoutePlan:
    """Build every switch's entries from the address plan. Pure and deterministic."""
    out = []
    for sw in plan.spec.switches():
        tier, plane, _ = parse_switch(sw)
        routes = []
        for port, peer in plan.ports(sw).items():
            if is_host(peer):
                dest_usid = plan.downlink_usid(peer)[plane]
            else:
                dest_usid = plan.switch_usid(peer)
            routes.append(
                Route(
                    prefix=plan.sid_prefix(dest_usid),
                    port=port,
                    src_mac=plan.switch_mac(sw, port),
                    dst_mac=plan.peer_mac(sw, port),
                    peer=peer,
                )
            )
        u = plan.switch_usid(sw)
        out.append(SwitchEntries(switch=sw, usid=u, sid=plan.sid_prefix(u), routes=tuple(routes)))
    return RoutePlan(block=plan.block, switches=tuple(out))
