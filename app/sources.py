"""How the console reads the stores: the DuckDB connection and the FROM clauses of every query.

The sinks are Delta tables under ``<data_dir>/sinks/<name>/`` (their current files come from
the Delta log: :func:`table_relation`, :mod:`app.catalog`; never glob the folder) and the
metrics store is JSON Lines under ``<data_dir>/metrics/<stream>/`` (DESIGN.md §5, §6). Both may not exist yet, and a
metrics file may end in a half-written line while the job appends to it. Every reader goes
through :func:`sink_relation` and :func:`metrics_relation`, which return SQL text that is
either a reader over the files or an empty relation of the same columns, so a query never
fails on a fresh data dir and never needs its own "is it there yet" check.

Timestamps are shown in UTC: :func:`connect` sets the time zone for the connection and every
cursor made from it.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd
import pyarrow as pa

from app.catalog import SinkFile, catalog_for
from pipeline import store
from pipeline.metrics import DURATION_PHASES, STREAM_SCHEMAS  # noqa: F401 - DURATION_PHASES: the console's import
from pipeline.metrics_tail import day_files, tail_lines
from pipeline.enrich.lookups import LOOKUPS
from pipeline.sinks import SCHEMAS, table_files

def duckdb_type(kind: pa.DataType) -> str:
    """The DuckDB type of an Arrow type (``timestamp[ms, tz=UTC]`` -> ``TIMESTAMPTZ``, structs,
    lists and maps spelled out), so the console's views are derived from the job's schemas."""
    if isinstance(kind, pa.JsonType):
        return "JSON"
    if pa.types.is_struct(kind):
        return "STRUCT(" + ", ".join(f'"{field.name}" {duckdb_type(field.type)}' for field in kind) + ")"
    if pa.types.is_list(kind):
        return f"{duckdb_type(kind.value_type)}[]"
    if pa.types.is_map(kind):
        return f"MAP({duckdb_type(kind.key_type)}, {duckdb_type(kind.item_type)})"
    if pa.types.is_timestamp(kind):
        return "TIMESTAMPTZ" if kind.tz else "TIMESTAMP"
    return _DUCKDB_TYPES[kind]


_DUCKDB_TYPES = {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
                 pa.bool_(): "BOOLEAN"}


def duckdb_columns(schema: pa.Schema) -> dict[str, str]:
    """Column name -> DuckDB type, for an Arrow schema."""
    return {field.name: duckdb_type(field.type) for field in schema}


# Column types of the on-disk contract (pipeline/sinks.py SCHEMAS). Only the empty relations use
# them: a reader over real files takes the types from the Parquet footers.
SINK_COLUMNS: dict[str, dict[str, str]] = {sink: duckdb_columns(schema) for sink, schema in SCHEMAS.items()}

# The JSON column spec of each metrics stream, from the job's declaration (pipeline/metrics.py
# STREAM_SCHEMAS). Keys the job leaves out read as NULL; a line that does not parse (the
# half-written last one) reads as all NULL and is filtered out.
METRIC_COLUMNS: dict[str, dict[str, str]] = {stream: duckdb_columns(schema) for stream, schema in STREAM_SCHEMAS.items()}


Connection = duckdb.DuckDBPyConnection


def query_frame(connection: Connection, sql: str, params: dict | None = None) -> pd.DataFrame:
    """The result of ``sql`` with named ``$params`` as a pandas frame."""
    return connection.execute(sql, params or {}).df()


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection set up for the console; make a ``.cursor()`` per thread.

    Committed sink files never change, so caching their Parquet footers is safe and saves
    re-reading thousands of footers on every refresh.
    """
    connection = duckdb.connect(":memory:")
    connection.execute("SET GLOBAL TimeZone = 'UTC'")
    connection.execute("SET GLOBAL parquet_metadata_cache = true")
    return connection


