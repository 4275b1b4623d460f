"""BMv2's Thrift client is found where the toolchain script installed it, beside simple_switch_grpc's
prefix, so a toolchain built after setup.sh needs no second setup.sh."""
import sys

from mrclab.controller import thrift


def _prefix(tmp_path, packages="site-packages"):
    (tmp_path / "bin").mkdir()
    binary = tmp_path / "bin" / "simple_switch_grpc"
    binary.write_text("#!/bin/sh\n")
    client = tmp_path / "lib" / "python3.11" / packages / "sswitch_runtime"
    client.mkdir(parents=True)
    (client / "__init__.py").write_text("")
    return binary, client.parent


def test_the_client_beside_the_binary_s_prefix_goes_on_sys_path(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    binary, folder = _prefix(tmp_path)
    assert str(folder) not in sys.path
    assert thrift.client_path(str(binary)) == folder
    assert sys.path.count(str(folder)) == 1
    thrift.client_path(str(binary))  # twice: still once on the path
    assert sys.path.count(str(folder)) == 1


def test_dist_packages_counts_too_and_no_client_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "a").mkdir()
    binary, folder = _prefix(tmp_path / "a", "dist-packages")
    assert thrift.client_path(str(binary)) == folder
    (tmp_path / "b" / "bin").mkdir(parents=True)
    assert thrift.client_path(str(tmp_path / "b" / "bin" / "simple_switch_grpc")) is None
