"""The model-based test: random streams through the real job and through rules.EnrichmentModel.

Hypothesis draws a stream as phases; a phase is some messages on one topic (changelog upserts,
tombstones, orders for known and unknown ids, poison). Each phase is published and read by
the running job before the next is published, so the job's micro-batches see the phases in
order, as the model does. Within a changelog phase a key appears at most once: how the source
cuts a phase into batches then cannot change what any order sees. The sinks must equal the
model's output row for row, including the orders still waiting (absent from both).

Two jobs: ``max_wait = 0`` (decided at once) and ``max_wait = 1h`` (orders wait for state that
comes in a later phase, and are released by it). One job serves every example of its mode;
each example uses ids of its own.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from pipeline import wire
from pipeline.enrich import rules
from pipeline.metrics import read_rows
from factories import item, order, publish, user
from jobproc import JobThread
from sinkread import rows
from waiting import wait_for

pytestmark = pytest.mark.e2e
_examples = itertools.count(1)

KEYS = st.integers(1, 4)
NAMES = st.sampled_from(["Ann", "Bo", "Cy"])
users_phase = st.lists(st.one_of(st.tuples(st.just("upsert"), KEYS, NAMES), st.tuples(st.just("delete"), KEYS, st.none()),
                                 st.tuples(st.just("poison"), KEYS, st.none())),
                       min_size=1, max_size=4, unique_by=lambda m: m[1]).map(lambda ms: ("users", ms))
items_phase = st.lists(st.one_of(st.tuples(st.just("upsert"), KEYS, st.sampled_from([1.5, 2.0, 9.25])),
                                 st.tuples(st.just("delete"), KEYS, st.none())),
                       min_size=1, max_size=4, unique_by=lambda m: m[1]).map(lambda ms: ("items", ms))
orders_phase = st.lists(st.tuples(KEYS, KEYS, st.sampled_from([False] * 5 + [True])), min_size=1, max_size=5) \
    .map(lambda ms: ("orders", ms))
STREAMS = st.lists(st.one_of(users_phase, items_phase, orders_phase), min_size=2, max_size=7)


@pytest.fixture(scope="module", params=["0s", "1h"])
def running_job(request, tmp_path_factory, broker):
    from pipeline.config import load_settings

    tag = tmp_path_factory.mktemp("model").name
    topics = {k: f"persistent://public/default/{k}-{tag}" for k in ("users", "items", "orders")}
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path_factory.mktemp("modeldata")),
        "spark.master": "local[2]", "job.trigger_interval": "200ms", "enrichment.max_wait": request.param,
        **{f"topics.{k}": v for k, v in topics.items()}})
    job = JobThread(settings)
    wait_for(lambda: read_rows(settings.data_dir, "progress") or job.error, timeout=240, what="the job's first batch")
    state = {"settings": settings, "published": Counter(), "max_wait_ms": settings.max_wait_ms, "job": job}
    try:
        yield state
    finally:
        job.close()


def messages_of(phase, base: int, invoices) -> list[tuple[str, bytes]]:
    """The (key, payload) messages of one phase, with ids moved into this example's range."""
    kind, drawn = phase
    messages = []
    for entry in drawn:
        if kind == "orders":
            user_id, item_id, poison = entry
            invoice = next(invoices)
            payload = b"{not json" if poison else wire.encode(order(invoice, base + user_id, base + item_id))
            messages.append((f"o{invoice}", payload))
            continue
        op, key, value = entry
        if op == "delete":
            messages.append((str(base + key), b""))
        elif op == "poison":
            messages.append((str(base + key), b"[]"))
        elif kind == "users":
            messages.append((str(base + key), wire.encode(user(base + key, firstName=value))))
        else:
            messages.append((str(base + key), wire.encode(item(base + key, price=value))))
    return messages


def consumed(data_dir, kind: str, position: int) -> bool:
    """Whether the job has read ``position`` messages of ``kind`` (the rows it counted per batch)."""
    return sum(t["rows"] or 0 for p in read_rows(data_dir, "progress") for t in p["topics"] if t["topic"] == kind) >= position


def sink_view(row: dict, sink: str) -> tuple:
    """What the test compares of an order's sink row (batch ids and times differ by design)."""
    if sink == "enriched":
        return (row["invoice_id"], sink, None, row["user_first_name"], row["item_price"])
    return (row["invoice_id"], sink, row["reason"], None, None)


@hsettings(max_examples=4, deadline=None, derandomize=True, database=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stream=STREAMS)
def test_the_job_decides_every_order_as_the_model_does(running_job, stream):
    settings, published = running_job["settings"], running_job["published"]
    data_dir, url = settings.data_dir, settings.service_url
    example = next(_examples)
    base, invoices = example * 100, itertools.count(example * 10_000)
    model = rules.EnrichmentModel(running_job["max_wait_ms"])
    expected, poison_keys, ours = [], [], set()
    for phase in stream:
        kind = phase[0]
        messages = messages_of(phase, base, invoices)
        envelopes = []
        for key, payload in messages:
            published[kind] += 1
            decided = rules.route_message(kind, key, payload)
            envelopes.append({**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": kind, "key": key, "source_partition": -1,
                              "position": published[kind], **decided})
            if kind == "orders":
                ours.add(int(key[1:]))
            if decided["op"] == "dead":
                poison_keys.append(key)
        expected += model.process(envelopes, now_ms=0)
        publish(url, settings.topics[kind], messages)
        wait_for(lambda: consumed(data_dir, kind, published[kind]), timeout=60, what=f"the job to read {kind}")
        assert running_job["job"].error is None and running_job["job"].thread.is_alive()

    want = Counter(sink_view({**row, "invoice_id": int(row["key"][1:]), "item_price": row["item_price"]}, row["sink"])
                   for row in expected if row["sink"] != "dead_letter")
    got = Counter(sink_view(row, sink) for sink in ("enriched", "missing_state")
                  for row in rows(data_dir, sink) if row["invoice_id"] in ours)
    assert got == want
    dead = Counter(row["key"] for row in rows(data_dir, "dead_letter") if row["key"] in poison_keys)
    assert dead == Counter(poison_keys)
