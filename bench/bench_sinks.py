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
    args = parser.parse_args(argv)
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
