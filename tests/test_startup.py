"""Start-up is a barrier, not a race: the runner waits until every endpoint says it is ready (its
``start`` record), then fixes t = 0 for all of them; an endpoint that is slow to start delays t = 0
instead of missing it, and one that never gets ready is this machine's limit (exit 3), not a
failed run."""

import subprocess
import sys
import threading
import time

import pytest
from mrclab.experiments.run import endpoints
from mrclab.traffic import contract as C


def _ready(path, host="h0"):
    path.write_text(C.encode(C.Start(host, "mrc", (1,))) + "\n")


def _sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_a_slow_endpoint_moves_t0_instead_of_missing_it(tmp_path):
    procs = {"h0": _sleeper(5), "h1": _sleeper(5)}
    try:
        _ready(tmp_path / "h0.telemetry.jsonl", "h0")
        late = threading.Timer(1.5, _ready, (tmp_path / "h1.telemetry.jsonl", "h1"))
        late.start()
        waited = endpoints.wait_ready(procs, tmp_path, bound_s=10)
        assert 1.4 < waited < 5
        before = time.time()
        t0 = endpoints.go(tmp_path)
        assert float((tmp_path / endpoints.GO_FILE).read_text()) == t0 >= before + endpoints.GO_LEAD_S - 0.01
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_endpoints_never_ready_are_this_machine_s_limit_exit_3(tmp_path):
    procs = {"h0": _sleeper(5), "h1": _sleeper(5)}
    try:
        _ready(tmp_path / "h0.telemetry.jsonl", "h0")
        with pytest.raises(endpoints.EndpointsNotReady, match=r"endpoints h1 not ready after .* this machine") as e:
            endpoints.wait_ready(procs, tmp_path, bound_s=0.5)
        assert e.value.exit_code == 3
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_an_endpoint_that_exits_before_it_is_ready_is_a_failed_run(tmp_path):
    procs = {"h0": subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])}
    procs["h0"].wait()
    with pytest.raises(endpoints.EndpointDied, match="endpoint on h0 exited with 2 before starting") as e:
        endpoints.wait_ready(procs, tmp_path, bound_s=5)
    assert e.value.exit_code == 2


def test_the_bound_grows_with_endpoints_per_core():
    assert (endpoints.ready_bound_s(10, cores=2) > endpoints.ready_bound_s(4, cores=2)
            > endpoints.ready_bound_s(4, cores=8))
    # the 10-host incast on 2 cores: 10 x 0.8 CPU-s of imports is 4 s of wall time at best
    assert endpoints.ready_bound_s(10, cores=2) >= 4 * 0.8 * 10 / 2


def test_the_endpoint_waits_for_the_go_and_takes_t0_from_it(tmp_path):
    from mrclab.traffic.endpoint import Endpoint, _wait_for_go

    ep = Endpoint.__new__(Endpoint)
    ep.stop_requested = False
    go = tmp_path / "go"
    threading.Timer(0.3, lambda: go.write_text("1234.5")).start()
    t = time.monotonic()
    assert _wait_for_go(str(go), [ep]) == 1234.5 and time.monotonic() - t >= 0.25


def test_hosts_share_endpoint_processes_only_beyond_two_per_core():
    hosts = [f"h{i}" for i in range(10)]
    assert endpoints.process_groups(hosts[:4], cores=2) == [["h0"], ["h1"], ["h2"], ["h3"]]
    groups = endpoints.process_groups(hosts, cores=2)
    assert groups == [["h0", "h4", "h8"], ["h1", "h5", "h9"], ["h2", "h6"], ["h3", "h7"]]
    assert sorted(h for g in groups for h in g) == sorted(hosts)  # each host served exactly once
    assert len(endpoints.process_groups(hosts, cores=8)) == 10
    # a scenario whose hosts' processes starved each other asks for one process per core
    assert endpoints.process_groups(hosts[:8], cores=2, per_core=1) == [["h0", "h2", "h4", "h6"],
                                                                         ["h1", "h3", "h5", "h7"]]
    assert endpoints.process_groups(hosts[:4], cores=2, per_core=1) == [["h0"], ["h1"], ["h2"], ["h3"]]


def test_processes_are_labelled_by_the_hosts_they_serve():
    a, b = _sleeper(5), _sleeper(5)
    try:
        assert endpoints.processes({"h0": a, "h1": b, "h4": a}) == {"h0+h4": a, "h1": b}
    finally:
        a.kill(), b.kill(), a.wait(), b.wait()


