"""Event time over partitioned changelogs, through the real job: one watermark per partition.

These tests run a broker of their own on which every topic of the job has two partitions.
One partition of the users topic goes far ahead in event time, the other stays behind. With a
watermark per topic the users topic would be past every order at once; per partition, the one
behind holds every order back until it goes idle (or moves), and the orders of its users then
get their versions from it.
"""

from __future__ import annotations

import pulsar
import pytest

from pipeline import wire
from pipeline.enrich import rules
from pipeline.enrich.lookups import WATERMARK_COLUMN, with_event_watermarks
from pipeline.metrics import read_events, read_rows
from factories import broker_with_partitions, item, order, send_routed, user
from jobproc import JobThread
from sinkread import orders_done, rows
from waiting import wait_for

T0 = 1_700_000_000_000
ORDERS = 12
OOO_MS = 1_000


def test_every_row_comes_out_once(spark):
    """One read, one watermark node: each row comes out once, whatever its topic and partition
    (one not listed included), and the clock rows do not."""
    kinds = [("users", 0), ("users", 1), ("users", 1), ("users", 7), ("items", -1), ("orders", 0), ("orders", 1)]
    rows = [{**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": kind, "source_partition": part, "key": f"k{n}",
             "op": "order" if kind == "orders" else "upsert", "event_time": T0 + n, "published_at": T0}
            for n, (kind, part) in enumerate(kinds)]
    rows.append({**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": "clock", "op": "tick", "event_time": T0,
                 "watermark_bound": T0})
    frame = spark.createDataFrame(rows, rules.ENVELOPE_SPARK_SCHEMA)
    out = with_event_watermarks(frame, "created_at", OOO_MS, partitions={"users": [0, 1], "items": [-1]})
    assert sorted(row["key"] for row in out.collect()) == sorted(row["key"] for row in rows if row["key"])
    assert WATERMARK_COLUMN not in out.columns


PARTITION_COUNTS = (1, 2, 4)  # the topic sets of the module's broker: partitions per topic


@pytest.fixture(scope="module")
def partitioned_broker(tmp_path_factory):
    """A broker of its own with a set of the job's three topics per partition count (1: not partitioned)."""
    data_dir = tmp_path_factory.mktemp("partitioned-broker")
    sets = {count: {k: f"persistent://public/default/{k}-{count}-{data_dir.name}" for k in ("users", "items", "orders")}
            for count in PARTITION_COUNTS}
    with broker_with_partitions(data_dir, {topic: count for count, topics in sets.items() for topic in topics.values()}) as running:
        yield running, sets


@pytest.fixture(scope="module")
def partitioned(partitioned_broker):
    """The module's broker and its topics of two partitions each."""
    running, sets = partitioned_broker
    return running, sets[2]


def job_settings(broker, data_dir, topics, **overrides):
    from pipeline.config import load_settings

    values = {"pulsar.service_url": broker.service_url, "paths.data_dir": str(data_dir), "spark.master": "local[2]",
              "job.trigger_interval": "200ms", "enrichment.time": "event", "enrichment.max_wait": "0s",
              "enrichment.out_of_orderness": f"{OOO_MS}ms", "enrichment.allowed_lateness": "1h",
              **{f"topics.{k}": v for k, v in topics.items()}, **overrides}
    return load_settings(env={}, cli=values)


def newest_row(data_dir, condition):
    """The first ``watermarks`` row that satisfies ``condition``, or None."""
    return next((row for row in read_rows(data_dir, "watermarks") if condition(row)), None)


def partitions_of(row: dict, topic: str) -> dict[int, dict]:
    entry = next(t for t in row["topics"] if t["topic"] == topic)
    return {part["partition"]: part for part in entry["partitions"]}


