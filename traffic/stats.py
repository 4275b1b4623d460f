"""Counters of one QP's sending and receiving side, shared by MRC and the RoCE-style baseline.

The endpoint reports them in its telemetry (traffic/contract.py) under these field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SenderStats:
    """Data packets are first transmissions; ``retransmits`` are counted apart. ``losses``: packets
    found lost (by a SACK gap, a go-back-N NACK or a timeout); ``timeouts`` the timer's share.
    ``wire_stamped``: transmissions whose NIC port reported when it sent them (traffic/txstamp.py;
    0 on an unshaped port or with stamps off); ``nic_deferred``: timer expiries put off because
    the packet left its NIC port later than it was handed over, or had not left yet."""

    data_packets: int = 0
    retransmits: int = 0
    bytes_acked: int = 0
    messages_sent: int = 0
    messages_acked: int = 0
    losses: int = 0
    timeouts: int = 0
    nacks: int = 0
    probes: int = 0
    wire_stamped: int = 0
    nic_deferred: int = 0


@dataclass(slots=True)
class ReceiverStats:
    """``delivered_bytes``: payload placed in the memory region (duplicates not counted);
    ``reordered``: whole first transmissions that arrived behind a later one on their EV;
    ``dropped``: packets refused, by reason; ``completions``: Write-with-Immediate immediates in
    MSN order."""

    data_packets: int = 0
    delivered_bytes: int = 0
    messages_delivered: int = 0
    messages_corrupt: int = 0
    duplicates: int = 0
    trimmed: int = 0
    #: first transmissions that arrived behind a later first transmission on their EV: a path is
    #: one FIFO (docs/protocol.md), so each is the network reordering it (the emulator's model broke)
    reordered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    completions: list[int] = field(default_factory=list)

    def drop(self, why: str) -> None:
        """Count one refused packet under reason ``why``."""
        self.dropped[why] = self.dropped.get(why, 0) + 1
