"""The SparkSession's settings that bound the driver's memory over a long run (issue 28)."""

from __future__ import annotations

from pipeline.runtime.spark import UI_RETENTION_CONF

# Spark's own defaults for what its status store keeps: 1,000 jobs, stages and SQL executions,
# more than the hour's 783 batches, so the driver's heap grew all hour.
SPARK_DEFAULTS = {"spark.ui.retainedJobs": 1000, "spark.ui.retainedStages": 1000,
                  "spark.sql.ui.retainedExecutions": 1000}


def test_every_retention_is_well_under_sparks_default():
    for key, default in SPARK_DEFAULTS.items():
        assert int(UI_RETENTION_CONF[key]) <= default // 2, key


def test_the_listener_still_finds_the_newest_batchs_jobs():
    """pipeline/listener.py reads the newest batch's jobs and stages from the UI's REST API a few
    seconds after the batch: one job and about three stages a batch, so keep tens of batches."""
    assert int(UI_RETENTION_CONF["spark.ui.retainedJobs"]) >= 50
    assert int(UI_RETENTION_CONF["spark.ui.retainedStages"]) >= 3 * 50


def test_the_spark_session_carries_them(spark):
    """The session every test shares starts through build_spark, as the job does."""
    conf = spark.sparkContext.getConf()
    for key, value in UI_RETENTION_CONF.items():
        assert conf.get(key) == value, key


def test_the_driver_jvm_runs_on_jemalloc_where_installed_and_its_python_workers_do_not(spark):
    """Where Debian's libjemalloc2 is installed (``make setup``), the driver JVM maps it and the
    Python workers it starts do not (they hand memory back with glibc's malloc_trim)."""
    import os

    import pytest

    from pipeline.runtime.freed_memory import jvm_allocator

    if jvm_allocator() is None:
        pytest.skip("libjemalloc2 is not installed here (make setup installs it)")
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    assert "libjemalloc" in open(f"/proc/{pid}/maps").read()

    def worker_maps(_rows):
        yield "libjemalloc" in open("/proc/self/maps").read() or bool(os.environ.get("LD_PRELOAD"))

    assert spark.sparkContext.parallelize([0], 1).mapPartitions(worker_maps).collect() == [False]


def test_a_query_started_without_idle_batches_leaves_the_sessions_setting_as_it_was(spark):
    """The job's query runs on a copy of the session's settings with Spark's no-data batches off;
    the session itself keeps them on, for the queries that need them (event time's watermark)."""
    from pipeline.runtime.spark import NO_DATA_BATCHES, start_without_idle_batches

    before = spark.conf.get(NO_DATA_BATCHES)
    query = start_without_idle_batches(spark, spark.readStream.format("rate").load().writeStream.format("noop"))
    try:
        assert query.isActive and spark.conf.get(NO_DATA_BATCHES) == before == "true"
    finally:
        query.stop()


def test_a_progress_listener_gets_each_batchs_progress_as_json(spark, tmp_path):
    """Our listeners get a progress event as its JSON and query name (pipeline/listener.py
    ``ProgressAsJson``), not PySpark's field-by-field copy of it; and removing one stops it."""
    import json

    from pipeline.listener import ProgressListener
    from waiting import wait_for

    seen = []

    class Recording(ProgressListener):
        def onQueryProgress(self, event) -> None:
            seen.append((event.progress.name, json.loads(event.progress.json)))

    listener = Recording()
    spark.streams.addListener(listener)
    query = (spark.readStream.format("rate").option("rowsPerSecond", 50).load().writeStream.queryName("json-progress")
             .format("noop").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_for(lambda: any(progress["numInputRows"] for _, progress in seen), 60, what="a batch's progress")
    finally:
        query.stop()
        spark.streams.removeListener(listener)
    name, progress = next((name, progress) for name, progress in seen if progress["numInputRows"])
    assert name == progress["name"] == "json-progress" and progress["sources"][0]["description"].startswith("Rate")
    assert progress["batchId"] >= 0 and "triggerExecution" in progress["durationMs"]
    assert listener._jlistener is listener._jlistener  # removeListener finds what addListener added
