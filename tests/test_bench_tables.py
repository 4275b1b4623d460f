"""Benchmarks print their tables as Markdown for docs/benchmarks.md: every row, every cell, headed
with the command, the date, the commit and the machine."""
import re

from mrclab.bench import tables
from rich.table import Table


def _table() -> Table:
    t = Table(title="mrclab bench endpoint (one QP)")
    for c in ("setting", "MRC pps", "MRC / blaster"):
        t.add_column(c, justify="right")
    t.add_row("veth pair", "130,435", "35%")
    t.add_row("linux fabric", "40,000", "61%")
    return t


def test_markdown_keeps_title_header_and_every_row_in_order():
    md = tables.markdown(_table()).splitlines()
    assert md[0] == "**mrclab bench endpoint (one QP)**"
    assert md[2] == "| setting | MRC pps | MRC / blaster |" and md[3] == "| --- | --- | --- |"
    assert md[4:] == ["| veth pair | 130,435 | 35% |", "| linux fabric | 40,000 | 61% |"]


def test_emit_markdown_is_headed_with_command_date_commit_and_machine(capsys, monkeypatch):
    monkeypatch.setattr(tables.sys, "argv", ["mrclab", "bench", "endpoint", "--markdown"])
    tables.emit([_table()], ["targets: >= 30% of the blaster"], as_markdown=True)
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert re.match(r"`mrclab bench endpoint --markdown`, \d{4}-\d\d-\d\d, commit \S+, \d+ cores, ", first), first
    assert "| veth pair | 130,435 | 35% |" in out and out.rstrip().endswith("targets: >= 30% of the blaster")


def test_emit_for_a_person_prints_no_markdown(capsys):
    tables.emit([_table()], ["note"], as_markdown=False)
    out = capsys.readouterr().out
    assert "veth pair" in out and "| --- |" not in out and "commit" not in out


def test_a_benchmarks_scenario_run_prints_its_summary_to_stderr_so_stdout_keeps_the_tables(capsys, monkeypatch):
    from mrclab.bench import tables
    from rich.console import Console

    def fake(scn, out, live, **kw):
        assert live is False and kw == {"on_start": None}
        Console().print("verdict table")  # as the runner's summary prints it
        return {"m": 1}, None

    monkeypatch.setattr(tables.runner, "run_with_data", fake)
    assert tables.run_scenario(None, None, on_start=None) == ({"m": 1}, None)
    out, err = capsys.readouterr()
    assert out == "" and "verdict table" in err


def test_per_dataplane_measures_each_plane_this_machine_has_and_says_which_it_skipped(capsys, monkeypatch):
    from types import SimpleNamespace

    from mrclab.bench import tables

    monkeypatch.setattr(tables, "resolve",
                        lambda dp: SimpleNamespace(missing=lambda: "no p4c" if dp == "bmv2" else None))
    seen = []
    got = tables.per_dataplane(["bmv2", "linux"], "t-", lambda dp, d: seen.append((dp, d.is_dir())) or dp)
    assert got == ["linux"] and seen == [("linux", True)]
    assert "bmv2: skipped (no p4c)" in capsys.readouterr().err
