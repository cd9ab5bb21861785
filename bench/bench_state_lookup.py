"""State look-up: a Spark process per look-up, against one long-lived worker, against no JVM at all.

Issue 27 (item 3): the console's state look-up started ``python -m pipeline state … --json`` per
click (a JVM and a Spark session each time, for up to 300 s). Before choosing what replaces it,
this measures, on one embedded broker with the real job running (local[2], ``max_wait`` 1 h so
orders wait in state):

- **per click**: ``python -m pipeline state users K items K --json`` as a process, wall time,
  ``--runs`` times (what the console did);
- **one worker**: pipeline/control/state_service.py's ``StateLookupService`` (``python -m pipeline state
  --serve``): the first look-up (it starts the worker) and ``--lookups`` more on the same worker,
  with the worker's process-tree RSS (what keeping it costs);
- **no JVM**: what a reader of the state store's own files would have to decode: the files of each
  lookup's state (RocksDB SST files inside the snapshot zips, Spark's LZ4-block changelog files)
  and whether this Python has a RocksDB and an LZ4 reader to decode them.

Prints a table and writes ``bench/results/state_lookup.json``, with the load average.

    python -m bench.bench_state_lookup
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (alive, bench_topics, job_memory, machine, now_utc, start_job, wait_until,  # noqa: E402
                          write_result)
from pipeline import store  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.console import PROJECT_ROOT, settings_environment  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.sinks import last_committed_batch  # noqa: E402
from pipeline.control.state_service import StateLookupService  # noqa: E402
from factories import item, keyed, order, publish, user  # noqa: E402

import os  # noqa: E402


def per_click_s(settings, user_id: int, item_id: int) -> float:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
    env.update(settings_environment(settings))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipeline", "state", "users", str(user_id), "items", str(item_id), "--json"],
                          env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"state look-up failed: {done.stderr[-500:]}")
    return elapsed


def state_files(checkpoint: Path) -> dict:
    """The lookups' state files by kind, with their bytes."""
    kinds, sizes = Counter(), Counter()
    for path in (checkpoint / "state").rglob("*"):
        if path.is_file():
            kind = path.suffix or path.name
            kinds[kind] += 1
            sizes[kind] += path.stat().st_size
    return {kind: {"files": kinds[kind], "bytes": sizes[kind]} for kind in sorted(kinds)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="per-click processes to time (default 3)")
    parser.add_argument("--lookups", type=int, default=10, help="look-ups on the warm worker (default 10)")
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-state-lookup-") as tmp:
        workdir = Path(args.keep or tmp)
        broker = EmbeddedBroker(workdir / "broker").start()
        try:
            topics = bench_topics("state-lookup")
            settings = load_settings(env={}, cli={
                "pulsar.service_url": broker.service_url, "paths.data_dir": str(workdir / "data"),
                "spark.master": "local[2]", "job.trigger_interval": "500ms", "enrichment.max_wait": "1h",
                **{f"topics.{kind}": topic for kind, topic in topics.items()}})
            publish(broker.service_url, topics["users"], keyed("users", [user(u) for u in range(1, args.users + 1)]))
            publish(broker.service_url, topics["items"], keyed("items", [item(i) for i in range(1, 51)]))
            # orders for users the job has not seen wait in state
            publish(broker.service_url, topics["orders"], keyed("orders", [order(n, args.users + 1 + n % 7, n % 50 + 1)
                                                                           for n in range(200)]))
            log_path = workdir / "job.log"
            job = start_job(settings, log_path)
            try:
                checkpoint = store.checkpoint_dir(settings.data_dir)
                wait_until(lambda: sum(t["rows"] for row in read_rows(settings.data_dir, "progress")
                                       for t in row.get("topics", []) if t["topic"] == "users") >= args.users
                           and last_committed_batch(checkpoint) >= 1, timeout=600, what="the users in state",
                           interval=0.5, check=alive(job, log_path))
                clicks = [per_click_s(settings, 1 + run, 1 + run) for run in range(args.runs)]
                env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
                env.update(settings_environment(settings))
                service = StateLookupService([sys.executable, "-m", "pipeline", "state", "--serve"], env=env,
                                             cwd=str(PROJECT_ROOT), per_minute=10_000)
                try:
                    started = time.perf_counter()
                    first = service.lookup([("users", 1), ("items", 1)], "bench")
                    first_s = time.perf_counter() - started
                    warm = []
                    for n in range(args.lookups):
                        started = time.perf_counter()
                        found = service.lookup([("users", 2 + n), ("items", 2 + n % 49)], "bench")
                        warm.append(time.perf_counter() - started)
                    waiting = service.lookup([("users", args.users + 1)], "bench")[0]["waiting"]
                    worker_memory = job_memory(service.pid)
                finally:
                    service.close()
                files = state_files(checkpoint)
            finally:
                job.stop()
        finally:
            broker.stop()
    result = {
        "measured_at": now_utc(), "machine": machine(), "users_in_state": args.users,
        "per_click_process_s": [round(x, 2) for x in clicks],
        "per_click_median_s": round(statistics.median(clicks), 2),
        "worker_first_lookup_s": round(first_s, 2),
        "worker_lookup_s": [round(x, 2) for x in warm],
        "worker_lookup_median_s": round(statistics.median(warm), 2),
        "worker_memory": worker_memory,
        "answers_checked": {"user_1_found": first[0]["latest"] is not None, "orders_waiting_for_a_new_user": len(waiting),
                            "last_answer_keys": [f["key"] for f in found]},
        "state_files": files,
        "no_jvm_readers": {"rocksdb (python-rocksdb)": importlib.util.find_spec("rocksdb") is not None,
                           "rocksdict": importlib.util.find_spec("rocksdict") is not None,
                           "lz4": importlib.util.find_spec("lz4") is not None},
    }
    print(f"per click (a process each): {', '.join(f'{x:.1f}s' for x in clicks)}  median {result['per_click_median_s']:.1f}s")
    print(f"one worker: first look-up (starts it) {first_s:.1f}s, then median {result['worker_lookup_median_s']:.2f}s "
          f"over {len(warm)} look-ups; worker RSS {worker_memory}")
    print(f"state files: {json.dumps(files)}")
    print(f"no-JVM readers installed: {result['no_jvm_readers']}")
    write_result("state_lookup", result)
    return result


if __name__ == "__main__":
    main()
