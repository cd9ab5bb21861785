"""The sinks over many batches: a reader's time, files and bytes, with and without compaction.

Writes ``--batches`` micro-batches of ``--rows`` enriched rows each through the real sink writer
(:class:`pipeline.sinks.SinkWriter`, one Delta commit per batch with its transaction id) into
two data dirs: one never compacted, one compacted and vacuumed (retention 0) every
``--compact-every`` batches, as the job's schedule would. At each checkpoint (``--at``) it
measures, on a fresh DuckDB connection and a fresh console catalog:

- ``count_s``: listing the table's current files from the Delta log and ``count(*)`` over them;
- ``catalog_s``: the console catalog's first refresh (every file's rows and time range, from the log);
- files in the table, Parquet files and bytes on disk, and the time the batches took to commit.

Prints a table and writes ``bench/results/sinks.json``.

    python -m bench.bench_sinks --batches 10000 --at 1000,10000

``--compare`` instead times the writer's commit of a batch against the writer as it was before
(each sink's table loaded afresh and the sinks committed one after the other), in the same run:
the two write ``--batches`` batches of ``--orders`` orders split over the three sinks as the
job's are (bench/bench_month.py's batches), to two data dirs, alternating in blocks of 50
batches so that both see the same load; both are compacted and vacuumed every
``--compact-every`` batches. Writes ``bench/results/sink_writer.json``.

    python -m bench.bench_sinks --compare --batches 2000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from app.catalog import SinkCatalog  # noqa: E402
from pipeline import store  # noqa: E402
from pipeline.sinks import SCHEMAS, SinkWriter, sink_files  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sinks.json"
WRITER_RESULTS = ROOT / "bench" / "results" / "sink_writer.json"


class SerialReloadingWriter(SinkWriter):
    """The writer before issue 28's speed-up: every sink's table loaded afresh for each batch,
    the sinks committed one after the other (the same commit per sink otherwise)."""

    def commit_batch(self, tables: dict[str, pa.Table], batch_id: int) -> dict[str, int]:
        counts = {name: 0 for name in self.paths}
        for name, path in self.paths.items():
            if tables.get(name) is not None and tables[name].num_rows > 0:
                counts[name] = self._commit_sink(name, path, tables[name], batch_id)
        return counts

    def _current_table(self, name: str, path: Path):
        from pipeline.sinks import open_table

        return open_table(path)


def compare_writers(batches: int, orders: int, compact_every: int, block: int = 50) -> dict:
    """The old and the new writer on the same batches, alternating blocks (see the docstring)."""
    from bench.bench_month import build_sink_tables

    root = Path(tempfile.mkdtemp(prefix="bench-sink-writer-"))
    writers = {"before": SerialReloadingWriter(root / "before"), "now": SinkWriter(root / "now")}
    commit_s: dict[str, list[float]] = {mode: [] for mode in writers}
    loads = [os.getloadavg()[0]]
    try:
        for first in range(0, batches, block):
            for mode, writer in (writers.items() if (first // block) % 2 == 0 else reversed(writers.items())):
                for batch in range(first, min(first + block, batches)):
                    tables = build_sink_tables(batch, orders, 1_800_000_000_000 + batch * 500)
                    started = time.perf_counter()
                    counts = writer.commit_batch(tables, batch)
                    commit_s[mode].append(time.perf_counter() - started)
                    assert sum(counts.values()) == sum(t.num_rows for t in tables.values()), (mode, batch, counts)
                    if (batch + 1) % compact_every == 0:
                        writer.maintain(compact=True, retention_s=0)
            loads.append(os.getloadavg()[0])
        rows: dict[str, dict[str, int]] = {mode: {} for mode in writers}
        for mode in writers:
            with duckdb.connect() as connection:
                for sink in SCHEMAS:
                    files = sink_files(root / mode, sink)
                    rows[mode][sink] = connection.execute("SELECT count(*) FROM read_parquet($files)",
                                                          {"files": files}).fetchone()[0] if files else 0
        assert rows["before"] == rows["now"], rows  # the same rows, each once
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary = {mode: {"commit_ms_p50": round(float(np.percentile(times, 50)) * 1000, 1),
                      "commit_ms_p90": round(float(np.percentile(times, 90)) * 1000, 1),
                      "commit_ms_p99": round(float(np.percentile(times, 99)) * 1000, 1),
                      "batches_per_s": round(len(times) / sum(times), 2)} for mode, times in commit_s.items()}
    return {"batches": batches, "orders_per_batch": orders, "compact_every": compact_every, "block": block,
            "rows": rows["now"], **summary,
            "p50_ratio": round(summary["before"]["commit_ms_p50"] / summary["now"]["commit_ms_p50"], 2),
            "rate_ratio": round(summary["now"]["batches_per_s"] / summary["before"]["batches_per_s"], 2),
            "load_average_1m": {"min": round(min(loads), 1), "max": round(max(loads), 1),
                                "mean": round(sum(loads) / len(loads), 1)},
            "machine_cpus": os.cpu_count()}


def batch_table(batch_id: int, rows: int, rng: np.random.Generator) -> pa.Table:
    schema = SCHEMAS["enriched"]
    now_ms = 1_800_000_000_000 + batch_id * 1000
    columns = {}
    for field in schema:
        if pa.types.is_timestamp(field.type):
            columns[field.name] = pa.array(np.full(rows, now_ms) - rng.integers(0, 5000, rows)).cast(field.type)
        elif pa.types.is_integer(field.type):
            columns[field.name] = pa.array(rng.integers(0, 1_000_000, rows)).cast(field.type)
        elif pa.types.is_floating(field.type):
            columns[field.name] = pa.array(rng.uniform(1, 200, rows))
        else:
            columns[field.name] = pa.array([f"{field.name}-{v}" for v in rng.integers(0, 500, rows)])
    columns["batch_id"] = pa.array(np.full(rows, batch_id))
    return pa.table(columns, schema=schema)


def measure(data_dir: Path) -> dict:
    started = time.perf_counter()
    files = sink_files(data_dir, "enriched")
    with duckdb.connect() as connection:
        rows = connection.execute("SELECT count(*) FROM read_parquet($files)", {"files": files}).fetchone()[0]
    count_s = time.perf_counter() - started
    started = time.perf_counter()
    entries = SinkCatalog(data_dir).files("enriched")
    catalog_s = time.perf_counter() - started
    folder = store.sink_dir(data_dir, "enriched")
    on_disk = [folder / name for name in os.listdir(folder) if name.endswith(".parquet")]
    return {"rows": rows, "count_s": round(count_s, 3), "catalog_s": round(catalog_s, 3),
            "catalog_rows": sum(entry.rows for entry in entries), "table_files": len(files),
            "parquet_files_on_disk": len(on_disk),
            "bytes": sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()),
            "log_files": len(os.listdir(folder / "_delta_log"))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--compact-every", type=int, default=500)
    parser.add_argument("--at", default="100,1000,2000")
    parser.add_argument("--compare", action="store_true", help="the writer now against the writer before (above)")
    parser.add_argument("--orders", type=int, default=100, help="with --compare: orders per batch")
    args = parser.parse_args(argv)
    if args.compare:
        results = compare_writers(args.batches, args.orders, args.compact_every)
        WRITER_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        WRITER_RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))
        return results
    checkpoints = sorted({int(n) for n in args.at.split(",") if int(n) <= args.batches} | {args.batches})
    root = Path(tempfile.mkdtemp(prefix="bench-sinks-"))
    rng = np.random.default_rng(7)
    results: dict = {"batches": args.batches, "rows_per_batch": args.rows, "compact_every": args.compact_every,
                     "plain": {}, "compacted": {}}
    try:
        writers = {"plain": SinkWriter(root / "plain"), "compacted": SinkWriter(root / "compacted")}
        commit_s = {"plain": [], "compacted": []}
        maintain_s: list[float] = []
        for batch in range(args.batches):
            table = batch_table(batch, args.rows, rng)
            for mode, writer in writers.items():
                started = time.perf_counter()
                writer.commit_batch({"enriched": table}, batch)
                commit_s[mode].append(time.perf_counter() - started)
            if (batch + 1) % args.compact_every == 0:
                started = time.perf_counter()
                writers["compacted"].maintain(compact=True, retention_s=0)
                maintain_s.append(time.perf_counter() - started)
            if batch + 1 in checkpoints:
                for mode, writer in writers.items():
                    recent = commit_s[mode][-min(len(commit_s[mode]), 500):]
                    results[mode][batch + 1] = {**measure(root / mode),
                                                "commit_ms_p50": round(float(np.percentile(recent, 50)) * 1000, 1),
                                                "commit_ms_p99": round(float(np.percentile(recent, 99)) * 1000, 1)}
                    print(mode, batch + 1, results[mode][batch + 1], flush=True)
        results["maintain_s"] = {"rounds": len(maintain_s), "mean": round(float(np.mean(maintain_s)), 3) if maintain_s else None,
                                 "max": round(max(maintain_s), 3) if maintain_s else None}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["maintain_s"]))
    return results


if __name__ == "__main__":
    main()
