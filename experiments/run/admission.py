"""Admission: refuse, or fit, a run this machine cannot carry, before anything starts.

``mrclab calibrate`` (bench/calibrate.py) measures what this machine sustains and caches it here
(:class:`Calibration`, one per data plane and BMv2 build). Before a run, :func:`estimate` adds up
the CPU the scenario needs from its fabric, rates and workload:

    cores = endpoint processes x endpoint_idle_cores + switches x switch_idle_cores
          + pps x (endpoint_tx_us + endpoint_rx_us) / 1e6 + pps x hops x switch_us_per_hop / 1e6

where ``pps`` is the most the workload can move (every sending host's NIC ports full, capped by
the receiving hosts' ports; frames of the scenario's payload plus mrclab's headers) and ``hops``
is 3, a cross-T1 path. It is compared with :data:`USABLE` of the machine's cores (the rest is left
to the runner, its monitor and the kernel's own work). A run that needs more is refused
(:class:`CannotCarry`, exit 3, one line with the numbers) unless ``--fit`` scales every link rate
down by the factor that fits (every rate-derived setting follows: queue drain times, the
retransmission timer's floor, NSCC's BDP, DCQCN's line rate come from the link rates at run time).
Without a calibration for this machine the check is skipped and the runner says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from mrclab.controller.dataplanes import dataplane as resolve
from mrclab.experiments.model.scenario import Scenario
from mrclab.experiments.run.endpoints import process_groups
from mrclab.topologies.errors import NotAvailable
from mrclab.topologies.spec import ClosSpec

CACHE = Path(os.environ.get("MRCLAB_CACHE", Path.home() / ".cache" / "mrclab")) / "calibration.json"
#: Share of the machine's cores a run may plan to use.
USABLE = 0.8
#: Switch hops of the longest path (host -> T0 -> T1 -> T0 -> host crosses three switches).
HOPS = 3
#: With ``--rates machine``: the share of the room left after idling (cores) that the traffic may
#: plan to fill. The rest absorbs what the estimate leaves out: bursts, retransmissions, probes,
#: the fidelity monitor and the loops' lateness (ours; docs/fidelity.md, "Admission and rates").
MACHINE_SHARE = 0.5
#: The link rates a run may take, by ``--rates``: the scenario's, or this machine's.
RATES = ("scenario", "machine")


class CannotCarry(NotAvailable):
    """This machine cannot carry the run at its rates (exit 3); the message has the numbers."""


@dataclass(frozen=True)
class Calibration:
    """What one machine sustains on one data plane (bench/calibrate.py says how each is measured)."""

    machine: str
    dataplane: str
    build: str
    cores: int
    endpoint_start_cpu_s: float
    endpoint_idle_cores: float
    endpoint_tx_us: float
    endpoint_rx_us: float
    switch_us_per_hop: float
    switch_idle_cores: float
    when: str

    def as_dict(self) -> dict:
        """The calibration as a JSON-ready mapping."""
        return asdict(self)


def machine_key() -> str:
    """This machine as calibrations know it: host name, cores, kernel release."""
    return f"{platform.node()}/{os.cpu_count()} cores/{platform.release()}"


def bmv2_build() -> str:
    """The BMv2 binary on PATH as calibrations know it (path and modification time), or ""."""
    path = shutil.which("simple_switch_grpc")
    return f"{path}@{int(Path(path).stat().st_mtime)}" if path else ""


def _load_all() -> list[dict]:
    try:
        data = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


def save_calibration(c: Calibration) -> None:
    """Store ``c``, replacing the calibration of the same machine, data plane and build."""
    keep = [d for d in _load_all() if (d.get("machine"), d.get("dataplane"), d.get("build"))
            != (c.machine, c.dataplane, c.build)]
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(".tmp")
    tmp.write_text(json.dumps([*keep, c.as_dict()], indent=1))
    os.replace(tmp, CACHE)


def load_calibration(dataplane: str) -> Calibration | None:
    """This machine's calibration of ``dataplane`` (and of the BMv2 build on PATH), or None."""
    build = resolve(dataplane).build_id()
    for d in _load_all():
        if (d.get("machine"), d.get("dataplane"), d.get("build")) == (machine_key(), dataplane, build):
            try:
                return Calibration(**d)
            except TypeError:
                return None
    return None


@dataclass(frozen=True)
class Estimate:
    """The CPU a run needs (cores), split into what idles and what scales with the rates."""

    fixed_cores: float
    traffic_cores: float
    pps: float
    endpoints: int  # endpoint processes (:func:`~experiments.run.endpoints.process_groups`)
    switches: int
    available_cores: float

    @property
    def cores(self) -> float:
        """All the run needs (cores)."""
        return self.fixed_cores + self.traffic_cores

    @property
    def fits(self) -> bool:
        """The run fits in what the machine can give it."""
        return self.cores <= self.available_cores

    def fit_factor(self) -> float:
        """The factor the link rates must be scaled by to fit (<= 1; 0 when the idle cost alone
        is more than the machine has)."""
        room = self.available_cores - self.fixed_cores
        if room <= 0:
            return 0.0
        return min(1.0, room / self.traffic_cores) if self.traffic_cores > 0 else 1.0

    def machine_factor(self) -> float:
        """The factor that makes the traffic fill :data:`MACHINE_SHARE` of the room idling leaves
        (above 1: faster than the scenario's rates; 0 when idling alone is more than the machine
        has)."""
        room = self.available_cores - self.fixed_cores
        if room <= 0:
            return 0.0
        return MACHINE_SHARE * room / self.traffic_cores if self.traffic_cores > 0 else 1.0


