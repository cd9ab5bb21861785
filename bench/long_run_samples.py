"""The long run's samples (bench/bench_long_run.py): each process's memory, the disk file by file
where it matters, the newest batch, and the job's JVM: its native memory by category, its heap
committed and used, and its heap after a full collection.

Called on the benchmark's own process, every ``--sample-seconds`` (the JVM every
``--live-heap-minutes``: a full collection is not free, so not every sample forces one).
:func:`judge_jvm` holds the JVM's bound, derived from its configuration (issue 28).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from bench.common import _is_jvm, _processes, job_memory, load_average, process_tree, pss_bytes, rss_bytes
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
    # With boundedMemoryUsage Spark reports for each RocksDB instance the shared budget's usage divided
    # by the instances in the JVM (RocksDBMemoryManager.getInstanceMemoryUsage), and an operator's
    # memory_bytes sums its partitions' instances: the operators' sum is the whole budget's usage
    # (the maximum, taken before, was half of it with two operators of two partitions each; issue 28).
    states = row.get("state") or []
    rocksdb = sum(op.get("memory_bytes") or 0 for op in states) if states else None
    return {"batch_id": row.get("batch_id"), "batch_duration_ms": row.get("batch_duration_ms"),
            "num_input_rows": row.get("num_input_rows"), "backlog": backlog,
            "rocksdb_memory_mb": None if rocksdb is None else round(rocksdb / 1e6, 1)}


def sample(began: float, procs: dict[str, int], job_pid: int, data_dir: Path, broker_dir: Path,
           heap: bool = False) -> dict:
    """One sample; ``heap``: with the JVM heap's live set too (:func:`live_heap`)."""
    found = {"minute": round((time.monotonic() - began) / 60, 2), "load_average": load_average(),
             "memory": memory(procs, job_pid), "disk": disk(data_dir, broker_dir), "batch": newest_batch(data_dir)}
    if heap:  # native memory and the heap's committed size first: the full collection may shrink the heap
        found["jvm_native"] = native_memory(job_pid)
        found["jvm_heap"] = live_heap(job_pid)
    return found


def _job_jvm(job_pid: int) -> int | None:
    """The driver JVM under the job: not a fork of it still running its command line (Hadoop forks
    ``chmod``; the lowest pid was one once the pids wrapped, and jcmd failed on it)."""
    table = _processes()
    jvms = [pid for pid, cmdline in process_tree(job_pid, table).items()
            if pid != job_pid and _is_jvm(cmdline) and not _is_jvm(table.get(table[pid][0], (0, ""))[1])]
    return min(jvms) if jvms else None


def _jcmd(jvm: int, *command: str) -> str:
    return subprocess.run(["jcmd", str(jvm), *command], capture_output=True, text=True, timeout=120, check=True).stdout


NMT_TOTAL = re.compile(r"Total: reserved=(\d+)KB, committed=(\d+)KB")
NMT_MALLOC = re.compile(r"^\s+malloc: (\d+)KB", re.M)
NMT_CATEGORY = re.compile(r"^-\s+(.+?) \(reserved=(\d+)KB, committed=(\d+)KB\)", re.M)
HEAP_SPACE = re.compile(r"^ (?!Metaspace|class space)\S.*? total (\d+)K, used (\d+)K", re.M)  # a generation, or G1's heap


def _kb_mb(kb: str | int) -> float:
    return round(int(kb) * 1024 / 1e6, 1)  # jcmd's KB are KiB; the benchmark's MB are 10^6 bytes


def parse_native_memory(text: str) -> dict:
    """``jcmd VM.native_memory summary`` in MB: the total committed, its malloc part, the heap's
    maximum (its reserved size: -Xmx) and each category's committed size."""
    total, categories = NMT_TOTAL.search(text), NMT_CATEGORY.findall(text)
    if not total:
        return {"error": text.strip().splitlines()[-1][:200] if text.strip() else "no output"}
    malloc = NMT_MALLOC.search(text)
    reserved = {name: int(kb) for name, kb, _ in categories}
    return {"committed_mb": _kb_mb(total.group(2)),
            "malloc_mb": _kb_mb(malloc.group(1)) if malloc else None,
            "heap_max_mb": _kb_mb(reserved.get("Java Heap", 0)),
            "categories_mb": {name: _kb_mb(kb) for name, _, kb in categories}}


def parse_heap_info(text: str) -> dict:
    """``jcmd GC.heap_info`` in MB: the heap's committed size and what it uses (its generations summed)."""
    spaces = HEAP_SPACE.findall(text)
    return {"committed_mb": _kb_mb(sum(int(total) for total, _ in spaces)),
            "used_mb": _kb_mb(sum(int(used) for _, used in spaces))} if spaces else {}


def native_memory(job_pid: int) -> dict:
    """The job's driver JVM as it is (no collection): its RSS, its native memory by category (when
    it runs with ``-XX:NativeMemoryTracking=summary``), its heap committed and used, and the RSS
    outside what the JVM tracks (``outside_nmt_mb``: RSS minus NMT's committed total; RocksDB's
    block cache and memtables, and what glibc's malloc keeps of freed memory, are there)."""
    jvm = _job_jvm(job_pid)
    if jvm is None:
        return {"error": "no JVM under the job"}
    found: dict = {"rss_mb": round(rss_bytes(jvm) / 1e6, 1)}
    try:
        found["heap"] = parse_heap_info(_jcmd(jvm, "GC.heap_info"))
        found["nmt"] = parse_native_memory(_jcmd(jvm, "VM.native_memory", "summary"))
    except (OSError, subprocess.SubprocessError) as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"[:200]
    if found.get("nmt", {}).get("committed_mb"):
        found["outside_nmt_mb"] = round(found["rss_mb"] - found["nmt"]["committed_mb"], 1)
    return found


