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
