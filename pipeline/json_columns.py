"""JSON payloads read column-wise by Arrow, where Python's json would read them alike.

The job's parse step (pipeline/enrich/parse.py) and the SQL pipelines' (pipeline/sql/columnar.py)
read most payloads with one pyarrow JSON read per Arrow batch into declared, typed columns, and
send the rest message by message through their Python specification:

- before reading, any payload that is not ``{…}``, over :data:`FAST_MAX_BYTES`, or that holds
  ``\\u`` escapes, a control byte, ``NaN``/``Infinity``, or any nesting (a ``[``, or a second
  ``{``): Python's json and Arrow's disagree on exactly these (lone surrogates, BOMs, nesting
  depth, non-JSON numbers), and one regular expression finds all of them (:func:`plain_payloads`);
- any group of payloads Arrow refuses (a mistyped field, a duplicated one, an integer past its
  type, invalid UTF-8 or JSON: the group is halved until the culprits are alone), or that reads
  as another number of rows than payloads (:func:`read_groups`).

:func:`in_read_order` puts the two kinds of rows back in the order of their messages.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

FAST_MAX_BYTES = 4096
SLOW_GROUP = 16  # a refused group this small goes message by message
SUSPECT = r"\\u|[\x00-\x1f]|NaN|Infinity|\[|\{.*\{"  # what the two readers read differently (above)


def parse_options(schema: pa.Schema) -> pj.ParseOptions:
    """Arrow's JSON options for payloads of ``schema``'s typed fields; other fields are ignored."""
    return pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False)


def plain_payloads(values: pa.Array) -> pa.Array:
    """Which payloads Python's json and Arrow's reader are known to read alike (never null)."""
    length = pc.binary_length(values)
    plain = pc.and_kleene(pc.and_kleene(pc.starts_with(values, "{"), pc.ends_with(values, "}")),
                          pc.less_equal(length, FAST_MAX_BYTES))
    plain = pc.and_kleene(plain, pc.invert(pc.match_substring_regex(values, SUSPECT)))
    return pc.fill_null(plain, False)


def read_groups(payloads: pa.Array, options: pj.ParseOptions, offset: int = 0) -> list[tuple[int, int, pa.Table | None]]:
    """(offset, count, typed table) for each group of payloads Arrow reads one row each; the
    table is None for a refused group of SLOW_GROUP or fewer (they go message by message)."""
    if not len(payloads):
        return []
    try:
        payloads.cast(pa.string())  # Arrow's reader does not check UTF-8
        data = b"\n".join(payloads.to_pylist())
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
                             parse_options=options)
        if table.num_rows == len(payloads):
            return [(offset, len(payloads), table)]
    except Exception:  # noqa: BLE001 - any refusal: halve the group and find the culprits
        pass
    if len(payloads) <= SLOW_GROUP:
        return [(offset, len(payloads), None)]
    half = len(payloads) // 2
    return read_groups(payloads.slice(0, half), options, offset) + read_groups(payloads.slice(half), options, offset + half)


def in_read_order(parts: list[pa.RecordBatch], rows: list[pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    """One batch of ``parts`` (each with the source row numbers of its rows in ``rows``), its rows
    in source order."""
    if len(parts) == 1:
        return parts[0]
    merged = pa.Table.from_batches(parts, schema=schema)
    order = pa.chunked_array([r.cast(pa.uint64()) for r in rows], pa.uint64()).combine_chunks()
    return merged.take(pc.sort_indices(order)).combine_chunks().to_batches()[0]
