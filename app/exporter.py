"""The Prometheus exporter: the metrics store and the sinks as Prometheus metrics, via prometheus_client.

It lives on the reading side of the data flow, next to the console's data layer, and reads
what the console reads (:mod:`app.metric_queries`, :mod:`app.queries`, the sink catalog)
through one custom collector (:class:`StoreCollector`): the gauges afresh on every scrape from
the newest rows, the counters as running totals that a scrape brings up to date by reading
only what was appended since the last one (:mod:`app.store_totals`).
It never writes to the data dir and holds no file open between scrapes, so the job never
waits for it.

Run it with ``python -m app.exporter [--address A] [--port P]``, or ``python -m pipeline
exporter``, which starts this module as its own process (``pipeline/`` never imports
``app/``). It binds ``exporter.address``:``exporter.port`` (``SS_EXPORTER_ADDRESS``,
``SS_EXPORTER_PORT``; 127.0.0.1:9464 by default). Scrape it with::

    scrape_configs:
      - job_name: stateful-streams
        static_configs: [{targets: ["127.0.0.1:9464"]}]

Only numbers the job recorded are served: a gauge of the newest micro-batch is left out
while there is none, and counters are totals over the store as this exporter process has read it. The metric names, all
prefixed ``stateful_streams_``, are listed in :data:`METRICS` (the Grafana dashboard in
``app/monitoring/`` uses only these).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from app import console_math, metric_queries, queries
from app.catalog import SinkFile, catalog_for
from app.sources import DURATION_PHASES, connect, files_relation
from app.store_totals import PipelineRunningTotals, RunningTotals
from pipeline.config import Settings, load_settings
from pipeline.errors import StatefulStreamsError

log = logging.getLogger(__name__)

PREFIX = "stateful_streams_"
JOB_STATES = ("not_started", "running", "stalled", "restarting", "failed", "stopped")
# End-to-end latency buckets (published -> enriched), seconds; a micro-batch job lives in 1-30 s.
LATENCY_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
# The histogram's first scrape counts the rows committed this long before the newest (LatencyHistogram).
LATENCY_WINDOW_S = 300.0

# Every metric the exporter serves, as Prometheus names it (a histogram adds _bucket, _sum, _count).
METRICS = {
    PREFIX + name: kind for name, kind in {
        "batches_total": "counter", "last_batch_id": "gauge", "last_batch_timestamp_seconds": "gauge",
        "input_rows_per_second": "gauge", "processed_rows_per_second": "gauge", "batch_duration_ms": "gauge",
        "trigger_interval_ms": "gauge", "batch_phase_duration_ms": "gauge", "backpressure_ratio": "gauge",
        "state_rows": "gauge", "keys_held": "gauge", "orders_waiting": "gauge", "state_memory_bytes": "gauge", "state_commit_ms": "gauge", "rocksdb_commit_ms": "gauge",
        "state_size_bytes": "gauge", "sink_rows_total": "counter", "backlog_entries": "gauge",
        "restarts_total": "counter", "dead_letters_total": "counter", "end_to_end_latency_seconds": "histogram",
        "job_up": "gauge", "job_state": "gauge",
        "admitted_messages": "gauge", "admitted_bytes": "gauge", "orders_held": "gauge", "orders_sharing": "gauge",
        "orders_shared_total": "counter",
        "sql_batches_total": "counter", "sql_rows_in_total": "counter", "sql_rows_out_total": "counter",
        "sql_dead_letters_total": "counter", "sql_restarts_total": "counter", "sql_lag_entries": "gauge",
        "sql_last_batch_timestamp_seconds": "gauge",
    }.items()
}


def _present(value: Any) -> Any:
    """The value, or None for the frames' missing markers (None, NaN, pd.NA)."""
    return None if value is None or pd.isna(value) else value


def _gauge(name: str, help_text: str, samples: list[tuple[dict[str, str], Any]]) -> GaugeMetricFamily:
    """A gauge family with one sample per known value; unknown values are left out, never invented."""
    labels = sorted({label for sample_labels, _ in samples for label in sample_labels})
    family = GaugeMetricFamily(PREFIX + name, help_text, labels=labels)
    for sample_labels, value in samples:
        if _present(value) is not None:
            family.add_metric([sample_labels[label] for label in labels], float(value))
    return family


def _counter(name: str, help_text: str, samples: list[tuple[dict[str, str], Any]]) -> CounterMetricFamily:
    labels = sorted({label for sample_labels, _ in samples for label in sample_labels})
    family = CounterMetricFamily(PREFIX + name, help_text, labels=labels)
    for sample_labels, value in samples:
        family.add_metric([sample_labels[label] for label in labels], float(value))
    return family


