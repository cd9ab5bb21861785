"""The apache tier: the source, topic set-up and the job against a real Apache Pulsar standalone
(3.0 LTS from Maven Central, ``apache_pulsar`` in conftest.py), where every other tier runs on
pulsar-lite. Where the two brokers behave differently, each test says which behaviour we rely on.

- The newest entry's id (``get_last_message_id``): Apache Pulsar gives the batch index of the
  entry's last message, so a cold partition is priced at what its newest entry holds; pulsar-lite
  gives -1 and the planner guesses a full default batch (1,000 messages).
- Partitions and retention: Apache Pulsar has the admin REST API (``pulsar.admin_url``);
  pulsar-lite has none, and ``topics`` skips that step.
"""

from __future__ import annotations

import json
import urllib.request

import pulsar
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.feed.apache_broker import ApacheBroker
from pipeline.metrics import read_rows
from pipeline.source import probes
from pipeline.source.rows import POSITION_SHIFT
from pipeline.feed.topics import ensure_topics
from factories import item, keyed, order, publish, user
from jobproc import JobThread
from sinkread import count, invoices as sink_invoices, orders_done
from test_backlog import (DELETED, ITEMS, ORDERS, USERS, admitted_orders_before_changelogs_done,
                          assert_decided_with_what_was_published_before, publish_backlog)
from waiting import wait_for
from test_source_planning import invoices, make_reader, no_reads_on_the_driver, publish_mixed, read_batch  # noqa: F401

pytestmark = pytest.mark.apache


