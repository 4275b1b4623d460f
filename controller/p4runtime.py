"""P4Runtime writer: the route plan as table entries on BMv2, over p4runtime-shell's client.

One :class:`P4Switch` per switch (p4runtime-shell's ``P4RuntimeClient``, not the shell's single
global client). Writing is a diff: the switch's tables are read, then only the missing, changed
and stale entries are written, in batches; so re-applying is idempotent and cheap. Read-back
compares the tables with the plan entry by entry.

Table and action names are those of ``p4src/mrclab.p4``; IDs come from the P4Info that p4c wrote.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import google.protobuf.text_format
import grpc
from mrclab.controller.queues import QUEUE_SLACK, PortQueue
from mrclab.controller.routeplan import SwitchEntries
from mrclab.topologies.errors import RunFailed
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2
from p4runtime_sh import p4runtime as _p4rt
from p4runtime_sh.p4runtime import P4RuntimeClient, P4RuntimeException, P4RuntimeWriteException

BATCH = 500  # updates per WriteRequest
#: Ports a switch may have on bmv2: the size of p4src/mrclab.p4's per-port counters (MAX_PORTS)
MAX_PORTS = 64
ELECTION_ID = (0, 1)
#: The cookie of every pipeline mrclab pushes (P4Runtime spec, ForwardingPipelineConfig.Cookie): the
#: watchdog asks a switch for it alone to learn whether it still has its pipeline ("mrc" in ASCII).
PIPELINE_COOKIE = 0x6D7263
DROP_REASONS = ("not_ipv6", "no_route", "hop_limit", "blackhole", "gray_loss", "queue_full")  # p4src/mrclab.p4 DROP_*


def _next_error(self):
    """p4runtime-shell 0.0.6's ``P4RuntimeErrorIterator.__next__`` skips an update that succeeded
    (``canonical_code`` OK) without moving past it, so a batch with one refused update after an
    accepted one loops for ever while building the exception (seen: a whole ``mrclab reproduce``
    hung in it). The same iteration, moving on."""
    while self.idx < len(self.errors):
        p4_error = p4runtime_pb2.Error()
        if not self.errors[self.idx].Unpack(p4_error):
            raise _p4rt.P4RuntimeErrorFormatException("Cannot convert Any message to p4.Error")
        self.idx += 1
        if p4_error.canonical_code != 0:  # google.rpc.Code OK
            return self.idx - 1, p4_error
    raise StopIteration


_p4rt.P4RuntimeErrorIterator.__next__ = _next_error


class _WithoutP4RuntimeShell(logging.Filter):
    """p4runtime-shell logs its own handshake failures on the root logger (``logging.critical``)
    before it raises; mrclab reports them once, as a :class:`P4RuntimeError`. This filter drops
    only records from p4runtime-shell's own files: every other logger keeps its level."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "p4runtime_sh" not in record.pathname


logging.getLogger().addFilter(_WithoutP4RuntimeShell())


class P4RuntimeError(RunFailed):
    """A switch refused a request, could not be reached, or its tables differ from the plan."""


class P4Info:
    """Name -> ID index over a P4Info message."""

    def __init__(self, path: Path) -> None:
        """Read the text-format P4Info at ``path``; index its tables, actions and counters by short
        name (after the last dot)."""
        self.path = path
        self.msg = p4info_pb2.P4Info()
        google.protobuf.text_format.Merge(path.read_text(), self.msg, allow_unknown_field=True)
        self.tables = {t.preamble.name.split(".")[-1]: t for t in self.msg.tables}
        self.actions = {a.preamble.name.split(".")[-1]: a for a in self.msg.actions}
        self.counters = {c.preamble.name.split(".")[-1]: c for c in self.msg.counters}

    def table(self, name: str):
        """The P4Info table ``name``. Raises KeyError when there is none."""
        return self.tables[name]

    def field_id(self, table: str, field: str) -> int:
        """ID of match field ``field`` of ``table``. Raises KeyError when there is none."""
        for mf in self.tables[table].match_fields:
            if mf.name == field:
                return mf.id
        raise KeyError(f"{table} has no match field {field}")

    def action(self, name: str):
        """The P4Info action ``name``. Raises KeyError when there is none."""
        return self.actions[name]

    def param_ids(self, action: str) -> dict[str, int]:
        """Parameter name -> ID of ``action``'s parameters."""
        return {p.name: p.id for p in self.actions[action].params}


