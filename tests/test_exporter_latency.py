"""The exporter's latency histogram reads only the window it needs (issue 28): its first scrape
counts the rows committed in LATENCY_WINDOW_S before the newest, later scrapes only the rows
committed since. Real Delta tables written by :class:`pipeline.sinks.SinkWriter`, real DuckDB.

A file the histogram must not read is overwritten with garbage once committed: reading it
would fail the scrape, so every passing scrape shows it was never opened."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from app.exporter import LATENCY_BUCKETS_S, LatencyHistogram
from app.sources import connect
from pipeline import sinks
from waiting import wait_for

NOW_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def enriched(batch_id: int, committed_ms: int, latencies_ms: list[int]) -> dict[str, pa.Table]:
    """One batch of enriched rows committed at ``committed_ms``, published ``latencies_ms`` before."""
    schema, rows = sinks.SCHEMAS["enriched"], len(latencies_ms)
    columns = {"invoice_id": pa.array(range(rows), pa.int64()), "batch_id": pa.array([batch_id] * rows, pa.int64()),
               "enriched_at": pa.array([committed_ms] * rows, pa.int64()),
               "published_at": pa.array([committed_ms - latency for latency in latencies_ms], pa.int64())}
    return {"enriched": pa.Table.from_arrays([columns[f.name].cast(f.type) if f.name in columns
                                              else pa.nulls(rows, f.type) for f in schema], schema=schema)}


def spoil_newest_file(data_dir: Path, before: set[str]) -> None:
    """Overwrite the file the last commit added: a reader that opens it fails."""
    (added,) = set(sinks.sink_files(data_dir, "enriched")) - before
    Path(added).write_bytes(b"not parquet")


def count(histogram: LatencyHistogram, cursor) -> tuple[float, float, dict[str, float]]:
    buckets, seconds = histogram.totals(cursor)
    return dict(buckets)["+Inf"], seconds, dict(buckets)


def test_the_histogram_reads_the_window_then_only_what_was_committed_since(tmp_path):
    writer = sinks.SinkWriter(tmp_path)
    hour = 3_600_000
    writer.commit_batch(enriched(0, NOW_MS - 2 * hour, [100_000] * 50), 0)  # history, out of the window
    spoil_newest_file(tmp_path, set())
    writer.commit_batch(enriched(1, NOW_MS - 60_000, [400, 1500, 2500]), 1)  # a minute before the newest
    writer.commit_batch(enriched(2, NOW_MS, [100, 200]), 2)
    histogram = LatencyHistogram(tmp_path, window_s=300)
    with connect().cursor() as cursor:
        rows, seconds, buckets = count(histogram, cursor)
        assert rows == 5 and abs(seconds - 4.7) < 1e-9 and histogram.files_read == 2
        assert buckets[str(LATENCY_BUCKETS_S[0])] == 2 and buckets["2.0"] == 4 and buckets["3.0"] == 5
        assert count(histogram, cursor)[0] == 5 and histogram.files_read == 0  # nothing new: nothing read
        counted = set(sinks.sink_files(tmp_path, "enriched"))
        for path in counted:  # every file counted so far is spoiled now: none may be read again
            Path(path).write_bytes(b"not parquet")
        writer.commit_batch(enriched(3, NOW_MS + 1000, [600] * 4), 3)
        wait_for(lambda: count(histogram, cursor)[0] == 9, timeout=30, interval=0.2,
                 what="the next batch in the histogram (the catalog lists again after a second)")
        rows, seconds, buckets = count(histogram, cursor)
        assert abs(seconds - 7.1) < 1e-9 and buckets["0.5"] == 3 and buckets["1.0"] == 7 and buckets["3.0"] == 9
