"""The command line without root: sizing output, and bad input exits 2 naming the problem."""

import subprocess
import sys

from mrclab.cli.main import main


def test_size_prints_the_papers_host_count(capsys):
    assert main(["size", "--ports", "512", "--planes", "8"]) == 0
    text = capsys.readouterr().out
    assert "hosts: 131072" in text and "131,072" in text and "6,144" in text


def test_size_rejects_odd_radix(capsys):
    assert main(["size", "--ports", "7", "--planes", "2"]) == 2
    assert "even integer" in capsys.readouterr().err


def test_bad_topo_file_exits_2(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("planes: 0\n")
    r = subprocess.run([sys.executable, "-m", "mrclab.cli", "probe", "--topo", str(bad), "--dataplane", "linux"],
                       capture_output=True, text=True)
    if r.returncode == 3:  # not root: refused before reading the spec
        assert "root" in r.stderr
    else:
        assert r.returncode == 2
        assert "planes" in r.stderr and "from 1 to 8" in r.stderr
