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


def test_ci_runs_the_readme_commands_in_a_fresh_debian_root():
    """.ci/run builds a minimal Debian root and runs, inside it, the README's set-up and main job
    (the first command, split at &&) and then exactly the README's test command, last."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", readme, re.S)
    commands = [line.strip() for b in blocks for line in b.splitlines() if line.strip() and not line.startswith("#")]
    test_cmd = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text()
    ci_lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert ci_lines[-1] == f"inside '{test_cmd}'"
    main_cmd = next(c for c in commands if "mrclab run" in c)
    assert main_cmd.startswith("./setup.sh")
    for part in (c.strip() for c in main_cmd.split("&&")):
        assert any(line.startswith(f"inside '{part}'") for line in ci_lines), part
    assert re.search(r"^debootstrap --variant=minbase ", ci, re.M) and 'chroot "$ROOT" /usr/bin/env -i' in ci


PACKAGES = ("topologies", "p4src", "controller", "traffic", "experiments", "bench", "cli")


def _sources():
    return [p for d in PACKAGES for p in (ROOT / d).rglob("*.py")] + [ROOT / "__init__.py"]


def test_the_code_imports_as_one_namespace_with_every_import_at_the_top():
    """``mrclab.traffic.sender``, never ``traffic.sender``; and no import of mrclab's own code inside a
    function (a late import there hides a dependency, or a cycle, from the module's head)."""
    import ast

    bare, late = [], []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                if name.split(".")[0] in PACKAGES:
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mrclab"):
                    late.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}")
    assert not bare, f"imports outside the mrclab namespace: {bare}"
    assert not late, f"imports of mrclab inside functions: {late}"


def test_only_mrclab_is_installed_at_the_top_level(tmp_path):
    """Outside the checkout, the install answers to one top-level name, ``mrclab``, mapped onto this
    checkout: ``import traffic`` finds nothing of ours."""
    import sys

    code = ("import importlib.util as u, json; "
            f"print(json.dumps([[n, bool(u.find_spec(n))] for n in {list(PACKAGES)!r}] + "
            "[['mrclab', u.find_spec('mrclab.traffic.sender').origin]]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    found = dict(__import__("json").loads(r.stdout))
    assert found.pop("mrclab") == str(ROOT / "traffic" / "sender.py")
    assert not [n for n, there in found.items() if there], found
