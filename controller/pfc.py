"""Priority flow control for the RoCE baseline's lossless class, on both data planes: a pause agent
in the controller that watches every lossless port's queue and pauses the ports that feed it.

The paper's RoCE runs on a lossless fabric (IEEE 802.1Qbb PFC): a switch whose buffer for traffic
that came in on a port passes XOFF sends that port's upstream neighbour a PAUSE for the priority,
which stops sending it until an XON (a pause of zero quanta) below XON. Pauses spread: a paused
port's own queue fills and pauses its upstream, hop by hop back to the senders, and a flow that
shares any paused link with the congestion waits behind it (the victim of the paper's fig. 18).

The emulation (one :class:`PauseAgent` thread per fabric, every :data:`PERIOD_S`):

* **What is watched.** Each lossless switch port's low-priority queue. Linux: the tc eBPF
  program's virtual queue, drained up to now at the port's rate (bpfsrc/port_queue.bpf.c), which
  drops nothing for a full queue there and records which ports of the switch fed it since the
  agent last looked (``pfc.feeds``). bmv2: the ``qocc`` register (packets in BMv2's low-priority
  egress queue, p4src/mrclab.p4) plus what the port's pause lever holds (below), and the
  ``pfc_feeds`` register (bit n: port n fed the queue since it was last empty), both read over
  BMv2's Thrift runtime, one call per register and switch a turn; a lossless route's ``q_limit``
  is the end of its headroom, so the program drops (and counts) only what overflows that.
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
  victim flow that never recovered). **bmv2** cannot pause its own queue: BMv2 stamps each packet
  with its departure time when it is queued (include/bm/bm_sim/queueing.h, ``push_front``), so a
  rate set to (nearly) zero stops neither the packets already queued nor the debt of those queued
  meanwhile, and a rate of 0 means unlimited. The lever is a tbf on the switch's wire instead
  (root qdisc of ``<switch>-eth<port>``, every port that faces a switch): open at
  :data:`OPEN_FACTOR` times the port's rate (BMv2's two priority queues are shaped apart, so its
  port can send up to twice the rate; the tbf never holds a packet while open), at
  :data:`PAUSED_RATE` while paused. BMv2's queue keeps draining into the paused tbf, so that port's
  depth is ``qocc`` plus the tbf's backlog (read over netlink), and pauses spread as on linux. The
  tbf holds both priorities: a paused bmv2 port holds RoCE's ACKs, NACKs and CNPs too, where PFC
  pauses the data priority only (the linux lever pauses the low class alone). A root tbf sets its
  timer for its head packet at the paused rate (minutes away) and a rate change does not reset
  it: a resumed lever with nothing new to send stayed stuck (seen: a flow stopped for good). So
  the agent sends one PFC frame through a resumed lever (:data:`KICK_FRAME`, MAC Control, zero
  quanta: XON), which makes the kernel dequeue; the next switch's MAC consumes it (p4src/mrclab.p4
  drops MAC Control frames uncounted).
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
its incast arrived intact). On bmv2 a turn costs a Thrift call per register and switch (about
0.3 ms each) and a netlink read per port ever paused: about 10 ms for 16 switches, a packet time at
bmv2's rates.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from mrclab.controller.bpf import pfc_look_many, tbf_leaf
from mrclab.controller.thrift import QOCC_REGISTER, ThriftError, session
from mrclab.emulation import kernel
from mrclab.emulation.network import nic_queue_bytes
from mrclab.topologies.spec import is_host

#: How often the agent looks at the lossless queues (s): a packet every 1-10 ms on a lab port.
PERIOD_S = 0.001
#: A paused port's rate: htb and tbf need a rate above 0; one frame takes minutes at this one.
PAUSED_RATE = "8bit"
#: bmv2: a PFC frame (IEEE 802.1Qbb: MAC Control ethertype 0x8808, opcode 0x0101, priority 0
#: enabled, zero quanta: XON), padded to the 60-byte minimum, sent through a resumed lever.
KICK_FRAME = (bytes.fromhex("0180c2000001" "020000000000" "8808" "0101" "0001") + bytes(16)).ljust(60, b"\0")
#: bmv2: the register of which ports fed each lossless queue (p4src/mrclab.p4).
FEEDS_REGISTER = "pfc_feeds"
#: bmv2: an open lever's rate, in times the port's rate (BMv2's two priority queues, each shaped at
#: the port's rate, can send twice it between them).
OPEN_FACTOR = 2


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
    """Pauses and resumes ports of a running fabric ``fab`` (controller.fabric.Fabric) as its
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
        self.side = fab.plane.pfc_side(fab)

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
        self.side.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.step()
            except Exception as e:  # a switch restarting or a namespace going: the next turn will do
                self.errors.append(f"{type(e).__name__}: {e}")

    def step(self) -> None:
        """One look at every lossless queue: pause the feeders of those at or above XOFF, resume
        those of queues at or below XON."""
        self.side.begin(self._held)
        for sw, port in self.watched:
            key = (sw, port)
            look = self.side.look(sw, port, key in self.counters)
            if look is None:  # the switch is down or not answering: the next turn will do
                continue
            q = self.fab.queues[key]
            depth, feeds = look
            fed = self._fed[key] = self._fed.get(key, 0) | feeds
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
        link, frame = self.fab.spec.link, self.fab.emu.frame_bytes
        if is_host(node):
            intf = self.fab.plan.host_intf(node, port)
            mbps = link.bandwidth_mbps
            line = (f"qdisc change dev {intf} root "
                    f"{kernel.tbf(PAUSED_RATE if paused else mbps, nic_queue_bytes(link, frame), frame)}")
        else:
            line = self.side.lever(node, port, paused)
        try:
            kernel.tc_batch(self.fab.emu.netns(node), [line])
            if not paused:
                self.side.resumed(node, intf if is_host(node) else f"{node}-eth{port}")
        except (kernel.KernelError, OSError) as e:
            self.errors.append(str(e))

    def samples(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, port) -> (pauses received, seconds paused so far) of every port ever paused."""
        now = time.monotonic()
        return {k: (c.pauses, round(c.total_s(now), 4)) for k, c in self.counters.items()}


class LinuxSide:
    """The linux plane's switches as the agent sees them: the tc eBPF program's maps, and the tbf
    leaf of a port's low htb class as the lever (module docstring). A switch on a server is read
    there by its queue agent (controller/bpfmaps.py), one request per server a turn, against that
    server's clock."""

    def __init__(self, fab) -> None:
        """The linux side of running fabric ``fab``."""
        self.fab = fab
        self._looks: dict[tuple[str, int], tuple[float, int]] = {}
        self._plan: list | None = None

    def begin(self, held=()) -> None:
        """Read every lossless port's queue now and its feeders (:func:`~controller.bpf.pfc_look_many`):
        the feeders of a queue at or above its XOFF or in ``held`` (the queues the agent holds
        paused), where it acts on them."""
        if self._plan is None:  # which ports of which programs: fixed for the run, built at the first look
            by_switch: dict[str, list[int]] = {}
            for (sw, port), q in self.fab.queues.items():
                if q.lossless and sw in self.fab.bpf:
                    by_switch.setdefault(sw, []).append(port)
            queues = self.fab.queues
            self._plan = [(self.fab.bpf[sw], [((sw, p), f"{sw}-eth{p}", queues[(sw, p)].rate_pps, queues[(sw, p)].xoff)
                                              for p in ports]) for sw, ports in by_switch.items()]
        plan = self._plan
        asks = [(prog, [(intf, rate, xoff, key in held) for key, intf, rate, xoff in ports]) for prog, ports in plan]
        self._looks = {key: got for (_prog, ports), answers in zip(plan, pfc_look_many(asks), strict=True)
                       for (key, *_), got in zip(ports, answers, strict=True)}

    def look(self, sw: str, port: int, ever_paused: bool) -> tuple[float, int] | None:
        """(frames in ``sw``'s ``port`` low-priority queue now, ports that fed it since the last
        look as a bit mask), or None when the switch has no program."""
        return self._looks.get((sw, port))

    def lever(self, sw: str, port: int, paused: bool) -> str:
        """The tc line that pauses or restarts ``sw``'s ``port`` (and its virtual queue with it)."""
        intf = f"{sw}-eth{port}"
        q = self.fab.queues[(sw, port)]
        self.fab.bpf[sw].set_paused(intf, paused)  # the virtual queue holds (or drains again) with the real one
        leaf = tbf_leaf(None if paused else q.rate_mbps, q.depth, self.fab.emu.frame_bytes)
        return f"qdisc change dev {intf} parent 1:20 handle 20: {leaf}"

    def resumed(self, node: str, intf: str) -> None:
        """Nothing to do: htb polls its leaf again."""

    def close(self) -> None:
        """Nothing held."""


