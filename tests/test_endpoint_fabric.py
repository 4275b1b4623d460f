"""The MRC endpoint processes on the default linux fabric: a 16 MiB write across T0 groups, with
and without failures; the RoCE-style baseline on a healthy and on a cut path."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mrclab.controller.fabric import Fabric
from mrclab.topologies.addressing import ev_plane, ev_t1
from mrclab.topologies.spec import load_spec
from mrclab.traffic import contract as C
from mrclab.traffic.settings import TransportSettings

pytestmark = pytest.mark.root
MIB16 = 16 << 20


@pytest.fixture(scope="module")
def fabric():
    with Fabric(load_spec(), "linux") as fab:
        yield fab


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


class Transfer:
    """h0 writes ``size`` bytes to h2 (one message) with endpoint processes in the namespaces."""

    def __init__(self, fab, tmp: Path, transport="mrc", size=MIB16, settings=None, src="h0", dst="h2",
                 duration_s=None):
        self.fab, self.tmp, self.src, self.dst = fab, tmp, src, dst
        topo = tmp / "fabric.yaml"
        topo.write_text(yaml.safe_dump(fab.spec.to_dict()))
        st = TransportSettings(**{"region_bytes": max(size + 4096, 1 << 20), **(settings or {})})
        self.procs = {}
        qp = C.QpConfig(qp=1, peer=dst, message_bytes=size, count=1)
        if duration_s is not None:  # unbounded messages for duration_s
            qp = C.QpConfig(qp=1, peer=dst, message_bytes=size, duration_s=duration_s)
        for host, qps in ((dst, ()), (src, (qp,))):
            cfg = C.EndpointConfig(topo=str(topo), host=host, seed=11, transport=transport, settings=st, qps=qps,
                                   telemetry_path=str(tmp / f"{host}.jsonl"), telemetry_interval_s=0.05)
            (tmp / f"{host}.json").write_text(cfg.to_json())
            self.procs[host] = fab.emu.popen(host, [sys.executable, "-m", "mrclab.traffic.endpoint", "--config",
                                                    str(tmp / f"{host}.json")],
                                             stdout=subprocess.DEVNULL, stderr=open(tmp / f"{host}.err", "w"))
            if host == dst:  # the receiver's sockets must be open before the first packet
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and '"start"' not in _read(tmp / f"{host}.jsonl"):
                    time.sleep(0.05)
        self.t0 = time.monotonic()

    def wait(self, timeout: float) -> bool:
        try:
            self.procs[self.src].wait(timeout=timeout)
            return self.procs[self.src].returncode == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.terminate()
                    p.wait(timeout=10)

    def wait_acked(self, timeout: float = 20.0) -> None:
        """Blocks until the sender has some data acknowledged (the transfer is under way)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            samples = [r for r in self.records(self.src) if isinstance(r, C.Sample) and r.tx]
            if samples and samples[-1].tx[0].stats.bytes_acked > 0:
                return
            time.sleep(0.05)
        raise AssertionError("the transfer did not start")

    def records(self, host) -> list:
        return [r.rec for r in C.read_telemetry(self.tmp / f"{host}.jsonl")]

    def summary(self, host) -> C.Summary:
        return [r for r in self.records(host) if isinstance(r, C.Summary)][-1]

    def rx(self, host="h2") -> C.RxQp:
        """The receiving QP of ``host`` in its summary (one QP from h0)."""
        return next(q for q in self.summary(host).rx if (q.src, q.qp) == (self.src, 1))

    def tx(self, host="h0") -> C.TxQp:
        return next(q for q in self.summary(host).tx if q.qp == 1)

    def last_tx(self, host="h0") -> C.TxQp:
        return [r for r in self.records(host) if isinstance(r, C.Sample)][-1].tx[0]

    def events(self, host, kind):
        return [r for r in self.records(host) if isinstance(r, C.Event) and r.kind == kind]


def test_16mib_write_arrives_intact_over_every_plane_and_every_t1(fabric, tmp_path):
    before = fabric.switch_packets(fabric.spec.t1s())
    t = Transfer(fabric, tmp_path)
    assert t.wait(120), (tmp_path / "h0.err").read_text()[-2000:]
    rx = t.rx()
    assert rx.messages_delivered == 1 and rx.messages_corrupt == 0 and rx.delivered_bytes >= MIB16
    assert t.tx().stats.bytes_acked == MIB16
    after = fabric.switch_packets(fabric.spec.t1s())
    moved = {s: after[s] - before[s] for s in fabric.spec.t1s()}
    assert all(n > 20 for n in moved.values()), str(sorted(moved.items()))  # every plane, every T1


