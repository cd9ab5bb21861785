"""The model-based test in event time: random streams through the real job (``enrichment.time =
event``) and through event_rules.EventEnrichmentModel; the sinks must be equal row for row
(batch ids and processing times aside), and so must the count of late changelog versions.

Hypothesis draws a stream as phases: upserts, tombstones and poison on a changelog, each timed
up to 6 s before the stream's clock (out of order, some beyond the out-of-orderness, some
older than watermark - allowed lateness: late versions), orders timed from 7 s before the
clock (late) to 3 s after it (they wait), for known and unknown ids, with poison (and one stream
has an order further ahead than the future horizon allows: future); and ticks,
which move the clock on both changelogs with a version of a key no order names. Only ticks
move the watermark, so however the source cuts a phase into batches, the job decides each
order at the watermark the model uses; after each phase the test waits until the job has read
it and run at the watermark the model computes (so the timers due have fired). A last tick
decides every order still waiting.

One job serves every example; each example has ids and times of its own (far after the last).
One explicit stream holds every case; Hypothesis adds two drawn ones (each costs ~30-40 s of
the real job on two cores, so few examples, small streams and no shrinking).
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings as hsettings, strategies as st

from pipeline import wire
from pipeline.enrich import event_rules, rules
from pipeline.metrics import read_rows
from factories import item, order, publish_timed, user
from jobproc import JobThread
from sinkread import rows
from waiting import wait_for

pytestmark = pytest.mark.e2e
_examples = itertools.count(1)
MAX_WAIT_MS, OOO_MS, LATENESS_MS, FUTURE_HORIZON_MS = 2_000, 2_000, 3_000, 5_000
SENTINEL = 50  # the key ticks move the clock with; no order names it
T0 = 1_700_000_000_000

KEYS, ORDER_KEYS = st.integers(1, 4), st.integers(1, 5)  # id 5 never exists
BACK = st.integers(0, 6)  # seconds before the clock; 3+ is beyond the out-of-orderness, 6 is late
users_phase = st.lists(st.one_of(st.tuples(st.just("upsert"), KEYS, st.sampled_from(["Ann", "Bo"]), BACK),
                                 st.tuples(st.just("delete"), KEYS, st.none(), BACK),
                                 st.tuples(st.just("poison"), KEYS, st.none(), BACK)),
                       min_size=2, max_size=4).map(lambda ms: ("users", ms))
items_phase = st.lists(st.one_of(st.tuples(st.just("upsert"), KEYS, st.sampled_from([1.5, 9.25]), BACK),
                                 st.tuples(st.just("delete"), KEYS, st.none(), BACK)),
                       min_size=2, max_size=4).map(lambda ms: ("items", ms))
orders_phase = st.lists(st.tuples(ORDER_KEYS, ORDER_KEYS, st.sampled_from([False] * 5 + [True]), st.integers(-7, 3)),
                        min_size=2, max_size=5).map(lambda ms: ("orders", ms))
tick = st.integers(1, 5).map(lambda seconds: ("tick", seconds))
# Both changelogs first, then anything, with orders before and after it.
STREAMS = st.tuples(users_phase, items_phase, orders_phase,
                    st.lists(st.one_of(users_phase, items_phase, orders_phase, tick), min_size=1, max_size=3),
                    orders_phase).map(lambda p: [p[0], p[1], ("tick", 1), p[2], *p[3], p[4]])
# One stream with every case in it, whatever Hypothesis draws besides.
EVERY_CASE = [
    ("users", [("upsert", 1, "Ann", 0), ("upsert", 2, "Bo", 2), ("upsert", 3, "Ann", 4), ("poison", 4, None, 0)]),
    ("items", [("upsert", 1, 1.5, 1), ("upsert", 2, 9.25, 3), ("delete", 3, None, 0), ("upsert", 4, 1.5, 5)]),
    # in time, older, an unknown user, poison, late (7 s back), early (2 s ahead: it waits)
    ("orders", [(1, 1, False, -1), (2, 2, False, -3), (5, 1, False, -2), (1, 2, True, 0), (3, 1, False, -7),
                (1, 1, False, 2)]),
    ("tick", 3),
    # beyond the out-of-orderness (4 s back), a tombstone, a late version (6 s back)
    ("users", [("upsert", 1, "Bo", 4), ("delete", 2, None, 1), ("upsert", 3, "Bo", 6)]),
    ("orders", [(1, 1, False, -3), (2, 2, False, 0), (3, 2, False, -4), (4, 3, False, 1)]),
    ("items", [("upsert", 3, 9.25, 2), ("upsert", 3, 9.25, 2), ("delete", 1, None, 0)]),  # the same version twice
    ("tick", 2),
    # the last: 10 s ahead, beyond the out-of-orderness + the future horizon (7 s): future at once
    ("orders", [(1, 2, False, -1), (4, 4, False, 3), (2, 1, False, -2), (1, 1, False, 10)]),
]


@pytest.fixture(scope="module")
def event_job(tmp_path_factory, broker):
    from pipeline.config import load_settings

    tag = tmp_path_factory.mktemp("emodel").name
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path_factory.mktemp("emodeldata")),
        "spark.master": "local[2]", "job.trigger_interval": "200ms", "enrichment.time": "event",
        "enrichment.max_wait": f"{MAX_WAIT_MS}ms", "enrichment.out_of_orderness": f"{OOO_MS}ms",
        "enrichment.allowed_lateness": f"{LATENESS_MS}ms", "enrichment.idle_timeout": "0s",  # never idle
        "enrichment.future_horizon": f"{FUTURE_HORIZON_MS}ms",
        **{f"topics.{k}": f"persistent://public/default/{k}-{tag}" for k in ("users", "items", "orders")}})
    job = JobThread(settings)
    wait_for(lambda: read_rows(settings.data_dir, "progress") or job.error, timeout=240, what="the job's first batch")
    try:
        yield {"settings": settings, "published": Counter(), "job": job}
    finally:
        job.close()


def messages_of(phase, base: int, clock_ms: int, invoices) -> dict[str, list[tuple[str, bytes, int]]]:
    """(key, payload, event time) per topic for one phase, ids moved into this example's range."""
    kind, drawn = phase
    if kind == "tick":
        return {"users": [(str(base + SENTINEL), wire.encode(user(base + SENTINEL)), clock_ms)],
                "items": [(str(base + SENTINEL), wire.encode(item(base + SENTINEL)), clock_ms)]}
    messages = []
    for entry in drawn:
        if kind == "orders":
            user_id, item_id, poison, offset = entry
            invoice, at = next(invoices), clock_ms + offset * 1_000
            payload = b"{not json" if poison else wire.encode(order(invoice, base + user_id, base + item_id, createdAt=at))
            messages.append((f"o{invoice}", payload, at))
            continue
        op, key, value, back = entry
        at = clock_ms - back * 1_000
        if op == "delete":
            payload = b""
        elif op == "poison":
            payload = b"[]"
        elif kind == "users":
            payload = wire.encode(user(base + key, firstName=value))
        else:
            payload = wire.encode(item(base + key, price=value))
        messages.append((str(base + key), payload, at))
    return {kind: messages}


