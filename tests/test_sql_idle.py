"""A temporal join's idle tables (``SET 'table.exec.source.idle-timeout'``, pipeline/sql/idle.py):
the heartbeat maths, the driver's idle clock over progress events, and end to end: a versioned
table that stops sending, then a driving table that stops, each no longer holding the join back."""

from __future__ import annotations

import json

import pytest

from factories import publish, publish_timed
from pipeline.source.clock import read_clock_file
from pipeline.sql.idle import IdleClock, clock_path, heartbeats
from pipeline.sql.plan import build_plan
from sqlhelp import Running, fresh_topics, message, read_topic
from waiting import wait_for

T = 1_700_000_000_000


@pytest.mark.parametrize("newest, idle, expected", [
    ({0: 10_000, 1: 4_000}, {1}, {1: 9_000}),  # the versioned table's watermark raised to the driving one's
    ({0: 3_000, 1: 30_000}, {0}, {0: 31_000}),  # the driving table's, to the versioned one's (+ its own delay)
    ({0: 10_000, 1: 9_500}, {1}, {}),  # already there: nothing to raise
    ({0: 10_000, 1: 4_000}, {0, 1}, {}),  # every table idle: the watermark stays, as Flink's
    ({0: None, 1: 4_000}, {1}, {}),  # an active table with no time yet holds it at its start
    ({0: 10_000, 1: None}, {1}, {}),  # a table that never sent holds nothing back (Spark leaves its node out)
    ({0: 10_000, 1: 4_000}, set(), {}),
])
def test_an_idle_tables_heartbeat_puts_its_watermark_at_the_active_tables(newest, idle, expected):
    assert heartbeats(newest, {0: 1_000, 1: 0}, idle) == expected


def test_with_temporal_joins_one_after_another_an_idle_table_is_raised_to_the_least_active_watermark():
    # orders (delay 1 s) at 10 s, users idle at 4 s, items at 8 s: the active tables' least watermark is 8 s
    assert heartbeats({0: 10_000, 1: 4_000, 2: 8_000}, {0: 1_000, 1: 0, 2: 0}, {1}) == {1: 8_000}
    assert heartbeats({0: 10_000, 1: 4_000, 2: 3_000}, {0: 1_000, 1: 0, 2: 0}, {1, 2}) == {1: 9_000, 2: 9_000}


def progress(orders_n: int, users_n: int, newest: dict[int, int | None], backlog: int = 0) -> dict:
    def offsets(table: str, n: int) -> dict:
        return {"endOffset": json.dumps({table: {"gen": 0, "parts": {"-1": {"n": n}}}}),
                "latestOffset": json.dumps({table: {"gen": 0, "parts": {"-1": {"n": n + backlog}}}})}

    observed = {f"sql_newest_side_{side}": {"newest_ms": ms} for side, ms in newest.items()}
    return {"sources": [offsets("orders", orders_n), offsets("users", users_n)], "observedMetrics": observed}


def test_the_idle_clock_marks_a_table_idle_after_the_timeout_and_active_again_when_it_moves(tmp_path):
    events = []
    clock = IdleClock(tmp_path, ["orders", "users"], [1_000, 0], idle_timeout_ms=5_000,
                      record=lambda kind, message, **details: events.append((kind, details["table"])))
    users = clock_path(tmp_path, 1)
    assert read_clock_file(users).newest == {}  # a started pipeline: every table active
    clock.observe(progress(3, 2, {0: T + 9_000, 1: T + 1_000}), now_ms=0)
    clock.observe(progress(5, 2, {0: T + 12_000}), now_ms=4_000)
    assert read_clock_file(users).newest == {}  # users quiet for 4 s of 5
    clock.update(now_ms=5_000)
    written = read_clock_file(users)
    assert written.newest == {"users": T + 11_000} and written.idle == {"users"}
    assert read_clock_file(clock_path(tmp_path, 0)).newest == {}  # orders moved at 4 s
    clock.observe(progress(5, 2, {}, backlog=1), now_ms=9_500)  # orders: one message not read yet
    assert 0 not in clock.idle_sides(9_500)
    clock.observe(progress(5, 3, {1: T + 30_000}), now_ms=10_000)  # users send again: active
    assert read_clock_file(users).newest == {}
    clock.update(now_ms=10_000)
    assert read_clock_file(clock_path(tmp_path, 0)).newest == {"orders": T + 31_000}  # orders quiet since 4 s
    # in this order at least (a loaded machine may pause the orders' feeder past the timeout: more events)
    assert events[0] == ("table_idle", "users") and ("table_active", "users") in events
    assert events.index(("table_active", "users")) < len(events) - 1 - events[::-1].index(("table_idle", "orders"))


WITH = ("WITH ('connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', "
        "'value.format' = 'json')")
