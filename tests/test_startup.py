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

    def __init__(self, host: str, every_s: float, end: float) -> None:
        import socket as _socket
        from types import SimpleNamespace

        self.host, self.every_s, self.end = host, every_s, end
        self.peer, mine = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        mine.setblocking(False)
        self.socks = {0: mine}
        self.cfg = SimpleNamespace(start_at_wall=time.time(), go_path=None)
        self.t0_wall = time.time()
        self.tel = SimpleNamespace(write=lambda _rec: None)
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
