"""State scale: job memory and throughput with 1M, 5M and 10M users in the lookups' RocksDB state.

One embedded broker and the real job as a process (``python -m pipeline run``, local[2]). The
items are published first and the job started on them: its memory then, with no user in
state, is the baseline. Then, for each step (up to 1M users, up to 5M, up to 10M):

1. **load**: the step's users (datagen's first versions, ids ascending) are published with
   ``pipeline.feed.producers.publish_records`` while the job reads them. Users per second run from
   the first batch that read users to the end of the last one (the job's progress rows); when
   the job keeps up with the publisher, that is the publisher's rate (``publish_msgs_per_s``);
2. **enrich**: the job is stopped (SIGTERM), ``--orders`` orders are published, each for a
   user drawn uniformly from every user in state so far and a published item (so every order
   is found, and the lookups touch the whole keyspace), and the job is started again on that
   backlog. Orders per second run from the second batch that read orders to the end of the
   last one, so the figure is the job's own rate, not the publisher's, and not the restore: the
   first batch after the restart also loads the state from the checkpoint (its time is in the
   restart figure, and the rate with it is kept as ``rows_per_s_with_restore``).

At each step it reports the RSS of the job's process tree (the driver, its JVM with the
RocksDB state stores, and the Python workers, from /proc) once the users are loaded and once
the orders are enriched, with the peaks while it worked, and the tree's PSS (shared pages
counted once; bench/common.py's ``job_memory``); RocksDB's own memory figure
(``memoryUsedBytes`` of both lookups); the state on disk; and the time from the restart to its
first batch (which loads the state from the checkpoint, as after any stop).

Targets (issue 11): RSS does not grow with the users beyond RocksDB's bounded memory (at most
4 GB at 10M users), and orders/s at 10M users at least 0.7 × orders/s at 1M users. Baselines
from the same run: the idle job's RSS with empty user state, the 1M-user step's throughput,
and the raw size of the users' JSON.

A step that leaves less than MEMORY_FLOOR_MB available is stopped with kill -9 and reported:
a benchmark on a shared machine must not wake the OOM killer. Prints a table and writes
``bench/results/state.json``, with the load average at each figure.

    python -m bench.bench_state                                         # 1M, 5M and 10M users
    python -m bench.bench_state --users 50000,200000 --orders 100000    # a quick look
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, available_memory_mb, bench_topics, directory_bytes, iter_records, job_memory,  # noqa: E402
                          machine, now_utc, ratio, start_job, table_records, wait_until, write_result)
from pipeline import store, wire  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.feed.datagen import LATE_SHARE, Table, generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.feed.producers import publish_records  # noqa: E402
from pipeline.sinks import last_committed_batch  # noqa: E402
from pipeline.feed.topics import make_client  # noqa: E402

NAME = "state"
SAMPLE_EVERY_S = 0.5
# On a shared machine a step that gets the machine below this much available memory is
# stopped, rather than wake the OOM killer.
MEMORY_FLOOR_MB = 2_000
RSS_TARGET_MB = 4_000  # at the largest step
THROUGHPUT_TARGET = 0.7  # orders/s at the largest step over orders/s at the smallest


class MemoryExhausted(BenchError):
    """The machine ran low on memory while the job worked; the job was killed."""


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def first_versions(users) -> int:
    """How many leading rows of datagen's users table are first versions (ids ascending)."""
    import numpy as np

    ids = users.columns["id"]
    drops = np.flatnonzero(np.diff(ids) <= 0)
    return int(drops[0]) + 1 if drops.size else users.rows


