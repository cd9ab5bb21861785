"""The source's planning and range reads, called directly (no Spark) against the real broker.

Planning (``latestOffset``, ``partitions``, ``reportLatestOffset``) runs on the driver and must
never read a message: it asks each partition's newest entry and plans whole entries. Reads run
on executors and must return exactly the messages of a range, again after a crash.
"""

from __future__ import annotations

import json

import _pulsar
import pulsar
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.source import offsets as off
from pipeline.source.datasource import PulsarPartition, PulsarStreamReader
from pipeline.source.probes import last_entry_id
from pipeline.source.rows import POSITION_SHIFT, arrow_schema
from factories import keyed, order, publish


def make_reader(url: str, topics: dict, **options) -> PulsarStreamReader:
    return PulsarStreamReader({"service_url": url, "topics": ",".join(f"{k}={v}" for k, v in topics.items()),
                               **{k: str(v) for k, v in options.items()}})


def publish_mixed(url: str, topic: str) -> list[int]:
    """250 orders batched into one entry or a few, then 3 unbatched ones: invoices in publish order."""
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
    """Opening a reader or receiving a message, through either client API, fails the test."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("planning read a message on the driver")
    for owner, name in ((pulsar.Client, "create_reader"), (pulsar.Reader, "read_next"),
                        (pulsar.Consumer, "receive"), (pulsar.Consumer, "batch_receive"),
                        (_pulsar.Client, "create_reader"), (_pulsar.Reader, "read_next"),
                        (_pulsar.Consumer, "receive"), (_pulsar.Consumer, "batch_receive")):
        monkeypatch.setattr(owner, name, refuse)
    return monkeypatch


def test_planning_a_batch_reads_no_message_on_the_driver(broker, unique_topics, no_reads_on_the_driver):
    topics = unique_topics()
    publish_mixed(broker.service_url, topics["orders"])
    # nothing was read yet, so each entry is priced at a full default batch (1,000 messages)
    reader = make_reader(broker.service_url, {"orders": topics["orders"]}, maxRowsPerBatch=2000, splitRows=1)
    start = reader.initialOffset()
    first = reader.latestOffset(start, reader.getDefaultReadLimit())
    end = reader.latestOffset(first, reader.getDefaultReadLimit())
    pieces = reader.partitions(first, end)
    latest = reader.reportLatestOffset()
    no_reads_on_the_driver.undo()  # the executors' side may read
    part = end["orders"]["parts"]["-1"]
    assert part["n"] == 4 and part["id"].endswith(":-1:-1")  # two batches of two whole entries
    assert [p.rng.count for p in pieces] == [1, 1]  # cut at the entry between them
    assert latest["orders"]["parts"]["-1"]["n"] >= 4  # one or more batched entries and 3 unbatched ones
    assert len(invoices(read_batch(reader, first, end))) >= 2


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
    assert [n for table in tables for n in invoices(table)] == expected  # every message once, in order
    assert all(t.num_rows >= 1 for t in tables) and len(tables) == offsets[-1]["orders"]["parts"]["-1"]["n"]
    positions = [p for t in tables for p in t.column("position").to_pylist()]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert {p >> POSITION_SHIFT for p in tables[-1].column("position").to_pylist()} == {len(tables)}
    ids = [i for t in tables for i in t.column("message_id").to_pylist()]
    assert [off.through(i) for i in ids] == sorted(off.through(i) for i in ids)
    # after a crash Spark replans nothing: it re-reads a logged (start, end] and gets the same rows
    middle = len(tables) // 2
    again = read_batch(make_reader(broker.service_url, {"orders": topics["orders"]}, splitRows=3),
                       offsets[middle], offsets[middle + 1])
    assert again.equals(tables[middle])
    assert reader.latestOffset(offsets[-1], ReadAllAvailable()) == offsets[-1]  # caught up: nothing more


def test_a_start_inside_an_entry_reads_the_rest_of_it(broker, unique_topics):
    """A replay's time base (and a checkpoint of the message-counting source) ends on a message
    inside an entry: the next batch reads the rest of that entry, and a range ending there stops."""
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(50)]))
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    first = reader.initialOffset()
    everything = read_batch(reader, first, reader.latestOffset(first, ReadAllAvailable()))
    assert invoices(everything) == list(range(50))
    tenth = everything.column("message_id")[9].as_py()
    middle = off.initial_offset({"orders": ["-1"]})
    middle["orders"]["parts"]["-1"] = {"n": 1, "id": tenth}
    assert invoices(read_batch(reader, middle, reader.latestOffset(middle, ReadAllAvailable()))) == list(range(10, 50))
    assert invoices(read_batch(reader, off.initial_offset({"orders": ["-1"]}), middle)) == list(range(10))


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
    assert row["message_id"].split(":")[1:3] == ["0", "-1"] and row["position"] >> POSITION_SHIFT == 1  # the first entry


def test_a_start_past_the_newest_entry_fails_in_one_line(broker, unique_topics):
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(1, 1, 1)]))
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    ledger = off.Position.parse(last_entry_id(broker.service_url, topics["orders"], "-1")).ledger
    gone = off.initial_offset({"orders": ["-1"]})
    gone["orders"]["parts"]["-1"] = {"n": 9, "id": f"{ledger}:99:-1:-1"}  # a topic recreated under a checkpoint
    with pytest.raises(Exception, match=rf"partition -1: position '{ledger}:99:-1:-1' is past the newest entry") as raised:
        reader.latestOffset(gone, ReadAllAvailable())
    assert "\n" not in str(raised.value)


def test_an_unbatched_entry_then_a_batched_one_in_one_range(broker, unique_topics):
    """A batched entry's first message (batch index 0) after an unbatched one (-1) starts a new
    entry: the range still ends after the batched entry's last message, without waiting."""
    topics = unique_topics()
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topics["orders"], batching_enabled=False)
        for n in range(3):
            producer.send(keyed("orders", [order(n, 1, 1)])[0][1], partition_key=str(n))
    finally:
        client.close()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(3, 53)]))
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    first = reader.initialOffset()
    table = read_batch(reader, first, reader.latestOffset(first, ReadAllAvailable()))
    assert invoices(table) == list(range(53))
    entries = [p >> POSITION_SHIFT for p in table.column("position").to_pylist()]
    assert entries[:3] == [1, 2, 3] and set(entries[3:]) <= {4, 5, 6, 7} and entries == sorted(entries)


