"""The sinks: enriched, missing_state and dead_letter, one Delta Lake table each (delta-rs).

Each sink is a Delta table under ``<data_dir>/sinks/<name>/`` (DESIGN.md §5). Its log
(``_delta_log/``) says which Parquet files make up the current table, with their row counts
and min/max column statistics, so a reader asks the log (:func:`table_files`, or DuckDB's
``delta_scan`` where its delta extension is installed) and never globs the folder: files that
compaction replaced stay on disk until vacuum removes them.

Delivery guarantee, exactly-once for every reader of the log, even right after ``kill -9``:

- ``commit_batch`` (called inside foreachBatch, on the driver) writes a batch's rows of each
  sink as one Delta commit carrying the transaction identifier ``(APP_ID, batch id)``. A
  table whose transaction version is already >= the batch id has that batch (Spark re-runs
  a batch it had not committed when the job died): it is skipped, so nothing commits twice.
  A batch with no rows for a sink makes no commit there. The sinks of a batch commit in
  parallel threads, each on its table kept loaded between batches and brought up to date
  from the log before the transaction check (bench/bench_sinks.py --compare has the figures).
- A savepoint restore to batch N (:meth:`DeltaSinks.rollback`) restores each table to its
  newest version whose transaction version is <= N, in a commit whose transaction version is
  N, so batches N+1… commit again when the job redoes them. The restore journal
  (pipeline/control/savepoints.py) makes it finish after a crash: rolling back twice is a no-op.
- :meth:`DeltaSinks.maintain` compacts small files (``optimize``) and vacuums files that no
  version within the retention needs; the job runs it on a schedule (``sinks.*`` settings),
  on its own thread: Delta's optimistic concurrency lets batches commit meanwhile. How a
  round stays bounded by what changed is in pipeline/sink_maintenance.py.

A failure to write names the path in one SinkError and is never retried: a full disk or a
read-only folder stays so.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pyarrow as pa

from pipeline import store
from pipeline.enrich.lookups import LOOKUPS
from pipeline.errors import SinkError

log = logging.getLogger(__name__)
TS = pa.timestamp("ms", tz="UTC")

_SPARK_TO_ARROW = {"string": pa.string(), "long": pa.int64(), "double": pa.float64()}
# Each lookup's columns (pipeline/enrich/lookups.py): its id on every order, the state it
# attaches to an enriched order (a time as a timestamp), and in event time the time of the
# version an order was decided with.
_ORDER_COLUMNS = [("invoice_id", pa.int64()), ("line_item_id", pa.int64()),
                  *((lookup.id_column, pa.int64()) for lookup in LOOKUPS)]
_STATE_COLUMNS = [(column, TS if field in lookup.time_fields else _SPARK_TO_ARROW[kind])
                  for lookup in LOOKUPS for field, (column, kind) in lookup.fields.items()]
_AS_OF_COLUMNS = [(lookup.as_of_column, TS) for lookup in LOOKUPS]
_SOURCE_COLUMNS = [("batch_id", pa.int64()), ("source_topic", pa.string()), ("source_partition", pa.int32()),
                   ("source_message_id", pa.string())]
# The sinks' Arrow schemas: the on-disk contract (DESIGN.md §5), which the console's DuckDB
# views derive from (app/sources.py).
SCHEMAS = {
    "enriched": pa.schema(_ORDER_COLUMNS + [
        ("price", pa.float64()), ("created_at", TS), ("paid_at", TS)] + _STATE_COLUMNS + [
        ("waited_ms", pa.int64()), ("published_at", TS), ("enriched_at", TS)] + _SOURCE_COLUMNS + [
        ("redrive_of", pa.string())] + _AS_OF_COLUMNS),
    "missing_state": pa.schema(_ORDER_COLUMNS + [
        ("item_name", pa.string()), ("item_category", pa.string()), ("price", pa.float64()),
        ("created_at", TS), ("paid_at", TS), ("reason", pa.string()), ("waited_ms", pa.int64()),
        ("published_at", TS), ("detected_at", TS)] + _SOURCE_COLUMNS + [("redrive_of", pa.string())]
        + _AS_OF_COLUMNS),
    "dead_letter": pa.schema([
        ("source_topic", pa.string()), ("source_partition", pa.int32()), ("source_message_id", pa.string()),
        ("key", pa.string()), ("payload", pa.string()), ("error", pa.string()), ("published_at", TS),
        ("detected_at", TS), ("batch_id", pa.int64())]),
}


# The column each sink is timed by (when the job committed the row), and a column whose rows
# per value the console counts (why orders went missing).
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


APP_ID = "stateful-streams"  # the Delta transaction id of the job's commits; its version is the batch id
BATCH_KEY = "pipeline_batch_id"  # commit metadata: the batch a write (or a restore) brings the table to


def open_table(path: Path, version: int | None = None):
    """The Delta table at ``path`` (at ``version``), or None if there is none yet (no folder:
    a writer then fails to create it, naming the path)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if not Path(path).is_dir():
        return None
    try:
        return DeltaTable(str(path), version=version)
    except TableNotFoundError:
        return None


