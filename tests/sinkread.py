"""Reading the sinks back the way users do: DuckDB over the committed-files glob."""

from __future__ import annotations

import duckdb

from pipeline import store


def has_files(data_dir, sink: str) -> bool:
    return any(store.sink_dir(data_dir, sink).glob("*/*.parquet"))


def count(data_dir, sink: str) -> int:
    if not has_files(data_dir, sink):
        return 0
    return duckdb.sql(f"select count(*) from read_parquet('{store.sink_glob(data_dir, sink)}')").fetchall()[0][0]


def rows(data_dir, sink: str, columns: str = "*") -> list[dict]:
    if not has_files(data_dir, sink):
        return []
    rel = duckdb.sql(f"select {columns} from read_parquet('{store.sink_glob(data_dir, sink)}')")
    return [dict(zip(rel.columns, r)) for r in rel.fetchall()]


def invoices(data_dir, sink: str) -> list[int]:
    return [r["invoice_id"] for r in rows(data_dir, sink, "invoice_id")]


def orders_done(data_dir) -> int:
    return count(data_dir, "enriched") + count(data_dir, "missing_state")
