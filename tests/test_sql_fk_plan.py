"""Foreign-key joins at --check and in the sink step (no Spark): what is planned, what is refused in
one line, and how a batch's before and after rows become what the topic gets (sink.py
resolve_changes, shared with every join and HAVING)."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from pipeline.errors import SinkError
from pipeline.sql.foreign_key import foreign_key_fingerprint
from pipeline.sql.plan import UnsupportedSql, build_plan
from pipeline.sql.runner import plan_fingerprint
from pipeline.sql.sink import build_messages, build_result, resolve_changes

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""
TABLES = "\n".join([
    TABLE.format(name="users", columns="uid STRING, accountId STRING, region INT, score DOUBLE", key="uid"),
    TABLE.format(name="accounts", columns="id STRING, name STRING", key="id"),
    TABLE.format(name="colors", columns="userUid STRING, color STRING", key="userUid"),
    TABLE.format(name="out", columns="uid STRING, account STRING", key="uid"),
])


def plan_of(insert: str, before: str = ""):
    return build_plan(f"{before}{TABLES}\n{insert};")


def test_a_join_on_a_driving_column_to_a_primary_key_is_a_foreign_key_join_either_way_round():
    left = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u LEFT JOIN accounts a ON a.id = u.accountId")
    inner = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id")
    assert (left.foreign_key, left.inner, left.where_joined) == ("accountId", (), None)
    # the operator decides "the referenced row is there" itself: no present1 filter on the joined rows
    assert (inner.foreign_key, inner.inner, inner.where_joined) == ("accountId", (1,), None)
    assert (0, "accountId") in inner.reads
    # a key join stays a key join, with another fingerprint
    keyed = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.uid = a.id")
    assert keyed.foreign_key is None and plan_fingerprint(keyed) != plan_fingerprint(inner)


@pytest.mark.parametrize("insert, message", [
    ("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.name",
     "ON must equate a column of users with accounts.id; supported: JOINs on the driving table's primary key"),
    ("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.score = a.id",
     "users.score is DOUBLE but accounts.id is STRING; supported: a foreign key of the referenced key's type"),
    # in a chain: the ON of a later JOIN equates a column of a table before it with the joined table's key
    ("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id "
     "LEFT JOIN colors c ON a.id = u.accountId",
     "ON must equate a column of users or accounts with colors.userUid; supported: JOINs on the driving table's "
     "primary key or on a foreign key of it or of a table joined before"),
    ("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id "
     "LEFT JOIN colors c ON a.name = c.color",
     "ON must equate a column of users or accounts with colors.userUid"),
])
def test_what_a_foreign_key_join_does_not_run_with_is_refused_in_one_line(insert, message):
    with pytest.raises(UnsupportedSql, match=re.escape(message)) as caught:
        plan_of(insert)
    assert "\n" not in str(caught.value)


def test_where_on_a_foreign_key_joins_referenced_table_runs_on_the_joined_rows():
    plan = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u LEFT JOIN accounts a ON u.accountId = a.id "
                   "WHERE u.region > 0 AND a.name <> 'x'")
    assert (plan.foreign_key, plan.where, plan.where_joined) == ("accountId", "(`s0_region` > 0)", "(`s1_name` <> 'x')")


def test_group_by_over_a_foreign_key_join_groups_the_joined_rows():
    plan = plan_of("INSERT INTO out SELECT COALESCE(a.name, 'none'), CAST(COUNT(*) AS STRING) FROM users u "
                   "LEFT JOIN accounts a ON u.accountId = a.id GROUP BY COALESCE(a.name, 'none')")
    assert (plan.kind, plan.foreign_key, plan.derived_on_joined_rows) == ("aggregate", "accountId", True)


def test_a_foreign_key_join_with_a_state_ttl_is_planned_and_ttl_on_or_off_is_another_layout():
    insert = "INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id"
    ttl = plan_of(insert, "SET 'table.exec.state.ttl' = '1 h';\n")
    assert ttl.settings == (("table.exec.state.ttl", "1 h"),) and ttl.foreign_keys == ((1, 0, "accountId"),)
    # a checkpoint written without a TTL is refused with one (runner.py check_checkpoint); its length may change
    assert plan_fingerprint(ttl) != plan_fingerprint(plan_of(insert))
    assert plan_fingerprint(ttl) == plan_fingerprint(plan_of(insert, "SET 'table.exec.state.ttl' = '2 h';\n"))


CHAIN_TABLES = "\n".join([
    TABLE.format(name="orders", columns="oid STRING, userId STRING, amount INT", key="oid"),
    TABLE.format(name="shipments", columns="orderId STRING, carrier STRING", key="orderId"),
    TABLE.format(name="sent", columns="oid STRING, user STRING, account STRING, carrier STRING", key="oid"),
])


def chain_of(joins: str, where: str = ""):
    return build_plan(f"{TABLES}\n{CHAIN_TABLES}\nINSERT INTO sent SELECT o.oid, u.uid, a.name, s.carrier "
                      f"FROM orders o {joins}{where};")


def test_an_n_way_chain_plans_one_foreign_key_join_each_after_the_joins_on_the_driving_key():
    # orders -> users (a foreign key) -> accounts (a foreign key of users), and shipments on the order's key
    plan = chain_of("JOIN users u ON o.userId = u.uid LEFT JOIN accounts a ON u.accountId = a.id "
                    "JOIN shipments s ON s.orderId = o.oid")
    assert plan.foreign_keys == ((1, 0, "userId"), (2, 1, "accountId"))
    assert (plan.foreign_key, plan.inner) == ("userId", (1, 3))
    # the join on the driving key keeps UpsertJoin's "its side has a row"; ForeignKeyJoin decides the others'
    assert plan.where_joined == "`present3`"
    assert {(0, "userId"), (1, "accountId")} <= set(plan.reads)
    # a lone foreign-key join keeps the fingerprint it had before chains; a chain has its own
    lone = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id")
    assert foreign_key_fingerprint(lone) == ["foreign key", "accountId"]
    assert foreign_key_fingerprint(plan) == ["foreign keys", [[1, 0, "userId"], [2, 1, "accountId"]], [1, 3]]
    other = chain_of("JOIN users u ON o.userId = u.uid JOIN accounts a ON u.accountId = a.id "
                     "JOIN shipments s ON s.orderId = o.oid")
    assert plan_fingerprint(other) != plan_fingerprint(plan)  # an inner side's state holds its present column


def test_where_over_a_chain_runs_its_joined_tables_conditions_on_the_joined_rows():
    plan = chain_of("LEFT JOIN users u ON o.userId = u.uid LEFT JOIN accounts a ON u.accountId = a.id "
                    "LEFT JOIN shipments s ON o.oid = s.orderId", " WHERE o.amount > 1 AND a.name <> 'x'")
    assert (plan.where, plan.where_joined, plan.inner) == ("(`s0_amount` > 1)", "(`s2_name` <> 'x')", ())


def batch(*rows: tuple[str, str, str | None]) -> pa.Table:
    """ForeignKeyJoin's output rows: (driving key, op, account name)."""
    return pa.table({"key": [r[0] for r in rows], "op": [r[1] for r in rows], "s0_uid": [r[0] for r in rows],
                     "s1_name": [r[2] for r in rows]})


