"""A temporal join's idle tables (``SET 'table.exec.source.idle-timeout'``, pipeline/sql/join_clock.py):
the heartbeat maths, the driver's clock over progress events, and end to end: a versioned table
that stops sending, then a driving table that stops, each no longer holding the join back."""

from __future__ import annotations

import json

import pytest

from factories import publish, publish_timed
from pipeline.source.clock import NEWEST, read_clock_file
from pipeline.sql.join_clock import JoinClock, clock_path, heartbeats
from pipeline.sql.plan import build_plan
from sqlhelp import Running, TopicTail, fresh_topics, message
from waiting import wait_for

T = 1_700_000_000_000


@pytest.mark.parametrize("newest, idle, expected", [
    ({0: 10_000, 1: 4_000}, {1}, {1: 9_000}),  # the versioned table's watermark raised to the driving one's
    ({0: 3_000, 1: 30_000}, {0}, {0: 31_000}),  # the driving table's, to the versioned one's (+ its own delay)
    ({0: 10_000, 1: 9_500}, {1}, {}),  # already there: nothing to raise
    ({0: 10_000, 1: 4_000}, {0, 1}, {1: 9_000}),  # every table idle: the greatest watermark, as Flink flushes it
    ({0: 3_000, 1: 30_000}, {0, 1}, {0: 31_000}),
    ({0: 10_000, 1: None}, {0, 1}, {1: 9_000}),  # both idle at once, one never sent: the other's watermark
    ({0: None, 1: 4_000}, {1}, {}),  # an active table with no time yet holds it at its start
    ({0: 10_000, 1: None}, {1}, {1: 9_000}),  # an idle table that never sent is raised too (Spark holds a node
    # without rows at 0)
    ({0: 10_000, 1: 4_000}, set(), {}),
])
def test_an_idle_tables_heartbeat_puts_its_watermark_at_the_active_tables(newest, idle, expected):
    assert heartbeats(newest, {0: 1_000, 1: 0}, idle) == expected


def test_with_temporal_joins_one_after_another_an_idle_table_is_raised_to_the_least_active_watermark():
    # orders (delay 1 s) at 10 s, users idle at 4 s, items at 8 s: the active tables' least watermark is 8 s
    assert heartbeats({0: 10_000, 1: 4_000, 2: 8_000}, {0: 1_000, 1: 0, 2: 0}, {1}) == {1: 8_000}
    assert heartbeats({0: 10_000, 1: 4_000, 2: 3_000}, {0: 1_000, 1: 0, 2: 0}, {1, 2}) == {1: 9_000, 2: 9_000}


def progress(batch: int, orders_n: int, users_n: dict[str, int], newest: dict[str, int], backlog: int = 0) -> dict:
    """A batch's progress: the read positions of the orders (not partitioned) and of each users
    partition (``users_n``: partition -> read position), and each partition's newest time read."""
    def offsets(table: str, parts: dict[str, int]) -> dict:  # as the table's own source ends: with its clock's facts
        return {"endOffset": json.dumps({table: {"gen": 0, "parts": {p: {"n": n, NEWEST: 0} for p, n in parts.items()}}}),
                "latestOffset": json.dumps({table: {"gen": 0, "parts": {p: {"n": n + backlog} for p, n in parts.items()}}})}

    observed = {"sql_newest_side_0": {k: v for k, v in newest.items() if k == "orders"},
                "sql_newest_side_1": {k: v for k, v in newest.items() if k.startswith("users")}}
    return {"batchId": batch, "sources": [offsets("orders", {"-1": orders_n}), offsets("users", users_n)],
            "observedMetrics": observed}


