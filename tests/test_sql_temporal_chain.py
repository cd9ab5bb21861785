"""Temporal joins one after another: each order with its user and its item as of its time, as the
job's event time enriches it, written as Flink SQL users write it::

    … FROM orders AS o LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id
                       JOIN items FOR SYSTEM_TIME AS OF o.ts AS i ON o.item_id = i.id

End to end as tests/test_sql_temporal.py's cases: the exact changelog each step adds to the
upsert topic, then the current result; and the chains refused at ``--check`` with their one line.
"""

from __future__ import annotations

import json
import re

import pytest

from factories import publish, publish_timed
from pipeline.sql.plan import build_plan
from pipeline.sql.sqltypes import UnsupportedSql
from sqlhelp import Running, TopicTail, expect_changelog, fresh_topics, latest_per_key, message
from waiting import wait_for
from test_sql_temporal import ORDERS as TEMPORAL_ORDERS
from test_sql_temporal import T, USERS, WITH, at, user

# the single join's tables (tests/test_sql_temporal.py), orders with an item, and items versioned as users are
ORDERS = TEMPORAL_ORDERS.replace("user_id STRING,", "user_id STRING, item_id STRING,")
ITEMS = USERS.replace("TABLE users (id STRING, name STRING", "TABLE items (id STRING, price DOUBLE").replace("/users'", "/items'")
OUT = ("CREATE TABLE out (id STRING, name STRING, price DOUBLE, amount DOUBLE, PRIMARY KEY (id) NOT ENFORCED) "
       + WITH.format(name="out") + ";")
CHAIN = ("INSERT INTO out SELECT o.id, u.name, i.price, o.amount FROM orders AS o "
         "LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id "
         "JOIN items FOR SYSTEM_TIME AS OF o.ts AS i ON o.item_id = i.id")


def order(key: str, user_id: str, item_id: str, ms: int, amount: float = 1.0) -> tuple:
    return ("orders", key, {"id": key, "user_id": user_id, "item_id": item_id, "amount": amount, "ts": at(ms)}, None)


def item(key: str, price: float | None, ms: int) -> tuple:
    """An items version at ``ms`` (its message event time), or a tombstone there for None."""
    return ("items", key, None if price is None else {"id": key, "price": price}, ms)


def past(ms: int) -> tuple:
    """Every table's watermark past ``ms``: a user, an item and an order of theirs at ``ms`` + 2 s, which waits."""
    return (user(f"tick{ms}", "tick", ms + 2000), item(f"tick{ms}", 0.5, ms + 2000),
            order(f"tick{ms}", f"tick{ms}", f"tick{ms}", ms + 2000))


def row(key: str, name: str | None, price: float, amount: float = 1.0) -> tuple[str, str]:
    return key, json.dumps({"id": key, "name": name, "price": price, "amount": amount}, separators=(",", ":"))


# ada is renamed at T+5 s; item i1 costs 10 from T+1 s and 12 from T+4 s; i2 costs 7 from
# T+0.5 s until its tombstone at T+3 s; user u9 never exists.
FIRST = (user("u1", "ada", T + 1000), user("u1", "ADA", T + 5000), item("i1", 10.0, T + 1000),
         item("i1", 12.0, T + 4000), item("i2", 7.0, T + 500), item("i2", None, T + 3000),
         order("o1", "u1", "i1", T + 2000), order("o2", "u1", "i1", T + 6000), order("o3", "u1", "i2", T + 2000),
         order("o4", "u1", "i2", T + 3500), order("o5", "u9", "i1", T + 4500), *past(T + 10_000))
# Then i1's price changes at T+13 s; o6 is late (T+7 s, below the watermark of T+11 s when read)
# and joins the versions still held then (ADA, 12); o7 is on time after the change; o2 is deleted.
LATER = (item("i1", 15.0, T + 13_000), order("o6", "u1", "i1", T + 7000), order("o7", "u1", "i1", T + 14_000, 2.0),
         ("orders", "o2", None, T + 13_000), *past(T + 20_000))
