"""Runs one SQL pipeline as a Spark streaming query, restartable from its own checkpoint.

``python -m pipeline sql FILE.sql [--name NAME]`` calls :func:`run_sql_pipeline`. The query::

    pulsar source (one kind per table, parsed to envelope rows in its read tasks) ─ [Spark: derived columns, WHERE]
      ─ UpsertJoin (keyed by primary key) [─ GroupAggregate (keyed by group) for GROUP BY ─ Spark: HAVING]
      ─ Spark: SELECT expressions ─ foreachBatch(topic + Parquet sinks)

(a temporal join's query, a source and watermark per table: pipeline/sql/temporal_stream.py).

Everything of a pipeline lives under ``<data_dir>/sql/<name>/`` (pipeline/store.py):
``checkpoint/``, ``sinks/`` (Delta tables, pipeline/sql/sink.py), ``metrics/`` (progress
and events, as the job's metrics store) and ``pipeline.json`` (its statements, tables and
topics, for the console). A ``pipeline.lock`` flock keeps one process per pipeline; several
pipelines, each named, run side by side (each its own process or query).

Guarantees: the Delta sinks are exactly-once for a reader of their log across ``kill -9`` (one
commit per batch, with the batch's transaction id); the topic gets each batch's rows at least
once (an upsert topic absorbs a re-sent batch). Restarts are the job's (runtime/supervisor.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from pipeline import store
from pipeline.config import Settings
from pipeline.errors import ConfigError, ControlError, StatefulStreamsError
from pipeline.runtime.freed_memory import give_back_freed_memory
from pipeline.metrics import MetricsStore, prune_old_days
from pipeline.sinks import SinkMaintenance, last_committed_batch
from pipeline.sql.envelope import field_name, used_columns
from pipeline.sql.foreign_key import apply_foreign_key_join, foreign_key_fingerprint
from pipeline.sql.plan import Plan, present_field
from pipeline.sql.progress import make_listener
from pipeline.sql.settings import state_ttl_ms
from pipeline.sql.source import read_parsed, read_source
from pipeline.sql.statement_set import build_set_frame, result_sink, write_set_batch
from pipeline.sql.sink import (SqlSinkWriter, build_dead_letters, build_result, build_senders, output_field,
                               split_unsendable)

log = logging.getLogger(__name__)
PIPELINE_FILE = "pipeline.json"
# store.ensure_data_dir's write probe is named by the process: pipelines started together in one
# process (python -m pipeline sql A.sql B.sql) take turns at it.
_DATA_DIR_CHECK = threading.Lock()


class SqlPipelineFailed(StatefulStreamsError):
    """The pipeline stopped: its restart attempts are spent."""


def name_from_path(path: str) -> str:
    """A pipeline name from a .sql file name: its stem, other characters as '-'."""
    stem = Path(path).stem
    return "".join(ch if ch.isalnum() or ch in "_-" else "-" for ch in stem) or "sql"


def plan_fingerprint(plan: Plan) -> str:
    """Changes when the state layout would: the tables' used columns and the query's outputs."""
    old = ("name", "side", "column", "aggregate", "argument")  # what a plan held before expressions
    parts = [used_columns(plan), [{k: o.__dict__[k] for k in old} for o in plan.outputs], plan.kind, plan.group_by,
             [t.name for t in plan.sides]]
    computed = [plan.where, plan.where_joined, plan.having, [d.__dict__ for d in plan.derived],
                [a.__dict__ for a in plan.aggregates], list(plan.group_fields), [o.expression for o in plan.outputs]]
    if (plan.where or plan.where_joined or plan.having or plan.derived or any(o.expression for o in plan.outputs)
            or len(plan.group_fields) > 1):
        parts.append(computed)  # a plan of plain columns and aggregates keeps the fingerprint it had
    if plan.foreign_key:
        parts.append(foreign_key_fingerprint(plan))  # operators keyed otherwise than a key join's one
    if plan.temporal is not None:
        parts.append(["temporal", plan.temporal.fingerprint()])  # a versioned lookup and a join keyed otherwise
    if state_ttl_ms(plan.settings):
        # TTL'd state and timers are another layout (its length is not: it may change on a restart)
        parts.append("state ttl")
    text = json.dumps(parts, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pipeline_fingerprint(plans: tuple[Plan, ...]) -> str:
    """A script's fingerprint: its one INSERT's, or one of every INSERT's in a statement set."""
    if len(plans) == 1:
        return plan_fingerprint(plans[0])
    return hashlib.sha256(json.dumps([plan_fingerprint(p) for p in plans]).encode()).hexdigest()[:16]


