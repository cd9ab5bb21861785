"""The enrichment job: read → parse → user lookup → item lookup → sinks, with a restart strategy.

``python -m pipeline run`` calls :func:`run_forever`. The query plan is one chain::

    pulsar source (+ parse) ─ groupByKey(user_id).transformWithState(ChangelogLookup)
                  ─ groupByKey(item_id).transformWithState(ChangelogLookup) ─ foreachBatch(sinks)

The parse step runs inside the source's read tasks (its ``transform`` option). The lookups are
one Java operator used twice (pipeline/enrich/lookups.py, jvm/); everything else is Python.

On failure the query restarts from its last checkpoint up to ``job.restart.attempts`` times,
``job.restart.delay`` apart; each attempt is an event. Sink or checkpoint path errors stop the
job at once: retrying cannot fix a full disk or a read-only folder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path

from pipeline import store
from pipeline.broker import BrokerUse, use_embedded_broker
from pipeline.config import Settings
from pipeline.errors import ConfigError, SinkError, StatefulStreamsError
from pipeline.freed_memory import give_back_freed_memory
from pipeline.metrics import MetricsStore, prune_old_days
from pipeline.sinks import SinkMaintenance, SinkWriter, last_committed_batch

log = logging.getLogger(__name__)
NON_RETRYABLE = ("SinkError", "Permission denied", "No space left on device", "Read-only file system")


class JobFailed(StatefulStreamsError):
    """The job stopped: its restart attempts are spent, or the error cannot be retried."""


def summarize_error(text: str) -> str:
    """One line for an operator from a (possibly Java- and Python-wrapped) exception text."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    for pattern in (r"^pipeline\.errors\.\w+: .+", r"^\w*(Error|Exception): .+"):
        found = [line for line in lines if re.match(pattern, line)]
        if found:  # our own errors (a sink's, raised in foreachBatch) read without their class name
            return re.sub(r"^pipeline\.errors\.\w+: ", "", found[-1])[:500]
    return (lines[0] if lines else "unknown error")[:500]


CHECKPOINT_LAYOUT = "changelog-lookup-v1"  # what the state in a checkpoint was written by
EVENT_TIME_LAYOUT = "versioned-lookup-v1"  # enrichment.time = event: versions per key, another state shape


def checkpoint_layout(settings: Settings) -> str:
    """The state layout the job writes with these settings (the two time modes cannot share one)."""
    return EVENT_TIME_LAYOUT if settings["enrichment.time"] == "event" else CHECKPOINT_LAYOUT


def check_checkpoint_layout(checkpoint: Path, layout: str = CHECKPOINT_LAYOUT) -> None:
    """Refuse a checkpoint whose state an older job layout wrote; mark a fresh one as ours.

    The bucketed Python lookups kept their state in another shape, which Spark cannot read
    into the JVM operator; their checkpoints carry no layout file.
    """
    marker = checkpoint / "layout"
    if marker.is_file() and marker.read_text().strip() == layout:
        return
    if last_committed_batch(checkpoint) >= 0:
        found = marker.read_text().strip() if marker.is_file() else "the bucketed Python lookups (before the JVM operator)"
        raise ConfigError(f"checkpoint {str(checkpoint)!r} was written by {found} and cannot be restored into "
                          f"this job; move it aside (or delete it) to start fresh from the topics")
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker.write_text(layout + "\n")


