"""The fabric as data: a multi-plane, two-tier Clos described in YAML.

Shape (docs/mrc.md, "Multi-plane, two-tier Clos"): ``planes`` separate leaf-spine fabrics. In every
plane there are ``t0_per_plane`` T0 (leaf) switches and ``t1_per_plane`` T1 (spine) switches; every
T0 links to every T1 of its plane, and planes never interconnect. T0 number ``g`` of every plane
serves the same ``hosts_per_t0`` hosts (the *T0 group* ``g``); each host NIC has one port per
plane, port ``p`` cabled to the T0 of plane ``p`` in its group.

Names users see (``mrclab up``, scenarios, probe reports):

* hosts ``h0 .. h{N-1}``, numbered group by group;
* T0 of plane ``p`` in group ``g``: ``t0-{p}-{g}``; T1 number ``n`` of plane ``p``: ``t1-{p}-{n}``;
* a link: its two ends joined by a colon, lower tier first: ``h0:t0-1-0``, ``t0-1-0:t1-1-1``.

Limits come from the address plan's uSID encoding (see :mod:`topologies.addressing`): 4 bits of
plane and 10 bits of index in each 16-bit uSID, and 12 bits of T1 number in the EV.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mrclab.topologies.errors import BadInput
from mrclab.topologies.schema import Problems, check_mapping, field_rules, rule

#: The default fabric shipped with the project (issue 2): 4 planes, 2 T0 groups, 2 T1 per plane,
#: 2 hosts per T0 group -> 4 hosts, 16 switches.
DEFAULT_TOPO = Path(__file__).with_name("lab.yaml")

MAX_PLANES = 16  # 4 plane bits in every uSID
#: Planes a fabric may have: one NIC port per plane, and MRC's port-state bitmap (every data
#: packet, SACK and probe carries it; protocol/headers.py) is one byte on the wire, so 8, the
#: paper's own count, although the uSID has room for MAX_PLANES.
MAX_NIC_PORTS = 8
MAX_INDEX = 1023  # 10 index bits in every uSID (T0 group, T1 number, host in group)
MAX_HOSTS = (MAX_INDEX + 1) ** 2  # T0 groups x hosts per group, both 10-bit uSID indexes


class SpecError(BadInput):
    """A fabric spec that cannot be built. The message names the file, the field and what is allowed."""


@dataclass(frozen=True)
class LinkParams:
    """Per-link shaping applied by the emulation (``tbf`` on both ends of every link).

    ``bandwidth_mbps`` 0 means unshaped. ``t0_t1_bandwidth_mbps`` (0: the same) sets the T0-T1
    links apart: the paper's T0 has 256 uplinks, so losing one costs 0.4%; a lab T0 with 2 uplinks
    per plane needs faster uplinks to keep that headroom.

    ``path_delay_ms`` (0: none) is every path's one-way propagation delay, host to host. This
    kernel has no netem and the switches no delay line, so the receiving host applies it: each
    frame a host's NIC port receives reaches its transport that long after it arrived (the last
    link's wire, in effect), data on the way there and SACKs on the way back, so every RTT gains
    twice it. It is what sets a path's BDP in packets, which faster ports barely raise when the
    RTT is only serialization and queueing (MRC paper, section 2: 5-6.5 us RTT at 400 Gb/s, about
    75 packets of 4 KiB per path).
    """

    bandwidth_mbps: float = field(default=0.0, metadata=rule(lo=0, hi=100_000, allowed="0 (unshaped) to 100000"))
    queue_packets: int = field(default=100, metadata=rule(lo=2, hi=100_000))
    t0_t1_bandwidth_mbps: float = field(default=0.0, metadata=rule(lo=0, hi=100_000, allowed="0 (unshaped) to 100000"))
    path_delay_ms: float = field(default=0.0, metadata=rule(lo=0, hi=1000, allowed="0 (none) to 1000"))


def _prefix_check(plen: int):
    def check(value: str) -> str | None:
        try:
            net = ipaddress.IPv6Network(str(value), strict=True)
        except ValueError as e:
            return f"not an IPv6 prefix ({e})"
        return None if net.prefixlen == plen else f"allowed: an IPv6 /{plen} prefix"
    return check


_COUNT = {"kind": int}


@dataclass(frozen=True)
class ClosSpec:
    """A validated multi-plane two-tier Clos. Build it with :func:`load_spec` or :meth:`from_dict`."""

    name: str = field(default="lab", metadata=rule(check=lambda v: None if v else "must be a non-empty string"))
    planes: int = field(default=4, metadata=rule(**_COUNT, lo=1, hi=MAX_NIC_PORTS))  # see MAX_NIC_PORTS
    t0_per_plane: int = field(default=2, metadata=rule(**_COUNT, lo=1, hi=MAX_INDEX + 1))
    t1_per_plane: int = field(default=2, metadata=rule(**_COUNT, lo=1, hi=MAX_INDEX + 1))
    hosts_per_t0: int = field(default=2, metadata=rule(**_COUNT, lo=1, hi=MAX_INDEX + 1))
    locator_block: str = field(default="fcbb:bb00::/32", metadata=rule(check=_prefix_check(32)))
    nic_prefix: str = field(default="fd6d:7263::/32", metadata=rule(check=_prefix_check(32)))
    link: LinkParams = field(default=LinkParams(), metadata=rule(kind=dict, allowed="a mapping of link fields"))
    source: str = "<dict>"

    # ---- derived shape -------------------------------------------------------------------------
    @property
    def n_hosts(self) -> int:
        """Hosts in the fabric: T0 groups x hosts per T0."""
        return self.t0_per_plane * self.hosts_per_t0

    @property
    def n_switches(self) -> int:
        """Switches in the fabric: planes x (T0s + T1s per plane)."""
        return self.planes * (self.t0_per_plane + self.t1_per_plane)

    @property
    def n_links(self) -> int:
        """Links in the fabric: per plane, one per host and one per T0-T1 pair."""
        return self.planes * (self.n_hosts + self.t0_per_plane * self.t1_per_plane)

    def hosts(self) -> list[str]:
        """Every host name, ``h0 .. h{N-1}``."""
        return [host_name(i) for i in range(self.n_hosts)]

    def t0s(self) -> list[str]:
        """Every T0 name (``t0-P-G``), plane by plane."""
        return [t0_name(p, g) for p in range(self.planes) for g in range(self.t0_per_plane)]

    def t1s(self) -> list[str]:
        """Every T1 name (``t1-P-N``), plane by plane."""
        return [t1_name(p, n) for p in range(self.planes) for n in range(self.t1_per_plane)]

    def switches(self) -> list[str]:
        """Every switch name: the T0s, then the T1s (a bmv2 switch's P4Runtime device id is its index
        here)."""
        return self.t0s() + self.t1s()

    def group_of(self, host: str) -> int:
        """The T0 group of ``host``. Raises SpecError for an unknown host."""
        return self.host_index(host) // self.hosts_per_t0

    def host_index(self, host: str) -> int:
        """The number of ``host`` (``h<i>`` -> i). Raises SpecError for a name that is not a host of
        this fabric."""
        if not is_host(host) or not host[1:].isdigit() or int(host[1:]) >= self.n_hosts:
            raise SpecError(f"{self.source}: unknown host {host!r}; hosts are h0..h{self.n_hosts - 1}")
        return int(host[1:])

    def links(self) -> list[tuple[str, str]]:
        """Every link as (lower-tier end, upper-tier end), hosts first, then T0-T1, plane by plane."""
        out = []
        for p in range(self.planes):
            for h in range(self.n_hosts):
                out.append((host_name(h), t0_name(p, h // self.hosts_per_t0)))
        for p in range(self.planes):
            for g in range(self.t0_per_plane):
                for n in range(self.t1_per_plane):
                    out.append((t0_name(p, g), t1_name(p, n)))
        return out

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> ClosSpec:
        """Validate ``data`` (as read from YAML) and build the spec.

        Raises :class:`SpecError` naming ``source``, every bad field and its allowed values: unknown
        keys, wrong types, out-of-range counts, prefixes of the wrong length or overlapping.
        """
        problems = Problems(source)
        if not isinstance(data, Mapping):
            raise SpecError(f"{source}: a fabric spec is a mapping of fields, got {type(data).__name__}")
        rules = {k: r for k, r in field_rules(cls).items() if k != "source"}
        kw = check_mapping(data, rules, "", problems, quote=_QUOTE)
        if "link" in kw:
            link = check_mapping(kw["link"], field_rules(LinkParams), "", problems, quote=_QUOTE, prefix="link.")
            kw["link"] = LinkParams(**link)
        if not problems and ipaddress.IPv6Network(kw.get("locator_block", cls.locator_block)).overlaps(
                ipaddress.IPv6Network(kw.get("nic_prefix", cls.nic_prefix))):
            problems.add(f"locator_block {kw.get('locator_block', cls.locator_block)} overlaps nic_prefix "
                         f"{kw.get('nic_prefix', cls.nic_prefix)}")
        problems.raise_if_any(SpecError)
        for key in ("locator_block", "nic_prefix"):
            if key in kw:
                kw[key] = str(ipaddress.IPv6Network(kw[key]))
        return cls(**kw, source=source)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (``link`` a mapping), without ``source``: what :meth:`from_dict`
        takes back."""
        d = dataclasses.asdict(self)
        d.pop("source")
        return d


