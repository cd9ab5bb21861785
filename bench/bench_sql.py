"""SQL pipelines' throughput: rows/s of the seed's count and three-way join at 1M keys, beside the job.

One run, one embedded broker, one SparkSession (``local[2]``):

1. ``user_count_by_account``: ``--keys`` users (10 per account) through GROUP BY COUNT;
2. ``user_favorite_color_and_cheese``: ``--keys`` users, colours and cheeses (3 × keys messages)
   through the three-way LEFT JOIN;
3. ``named_users``: the ``--keys`` users through WHERE and a projection (filter and project), the
   nine in ten the WHERE lets through;
4. the enrichment job on ``--orders`` orders (bench_throughput's workload), as the baseline, and
   the job's source and parse step alone on them (bench_throughput's stateless ceiling), which
   the filter and project is set beside.

A figure is source rows over the summed durations of the batches that carried them, the first
(warm-up) batch excluded, as bench_throughput measures the job. Each pipeline must end with the
exact result (one row per account / per user), or the run fails. Prints a table and writes
``bench/results/sql.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench.common import BenchError, guard, machine, now_utc, work_dir, write_result  # noqa: E402

SQL = ROOT / "data" / "sql"


def publish_all(url: str, topic: str, messages) -> int:
    """Send (key, payload) pairs as fast as the broker takes them; wait for every ack."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    refused = []
    sent = 0
    try:
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                          batching_max_messages=1000, block_if_queue_full=True,
                                          max_pending_messages=20_000)
        for key, payload in messages:
            producer.send_async(payload, lambda result, _id: result == pulsar.Result.Ok or refused.append(result),
                                partition_key=key)
            sent += 1
        producer.flush()
    finally:
        client.close()
    if refused:
        raise BenchError(f"the broker refused {len(refused)} messages to {topic}")
    return sent


def users(keys: int):
    for i in range(keys):
        uid = f"{i // 10}-{i % 10}"
        yield uid, f'{{"uid":"{uid}","accountId":"{i // 10}","id":{i % 10},"fullName":"user {i}","op":"c"}}'.encode()


def sides(keys: int, field: str, values: tuple[str, ...]):
    for i in range(keys):
        uid = f"{i // 10}-{i % 10}"
        yield uid, f'{{"userUid":"{uid}","{field}":"{values[i % len(values)]}","op":"c"}}'.encode()


def run_pipeline(spark, settings, sql_file: Path, name: str, topics: dict, rows: int, expected_keys: int,
                 timeout_s: float) -> dict:
    """Run one pipeline until it has read ``rows`` rows and shows ``expected_keys`` result rows."""
    import duckdb

    from app.sql_queries import current_result
    from pipeline import store
    from pipeline.metrics import read_rows
    from pipeline.sql.plan import build_plan
    from pipeline.sql.runner import run_sql_pipeline

    plan = build_plan(sql_file.read_text(), topics)
    stop, errors = threading.Event(), []
    thread = threading.Thread(target=lambda: guard(run_sql_pipeline, errors, settings, plan, name, stop=stop, spark=spark),
                              daemon=True)
    root = store.sql_dir(settings.data_dir, name)
    started = time.perf_counter()
    thread.start()
    try:
        while sum(p["rows_in"] for p in read_rows(root, "progress")) < rows:
            if errors:
                raise errors[0]
            if time.perf_counter() - started > timeout_s:
                raise BenchError(f"{name} read fewer than {rows:,} rows in {timeout_s:.0f}s")
            time.sleep(1)
        wall = time.perf_counter() - started
    finally:
        stop.set()
        thread.join(timeout=120)
    with duckdb.connect() as con:
        result_rows = len(current_result(con, settings.data_dir, name))
    if result_rows != expected_keys:
        raise BenchError(f"{name} ended with {result_rows:,} result rows; expected {expected_keys:,}")
    progress = [p for p in read_rows(root, "progress") if p["rows_in"]]
    steady = progress[1:] or progress
    seconds = sum(p["batch_duration_ms"] for p in steady) / 1000
    steady_rows = sum(p["rows_in"] for p in steady)
    return {"rows": rows, "result_rows": result_rows, "rows_per_s": steady_rows / seconds if seconds else 0.0,
            "batches": len(steady), "mean_batch_rows": steady_rows / len(steady) if steady else 0,
            "wall_s_including_start_up": round(wall, 1), "load_average": os.getloadavg()}