def estimate(scn: Scenario, spec: ClosSpec, cal: Calibration) -> Estimate:
    """The CPU ``scn`` on ``spec`` needs by ``cal`` (see the module docstring)."""
    frame = scn.settings.frame_bytes
    port_pps = spec.link.bandwidth_mbps * 1e6 / 8 / frame if spec.link.bandwidth_mbps else 0.0
    senders = {f.src for f in scn.flows} | (set(scn.collective.hosts) if scn.collective else set())
    receivers = {f.dst for f in scn.flows} | (set(scn.collective.hosts) if scn.collective else set())
    pps = min(len(senders), len(receivers)) * spec.planes * port_pps
    n_ep = len(process_groups(scn.hosts(), per_core=scn.processes_per_core))  # a process idles once for its hosts
    n_sw = spec.n_switches
    fixed = n_ep * cal.endpoint_idle_cores + n_sw * cal.switch_idle_cores
    traffic = pps * (cal.endpoint_tx_us + cal.endpoint_rx_us + HOPS * cal.switch_us_per_hop) / 1e6
    return Estimate(fixed, traffic, pps, n_ep, n_sw, USABLE * (os.cpu_count() or 1))


def scaled(spec: ClosSpec, factor: float) -> ClosSpec:
    """``spec`` with every link rate times ``factor`` (unshaped links stay unshaped; the path
    delay stays, so a path's BDP grows with the rate)."""
    link = spec.link

    def down(mbps: float) -> float:  # to 1 kb/s, rounded down so that the fitted run fits
        return math.floor(mbps * factor * 1000) / 1000
    return dataclasses.replace(spec, link=dataclasses.replace(
        link, bandwidth_mbps=down(link.bandwidth_mbps), t0_t1_bandwidth_mbps=down(link.t0_t1_bandwidth_mbps)))


def admit(scn: Scenario, dataplane: str, *, fit: bool = False, rates: str = "scenario", say=print) -> Scenario:
    """``scn`` as it may run here: unchanged when it fits (or there is no calibration, said
    through ``say``), its link rates scaled down with ``fit``; else raises :class:`CannotCarry`.
    With ``rates="machine"`` every link rate is scaled, up or down, so that the traffic fills
    :data:`MACHINE_SHARE` of what idling leaves (raises :class:`~topologies.errors.NotAvailable`
    without a calibration, :class:`CannotCarry` when idling alone is too much)."""
    cal = load_calibration(dataplane)
    if cal is None:
        if rates == "machine":
            raise NotAvailable(f"--rates machine needs this machine's calibration of {dataplane}: "
                               f"run mrclab calibrate first")
        say(f"no calibration of {dataplane} on this machine: the run is not checked against what it sustains "
            f"(mrclab calibrate measures it)")
        return scn
    spec = scn.spec_for(dataplane)
    est = estimate(scn, spec, cal)
    numbers = (f"needs about {est.cores:.2f} cores ({est.endpoints} endpoint processes, {est.switches} switches, up to "
               f"{est.pps:,.0f} pps over {HOPS} hops at {spec.link.bandwidth_mbps:g} Mb/s host ports) and this "
               f"machine gives a run {est.available_cores:.2f} of {os.cpu_count()} (calibrated {cal.when})")
    if rates == "machine" and spec.link.bandwidth_mbps:
        factor = est.machine_factor()
        if factor <= 0:
            raise CannotCarry(f"this machine cannot carry {scn.name} on {dataplane} at any rate: it {numbers}; "
                              "even idle, its endpoints and switches need more than that")
        new = scaled(spec, factor)
        say(f"admission: {numbers}; --rates machine scales every link rate by {factor:.2f} so that its traffic "
            f"fills {MACHINE_SHARE:.0%} of the {est.available_cores - est.fixed_cores:.2f} cores idling leaves "
            f"(host ports {new.link.bandwidth_mbps:g} Mb/s)")
        return _with_spec(scn, dataplane, new)
    if est.fits:
        say(f"admission: {numbers}")
        return scn
    factor = est.fit_factor()
    if not fit or factor <= 0:
        raise CannotCarry(f"this machine cannot carry {scn.name} on {dataplane}: it {numbers}"
                          + ("; --fit scales the link rates down to fit" if factor > 0 else
                             "; even idle, its endpoints and switches need more than that"))
    new = scaled(spec, factor)
    say(f"admission: {numbers}; --fit scales every link rate by {factor:.2f} "
        f"(host ports {new.link.bandwidth_mbps:g} Mb/s)")
    return _with_spec(scn, dataplane, new)


def _with_spec(scn: Scenario, dataplane: str, new: ClosSpec) -> Scenario:
    """``scn`` with ``new`` as its fabric on ``dataplane``."""
    if scn.spec_bmv2 is scn.spec:  # one spec for both planes: keep it so
        return dataclasses.replace(scn, spec=new, spec_bmv2=new)
    if scn.spec_for(dataplane) is scn.spec_bmv2:
        return dataclasses.replace(scn, spec_bmv2=new)
    return dataclasses.replace(scn, spec=new)
