"""A temporal join's Spark query: each table's source and watermark, VersionedLookup, and the result per key.

Called on the driver while the query is built (pipeline/sql/runner.py build_query); the plan is
pipeline/sql/temporal.py's. The query::

    source(driving table) ─ parse + times ─ watermark(its WATERMARK delay) ─┐
    source(versioned table) ─ parse + times ─ watermark(its delay) ──────────┤ union (the least
    [source(next versioned table) ─ … ───────────────────────────────────────┘  watermark)]
      ↑ each table's clock file (pipeline/sql/join_clock.py): its partitions' newest times
      ─ WHERE on the driving table ─ VersionedLookup per temporal join (keyed by its join value)
      ─ matched? ─ UpsertJoin (keyed by the driving key) [─ GroupAggregate for GROUP BY] ─ SELECT
      expressions ─ sink

- Parse + times run in each source's read tasks (its ``transform``: :func:`parse_timed_batches`).
- A row counts for its table's watermark up to its ``watermark_bound``, which the source gives
  it from the table's clock (pipeline/sql/join_clock.py): so a table's watermark is the least of
  its partitions' newest times, as Flink's, not the newest of any. When a table's clock moves
  with no new message, or an idle table is raised to the active tables' watermark
  (``table.exec.source.idle-timeout``), its source yields one clock row (op ``clock``) at the
  clock's time; clock rows are dropped after the watermark nodes.

- Times: a row's time is its time attribute; a tombstone (no payload) is placed at its message's
  event time, or its publish time when the producer set none. An upsert whose time attribute is
  NULL or unreadable is a dead letter: it cannot be placed in time.
- Each table has its own source, so its own watermark node: the least of its partitions' newest
  times minus its WATERMARK delay, and the join's watermark is the least of them, as Flink's (a
  table that has sent nothing holds it back: Spark holds the least at 0 for a node without
  rows, until the table is idle).
- VersionedLookup (pipeline/jvm/, the job's event-time operator) keeps each join value's versions
  and decides a driving row once the watermark passes its time, with the version current then
  (``maxWait`` 0: none after it): :func:`_lookup_versions`. Several temporal joins are lookups
  chained as the job chains its users and items lookups: a row the first decided on time is on
  time for the next (its ``late`` column), which decides it at once with the version current at
  its time.
- A driving row first read below the watermark is late: joined at once with the versions the
  join value still holds (``joinLate``), as Flink's: those at or after the watermark, and the one
  current at it. A row older than that one finds none (INNER drops it, LEFT pads it with NULLs).
- The decided rows go through an UpsertJoin keyed by the driving table's key, with the row as it
  was sent before: per key the row decided last is the result (of one batch, the one read last);
  a driving tombstone, decided at its time too, deletes the key's row; an INNER row without a
  version (or failing WHERE on the versioned table) retracts what was sent for its key.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline import store, wire
from pipeline.config import Settings
from pipeline.source.rows import CLOCK_KIND
from pipeline.sql.envelope import (BASE_FIELDS, arrow_schema, envelope_fields, parse_batches, parse_timestamp,
                                   parser_args, used_columns)
from pipeline.sql.plan import Plan, field_name

WATERMARK_COLUMN = "_watermark_time"
# the table's name; the row's time in epoch ms; the most it counts for the watermark (join_clock.py)
EXTRA_FIELDS = [("kind", "string"), ("event_ms", "bigint"), ("watermark_bound", "bigint")]
# VersionedLookup's working columns (statefulstreams.LookupSpec); what it writes is read here only
LOOKUP_FIELDS = [("join_hash", "bigint"), ("join_key", "string"), ("version_key", "string"),
                 ("lookup_role", "string"), ("found", "string"), ("first_seen_ms", "bigint"), ("waited_ms", "bigint"),
                 ("late", "bigint"), ("as_of", "bigint")]
NEVER_FUTURE_MS = 2**62  # no driving row is "from the future" (the job's guard); times are far below it


def as_text(plan: Plan) -> Plan:
    """The plan the envelope parser is given: TIMESTAMP(3) payload columns read as JSON text."""
    sides = tuple(replace(t, columns=tuple(replace(c, spark_type="string") if c.spark_type == "timestamp"
                                           and not c.metadata else c for c in t.columns)) for t in plan.sides)
    return replace(plan, sides=sides)


def time_specs(plan: Plan) -> list[dict]:
    """What :func:`decide_times` needs of each side, as JSON-ready data: its table's name, time
    attribute and TIMESTAMP(3) payload columns."""
    return [{"table": t.name, "time": t.watermark[0],
             "timestamps": [c.name for c in t.payload_columns if c.spark_type == "timestamp"]} for t in plan.sides]


def decide_times(times: list[dict], row: dict, message: dict) -> dict:
    """One envelope row with its ``event_ms`` (and its TIMESTAMP(3) text parsed), or made a dead
    letter when its time cannot be read (``times``: :func:`time_specs`). Pure; runs on the executors.

    # row: {"side": 0, "op": "upsert", "s0_order_time": "2024-05-01 12:00:00.000", …}
    # -> {"side": 0, "op": "upsert", "s0_order_time": datetime(2024, 5, 1, 12, tzinfo=UTC), "event_ms": 1714564800000}
    """
    side, spec = row["side"], times[row["side"]]
    time_field = field_name(side, spec["time"])
    row["kind"] = spec["table"]
    if row["op"] == "upsert":
        for column in spec["timestamps"]:
            name = field_name(side, column)
            text = row.get(name)
            if isinstance(text, str):
                try:
                    row[name] = parse_timestamp(text)
                except ValueError:
                    shown = text if len(text) <= 40 else text[:37] + "..."
                    return _dead(row, message, f"table {spec['table']!r} column {column!r}: expected TIMESTAMP(3) "
                                               f"text such as '2024-05-01 12:00:00.000', got {shown!r}")
        if row.get(time_field) is None:
            return _dead(row, message, f"table {spec['table']!r}: its time attribute {spec['time']!r} is NULL; a "
                                       "temporal join places each row at its time")
        row["event_ms"] = int(row[time_field].timestamp() * 1000)
    elif row["op"] == "delete":
        row["event_ms"] = message["event_time"] if message.get("event_time") is not None else row["published_ms"]
    return row


def _dead(row: dict, message: dict, error: str) -> dict:
    """The row as a dead letter: its message's facts and payload, no table values (as the envelope
    parser's dead rows: a TIMESTAMP(3) column's unread text fits no timestamp)."""
    kept = {name: row[name] for name, _ in BASE_FIELDS if name in row}
    return dict(kept, kind=row["kind"], op="dead", error=error, payload=wire.payload_text(message["value"]),
                event_ms=None)


PARSE_TRANSFORM = "pipeline.sql.temporal_stream:parse_timed_batches"  # the sources' ``transform`` option


def timed_parser_args(plan: Plan) -> dict:
    """What :func:`parse_timed_batches` needs of a plan, as JSON-ready data (the ``transformArgs``)."""
    return {"parser": parser_args(as_text(plan)), "fields": envelope_fields(plan) + EXTRA_FIELDS,
            "times": time_specs(plan)}


def parse_timed_batches(batches, parser: dict, fields: list, times: list[dict]):
    """A temporal join's parse step, in its sources' read tasks: the envelope parser's rows
    (pipeline/sql/envelope.py, one per message, in order) with their times (:func:`timed_parser_args`)."""
    import pyarrow as pa

    schema = arrow_schema(fields)
    for batch in batches:
        if batch.num_rows and batch.column("kind")[0].as_py() == CLOCK_KIND:  # the table's clock moved (join_clock.py)
            at = batch.column("event_time")[0].as_py()
            yield pa.RecordBatch.from_pylist([{"op": CLOCK_KIND, "kind": CLOCK_KIND, "event_ms": at, "watermark_bound": at,
                                               "source_partition": -1, "position": 0}], schema=schema)
            continue
        messages = batch.select(["event_time", "value", "watermark_bound"]).to_pylist()
        for parsed in parse_batches(iter([batch]), **parser):
            rows = [dict(decide_times(times, row, message), watermark_bound=message["watermark_bound"])
                    for row, message in zip(parsed.to_pylist(), messages)]
            yield pa.RecordBatch.from_pylist(rows, schema=schema)


def temporal_ddl(plan: Plan) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in envelope_fields(plan) + EXTRA_FIELDS)


def build_temporal_frame(spark, settings: Settings, plan: Plan, name: str, service_url: str, in_set: bool = False):
    """The query's rows up to the sink: a join's (key, op before/after/delete/dead, s<i>_…, out<i>, _pass).
    ``in_set``: beside a statement set's shared read, whose row counts have the plain name."""
    from pyspark.sql import functions as F

    from pipeline.source.clock import partition_name
    from pipeline.source.counts import SOURCE_ROWS, list_topic_partitions
    from pipeline.sql.join_clock import NEWEST_OBSERVED, clock_path
    from pipeline.sql.source import count_rows, read_topics

    partitions = list_topic_partitions(service_url, {t.name: t.topic for t in plan.sides}, settings["pulsar.auth_token"])
    timed = ~F.col("op").eqNullSafe(CLOCK_KIND) & F.col("event_ms").isNotNull()
    frames = []
    for side, table in enumerate(plan.sides):
        # {"key": "o1", "side": 0, "op": "upsert", …, "kind": "orders", "event_ms": 1714564800000, "watermark_bound": …}
        rows = read_topics(spark, settings, [table], name, service_url, stats=f"source-stats-{side}",
                           parser=(PARSE_TRANSFORM, timed_parser_args(plan), temporal_ddl(plan)),
                           clock_file=clock_path(store.sql_dir(settings.data_dir, name), side))
        # each partition's newest time, for the table's clock (pipeline/sql/join_clock.py)
        rows = rows.observe(NEWEST_OBSERVED.format(side=side), *[
            F.max(F.when(timed & (F.col("source_partition") == int(p)), F.col("event_ms")))
            .alias(partition_name(table.name, p)) for p in partitions[table.name]])
        # the table's watermark: each row's time up to its bound, minus the delay (Spark keeps the
        # least of the nodes); a clock row counts here, and goes no further
        bound = F.col("watermark_bound")
        stamp = F.when(F.col("event_ms").isNotNull() & bound.isNotNull(),
                       F.timestamp_millis(F.least(F.col("event_ms"), bound)))
        frames.append(rows.withColumn(WATERMARK_COLUMN, stamp)
                      .withWatermark(WATERMARK_COLUMN, f"{int(table.watermark[1])} milliseconds"))
    rows = frames[0]
    for frame in frames[1:]:
        rows = rows.unionByName(frame)
    # the clock rows dropped; the test names the watermark column, so Spark cannot push it below the watermark
    stamp = F.col(WATERMARK_COLUMN)
    rows = rows.where(F.when(~F.col("op").eqNullSafe(CLOCK_KIND), stamp.isNull() | stamp.isNotNull())
                      .otherwise(F.lit(False)))
    # without the watermark column the operators see every row (a late one is decided, not dropped)
    rows = rows.drop(WATERMARK_COLUMN, "watermark_bound")
    rows = count_rows(rows, settings, plan.sides, service_url, partition_column="source_partition",
                      partitions=partitions, name=f"{SOURCE_ROWS}_temporal" if in_set else None)
    return apply_temporal_join(rows, plan)


