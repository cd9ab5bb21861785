"""Sink maintenance: compaction, vacuum and log cleanup of the Delta sinks, on a schedule.

:func:`maintain_table` is one round on one table (:meth:`pipeline.sinks.DeltaSinks.maintain`
runs it on each sink); :class:`SinkMaintenance` is the job's thread that runs a round every
``sinks.compact_interval``, or sooner once ``sinks.compact_after_batches`` batches have committed
since the last round (so the small files a reader opens are bounded by batches, whatever the
trigger: bench_month's 15 batches/s left 900 of them between two 60 s rounds). A round costs what
changed since the last one, not the table's history:

- **Compaction in two tiers.** Delta's ``optimize`` rewrites every file under its target size,
  so one target would rewrite the whole table (up to the target) on every round: at 20,000
  batches of bench/bench_month.py that was an 81 MB file rewritten each minute, 15 s a round at
  load 12-18. Each round compacts only the files under :data:`SMALL_FILE_BYTES` (the per-batch
  files, and the one partial small-tier file); only when :data:`MERGE_AFTER_FILES` files lie
  between that and :data:`TARGET_FILE_BYTES` are those merged, at most one target's worth of
  bytes. Files past the target are never read again, and the files a reader opens stay about
  ``table bytes / target + MERGE_AFTER_FILES``.
- **The log** (``_delta_log/``, one JSON per commit) keeps :data:`LOG_RETENTION_MIN_S` of commits,
  or back to the oldest savepoint (a restore reads its version's commit): at four commits a
  second that is ~2,400 files, where an hour kept ~14,000 (120 MB per sink).
- **Vacuum** removes the files that no version within the retention and no savepoint needs: each
  savepoint records its sinks' Delta versions when taken, and vacuum keeps those versions' files
  (``keep_versions``), so the retention need not reach back to a savepoint days old. Each
  checkpoint of the log carries a tombstone per file replaced within the retention: at a 1 s
  trigger a week's retention was ~600,000 per sink, in every checkpoint a reader loads. Vacuum
  lists the table's folder (``full``), so it also removes what a killed batch or optimize wrote
  and no commit names, and a savepoint's files once the savepoint is gone. A round reads the
  savepoints' versions after its compaction and vacuums under :func:`savepoint_versions_lock`,
  which a take holds while it records them: a savepoint taken mid-round (its version's files just
  replaced by the compaction) is never vacuumed away (the chaos test once lost one so).

Safe while batches commit (Delta's optimistic concurrency; a batch's commit that meets a round's
commit is tried again, pipeline/sinks.py) and after a kill at any point: files a killed optimize
wrote are in no commit, and a later vacuum removes them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from datetime import datetime
from pathlib import Path

from pipeline import store

log = logging.getLogger(__name__)

SMALL_FILE_BYTES = 1 << 20  # files under this are compacted every round (bytes of input files)
TARGET_FILE_BYTES = 32 << 20  # files under this are merged once MERGE_AFTER_FILES of them wait
MERGE_AFTER_FILES = 8
# A reader loads the newest checkpoint and the commits after it, all written within seconds; ten
# minutes of commits is ample for the slowest reader and bounds the log by time, not batches.
LOG_RETENTION_MIN_S = 600.0


def _writer_properties():
    from deltalake import WriterProperties

    return WriterProperties(compression="ZSTD")


def _round_facts(metrics: dict) -> dict:
    """What one ``optimize`` did: files removed and added, and the input bytes it read."""
    removed = metrics.get("filesRemoved") or "{}"
    removed = json.loads(removed) if isinstance(removed, str) else removed
    return {"files_removed": metrics.get("numFilesRemoved", 0), "files_added": metrics.get("numFilesAdded", 0),
            "bytes_rewritten": int(removed.get("totalSize") or 0)}


def compact_table(table, small_bytes: int = SMALL_FILE_BYTES, target_bytes: int = TARGET_FILE_BYTES,
                  merge_after: int = MERGE_AFTER_FILES) -> dict:
    """Compact the table's small files; merge the middle tier once ``merge_after`` files wait in
    it. Returns ``files_removed``, ``files_added``, ``bytes_rewritten`` (input bytes read) and
    ``merged`` (whether the middle tier was merged)."""
    facts = _round_facts(table.optimize.compact(target_size=small_bytes, writer_properties=_writer_properties()))
    facts["merged"] = False
    if facts["files_removed"]:
        table.update_incremental()
    sizes = table.get_add_actions(flatten=True).column("size_bytes").to_pylist()
    if sum(1 for size in sizes if size < target_bytes) >= merge_after:
        merged = _round_facts(table.optimize.compact(target_size=target_bytes, writer_properties=_writer_properties()))
        facts = {key: facts[key] + merged[key] for key in merged} | {"merged": True}
    return facts


def maintain_table(path: Path, compact: bool = True, retention_s: float | None = None,
                   log_retention_s: float | None = None, keep_versions: list[int] | None = None) -> dict | None:
    """One round on the table at ``path`` (None without a table): compact (:func:`compact_table`),
    then, with ``retention_s``, vacuum what no version within it and none of ``keep_versions``
    needs, and keep the log ``log_retention_s`` (default ``retention_s``; at least
    :data:`LOG_RETENTION_MIN_S`)."""
    from pipeline.sinks import open_table

    path = Path(path)
    table = open_table(path)
    if table is None:
        return None
    facts: dict = {}
    if compact:
        facts.update(compact_table(table))
    if retention_s is not None:
        hours = max(0, math.ceil(retention_s / 3600))
        table = open_table(path)
        vacuumed = set()
        # First the files the log remembers as replaced; then the folder listed (full), for the
        # files no commit names: what a killed batch or optimize wrote, and a deleted savepoint's
        # once their tombstones expired. Never those under an hour old: a batch's files are
        # written before its commit names them.
        for full, older_than_hours in ((False, hours), (True, max(1, hours))):
            options = {"retention_hours": older_than_hours, "enforce_retention_duration": False, "full": full,
                       "keep_versions": sorted(set(keep_versions)) if keep_versions else None}
            # vacuum lists every file the log still remembers as removed, those an earlier round
            # deleted too: only the ones still on disk are this round's
            vacuumed.update(name for name in table.vacuum(dry_run=True, **options) if (path / name).exists())
            table.vacuum(dry_run=False, **options)
            table = open_table(path)
        facts["files_vacuumed"] = len(vacuumed)
        # One JSON per commit would otherwise pile up for Delta's default 30 days, and each
        # checkpoint would carry a tombstone per replaced file for Delta's default week; the
        # checkpoint keeps the transaction versions.
        wanted_log_s = retention_s if log_retention_s is None else log_retention_s
        log_minutes = math.ceil(max(LOG_RETENTION_MIN_S, wanted_log_s) / 60)
        # This round is the log's only cleaner: a writer's commit that writes a checkpoint would
        # clean up the same files at the same moment, and one of the two then fails on a file
        # the other deleted (bench_month's writer died so at batch 34,646).
        wanted = {"delta.logRetentionDuration": f"interval {log_minutes} minutes",
                  "delta.deletedFileRetentionDuration": f"interval {max(1, hours)} hours",
                  "delta.enableExpiredLogCleanup": "false"}
        configured = table.metadata().configuration
        if any(configured.get(key) != value for key, value in wanted.items()):
            table.alter.set_table_properties(wanted)
            table = open_table(path)
        table.create_checkpoint()
        _clean_up_log(table)
    return facts


def _clean_up_log(table) -> None:
    """Drop the log files past the log's retention. Before a table has the round's properties,
    a writer's commit that writes a checkpoint cleans up the same files (delta-rs's post-commit
    hook): one it deleted first is not there to delete, which is no failure."""
    try:
        table.cleanup_metadata()
    except Exception as exc:  # delta-rs raises its own error types
        if "not found" not in str(exc).lower():
            raise
        log.info("a log file was cleaned up by another writer meanwhile: %s", str(exc).splitlines()[0])


def _savepoint_files(data_dir: Path) -> list[dict]:
    """Each savepoint's ``savepoint.json`` under ``data_dir`` (one unreadable is skipped)."""
    root = store.savepoints_dir(data_dir)
    found = []
    for meta in root.glob("*/savepoint.json") if root.is_dir() else []:
        try:
            found.append(json.loads(meta.read_text()))
        except (OSError, ValueError):
            continue
    return [meta for meta in found if isinstance(meta, dict)]


