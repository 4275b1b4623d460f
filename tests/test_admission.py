"""Admission before start: a run this machine's calibration says it cannot carry is refused with
the numbers (exit 3), or fitted by scaling every link rate; no calibration, no check (said)."""

import dataclasses

import pytest
from mrclab.experiments.model.scenario import load_scenario
from mrclab.experiments.run import admission
from mrclab.topologies.spec import load_spec


def _cal(**kw):
    base = dict(machine=admission.machine_key(), dataplane="linux", build="", cores=2, endpoint_start_cpu_s=0.6,
                endpoint_idle_cores=0.04, endpoint_tx_us=10.0, endpoint_rx_us=9.0, switch_us_per_hop=26.0,
                switch_idle_cores=0.0, when="2026-11-24 02:10")
    return admission.Calibration(**{**base, **kw})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(admission, "CACHE", tmp_path / "calibration.json")
    monkeypatch.setattr(admission.os, "cpu_count", lambda: 2)
    return tmp_path / "calibration.json"


def test_the_estimate_adds_idle_and_per_packet_costs():
    scn = load_scenario("quickstart", dataplane="linux")
    spec = scn.spec_for("linux")
    est = admission.estimate(scn, spec, _cal())
    frame = scn.settings.payload_bytes + 154
    pps = 2 * spec.planes * spec.link.bandwidth_mbps * 1e6 / 8 / frame  # two senders, every port full
    assert est.pps == pytest.approx(pps)
    assert est.cores == pytest.approx(4 * 0.04 + pps * (10 + 9 + 3 * 26) / 1e6)


def test_a_run_that_fits_runs_unchanged_and_says_the_numbers(cache):
    admission.save_calibration(_cal())
    said = []
    scn = load_scenario("quickstart", dataplane="linux")
    assert admission.admit(scn, "linux", say=said.append) is scn
    assert said and "needs about" in said[0] and "1.60 of 2" in said[0]


def test_too_big_is_refused_with_the_numbers_or_fitted(cache):
    admission.save_calibration(_cal(switch_us_per_hop=400.0))
    scn = load_scenario("quickstart", dataplane="linux")
    with pytest.raises(admission.CannotCarry, match=r"cannot carry quickstart on linux: it needs about .* --fit") as e:
        admission.admit(scn, "linux")
    assert e.value.exit_code == 3
    fitted = admission.admit(scn, "linux", fit=True, say=lambda _m: None)
    est = admission.estimate(fitted, fitted.spec_for("linux"), admission.load_calibration("linux"))
    assert est.fits and est.cores == pytest.approx(est.available_cores, rel=0.01)
    assert fitted.spec.link.bandwidth_mbps < scn.spec.link.bandwidth_mbps


def test_idle_cost_alone_too_high_cannot_be_fitted(cache):
    admission.save_calibration(_cal(endpoint_idle_cores=1.0))
    with pytest.raises(admission.CannotCarry, match="even idle"):
        admission.admit(load_scenario("quickstart", dataplane="linux"), "linux", fit=True)


def test_no_calibration_no_check_and_it_says_so(cache):
    said = []
    scn = load_scenario("quickstart", dataplane="linux")
    assert admission.admit(scn, "linux", say=said.append) is scn
    assert "no calibration" in said[0] and "mrclab calibrate" in said[0]


def test_a_calibration_of_another_machine_or_build_does_not_count(cache):
    admission.save_calibration(_cal(machine="elsewhere"))
    assert admission.load_calibration("linux") is None
    admission.save_calibration(_cal())
    admission.save_calibration(dataclasses.replace(_cal(), endpoint_tx_us=11.0))  # replaces, not appends
    assert admission.load_calibration("linux").endpoint_tx_us == 11.0
    assert len(__import__("json").loads(cache.read_text())) == 2


def test_scaled_keeps_unshaped_links_unshaped():
    spec = load_spec()
    s = admission.scaled(dataclasses.replace(spec, link=dataclasses.replace(spec.link, bandwidth_mbps=8.0,
                                                                            t0_t1_bandwidth_mbps=0.0)), 0.5)
    assert (s.link.bandwidth_mbps, s.link.t0_t1_bandwidth_mbps) == (4.0, 0.0)


def test_machine_rates_fill_half_the_room_idling_leaves_up_or_down_and_keep_the_path_delay(cache):
    scn = load_scenario("quickstart", dataplane="linux")
    for per_hop, up in ((5.0, True), (400.0, False)):  # a fast machine raises the rates, a slow one lowers them
        admission.save_calibration(_cal(switch_us_per_hop=per_hop))
        said = []
        got = admission.admit(scn, "linux", rates="machine", say=said.append)
        est = admission.estimate(got, got.spec_for("linux"), admission.load_calibration("linux"))
        room = est.available_cores - est.fixed_cores
        assert est.traffic_cores == pytest.approx(admission.MACHINE_SHARE * room, rel=0.01)
        assert (got.spec.link.bandwidth_mbps > scn.spec.link.bandwidth_mbps) is up
        assert got.spec.link.t0_t1_bandwidth_mbps == scn.spec.link.t0_t1_bandwidth_mbps == 0  # unshaped: the same
        assert got.spec.link.path_delay_ms == scn.spec.link.path_delay_ms == 5
        assert "--rates machine scales every link rate by" in said[0]
    admission.save_calibration(_cal(endpoint_idle_cores=1.0))
    with pytest.raises(admission.CannotCarry, match="at any rate"):
        admission.admit(scn, "linux", rates="machine")


def test_machine_rates_without_a_calibration_are_refused_in_one_line(cache):
    with pytest.raises(admission.NotAvailable, match="needs this machine's calibration of linux: run mrclab calibrate"):
        admission.admit(load_scenario("quickstart", dataplane="linux"), "linux", rates="machine")