def json_bytes_estimate(users, rows: int, sample: int = 20_000) -> int:
    """Raw size of the first ``rows`` users' JSON payloads, from an evenly spread sample."""
    step = max(1, rows // sample)
    names = list(users.columns)
    columns = [users.columns[name][:rows:step].tolist() for name in names]
    sizes = [len(wire.encode(dict(zip(names, values)))) for values in zip(*columns)]
    return int(sum(sizes) / len(sizes) * rows)


def orders_against(orders: Table, user_ids, item_ids, seed: int) -> Table:
    """``orders`` with each line's user drawn uniformly from ``user_ids`` and its item from ``item_ids``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    columns = dict(orders.columns)
    invoices = columns["invoiceId"]
    # one user per invoice, as datagen does: draw per invoice, repeat over its lines
    _, first_line, per_invoice = np.unique(invoices, return_index=True, return_inverse=True)
    columns["userId"] = rng.choice(user_ids, first_line.size)[per_invoice]
    columns["itemId"] = rng.choice(item_ids, orders.rows)
    return Table("orders", columns)


class MemorySampler:
    """Samples the job's RSS every half second on a thread; ``peak()`` since the last ``reset()``.
    ``low_memory`` is set once the machine has less than MEMORY_FLOOR_MB available."""

    def __init__(self, pid: int):
        self.pid, self.stop = pid, threading.Event()
        self._peak: dict = {}
        self.low_memory = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            sample = job_memory(self.pid)
            if available_memory_mb() < MEMORY_FLOOR_MB:
                self.low_memory.set()
            with self._lock:
                if sample["total_mb"] > self._peak.get("total_mb", 0):
                    self._peak = sample

    def reset(self) -> None:
        with self._lock:
            self._peak = {}

    def peak(self) -> dict:
        with self._lock:
            return dict(self._peak)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _reads(row: dict, kind: str) -> bool:
    """The progress row's batch read entries of ``kind`` (its topic rows count entries, which
    may hold many messages each; ``num_input_rows`` counts messages)."""
    return any(t["topic"] == kind and t["rows"] for t in row["topics"])


def messages_read(data_dir: Path, since_ms: float = 0) -> int:
    """Messages (all topics) the job read into batches that started after ``since_ms``."""
    return sum(row["num_input_rows"] for row in read_rows(data_dir, "progress") if row["ts_ms"] >= since_ms)


def phase_rate(data_dir: Path, kind: str, since_ms: float, skip_first: bool = False) -> dict:
    """Messages read by the batches that started after ``since_ms`` and read ``kind`` (the only
    topic published in the phase), over the time from the first such batch's start to the last
    one's end. ``skip_first`` leaves the first of them out when there are more (after a restart
    it also loads the state from the checkpoint, which the restart time reports)."""
    batches = [row for row in read_rows(data_dir, "progress") if row["ts_ms"] >= since_ms and _reads(row, kind)]
    if skip_first and len(batches) > 1:
        batches = batches[1:]
    if not batches:
        return {"rows": 0, "batches": 0, "seconds": None, "rows_per_s": None}
    began = batches[0]["ts_ms"]
    ended = max(row["ts_ms"] + row["batch_duration_ms"] for row in batches)
    rows = sum(row["num_input_rows"] for row in batches)
    seconds = (ended - began) / 1000
    return {"rows": rows, "batches": len(batches), "seconds": round(seconds, 1),
            "rows_per_s": round(rows / seconds) if seconds > 0 else None,
            "mean_batch_ms": round(sum(row["batch_duration_ms"] for row in batches) / len(batches)),
            "duration_ms": _mean_phases(batches)}


def _mean_phases(rows) -> dict:
    """Mean of Spark's durationMs per phase over ``rows``."""
    totals: dict[str, float] = {}
    rows = list(rows)
    for row in rows:
        for phase, ms in (row.get("duration_ms") or {}).items():
            totals[phase] = totals.get(phase, 0) + ms
    return {phase: round(ms / len(rows)) for phase, ms in sorted(totals.items())} if rows else {}


def sink_rows_since(data_dir: Path, since_ms: float) -> dict:
    totals = {"enriched": 0, "missing_state": 0, "dead_letter": 0}
    for row in read_rows(data_dir, "progress"):
        if row["ts_ms"] >= since_ms:
            for sink, n in (row.get("sink_rows") or {}).items():
                totals[sink] = totals.get(sink, 0) + n
    return totals


def state_rows(data_dir: Path) -> dict:
    """Per lookup: state rows and RocksDB's memory at the newest batch."""
    rows = read_rows(data_dir, "progress")
    if not rows:
        return {}
    return {op["operator"]: {"rows_total": op["rows_total"], "memory_bytes": op["memory_bytes"]}
            for op in rows[-1]["state"]}


class JobRun:
    """One start of the job: its process, its RSS sampler, and the time to its first batch."""

    def __init__(self, settings, log_path: Path, cleanup: ExitStack):
        self.settings, self.checkpoint = settings, store.checkpoint_dir(settings.data_dir)
        before = last_committed_batch(self.checkpoint)
        self.started_ms = time.time() * 1000
        started = time.perf_counter()
        self.job = start_job(settings, log_path)
        cleanup.callback(self.job.stop)
        self._alive = alive(self.job, log_path)
        self.sampler = MemorySampler(self.job.proc.pid)
        cleanup.callback(self.sampler.close)
        wait_until(lambda: last_committed_batch(self.checkpoint) > before, timeout=600,
                   what="the job's first batch", interval=0.1, check=self.check)
        self.to_first_batch_s = round(time.perf_counter() - started, 1)

    def check(self) -> None:
        self._alive()
        if self.sampler.low_memory.is_set():
            rss = job_memory(self.job.proc.pid)["total_mb"]
            self.job.kill9()
            raise MemoryExhausted(f"less than {MEMORY_FLOOR_MB:,} MB of memory left on the machine "
                                  f"(job RSS {rss:,.0f} MB before the kill)")

    def memory(self) -> dict:
        return {**job_memory(self.job.proc.pid), "load_average": load_average()}

    def stop(self) -> dict:
        """Stop the job cleanly; its peak RSS while it ran."""
        peak = self.sampler.peak()
        self.sampler.close()
        code = self.job.stop()
        if code != 0:
            raise BenchError(f"the job stopped with exit code {code}")
        return peak


