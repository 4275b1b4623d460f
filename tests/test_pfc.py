"""PFC for the RoCE baseline (controller/pfc.py): a lossless class whose congested queue pauses the
ports that feed it, the pauses spreading hop by hop back to the senders, with nothing dropped; the
same run without PFC drops at the congested queue."""

import csv
import pytest
import yaml
from mrclab.controller.queues import QueueSettings, queue_plan
from mrclab.experiments.model.scenario import load_scenario
from mrclab.topologies.addressing import AddressPlan

# One plane, two T0s under one T1: h1 (beside h0) and h2, h3 (across the T1) write to h0 at the
# rate of h0's one port each. The queue down to h0 fills first; its feeders are h1's NIC port and
# the T1's port down to h0's T0; the T1's queue, paused, fills and pauses its own feeder, the far
# T0's uplink, whose queue pauses h2's and h3's NIC ports: three hops of spreading.
SCENARIO = {
    "name": "pfc-spreading",
    "fabric": {"topo": "lab", "planes": 1, "t0_per_plane": 2, "t1_per_plane": 1, "hosts_per_t0": 2,
               "link": {"bandwidth_mbps": 4, "queue_packets": 16}},
    "queues": {"pfc": True},
    "dataplane": "linux",
    "seed": 1,
    "duration_s": 8,
    # no rate control: only the window (64 packets a QP, 192 towards one 16-packet queue) holds them
    "transport": {"kind": "roce", "roce_cc": "none", "window_packets": 64},
    "workload": [{"src": h, "dst": "h0", "qps": 1, "message_bytes": 65536} for h in ("h1", "h2", "h3")],
    "expect": [{"metric": "messages_intact"}],
}


def _scenario(tmp_path, pfc: bool, dataplane: str = "linux"):
    path = tmp_path / f"pfc-{pfc}.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "queues": {"pfc": pfc}, "dataplane": dataplane}))
    return load_scenario(path)


def test_the_queue_plan_makes_ports_lossless_for_roce_only():
    plan = AddressPlan(_scenario_spec())
    roce = queue_plan(plan, QueueSettings(pfc=True).for_transport("roce"))
    mrc = queue_plan(plan, QueueSettings(pfc=True).for_transport("mrc"))
    q = roce[("t0-0-0", 1)]
    assert q.lossless and (q.xoff, q.xon) == (8, 4) and q.depth > 4 * q.q_limit
    assert not any(x.lossless for x in mrc.values())  # the paper runs MRC lossy
    assert not any(x.lossless for x in queue_plan(plan, QueueSettings().for_transport("roce")).values())


def test_a_scenario_s_trim_threshold_sets_mrc_s_switches_and_never_a_roce_fabric_s():
    # RoCE NICs know no trimmed packet: a scenario's trim_t (MRC's) under RoCE's PFC XOFF would cut
    # RoCE's packets before the pause, each a go-back-N
    plan = AddressPlan(_scenario_spec())
    for qs in (QueueSettings(pfc=True, trim_t=8), QueueSettings(trim_t=16), QueueSettings()):
        assert not any(x.trim_t for x in queue_plan(plan, qs.for_transport("roce")).values())
    mrc = queue_plan(plan, QueueSettings(pfc=True, trim_t=8).for_transport("mrc"))
    assert {x.trim_t for x in mrc.values()} == {8}


def _scenario_spec():
    from mrclab.topologies.spec import ClosSpec

    f = SCENARIO["fabric"]
    return ClosSpec.from_dict({k: v for k, v in f.items() if k != "topo"})


