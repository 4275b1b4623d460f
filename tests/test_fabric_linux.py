"""The default fabric on the linux data plane (kernel IPv6 routes and the tc eBPF uN SID in namespaces)."""

import subprocess

import pytest
from mrclab.controller import kernel_routes
from mrclab.controller.fabric import Fabric, FabricError
from mrclab.controller.pathprobe import implicate, probe_paths
from mrclab.emulation.network import EmulationError
from mrclab.topologies.spec import load_spec

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def fabric():
    with Fabric(load_spec(), "linux") as fab:
        yield fab


def test_every_path_delivers_through_the_switches_its_address_names(fabric):
    results = probe_paths(fabric.plan, fabric.netns, count_packets=fabric.switch_packets)
    assert len(results) == 80 + 4 * 4 * 3  # every pair path, plus T0 and T1 loops per host and plane
    assert all(r.delivered for r in results), [r.problem for r in results if not r.delivered][:5]
    for r in results:
        # the uN SID counters moved on exactly the switches of the path, T1 included
        assert r.evidence == {sw: r.path.hops.count(sw) for sw in r.path.hops}, (r.path, r.evidence)
    assert {r.path.t1 for r in results if r.path.t1 is not None} == {0, 1}


def test_read_back_equals_route_plan_and_reapply_is_idempotent(fabric):
    fabric.verify()
    e = fabric.routes["t1-0-0"]
    ns = fabric.netns("t1-0-0")
    before = kernel_routes.read_back(ns, fabric.routes.block)
    kernel_routes.apply(ns, e, fabric.routes.block)
    after = kernel_routes.read_back(ns, fabric.routes.block)
    assert [r.key() for r in before] == [r.key() for r in after]


def test_stale_route_is_removed_by_reapply(fabric):
    ns = fabric.netns("t1-1-0")
    subprocess.run(["ip", "-n", ns, "-6", "route", "add", "fcbb:bb00:9999::/48", "via", "fe80::1",
                    "dev", "t1-1-0-eth1"], check=True)
    with pytest.raises(kernel_routes.RouteError, match="unexpected"):
        fabric.verify()
    kernel_routes.apply(ns, fabric.routes["t1-1-0"], fabric.routes.block)
    fabric.verify()


def test_blackholed_t1_fails_exactly_its_paths(fabric):
    fabric.blackhole("t1-2-1", True)
    try:
        results = probe_paths(fabric.plan, fabric.netns, timeout_s=0.5)
    finally:
        fabric.blackhole("t1-2-1", False)
    failed = {(r.path.src, r.path.dst, r.path.plane, r.path.t1) for r in results if not r.delivered}
    expected = {(p.src, p.dst, p.plane, p.t1) for p in fabric.plan.all_paths(loops=True) if "t1-2-1" in p.hops}
    assert failed == expected and len(expected) == 8 + 4  # 8 pair paths and each host's loop via it
    assert implicate(results) == [("t1-2-1", 12)]
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns))


def test_cut_link_is_implicated(fabric):
    fabric.set_link("t0-3-0", "t1-3-0", up=False)
    try:
        results = probe_paths(fabric.plan, fabric.netns, timeout_s=0.5)
    finally:
        fabric.set_link("t0-3-0", "t1-3-0", up=True)
    bad = [r for r in results if not r.delivered]
    assert bad and all("t0-3-0" in r.path.hops[:1] + r.path.hops[2:] and "t1-3-0" in r.path.hops for r in bad)
    assert implicate(results) == [("t0-3-0:t1-3-0", len(bad))]
    fabric.verify()  # a port going down must not take the SID or routes with it... after it is back
    assert all(r.delivered for r in probe_paths(fabric.plan, fabric.netns))


def test_a_fault_on_an_unknown_switch_is_refused(fabric):
    with pytest.raises(FabricError, match="unknown switch"):
        fabric.blackhole("t9-0-0", True)


def test_second_fabric_is_refused_while_one_runs(fabric):
    other = Fabric(load_spec(), "linux")
    try:
        with pytest.raises(EmulationError, match="already running"):
            other.start()
    finally:
        other.stop()
    assert fabric.emu.state is not None  # the first one is untouched


