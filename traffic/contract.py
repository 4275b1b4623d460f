"""The contract between the runner and the endpoint processes: the config one writes and the
other reads, and the telemetry records the endpoint writes and the runner reads back. Both sides
import this module, so a field renamed on one side is renamed on the other.

* :class:`EndpointConfig` (JSON, one file per host): what the endpoint does.
* Telemetry (JSON lines): :class:`Start`, then :class:`Sample` every ``telemetry_interval_s``,
  an event (one of :data:`EVENTS`, as it happens), and :class:`Summary` last. Every line carries
  ``type``, ``v`` (:data:`VERSION`), ``t_wall`` (time.time()) and ``t_mono``.

A record of another version, or a malformed one, is refused with :class:`ContractError` naming it;
a line cut short by a kill is skipped by :func:`read_telemetry`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mrclab.topologies.errors import BadInput
from mrclab.topologies.schema import Problems, build, check_mapping, field_rules, rule
from mrclab.traffic.evs import EvState
from mrclab.traffic.settings import TransportSettings
from mrclab.traffic.stats import ReceiverStats, SenderStats

#: Bumped whenever a field changes meaning or goes away.
VERSION = 5
TRANSPORTS = ("mrc", "roce")
OPS = ("write", "write_imm")


class ContractError(BadInput):
    """A config or telemetry record that does not follow this contract; the message names it."""


# ---- the config -------------------------------------------------------------------------------
@dataclass(frozen=True)
class QpConfig:
    """One QP this host sends on: ``count`` messages of ``message_bytes`` (None: unbounded) to
    ``peer``, from ``start_s`` for ``duration_s`` (None: until every message is acknowledged)."""

    qp: int = field(metadata=rule(kind=int, lo=1, hi=0xFFFF, required=True))
    peer: str = field(metadata=rule(kind=str, required=True))
    message_bytes: int = field(metadata=rule(kind=int, lo=0, hi=1 << 30, required=True))
    op: str = field(default="write", metadata=rule(choices=OPS))
    start_s: float = field(default=0.0, metadata=rule(kind=float, lo=0))
    duration_s: float | None = field(default=None, metadata=rule(kind=(float, type(None)), lo=0))
    count: int | None = field(default=None, metadata=rule(kind=(int, type(None)), lo=0))
    pin_ev: int | None = field(default=None, metadata=rule(kind=(int, type(None)), lo=0, hi=(1 << 32) - 1))


@dataclass(frozen=True)
class CollectiveConfig:
    """This host's part in a collective (traffic/collective.py): ``kind`` over ``ranks`` (every
    host taking part, in ring order), ``message_bytes`` per host, ``iterations`` back to back,
    each write over ``qps_per_peer`` QPs, from ``start_s``; ``seed`` seeds every rank's data."""

    kind: str = field(metadata=rule(choices=("all_reduce", "all_gather", "all_to_all"), required=True))
    ranks: tuple[str, ...] = field(metadata=rule(kind=list, required=True))
    message_bytes: int = field(metadata=rule(kind=int, lo=1, hi=1 << 30, required=True))
    iterations: int = field(default=1, metadata=rule(kind=int, lo=1, hi=100000))
    qps_per_peer: int = field(default=1, metadata=rule(kind=int, lo=1, hi=64))
    start_s: float = field(default=0.0, metadata=rule(kind=float, lo=0))
    seed: int = 1  # seeds every rank's data (traffic/collective.py initial_data): the same at every rank


