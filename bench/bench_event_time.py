"""Event time beside processing time on one input: backlog throughput, latency at a steady rate, state per key.

One embedded broker holds the input once per partition count (``--partitions``, default 1 and 4
partitions for every topic; pulsar-lite makes partitioned topics only from the metadata file it
reads at start-up, written here before it starts). Every message is routed by its key, so a
user's versions stay in one partition:

- users, each with ``--versions`` versions, items, and a backlog of ``--orders`` orders, on one
  event-time timeline of ten minutes that ends two minutes before publishing (orders'
  ``createdAt`` is their event time; an order's user is ``n % (users + 10) + 1``, so 10 in ``users + 10`` are unknown); then
  one version per changelog partition a minute after the timeline, which moves every watermark
  past the backlog.

For each partition count, the same topics are read by the real job (``python -m pipeline run``,
local[2], one data dir per mode), in this order:

1. **backlog**, processing time, then event time (``enrichment.allowed_lateness`` the default
   1 h, so no backlog order is late): orders decided per second from the first batch's start to
   the end of the batch that decided the last backlog order (the users load in the same drain),
   every order once; Spark's phases per batch;
2. **steady**, each mode restarted on its checkpoint with ``allowed_lateness = --lateness``
   (10 s: the pruning horizon, watermark - lateness - max_wait, is then 12 s behind the
   watermark). A user and an item update every 50 ms (event time = now) keep the watermarks
   moving; ``--warmup`` seconds of orders at ``--rate`` are published and waited for (the
   event-time job also catches up the processing run's steady messages, late by then), then
   ``--seconds`` at ``--rate`` are measured:
   p50/p99 of ``enriched_at - published_at`` (the sink writer's time; the Delta commit follows),
   whether the job kept up, the mean batch duration and the time between batch starts, and the
   floor (out-of-orderness + the time between batch starts), with Spark's phases per batch as
   ``bench_latency.py`` reports them;
3. **wave**, each mode restarted on its checkpoint (lateness 1 h), then one version per
   changelog partition 59 minutes ahead (within the future horizon): in event time the watermark jumps past
   every backlog key's versions + lateness + ``max_wait``, so every key with something to prune
   is pruned in one batch (a restart after downtime, an idle changelog coming back, a replay's
   end do the same); seconds from the markers' batch to the end of the batch at the new
   watermark, beside processing time's batch of the same two messages;
4. **state** after each phase, from the job's last progress row: rows, RocksDB memory and SST
   bytes per lookup, per key (after the wave: what pruning left).

The 1-minute load average is recorded with every figure. Prints a table and writes
``bench/results/event_time.json``.

    python -m bench.bench_event_time                                     # 20k users, 50k orders
    python -m bench.bench_event_time --users 1000000 --items 10000 --orders 2000000   # make bench
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_latency import batch_breakdown, spark_api  # noqa: E402
from bench.common import (BenchError, alive, load_average, machine, now_utc, percentile, process_tree,  # noqa: E402
                          ratio, start_job, wait_until, work_dir, write_result)
from pipeline import wire  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from factories import item, order, user  # noqa: E402  (tests/ is on the path through bench.common)
from sinkread import has_files, relation  # noqa: E402

NAME = "event_time"
MODES = ("processing", "event")
SPAN_MS = 600_000  # the backlog's event-time timeline
# It ends 2 minutes before publishing: the steady phase's orders (event time = now) must stay within
# enrichment.future_horizon (1 h) of the backlog's end while the restarted job's watermark is still
# there (in a run that began the timeline an hour back, the full-scale drains took 25 minutes and
# every order of the steady warm-up was judged future).
UNKNOWN_USERS = 10
STEADY_BASE = {"processing": 100_000_000, "event": 200_000_000}  # invoice ids of each mode's steady orders


# ---------------------------------------------------------------------------- the input
def topic_sets(partitions: list[int]) -> dict[int, dict[str, str]]:
    return {p: {k: f"persistent://public/default/bench-evt-p{p}-{k}" for k in ("users", "items", "orders")}
            for p in partitions}


def write_partition_metadata(broker_dir: Path, sets: dict[int, dict[str, str]]) -> None:
    """pulsar-lite's metadata file, read at start-up: the partitioned topics (as the
    ``partitioned_broker`` fixture of tests/test_event_time_partitions.py writes it)."""
    broker_dir.mkdir(parents=True, exist_ok=True)
    (broker_dir / "db.metadata.json").write_text(json.dumps(
        {"version": 2, "partitioned_topics": {topic: {"partitions": p} for p, topics in sets.items() if p > 1
                                              for topic in topics.values()}}))


def backlog_messages(users: int, versions: int, items: int, orders: int, start_ms: int):
    """(kind, key, payload, event time) in publishing order: every user's versions (version v of
    all users after version v - 1), the items, the orders, all on one timeline of SPAN_MS."""
    total = users * versions
    for n in range(total):
        uid = n % users + 1
        yield "users", str(uid), wire.encode(user(uid, firstName=f"V{n // users}")), start_ms + n * SPAN_MS // total
    for i in range(1, items + 1):
        yield "items", str(i), wire.encode(item(i)), start_ms + i
    for n in range(orders):
        at = start_ms + 5_000 + n * (SPAN_MS - 5_000) // max(1, orders)
        yield ("orders", f"o{n}", wire.encode(order(n, n % (users + UNKNOWN_USERS) + 1, n % items + 1, createdAt=at)),
               at)


def publish_backlog(client, sets: dict[int, dict[str, str]], args, start_ms: int) -> dict:
    """The backlog to every topic set in one pass, then a version a minute past the timeline in
    each changelog partition; the messages per kind."""
    producers = {(p, kind): client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                                   block_if_queue_full=True)
                 for p, topics in sets.items() for kind, topic in topics.items()}
    counts = {"users": 0, "items": 0, "orders": 0}
    started = time.perf_counter()
    for kind, key, payload, at in backlog_messages(args.users, args.versions, args.items, args.orders, start_ms):
        for p in sets:
            producers[(p, kind)].send_async(payload, None, partition_key=key, event_timestamp=at)
        counts[kind] += 1
    for producer in producers.values():
        producer.flush()
        producer.close()
    print(f"published {counts} to {len(sets)} topic sets in {time.perf_counter() - started:.0f}s", flush=True)
    end_ms = counts["marker_ms"] = start_ms + SPAN_MS + 60_000
    for p, topics in sets.items():
        for kind, build in (("users", user), ("items", item)):
            counts[f"{kind}_markers_p{p}"] = mark_every_partition(client, topics[kind], p, build, end_ms)
    return counts


def mark_every_partition(client, topic: str, partitions: int, build, at: int) -> int:
    """A version at ``at`` in every partition of ``topic``, routed by key: keys 1, 2, … until each
    partition has one (the key's hash picks it). Returns the messages sent."""
    producer = client.create_producer(topic, batching_enabled=False)
    seen, key = set(), 0
    try:
        while len(seen) < max(1, partitions):
            key += 1
            if key > 10_000:
                raise BenchError(f"{topic}: keys 1-10,000 reached only partitions {sorted(seen)} of {partitions}")
            seen.add(producer.send(wire.encode(build(key)), partition_key=str(key), event_timestamp=at).partition())
    finally:
        producer.close()
    return key


class Heartbeats:
    """A user and an item update every 50 ms at event time = now (keys cycling over every user and
    item, so every partition moves): the changelogs' watermarks follow the clock."""

    def __init__(self, client, topics: dict, users: int, items: int):
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(client, topics[kind], build, count), daemon=True)
                        for kind, build, count in (("users", user, users), ("items", item, items))]
        for thread in self.threads:
            thread.start()

    def _run(self, client, topic: str, build, count: int) -> None:
        producer = client.create_producer(topic, batching_enabled=False)
        n = 0
        while not self.done.is_set():
            key = n % count + 1
            producer.send_async(wire.encode(build(key)), None, partition_key=str(key),
                                event_timestamp=int(time.time() * 1000))
            n += 1
            self.done.wait(0.05)
        producer.flush()
        producer.close()

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join()


