"""`mrclab run` on the linux data plane: the quickstart (compressed to 12 s) meets its
expectations and writes its results; an exception mid-run leaves nothing of mrclab behind."""

import csv
import json

import pytest
from mrclab.experiments import runner
from mrclab.experiments.scenario import load_scenario

pytestmark = pytest.mark.root


def test_quickstart_runs_meets_its_expectations_and_writes_its_results(tmp_path, no_leftovers, decided_run):
    scn = load_scenario(None, duration_s=12, dataplane="linux")
    m, _, tmp_path = decided_run(scn, tmp_path)
    for f in ("scenario.yaml", "fabric.yaml", "metrics.json", "timeseries.csv", "events.csv", "goodput.png",
              "ev_state.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert json.loads((tmp_path / "metrics.json").read_text())["passed"] == m["passed"]
    failed = [v for v in m["expectations"] if v["passed"] is False]
    assert not failed, failed
    assert m["baseline_mbps"] > 5
    rows = list(csv.DictReader(open(tmp_path / "timeseries.csv")))
    assert len(rows) == 120 and float(rows[30]["goodput_mbps"]) > 0
    events = list(csv.DictReader(open(tmp_path / "events.csv")))
    faults = [e for e in events if e["kind"] == "fault"]
    assert [e["event"] for e in faults] == ["switch_down", "switch_up"]
    assert abs(float(faults[0]["t"]) - 4.0) < 0.5  # played on time (8 s of 24, compressed to 12)
    assert any(e["kind"] == "ev_state" and e["new"] == "ASSUMED_BAD" for e in events)
    assert (tmp_path / "endpoints" / "h0.telemetry.jsonl").exists()


def test_exception_mid_run_tears_everything_down(tmp_path, monkeypatch, no_leftovers):
    def boom(*a, **kw):
        raise RuntimeError("injected failure at the first fault")

    monkeypatch.setattr(runner, "play", boom)
    scn = load_scenario(None, duration_s=8, dataplane="linux")
    with pytest.raises(RuntimeError, match="injected failure"):
        runner.run(scn, tmp_path, live=False)
    # no_leftovers checks namespaces, run state and processes
