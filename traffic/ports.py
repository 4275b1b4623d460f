"""The port-state bitmap: which planes' NIC ports are up at this end and at the peer
(:class:`PortState`).

Bit p set = plane p's NIC port has carrier. Every data packet, SACK, NACK and probe carries its
sender's bitmap (paper: "a NIC port that goes down is announced to peers in a port-state bitmap
carried in SACKs"). A sender uses a plane only while it is up at both ends. SACKs come back over
several paths, so an older one overtaken by a newer one must not flip a plane back: the peer's
bitmap is taken from the newest SACK or NACK only, by its echoed PSN.
"""

from __future__ import annotations

ALL_UP = 0xFF


class PortState:
    """Local and peer port bitmaps of one QP; :meth:`usable` is the planes up at both ends."""

    __slots__ = ("local", "peer", "_peer_psn")

    def __init__(self) -> None:
        """Every port up at both ends until told otherwise."""
        self.local = ALL_UP
        self.peer = ALL_UP
        self._peer_psn = -1  # echo PSN of the SACK/NACK the peer's bitmap was last taken from

    def from_peer(self, state: int, echo_psn: int) -> bool:
        """The peer's bitmap as a SACK/NACK for ``echo_psn`` reports it; True when it changed."""
        if echo_psn < self._peer_psn:
            return False
        self._peer_psn = echo_psn
        if state == self.peer:
            return False
        self.peer = state
        return True

    def set_local(self, state: int) -> bool:
        """This NIC's bitmap (from its ports' carrier); True when it changed."""
        if state == self.local:
            return False
        self.local = state
        return True

    def usable(self) -> int:
        """Bitmap of the planes up at both ends."""
        return self.local & self.peer