def publish_orders(client, topic: str, first: int, count: int, rate: float, users: int, items: int) -> tuple[int, int]:
    """``count`` orders at ``rate``/s, created now, invoices from ``first``; (start, end) epoch ms."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=5,
                                      block_if_queue_full=True)
    began, started = int(time.time() * 1000), time.monotonic()
    for n in range(count):
        delay = started + n / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        now = int(time.time() * 1000)
        record = order(first + n, n % users + 1, n % items + 1, createdAt=now)
        producer.send_async(wire.encode(record), None, partition_key=f"o{first + n}", event_timestamp=now)
    producer.flush()
    producer.close()
    return began, int(time.time() * 1000)


# ---------------------------------------------------------------------------- the sinks and progress
def sink_sql(data_dir: Path, sink: str, select: str, where: str = "true") -> list[tuple]:
    import duckdb

    if not has_files(data_dir, sink):
        return []
    return duckdb.sql(f"select {select} from {relation(data_dir, sink)} where {where}").fetchall()


def decided(data_dir: Path) -> int:
    """Orders in the enriched and missing_state sinks."""
    return sum(sink_sql(data_dir, sink, "count(*)")[0][0] if has_files(data_dir, sink) else 0
               for sink in ("enriched", "missing_state"))


def progress_since(data_dir: Path, since_ms: int) -> list[dict]:
    return [r for r in read_rows(data_dir, "progress") if r["ts_ms"] >= since_ms]


def state_figures(row: dict, keys: dict[str, int]) -> dict:
    """Each lookup's state in a progress row: rows, RocksDB memory and SST bytes, and per key."""
    out = {"checkpoint_state_bytes": row.get("state_size_bytes")}
    for op in row["state"]:
        name = op["operator"]
        sst = (op.get("custom") or {}).get("rocksdbSstFileSize")
        count = keys[name.removesuffix("_lookup") + "s"]
        out[name] = {"rows": op["rows_total"], "memory_bytes": op["memory_bytes"], "sst_bytes": sst, "keys": count,
                     "rows_per_key": round(op["rows_total"] / count, 2),
                     "memory_bytes_per_key": round(op["memory_bytes"] / count, 1),
                     "sst_bytes_per_key": None if sst is None else round(sst / count, 1)}
    return out


