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
from typing import Iterator

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


def _time(ms: int | None) -> int | None:
    """Epoch ms as a timestamp value; the Java model's -1 (none) becomes null."""
    return None if ms is None or ms < 0 else ms


# The union of the three sinks' columns, as Spark carries them from the executors (times as
# epoch ms). The driver adds batch_id and the write time, then splits and types per sink.
WIDE_SPARK_SCHEMA = (
    "sink string, invoice_id long, line_item_id long, user_id long, item_id long, price double, created_at long, "
    "paid_at long, user_first_name string, user_last_name string, user_email string, user_created_at long, "
    "item_name string, item_category string, item_adjective string, item_modifier string, item_price double, "
    "reason string, waited_ms long, published_at long, source_topic string, source_partition int, "
    "source_message_id string, redrive_of string, key string, payload string, error string"
)
WIDE_FIELDS = tuple(part.strip().split(" ")[0] for part in WIDE_SPARK_SCHEMA.split(","))
_WIDE_TYPES = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64()}
WIDE_ARROW_SCHEMA = pa.schema([(part.strip().split(" ")[0], _WIDE_TYPES[part.strip().split(" ")[1]])
                               for part in WIDE_SPARK_SCHEMA.split(",")])
ADDED_ON_DRIVER = ("batch_id", "enriched_at", "detected_at")


def to_wide_row(env: dict) -> dict:
    """One final envelope as a row of the wide schema (see WIDE_SPARK_SCHEMA)."""
    row = {"sink": env["sink"], "source_topic": env["topic"], "source_partition": env["partition"],
           "source_message_id": env["message_id"], "published_at": env["published_ms"]}
    if env["sink"] == "dead_letter":
        row.update(key=env["key"], payload=env["payload_text"], error=env["error"])
        return row
    order = env["record"]
    row.update(invoice_id=order["invoiceId"], line_item_id=order["lineItemId"], user_id=order["userId"],
               item_id=order["itemId"], price=order["price"], created_at=_time(order["createdAt"]),
               paid_at=_time(order["paidAt"]), waited_ms=env["waited_ms"], redrive_of=env["redrive_of"])
    if env["sink"] == "missing_state":
        row.update(item_name=order["itemName"], item_category=order["itemCategory"], reason=env["reason"])
        return row
    user, item = env["user_record"], env["item_record"]
    row.update(user_first_name=user["firstName"], user_last_name=user["lastName"], user_email=user["emailAddress"],
               user_created_at=_time(user["createdAt"]), item_name=item["name"], item_category=item["category"],
               item_adjective=item["adjective"], item_modifier=item["modifier"], item_price=item["price"])
    return row


def wide_batches(batches, unpack) -> "Iterator[pa.RecordBatch]":
    """mapInArrow function (executors): envelope batches -> wide sink-row batches."""
    for batch in batches:
        columns: dict[str, list] = {name: [] for name in WIDE_FIELDS}
        for body in batch.column("body").to_pylist():
            row = to_wide_row(unpack(body))
            for name in WIDE_FIELDS:
                columns[name].append(row.get(name))
        yield pa.RecordBatch.from_pydict(columns, schema=WIDE_ARROW_SCHEMA)


def split_wide(table: pa.Table, batch_id: int, now_ms: int) -> dict[str, pa.Table]:
    """The driver's part: one typed table per sink, with batch_id and the write time added."""
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
                column = part[field.name].cast(field.type)
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
