"""A SQL pipeline's source: its tables' topics read from the earliest message, counted per partition.

:func:`read_source` is one source for every table a pipeline reads (the usual case);
:func:`read_topics` and :func:`count_rows` are its two halves, for a pipeline that reads each
table in a source of its own (a temporal join: one watermark per table, pipeline/sql/temporal_stream.py).
Given a parser, the source's read tasks parse what they read (its ``transform`` option), so the
rows leave Python once, as the job's do.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import store
from pipeline.config import Settings


def read_topics(spark, settings: Settings, tables, name: str, service_url: str, stats: str = "source-stats",
                parser: tuple[str, dict, str] | None = None, clock_file: Path | None = None, ttl_ms: int = 0):
    """The tables' topics as one streaming source (``stats``: its folder of source statistics);
    ``parser``: (``module:function``, its JSON-ready arguments, the DDL of the rows it yields)
    run in the read tasks, whose rows the source then gives instead of its own; ``clock_file``:
    the event-time clock of the tables' partitions (the source's ``clockFile``: a temporal join's
    table, pipeline/sql/join_clock.py); ``ttl_ms``: the pipeline's state TTL, whose timers get one
    batch of no row once the input has been quiet for it (the query starts without Spark's
    no-data batches, which would run every trigger for good: runner.py ``build_query``).

    # {"kind": "users", "topic": …, "partition": -1, "message_id": "…", "position": 3, "key": "100-1",
    #  "value": b"…"}
    """
    from pipeline.runtime.spark import timer_ticks
    from pipeline.source.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
    topics = ",".join(f"{table.name}={table.topic}" for table in tables)
    reader = spark.readStream.format("pulsar")
    if parser is not None:
        transform, args, ddl = parser
        reader = reader.schema(ddl).option("transform", transform).option("transformArgs", json.dumps(args))
    if clock_file is not None:
        reader = reader.option("clockFile", str(clock_file)).option("changelogs", ",".join(t.name for t in tables))
    if ttl_ms:
        reader = reader.options(**timer_ticks(ttl_ms, int(settings["job.trigger_interval"] * 1000), once=True))
    return (reader.option("service_url", service_url).option("topics", topics)
            .option("maxRowsPerBatch", settings["job.max_rows_per_batch"])
            .option("maxBytesPerBatch", settings["job.max_bytes_per_batch"])
            .option("statsDir", str(store.sql_dir(settings.data_dir, name) / stats))
            .option("startingOffsets", "earliest").load())


def count_rows(frame, settings: Settings, tables, service_url: str, kind_column="kind",
               partition_column: str = "partition", partitions: dict[str, list[str]] | None = None,
               name: str | None = None):
    """``frame`` with its rows counted per table and partition: the source's offsets count broker
    entries; each batch's messages are counted here (pipeline/source/counts.py). ``kind_column``:
    the column that holds the table's name, or a Column that gives it; ``partitions``: the
    tables' partitions as ``counts.list_topic_partitions`` gives them, if already asked; ``name``:
    the observed metric's, for a second read in one query (``counts.observe_rows``)."""
    from pipeline.source.counts import list_topic_partitions, observe_rows

    if partitions is None:
        partitions = list_topic_partitions(service_url, {t.name: t.topic for t in tables}, settings["pulsar.auth_token"])
    return observe_rows(frame, partitions, kind_column, partition_column, **({"name": name} if name else {}))


def read_source(spark, settings: Settings, tables, name: str, service_url: str, ttl_ms: int = 0):
    """Every table's topic in one source, its rows counted."""
    return count_rows(read_topics(spark, settings, tables, name, service_url, ttl_ms=ttl_ms), settings, tables,
                      service_url)


def read_parsed(spark, settings: Settings, plan, name: str, service_url: str):
    """Every table of a plan in one source whose read tasks parse each message into its envelope
    row (pipeline/sql/envelope.py), its rows counted per table (by ``side``) and partition.

    # {"key": "100-1", "side": 0, "op": "upsert", "source_partition": -1, "position": 3, "s0_accountId": "100", …}
    """
    from pyspark.sql import functions as F

    from pipeline.sql.envelope import PARSE_TRANSFORM, envelope_ddl, parser_args
    from pipeline.sql.settings import state_ttl_ms

    parser = (PARSE_TRANSFORM, parser_args(plan), envelope_ddl(plan))
    rows = read_topics(spark, settings, plan.sides, name, service_url, parser=parser,
                       ttl_ms=state_ttl_ms(plan.settings))
    kind = F.element_at(F.array(*[F.lit(table.name) for table in plan.sides]), F.col("side") + 1)
    return count_rows(rows, settings, plan.sides, service_url, kind_column=kind, partition_column="source_partition")
