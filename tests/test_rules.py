"""Pure enrichment rules: outcomes, reasons, buffering, routing (no Spark)."""

import json

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


def _meta(position=1):
    return {"topic": "persistent://public/default/orders", "partition": -1, "message_id": f"0:{position}:-1:-1",
            "position": position, "key": "k", "published_ms": 1000, "redrive_of": None}


def test_route_order_user_item_and_tombstone():
    env = rules.route_message("orders", "1", wire.encode(order(1, 17, 4)), _meta(), 8)
    assert (env["op"], env["user_id"], env["item_id"], env["user_bucket"], env["item_bucket"]) == ("order", 17, 4, 1, 4)
    env = rules.route_message("users", "17", wire.encode(user(17)), _meta(), 8)
    assert (env["op"], env["user_id"], env["user_bucket"]) == ("upsert", 17, 1)
    env = rules.route_message("items", "4", b"", _meta(), 8)
    assert (env["op"], env["item_id"]) == ("delete", 4)


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
    env = rules.route_message(kind, "k", payload, _meta(), 8)
    assert env["op"] == "dead"
    assert error in env["error"] and "\n" not in env["error"]
    assert env["payload_text"] is not None


def test_non_utf8_payload_is_kept_as_base64():
    env = rules.route_message("orders", "k", b"\xff\xfe", _meta(), 8)
    assert env["payload_text"] == "base64://4="


def test_tombstone_with_bad_key_is_dead():
    env = rules.route_message("users", "not-a-number", b"", _meta(), 8)
    assert env["op"] == "dead" and "tombstone key" in env["error"]


def test_changelog_sorts_before_orders_in_read_order():
    rows = [{"op": "order", "partition": -1, "position": 1}, {"op": "upsert", "partition": -1, "position": 9},
            {"op": "upsert", "partition": -1, "position": 3}, {"op": "delete", "partition": -1, "position": 5}]
    assert [(r["op"], r["position"]) for r in rules.sorted_rows(rows)] == [
        ("upsert", 3), ("delete", 5), ("upsert", 9), ("order", 1)]


def test_waiting_orders_expire_at_the_deadline():
    waiting = rules.WaitingOrders()
    waiting.add({"first_seen_ms": 1000, "n": 1})
    waiting.add({"first_seen_ms": 3000, "n": 2})
    assert waiting.next_deadline(5000) == 6000
    assert [e["n"] for e in waiting.split_expired(6000, 5000)] == [1]
    assert [e["n"] for e in rules.WaitingOrders.load(waiting.dump()).entries] == [2]


def test_finish_order_routes_and_measures_wait():
    env = dict.fromkeys(rules.ENVELOPE_FIELDS)
    env.update(first_seen_ms=1000, user_state="found")
    done = rules.finish_order(env, json.dumps(item(1)), 4000)
    assert (done["sink"], done["reason"], done["waited_ms"]) == ("enriched", None, 3000)
    env.update(user_state="missing")
    done = rules.finish_order(env, None, 4000)
    assert (done["sink"], done["reason"]) == ("missing_state", "user_and_item")


def test_redrive_property():
    assert rules.redrive_of('{"redrive-of": "1:2:-1:-1"}') == "1:2:-1:-1"
    assert rules.redrive_of(None) is None and rules.redrive_of("not json") is None
