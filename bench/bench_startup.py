"""Cold start: from spawning ``python -m pipeline run`` to its first committed batch, by phase.

Issue 14 asks where a cold start goes. Each run starts the job on an empty checkpoint over a
small workload already on an embedded broker, and splits the time into:

- the job's own start-up phases, from its ``job_started`` event (process start and imports,
  lock and recovery, broker, topics, SparkSession, listeners);
- from ``job_started`` to the first batch's trigger (query start: the source's first plan);
- the first batch itself, with Spark's own phases (``durationMs``: latestOffset, queryPlanning,
  addBatch, walCommit, commitOffsets);
- the total, spawn to the first file in ``<checkpoint>/commits``.

Baselines, in the same run: a bare PySpark process that starts a local SparkSession with the
same master and runs one tiny job (what any PySpark program pays before its own work), and the
same cold start without the driver's class archive (pipeline/runtime/class_archive.py; the file is
moved aside for those runs). Prints a table and writes ``bench/results/startup.json``.

    python -m bench.bench_startup               # 2 cold starts
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, bench_topics, machine, now_utc, start_job, wait_until,  # noqa: E402
                          write_result)
from pipeline import store  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.runtime.class_archive import ARCHIVE  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.metrics import read_events, read_rows  # noqa: E402
from factories import item, keyed, order, publish, user  # noqa: E402

BARE_SPARK = """
import os, sys, time
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pyspark.sql import SparkSession
spark = SparkSession.builder.master(sys.argv[1]).config("spark.ui.showConsoleProgress", "false").getOrCreate()
spark.range(10).count()
spark.stop()
"""


def bare_spark_s(master: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", BARE_SPARK, master], check=True, capture_output=True, timeout=300)
    return time.perf_counter() - started


def cold_start(broker_url: str, topics: dict, workdir: Path, run: int) -> dict:
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker_url, "paths.data_dir": str(workdir / f"data{run}"), "spark.master": "local[2]",
        "job.trigger_interval": "500ms", **{f"topics.{kind}": topic for kind, topic in topics.items()}})
    commits = store.checkpoint_dir(settings.data_dir) / "commits"
    log_path = workdir / f"job{run}.log"
    spawned = time.time()
    job = start_job(settings, log_path)
    try:
        wait_until(lambda: commits.exists() and any(p.name.isdigit() for p in commits.iterdir()), timeout=300,
                   what="the first committed batch", interval=0.02, check=alive(job, log_path))
        first_commit = time.time()
        wait_until(lambda: read_rows(settings.data_dir, "progress"), timeout=60, what="the first progress row",
                   check=alive(job, log_path))
    finally:
        job.stop()
    (started,) = read_events(settings.data_dir, ("job_started",))[:1]
    first = read_rows(settings.data_dir, "progress")[0]
    phases = started["details"].get("startup_s") or {}
    return {
        "total_s": round(first_commit - spawned, 2),
        "job_phases_s": phases,
        "job_started_s": round(started["ts_ms"] / 1000 - spawned, 2),
        "query_start_to_first_trigger_s": round((first["ts_ms"] - started["ts_ms"]) / 1000, 2),
        "first_batch_s": round(first["batch_duration_ms"] / 1000, 2),
        "first_batch_phases_ms": first["duration_ms"],
        "first_batch_rows": first["num_input_rows"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="cold starts to measure (default 2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        workdir = Path(tmp)
        broker = EmbeddedBroker(workdir / "broker").start()
        try:
            topics = bench_topics("startup")
            publish(broker.service_url, topics["users"], keyed("users", [user(u) for u in range(1, 201)]))
            publish(broker.service_url, topics["items"], keyed("items", [item(i) for i in range(1, 21)]))
            publish(broker.service_url, topics["orders"], keyed("orders", [order(n, n % 200 + 1, n % 20 + 1)
                                                                           for n in range(1000)]))
            baseline = [bare_spark_s("local[2]") for _ in range(args.runs)]
            runs, without = [], []
            for run in range(args.runs):  # interleaved, so a busy moment hits both alike
                runs.append(cold_start(broker.service_url, topics, workdir, 2 * run))
                if ARCHIVE.is_file():
                    aside = ARCHIVE.with_suffix(".aside")
                    ARCHIVE.rename(aside)
                    try:
                        without.append(cold_start(broker.service_url, topics, workdir, 2 * run + 1))
                    finally:
                        aside.rename(ARCHIVE)
        finally:
            broker.stop()
    if not runs:
        raise BenchError("no cold start measured")
    median = statistics.median(r["total_s"] for r in runs)
    result = {"measured_at": now_utc(), "machine": machine(), "runs": runs,
              "cold_start_median_s": round(median, 2),
              "bare_spark_median_s": round(statistics.median(baseline), 2),
              "cold_start_vs_bare_spark": round(median / statistics.median(baseline), 2),
              "class_archive": ARCHIVE.is_file(), "runs_without_class_archive": without,
              "cold_start_without_class_archive_median_s":
                  round(statistics.median(r["total_s"] for r in without), 2) if without else None}
    print(f"{'phase':<40}" + "".join(f"{'run ' + str(i + 1):>10}" for i in range(len(runs))))
    for phase in runs[0]["job_phases_s"]:
        print(f"{'job: ' + phase:<40}" + "".join(f"{r['job_phases_s'].get(phase, 0):>10.2f}" for r in runs))
    for label, key in (("job_started to first trigger", "query_start_to_first_trigger_s"),
                       ("first batch", "first_batch_s"), ("spawn to first commit", "total_s")):
        print(f"{label:<40}" + "".join(f"{r[key]:>10.2f}" for r in runs))
    for phase in runs[0]["first_batch_phases_ms"]:
        print(f"{'  first batch ' + phase + ' (ms)':<40}" + "".join(f"{r['first_batch_phases_ms'].get(phase, 0):>10}" for r in runs))
    print(f"baseline: bare PySpark session + one job {result['bare_spark_median_s']:.2f}s; "
          f"cold start {median:.2f}s ({result['cold_start_vs_bare_spark']:.2f}x)")
    if without:
        print(f"without the class archive: spawn to first commit {result['cold_start_without_class_archive_median_s']:.2f}s, "
              f"Spark session {statistics.median(r['job_phases_s']['spark_session'] for r in without):.2f}s "
              f"(with it: {statistics.median(r['job_phases_s']['spark_session'] for r in runs):.2f}s)")
    write_result("startup", result)
    return result


if __name__ == "__main__":
    main()
