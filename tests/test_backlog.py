"""Backlogs as users make them, through the real job and broker: pulsar-client's defaults (no
batching) and batching on, published before the job starts or while it runs; changelogs first;
batches within their caps in messages and bytes.

The backlog is published in order: items, users (two versions each), tombstones for some users,
then orders. With ``enrichment.max_wait = 0`` an order is decided in the batch that reads it, so
every order must be decided with the users and tombstones published before it: the deleted
users' orders are missing (reason ``user``), every other order carries its user's second version.
"""

from __future__ import annotations

import pytest

from pipeline.metrics import read_rows
from factories import item, keyed, order, publish, user
from jobproc import JobThread
from sinkread import count, orders_done, rows
from waiting import wait_for

USERS, ITEMS, ORDERS = 300, 20, 4000
DELETED = set(range(1, 41))


def publish_backlog(url: str, topics: dict, batching: bool) -> list[dict]:
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, ITEMS + 1)]), batching=batching)
    versions = [user(u, firstName=f"old{u}") for u in range(1, USERS + 1)] + \
               [user(u, firstName=f"new{u}") for u in range(1, USERS + 1)]
    publish(url, topics["users"], keyed("users", versions) + [(str(u), b"") for u in sorted(DELETED)], batching=batching)
    orders = [order(n, user_id=(n * 7) % USERS + 1, item_id=n % ITEMS + 1) for n in range(ORDERS)]
    publish(url, topics["orders"], keyed("orders", orders), batching=batching)
    return orders


def assert_decided_with_what_was_published_before(data_dir, orders: list[dict]) -> None:
    enriched = {r["invoice_id"]: r for r in rows(data_dir, "enriched", "invoice_id, user_first_name, item_name")}
    missing = {r["invoice_id"]: r for r in rows(data_dir, "missing_state", "invoice_id, reason")}
    assert count(data_dir, "enriched") + count(data_dir, "missing_state") == len(orders)  # each once
    wrong = []
    for o in orders:
        if o["userId"] in DELETED:
            if missing.get(o["invoiceId"], {}).get("reason") != "user":
                wrong.append((o["invoiceId"], "enriched with a deleted user", enriched.get(o["invoiceId"])))
        elif (enriched.get(o["invoiceId"]) or {}).get("user_first_name") != f"new{o['userId']}":
            wrong.append((o["invoiceId"], "not enriched with the user's last version",
                          enriched.get(o["invoiceId"]) or missing.get(o["invoiceId"])))
    assert not wrong, f"{len(wrong)} of {len(orders)} orders decided wrongly, e.g. {wrong[:3]}"


def admitted_orders_before_changelogs_done(data_dir) -> int:
    """Orders read in batches that had not yet read every changelog message (from the progress
    rows: a batch with orders while the changelogs still had a backlog)."""
    wrong = 0
    for progress in read_rows(data_dir, "progress"):
        by_topic = {t["topic"]: t for t in progress["topics"]}
        if (by_topic.get("orders", {}).get("rows") or 0) and any(
                (by_topic.get(kind, {}).get("backlog") or 0) for kind in ("users", "items")):
            wrong += by_topic["orders"]["rows"]
    return wrong


@pytest.mark.e2e
@pytest.mark.parametrize("batching,when", [(False, "before"), (True, "before"), (False, "while running")],
                         ids=["unbatched-backlog", "batched-backlog", "unbatched-while-running"])
def test_a_backlog_drains_changelogs_first(settings_factory, broker, batching, when):
    # a cap well under the backlog, so it takes several batches and the changelogs alone fill some
    settings = settings_factory(enrichment__max_wait="0s", job__max_rows_per_batch=500)
    topics = settings.topics
    orders = publish_backlog(broker.service_url, topics, batching) if when == "before" else None
    job = JobThread(settings)
    try:
        if orders is None:
            wait_for(lambda: read_rows(settings.data_dir, "events"), timeout=180, what="the job to start")
            orders = publish_backlog(broker.service_url, topics, batching)
        wait_for(lambda: job.error or orders_done(settings.data_dir) >= ORDERS, timeout=300, what="every order decided")
    finally:
        job.close()
    assert job.error is None
    assert_decided_with_what_was_published_before(settings.data_dir, orders)
    assert admitted_orders_before_changelogs_done(settings.data_dir) == 0
    progress = read_rows(settings.data_dir, "progress")
    read = [sum(t["rows"] or 0 for t in p["topics"]) for p in progress]
    assert sum(read) == ORDERS + ITEMS + 2 * USERS + len(DELETED)  # every message read once
    # the cap counts messages: exact for one message an entry; estimated from what was read for
    # producers' batches, whose entries vary (up to 1,000 messages here)
    assert max(read) <= (500 if not batching else 2000)
    if when == "before":  # batches close to full, not one entry's worth each
        assert len([n for n in read if n]) <= 2 * (sum(read) // 500 + 1) + 2


@pytest.mark.e2e
def test_large_payloads_stay_under_the_byte_cap(settings_factory, broker):
    """Orders of 600 KB (an extra field the wire ignores) and 2 MB poison messages on a changelog
    (over the wire's 1 MB limit: dead letters, which carry their payload to the driver), unbatched."""
    settings = settings_factory(enrichment__max_wait="0s", job__max_bytes_per_batch="4MB")
    big, poison = 600 << 10, 2 << 20
    orders = [order(n, 1, 1, notes="x" * big) for n in range(20)]
    publish(broker.service_url, settings.topics["orders"], keyed("orders", orders), batching=False)
    publish(broker.service_url, settings.topics["users"], [(str(n), b"{" + b" " * poison + b"}") for n in range(6)],
            batching=False)
    job = JobThread(settings)
    try:
        wait_for(lambda: job.error or (orders_done(settings.data_dir) >= len(orders)
                                       and count(settings.data_dir, "dead_letter") >= 6), timeout=300,
                 what="every large message in its one row")
    finally:
        job.close()
    assert job.error is None
    assert orders_done(settings.data_dir) == len(orders) and count(settings.data_dir, "dead_letter") == 6
    batch_bytes: dict[int, int] = {}
    for sink, size in (("missing_state", big), ("dead_letter", poison)):
        for row in rows(settings.data_dir, sink, "batch_id"):
            batch_bytes[row["batch_id"]] = batch_bytes.get(row["batch_id"], 0) + size
    assert max(batch_bytes.values()) <= 4 << 20  # the cap in bytes holds
    assert len(batch_bytes) <= 2 * (20 * big + 6 * poison) // (4 << 20) + 2  # and batches are close to full