def test_each_interface_s_received_frames_go_to_one_cpu_the_interfaces_dealt_round_the_cpus(fabric):
    """A path stays a FIFO only if each of its interfaces queues what it receives on one CPU's
    backlog (emulation/kernel.py ``steer_rx_script``): every host and switch port has a one-CPU RPS
    mask, and the ports together use every CPU this process may run on."""
    import os

    masks = {}
    for node in fabric.spec.hosts() + fabric.spec.switches():
        out = subprocess.run(["ip", "netns", "exec", fabric.netns(node), "sh", "-c",
                              f"for f in /sys/class/net/{node}-eth*/queues/rx-0/rps_cpus; do echo $f $(cat $f); done"],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            path, mask = line.split()
            masks[path.split("/")[4]] = int(mask.replace(",", ""), 16)
    assert len(masks) == 2 * fabric.spec.n_links, len(masks)
    assert all(m and m & (m - 1) == 0 for m in masks.values()), masks  # exactly one CPU each
    assert {m.bit_length() - 1 for m in masks.values()} == set(os.sched_getaffinity(0))


def test_a_thread_entering_a_namespace_comes_back_to_its_own_whatever_other_threads_do(tmp_path):
    """kernel.inside moves only the calling thread, and back to that thread's namespace: two
    threads entering two namespaces at once each come back home, and neither ends in the other's
    (pyroute2's pushns saved the main thread's namespace on one stack for the process: a thread
    entering while the main thread was inside another came back to the main thread's). The
    netlink reader works from any thread, each on a socket of its own inside the namespace."""
    import os
    import threading
    import time

    from mrclab.emulation import kernel

    names = [f"mrclabtst{os.getpid()}{i}" for i in range(2)]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        subprocess.run(["ip", "-n", names[0], "link", "add", "only0", "type", "veth", "peer", "name", "only0b"],
                       check=True)
        home = os.readlink("/proc/thread-self/ns/net")
        seen: dict[str, tuple[str, str]] = {}
        go = threading.Barrier(3)

        def enter(n: str) -> None:
            go.wait()
            for _ in range(50):
                with kernel.inside(n):
                    inner = os.readlink("/proc/thread-self/ns/net")
                    time.sleep(0.001)
            seen[n] = (inner, os.readlink("/proc/thread-self/ns/net"))

        threads = [threading.Thread(target=enter, args=(n,)) for n in names]  # started at home
        for t in threads:
            t.start()
        with kernel.inside(names[1]):  # the main thread elsewhere while the threads come and go
            go.wait()
            for t in threads:
                t.join()
        assert os.readlink("/proc/thread-self/ns/net") == home
        assert seen[names[0]][0] != seen[names[1]][0] and home not in (seen[names[0]][0], seen[names[1]][0])
        assert seen[names[0]][1] == seen[names[1]][1] == home  # each back in its own, not the main thread's
        nl = kernel.QdiscBacklog(names[0])
        got: list = []
        t = threading.Thread(target=lambda: got.append(nl.ifindex("only0")))
        t.start()
        t.join()
        assert got and got[0] == nl.ifindex("only0")
        nl.close()
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], check=False)


def test_a_netlink_reader_closed_from_another_thread_lets_its_namespace_go(tmp_path):
    """A reader opened by one thread (the port sampler's) and closed by another (the fabric's
    stop) holds no socket in the namespace after: the namespace goes with its name, and its
    VXLAN port's VNI is free for the next run at once. pyroute2 0.9's IPRoute closed only the
    calling thread's socket: the opener's stayed open as long as that thread lived, and held the
    namespace with its VXLAN port and VNI."""
    import os
    import threading
    import time

    from mrclab.emulation import kernel

    ns, vni = f"mrclabtst{os.getpid()}v", 4000 + os.getpid() % 1000
    vxlan = ["type", "vxlan", "id", str(vni), "remote", "198.18.255.1", "dstport", "4789"]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    done, t = threading.Event(), threading.Thread()
    try:
        subprocess.run(["ip", "link", "add", "mrclabvx0", "netns", ns, *vxlan], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "mrclabvx0", "root", "tbf",
                        "rate", "1mbit", "burst", "5k", "latency", "10ms"], check=True)
        nl = kernel.QdiscBacklog(ns)
        got: list = []

        def sample() -> None:  # the port sampler: reads, then lives on past the reader's close
            got.append((nl.ifindex("mrclabvx0"), nl.backlogs(), nl.qlen("mrclabvx0", "tbf"),
                        nl.qlen("mrclabvx0", "htb")))
            done.wait(10)

        t = threading.Thread(target=sample)
        t.start()
        try:
            while not got and t.is_alive():
                time.sleep(0.01)
            idx, queued, tbf, htb = got[0]
            assert queued[(idx, kernel.TC_H_ROOT)] == (0, 0, 0) and tbf == htb == 0
            nl.close()  # from this thread, the opener still alive
        finally:
            subprocess.run(["ip", "netns", "del", ns], check=False)
        deadline, err = time.monotonic() + 5.0, ""
        while time.monotonic() < deadline:  # a namespace's devices go in the kernel's cleanup, soon after
            r = subprocess.run(["ip", "link", "add", "mrclabvx1", *vxlan], capture_output=True, text=True)
            if r.returncode == 0:
                subprocess.run(["ip", "link", "del", "mrclabvx1"], check=False)
                break
            err = r.stderr.strip()
            time.sleep(0.1)
        else:
            pytest.fail(f"the VNI stayed taken 5 s after its namespace was deleted: {err}")
    finally:
        done.set()
        if t.is_alive():
            t.join()
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_delete_links_removes_each_port_and_passes_over_what_is_gone():
    """kernel.delete_links (a run's VXLAN ports at stop): each named port goes; a port or a
    namespace already gone is no error."""
    import os

    from mrclab.emulation import kernel

    ns = f"mrclabtst{os.getpid()}d"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "dl0", "type", "veth", "peer", "name", "dl1"], check=True)
        subprocess.run(["ip", "-n", ns, "link", "add", "dl2", "type", "veth", "peer", "name", "dl3"], check=True)
        kernel.delete_links(None, [(ns, "dl0"), (ns, "nosuch"), (f"{ns}gone", "dl2")])
        left = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True).stdout
        assert "dl0" not in left and "dl1" not in left  # the pair went with its end
        assert "dl2" in left  # not named in its own namespace: untouched
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
