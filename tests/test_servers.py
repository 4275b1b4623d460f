"""Servers a fabric may span (emulation/servers.py): named on the command line, checked over ssh
before anything is built on them, one clear line per problem. The root tests run against servers
on this machine: network namespaces with their own sshd (emulation/nsservers.py)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mrclab.emulation import servers as S
from mrclab.emulation.dataplanes import BMV2_THRIFT_TEST
from mrclab.topologies.errors import BadInput
from mrclab.emulation.nsservers import fake_bin
from mrclab.emulation.nsservers import servers as ns_servers


def test_servers_are_named_user_at_address_in_order():
    assert S.parse_servers("10.0.0.1, alice@10.0.0.2") == [S.Server("10.0.0.1"), S.Server("10.0.0.2", "alice")]


@pytest.mark.parametrize("text, says", [
    ("10.0.0.1,,10.0.0.2", "'' is not a server"),
    ("bad host", "'bad host' is not a server"),
    ("a@b@c", "'a@b@c' is not a server"),
    ("10.0.0.1,root@10.0.0.1", "root@10.0.0.1 is given twice"),
])
def test_a_bad_server_list_is_one_line_naming_the_entry(text, says):
    with pytest.raises(BadInput, match=says):
        S.parse_servers(text)


def test_problems_are_raised_together_one_line_each():
    ok = S.ServerCheck(S.Server("a"), ())
    bad = S.ServerCheck(S.Server("b"), ("root@b: lacks mnexec: apt-get install -y mininet", "root@b: clock +900 ms"))
    S.require([ok])
    with pytest.raises(S.ServerError) as e:
        S.require([ok, bad])
    assert e.value.one_line().count("root@b") == 2


needs_sshd = pytest.mark.skipif(shutil.which("sshd") is None and not os.path.exists("/usr/sbin/sshd"),
                                reason="no sshd here (setup.sh installs openssh-server)")


@pytest.mark.root
@needs_sshd
def test_doctor_checks_every_server_over_ssh_and_names_what_each_lacks(tmp_path):
    # server 1 has what a linux fabric needs; server 2 lacks mnexec and its clock is 0.4 s ahead;
    # 198.18.0.99 is no server at all
    path2 = fake_bin(tmp_path / "bin2", ["ip", "tc"], date_offset_s=0.4)
    with ns_servers(2, tmp_path, paths={2: path2}) as srv:
        ssh = S.Ssh(Path(tempfile.mkdtemp(prefix="mrclab-ssh-", dir="/tmp")), srv.ssh_config)
        try:
            one, two, none = S.preflight(ssh, [S.Server(a) for a in srv.addresses + ["198.18.0.99"]])
        finally:
            ssh.close()
            shutil.rmtree(ssh.control_dir)
        assert one.problems == () and abs(one.offset_s) < 0.02 and one.rtt_s < 1.0
        assert any("lacks mnexec: apt-get install -y mininet" in p for p in two.problems), two.problems
        assert any("clock +4" in p and "ms from this machine's" in p for p in two.problems), two.problems
        assert 0.35 < two.offset_s < 0.45
        assert len(none.problems) == 1 and "unreachable over ssh" in none.problems[0]
        # the command line: the table, exit 3 while a server cannot carry a fabric, 0 when all can
        # (wide enough that the table names each server whole)
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "doctor", "--servers", ",".join(srv.addresses),
                            "--ssh-config", str(srv.ssh_config)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, COLUMNS="250"))
        assert r.returncode == 3, r.stdout + r.stderr
        assert "lacks mnexec" in r.stdout and "198.18.0.1" in r.stdout
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "doctor", "--servers", srv.addresses[0],
                            "--ssh-config", str(srv.ssh_config)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        bmv2_here = shutil.which("simple_switch_grpc") is not None
        assert ("lacks simple_switch_grpc" in r.stdout) != bmv2_here  # the bmv2 column judges the toolchain
    # no ssh connection outlives its Ssh (each server's one master is closed)
    left = subprocess.run(["pgrep", "-f", "ControlPath=/tmp/mrclab-ssh-"], capture_output=True, text=True).stdout
    assert not left.strip(), left


@pytest.mark.root
@needs_sshd
def test_the_clock_is_read_in_a_process_with_descriptors_past_1023(tmp_path):
    # CI's long test session holds over a thousand descriptors: select() refused the ssh pipe's
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    held = [open("/dev/null") for _ in range(1100)]
    try:
        with ns_servers(1, tmp_path) as srv:
            ssh = S.Ssh(Path(tempfile.mkdtemp(prefix="mrclab-ssh-", dir="/tmp")), srv.ssh_config)
            try:
                (check,) = S.preflight(ssh, [S.Server(srv.addresses[0])])
            finally:
                ssh.close()
                shutil.rmtree(ssh.control_dir)
        assert check.problems == () and abs(check.offset_s) < 0.02
    finally:
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_control_folder_too_long_for_a_socket_is_refused_up_front(tmp_path):
    with pytest.raises(BadInput, match="too long for a socket path"):
        S.Ssh(tmp_path / ("x" * 80))


def test_a_malformed_server_list_on_the_command_line_is_one_line():
    r = subprocess.run([sys.executable, "-m", "mrclab.cli", "doctor", "--servers", "a b"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stdout + r.stderr
    assert "'a b' is not a server" in r.stdout + r.stderr


def _python_without_libbpf(folder: Path) -> str:
    """A folder whose ``python3`` cannot load libbpf (a server without ``libbpf1``), as a PATH
    ahead of this one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import ctypes\n_CDLL = ctypes.CDLL\n"
        "class CDLL(_CDLL):\n"
        "    def __init__(self, name, *a, **k):\n"
        "        if name and 'libbpf' in str(name):\n"
        "            raise OSError(f'{name}: cannot open shared object file')\n"
        "        super().__init__(name, *a, **k)\n"
        "ctypes.CDLL = CDLL\n")
    real = shutil.which("python3")
    (folder / "python3").write_text(f"#!/bin/sh\nPYTHONPATH={folder} exec {real} \"$@\"\n")
    (folder / "python3").chmod(0o755)
    return f"{folder}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"