def apply_temporal_join(rows, plan: Plan):
    """Envelope rows with times through a VersionedLookup per temporal join, in the order written,
    and the per-key UpsertJoin.

    # in:  {"key": "o1", "side": 0, "op": "upsert", "s0_user_id": "u1", "event_ms": 1714564800000, …}
    # out: {"key": "o1", "op": "before"|"after"|"delete"|"dead", "s0_…", "s1_name": "Ada", "_pass": true,
    #       "out<i>": …}
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    from pipeline.sql.runner import apply_aggregate, apply_where, select_outputs

    spark = rows.sparkSession
    op = F.col("op")
    rows = apply_where(rows, plan)  # a driving row WHERE refuses is a delete of its key, at its time
    # the late column: how a driving row's time stood when the first lookup judged it, which the
    # next ones keep (as the job's chained lookups: a row decided on time is on time for each)
    rows = rows.withColumn("late", F.lit(None).cast("bigint"))
    used = used_columns(plan)
    for join in plan.temporal.joins:
        rows, found = _lookup_versions(rows, plan, join, [field_name(s, c) for s, c in used if s == join.side])
        rows = rows.withColumn(matched_column(join), found).drop(*[n for n, _ in LOOKUP_FIELDS if n != "late"])
    passes = [F.col(matched_column(join)) for join in plan.temporal.joins if join.inner]
    passes += [F.expr(f"coalesce({plan.where_joined}, FALSE)")] if plan.where_joined else []
    passed = F.when(op.isNotNull(), True)  # nullable, as every column UpsertJoin does not keep must be
    for condition in passes:
        passed = passed & condition
    out = rows.withColumn("_pass", passed).drop("late", *[matched_column(join) for join in plan.temporal.joins])
    values = [field_name(s, c) for s, c in used] + ["_pass"]
    join_spec = (spark._jvm.statefulstreams.JoinSpec().key("key").side("side").op("op").sides([values])
                 .readOrder(["source_partition", "position"]).emitBefore(True))
    joined = DataFrame(spark._jvm.statefulstreams.UpsertJoin.apply(out._jdf, join_spec), spark)
    if plan.kind != "aggregate":
        return select_outputs(joined, plan)
    # GROUP BY over the join: a row that fails the join (INNER without a version, WHERE on a
    # versioned table) leaves its group, as a deleted row does; the GROUP BY expressions are
    # computed on the joined rows
    joined = joined.select("*", *[F.expr(d.sql).alias(d.name) for d in plan.derived])
    joined = joined.withColumn("op", F.when((op == "after") & ~F.coalesce(F.col("_pass"), F.lit(False)), "delete")
                               .otherwise(op))
    return apply_aggregate(joined, plan)


def matched_column(join) -> str:
    """Whether a driving row found a version in ``join``'s versioned table (between the lookups)."""
    return f"_matched{join.side}"


