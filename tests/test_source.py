"""The Pulsar source through a real broker and a real SparkSession."""

from __future__ import annotations

import json
import shutil
import time

import pulsar
import pytest
from pulsar.schema import Float, Integer, JsonSchema, Long, Record, String

from pipeline import wire
from pipeline.source.datasource import PulsarDataSource, PulsarStreamReader
from pipeline.source.options import load_transform, parse_topics_option
from pipeline.errors import SourceError
from factories import keyed, order, publish, publish_timed, user
from waiting import wait_for


def stream(spark, url, topics: dict, **options):
    spark.dataSource.register(PulsarDataSource)
    reader = (spark.readStream.format("pulsar").option("service_url", url)
              .option("topics", ",".join(f"{k}={v}" for k, v in topics.items())))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def collect_into(store: dict):
    """foreachBatch writer that keeps each batch's rows by batch id (a re-run replaces them)."""
    def write(df, batch_id):
        store[batch_id] = [r.asDict() for r in df.collect()]
    return write


def all_rows(batches: dict) -> list[dict]:
    return [row for batch_id in sorted(batches) for row in batches[batch_id]]


def test_every_message_once_in_partition_order_with_metadata(spark, broker, unique_topics, tmp_path):
    topics = unique_topics()
    before = int(time.time() * 1000)
    users = [user(u) for u in range(40)]
    publish(broker.service_url, topics["users"], keyed("users", users))
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(250)]),
            properties={"redrive-of": "9:9:-1:-1"})
    batches: dict = {}
    query = (stream(spark, broker.service_url, {"users": topics["users"], "orders": topics["orders"]}, maxRowsPerBatch=64,
                    statsDir=str(tmp_path / "stats"))
             .writeStream.foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: len(all_rows(batches)) >= 290, timeout=120, what="290 rows")
    finally:
        query.stop()
    rows = all_rows(batches)
    assert len(rows) == 290 and len({(r["topic"], r["message_id"]) for r in rows}) == 290
    for batch in batches.values():  # the cap holds, in messages; an entry over it is a batch alone
        entries = {(r["kind"], r["message_id"].rsplit(":", 2)[0]) for r in batch}
        assert len(batch) <= 64 or len(entries) == 1
    by_kind = {k: [r for r in rows if r["kind"] == k] for k in ("users", "orders")}
    assert [json.loads(r["value"])["id"] for r in by_kind["users"]] == list(range(40))  # partition order
    positions = [r["position"] for r in by_kind["orders"]]
    assert positions == sorted(positions) and len(set(positions)) == 250
    first = by_kind["users"][0]
    assert (first["key"], first["topic"], first["partition"], first["generation"]) == ("0", topics["users"], -1, 0)
    assert first["publish_time"].timestamp() * 1000 >= before - 1000
    assert len(first["message_id"].split(":")) == 4
    assert json.loads(by_kind["orders"][0]["properties"]) == {"redrive-of": "9:9:-1:-1"}


def test_restart_from_checkpoint_has_no_gap_and_no_repeat(spark, broker, unique_topics, tmp_path):
    topics = unique_topics()
    unbatched = [(key, payload, 0) for key, payload in keyed("orders", [order(n, 1, 1) for n in range(300)])]
    publish_timed(broker.service_url, topics["orders"], unbatched)  # an entry each: batches of 40 messages
    batches: dict = {}
    source = lambda: stream(spark, broker.service_url, {"orders": topics["orders"]}, maxRowsPerBatch=40,  # noqa: E731
                            statsDir=str(tmp_path / "stats"))
    def start():
        return (source().writeStream.foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(processingTime="200 milliseconds").start())
    query = start()
    wait_for(lambda: len(batches) >= 2, timeout=120, what="two batches")
    query.stop()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(300, 350)]))
    query = start()
    try:
        wait_for(lambda: len(all_rows(batches)) >= 350, timeout=120, what="all rows after the restart")
    finally:
        query.stop()
    invoices = [json.loads(r["value"])["invoiceId"] for r in all_rows(batches)]
    assert sorted(invoices) == list(range(350))


