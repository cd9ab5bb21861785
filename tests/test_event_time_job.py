"""Event time through the real job: the sinks equal the batch-free temporal join
(event_rules.temporal_join) whatever the batch sizes, the read interleaving, or a kill -9 midway.

One input, published once (orders first, then the users, then the items: the orders are read
before any user exists), and read by three jobs on their own data dirs: one running while it is
published, in batches of 25 rows; one after, in one batch; one in batches of 20 killed with
SIGKILL after its first batch and started again. Every run must write exactly what the model
says, so they also agree with each other.
"""

from __future__ import annotations

import pytest

from pipeline import store
from pipeline.enrich import event_rules, rules
from pipeline.enrich.event_clock import restored_newest
from pipeline.enrich.lookups import ITEMS, USERS
from pipeline.metrics import read_events, read_rows
from pipeline.runtime.scratch import own_name, scratch_root
from pipeline import wire
from factories import item, order, publish_timed, user
from jobproc import JobProcess, JobThread
from sinkread import orders_done, rows
from waiting import wait_for

pytestmark = pytest.mark.e2e
T0 = 1_700_000_000_000
ORDERS = 90
MAX_WAIT_MS = 4_000
EVENT = {"enrichment__time": "event", "enrichment__max_wait": f"{MAX_WAIT_MS}ms",
         "enrichment__out_of_orderness": "2s", "enrichment__allowed_lateness": "1h",
         "enrichment__idle_timeout": "10m"}  # no topic goes idle here: idleness is processing time


def the_input() -> dict[str, list[tuple[str, bytes, int]]]:
    """(key, payload, event time) per topic. Users 1-6 and items 1-4 appear over the first
    seconds, some change or go later (so an order's version depends on its time); user 7 and
    item 5 never exist; user 8 appears 3 s after the orders that name it (found within max_wait)
    and user 9 10 s after (missing). The last versions (id 99) push both watermarks past every order."""
    users = [(str(u), wire.encode(user(u)), T0 + u * 1_000) for u in range(1, 7)]
    users += [(str(u), wire.encode(user(u, firstName=f"Renamed{u}")), T0 + 20_000 + u * 500) for u in (2, 3, 4)]
    users += [("5", b"", T0 + 25_000), ("8", wire.encode(user(8)), T0 + 33_000), ("9", wire.encode(user(9)), T0 + 60_000)]
    users += [("99", wire.encode(user(99)), T0 + 200_000)]
    items = [(str(i), wire.encode(item(i)), T0 + i * 700) for i in range(1, 5)]
    items += [("2", wire.encode(item(2, price=99.5)), T0 + 15_000), ("3", b"", T0 + 35_000)]
    items += [("99", wire.encode(item(99)), T0 + 200_000)]
    orders = []
    for n in range(ORDERS):
        user_id = 8 if n == 60 else 9 if n == 61 else (n % 7) + 1
        record = order(n, user_id, (n % 5) + 1, createdAt=T0 + 500 + n * 500)
        orders.append((f"o{n}", wire.encode(record), record["createdAt"]))
    return {"orders": orders, "users": users, "items": items}


def expected(data) -> list[tuple]:
    versions: dict[str, dict[int, list]] = {}
    for lookup in (USERS, ITEMS):
        for seq, (key, payload, at) in enumerate(data[lookup.changelog]):
            routed = rules.route_message(lookup.changelog, key, payload)
            record = None if routed["op"] == "delete" else tuple(routed[c] for c in lookup.state_columns)
            versions.setdefault(lookup.changelog, {}).setdefault(int(key), []).append((at, (-1, seq), record))
    orders = []
    for key, payload, at in data["orders"]:
        routed = rules.route_message("orders", key, payload)
        orders.append({**routed, "event_ms": routed["created_at"]})
    return sorted(view(row, row["sink"]) for row in event_rules.temporal_join(versions, orders, MAX_WAIT_MS))


def as_ms(value):
    return None if value is None else (value if isinstance(value, int) else int(value.timestamp() * 1000))


