"""Address plan: locator block, uSIDs, NIC addresses, MACs, ports, and the EV -> path function.

uSID encoding (16 bits, one per switch; RFC 9800 "NEXT-C-SID" with a 32-bit locator block and
16-bit node IDs, docs/mrc.md "SRv6 uN forwarding")::

    bit 15..14  tier      01 = T0 (uN), 10 = T1 (uN), 11 = last-hop downlink to a host NIC
    bit 13..10  plane     0..15
    bit  9..0   index     T0: its group; T1: its number; downlink: the host's number in its group

A uSID of 0 never names anything: it ends the container. The outer destination of a data packet
is ``block | uSID(src T0) | uSID(T1) | uSID(dst T0) | uSID(downlink) | 0 | 0`` for a cross-group
pair and ``block | uSID(T0) | uSID(downlink) | 0 ...`` for a same-group pair.

EV encoding (32 bits, docs/mrc.md: the EV is carried in the UDP source port + the flow label)::

    bit 31..16  entropy   distinguishes EVs that share a path (many EVs per path in small fabrics)
    bit 15..12  plane
    bit 11..0   T1        the T0-uplink number (ignored for same-group pairs)

The EV -> outer address mapping is algorithmic, as in docs/mrc.md: :meth:`AddressPlan.template` builds
one template per (src, dst) with plane and T1 fields zero; :meth:`PathTemplate.outer_dst` ORs the
EV's plane into every uSID and its T1 number into the T1 uSID.

Ports: T0 ports ``1..H`` face hosts ``0..H-1`` of its group, ports ``H+1..H+T`` face T1s
``0..T-1``; T1 port ``g+1`` faces the T0 of group ``g``. Host NIC port ``p`` (interface
``hN-eth{p}``) is the plane-``p`` port.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from mrclab.topologies.spec import ClosSpec, SpecError, is_host, parse_switch, t0_name, t1_name

TIER_T0 = 0b01
TIER_T1 = 0b10
TIER_DOWNLINK = 0b11

EV_ENTROPY_SHIFT = 16
EV_PLANE_SHIFT = 12
EV_T1_MASK = 0xFFF


def usid(tier: int, plane: int, index: int) -> int:
    """The 16-bit uSID of a switch (tier 1|2) or host downlink (tier 3). See module docstring."""
    if tier not in (TIER_T0, TIER_T1, TIER_DOWNLINK) or not 0 <= plane < 16 or not 0 <= index < 1024:
        raise ValueError(f"uSID fields out of range: tier={tier} plane={plane} index={index}")
    return (tier << 14) | (plane << 10) | index


def decode_usid(value: int) -> tuple[int, int, int]:
    """16-bit uSID -> (tier, plane, index)."""
    return (value >> 14) & 0x3, (value >> 10) & 0xF, value & 0x3FF


def make_ev(plane: int, t1: int = 0, entropy: int = 0) -> int:
    """Build a 32-bit EV from its fields (see module docstring)."""
    if not 0 <= plane < 16 or not 0 <= t1 <= EV_T1_MASK or not 0 <= entropy < 1 << 16:
        raise ValueError(f"EV fields out of range: plane={plane} t1={t1} entropy={entropy}")
    return (entropy << EV_ENTROPY_SHIFT) | (plane << EV_PLANE_SHIFT) | t1


def ev_plane(ev: int) -> int:
    """The plane field of EV ``ev`` (bits 15..12)."""
    return (ev >> EV_PLANE_SHIFT) & 0xF


def ev_t1(ev: int) -> int:
    """The T1 field of EV ``ev`` (bits 11..0: the T0-uplink number; ignored for same-group pairs)."""
    return ev & EV_T1_MASK


def ev_entropy(ev: int) -> int:
    """The entropy field of EV ``ev`` (bits 31..16)."""
    return (ev >> EV_ENTROPY_SHIFT) & 0xFFFF


def ev_to_wire(ev: int) -> tuple[int, int]:
    """EV -> (UDP source port, IPv6 flow label): low 16 bits in the port, high 16 in the label."""
    return ev & 0xFFFF, (ev >> 16) & 0xFFFF


def ev_from_wire(udp_sport: int, flow_label: int) -> int:
    """Inverse of :func:`ev_to_wire`: (UDP source port, IPv6 flow label) -> the 32-bit EV (only the
    label's low 16 bits count)."""
    return ((flow_label & 0xFFFF) << 16) | (udp_sport & 0xFFFF)


@dataclass(frozen=True)
class Path:
    """One source-routed path between two host NICs.

    ``t1`` is None for same-group pairs. ``hops`` lists the switches in order; ``links`` the links
    crossed, each as (lower-tier end, upper-tier end) as in :meth:`ClosSpec.links`.
    """

    src: str
    dst: str
    plane: int
    t1: int | None
    ev: int
    outer_dst: ipaddress.IPv6Address
    hops: tuple[str, ...]
    links: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PathTemplate:
    """Per-(src, dst) template of MRC's algorithmic EV -> address scheme (docs/mrc.md).

    ``base`` is the 128-bit outer address with every plane field and the T1 index zero;
    ``plane_mask`` has the low plane bit of every uSID set; ``t1_shift`` is where the T1 uSID's
    index sits (None for same-group pairs).
    """

    base: int
    plane_mask: int
    t1_shift: int | None

    def outer_dst(self, ev: int) -> ipaddress.IPv6Address:
        """The outer IPv6 destination (the uSID container) of the path ``ev`` names."""
        return ipaddress.IPv6Address(self.outer_dst_int(ev))

    def outer_dst_int(self, ev: int) -> int:
        """:meth:`outer_dst` as a 128-bit integer: ``base`` with ``ev``'s plane ORed into every uSID
        and, for a cross-group pair, its T1 number into the T1 uSID."""
        a = self.base | (self.plane_mask * ev_plane(ev))
        if self.t1_shift is not None:
            a |= ev_t1(ev) << self.t1_shift
        return a


class AddressPlan:
    """All addresses of a :class:`ClosSpec`. Pure: no I/O, cheap to build."""

    def __init__(self, spec: ClosSpec) -> None:
        """The plan of ``spec``: its locator block and NIC prefix as networks."""
        self.spec = spec
        self.block = ipaddress.IPv6Network(spec.locator_block)
        self.nic_net = ipaddress.IPv6Network(spec.nic_prefix)

    # ---- switches -------------------------------------------------------------------------------
    def switch_usid(self, name: str) -> int:
        """The 16-bit uSID of switch ``name``. Raises SpecError for a switch the spec does not have."""
        tier, plane, index = self._switch(name)
        return usid(TIER_T0 if tier == 0 else TIER_T1, plane, index)

    def _switch(self, name: str) -> tuple[int, int, int]:
        try:
            tier, plane, index = parse_switch(name)
        except ValueError:
            raise SpecError(f"unknown switch {name!r}; switches are {self._switch_hint()}") from None
        limit = self.spec.t0_per_plane if tier == 0 else self.spec.t1_per_plane
        if plane >= self.spec.planes or index >= limit:
            raise SpecError(f"unknown switch {name!r}; switches are {self._switch_hint()}")
        return tier, plane, index

    def _switch_hint(self) -> str:
        s = self.spec
        return f"t0-P-G and t1-P-N with P < {s.planes}, G < {s.t0_per_plane}, N < {s.t1_per_plane}"

    def sid_prefix(self, usid16: int) -> ipaddress.IPv6Network:
        """block | uSID as a /48: the address a switch matches (its uN SID) or routes on."""
        return ipaddress.IPv6Network((int(self.block.network_address) | (usid16 << 80), 48))

    def switch_sid(self, name: str) -> ipaddress.IPv6Network:
        """The uN SID of switch ``name`` (:meth:`sid_prefix` of its uSID). Raises SpecError for an
        unknown switch."""
        return self.sid_prefix(self.switch_usid(name))

    def downlink_usid(self, host: str) -> list[int]:
        """The downlink uSID of each plane's port of ``host``, index = plane."""
        i = self.spec.host_index(host) % self.spec.hosts_per_t0
        return [usid(TIER_DOWNLINK, p, i) for p in range(self.spec.planes)]

    def ports(self, switch: str) -> dict[int, str]:
        """Port number -> the node on the far end, for a switch."""
        tier, plane, index = self._switch(switch)
        s = self.spec
        if tier == 0:
            hosts = {i + 1: f"h{index * s.hosts_per_t0 + i}" for i in range(s.hosts_per_t0)}
            ups = {s.hosts_per_t0 + 1 + n: t1_name(plane, n) for n in range(s.t1_per_plane)}
            return hosts | ups
        return {g + 1: t0_name(plane, g) for g in range(s.t0_per_plane)}

    def port_to(self, switch: str, peer: str) -> int:
        """Port of ``switch`` facing ``peer``. Raises SpecError when they are not linked."""
        for port, node in self.ports(switch).items():
            if node == peer:
                return port
        raise SpecError(f"{switch} has no link to {peer}")

    # ---- MACs -------------------------------------------------------------------------------------
    def switch_mac(self, switch: str, port: int) -> str:
        """MAC of ``switch``'s port ``port``: ``02:73`` ("s"), the switch's uSID, the port (16 bits)."""
        u = self.switch_usid(switch)
        return _mac(0x02, 0x73, u >> 8, u & 0xFF, port >> 8, port & 0xFF)

    def host_mac(self, host: str, plane: int) -> str:
        """MAC of ``host``'s plane-``plane`` NIC port: ``02:68`` ("h"), the plane, the host's number
        (24 bits)."""
        i = self.spec.host_index(host)
        return _mac(0x02, 0x68, plane, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF)

    def peer_mac(self, switch: str, port: int) -> str:
        """MAC of the interface on the far end of ``switch``'s ``port``."""
        peer = self.ports(switch)[port]
        _, plane, _ = parse_switch(switch)
        if is_host(peer):
            return self.host_mac(peer, plane)
        return self.switch_mac(peer, self.port_to(peer, switch))

    # ---- hosts ------------------------------------------------------------------------------------
    def nic_address(self, host: str) -> ipaddress.IPv6Address:
        """The NIC's own address: the inner IPv6 destination of packets to ``host``."""
        return self.nic_net.network_address + (self.spec.host_index(host) + 1)

    def port_address(self, host: str, plane: int) -> ipaddress.IPv6Address:
        """Outer source address of packets ``host`` sends on its plane-``plane`` port."""
        return ipaddress.IPv6Address(
            int(self.nic_net.network_address) | ((plane + 1) << 64) | (self.spec.host_index(host) + 1)
        )

    def host_t0(self, host: str, plane: int) -> str:
        """The T0 that ``host``'s plane-``plane`` port is cabled to."""
        return t0_name(plane, self.spec.group_of(host))

    def host_intf(self, host: str, plane: int) -> str:
        """Name of ``host``'s plane-``plane`` NIC port inside its namespace."""
        self.spec.host_index(host)
        return f"{host}-eth{plane}"

    def gateway_mac(self, host: str, plane: int) -> str:
        """Destination MAC for frames ``host`` sends on its plane-``plane`` port (its T0's port)."""
        t0 = self.host_t0(host, plane)
        return self.switch_mac(t0, self.port_to(t0, host))

    def host_of_address(self, addr: ipaddress.IPv6Address) -> str | None:
        """Inverse of :meth:`nic_address`; None for an address of no host."""
        if addr not in self.nic_net:
            return None
        i = int(addr) - int(self.nic_net.network_address) - 1
        return f"h{i}" if 0 <= i < self.spec.n_hosts else None

    # ---- paths ------------------------------------------------------------------------------------
    def template(self, src: str, dst: str) -> PathTemplate:
        """MRC's per-(src, dst) address template (plane and T1 fields zero)."""
        s = self.spec
        gs, gd = s.group_of(src), s.group_of(dst)
        di = s.host_index(dst) % s.hosts_per_t0
        if src == dst:
            raise SpecError(f"no path from {src} to itself")
        if gs == gd:
            usids = [usid(TIER_T0, 0, gs), usid(TIER_DOWNLINK, 0, di)]
            t1_shift = None
        else:
            usids = [usid(TIER_T0, 0, gs), usid(TIER_T1, 0, 0), usid(TIER_T0, 0, gd), usid(TIER_DOWNLINK, 0, di)]
            t1_shift = 80 - 16  # second uSID
        base = int(self.block.network_address)
        plane_mask = 0
        for k, u in enumerate(usids):
            shift = 80 - 16 * k
            base |= u << shift
            plane_mask |= 1 << (shift + 10)
        return PathTemplate(base=base, plane_mask=plane_mask, t1_shift=t1_shift)

    def n_paths(self, src: str, dst: str) -> int:
        """P x T1 for cross-group pairs, P for same-group pairs."""
        same = self.spec.group_of(src) == self.spec.group_of(dst)
        return self.spec.planes * (1 if same else self.spec.t1_per_plane)

    def path(self, src: str, dst: str, plane: int, t1: int | None = None, entropy: int = 0) -> Path:
        """(src host, dst host, plane, T1) -> the :class:`Path` with its outer address and EV.

        ``t1`` must be given for cross-group pairs and is ignored for same-group pairs. With
        ``src == dst`` the path is a *loop* (docs/mrc.md, "Clustermapper"): out to the plane's T0 and
        straight back (``t1`` None) or up to T1 ``t1`` and back, testing one NIC-T0 or one T0-T1
        link in isolation. Raises SpecError for unknown hosts or out-of-range plane / T1.
        """
        s = self.spec
        if not 0 <= plane < s.planes:
            raise SpecError(f"plane {plane} out of range; planes are 0..{s.planes - 1}")
        gs, gd = s.group_of(src), s.group_of(dst)
        if gs == gd and src != dst:
            t1 = None
        elif t1 is not None and not 0 <= t1 < s.t1_per_plane or (t1 is None and gs != gd):
            raise SpecError(f"T1 {t1} out of range for {src}->{dst}; T1s are 0..{s.t1_per_plane - 1}")
        ev = make_ev(plane, t1 or 0, entropy)
        di = s.host_index(dst) % s.hosts_per_t0
        if t1 is None:
            hops: tuple[str, ...] = (t0_name(plane, gs),)
            usids = [usid(TIER_T0, plane, gs), usid(TIER_DOWNLINK, plane, di)]
            links: tuple[tuple[str, str], ...] = ((src, hops[0]), (dst, hops[0]))
        else:
            hops = (t0_name(plane, gs), t1_name(plane, t1), t0_name(plane, gd))
            usids = [usid(TIER_T0, plane, gs), usid(TIER_T1, plane, t1), usid(TIER_T0, plane, gd),
                     usid(TIER_DOWNLINK, plane, di)]
            links = ((src, hops[0]), (hops[0], hops[1]), (hops[2], hops[1]), (dst, hops[2]))
        addr = int(self.block.network_address)
        for k, u in enumerate(usids):
            addr |= u << (80 - 16 * k)
        return Path(src, dst, plane, t1, ev, ipaddress.IPv6Address(addr), hops, links)

    def loop_paths(self, host: str) -> list[Path]:
        """Loops from ``host`` back to itself: per plane one via its T0 and one via each T1."""
        t1s: list[int | None] = [None, *range(self.spec.t1_per_plane)]
        return [self.path(host, host, p, t) for p in range(self.spec.planes) for t in t1s]

    def path_for_ev(self, src: str, dst: str, ev: int) -> Path:
        """The path an EV names between ``src`` and ``dst`` (its entropy bits kept in ``ev``)."""
        same = self.spec.group_of(src) == self.spec.group_of(dst)
        return self.path(src, dst, ev_plane(ev), None if same else ev_t1(ev), ev_entropy(ev))

    def paths(self, src: str, dst: str) -> list[Path]:
        """Every path from ``src`` to ``dst``, plane-major."""
        same = self.spec.group_of(src) == self.spec.group_of(dst)
        t1s: list[int | None] = [None] if same else list(range(self.spec.t1_per_plane))
        return [self.path(src, dst, p, t) for p in range(self.spec.planes) for t in t1s]

    def all_paths(self, loops: bool = False) -> list[Path]:
        """Every path between every ordered pair of distinct hosts (plus every loop with ``loops``)."""
        hosts = self.spec.hosts()
        out = [p for a in hosts for b in hosts if a != b for p in self.paths(a, b)]
        if loops:
            out += [p for h in hosts for p in self.loop_paths(h)]
        return out

def _mac(*octets: int) -> str:
    return ":".join(f"{o:02x}" for o in octets)