def test_a_range_is_read_whole_and_its_reader_closed_before_its_first_batch_is_handed_on(broker, unique_topics, monkeypatch):
    """The broker pushes an open reader the rest of the topic (READ_AHEAD_BYTES), so a range
    under the read-ahead bound must be read to its end, and its reader closed, first."""
    from pipeline.source import reader as rd

    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(70_000)]))
    closed: list[bool] = []
    real_close = rd._RangeStream.close
    monkeypatch.setattr(rd._RangeStream, "close", lambda self: (closed.append(True), real_close(self)))
    reader = make_reader(broker.service_url, {"orders": topics["orders"]})
    start = reader.initialOffset()
    (piece,) = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    batches = reader.read(piece)
    first = next(batches)
    assert closed, "the reader was still open when the first batch was handed on"
    rest = list(batches)
    assert len(rest) >= 2 and first.num_rows + sum(b.num_rows for b in rest) == 70_000  # three Arrow batches

    monkeypatch.setattr(rd, "READ_AHEAD_BYTES", 0)  # nothing read ahead: the reader stays open until the end
    closed.clear()
    batches = reader.read(piece)
    next(batches)
    assert not closed
    assert sum(b.num_rows for b in batches) == 70_000 - first.num_rows and closed


def test_the_clock_travels_in_the_offset_and_moves_a_quiet_stream_once_per_time(tmp_path):
    """The driver's clock file (pipeline/source/clock.py) goes into the end offset; a clock that
    moved with no new message still plans a batch, which yields one clock row; re-planned after a
    crash it is the same batch; and each range's rows carry the bound the facts give them."""
    from pipeline.source import clock as clk

    path = tmp_path / "clock.json"
    reader = make_reader("pulsar://127.0.0.1:9", {"users": "persistent://public/default/u",
                                                  "items": "persistent://public/default/i"},
                         clockFile=str(path), changelogs="users,items")
    start = off.initial_offset({"users": ["0", "1"], "items": ["-1"]})
    assert not reader._take_clock(start, json.loads(json.dumps(start)))  # no file yet
    clk.write_clock_file(path, {"users/0": 9_000, "users/1": 4_000, "items": None}, {"items"}, None)
    end = json.loads(json.dumps(start))
    assert reader._take_clock(start, end)  # the clock is at 4,000: a batch moves the watermark there
    assert end["users"]["parts"]["1"] == {"n": 0, "id": off.EARLIEST, "newest_ms": 4_000}
    assert end["items"]["parts"]["-1"] == {"n": 0, "id": off.EARLIEST, "newest_ms": None, "idle": True}
    assert not reader._take_clock(end, json.loads(json.dumps(end)))  # the same clock again: no new batch
    pieces = reader.partitions(start, end)
    assert [type(p).__name__ for p in pieces] == ["ClockPartition"]
    (row,) = [r for piece in pieces for batch in reader.read(piece) for r in batch.to_pylist()]
    assert (row["kind"], row["event_time"], row["watermark_bound"], row["key"]) == ("clock", 4_000, 4_000, None)
    assert reader.partitions(end, end) == []  # re-planned after a crash: the same (no) rows
    # a range's rows: users/0 counts up to users/1's time, items (idle) not at all
    rng = off.Range("users", "0", 0, off.EARLIEST, 0, "1:0:0:-1", 1)
    moved = json.loads(json.dumps(end))
    moved["users"]["parts"]["0"]["n"] = 1
    (piece,) = [p for p in reader.partitions(end, moved) if hasattr(p, "rng")]
    assert (piece.rng.partition, piece.bound, piece.clock_ms) == (rng.partition, 4_000, None)


