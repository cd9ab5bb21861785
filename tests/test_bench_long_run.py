"""bench/bench_long_run.py's verdict on the JVM heap's live set (pure: no job, no broker)."""

from __future__ import annotations

from bench.bench_long_run import MEASURING, judge
from bench.long_run_samples import live_heap
from pipeline import store

SETTINGS = {"job.trigger_interval": 0.5, "sinks.compact_interval": 600.0, "sinks.vacuum_retention": 604800.0,
            "metrics.retention": 604800.0}


def make_sample(minute: float, heap_mb: float | None = None) -> dict:
    """A sample as long_run_samples.sample gives it, every figure flat; with a live heap if given."""
    job = {"driver_python_mb": 280, "jvm_mb": 1500, "python_workers_mb": 700, "pss_mb": 2200}
    sink = {"table_files": 5, "parquet_bytes": 1e6, "log_bytes": 1e5}
    disk = {"checkpoint": {"bytes": 10e6}, "broker": {"bytes": 1e6}, **{sink_name: dict(sink) for sink_name in store.SINKS},
            **{f"metrics/{stream}": {"bytes": 1e3} for stream in store.METRIC_STREAMS}}
    found = {"minute": minute, "memory": {"job": job, "broker": {"rss_mb": 30}, MEASURING: {"rss_mb": 300}}, "disk": disk}
    if heap_mb is not None:
        found["jvm_heap"] = {"live_mb": heap_mb}
    return found


def verdict_for(heaps: list[float | None]) -> dict:
    samples = [make_sample(minute, heap) for minute, heap in enumerate(heaps)]
    console = {"pages": {}, "exporter_scrape_s": 0.1}
    return judge(console, console, samples, SETTINGS, len(heaps))


def test_a_live_heap_that_levels_off_is_flat():
    entry = verdict_for([100, None, 300, None, 310, None, 320, None])["flat"]["job JVM heap live after a full GC (MB)"]
    assert (entry["start"], entry["from"], entry["end"], entry["ok"]) == (100, 300, 320, True)


def test_a_live_heap_that_keeps_growing_is_not():
    verdict = verdict_for([100, 150, 200, 250, 300, 350, 400, 450])
    assert not verdict["flat"]["job JVM heap live after a full GC (MB)"]["ok"] and not verdict["flat_ok"]


def test_without_heap_samples_there_is_no_heap_verdict():
    assert not any("heap" in name for name in verdict_for([None] * 8)["flat"])


def test_live_heap_of_a_job_without_a_jvm_says_so():
    assert live_heap(2**22 + 12345) == {"error": "no JVM under the job"}
