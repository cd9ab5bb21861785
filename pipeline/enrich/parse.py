"""The parse step: source rows -> envelopes, as a ``mapInArrow`` function (runs on executors).

Every message becomes exactly one envelope: an upsert, a delete (tombstone), an order, or a
dead letter with its one-line error. Nothing is dropped here, so nothing is lost.
"""

from __future__ import annotations

from functools import partial
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.enrich import rules

ENVELOPE_ARROW_SCHEMA = pa.schema([("user_bucket", pa.int32()), ("item_bucket", pa.int32()), ("body", pa.binary())])


def parse_batches(batches: Iterator[pa.RecordBatch], buckets: int) -> Iterator[pa.RecordBatch]:
    """Turn source record batches into envelope record batches, row for row.

    # {"user_bucket": 3, "item_bucket": 9, "body": pickle({"op": "order", "record": {…}, "topic": …})}
    """
    for batch in batches:
        published = pc.cast(batch.column("publish_time"), pa.int64()).to_pylist()  # microseconds
        cols = batch.select(["kind", "topic", "partition", "message_id", "position", "key", "value",
                             "properties"]).to_pydict()
        user_buckets, item_buckets, bodies = [], [], []
        for i in range(batch.num_rows):
            meta = {"topic": cols["topic"][i], "partition": cols["partition"][i], "message_id": cols["message_id"][i],
                    "position": cols["position"][i], "key": cols["key"][i],
                    "published_ms": published[i] // 1000 if published[i] is not None else None,
                    "redrive_of": rules.redrive_of(cols["properties"][i])}
            env = rules.route_message(cols["kind"][i], cols["key"][i], cols["value"][i], meta, buckets)
            user_buckets.append(env["user_bucket"])
            item_buckets.append(env["item_bucket"])
            bodies.append(rules.pack(env))
        yield pa.RecordBatch.from_arrays([pa.array(user_buckets, pa.int32()), pa.array(item_buckets, pa.int32()),
                                          pa.array(bodies, pa.binary())], schema=ENVELOPE_ARROW_SCHEMA)


def parser(buckets: int):
    """The picklable mapInArrow function for a bucket count."""
    return partial(parse_batches, buckets=buckets)
