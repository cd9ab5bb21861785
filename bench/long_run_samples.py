"""The long run's samples (bench/bench_long_run.py): each process's memory, the disk file by file
where it matters, the newest batch, and the job's JVM heap after a full collection.

Called on the benchmark's own process, every ``--sample-seconds`` (the heap every
``--live-heap-minutes``: a full collection is not free, so not every sample forces one).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from bench.common import _is_jvm, job_memory, load_average, process_tree, pss_bytes, rss_bytes
from pipeline import store
from pipeline.metrics_tail import parse_lines, tail_lines


def memory(procs: dict[str, int], job_pid: int) -> dict:
    """MB per process: the job's tree by part (bench/common.py job_memory), the others' RSS and PSS."""
    found = {"job": job_memory(job_pid)}
    for name, pid in procs.items():
        found[name] = {"rss_mb": round(rss_bytes(pid) / 1e6, 1), "pss_mb": round(pss_bytes(pid) / 1e6, 1)}
    return found


def disk(data_dir: Path, broker_dir: Path) -> dict:
    """bench_month's disk figures (sinks, metrics streams, checkpoint, total), each sink's current
    table files, and the broker's data."""
    from bench.bench_month import _tree, disk as month_disk
    from pipeline.sinks import sink_files

    found = month_disk(data_dir)
    for sink in store.SINKS:
        found[sink]["table_files"] = len(sink_files(data_dir, sink))
    files, size = _tree(broker_dir)
    # each file's bytes too: pulsar-lite's "data" grew faster than the messages in the hour, and
    # this found the file: broker.log, a warning per entry per closed reader (pipeline/feed/broker.py)
    by_file = {}
    for path in broker_dir.rglob("*") if broker_dir.is_dir() else ():
        try:  # RocksDB removes files while it compacts
            if path.is_file():
                by_file[str(path.relative_to(broker_dir))] = path.stat().st_size
        except OSError:
            pass
    found["broker"] = {"files": files, "bytes": size, "by_file": by_file}
    return found


def newest_batch(data_dir: Path) -> dict:
    lines, _ = tail_lines(data_dir, "progress", 1)
    rows = parse_lines(lines)
    if not rows:
        return {}
    row = rows[-1]
    backlog = {topic["topic"].rsplit("-", 1)[-1]: topic.get("backlog") for topic in row.get("topics") or []}
    return {"batch_id": row.get("batch_id"), "batch_duration_ms": row.get("batch_duration_ms"),
            "num_input_rows": row.get("num_input_rows"), "backlog": backlog}


def sample(began: float, procs: dict[str, int], job_pid: int, data_dir: Path, broker_dir: Path,
           heap: bool = False) -> dict:
    """One sample; ``heap``: with the JVM heap's live set too (:func:`live_heap`)."""
    found = {"minute": round((time.monotonic() - began) / 60, 2), "load_average": load_average(),
             "memory": memory(procs, job_pid), "disk": disk(data_dir, broker_dir), "batch": newest_batch(data_dir)}
    if heap:
        found["jvm_heap"] = live_heap(job_pid)
    return found


def live_heap(job_pid: int) -> dict:
    """The job's driver JVM after a full collection (``jcmd GC.run``, then ``GC.heap_info``): the
    heap's live set in MB, which the RSS hides (the JVM keeps what it grew to up to -Xmx)."""
    jvms = [pid for pid, cmdline in process_tree(job_pid).items() if pid != job_pid and _is_jvm(cmdline)]
    if not jvms:
        return {"error": "no JVM under the job"}
    jvm, started = min(jvms), time.monotonic()
    try:
        subprocess.run(["jcmd", str(jvm), "GC.run"], capture_output=True, timeout=120, check=True)
        info = subprocess.run(["jcmd", str(jvm), "GC.heap_info"], capture_output=True, text=True, timeout=60,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    used = re.search(r"used (\d+)K", info)  # the first line: the whole heap's total and used
    return {"live_mb": round(int(used.group(1)) / 1024, 1) if used else None,
            "gc_s": round(time.monotonic() - started, 2), "load_average": load_average()}
