"""Table-driven semantics of the event-time temporal join ``FOR SYSTEM_TIME AS OF``, end to end, and its refusals.

Each case is a statement, the messages published step by step (orders carry their time in a
TIMESTAMP(3) column; users versions and every tombstone carry an event time), and the exact
changelog each step adds to the upsert topic. Each step ends with messages that move both tables'
watermarks past the step's orders (a row at a far time, which itself waits), so a step's orders
are decided together once the watermark passes them: a step's changelog compares sorted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest

from factories import publish, publish_timed
from pipeline.sql.plan import build_plan
from pipeline.sql.sqltypes import UnsupportedSql
from sqlhelp import Running, TopicTail, expect_changelog, fresh_topics, latest_per_key, message
from waiting import wait_for

T = 1_700_000_000_000  # the cases' epoch, in ms
WITH = ("WITH ('connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', "
        "'value.format' = 'json')")
ORDERS = ("CREATE TABLE orders (id STRING, user_id STRING, amount DOUBLE, ts TIMESTAMP(3), "
          "WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, PRIMARY KEY (id) NOT ENFORCED) "
          + WITH.format(name="orders") + ";")
USERS = ("CREATE TABLE users (id STRING, name STRING, changed TIMESTAMP(3) METADATA FROM 'eventTime' VIRTUAL, "
         "WATERMARK FOR changed AS changed, PRIMARY KEY (id) NOT ENFORCED) " + WITH.format(name="users") + ";")
OUT = ("CREATE TABLE out (id STRING, user_id STRING, name STRING, amount DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
       + WITH.format(name="out") + ";")
SELECT = ("INSERT INTO out SELECT o.id, o.user_id, u.name, o.amount FROM orders AS o {join} users "
          "FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id")


def at(ms: int) -> str:
    """An order's ts as Flink's JSON format writes a TIMESTAMP(3)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def order(key: str, user: str, ms: int, amount: float = 1.0) -> tuple:
    return ("orders", key, {"id": key, "user_id": user, "amount": amount, "ts": at(ms)}, None)


def user(key: str, name: str | None, ms: int) -> tuple:
    """A users version at ``ms`` (its message event time), or a tombstone there for None."""
    return ("users", key, None if name is None else {"id": key, "name": name}, ms)


def gone(key: str, ms: int) -> tuple:
    """An orders tombstone at event time ``ms``."""
    return ("orders", key, None, ms)


def past(ms: int) -> tuple:
    """Both watermarks past ``ms``: a user and an order (of a user of its own) at ``ms`` + 2 s, which wait."""
    return user(f"tick{ms}", "tick", ms + 2000), order(f"tick{ms}", f"tick{ms}", ms + 2000)


def row(key: str, user_id: str, name: str | None, amount: float = 1.0) -> tuple[str, str]:
    return key, json.dumps({"id": key, "user_id": user_id, "name": name, "amount": amount}, separators=(",", ":"))


def ticked(ms: int) -> tuple[str, str]:
    """The row of ``past(ms)``'s order, decided in the step after its own."""
    return row(f"tick{ms}", f"tick{ms}", "tick")


# The first step: ada's name changes at T+5 s between o1 (T+2 s) and o2 (T+6 s); o3 comes before
# u1's first version; bob is deleted at T+4 s, between o4 and o5; u3 never exists.
FIRST = (user("u1", "ada", T + 1000), user("u1", "ADA", T + 5000), user("u2", "bob", T + 3000),
         user("u2", None, T + 4000), order("o1", "u1", T + 2000), order("o2", "u1", T + 6000),
         order("o3", "u1", T + 500), order("o4", "u2", T + 3500), order("o5", "u2", T + 4500),
         order("o6", "u3", T + 2000), *past(T + 10_000))
# Then two late orders (their times below the watermark, T+11 s, when read): o9 after ada's change,
# which u1 still holds (the version current at the horizon is kept), and o7 before it, whose
# version is pruned; o8 on time, after ada's change; o1 deleted; and the first step's tick order,
# which the watermark passes now.
LATER = (order("o7", "u1", T + 2000), order("o9", "u1", T + 7000), order("o8", "u1", T + 14_000, 2.0),
         gone("o1", T + 13_000), *past(T + 20_000))


