"""The enrichment job end to end: real broker, real Spark, real Parquet, read back with DuckDB.

One job run covers the scenarios of DESIGN.md §4 (known and unknown users and items, a
changelog update, a tombstone, poison messages on every topic, orders that arrive before
their user, orders whose user never comes); a second run on the same checkpoint shows that
state survives a restart without re-reading the changelogs.
"""

from __future__ import annotations

import time

import pandas as pd
import pytest

from app.console_math import job_status_from_frames
from app.metric_queries import read_heartbeat
from pipeline import wire
from pipeline.metrics import read_rows
from factories import item, keyed, order, publish, user
from jobproc import JobThread
from sinkread import count, rows
from waiting import poll, wait_for

pytestmark = pytest.mark.e2e  # every test here starts the job

MAX_WAIT = "12s"


@pytest.fixture(scope="module")
def scenario(tmp_path_factory, broker):
    from pipeline.config import load_settings

    tag = tmp_path_factory.mktemp("job").name
    topics = {k: f"persistent://public/default/{k}-{tag}" for k in ("users", "items", "orders")}
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path_factory.mktemp("jobdata")),
        "spark.master": "local[2]", "job.trigger_interval": "500ms", "enrichment.max_wait": MAX_WAIT,
        **{f"topics.{k}": v for k, v in topics.items()}})
    url = broker.service_url
    users = [user(u) for u in range(1, 21)] + [user(3, firstName="Updated3")]
    publish(url, topics["users"], keyed("users", users) + [("5", b""), ("bad", b"{oops"), ("7", b"\xff\xfe")])
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 6)]) + [("9", b'["not", "an object"]')])
    orders = [order(100 + n, user_id=(n % 22) + 1, item_id=(n % 6) + 1) for n in range(60)]
    early = [order(900, user_id=50, item_id=1), order(901, user_id=50, item_id=2)]  # user 50 comes later
    never = [order(950, user_id=77, item_id=1)]  # user 77 never comes
    publish(url, topics["orders"], keyed("orders", orders + never)
            + [("bad", wire.encode({**order(999, 1, 1), "userId": None})), ("bad2", b"not json")])
    job = JobThread(settings)
    data_dir = settings.data_dir
    try:
        wait_for(lambda: count(data_dir, "enriched") >= 1, timeout=180, what="the first enriched rows")
        # On a warm job: the early orders are read and buffered, then their user arrives.
        publish(url, topics["orders"], keyed("orders", early))
        total_orders = len(orders) + len(never) + 2 + len(early)
        wait_for(lambda: sum(t["rows"] or 0 for p in read_rows(data_dir, "progress") for t in p["topics"]
                             if t["topic"] == "orders") >= total_orders,
                 timeout=60, what="the early orders to be read")
        publish(url, topics["users"], keyed("users", [user(50, firstName="Late50")]))
        expected_total = len(orders) + len(early) + len(never)
        wait_for(lambda: count(data_dir, "enriched") + count(data_dir, "missing_state") >= expected_total,
                 timeout=120, what="every order in a sink")
        wait_for(lambda: count(data_dir, "dead_letter") >= 5, timeout=60, what="dead letters")
        # Nothing more is sent: once the lookups' waits are over, the newest batch only gets older
        quiet = poll(lambda: time.time() * 1000 - max(row["ts_ms"] for row in read_rows(data_dir, "progress")) > 4_000,
                     timeout=90)
        # ... and its heartbeat (Spark's idle events, every 10 s) tells the console it runs
        newest = max(row["ts_ms"] for row in read_rows(data_dir, "progress"))
        beat = poll(lambda: (read_heartbeat(data_dir) or 0) > newest, timeout=40) and read_heartbeat(data_dir)
    finally:
        job.close()
    yield {"settings": settings, "orders": orders, "early": early, "never": never, "users": users, "topics": topics,
           "quiet": quiet, "heartbeat": beat}


