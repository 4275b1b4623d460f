"""What the endpoint needs of a transport: the :class:`Sender` and :class:`Receiver` protocols that
MRC (:mod:`traffic.sender`, :mod:`traffic.receiver`) and the RoCE-style baseline
(:mod:`traffic.roce`) both implement, so the host stack and the endpoint never tell them apart.

All times are seconds of one monotonic clock; packets are :class:`~traffic.packet.Pkt`.
"""

from __future__ import annotations

from typing import Protocol

from mrclab.traffic.evs import EvState
from mrclab.traffic.packet import Pkt
from mrclab.traffic.stats import ReceiverStats, SenderStats


class Sender(Protocol):
    """The sending side of one QP."""

    qp: int
    stats: SenderStats
    #: bit p: the plane-p NIC port stamps its departures (set by the host stack): the sender times
    #: its packets there from the stamps (:meth:`left_nic`)
    wire_ports: int

    @property
    def done(self) -> bool:
        """Every message taken has been acknowledged and no more will be taken."""

    @property
    def srtt_s(self) -> float | None:
        """Smoothed RTT (None: no sample yet)."""

    @property
    def window_bytes(self) -> float:
        """The congestion window (bytes on the wire that may be unacknowledged)."""

    @property
    def rate_bps(self) -> float | None:
        """The paced rate (bits/s) of a rate-controlled transport, else None."""

    @property
    def completion_s(self) -> list[float]:
        """Completion time of every message acknowledged so far (seconds)."""

    def stop(self) -> None:
        """Take no new message after the current one."""

    def poll(self, now: float, budget: int = 64) -> list[Pkt]:
        """Packets to send now, at most ``budget`` data packets."""

    def next_due(self, now: float) -> float:
        """The earliest time (s) :meth:`poll` may have work with no packet received: ``now`` if it
        may at once, ``inf`` if only a received packet can give it any."""

    def departed(self, waits: list[float], start: int) -> None:
        """The NIC model's wait (s) for each frame of a turn, this sender's last :meth:`poll` among
        them from index ``start`` (traffic/host.py): when its packets left the port."""

    def left_nic(self, psn24: int, handed: float, t: float) -> None:
        """The NIC port sent PSN ``psn24`` (low 24 bits) at ``t`` (s), handed to it at ``handed``:
        its departure stamp (traffic/txstamp.py)."""

    def on_packet(self, p: Pkt, now: float) -> None:
        """An acknowledgement, NACK or probe reply for this QP."""

    def set_local_ports(self, state: int) -> None:
        """This NIC's port-state bitmap (bit p: plane p's port has carrier)."""

    def ev_states(self) -> dict[int, EvState]:
        """The state of every EV the QP holds."""

    def ev_packets(self) -> dict[int, int]:
        """Data packets sent on each EV so far."""


class Receiver(Protocol):
    """The receiving side of one QP."""

    qp: int
    stats: ReceiverStats
    local_ports: int

    def on_packet(self, p: Pkt, now: float) -> list[Pkt]:
        """A data packet; returns acknowledgements to send at once."""

    def poll(self, now: float) -> list[Pkt]:
        """Acknowledgements that are due."""

    def next_due(self, now: float) -> float:
        """The earliest time (s) :meth:`poll` may have an acknowledgement due with no packet
        received; ``inf`` if none is owed."""
