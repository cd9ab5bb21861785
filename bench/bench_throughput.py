"""Throughput: sustained orders/s end to end, beside two baselines measured in the same run.

One embedded broker is loaded with generated users, items and orders (pipeline/feed/datagen.py).
Then, on the same machine and the same data:

- **python**: a plain pulsar-client consumer that reads the changelogs into dicts and enriches
  every order from them (no Spark, no state store, no sinks);
- **stateless**: our Pulsar source and parse step into a foreachBatch that only collects (no
  state, no sinks): the ceiling of the Spark plumbing;
- **job**: the real job (`pipeline.job.run_forever`), measured as the plain consumer is: the
  changelogs first (the job runs on the users and items, and on an orders topic with nothing
  in it yet, until it has read every changelog message, and is stopped), then the same orders
  are published to that topic and the job is started again on its checkpoint, with the 1M
  users in its state; its rate is that second run's, from its first batch to the last order
  committed in the sinks;
- **job, changelogs interleaved**: the real job on the topics as loaded, so its batches read
  the changelogs and the orders together (the broker shares each batch between the topics),
  and the time it spends loading the users counts against its orders/s. The figure the
  earlier stops reported; the baselines above leave the state load out.

Sustained rate = order rows / summed batch durations over the batches that carried orders,
the first (warm-up) batch excluded: for the job, the batch that restores its state. Prints a
table and writes ``bench/results/throughput.json``.

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

from bench.common import BenchError, guard, table_records  # noqa: E402  (also puts tests/ on sys.path)
from pipeline import wire  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import KEYS_BY_NAME, load_settings  # noqa: E402
from pipeline.feed.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.feed.producers import publish_records  # noqa: E402
from pipeline.feed.topics import make_client  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "throughput.json"


def load_topics(url: str, topics: dict, tables: dict, batching: bool = True) -> dict:
    """Publish each kind's table to its topic (``topics``: kind -> topic, in publishing order):
    batched as our producers do, or, with ``batching=False``, as pulsar-client does by default
    (every message an entry of its own; bench_backlog.py)."""
    client = make_client(url)
    counts = {}
    try:
        for kind, topic in topics.items():
            started = time.perf_counter()
            if batching:
                counts[kind] = publish_records(client, topic, kind, table_records(tables[kind])).sent
            else:
                counts[kind] = publish_unbatched(client, topic, kind, table_records(tables[kind]))
            print(f"published {counts[kind]:,} {kind} ({'batched' if batching else 'unbatched'}) "
                  f"in {time.perf_counter() - started:.1f}s", flush=True)
    finally:
        client.close()
    return counts


def publish_unbatched(client, topic: str, kind: str, records) -> int:
    """Send ``records`` with pulsar-client's default producer (no batching) and ``send_async``,
    waiting when its queue is full; returns the count, once every message is acknowledged.
    Each record is checked with ``wire.parse_record`` first, as ``publish_records`` does."""
    import pulsar

    acked, refused = threading.Semaphore(0), []

    def on_ack(result, _message_id) -> None:  # on the client's I/O thread
        if result != pulsar.Result.Ok:
            refused.append(str(result))
        acked.release()

    producer = client.create_producer(topic, block_if_queue_full=True)
    sent = 0
    try:
        for raw in records:
            record = wire.parse_record(kind, raw)
            producer.send_async(wire.encode(record), on_ack, partition_key=wire.message_key(kind, record))
            sent += 1
        producer.flush()
        for _ in range(sent):
            if not acked.acquire(timeout=60):
                raise BenchError(f"{topic}: no acknowledgement for 60 s, {sent:,} messages sent")
    finally:
        producer.close()
    if refused:
        raise BenchError(f"{topic}: the broker refused {len(refused):,} of {sent:,} messages, e.g. {refused[0]}")
    return sent


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


PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


def sustained(progress: list[dict]) -> dict:
    """Order rows over summed batch durations, warm-up batch excluded."""
    carrying = [p for p in progress if any(t["topic"] == "orders" and t["rows"] for t in p["topics"])]
    steady = carrying[1:] or carrying
    rows = sum(t["rows"] for p in steady for t in p["topics"] if t["topic"] == "orders")
    seconds = sum(p["batch_duration_ms"] for p in steady) / 1000
    return {"orders_per_s": rows / seconds if seconds else 0.0, "batches": len(steady),
            "mean_batch_rows": rows / len(steady) if steady else 0}


def phase_means(progress: list[dict]) -> dict:
    """Mean milliseconds per batch of each phase Spark reports (``durationMs``), warm-up excluded."""
    steady = [p for p in progress if p.get("numInputRows")][1:]
    return {phase: round(sum(p["durationMs"].get(phase, 0) for p in steady) / len(steady), 1)
            for phase in PHASES} if steady else {}


def stateless_baseline(spark, url: str, topics: dict, work: Path, orders: int, max_rows: int,
                       read_tasks: int = 4, timeout_s: float = 1800) -> dict:
    """Our source and parse step alone, as the job reads: ``source (transform=parse_batches) -> no-op foreachBatch``.

    The foreachBatch runs the batch through Spark's ``noop`` writer: every row is read and
    parsed on the executors, nothing is collected or written; a batch holds up to ``max_rows``
    broker entries, read in ``read_tasks`` tasks (the job's: two per core, ``splitRows``).
    """
    from pipeline.enrich.rules import ENVELOPE_SPARK_SCHEMA
    from pipeline.source.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)

    def discard(df, batch_id):
        df.write.format("noop").mode("overwrite").save()

    envelopes = (spark.readStream.format("pulsar").schema(ENVELOPE_SPARK_SCHEMA).option("service_url", url)
                 .option("topics", f"orders={topics['orders']}").option("maxRowsPerBatch", max_rows)
                 .option("splitRows", max(1, max_rows // read_tasks))
                 .option("transform", "pipeline.enrich.parse:parse_batches").load())
    query = (envelopes.writeStream.foreachBatch(discard)
             .option("checkpointLocation", str(work / "stateless-ck")).trigger(processingTime="1 second").start())
    deadline = time.monotonic() + timeout_s
    try:
        while sum(p["numInputRows"] for p in query.recentProgress) < orders:
            if query.exception():
                raise RuntimeError(str(query.exception()))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the stateless query read fewer than {orders} rows in {timeout_s:.0f}s")
            time.sleep(0.5)
        progress = query.recentProgress
    finally:
        query.stop()
    rows = [{"topics": [{"topic": "orders", "rows": p["numInputRows"]}], "batch_duration_ms": p["batchDuration"]}
            for p in progress if p["numInputRows"]]
    figures = sustained(rows)
    figures["phases_ms"] = phase_means(progress)
    sample = [p for p in progress if p["numInputRows"]][-1]  # one batch's whole progress, to read by eye
    figures["sample_progress"] = json.loads(sample.json) if hasattr(sample, "json") else dict(sample)
    end = json.loads(progress[-1]["sources"][0]["endOffset"])  # positions count broker entries
    entries = sum(part["n"] for topic in end.values() for part in topic["parts"].values())
    figures["orders_per_entry"] = round(sum(p["numInputRows"] for p in progress) / max(1, entries), 1)
    figures["batch_ms"] = round(sum(p["batchDuration"] for p in progress if p["numInputRows"]) /
                                max(1, len([p for p in progress if p["numInputRows"]])), 1)
    return figures


def run_job_until(settings, done, what: str, timeout_s: float = 3600) -> float:
    """Run the job in a thread until ``done()`` holds, then stop it; the seconds it ran."""
    from pipeline.job import run_forever

    stop = threading.Event()
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: guard(run_forever, errors, settings, stop=stop), daemon=True)
    started = time.perf_counter()
    thread.start()
    try:
        while not done():
            if errors:
                raise errors[0]
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the job did not {what} in {timeout_s:.0f}s")
            time.sleep(1)
    finally:
        wall = time.perf_counter() - started
        stop.set()
        thread.join(timeout=120)
    return wall


def changelog_rows_read(data_dir: Path) -> int:
    return sum(t["rows"] for p in read_rows(data_dir, "progress") for t in p["topics"] if t["topic"] != "orders")


def job_with_state_loaded(settings, url: str, topic: str, tables: dict, counts: dict) -> dict:
    """The job measured as the plain consumer is: it loads the changelogs, is stopped, and is
    started again on its checkpoint once the orders are on ``topic`` (empty until then)."""
    from sinkread import count, orders_done

    changelogs = counts["users"] + counts["items"]
    load_s = run_job_until(settings, lambda: changelog_rows_read(settings.data_dir) >= changelogs,
                           f"read {changelogs:,} changelog messages")
    loaded = read_rows(settings.data_dir, "progress")
    load_topics(url, {"orders": topic}, tables)
    wall = run_job_until(settings, lambda: orders_done(settings.data_dir) >= counts["orders"],
                         f"commit {counts['orders']:,} orders")
    last_loading_batch = max((p["batch_id"] for p in loaded), default=-1)
    figures = job_figures([p for p in read_rows(settings.data_dir, "progress") if p["batch_id"] > last_loading_batch],
                          wall)
    figures["state_load_s"] = round(load_s, 1)
    # as the plain consumer counts them: a restart that lost the state would send every order to missing
    figures["enriched"], figures["missing"] = count(settings.data_dir, "enriched"), count(settings.data_dir, "missing_state")
    return figures


def job_run(settings, orders: int, timeout_s: float = 3600) -> dict:
    from sinkread import orders_done

    wall = run_job_until(settings, lambda: orders_done(settings.data_dir) >= orders, f"commit {orders:,} orders",
                         timeout_s)
    return job_figures(read_rows(settings.data_dir, "progress"), wall)


def job_figures(progress: list[dict], wall_s: float) -> dict:
    """The sustained rate and mean phases of the job's progress rows, and its wall time."""
    figures = sustained(progress)
    figures["phases_ms"] = phase_means([{"numInputRows": p["num_input_rows"], "durationMs": p["duration_ms"]}
                                        for p in progress])
    figures["wall_s_including_start_up"] = wall_s
    return figures


def capture_stderr(path: Path) -> int:
    """Send this process's stderr (and the JVM's and its Python workers', started after this) to a
    file; returns a copy of the old stderr for :func:`restore_stderr`.

    Stalls are logged there by the range readers on the executors; the benchmark counts them.
    """
    saved = os.dup(2)
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(handle, 2)
    os.close(handle)
    return saved


def restore_stderr(saved: int) -> None:
    os.dup2(saved, 2)
    os.close(saved)


def count_lines(path: Path, needle: str) -> int:
    try:
        return sum(needle in line for line in path.read_text(errors="replace").splitlines())
    except OSError:
        return 0


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--orders", type=int, default=200_000)
    parser.add_argument("--max-rows", type=int, default=KEYS_BY_NAME["job.max_rows_per_batch"].default,
                        help="job.max_rows_per_batch: messages a batch (the job's default)")
    parser.add_argument("--read-tasks", type=int, default=4,
                        help="read tasks a full batch of the stateless step is cut into (the job's: 2 per core)")
    parser.add_argument("--skip", action="append", choices=["python", "stateless", "job", "interleaved"], default=[],
                        help="leave a measurement out (repeatable)")
    parser.add_argument("--log", type=Path, help="where Spark's and the readers' stderr go (default: a temp file)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    log_path = args.log or work.parent / f"{work.name}.log"
    tables = generate(args.users, args.items, args.orders, seed=7)
    topics = {kind: f"persistent://public/default/bench-{kind}" for kind in ("users", "items", "orders")}
    load_before = os.getloadavg()
    python = stateless = job = interleaved = None
    saved_stderr = None
    try:
        with EmbeddedBroker(work / "data") as broker:
            counts = load_topics(broker.service_url, topics, tables)
            if "python" not in args.skip:
                print("python baseline…", flush=True)
                python = python_baseline(broker.service_url, topics, counts["orders"])
                print(f"  {python['orders_per_s']:,.0f} orders/s", flush=True)
            job_config = {
                "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"),
                "spark.master": "local[2]", "enrichment.max_wait": "0s", "job.max_rows_per_batch": args.max_rows,
                **{f"topics.{k}": v for k, v in topics.items()}}
            settings = load_settings(env={}, cli=job_config)
            from pipeline.runtime.spark import build_spark

            print(f"Spark's stderr goes to {log_path}", flush=True)
            saved_stderr = capture_stderr(log_path)
            spark = build_spark(settings)
            if "stateless" not in args.skip:
                print("stateless Spark baseline…", flush=True)
                stalls_before = count_lines(log_path, "stalled")
                stateless = stateless_baseline(spark, broker.service_url, topics, work, counts["orders"], args.max_rows,
                                               args.read_tasks)
                stateless["reader_stalls"] = count_lines(log_path, "stalled") - stalls_before
                print(f"  {stateless['orders_per_s']:,.0f} rows/s", flush=True)
            if "job" not in args.skip:
                print("the job: the changelogs, then the orders…", flush=True)
                stalls_before = count_lines(log_path, "stalled")
                job_topic = f"{topics['orders']}-after-state"
                job_settings = load_settings(env={}, cli={
                    **job_config, "paths.data_dir": str(work / "job"), "topics.orders": job_topic})
                job = job_with_state_loaded(job_settings, broker.service_url, job_topic, tables, counts)
                job["reader_stalls"] = count_lines(log_path, "stalled") - stalls_before
                print(f"  {job['orders_per_s']:,.0f} orders/s (state loaded in {job['state_load_s']:.0f}s; "
                      f"{job['enriched']:,} enriched, {job['missing']:,} missing)", flush=True)
            if "interleaved" not in args.skip:
                print("the job, changelogs and orders interleaved…", flush=True)
                stalls_before = count_lines(log_path, "stalled")
                interleaved = job_run(settings, counts["orders"])
                interleaved["reader_stalls"] = count_lines(log_path, "stalled") - stalls_before
                print(f"  {interleaved['orders_per_s']:,.0f} orders/s", flush=True)
    finally:
        if saved_stderr is not None:
            restore_stderr(saved_stderr)
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a, b):
        return a["orders_per_s"] / b["orders_per_s"] if a and b and b["orders_per_s"] else None

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": os.getloadavg()},
        "workload": {"users": counts["users"], "items": counts["items"], "orders": counts["orders"],
                     "max_rows_per_batch": args.max_rows, "stateless_read_tasks": args.read_tasks},
        "python_consumer": python, "stateless_spark": stateless, "job": job, "job_changelogs_interleaved": interleaved,
        "stateless_vs_python": ratio(stateless, python),
        "job_vs_stateless": ratio(job, stateless), "job_vs_python": ratio(job, python),
        "interleaved_vs_job": ratio(interleaved, job),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\n{'figure':<34}{'orders/s':>12}")
    for name, figures in (("job (end to end, sustained)", job), ("job, changelogs interleaved", interleaved),
                          ("stateless Spark ceiling", stateless), ("plain Python consumer", python)):
        if figures:
            print(f"{name:<34}{figures['orders_per_s']:>12,.0f}")
    for name in ("stateless_vs_python", "job_vs_stateless", "job_vs_python", "interleaved_vs_job"):
        if result[name] is not None:
            print(f"{name} = {result[name]:.2f}")
    print(f"load average before {load_before}, after {result['machine']['load_average_after']}")
    return result


if __name__ == "__main__":
    main()
