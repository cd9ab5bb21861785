"""The SQL parse step column-wise (pipeline/sql/columnar.py) against its specification,
envelope.parse_rows, message by message (pure tier): whatever the bytes, keys and publish times,
every row comes out exactly as the specification decides it (values, dead-letter errors, order).
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline.source.rows import arrow_schema
from pipeline.sql import envelope
from pipeline.sql.columnar import decode_batch
from pipeline.sql.plan import build_plan

WITH = ("WITH ('connector' = 'upsert-pulsar', 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', "
        "'value.format' = 'json')")
SQL = ("CREATE TABLE users (uid STRING, accountId INT, score DOUBLE, visits BIGINT, active BOOLEAN, note STRING, "
       "PRIMARY KEY (uid) NOT ENFORCED) " + WITH.format(name="users") + ";\n"
       "CREATE TABLE out (uid STRING, accountId INT, score DOUBLE, visits BIGINT, active BOOLEAN, "
       "PRIMARY KEY (uid) NOT ENFORCED) " + WITH.format(name="out") + ";\n"
       "INSERT INTO out SELECT uid, accountId, score, visits, active FROM users;")
PLAN = build_plan(SQL)
SPECS, SCHEMA = envelope.table_specs(PLAN), envelope.arrow_schema(envelope.envelope_fields(PLAN))
MAX_MICROS = 253_402_300_799_999_999  # 9999-12-31 23:59:59.999999 UTC
MIN_MICROS = -62_135_596_800_000_000  # 0001-01-01 UTC


def source_batch(keys: list, values: list, published: list[int] | None = None) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "kind": ["users"] * n, "topic": ["persistent://public/default/users"] * n, "partition": [-1] * n,
        "message_id": [f"0:{i}:-1:-1" for i in range(n)], "position": list(range(n)), "generation": [0] * n,
        "key": keys, "value": values, "publish_time": published or [1_700_000_000_123_456] * n,
        "properties": [None] * n, "event_time": [None] * n, "time_error": [None] * n, "watermark_bound": [None] * n,
    }, schema=arrow_schema())


def assert_same_as_the_spec(batch: pa.RecordBatch) -> pa.RecordBatch:
    got = decode_batch(batch, SPECS, SCHEMA)
    expected = envelope.parse_rows(batch, SPECS, SCHEMA)
    assert got.schema == SCHEMA
    for name in SCHEMA.names:
        for i, (a, b) in enumerate(zip(got.column(name).to_pylist(), expected.column(name).to_pylist())):
            same = a == b and type(a) is type(b) or (isinstance(a, float) and isinstance(b, float)
                                                    and math.isnan(a) and math.isnan(b))
            assert same, f"row {i} column {name}: columnar {a!r}, spec {b!r} for {batch.column('value')[i].as_py()!r}"
    return got


values = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**31, max_value=2**31 - 1),
                   st.integers(min_value=-2**63, max_value=2**63 - 1), st.floats(), st.text(max_size=12),
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
COLUMNS = ("uid", "accountId", "score", "visits", "active", "note", "other")


def record_bytes(record: dict, duplicate: bool) -> bytes:
    text = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    if duplicate and len(record) > 1:
        text = text[:-1] + "," + text[1:]  # every field given twice
    return text.encode("utf-8", "surrogatepass")


payloads = st.one_of(
    st.builds(record_bytes, st.dictionaries(st.sampled_from(COLUMNS), values, max_size=6), st.booleans()),
    st.builds(record_bytes, st.fixed_dictionaries({"uid": st.text(max_size=8), "accountId": st.integers(-2**31, 2**31 - 1),
                                                   "score": st.floats(allow_nan=False, allow_infinity=False),
                                                   "visits": st.integers(-2**63, 2**63 - 1), "active": st.booleans()}),
              st.just(False)),
    st.sampled_from([b"", b"{", b"[]", b"{}", b"null", b"\xff\xfe", b'{"score":1e400}', b'{"score":NaN}',
                     b'{"visits":12345678901234567890}', b'{"score":12345678901234567890}', b'{"uid":"\\ud800"}',
                     b'{"accountId":5.0}', b'{"note":"a\\"b\\\\c\\n"}', b'{"x":{"y":[1]}}']),
    st.binary(max_size=20))


@example(rows=[("k", b'{"score":12345678901234567890}', 0), (None, b"{}", -1), ("k", b"", MIN_MICROS)])
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.text(max_size=5)), payloads,
                               st.integers(min_value=MIN_MICROS, max_value=MAX_MICROS)), min_size=1, max_size=40))
def test_fuzzed_batches_come_out_as_the_specification_gives(rows):
    assert_same_as_the_spec(source_batch([k for k, _, _ in rows], [v for _, v, _ in rows], [t for _, _, t in rows]))


def test_clean_payloads_take_the_column_wise_path(monkeypatch):
    values = [json.dumps({"uid": f"u{n}", "accountId": n, "score": n / 4, "visits": n * 2**40, "active": n % 2 == 0,
                          "note": "x"}).encode() for n in range(1000)] + [b""]
    monkeypatch.setattr(envelope, "parse_rows", lambda *_: pytest.fail("went message by message"))
    out = decode_batch(source_batch([f"u{n}" for n in range(1001)], values), SPECS, SCHEMA)
    assert out.column("s0_accountId").to_pylist() == [*range(1000), None]
    assert out.column("op").to_pylist() == ["upsert"] * 1000 + ["delete"]
    assert out.column("published_ms").to_pylist() == [1_700_000_000_123] * 1001


def test_poison_among_clean_payloads_is_found_and_the_rest_read_column_wise():
    values = [json.dumps({"uid": f"u{n}", "accountId": n}).encode() for n in range(64)]
    for at, bad in zip((3, 17, 18, 40), (b'{"accountId":"3"}', b'{"accountId":3000000000}', b'{"active":1}', b"{")):
        values[at] = bad
    out = assert_same_as_the_spec(source_batch([f"u{n}" for n in range(64)], values))
    assert [i for i, op in enumerate(out.column("op").to_pylist()) if op == "dead"] == [3, 17, 18, 40]
    assert out.column("error")[17].as_py() == "table 'users' column 'accountId': expected INT, got number 3000000000"