def measure_step(run: JobRun, settings, work: Path, cleanup: ExitStack, client, topics, users: Table, orders: Table,
                 start: int, stop: int) -> tuple[dict, JobRun]:
    """Users ``start:stop`` into state, then ``orders`` through the job; see the module docstring.
    Returns the step's figures and the job run left running (idle) for the next step."""
    data_dir = settings.data_dir
    run.sampler.reset()
    began_ms, began = time.time() * 1000, time.perf_counter()
    stats = publish_records(client, topics["users"], "users", iter_records(users, start, stop), checked=True)
    if stats.sent != stop - start:
        raise BenchError(f"published {stats.sent:,} of {stop - start:,} users ({stats.first_error})")
    step = {"users": stop, "publish_users_s": round(time.perf_counter() - began, 1),
            "publish_msgs_per_s": round(stats.msgs_per_s)}
    wait_until(lambda: messages_read(data_dir, began_ms) >= stop - start, timeout=max(600, (stop - start) / 2_000),
               what=f"the job to load {stop:,} users", interval=0.2, check=run.check)
    step["load"] = {**phase_rate(data_dir, "users", began_ms), "load_average": load_average()}
    step["memory_loaded"] = run.memory()
    step["rocksdb_loaded"] = state_rows(data_dir)
    step["memory_peak_loading"] = run.stop()
    step["state_bytes"] = directory_bytes(store.checkpoint_dir(data_dir) / "state")

    began = time.perf_counter()
    stats = publish_records(client, topics["orders"], "orders", iter_records(orders), checked=True)
    if stats.sent != orders.rows:
        raise BenchError(f"published {stats.sent:,} of {orders.rows:,} orders ({stats.first_error})")
    step["publish_orders_s"] = round(time.perf_counter() - began, 1)
    run = JobRun(settings, work / f"job-{stop}-enrich.log", cleanup)
    wait_until(lambda: messages_read(data_dir, run.started_ms) >= orders.rows, timeout=max(600, orders.rows / 1_000),
               what=f"the job to enrich {orders.rows:,} orders against {stop:,} users", interval=0.2, check=run.check)
    sinks = sink_rows_since(data_dir, run.started_ms)
    step["enrich"] = {**phase_rate(data_dir, "orders", run.started_ms, skip_first=True),
                      "rows_per_s_with_restore": phase_rate(data_dir, "orders", run.started_ms)["rows_per_s"],
                      "restart_to_first_batch_s": run.to_first_batch_s,
                      "enriched": sinks["enriched"], "missing_state": sinks["missing_state"],
                      "load_average": load_average()}
    step["memory_enriched"] = run.memory()
    step["rocksdb"] = state_rows(data_dir)
    step["memory_peak_enriching"] = run.sampler.peak()
    samples = [step[name] for name in ("memory_peak_loading", "memory_peak_enriching", "memory_loaded", "memory_enriched")]
    step["memory_peak_mb"] = max(sample.get("total_mb", 0) for sample in samples)
    step["pss_peak_mb"] = max(sample.get("pss_mb", 0) for sample in samples)
    return step, run


def spark_state_store_conf() -> dict:
    """The state store and memory settings the job ran with, so the figures say which
    configuration they were measured with."""
    from pipeline.runtime.spark import STATE_STORE_CONF

    # the job runs with the default (tests/jobproc.py passes no SS_ variable on)
    return {**STATE_STORE_CONF, "spark.driver.memory": load_settings(env={})["spark.driver_memory"]}


def _mb(value) -> str:
    return "-" if value is None else f"{value:,.0f}"


