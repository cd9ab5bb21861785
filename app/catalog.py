"""The sink catalog: the current files of each sink's Delta table, with row counts and time ranges.

Each sink is a Delta table (pipeline/sinks.py). Its log lists the files of the current
version with their row counts and min/max column statistics, so the catalog knows every
file's rows and commit-time range without opening it: :func:`table_file_stats` reads them,
and :func:`app.sources.files_relation` hands the files to DuckDB. Queries then read just the
files that can hold rows of their time window, and totals are sums over the catalog. Files
that compaction replaced are not in the log, so no reader sees a row twice.

Rows per value of a sink's group column (the missing-state reason) come from the statistics
when a file holds one value (min = max, no NULL); a compacted file holding several is read
once, with DuckDB, and remembered by its path (a Delta file never changes). A listing is at
most :data:`REFRESH_MIN_S` old. One catalog per data dir and process, shared by threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline import store
from pipeline.sinks import SINK_GROUP, SINK_TIME, open_table  # the time and group columns the console counts by

REFRESH_MIN_S = 1.0


@dataclass(frozen=True)
class SinkFile:
    """One committed file: its path, batch, rows, the commit times of its oldest and newest row,
    and its rows per value of the sink's group column (``SINK_GROUP``), if it has one."""

    path: str
    batch_id: int
    rows: int
    min_ms: int | None
    max_ms: int | None
    rows_by_group: tuple[tuple[str, int], ...] = ()


class SinkCatalog:
    """The current files of one data dir's sinks; :meth:`files` keeps the listing current."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._known: dict[str, dict[str, SinkFile]] = {sink: {} for sink in store.SINKS}
        self._listed_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._connection: duckdb.DuckDBPyConnection | None = None

    def files(self, sink: str) -> list[SinkFile]:
        """The sink's current files, oldest batch first."""
        with self._lock:
            if time.monotonic() - self._listed_at.get(sink, -REFRESH_MIN_S) >= REFRESH_MIN_S:
                self._refresh(sink)
                self._listed_at[sink] = time.monotonic()
            return sorted(self._known[sink].values(), key=lambda entry: (entry.batch_id, entry.path))

    def _refresh(self, sink: str) -> None:
        stats = table_file_stats(store.sink_dir(self.data_dir, sink), sink)
        known = self._known[sink]
        for path in set(known) - set(stats):
            del known[path]  # compacted away, or taken back by a restore
        unread = {}
        for path, entry in stats.items():
            if path in known:
                continue
            if entry is None:
                unread[path] = None
            else:
                known[path] = entry
        if unread:
            known.update(self._read_stats(sink, list(unread)))

    def _read_stats(self, sink: str, paths: list[str]) -> dict[str, SinkFile]:
        """Rows, batch, time range and groups of files whose log statistics do not tell them, in one DuckDB pass."""
        if self._connection is None:
            self._connection = duckdb.connect(":memory:")
        column, group = SINK_TIME[sink], SINK_GROUP.get(sink, "NULL")
        rows = self._connection.execute(
            f"SELECT filename, {group}, count(*), min(epoch_ms({column})), max(epoch_ms({column})), min(batch_id) "
            "FROM read_parquet($files, filename = true, hive_partitioning = false) GROUP BY ALL",
            {"files": paths},
        ).fetchall()
        per_file: dict[str, list] = {path: [0, None, None, [], None] for path in paths}
        for path, value, count, min_ms, max_ms, batch_id in rows:
            entry = per_file[path]
            entry[0] += count
            entry[1] = min_ms if entry[1] is None else min(entry[1], min_ms)
            entry[2] = max_ms if entry[2] is None else max(entry[2], max_ms)
            entry[4] = batch_id if entry[4] is None else min(entry[4], batch_id)
            if value is not None:
                entry[3].append((value, int(count)))
        return {
            path: SinkFile(path, int(batch_id or 0), int(count), min_ms, max_ms, tuple(sorted(groups)))
            for path, (count, min_ms, max_ms, groups, batch_id) in per_file.items()  # a file with no rows keeps zeros
        }


