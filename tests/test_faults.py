"""Faults made visible (DESIGN.md §4, §7): broker restarts, savepoints, replay after a state wipe,
a fuzz of poison messages, and an unwritable sink path. Real broker, real Spark."""

from __future__ import annotations

import json
import random

import pytest

from pipeline import control, store, wire
from pipeline.feed.broker import EmbeddedBroker
from pipeline.errors import SinkError
from pipeline.job import run_forever
from pipeline.metrics import read_events, read_rows
from factories import item, keyed, order, publish, user
from jobproc import JobThread
from sinkread import count, invoices, orders_done, rows
from waiting import wait_for

pytestmark = pytest.mark.e2e  # every test here starts the job


def load_state(settings, users=range(1, 21), items=range(1, 6)):
    publish(settings.service_url, settings.topics["users"], keyed("users", [user(u) for u in users]))
    publish(settings.service_url, settings.topics["items"], keyed("items", [item(i) for i in items]))


def snapshot(data_dir) -> dict:
    """What a user sees in the sinks, without the columns that depend on timing."""
    return {
        "enriched": sorted((r["invoice_id"], r["user_first_name"], r["item_name"]) for r in rows(data_dir, "enriched")),
        "missing": sorted((r["invoice_id"], r["reason"]) for r in rows(data_dir, "missing_state")),
        "dead": sorted((r["source_message_id"], r["error"]) for r in rows(data_dir, "dead_letter")),
    }


def test_savepoint_restore_replays_to_the_same_output(settings_factory):
    settings = settings_factory(enrichment__max_wait="0s")
    url, orders_topic, data_dir = settings.service_url, settings.topics["orders"], settings.data_dir
    load_state(settings)
    publish(url, orders_topic, keyed("orders", [order(n, (n % 23) + 1, (n % 6) + 1) for n in range(100)]))
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(data_dir) >= 100, timeout=180, what="the first 100 orders")
        saved = control.take_savepoint(settings, "before-more")  # taken while the job runs
        publish(url, orders_topic, keyed("orders", [order(n, (n % 23) + 1, (n % 6) + 1) for n in range(100, 160)])
                + [("bad", b"{")])
        wait_for(lambda: orders_done(data_dir) >= 160 and count(data_dir, "dead_letter") >= 1, timeout=120,
                 what="the later orders")
    finally:
        job.close()
    without_restore = snapshot(data_dir)
    assert [s.name for s in control.list_savepoints(settings)] == ["before-more"]
    assert saved.batch_id >= 0 and saved.size_bytes > 0

    restored = control.restore_savepoint(settings, "before-more")
    assert restored.batch_id == saved.batch_id
    assert orders_done(data_dir) <= 100 + 0 and count(data_dir, "dead_letter") == 0  # later batches removed
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(data_dir) >= 160 and count(data_dir, "dead_letter") >= 1, timeout=180,
                 what="the same input after the restore")
    finally:
        job.close()
    assert snapshot(data_dir) == without_restore
    kinds = [e["kind"] for e in read_events(data_dir)]
    assert "savepoint_taken" in kinds and "savepoint_restored" in kinds


def test_replay_after_a_state_wipe_enriches_again(settings_factory):
    settings = settings_factory(enrichment__max_wait="0s", job__start_from="latest")
    url, data_dir = settings.service_url, settings.data_dir
    load_state(settings)  # published before the job: a fresh checkpoint at 'latest' never sees it
    job = JobThread(settings)
    try:
        wait_for(lambda: read_rows(data_dir, "progress"), timeout=180, what="the first batch")
        publish(url, settings.topics["orders"], keyed("orders", [order(n, 3, 2) for n in range(5)]))
        wait_for(lambda: count(data_dir, "missing_state") >= 5, timeout=120, what="orders without state")
        for topic in ("users", "items"):
            control.request_replay(settings, topic, requested_by="test")
        wait_for(lambda: len({e["details"]["seq"] for e in read_events(data_dir, ("replay_finished",))}) == 2,
                 timeout=120, what="both replays to finish")
        publish(url, settings.topics["orders"], keyed("orders", [order(n, 3, 2) for n in range(100, 105)]))
        wait_for(lambda: count(data_dir, "enriched") >= 5, timeout=120, what="orders enriched after the replay")
    finally:
        job.close()
    assert {r["reason"] for r in rows(data_dir, "missing_state")} == {"user_and_item"}
    assert sorted(invoices(data_dir, "enriched")) == list(range(100, 105))
    finished = read_events(data_dir, ("replay_finished",))
    assert {e["details"]["topic"] for e in finished} == {"users", "items"}
    assert {e["details"]["messages"] for e in finished} == {20, 5}
    requested = read_events(data_dir, ("replay_requested",))
    assert [e["details"]["requested_by"] for e in requested] == ["test", "test"]


def test_redrive_enriches_once_state_exists(settings_factory):
    settings = settings_factory(enrichment__max_wait="0s")
    url, data_dir = settings.service_url, settings.data_dir
    load_state(settings)
    publish(url, settings.topics["orders"], keyed("orders", [order(n, 77, 1) for n in range(4)]))
    job = JobThread(settings)
    try:
        wait_for(lambda: count(data_dir, "missing_state") >= 4, timeout=180, what="missing orders")
        publish(url, settings.topics["users"], keyed("users", [user(77)]))
        assert control.redrive(settings, user_id=77, requested_by="test").count == 4
        wait_for(lambda: count(data_dir, "enriched") >= 4, timeout=120, what="re-driven orders")
    finally:
        job.close()
    enriched = rows(data_dir, "enriched")
    originals = {r["source_message_id"] for r in rows(data_dir, "missing_state")}
    assert {r["redrive_of"] for r in enriched} == originals and len(enriched) == 4
    assert read_events(data_dir, ("redrive",))[0]["details"]["count"] == 4