def view(row: dict, sink: str) -> tuple:
    """What must not differ between runs (batch ids and processing times may)."""
    enriched = sink == "enriched"
    return (row["invoice_id"], sink, row.get("reason") if not enriched else None,
            row["user_first_name"] if enriched else None, row["item_price"] if enriched else None,
            as_ms(row["user_as_of"]), as_ms(row["item_as_of"]), row["waited_ms"])


def written(data_dir) -> list[tuple]:
    return sorted(view(row, sink) for sink in ("enriched", "missing_state") for row in rows(data_dir, sink))


@pytest.fixture(scope="module")
def published(broker, tmp_path_factory):
    tag = tmp_path_factory.mktemp("event").name
    topics = {k: f"persistent://public/default/{k}-{tag}" for k in ("users", "items", "orders")}
    return {"topics": topics, "data": the_input(), "done": False}


def publish_all(published, url) -> None:
    """The input, once per module: the orders first, then the users, then the items."""
    if not published["done"]:
        for kind in ("orders", "users", "items"):
            publish_timed(url, published["topics"][kind], published["data"][kind])
        published["done"] = True


def settings_for(published, factory_dir, broker, **overrides):
    from pipeline.config import load_settings

    values = {"pulsar.service_url": broker.service_url, "paths.data_dir": str(factory_dir),
              "spark.master": "local[2]", "job.trigger_interval": "200ms", "job.restart.delay": "1s",
              **{f"topics.{k}": v for k, v in published["topics"].items()},
              **{k.replace("__", "."): v for k, v in {**EVENT, **overrides}.items()}}
    return load_settings(env={}, cli=values)


def test_a_job_reading_while_the_users_arrive_after_the_orders(published, broker, tmp_path):
    settings = settings_for(published, tmp_path / "live", broker, job__max_rows_per_batch=25)
    job = JobThread(settings)
    try:
        wait_for(lambda: read_rows(settings.data_dir, "progress") or job.error, timeout=240, what="the first batch")
        publish_all(published, broker.service_url)  # read as it arrives: every order before any user
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS or job.error, timeout=180, what="every order decided")
    finally:
        job.close()
    assert written(settings.data_dir) == expected(published["data"])


def test_one_big_batch_writes_the_same(published, broker, tmp_path, spark):
    publish_all(published, broker.service_url)
    settings = settings_for(published, tmp_path / "big", broker, job__max_rows_per_batch=100_000)
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS or job.error, timeout=240, what="every order decided")
    finally:
        job.close()
    assert written(settings.data_dir) == expected(published["data"])
    # `python -m pipeline state` on an event-time checkpoint: every version held, with its time.
    from pipeline.control.state import inspect_key

    checkpoint = store.checkpoint_dir(settings.data_dir)
    renamed = inspect_key(spark, checkpoint, USERS, 2)
    assert [v["version_ms"] for v in renamed.versions] == [T0 + 2_000, T0 + 21_000]
    assert renamed.latest["user_first_name"] == "Renamed2" and "version as of" in renamed.describe()
    deleted = inspect_key(spark, checkpoint, USERS, 5)
    assert deleted.versions[-1]["tombstone"] and deleted.latest is None
    # The state census counts keys, not Spark's state rows: a key with two versions has a head
    # row and a versions-list row. Users 1-4, 6, 8, 9, 99 hold a record (5 deleted, 7 never
    # existed); items 1, 2, 4, 99 (3 deleted, 5 never existed); nothing waits.
    from pipeline.control.state import StateCensus
    from pipeline.metrics import MetricsStore

    census = {row["lookup"]: row for row in StateCensus(spark, checkpoint, MetricsStore(settings.data_dir),
                                                         MAX_WAIT_MS).take()}
    assert {name: (row["keys_held"], row["waiting_keys"], row["waiting_orders"]) for name, row in census.items()} \
        == {"users": (8, 0, 0), "items": (4, 0, 0)}
    assert census["users"]["state_rows"] > 8  # the rows Spark counts: the overcount the heads avoid


