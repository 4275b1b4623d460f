"""The code keeps its promises about itself: every public module, class and function has a
docstring (ruff's pydocstyle D1 rules), and the package type-checks clean under mypy."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["__init__.py", "topologies", "protocol", "emulation", "p4src", "controller", "traffic", "experiments",
            "bench", "cli"]


def _tool(name: str) -> str | None:
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else shutil.which(name)


@pytest.mark.skipif(_tool("ruff") is None, reason="needs ruff (pip install -e .[test])")
def test_every_public_module_class_and_function_has_a_docstring():
    r = subprocess.run([_tool("ruff"), "check", "--select", "D1", "--output-format", "concise", *PACKAGES],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.skipif(_tool("ruff") is None, reason="needs ruff (pip install -e .[test])")
def test_lines_and_functions_keep_the_projects_limits():
    """No line over 120 characters (E501), in the code and the tests, and no function over 50
    statements (PLR0915; pyproject.toml), but the per-packet hot paths marked as such."""
    r = subprocess.run([_tool("ruff"), "check", "--select", "E501,PLR0915", "--output-format", "concise",
                        *PACKAGES, "tests"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:]


@pytest.mark.skipif(_tool("mypy") is None, reason="needs mypy (pip install -e .[test])")
def test_the_package_type_checks(tmp_path):
    # mypy cannot follow setuptools' editable finder: it reads the checkout through a link named mrclab
    (tmp_path / "mrclab").symlink_to(ROOT)
    r = subprocess.run([_tool("mypy"), "--ignore-missing-imports", "--no-incremental", "--exclude",
                        r"mrclab/(tests|\.venv|build)/", "-p", "mrclab"],
                       cwd=tmp_path, env={"MYPYPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:]


def test_the_design_layout_names_every_module():
    """docs/design.md's layout is the one a newcomer reads: every module of every package is named
    there (as `name.py`), so a module added without a line in it fails here."""
    design = (ROOT / "docs" / "design.md").read_text()
    missing = [str(f.relative_to(ROOT)) for pkg in PACKAGES if (ROOT / pkg).is_dir()
               for f in sorted((ROOT / pkg).glob("*.py")) if f.name != "__init__.py" and f"`{f.name}`" not in design]
    assert not missing, f"docs/design.md's layout does not name: {', '.join(missing)}"


#: Kernel calls outside emulation/kernel.py, each with why it cannot go through it.
KERNEL_CALLS_ELSEWHERE = {
    # the endpoint process enters its host's namespace with setns(2) through ctypes: importing
    # pyroute2 (which emulation/kernel.py rests on) costs an endpoint 0.24 s of start-up
    "traffic/endpoint.py": "setns",
}


def test_every_kernel_call_is_in_emulation_kernel():
    """Namespaces, links, qdiscs, routes, sysctls and commands run inside a namespace go through
    emulation/kernel.py: no other module imports pyroute2 or builds an ``ip`` / ``tc`` / ``ethtool`` /
    ``sysctl`` / ``nsenter`` command line (a list starting with one, or a shell string that runs one)."""
    import ast
    import re

    tools = {"ip", "tc", "ethtool", "sysctl", "nsenter"}
    shell = re.compile(r"(^|[;&|]\s*|\$\()(ip|tc|ethtool|sysctl|nsenter) "
                       r"(-|netns|link|addr|route|qdisc|class|filter|-K|-w)")
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            rel = str(path.relative_to(ROOT))
            if rel == "emulation/kernel.py" or rel in KERNEL_CALLS_ELSEWHERE:
                continue
            tree = ast.parse(path.read_text())
            doc_nodes = {id(n.body[0].value) for n in ast.walk(tree)
                         if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                         and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    found += [f"{rel}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "pyroute2"]
                elif isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                        and node.elts[0].value in tools:
                    found.append(f"{rel}:{node.lineno} runs {node.elts[0].value}")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in doc_nodes \
                        and shell.search(node.value):
                    found.append(f"{rel}:{node.lineno} shell: {node.value[:60]!r}")
    assert not found, "kernel calls outside emulation/kernel.py: " + "; ".join(found)
