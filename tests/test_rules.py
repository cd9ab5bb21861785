"""Pure enrichment rules: outcomes, reasons, buffering, routing (no Spark)."""

import pandas as pd
import pytest

from pipeline import wire
from pipeline.enrich import rules
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
    env = rules.route_message("orders", "1", wire.encode(order(1, 17, 4)), 1, 8)
    assert (env["op"], env["user_id"], env["item_id"], env["user_bucket"], env["item_bucket"]) == ("order", 17, 4, 1, 4)
    assert (env["invoice_id"], env["order_item_name"]) == (1, order(1, 17, 4)["itemName"])
    env = rules.route_message("users", "17", wire.encode(user(17)), 1, 8)
    assert (env["op"], env["user_id"], env["user_bucket"]) == ("upsert", 17, 1)
    assert env["user_first_name"] == user(17)["firstName"] and env["item_id"] == 0 and env["item_bucket"] == 1
    env = rules.route_message("items", "4", b"", 1, 8)
    assert (env["op"], env["item_id"], env["item_bucket"]) == ("delete", 4, 4)


def test_java_none_times_become_null():
    env = rules.route_message("orders", "1", wire.encode({**order(1, 17, 4), "paidAt": -1}), 1, 8)
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
    env = rules.route_message(kind, "k", payload, 1, 8)
    assert env["op"] == "dead"
    assert error in env["error"] and "\n" not in env["error"]
    assert env["payload"] is not None


def test_non_utf8_payload_is_kept_as_base64():
    env = rules.route_message("orders", "k", b"\xff\xfe", 1, 8)
    assert env["payload"] == "base64://4="


def test_tombstone_with_bad_key_is_dead():
    env = rules.route_message("users", "not-a-number", b"", 1, 8)
    assert env["op"] == "dead" and "tombstone key" in env["error"]


def _frame(rows):
    frame = pd.DataFrame([{**dict.fromkeys(rules.ENVELOPE_FIELDS), "source_partition": -1, **row} for row in rows])
    return frame[list(rules.ENVELOPE_FIELDS)]


def test_changelog_sorts_before_orders_in_read_order():
    frame = _frame([{"op": "order", "position": 1}, {"op": "upsert", "position": 9},
                    {"op": "upsert", "position": 3}, {"op": "delete", "position": 5}])
    ordered = rules.in_apply_order(frame)
    assert list(zip(ordered["op"], ordered["position"])) == [("upsert", 3), ("delete", 5), ("upsert", 9), ("order", 1)]


def test_latest_change_per_id_wins_and_tombstones_delete():
    frame = _frame([{"kind": "users", "op": "upsert", "user_id": 1, "user_first_name": "a", "position": 1},
                    {"kind": "users", "op": "upsert", "user_id": 2, "user_first_name": "b", "position": 2},
                    {"kind": "users", "op": "upsert", "user_id": 1, "user_first_name": "c", "position": 3},
                    {"kind": "users", "op": "delete", "user_id": 2, "position": 4}])
    latest = rules.latest_changes(frame, "user_id", "users")
    assert latest == {1: ("c", None, None, None), 2: None}


def test_pass_through_is_dead_letters_and_the_other_changelog():
    frame = _frame([{"kind": "items", "op": "upsert"}, {"kind": "users", "op": "upsert"},
                    {"kind": "orders", "op": "dead"}, {"kind": "orders", "op": "order"}])
    assert rules.passes_through(frame, "users").tolist() == [True, False, True, False]


def test_attach_state_fills_found_records_and_nulls():
    frame = _frame([{"op": "order", "item_id": 4}, {"op": "order", "item_id": 5}])
    out = rules.attach_state(frame, [("n", "c", "a", "m", 2.5), None], "items")
    assert out["item_name"].tolist() == ["n", None] and out["item_price"].tolist() == [2.5, None]


def test_waiting_orders_expire_at_the_deadline():
    waiting = rules.WaitingOrders()
    waiting.add({"first_seen_ms": 1000, "n": 1})
    waiting.add({"first_seen_ms": 3000, "n": 2})
    assert waiting.next_deadline(5000) == 6000
    assert [e["n"] for e in waiting.split_expired(6000, 5000)] == [1]
    assert [e["n"] for e in rules.WaitingOrders.load(waiting.dump()).entries] == [2]


def test_finish_orders_routes_and_measures_wait():
    frame = _frame([{"op": "order", "first_seen_ms": 1000, "user_state": "found"},
                    {"op": "order", "first_seen_ms": 1000, "user_state": "missing"},
                    {"op": "order", "first_seen_ms": 2500, "user_state": "missing"},
                    {"op": "order", "first_seen_ms": 1000, "user_state": "found"}])
    done = rules.finish_orders(frame, [True, False, True, False], 4000)
    assert done["sink"].tolist() == ["enriched", "missing_state", "missing_state", "missing_state"]
    assert done["reason"].tolist() == [None, "user_and_item", "user", "item"]
    assert done["waited_ms"].tolist() == [3000, 3000, 1500, 3000]


def test_redrive_property():
    assert rules.redrive_of('{"redrive-of": "1:2:-1:-1"}') == "1:2:-1:-1"
    assert rules.redrive_of(None) is None and rules.redrive_of("not json") is None


def test_lone_surrogate_in_a_string_field_is_a_dead_letter_naming_the_field():
    payload = b'{"invoiceId": 1, "lineItemId": 1, "userId": 2, "itemId": 3, "price": 1.5, "createdAt": 1, ' \
              b'"itemName": "\\ud800"}'
    env = rules.route_message("orders", "1", payload, 1, 8)
    assert env["op"] == "dead"
    assert env["error"] == "field 'itemName' holds a lone surrogate \\ud800 at character 0; text must be valid Unicode"
    assert env["payload"] == payload.decode()


def test_a_failure_outside_the_wire_check_makes_one_dead_letter(monkeypatch):
    def explode(kind, payload):
        raise OverflowError("boom\nsecond line")

    monkeypatch.setattr(rules.wire, "parse_payload", explode)
    env = rules.route_message("orders", "1", b"{}", 1, 8)
    assert env["op"] == "dead" and env["error"] == "cannot read the message: OverflowError: boom second line"


def test_redrive_property_with_a_lone_surrogate_stays_encodable():
    value = rules.redrive_of('{"redrive-of": "\\ud800x"}')
    assert value == "\\ud800x" and value.encode("utf-8")
