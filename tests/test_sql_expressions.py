"""Flink SQL expressions, WHERE, GROUP BY and HAVING: what they plan to (no Spark), how they are refused,
and what Spark computes from the translation (one batch DataFrame on the shared session)."""

from __future__ import annotations

import re

import pytest
import sqlglot

from pipeline.sql.dialect import Flink
from pipeline.sql.expressions import Typed, UnsupportedSql, translate
from pipeline.sql.plan import build_plan

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""
USERS = TABLE.format(name="users", columns="uid STRING, accountId STRING, region STRING, id INT, score DOUBLE",
                     key="uid")
COLORS = TABLE.format(name="colors", columns="userUid STRING, color STRING", key="userUid")
OUT = TABLE.format(name="out", columns="k STRING, n BIGINT, a INT, s DOUBLE, t STRING", key="k")
META_USERS = TABLE.format(name="users", columns="uid STRING, eventTime TIMESTAMP(3) METADATA, properties MAP<STRING, "
                          "STRING> METADATA, topic STRING METADATA VIRTUAL, sequenceId BIGINT METADATA VIRTUAL, "
                          "k STRING METADATA FROM 'key' VIRTUAL", key="uid")


def plan_of(query: str):
    return build_plan(f"{USERS}\n{COLORS}\n{OUT}\n{query};")


def test_where_runs_before_the_operators_on_the_driving_tables_columns():
    plan = plan_of("INSERT INTO out (k, t) SELECT uid, UPPER(region) FROM users WHERE id >= 2 AND region <> 'eu'")
    assert plan.kind == "join"
    assert plan.where == "((`s0_id` >= 2) AND (`s0_region` <> 'eu'))"
    assert [(o.name, o.expression, o.spark_type) for o in plan.outputs] == [
        ("k", None, None), ("t", "upper(`s0_region`)", "string")]
    assert set(plan.reads) == {(0, "id"), (0, "region")}


def test_group_by_two_columns_with_avg_having_and_a_key_of_both():
    plan = plan_of("INSERT INTO out (k, n, a, s) SELECT accountId || '/' || region, COUNT(*), AVG(id), AVG(score) "
                   "FROM users WHERE score IS NOT NULL GROUP BY accountId, region HAVING COUNT(*) >= 2")
    assert plan.kind == "aggregate" and plan.group_fields == ("s0_accountId", "s0_region")
    assert [(a.function, a.input) for a in plan.aggregates] == [
        ("COUNT", ""), ("SUM", "s0_id"), ("COUNT", "s0_id"), ("SUM", "s0_score"), ("COUNT", "s0_score")]
    assert plan.having == "(`agg1` >= 2)"
    # Flink: AVG of an INT is an INT
    assert [o.spark_type for o in plan.outputs if o.expression] == ["string", "int", "double"]


def test_count_distinct_is_group_aggregates_count_distinct():
    plan = plan_of("INSERT INTO out (k, n, s) SELECT accountId, COUNT(DISTINCT UPPER(region)), COUNT(DISTINCT id) "
                   "FROM users GROUP BY accountId")
    assert [(a.function, a.input) for a in plan.aggregates] == [("COUNT_DISTINCT", "d0"), ("COUNT_DISTINCT", "s0_id")]
    assert [o.spark_type for o in plan.outputs] == [None, "bigint", "bigint"]


def test_group_by_an_expression_and_aggregates_of_expressions_are_derived_columns():
    plan = plan_of("INSERT INTO out (k, n) SELECT UPPER(accountId), SUM(id * 2) FROM users GROUP BY UPPER(accountId)")
    assert [(d.name, d.sql) for d in plan.derived] == [("d0", "upper(`s0_accountId`)"),
                                                       ("d1", "try_multiply(`s0_id`, 2)")]
    assert plan.group_fields == ("d0",)
    assert [o.expression for o in plan.outputs] == ["`d0`", "`agg_0`"]