def expected_outcome(o: dict) -> tuple[str, str | None]:
    """Independent expectation from the inputs: users 1..20 (5 deleted), items 1..5."""
    user_known = 1 <= o["userId"] <= 20 and o["userId"] != 5
    item_known = 1 <= o["itemId"] <= 5
    if user_known and item_known:
        return "enriched", None
    return "missing_state", ("user_and_item" if not user_known and not item_known else "user" if not user_known else "item")


def test_every_order_lands_in_exactly_one_sink(scenario):
    data_dir = scenario["settings"].data_dir
    enriched = {r["invoice_id"] for r in rows(data_dir, "enriched", "invoice_id")}
    missing = {r["invoice_id"] for r in rows(data_dir, "missing_state", "invoice_id")}
    all_invoices = [o["invoiceId"] for o in scenario["orders"] + scenario["early"] + scenario["never"]]
    assert count(data_dir, "enriched") + count(data_dir, "missing_state") == len(all_invoices)
    assert enriched | missing == set(all_invoices) and not enriched & missing


def test_outcomes_and_reasons_match_an_independent_expectation(scenario):
    data_dir = scenario["settings"].data_dir
    got = {r["invoice_id"]: ("enriched", None) for r in rows(data_dir, "enriched", "invoice_id")}
    got.update({r["invoice_id"]: ("missing_state", r["reason"]) for r in rows(data_dir, "missing_state", "invoice_id, reason")})
    for o in scenario["orders"]:
        assert got[o["invoiceId"]] == expected_outcome(o), o


def test_enriched_fields_are_the_latest_versions(scenario):
    data_dir = scenario["settings"].data_dir
    for r in rows(data_dir, "enriched"):
        expected_first = {3: "Updated3", 50: "Late50"}.get(r["user_id"], f"First{r['user_id']}")
        assert r["user_first_name"] == expected_first
        assert r["user_email"] == f"u{r['user_id']}@example.com"
        assert (r["item_name"], r["item_price"]) == (f"item{r['item_id']}", 10.0 + r["item_id"])
        assert r["source_topic"] == scenario["topics"]["orders"] and r["batch_id"] >= 0
        assert r["published_at"] <= r["enriched_at"]


def test_tombstoned_user_makes_orders_missing(scenario):
    data_dir = scenario["settings"].data_dir
    reasons = {r["reason"] for r in rows(data_dir, "missing_state", "user_id, reason") if r["user_id"] == 5}
    assert reasons and reasons <= {"user", "user_and_item"}


def test_order_before_its_user_is_buffered_then_enriched(scenario):
    data_dir = scenario["settings"].data_dir
    late = [r for r in rows(data_dir, "enriched") if r["invoice_id"] in (900, 901)]
    assert len(late) == 2
    assert all(r["user_first_name"] == "Late50" and r["waited_ms"] > 0 for r in late)


def test_order_past_max_wait_is_missing_with_reason(scenario):
    data_dir = scenario["settings"].data_dir
    (never,) = [r for r in rows(data_dir, "missing_state") if r["invoice_id"] == 950]
    assert never["reason"] == "user"
    assert never["waited_ms"] >= 12_000


def test_a_quiet_job_runs_no_batch_once_its_waits_are_over(scenario):
    """Spark runs a batch every trigger, input or not, for the lookups' processing-time timers;
    the job turns those off, and its source plans the batches of no row the timers need
    (pipeline/runtime/spark.py ``start_without_idle_batches``): order 950 was decided after its
    12 s wait with nothing sent, and then the batches stopped."""
    assert scenario["quiet"], "a batch every trigger with nothing to read"
    status = job_status_from_frames(pd.DataFrame([{"kind": "job_started", "ts_ms": 0, "message": "", "details": {}}]),
                                    pd.DataFrame(read_rows(scenario["settings"].data_dir, "progress")).tail(1),
                                    scenario["heartbeat"], heartbeat_ts_ms=scenario["heartbeat"])
    assert (status.state, status.headline) == ("running", "Running, idle")


