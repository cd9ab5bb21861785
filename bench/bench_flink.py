"""Our job beside its Flink peer (bench/peers/flink/), in one run, on the same data and the
same Apache Pulsar broker: orders/s with 1M users in state, p99 latency at 5,000 orders/s,
kill -9 to the first result after the restart, and memory (RSS).

One Apache Pulsar 3.0.7 standalone (pipeline/feed/apache_broker.py, `make apache-pulsar`) holds the
generated users and items (pipeline/feed/datagen.py); both engines read the same three topics, the
Flink peer through Flink's own Pulsar connector (4.1.0-1.18). Each engine runs alone while it
is measured (2 cores): our job as ``python -m pipeline run`` (local[2]), the peer as
``java -jar`` of its shaded jar (a MiniCluster, parallelism 2, heap 1 GB, 256 MB managed
memory for RocksDB), started and stopped by PID and dying with this process. In order:

1. **state**: each engine reads the 1M users and 10k items with the orders topic still empty
   and is stopped once its state holds them (ours: its batches read every changelog message;
   the peer: its sources emitted them all and a checkpoint completed after that, then kill -9);
2. the orders are published (batched, as our producers do);
3. **ours**: the job is started on its checkpoint and drains the orders (throughput; memory
   sampled every second), then takes 5,000 orders/s for ``--seconds`` (latency), then, with
   orders still arriving at 1,000/s, gets kill -9 and is started again (recovery);
4. **the peer**: the same three steps, started from its newest retained checkpoint; its
   backlog also holds the orders published in step 3.

Figures and how each is counted, the same way for both engines:

- throughput: order rows decided / (last decision time - first decision time), the times the
  engines stamp on the rows (``enriched_at``, ``detected_at``); ours also has its sustained
  rate from Spark's progress rows, as bench_throughput.py reports it;
- latency: when an enriched row is first visible to a reader of the sink (our Delta tables'
  current files; the peer's JSON-lines files, flushed every 50 ms), minus its publish time;
  a plain pulsar-client reader on the same topic at the same time is the floor;
- recovery: from the kill -9 to the first result of the new process (ours: its first batch
  committed; the peer: its first row in a file of the new process);
- memory: RSS of the engine's processes (ours: the driver, its JVM and the Python workers; the
  peer: its one JVM), peak during the drain and at its end.

Delivery differs and is said beside the figures: our sinks are exactly-once; the peer's are
at-least-once (rows after its last checkpoint are written again after a restart). Where the
time goes: Spark's progress durations for ours; for the peer, a JFR recording of the drain
(execution samples per task thread and per package of the top frame).

    python -m bench.bench_flink                                   # 1M users, 2M orders
    python -m bench.bench_flink --users 50000 --orders 200000 --seconds 15   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, bench_topics, guard, iter_records, job_memory, load_average,  # noqa: E402
                          machine, now_utc, percentile, ratio, rss_bytes, start_job, wait_until, write_result)
from pipeline import store  # noqa: E402
from pipeline.feed.broker import die_with_parent  # noqa: E402
from pipeline.feed.ports import find_free_port  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.feed.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.feed.producers import publish_records  # noqa: E402
from pipeline.sinks import last_committed_batch  # noqa: E402
from pipeline.feed.topics import make_client  # noqa: E402

NAME = "flink"
PEER_DIR = ROOT / "bench" / "peers" / "flink"
PEER_JAR = PEER_DIR / "target" / "flink-peer-1.jar"
JAVA_HOME = Path("/usr/lib/jvm/java-17-openjdk-amd64")
# What Flink 1.18 opens on Java 17 (its docs' env.java.opts.all for Java 17).
JAVA_OPENS = [f"--add-opens=java.base/{p}=ALL-UNNAMED" for p in (
    "java.util", "java.lang", "java.lang.reflect", "java.io", "java.net", "java.nio", "sun.nio.ch", "java.text",
    "java.time", "java.util.concurrent", "java.util.concurrent.atomic", "java.util.concurrent.locks")]
PEER_HEAP = "1g"
ORDER_SINKS = ("enriched", "missing_state")
POLL_S = 0.02
RECOVERY_RATE, RECOVERY_SECONDS, KILL_AFTER_S = 1_000, 30, 8


# ---------------------------------------------------------------------------- the peer process
def java() -> str:
    candidate = JAVA_HOME / "bin" / "java"
    return str(candidate) if candidate.exists() else (shutil.which("java") or "java")


class FlinkPeer:
    """The peer's MiniCluster as a ``java -jar`` process: started, killed and stopped by PID.

    ``start(restore=True)`` starts from the newest retained checkpoint. The process gets
    SIGTERM if this one dies (PR_SET_PDEATHSIG); all its ports are on 127.0.0.1.
    """

    def __init__(self, work: Path, service_url: str, topics: dict, max_wait_ms: int):
        self.work, self.service_url, self.topics, self.max_wait_ms = work, service_url, topics, max_wait_ms
        self.sinks, self.checkpoints = work / "sinks", work / "checkpoints"
        self.rest_port = find_free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, restore: bool, jfr: Path | None = None) -> float:
        """Spawn the JVM; returns the time.time() it was spawned."""
        self.starts += 1
        options = [f"-Xmx{PEER_HEAP}", f"-Xms{PEER_HEAP}", *JAVA_OPENS]
        if jfr is not None:
            options.append(f"-XX:StartFlightRecording=name=peer,settings=profile,filename={jfr}")
        command = [java(), *options, "-jar", str(PEER_JAR), "--service-url", self.service_url,
                   "--users-topic", self.topics["users"], "--items-topic", self.topics["items"],
                   "--orders-topic", self.topics["orders"], "--sinks", str(self.sinks),
                   "--checkpoints", str(self.checkpoints), "--max-wait-ms", str(self.max_wait_ms),
                   "--rest-port", str(self.rest_port), "--restore", "true" if restore else "false"]
        log = open(self.work / f"peer-{self.starts}.log", "ab")
        spawned = time.time()
        self.proc = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     preexec_fn=die_with_parent)
        log.close()
        return spawned

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.work / f"peer-{self.starts}.log").read_text(errors="replace").strip().splitlines()[-15:]
            raise BenchError(f"the Flink peer exited with code {self.proc.returncode}:\n" + "\n".join(tail))

    def kill9(self) -> float:
        """SIGKILL, as a crash; returns the time.time() of the kill."""
        killed = time.time()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        return killed

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rest(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=10) as response:
            return json.loads(response.read())

    def job(self) -> dict | None:
        """The running job's details from Flink's REST API (vertices and their record counts)."""
        try:
            running = [j for j in self.rest("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
            return self.rest(f"/jobs/{running[0]['jid']}") if running else None
        except (OSError, ValueError, KeyError):
            return None

    def records_out(self, source: str) -> int:
        """Records the vertex of the Pulsar source named ``pulsar <source>`` sent on."""
        job = self.job() or {}
        return sum(v["metrics"].get("write-records", 0) for v in job.get("vertices", [])
                   if f"pulsar {source}" in v["name"])

    def completed_checkpoint_after(self, since_ms: float) -> bool:
        job = self.job()
        if job is None:
            return False
        try:
            latest = self.rest(f"/jobs/{job['jid']}/checkpoints")["latest"]["completed"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return bool(latest) and latest["trigger_timestamp"] > since_ms


class PeerSinkTail:
    """Follows the peer's JSON-lines sink files: when each row first became visible (polled every
    20 ms) and its publish time, decision time, line item and file. Only whole lines count."""

    def __init__(self, sinks: Path):
        self.sinks = sinks
        self.offsets: dict[Path, int] = {}
        self.rows: list[tuple[str, float, int, int, int, str]] = []  # sink, seen ms, published, decided, line, file
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=guard, args=(self._run, self.errors), name="peer-tail", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(POLL_S)

    def poll(self) -> None:
        for sink in ORDER_SINKS:
            folder = self.sinks / sink
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.jsonl")):
                start = self.offsets.get(path, 0)
                with open(path, "rb") as handle:
                    handle.seek(start)
                    chunk = handle.read()
                end = chunk.rfind(b"\n")
                if end < 0:
                    continue
                seen = time.time() * 1000
                decided = "enriched_at" if sink == "enriched" else "detected_at"
                for line in chunk[: end + 1].splitlines():
                    row = json.loads(line)
                    self.rows.append((sink, seen, row["published_at"], row[decided], row["line_item_id"], path.name))
                self.offsets[path] = start + end + 1

    def count(self) -> int:
        return len(self.rows)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        if self.errors:
            raise BenchError(f"the peer's sink tail failed: {self.errors[0]!r}") from self.errors[0]


# ---------------------------------------------------------------------------- figures
def decision_rate(decided_ms: list[int]) -> dict:
    """Orders over the span from the first decision to the last (both engines' common measure)."""
    if len(decided_ms) < 2:
        return {"orders": len(decided_ms), "orders_per_s": None}
    span = (max(decided_ms) - min(decided_ms)) / 1000
    return {"orders": len(decided_ms), "span_s": round(span, 2), "orders_per_s": round(len(decided_ms) / span) if span else None}


def latency_summary(latencies_ms: list[float]) -> dict:
    p50, p99 = percentile(latencies_ms, 50), percentile(latencies_ms, 99)
    return {"rows": len(latencies_ms), "p50_s": None if p50 is None else round(p50 / 1000, 3),
            "p99_s": None if p99 is None else round(p99 / 1000, 3),
            "max_s": round(max(latencies_ms) / 1000, 3) if latencies_ms else None}


class MemorySampler:
    """RSS of a process tree every second, in a thread: the peak and the last sample, in MB."""

    def __init__(self, measure):
        self.measure, self.samples = measure, []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=guard, args=(self._run, self.errors), daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(self.measure())
            self.stop.wait(1.0)

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=10)
        values = [s for s in self.samples if s]
        return {"peak_mb": round(max(values)), "end_mb": round(values[-1]), "samples": len(values)} if values else {}


