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

from topologies.addressing import AddressPlan
from topologies.spec import DEFAULT_TOPO, ClosSpec, SpecError

SCENARIO_DIR = Path(__file__).with_name("scenarios")
TOPO_DIR = DEFAULT_TOPO.parent
QUICKSTART = "quickstart"

#: event -> (required keys, optional keys, data-plane feature it needs)
EVENTS: dict[str, tuple[set[str], set[str], str]] = {
    "link_down": ({"link"}, set(), "link"),
    "link_up": ({"link"}, set(), "link"),
    "links_down": ({"links"}, set(), "link"),
    "links_up": ({"links"}, set(), "link"),
    "link_flap": ({"link"}, {"period_s", "count"}, "link"),
    "links_flap": ({"links"}, {"period_s", "count"}, "link"),
    "switch_down": ({"switch"}, set(), "switch"),
    "switch_up": ({"switch"}, set(), "switch"),
    "blackhole_on": ({"switch"}, set(), "blackhole"),
    "blackhole_off": ({"switch"}, set(), "blackhole"),
    "gray_loss": ({"link", "rate"}, set(), "gray_loss"),
    "ev_loss": ({"src", "dst", "plane", "rate"}, {"t1"}, "gray_loss"),
    "port_down": ({"host", "plane"}, set(), "link"),
    "port_up": ({"host", "plane"}, set(), "link"),
    "deny": ({"src", "dst", "plane"}, {"t1"}, "link"),
}

#: metric -> (required keys, optional keys). See experiments/metrics.py for their definitions.
METRICS: dict[str, tuple[set[str], set[str]]] = {
    "goodput_ratio": ({"window"}, {"min", "max", "host"}),
    "recovery_time_s": ({"after"}, {"fraction", "max", "host"}),
    "retransmit_fraction": (set(), {"max", "min"}),
    "messages_intact": (set(), {"equals"}),
    "evs_retired": (set(), {"after", "within_s", "min", "max"}),
    "retire_time_rtts": (set(), {"after", "max"}),
    "goodput_mbps": ({"window"}, {"min", "max", "host"}),
}

TRANSPORTS = ("mrc", "roce")
DATAPLANES = ("auto", "bmv2", "linux")
TOP_KEYS = {"name", "paper", "description", "fabric", "fabric_bmv2", "dataplane", "seed", "duration_s",
            "transport", "workload", "faults", "expect", "expect_roce"}