def poison(rng: random.Random, n: int) -> bytes:
    """One of many kinds of bad payload."""
    good = order(n, 1, 1)
    kinds = [
        lambda: bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40))),
        lambda: wire.encode(good)[: rng.randint(1, 20)],
        lambda: json.dumps([good]).encode(),
        lambda: json.dumps(rng.choice([1, "x", None, True, 2.5])).encode(),
        lambda: wire.encode({**good, rng.choice(["userId", "itemId", "invoiceId", "price"]): None}),
        lambda: wire.encode({**good, "userId": rng.choice(["12", 1.5, [], {}, True])}),
        lambda: (lambda dropped: wire.encode({k: v for k, v in good.items() if k != dropped}))(
            rng.choice(["userId", "itemId", "createdAt"])),
        lambda: b"\xc3\x28" + wire.encode(good),
        lambda: b"[" * 5000 + b"]" * 5000,
        lambda: b'{"invoiceId": 1e400}',
        # valid UTF-8 and valid JSON, but a lone surrogate no UTF-8 sink can hold (it stopped the job once)
        lambda: wire.encode(good)[:-1] + b', "itemName": "\\ud800"}',
    ]
    return rng.choice(kinds)()


def test_fuzz_two_thousand_bad_messages_among_good_ones(settings_factory):
    settings = settings_factory(enrichment__max_wait="0s", job__max_rows_per_batch=2000)
    url, data_dir = settings.service_url, settings.data_dir
    load_state(settings)
    rng = random.Random(7)
    messages, good = [], 0
    for n in range(2600):
        if n % 5 == 0:
            good += 1
            messages.append((str(n), wire.encode(order(n, rng.randint(1, 25), rng.randint(1, 7)))))
        else:
            messages.append((rng.choice([None, str(n), "", "k"]), poison(rng, n)))
    huge = b'{"pad": "' + b"x" * (wire.MAX_PAYLOAD_BYTES + 10) + b'"}'
    bad = len(messages) + 1 - good
    publish(url, settings.topics["orders"], messages)
    # On its own: in one producer batch with others it can pass the broker's size limit.
    publish(url, settings.topics["orders"], [("huge", huge)])
    publish(url, settings.topics["users"], [("x", b"\x00\x01"), ("1", b"[]"), ("2", b'{"id": 2, "firstName": "\\udfff"}')])
    publish(url, settings.topics["items"], [(None, b'{"id": null}')])
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_done(data_dir) >= good and count(data_dir, "dead_letter") >= bad + 4,
                 timeout=240, what="every fuzzed message in a sink")
        assert job.thread.is_alive() and job.error is None  # still running after all that
    finally:
        job.close()
    assert orders_done(data_dir) == good
    dead = rows(data_dir, "dead_letter")
    assert len(dead) == bad + 4
    assert all(r["error"] and "\n" not in r["error"] for r in dead)
    assert any("over the" in r["error"] for r in dead)


def test_unwritable_sink_path_stops_the_job_naming_the_path(settings_factory):
    settings = settings_factory(enrichment__max_wait="0s")
    data_dir = settings.data_dir
    load_state(settings)
    publish(settings.service_url, settings.topics["orders"], keyed("orders", [order(1, 1, 1)]))
    blocked = store.sink_dir(data_dir, "enriched")
    blocked.parent.mkdir(parents=True)
    blocked.write_text("a file where the sink's table should be")
    with pytest.raises(SinkError, match="enriched") as caught:
        run_forever(settings)
    assert str(blocked) in str(caught.value)
    assert count(data_dir, "enriched") == 0  # nothing half-written became visible
    assert read_events(data_dir, ("job_failed",))


def test_broker_restart_mid_run_recovers_through_restarts(settings_factory, tmp_path):
    own = EmbeddedBroker(tmp_path / "own-broker").start()
    port = own.port
    try:
        settings = settings_factory(pulsar__service_url=own.service_url, enrichment__max_wait="0s",
                                    job__restart__attempts=10, job__restart__delay="1s")
        data_dir = settings.data_dir
        load_state(settings)
        publish(own.service_url, settings.topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(10)]))
        job = JobThread(settings)
        try:
            wait_for(lambda: orders_done(data_dir) >= 10, timeout=180, what="orders before the outage")
            own.stop()
            wait_for(lambda: read_events(data_dir, ("restart",)), timeout=120, what="a restart attempt")
            own = EmbeddedBroker(tmp_path / "own-broker", port=port).start()
            publish(own.service_url, settings.topics["orders"], keyed("orders", [order(n, 1, 1) for n in range(10, 20)]))
            wait_for(lambda: orders_done(data_dir) >= 20, timeout=240, what="orders after the broker came back")
        finally:
            job.close()
        assert sorted(invoices(data_dir, "enriched")) == list(range(20))
        restarts = read_events(data_dir, ("restart",))
        assert restarts[0]["details"]["attempt"] == 1 and restarts[0]["details"]["max_attempts"] == 10
        assert restarts[0]["details"]["error"]
    finally:
        own.stop()