class StartupClock:
    """Seconds each start-up phase took, from the process's own start (imports included)."""

    def __init__(self):
        self.phases = {"process_and_imports": round(process_age_s(), 2)}
        self._last = time.monotonic()

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self._last, 2)
        self._last = now

    def total_s(self) -> float:
        return sum(self.phases.values())


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where there is none)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def build_query(spark, settings: Settings, service_url: str, writer: SinkWriter):
    """Start the streaming query (returns the StreamingQuery)."""
    from pyspark.sql import functions as F

    from pipeline.enrich import rules
    from pipeline.enrich.lookups import LOOKUPS, apply_event_lookup, apply_lookup, with_event_watermarks
    from pipeline.source.counts import list_topic_partitions, observe_rows
    from pipeline.source.datasource import PulsarDataSource
    from pipeline.spark import shuffle_partitions

    checkpoint = store.checkpoint_dir(settings.data_dir)
    spark.dataSource.register(PulsarDataSource)
    topics = ",".join(f"{kind}={topic}" for kind, topic in settings.topics.items())
    max_rows = settings["job.max_rows_per_batch"]
    # About two read tasks per core for a full batch: each task opens a reader mid-topic, which costs
    # far more than reading on (measured: 10k-row pieces took twice as long as 50k ones).
    split_rows = max(1, max_rows // (2 * shuffle_partitions(settings)))
    # The parse step runs in each read task (the source's ``transform``): rows leave Python once.
    source = (spark.readStream.format("pulsar").schema(rules.ENVELOPE_SPARK_SCHEMA)
              .option("service_url", service_url).option("topics", topics)
              .option("maxRowsPerBatch", max_rows).option("splitRows", split_rows)
              .option("maxBytesPerBatch", settings["job.max_bytes_per_batch"])
              # changelogs first: an order is decided with every changelog message published before it
              .option("changelogs", ",".join(lookup.changelog for lookup in LOOKUPS))
              .option("shareAfter", settings["job.orders_share_after"])
              .option("statsDir", str(store.source_stats_dir(settings.data_dir)))
              .option("startingOffsets", settings["job.start_from"])
              .option("controlDir", str(store.replay_requests_dir(settings.data_dir)))
              .option("transform", "pipeline.enrich.parse:parse_batches"))
    if settings["pulsar.auth_token"]:
        # Spark redacts option values whose key says "token" from plans and its UI.
        source = source.option("authToken", settings["pulsar.auth_token"])
    if settings["enrichment.time"] == "event":  # a message its time cannot place is a dead letter
        from pipeline.enrich.event_clock import clock_file
        source = source.option("transformArgs", json.dumps({
            "timed_by_message": rules.timed_by_message(settings["enrichment.order_time"])}))
        # the driver's clock (event_clock.py) travels in the offsets and bounds each row's part in
        # the watermark; a quiet stream still gets a batch when it moves (pipeline/source/clock.py)
        source = source.option("clockFile", str(clock_file(settings.data_dir)))
    rows = source.load()
    # {"kind": "orders", "op": "order", "user_id": 17, "item_id": 4, …, "user_state": None, "item_state": None}
    # The source's offsets count broker entries; the messages of each batch are counted here.
    partitions = list_topic_partitions(service_url, settings.topics, settings["pulsar.auth_token"])
    count_rows = lambda frame: observe_rows(frame, partitions, partition_column="source_partition")  # noqa: E731
    # Every column a row carries is converted and shuffled in each lookup; a message's key is
    # read by the sinks only for a dead letter.
    rows = rows.withColumn("key", F.when(F.col("op") == "dead", F.col("key")))
    if settings["enrichment.time"] == "event":  # versions as of each order's event time (README "Event time")
        from pipeline.enrich.event_clock import watermark_partitions
        from pipeline.enrich.event_rules import future_after
        rows = with_event_watermarks(rows, settings["enrichment.order_time"],
                                     int(settings["enrichment.out_of_orderness"] * 1000),
                                     watermark_partitions(partitions), on_every_row=count_rows,
                                     future_horizon_ms=int(settings["enrichment.future_horizon"] * 1000))
        for lookup in LOOKUPS:
            rows = apply_event_lookup(rows, lookup, settings.max_wait_ms,
                                      int(settings["enrichment.allowed_lateness"] * 1000),
                                      future_after(int(settings["enrichment.out_of_orderness"] * 1000),
                                                   int(settings["enrichment.future_horizon"] * 1000)))
    else:
        rows = count_rows(rows).drop(*rules.EVENT_TIME_COLUMNS)  # null in processing time
        for lookup in LOOKUPS:
            rows = apply_lookup(rows, lookup, settings.max_wait_ms)
    # {… "user_first_name": "Ada", "user_state": "found", "item_name": "…", "item_state": "missing", "waited_ms": 0}

    def write_batch(batch_df, batch_id: int) -> None:
        writer.write_wide(rules.with_sinks(rules.with_envelope_columns(batch_df.toArrow())), batch_id)
        give_back_freed_memory()

    interval_ms = int(settings["job.trigger_interval"] * 1000)
    return (rows.writeStream.queryName("enrichment").foreachBatch(write_batch)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=f"{interval_ms} milliseconds").start())


