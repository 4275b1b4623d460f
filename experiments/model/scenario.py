"""Scenario files: fabric, data plane, seed, duration, transport, workload, fault timeline, expectations.

A scenario is YAML (see ``experiments/scenarios/*.yaml``)::

    name: t1-down
    paper: "fig. 11 - T1 switch down under cross-T1 traffic: no steady-state loss of bandwidth"
    fabric: {topo: lab, link: {bandwidth_mbps: 8}}   # topo: a shipped name or a path; other keys override it
    dataplane: auto            # auto | bmv2 | linux
    seed: 1
    duration_s: 30
    transport: {kind: mrc, evs_per_plane: 4}          # kind: mrc | roce; other keys go to the endpoint
    workload:
      - {src: h0, dst: h2, qps: 1, message_bytes: 65536, bidirectional: false, op: write}
    faults:
      - {at: 10, event: switch_down, switch: t1-0-0}
    expect:
      - {metric: goodput_ratio, window: [12, 18], min: 0.85}

Every name (host, switch, link, plane, event, metric) and every time is checked by
:func:`load_scenario` before anything starts; a bad one raises :class:`ScenarioError` naming the
file, the field and what is allowed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mrclab.controller.queues import QueueSettings
from mrclab.experiments.model.claims import CLAIMS, ArgContext, check_expectation
from mrclab.experiments.model.collective import CollectiveSpec, parse_collective
from mrclab.experiments.model.faults import FAULTS, Fault, parse_fault
from mrclab.experiments.model.sweepspec import Sweep, parse_sweep
from mrclab.topologies.errors import BadInput
from mrclab.topologies.schema import Problems, Rule, build, check_mapping, suggest
from mrclab.topologies.spec import DEFAULT_TOPO, ClosSpec, SpecError
from mrclab.traffic.contract import OPS, TRANSPORTS
from mrclab.traffic.settings import TransportSettings

SCENARIO_DIR = Path(__file__).resolve().parent.parent / "scenarios"
TOPO_DIR = DEFAULT_TOPO.parent
QUICKSTART = "quickstart"
#: The duration (s) a scenario is compressed to in the suite and by ``mrclab reproduce --quick``
#: unless it says otherwise (``quick_s``): every shipped scenario passes there.
QUICK_S = 14.0

#: metric -> (required keys, optional keys). See experiments/analysis/metrics.py for their definitions.
DATAPLANES = ("auto", "bmv2", "linux")
#: Mechanisms of the switches that a run can switch off like the transport's (``--set trim=off``):
#: ``trim``, the switches trim what would overflow a queue (off: ``queues.trim_t`` 0, they drop it).
SWITCH_MECHANISMS = ("trim",)
_NUMBER = Rule(kind=float)
TOP = {
    "name": Rule(kind=str), "paper": Rule(kind=str), "description": Rule(kind=str),
    "fabric": Rule(kind=dict), "fabric_bmv2": Rule(kind=dict),
    "dataplane": Rule(choices=DATAPLANES), "seed": Rule(kind=int),
    "duration_s": Rule(kind=float, lo=1, hi=3600, allowed="1 to 3600 seconds"),
    "quick_s": Rule(kind=float, lo=1, hi=3600, allowed="1 to 3600 seconds"),
    "processes_per_core": Rule(kind=int, lo=1, hi=4, allowed="1 to 4 endpoint processes per core"),
    "transport": Rule(kind=(dict, type(None))), "workload": Rule(kind=(list, type(None))),
    "collective": Rule(kind=dict), "sweep": Rule(kind=dict), "expect_sweep": Rule(kind=list),
    "faults": Rule(kind=(list, type(None))), "expect": Rule(kind=(list, type(None))),
    "expect_roce": Rule(kind=(list, type(None))),
    "queues": Rule(kind=dict),
    "servers": Rule(kind=dict),
    "demonstrates": Rule(kind=dict, allowed="{MECHANISM: [METRIC, ...]}: each mechanism the scenario demonstrates "
                         f"({', '.join(TransportSettings.MECHANISMS + SWITCH_MECHANISMS)}) and the metrics of its "
                         "expect that FAIL with it off"),
}


class ScenarioError(BadInput):
    """A scenario that cannot run; the message names the file, every bad field and what is allowed."""


@dataclass(frozen=True)
class Flow:
    """``qps`` QPs from ``src`` to ``dst`` writing ``message_bytes`` messages from ``start_s`` on;
    ``pin``: (plane, T1) of the one path the flow is held to (paper fig. 14: a flow forced onto
    another flow's EV), else it sprays."""

    src: str
    dst: str
    qps: int = 1
    message_bytes: int = 65536
    op: str = "write"  # write | write_imm
    start_s: float = 0.0
    pin: tuple[int, int | None] | None = None


@dataclass(frozen=True)
class Expectation:
    """One bound a run must meet: a metric of the registry (experiments/analysis/expectations.py) and its arguments."""
    metric: str
    args: dict = field(default_factory=dict, hash=False, compare=False)

    def describe(self) -> str:
        """``metric(arg=value, ...)``, as the verdict table shows it."""
        a = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.metric}({a})"


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: fabric (and its bmv2 variant), data plane, seed, duration, transport,
    workload, collective, sweep, fault timeline and expectations (see the module docstring)."""
    name: str
    source: str
    spec: ClosSpec
    spec_bmv2: ClosSpec
    dataplane: str
    seed: int
    duration_s: float
    transport: str
    settings: TransportSettings
    queues: QueueSettings
    flows: tuple[Flow, ...]
    faults: tuple[Fault, ...]
    expect: tuple[Expectation, ...]
    paper: str = ""
    description: str = ""
    #: mechanism -> the metrics of ``expect`` that FAIL with it off (what the scenario shows it buys)
    demonstrates: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False, compare=False)
    collective: CollectiveSpec | None = None
    sweep: Sweep | None = None  # the grid this scenario runs over (experiments/model/sweepspec.py)
    #: the duration (s) the suite and ``mrclab reproduce --quick`` compress the timeline to: the
    #: shortest at which its faults still mean what they mean at full length (``quick_s``, default 14)
    quick_s: float = QUICK_S
    #: endpoint processes per core where hosts share them (None: experiments/run/endpoints.py's
    #: default); a scenario whose hosts' processes starved each other sets fewer
    processes_per_core: int | None = None
    raw: dict = field(default_factory=dict, hash=False, compare=False)

    def spec_for(self, dataplane) -> ClosSpec:
        """The fabric the scenario runs on ``dataplane`` (a data plane or its name): the file's
        ``fabric_<name>`` overrides where it has them (``fabric_bmv2``), else ``fabric``."""
        return {"bmv2": self.spec_bmv2}.get(getattr(dataplane, "name", dataplane), self.spec)

    @property
    def needs(self) -> set[str]:
        """Data-plane features the scenario needs (controller.fabric.FEATURES): its faults', and
        ``congestion`` when it sets switch queues."""
        return {FAULTS[f.event].feature for f in self.faults} | ({"congestion"} if "queues" in self.raw else set())

    def hosts(self) -> list[str]:
        """Hosts that run an endpoint: every source and destination, every rank of the collective."""
        ranks = set(self.collective.hosts) if self.collective else set()
        return sorted({f.src for f in self.flows} | {f.dst for f in self.flows} | ranks, key=lambda h: int(h[1:]))


def resolve(name_or_path: str | None) -> Path:
    """A scenario file from a path or a shipped name (``t1-down``); None -> the quickstart."""
    if name_or_path is None:
        return SCENARIO_DIR / f"{QUICKSTART}.yaml"
    p = Path(name_or_path)
    if p.exists():
        return p
    shipped = SCENARIO_DIR / f"{name_or_path}.yaml"
    if shipped.exists():
        return shipped
    names = ", ".join(sorted(x.stem for x in SCENARIO_DIR.glob("*.yaml")))
    raise ScenarioError(f"no scenario {name_or_path!r}: not a file, nor a shipped scenario ({names})")


def load_scenario(path: str | Path | None, *, duration_s: float | None = None,
                  dataplane: str | None = None, transport: str | None = None,
                  settings: dict[str, Any] | None = None, seed: int | None = None) -> Scenario:
    """Read and validate a scenario. Overrides (command line) are applied before validation;
    ``settings`` set fields of its ``transport:`` block (``--set ev_health=off``); ``seed``
    replaces the scenario's seed (every random choice of the run: EV draws, message contents,
    gray loss, random faults)."""
    p = resolve(str(path) if path is not None else None)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{p}: cannot read scenario ({e})") from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{p}: a scenario is a mapping of fields")
    raw = copy.deepcopy(raw)
    if duration_s is not None:
        _rescale(raw, float(duration_s), str(p))
    if dataplane is not None:
        raw["dataplane"] = dataplane
    if transport is not None:
        raw.setdefault("transport", {})["kind"] = transport
    if settings:
        settings = dict(settings)
        for mech in SWITCH_MECHANISMS:
            if mech in settings and settings.pop(mech) is False:
                raw["queues"] = {**(raw.get("queues") or {}), "trim_t": 0}
        raw["transport"] = {**(raw.get("transport") or {}), **settings}
    if seed is not None:
        raw["seed"] = seed
    return parse_scenario(raw, str(p))


def parse_set(items: list[str] | None) -> dict[str, Any]:
    """``["ev_health=off", "window_packets=8"]`` -> their values as YAML reads them (off: False).
    Raises :class:`ScenarioError` for an item without ``=``."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ScenarioError(f"--set {item!r}; allowed: NAME=VALUE, e.g. ev_health=off "
                                f"(mechanisms: {', '.join(TransportSettings.MECHANISMS + SWITCH_MECHANISMS)})")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _rescale(raw: dict, duration_s: float, src: str) -> None:
    """Compress or stretch the timeline to ``duration_s``: fault times, flap periods, workload
    start times, expectation windows and ``after`` scale; physical bounds (``within_s``,
    ``max`` seconds) do not."""
    old = raw.get("duration_s", 30)
    if not isinstance(old, (int, float)) or old <= 0 or duration_s <= 0:
        raise ScenarioError(f"{src}: --duration {duration_s}; allowed: a positive number of seconds")
    k = duration_s / old
    raw["duration_s"] = duration_s
    for f in raw.get("faults", []) or []:
        for key in ("at", "period_s"):
            if isinstance(f, dict) and isinstance(f.get(key), (int, float)):
                f[key] = round(f[key] * k, 3)
    for w in [*(raw.get("workload", []) or []), raw.get("collective")]:
        if isinstance(w, dict) and isinstance(w.get("start_s"), (int, float)):
            w["start_s"] = round(w["start_s"] * k, 3)
    for key in ("expect", "expect_roce"):
        for e in raw.get(key, []) or []:
            if isinstance(e, dict):
                for w in ("window", "baseline"):
                    if isinstance(e.get(w), list):
                        e[w] = [round(x * k, 3) for x in e[w]]
                if isinstance(e.get("after"), (int, float)):
                    e["after"] = round(e["after"] * k, 3)