def our_memory_mb(pid: int) -> float:
    return job_memory(pid)["total_mb"]


def peer_memory_mb(pid: int) -> float:
    return rss_bytes(pid) / 1e6


def publish_steady(client, topic: str, table, start: int, count: int, rate: int, errors: list) -> threading.Thread:
    """Publish rows ``start:start+count`` at ``rate``/s in a thread (the recovery's live traffic)."""
    thread = threading.Thread(target=guard, args=(publish_records, errors, client, topic, "orders",
                                                  iter_records(table, start, start + count)),
                              kwargs={"rate": rate, "checked": True}, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------------------- profiles
def summarise_jfr(recording: Path, top: int = 8) -> dict:
    """Execution samples of a JFR recording, per thread group (Flink names its task threads after
    their operator chain) and per package of the top Java frame."""
    jfr = JAVA_HOME / "bin" / "jfr"
    done = subprocess.run([str(jfr), "print", "--json", "--stack-depth", "3", "--events", "jdk.ExecutionSample",
                           str(recording)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[:200]}
    events = json.loads(done.stdout)["recording"]["events"]
    threads, packages = Counter(), Counter()
    for event in events:
        values = event["values"]
        name = (values.get("sampledThread") or {}).get("javaName") or "?"
        threads[_thread_group(name)] += 1
        frames = (values.get("stackTrace") or {}).get("frames") or []
        method = frames[0]["method"] if frames else None
        package = method["type"]["package"]["name"] if method and method["type"].get("package") else "?"
        packages[_package_group(package or "?")] += 1
    total = sum(threads.values()) or 1
    return {"samples": total,
            "by_thread_pct": {name: round(100 * n / total, 1) for name, n in threads.most_common(top)},
            "by_top_frame_pct": {name: round(100 * n / total, 1) for name, n in packages.most_common(top)}}


def _thread_group(name: str) -> str:
    base = name.split(" (", 1)[0]  # "user lookup (1/2)#0" -> "user lookup"
    for prefix in ("pulsar-client-io", "pulsar-client-internal", "pulsar-timer", "pulsar-external-listener",
                   "Flink Netty", "flink-akka", "pekko", "Checkpoint", "AsyncOperations", "jobmanager-io",
                   "flink-pekko", "Legacy Source Thread", "Source Data Fetcher"):
        if base.startswith(prefix):
            return prefix
    return base


def _package_group(package: str) -> str:
    package = package.replace("/", ".")
    for prefix, group in (("org.rocksdb", "RocksDB (JNI)"), ("com.fasterxml.jackson", "Jackson (JSON)"),
                          ("statefulstreams", "the peer's functions"), ("org.apache.pulsar", "Pulsar client"),
                          ("org.apache.flink.shaded.netty", "Flink's Netty"), ("io.netty", "Netty (Pulsar)"),
                          ("org.apache.flink.api", "Flink serializers"),
                          ("org.apache.flink.core.memory", "Flink serializers"),
                          ("org.apache.flink.contrib.streaming.state", "Flink RocksDB backend"),
                          ("org.apache.flink.runtime", "Flink runtime"),
                          ("org.apache.flink.streaming", "Flink streaming runtime"),
                          ("org.apache.flink.connector", "Flink Pulsar connector"),
                          ("java.", "JDK"), ("sun.", "JDK"), ("jdk.", "JDK")):
        if package.startswith(prefix):
            return group
    return package or "?"


# ---------------------------------------------------------------------------- our job
def our_settings(work: Path, broker, topics: dict, max_wait: str):
    return load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "ours"),
        "spark.master": "local[2]", "enrichment.max_wait": max_wait, **{f"topics.{k}": v for k, v in topics.items()}})