# ---------------------------------------------------------------------------- one job
def job_settings(mode: str, url: str, topics: dict, data_dir: Path, args, lateness: str, **more: str):
    return load_settings(env={}, cli={
        "pulsar.service_url": url, "paths.data_dir": str(data_dir), "spark.master": "local[2]",
        "job.trigger_interval": args.trigger, "enrichment.time": mode, "enrichment.max_wait": args.max_wait,
        "enrichment.out_of_orderness": args.out_of_orderness, "enrichment.allowed_lateness": lateness,
        "enrichment.idle_timeout": "0s", **{f"topics.{k}": v for k, v in topics.items()}, **more})


class Job:
    """The job as a process on its data dir, stopped on exit. With ``jfr_dir``, its Spark JVM runs
    Java Flight Recorder (deep stacks: Spark's task stacks pass JFR's default 64 frames), dumped
    to ``<jfr_dir>/<data dir name>.jfr`` before the job stops (a stopping JVM is killed before it
    would dump on exit); ``jfr print --stack-depth 300 --events jdk.ExecutionSample`` reads it."""

    def __init__(self, settings, log_path: Path, jfr_dir: Path | None = None):
        self.settings, self.data_dir, self.jfr_dir = settings, settings.data_dir, jfr_dir
        if jfr_dir is not None:  # the job's JVMs inherit it (the settings reach the child as --set flags only)
            os.environ["JAVA_TOOL_OPTIONS"] = ("-XX:FlightRecorderOptions:stackdepth=1024 "
                                               "-XX:StartFlightRecording=settings=profile")
        try:
            self.proc = start_job(settings, log_path)
        finally:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        self.check = alive(self.proc, log_path)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        if self.jfr_dir is not None:
            for pid, cmdline in process_tree(self.proc.proc.pid).items():
                if "SparkSubmit" in cmdline:
                    subprocess.run(["jcmd", str(pid), "JFR.dump", f"filename={self.jfr_dir / self.data_dir.name}.jfr"],
                                   capture_output=True, timeout=120)
        self.proc.stop()

    def wait_decided(self, total: int, timeout: float, what: str) -> None:
        wait_until(lambda: decided(self.data_dir) >= total, timeout, what, 0.5, self.check)