@pytest.mark.root
@needs_sshd
def test_doctor_names_a_server_that_lacks_libbpf_for_linux_and_a_run_refuses_it(tmp_path):
    """A linux switch's uN SID is a tc eBPF program the server's agent loads with its libbpf:
    without libbpf the server carries no linux fabric at all, queued or not."""
    with ns_servers(2, tmp_path, paths={2: _python_without_libbpf(tmp_path / "bin2")}) as srv:
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "doctor", "--servers", ",".join(srv.addresses),
                            "--ssh-config", str(srv.ssh_config)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, COLUMNS="250"))
        assert r.returncode == 3, r.stdout + r.stderr  # one server cannot carry a linux fabric
        lines = r.stdout.splitlines()
        said = [x for x in lines if ": lacks libbpf: " in x]
        assert [x.split(":")[0] for x in said] == [f"root@{srv.addresses[1]}"], r.stdout
        assert "apt-get install -y libbpf1" in said[0]
        assert not [x for x in lines if "linux over servers lacks" in x]  # a problem, not a feature lacking
        # bmv2's queues over servers need a simple_switch_grpc with Thrift there (these servers share
        # this machine's binaries): said for every server where it has none, for none where it has
        served = subprocess.run(["sh", "-c", BMV2_THRIFT_TEST]).returncode == 0
        assert sum("bmv2 over servers lacks congestion" in x for x in lines) == (0 if served else 2)
        # a run refuses that server in one line, before anything is built (no queues needed)
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "run", "quickstart", "--dataplane", "linux",
                            "--servers", ",".join(srv.addresses), "--ssh-config", str(srv.ssh_config),
                            "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 3, r.stdout + r.stderr
        assert f"root@{srv.addresses[1]}: lacks libbpf" in r.stdout + r.stderr
        assert "Traceback" not in r.stdout + r.stderr
        for address in srv.addresses:
            left = subprocess.run(["ssh", "-F", str(srv.ssh_config), address, "ip netns list"],
                                  capture_output=True, text=True, timeout=60).stdout
            assert "mrclab-" not in left


@pytest.mark.root
@needs_sshd
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="confining servers and this machine apart needs 2 CPUs")
def test_a_confined_server_runs_what_it_starts_on_its_cpus_and_this_machine_on_the_others(tmp_path):
    from mrclab.bench.scale import SERVER_CPUS, confined
    mine = os.sched_getaffinity(0)
    rest = mine - set(SERVER_CPUS)

    def allowed(argv):
        out = subprocess.run([*argv, "grep", "Cpus_allowed_list", "/proc/self/status"], capture_output=True,
                             text=True, timeout=60).stdout
        return out.split()[-1]

    (tmp_path / "free").mkdir()
    with ns_servers(1, tmp_path / "free") as free:  # an unconfined server's logins may run anywhere
        assert allowed(["ssh", "-F", str(free.ssh_config), free.addresses[0]]) != ",".join(map(str, SERVER_CPUS))
    with ns_servers(1, tmp_path, cpus=list(SERVER_CPUS)) as srv:
        assert allowed(["ssh", "-F", str(srv.ssh_config), srv.addresses[0]]) == ",".join(map(str, SERVER_CPUS))
        with confined(rest):  # this process and what it starts: the other CPUs
            assert os.sched_getaffinity(0) == rest
            assert allowed([]) == ",".join(map(str, sorted(rest)))
        assert os.sched_getaffinity(0) == mine


@pytest.mark.parametrize("n", [0, 9])
def test_bench_scale_servers_out_of_range_is_one_line(n):
    from mrclab.bench.scale import check_servers
    with pytest.raises(BadInput, match=f"--servers {n}: allowed: 1 to 8"):
        check_servers(n)


def test_bench_scale_servers_without_sshd_is_one_line(monkeypatch):
    from mrclab.bench import scale
    monkeypatch.setattr(scale, "SSHD", "/nonexistent/sshd")
    with pytest.raises(BadInput, match="need /nonexistent/sshd \\(apt-get install -y openssh-server\\)"):
        scale.check_servers(2)
