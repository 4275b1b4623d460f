"""The fault events a scenario can play, as one table (:data:`FAULTS`): each event's fields, the
data-plane feature it needs and the call on the running :class:`~controller.fabric.Fabric` that
plays it. The scenario loader validates a ``faults:`` entry from the same table the runner
dispatches it with, so the two cannot drift apart.

Events (nodes and links named as ``mrclab up`` shows them; a link is ``lower:upper``):

==================  ==============================  ===========================================
event               fields                          what happens
==================  ==============================  ===========================================
link_down, link_up  link                            the cable is cut / restored
links_down/up       links                           several at once
link_flap           link [period_s 2, count 3]      down half a period, up again, ``count`` times
links_flap          links [period_s, count]         the same, several links together
switch_down/up      switch                          the switch dies / restarts and is reprogrammed
blackhole_on/off    switch                          up, answers its controller, forwards nothing
gray_loss           link, rate                      both switch ends drop ``rate`` of what they send
ev_loss             src, dst, plane, rate [t1]      the first hop of one path drops ``rate`` (figs. 12-13)
random_loss         rate                            every switch port drops ``rate`` (figs. 16-17); 0 ends it
port_down, port_up  host, plane                     a host NIC port's link is cut / restored
deny                src, dst, plane [t1]            the path's EVs are DENIED for src (read at start)
==================  ==============================  ===========================================

Faults compose (controller/faults.py): each one holds its element until its own undo.

A fault can be aimed at a flow's RoCE path (the one path the baseline's ECMP hash gives its QP) by
naming it ``roce:SRC->DST[#QP]:PART`` in place of a switch, a link, a plane or a T1 number: PART
is ``t1``, ``src-t0`` or ``dst-t0`` (a switch; ``t1`` also the T1 number of an ``ev_loss``), ``up``
(the source T0's link to the T1), ``down`` (the T1's link to the destination T0), ``src-port`` or
``dst-port`` (a host link), or ``plane``. QPs are
numbered per sending host from 1, in workload order. The path is the same whichever transport runs,
so an MRC run meets the same fault the RoCE run is measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mrclab.topologies.addressing import AddressPlan, Path
from mrclab.topologies.schema import Problems, Rule, check_value, suggest
from mrclab.topologies.spec import ClosSpec
from mrclab.traffic.roce import ecmp_ev


@dataclass(frozen=True)
class Fault:
    """One event of a timeline at ``at`` seconds, with its validated fields."""

    at: float
    event: str
    args: dict = field(default_factory=dict, hash=False, compare=False)

    def describe(self) -> str:
        """``event field=value ...``, as the fault log and the plots label it."""
        a = " ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.event} {a}".strip()


Element = tuple[str, ...]  # ("switch", name) | ("link", lower, upper): what a fault can fail

#: What an event does to the elements it names (what the verdicts read, experiments/analysis/fabricstate.py):
#: ``fail`` holds them failed until the event that ``undoes`` it; ``repair`` ends that hold; ``loss``
#: holds them failed (they lose packets) while its rate is above 0 and a rate of 0 ends it; ``none``
#: fails no element (a static denial read at start; random loss spread over every port, which is the
#: sweep's variable, not a failure to map out).
EFFECTS = ("fail", "repair", "loss", "none")


@dataclass(frozen=True)
class FaultKind:
    """A fault event: its ``required`` and ``optional`` fields, the data-plane ``feature`` it
    needs (controller.fabric.FEATURES), ``play(fabric, args) -> description``, its ``effect`` on
    the elements it names (:data:`EFFECTS`), the event a ``repair`` undoes, and
    ``elements(plan, args)``, the switches and links it touches."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    feature: str
    play: Callable[[Any, dict], str]
    effect: str = "none"
    undoes: str | None = None
    elements: Callable[[AddressPlan, dict], list[Element]] = lambda _plan, _a: []


def _switch_el(_plan: AddressPlan, a: dict) -> list[Element]:
    return [("switch", a["switch"])]


def _link_el(_plan: AddressPlan, a: dict) -> list[Element]:
    return [("link", *a["link"])]


def _links_el(_plan: AddressPlan, a: dict) -> list[Element]:
    return [("link", *x) for x in a["links"]]


def _port_el(plan: AddressPlan, a: dict) -> list[Element]:
    return [("link", a["host"], plan.host_t0(a["host"], a["plane"]))]


def _ev_loss_el(plan: AddressPlan, a: dict) -> list[Element]:
    return [("link", *ev_path(plan, a).links[0])]


def _link_name(link: tuple[str, str]) -> str:
    return f"{link[0]}:{link[1]}"


