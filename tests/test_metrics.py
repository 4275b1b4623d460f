"""Run metrics on synthetic telemetry with known answers."""

import math

import pytest
from mrclab.experiments.analysis.expectations import evaluate
from mrclab.experiments.analysis.metrics import RunData, baseline_mbps, recovery_time_s


def run_with_rate(rate_mbps, duration=20.0, step=0.1):
    """One QP whose delivered bytes grow at rate_mbps(t)."""
    pts, b, t = [(0.0, 0)], 0.0, 0.0
    while t < duration - 1e-9:
        b += rate_mbps(t) * 1e6 / 8 * step
        t = round(t + step, 6)
        pts.append((t, int(b)))
    return RunData(duration_s=duration, samples={"h0->h2#1": pts}, qp_src={"h0->h2#1": "h0"}, first_fault_s=10.0)


def test_goodput_bins_reproduce_the_rate():
    d = run_with_rate(lambda t: 8.0)
    g = d.goodput_mbps()
    assert len(g) == 200
    assert all(abs(x - 8.0) < 0.01 for x in g[:-1])
    assert d.goodput_mbps("h1") == [0.0] * 200


def test_ratio_recovery_and_bounds():
    d = run_with_rate(lambda t: 8.0 if t < 10 or t >= 13 else 4.0)
    assert baseline_mbps(d) == pytest.approx(8.0, rel=0.01)
    v, ok, _ = evaluate(d, "goodput_ratio", {"window": [10.5, 12.5], "min": 0.4, "max": 0.6})
    assert v == pytest.approx(0.5, rel=0.02) and ok is True
    v, ok, _ = evaluate(d, "goodput_ratio", {"window": [10.5, 12.5], "min": 0.9})
    assert ok is False
    assert recovery_time_s(d, 10.0) == pytest.approx(3.0, abs=0.11)
    never = run_with_rate(lambda t: 8.0 if t < 10 else 1.0)
    assert math.isinf(recovery_time_s(never, 10.0))


def test_worst_qp_ratio_sees_a_stalled_qp_that_total_goodput_hides():
    """Two QPs share a link: from 10 s one stalls and the other takes its share. Total goodput
    holds (ratio 1.0); the worst QP's ratio is 0."""
    def pts(rate):
        out, b, t = [(0.0, 0)], 0.0, 0.0
        while t < 20 - 1e-9:
            b += rate(t) * 1e6 / 8 * 0.1
            t = round(t + 0.1, 6)
            out.append((t, int(b)))
        return out

    d = RunData(duration_s=20.0, samples={"h0->h2#1": pts(lambda t: 4.0 if t < 10 else 0.0),
                                          "h0->h2#2": pts(lambda t: 4.0 if t < 10 else 8.0)},
                qp_src={"h0->h2#1": "h0", "h0->h2#2": "h0"}, first_fault_s=10.0)
    assert evaluate(d, "goodput_ratio", {"window": [11, 19]})[0] == pytest.approx(1.0, rel=0.02)
    v, ok, _ = evaluate(d, "worst_qp_ratio", {"window": [11, 19], "max": 0.1})
    assert v == pytest.approx(0.0, abs=0.01) and ok is True
    uneven = RunData(duration_s=20.0, samples={"h0->h2#1": pts(lambda t: 2.0), "h0->h2#2": pts(lambda t: 6.0)},
                     qp_src={"h0->h2#1": "h0", "h0->h2#2": "h0"}, first_fault_s=10.0)
    v, ok, _ = evaluate(uneven, "worst_qp_ratio", {"window": [11, 19], "max": 0.1})
    assert v == pytest.approx(0.5, rel=0.02) and ok is False  # 2 of a mean of 4


def test_retire_metrics_and_intact():
    from mrclab.experiments.analysis.fabricstate import FabricTimeline
    from mrclab.experiments.model.faults import Fault
    from mrclab.topologies.addressing import AddressPlan
    from mrclab.topologies.spec import load_spec

    d = run_with_rate(lambda t: 8.0)
    d.rtt_us = 500.0
    # EV 0x1000 is plane 1, T1 0 from h0 to h2: through t1-1-0, which fails at 10 s
    d.timeline = FabricTimeline.from_played(AddressPlan(load_spec()), [(10.0, Fault(10.0, "switch_down",
                                                                                   {"switch": "t1-1-0"}))])
    d.events = [{"t": 10.002, "kind": "ev_state", "host": "h0", "peer": "h2", "qp": 1, "ev": 0x1000, "old": "GOOD",
                 "new": "ASSUMED_BAD"},
                {"t": 10.004, "kind": "ev_state", "host": "h0", "peer": "h2", "qp": 1, "ev": 0x1001, "old": "GOOD",
                 "new": "SKIP"}]
    v, ok, _ = evaluate(d, "evs_retired", {"after": 10.0, "within_s": 1.0, "min": 1})
    assert v == 1 and ok
    v, ok, _ = evaluate(d, "retire_time_rtts", {"after": 10.0, "max": 5})
    assert v == pytest.approx(4.0, rel=0.01) and ok
    d.totals = {"q": {"messages_delivered": 10, "messages_corrupt": 0, "data_packets": 100, "retransmits": 3}}
    assert evaluate(d, "messages_intact", {})[1] is True
    assert evaluate(d, "retransmit_fraction", {"max": 0.05}) == (0.03, True, "<= 0.05")
    d.totals["q"]["messages_corrupt"] = 1
    assert evaluate(d, "messages_intact", {})[1] is False
    d.totals = {}
    assert evaluate(d, "messages_intact", {})[1] is False  # nothing delivered is not "all intact"


