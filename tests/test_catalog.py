"""The sink manifest the job writes when it publishes a batch, and the console's catalog reading it.

Real Parquet written by :class:`pipeline.sinks.SinkWriter`, real DuckDB for the files the
manifest does not cover. A spy on :meth:`app.catalog.SinkCatalog._read_stats` tells which
files the catalog had to open itself.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app import catalog
from app_fixtures import write_data_dir
from pipeline import sinks, store

T0 = 1_800_000_000_000


def make_table(sink: str, times_ms: list[int], reasons: list[str | None] | None = None) -> pa.Table:
    """A sink table of ``len(times_ms)`` rows: the sink's time column set, the rest NULL
    (``reason`` from ``reasons`` for missing_state)."""
    schema = sinks.SCHEMAS[sink]
    columns = {field.name: pa.nulls(len(times_ms), field.type) for field in schema}
    time_column = sinks.SINK_TIME[sink]
    columns[time_column] = pa.array(times_ms, pa.int64()).cast(schema.field(time_column).type)
    if reasons is not None:
        columns["reason"] = pa.array(reasons, pa.string())
    return pa.table(columns, schema=schema)


def publish(writer: sinks.SinkWriter, batch_id: int, rows: int = 3, reasons: list[str] | None = None) -> None:
    """Stage and publish one batch: ``rows`` enriched rows committed at T0 + batch seconds
    (plus i ms each), and missing-state rows with ``reasons``."""
    at = T0 + batch_id * 1000
    tables = {"enriched": make_table("enriched", [at + i for i in range(rows)])}
    if reasons:
        tables["missing_state"] = make_table("missing_state", [at] * len(reasons), reasons)
    writer.stage_batch(tables, batch_id)
    writer.publish_committed(batch_id)


def manifest_lines(data_dir: Path) -> list[dict]:
    return [json.loads(line) for line in store.sink_manifest_path(data_dir).read_text().splitlines()]


@pytest.fixture
def scanned(monkeypatch) -> list[str]:
    """The paths the catalog read with DuckDB because no manifest line covered them."""
    paths: list[str] = []
    original = catalog.SinkCatalog._read_stats

    def spy(self, sink, new):
        paths.extend(identity[0] for identity in new)
        return original(self, sink, new)

    monkeypatch.setattr(catalog.SinkCatalog, "_read_stats", spy)
    monkeypatch.setattr(catalog, "REFRESH_MIN_S", 0.0)  # every files() call lists again
    return paths


def summary(files: list[catalog.SinkFile]) -> list[tuple]:
    return [(entry.batch_id, entry.rows, entry.min_ms, entry.max_ms, entry.rows_by_group) for entry in files]


# ------------------------------------------------------------------ the job's manifest


def test_publish_records_each_published_file_with_its_rows_and_times(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    publish(writer, 0, rows=3, reasons=["user", "item", "user", None])
    lines = {line["sink"]: line for line in manifest_lines(tmp_path)}
    assert set(lines) == {"enriched", "missing_state"}
    enriched_file = store.sink_dir(tmp_path, "enriched") / store.batch_folder(0) / "part-00000.parquet"
    info = enriched_file.stat()
    assert lines["enriched"] == {"sink": "enriched", "batch_id": 0, "file": "part-00000.parquet", "size": info.st_size,
                                 "mtime_ns": info.st_mtime_ns, "rows": 3, "min_ms": T0, "max_ms": T0 + 2}
    assert (lines["missing_state"]["rows"], lines["missing_state"]["groups"]) == (4, {"user": 2, "item": 1})


def test_only_committed_batches_reach_the_manifest(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    for batch_id in (0, 1, 2):
        writer.stage_batch({"enriched": make_table("enriched", [T0])}, batch_id)
    assert writer.publish_committed(1) == 2
    writer.discard_uncommitted(1)
    assert [line["batch_id"] for line in manifest_lines(tmp_path)] == [0, 1]


def test_a_manifest_that_cannot_be_written_is_logged_and_the_batch_still_published(tmp_path, caplog):
    (tmp_path / "metrics").write_text("not a folder")
    writer = sinks.SinkWriter(tmp_path)
    writer.stage_batch({"enriched": make_table("enriched", [T0])}, 0)
    with caplog.at_level(logging.WARNING, logger="pipeline.sinks"):
        assert writer.publish_committed(0) == 1
    assert (store.sink_dir(tmp_path, "enriched") / store.batch_folder(0) / "part-00000.parquet").is_file()
    assert "cannot record published sink files" in caplog.text


def test_a_torn_last_line_stays_one_skipped_line(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    publish(writer, 0)
    with store.sink_manifest_path(tmp_path).open("a") as handle:
        handle.write('{"sink": "enriched", "batch_')  # a crash mid-append
    publish(writer, 1)
    text = store.sink_manifest_path(tmp_path).read_text().splitlines()
    assert text[1] == '{"sink": "enriched", "batch_' and json.loads(text[2])["batch_id"] == 1
    files = catalog.SinkCatalog(tmp_path).files("enriched")
    assert [entry.batch_id for entry in files] == [0, 1] and scanned == []


# ------------------------------------------------------------------ the console's catalog


def test_catalog_learns_recorded_files_from_the_manifest_alone(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    publish(writer, 0, reasons=["user"])
    publish(writer, 1, rows=5, reasons=["item", "user_and_item"])
    sink_catalog = catalog.SinkCatalog(tmp_path)
    assert summary(sink_catalog.files("enriched")) == [(0, 3, T0, T0 + 2, ()), (1, 5, T0 + 1000, T0 + 1004, ())]
    assert summary(sink_catalog.files("missing_state")) == [
        (0, 1, T0, T0, (("user", 1),)), (1, 2, T0 + 1000, T0 + 1000, (("item", 1), ("user_and_item", 1)))]
    assert sink_catalog.files("dead_letter") == [] and scanned == []


def test_manifest_and_scan_agree_on_the_fixture_data(tmp_path, scanned):
    with_manifest = write_data_dir(tmp_path / "with", batches=12, now_ms=T0).data_dir
    without = write_data_dir(tmp_path / "without", batches=12, now_ms=T0, manifest=False).data_dir
    for sink in store.SINKS:
        recorded = catalog.SinkCatalog(with_manifest).files(sink)
        assert scanned == []
        assert summary(recorded) == summary(catalog.SinkCatalog(without).files(sink)) and recorded
        assert len(scanned) == len(recorded)
        scanned.clear()


def test_catalog_scans_only_the_files_no_line_covers(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    publish(writer, 0)
    folder = store.sink_dir(tmp_path, "enriched") / store.batch_folder(1)
    folder.mkdir()
    pq.write_table(make_table("enriched", [T0 + 1000, T0 + 1001]), folder / "part-00000.parquet")  # an older job's file
    assert summary(catalog.SinkCatalog(tmp_path).files("enriched")) == [(0, 3, T0, T0 + 2, ()),
                                                                        (1, 2, T0 + 1000, T0 + 1001, ())]
    assert scanned == [str(folder / "part-00000.parquet")]


def test_a_line_is_not_trusted_for_a_file_that_changed(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    publish(writer, 0, rows=3)
    path = store.sink_dir(tmp_path, "enriched") / store.batch_folder(0) / "part-00000.parquet"
    pq.write_table(make_table("enriched", [T0 + 7] * 40), path)  # same name, other rows
    assert summary(catalog.SinkCatalog(tmp_path).files("enriched")) == [(0, 40, T0 + 7, T0 + 7, ())]
    assert scanned == [str(path)]


def test_restore_prunes_the_manifest_and_the_catalog_follows(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    for batch_id in (0, 1, 2):
        publish(writer, batch_id)
    sink_catalog = catalog.SinkCatalog(tmp_path)
    assert [entry.batch_id for entry in sink_catalog.files("enriched")] == [0, 1, 2]

    writer.drop_published_after(0)  # restoring a savepoint taken at batch 0
    assert [line["batch_id"] for line in manifest_lines(tmp_path)] == [0]
    assert summary(sink_catalog.files("enriched")) == [(0, 3, T0, T0 + 2, ())]

    publish(writer, 1, rows=6)  # the job runs batch 1 again, with other rows
    assert summary(sink_catalog.files("enriched")) == [(0, 3, T0, T0 + 2, ()), (1, 6, T0 + 1000, T0 + 1005, ())]
    assert scanned == []


def test_a_fresh_data_dir_has_an_empty_catalog(tmp_path, scanned):
    sink_catalog = catalog.SinkCatalog(tmp_path / "nothing-yet")
    assert all(sink_catalog.files(sink) == [] for sink in store.SINKS) and scanned == []


# ------------------------------------------------------------------ counting from the catalog


def test_count_by_bucket_counts_whole_files_and_returns_the_rest_to_read():
    end, width = 60_000, 10_000  # buckets (0, 10 s], …, (50 s, 60 s]; the window is the last 30 s
    files = [
        catalog.SinkFile("inside", 0, 4, 45_000, 45_000, (("user", 3), ("item", 1))),
        catalog.SinkFile("on-an-edge", 1, 2, 50_000, 50_000, (("user", 2),)),  # 50 s belongs to (40 s, 50 s]
        catalog.SinkFile("straddles-a-bucket", 2, 5, 49_000, 51_000, (("user", 5),)),
        catalog.SinkFile("straddles-the-window", 3, 3, 25_000, 35_000, (("user", 3),)),
        catalog.SinkFile("before-the-window", 4, 9, 1_000, 30_000, (("user", 9),)),
        catalog.SinkFile("null-groups", 5, 6, 55_000, 55_000, (("user", 5),)),
        catalog.SinkFile("empty", 6, 0, None, None),
    ]
    counts, unread = catalog.count_by_bucket(files, end, 30_000, width)
    assert counts == {40_000: 6, 50_000: 6}
    assert [entry.path for entry in unread] == ["straddles-a-bucket", "straddles-the-window"]
    counts, unread = catalog.count_by_bucket(files, end, 30_000, width, by_group=True)
    assert counts == {(40_000, "user"): 5, (40_000, "item"): 1}
    assert [entry.path for entry in unread] == ["straddles-a-bucket", "straddles-the-window", "null-groups"]
