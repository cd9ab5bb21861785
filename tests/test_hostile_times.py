"""Hostile times (issue 25, item 4): no message time fails a batch, and no order waits forever.

Pulsar's message event and publish times are unsigned 64-bit: a producer may send an event time
of 2**63 or 2**64-1 (a Java producer's -1). The source keeps a time it cannot hold as None and
says why in ``time_error``; in processing time such a message goes on as any other, in event
time (where its message time is what times it) it is a dead letter naming the time. An order
further ahead of the changelogs than ``enrichment.future_horizon`` (a createdAt in the year 9999)
is missing with reason ``future`` instead of waiting forever.

Pure tests of the source's columns, the parse step against route_messages and the event-time
model first; then the real job on the real broker, in processing time and in event time (an
order's time its createdAt, or its message event time).
"""

from __future__ import annotations

import re
from collections import Counter

import pyarrow as pa
import pytest

from pipeline import wire
from pipeline.config import load_settings
from pipeline.enrich import event_rules, parse, rules
from pipeline.enrich.lookups import LOOKUPS, USERS
from pipeline.errors import ConfigError
from pipeline.metrics import read_events, read_rows
from pipeline.source import rows as source_rows
from factories import item, order, publish_timed, user
from jobproc import JobThread
from sinkread import count, rows
from waiting import wait_for

T0 = 1_700_000_000_000
HOSTILE = (2**63, 2**64 - 1)
YEAR_9999 = 253_370_764_800_000  # 9999-01-01T00:00:00Z: a valid createdAt, and a valid event time
HORIZON_MS = 3_600_000  # enrichment.future_horizon's default


def outside(name: str, value: int) -> str:
    return (f"message {name} {value} is outside the times the job can hold (epoch milliseconds up to "
            f"{wire.MAX_TIME_MS}, the end of the year 9999)")


# ------------------------------------------------------------------------------ the source


def source_block(times: list[tuple[int, int]]) -> pa.RecordBatch:
    """A read task's Arrow batch of users messages with these (publish time, event time) pairs."""
    block = source_rows.MessageColumns()
    for n, (published, event_time) in enumerate(times):
        block.ledgers.append(1), block.entries.append(n), block.batches.append(-1), block.entry_ns.append(n)
        block.keys.append(str(n)), block.values.append(wire.encode(user(n))), block.properties.append(None)
        block.published.append(published), block.event_times.append(event_time)
    return block.to_arrow("users", "persistent://public/default/users", -1, 0)


def test_the_source_holds_every_time_or_says_why_not():
    batch = source_block([(T0, 0), (T0, T0 + 1), (T0, wire.MAX_TIME_MS), (T0, wire.MAX_TIME_MS + 1),
                          (T0, HOSTILE[0]), (HOSTILE[1], HOSTILE[1]), (HOSTILE[0], T0)])
    assert batch.schema == source_rows.arrow_schema()
    assert source_rows.SPARK_SCHEMA_NAMES == batch.schema.names
    assert batch.column("event_time").to_pylist() == [None, T0 + 1, wire.MAX_TIME_MS, None, None, None, T0]
    assert [None if t is None else int(t.timestamp() * 1000) for t in batch.column("publish_time").to_pylist()] == \
        [T0] * 5 + [None, None]
    assert batch.column("time_error").to_pylist() == [
        None, None, None, outside("event_time", wire.MAX_TIME_MS + 1), outside("event_time", HOSTILE[0]),
        f"{outside('event_time', HOSTILE[1])}; {outside('publish_time', HOSTILE[1])}",
        outside("publish_time", HOSTILE[0])]


def test_a_block_with_every_time_held_has_no_time_errors():
    batch = source_block([(T0, 0), (T0, T0)])
    assert batch.column("time_error").null_count == 2


# ------------------------------------------------------------------------- the parse step


