"""Priority flow control for the RoCE baseline's lossless class, on the linux data plane: a pause
agent in the controller that watches every lossless port's queue and pauses the ports that feed it.

The paper's RoCE runs on a lossless fabric (IEEE 802.1Qbb PFC): a switch whose buffer for traffic
that came in on a port passes XOFF sends that port's upstream neighbour a PAUSE for the priority,
which stops sending it until an XON (a pause of zero quanta) below XON. Pauses spread: a paused
port's own queue fills and pauses its upstream, hop by hop back to the senders, and a flow that
shares any paused link with the congestion waits behind it (the victim of the paper's fig. 18).

The emulation (one :class:`PauseAgent` thread per fabric, every :data:`PERIOD_S`):

* **What is watched.** Each lossless switch port's low-priority queue (the tc eBPF program's
  virtual queue, drained up to now at the port's rate, bpfsrc/port_queue.bpf.c): the program
  drops nothing for a full queue there, and records which ports of the switch fed it since the
  agent last looked (``pfc.feeds``).
* **XOFF.** A queue at or above ``xoff`` packets pauses every port that fed it: the upstream
  neighbour's egress towards this switch. A switch's port is paused by setting its low class's
  tbf to :data:`PAUSED_RATE` (the real queue stops; trimmed and control packets, in the high class,
  still pass, as PFC pauses one priority) and marking it paused in its program's ``pfc`` map (its
  virtual queue stops draining, so it fills and pauses its own feeders in turn: pause spreading). A
  host's NIC port is paused by setting its ``tbf`` shaper to :data:`PAUSED_RATE`: the NIC's queue
  fills and the endpoint keeps what the port will not take (traffic/endpoint.py, ENOBUFS). The
  lever is a tbf in both places (on a lossless switch port, the leaf of its low htb class): tbf
  starts afresh when its rate changes, where htb keeps the debt of a packet it charged at the
  paused rate (one frame at 8 bit/s: twenty minutes of silence after the pause ends; seen as a
  victim flow that never recovered).
* **XON.** Once the queue is at or below ``xon`` packets, the ports it paused resume (a port paused
  by several queues resumes when the last of them releases it).
* **Counters.** Per paused port: pauses received and time spent paused (``pauses``, ``pause_s``;
  switch ports in the switch samples and ``switches.csv``).

How it differs from 802.1Qbb: PFC accounts the buffer per *ingress* port and pauses that port's
neighbour only; the agent watches *egress* queues and pauses every port that fed the queue since
it was last empty (an upper bound on the ports that did: the same queues fill, the same links are
paused, sooner or later by a few packets). A PAUSE frame takes a link's propagation delay; the
agent reacts within its period plus a ``tc`` call (about 3 ms here): at the lab's rates (a
packet every 1-10 ms on a port) that is the microseconds PFC has at 400 Gb/s. The headroom (what
arrives between XOFF and the pause taking hold) is held by the real queue, whose tbf holds
``HEADROOM_FACTOR`` (controller/queues.py) times the queue limit on lossless ports; packets the
agent is too slow for would be dropped there, silently (tests/test_pfc.py checks every message of
its incast arrived intact). Only the linux data plane has it so far: on bmv2 the RoCE baseline
runs lossy.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from mrclab.controller.bpf import tbf_leaf
from mrclab.topologies import kernel
from mrclab.topologies.spec import is_host

#: How often the agent looks at the lossless queues (s): a packet every 1-10 ms on a lab port.
PERIOD_S = 0.001
#: A paused port's rate: htb and tbf need a rate above 0; one frame takes minutes at this one.
PAUSED_RATE = "8bit"


@dataclass
class PauseCounter:
    """One port's pauses: how many it was sent (``pauses``), the time it spent paused so far
    (``paused_s``), since when it is paused now (monotonic s, None: running) and by how many
    congested queues (a port resumes when the last releases it)."""

    pauses: int = 0
    paused_s: float = 0.0
    since: float | None = None
    holds: int = 0

    def total_s(self, now: float) -> float:
        """Time paused up to ``now`` (monotonic s), the pause in force included."""
        return self.paused_s + (now - self.since if self.since is not None else 0.0)


class PauseAgent:
    """Pauses and resumes ports of a running linux fabric ``fab`` (controller.fabric.Fabric) as its
    lossless queues pass XOFF and fall to XON (module docstring). ``start`` runs it in a thread of
    its own; ``stop`` resumes every port it paused."""

    def __init__(self, fab, period_s: float = PERIOD_S) -> None:
        """The agent of ``fab``'s lossless ports (those whose queue plan says ``lossless``)."""
        self.fab, self.period_s = fab, period_s
        self.watched = sorted((sw, port) for (sw, port), q in fab.queues.items() if q.lossless)
        #: (node, port or plane) -> its counter; a switch's port by number, a host's NIC port by plane
        self.counters: dict[tuple[str, int], PauseCounter] = {}
        self._held: dict[tuple[str, int], set[tuple[str, int]]] = {}  # congested queue -> ports it paused
        #: queue -> the ports of its switch that fed it since it was last empty (bit n: port n): a
        #: feeder sends a packet every few ms, far less often than the agent looks
        self._fed: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        """Run the agent in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="mrclab-pfc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and resume every port still paused."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for key in list(self._held):
            self._release(key)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.step()
            except Exception as e:  # a switch restarting or a namespace going: the next turn will do
                self.errors.append(f"{type(e).__name__}: {e}")

    def step(self) -> None:
        """One look at every lossless queue: pause the feeders of those at or above XOFF, resume
        those of queues at or below XON."""
        for sw, port in self.watched:
            prog = self.fab.bpf.get(sw)
            if prog is None:
                continue
            q = self.fab.queues[(sw, port)]
            intf = f"{sw}-eth{port}"
            depth = prog.queue_now(intf, q.rate_pps)
            key = (sw, port)
            fed = self._fed[key] = self._fed.get(key, 0) | prog.pfc_feeds(intf)
            if key in self._held and depth <= q.xon:
                self._release(key)
            elif depth >= q.xoff or key in self._held:
                # XOFF: pause every port that fed the queue; while it stays above XON, any port
                # that starts feeding it (one resumed by another queue) is paused too
                held = self._held.setdefault(key, set())
                for n in self.fab.plan.ports(sw):
                    if fed >> n & 1 and (sw, n) not in held:
                        held.add((sw, n))
                        self._hold((sw, n))
            if depth < 1 and key not in self._held:
                self._fed[key] = 0

    def _release(self, key: tuple[str, int]) -> None:
        for feeder in self._held.pop(key, set()):
            c = self.counters[self._upstream(*feeder)]
            c.holds -= 1
            if c.holds == 0:
                self._pause(*self._upstream(*feeder), paused=False)

    def _hold(self, feeder: tuple[str, int]) -> None:
        up = self._upstream(*feeder)
        c = self.counters.setdefault(up, PauseCounter())
        c.holds += 1
        c.pauses += 1
        if c.holds == 1:
            self._pause(*up, paused=True)

    def _upstream(self, sw: str, port: int) -> tuple[str, int]:
        """The port that sends into ``sw``'s ``port``: the neighbour's port towards ``sw`` (a host's
        NIC port by its plane)."""
        peer = self.fab.plan.ports(sw)[port]
        if is_host(peer):
            return peer, int(sw.split("-")[1])  # t0-P-G: the host's plane-P port
        return peer, self.fab.plan.port_to(peer, sw)

    def _pause(self, node: str, port: int, paused: bool) -> None:
        """Stop (``paused``) or restart the low-priority traffic ``node`` sends out of ``port``."""
        now = time.monotonic()
        c = self.counters.setdefault((node, port), PauseCounter())
        if paused and c.since is None:
            c.since = now
        elif not paused and c.since is not None:
            c.paused_s += now - c.since
            c.since = None
        link = self.fab.spec.link
        if is_host(node):
            intf = self.fab.plan.host_intf(node, port)
            mbps = link.bandwidth_mbps
            burst = max(3000, int(mbps * 1e6 / 8 / 250))
            rate = PAUSED_RATE if paused else f"{mbps}mbit"
            line = f"qdisc change dev {intf} root tbf rate {rate} burst {burst} limit {link.queue_packets * 1500}"
        else:
            intf = f"{node}-eth{port}"
            q = self.fab.queues[(node, port)]
            line = f"qdisc change dev {intf} parent 1:20 handle 20: {tbf_leaf(None if paused else q.rate_mbps, q.depth)}"
            # the virtual queue holds (or drains again) with the real one
            self.fab.bpf[node].set_paused(intf, paused)
        try:
            kernel.tc_batch(self.fab.emu.netns(node), [line])
        except kernel.KernelError as e:
            self.errors.append(str(e))

    def samples(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, port) -> (pauses received, seconds paused so far) of every port ever paused."""
        now = time.monotonic()
        return {k: (c.pauses, round(c.total_s(now), 4)) for k, c in self.counters.items()}