@dataclass(frozen=True)
class EndpointConfig:
    """Everything one endpoint process needs (``python -m mrclab.traffic.endpoint --config FILE``).

    ``topo``: path of the fabric YAML; ``host``: this host; ``seed`` seeds the EV draws and the
    message contents; ``denylist``: EVs this host must not use (DENIED); ``start_at_wall``: the
    time.time() at which t = 0 (QPs start at it + ``start_s``; None: at once); ``go_path``: with no
    ``start_at_wall``, a file the runner writes once every endpoint is ready (its ``start`` record),
    holding t = 0 as time.time() (the start-up barrier; the endpoint waits for it after opening
    its sockets); a host with no QPs exits ``receiver_linger_s`` after its last peer's end.
    """

    topo: str = field(metadata=rule(kind=str, required=True))
    host: str = field(metadata=rule(kind=str, required=True))
    seed: int = 1
    transport: str = field(default="mrc", metadata=rule(choices=TRANSPORTS))
    settings: TransportSettings = field(default=TransportSettings(), metadata=rule(kind=dict))
    denylist: tuple[int, ...] = field(default=(), metadata=rule(kind=list))
    qps: tuple[QpConfig, ...] = field(default=(), metadata=rule(kind=list))
    telemetry_path: str | None = field(default=None, metadata=rule(kind=(str, type(None))))
    telemetry_interval_s: float = field(default=0.1, metadata=rule(kind=float, positive=True))
    start_at_wall: float | None = field(default=None, metadata=rule(kind=(float, type(None))))
    go_path: str | None = field(default=None, metadata=rule(kind=(str, type(None))))
    receiver_linger_s: float = field(default=3600.0, metadata=rule(kind=float, lo=0))
    collective: CollectiveConfig | None = field(default=None, metadata=rule(kind=(dict, type(None))))
    version: int = VERSION

    def to_json(self) -> str:
        """The config as the JSON file the endpoint reads."""
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, d: Any, source: str = "config") -> EndpointConfig:
        """A config from its JSON mapping; raises :class:`ContractError` naming every bad field."""
        problems = Problems(source)
        if isinstance(d, dict) and d.get("version", VERSION) != VERSION:
            raise ContractError(f"{source}: config version {d.get('version')!r}; this mrclab reads version {VERSION}")
        kw = check_mapping(d, field_rules(cls), "", problems)
        if "settings" in kw:
            kw["settings"] = build(TransportSettings, kw["settings"], "", problems, prefix="settings.")
        qps = []
        for i, q in enumerate(kw.get("qps", ())):
            qps.append(build(QpConfig, q, f"qps[{i}]", problems))
        kw["qps"] = tuple(qps)
        if kw.get("collective") is not None:
            kw["collective"] = build(CollectiveConfig, kw["collective"], "collective", problems)
            if kw["collective"] is not None:
                kw["collective"] = dataclasses.replace(kw["collective"], ranks=tuple(kw["collective"].ranks))
        den = kw.get("denylist", ())
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 32 for x in den):
            problems.add(f"denylist = {den!r}; allowed: a list of 32-bit EVs")
        kw["denylist"] = tuple(den)
        problems.raise_if_any(ContractError)
        return cls(**kw)

    @classmethod
    def load(cls, path: str | Path) -> EndpointConfig:
        """The config in the JSON file at ``path``; raises :class:`ContractError` naming what is wrong."""
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ContractError(f"{path}: cannot read the endpoint config ({e})") from None
        return cls.from_dict(d, str(path))


# ---- events -----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Event:
    """Something that happened at an endpoint. ``peer``: the other host of the QP it concerns."""

    kind: ClassVar[str] = "event"
    peer: str = ""


@dataclass(frozen=True, kw_only=True)
class EvStateChanged(Event):
    """An EV of QP ``qp`` changed state (``old`` -> ``new``) for ``reason``. ``age_s``, for a
    retirement: how long before it the packet whose loss or timeout retired the EV was sent (s), so
    the retirement answers what happened in that span and no earlier; None for other changes."""
    kind: ClassVar[str] = "ev_state"
    qp: int
    ev: int
    old: EvState
    new: EvState
    reason: str
    age_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class PacketLost(Event):
    """A data packet found lost: ``reason`` "gap on EV" (a SACK showed a later packet of its EV)
    or "timeout"; ``age_s``: how long before it was found lost it had been sent."""

    kind: ClassVar[str] = "loss"
    qp: int
    psn: int
    ev: int
    reason: str
    age_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class GapFound(Event):
    """PSN ``psn`` sent on ``ev`` is missing behind PSN ``behind`` of the same EV."""

    kind: ClassVar[str] = "gap"
    qp: int
    psn: int
    ev: int
    behind: int