def our_rows_decided(data_dir: Path, sinks: tuple[str, ...] = ORDER_SINKS) -> int:
    import duckdb

    from pipeline.sinks import sink_files

    total = 0
    for sink in sinks:
        files = sink_files(data_dir, sink)
        if files:
            total += duckdb.execute("select count(*) from read_parquet($files)", {"files": files}).fetchone()[0]
    return total


def our_decision_times(data_dir: Path, since_ms: float) -> list[int]:
    import duckdb

    from pipeline.sinks import sink_files

    times = []
    for sink, column in (("enriched", "enriched_at"), ("missing_state", "detected_at")):
        files = sink_files(data_dir, sink)
        if files:
            times += [r[0] for r in duckdb.execute(
                f"select epoch_ms({column}) from read_parquet($files) where epoch_ms({column}) >= $since",
                {"files": files, "since": int(since_ms)}).fetchall()]
    return times


def recount_latency(latency: dict, watcher, baseline, since_ms: float, until_ms: float) -> None:
    """Our latencies again from what bench_latency's SinkWatcher saw, with the publish times in
    milliseconds: the Delta files hold ``published_at`` in microseconds (Delta's timestamp), which
    its millisecond window does not match. Orders not visible when the engine gave up count with
    a lower bound, as bench_latency does."""
    def ms(value: int) -> float:
        return value / 1000 if value > 10**14 else value

    visible, decided = [], 0
    for (sink, _), (seen, published) in list(watcher.batches.items()):
        for value in map(ms, published):
            if since_ms <= value <= until_ms:
                decided += 1
                if sink == "enriched":
                    visible.append(seen - value)
    read = baseline.latencies_ms(since_ms, until_ms)
    censored = 0 if latency["kept_up"] else max(0, len(read) - decided)
    gave_up = time.time() * 1000
    latency["job_enriched"] = latency_summary(visible + [gave_up - until_ms] * censored)
    latency["not_visible_at_deadline"] = censored
    latency["job_p99_vs_consumer_p99"] = ratio(latency["job_enriched"]["p99_s"], latency["consumer"]["p99_s"])


