"""Latency: publish time to sink visibility, p50 and p99, at a steady 2k, 5k and 10k orders/s.

One embedded broker holds generated users and items (pipeline/feed/datagen.py); the real job runs
as a process (``python -m pipeline run``, local[2], default settings) and loads them. Then, for
each rate in turn, orders are published at that steady rate for ``--seconds`` with
``pipeline.feed.producers.publish_records`` (its token bucket), and:

- a **watcher** thread polls the Delta tables ``sinks/enriched`` and ``sinks/missing_state``
  every 20 ms and records when each batch's rows first appear in the table's current files: the
  moment a reader of the Delta log can see them (the batch's commit). An order's latency is that
  moment minus its ``published_at`` (the producer's publish timestamp, on the same clock);
- the **baseline**, measured at the same time on the same topic, is a plain pulsar-client
  reader: publish to receive, with no Spark. The trigger interval (1 s) is the job's floor.

Before the first rate, a warm-up of ``--warmup-seconds`` at the lowest rate is published and
waited for (the first order batches start the Python workers and warm RocksDB; that is not
steady state). Latency is over enriched orders published after the first ``--settle``
seconds of each rate (orders for unknown users wait ``enrichment.max_wait`` by design and land
in missing_state; their count is reported). After publishing, the job gets ``--drain`` seconds
to catch up; orders still not visible then count with a lower bound of their latency, and the
rate is marked as not kept up.

**Where a batch's time goes**, per rate, as means over the batches that read orders: Spark's
``durationMs`` phases from the job's progress rows in the metrics store (``latestOffset``: the
source plans the batch; ``walCommit``: the offset log; ``addBatch``: the batch and its sinks;
``commitOffsets``: the commit log) and each lookup's state store commit; the batch's Spark job
and its three stages (source read and parse; user lookup; item lookup and the hand-over to the
driver) from Spark's REST API (the job's UI port, found from /proc), with the sinks as
``addBatch`` minus the Spark job; and the lookups' task time from the metrics store's
``tasks`` rows. ``--trigger`` sets ``job.trigger_interval`` to measure that lever. The load
average is recorded with each rate. Prints a table and writes ``bench/results/latency.json``.

    python -m bench.bench_latency                                  # 2k, 5k, 10k orders/s, 30 s each
    python -m bench.bench_latency --rates 2000 --seconds 20        # a quick look
    python -m bench.bench_latency --rates 5000 --trigger 0.5s      # another trigger interval
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
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.feed.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.feed.producers import publish_records  # noqa: E402
from pipeline.feed.topics import make_client  # noqa: E402

NAME = "latency"
POLL_S = 0.02
ORDER_SINKS = ("enriched", "missing_state")


def epoch_ms(column) -> list[int]:
    """A sink's ``published_at`` as epoch milliseconds, whether it holds them or a timestamp (the
    Delta sinks keep timestamps in microseconds)."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz=column.type.tz))
    return column.cast("int64").to_pylist()


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
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from pipeline.sinks import sink_files

        read: set[str] = set()  # files already looked at (a compacted file holds batches seen before)
        while not self.stop.is_set():
            for sink in ORDER_SINKS:
                for path in sink_files(self.data_dir, sink):
                    if path in read:
                        continue
                    read.add(path)
                    seen_ms = time.time() * 1000
                    # {"published_at": 1700000000000, "batch_id": 42} per row
                    table = pq.read_table(path, columns=["published_at", "line_item_id", "batch_id"])
                    for batch_id in pc.unique(table["batch_id"]).to_pylist():
                        if (sink, batch_id) in self.batches:
                            continue
                        rows = table.filter(pc.equal(table["batch_id"], batch_id))
                        self.line_items.update(rows["line_item_id"].to_pylist())
                        self.batches[(sink, batch_id)] = (seen_ms, epoch_ms(rows["published_at"]))
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
    orders = [r["num_input_rows"] for r in rows]  # only orders are published in the window
    return {"batches": len(rows),
            "mean_batch_ms": round(sum(r["batch_duration_ms"] for r in rows) / len(rows)) if rows else None,
            "mean_batch_orders": round(sum(orders) / len(rows)) if rows else None}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values)) if values else None


def listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (from /proc: its socket inodes in /proc/net/tcp{,6})."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return []
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def spark_api(job_pid: int) -> str | None:
    """The REST API base of the job's Spark application (``…/api/v1/applications/<id>``): the
    job's JVM listens on its UI port (4040 or the next free one), found from /proc."""
    import json
    import urllib.request

    from bench.common import process_tree

    ports = sorted({port for pid, cmdline in process_tree(job_pid).items() if cmdline.endswith("/bin/java")
                    or "/bin/java " in cmdline for port in listening_ports(pid)},
                   key=lambda p: (not 4040 <= p < 4140, p))  # the UI's ports first
    for attempt in range(3):  # a busy driver can be slow to answer
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/applications", timeout=10) as response:
                    apps = json.loads(response.read())
                return f"http://127.0.0.1:{port}/api/v1/applications/{apps[0]['id']}"
            except Exception:  # not the UI port, or no answer yet
                continue
    return None


