"""Throughput: sustained orders/s end to end, beside two baselines measured in the same run.

One embedded broker is loaded with generated users, items and orders (pipeline/datagen.py).
Then, on the same machine and the same data:

- **python**: a plain pulsar-client consumer that reads the changelogs into dicts and enriches
  every order from them (no Spark, no state store, no sinks);
- **stateless**: our Pulsar source and parse step into a foreachBatch that only collects (no
  state, no sinks): the ceiling of the Spark plumbing;
- **job**: the real job (`pipeline.job.run_forever`), from the first batch to the last order
  committed in the sinks.

Sustained rate = order rows / summed batch durations over the batches that carried orders,
the first (warm-up) batch excluded. Prints a table and writes ``bench/results/throughput.json``.

    python -m bench.bench_throughput                       # 100k users, 2k items, 200k orders
    python -m bench.bench_throughput --users 1000000 --items 10000 --orders 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import guard, table_records  # noqa: E402
from pipeline import wire  # noqa: E402
from pipeline.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.producers import publish_records  # noqa: E402
from pipeline.topics import make_client  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "throughput.json"


def load_topics(url: str, topics: dict, tables: dict) -> dict:
    client = make_client(url)
    counts = {}
    try:
        for kind, stem in (("users", "users"), ("items", "items"), ("orders", "orders")):
            started = time.perf_counter()
            stats = publish_records(client, topics[kind], kind, table_records(tables[stem]))
            counts[kind] = stats.sent
            print(f"published {stats.sent:,} {kind} in {time.perf_counter() - started:.1f}s", flush=True)
    finally:
        client.close()
    return counts


def python_baseline(url: str, topics: dict, orders: int) -> dict:
    """Read the changelogs into dicts, then enrich every order from them."""
    import pulsar

    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    state: dict[str, dict] = {"users": {}, "items": {}}
    started = time.perf_counter()
    for kind in ("users", "items"):
        reader = client.create_reader(topics[kind], pulsar.MessageId.earliest, receiver_queue_size=5000)
        while True:
            try:
                message = reader.read_next(500)
            except pulsar.Timeout:
                break
            record = wire.parse_payload(kind, message.data())
            if record is not None:
                state[kind][record["id"]] = record
    state_loaded = time.perf_counter()
    reader = client.create_reader(topics["orders"], pulsar.MessageId.earliest, receiver_queue_size=5000)
    enriched = missing = 0
    for _ in range(orders):
        order = wire.parse_payload("orders", reader.read_next(10_000).data())
        user, item = state["users"].get(order["userId"]), state["items"].get(order["itemId"])
        if user and item:
            enriched += 1
            _row = (order["invoiceId"], user["firstName"], user["emailAddress"], item["name"], item["price"])
        else:
            missing += 1
    done = time.perf_counter()
    client.close()
    return {"orders_per_s": orders / (done - state_loaded), "state_load_s": state_loaded - started,
            "enriched": enriched, "missing": missing}


def sustained(progress: list[dict]) -> dict:
    """Order rows over summed batch durations, warm-up batch excluded."""
    carrying = [p for p in progress if any(t["topic"] == "orders" and t["rows"] for t in p["topics"])]
    steady = carrying[1:] or carrying
    rows = sum(t["rows"] for p in steady for t in p["topics"] if t["topic"] == "orders")
    seconds = sum(p["batch_duration_ms"] for p in steady) / 1000
    return {"orders_per_s": rows / seconds if seconds else 0.0, "batches": len(steady),
            "mean_batch_rows": rows / len(steady) if steady else 0}


def stateless_baseline(spark, url: str, topics: dict, work: Path, orders: int, max_rows: int) -> dict:
    from pipeline.enrich.parse import parser
    from pipeline.enrich.chunks import USER_CHUNKS, unchunk_batches
    from pipeline.enrich.rules import ENVELOPE_SPARK_SCHEMA
    from pipeline.source.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
    seen = [0]

    def collect(df, batch_id):
        seen[0] += df.toArrow().num_rows

    source = (spark.readStream.format("pulsar").option("service_url", url)
              .option("topics", f"orders={topics['orders']}").option("maxRowsPerBatch", max_rows).load())
    envelopes = source.mapInArrow(parser(64), USER_CHUNKS).mapInArrow(unchunk_batches, ENVELOPE_SPARK_SCHEMA)
    query = (envelopes.writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(work / "stateless-ck")).trigger(processingTime="1 second").start())
    while seen[0] < orders:
        if query.exception():
            raise RuntimeError(str(query.exception()))
        time.sleep(0.5)
    progress = query.recentProgress
    query.stop()
    rows = [{"topics": [{"topic": "orders", "rows": p["numInputRows"]}], "batch_duration_ms": p["batchDuration"]}
            for p in progress if p["numInputRows"]]
    return sustained(rows)


def job_run(settings, orders: int) -> dict:
    from pipeline.job import run_forever

    sys.path.insert(0, str(ROOT / "tests"))
    from sinkread import orders_done

    stop = threading.Event()
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: guard(run_forever, errors, settings, stop=stop), daemon=True)
    started = time.perf_counter()
    thread.start()
    while orders_done(settings.data_dir) < orders:
        if errors:
            raise errors[0]
        time.sleep(1)
    wall = time.perf_counter() - started
    stop.set()
    thread.join(timeout=120)
    figures = sustained(read_rows(settings.data_dir, "progress"))
    figures["wall_s_including_start_up"] = wall
    return figures


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--max-rows", type=int, default=50_000)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    tables = generate(args.users, args.items, args.orders, seed=7)
    topics = {kind: f"persistent://public/default/bench-{kind}" for kind in ("users", "items", "orders")}
    try:
        with EmbeddedBroker(work / "data") as broker:
            counts = load_topics(broker.service_url, topics, tables)
            print("python baseline…", flush=True)
            python = python_baseline(broker.service_url, topics, counts["orders"])
            settings = load_settings(env={}, cli={
                "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"),
                "spark.master": "local[2]", "enrichment.max_wait": "0s", "job.max_rows_per_batch": args.max_rows,
                **{f"topics.{k}": v for k, v in topics.items()}})
            from pipeline.spark import build_spark

            spark = build_spark(settings)
            print("stateless Spark baseline…", flush=True)
            stateless = stateless_baseline(spark, broker.service_url, topics, work, counts["orders"], args.max_rows)
            print("the job…", flush=True)
            job = job_run(settings, counts["orders"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average": os.getloadavg()},
        "workload": {"users": counts["users"], "items": counts["items"], "orders": counts["orders"],
                     "max_rows_per_batch": args.max_rows},
        "python_consumer": python, "stateless_spark": stateless, "job": job,
        "job_vs_stateless": job["orders_per_s"] / stateless["orders_per_s"] if stateless["orders_per_s"] else None,
        "job_vs_python": job["orders_per_s"] / python["orders_per_s"] if python["orders_per_s"] else None,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\n{'figure':<34}{'orders/s':>12}")
    for name, figures in (("job (end to end, sustained)", job), ("stateless Spark ceiling", stateless),
                          ("plain Python consumer", python)):
        print(f"{name:<34}{figures['orders_per_s']:>12,.0f}")
    print(f"job / stateless = {result['job_vs_stateless']:.2f}, job / python = {result['job_vs_python']:.3f}")
    return result


if __name__ == "__main__":
    main()
