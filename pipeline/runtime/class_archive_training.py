"""The training run of the JVM class archive (pipeline/runtime/class_archive.py): the real job for two
batches on a throwaway embedded broker, in a driver JVM that archives the classes it loaded when
it exits.

    python -m pipeline.runtime.class_archive_training PARTIAL   # class_archive.build runs this
"""

from __future__ import annotations

import logging
import sys
import tempfile
from pathlib import Path

from pipeline.runtime.class_archive import QUIET, one_word


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
    from pipeline.feed.producers import publish_records
    from pipeline.feed.topics import make_client

    with tempfile.TemporaryDirectory(prefix="ss-class-archive-") as tmp:
        from pipeline.feed.broker import EmbeddedBroker

        broker = EmbeddedBroker(Path(tmp) / "broker").start()
        try:
            settings = load_settings(env={}, cli={
                "pulsar.service_url": broker.service_url, "paths.data_dir": str(Path(tmp) / "data"),
                "spark.master": "local[2]", "job.trigger_interval": "200ms", "enrichment.max_wait": "1s",
                "spark.extra_java_options": f"{one_word(f'-XX:ArchiveClassesAtExit={partial}')} {QUIET}"})
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
    train(Path(sys.argv[1]))