@dataclass(frozen=True, kw_only=True)
class TimedOut(Event):
    """A data packet (``psn``, sent on ``ev``) was not acknowledged before the retransmission timeout."""
    kind: ClassVar[str] = "timeout"
    qp: int
    psn: int
    ev: int


@dataclass(frozen=True, kw_only=True)
class SpuriousTimeout(Event):
    """A data packet the retransmission timer gave up on arrived after all: a SACK echoed its
    arrival (``psn`` on ``ev``, the EV of the transmission that timed out) ``age_s`` after it was
    sent, having waited ``nic_wait_s`` in its own NIC port's queue (the sending host's model of
    it, traffic/nicqueue.py; None where the port rate is unknown), and ``wire_s`` between its send
    stamp and its receiving endpoint (the one-way time the SACK echoed, protocol/headers.py
    ``STAMP_HZ``; None where the echoed arrival had no stamp). One longer on its way than the
    model allows it (experiments/analysis/fidelity.py ``HeldLimits``: the switch queues, the NIC queue, the
    propagation) was held outside the model, by the emulator (a switch thread, a veth, a qdisc):
    "held packets". Spurious timeouts: RFC 3522 (Eifel detection)."""

    kind: ClassVar[str] = "spurious_timeout"
    qp: int
    psn: int
    ev: int
    age_s: float
    nic_wait_s: float | None = None
    wire_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Nacked(Event):
    """The receiver NACKed a data packet (``psn`` on ``ev``) that reached it trimmed."""
    kind: ClassVar[str] = "nack"
    qp: int
    psn: int
    ev: int


@dataclass(frozen=True, kw_only=True)
class Trimmed(Event):
    """The receiver got a trimmed packet (payload cut by a switch) and NACKed it."""

    kind: ClassVar[str] = "trim"
    qp: int
    psn: int
    ev: int


@dataclass(frozen=True, kw_only=True)
class MessageCorrupt(Event):
    """A completed message's CRC did not match: its bytes are not what was sent."""
    kind: ClassVar[str] = "corrupt"
    qp: int
    msn: int


@dataclass(frozen=True, kw_only=True)
class PlaneChanged(Event):
    """A sender stopped (``up`` False) or resumed using a plane (its port is down at either end)."""

    kind: ClassVar[str] = "plane"
    qp: int
    plane: int
    up: bool


@dataclass(frozen=True, kw_only=True)
class PortsChanged(Event):
    """This NIC's port-state bitmap changed (bit p: plane p's port has carrier)."""

    kind: ClassVar[str] = "ports"
    state: int


@dataclass(frozen=True, kw_only=True)
class ReverseEvChanged(Event):
    """A reverse (SACK) EV towards ``peer`` left (ASSUMED_BAD) or rejoined (GOOD) the rotation."""

    kind: ClassVar[str] = "reverse_ev"
    ev: int
    state: EvState


@dataclass(frozen=True, kw_only=True)
class CollectiveIteration(Event):
    """This host finished iteration ``index`` of its collective: it began at ``start_wall`` and
    ended at ``end_wall`` (time.time(), s), holding a buffer of CRC-32 ``crc``."""

    kind: ClassVar[str] = "collective_iteration"
    index: int
    start_wall: float
    end_wall: float
    crc: int


EVENTS: dict[str, type[Event]] = {c.kind: c for c in (EvStateChanged, PacketLost, GapFound, TimedOut,
                                                       SpuriousTimeout, Nacked, Trimmed, MessageCorrupt,
                                                       PlaneChanged, PortsChanged,
                                                       ReverseEvChanged, CollectiveIteration)}