def consumed(data_dir, kind: str, position: int) -> bool:
    """Whether the job has read ``position`` messages of ``kind`` (the rows it counted per batch)."""
    return sum(t["rows"] or 0 for p in read_rows(data_dir, "progress") for t in p["topics"] if t["topic"] == kind) >= position


def late_versions(data_dir) -> int:
    return sum(t.get("late_versions") or 0 for row in read_rows(data_dir, "watermarks") for t in row["topics"])


def as_ms(value):
    return None if value is None else (value if isinstance(value, int) else int(value.timestamp() * 1000))


def view(row: dict, sink: str) -> tuple:
    """What the job must write as the model does (batch ids and processing times differ)."""
    enriched = sink == "enriched"
    return (int(row["invoice_id"]), sink, None if enriched else row["reason"],
            row["user_first_name"] if enriched else None, row["item_price"] if enriched else None,
            as_ms(row["user_as_of"]), as_ms(row["item_as_of"]), row["waited_ms"])


# No shrinking: each example costs seconds of the real job; a failure shows its stream as drawn.
@hsettings(max_examples=2, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stream=STREAMS)
@example(stream=EVERY_CASE)
def test_the_job_decides_every_order_as_the_event_time_model_does(event_job, stream):
    settings, published, job = event_job["settings"], event_job["published"], event_job["job"]
    data_dir, url = settings.data_dir, settings.service_url
    example = next(_examples)
    base, invoices = example * 100, itertools.count(example * 10_000)
    clock = T0 + example * 10_000_000  # far past every earlier example's times
    model = event_rules.EventEnrichmentModel(MAX_WAIT_MS, LATENESS_MS,
                                             event_rules.future_after(OOO_MS, FUTURE_HORIZON_MS))
    newest: dict[str, int | None] = {"users": None, "items": None}
    watermark, late_before = 0, late_versions(data_dir)
    expected, poison_keys, ours = [], [], set()
    # the clock set on both changelogs first, and a last tick past every order + max_wait
    for phase in [("tick", 0), *stream, ("tick", (OOO_MS + MAX_WAIT_MS) // 1_000 + 10)]:
        if phase[0] == "tick":
            clock += phase[1] * 1_000
        for kind, messages in messages_of(phase, base, clock, invoices).items():
            envelopes = []
            for key, payload, at in messages:
                published[kind] += 1
                decided = rules.route_message(kind, key, payload)
                envelopes.append({**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": kind, "key": key,
                                  "source_partition": -1, "position": published[kind], "event_time": at,
                                  **decided, "event_ms": decided["created_at"] if kind == "orders" else at})
                if kind == "orders":
                    ours.add(int(key[1:]))
                if decided["op"] == "dead":
                    poison_keys.append(key)
                elif kind != "orders":
                    newest[kind] = max(newest[kind] or at, at)
            expected += model.process(envelopes, watermark)
            publish_timed(url, settings.topics[kind], messages)
            wait_for(lambda: consumed(data_dir, kind, published[kind]) or job.error, timeout=60,
                     what=f"the job to read {kind}")
        # Ticks move the watermark: wait for the job's batch at it (Spark runs one with no data to
        # fire the timers due), and let the model's timers fire at it too.
        moved = max(watermark, event_rules.combined_watermark(newest, OOO_MS))
        if moved != watermark:
            watermark = moved
            wait_for(lambda: any(r["watermark_ms"] == watermark for r in read_rows(data_dir, "watermarks"))
                     or job.error, timeout=60, what=f"the job's watermark to reach {watermark}")
            expected += model.process([], watermark)
        assert job.error is None and job.thread.is_alive()

    assert model.waiting() == 0  # the last tick decided every order
    want = Counter(view({**row, "invoice_id": int(row["key"][1:])}, row["sink"])
                   for row in expected if row["sink"] != "dead_letter")
    got = Counter(view(row, sink) for sink in ("enriched", "missing_state")
                  for row in rows(data_dir, sink) if row["invoice_id"] in ours)
    assert got == want, f"job only: {sorted((got - want).elements())}; model only: {sorted((want - got).elements())}"
    dead = Counter(row["key"] for row in rows(data_dir, "dead_letter") if row["key"] in poison_keys)
    assert dead == Counter(poison_keys)
    assert late_versions(data_dir) - late_before == sum(lookup.late_versions for lookup in model.lookups)
    if stream == EVERY_CASE:  # it does reach every case
        reasons = Counter(row["reason"] for row in expected if row["sink"] != "dead_letter")
        assert reasons[None] >= 5 and reasons["late"] and reasons["user"] and reasons["future"] == 1
        assert len(poison_keys) == 2
        assert any(lookup.late_versions for lookup in model.lookups)