def test_a_replay_adds_no_version_twice(published, broker, tmp_path, spark):
    """A replay of the users topic re-reads every version the job holds: none is added again
    (a key's history keeps each version once), none counts as late, and the sinks do not change."""
    from pipeline import control
    from pipeline.control.state import inspect_key

    publish_all(published, broker.service_url)
    settings = settings_for(published, tmp_path / "replayed", broker, job__max_rows_per_batch=100_000)
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS or job.error, timeout=240, what="every order decided")
        control.request_replay(settings, "users", requested_by="test")
        wait_for(lambda: read_events(settings.data_dir, ("replay_finished",)) or job.error, timeout=120,
                 what="the replay to finish")
    finally:
        job.close()
    assert written(settings.data_dir) == expected(published["data"])
    renamed = inspect_key(spark, store.checkpoint_dir(settings.data_dir), USERS, 2)
    assert [v["version_ms"] for v in renamed.versions] == [T0 + 2_000, T0 + 21_000]
    assert sum(t.get("late_versions") or 0 for row in read_rows(settings.data_dir, "watermarks") for t in row["topics"]) == 0


def test_a_kill_9_midway_writes_the_same(published, broker, tmp_path):
    publish_all(published, broker.service_url)
    settings = settings_for(published, tmp_path / "killed", broker, job__max_rows_per_batch=20,
                            job__trigger_interval="1s")  # batches apart: the kill lands midway
    job = JobProcess(settings, tmp_path / "job1.log")
    try:
        # A committed batch whose changelog times the event clock has recorded (written just after
        # the commit; a kill between the two only delays a quiet changelog's watermark).
        wait_for(lambda: restored_newest(store.checkpoint_dir(settings.data_dir)).keys() >= {"users", "items"},
                 timeout=240, what="a committed batch and its event times")
    finally:
        job.kill9()
    assert orders_done(settings.data_dir) < ORDERS, "the kill came too late to test anything"
    killed_scratch = scratch_root(settings.data_dir) / own_name(pid=job.proc.pid)
    assert killed_scratch.is_dir() and any(killed_scratch.iterdir()), "the killed job left no scratch to sweep"
    job = JobProcess(settings, tmp_path / "job2.log")
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS, timeout=240, what="every order after the kill")
        # What the killed job's Spark and JVM left (its state's working copy, native libraries)
        # went when the next one started; the running job's own scratch is in use.
        assert not killed_scratch.exists()
        assert (scratch_root(settings.data_dir) / own_name(pid=job.proc.pid)).is_dir()
    finally:
        assert job.stop() == 0
    assert written(settings.data_dir) == expected(published["data"])
    assert not (scratch_root(settings.data_dir) / own_name(pid=job.proc.pid)).exists(), "a clean stop keeps none"


