"""Transport settings: one frozen record for MRC and the RoCE-style baseline, with defaults and
their sources (docs/protocol.md, "Defaults"). A scenario's ``transport:`` block and the endpoint's
config set them by name; :meth:`TransportSettings.from_dict` checks every field against its rule
and reports every bad one at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mrclab.protocol.headers import DEFAULT_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES, frame_bytes
from mrclab.topologies.errors import BadInput
from mrclab.topologies.schema import Problems, build, rule


def _pos(doc: str, **kw: Any) -> dict:
    return rule(positive=True, doc=doc, **kw)


@dataclass(frozen=True)
class TransportSettings:
    """Settings of one endpoint's transport (MRC or the baseline). Units are in the names.

    ``window_packets`` (16): unacknowledged data packets per QP: four per plane of the default
    fabric, several times the bandwidth-delay product of its shaped links (one or two packets per
    NIC port), and no more: a window that fills the bottleneck queues only adds RTT, and when a path
    dies and its lost packets hold part of the window, the RTT of a full queue swings by its whole
    depth, which a retransmission timer cannot follow (64 kept bmv2's 16-packet queues full and
    retired healthy EVs in the fig. 9c/9d runs).

    EV set (paper: 128-256 EVs per QP split across planes, plus backups; scaled to a 4-host lab):
    ``evs_per_plane`` active (4) + ``backup_per_plane`` (2); SACKs come back on up to
    ``reverse_evs_per_plane`` + 1 paths per plane (1: two; traffic/host.py). Probes:
    ``probe_successes`` (3) answered probes in a row revive a retired EV; a round of
    probes every ``probe_interval_s`` (0.05), each unanswered after ``probe_timeout_s`` (0.2).

    Retransmission timer (:class:`traffic.rtt.RttEstimator`): RTO = max(``min_rto_s``,
    2 srtt + 4 rttvar, recent peak RTT), at most ``max_rto_s`` (1.0); ``min_rto_s`` is 0.02 (OCP's
    local ACK timeout is 1.024 us x 2^t; the emulated RTT is 1-100 ms, so the floor is coarse).
    Before the first RTT sample the RTO is ``initial_rto_s`` (0.5; RFC 6298 says 1 s for the
    Internet): the first round trip also pays for the peer building its receive state.

    Receiver: a SACK every ``ack_every`` (2) packets or after ``ack_delay_s`` (1 ms). Memory region
    ``region_bytes`` (8 MiB) per QP. PSNs more than ``max_psn_window`` (65,536) ahead are dropped.

    Congestion (traffic/cc.py, traffic/dcqcn.py): MRC's window is NSCC's (UET 1.0 NSCC, the OCP MRC
    API's default profile), or the fixed ``window_packets`` with ``nscc: off``; NSCC's BDP is the
    QP's line rate, ``port_mbps`` x the planes (the runner sets it from the fabric's host links;
    0: unknown, the fixed window stands for the BDP), x the base RTT (``base_rtt_s``, 0: the
    smallest RTT sample). An EV whose packets come back ECN-marked is skipped for ``ecn_skip_rtts``
    (8) smoothed RTTs (ours): long enough for the queue that marked it to drain below the marking
    threshold (K packets drain in K packet times, under an RTT at the thresholds mrclab sets) and
    for a flow that keeps a path hot to take most of it (an EV that comes back too soon is marked
    again after an RTT, and carries a packet per rotation meanwhile), short enough that a path
    that cooled down is back within a few hundred ms.
    ``roce_cc``: the baseline's rate control, ``dcqcn`` or ``none`` (window only); ``dcqcn_timer_s``
    is DCQCN's rate-increase and alpha timer and the receiver's CNP interval: the paper's 55 us and
    50 us are about 5 RTTs of its fabric, and an emulated fabric is about 1000x slower, so 0 (the
    default) makes it 5 x the smallest RTT the sender has seen (and CNPs at most one per ms).

    Ablations: each of MRC's mechanisms (:attr:`MECHANISMS`) is on by default and can be switched
    off by name, to see what it buys: ``ev_health`` (an untrimmed loss or a timeout retires the EV;
    off: the packet is resent, the EV kept), ``probes`` (retired EVs are probed and revived; off:
    retired for good), ``port_state`` (a plane whose NIC port is down at either end leaves the
    rotation; off: the sender keeps spraying into it), ``nack`` (a trimmed packet is resent at once
    on another EV; off: NACKs and trim bitmaps are ignored, so a trim is found like a loss),
    ``ecn_lb`` (ECN-marked EVs are skipped; off: marks only feed NSCC), ``nscc`` (off: the fixed
    window), ``spray`` (every QP spreads its packets over the EVs of every plane; off: each QP is
    held to the one path an ECMP hash gives it, the baseline's hash, so a permutation of flows meets
    the baseline's collisions while keeping MRC's loss recovery and congestion control).
    """

    window_packets: int = field(default=16, metadata=_pos("unacknowledged data packets per QP"))
    payload_bytes: int = field(default=DEFAULT_PAYLOAD_BYTES,
                               metadata=rule(lo=1, hi=MAX_PAYLOAD_BYTES, doc="data bytes per packet"))
    evs_per_plane: int = field(default=4, metadata=_pos("active EVs per plane"))
    backup_per_plane: int = field(default=2, metadata=_pos("backup EVs per plane"))
    reverse_evs_per_plane: int = field(default=1, metadata=_pos("reverse (SACK) EVs per plane, minus one"))
    probe_successes: int = field(default=3, metadata=_pos("answered probes that revive a retired EV"))
    probe_interval_s: float = field(default=0.05, metadata=_pos("seconds between probe rounds"))
    probe_timeout_s: float = field(default=0.2, metadata=_pos("seconds before a probe counts as lost"))
    min_rto_s: float = field(default=0.02, metadata=_pos("RTO floor"))
    max_rto_s: float = field(default=1.0, metadata=_pos("RTO ceiling"))
    initial_rto_s: float = field(default=0.5, metadata=_pos("RTO before the first RTT sample"))
    ack_every: int = field(default=2, metadata=_pos("data packets per SACK"))
    ack_delay_s: float = field(default=0.001, metadata=_pos("longest a SACK waits"))
    region_bytes: int = field(default=8 << 20, metadata=_pos("memory region per QP"))
    max_psn_window: int = field(default=1 << 16, metadata=_pos("PSNs ahead of cum_psn a receiver accepts"))
    port_mbps: float = field(default=0.0, metadata=rule(lo=0, doc="NIC port rate per plane, Mb/s (0: unknown)"))
    port_burst_bytes: int = field(default=0, metadata=rule(
        lo=0, doc="bytes a NIC port's shaper sends back to back after a pause (0: frame by frame)"))
    base_rtt_s: float = field(default=0.0, metadata=rule(lo=0, doc="a known base RTT (0: the smallest sample)"))
    ecn_skip_rtts: float = field(default=8.0, metadata=rule(lo=0, doc="how long an ECN-marked EV is skipped, in RTTs"))
    roce_cc: str = field(default="dcqcn", metadata=rule(choices=("dcqcn", "none"), doc="the baseline's rate control"))
    dcqcn_timer_s: float = field(default=0.0,
                                 metadata=rule(lo=0, doc="DCQCN's timers and CNP interval (0: 5 base RTTs)"))
    nic_stamps: bool = field(default=True, metadata=rule(kind=bool, doc=(
        "time packets from their NIC port's departure stamps where the port is shaped (RTT samples; MRC's timer too) "
        "(off: from the host's model of its port queues)")))
    # ---- MRC's mechanisms, each of which can be switched off (docs/protocol.md, "Ablations") ----
    ev_health: bool = field(default=True, metadata=rule(kind=bool, doc="retire an EV on an untrimmed loss or timeout"))
    probes: bool = field(default=True, metadata=rule(kind=bool, doc="probe retired EVs and revive them"))
    port_state: bool = field(default=True, metadata=rule(kind=bool, doc="stop using a plane whose port is down"))
    nack: bool = field(default=True, metadata=rule(kind=bool, doc="resend a trimmed packet at once on another EV"))
    ecn_lb: bool = field(default=True, metadata=rule(kind=bool, doc="skip EVs whose packets come back ECN-marked"))
    nscc: bool = field(default=True, metadata=rule(kind=bool, doc="NSCC's window (off: the fixed window_packets)"))
    spray: bool = field(default=True, metadata=rule(kind=bool, doc="spray every QP over every EV (off: one ECMP path)"))

    #: the switchable mechanisms, by name
    MECHANISMS = ("ev_health", "probes", "port_state", "nack", "ecn_lb", "nscc", "spray")

    @property
    def frame_bytes(self) -> int:
        """A full data packet on the wire (bytes): ``payload_bytes`` plus its headers and ICRC
        (protocol/headers.py :func:`frame_bytes`)."""
        return frame_bytes(self.payload_bytes)

    @classmethod
    def from_dict(cls, d: Any, source: str = "transport") -> TransportSettings:
        """Settings from a mapping of field names; raises :class:`BadInput` naming every unknown
        field and every value outside its allowed range."""
        problems = Problems(source)
        s = build(cls, d if d is not None else {}, "", problems)
        problems.raise_if_any(BadInput)
        assert s is not None
        return s
