"""A fabric whose planes run on other servers (emulation/cluster.py): placement, the kernel calls
routed to a server, the agent that runs them there, and, on namespace servers with their own sshd
(emulation/nsservers.py), a fabric probed clean, the quickstart passing with its fault on a remote
plane, and cleanup after a kill -9 leaving nothing on any server."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from mrclab.controller.dataplanes import available, missing_features
from mrclab.controller.fabric import Fabric
from mrclab.controller.pathprobe import probe_paths
from mrclab.emulation import kernel
from mrclab.emulation import placement as P
from mrclab.emulation import servers as S
from mrclab.emulation.cluster import VXLAN_OVERHEAD, vxlan_lines
from mrclab.experiments.model.scenario import SCENARIO_DIR, load_scenario
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import load_spec
from mrclab.emulation.nsservers import servers as ns_servers

# ---- placement and routing (no root) ----------------------------------------------------------------


def test_planes_go_round_robin_over_the_servers_and_hosts_stay_here():
    a, b, c = S.Server("198.18.0.1"), S.Server("198.18.0.2"), S.Server("198.18.0.3")
    p = P.Placement((a, b, c))
    assert [p.server_of(f"t0-{plane}-0") for plane in range(8)] == [a, b, c, a, b, c, a, b]
    assert p.server_of("t1-4-3") == b and p.server_of("h7") is None
    assert p.planes_of(a, 8) == [0, 3, 6] and p.planes_of(c, 8) == [2, 5]
    assert p.describe(8) == ("root@198.18.0.1: planes 0, 3, 6; root@198.18.0.2: planes 1, 4, 7; "
                             "root@198.18.0.3: planes 2, 5; hosts and controller here")


class FakeRemote:
    """A kernel.Remote that records what it is asked and answers from a script."""

    name = "root@fake"

    def __init__(self, rc: int = 0, out: str = "", err: str = "") -> None:
        self.calls: list[tuple[list[str], str | None]] = []
        self.rc, self.out, self.err = rc, out, err

    def run(self, argv, input=None):
        self.calls.append((argv, input))
        return subprocess.CompletedProcess(argv, self.rc, self.out, self.err)

    def popen(self, argv, **kw):
        raise AssertionError("not used")


def test_kernel_calls_on_a_placed_namespace_run_on_its_server_and_come_back_here_after():
    fake = FakeRemote()
    kernel.place("mrclab-t0-0-0", fake)
    try:
        kernel.ip_batch("mrclab-t0-0-0", ["route add a", "route add b"])
        kernel.link_set("mrclab-t0-0-0", "t0-0-0-eth1", up=False)
        kernel.netns_attach("mrclab-t0-0-0", 4242)
        assert fake.calls == [
            (["ip", "-n", "mrclab-t0-0-0", "-batch", "-"], "route add a\nroute add b\n"),
            (["ip", "-n", "mrclab-t0-0-0", "link", "set", "t0-0-0-eth1", "down"], None),
            (["ip", "netns", "attach", "mrclab-t0-0-0", "4242"], None),
        ]
        # this process cannot enter a namespace on another machine: it says so
        with pytest.raises(kernel.KernelError, match="is on root@fake: this process cannot enter it"):
            with kernel.inside("mrclab-t0-0-0"):
                pass
        # a refusal there names the server and the kernel's words
        fake.rc, fake.err = 2, "RTNETLINK answers: File exists"
        with pytest.raises(kernel.KernelError, match="on root@fake: RTNETLINK answers: File exists"):
            kernel.ip_batch("mrclab-t0-0-0", ["route add a"])
    finally:
        kernel.place("mrclab-t0-0-0", None)
    assert kernel.where("mrclab-t0-0-0") is None
    n = len(fake.calls)
    kernel.ip("mrclab-t0-0-0", ["link", "show"], check=False)  # here again: no such namespace, no call there
    assert len(fake.calls) == n


class LocalSsh:
    """An Ssh stand-in whose 'server' is a local shell: the agent's own code runs for real."""

    def __init__(self) -> None:
        self.started = 0

    def connect(self, server):
        self.started += 1
        return None

    def argv(self, server, command, master=False):
        return ["sh", "-c", command]


