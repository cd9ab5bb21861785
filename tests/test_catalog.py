"""The console's catalog of each sink's current files, read from the sinks' Delta log.

Real Delta tables written by :class:`pipeline.sinks.SinkWriter`, real DuckDB for the files
whose log statistics do not tell their rows per group. A spy on
:meth:`app.catalog.SinkCatalog._read_stats` tells which files the catalog had to open itself.
"""

from __future__ import annotations

import pyarrow as pa
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


def commit(writer: sinks.SinkWriter, batch_id: int, rows: int = 3, reasons: list[str] | None = None) -> None:
    """Commit one batch: ``rows`` enriched rows committed at T0 + batch seconds (plus i ms
    each), and missing-state rows with ``reasons``."""
    at = T0 + batch_id * 1000
    tables = {"enriched": make_table("enriched", [at + i for i in range(rows)])}
    if reasons:
        tables["missing_state"] = make_table("missing_state", [at] * len(reasons), reasons)
    writer.commit_batch({name: table.set_column(table.schema.get_field_index("batch_id"), "batch_id",
                                                pa.array([batch_id] * table.num_rows, pa.int64()))
                         for name, table in tables.items()}, batch_id)


@pytest.fixture
def scanned(monkeypatch) -> list[str]:
    """The paths the catalog read with DuckDB because the log's statistics did not tell enough."""
    paths: list[str] = []
    original = catalog.SinkCatalog._read_stats

    def spy(self, sink, new):
        paths.extend(new)
        return original(self, sink, new)

    monkeypatch.setattr(catalog.SinkCatalog, "_read_stats", spy)
    monkeypatch.setattr(catalog, "REFRESH_MIN_S", 0.0)  # every files() call lists again
    return paths


def summary(files: list[catalog.SinkFile]) -> list[tuple]:
    return [(entry.batch_id, entry.rows, entry.min_ms, entry.max_ms, entry.rows_by_group) for entry in files]


def test_catalog_learns_files_from_the_delta_log_alone(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    commit(writer, 0, reasons=["user"])
    commit(writer, 1, rows=5, reasons=["item", "item"])
    sink_catalog = catalog.SinkCatalog(tmp_path)
    assert summary(sink_catalog.files("enriched")) == [(0, 3, T0, T0 + 2, ()), (1, 5, T0 + 1000, T0 + 1004, ())]
    assert summary(sink_catalog.files("missing_state")) == [
        (0, 1, T0, T0, (("user", 1),)), (1, 2, T0 + 1000, T0 + 1000, (("item", 2),))]
    assert sink_catalog.files("dead_letter") == [] and scanned == []


def test_a_file_of_several_groups_is_read_once(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    commit(writer, 0, reasons=["user", "item", "user", None])
    sink_catalog = catalog.SinkCatalog(tmp_path)
    assert summary(sink_catalog.files("missing_state")) == [(0, 4, T0, T0, (("item", 1), ("user", 2)))]
    assert summary(sink_catalog.files("missing_state")) == [(0, 4, T0, T0, (("item", 1), ("user", 2)))]
    assert scanned == sinks.sink_files(tmp_path, "missing_state")


def test_compaction_and_the_catalog_agree_on_the_fixture_data(tmp_path, scanned):
    data_dir = write_data_dir(tmp_path / "data", batches=12, now_ms=T0).data_dir
    before = {sink: catalog.SinkCatalog(data_dir).files(sink) for sink in store.SINKS}
    assert all(before.values()) and len(before["enriched"]) == 12
    sinks.SinkWriter(data_dir).maintain(compact=True)
    after = {sink: catalog.SinkCatalog(data_dir).files(sink) for sink in store.SINKS}
    for sink in store.SINKS:
        assert len(after[sink]) == 1  # the superseded files are still on disk, but not in the log
        assert sum(entry.rows for entry in after[sink]) == sum(entry.rows for entry in before[sink])
        assert after[sink][0].min_ms == min(entry.min_ms for entry in before[sink])
        assert after[sink][0].max_ms == max(entry.max_ms for entry in before[sink])
    groups: dict[str, int] = {}
    for entry in before["missing_state"]:
        for reason, rows in entry.rows_by_group:
            groups[reason] = groups.get(reason, 0) + rows
    assert dict(after["missing_state"][0].rows_by_group) == groups


def test_restore_takes_the_table_back_and_the_catalog_follows(tmp_path, scanned):
    writer = sinks.SinkWriter(tmp_path)
    for batch_id in (0, 1, 2):
        commit(writer, batch_id)
    sink_catalog = catalog.SinkCatalog(tmp_path)
    assert [entry.batch_id for entry in sink_catalog.files("enriched")] == [0, 1, 2]

    writer.rollback(0)  # restoring a savepoint taken at batch 0
    assert summary(sink_catalog.files("enriched")) == [(0, 3, T0, T0 + 2, ())]

    commit(writer, 1, rows=6)  # the job runs batch 1 again, with other rows
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
