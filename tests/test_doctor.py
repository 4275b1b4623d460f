"""``mrclab doctor`` names what is missing and the line that installs it (no root needed)."""

import shutil

from mrclab.experiments.run import doctor


def test_a_machine_without_the_toolchain_is_told_how_to_get_it(monkeypatch):
    real = shutil.which
    monkeypatch.setattr(doctor.shutil, "which",
                        lambda name: None if name in ("p4c", "simple_switch_grpc", "tshark") else real(name))
    by = {c.name: c for c in doctor.checks()}
    assert not by["p4c"].found and "build-toolchain.sh" in by["p4c"].install
    assert not by["simple_switch_grpc"].found and "BMv2 Thrift runtime (bmv2 queues)" not in by
    assert not by["tshark"].found and by["tshark"].install == "apt-get install -y tshark"
    from mrclab.emulation import nodes

    monkeypatch.setattr(nodes.shutil, "which",
                        lambda name: None if name in ("p4c", "simple_switch_grpc") else real(name))
    runs, _have, why = doctor.planes()["bmv2"]
    assert not runs and "p4c" in why


def test_a_missing_clang_takes_the_linux_data_plane_and_says_why(monkeypatch):
    """The linux plane's uN SID is a tc eBPF program: without clang and libbpf it cannot forward."""
    from mrclab.controller import bpf

    monkeypatch.setattr(bpf, "bpf_missing", lambda: "clang is not installed (setup.sh installs it)")
    c = next(c for c in doctor.checks() if c.name.startswith("clang"))
    assert not c.found and c.install == "apt-get install -y clang libbpf-dev"
    runs, _have, why = doctor.planes()["linux"]
    assert not runs and "clang is not installed" in why


def test_the_forwarding_build_runs_and_debug_takes_the_logging_build(tmp_path, monkeypatch):
    """simple_switch_grpc on PATH is the forwarding build; --debug takes the logging build that
    vagrant/build-toolchain.sh installs beside it, and says which it took."""
    from mrclab.emulation import nodes

    prefix = tmp_path / "usr"
    fwd = prefix / "bin" / "simple_switch_grpc"
    fwd.parent.mkdir(parents=True)
    fwd.write_text("")
    monkeypatch.setattr(nodes.shutil, "which", lambda name: str(fwd) if name == "simple_switch_grpc" else None)
    assert nodes.bmv2_binary(debug=True) == (str(fwd), nodes.bmv2_binary()[1])  # no logging build: the one there is
    assert "only build" in nodes.bmv2_binary()[1]
    log = prefix / nodes.LOGGING_BUILD
    log.parent.mkdir(parents=True)
    log.write_text("")
    assert nodes.bmv2_binary() == (str(fwd), "forwarding build")
    assert nodes.bmv2_binary(debug=True) == (str(log), "logging build")