def run_ours(settings, work: Path, cleanup: ExitStack, label: str):
    log_path = work / f"ours-{label}.log"
    job = start_job(settings, log_path)
    cleanup.callback(job.stop)
    return job, alive(job, log_path)


def measure_ours(args, settings, work, cleanup, client, topics, orders, slices: dict) -> dict:
    """Throughput, latency and recovery of our job (its state loaded already)."""
    from bench.bench_latency import ConsumerBaseline, SinkWatcher, measure_rate
    from bench.bench_throughput import job_figures

    data_dir, checkpoint = settings.data_dir, store.checkpoint_dir(settings.data_dir)
    loaded_batch = last_committed_batch(checkpoint)
    print("ours: draining the orders…", flush=True)
    started_ms = time.time() * 1000
    spawned = time.perf_counter()
    job, check = run_ours(settings, work, cleanup, "drain")
    memory = MemorySampler(lambda: our_memory_mb(job.proc.pid))
    wait_until(lambda: our_rows_decided(data_dir) >= args.orders, timeout=3600, what="our job to drain the orders",
               interval=2.0, check=check)
    wall = time.perf_counter() - spawned
    throughput = {**decision_rate(our_decision_times(data_dir, started_ms)), "load_average": load_average(),
                  "by_sink": {sink: our_rows_decided(data_dir, (sink,)) for sink in ORDER_SINKS},
                  "memory": memory.close(), "spark": job_figures(
                      [p for p in read_rows(data_dir, "progress") if p["batch_id"] > loaded_batch], wall)}
    print(f"  {throughput['orders_per_s']:,} orders/s (Spark's sustained {throughput['spark']['orders_per_s']:,.0f}); "
          f"RSS peak {throughput['memory'].get('peak_mb')} MB", flush=True)

    print(f"ours: {args.rate:,} orders/s for {args.seconds}s…", flush=True)
    watcher = SinkWatcher(data_dir)
    baseline = ConsumerBaseline(settings["pulsar.service_url"], topics["orders"])
    try:
        wait_until(lambda: watcher.rows() >= args.orders, timeout=300, what="the watcher to read the sinks")
        rate_args = SimpleNamespace(seconds=args.seconds, settle=args.settle, drain=args.drain,
                                    trigger_s=settings["job.trigger_interval"])
        began_ms = time.time() * 1000
        latency = measure_rate(args.rate, rate_args, client, topics, orders, slices["ours_latency"][0], watcher,
                               baseline, data_dir, check, None)
        recount_latency(latency, watcher, baseline, began_ms + args.settle * 1000, began_ms + args.seconds * 1000 + 500)
    finally:
        watcher.close()
        baseline.close()
    print(f"  p50 {latency['job_enriched']['p50_s']} s, p99 {latency['job_enriched']['p99_s']} s "
          f"(reader p99 {latency['consumer']['p99_s']} s)", flush=True)

    print("ours: kill -9 with orders arriving…", flush=True)
    errors: list = []
    start, count = slices["ours_recovery"]
    publisher = publish_steady(client, topics["orders"], orders, start, count, RECOVERY_RATE, errors)
    time.sleep(KILL_AFTER_S)
    killed_after = last_committed_batch(checkpoint)
    killed = time.perf_counter()
    job.kill9()
    job, check = run_ours(settings, work, cleanup, "restart")
    wait_until(lambda: last_committed_batch(checkpoint) > killed_after, timeout=300,
               what="our first batch after kill -9", interval=POLL_S, check=check)
    recovery = {"to_first_result_s": round(time.perf_counter() - killed, 2), "load_average": load_average()}
    publisher.join(timeout=RECOVERY_SECONDS * 3)
    job.stop()
    if errors:
        raise BenchError(f"publishing during our recovery failed: {errors[0]!r}")
    print(f"  kill -9 to the first batch: {recovery['to_first_result_s']} s", flush=True)
    return {"throughput": throughput, "latency": latency, "recovery": recovery}


