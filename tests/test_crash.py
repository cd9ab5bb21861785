"""Exactly-once through crashes: kill -9 the job at three random moments, restart each time."""

from __future__ import annotations

import random
import time

from pipeline.metrics import read_rows
from factories import item, keyed, order, publish, user
from jobproc import JobProcess
from sinkread import invoices
from waiting import wait_for

ORDERS = 1500


def committed_batches(data_dir) -> int:
    return len(read_rows(data_dir, "progress"))


def test_kill_9_three_times_keeps_every_order_exactly_once(settings_factory, tmp_path):
    settings = settings_factory(job__max_rows_per_batch=120, enrichment__max_wait="0s")
    url, topics, data_dir = settings.service_url, settings.topics, settings.data_dir
    publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 41)]))
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 9)]))
    publish(url, topics["orders"], keyed("orders", [order(n, (n % 45) + 1, (n % 9) + 1) for n in range(ORDERS)]))
    rng = random.Random(20261122)
    for crash in range(3):
        job = JobProcess(settings, tmp_path / f"job{crash}.log")
        seen = committed_batches(data_dir)
        wait_for(lambda: committed_batches(data_dir) > seen, timeout=240, what=f"a batch before crash {crash + 1}")
        time.sleep(rng.uniform(0.0, 2.0))  # the random moment of the crash, not a synchronisation
        job.kill9()
        # Right after a crash a glob reader sees no duplicate.
        visible = invoices(data_dir, "enriched") + invoices(data_dir, "missing_state")
        assert len(visible) == len(set(visible)), f"duplicates visible after crash {crash + 1}"
    job = JobProcess(settings, tmp_path / "final.log")
    try:
        wait_for(lambda: len(invoices(data_dir, "enriched")) + len(invoices(data_dir, "missing_state")) >= ORDERS,
                 timeout=300, what="every order after the crashes")
    finally:
        assert job.stop() == 0
    enriched, missing = invoices(data_dir, "enriched"), invoices(data_dir, "missing_state")
    assert sorted(enriched + missing) == list(range(ORDERS))
    expected_missing = {n for n in range(ORDERS) if (n % 45) + 1 > 40 or (n % 9) + 1 > 8}
    assert set(missing) == expected_missing