def parse_scenario(raw: dict, src: str) -> Scenario:
    """Validate a scenario mapping (see module docstring). Raises :class:`ScenarioError` naming
    every problem of the file at once."""
    problems = Problems(src)
    top = check_mapping(raw, TOP, "", problems, quote="{label} {value!r}")
    spec = _fabric(raw.get("fabric", {}) or {}, src, problems)
    spec_bmv2 = spec
    bm = raw.get("fabric_bmv2")
    if bm is not None and spec is not None:
        # overrides for the bmv2 data plane, whose switches forward a few thousand packets per
        # second here, so its links must be slower for the NIC ports to stay the bottleneck
        if not isinstance(bm, dict) or "topo" in bm:
            problems.add("fabric_bmv2: a mapping of spec fields that override fabric on bmv2 (no topo)")
        else:
            merged = dict(raw.get("fabric", {}) or {})
            for k, v in bm.items():
                merged[k] = {**merged.get(k, {}), **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
            spec_bmv2 = _fabric(merged, src, problems)
            if spec_bmv2 is not None and (spec_bmv2.planes, spec_bmv2.t0_per_plane, spec_bmv2.t1_per_plane,
                                          spec_bmv2.hosts_per_t0) != (spec.planes, spec.t0_per_plane,
                                                                      spec.t1_per_plane, spec.hosts_per_t0):
                problems.add("fabric_bmv2 may change links and prefixes, not the fabric's shape")
    dur = float(top.get("duration_s", 30))
    tr = dict(top.get("transport") or {})
    kind = tr.pop("kind", "mrc")
    if kind not in TRANSPORTS:
        problems.add(f"transport.kind {kind!r}; allowed: {', '.join(TRANSPORTS)}")
    settings = build(TransportSettings, tr, "", problems, prefix="transport.")
    queues = build(QueueSettings, top.get("queues", {}), "", problems, prefix="queues.")
    if spec is None:
        problems.raise_if_any(ScenarioError)
    assert spec is not None
    coll = parse_collective(raw.get("collective"), spec, dur, problems) if "collective" in raw else None
    flows = (_workload(raw.get("workload"), spec, dur, problems)
             if raw.get("workload") or "collective" not in raw else [])
    faults: list[Fault] = []
    for i, f in enumerate(top.get("faults") or []):
        faults.extend(parse_fault(f, i, spec, dur, problems, scenario_seed=top.get("seed", 1)))
    faults.sort(key=lambda f: f.at)
    # ``expect`` bounds the MRC run; ``expect_roce`` (optional) the same scenario on the baseline,
    # whose expectations differ (the paper's point). Both are validated whichever runs.
    parsed = {k: _expectations(raw.get(k) or [], k, dur, spec, problems) for k in ("expect", "expect_roce")}
    demo = _demonstrates(top.get("demonstrates") or {}, {x.metric for x in parsed["expect"]}, problems)
    sweep = parse_sweep(raw, problems)
    problems.raise_if_any(ScenarioError)
    assert spec is not None and spec_bmv2 is not None  # a fabric that did not parse is a problem raised above
    expect = parsed["expect_roce"] if kind == "roce" and "expect_roce" in raw else parsed["expect"]
    return Scenario(
        name=str(raw.get("name", Path(src).stem)), source=src, spec=spec, spec_bmv2=spec_bmv2,
        dataplane=top.get("dataplane", "auto"), seed=int(top.get("seed", 1)), duration_s=dur, transport=kind,
        settings=settings or TransportSettings(), queues=queues or QueueSettings(), flows=tuple(flows),
        faults=tuple(faults), expect=tuple(expect),
        paper=str(raw.get("paper", "")), description=str(raw.get("description", "")), demonstrates=demo,
        collective=coll, sweep=sweep, raw=raw, quick_s=float(top.get("quick_s", QUICK_S)),
        processes_per_core=int(top["processes_per_core"]) if "processes_per_core" in top else None,
    )


def _demonstrates(demo: dict, metrics: set[str], problems: Problems) -> dict[str, tuple[str, ...]]:
    """``demonstrates:`` checked: each key a mechanism (the transport's or the switches'), each value
    a non-empty list of metrics the scenario's ``expect`` bounds (those that FAIL with it off)."""
    allowed = TransportSettings.MECHANISMS + SWITCH_MECHANISMS
    out: dict[str, tuple[str, ...]] = {}
    for mech, moved in demo.items():
        if mech not in allowed:
            problems.add(f"demonstrates.{mech}; allowed: {', '.join(allowed)}")
            continue
        if not isinstance(moved, list) or not moved or any(m not in metrics for m in moved):
            problems.add(f"demonstrates.{mech} = {moved!r}; allowed: a list of the metrics this scenario's expect "
                         f"bounds ({', '.join(sorted(metrics)) or 'none'}) that FAIL with {mech} off")
            continue
        out[mech] = tuple(moved)
    return out


_WORKLOAD = {
    "src": Rule(kind=str, required=True), "dst": Rule(kind=str, required=True),
    "qps": Rule(kind=int, lo=1, hi=64), "message_bytes": Rule(kind=int, lo=1, hi=1 << 30, allowed="1 to 2^30"),
    "bidirectional": Rule(kind=bool), "op": Rule(choices=OPS), "start_s": Rule(kind=float, lo=0),
    "pin": Rule(kind=dict, allowed="{plane: P, t1: N}: the one path of the flow"),
}


def _workload(wl: Any, spec: ClosSpec, dur: float, problems: Problems) -> list[Flow]:
    if not isinstance(wl, list) or not wl:
        problems.add("workload: a non-empty list of flows {src, dst, qps, message_bytes, bidirectional, op} "
                     "(or a collective:)")
        return []
    hosts = spec.hosts()
    flows = []
    for i, w in enumerate(wl):
        where = f"workload[{i}]"
        n = len(problems)
        v = check_mapping(w, _WORKLOAD, where, problems)
        for k in ("src", "dst"):
            if k in v and v[k] not in hosts:
                problems.add(f"{where}.{k} = {v[k]!r}: unknown host; "
                             f"hosts are {', '.join(hosts)}{suggest(v[k], hosts)}")
        if v.get("src") is not None and v.get("src") == v.get("dst"):
            problems.add(f"{where}: src and dst are both {v['src']}")
        start = v.get("start_s", 0.0)
        if start >= dur:
            problems.add(f"{where}.start_s = {start!r}; allowed: 0 to duration_s ({dur:g})")
        pin = None
        if "pin" in v:
            pv = v["pin"]
            plane, t1 = pv.get("plane"), pv.get("t1")
            if set(pv) - {"plane", "t1"} or not isinstance(plane, int) or not 0 <= plane < spec.planes or \
                    (t1 is not None and not (isinstance(t1, int) and 0 <= t1 < spec.t1_per_plane)):
                problems.add(f"{where}.pin = {pv!r}; allowed: {{plane: 0..{spec.planes - 1}, "
                             f"t1: 0..{spec.t1_per_plane - 1}}}")
            pin = (plane, t1)
        if len(problems) > n:
            continue
        f = Flow(v["src"], v["dst"], v.get("qps", 1), v.get("message_bytes", 65536), v.get("op", "write"), start, pin)
        flows.append(f)
        if v.get("bidirectional", False):
            flows.append(Flow(f.dst, f.src, f.qps, f.message_bytes, f.op, f.start_s))
    return flows


def _expectations(items: Any, key: str, dur: float, spec: ClosSpec, problems: Problems) -> list[Expectation]:
    """The scenario's ``expect`` / ``expect_roce`` list, each checked against the metric registry
    (experiments/analysis/expectations.py); every problem goes into ``problems``."""
    if not isinstance(items, list):
        problems.add(f"{key}: a list of {{metric: NAME, ...}}; metrics: {', '.join(CLAIMS)}")
        return []
    ctx = ArgContext(dur, spec)
    expect = []
    for i, e in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(e, dict):
            problems.add(f"{where} = {e!r}; allowed: {{metric: NAME, ...}}; metrics: {', '.join(CLAIMS)}")
            continue
        args = {k: v for k, v in e.items() if k != "metric"}
        said = check_expectation(e.get("metric"), args, ctx)
        for x in said:
            problems.add(f"{where}{'' if x.startswith(('.', '(')) else '.'}{x}"
                         + (suggest(str(e.get("metric")), CLAIMS) if x.startswith("metric =") else ""))
        if not said:
            expect.append(Expectation(e["metric"], args))
    return expect


def _fabric(f: Any, src: str, problems: Problems) -> ClosSpec | None:
    if not isinstance(f, dict):
        problems.add("fabric: a mapping (topo: NAME|PATH plus spec fields to override)")
        return None
    f = dict(f)
    topo = f.pop("topo", "lab")
    p = Path(str(topo))
    if not p.exists():
        p = TOPO_DIR / f"{topo}.yaml"
    if not p.exists():
        names = sorted(x.stem for x in TOPO_DIR.glob("*.yaml"))
        problems.add(f"fabric.topo = {topo!r}: no such file or shipped topology ({', '.join(names)})")
        return None
    base = yaml.safe_load(p.read_text()) or {}
    for k, v in f.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    try:
        return ClosSpec.from_dict(base, source=f"fabric, based on {p.name}")
    except SpecError as e:
        problems.add(str(e))
        return None
