"""A run's settings are resolved once, before anything starts (experiments/run/settings.py): the
fabric the data plane runs, the NIC rate the transports learn, the queue plan, the timer floor and
the timers raised to it, all frozen and written to the results folder. No root needed."""
import dataclasses
import json

from mrclab.controller.dataplanes import Linux
from mrclab.experiments.model.scenario import load_scenario
from mrclab.experiments.run.settings import resolve


class QueuingLinux(Linux):
    """The linux data plane as a machine with clang and libbpf has it: its switches queue."""

    def _missing_here(self):
        return {}


class QueuingHereOnly(QueuingLinux):
    """A data plane whose switches queue here but not over servers (bmv2's before its Thrift was relayed)."""

    remote_missing = {"congestion": "not over servers"}


def test_the_timer_floor_covers_the_queues_and_every_change_is_said_and_written(tmp_path):
    said = []
    scn = load_scenario("incast")
    assert "min_rto_s" not in (scn.raw.get("transport") or {})
    run = resolve(scn, QueuingLinux(), say=said.append)
    assert run.queues and run.queue_bound_s > 0
    assert run.settings.min_rto_s == max(scn.settings.min_rto_s, round(2 * run.queue_bound_s, 4))
    assert run.settings.port_mbps == run.spec.link.bandwidth_mbps > 0
    assert set(run.changes) <= set(said) and any("timer floor" in c for c in run.changes) == \
        (2 * run.queue_bound_s > scn.settings.min_rto_s)
    run.write(tmp_path)
    got = json.loads((tmp_path / "settings.json").read_text())
    assert got["transport"]["min_rto_s"] == run.settings.min_rto_s and got["dataplane"] == "linux"
    assert got["switch_ports_queued"] == len(run.queues) and got["changes"] == list(run.changes)
    # frozen: nothing replaces them once resolved
    try:
        run.queue_bound_s = 0.0  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("RunSettings is not frozen")


def test_a_scenario_that_sets_its_timer_floor_keeps_it_and_no_queues_means_no_floor_raised():
    scn = load_scenario("incast")
    mine = dataclasses.replace(scn, raw={**scn.raw,
                                         "transport": {**(scn.raw.get("transport") or {}), "min_rto_s": 0.02}},
                               settings=dataclasses.replace(scn.settings, min_rto_s=0.02))
    assert resolve(mine, QueuingLinux(), say=lambda m: None).settings.min_rto_s == 0.02
    over_servers = resolve(scn, QueuingHereOnly(), remote=True, say=lambda m: None)  # no switch queues there
    assert over_servers.queues == {} and over_servers.queue_bound_s == 0
    assert over_servers.settings.min_rto_s == scn.settings.min_rto_s
    # linux's switches queue on their servers as here: the same plan, the same bound
    here, there = (resolve(scn, QueuingLinux(), remote=r, say=lambda m: None) for r in (False, True))
    assert there.queues == here.queues != {} and there.queue_bound_s == here.queue_bound_s > 0
