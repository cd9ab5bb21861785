"""Fuzzed streams through the real job on the shared broker (end-to-end tier).

Hypothesis draws a stream of good orders, each followed by a few poison messages on any of the
three topics: payloads, keys and properties built as in tests/test_fuzz_wire.py (bytes, lone
surrogates, NUL, right-to-left marks, emoji, 1e400, -0.0, integers past int64, deep nesting,
payloads around the size limit, keys and properties that are not UTF-8). The good orders are
for users and items loaded before the job started, with odd but valid keys and properties.

One job serves every example; each example is told apart by the message ids it published.
Checked from the sinks only: every orders message is in exactly one row of enriched,
missing_state or dead_letter; every bad changelog message in exactly one dead_letter row; every
good order enriched with its user and item; the job never failed or restarted.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pulsar
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings as hsettings, strategies as st

from pipeline import wire
from pipeline.config import load_settings
from pipeline.enrich import rules
from pipeline.metrics import read_events, read_rows
from pipeline.source.reader import read_key_and_properties
from factories import item, order, publish, send_raw, user
from jobproc import JobThread
from sinkread import rows
from test_fuzz_wire import KNOWN_POISON, FakeMessage, clean_text, keys, payloads, properties, to_bytes, dumps, typed_records
from waiting import wait_for

pytestmark = pytest.mark.e2e
TOPICS = ("users", "items", "orders")
# Loaded before the job starts; ids at the edges too (a poison message never touches them).
GOOD_USERS = (880_000_001, 880_000_002, wire.INT64_MAX)
GOOD_ITEMS = (770_000_001, 0, wire.INT64_MIN)
_examples = itertools.count(1)

good_keys = st.one_of(st.none(), st.just(b"invoice"), clean_text.map(str.encode), keys)
good_properties = st.one_of(
    st.none(), st.dictionaries(st.sampled_from([b"redrive-of", b"trace", "\u202e\u043a\u043b\u044e\u0447".encode()]),
                               clean_text.map(str.encode), max_size=2),
    properties)
good_order = st.tuples(st.just("good"), st.sampled_from(GOOD_USERS), st.sampled_from(GOOD_ITEMS), good_keys,
                       good_properties)
poison = st.sampled_from(TOPICS).flatmap(lambda kind: st.tuples(
    st.just("poison"), st.just(kind), keys,
    st.one_of(payloads(kind), typed_records(kind).map(lambda r: to_bytes(dumps(r, False)))), properties))
# Good orders with poison around them: [(good order, [poison, …]), …]
STREAMS = st.lists(st.tuples(good_order, st.lists(poison, max_size=3)), min_size=8, max_size=25)
ORIGINAL_POISON = [  # the messages that stopped the job or broke a sink once, among good orders
    (("good", GOOD_USERS[0], GOOD_ITEMS[0], b"1\xff", {b"redrive-of": b"\xc3\x28"}),
     [("poison", kind, key, payload, props) for kind, key, payload, props in KNOWN_POISON]),
    (("good", GOOD_USERS[2], GOOD_ITEMS[2], "\u202e\x00\U0001F600".encode(), {b"redrive-of": b"r-1"}),
     [("poison", "orders", b"huge", b'{"pad": "' + b"x" * (wire.MAX_PAYLOAD_BYTES + 10) + b'"}', None),
      ("poison", "orders", None, b"[" * 100_000, None),
      ("poison", "orders", b"k", b'{"invoiceId": 1e400}', None),
      ("poison", "users", b"-0", b'{"id": -0.0, "firstName": "\\u0000\\u202e"}', None),
      ("poison", "orders", b"-0", wire.encode(order(5, 0, 0, price=-0.0, userId=-0.0)), None)]),
    (("good", GOOD_USERS[1], GOOD_ITEMS[1], None, None), []),
]


@pytest.fixture(scope="module")
def fuzz_job(tmp_path_factory, broker):
    """One running job (max_wait 0) on fresh topics, with the good users and items loaded."""
    tag = tmp_path_factory.mktemp("fuzzjob").name
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path_factory.mktemp("fuzzdata")),
        "spark.master": "local[2]", "job.trigger_interval": "200ms", "enrichment.max_wait": "0s",
        **{f"topics.{kind}": f"persistent://public/default/{kind}-{tag}" for kind in TOPICS}})
    publish(settings.service_url, settings.topics["users"],
            [(str(u), wire.encode(user(u, createdAt=1_600_000_000_000))) for u in GOOD_USERS])
    publish(settings.service_url, settings.topics["items"],
            [(str(i), wire.encode(item(i, createdAt=1_500_000_000_000, price=9.5))) for i in GOOD_ITEMS])
    job = JobThread(settings)
    try:
        wait_for(lambda: read_rows(settings.data_dir, "progress") or job.error, timeout=180, what="the first batch")
        yield settings, job
    finally:
        job.close()


def key_as_read(key: bytes | None) -> str | None:
    """The key a read task sees (pipeline/source/reader.py): bytes that are not UTF-8 escaped."""
    return key.decode("utf-8", "backslashreplace") if key else None


def redrive_as_read(props: dict | None) -> str | None:
    try:
        return {n.decode("utf-8"): v.decode("utf-8") for n, v in (props or {}).items()}.get("redrive-of")
    except UnicodeDecodeError:
        return None  # properties that are not UTF-8 cannot be read; the order goes on without them


def touches_good_state(kind: str, key: bytes | None, payload: bytes) -> bool:
    """Would this changelog message change a good user or item? (Such a draw is left out.)"""
    if kind == "orders":
        return False
    decided = rules.route_message(kind, key_as_read(key), payload)
    good = GOOD_USERS if kind == "users" else GOOD_ITEMS
    return decided["op"] in ("upsert", "delete") and decided["user_id" if kind == "users" else "item_id"] in good


def sink_rows_of(data_dir, topics: dict[str, str], ours: dict[str, set[str]]) -> dict[str, list[dict]]:
    """Each sink's rows that this example published, by (topic, message id)."""
    found = {}
    for sink in ("enriched", "missing_state", "dead_letter"):
        found[sink] = [r for r in rows(data_dir, sink)
                       if r["source_message_id"] in ours.get(_kind_of(r["source_topic"], topics), ())]
    return found


