"""Reading the sinks back the way users do: DuckDB over the files the Delta log lists now.

A vacuum with no retention (the chaos test's) may remove a file a moment after the log listed
it: a read that finds a file gone lists the files again (at most 5 times)."""

from __future__ import annotations

import duckdb

from pipeline.sinks import sink_files


def has_files(data_dir, sink: str) -> bool:
    return bool(sink_files(data_dir, sink))


def relation(data_dir, sink: str) -> str:
    """``read_parquet([...])`` over the sink's current files (call only if it has some)."""
    return "read_parquet([" + ", ".join(f"'{path}'" for path in sink_files(data_dir, sink)) + "])"


def count(data_dir, sink: str) -> int:
    return len(rows(data_dir, sink, "1"))


def rows(data_dir, sink: str, columns: str = "*") -> list[dict]:
    for attempt in range(5):
        if not has_files(data_dir, sink):
            return []
        try:
            rel = duckdb.sql(f"select {columns} from {relation(data_dir, sink)}")
            return [dict(zip(rel.columns, r)) for r in rel.fetchall()]
        except duckdb.IOException:
            if attempt == 4:
                raise
    return []


def invoices(data_dir, sink: str) -> list[int]:
    return [r["invoice_id"] for r in rows(data_dir, sink, "invoice_id")]


def orders_done(data_dir) -> int:
    return count(data_dir, "enriched") + count(data_dir, "missing_state")
