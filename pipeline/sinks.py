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
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
import pyarrow as pa
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
        ("redrive_of", pa.string())]),
    "missing_state": pa.schema(_ORDER_COLUMNS + [
        ("item_name", pa.string()), ("item_category", pa.string()), ("price", pa.float64()),
        ("created_at", TS), ("paid_at", TS), ("reason", pa.string()), ("waited_ms", pa.int64()),
        ("published_at", TS), ("detected_at", TS)] + _SOURCE_COLUMNS + [("redrive_of", pa.string())]),
    "dead_letter": pa.schema([
        ("source_topic", pa.string()), ("source_partition", pa.int32()), ("source_message_id", pa.string()),
        ("key", pa.string()), ("payload", pa.string()), ("error", pa.string()), ("published_at", TS),
        ("detected_at", TS), ("batch_id", pa.int64())]),
}


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
                column = pa.array([batch_id] * part.num_rows, pa.int64())
            elif field.name in ("enriched_at", "detected_at"):
                column = pa.array([now_ms] * part.num_rows, pa.int64()).cast(field.type)
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

    def stage_batch(self, tables: dict[str, pa.Table], batch_id: int) -> dict[str, int]:
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
        """Move every staged batch <= last_committed into the sinks; returns folders moved."""
        moved = 0
        for name, ids in self.staged_batches().items():
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
                    moved += 1
                except OSError as exc:
                    raise SinkError(f"cannot publish {str(source)!r} to {str(target)!r}: {exc.strerror or exc}") from exc
        return moved

    def discard_uncommitted(self, last_committed: int) -> int:
        dropped = 0
        for name, ids in self.staged_batches().items():
            for batch_id in ids:
                if batch_id > last_committed:
                    shutil.rmtree(store.staging_dir(self.data_dir, name) / store.batch_folder(batch_id), ignore_errors=True)
                    dropped += 1
        return dropped

    def drop_published_after(self, batch_id: int) -> int:
        """Remove published batches after ``batch_id`` (restoring a savepoint re-runs them)."""
        dropped = 0
        for name in SCHEMAS:
            root = store.sink_dir(self.data_dir, name)
            for folder in root.glob("batch=*") if root.exists() else []:
                if int(folder.name.split("=", 1)[1]) > batch_id:
                    shutil.rmtree(folder)
                    dropped += 1
        return dropped


def last_committed_batch(checkpoint: Path) -> int:
    """The newest batch id in a checkpoint's commit log (-1 if none)."""
    commits = Path(checkpoint) / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=-1)
