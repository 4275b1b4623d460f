"""A scenario's ``collective:`` block: the collective it runs over its hosts (:class:`CollectiveSpec`),
checked against the fabric by :func:`parse_collective`. What the hosts do is traffic/collective.py's;
the figures a run of it yields (nccl-tests' algbw and busbw) are experiments/analysis/collectives.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mrclab.topologies.schema import Problems, Rule, check_mapping, suggest
from mrclab.topologies.spec import ClosSpec


@dataclass(frozen=True)
class CollectiveSpec:
    """A scenario's ``collective:``: ``kind`` (all_reduce | all_gather | all_to_all) over ``hosts``
    (ring order), ``message_bytes`` per host, ``iterations`` back to back, each write over
    ``qps_per_peer`` QPs, from ``start_s`` (traffic/collective.py); the first ``warmup`` are not
    timed (nccl-tests ``-w``, whose default of 5 is this one's: experiments/analysis/collectives.py)."""

    kind: str
    hosts: tuple[str, ...]
    message_bytes: int
    iterations: int = 1
    qps_per_peer: int = 1
    start_s: float = 0.0
    warmup: int = 5


_COLLECTIVE = {
    "kind": Rule(choices=("all_reduce", "all_gather", "all_to_all"), required=True),
    "hosts": Rule(kind=(list, str), allowed="all, or a list of 2 or more hosts in ring order"),
    "message_bytes": Rule(kind=int, lo=1, hi=1 << 30, required=True, allowed="1 to 2^30"),
    "iterations": Rule(kind=int, lo=1, hi=100000), "qps_per_peer": Rule(kind=int, lo=1, hi=64),
    "start_s": Rule(kind=float, lo=0),
    "warmup": Rule(kind=int, lo=0, hi=100000, allowed="0 or more iterations not timed (nccl-tests -w)"),
}


def parse_collective(c: Any, spec: ClosSpec, dur: float, problems: Problems) -> CollectiveSpec | None:
    """A scenario's ``collective:`` block checked against the fabric (every problem added to
    ``problems``), or None when it has one."""
    n = len(problems)
    v = check_mapping(c, _COLLECTIVE, "collective", problems)
    hosts = spec.hosts()
    ranks = v.get("hosts", "all")
    if ranks == "all":
        ranks = hosts
    elif isinstance(ranks, str) or len(ranks) < 2 or len(set(ranks)) != len(ranks):
        problems.add(f"collective.hosts = {ranks!r}; allowed: all, or a list of 2 or more distinct hosts")
        ranks = []
    for h in ranks:
        if h not in hosts:
            problems.add(f"collective.hosts: {h!r}: unknown host; hosts are {', '.join(hosts)}{suggest(str(h), hosts)}")
    q = v.get("qps_per_peer", 1)
    if "message_bytes" in v and ranks and v["message_bytes"] < len(ranks) * q:
        problems.add(f"collective.message_bytes = {v['message_bytes']}; allowed: at least hosts x qps_per_peer "
                     f"({len(ranks) * q}) bytes")
    if v.get("start_s", 0.0) >= dur:
        problems.add(f"collective.start_s = {v['start_s']!r}; allowed: 0 to duration_s ({dur:g})")
    if len(problems) > n:
        return None
    return CollectiveSpec(v["kind"], tuple(ranks), v["message_bytes"], v.get("iterations", 1), q, v.get("start_s", 0.0),
                          v.get("warmup", 5))