def ev_path(plan: AddressPlan, args: dict) -> Path:
    """The path an ``ev_loss`` or ``deny`` entry names."""
    return plan.path(args["src"], args["dst"], args["plane"], args.get("t1"))


def _ev_loss(fab, a: dict) -> str:
    p = ev_path(fab.plan, a)
    first, nxt = p.hops[0], (p.hops[1] if len(p.hops) > 1 else p.dst)
    fab.port_loss(first, nxt, a["rate"])
    return f"ev_loss plane {p.plane} T1 {p.t1} ({first}->{nxt}) {a['rate']:.0%}"


def _random_loss(fab, a: dict) -> str:
    for x, y in fab.spec.links():
        fab.link_loss(x, y, a["rate"])
    return f"random_loss {a['rate']:.2%} on every switch port"


def _links(up: bool) -> Callable[[Any, dict], str]:
    def play(fab, a: dict) -> str:
        for link in a["links"]:
            fab.set_link(*link, up=up)
        return f"links_{'up' if up else 'down'} {len(a['links'])} links"
    return play


def _port(up: bool) -> Callable[[Any, dict], str]:
    def play(fab, a: dict) -> str:
        fab.set_link(a["host"], fab.plan.host_t0(a["host"], a["plane"]), up=up)
        return f"port_{'up' if up else 'down'} {a['host']} plane {a['plane']}"
    return play


def _flap_not_played(_fab, _a: dict) -> str:
    raise AssertionError("flaps are expanded into downs and ups by the loader")


FAULTS: dict[str, FaultKind] = {
    "link_down": FaultKind(("link",), (), "link",
                           lambda fab, a: (fab.set_link(*a["link"], up=False), f"link_down {_link_name(a['link'])}")[1],
                           "fail", None, _link_el),
    "link_up": FaultKind(("link",), (), "link",
                         lambda fab, a: (fab.set_link(*a["link"], up=True), f"link_up {_link_name(a['link'])}")[1],
                         "repair", "link_down", _link_el),
    "links_down": FaultKind(("links",), (), "link", _links(False), "fail", None, _links_el),
    "links_up": FaultKind(("links",), (), "link", _links(True), "repair", "links_down", _links_el),
    # flaps are expanded into link_down / link_up (links_down / links_up) events by the loader
    "link_flap": FaultKind(("link",), ("period_s", "count"), "link", _flap_not_played),
    "links_flap": FaultKind(("links",), ("period_s", "count"), "link", _flap_not_played),
    "switch_down": FaultKind(("switch",), (), "switch",
                             lambda fab, a: (fab.switch_down(a["switch"]), f"switch_down {a['switch']}")[1],
                             "fail", None, _switch_el),
    "switch_up": FaultKind(("switch",), (), "switch",
                           lambda fab, a: (fab.switch_up(a["switch"]), f"switch_up {a['switch']}")[1],
                           "repair", "switch_down", _switch_el),
    "blackhole_on": FaultKind(("switch",), (), "blackhole",
                              lambda fab, a: (fab.blackhole(a["switch"], True), f"blackhole_on {a['switch']}")[1],
                              "fail", None, _switch_el),
    "blackhole_off": FaultKind(("switch",), (), "blackhole",
                               lambda fab, a: (fab.blackhole(a["switch"], False), f"blackhole_off {a['switch']}")[1],
                               "repair", "blackhole_on", _switch_el),
    "gray_loss": FaultKind(("link", "rate"), (), "gray_loss",
                           lambda fab, a: (fab.link_loss(*a["link"], rate=a["rate"]),
                                           f"gray_loss {_link_name(a['link'])} {a['rate']:.0%}")[1],
                           "loss", None, _link_el),
    "ev_loss": FaultKind(("src", "dst", "plane", "rate"), ("t1",), "gray_loss", _ev_loss, "loss", None, _ev_loss_el),
    "random_loss": FaultKind(("rate",), (), "gray_loss", _random_loss),
    "port_down": FaultKind(("host", "plane"), (), "link", _port(False), "fail", None, _port_el),
    "port_up": FaultKind(("host", "plane"), (), "link", _port(True), "repair", "port_down", _port_el),
    "deny": FaultKind(("src", "dst", "plane"), ("t1",), "link",
                      lambda fab, a: f"deny plane {a['plane']} T1 {a.get('t1')} for {a['src']}->{a['dst']} (at start)"),
}

#: fail event -> the event that repairs it, derived from the table
UNDO: dict[str, str] = {k.undoes: name for name, k in FAULTS.items() if k.effect == "repair" and k.undoes}


