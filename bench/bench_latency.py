"""Latency: publish time to sink visibility, p50 and p99, at a steady 2k, 5k and 10k orders/s.

One embedded broker holds generated users and items (pipeline/datagen.py); the real job runs
as a process (``python -m pipeline run``, local[2], default settings) and loads them. Then, for
each rate in turn, orders are published at that steady rate for ``--seconds`` with
``pipeline.producers.publish_records`` (its token bucket), and:

- a **watcher** thread polls ``sinks/enriched`` and ``sinks/missing_state`` every 20 ms and
  records when each ``batch=<id>`` folder first appears: the moment a DuckDB glob reader can
  see its rows (the rename that commits it; the folder's own mtime is its staging time, not
  that). An order's latency is that moment minus its ``published_at`` (the producer's publish
  timestamp, on the same clock);
- the **baseline**, measured at the same time on the same topic, is a plain pulsar-client
  reader: publish to receive, with no Spark. The trigger interval (1 s) is the job's floor.

Before the first rate, a warm-up of ``--warmup-seconds`` at the lowest rate is published and
waited for (the first order batches fill the Python workers' caches from state; that is not
steady state). Latency is over enriched orders published after the first ``--settle``
seconds of each rate (orders for unknown users wait ``enrichment.max_wait`` by design and land
in missing_state; their count is reported). After publishing, the job gets ``--drain`` seconds to catch up;
orders still not visible then count with a lower bound of their latency, and the rate is
marked as not kept up. Prints a table and writes ``bench/results/latency.json``.

    python -m bench.bench_latency                                  # 2k, 5k, 10k orders/s, 30 s each
    python -m bench.bench_latency --rates 2000 --seconds 20        # a quick look
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, bench_topics, guard, iter_records, machine, now_utc,  # noqa: E402
                          percentile, ratio, start_job, table_records, wait_until, write_result)
from pipeline import store  # noqa: E402
from pipeline.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.producers import publish_records  # noqa: E402
from pipeline.topics import make_client  # noqa: E402

NAME = "latency"
POLL_S = 0.02
ORDER_SINKS = ("enriched", "missing_state")


class SinkWatcher:
    """Records when each committed batch folder of the order sinks first becomes visible.

    ``batches`` maps (sink, batch id) to (seen at, epoch ms; published_at of its rows, epoch ms);
    ``line_items`` counts every visible order line (datagen's ``lineItemId`` is unique).
    """

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.batches: dict[tuple[str, int], tuple[int, list[int]]] = {}
        self.line_items: Counter = Counter()
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=guard, args=(self._run, self.errors), name="sink-watcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import pyarrow.parquet as pq

        while not self.stop.is_set():
            for sink in ORDER_SINKS:
                folder = store.sink_dir(self.data_dir, sink)
                try:
                    names = [n for n in os.listdir(folder) if n.startswith("batch=")]
                except FileNotFoundError:
                    continue
                for name in names:
                    batch_id = int(name.split("=", 1)[1])
                    if (sink, batch_id) in self.batches:
                        continue
                    seen_ms = time.time() * 1000
                    # {"published_at": 1700000000000} per row
                    table = pq.read_table(folder / name, columns=["published_at", "line_item_id"])
                    published = table["published_at"].cast("int64").to_pylist()
                    self.line_items.update(table["line_item_id"].to_pylist())
                    self.batches[(sink, batch_id)] = (seen_ms, published)
            self.stop.wait(POLL_S)

    def rows(self, sink: str | None = None) -> int:
        return sum(len(p) for (s, _), (_, p) in list(self.batches.items()) if sink in (None, s))

    def published_between(self, since_ms: float, until_ms: float) -> int:
        """Visible order rows (both sinks) published in the window."""
        return sum(1 for _, rows in list(self.batches.values()) for published in rows if since_ms <= published <= until_ms)

    def latencies_ms(self, sink: str, since_ms: float, until_ms: float) -> list[float]:
        return [seen - published for (s, _), (seen, rows) in list(self.batches.items()) if s == sink
                for published in rows if since_ms <= published <= until_ms]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        if self.errors:
            raise BenchError(f"the sink watcher failed: {self.errors[0]!r}") from self.errors[0]


class ConsumerBaseline:
    """A plain pulsar-client reader of the orders topic: (publish ms, publish-to-receive ms) per
    message, each message once (pulsar-lite may hand a reader the same message again)."""

    def __init__(self, url: str, topic: str):
        import pulsar

        self.client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self.reader = self.client.create_reader(topic, pulsar.MessageId.latest, receiver_queue_size=5000)
        self.samples: list[tuple[int, float]] = []
        self.seen: set[str] = set()
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=guard, args=(self._run, self.errors), name="consumer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import pulsar

        while not self.stop.is_set():
            try:
                message = self.reader.read_next(200)
            except pulsar.Timeout:
                continue
            received = time.time() * 1000
            message_id = str(message.message_id())
            if message_id in self.seen:
                continue
            self.seen.add(message_id)
            published = message.publish_timestamp()
            self.samples.append((published, received - published))

    def latencies_ms(self, since_ms: float, until_ms: float) -> list[float]:
        return [latency for published, latency in list(self.samples) if since_ms <= published <= until_ms]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.client.close()


def summary(latencies_ms: list[float]) -> dict:
    p50, p99 = percentile(latencies_ms, 50), percentile(latencies_ms, 99)
    return {"rows": len(latencies_ms), "p50_s": None if p50 is None else round(p50 / 1000, 3),
            "p99_s": None if p99 is None else round(p99 / 1000, 3),
            "max_s": round(max(latencies_ms) / 1000, 3) if latencies_ms else None}


def batches_in(data_dir: Path, since_ms: float, until_ms: float) -> dict:
    """Mean batch duration and order rows of the job's batches that started in the window."""
    rows = [r for r in read_rows(data_dir, "progress") if since_ms <= r["ts_ms"] <= until_ms]
    orders = [sum(t["rows"] for t in r["topics"] if t["topic"] == "orders") for r in rows]
    return {"batches": len(rows),
            "mean_batch_ms": round(sum(r["batch_duration_ms"] for r in rows) / len(rows)) if rows else None,
            "mean_batch_orders": round(sum(orders) / len(rows)) if rows else None}


def measure_rate(rate: int, args, client, topics, orders_table, start: int, watcher: SinkWatcher,
                 baseline: ConsumerBaseline, data_dir: Path, check) -> dict:
    """Publish ``rate`` orders/s for ``args.seconds``; latencies of the orders after the warm-up."""
    count = rate * args.seconds
    began_ms = time.time() * 1000
    stats = publish_records(client, topics["orders"], "orders", iter_records(orders_table, start, start + count),
                            rate=rate, checked=True)
    ended_ms = time.time() * 1000
    if stats.sent != count:
        raise BenchError(f"published {stats.sent:,} of {count:,} orders at {rate}/s ({stats.first_error})")
    measured_from = began_ms + args.settle * 1000
    total = start + count
    caught_up = True
    try:
        wait_until(lambda: watcher.rows() >= total, timeout=args.drain, what="the job to catch up", check=check)
    except BenchError:
        caught_up = False
    gave_up_ms = time.time() * 1000
    visible = watcher.latencies_ms("enriched", measured_from, ended_ms)
    # Orders still not visible at the deadline have waited at least from the end of publishing
    # until then; the reader saw every order published in the window, so it gives their number.
    read = baseline.latencies_ms(measured_from, ended_ms)
    censored = 0 if caught_up else max(0, len(read) - watcher.published_between(measured_from, ended_ms))
    latencies = visible + [gave_up_ms - ended_ms] * censored
    job = summary(latencies)
    consumer = summary(read)
    return {
        "rate": rate, "achieved_msgs_per_s": round(stats.msgs_per_s), "published": stats.sent,
        "kept_up": caught_up, "not_visible_at_deadline": censored,
        "job_enriched": job, "job_missing_state_rows": len(watcher.latencies_ms("missing_state", measured_from, ended_ms)),
        "consumer": consumer, "job_p99_vs_consumer_p99": ratio(job["p99_s"], consumer["p99_s"]),
        "job_p99_vs_trigger": ratio(job["p99_s"], args.trigger_s),
        "job_batches": batches_in(data_dir, began_ms, ended_ms),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _millis(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def print_table(result: dict) -> None:
    print(f"\n{'rate/s':>8}{'sent/s':>9}{'job p50 s':>11}{'job p99 s':>11}{'reader p50 ms':>15}{'reader p99 ms':>15}"
          f"{'batch ms':>10}{'kept up':>9}")
    for r in result["rates"]:
        if "skipped" in r:
            print(f"{r['rate']:>8,}  not measured: {r['skipped']}")
            continue
        job, consumer = r["job_enriched"], r["consumer"]
        print(f"{r['rate']:>8,}{r['achieved_msgs_per_s']:>9,}{_seconds(job['p50_s']):>11}{_seconds(job['p99_s']):>11}"
              f"{_millis(consumer['p50_s']):>15}{_millis(consumer['p99_s']):>15}"
              f"{r['job_batches']['mean_batch_ms'] or 0:>10,}{'yes' if r['kept_up'] else 'NO':>9}")
    print(f"(trigger interval {result['workload']['trigger_interval_s']:g} s; "
          f"'reader' = plain pulsar-client reader on the same topic at the same time)")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2000,5000,10000", help="comma-separated orders/s, ascending")
    parser.add_argument("--seconds", type=int, default=30, help="publishing time per rate")
    parser.add_argument("--settle", type=float, default=5.0, help="leading seconds of each rate not measured")
    parser.add_argument("--warmup-seconds", type=int, default=10, help="unmeasured publishing before the first rate")
    parser.add_argument("--drain", type=float, default=20.0, help="seconds the job gets to catch up after each rate")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=2_000)
    args = parser.parse_args(argv)
    rates = sorted(int(r) for r in args.rates.split(","))
    began = time.perf_counter()
    warmup = rates[0] * args.warmup_seconds
    tables = generate(args.users, args.items, warmup + sum(rates) * args.seconds, seed=13)
    print(f"generated {args.users:,} users and {tables['orders'].rows:,} orders in {time.perf_counter() - began:.0f}s",
          flush=True)
    topics = bench_topics("latency")
    work = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    results = []
    with ExitStack() as cleanup:  # unwinds in reverse: job and clients stop before the broker
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        broker = cleanup.enter_context(EmbeddedBroker(work / "broker"))
        settings = load_settings(env={}, cli={
            "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"),
            "spark.master": "local[2]", **{f"topics.{k}": v for k, v in topics.items()}})
        args.trigger_s = settings["job.trigger_interval"]
        client = make_client(broker.service_url)
        cleanup.callback(client.close)
        loaded = {kind: publish_records(client, topics[kind], kind, table_records(tables[kind]), checked=True).sent
                  for kind in ("users", "items")}
        print(f"published {loaded['users']:,} users and {loaded['items']:,} items; starting the job…", flush=True)
        log_path = work / "job.log"
        spawned = time.perf_counter()
        job = start_job(settings, log_path)
        cleanup.callback(job.stop)
        check = alive(job, log_path)

        def state_loaded() -> bool:
            read = {t["topic"]: t["end_position"] for r in read_rows(settings.data_dir, "progress") for t in r["topics"]}
            return all(read.get(kind, 0) >= n for kind, n in loaded.items())

        wait_until(state_loaded, timeout=300, what="the job to load users and items", interval=0.2, check=check)
        print(f"the job loaded them in {time.perf_counter() - spawned:.0f}s", flush=True)
        watcher = SinkWatcher(settings.data_dir)
        cleanup.callback(watcher.close)
        baseline = ConsumerBaseline(broker.service_url, topics["orders"])
        cleanup.callback(baseline.close)
        print(f"warm-up: {rates[0]:,} orders/s for {args.warmup_seconds}s…", flush=True)
        published = publish_records(client, topics["orders"], "orders", iter_records(tables["orders"], 0, warmup),
                                    rate=rates[0], checked=True).sent
        wait_until(lambda: watcher.rows() >= published, timeout=300, what="the warm-up orders in the sinks",
                   check=check)
        for rate in rates:
            behind = next((r["rate"] for r in results if not r.get("kept_up")), None)
            if behind is not None:
                results.append({"rate": rate, "skipped": f"the job did not keep up with {behind:,} orders/s"})
                continue
            print(f"{rate:,} orders/s for {args.seconds}s…", flush=True)
            figures = measure_rate(rate, args, client, topics, tables["orders"], published, watcher, baseline,
                                   settings.data_dir, check)
            published += figures["published"]
            results.append(figures)
            print(f"  job p50 {figures['job_enriched']['p50_s']} s, p99 {figures['job_enriched']['p99_s']} s; "
                  f"reader p99 {figures['consumer']['p99_s']} s; kept up: {figures['kept_up']}", flush=True)
        duplicated = sum(1 for n in watcher.line_items.values() if n > 1)
        if duplicated:
            raise BenchError(f"{duplicated:,} orders are visible more than once in the sinks")
        if all(r.get("kept_up") for r in results) and len(watcher.line_items) != published:
            raise BenchError(f"{published - len(watcher.line_items):,} of {published:,} orders never reached a sink")
    result = {
        "date": now_utc(), "machine": machine(),
        "workload": {"users": loaded["users"], "items": loaded["items"], "seconds_per_rate": args.seconds,
                     "warmup_s": args.warmup_seconds, "settle_s": args.settle, "drain_s": args.drain, "spark_master": "local[2]",
                     "trigger_interval_s": args.trigger_s, "max_wait_s": settings["enrichment.max_wait"]},
        "baseline": "plain pulsar-client reader, publish to receive, same topic at the same time; and the trigger interval",
        "target": {"rate": 5000, "p99_s": 2.0},
        "rates": results, "wall_s": round(time.perf_counter() - began, 1),
    }
    at_target = next((r for r in results if r["rate"] == 5000), None)
    result["target"]["met"] = bool(at_target and at_target.get("kept_up") and at_target["job_enriched"]["p99_s"] is not None
                                   and at_target["job_enriched"]["p99_s"] < 2.0)
    write_result(NAME, result)
    print_table(result)
    return result


if __name__ == "__main__":
    main()
