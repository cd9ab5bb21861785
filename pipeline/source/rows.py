"""The rows the source yields: their Arrow and Spark schema, messages as Arrow columns, the clock row.

One row per message (``kind`` names its topic's role), and in event time, when the clock moved,
one clock row (:func:`clock_row`). :class:`MessageColumns` turns the messages a read took into
one Arrow record batch, column-wise.

The columns::

    kind string          logical topic name given in the ``topics`` option (users, items, orders)
    topic string         full Pulsar topic name
    partition int        partition index, -1 for a non-partitioned topic
    message_id string    ledger:entry:partition:batch
    position long        grows in read order within a partition and generation: the entry's
                         position << 20 | (batch index + 1)
    generation long      replay generation of its topic (0 until the first replay)
    key string           message key (None if the producer gave none)
    value binary         raw payload
    publish_time timestamp
    properties string    message properties as a JSON object, or None
    event_time long      event time the producer set (epoch ms), or None
    time_error string    why a time the message carried is None above (past the year 9999: an
                         event time of 2**64-1, say), naming it and its value; else None
    watermark_bound long the most this row's time may count for an event-time watermark, or
                         None: it counts for none (option ``clockFile``)
"""

from __future__ import annotations

from pipeline.wire import MAX_TIME_MS

# A message's ``position``: its entry's position in the partition and generation, shifted, plus
# its batch index + 1, so positions grow in read order (a batch index stays below 2**20).
POSITION_SHIFT = 20


class MessageColumns:
    """Messages read in a row, as column lists, turned into one Arrow record batch at once.

    Only what differs per message is taken from the client (``reader._RangeStream.read`` fills the
    lists); the constant columns, the positions and the id texts are built column-wise by Arrow.
    """

    def __init__(self):
        self.ledgers, self.entries, self.batches = [], [], []  # each message's id: ledger:entry:partition:batch
        self.entry_ns = []  # each message's entry position in the generation (see POSITION_SHIFT)
        self.keys, self.values, self.published, self.event_times, self.properties = [], [], [], [], []

    def to_arrow(self, kind: str, topic: str, partition: int, gen: int):
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.batches)
        message_ids = pc.binary_join_element_wise(
            pa.array(self.ledgers, pa.int64()).cast(pa.string()), pa.array(self.entries, pa.int64()).cast(pa.string()),
            pa.repeat(str(partition), n), pa.array(self.batches, pa.int64()).cast(pa.string()), ":")
        published, published_errors = _held_times(self.published, "publish_time")
        event_times, event_errors = _held_times(self.event_times, "event_time")
        published = pc.multiply(published, 1000).cast(pa.timestamp("us", tz="UTC"))
        columns = [pa.repeat(kind, n), pa.repeat(topic, n), pa.repeat(pa.scalar(partition, pa.int32()), n),
                   message_ids, pc.add(pc.shift_left(pa.array(self.entry_ns, pa.int64()), POSITION_SHIFT),
                                       pc.add(pa.array(self.batches, pa.int64()), 1)),
                   pa.repeat(pa.scalar(gen, pa.int64()), n), pa.array(self.keys, pa.string()),
                   pa.array(self.values, pa.binary()), published, pa.array(self.properties, pa.string()),
                   pc.if_else(pc.equal(event_times, 0), None, event_times),  # 0: the producer set none
                   _time_errors(n, event_errors, published_errors),
                   pa.nulls(n, pa.int64())]  # watermark_bound: set by the source for event time (clock.py)
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema())


def _held_times(values: list[int], name: str) -> tuple:
    """A message time column (epoch ms as the client gives them: unsigned 64-bit) as int64, with
    each value past ``wire.MAX_TIME_MS`` (the end of the year 9999) null instead, and the errors
    of those rows by row index.

    Pulsar's event and publish times are unsigned 64-bit on the wire, so a producer can send
    any of them (an event time of 2**64-1 is a Java producer's -1): no value may fail the batch.
    Beyond the year 9999 no sink could hold it (wire.py), and a Spark timestamp (microseconds in
    a long) not much further. Checked column-wise: the read loop stays as it is.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        raw = pa.array(values, pa.uint64())
    except (OverflowError, pa.ArrowException):  # the client gave something else: sort it out one by one
        raw = pa.array([v if isinstance(v, int) and 0 <= v < 1 << 64 else 1 << 63 for v in values], pa.uint64())
    unheld = pc.greater(raw, pa.scalar(MAX_TIME_MS, pa.uint64()))
    if not pc.any(unheld).as_py():
        return raw.cast(pa.int64()), {}
    rows = pc.indices_nonzero(unheld).to_pylist()
    errors = {i: f"message {name} {values[i]} is outside the times the job can hold (epoch milliseconds "
                 f"up to {MAX_TIME_MS}, the end of the year 9999)" for i in rows}
    return pc.if_else(unheld, None, raw.cast(pa.int64(), safe=False)), errors


def _time_errors(n: int, *errors: dict[int, str]):
    """The ``time_error`` column: per row, what :func:`_held_times` found, ``"; "``-joined, or None."""
    import pyarrow as pa

    if not any(errors):
        return pa.nulls(n, pa.string())
    texts: list[str | None] = [None] * n
    for found in errors:
        for i, text in found.items():
            texts[i] = text if texts[i] is None else f"{texts[i]}; {text}"
    return pa.array(texts, pa.string())


def arrow_schema():
    import pyarrow as pa

    return pa.schema([
        ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("message_id", pa.string()),
        ("position", pa.int64()), ("generation", pa.int64()), ("key", pa.string()), ("value", pa.binary()),
        ("publish_time", pa.timestamp("us", tz="UTC")), ("properties", pa.string()),
        ("event_time", pa.int64()), ("time_error", pa.string()), ("watermark_bound", pa.int64()),
    ])


SPARK_SCHEMA = ("kind string, topic string, partition int, message_id string, position long, generation long, "
                "key string, value binary, publish_time timestamp, properties string, event_time long, "
                "time_error string, watermark_bound long")
SPARK_SCHEMA_NAMES = [column.split()[0] for column in SPARK_SCHEMA.split(", ")]


CLOCK_KIND = "clock"  # the kind of a clock row: no topic's (datasource.py, option clockFile)


def clock_row(clock_ms: int):
    """The one row that carries the event-time clock to the watermark when it moved (a quiet
    stream has no other row to carry it): event time ``clock_ms``, counting whole, no key, no
    value, an id no message has (``clock:<ms>``); every other column None."""
    import pyarrow as pa

    schema = arrow_schema()
    values = {"kind": CLOCK_KIND, "partition": -1, "message_id": f"{CLOCK_KIND}:{clock_ms}",
              "position": 0, "generation": 0, "event_time": int(clock_ms), "watermark_bound": int(clock_ms)}
    return pa.RecordBatch.from_pylist([{name: values.get(name) for name in schema.names}], schema=schema)
