"""One plan, two planes: a congestion scenario run on bmv2 (p4src/mrclab.p4 in BMv2's queues) and on
linux (bpfsrc/port_queue.bpf.c in htb) reaches the same verdict on every expectation. Needs the P4
toolchain and the linux plane's queue program."""

import pytest
from mrclab.controller.dataplanes import missing_features
from mrclab.experiments.model.scenario import load_scenario

pytestmark = [pytest.mark.root, pytest.mark.bmv2]
COMPRESS_TO_S = 14.0


@pytest.mark.parametrize("name", ["ecn-load-balancing", "incast"])
def test_a_congestion_scenario_gets_the_same_verdicts_on_bmv2_and_linux(name, tmp_path, no_leftovers, decided_run):
    for dp in ("bmv2", "linux"):
        if why := missing_features(dp).get("congestion"):
            pytest.skip(f"{dp} has no switch queues here: {why}")
    verdicts = {}
    for dp in ("bmv2", "linux"):
        m, _, _ = decided_run(load_scenario(name, duration_s=COMPRESS_TO_S, dataplane=dp), tmp_path / dp)
        verdicts[dp] = {v["expectation"]: v["passed"] for v in m["expectations"]}
        assert m["switch_ports"]["marked"] + m["switch_ports"]["trimmed"] > 0, f"{dp}: the switches never reacted"
    assert verdicts["bmv2"] == verdicts["linux"]
    assert all(p is not False for p in verdicts["linux"].values()), verdicts