def oldest_savepoint_age_s(data_dir: Path, now_s: float | None = None, without_versions: bool = False) -> float | None:
    """Seconds since the oldest savepoint was taken (None without savepoints); read from the
    savepoints' own ``savepoint.json``, as pipeline/control/savepoints.py writes it. With
    ``without_versions``, only those that do not record their sinks' versions (taken before they did)."""
    taken = []
    for meta in _savepoint_files(data_dir):
        if without_versions and "sink_versions" in meta:
            continue
        try:
            taken.append(datetime.fromisoformat(meta["taken_at"].replace("Z", "+00:00")).timestamp())
        except (AttributeError, ValueError, KeyError, TypeError):
            continue
    if not taken:
        return None
    return max(0.0, (time.time() if now_s is None else now_s) - min(taken))


def vacuum_retention_s(data_dir: Path, configured_s: float, now_s: float | None = None) -> float:
    """The retention a vacuum uses: the configured one, or longer, back to the oldest savepoint
    that does not record its sinks' versions (plus an hour: vacuum counts whole hours), so every
    savepoint stays restorable; one that records them is kept by :func:`savepoint_versions`."""
    age = oldest_savepoint_age_s(data_dir, now_s, without_versions=True)
    return configured_s if age is None else max(configured_s, age + 3600)


