"""A SQL pipeline's outputs: the upsert topic, and the Delta change table DuckDB reads.

Per micro-batch the query's output rows (one per changed key: an upsert or a delete) become:

- **messages on the target topic**, keyed by the primary key, the row as JSON in the target
  table's column order (``{"accountId":"100","userCount":2}``), an empty payload for a delete.
  Sent and flushed inside the batch, before Spark commits it, so at-least-once: a batch re-run
  after a crash sends the same messages again, which an upsert topic absorbs (same key, same row).
- **the ``result`` sink**: a Delta table of change rows ``_key, _op, <target columns>, _batch_id,
  _changed_at`` under ``<data_dir>/sql/<name>/sinks/result/``; the current result is the latest
  row per ``_key`` whose ``_op`` is ``upsert`` (app/sql_queries.py). Exactly-once for a reader of
  the Delta log, with the job's writer (pipeline/sinks.py): one commit per batch with the
  transaction id (app id, batch id), so a batch re-run after a crash commits nothing twice. A
  batch has at most one row per key, so "latest" is the highest ``_batch_id``.
- **the ``dead_letter`` sink**: the job's dead-letter columns (pipeline/sinks.py), same writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import SinkError
from pipeline.sinks import SCHEMAS, TS, DeltaSinks
from pipeline.sql.envelope import field_name
from pipeline.sql.foreign_key import resolve_retractions
from pipeline.sql.plan import Plan

SQL_SINKS = ("result", "dead_letter")
ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
               "boolean": pa.bool_()}
UPSERT_OPS = ("after", "upsert")


def result_schema(plan: Plan) -> pa.Schema:
    columns = [(c.name, ARROW_TYPES[c.spark_type]) for c in plan.target.payload_columns]
    return pa.schema([("_key", pa.string()), ("_op", pa.string())] + columns
                     + [("_batch_id", pa.int64()), ("_changed_at", TS)])


def output_field(plan: Plan, name: str) -> str | None:
    """The query output's column that fills target column ``name`` (None: not inserted, null)."""
    for index, output in enumerate(plan.outputs):
        if output.name.lower() == name.lower():
            if output.expression is not None:
                return f"out{index}"
            if output.aggregate:
                return f"agg{index}"
            return field_name(output.side, output.column)
    return None


def filter_joined(rows: pa.Table) -> pa.Table:
    """A WHERE on a joined table's column, as Flink means it: per key, the joined row now (op
    ``after``) is sent if it passes (``_pass``); if not, or if the key was deleted, a delete is
    sent only when the row as it was before the batch (op ``before``) passed, i.e. was sent.
    UpsertJoin gives at most one ``before`` and one ``after`` or ``delete`` per key and batch.

    # in:  {"key": "u1", "op": "before", "_pass": true}, {"key": "u1", "op": "after", "_pass": false}, …
    # out: {"key": "u1", "op": "delete", …}  (rows with nothing to send get op "skip")
    """
    ops, passed = rows["op"], pc.fill_null(rows["_pass"], False)
    sent_before = rows.filter(pc.and_(pc.equal(ops, "before"), passed))["key"]
    was_sent = pc.is_in(rows["key"], value_set=sent_before.combine_chunks() if sent_before.num_chunks
                        else pa.array([], pa.string()))
    is_after, is_delete = pc.equal(ops, "after"), pc.equal(ops, "delete")
    op = pc.if_else(pc.and_(is_after, passed), "after",
                    pc.if_else(pc.and_(pc.or_(is_after, is_delete), was_sent), "delete",
                               pc.if_else(pc.or_(pc.or_(is_after, is_delete), pc.equal(ops, "before")), "skip", ops)))
    return rows.set_column(rows.schema.get_field_index("op"), "op", op)