def event_fields(e: Event) -> dict[str, Any]:
    """``{"kind": ..., field: value, ...}`` of an event (EV states as their names)."""
    return {"kind": e.kind, **{k: (str(v) if isinstance(v, EvState) else v) for k, v in asdict(e).items()}}


# ---- telemetry records --------------------------------------------------------------------------
@dataclass(frozen=True)
class TxQp:
    """One sending QP at a sample: its counters, smoothed RTT, the state of every EV, its window
    (bytes) and, for DCQCN, its rate (bits/s); in the summary also every message's completion time
    (seconds, first packet sent to last acknowledged)."""

    peer: str
    qp: int
    stats: SenderStats
    srtt_us: float | None = None
    evs: dict[int, EvState] = field(default_factory=dict)
    window_bytes: float | None = None
    rate_bps: float | None = None
    completion_s: tuple[float, ...] = ()
    ev_packets: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RxQp:
    """One receiving QP at a sample (QPs are created when their first packet arrives)."""

    src: str
    qp: int
    delivered_bytes: int = 0
    messages_delivered: int = 0
    messages_corrupt: int = 0
    duplicates: int = 0
    trimmed: int = 0
    #: first transmissions that arrived behind a later one on their EV (ReceiverStats.reordered)
    reordered: int = 0

    @classmethod
    def of(cls, src: str, qp: int, st: ReceiverStats) -> RxQp:
        """The receive side of QP ``qp`` from ``src`` as its stats stand now."""
        return cls(src, qp, st.delivered_bytes, st.messages_delivered, st.messages_corrupt, st.duplicates, st.trimmed,
                   st.reordered)


@dataclass(frozen=True)
class Start:
    """The first record: the endpoint is ready (sockets open); its host, transport and QPs."""
    host: str
    transport: str
    qps: tuple[int, ...]


@dataclass(frozen=True)
class Sample:
    """Every ``telemetry_interval_s``: each QP's sending and receiving side, the port-state bitmap,
    and ``loop_gap_max_s``, since the last sample the most (s) the endpoint's loop waited for a CPU
    between the starts of two turns (runnable, not running: the kernel's run-queue delay): the
    time the machine took from its timers. The loop's own work and its chosen sleeps are not in
    it: a transport that spends its CPU shows that in its results, never here
    (experiments/analysis/fidelity.py reads it); ``rss_bytes``, the endpoint's resident memory (bytes,
    /proc/self/statm) when the sample was taken (0: unknown); and ``region_bytes``, the part of it
    that is receive regions' pages written so far (bytes; traffic/region.py, ``resident_total``):
    registered memory, which an RDMA NIC pins whole at registration and the kernel here fills in
    as messages first land; ``socket_drops``, frames the kernel dropped since the run began because
    the host's sockets' receive buffers were full (packet(7)'s PACKET_STATISTICS); and
    ``send_drops``, frames its ports refused since the run began with an error other than "no
    room yet" (ENOBUFS, which waits in the endpoint's backlog): dropped at send, a port going down."""

    tx: tuple[TxQp, ...]
    rx: tuple[RxQp, ...]
    ports: int
    loop_gap_max_s: float = 0.0
    rss_bytes: int = 0
    region_bytes: int = 0
    socket_drops: int = 0
    send_drops: int = 0


@dataclass(frozen=True)
class Summary:
    """The last record: totals, packets refused by reason, and the CPU seconds of the run loop
    (user + system, kernel work done on its behalf included; ``cpu_sys_s`` the system part)."""

    tx: tuple[TxQp, ...]
    rx: tuple[RxQp, ...]
    dropped: dict[str, int]
    cpu_s: float
    cpu_sys_s: float


Record = Start | Sample | Summary | Event


@dataclass(frozen=True)
class Timed:
    """A telemetry record with the times it was written at (seconds)."""

    t_wall: float
    t_mono: float
    rec: Record