STEPS = (
    # o3 joins i2 before its tombstone; o4, after it, has no item: INNER drops it; u9 pads with NULL (LEFT)
    (FIRST, (row("o1", "ada", 10.0), row("o2", "ADA", 12.0), row("o3", "ada", 7.0), row("o5", None, 12.0))),
    (LATER, (("o2", ""), row("o6", "ADA", 12.0), row("o7", "ADA", 15.0, 2.0), row("tick1700000010000", "tick", 0.5))),
)


@pytest.mark.e2e
@pytest.mark.parametrize("batching", [False, True], ids=["unbatched", "batched"])
def test_an_order_joins_its_user_and_its_item_each_as_of_its_time(batching, settings_factory, broker, spark):
    """Published as pulsar-client's defaults do (one message an entry), and several to an entry."""
    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "items", "out")
    url = broker.service_url

    def send(messages) -> None:
        for name in ("users", "items", "orders"):  # in order, one producer per table, each with its event times
            publish_timed(url, topics[name], [(key, message(key, record)[1], ms) for table, key, record, ms in messages
                                              if table == name and ms is not None], batching=batching)
        publish(url, topics["orders"], [message(key, record) for table, key, record, ms in messages
                                        if table == "orders" and ms is None], batching=batching)

    (first, first_changes), *later = STEPS
    send(first)
    plan = build_plan("\n".join([ORDERS, USERS, ITEMS, OUT, CHAIN + ";"]), topics)
    with Running(settings, plan, "chain", spark) as running:
        expected = expect_changelog(running, "chain", url, topics["out"], [(None, first_changes), *later], send)
        current = running.result(settings, "chain")
    table = latest_per_key(expected)
    assert sorted(current, key=lambda r: r["id"]) == [table[k] for k in sorted(table)]


def test_the_chain_is_planned_as_a_lookup_per_versioned_table():
    from pipeline.sql.launch import describe_joins

    plan = build_plan("\n".join([ORDERS, USERS, ITEMS, OUT, CHAIN + ";"]))
    assert [t.name for t in plan.sides] == ["orders", "users", "items"]
    assert [(j.side, j.join_column, j.time, j.inner) for j in plan.temporal.joins] == [
        (1, "user_id", "changed", False), (2, "item_id", "changed", True)]
    assert [line.split(" (VersionedLookup")[0] for line in describe_joins(plan)] == [
        "temporal join (LEFT): orders.user_id = users.id AS OF orders.ts",
        "temporal join (INNER): orders.item_id = items.id AS OF orders.ts"]
    assert all(line.endswith("sent once all 3 tables' watermarks have passed it") for line in describe_joins(plan))


REGULAR = "JOIN items AS i ON o.item_id = i.id"
REFUSED = [  # (case, the JOINs after FROM orders AS o, the one line)
    ("a regular JOIN after a temporal join", "LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id "
     + REGULAR, "'JOIN items AS i ON o.item_id = i.id': a regular JOIN beside a temporal join is not supported"),
    ("a temporal join after a regular JOIN", REGULAR + " LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON "
     "o.user_id = u.id", "FOR SYSTEM_TIME AS OF on a JOIN after a regular JOIN is not supported"),
    ("one table joined twice", "LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id LEFT JOIN users "
     "FOR SYSTEM_TIME AS OF o.ts AS v ON o.item_id = v.id", "table 'users' is joined twice; supported: each table once"),
    ("ON a column of the first versioned table", "LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id "
     "JOIN items FOR SYSTEM_TIME AS OF o.ts AS i ON u.name = i.id",
     "ON must equate one column of orders with the PRIMARY KEY of items"),
    ("AS OF the first versioned table's time", "LEFT JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id "
     "JOIN items FOR SYSTEM_TIME AS OF u.changed AS i ON o.item_id = i.id",
     "AS OF 'u.changed' is not the time attribute of orders"),
]