def publish_entries(url: str, topic: str, unbatched: int, batched: int, start: int = 0) -> list[int]:
    """``unbatched`` orders one entry each, then ``batched`` orders in exactly one entry."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        single = client.create_producer(topic, batching_enabled=False)
        for n in range(start, start + unbatched):
            single.send(keyed("orders", [order(n, 1, 1)])[0][1], partition_key=str(n))
        if batched:
            # one batch: room for all of them, and a delay far longer than the sends take
            batch = client.create_producer(topic, batching_enabled=True, batching_max_messages=max(batched, 2),
                                           batching_max_publish_delay_ms=5000)
            for n in range(start + unbatched, start + unbatched + batched):
                batch.send_async(keyed("orders", [order(n, 1, 1)])[0][1], None, partition_key=str(n))
            batch.flush()
    finally:
        client.close()
    return list(range(start, start + unbatched + batched))


def read_in_batches(reader, limit_rows: int):
    """Plan and read the whole topic in batches of ``limit_rows`` messages: (offsets, tables)."""
    offsets, tables = [reader.initialOffset()], []
    while True:
        end = reader.latestOffset(offsets[-1], ReadMaxRows(limit_rows))
        if end == offsets[-1]:
            return offsets, tables
        tables.append(read_batch(reader, offsets[-1], end))
        offsets.append(end)


def partitioned(admin_url: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions through the admin API."""
    request = urllib.request.Request(f"{admin_url}/admin/v2/persistent/{topic.removeprefix('persistent://')}/partitions",
                                     data=str(partitions).encode(), method="PUT", headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()


def admin_get(url: str, path: str):
    with urllib.request.urlopen(url + "/admin/v2/" + path, timeout=10) as response:
        return json.loads(response.read() or b"null")


def test_the_broker_listens_on_loopback_only(apache_pulsar):
    """Broker, web service and bookie: every socket the JVM listens on is on 127.0.0.1."""
    import subprocess

    listening = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout.splitlines()
    mine = [line.split()[3] for line in listening if f"pid={apache_pulsar.process.pid}," in line]
    assert len(mine) >= 3 and all(address.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]") for address in mine), mine
    assert {f"127.0.0.1:{apache_pulsar.broker_port}", f"127.0.0.1:{apache_pulsar.web_port}"} <= {
        address.replace("[::ffff:127.0.0.1]", "127.0.0.1") for address in mine}


def test_the_broker_dies_with_the_process_that_started_it(tmp_path):
    """kill -9 of the starting process: the JVM gets SIGTERM (PR_SET_PDEATHSIG) and exits."""
    import os
    import signal
    import subprocess
    import sys

    script = ("import signal, sys; from pathlib import Path; from pipeline.feed.apache_broker import ApacheBroker; "
              "b = ApacheBroker(Path(sys.argv[1])).start(); print(b.process.pid, flush=True); signal.pause()")
    starter = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        java = int(starter.stdout.readline())
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()

    def gone() -> bool:
        try:
            with open(f"/proc/{java}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"  # exited, not yet reaped
        except OSError:
            return True

    wait_for(gone, timeout=60, what="the JVM to exit after its parent")
    assert not os.path.exists(f"/proc/{java}") or gone()


def test_the_newest_entry_says_how_many_messages_it_holds_and_prices_a_cold_partition(
        apache_pulsar, unique_topics, no_reads_on_the_driver):
    """Apache Pulsar's ``get_last_message_id`` names the last message of the newest entry (batch
    index 3 of a 4-message entry; pulsar-lite gives -1). A newest entry can be a flush's short
    tail, so the planner believes it only when it says more than a full default batch: a cold
    partition is priced at 1,000 messages an entry, and a cap of 8 admits 1 entry alone."""
    url, topic = apache_pulsar.service_url, unique_topics()["orders"]
    publish_entries(url, topic, unbatched=20, batched=4)
    last, size = probes.newest_entry(url, topic, "-1")
    assert size == 4 and last.endswith(":-1:-1")  # the batch index is dropped from the planned id
    reader = make_reader(url, {"orders": topic}, maxRowsPerBatch=8)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end["orders"]["parts"]["-1"]["n"] == 1
    assert end["orders"]["admitted"] == {"entries": 1, "messages": 1000, "bytes": end["orders"]["admitted"]["bytes"]}
    no_reads_on_the_driver.undo()
    assert invoices(read_batch(reader, start, end)) == [0]


def test_a_short_newest_entry_does_not_price_the_full_entries_before_it(apache_pulsar, unique_topics):
    """What a batching producer leaves: full entries, then a short one (what was left at its
    flush). Apache Pulsar's newest entry id says 1 message; priced at that, a cap of 100 messages
    admitted 301. A cold partition is priced at no less than a full default batch (1,000 an
    entry), as on pulsar-lite, which gives no batch index. The cap in messages is what we rely on (README "How the job keeps its promises", job.max_rows_per_batch)."""
    url, topic = apache_pulsar.service_url, unique_topics()["orders"]
    publish_entries(url, topic, unbatched=0, batched=100)
    publish_entries(url, topic, unbatched=0, batched=100, start=100)
    publish_entries(url, topic, unbatched=0, batched=100, start=200)
    publish_entries(url, topic, unbatched=0, batched=1, start=300)
    assert probes.newest_entry(url, topic, "-1")[1] == 1
    reader = make_reader(url, {"orders": topic}, maxRowsPerBatch=100)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert 1 <= read_batch(reader, start, end).num_rows <= 100  # 301 when the short tail priced the rest


@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_batches_cover_the_topic_once_count_entries_and_messages_and_reread_exactly(apache_pulsar, unique_topics, batching):
    """Entries and messages: each offset counts entries (n), each read row is one message, and
    a logged (start, end] re-read after a crash gives the same rows, with batching on and off."""
    url, topic = apache_pulsar.service_url, unique_topics()["orders"]
    if batching:
        expected = publish_mixed(url, topic)  # 250 batched orders in one entry or a few, then 3 unbatched
    else:
        expected = publish_entries(url, topic, unbatched=60, batched=0)
    reader = make_reader(url, {"orders": topic}, maxRowsPerBatch=1, splitRows=1)
    offsets, tables = read_in_batches(reader, 1)
    assert [n for table in tables for n in invoices(table)] == expected  # every message once, in order
    entries = offsets[-1]["orders"]["parts"]["-1"]["n"]
    assert len(tables) == entries  # a cap of one message still moves one whole entry a batch
    if batching:
        assert 4 <= entries < len(expected) and max(t.num_rows for t in tables) > 1
    else:
        assert entries == len(expected) and all(t.num_rows == 1 for t in tables)
    assert {p >> POSITION_SHIFT for p in tables[-1].column("position").to_pylist()} == {entries}
    middle = len(tables) // 2
    again = read_batch(make_reader(url, {"orders": topic}, splitRows=3), offsets[middle], offsets[middle + 1])
    assert again.equals(tables[middle])
    assert reader.latestOffset(offsets[-1], ReadAllAvailable()) == offsets[-1]  # caught up: nothing more


def test_topics_through_the_admin_api_four_partitions_read_once_in_order(apache_settings_factory):
    """``topics`` on Apache Pulsar: partitioned topics and infinite retention on the changelogs,
    through the admin REST API (pulsar-lite has none: there the step is skipped). The source
    lists the four partitions and reads every message once, each partition in publish order."""
    settings = apache_settings_factory()
    ensure_topics(settings, settings.service_url, partitions=4)
    admin = settings.admin_url
    for name, topic in settings.topics.items():
        path = "persistent/" + topic.removeprefix("persistent://")
        assert admin_get(admin, path + "/partitions")["partitions"] == 4
        if name in ("users", "items"):  # a topic policy: the broker applies it through its system topic, a moment later
            wait_for(lambda: admin_get(admin, path + "/retention?applied=false") == {
                "retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, timeout=30, what=f"the retention of {name}")
        else:
            assert not admin_get(admin, path + "/retention?applied=false")  # the namespace's (README "Retention")
    orders = [order(n, user_id=n % 13, item_id=1) for n in range(400)]
    publish(settings.service_url, settings.topics["orders"], keyed("orders", orders))
    reader = make_reader(settings.service_url, {"orders": settings.topics["orders"]}, maxRowsPerBatch=100)
    offsets, tables = read_in_batches(reader, 100)
    assert sorted(offsets[-1]["orders"]["parts"]) == ["0", "1", "2", "3"]
    rows = [row for table in tables for row in table.select(["partition", "key", "value"]).to_pylist()]
    assert sorted(json.loads(r["value"])["invoiceId"] for r in rows) == list(range(400))  # each once
    assert {r["partition"] for r in rows} == {0, 1, 2, 3}  # 400 keys (invoice ids) hashed over four partitions
    by_partition: dict[int, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(json.loads(r["value"])["invoiceId"])
    assert all(ids == sorted(ids) for ids in by_partition.values())  # each partition in publish order
    assert len({r["partition"] for r in rows if r["key"] == "7"}) == 1  # a key stays on one partition


@pytest.mark.e2e
@pytest.mark.parametrize("batching", [False, True], ids=["unbatched-backlog", "batched-backlog"])
def test_a_backlog_drains_changelogs_first(apache_settings_factory, apache_pulsar, batching):
    """tests/test_backlog.py's promise on Apache Pulsar, with the job setting the topics up
    through the admin API: every order is decided with the users and tombstones published before
    it, no batch admits an order while a changelog has a backlog, each message is read once, and
    batches stay near the cap in messages (on Apache Pulsar a batched partition's first batch is
    priced at its newest entry, not at a full default batch)."""
    settings = apache_settings_factory(enrichment__max_wait="0s", job__max_rows_per_batch=500)
    orders = publish_backlog(apache_pulsar.service_url, settings.topics, batching)
    job = JobThread(settings)
    try:
        wait_for(lambda: job.error or orders_done(settings.data_dir) >= ORDERS, timeout=300, what="every order decided")
    finally:
        job.close()
    assert job.error is None
    assert_decided_with_what_was_published_before(settings.data_dir, orders)
    assert admitted_orders_before_changelogs_done(settings.data_dir) == 0
    read = [sum(t["rows"] or 0 for t in p["topics"]) for p in read_rows(settings.data_dir, "progress")]
    assert sum(read) == ORDERS + ITEMS + 2 * USERS + len(DELETED)  # every message read once
    assert len([n for n in read if n]) <= 2 * (sum(read) // 500 + 1) + 2
    # The cap counts messages: exact unbatched; batched, estimated from the entries the last range
    # held. Here a producer with a 2 ms batching delay makes entries of 1 to 1,000 messages and a
    # cap of 500 is a range of a few entries, so a batch has held 4.5 x the cap on Apache Pulsar;
    # at the job's defaults a range holds hundreds of entries (README "Batches").
    assert max(read) <= (500 if not batching else 5000)


@pytest.mark.e2e
def test_a_broker_restart_mid_stream_loses_and_repeats_no_order(tmp_path, unique_topics):
    """Apache Pulsar stopped and started again on the same ports and data while the job runs:
    the job's reads fail meanwhile and it restarts from its checkpoint (``job.restart``), then
    decides the orders published before and after the restart, each exactly once."""
    broker = ApacheBroker(tmp_path / "restarting").start()
    try:
        url, topics = broker.service_url, unique_topics()
        from pipeline.config import load_settings

        settings = load_settings(env={}, cli={
            "pulsar.service_url": url, "pulsar.admin_url": broker.admin_url, "paths.data_dir": str(tmp_path / "data"),
            "spark.master": "local[2]", "job.trigger_interval": "500ms", "job.restart.delay": "2s",
            "job.restart.attempts": 30, "enrichment.max_wait": "0s", **{f"topics.{k}": v for k, v in topics.items()}})
        publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 6)]))
        publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 51)]))
        first = [order(n, user_id=n % 50 + 1, item_id=n % 5 + 1) for n in range(500)]
        publish(url, topics["orders"], keyed("orders", first))
        job = JobThread(settings)
        try:
            wait_for(lambda: job.error or orders_done(settings.data_dir) >= len(first), timeout=240,
                     what="the orders before the restart")
            broker.stop()
            broker.start()
            second = [order(n, user_id=n % 50 + 1, item_id=n % 5 + 1) for n in range(500, 1000)]
            publish(url, topics["orders"], keyed("orders", second))
            wait_for(lambda: job.error or orders_done(settings.data_dir) >= 1000, timeout=240,
                     what="the orders after the restart")
        finally:
            job.close()
        assert job.error is None
        decided = sink_invoices(settings.data_dir, "enriched") + sink_invoices(settings.data_dir, "missing_state")
        assert sorted(decided) == list(range(1000))  # none lost, none twice
        assert count(settings.data_dir, "enriched") == 1000
    finally:
        broker.stop()


