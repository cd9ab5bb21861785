"""bench/bench_long_run.py's verdict on the JVM (its live heap, its configured bound) and the jcmd parsers (pure: no job, no broker)."""

from __future__ import annotations

from bench.bench_long_run import MEASURING, judge, table_rows
from bench.long_run_samples import live_heap, parse_heap_info, parse_native_memory
from pipeline import store

SETTINGS = {"job.trigger_interval": 0.5, "sinks.compact_interval": 600.0, "sinks.vacuum_retention": 604800.0,
            "metrics.retention": 604800.0}


def make_sample(minute: float, heap_mb: float | None = None, jvm_rss_mb: float | None = None,
                non_heap_mb: float = 450.0, rocksdb_mb: float | None = None) -> dict:
    """A sample as long_run_samples.sample gives it, every figure flat; with a live heap and the
    JVM's native memory (a 1,024 MB heap at most, 600 MB of it committed) if given."""
    job = {"driver_python_mb": 280, "jvm_mb": 1500, "python_workers_mb": 700, "pss_mb": 2200}
    sink = {"table_files": 5, "parquet_bytes": 1e6, "log_bytes": 1e5}
    disk = {"checkpoint": {"bytes": 10e6}, "broker": {"bytes": 1e6}, **{sink_name: dict(sink) for sink_name in store.SINKS},
            **{f"metrics/{stream}": {"bytes": 1e3} for stream in store.METRIC_STREAMS}}
    found = {"minute": minute, "memory": {"job": job, "broker": {"rss_mb": 30}, MEASURING: {"rss_mb": 300}}, "disk": disk}
    if heap_mb is not None:
        found["jvm_heap"] = {"live_mb": heap_mb}
    if jvm_rss_mb is not None:
        nmt = {"committed_mb": 600 + non_heap_mb, "heap_max_mb": 1024.0, "categories_mb": {"Java Heap": 600.0}}
        found["jvm_native"] = {"rss_mb": jvm_rss_mb, "heap": {"committed_mb": 600.0}, "nmt": nmt,
                               "outside_nmt_mb": jvm_rss_mb - 600 - non_heap_mb}
    if rocksdb_mb is not None:
        found["batch"] = {"rocksdb_memory_mb": rocksdb_mb}
    return found


def verdict_for(heaps: list[float | None], jvm_rss: list[float | None] | None = None,
                non_heap: list[float] | None = None, rocksdb: list[float | None] | None = None) -> dict:
    jvm_rss, non_heap = jvm_rss or [None] * len(heaps), non_heap or [450.0] * len(heaps)
    samples = [make_sample(minute, *figures)
               for minute, figures in enumerate(zip(heaps, jvm_rss, non_heap, rocksdb or [None] * len(heaps)))]
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


JVM_BOUND = "job JVM RSS within heap max + RocksDB cap + measured rest (MB)"
NON_HEAP = "job JVM non-heap, NMT committed (MB)"


def test_a_jvm_rss_rising_to_its_configured_bound_is_within_it():
    # 1,024 heap + 402.7 RocksDB (384 MiB) + 450 non-heap + 112.5 room = 1,989.2 MB
    entry = verdict_for([None] * 8, jvm_rss=[1000, 1100, 1200, 1400, 1600, 1700, 1800, 1900])["flat"][JVM_BOUND]
    assert (entry["from"], entry["end"], entry["bound"], entry["ok"]) == (1200, 1900, 1989.2, True)
    assert entry["bound_parts"] == {"heap_max": 1024.0, "rocksdb_cap": 402.7, "non_heap_nmt": 450.0,
                                    "malloc_beyond_rocksdb": None, "room": 112.5}


def test_the_bound_counts_the_arenas_own_as_measured():
    # a quarter in: outside NMT 1300 - 600 - 450 = 250, RocksDB 200: 50 MB the arenas own; 1,024 + 402.7 + 500 + 125
    entry = verdict_for([None] * 8, jvm_rss=[1200, 1250, 1300, 1350, 1400, 1450, 1500, 1500],
                        rocksdb=[100, 150, 200, 250, 300, 350, 400, 400])["flat"][JVM_BOUND]
    assert (entry["bound_parts"]["malloc_beyond_rocksdb"], entry["bound_parts"]["room"], entry["bound"]) == (50, 125.0, 2051.7)


def test_a_jvm_rss_past_its_configured_bound_is_not():
    verdict = verdict_for([None] * 8, jvm_rss=[1000, 1200, 1400, 1600, 1800, 1900, 2000, 2100])
    assert not verdict["flat"][JVM_BOUND]["ok"] and not verdict["flat_ok"]


def test_the_non_heap_may_grow_by_a_quarter_from_a_quarter_in():
    entry = verdict_for([None] * 8, jvm_rss=[1000] * 8, non_heap=[450, 460, 480, 500, 530, 560, 580, 600])["flat"][NON_HEAP]
    assert (entry["start"], entry["from"], entry["end"], entry["bound"], entry["ok"]) == (450, 480, 600, 600.0, True)