@pytest.mark.root
@pytest.mark.parametrize("dp", ["linux", pytest.param("bmv2", marks=pytest.mark.bmv2)])
def test_pauses_spread_hop_by_hop_and_nothing_is_dropped(dp, tmp_path, no_leftovers, decided_run):
    """linux: the tc eBPF program's virtual queues and htb's tbf leaves; bmv2: the qocc and
    pfc_feeds registers read over Thrift and a tbf on each switch's wire (controller/pfc.py)."""
    from mrclab.controller.dataplanes import missing_features
    from mrclab.experiments.run import runner

    if why := missing_features(dp).get("congestion"):
        pytest.skip(f"the {dp} data plane has no switch queues here: {why}")
    lossy, d_lossy = runner.run_with_data(_scenario(tmp_path, False, dp), tmp_path / "lossy", live=False)
    assert lossy["switch_ports"]["queue_full"] > 0, "without PFC the incast never overflowed: no test"
    m, d, out = decided_run(_scenario(tmp_path, True, dp), tmp_path / "pfc", with_data=True)
    assert m["switch_ports"]["queue_full"] == 0, m["switch_ports"]
    assert m["passed"], m["expectations"]  # every message intact
    plan = AddressPlan(load_scenario(tmp_path / "pfc-True.yaml").spec)
    pauses = {(r["switch"], r["port"]): r["pauses"] for r in d.ports if "pauses" in r}
    # hop 1: the T1's port down to h0's T0 fed the congested queue and was paused
    assert pauses[("t1-0-0", plan.port_to("t1-0-0", "t0-0-0"))] > 0, pauses
    # hop 2: the T1's queue, paused, filled and paused the far T0's uplink: the pause spread
    assert pauses[("t0-0-1", plan.port_to("t0-0-1", "t1-0-0"))] > 0, pauses
    # nothing paused what fed no congested queue: the ports up from h0's T0 carry no data
    assert pauses.get(("t0-0-0", plan.port_to("t0-0-0", "t1-0-0")), 0) == 0, pauses
    # and every flow still moves once its pauses have come and gone: a pause leaves no debt behind
    # (an htb class paused through its own rate kept one: the flows through it stopped for good)
    for qp, g in d.qp_goodput_mbps().items():
        assert sum(g[-20:]) > 0, f"{qp} delivered nothing in the last 2 s"
    with open(out / "switches.csv", newline="") as fh:  # the pauses reach the file too
        written = list(csv.DictReader(fh))
    assert any(r["pauses"] not in ("", "0") and float(r["pause_s"]) > 0 for r in written), written[:3]


def test_bmv2_levers_sit_on_every_port_that_faces_a_switch_and_open_at_twice_its_rate():
    from types import SimpleNamespace

    from mrclab.controller.pfc import OPEN_FACTOR, Bmv2Side, lever_lines

    plan = AddressPlan(_scenario_spec())
    queues = queue_plan(plan, QueueSettings(pfc=True).for_transport("roce"))
    fab = SimpleNamespace(queues=queues, emu=SimpleNamespace(netns=lambda n: f"mrclab-{n}", frame_bytes=1500))
    lines = lever_lines(fab)
    facing_switches = {(sw, p) for (sw, p), q in queues.items() if not q.peer.startswith("h")}
    assert {(ns.removeprefix("mrclab-"), int(line.split()[3].rsplit("eth", 1)[1])) for ns, line in lines} \
        == facing_switches and facing_switches
    q = queues[("t1-0-0", plan.port_to("t1-0-0", "t0-0-0"))]
    assert all(
        f"rate {OPEN_FACTOR * queues[(ns.removeprefix('mrclab-'), int(line.split()[3].rsplit('eth', 1)[1]))].rate_mbps}"
        "mbit" in line for ns, line in lines)
    side = Bmv2Side(fab)
    port = plan.port_to("t1-0-0", "t0-0-0")
    assert "rate 8bit" in side.lever("t1-0-0", port, True)
    assert f"rate {OPEN_FACTOR * q.rate_mbps}mbit" in side.lever("t1-0-0", port, False)
    assert not lever_lines(SimpleNamespace(queues=queue_plan(plan, QueueSettings(pfc=True).for_transport("mrc")),
                                           emu=fab.emu))  # MRC runs are lossy: no lever


@pytest.mark.root
@pytest.mark.parametrize("pfc", [True, False], ids=["pfc", "lossy"])
def test_incast_hurts_the_roce_victim_over_pfc_and_not_without(pfc, tmp_path, no_leftovers, decided_run):
    """The paper's fig. 18 for the baseline: the incast's RoCE run (DCQCN, 4 QPs per sender) over
    PFC pauses the T1 -> T0 links the victim shares, and its expectations (victim <= 0.75 of its
    rate, pauses counted) pass; the same run lossy leaves the victim alone (0.985 measured) and
    they FAIL: PFC's pause spreading is the mechanism this row demonstrates."""
    from mrclab.controller.dataplanes import missing_features

    if why := missing_features("linux").get("congestion"):
        pytest.skip(f"the linux data plane has no switch queues here: {why}")
    base = load_scenario("incast")
    raw = {**base.raw, "queues": {**(base.raw.get("queues") or {}), "pfc": pfc}, "dataplane": "linux"}
    path = tmp_path / "incast.yaml"
    path.write_text(yaml.safe_dump(raw))
    scn = load_scenario(path, transport="roce", duration_s=base.quick_s)
    m, _, _ = decided_run(scn, tmp_path / "run")
    victim = next(v for v in m["expectations"] if v["metric"] == "goodput_ratio")
    if pfc:
        assert m["passed"] and not m["void"], m["expectations"]
    else:
        assert victim["passed"] is False, victim


