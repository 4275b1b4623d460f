"""Cleanup: `mrclab up` killed by a signal, or crashed, leaves nothing of mrclab behind."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mrclab.emulation.cleanup import list_netns

pytestmark = pytest.mark.root


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_killing_mrclab_up_leaves_nothing_behind(no_leftovers, sig):
    p = subprocess.Popen([sys.executable, "-m", "mrclab.cli", "up", "--dataplane", "linux", "--no-cli"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        line = p.stdout.readline()
        assert line.startswith("ready"), line
        assert len([n for n in list_netns() if n.startswith("mrclab-")]) == 20
        p.send_signal(sig)
        assert p.wait(timeout=30) != 0 or sig == signal.SIGINT
    finally:
        if p.poll() is None:
            p.kill()


def test_mrclab_clean_removes_a_crashed_run(no_leftovers):
    p = subprocess.Popen([sys.executable, "-m", "mrclab.cli", "up", "--dataplane", "linux", "--no-cli"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().startswith("ready")
    p.send_signal(signal.SIGKILL)  # a crash: no cleanup of its own
    p.wait()
    assert any(n.startswith("mrclab-") for n in list_netns())
    r = subprocess.run([sys.executable, "-m", "mrclab.cli", "clean"], capture_output=True, text=True)
    assert r.returncode == 0 and "removed run" in r.stdout


def test_collecting_the_tests_leaves_a_crashed_run_s_namespaces_alone(no_leftovers):
    # a session clears what crashed runs left before its root tests, but `pytest --collect-only`
    # beside a running suite (counting its markers) took the namespaces of the run that suite's
    # test above had just crashed on purpose
    name = "mrclab-bench-b"  # a node name `mrclab clean` removes when no live run owns it
    assert name not in list_netns()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                            str(Path(__file__))], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
        assert r.returncode == 0, r.stdout + r.stderr
        assert name in list_netns()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
