"""`mrclab run` on the linux data plane: the quickstart (compressed to 12 s) meets its
expectations and writes its results; an exception mid-run leaves nothing of mrclab behind."""

import csv
import json
from pathlib import Path

import pytest
import yaml
from mrclab.experiments.model.scenario import SCENARIO_DIR, load_scenario
from mrclab.experiments.run import endpoints, runner

pytestmark = pytest.mark.root


def test_quickstart_runs_meets_its_expectations_and_writes_its_results(tmp_path, no_leftovers, decided_run):
    scn = load_scenario(None, duration_s=12, dataplane="linux")
    m, _, tmp_path = decided_run(scn, tmp_path)
    for f in ("scenario.yaml", "fabric.yaml", "metrics.json", "timeseries.csv", "events.csv", "goodput.png",
              "ev_state.png"):
        assert (tmp_path / f).stat().st_size > 0, f
    assert json.loads((tmp_path / "metrics.json").read_text())["passed"] == m["passed"]
    failed = [v for v in m["expectations"] if v["passed"] is False]
    assert not failed, failed
    assert m["baseline_mbps"] > 5
    rows = list(csv.DictReader(open(tmp_path / "timeseries.csv")))
    assert len(rows) == 120 and float(rows[30]["goodput_mbps"]) > 0
    events = list(csv.DictReader(open(tmp_path / "events.csv")))
    faults = [e for e in events if e["kind"] == "fault"]
    assert [e["event"] for e in faults] == ["switch_down", "switch_up"]
    assert abs(float(faults[0]["t"]) - 4.0) < 0.5  # played on time (8 s of 24, compressed to 12)
    assert any(e["kind"] == "ev_state" and e["new"] == "ASSUMED_BAD" for e in events)
    assert (tmp_path / "endpoints" / "h0.telemetry.jsonl").exists()


def test_exception_mid_run_tears_everything_down(tmp_path, monkeypatch, no_leftovers):
    def boom(*a, **kw):
        raise RuntimeError("injected failure at the first fault")

    monkeypatch.setattr(runner, "play", boom)
    scn = load_scenario(None, duration_s=8, dataplane="linux")
    with pytest.raises(RuntimeError, match="injected failure"):
        runner.run(scn, tmp_path, live=False)
    # no_leftovers checks namespaces, run state and processes


def test_hosts_served_by_one_endpoint_process_each_use_their_own_sockets_and_ports(tmp_path, monkeypatch,
                                                                                  no_leftovers, decided_run):
    # one process serves both hosts, started in h2's namespace: h0's sockets are opened, and its
    # ports read, from inside h0's. Its ports go down one by one: goodput follows them and no EV is
    # retired only if each is announced from h0's own port state (the scenario's expectations)
    monkeypatch.setattr(endpoints, "process_groups",
                        lambda hosts, cores=None, per_core=None: [sorted(hosts, reverse=True)])
    scn = load_scenario("nic-links-one-by-one", duration_s=14, dataplane="linux")
    m, _, out = decided_run(scn, tmp_path)
    failed = [v for v in m["expectations"] if v["passed"] is False]
    assert not failed, failed
    folder = out / "endpoints"
    assert (folder / "h0.log").is_symlink() and (folder / "h0.log").resolve() == (folder / "h2.log").resolve()
    sent = json.loads((folder / "h0.telemetry.jsonl").read_text().splitlines()[-1])
    got = json.loads((folder / "h2.telemetry.jsonl").read_text().splitlines()[-1])
    assert sent["type"] == got["type"] == "summary"
    assert sent["tx"] and got["rx"]  # h0 sent, h2 received: each host its own stack and telemetry


def test_the_path_delay_adds_twice_itself_to_the_rtt_and_loses_nothing(tmp_path, no_leftovers, decided_run):
    # the receiving host holds each frame path_delay_ms before its transport sees it: data one way,
    # SACKs the other, so the smoothed RTT gains twice the delay; without the delay line (or with it
    # applied once, or to one direction only) the difference is 0 or 20 ms
    raw = yaml.safe_load((SCENARIO_DIR / "quickstart.yaml").read_text())
    raw.update(faults=[], fabric_bmv2=None, duration_s=4, expect=[{"metric": "messages_intact"}], expect_roce=None,
               demonstrates={})
    rtt = {}
    for delay in (0, 20):
        raw["fabric"] = {"topo": "lab", "link": {"bandwidth_mbps": 8, "queue_packets": 16, "path_delay_ms": delay}}
        raw["name"] = f"delay-{delay}"
        (tmp_path / f"{delay}.yaml").write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
        m, _, _ = decided_run(load_scenario(tmp_path / f"{delay}.yaml", dataplane="linux"), tmp_path / str(delay))
        assert m["passed"], m["expectations"]
        assert m["regime"]["path_delay_ms"] == delay
        rtt[delay] = m["rtt_us"] / 1000
    assert 36 <= rtt[20] - rtt[0] <= 50, rtt


