"""The queue plan: every switch port's egress rate, depth, ECN threshold and trim threshold, a pure
function of the fabric spec and the scenario's ``queues:`` settings. Both data planes take their
queues from it: bmv2 (rates and depths over Thrift, thresholds in the ``forward`` entries over
P4Runtime) and the linux plane's eBPF program.

Rates. A link's rate is the spec's: host links ``bandwidth_mbps``, T0-T1 links
``t0_t1_bandwidth_mbps`` (0: the same). BMv2 rate-limits a queue in packets per second, not bits,
so a port's rate in pps is its rate in bits/s over the bits of a full data frame:
``pps = Mb/s x 10^6 / (8 x frame_bytes)``, a frame being the payload plus MRC's 154 bytes of
headers and ICRC (1,178 bytes for the default 1 KiB payload). Smaller
frames (SACKs, probes) take a whole packet slot of that rate: the approximation costs the reverse
direction a little, and the data direction nothing while data frames are full (a short one, such as
each of 16 QPs' 64-byte share of a 1 KiB ring step, takes a full frame's time on BMv2). The linux
plane's queues count bytes (controller/bpf.py): there a short frame takes its own bytes' time.
The high-priority queue, which holds trimmed packets and control packets (SACKs, NACKs, probes,
CNPs: all about the size of a trimmed header), runs at the same bit rate in packets of that size
(``rate_pps_high``, about 8x): BMv2 serves each worker's highest priority first across all its
ports, and small packets paced as full frames would starve every low-priority queue behind them,
and charge an acknowledgement a data packet's time. (Each priority has its own rate, so a port
passing both can exceed its rate by its headers' share: small, and only while trimming.)

PFC (``pfc: true``; RoCE runs only: the paper runs MRC lossy and RoCE over PFC): every port's
low-priority class is lossless (``lossless``): nothing is dropped for a full queue; at ``xoff``
packets (default ``q_limit / 2``) the pause agent (controller/pfc.py) pauses the
ports that feed it, at ``xon`` (default ``xoff / 2``) it lets them go. The real queue behind a
lossless port is :data:`HEADROOM_FACTOR` times ``q_limit`` deep: the headroom for what arrives
between XOFF and the pause taking hold.

Thresholds (packets of the low-priority queue): ``q_limit`` is the spec's ``queue_packets``;
packets at or above it are dropped. ``trim_t`` (default ``max(4, q_limit / 8)``, 0: no trimming):
data packets at or above it are trimmed; kept low because it bounds how long a packet can wait at a
hop, which an emulated link makes long (a packet takes 6 ms at 1.5 Mb/s), and the sender's
retransmission timer must not fire on a packet that is only queued. ``ecn_k`` (default
``max(2, q_limit / 16)``, 0: no marking):
ECN-capable packets that join a queue at or above it are marked CE, on fabric-facing ports only
(T0 up to T1, T1 down to T0): a mark means "this path is hotter", and the last hop down to a host
is no path choice. ``ecn_last_hop: true`` marks there too (DCQCN, the RoCE baseline's control,
needs the congested hop to mark). Left open, both follow the transport (:meth:`QueueSettings.
for_transport`): an MRC run meets MRC's switches, a RoCE run a RoCE fabric's. BMv2's own queue holds
``q_limit + QUEUE_SLACK`` packets so the
program's count, not BMv2's silent tail drop, decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mrclab.protocol.headers import DEFAULT_FRAME_BYTES, TRIM_BYTES
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.schema import rule
from mrclab.topologies.spec import is_host

#: Packets a BMv2 queue holds beyond the program's limit (its own drops are silent).
QUEUE_SLACK = 8
#: The high-priority queue (trimmed headers, control packets) holds this many times the low
#: queue's limit: its packets are an eighth of a full frame, and a burst that trims a whole window
#: at once must not overflow it (BMv2 drops there silently, and a lost trimmed header looks to its
#: sender like an untrimmed loss).
HIGH_DEPTH_FACTOR = 4
#: A lossless (PFC) port's real queue holds this many times the queue limit (the headroom).
HEADROOM_FACTOR = 4
#: A trimmed packet: its first 150 bytes (p4src/mrclab.p4 TRIM_BYTES, protocol/headers.py TRIM_BYTES).
TRIM_FRAME_BYTES = TRIM_BYTES


@dataclass(frozen=True)
class QueueSettings:
    """A scenario's ``queues:`` block (see the module docstring). -1: the default."""

    ecn_k: int = field(default=-1, metadata=rule(kind=int, lo=-1, hi=65535, doc="ECN threshold, packets"))
    trim_t: int = field(default=-1, metadata=rule(kind=int, lo=-1, hi=65535, doc="trim threshold, packets"))
    ecn_last_hop: bool | None = field(default=None, metadata=rule(kind=(bool, type(None)),
                                                                  doc="mark on ports down to hosts too"))
    pfc: bool = field(default=False, metadata=rule(kind=bool, doc="a lossless class with PFC for RoCE runs"))
    pfc_xoff: int = field(default=-1, metadata=rule(kind=int, lo=-1, hi=65535, doc="PFC XOFF, packets"))
    pfc_xon: int = field(default=-1, metadata=rule(kind=int, lo=-1, hi=65535, doc="PFC XON, packets"))

    def for_transport(self, transport: str) -> QueueSettings:
        """The switches a ``transport`` run meets, where the scenario leaves it open: MRC's
        (trimming on, no marks on the last hop) or a RoCE fabric's (marks on the last hop too:
        DCQCN reacts to the congested hop). A RoCE fabric never trims, whatever ``trim_t`` says:
        RoCE NICs know no trimmed packet (one is a loss, and a go-back-N), so a scenario's
        ``trim_t`` sets MRC's switches only (ecn-load-balancing trims MRC at 16 packets, where
        RoCE's PFC pauses: a RoCE run would have had its packets cut as the pause began)."""
        roce = transport == "roce"
        return QueueSettings(self.ecn_k, 0 if roce else self.trim_t,
                             roce if self.ecn_last_hop is None else self.ecn_last_hop,
                             self.pfc and roce, self.pfc_xoff, self.pfc_xon)


