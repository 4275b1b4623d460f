"""The wire constants that live three times, in P4 (p4src/mrclab.p4), in C (bpfsrc/port_queue.bpf.c)
and in Python (protocol/headers.py, controller/queues.py, controller/p4runtime.py, controller/bpf.py),
read from each source and held equal: a change in one that the others miss fails here, not in a
capture three weeks later."""

import re
from pathlib import Path

import pytest
from mrclab.controller import bpf, p4runtime, queues
from mrclab.protocol import headers as H

ROOT = Path(__file__).resolve().parents[1]


def _p4() -> dict[str, int]:
    """``const bit<N> NAME = VALUE;`` of the P4 program."""
    src = (ROOT / "p4src" / "mrclab.p4").read_text()
    return {m[1]: int(m[2], 0) for m in re.finditer(r"^const bit<\d+>\s+(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+);", src, re.M)}


def _c() -> dict[str, int]:
    """``#define NAME VALUE`` of the eBPF program (plain numbers and sums of earlier ones)."""
    src = (ROOT / "bpfsrc" / "port_queue.bpf.c").read_text()
    out: dict[str, int] = {}
    for m in re.finditer(r"^#define\s+(\w+)\s+(.+?)\s*(?:/\*.*)?$", src, re.M):
        expr = m[2].strip()
        if re.fullmatch(r"[\w\s+()x]+", expr):
            try:
                out[m[1]] = int(eval(re.sub(r"\b([A-Z_]+)\b", lambda x: str(out[x[1]]), expr)))  # noqa: S307
            except (KeyError, SyntaxError, NameError):
                pass
    return out


P4, C = _p4(), _c()

#: (what, Python's value, P4 constant or None, C constant or None)
BOUND = [
    ("RoCEv2 UDP port", H.UDP_PORT, "ROCE_UDP_PORT", "ROCE_UDP_PORT"),
    ("RDMA Write opcode", H.OP_WRITE, "OP_WRITE", "OP_WRITE"),
    ("RDMA Write with immediate opcode", H.OP_WRITE_IMM, "OP_WRITE_IMM", "OP_WRITE_IMM"),
    ("BTH TRIM flag", H.F_TRIM, "F_TRIM", "F_TRIM"),
    ("DSCP of a trimmed packet", H.TRIM_DSCP, "TRIM_DSCP", "TRIM_DSCP"),
    ("bytes a trim keeps", H.TRIM_BYTES, "TRIM_BYTES", "TRIM_BYTES"),
    ("outer IPv6 payload length of a trimmed packet", H.TRIM_BYTES - H.OFF_INNER, "TRIM_OUTER_LEN", "TRIM_OUTER_LEN"),
    ("inner IPv6 / UDP length of a trimmed packet", H.TRIM_BYTES - H.OFF_UDP, "TRIM_INNER_LEN", "TRIM_INNER_LEN"),
    ("offset of the outer IPv6 header", H.OFF_OUTER, None, "OFF_OUTER"),
    ("offset of the inner IPv6 header", H.OFF_INNER, None, "OFF_INNER"),
    ("offset of the UDP header", H.OFF_UDP, None, "OFF_UDP"),
    ("offset of the BTH", H.OFF_BTH, None, "OFF_BTH"),
    ("trimmed frame the queues charge", queues.TRIM_FRAME_BYTES, "TRIM_BYTES", "TRIM_BYTES"),
    ("ports a bmv2 switch counts", p4runtime.MAX_PORTS, "MAX_PORTS", None),
]


@pytest.mark.parametrize("what,value,p4name,cname", BOUND, ids=[b[0] for b in BOUND])
def test_a_wire_constant_is_the_same_in_p4_c_and_python(what, value, p4name, cname):
    if p4name:
        assert P4[p4name] == value, f"{what}: p4src/mrclab.p4 {p4name} = {P4[p4name]}, Python {value}"
    if cname:
        assert C[cname] == value, f"{what}: bpfsrc/port_queue.bpf.c {cname} = {C[cname]}, Python {value}"


def test_the_default_frame_is_the_default_payload_plus_the_data_overhead():
    from mrclab.traffic.settings import TransportSettings

    assert queues.DEFAULT_FRAME_BYTES == TransportSettings().payload_bytes + H.DATA_OVERHEAD


def test_drop_reasons_follow_the_p4_program_s_numbering():
    reasons = {k[len("DROP_"):].lower(): v for k, v in P4.items() if k.startswith("DROP_")}
    assert {r: i for i, r in enumerate(p4runtime.DROP_REASONS)} == {
        ("gray_loss" if r == "gray" else r): v for r, v in reasons.items()}


def test_the_htb_classes_are_the_ones_the_ebpf_program_steers_into():
    as_id = {name: int(cls.split(":")[0], 16) << 16 | int(cls.split(":")[1], 16)
             for name, cls in (("CLASS_HIGH", bpf.CLASS_HIGH), ("CLASS_LOW", bpf.CLASS_LOW))}
    assert as_id == {"CLASS_HIGH": C["CLASS_HIGH"], "CLASS_LOW": C["CLASS_LOW"]}


def test_gray_loss_draws_from_the_same_generator_in_p4_and_c():
    p4 = (ROOT / "p4src" / "mrclab.p4").read_text()
    c = (ROOT / "bpfsrc" / "port_queue.bpf.c").read_text()
    lcg = re.compile(r"\*\s*(\d+)\s*\+\s*(\d+)")
    assert lcg.search(p4) and lcg.search(p4).groups() == lcg.search(c).groups()


def test_the_readers_see_every_constant_they_are_asked_for():
    """The parsers themselves can fail: each name the table binds was found in its source."""
    assert {b[2] for b in BOUND if b[2]} <= set(P4)
    assert {b[3] for b in BOUND if b[3]} <= set(C)


def test_a_fabric_has_no_more_planes_than_the_port_state_bitmap_has_bits():
    """One NIC port per plane and one bit per port in the port-state byte of every data packet,
    SACK and probe: a ninth plane could not be said (it crashed the endpoint before the limit)."""
    from mrclab.topologies.spec import MAX_NIC_PORTS, ClosSpec, SpecError

    assert H.MRCX.format.endswith("BBH") and H.PROBE.format == "!IBBHIQ"  # flags, port_state: one byte each
    assert MAX_NIC_PORTS == 8
    with pytest.raises(SpecError, match="planes.*from 1 to 8"):
        ClosSpec.from_dict({"name": "nine", "planes": 9})
