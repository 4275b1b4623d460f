"""The fault timeline: each scenario event as a call on the running :class:`Fabric`.

Events (names as in ``mrclab up``; see experiments/scenario.py for their fields):
link_down/up, links_down/up, (link|links)_flap (expanded into downs and ups by the loader),
switch_down/up (process killed / restarted and reprogrammed), blackhole_on/off (up, forwards
nothing), gray_loss (a link drops ``rate`` of its packets), ev_loss (the first hop of one EV's path
drops ``rate``: the paper's figs. 12-13), port_down/up (a host NIC port), deny (an EV the
endpoints must not use; read at start).
"""

from __future__ import annotations

from controller.fabric import Fabric
from experiments.scenario import Fault, Scenario
from topologies.addressing import Path


def ev_path(fab_or_plan, f: Fault) -> Path:
    plan = getattr(fab_or_plan, "plan", fab_or_plan)
    return plan.path(f.args["src"], f.args["dst"], f.args["plane"], f.args.get("t1"))


def apply_fault(fab: Fabric, f: Fault, scn: Scenario) -> str:
    """Inject one fault; returns a one-line description for the event log."""
    a = f.args
    ev = f.event
    if ev in ("link_down", "link_up"):
        fab.set_link(*a["link"], up=ev == "link_up")
        return f"{ev} {a['link'][0]}:{a['link'][1]}"
    if ev in ("links_down", "links_up"):
        for link in a["links"]:
            fab.set_link(*link, up=ev == "links_up")
        return f"{ev} {len(a['links'])} links"
    if ev == "switch_down":
        fab.switch_down(a["switch"])
        return f"switch_down {a['switch']}"
    if ev == "switch_up":
        fab.switch_up(a["switch"])
        return f"switch_up {a['switch']}"
    if ev in ("blackhole_on", "blackhole_off"):
        fab.blackhole(a["switch"], ev == "blackhole_on")
        return f"{ev} {a['switch']}"
    if ev == "gray_loss":
        fab.link_loss(*a["link"], rate=a["rate"], salt=scn.seed)
        return f"gray_loss {a['link'][0]}:{a['link'][1]} {a['rate']:.0%}"
    if ev == "ev_loss":
        p = ev_path(fab, f)
        first, nxt = p.hops[0], (p.hops[1] if len(p.hops) > 1 else p.dst)
        fab.port_loss(first, nxt, a["rate"], salt=scn.seed)
        return f"ev_loss plane {p.plane} T1 {p.t1} ({first}->{nxt}) {a['rate']:.0%}"
    if ev in ("port_down", "port_up"):
        host, plane = a["host"], a["plane"]
        fab.set_link(host, fab.plan.host_t0(host, plane), up=ev == "port_up")
        return f"{ev} {host} plane {plane}"
    if ev == "deny":
        return f"deny plane {a['plane']} T1 {a.get('t1')} for {a['src']}->{a['dst']} (at start)"
    raise ValueError(f"unknown event {ev}")
