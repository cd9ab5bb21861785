"""The parse step: source rows -> envelope rows, a function of Arrow batches run in the source's
read tasks (its ``transform`` option) on the executors.

Every message becomes exactly one envelope row: an upsert, a delete (tombstone), an order, or a
dead letter with its one-line error. Nothing is dropped here, so nothing is lost, and no message
can fail the batch. ``rules.route_messages`` is the specification, message by message in Python.

Most payloads are plain JSON objects, and those are read column-wise (pipeline/json_columns.py:
one pyarrow JSON read per Arrow batch into the topic's typed columns, where Python's json would
read them alike), with vectorised checks of what the wire contract asks (required fields present
and not null, finite numbers, times in range). A payload goes message by message through
``route_messages`` instead whenever the two could differ:

- a payload json_columns does not read (not plain, or refused by Arrow);
- any row whose typed values fail a check: its error text comes from ``route_messages``;
- in event time, any message of a kind timed by its message's time whose time the source
  could not hold (its ``time_error``, with no ``event_time``): ``route_messages`` makes it a
  dead letter naming the time (``rules.timed_by_message``).

So a dead letter's error is always ``route_messages``'s, and a clean row's values are those it
would give (tests/test_parse.py holds the two to each other over fuzzed batches).
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import wire
from pipeline.json_columns import in_read_order, parse_options, plain_payloads, read_groups
from pipeline.source.rows import CLOCK_KIND
from pipeline.enrich import rules

ENVELOPE_ARROW_SCHEMA = rules.ENVELOPE_ARROW_SCHEMA
# envelope column <- source column, carried over as they are
FROM_SOURCE = {"kind": "kind", "source_topic": "topic", "source_partition": "partition",
               "source_message_id": "message_id", "position": "position", "key": "key",
               "watermark_bound": "watermark_bound"}
DECIDED = rules.DECIDED_COLUMNS
DECIDED_SCHEMA = pa.schema([ENVELOPE_ARROW_SCHEMA.field(name) for name in ENVELOPE_ARROW_SCHEMA.names
                            if name in DECIDED])

# A clock row of the source (event time only: pipeline/source/clock.py) becomes a ``tick``: it
# moves the watermark (lookups.with_event_watermarks) and is dropped right after.
TICK = "tick"

_ARROW_KIND = {int: pa.int64(), float: pa.float64(), str: pa.string()}
_WIRE_SCHEMAS = {kind: pa.schema([(f.name, _ARROW_KIND[f.kind]) for f in fields]) for kind, fields in wire.FIELDS.items()}
_PARSE_OPTIONS = {kind: parse_options(schema) for kind, schema in _WIRE_SCHEMAS.items()}


def parse_batches(batches: Iterator[pa.RecordBatch],
                  timed_by_message: list[str] | tuple[str, ...] = ()) -> Iterator[pa.RecordBatch]:
    """Turn source record batches into envelope record batches (``rules.ENVELOPE_SPARK_SCHEMA``).

    Event time only: ``timed_by_message``, the kinds whose rows are timed by their message's time (``rules.timed_by_message``): a
    message of one whose time the source could not hold is a dead letter. In processing time
    no message's time decides anything, and such a message goes on (its times None).
    # {"kind": "orders", "op": "order", "user_id": 17, "item_id": 4, "price": 9.5, …, "user_state": None, …}
    """
    for batch in batches:
        if batch.num_rows and batch.column("kind")[0].as_py() == CLOCK_KIND:  # the batch's clock row
            decided = pa.RecordBatch.from_arrays(
                [pa.repeat(pa.scalar(TICK, pa.string()), batch.num_rows) if field.name == "op"
                 else pa.nulls(batch.num_rows, field.type) for field in DECIDED_SCHEMA], schema=DECIDED_SCHEMA)
        else:
            decided = decide_batch(batch, tuple(timed_by_message))
        arrays = []
        for field in ENVELOPE_ARROW_SCHEMA:
            if field.name in DECIDED:
                arrays.append(decided.column(field.name))
            elif field.name in FROM_SOURCE:
                arrays.append(batch.column(FROM_SOURCE[field.name]).cast(field.type))
            elif field.name == "published_at":  # microseconds -> epoch ms
                arrays.append(pc.divide(pc.cast(batch.column("publish_time"), pa.int64()), 1000))
            elif field.name == "event_time" and "event_time" in batch.schema.names:  # epoch ms, or None
                arrays.append(batch.column("event_time").cast(field.type))
            elif field.name == "redrive_of":
                arrays.append(_redrives(batch.column("properties")))
            else:  # filled in by the lookups
                arrays.append(pa.nulls(batch.num_rows, field.type))
        yield pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_ARROW_SCHEMA)


def decide_batch(batch: pa.RecordBatch, timed_by_message: tuple[str, ...] = ()) -> pa.RecordBatch:
    """The decided envelope columns (``DECIDED_SCHEMA``) of a batch of source rows, row for row
    what ``rules.route_messages`` gives (with the same ``timed_by_message``)."""
    kinds = pc.unique(batch.column("kind")).to_pylist()
    problems = _time_problems(batch)
    if len(kinds) != 1 or kinds[0] not in _WIRE_SCHEMAS:  # read tasks hold one topic; anything else goes slowly
        return _slow(batch.column("kind").to_pylist(), batch.column("key").to_pylist(),
                     batch.column("value").to_pylist(), problems.to_pylist(), timed_by_message)
    kind, values = kinds[0], batch.column("value")
    plain = plain_payloads(values)
    if kind in timed_by_message and problems.null_count < len(problems):  # rare: route_messages names the time
        plain = pc.and_(plain, pc.is_null(problems))
    fast_rows = pc.indices_nonzero(plain)
    pieces, slow_rows = [], pc.indices_nonzero(pc.invert(plain)).to_pylist()
    for offset, count, table in read_groups(values.take(fast_rows), _PARSE_OPTIONS[kind]):
        rows = fast_rows[offset:offset + count]
        if table is None:  # refused: message by message
            slow_rows.extend(rows.to_pylist())
            continue
        good = _passes_checks(kind, table)
        pieces.append((rows.filter(good), table.filter(good)))
        slow_rows.extend(rows.filter(pc.invert(good)).to_pylist())
    parts, order = [], []
    for rows, table in pieces:
        if table.num_rows:
            parts.append(_decided_from_table(kind, table))
            order.append(rows)
    if slow_rows:
        slow_rows.sort()
        keys = batch.column("key").take(slow_rows).to_pylist()
        parts.append(_slow([kind] * len(slow_rows), keys, values.take(slow_rows).to_pylist(),
                           problems.take(slow_rows).to_pylist(), timed_by_message))
        order.append(pa.array(slow_rows, pa.uint64()))
    return in_read_order(parts, order, DECIDED_SCHEMA) if parts else _slow([], [], [], [], ())


def _time_problems(batch: pa.RecordBatch) -> pa.Array:
    """Per source row, why its message's own time (event time, else publish time) is unknown:
    the source's ``time_error`` where it has no ``event_time`` (a bad publish time behind a good
    event time does not matter), else None."""
    if "time_error" not in batch.schema.names:
        return pa.nulls(batch.num_rows, pa.string())
    errors = batch.column("time_error")
    if errors.null_count == len(errors):
        return errors
    return pc.if_else(pc.is_null(batch.column("event_time")), errors, pa.scalar(None, pa.string()))


def _passes_checks(kind: str, table: pa.Table) -> pa.Array:
    """Rows whose typed values need no more checks: required fields present, numbers finite,
    times in years 1 to 9999 (the rest of the wire contract Arrow's typed read already holds)."""
    good = pa.array([True] * table.num_rows, pa.bool_())
    for field in wire.FIELDS[kind]:
        column = table.column(field.name)
        ok = pc.is_valid(column) if field.required else pa.array([True] * table.num_rows, pa.bool_())
        if field.kind is float:
            ok = pc.and_(ok, pc.fill_null(pc.is_finite(column), True))
        if field.time:
            in_range = pc.and_(pc.greater_equal(column, wire.MIN_TIME_MS), pc.less_equal(column, wire.MAX_TIME_MS))
            ok = pc.and_(ok, pc.fill_null(in_range, True))
        good = pc.and_(good, ok)
    return good


def _decided_from_table(kind: str, table: pa.Table) -> pa.RecordBatch:
    """Decided columns of rows that passed every check, as ``route_messages`` sets them."""
    n = table.num_rows
    by_column = {column: name for name, column in rules.RECORD_COLUMNS[kind].items()}
    fields = {f.name: f for f in wire.FIELDS[kind]}
    arrays = []
    for target in DECIDED_SCHEMA:
        if target.name == "op":
            arrays.append(pa.array(["order" if kind == "orders" else "upsert"] * n, pa.string()))
        elif target.name in by_column:
            field = fields[by_column[target.name]]
            column = table.column(field.name).combine_chunks()
            if field.default is not None:
                column = pc.fill_null(column, field.default)
            if target.name in rules.TIME_COLUMNS:  # the Java model's -1 (any negative) means "no time"
                column = pc.if_else(pc.less(column, 0), pa.scalar(None, column.type), column)
            arrays.append(column.cast(target.type))
        elif target.name in rules.ID_COLUMNS:
            arrays.append(pa.array([0] * n, target.type))
        else:
            arrays.append(pa.nulls(n, target.type))
    return pa.RecordBatch.from_arrays(arrays, schema=DECIDED_SCHEMA)


def _slow(kinds: list, keys: list, values: list, time_errors: list,
          timed_by_message: tuple[str, ...]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(rules.route_messages(kinds, keys, values, time_errors, timed_by_message),
                                      schema=DECIDED_SCHEMA)


def _redrives(properties: pa.Array) -> pa.Array:
    if properties.null_count == len(properties):
        return pa.nulls(len(properties), pa.string())
    return pa.array([rules.redrive_of(props) if props else None for props in properties.to_pylist()], pa.string())
