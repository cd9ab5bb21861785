"""A SQL pipeline's outputs: the upsert topic, and the Delta change table DuckDB reads.

Per micro-batch the query's output rows (one per changed key: an upsert or a delete) become:

- **messages on the target topic**, keyed by the primary key, the row as JSON in the target
  table's column order (``{"accountId":"100","userCount":2}``), an empty payload for a delete.
  Sent and flushed inside the batch, before Spark commits it, so at-least-once: a batch re-run
  after a crash sends the same messages again, which an upsert topic absorbs (same key, same row).
  Sent by Python's Pulsar client (``send_result``), or with ``sql.topic_sender = jvm`` by the
  JVM's (pipeline/sql/jvm_sender.py), with the same payloads (``build_payloads``).
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
from pipeline.sql.plan import Plan

SQL_SINKS = ("result", "dead_letter")
ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
               "boolean": pa.bool_()}
SENT_OPS = ("after", "upsert", "delete")  # what reaches the topic and ``result``
# and what does not: a change resolve_changes found nothing to send for, a dead letter (build_dead_letters)
KNOWN_OPS = (*SENT_OPS, "skip", "dead")


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


def resolve_changes(rows: pa.Table) -> pa.Table:
    """An operator's rows as the topic needs them: one change per key, or none. UpsertJoin (with
    emitBefore), ForeignKeyJoin and HAVING's join give per changed key the row as it was sent before
    the batch (op ``before``, when it was there) and the row now (``after``), or ``delete`` when the
    driving row went; ``_pass`` (when there: WHERE on a joined table, an inner side, HAVING) says
    whether a row passes, as Flink's filter does: the ``after`` is sent if it passes; a ``before``
    that passed (it was sent) and has no passing ``after`` becomes the key's delete; an operator's
    ``delete`` is sent only where it comes without a ``before`` (UpsertJoin without emitBefore: the
    row was sent), else the ``before`` decided. A key's ``before`` and ``after`` come in either order
    (a foreign key that moved gets them from its old and new value). Other ops pass unchanged.

    # in:  {"key": "u1", "op": "before", "_pass": true}, {"key": "u1", "op": "after", "_pass": false},
    #      {"key": "u2", "op": "before"}, {"key": "u2", "op": "after"}, {"key": "u3", "op": "before"}
    # out: {"key": "u1", "op": "delete"}, {"key": "u1", "op": "skip"},
    #      {"key": "u2", "op": "skip"},   {"key": "u2", "op": "after"},  {"key": "u3", "op": "delete"}
    """
    ops, keys = rows["op"].combine_chunks(), rows["key"].combine_chunks()
    passed = (pc.fill_null(rows["_pass"].combine_chunks(), False) if "_pass" in rows.column_names
              else pa.array([True] * rows.num_rows, pa.bool_()))

    def keys_with(condition) -> pa.Array:
        return pc.fill_null(pc.is_in(keys, value_set=keys.filter(condition)), False)

    is_before, is_after = pc.equal(ops, "before"), pc.equal(ops, "after")
    has_before, sent_now = keys_with(is_before), keys_with(pc.and_(is_after, passed))
    op = pc.case_when(
        pa.StructArray.from_arrays([pc.and_(is_after, passed), is_after,
                                    pc.and_(pc.and_(is_before, passed), pc.invert(sent_now)), is_before,
                                    pc.and_(pc.equal(ops, "delete"), has_before)],
                                   ["send", "unsent", "retract", "kept", "decided"]),
        "after", "skip", "delete", "skip", "skip", ops)
    return rows.set_column(rows.schema.get_field_index("op"), "op", op)


def build_result(plan: Plan, rows: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    """The batch's ``result`` rows from the query's output rows (upserts and deletes only)."""
    schema = result_schema(plan)
    if (plan.kind == "join" or plan.having) and rows.num_rows:
        rows = resolve_changes(rows)
    ops = pc.fill_null(rows["op"], "null")
    unknown = pc.unique(rows.filter(pc.invert(pc.is_in(ops, pa.array(KNOWN_OPS))))["op"]).to_pylist()
    if unknown:  # an operator's row the pipeline should have consumed (e.g. an expire row: runner.py drops it)
        raise SinkError(f"INSERT INTO {plan.target.name}: the operators emitted op {unknown[0]!r}, which the sink "
                        f"does not send; expected one of {', '.join(KNOWN_OPS)}")
    changed = rows.filter(pc.is_in(ops, pa.array(SENT_OPS)))
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
    ``result``; the pipeline goes on. Found with Arrow compute over whole columns: only the refused
    rows (rare) are looked at one by one, for their messages."""
    refused = find_unsendable(result)
    if not pc.any(refused).as_py():
        return result, build_unsendable_letters(plan, result.slice(0, 0), batch_id, now_ms)
    return result.filter(pc.invert(refused)), build_unsendable_letters(plan, result.filter(refused), batch_id, now_ms)


def find_unsendable(result: pa.Table) -> pa.Array:
    """Per result row: True where its key is NULL, or an upsert holds a non-finite DOUBLE."""
    refused = pc.is_null(result["_key"])
    upsert = pc.not_equal(result["_op"], "delete")
    for field in result.schema:
        if pa.types.is_floating(field.type):
            non_finite = pc.fill_null(pc.invert(pc.is_finite(result[field.name])), False)
            refused = pc.or_(refused, pc.and_(upsert, non_finite))
    return refused.combine_chunks() if isinstance(refused, pa.ChunkedArray) else refused


