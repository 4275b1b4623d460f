"""Fabric spec validation: every impossible spec is refused naming the field and the allowed range."""

import pytest
from mrclab.topologies.spec import DEFAULT_TOPO, ClosSpec, SpecError, load_spec


def test_default_lab_fabric_shape():
    s = load_spec()
    assert (s.planes, s.t0_per_plane, s.t1_per_plane, s.hosts_per_t0) == (4, 2, 2, 2)
    assert s.n_hosts == 4 and s.n_switches == 16
    assert s.n_links == 4 * 4 + 4 * 2 * 2 == len(s.links())
    assert s.source == str(DEFAULT_TOPO)


@pytest.mark.parametrize(
    "field,value,allowed",
    [
        ("planes", 0, "from 1 to 8"),
        ("planes", 9, "from 1 to 8"),
        ("t0_per_plane", 1025, "from 1 to 1024"),  # more T0s than 10 uSID index bits hold
        ("t1_per_plane", 0, "from 1 to 1024"),
        ("hosts_per_t0", 1025, "from 1 to 1024"),  # a host count the downlink uSID cannot encode
        ("planes", "4", "an integer"),
        ("planes", True, "an integer"),
        ("locator_block", "fcbb:bb00::/48", "/32"),
        ("locator_block", "not-an-address", "not an IPv6 prefix"),
    ],
)
def test_bad_field_is_named_with_its_allowed_range(field, value, allowed):
    with pytest.raises(SpecError) as e:
        ClosSpec.from_dict({field: value}, source="x.yaml")
    msg = str(e.value)
    assert msg.startswith("x.yaml:") and field in msg
    assert allowed in msg


def test_unknown_keys_are_listed_with_the_allowed_ones():
    with pytest.raises(SpecError, match=r"unknown field\(s\) plains, spines; allowed: .*planes"):
        ClosSpec.from_dict({"plains": 4, "spines": 2})


def test_unknown_link_key():
    with pytest.raises(SpecError, match=r"link\.delay"):
        ClosSpec.from_dict({"link": {"delay": 3}})


def test_overlapping_prefixes_refused():
    with pytest.raises(SpecError, match="overlaps"):
        ClosSpec.from_dict({"locator_block": "fd6d:7263::/32", "nic_prefix": "fd6d:7263::/32"})


def test_yaml_errors_name_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("planes: [1, 2\n")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_spec(f)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    f.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(f)


def test_unknown_host_names_range():
    with pytest.raises(SpecError, match="h0..h3"):
        load_spec().host_index("h4")
