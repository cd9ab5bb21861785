"""The parse step: source rows -> envelope rows, as a ``mapInArrow`` function (runs on executors).

Every message becomes exactly one envelope row: an upsert, a delete (tombstone), an order, or a
dead letter with its one-line error. Nothing is dropped here, so nothing is lost. Only the
payload is looked at row by row (rules.route_messages); the source columns are carried over
as whole Arrow columns.
"""

from __future__ import annotations

from functools import partial
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.enrich import chunks, rules

ENVELOPE_ARROW_SCHEMA = chunks.ENVELOPE_ARROW_SCHEMA
CHUNK_ARROW_SCHEMA = pa.schema([("user_bucket", pa.int32()), ("rows", pa.binary())])
# envelope column <- source column, carried over as they are
FROM_SOURCE = {"kind": "kind", "source_topic": "topic", "source_partition": "partition",
               "source_message_id": "message_id", "position": "position", "key": "key"}
DECIDED = rules.DECIDED_COLUMNS
DECIDED_SCHEMA = pa.schema([ENVELOPE_ARROW_SCHEMA.field(name) for name in ENVELOPE_ARROW_SCHEMA.names
                            if name in DECIDED])


def parse_batches(batches: Iterator[pa.RecordBatch], buckets: int) -> Iterator[pa.RecordBatch]:
    """Turn source record batches into envelope rows, in chunks per user bucket.

    # {"user_bucket": 17, "rows": <Arrow IPC of {"kind": "orders", "op": "order", "user_id": 17, …}, …>}
    """
    for batch in batches:
        kinds, keys, values, positions = (batch.column(name).to_pylist()
                                          for name in ("kind", "key", "value", "position"))
        decided = pa.RecordBatch.from_pydict(rules.route_messages(kinds, keys, values, positions, buckets),
                                             schema=DECIDED_SCHEMA)
        arrays = []
        for field in ENVELOPE_ARROW_SCHEMA:
            if field.name in DECIDED:
                arrays.append(decided.column(field.name))
            elif field.name in FROM_SOURCE:
                arrays.append(batch.column(FROM_SOURCE[field.name]).cast(field.type))
            elif field.name == "published_at":  # microseconds -> epoch ms
                arrays.append(pc.divide(pc.cast(batch.column("publish_time"), pa.int64()), 1000))
            elif field.name == "redrive_of":
                arrays.append(pa.array([rules.redrive_of(props) if props else None
                                        for props in batch.column("properties").to_pylist()], pa.string()))
            else:  # filled in by the lookups
                arrays.append(pa.nulls(batch.num_rows, field.type))
        envelopes = pa.Table.from_batches([pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_ARROW_SCHEMA)])
        buckets_seen, blobs = chunks.by_bucket(envelopes, "user_bucket")
        yield pa.RecordBatch.from_arrays([pa.array(buckets_seen, pa.int32()), pa.array(blobs, pa.binary())],
                                         schema=CHUNK_ARROW_SCHEMA)


def parser(buckets: int):
    """The picklable mapInArrow function for a bucket count."""
    return partial(parse_batches, buckets=buckets)
