"""The sink catalog: every committed Parquet file of each sink, with its row count and time range.

The job writes one folder per micro-batch and sink, so a day's run leaves tens of thousands
of small files, and opening them all costs far more than reading the few rows a chart needs.
The catalog lists the files (``sinks/<name>/batch=<id>/*.parquet``, the committed ones) and
learns each new file's rows and min/max commit time once, with one DuckDB pass over the new
files only. Queries then read just the files that can hold rows of their time window, and
totals are sums over the catalog.

A file is known by its path, size and modification time, so a batch folder that a savepoint
restore removed, or that the job wrote again, is noticed at the next refresh. A listing is
at most :data:`REFRESH_MIN_S` old. One catalog per data dir and process, shared by threads.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline import store

REFRESH_MIN_S = 1.0
# The column each sink is timed by: when the job committed the row.
SINK_TIME = {"enriched": "enriched_at", "missing_state": "detected_at", "dead_letter": "detected_at"}
# A column whose row counts per value the catalog keeps too (why orders went missing).
SINK_GROUP = {"missing_state": "reason"}


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
    """The committed files of one data dir's sinks; :meth:`files` keeps the listing current."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._known: dict[str, dict[tuple[str, int, int], SinkFile]] = {sink: {} for sink in store.SINKS}
        self._listed_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._connection: duckdb.DuckDBPyConnection | None = None

    def files(self, sink: str) -> list[SinkFile]:
        """The sink's committed files, oldest batch first."""
        with self._lock:
            if time.monotonic() - self._listed_at.get(sink, -REFRESH_MIN_S) >= REFRESH_MIN_S:
                self._refresh(sink)
                self._listed_at[sink] = time.monotonic()
            return sorted(self._known[sink].values(), key=lambda entry: (entry.batch_id, entry.path))

    def _refresh(self, sink: str) -> None:
        listed = _list_files(store.sink_dir(self.data_dir, sink))
        known = self._known[sink]
        for identity in set(known) - set(listed):
            del known[identity]  # removed by a restore, or rewritten
        new = {identity: batch_id for identity, batch_id in listed.items() if identity not in known}
        if new:
            known.update(self._read_stats(sink, new))

    def _read_stats(self, sink: str, new: dict[tuple[str, int, int], int]) -> dict[tuple[str, int, int], SinkFile]:
        if self._connection is None:
            self._connection = duckdb.connect(":memory:")
        by_path = {identity[0]: (identity, batch_id) for identity, batch_id in new.items()}
        column, group = SINK_TIME[sink], SINK_GROUP.get(sink, "NULL")
        rows = self._connection.execute(
            f"SELECT filename, {group}, count(*), min(epoch_ms({column})), max(epoch_ms({column})) "
            "FROM read_parquet($files, filename = true, hive_partitioning = false) GROUP BY ALL",
            {"files": list(by_path)},
        ).fetchall()
        per_file: dict[str, list] = {path: [0, None, None, []] for path in by_path}
        for path, value, count, min_ms, max_ms in rows:
            entry = per_file[path]
            entry[0] += count
            entry[1] = min_ms if entry[1] is None else min(entry[1], min_ms)
            entry[2] = max_ms if entry[2] is None else max(entry[2], max_ms)
            if value is not None:
                entry[3].append((value, int(count)))
        return {
            by_path[path][0]: SinkFile(path, by_path[path][1], int(count), min_ms, max_ms, tuple(sorted(groups)))
            for path, (count, min_ms, max_ms, groups) in per_file.items()  # a file with no rows keeps zeros
        }


def _list_files(sink_dir: Path) -> dict[tuple[str, int, int], int]:
    """``(path, size, mtime_ns) -> batch id`` for every ``batch=<id>/*.parquet`` under the sink."""
    found: dict[tuple[str, int, int], int] = {}
    try:
        folders = list(os.scandir(sink_dir))
    except FileNotFoundError:
        return found
    for folder in folders:
        if not folder.name.startswith("batch=") or not folder.is_dir():
            continue
        try:
            batch_id = int(folder.name.split("=", 1)[1])
            entries = list(os.scandir(folder.path))
        except (ValueError, FileNotFoundError):
            continue  # not a batch folder, or removed while we listed
        for entry in entries:
            if entry.name.endswith(".parquet") and entry.is_file():
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                found[(entry.path, info.st_size, info.st_mtime_ns)] = batch_id
    return found


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
