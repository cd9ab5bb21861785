"""The metrics store's readers at a month's size: the console's newest batches and the exporter's counters.

Writes ``N`` progress rows (about 3.6 KB each, as the job's) spread over 30 day files, then times
``load_batches(limit=300)`` (the newest lines of the newest day files) against the same query over
every day file (what the console did before), and the exporter's running totals: their first read
(the whole retained store, once per exporter process) and a scrape after it (nothing new appended).
The first read is timed twice in the same run: as it is (each row's ``sink_rows`` read from the
end of its line) and as it was (every row parsed whole). Rows are written as the job writes them
(compact JSON, pipeline/metrics.py).

    python bench/bench_metrics_readers.py 100000
"""

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app import metric_queries, sources
from app.store_totals import RunningTotals, StoreTotals, add_progress
from pipeline.metrics_tail import StreamTail
d = Path(tempfile.mkdtemp())
folder = d / "metrics" / "progress"; folder.mkdir(parents=True)
base = 1_800_000_000_000
pad = {f"rocksdbCommit{i}Latency": 1.0 for i in range(40)}
n = int(sys.argv[1])
step = 30 * 86_400_000 // n
handles = {}
for b in range(n):
    ts = base + b * step
    row = {"ts_ms": ts, "batch_id": b, "num_input_rows": 5, "duration_ms": {"addBatch": 10, "triggerExecution": 30},
           "topics": [{"topic": t, "generation": 0, "rows": 3, "end_position": b, "latest_position": b + 1,
                       "partitions": [{"partition": p, "rows": 1} for p in range(4)]} for t in ("users", "items", "orders")],
           "state": [{"operator": o, "rows_total": b, "rows_updated": 1, "memory_bytes": 100, "commit_ms": 1, "custom": pad}
                     for o in ("user_lookup", "item_lookup")],
           "sink_rows": {"enriched": 3, "missing_state": 1, "dead_letter": 0}}
    day = time.strftime("%Y-%m-%d", time.gmtime(ts / 1000))
    h = handles.get(day) or handles.setdefault(day, open(folder / f"{day}.jsonl", "a"))
    h.write(json.dumps(row, separators=(",", ":")) + "\n")
for h in handles.values(): h.close()
size = sum(p.stat().st_size for p in folder.iterdir())
c = sources.connect()
def t(f, k=3):
    best = 1e9
    for _ in range(k):
        s = time.perf_counter(); f(); best = min(best, time.perf_counter() - s)
    return best
new = t(lambda: metric_queries.load_batches(c, d, limit=300))
old = t(lambda: sources.query_frame(c, f"SELECT * FROM (SELECT * FROM {sources.metrics_relation(d, 'progress')} ORDER BY ts_ms DESC LIMIT 300)"))
import os
load = os.getloadavg()[0]
rt = RunningTotals(d); first = t(lambda: RunningTotals(d).read(), 1); rt.read(); again = t(rt.read)


def parse_whole():  # the first read as it was: every row parsed whole
    return add_progress(StoreTotals(), StreamTail(d, "progress").read_new())


whole = t(parse_whole, 1)
assert parse_whole() == RunningTotals(d).read()  # the same totals both ways (no events here)
print(f"{n} progress rows, {size/1e6:.0f} MB in {len(handles)} day files: load_batches(300) {new*1000:.0f} ms (newest lines) vs {old*1000:.0f} ms (every day file); exporter totals first read {first*1000:.0f} ms (every row parsed whole: {whole*1000:.0f} ms), next scrape {again*1000:.1f} ms; load {load:.1f} to {os.getloadavg()[0]:.1f}")
shutil.rmtree(d, ignore_errors=True)