def drain_backlog(mode: str, p: int, url: str, topics: dict, work: Path, args, counts: dict) -> dict:
    """The backlog, read by a fresh job: orders/s from its first batch to the batch that decided the last order."""
    data_dir = work / f"p{p}-{mode}"
    settings = job_settings(mode, url, topics, data_dir, args, "1h")
    with Job(settings, work / f"p{p}-{mode}.log", args.jfr) as job:
        job.wait_decided(args.orders, args.timeout, f"{mode}, {p} partitions: the backlog")
        load = load_average()
    progress = read_rows(data_dir, "progress")
    total, last = 0, None
    for row in progress:  # the batch that decided the last backlog order
        total += row["sink_rows"]["enriched"] + row["sink_rows"]["missing_state"]
        if total >= args.orders:
            last = row
            break
    if last is None:
        raise BenchError(f"{mode}: the sinks hold the backlog but the progress rows count {total:,} orders")
    seconds = (last["ts_ms"] + last["batch_duration_ms"] - progress[0]["ts_ms"]) / 1000
    outcome = {r[0]: r[1] for r in sink_sql(data_dir, "missing_state", "reason, count(*)", "true group by reason")}
    distinct = sum(sink_sql(data_dir, sink, "count(distinct invoice_id)")[0][0] for sink in ("enriched", "missing_state"))
    if distinct != args.orders or decided(data_dir) != args.orders:
        raise BenchError(f"{mode}: {decided(data_dir):,} orders in the sinks, {distinct:,} distinct, of {args.orders:,}")
    batches = progress[:progress.index(last) + 1]
    messages = counts["users"] + counts["items"] + args.orders
    figures = {
        "orders_per_s": round(args.orders / seconds), "messages_per_s": round(messages / seconds),
        "seconds": round(seconds, 1), "batches": len(batches),
        "mean_batch_ms": round(sum(b["batch_duration_ms"] for b in batches) / len(batches)),
        "phases_ms": {phase: round(sum(b["duration_ms"].get(phase, 0) for b in batches) / len(batches))
                      for phase in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
                                    "triggerExecution")},
        "enriched": decided(data_dir) - sum(outcome.values()), "missing_by_reason": outcome,
        "state": state_figures(last, {"users": args.users, "items": args.items}), "load_average": load}
    print(f"  {mode:<10} p={p}: {figures['orders_per_s']:,} orders/s over {seconds:.0f}s, {len(batches)} batches "
          f"(load {load[0]})", flush=True)
    return figures


def run_steady(mode: str, p: int, url: str, topics: dict, work: Path, args, published: dict) -> dict:
    """The mode's job restarted with the short lateness: warm-up, then ``--seconds`` at ``--rate`` measured."""
    import pulsar

    data_dir = work / f"p{p}-{mode}"
    settings = job_settings(mode, url, topics, data_dir, args, args.lateness)
    base = STEADY_BASE[mode]
    warmup, measured = int(args.rate * args.warmup), int(args.rate * args.seconds)
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    with Job(settings, work / f"p{p}-{mode}-steady.log") as job:
        beats = Heartbeats(client, topics, args.users, args.items)
        try:
            api = None
            publish_orders(client, topics["orders"], base, warmup, args.rate, args.users, args.items)
            published["orders"] += warmup
            job.wait_decided(published["orders"], args.timeout, f"{mode}: the warm-up orders")
            api = spark_api(job.proc.proc.pid)
            began, ended = publish_orders(client, topics["orders"], base + warmup, measured, args.rate, args.users,
                                          args.items)
            published["orders"] += measured
            kept_up = True
            try:
                job.wait_decided(published["orders"], args.drain, f"{mode}: the steady orders")
            except BenchError:
                kept_up = False
            gave_up = int(time.time() * 1000)
            load = load_average()
        finally:
            beats.stop()
            client.close()
        measured_from = began + int(args.settle * 1000)
        latencies = [r[0] for r in sink_sql(
            data_dir, "enriched", "epoch_ms(enriched_at) - epoch_ms(published_at)",
            f"invoice_id >= {base + warmup} and epoch_ms(published_at) >= {measured_from}")]
        done = sum(sink_sql(data_dir, sink, "count(*)", f"invoice_id >= {base + warmup}")[0][0]
                   for sink in ("enriched", "missing_state") if has_files(data_dir, sink))
        breakdown = batch_breakdown(data_dir, api, measured_from, gave_up)
        rows = progress_since(data_dir, began)
        last = read_rows(data_dir, "progress")[-1]
    starts = [r["ts_ms"] for r in rows if r["ts_ms"] <= ended]
    interval = round((starts[-1] - starts[0]) / (len(starts) - 1)) if len(starts) > 1 else None
    ooo_ms = int(settings["enrichment.out_of_orderness"] * 1000)
    floor = ooo_ms + interval if interval is not None else None
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    figures = {
        "rate": args.rate, "published": measured, "decided": done, "kept_up": kept_up, "enriched_measured": len(latencies),
        "p50_ms": p50, "p99_ms": p99, "max_ms": max(latencies) if latencies else None,
        "trigger_ms": int(settings["job.trigger_interval"] * 1000), "mean_batch_ms": breakdown.get("mean_batch_ms"),
        "batch_interval_ms": interval, "floor_ms": floor, "target_p99_ms": ooo_ms + 2000,
        "p99_above_floor_ms": None if p99 is None or floor is None else p99 - floor,
        "breakdown": breakdown, "load_average": load,
        "state": state_figures(last, {"users": args.users, "items": args.items})}
    print(f"  {mode:<10} p={p}: p50 {p50} ms, p99 {p99} ms (floor {floor} ms), kept up {kept_up} (load {load[0]})",
          flush=True)
    return figures