_QUOTE = "field {label!r} = {value!r}"


def load_spec(path: str | Path | None = None) -> ClosSpec:
    """Read and validate a fabric spec from YAML (``None``: the default ``topologies/lab.yaml``).

    Raises :class:`SpecError` for a missing file, bad YAML or any invalid field.
    """
    p = Path(path) if path is not None else DEFAULT_TOPO
    try:
        text = p.read_text()
    except OSError as e:
        raise SpecError(f"{p}: cannot read fabric spec ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{p}: not valid YAML ({e})") from None
    if isinstance(data, dict):  # where it runs, not its shape: emulation/servers.py reads it
        data = {k: v for k, v in data.items() if k != "servers"}
    return ClosSpec.from_dict(data or {}, source=str(p))


def host_name(i: int) -> str:
    """The name of host ``i``: ``h<i>``."""
    return f"h{i}"


def is_host(node: str) -> bool:
    """True for a host's name (``h<i>``), False for a switch's (``t0-…``, ``t1-…``)."""
    return node.startswith("h")


def t0_name(plane: int, group: int) -> str:
    """The name of the T0 of plane ``plane`` in group ``group``: ``t0-{plane}-{group}``."""
    return f"t0-{plane}-{group}"


def t1_name(plane: int, index: int) -> str:
    """The name of T1 number ``index`` of plane ``plane``: ``t1-{plane}-{index}``."""
    return f"t1-{plane}-{index}"


def parse_switch(name: str) -> tuple[int, int, int]:
    """``t0-P-G`` / ``t1-P-N`` -> (tier 0|1, plane, index). Raises ValueError for other names."""
    parts = name.split("-")
    if len(parts) == 3 and parts[0] in ("t0", "t1") and parts[1].isdigit() and parts[2].isdigit():
        return (0 if parts[0] == "t0" else 1), int(parts[1]), int(parts[2])
    raise ValueError(f"{name!r} is not a switch name (t0-PLANE-GROUP or t1-PLANE-INDEX)")
