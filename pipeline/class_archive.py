"""The JVM class-data archive that lets the job's Spark driver start faster.

A cold start spends much of its time in the driver JVM loading and verifying Spark's classes
(about 20,000 of them before the first batch commits). Java's class-data sharing (CDS) maps
them from an archive instead. ``make setup`` builds one archive per checkout by running the
real job for one batch on a throwaway embedded broker with ``-XX:ArchiveClassesAtExit``; the
JVM writes the classes it loaded when it exits. :func:`driver_java_options` then points
every driver JVM at it (bench/bench_startup.py measures the difference).

The archive is a build output beside the lookup operator's jar, tied to this JDK and this
venv's jars: when either changes the JVM ignores it and starts the slow way (its warnings are
silenced), so it can only make a start faster, never break one.

    python -m pipeline.class_archive          # (re)build it; make setup does this
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parent / "jvm" / "build" / "spark-classes.jsa"
# Without these the JVM prints a line per class it cannot archive (and, with a stale archive,
# why it ignores it) on every start.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

log = logging.getLogger(__name__)


def driver_java_options(archive: Path = ARCHIVE) -> str:
    """JVM options that use the archive when there is one ("" when there is none)."""
    return f"-XX:SharedArchiveFile={archive} {QUIET}" if archive.is_file() else ""


def build(archive: Path = ARCHIVE, timeout_s: float = 600.0) -> bool:
    """Write the archive by running the job once in a child process; False (and one line on
    stderr) when that failed, since a missing archive only costs start-up time."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".tmp")
    partial.unlink(missing_ok=True)
    archive.unlink(missing_ok=True)  # the training JVM must load every class itself
    result = subprocess.run([sys.executable, "-m", "pipeline.class_archive", "--train", str(partial)],
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0 or not partial.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"note: no JVM class archive built (training run exited {result.returncode}: {last}); "
              "Spark starts without it", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, archive)
    print(f"built {archive.relative_to(Path.cwd()) if archive.is_relative_to(Path.cwd()) else archive}")
    return True


def training_records() -> dict[str, list[dict]]:
    """Two users, two items and orders that hit, wait for and miss them: every code path's classes."""
    users = [{"id": u, "firstName": "Ada", "lastName": "Lovelace", "emailAddress": "ada@example.com",
              "createdAt": 1_600_000_000_000, "deletedAt": -1, "mergedAt": -1, "parentUserId": -1} for u in (1, 2)]
    items = [{"id": i, "createdAt": 1_500_000_000_000, "adjective": "shiny", "category": "gadget", "modifier": "pro",
              "name": f"item{i}", "price": 10.0} for i in (1, 2)]
    orders = [{"invoiceId": n, "lineItemId": n * 10, "userId": 1 + n % 3, "itemId": 1 + n % 2, "itemName": "item1",
               "itemCategory": "gadget", "price": 3.5, "createdAt": 1_700_000_000_000 + n, "paidAt": -1}
              for n in range(30)]
    return {"users": users, "items": items, "orders": orders}


def train(partial: Path) -> None:
    """One batch of the real job on a throwaway broker, in a JVM that archives its classes at exit."""
    from pipeline.config import load_settings
    from pipeline.job import run_forever
    from pipeline.producers import publish_records
    from pipeline.topics import make_client

    with tempfile.TemporaryDirectory(prefix="ss-class-archive-") as tmp:
        from pipeline.broker import EmbeddedBroker

        broker = EmbeddedBroker(Path(tmp) / "broker").start()
        try:
            settings = load_settings(env={}, cli={
                "pulsar.service_url": broker.service_url, "paths.data_dir": str(Path(tmp) / "data"),
                "spark.master": "local[2]", "job.trigger_interval": "200ms", "enrichment.max_wait": "1s",
                "spark.extra_java_options": f"-XX:ArchiveClassesAtExit={partial} {QUIET}"})
            client = make_client(broker.service_url)
            try:
                for kind, records in training_records().items():
                    publish_records(client, settings.topics[kind], kind, records)
            finally:
                client.close()
            run_forever(settings, max_batches=2)
        finally:
            from pyspark.sql import SparkSession

            session = SparkSession.getActiveSession()
            if session is not None:
                session.stop()  # the JVM exits with this process and writes the archive then
            broker.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    if len(sys.argv) == 3 and sys.argv[1] == "--train":
        train(Path(sys.argv[2]))
    else:
        sys.exit(0 if build() else 0)  # never fail setup over an optimisation
