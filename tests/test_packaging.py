"""The lab VM and set-up scripts are at least syntactically sound, and .ci/run runs the README's
test command exactly."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "setup.sh", ROOT / ".ci" / "run", ROOT / "vagrant" / "provision.sh",
           ROOT / "vagrant" / "build-toolchain.sh"]


@pytest.mark.skipif(shutil.which("ruby") is None, reason="needs ruby (apt-get install ruby)")
def test_vagrantfile_parses():
    r = subprocess.run(["ruby", "-c", str(ROOT / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the VM is the machine CI and the toolchain script are proven on: Debian 12 (bookworm), its P4
    # toolchain built from the pinned sources, never a package source nobody here proves
    assert re.search(r'config\.vm\.box = "debian/bookworm64"', (ROOT / "Vagrantfile").read_text())
    provision = (ROOT / "vagrant" / "provision.sh").read_text()
    assert "vagrant/build-toolchain.sh" in provision and "opensuse" not in provision.lower()


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
    # only a pass of the main job passes: a void one (exit 3) fails CI like a FAIL or an error
    assert re.search(r"^\s*0\) ;;$", ci, re.M) and re.search(r"^\s*3\) .*exit 1 ;;$", ci, re.M)


PACKAGES = ("topologies", "protocol", "emulation", "p4src", "controller", "traffic", "experiments", "bench", "cli")


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


#: Each folder's floor: a module imports only from folders on lower floors (or its own). The data
#: flows one way: the fabric's model and the wire format -> its emulation and the transport -> the
#: controller -> what a scenario declares -> what a run yields -> running it -> benchmarks -> the
#: command line.
FLOORS = {"p4src": 0, "protocol": 0, "topologies": 0, "emulation": 1, "traffic": 1, "controller": 2,
          "experiments.model": 3, "experiments.analysis": 4, "experiments.run": 5, "bench": 6, "cli": 7}


def _floor_of(module: str) -> str | None:
    """The FLOORS key of ``mrclab.<folder>[.<sub>].<module>``: experiments' three layers by their
    subfolder; None for what no floor holds (the package root, ``mrclab.experiments`` itself)."""
    parts = module.split(".")[1:]
    key = ".".join(parts[:2]) if parts[0] == "experiments" and len(parts) > 1 else parts[0]
    return key if key in FLOORS else None


def _import_graph() -> dict[str, set[str]]:
    """module (``mrclab.traffic.sender``) -> the mrclab modules or packages it imports at any depth."""
    import ast

    graph: dict[str, set[str]] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        mod = ".".join(["mrclab", *parts])
        deps = graph.setdefault(mod, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("mrclab.")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mrclab"):
                deps |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    known = set(graph)
    # ``from mrclab.traffic import headers`` imports the module headers; ``from mrclab.traffic.sender
    # import Sender`` the module sender (a name that is no module is dropped here)
    return {m: {d for d in deps if d in known and d != m} for m, deps in graph.items()}


def test_imports_run_down_the_floors_and_no_module_imports_itself_back():
    """No arrow runs back up (a controller module importing experiments, say) and no import circle
    between modules: both are what make a change in one place break another."""
    graph = _import_graph()
    up = sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                if _floor_of(d) and _floor_of(m) and FLOORS[_floor_of(d)] > FLOORS[_floor_of(m)])
    assert not up, f"imports that run back up a floor: {up}"
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                circles.append(" -> ".join(trail[trail.index(d):] + [d]))
            elif d not in state:
                visit(d, trail + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not circles, f"import circles: {circles}"
    # the check sees imports at all: the command line reaches the runner
    assert "mrclab.experiments.run.runner" in graph["mrclab.cli.main"]


def test_every_script_the_readme_runs_by_its_path_is_executable():
    """A command such as ``sudo vagrant/build-toolchain.sh`` or ``./setup.sh`` runs only if the
    checkout marks the file executable (build-toolchain.sh was not: 'Permission denied' on a fresh
    clone)."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b for lang, b in re.findall(r"```(\w*)\n(.*?)```", readme, re.S) if lang in ("", "sh", "bash")]
    run = {m for b in blocks for m in re.findall(r"(?:^|[\s;&|])(?:sudo\s+)?(\.?/?[\w./-]+\.sh)\b", b, re.M)}
    scripts = {ROOT / p.removeprefix("./") for p in run}
    assert ROOT / "vagrant" / "build-toolchain.sh" in scripts and ROOT / "setup.sh" in scripts
    not_executable = sorted(str(p.relative_to(ROOT)) for p in scripts if not os.access(p, os.X_OK))
    assert not not_executable, f"the README runs these by path but they are not executable: {not_executable}"