@dataclass(frozen=True)
class Case:
    name: str
    join: str  # LEFT JOIN or JOIN
    steps: tuple  # ((message, …), (changelog entry, …)) per step
    batching: bool = False  # orders through a batching producer (each step's orders in one entry or few)

    def sql(self) -> str:
        return "\n".join([ORDERS, USERS, OUT, SELECT.format(join=self.join) + ";"])


CASES = [
    Case("left_join", "LEFT JOIN", (
        (FIRST, (row("o1", "u1", "ada"), row("o2", "u1", "ADA"), row("o3", "u1", None), row("o4", "u2", "bob"),
                 row("o5", "u2", None), row("o6", "u3", None))),
        # a late order is joined with the version still held (as Flink's), else LEFT pads it with NULLs
        (LATER, (("o1", ""), row("o7", "u1", None), row("o9", "u1", "ADA"), row("o8", "u1", "ADA", 2.0),
                 ticked(T + 10_000))),
    )),
    Case("inner_join_through_a_batching_producer", "JOIN", (
        (FIRST, (row("o1", "u1", "ada"), row("o2", "u1", "ADA"), row("o4", "u2", "bob"))),
        # INNER joins the late order whose version is still held, and drops the other
        (LATER, (("o1", ""), row("o9", "u1", "ADA"), row("o8", "u1", "ADA", 2.0), ticked(T + 10_000))),
    ), batching=True),
]


@pytest.mark.e2e
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_changelog_of_each_temporal_join(case, settings_factory, broker, spark):
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "out")
    url = broker.service_url

    def send(messages) -> None:
        # orders in one publish (batched when the case says), then users and tombstones with their event times
        rows = [message(key, record) for table, key, record, ms in messages if table == "orders" and ms is None]
        for name in ("users", "orders"):  # in order, one producer per table
            publish_timed(url, topics[name], [(key, message(key, record)[1], ms) for table, key, record, ms in messages
                                              if table == name and ms is not None])
        publish(url, topics["orders"], rows, batching=case.batching)

    (first, first_changes), *later = case.steps
    send(first)  # before the start: one micro-batch
    with Running(settings, build_plan(case.sql(), topics), case.name, spark) as running:
        expected = expect_changelog(running, case.name, url, topics["out"], [(None, first_changes), *later], send)
        current = running.result(settings, case.name)
        query = next(q for q in spark.streams.active if q.name == f"sql-{case.name}")
        # each table's source parses in its read tasks: no Python stage after the read
        assert "MapInArrow" not in query._jsq.streamingQuery().lastExecution().executedPlan().toString()
    table = latest_per_key(expected)
    assert sorted(current, key=lambda r: r["id"]) == [table[k] for k in sorted(table)]


BY_NAME = ("CREATE TABLE by_name (name STRING, orders BIGINT, total DOUBLE, PRIMARY KEY (name) NOT ENFORCED) "
           + WITH.format(name="by_name") + ";")
GROUPED = ("INSERT INTO by_name SELECT u.name, COUNT(*), SUM(o.amount) FROM orders AS o JOIN users "
           "FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id GROUP BY u.name")


@pytest.mark.e2e
def test_group_by_over_a_temporal_join_counts_each_order_in_the_group_of_its_version(settings_factory, broker, spark):
    """Orders per user name as of each order's time (INNER): a name change splits a user's
    orders between its names, a late order joins the version still held, a deleted order leaves
    its group (an emptied group is deleted), and an order without a version is in none."""
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "by_name")
    url = broker.service_url

    def send(messages) -> None:
        for name in ("users", "orders"):
            publish_timed(url, topics[name], [(key, message(key, record)[1], ms) for table, key, record, ms in messages
                                              if table == name and ms is not None])
        publish(url, topics["orders"], [message(key, record) for table, key, record, ms in messages
                                        if table == "orders" and ms is None])

    def group(orders: int, total: float) -> dict:
        return {"orders": orders, "total": total}

    send(FIRST)
    sql = "\n".join([ORDERS, USERS, BY_NAME, GROUPED + ";"])
    tail = TopicTail(url, topics["by_name"])
    with Running(settings, build_plan(sql, topics), "grouped", spark) as running:
        for step, expected in enumerate([
                {"ada": group(1, 1.0), "ADA": group(1, 1.0), "bob": group(1, 1.0)},  # o3, o5, o6: no version
                # o1 deleted (ada emptied), o9 (late, ADA still held) and o8 join ADA; o7's version is pruned
                {"ADA": group(3, 4.0), "bob": group(1, 1.0), "tick": group(1, 1.0)}]):
            if step:
                send(LATER)

            def arrived():
                running.check()
                table = latest_per_key(tail.read())
                return {k: {c: v[c] for c in ("orders", "total")} for k, v in table.items()} == expected

            wait_for(arrived, 240 if step == 0 else 120, what=f"the groups after step {step}")
        current = running.result(settings, "grouped")
    assert {r["name"]: group(r["orders"], r["total"]) for r in current} == expected


