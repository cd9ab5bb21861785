"""The SparkSession every part of the job runs on: RocksDB state, loopback UI, sized shuffles.

Called on the driver, once per process (``getOrCreate``). The Python workers run the same
interpreter as the driver, so the venv's packages (pulsar-client, pyarrow) are there.
"""

from __future__ import annotations

import atexit
import os
import sys
from contextlib import contextmanager

from pipeline.config import Settings
from pipeline.runtime.freed_memory import (ARROW_POOL, ARROW_POOL_VARIABLE, MALLOC_ARENAS, MALLOC_ARENAS_VARIABLE,
                                          jvm_allocator)
from pipeline.runtime.scratch import release_scratch, take_scratch

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# The code Spark generates to turn the lookups' Java rows back into its own format is one method
# per operator over the envelope's 40 columns: past the JVM's 8,000-byte limit for compiling a
# method, so it ran interpreted and took half the executor threads' time. Compiling it anyway
# gave the job 37.6k against 30.3k orders/s (bench/README.md, stop 23). Driver and executors.
JIT_OPTIONS = "-XX:-DontCompileHugeMethods"
# The state store (bench/bench_state.py records these with its figures).
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # One memory budget for every RocksDB instance in the JVM (block cache, memtables, index
    # and filter blocks), so memory does not grow with the keys held (bench/bench_state.py).
    # Below Spark's usual 500 MB: state beyond the cache is read from the OS's page cache,
    # and the job's whole memory stays under 4 GB at 10M users (bench/README.md, stop 24).
    "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
    "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": "384",
    "spark.sql.streaming.stateStore.stateSchemaCheck": "true",
}
# What the driver keeps of past batches for its UI and status API. Spark's defaults keep 1,000
# jobs, 1,000 stages and 1,000 SQL executions: at one job of about three stages and two SQL
# executions a batch, the hour at 2,000 orders/s (783 batches) never reached them, so the driver's
# heap grew for the whole hour (bench/README.md, "The hour of the real job"); an execution keeps
# its physical plan's text and graph (about 44 KB as the REST API's JSON). The job reads only the
# newest batch's jobs and stages (pipeline/listener.py, within seconds of the batch), and no one
# reads the SQL tab, so a few minutes of batches at the 0.5 s trigger are plenty. Tasks are kept
# per stage (at most its partitions here) and streaming progress 100 deep by default; both are
# stated so the bound is ours, not a default's.
UI_RETENTION_CONF = {
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "500",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "100",
    "spark.sql.streaming.ui.retainedProgressUpdates": "100",
    "spark.sql.streaming.ui.retainedQueries": "20",
    "spark.sql.streaming.numRecentProgressUpdates": "100",
}
# With a shared secret (a cluster): RPC and block transfers (shuffles carry names and emails)
# are encrypted with keys derived from it. The master and worker get the same in compose.
SECURE_RPC_CONF = {"spark.network.crypto.enabled": "true"}
CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def shuffle_partitions(settings: Settings) -> int:
    """The configured count, or the cores (local[N] / local[*]) when it is 0."""
    configured = settings["spark.shuffle_partitions"]
    if configured:
        return configured
    master = settings["spark.master"]
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    return os.cpu_count() or 2