def describe_pipeline(plans: Plan | tuple[Plan, ...], name: str) -> dict:
    """What ``pipeline.json`` says (read by the console): the first INSERT's target, and in a
    statement set each INSERT's under ``inserts`` with its result sink."""
    plans = plans if isinstance(plans, tuple) else (plans,)
    described = dict(_describe(plans[0], name), fingerprint=pipeline_fingerprint(plans),
                     sources={t.name: t.topic for p in plans for t in p.sides})
    if len(plans) > 1:
        described["kind"] = "statement set"
        described["inserts"] = [dict(_describe(p, name), sink=result_sink(plans, i)) for i, p in enumerate(plans)]
    return described


def _describe(plan: Plan, name: str) -> dict:
    return {"name": name, "kind": plan.kind, "statements": list(plan.statements), "fingerprint": plan_fingerprint(plan),
            "sources": {t.name: t.topic for t in plan.sides}, "target": plan.target.name,
            "target_topic": plan.target.topic, "primary_key": plan.target.primary_key,
            "columns": [c.name for c in plan.target.payload_columns]}


def check_checkpoint(root: Path, plans: tuple[Plan, ...], name: str) -> None:
    """Refuse a checkpoint that other statements wrote (its state has another layout)."""
    info = root / PIPELINE_FILE
    if last_committed_batch(root / "checkpoint") >= 0 and info.is_file():
        old = json.loads(info.read_text()).get("fingerprint")
        if old != pipeline_fingerprint(plans):
            raise ConfigError(f"SQL pipeline {name!r} has a checkpoint under {str(root)!r} written by other "
                              "statements; give these statements another --name, or delete that folder to start over")


def lock_pipeline(root: Path, name: str) -> int:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "pipeline.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ControlError(f"SQL pipeline {name!r} already runs (lock {str(root / 'pipeline.lock')!r}); "
                           "stop it first or use another --name") from None
    return fd


def apply_operators(rows, plan: Plan):
    """The envelope rows through UpsertJoin (and GroupAggregate for GROUP BY), on the JVM, with
    Spark evaluating WHERE, the derived columns, HAVING and the SELECT expressions around them.

    # in:  {"key": "100-1", "side": 0, "op": "upsert", "s0_accountId": "100", …}
    # out (join):      {"key": "100-1", "op": "after"|"delete"|"dead" [|"before"], "s0_accountId": "100",
    #                   "s1_favoriteColor": …, "out<i>": …[, "_pass": true (WHERE on a joined table)]}
    # out (aggregate): {"op": "upsert"|"delete"|"dead", "s0_accountId": "100", "agg1": 2, …, "out<i>": …}
    #                  (with HAVING, as apply_having gives)
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    jvm = spark._jvm.statefulstreams
    rows = apply_where(rows, plan)
    used = used_columns(plan)
    sides = [[field_name(s, c) for s, c in used if s == side] for side in range(len(plan.sides))]
    if not plan.derived_on_joined_rows:
        sides[0] += [d.name for d in plan.derived]  # kept in UpsertJoin's state with the row they came from
    for side in plan.inner:
        # TRUE on the side's own rows, kept with them: NULL in a joined row the side is missing from
        rows = rows.withColumn(present_field(side), F.when(F.col("side") == side, F.lit(True)))
        sides[side].append(present_field(side))
    aggregate = plan.kind == "aggregate"
    # a WHERE on a joined table's column (or an inner join's "each inner side has a row") needs
    # each key's row as it was (op "before") to know whether that row was sent
    # (pipeline/sql/sink.py resolve_changes)
    ttl_ms = state_ttl_ms(plan.settings)  # table.exec.state.ttl: 0 keeps every key
    join = (jvm.JoinSpec().key("key").side("side").op("op").sides(sides)
            .readOrder(["source_partition", "position"]).emitBefore(aggregate or plan.where_joined is not None)
            .stateTtlMs(ttl_ms))
    out = (apply_foreign_key_join(rows, plan, sides) if plan.foreign_key
           else DataFrame(jvm.UpsertJoin.apply(rows._jdf, join), spark))
    if aggregate and plan.derived_on_joined_rows:
        out = apply_joined_where(out, plan)
    elif plan.where_joined:
        out = out.withColumn("_pass", F.expr(f"coalesce({plan.where_joined}, FALSE)"))
    return apply_aggregate(out, plan) if aggregate else select_outputs(out, plan)


def apply_aggregate(joined, plan: Plan):
    """GROUP BY: a join's rows (``before``/``after``/``delete`` per member key, WHERE already
    applied) through GroupAggregate, then the SELECT's expressions and HAVING.

    # in:  {"key": "u1", "op": "before"|"after"|"delete", "s0_accountId": "A", …}
    # out: {"op": "upsert"|"delete"|"dead", "s0_accountId": "A", "agg1": 2, …, "out<i>": …}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = joined.sparkSession
    ttl_ms = state_ttl_ms(plan.settings)
    groups = list(plan.group_fields) or [field_name(0, column) for column in plan.group_by]
    out = joined.withColumn("group_key", F.to_json(F.array(*[F.col(g).cast("string") for g in groups])))
    spec = (spark._jvm.statefulstreams.AggregateSpec().groupKey("group_key").member("key").op("op").groups(groups)
            .stateTtlMs(ttl_ms))
    for call in plan.aggregates:
        spec.aggregate(call.function, call.input, call.name)
    out = DataFrame(spark._jvm.statefulstreams.GroupAggregate.apply(out._jdf, spec), spark)
    if ttl_ms and not plan.having:
        out = out.where(~F.col("op").eqNullSafe("expire"))  # a group the TTL dropped: nothing to send
    out = select_outputs(out, plan)
    return apply_having(out, plan) if plan.having else out


