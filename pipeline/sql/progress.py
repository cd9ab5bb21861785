"""A SQL pipeline's ``progress`` rows: rows in, rows out, lag and state per micro-batch, and the
query listener that writes them.

:func:`build_sql_progress_row` (pure) makes a row; :func:`make_listener`'s listener appends one
per batch to ``<data_dir>/sql/<name>/metrics/progress/``, the same append-only JSON Lines as the
enrichment job's metrics store (pipeline/metrics.py), which the console's SQL pipelines page
reads with DuckDB.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone

from pipeline.metrics import finite_or_zero, source_offset, topic_rows
from pipeline.source.counts import rows_from_progress

log = logging.getLogger(__name__)


def build_sql_progress_row(progress: dict, sink_rows: dict | None) -> dict:
    """Our row from Spark's StreamingQueryProgress JSON and the batch's sink counts::

        {"ts_ms": …, "batch_id": 7, "rows_in": 5, "rows_out": 2, "dead_letters": 0, "lag": 0,
         "topics": [{"topic": "users", "rows": 5, "backlog": 0, …}], "state_rows": 4, …}
    """
    ts = int(datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
             .replace(tzinfo=timezone.utc).timestamp() * 1000)
    # one source, or one per table (a temporal join's): their topics' offsets together
    sources = progress.get("sources") or [{}]
    start, end, latest = ({topic: offset for source in sources for topic, offset in source_offset(source.get(part)).items()}
                          for part in ("startOffset", "endOffset", "latestOffset"))
    topics = topic_rows(start, end, latest, rows_from_progress(progress))
    backlogs = [topic["backlog"] for topic in topics if topic["backlog"] is not None]
    operators = progress.get("stateOperators") or []
    counts = sink_rows or {}
    return {
        "ts": progress["timestamp"], "ts_ms": ts, "query_id": progress.get("id"), "batch_id": progress["batchId"],
        "rows_in": progress.get("numInputRows", 0), "rows_out": sum(n for sink, n in counts.items() if sink.startswith("result")),
        "dead_letters": counts.get("dead_letter", 0),
        "input_rows_per_second": finite_or_zero(progress.get("inputRowsPerSecond")),
        "processed_rows_per_second": finite_or_zero(progress.get("processedRowsPerSecond")),
        "batch_duration_ms": progress.get("batchDuration", 0),
        "lag": sum(backlogs) if backlogs else None, "topics": topics,
        "state_rows": sum(op.get("numRowsTotal", 0) for op in operators),
        "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in operators),
    }


def make_listener(query_name: str, metrics, writer, on_batch, join_clock=None):
    """The pipeline's listener (``metrics``: its MetricsStore; ``writer``: its SqlSinkWriter, for
    the batch's sink counts); ``join_clock``: a temporal join's :class:`pipeline.sql.join_clock.JoinClock`, or None."""
    from pipeline.listener import ProgressListener

    class SqlListener(ProgressListener):
        """Appends this pipeline's progress rows (its batches committed to the sinks in foreachBatch),
        and keeps a temporal join's clock (time passes between batches too: ``onQueryIdle``)."""

        def onQueryProgress(self, event) -> None:
            try:
                if event.progress.name != query_name:
                    return
                progress = json.loads(event.progress.json)
                batch_id = progress["batchId"]
                if join_clock is not None:
                    join_clock.observe(progress, int(time.time() * 1000))
                metrics.append("progress", build_sql_progress_row(progress, writer.last_counts.get(batch_id)))
                on_batch(batch_id)
            except Exception:  # a listener error must never take the pipeline down; it is logged
                log.exception("SQL pipeline listener failed on a progress event")

        def onQueryIdle(self, event) -> None:
            try:
                if join_clock is not None:
                    join_clock.update(int(time.time() * 1000))
            except Exception:  # as above
                log.exception("SQL pipeline listener failed on an idle event")

    return SqlListener()