def test_poison_messages_on_every_topic_are_dead_letters(scenario):
    data_dir = scenario["settings"].data_dir
    dead = rows(data_dir, "dead_letter")
    by_topic = {}
    for r in dead:
        by_topic.setdefault(r["source_topic"], []).append(r)
    topics = scenario["topics"]
    assert len(by_topic[topics["users"]]) == 2 and len(by_topic[topics["items"]]) == 1
    assert len(by_topic[topics["orders"]]) == 2
    errors = {r["error"] for r in dead}
    assert "field 'userId' is null; it is required" in errors
    assert "payload must be a JSON object, got list" in errors
    assert any(r["payload"].startswith("base64:") for r in dead)
    assert all("\n" not in e for e in errors)


def test_metrics_store_has_progress_tasks_and_events(scenario):
    data_dir = scenario["settings"].data_dir
    progress = read_rows(data_dir, "progress")
    assert progress and sum(p["num_input_rows"] for p in progress) >= 60
    orders_rows = sum(t["rows"] for p in progress for t in p["topics"] if t["topic"] == "orders")
    assert orders_rows == len(scenario["orders"]) + 3 + 2
    assert any(p["state"] and p["state"][0]["operator"] == "user_lookup" for p in progress)
    kinds = [e["kind"] for e in read_rows(data_dir, "events")]
    assert kinds[0] == "job_started" and kinds[-1] == "job_stopped"
    # Task rows come from Spark's REST API on a background thread, a little after each batch.
    def stages_seen():
        seen = {t["stage"] for t in read_rows(data_dir, "tasks")}
        return seen if {"user_lookup", "item_lookup"} <= seen else None

    assert wait_for(stages_seen, timeout=60, what="task rows of both stateful stages") == {"user_lookup", "item_lookup"}


def test_state_survives_a_restart_without_replay(scenario):
    """Second run on the same checkpoint: new orders are enriched, users are not re-read."""
    settings, topics = scenario["settings"], scenario["topics"]
    data_dir = settings.data_dir
    before = count(data_dir, "enriched")
    progress_before = len(read_rows(data_dir, "progress"))
    publish(settings.service_url, topics["orders"], keyed("orders", [order(5000 + n, user_id=3, item_id=2) for n in range(5)]))
    job = JobThread(settings)
    try:
        wait_for(lambda: count(data_dir, "enriched") >= before + 5, timeout=180, what="orders after restart")
    finally:
        job.close()
    new = [r for r in rows(data_dir, "enriched") if r["invoice_id"] >= 5000]
    assert len(new) == 5 and all(r["user_first_name"] == "Updated3" for r in new)
    rerun = read_rows(data_dir, "progress")[progress_before:]
    assert sum(t["rows"] for p in rerun for t in p["topics"] if t["topic"] in ("users", "items")) == 0


def test_an_order_left_waiting_at_a_stop_is_decided_after_a_restart_with_nothing_sent(scenario):
    """The job stops while order 960 waits for a user that never comes, and nothing is sent
    after it starts again: the restarted source plans the batches of no row the lookups' timers
    need from its own start (``tickForMs``), so the order is still decided after its wait."""
    settings, topics = scenario["settings"], scenario["topics"]
    data_dir = settings.data_dir
    orders_read = lambda: sum(t["rows"] or 0 for p in read_rows(data_dir, "progress")  # noqa: E731
                              for t in p["topics"] if t["topic"] == "orders")
    read_before = orders_read()
    publish(settings.service_url, topics["orders"], keyed("orders", [order(960, user_id=78, item_id=1)]))
    job = JobThread(settings)
    try:
        wait_for(lambda: orders_read() > read_before, timeout=180, what="order 960 to be read")
    finally:
        job.close()
    assert not [r for r in rows(data_dir, "missing_state") if r["invoice_id"] == 960], \
        "order 960 was decided before the stop: the stop came too late to test the restart"
    job = JobThread(settings)
    try:
        decided = wait_for(lambda: [r for r in rows(data_dir, "missing_state") if r["invoice_id"] == 960],
                           timeout=120, what="order 960 decided after the restart")
    finally:
        job.close()
    assert decided[0]["reason"] == "user" and decided[0]["waited_ms"] >= 12_000
    assert orders_read() == read_before + 1  # the restart read nothing again