def test_empty_and_not_yet_existing_topics_wait_for_data(spark, broker, unique_topics, tmp_path):
    topics = unique_topics()  # none of these topics exists yet
    batches: dict = {}
    query = (stream(spark, broker.service_url, {"users": topics["users"], "orders": topics["orders"]})
             .writeStream.foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: query.lastProgress is not None, timeout=120, what="a first (empty) progress")
        assert query.isActive and query.exception() is None and all_rows(batches) == []
        publish(broker.service_url, topics["orders"], keyed("orders", [order(1, 1, 1)]))
        wait_for(lambda: len(all_rows(batches)) == 1, timeout=60, what="the late message")
    finally:
        query.stop()


def test_broker_down_fails_with_a_clear_error(spark, unique_topics, tmp_path):
    topics = unique_topics()
    query = (stream(spark, "pulsar://127.0.0.1:9", {"orders": topics["orders"]})
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        wait_for(lambda: not query.isActive, timeout=120, what="the query to give up")
    finally:
        query.stop()
    message = str(query.exception())
    assert "pulsar://127.0.0.1:9" in message and "SourceError" in message


def test_bad_options_name_the_option():
    with pytest.raises(SourceError, match="'topics' entry 'orders' is not of the form"):
        parse_topics_option("orders")
    with pytest.raises(SourceError, match="option 'topics' is required"):
        parse_topics_option("")


def test_a_transform_runs_in_the_read_tasks_and_bad_ones_name_the_option(spark, broker, unique_topics, tmp_path):
    from pipeline.enrich.rules import ENVELOPE_SPARK_SCHEMA

    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 7, 3) for n in range(30)]))
    publish(broker.service_url, topics["orders"], [("x", b"{not json")])
    spark.dataSource.register(PulsarDataSource)
    envelopes = (spark.readStream.format("pulsar").schema(ENVELOPE_SPARK_SCHEMA)
                 .option("service_url", broker.service_url).option("topics", f"orders={topics['orders']}")
                 .option("transform", "pipeline.enrich.parse:parse_batches").load())
    batches: dict = {}
    query = (envelopes.writeStream.foreachBatch(collect_into(batches))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: len(all_rows(batches)) >= 31, timeout=120, what="31 envelope rows")
    finally:
        query.stop()
    rows = all_rows(batches)
    assert [r["op"] for r in rows] == ["order"] * 30 + ["dead"]
    assert {(r["user_id"], r["item_id"]) for r in rows[:30]} == {(7, 3)}
    assert rows[-1]["error"] and "\n" not in rows[-1]["error"]

    options = {"service_url": broker.service_url, "topics": f"orders={topics['orders']}"}
    with pytest.raises(SourceError, match="option 'transform' = 'pipeline.enrich.parse:nope' cannot be loaded"):
        PulsarStreamReader({**options, "transform": "pipeline.enrich.parse:nope"})
    with pytest.raises(SourceError, match="option 'transformArgs' = '{bad' is not a JSON object"):
        load_transform("pipeline.enrich.parse:parse_batches", "{bad")
    with pytest.raises(SourceError, match="a schema was given .* but no 'transform' option"):
        PulsarStreamReader(options, envelopes.schema)


class JavaOrder(Record):
    """The original job's Order POJO, as pulsar-client's JsonSchema writes it."""
    invoiceId = Long()
    lineItemId = Long()
    userId = Long()
    itemId = Long()
    itemName = String()
    itemCategory = String()
    price = Float()
    createdAt = Long()
    paidAt = Long()