def test_the_server_agent_runs_commands_feeds_input_reports_failures_and_restarts_when_killed():
    ssh = LocalSsh()
    on = S.OnServer(ssh, S.Server("local"))  # type: ignore[arg-type]
    try:
        r = on.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
        assert on.run(["cat"], input="a\nb\n").stdout == "a\nb\n"
        assert on.run(["no-such-command-here"]).returncode == 127
        assert ssh.started == 1  # one agent for all of them
        assert on._agent is not None
        on._agent.kill()
        on._agent.wait()
        assert on.run(["echo", "again"]).stdout == "again\n"  # started again
        assert ssh.started == 2
    finally:
        on.close()


def test_both_planes_queue_over_servers_where_they_queue_here():
    # linux's queue program runs on a server through its queue agent, bmv2's Thrift runtime is
    # relayed from there over ssh: what this machine lacks for either (clang; BMv2's Thrift client)
    # it lacks over servers too, and nothing more (what a server lacks, preflight says per server)
    for plane in ("linux", "bmv2"):
        assert missing_features(plane, remote=True) == missing_features(plane)
    assert {"congestion", "gray_loss"} <= available("linux", remote=True) or "congestion" in missing_features("linux")
    assert {"link", "switch", "blackhole"} <= available("linux", remote=True)


def test_a_server_lacking_a_feature_is_named_with_the_mend():
    c = S.ServerCheck(S.Server("10.0.0.2"), (), lacks=(("congestion", "apt-get install -y libbpf1"),))
    assert c.lacking({"congestion"}) == ["root@10.0.0.2: lacks congestion (apt-get install -y libbpf1)"]
    assert c.lacking({"gray_loss"}) == []


def test_vxlan_ports_carry_their_link_number_and_mac():
    assert vxlan_lines("h0-eth1", "02:00:00:00:00:01", 7, "198.18.0.2", 1234) == [
        "link add h0-eth1 address 02:00:00:00:00:01 netns 1234 type vxlan id 7 remote 198.18.0.2 dstport 4789"]
    assert VXLAN_OVERHEAD == 20 + 8 + 8 + 14


def test_a_remote_nodes_shell_starts_on_a_raw_local_pty(monkeypatch):
    """ssh -tt over a multiplexed connection relays the remote shell before its client puts the
    local pty in raw mode: a command written then is echoed back and its output gets a second
    carriage return, and Mininet's int() of the shell's pid fails. The pty is raw before ssh runs."""
    import pty
    import termios

    from mininet.node import Node
    from mrclab.emulation.cluster import RemoteLinuxSrv6Switch

    seen = {}

    def spawned(self, cmd, **params):  # Mininet's local _popen: what ssh would find on its terminal
        lflag, oflag = termios.tcgetattr(params["stdin"])[3], termios.tcgetattr(params["stdin"])[1]
        seen.update(echo=bool(lflag & termios.ECHO), canon=bool(lflag & termios.ICANON),
                    onlcr=bool(oflag & termios.OPOST), cmd=cmd)
        return None

    monkeypatch.setattr(Node, "_popen", spawned)
    node = object.__new__(RemoteLinuxSrv6Switch)
    master, slave = pty.openpty()
    try:
        node.isRemote, node.user, node.sshcmd, node.master, node.slave = True, "root", ["ssh", "-tt", "srv"], \
            master, slave
        assert termios.tcgetattr(slave)[3] & termios.ECHO  # a new pty echoes
        node._popen(["mnexec", "-c"], stdin=slave, stdout=slave, stderr=slave)
        assert seen == {"echo": False, "canon": False, "onlcr": False, "cmd": ["ssh", "-tt", "srv", "mnexec", "-c"]}
        seen.clear()
        other_master, other_slave = pty.openpty()  # any other process's terminal is left as it is
        node._popen(["tc", "qdisc"], stdin=other_slave, stdout=other_slave)
        assert seen["echo"] and seen["canon"]
        os.close(other_master), os.close(other_slave)
    finally:
        os.close(master), os.close(slave)