def _enc(value: int, bits: int) -> bytes:
    """P4Runtime canonical byte string: big endian, no leading zero bytes (at least one byte)."""
    if value >= 1 << bits:
        raise ValueError(f"{value} does not fit {bits} bits")
    n = max(1, (value.bit_length() + 7) // 8)
    return value.to_bytes(n, "big")


def _mac(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


@dataclass(frozen=True)
class EntryKey:
    """A table entry's identity: the table and, per match field in P4Info order, (value, prefix
    length for LPM or None for exact)."""

    table: str
    match: tuple[tuple[int, int | None], ...]


@dataclass(frozen=True)
class DesiredEntry:
    """One table entry, as the plan wants it or as read back: its key, its action's name and the
    action's (parameter name, value) pairs."""

    key: EntryKey
    action: str
    params: tuple[tuple[str, int], ...]


#: The switch's fault mode -> the action of its ``my_sid`` entry and ``my_sid``'s default action
#: (p4src/mrclab.p4, faults): healthy, some port with a ``port_fault`` entry, blackholed.
MODE_ACTIONS = {"healthy": ("usid_shift", "NoAction"), "check": ("usid_shift_check", "check_ports"),
                "blackhole": ("blackhole", "blackhole")}


def desired_entries(entries: SwitchEntries, queues: Mapping[int, PortQueue] | None = None,
                    mode: str = "healthy") -> list[DesiredEntry]:
    """The route plan of one switch in P4 terms (``my_sid``, its action the fault ``mode``'s of
    :data:`MODE_ACTIONS`, + ``routing``); each route's
    ``forward`` carries its egress port's thresholds from ``queues`` (port -> PortQueue; none: all 0,
    no marking, trimming or limit) and whether it is lossless (PFC: then the limit is the headroom's)."""
    sid48 = int(entries.sid.network_address) >> 80  # block | uSID: the first 48 bits of the address
    out = [DesiredEntry(EntryKey("my_sid", ((sid48, None),)), MODE_ACTIONS[mode][0], ())]
    for r in entries.routes:
        if r.prefix.prefixlen > 48:
            raise P4RuntimeError(f"{entries.switch}: route {r.prefix} is longer than /48; "
                                 "uSID routing keys on block + uSID")
        q = queues.get(r.port) if queues else None
        out.append(
            DesiredEntry(
                EntryKey("routing", ((int(r.prefix.network_address) >> 80, r.prefix.prefixlen),)),
                "forward",
                (("port", r.port), ("src_mac", _mac(r.src_mac)), ("dst_mac", _mac(r.dst_mac)),
                 ("ecn_k", q.ecn_k if q else 0), ("trim_t", q.trim_t if q else 0),
                 # a lossless port drops only what overflows its headroom (counted, and before BMv2's
                 # queue would drop it uncounted and leave qocc a packet high for good): the pause
                 # agent holds its feeders long before
                 ("q_limit", (q.depth - QUEUE_SLACK if q.lossless else q.q_limit) if q else 0),
                 ("lossless", int(q.lossless) if q else 0)),
            )
        )
    return out


#: Handshakes a session tries before it gives up, and the pause between two (s). A switch whose
#: process was just restarted (a ``switch_up`` fault) has its socket open before its gRPC server
#: answers every stream: the quickstart's T1 coming back on bmv2 refused the first handshake in
#: one run of four on an idle machine (2026-12-01), and the run ended in an error (exit 2).
CONNECT_TRIES = 3
CONNECT_RETRY_S = 0.5


class P4Switch:
    """A P4Runtime session with one BMv2 switch.

    Raises :class:`P4RuntimeError` when the switch cannot be reached or refuses a request.
    """

    def __init__(self, name: str, device_id: int, grpc_addr: str, p4info: P4Info, bmv2_json: Path,
                 queues: Mapping[int, PortQueue] | None = None) -> None:
        """A session to ``grpc_addr``, not yet open (:meth:`connect`); ``queues`` (port -> PortQueue)
        give each ``forward`` entry its port's thresholds (None: all 0)."""
        self.name, self.device_id, self.grpc_addr = name, device_id, grpc_addr
        self.p4info, self.bmv2_json = p4info, bmv2_json
        self.queues = queues
        self.client: P4RuntimeClient | None = None
        self.blackholed = False  # what this session set; a pushed pipeline starts healthy
        self.port_faulted = False  # some port has a port_fault entry
        self._sid: EntryKey | None = None  # my_sid's entry, once the plan is applied

    @property
    def mode(self) -> str:
        """The fault mode (:data:`MODE_ACTIONS`) this session set."""
        return "blackhole" if self.blackholed else "check" if self.port_faulted else "healthy"

    # ---- session -----------------------------------------------------------------------------
    def connect(self, tries: int = CONNECT_TRIES) -> None:
        """Open a session (closing any open one) as primary with :data:`ELECTION_ID`, trying the
        handshake up to ``tries`` times :data:`CONNECT_RETRY_S` apart. Raises P4RuntimeError when
        every try failed."""
        self.close()
        for n in range(tries):
            try:
                self.client = P4RuntimeClient(self.device_id, self.grpc_addr, ELECTION_ID)
                return
            except SystemExit:  # p4runtime-shell exits when the handshake fails
                if n + 1 < tries:
                    time.sleep(CONNECT_RETRY_S)
        raise P4RuntimeError(f"{self.name}: no P4Runtime session at {self.grpc_addr} ({tries} tries)")

    def close(self) -> None:
        """Tear the session down; a switch already gone is no error."""
        if self.client is not None:
            try:
                self.client.tear_down()
            except Exception:  # the switch may be gone already
                pass
            self.client = None

    def _c(self) -> P4RuntimeClient:
        if self.client is None:
            self.connect()
        assert self.client is not None
        return self.client

    def push_pipeline(self) -> None:
        """Push the BMv2 JSON and the P4Info (SetForwardingPipelineConfig, VERIFY_AND_COMMIT, as
        p4runtime-shell's ``set_fwd_pipe_config`` does) with :data:`PIPELINE_COOKIE`: empty tables,
        no blackhole. Raises P4RuntimeError when the switch refuses it."""
        c = self._c()
        req = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=c.device_id, action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        req.election_id.high, req.election_id.low = ELECTION_ID
        req.config.p4info.CopyFrom(self.p4info.msg)
        req.config.p4_device_config = Path(self.bmv2_json).read_bytes()
        req.config.cookie.cookie = PIPELINE_COOKIE
        try:
            c.stub.SetForwardingPipelineConfig(req)
        except grpc.RpcError as e:
            raise P4RuntimeError(f"{self.name}: pipeline push refused: {e.code().name}: {e.details()}") from None
        self.blackholed = self.port_faulted = False

    def has_pipeline(self) -> bool:
        """True when the switch answers with the cookie :meth:`push_pipeline` gave its pipeline
        (False after a restart, which loses it, or when it does not answer). It asks for the cookie
        only (COOKIE_ONLY): the watchdog asks every switch every second, and the whole P4Info took
        0.7 ms of the runner's CPU to parse each time (protobuf 3.20, pure Python)."""
        try:  # a session that could not be opened again (the switch still starting) is no pipeline either
            client = self._c()
            req = p4runtime_pb2.GetForwardingPipelineConfigRequest(
                device_id=client.device_id,
                response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.COOKIE_ONLY)
            rep = client.stub.GetForwardingPipelineConfig(req)
        except Exception:
            return False
        return rep.config.HasField("cookie") and rep.config.cookie.cookie == PIPELINE_COOKIE

    # ---- entries -----------------------------------------------------------------------------
    def _table_entry(self, e: DesiredEntry | EntryKey, with_action: bool = True) -> p4runtime_pb2.TableEntry:
        key = e.key if isinstance(e, DesiredEntry) else e
        t = self.p4info.table(key.table)
        te = p4runtime_pb2.TableEntry(table_id=t.preamble.id)
        for mf_info, (value, plen) in zip(t.match_fields, key.match):
            fm = te.match.add()
            fm.field_id = mf_info.id
            if plen is None:
                fm.exact.value = _enc(value, mf_info.bitwidth)
            else:
                fm.lpm.value = _enc(value, mf_info.bitwidth)
                fm.lpm.prefix_len = plen
        if with_action and isinstance(e, DesiredEntry):
            self._set_action(te.action.action, e.action, dict(e.params))
        return te

    def _set_action(self, act: p4runtime_pb2.Action, name: str, params: dict[str, int]) -> None:
        a = self.p4info.action(name)
        act.action_id = a.preamble.id
        for p in a.params:
            if p.name in params:
                act.params.add(param_id=p.id, value=_enc(params[p.name], p.bitwidth))

    def read_entries(self, tables: Iterable[str]) -> dict[EntryKey, DesiredEntry]:
        """Every entry of ``tables`` as the switch holds it."""
        out: dict[EntryKey, DesiredEntry] = {}
        id2table = {t.preamble.id: n for n, t in self.p4info.tables.items()}
        id2action = {a.preamble.id: n for n, a in self.p4info.actions.items()}
        for table in tables:
            ent = p4runtime_pb2.Entity()
            ent.table_entry.table_id = self.p4info.table(table).preamble.id
            try:
                for rep in self._c().read_one(ent):
                    for entity in rep.entities:
                        te = entity.table_entry
                        order = [mf.id for mf in self.p4info.tables[id2table[te.table_id]].match_fields]
                        by_id = {fm.field_id: fm for fm in te.match}
                        fields: list[tuple[int, int | None]] = []
                        for fid in order:
                            fm = by_id.get(fid)
                            if fm is None:
                                fields.append((0, 0))  # a wildcarded LPM field
                            elif fm.HasField("lpm"):
                                fields.append((int.from_bytes(fm.lpm.value, "big"), fm.lpm.prefix_len))
                            else:
                                fields.append((int.from_bytes(fm.exact.value, "big"), None))
                        match = tuple(fields)
                        aname = id2action.get(te.action.action.action_id, "?")
                        pnames = {v: k for k, v in self.p4info.param_ids(aname).items()} if aname != "?" else {}
                        params = tuple(
                            (pnames.get(p.param_id, str(p.param_id)), int.from_bytes(p.value, "big"))
                            for p in te.action.action.params
                        )
                        key = EntryKey(id2table[te.table_id], match)
                        out[key] = DesiredEntry(key, aname, params)
            except P4RuntimeException as e:
                raise P4RuntimeError(f"{self.name}: read of {table} refused: {e}") from None
        return out

    def _write(self, updates: list[p4runtime_pb2.Update]) -> None:
        for i in range(0, len(updates), BATCH):
            req = p4runtime_pb2.WriteRequest()
            req.updates.extend(updates[i : i + BATCH])
            try:
                self._c().write(req)
            except (P4RuntimeWriteException, P4RuntimeException) as e:
                raise P4RuntimeError(f"{self.name}: write refused: {e}") from None

    def insert(self, entries: list[DesiredEntry]) -> None:
        """Insert entries as they are (benchmarks, the trivial program); batches of :data:`BATCH`."""
        U = p4runtime_pb2.Update
        self._write([U(type=U.INSERT, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(d))) for d in entries])

    def delete(self, keys: list[EntryKey]) -> None:
        """Delete the entries with ``keys``, in batches of :data:`BATCH`. Raises P4RuntimeError."""
        U = p4runtime_pb2.Update
        self._write([U(type=U.DELETE, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(k, False)))
                     for k in keys])

    def apply(self, entries: SwitchEntries) -> int:
        """Make the switch's tables equal the plan, in the fault mode this session set (a diff, not a
        wipe). Returns updates written."""
        want = {d.key: d for d in desired_entries(entries, self.queues, self.mode)}
        self._sid = next(k for k in want if k.table == "my_sid")
        have = self.read_entries(["my_sid", "routing"])
        U = p4runtime_pb2.Update
        updates = []
        for k, d in want.items():
            if k not in have:
                updates.append(U(type=U.INSERT, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(d))))
            elif have[k] != d:
                updates.append(U(type=U.MODIFY, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(d))))
        for k in have.keys() - want.keys():
            updates.append(U(type=U.DELETE, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(k, False))))
        self._write(updates)
        return len(updates)

    def verify(self, entries: SwitchEntries) -> None:
        """Raise :class:`P4RuntimeError` naming the differences unless read-back equals the plan (in
        the fault mode this session set)."""
        want = {d.key: d for d in desired_entries(entries, self.queues, self.mode)}
        have = self.read_entries(["my_sid", "routing"])
        if want != have:
            missing = [str(k) for k in want.keys() - have.keys()]
            extra = [str(k) for k in have.keys() - want.keys()]
            changed = [str(k) for k in want.keys() & have.keys() if want[k] != have[k]]
            raise P4RuntimeError(f"{self.name}: tables differ from the route plan: missing {missing}, "
                                 f"unexpected {extra}, different {changed}")

    # ---- faults ------------------------------------------------------------------------------
    def set_blackhole(self, on: bool) -> None:
        """Drop every packet before any lookup (on), or forward again (off)."""
        self.blackholed = on
        self._write_mode(bool(self.read_entries(["port_fault"])))

    def set_port_loss(self, port: int, probability: float, salt: int = 0) -> None:
        """Drop packets leaving ``port`` with ``probability`` (0 removes the fault, 1 drops all), in
        steps of 1/65536. Raises ValueError for a probability outside 0..1."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"drop probability {probability}; allowed: 0.0 to 1.0")
        key = EntryKey("port_fault", ((port, None),))
        have = self.read_entries(["port_fault"])
        U = p4runtime_pb2.Update
        if probability == 0.0:
            if key in have:
                self._write([U(type=U.DELETE, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(key, False)))])
            self._write_mode(bool(have.keys() - {key}))
            return
        # the threshold is compared with a 16-bit draw (0..65535): 65536 drops every packet
        d = DesiredEntry(key, "gray_loss", (("threshold", round(probability * 65536)), ("salt", salt & 0xFFFFFFFF)))
        kind = U.MODIFY if key in have else U.INSERT
        self._write([U(type=kind, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(d)))])
        self._write_mode(True)

    def _write_mode(self, port_faults: bool) -> None:
        """Write the fault mode (blackhole, else ``check`` while any port has a ``port_fault``
        entry, else healthy: its packets skip the port_fault lookup) into ``my_sid``: its entry's
        action and its default action (:data:`MODE_ACTIONS`), in one request."""
        self.port_faulted = port_faults
        entry_action, default_action = MODE_ACTIONS[self.mode]
        te = p4runtime_pb2.TableEntry(table_id=self.p4info.table("my_sid").preamble.id, is_default_action=True)
        self._set_action(te.action.action, default_action, {})
        U = p4runtime_pb2.Update
        updates = [U(type=U.MODIFY, entity=p4runtime_pb2.Entity(table_entry=te))]
        if self._sid is not None:
            d = DesiredEntry(self._sid, entry_action, ())
            updates.append(U(type=U.MODIFY, entity=p4runtime_pb2.Entity(table_entry=self._table_entry(d))))
        self._write(updates)

    def read_counter(self, name: str) -> dict[int, int]:
        """Index -> packet count of every non-zero cell of counter ``name``."""
        ent = p4runtime_pb2.Entity()
        ent.counter_entry.counter_id = self.p4info.counters[name].preamble.id
        out = {}
        try:
            for rep in self._c().read_one(ent):
                for e in rep.entities:
                    if e.counter_entry.data.packet_count:
                        out[e.counter_entry.index.index] = e.counter_entry.data.packet_count
        except P4RuntimeException as e:
            raise P4RuntimeError(f"{self.name}: counter read refused: {e}") from None
        return out

    def read_counter_cells(self, names: list[str], indices: list[int]) -> dict[str, dict[int, int]]:
        """Counter -> index -> packet count of the non-zero cells ``indices`` of each counter of
        ``names``, in one Read. A whole counter is :data:`MAX_PORTS` cells and protobuf 3.20 (the
        version p4runtime-shell pins) parses them in pure Python: sampling the three port counters
        of 64 switches every second read 12,288 cells where their ports are 384."""
        req = p4runtime_pb2.ReadRequest(device_id=self._c().device_id)
        by_id = {self.p4info.counters[n].preamble.id: n for n in names}
        for cid in by_id:
            for i in indices:
                ent = req.entities.add()
                ent.counter_entry.counter_id = cid
                ent.counter_entry.index.index = i
        out: dict[str, dict[int, int]] = {n: {} for n in names}
        try:
            for rep in self._c().stub.Read(req):
                for e in rep.entities:
                    if e.counter_entry.data.packet_count:
                        out[by_id[e.counter_entry.counter_id]][e.counter_entry.index.index] = \
                            e.counter_entry.data.packet_count
        except grpc.RpcError as e:
            raise P4RuntimeError(f"{self.name}: counter read refused: {e.code().name}: {e.details()}") from None
        return out

    def forwarded_packets(self) -> int:
        """Packets the switch has sent out of any port (counter ``port_tx``, summed)."""
        return sum(self.read_counter("port_tx").values())

    def port_counters(self, ports: list[int]) -> dict[str, dict[int, int]]:
        """Per egress port of ``ports``: packets ECN-marked (``marked``), trimmed, dropped at a
        full queue and dropped by gray loss (``gray``), in one Read."""
        got = self.read_counter_cells(["ecn_marked", "trimmed", "queue_full", "gray"], ports)
        return {"marked": got["ecn_marked"], "trimmed": got["trimmed"], "queue_full": got["queue_full"],
                "gray": got["gray"]}

    def drops(self) -> dict[tuple[int, str], int]:
        """(ingress port, reason) -> packets dropped."""
        return {(i >> 3, DROP_REASONS[i & 7] if (i & 7) < len(DROP_REASONS) else str(i & 7)): n
                for i, n in self.read_counter("drops").items()}