class LatencyHistogram:
    """End-to-end latency (``enriched_at - published_at``) of committed enriched orders, as running totals.

    The first scrape counts the rows committed in the :data:`LATENCY_WINDOW_S` before the
    newest one; each later scrape adds only the rows committed after the newest it counted.
    Which files can hold those rows comes from the catalog (the Delta log's ``enriched_at``
    statistics), so a file holding only older rows is never opened, whatever the history:
    the totals read what was committed since the last scrape, not every enriched row. A
    batch's rows share one ``enriched_at`` taken before it commits, and batches commit in
    order, so no row is counted twice or missed between scrapes (unless the clock steps back);
    a row a savepoint restore took back stays counted, and counts again when recommitted.
    Thread-safe: scrapes may overlap. ``files_read`` is how many files the last scrape opened.
    """

    def __init__(self, data_dir: Path, window_s: float | None = None):
        self.data_dir = data_dir
        self.window_ms = int(1000 * (LATENCY_WINDOW_S if window_s is None else window_s))
        self._through_ms: int | None = None  # rows committed at or before this are counted
        self._under = [0] * len(LATENCY_BUCKETS_S)
        self._sum, self._count = 0.0, 0
        self.files_read = 0
        self._lock = threading.Lock()

    def totals(self, connection) -> tuple[list[tuple[str, float]], float]:
        """``([(upper_bound, cumulative_count), …, ("+Inf", count)], sum_seconds)`` for the histogram."""
        with self._lock:
            files = [entry for entry in catalog_for(self.data_dir).files("enriched")
                     if entry.rows and entry.max_ms is not None]
            newest = max((entry.max_ms for entry in files), default=None)
            self.files_read = 0
            if newest is not None:
                if self._through_ms is None:
                    self._through_ms = newest - self.window_ms
                if newest > self._through_ms:
                    fresh = [entry for entry in files if entry.max_ms > self._through_ms]
                    under, seconds, count = self._read(connection, fresh, self._through_ms, newest)
                    self._under = [a + b for a, b in zip(self._under, under)]
                    self._sum += seconds
                    self._count += count
                    self._through_ms, self.files_read = newest, len(fresh)
            buckets = [(str(bound), float(n)) for bound, n in zip(LATENCY_BUCKETS_S, self._under)]
            return buckets + [("+Inf", float(self._count))], self._sum

    @staticmethod
    def _read(connection, files: list[SinkFile], after_ms: int, through_ms: int) -> tuple[list[int], float, int]:
        """Rows committed in ``(after_ms, through_ms]``: at or under each bound, the latencies' sum, and the rows."""
        under = ", ".join(f"count(*) FILTER (WHERE latency_s <= {bound})" for bound in LATENCY_BUCKETS_S)
        # one row: under each bound … | sum | count
        row = connection.execute(f"""
            SELECT {under}, coalesce(sum(latency_s), 0), count(*)
            FROM (SELECT {queries.LATENCY_MS} / 1000.0 AS latency_s
                  FROM read_parquet($files, hive_partitioning = false)
                  WHERE published_at IS NOT NULL AND enriched_at IS NOT NULL
                    AND epoch_ms(enriched_at) > $after AND epoch_ms(enriched_at) <= $through)""",
                                 {"files": [entry.path for entry in files], "after": after_ms,
                                  "through": through_ms}).fetchone()
        return [int(n) for n in row[:-2]], float(row[-2]), int(row[-1])