WORKLOAD_KEYS = {"src", "dst", "qps", "message_bytes", "bidirectional", "op", "start_s"}


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the field and what is allowed."""


@dataclass(frozen=True)
class Flow:
    src: str
    dst: str
    qps: int = 1
    message_bytes: int = 65536
    op: str = "write"  # write | write_imm
    start_s: float = 0.0


@dataclass(frozen=True)
class Fault:
    at: float
    event: str
    args: dict = field(default_factory=dict, hash=False, compare=False)

    def describe(self) -> str:
        a = " ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.event} {a}".strip()


@dataclass(frozen=True)
class Expectation:
    metric: str
    args: dict = field(default_factory=dict, hash=False, compare=False)

    def describe(self) -> str:
        a = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.metric}({a})"


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    spec: ClosSpec
    spec_bmv2: ClosSpec
    dataplane: str
    seed: int
    duration_s: float
    transport: str
    transport_settings: dict
    flows: tuple[Flow, ...]
    faults: tuple[Fault, ...]
    expect: tuple[Expectation, ...]
    paper: str = ""
    description: str = ""
    raw: dict = field(default_factory=dict, hash=False, compare=False)

    def spec_for(self, dataplane: str) -> ClosSpec:
        return self.spec_bmv2 if dataplane == "bmv2" else self.spec

    @property
    def needs(self) -> set[str]:
        return {EVENTS[f.event][2] for f in self.faults}

    def hosts(self) -> list[str]:
        """Hosts that run an endpoint: every source and destination."""
        return sorted({f.src for f in self.flows} | {f.dst for f in self.flows}, key=lambda h: int(h[1:]))


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
                  dataplane: str | None = None, transport: str | None = None) -> Scenario:
    """Read and validate a scenario. Overrides (command line) are applied before validation."""
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
    return parse_scenario(raw, str(p))


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
    for w in raw.get("workload", []) or []:
        if isinstance(w, dict) and isinstance(w.get("start_s"), (int, float)):
            w["start_s"] = round(w["start_s"] * k, 3)
    for key in ("expect", "expect_roce"):
        for e in raw.get(key, []) or []:
            if isinstance(e, dict):
                if isinstance(e.get("window"), list):
                    e["window"] = [round(x * k, 3) for x in e["window"]]
                if isinstance(e.get("after"), (int, float)):
                    e["after"] = round(e["after"] * k, 3)


def parse_scenario(raw: dict, src: str) -> Scenario:
    """Validate a scenario mapping (see module docstring). Raises :class:`ScenarioError`."""

    def err(msg: str) -> ScenarioError:
        return ScenarioError(f"{src}: {msg}")

    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise err(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TOP_KEYS))}")
    spec = _fabric(raw.get("fabric", {}), src)
    plan = AddressPlan(spec)
    # fabric_bmv2: overrides for the bmv2 data plane, whose switches forward a few thousand packets
    # per second here, so its links must be slower for the NIC ports to stay the bottleneck
    bm = raw.get("fabric_bmv2")
    spec_bmv2 = spec
    if bm is not None:
        if not isinstance(bm, dict) or "topo" in bm:
            raise err("fabric_bmv2: a mapping of spec fields that override fabric on bmv2 (no topo)")
        merged = dict(raw.get("fabric", {}) or {})
        for k, v in bm.items():
            merged[k] = {**merged.get(k, {}), **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
        spec_bmv2 = _fabric(merged, src)
        if (spec_bmv2.planes, spec_bmv2.t0_per_plane, spec_bmv2.t1_per_plane, spec_bmv2.hosts_per_t0) != \
                (spec.planes, spec.t0_per_plane, spec.t1_per_plane, spec.hosts_per_t0):
            raise err("fabric_bmv2 may change links and prefixes, not the fabric's shape")
    dp = raw.get("dataplane", "auto")
    if dp not in DATAPLANES:
        raise err(f"dataplane {dp!r}; allowed: {', '.join(DATAPLANES)}")
    seed = raw.get("seed", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise err(f"seed {seed!r}; allowed: an integer")
    dur = raw.get("duration_s", 30)
    if not isinstance(dur, (int, float)) or isinstance(dur, bool) or not 1 <= dur <= 3600:
        raise err(f"duration_s {dur!r}; allowed: 1 to 3600 seconds")
    tr = dict(raw.get("transport", {}) or {})
    kind = tr.pop("kind", "mrc")
    if kind not in TRANSPORTS:
        raise err(f"transport.kind {kind!r}; allowed: {', '.join(TRANSPORTS)}")

    hosts = set(spec.hosts())
    flows = []
    wl = raw.get("workload")
    if not isinstance(wl, list) or not wl:
        raise err("workload: a non-empty list of flows {src, dst, qps, message_bytes, bidirectional, op}")
    for i, w in enumerate(wl):
        where = f"workload[{i}]"
        if not isinstance(w, dict):
            raise err(f"{where}: a mapping")
        bad = sorted(set(w) - WORKLOAD_KEYS)
        if bad:
            raise err(f"{where}: unknown field(s) {', '.join(bad)}; allowed: {', '.join(sorted(WORKLOAD_KEYS))}")
        for k in ("src", "dst"):
            if w.get(k) not in hosts:
                raise err(f"{where}.{k} = {w.get(k)!r}: unknown host; hosts are {', '.join(spec.hosts())}")
        if w["src"] == w["dst"]:
            raise err(f"{where}: src and dst are both {w['src']}")
        qps = w.get("qps", 1)
        size = w.get("message_bytes", 65536)
        op = w.get("op", "write")
        start = w.get("start_s", 0.0)
        if not isinstance(qps, int) or not 1 <= qps <= 64:
            raise err(f"{where}.qps = {qps!r}; allowed: 1 to 64")
        if not isinstance(size, int) or not 1 <= size <= 1 << 30:
            raise err(f"{where}.message_bytes = {size!r}; allowed: 1 to 2^30")
        if op not in ("write", "write_imm"):
            raise err(f"{where}.op = {op!r}; allowed: write, write_imm")
        if not isinstance(start, (int, float)) or not 0 <= start < dur:
            raise err(f"{where}.start_s = {start!r}; allowed: 0 to duration_s ({dur})")
        flows.append(Flow(w["src"], w["dst"], qps, size, op, float(start)))
        if w.get("bidirectional", False):
            flows.append(Flow(w["dst"], w["src"], qps, size, op, float(start)))

    faults = []
    for i, f in enumerate(raw.get("faults", []) or []):
        faults.extend(_fault(f, i, spec, plan, dur, err))
    faults.sort(key=lambda f: f.at)

    # ``expect`` bounds the MRC run; ``expect_roce`` (optional) the same scenario on the baseline,
    # whose expectations differ (the paper's point). Both are validated whichever runs.
    parsed = {k: _expectations(raw.get(k, []) or [], k, dur, hosts, spec, err) for k in ("expect", "expect_roce")}
    expect = parsed["expect_roce"] if kind == "roce" and "expect_roce" in raw else parsed["expect"]

    return Scenario(
        name=str(raw.get("name", Path(src).stem)), source=src, spec=spec, spec_bmv2=spec_bmv2, dataplane=dp, seed=seed,
        duration_s=float(dur), transport=kind, transport_settings=tr, flows=tuple(flows),
        faults=tuple(faults), expect=tuple(expect), paper=str(raw.get("paper", "")),
        description=str(raw.get("description", "")), raw=raw,
    )


def _expectations(items: Any, key: str, dur: float, hosts: set[str], spec: ClosSpec, err) -> list[Expectation]:
    if not isinstance(items, list):
        raise err(f"{key}: a list of {{metric: NAME, ...}}; metrics: {', '.join(METRICS)}")
    expect = []
    for i, e in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(e, dict) or e.get("metric") not in METRICS:
            raise err(f"{where}.metric = {e.get('metric') if isinstance(e, dict) else e!r}; allowed: {', '.join(METRICS)}")
        req, opt = METRICS[e["metric"]]
        args = {k: v for k, v in e.items() if k != "metric"}
        missing = sorted(req - set(args))
        bad = sorted(set(args) - req - opt)
        if missing or bad:
            raise err(f"{where} ({e['metric']}): missing {missing or 'nothing'}, unknown {bad or 'nothing'}; "
                      f"allowed: {', '.join(sorted(req | opt))}")
        if "window" in args:
            w = args["window"]
            if not (isinstance(w, list) and len(w) == 2 and all(isinstance(x, (int, float)) for x in w)
                    and 0 <= w[0] < w[1] <= dur):
                raise err(f"{where}.window = {w!r}; allowed: [start, end] within 0..duration_s ({dur})")
        if "after" in args and not (isinstance(args["after"], (int, float)) and 0 <= args["after"] <= dur):
            raise err(f"{where}.after = {args['after']!r}; allowed: a time within 0..duration_s ({dur})")
        if "host" in args and args["host"] not in hosts:
            raise err(f"{where}.host = {args['host']!r}: unknown host; hosts are {', '.join(spec.hosts())}")
        expect.append(Expectation(e["metric"], args))
    return expect


def _fabric(f: Any, src: str) -> ClosSpec:
    if not isinstance(f, dict):
        raise ScenarioError(f"{src}: fabric: a mapping (topo: NAME|PATH plus spec fields to override)")
    f = dict(f)
    topo = f.pop("topo", "lab")
    p = Path(topo)
    if not p.exists():
        p = TOPO_DIR / f"{topo}.yaml"
    if not p.exists():
        raise ScenarioError(f"{src}: fabric.topo = {topo!r}: no such file or shipped topology")
    base = yaml.safe_load(p.read_text()) or {}
    for k, v in f.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    try:
        return ClosSpec.from_dict(base, source=f"{src} (fabric, based on {p.name})")
    except SpecError as e:
        raise ScenarioError(str(e)) from None


def _link(value: Any, spec: ClosSpec, where: str, err) -> tuple[str, str]:
    links = {f"{a}:{b}" for a, b in spec.links()}
    if isinstance(value, str) and ":" in value:
        a, b = value.split(":", 1)
        if f"{a}:{b}" in links:
            return a, b
        if f"{b}:{a}" in links:
            return b, a
    example = ", ".join(sorted(links)[:3])
    raise err(f"{where} = {value!r}: unknown link; links are 'lower:upper' node pairs such as {example}")


def _fault(f: Any, i: int, spec: ClosSpec, plan: AddressPlan, dur: float, err) -> list[Fault]:
    where = f"faults[{i}]"
    if not isinstance(f, dict) or f.get("event") not in EVENTS:
        ev = f.get("event") if isinstance(f, dict) else f
        raise err(f"{where}.event = {ev!r}; allowed: {', '.join(EVENTS)}")
    ev = f["event"]
    req, opt, _ = EVENTS[ev]
    args = {k: v for k, v in f.items() if k not in ("event", "at")}
    missing = sorted(req - set(args))
    bad = sorted(set(args) - req - opt)
    if missing or bad:
        raise err(f"{where} ({ev}): missing {missing or 'nothing'}, unknown {bad or 'nothing'}; "
                  f"allowed: {', '.join(sorted(req | opt)) or 'nothing'}")
    at = f.get("at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at < dur:
        raise err(f"{where}.at = {at!r}; allowed: a time in seconds from 0 to below duration_s ({dur})")
    if "link" in args:
        args["link"] = _link(args["link"], spec, f"{where}.link", err)
    if "links" in args:
        if not isinstance(args["links"], list) or not args["links"]:
            raise err(f"{where}.links: a non-empty list of links")
        args["links"] = [_link(x, spec, f"{where}.links[{j}]", err) for j, x in enumerate(args["links"])]
    if "switch" in args and args["switch"] not in spec.switches():
        raise err(f"{where}.switch = {args['switch']!r}: unknown switch; switches are {', '.join(spec.switches())}")
    for k in ("host", "src", "dst"):
        if k in args and args[k] not in spec.hosts():
            raise err(f"{where}.{k} = {args[k]!r}: unknown host; hosts are {', '.join(spec.hosts())}")
    if "plane" in args and not (isinstance(args["plane"], int) and 0 <= args["plane"] < spec.planes):
        raise err(f"{where}.plane = {args['plane']!r}; allowed: 0..{spec.planes - 1}")
    if "t1" in args and not (isinstance(args["t1"], int) and 0 <= args["t1"] < spec.t1_per_plane):
        raise err(f"{where}.t1 = {args['t1']!r}; allowed: 0..{spec.t1_per_plane - 1}")
    if "rate" in args and not (isinstance(args["rate"], (int, float)) and 0 <= args["rate"] <= 1):
        raise err(f"{where}.rate = {args['rate']!r}; allowed: 0.0 to 1.0")
    if ev == "ev_loss" and spec.group_of(args["src"]) != spec.group_of(args["dst"]) and "t1" not in args:
        raise err(f"{where}: ev_loss between T0 groups needs t1 (0..{spec.t1_per_plane - 1}) to name the path")
    if ev == "deny" and at != 0:
        raise err(f"{where}.at = {at}: deny entries are read by the endpoints at start; allowed: 0")
    if ev.endswith("flap"):
        period = args.setdefault("period_s", 2.0)
        count = args.setdefault("count", 3)
        if not (isinstance(period, (int, float)) and period > 0 and isinstance(count, int) and count >= 1):
            raise err(f"{where}: period_s > 0 and count >= 1 required")
        # a flap is down for half a period and up again, ``count`` times: expand it
        key = "links" if "links" in args else "link"
        out = []
        for k in range(count):
            t_down = at + k * period
            t_up = t_down + period / 2
            if t_up >= dur:
                raise err(f"{where}: flap {k + 1} of {count} ends at {t_up:.1f} s, past duration_s ({dur})")
            down, up = ("links_down", "links_up") if key == "links" else ("link_down", "link_up")
            out += [Fault(float(t_down), down, {key: args[key]}), Fault(float(t_up), up, {key: args[key]})]
        return out
    return [Fault(float(at), ev, args)]