NO_WATERMARK = ORDERS.replace("WATERMARK FOR ts AS ts - INTERVAL '1' SECOND, ", "")
REFUSED = [  # (case, orders DDL, users DDL, join, AS OF, the one line)
    ("no watermark on the versioned table", ORDERS, USERS.replace("WATERMARK FOR changed AS changed, ", ""),
     "LEFT JOIN", "o.ts", "table 'users' has no WATERMARK FOR; a temporal join needs one on every table"),
    ("no watermark on the driving table", NO_WATERMARK, USERS, "LEFT JOIN", "o.ts",
     "table 'orders' has no WATERMARK FOR; a temporal join needs one on every table"),
    ("AS OF a column that does not exist", ORDERS, USERS, "LEFT JOIN", "o.created",
     "AS OF 'o.created': table 'orders' has no column 'created'"),
    ("AS OF a column that is not the time attribute", ORDERS, USERS, "LEFT JOIN", "o.amount",
     "AS OF 'o.amount' is not the time attribute of orders; supported: AS OF orders.ts (its WATERMARK FOR column)"),
    ("AS OF the versioned table's time", ORDERS, USERS, "JOIN", "u.changed",
     "AS OF 'u.changed' is not the time attribute of orders"),
    ("ON not the versioned table's key", ORDERS, USERS.replace("PRIMARY KEY (id)", "PRIMARY KEY (name)"), "LEFT JOIN",
     "o.ts", "ON must equate one column of orders with the PRIMARY KEY of users ('name': the key whose versions"),
    ("a watermark of another form", ORDERS, USERS.replace("AS changed,", "AS changed - INTERVAL '1' DAY,"), "JOIN",
     "o.ts", "table 'users': \"WATERMARK FOR changed AS changed - INTERVAL '1' DAY\" is not supported; supported: "
     "WATERMARK FOR col AS col"),
    ("a watermark on a STRING column", ORDERS, USERS.replace("FOR changed AS changed", "FOR name AS name"), "JOIN",
     "o.ts", "table 'users': 'WATERMARK FOR name AS name' is on column 'name' (STRING); supported: WATERMARK FOR"),
    ("a TIMESTAMP(3) column read outside a temporal join", ORDERS, USERS, "LEFT JOIN", None,
     "table 'orders' column 'ts' is TIMESTAMP(3), read only in a temporal join"),
]