def test_an_idle_changelog_stops_holding_the_watermark_back(broker, tmp_path):
    """Users stop at T0+5s while orders go on to T0+40s: without idleness no order could ever be
    decided. Once the users topic has been quiet for the idle timeout, the items read next
    carry the watermark past the orders. Then an order far older than the watermark is late."""
    topics = {k: f"persistent://public/default/{k}-idle-{tmp_path.name}" for k in ("users", "items", "orders")}
    settings = settings_for({"topics": topics}, tmp_path / "idle", broker, enrichment__idle_timeout="3s")
    url = broker.service_url
    publish_timed(url, topics["users"], [(str(u), wire.encode(user(u)), T0 + u * 1_000) for u in (1, 2)])
    publish_timed(url, topics["items"], [("1", wire.encode(item(1)), T0 + 500)])
    publish_timed(url, topics["orders"], [(f"o{n}", wire.encode(order(n, 1 + n % 2, 1, createdAt=T0 + 10_000 + n * 1_000)),
                                           T0 + 10_000 + n * 1_000) for n in range(30)])
    job = JobThread(settings)
    try:
        wait_for(lambda: read_events(settings.data_dir, ("topic_idle",)) or job.error, timeout=240,
                 what="the quiet changelogs to be marked idle")
        assert orders_done(settings.data_dir) == 0  # nothing could be decided before
        publish_timed(url, topics["items"], [("1", wire.encode(item(1, price=7.5)), T0 + 90_000)])
        wait_for(lambda: orders_done(settings.data_dir) >= 30 or job.error, timeout=120, what="every order decided")
        # Two hours older than the watermark (allowed lateness 1 h): late, recorded, not dropped.
        publish_timed(url, topics["orders"], [("o99", wire.encode(order(99, 1, 1, createdAt=T0 - 7_200_000)), T0)])
        wait_for(lambda: orders_done(settings.data_dir) >= 31 or job.error, timeout=120, what="the late order")
    finally:
        job.close()
    late = rows(settings.data_dir, "missing_state")
    assert [(r["invoice_id"], r["reason"], r["user_as_of"]) for r in late] == [(99, "late", None)]
    decided = rows(settings.data_dir, "enriched")
    assert len(decided) == 30 and {r["item_price"] for r in decided} == {11.0}  # the item as of each order's time
    assert {r["user_first_name"] for r in decided} == {"First1", "First2"}
    idle = {e["details"]["topic"] for e in read_events(settings.data_dir, ("topic_idle",))}
    assert "users" in idle
    marks = read_rows(settings.data_dir, "watermarks")[-1]
    by_topic = {t["topic"]: t for t in marks["topics"]}
    assert by_topic["users"]["idle"] and by_topic["users"]["watermark_ms"] == T0 + 2_000 - 2_000
    assert by_topic["items"]["newest_ms"] == T0 + 90_000 and marks["watermark_ms"] >= T0 + 39_000


def test_a_stream_that_stops_still_decides_what_is_due(broker, tmp_path):
    """Items, then orders, then user versions, then nothing more: no batch would run without
    input, so the clock row of the idle items must move the watermark (the users' newest time less the
    out-of-orderness is past every order) and every order is decided, with no new message."""
    topics = {k: f"persistent://public/default/{k}-quiet-{tmp_path.name}" for k in ("users", "items", "orders")}
    settings = settings_for({"topics": topics}, tmp_path / "quiet", broker, enrichment__idle_timeout="3s")
    url = broker.service_url
    publish_timed(url, topics["items"], [("1", wire.encode(item(1)), T0 + 500)])
    publish_timed(url, topics["orders"], [(f"o{n}", wire.encode(order(n, 1 + n % 2, 1, createdAt=T0 + 1_000 + n * 100)),
                                           T0 + 1_000 + n * 100) for n in range(100)])
    publish_timed(url, topics["users"], [(str(u), wire.encode(user(u)), T0 + u * 100) for u in (1, 2)]
                  + [("1", wire.encode(user(1, firstName="Later1")), T0 + 6_000), ("3", wire.encode(user(3)), T0 + 20_000)])
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= 100 or job.error, timeout=240,
                 what="every order decided after the stream stopped")
    finally:
        job.close()
    assert job.error is None
    idle = {e["details"]["topic"] for e in read_events(settings.data_dir, ("topic_idle",))}
    assert "items" in idle  # the event says it no longer holds the watermark back, and it is true
    decided = {r["invoice_id"]: r["user_first_name"] for r in rows(settings.data_dir, "enriched")}
    assert len(decided) == 100 and orders_done(settings.data_dir) == 100
    # user 1's version as of each order's time: renamed at T0+6s
    assert all(decided[n] == ("Later1" if T0 + 1_000 + n * 100 >= T0 + 6_000 else "First1")
               for n in range(0, 100, 2))
    assert {decided[n] for n in range(1, 100, 2)} == {"First2"}