def select_outputs(out, plan: Plan):
    """The SELECT's expressions evaluated on the operators' rows, as ``out<i>`` columns."""
    from pyspark.sql import functions as F

    computed = [F.expr(f"TRY_CAST({o.expression} AS {o.spark_type.upper() if o.spark_type != 'null' else 'STRING'})")
                .alias(f"out{i}") for i, o in enumerate(plan.outputs) if o.expression]
    return out.select("*", *computed) if computed else out


def apply_joined_where(out, plan: Plan):
    """GROUP BY over a JOIN: the derived columns computed on the joined rows, and a joined row
    that fails WHERE on a joined table's column (or misses an inner side) taken out of its
    group, as a deleted row is: GroupAggregate removes a member on ``before`` and ``delete``.

    # in:  {"key": "u1", "op": "before"|"after"|"delete", "s0_accountId": "A", "s1_color": "red", …}
    # out: {"key": "u1", "op": "delete" (an after that fails WHERE), …, "d0": …}
    """
    from pyspark.sql import functions as F

    if plan.derived:
        out = out.select("*", *[F.expr(d.sql).alias(d.name) for d in plan.derived])
    if plan.where_joined:
        out = out.withColumn("op", F.expr(f"CASE WHEN op = 'after' AND NOT coalesce({plan.where_joined}, FALSE) "
                                          "THEN 'delete' ELSE op END"))
    return out