def table_files(path: Path) -> list[str]:
    """The local paths of the Parquet files of a table's current version ([] without a table)."""
    table = open_table(path)
    return [] if table is None else [_local(uri) for uri in table.file_uris()]


def sink_files(data_dir: Path, sink: str) -> list[str]:
    """The current files of one of the job's sinks."""
    return table_files(store.sink_dir(data_dir, sink))


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def committed_batch(table) -> int:
    """The newest batch a table holds (its transaction version), -1 if none."""
    if table is None:
        return -1
    version = table.transaction_version(APP_ID)
    return -1 if version is None else int(version)


def _commit(batch_id: int):
    from deltalake import CommitProperties, Transaction

    return CommitProperties(app_transactions=[Transaction(APP_ID, int(batch_id))],
                            custom_metadata={BATCH_KEY: str(int(batch_id))})


def version_for_batch(table, batch_id: int) -> int | None:
    """The newest version of ``table`` whose transaction version is <= ``batch_id`` (an
    optimize or vacuum after that batch's commit counts as it), or None if every version in
    the log holds a later batch. Reads the log's commit infos newest first; when the log was
    cleaned up before the answer's own commit, the version just before the oldest commit of a
    later batch (whose files the caller checks still load)."""
    limit = 64
    while True:
        history = table.history(limit)  # newest first
        newest_unlabelled = None  # the newest optimize/vacuum version since the last labelled commit
        oldest_later = None  # the oldest commit seen of a batch after batch_id
        for commit in history:
            label = commit.get(BATCH_KEY)
            if label is None:
                if newest_unlabelled is None:
                    newest_unlabelled = commit["version"]
                continue
            if int(label) <= batch_id:
                return newest_unlabelled if newest_unlabelled is not None else commit["version"]
            newest_unlabelled, oldest_later = None, commit["version"]
        if len(history) < limit or (history and history[-1]["version"] == 0):
            oldest = history[-1]["version"] if history else 0
            return oldest_later - 1 if oldest > 0 and oldest_later is not None and oldest_later > 0 else None
        limit *= 4


COMMIT_TRIES = 5  # a batch's commit that meets a maintenance commit is tried again this many times
# A writer keeps each table loaded between batches and reads only the log entries added since
# (update_incremental: ~3 ms, where loading the table costs ~15 ms). A kept table's writes grow
# slower with the commits it has applied since it was loaded (delta-rs 1.6: about +1.4 ms per 10
# commits), so it is loaded afresh after this many versions (Delta checkpoints every 100), or
# when it was loaded this long ago.
RELOAD_AFTER_VERSIONS = 50
RELOAD_AFTER_S = 600.0