def where(fab, f: Fault) -> dict[str, float]:
    """The servers holding the elements ``f`` touches (a fabric over servers), each with its
    clock's offset from this machine's (s, as read before the fabric was built): what turns the
    fault's time here into that server's time. {} on one machine."""
    emu = fab.emu
    out: dict[str, float] = {}
    for element in FAULTS[f.event].elements(fab.plan, f.args):
        for node in element[1:]:
            server = emu.server_of(node)
            if server is not None:
                out[server.name] = emu.clock_offset_s.get(server, 0.0)
    return out


def play(fab, f: Fault) -> str:
    """Inject ``f`` into the running fabric; returns a one-line description for the event log."""
    return FAULTS[f.event].play(fab, f.args)


# ---- validation ---------------------------------------------------------------------------------
def _field_rule(name: str, spec: ClosSpec) -> Rule:
    """The rule of fault field ``name`` on the fabric ``spec``."""
    hosts = spec.hosts()
    unknown_host = f"unknown host; hosts are {', '.join(hosts)}"
    rules = {
        "switch": Rule(kind=str, check=lambda v: None if v in spec.switches() else
                       f"unknown switch; switches are {', '.join(spec.switches())}{suggest(v, spec.switches())}"),
        "host": Rule(kind=str, check=lambda v: None if v in hosts else unknown_host),
        "src": Rule(kind=str, check=lambda v: None if v in hosts else unknown_host),
        "dst": Rule(kind=str, check=lambda v: None if v in hosts else unknown_host),
        "plane": Rule(kind=int, lo=0, hi=spec.planes - 1, allowed=f"0..{spec.planes - 1}"),
        "t1": Rule(kind=int, lo=0, hi=spec.t1_per_plane - 1, allowed=f"0..{spec.t1_per_plane - 1}"),
        "rate": Rule(kind=float, lo=0.0, hi=1.0, allowed="0.0 to 1.0"),
        "period_s": Rule(kind=float, positive=True, allowed="a positive number of seconds"),
        "count": Rule(kind=int, lo=1, allowed="an integer of at least 1"),
    }
    return rules[name]


def endpoint_seed(scenario_seed: int, host: str) -> int:
    """The seed of ``host``'s endpoint in a scenario seeded ``scenario_seed`` (it seeds its EV draws
    and its RoCE QPs' ECMP hash)."""
    return scenario_seed * 1000 + int(host[1:])


def roce_path(plan: AddressPlan, scenario_seed: int, src: str, dst: str, qp: int) -> Path:
    """The path the baseline's QP ``qp`` from ``src`` to ``dst`` takes (traffic/roce.py's hash)."""
    return plan.path_for_ev(src, dst, ecmp_ev(plan, src, dst, qp, endpoint_seed(scenario_seed, src)))


ROCE_PARTS = ("t1", "src-t0", "dst-t0", "up", "down", "src-port", "dst-port", "plane")


def resolve_roce(value: Any, key: str, plan: AddressPlan, scenario_seed: int, label: str,
                 problems: Problems) -> Any:
    """``value`` with a ``roce:SRC->DST[#QP]:PART`` reference (see the module docstring) replaced
    by the switch, link (``'a:b'``) or plane it names; other values as they are."""
    if not (isinstance(value, str) and value.startswith("roce:")):
        return value
    body = value[len("roce:"):]
    flow, _, part = body.rpartition(":")
    pair, _, qp = flow.partition("#")
    src, _, dst = pair.partition("->")
    hosts = plan.spec.hosts()
    if part not in ROCE_PARTS or src not in hosts or dst not in hosts or src == dst or (qp and not qp.isdigit()):
        problems.add(f"{label} = {value!r}; allowed: roce:SRC->DST[#QP]:PART, PART one of {', '.join(ROCE_PARTS)}")
        return None
    p = roce_path(plan, scenario_seed, src, dst, int(qp or 1))
    cross = p.t1 is not None
    wants = {"switch": ("t1", "src-t0", "dst-t0"), "link": ("up", "down", "src-port", "dst-port"), "plane": ("plane",),
             "t1": ("t1",)}
    if part not in wants.get(key, ()) or (part in ("t1", "up", "down") and not cross):
        problems.add(f"{label} = {value!r}: {part} does not name a {key} of that path "
                     f"({'same T0 group: no T1' if not cross else 'wrong kind'})")
        return None
    if part == "plane":
        return p.plane
    if key == "t1":
        return p.t1
    if key == "switch":
        return {"t1": p.hops[1] if cross else None, "src-t0": p.hops[0], "dst-t0": p.hops[-1]}[part]
    # "up" and "down" name a T1's links, which a path within one T0 group has not: refused above
    link = {"src-port": p.links[0], "dst-port": p.links[-1], "up": p.links[1] if cross else p.links[0],
            "down": p.links[2] if cross else p.links[-1]}[part]
    return f"{link[0]}:{link[1]}"