def test_the_metric_registry_is_the_one_list_docs_help_and_dispatch_read():
    """Every claim a scenario may make has a value (the two tables name the same metrics, in the same
    order), evaluates on a run (no branch missing), names only known arguments, and docs/design.md's
    metric list is the claims' table, row for row."""
    import re
    from pathlib import Path

    from mrclab.experiments.analysis.expectations import VALUES, evaluate
    from mrclab.experiments.analysis.fabricstate import FabricTimeline
    from mrclab.experiments.analysis.metrics import RunData
    from mrclab.experiments.model.claims import ARGS, CLAIMS, metric_help, metric_table
    from mrclab.topologies.addressing import AddressPlan
    from mrclab.topologies.spec import load_spec

    d = RunData(duration_s=10.0, timeline=FabricTimeline(AddressPlan(load_spec(None))))
    assert list(VALUES) == list(CLAIMS)
    for name, m in CLAIMS.items():
        assert set(m.required) | set(m.optional) <= set(ARGS), name
        args = {"window": [1, 2], "after": 1, "percentile": 50, "counter": "marked", "host": "h0", "plane": 0}
        value, _passed, bound = evaluate(d, name, {k: v for k, v in args.items() if k in m.required})
        assert isinstance(value, float | int) and isinstance(bound, str), name
        assert name in metric_help()
    doc = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    table = re.search(r"<!-- metrics:begin -->\n(.*?)\n<!-- metrics:end -->", doc, re.S)
    assert table and table.group(1) == metric_table(), "docs/design.md's metric table is not the registry's"


def test_the_regime_says_bdp_thresholds_and_timer_floor_and_what_they_weaken():
    from mrclab.controller.queues import PortQueue
    from mrclab.experiments.analysis.regime import PAPER_BDP_PACKETS, regime
    from mrclab.topologies.spec import load_spec
    from mrclab.traffic.settings import TransportSettings

    spec = load_spec()
    spec = dataclasses_replace_link(spec, 8.0)
    q = {("t1-0-0", 1): PortQueue("t1-0-0", 1, "t0-0-0", 8.0, 849, 6000, 16, 64, 4, 8, 16),
         ("t0-0-0", 1): PortQueue("t0-0-0", 1, "h0", 8.0, 849, 6000, 16, 64, 0, 8, 16)}
    s = TransportSettings(min_rto_s=0.028)
    r = regime(spec, s, q, rtt_us=2000.0)  # 849 pps x 2 ms: 1.7 packets per path
    assert r["bdp_packets"] == pytest.approx(849.0 * 0.002, rel=0.01)
    assert r["ecn_k_bdp"] == pytest.approx(4 / r["bdp_packets"], rel=0.01) and r["rto_floor_rtts"] == 14.0
    assert r["evs_per_qp"] == spec.planes * s.evs_per_plane and 70 < PAPER_BDP_PACKETS < 76
    assert any("holds 1.7 packets" in w for w in r["weakens"]) and any("14 RTTs" in w for w in r["weakens"])
    fast = regime(spec, s, q, rtt_us=200_000.0)  # a long RTT: a deep path, thresholds a fraction of it
    assert not any("packets (paper" in w for w in fast["weakens"]) and fast["rto_floor_rtts"] < 1
    assert regime(spec, s, {}, None)["bdp_packets"] is None


def dataclasses_replace_link(spec, mbps):
    import dataclasses

    return dataclasses.replace(spec, link=dataclasses.replace(spec.link, bandwidth_mbps=mbps))


def test_longest_stall_sees_a_qp_stuck_behind_a_fault_and_not_one_that_goes_on():
    d = run_with_rate(lambda t: 0.0 if 10 <= t < 13 else 8.0)
    v, ok, _ = evaluate(d, "longest_stall_s", {"max": 0.5})
    assert v == pytest.approx(3.0, abs=0.11) and ok is False
    assert evaluate(d, "longest_stall_s", {"window": [0, 9.5]})[0] == 0.0
    goes_on = run_with_rate(lambda t: 4.0 if 10 <= t < 13 else 8.0)
    v, ok, _ = evaluate(goes_on, "longest_stall_s", {"max": 0.5})
    assert v == 0.0 and ok is True
    # a QP that has not started yet or has finished is not stalled
    late = run_with_rate(lambda t: 8.0 if 5 <= t < 15 else 0.0)
    assert evaluate(late, "longest_stall_s", {})[0] == 0.0