def _kind_of(topic: str, topics: dict[str, str]) -> str | None:
    return next((kind for kind, name in topics.items() if name == topic), None)


@hsettings(max_examples=2, deadline=None, database=None, print_blob=True, phases=[Phase.explicit, Phase.generate],
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@example(stream=ORIGINAL_POISON)
@given(stream=STREAMS)
def test_poison_among_good_orders_lands_in_one_row_each_and_the_job_stays_up(fuzz_job, stream):
    settings, job = fuzz_job
    data_dir, topics = settings.data_dir, settings.topics
    invoices = itertools.count(next(_examples) * 1_000_000)
    outbox = {kind: [] for kind in TOPICS}  # kind -> [(key, payload, properties)]
    good = {}  # index in the orders outbox -> (invoice, user, item, re-drive of)
    for (_, user_id, item_id, key, props), poisons in stream:
        invoice = next(invoices)
        good[len(outbox["orders"])] = (invoice, user_id, item_id, redrive_as_read(props))
        outbox["orders"].append((key, wire.encode(order(invoice, user_id, item_id)), props))
        for _, kind, key, payload, props in poisons:
            if not touches_good_state(kind, key, payload):
                outbox[kind].append((key, payload, props))
    ids = {kind: send_raw(settings.service_url, topics[kind], [(*m, None) for m in messages])
           for kind, messages in outbox.items()}
    dead_changelog = {kind: {ids[kind][i] for i, (key, payload, _) in enumerate(outbox[kind])
                             if rules.route_message(kind, key_as_read(key), payload)["op"] == "dead"}
                      for kind in ("users", "items")}
    ours = {kind: set(ids[kind]) for kind in TOPICS}
    expected = len(ours["orders"]) + sum(len(dead) for dead in dead_changelog.values())

    def landed() -> dict | None:
        failures = read_events(data_dir, ("restart", "job_failed"))
        assert job.error is None and not failures, f"the job failed: {job.error or failures[0]['message']}"
        found = sink_rows_of(data_dir, topics, ours)
        return found if sum(len(r) for r in found.values()) >= expected else None

    found = wait_for(landed, timeout=120, interval=0.5, what=f"{expected} rows of this example in the sinks")

    # Every orders message in exactly one row of the three sinks; bad changelog messages once in dead_letter.
    order_rows = Counter(r["source_message_id"] for sink in found.values() for r in sink
                         if r["source_topic"] == topics["orders"])
    assert order_rows == Counter(ours["orders"])
    for kind in ("users", "items"):
        assert Counter(r["source_message_id"] for r in found["dead_letter"]
                       if r["source_topic"] == topics[kind]) == Counter(dead_changelog[kind])
    # Good orders around the poison: enriched with their user and item (and re-drive mark).
    enriched = {r["source_message_id"]: r for r in found["enriched"]}
    for index, (invoice, user_id, item_id, redrive) in good.items():
        row = enriched.get(ids["orders"][index])
        assert row is not None, f"good order {invoice} (user {user_id}, item {item_id}) was not enriched"
        assert (row["invoice_id"], row["user_id"], row["item_id"], row["user_first_name"], row["item_name"],
                row["redrive_of"]) == (invoice, user_id, item_id, f"First{user_id}", f"item{item_id}", redrive)
    for row in found["dead_letter"]:
        assert row["error"] and len(row["error"].splitlines()) == 1 and len(row["error"]) <= 500, row["error"]
        kind = _kind_of(row["source_topic"], topics)
        sent_key = outbox[kind][ids[kind].index(row["source_message_id"])][0]
        assert row["key"] == key_as_read(sent_key)  # a UTF-8 key exactly as sent
    assert job.thread.is_alive() and not read_events(data_dir, ("restart", "job_failed"))


@hsettings(max_examples=20, deadline=None, database=None)
@given(sent=st.lists(st.tuples(keys, properties), min_size=1, max_size=10))
def test_the_reader_takes_any_key_and_properties_from_a_real_broker(broker, sent):
    """pulsar-client 3.13 raises UnicodeDecodeError from partition_key() and properties() on
    bytes that are not UTF-8; read_key_and_properties reads them as the pure tier's FakeMessage
    (a model of that client) says, so the fast tier tests what a read task really gets."""
    topic = f"persistent://public/default/fuzz-keys-{next(_examples)}-{id(sent)}"
    send_raw(broker.service_url, topic, [(key, b"{}", props, None) for key, props in sent])
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        received = [reader.read_next(10_000) for _ in sent]
    finally:
        client.close()
    for message, (key, props) in zip(received, sent):
        assert read_key_and_properties(message) == read_key_and_properties(FakeMessage(key, props or {}))
        if key:
            assert read_key_and_properties(message)[0] == key_as_read(key)