@pytest.mark.parametrize("query, message", [
    ("INSERT INTO out (k, n) SELECT accountId, SUM(DISTINCT id) FROM users GROUP BY accountId",
     "SUM(DISTINCT id) is not supported; supported: COUNT(DISTINCT x) of one value, and COUNT, SUM, MIN, MAX, AVG"),
    ("INSERT INTO out (k, t) SELECT uid, SPLIT_INDEX(region, ',', 1) FROM users",
     "SELECT \"SPLIT_INDEX(region, ',', 1)\" is not supported; supported: columns, literals and CAST, CASE"),
    ("INSERT INTO out (k, t) SELECT uid, region FROM users WHERE id = 'x'",
     "WHERE \"id = 'x'\": mixes INT, STRING; CAST them to one type"),
    ("INSERT INTO out (k, t) SELECT uid, region || id FROM users",
     "SELECT 'region || id': an argument is INT; supported: STRING"),
    ("INSERT INTO out (k, t) SELECT uid, region FROM users WHERE id", "WHERE 'id' is INT; supported: a BOOLEAN condition"),
    ("INSERT INTO out (k, t) SELECT uid, region FROM users WHERE COUNT(*) > 1",
     "WHERE 'COUNT(*)': an aggregate is not allowed there; use HAVING"),
    ("INSERT INTO out (k, t) SELECT uid, region FROM users HAVING id > 1", "HAVING without GROUP BY is not supported"),
    ("INSERT INTO out (k, n) SELECT accountId, COUNT(*) FROM users GROUP BY accountId, region",
     "its PRIMARY KEY 'k' must be filled from the GROUP BY columns (accountId, region), all in one value"),
    ("INSERT INTO out (k, n) SELECT region, COUNT(*) FROM users GROUP BY accountId",
     "SELECT column 'region' is neither grouped nor aggregated"),
    ("INSERT INTO out (k, a) SELECT uid, CAST(score AS DECIMAL(10, 2)) FROM users",
     "CAST to DECIMAL(10, 2) is not supported"),
    ("INSERT INTO out (k, a) SELECT uid, score * 2 FROM users",
     "column 'a' is INT but its expression gives DOUBLE; CAST it to INT, or declare the target column as DOUBLE"),
    ("INSERT INTO out (k, t) SELECT UPPER(uid), region FROM users",
     "its PRIMARY KEY 'k' must be filled from users.uid"),
    ("INSERT INTO out (k, n) SELECT accountId, SUM(region) FROM users GROUP BY accountId",
     "SUM(region): its argument is STRING; supported: INT, BIGINT, DOUBLE"),
])
def test_unsupported_expressions_fail_with_one_line_naming_them(query, message):
    with pytest.raises(UnsupportedSql, match=re.escape(message)) as caught:
        plan_of(query)
    assert "\n" not in str(caught.value)


# One row of every type, and NULLs: Flink's value of each expression (None: NULL).
ROW = {"uid": "u1", "acc": "acc", "id": 7, "big": 2**40, "score": 2.5, "flag": True, "nos": None, "noi": None}
TYPES = {"uid": "string", "acc": "string", "id": "int", "big": "bigint", "score": "double", "flag": "boolean",
         "nos": "string", "noi": "int"}
