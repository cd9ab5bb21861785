"""DuckDB queries over the SQL pipelines' folders: their list, progress, and current results.

Plain ``(connection, data_dir, …) -> DataFrame`` functions (and a list of pipelines). A
pipeline's folder is ``<data_dir>/sql/<name>/`` (pipeline/store.py); its ``result`` sink (in a
statement set, one ``result_<target>`` sink per INSERT) holds one change row per key and batch
(pipeline/sql/sink.py), so the current result is the latest row per ``_key`` when that row is
an upsert. The sinks are Delta tables: their current files
come from the Delta log (:func:`pipeline.sinks.table_files`), never from a glob.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from pipeline import store
from pipeline.sinks import table_files


def list_pipelines(data_dir: Path) -> list[dict]:
    """Each pipeline's ``pipeline.json`` (name, kind, statements, sources, target…), by name."""
    root = store.sql_pipelines_dir(data_dir)
    found = []
    for info in sorted(root.glob("*/pipeline.json")) if root.is_dir() else []:
        try:
            found.append(json.loads(info.read_text()))
        except (OSError, ValueError):
            continue
    return found


def _glob(data_dir: Path, name: str, sink: str) -> list[str] | None:
    """The current files of one of the pipeline's Delta tables (DuckDB's ``read_parquet`` takes
    the list), or None if it has none."""
    return table_files(store.sql_dir(data_dir, name) / "sinks" / sink) or None


def current_result(con, data_dir: Path, name: str, columns: list[str] | None = None,
                   sink: str = "result") -> pd.DataFrame:
    """The pipeline's current result table (``sink``: a statement set's INSERT has its own, named
    in ``pipeline.json``): the latest row per key, deleted keys left out."""
    pattern = _glob(data_dir, name, sink)
    if pattern is None:
        return pd.DataFrame(columns=columns or [])
    frame = con.execute(
        "SELECT * EXCLUDE (_op, _batch_id, _key, _changed_at) FROM ("
        " SELECT * FROM read_parquet(?, union_by_name = true, hive_partitioning = false)"
        " QUALIFY row_number() OVER (PARTITION BY _key ORDER BY _batch_id DESC) = 1)"
        " WHERE _op = 'upsert' ORDER BY _key", [pattern]).df()
    return frame[columns] if columns else frame


def result_changes(con, data_dir: Path, name: str, sink: str = "result") -> pd.DataFrame:
    """Every committed change row of a result table, oldest first (what the target topic received)."""
    pattern = _glob(data_dir, name, sink)
    if pattern is None:
        return pd.DataFrame()
    return con.execute("SELECT * FROM read_parquet(?, union_by_name = true, hive_partitioning = false) ORDER BY _batch_id, _key", [pattern]).df()


def dead_letters(con, data_dir: Path, name: str) -> pd.DataFrame:
    pattern = _glob(data_dir, name, "dead_letter")
    if pattern is None:
        return pd.DataFrame(columns=["source_topic", "key", "payload", "error", "detected_at"])
    return con.execute("SELECT source_topic, key, payload, error, detected_at FROM read_parquet(?, hive_partitioning = false) "
                       "ORDER BY batch_id, source_message_id", [pattern]).df()


def pipeline_totals(con, data_dir: Path, name: str) -> dict:
    """Rows in and out, dead letters, batches and the latest lag, from its progress rows."""
    folder = store.sql_dir(data_dir, name) / "metrics" / "progress"
    empty = {"batches": 0, "rows_in": 0, "rows_out": 0, "dead_letters": 0, "lag": None, "last_ts_ms": None}
    if not any(folder.glob("*.jsonl")):
        return empty
    row = con.execute(
        "SELECT count(*) AS batches, coalesce(sum(rows_in), 0) AS rows_in, coalesce(sum(rows_out), 0) AS rows_out,"
        " coalesce(sum(dead_letters), 0) AS dead_letters, arg_max(lag, ts_ms) AS lag, max(ts_ms) AS last_ts_ms"
        " FROM read_json_auto(?, format = 'newline_delimited', ignore_errors = true,"
        "  columns = {ts_ms: 'BIGINT', rows_in: 'BIGINT', rows_out: 'BIGINT', dead_letters: 'BIGINT', lag: 'BIGINT'})",
        [str(folder / "*.jsonl")]).fetchone()
    return dict(zip(empty, row))


def pipeline_events(con, data_dir: Path, name: str, limit: int = 20) -> pd.DataFrame:
    folder = store.sql_dir(data_dir, name) / "metrics" / "events"
    if not any(folder.glob("*.jsonl")):
        return pd.DataFrame(columns=["ts", "kind", "message"])
    return con.execute(
        "SELECT ts, kind, message FROM read_json_auto(?, format = 'newline_delimited', ignore_errors = true,"
        " columns = {ts: 'VARCHAR', ts_ms: 'BIGINT', kind: 'VARCHAR', message: 'VARCHAR'}) ORDER BY ts_ms DESC LIMIT ?",
        [str(folder / "*.jsonl"), limit]).df()
