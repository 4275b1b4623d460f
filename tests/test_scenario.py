"""Scenarios: every shipped one loads; bad names, bad times and unsupported features are refused
with a clear error before anything starts."""

import copy

import pytest
import yaml
from mrclab.experiments.model.scenario import SCENARIO_DIR, ScenarioError, load_scenario, parse_scenario
from mrclab.experiments.run.runner import RunRefused, choose_dataplane

BASE = yaml.safe_load((SCENARIO_DIR / "quickstart.yaml").read_text())


def mutate(**changes):
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def test_every_shipped_scenario_loads_for_both_transports():
    names = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
    assert {"quickstart", "t1-blackhole", "t0t1-links-one-by-one", "t0t1-links-flap", "nic-links-one-by-one",
            "t0-down", "ev-loss"} <= set(names)
    for n in names:
        mrc, roce = load_scenario(n), load_scenario(n, transport="roce")
        assert mrc.paper and mrc.expect and roce.transport == "roce"
        assert all(f.at < mrc.duration_s for f in mrc.faults)


def test_quickstart_is_the_default_and_short():
    s = load_scenario(None)
    assert s.name == "quickstart" and s.duration_s <= 60


@pytest.mark.parametrize("fault,msg", [
    ({"at": 5, "event": "switch_down", "switch": "t1-9-0"}, "unknown switch; switches are t0-0-0"),
    ({"at": 5, "event": "link_down", "link": "h0:t1-0-0"}, "unknown link"),
    ({"at": 5, "event": "port_down", "host": "h7", "plane": 0}, "unknown host; hosts are h0, h1, h2, h3"),
    ({"at": 5, "event": "port_down", "host": "h0", "plane": 4}, "plane = 4; allowed: 0..3"),
    ({"at": 30, "event": "switch_down", "switch": "t1-0-0"},
     "at = 30; allowed: a time in seconds from 0 to below duration_s"),
    ({"at": -1, "event": "switch_down", "switch": "t1-0-0"}, "at = -1"),
    ({"at": 5, "event": "switch_dwn", "switch": "t1-0-0"}, "event = 'switch_dwn'; allowed: link_down"),
    ({"at": 5, "event": "switch_down", "sw": "t1-0-0"}, "missing ['switch'], unknown ['sw']"),
    ({"at": 20, "event": "link_flap", "link": "t0-0-0:t1-0-0", "period_s": 4, "count": 2}, "past duration_s"),
    ({"at": 5, "event": "gray_loss", "link": "t0-0-0:t1-0-0", "rate": 1.5}, "rate = 1.5; allowed: 0.0 to 1.0"),
    ({"at": 5, "event": "deny", "src": "h0", "dst": "h2", "plane": 0},
     "deny entries are read by the endpoints at start"),
])
def test_bad_faults_are_refused(fault, msg):
    with pytest.raises(ScenarioError, match=None) as e:
        parse_scenario(mutate(faults=[fault]), "s.yaml")
    assert str(e.value).startswith("s.yaml: faults[0]") and msg in str(e.value)


@pytest.mark.parametrize("changes,msg", [
    ({"workload": [{"src": "h0", "dst": "h9"}]}, "workload[0].dst = 'h9': unknown host"),
    ({"workload": [{"src": "h0", "dst": "h0"}]}, "src and dst are both h0"),
    ({"workload": [{"src": "h0", "dst": "h2", "qp": 2}]}, "unknown field(s) qp"),
    ({"expect": [{"metric": "goodput", "window": [1, 2]}]}, "expect[0].metric = 'goodput'; allowed: goodput_ratio"),
    ({"expect": [{"metric": "goodput_ratio", "window": [20, 40]}]}, "window = [20, 40]"),
    ({"transport": {"kind": "tcp"}}, "transport.kind 'tcp'; allowed: mrc, roce"),
    ({"dataplane": "p4"}, "dataplane 'p4'; allowed: auto, bmv2, linux"),
    ({"durration_s": 10}, "unknown field(s) durration_s"),
    ({"fabric": {"topo": "lab", "planes": 0}}, "'planes' = 0; allowed: an integer from 1 to 8"),
    ({"fabric": {"topo": "nope"}}, "fabric.topo = 'nope'"),
    ({"processes_per_core": 0}, "processes_per_core 0; allowed: 1 to 4 endpoint processes per core"),
])
def test_bad_scenarios_are_refused(changes, msg):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(mutate(**changes), "s.yaml")
    assert msg in str(e.value)


def test_flap_expands_into_downs_and_ups():
    s = parse_scenario(mutate(faults=[{"at": 2, "event": "link_flap", "link": "t1-0-0:t0-0-0", "period_s": 2,
                                       "count": 3}]), "s.yaml")
    assert [(f.at, f.event) for f in s.faults] == [(2, "link_down"), (3, "link_up"), (4, "link_down"),
                                                   (5, "link_up"), (6, "link_down"), (7, "link_up")]
    assert s.faults[0].args["link"] == ("t0-0-0", "t1-0-0")  # normalised to lower:upper


def test_the_linux_data_plane_is_refused_without_its_ebpf_programs_before_anything_starts(monkeypatch):
    from mrclab.controller import bpf

    s = load_scenario("ev-loss", dataplane="linux")
    assert choose_dataplane(s).name == "linux" or bpf.bpf_missing()  # with clang and libbpf: runs
    monkeypatch.setattr(bpf, "bpf_missing", lambda: "clang is not installed")
    with pytest.raises(RunRefused, match=r"linux.*clang is not installed"):
        choose_dataplane(s)


def test_unknown_scenario_name_lists_shipped_ones():
    with pytest.raises(ScenarioError, match="quickstart"):
        load_scenario("no-such-scenario")
