"""`mrclab report` reads results folders back, compares them and refuses what is not one."""

import json
import types

import pytest
from mrclab.experiments.analysis.report import ReportError, load_result, main


def make_result(folder, transport, mbps):
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({
        "scenario": "quickstart", "transport": transport, "dataplane": "linux", "duration_s": 2.0,
        "baseline_mbps": mbps, "faults": [{"t": 1.0, "label": "switch_down t1-0-0"}],
        "expectations": [{"metric": "goodput_ratio", "value": 0.9, "passed": True}],
        "totals": {"q": {"data_packets": 100, "retransmits": 5}}, "passed": True}))
    rows = "t_s,goodput_mbps\n" + "".join(f"{i / 10:.1f},{mbps}\n" for i in range(20))
    (folder / "timeseries.csv").write_text(rows)


def test_load_result_rebuilds_the_goodput_series(tmp_path):
    make_result(tmp_path / "a", "mrc", 40.0)
    m, d, faults = load_result(tmp_path / "a")
    g = d.goodput_mbps()
    assert len(g) == 20 and all(abs(x - 40.0) < 0.01 for x in g[:-1])
    assert faults == [{"t": 1.0, "label": "switch_down t1-0-0"}]


def test_report_compares_and_plots(tmp_path, capsys):
    make_result(tmp_path / "mrc", "mrc", 40.0)
    make_result(tmp_path / "roce", "roce", 10.0)
    args = types.SimpleNamespace(results=[str(tmp_path / "mrc"), str(tmp_path / "roce")], out=str(tmp_path / "cmp"))
    assert main(args) == 0
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    text = capsys.readouterr().out
    assert "40.0" in text and "10.0" in text and "5.00%" in text


def test_report_refuses_a_folder_that_is_not_a_result(tmp_path):
    with pytest.raises(ReportError, match="not a results folder"):
        load_result(tmp_path)
    from mrclab.cli.main import main as mrclab

    assert mrclab(["report", str(tmp_path)]) == 2  # one line through the command line's error boundary