@pytest.mark.e2e
def test_token_authentication_end_to_end(tmp_path, unique_topics):
    """Apache Pulsar with token authentication (a secret key, HS256 tokens as ``pulsar tokens
    create`` makes them): without the token the broker and its admin API refuse; with
    ``pulsar.auth_token`` set, ``topics`` (admin API), the producers and the job (its source's
    readers and probes) all work. pulsar-lite has no authentication: there only the client side
    is checked (tests/test_topics.py)."""
    import os
    import urllib.error

    from pipeline.config import load_settings
    from pipeline.feed.producers import publish_records
    from pipeline.feed.topics import make_client

    broker = ApacheBroker(tmp_path / "secured", secret_key=os.urandom(32)).start()
    try:
        url, topics, token = broker.service_url, unique_topics(), broker.token()
        with pytest.raises(urllib.error.HTTPError, match="401"):
            admin_get(broker.admin_url, "namespaces/public")
        anonymous = pulsar.Client(url, operation_timeout_seconds=5, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            with pytest.raises(Exception):
                anonymous.create_producer(topics["orders"])
        finally:
            anonymous.close()
        settings = load_settings(env={"SS_PULSAR_AUTH_TOKEN": token}, cli={
            "pulsar.service_url": url, "pulsar.admin_url": broker.admin_url, "paths.data_dir": str(tmp_path / "data"),
            "spark.master": "local[2]", "job.trigger_interval": "500ms", "enrichment.max_wait": "0s",
            **{f"topics.{k}": v for k, v in topics.items()}})
        ensure_topics(settings, url)
        client = make_client(url, token=settings["pulsar.auth_token"])
        try:
            publish_records(client, topics["items"], "items", [item(i) for i in range(1, 4)], checked=True)
            publish_records(client, topics["users"], "users", [user(u) for u in range(1, 11)], checked=True)
            publish_records(client, topics["orders"], "orders",
                            [order(n, user_id=n % 10 + 1, item_id=n % 3 + 1) for n in range(200)], checked=True)
        finally:
            client.close()
        job = JobThread(settings)
        try:
            wait_for(lambda: job.error or orders_done(settings.data_dir) >= 200, timeout=240, what="every order decided")
        finally:
            job.close()
        assert job.error is None
        assert count(settings.data_dir, "enriched") == 200
    finally:
        broker.stop()


def test_the_restore_warning_reads_the_orders_retention_from_the_admin_api(apache_settings_factory):
    """The restore's retention check (pipeline/control/savepoints.py) against the real admin API: with no
    policy of its own the orders topic's applied retention is the broker's default, and a topic
    policy set through the admin API (as ``pulsar-admin topicpolicies set-retention`` does) is
    read back once the broker has applied it. pulsar-lite has no admin API: the check is skipped."""
    from datetime import datetime, timezone
    from pathlib import Path

    from pipeline.control.savepoints import SavepointInfo, load_orders_retention, retention_warning

    settings = apache_settings_factory()
    ensure_topics(settings, settings.service_url)
    taken_ms = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    info = SavepointInfo("sp1", 3, "2026-01-01T00:00:00Z", 0, Path("unused"))
    default = load_orders_retention(settings)
    assert default is not None and default["retentionTimeInMinutes"] == 0  # Apache Pulsar's default: none once read
    assert "keeps messages for no time at all once read" in retention_warning(settings, info, taken_ms + 60_000)

    orders = "persistent/" + settings.topics["orders"].removeprefix("persistent://")
    request = urllib.request.Request(f"{settings.admin_url}/admin/v2/{orders}/retention", method="POST",
                                     data=json.dumps({"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass
    wait_for(lambda: (load_orders_retention(settings) or {}).get("retentionTimeInMinutes") == 60, timeout=30,
             what="the topic policy applied")
    assert retention_warning(settings, info, taken_ms + (3 * 60 + 5) * 60_000) == (
        f"savepoint 'sp1' is 3h 5m old but {settings.topics['orders']!r} keeps messages for 1h: orders published "
        "after the savepoint may be gone and will not be enriched; give the orders topic a retention longer than "
        "your oldest savepoint")
    assert retention_warning(settings, info, taken_ms + 30 * 60_000) is None


@pytest.mark.e2e
def test_a_partition_added_while_the_job_runs_is_read_from_its_start(apache_settings_factory):
    """Orders on two partitions, then two more partitions added through the admin API while the
    job runs (Apache Pulsar only: pulsar-lite has no admin API): the source lists partitions again
    at most every 10 s and reads the new ones from their first message; every order once."""
    settings = apache_settings_factory(enrichment__max_wait="0s")
    url, topics = settings.service_url, settings.topics
    ensure_topics(settings, url, partitions=2)
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 6)]))
    publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 21)]))
    publish(url, topics["orders"], keyed("orders", [order(n, n % 20 + 1, n % 5 + 1) for n in range(200)]))
    job = JobThread(settings)
    try:
        wait_for(lambda: job.error or orders_done(settings.data_dir) >= 200, timeout=240, what="the first orders")
        orders = "persistent/" + topics["orders"].removeprefix("persistent://")
        request = urllib.request.Request(f"{settings.admin_url}/admin/v2/{orders}/partitions", method="POST",
                                         data=b"4", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        publish(url, topics["orders"], keyed("orders", [order(n, n % 20 + 1, n % 5 + 1) for n in range(200, 600)]))
        assert all(probes.newest_entry(url, topics["orders"], p)[0] for p in ("2", "3"))  # the new ones got orders
        wait_for(lambda: job.error or orders_done(settings.data_dir) >= 600, timeout=180, what="the orders on four partitions")
    finally:
        job.close()
    assert job.error is None
    decided = sink_invoices(settings.data_dir, "enriched") + sink_invoices(settings.data_dir, "missing_state")
    assert sorted(decided) == list(range(600)) and count(settings.data_dir, "enriched") == 600


@pytest.mark.e2e
def test_kill_9_of_the_job_loses_and_repeats_no_order_and_leaves_no_subscription(apache_settings_factory, tmp_path):
    """The job as a real process, killed with SIGKILL mid-stream and started again: every order
    decided once. On Apache Pulsar a subscription outlives its consumer and holds the topic's
    messages (pulsar-lite keeps everything anyway): the job's readers are non-durable and its
    newest-entry probes unsubscribe at once, so at most the probe a kill cut short (one per
    topic) may be left behind."""
    from jobproc import JobProcess

    # Batches of 500 entries: the kill lands after the first, and the rest is three more.
    settings = apache_settings_factory(enrichment__max_wait="0s", job__max_rows_per_batch=500)
    url, topics = settings.service_url, settings.topics
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 6)]))
    publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 51)]))
    publish(url, topics["orders"], keyed("orders", [order(n, n % 50 + 1, n % 5 + 1) for n in range(1500)]),
            batching=False)
    job = JobProcess(settings, tmp_path / "job1.log")
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= 200, timeout=240, what="some orders decided")
    finally:
        job.kill9()
    publish(url, topics["orders"], keyed("orders", [order(n, n % 50 + 1, n % 5 + 1) for n in range(1500, 2000)]))
    job = JobProcess(settings, tmp_path / "job2.log")
    try:
        wait_for(lambda: orders_done(settings.data_dir) >= 2000, timeout=240, what="every order decided")
    finally:
        job.stop()
    decided = sink_invoices(settings.data_dir, "enriched") + sink_invoices(settings.data_dir, "missing_state")
    assert sorted(decided) == list(range(2000)) and count(settings.data_dir, "enriched") == 2000
    for topic in topics.values():
        subscriptions = admin_get(settings.admin_url, "persistent/" + topic.removeprefix("persistent://") + "/subscriptions")
        assert len(subscriptions) <= 1 and all(name.startswith("ss-probe-") for name in subscriptions), subscriptions


