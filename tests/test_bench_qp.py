"""``mrclab bench qp``: its scenarios are valid and its figures are the run's, headers counted."""

from mrclab.bench import qp
from mrclab.experiments.model.scenario import parse_scenario
from mrclab.protocol import headers as H


def test_every_row_is_a_valid_scenario_of_one_qp_across_the_t1s():
    for transport, planes, payload in qp.ROWS:
        scn = parse_scenario(qp.scenario(transport, planes, payload, "linux"), "test")
        assert scn.spec.planes == planes and scn.transport == transport
        assert [(f.src, f.dst, f.qps) for f in scn.flows] == [("h0", "h1", 1)]
        assert scn.spec.link.bandwidth_mbps == qp.PORT_MBPS


def test_a_row_reads_goodput_over_the_ports_and_the_wire_share_with_headers_and_retransmissions(monkeypatch, tmp_path):
    metrics = {"expectations": [{"value": 0.8 * 4 * qp.PORT_MBPS}, {"value": 0.01}],
               "switch_ports": {"marked": 3, "trimmed": 1}, "fidelity_faults": []}
    monkeypatch.setattr(qp, "run_scenario", lambda scn, out: (metrics, None))
    r = qp.row("mrc", 4, 1024, "linux", tmp_path)
    frame = 1024 + H.DATA_OVERHEAD
    assert abs(r["ports"] - 0.8) < 1e-9 and abs(r["ceiling"] - 1024 / frame) < 1e-9
    assert abs(r["wire"] - 0.8 * frame / 1024 * 1.01) < 1e-9
    assert r["faithful"] and (r["marked"], r["trimmed"]) == (3, 1)
    metrics["fidelity_faults"] = [{"invariant": "CPU starvation"}]
    assert qp.row("mrc", 4, 1024, "linux", tmp_path)["why"] == "CPU starvation"
