"""The disk, on one page (issue 28, item 3): the figures of the Storage page from a listing of
the data dir (pure), when maintenance last ran from its events (pure), and both over a real
Delta sink that the maintenance round compacted and vacuumed."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from app import sources, storage
from pipeline import sinks
from pipeline.metrics import MetricsStore

LISTING = [
    ("sinks/enriched/part-1.parquet", 100), ("sinks/enriched/part-2.parquet", 300),
    ("sinks/enriched/compacted.parquet", 350), ("sinks/enriched/_delta_log/00000000000000000000.json", 7),
    ("sinks/enriched/_delta_log/00000000000000000001.json", 9),
    ("metrics/progress/2027-01-14.jsonl", 4000), ("metrics/progress/2027-01-15.jsonl", 1000),
    ("metrics/events/2027-01-15.jsonl", 50),
    ("checkpoint/offsets/7", 20), ("checkpoint/state/0/0/1.changelog", 2000),
    ("savepoints/before/savepoint.json", 3), ("savepoints/before/checkpoint/offsets/3", 20),
    ("savepoints/after/savepoint.json", 3),
    ("broker/data/ledger", 10_000), ("source-stats/orders.json", 5), ("job.lock", 0),
    ("scratch/vm-7/spark-1/StateStoreId(opId=0,partId=0)/000008.sst", 600),
]
LIVE = {"enriched": {"sinks/enriched/compacted.parquet"}, "missing_state": set(), "dead_letter": set()}


def test_each_part_has_its_files_and_bytes_and_a_sink_its_current_version_and_log():
    parts = storage.compute_storage(LISTING, LIVE).set_index("part")
    assert parts.index.tolist() == ["sink dead_letter", "sink enriched", "sink missing_state", "metrics events",
                                    "metrics progress", "checkpoint", "savepoints", "broker", "other",
                                    "scratch", "source stats"]
    enriched = parts.loc["sink enriched"]
    assert (enriched["files"], enriched["bytes"]) == (5, 766)
    assert (enriched["live_files"], enriched["live_bytes"], enriched["log_files"]) == (1, 350, 2)
    assert enriched["detail"] == "2 replaced files wait for vacuum"
    assert parts.loc["sink dead_letter", "files"] == 0 and parts.loc["sink dead_letter", "live_files"] == 0
    assert (parts.loc["metrics progress", "files"], parts.loc["metrics progress", "bytes"]) == (2, 5000)
    assert parts.loc["metrics progress", "detail"] == "2 day files, 2027-01-14 to 2027-01-15"
    assert (parts.loc["checkpoint", "files"], parts.loc["checkpoint", "bytes"]) == (2, 2020)
    assert (parts.loc["savepoints", "files"], parts.loc["savepoints", "detail"]) == (3, "2 savepoints")
    assert pd.isna(parts.loc["checkpoint", "live_files"])
    assert parts.loc["scratch", "bytes"] == 600  # the running Spark's working copy of its state
    assert parts["bytes"].sum() == sum(size for _, size in LISTING)  # every file in exactly one part
    assert parts["files"].sum() == len(LISTING)
    kinds = storage.compute_storage(LISTING, LIVE)["kind"].tolist()
    assert kinds == sorted(kinds, key=["sink", "metrics", "checkpoint", "savepoints", "sql", "broker", "other"].index)


def test_an_empty_data_dir_still_lists_the_sinks():
    parts = storage.compute_storage([], {"enriched": set()})
    assert parts[["part", "files", "bytes"]].values.tolist() == [["sink enriched", 0, 0]]


def _events(*rows) -> pd.DataFrame:
    frame = pd.DataFrame([{"ts_ms": ts, "time": pd.Timestamp(ts, unit="ms"), "kind": kind, "message": message,
                           "details": details} for ts, kind, message, details in rows],
                         columns=["ts_ms", "time", "kind", "message", "details"])
    return frame.sort_values("ts_ms", ascending=False)


def _round(removed=0, added=0, vacuumed=0) -> dict:
    return {"sinks": {"enriched": {"files_removed": removed, "files_added": added, "files_vacuumed": vacuumed}}}


def test_maintenance_says_when_each_task_last_ran_and_last_changed_something():
    events = _events((1000, "sinks_maintained", "m", _round(40, 1, 0)),
                     (2000, "sinks_maintained", "m", _round(0, 0, 40)),
                     (3000, "metrics_pruned", "removed 3 metrics day files past the retention", {}),
                     (4000, "sinks_maintained", "m", _round()),
                     (5000, "sinks_maintenance_failed", "sink compaction or vacuum failed: disk full", {}))
    rounds = storage.summarize_maintenance(events).set_index("task")
    at = lambda ms: pd.Timestamp(ms, unit="ms")  # noqa: E731
    assert rounds.loc["compaction", "last_run"] == at(4000)
    assert (rounds.loc["compaction", "last_change"], rounds.loc["compaction", "change"]) == (at(1000), "40 files into 1")
    assert (rounds.loc["vacuum", "last_change"], rounds.loc["vacuum", "change"]) == (at(2000), "40 files removed")
    assert rounds.loc["vacuum", "failed_at"] == at(5000) and "disk full" in rounds.loc["vacuum", "failure"]
    assert rounds.loc["metrics retention", "last_change"] == at(3000)
    never = storage.summarize_maintenance(_events())
    assert never["last_run"].isna().all() and never["task"].tolist() == ["compaction", "vacuum", "metrics retention"]


def test_the_page_figures_follow_a_real_sink_through_compaction_and_vacuum(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    schema = sinks.SCHEMAS["dead_letter"]
    for batch in range(6):
        writer.commit_batch({"dead_letter": pa.table({
            "source_topic": ["t"], "source_partition": [0], "source_message_id": [f"m{batch}"], "key": ["k"],
            "payload": ["x"], "error": ["bad"], "published_at": [0], "detected_at": [1_800_000_000_000 + batch],
            "batch_id": [batch]}).cast(schema)}, batch)
    connection = sources.connect()
    before = storage.load_storage(connection, tmp_path).set_index("part").loc["sink dead_letter"]
    assert before["live_files"] == 6 and before["files"] == 6 + before["log_files"]
    metrics = MetricsStore(tmp_path)
    sinks.SinkMaintenance(writer, tmp_path, 1.0, 0, metrics.event).run_once()
    after = storage.load_storage(connection, tmp_path).set_index("part")
    assert after.loc["sink dead_letter", "live_files"] == 1  # compacted, and the six vacuumed at once
    assert after.loc["sink dead_letter", "files"] == 1 + after.loc["sink dead_letter", "log_files"]
    assert after.loc["metrics events", "files"] == 1
    rounds = storage.load_maintenance(connection, tmp_path).set_index("task")
    assert rounds.loc["compaction", "change"] == "6 files into 1"
    assert rounds.loc["vacuum", "change"] == "6 files removed"
    assert rounds.loc["compaction", "last_run"] == rounds.loc["vacuum", "last_run"] is not None
    connection.close()