@pytest.mark.parametrize("argv, said", [
    (["probe", "--ssh-config", "/nonexistent"], "--ssh-config is for --servers"),
    (["run", "--servers", "a b"], "--servers: 'a b' is not a server"),
    (["up", "--servers", "198.18.0.1", "--ssh-config", "/nonexistent/config"],
     "--ssh-config: /nonexistent/config is not a file"),
    (["clean", "--ssh-config", "/x"], "--ssh-config is for --servers"),
])
def test_bad_server_options_get_one_line(argv, said):
    r = subprocess.run([sys.executable, "-m", "mrclab.cli", *argv], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, COLUMNS="200"))
    assert r.returncode != 0
    assert said in r.stderr + r.stdout, r.stderr + r.stdout
    assert "Traceback" not in r.stderr


# ---- on namespace servers (root, sshd) ----------------------------------------------------------------

needs_sshd = pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"),
                                reason="no sshd here (setup.sh installs openssh-server)")


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("namespace servers need root")
    with ns_servers(2, tmp_path_factory.mktemp("srv")) as srv:
        yield srv


def _on(srv, i: int, command: str) -> str:
    return subprocess.run(["ssh", "-F", str(srv.ssh_config), srv.addresses[i], command], capture_output=True,
                          text=True, timeout=60).stdout


def _nothing_left(srv) -> None:
    for i in range(len(srv.addresses)):
        assert "mrclab-" not in _on(srv, i, "ip netns list"), f"namespaces left on server {i + 1}"
    assert not [n for n in kernel.netns_list() if n.startswith("mrclab-")]
    shells = subprocess.run(["pgrep", "-f", "mininet:"], capture_output=True, text=True).stdout.split()
    assert not shells, f"node shells left: {shells}"


PLANES = [pytest.param("linux", marks=pytest.mark.root), pytest.param("bmv2", marks=pytest.mark.bmv2)]
#: each data plane's switch queues (trim, ECN, PFC) can run here, or the test says why not
_QUEUES_HERE = {"linux": pytest.mark.skipif(bool(missing_features("linux").get("congestion")),
                                            reason="no tc eBPF program here"),
                "bmv2": pytest.mark.skipif(bool(missing_features("bmv2").get("congestion")),
                                           reason="no Thrift runtime for BMv2 here")}


@needs_sshd
@pytest.mark.parametrize("dataplane", PLANES)
def test_a_fabric_over_two_servers_probes_clean_and_leaves_nothing(two_servers, dataplane):
    srv = two_servers
    spec = load_spec(None)
    with P.open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster:
        assert cluster is not None
        with Fabric(spec, dataplane, placement=cluster.placement, ssh=cluster.ssh) as fab:
            # each plane's switches are namespaces of their server, named there and not here
            one, two = _on(srv, 0, "ip netns list"), _on(srv, 1, "ip netns list")
            assert "mrclab-t0-0-0" in one and "mrclab-t1-2-1" in one and "mrclab-t0-1-0" not in one
            assert "mrclab-t0-1-0" in two and "mrclab-t1-3-1" in two and "mrclab-t0-0-0" not in two
            assert "mrclab-t0-0-0" not in kernel.netns_list() and "mrclab-h0" in kernel.netns_list()
            # a host's port into a remote plane is a VXLAN port
            link = json.loads(subprocess.run(["ip", "-n", "mrclab-h0", "-j", "-d", "link", "show", "h0-eth0"],
                                             capture_output=True, text=True).stdout)[0]
            assert link["linkinfo"]["info_kind"] == "vxlan" and link["mtu"] == 9000
            results = probe_paths(fab.plan, fab.netns, timeout_s=2.0)
            assert results and all(r.delivered for r in results), [r for r in results if not r.delivered][:3]
            # a T1 down on a remote plane fails the probes through it, and only those; back up, all pass
            fab.faults.set_switch("t1-0-0", up=False)
            down = probe_paths(fab.plan, fab.netns, timeout_s=2.0)
            through = [r for r in down if r.path.plane == 0 and r.path.t1 == 0]
            assert through and not any(r.delivered for r in through)
            assert all(r.delivered for r in down if r not in through)
            # a NIC link between servers (VXLAN: no carrier of its own): its host's end goes down,
            # which the host reads as its carrier, and comes back with the link
            def host_end_up() -> bool:
                (ns, intf), = [e for e in fab.emu.link_intfs("h0", "t0-1-0") if e[1].startswith("h0-")]
                return "UP" in json.loads(kernel.ip(ns, ["-j", "link", "show", intf]))[0]["flags"]

            fab.faults.set_link("h0", "t0-1-0", up=False)
            assert not host_end_up()
            fab.faults.set_link("h0", "t0-1-0", up=True)
            assert host_end_up()
            fab.faults.set_switch("t1-0-0", up=True)
            again = probe_paths(fab.plan, fab.netns, timeout_s=2.0)
            assert all(r.delivered for r in again), [r for r in again if not r.delivered][:3]
    _nothing_left(srv)