def table_file_stats(table_path: Path, sink: str) -> dict[str, SinkFile | None]:
    """``path -> SinkFile`` for every file of the table's current version, from its Delta log
    alone; None for a file whose statistics do not tell its rows per group (several values)
    or its time range (no statistics), which the caller reads. {} without a table."""
    table = open_table(table_path)
    if table is None:
        return {}
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    root = str(Path(table_path).absolute())
    column, group = SINK_TIME[sink], SINK_GROUP.get(sink)
    found: dict[str, SinkFile | None] = {}
    for action in actions:
        path = action["path"] if action["path"].startswith("/") else f"{root}/{action['path']}"
        rows = action.get("num_records")
        low, high = action.get(f"min.{column}"), action.get(f"max.{column}")
        if rows is None or (rows and (low is None or high is None)):
            found[path] = None
            continue
        groups: tuple[tuple[str, int], ...] = ()
        if group is not None and rows:
            nulls, first, last = action.get(f"null_count.{group}"), action.get(f"min.{group}"), action.get(f"max.{group}")
            if nulls == rows:
                groups = ()
            elif nulls == 0 and first is not None and first == last:
                groups = ((first, int(rows)),)
            else:
                found[path] = None
                continue
        found[path] = SinkFile(path, int(action.get("min.batch_id") or 0), int(rows), _epoch_ms(low), _epoch_ms(high), groups)
    return found


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _epoch_ms(value) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(milliseconds=1)


def bucket_start_ms(time_ms: int, end_ms: int, width_ms: int) -> int:
    """The start of the ``width_ms`` bucket holding ``time_ms``, buckets counted back from
    ``end_ms`` (the same buckets as the console's SQL)."""
    return end_ms - ((end_ms - time_ms) // width_ms + 1) * width_ms


def count_by_bucket(files: list[SinkFile], end_ms: int, window_ms: int, width_ms: int,
                    by_group: bool = False) -> tuple[dict, list[SinkFile]]:
    """Rows per bucket of the window ``(end_ms - window_ms, end_ms]`` from the catalog alone,
    and the files that must be read to finish the count.

    A file whose commit times all fall in one bucket adds its rows to it (keys are bucket
    starts in epoch ms, or ``(bucket start, group value)`` with ``by_group``); a file with no
    row in the window adds nothing; any other file is returned to be read. The job stamps
    every row of a batch with the one commit time, so in practice no file is left to read.
    Relies on the commit time never being NULL (the job sets it on every row).
    """
    counts: dict = {}
    unread: list[SinkFile] = []
    start_ms = end_ms - window_ms
    for entry in files:
        if not entry.rows or entry.min_ms is None or entry.max_ms <= start_ms or entry.min_ms > end_ms:
            continue  # no row in the window
        bucket = bucket_start_ms(entry.min_ms, end_ms, width_ms)
        whole = start_ms < entry.min_ms and entry.max_ms <= end_ms and bucket == bucket_start_ms(entry.max_ms, end_ms, width_ms)
        if by_group:
            whole = whole and sum(rows for _, rows in entry.rows_by_group) == entry.rows  # no NULL group
        if not whole:
            unread.append(entry)
            continue
        parts = [((bucket, group), rows) for group, rows in entry.rows_by_group] if by_group else [(bucket, entry.rows)]
        for key, rows in parts:
            counts[key] = counts.get(key, 0) + rows
    return counts, unread


_catalogs: dict[Path, SinkCatalog] = {}
_catalogs_lock = threading.Lock()


def forget_catalogs() -> None:
    """Drop every catalog of this process, as a fresh process starts (for cold benchmarks)."""
    with _catalogs_lock:
        _catalogs.clear()


def catalog_for(data_dir: Path) -> SinkCatalog:
    """The catalog of ``data_dir`` in this process (made on first use)."""
    key = Path(data_dir).absolute()
    with _catalogs_lock:
        if key not in _catalogs:
            _catalogs[key] = SinkCatalog(key)
        return _catalogs[key]
