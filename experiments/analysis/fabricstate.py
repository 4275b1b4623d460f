"""What a scenario's fault timeline leaves of the fabric, over time: which elements are failed when,
whether a path crosses one, and how much capacity each flow keeps. The verdicts that judge a run
against the fabric (experiments/analysis/verdicts.py: false retirements, revival, time to retire, goodput
against capacity) read it; it knows the plan and the timeline, never the run's outcome.

Elements are switches and links, a link as ``(lower, upper)`` like ``ClosSpec.links()``. A switch
down or blackholed is failed; a link down (``link_down``, ``port_down``, a flap) is failed; a link
or one direction of it losing packets (``gray_loss``, ``ev_loss``) is failed too: paths through it
lose packets. What each event does comes from the fault table alone (experiments/model/faults.py: its
effect, what it undoes, the elements it names). A fault holds its element from the time it was
played until the time its undo was
played (the run's own times, not the scenario's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mrclab.experiments.model.faults import FAULTS, Element, Fault
from mrclab.topologies.addressing import AddressPlan, Path


@dataclass
class FabricTimeline:
    """Failed intervals per element, from the faults as played: ``played`` is ``[(t, fault)]``."""

    plan: AddressPlan
    intervals: dict[Element, list[list[float]]] = field(default_factory=dict)
    #: how many fault events that fail an element were played (a flap's every down counts one)
    failures: int = 0

    @classmethod
    def from_played(cls, plan: AddressPlan, played: list[tuple[float, Fault]]) -> FabricTimeline:
        """The timeline of ``played`` (``[(t_s, fault)]``), each event's effect taken from the fault table."""
        tl = cls(plan)
        for t, f in sorted(played, key=lambda x: x[0]):
            kind = FAULTS[f.event]  # what the event does, from the fault table alone
            opens = kind.effect == "fail" or (kind.effect == "loss" and f.args.get("rate", 0) > 0)
            closes = kind.effect == "repair" or (kind.effect == "loss" and not opens)
            tl.failures += kind.effect == "fail"
            for el in kind.elements(plan, f.args):
                if opens:
                    tl.intervals.setdefault(el, []).append([t, math.inf])
                elif closes:
                    tl._close(el, t)
        return tl

    def _close(self, el: Element, t: float) -> None:
        for iv in self.intervals.get(el, []):
            if iv[1] == math.inf:
                iv[1] = t

    def failed(self, el: Element, t0: float, t1: float) -> bool:
        """The element was failed at some time in [t0, t1]."""
        return any(a <= t1 and b >= t0 for a, b in self.intervals.get(el, []))

    @staticmethod
    def path_elements(p: Path) -> list[Element]:
        """The switches and links a path crosses."""
        return [("switch", s) for s in p.hops] + [("link", *link) for link in p.links]

    def path_failed(self, p: Path, t0: float, t1: float) -> bool:
        """Some element of path ``p`` was failed at some time in [t0, t1] (s)."""
        return any(self.failed(el, t0, t1) for el in self.path_elements(p))

    def repaired_at(self, t: float, slack: float = 0.5) -> list[Element]:
        """Elements whose failure ended within ``slack`` of ``t``."""
        return [el for el, ivs in self.intervals.items() for a, b in ivs if b != math.inf and abs(b - t) <= slack]

    def failed_at(self, t: float, slack: float = 0.5) -> list[Element]:
        """Elements whose failure began within ``slack`` of ``t``."""
        return [el for el, ivs in self.intervals.items() for a, b in ivs if abs(a - t) <= slack]

    def alive_planes(self, src: str, dst: str, t: float) -> int:
        """Planes with at least one path from ``src`` to ``dst`` that crosses no failed element at ``t``."""
        return sum(1 for plane in range(self.plan.spec.planes)
                   if any(not self.path_failed(p, t, t) for p in self.plan.paths(src, dst) if p.plane == plane))

    def capacity(self, flows: list[tuple[str, str]], t0: float, t1: float, step: float = 0.1) -> float:
        """Mean over [t0, t1] of the planes left to the flows, summed over flows (in NIC ports):
        each flow can use a plane's port while one of its paths in the plane is whole. (Shared
        ports and links are not split: the lab's scenarios give each flow its own host ports.)"""
        n = max(1, int(round((t1 - t0) / step)))
        return sum(self.alive_planes(s, d, t0 + (k + 0.5) * step) for s, d in flows for k in range(n)) / n