_FIELDS: dict[type, tuple[str, ...]] = {}


def _plain(x: Any) -> Any:
    """``x`` as JSON takes it: dataclasses as dicts, tuples as lists, recursively (what
    ``dataclasses.asdict`` gives, without its deep copies: an endpoint encodes a sample of every QP
    a few times a second, and asdict was a tenth of an 8-host all-to-all endpoint's CPU)."""
    if hasattr(x, "__dataclass_fields__"):
        names = _FIELDS.get(type(x))
        if names is None:  # its fields, not its ClassVars (dataclasses.fields)
            names = _FIELDS[type(x)] = tuple(f.name for f in dataclasses.fields(x))
        return {k: _plain(getattr(x, k)) for k in names}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def encode(rec: Record) -> str:
    """One JSON line (no newline) for ``rec``, stamped with the version and the time now."""
    if isinstance(rec, Event):
        d: dict[str, Any] = {"type": "event", **event_fields(rec)}
    else:
        d = {"type": type(rec).__name__.lower(), **_plain(rec)}
    d.update(v=VERSION, t_wall=time.time(), t_mono=time.monotonic())
    return json.dumps(d, separators=(",", ":"))


def _tx(d: dict) -> TxQp:
    return TxQp(d["peer"], int(d["qp"]), SenderStats(**d["stats"]), d.get("srtt_us"),
                {int(k): EvState(v) for k, v in (d.get("evs") or {}).items()}, d.get("window_bytes"),
                d.get("rate_bps"), tuple(d.get("completion_s") or ()),
                {int(k): int(v) for k, v in (d.get("ev_packets") or {}).items()})


def _rx(d: dict) -> RxQp:
    return RxQp(**d)


def decode(line: str, source: str = "telemetry") -> Timed:
    """The record of one telemetry line. Raises :class:`ContractError` for a line of another
    version or shape, ValueError (json) for a line that is not JSON."""
    d = json.loads(line)
    if not isinstance(d, dict) or d.get("v") != VERSION:
        got = d.get("v") if isinstance(d, dict) else None
        raise ContractError(f"{source}: telemetry version {got!r}; this mrclab reads version {VERSION}")
    typ = d.pop("type", None)
    t_wall, t_mono = float(d.pop("t_wall")), float(d.pop("t_mono"))
    d.pop("v")
    try:
        if typ == "event":
            cls = EVENTS[d.pop("kind")]
            kw = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
            for k in ("old", "new", "state"):
                if k in kw and isinstance(kw[k], str):
                    kw[k] = EvState(kw[k])
            rec: Record = cls(**kw)
        elif typ == "start":
            rec = Start(d["host"], d["transport"], tuple(d["qps"]))
        elif typ == "sample":
            rec = Sample(tuple(_tx(q) for q in d["tx"]), tuple(_rx(q) for q in d["rx"]), int(d["ports"]),
                         float(d.get("loop_gap_max_s", 0.0)), int(d.get("rss_bytes", 0)),
                         int(d.get("region_bytes", 0)), int(d.get("socket_drops", 0)),
                         int(d.get("send_drops", 0)))
        elif typ == "summary":
            rec = Summary(tuple(_tx(q) for q in d["tx"]), tuple(_rx(q) for q in d["rx"]), dict(d["dropped"]),
                          float(d["cpu_s"]), float(d["cpu_sys_s"]))
        else:
            raise KeyError(f"type {typ!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise ContractError(f"{source}: malformed {typ} record ({e})") from None
    return Timed(t_wall, t_mono, rec)


def read_telemetry(path: Path) -> Iterator[Timed]:
    """Every record of a telemetry file; lines cut short by a kill are skipped, a missing file is
    empty."""
    try:
        fh = open(path)
    except OSError:
        return
    with fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield decode(line, str(path))
            except json.JSONDecodeError:
                continue  # a line cut by a kill