@dataclass(frozen=True)
class PortQueue:
    """One switch port: ``peer`` it faces; ``rate_pps`` (0: unlimited), ``depth`` (BMv2's queue),
    ``ecn_k``, ``trim_t``, ``q_limit`` (packets, 0: off); ``lossless`` with PFC, paused upstream at
    ``xoff`` and let go at ``xon`` packets."""

    switch: str
    port: int
    peer: str
    rate_mbps: float
    rate_pps: int
    rate_pps_high: int
    depth: int
    depth_high: int
    ecn_k: int
    trim_t: int
    q_limit: int
    lossless: bool = False
    xoff: int = 0
    xon: int = 0

    @property
    def host_facing(self) -> bool:
        """True for a port that faces a host (a last hop down)."""
        return is_host(self.peer)


def mbps_to_pps(mbps: float, frame_bytes: int = DEFAULT_FRAME_BYTES) -> int:
    """A link rate in packets per second of ``frame_bytes`` frames (see the module docstring)."""
    return 0 if mbps <= 0 else max(1, round(mbps * 1e6 / (8 * frame_bytes)))


def queue_plan(plan: AddressPlan, qs: QueueSettings = QueueSettings(),
               frame_bytes: int = DEFAULT_FRAME_BYTES) -> dict[tuple[str, int], PortQueue]:
    """(switch, port) -> its :class:`PortQueue`, for every port of every switch; rates in pps
    of ``frame_bytes`` frames."""
    link = plan.spec.link
    limit = link.queue_packets
    trim_t = max(4, limit // 8) if qs.trim_t < 0 else qs.trim_t
    ecn_k = max(2, limit // 16) if qs.ecn_k < 0 else qs.ecn_k
    xoff = max(2, limit // 2) if qs.pfc_xoff < 0 else qs.pfc_xoff
    xon = xoff // 2 if qs.pfc_xon < 0 else qs.pfc_xon
    out = {}
    for sw in plan.spec.switches():
        for port, peer in plan.ports(sw).items():
            down_to_host = is_host(peer)
            mbps = link.bandwidth_mbps if down_to_host else (link.t0_t1_bandwidth_mbps or link.bandwidth_mbps)
            k = ecn_k if (not down_to_host or qs.ecn_last_hop is True) else 0
            depth = (HEADROOM_FACTOR * limit if qs.pfc else limit) + QUEUE_SLACK
            out[(sw, port)] = PortQueue(sw, port, peer, mbps, mbps_to_pps(mbps, frame_bytes),
                                        mbps_to_pps(mbps, TRIM_FRAME_BYTES),
                                        depth, HIGH_DEPTH_FACTOR * limit, k, trim_t, limit,
                                        qs.pfc, xoff if qs.pfc else 0, xon if qs.pfc else 0)
    return out


def path_queue_bound_s(plan: AddressPlan, queues: dict[tuple[str, int], PortQueue]) -> float:
    """The longest a data packet can wait in the switch queues of any path before it is trimmed
    (or, without trimming, dropped): per hop the threshold over the port's rate, summed along the
    path, the worst path of the fabric (s; 0 where switches do not queue or are unlimited). A
    sender's retransmission timer below it would take a queued packet for a lost one."""
    if not queues:
        return 0.0
    worst = 0.0
    hosts = plan.spec.hosts()
    for src in hosts[:1] + hosts[-1:]:  # every path shape: same T0 group and across T1s
        for dst in hosts:
            if dst == src:
                continue
            for p in plan.paths(src, dst):
                nodes = [*p.hops, p.dst]
                total = 0.0
                for sw, nxt in zip(nodes, nodes[1:]):
                    q = queues[(sw, plan.port_to(sw, nxt))]
                    if q.rate_pps:
                        total += (q.trim_t or q.q_limit) / q.rate_pps
                worst = max(worst, total)
    return worst