class StoreCollector(Collector):
    """A prometheus_client collector over one data dir's metrics store and sinks.

    :meth:`collect` is called once per scrape, on the HTTP server's request thread, and
    reads the store afresh through a DuckDB cursor of its own.
    """

    def __init__(self, data_dir: Path, clock=time.time):
        self.data_dir = Path(data_dir)
        self.clock = clock
        self.connection = connect()
        # The console's connection caches Parquet footers, and DuckDB keeps them up to its memory
        # limit (80% of the RAM). This process reads each enriched file once (LatencyHistogram), so
        # its cache only grew: a footer for every file the job wrote, compacted away or not
        # (issue 28: about 2 MB/min at 2,000 orders/s).
        self.connection.execute("SET GLOBAL parquet_metadata_cache = false")
        self.latency = LatencyHistogram(self.data_dir)
        self.totals = RunningTotals(self.data_dir)
        self.pipelines = PipelineRunningTotals(self.data_dir)

    def describe(self) -> list:
        return []  # the families depend on the store's contents; registering must not read it

    def collect(self) -> Iterator:
        with self.connection.cursor() as cursor:
            yield from self._families(cursor, int(self.clock() * 1000))

    def _families(self, cursor, now_ms: int) -> Iterator:
        data_dir = self.data_dir
        totals = self.totals.read()
        newest = metric_queries.load_batches(cursor, data_dir, limit=1)
        state = metric_queries.load_state_by_operator(cursor, data_dir)
        lookups = metric_queries.load_lookup_state(cursor, data_dir)
        backlog = metric_queries.load_backlog(cursor, data_dir, limit=1)
        shares = metric_queries.load_order_shares(cursor, data_dir)
        sink_rows = queries.load_sink_spans(cursor, data_dir).set_index("sink")["rows"]
        status = console_math.job_status_from_frames(metric_queries.load_latest_lifecycle_event(cursor, data_dir),
                                                     newest, now_ms, metric_queries.read_heartbeat(data_dir))
        batch = newest.iloc[-1] if not newest.empty else None

        def latest(column: str) -> list:
            return [({}, None if batch is None else batch[column])]

        yield _counter("batches_total", "Micro-batches the job completed (progress rows).", [({}, totals.batches)])
        yield _gauge("last_batch_id", "Id of the newest completed micro-batch.", latest("batch_id"))
        yield _gauge("last_batch_timestamp_seconds", "Trigger time of the newest micro-batch (Unix seconds).",
                     [({}, None if batch is None else batch["ts_ms"] / 1000)])
        yield _gauge("input_rows_per_second", "Input rate of the newest micro-batch.", latest("input_rows_per_second"))
        yield _gauge("processed_rows_per_second", "Processing rate of the newest micro-batch.",
                     latest("processed_rows_per_second"))
        yield _gauge("batch_duration_ms", "Duration of the newest micro-batch in milliseconds.",
                     latest("batch_duration_ms"))
        yield _gauge("trigger_interval_ms", "Trigger interval of the job in milliseconds.", latest("trigger_interval_ms"))
        yield _gauge("batch_phase_duration_ms",
                     "Duration of each phase of the newest micro-batch (Spark's durationMs; walCommit and "
                     "commitOffsets are the checkpoint's offset and commit log writes).",
                     [({"phase": phase}, None if batch is None else batch[f"{phase}_ms"]) for phase in DURATION_PHASES])
        ratio = None if batch is None else console_math.compute_backpressure_ratio(
            _present(batch["batch_duration_ms"]), _present(batch["trigger_interval_ms"]))
        yield _gauge("backpressure_ratio",
                     "Share of the newest batch's time spent past its trigger interval (0-1; OK <= 0.1, LOW <= 0.5).",
                     [({}, ratio)])
        yield _gauge("state_rows", "State rows of each stateful operator (newest batch): one per key per state "
                     "variable, so keys held plus keys with waiting orders.",
                     [({"operator": row.operator}, row.rows_total) for row in state.itertuples()])
        yield _gauge("keys_held", "Keys each lookup holds a latest record for (newest state census).",
                     [({"lookup": row.lookup}, row.keys_held) for row in lookups.itertuples()])
        yield _gauge("orders_waiting", "Orders waiting in each lookup for their key's state (newest state census).",
                     [({"lookup": row.lookup}, row.waiting_orders) for row in lookups.itertuples()])
        yield _gauge("state_memory_bytes", "Memory used by each stateful operator's state (newest batch).",
                     [({"operator": row.operator}, row.memory_bytes) for row in state.itertuples()])
        yield _gauge("state_commit_ms", "State store commit time of each stateful operator (newest batch).",
                     [({"operator": row.operator}, row.commit_ms) for row in state.itertuples()])
        yield _gauge("rocksdb_commit_ms",
                     "Time the newest batch spent in RocksDB's commit phases (flush, compaction, checkpoint, "
                     "file sync), summed over the stateful operators.", latest("rocksdb_commit_ms"))
        yield _gauge("state_size_bytes", "Size on disk of the state store (newest batch).", latest("state_size_bytes"))
        yield _counter("sink_rows_total", "Rows written to each sink, summed over the progress rows.",
                       [({"sink": "enriched"}, totals.enriched_rows), ({"sink": "missing_state"}, totals.missing_rows),
                        ({"sink": "dead_letter"}, totals.dead_letter_rows)])
        yield _gauge("backlog_entries", "Broker entries on each topic the job has not read yet (newest batch; an entry is one message or one producer batch).",
                     [({"topic": row.topic}, row.backlog) for row in backlog.itertuples()])
        yield _counter("restarts_total", "Restarts of the job from its last checkpoint (restart events).",
                       [({}, totals.events.get("restart", 0))])
        yield _counter("dead_letters_total", "Committed rows in the dead_letter sink.", [({}, sink_rows.get("dead_letter", 0))])
        buckets, seconds = self.latency.totals(cursor)
        latency = HistogramMetricFamily(PREFIX + "end_to_end_latency_seconds",
                                        "Publish-to-enriched latency of committed enriched orders: those committed "
                                        "since 5 minutes before the newest at the exporter's first scrape.")
        latency.add_metric([], buckets, seconds)
        yield latency
        yield _gauge("admitted_messages", "Messages the planner admitted from each topic into the newest batch "
                     "(its estimate: planning reads no payload).",
                     [({"topic": row.topic}, row.admitted_messages) for row in backlog.itertuples()])
        yield _gauge("admitted_bytes", "Bytes the planner admitted from each topic into the newest batch (its estimate).",
                     [({"topic": row.topic}, row.admitted_bytes) for row in backlog.itertuples()])
        yield _gauge("orders_held", "1 if the newest batch held the orders back because the changelogs alone filled "
                     "the batch cap, else 0.", latest("orders_held"))
        yield _gauge("orders_sharing", "1 if the newest batch gave the orders a share anyway while the changelogs "
                     "filled the cap (job.orders_share_after passed), else 0.", latest("orders_shared"))
        yield _counter("orders_shared_total", "Orders admitted while the changelogs filled the batch cap (exact: the "
                       "orders read in the shared batches, from the share events and the open run's progress rows).",
                       [({}, console_math.sum_order_shares(shares["orders"].tolist())[0])])
        yield from self._pipeline_families()
        yield _gauge("job_up", "1 while the job is running and writing batches, else 0.",
                     [({}, int(status.state == "running"))])
        yield _gauge("job_state", "The job's state as the console shows it: 1 for the current state.",
                     [({"state": name}, int(status.state == name)) for name in JOB_STATES])


    def _pipeline_families(self) -> Iterator:
        """Each SQL pipeline's counters and newest-batch gauges, labelled ``pipeline``."""
        pipelines = self.pipelines.read()

        def each(column: str) -> list:
            return [({"pipeline": name}, getattr(totals, column)) for name, totals in pipelines.items()]

        yield _counter("sql_batches_total", "Micro-batches each SQL pipeline completed (its progress rows).",
                       each("batches"))
        yield _counter("sql_rows_in_total", "Source messages each SQL pipeline read.", each("rows_in"))
        yield _counter("sql_rows_out_total", "Change rows each SQL pipeline wrote to its result (and its upsert topic).",
                       each("rows_out"))
        yield _counter("sql_dead_letters_total", "Messages each SQL pipeline could not read, kept as dead letters.",
                       each("dead_letters"))
        yield _counter("sql_restarts_total", "Restarts of each SQL pipeline from its checkpoint (restart events).",
                       each("restarts"))
        yield _gauge("sql_lag_entries", "Broker entries each SQL pipeline's sources hold that it has not read yet "
                     "(newest batch).", each("lag"))
        yield _gauge("sql_last_batch_timestamp_seconds", "Trigger time of each SQL pipeline's newest micro-batch "
                     "(Unix seconds).", [({"pipeline": name}, None if totals.last_ts_ms is None else totals.last_ts_ms / 1000)
                                         for name, totals in pipelines.items()])


