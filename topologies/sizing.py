"""Sizing of the largest two-tier multi-plane Clos for a switch radix (docs/mrc.md, "Multi-plane, two-tier Clos").

With switches of ``ports`` ports, a T0 splits them evenly: ``ports / 2`` down to hosts and
``ports / 2`` up, one to each T1 of its plane; a T1 uses all ``ports`` ports down, one to each T0.
So each plane has ``ports`` T0s and ``ports / 2`` T1s, and ``ports / 2 x ports`` hosts. Every host
NIC has one port per plane, so the host count does not depend on the plane count, the switch and
link counts scale with it. For 512 x 100G ports (a 51.2 Tb/s switch) this is 256 x 512 = 131,072
hosts, the paper's figure.
"""

from __future__ import annotations

from dataclasses import dataclass

from mrclab.topologies.spec import MAX_HOSTS, MAX_INDEX, MAX_NIC_PORTS


@dataclass(frozen=True)
class Sizing:
    """Counts for a full two-tier, ``planes``-plane Clos of ``ports``-port switches."""

    ports: int
    planes: int
    hosts: int
    t0_per_plane: int
    t1_per_plane: int
    hosts_per_t0: int
    switches: int
    host_links: int
    fabric_links: int
    encodable: bool  # whether mrclab can build it: its address plan and the NIC's port-state byte (8 planes)

    @property
    def links(self) -> int:
        """Every link: host links plus T0-T1 links."""
        return self.host_links + self.fabric_links

    def t0_t1_link_share(self) -> float:
        """Capacity a node loses with one T0-T1 link (1 / uplinks per T0 / planes)."""
        return 1.0 / (self.t1_per_plane * self.planes)


def size_clos(ports: int, planes: int) -> Sizing:
    """Size the largest two-tier Clos for ``ports``-port switches and ``planes`` planes.

    Raises ValueError unless ``ports`` is an even integer >= 2 and ``planes`` >= 1.
    """
    if not isinstance(ports, int) or ports < 2 or ports % 2:
        raise ValueError(f"ports = {ports!r}; allowed: an even integer >= 2")
    if not isinstance(planes, int) or planes < 1:
        raise ValueError(f"planes = {planes!r}; allowed: an integer >= 1")
    down = ports // 2
    t0 = ports
    t1 = ports // 2
    hosts = down * t0
    return Sizing(
        ports=ports,
        planes=planes,
        hosts=hosts,
        t0_per_plane=t0,
        t1_per_plane=t1,
        hosts_per_t0=down,
        switches=planes * (t0 + t1),
        host_links=hosts * planes,
        fabric_links=planes * t0 * t1,
        encodable=planes <= MAX_NIC_PORTS and t0 <= MAX_INDEX + 1 and hosts <= MAX_HOSTS and down <= MAX_INDEX + 1,
    )