def _get_json(url: str):
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _epoch_ms(text: str | None) -> float | None:
    """Spark REST times ("2026-11-23T01:07:55.303GMT") in epoch ms."""
    from datetime import datetime, timezone

    if not text:
        return None
    return datetime.strptime(text.replace("GMT", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=timezone.utc).timestamp() * 1000


STAGES = ("source_parse", "user_lookup", "item_lookup")  # a batch's Spark job, in stage order


def spark_stages(api: str | None, batch_ids: set[int]) -> dict[int, dict]:
    """Per batch: the wall time of its Spark job and of each of its three stages (source read and
    parse; user lookup; item lookup and the collect to the driver), their task time, and the
    lookups' input rows, from Spark's REST API."""
    if api is None or not batch_ids:
        return {}
    stages = {s["stageId"]: s for s in _get_json(f"{api}/stages?status=complete")}
    found: dict[int, dict] = {}
    for job in _get_json(f"{api}/jobs?status=succeeded"):
        lines = (job.get("description") or "").split("\n")
        batch = next((int(line.split("=", 1)[1]) for line in lines if line.startswith("batch = ")), None)
        if batch not in batch_ids:
            continue
        own = [stages[i] for i in sorted(job.get("stageIds", [])) if i in stages]
        if len(own) != len(STAGES):  # skipped or retried stages: not a clean sample
            continue
        started, ended = _epoch_ms(job.get("submissionTime")), _epoch_ms(job.get("completionTime"))
        entry = found.setdefault(batch, {"job_ms": 0})
        entry["job_ms"] += (ended - started) if started and ended else 0
        for name, stage in zip(STAGES, own):
            begun, done = _epoch_ms(stage.get("submissionTime")), _epoch_ms(stage.get("completionTime"))
            entry[f"{name}_ms"] = (done - begun) if begun and done else None
            entry[f"{name}_task_ms"] = stage.get("executorRunTime")
            entry[f"{name}_tasks"] = stage.get("numTasks")
            entry[f"{name}_rows_in"] = stage.get("shuffleReadRecords") or stage.get("inputRecords")
    return found


def batch_breakdown(data_dir: Path, api: str | None, since_ms: float, until_ms: float) -> dict:
    """Where the time of the batches that read orders in the window went, as means per batch.

    From the job's progress rows (the metrics store): Spark's ``durationMs`` phases
    (``latestOffset`` = the source planning the batch on the driver, ``walCommit`` = the offset
    log, ``addBatch`` = running the batch and the sinks, ``commitOffsets`` = the commit log) and
    each lookup's state store commit. From Spark's REST API: the batch's Spark job and its three
    stages; ``sinks_ms`` is ``addBatch`` minus the job (the driver's foreachBatch: the Arrow
    hand-over, the rules, the Parquet files). From the metrics store's ``tasks`` rows: the
    lookups' task time per batch as the listener recorded it.
    """
    rows = [r for r in read_rows(data_dir, "progress") if since_ms <= r["ts_ms"] <= until_ms
            and any(t["topic"] == "orders" and t["rows"] for t in r["topics"])]
    if not rows:
        return {"batches": 0}
    phases: dict[str, list] = {}
    for row in rows:
        for phase, ms in (row.get("duration_ms") or {}).items():
            phases.setdefault(phase, []).append(ms)
    out = {"batches": len(rows), "mean_orders": _mean(r["num_input_rows"] for r in rows),
           "mean_batch_ms": _mean(r["batch_duration_ms"] for r in rows),
           "progress_ms": {phase: _mean(values) for phase, values in sorted(phases.items())}}
    for op in ("user_lookup", "item_lookup"):
        out["progress_ms"][f"{op}_state_commit"] = _mean(s["commit_ms"] for r in rows for s in r["state"]
                                                         if s["operator"] == op)
    ids = {r["batch_id"] for r in rows}
    try:
        stages = spark_stages(api, ids)
    except Exception as exc:  # the UI is best effort: report why it is missing
        stages, out["spark_api_error"] = {}, f"{type(exc).__name__}: {exc}"
    if stages:
        keys = sorted({key for entry in stages.values() for key in entry})
        out["spark_ms"] = {key: _mean(entry.get(key) for entry in stages.values()) for key in keys}
        add_batch = {r["batch_id"]: (r.get("duration_ms") or {}).get("addBatch") for r in rows}
        out["spark_ms"]["sinks_ms"] = _mean(add_batch[b] - entry["job_ms"] for b, entry in stages.items()
                                            if add_batch.get(b) is not None)
        out["spark_batches"] = len(stages)
    tasks = [t for t in read_rows(data_dir, "tasks") if t["batch_id"] in ids]
    for op in ("user_lookup", "item_lookup"):
        per_batch: dict[int, int] = {}
        for t in tasks:
            if t["stage"] == op:
                per_batch[t["batch_id"]] = per_batch.get(t["batch_id"], 0) + t["duration_ms"]
        out.setdefault("metrics_tasks_ms", {})[op] = _mean(per_batch.values())
    return out


def start_job_with(settings, log_path: Path, extra: dict):
    """:func:`bench.common.start_job` with more ``--set`` flags for the job process (settings that
    tests/jobproc.py does not pass on, such as ``spark.shuffle_partitions``)."""
    import jobproc

    if not extra:
        return start_job(settings, log_path)
    plain = jobproc.cli_args
    jobproc.cli_args = lambda s: plain(s) + [arg for key, value in extra.items() for arg in ("--set", f"{key}={value}")]
    try:
        return start_job(settings, log_path)
    finally:
        jobproc.cli_args = plain


def measure_rate(rate: int, args, client, topics, orders_table, start: int, watcher: SinkWatcher,
                 baseline: ConsumerBaseline, data_dir: Path, check, api: str | None) -> dict:
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
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "breakdown": batch_breakdown(data_dir, api, measured_from, gave_up_ms),
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
    print("\nwhere a batch's time goes (means over the batches that read orders; ms):")
    for r in result["rates"]:
        b = r.get("breakdown") or {}
        if not b.get("batches"):
            continue
        p, k = b["progress_ms"], b.get("spark_ms", {})
        print(f"{r['rate']:>8,}/s: {b['batches']} batches of {b['mean_orders']:,} orders, {b['mean_batch_ms']:,} ms each "
              f"(load {r['load_average'][0]:.1f}): plan {p.get('latestOffset')} + offsets {p.get('walCommit')} + "
              f"run {p.get('addBatch')} [source+parse {k.get('source_parse_ms')}, user lookup {k.get('user_lookup_ms')}, "
              f"item lookup {k.get('item_lookup_ms')}, sinks {k.get('sinks_ms')}] + commit {p.get('commitOffsets')} "
              f"(state commits {p.get('user_lookup_state_commit')} / {p.get('item_lookup_state_commit')}), "
              f"query planning {p.get('queryPlanning')}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="2000,5000,10000", help="comma-separated orders/s, ascending")
    parser.add_argument("--seconds", type=int, default=30, help="publishing time per rate")
    parser.add_argument("--settle", type=float, default=5.0, help="leading seconds of each rate not measured")
    parser.add_argument("--warmup-seconds", type=int, default=10, help="unmeasured publishing before the first rate")
    parser.add_argument("--drain", type=float, default=20.0, help="seconds the job gets to catch up after each rate")
    parser.add_argument("--trigger", default="", help="job.trigger_interval (e.g. 0.5s); the job's default if empty")
    parser.add_argument("--shuffle-partitions", type=int, default=0,
                        help="spark.shuffle_partitions for the job (the lookups' state partitions); 0: the job's default")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=2_000)
    args = parser.parse_args(argv)
    rates = sorted(int(r) for r in args.rates.split(","))
    began = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
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
            "spark.master": "local[2]", **({"job.trigger_interval": args.trigger} if args.trigger else {}),
            **{f"topics.{k}": v for k, v in topics.items()}})
        args.trigger_s = settings["job.trigger_interval"]
        client = make_client(broker.service_url)
        cleanup.callback(client.close)
        loaded = {kind: publish_records(client, topics[kind], kind, table_records(tables[kind]), checked=True).sent
                  for kind in ("users", "items")}
        print(f"published {loaded['users']:,} users and {loaded['items']:,} items; starting the job…", flush=True)
        log_path = work / "job.log"
        spawned = time.perf_counter()
        extra = {"spark.shuffle_partitions": args.shuffle_partitions} if args.shuffle_partitions else {}
        job = start_job_with(settings, log_path, extra)
        cleanup.callback(job.stop)
        check = alive(job, log_path)

        def state_loaded() -> bool:
            # messages read (a topic's rows in a progress row count entries, not messages)
            return sum(r["num_input_rows"] for r in read_rows(settings.data_dir, "progress")) >= sum(loaded.values())

        wait_until(state_loaded, timeout=300, what="the job to load users and items", interval=0.2, check=check)
        print(f"the job loaded them in {time.perf_counter() - spawned:.0f}s", flush=True)
        api = spark_api(job.proc.pid)
        print(f"Spark REST API: {api or 'not found'}", flush=True)
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
                                   settings.data_dir, check, api)
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
        "date": now_utc(), "machine": {**machine(), "load_average_at_start": load_at_start},
        "workload": {"users": loaded["users"], "items": loaded["items"], "seconds_per_rate": args.seconds,
                     "warmup_s": args.warmup_seconds, "settle_s": args.settle, "drain_s": args.drain, "spark_master": "local[2]",
                     "trigger_interval_s": args.trigger_s, "max_wait_s": settings["enrichment.max_wait"],
                     "max_rows_per_batch": settings["job.max_rows_per_batch"],
                     "shuffle_partitions": args.shuffle_partitions or "default (the cores: 2)"},
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
