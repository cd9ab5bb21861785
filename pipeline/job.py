"""The enrichment job: read → parse → user lookup → item lookup → sinks, with a restart strategy.

``python -m pipeline run`` calls :func:`run_forever`. The query plan is one chain::

    pulsar source (+ parse) ─ groupByKey(user_id).transformWithState(ChangelogLookup)
                  ─ groupByKey(item_id).transformWithState(ChangelogLookup) ─ foreachBatch(sinks)

The parse step runs inside the source's read tasks (its ``transform`` option). The lookups are
one Java operator used twice (pipeline/enrich/lookups.py, jvm/); everything else is Python.

Restarts, what cannot be retried, signals and the start-up clock are pipeline/runtime/supervisor.py's,
shared with the SQL pipelines.
"""

from __future__ import annotations

import json
import logging
import threading

from pipeline import store
from pipeline.feed.broker import BrokerUse, use_embedded_broker
from pipeline.config import Settings
from pipeline.errors import StatefulStreamsError
from pipeline.runtime.freed_memory import give_back_freed_memory
from pipeline.metrics import MetricsStore, prune_old_days
from pipeline.sinks import SinkMaintenance, SinkWriter, last_committed_batch
from pipeline.runtime.supervisor import (CHECKPOINT_LAYOUT, EVENT_TIME_LAYOUT, Lifecycle, StartupClock, Supervisor,
                                 check_checkpoint_layout, stop_on_signals)

log = logging.getLogger(__name__)


class JobFailed(StatefulStreamsError):
    """The job stopped: its restart attempts are spent, or the error cannot be retried."""


JOB = Lifecycle("job", "job_failed", "job_stopped", JobFailed)


def checkpoint_layout(settings: Settings) -> str:
    """The state layout the job writes with these settings (the two time modes cannot share one)."""
    return EVENT_TIME_LAYOUT if settings["enrichment.time"] == "event" else CHECKPOINT_LAYOUT


def build_query(spark, settings: Settings, service_url: str, writer: SinkWriter, guard=lambda write: write):
    """Start the streaming query (returns the StreamingQuery); ``guard`` wraps its batch function
    (``Supervisor.batch``)."""
    from pyspark.sql import functions as F

    from pipeline.enrich import rules
    from pipeline.enrich.lookups import LOOKUPS, apply_event_lookup, apply_lookup, with_event_watermarks
    from pipeline.source.counts import list_topic_partitions, observe_rows
    from pipeline.source.datasource import PulsarDataSource
    from pipeline.runtime.spark import shuffle_partitions, start_without_idle_batches, timer_ticks

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
    if settings["enrichment.time"] == "processing" and settings.max_wait_ms:
        # the batches of no row the lookups' timers need once the stream is quiet
        source = source.options(**timer_ticks(settings.max_wait_ms, int(settings["job.trigger_interval"] * 1000),
                                              once=False))
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
    query = (rows.writeStream.queryName("enrichment").foreachBatch(guard(write_batch))
             .option("checkpointLocation", str(checkpoint))
             .trigger(processingTime=f"{interval_ms} milliseconds"))
    if settings["enrichment.time"] == "event":  # the watermark moves in batches of no input
        return query.start()
    return start_without_idle_batches(spark, query)  # the lookups' timers: the source's ticks


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


def run_forever(settings: Settings, max_batches: int = 0, stop: threading.Event | None = None) -> None:
    """Run the job until stopped (Ctrl-C / SIGTERM / ``stop``), ``max_batches`` are done, or it fails for good.

    Holds the data dir's job lock (pipeline/control/lock.py) from before the broker starts to the end,
    so a second job on the same data dir refuses at once, and a restore never runs under it.
    """
    from pipeline.control.lock import acquire_job_lock
    from pipeline.control.savepoints import recover_restore
    from pipeline.listener import JobListener
    from pipeline.runtime.spark import build_spark
    from pipeline.control.state import StateCensus
    from pipeline.feed.topics import ensure_topics

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
        maintenance = SinkMaintenance.from_settings(
            writer, settings.data_dir, settings, record,
            prune=lambda: prune_old_days(settings.data_dir, settings["metrics.retention"])).start()
        startup.mark("listeners")
        metrics_store.event("job_started", f"job started on {settings['spark.master']} reading {service_url} "
                            f"in {startup.total_s():.1f}s", settings=settings.redacted(), startup_s=startup.phases)
        checkpoint = store.checkpoint_dir(settings.data_dir)
        supervisor = Supervisor(JOB, stop, settings["job.restart.attempts"], settings["job.restart.delay"], record,
                                settings.data_dir)

        def start():
            recover_sinks(writer, settings)
            return build_query(spark, settings, service_url, writer, supervisor.batch)

        supervisor.run(start, committed=lambda: last_committed_batch(checkpoint), failure=lambda: writer.failure,
                       after_stop=lambda: recover_sinks(writer, settings))
    finally:
        if maintenance is not None:
            maintenance.stop()
        if census is not None:
            census.stop()
        if listener is not None or event_clock is not None:
            from pipeline.runtime.spark import deliver_pending_events
            if not deliver_pending_events(spark):
                log.warning("the last batches' progress events were still queued after 10 s; their rows may be missing")
        if listener is not None:
            spark.streams.removeListener(listener)
        if event_clock is not None:
            spark.streams.removeListener(event_clock)
        if own_broker is not None:
            own_broker.stop()
        lock.release()