def test_planning_waits_for_the_clock_to_take_in_the_batch_before(tmp_path):
    """The driver writes the clock a moment after Spark may plan the next batch: planning waits
    for the file to name the batch it plans after, and goes on with the older clock after a bound."""
    import threading

    from pipeline.source import clock as clk

    path = tmp_path / "clock.json"
    start = {"users": {"gen": 0, "parts": {"-1": {"n": 3, "id": "1:2:-1:-1"}}}}
    clk.write_clock_file(path, {"users": 1_000}, set(), {"users": {"gen": 0, "parts": {}}})
    timer = threading.Timer(0.2, clk.write_clock_file, (path, {"users": 2_000}, set(), start))
    timer.start()
    try:
        assert clk.wait_for_clock(path, start, timeout_s=30).newest == {"users": 2_000}
    finally:
        timer.cancel()
    clk.write_clock_file(path, {"users": 3_000}, set(), {"users": {"gen": 0, "parts": {}}})
    assert clk.wait_for_clock(path, start, timeout_s=0.05).newest == {"users": 3_000}  # late: the older clock
    clk.write_clock_file(path, {"users": 3_000}, set(), None)  # a restarted driver: nothing to wait for
    assert clk.wait_for_clock(path, start, timeout_s=30).through is None


def test_batches_keep_their_cap_across_a_ledger_the_broker_rolled(broker, unique_topics, tmp_path):
    """pulsar-lite starts a new ledger every 50,000 entries (Apache Pulsar by size and time), and
    an id does not say where the earlier ledger ended: the planner learns it from the reads, so an
    unbatched backlog over two ledgers still goes in batches of the cap, each message once."""
    topics = unique_topics()
    total = 60_000
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(total)]), batching=False)
    newest = off.Position.parse(last_entry_id(broker.service_url, topics["orders"], "-1"))
    assert newest.ledger > 0  # the broker did roll a ledger
    reader = make_reader(broker.service_url, {"orders": topics["orders"]}, maxRowsPerBatch=20_000,
                         statsDir=str(tmp_path / "stats"))
    offsets, sizes = [reader.initialOffset()], []
    while len(offsets) < 20:
        end = reader.latestOffset(offsets[-1], reader.getDefaultReadLimit())
        if end == offsets[-1]:
            break
        table = read_batch(reader, offsets[-1], end)
        sizes.append(table.num_rows)
        assert invoices(table) == list(range(sum(sizes[:-1]), sum(sizes)))  # in order, none twice, none skipped
        offsets.append(end)
    assert sum(sizes) == total and max(sizes) <= 20_000, sizes
    assert len(sizes) <= total // 20_000 + 3  # batches near the cap (a cold first one, one at the ledger's end)


