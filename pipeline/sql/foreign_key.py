"""Foreign-key joins: the driving table joined on one of its columns to another table's primary key.

``SELECT … FROM users u [LEFT [OUTER] | [INNER]] JOIN accounts a ON u.accountId = a.id`` as Flink
runs it on upsert tables: the result is keyed by the driving table's primary key; a driving row
whose foreign key changes follows its new referenced row; a referenced row that changes or goes
updates every driving row that references it (LEFT: its columns NULL; INNER: the row retracted);
a driving row's delete retracts its row. The query::

    envelope ─ [driving rows] UpsertJoin (keyed by the driving key, emitBefore: each changed
             │                 row's old version "before" and new one "after")
             └ [referenced rows, dead letters] ─────────────────────────┐
      ─ union, keyed by the foreign key value (JSON-encoded, so NULL matches nothing)
      ─ ForeignKeyJoin (pipeline/jvm/statefulstreams/ForeignKeyJoin.java): per foreign key value,
        the rows referencing it and the referenced row; emits, per changed driving key, "before"
        (the joined row sent before, if any) and "after" (the joined row now, if any)
      [─ GROUP BY: GroupAggregate, as over UpsertJoin's joined rows (pipeline/sql/runner.py)]

A driving row that moves from foreign key a to b in one batch gets its ``before`` from a and its
``after`` from b, in either order; the sink sends what changed (pipeline/sql/sink.py
resolve_changes, as for every join), so a WHERE on the referenced table's columns retracts a row
whose referenced row stops matching.

The checks here are pure and run at ``--check`` (pipeline/sql/plan.py); the rest runs on Spark.
"""

from __future__ import annotations

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.settings import state_ttl_ms
from pipeline.sql.sqltypes import SPARK_NAMES, UnsupportedSql, WHOLE
from pipeline.sql.tables import Table

FK_JOIN = "FROM t [LEFT [OUTER] | [INNER]] JOIN r ON t.fk = r.pk, alone"
KEY_TYPES = ("string", *WHOLE)
FOREIGN_KEY_COLUMN = "fk_key"  # the union's grouping column: the foreign key value as JSON


def check_foreign_key_types(text: str, driving: Table, column: str, table: Table) -> None:
    """Refuse a foreign key whose type cannot equal the referenced key's as the message key does."""
    given, wanted = driving.column(column).spark_type, table.column(table.primary_key).spark_type
    same = given == wanted or (given in WHOLE and wanted in WHOLE)
    if not same or given not in KEY_TYPES:
        raise UnsupportedSql(f"{text!r}: {driving.name}.{column} is {SPARK_NAMES.get(given, given)} but "
                             f"{table.name}.{table.primary_key} is {SPARK_NAMES.get(wanted, wanted)}; supported: "
                             "a foreign key of the referenced key's type")


def check_foreign_key_join(joins: list[exp.Join], settings: dict[str, str]) -> None:
    """Refuse, in one line, what a foreign-key join does not run with yet."""
    if len(joins) > 1:
        texts = ", ".join(repr(j.sql(dialect=Flink).strip()) for j in joins)
        raise UnsupportedSql(f"a foreign-key JOIN with other JOINs ({texts}) is not supported yet; supported: {FK_JOIN}")
    if state_ttl_ms(settings):
        raise UnsupportedSql("SET 'table.exec.state.ttl' with a foreign-key JOIN is not supported yet; supported: "
                             "'0' (state kept for every key)")


def apply_foreign_key_join(rows, plan, sides: list[list[str]]):
    """The envelope rows (WHERE applied) through the two stages of the module docstring.

    # in:  {"key": "u1", "side": 0|1, "op": "upsert"|"delete"|"dead", "s0_accountId": "A", "s1_name": …}
    # out: {"key": "u1", "op": "before"|"after"|"dead", "s0_accountId": "A", "s1_name": "Acme", …}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from pipeline.sql.plan import field_name

    spark = rows.sparkSession
    jvm = spark._jvm.statefulstreams
    order = ["source_partition", "position"]
    driving = F.coalesce((F.col("side") == 0) & F.col("op").isin("upsert", "delete"), F.lit(False))
    versions = jvm.JoinSpec().key("key").side("side").op("op").sides([sides[0]]).readOrder(order).emitBefore(True)
    # {"key": "u1", "op": "before"|"after", "s0_accountId": …}: a deleted row's "delete" adds nothing to its "before"
    changed = DataFrame(jvm.UpsertJoin.apply(rows.where(driving)._jdf, versions), spark)
    changed = changed.where(F.col("op").isin("before", "after"))
    foreign = f"to_json(array(CAST(`{field_name(0, plan.foreign_key)}` AS STRING)))"
    both = changed.unionByName(rows.where(~driving)).withColumn(FOREIGN_KEY_COLUMN, F.expr(
        f"CASE WHEN op IN ('before', 'after') THEN {foreign} WHEN op IN ('upsert', 'delete') THEN to_json(array(key)) "
        "ELSE key END"))
    spec = (jvm.ForeignKeySpec().foreignKey(FOREIGN_KEY_COLUMN).key("key").op("op").driving(sides[0])
            .referenced(sides[1]).readOrder(order).inner(1 in plan.inner))
    return DataFrame(jvm.ForeignKeyJoin.apply(both._jdf, spec), spark)