def apply_having(out, plan: Plan):
    """HAVING as Flink means it: a group's row is sent while it passes, and retracted once when it
    stops. A second UpsertJoin, keyed by the result's key (JSON-encoded, so that a NULL key stays
    apart), gives each changed group's row before and after the batch; pipeline/sql/sink.py
    resolve_changes sends what changed. It has no TTL of its own: a group that
    ``table.exec.state.ttl`` dropped comes as an ``expire`` row, which drops the group's last row
    here too and sends nothing, so the group's next row is sent if it passes, as Flink's filter does.

    # in:  {"op": "upsert"|"delete"|"dead", "s0_accountId": "100", "agg1": 2, "out<i>": …}
    # out: {"key": "[\"100\"]", "op": "before"|"after"|"delete"|"dead", …, "_pass": true, "_result_key": "100"}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = out.sparkSession
    jvm = spark._jvm.statefulstreams
    key = output_field(plan, plan.target.primary_key)
    result_key = f"CASE WHEN op = 'dead' THEN key ELSE to_json(array(CAST(`{key}` AS STRING))) END"
    # side 0, nullable: UpsertJoin's output rows have the input's schema, and leave side null
    out = out.withColumn("key", F.expr(result_key)).withColumn("side", F.when(F.col("op").isNotNull(), F.lit(0)))
    values = [c for c in out.columns if c == key or c in plan.group_fields or c.startswith(("agg", "out"))
              or c in {field_name(0, g) for g in plan.group_by}]
    join = (jvm.JoinSpec().key("key").side("side").op("op").sides([values]).readOrder([]).emitBefore(True))
    out = DataFrame(jvm.UpsertJoin.apply(out._jdf, join), spark)
    decoded = "CASE WHEN op = 'dead' THEN NULL ELSE from_json(key, 'array<string>')[0] END"
    return out.withColumn("_pass", F.expr(f"coalesce({plan.having}, FALSE)")).withColumn("_result_key", F.expr(decoded))


def apply_where(rows, plan: Plan):
    """The driving table's derived columns, and WHERE as Flink means it on an upsert table: a row
    that does not match is deleted (its earlier result retracted), one that matches is upserted.

    # {"key": "100-1", "side": 0, "op": "upsert" → "delete" when WHERE is not TRUE, "d0": …}
    """
    from pyspark.sql import functions as F

    if plan.derived and not plan.derived_on_joined_rows:
        rows = rows.select("*", *[F.expr(d.sql).alias(d.name) for d in plan.derived])
    if plan.where:
        rows = rows.withColumn("op", F.expr(f"CASE WHEN op = 'upsert' AND side = 0 AND NOT coalesce({plan.where}, FALSE) "
                                            "THEN 'delete' ELSE op END"))
    return rows


def source_tables(plans: tuple[Plan, ...]) -> list:
    """Every table the INSERTs read, each once, in the order first read."""
    found = {}
    for plan in plans:
        for table in plan.sides:
            found.setdefault(table.name.lower(), table)
    return list(found.values())


def build_frame(spark, settings: Settings, plans: tuple[Plan, ...], name: str, service_url: str):
    """The query's rows up to the sink. A statement set parses after its one shared read (each
    INSERT its own envelope); otherwise the source's read tasks parse (``read_parsed``)."""
    from pipeline.sql.temporal_stream import build_temporal_frame

    if len(plans) == 1:
        if plans[0].temporal is not None:
            return build_temporal_frame(spark, settings, plans[0], name, service_url)
        return apply_operators(read_parsed(spark, settings, plans[0], name, service_url), plans[0])
    # a statement set: its temporal INSERT (one at most: script.py) reads its tables in sources of its own
    shared = [plan for plan in plans if plan.temporal is None]
    return build_set_frame(read_source(spark, settings, source_tables(tuple(shared)), name, service_url,
                                       ttl_ms=pipeline_ttl_ms(plans)), plans,
                           apply_operators, lambda plan: build_temporal_frame(spark, settings, plan, name, service_url, in_set=True))


def build_query(spark, settings: Settings, plans: tuple[Plan, ...], name: str, service_url: str, writer: SqlSinkWriter,
                senders: list, guard=lambda write: write):
    from pipeline.runtime.spark import start_without_idle_batches

    out = build_frame(spark, settings, plans, name, service_url)

    def write_batch(batch_df, batch_id: int) -> None:
        import time

        import pyarrow as pa

        table = batch_df.toArrow()
        now = int(time.time() * 1000)
        if len(plans) > 1:
            write_set_batch(plans, senders, writer, table, batch_id, now)
        else:
            plan = plans[0]
            result, unsendable = split_unsendable(plan, build_result(plan, table, batch_id, now), batch_id, now)
            senders[0](plan, result)
            dead_letters = pa.concat_tables([build_dead_letters(table, batch_id, now), unsendable])
            writer.commit_batch({"result": result, "dead_letter": dead_letters}, batch_id)
        give_back_freed_memory()

    interval_ms = int(settings["job.trigger_interval"] * 1000)
    stream = (out.writeStream.queryName(f"sql-{name}").foreachBatch(guard(write_batch))
              .option("checkpointLocation", str(store.sql_dir(settings.data_dir, name) / "checkpoint"))
              .trigger(processingTime=f"{interval_ms} milliseconds"))
    # a state TTL's processing-time timers: the source plans the one batch of no row they need
    # once the input is quiet (source.py read_topics), where Spark would run one every trigger
    return start_without_idle_batches(spark, stream) if pipeline_ttl_ms(plans) else stream.start()


