"""State scale: the job's memory and state size on disk with 1M and then 5M users in state.

One embedded broker and the real job as a process (``python -m pipeline run``, local[2]). The
items are published first, so the job's first batch starts its Python workers; then users
from pipeline/datagen.py (one version each, ids 1..N) are published with
``pipeline.producers.publish_records`` while the job reads them, in steps: up to 1M users,
measure, up to 5M users, measure. Each step reports:

- **memory**: RSS of the job's process tree (the driver, its JVM and the Python workers, from
  /proc), once the step's last user is in a committed batch, and the peak while loading;
- **state on disk**: bytes under ``<data_dir>/checkpoint/state`` (RocksDB with changelog
  checkpointing, every retained version);
- the publish and load times (the load runs while publishing; it ends at the batch that
  holds the last user).

A step that leaves less than MEMORY_FLOOR_MB available is stopped with kill -9 and reported:
a benchmark on a shared machine must not wake the OOM killer. Memory is not projected from
the step before: the Python workers' state cache is bounded (pipeline/enrich/bucket_state.py),
so it grows far less than linearly with users.

Baselines measured in the same run: the RSS of the same job idle with empty user state (after
its first batch, items only), and the raw size of the users' JSON payloads (estimated from a
sample of 20,000 encoded records) and of the broker's data. Prints a table and writes
``bench/results/state.json``.

    python -m bench.bench_state                          # 1M and 5M users
    python -m bench.bench_state --users 50000,200000     # a quick look
"""

from __future__ import annotations

import argparse
import math
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
from pipeline.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.datagen import LATE_SHARE, generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.producers import publish_records  # noqa: E402
from pipeline.sinks import last_committed_batch  # noqa: E402
from pipeline.topics import make_client  # noqa: E402

NAME = "state"
SAMPLE_EVERY_S = 0.5
# The job's memory grows with the users in state; on a shared machine a step that would leave
# less than this is not run, and one that gets there is stopped, rather than wake the OOM killer.
MEMORY_FLOOR_MB = 2_000


class MemoryExhausted(BenchError):
    """The machine ran low on memory while the job loaded users; the job was killed."""


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


def users_read(data_dir: Path) -> int:
    """Users messages the job has read into committed batches (from its progress rows)."""
    rows = read_rows(data_dir, "progress")
    return max((t["end_position"] for row in rows for t in row["topics"] if t["topic"] == "users"), default=0)


def state_rows(data_dir: Path) -> dict:
    rows = read_rows(data_dir, "progress")
    if not rows:
        return {}
    return {op["operator"]: {"rows_total": op["rows_total"], "memory_bytes": op["memory_bytes"]}
            for op in rows[-1]["state"]}


def measure_step(job, settings, sampler: MemorySampler, users_table, client, topics, start: int, stop: int,
                 check) -> dict:
    """Publish users ``start:stop`` while the job reads them; measure once they are all in state."""
    def check_all() -> None:
        check()
        if sampler.low_memory.is_set():
            job.kill9()
            raise MemoryExhausted(f"stopped loading {stop:,} users: less than {MEMORY_FLOOR_MB:,} MB of memory left "
                             f"(job RSS {job_memory(job.proc.pid)['total_mb']:,.0f} MB before the kill)")

    sampler.reset()
    began = time.perf_counter()
    stats = publish_records(client, topics["users"], "users", iter_records(users_table, start, stop), checked=True)
    published_s = time.perf_counter() - began
    if stats.sent != stop - start:
        raise BenchError(f"published {stats.sent:,} of {stop - start:,} users ({stats.first_error})")
    wait_until(lambda: users_read(settings.data_dir) >= stop, timeout=max(300, (stop - start) / 2_000),
               what=f"the job to load {stop:,} users", interval=0.2, check=check_all)
    loaded_s = time.perf_counter() - began
    settled = job_memory(job.proc.pid)
    return {
        "users": stop, "publish_s": round(published_s, 1), "publish_msgs_per_s": round(stats.msgs_per_s),
        "load_s": round(loaded_s, 1), "load_users_per_s": round((stop - start) / loaded_s),
        "memory": settled,
        "memory_peak_while_loading": max(sampler.peak() or settled, settled, key=lambda m: m["total_mb"]),
        "state_bytes": directory_bytes(store.checkpoint_dir(settings.data_dir) / "state"),
        "state_rows": state_rows(settings.data_dir),
        "batches": last_committed_batch(store.checkpoint_dir(settings.data_dir)) + 1,
    }


