"""The Wireshark dissector (traffic/wireshark/mrc.lua) against the project's own decoder.

Frames are dissected by tshark with the Lua dissector loaded and compared, field by field, with what
:meth:`traffic.wire.Wire.decode` (and, for a sample, the scapy layers of traffic/layers.py) make of
the very same bytes: frames built in-process (no root), and a capture of MRC and RoCE transfers on
the linux fabric (``root``). Every frame must dissect with no malformed item and no Error-level
expert item, and every opcode sent must show up by name.

tshark runs with ``-o udp.ignore_ipv6_zero_checksum:TRUE``: mrclab's UDP checksum is 0 over IPv6
(the ICRC protects the transport, RFC 6935 style), which Wireshark 4.0 otherwise flags as an Error
on every frame, in the UDP dissector, before any dissector of the payload runs.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mrclab.protocol import headers as H
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import load_spec
from mrclab.traffic import layers as L
from mrclab.traffic.packet import Pkt
from mrclab.traffic.wire import Wire
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap, wrpcap
from test_congestion import _switch_trim  # what a trimming switch does to a data packet

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "traffic" / "wireshark" / "mrc.lua"
TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="needs tshark (apt-get install tshark)")

#: The tshark invocation (the capture file goes after -r).
TSHARK_ARGS = ["-n", "-o", "udp.ignore_ipv6_zero_checksum:TRUE", "-X", f"lua_script:{LUA}"]
FIELDS = ["frame.number", "_ws.col.Info", "_ws.malformed", "_ws.expert.severity", "_ws.expert.message",
          "mrc.opcode", "mrc.qp", "mrc.psn", "mrc.ev", "mrc.ev.plane", "mrc.ev.t1", "mrc.ev.entropy",
          "mrc.flags.retx", "mrc.flags.trim", "mrc.trimmed", "mrc.ecn", "mrc.port_state",
          "mrc.msn", "mrc.msg_len", "mrc.msg_crc", "mrc.msg_offset", "mrc.reth.va", "mrc.reth.rkey",
          "mrc.reth.dma_len", "mrc.imm", "mrc.payload",
          "mrc.sack.cum_psn", "mrc.sack.base_psn", "mrc.sack.bitmap", "mrc.sack.trim_bitmap",
          "mrc.sack.echo_ev", "mrc.sack.echo_psn", "mrc.sack.flags", "mrc.sack.ecn",
          "mrc.probe.id", "mrc.probe.is_reply", "mrc.probe.ev", "mrc.probe.t_send_ns",
          "mrc.icrc", "mrc.icrc.status"]
PI_ERROR, PI_WARN = 0x00800000, 0x00600000
ICRC_GOOD, ICRC_BAD, ICRC_NOT_PRESENT = 1, 0, 3

PLAN = AddressPlan(load_spec())
NIC_TO_HOST = Wire(PLAN, "h0").nic_to_host
WIRES: dict[str, Wire] = {}  # host -> the decoder of its NIC


# ---- tshark and the project's decoder --------------------------------------------------------------
def dissect(pcap: Path) -> dict[int, dict[str, list[str]]]:
    """frame number -> {field: [values]} as tshark with mrc.lua dissects ``pcap``."""
    cmd = [TSHARK, *TSHARK_ARGS, "-r", str(pcap), "-T", "json"]
    for f in FIELDS:
        cmd += ["-e", f]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Lua" not in r.stderr or "error" not in r.stderr.lower(), r.stderr[-2000:]
    out = {}
    for pkt in json.loads(r.stdout or "[]"):
        layers = pkt["_source"]["layers"]
        out[int(layers["frame.number"][0])] = layers
    return out


def _int(layers: dict, field: str) -> int | None:
    v = layers.get(field)
    return None if v is None else int(v[0], 0)


def decode(frame: bytes) -> Pkt | None:
    """The packet the destination NIC's :class:`Wire` decodes from ``frame`` (None: not MRC, or
    rejected: ``Wire.rejected`` of that NIC says why)."""
    host = NIC_TO_HOST.get(frame[H.OFF_INNER + 24 : H.OFF_INNER + 40]) if len(frame) >= H.OFF_BODY else None
    if host is None:
        return None
    w = WIRES.setdefault(host, Wire(PLAN, host))
    got = w.decode(frame)
    return None if got is None else got[1]


def name_of(p: Pkt) -> str:
    """The name the dissector must give ``p``'s opcode in the Info column."""
    if p.op == H.OP_PROBE:
        return "Probe reply" if p.is_reply else "Probe request"
    return {H.OP_WRITE: "MRC Write", H.OP_WRITE_IMM: "MRC Write-with-Immediate", H.OP_ACK: "ACK",
            H.OP_SACK: "SACK", H.OP_NACK: "NACK", H.OP_CNP: "CNP"}[p.op]