def decided_as_the_spec(batch: pa.RecordBatch, timed: tuple[str, ...]) -> dict[str, list]:
    """The parse step's decided columns, which must be route_messages's for the same messages."""
    decided = parse.decide_batch(batch, timed).to_pydict()
    problems = [error if at is None else None for error, at in
                zip(batch.column("time_error").to_pylist(), batch.column("event_time").to_pylist())]
    expected = rules.route_messages(batch.column("kind").to_pylist(), batch.column("key").to_pylist(),
                                    batch.column("value").to_pylist(), problems, timed)
    assert decided == expected
    return decided


@pytest.mark.parametrize("order_time", ["created_at", "event_time"])
def test_event_time_makes_a_message_its_time_cannot_place_a_dead_letter(order_time):
    timed = rules.timed_by_message(order_time)
    # event time bad; good; no event time and the publish time bad; a good event time before a bad publish time
    times = [(T0, HOSTILE[1]), (T0, T0), (HOSTILE[0], 0), (HOSTILE[0], T0)]
    changes = source_block(times)
    decided = decided_as_the_spec(changes, timed)
    assert decided["op"] == ["dead", "upsert", "dead", "upsert"]
    assert decided["error"][0] == outside("event_time", HOSTILE[1])
    assert decided["error"][2] == outside("publish_time", HOSTILE[0])
    assert decided["user_id"] == [0, 1, 0, 3] and decided["payload"][0] == wire.encode(user(0)).decode()
    values = [wire.encode(order(n, 1, 1)) for n in range(4)]
    orders = changes.set_column(changes.schema.get_field_index("kind"), "kind", pa.array(["orders"] * 4)) \
                    .set_column(changes.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    ops = decided_as_the_spec(orders, timed)["op"]
    # an order is timed by its createdAt unless order_time = event_time
    assert ops == (["dead", "order", "dead", "order"] if order_time == "event_time" else ["order"] * 4)


def test_processing_time_decides_such_a_message_as_any_other():
    batch = source_block([(T0, HOSTILE[0]), (HOSTILE[1], HOSTILE[1]), (T0, 0)])
    assert decided_as_the_spec(batch, ())["op"] == ["upsert"] * 3
    (envelope,) = parse.parse_batches(iter([batch]))
    assert envelope.schema == parse.ENVELOPE_ARROW_SCHEMA
    assert envelope.column("event_time").to_pylist() == [None, None, None]
    assert envelope.column("published_at").to_pylist() == [T0, None, T0]


def test_a_bad_payload_names_its_own_error_first():
    batch = source_block([(T0, HOSTILE[0])])
    bad = batch.set_column(batch.schema.get_field_index("value"), "value", pa.array([b"{"], pa.binary()))
    (error,) = decided_as_the_spec(bad, rules.timed_by_message("created_at"))["error"]
    assert error.startswith("payload is not valid JSON")


def test_the_transform_arguments_reach_the_parse_step():
    batch = source_block([(T0, HOSTILE[0])])
    (envelope,) = parse.parse_batches(iter([batch]), timed_by_message=["users", "items"])
    assert envelope.column("op").to_pylist() == ["dead"]
    assert envelope.column("error").to_pylist() == [outside("event_time", HOSTILE[0])]


# --------------------------------------------------------------------- the future horizon


@pytest.mark.parametrize("at,watermark,future", [
    (T0, T0, False), (T0 + 2_000 + HORIZON_MS, T0, False), (T0 + 2_001 + HORIZON_MS, T0, True),
    (YEAR_9999, T0, True), (YEAR_9999, 0, False),  # at 0 no changelog has a time yet: the order waits
])
def test_is_future(at, watermark, future):
    assert event_rules.is_future(at, watermark, event_rules.future_after(2_000, HORIZON_MS)) is future
    assert event_rules.is_future(at, watermark, None) is False


def test_order_flag():
    after = event_rules.future_after(0, 1_000)
    assert event_rules.order_flag(T0 - 6_000, T0, 5_000, after) == event_rules.LATE_FLAG
    assert event_rules.order_flag(T0 + 1_001, T0, 5_000, after) == event_rules.FUTURE_FLAG
    assert event_rules.order_flag(T0 + 1_000, T0, 5_000, after) == event_rules.ON_TIME_FLAG


def order_envelope(invoice: int, at: int) -> dict:
    routed = rules.route_message("orders", f"o{invoice}", wire.encode(order(invoice, 1, 1, createdAt=at)))
    return {**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": "orders", "source_partition": -1, "position": invoice,
            **routed, "event_ms": at}


def version_envelope(lookup, key: int, at: int, position: int) -> dict:
    payload = wire.encode(user(key) if lookup is USERS else item(key))
    routed = rules.route_message(lookup.changelog, str(key), payload)
    return {**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": lookup.changelog, "source_partition": -1,
            "position": position, **routed, "event_ms": at}


def test_an_order_of_the_year_9999_is_future_not_waiting_forever():
    model = event_rules.EventEnrichmentModel(2_000, 3_600_000, event_rules.future_after(2_000, HORIZON_MS))
    versions = [version_envelope(lookup, 1, T0, 1) for lookup in LOOKUPS]
    # read before any changelog has a time (watermark 0): both wait
    assert model.process([*versions, order_envelope(1, T0 + 1_000), order_envelope(2, YEAR_9999)], 0) == []
    # the first watermark above 0 judges them: the one of the year 9999 is future at once
    (future,) = model.process([], T0)
    assert (future["invoice_id"], rules.sink_of(future), future["waited_ms"]) == (2, ("missing_state", "future"), 0)
    # one read later is future at first sight; the other is decided once the watermark passes it
    (later,) = model.process([order_envelope(3, YEAR_9999)], T0)
    assert rules.sink_of(later) == ("missing_state", "future") and later["late"] == event_rules.FUTURE_FLAG
    (found,) = model.process([], T0 + 1_001)
    assert found["invoice_id"] == 1 and rules.sink_of(found) == ("enriched", None)
    assert model.waiting() == 0


def test_future_is_a_missing_reason_in_both_sink_functions():
    row = {**dict.fromkeys(rules.ENVELOPE_FIELDS), "op": "order", "user_state": rules.FUTURE,
           "item_state": rules.FUTURE}
    assert rules.sink_of(row) == ("missing_state", "future")
    table = rules.with_sinks(pa.Table.from_pylist([row, {**row, "user_state": "found", "item_state": "found"}]))
    assert table["reason"].to_pylist() == ["future", None]


def test_future_is_listed_wherever_the_missing_reasons_are(tmp_path):
    from app import charts, missing_words
    from pipeline import cli, control
    from pipeline.enrich.lookups import MISSING_REASONS

    assert MISSING_REASONS == ("user", "item", "user_and_item", "late", "future")
    assert set(charts.REASON_COLOURS) == set(MISSING_REASONS)
    assert missing_words.describe_missing_reason("future", 1, 2, 0).startswith("future: further past")
    args = cli.build_parser().parse_args(["redrive", "--reason", "future"])
    assert args.reason == "future"
    settings = load_settings(env={}, cli={"paths.data_dir": str(tmp_path)})
    with pytest.raises(control.ControlError, match=re.escape("reason 'soon' is not one of user, item, user_and_item, "
                                                             "late, future")):
        control.redrive(settings, reason="soon")


def test_the_future_horizon_setting(tmp_path):
    settings = load_settings(env={}, cli={"paths.data_dir": str(tmp_path)})
    assert settings["enrichment.future_horizon"] == 3600.0
    assert load_settings(env={"SS_ENRICHMENT_FUTURE_HORIZON": "90m"}, cli={"paths.data_dir": str(tmp_path)})[
        "enrichment.future_horizon"] == 5400.0
    expected = "setting 'enrichment.future_horizon' = 'soon' (from command line) is not valid: expected a duration"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_settings(env={}, cli={"paths.data_dir": str(tmp_path), "enrichment.future_horizon": "soon"})


# ------------------------------------------------------------------ the real job and broker


def the_input() -> dict[str, list[tuple[str, bytes, int]]]:
    """(key, payload, event time) per topic: users and items 1-3 in time, 4 and 5 at hostile
    event times, a tombstone of user 6 at one, and version 99 at T0 + 60 s (it carries the
    watermark past every order); orders in time, for user 4 and item 5, at hostile event
    times, and one of the year 9999 (its createdAt and its event time)."""
    def changelog(make):
        return ([(str(n), wire.encode(make(n)), T0 + n * 1_000) for n in (1, 2, 3)]
                + [(str(n), wire.encode(make(n)), at) for n, at in zip((4, 5), HOSTILE)]
                + [("99", wire.encode(make(99)), T0 + 60_000)])
    orders = [(n, (n % 3) + 1, (n % 3) + 1, T0 + 5_000 + n * 1_000, None) for n in range(6)]
    orders += [(6, 4, 1, T0 + 12_000, None), (7, 1, 5, T0 + 12_000, None)]
    orders += [(8, 1, 1, T0 + 13_000, HOSTILE[0]), (9, 2, 2, T0 + 13_000, HOSTILE[1]), (10, 2, 2, YEAR_9999, None)]
    return {"users": changelog(user)[:5] + [("6", b"", HOSTILE[1])] + changelog(user)[5:], "items": changelog(item),
            "orders": [(f"o{n}", wire.encode(order(n, u, i, createdAt=at)), at if sent is None else sent)
                       for n, u, i, at, sent in orders]}


# invoice -> (sink, reason), and the dead letters' (topic kind, key) -> the time their error names
OUTCOMES = {
    "processing": ({n: ("enriched", None) for n in range(11)}, {}),
    "created_at": ({**{n: ("enriched", None) for n in (0, 1, 2, 3, 4, 5, 8, 9)}, 6: ("missing_state", "user"),
                    7: ("missing_state", "item"), 10: ("missing_state", "future")},
                   {("users", "4"): HOSTILE[0], ("users", "5"): HOSTILE[1], ("users", "6"): HOSTILE[1],
                    ("items", "4"): HOSTILE[0], ("items", "5"): HOSTILE[1]}),
}
OUTCOMES["event_time"] = ({n: outcome for n, outcome in OUTCOMES["created_at"][0].items() if n not in (8, 9)},
                          {**OUTCOMES["created_at"][1], ("orders", "o8"): HOSTILE[0], ("orders", "o9"): HOSTILE[1]})


@pytest.fixture(scope="module")
def hostile_topics(broker, tmp_path_factory):
    """The input, published once: every job reads it from the start on a data dir of its own."""
    tag = tmp_path_factory.mktemp("hostile").name
    topics = {kind: f"persistent://public/default/{kind}-{tag}" for kind in ("users", "items", "orders")}
    data = the_input()
    for kind in ("users", "items", "orders"):  # pulsar-client sends any unsigned 64-bit event time
        publish_timed(broker.service_url, topics[kind], data[kind])
    return topics


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["processing", "created_at", "event_time"])
def test_the_job_stays_up_and_gives_every_message_its_one_row(mode, hostile_topics, broker, tmp_path):
    decided, dead = OUTCOMES[mode]
    timing = {} if mode == "processing" else {
        "enrichment.time": "event", "enrichment.order_time": mode, "enrichment.out_of_orderness": "2s",
        "enrichment.idle_timeout": "10m"}  # no changelog goes idle: only version 99 moves the watermark
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path / "data"), "spark.master": "local[2]",
        "job.trigger_interval": "200ms", "job.restart.delay": "1s", "enrichment.max_wait": "2s", **timing,
        **{f"topics.{kind}": topic for kind, topic in hostile_topics.items()}})
    data_dir = settings.data_dir
    job = JobThread(settings)
    try:
        wait_for(lambda: count(data_dir, "enriched") + count(data_dir, "missing_state") >= len(decided)
                 and count(data_dir, "dead_letter") >= len(dead) or job.error, timeout=240,
                 what=f"every message of the {mode} job in its row")
        assert job.error is None and job.thread.is_alive()
        assert read_events(data_dir, ("restart", "job_failed")) == []
    finally:
        job.close()
    written = Counter((row["invoice_id"], sink, row["reason"] if sink == "missing_state" else None)
                      for sink in ("enriched", "missing_state") for row in rows(data_dir, sink))
    assert written == Counter((invoice, *outcome) for invoice, outcome in decided.items())
    letters = [(row["source_topic"].rsplit("/", 1)[1].split("-")[0], row["key"], row["error"])
               for row in rows(data_dir, "dead_letter")]
    assert Counter((kind, key) for kind, key, _ in letters) == Counter(dead.keys())
    assert all(error == outside("event_time", dead[kind, key]) for kind, key, error in letters)
    if mode == "processing":  # the users of hostile times are state like any other
        assert {(row["invoice_id"], row["user_first_name"]) for row in rows(data_dir, "enriched")
                if row["invoice_id"] in (6, 8, 10)} == {(6, "First4"), (8, "First1"), (10, "First2")}


