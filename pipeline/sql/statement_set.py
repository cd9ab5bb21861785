"""Several INSERTs of one script (a statement set) as one Spark query that reads each message once.

A script with several ``INSERT INTO`` statements, bare or in ``EXECUTE STATEMENT SET BEGIN … END``
(pipeline/sql/script.py), is one pipeline: one streaming query, one checkpoint, one commit per
micro-batch. The query::

    pulsar source (every table of every INSERT, read once) ─ exchange by key (shared)
      ├─ [kind in INSERT 0's tables] ─ envelope ─ operators (pipeline/sql/runner.py apply_operators) ─ i0_* columns
      ├─ [kind in INSERT 1's tables] ─ envelope ─ operators ─ i1_* columns
      ├─ [a temporal INSERT: a source per table, each with its watermark (temporal_stream.py)] ─ i2_* columns
      └─ … ─ union (``_insert`` says whose row it is) ─ foreachBatch: each INSERT's topic and result table

The shared exchange is one subtree of every branch, so Spark's exchange reuse runs the source
read (and its row counts) once per batch, however many INSERTs read a table; each branch parses
only its own tables' messages. A temporal join needs a watermark per table, so its INSERT reads
its tables again, in sources of its own; the query's one watermark is then that join's (the
other INSERTs' operators keep no event time). Two temporal INSERTs would hold each other's
watermark back, so a set has one at most (pipeline/sql/script.py). Outputs per batch, in one foreachBatch call: each INSERT's rows
to its target topic (at least once, as a single INSERT's), then one commit of the writer's tables
(pipeline/sql/sink.py): ``result_<target>`` per INSERT and one ``dead_letter`` (a bad message read
by two INSERTs is one dead letter). A ``kill -9`` at any moment re-runs the batch from the
checkpoint: every table commits it once (its transaction id), every topic gets the same rows.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.sql.envelope import envelope_ddl, make_parser
from pipeline.sql.plan import Plan
from pipeline.sql.sink import build_dead_letters, build_result, split_unsendable

INSERT_COLUMN = "_insert"


def result_sink(plans: tuple[Plan, ...], index: int) -> str:
    """The result table's sink name of INSERT ``index``: ``result`` for a script of one INSERT,
    ``result_<target>`` (the target table's name, lower case) in a statement set."""
    return "result" if len(plans) == 1 else f"result_{plans[index].target.name.lower()}"


def branch_prefix(index: int) -> str:
    return f"i{index}_"


def build_set_frame(source, plans: tuple[Plan, ...], apply_operators, temporal_frame=None):
    """The union of every INSERT's operator output over one shared, keyed read of ``source``; an
    INSERT with a temporal join is ``temporal_frame(plan)``, its tables read by sources of its own,
    each with its watermark (pipeline/sql/temporal_stream.py).

    # in:  {"kind": "users", "key": "u1", "value": b"…", …}  (the source's rows)
    # out: {"_insert": 1, "i1_key": "u1", "i1_op": "after", "i1_s0_uid": "u1", …, "i0_…": null}
    """
    from pyspark.sql import functions as F

    shared = source.repartition("key")  # the one exchange every branch shares (reused by Spark)
    union = None
    for index, plan in enumerate(plans):
        if plan.temporal is not None:
            out = temporal_frame(plan)
        else:
            names = sorted({table.name for table in plan.sides})
            rows = shared.filter(F.col("kind").isin(*names)).mapInArrow(make_parser(plan), envelope_ddl(plan))
            out = apply_operators(rows, plan)
        out = out.select(F.lit(index).alias(INSERT_COLUMN),
                         *[F.col(f"`{c}`").alias(branch_prefix(index) + c) for c in out.columns])
        union = out if union is None else union.unionByName(out, allowMissingColumns=True)
    return union


def split_set_batch(table: pa.Table, count: int) -> list[pa.Table]:
    """Each INSERT's rows of a batch of the union, under their own column names."""
    parts = []
    for index in range(count):
        prefix = branch_prefix(index)
        mine = table.filter(pc.equal(table[INSERT_COLUMN], index))
        names = [name for name in mine.column_names if name.startswith(prefix)]
        parts.append(mine.select(names).rename_columns([name[len(prefix):] for name in names]))
    return parts


def unique_dead_letters(dead: pa.Table) -> pa.Table:
    """One dead letter per source message: a bad message of a table two INSERTs read is parsed
    by both. Dead letters without a message id (result rows a topic cannot take) all stay."""
    seen, keep = set(), []
    for row in dead.select(["source_topic", "source_partition", "source_message_id", "error"]).to_pylist():
        position = (row["source_topic"], row["source_partition"], row["source_message_id"])
        duplicate = row["source_message_id"] is not None and position in seen
        seen.add(position)
        keep.append(not duplicate)
    return dead.filter(pa.array(keep, pa.bool_())) if dead.num_rows else dead


def write_set_batch(plans: tuple[Plan, ...], senders: list, writer, table: pa.Table, batch_id: int,
                    now_ms: int) -> None:
    """A batch of the union to every INSERT's topic (``senders[i](plan, result)``: pipeline/sql/runner.py
    build_senders), then one commit of every table (called in foreachBatch, on the driver)."""
    tables, dead = {}, []
    for index, (plan, rows) in enumerate(zip(plans, split_set_batch(table, len(plans)))):
        result, unsendable = split_unsendable(plan, build_result(plan, rows, batch_id, now_ms), batch_id, now_ms)
        senders[index](plan, result)
        tables[result_sink(plans, index)] = result
        dead += [build_dead_letters(rows, batch_id, now_ms), unsendable]
    tables["dead_letter"] = unique_dead_letters(pa.concat_tables(dead))
    writer.commit_batch(tables, batch_id)
