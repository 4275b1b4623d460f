"""Every error a user can cause ends as one line on stderr, exit 2 (bad input) or 1 (the run
failed), and never a traceback: broken scenario and topology files, missing files, an unreadable
results folder, a fabric already running, p4c refusing the program, a switch without a P4Runtime
session, an endpoint that died."""

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from mrclab.emulation.cleanup import list_netns
from mrclab.experiments.model.scenario import SCENARIO_DIR

ROOT = Path(__file__).resolve().parent.parent
QUICK = yaml.safe_load((SCENARIO_DIR / "quickstart.yaml").read_text())


def mrclab(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mrclab.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ, **(env or {})})


def one_line(r: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Assert exit ``code``, no traceback, and one error line on stderr (its last) naming every
    needle; progress printed before the error may precede it."""
    err = r.stderr.strip()
    assert r.returncode == code, (r.returncode, err)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, err
    errors = [x for x in err.splitlines() if "error:" in x]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    for n in needles:
        assert n in errors[0], (n, err)
    return errors[0]


def scenario_file(tmp_path: Path, name: str, **changes) -> Path:
    raw = json.loads(json.dumps(QUICK))
    for k, v in changes.items():
        if v is None:
            raw.pop(k, None)
        else:
            raw[k] = v
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


BROKEN_SCENARIOS = {
    "typo-field": ({"durration_s": 10}, ["unknown field(s) durration_s"]),
    "unknown-host": ({"workload": [{"src": "h0", "dst": "h9"}]}, ["workload[0].dst = 'h9'", "unknown host"]),
    "fault-late": ({"faults": [{"at": 99, "event": "switch_down", "switch": "t1-0-0"}]}, ["faults[0].at = 99"]),
    "unknown-switch": ({"faults": [{"at": 5, "event": "switch_down", "switch": "t1-0-9"}]}, ["unknown switch"]),
    "bad-event": ({"faults": [{"at": 5, "event": "power_cut", "switch": "t1-0-0"}]}, ["event = 'power_cut'"]),
    "bad-metric": ({"expect": [{"metric": "speed"}]}, ["expect[0].metric = 'speed'"]),
    "bad-transport": ({"transport": {"kind": "tcp"}}, ["transport.kind 'tcp'"]),
    "bad-setting": ({"transport": {"kind": "mrc", "window_packets": 0}}, ["transport.window_packets = 0"]),
    "unknown-setting": ({"transport": {"kind": "mrc", "windw": 4}}, ["unknown field(s) transport.windw"]),
    "no-workload": ({"workload": None}, ["workload"]),
    "bad-topo": ({"fabric": {"topo": "nope"}}, ["fabric.topo = 'nope'"]),
    "several": ({"seed": "x", "dataplane": "p4", "faults": [{"at": 5, "event": "link_down", "link": "a:b"}]},
                ["seed 'x'", "dataplane 'p4'", "unknown link"]),
}


@pytest.mark.parametrize("name", sorted(BROKEN_SCENARIOS))
def test_broken_scenario_files_are_one_line_exit_2(tmp_path, name):
    changes, needles = BROKEN_SCENARIOS[name]
    one_line(mrclab("run", str(scenario_file(tmp_path, name, **changes))), 2, name, *needles)


def test_a_scenario_that_is_not_yaml_or_not_a_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [oops\n")
    one_line(mrclab("run", str(bad)), 2, "bad.yaml", "cannot read scenario")
    bad.write_text("- 1\n- 2\n")
    one_line(mrclab("run", str(bad)), 2, "bad.yaml", "mapping")


BROKEN_TOPOLOGIES = {
    "zero-planes": ("planes: 0\n", ["'planes' = 0", "from 1 to 8"]),
    "typo": ("plains: 4\n", ["unknown field(s) plains"]),
    "short-block": ("locator_block: 'fcbb:bb00::/48'\n", ["/32"]),
    "link-key": ("link: {delay_ms: 3}\n", ["link.delay_ms"]),
    "negative-delay": ("link: {path_delay_ms: -1}\n", ["link.path_delay_ms", "0 (none) to 1000"]),
    "not-yaml": ("planes: [4\n", ["not valid YAML"]),
    "overlap": ("locator_block: 'fd6d:7263::/32'\n", ["overlaps"]),
}


@pytest.mark.parametrize("name", sorted(BROKEN_TOPOLOGIES))
def test_broken_topology_files_are_one_line_exit_2(tmp_path, name):
    text, needles = BROKEN_TOPOLOGIES[name]
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    one_line(mrclab("up", "--topo", str(f), "--dataplane", "linux", "--no-cli"), 2, f"{name}.yaml", *needles)


def test_missing_files_are_one_line_exit_2(tmp_path):
    one_line(mrclab("run", str(tmp_path / "nope.yaml")), 2, "no scenario", "quickstart")
    one_line(mrclab("up", "--topo", str(tmp_path / "nope.yaml"), "--no-cli"), 2, "nope.yaml", "cannot read")
    one_line(mrclab("report", str(tmp_path / "nope")), 2, "not a results folder")


def test_unreadable_results_folder_is_one_line_exit_2(tmp_path):
    (tmp_path / "metrics.json").write_text("{not json")
    (tmp_path / "timeseries.csv").write_text("t_s,goodput_mbps\n0.0,1.0\n")
    one_line(mrclab("report", str(tmp_path)), 2, "unreadable results")
    (tmp_path / "metrics.json").write_text("{}")
    one_line(mrclab("report", str(tmp_path)), 2, "metrics.json lacks")


def test_a_bad_option_is_one_line_exit_2():
    one_line(mrclab("run", "--transport", "tcp"), 2, "invalid choice", "'tcp'")


def test_a_switch_without_a_p4runtime_session_is_one_error_and_leaves_the_root_logger_alone(tmp_path, capfd):
    from mrclab.controller.p4runtime import P4Info, P4RuntimeError, P4Switch

    root_level = logging.getLogger().level
    info = tmp_path / "x.p4info.txt"
    info.write_text("")
    sw = P4Switch("t1-0-0", 0, f"unix:{tmp_path}/none.grpc", P4Info(info), tmp_path / "x.json")
    with pytest.raises(P4RuntimeError, match="t1-0-0: no P4Runtime session") as e:
        sw.connect()
    assert e.value.exit_code == 2 and "\n" not in e.value.one_line()
    assert logging.getLogger().level == root_level
    assert "Failed to establish" not in capfd.readouterr().err  # p4runtime-shell's own log is not repeated


@pytest.mark.root
def test_p4c_refusing_the_program_is_one_line_exit_2_and_builds_nothing(tmp_path, no_leftovers):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "p4c").write_text(textwrap.dedent("""\
        #!/bin/sh
        [ "$1" = "--version" ] && { echo "p4c 0.0.0 (fake)"; exit 0; }
        echo "mrclab.p4(12): [--Werror=legacy] error: syntax error, unexpected IDENTIFIER" >&2
        echo "more context" >&2
        exit 1
        """))
    (tools / "simple_switch_grpc").write_text("#!/bin/sh\nexit 1\n")
    for f in tools.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "MRCLAB_CACHE": str(tmp_path / "cache")}
    one_line(mrclab("up", "--dataplane", "bmv2", "--no-cli", env=env), 2, "p4c failed", "syntax error")


@pytest.mark.root
def test_a_fabric_already_running_is_one_line_exit_2(tmp_path, no_leftovers):
    up = subprocess.Popen([sys.executable, "-m", "mrclab.cli", "up", "--dataplane", "linux", "--no-cli"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        assert up.stdout.readline().startswith("ready")
        one_line(mrclab("run", "--dataplane", "linux", "--duration", "4", "--out", str(tmp_path / "r")), 2,
                 "already running")
        assert not (tmp_path / "r" / "metrics.json").exists()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=30)


@pytest.mark.root
def test_an_endpoint_that_dies_is_an_error_one_line_exit_2_never_a_verdict(tmp_path, monkeypatch, capsys, no_leftovers):
    import dataclasses

    from mrclab.cli import main as cli
    from mrclab.experiments.run import endpoints

    real = endpoints.configs

    def broken(scn, spec_path, folder):  # h2's endpoint gets a fabric file that is not there
        cfgs = real(scn, spec_path, folder)
        cfgs["h2"] = dataclasses.replace(cfgs["h2"], topo=str(tmp_path / "gone.yaml"))
        return cfgs

    monkeypatch.setattr(endpoints, "configs", broken)
    code = cli.main(["run", "--dataplane", "linux", "--duration", "4", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2  # an error: neither a FAIL (1) nor void (3)
    assert "endpoint on h2 exited with 2" in err[-1] and "gone.yaml" in err[-1], err[-3:]


# ---- teardown on every way out --------------------------------------------------------------------
COMMANDS = {
    "up": ["up", "--dataplane", "linux", "--no-cli"],
    "probe": ["probe", "--topo", str(ROOT / "topologies" / "lab.yaml"), "--dataplane", "linux"],
    "run": ["run", "--dataplane", "linux", "--duration", "20"],
    "bench fabric": ["bench", "fabric", "--dataplane", "linux"],
    "bench endpoint": ["bench", "endpoint"],
}


def _ours() -> set[str]:
    return {n for n in list_netns() if n.startswith("mrclab-")}


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_command_that_builds_a_fabric_tears_down_on_a_signal(cmd, sig, tmp_path, no_leftovers):
    args = COMMANDS[cmd] + (["--out", str(tmp_path / "r")] if cmd == "run" else [])
    p = subprocess.Popen([sys.executable, "-m", "mrclab.cli", *args], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not _ours() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert _ours(), f"{cmd} built nothing within 60 s: {p.stderr.read() if p.poll() is not None else ''}"
        time.sleep(0.3)  # in the middle of building or running
        p.send_signal(sig)
        code = p.wait(timeout=60)
        err = p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in err, err
    assert code == (130 if sig == signal.SIGINT else 128 + sig), (code, err[-500:])
    # no_leftovers: no namespace, run state or process of mrclab is left


# ---- cleanup that cannot hurt --------------------------------------------------------------------
def test_clean_leaves_alone_a_process_whose_pid_was_reused(tmp_path, monkeypatch):
    """A crashed run recorded two processes; one pid now belongs to another process (a different
    start time). `mrclab clean` stops the one that is still the run's and leaves the other alone."""
    from mrclab.emulation import cleanup

    monkeypatch.setattr(cleanup, "RUN_ROOT", tmp_path)
    # hermetic: the namespaces of a fabric running meanwhile belong to no run under tmp_path, and
    # clean() would take them for orphans
    monkeypatch.setattr(cleanup, "list_netns", lambda: [])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # the run's owner: dead
    ours = subprocess.Popen(["sleep", "60"])
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        st = cleanup.RunState(run_dir=str(tmp_path / "1-1"), owner_pid=gone.pid, dataplane="linux", topo={},
                              owner_started=1.0)
        (tmp_path / "1-1").mkdir()
        st.pids = [[ours.pid, cleanup.started_at(ours.pid)],
                   [stranger.pid, cleanup.started_at(stranger.pid) - 100.0]]  # recorded long before: reused
        st.save()
        removed = cleanup.clean()
        assert removed == ["run 1-1 (0 namespaces, 1 processes)"]
        ours.wait(timeout=5)  # stopped (clean reaped it: its own child here)
        assert cleanup.started_at(ours.pid) is None
        assert stranger.poll() is None  # still running: not the process the run started
        assert not (tmp_path / "1-1").exists()
    finally:
        for p in (ours, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()
