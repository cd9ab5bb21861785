"""The source's planning and range reads, called directly (no Spark) against the real broker.

Planning (``latestOffset``, ``partitions``) runs on the driver and must never read a message;
reads run on executors and must return exactly the messages of a range, again after a crash.
"""

from __future__ import annotations

import json

import pulsar
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.source import offsets as off
from pipeline.source.datasource import PulsarPartition, PulsarStreamReader
from pipeline.source.reader import arrow_schema, batch_size
from factories import keyed, order, publish


def make_reader(url: str, topics: dict, **options) -> PulsarStreamReader:
    return PulsarStreamReader({"service_url": url, "topics": ",".join(f"{k}={v}" for k, v in topics.items()),
                               **{k: str(v) for k, v in options.items()}})


def publish_mixed(url: str, topic: str) -> list[int]:
    """250 orders batched into few entries, then 3 unbatched ones: invoices in publish order."""
    publish(url, topic, keyed("orders", [order(n, 1, 1) for n in range(250)]))
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for n in range(250, 253):
            producer.send(keyed("orders", [order(n, 1, 1)])[0][1], partition_key=str(n))
    finally:
        client.close()
    return list(range(253))


def read_batch(reader: PulsarStreamReader, start: dict, end: dict) -> pa.Table:
    batches = [b for part in reader.partitions(start, end) for b in reader.read(part)]
    return pa.Table.from_batches(batches, schema=arrow_schema())


def invoices(table: pa.Table) -> list[int]:
    return [json.loads(v)["invoiceId"] for v in table.column("value").to_pylist()]


@pytest.fixture
def no_reads_on_the_driver(monkeypatch):
    """Any attempt to open a reader or receive a message fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("planning read a message on the driver")
    for owner, name in ((pulsar.Client, "create_reader"), (pulsar.Reader, "read_next"),
                        (pulsar.Consumer, "receive"), (pulsar.Consumer, "batch_receive")):
        monkeypatch.setattr(owner, name, refuse)
    return monkeypatch


def test_planning_a_batch_reads_no_message_on_the_driver(broker, unique_topics, no_reads_on_the_driver):
    topics = unique_topics()
    publish_mixed(broker.service_url, topics["orders"])
    reader = make_reader(broker.service_url, {"orders": topics["orders"]}, maxRowsPerBatch=2, splitRows=1)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    pieces = reader.partitions(start, end)
    latest = reader.reportLatestOffset()
    no_reads_on_the_driver.undo()  # the executors' side may read
    part = end["orders"]["parts"]["-1"]
    assert part["n"] == 2 and part["id"].endswith(":-1:-1")  # two whole entries
    assert [p.rng.count for p in pieces] == [1, 1]  # cut at the entry between them
    total_entries = latest["orders"]["parts"]["-1"]["n"]
    assert total_entries >= 4  # one or more batched entries and 3 unbatched ones
    assert len(invoices(read_batch(reader, start, end))) >= 2


def test_batches_of_whole_entries_cover_the_topic_once_and_reread_exactly(broker, unique_topics):
    topics = unique_topics()
    expected = publish_mixed(broker.service_url, topics["orders"])
    reader = make_reader(broker.service_url, {"orders": topics["orders"]}, maxRowsPerBatch=1, splitRows=1)
    offsets = [reader.initialOffset()]
    tables = []
    while True:
        end = reader.latestOffset(offsets[-1], ReadMaxRows(1))
        if end == offsets[-1]:
            break
        tables.append(read_batch(reader, offsets[-1], end))
        offsets.append(end)
    read = [n for table in tables for n in invoices(table)]
    assert read == expected  # every message once, in order, in batches of one entry each
    assert all(t.num_rows >= 1 for t in tables) and len(tables) == offsets[-1]["orders"]["parts"]["-1"]["n"]
    positions = [p for t in tables for p in t.column("position").to_pylist()]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    ids = [i for t in tables for i in t.column("message_id").to_pylist()]
    assert [off.through(i) for i in ids] == sorted(off.through(i) for i in ids)
    # after a crash Spark replans nothing: it re-reads a logged (start, end] and gets the same rows
    middle = len(tables) // 2
    again = read_batch(make_reader(broker.service_url, {"orders": topics["orders"]}, splitRows=3),
                       offsets[middle], offsets[middle + 1])
    assert again.equals(tables[middle])
    assert reader.latestOffset(offsets[-1], ReadAllAvailable()) == offsets[-1]  # caught up: nothing more


def test_a_start_inside_an_entry_reads_the_rest_of_it(broker, unique_topics):
    """Offsets of older checkpoints (and a replay's time base) end on a message inside an entry."""
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(50)]))
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    everything = read_batch(reader, reader.initialOffset(), reader.latestOffset(reader.initialOffset(), ReadAllAvailable()))
    tenth = everything.column("message_id")[9].as_py()
    start = off.initial_offset({"orders": ["-1"]})
    start["orders"]["parts"]["-1"] = {"n": 10, "id": tenth}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert invoices(read_batch(reader, start, end)) == list(range(10, 50))
    # and a range that ends on that message (an older checkpoint's end) stops there
    first = read_batch(reader, off.initial_offset({"orders": ["-1"]}), start)
    assert invoices(first) == list(range(10))


def test_a_read_range_yields_the_source_schema_exactly(broker, unique_topics):
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(1, 1, 1)]), properties={"redrive-of": "1:2:-1:-1"})
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    start = reader.initialOffset()
    (piece,) = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    assert isinstance(piece, PulsarPartition)
    (batch,) = list(reader.read(piece))
    assert batch.schema == arrow_schema()
    row = batch.to_pylist()[0]
    assert (row["kind"], row["topic"], row["partition"], row["generation"], row["key"]) == ("orders", topics["orders"], -1, 0, "1")
    assert json.loads(row["properties"]) == {"redrive-of": "1:2:-1:-1"}
    assert row["message_id"].endswith(":0:-1:0") and row["position"] == (1 << 20) | 1  # entry 1, batch index 0


def test_a_batched_message_id_tells_its_entry_size(broker, unique_topics):
    """How a range knows it has read the whole of its end entry (an empty queue proves nothing)."""
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(37)]))
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topics["orders"], pulsar.MessageId.earliest)
        ids = [reader.read_next(10_000).message_id() for _ in range(37)]
    finally:
        client.close()
    sizes = {(i.entry_id(), batch_size(i)) for i in ids}
    assert sum(size for _, size in sizes) == 37 and all(size >= 1 for _, size in sizes)