@pytest.mark.parametrize("joins, error", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_at_check(joins, error):
    select = f"INSERT INTO out SELECT o.id, 'x', 1.0, o.amount FROM orders AS o {joins};"
    with pytest.raises(UnsupportedSql, match=re.escape(error)):
        build_plan("\n".join([ORDERS, USERS, ITEMS, OUT, select]))


def test_the_example_passes_check_and_its_samples_are_its_tables():
    from pipeline.cli import main
    from pipeline.sql.samples import load_samples
    from sqlhelp import SQL_DIR

    path = SQL_DIR / "orders_with_user_and_item_as_of.sql"
    plan = build_plan(path.read_text())
    assert [(t.name, t.watermark) for t in plan.sides] == [
        ("orders", ("order_time", 5000)), ("user_profiles", ("updated_at", 0)), ("item_prices", ("updated_at", 0))]
    assert [(j.join_column, j.inner) for j in plan.temporal.joins] == [("user_id", False), ("item_id", True)]
    assert len(load_samples(SQL_DIR / "orders_with_user_and_item_as_of.messages.jsonl", plan)) == 13
    assert main(["--data-dir", "/tmp/unused-sql-cli", "sql", str(path), "--check"]) == 0


PER_USER = ("CREATE TABLE orders_per_user (user_id STRING, orders BIGINT, PRIMARY KEY (user_id) NOT ENFORCED) "
            + WITH.format(name="orders_per_user") + ";")
COUNT = "INSERT INTO orders_per_user SELECT o.user_id, COUNT(*) FROM orders AS o GROUP BY o.user_id"
STATEMENT_SET = "\n".join([ORDERS, USERS, ITEMS, OUT, PER_USER, "EXECUTE STATEMENT SET BEGIN", CHAIN + ";", COUNT + ";",
                           "END;"])


@pytest.mark.e2e
def test_a_statement_set_runs_the_chain_beside_a_count_of_the_same_orders(settings_factory, broker, spark):
    """One query: the chain reads its tables in sources of its own (a watermark each), the count
    reads the orders in the set's shared read; each INSERT's changelog is its own, and the chain's
    clock follows its own sources, not the shared read of the same orders."""
    from pipeline.sql.script import build_pipeline

    settings = settings_factory(job__restart__delay="3s")
    topics = fresh_topics("orders", "users", "items", "out", "orders_per_user")
    url = broker.service_url
    for name in ("users", "items", "orders"):
        publish_timed(url, topics[name], [(key, message(key, record)[1], ms) for table, key, record, ms in FIRST
                                          if table == name and ms is not None])
    publish(url, topics["orders"], [message(key, record) for table, key, record, ms in FIRST
                                    if table == "orders" and ms is None])
    plans = build_pipeline(STATEMENT_SET, topics)
    assert [plan.temporal is not None for plan in plans] == [True, False]
    out_tail, counts_tail = TopicTail(url, topics["out"]), TopicTail(url, topics["orders_per_user"])
    with Running(settings, plans, "chain-set", spark) as running:
        def arrived():
            running.check()
            out, counts = latest_per_key(out_tail.read()), latest_per_key(counts_tail.read())
            return len(out) >= 4 and counts.get("u1", {}).get("orders") == 4 and (out, counts)

        out, counts = wait_for(arrived, 240, what="the chain's first rows and the counts")
    from sqlhelp import sink_rows

    assert sink_rows(settings, "chain-set", "dead_letter") == []  # the count's envelope takes the orders' TIMESTAMP(3) text
    assert out == latest_per_key(list(STEPS[0][1]))  # the chain's first step, as alone
    assert counts == {"u1": {"user_id": "u1", "orders": 4}, "u9": {"user_id": "u9", "orders": 1},
                      "tick1700000010000": {"user_id": "tick1700000010000", "orders": 1}}


def test_two_temporal_joins_in_one_statement_set_are_refused_in_one_line():
    from pipeline.sql.script import build_pipeline

    other = CHAIN.replace("INSERT INTO out", "INSERT INTO out2")
    out2 = OUT.replace("TABLE out ", "TABLE out2 ").replace("/out'", "/out2'")
    with pytest.raises(UnsupportedSql, match=re.escape("2 INSERTs with a temporal join (FOR SYSTEM_TIME AS OF) in one "
                                                       "statement set (into out, out2); supported: one per set")):
        build_pipeline("\n".join([ORDERS, USERS, ITEMS, OUT, out2, CHAIN + ";", other + ";"]))