@pytest.mark.e2e
def test_event_time_writes_what_the_temporal_join_gives(apache_settings_factory, apache_pulsar):
    """The event-time determinism input (tests/test_event_time_job.py) on Apache Pulsar, read as it
    arrives in batches of 25 messages: the orders first, then the users, then the items. The sinks
    are the batch-free temporal join's, row for row. Apache Pulsar keeps a message's event time in
    its metadata as pulsar-lite does; we rely on ``event_timestamp`` coming back unchanged, and on
    nothing else of the broker for event time (the clock travels in our own offsets)."""
    from factories import publish_timed
    from test_event_time_job import EVENT, ORDERS, expected, the_input, written

    settings = apache_settings_factory(job__max_rows_per_batch=25, job__trigger_interval="200ms", **EVENT)
    data = the_input()
    job = JobThread(settings)
    try:
        wait_for(lambda: read_rows(settings.data_dir, "progress") or job.error, timeout=240, what="the first batch")
        for kind in ("orders", "users", "items"):
            publish_timed(apache_pulsar.service_url, settings.topics[kind], data[kind])
        wait_for(lambda: orders_done(settings.data_dir) >= ORDERS or job.error, timeout=240, what="every order decided")
    finally:
        job.close()
    assert written(settings.data_dir) == expected(data)


