"""The P4Runtime writer's error path, without a switch: a refused update in a batch whose other
updates were accepted becomes one P4RuntimeWriteException naming it (p4runtime-shell 0.0.6 looped
for ever on the accepted one; controller/p4runtime.py mends its iterator)."""

import threading

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, status_pb2
from mrclab.controller import p4runtime  # noqa: F401  (mends p4runtime-shell's error iterator)
from p4.v1 import p4runtime_pb2
from p4runtime_sh.p4runtime import P4RuntimeWriteException


class _BatchRefused:
    """A Write's grpc error as BMv2's P4Runtime server sends it: UNKNOWN, one p4.Error per update."""

    def __init__(self, codes):
        status = status_pb2.Status(code=code_pb2.UNKNOWN)
        for c in codes:
            a = any_pb2.Any()
            a.Pack(p4runtime_pb2.Error(canonical_code=c, message=f"code {c}"))
            status.details.append(a)
        self.blob = status.SerializeToString()

    def code(self):
        return grpc.StatusCode.UNKNOWN

    def trailing_metadata(self):
        return [("grpc-status-details-bin", self.blob)]


def test_a_refused_update_after_accepted_ones_is_reported_not_looped_on():
    got = {}

    def build():
        got["e"] = P4RuntimeWriteException(_BatchRefused([code_pb2.OK, code_pb2.OK, code_pb2.INVALID_ARGUMENT]))

    t = threading.Thread(target=build, daemon=True)
    t.start()
    t.join(timeout=5)
    assert not t.is_alive(), "building the write exception never ended"
    assert [(i, e.canonical_code) for i, e in got["e"].errors] == [(2, code_pb2.INVALID_ARGUMENT)]
    assert "At index 2: INVALID_ARGUMENT" in str(got["e"])


def test_a_restarted_switch_that_refuses_its_first_handshakes_gets_a_session_at_a_later_try(tmp_path, monkeypatch):
    """A switch whose process was just restarted opens its socket before its gRPC server answers
    every stream (the quickstart's T1 coming back on bmv2 refused one handshake, and the run
    ended in an error): connect tries again, CONNECT_RETRY_S apart, and only after every try
    failed is it a P4RuntimeError."""
    import pytest

    tries = []

    class Client:
        def __init__(self, *args) -> None:
            tries.append(args)
            if len(tries) < 3:
                raise SystemExit(1)  # what p4runtime-shell does when a handshake fails

    monkeypatch.setattr(p4runtime, "P4RuntimeClient", Client)
    monkeypatch.setattr(p4runtime, "CONNECT_RETRY_S", 0.0)
    (tmp_path / "x.p4info.txt").write_text("")
    sw = p4runtime.P4Switch("t1-0-1", 3, "unix:/nowhere.grpc", p4runtime.P4Info(tmp_path / "x.p4info.txt"),
                            tmp_path / "x.json")
    sw.connect()
    assert len(tries) == 3 and isinstance(sw.client, Client)
    tries.clear()
    with pytest.raises(p4runtime.P4RuntimeError, match=r"t1-0-1: no P4Runtime session at .* \(2 tries\)"):
        sw.connect(tries=2)
    assert len(tries) == 2 and sw.client is None