# ---------------------------------------------------------------------------- the peer
def measure_peer(args, peer: FlinkPeer, work, client, topics, orders, slices: dict, expected: int) -> dict:
    """Throughput, latency and recovery of the Flink peer (its state in its newest checkpoint)."""
    from bench.bench_latency import ConsumerBaseline

    print(f"peer: draining {expected:,} orders from its checkpoint…", flush=True)
    tail = PeerSinkTail(peer.sinks)
    recording = work / "peer-drain.jfr"
    peer.start(restore=True, jfr=recording if args.profile else None)
    memory = MemorySampler(lambda: peer_memory_mb(peer.proc.pid))
    wait_until(lambda: tail.count() >= expected, timeout=3600, what="the peer to drain the orders", interval=0.5,
               check=peer.check)
    throughput = {**decision_rate([r[3] for r in tail.rows]), "load_average": load_average(), "memory": memory.close()}
    distinct = len({r[4] for r in tail.rows})
    throughput["rows_written"], throughput["distinct_orders"] = tail.count(), distinct
    throughput["by_sink"] = dict(Counter(r[0] for r in tail.rows))
    if args.profile:
        dumped = work / "peer-drain-dump.jfr"
        subprocess.run([str(JAVA_HOME / "bin" / "jcmd"), str(peer.proc.pid), "JFR.dump", "name=peer",
                        f"filename={dumped}"], capture_output=True, timeout=120)
        subprocess.run([str(JAVA_HOME / "bin" / "jcmd"), str(peer.proc.pid), "JFR.stop", "name=peer"],
                       capture_output=True, timeout=120)  # the latency step runs without it
        throughput["profile"] = summarise_jfr(dumped) if dumped.exists() else {"error": "no JFR dump"}
    print(f"  {throughput['orders_per_s']:,} orders/s; RSS peak {throughput['memory'].get('peak_mb')} MB", flush=True)

    print(f"peer: {args.rate:,} orders/s for {args.seconds}s…", flush=True)
    baseline = ConsumerBaseline(peer.service_url, topics["orders"])
    start, count = slices["peer_latency"]
    before = tail.count()
    began_ms = time.time() * 1000
    stats = publish_records(client, topics["orders"], "orders", iter_records(orders, start, start + count),
                            rate=args.rate, checked=True)
    ended_ms = time.time() * 1000
    kept_up = True
    try:
        wait_until(lambda: tail.count() >= before + stats.sent, timeout=args.drain, what="the peer to catch up",
                   check=peer.check)
    except BenchError:
        kept_up = False
    measured_from = began_ms + args.settle * 1000
    visible = [seen - published for sink, seen, published, _, _, _ in list(tail.rows)
               if sink == "enriched" and measured_from <= published <= ended_ms]
    read = baseline.latencies_ms(measured_from, ended_ms)
    baseline.close()
    latency = {"rate": args.rate, "achieved_msgs_per_s": round(stats.msgs_per_s), "published": stats.sent,
               "kept_up": kept_up, "job_enriched": latency_summary(visible), "consumer": latency_summary(read),
               "load_average": load_average()}
    latency["job_p99_vs_consumer_p99"] = ratio(latency["job_enriched"]["p99_s"], latency["consumer"]["p99_s"])
    print(f"  p50 {latency['job_enriched']['p50_s']} s, p99 {latency['job_enriched']['p99_s']} s "
          f"(reader p99 {latency['consumer']['p99_s']} s)", flush=True)

    print("peer: kill -9 with orders arriving…", flush=True)
    errors: list = []
    start, count = slices["peer_recovery"]
    publisher = publish_steady(client, topics["orders"], orders, start, count, RECOVERY_RATE, errors)
    time.sleep(KILL_AFTER_S)
    files_before = {r[5] for r in tail.rows} | {p.name for s in ORDER_SINKS for p in (peer.sinks / s).glob("*.jsonl")}
    killed = peer.kill9()
    peer.start(restore=True)
    wait_until(lambda: any(r[5] not in files_before for r in list(tail.rows)), timeout=300,
               what="the peer's first row after kill -9", interval=POLL_S, check=peer.check)
    first = min(r[1] for r in list(tail.rows) if r[5] not in files_before)
    recovery = {"to_first_result_s": round((first - killed * 1000) / 1000, 2), "load_average": load_average()}
    publisher.join(timeout=RECOVERY_SECONDS * 3)
    time.sleep(3)
    lines = Counter(r[4] for r in list(tail.rows))
    recovery["rows_written_again"] = sum(n - 1 for n in lines.values() if n > 1)
    peer.stop()
    tail.close()
    if errors:
        raise BenchError(f"publishing during the peer's recovery failed: {errors[0]!r}")
    print(f"  kill -9 to the first row: {recovery['to_first_result_s']} s "
          f"({recovery['rows_written_again']:,} rows written again: at-least-once)", flush=True)
    return {"throughput": throughput, "latency": latency, "recovery": recovery}


