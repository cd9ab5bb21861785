"""A month, compressed: many committed batches through the job's sink writer, and what the console then pays.

Issue 28's benchmark. A writer process (run it under ``nice -n 19`` on a shared machine; this
module does) commits batches the way the job does, and this process measures between its
segments, with the writer stopped:

- **the writer** (``--write-only``): each batch's rows of the three sinks through the job's own
  :class:`pipeline.sinks.SinkWriter` (``commit_batch``: one Delta commit per sink with rows,
  transaction id = the batch id), then the metrics the job's listener writes for it: a progress
  row built by :func:`pipeline.metrics.build_progress_row` from a Spark progress JSON, task rows
  by :func:`pipeline.metrics.task_rows_from_stages` from Spark's REST stage details, a state
  census row per lookup every 60 batches, and Spark's checkpoint logs (``offsets/N``,
  ``commits/N``, the newest 100 kept as Spark's ``minBatchesToRetain`` keeps them). Compaction
  and vacuum run as the job runs them: :class:`pipeline.sinks.SinkMaintenance` on its own thread
  every ``sinks.compact_interval`` of wall time, vacuuming with ``sinks.vacuum_retention`` and
  pruning metrics past ``metrics.retention`` (every round is a ``sinks_maintained`` event).
  Every row is timed by the wall clock, as the job times it.
- **the measurements** at each of ``--at``: every console page with Streamlit's AppTest (cold,
  warm and cached, as bench/bench_console.py times them), a DuckDB ``count(*)`` over each sink's
  current files on a new connection, and the files and bytes of the sinks (current files,
  replaced ones, the Delta log), the metrics and the checkpoint logs.

Time runs faster here than in a month: the wall-clock retentions (vacuum in whole hours, the
Delta log kept at least an hour, metrics in whole days) cannot act as they would over 30 days.
The settings used and what they stand for are recorded in the JSON; see bench/README.md.

    python -m bench.bench_month --batches 1000 --at 1000        # a quick look
    python -m bench.bench_month --batches 100000 --at 1000,10000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.common import BenchError  # noqa: E402
from pipeline import metrics, store  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.metrics import MetricsStore, build_progress_row, prune_old_days, task_rows_from_stages  # noqa: E402
from pipeline.sinks import SCHEMAS, SinkMaintenance, SinkWriter, committed_batch, open_table, sink_files  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "month.json"
PAGES = tuple(sorted(path.name for path in (ROOT / "pages").glob("*.py")))
LIMIT_S = 1.5
SLOWER_AT_MOST = 2.0  # a page's time at the last checkpoint over its time at the first
# What a month-long run would use, compressed (bench/README.md says what each stands for).
SETTINGS = {"sinks.compact_interval": "60s", "sinks.vacuum_retention": "0h", "metrics.retention": "168h"}
SPARK_RETAINED_BATCHES = 100  # spark.sql.streaming.minBatchesToRetain's default
ORDERS_TOPIC = "persistent://public/default/orders"
USERS, ITEMS = 200_000, 20_000
WORDS = np.array(["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances"])
CATEGORIES = np.array(["books", "garden", "toys", "kitchen", "music", "sports"])
REASONS = np.array(["user", "item", "user_and_item"])
# Spark 4's RocksDB metrics of a stateful operator, as its progress JSON carries them (a
# progress row is then about 4 KB, as the job's).
ROCKSDB_METRICS = ("rocksdbCommitFlushLatency", "rocksdbCommitCheckpointLatency", "rocksdbCommitFileSyncLatencyMs",
                   "rocksdbChangeLogWriterCommitLatencyMs", "rocksdbTotalBytesWrittenByFlush", "rocksdbSstFileSize",
                   "rocksdbGetLatency", "rocksdbPutLatency", "rocksdbGetCount", "rocksdbPutCount",
                   "rocksdbReadBlockCacheHitCount", "rocksdbReadBlockCacheMissCount", "rocksdbTotalBytesRead",
                   "rocksdbTotalBytesWritten", "rocksdbTotalBytesReadByCompaction", "rocksdbTotalBytesWrittenByCompaction",
                   "rocksdbTotalCompactionLatencyMs", "rocksdbWriterStallLatencyMs", "rocksdbBytesCopied",
                   "rocksdbFilesCopied", "rocksdbFilesReused", "rocksdbZipFileBytesUncompressed",
                   "rocksdbCommitCompactLatency", "rocksdbCommitPauseLatency", "rocksdbCommitWriteBatchLatency",
                   "rocksdbLoadedFromCloudLatencyMs", "rocksdbNumExternalColumnFamilies", "rocksdbNumInternalColumnFamilies",
                   "rocksdbPinnedBlocksMemoryUsage", "rocksdbNumSnapshotsAutoRepaired")


# ---------------------------------------------------------------------------- one batch
def build_sink_tables(batch_id: int, orders: int, now_ms: int) -> dict[str, pa.Table]:
    """A batch's rows per sink, typed by the sinks' own schemas: about 94 % of the orders
    enriched, 5 % missing state, 1 % dead letters (as tests/app_fixtures.py splits them)."""
    rng = np.random.default_rng(batch_id)
    outcome = rng.random(orders)
    parts = {"enriched": outcome >= 0.06, "missing_state": (outcome >= 0.01) & (outcome < 0.06), "dead_letter": outcome < 0.01}
    first_invoice = 100_000 + batch_id * orders
    tables = {}
    for sink, mask in parts.items():
        n = int(mask.sum())
        if n == 0:
            continue
        invoice = first_invoice + np.flatnonzero(mask)
        published = now_ms - rng.integers(200, 1500, n)
        user = np.where(rng.random(n) < 0.25, rng.integers(1, USERS // 100, n), rng.integers(1, USERS, n))
        item = np.where(rng.random(n) < 0.2, rng.integers(1, 4, n), rng.integers(1, ITEMS, n))
        values = {
            "invoice_id": invoice, "line_item_id": np.ones(n, dtype=np.int64), "user_id": user, "item_id": item,
            "price": np.round(rng.uniform(1, 200, n), 2), "item_price": np.round(rng.uniform(1, 200, n), 2),
            "created_at": published - rng.integers(5, 200, n), "paid_at": published + 1000,
            "user_created_at": np.full(n, now_ms - 86_400_000 * 30), "user_as_of": published - 60_000,
            "item_as_of": published - 60_000, "published_at": published,
            "enriched_at": np.full(n, now_ms), "detected_at": np.full(n, now_ms),
            "waited_ms": np.where(rng.random(n) < 0.1, rng.integers(1, 5000, n), 0),
            "batch_id": np.full(n, batch_id), "source_partition": rng.integers(0, 4, n).astype(np.int32),
            "source_topic": np.full(n, ORDERS_TOPIC), "source_message_id": np.char.add(f"{batch_id}:", invoice.astype(str)),
            "user_first_name": WORDS[user % len(WORDS)], "user_last_name": WORDS[(user // 8) % len(WORDS)],
            "user_email": np.char.add(np.char.add("user", user.astype(str)), "@example.com"),
            "item_name": np.char.add("item ", item.astype(str)), "item_category": CATEGORIES[item % len(CATEGORIES)],
            "item_adjective": np.full(n, "shiny"), "item_modifier": np.full(n, "deluxe"),
            "reason": REASONS[rng.integers(0, 3, n)], "redrive_of": np.full(n, None, dtype=object),
            "key": invoice.astype(str), "payload": np.full(n, '{"invoiceId": "x"}'),
            "error": np.full(n, "field 'invoiceId': expected an integer, got 'x'"),
        }
        columns = [pa.array(values[field.name]).cast(field.type) if pa.types.is_timestamp(field.type)
                   else pa.array(values[field.name], type=field.type) for field in SCHEMAS[sink]]
        tables[sink] = pa.Table.from_arrays(columns, schema=SCHEMAS[sink])
    return tables


def _offsets(batch_id: int, orders: int) -> dict:
    """The source's offsets after ``batch_id`` (pipeline/source/offsets.py's shape)."""
    counts = {"users": batch_id * 3, "items": batch_id, "orders": (batch_id + 1) * orders}
    return {topic: {"gen": 0, "base": {"-1": "earliest"}, "target": {},
                    "parts": {"-1": {"n": n, "id": f"0:{n}:-1:-1"}}} for topic, n in counts.items()}


def build_spark_progress(batch_id: int, orders: int, now_ms: int) -> dict:
    """Spark's StreamingQueryProgress JSON of one batch, as the listener receives it."""
    rng = np.random.default_rng(batch_id + 1_000_000_000)
    duration = int(rng.integers(150, 700))
    operators = [{"numRowsTotal": USERS if i else ITEMS, "numRowsUpdated": int(rng.integers(0, 10)),
                  "memoryUsedBytes": 350 * (USERS if i else ITEMS), "commitTimeMs": int(rng.integers(5, 40)),
                  "customMetrics": {name: int(rng.integers(0, 100_000)) for name in ROCKSDB_METRICS}}
                 for i in range(2)]
    start, end = _offsets(batch_id - 1, orders), _offsets(batch_id, orders)
    return {"id": "3f1c0a6e-query", "runId": "run-1", "batchId": batch_id, "timestamp": metrics.iso(now_ms - duration),
            "numInputRows": orders + 4, "inputRowsPerSecond": float(orders), "processedRowsPerSecond": orders / duration * 1000,
            "batchDuration": duration,
            "durationMs": {"latestOffset": 3, "getBatch": 1, "queryPlanning": 12, "addBatch": duration - 40,
                           "walCommit": 9, "commitOffsets": 8, "triggerExecution": duration},
            "stateOperators": operators,
            "sources": [{"startOffset": json.dumps(start), "endOffset": json.dumps(end), "latestOffset": json.dumps(end)}],
            "observedMetrics": {"source_rows": {"orders/-1": orders, "users/-1": 3, "items/-1": 1}}}


