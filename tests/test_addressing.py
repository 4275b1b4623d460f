"""Address plan: uniqueness, path counts, the algorithmic EV -> address template, and a pure
simulation of uN forwarding over the route plan that every path must survive."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mrclab.controller.routeplan import route_plan
from mrclab.topologies.addressing import (
    AddressPlan,
    decode_usid,
    ev_from_wire,
    ev_plane,
    ev_t1,
    ev_to_wire,
    make_ev,
)
from mrclab.topologies.spec import ClosSpec, SpecError, load_spec

SPECS = [
    load_spec(),
    ClosSpec(planes=8, t0_per_plane=3, t1_per_plane=4, hosts_per_t0=3),
    ClosSpec(planes=1, t0_per_plane=1, t1_per_plane=1, hosts_per_t0=2),
    ClosSpec(planes=16, t0_per_plane=4, t1_per_plane=2, hosts_per_t0=1),
]


@pytest.mark.parametrize("spec", SPECS,
                         ids=lambda s: f"P{s.planes}T0{s.t0_per_plane}T1{s.t1_per_plane}H{s.hosts_per_t0}")
def test_usids_addresses_and_macs_are_unique(spec):
    plan = AddressPlan(spec)
    usids = [plan.switch_usid(s) for s in spec.switches()]
    assert len(set(usids)) == len(usids) == spec.n_switches and 0 not in usids
    nics = [plan.nic_address(h) for h in spec.hosts()]
    ports = [plan.port_address(h, p) for h in spec.hosts() for p in range(spec.planes)]
    assert len(set(nics + ports)) == len(nics) + len(ports)
    macs = [plan.host_mac(h, p) for h in spec.hosts() for p in range(spec.planes)]
    macs += [plan.switch_mac(s, port) for s in spec.switches() for port in plan.ports(s)]
    assert len(set(macs)) == len(macs)
    for h in spec.hosts():
        assert plan.host_of_address(plan.nic_address(h)) == h


def test_usid_fields_show_tier_plane_index():
    plan = AddressPlan(load_spec())
    assert decode_usid(plan.switch_usid("t0-3-1")) == (0b01, 3, 1)
    assert decode_usid(plan.switch_usid("t1-2-0")) == (0b10, 2, 0)
    assert str(plan.switch_sid("t1-2-1")) == "fcbb:bb00:8801::/48"


@pytest.mark.parametrize("spec", SPECS[:2])
def test_path_counts(spec):
    plan = AddressPlan(spec)
    hosts = spec.hosts()
    for a in hosts:
        for b in hosts:
            if a == b:
                continue
            same = spec.group_of(a) == spec.group_of(b)
            paths = plan.paths(a, b)
            assert len(paths) == plan.n_paths(a, b) == spec.planes * (1 if same else spec.t1_per_plane)
            assert len({p.outer_dst for p in paths}) == len(paths)
            assert len({p.ev for p in paths}) == len(paths)
    n_same = spec.n_hosts * (spec.hosts_per_t0 - 1)
    n_cross = spec.n_hosts * (spec.n_hosts - spec.hosts_per_t0)
    assert len(plan.all_paths()) == n_same * spec.planes + n_cross * spec.planes * spec.t1_per_plane


def test_template_matches_paths_and_ev_roundtrips():
    spec = SPECS[1]
    plan = AddressPlan(spec)
    for a, b in [("h0", "h5"), ("h0", "h1"), ("h8", "h2")]:
        tpl = plan.template(a, b)
        for p in plan.paths(a, b):
            assert tpl.outer_dst(p.ev) == p.outer_dst
            back = plan.path_for_ev(a, b, p.ev)
            assert (back.plane, back.t1, back.outer_dst) == (p.plane, p.t1, p.outer_dst)


@given(plane=st.integers(0, 15), t1=st.integers(0, 0xFFF), entropy=st.integers(0, 0xFFFF))
def test_ev_fields_and_wire_roundtrip(plane, t1, entropy):
    ev = make_ev(plane, t1, entropy)
    assert (ev_plane(ev), ev_t1(ev)) == (plane, t1)
    sport, label = ev_to_wire(ev)
    assert 0 <= sport < 1 << 16 and 0 <= label < 1 << 20
    assert ev_from_wire(sport, label) == ev


def test_entropy_does_not_change_the_path():
    plan = AddressPlan(load_spec())
    a = plan.path("h0", "h3", 2, 1)
    b = plan.path("h0", "h3", 2, 1, entropy=0xBEEF)
    assert a.outer_dst == b.outer_dst and a.ev != b.ev


def test_bad_path_arguments():
    plan = AddressPlan(load_spec())
    with pytest.raises(SpecError, match="plane 4 out of range"):
        plan.path("h0", "h2", 4, 0)
    with pytest.raises(SpecError, match="T1 2 out of range"):
        plan.path("h0", "h2", 0, 2)
    with pytest.raises(SpecError, match="unknown switch 't2-0-0'"):
        plan.switch_usid("t2-0-0")
    with pytest.raises(SpecError, match="itself"):
        plan.template("h1", "h1")


def forward(rp, plan, path, max_hops=8):
    """Pure uN model (docs/mrc.md): match block+own uSID -> shift; LPM; follow the port's link."""
    node = plan.host_t0(path.src, path.plane)
    addr = int(path.outer_dst)
    visited = []
    for _ in range(max_hops):
        e = rp[node]
        visited.append(node)
        if addr >> 80 == int(e.sid.network_address) >> 80:
            top = addr >> 96
            addr = (top << 96) | ((addr << 16) & ((1 << 96) - 1))
        hits = [r for r in e.routes if ipaddress.IPv6Address(addr) in r.prefix]
        if not hits:
            return visited, None
        r = max(hits, key=lambda r: r.prefix.prefixlen)
        if r.peer.startswith("h"):
            return visited, (r.peer, ipaddress.IPv6Address(addr))
        node = r.peer
    return visited, None