CASES = [
    ("id + 1", 8), ("big * 2", 2**41), ("id - score", 4.5), ("id / 2", 3), ("-7 / 2", -3), ("score / 2", 1.25),
    ("id % 3", 1), ("MOD(-7, 3)", -1), ("-id", -7),
    # where Flink fails the job (or wraps an overflow), the value is NULL: no value stops a pipeline
    ("id / 0", None), ("MOD(id, 0)", None), ("2147483647 + id", None), ("CAST(acc AS INT)", None),
    ("ABS(-2147483648)", None),
    ("CAST('42' AS INT)", 42), ("CAST(id AS STRING)", "7"), ("CAST(score AS INT)", 2), ("CAST(id AS DOUBLE)", 7.0),
    ("CAST(id AS BIGINT) * 1000000000", 7_000_000_000),
    ("acc || '-' || uid", "acc-u1"), ("acc || nos", None), ("CONCAT(acc, uid)", "accu1"),
    ("CONCAT_WS('-', acc, nos, uid)", "acc-u1"),
    ("CASE WHEN id > 5 THEN 'big' ELSE 'small' END", "big"), ("CASE id WHEN 7 THEN 1 WHEN 8 THEN 2 END", 1),
    ("CASE WHEN id > 9 THEN 1 END", None), ("IF(flag, 1, 2)", 1), ("COALESCE(nos, acc)", "acc"),
    ("COALESCE(noi, big)", 2**40), ("NULLIF(id, 7)", None),
    ("UPPER(acc)", "ACC"), ("LOWER('AbC')", "abc"), ("INITCAP('hello world')", "Hello World"),
    ("TRIM('  x  ')", "x"), ("LTRIM('  x ')", "x "), ("RTRIM(' x  ')", " x"), ("TRIM(BOTH 'x' FROM 'xxaxx')", "a"),
    ("CHAR_LENGTH(acc)", 3), ("SUBSTRING('hello', 2, 3)", "ell"), ("SUBSTRING('hello' FROM 2)", "ello"),
    ("REPLACE('a-b', '-', '+')", "a+b"), ("POSITION('c' IN acc)", 2),
    ("ABS(-3)", 3), ("ABS(score - 5)", 2.5), ("ROUND(score)", 3.0), ("ROUND(id, 2)", 7), ("FLOOR(score)", 2.0),
    ("CEIL(score)", 3.0), ("FLOOR(id)", 7), ("FLOOR(1e300)", 1e300), ("POWER(id, 2)", 49.0),
    ("SQRT(score * 10)", 5.0), ("SIGN(-score)", -1.0), ("SIGN(id)", 1), ("GREATEST(id, 3, 9)", 9),
    ("LEAST(id, noi)", None), ("LN(EXP(1.0))", 1.0), ("LOG10(1000)", 3.0),
    ("id > 3 AND NOT flag", False), ("nos IS NULL", True), ("noi IS NOT NULL", False), ("flag IS TRUE", True),
    ("score >= 2.5 OR nos IS NOT NULL", True), ("noi > 1", None), ("acc LIKE 'a%'", True),
    ("acc NOT LIKE 'a%'", False), ("id BETWEEN 1 AND 7", True), ("id IN (1, 7)", True), ("id NOT IN (1, 7)", False),
    ("big > id", True), ("id = 7.0", True),
]


def _translate(text: str) -> Typed:
    node = sqlglot.parse_one(f"SELECT {text}", read=Flink).expressions[0]

    def resolve(n):
        return Typed(f"`{n.name}`", TYPES[n.name]) if isinstance(n, sqlglot.exp.Column) else None

    return translate(node, resolve, "SELECT")


def test_spark_computes_flinks_values_from_the_translations(spark):
    from pyspark.sql import functions as F

    schema = ", ".join(f"{name} {kind}" for name, kind in TYPES.items())
    frame = spark.createDataFrame([tuple(ROW.values())], schema)
    translated = [_translate(text) for text, _ in CASES]
    row = frame.select(*[F.expr(t.sql).alias(f"c{i}") for i, t in enumerate(translated)])
    spark_types = [field.dataType.simpleString() for field in row.schema.fields]
    values = list(row.collect()[0])
    got = {text: (value, kind) for (text, _), value, kind in zip(CASES, values, spark_types)}
    expected = {text: (value, t.type) for (text, value), t in zip(CASES, translated)}
    # Spark's own type of each translation is the one planned (what --check compares with the target)
    assert {k: v for k, v in got.items() if v != expected[k] and not (v[1] == "void" and expected[k][1] == "null")} == {}


