"""Envelope rows travel between the job's stages in chunks: one Spark row per key bucket.

Spark's Python transformWithState workers turn their input into Python objects row by row
(PySpark 4.3 iterates ``itertuples`` even for the pandas API). That cost grows with rows and
columns, so the stages do not hand each other envelope rows: they hand over one row per key
bucket, ``(bucket, rows)``, where ``rows`` is an Arrow IPC stream of that bucket's envelope
rows. Encoding and decoding are columnar, so a batch costs a few hundred Spark rows however
many messages it holds.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.enrich import rules

_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
ENVELOPE_ARROW_SCHEMA = pa.schema([(name, _TYPES[kind]) for name, kind in
                                   (part.strip().split(" ") for part in rules.ENVELOPE_SPARK_SCHEMA.split(","))])
# (bucket, rows): the Spark schema between stages, per grouping column
USER_CHUNKS = "user_bucket int, rows binary"
ITEM_CHUNKS = "item_bucket int, rows binary"


def encode(table: pa.Table | pa.RecordBatch) -> bytes:
    """Envelope rows (Arrow, envelope schema) as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, ENVELOPE_ARROW_SCHEMA) as writer:
        writer.write(table)
    return sink.getvalue().to_pybytes()


def decode_table(blobs) -> pa.Table:
    """The envelope rows of several chunks as one Arrow table (empty, with the schema, for none)."""
    tables = [pa.ipc.open_stream(blob).read_all() for blob in blobs]
    if not tables:
        return ENVELOPE_ARROW_SCHEMA.empty_table()
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


def decode(blobs) -> pd.DataFrame:
    """The envelope rows of several chunks as one pandas frame (envelope columns, in order)."""
    return decode_table(blobs).to_pandas()


def by_bucket(table: pa.Table, bucket_column: str) -> tuple[list[int], list[bytes]]:
    """Split envelope rows by a bucket column: (buckets, one encoded chunk each).

    Rows keep their relative order inside a bucket (a stable sort), which keeps each
    partition's changelog in read order.
    """
    buckets = table.column(bucket_column)
    if table.num_rows == 0:
        return [], []
    first = buckets[0].as_py()
    if pc.all(pc.equal(buckets, first)).as_py():
        return [first], [encode(table)]
    table = table.take(pc.array_sort_indices(buckets))  # Arrow's sorts are stable
    sorted_buckets = table.column(bucket_column).to_numpy()
    starts = [0, *(np.flatnonzero(np.diff(sorted_buckets)) + 1).tolist()]
    ends = [*starts[1:], len(sorted_buckets)]
    return ([int(sorted_buckets[start]) for start in starts],
            [encode(table.slice(start, end - start)) for start, end in zip(starts, ends)])


def frames_by_bucket(frames: list[pd.DataFrame], bucket_column: str) -> pd.DataFrame:
    """Pandas frames of envelope rows as chunk rows ``(bucket, rows)`` keyed by ``bucket_column``."""
    tables = [pa.Table.from_pandas(frame, schema=ENVELOPE_ARROW_SCHEMA, preserve_index=False) for frame in frames]
    keys, blobs = by_bucket(tables[0] if len(tables) == 1 else pa.concat_tables(tables), bucket_column)
    return pd.DataFrame({bucket_column: pd.Series(keys, dtype="int32"), "rows": blobs})


def unchunk_batches(batches) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: chunk rows back to envelope rows (the stateless bench's ceiling)."""
    for batch in batches:
        for blob in batch.column("rows").to_pylist():
            yield from pa.ipc.open_stream(blob).read_all().to_batches()
