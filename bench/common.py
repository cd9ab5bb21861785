"""Helpers every benchmark shares: the machine, records from generated tables, the job as a
process, its memory, sizes on disk, percentiles and deadline-bounded waits.

The job runs as a real ``python -m pipeline run`` process (``tests/jobproc.py``) wherever a
figure depends on its processes: its memory is then the sum over its own process tree (the
driver, its JVM and the JVM's Python workers), and the benchmark's publisher threads never
share a GIL with the job's listener.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
for _path in (str(ROOT), str(ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

TOPIC_KINDS = ("users", "items", "orders")


class BenchError(RuntimeError):
    """A benchmark could not measure what it promised (a timeout, lost or duplicated rows)."""


# ---------------------------------------------------------------------------- the run
def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def machine() -> dict:
    """What the figures were measured on: CPU model and count, memory, OS, Python, load."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gb": memory_gb,
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages now, to record beside a figure."""
    return [round(x, 2) for x in os.getloadavg()]


def bench_topics(tag: str) -> dict[str, str]:
    return {kind: f"persistent://public/default/bench-{tag}-{kind}" for kind in TOPIC_KINDS}


@contextmanager
def work_dir(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A temporary folder for a benchmark's broker and data dirs (gigabytes at full scale), removed
    when the benchmark ends, or kept with ``keep`` (``--keep``: its path is printed)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if keep:
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)


def write_result(name: str, result: dict) -> Path:
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


# ---------------------------------------------------------------------------- records
def table_records(table) -> list[dict]:
    """Every row of a datagen table as a wire record (plain Python values)."""
    names = list(table.columns)
    columns = [table.columns[name].tolist() for name in names]
    return [dict(zip(names, values)) for values in zip(*columns)]


def iter_records(table, start: int = 0, stop: int | None = None, chunk: int = 50_000) -> Iterator[dict]:
    """Rows ``start:stop`` of a datagen table as wire records, built a chunk at a time (so five
    million users never sit in memory as dicts)."""
    names = list(table.columns)
    stop = table.rows if stop is None else min(stop, table.rows)
    for begin in range(start, stop, chunk):
        end = min(stop, begin + chunk)
        columns = [table.columns[name][begin:end].tolist() for name in names]
        for values in zip(*columns):
            yield dict(zip(names, values))


def guard(func, errors: list, *args, **kwargs):
    """Run ``func`` and keep what it raised in ``errors`` (for threads whose caller reports it)."""
    try:
        return func(*args, **kwargs)
    except BaseException as exc:  # reported by the caller
        errors.append(exc)


# ---------------------------------------------------------------------------- waiting
def wait_until(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.05,
               check: Callable[[], None] | None = None):
    """Poll ``condition`` until it is truthy (returned), or raise BenchError after ``timeout`` s.
    ``check`` runs on every poll, to fail early (say, when the job process died)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------------------- the job process
def start_job(settings, log_path: Path):
    """The job as ``python -m pipeline run`` in its own process group (see tests/jobproc.py)."""
    from jobproc import JobProcess

    return JobProcess(settings, log_path)


def alive(job, log_path: Path) -> Callable[[], None]:
    """A ``check`` for :func:`wait_until` that fails loudly when the job process has exited."""
    def check() -> None:
        if job.proc.poll() is not None:
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-15:]
            raise BenchError(f"the job exited with code {job.proc.returncode}; end of {log_path}:\n" + "\n".join(tail))
    return check


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process we can see."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry)] = (ppid, cmdline)
    return found


def process_tree(pid: int, table: dict[int, tuple[int, str]] | None = None) -> dict[int, str]:
    """``pid`` and all its descendants, pid -> command line (from ``table``, or read now)."""
    table = _processes() if table is None else table
    tree, frontier = {}, [pid]
    while frontier:
        current = frontier.pop()
        if current in table and current not in tree:
            tree[current] = table[current][1]
            frontier += [child for child, (parent, _) in table.items() if parent == current]
    return tree


def _proc_kb(path: str, field: str) -> int:
    """A ``Field:  N kB`` line of a /proc file, in bytes (0 if the process is gone)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes(pid: int) -> int:
    """VmRSS of one process (0 if it is gone)."""
    return _proc_kb(f"/proc/{pid}/status", "VmRSS")


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (0 if it is gone): its resident pages, each shared
    page divided among the processes that map it, so a tree's PSS adds up to what it holds."""
    return _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss")


def job_memory(pid: int) -> dict:
    """Memory of the job's process tree in MB: RSS of the Python driver, the JVM and the Python
    workers, their sum, and the tree's PSS (``pss_mb``; the pyspark daemons' forked workers share
    pages with them, which the RSS sum counts once per process).

    A child of the JVM still running the JVM's command line is a fork not yet turned into the
    program it runs (Hadoop starts ``chmod`` for each checkpoint file it creates): it shares the
    JVM's memory, and counting its RSS again doubled the JVM in a sample now and then (the peaks
    of bench/README.md's stop 22 and 23 state runs)."""
    table = _processes()
    parts = {"driver_python_mb": 0, "jvm_mb": 0, "python_workers_mb": 0}
    workers, pss = 0, 0
    for child, cmdline in process_tree(pid, table).items():
        parent = table[child][0]
        if child != pid and parent in table and table[parent][1] == cmdline and _is_jvm(cmdline):
            continue
        mb = rss_bytes(child) / 1e6
        pss += pss_bytes(child)
        if child == pid:
            parts["driver_python_mb"] += mb
        elif _is_jvm(cmdline):
            parts["jvm_mb"] += mb
        else:
            parts["python_workers_mb"] += mb
            workers += 1
    parts = {name: round(mb, 1) for name, mb in parts.items()}
    return {**parts, "total_mb": round(sum(parts.values()), 1), "pss_mb": round(pss / 1e6, 1), "python_workers": workers}


def _is_jvm(cmdline: str) -> bool:
    return "java" in cmdline.split(" ", 1)[0]


def available_memory_mb() -> float:
    """MemAvailable of the machine in MB (what can still be allocated without swapping)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (like ``du -sb``; files that vanish mid-walk are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


# ---------------------------------------------------------------------------- figures
def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ratio(value, baseline) -> float | None:
    return round(value / baseline, 2) if value is not None and baseline else None