def test_plans_without_expressions_keep_their_checkpoints_fingerprint():
    """A pipeline started before expressions existed restarts from its checkpoint (runner.check_checkpoint)."""
    from pipeline.sql.runner import plan_fingerprint
    from sqlhelp import COUNT_SQL, JOIN_SQL

    assert plan_fingerprint(build_plan(COUNT_SQL.read_text())) == "a7b59c2b71b85d42"
    assert plan_fingerprint(build_plan(JOIN_SQL.read_text())) == "1fe9c6d8ddb2ec85"
    with_where = build_plan(COUNT_SQL.read_text().replace("FROM users", "FROM users WHERE id > 1"))
    assert plan_fingerprint(with_where) != "a7b59c2b71b85d42"


def test_the_example_with_where_expressions_avg_and_having_plans():
    from sqlhelp import SQL_DIR

    plan = build_plan((SQL_DIR / "active_users_by_account.sql").read_text())
    assert plan.where == "((coalesce(`s0_op`, 'c') <> 'd') AND (NOT (`s0_id` IS NULL)))"
    assert plan.having == "(`agg1` >= 2)"
    assert [d.sql for d in plan.derived] == ["char_length(trim(BOTH FROM `s0_fullName`))"]
    assert [o.spark_type for o in plan.outputs] == [None, None, "int", "int", "string"]


@pytest.mark.parametrize("script, message", [
    (f"{USERS}\n{OUT}\nCREATE VIEW v AS SELECT uid FROM users;\nINSERT INTO out (k) SELECT u.uid FROM users u JOIN v ON u.uid = v.uid;",
     "'JOIN v ON u.uid = v.uid': a view in a JOIN is not supported; supported: CREATE [TEMPORARY] VIEW"),
    (f"{USERS}\n{OUT}\nINSERT INTO out (k) SELECT uid FROM users;\nINSERT INTO out (k) SELECT uid FROM users;",
     "INSERT INTO out appears 2 times; supported: one INSERT per target table"),
    (f"{USERS}\n{OUT}\nSET 'parallelism.default' = '4';\nINSERT INTO out (k) SELECT uid FROM users;",
     "SET 'parallelism.default' is not supported; supported keys: table.exec.state.ttl"),
    (f"{META_USERS}\n{OUT}\nINSERT INTO out (k, n) SELECT topic, COUNT(*) FROM users GROUP BY topic;",
     "GROUP BY 'topic' is a METADATA column; supported there: payload columns (METADATA columns are read in the "
     "SELECT and WHERE of a query without GROUP BY)"),
    (f"{META_USERS}\n{OUT}\nINSERT INTO out (k, n) SELECT uid, sequenceId FROM users;",
     "SELECT 'sequenceId' is METADATA 'sequenceId', which this source does not read; supported: eventTime, "
     "publishTime, properties, topic, key"),
    (f"{META_USERS.replace('eventTime TIMESTAMP(3)', 'eventTime BIGINT')}\n{OUT}\n"
     "INSERT INTO out (k, n) SELECT uid, eventTime FROM users;",
     "SELECT 'eventTime' is METADATA 'eventTime' declared BIGINT; supported: TIMESTAMP or TIMESTAMP_LTZ"),
    (f"{META_USERS}\n{OUT}\nINSERT INTO out (k, t) SELECT uid, eventTime FROM users;",
     "column 't' is STRING but eventTime gives TIMESTAMP(3); CAST it to STRING"),
    (f"{META_USERS}\n{OUT}\nINSERT INTO out (k, t) SELECT uid, CAST(properties AS STRING) FROM users;",
     "SELECT 'CAST(properties AS STRING)': CAST of a MAP is not supported; supported: its values, map['key']"),
    (f"{META_USERS}\n{META_USERS.replace('users', 'copy')}\nINSERT INTO copy (uid, topic) SELECT uid, topic FROM users;",
     "INSERT INTO copy: column 'topic' is a METADATA column; writing METADATA is not supported; supported: payload columns"),
])
def test_views_statement_sets_and_metadata_in_a_query_are_refused_in_one_line(script, message):
    with pytest.raises(UnsupportedSql, match=re.escape(message)) as caught:
        build_plan(script)
    assert "\n" not in str(caught.value)


