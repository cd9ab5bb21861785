"""Event-time rules (no Spark): the version current at a time, when an order is due, lateness,
pruning, and the property the job relies on: however a stream is cut into batches, the
event-time lookups decide every order as the batch-free temporal join does."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from pipeline import wire
from pipeline.enrich import event_rules, rules
from pipeline.enrich.lookups import ITEMS, LOOKUPS, USERS
from factories import item, order, user

A, B, C = ("a",), ("b",), ("c",)


@pytest.mark.parametrize("versions,at,max_wait,expected", [
    ([], 10, 0, (None, None, 0)),
    ([(5, (0, 1), A)], 10, 0, (A, 5, 0)),
    ([(5, (0, 1), A)], 5, 0, (A, 5, 0)),  # a version of the order's own time is current
    ([(5, (0, 1), A)], 4, 0, (None, None, 0)),
    ([(5, (0, 1), A)], 4, 3, (A, 5, 1)),  # it comes within max_wait: found, waited 1
    ([(5, (0, 1), A)], 1, 3, (None, None, 3)),
    ([(5, (0, 1), A), (5, (0, 2), B)], 5, 0, (B, 5, 0)),  # one time: the later read wins
    ([(5, (0, 2), B), (5, (0, 1), A)], 9, 0, (B, 5, 0)),
    ([(5, (0, 1), A), (8, (0, 2), None)], 9, 0, (None, None, 0)),  # deleted at 8
    ([(5, (0, 1), A), (8, (0, 2), None), (10, (0, 3), C)], 9, 5, (C, 10, 1)),
    ([(5, (0, 1), A), (8, (0, 2), None)], 7, 0, (A, 5, 0)),  # as of 7 it was not deleted yet
])
def test_version_at(versions, at, max_wait, expected):
    assert event_rules.version_at(versions, at, max_wait) == expected


@pytest.mark.parametrize("at,watermark,found,max_wait,due", [
    (10, 10, True, 0, False), (10, 11, True, 0, True), (10, 11, False, 5, False), (10, 15, False, 5, False),
    (10, 16, False, 5, True), (10, 11, False, 0, True)])
def test_decision_due(at, watermark, found, max_wait, due):
    assert event_rules.decision_due(at, watermark, found, max_wait) is due


def test_watermark_is_the_least_changelog_and_waits_for_an_empty_one():
    assert event_rules.combined_watermark({"users": 10_000, "items": 7_000}, 2_000) == 5_000
    assert event_rules.combined_watermark({"users": 10_000, "items": None}, 2_000) == 0


def test_late_and_pruning():
    assert event_rules.is_late(1_000, 10_000, 8_000) and not event_rules.is_late(2_000, 10_000, 8_000)
    history = [(1, (0, 1), A), (2, (0, 2), B), (9, (0, 3), C)]
    assert event_rules.prune_versions(history, 5) == [(2, (0, 2), B), (9, (0, 3), C)]  # B still current at 5
    assert event_rules.prune_versions([(1, (0, 1), A), (2, (0, 2), None), (9, (0, 3), C)], 5) == [(9, (0, 3), C)]
    assert event_rules.prune_versions(history, 0) == history
    assert event_rules.prune_horizon(100_000, 10_000, 5_000) == 85_000


def test_a_late_order_goes_to_missing_state_with_reason_late():
    row = {**dict.fromkeys(rules.ENVELOPE_FIELDS), "op": "order", "user_state": event_rules.LATE, "item_state": event_rules.LATE}
    assert rules.sink_of(row) == ("missing_state", "late")
    table = rules.with_sinks(pa.Table.from_pylist([row, {**row, "user_state": "found", "item_state": "missing"}]))
    assert table["reason"].to_pylist() == ["late", "item"]


# ------------------------------------------------------------ batch independence (the model)
T0 = 1_700_000_000_000
BOUND, MAX_WAIT = 2_000, 3_000


def timed_stream(draw_times, kind, keys, values):
    return [(kind, key, value, at) for (key, value), at in zip(zip(keys, values), draw_times)]


@st.composite
def streams(draw):
    """Per topic, messages whose event times run out of order by less than BOUND."""
    def topic(kind, n, value):
        base = sorted(draw(st.lists(st.integers(0, 40_000), min_size=n, max_size=n)))
        jitter = draw(st.lists(st.integers(0, BOUND - 1), min_size=n, max_size=n))
        keys = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        out = []
        for at, j, key in zip(base, jitter, keys):
            payload = b"" if value is not None and draw(st.integers(0, 5)) == 0 else value(key)
            out.append((kind, key, payload, T0 + at + j))
        return out
    users = topic("users", draw(st.integers(0, 8)), lambda k: wire.encode(user(k, firstName=f"N{k}")))
    items = topic("items", draw(st.integers(0, 8)), lambda k: wire.encode(item(k, price=float(k))))
    orders = [("orders", None, None, at) for at in sorted(T0 + 500 + x for x in draw(
        st.lists(st.integers(0, 40_000), min_size=1, max_size=10)))]
    cuts = {kind: draw(st.lists(st.integers(0, 4), min_size=12, max_size=12)) for kind in ("users", "items", "orders")}
    return {"users": users, "items": items, "orders": orders}, cuts


def envelope(kind, key, payload, at, position, invoice):
    if kind == "orders":
        record = order(invoice, (invoice % 3) + 1, (invoice % 4) + 1, createdAt=at)
        routed = rules.route_message("orders", f"o{invoice}", wire.encode(record))
    else:
        routed = rules.route_message(kind, str(key), payload)
    return {**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": kind, "source_partition": -1, "position": position,
            **routed, "event_ms": at}


def decided_view(row):
    return (row["invoice_id"], row["reason"], row["user_first_name"], row["item_price"],
            row["user_as_of"], row["item_as_of"], row["waited_ms"])


@settings(max_examples=60, deadline=None)
@given(streams())
def test_any_batching_decides_every_order_as_the_temporal_join(drawn):
    stream, cuts = drawn
    envelopes = {kind: [envelope(k, key, p, at, i + 1, i) for i, (k, key, p, at) in enumerate(messages)]
                 for kind, messages in stream.items()}
    model = event_rules.EventEnrichmentModel(MAX_WAIT, allowed_lateness_ms=3_600_000)
    read = {kind: 0 for kind in envelopes}
    newest: dict[str, int | None] = {"users": None, "items": None}
    out, batch = [], 0
    while any(read[k] < len(envelopes[k]) for k in envelopes):
        rows = []
        for kind in envelopes:
            take = max(1, cuts[kind][batch % len(cuts[kind])]) if batch >= len(cuts[kind]) else cuts[kind][batch]
            rows += envelopes[kind][read[kind]:read[kind] + take]
            read[kind] += take
        watermark = event_rules.combined_watermark(newest, BOUND)  # Spark's: from the batches before
        out += model.process(rows, watermark)
        for row in rows:
            if row["kind"] in newest:
                newest[row["kind"]] = max(newest[row["kind"]] or 0, row["event_ms"])
        batch += 1
    out += model.process([], T0 + 10**9)  # both changelogs far ahead: every order is due
    assert model.waiting() == 0
    versions = {lookup.changelog: {} for lookup in LOOKUPS}
    for lookup in (USERS, ITEMS):
        for row in envelopes[lookup.changelog]:
            record = tuple(row[c] for c in lookup.state_columns) if row["op"] == "upsert" else None
            versions[lookup.changelog].setdefault(row[lookup.id_column], []).append(
                (row["event_ms"], (-1, row["position"]), record))
    want = sorted(decided_view(r) for r in event_rules.temporal_join(versions, envelopes["orders"], MAX_WAIT))
    assert sorted(decided_view(r) for r in out) == want


@settings(max_examples=30, deadline=None)
@given(streams())
def test_late_orders_are_counted_never_dropped(drawn):
    stream, _ = drawn
    model = event_rules.EventEnrichmentModel(MAX_WAIT, allowed_lateness_ms=1_000)
    rows = [envelope(k, key, p, at, i + 1, i) for i, (k, key, p, at) in enumerate(stream["orders"])]
    out = model.process(rows, T0 + 20_000) + model.process([], T0 + 10**9)
    assert sorted(r["invoice_id"] for r in out) == sorted(r["invoice_id"] for r in rows)
    late = {r["invoice_id"] for r in out if r["reason"] == "late"}
    assert late == {r["invoice_id"] for r in rows if r["event_ms"] < T0 + 19_000}


# ------------------------------------------------------------ replays and late versions
def version_row(lookup, key, at, position, first_name=None):
    payload = b"" if first_name is None else wire.encode(user(key, firstName=first_name))
    return {**envelope(lookup.changelog, key, payload, at, position, 0), "late": None}


def test_a_version_held_already_is_not_added_again():
    assert event_rules.holds([(5, (0, 1), A)], (5, (0, 9), A))
    assert not event_rules.holds([(5, (0, 1), A)], (5, (0, 9), B)) and not event_rules.holds([(5, (0, 1), A)], (6, (0, 9), A))
    # one time, one record: counted once, as first read (a replay's copy comes with a later read order)
    assert event_rules.version_at([(5, (0, 1), A), (5, (0, 2), None), (5, (9, 9), A)], 9, 0) == (None, None, 0)
    model = event_rules.VersionedLookupModel(USERS, MAX_WAIT, allowed_lateness_ms=3_600_000)
    first = [version_row(USERS, 7, T0 + 1_000, 1, "Ann"), version_row(USERS, 7, T0 + 2_000, 2, None),
             version_row(USERS, 7, T0 + 3_000, 3, "Bo")]
    model.process(first, T0)
    model.process([{**row, "position": row["position"] + 100} for row in first], T0)  # a replay re-reads them
    assert [(at, record) for at, _, record in model.versions[7]] == [
        (T0 + 1_000, ("Ann", "Last7", "u7@example.com", 1_600_000_000_007)), (T0 + 2_000, None),
        (T0 + 3_000, ("Bo", "Last7", "u7@example.com", 1_600_000_000_007))]


def test_a_late_version_is_stored_and_counted_once():
    model = event_rules.VersionedLookupModel(USERS, max_wait_ms=0, allowed_lateness_ms=1_000)
    watermark = T0 + 10_000
    model.process([version_row(USERS, 7, T0 + 8_500, 1, "Ann"), version_row(USERS, 7, T0 + 9_500, 2, "Bo")], watermark)
    assert model.late_versions == 1  # 8.5 s < watermark - lateness = 9 s; 9.5 s is not late
    model.process([version_row(USERS, 7, T0 + 8_500, 3, "Ann")], watermark)  # the same version again
    assert model.late_versions == 1 and len(model.versions[7]) == 2
    # stored: an order at 9 s (not late) still to come is enriched with it
    order_row = {**envelope("orders", None, None, T0 + 9_000, 1, 70), "late": None}
    [decided] = model.process([{**order_row, "user_id": 7}], watermark)
    assert (decided["user_first_name"], decided["user_as_of"]) == ("Ann", T0 + 8_500)


def test_a_late_order_is_joined_with_the_versions_held_when_asked_as_flinks_temporal_join():
    """``join_late`` (the SQL temporal join): a late order is decided at once with what the key
    holds; one older than the version kept at the pruning horizon finds none."""
    versions = [version_row(USERS, 7, T0 + 1_000, 1, "Ann"), version_row(USERS, 7, T0 + 5_000, 2, "Bo")]
    late_orders = [{**envelope("orders", None, None, T0 + at, 1, n), "late": None, "user_id": 7}
                   for n, at in ((71, 7_000), (72, 2_000))]
    decided = {}
    for join_late in (True, False):
        model = event_rules.VersionedLookupModel(USERS, max_wait_ms=0, allowed_lateness_ms=0, join_late=join_late)
        model.process(versions, T0)
        model.process([], T0 + 11_000)  # Ann is pruned: Bo is current at the horizon
        decided[join_late] = [(row["late"], row["user_state"], row["user_first_name"], row["user_as_of"])
                              for row in model.process(late_orders, T0 + 11_000)]
    assert decided[True] == [(1, "found", "Bo", T0 + 5_000), (1, "missing", None, None)]
    assert decided[False] == [(1, "late", None, None)] * 2