def test_t0_t1_link_down_mid_transfer_retires_its_evs_and_the_rest_carry_on(fabric, tmp_path):
    t = Transfer(fabric, tmp_path, size=4 << 20, duration_s=6.0)
    t.wait_acked()
    fabric.set_link("t0-1-0", "t1-1-0", up=False)
    try:
        assert t.wait(180), (tmp_path / "h0.err").read_text()[-2000:]
    finally:
        fabric.set_link("t0-1-0", "t1-1-0", up=True)
    rx = t.rx()
    assert rx.messages_delivered >= 2 and rx.messages_corrupt == 0
    assert rx.messages_delivered == t.tx().stats.messages_acked
    evs = t.tx().evs
    through = {ev: s for ev, s in evs.items() if ev_plane(ev) == 1 and ev_t1(ev) == 0}
    others = {ev: s for ev, s in evs.items() if not (ev_plane(ev) == 1 and ev_t1(ev) == 0)}
    bad = {e.ev for e in t.events("h0", "ev_state") if e.new == "ASSUMED_BAD"}
    assert through and set(through) <= bad | {ev for ev, s in through.items() if s == "GOOD" and False}
    assert all(s == "ASSUMED_BAD" for s in through.values()), through
    assert sum(1 for s in others.values() if s == "GOOD") >= len(others) - 2  # the rest carry on


def test_host_port_down_makes_the_peer_stop_using_that_plane(fabric, tmp_path):
    # 4 MiB messages for 8 s: the sender is still busy whatever this machine's speed
    t = Transfer(fabric, tmp_path, size=4 << 20, duration_s=8.0)
    t.wait_acked()
    fabric.set_link("h2", "t0-3-1", up=False)  # the receiver's plane-3 port
    try:
        time.sleep(2.0)
        planes = t.events("h0", "plane")
        assert any(e.plane == 3 and e.up is False for e in planes), planes
        s1 = t.last_tx()
        time.sleep(1.0)
        s2 = t.last_tx()
        grew = s2.stats.data_packets - s1.stats.data_packets
        assert grew > 0  # still sending, on the other planes
    finally:
        fabric.set_link("h2", "t0-3-1", up=True)
    assert t.wait(180)
    # once down, once back: SACKs overtaken by newer ones on other paths do not flip it again
    assert [e.up for e in t.events("h0", "plane") if e.plane == 3] == [False, True]
    rx = t.rx()
    assert rx.messages_delivered >= 2 and rx.messages_corrupt == 0
    assert rx.messages_delivered == t.tx().stats.messages_acked


def test_baseline_completes_on_a_healthy_path_and_stalls_when_its_path_is_cut(fabric, tmp_path):
    from mrclab.topologies.addressing import AddressPlan
    from mrclab.traffic.roce import ecmp_ev

    ok = Transfer(fabric, tmp_path / "ok" if (tmp_path / "ok").mkdir() is None else None, transport="roce",
                  size=4 << 20)
    assert ok.wait(120)
    assert ok.rx().messages_delivered == 1

    ev = ecmp_ev(AddressPlan(fabric.spec), "h0", "h2", 1, 11)
    plane, t1 = ev_plane(ev), ev_t1(ev)
    (tmp_path / "cut").mkdir()
    cut = Transfer(fabric, tmp_path / "cut", transport="roce", size=64 << 20)
    time.sleep(0.5)
    fabric.set_link(f"t0-{plane}-0", f"t1-{plane}-{t1}", up=False)
    try:
        time.sleep(1.0)
        a = cut.last_tx().stats.bytes_acked
        time.sleep(1.5)
        b = cut.last_tx().stats.bytes_acked
        assert a == b < 64 << 20  # one path, cut: no progress
        assert cut.events("h0", "timeout")  # its timer keeps firing
    finally:
        fabric.set_link(f"t0-{plane}-0", f"t1-{plane}-{t1}", up=True)
    assert cut.wait(180)  # and it completes once the path is back


def test_an_endpoint_counts_the_frames_its_full_sockets_dropped():
    """A packet socket nobody reads, with a small receive buffer: the frames the kernel could not
    queue are what the endpoint reports (PACKET_STATISTICS, summed over its sockets, kept across
    reads, which reset the kernel's count); a socket that was read dropped none."""
    import socket
    from types import SimpleNamespace

    from mrclab.traffic.endpoint import Endpoint

    full = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    read = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        full.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for s in (full, read):
            s.bind(("lo", 0))
            s.setblocking(False)
        ep = SimpleNamespace(socks={0: full}, socket_drops=0)
        assert Endpoint._socket_drops(ep) == 0  # what came before is read away
        for _ in range(200):
            udp.sendto(bytes(1000), ("127.0.0.1", 9))  # seen twice on lo: out and in
        first = Endpoint._socket_drops(ep)
        assert first > 100
        assert Endpoint._socket_drops(ep) == first  # the kernel's count reset, the endpoint's kept
        def drain():
            while True:
                try:
                    read.recv(2048)
                except BlockingIOError:
                    return

        drain()  # it was not read during the burst above either: start from an empty socket
        quiet = SimpleNamespace(socks={0: read}, socket_drops=0)
        Endpoint._socket_drops(quiet)
        quiet.socket_drops = 0
        for _ in range(20):
            udp.sendto(bytes(1000), ("127.0.0.1", 9))
            drain()
        assert Endpoint._socket_drops(quiet) == 0
    finally:
        for s in (full, read, udp):
            s.close()
