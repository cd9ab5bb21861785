"""The sinks as Delta tables (issue 28): one idempotent commit per batch and sink, compaction
and vacuum on a schedule, and no race between two writers of one batch.

Real Delta tables written by :class:`pipeline.sinks.SinkWriter`, read back as users do
(tests/sinkread.py: DuckDB over the files the log lists now)."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import sinkread
from waiting import wait_for
from pipeline import sinks, store
from pipeline.errors import SinkError


def dead_letters(batch_id: int, rows: int = 2, tag: str = "m") -> dict[str, pa.Table]:
    """A batch of ``rows`` dead letters with message ids ``<tag><batch>-<i>``."""
    table = pa.table({
        "source_topic": ["t"] * rows, "source_partition": [0] * rows,
        "source_message_id": [f"{tag}{batch_id}-{i}" for i in range(rows)], "key": ["k"] * rows,
        "payload": ["x"] * rows, "error": ["bad"] * rows, "published_at": [0] * rows,
        "detected_at": [1_800_000_000_000 + batch_id] * rows, "batch_id": [batch_id] * rows,
    }).cast(sinks.SCHEMAS["dead_letter"])
    return {"dead_letter": table}


def ids(data_dir: Path) -> list[str]:
    return sorted(row["source_message_id"] for row in sinkread.rows(data_dir, "dead_letter", "source_message_id"))


def data_files(data_dir: Path) -> int:
    return sum(1 for name in os.listdir(store.sink_dir(data_dir, "dead_letter")) if name.endswith(".parquet"))


def test_a_batch_commits_once_however_often_it_runs(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    assert writer.commit_batch(dead_letters(0), 0)["dead_letter"] == 2
    assert writer.commit_batch(dead_letters(0, tag="again"), 0)["dead_letter"] == 0  # Spark re-runs batch 0
    assert sinks.SinkWriter(tmp_path).commit_batch(dead_letters(0), 0)["dead_letter"] == 0  # after a restart too
    assert writer.commit_batch(dead_letters(1), 1)["dead_letter"] == 2
    assert ids(tmp_path) == ["m0-0", "m0-1", "m1-0", "m1-1"]
    assert writer.committed_batches() == {"enriched": -1, "missing_state": -1, "dead_letter": 1}


def test_two_writers_of_one_batch_at_the_same_moment_commit_it_once(tmp_path):
    """The race of issue 28: the listener and the start-up recovery published one batch at once,
    and the second deleted the first's folder. With Delta, two writers that both saw the batch
    missing race to commit it; the transaction id makes the loser's commit fail, and it sees the
    batch there. Many rounds, each with a fresh pair of writers released together."""
    writer = sinks.SinkWriter(tmp_path)
    writer.commit_batch(dead_letters(0), 0)
    for batch in range(1, 13):
        barrier = threading.Barrier(2)
        results, errors = [], []

        def commit(tag: str) -> None:
            try:
                own = sinks.SinkWriter(tmp_path)
                barrier.wait()
                results.append(own.commit_batch(dead_letters(batch, tag=tag), batch)["dead_letter"])
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=commit, args=(tag,)) for tag in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and sorted(results) == [0, 2], (batch, results, errors)
    rows = sinkread.rows(tmp_path, "dead_letter", "batch_id")
    assert sorted(row["batch_id"] for row in rows) == sorted(list(range(13)) * 2)


def test_compaction_bounds_the_files_and_vacuum_removes_the_replaced_ones(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    for batch in range(40):
        writer.commit_batch(dead_letters(batch), batch)
    before = ids(tmp_path)
    assert len(sinks.sink_files(tmp_path, "dead_letter")) == 40 and data_files(tmp_path) == 40
    done = writer.maintain(compact=True, retention_s=None)
    assert done["dead_letter"]["files_removed"] == 40 and done["dead_letter"]["files_added"] == 1
    assert ids(tmp_path) == before and len(sinks.sink_files(tmp_path, "dead_letter")) == 1
    assert data_files(tmp_path) == 41  # the replaced files stay until vacuum: a glob would double every row
    writer.maintain(compact=True, retention_s=3600)  # replaced a moment ago: kept
    assert data_files(tmp_path) == 41
    done = writer.maintain(compact=True, retention_s=0)
    assert done["dead_letter"]["files_vacuumed"] == 40 and data_files(tmp_path) == 1 and ids(tmp_path) == before
    table = sinks.open_table(store.sink_dir(tmp_path, "dead_letter"))
    # the log is kept ten minutes (pipeline/sink_maintenance.py: LOG_RETENTION_MIN_S)
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 10 minutes"
    again = writer.maintain(compact=True, retention_s=0, log_retention_s=7200)
    assert again["dead_letter"]["files_vacuumed"] == 0  # the files a round before deleted are not counted again
    table = sinks.open_table(store.sink_dir(tmp_path, "dead_letter"))
    # a checkpoint keeps a tombstone per replaced file only as long as vacuum keeps the file (not a week)
    assert table.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 1 hours"
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 120 minutes"
    assert sinks.committed_batch(table) == 39  # the checkpoint keeps the transaction version


def test_batches_commit_while_compaction_and_vacuum_run(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    stop = threading.Event()
    rounds = [0]

    def maintain_forever() -> None:
        while not stop.is_set():
            sinks.SinkWriter(tmp_path).maintain(compact=True, retention_s=0)
            rounds[0] += 1

    for batch in range(3):
        writer.commit_batch(dead_letters(batch), batch)
    thread = threading.Thread(target=maintain_forever)
    thread.start()
    try:
        for batch in range(3, 60):
            assert writer.commit_batch(dead_letters(batch), batch)["dead_letter"] == 2
            assert len(ids(tmp_path)) == 2 * (batch + 1)  # every reader sees each row once, meanwhile too
    finally:
        stop.set()
        thread.join()
    assert rounds[0] > 1
    assert ids(tmp_path) == sorted(f"m{b}-{i}" for b in range(60) for i in range(2))


def test_vacuum_keeps_what_the_oldest_savepoint_needs(tmp_path):
    now = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    assert sinks.vacuum_retention_s(tmp_path, 3600, now) == 3600  # no savepoint: as configured
    for name, taken_at in (("older", "2027-01-13T08:00:00.000Z"), ("newer", "2027-01-15T07:00:00.000Z")):
        folder = store.savepoints_dir(tmp_path) / name
        folder.mkdir(parents=True)
        (folder / "savepoint.json").write_text(json.dumps({"name": name, "batch_id": 3, "taken_at": taken_at}))
    assert sinks.oldest_savepoint_age_s(tmp_path, now) == 2 * 86400
    assert sinks.vacuum_retention_s(tmp_path, 3600, now) == 2 * 86400 + 3600  # back to the oldest, and an hour
    assert sinks.vacuum_retention_s(tmp_path, 7 * 86400, now) == 7 * 86400
    # one that records its sinks' versions is kept by version, not by stretching the retention
    folder = store.savepoints_dir(tmp_path) / "versioned"
    folder.mkdir()
    (folder / "savepoint.json").write_text(json.dumps({"name": "versioned", "batch_id": 2, "sink_versions":
                                                       {"enriched": 4, "dead_letter": 1},
                                                       "taken_at": "2027-01-01T08:00:00.000Z"}))
    assert sinks.vacuum_retention_s(tmp_path, 3600, now) == 2 * 86400 + 3600  # still the older one's
    assert sinks.oldest_savepoint_age_s(tmp_path, now) == 14 * 86400  # the log goes back to it
    from pipeline.sink_maintenance import savepoint_versions
    assert savepoint_versions(tmp_path) == {"enriched": [4], "dead_letter": [1]}


def test_the_schedule_records_each_round(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    for batch in range(5):
        writer.commit_batch(dead_letters(batch), batch)
    events = []
    maintenance = sinks.SinkMaintenance(writer, tmp_path, 0.05, 0, lambda kind, message, **details: events.append(
        (kind, message, details)))
    maintenance.start()
    try:
        wait_for(lambda: events, timeout=30, interval=0.05, what="a maintenance round")
    finally:
        maintenance.stop()
    kind, message, details = events[0]
    assert kind == "sinks_maintained" and "5 files into 1" in message and details["sinks"]["dead_letter"]["files_vacuumed"] == 5
    assert len(sinks.sink_files(tmp_path, "dead_letter")) == 1 and len(ids(tmp_path)) == 10


def test_a_round_starts_once_enough_batches_have_committed_whatever_the_interval(tmp_path):
    """A fast trigger must not leave a round's worth of per-batch files for readers to open: with
    an hour's interval, the third commit since the last round starts one."""
    writer = sinks.SinkWriter(tmp_path)
    events = []
    maintenance = sinks.SinkMaintenance(writer, tmp_path, 3600, 0, lambda kind, message, **details: events.append(
        (kind, details)), after_batches=3).start()
    try:
        for batch in range(2):
            writer.commit_batch(dead_letters(batch), batch)
        assert not events and len(sinks.sink_files(tmp_path, "dead_letter")) == 2
        writer.commit_batch(dead_letters(2), 2)
        wait_for(lambda: events, timeout=30, interval=0.05, what="a round after the third batch")
    finally:
        maintenance.stop()
    assert events[0][0] == "sinks_maintained" and len(sinks.sink_files(tmp_path, "dead_letter")) == 1
    assert writer.after_commit == [] and len(ids(tmp_path)) == 6  # stop() unhooks it; no row lost