def _lookup_versions(rows, plan: Plan, join, state: list[str]):
    """``rows`` through one VersionedLookup: the driving rows (side 0) look up ``join``'s versioned
    table (its side's rows are its versions, and go no further); other tables' rows pass. Gives
    the rows, with the side's columns NULL where no version of the join value was found, and the
    column saying whether one was.

    The lookup's key is a whole number, so the join value is keyed by its 64-bit hash, and the
    version's own key is carried with it: a version of another key that shares the hash is never
    joined (the row becomes a dead letter naming it)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    spark = rows.sparkSession
    side, op, versions = F.col("side"), F.col("op"), F.col("side") == join.side
    join_key = F.when(side == 0, F.col(field_name(0, join.join_column))).otherwise(F.col("key"))
    roles = (F.when(op == "dead", "pass").when(versions & (op == "upsert"), "set").when(versions, "delete")
             .when(side == 0, "lookup").otherwise("pass"))
    rows = rows.select("*", join_key.alias("join_key"), F.when(versions, F.col("key")).alias("version_key"),
                       F.xxhash64(F.coalesce(join_key, F.col("key"))).alias("join_hash"), roles.alias("lookup_role"),
                       *[F.lit(None).cast(kind).alias(n) for n, kind in LOOKUP_FIELDS[4:] if n != "late"])
    spec = (spark._jvm.statefulstreams.LookupSpec().key("join_hash").role("lookup_role").state(state + ["version_key"])
            .found("found").firstSeen("first_seen_ms").waited("waited_ms").readOrder(["source_partition", "position"])
            .maxWaitMs(0).eventMs("event_ms").late("late").asOf("as_of").allowedLatenessMs(0)
            .futureAfterMs(NEVER_FUTURE_MS).joinLate(True))
    out = DataFrame(spark._jvm.statefulstreams.VersionedLookup.apply(rows._jdf, spec), spark)
    # the versioned table's rows come out only as late versions (stored all the same): dropped
    out = out.where(~versions | (op == "dead"))
    found = F.col("found") == "found"
    matched = found & F.col("version_key").eqNullSafe(F.col("join_key"))
    collision = found & F.col("join_key").isNotNull() & ~matched & (op == "upsert") & (side == 0)
    out = out.select(*[F.when(matched, F.col(c)).alias(c) if c in state else F.col(c) for c in out.columns])
    shared = F.concat(F.lit(f"table {plan.sides[0].name!r}: the version found for {join.join_column} = "),
                      F.col("join_key"), F.lit(" is another key's of the same 64-bit hash; not joined"))
    out = (out.withColumn("error", F.when(collision, shared).otherwise(F.col("error")))
           .withColumn("op", F.when(collision, "dead").otherwise(op)))
    return out, F.coalesce(matched, F.lit(False))