def test_where_on_a_joined_tables_column_runs_after_the_join_on_each_keys_before_and_after():
    import pyarrow as pa

    from pipeline.sql.sink import build_result

    plan = plan_of("INSERT INTO out (k, t) SELECT u.uid, c.color FROM users u LEFT JOIN colors c ON u.uid = c.userUid "
                   "WHERE u.id > 0 AND (c.color IS NULL OR c.color <> 'red')")
    assert plan.where == "(`s0_id` > 0)"  # before the join: the driving table's conjunct
    assert plan.where_joined == "((`s1_color` IS NULL) OR (`s1_color` <> 'red'))"
    # key: (before passed?, now) -> what is sent
    rows = pa.table({
        "key": ["stays", "stays", "leaves", "leaves", "comes", "comes", "new", "never", "gone", "gone", "gone-unsent",
                "gone-unsent", "x"],
        "op": ["before", "after", "before", "after", "before", "after", "after", "after", "before", "delete", "before",
               "delete", "dead"],
        "_pass": [True, True, True, False, False, True, True, False, True, None, False, None, None],
        "s0_uid": ["stays", "stays", "leaves", "leaves", "comes", "comes", "new", "never", "gone", None, "gone-unsent",
                   None, None],
        "s1_color": ["blue"] * 13,
    })
    result = build_result(plan, rows, 1, 0)
    assert list(zip(result["_key"].to_pylist(), result["_op"].to_pylist())) == [
        ("stays", "upsert"), ("leaves", "delete"), ("comes", "upsert"), ("new", "upsert"), ("gone", "delete")]


def test_having_sends_a_group_while_it_passes_and_retracts_it_once_when_it_stops():
    import pyarrow as pa

    from pipeline.sql.sink import build_result, split_unsendable

    plan = plan_of("INSERT INTO out (k, n) SELECT accountId, COUNT(*) FROM users GROUP BY accountId HAVING COUNT(*) >= 2")
    # the rows of HAVING's UpsertJoin (pipeline/sql/runner.py apply_having): the key JSON-encoded
    rows = pa.table({
        "key": ['["A"]', '["A"]', '["B"]', '["B"]', '["C"]', '["D"]', '["D"]', "[null]"],
        "op": ["before", "after", "before", "after", "after", "before", "delete", "after"],
        "_pass": [True, False, False, True, False, True, False, True],
        "_result_key": ["A", "A", "B", "B", "C", "D", "D", None],
        "s0_accountId": ["A", "A", "B", "B", "C", "D", None, None], "agg1": [2, 1, 1, 2, 1, 2, None, 5],
    })
    result, dead = split_unsendable(plan, build_result(plan, rows, 4, 0), 4, 0)
    assert list(zip(result["_key"].to_pylist(), result["_op"].to_pylist(), result["n"].to_pylist())) == [
        ("A", "delete", None), ("B", "upsert", 2), ("D", "delete", None)]
    assert dead["error"].to_pylist() == [
        "result row of INSERT INTO out: its PRIMARY KEY 'k' is NULL (a NULL group value); not sent"]


EXTREMES = [
    {"uid": "", "acc": "", "id": -2**31, "big": -2**63, "score": 1.7976931348623157e308, "flag": False, "nos": "",
     "noi": 2**31 - 1},
    {"uid": None, "acc": None, "id": None, "big": None, "score": None, "flag": None, "nos": None, "noi": None},
    {"uid": "x", "acc": "%", "id": 2**31 - 1, "big": 2**63 - 1, "score": -1.7976931348623157e308, "flag": True,
     "nos": "é", "noi": 0},
]
EDGES = ["id / -1", "big / -1", "-big", "ABS(big)", "ABS(id)", "big * big", "big + big", "id * id", "big % -1",
         "big % noi", "CAST(score AS BIGINT)", "CAST(score AS INT)", "FLOOR(score)", "CEIL(score)", "ROUND(score, 2)",
         "POWER(score, 2)", "SQRT(score)", "LN(score)", "score / 0", "id / noi", "SIGN(big)", "SUBSTRING(acc, id, id)",
         "CAST(acc AS BOOLEAN)", "CAST(nos AS DOUBLE)", "GREATEST(big, id)"]


