"""Metrics retention (issue 28, item 2): the running job removes metrics day files past
``metrics.retention``, and never today's or yesterday's."""

from __future__ import annotations

import pytest

from pipeline import sinks, store
from pipeline.errors import SinkError
from pipeline.metrics import prune_old_days, read_rows

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def write_days(data_dir, stream: str, days: list[str]) -> None:
    folder = store.metrics_dir(data_dir, stream)
    folder.mkdir(parents=True, exist_ok=True)
    for day in days:
        (folder / f"{day}.jsonl").write_text(f'{{"ts_ms": 1, "day": "{day}"}}\n')


def days_left(data_dir, stream: str) -> list[str]:
    return sorted(path.stem for path in store.metrics_dir(data_dir, stream).glob("*.jsonl"))


def test_retention_removes_whole_days_past_it_in_every_stream(tmp_path):
    days = ["2027-01-01", "2027-01-07", "2027-01-08", "2027-01-14", "2027-01-15"]
    for stream in ("progress", "events", "state"):
        write_days(tmp_path, stream, days)
    removed = prune_old_days(tmp_path, 7 * 86400, NOW)
    assert len(removed) == 6
    for stream in ("progress", "events", "state"):  # 2027-01-08 ended 6 days 8 hours ago: kept
        assert days_left(tmp_path, stream) == ["2027-01-08", "2027-01-14", "2027-01-15"]
    assert [row["day"] for row in read_rows(tmp_path, "progress")] == ["2027-01-08", "2027-01-14", "2027-01-15"]


def test_today_and_yesterday_always_stay(tmp_path):
    write_days(tmp_path, "progress", ["2027-01-13", "2027-01-14", "2027-01-15"])
    prune_old_days(tmp_path, 0, NOW)
    assert days_left(tmp_path, "progress") == ["2027-01-14", "2027-01-15"]
    assert prune_old_days(tmp_path / "fresh", 0, NOW) == []


def test_the_maintenance_round_prunes_and_records_it(tmp_path):
    write_days(tmp_path, "tasks", ["2020-01-01"])
    events = []
    maintenance = sinks.SinkMaintenance(sinks.SinkWriter(tmp_path), tmp_path, 1.0, 0,
                                        lambda kind, message, **details: events.append(kind),
                                        prune=lambda: prune_old_days(tmp_path, 86400))
    maintenance.run_once()
    assert days_left(tmp_path, "tasks") == [] and "metrics_pruned" in events


# -------------------------------------------- never what the console's windows or a savepoint need


def test_retention_never_removes_what_the_consoles_windows_show(tmp_path):
    """Ten days of a job writing a batch every 10 minutes: after the round's prune, every window
    the console and the exporter show reads what it read before (they lie in the kept days)."""
    from app import metric_queries, sources
    from pipeline.metrics import MetricsStore

    metrics = MetricsStore(tmp_path)
    first_ms = int(NOW * 1000) - 10 * 86_400_000
    for batch_id in range(10 * 144):
        ts = first_ms + batch_id * 600_000
        metrics.append("progress", {"ts_ms": ts, "batch_id": batch_id, "num_input_rows": batch_id % 9,
                                    "topics": [{"topic": "orders", "generation": 0, "rows": batch_id % 9,
                                                "end_position": batch_id, "latest_position": batch_id + 3,
                                                "partitions": [{"partition": 0, "rows": batch_id % 9}]}],
                                    "state": [{"operator": "user_lookup", "rows_total": batch_id}]})
        metrics.append("tasks", {"ts_ms": ts, "batch_id": batch_id, "stage": "user_lookup", "stage_id": 1,
                                 "task": 0, "records": batch_id % 9, "duration_ms": 5})
    connection = sources.connect()
    windows = {
        "batches": lambda: metric_queries.load_batches(connection, tmp_path, limit=300),
        "backlog": lambda: metric_queries.load_backlog(connection, tmp_path, limit=300),
        "partitions": lambda: metric_queries.load_partition_rows(connection, tmp_path, batches=100),
        "operators": lambda: metric_queries.load_state_by_operator(connection, tmp_path),
        "tasks": lambda: metric_queries.load_recent_tasks(connection, tmp_path, batches=30),
        "positions": lambda: metric_queries.load_topic_positions(connection, tmp_path, "orders",
                                                                 int(NOW * 1000) - 86_400_000),
    }
    before = {name: query() for name, query in windows.items()}
    removed = prune_old_days(tmp_path, 7 * 86400, NOW)
    assert removed and len(days_left(tmp_path, "progress")) == 8  # 7 days and today
    for name, query in windows.items():
        assert query().equals(before[name]), name
    assert len(before["batches"]) == 300
    connection.close()