def expected_fields(p: Pkt) -> dict[str, int | None]:
    """The mrc.* fields (as integers) the dissector must show for the decoded packet ``p``."""
    trimmed = p.op in (H.OP_WRITE, H.OP_WRITE_IMM) and bool(p.flags & H.F_TRIM)
    e = {"mrc.opcode": p.op, "mrc.qp": p.qp, "mrc.psn": p.psn, "mrc.ev": p.ev, "mrc.ev.plane": (p.ev >> 12) & 0xF,
         "mrc.ev.t1": p.ev & 0xFFF, "mrc.ev.entropy": p.ev >> 16, "mrc.flags.retx": p.flags & H.F_RETX,
         "mrc.trimmed": int(trimmed), "mrc.icrc.status": ICRC_NOT_PRESENT if trimmed else ICRC_GOOD}
    if p.ecn_ce:
        e["mrc.ecn"] = 3
    if p.op in (H.OP_WRITE, H.OP_WRITE_IMM):
        e.update({"mrc.msn": p.msn, "mrc.msg_len": p.msg_len, "mrc.msg_crc": p.msg_crc, "mrc.msg_offset": p.msg_offset,
                  "mrc.reth.va": p.va, "mrc.reth.rkey": p.rkey, "mrc.reth.dma_len": p.dma_len,
                  "mrc.port_state": p.port_state, "mrc.imm": p.imm, "mrc.flags.trim": int(trimmed)})
    elif p.op in (H.OP_SACK, H.OP_NACK, H.OP_ACK):
        e.update({"mrc.sack.cum_psn": p.cum_psn, "mrc.sack.base_psn": p.base_psn, "mrc.sack.bitmap": p.bitmap,
                  "mrc.sack.trim_bitmap": p.trim_bitmap, "mrc.sack.echo_ev": p.echo_ev,
                  "mrc.sack.echo_psn": p.echo_psn, "mrc.sack.flags": p.sflags,
                  "mrc.sack.ecn": p.sflags & H.S_ECN, "mrc.port_state": p.port_state})
    elif p.op == H.OP_PROBE:
        e.update({"mrc.probe.id": p.probe_id, "mrc.probe.is_reply": p.is_reply, "mrc.probe.ev": p.echo_ev,
                  "mrc.probe.t_send_ns": p.t_send_ns, "mrc.port_state": p.port_state})
    return e


def check_capture(pcap: Path) -> tuple[set[str], int, dict]:
    """Dissects ``pcap`` and compares every MRC frame with the project's decoder; returns (the
    opcode names seen, the number of MRC frames, the dissection)."""
    frames = [bytes(p) for p in rdpcap(str(pcap))]
    ws = dissect(pcap)
    assert len(ws) == len(frames)
    errors = {n: l.get("_ws.expert.message") for n, l in ws.items()
              if any(int(s, 0) >= PI_ERROR for s in l.get("_ws.expert.severity", []))}
    assert not errors, f"Error-level expert items: {dict(list(errors.items())[:5])}"
    malformed = [n for n, l in ws.items() if "_ws.malformed" in l]
    assert not malformed, f"malformed frames: {malformed[:10]}"

    names, n_mrc = set(), 0
    for i, frame in enumerate(frames, start=1):
        p, layers = decode(frame), ws[i]
        is_mrc_udp = (len(frame) >= H.OFF_BODY and frame[12:14] == b"\x86\xdd" and frame[H.OFF_OUTER + 6] == 41
                      and frame[H.OFF_INNER + 6] == 17
                      and struct.unpack_from("!H", frame, H.OFF_UDP + 2)[0] == H.UDP_PORT)
        if p is None:
            why = [w.rejected for w in WIRES.values()]
            assert not is_mrc_udp, f"frame {i}: the project's decoder rejected it: {why}"
            continue
        n_mrc += 1
        info = layers["_ws.col.Info"][0]
        assert info.startswith(name_of(p)), (i, info, name_of(p))
        assert f"QP={p.qp} PSN={p.psn} EV=0x{p.ev:08x}" in info, (i, info)
        names.add(name_of(p))
        for field, want in expected_fields(p).items():
            assert _int(layers, field) == want, f"frame {i} ({info}): {field} = {layers.get(field)}, decoder: {want}"
        if p.op in (H.OP_WRITE, H.OP_WRITE_IMM) and not p.flags & H.F_TRIM:
            assert bytes.fromhex(layers.get("mrc.payload", [""])[0].replace(":", "")) == bytes(p.payload)
    return names, n_mrc, ws


