"""Messages read per topic and partition in each micro-batch, counted where they are read.

The source plans whole broker entries without reading them (offsets.py), so its offsets count
entries, not messages. The job and the SQL pipelines count the messages of each batch with one
Spark observed metric on the rows the source gave (every message is one row, good or bad), and
the listeners turn it into the ``rows`` of their progress rows (pipeline/metrics.py).

# observed per batch: source_rows -> {"orders/-1": 1250, "users/-1": 40, "items/-1": 0}
"""

from __future__ import annotations

SOURCE_ROWS = "source_rows"  # the observed metric's name


def column_name(kind: str, partition: str | int) -> str:
    """The observed column of one partition of one topic (``orders/-1``, ``users/3``)."""
    return f"{kind}/{int(partition)}"


def observe_rows(frame, partitions: dict[str, list[str]], kind_column="kind",
                 partition_column: str = "partition", name: str = SOURCE_ROWS):
    """``frame`` with its rows counted per topic partition (observed metric ``name``: ``source_rows``,
    or ``source_rows_<something>`` for another read of the same query, which Spark needs named apart).

    ``partitions``: topic kind -> its partitions ('-1' for a topic that is not partitioned),
    listed when the query is built; rows of a partition added later are counted from the next
    start on. ``kind_column``: a column's name, or a Column that gives the kind.
    """
    from pyspark.sql import functions as F

    kind = F.col(kind_column) if isinstance(kind_column, str) else kind_column
    part = F.coalesce(F.col(partition_column), F.lit(-1))
    counts = [F.count(F.when((kind == k) & (part == int(p)), 1)).alias(column_name(k, p))
              for k, parts in sorted(partitions.items()) for p in sorted(parts, key=int)]
    return frame.observe(name, *counts) if counts else frame


def rows_from_progress(progress: dict) -> dict[str, dict[str, int]] | None:
    """The batch's messages per topic kind and partition from Spark's progress JSON (summed over
    the query's reads: ``source_rows`` and each ``source_rows_…``), or None when the batch observed
    none (a batch that read nothing, or a query that does not count)."""
    observed = progress.get("observedMetrics") or {}
    reads = [values for key, values in observed.items()
             if (key == SOURCE_ROWS or str(key).startswith(SOURCE_ROWS + "_")) and isinstance(values, dict)]
    if not reads:
        return None
    counted: dict[str, dict[str, int]] = {}
    for values in reads:
        for name, value in values.items():
            kind, _, partition = str(name).rpartition("/")
            if kind:
                counted.setdefault(kind, {})[partition] = counted.get(kind, {}).get(partition, 0) + int(value or 0)
    return counted


def list_topic_partitions(service_url: str, topics: dict[str, str], auth_token: str | None = None) -> dict[str, list[str]]:
    """Every topic's partitions, asked of the broker on the driver while the query is built."""
    from pipeline.source.connection import list_partitions, use_token

    use_token(service_url, auth_token)
    return {kind: list_partitions(service_url, topic) for kind, topic in topics.items()}