def build_unsendable_letters(plan: Plan, dead: pa.Table, batch_id: int, now_ms: int) -> pa.Table:
    """The dead letters of the result rows ``find_unsendable`` refused, each with what is wrong."""
    key_name = plan.target.primary_key
    problems, payloads = [], []
    for row in dead.to_pylist():  # the refused rows only
        if row["_key"] is None:
            problems.append(f"result row of INSERT INTO {plan.target.name}: its PRIMARY KEY {key_name!r} is NULL "
                            "(a NULL group value); not sent")
        else:
            bad = [name for name, value in row.items() if isinstance(value, float) and value - value != 0.0]
            problems.append(f"result row of INSERT INTO {plan.target.name}: column {bad[0]!r} is "
                            f"{row[bad[0]]}, which JSON cannot hold; not sent")
        payloads.append(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}))
    n = dead.num_rows
    schema = SCHEMAS["dead_letter"]
    columns = {"source_topic": pa.array([plan.target.topic] * n, pa.string()), "source_partition": pa.nulls(n, pa.int32()),
               "source_message_id": pa.nulls(n, pa.string()), "key": dead["_key"],
               "payload": pa.array(payloads, pa.string()), "error": pa.array(problems, pa.string()),
               "published_at": pa.nulls(n, TS), "detected_at": pa.array([now_ms] * n, pa.int64()).cast(TS),
               "batch_id": pa.array([batch_id] * n, pa.int64())}
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def build_payloads(plan: Plan, result: pa.Table) -> pa.Array:
    """Per result row, its message payload (binary): the target's columns as compact JSON in the
    target's column order, NULLs kept, b"" for a delete. Built with Arrow compute over whole
    columns, and byte for byte what ``json.dumps(row, separators=(",", ":"))`` gives: a DOUBLE
    as Python's repr (numpy's shortest round-trip text), strings escaped as json.dumps does
    (``ensure_ascii``). The rows must have passed ``split_unsendable`` (finite numbers).

    # in:  {"_key": "101", "_op": "upsert", "accountId": "101", "userCount": 3}, {"_key": "100", "_op": "delete", …}
    # out: b'{"accountId":"101","userCount":3}', b''
    """
    names = [c.name for c in plan.target.payload_columns]
    if not result.num_rows:
        return pa.array([], pa.binary())
    parts = []
    for index, name in enumerate(names):
        parts.append(("{" if index == 0 else ",") + json.dumps(name) + ":")
        parts.append(pc.fill_null(encode_json_values(result[name].combine_chunks()), "null"))
    parts.append("}" if names else "{}")
    payload = pc.binary_join_element_wise(*parts, "")
    return pc.if_else(pc.equal(result["_op"], "delete"), "", payload).combine_chunks().cast(pa.binary())


# Text json.dumps writes unchanged but for backslash and quote: printable ASCII
PLAIN_TEXT = r"^[\x20-\x7e]*$"


def encode_json_values(values: pa.Array) -> pa.Array:
    """Each value as JSON text, as json.dumps writes it; NULL stays NULL."""
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        escaped = pc.replace_substring(pc.replace_substring(values, "\\", "\\\\"), '"', '\\"')
        quoted = pc.binary_join_element_wise('"', escaped, '"', "")
        plain = pc.fill_null(pc.match_substring_regex(values, PLAIN_TEXT), True)
        if pc.all(plain).as_py():
            return quoted
        # control characters and non-ASCII text (JSON's \u escapes): json.dumps, on those values only
        others = values.filter(pc.invert(plain))
        dumped = pa.array([json.dumps(value) for value in others.to_pylist()], pa.string())
        return pc.replace_with_mask(quoted, pc.invert(plain), dumped)
    if pa.types.is_floating(values.type):
        # numpy's str of a float64 is Python's repr (shortest round trip: 100.0, 1e+16, 1e-05)
        text = pa.array(values.fill_null(0.0).to_numpy(zero_copy_only=False).astype(str), pa.string())
        return pc.if_else(pc.is_null(values), pa.scalar(None, pa.string()), text)
    if pa.types.is_integer(values.type) or pa.types.is_boolean(values.type) or pa.types.is_null(values.type):
        return values.cast(pa.string())  # 42, -7, true, false
    raise SinkError(f"cannot write a column of Arrow type {values.type} as JSON; expected one of "
                    f"{', '.join(sorted(ARROW_TYPES))}")


def build_messages(plan: Plan, result: pa.Table) -> list[tuple[str, bytes]]:
    """(key, payload) per result row: the target's columns as JSON, b"" for a delete."""
    return list(zip(result["_key"].to_pylist(), build_payloads(plan, result).to_pylist()))


def send_result(producer, plan: Plan, result: pa.Table) -> None:
    """The result rows to the topic with Python's client (``sql.topic_sender = python``), one call per
    message (the JVM's sender: pipeline/sql/jvm_sender.py send_result_from_jvm)."""
    send_messages(producer, build_messages(plan, result))


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


def build_senders(spark, settings, plans: tuple[Plan, ...], service_url: str, client) -> tuple[list, list]:
    """Per INSERT, its ``send(plan, result)`` to its target topic, by ``sql.topic_sender``: Python's
    client (``client``'s producers), or the JVM's (pipeline/sql/jvm_sender.py); and the JVM's
    senders, to close when the pipeline stops."""
    from functools import partial

    if settings["sql.topic_sender"] == "jvm":
        from pipeline.sql.jvm_sender import open_sinks, send_result_from_jvm

        sinks = open_sinks(spark, service_url, settings["pulsar.auth_token"], [p.target.topic for p in plans])
        return [partial(send_result_from_jvm, sink) for sink in sinks], sinks
    from pipeline.feed.producers import create_producer

    return [partial(send_result, create_producer(client, p.target.topic)) for p in plans], []
