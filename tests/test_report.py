"""`mrclab report` reads results folders back, compares them and refuses what is not one."""

import json
import types

import pytest
from mrclab.experiments.analysis.report import ReportError, load_result, main


def make_result(folder, transport, mbps):
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps({
        "scenario": "quickstart", "transport": transport, "dataplane": "linux", "duration_s": 2.0,
        "baseline_mbps": mbps, "faults": [{"t": 1.0, "label": "switch_down t1-0-0"}],
        "expectations": [{"metric": "goodput_ratio", "value": 0.9, "passed": True}],
        "totals": {"q": {"data_packets": 100, "retransmits": 5}}, "passed": True}))
    rows = "t_s,goodput_mbps\n" + "".join(f"{i / 10:.1f},{mbps}\n" for i in range(20))
    (folder / "timeseries.csv").write_text(rows)


def test_load_result_rebuilds_the_goodput_series(tmp_path):
    make_result(tmp_path / "a", "mrc", 40.0)
    m, d, faults = load_result(tmp_path / "a")
    g = d.goodput_mbps()
    assert len(g) == 20 and all(abs(x - 40.0) < 0.01 for x in g[:-1])
    assert faults == [{"t": 1.0, "label": "switch_down t1-0-0"}]


def test_report_compares_and_plots(tmp_path, capsys):
    make_result(tmp_path / "mrc", "mrc", 40.0)
    make_result(tmp_path / "roce", "roce", 10.0)
    args = types.SimpleNamespace(results=[str(tmp_path / "mrc"), str(tmp_path / "roce")], out=str(tmp_path / "cmp"))
    assert main(args) == 0
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    text = capsys.readouterr().out
    assert "40.0" in text and "10.0" in text and "5.00%" in text


def test_report_refuses_a_folder_that_is_not_a_result(tmp_path):
    with pytest.raises(ReportError, match="not a results folder"):
        load_result(tmp_path)
    from mrclab.cli.main import main as mrclab

    assert mrclab(["report", str(tmp_path)]) == 2  # one line through the command line's error boundary


# ---- --frames HOST: what a host's NIC ports carried, from a run's captures -------------------------

def _trimmed(frame: bytes) -> bytes:
    """``frame`` as a switch trims it: cut to its headers, the trim DSCP in the outer traffic
    class, the UDP length rewritten (p4src/mrclab.p4, the linux data plane's eBPF program)."""
    import struct

    from mrclab.protocol import headers as H
    f = bytearray(frame[:H.TRIM_BYTES])
    first = struct.unpack_from("!I", f, H.OFF_OUTER)[0]
    struct.pack_into("!I", f, H.OFF_OUTER, (first & ~(0x3F << 22)) | (H.TRIM_DSCP << 22))
    struct.pack_into("!H", f, H.OFF_UDP + 4, H.TRIM_BYTES - H.OFF_UDP)
    return bytes(f)


def _captured_run(folder, frames):
    """A results folder whose h0 captures hold ``frames``: (time s, port, bytes)."""
    import yaml
    from mrclab.topologies.spec import load_spec
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    (folder / "pcap").mkdir(parents=True)
    (folder / "fabric.yaml").write_text(yaml.safe_dump(load_spec().to_dict()))
    for port in sorted({p for _, p, _ in frames}):
        pkts = []
        for t, p, f in frames:
            if p == port:
                e = Ether(f)
                e.time = t
                pkts.append(e)
        wrpcap(str(folder / "pcap" / f"h0-eth{port}.pcap"), pkts)


def test_frames_counts_a_host_s_frames_by_kind_and_times_its_answers(tmp_path, capsys):
    from mrclab.experiments.analysis.frames import host_frames
    from mrclab.protocol import headers as H
    from mrclab.topologies.addressing import AddressPlan, make_ev
    from mrclab.topologies.spec import load_spec
    from mrclab.traffic.packet import Pkt
    from mrclab.traffic.wire import Wire

    plan = AddressPlan(load_spec())
    h2, h0 = Wire(plan, "h2"), Wire(plan, "h0")
    ev = make_ev(0, 1, 7)

    def data(psn, flags=0):
        return h2.encode(Pkt(op=H.OP_WRITE, qp=3, psn=psn, ev=ev, flags=flags, msg_len=1024, dma_len=1024,
                             payload=bytes(1024)), "h0")[1]

    def answer(op, psn):
        return h0.encode(Pkt(op=op, qp=3, ev=ev, echo_ev=ev, echo_psn=psn), "h2")[1]

    t0 = 1000.0
    frames = [(t0 + 0.10, 0, data(1)), (t0 + 0.11, 0, _trimmed(data(2))),  # one whole, one trimmed
              (t0 + 0.114, 0, answer(H.OP_NACK, 2)),  # 4 ms after its trimmed arrival
              (t0 + 0.12, 0, answer(H.OP_SACK, 1)),  # 20 ms after its arrival
              (t0 + 0.13, 0, answer(H.OP_SACK, 1)),  # a repeat: answers nothing new
              (t0 + 0.20, 0, data(2, H.F_RETX)), (t0 + 0.25, 0, answer(H.OP_SACK, 2)),  # the resend, 50 ms
              (t0 + 1.5, 0, answer(H.OP_SACK, 9)), (t0 + 2.5, 0, answer(H.OP_SACK, 9)),  # seconds 1..2 of port 0
              (t0 + 3.1, 0, data(10))]
    _captured_run(tmp_path / "run", frames)
    r = host_frames(tmp_path / "run", "h0")
    assert r.frames[("in", "data")] == 2 and r.frames[("in", "data, trimmed")] == 1
    assert r.frames[("in", "data, resent")] == 1
    assert r.frames[("out", "SACK")] == 5 and r.frames[("out", "NACK")] == 1
    assert r.bytes[("in", "data, trimmed")] == H.TRIM_BYTES
    assert [round(x, 4) for x in r.nack_lag_s] == [0.004]
    assert [round(x, 4) for x in r.sack_lag_s] == [0.02, 0.05]  # the repeat and the unanswered PSN 9 add none
    sack = len(answer(H.OP_SACK, 1))
    # whole seconds only (the first and last are cut by the capture): t0+1 and t0+2 carry one SACK each
    assert r.busiest_mbps == {"h0-eth0": sack * 8 / 1e6}

    from mrclab.cli.main import main as cli
    assert cli(["report", str(tmp_path / "run"), "--frames", "h0"]) == 0
    text = capsys.readouterr().out
    assert "out: NACK" in text and "n=2:" in text and "n=1:" in text  # the SACK and NACK lag rows


def test_frames_refuses_a_host_or_folder_it_cannot_read_in_one_line(tmp_path, capsys):
    from mrclab.cli.main import main as cli

    _captured_run(tmp_path / "run", [])
    assert cli(["report", str(tmp_path / "run"), "--frames", "h77"]) == 2
    err = "".join(capsys.readouterr())
    assert "unknown host 'h77'" in err and "h0, h1" in err and "Traceback" not in err
    assert cli(["report", str(tmp_path / "run"), "--frames", "h1"]) == 2
    assert "no capture of h1's ports" in "".join(capsys.readouterr())
    assert cli(["report", str(tmp_path), "--frames", "h0"]) == 2
    assert "not a results folder" in "".join(capsys.readouterr())