class DeltaSinks:
    """Idempotent per-batch commits to a set of Delta tables, their rollback and maintenance.

    ``commit_batch`` is called by one thread at a time (foreachBatch's); it commits the sinks of
    a batch in parallel threads (delta-rs releases the GIL while it writes), each sink still one
    commit with the batch's transaction id. ``maintain`` and ``rollback`` load their own tables,
    so they may run on other threads meanwhile."""

    def __init__(self, paths: dict[str, Path]):
        self.paths = {name: Path(path) for name, path in paths.items()}
        self.last_counts: dict[int, dict[str, int]] = {}
        self.failure: SinkError | None = None  # kept for the job's loop; commits raise at once
        self._kept: dict[str, tuple] = {}  # sink -> (DeltaTable, version when loaded, monotonic time when loaded)
        self._pool = None  # the threads that commit a batch's sinks, started on the first batch with two
        self.after_commit: list = []  # (batch_id) -> None, called after each commit_batch (SinkMaintenance)

    def commit_batch(self, tables: dict[str, pa.Table], batch_id: int) -> dict[str, int]:
        """Commit each sink's rows of this batch, once: a sink that already holds the batch
        (a re-run after a crash) is skipped. Returns the rows committed per sink. The sinks
        commit in parallel; if one fails, the others' commits stand (a re-run skips them) and
        the first failure, in sink order, is raised."""
        counts = {name: 0 for name in self.paths}
        work = [(name, path, tables[name]) for name, path in self.paths.items()
                if tables.get(name) is not None and tables[name].num_rows > 0]
        if len(work) == 1:
            name, path, table = work[0]
            counts[name] = self._commit_sink(name, path, table, batch_id)
        elif work:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=len(self.paths), thread_name_prefix="sink-commit")
            futures = [(name, self._pool.submit(self._commit_sink, name, path, table, batch_id))
                       for name, path, table in work]
            failures = []
            for name, future in futures:
                try:
                    counts[name] = future.result()
                except Exception as exc:  # every sink's commit has ended before one failure is raised
                    failures.append(exc)
            if failures:
                raise failures[0]
        self.last_counts[batch_id] = counts
        if len(self.last_counts) > 100:
            self.last_counts.pop(min(self.last_counts))
        for hook in list(self.after_commit):
            hook(batch_id)
        return counts

    def _current_table(self, name: str, path: Path):
        """The sink's table as of its newest version (None without one): the kept one brought up
        to date, or loaded afresh (see RELOAD_AFTER_VERSIONS)."""
        kept = self._kept.pop(name, None)
        if kept is not None and (path / "_delta_log").is_dir():
            table, loaded_version, loaded_at = kept
            if table.version() - loaded_version < RELOAD_AFTER_VERSIONS and time.monotonic() - loaded_at < RELOAD_AFTER_S:
                try:
                    table.update_incremental()
                    self._kept[name] = kept
                    return table
                except Exception as exc:  # noqa: BLE001 - a fresh load below says what is wrong, if anything
                    log.info("sink %s: reloading its table (%s)", name, str(exc).splitlines()[0] if str(exc) else exc)
        table = open_table(path)
        if table is not None:
            self._kept[name] = (table, table.version(), time.monotonic())
        return table

    def _commit_sink(self, name: str, path: Path, table: pa.Table, batch_id: int) -> int:
        """One sink's commit of a batch (0 rows if it already holds the batch)."""
        from deltalake import WriterProperties, write_deltalake

        for attempt in range(1, COMMIT_TRIES + 1):
            try:
                existing = self._current_table(name, path)
                if committed_batch(existing) >= batch_id:
                    log.info("sink %s already holds batch %d; not committing it again", name, batch_id)
                    return 0
                path.mkdir(parents=True, exist_ok=True)
                write_deltalake(existing if existing is not None else str(path), table, mode="append",
                                schema_mode="merge", commit_properties=_commit(batch_id),
                                writer_properties=WriterProperties(compression="ZSTD"))
                return table.num_rows
            except OSError as exc:
                self._kept.pop(name, None)
                raise SinkError(f"cannot write sink {name!r} batch {batch_id} under {str(path)!r}: "
                                f"{exc.strerror or exc}") from exc
            except Exception as exc:  # delta-rs raises its own types for I/O failures and conflicts
                self._kept.pop(name, None)  # the next attempt (or batch) loads the table afresh
                if committed_batch(open_table(path)) >= batch_id:  # a concurrent commit of this batch won
                    log.info("sink %s: batch %d was committed concurrently; not committing it again", name, batch_id)
                    return 0
                # Maintenance (compaction, vacuum, the log's retention property) commits to the same
                # table between batches; a commit that met one of those is tried again on the new version.
                if type(exc).__name__ == "CommitFailedError" and attempt < COMMIT_TRIES:
                    log.info("sink %s batch %d met a concurrent commit (%s); trying again", name, batch_id, exc)
                    time.sleep(0.05 * attempt)
                    continue
                raise SinkError(f"cannot write sink {name!r} batch {batch_id} under {str(path)!r}: "
                                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
        return 0  # not reached: the last attempt returns or raises

    def committed_batches(self) -> dict[str, int]:
        """The newest batch each table holds (-1 for none)."""
        return {name: committed_batch(open_table(path)) for name, path in self.paths.items()}

    def rollback_plan(self, batch_id: int, recorded: dict[str, int] | None = None) -> dict[str, int | None]:
        """Per table holding batches after ``batch_id``: the version to restore (None: empty
        it): the one a savepoint ``recorded`` (the version vacuum keeps for it; a later optimize
        also holds only batches up to ``batch_id``, but its files are not kept), else the newest
        holding batches up to ``batch_id``. Raises SinkError, changing nothing, if a version's
        files are gone (vacuumed) or its log entry was cleaned up."""
        plan = {}
        for name, path in self.paths.items():
            table = open_table(path)
            if committed_batch(table) <= batch_id:
                continue
            version = (recorded or {}).get(name)
            version = version if isinstance(version, int) else version_for_batch(table, batch_id)
            if version is not None:
                missing = _missing_files(path, version)
                if missing:
                    raise SinkError(f"sink {name!r} no longer has the files of batch {batch_id} "
                                    f"(Delta version {version}; vacuum removed {missing[0]!r}"
                                    f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''})")
            elif _oldest_version(table) > 0:
                raise SinkError(f"sink {name!r} no longer has the log of batch {batch_id} (its oldest "
                                f"Delta version is {_oldest_version(table)})")
            plan[name] = version
        return plan

    def rollback(self, batch_id: int, recorded: dict[str, int] | None = None) -> dict[str, int | None]:
        """Take every table back to ``batch_id``: each holding later batches is restored to the
        version :meth:`rollback_plan` gives, in a commit whose transaction version is
        ``batch_id``, so the batches after it commit again when the job redoes them. Idempotent."""
        plan = self.rollback_plan(batch_id, recorded)
        for name, version in plan.items():
            table = open_table(self.paths[name])
            if version is None:
                table.delete(commit_properties=_commit(batch_id))
            else:
                table.restore(version, commit_properties=_commit(batch_id))
            log.warning("sink %s taken back to batch %d (Delta version %s)", name, batch_id, version)
        return plan

    def recover(self, last_committed: int) -> dict[str, int | None]:
        """At start: a table holds at most the batch after the checkpoint's last committed one
        (committed to the sink, not yet by Spark: the re-run skips it). One holding more has
        batches a replaced checkpoint no longer counts: take it back, so they commit once."""
        ahead = {name: batch for name, batch in self.committed_batches().items() if batch > last_committed + 1}
        if not ahead:
            return {}
        log.warning("sinks %s hold batches after the checkpoint's last committed batch %d; taking them back",
                    ", ".join(sorted(ahead)), last_committed)
        return self.rollback(last_committed)

    def maintain(self, compact: bool = True, retention_s: float | None = None,
                 log_retention_s: float | None = None, keep_versions: dict[str, list[int]] | None = None) -> dict[str, dict]:
        """One round on each table (pipeline/sink_maintenance.py :func:`maintain_table`, each
        with its sink's ``keep_versions``). Safe while batches commit, and after a kill at any point."""
        from pipeline.sink_maintenance import maintain_table

        done = {name: maintain_table(path, compact=compact, retention_s=retention_s, log_retention_s=log_retention_s,
                                     keep_versions=(keep_versions or {}).get(name))
                for name, path in self.paths.items()}
        return {name: facts for name, facts in done.items() if facts is not None}  # None: no table yet