def parse_link(value: Any, spec: ClosSpec) -> tuple[str, str] | None:
    """A link ``'a:b'`` in either order as (lower, upper), or None."""
    links = set(spec.links())
    if isinstance(value, str) and ":" in value:
        a, b = value.split(":", 1)
        for link in ((a, b), (b, a)):
            if link in links:
                return link
    return None


def _link(value: Any, spec: ClosSpec, label: str, problems: Problems) -> tuple[str, str] | None:
    link = parse_link(value, spec)
    if link is None:
        example = ", ".join(sorted(f"{a}:{b}" for a, b in spec.links())[:3])
        problems.add(f"{label} = {value!r}: unknown link; links are 'lower:upper' node pairs such as {example}")
    return link


def parse_fault(f: Any, i: int, spec: ClosSpec, duration_s: float, problems: Problems,
                scenario_seed: int = 1) -> list[Fault]:
    """The faults of one ``faults:`` entry (a flap expands into downs and ups), [] when it is bad;
    every problem goes to ``problems``. ``roce:`` references resolve with ``scenario_seed``."""
    where = f"faults[{i}]"
    if not isinstance(f, dict) or f.get("event") not in FAULTS:
        ev = f.get("event") if isinstance(f, dict) else f
        problems.add(f"{where}.event = {ev!r}; allowed: {', '.join(FAULTS)}{suggest(str(ev), FAULTS)}")
        return []
    ev = f["event"]
    kind = FAULTS[ev]
    given = {k: v for k, v in f.items() if k not in ("event", "at")}
    missing = sorted(set(kind.required) - set(given))
    bad = sorted(set(given) - set(kind.required) - set(kind.optional))
    n = len(problems)
    if missing or bad:
        problems.add(f"{where} ({ev}): missing {missing or 'nothing'}, unknown {bad or 'nothing'}; "
                     f"allowed: {', '.join(sorted(kind.required + kind.optional)) or 'nothing'}")
    at = f.get("at")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at < duration_s:
        problems.add(f"{where}.at = {at!r}; allowed: a time in seconds from 0 to below duration_s ({duration_s:g})")
        at = 0.0  # reported; the rest of the entry is still checked
    args: dict[str, Any] = {}
    plan = AddressPlan(spec)
    for k, v in given.items():
        label = f"{where}.{k}"
        if k == "links" and isinstance(v, list):
            v = [resolve_roce(x, "link", plan, scenario_seed, f"{label}[{j}]", problems) for j, x in enumerate(v)]
        else:
            v = resolve_roce(v, k, plan, scenario_seed, label, problems)
        if k == "link":
            args[k] = _link(v, spec, label, problems)
        elif k == "links":
            if not isinstance(v, list) or not v:
                problems.add(f"{label}: a non-empty list of links")
            else:
                args[k] = [_link(x, spec, f"{label}[{j}]", problems) for j, x in enumerate(v)]
        elif k in kind.required + kind.optional:
            args[k] = check_value(v, _field_rule(k, spec), label, problems)
    if len(problems) > n:
        return []
    if ev == "ev_loss" and spec.group_of(args["src"]) != spec.group_of(args["dst"]) and "t1" not in args:
        problems.add(f"{where}: ev_loss between T0 groups needs t1 (0..{spec.t1_per_plane - 1}) to name the path")
    if ev in ("ev_loss", "deny") and args["src"] == args["dst"]:
        problems.add(f"{where}: src and dst are both {args['src']}")
    if ev == "deny" and at != 0:
        problems.add(f"{where}.at = {at}: deny entries are read by the endpoints at start; allowed: 0")
    if not ev.endswith("flap"):
        return [] if len(problems) > n else [Fault(float(at), ev, args)]
    # a flap is down for half a period and up again, ``count`` times: expand it
    period, count = float(args.setdefault("period_s", 2.0)), int(args.setdefault("count", 3))
    key = "links" if "links" in args else "link"
    out = []
    for k in range(count):
        t_down = at + k * period
        t_up = t_down + period / 2
        if t_up >= duration_s:
            problems.add(f"{where}: flap {k + 1} of {count} ends at {t_up:.1f} s, past duration_s ({duration_s:g})")
            return []
        down, up = ("links_down", "links_up") if key == "links" else ("link_down", "link_up")
        out += [Fault(float(t_down), down, {key: args[key]}), Fault(float(t_up), up, {key: args[key]})]
    return out