def attach_event_clock(spark, metrics_store: MetricsStore, settings: Settings, service_url: str):
    """In event time, the listener that keeps the job's clock: each changelog partition's newest
    time and the idle ones (pipeline/enrich/event_clock.py); None in processing time. Added before
    the job's other listeners: the next batch's planning waits for it."""
    if settings["enrichment.time"] != "event":
        return None
    from pipeline.enrich.event_clock import EventClockListener, changelog_partitions

    clock = EventClockListener(metrics_store, settings.data_dir, int(settings["enrichment.out_of_orderness"] * 1000),
                               int(settings["enrichment.idle_timeout"] * 1000),
                               changelog_partitions(service_url, settings.topics, settings["pulsar.auth_token"]))
    spark.streams.addListener(clock)
    return clock


def recover_sinks(writer: SinkWriter, settings: Settings) -> int:
    """The checkpoint's last committed batch; sink batches a replaced checkpoint no longer
    counts are taken back (a batch committed to the sinks but not by Spark is kept: its re-run
    commits nothing twice)."""
    last = last_committed_batch(store.checkpoint_dir(settings.data_dir))
    writer.recover(last)
    return last


def connect_broker(settings: Settings) -> tuple[str, BrokerUse | None]:
    """The broker URL, and with 'embedded' this process's use of the data dir's one broker (started
    if none runs); ``stop()`` the use when done: the broker stops once no process uses it."""
    if not settings.is_embedded:
        return settings.service_url, None
    use = use_embedded_broker(settings.data_dir)
    return use.service_url, use


def finish_batch_in_flight(query, timeout_s: float = 30.0) -> None:
    """Wait, up to ``timeout_s``, for the micro-batch being run to commit, so that stopping the
    query cancels no work (a cancelled batch is redone after a restart, but fills the log with
    Spark's and py4j's traces)."""
    def last_batch() -> int:
        progress = query.lastProgress
        return progress["batchId"] if progress else -1

    # Only the batch running now: with timers pending, Spark starts the next batch right after
    # it, so "no trigger active" may never be seen.
    running = last_batch()
    deadline = time.monotonic() + timeout_s
    while (query.isActive and query.status.get("isTriggerActive") and last_batch() == running
           and time.monotonic() < deadline):
        time.sleep(0.1)