def _missing_files(path: Path, version: int) -> list[str]:
    try:
        table = open_table(path, version)
    except Exception as exc:
        return [f"the log of version {version} ({exc})"]
    return [uri for uri in map(_local, table.file_uris()) if not os.path.exists(uri)]


def _oldest_version(table) -> int:
    history = table.history()
    return min((commit["version"] for commit in history), default=0)


class SinkWriter(DeltaSinks):
    """The job's three sinks (see the module docstring)."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        super().__init__({name: store.sink_dir(self.data_dir, name) for name in SCHEMAS})

    def write_wide(self, table: pa.Table, batch_id: int) -> dict[str, int]:
        """foreachBatch body: split the batch's wide rows per sink and commit them."""
        return self.commit_batch(split_wide(table, batch_id, int(time.time() * 1000)), batch_id)


def last_committed_batch(checkpoint: Path) -> int:
    """The newest batch id in a checkpoint's commit log (-1 if none)."""
    commits = Path(checkpoint) / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    return max(ids, default=-1)


# Maintenance has its own module (it imports this one); its names stay importable from here.
_MAINTENANCE_NAMES = ("SinkMaintenance", "oldest_savepoint_age_s", "vacuum_retention_s", "log_retention_s")


def __getattr__(name: str):
    if name in _MAINTENANCE_NAMES:
        from pipeline import sink_maintenance

        return getattr(sink_maintenance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