def test_rss_growth_is_the_worst_hosts_end_over_its_memory_at_after():
    d = run_with_rate(lambda t: 8.0)
    d.rss = [(1.0, "h0", 50), (5.0, "h0", 100), (19.0, "h0", 104), (5.0, "h2", 100), (19.0, "h2", 130)]
    v, ok, _ = evaluate(d, "rss_growth", {"after": 4, "max": 1.1})
    assert v == pytest.approx(1.3) and ok is False  # h2 grew by 30% after warming up
    d.rss = [r for r in d.rss if r[1] == "h0"]
    v, ok, _ = evaluate(d, "rss_growth", {"after": 4, "max": 1.1})
    assert v == pytest.approx(1.04) and ok is True
    assert evaluate(d, "rss_growth", {"after": 0, "max": 1.1})[1] is False  # from 50 before warm-up
    d.rss = []
    assert math.isinf(evaluate(d, "rss_growth", {"after": 4})[0])  # never sampled: cannot be flat


def test_the_runner_leaves_an_endpoints_receive_regions_out_of_its_memory(tmp_path):
    """An endpoint whose resident memory grew only by its receive regions' pages (registered memory,
    written as messages first land) reads flat; one whose own memory grew does not."""
    import json
    from types import SimpleNamespace

    from mrclab.experiments.run.endpoints import collect
    from mrclab.traffic import contract as C

    def telemetry(host, points):
        lines = []
        for t, rss, region in points:
            d = json.loads(C.encode(C.Sample((), (), 0, 0.0, rss, region)))
            d["t_wall"] = 1000.0 + t
            lines.append(json.dumps(d))
        (tmp_path / f"{host}.telemetry.jsonl").write_text("\n".join(lines) + "\n")

    mb = 1 << 20
    telemetry("h0", [(5.0, 30 * mb, 4 * mb), (60.0, 42 * mb, 16 * mb)])  # regions: +12 MiB, rest flat
    telemetry("h1", [(5.0, 30 * mb, 4 * mb), (60.0, 42 * mb, 4 * mb)])   # its own memory: +12 MiB
    d = collect(SimpleNamespace(duration_s=60.0, hosts=lambda: ["h0"]), tmp_path, 1000.0)
    assert evaluate(d, "rss_growth", {"after": 5, "max": 1.1})[:2] == (1.0, True)
    d = collect(SimpleNamespace(duration_s=60.0, hosts=lambda: ["h1"]), tmp_path, 1000.0)
    v, ok, _ = evaluate(d, "rss_growth", {"after": 5, "max": 1.1})
    assert v == pytest.approx(38 / 26) and ok is False


def test_frames_the_endpoints_sockets_dropped_are_counted_per_span_and_named_beside_retirements():
    """Each host reports its sockets' drops since the run began; a span's count is each host's
    growth over it, and a retirement count's evidence names the drops in the second before it."""
    from mrclab.experiments.analysis.metrics import describe_retirements

    d = run_with_rate(lambda t: 8.0)
    d.socket_drops = [(2.0, "h1", 5), (9.5, "h1", 5), (10.2, "h1", 45), (10.2, "h2", 7), (15.0, "h2", 9)]
    assert d.socket_drops_between() == 45 + 9
    assert d.socket_drops_between(10.0, 10.5) == 40 + 7
    assert d.socket_drops_between(11.0, 14.0) == 0
    retired = [{"t": 10.4, "host": "h0", "ev": 0, "reason": "untrimmed loss of PSN 7"}]
    assert describe_retirements(retired, d=d).endswith("; endpoint sockets dropped 47 frames (full receive "
                                                       "buffers, port errors at send) in the 1 s before")
    assert "sockets" not in describe_retirements([dict(retired[0], t=14.5)], d=d)
    assert "sockets" not in describe_retirements(retired)


def test_a_telemetry_sample_encodes_as_asdict_did():
    """The endpoint's encoder walks its records itself (dataclasses.asdict deep-copied every sample):
    the JSON is the same, and it decodes back to the same record."""
    import dataclasses
    import json

    from mrclab.traffic import contract as C
    from mrclab.traffic.evs import EvState
    from mrclab.traffic.stats import ReceiverStats, SenderStats

    tx = C.TxQp("h2", 3, SenderStats(data_packets=5, retransmits=1), 1234.5, {7: EvState.GOOD, 9: EvState.ASSUMED_BAD},
                9000.0, None, (0.1, 0.2), {7: 4, 9: 1})
    rx = C.RxQp.of("h0", 3, ReceiverStats())
    rec = C.Sample((tx,), (rx,), 15, 0.002, 1 << 20, 4096, 2, 1)
    got = json.loads(C.encode(rec))
    want = json.loads(json.dumps({"type": "sample", **dataclasses.asdict(rec)}))
    assert {k: v for k, v in got.items() if k not in ("v", "t_wall", "t_mono")} == want
    assert C.decode(C.encode(rec)).rec == rec
