"""Foreign-key joins: a column of the driving table, or of a table joined before, to another table's primary key.

``SELECT … FROM users u [LEFT [OUTER] | [INNER]] JOIN accounts a ON u.accountId = a.id`` as Flink
runs it on upsert tables: the result is keyed by the driving table's primary key; a driving row
whose foreign key changes follows its new referenced row; a referenced row that changes or goes
updates every driving row that references it (LEFT: its columns NULL; INNER: the row retracted);
a driving row's delete retracts its row. The query::

    envelope ─ [driving rows, and the tables joined on its primary key] UpsertJoin (keyed by the
             │   driving key, emitBefore: each changed joined row's old version "before", its new
             │   one "after")
             └ [referenced rows, dead letters] ─────────────────────────┐
      ─ union, keyed by the foreign key value (JSON-encoded, so NULL matches nothing)
      ─ ForeignKeyJoin (pipeline/jvm/statefulstreams/ForeignKeyJoin.java): per foreign key value,
        the rows referencing it and the referenced row; emits, per changed driving key, "before"
        (the joined row sent before, if any) and "after" (the joined row now, if any)
      [─ union with the next foreign-key join's referenced rows ─ ForeignKeyJoin …, one per join]
      [─ GROUP BY: GroupAggregate, as over UpsertJoin's joined rows (pipeline/sql/runner.py)]

An N-way chain (``orders o JOIN users u ON o.userId = u.id JOIN accounts a ON u.accountId = a.id``,
in any mix with joins on the driving key) is one UpsertJoin for the driving table and every table
joined on its primary key, then one ForeignKeyJoin per foreign-key join in the order written, each
keyed by its column of the joined row so far. Each one's output is the next one's driving rows: a
"before" is the row it sent (so the next one retracts exactly what it holds) and an "after" the
row now, so a move or a delete anywhere in the chain retracts through the joins after it.

A driving row that moves from foreign key a to b in one batch gets its ``before`` from a and its
``after`` from b, in either order; the sink sends what changed (pipeline/sql/sink.py
resolve_changes, as for every join), so a WHERE on the referenced table's columns retracts a row
whose referenced row stops matching.

``table.exec.state.ttl`` (pipeline/sql/settings.py) is each operator's, as Flink's regular joins:
UpsertJoin's rows, and each ForeignKeyJoin's referencing rows and referenced row, expire the TTL
after they were last written, each on its own, with nothing sent.

The checks here are pure and run at ``--check`` (pipeline/sql/plan.py); the rest runs on Spark.
"""

from __future__ import annotations

from pipeline.sql.settings import state_ttl_ms
from pipeline.sql.sqltypes import SPARK_NAMES, UnsupportedSql, WHOLE
from pipeline.sql.tables import Table

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


def foreign_key_fingerprint(plan) -> list:
    """The part of a plan's fingerprint (pipeline/sql/runner.py) its foreign-key joins make: a lone
    join of the driving table keeps the one it had before chains."""
    if plan.foreign_keys == ((1, 0, plan.foreign_key),):
        return ["foreign key", plan.foreign_key]
    return ["foreign keys", [list(join) for join in plan.foreign_keys], list(plan.inner)]


def apply_foreign_key_join(rows, plan, sides: list[list[str]]):
    """The envelope rows (WHERE applied) through the stages of the module docstring.

    # in:  {"key": "u1", "side": 0|1, "op": "upsert"|"delete"|"dead", "s0_accountId": "A", "s1_name": …}
    # out: {"key": "u1", "op": "before"|"after"|"dead", "s0_accountId": "A", "s1_name": "Acme", …}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from pipeline.sql.plan import field_name

    spark = rows.sparkSession
    jvm = spark._jvm.statefulstreams
    order = ["source_partition", "position"]
    ttl_ms = state_ttl_ms(plan.settings)
    keyed = [side for side in range(len(plan.sides)) if side not in {s for s, _, _ in plan.foreign_keys}]
    change = F.col("op").isin("upsert", "delete")
    first = F.coalesce(F.col("side").isin(*keyed) & change, F.lit(False))
    # one state per side up to the last keyed one (a referenced side's stays empty): a lone join keeps its layout
    versions = (jvm.JoinSpec().key("key").side("side").op("op").sides(sides[:max(keyed) + 1]).readOrder(order)
                .emitBefore(True).stateTtlMs(ttl_ms))
    # {"key": "u1", "op": "before"|"after", "s0_accountId": …}: a deleted row's "delete" adds nothing to its "before"
    out = DataFrame(jvm.UpsertJoin.apply(rows.where(first)._jdf, versions), spark)
    out = out.where(F.col("op").isin("before", "after"))
    held = [column for side in keyed for column in sides[side]]  # the joined row's columns so far
    for index, (side, of_side, column) in enumerate(plan.foreign_keys):
        theirs = F.coalesce((F.col("side") == side) & change, F.lit(False))
        # the dead letters pass through the first one and every one after
        theirs = theirs | ~F.coalesce(change, F.lit(False)) if index == 0 else theirs
        foreign = f"to_json(array(CAST(`{field_name(of_side, column)}` AS STRING)))"
        both = (out.drop(FOREIGN_KEY_COLUMN) if index else out).unionByName(rows.where(theirs)).withColumn(
            FOREIGN_KEY_COLUMN, F.expr(f"CASE WHEN op IN ('before', 'after') THEN {foreign} "
                                       "WHEN op IN ('upsert', 'delete') THEN to_json(array(key)) ELSE key END"))
        spec = (jvm.ForeignKeySpec().foreignKey(FOREIGN_KEY_COLUMN).key("key").op("op").driving(held)
                .referenced(sides[side]).readOrder(order).inner(side in plan.inner).stateTtlMs(ttl_ms))
        out = DataFrame(jvm.ForeignKeyJoin.apply(both._jdf, spec), spark)
        held = held + sides[side]
    return out