def versions_for_batch(paths: dict[str, Path], batch_id: int) -> dict[str, int]:
    """Each table's Delta version holding the batches up to ``batch_id`` (one with none is left
    out): what a savepoint at ``batch_id`` restores to, recorded when it is taken."""
    from pipeline.sinks import open_table, version_for_batch

    versions = {}
    for name, path in paths.items():
        table = open_table(path)
        version = None if table is None else version_for_batch(table, batch_id)
        if version is not None:
            versions[name] = version
    return versions


def savepoint_versions(data_dir: Path) -> dict[str, list[int]]:
    """Per sink, the Delta versions the savepoints under ``data_dir`` restore to (from each
    ``savepoint.json``'s ``sink_versions``, as pipeline/control/savepoints.py writes it)."""
    kept: dict[str, set[int]] = {}
    for meta in _savepoint_files(data_dir):
        for sink, version in (meta.get("sink_versions") or {}).items():
            if isinstance(version, int):
                kept.setdefault(sink, set()).add(version)
    return {sink: sorted(versions) for sink, versions in kept.items()}


@contextlib.contextmanager
def savepoint_versions_lock(data_dir: Path):
    """Held by a savepoint take from reading its sinks' versions until its ``savepoint.json`` is in
    place, and by a maintenance round from reading every savepoint's versions until its vacuum
    ends, so no vacuum misses a savepoint taken meanwhile (an ``flock``: the take and the job are
    different processes)."""
    from pipeline.control.lock import file_lock  # lazily: pipeline.control imports this module

    path = store.savepoint_versions_lock_path(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        yield


def log_retention_s(data_dir: Path, now_s: float | None = None) -> float:
    """How long the log is kept: back to the oldest savepoint (and an hour), else the minimum."""
    age = oldest_savepoint_age_s(data_dir, now_s)
    return LOG_RETENTION_MIN_S if age is None else max(LOG_RETENTION_MIN_S, age + 3600)


class SinkMaintenance:
    """The job's background thread that compacts and vacuums the sinks every ``interval_s`` (0:
    not by time), and as soon as ``after_batches`` batches have committed through ``writer``
    since the last round began (0: not by count), between (and during) batches: Delta's optimistic concurrency lets a batch commit meanwhile;
    each round first removes metrics day files past their retention (``prune``). Each round is a
    ``sinks_maintained`` event with what it did; a failure is logged and recorded as an event,
    and the next round tries again. ``writer`` is a :class:`pipeline.sinks.DeltaSinks`."""

    def __init__(self, writer, data_dir: Path, interval_s: float, retention_s: float, record=None, prune=None,
                 after_batches: int = 0):
        self.prune = prune  # () -> list of removed metrics files, run after the sinks each round
        self.writer, self.data_dir = writer, Path(data_dir)
        self.interval_s, self.retention_s, self.after_batches = interval_s, retention_s, after_batches
        self.record = record  # (kind, message, **details) -> None, the job's event recorder
        self._stop, self._due = threading.Event(), threading.Event()
        self._committed = 0  # batches committed since the last round began
        self._thread = threading.Thread(target=self._loop, name="sink-maintenance", daemon=True)

    @classmethod
    def from_settings(cls, writer, data_dir: Path, settings, record=None, prune=None) -> "SinkMaintenance":
        """The thread as the ``sinks.*`` settings configure it (not started)."""
        return cls(writer, data_dir, settings["sinks.compact_interval"], settings["sinks.vacuum_retention"], record,
                   prune, after_batches=settings["sinks.compact_after_batches"])

    def start(self) -> "SinkMaintenance":
        if self.after_batches > 0:
            self.writer.after_commit.append(self._batch_committed)
        if self.interval_s > 0 or self.after_batches > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._due.set()
        if self._batch_committed in self.writer.after_commit:
            self.writer.after_commit.remove(self._batch_committed)
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _batch_committed(self, batch_id: int) -> None:  # on the committing thread: only counts
        self._committed += 1
        if self._committed >= self.after_batches:
            self._due.set()

    def _loop(self) -> None:
        while True:
            self._due.wait(self.interval_s if self.interval_s > 0 else None)
            if self._stop.is_set():
                return
            self._due.clear()
            self._committed = 0
            self.run_once()

    def run_once(self) -> dict:
        if self.prune is not None:
            try:
                removed = self.prune()
                if removed and self.record:
                    self.record("metrics_pruned", f"removed {len(removed)} metrics day files past the retention",
                                files=[str(path) for path in removed][:50])
            except OSError as exc:
                log.warning("cannot remove old metrics files (the next round tries again): %s", exc)
        started = time.monotonic()
        retention = vacuum_retention_s(self.data_dir, self.retention_s)
        try:
            compacted = self.writer.maintain(compact=True)  # batches and savepoint takes go on meanwhile
            with savepoint_versions_lock(self.data_dir):  # the log only as far back as a savepoint needs it
                vacuumed = self.writer.maintain(compact=False, retention_s=retention,
                                                log_retention_s=log_retention_s(self.data_dir),
                                                keep_versions=savepoint_versions(self.data_dir))
            done = {name: {**compacted.get(name, {}), **facts} for name, facts in vacuumed.items()}
        except Exception as exc:  # never fatal: the batches go on, the next round tries again
            log.warning("sink compaction or vacuum failed (the next round tries again): %s", exc)
            if self.record:
                self.record("sinks_maintenance_failed", f"sink compaction or vacuum failed: {str(exc).splitlines()[0]}",
                            error=str(exc)[:500])
            return {}
        took = time.monotonic() - started
        removed = sum(facts.get("files_removed", 0) for facts in done.values())
        vacuumed = sum(facts.get("files_vacuumed", 0) for facts in done.values())
        if self.record:  # every round, so the console can say when maintenance last ran (app/storage.py)
            self.record("sinks_maintained", f"sinks compacted ({removed} files into "
                        f"{sum(facts.get('files_added', 0) for facts in done.values())}) and vacuumed ({vacuumed} "
                        f"files) in {took:.1f}s", sinks=done, retention_s=retention, duration_s=round(took, 3))
        return done
