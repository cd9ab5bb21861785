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
