"""Pure enrichment rules: outcomes, reasons, buffering, routing (no Spark)."""

import pyarrow as pa
import pytest

from pipeline import wire
from pipeline.enrich import rules
from pipeline.enrich.lookups import USERS
from factories import item, order, user


@pytest.mark.parametrize("found,waited,max_wait,expected", [
    (True, 0, 10_000, "found"), (False, 0, 10_000, "wait"), (False, 9_999, 10_000, "wait"),
    (False, 10_000, 10_000, "missing"), (False, 0, 0, "missing"), (True, 50_000, 10_000, "found"),
])
def test_lookup_outcome(found, waited, max_wait, expected):
    assert rules.lookup_outcome(found, waited, max_wait) == expected


@pytest.mark.parametrize("user_found,item_found,reason", [
    (True, True, None), (False, True, "user"), (True, False, "item"), (False, False, "user_and_item")])
def test_missing_reason_checks_both(user_found, item_found, reason):
    assert rules.missing_reason(user_found, item_found) == reason


def test_route_order_user_item_and_tombstone():
    env = rules.route_message("orders", "1", wire.encode(order(1, 17, 4)))
    assert (env["op"], env["user_id"], env["item_id"]) == ("order", 17, 4)
    assert (env["invoice_id"], env["order_item_name"]) == (1, order(1, 17, 4)["itemName"])
    env = rules.route_message("users", "17", wire.encode(user(17)))
    assert (env["op"], env["user_id"]) == ("upsert", 17)
    assert env["user_first_name"] == user(17)["firstName"] and env["item_id"] == 0
    env = rules.route_message("items", "4", b"")
    assert (env["op"], env["item_id"]) == ("delete", 4)


def test_java_none_times_become_null():
    env = rules.route_message("orders", "1", wire.encode({**order(1, 17, 4), "paidAt": -1}))
    assert env["paid_at"] is None and env["created_at"] is not None


@pytest.mark.parametrize("kind,payload,error", [
    ("orders", b"{", "payload is not valid JSON"),
    ("orders", b"\xff\x00", "payload is not valid UTF-8"),
    ("orders", b"[1, 2]", "payload must be a JSON object, got list"),
    ("orders", wire.encode({**order(1, 2, 3), "userId": None}), "field 'userId' is null; it is required"),
    ("orders", wire.encode({**order(1, 2, 3), "userId": "abc"}), "field 'userId' must be an integer, got str"),
    ("users", wire.encode({"firstName": "x"}), "required field 'id' is missing"),
    ("items", wire.encode({**item(1), "price": "1"}), "field 'price' must be a number"),
    ("orders", b"", "empty payload"),
    ("orders", b"x" * (wire.MAX_PAYLOAD_BYTES + 1), "over the"),
])
def test_bad_messages_become_dead_letters(kind, payload, error):
    env = rules.route_message(kind, "k", payload)
    assert env["op"] == "dead"
    assert error in env["error"] and "\n" not in env["error"]
    assert env["payload"] is not None


def test_non_utf8_payload_is_kept_as_base64():
    env = rules.route_message("orders", "k", b"\xff\xfe")
    assert env["payload"] == "base64://4="


def test_tombstone_with_bad_key_is_dead():
    env = rules.route_message("users", "not-a-number", b"")
    assert env["op"] == "dead" and "tombstone key" in env["error"]


def test_redrive_property():
    assert rules.redrive_of('{"redrive-of": "1:2:-1:-1"}') == "1:2:-1:-1"
    assert rules.redrive_of(None) is None and rules.redrive_of("not json") is None


def test_lone_surrogate_in_a_string_field_is_a_dead_letter_naming_the_field():
    payload = b'{"invoiceId": 1, "lineItemId": 1, "userId": 2, "itemId": 3, "price": 1.5, "createdAt": 1, ' \
              b'"itemName": "\\ud800"}'
    env = rules.route_message("orders", "1", payload)
    assert env["op"] == "dead"
    assert env["error"] == "field 'itemName' holds a lone surrogate \\ud800 at character 0; text must be valid Unicode"
    assert env["payload"] == payload.decode()