@pytest.mark.parametrize("rows", [
    (("u1", "before", "Acme"), ("u1", "after", "Beta"), ("u2", "before", "Acme"), ("u3", "dead", None)),
    (("u1", "after", "Beta"), ("u1", "before", "Acme"), ("u2", "before", "Acme"), ("u3", "dead", None)),
], ids=["old_row_first", "new_row_first"])
def test_a_moved_rows_new_row_wins_over_its_old_one_in_either_order(rows):
    resolved = resolve_changes(batch(*rows))
    ops = sorted(zip(resolved["key"].to_pylist(), resolved["op"].to_pylist()))
    assert ops == [("u1", "after"), ("u1", "skip"), ("u2", "delete"), ("u3", "dead")]
    plan = plan_of("INSERT INTO out SELECT u.uid, a.name FROM users u JOIN accounts a ON u.accountId = a.id")
    result = build_result(plan, batch(*rows), batch_id=7, now_ms=0)
    assert sorted(build_messages(plan, result)) == [("u1", b'{"uid":"u1","account":"Beta"}'), ("u2", b"")]


# (key, op, _pass) rows of one batch -> (key, op) as resolved; _pass None: the column is absent
RESOLVED = [
    ("a moved foreign key: before from the old value, after from the new",
     [("u1", "before", None), ("u1", "after", None)], [("u1", "skip"), ("u1", "after")]),
    ("a foreign key's referenced row gone under an inner join: before alone",
     [("u1", "before", None)], [("u1", "delete")]),
    ("a key join without emitBefore: after and delete as they are",
     [("u1", "after", None), ("u2", "delete", None)], [("u1", "after"), ("u2", "delete")]),
    ("WHERE on a joined table: a row that stops passing is retracted",
     [("u1", "before", True), ("u1", "after", False)], [("u1", "delete"), ("u1", "skip")]),
    ("a row that starts passing is sent, one that never passed sends nothing",
     [("u1", "after", True), ("u1", "before", False), ("u2", "before", False), ("u2", "after", False)],
     [("u1", "after"), ("u1", "skip"), ("u2", "skip"), ("u2", "skip")]),
    ("a driving row's delete is sent once if its row was sent, and not at all otherwise",
     [("u1", "before", True), ("u1", "delete", False), ("u2", "before", False), ("u2", "delete", False)],
     [("u1", "delete"), ("u1", "skip"), ("u2", "skip"), ("u2", "skip")]),
    ("a foreign-key row whose referenced row stops passing, then a new row that passes",
     [("u1", "before", True), ("u2", "after", True), ("u3", "dead", False)],
     [("u1", "delete"), ("u2", "after"), ("u3", "dead")]),
]


