"""Pulsar messages → typed change rows of a plan's tables, or dead letters (the parse step).

Each source message becomes one envelope row::

    {"key": "100-1", "side": 0, "op": "upsert", "source_partition": -1, "position": 3,
     "s0_accountId": "100", …, "source_topic": "…", "source_message_id": "…", "payload": None,
     "error": None, "published_ms": 1795…}

- ``side`` is the table's index in the plan (0 is the driving table); ``op`` is ``upsert``, ``delete``
  (an empty payload: a tombstone) or ``dead``.
- ``s<side>_<column>`` hold the payload columns the query uses, typed as declared, and the METADATA
  columns it reads (pipeline/sql/metadata.py: the message's ``eventTime``, ``properties``, …); a
  message whose time the query reads but no timestamp can hold is ``dead`` (:func:`unheld_time`).
  Every declared payload column is checked: a value of the wrong type (a string where an INT is declared),
  invalid UTF-8 or JSON, a payload that is not an object, or a message without a key makes the row
  ``dead`` with a one-line ``error`` naming the table and column. A missing or null field is null,
  as Flink's JSON format reads it.

:func:`decide_row` is the pure decision and :func:`parse_rows` applies it message by message: the
specification, which pipeline/sql/columnar.py follows column-wise wherever it can (11 × faster on
plain payloads). :func:`parse_batches` runs the two on Arrow batches on the executors: in the source's read tasks (its ``transform`` option, with :func:`parser_args` as
``transformArgs``: plain data, so a read task needs no plan), or after a shared read through
``mapInArrow`` (:func:`make_parser`, a statement set's).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from pipeline import wire
from pipeline.sql.metadata import metadata_values
from pipeline.sql.plan import Plan, field_name

INT_RANGE = {"int": (-2**31, 2**31 - 1), "bigint": (-2**63, 2**63 - 1)}
TIME_FIELDS = {"eventTime": "event_time", "publishTime": "publish_time"}  # METADATA key -> the source's column
EPOCH, MILLISECOND = datetime(1970, 1, 1, tzinfo=timezone.utc), timedelta(milliseconds=1)
BASE_FIELDS = [("key", "string"), ("side", "int"), ("op", "string"), ("source_partition", "int"),
               ("position", "bigint"), ("source_topic", "string"), ("source_message_id", "string"),
               ("payload", "string"), ("error", "string"), ("published_ms", "bigint")]


def used_columns(plan: Plan) -> list[tuple[int, str]]:
    """(side, column) pairs the query reads, driving table first, each once."""
    used = []
    for output in plan.outputs:
        if output.side is not None:
            used.append((output.side, output.column))
        elif output.argument is not None:
            used.append((0, output.argument))
    used += [(0, column) for column in plan.group_by]
    # A joined table's key too, so that a side none of whose columns is selected still has state.
    used += [(side, table.primary_key) for side, table in enumerate(plan.sides) if side]
    used += list(plan.reads)  # the columns WHERE and the expressions read
    seen, result = set(), []
    for side, column in used:
        if (side, column.lower()) not in seen:
            seen.add((side, column.lower()))
            result.append((side, plan.sides[side].column(column).name))
    return result


def envelope_fields(plan: Plan) -> list[tuple[str, str]]:
    """The envelope's (name, Spark type) fields."""
    values = [(field_name(side, column), plan.sides[side].column(column).spark_type) for side, column in used_columns(plan)]
    return BASE_FIELDS + values


def envelope_ddl(plan: Plan) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in envelope_fields(plan))


def table_specs(plan: Plan) -> dict[str, dict]:
    """What the parser needs per table (plain data, shipped to the executors)."""
    used = used_columns(plan)
    return {table.name: {
        "side": side,
        "columns": [(c.name, c.sql_type, c.spark_type) for c in table.payload_columns],
        "fields": {column: field_name(side, column) for s, column in used if s == side},
        "metadata": {field_name(side, column): table.column(column).metadata_key for s, column in used
                     if s == side and table.column(column).metadata},
    } for side, table in enumerate(plan.sides)}


def parse_timestamp(text: str) -> datetime:
    """A TIMESTAMP(3) JSON value (Flink's SQL format ``2024-05-01 12:00:00.000`` or ISO-8601), in UTC."""
    value = datetime.fromisoformat(text)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _timestamp_text(value) -> bool:
    try:
        return isinstance(value, str) and parse_timestamp(value) is not None
    except ValueError:
        return False


