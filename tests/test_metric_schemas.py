"""The metrics streams have one schema: what the job's writers put in a row is what the
console's DuckDB views read (pipeline/metrics.py STREAM_SCHEMAS -> app/sources.py METRIC_COLUMNS),
and the sinks' DuckDB views are their Arrow schemas. Pure: no broker, no Spark."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from app import sources
from pipeline import metrics, sinks
from pipeline.metrics import STREAM_SCHEMAS, MetricsStore, build_progress_row, task_rows_from_stages


def offset(n: int) -> dict:
    return {"gen": 0, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": n, "id": f"0:{n}:-1:-1"}},
            "admitted": {"entries": n, "messages": n, "bytes": 10 * n}}


def progress_json(batch_id: int) -> dict:
    end = {"users": offset(4), "items": offset(2), "orders": offset(9)}
    return {
        "id": "q", "runId": "r", "batchId": batch_id, "timestamp": metrics.iso(metrics.now_ms()),
        "numInputRows": 15, "inputRowsPerSecond": 10.0, "processedRowsPerSecond": 20.0, "batchDuration": 400,
        "durationMs": {"addBatch": 300, "triggerExecution": 400},
        "stateOperators": [{"numRowsTotal": 3, "numRowsUpdated": 1, "memoryUsedBytes": 99, "commitTimeMs": 2,
                            "customMetrics": {"rocksdbBytesCopied": 7.0}}] * 2,
        "sources": [{"startOffset": json.dumps({}), "endOffset": json.dumps(end), "latestOffset": json.dumps(end)}],
        "observedMetrics": {"source_rows": {"users/-1": 4, "items/-1": 2, "orders/-1": 9}},
    }


def written_rows(tmp_path) -> dict[str, list[dict]]:
    store = MetricsStore(tmp_path)
    rows = {
        "progress": [build_progress_row(progress_json(3), 1000, {"enriched": 8, "missing_state": 1, "dead_letter": 0}, 512)],
        "tasks": task_rows_from_stages(3, [{"stageId": 5, "shuffleReadRecords": 4, "tasks": {
            "0": {"index": 0, "duration": 12, "taskMetrics": {"shuffleReadMetrics": {"recordsRead": 4}}}}}], 1_700_000_000_000),
    }
    for stream, stream_rows in rows.items():
        for row in stream_rows:
            store.append(stream, row)
    rows["events"] = [store.event("job_started", "started", attempt=1)]
    return rows


def test_every_column_the_console_reads_is_one_the_writers_write(tmp_path):
    for stream, rows in written_rows(tmp_path).items():
        declared = set(STREAM_SCHEMAS[stream].names)
        for row in rows:
            assert declared <= set(row), (stream, sorted(declared - set(row)))


def test_the_console_reads_the_written_rows_with_the_declared_types(tmp_path):
    written = written_rows(tmp_path)
    connection = duckdb.connect()
    progress = connection.execute(f"SELECT * FROM {sources.metrics_relation(tmp_path, 'progress')}").fetchall()
    assert len(progress) == 1
    columns = connection.execute(f"DESCRIBE SELECT * FROM {sources.metrics_relation(tmp_path, 'progress')}").fetchall()
    assert [name for name, *_ in columns] == STREAM_SCHEMAS["progress"].names
    batch = connection.execute(f"""SELECT batch_id, sink_rows.enriched, topics[1].topic, state[1].custom['rocksdbBytesCopied'],
        duration_ms.addBatch FROM {sources.metrics_relation(tmp_path, 'progress')}""").fetchone()
    assert batch == (3, 8, "users", 7.0, 300)
    event = connection.execute(f"SELECT kind, details->>'attempt' FROM {sources.metrics_relation(tmp_path, 'events')}").fetchone()
    assert event == (written["events"][0]["kind"], "1")


def test_the_sinks_duckdb_columns_are_their_arrow_schemas():
    for sink, schema in sinks.SCHEMAS.items():
        assert list(sources.SINK_COLUMNS[sink]) == schema.names
        read = duckdb.connect().sql(f"SELECT * FROM {sources.empty_relation(sources.SINK_COLUMNS[sink])}").to_arrow_table()
        assert [_zoned(field.type) for field in read.schema] == [_zoned(field.type) for field in schema]


def _zoned(kind: pa.DataType):
    """An Arrow type, with any time zoned timestamp as one (DuckDB hands back microseconds in the session's zone)."""
    return "timestamp with time zone" if pa.types.is_timestamp(kind) and kind.tz else kind
