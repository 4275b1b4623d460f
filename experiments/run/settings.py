"""A run's settings, resolved once: one step turns the scenario, its fabric and this machine into the
frozen settings of the run (:class:`RunSettings`) before anything starts, and writes them to the
results folder (``settings.json``). The runner then reads them and never replaces the scenario.

What is resolved, in order (each step says what it changed, through ``say``):

1. the data plane's fabric (``fabric_<plane>`` overrides) and the link rates this machine gives it
   (experiments/run/admission.py: the scenario's, scaled down with ``--fit``, or ``--rates machine``);
2. the transports' NIC port rate from the fabric, where the scenario leaves it 0 (NSCC's BDP,
   DCQCN's line rate);
3. the switch queue plan (controller/queues.py) where the data plane queues here, and the longest a
   path's queues may hold a packet;
4. the retransmission timer's floor raised to twice that (a packet queued up to the trim threshold at
   every hop must not read as lost), unless the scenario sets ``min_rto_s``;
5. the timers that must outlast a round trip raised to that floor (:func:`slow_path_timers`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mrclab.controller.dataplanes import DataPlane
from mrclab.controller.queues import PortQueue, path_queue_bound_s, queue_plan
from mrclab.emulation.kernel import shaper_burst_bytes
from mrclab.experiments.model.scenario import Scenario
from mrclab.experiments.run import admission
from mrclab.topologies.addressing import AddressPlan
from mrclab.topologies.spec import ClosSpec
from mrclab.traffic.settings import TransportSettings


@dataclass(frozen=True)
class RunSettings:
    """The frozen settings of one run: ``scenario`` as it runs (its transport settings resolved, its
    fabric on ``plane`` at the rates admitted), ``plane`` (controller/dataplanes.py), ``spec`` (the
    fabric built), ``queues`` (the switch queue plan; empty where switches do not queue),
    ``queue_bound_s`` (the longest a path's switch queues hold a data packet, s) and ``changes``
    (what resolving changed, one line each)."""

    scenario: Scenario
    plane: DataPlane
    spec: ClosSpec
    queues: dict[tuple[str, int], PortQueue]
    queue_bound_s: float
    changes: tuple[str, ...]

    @property
    def settings(self) -> TransportSettings:
        """The transport settings every endpoint runs with."""
        return self.scenario.settings

    def as_dict(self) -> dict:
        """What ``settings.json`` records: data plane, fabric, transport settings, queue bound and
        what resolving changed."""
        return {"dataplane": self.plane.name, "fabric": self.spec.to_dict(),
                "transport": dataclasses.asdict(self.settings), "queue_bound_s": round(self.queue_bound_s, 6),
                "switch_ports_queued": len(self.queues), "changes": list(self.changes)}

    def write(self, folder: Path) -> None:
        """``settings.json`` in ``folder``."""
        (folder / "settings.json").write_text(json.dumps(self.as_dict(), indent=1))


def resolve(scn: Scenario, plane: DataPlane, *, fit: bool = False, rates: str = "scenario", remote: bool = False,
            say: Callable[[str], None] = print) -> RunSettings:
    """``scn`` on ``plane`` turned into the run's :class:`RunSettings` (steps in the module
    docstring; ``remote``: a fabric over servers, where a data plane may not queue). Raises as
    :func:`~experiments.run.admission.admit` does (CannotCarry, NotAvailable)."""
    changes: list[str] = []

    def note(line: str) -> None:
        changes.append(line)
        say(line)

    scn = admission.admit(scn, plane.name, fit=fit, rates=rates, say=say)
    spec = scn.spec_for(plane)
    s = scn.settings
    if s.port_mbps == 0:
        s = dataclasses.replace(s, port_mbps=spec.link.bandwidth_mbps)
    if spec.link.bandwidth_mbps > 0:  # the hosts' NIC ports are tbf shapers with this burst (emulation/network.py)
        s = dataclasses.replace(s, port_burst_bytes=shaper_burst_bytes(s.frame_bytes))
    queues = queue_plan(AddressPlan(spec), scn.queues.for_transport(scn.transport), s.frame_bytes) \
        if "congestion" in plane.available(remote) else {}
    bound = path_queue_bound_s(AddressPlan(spec), queues)
    given = scn.raw.get("transport") or {}
    if "min_rto_s" not in given and 2 * bound > s.min_rto_s:
        s = dataclasses.replace(s, min_rto_s=round(2 * bound, 4))
        note(f"retransmission timer floor {s.min_rto_s * 1e3:.0f} ms: twice the longest queueing a path "
             f"allows ({bound * 1e3:.0f} ms)")
    s, raised = slow_path_timers(s, given)
    if raised:
        note("timers raised to the retransmission floor: "
             + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in raised.items()))
    return RunSettings(dataclasses.replace(scn, settings=s), plane, spec, queues, bound, tuple(changes))


def slow_path_timers(s: TransportSettings, given: dict) -> tuple[TransportSettings, dict]:
    """``s`` with the timers that must outlast a round trip raised to the retransmission timer's
    floor where the floor is above them (a slow fabric: 4 KiB frames at 0.25 Mb/s take 136 ms a
    hop), except those the scenario's ``transport`` block (``given``) sets itself, and what it
    raised (name -> s):

    * ``max_rto_s`` to ``min_rto_s``: the ceiling capped the timer below its floor (lab64 on bmv2:
      floor 3.4 s, every timer 1 s);
    * ``probe_timeout_s`` to ``min_rto_s``, and ``probe_interval_s`` with it in the defaults' ratio
      (0.05 to 0.2, traffic/settings.py): a probe answered after its timeout counts as lost, so
      with a 0.54 s RTT against the 0.2 s timeout every reverse EV was taken out of rotation, and
      its rounds every 50 ms carried more packets than the data (40 probes a second on one host
      port against 13 data frames).
    """
    floor = s.min_rto_s
    changes: dict = {}
    if "max_rto_s" not in given and floor > s.max_rto_s:
        changes["max_rto_s"] = floor
    if "probe_timeout_s" not in given and floor > s.probe_timeout_s:
        changes["probe_timeout_s"] = floor
        if "probe_interval_s" not in given:
            changes["probe_interval_s"] = round(s.probe_interval_s * floor / s.probe_timeout_s, 4)
    return (dataclasses.replace(s, **changes) if changes else s), changes