# The wave's markers: past every backlog key's pruning time (its second version + 1 h + max_wait: at most
# 55 minutes after publishing) and within enrichment.future_horizon (1 h) of their publish time.
WAVE_AHEAD_MS = 59 * 60_000


def run_wave(mode: str, p: int, url: str, topics: dict, work: Path, args, marker_ms: int) -> dict:
    """The watermark's jump: the mode's job restarted on its checkpoint (lateness 1 h, as the
    backlog was read), then one version per changelog partition 59 minutes ahead of now. In event time the watermark jumps past every backlog key's versions + 1 h +
    max_wait, so every key with something to prune is pruned in that batch (by its timer); in
    processing time the same two messages are one small batch. The batches from the markers'
    read to the batch run at the new watermark, and the state after it."""
    import pulsar

    data_dir = work / f"p{p}-{mode}"
    settings = job_settings(mode, url, topics, data_dir, args, "1h")
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    with Job(settings, work / f"p{p}-{mode}-wave.log") as job:
        try:
            # one version at the backlog markers' time (it moves no watermark) to have the restarted
            # job load its state in a batch of its own, before the jump
            restarted = int(time.time() * 1000)
            mark_every_partition(client, topics["users"], 1, user, marker_ms)
            wait_until(lambda: any(r["num_input_rows"] for r in progress_since(data_dir, restarted)), args.timeout,
                       f"{mode}: the restarted job's first batch", 0.5, job.check)
            since = int(time.time() * 1000)
            at = since + WAVE_AHEAD_MS
            for kind, build in (("users", user), ("items", item)):
                mark_every_partition(client, topics[kind], p, build, at)
        finally:
            client.close()
        target = at - int(settings["enrichment.out_of_orderness"] * 1000)

        def done() -> list[dict] | None:
            batches = progress_since(data_dir, since)
            if mode == "processing":
                return batches if any(r["num_input_rows"] for r in batches) else None
            fired = {r["batch_id"] for r in read_rows(data_dir, "watermarks", since)
                     if (r["watermark_ms"] or 0) >= target}
            return batches if fired and any(r["batch_id"] in fired for r in batches) else None

        batches = wait_until(done, args.timeout, f"{mode}: the batch at the jumped watermark", 0.5, job.check)
        load = load_average()
    last = batches[-1]
    figures = {
        "batches": len(batches), "batch_ms": [b["batch_duration_ms"] for b in batches],
        "seconds": round((last["ts_ms"] + last["batch_duration_ms"] - batches[0]["ts_ms"]) / 1000, 1),
        "longest_batch_ms": max(b["batch_duration_ms"] for b in batches),
        "state": state_figures(last, {"users": args.users, "items": args.items}), "load_average": load}
    print(f"  {mode:<10} p={p}: the watermark jump took {figures['seconds']}s over {len(batches)} batches, "
          f"longest {figures['longest_batch_ms']:,} ms (load {load[0]})", flush=True)
    return figures