def print_table(result: dict) -> None:
    idle = result["idle_job"]["memory"]
    print(f"\n{'users in state':<16}{'RSS loaded':>11}{'RSS enriched':>13}{'peak MB':>9}{'PSS peak':>9}{'RocksDB MB':>11}"
          f"{'state MB':>9}{'users/s':>9}{'orders/s':>10}{'x 1st':>7}{'restart s':>10}{'load avg':>9}")
    print(f"{'0 (idle job)':<16}{_mb(idle['total_mb']):>11}")
    for step in result["steps"]:
        if "skipped" in step:
            print(f"{step['users']:>14,}  not measured: {step['skipped']}")
            continue
        rocksdb = sum(op["memory_bytes"] for op in step["rocksdb"].values()) / 1e6
        print(f"{step['users']:>14,}  {_mb(step['memory_loaded']['total_mb']):>11}"
              f"{_mb(step['memory_enriched']['total_mb']):>13}{_mb(step['memory_peak_mb']):>9}{_mb(step.get('pss_peak_mb')):>9}{rocksdb:>11,.0f}"
              f"{step['state_bytes'] / 1e6:>9,.0f}{_mb(step['load']['rows_per_s']):>9}{_mb(step['enrich']['rows_per_s']):>10}"
              f"{step.get('orders_per_s_vs_first') or 0:>7.2f}{step['enrich']['restart_to_first_batch_s']:>10.1f}"
              f"{step['enrich']['load_average'][0]:>9.1f}")
    targets = result["targets"]
    if not targets["largest_step_measured"]:
        print(f"targets (RSS <= {RSS_TARGET_MB:,} MB and orders/s >= {THROUGHPUT_TARGET} x the smallest step, "
              f"at {result['workload']['users'][-1]:,} users): not measured")
        return
    print(f"RSS at most {RSS_TARGET_MB:,} MB at the largest step: {'met' if targets['rss_met'] else 'NOT met'}; "
          f"orders/s at the largest step >= {THROUGHPUT_TARGET} x the smallest: "
          f"{'met' if targets['throughput_met'] else 'NOT met'}")


def project_step_s(results: list[dict], published: int, target: int) -> float | None:
    """Seconds the next step should take at the last measured step's rates (None before any)."""
    last = next((step for step in reversed(results) if "skipped" not in step), None)
    if last is None or not last["load"].get("rows_per_s"):
        return None
    return ((target - published) / last["load"]["rows_per_s"] + last["publish_orders_s"]
            + last["enrich"]["restart_to_first_batch_s"] + (last["enrich"].get("seconds") or 0) + 30)