def test_an_endpoint_given_configs_without_their_namespaces_says_so():
    r = subprocess.run([sys.executable, "-m", "mrclab.traffic.endpoint", "--config", "a.json", "--config", "b.json"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == "endpoint: 2 configs need 1 --netns (one for every config after the first), got 0"


class _FakeHost:
    """A stand-in for traffic.endpoint.Endpoint in run_group: one socket (a socketpair's end),
    a deadline every ``every_s`` (inf: none), finished at ``end``; counts its turns."""

    def __init__(self, host: str, every_s: float, end: float, work_s: float = 0.0) -> None:
        import socket as _socket
        from types import SimpleNamespace

        self.host, self.every_s, self.end, self.work_s = host, every_s, end, work_s
        self.peer, mine = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        mine.setblocking(False)
        self.socks = {0: mine}
        self.cfg = SimpleNamespace(start_at_wall=time.time(), go_path=None)
        self.t0_wall = time.time()
        self.tel = SimpleNamespace(write=lambda _rec: None, flush=lambda: None)
        self.stack = SimpleNamespace(transport="mrc")
        self.flows: list = []
        self.stop_requested = self.finished = False
        self.loop_gap_max_s = 0.0
        self.turns = self.frames = 0
        self.next = 0.0

    def socks_by_fd(self):
        return {sk.fileno(): sk for sk in self.socks.values()}

    def open(self) -> None:
        pass

    def begin(self, _t0_wall: float) -> None:
        self.end += time.monotonic()

    def turn(self, now: float, ready=()) -> int:
        self.turns += 1
        spin = time.monotonic() + (self.work_s if now >= self.next else 0.0)  # its own work at each deadline
        while time.monotonic() < spin:
            pass
        moved = 0
        for _fd in ready:
            while True:
                try:
                    self.socks[0].recv(64)
                except BlockingIOError:
                    break
                moved += 1
        self.frames += moved
        if now >= self.next:
            self.next = now + self.every_s
        self.finished = now >= self.end
        return moved

    def due(self, now: float) -> float:
        return min(self.next, self.end)

    def finish(self, share: int = 1) -> None:
        self.peer.close()
        self.socks[0].close()


def test_one_process_turns_only_the_hosts_a_wake_up_is_for():
    """Two hosts in one endpoint process: h0 has a deadline every 5 ms, h1 none (it waits for
    frames). h1 is turned for its three frames and its own end, not at each of h0's ~80 wake-ups."""
    from mrclab.traffic.endpoint import run_group

    busy, idle = _FakeHost("h0", 0.005, 0.4), _FakeHost("h1", float("inf"), 0.4)

    def send_frames():
        for _ in range(3):
            time.sleep(0.1)
            idle.peer.send(b"frame")

    t = threading.Thread(target=send_frames)
    t.start()
    assert run_group([busy, idle]) == 0
    t.join()
    assert idle.frames == 3
    assert busy.turns >= 40  # its deadlines were kept (0.4 s at 5 ms)
    assert idle.turns <= 3 * 2 + 3, idle.turns  # each frame's turn and the one after, the start, the end


def test_a_host_behind_another_hosts_long_turns_reads_them_as_late_timers_and_its_own_never():
    """Two hosts in one process, each with a deadline every 5 ms: h0's turns take 30 ms of its own
    work. h1 waits behind them (on separate machines it would not): its timers fire about 30 ms
    late, and it says so. h0's own work is its transport's cost: its lateness stays small."""
    from mrclab.traffic.endpoint import run_group

    slow, other = _FakeHost("h0", 0.005, 0.5, work_s=0.03), _FakeHost("h1", 0.005, 0.5)
    assert run_group([slow, other]) == 0
    assert other.loop_gap_max_s >= 0.025, other.loop_gap_max_s
    assert slow.loop_gap_max_s < 0.015, slow.loop_gap_max_s



def _bare_endpoint(recv, delay_s: float = 0.0):
    """A traffic.endpoint.Endpoint with nothing but what :meth:`turn` reads: one port whose frames
    come from ``recv`` (recv_into's stand-in), a stack that records the clock it is given with
    each frame, no flows, no port polls or telemetry due."""
    from collections import deque
    from types import SimpleNamespace

    from mrclab.traffic.endpoint import Endpoint

    ep = Endpoint.__new__(Endpoint)
    got: list[float] = []
    ep.stack = SimpleNamespace(on_frame=lambda _f, now: got.append(now) or [], poll=lambda now, active=None: [],
                               set_local_ports=lambda _s: None, wake=lambda: None)
    ep.flows, ep.coll, ep.cfg = [], None, SimpleNamespace(collective=None, telemetry_interval_s=1.0,
                                                          receiver_linger_s=1.0)
    ep.mono0 = time.monotonic()
    ep.next_ports = ep.next_tel = float("inf")
    ep.delay_s, ep._line = delay_s, deque()
    ep._recv, ep.backlog, ep._send_fn, ep._data_fn, ep.stamped = {3: recv}, {}, {}, {}, {}
    ep.started, ep.stopped, ep.finished_at, ep.finished, ep.max_end = set(), set(), None, False, 10.0
    ep._active, ep.coll_started = None, False
    return ep, got


def test_a_frame_read_late_in_a_turn_is_stamped_when_read_not_when_the_turn_began():
    """A turn reads its sockets dry; a frame that came while it ran (here: 20 ms after its start,
    the machine holding the loop) stamped with the turn's start would read an RTT 20 ms shorter
    than its path's, and NSCC's base RTT (the least sample) would keep it for good."""
    frames = iter([0.0, 0.02])

    def recv(_buf):
        try:
            pause = next(frames)
        except StopIteration:
            raise BlockingIOError from None
        time.sleep(pause)
        return 64

    for delay in (0.0, 0.005):
        frames = iter([0.0, 0.02])
        ep, got = _bare_endpoint(recv, delay)
        now = time.monotonic()
        assert ep.turn(now, [3]) == 2
        stamps = got if not delay else [t for t, _ in ep._line]
        assert stamps[1] - stamps[0] >= 0.02, (delay, stamps)  # the second as it was read
        assert all(s >= now + delay for s in stamps)