def _pins(srv, i: int) -> list[str]:
    return _on(srv, i, "find /sys/fs/bpf/mrclab -mindepth 1 2>/dev/null").split()


@pytest.mark.root
@needs_sshd
@_QUEUES_HERE["linux"]
def test_switch_queues_on_a_remote_plane_are_loaded_pinned_read_and_removed_there(two_servers):
    srv = two_servers
    spec = load_spec(None)
    with P.open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster:
        assert cluster is not None
        with Fabric(spec, "linux", placement=cluster.placement, ssh=cluster.ssh) as fab:
            assert fab.congestion and set(fab.bpf) == set(spec.switches())
            # plane 0's switches: their programs and maps pinned on the first server, not the second
            pins = _pins(srv, 0)
            assert any(p.endswith("/t0-0-0/port_state") for p in pins) and any(p.endswith("/t0-0-0/prog") for p in pins)
            assert not any("/t0-1-0/" in p for p in pins) and any("/t0-1-0/" in p for p in _pins(srv, 1))
            tc = _on(srv, 0, "ip netns exec mrclab-t0-0-0 tc filter show dev t0-0-0-eth1 egress")
            assert "mrclab_egress" in tc and "direct-action" in tc
            rows = {(r["switch"], r["port"]): r for r in fab.port_samples()}
            assert len(rows) == len(fab.queues)
            # gray loss on a remote plane's port is that port's configuration there (the drops
            # themselves, of MRC packets only: the ev-loss scenario over servers)
            fab.port_loss("t0-0-0", "t1-0-0", 0.5)
            port = fab.plan.port_to("t0-0-0", "t1-0-0")
            assert fab.port_loss_now[("t0-0-0", port)] == 0.5
            after = {(r["switch"], r["port"]): r for r in fab.port_samples(["t0-0-0"])}
            assert set(after) == {k for k in rows if k[0] == "t0-0-0"}
            fab.port_loss("t0-0-0", "t1-0-0", 0.0)
            # the port's counters as the program there counts them: every probe passed it
            intf = f"t0-0-0-eth{port}"
            assert all(r.delivered for r in probe_paths(fab.plan, fab.netns, timeout_s=2.0))
            counted = fab.bpf["t0-0-0"].state(intf)
            assert counted["low"] + counted["high"] > 0, counted
            # the queue agent killed: the next request starts another, which reopens the pins
            agent = fab.queue_agents[cluster.placement.server_of("t0-0-0")]
            assert agent.on._agent is not None
            agent.on._agent.kill()
            agent.on._agent.wait()
            assert fab.bpf["t0-0-0"].state(intf) == counted  # the same maps, not fresh ones
            assert agent.on._agent is not None and agent.on._agent.poll() is None
    assert _pins(srv, 0) == [] and _pins(srv, 1) == []
    _nothing_left(srv)