def build_result(args, steps, tables, settings, idle, results, load_at_start, began, complete: bool) -> dict:
    most = steps[-1]
    measured = [s for s in results if "skipped" not in s]
    largest = measured[-1] if measured and measured[-1]["users"] == most else None
    return {
        "date": now_utc(), "machine": {**machine(), "load_average_at_start": load_at_start},
        "complete": complete, "spark_state_store": spark_state_store_conf(),
        "workload": {"users": steps, "items": tables["items"].rows, "orders_per_step": args.orders,
                     "spark_master": "local[2]", "max_rows_per_batch": settings["job.max_rows_per_batch"],
                     "trigger_interval_s": settings["job.trigger_interval"], "budget_min": args.budget_min},
        "baseline": "RSS of the same job idle with empty user state; orders/s at the smallest step; raw JSON of the users",
        "idle_job": idle, "steps": results,
        "targets": {"rss_mb": RSS_TARGET_MB, "throughput_ratio": THROUGHPUT_TARGET,
                    "largest_step_measured": largest is not None,
                    "rss_met": bool(largest and largest["memory_peak_mb"] <= RSS_TARGET_MB),
                    "throughput_met": bool(largest and (largest["orders_per_s_vs_first"] or 0) >= THROUGHPUT_TARGET)},
        "wall_s": round(time.perf_counter() - began, 1),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1000000,5000000,10000000", help="comma-separated user counts, ascending")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--orders", type=int, default=1_200_000,
                        help="orders enriched at each step (four batches of 480 entries: the first, which "
                             "restores the state, and three measured)")
    parser.add_argument("--max-rows", type=int, default=480,
                        help="job.max_rows_per_batch: broker entries a batch (about 650 messages an entry here, so "
                             "480 is about 300k rows, near the job's default of 500)")
    parser.add_argument("--budget-min", type=float, default=25.0,
                        help="wall-time budget: a step projected to end past it is not started")
    args = parser.parse_args(argv)
    steps = sorted(int(n) for n in args.users.split(","))
    most = steps[-1]

    work = Path(tempfile.mkdtemp(prefix="bench-state-"))
    began = time.perf_counter()
    load_at_start = load_average()
    # enough generated users that `most` of them are first versions (late users only come later)
    n_users = math.ceil(most / (1 - LATE_SHARE)) + 100
    tables = generate(n_users, args.items, args.orders * len(steps), seed=11)
    users = tables["users"]
    if first_versions(users) < most:
        raise BenchError(f"datagen gave {first_versions(users):,} first versions, fewer than {most:,}")
    print(f"generated {n_users:,} users and {tables['orders'].rows:,} orders in {time.perf_counter() - began:.0f}s",
          flush=True)
    topics = bench_topics("state")
    results: list[dict] = []
    with ExitStack() as cleanup:  # unwinds in reverse: jobs and client stop before the broker
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        broker = cleanup.enter_context(EmbeddedBroker(work / "broker"))
        settings = load_settings(env={}, cli={
            "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"),
            "spark.master": "local[2]", "job.max_rows_per_batch": args.max_rows,
            **{f"topics.{k}": v for k, v in topics.items()}})
        client = make_client(broker.service_url)
        cleanup.callback(client.close)
        publish_records(client, topics["items"], "items", table_records(tables["items"]), checked=True)
        run = JobRun(settings, work / "job-idle.log", cleanup)
        wait_until(lambda: messages_read(settings.data_dir) >= tables["items"].rows, timeout=300,
                   what="the job to load the items", interval=0.2, check=run.check)
        time.sleep(3)  # a few empty batches: the idle job's steady state
        idle = {"memory": run.memory(), "first_batch_s": run.to_first_batch_s, "rocksdb": state_rows(settings.data_dir),
                "state_bytes": directory_bytes(store.checkpoint_dir(settings.data_dir) / "state")}
        print(f"idle job: {idle['memory']['total_mb']:,.0f} MB RSS (load {idle['memory']['load_average'][0]})", flush=True)
        item_ids = tables["items"].columns["id"]
        published = 0
        for index, target in enumerate(steps):
            print(f"users {published + 1:,}..{target:,}: publishing while the job loads them; then {args.orders:,} orders…",
                  flush=True)
            if available_memory_mb() < MEMORY_FLOOR_MB * 2:
                results.append({"users": target, "skipped": f"{available_memory_mb():,.0f} MB available before the step"})
                break
            projected = project_step_s(results, published, target)
            elapsed = time.perf_counter() - began
            if projected is not None and elapsed + projected > args.budget_min * 60:
                results.append({"users": target, "skipped": f"projected {projected / 60:.0f} min at the last step's rates "
                                f"(load {load_average()[0]}), past the {args.budget_min:g}-minute budget "
                                f"after {elapsed / 60:.0f} min"})
                print(f"  {results[-1]['skipped']}", flush=True)
                break
            lines = slice(index * args.orders, (index + 1) * args.orders)
            orders = orders_against(Table("orders", {k: v[lines] for k, v in tables["orders"].columns.items()}),
                                    users.columns["id"][:target], item_ids, seed=100 + index)
            try:
                step, run = measure_step(run, settings, work, cleanup, client, topics, users, orders, published, target)
            except MemoryExhausted as exc:
                print(f"  {exc}", flush=True)
                results.append({"users": target, "skipped": str(exc)})
                break
            except KeyboardInterrupt:  # stopped by hand: the steps measured so far still count
                results.append({"users": target, "skipped": f"stopped by hand after {(time.perf_counter() - began) / 60:.0f} min"})
                print(f"  {results[-1]['skipped']}", flush=True)
                break
            step["raw_json_bytes"] = json_bytes_estimate(users, target)
            step["broker_bytes"] = directory_bytes(broker.broker_dir)
            step["rss_vs_idle"] = ratio(step["memory_enriched"]["total_mb"], idle["memory"]["total_mb"])
            step["state_vs_raw_json"] = ratio(step["state_bytes"], step["raw_json_bytes"])
            first = results[0] if results else step
            step["orders_per_s_vs_first"] = ratio(step["enrich"]["rows_per_s"], first["enrich"]["rows_per_s"])
            step["users_per_s_vs_first"] = ratio(step["load"]["rows_per_s"], first["load"]["rows_per_s"])
            results.append(step)
            published = target
            write_result(NAME, build_result(args, steps, tables, settings, idle, results, load_at_start, began,
                                            complete=False))
            print(f"  {target:,} users: RSS {step['memory_loaded']['total_mb']:,.0f} MB loaded, "
                  f"{step['memory_enriched']['total_mb']:,.0f} MB enriched (peak {step['memory_peak_mb']:,.0f}); "
                  f"{step['load']['rows_per_s'] or 0:,} users/s, {step['enrich']['rows_per_s'] or 0:,} orders/s; "
                  f"load {step['enrich']['load_average']}", flush=True)
    result = build_result(args, steps, tables, settings, idle, results, load_at_start, began, complete=True)
    write_result(NAME, result)
    print_table(result)
    return result


if __name__ == "__main__":
    main()
