"""The column-wise parse step against its specification, rules.route_messages (pure tier).

parse.decide_batch reads most payloads with Arrow's JSON reader and sends the rest message by
message through route_messages; whatever the bytes, every row must come out exactly as
route_messages decides it (values, dead-letter errors, order), and the envelope schema exact.
"""

from __future__ import annotations

import math

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline import wire
from pipeline.enrich import parse, rules
from pipeline.source.rows import arrow_schema
from factories import item, order, user
from test_fuzz_wire import clean_text, dumps, keys, payloads, to_bytes, typed_records

TOPICS = ("users", "items", "orders")
CLEAN = {"users": lambda n: user(n), "items": lambda n: item(n), "orders": lambda n: order(n, n % 7, n % 5)}


def source_batch(kind: str, keys_: list, values: list) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "kind": [kind] * n, "topic": [f"persistent://public/default/{kind}"] * n, "partition": [-1] * n,
        "message_id": [f"0:{i}:-1:-1" for i in range(n)], "position": list(range(n)), "generation": [0] * n,
        "key": keys_, "value": values, "publish_time": [1_700_000_000_000_000] * n, "properties": [None] * n,
        "event_time": [None] * n, "time_error": [None] * n, "watermark_bound": [None] * n,
    }, schema=arrow_schema())


def assert_same_as_the_spec(kind: str, keys_: list, values: list) -> pa.RecordBatch:
    decided = parse.decide_batch(source_batch(kind, keys_, values))
    expected = rules.route_messages([kind] * len(values), keys_, values)
    assert decided.schema == parse.DECIDED_SCHEMA
    got = decided.to_pydict()
    for name in parse.DECIDED_SCHEMA.names:
        for i, (a, b) in enumerate(zip(got[name], expected[name])):
            same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
            assert same and type(a) is type(b) or (a == b and isinstance(a, (int, float))), \
                f"row {i} column {name}: parse gave {a!r}, route_messages {b!r} for {values[i][:120]!r}"
    return decided


def key_text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "backslashreplace") or None


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(TOPICS), data=st.data())
def test_fuzzed_batches_decide_exactly_as_route_messages(kind, data):
    rows = data.draw(st.lists(st.tuples(keys, st.one_of(payloads(kind), typed_records(kind, clean_text).map(
        lambda r: to_bytes(dumps(r, False))))), min_size=1, max_size=40))
    assert_same_as_the_spec(kind, [key_text(k) for k, _ in rows], [v for _, v in rows])


@example(kind="orders", poison=[3, 17, 18, 40])
@settings(max_examples=30, deadline=None, database=None)
@given(kind=st.sampled_from(TOPICS), poison=st.lists(st.integers(min_value=0, max_value=63), max_size=6))
def test_poison_among_clean_payloads_is_found_and_the_rest_read_column_wise(kind, poison):
    values = [wire.encode(CLEAN[kind](n)) for n in range(64)]
    bad = [b'{"id":"x","invoiceId":"x"}', b"{", b'{"price":1e400}', b'{"id":5.5}', b'{"createdAt":9223372036854775807}',
           b'{"id":1}{"id":2}', b"\xff"]
    for i, at in enumerate(poison):
        values[at] = bad[i % len(bad)]
    decided = assert_same_as_the_spec(kind, [str(n) for n in range(64)], values)
    dead = {i for i, op in enumerate(decided.column("op").to_pylist()) if op == "dead"}
    assert dead == set(poison)


def test_clean_payloads_take_the_column_wise_path(monkeypatch):
    values = [wire.encode(order(n, n % 7, n % 5)) for n in range(1000)]
    monkeypatch.setattr(rules, "route_messages", lambda *_: (_ for _ in ()).throw(AssertionError("went row by row")))
    decided = parse.decide_batch(source_batch("orders", [str(n) for n in range(1000)], values))
    assert decided.column("invoice_id").to_pylist() == list(range(1000))
    assert set(decided.column("op").to_pylist()) == {"order"}


def test_parse_batches_yields_the_envelope_schema_exactly():
    values = [wire.encode(user(1)), b"", b"{"]
    (out,) = parse.parse_batches(iter([source_batch("users", ["1", "2", None], values)]))
    assert out.schema == parse.ENVELOPE_ARROW_SCHEMA
    assert out.column("op").to_pylist() == ["upsert", "delete", "dead"]
    assert out.column("error").to_pylist()[2].startswith("payload is not valid JSON")