@needs_sshd
@pytest.mark.parametrize("scenario, dataplane, switch", [
    pytest.param("quickstart", "linux", "t1-0-0", marks=pytest.mark.root),
    # on bmv2 the T1 dies as a crashed switch: killed on its server, restarted and reprogrammed
    pytest.param("quickstart", "bmv2", "t1-0-0", marks=pytest.mark.bmv2),
    # its hosts' ports are VXLAN ports, which have no carrier of their own: the fabric sets them
    # down and up so that the hosts see the T0 go at once, and come back once it forwards
    # (evs_retired max 0: announced, not discovered)
    pytest.param("t0-down", "linux", "t0-0-0", marks=pytest.mark.root),
])
def test_a_scenario_passes_with_its_switch_dying_on_a_remote_plane(two_servers, tmp_path, scenario, dataplane,
                                                                   switch, run_evidence):
    srv = two_servers
    why = []
    for n in range(1, 4):  # a void run (exit 3: the emulator fell behind) says nothing: run again
        out = tmp_path / f"qs{n}"
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "run", scenario, "--dataplane", dataplane,
                            "--servers", ",".join(srv.addresses), "--ssh-config", str(srv.ssh_config), "--out",
                            str(out)], capture_output=True, text=True, timeout=300, env=dict(os.environ, COLUMNS="200"))
        assert (out / "metrics.json").exists(), r.stdout[-3000:] + r.stderr[-3000:]
        m = json.loads((out / "metrics.json").read_text())
        if not (r.returncode == 3 and m["passed"] is None):  # decided: pass or FAIL
            break
        why.append(f"try {n}: " + ", ".join(f["invariant"] + " at " + f["where"] for f in m["fidelity_faults"][:2]))
    else:  # a shipped scenario this machine cannot decide is too heavy for it: a failure, never a skip
        pytest.fail(f"{scenario} on {dataplane} over servers: void 3 times, this machine could not keep up: {why}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + "\n" + run_evidence(out)
    # the switch that died is plane 0's, which runs on the first server
    downs = [f for f in m["faults"] if f.get("event") == "switch_down"]
    assert downs and downs[0]["label"] == f"switch_down {switch}"
    # the event carries its time on that server's clock too (these servers share this one)
    first = f"root@{srv.addresses[0]}"
    assert list(downs[0]["server_t"]) == [first] and abs(downs[0]["server_t"][first] - downs[0]["t"]) < 0.01
    placed = json.loads((out / "servers.json").read_text())
    assert [p["planes"] for p in placed] == [[0, 2], [1, 3]] and abs(placed[0]["clock_offset_ms"]) < 10
    assert P.Placement(tuple(S.Server(a) for a in srv.addresses)).server_of(switch) == S.Server(srv.addresses[0])
    assert m["passed"] and not m["void"] and len(m["expectations"]) >= 5
    assert all(e["passed"] for e in m["expectations"]), m["expectations"]
    _nothing_left(srv)


#: switch counters that move in a scenario (read from its planes' queues on the servers: linux's
#: queue programs' maps, BMv2's counters over its relayed P4Runtime): trims at an incast, ECN marks
#: where flows meet, gray-loss drops on a lossy path
COUNTERS = {"incast": ("trimmed",), "incast-no-trim": ("queue_full",), "ecn-load-balancing": ("marked",),
            "fig16-allreduce": ("marked", "trimmed"), "fig17-alltoall": ("marked", "trimmed"),
            "permutation": ("marked", "trimmed"), "ev-loss": ("gray",)}
#: every shipped scenario runs over servers here but the two the switch-dying test above runs. Four
#: (fig17-alltoall, flap-soak, t1-blackhole, transceiver-flap) were left out on 2026-11-28, void 3
#: times each for endpoint starvation before verdicts were void only by cause; at acdeb75 they
#: passed twice in a row here, 131 s for the four (2026-12-05). On bmv2 every one passed twice in
#: a row over 2 servers, each on its first try with no fidelity fault (2026-12-06, 6705dc4)
OVER_SERVERS = sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml") if p.stem not in {"quickstart", "t0-down"})


@needs_sshd
@pytest.mark.parametrize("scenario, dataplane", [
    pytest.param(s, dp, marks=[pytest.mark.root if dp == "linux" else pytest.mark.bmv2, _QUEUES_HERE[dp]],
                 id=f"{s}-{dp}") for dp in ("linux", "bmv2") for s in OVER_SERVERS])
def test_every_shipped_scenario_passes_over_two_servers_with_its_queues_on_them(two_servers, tmp_path, decided_run,
                                                                                scenario, dataplane, run_evidence):
    srv = two_servers
    scn = load_scenario(scenario, dataplane=dataplane, duration_s=load_scenario(scenario).quick_s)
    with P.open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster:
        m, _d, out = decided_run(scn, tmp_path, cluster=cluster)
    assert m["passed"], f"{[e for e in m['expectations'] if e['passed'] is False]}\n{run_evidence(out)}"
    placed = json.loads((out / "servers.json").read_text())
    assert sorted(p for s in placed for p in s["planes"]) == list(range(scn.spec.planes))
    # every switch is on a server, and the counter the scenario's claims rest on moved there
    with (out / "switches.csv").open() as f:
        last = {(r["switch"], r["port"]): r for r in csv.DictReader(f)}
    plan = AddressPlan(scn.spec)  # every port of every switch read, each on its server
    assert set(last) == {(sw, str(p)) for sw in scn.spec.switches() for p in plan.ports(sw)}
    counters = COUNTERS.get(scenario, ())
    if counters:
        assert sum(int(float(r[c] or 0)) for r in last.values() for c in counters) > 0, counters
    _nothing_left(srv)
    assert _pins(srv, 0) == [] and _pins(srv, 1) == []


@pytest.mark.bmv2
@needs_sshd
@_QUEUES_HERE["bmv2"]
@pytest.mark.parametrize("transport, counter", [("mrc", "trimmed"), ("roce", "pauses")])
def test_bmv2_queues_on_remote_planes_trim_and_pause_read_through_their_helpers(two_servers, tmp_path, transport,
                                                                                counter):
    # incast over 2 servers, one plane each: BMv2's queues set and read over the relayed Thrift
    # (emulation/cluster.py SWITCH_HELPER), and the counter the transport's fabric rests on moves
    # on both servers' switches: MRC's trims at the incast port; RoCE over PFC's pauses, its levers
    # driven by tc there and woken by the helper's kick. Correctness is a verdict no machine
    # voids; MRC's incast verdicts over servers are the test above's, and RoCE's incast FAILs by
    # design (its victim is the paper's point), so only its pauses and its correctness are asked
    from mrclab.experiments.run import runner
    srv = two_servers
    scn = load_scenario("incast", dataplane="bmv2", transport=transport, duration_s=load_scenario("incast").quick_s)
    with P.open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster:
        m, _d = runner.run_with_data(scn, tmp_path / "out", live=False, cluster=cluster)
    intact = [e for e in m["expectations"] if e["metric"] == "messages_intact"]
    assert intact and intact[0]["passed"] is True, intact
    with (tmp_path / "out" / "switches.csv").open() as f:
        last = {(r["switch"], r["port"]): r for r in csv.DictReader(f)}
    plan = AddressPlan(scn.spec)  # every port of every switch read, each on its server
    assert set(last) == {(sw, str(p)) for sw in scn.spec.switches() for p in plan.ports(sw)}
    per_plane = {p: sum(int(float(r[counter] or 0)) for (sw, _), r in last.items() if sw.split("-")[1] == str(p))
                 for p in range(scn.spec.planes)}
    # (not asked: RoCE's lossless class drops nothing. bmv2's incast does not hold it, on one
    # machine either: 14 drops here against 56 over servers, 2026-11-29; issue 35's notes)
    assert all(v > 0 for v in per_plane.values()), per_plane
    _nothing_left(srv)


@pytest.mark.bmv2
@needs_sshd
@pytest.mark.slow
@_QUEUES_HERE["bmv2"]
def test_the_64_switch_incast_over_two_servers_on_bmv2_is_decided_and_passes(two_servers, tmp_path, decided_run,
                                                                             run_evidence):
    # issue 38 item 4: the 64-switch fabric (8 planes x 4 T0 x 4 T1, four planes a server) with a
    # 5-to-1 incast across it and a victim beside it, at 0.125 Mb/s (experiments/scenarios/large:
    # faster, this 2-core machine starved, void). Every plane's T0 above the incast's receiver
    # trims, read over each server's relayed Thrift; with trim off the same run FAILs its trims
    # and retires EVs by the hundred (124, 2026-12-06)
    srv = two_servers
    scn = load_scenario(SCENARIO_DIR / "large" / "lab64-incast.yaml", dataplane="bmv2")
    with P.open_cluster(",".join(srv.addresses), str(srv.ssh_config)) as cluster:
        m, _d, out = decided_run(scn, tmp_path, cluster=cluster)
    assert m["passed"], f"{[e for e in m['expectations'] if e['passed'] is False]}\n{run_evidence(out)}"
    with (out / "switches.csv").open() as f:
        last = {(r["switch"], r["port"]): r for r in csv.DictReader(f)}
    above_h0 = {sw: int(float(r["trimmed"] or 0)) for (sw, port), r in last.items()
                if sw.startswith("t0-") and sw.endswith("-0") and r["peer"] == "h0"}
    assert len(above_h0) == 8 and all(n > 0 for n in above_h0.values()), above_h0
    _nothing_left(srv)


@pytest.mark.root
@needs_sshd
def test_clean_servers_after_a_kill_9_leaves_nothing_on_any_server(two_servers):
    srv = two_servers
    cfg = ["--servers", ",".join(srv.addresses), "--ssh-config", str(srv.ssh_config)]
    p = subprocess.Popen([sys.executable, "-m", "mrclab.cli", "up", "--dataplane", "linux", "--no-cli", *cfg],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("ready "):
                break
            assert time.monotonic() < deadline, "the fabric did not come up"
        else:
            pytest.fail("mrclab up exited before the fabric was up")
        assert "mrclab-t0-0-0" in _on(srv, 0, "ip netns list")
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # the owner and its children: nothing of theirs runs a cleanup
        p.wait()
    # a namespace with a node's name that no run recorded, and one that is not mrclab's
    _on(srv, 1, "ip netns add mrclab-t0-9-9; ip netns add other-lab")
    try:
        r = subprocess.run([sys.executable, "-m", "mrclab.cli", "clean", *cfg], capture_output=True, text=True,
                           timeout=120, env=dict(os.environ, COLUMNS="200"))
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"and on root@{srv.addresses[0]}, root@{srv.addresses[1]}" in r.stdout
        assert f"orphan namespaces on root@{srv.addresses[1]}: mrclab-t0-9-9" in r.stdout
        _nothing_left(srv)
        assert "other-lab" in _on(srv, 1, "ip netns list")  # another lab's: left alone
    finally:
        _on(srv, 1, "ip netns delete other-lab")


@pytest.mark.parametrize("thrift_port", [None, 9090])
def test_bmv2_has_a_queue_for_every_priority_the_program_sets_with_or_without_thrift(monkeypatch, thrift_port):
    # BMv2 drops a packet whose priority has no queue: with one queue, every ACK (priority 1,
    # keep_high) was dropped on a switch without Thrift, as on every switch on a server
    import re
    from pathlib import Path as P

    from mrclab.emulation import nodes
    from mrclab.emulation.cluster import RemoteBmv2Switch

    highest = max(int(v) for v in re.findall(r"const bit<3>\s+PRIO_\w+\s*=\s*(\d+);",
                                             (P(nodes.__file__).parent.parent / "p4src" / "mrclab.p4").read_text()))
    monkeypatch.setattr(nodes, "bmv2_binary", lambda *a, **k: ("simple_switch_grpc", "test"))
    for cls in (nodes.Bmv2Switch, RemoteBmv2Switch):
        sw = object.__new__(cls)
        sw.name, sw.device_id, sw.debug, sw.build, sw.thrift_port = "t0-0-0", 0, False, None, thrift_port
        sw.run_dir, sw.remote_dir, sw.intfs, sw.ports = P("/run/x"), "/run/y", {}, {}
        cmd = sw.command()
        assert int(cmd[cmd.index("--priority-queues") + 1]) == highest + 1
        assert cmd.index("--priority-queues") > cmd.index("--")  # a target option


def test_a_servers_block_places_planes_as_it_says_or_round_robin(tmp_path):
    a, b = S.Server("10.0.0.2"), S.Server("10.0.0.3", "lab")
    p, cfg = P.parse_block({"machines": ["10.0.0.2", "lab@10.0.0.3"]}, str(tmp_path / "f.yaml"))
    assert p.servers == (a, b) and not p.planes and cfg is None
    assert [p.server_of_plane(i) for i in range(4)] == [a, b, a, b]
    p, cfg = P.parse_block({"ssh_config": "cfg", "machines": [
        {"address": "10.0.0.2", "planes": [0, 1, 2]}, {"address": "10.0.0.3", "user": "lab", "planes": [3]}]},
        str(tmp_path / "f.yaml"))
    assert [p.server_of_plane(i) for i in range(4)] == [a, a, a, b] and cfg == str(tmp_path / "cfg")
    p.check(4)
    with pytest.raises(S.BadInput, match=r"the planes placed are \[0, 1, 2, 3\]; this fabric has planes 0-7"):
        p.check(8)


@pytest.mark.parametrize("block, said", [
    (["10.0.0.2"], "a mapping with machines"),
    ({"machines": []}, "machines: a list"),
    ({"machines": [{"address": "10.0.0.2", "planes": [0]}, "10.0.0.3"]}, "planes for every machine or for none"),
    ({"machines": [{"address": "a", "planes": [0, 1]}, {"address": "b", "planes": [1]}]},
     r"placed on two machines \(\[1\]\)"),
    ({"machines": ["10.0.0.2", "root@10.0.0.2"]}, "root@10.0.0.2 is given twice"),
    ({"machines": [{"address": "a", "plane": [0]}]}, r"machines\[0\]: \[user@\]address, or a mapping"),
])
def test_a_bad_servers_block_says_what_is_wrong(block, said):
    with pytest.raises(S.BadInput, match=said):
        P.parse_block(block, "f.yaml")


def test_servers_come_from_the_option_a_file_or_the_fabric_file(tmp_path):
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text("planes: 2\nservers:\n  machines: [10.0.0.7]\n")
    assert load_spec(fabric).planes == 2  # the block is where it runs, not its shape
    with P.open_cluster(None, None, files=(fabric,)) as c:
        assert c is not None and c.placement.servers == (S.Server("10.0.0.7"),)
    with P.open_cluster("10.0.0.8", None, files=(fabric,)) as c:  # the option wins
        assert c is not None and c.placement.servers == (S.Server("10.0.0.8"),)
    with P.open_cluster(str(fabric), None) as c:  # --servers FILE
        assert c is not None and c.placement.servers == (S.Server("10.0.0.7"),)
    with P.open_cluster(None, None, files=(tmp_path / "none.yaml", None)) as c:
        assert c is None
    plain = tmp_path / "plain.yaml"
    plain.write_text("planes: 2\n")
    with pytest.raises(S.BadInput, match="has no servers: block"):
        with P.open_cluster(str(plain), None):
            pass


class Here:
    """A kernel.Remote that runs its commands on this machine: the scripts themselves run for real."""

    name = "here"

    def run(self, argv, input=None):
        return subprocess.run(argv, input=input, capture_output=True, text=True)


def test_a_switch_on_a_server_is_watched_for_starvation_through_its_pid_file(tmp_path):
    from mrclab.experiments.run import monitor

    pid_file, gone = tmp_path / "sw.pid", tmp_path / "gone.pid"
    pid_file.write_text(str(os.getpid()))
    got = monitor.remote_schedstat(Here(), [str(pid_file), str(gone)])
    here = monitor.schedstat(os.getpid())
    assert 0 < got[str(pid_file)][1] <= here[1] and 0 <= got[str(pid_file)][0] <= here[0]
    assert got[str(gone)] == (0, 0)  # a switch that is not running reads nothing
    mon = monitor.FidelityMonitor({}, time.monotonic(), period_s=0.05,
                                  remote={"switch t1-0-0": (Here(), str(pid_file))})
    try:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:  # run, so that the watched process is scheduled
            sum(range(1000))
    finally:
        mon.stop()
    assert any(label == "switch t1-0-0" for _, label, *_ in mon.samples)
