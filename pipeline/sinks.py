"""The Parquet sinks: enriched, missing_state and dead_letter, exactly-once for a glob reader.

Delivery guarantee: a DuckDB reader that globs ``<data_dir>/sinks/<name>/**/*.parquet`` sees
only rows of committed micro-batches, each once, even right after ``kill -9``. How:

1. ``stage_batch`` (called inside foreachBatch, on the driver) writes the batch's files under
   ``<data_dir>/staging/<name>/batch=<id>/``, replacing whatever an earlier, failed attempt of
   the same batch left there.
2. ``publish_committed`` renames each staged batch folder into ``sinks/<name>/`` once Spark has
   written the batch to its commit log (called from the query listener, and at start-up for
   batches committed just before a crash). A rename is atomic, so a batch appears whole.
3. ``discard_uncommitted`` drops staged batches Spark never committed; Spark re-runs them.

A failure in step 1 or 2 names the path in one SinkError and is never retried: a full disk
or a read-only folder stays so. A publish failure (it happens in the query listener, outside
the batch) is latched in :attr:`SinkWriter.failure`: the job polls it and stops, and the next
``stage_batch`` raises it too, so no batch is staged while an earlier committed one is unpublished.

The sink manifest (``<data_dir>/metrics/sink_files.jsonl``) lets the console know every
committed file's rows and time range without opening thousands of files. After each publish,
one appended JSON line per published file records what is in it::

    {"sink": "missing_state", "batch_id": 42, "file": "part-00000.parquet", "size": 5123,
     "mtime_ns": 1795000000123456789, "rows": 17, "min_ms": 1795000000456,
     "max_ms": 1795000000456, "groups": {"user": 9, "item": 8}}

It is a hint, never the truth: a reader trusts a line only for a file that exists with that
size and mtime, and reads files no line covers itself. So a crash between a rename and its
line, a half-written last line, or a failure to write the manifest (logged, never fatal)
costs the console time, not correctness. Lines are written only for published batches, each
publish with one ``write``; ``drop_published_after`` (a savepoint restore) rewrites the
manifest without the batches it removes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import store
from pipeline.errors import SinkError

log = logging.getLogger(__name__)
TS = pa.timestamp("ms", tz="UTC")

_ORDER_COLUMNS = [("invoice_id", pa.int64()), ("line_item_id", pa.int64()), ("user_id", pa.int64()),
                  ("item_id", pa.int64())]
_SOURCE_COLUMNS = [("batch_id", pa.int64()), ("source_topic", pa.string()), ("source_partition", pa.int32()),
                   ("source_message_id", pa.string())]
SCHEMAS = {
    "enriched": pa.schema(_ORDER_COLUMNS + [
        ("price", pa.float64()), ("created_at", TS), ("paid_at", TS),
        ("user_first_name", pa.string()), ("user_last_name", pa.string()), ("user_email", pa.string()),
        ("user_created_at", TS), ("item_name", pa.string()), ("item_category", pa.string()),
        ("item_adjective", pa.string()), ("item_modifier", pa.string()), ("item_price", pa.float64()),
        ("waited_ms", pa.int64()), ("published_at", TS), ("enriched_at", TS)] + _SOURCE_COLUMNS + [
        ("redrive_of", pa.string()), ("user_as_of", TS), ("item_as_of", TS)]),
    "missing_state": pa.schema(_ORDER_COLUMNS + [
        ("item_name", pa.string()), ("item_category", pa.string()), ("price", pa.float64()),
        ("created_at", TS), ("paid_at", TS), ("reason", pa.string()), ("waited_ms", pa.int64()),
        ("published_at", TS), ("detected_at", TS)] + _SOURCE_COLUMNS + [("redrive_of", pa.string()),
        ("user_as_of", TS), ("item_as_of", TS)]),
    "dead_letter": pa.schema([
        ("source_topic", pa.string()), ("source_partition", pa.int32()), ("source_message_id", pa.string()),
        ("key", pa.string()), ("payload", pa.string()), ("error", pa.string()), ("published_at", TS),
        ("detected_at", TS), ("batch_id", pa.int64())]),
}


# The column each sink is timed by (when the job committed the row), and a column whose rows
# per value the manifest records too (why orders went missing).
SINK_TIME = {"enriched": "enriched_at", "missing_state": "detected_at", "dead_letter": "detected_at"}
SINK_GROUP = {"missing_state": "reason"}


# Columns a sink takes from another envelope column: a missing-state row keeps the item name
# and category the order itself carried (an enriched row gets them from the item).
RENAMED = {"missing_state": {"item_name": "order_item_name", "item_category": "order_item_category"}}


def split_wide(table: pa.Table, batch_id: int, now_ms: int) -> dict[str, pa.Table]:
    """One typed table per sink from the final envelope rows (``sink`` says which), with
    batch_id and the write time added. Times arrive as epoch ms."""
    import pyarrow.compute as pc

    tables = {}
    for name, schema in SCHEMAS.items():
        part = table.filter(pc.equal(table["sink"], name))
        if part.num_rows == 0:
            continue
        columns = []
        for field in schema:
            if field.name == "batch_id":
                column = pa.repeat(pa.scalar(batch_id, pa.int64()), part.num_rows)
            elif field.name in ("enriched_at", "detected_at"):
                column = pa.repeat(pa.scalar(now_ms, pa.int64()), part.num_rows).cast(field.type)
            else:
                column = part[RENAMED.get(name, {}).get(field.name, field.name)].cast(field.type)
            columns.append(column)
        tables[name] = pa.Table.from_arrays(columns, schema=schema)
    return tables


class SinkWriter:
    """Stages each micro-batch and publishes it once committed (see the module docstring)."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.last_counts: dict[int, dict[str, int]] = {}
        self.failure: SinkError | None = None  # the first publish failure; the job stops on it

    def stage_batch(self, tables: dict[str, pa.Table], batch_id: int) -> dict[str, int]:
        if self.failure is not None:
            raise SinkError(str(self.failure))
        counts = {name: 0 for name in SCHEMAS}
        for name in SCHEMAS:
            folder = store.staging_dir(self.data_dir, name) / store.batch_folder(batch_id)
            try:
                if folder.exists():
                    shutil.rmtree(folder)  # a failed earlier attempt of this batch
                table = tables.get(name)
                if table is None or table.num_rows == 0:
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / "part-00000.parquet.tmp"
                pq.write_table(table, tmp, compression="zstd")
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
                os.replace(tmp, folder / "part-00000.parquet")
                counts[name] = table.num_rows
            except OSError as exc:
                raise SinkError(f"cannot write sink {name!r} batch {batch_id} under {str(folder)!r}: "
                                f"{exc.strerror or exc}") from exc
        self.last_counts[batch_id] = counts
        if len(self.last_counts) > 100:
            self.last_counts.pop(min(self.last_counts))
        return counts

    def write_wide(self, table: pa.Table, batch_id: int) -> dict[str, int]:
        """foreachBatch body: split the batch's wide rows per sink and stage them."""
        return self.stage_batch(split_wide(table, batch_id, int(time.time() * 1000)), batch_id)

    def staged_batches(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for name in SCHEMAS:
            root = store.staging_dir(self.data_dir, name)
            ids = sorted(int(p.name.split("=", 1)[1]) for p in root.glob("batch=*")) if root.exists() else []
            found[name] = ids
        return found

    def publish_committed(self, last_committed: int) -> int:
        """Move every staged batch <= last_committed into the sinks, then record the moved
        files in the manifest; returns folders moved. A failure raises a SinkError naming the
        path, and is kept in :attr:`failure`."""
        published: list[tuple[str, int]] = []
        try:
            for name, ids in self._staged_or_fail().items():
                for batch_id in ids:
                    if batch_id > last_committed:
                        continue
                    source = store.staging_dir(self.data_dir, name) / store.batch_folder(batch_id)
                    target = store.sink_dir(self.data_dir, name) / store.batch_folder(batch_id)
                    try:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        if target.exists():
                            shutil.rmtree(target)
                        os.rename(source, target)
                        published.append((name, batch_id))
                    except OSError as exc:
                        self.failure = self.failure or SinkError(f"cannot publish {str(source)!r} to {str(target)!r}: "
                                                                 f"{exc.strerror or exc}")
                        raise self.failure from exc
        finally:
            record_published(self.data_dir, published)  # what did move, even if a later rename failed
        return len(published)

    def _staged_or_fail(self) -> dict[str, list[int]]:
        try:
            return self.staged_batches()
        except OSError as exc:
            root = store.staging_dir(self.data_dir, "enriched").parent
            self.failure = self.failure or SinkError(f"cannot list staged sink batches under {str(root)!r}: "
                                                     f"{exc.strerror or exc}")
            raise self.failure from exc

    def discard_uncommitted(self, last_committed: int) -> int:
        dropped = 0
        for name, ids in self.staged_batches().items():
            for batch_id in ids:
                if batch_id > last_committed:
                    shutil.rmtree(store.staging_dir(self.data_dir, name) / store.batch_folder(batch_id), ignore_errors=True)
                    dropped += 1
        return dropped

    def drop_published_after(self, batch_id: int) -> int:
        """Remove published batches after ``batch_id`` (restoring a savepoint re-runs them),
        and their manifest lines. Called only while the job is stopped."""
        dropped = 0
        for name in SCHEMAS:
            root = store.sink_dir(self.data_dir, name)
            for folder in root.glob("batch=*") if root.exists() else []:
                if int(folder.name.split("=", 1)[1]) > batch_id:
                    shutil.rmtree(folder)
                    dropped += 1
        prune_manifest(self.data_dir, batch_id)
        return dropped


# ------------------------------------------------------------------------ the manifest


def summarize_table(table: pa.Table, sink: str) -> dict:
    """What the manifest records of a sink file's rows: ``rows, min_ms, max_ms`` (the sink's
    time column, epoch ms; None without rows) and, for a sink with a group column, ``groups``
    (rows per non-null value)."""
    times = table[SINK_TIME[sink]].cast(pa.timestamp("ms", tz="UTC"), safe=False).cast(pa.int64())
    bounds = pc.min_max(times)
    facts = {"rows": table.num_rows, "min_ms": bounds["min"].as_py(), "max_ms": bounds["max"].as_py()}
    if sink in SINK_GROUP:
        counts = pc.value_counts(table[SINK_GROUP[sink]]).to_pylist()
        facts["groups"] = {row["values"]: row["counts"] for row in counts if row["values"] is not None}
    return facts


def describe_file(path: Path, sink: str, batch_id: int) -> dict:
    """The manifest line of one published sink file (reads only its time and group columns)."""
    path = Path(path)
    info = path.stat()
    columns = [SINK_TIME[sink]] + ([SINK_GROUP[sink]] if sink in SINK_GROUP else [])
    facts = summarize_table(pq.read_table(path, columns=columns), sink)
    return {"sink": sink, "batch_id": int(batch_id), "file": path.name, "size": info.st_size,
            "mtime_ns": info.st_mtime_ns, **facts}


def record_published(data_dir: Path, published: Iterable[tuple[str, int]]) -> int:
    """Append the manifest lines of the files in these published ``(sink, batch id)`` folders,
    with one ``write``; returns the lines written. A failure is logged, not raised: the
    console then reads those files itself."""
    lines = []
    try:
        for sink, batch_id in published:
            folder = store.sink_dir(data_dir, sink) / store.batch_folder(batch_id)
            for path in sorted(folder.glob("*.parquet")):
                lines.append(json.dumps(describe_file(path, sink, batch_id), separators=(",", ":")) + "\n")
        if lines:
            _append_lines(store.sink_manifest_path(data_dir), "".join(lines).encode())
    except (OSError, pa.ArrowException) as exc:
        log.warning("cannot record published sink files in %s (the console will read them itself): %s",
                    store.sink_manifest_path(data_dir), exc)
        return 0
    return len(lines)


def prune_manifest(data_dir: Path, last_batch_id: int) -> None:
    """Rewrite the manifest without lines of batches after ``last_batch_id`` (nor torn lines),
    atomically. A failure is logged: readers ignore lines of files that no longer exist."""
    path = store.sink_manifest_path(data_dir)
    tmp = path.with_name(path.name + ".tmp")
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        batches = [_batch_of_line(line) for line in lines]
        tmp.write_text("".join(line + "\n" for line, batch_id in zip(lines, batches)
                               if batch_id is not None and batch_id <= last_batch_id), encoding="utf-8")
        os.replace(tmp, path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("cannot prune the sink manifest %s after batch %d: %s", path, last_batch_id, exc)


def _batch_of_line(line: str) -> int | None:
    """The batch id of a manifest line; None for a line that does not parse (a torn write)."""
    try:
        return int(json.loads(line)["batch_id"])
    except (ValueError, KeyError, TypeError):
        return None


def _append_lines(path: Path, data: bytes) -> None:
    """Append complete lines with one ``write`` on an ``O_APPEND`` descriptor. A last line a
    crash left half-written is ended first, so it stays one unreadable line of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {str(path)!r}: {written} of {len(data)} bytes")
    finally:
        os.close(fd)


def last_committed_batch(checkpoint: Path) -> int:
    """The newest batch id in a checkpoint's commit log (-1 if none)."""
    commits = Path(checkpoint) / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=-1)
