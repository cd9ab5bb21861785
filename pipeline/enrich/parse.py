"""The parse step: source rows -> envelope rows, as a ``mapInArrow`` function (runs on executors).

Every message becomes exactly one envelope row: an upsert, a delete (tombstone), an order, or a
dead letter with its one-line error. Nothing is dropped here, so nothing is lost.
"""

from __future__ import annotations

from functools import partial
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.enrich import rules

_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
ENVELOPE_ARROW_SCHEMA = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in
                                   (part.strip().split(" ") for part in rules.ENVELOPE_SPARK_SCHEMA.split(","))])


def parse_batches(batches: Iterator[pa.RecordBatch], buckets: int) -> Iterator[pa.RecordBatch]:
    """Turn source record batches into envelope record batches, row for row.

    # {"kind": "orders", "op": "order", "user_bucket": 17, "user_id": 17, "invoice_id": 1001, …}
    """
    for batch in batches:
        published = pc.cast(batch.column("publish_time"), pa.int64()).to_pylist()  # microseconds
        cols = batch.select(["kind", "topic", "partition", "message_id", "position", "key", "value",
                             "properties"]).to_pydict()
        rows = []
        for i in range(batch.num_rows):
            meta = {"source_topic": cols["topic"][i], "source_partition": cols["partition"][i],
                    "source_message_id": cols["message_id"][i], "position": cols["position"][i],
                    "key": cols["key"][i],
                    "published_at": published[i] // 1000 if published[i] is not None else None,
                    "redrive_of": rules.redrive_of(cols["properties"][i])}
            rows.append(rules.route_message(cols["kind"][i], cols["key"][i], cols["value"][i], meta, buckets))
        yield pa.RecordBatch.from_pylist(rows, schema=ENVELOPE_ARROW_SCHEMA)


def parser(buckets: int):
    """The picklable mapInArrow function for a bucket count."""
    return partial(parse_batches, buckets=buckets)