def test_no_value_fails_spark_under_ansi_mode(spark):
    """Spark 4 runs in ANSI mode, where an overflow or a bad CAST fails the batch on every restart;
    every translation must give NULL instead (or a value), for any input."""
    from pyspark.sql import functions as F

    schema = ", ".join(f"{name} {kind}" for name, kind in TYPES.items())
    frame = spark.createDataFrame([tuple(row.values()) for row in EXTREMES], schema)
    texts = [text for text, _ in CASES] + EDGES
    translated = [_translate(text) for text in texts]
    # as the runner gives each output: TRY_CAST to its planned type
    columns = [F.expr(f"TRY_CAST({t.sql} AS {'STRING' if t.type == 'null' else t.type.upper()})").alias(f"c{i}")
               for i, t in enumerate(translated)]
    rows = frame.select(*columns).collect()
    values = dict(zip(texts, zip(*[list(r) for r in rows])))
    assert values["id / -1"] == (None, None, -(2**31 - 1))  # Flink fails the job on INT_MIN / -1 (overflow)
    assert values["-big"] == (None, None, -(2**63 - 1))
    assert values["ABS(id)"] == (None, None, 2**31 - 1)
    assert values["CAST(score AS INT)"] == (None, None, None)
    assert values["FLOOR(score)"] == (1.7976931348623157e308, None, -1.7976931348623157e308)


def test_check_prints_the_spark_sql_of_where_having_and_each_expression(capsys):
    from pipeline.cli import main
    from sqlhelp import SQL_DIR

    code = main(["--data-dir", "/tmp/unused-sql-cli", "sql", str(SQL_DIR / "active_users_by_account.sql"), "--check"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert lines[0].startswith("active_users_by_account: aggregate of users <- ")
    assert "  WHERE, before the operators: ((coalesce(`s0_op`, 'c') <> 'd') AND (NOT (`s0_id` IS NULL)))" in lines
    assert "  HAVING: (`agg1` >= 2)" in lines
    assert "  avgId = (CASE WHEN `agg_2` = 0 THEN NULL ELSE CAST(`agg_1` DIV `agg_2` AS INT) END)" in lines


def test_metadata_columns_are_read_from_the_message_in_select_and_where():
    from datetime import datetime, timezone

    from pipeline.sql.envelope import envelope_fields, table_specs
    from pipeline.sql.metadata import metadata_values

    plan = build_plan(f"{META_USERS}\n{OUT}\nINSERT INTO out (k, t, a) SELECT uid, CAST(eventTime AS STRING) || "
                      "properties['tier'] || k, CHAR_LENGTH(topic) FROM users WHERE properties['skip'] IS NULL;")
    assert plan.where == "(try_element_at(`s0_properties`, 'skip') IS NULL)"
    assert plan.outputs[1].expression == ("concat(concat(date_format(`s0_eventTime`, 'yyyy-MM-dd HH:mm:ss.SSS'), "
                                          "try_element_at(`s0_properties`, 'tier')), `s0_k`)")
    assert dict(envelope_fields(plan))["s0_properties"] == "map<string,string>"
    spec = table_specs(plan)["users"]["metadata"]
    row = {"topic": "persistent://public/default/users", "key": "u1", "event_time": 1700000000100,
           "properties": '{"tier": "gold"}', "publish_time": None}
    assert metadata_values(spec, row) == {
        "s0_eventTime": datetime(2023, 11, 14, 22, 13, 20, 100000, tzinfo=timezone.utc),
        "s0_properties": [("tier", "gold")], "s0_topic": "persistent://public/default/users", "s0_k": "u1"}
    # a message without an event time or properties: NULL, and an empty map
    assert metadata_values(spec, {**row, "event_time": None, "properties": None})["s0_eventTime"] is None