def live_heap(job_pid: int) -> dict:
    """The job's driver JVM after a full collection (``jcmd GC.run``, then ``GC.heap_info``): the
    heap's live set in MB, which the RSS hides (the JVM keeps what it grew to up to -Xmx)."""
    jvm, started = _job_jvm(job_pid), time.monotonic()
    if jvm is None:
        return {"error": "no JVM under the job"}
    try:
        _jcmd(jvm, "GC.run")
        info = _jcmd(jvm, "GC.heap_info")
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    used = re.search(r"used (\d+)K", info)  # the first line: the whole heap's total and used
    return {"live_mb": round(int(used.group(1)) / 1024, 1) if used else None,
            "gc_s": round(time.monotonic() - started, 2), "load_average": load_average()}


def job_parts(memories: tuple[dict, ...], jvm_bounded: bool) -> list[tuple]:
    """``(name, MB at each of memories)`` for the job's parts that must stay flat against the start.
    With its bound (:func:`judge_jvm`) the JVM is judged by that, and the job's PSS without it:
    the JVM's RSS swings with its heap's committed size."""
    parts = [("job " + part, *(memory["job"][part] for memory in memories))
             for part in ("driver_python_mb", "jvm_mb", "python_workers_mb", "pss_mb") if not (jvm_bounded and part == "jvm_mb")]
    if jvm_bounded:
        parts[-1] = ("job pss_mb but the JVM", *(round(m["job"]["pss_mb"] - m["job"]["jvm_mb"], 1) for m in memories))
    return parts


def judge_jvm(samples: list[dict], growth: float, slack_mb: float) -> dict:
    """The job's driver JVM against the bound its configuration sets (issue 28), from the samples
    with native memory: the heap's maximum (-Xmx: spark.driver.memory, NMT's reserved heap), plus
    RocksDB's cap for every state store (maxMemoryUsageMB, outside NMT), plus the rest as measured
    a quarter into the run (NMT's non-heap, and what glibc's arenas hold beyond RocksDB's reported
    usage), with ``growth`` of that rest or ``slack_mb`` of room.

    The RSS alone swings by hundreds of MB as the heap commits and gives back (G1, up to its
    maximum) and rises while RocksDB's cache fills with the blocks of files compaction replaced,
    until its cap evicts them (by design); this says whether it stays under what the settings
    allow. Each measured part must also stay flat: the non-heap (threads, code, metaspace, GC,
    direct buffers) and the arenas' own (RSS outside NMT minus the state operators'
    ``memory_bytes``). Empty without NMT samples (a JVM run without ``-XX:NativeMemoryTracking``)."""
    from pipeline.runtime.spark import STATE_STORE_CONF

    natives = [s for s in samples if s.get("jvm_native", {}).get("nmt", {}).get("committed_mb")]
    if len(natives) < 2:
        return {}
    quarter = samples[len(samples) // 4]["minute"]
    first, reference, last = natives[0], next((s for s in natives if s["minute"] >= quarter), natives[-1]), natives[-1]

    def non_heap(found: dict) -> float:
        nmt = found["jvm_native"]["nmt"]
        return round(nmt["committed_mb"] - nmt["categories_mb"].get("Java Heap", 0), 1)

    def untold(found: dict) -> float | None:  # malloc's own: outside NMT and beyond what RocksDB reports it holds
        rocksdb = found.get("batch", {}).get("rocksdb_memory_mb")
        return None if rocksdb is None else round(found["jvm_native"]["outside_nmt_mb"] - rocksdb, 1)

    def flat(at: tuple, before: float) -> dict:
        bound = before + max(growth * max(before, 0), slack_mb)
        return {"start": at[0], "from": before, "end": at[2], "bound": round(bound, 1), "ok": at[2] <= bound}

    rocksdb_mb = float(STATE_STORE_CONF["spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB"]) * 1.048576
    heap_max, nmt_rest, arenas = last["jvm_native"]["nmt"]["heap_max_mb"], non_heap(reference), untold(reference)
    rest = nmt_rest + max(arenas or 0, 0)
    room = max(growth * rest, slack_mb)
    bound, rss = heap_max + rocksdb_mb + rest + room, last["jvm_native"]["rss_mb"]
    found = {
        "job JVM RSS within heap max + RocksDB cap + measured rest (MB)": {
            "start": first["jvm_native"]["rss_mb"], "from": reference["jvm_native"]["rss_mb"], "end": rss,
            "bound": round(bound, 1), "ok": rss <= bound,
            "bound_parts": {"heap_max": heap_max, "rocksdb_cap": round(rocksdb_mb, 1), "non_heap_nmt": nmt_rest,
                            "malloc_beyond_rocksdb": arenas, "room": round(room, 1)},
            "columns": ["minute", "rss_mb", "heap_committed_mb", "non_heap_nmt_mb", "outside_nmt_mb", "rocksdb_mb"],
            "samples": [(s["minute"], s["jvm_native"]["rss_mb"], s["jvm_native"].get("heap", {}).get("committed_mb"),
                         non_heap(s), s["jvm_native"].get("outside_nmt_mb"), s.get("batch", {}).get("rocksdb_memory_mb"))
                        for s in natives]},
        "job JVM non-heap, NMT committed (MB)": flat(tuple(non_heap(s) for s in (first, reference, last)), nmt_rest),
    }
    if arenas is not None and untold(last) is not None:
        found["job JVM malloc outside NMT beyond RocksDB's usage (MB)"] = flat(
            tuple(untold(s) for s in (first, reference, last)), arenas)
    return found