def check_scapy_sample(pcap: Path, ws: dict, every: int = 25) -> int:
    """A sample of frames (every ``every``-th) through the scapy layers of traffic/layers.py
    against tshark's dissection ``ws``; returns how many were compared."""
    checked = 0
    for i, pkt in enumerate(rdpcap(str(pcap)), start=1):
        if i % every and i != 1 or L.BTHdr not in pkt:
            continue
        layers, bth = ws[i], pkt[L.BTHdr]
        assert (_int(layers, "mrc.opcode"), _int(layers, "mrc.qp"), _int(layers, "mrc.psn")) == \
            (bth.opcode, bth.dqpn, bth.psn), i
        if L.MRCXHdr in pkt:
            assert _int(layers, "mrc.msn") == pkt[L.MRCXHdr].msn
            assert _int(layers, "mrc.reth.dma_len") == pkt[L.RETHdr].dma_len
            assert _int(layers, "mrc.reth.va") == pkt[L.RETHdr].va
        if L.SackHdr in pkt:
            assert _int(layers, "mrc.sack.cum_psn") == pkt[L.SackHdr].cum_psn
            assert _int(layers, "mrc.sack.bitmap") == pkt[L.SackHdr].bitmap
        if L.ProbeHdr in pkt:
            assert _int(layers, "mrc.probe.id") == pkt[L.ProbeHdr].probe_id
        checked += 1
    return checked


# ---- frames built in-process -------------------------------------------------------------------------
def _mark_ce(frame: bytes) -> bytes:
    """The frame with ECN CE in its outer traffic class, as a marking switch leaves it."""
    f = bytearray(frame)
    f[H.OFF_OUTER + 1] |= (H.ECN_CE << 4)
    return bytes(f)


def _set_lengths(f: bytearray) -> bytes:
    n = len(f) - H.OFF_UDP
    struct.pack_into("!H", f, H.OFF_OUTER + 4, len(f) - H.OFF_INNER)
    struct.pack_into("!H", f, H.OFF_INNER + 4, n)
    struct.pack_into("!H", f, H.OFF_UDP + 4, n)
    return bytes(f)


def built_frames() -> list[bytes]:
    """One frame of every kind mrclab sends, built by Wire.encode (h0 -> h2 and back)."""
    fwd, rev = Wire(PLAN, "h0"), Wire(PLAN, "h2")
    ev = PLAN.paths("h0", "h2")[3].ev | (0xBEEF << 16)
    rev_ev = PLAN.paths("h2", "h0")[6].ev | (0x0042 << 16)
    payload = bytes(range(256)) * 4

    def enc(w, p, peer):
        return w.encode(p, peer)[1]

    write = enc(fwd, Pkt(H.OP_WRITE, 1, 1234, ev, 0, 7, 4096, 0x1234ABCD, 1024, 1 << 20, 0x4D520001, 1024, payload),
                "h2")
    write_imm = enc(fwd, Pkt(H.OP_WRITE_IMM, 2, 0xFFFFFE, ev, H.F_RETX, 8, 3000, 0xCAFEF00D, 2048, (1 << 33) + 2048,
                              0x4D520002, 952, payload[:952], 0xDEADBEEF, 0x0B), "h2")
    last = enc(fwd, Pkt(H.OP_WRITE, 1, 1235, ev, 0, 7, 4096, 0x1234ABCD, 3072, 1 << 20, 0x4D520001, 1024, payload),
               "h2")  # the LAST packet of its message
    zero_len = enc(fwd, Pkt(H.OP_WRITE_IMM, 3, 17, ev, 0, 9, 0, 0, 0, 0, 0x4D520003, 0, b"", 0x5), "h2")
    frames = [
        write, write_imm, last, zero_len, _mark_ce(write),
        _switch_trim(write), _switch_trim(write_imm),
        enc(rev, Pkt(op=H.OP_SACK, qp=1, ev=rev_ev, cum_psn=1200, base_psn=1190, bitmap=(1 << 63) | 0xF0F5,
                     trim_bitmap=1 << 40, echo_ev=ev, echo_psn=1234, sflags=H.S_ECN, port_state=0x0D), "h0"),
        enc(rev, Pkt(op=H.OP_NACK, qp=1, ev=rev_ev, cum_psn=1200, base_psn=1200, bitmap=0, trim_bitmap=1 << 34,
                     echo_ev=ev, echo_psn=1234, sflags=H.S_TRIM, port_state=0x0F), "h0"),
        enc(rev, Pkt(op=H.OP_NACK, qp=4, ev=rev_ev, cum_psn=77, base_psn=77, echo_ev=ev, echo_psn=80,
                     sflags=H.S_SEQ), "h0"),
        enc(rev, Pkt(op=H.OP_ACK, qp=4, ev=rev_ev, cum_psn=78, base_psn=78, echo_ev=ev, echo_psn=77), "h0"),
        enc(fwd, Pkt(op=H.OP_PROBE, qp=0, ev=ev, probe_id=41, is_reply=0, port_state=0x0F, t_send_ns=1 << 62), "h2"),
        enc(rev, Pkt(op=H.OP_PROBE, qp=0, ev=rev_ev, echo_ev=ev, probe_id=41, is_reply=1, port_state=0x07,
                     t_send_ns=1 << 62), "h0"),
        enc(rev, Pkt(op=H.OP_CNP, qp=4, ev=rev_ev), "h0"),
    ]
    return frames