def pipeline_ttl_ms(plans: tuple[Plan, ...]) -> int:
    """The pipeline's ``table.exec.state.ttl`` (a script's SET holds for each of its INSERTs)."""
    return max(state_ttl_ms(plan.settings) for plan in plans)


def start_maintenance(settings: Settings, root: Path, writer: SqlSinkWriter, record) -> SinkMaintenance:
    """The pipeline's maintenance thread, as the job's (pipeline/job.py): every
    ``sinks.compact_interval`` its two tables are compacted and vacuumed, and its metrics day
    files (``<root>/metrics/``) past ``metrics.retention`` removed; each round is an event."""
    return SinkMaintenance.from_settings(writer, root, settings, record,
                                         prune=lambda: prune_old_days(root, settings["metrics.retention"])).start()


def run_sql_pipeline(settings: Settings, plan: Plan | tuple[Plan, ...], name: str, max_batches: int = 0,
                     stop: threading.Event | None = None, spark=None) -> None:
    """Run the pipeline (one INSERT's plan, or a statement set's plans) until stopped (``stop``,
    Ctrl-C / SIGTERM), ``max_batches`` are done, or it fails for good."""
    from pipeline.job import connect_broker
    from pipeline.runtime.supervisor import Lifecycle, Supervisor, stop_on_signals
    from pipeline.runtime.spark import deliver_pending_events
    from pipeline.feed.topics import make_client
    from pipeline.sql.jvm_sender import close_sinks

    with _DATA_DIR_CHECK:
        root = store.sql_dir(store.ensure_data_dir(settings.data_dir), name)
    fd = lock_pipeline(root, name)
    plans = plan if isinstance(plan, tuple) else (plan,)
    own_broker = client = listener = maintenance = None
    jvm_senders = []
    try:
        check_checkpoint(root, plans, name)
        (root / PIPELINE_FILE).write_text(json.dumps(describe_pipeline(plans, name), indent=2) + "\n")
        checkpoint = root / "checkpoint"
        metrics = MetricsStore(root)
        writer = SqlSinkWriter(root, [result_sink(plans, i) for i in range(len(plans))])
        stop = stop or threading.Event()
        stop_on_signals(stop)
        service_url, own_broker = connect_broker(settings)
        client = make_client(service_url, token=settings["pulsar.auth_token"])
        if spark is None:
            from pipeline.runtime.spark import build_spark

            spark = build_spark(settings, app_name=f"sql-{name}")
            stop_on_signals(stop)
        senders, jvm_senders = build_senders(spark, settings, plans, service_url, client)
        done = [0]

        def on_batch(_batch_id: int) -> None:
            done[0] += 1
            if max_batches and done[0] >= max_batches:
                stop.set()

        from pipeline.sql.join_clock import join_clock_for

        join_clock = join_clock_for(root, plans, settings, service_url, metrics.event)
        listener = make_listener(f"sql-{name}", metrics, writer, on_batch, join_clock)
        spark.streams.addListener(listener)
        into = ", ".join(f"{p.kind} into {p.target.topic}" for p in plans)
        metrics.event("sql_started", f"SQL pipeline {name!r} started: {into}",
                      sources={t.name: t.topic for t in source_tables(plans)})
        maintenance = start_maintenance(settings, root, writer, metrics.event)
        lifecycle = Lifecycle(f"SQL pipeline {name!r}", "sql_failed", "sql_stopped", SqlPipelineFailed)
        supervisor = Supervisor(lifecycle, stop, settings["job.restart.attempts"], settings["job.restart.delay"],
                                metrics.event, root)

        def start():
            writer.recover(last_committed_batch(checkpoint))
            return build_query(spark, settings, plans, name, service_url, writer, senders, supervisor.batch)

        supervisor.run(start, committed=lambda: last_committed_batch(checkpoint), failure=lambda: writer.failure)
    finally:
        if maintenance is not None:
            maintenance.stop()
        if listener is not None:
            deliver_pending_events(spark)  # the last batch's progress row, before its listener goes
            spark.streams.removeListener(listener)
        close_sinks(jvm_senders)
        if client is not None:
            client.close()
        if own_broker is not None:
            own_broker.stop()
        os.close(fd)
