"""Event time next to processing time, in one run: throughput, p99 latency and state size.

One embedded broker holds one input: users (each updated ``--updates`` times), items and a
backlog of ``--orders`` orders, all with producer event times on one timeline (orders' ``createdAt``
is their event time). The same input is read by the job twice, each time as a real
``python -m pipeline run`` process (local[2]) on its own data dir: once with
``enrichment.time = processing``, once with ``event`` (out-of-orderness 1 s). For each:

- **throughput**: orders decided per second while draining the backlog, from the job's first
  progress row to the moment every order is in a sink;
- **latency**: then orders at a steady ``--rate`` for ``--seconds`` (event time = now, with a
  user update every 50 ms so the changelogs' watermarks move), and per enriched order
  ``enriched_at - published_at`` (the console's latency), p50 and p99;
- **state**: Spark's state rows and memory per lookup, and the checkpoint's state folder, from the
  last progress row.

Prints a table and writes ``bench/results/event_time.json``.

    python -m bench.bench_event_time                       # 20k orders, 400/s for 20 s
    python -m bench.bench_event_time --orders 5000 --seconds 10
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, bench_topics, machine, now_utc, percentile, start_job,  # noqa: E402
                          wait_until, write_result)
from pipeline import store, wire  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from factories import item, order, user  # noqa: E402  (tests/ is on the path through bench.common)
from sinkread import orders_done, rows  # noqa: E402


def backlog(users: int, items: int, orders: int, updates: int, start_ms: int) -> dict[str, list]:
    """(key, payload, event time) per topic on one timeline that ends before ``start_ms`` + span."""
    span = 600_000
    step = span / max(1, orders)
    out = {"users": [], "items": [], "orders": []}
    for n in range(users * (1 + updates)):
        uid = n % users + 1
        out["users"].append((str(uid), wire.encode(user(uid, firstName=f"V{n // users}")), start_ms + int(n * span / (users * (1 + updates)))))
    for i in range(1, items + 1):
        out["items"].append((str(i), wire.encode(item(i)), start_ms + i))
    for n in range(orders):
        at = start_ms + 5_000 + int(n * step)
        out["orders"].append((f"o{n}", wire.encode(order(n, n % (users + 10) + 1, n % items + 1, createdAt=at)), at))
    out["users"].append(("1", wire.encode(user(1)), start_ms + span + 60_000))  # moves both watermarks past the backlog
    out["items"].append(("1", wire.encode(item(1)), start_ms + span + 60_000))
    return out


def publish(client, topic: str, messages, rate: float = 0.0) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                      block_if_queue_full=True)
    started = time.monotonic()
    for n, (key, payload, at) in enumerate(messages):
        if rate:
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.send_async(payload, None, partition_key=key, event_timestamp=at)
    producer.flush()
    producer.close()


def steady(client, topics: dict, first: int, rate: float, seconds: float, users: int, items: int) -> int:
    """Orders at ``rate`` for ``seconds`` (and a user update every 50 ms); returns how many."""
    import threading

    count = int(rate * seconds)
    done = threading.Event()

    def heartbeat():
        producer = client.create_producer(topics["users"])
        n = 0
        while not done.is_set():
            now = int(time.time() * 1000)
            producer.send(wire.encode(user(n % users + 1, firstName=f"S{n}")), partition_key=str(n % users + 1),
                          event_timestamp=now)
            n += 1
            done.wait(0.05)
        producer.close()

    def items_heartbeat():
        producer = client.create_producer(topics["items"])
        n = 0
        while not done.is_set():
            producer.send(wire.encode(item(n % items + 1)), partition_key=str(n % items + 1),
                          event_timestamp=int(time.time() * 1000))
            n += 1
            done.wait(0.05)
        producer.close()

    beats = [threading.Thread(target=heartbeat, daemon=True), threading.Thread(target=items_heartbeat, daemon=True)]
    for beat in beats:
        beat.start()
    producer = client.create_producer(topics["orders"], batching_enabled=True, batching_max_publish_delay_ms=5)
    started = time.monotonic()
    for n in range(count):
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = int(time.time() * 1000)
        record = order(first + n, n % users + 1, n % items + 1, createdAt=now)
        producer.send_async(wire.encode(record), None, partition_key=f"o{first + n}", event_timestamp=now)
    producer.flush()
    producer.close()
    time.sleep(2.0)  # the heartbeats carry the watermarks past the last orders
    done.set()
    for beat in beats:
        beat.join()
    return count


def run_mode(mode: str, broker, topics: dict, work: Path, args, input_: dict) -> dict:
    import pulsar

    data_dir = work / mode
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(data_dir), "spark.master": "local[2]",
        "job.trigger_interval": "500ms", "enrichment.time": mode, "enrichment.max_wait": "2s",
        "enrichment.out_of_orderness": "1s", "enrichment.idle_timeout": "0s",
        **{f"topics.{k}": v for k, v in topics.items()}})
    log_path = work / f"{mode}.log"
    job = start_job(settings, log_path)
    check = alive(job, log_path)
    try:
        wait_until(lambda: read_rows(data_dir, "progress"), 300, f"{mode}: the first batch", 0.2, check)
        first_ms = read_rows(data_dir, "progress")[0]["ts_ms"]
        wait_until(lambda: orders_done(data_dir) >= args.orders, 900, f"{mode}: the backlog", 0.2, check)
        drained_ms = int(time.time() * 1000)
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            sent = steady(client, topics, args.orders + (0 if mode == "processing" else 10_000_000), args.rate,
                          args.seconds, args.users, args.items)
        finally:
            client.close()
        wait_until(lambda: orders_done(data_dir) >= args.orders + sent, 300, f"{mode}: the steady orders", 0.2, check)
        last = read_rows(data_dir, "progress")[-1]
    finally:
        job.stop()
    first_steady = args.orders + (0 if mode == "processing" else 10_000_000)
    latencies = [(r["enriched_at"] - r["published_at"]).total_seconds() * 1000
                 for r in rows(data_dir, "enriched") if r["invoice_id"] >= first_steady]
    return {
        "mode": mode, "backlog_orders": args.orders,
        "throughput_orders_per_s": round(args.orders / max(0.001, (drained_ms - first_ms) / 1000), 1),
        "steady_rate": args.rate, "steady_orders": sent, "enriched_steady": len(latencies),
        "latency_p50_ms": percentile(latencies, 50), "latency_p99_ms": percentile(latencies, 99),
        "state": [{k: op[k] for k in ("operator", "rows_total", "memory_bytes")} for op in last["state"]],
        "state_size_bytes": last.get("state_size_bytes"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=2_000)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--updates", type=int, default=3, help="versions per user after the first")
    parser.add_argument("--rate", type=float, default=400.0, help="steady orders per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    import pulsar

    work = Path(tempfile.mkdtemp(prefix="bench-event-time-"))
    results = []
    try:
        with EmbeddedBroker(work / "broker") as broker:
            topics = bench_topics("evt")
            input_ = backlog(args.users, args.items, args.orders, args.updates, int(time.time() * 1000) - 3_600_000)
            client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            try:
                for kind in ("users", "items", "orders"):
                    publish(client, topics[kind], input_[kind])
            finally:
                client.close()
            for mode in ("processing", "event"):
                results.append(run_mode(mode, broker, topics, work, args, input_))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'mode':<11} {'orders/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'state rows':>11} {'state MB':>9}")
    for r in results:
        rows_total = sum(op["rows_total"] for op in r["state"])
        size = (r["state_size_bytes"] or 0) / 1e6
        print(f"{r['mode']:<11} {r['throughput_orders_per_s']:>9} {r['latency_p50_ms']:>8} {r['latency_p99_ms']:>8} "
              f"{rows_total:>11} {size:>9.1f}")
    write_result("event_time", {"measured": now_utc(), "machine": machine(), "args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
