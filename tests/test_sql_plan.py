"""What SQL the pipelines accept, what they make of it, and how they refuse the rest (no Spark)."""

from __future__ import annotations

import re
from dataclasses import replace

import pyarrow as pa
import pytest

from pipeline.sql.envelope import decide_row, envelope_fields, table_specs
from pipeline.sql.launch import describe_spark_sql
from pipeline.sql.plan import UnsupportedSql, build_plan, split_statements
from pipeline.sql.sink import build_dead_letters, build_messages, build_result
from sqlhelp import COUNT_SQL, JOIN_SQL

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""
USERS = TABLE.format(name="users", columns="uid STRING, accountId STRING, id INT, score DOUBLE", key="uid")
COUNTS = TABLE.format(name="counts", columns="accountId STRING, n BIGINT", key="accountId")


def test_the_seeds_count_statements_plan_an_aggregate():
    plan = build_plan(COUNT_SQL.read_text(), {"users": "persistent://public/default/users-x"})
    assert plan.kind == "aggregate" and plan.group_by == ("accountId",)
    assert [t.topic for t in plan.sides] == ["persistent://public/default/users-x"]
    assert plan.target.topic == "persistent://public/default/user_count_by_account"
    assert [(o.name, o.aggregate, o.argument) for o in plan.outputs] == [("accountId", None, None), ("userCount", "COUNT", None)]
    assert [c.name for c in plan.sides[0].columns if c.metadata] == ["eventTime", "properties", "topic", "sequenceId"]
    assert plan.statements[2].startswith("INSERT INTO user_count_by_account (accountId, userCount)")


def test_the_seeds_join_statements_plan_a_three_way_left_join():
    plan = build_plan(JOIN_SQL.read_text())
    assert plan.kind == "join"
    assert [t.name for t in plan.sides] == ["users", "user_favorite_color", "user_favorite_cheese"]
    assert [(o.name, o.side, o.column) for o in plan.outputs] == [
        ("accountId", 0, "accountId"), ("userUid", 0, "uid"), ("favoriteColor", 1, "favoriteColor"),
        ("favoriteCheese", 2, "favoriteCheese")]
    assert len(plan.statements) == 5


def test_statements_split_at_semicolons_outside_strings():
    assert split_statements("-- note\nSELECT 'a;b';\n\nSELECT 2;") == ["SELECT 'a;b'", "SELECT 2"]


@pytest.mark.parametrize("query, message", [
    ("INSERT INTO counts (accountId, n) SELECT accountId, AVG(score) FROM users GROUP BY accountId",
     "column 'n' is BIGINT but its expression gives DOUBLE; CAST it to BIGINT, or declare the target column as DOUBLE"),
    ("INSERT INTO counts (accountId, n) SELECT u.accountId, u.id FROM users u RIGHT JOIN counts c ON u.uid = c.accountId",
     "'RIGHT JOIN counts AS c ON u.uid = c.accountId' is not supported; supported: LEFT [OUTER] JOIN or [INNER] JOIN "
     "table ON a.pk = b.pk"),
    ("INSERT INTO counts (accountId, n) SELECT u.accountId, u.id FROM users u FULL OUTER JOIN counts c ON u.uid = c.accountId",
     "'FULL OUTER JOIN counts AS c ON u.uid = c.accountId' is not supported; supported: LEFT [OUTER] JOIN"),
    ("INSERT INTO counts (accountId, n) SELECT u.accountId, u.id FROM users u CROSS JOIN counts c",
     "'CROSS JOIN counts AS c' is not supported; supported: LEFT [OUTER] JOIN"),
    ("INSERT INTO counts (accountId, n) SELECT u.accountId, u.id FROM users u INNER JOIN counts c ON u.accountId = c.n",
     "ON must equate a column of users with counts.accountId; supported: JOINs on the driving table's primary key or "
     "on a foreign key of it"),
    ("INSERT INTO counts (accountId, n) SELECT u.accountId, u.id FROM users u LEFT JOIN counts c ON u.id = c.accountId",
     "users.id is INT but counts.accountId is STRING; supported: a foreign key of the referenced key's type"),
    ("INSERT INTO counts (n, accountId) SELECT accountId, COUNT(1) FROM users GROUP BY accountId",
     "its PRIMARY KEY 'accountId' must be filled from the GROUP BY column (accountId)"),
    ("DELETE FROM users", "statement DELETE is not supported; supported: CREATE [TEMPORARY] TABLE"),
    ("INSERT INTO nowhere (a) SELECT uid FROM users", "INSERT INTO nowhere: no such table"),
    # refused rather than run as something else
    ("INSERT INTO counts (accountId, n) SELECT u.uid, u.id FROM users u LEFT JOIN counts FOR SYSTEM_TIME AS OF u.ts AS c "
     "ON u.uid = c.accountId", "table 'users' has no WATERMARK FOR; a temporal join needs one on every table"),
    ("INSERT INTO counts (accountId, n) SELECT u.uid, u.id FROM users u LEFT JOIN users v ON u.uid = v.uid",
     "table 'users' is joined to itself; supported: JOINs of different tables"),
    ("INSERT INTO counts (accountId, n) SELECT accountId, SUM(score) FROM users GROUP BY accountId",
     "column 'n' is BIGINT but SUM(…) gives DOUBLE; CAST it to BIGINT"),
    ("INSERT INTO counts (accountId, n) SELECT uid, score FROM users",
     "column 'n' is BIGINT but score gives DOUBLE"),
])
def test_unsupported_statements_fail_with_one_line_naming_the_clause(query, message):
    with pytest.raises(UnsupportedSql, match=re.escape(message)) as caught:
        build_plan(f"{USERS}\n{COUNTS}\n{query};")
    assert "\n" not in str(caught.value)


