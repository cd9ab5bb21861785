"""Scripts of several statements, planned (pure): views inlined, statement sets, SET, and their refusals."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeline.sql.plan import UnsupportedSql, build_plan
from pipeline.sql.runner import plan_fingerprint
from pipeline.sql.script import build_pipeline
from pipeline.sql.settings import duration_ms, state_ttl_ms

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""
USERS = TABLE.format(name="users", columns="uid STRING, accountId STRING, id INT, score DOUBLE", key="uid")
COLORS = TABLE.format(name="colors", columns="userUid STRING, color STRING", key="userUid")
OUT = TABLE.format(name="out", columns="k STRING, n BIGINT, c STRING", key="k")
COUNTS = TABLE.format(name="counts", columns="accountId STRING, n BIGINT", key="accountId")


def test_a_view_is_inlined_into_the_query_that_reads_it():
    plan = build_plan(f"""{USERS}\n{OUT}
        CREATE TEMPORARY VIEW active (uid, account, tenfold) AS SELECT uid, UPPER(accountId), id * 10 FROM users WHERE id > 0;
        INSERT INTO out SELECT uid, tenfold, account || '!' FROM active WHERE tenfold < 100;""")
    assert plan.kind == "join" and [t.name for t in plan.sides] == ["users"]
    assert plan.where == "((`s0_id` > 0) AND (try_multiply(`s0_id`, 10) < 100))"
    assert [o.expression for o in plan.outputs] == [None, "try_multiply(`s0_id`, 10)", "concat(upper(`s0_accountId`), '!')"]
    assert len(plan.statements) == 4  # the view's text is shown with the others


def test_a_view_of_a_view_of_a_join_and_a_group_by_over_a_view():
    plan = build_plan(f"""{USERS}\n{COLORS}\n{COUNTS}
        CREATE VIEW colored AS SELECT u.uid, u.accountId AS acc, c.color FROM users u LEFT JOIN colors c ON u.uid = c.userUid;
        CREATE VIEW red AS SELECT uid, acc FROM colored WHERE color = 'red';
        INSERT INTO counts SELECT uid, 1 FROM red;""")
    assert [t.name for t in plan.sides] == ["users", "colors"] and plan.where_joined == "(`s1_color` = 'red')"
    grouped = build_plan(f"""{USERS}\n{COUNTS}
        CREATE VIEW positive AS SELECT accountId, id FROM users WHERE id > 0;
        INSERT INTO counts SELECT accountId, COUNT(*) FROM positive GROUP BY accountId;""")
    assert grouped.kind == "aggregate" and grouped.where == "(`s0_id` > 0)" and grouped.group_by == ("accountId",)


def test_group_by_over_a_view_of_a_join_groups_the_joined_rows():
    plan = build_plan(f"""{USERS}\n{COLORS}\n{COUNTS}
        CREATE VIEW colored AS SELECT u.uid, u.accountId AS acc, c.color FROM users u LEFT JOIN colors c ON u.uid = c.userUid;
        INSERT INTO counts SELECT COALESCE(color, 'none'), COUNT(*) FROM colored GROUP BY COALESCE(color, 'none');""")
    assert plan.kind == "aggregate" and plan.derived_on_joined_rows
    assert [d.sql for d in plan.derived] == ["coalesce(`s1_color`, 'none')"] and plan.group_fields == ("d0",)


def test_where_over_an_aggregating_view_is_its_having():
    plan = build_plan(f"""{USERS}\n{COUNTS}
        CREATE VIEW sizes AS SELECT accountId, COUNT(*) AS users FROM users GROUP BY accountId;
        INSERT INTO counts SELECT accountId, users FROM sizes WHERE users >= 2;""")
    assert plan.kind == "aggregate" and plan.having == "(`agg1` >= 2)"


def test_several_inserts_and_statement_sets_plan_one_pipeline_each():
    inserts = f"""INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;
        INSERT INTO out SELECT uid, id, accountId FROM users;"""
    for script in (f"{USERS}\n{COUNTS}\n{OUT}\n{inserts}",
                   f"{USERS}\n{COUNTS}\n{OUT}\nEXECUTE STATEMENT SET BEGIN\n{inserts}\nEND;",
                   f"{USERS}\n{COUNTS}\n{OUT}\nBEGIN STATEMENT SET;\n{inserts}\nEND;"):
        plans = build_pipeline(script)
        assert [(p.kind, p.target.name) for p in plans] == [("aggregate", "counts"), ("join", "out")]
    with pytest.raises(UnsupportedSql, match=re.escape("2 INSERT INTO statements where one plan is asked for")):
        build_plan(f"{USERS}\n{COUNTS}\n{OUT}\n{inserts}")


def test_set_state_ttl_is_read_as_flinks_durations_and_reaches_the_plan():
    plan = build_plan(f"{USERS}\n{COUNTS}\nSET 'table.exec.state.ttl' = '0 ms';\n"
                      "INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;")
    assert plan.settings == (("table.exec.state.ttl", "0 ms"),)
    assert state_ttl_ms(plan.settings) == 0
    assert [duration_ms(t) for t in ("1 h", "1d", "500 ms", "2000", "10 s", "3 minutes")] == [
        3_600_000, 86_400_000, 500, 2000, 10_000, 180_000]
    timed = build_plan(f"{USERS}\n{COUNTS}\nSET 'table.exec.state.ttl' = '90 min';\n"
                       "INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;")
    assert state_ttl_ms(timed.settings) == 5_400_000
    # TTL'd state is another state layout: a checkpoint written without a TTL is refused with one
    assert plan_fingerprint(timed) != plan_fingerprint(plan)
    assert plan_fingerprint(dataclasses.replace(timed, settings=(("table.exec.state.ttl", "2 h"),))) == \
        plan_fingerprint(timed)
    with pytest.raises(UnsupportedSql, match=re.escape("SET 'table.exec.state.ttl' = '1 hour ago' is not a duration")):
        build_plan(f"{USERS}\n{COUNTS}\nSET 'table.exec.state.ttl' = '1 hour ago';\n"
                   "INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;")
    with pytest.raises(UnsupportedSql, match=re.escape("SET 'table.exec.state.ttl' = '9999999 d' is too long")):
        build_plan(f"{USERS}\n{COUNTS}\nSET 'table.exec.state.ttl' = '9999999 d';\n"
                   "INSERT INTO counts SELECT accountId, COUNT(*) FROM users GROUP BY accountId;")


@pytest.mark.parametrize("statements, message", [
    ("CREATE VIEW v AS SELECT * FROM users; INSERT INTO counts SELECT uid, 1 FROM v",
     "CREATE VIEW v: SELECT * is not supported"),
    ("CREATE VIEW v AS SELECT accountId FROM users; INSERT INTO counts SELECT accountId, COUNT(id) FROM v GROUP BY accountId",
     "'id': view 'v' has no column 'id'; its columns are ['accountId']"),
    ("CREATE VIEW v AS SELECT accountId, COUNT(*) AS n FROM users GROUP BY accountId; "
     "INSERT INTO counts SELECT accountId, COUNT(*) FROM v GROUP BY accountId",
     "GROUP BY over view 'v', which has GROUP BY, is not supported"),
    ("CREATE VIEW users AS SELECT uid FROM users; INSERT INTO counts SELECT uid, 1 FROM users",
     "CREATE VIEW users: a table or view named 'users' exists already"),
    ("CREATE VIEW v AS SELECT uid FROM users ORDER BY uid; INSERT INTO counts SELECT uid, 1 FROM v",
     "ORDER BY is not supported in CREATE VIEW v"),
    ("CREATE VIEW v AS SELECT uid, id + 1 FROM users; INSERT INTO counts SELECT uid, 1 FROM v",
     "CREATE VIEW v: column 'id + 1' has no name; name it with AS"),
    ("EXECUTE STATEMENT SET BEGIN INSERT INTO counts SELECT uid, 1 FROM users;", "EXECUTE STATEMENT SET BEGIN has no END"),
    ("EXECUTE STATEMENT SET BEGIN CREATE VIEW v AS SELECT uid FROM users; END",
     "statement CREATE inside EXECUTE STATEMENT SET is not supported; supported there: INSERT INTO"),
    ("SET 'table.exec.state.ttl' = 'soon'; INSERT INTO counts SELECT uid, 1 FROM users",
     "SET 'table.exec.state.ttl' = 'soon' is not a duration"),
    ("CREATE VIEW v AS SELECT uid FROM users", "0 INSERT INTO statements"),
    # as in Flink, a statement reads what is defined before it
    ("INSERT INTO counts SELECT uid, 1 FROM later; CREATE VIEW later AS SELECT uid FROM users",
     "FROM later: no such table; CREATE TABLE it first"),
])
def test_script_statements_outside_the_subset_are_refused_in_one_line(statements, message):
    with pytest.raises(UnsupportedSql, match=re.escape(message)) as caught:
        build_pipeline(f"{USERS}\n{COUNTS}\n{statements};")
    assert "\n" not in str(caught.value)


def test_check_prints_each_insert_of_a_statement_set(capsys, tmp_path):
    from pipeline.cli import main
    from sqlhelp import SQL_DIR

    code = main(["--data-dir", str(tmp_path), "sql", str(SQL_DIR / "account_counts_and_named_users.sql"), "--check"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0] == ("account_counts_and_named_users: a statement set of 2 INSERTs, one query reading each "
                        "message once")
    assert [line.split(" into ")[1] for line in lines if " into " in line] == [
        "user_count_by_account -> persistent://public/default/user_count_by_account",
        "user_names -> persistent://public/default/user_names"]
    assert "  WHERE, before the operators: (NOT (`s0_fullName` IS NULL))" in lines  # the view's WHERE


def test_a_statement_sets_batch_splits_per_insert_and_keeps_one_dead_letter_per_message():
    import pyarrow as pa

    from pipeline.sql.statement_set import split_set_batch, unique_dead_letters

    batch = pa.table({"_insert": [0, 1, 1], "i0_key": ["a", None, None], "i1_key": [None, "b", "c"],
                      "i1_op": [None, "after", "delete"]})
    first, second = split_set_batch(batch, 2)
    assert first.to_pylist() == [{"key": "a"}]
    assert second.to_pylist() == [{"key": "b", "op": "after"}, {"key": "c", "op": "delete"}]
    dead = pa.table({"source_topic": ["t", "t", "t", "out", "out"], "source_partition": [0, 0, 0, None, None],
                     "source_message_id": ["1", "1", "2", None, None], "error": ["e", "e", "e", "x", "y"]})
    # a message both INSERTs parsed is one dead letter; unsendable results (no message id) all stay
    assert unique_dead_letters(dead)["source_message_id"].to_pylist() == ["1", "2", None, None]
