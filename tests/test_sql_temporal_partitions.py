"""A temporal join over a partitioned versioned table: its watermark is the least of its partitions', as Flink's.

The users topic has two partitions on a broker of its own. One partition goes far ahead in event
time; the other stays behind. With the newest time of any partition as the table's watermark,
an order would be decided at once with the version its user had when the other partition was
last heard of, and that user's next version (older than the order) would be late. With the least
of the partitions', the one behind holds the order back until it moves, and the order gets the
version current at its time.
"""

from __future__ import annotations

import json

import pytest

from factories import broker_with_partitions, publish, send_routed
from pipeline.sql.plan import build_plan
from sqlhelp import Running, TopicTail, message
from test_sql_idle import watermark
from test_sql_temporal import ORDERS, OUT, SELECT, T, USERS, at
from waiting import wait_for


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory):
    """A broker of its own, and fresh topics of which ``users`` has two partitions."""
    data_dir = tmp_path_factory.mktemp("sql-partitions")
    topics = {name: f"persistent://public/default/{name}-{data_dir.name}" for name in ("orders", "users", "out")}
    with broker_with_partitions(data_dir, {topics["users"]: 2}) as running:
        yield running, topics


def users(url: str, topic: str, versions: list[tuple[str, str, int]]) -> dict[str, int]:
    """(key, name, event time) versions; returns the partition each key went to."""
    return send_routed(url, topic, [(key, message(key, {"id": key, "name": name})[1], ms) for key, name, ms in versions])


@pytest.mark.e2e
def test_a_partition_behind_holds_the_order_back_until_it_moves(two_partitions, settings_factory, spark):
    broker, topics = two_partitions
    a_partition_behind_holds_the_order_back(broker.service_url, topics, settings_factory(
        pulsar__service_url=broker.service_url, job__restart__delay="3s"), spark)


def a_partition_behind_holds_the_order_back(url: str, topics: dict[str, str], settings, spark) -> None:
    """The module's case on a broker where ``topics["users"]`` has two partitions (Apache Pulsar's
    tier runs it too: tests/test_apache_pulsar.py)."""
    where = users(url, topics["users"], [(f"u{n}", "old", T + 1_000) for n in range(20)])  # both partitions at T+1 s
    ahead = next(key for key, part in where.items() if part == 0)
    behind = next(key for key, part in where.items() if part == 1)
    users(url, topics["users"], [(ahead, "far", T + 100_000)])  # partition 0 far ahead
    publish(url, topics["orders"], [message(key, {"id": key, "user_id": user_id, "amount": 1.0, "ts": at(ms)})
                                    for key, user_id, ms in (("o1", behind, T + 50_000), ("o2", ahead, T + 80_000))])
    plan = build_plan("\n".join([ORDERS, USERS, OUT, SELECT.format(join="LEFT JOIN") + ";"]), topics)
    out = TopicTail(url, topics["out"])
    with Running(settings, plan, "partitions", spark) as running:
        def decided() -> dict[str, str]:
            running.check()
            return {key: json.loads(value)["name"] for key, value in out.read()}

        # every message read, and the join's watermark where the partition behind holds it: T+1 s
        wait_for(lambda: watermark(spark, "partitions") == T + 1_000, 120, what="the watermark at partition 1's T+1 s")
        assert decided() == {}  # o1 (T+50 s) waits for partition 1, far below partition 0's T+100 s
        # partition 1 moves: its user's version at T+40 s, then another user's at T+90 s; the
        # watermark is then the orders' (T+80 s - 1 s), past o1 but not o2
        users(url, topics["users"], [(behind, "new", T + 40_000)])
        users(url, topics["users"], [(next(k for k, p in where.items() if p == 1 and k != behind), "tick", T + 90_000)])
        seen = wait_for(lambda: decided() or None, 120, what="o1 decided")
        assert seen == {"o1": "new"}  # the version current at its time, not the one before it
        assert watermark(spark, "partitions") == T + 79_000