def test_a_fast_fabric_s_shapers_send_no_burst_its_switches_trim(tmp_path, no_leftovers, decided_run, monkeypatch):
    # a shaper whose burst grew with the rate (the kernel's 4 ms of it: 8 KB at 16 Mb/s) sent 7
    # frames back to back into the next hop, over its trim threshold (4 packets): trims and half
    # the goodput. Two frames (emulation.kernel.SHAPER_BURST_BYTES) trim nothing; the same run with
    # the kernel's burst trims more than 1% (2026-12-03: 0 of 33,352 against 833 of 17,009, goodput
    # 54.5 against 27.8 Mb/s). One flow over the 4 planes at 16 Mb/s: the quickstart's two at 32
    # Mb/s (27,000 packets a second through Python endpoints) starved a 2-core machine's endpoints
    # past the limit in three runs of three (CI, 2026-11-28 and -29), and one at 32 Mb/s met 1-2 ms
    # of jitter in the kernel's softirq batches between hops on this workplace's VMs, frames
    # arriving at the next hop four at a time (98-2,604 trims of 25,000-62,000, its NIC ports
    # losing 0.9% of their rate while backlogged); a burst is each NIC port's shaper's, whatever
    # the number of flows and the rate. A burst builds while its port idles: since the sender times
    # packets from their NIC port's departure stamp, NSCC's window keeps the ports busy and the
    # kernel's burst trims 0.2-2.5% (8 runs, 2026-12-07; 46-53 Mb/s; CI read 2.8% and 46.8 Mb/s),
    # too close to the bound to decide. On the sender's port model (nic_stamps off) the window
    # leaves the ports idle between windows, and the same pair reads 4.6-4.9% trimmed (5 runs, 28-31
    # Mb/s) against none: the comparison runs there, the default run must trim nothing too
    raw = yaml.safe_load((SCENARIO_DIR / "quickstart.yaml").read_text())
    raw.update(name="fast", faults=[], fabric_bmv2=None, duration_s=5, expect_roce=None, demonstrates={},
               fabric={"topo": "lab", "link": {"bandwidth_mbps": 16, "queue_packets": 16, "path_delay_ms": 5}},
               workload=[{"src": "h0", "dst": "h2", "qps": 1, "message_bytes": 262144}],
               expect=[{"metric": "goodput_ratio", "window": [2, 5], "baseline": [1, 2], "min": 0.9},
                       {"metric": "messages_intact"}])
    (tmp_path / "fast.yaml").write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))

    raw["transport"] = {**raw["transport"], "nic_stamps": False}
    (tmp_path / "idling.yaml").write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))

    def run(out: Path, name: str = "fast") -> tuple[dict, float, float]:
        """(metrics, trimmed share of the data packets, goodput in Mb/s)."""
        m, _, _ = decided_run(load_scenario(tmp_path / f"{name}.yaml", dataplane="linux"), out)
        sent = sum(t.get("data_packets", 0) for t in m["totals"].values())
        goodput = sum(t["bytes_delivered"] for t in m["totals"].values()) * 8 / 5 / 1e6
        return m, m["switch_ports"]["trimmed"] / sent, goodput

    m, share, goodput = run(tmp_path / "run")
    assert m["passed"], m["expectations"]
    assert share <= 0.001, (m["switch_ports"], share)
    assert goodput > 0.6 * 4 * 16, goodput  # one flow, 4 ports of 16 Mb/s each: most of it delivered
    _, idling, _ = run(tmp_path / "idling", "idling")
    assert idling <= 0.001, idling
    # the mechanism off: every shaper with the kernel's burst, 4 ms of its rate (tc-tbf(8))
    from mrclab.emulation import kernel

    monkeypatch.setattr(kernel, "shaper_burst_bytes", lambda frame_bytes=0: 8000)
    _, bursty, _ = run(tmp_path / "bursty", "idling")
    assert bursty > 0.01, bursty


def test_frames_of_the_papers_4_kib_payload_cross_shaped_links(tmp_path, no_leftovers, decided_run):
    # a shaper drops a frame larger than its burst (tc-tbf(8)): with a fixed 3,000-byte burst a run
    # of 4 KiB payloads (4,250-byte frames, the paper's size) delivered not one message over shaped
    # host ports. The burst and the queues now hold two of the run's largest frames
    raw = yaml.safe_load((SCENARIO_DIR / "quickstart.yaml").read_text())
    raw.update(name="jumbo", faults=[], fabric_bmv2=None, duration_s=4, expect_roce=None, demonstrates={},
               transport={"kind": "mrc", "payload_bytes": 4096},
               fabric={"topo": "lab", "link": {"bandwidth_mbps": 8, "queue_packets": 16}},
               expect=[{"metric": "messages_intact"}])
    (tmp_path / "jumbo.yaml").write_text(yaml.safe_dump({k: v for k, v in raw.items() if v is not None}))
    m, _, _ = decided_run(load_scenario(tmp_path / "jumbo.yaml", dataplane="linux"), tmp_path / "run")
    assert m["passed"], m["expectations"]
    goodput = sum(t["bytes_delivered"] for t in m["totals"].values()) * 8 / 4 / 1e6
    assert goodput > 0.5 * 2 * 4 * 8, goodput  # two flows over 4 ports of 8 Mb/s: most of it delivered