def test_the_cli_refuses_an_unsupported_statement_with_one_line(capsys):
    from pipeline.cli import main

    code = main(["--data-dir", "/tmp/unused-sql-cli", "sql", "--statement", USERS.rstrip(";"), "--statement",
                 COUNTS.rstrip(";"), "--statement", "INSERT INTO counts (accountId, n) SELECT accountId, COUNT(1) "
                 "FROM users GROUP BY accountId ORDER BY accountId"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("error: ORDER BY is not supported in INSERT INTO counts; supported: SELECT … FROM t [JOIN …] [WHERE …] "
                   "GROUP BY … [HAVING …] with COUNT, SUM, MIN, MAX, AVG; or SELECT … FROM t [[LEFT|INNER] JOIN t2 "
                   "ON t.pk = t2.pk …] [WHERE …]\n")


def test_a_joined_table_whose_columns_are_not_selected_still_has_a_state_column():
    plan = build_plan(JOIN_SQL.read_text().replace("ufchz.favoriteCheese", "u.fullName"))
    assert [name for name, _ in envelope_fields(plan) if name.startswith("s2_")] == ["s2_userUid"]


def test_left_outer_join_is_a_left_join_and_an_inner_join_needs_its_sides_row():
    left = build_plan(JOIN_SQL.read_text())
    outer = build_plan(JOIN_SQL.read_text().replace("LEFT JOIN", "LEFT OUTER JOIN"))
    assert outer == replace(left, statements=outer.statements) and left.inner == () and left.where_joined is None
    inner = build_plan(JOIN_SQL.read_text().replace("LEFT JOIN", "JOIN", 1).replace("LEFT JOIN", "INNER JOIN"))
    assert inner.inner == (1, 2) and inner.where_joined == "(`present1` AND `present2`)"
    assert describe_spark_sql(inner) == [
        "WHERE, on the joined rows: (`present1` AND `present2`) (`present1`: user_favorite_color has the key's row, "
        "an inner join) (`present2`: user_favorite_cheese has the key's row, an inner join)"]
    mixed = build_plan(JOIN_SQL.read_text().replace("LEFT JOIN", "INNER JOIN", 1).rstrip().rstrip(";")
                       + " WHERE ufchz.favoriteCheese <> 'x';")
    assert mixed.inner == (1,) and mixed.where_joined == "(`present1` AND (`s2_favoriteCheese` <> 'x'))"


def test_a_temporary_table_is_a_table_and_a_computed_column_is_refused_in_one_line():
    temporary = USERS.replace("CREATE TABLE", "CREATE TEMPORARY TABLE")
    plan = build_plan(f"{temporary}\n{COUNTS}\nINSERT INTO counts (accountId, n) SELECT accountId, COUNT(1) FROM users "
                      "GROUP BY accountId;")
    assert plan.sides[0].name == "users" and plan.kind == "aggregate"
    computed = TABLE.format(name="users", columns="uid STRING, tag AS uid || 'x'", key="uid")
    with pytest.raises(UnsupportedSql, match=re.escape("table 'users' column 'tag': a computed column")) as caught:
        build_plan(computed)
    assert "\n" not in str(caught.value)


def test_sums_and_counts_fit_wider_target_columns():
    wide = TABLE.format(name="totals", columns="accountId STRING, n DOUBLE, m BIGINT", key="accountId")
    plan = build_plan(f"{USERS}\n{wide}\nINSERT INTO totals (accountId, n, m) SELECT accountId, SUM(score), "
                      "SUM(id) FROM users GROUP BY accountId;")
    assert [(o.name, o.aggregate) for o in plan.outputs] == [("accountId", None), ("n", "SUM"), ("m", "SUM")]


def test_a_table_must_be_an_upsert_pulsar_table_with_supported_types():
    with pytest.raises(UnsupportedSql, match=re.escape("WITH 'connector' = 'kafka' is not supported; supported: 'connector' = 'upsert-pulsar'")):
        build_plan(USERS.replace("upsert-pulsar", "kafka"))
    with pytest.raises(UnsupportedSql, match=re.escape("table 'users' column 'tags': type ARRAY<STRING> is not supported")):
        build_plan(TABLE.format(name="users", columns="uid STRING, tags ARRAY<STRING>", key="uid"))


def test_a_value_of_the_wrong_type_names_the_table_and_column():
    plan = build_plan(COUNT_SQL.read_text())
    spec = table_specs(plan)["users"]
    assert decide_row(spec, "users", "100-1", b'{"uid":"100-1","accountId":"100","id":1}') == (
        "upsert", {"s0_accountId": "100"}, None)
    assert decide_row(spec, "users", "100-1", b"") == ("delete", {}, None)
    assert decide_row(spec, "users", "100-1", b'{"uid":"100-1","id":"1"}')[2] == (
        "table 'users' column 'id': expected INT, got string \"1\"")
    assert decide_row(spec, "users", "100-1", b'{"id": 3000000000}')[2] == (
        "table 'users' column 'id': expected INT, got number 3000000000")
    assert decide_row(spec, "users", "100-1", b"[1]")[2] == "table 'users': payload is a JSON array, not an object"
    assert decide_row(spec, "users", "100-1", b"\xff")[2] == "table 'users': payload is not valid UTF-8 (byte 0)"
    assert decide_row(spec, "users", None, b"{}")[2].startswith("table 'users': message has no key")
    # the job's payload limit holds here too (pipeline/wire.py load_json): a megabyte of padding is poison
    huge = b'{"uid":"100-1","pad":"' + b"x" * (1 << 20) + b'"}'
    assert decide_row(spec, "users", "100-1", huge) == (
        "dead", {}, f"table 'users': payload is {len(huge)} bytes, over the 1048576-byte limit")
    assert [name for name, _ in envelope_fields(plan)][-1] == "s0_accountId"


def test_result_rows_and_topic_messages_in_the_seeds_json():
    plan = build_plan(COUNT_SQL.read_text())
    rows = pa.table({"op": ["upsert", "delete", "dead", "skip"], "key": [None, None, "x", "y"],
                     "s0_accountId": ["101", "100", None, None], "agg1": [3, None, None, None],
                     "source_topic": [None, None, "users", None], "source_partition": [None, None, -1, None],
                     "source_message_id": [None, None, "1:2:-1:-1", None], "payload": [None, None, "{", None],
                     "error": [None, None, "bad", None], "published_ms": [None, None, 1, None]})
    result = build_result(plan, rows, 7, 1_000)
    assert result.select(["_key", "_op", "accountId", "userCount", "_batch_id"]).to_pylist() == [
        {"_key": "101", "_op": "upsert", "accountId": "101", "userCount": 3, "_batch_id": 7},
        {"_key": "100", "_op": "delete", "accountId": None, "userCount": None, "_batch_id": 7}]
    assert build_messages(plan, result) == [("101", b'{"accountId":"101","userCount":3}'), ("100", b"")]
    assert build_dead_letters(rows, 7, 1_000).select(["key", "error", "batch_id"]).to_pylist() == [
        {"key": "x", "error": "bad", "batch_id": 7}]


def test_a_null_key_or_a_number_json_cannot_hold_becomes_a_dead_letter_not_a_message():
    wide = TABLE.format(name="totals", columns="accountId STRING, total DOUBLE", key="accountId")
    plan = build_plan(f"{USERS}\n{wide}\nINSERT INTO totals (accountId, total) SELECT accountId, SUM(score) FROM users "
                      "GROUP BY accountId;")
    rows = pa.table({"op": ["upsert", "upsert", "upsert", "delete"], "key": [None] * 4,
                     "s0_accountId": ["1", None, "3", "4"], "agg1": [2.5, 1.0, float("inf"), None]})
    from pipeline.sql.sink import split_unsendable

    result, dead = split_unsendable(plan, build_result(plan, rows, 3, 1_000), 3, 1_000)
    assert build_messages(plan, result) == [("1", b'{"accountId":"1","total":2.5}'), ("4", b"")]
    assert dead.column("error").to_pylist() == [
        "result row of INSERT INTO totals: its PRIMARY KEY 'accountId' is NULL (a NULL group value); not sent",
        "result row of INSERT INTO totals: column 'total' is inf, which JSON cannot hold; not sent"]
    assert dead.column("source_topic").to_pylist() == [plan.target.topic] * 2


def test_hostile_payloads_become_dead_letters_with_one_line():
    """The job's JSON guarantees (pipeline/wire.py load_json) hold for the tables' payloads."""
    plan = build_plan(f"{USERS}\n{COUNTS}\nINSERT INTO counts (accountId, n) SELECT accountId, COUNT(1) FROM users "
                      "GROUP BY accountId;")
    spec = table_specs(plan)["users"]
    hostile = {
        b'{"uid":"1","accountId":"1","id":' + b"9" * 5000 + b"}": "a number has over 4300 digits",
        b'{"uid":"1","accountId":"1","score":' + b"9" * 400 + b".5}": "column 'score': expected DOUBLE, got number Infinity",
        b'{"uid":"1","accountId":' + b"[" * 100_000 + b"]" * 100_000 + b"}": "nested too deeply",
        b'{"uid":"1","accountId":"\\ud800"}': "column 'accountId': text holds a lone surrogate",
        b'{"uid":"1","accountId":"1","score":NaN}': "NaN is not a JSON number",
    }
    for payload, message in hostile.items():
        op, fields, error = decide_row(spec, "users", "1", payload)
        assert op == "dead" and message in error and "\n" not in error, error


def test_a_batch_with_nothing_to_refuse_keeps_every_row():
    from pipeline.sql.sink import split_unsendable

    plan = build_plan(COUNT_SQL.read_text())
    empty = build_result(plan, pa.table({"op": pa.array([], pa.string()), "key": pa.array([], pa.string()),
                                         "s0_accountId": pa.array([], pa.string()), "agg1": pa.array([], pa.int64())}), 1, 0)
    result, dead = split_unsendable(plan, empty, 1, 0)
    assert result.num_rows == dead.num_rows == 0


def test_payloads_are_what_json_dumps_sends_byte_for_byte():
    """build_payloads (Arrow compute over whole columns) against json.dumps row by row, on the values
    where they could differ: escapes, non-ASCII, DOUBLE's repr forms, the ends of INT and BIGINT."""
    import json
    import random

    from pipeline.sql.sink import build_payloads, result_schema

    wide = TABLE.format(name="wide", columns="k STRING, s STRING, i INT, b BIGINT, d DOUBLE, f BOOLEAN", key="k")
    plan = build_plan(f"{USERS}\n{wide}\nINSERT INTO wide SELECT uid, accountId, id, CAST(id AS BIGINT), score, "
                      "id > 0 FROM users;")
    rnd = random.Random(5)
    texts = ["", "plain", 'q"uote', "back\\slash", "line\nbreak\t\x00\x1f", "\x7f", "Zoë", "€", "😀", "\u2028", None]
    doubles = [0.0, -0.0, 1.0, 100.0, 2.5, 1e16, 1e15, 1e-4, 1e-5, 0.1, 1 / 3, 1e22, 5e-324, 1.7976931348623157e308,
               9007199254740993.0, None] + [rnd.uniform(-1, 1) * 10.0 ** rnd.randint(-30, 30) for _ in range(300)]
    n = len(doubles)
    ops = ["delete" if i % 7 == 3 else "upsert" for i in range(n)]
    columns = {"_key": [f"k{i}" for i in range(n)], "_op": ops, "k": [f"k{i}" for i in range(n)],
               "s": [texts[i % len(texts)] for i in range(n)], "i": [[-2**31, 2**31 - 1, None, 0][i % 4] for i in range(n)],
               "b": [[-2**63, 2**63 - 1, None, 7][i % 4] for i in range(n)], "d": doubles,
               "f": [[True, False, None][i % 3] for i in range(n)], "_batch_id": [1] * n, "_changed_at": [None] * n}
    schema = result_schema(plan)
    table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in schema})
    names = [c.name for c in plan.target.payload_columns]
    expected = [b"" if row["_op"] == "delete" else json.dumps({name: row[name] for name in names},
                                                               separators=(",", ":"), allow_nan=False).encode()
                for row in table.to_pylist()]
    assert build_payloads(plan, table).to_pylist() == expected
    halves = pa.concat_tables([table.slice(0, n // 2), table.slice(n // 2)])  # chunked columns
    assert build_payloads(plan, halves).to_pylist() == expected


def test_a_message_batch_for_the_jvm_is_the_columns_arrow_buffers_framed():
    import struct

    from pipeline.errors import SinkError
    from pipeline.sql.jvm_sender import encode_batch

    keys, payloads = pa.array(["x", "101", "100"]).slice(1), pa.array([b"zz", b'{"n":3}', b""]).slice(1)
    assert encode_batch(keys, payloads) == struct.pack("<7i", 2, 0, 3, 6, 0, 7, 7) + b'101100{"n":3}'
    with pytest.raises(SinkError, match=re.escape("a message batch has 1 NULL keys or payloads")):
        encode_batch(pa.array(["1", None]), pa.array([b"", b""]))
