"""A SQL pipeline's source: its tables' topics read from the earliest message, counted per partition.

:func:`read_source` is one source for every table a pipeline reads (the usual case);
:func:`read_topics` and :func:`count_rows` are its two halves, for a pipeline that reads each
table in a source of its own (a temporal join: one watermark per table, pipeline/sql/temporal_stream.py).
"""

from __future__ import annotations

from pipeline import store
from pipeline.config import Settings


def read_topics(spark, settings: Settings, tables, name: str, service_url: str, stats: str = "source-stats"):
    """The tables' topics as one streaming source (``stats``: its folder of source statistics).

    # {"kind": "users", "topic": …, "partition": -1, "message_id": "…", "position": 3, "key": "100-1",
    #  "value": b"…"}
    """
    from pipeline.source.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
    topics = ",".join(f"{table.name}={table.topic}" for table in tables)
    return (spark.readStream.format("pulsar").option("service_url", service_url).option("topics", topics)
            .option("maxRowsPerBatch", settings["job.max_rows_per_batch"])
            .option("maxBytesPerBatch", settings["job.max_bytes_per_batch"])
            .option("statsDir", str(store.sql_dir(settings.data_dir, name) / stats))
            .option("startingOffsets", "earliest").load())


def count_rows(frame, settings: Settings, tables, service_url: str, kind_column: str = "kind",
               partition_column: str = "partition"):
    """``frame`` with its rows counted per table and partition: the source's offsets count broker
    entries; each batch's messages are counted here (pipeline/source/counts.py)."""
    from pipeline.source.counts import list_topic_partitions, observe_rows

    partitions = list_topic_partitions(service_url, {t.name: t.topic for t in tables}, settings["pulsar.auth_token"])
    return observe_rows(frame, partitions, kind_column, partition_column)


def read_source(spark, settings: Settings, tables, name: str, service_url: str):
    """Every table's topic in one source, its rows counted."""
    return count_rows(read_topics(spark, settings, tables, name, service_url), settings, tables, service_url)
