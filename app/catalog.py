"""The sink catalog: every committed Parquet file of each sink, with its row count and time range.

The job writes one folder per micro-batch and sink, so a day's run leaves tens of thousands
of small files, and opening them all costs far more than reading the few rows a chart needs.
The catalog lists the files (``sinks/<name>/batch=<id>/*.parquet``, the committed ones) and
learns each new file's rows and min/max commit time once: from the job's sink manifest
(:mod:`pipeline.sinks`), which records them when a batch is published, and for files the
manifest does not cover (older data dirs, a crash between a publish and its manifest line)
with one DuckDB pass over those files only. Queries then read just the files that can hold
rows of their time window, and totals are sums over the catalog.

A file is known by its path, size and modification time, and a manifest line is trusted only
for a listed file with the same name, size and mtime, so a batch folder that a savepoint
restore removed, or that the job wrote again, is noticed at the next refresh. A listing is at
most :data:`REFRESH_MIN_S` old. One catalog per data dir and process, shared by threads; it
opens the manifest only to read it, and holds no file open between refreshes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline import store
from pipeline.sinks import SINK_GROUP, SINK_TIME  # the time and group columns the manifest records

REFRESH_MIN_S = 1.0
Identity = tuple[str, int, int]  # (path, size, mtime_ns) of a listed file


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
        self._known: dict[str, dict[Identity, SinkFile]] = {sink: {} for sink in store.SINKS}
        self._listed_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self._manifest = ManifestReader(store.sink_manifest_path(self.data_dir))
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
        if not new:
            return
        self._manifest.read_new_lines()
        unrecorded = {}
        for identity, batch_id in new.items():
            entry = self._manifest.take(sink, batch_id, identity)
            if entry is None:
                unrecorded[identity] = batch_id
            else:
                known[identity] = entry
        if unrecorded:
            known.update(self._read_stats(sink, unrecorded))

    def _read_stats(self, sink: str, new: dict[Identity, int]) -> dict[Identity, SinkFile]:
        """Rows, time range and groups of files the manifest does not cover, in one DuckDB pass."""
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


class ManifestReader:
    """The job's sink manifest, read incrementally: each call reads only the complete lines
    appended since the last one, and starts over when the file was replaced (a restore prunes
    it). Not thread-safe: its catalog calls it under the catalog's lock."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._file_id: tuple[int, int] | None = None
        self._offset = 0
        # (sink, batch id, file name) -> (size, mtime_ns, SinkFile without its folder path)
        self._lines: dict[tuple[str, int, str], tuple[int, int, SinkFile]] = {}

    def read_new_lines(self) -> int:
        """Parse the lines appended since the last call; returns how many parsed."""
        try:
            with open(self.path, "rb") as handle:
                info = os.fstat(handle.fileno())
                if (info.st_dev, info.st_ino) != self._file_id or info.st_size < self._offset:
                    self._file_id, self._offset = (info.st_dev, info.st_ino), 0
                    self._lines.clear()
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            self._file_id, self._offset = None, 0
            self._lines.clear()
            return 0
        complete = data[: data.rfind(b"\n") + 1]  # a half-written last line waits for its end
        self._offset += len(complete)
        parsed = 0
        for row in _decode_lines(complete):
            recorded = parse_manifest_row(row)
            if recorded is not None:
                key, size, mtime_ns, entry = recorded
                self._lines[key] = (size, mtime_ns, entry)
                parsed += 1
        return parsed

    def take(self, sink: str, batch_id: int, identity: Identity) -> SinkFile | None:
        """The recorded facts of a listed file, if a line matches its name, size and mtime
        (and forgets the line: the catalog keeps the entry from now on)."""
        path, size, mtime_ns = identity
        key = (sink, batch_id, os.path.basename(path))
        recorded = self._lines.get(key)
        if recorded is None or recorded[:2] != (size, mtime_ns):
            return None
        del self._lines[key]
        entry = recorded[2]
        return SinkFile(path, batch_id, entry.rows, entry.min_ms, entry.max_ms, entry.rows_by_group)


def parse_manifest_row(row) -> tuple[tuple[str, int, str], int, int, SinkFile] | None:
    """``((sink, batch id, file name), size, mtime_ns, SinkFile)`` from one decoded manifest
    line (format: :mod:`pipeline.sinks`); None for a line of another shape, which is skipped."""
    try:
        key = (str(row["sink"]), int(row["batch_id"]), str(row["file"]))
        groups = tuple(sorted((str(value), int(count)) for value, count in row.get("groups", {}).items()))
        entry = SinkFile(key[2], key[1], int(row["rows"]), _optional_int(row["min_ms"]), _optional_int(row["max_ms"]), groups)
        return key, int(row["size"]), int(row["mtime_ns"]), entry
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _decode_lines(data: bytes) -> list:
    """The JSON values of the lines in ``data``, skipping lines that do not parse (a torn write).
    One ``json.loads`` for the lot is several times faster than one per line."""
    lines = [line for line in data.splitlines() if line.strip()]
    try:
        return json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        pass
    decoded = []
    for line in lines:
        try:
            decoded.append(json.loads(line))
        except ValueError:
            continue
    return decoded


def _optional_int(value) -> int | None:
    return None if value is None else int(value)


def _list_files(sink_dir: Path) -> dict[Identity, int]:
    """``(path, size, mtime_ns) -> batch id`` for every ``batch=<id>/*.parquet`` under the sink."""
    found: dict[Identity, int] = {}
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