def lever_lines(fab) -> list[tuple[str, str]]:
    """bmv2: (namespace, tc line) installing the open lever on every switch port that faces a
    switch (a port a pause can stop: what faces a host feeds no switch queue)."""
    out = []
    for (sw, port), q in sorted(fab.queues.items()):
        if q.lossless and not is_host(q.peer):
            out.append((fab.emu.netns(sw), f"qdisc replace dev {sw}-eth{port} root "
                                           f"{tbf_leaf(OPEN_FACTOR * q.rate_mbps, q.depth, fab.emu.frame_bytes)}"))
    return out


class Bmv2Side:
    """The bmv2 plane's switches as the agent sees them: ``qocc`` and ``pfc_feeds`` over Thrift
    sessions of its own (the fabric's are the samplers'), a paused lever's backlog over netlink,
    and a tbf on the switch's wire as the lever (module docstring). A switch on a server is reached
    through the sockets ssh forwards from its helper there (emulation/cluster.py
    ``SWITCH_HELPER``): Thrift relayed, and on its control socket one ``tc -s`` a turn for every
    lever's backlog of the switch, and the kick frame."""

    def __init__(self, fab) -> None:
        """The bmv2 side of running fabric ``fab``: sessions and sockets open at first use."""
        self.fab = fab
        self.switches = sorted({sw for (sw, _p), q in fab.queues.items() if q.lossless})
        self._thrift: dict = {}  # switch -> SwitchThrift
        self._netlink: dict[str, kernel.QdiscBacklog] = {}  # switch -> netlink inside its namespace
        self._regs: dict[str, tuple[list[int], list[int]]] = {}
        self._kick: dict[tuple[str, str], socket.socket] = {}  # (node, interface) -> AF_PACKET socket
        self._control: dict[str, tuple[socket.socket, TextIO]] = {}  # switch on a server -> its helper's socket, file
        self._qlens: dict[str, dict[str, int]] = {}  # switch on a server -> its levers' backlogs this turn

    def begin(self, held=()) -> None:
        """Read every live lossless switch's ``qocc`` and ``pfc_feeds`` (a switch that does not
        answer is left out this turn, its session dropped: a restarted switch gets a new one);
        ``held`` is not needed here: one Thrift call reads every port's feeds."""
        self._regs.clear()
        self._qlens.clear()
        for sw in self.switches:
            if not self.fab.faults.applied.alive[sw]:
                self._drop(sw)
                continue
            try:
                th = self._thrift.get(sw) or self._thrift.setdefault(sw, session(self.fab.emu, sw))
                self._regs[sw] = (th.register(QOCC_REGISTER), th.register(FEEDS_REGISTER))
            except ThriftError:
                self._drop(sw)

    def _drop(self, sw: str) -> None:
        th = self._thrift.pop(sw, None)
        if th is not None:
            th.close()

    def look(self, sw: str, port: int, ever_paused: bool) -> tuple[int, int] | None:
        """(packets queued for ``sw``'s ``port``: BMv2's queue plus, for a port ever paused, its
        lever's backlog; ports that fed the queue since it was last empty), or None this turn."""
        regs = self._regs.get(sw)
        if regs is None:
            return None
        qocc, feeds = regs
        depth = qocc[port] if port < len(qocc) else 0
        if ever_paused:
            depth += self.backlog(sw, port)
        return depth, feeds[port] if port < len(feeds) else 0

    def backlog(self, sw: str, port: int) -> int:
        """Packets ``sw``'s lever on ``port`` holds (its tbf's queue length)."""
        if self.fab.emu.node(sw).control_addr is not None:
            got = self._qlens.get(sw)
            if got is None:
                answer = self._ask(sw, "qlen")
                got = self._qlens[sw] = {k: int(v) for k, _, v in (w.partition("=") for w in answer.split())}
            return got.get(f"{sw}-eth{port}", 0)
        reader = self._netlink.get(sw)
        if reader is None:
            reader = self._netlink[sw] = kernel.QdiscBacklog(self.fab.emu.netns(sw))
        return reader.qlen(f"{sw}-eth{port}", "tbf")

    def lever(self, sw: str, port: int, paused: bool) -> str:
        """The tc line that pauses or reopens the tbf on ``sw``'s wire out of ``port``."""
        q = self.fab.queues[(sw, port)]
        rate = None if paused else OPEN_FACTOR * q.rate_mbps
        return f"qdisc change dev {sw}-eth{port} root {tbf_leaf(rate, q.depth, self.fab.emu.frame_bytes)}"

    def resumed(self, node: str, intf: str) -> None:
        """Wake the lever on ``node``'s ``intf`` with :data:`KICK_FRAME` (module docstring)."""
        if not is_host(node) and self.fab.emu.node(node).control_addr is not None:
            self._ask(node, f"kick {intf} {KICK_FRAME.hex()}")
            return
        sock = self._kick.get((node, intf))
        if sock is None:
            with kernel.inside(self.fab.emu.netns(node)):
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
                sock.bind((intf, 0))
            self._kick[(node, intf)] = sock
        sock.send(KICK_FRAME)

    def _ask(self, sw: str, line: str) -> str:
        """One line to switch ``sw``'s helper on its server, its answer (one line). Raises
        OSError when the helper does not answer or says it failed."""
        conn = self._control.get(sw)
        if conn is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(self.fab.emu.node(sw).control_addr)
            conn = self._control[sw] = (sock, sock.makefile("rw"))
        f = conn[1]
        try:
            f.write(line + "\n")
            f.flush()
            answer = f.readline()
        except OSError:
            self._control.pop(sw, None)
            conn[0].close()
            raise
        if not answer or answer.startswith("error"):
            self._control.pop(sw, None)
            conn[0].close()
            raise OSError(f"{sw}'s helper on its server: {answer.strip() or 'no answer'} ({line.split()[0]})")
        return answer.strip()

    def close(self) -> None:
        """Close the Thrift sessions, netlink and packet sockets."""
        for sw in list(self._thrift):
            self._drop(sw)
        for reader in self._netlink.values():
            reader.close()
        self._netlink.clear()
        for sock in self._kick.values():
            sock.close()
        self._kick.clear()
        for sock, _f in self._control.values():
            sock.close()
        self._control.clear()