def test_planning_says_once_a_minute_when_the_clock_is_late(tmp_path, monkeypatch, caplog):
    """A clock file that stops taking in batches (its listener gone) costs each plan the wait:
    the source says so in one warning, not once per plan."""
    from pipeline.source import clock as clk
    from pipeline.source import datasource

    monkeypatch.setattr(datasource, "CLOCK_WAIT_S", 0.01)
    path = tmp_path / "clock.json"
    reader = make_reader("pulsar://127.0.0.1:9", {"users": "persistent://public/default/u"},
                         clockFile=str(path), changelogs="users")
    start = off.initial_offset({"users": ["-1"]})
    clk.write_clock_file(path, {"users": 1_000}, set(), {"users": {"gen": 0, "parts": {}}})  # an older batch
    with caplog.at_level("WARNING", logger=datasource.__name__):
        for _ in range(3):
            reader._take_clock(start, json.loads(json.dumps(start)))
    warnings = [r.getMessage() for r in caplog.records if "clock file" in r.getMessage()]
    assert len(warnings) == 1 and str(path) in warnings[0] and "(1 plans so far)" in warnings[0]
    assert reader._late_clocks == 3
    caplog.clear()
    clk.write_clock_file(path, {"users": 2_000}, set(), start)  # the clock takes the batch in: no word
    with caplog.at_level("WARNING", logger=datasource.__name__):
        reader._take_clock(start, json.loads(json.dumps(start)))
    assert reader._late_clocks == 3 and not caplog.records


def subscription_names(broker_dir, topic: str) -> set[str]:
    """The subscription names pulsar-lite's metadata file holds for ``topic`` (it keeps every one)."""
    metadata = json.loads((broker_dir / "db.metadata.json").read_text())
    tenant, namespace, name = topic.removeprefix("persistent://").split("/")
    return {sub for store in metadata.values() if isinstance(store, dict)
            for sub in store.get(tenant, {}).get(namespace, {}).get("persistent", {}).get(name, {}).get("subscriptions", {})}


def test_planning_leaves_no_consumer_on_the_driver_and_no_new_subscription_per_batch(broker, unique_topics):
    """Issue 28: the driver's client kept every probe consumer (51 KB a plan of three partitions), and
    each probe's new subscription name grew pulsar-lite's metadata file, which it rewrites on every
    subscribe (a plan took 8 ms, then 30 ms after 3,000)."""
    from pipeline.source.connection import pulsar_client

    topics = unique_topics()
    reader = make_reader(broker.service_url, topics, maxRowsPerBatch=100, changelogs="users,items")
    start = reader.initialOffset()
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producers = {kind: client.create_producer(topic, batching_enabled=False) for kind, topic in topics.items()}
        for n in range(25):
            for producer in producers.values():
                producer.send(b"{}", partition_key=str(n))  # planning reads no payload
            end = reader.latestOffset(start, reader.getDefaultReadLimit())
            assert end != start  # each plan found the new entries
            start = end
    finally:
        client.close()
    # pulsar-client's Client keeps a consumer until its close() returns; the driver's lives on
    assert pulsar_client(broker.service_url)._consumers == []
    for topic in topics.values():
        assert len([name for name in subscription_names(broker.broker_dir, topic) if name.startswith("ss-probe-")]) == 1


def test_probes_from_many_threads_of_one_process_share_its_subscription_name_in_turn(broker, unique_topics):
    """One subscription name per process is exclusive on the broker: probes at once must take turns."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.source.probes import newest_entry

    topic = unique_topics()["orders"]
    publish(broker.service_url, topic, keyed("orders", [order(1, 1, 1)]))
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda _: newest_entry(broker.service_url, topic, "-1")[0], range(32)))
    assert len(set(found)) == 1 and found[0] is not None