@pytest.mark.e2e
def test_a_partition_behind_holds_every_order_until_it_goes_idle(partitioned, tmp_path):
    broker, topics = partitioned
    url = broker.service_url
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        assert len(client.get_topic_partitions(topics["users"])) == 2
    finally:
        client.close()
    # long enough for the watermark to take in the partition behind before it goes idle, on a busy machine
    idle_timeout = "15s"
    settings = job_settings(broker, tmp_path / "data", topics, **{"enrichment.idle_timeout": idle_timeout})
    # Users 1-8 early on, each in the partition its key hashes to; user 1's partition then goes far
    # ahead, the other one (``behind``) stays at its newest early time.
    where = send_routed(url, topics["users"], [(str(u), wire.encode(user(u)), T0 + u * 100) for u in range(1, 9)])
    ahead = where["1"]
    behind_users = [int(key) for key, part in where.items() if part != ahead]
    assert behind_users, "users 1-8 all hashed to one partition"
    behind, late_user = 1 - ahead, behind_users[0]
    held_at = T0 + max(behind_users) * 100 - OOO_MS
    send_routed(url, topics["users"], [("1", wire.encode(user(1, firstName="Later1")), T0 + 60_000)])
    items = send_routed(url, topics["items"], [(str(i), wire.encode(item(i)), T0 + 50) for i in range(1, 9)])
    for part in (0, 1):  # every items partition goes far ahead
        first = next(key for key, p in items.items() if p == part)
        send_routed(url, topics["items"], [(first, wire.encode(item(int(first), price=5.0)), T0 + 60_000)])
    send_routed(url, topics["orders"], [(f"o{n}", wire.encode(order(n, (1, late_user)[n % 2], 1, createdAt=T0 + 10_000 + n * 1_000)),
                                  T0 + 10_000 + n * 1_000) for n in range(ORDERS)])
    job = JobThread(settings)
    try:
        # Everything read, and the job's watermark is the behind partition's: it holds every order back.
        held = wait_for(lambda: newest_row(settings.data_dir, lambda row: row["watermark_ms"] == held_at
                                           and partitions_of(row, "users").get(behind, {}).get("watermark_ms") == held_at
                                           and not partitions_of(row, "users").get(behind, {}).get("idle", True)
                                           and partitions_of(row, "users").get(ahead, {}).get("newest_ms") == T0 + 60_000)
                        or job.error, timeout=240, what="the watermark held by the users partition behind")
        assert job.error is None
        assert next(t for t in held["topics"] if t["topic"] == "users")["watermark_ms"] == held_at
        # Every changelog partition goes quiet; once idle, none holds the watermark back, and the
        # next row read (an item far ahead) carries it past every order.
        wait_for(lambda: {(e["details"]["topic"], e["details"]["partition"])
                          for e in read_events(settings.data_dir, ("topic_idle",))} >= {("users", 0), ("users", 1)}
                 or job.error, timeout=120, what="both users partitions marked idle")
        send_routed(url, topics["items"], [("1", wire.encode(item(1, price=1.0)), T0 + 90_000)])
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS or job.error, timeout=120, what="every order decided")
        assert job.error is None
        # the partition behind moves again: it holds the watermark again (an event names it)
        send_routed(url, topics["users"], [(str(late_user), wire.encode(user(late_user, firstName="Later")), T0 + 95_000)])
        wait_for(lambda: any(e["details"] == {"topic": "users", "partition": behind}
                             for e in read_events(settings.data_dir, ("topic_active",))) or job.error,
                 timeout=120, what="the users partition behind active again")
    finally:
        job.close()
    idle = [e for e in read_events(settings.data_dir, ("topic_idle",))
            if e["details"] == {"topic": "users", "partition": behind}]
    assert f"users partition {behind} has had no new message for {idle_timeout}" in idle[0]["message"]
    decided = rows(settings.data_dir, "enriched")
    # No order was decided while the partition behind held the watermark (in that batch or before).
    assert len(decided) == ORDERS and min(r["batch_id"] for r in decided) > held["batch_id"]
    as_of = {(r["user_id"], r["user_first_name"], int(r["user_as_of"].timestamp() * 1000)) for r in decided}
    assert as_of == {(1, "First1", T0 + 100), (late_user, f"First{late_user}", T0 + late_user * 100)}


@pytest.mark.e2e
@pytest.mark.parametrize("count", [1, 4])
def test_each_message_is_read_once_per_batch_whatever_the_partitions(partitioned_broker, tmp_path, count):
    """Event time reads the source once: Spark's count of the rows its scans gave (numInputRows,
    summed over every scan of the source in a batch) is the messages published, plus at most
    one clock row per batch; and the rows counted per topic partition are the messages each
    partition holds. Reading once per watermark node made it 2 (one partition) to 8 (four)
    times the messages."""
    from collections import Counter

    broker, sets = partitioned_broker
    topics, url = sets[count], broker.service_url
    users, items, orders = 60, 12, 300
    # the default producer (no batching): each message is its own entry; 3 versions per user, the
    # last ones after every order (which the watermark passes once the items go idle)
    published = Counter()
    for version in range(3):
        where = send_routed(url, topics["users"], [(str(u), wire.encode(user(u, firstName=f"V{version}")),
                                              T0 + version * 1_000 + u) for u in range(1, users + 1)])
        published.update(("users", part) for part in where.values())
    published.update(("items", part) for part in send_routed(url, topics["items"], [
        (str(i), wire.encode(item(i)), T0 + i) for i in range(1, items + 1)]).values())
    published.update(("orders", part) for part in send_routed(url, topics["orders"], [
        (f"o{n}", wire.encode(order(n, 1 + n % users, 1 + n % items, createdAt=T0 + 500 + n)), T0 + 500 + n)
        for n in range(orders)]).values())
    settings = job_settings(broker, tmp_path / "data", topics, **{
        "enrichment.idle_timeout": "2s", "job.max_rows_per_batch": "150"})  # several batches, the stream stops

    def counted() -> Counter:
        rows_read = Counter()
        for row in read_rows(settings.data_dir, "progress"):
            for topic in row["topics"]:
                for part in topic["partitions"]:
                    rows_read[(topic["topic"], part["partition"])] += part["rows"] or 0
        return rows_read

    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= orders or job.error, timeout=240, what="every order decided")
        # a batch's progress row comes a moment after its sinks' commit
        wait_for(lambda: sum(counted().values()) >= sum(published.values()) or job.error, timeout=60,
                 what="every message counted")
    finally:
        job.close()
    progress = read_rows(settings.data_dir, "progress")
    assert counted() == published
    scanned = sum(row["num_input_rows"] for row in progress)
    total = sum(published.values())
    assert total <= scanned <= total + len(progress), (scanned, total, len(progress))
    assert orders_done(settings.data_dir) == orders