def print_table(result: dict) -> None:
    idle = result["idle_job"]
    print(f"\n{'state':<18}{'RSS MB':>9}{'driver':>9}{'JVM':>9}{'workers':>9}{'peak MB':>9}"
          f"{'x idle':>8}{'state MB':>10}{'raw JSON MB':>13}{'load s':>8}")
    m = idle["memory"]
    print(f"{'empty (baseline)':<18}{m['total_mb']:>9,.0f}{m['driver_python_mb']:>9,.0f}{m['jvm_mb']:>9,.0f}"
          f"{m['python_workers_mb']:>9,.0f}{'':>9}{1:>8.2f}{idle['state_bytes'] / 1e6:>10,.1f}{'':>13}{'':>8}")
    for step in result["steps"]:
        if "skipped" in step:
            print(f"{step['users']:>10,} users  not measured: {step['skipped']}")
            continue
        m, peak = step["memory"], step["memory_peak_while_loading"]
        print(f"{step['users']:>10,} users{m['total_mb']:>11,.0f}{m['driver_python_mb']:>9,.0f}{m['jvm_mb']:>9,.0f}"
              f"{m['python_workers_mb']:>9,.0f}{peak['total_mb']:>9,.0f}{step['rss_vs_idle']:>8.2f}"
              f"{step['state_bytes'] / 1e6:>10,.1f}{step['raw_json_bytes'] / 1e6:>13,.1f}{step['load_s']:>8.1f}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", default="1000000,5000000", help="comma-separated user counts, ascending")
    parser.add_argument("--items", type=int, default=1_000)
    args = parser.parse_args(argv)
    steps = sorted(int(n) for n in args.users.split(","))
    most = steps[-1]

    work = Path(tempfile.mkdtemp(prefix="bench-state-"))
    began = time.perf_counter()
    # enough generated users that `most` of them are first versions (late users only come later)
    n_users = math.ceil(most / (1 - LATE_SHARE)) + 100
    tables = generate(n_users, args.items, max(100, n_users // 30), seed=11)
    users = tables["users"]
    if first_versions(users) < most:
        raise BenchError(f"datagen gave {first_versions(users):,} first versions, fewer than {most:,}")
    print(f"generated {n_users:,} users in {time.perf_counter() - began:.0f}s", flush=True)
    topics = bench_topics("state")
    with ExitStack() as cleanup:  # unwinds in reverse: job and client stop before the broker
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        broker = cleanup.enter_context(EmbeddedBroker(work / "broker"))
        settings = load_settings(env={}, cli={
            "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"),
            "spark.master": "local[2]", **{f"topics.{k}": v for k, v in topics.items()}})
        client = make_client(broker.service_url)
        cleanup.callback(client.close)
        publish_records(client, topics["items"], "items", table_records(tables["items"]), checked=True)
        log_path = work / "job.log"
        started = time.perf_counter()
        job = start_job(settings, log_path)
        cleanup.callback(job.stop)
        check = alive(job, log_path)
        checkpoint = store.checkpoint_dir(settings.data_dir)
        wait_until(lambda: last_committed_batch(checkpoint) >= 0, timeout=300, what="the job's first batch",
                   check=check)
        idle = {"memory": job_memory(job.proc.pid), "state_bytes": directory_bytes(checkpoint / "state"),
                "first_batch_s": round(time.perf_counter() - started, 1)}
        print(f"idle job: {idle['memory']['total_mb']:,.0f} MB RSS", flush=True)
        sampler = MemorySampler(job.proc.pid)
        cleanup.callback(sampler.close)
        results, published = [], 0
        for target in steps:
            print(f"publishing users {published + 1:,}..{target:,} while the job loads them…", flush=True)
            try:
                step = measure_step(job, settings, sampler, users, client, topics, published, target, check)
            except MemoryExhausted as exc:
                print(f"  {exc}", flush=True)
                results.append({"users": target, "skipped": str(exc)})
                break
            step["raw_json_bytes"] = json_bytes_estimate(users, target)
            step["broker_bytes"] = directory_bytes(broker.broker_dir)
            step["rss_vs_idle"] = ratio(step["memory"]["total_mb"], idle["memory"]["total_mb"])
            step["state_vs_raw_json"] = ratio(step["state_bytes"], step["raw_json_bytes"])
            step["rss_bytes_per_user"] = round((step["memory"]["total_mb"] - idle["memory"]["total_mb"]) * 1e6 / target)
            results.append(step)
            published = target
            print(f"  {target:,} users in state: {step['memory']['total_mb']:,.0f} MB RSS, "
                  f"{step['state_bytes'] / 1e6:,.0f} MB state, loaded in {step['load_s']:.0f}s", flush=True)
    result = {
        "date": now_utc(), "machine": machine(),
        "workload": {"users": steps, "items": tables["items"].rows, "spark_master": "local[2]",
                     "buckets": settings["job.buckets"], "max_rows_per_batch": settings["job.max_rows_per_batch"]},
        "baseline": "RSS of the same job idle with empty user state; raw JSON size of the users",
        "idle_job": idle, "steps": results, "wall_s": round(time.perf_counter() - began, 1),
    }
    write_result(NAME, result)
    print_table(result)
    return result


if __name__ == "__main__":
    main()