def test_a_failure_outside_the_wire_check_makes_one_dead_letter(monkeypatch):
    def explode(kind, payload):
        raise OverflowError("boom\nsecond line")

    monkeypatch.setattr(rules.wire, "parse_payload", explode)
    env = rules.route_message("orders", "1", b"{}")
    assert env["op"] == "dead" and env["error"] == "cannot read the message: OverflowError: boom second line"


def test_redrive_property_with_a_lone_surrogate_stays_encodable():
    value = rules.redrive_of('{"redrive-of": "\\ud800x"}')
    assert value == "\\ud800x" and value.encode("utf-8")


# -- The lookup model: the specification the Java operator is held to.

def _row(kind, op, position=0, **values):
    return {**dict.fromkeys(rules.ENVELOPE_FIELDS), "kind": kind, "op": op, "source_partition": -1,
            "position": position, "user_id": 0, "item_id": 0, **values}


def test_sink_decision_names_every_missing_lookup():
    table = pa.Table.from_pylist([
        _row("orders", "order", user_state="found", item_state="found"),
        _row("orders", "order", user_state="missing", item_state="found"),
        _row("orders", "order", user_state="found", item_state="missing"),
        _row("orders", "order", user_state="missing", item_state="missing"),
        _row("orders", "dead")])
    decided = rules.with_sinks(table)
    assert decided["sink"].to_pylist() == ["enriched", "missing_state", "missing_state", "missing_state", "dead_letter"]
    assert decided["reason"].to_pylist() == [None, "user", "item", "user_and_item", None]
    assert [rules.sink_of(row) for row in table.to_pylist()] == list(zip(decided["sink"].to_pylist(),
                                                                          decided["reason"].to_pylist()))


def test_changes_apply_before_orders_in_read_order_and_the_last_wins():
    model = rules.LookupModel(USERS, max_wait_ms=0)
    out = model.process([_row("orders", "order", user_id=1, invoice_id=9),
                         _row("users", "upsert", 3, user_id=1, user_first_name="c"),
                         _row("users", "upsert", 1, user_id=1, user_first_name="a")], now_ms=1000)
    assert [(r["user_first_name"], r["user_state"], r["waited_ms"]) for r in out] == [("c", "found", 0)]
    assert model.latest == {1: ("c", None, None, None)}


def test_a_tombstone_deletes_and_other_rows_pass_through():
    model = rules.LookupModel(USERS, max_wait_ms=0)
    model.process([_row("users", "upsert", 1, user_id=1, user_first_name="a")], now_ms=0)
    passing = [_row("items", "upsert", 1, item_id=4), _row("orders", "dead")]
    out = model.process([_row("users", "delete", 2, user_id=1), _row("orders", "order", user_id=1), *passing], 5)
    assert out[:2] == passing and model.latest == {}
    assert (out[2]["user_state"], out[2]["user_first_name"]) == ("missing", None)


def test_an_order_waits_for_its_key_then_is_released_or_expires():
    model = rules.LookupModel(USERS, max_wait_ms=10_000)
    assert model.process([_row("orders", "order", user_id=1, invoice_id=1),
                          _row("orders", "order", user_id=2, invoice_id=2)], now_ms=1000) == []
    released = model.process([_row("users", "upsert", 1, user_id=1, user_first_name="a")], now_ms=4000)
    assert [(r["invoice_id"], r["user_state"], r["first_seen_ms"], r["waited_ms"]) for r in released] == \
        [(1, "found", 1000, 3000)]
    assert model.process([], now_ms=10_999) == []
    expired = model.process([], now_ms=11_000)
    assert [(r["invoice_id"], r["user_state"], r["waited_ms"]) for r in expired] == [(2, "missing", 10_000)]


def test_the_second_lookup_continues_the_first_ones_clock():
    model = rules.EnrichmentModel(max_wait_ms=10_000)
    model.process([_row("items", "upsert", 1, item_id=4, item_name="n")], now_ms=0)
    assert model.process([_row("orders", "order", user_id=1, item_id=5)], now_ms=1000) == []
    out = model.process([_row("users", "upsert", 1, user_id=1)], now_ms=3000)
    assert out == [] and model.waiting() == 1  # now waiting for item 5, since 1000
    out = model.process([], now_ms=11_000)
    assert [(r["sink"], r["reason"], r["waited_ms"]) for r in out] == [("missing_state", "item", 10_000)]