# ---------------------------------------------------------------------------- the run
def build_peer() -> None:
    """The peer's jar, built by Maven from Maven Central (``make flink-peer`` does the same)."""
    if PEER_JAR.exists():
        return
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BenchError("the Flink peer needs Maven to build: apt-get install maven")
    done = subprocess.run([mvn, "-B", "-q", "-s", str(PEER_DIR / "settings.xml"), "-f", str(PEER_DIR / "pom.xml"),
                           "package", "-DskipTests"], capture_output=True, text=True)
    if done.returncode != 0 or not PEER_JAR.exists():
        raise BenchError(f"building the Flink peer failed: {done.stdout[-500:]}{done.stderr[-500:]}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--orders", type=int, default=2_000_000, help="the backlog each engine drains")
    parser.add_argument("--rate", type=int, default=5_000, help="orders/s of the latency step")
    parser.add_argument("--seconds", type=int, default=30, help="publishing time of the latency step")
    parser.add_argument("--settle", type=float, default=5.0, help="leading seconds of the latency step not measured")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds an engine gets to catch up after it")
    parser.add_argument("--max-wait", default="0s",
                        help="enrichment.max_wait of both engines (0s, as bench_throughput: unknown ids are never "
                             "found, and a wait would put max_wait into the decision span)")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="no JFR recording of the peer")
    args = parser.parse_args(argv)
    from pipeline.feed.apache_broker import PULSAR_VERSION, ApacheBroker, fetch_jars
    from pipeline.setting_values import parse_duration

    began = time.perf_counter()
    load_at_start = load_average()
    build_peer()
    fetch_jars()
    latency_rows, recovery_rows = args.rate * args.seconds, RECOVERY_RATE * RECOVERY_SECONDS
    sizes = {"throughput": args.orders, "ours_latency": latency_rows, "ours_recovery": recovery_rows,
             "peer_latency": latency_rows, "peer_recovery": recovery_rows}
    slices, at = {}, 0
    for name, size in sizes.items():
        slices[name], at = (at, size), at + size
    tables = generate(args.users, args.items, at, seed=29)
    orders = tables["orders"]
    print(f"generated {tables['users'].rows:,} user versions, {tables['items'].rows:,} items, {orders.rows:,} orders",
          flush=True)
    topics = bench_topics("flink")
    work = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    max_wait_ms = int(parse_duration(args.max_wait) * 1000)
    with ExitStack() as cleanup:  # unwinds in reverse: engines and clients stop before the broker
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        broker = cleanup.enter_context(ApacheBroker(work / "broker"))
        print(f"Apache Pulsar {PULSAR_VERSION} at {broker.service_url}", flush=True)
        client = make_client(broker.service_url)
        cleanup.callback(client.close)
        counts = {}
        for kind in ("users", "items"):
            started = time.perf_counter()
            counts[kind] = publish_records(client, topics[kind], kind, iter_records(tables[kind]), checked=True).sent
            print(f"published {counts[kind]:,} {kind} in {time.perf_counter() - started:.0f}s", flush=True)
        changelogs = counts["users"] + counts["items"]

        settings = our_settings(work, broker, topics, args.max_wait)
        print("ours: loading the state…", flush=True)
        spawned = time.perf_counter()
        job, check = run_ours(settings, work, cleanup, "load")
        wait_until(lambda: sum(r["num_input_rows"] for r in read_rows(settings.data_dir, "progress")) >= changelogs,
                   timeout=1800, what="our job to read the changelogs", interval=1.0, check=check)
        ours_load_s = round(time.perf_counter() - spawned, 1)
        job.stop()
        print(f"  {ours_load_s} s", flush=True)

        peer = FlinkPeer(work / "peer", broker.service_url, topics, max_wait_ms)
        peer.work.mkdir(parents=True)
        cleanup.callback(peer.stop)
        print("peer: loading the state…", flush=True)
        spawned = time.perf_counter()
        peer.start(restore=False)
        wait_until(lambda: peer.records_out("users") >= counts["users"] and peer.records_out("items") >= counts["items"],
                   timeout=1800, what="the peer to read the changelogs", interval=1.0, check=peer.check)
        read_ms = time.time() * 1000
        wait_until(lambda: peer.completed_checkpoint_after(read_ms), timeout=600,
                   what="a peer checkpoint after the changelogs", interval=0.5, check=peer.check)
        peer_load_s = round(time.perf_counter() - spawned, 1)
        peer.kill9()
        print(f"  {peer_load_s} s", flush=True)

        started = time.perf_counter()
        published = publish_records(client, topics["orders"], "orders", iter_records(orders, 0, args.orders),
                                    checked=True).sent
        print(f"published {published:,} orders in {time.perf_counter() - started:.0f}s", flush=True)

        ours = measure_ours(args, settings, work, cleanup, client, topics, orders, slices)
        peer_backlog = args.orders + latency_rows + recovery_rows
        theirs = measure_peer(args, peer, peer.work, client, topics, orders, slices, peer_backlog)
    ours["state_load_s"], theirs["state_load_s"] = ours_load_s, peer_load_s

    def vs(key: str, path: tuple[str, ...]) -> float | None:
        def get(d):
            for part in path:
                d = (d or {}).get(part)
            return d
        return ratio(get(ours[key]), get(theirs[key]))

    result = {
        "date": now_utc(), "machine": {**machine(), "load_average_at_start": load_at_start},
        "workload": {"users_messages": counts["users"], "items": counts["items"], "orders": args.orders,
                     "latency_rate": args.rate, "latency_seconds": args.seconds, "max_wait": args.max_wait,
                     "broker": f"Apache Pulsar {PULSAR_VERSION} standalone, one for both engines",
                     "ours": "python -m pipeline run, local[2], exactly-once Delta sinks",
                     "peer": f"Flink 1.18.1 MiniCluster (java -jar), parallelism 2, heap {PEER_HEAP}, 256 MB managed, "
                             "Flink's Pulsar connector 4.1.0-1.18, RocksDB, checkpoints every 1 s, "
                             "at-least-once JSON-lines sinks"},
        "ours": ours, "flink": theirs,
        "throughput_ours_vs_flink": vs("throughput", ("orders_per_s",)),
        "p99_ours_vs_flink": vs("latency", ("job_enriched", "p99_s")),
        "recovery_ours_vs_flink": vs("recovery", ("to_first_result_s",)),
        "memory_peak_ours_vs_flink": vs("throughput", ("memory", "peak_mb")),
        "wall_s": round(time.perf_counter() - began, 1),
    }
    write_result(NAME, result)
    print_table(result)
    return result


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Rows of bench/run.py's table: (figure, ours, the Flink peer in the same run, ours/Flink)."""
    ours, theirs = result["ours"], result["flink"]
    users = f"{result['workload']['users_messages']:,} user versions"

    def load(figures: dict) -> str:
        return f" (load {figures['load_average'][0]:.1f})" if figures.get("load_average") else ""

    def value(figures: dict, text: str) -> str:
        return text + load(figures)

    t, tf = ours["throughput"], theirs["throughput"]
    lat, latf = ours["latency"], theirs["latency"]
    rec, recf = ours["recovery"], theirs["recovery"]
    mem, memf = t.get("memory", {}), tf.get("memory", {})
    rate = result["workload"]["latency_rate"]
    flag = {True: "", False: " (fell behind)"}
    return [
        (f"vs Flink: orders/s drained, {users} in state (same broker, same data)",
         value(t, f"{t['orders_per_s']:,}"), value(tf, f"Flink peer {tf['orders_per_s']:,}"),
         _ratio(result["throughput_ours_vs_flink"])),
        (f"vs Flink: p99 latency at {rate:,}/s, publish to visible in the sink",
         value(lat, f"{lat['job_enriched']['p99_s']} s{flag[lat['kept_up']]}"),
         value(latf, f"Flink peer {latf['job_enriched']['p99_s']} s{flag[latf['kept_up']]}"),
         _ratio(result["p99_ours_vs_flink"])),
        ("vs Flink: kill -9 to first result after restart",
         value(rec, f"{rec['to_first_result_s']} s"),
         value(recf, f"Flink peer {recf['to_first_result_s']} s (at-least-once: "
                     f"{recf.get('rows_written_again', 0):,} rows written again)"),
         _ratio(result["recovery_ours_vs_flink"])),
        ("vs Flink: RSS peak while draining (MB)", f"{mem.get('peak_mb', 0):,}",
         f"Flink peer {memf.get('peak_mb', 0):,} (one JVM)", _ratio(result["memory_peak_ours_vs_flink"])),
    ]


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def print_table(result: dict) -> None:
    ours, theirs = result["ours"], result["flink"]
    rows = [("orders/s, 1M users in state", ours["throughput"]["orders_per_s"], theirs["throughput"]["orders_per_s"],
             result["throughput_ours_vs_flink"]),
            (f"p99 latency at {result['workload']['latency_rate']:,}/s (s)", ours["latency"]["job_enriched"]["p99_s"],
             theirs["latency"]["job_enriched"]["p99_s"], result["p99_ours_vs_flink"]),
            ("kill -9 to first result (s)", ours["recovery"]["to_first_result_s"],
             theirs["recovery"]["to_first_result_s"], result["recovery_ours_vs_flink"]),
            ("RSS peak while draining (MB)", ours["throughput"]["memory"].get("peak_mb"),
             theirs["throughput"]["memory"].get("peak_mb"), result["memory_peak_ours_vs_flink"])]
    print(f"\n{'figure':<40}{'ours':>12}{'Flink':>12}{'ours/Flink':>12}")
    for name, a, b, r in rows:
        print(f"{name:<40}{a if a is not None else '-':>12}{b if b is not None else '-':>12}"
              f"{f'{r:.2f}' if r is not None else '-':>12}")


if __name__ == "__main__":
    main()