def test_a_hot_key_keeps_only_what_the_watermark_still_needs(broker, tmp_path, spark):
    """A user updated 60 times, then never again, while the other changelog moves on: its older
    versions are pruned by the operator's timer (watermark - allowed lateness - max wait), without
    the key being touched again; the current version stays. An order older than the versions
    the key's head holds (KeyHistory.RECENT) finds its version in the key's list."""
    from pipeline.control.state import inspect_key

    topics = {k: f"persistent://public/default/{k}-hot-{tmp_path.name}" for k in ("users", "items", "orders")}
    settings = settings_for({"topics": topics}, tmp_path / "hot", broker, enrichment__allowed_lateness="1s",
                            enrichment__max_wait="0s", enrichment__idle_timeout="2s")
    url = broker.service_url
    publish_timed(url, topics["users"], [("7", wire.encode(user(7, firstName=f"V{n}")), T0 + n * 100) for n in range(60)])
    publish_timed(url, topics["items"], [("1", wire.encode(item(1)), T0 + n * 1_000) for n in range(30)])
    publish_timed(url, topics["orders"], [(f"o{n}", wire.encode(order(n, 7, 1, createdAt=at)), at)
                                          for n, at in ((1, T0 + 5_950), (2, T0 + 5_550))])
    job = JobThread(settings)
    try:
        # the users go idle; the items' newest (T0+29 s) then carries the watermark to T0+27 s
        wait_for(lambda: orders_done(settings.data_dir) >= 2 or job.error, timeout=240, what="the orders decided")
        # a batch run with the watermark past the hot key's pruning timer has committed its state
        wait_for(lambda: ((read_rows(settings.data_dir, "watermarks") or [{}])[-1].get("watermark_ms") or 0) >= T0 + 20_000
                 or job.error, timeout=120, what="the watermark past every version")
    finally:
        job.close()
    decided = {row["invoice_id"]: row["user_first_name"] for row in rows(settings.data_dir, "enriched")}
    # the versions as of T0+5.95 s (in the head) and T0+5.55 s (4 versions older: in the list),
    # read before any pruning
    assert decided == {1: "V59", 2: "V55"}
    held = inspect_key(spark, store.checkpoint_dir(settings.data_dir), USERS, 7)
    assert [v["version_ms"] for v in held.versions] == [T0 + 5_900]



def test_the_orders_a_key_keeps_waiting_are_shown_in_the_order_they_came(broker, tmp_path, spark):
    """Six orders wait for user 1 (the watermark is behind them): the head holds the first
    VersionHead.QUEUED, the waiting list the rest; `python -m pipeline state` and the census
    show all six, in the order they came."""
    from pipeline.control.state import StateCensus, inspect_key
    from pipeline.metrics import MetricsStore

    topics = {k: f"persistent://public/default/{k}-queued-{tmp_path.name}" for k in ("users", "items", "orders")}
    settings = settings_for({"topics": topics}, tmp_path / "queued", broker)
    url = broker.service_url
    publish_timed(url, topics["users"], [("1", wire.encode(user(1)), T0)])
    publish_timed(url, topics["items"], [("1", wire.encode(item(1)), T0)])
    publish_timed(url, topics["orders"], [(f"o{n}", wire.encode(order(n, 1, 1, createdAt=T0 + 10_000 + n * 100)),
                                           T0 + 10_000 + n * 100) for n in range(6)])
    job = JobThread(settings)
    try:
        wait_for(lambda: sum(t["rows"] or 0 for p in read_rows(settings.data_dir, "progress") for t in p["topics"]
                             if t["topic"] == "orders") >= 6 or job.error, timeout=240, what="the orders read")
    finally:
        job.close()
    assert job.error is None and orders_done(settings.data_dir) == 0
    checkpoint = store.checkpoint_dir(settings.data_dir)
    held = inspect_key(spark, checkpoint, USERS, 1)
    assert [order_row["invoice_id"] for order_row in held.waiting] == list(range(6))
    census = {row["lookup"]: row for row in StateCensus(spark, checkpoint, MetricsStore(settings.data_dir),
                                                         MAX_WAIT_MS).take()}
    assert (census["users"]["waiting_keys"], census["users"]["waiting_orders"]) == (1, 6)