def test_a_non_heap_past_that_is_not_flat():
    assert verdict_for([None] * 8, jvm_rss=[1000] * 8, non_heap=[450] * 7 + [700])["flat"][NON_HEAP]["ok"] is False


MALLOC = "job JVM malloc outside NMT beyond RocksDB's usage (MB)"


def test_rocksdb_filling_its_cache_is_not_malloc_growth():
    # outside NMT = RSS - 600 heap - 450 non-heap: 150 -> 450 MB, all of it RocksDB's cache
    verdict = verdict_for([None] * 8, jvm_rss=[1200, 1250, 1300, 1350, 1400, 1450, 1500, 1500],
                          rocksdb=[100, 150, 200, 250, 300, 350, 400, 400])
    assert (verdict["flat"][MALLOC]["from"], verdict["flat"][MALLOC]["end"], verdict["flat"][MALLOC]["ok"]) == (50, 50, True)


def test_malloc_growing_beyond_rocksdb_is_not_flat():
    verdict = verdict_for([None] * 8, jvm_rss=[1200, 1250, 1300, 1400, 1500, 1600, 1700, 1800], rocksdb=[100] * 8)
    assert (verdict["flat"][MALLOC]["from"], verdict["flat"][MALLOC]["end"], verdict["flat"][MALLOC]["ok"]) == (150, 650, False)


def test_without_native_memory_there_is_no_jvm_bound():
    flat = verdict_for([None] * 8)["flat"]
    assert not any(name in flat for name in (JVM_BOUND, NON_HEAP)) and {"job jvm_mb (MB)", "job pss_mb (MB)"} <= set(flat)


def test_with_its_bound_the_jvm_is_not_judged_against_the_start():
    # the job's PSS 2,200 of which the JVM's RSS 1,500 in make_sample: 700 without it
    flat = verdict_for([None] * 8, jvm_rss=[1000, 1100, 1200, 1400, 1600, 1700, 1800, 1900])["flat"]
    assert "job jvm_mb (MB)" not in flat and "job pss_mb (MB)" not in flat
    assert (flat["job pss_mb but the JVM (MB)"]["end"], flat["job pss_mb but the JVM (MB)"]["ok"]) == (700, True)


def test_the_table_row_shows_the_whole_pss():
    samples = [make_sample(minute, None, 1500) for minute in range(8)]
    console = {"pages": {}, "exporter_scrape_s": 0.1}
    result = {"samples": [{**s, "load_average": [1.0, 1.0, 1.0]} for s in samples], "partial": True,
              "workload": {"rate": 2000, "trigger_interval_s": 0.5}, "verdict": judge(console, console, samples, SETTINGS, 8)}
    assert table_rows(result)[0][1:3] == ("2,200 MB (load 1.0)", "at the start 2,200 MB, at 2 min 2,200 MB")


NMT_TEXT = """7169:

Native Memory Tracking:

Total: reserved=7513001KB, committed=953125KB
       malloc: 70437KB #276569
       mmap:   reserved=7442564KB, committed=882688KB

-                 Java Heap (reserved=1048576KB, committed=494592KB)
                            (mmap: reserved=1048576KB, committed=494592KB)

-                    Thread (reserved=4748228KB, committed=33624KB)
                            (thread #308)

-        Shared class space (reserved=212992KB, committed=198296KB)
"""
G1_HEAP = """7169:
 garbage-first heap   total 494592K, used 130723K [0x00000000c0000000, 0x0000000100000000)
  region size 1024K, 9 young (9216K), 7 survivors (7168K)
 Metaspace       used 42127K, committed 43776K, reserved 1114112K
  class space    used 5849K, committed 6656K, reserved 1048576K
"""
SERIAL_HEAP = """7169:
 def new generation   total 78656K, used 41000K [0x00000000c0000000, 0x00000000c5550000, 0x00000000d5550000)
  eden space 69952K,  58% used [0x00000000c0000000, 0x00000000c2800000, 0x00000000c4450000)
 tenured generation   total 174784K, used 100000K [0x00000000d5550000, 0x00000000e0000000, 0x0000000100000000)
 Metaspace       used 42127K, committed 43776K, reserved 1114112K
"""


def test_native_memory_is_parsed_in_mb():
    assert parse_native_memory(NMT_TEXT) == {
        "committed_mb": 976.0, "malloc_mb": 72.1, "heap_max_mb": 1073.7,
        "categories_mb": {"Java Heap": 506.5, "Thread": 34.4, "Shared class space": 203.1}}


def test_native_memory_of_a_jvm_without_tracking_says_so():
    assert parse_native_memory("7169:\nNative memory tracking is not enabled\n") == {
        "error": "Native memory tracking is not enabled"}


def test_heap_info_sums_the_generations_and_skips_metaspace():
    assert parse_heap_info(G1_HEAP) == {"committed_mb": 506.5, "used_mb": 133.9}
    assert parse_heap_info(SERIAL_HEAP) == {"committed_mb": 259.5, "used_mb": 144.4}
