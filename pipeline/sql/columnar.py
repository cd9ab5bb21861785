"""The SQL parse step column-wise: source batches → envelope batches with Arrow, row for row what
pipeline/sql/envelope.py's ``parse_rows`` (the specification, message by message) gives.

A read task's batch holds one table's messages. Its plain payloads (pipeline/json_columns.py) are
read in one pyarrow JSON read into the table's declared columns, typed as declared: Arrow refuses
what ``check_value`` refuses (a string where an INT is declared, an INT past 32 bits, a BOOLEAN
given as 1, a field given twice). Tombstones (an empty payload) are deletes here too. Everything
else goes message by message through ``parse_rows``, so its error text is always the
specification's:

- a message without a key, and a payload json_columns does not read;
- a payload with a run of 19 or more digits (an integer past 64 bits, which Arrow reads into a
  DOUBLE column as a number, where the specification refuses it);
- a row whose DOUBLE is not finite;
- every message of a table whose query reads a METADATA column, or that declares a type not
  listed in :data:`ARROW_TYPES`.

tests/test_sql_columnar.py holds the two paths to each other over fuzzed batches.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.json_columns import in_read_order, parse_options, plain_payloads, read_groups

ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
               "boolean": pa.bool_()}
LONG_DIGITS = r"[0-9]{19}"  # a whole number that may be past 64 bits


def decode_batch(batch: pa.RecordBatch, specs: dict, schema: pa.Schema) -> pa.RecordBatch:
    """The envelope rows (``schema``) of one source batch; ``specs``: envelope.table_specs."""
    from pipeline.sql.envelope import parse_rows

    kinds = pc.unique(batch.column("kind")).to_pylist() if batch.num_rows else []
    spec = specs.get(kinds[0]) if len(kinds) == 1 else None
    if spec is None or spec["metadata"] or any(t not in ARROW_TYPES for _, _, t in spec["columns"]):
        return parse_rows(batch, specs, schema)
    keys, values = batch.column("key"), batch.column("value")
    keyed = pc.is_valid(keys)
    tombstone = pc.and_(keyed, pc.fill_null(pc.equal(pc.binary_length(values), 0), True))
    plain = pc.and_(pc.and_(keyed, plain_payloads(values)),
                    pc.invert(pc.fill_null(pc.match_substring_regex(values, LONG_DIGITS), False)))
    table_schema = pa.schema([(name, ARROW_TYPES[spark_type]) for name, _, spark_type in spec["columns"]])
    parts, order, slow = [], [], pc.indices_nonzero(pc.invert(pc.or_(plain, tombstone))).to_pylist()
    deletes = pc.indices_nonzero(tombstone)
    if len(deletes):
        parts.append(_rows(batch.take(deletes), spec, schema, "delete", None))
        order.append(deletes)
    fast = pc.indices_nonzero(plain)
    for offset, count, table in read_groups(values.take(fast), parse_options(table_schema)):
        rows = fast[offset:offset + count]
        if table is None:  # refused: message by message
            slow.extend(rows.to_pylist())
            continue
        good = _finite(table)
        if len(rows.filter(good)):
            parts.append(_rows(batch.take(rows.filter(good)), spec, schema, "upsert", table.filter(good)))
            order.append(rows.filter(good))
        slow.extend(rows.filter(pc.invert(good)).to_pylist())
    if slow:
        slow.sort()
        parts.append(parse_rows(batch.take(pa.array(slow, pa.uint64())), specs, schema))
        order.append(pa.array(slow, pa.uint64()))
    return in_read_order(parts, order, schema)


def _finite(table: pa.Table) -> pa.Array:
    """Rows whose DOUBLE values are finite or null (``check_value`` refuses NaN and infinities)."""
    good = pa.array([True] * table.num_rows, pa.bool_())
    for field in table.schema:
        if field.type == pa.float64():
            good = pc.and_(good, pc.fill_null(pc.is_finite(table.column(field.name).combine_chunks()), True))
    return good


def _rows(batch: pa.RecordBatch, spec: dict, schema: pa.Schema, op: str, table: pa.Table | None) -> pa.RecordBatch:
    """Envelope rows of source rows that are all ``op`` (their values from ``table``'s columns)."""
    n = batch.num_rows
    published = pc.cast(batch.column("publish_time"), pa.int64())  # microseconds since the epoch
    # floored to milliseconds, as envelope.epoch_ms
    published_ms = pc.divide(pc.subtract(published, pc.if_else(pc.less(published, 0), 999, 0)), 1000)
    base = {"key": batch.column("key"), "side": pa.repeat(pa.scalar(spec["side"], pa.int32()), n),
            "op": pa.repeat(pa.scalar(op, pa.string()), n), "source_partition": batch.column("partition"),
            "position": batch.column("position"), "source_topic": batch.column("topic"),
            "source_message_id": batch.column("message_id"), "published_ms": published_ms}
    columns = {field: column for column, field in spec["fields"].items()}
    arrays = []
    for field in schema:
        if field.name in base:
            arrays.append(base[field.name].cast(field.type))
        elif table is not None and field.name in columns:
            arrays.append(table.column(columns[field.name]).combine_chunks().cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