def stop_on_signals(stop: threading.Event) -> None:
    """Ctrl-C and SIGTERM set ``stop`` (only the main thread may install signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())


def run_forever(settings: Settings, max_batches: int = 0, stop: threading.Event | None = None) -> None:
    """Run the job until stopped (Ctrl-C / SIGTERM / ``stop``), ``max_batches`` are done, or it fails for good.

    Holds the data dir's job lock (pipeline/lock.py) from before the broker starts to the end,
    so a second job on the same data dir refuses at once, and a restore never runs under it.
    """
    from pyspark.errors import StreamingQueryException

    from pipeline.lock import acquire_job_lock
    from pipeline.savepoints import recover_restore
    from pipeline.listener import JobListener
    from pipeline.spark import build_spark
    from pipeline.state import StateCensus
    from pipeline.topics import ensure_topics

    if max_batches < 0:
        raise StatefulStreamsError(f"max_batches {max_batches!r} must be >= 0 (0 = run until stopped)")
    startup = StartupClock()
    lock = acquire_job_lock(settings, "job")
    own_broker = listener = census = event_clock = maintenance = None
    try:
        recover_restore(settings)
        check_checkpoint_layout(store.checkpoint_dir(settings.data_dir), checkpoint_layout(settings))
        startup.mark("lock_and_recovery")
        service_url, own_broker = connect_broker(settings)
        startup.mark("broker")
        metrics_store = MetricsStore(settings.data_dir)
        writer = SinkWriter(settings.data_dir)
        stop = stop or threading.Event()
        batches_done = [0]

        def record(kind: str, message: str, **details) -> None:
            try:
                metrics_store.event(kind, message, **details)
            except OSError as exc:  # a full disk must not hide the error the job stops with
                log.error("cannot record the %s event (%s): %s", kind, exc, message)

        def on_batch(batch_id: int) -> None:
            batches_done[0] += 1
            if max_batches and batches_done[0] >= max_batches:
                stop.set()

        stop_on_signals(stop)
        ensure_topics(settings, service_url)
        startup.mark("topics")
        spark = build_spark(settings)
        startup.mark("spark_session")
        # PySpark's SparkContext installs a SIGINT handler that cancels every job and raises
        # KeyboardInterrupt in the middle of a py4j call; ours stops the query cleanly instead.
        stop_on_signals(stop)
        sc = spark.sparkContext
        event_clock = attach_event_clock(spark, metrics_store, settings, service_url)
        listener = JobListener(metrics_store, writer, store.checkpoint_dir(settings.data_dir),
                               int(settings["job.trigger_interval"] * 1000), sc.uiWebUrl, sc.applicationId, on_batch)
        spark.streams.addListener(listener)
        census = StateCensus(spark, store.checkpoint_dir(settings.data_dir), metrics_store, settings.max_wait_ms).start()
        maintenance = SinkMaintenance(writer, settings.data_dir, settings["sinks.compact_interval"],
                                      settings["sinks.vacuum_retention"], record,
                                      prune=lambda: prune_old_days(settings.data_dir, settings["metrics.retention"])).start()
        attempts, delay = settings["job.restart.attempts"], settings["job.restart.delay"]
        startup.mark("listeners")
        metrics_store.event("job_started", f"job started on {settings['spark.master']} reading {service_url} "
                            f"in {startup.total_s():.1f}s", settings=settings.redacted(), startup_s=startup.phases)
        attempt = 0
        while True:
            last = recover_sinks(writer, settings)
            query = build_query(spark, settings, service_url, writer)
            try:
                while query.isActive and not stop.is_set() and writer.failure is None:
                    query.awaitTermination(0.5)
                if writer.failure is not None:  # a committed batch could not be published
                    query.stop()
                    error = str(writer.failure)
                    record("job_failed", f"job stopped: {error}", error=error)
                    raise SinkError(error) from None
                if stop.is_set():
                    finish_batch_in_flight(query)
                    query.stop()
                    record("job_stopped", f"job stopped after batch {last_committed_batch(store.checkpoint_dir(settings.data_dir))}")
                    recover_sinks(writer, settings)
                    return
                query.awaitTermination()  # re-raises the query's failure, if any
                return
            except StreamingQueryException as exc:
                error = summarize_error(exc.getMessage() if hasattr(exc, "getMessage") else str(exc))
                if any(marker in str(exc) for marker in NON_RETRYABLE):
                    if "SinkError" not in str(exc):  # Spark's own write failed; its text names no path
                        cause = next(marker for marker in NON_RETRYABLE if marker in str(exc))
                        error = (f"{cause} while writing under {str(settings.data_dir)!r} (checkpoint, sinks or "
                                 "metrics); free space or fix the folder, then run the job again")
                    record("job_failed", f"job stopped: {error}", error=error)
                    raise (SinkError if "SinkError" in str(exc) else JobFailed)(error) from None
                attempt += 1
                if attempt > attempts:
                    record("job_failed", f"job failed after {attempts} restarts: {error}", error=error)
                    raise JobFailed(f"job failed after {attempts} restart attempts: {error}") from None
                record("restart", f"restart {attempt}/{attempts} in {delay:g}s after: {error}",
                                    attempt=attempt, max_attempts=attempts, error=error, delay_s=delay)
                log.warning("query failed (%s); restart %d/%d in %gs", error, attempt, attempts, delay)
                if stop.wait(delay):
                    record("job_stopped", "job stopped while waiting to restart")
                    return
    finally:
        if maintenance is not None:
            maintenance.stop()
        if census is not None:
            census.stop()
        if listener is not None:
            spark.streams.removeListener(listener)
        if event_clock is not None:
            spark.streams.removeListener(event_clock)
        if own_broker is not None:
            own_broker.stop()
        lock.release()