@needs_tshark
def test_dissector_agrees_with_the_decoder_on_frames_of_every_kind(tmp_path):
    frames = built_frames()
    pcap = tmp_path / "built.pcap"
    wrpcap(str(pcap), [Ether(f) for f in frames])
    names, n_mrc, ws = check_capture(pcap)
    assert n_mrc == len(frames)  # the decoder takes every one of them, the dissector agrees
    assert names == {"MRC Write", "MRC Write-with-Immediate", "SACK", "NACK", "ACK", "Probe request",
                     "Probe reply", "CNP"}
    assert check_scapy_sample(pcap, ws, every=1) == len(frames)
    # the trimmed frames: DSCP 0x2A and the BTH TRIM flag, no ICRC, no immediate (cut after RETH)
    for n in (6, 7):
        assert "[TRIMMED]" in ws[n]["_ws.col.Info"][0] and "mrc.icrc" not in ws[n] and "mrc.imm" not in ws[n]
    assert _int(ws[5], "mrc.ecn") == 3 and _int(ws[1], "mrc.ecn") == 2  # CE-marked copy; data is ECT(0)
    assert _int(ws[2], "mrc.flags.retx") == 1 and "[RETX]" in ws[2]["_ws.col.Info"][0]
    assert _int(ws[8], "mrc.sack.ecn") == 1
    # the ICRC as the project computes it, and the EV's parts
    assert _int(ws[1], "mrc.icrc") == int.from_bytes(frames[0][-4:], "big")
    plane = (PLAN.paths("h0", "h2")[3].ev >> 12) & 0xF
    assert (_int(ws[1], "mrc.ev.entropy"), _int(ws[1], "mrc.ev.plane")) == (0xBEEF, plane)


@needs_tshark
def test_damaged_frames_are_flagged_bad_icrc_as_a_warning_and_truncation_as_an_error(tmp_path):
    """The checks above would catch a broken dissector: a flipped payload bit is a Warn-level bad
    ICRC (and the decoder drops it); a body cut short is an Error and malformed."""
    good = built_frames()
    flipped = bytearray(good[0])
    flipped[H.DATA_HDR + 10] ^= 0x40
    short_sack = _set_lengths(bytearray(good[7][:-12]))  # 24 of the SACK's 36 bytes + 4 "ICRC"
    trimmed_bad = bytearray(good[5])
    trimmed_bad += b"\0\0"  # a trimmed frame longer than its headers
    pcap = tmp_path / "damaged.pcap"
    wrpcap(str(pcap), [Ether(bytes(flipped)), Ether(short_sack), Ether(_set_lengths(trimmed_bad))])
    ws = dissect(pcap)
    assert decode(bytes(flipped)) is None
    sev1 = [int(s, 0) for s in ws[1]["_ws.expert.severity"]]
    assert _int(ws[1], "mrc.icrc.status") == ICRC_BAD and PI_WARN in sev1 and max(sev1) < PI_ERROR
    assert "_ws.malformed" not in ws[1] and "[BAD ICRC]" in ws[1]["_ws.col.Info"][0]
    for n in (2, 3):
        assert "_ws.malformed" in ws[n] and PI_ERROR in [int(s, 0) for s in ws[n]["_ws.expert.severity"]], ws[n]
        assert "MALFORMED" in ws[n]["_ws.col.Info"][0]


