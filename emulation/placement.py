"""Where a fabric runs: its planes placed on servers (:class:`Placement`), from ``--servers A,B,...``
or a ``servers:`` block in a fabric, a scenario or a file of its own (:func:`parse_block`), and
the servers opened for a run (:func:`open_cluster`). How servers are reached and checked is
emulation/servers.py; how a fabric is built over them is emulation/cluster.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mrclab.emulation.servers import Server, Ssh, TemporarySsh, parse_servers
from mrclab.topologies.errors import BadInput


@dataclass(frozen=True)
class Placement:
    """Where a fabric's nodes run: each plane's switches on one of ``servers`` (``planes``: plane
    -> server as a ``servers:`` block placed them; else plane ``p`` on ``servers[p % N]``: one
    plane per server, round-robin), the hosts and the controller on this machine. Planes meet
    only at the hosts' NICs, so the host-to-T0 links are the only links that cross servers."""

    servers: tuple[Server, ...]
    planes: tuple[tuple[int, Server], ...] = ()

    def server_of_plane(self, plane: int) -> Server:
        """The server that runs plane ``plane``'s switches."""
        for p, s in self.planes:
            if p == plane:
                return s
        return self.servers[plane % len(self.servers)]

    def server_of(self, node: str) -> Server | None:
        """The server that runs fabric node ``node`` (``h3``, ``t0-1-0``); None for this machine."""
        if node.startswith("t"):
            return self.server_of_plane(int(node.split("-")[1]))
        return None

    def planes_of(self, server: Server, planes: int) -> list[int]:
        """The planes (of ``planes``) placed on ``server``."""
        return [p for p in range(planes) if self.server_of_plane(p) == server]

    def check(self, planes: int) -> None:
        """Raise BadInput unless an explicit placement names each of a fabric's ``planes`` planes once."""
        if not self.planes:
            return
        named = sorted(p for p, _ in self.planes)
        if named != list(range(planes)):
            raise BadInput(f"servers: the planes placed are {named}; this fabric has planes 0-{planes - 1}, "
                           f"and each must be on one server (or place none: round-robin)")

    def describe(self, planes: int) -> str:
        """One line: which planes run where."""
        return "; ".join(f"{s.name}: plane{'s' if len(self.planes_of(s, planes)) > 1 else ''} "
                         f"{', '.join(map(str, self.planes_of(s, planes)))}"
                         for s in self.servers if self.planes_of(s, planes)) + "; hosts and controller here"


@dataclass(frozen=True)
class Cluster:
    """A fabric's servers: where its planes go (``placement``) and how they are reached (``ssh``)."""

    placement: Placement
    ssh: Ssh


@contextlib.contextmanager
def open_cluster(servers_text: str | None, ssh_config: str | None = None,
                 files: tuple[str | Path | None, ...] = ()) -> Iterator[Cluster | None]:
    """The :class:`Cluster` of ``--servers``: ``A,B,...`` or a YAML file with a ``servers:`` block
    (:func:`parse_block`); without it, the first of ``files`` (the fabric's, the scenario's) that
    has such a block; None when none does (one machine, nothing opened). Its ssh connections
    are closed on exit. ``--ssh-config`` wins over a block's. Raises BadInput for a bad server
    list or block, an ssh configuration that is not a file."""
    placement, block_config = None, None
    if servers_text and (servers_text.endswith((".yaml", ".yml")) or Path(servers_text).is_file()):
        block = block_in_file(servers_text)
        if block is None:
            raise BadInput(f"--servers: {servers_text} has no servers: block")
        placement, block_config = parse_block(block, str(servers_text))
    elif servers_text:
        placement = Placement(tuple(parse_servers(servers_text)))
    else:
        for f in files:
            if f is not None and Path(f).is_file() and (block := block_in_file(f)) is not None:
                placement, block_config = parse_block(block, str(f))
                break
    if placement is None:
        if ssh_config:
            raise BadInput("--ssh-config is for --servers; give both, or neither")
        yield None
        return
    ssh_config = ssh_config or block_config
    if ssh_config and not Path(ssh_config).is_file():
        raise BadInput(f"--ssh-config: {ssh_config} is not a file")
    with TemporarySsh(ssh_config) as ssh:
        yield Cluster(placement, ssh)



def parse_block(data: Any, source: str) -> tuple[Placement, str | None]:
    """A ``servers:`` block (in a fabric, a scenario or a file of its own) as a placement and its
    ssh configuration (a path, relative to ``source``'s folder). The block::

        servers:
          ssh_config: lab_ssh_config        # optional: ssh -F
          machines:
            - 10.0.0.2                      # [user@]address
            - {address: 10.0.0.3, user: lab, planes: [1, 3]}

    ``planes`` may be given for every machine or none (round-robin). Raises BadInput naming
    ``source`` and what is wrong."""
    where = f"{source}: servers"
    if not isinstance(data, dict) or set(data) - {"ssh_config", "machines"} or "machines" not in data:
        raise BadInput(f"{where}: a mapping with machines (a list) and optionally ssh_config")
    machines = data["machines"]
    if not isinstance(machines, list) or not machines:
        raise BadInput(f"{where}.machines: a list of [user@]address or {{address, user, planes}}")
    found: list[Server] = []
    placed: list[tuple[int, Server]] = []
    with_planes = 0
    for i, m in enumerate(machines):
        if isinstance(m, str):
            m = {"address": m}
        if not isinstance(m, dict) or set(m) - {"address", "user", "planes"} or "address" not in m:
            raise BadInput(f"{where}.machines[{i}]: [user@]address, or a mapping of address, user, planes")
        server = parse_servers(str(m["address"]) if "user" not in m else f"{m['user']}@{m['address']}")[0]
        if server in found:
            raise BadInput(f"{where}.machines[{i}]: {server.name} is given twice")
        found.append(server)
        if "planes" in m:
            with_planes += 1
            if not isinstance(m["planes"], list) or not all(isinstance(p, int) and p >= 0 for p in m["planes"]):
                raise BadInput(f"{where}.machines[{i}].planes: a list of plane numbers (0, 1, ...)")
            placed += [(p, server) for p in m["planes"]]
    if with_planes not in (0, len(found)):
        raise BadInput(f"{where}: give planes for every machine or for none (none: round-robin)")
    seen = [p for p, _ in placed]
    if len(seen) != len(set(seen)):
        raise BadInput(f"{where}: a plane is placed on two machines "
                       f"({sorted(p for p in set(seen) if seen.count(p) > 1)})")
    ssh_config = data.get("ssh_config")
    if ssh_config is not None:
        if not isinstance(ssh_config, str):
            raise BadInput(f"{where}.ssh_config: a path")
        ssh_config = str(Path(source).parent / Path(ssh_config).expanduser())
    return Placement(tuple(found), tuple(sorted(placed, key=lambda x: x[0]))), ssh_config


def block_in_file(path: str | Path) -> Any:
    """The ``servers:`` value of YAML file ``path`` (a fabric, a scenario or a file of its own),
    None when it has none. Raises BadInput for a file that cannot be read as YAML."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise BadInput(f"{path}: cannot read it as YAML ({e})") from None
    return data.get("servers") if isinstance(data, dict) else None