# ---------------------------------------------------------------------------- the run
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", default="1,4", help="partitions per topic, comma-separated")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--versions", type=int, default=3, help="versions per user in the backlog")
    parser.add_argument("--items", type=int, default=1_000)
    parser.add_argument("--orders", type=int, default=50_000, help="backlog orders")
    parser.add_argument("--rate", type=float, default=5_000.0, help="steady orders per second")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at --rate before the measured ones")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds at --rate")
    parser.add_argument("--settle", type=float, default=3.0, help="leading measured seconds left out of the latency")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds the job gets to decide the steady orders")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for a backlog or a warm-up")
    parser.add_argument("--trigger", default="500ms", help="job.trigger_interval (both modes)")
    parser.add_argument("--out-of-orderness", default="1s")
    parser.add_argument("--max-wait", default="2s")
    parser.add_argument("--lateness", default="10s", help="enrichment.allowed_lateness of the steady phase")
    parser.add_argument("--phases", default="backlog,steady,wave",
                        help="which phases to run, in this order (steady and wave need backlog's checkpoints)")
    parser.add_argument("--jfr", type=Path, help="record each backlog drain's Spark JVM with Java Flight Recorder "
                        "into this folder (a profile; its figures are not the benchmark's)")
    parser.add_argument("--keep", action="store_true", help="keep the broker and the data dirs (their path is printed)")
    args = parser.parse_args(argv)
    if args.jfr is not None:
        args.jfr.mkdir(parents=True, exist_ok=True)
    partitions = [int(p) for p in args.partitions.split(",")]
    phases = set(args.phases.split(","))
    import pulsar

    began = time.perf_counter()
    load_at_start = load_average()
    sets = topic_sets(partitions)
    runs: dict[str, dict] = {}
    counts: dict = {}

    def record(complete: bool) -> dict:  # after every phase, so a run cut short keeps what it measured
        result = {
            "date": now_utc(), "machine": {**machine(), "load_average_at_start": load_at_start},
            "workload": {"users": args.users, "versions": args.versions, "user_messages": counts.get("users"),
                         "items": args.items, "orders": args.orders, "partitions": partitions,
                         "spark_master": "local[2]", "trigger": args.trigger, "out_of_orderness": args.out_of_orderness,
                         "max_wait": args.max_wait, "allowed_lateness": {"backlog": "1h", "steady": args.lateness},
                         "steady_rate": args.rate, "warmup_s": args.warmup, "measured_s": args.seconds,
                         "settle_s": args.settle, "publishing": counts},
            "targets": {"backlog_event_vs_processing": 0.8, "p99_ms": "out_of_orderness + 2000"},
            "runs": runs, "wall_s": round(time.perf_counter() - began, 1), **({} if complete else {"partial": True}),
        }
        if args.jfr is None:  # a profiled run's figures carry the recorder's cost
            write_result(NAME, result)
        return result

    with work_dir("bench-event-time-", args.keep) as work:
        write_partition_metadata(work / "broker" / "broker", sets)
        with EmbeddedBroker(work / "broker") as broker:
            client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
            try:
                counts.update(publish_backlog(client, sets, args, int(time.time() * 1000) - SPAN_MS - 120_000))
            finally:
                client.close()
            for p, topics in sets.items():
                print(f"{p} partition(s) per topic:", flush=True)
                run = runs[str(p)] = {mode: {} for mode in MODES}
                run["workload"] = {"users": args.users, "versions": args.versions, "orders": args.orders}
                for mode in MODES:
                    run[mode]["backlog"] = drain_backlog(mode, p, broker.service_url, topics, work, args, counts)
                    record(False)
                run["event_vs_processing_orders_per_s"] = ratio(run["event"]["backlog"]["orders_per_s"],
                                                                run["processing"]["backlog"]["orders_per_s"])
                published = {"orders": args.orders}
                if "steady" in phases:
                    for mode in MODES:
                        run[mode]["steady"] = run_steady(mode, p, broker.service_url, topics, work, args, published)
                        record(False)
                if "wave" in phases:
                    for mode in MODES:
                        run[mode]["wave"] = run_wave(mode, p, broker.service_url, topics, work, args, counts["marker_ms"])
                        record(False)
    result = record(True)
    print_table(result)
    return result


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Rows of bench/run.py's table: (figure, event time, processing time in the same run, ratio)."""
    w = result["workload"]
    out = []

    def load(figures: dict) -> str:
        return f" (load {figures['load_average'][0]:.1f})"

    def n(value) -> str:  # a figure that may be missing (no batch started inside a short window)
        return "–" if value is None else f"{value:,}"

    for p, run in result["runs"].items():
        if not all(run.get(mode, {}).get("backlog") for mode in MODES):
            continue  # a run cut short
        w = {**result["workload"], **run.get("workload", {})}  # a run merged from a smaller one says its scale
        e, pr = run["event"], run["processing"]
        eb, pb = e["backlog"], pr["backlog"]
        out.append((f"event time, {p} partition(s) per topic: backlog orders/s, {w['users']:,} users × {w['versions']} "
                    f"versions, {w['orders']:,} orders (target >= 0.8)", f"{eb['orders_per_s']:,}{load(eb)}",
                    f"processing time {pb['orders_per_s']:,}{load(pb)}", f"{run['event_vs_processing_orders_per_s']:.2f}"))
        ew, pw = e.get("wave"), pr.get("wave")
        if ew and pw:
            out.append((f"event time, {p} partition(s): the watermark's jump past the backlog (every key's pruning "
                        "timer due), s from the markers' batch to the batch at the new watermark; longest batch",
                        f"{ew['seconds']:,} s; {ew['longest_batch_ms']:,} ms{load(ew)}",
                        f"processing time {pw['seconds']:,} s; {pw['longest_batch_ms']:,} ms{load(pw)}",
                        f"{ew['seconds'] / pw['seconds']:.2f}" if pw["seconds"] else "–"))
            ewu, pwu = ew["state"]["user_lookup"], pw["state"]["user_lookup"]
            out.append((f"event time, {p} partition(s): user state after the jump (pruned), SST bytes per key",
                        f"{ewu['sst_bytes_per_key'] or 0:,.0f} B", f"processing time {pwu['sst_bytes_per_key'] or 0:,.0f} B",
                        f"{ewu['sst_bytes_per_key'] / pwu['sst_bytes_per_key']:.2f}" if ewu["sst_bytes_per_key"]
                        and pwu["sst_bytes_per_key"] else "–"))
        es, ps = e.get("steady") or {}, pr.get("steady") or {}
        label = f"event time, {p} partition(s): p50 / p99 at {w['steady_rate']:,.0f}/s (target p99 <= out-of-orderness + 2 s)"
        if "p99_ms" not in es or "p99_ms" not in ps:
            missing = es.get("not_measured") or ps.get("not_measured") or "the run stopped before it"
            out.append((label, "not measured", missing[:100], "–"))
            continue
        flag = {True: "", False: " (fell behind)"}
        out.append((label, f"{n(es['p50_ms'])} / {n(es['p99_ms'])} ms{flag[es['kept_up']]}, floor {n(es['floor_ms'])}"
                    f"{load(es)}", f"processing time {n(ps['p50_ms'])} / {n(ps['p99_ms'])} ms{flag[ps['kept_up']]}{load(ps)}",
                    f"{es['p99_ms'] / ps['p99_ms']:.2f}" if ps["p99_ms"] and es["p99_ms"] else "–"))
        eu, pu = es["state"]["user_lookup"], ps["state"]["user_lookup"]
        out.append((f"event time, {p} partition(s): user state, SST bytes per key, lateness {w['allowed_lateness']['steady']}",
                    f"{eu['sst_bytes_per_key'] or 0:,.0f} B", f"processing time {pu['sst_bytes_per_key'] or 0:,.0f} B",
                    f"{eu['sst_bytes_per_key'] / pu['sst_bytes_per_key']:.2f}" if eu["sst_bytes_per_key"]
                    and pu["sst_bytes_per_key"] else "–"))
    return out


def print_table(result: dict) -> None:
    print("\n| figure | event time | processing time | ratio |\n| --- | --- | --- | --- |")
    for row in table_rows(result):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
