"""Re-drive is idempotent (issue 27, item 2): each order is republished at most once per request;
rows already re-driven and orders enriched since are skipped and counted; every reason the job
writes is accepted. Pure: hand-built sinks and a recording stand-in for the Pulsar client."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from app_fixtures import ENRICHED_SCHEMA, MISSING_SCHEMA
from pipeline import control, sinks, store
from pipeline.config import load_settings
from pipeline.enrich import rules
from pipeline.enrich.lookups import MISSING_REASONS
from pipeline.metrics import read_rows

T0 = 1_764_000_000_000


class RecordingClient:
    """Stands in for pulsar.Client: every message sent, as (record, properties)."""

    def __init__(self):
        self.sent: list[tuple[dict, dict]] = []

    def create_producer(self, topic, **_):
        return self

    def send_async(self, payload, callback, partition_key=None, properties=None):
        self.sent.append((json.loads(payload), properties))

    def flush(self):
        pass

    def close(self):
        pass


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(settings, write(sink, rows), client): sinks written batch by batch, messages recorded."""
    settings = load_settings(env={}, cli={"paths.data_dir": str(tmp_path), "pulsar.service_url": "pulsar://127.0.0.1:1"})
    client = RecordingClient()
    monkeypatch.setattr("pipeline.feed.topics.make_client", lambda *a, **k: client)
    batches = {"missing_state": 0, "enriched": 0}

    def write(sink: str, rows: list[dict]) -> None:
        """One committed batch of the sink's Delta table, as the job writes it."""
        schema = MISSING_SCHEMA if sink == "missing_state" else ENRICHED_SCHEMA
        columns = {name: [row.get(name) for row in rows] for name in schema.names}
        sinks.DeltaSinks({sink: store.sink_dir(settings.data_dir, sink)}).commit_batch(
            {sink: pa.table(columns, schema=schema)}, batches[sink])
        batches[sink] += 1

    return settings, write, client


def missing(invoice: int, message: str, redrive_of: str | None = None, at: int = 0, reason: str = "user",
            line: int = 1, user: int = 7) -> dict:
    return {"invoice_id": invoice, "line_item_id": line, "user_id": user, "item_id": 3, "item_name": "lamp",
            "item_category": "home", "price": 9.5, "created_at": T0 * 1000, "paid_at": T0 * 1000, "reason": reason,
            "waited_ms": 10_000, "published_at": (T0 + at) * 1000, "detected_at": (T0 + at + 10_000) * 1000,
            "batch_id": at, "source_topic": "orders", "source_partition": 0, "source_message_id": message,
            "redrive_of": redrive_of}


def enriched(invoice: int, message: str, redrive_of: str | None = None, line: int = 1) -> dict:
    return {"invoice_id": invoice, "line_item_id": line, "user_id": 7, "item_id": 3, "price": 9.5,
            "user_first_name": "Ada", "enriched_at": T0 * 1000, "source_message_id": message, "redrive_of": redrive_of}


def test_repeated_redrives_of_one_order_republish_one_message_each(world):
    settings, write, client = world
    write("missing_state", [missing(100, "m0")])
    for attempt in range(3):  # each re-drive fails again: the job writes one more missing row
        sent_before = len(client.sent)
        control.redrive(settings, invoice_ids=[100], requested_by="test")
        assert len(client.sent) == sent_before + 1, f"re-drive #{attempt + 1} sent {len(client.sent) - sent_before}"
        record, properties = client.sent[-1]
        write("missing_state", [missing(100, f"m{attempt + 1}", redrive_of=properties[rules.REDRIVE_PROPERTY],
                                        at=attempt + 1)])
    # each re-drive republished the newest failure, pointing at the row it re-drove
    assert [p[rules.REDRIVE_PROPERTY] for _, p in client.sent] == ["m0", "m1", "m2"]
    assert {record["invoiceId"] for record, _ in client.sent} == {100}


def test_an_order_enriched_since_is_not_republished(world):
    settings, write, client = world
    write("missing_state", [missing(100, "m0"), missing(101, "m5")])
    write("enriched", [enriched(100, "m9")])  # order 100 was republished by its producer and enriched
    plan = control.redrive(settings, invoice_ids=[100, 101], requested_by="test")
    assert [record["invoiceId"] for record, _ in client.sent] == [101]
    assert plan.count == 1 and plan.skipped == {control.SKIP_ENRICHED: 1}


def test_a_row_already_redriven_is_skipped_and_counted(world):
    settings, write, client = world
    write("missing_state", [missing(100, "m0"), missing(101, "m5", at=1)])
    write("missing_state", [missing(100, "m1", redrive_of="m0", at=2)])
    write("enriched", [enriched(101, "m6", redrive_of="m5")])
    plan = control.plan_redrive(settings, user_id=7)
    assert [row["source_message_id"] for row in plan.rows] == ["m1"]
    assert plan.skipped == {control.SKIP_REDRIVEN: 2}  # m0 (m1 points at it); m5 (m6 points at it)
    assert "1 order line(s) will be republished" in plan.describe()
    assert "2 already re-driven" in plan.describe()
    assert client.sent == []  # a plan sends nothing


def test_an_order_listed_twice_is_republished_once_and_a_redrive_in_flight_is_not_repeated(world):
    settings, write, client = world
    # two re-drives of m0 from before this fix, both missing again
    write("missing_state", [missing(100, "m0"), missing(100, "m1", redrive_of="m0", at=1),
                            missing(100, "m2", redrive_of="m0", at=2)])
    plan = control.redrive(settings, invoice_ids=[100], requested_by="test")
    assert [p[rules.REDRIVE_PROPERTY] for _, p in client.sent] == ["m2"]  # the newest
    assert plan.skipped == {control.SKIP_REDRIVEN: 1, control.SKIP_DUPLICATE: 1}
    # the job has not read the republished message yet: a second request sends nothing more
    again = control.redrive(settings, invoice_ids=[100], requested_by="test")
    assert again.count == 0 and len(client.sent) == 1
    assert again.skipped == {control.SKIP_REDRIVEN: 2, control.SKIP_DUPLICATE: 1}
    events = [row for row in read_rows(settings.data_dir, "events") if row["kind"] == "redrive"]
    assert events[0]["details"]["message_ids"] == ["m2"] and events[1]["details"]["count"] == 0
    assert events[1]["details"]["skipped"] == {control.SKIP_REDRIVEN: 2, control.SKIP_DUPLICATE: 1}


@pytest.mark.parametrize("reason", MISSING_REASONS)
def test_every_reason_the_job_writes_can_be_redriven(world, reason):
    settings, write, client = world
    write("missing_state", [missing(100, "m0", reason=reason)])
    assert control.redrive(settings, reason=reason, requested_by="test").count == 1
    assert {"late", "future"} <= set(MISSING_REASONS)


def test_the_cli_takes_every_reason(world, capsys):
    from pipeline.cli import main

    settings, write, client = world
    write("missing_state", [missing(100, "m0", reason="late"), missing(101, "m1", reason="late"),
                            missing(102, "m2", reason="late", at=1, redrive_of="m1")])
    assert main(["--data-dir", str(settings.data_dir), "--service-url", "pulsar://127.0.0.1:1",
                 "redrive", "--reason", "late"]) == 0
    out = capsys.readouterr().out
    assert "re-drove 2 missing-state order line(s)" in out and "skipped 1: 1 already re-driven" in out