@pytest.mark.root
def test_a_switch_on_a_server_is_reached_through_its_helper_for_thrift_backlogs_and_kicks(tmp_path):
    # emulation/cluster.py SWITCH_HELPER in a namespace of its own, as beside a bmv2 switch on a
    # server: a stand-in Thrift port echoes through the relay, and controller/pfc.py's bmv2 side
    # reads the levers' backlog and sends its kick frame through the control socket
    import socket
    import subprocess
    import sys
    import time
    import types

    from mrclab.controller.pfc import KICK_FRAME, Bmv2Side
    from mrclab.emulation import kernel
    from mrclab.emulation.cluster import SWITCH_HELPER

    ns = f"mrclab-helpertest-{tmp_path.name[-6:]}"
    thrift_sock, ctl_sock = str(tmp_path / "sw.thrift"), str(tmp_path / "sw.ctl")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    procs = []
    try:
        # no IPv6 here: its router and listener solicitations would wait in the lever too
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
        for line in ("link set lo up", "link add t1-0-0-eth1 type veth peer name peer0",
                     "link set t1-0-0-eth1 up", "link set peer0 up"):
            subprocess.run(["ip", "-n", ns, *line.split()], check=True)
        # a lever holding what it took: a tbf at 8 bit/s with a burst of one kick frame
        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "t1-0-0-eth1", "root", "tbf", "rate", "8bit",
                        "burst", "100", "limit", "30000"], check=True)
        echo = ("import socket\nl=socket.socket();l.setsockopt(1,2,1);l.bind(('127.0.0.1',9090));l.listen()\n"
                "while True:\n c,_=l.accept()\n while (d:=c.recv(100)): c.sendall(d[::-1])\n c.close()\n")
        procs.append(subprocess.Popen(kernel.netns_exec_argv(ns, [sys.executable, "-c", echo])))
        procs.append(subprocess.Popen(kernel.netns_exec_argv(ns, ["python3", "-c", SWITCH_HELPER, thrift_sock,
                                                                  "9090", ctl_sock])))
        deadline = time.monotonic() + 10
        while not (tmp_path / "sw.ctl").exists() or not (tmp_path / "sw.thrift").exists():
            assert time.monotonic() < deadline, "the helper never listened"
            time.sleep(0.05)
        time.sleep(0.3)  # the stand-in Thrift port
        relay = socket.socket(socket.AF_UNIX)
        relay.connect(thrift_sock)
        # through the relay to the port inside the namespace and back; and again after an idle spell
        # longer than the relay's 5 s connect timeout: the port sampler reads a switch every 4 s on 64
        # switches, later under load (once the relay read with that timeout and closed the session:
        # every later read of that switch failed)
        for word, idle_s in ((b"thrift", 0.0), (b"again", 5.5)):
            time.sleep(idle_s)
            relay.sendall(word)
            assert relay.recv(100) == word[::-1]
        relay.close()
        node = types.SimpleNamespace(control_addr=ctl_sock)
        emu = types.SimpleNamespace(node=lambda name: node, netns=lambda name: ns)
        side = Bmv2Side(types.SimpleNamespace(queues={}, emu=emu))
        tx = "/sys/class/net/t1-0-0-eth1/statistics/tx_packets"

        def sent() -> int:
            return int(subprocess.run(["ip", "netns", "exec", ns, "cat", tx], capture_output=True,
                                      text=True).stdout)

        assert side.backlog("t1-0-0", 1) == 0
        before = sent()
        for _ in range(4):  # the first leaves on the burst, the other three wait in the lever
            side.resumed("t1-0-0", "t1-0-0-eth1")
        side._qlens.clear()  # a new turn
        assert side.backlog("t1-0-0", 1) == 3
        assert sent() == before + 1
        with pytest.raises(OSError, match="No such device"):
            side._ask("t1-0-0", f"kick t1-0-0-eth9 {KICK_FRAME.hex()}")
        side.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "delete", ns])
