"""The disk, on one page: what each part of the data dir holds (files and bytes of each sink,
metrics stream, the checkpoint, the savepoints) and when sink maintenance last ran.

- :func:`compute_storage` turns a listing of the data dir's files into one row per part, and
  :func:`summarize_maintenance` turns the maintenance events into when compaction, vacuum and
  the metrics retention last ran: both pure, over plain values.
- :func:`load_storage` and :func:`load_maintenance` are the Storage page's queries
  (``(connection, data_dir) -> DataFrame``): one walk of the data dir, the sinks' current
  files from their Delta logs (never the data files), and the newest events.

A sink's files on disk are its current version's files (``live``), the files compaction or a
restore replaced, which stay until vacuum removes them past ``sinks.vacuum_retention``, and
its Delta log (``log_files``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Iterable

import pandas as pd

from app.metric_queries import load_events
from app.sources import Connection
from pipeline import store
from pipeline.sinks import table_files

MAINTENANCE_KINDS = ("sinks_maintained", "sinks_maintenance_failed", "metrics_pruned")
STORAGE_COLUMNS = ["part", "kind", "files", "bytes", "live_files", "live_bytes", "log_files", "detail"]
MAINTENANCE_COLUMNS = ["task", "last_run", "last_change", "change", "failed_at", "failure"]
# Which part a top-level folder of the data dir is (pipeline/store.py lays them out).
TOP_PARTS = {"checkpoint": ("checkpoint", "checkpoint"), "broker": ("broker", "broker"),
             "sql": ("SQL pipelines", "sql"), "source-stats": ("source stats", "other"),
             "control": ("control", "other"), "scratch": ("scratch", "other")}


def part_of(relative: str) -> tuple[str, str]:
    """``(part, kind)`` of a file, from its path under the data dir (``/``-separated)."""
    head, _, rest = relative.partition("/")
    if head == "sinks" and rest:
        return f"sink {rest.split('/')[0]}", "sink"
    if head == "metrics" and rest:
        return f"metrics {rest.split('/')[0]}", "metrics"
    if head == "savepoints":
        return "savepoints", "savepoints"
    return TOP_PARTS.get(head, ("other", "other"))


def compute_storage(files: Iterable[tuple[str, int]], live: dict[str, set[str]]) -> pd.DataFrame:
    """One row per part of the data dir, sinks first, then metrics, checkpoint, savepoints, the rest.

    ``files``: ``(path relative to the data dir, "/"-separated; bytes)`` of every file under
    it; ``live``: per sink, the relative paths of the files its current version holds.
    Columns ``part, kind, files, bytes``, and for a sink ``live_files, live_bytes`` (its current
    version) and ``log_files`` (its Delta log); ``detail`` says more in words (the savepoints
    counted, a metrics stream's oldest and newest day).
    """
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: {"files": 0, "bytes": 0, "live_files": 0,
                                                              "live_bytes": 0, "log_files": 0, "names": set()})
    for relative, size in files:
        part, kind = part_of(relative)
        entry = totals[(part, kind)]
        entry["files"] += 1
        entry["bytes"] += int(size)
        pieces = relative.split("/")
        if kind == "sink":
            sink = pieces[1]
            if len(pieces) > 2 and pieces[2] == "_delta_log":
                entry["log_files"] += 1
            elif relative in live.get(sink, set()):
                entry["live_files"] += 1
                entry["live_bytes"] += int(size)
        elif kind == "metrics" and pieces[-1].endswith(".jsonl"):
            entry["names"].add(pieces[-1].removesuffix(".jsonl"))
        elif kind == "savepoints" and len(pieces) > 2:
            entry["names"].add(pieces[1])
    for sink in live:  # a sink with no files yet is still a row
        totals[(f"sink {sink}", "sink")]
    order = {"sink": 0, "metrics": 1, "checkpoint": 2, "savepoints": 3, "sql": 4, "broker": 5, "other": 6}
    rows = []
    for (part, kind), entry in sorted(totals.items(), key=lambda item: (order[item[0][1]], item[0][0])):
        names = sorted(entry["names"])
        if kind == "metrics":
            detail = f"{len(names)} day files, {names[0]} to {names[-1]}" if names else "no day files"
        elif kind == "savepoints":
            detail = f"{len(names)} savepoint{'s' if len(names) != 1 else ''}"
        elif kind == "sink":
            replaced = entry["files"] - entry["live_files"] - entry["log_files"]
            detail = f"{replaced} replaced file{'s' if replaced != 1 else ''} wait for vacuum"
        else:
            detail = ""
        sink = kind == "sink"
        rows.append({"part": part, "kind": kind, "files": entry["files"], "bytes": entry["bytes"],
                     "live_files": entry["live_files"] if sink else None, "live_bytes": entry["live_bytes"] if sink else None,
                     "log_files": entry["log_files"] if sink else None, "detail": detail})
    frame = pd.DataFrame(rows, columns=STORAGE_COLUMNS)
    return frame.astype({"files": "int64", "bytes": "int64", "live_files": "Int64", "live_bytes": "Int64",
                         "log_files": "Int64"})


def summarize_maintenance(events: pd.DataFrame) -> pd.DataFrame:
    """When compaction, vacuum and the metrics retention last ran, from the newest events first
    (``ts_ms, time, kind, message, details`` as :func:`app.metric_queries.load_events` gives).

    One row per task: ``last_run`` (the newest round), ``last_change`` and ``change`` (the
    newest round that merged, removed or pruned something, and what), ``failed_at`` and
    ``failure`` (the newest failed round after the last good one). Times are naive UTC; None
    where it never happened.
    """
    def sink_sum(details: dict, key: str) -> int:
        return sum(int((facts or {}).get(key) or 0) for facts in (details.get("sinks") or {}).values())

    tasks = {
        "compaction": lambda d: sink_sum(d, "files_removed") and
        f"{sink_sum(d, 'files_removed')} files into {sink_sum(d, 'files_added')}",
        "vacuum": lambda d: sink_sum(d, "files_vacuumed") and f"{sink_sum(d, 'files_vacuumed')} files removed",
    }
    ordered = events.sort_values("ts_ms", ascending=False) if not events.empty else events
    rows = []
    for task, change_of in tasks.items():
        row = {"task": task, "last_run": None, "last_change": None, "change": None, "failed_at": None, "failure": None}
        for event in ordered.itertuples():
            details = event.details if isinstance(event.details, dict) else {}
            if event.kind == "sinks_maintained":
                row["last_run"] = row["last_run"] or event.time
                change = change_of(details)
                if change and row["last_change"] is None:
                    row["last_change"], row["change"] = event.time, change
            elif event.kind == "sinks_maintenance_failed" and row["last_run"] is None and row["failed_at"] is None:
                row["failed_at"], row["failure"] = event.time, event.message
        rows.append(row)
    pruned = ordered[ordered["kind"] == "metrics_pruned"] if not ordered.empty else ordered
    newest = pruned.iloc[0] if not pruned.empty else None
    # The retention runs first in every maintenance round; only a round that removed files says so.
    rows.append({"task": "metrics retention", "last_run": rows[0]["last_run"],
                 "last_change": None if newest is None else newest["time"],
                 "change": None if newest is None else newest["message"], "failed_at": None, "failure": None})
    return pd.DataFrame(rows, columns=MAINTENANCE_COLUMNS)


# -------------------------------------------------------------------------- the page's queries


def list_files(data_dir: Path) -> list[tuple[str, int]]:
    """Every file under the data dir: ``(relative path, bytes)``; a file removed meanwhile is skipped."""
    root = Path(data_dir)
    listing = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            listing.append((os.path.relpath(path, root).replace(os.sep, "/"), size))
    return listing


def load_storage(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """:func:`compute_storage` of the data dir as it is now."""
    root = Path(data_dir)
    live = {}
    for sink in store.SINKS:
        files = table_files(store.sink_dir(root, sink))
        live[sink] = {os.path.relpath(path, root).replace(os.sep, "/") for path in files}
    return compute_storage(list_files(root), live)


def load_maintenance(connection: Connection, data_dir: Path, limit: int = 5000) -> pd.DataFrame:
    """:func:`summarize_maintenance` of the newest ``limit`` maintenance events."""
    return summarize_maintenance(load_events(connection, data_dir, kinds=MAINTENANCE_KINDS, limit=limit))