def build_result(plan: Plan, rows: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    """The batch's ``result`` rows from the query's output rows (upserts and deletes only)."""
    schema = result_schema(plan)
    if plan.foreign_key and plan.kind == "join" and rows.num_rows:
        rows = resolve_retractions(rows)
    if ((plan.where_joined and plan.kind == "join") or plan.having) and rows.num_rows:
        rows = filter_joined(rows)
    ops = rows["op"]
    changed = rows.filter(pc.is_in(ops, pa.array(list(UPSERT_OPS) + ["delete"])))
    n = changed.num_rows
    is_delete = pc.equal(changed["op"], "delete")
    columns = {"_op": pc.if_else(is_delete, "delete", "upsert")}
    for column in plan.target.payload_columns:
        source = output_field(plan, column.name)
        values = changed[source] if source else pa.nulls(n)
        columns[column.name] = pc.if_else(is_delete, pa.nulls(n, ARROW_TYPES[column.spark_type]),
                                          values.cast(ARROW_TYPES[column.spark_type]))
    # A join's rows (deletes too) carry the driving primary key, which is the target's; an
    # aggregate's carry their group values, deletes included; after HAVING's UpsertJoin a delete
    # carries only its key (pipeline/sql/runner.py apply_having).
    key_field = ("key" if plan.kind == "join" else "_result_key" if plan.having
                 else output_field(plan, plan.target.primary_key))
    columns["_key"] = changed[key_field].cast(pa.string())
    columns["_batch_id"] = pa.array([batch_id] * n, pa.int64())
    columns["_changed_at"] = pa.array([now_ms] * n, pa.int64()).cast(TS)
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def build_dead_letters(rows: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    dead = rows.filter(pc.equal(rows["op"], "dead"))
    n = dead.num_rows
    schema = SCHEMAS["dead_letter"]
    columns = {"source_topic": dead["source_topic"], "source_partition": dead["source_partition"].cast(pa.int32()),
               "source_message_id": dead["source_message_id"], "key": dead["key"], "payload": dead["payload"],
               "error": dead["error"], "published_at": dead["published_ms"].cast(pa.int64()).cast(TS),
               "detected_at": pa.array([now_ms] * n, pa.int64()).cast(TS),
               "batch_id": pa.array([batch_id] * n, pa.int64())}
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def split_unsendable(plan: Plan, result: pa.Table, batch_id: int, now_ms: int) -> tuple[pa.Table, pa.Table]:
    """(the result rows the topic can take, dead letters for the others): a row whose primary key
    is NULL (a NULL group value; Flink refuses a NULL into a PRIMARY KEY too), or whose number
    JSON cannot hold (a SUM past a DOUBLE's range is Infinity). Neither is sent nor kept in
    ``result``; the pipeline goes on."""
    problems = [None] * result.num_rows
    key_name = plan.target.primary_key
    for index, row in enumerate(result.to_pylist()):
        if row["_key"] is None:
            problems[index] = (f"result row of INSERT INTO {plan.target.name}: its PRIMARY KEY {key_name!r} is NULL "
                               "(a NULL group value); not sent")
        elif row["_op"] != "delete":
            bad = [name for name, value in row.items() if isinstance(value, float) and value - value != 0.0]
            if bad:
                problems[index] = (f"result row of INSERT INTO {plan.target.name}: column {bad[0]!r} is "
                                   f"{row[bad[0]]}, which JSON cannot hold; not sent")
    refused = pa.array([problem is not None for problem in problems], pa.bool_())
    dead = result.filter(refused)
    n = dead.num_rows
    schema = SCHEMAS["dead_letter"]
    columns = {"source_topic": pa.array([plan.target.topic] * n, pa.string()), "source_partition": pa.nulls(n, pa.int32()),
               "source_message_id": pa.nulls(n, pa.string()), "key": dead["_key"],
               "payload": pa.array([json.dumps({k: v for k, v in row.items() if not k.startswith("_")})
                                    for row in dead.to_pylist()], pa.string()),
               "error": pa.array([p for p in problems if p is not None], pa.string()),
               "published_at": pa.nulls(n, TS), "detected_at": pa.array([now_ms] * n, pa.int64()).cast(TS),
               "batch_id": pa.array([batch_id] * n, pa.int64())}
    dead_letters = pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)
    return result.filter(pc.invert(refused)), dead_letters


def build_messages(plan: Plan, result: pa.Table) -> list[tuple[str, bytes]]:
    """(key, payload) per result row: the target's columns as JSON, b"" for a delete."""
    names = [c.name for c in plan.target.payload_columns]
    messages = []
    for row in result.select(["_key", "_op"] + names).to_pylist():
        payload = b"" if row["_op"] == "delete" else json.dumps(
            {name: row[name] for name in names}, separators=(",", ":"), allow_nan=False).encode()
        messages.append((row["_key"], payload))
    return messages


def send_messages(producer, messages: list[tuple[str, bytes]]) -> None:
    """Send and flush; a failed send raises (the batch fails and Spark re-runs it)."""
    import pulsar

    errors = []

    def on_ack(result, _message_id) -> None:
        if result != pulsar.Result.Ok:
            errors.append(str(result))

    for key, payload in messages:
        producer.send_async(payload, on_ack, partition_key=key)
    producer.flush()
    if errors:
        raise SinkError(f"sending to topic {producer.topic()!r} failed: {errors[0]} ({len(errors)} messages)")


class SqlSinkWriter(DeltaSinks):
    """A SQL pipeline's two Delta tables (see the module docstring)."""

    def __init__(self, root: Path, results: list[str] | None = None):
        self.root = Path(root)  # <data_dir>/sql/<name>
        # "result", or a statement set's result_<target> per INSERT (pipeline/sql/statement_set.py)
        sinks = [*(results or ["result"]), "dead_letter"]
        super().__init__({sink: self.folder(sink) for sink in sinks})

    def folder(self, sink: str) -> Path:
        return self.root / "sinks" / sink