def test_the_clock_marks_a_table_idle_after_the_timeout_and_active_again_when_it_moves(tmp_path):
    events = []
    clock = JoinClock(tmp_path, ["orders", "users"], [1_000, 0], idle_timeout_ms=5_000,
                      record=lambda kind, message, **details: events.append((kind, details["table"])),
                      partitions={"orders": ["-1"], "users": ["-1"]})
    users = clock_path(tmp_path, 1)
    assert read_clock_file(users).newest == {"users": None}  # a started pipeline: no time yet
    clock.observe(progress(0, 3, {"-1": 2}, {"orders": T + 9_000, "users": T + 1_000}), now_ms=0)
    assert read_clock_file(users).newest == {"users": T + 1_000} and not read_clock_file(users).idle
    assert read_clock_file(users).through == {"users": {"gen": 0, "parts": {"-1": {"n": 2, NEWEST: 0}}}}  # taken in
    clock.observe(progress(1, 5, {"-1": 2}, {"orders": T + 12_000}), now_ms=4_000)
    assert read_clock_file(users).newest == {"users": T + 1_000} and not read_clock_file(users).idle  # 4 s of 5
    clock.update(now_ms=5_000)
    written = read_clock_file(users)  # raised to the orders' watermark: T+12 s - 1 s
    assert written.newest == {"users": T + 11_000} and written.idle == {"users"}
    assert read_clock_file(clock_path(tmp_path, 0)).newest == {"orders": T + 12_000}  # orders moved at 4 s
    clock.observe(progress(2, 5, {"-1": 2}, {}, backlog=1), now_ms=9_500)  # orders: one message not read yet
    assert 0 not in clock.idle
    clock.observe(progress(3, 5, {"-1": 3}, {"users": T + 30_000}), now_ms=10_000)  # users send again: active
    assert read_clock_file(users).newest == {"users": T + 30_000} and not read_clock_file(users).idle
    clock.update(now_ms=10_000)
    orders = read_clock_file(clock_path(tmp_path, 0))  # quiet since 4 s: raised to users' T+30 s (+ its 1 s)
    assert orders.newest == {"orders": T + 31_000} and orders.idle == {"orders"}
    assert events == [("table_idle", "users"), ("table_active", "users"), ("table_idle", "orders")]


def test_a_statement_sets_shared_read_of_the_same_table_is_not_the_clocks(tmp_path):
    """The join's tables read again by another INSERT's shared source: its positions would make a
    quiet partition look as if it moved. The table's own source carries its clock's facts."""
    clock = JoinClock(tmp_path, ["orders", "users"], [0, 0], idle_timeout_ms=5_000,
                      partitions={"orders": ["-1"], "users": ["-1"]}, shared_read=frozenset({"users"}))
    own = {"users": {"gen": 0, "parts": {"-1": {"n": 2, NEWEST: None}}}}
    assert clock.side_of(own) == 1 and clock.side_of({"orders": {"gen": 0, "parts": {"-1": {"n": 0}}}}) == 0
    assert clock.side_of({"users": {"gen": 0, "parts": {"-1": {"n": 9}}}}) is None  # the shared read
    assert clock.side_of({"users": own["users"], "accounts": own["users"]}) is None  # a read of several tables
    clock.observe(progress(0, 1, {"-1": 2}, {}), now_ms=0)
    shared = {"endOffset": json.dumps({"users": {"gen": 0, "parts": {"-1": {"n": 7}}}}), "latestOffset": "{}"}
    clock.observe({"batchId": 1, "sources": [shared], "observedMetrics": {}}, now_ms=6_000)
    assert clock.idle == {0, 1}  # neither moved: the shared read's position is not users'