class Exporter:
    """A running exporter: its HTTP server thread serves every path with the metrics."""

    def __init__(self, server, thread: threading.Thread):
        self.server, self.thread = server, thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start_exporter(settings: Settings, address: str | None = None, port: int | None = None) -> Exporter:
    """Serve the metrics of ``settings.data_dir`` on ``address``:``port`` (default: the settings;
    port 0 = any free port) from a daemon thread. Called once per process."""
    address = settings["exporter.address"] if address is None else address
    port = settings["exporter.port"] if port is None else port
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(settings.data_dir))
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise StatefulStreamsError(
            f"exporter cannot listen on {address}:{port} ({exc.strerror or exc}); "
            "pick another --port or --address (SS_EXPORTER_PORT, SS_EXPORTER_ADDRESS)") from exc
    return Exporter(server, thread)


def serve_exporter(settings: Settings) -> None:
    """Serve the metrics in the foreground until interrupted."""
    exporter = start_exporter(settings)
    print(f"exporter: {exporter.url} (data dir {settings.data_dir})", flush=True)
    try:
        exporter.thread.join()
    finally:
        exporter.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m app.exporter``: settings from the environment (SS_*) and these flags."""
    parser = argparse.ArgumentParser(prog="python -m app.exporter", description="Serve the job's metrics to Prometheus.")
    parser.add_argument("--address", help="bind address (default: exporter.address, 127.0.0.1)")
    parser.add_argument("--port", help="port (default: exporter.port, 9464)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cli = {name: value for name, value in (("exporter.address", args.address), ("exporter.port", args.port)) if value is not None}
    try:
        serve_exporter(load_settings(cli=cli))
    except StatefulStreamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
