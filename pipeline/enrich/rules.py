"""Enrichment decisions as pure functions over plain values (no Spark, clock passed in): the spec.

- :func:`route_messages`: what each message is (upsert, tombstone, order or dead letter), as
  envelope columns; the parse step runs it on every message.
- :class:`LookupModel`: what one lookup decides per key (found, wait, missing), as the Java
  ``ChangelogLookup`` (pipeline/jvm/) must; :class:`EnrichmentModel` chains the lookups
  as the job does. A model-based test runs random streams through both and compares the sinks.
- :func:`sink_of` / :func:`with_sinks`: which sink a decided row goes to, and why it is missing.
- Event time has its own module, pipeline/enrich/event_rules.py (versions, watermarks, lateness).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Iterable, Literal

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import wire
from pipeline.enrich.lookups import DELETE, FUTURE, LATE, LOOKUP, LOOKUPS, PASS, READ_ORDER, SET, Lookup

FOUND, WAIT, MISSING = "found", "wait", "missing"
Outcome = Literal["found", "wait", "missing"]

# The envelope: the one row shape from the parse step through both lookups to the sinks, built
# from the lookups' descriptions. Changelog rows carry their record in the same state columns an
# enriched order gets; each lookup fills its state columns and its found column on orders.
# {"kind": "orders", "op": "order", "lookup_role": "lookup", "source_topic": "persistent://…",
#  "source_partition": -1, "source_message_id": "0:5:-1:2", "position": 42, "key": "1001",
#  "published_at": 1700000000000, "redrive_of": None, "error": None, "payload": None,
#  "invoice_id": 1001, "line_item_id": 1, "user_id": 17, "item_id": 4, "price": 9.5, "created_at": …,
#  "paid_at": None, "order_item_name": "…", "order_item_category": "…", "user_first_name": None, …,
#  "user_state": None, "item_name": None, …, "item_state": None, "first_seen_ms": None, "waited_ms": None}
_ORDER_FIELDS = {"invoiceId": "invoice_id", "lineItemId": "line_item_id",
                 **{lookup.order_field: lookup.id_column for lookup in LOOKUPS},
                 "price": "price", "createdAt": "created_at", "paidAt": "paid_at", "itemName": "order_item_name",
                 "itemCategory": "order_item_category"}
ENVELOPE_SPARK_SCHEMA = ", ".join([
    "kind string, op string, lookup_role string, source_topic string, source_partition int, "
    "source_message_id string, position long, key string, published_at long, redrive_of string, error string, "
    "payload string, invoice_id long, line_item_id long",
    *(f"{lookup.id_column} long" for lookup in LOOKUPS),
    "price double, created_at long, paid_at long, order_item_name string, order_item_category string",
    *(f"{column} {kind}, {lookup.found_column} string" if i == len(lookup.fields) - 1 else f"{column} {kind}"
      for lookup in LOOKUPS for i, (column, kind) in enumerate(lookup.fields.values())),
    "first_seen_ms long, waited_ms long",
    # Event time (enrichment.time = event; null in processing time): the message's event time,
    # the row's own time (an order's time, a version's time), how the order's time stood when
    # first judged (1 late, 2 future, 0 neither: event_rules.LATE_FLAG, FUTURE_FLAG), the most
    # its time may count for the watermark (the source's watermark_bound: pipeline/source/clock.py),
    # and per lookup the time of the version it was enriched as of.
    "event_time long, event_ms long, late long, watermark_bound long",
    *(f"{lookup.as_of_column} long" for lookup in LOOKUPS)])
_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
ENVELOPE_ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in
                                   (part.strip().split(" ") for part in ENVELOPE_SPARK_SCHEMA.split(","))])
# The event-time columns: always null in processing time, so that job leaves them out of its lookups.
EVENT_TIME_COLUMNS = ("event_time", "event_ms", "late", "watermark_bound", *(lookup.as_of_column for lookup in LOOKUPS))
ENVELOPE_FIELDS = tuple(part.strip().split(" ")[0] for part in ENVELOPE_SPARK_SCHEMA.split(","))
# Wire field -> envelope column, per topic. Ids are never null in the envelope (0 where unused),
# so every row has a key in every lookup.
RECORD_COLUMNS = {"orders": _ORDER_FIELDS, **{
    lookup.changelog: {"id": lookup.id_column, **{field: column for field, (column, _) in lookup.fields.items()}}
    for lookup in LOOKUPS}}
ID_COLUMNS = ("invoice_id", "line_item_id", *(lookup.id_column for lookup in LOOKUPS))
# Times: the Java model's -1 means none.
TIME_COLUMNS = tuple(column for fields in RECORD_COLUMNS.values() for field, column in fields.items()
                     if field.endswith("At"))
REDRIVE_PROPERTY = "redrive-of"
UNDECIDED_REASONS = (LATE, FUTURE)  # event time: orders whose time no lookup decided (lookups.py)


# The envelope columns the parse step decides from a message's payload (the rest it copies).
DECIDED_COLUMNS = ("op", "error", "payload",
                   *dict.fromkeys(column for columns in RECORD_COLUMNS.values() for column in columns.values()))


def timed_by_message(order_time: str) -> tuple[str, ...]:
    """Event time: the topic kinds whose rows are timed by their message's time (its event time,
    else its publish time): every changelog, and the orders with ``enrichment.order_time =
    event_time`` (else an order's time is its ``createdAt``, a required field)."""
    return (*(lookup.changelog for lookup in LOOKUPS), *(("orders",) if order_time == "event_time" else ()))


def route_messages(kinds: list[str], keys: list, payloads: list, time_errors: list | None = None,
                   timed_by_message: Iterable[str] = ()) -> dict[str, list]:
    """Validate source messages: the envelope columns they decide, one list per column.

    Each message gets op upsert/delete/order/dead; columns a message does not set are null
    (ids 0). Column-wise because the parse step runs this for every message of the job.

    ``time_errors`` (event time): per message, why its own time (its event time, else its
    publish time) is unknown, or None: the source's ``time_error`` where its ``event_time`` is
    None. A valid message of a kind in ``timed_by_message`` (:func:`timed_by_message`) with one
    is a dead letter with that error, since no watermark can decide it; elsewhere the message's
    time is not used, and it goes on. A bad payload's own error comes first.
    # {"op": ["order", "dead"], "invoice_id": [1, 0], "error": [None, "payload is …"], …}
    """
    n = len(payloads)
    columns = {name: ([0] * n if name in ID_COLUMNS else [None] * n) for name in DECIDED_COLUMNS}
    ops, errors, raw = columns["op"], columns["error"], columns["payload"]
    ids = {lookup.changelog: columns[lookup.id_column] for lookup in LOOKUPS}
    targets = {kind: [(name, columns[column], column in TIME_COLUMNS) for name, column in fields.items()]
               for kind, fields in RECORD_COLUMNS.items()}
    parse = wire.parse_payload
    timed = frozenset(timed_by_message)
    for i, (kind, payload) in enumerate(zip(kinds, payloads)):
        try:
            record = parse(kind, payload)
            deleted = wire.tombstone_key(keys[i]) if record is None else None
        except Exception as exc:  # noqa: BLE001 - no message, whatever its bytes, may fail the batch
            ops[i], errors[i], raw[i] = "dead", dead_letter_error(exc), wire.payload_text(payload)
            continue
        if time_errors is not None and time_errors[i] and kind in timed:
            ops[i], errors[i], raw[i] = "dead", time_errors[i], wire.payload_text(payload)
            continue
        if record is None:
            ops[i] = "delete"
            ids[kind][i] = deleted
        else:
            ops[i] = "order" if kind == "orders" else "upsert"
            for name, column, is_time in targets[kind]:
                value = record[name]
                # the Java model's -1 means "no time"
                column[i] = None if is_time and value is not None and value < 0 else value
    return columns


def dead_letter_error(exc: Exception) -> str:
    """The one-line error of a dead letter: a wire check's own text, or the failure named."""
    if isinstance(exc, wire.BadMessage):
        return str(exc)
    # A failure's text may quote the message (a lone surrogate would fail the sink's Arrow batch).
    text = " ".join(str(exc).split())[:300].encode("utf-8", "backslashreplace").decode("utf-8")
    return f"cannot read the message: {type(exc).__name__}: {text}"


def route_message(kind: str, key: str | None, payload: bytes | None, time_error: str | None = None,
                  timed_by_message: Iterable[str] = ()) -> dict:
    """:func:`route_messages` for one message, as one dict of envelope columns."""
    return {name: values[0] for name, values in
            route_messages([kind], [key], [payload], [time_error], timed_by_message).items()}


def redrive_of(properties_json: str | None) -> str | None:
    """The ``redrive-of`` message property, if the order is a re-drive."""
    if not properties_json:
        return None
    try:
        value = json.loads(properties_json).get(REDRIVE_PROPERTY)
    except (ValueError, AttributeError):
        return None
    if not isinstance(value, str):
        return None if value is None else str(value)
    # A lone surrogate escaped in the JSON would fail the whole Arrow batch; keep it visible instead.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def lookup_outcome(found: bool, waited_ms: int, max_wait_ms: int) -> Outcome:
    """Found; or wait while under max_wait (0 turns buffering off); else missing."""
    if found:
        return FOUND
    if max_wait_ms > 0 and waited_ms < max_wait_ms:
        return WAIT
    return MISSING


def missing_reason(*found: bool) -> str | None:
    """Why an order is missing state, from whether each lookup found it (in :data:`LOOKUPS`
    order): ``user``, ``item``, ``user_and_item``; None if nothing is missing. Both lookups are
    always checked, so support staff see the whole cause."""
    missing = [lookup.reason for lookup, hit in zip(LOOKUPS, found) if not hit]
    return "_and_".join(missing) or None


def sink_of(row: dict) -> tuple[str, str | None]:
    """The sink of a row that has been through every lookup, and its missing-state reason."""
    if row["op"] == "dead":
        return "dead_letter", None
    for undecided in UNDECIDED_REASONS:  # event time: late or future, decided by no lookup
        if any(row.get(lookup.found_column) == undecided for lookup in LOOKUPS):
            return "missing_state", undecided
    reason = missing_reason(*(row[lookup.found_column] == FOUND for lookup in LOOKUPS))
    return ("missing_state" if reason else "enriched"), reason


def with_envelope_columns(table: pa.Table) -> pa.Table:
    """``table`` with every envelope column it lacks added as nulls (the processing-time job
    leaves the event-time columns out of its lookups)."""
    for field in ENVELOPE_ARROW_SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table


def with_sinks(table: pa.Table) -> pa.Table:
    """:func:`sink_of` over an Arrow table of envelope rows: adds ``sink`` and ``reason``."""
    reason = pa.nulls(table.num_rows, pa.string())
    for lookup in LOOKUPS:
        missing = pc.fill_null(pc.not_equal(table[lookup.found_column], FOUND), True)
        joined = pc.binary_join_element_wise(reason, pa.scalar(lookup.reason), "_and_")
        reason = pc.if_else(missing, pc.coalesce(joined, pa.scalar(lookup.reason)), reason)
    for undecided in UNDECIDED_REASONS:  # event time: a late or future order is decided by no lookup
        for lookup in LOOKUPS:
            reason = pc.if_else(pc.fill_null(pc.equal(table[lookup.found_column], undecided), False), undecided, reason)
    dead = pc.equal(table["op"], "dead")
    reason = pc.if_else(dead, pa.scalar(None, pa.string()), reason)
    sink = pc.if_else(dead, "dead_letter", pc.if_else(pc.is_null(reason), "enriched", "missing_state"))
    return table.append_column("sink", sink).append_column("reason", reason)


def role_of(row: dict, lookup: Lookup) -> str:
    """The role a row plays in a lookup (lookups.apply_lookup computes the same in Spark)."""
    if row["op"] in ("upsert", "delete") and row["kind"] == lookup.changelog:
        return SET if row["op"] == "upsert" else DELETE
    return LOOKUP if row["op"] == "order" else PASS


def split_by_key(rows: Iterable[dict], lookup: Lookup) -> tuple[list[dict], dict[int, list[dict]]]:
    """A lookup's input split as the operator splits it: rows it passes on untouched, and the
    rest by key, each tagged with its role (set, delete or lookup)."""
    passed: list[dict] = []
    by_key: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        role = role_of(row, lookup)
        if role == PASS:
            passed.append(row)
        else:
            by_key[row[lookup.id_column]].append({**row, "lookup_role": role})
    return passed, by_key


class LookupModel:
    """One lookup's state and decisions over plain dicts: the specification of ChangelogLookup.

    ``process`` is one micro-batch in Spark's call order: each key's input rows (its changes
    in read order, then its orders), then the timers that are due. State per key: the latest
    record (a tuple of the state columns) and the orders waiting for it.
    """

    def __init__(self, lookup: Lookup, max_wait_ms: int):
        self.lookup, self.max_wait_ms = lookup, max_wait_ms
        self.latest: dict[int, tuple] = {}
        self.waiting: dict[int, list[dict]] = {}

    def process(self, rows: Iterable[dict], now_ms: int) -> list[dict]:
        """The rows this lookup emits for one batch's input ``rows`` at batch time ``now_ms``."""
        out, by_key = split_by_key(rows, self.lookup)
        for key, key_rows in by_key.items():
            changes = sorted((r for r in key_rows if r["lookup_role"] in (SET, DELETE)),
                             key=lambda r: tuple(r[column] for column in READ_ORDER))
            record = self.latest.get(key)
            if changes:
                last = changes[-1]
                record = tuple(last[c] for c in self.lookup.state_columns) if last["lookup_role"] == SET else None
                if record is None:
                    self.latest.pop(key, None)
                else:
                    self.latest[key] = record
                    out.extend(self._decide(row, record, now_ms) for row in self.waiting.pop(key, []))
            for row in (r for r in key_rows if r["lookup_role"] == LOOKUP):
                first_seen = now_ms if row["first_seen_ms"] is None else row["first_seen_ms"]
                outcome = lookup_outcome(record is not None, now_ms - first_seen, self.max_wait_ms)
                if outcome == WAIT:
                    self.waiting.setdefault(key, []).append({**row, "first_seen_ms": first_seen})
                else:
                    out.append(self._decide(row, record, now_ms))
        return out + self.expire(now_ms)

    def expire(self, now_ms: int) -> list[dict]:
        """The waiting orders whose wait is over, decided missing (the operator's timers)."""
        out: list[dict] = []
        for key in list(self.waiting):
            rows = self.waiting[key]
            due = [row for row in rows if row["first_seen_ms"] + self.max_wait_ms <= now_ms]
            out.extend(self._decide(row, None, now_ms) for row in due)
            self.waiting[key] = [row for row in rows if row["first_seen_ms"] + self.max_wait_ms > now_ms]
            if not self.waiting[key]:
                del self.waiting[key]
        return out

    def _decide(self, row: dict, record: tuple | None, now_ms: int) -> dict:
        first_seen = now_ms if row["first_seen_ms"] is None else row["first_seen_ms"]
        values = record if record is not None else (None,) * len(self.lookup.state_columns)
        return {**row, **dict(zip(self.lookup.state_columns, values)),
                self.lookup.found_column: FOUND if record is not None else MISSING,
                "first_seen_ms": first_seen, "waited_ms": now_ms - first_seen}


class EnrichmentModel:
    """The job's lookups chained as the job chains them, each batch ending in sink rows."""

    def __init__(self, max_wait_ms: int):
        self.lookups = [LookupModel(lookup, max_wait_ms) for lookup in LOOKUPS]

    def process(self, rows: Iterable[dict], now_ms: int) -> list[dict]:
        """Envelope rows of one batch -> its decided rows, each with ``sink`` and ``reason``."""
        for model in self.lookups:
            rows = model.process(rows, now_ms)
        decided = []
        for row in rows:
            sink, reason = sink_of(row)
            decided.append({**row, "sink": sink, "reason": reason})
        return decided

    def waiting(self) -> int:
        """Orders still waiting in some lookup."""
        return sum(len(rows) for model in self.lookups for rows in model.waiting.values())