def test_vacuum_keeps_what_a_savepoint_needs_and_its_restore_is_row_for_row(tmp_path):
    """Compaction replaces a savepoint's files; a round whose configured retention is 0 still
    keeps them, as the savepoint is a day old, and taking the sink back to its batch gives its
    rows exactly. Without the savepoint the same round removes them."""
    import json
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    import sinkread

    def write(data_dir) -> sinks.SinkWriter:
        writer = sinks.SinkWriter(data_dir)
        for batch in range(8):
            writer.commit_batch({"dead_letter": pa.table({
                "source_topic": ["t"], "source_partition": [0], "source_message_id": [f"m{batch}"], "key": ["k"],
                "payload": ["x"], "error": ["bad"], "published_at": [0], "detected_at": [1_800_000_000_000 + batch],
                "batch_id": [batch]}).cast(sinks.SCHEMAS["dead_letter"])}, batch)
        return writer

    kept, unkept = tmp_path / "with-savepoint", tmp_path / "without"
    folder = store.savepoints_dir(kept) / "yesterday"
    folder.mkdir(parents=True)
    taken = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    (folder / "savepoint.json").write_text(json.dumps({"name": "yesterday", "batch_id": 3, "taken_at": taken}))
    for data_dir in (kept, unkept):
        writer = write(data_dir)
        sinks.SinkMaintenance(writer, data_dir, 1.0, 0).run_once()  # compaction, then vacuum
        assert len(sinks.sink_files(data_dir, "dead_letter")) == 1
    with_savepoint, without = sinks.SinkWriter(kept), sinks.SinkWriter(unkept)
    with_savepoint.rollback(3)
    assert sorted(row["source_message_id"] for row in sinkread.rows(kept, "dead_letter", "source_message_id")) == \
        ["m0", "m1", "m2", "m3"]
    with pytest.raises(SinkError, match="no longer has the files of batch 3"):
        without.rollback(3)


# -------------------------------------------------------------------- the SQL pipelines' metrics


def test_the_jobs_retention_covers_the_sql_pipelines_metrics_too(tmp_path):
    """A SQL pipeline keeps its own store (<data_dir>/sql/<name>/metrics/); the job's round
    prunes it with its own, so a stopped pipeline's rows expire as well."""
    days = ["2027-01-01", "2027-01-14", "2027-01-15"]
    pipeline_root = store.sql_dir(tmp_path, "count")
    for root in (tmp_path, pipeline_root, store.sql_dir(tmp_path, "join")):
        write_days(root, "progress", days)
        write_days(root, "events", days)
    removed = prune_old_days(tmp_path, 7 * 86400, NOW)
    assert len(removed) == 6
    for root in (tmp_path, pipeline_root, store.sql_dir(tmp_path, "join")):
        assert days_left(root, "progress") == days_left(root, "events") == ["2027-01-14", "2027-01-15"]


def test_a_running_sql_pipelines_round_prunes_its_metrics_and_compacts_its_tables(tmp_path):
    import pyarrow as pa

    from pipeline.config import load_settings
    from pipeline.metrics import MetricsStore
    from pipeline.sql.runner import start_maintenance
    from pipeline.sql.sink import SqlSinkWriter

    settings = load_settings(env={}, cli={"paths.data_dir": str(tmp_path), "sinks.compact_interval": "1h",
                                          "sinks.vacuum_retention": "0h", "metrics.retention": "24h"})
    root = store.sql_dir(tmp_path, "count")
    write_days(root, "progress", ["2020-01-01"])
    write_days(tmp_path, "progress", ["2020-01-01"])  # the job's: not this pipeline's to prune
    writer = SqlSinkWriter(root)
    schema = sinks.SCHEMAS["dead_letter"]
    for batch in range(4):
        writer.commit_batch({"dead_letter": pa.Table.from_arrays(
            [pa.array([batch] if f.name == "batch_id" else [None], f.type) for f in schema], schema=schema)}, batch)
    assert len(sinks.table_files(writer.folder("dead_letter"))) == 4
    metrics = MetricsStore(root)
    maintenance = start_maintenance(settings, root, writer, metrics.event)
    try:
        maintenance.run_once()
    finally:
        maintenance.stop()
    assert days_left(root, "progress") == [] and days_left(tmp_path, "progress") == ["2020-01-01"]
    assert len(sinks.table_files(writer.folder("dead_letter"))) == 1
    kinds = [row["kind"] for row in read_rows(root, "events")]
    assert kinds == ["metrics_pruned", "sinks_maintained"]
