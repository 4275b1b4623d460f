"""The lab VM and set-up scripts are at least syntactically sound, and .ci/run runs the README's
test command exactly."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "setup.sh", ROOT / ".ci" / "run", ROOT / "vagrant" / "provision.sh", ROOT / "vagrant" / "build-toolchain.sh"]


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby (apt-get install ruby)")
def test_vagrantfile_parses():
    r = subprocess.run(["ruby", "-c", str(ROOT / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ubuntu-24.04" in (ROOT / "Vagrantfile").read_text()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck (apt-get install shellcheck)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_pass_shellcheck(script):
    r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", readme, re.S)
    commands = [line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]
    test_cmd = next(c for c in commands if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd in ci_lines
    main_cmd = next(c for c in commands if "mrclab run" in c)
    assert main_cmd.startswith("./setup.sh")
