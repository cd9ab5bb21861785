"""Enrichment decisions as pure functions over plain values (no Spark, clock passed in).

The two lookups (user, then item) ask the same questions: is the state there, should the
order wait for it, and if it never came, why is the order missing. The answers live here so
they get fast tests; pipeline/enrich/processors.py only adapts Spark's state handles to them.
"""

from __future__ import annotations

import base64
import json
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

from pipeline import wire

FOUND, WAIT, MISSING = "found", "wait", "missing"
Outcome = Literal["found", "wait", "missing"]

# The envelope: the one row shape between the parse step, both lookups and the sinks.
# {"kind": "orders", "op": "order", "user_bucket": 3, "item_bucket": 9, "user_id": 17, "item_id": 4,
#  "record": "{…}", "error": None, "topic": "persistent://…", "partition": -1, "message_id": "0:5:-1:2",
#  "position": 42, "key": "1001", "payload_text": None, "published_ms": 1700000000000, "redrive_of": None,
#  "first_seen_ms": None, "user_record": None, "user_state": None, "item_record": None,
#  "sink": None, "reason": None, "waited_ms": None}
ENVELOPE_FIELDS = (
    "kind", "op", "user_bucket", "item_bucket", "user_id", "item_id", "record", "error", "topic", "partition",
    "message_id", "position", "key", "payload_text", "published_ms", "redrive_of", "first_seen_ms",
    "user_record", "user_state", "item_record", "sink", "reason", "waited_ms",
)
# Between Spark stages an envelope travels as its two grouping keys and one pickled body:
# Spark's Row-based transformWithState worker converts every cell on its own, so three
# columns cost a fraction of twenty-three.
ENVELOPE_SPARK_SCHEMA = "user_bucket int, item_bucket int, body binary"
REDRIVE_PROPERTY = "redrive-of"


def pack(env: dict) -> bytes:
    return pickle.dumps(env, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(body: bytes) -> dict:
    return pickle.loads(body)


def bucket_of(identifier: int, buckets: int) -> int:
    """The state bucket of an id: stable across runs and machines (no salted hash)."""
    return identifier % buckets


def payload_text(payload: bytes | None) -> str | None:
    """The raw payload for a dead letter: its text, or base64 when it is not UTF-8."""
    if payload is None:
        return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode("ascii")


def route_message(kind: str, key: str | None, payload: bytes | None, meta: dict[str, Any], buckets: int) -> dict:
    """Validate one source message and turn it into an envelope (op upsert/delete/order/dead)."""
    env = dict.fromkeys(ENVELOPE_FIELDS)
    env.update(meta)
    env["kind"] = kind
    spread = (meta.get("position") or 0) % buckets  # rows that hold no key of a lookup
    env["user_bucket"] = env["item_bucket"] = spread
    try:
        record = wire.parse_payload(kind, payload)
        if record is None:
            env["op"] = "delete"
            ident = wire.tombstone_key(key)
        else:
            env["op"] = "order" if kind == "orders" else "upsert"
            env["record"] = record
            ident = record["id"] if kind != "orders" else None
    except wire.BadMessage as exc:
        env["op"], env["error"], env["payload_text"] = "dead", str(exc), payload_text(payload)
        return env
    if kind == "users":
        env["user_id"], env["user_bucket"] = ident, bucket_of(ident, buckets)
    elif kind == "items":
        env["item_id"], env["item_bucket"] = ident, bucket_of(ident, buckets)
    else:
        env["user_id"], env["item_id"] = record["userId"], record["itemId"]
        env["user_bucket"], env["item_bucket"] = bucket_of(record["userId"], buckets), bucket_of(record["itemId"], buckets)
    return env


def redrive_of(properties_json: str | None) -> str | None:
    """The ``redrive-of`` message property, if the order is a re-drive."""
    if not properties_json:
        return None
    try:
        return json.loads(properties_json).get(REDRIVE_PROPERTY)
    except (ValueError, AttributeError):
        return None


def apply_order(env: dict) -> tuple:
    """Sort key inside one lookup group: changelog messages first, each partition in read order."""
    return (1 if env["op"] in ("order", "dead") else 0, env["partition"] or 0, env["position"] or 0)


def lookup_outcome(found: bool, waited_ms: int, max_wait_ms: int) -> Outcome:
    """Found; or wait while under max_wait (0 turns buffering off); else missing."""
    if found:
        return FOUND
    if max_wait_ms > 0 and waited_ms < max_wait_ms:
        return WAIT
    return MISSING


def missing_reason(user_found: bool, item_found: bool) -> str | None:
    """Why an order is missing state: user, item, user_and_item (None if it is not missing)."""
    if user_found and item_found:
        return None
    if not user_found and not item_found:
        return "user_and_item"
    return "user" if not user_found else "item"


def deadline_ms(first_seen_ms: int, max_wait_ms: int) -> int:
    return first_seen_ms + max_wait_ms


@dataclass
class WaitingOrders:
    """Orders waiting for one key's state, as stored in one MapState entry.

    ``entries`` are envelopes with ``first_seen_ms`` set; the whole list is one (pickled) state value.
    """

    entries: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, blob: bytes | None) -> "WaitingOrders":
        return cls(pickle.loads(blob) if blob else [])

    def dump(self) -> bytes:
        return pickle.dumps(self.entries, protocol=pickle.HIGHEST_PROTOCOL)

    def add(self, env: dict) -> None:
        self.entries.append(env)

    def split_expired(self, now_ms: int, max_wait_ms: int) -> list[dict]:
        """Remove and return the entries whose wait is over."""
        expired = [e for e in self.entries if deadline_ms(e["first_seen_ms"], max_wait_ms) <= now_ms]
        self.entries = [e for e in self.entries if deadline_ms(e["first_seen_ms"], max_wait_ms) > now_ms]
        return expired

    def next_deadline(self, max_wait_ms: int) -> int | None:
        return min((deadline_ms(e["first_seen_ms"], max_wait_ms) for e in self.entries), default=None)


def finish_order(env: dict, item_record: dict | None, now_ms: int) -> dict:
    """The final envelope of an order after both lookups: routed to enriched or missing_state."""
    user_found = env["user_state"] == FOUND
    item_found = item_record is not None
    out = dict(env)
    out["item_record"] = item_record
    out["waited_ms"] = now_ms - env["first_seen_ms"] if env.get("first_seen_ms") is not None else 0
    out["reason"] = missing_reason(user_found, item_found)
    out["sink"] = "enriched" if out["reason"] is None else "missing_state"
    return out


def finish_dead(env: dict) -> dict:
    out = dict(env)
    out["sink"] = "dead_letter"
    return out


def wait_ms_so_far(env: dict, now_ms: int) -> int:
    first = env.get("first_seen_ms")
    return 0 if first is None else now_ms - first


def passes_through(env: dict, lookup: str) -> bool:
    """Rows a lookup does not act on: dead letters and the other lookup's changelog."""
    if env["op"] == "dead":
        return True
    if env["op"] in ("upsert", "delete"):
        return env["kind"] != lookup
    return False


def sorted_rows(rows: Iterable[dict]) -> list[dict]:
    return sorted(rows, key=apply_order)