def test_a_restore_finds_its_version_after_the_log_was_cleaned_up(tmp_path):
    """Old log entries go (metrics.retention-like log cleanup); a batch whose own commit is gone
    from the log is found as the version just before the next batch's commit."""
    writer = sinks.SinkWriter(tmp_path)
    for batch in range(10):
        writer.commit_batch(dead_letters(batch), batch)
    table = sinks.open_table(store.sink_dir(tmp_path, "dead_letter"))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 hours"})
    table = sinks.open_table(store.sink_dir(tmp_path, "dead_letter"))
    table.create_checkpoint()
    table.cleanup_metadata()
    for batch in (20, 21):
        writer.commit_batch(dead_letters(batch), batch)
    writer.rollback(15)  # a savepoint at batch 15: batches 0-9 stay, 20 and 21 go
    assert ids(tmp_path) == sorted(f"m{b}-{i}" for b in range(10) for i in range(2))
    assert writer.committed_batches()["dead_letter"] == 15


def missing_states(batch_id: int, rows: int = 2) -> pa.Table:
    """A batch of ``rows`` missing-state rows (every column null but the ids and batch_id)."""
    schema = sinks.SCHEMAS["missing_state"]
    columns = {"invoice_id": pa.array(range(rows), pa.int64()), "batch_id": pa.array([batch_id] * rows, pa.int64()),
               "source_message_id": pa.array([f"s{batch_id}-{i}" for i in range(rows)])}
    return pa.Table.from_arrays([columns[f.name].cast(f.type) if f.name in columns else pa.nulls(rows, f.type)
                                 for f in schema], schema=schema)