@pytest.mark.parametrize("orders, users, join, as_of, error", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_at_check(orders, users, join, as_of, error):
    select = SELECT.format(join=join)
    # without AS OF, the query reads the TIMESTAMP(3) column (one that is not read may be there)
    select = select.replace("o.ts", as_of) if as_of else (select.replace(" FOR SYSTEM_TIME AS OF o.ts", "")
                                                         .replace("o.amount FROM", "o.ts FROM"))
    with pytest.raises(UnsupportedSql, match=re.escape(error)):
        build_plan("\n".join([orders, users, OUT, select + ";"]))


def test_a_rows_time_is_its_time_attribute_a_tombstones_its_message_time_and_none_makes_a_dead_letter():
    from pipeline.sql.temporal_stream import decide_times, time_specs

    times = time_specs(build_plan(CASES[0].sql()))
    base = {"key": "o1", "side": 0, "op": "upsert", "published_ms": T + 9000, "payload": None, "error": None}
    timed = decide_times(times, dict(base, s0_ts="2023-11-14 22:13:22.500"), {"event_time": None, "value": b"{}"})
    assert timed["event_ms"] == T + 2500 and timed["kind"] == "orders"
    iso = decide_times(times, dict(base, s0_ts="2023-11-14T23:13:22.500+01:00"), {"event_time": None, "value": b"{}"})
    assert iso["event_ms"] == T + 2500
    # a tombstone has no payload: its message's event time, else its publish time
    assert decide_times(times, dict(base, op="delete"), {"event_time": T + 7000, "value": b""})["event_ms"] == T + 7000
    assert decide_times(times, dict(base, op="delete"), {"event_time": None, "value": b""})["event_ms"] == T + 9000
    unread = decide_times(times, dict(base, s0_ts="yesterday"), {"event_time": None, "value": b'{"ts":"yesterday"}'})
    assert (unread["op"], unread["payload"]) == ("dead", '{"ts":"yesterday"}')
    assert unread["error"] == ("table 'orders' column 'ts': expected TIMESTAMP(3) text such as "
                               "'2024-05-01 12:00:00.000', got 'yesterday'")
    versioned = dict(base, side=1, key="u1", s1_changed=None)
    assert decide_times(times, versioned, {"event_time": None, "value": b"{}"})["error"] == (
        "table 'users': its time attribute 'changed' is NULL; a temporal join places each row at its time")


def test_the_sources_parse_step_makes_each_message_one_row_and_an_unreadable_time_a_dead_letter():
    import pyarrow as pa

    from pipeline.source.options import load_transform
    from pipeline.sql.temporal_stream import PARSE_TRANSFORM, timed_parser_args

    # as the read tasks run it: the source's transform option, its arguments through JSON
    parse = load_transform(PARSE_TRANSFORM, json.dumps(timed_parser_args(build_plan(CASES[0].sql()))))
    source = pa.RecordBatch.from_pylist([
        {"kind": "orders", "key": key, "value": value, "partition": -1, "position": n, "topic": "orders",
         "message_id": f"1:{n}:-1", "publish_time": None, "event_time": T, "watermark_bound": T + 1000}
        for n, (key, value) in enumerate([("o1", b'{"id":"o1","ts":"2023-11-14 22:13:22.500"}'),
                                          ("o2", b'{"id":"o2","ts":"yesterday"}'), ("o3", b"")])])
    [parsed] = list(parse(iter([source])))
    rows = parsed.to_pylist()
    assert [(r["key"], r["op"], r["event_ms"]) for r in rows] == [("o1", "upsert", T + 2500), ("o2", "dead", None),
                                                                  ("o3", "delete", T)]
    assert [r["watermark_bound"] for r in rows] == [T + 1000] * 3  # the source's, from the table's clock
    assert rows[1]["s0_ts"] is None and rows[1]["payload"] == '{"id":"o2","ts":"yesterday"}'


def test_the_example_passes_check_and_its_samples_are_its_tables():
    from pipeline.cli import main
    from pipeline.sql.launch import describe_joins
    from pipeline.sql.samples import load_samples
    from sqlhelp import SQL_DIR

    path = SQL_DIR / "orders_with_user_as_of.sql"
    plan = build_plan(path.read_text())
    assert [(j.join_column, j.inner) for j in plan.temporal.joins] == [("user_id", False)]
    assert [t.watermark for t in plan.sides] == [("order_time", 5000), ("updated_at", 0)]
    assert len(load_samples(SQL_DIR / "orders_with_user_as_of.messages.jsonl", plan)) == 9
    assert main(["--data-dir", "/tmp/unused-sql-cli", "sql", str(path), "--check"]) == 0
    assert describe_joins(plan) == [
        "temporal join (LEFT): orders.user_id = user_profiles.id AS OF orders.order_time (VersionedLookup, event "
        "time): each orders row gets the user_profiles version current at its order_time, sent once both tables' "
        "watermarks have passed it"]


def test_a_progress_row_has_the_topics_of_each_tables_source():
    from pipeline.sql.progress import build_sql_progress_row

    def offset(topic: str, n: int) -> str:
        return json.dumps({topic: {"gen": 0, "parts": {"-1": {"n": n}}}})

    sources = [{"startOffset": offset(t, 1), "endOffset": offset(t, n), "latestOffset": offset(t, n + 2)}
               for t, n in (("orders", 4), ("users", 6))]
    progress = {"timestamp": "2026-11-26T12:00:00.000Z", "batchId": 3, "numInputRows": 8, "sources": sources,
                "observedMetrics": {"source_rows": {"orders/-1": 3, "users/-1": 5}}}
    row = build_sql_progress_row(progress, {"result": 2})
    assert [(t["topic"], t["rows"], t["backlog"]) for t in row["topics"]] == [("orders", 3, 2), ("users", 5, 2)]
    assert row["lag"] == 4
