"""Sink maintenance stays bounded by what changed (issue 28): a round never rewrites a file past
the compaction target, and the Delta log is kept by time, not by the number of batches.

Real Delta tables written by :class:`pipeline.sinks.SinkWriter`; no timing asserts: each test
counts the files and bytes a round touched."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import sinkread
from pipeline import sink_maintenance, sinks, store


def dead_letters(batch_id: int, rows: int = 2, payload_bytes: int = 1) -> dict[str, pa.Table]:
    """A batch of dead letters with message ids ``m<batch>-<i>`` (payloads of random text)."""
    table = pa.table({
        "source_topic": ["t"] * rows, "source_partition": [0] * rows,
        "source_message_id": [f"m{batch_id}-{i}" for i in range(rows)], "key": ["k"] * rows,
        "payload": [uuid.uuid4().hex * payload_bytes for _ in range(rows)], "error": ["bad"] * rows,
        "published_at": [0] * rows, "detected_at": [1_800_000_000_000 + batch_id] * rows, "batch_id": [batch_id] * rows,
    }).cast(sinks.SCHEMAS["dead_letter"])
    return {"dead_letter": table}


def file_sizes(path: Path) -> dict[str, int]:
    """The current files of the table at ``path`` with their sizes, from its log."""
    actions = sinks.open_table(path).get_add_actions(flatten=True)
    return dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))


def test_a_round_rewrites_only_the_small_files_never_the_compacted_history(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    path = store.sink_dir(tmp_path, "dead_letter")
    writer.commit_batch(dead_letters(0, rows=4000, payload_bytes=4), 0)  # the history: one big file
    (history, history_bytes), = file_sizes(path).items()
    # a batch's file is ~3 KB: two fit the small tier, and compacted files soon stop fitting it
    small, target, merge_after = 8 << 10, 64 << 10, 3
    assert history_bytes > target
    batch, merges = 1, 0
    for _ in range(12):
        before = file_sizes(path)
        for _ in range(3):
            writer.commit_batch(dead_letters(batch), batch)
            batch += 1
        new_bytes = sum(size for name, size in file_sizes(path).items() if name not in before)
        facts = sink_maintenance.compact_table(sinks.open_table(path), small, target, merge_after)
        after = file_sizes(path)
        assert after[history] == history_bytes  # the compacted history is never read again
        # what this round added, and at most the few files under the target waiting since the
        # last merge (and the partial merged file): never the history, whatever the round
        bound = new_bytes + merge_after * small + (target if facts["merged"] else 0)
        assert 0 < facts["bytes_rewritten"] <= bound, facts
        merges += facts["merged"]
        assert len(after) <= 1 + merge_after + 2  # the history, the files waiting for a merge, the merged one
    assert merges >= 1
    rows = sinkread.rows(tmp_path, "dead_letter", "source_message_id")
    assert len(rows) == 4000 + 2 * (batch - 1) and len({row["source_message_id"] for row in rows}) == len(rows)


def test_the_log_is_kept_for_minutes_not_for_every_batch(tmp_path):
    """Before: the log was kept an hour whatever the batches, ~14,000 commit files per sink at
    four batches a second. Now it keeps LOG_RETENTION_MIN_S (or back to the oldest savepoint)."""
    writer = sinks.SinkWriter(tmp_path)
    path = store.sink_dir(tmp_path, "dead_letter")
    for batch in range(250):
        writer.commit_batch(dead_letters(batch), batch)
    log_dir = path / "_delta_log"
    half_an_hour_ago = time.time() - 1800
    for entry in log_dir.iterdir():  # every commit so far is half an hour old
        os.utime(entry, (half_an_hour_ago, half_an_hour_ago))
    commits = sorted(log_dir.glob("*.json"))
    assert len(commits) == 250  # an hour's retention would keep them all
    writer.maintain(compact=True, retention_s=0, log_retention_s=sink_maintenance.log_retention_s(tmp_path))
    table = sinks.open_table(path)
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 10 minutes"
    left = sorted(log_dir.glob("*.json"))
    # from the last checkpoint before the cutoff (Delta writes one every 100 commits), and the
    # round's own commits
    assert len(left) <= 100 + 10, [entry.name for entry in left]
    assert sinks.committed_batch(table) == 249  # the checkpoint keeps the transaction version
    assert len(sinkread.rows(tmp_path, "dead_letter", "source_message_id")) == 500


def test_the_log_goes_back_to_the_oldest_savepoint(tmp_path):
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    assert sink_maintenance.log_retention_s(tmp_path, now) == sink_maintenance.LOG_RETENTION_MIN_S
    folder = store.savepoints_dir(tmp_path) / "sp"
    folder.mkdir(parents=True)
    (folder / "savepoint.json").write_text(json.dumps({"name": "sp", "batch_id": 3,
                                                       "taken_at": "2027-01-14T08:00:00.000Z"}))
    assert sink_maintenance.log_retention_s(tmp_path, now) == 86400 + 3600


def test_the_maintenance_names_stay_importable_from_the_sinks_module():
    from pipeline.sinks import SinkMaintenance, vacuum_retention_s

    assert SinkMaintenance is sink_maintenance.SinkMaintenance
    assert vacuum_retention_s is sink_maintenance.vacuum_retention_s


def test_a_log_file_another_writer_cleaned_up_first_fails_no_round(tmp_path, monkeypatch):
    """The writer's post-commit checkpoint cleans up expired log files too; the round's own
    cleanup then meets a file already gone (bench_month: 'Object at location … not found')."""
    from deltalake import DeltaTable

    writer = sinks.SinkWriter(tmp_path)
    for batch in range(3):
        writer.commit_batch(dead_letters(batch), batch)

    def cleaned_up_meanwhile(self):
        raise OSError("Generic error: Object at location /x/_delta_log/00000000000000000001.json not found")

    monkeypatch.setattr(DeltaTable, "cleanup_metadata", cleaned_up_meanwhile)
    done = writer.maintain(compact=True, retention_s=0)
    assert done["dead_letter"]["files_removed"] == 3 and done["dead_letter"]["files_vacuumed"] == 3

    def disk_full(self):
        raise OSError("No space left on device")

    monkeypatch.setattr(DeltaTable, "cleanup_metadata", disk_full)
    with pytest.raises(OSError, match="No space left"):
        writer.maintain(compact=True, retention_s=0)


def test_the_round_is_the_logs_only_cleaner(tmp_path):
    """A writer's commit that writes a checkpoint cleans up expired log files by default; with
    the round cleaning them too, one of the two met a file the other had deleted and failed
    (bench_month's writer died so). After a round, writers leave the log to the rounds."""
    writer = sinks.SinkWriter(tmp_path)
    path = store.sink_dir(tmp_path, "dead_letter")
    for batch in range(10):
        writer.commit_batch(dead_letters(batch), batch)
    writer.maintain(compact=False, retention_s=0, log_retention_s=0)
    assert sinks.open_table(path).metadata().configuration["delta.enableExpiredLogCleanup"] == "false"
    log_dir = path / "_delta_log"
    old = sorted(log_dir.glob("*.json"))
    half_an_hour_ago = time.time() - 1800
    for entry in log_dir.iterdir():
        os.utime(entry, (half_an_hour_ago, half_an_hour_ago))
    for batch in range(10, 120):  # past the writer's checkpoint at version 99
        writer.commit_batch(dead_letters(batch), batch)
    assert any(log_dir.glob("*99.checkpoint.parquet")) and all(entry.exists() for entry in old)
    writer.maintain(compact=False, retention_s=0, log_retention_s=0)
    # the round cleaned them, back to its first checkpoint (the newest older than the cutoff)
    assert not any(entry.exists() for entry in old[:10])


def test_vacuum_removes_files_no_commit_names_once_they_are_an_hour_old(tmp_path):
    """What a killed batch or optimize wrote is in no commit, so the log never lists it as
    removed: the round's second vacuum lists the folder. A file under an hour old stays, as a
    batch's files are written before its commit names them."""
    writer = sinks.SinkWriter(tmp_path)
    path = store.sink_dir(tmp_path, "dead_letter")
    for batch in range(3):
        writer.commit_batch(dead_letters(batch), batch)
    stale, fresh = path / "part-00000-killed-c000.zstd.parquet", path / "part-00000-in-flight-c000.zstd.parquet"
    for orphan in (stale, fresh):
        orphan.write_bytes((next(path.glob("part-*.parquet"))).read_bytes())
    two_hours_ago = time.time() - 7200
    os.utime(stale, (two_hours_ago, two_hours_ago))
    done = writer.maintain(compact=False, retention_s=0)
    assert done["dead_letter"]["files_vacuumed"] == 1
    assert not stale.exists() and fresh.exists()
    assert sorted(row["batch_id"] for row in sinkread.rows(tmp_path, "dead_letter", "batch_id")) == [0, 0, 1, 1, 2, 2]