def measure(args, work: Path) -> dict:
    """Publish the keys, run each pipeline and the job on them in ``work``; the figures."""
    from pipeline.feed.broker import EmbeddedBroker
    from pipeline.config import load_settings
    from pipeline.runtime.spark import build_spark

    figures: dict = {"when": now_utc(), "machine": machine(), "keys": args.keys, "max_rows_per_batch": args.max_rows,
                     "topic_sender": args.topic_sender}
    with EmbeddedBroker(work / "broker") as broker:
        url = broker.service_url
        topics = {t: f"persistent://public/default/bench-sql-{t}" for t in (
            "users", "user_favorite_color", "user_favorite_cheese", "user_count_by_account",
            "user_favorite_color_and_cheese", "named_users")}
        print(f"publishing {args.keys:,} users, colours and cheeses…", flush=True)
        started = time.perf_counter()
        sent = publish_all(url, topics["users"], users(args.keys))
        sent += publish_all(url, topics["user_favorite_color"], sides(args.keys, "favoriteColor", ("blue", "red", "green")))
        sent += publish_all(url, topics["user_favorite_cheese"], sides(args.keys, "favoriteCheese", ("brie", "cheddar")))
        figures["publish_msgs_per_s"] = sent / (time.perf_counter() - started)
        settings = load_settings(env={}, cli={"pulsar.service_url": url, "paths.data_dir": str(work / "data"),
                                              "spark.master": "local[2]", "job.max_rows_per_batch": args.max_rows,
                                              "sql.topic_sender": args.topic_sender})
        spark = build_spark(settings, app_name="bench-sql")
        if "count" not in args.skip:
            print("count…", flush=True)
            figures["count"] = run_pipeline(spark, settings, SQL / "user_count_by_account.sql", "count", topics,
                                            args.keys, (args.keys + 9) // 10, args.timeout)
            print(f"  {figures['count']['rows_per_s']:,.0f} rows/s", flush=True)
        if "join" not in args.skip:
            print("three-way join…", flush=True)
            figures["join"] = run_pipeline(spark, settings, SQL / "user_favorite_color_and_cheese.sql", "join",
                                           topics, 3 * args.keys, args.keys, args.timeout)
            print(f"  {figures['join']['rows_per_s']:,.0f} rows/s", flush=True)
        if "filter" not in args.skip:
            print("filter and project…", flush=True)
            figures["filter"] = run_pipeline(spark, settings, SQL / "named_users.sql", "filter", topics, args.keys,
                                             args.keys - (args.keys + 9) // 10, args.timeout)  # id 0 filtered out
            print(f"  {figures['filter']['rows_per_s']:,.0f} rows/s", flush=True)
        if args.orders:
            from bench.bench_throughput import generate, job_run, load_topics

            print(f"enrichment job on {args.orders:,} orders (baseline)…", flush=True)
            job_topics = {kind: f"persistent://public/default/bench-sql-job-{kind}" for kind in ("users", "items", "orders")}
            load_topics(url, job_topics, generate(max(1, args.orders // 2), 2_000, args.orders, seed=7))
            job_settings = load_settings(env={}, cli={
                "pulsar.service_url": url, "paths.data_dir": str(work / "job"), "spark.master": "local[2]",
                "enrichment.max_wait": "0s", "job.max_rows_per_batch": args.max_rows,
                **{f"topics.{k}": v for k, v in job_topics.items()}})
            figures["job"] = job_run(job_settings, args.orders, timeout_s=args.timeout)
            print(f"  {figures['job']['orders_per_s']:,.0f} orders/s", flush=True)
            if "stateless" not in args.skip:
                from bench.bench_throughput import stateless_baseline

                print("the job's source and parse step alone (stateless ceiling)…", flush=True)
                stateless = stateless_baseline(spark, url, job_topics, work, args.orders, args.max_rows,
                                               timeout_s=args.timeout)
                figures["stateless"] = {key: stateless[key] for key in ("orders_per_s", "batches", "mean_batch_rows")
                                        if key in stateless} | {"load_average": os.getloadavg()}
                print(f"  {figures['stateless']['orders_per_s']:,.0f} rows/s", flush=True)
        spark.stop()
    return figures


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="users (and colours, cheeses) per pipeline")
    parser.add_argument("--orders", type=int, default=200_000, help="orders for the job's baseline (0 = skip it)")
    parser.add_argument("--max-rows", type=int, default=200_000, help="job.max_rows_per_batch")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per measurement")
    parser.add_argument("--topic-sender", choices=["python", "jvm"], default="python",
                        help="sql.topic_sender: what sends the pipelines' result rows to their topics")
    parser.add_argument("--skip", action="append", choices=["count", "join", "filter", "stateless"], default=[],
                        help="leave a pipeline out (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the broker and the data dirs (their path is printed)")
    args = parser.parse_args(argv)
    with work_dir("bench-sql-", args.keep) as work:  # 0.6 to 0.8 GB of broker data, checkpoints and sinks
        figures = measure(args, work)
    pipelines = [name for name in ("count", "join", "filter") if name in figures]
    for name in pipelines:
        if "job" in figures:
            figures[f"{name}_vs_job"] = figures[name]["rows_per_s"] / figures["job"]["orders_per_s"]
    if "filter" in figures and "stateless" in figures:
        figures["filter_vs_stateless"] = figures["filter"]["rows_per_s"] / figures["stateless"]["orders_per_s"]
    print("\n| pipeline | rows | rows/s |\n| --- | --- | --- |")
    for name in pipelines:
        print(f"| {name} | {figures[name]['rows']:,} | {figures[name]['rows_per_s']:,.0f} |")
    if "job" in figures:
        print(f"| enrichment job (baseline) | {args.orders:,} orders | {figures['job']['orders_per_s']:,.0f} |")
    if "stateless" in figures:
        print(f"| job's source and parse alone | {args.orders:,} orders | {figures['stateless']['orders_per_s']:,.0f} |")
    path = write_result("sql", figures)
    print(f"wrote {path}")
    return json.loads(path.read_text())


if __name__ == "__main__":
    main()