def sql_text(value: str) -> str:
    """A SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def empty_relation(columns: dict[str, str]) -> str:
    """A subquery with these columns and no rows."""
    selected = ", ".join(f'CAST(NULL AS {kind}) AS "{name}"' for name, kind in columns.items())
    return f"(SELECT {selected} WHERE false)"


def sink_relation(data_dir: Path, sink: str, newer_than_ms: int | None = None, newest_rows: int | None = None) -> str:
    """FROM-clause text for a sink's committed rows, or no rows if it has no files yet.

    ``newer_than_ms`` reads only the files holding a row committed after that time, and
    ``newest_rows`` only the newest files that hold at least that many rows; the query still
    filters rows itself, these only skip files that cannot match (see :mod:`app.catalog`).
    """
    files = catalog_for(data_dir).files(sink)
    if newer_than_ms is not None:
        files = [entry for entry in files if entry.max_ms is None or entry.max_ms > newer_than_ms]
    if newest_rows is not None:
        newest_first, rows = [], 0
        for entry in sorted(files, key=lambda entry: entry.max_ms or 0, reverse=True):
            if rows >= newest_rows:
                break
            newest_first.append(entry)
            rows += entry.rows
        files = newest_first
    return files_relation(sink, files)


ADDED_COLUMNS = tuple(lookup.as_of_column for lookup in LOOKUPS)  # event time (README "Event time"); NULL in older sink files


def files_relation(sink: str, files: list[SinkFile]) -> str:
    """FROM-clause text for these catalog files of a sink, or no rows if there are none."""
    if not files:
        return empty_relation(SINK_COLUMNS[sink])
    file_list = "[" + ", ".join(sql_text(entry.path) for entry in files) + "]"
    relation = f"read_parquet({file_list}, hive_partitioning = false, union_by_name = true)"
    if sink in ("enriched", "missing_state"):
        # Files written before the event-time columns existed read them as NULL.
        added = empty_relation({name: SINK_COLUMNS[sink][name] for name in ADDED_COLUMNS})
        return f"(SELECT * FROM {added} UNION ALL BY NAME SELECT * FROM {relation})"
    return relation


def table_relation(table_path: Path, columns: dict[str, str]) -> str:
    """FROM-clause text for the current rows of any Delta table (the files its log lists now,
    read with ``read_parquet``), or no rows with these columns if it has none yet. Where
    DuckDB's delta extension is installed, ``delta_scan('<path>')`` reads the same rows."""
    files = table_files(Path(table_path))
    if not files:
        return empty_relation(columns)
    file_list = "[" + ", ".join(sql_text(path) for path in files) + "]"
    return f"read_parquet({file_list}, hive_partitioning = false, union_by_name = true)"


def metrics_files(data_dir: Path, stream: str, since_ms: int | None = None) -> list[Path]:
    """The day files of a metrics stream, oldest first; with ``since_ms``, only those that can
    hold a row from then on (a row's day file is its own ``ts_ms``'s day)."""
    first_day = None if since_ms is None else \
        datetime.fromtimestamp(max(0, since_ms) / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
    return [path for path in day_files(data_dir, stream) if first_day is None or path.stem >= first_day]


def metrics_relation(data_dir: Path, stream: str, since_ms: int | None = None) -> str:
    """FROM-clause text for a metrics stream: its complete lines, or no rows if there are none;
    with ``since_ms``, only the day files from that day on (the query still filters rows itself).

    A query that shows the newest rows reads :func:`newest_metrics` instead: the whole day files
    of a busy job are hundreds of MB."""
    columns = METRIC_COLUMNS[stream]
    files = metrics_files(data_dir, stream, since_ms)
    if not files:
        return empty_relation(columns)
    file_list = "[" + ", ".join(sql_text(str(path)) for path in files) + "]"
    spec = "{" + ", ".join(f"{sql_text(name)}: {sql_text(kind)}" for name, kind in columns.items()) + "}"
    return (
        f"(SELECT * FROM read_json({file_list}, format = 'newline_delimited', ignore_errors = true, "
        f"columns = {spec}) WHERE ts_ms IS NOT NULL)"
    )


_NEWEST_NAMES = itertools.count()


@contextmanager
def newest_metrics(connection: Connection, data_dir: Path, stream: str, rows: int) -> Iterator[tuple[str, bool]]:
    """FROM-clause text for the newest ``rows`` rows of a metrics stream, and whether they are
    all of it; only the last lines of the newest day files are read
    (:func:`pipeline.metrics_tail.tail_lines`), typed as :func:`metrics_relation` types them.

    The lines are lent to ``connection`` as a table for the ``with`` block only."""
    columns = METRIC_COLUMNS[stream]
    lines, whole = tail_lines(data_dir, stream, int(rows))
    if not lines:
        yield empty_relation(columns), whole
        return
    name = f"newest_{stream}_{next(_NEWEST_NAMES)}"
    connection.register(name, pa.table({"line": pa.array([line.decode("utf-8", "replace") for line in lines])}))
    struct = "STRUCT(" + ", ".join(f'"{column}" {kind}' for column, kind in columns.items()) + ")"
    try:
        yield (f"(SELECT unnest(s) FROM (SELECT TRY_CAST(TRY_CAST(line AS JSON) AS {struct}) AS s FROM {name}) "
               f"WHERE s.ts_ms IS NOT NULL)"), whole
    finally:
        connection.unregister(name)


def query_newest(connection: Connection, data_dir: Path, stream: str, rows: int, sql: str,
                 params: dict | None = None) -> pd.DataFrame:
    """:func:`query_frame` of ``sql`` with ``{newest}`` standing for the newest ``rows`` rows of
    ``stream`` (:func:`newest_metrics`)."""
    with newest_metrics(connection, data_dir, stream, rows) as (relation, _):
        return query_frame(connection, sql.replace("{newest}", relation), params)
