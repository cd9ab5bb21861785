"""The parse step: source rows -> envelope rows, as a ``mapInArrow`` function (runs on executors).

Every message becomes exactly one envelope row: an upsert, a delete (tombstone), an order, or a
dead letter with its one-line error. Nothing is dropped here, so nothing is lost, and no message
can fail the batch (rules.route_messages turns any failure into a dead letter). Only the payload
is looked at row by row; the source columns are carried over as whole Arrow columns.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.enrich import rules

_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
ENVELOPE_ARROW_SCHEMA = pa.schema([(name, _TYPES[kind]) for name, kind in
                                   (part.strip().split(" ") for part in rules.ENVELOPE_SPARK_SCHEMA.split(","))])
# envelope column <- source column, carried over as they are
FROM_SOURCE = {"kind": "kind", "source_topic": "topic", "source_partition": "partition",
               "source_message_id": "message_id", "position": "position", "key": "key"}
DECIDED = rules.DECIDED_COLUMNS
DECIDED_SCHEMA = pa.schema([ENVELOPE_ARROW_SCHEMA.field(name) for name in ENVELOPE_ARROW_SCHEMA.names
                            if name in DECIDED])


def parse_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Turn source record batches into envelope record batches (``rules.ENVELOPE_SPARK_SCHEMA``).

    # {"kind": "orders", "op": "order", "user_id": 17, "item_id": 4, "price": 9.5, …, "user_state": None, …}
    """
    for batch in batches:
        kinds, keys, values = (batch.column(name).to_pylist() for name in ("kind", "key", "value"))
        decided = pa.RecordBatch.from_pydict(rules.route_messages(kinds, keys, values), schema=DECIDED_SCHEMA)
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
        yield pa.RecordBatch.from_arrays(arrays, schema=ENVELOPE_ARROW_SCHEMA)