def build_spark(settings: Settings, app_name: str = "stateful-streams"):
    """Get or create the SparkSession with our state store and tuning."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The Python workers (local: they inherit this environment) allocate Arrow memory from the
    # system allocator, which hands freed memory back (pipeline/runtime/freed_memory.py).
    os.environ.setdefault(ARROW_POOL_VARIABLE, ARROW_POOL)
    os.environ.setdefault(MALLOC_ARENAS_VARIABLE, MALLOC_ARENAS)  # the JVM started below, and its workers
    if settings["spark.master"].startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pipeline.runtime.class_archive import driver_java_options, one_word
    from pipeline.enrich.lookups import require_jar
    from pipeline.sql.jvm_sender import client_jars

    # Spark's local dirs and the JVM's temporary files in the data dir, swept of dead processes'
    # (pipeline/runtime/scratch.py): a kill -9 leaves them behind, and /tmp kept them for good.
    # Taken once, by the call that starts this process's JVM; a later call gets that session.
    scratch = None
    if SparkContext._gateway is None:
        scratch = take_scratch(settings.data_dir)
        atexit.register(release_scratch, scratch)
    scratch_options = {"spark.local.dir": str(scratch)} if scratch else {}
    builder = (
        SparkSession.builder.master(settings["spark.master"]).appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions(settings)))
        # The lookup operator's jar: on the driver's classpath, and shipped by Spark to a cluster's
        # executors; with the Java Pulsar client's jars when fetched (the SQL pipelines' JVM topic sender).
        .config("spark.jars", ",".join(str(jar) for jar in (require_jar(), *client_jars())))
        # The driver collects each batch's rows for the sinks. Its heap holds a batch at the
        # default bound (job.max_rows_per_batch: 500 entries, about 300k orders) in 1 GB as
        # fast as in 2 GB, and the job's memory is bounded (bench/README.md, stop 24). With the
        # old bound, a 600k-order backlog batch lost its task results (TaskResultLost) in 1 GB.
        .config("spark.driver.memory", settings["spark.driver_memory"])
        # Hadoop's FileContext (Spark's default here) resolves links with a forked ``readlink`` and
        # sets permissions with a forked ``chmod`` for every file it renames into the checkpoint:
        # about 16 processes a batch, 30 ms an offset-log write and 45 ms a state commit. The
        # FileSystem API renames in-process (local disks and HDFS rename atomically).
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
        # Keep enough batches around that a savepoint can always copy a committed version.
        .config("spark.sql.streaming.minBatchesToRetain", "20")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        # No kill buttons on the driver's UI: its viewers need no power over the job's stages.
        .config("spark.ui.killEnabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        # Spark's stop path runs a deep regex over long Python tracebacks; give threads room. The
        # class archive (pipeline/runtime/class_archive.py) cuts the driver JVM's start. Both JIT compilers
        # (the JVM's default): C2 gave the job 31k against 23k orders/s over 2M orders, and kill -9
        # to the first batch 11.5 against 8.5 s with C1 alone, both inside the 15 s target
        # (bench/README.md, stop 22); ``-XX:TieredStopAtLevel=1`` in spark.extra_java_options
        # trades the throughput for the faster start.
        .config("spark.driver.extraJavaOptions", " ".join(filter(None, (
            "-Xss16m", JIT_OPTIONS, scratch and one_word(f"-Djava.io.tmpdir={scratch}"), driver_java_options(),
            settings["spark.extra_java_options"]))))
        .config("spark.executor.extraJavaOptions", JIT_OPTIONS)
        .config(f"spark.executorEnv.{ARROW_POOL_VARIABLE}", ARROW_POOL)  # a cluster's Python workers
        .config(f"spark.executorEnv.{MALLOC_ARENAS_VARIABLE}", MALLOC_ARENAS)  # a cluster's executors
    )
    for key, value in {**STATE_STORE_CONF, **UI_RETENTION_CONF, **scratch_options}.items():
        builder = builder.config(key, value)
    if settings["spark.master"].startswith("local"):
        # Loopback only on one machine; on a cluster the workers must reach the driver.
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    if settings["spark.auth_secret"]:
        # Spark RPC authentication between this driver, the master, the workers and the executors,
        # which share the secret (docker-compose.yaml); Spark redacts it in its UI and logs.
        builder = builder.config("spark.authenticate", "true")
        for key, value in SECURE_RPC_CONF.items():
            builder = builder.config(key, value)
    # The driver JVM with jemalloc where it is installed (freed_memory.py); the Python workers it
    # starts, and a cluster's executors, without (an empty LD_PRELOAD preloads nothing).
    preload = None if "LD_PRELOAD" in os.environ else jvm_allocator()
    if preload:
        builder = builder.config("spark.executorEnv.LD_PRELOAD", "")
    with _environment("LD_PRELOAD", preload):
        start_jvm(builder)
    if settings["spark.auth_secret"]:
        # Set after the JVM started, so it goes to the JVM over py4j and never on the JVM's
        # command line (any local user reads those in /proc). A standalone driver needs it in its
        # conf; the executors get it from their worker's environment, never on a command line.
        builder = builder.config("spark.authenticate.secret", settings["spark.auth_secret"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextmanager
def _environment(name: str, value: str | None):
    """This process's environment with ``name`` set to ``value`` (None: as it is) for a moment."""
    if value is None:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def start_jvm(builder) -> None:
    """Start the driver JVM with the builder's options, if this process has none yet.

    PySpark starts the JVM at ``getOrCreate`` and puts every option set before that on the
    ``spark-submit`` command line as ``--conf key=value``; options set after it reach the JVM over
    py4j. Call this before setting a secret.
    """
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is None:
        conf = SparkConf()
        for key, value in builder._options.items():  # what getOrCreate would have passed
            conf.set(key, value)
        SparkContext._ensure_initialized(conf=conf)


def deliver_pending_events(spark, timeout_s: float = 10.0) -> bool:
    """Wait until Spark's listener bus has handed every queued event to its listeners.

    A query's last progress event is queued as the batch ends and delivered on the bus's own
    thread: removing a listener right after the query stops dropped the last batch's progress
    row (one in a few runs). False if the bus did not empty within the timeout.
    """
    from py4j.protocol import Py4JJavaError

    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(timeout_s * 1000))
        return True
    except Py4JJavaError:  # a TimeoutException: the caller goes on without the late events
        return False


NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def timer_ticks(longest_timer_ms: int, trigger_ms: int, once: bool) -> dict[str, int]:
    """The source options (pipeline/source/datasource.py ``tickForMs``, ``tickEveryMs``) that plan
    the batches of no row a query's processing-time timers need once its input stops, for a query
    started with :func:`start_without_idle_batches`. A timer is due at most ``longest_timer_ms``
    after the batch that set it, and a batch plans a trigger after it is due, hence the window.
    ``once``: one batch when the window has passed, for timers that only free state (a SQL state
    TTL: an expired group is dropped on its next input anyway); else one every trigger within it,
    for timers that decide something (the lookups' ``max_wait``: a waiting order is decided
    within a trigger of its wait)."""
    window = longest_timer_ms + 2 * trigger_ms + 1000
    return {"tickForMs": window, "tickEveryMs": window if once else 0}


def start_without_idle_batches(spark, writer):
    """Start ``writer``'s query with Spark's no-data batches off: it runs a batch only when its
    source plans one.

    With an operator that keeps processing-time timers (the job's lookups wait ``max_wait`` for a
    missing key), Spark runs a batch every trigger, input or not, for as long as the query runs
    (``TransformWithStateExec.shouldRunAnotherBatch`` is true in ProcessingTime mode): an idle job
    took 34 s of CPU in 40 s, and wrote a progress row and a checkpoint version a trigger. Its
    source plans the batches of no row its timers need instead (option ``tickForMs``). A query runs
    on a copy of the session's settings made as it starts, so the session keeps its own.
    """
    previous = spark.conf.get(NO_DATA_BATCHES, "true")
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        return writer.start()
    finally:
        spark.conf.set(NO_DATA_BATCHES, previous)