def test_json_schema_producer_like_the_java_job(spark, broker, unique_topics, tmp_path):
    topics = unique_topics()
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topics["orders"], schema=JsonSchema(JavaOrder))
        producer.send(JavaOrder(invoiceId=44172, lineItemId=192933, userId=145493, itemId=602,
                                itemName="prize-winning instrument", itemCategory="instrument", price=48.4,
                                createdAt=1469834917000, paidAt=1469700797000), partition_key="44172")
    finally:
        client.close()
    batches: dict = {}
    query = (stream(spark, broker.service_url, {"orders": topics["orders"]}).writeStream
             .foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        wait_for(lambda: all_rows(batches), timeout=120, what="the JsonSchema message")
    finally:
        query.stop()
    (row,) = all_rows(batches)
    record = wire.parse_payload("orders", row["value"])
    assert record["invoiceId"] == 44172 and record["userId"] == 145493 and record["price"] == pytest.approx(48.4)
    assert row["key"] == "44172"


def test_replay_request_rereads_a_changelog_in_a_new_generation(spark, broker, unique_topics, tmp_path):
    topics = unique_topics()
    publish(broker.service_url, topics["users"], keyed("users", [user(u) for u in range(30)]))
    control = tmp_path / "control"
    control.mkdir()
    batches: dict = {}
    query = (stream(spark, broker.service_url, {"users": topics["users"]}, controlDir=str(control), maxRowsPerBatch=10)
             .writeStream.foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: len(all_rows(batches)) >= 30, timeout=120, what="the first read")
        (control / "00000001.json").write_text(json.dumps({"seq": 1, "topic": "users", "from_ms": None}))
        wait_for(lambda: len([r for r in all_rows(batches) if r["generation"] == 1]) >= 30, timeout=120,
                 what="the replay")
        # A batch's rows reach foreachBatch before Spark records its progress, so wait for that too.
        wait_for(lambda: any(json.loads(p["sources"][0]["endOffset"] or "{}").get("users", {}).get("gen") == 1
                             for p in query.recentProgress), timeout=60, what="a progress in generation 1")
    finally:
        query.stop()
    replayed = [r for r in all_rows(batches) if r["generation"] == 1]
    assert [json.loads(r["value"])["id"] for r in replayed] == list(range(30))


def test_the_token_reaches_every_reader_and_stays_out_of_plans(spark, broker, unique_topics, tmp_path, monkeypatch, capsys):
    """``authToken`` (pulsar.auth_token) builds the driver's clients and, through the pickled
    reader, each read task's; Spark redacts it from the plan. pulsar-lite ignores tokens, so the
    query reads as it would from an authenticated Pulsar."""
    import pickle

    from pipeline.source import connection
    from pipeline.source.datasource import PulsarStreamReader

    token = "tok-" + "s3cr3t" * 4
    topics = unique_topics()
    publish(broker.service_url, topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(5)]))
    batches: dict = {}
    query = (stream(spark, broker.service_url, {"orders": topics["orders"]}, authToken=token)
             .writeStream.foreachBatch(collect_into(batches)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: len(all_rows(batches)) >= 5, timeout=120, what="5 rows read with a token")
        query.explain(extended=True)
        assert token not in capsys.readouterr().out
        assert token not in json.dumps(query.lastProgress or {}, default=str)
    finally:
        query.stop()
    # What a read task does: unpickle the reader, then build its clients with the token.
    seen = []
    monkeypatch.setattr(pulsar, "Client", lambda url, **kw: seen.append(kw.get("authentication")))
    driver_side = PulsarStreamReader({"service_url": "pulsar://127.0.0.1:1", "topics": "orders=persistent://public/default/o",
                                      "authToken": token})
    connection._tokens.clear()
    pickle.loads(pickle.dumps(driver_side))
    connection.new_client("pulsar://127.0.0.1:1")
    assert isinstance(seen[-1], pulsar.AuthenticationToken)
    connection.use_token("pulsar://127.0.0.1:1", None)
    connection.new_client("pulsar://127.0.0.1:1")
    assert seen[-1] is None


def test_planning_goes_on_after_the_broker_restarts(tmp_path):
    """Planning asks the broker afresh each batch on the process's shared client: a broker that
    restarts (same port and data) is planned against again, with no entry lost or repeated."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from pipeline.feed.broker import EmbeddedBroker

    topic = "persistent://public/default/restarted"
    broker = EmbeddedBroker(tmp_path).start()
    try:
        publish(broker.service_url, topic, keyed("orders", [order(n, 1, 1) for n in range(5)]))
        reader = PulsarStreamReader({"service_url": broker.service_url, "topics": f"orders={topic}"})
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())
        broker.stop()
        broker.start()  # the client's connection is gone, the messages are not
        publish(broker.service_url, topic, keyed("orders", [order(n, 1, 1) for n in range(5, 10)]))
        def planned():
            try:
                end = reader.latestOffset(first, ReadAllAvailable())
            except SourceError:  # the client is still reconnecting
                return None
            return end if end != first else None
        second = wait_for(planned, timeout=60, what="a batch planned after the broker came back")
        read = [json.loads(v)["invoiceId"] for s_, e_ in ((start, first), (first, second))
                for piece in reader.partitions(s_, e_) for b in reader.read(piece) for v in b.column("value").to_pylist()]
        assert read == list(range(10))
    finally:
        broker.stop()