@pytest.mark.parametrize("spec", SPECS,
                         ids=lambda s: f"P{s.planes}T0{s.t0_per_plane}T1{s.t1_per_plane}H{s.hosts_per_t0}")
def test_route_plan_delivers_every_path_through_the_named_switches(spec):
    plan = AddressPlan(spec)
    rp = route_plan(plan)
    for p in plan.all_paths():
        visited, arrived = forward(rp, plan, p)
        assert arrived is not None, f"{p} dropped at {visited[-1]}"
        host, final = arrived
        assert host == p.dst
        assert tuple(visited) == p.hops
        assert final == plan.sid_prefix(plan.downlink_usid(p.dst)[p.plane]).network_address


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"P{s.planes}")
def test_route_plan_sizes(spec):
    rp = route_plan(AddressPlan(spec))
    for e in rp.switches:
        if e.switch.startswith("t0"):
            assert len(e.routes) == spec.hosts_per_t0 + spec.t1_per_plane
        else:
            assert len(e.routes) == spec.t0_per_plane
    assert rp.n_entries == spec.n_switches + spec.planes * (
        spec.t0_per_plane * (spec.hosts_per_t0 + spec.t1_per_plane) + spec.t1_per_plane * spec.t0_per_plane
    )
    assert route_plan(AddressPlan(spec)) == rp  # pure and deterministic


def test_sizing_matches_the_paper():
    from mrclab.topologies.sizing import size_clos

    s = size_clos(512, 8)
    assert s.hosts == 131_072 and s.hosts_per_t0 == 256 and s.t0_per_plane == 512 and s.t1_per_plane == 256
    assert s.switches == 8 * (512 + 256)
    assert s.encodable
    assert not size_clos(64, 16).encodable  # the uSID has room for 16 planes, a NIC's port-state byte for 8
    assert size_clos(64, 4).hosts == 32 * 64
    with pytest.raises(ValueError, match="even integer"):
        size_clos(511, 8)
    with pytest.raises(ValueError, match="planes"):
        size_clos(512, 0)