def build_spark_stages(orders: int, rng: np.random.Generator) -> list[dict]:
    """Spark's REST stage details of one batch's two lookup stages, four tasks each."""
    stages = []
    for stage_id in (3, 4):
        records = rng.multinomial(orders, [0.5, 0.2, 0.15, 0.15])
        stages.append({"stageId": stage_id, "shuffleReadRecords": int(orders), "tasks": {
            str(task): {"index": task, "duration": 5 + int(n) // 4,
                        "taskMetrics": {"shuffleReadMetrics": {"recordsRead": int(n)}}}
            for task, n in enumerate(records)}})
    return stages


def write_checkpoint_logs(checkpoint: Path, batch_id: int) -> None:
    """Spark's offset and commit log files of a batch; the ones older than the newest
    :data:`SPARK_RETAINED_BATCHES` removed, as Spark removes them."""
    for log_name, text in (("offsets", '{"batchWatermarkMs":0}\n' + "x" * 900), ("commits", '{"nextBatchWatermarkMs":0}')):
        folder = checkpoint / log_name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(batch_id)).write_text("v1\n" + text)
        old = folder / str(batch_id - SPARK_RETAINED_BATCHES)
        if old.exists():
            old.unlink()


# ---------------------------------------------------------------------------- the writer
def write_batches(data_dir: Path, until: int, orders: int, settings_values: dict[str, str]) -> dict:
    """Commit batches after the newest one the enriched sink holds, up to batch ``until - 1``,
    with their metrics, and compaction and vacuum on their own thread as the job runs them."""
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir), **settings_values})
    writer, metrics_store = SinkWriter(data_dir), MetricsStore(data_dir)
    checkpoint = store.checkpoint_dir(data_dir)
    maintenance = SinkMaintenance.from_settings(writer, data_dir, settings, metrics_store.event,
                                                prune=lambda: prune_old_days(data_dir, settings["metrics.retention"])).start()
    first = committed_batch(open_table(store.sink_dir(data_dir, "enriched"))) + 1
    rng = np.random.default_rng(first)
    commit_s = []
    started = time.perf_counter()
    try:
        for batch_id in range(first, until):
            now_ms = metrics.now_ms()
            began = time.perf_counter()
            writer.commit_batch(build_sink_tables(batch_id, orders, now_ms), batch_id)
            commit_s.append(time.perf_counter() - began)
            # what the listener writes once Spark has committed the batch
            write_checkpoint_logs(checkpoint, batch_id)
            progress = build_spark_progress(batch_id, orders, now_ms)
            metrics_store.append("progress", build_progress_row(progress, 1000, writer.last_counts.get(batch_id),
                                                                USERS * 120 + ITEMS * 120))
            for row in task_rows_from_stages(batch_id, build_spark_stages(orders, rng), now_ms):
                metrics_store.append("tasks", row)
            if batch_id % 60 == 0:  # the state census, once a minute at a 1 s trigger
                for lookup, rows in (("user", USERS), ("item", ITEMS)):
                    metrics_store.append("state", {"ts_ms": now_ms, "batch_id": batch_id, "lookup": lookup,
                                                   "state_rows": rows, "keys_held": rows, "waiting_keys": 3,
                                                   "waiting_orders": 5})
    finally:
        maintenance.stop()  # waits for a round under way
    elapsed = time.perf_counter() - started
    return {"from_batch": first, "to_batch": until - 1, "batches": len(commit_s), "write_s": round(elapsed, 1),
            "batches_per_s": round(len(commit_s) / elapsed, 2) if elapsed else None,
            "commit_ms_p50": round(float(np.percentile(commit_s, 50)) * 1000, 1) if commit_s else None,
            "commit_ms_p99": round(float(np.percentile(commit_s, 99)) * 1000, 1) if commit_s else None,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


# ---------------------------------------------------------------------------- the measurements
def count_sinks(data_dir: Path) -> dict:
    """Per sink: rows by DuckDB ``count(*)`` over the current files on a new connection, the
    time that took (the log's file list included), and the current files."""
    import duckdb

    counted = {}
    for sink in store.SINKS:
        started = time.perf_counter()
        files = sink_files(data_dir, sink)
        with duckdb.connect() as connection:
            rows = connection.execute("SELECT count(*) FROM read_parquet($files)", {"files": files}).fetchone()[0] if files else 0
        counted[sink] = {"rows": rows, "count_s": round(time.perf_counter() - started, 3), "table_files": len(files)}
    return counted


def _tree(path: Path) -> tuple[int, int]:
    files = size = 0
    for folder, _dirs, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def disk(data_dir: Path) -> dict:
    """Files and bytes: per sink its Parquet files on disk (current and replaced), its Delta
    log, and the metrics streams and the checkpoint logs."""
    found = {}
    for sink in store.SINKS:
        folder = store.sink_dir(data_dir, sink)
        parquet = [folder / name for name in os.listdir(folder) if name.endswith(".parquet")] if folder.is_dir() else []
        log_files, log_bytes = _tree(folder / "_delta_log")
        found[sink] = {"parquet_files": len(parquet), "parquet_bytes": sum(p.stat().st_size for p in parquet),
                       "log_files": log_files, "log_bytes": log_bytes}
    for stream in store.METRIC_STREAMS:
        files, size = _tree(store.metrics_dir(data_dir, stream))
        found[f"metrics/{stream}"] = {"files": files, "bytes": size}
    files, size = _tree(store.checkpoint_dir(data_dir))
    found["checkpoint"] = {"files": files, "bytes": size}
    files, size = _tree(data_dir)
    found["total"] = {"files": files, "bytes": size}
    return found


def maintenance_rounds(data_dir: Path) -> dict:
    events = metrics.read_events(data_dir, ("sinks_maintained", "sinks_maintenance_failed"))
    done = [e for e in events if e["kind"] == "sinks_maintained"]
    took = [e["details"].get("duration_s", 0) for e in done]
    return {"rounds": len(done), "failed": len(events) - len(done),
            "mean_s": round(statistics.mean(took), 2) if took else None, "max_s": max(took) if took else None}


def time_pages(data_dir: Path, repeats: int) -> dict:
    """Every console page over ``data_dir`` (AppTest), each run once untimed first (a page's first
    run in a process imports its modules); a page that fails is recorded with its error."""
    from streamlit.testing.v1 import AppTest

    from bench.bench_console import time_page

    os.environ["SS_PATHS_DATA_DIR"] = str(data_dir)
    for page in PAGES:
        AppTest.from_file(str(ROOT / "pages" / page), default_timeout=120).run()
    pages = {}
    for page in PAGES:
        try:
            pages[page] = time_page(page, repeats)
        except Exception as exc:  # recorded with its page; the others are still measured
            pages[page] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return pages


def measure(data_dir: Path, repeats: int) -> dict:
    """Everything at one checkpoint, with the writer stopped."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    sinks = count_sinks(data_dir)
    pages = time_pages(data_dir, repeats)
    return {"batches": committed_batch(open_table(store.sink_dir(data_dir, "enriched"))) + 1,
            "load_average_before": load_before, "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "sinks": sinks, "disk": disk(data_dir), "maintenance": maintenance_rounds(data_dir), "pages": pages}


def judge(results: dict) -> dict:
    """The targets: every page <= LIMIT_S at the last checkpoint (its cold and warm runs),
    and its warm time there at most SLOWER_AT_MOST times its warm time at the first."""
    points = sorted(results["at"], key=int)
    if not points:
        return {}
    first, last = results["at"][points[0]]["pages"], results["at"][points[-1]]["pages"]
    verdict = {}
    for page, timing in last.items():
        if "error" in timing or "error" in first.get(page, {"error": 1}):
            verdict[page] = {"error": timing.get("error") or first[page]["error"]}
            continue
        growth = timing["warm_s"] / first[page]["warm_s"] if first[page]["warm_s"] else None
        verdict[page] = {"under_limit": timing["under_limit"],
                         "warm_growth": round(growth, 2) if growth else None,
                         "within_growth": growth is not None and growth <= SLOWER_AT_MOST}
    return {"from": int(points[0]), "to": int(points[-1]), "pages": verdict}


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Rows of bench/run.py's table: the slowest page and the files at the last checkpoint,
    beside the same at the first (figure, value, baseline, ratio)."""
    points = sorted(result.get("at", {}), key=int)
    if len(points) < 2:
        return []
    first, last = result["at"][points[0]], result["at"][points[-1]]

    def slowest(at: dict) -> tuple[str, float]:
        timed = {page: max(t["cold_s"], t["warm_s"]) for page, t in at["pages"].items() if "error" not in t}
        page = max(timed, key=timed.get)
        return page, timed[page]

    def files(at: dict) -> int:
        return sum(at["disk"][sink]["parquet_files"] + at["disk"][sink]["log_files"] for sink in store.SINKS)

    (page, slow), (_, slow_first) = slowest(last), slowest(first)
    load = f" (load {last['load_average_before'][0]:.1f})"
    return [
        (f"a month, compressed: slowest console page at {int(points[-1]):,} batches (target 1.5 s, 2 x at {int(points[0]):,})",
         f"{slow:.2f} s ({page}){load}", f"at {int(points[0]):,} batches {slow_first:.2f} s", f"{slow / slow_first:.2f}"),
        (f"a month, compressed: sink files on disk (Parquet + Delta log) at {int(points[-1]):,} batches",
         f"{files(last):,}{load}", f"at {int(points[0]):,} batches {files(first):,}", f"{files(last) / files(first):.2f}"),
    ]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--at", default="1000,10000,100000", help="batch counts to measure at")
    parser.add_argument("--orders", type=int, default=100, help="orders per batch")
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per page (the median is reported)")
    parser.add_argument("--data-dir", help="keep (and resume) this data dir instead of a temporary one")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a setting of the writer (defaults: {SETTINGS})")
    parser.add_argument("--write-only", type=int, metavar="UNTIL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    settings_values = {**SETTINGS, **dict(item.split("=", 1) for item in args.set)}
    if args.write_only is not None:  # the writer segment, in its own (niced) process
        print(json.dumps(write_batches(Path(args.data_dir) / "data", args.write_only, args.orders, settings_values)))
        return {}

    checkpoints = sorted({int(n) for n in args.at.split(",") if int(n) <= args.batches} | {args.batches})
    temporary = args.data_dir is None
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="bench-month-")) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"settings": settings_values, "orders_per_batch": args.orders, "limit_s": LIMIT_S,
                     "machine_cpus": os.cpu_count(), "writer": [], "at": {}}
    if RESULTS.exists() and not temporary:  # resuming a kept data dir keeps what was measured
        previous = json.loads(RESULTS.read_text())
        if previous.get("data_dir") == str(data_dir):
            results = previous
    results["data_dir"] = str(data_dir)
    try:
        for point in checkpoints:
            if str(point) in results["at"]:
                continue
            command = ["nice", "-n", "19", sys.executable, "-m", "bench.bench_month", "--data-dir", str(data_dir.parent),
                       "--orders", str(args.orders), "--write-only", str(point)]
            for key, value in settings_values.items():
                command += ["--set", f"{key}={value}"]
            print(f"writing up to batch {point:,} …", flush=True)
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:  # what the writer said, not only its exit code: a resume starts where it stopped
                raise BenchError(f"the writer stopped (exit {done.returncode}) before batch {point:,}:\n"
                                 + "\n".join(done.stderr.strip().splitlines()[-20:]))
            segment = json.loads(done.stdout.strip().splitlines()[-1])
            results["writer"].append(segment)
            print(f"  {json.dumps(segment)}", flush=True)
            results["at"][str(point)] = measure(data_dir, args.repeats)
            print(f"  at {point:,}: {json.dumps(results['at'][str(point)])}", flush=True)
            results["verdict"] = judge(results)
            RESULTS.parent.mkdir(parents=True, exist_ok=True)
            RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if temporary:
            shutil.rmtree(data_dir.parent, ignore_errors=True)
    print(json.dumps(results.get("verdict"), indent=2))
    return results


if __name__ == "__main__":
    main()