@needs_tshark
def test_without_the_preference_the_zero_udp_checksum_is_wiresharks_error(tmp_path):
    """Why TSHARK_ARGS carries udp.ignore_ipv6_zero_checksum: without it Wireshark's UDP dissector
    flags every mrclab frame, whatever dissects the payload."""
    pcap = tmp_path / "one.pcap"
    wrpcap(str(pcap), [Ether(built_frames()[7])])
    r = subprocess.run([TSHARK, "-n", "-X", f"lua_script:{LUA}", "-r", str(pcap), "-T", "fields",
                        "-e", "_ws.expert.severity", "-e", "_ws.expert.message", "-e", "mrc.opcode"],
                       check=False, capture_output=True, text=True, timeout=60)
    sev, msg, op = r.stdout.strip().split("\t")
    assert int(sev, 0) == PI_ERROR and msg == "Illegal checksum value (0)" and op == "0xdc"


# ---- a capture on the linux fabric ---------------------------------------------------------------------
def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _transfer(fab, tmp: Path, transport: str, qp, timeout: float = 60.0) -> None:
    """h0 sends ``qp`` to h2 with endpoint processes in the namespaces; returns when h0 is done."""
    from mrclab.traffic import contract as C
    from mrclab.traffic.settings import TransportSettings

    tmp.mkdir()
    topo = tmp / "fabric.yaml"
    topo.write_text(yaml.safe_dump(fab.spec.to_dict()))
    st = TransportSettings(region_bytes=max(qp.message_bytes + 4096, 1 << 20))
    procs = {}
    try:
        for host, qps in (("h2", ()), ("h0", (qp,))):
            cfg = C.EndpointConfig(topo=str(topo), host=host, seed=5, transport=transport, settings=st, qps=qps,
                                   telemetry_path=str(tmp / f"{host}.jsonl"), telemetry_interval_s=0.1)
            (tmp / f"{host}.json").write_text(cfg.to_json())
            with open(tmp / f"{host}.err", "w") as err:  # the child keeps its own descriptor
                procs[host] = fab.emu.popen(host, [sys.executable, "-m", "mrclab.traffic.endpoint", "--config",
                                                   str(tmp / f"{host}.json")], stdout=subprocess.DEVNULL, stderr=err)
            if host == "h2":  # the receiver's sockets must be open before the first packet
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and '"start"' not in _read(tmp / "h2.jsonl"):
                    time.sleep(0.05)
        rc = procs["h0"].wait(timeout=timeout)
        assert rc == 0, _read(tmp / "h0.err")[-2000:]
        time.sleep(0.3)  # the last SACKs and probes
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


@pytest.mark.root
@needs_tshark
def test_a_capture_of_mrc_and_roce_transfers_dissects_as_the_decoder_reads_it(tmp_path, no_leftovers):
    from mrclab.controller.fabric import Fabric
    from mrclab.traffic import contract as C

    if shutil.which("tcpdump") is None:
        pytest.skip("needs tcpdump")
    from mrclab.experiments.run.captures import Captures

    with Fabric(load_spec(), "linux") as fab:
        ports = [f"h2-eth{p}" for p in range(fab.spec.planes)]
        # every host port of h2 (each plane carries its share), captured as `mrclab run --pcap` does
        with Captures(fab, ["h2"], tmp_path):
            # MRC: two 2 MiB Write-with-Immediate messages (data, SACKs, probes); RoCE: 1 MiB (ACKs)
            _transfer(fab, tmp_path / "mrc", "mrc", C.QpConfig(qp=1, peer="h2", message_bytes=2 << 20, count=2,
                                                                op="write_imm"))
            _transfer(fab, tmp_path / "roce", "roce", C.QpConfig(qp=2, peer="h2", message_bytes=1 << 20, count=1))
        for intf in ports:  # tcpdump's own count: nothing it saw was lost on the way to the file
            log = (tmp_path / f"{intf}.log").read_text()
            assert re.search(r"^0 packets dropped by kernel", log, re.M), log
            got = int(re.search(r"(\d+) packets captured", log).group(1))
            seen = int(re.search(r"(\d+) packets received by filter", log).group(1))
            assert got == seen, log

    names, n_mrc = set(), 0
    for intf in ports:
        pcap = tmp_path / f"{intf}.pcap"
        got, n, ws = check_capture(pcap)
        names |= got
        n_mrc += n
        assert check_scapy_sample(pcap, ws) > 0
    assert n_mrc > 2000  # 4 MiB of 1 KiB packets, their SACKs, the RoCE run
    # what the run sent, by name: data with immediates, MRC's SACKs, probes both ways, RoCE's ACKs
    assert {"MRC Write-with-Immediate", "SACK", "ACK", "Probe request", "Probe reply"} <= names, names