def test_a_writer_keeping_its_tables_loaded_sees_what_others_committed_since(tmp_path):
    """The writer keeps each table loaded between batches: its transaction check must still see
    a commit another writer made meanwhile (a re-run of that batch commits nothing), and a
    rollback another writer made (the batches after it commit again)."""
    kept = sinks.SinkWriter(tmp_path)
    for batch in range(3):
        assert kept.commit_batch(dead_letters(batch), batch)["dead_letter"] == 2
    sinks.SinkWriter(tmp_path).rollback(1)
    assert kept.commit_batch(dead_letters(2, tag="redo"), 2)["dead_letter"] == 2
    assert sinks.SinkWriter(tmp_path).commit_batch(dead_letters(3, tag="other"), 3)["dead_letter"] == 2
    assert kept.commit_batch(dead_letters(3), 3)["dead_letter"] == 0
    assert ids(tmp_path) == ["m0-0", "m0-1", "m1-0", "m1-1", "other3-0", "other3-1", "redo2-0", "redo2-1"]
    for batch in range(4, 4 + sinks.RELOAD_AFTER_VERSIONS + 5):  # past a reload of the kept table
        assert kept.commit_batch(dead_letters(batch), batch)["dead_letter"] == 2
    assert kept.commit_batch(dead_letters(10), 10)["dead_letter"] == 0
    assert kept.committed_batches()["dead_letter"] == 3 + sinks.RELOAD_AFTER_VERSIONS + 5


def test_the_sinks_of_a_batch_commit_in_parallel_and_one_failure_leaves_the_others_committed(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    batch = {**dead_letters(0), "missing_state": missing_states(0)}
    assert writer.commit_batch(batch, 0) == {"enriched": 0, "missing_state": 2, "dead_letter": 2}
    blocked = store.sink_dir(tmp_path, "enriched")
    blocked.write_text("in the way")  # a file where the enriched table belongs
    enriched = pa.Table.from_arrays([pa.nulls(1, f.type) for f in sinks.SCHEMAS["enriched"]],
                                    schema=sinks.SCHEMAS["enriched"])
    with pytest.raises(SinkError, match=re.escape(f"cannot write sink 'enriched' batch 1 under {str(blocked)!r}")):
        writer.commit_batch({**dead_letters(1), "missing_state": missing_states(1), "enriched": enriched}, 1)
    assert writer.committed_batches() == {"enriched": -1, "missing_state": 1, "dead_letter": 1}
    blocked.unlink()  # fixed: Spark's re-run of batch 1 commits only what is missing
    again = writer.commit_batch({**dead_letters(1), "missing_state": missing_states(1), "enriched": enriched}, 1)
    assert again == {"enriched": 1, "missing_state": 0, "dead_letter": 0}
    assert ids(tmp_path) == ["m0-0", "m0-1", "m1-0", "m1-1"]
