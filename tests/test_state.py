"""State you can inspect (DESIGN.md §10): the ``state`` command and the census of keys held.

One running job with buffering on: the command reads what it holds while it runs, and the
census (keys held and orders waiting per lookup) equals what was loaded. A checkpoint from the
bucketed job is refused in one line.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline import control
from pipeline.control import state as state_module
from pipeline import store
from pipeline.enrich.lookups import ITEMS, USERS
from pipeline.control.state import inspect_key
from pipeline.runtime.supervisor import check_checkpoint_layout
from pipeline.metrics import read_rows
from pipeline.control.state_service import service_for
from factories import item, keyed, order, publish, user
from jobproc import JobThread
from waiting import wait_for

pytestmark = pytest.mark.e2e


def run_cli(settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", "--data-dir", str(settings.data_dir), *args],
                          capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, broker):
    """A job holding 30 users (user 3 updated, user 5 deleted) and 4 items, with 2 orders waiting for user 99
    and one (of a known user) waiting for item 77."""
    from pipeline.config import load_settings

    tag = tmp_path_factory.mktemp("state").name
    topics = {k: f"persistent://public/default/{k}-{tag}" for k in ("users", "items", "orders")}
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path_factory.mktemp("statedata")),
        "spark.master": "local[2]", "job.trigger_interval": "500ms", "enrichment.max_wait": "1h",
        **{f"topics.{k}": v for k, v in topics.items()}})
    url = broker.service_url
    publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 31)] + [user(3, firstName="Newest3")])
            + [("5", b"")])
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 5)]))
    publish(url, topics["orders"], keyed("orders", [order(1, 1, 1), order(2, 99, 1), order(3, 99, 2), order(4, 2, 77)]))
    original = state_module.CENSUS_INTERVAL_S
    state_module.CENSUS_INTERVAL_S = 1.0  # a census a second instead of a minute, for the test
    job = JobThread(settings)
    try:
        yield settings, job
    finally:
        state_module.CENSUS_INTERVAL_S = original
        job.close()


def newest_census(data_dir) -> dict:
    rows = read_rows(data_dir, "state")
    return {row["lookup"]: row for row in rows}


def test_the_census_counts_the_distinct_keys_loaded_and_the_orders_waiting(loaded):
    settings, _ = loaded
    census = wait_for(lambda: (found := newest_census(settings.data_dir)).get("users", {}).get("waiting_orders") == 2
                      and found.get("items", {}).get("waiting_orders") == 1 and found, timeout=240,
                      what="a census with the waiting orders of both lookups")
    assert census["users"]["keys_held"] == 29  # 30 users, one deleted; user 3's update is the same key
    assert census["users"]["waiting_keys"] == 1
    assert census["items"]["keys_held"] == 4 and census["items"]["waiting_keys"] == 1


def test_state_shows_the_newest_version_and_nothing_after_a_tombstone(loaded, spark):
    settings, _ = loaded
    wait_for(lambda: newest_census(settings.data_dir).get("users"), timeout=240, what="the job's first census")
    checkpoint = store.checkpoint_dir(settings.data_dir)
    updated = inspect_key(spark, checkpoint, USERS, 3)
    assert updated.latest["user_first_name"] == "Newest3" and updated.waiting == []
    assert inspect_key(spark, checkpoint, USERS, 5).latest is None
    assert inspect_key(spark, checkpoint, ITEMS, 4).latest["item_price"] == item(4)["price"]
    # As the console asks while the job runs: its one look-up worker (a process with a Spark session of its own).
    service = service_for(settings)
    try:
        held_user, held_item = control.inspect_state(settings, [("users", 3), ("items", 4)], client="10.0.0.5")
        assert held_user["latest"]["user_first_name"] == "Newest3" and held_user["key"] == 3
        assert held_item["latest"]["item_price"] == item(4)["price"]
        worker = service.pid
        (deleted,) = control.inspect_state(settings, [("users", 5)], client="10.0.0.6")
        assert deleted["latest"] is None
        assert service.pid == worker and service.starts == 1  # the second look-up started no JVM
    finally:
        service.close()


def test_state_lists_the_orders_waiting_for_a_key(loaded, spark):
    settings, _ = loaded
    wait_for(lambda: newest_census(settings.data_dir).get("users", {}).get("waiting_orders") == 2, timeout=240,
             what="the two orders waiting for user 99")
    waiting = inspect_key(spark, store.checkpoint_dir(settings.data_dir), USERS, 99)
    assert waiting.latest is None and sorted(order["invoice_id"] for order in waiting.waiting) == [2, 3]
    text = waiting.describe()
    assert "nothing held" in text and "2 order(s)" in text
    assert {line.split()[1] for line in text.splitlines() if line.strip().startswith("invoice")} == {"2", "3"}


def test_an_unknown_lookup_is_one_line(loaded):
    settings, _ = loaded
    result = run_cli(settings, "state", "stores", "1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: unknown lookup 'stores'; expected one of ['users', 'items']"]
    result = run_cli(settings, "state", "users", "x")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: key 'x' of users is not a whole number; give the numeric id"]


def test_a_checkpoint_of_the_bucketed_job_is_refused_in_one_line(tmp_path, broker):
    checkpoint = tmp_path / "var" / "checkpoint"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    with pytest.raises(Exception, match="was written by the bucketed Python lookups") as raised:
        check_checkpoint_layout(checkpoint)
    assert str(checkpoint) in str(raised.value) and "start fresh" in str(raised.value)
    result = subprocess.run([sys.executable, "-m", "pipeline", "--data-dir", str(tmp_path / "var"),
                             "--service-url", broker.service_url, "run"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {raised.value}"]


def test_a_fresh_checkpoint_is_marked_and_accepted(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    check_checkpoint_layout(checkpoint)
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    check_checkpoint_layout(checkpoint)  # ours now: no error