def check_value(table: str, column: str, sql_type: str, spark_type: str, value):
    """The value as its declared type, or a ValueError naming the table and column."""
    if value is None:
        return None
    ok = {
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "double": isinstance(value, (int, float)) and not isinstance(value, bool),
        # a TIMESTAMP(3) column no query here reads (only a temporal join does, as text: temporal_stream.py)
        "timestamp": _timestamp_text(value),
    }.get(spark_type)
    if spark_type in INT_RANGE:
        low, high = INT_RANGE[spark_type]
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if ok and spark_type == "string" and not wire.encodable_text(value):
        raise ValueError(f"table {table!r} column {column!r}: text holds a lone surrogate, which no sink can hold")
    if ok and spark_type == "double" and not wire.plain_number(value):
        ok = False  # past 64 bits, or a float past its range (1e400 reads as inf)
    if not ok:
        shown = json.dumps(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ValueError(f"table {table!r} column {column!r}: expected {sql_type}, got {_json_kind(value)} {shown}")
    return float(value) if spark_type == "double" else value


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def decide_row(spec: dict, table: str, key: str | None, value: bytes | None) -> tuple[str, dict, str | None]:
    """(op, {envelope field: value}, error) of one message of ``table``."""
    if key is None:
        return "dead", {}, f"table {table!r}: message has no key; an upsert table is keyed by the message key"
    if not value:
        return "delete", {}, None
    try:
        record = wire.load_json(value)
    except wire.BadMessage as exc:
        return "dead", {}, f"table {table!r}: {exc}"
    if not isinstance(record, dict):
        return "dead", {}, f"table {table!r}: payload is a JSON {_json_kind(record)}, not an object"
    fields = {}
    try:
        for name, sql_type, spark_type in spec["columns"]:
            checked = check_value(table, name, sql_type, spark_type, record.get(name))
            if name in spec["fields"]:
                fields[spec["fields"][name]] = checked
    except ValueError as exc:
        return "dead", {}, str(exc)
    return "upsert", fields, None


def unheld_time(metadata: dict[str, str], time_error: str | None) -> str | None:
    """The source's ``time_error`` about a message time the query reads (``metadata``: envelope
    field -> METADATA key), or None. The source reads a time past the year 9999 (an event time of
    2**63-1, a Java producer's -1) as NULL, which the query would take for "none set"; the message
    is a dead letter instead. A time the query does not read changes nothing.

    # ({"s0_at": "eventTime"}, "message event_time 9223372036854775807 is outside …") -> that text
    """
    if not time_error:
        return None
    read = {TIME_FIELDS[key] for key in metadata.values() if key in TIME_FIELDS}
    found = [part for part in time_error.split("; ") if part.split(" ")[1:2] and part.split(" ")[1] in read]
    return "; ".join(found) or None


PARSE_TRANSFORM = "pipeline.sql.envelope:parse_batches"  # the source's ``transform`` option


def parser_args(plan: Plan) -> dict:
    """What :func:`parse_batches` needs of a plan, as JSON-ready data (the ``transformArgs``)."""
    return {"specs": table_specs(plan), "fields": envelope_fields(plan)}


def make_parser(plan: Plan):
    """The ``mapInArrow`` function: source batches → envelope batches (runs on the executors)."""
    args = parser_args(plan)
    return lambda batches: parse_batches(batches, **args)


def arrow_schema(fields):
    """The Arrow schema of (name, Spark type) fields."""
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
             "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"),
             "map<string,string>": pa.map_(pa.string(), pa.string())}
    return pa.schema([(name, types[kind]) for name, kind in fields])


def parse_batches(batches, specs: dict, fields: list):
    """Source batches → envelope batches, one row per message, in order (runs on the executors),
    column-wise where it can be (pipeline/sql/columnar.py), else by :func:`parse_rows`.

    ``specs`` and ``fields``: :func:`table_specs` and :func:`envelope_fields` of the plan
    (:func:`parser_args`), as they come back from JSON.
    """
    from pipeline.sql.columnar import decode_batch

    schema = arrow_schema(fields)
    for batch in batches:
        yield decode_batch(batch, specs, schema)


def parse_rows(batch, specs: dict, schema):
    """The specification of the parse step: a source batch's envelope rows (``schema``), message
    by message (:func:`decide_row`)."""
    import pyarrow as pa

    columns = {name: [] for name in schema.names}
    for row in batch.to_pylist():
        spec = specs[row["kind"]]
        op, values, error = decide_row(spec, row["kind"], row["key"], row["value"])
        unheld = op == "upsert" and unheld_time(spec["metadata"], row.get("time_error"))
        if unheld:
            op, values, error = "dead", {}, f"table {row['kind']!r}: {unheld}"
        elif op == "upsert" and spec["metadata"]:
            values.update(metadata_values(spec["metadata"], row))
        published = row.get("publish_time")
        base = {"key": row["key"], "side": spec["side"], "op": op, "source_partition": row["partition"],
                "position": row["position"], "source_topic": row["topic"],
                "source_message_id": row["message_id"],
                "payload": wire.payload_text(row["value"]) if op == "dead" else None, "error": error,
                "published_ms": epoch_ms(published) if published is not None else None}
        for name in schema.names:
            columns[name].append(base[name] if name in base else values.get(name))
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def epoch_ms(moment: datetime) -> int:
    """A publish time in whole milliseconds since the epoch, floored (exact: no float on the way)."""
    return (moment - EPOCH) // MILLISECOND