@pytest.mark.e2e
def test_sql_pipelines_count_and_join_on_a_foreign_key_through_apache_pulsar(apache_settings_factory, apache_pulsar,
                                                                               spark):
    """The seed's count by account and the foreign-key join example, side by side on Apache
    Pulsar: the users on a topic of four partitions, published unbatched (pulsar-client's
    default), the accounts batched, then a move, a delete, an account's change and a bad message.
    Each upsert topic ends with exactly the changelog pulsar-lite's tests give; the bad message is
    one dead letter of each pipeline."""
    from pipeline.sql.plan import build_plan
    from sqlhelp import COUNT_SQL, SQL_DIR, Running, fresh_topics, latest_per_key, message, read_topic, sink_rows

    settings = apache_settings_factory(job__restart__delay="3s")
    url = apache_pulsar.service_url
    counted = fresh_topics("users", "user_count_by_account")
    joined = fresh_topics("users", "accounts", "users_with_their_account")
    joined["users"] = counted["users"]  # both read the same users topic, as the seed's two jobs do
    partitioned(apache_pulsar.admin_url, counted["users"], 4)

    def user(uid: str, account: str, name: str = "bob", id_=1) -> tuple[str, bytes]:
        return message(uid, {"uid": uid, "accountId": account, "id": id_, "fullName": name, "op": "c"})

    publish(url, counted["users"], [user("u1", "A"), user("u2", "A"), user("u3", "B")], batching=False)
    publish(url, joined["accounts"], [message("A", {"id": "A", "name": "Acme", "plan": "gold"}),
                                      message("B", {"id": "B", "name": "Beta"})])
    count_plan = build_plan(COUNT_SQL.read_text(), counted)
    join_plan = build_plan((SQL_DIR / "users_with_their_account.sql").read_text(), joined)
    with Running(settings, count_plan, "count", spark) as counting, Running(settings, join_plan, "fk", spark) as joining:
        wait_for(lambda: counting.result(settings, "count") == [{"accountId": "A", "userCount": 2},
                                                               {"accountId": "B", "userCount": 1}],
                 240, what="the first counts")
        wait_for(lambda: len(joining.result(settings, "fk")) == 3, 240, what="the first joined users")
        publish(url, counted["users"], [user("u1", "B", id_=1), message("u3", None),
                                        message("u9", {"uid": "u9", "accountId": "A", "id": "nine"})], batching=False)
        publish(url, joined["accounts"], [message("B", {"id": "B", "name": "Beta 2", "plan": "silver"})])
        wait_for(lambda: counting.result(settings, "count") == [{"accountId": "A", "userCount": 1},
                                                               {"accountId": "B", "userCount": 1}],
                 120, what="the move and the delete counted")
        wait_for(lambda: joining.result(settings, "fk") == [
            {"userUid": "u1", "fullName": "bob", "accountId": "B", "accountName": "Beta 2", "accountPlan": "silver"},
            {"userUid": "u2", "fullName": "bob", "accountId": "A", "accountName": "Acme", "accountPlan": "gold"}],
            120, what="the move, the delete and the account's change joined")
    counts = read_topic(url, counted["user_count_by_account"])
    assert latest_per_key(counts) == {"A": {"accountId": "A", "userCount": 1}, "B": {"accountId": "B", "userCount": 1}}
    assert ("A", '{"accountId":"A","userCount":2}') in counts  # before the move, as the seed's JSON
    users = read_topic(url, joined["users_with_their_account"])
    assert ("u3", "") in users  # the deleted user's tombstone
    assert latest_per_key(users) == {
        "u1": {"userUid": "u1", "fullName": "bob", "accountId": "B", "accountName": "Beta 2", "accountPlan": "silver"},
        "u2": {"userUid": "u2", "fullName": "bob", "accountId": "A", "accountName": "Acme", "accountPlan": "gold"}}
    for name in ("count", "fk"):
        dead = sink_rows(settings, name, "dead_letter")
        assert [(d["key"], d["error"]) for d in dead] == [("u9", "table 'users' column 'id': expected INT, got string \"nine\"")]


@pytest.mark.e2e
def test_a_sql_temporal_join_over_a_partitioned_table_holds_the_order_for_the_partition_behind(
        apache_settings_factory, apache_pulsar, spark):
    """tests/test_sql_temporal_partitions.py's case, the users topic of two partitions made through
    the admin API: the table's watermark is the least of its partitions', on Apache Pulsar too."""
    from sqlhelp import fresh_topics
    from test_sql_temporal_partitions import a_partition_behind_holds_the_order_back

    topics = fresh_topics("orders", "users", "out")
    partitioned(apache_pulsar.admin_url, topics["users"], 2)
    a_partition_behind_holds_the_order_back(apache_pulsar.service_url, topics,
                                            apache_settings_factory(job__restart__delay="3s"), spark)