@pytest.mark.parametrize("rows, resolved", [(r, o) for _, r, o in RESOLVED], ids=[n for n, _, _ in RESOLVED])
def test_one_mechanism_turns_each_operators_before_and_after_into_what_the_topic_gets(rows, resolved):
    table = pa.table({"key": [r[0] for r in rows], "op": [r[1] for r in rows]})
    if any(r[2] is not None for r in rows):
        table = table.append_column("_pass", pa.array([r[2] for r in rows], pa.bool_()))
    out = resolve_changes(table)
    assert list(zip(out["key"].to_pylist(), out["op"].to_pylist())) == resolved


def test_an_op_the_pipeline_should_have_consumed_fails_the_batch_naming_it():
    # an expire row (a TTL'd group) is dropped in pipeline/sql/runner.py; the sink does not drop it again
    plan = plan_of("INSERT INTO out SELECT uid, CAST(COUNT(*) AS STRING) FROM users GROUP BY uid")
    rows = pa.table({"key": ["m1"], "op": ["expire"], "s0_uid": ["u1"], "agg1": [3]})
    with pytest.raises(SinkError, match=re.escape("INSERT INTO out: the operators emitted op 'expire', which the "
                                                  "sink does not send")):
        build_result(plan, rows, batch_id=1, now_ms=0)


def test_check_says_it_plans_a_foreign_key_join(capsys, tmp_path):
    from pipeline.cli import main
    from sqlhelp import SQL_DIR

    code = main(["--data-dir", str(tmp_path), "sql", str(SQL_DIR / "users_with_their_account.sql"), "--check"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].startswith("users_with_their_account: join of users <- ")
    assert lines[1] == ("  foreign-key join (LEFT): users.accountId = accounts.id, keyed by the foreign key value "
                        "(ForeignKeyJoin): a changed accounts row updates the users rows referencing it")


def test_check_says_it_plans_one_foreign_key_join_each_in_a_chain(capsys, tmp_path):
    from pipeline.cli import main
    from sqlhelp import SQL_DIR

    code = main(["--data-dir", str(tmp_path), "sql", str(SQL_DIR / "orders_with_user_and_account.sql"), "--check"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert [line for line in lines if "foreign-key join" in line] == [
        "  foreign-key join (INNER): orders.userId = users.uid, keyed by the foreign key value (ForeignKeyJoin): "
        "a changed users row updates the orders rows referencing it",
        "  foreign-key join (LEFT): users.accountId = accounts.id, keyed by the foreign key value (ForeignKeyJoin): "
        "a changed accounts row updates the users rows referencing it"]