@pytest.mark.e2e
def test_an_order_of_the_year_9999_read_while_the_changelogs_are_idle_leaves_the_watermark(broker, tmp_path):
    """Idle changelogs let every row's time carry the watermark; an order of the year 9999 would
    carry it there for good, and every order after it would be late. It counts for no watermark
    (its time is more than the horizon past its publish time): it is future, and the next orders
    are decided as any other."""
    topics = {kind: f"persistent://public/default/{kind}-idle-{tmp_path.name}" for kind in ("users", "items", "orders")}
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(tmp_path / "data"), "spark.master": "local[2]",
        "job.trigger_interval": "200ms", "enrichment.time": "event", "enrichment.max_wait": "2s",
        "enrichment.out_of_orderness": "2s", "enrichment.idle_timeout": "2s",
        **{f"topics.{kind}": topic for kind, topic in topics.items()}})
    url, data_dir = broker.service_url, settings.data_dir

    def orders(*timed: tuple[int, int]) -> list[tuple[str, bytes, int]]:
        return [(f"o{n}", wire.encode(order(n, 1, 1, createdAt=at)), T0 + n * 1_000) for n, at in timed]

    publish_timed(url, topics["users"], [("1", wire.encode(user(1)), T0 + 1_000)])
    publish_timed(url, topics["items"], [("1", wire.encode(item(1)), T0 + 500)])
    publish_timed(url, topics["orders"], orders((1, T0 + 10_000)))
    job = JobThread(settings)
    try:
        wait_for(lambda: {e["details"]["topic"] for e in read_events(data_dir, ("topic_idle",))} >= {"users", "items"}
                 or job.error, timeout=240, what="both changelogs to go idle")
        publish_timed(url, topics["orders"], orders((2, YEAR_9999)))
        wait_for(lambda: count(data_dir, "missing_state") or job.error, timeout=60, what="the order of the year 9999")
        # 4 carries the watermark past 3
        publish_timed(url, topics["orders"], orders((3, T0 + 20_000), (4, T0 + 30_000)))
        wait_for(lambda: count(data_dir, "enriched") >= 2 or job.error, timeout=60, what="orders 1 and 3")
    finally:
        job.close()
    decided = {row["invoice_id"]: (sink, row.get("reason")) for sink in ("enriched", "missing_state")
               for row in rows(data_dir, sink)}
    assert decided == {1: ("enriched", None), 2: ("missing_state", "future"), 3: ("enriched", None)}
    assert max(row["watermark_ms"] for row in read_rows(data_dir, "watermarks")) < T0 + 30_000