SQL = "\n".join([
    "SET 'table.exec.source.idle-timeout' = '1 s';",
    "CREATE TABLE orders (id STRING, user_id STRING, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, "
    "PRIMARY KEY (id) NOT ENFORCED) " + WITH.format(name="orders") + ";",
    "CREATE TABLE users (id STRING, name STRING, changed TIMESTAMP(3) METADATA FROM 'eventTime' VIRTUAL, "
    "WATERMARK FOR changed AS changed, PRIMARY KEY (id) NOT ENFORCED) " + WITH.format(name="users") + ";",
    "CREATE TABLE out (id STRING, name STRING, PRIMARY KEY (id) NOT ENFORCED) " + WITH.format(name="out") + ";",
    "INSERT INTO out SELECT o.id, u.name FROM orders AS o LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u "
    "ON o.user_id = u.id;"])


def at(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class Feeder:
    """Publishes one message every 0.2 s in a thread (a table that goes on sending), each at a
    time 100 ms after the one before, until stopped; ``sent`` holds what it published."""

    def __init__(self, send, first_ms: int):
        import threading

        self.send, self.next_ms, self.sent, self.stopped = send, first_ms, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.wait(0.2):
            self.sent.append(self.send(len(self.sent), self.next_ms))
            self.next_ms += 100

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(10)


@pytest.mark.e2e
@pytest.mark.parametrize("timeout", ["1 s", None], ids=["idle-timeout", "without"])
def test_a_table_that_stops_sending_no_longer_holds_the_join_back(timeout, settings_factory, broker, spark):
    """Users send once and stop while orders go on: o1 and o2 are decided once users are idle;
    then orders stop while users go on: the last order is decided once orders are idle. Without
    the timeout (Flink's default) users hold the watermark where their one version put it."""
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "out")
    url = broker.service_url
    sql = SQL if timeout else SQL.replace("SET 'table.exec.source.idle-timeout' = '1 s';\n", "")
    name = f"idle-{'on' if timeout else 'off'}"

    def order(n: int, ms: int, key: str | None = None) -> str:
        key = key or f"f{n}"
        publish(url, topics["orders"], [message(key, {"id": key, "user_id": "u1", "ts": at(ms)})])
        return key

    def user(n: int, ms: int, key: str = "u2", name_: str = "bea") -> str:
        publish_timed(url, topics["users"], [(key, message(key, {"id": key, "name": name_})[1], ms)])
        return key

    user(0, T + 1_000, "u1", "ada")
    order(0, T + 2_000, "o1")
    order(0, T + 10_000, "o2")  # the orders' watermark: T+9 s; users': T+1 s
    with Running(settings, build_plan(sql, topics), name, spark) as running:
        def decided() -> dict[str, str]:
            running.result(settings, name)  # raises the pipeline's own error, if it stopped
            return {key: json.loads(value)["name"] for key, value in read_topic(url, topics["out"], timeout_ms=300)}

        with Feeder(order, T + 11_000) as orders:  # orders go on; users have stopped
            if not timeout:  # users hold the watermark at T+1 s however far the orders get
                wait_for(lambda: len(orders.sent) >= 20 and watermark(spark, name) == T + 1_000, 120,
                         what="twenty orders read with the watermark held at users' T+1 s")
                assert decided() == {}
                return
            # users idle after 1 s: the join's watermark follows the orders', past o1 and o2
            seen = wait_for(lambda: {"o1", "o2"} <= set(out := decided()) and out, 120,
                            what="o1 and o2 decided with users idle")
            assert seen["o1"] == seen["o2"] == "ada"
        last = orders.sent[-1]  # the newest order: the orders' own watermark stays 1 s below it
        with Feeder(user, T + 3_600_000):  # users go on (another user's versions); orders have stopped
            seen = wait_for(lambda: last in (out := decided()) and out, 120, what="the last order decided with orders idle")
        assert set(seen) == {"o1", "o2", *orders.sent} and set(seen.values()) == {"ada"}
    from pipeline import store
    from pipeline.metrics import read_rows

    events = [(e["kind"], e["details"]["table"]) for e in read_rows(store.sql_dir(settings.data_dir, name), "events")
              if e["kind"] in ("table_idle", "table_active")]
    # in this order at least (a loaded machine may pause the orders' feeder past the timeout: more events)
    assert events[0] == ("table_idle", "users") and ("table_active", "users") in events
    assert events.index(("table_active", "users")) < len(events) - 1 - events[::-1].index(("table_idle", "orders"))


def watermark(spark, name: str) -> int | None:
    """The newest watermark the pipeline's query reported (epoch ms), None before one."""
    from datetime import datetime

    query = next((q for q in spark.streams.active if q.name == f"sql-{name}"), None)
    marks = [p["eventTime"].get("watermark") for p in (query.recentProgress if query else []) if p.get("eventTime")]
    marks = [m for m in marks if m]
    return int(datetime.fromisoformat(marks[-1].replace("Z", "+00:00")).timestamp() * 1000) if marks else None
