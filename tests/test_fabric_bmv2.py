"""The default fabric on bmv2 (simple_switch_grpc + p4src/mrclab.p4 over P4Runtime), and its
equivalence with the linux data plane."""

import time

import pytest
from mrclab.controller.fabric import Fabric
from mrclab.controller.pathprobe import implicate, probe_paths
from mrclab.topologies.spec import load_spec

pytestmark = pytest.mark.bmv2


@pytest.fixture(scope="module")
def fabric():
    with Fabric(load_spec(), "bmv2") as fab:
        yield fab


def matrix(results):
    return {(r.path.src, r.path.dst, r.path.plane, r.path.t1, r.path.hops): r.delivered for r in results}


def test_every_path_delivers_through_the_switches_its_address_names(fabric):
    results = probe_paths(fabric.plan, fabric.netns, count_packets=fabric.switch_packets)
    assert all(r.delivered for r in results), [r.problem for r in results if not r.delivered][:5]
    for r in results:
        assert r.evidence == {sw: r.path.hops.count(sw) for sw in r.path.hops}, (r.path, r.evidence)


def test_read_back_equals_route_plan(fabric):
    from mrclab.controller.p4runtime import desired_entries

    for e in fabric.routes.switches:
        have = fabric.p4[e.switch].read_entries(["my_sid", "routing"])
        assert have == {d.key: d for d in desired_entries(e, fabric.p4[e.switch].queues)}
    assert fabric.p4["t0-0-0"].apply(fabric.routes["t0-0-0"]) == 0  # re-applying writes nothing


def test_blackholed_t1_fails_exactly_its_paths_and_counts_drops(fabric):
    sw = fabric.p4["t1-2-1"]
    before = sum(n for (_, why), n in sw.drops().items() if why == "blackhole")
    fabric.blackhole("t1-2-1", True)
    try:
        results = probe_paths(fabric.plan, fabric.netns, timeout_s=0.5)
    finally:
        fabric.blackhole("t1-2-1", False)
    failed = {k for k, ok in matrix(results).items() if not ok}
    assert failed == {k for k in matrix(results) if "t1-2-1" in k[4]}
    assert implicate(results) == [("t1-2-1", 12)]
    after = sum(n for (_, why), n in sw.drops().items() if why == "blackhole")
    assert after - before == 12
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns))


def test_drop_probability_0_2_gives_measured_loss_near_0_2(fabric):
    path = fabric.plan.path("h0", "h2", 1, 0)
    sw = fabric.p4["t0-1-0"]
    before = sum(n for (_, why), n in sw.drops().items() if why == "gray_loss")
    gray_before = sw.port_counters([fabric.plan.port_to("t0-1-0", "t1-1-0")])["gray"].get(
        fabric.plan.port_to("t0-1-0", "t1-1-0"), 0)
    fabric.loss_salt = 7
    fabric.port_loss("t0-1-0", "t1-1-0", 0.2)
    try:
        results = []
        for _ in range(110):  # 2,200 probes in bursts of 20: bursts of 100 overflow BMv2's 64-packet queue
            results += probe_paths(fabric.plan, fabric.netns, [path] * 20, timeout_s=0.3)
    finally:
        fabric.port_loss("t0-1-0", "t1-1-0", 0.0)
    lost = sum(not r.delivered for r in results)
    loss = lost / len(results)
    assert len(results) >= 2000
    assert 0.15 <= loss <= 0.25, loss
    after = sum(n for (_, why), n in sw.drops().items() if why == "gray_loss")
    assert after - before == lost  # every loss is the injected one, counted by reason
    # ... and by the egress port it was dropped at, as switches.csv's gray column reads it
    port = fabric.plan.port_to("t0-1-0", "t1-1-0")
    assert sw.port_counters([port])["gray"].get(port, 0) - gray_before == lost
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns, [path] * 20))  # fault removed


def test_blackhole_and_gray_loss_compose_and_undo_cleanly(fabric):
    """my_sid holds the switch's fault mode: a port fault must survive a blackhole on and off,
    and removing the last port fault must leave the switch healthy."""
    t1 = "t1-1-0"
    lossy = fabric.plan.port_to(t1, "t0-1-1")  # everything t1-1-0 sends down to group 1
    through = [p for p in fabric.plan.all_paths() if t1 in p.hops]
    to_group1 = {p for p in through if fabric.spec.group_of(p.dst) == 1}
    fabric.p4[t1].set_port_loss(lossy, 1.0)
    try:
        fabric.blackhole(t1, True)
        assert not any(r.delivered for r in probe_paths(fabric.plan, fabric.netns, through, timeout_s=0.5))
        assert fabric.p4[t1].read_entries(["my_sid"]).popitem()[1].action == "blackhole"
        fabric.p4[t1].verify(fabric.routes[t1])  # the read-back knows the mode it set
        fabric.blackhole(t1, False)
        results = probe_paths(fabric.plan, fabric.netns, through, timeout_s=0.5)
        assert {r.path for r in results if not r.delivered} == to_group1
    finally:
        fabric.p4[t1].set_port_loss(lossy, 0.0)
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns, through))


def test_killed_and_restarted_switch_is_reprogrammed(fabric):
    node = fabric.emu.node("t1-0-1")
    node.kill()
    fabric.emu.restart_switch("t1-0-1")  # restarted under the controller, with no pipeline
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not any(n == "t1-0-1" for _, n in fabric.reprogrammed):
        time.sleep(0.2)
    assert any(n == "t1-0-1" for _, n in fabric.reprogrammed), "the watchdog did not reprogram t1-0-1"
    paths = [p for p in fabric.plan.all_paths(loops=True) if "t1-0-1" in p.hops]
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns, paths))
    fabric.verify()


def test_16mib_write_over_bmv2_arrives_intact_over_every_t1(fabric, tmp_path):
    from test_endpoint_fabric import MIB16, Transfer

    before = fabric.switch_packets(fabric.spec.t1s())
    t = Transfer(fabric, tmp_path)
    assert t.wait(300), (tmp_path / "h0.err").read_text()[-2000:]
    rx = t.rx()
    assert rx.messages_delivered == 1 and rx.messages_corrupt == 0 and rx.delivered_bytes >= MIB16
    after = fabric.switch_packets(fabric.spec.t1s())
    assert all(after[s] > before[s] for s in fabric.spec.t1s())


@pytest.mark.root
def test_linux_and_bmv2_give_the_same_matrix_with_and_without_a_blackholed_t1(fabric):
    bm_ok = matrix(probe_paths(fabric.plan, fabric.netns))
    fabric.blackhole("t1-3-0", True)
    try:
        bm_bh = matrix(probe_paths(fabric.plan, fabric.netns, timeout_s=0.5))
    finally:
        fabric.blackhole("t1-3-0", False)
    fabric.stop()  # one fabric at a time: the linux twin next
    with Fabric(load_spec(), "linux") as lin:
        lx_ok = matrix(probe_paths(lin.plan, lin.netns))
        lin.blackhole("t1-3-0", True)
        lx_bh = matrix(probe_paths(lin.plan, lin.netns, timeout_s=0.5))
    assert bm_ok == lx_ok and all(bm_ok.values())
    assert bm_bh == lx_bh and not all(bm_bh.values())