def test_a_partitioned_tables_clock_is_the_least_of_its_partitions_and_an_idle_partition_is_left_out(tmp_path):
    from pipeline.source.clock import clock_ms, facts_of, row_bounds, with_facts

    (tmp_path / "checkpoint" / "commits").mkdir(parents=True)
    parts = {"orders": ["-1"], "users": ["0", "1", "2"]}
    events = []
    clock = JoinClock(tmp_path, ["orders", "users"], [0, 0], idle_timeout_ms=5_000, partitions=parts,
                      record=lambda kind, message, **details: events.append((kind, details)))
    users = clock_path(tmp_path, 1)

    def facts():  # as the users source carries them in its next offset
        offset = {"users": {"gen": 0, "parts": {p: {"n": 1} for p in ("0", "1", "2")}}}
        return facts_of(with_facts(offset, read_clock_file(users), {"users"}), {"users"})

    clock.observe(progress(0, 1, {"0": 1, "1": 1, "2": 0}, {"orders": T + 9_000, "users/0": T + 5_000,
                                                           "users/1": T + 2_000}), now_ms=0)
    assert clock_ms(facts()) is None  # users/2 has sent nothing: it holds the table back, as in Flink
    clock.observe(progress(1, 2, {"0": 2, "1": 1, "2": 1}, {"orders": T + 9_500, "users/0": T + 6_000,
                                                           "users/2": T + 8_000}), now_ms=1_000)
    assert clock_ms(facts()) == T + 2_000  # users/1 lags: the table's clock is where it is
    assert row_bounds(facts()) == {"": None, "users/0": T + 2_000, "users/1": T + 6_000, "users/2": T + 2_000}
    (tmp_path / "checkpoint" / "commits" / "1").write_text("v1")
    clock.observe(progress(2, 3, {"0": 3, "1": 1, "2": 2}, {"orders": T + 9_800, "users/0": T + 7_000,
                                                           "users/2": T + 9_000}), now_ms=5_500)
    assert read_clock_file(users).idle == {"users/1"}  # quiet for 5.5 s: it no longer holds the table back
    assert clock_ms(facts()) == T + 7_000 and not clock.idle  # the table itself is active
    assert events == [("partition_idle", {"table": "users", "partition": 1})]
    clock.observe(progress(3, 4, {"0": 3, "1": 2, "2": 2}, {"users/1": T + 7_500}), now_ms=6_000)
    assert events[1:] == [("partition_active", {"table": "users", "partition": 1})] and not read_clock_file(users).idle
    # a restarted pipeline's clock starts from the newest times of the last committed batch (1):
    # users/1 quiet since then does not hold the table back at nothing
    restarted = JoinClock(tmp_path, ["orders", "users"], [0, 0], idle_timeout_ms=0, partitions=parts)
    assert read_clock_file(users).newest == {"users/0": T + 6_000, "users/1": T + 2_000, "users/2": T + 8_000}
    restarted.observe(progress(2, 3, {"0": 3, "1": 1, "2": 2}, {"users/0": T + 7_100}), now_ms=0)
    assert read_clock_file(users).newest == {"users/0": T + 7_100, "users/1": T + 2_000, "users/2": T + 8_000}


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
    out = TopicTail(url, topics["out"])
    with Running(settings, build_plan(sql, topics), name, spark) as running:
        def decided() -> dict[str, str]:
            running.check()
            return {key: json.loads(value)["name"] for key, value in out.read()}

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
    # users idle first; then users active again, and orders idle once they stopped, in either order (on a
    # loaded machine the users' first new message may be read after the orders' timeout; a paused
    # orders feeder may add events)
    assert events[0] == ("table_idle", "users") and ("table_active", "users") in events
    assert ("table_idle", "orders") in events[1:]


def watermark(spark, name: str) -> int | None:
    """The newest watermark the pipeline's query reported (epoch ms), None before one."""
    from datetime import datetime

    query = next((q for q in spark.streams.active if q.name == f"sql-{name}"), None)
    marks = [p["eventTime"].get("watermark") for p in (query.recentProgress if query else []) if p.get("eventTime")]
    marks = [m for m in marks if m]
    return int(datetime.fromisoformat(marks[-1].replace("Z", "+00:00")).timestamp() * 1000) if marks else None


@pytest.mark.e2e
def test_a_table_that_never_sent_no_longer_holds_the_join_back_once_idle(settings_factory, broker, spark):
    """Spark holds the join's watermark at 0 while a table's watermark node has seen no row (a
    rates table not written yet): once idle, the table is raised to the other's watermark, and
    LEFT pads the orders with NULLs."""
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "out")
    url = broker.service_url
    publish(url, topics["orders"], [message(key, {"id": key, "user_id": "u1", "ts": at(ms)})
                                    for key, ms in (("o1", T + 2_000), ("o2", T + 10_000))])
    out = TopicTail(url, topics["out"])
    with Running(settings, build_plan(SQL, topics), "never", spark) as running:
        def decided() -> dict[str, str | None]:
            running.check()
            return {key: json.loads(value)["name"] for key, value in out.read()}

        assert wait_for(lambda: decided() or None, 120, what="o1 decided with users idle") == {"o1": None}
        assert watermark(spark, "never") == T + 9_000  # the orders' own: o2 waits for a later order
