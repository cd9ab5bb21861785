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
from typing import Literal

import numpy as np
import pandas as pd

from pipeline import wire

FOUND, WAIT, MISSING = "found", "wait", "missing"
Outcome = Literal["found", "wait", "missing"]

# The envelope: the one row shape between the parse step, both lookups and the sinks. It is
# columnar (Spark hands each lookup a pandas DataFrame per key bucket), and it is already the
# union of the three sinks' columns, so the last lookup's output is what the sinks write.
# Changelog rows carry their record in the same user_*/item_* columns an enriched order gets.
# {"kind": "orders", "op": "order", "user_bucket": 3, "item_bucket": 9, "source_topic": "persistent://…",
#  "source_partition": -1, "source_message_id": "0:5:-1:2", "position": 42, "key": "1001",
#  "published_at": 1700000000000, "redrive_of": None, "error": None, "payload": None,
#  "invoice_id": 1001, "line_item_id": 1, "user_id": 17, "item_id": 4, "price": 9.5, "created_at": …,
#  "paid_at": None, "order_item_name": "…", "order_item_category": "…", "user_first_name": None, …,
#  "item_price": None, "first_seen_ms": None, "user_state": None, "sink": None, "reason": None, "waited_ms": None}
ENVELOPE_SPARK_SCHEMA = (
    "kind string, op string, user_bucket int, item_bucket int, source_topic string, source_partition int, "
    "source_message_id string, position long, key string, published_at long, redrive_of string, error string, "
    "payload string, invoice_id long, line_item_id long, user_id long, item_id long, price double, "
    "created_at long, paid_at long, order_item_name string, order_item_category string, "
    "user_first_name string, user_last_name string, user_email string, user_created_at long, "
    "item_name string, item_category string, item_adjective string, item_modifier string, item_price double, "
    "first_seen_ms long, user_state string, sink string, reason string, waited_ms long"
)
ENVELOPE_FIELDS = tuple(part.strip().split(" ")[0] for part in ENVELOPE_SPARK_SCHEMA.split(","))
# Wire field -> envelope column, per topic. Ids are never null in the envelope (0 where unused):
# Spark hands a long column with nulls to pandas as float64, which would round big ids.
RECORD_COLUMNS = {
    "orders": {"invoiceId": "invoice_id", "lineItemId": "line_item_id", "userId": "user_id", "itemId": "item_id",
               "price": "price", "createdAt": "created_at", "paidAt": "paid_at", "itemName": "order_item_name",
               "itemCategory": "order_item_category"},
    "users": {"id": "user_id", "firstName": "user_first_name", "lastName": "user_last_name",
              "emailAddress": "user_email", "createdAt": "user_created_at"},
    "items": {"id": "item_id", "name": "item_name", "category": "item_category", "adjective": "item_adjective",
              "modifier": "item_modifier", "price": "item_price"},
}
# What each lookup keeps in state per id: the columns it adds to an order.
STATE_COLUMNS = {
    "users": ("user_first_name", "user_last_name", "user_email", "user_created_at"),
    "items": ("item_name", "item_category", "item_adjective", "item_modifier", "item_price"),
}
ID_COLUMNS = ("invoice_id", "line_item_id", "user_id", "item_id")
TIME_COLUMNS = ("created_at", "paid_at", "user_created_at")  # the Java model's -1 means none
REDRIVE_PROPERTY = "redrive-of"


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


# The envelope columns the parse step decides from a message's payload (the rest it copies).
DECIDED_COLUMNS = ("op", "error", "payload", "user_bucket", "item_bucket",
                   *dict.fromkeys(column for columns in RECORD_COLUMNS.values() for column in columns.values()))


def route_messages(kinds: list[str], keys: list, payloads: list, positions: list, buckets: int) -> dict[str, list]:
    """Validate source messages: the envelope columns they decide, one list per column.

    Each message gets op upsert/delete/order/dead; columns a message does not set are null
    (ids 0). Rows that hold no key of a lookup are spread over its buckets by position.
    Column-wise because the parse step runs this for every message of the job.
    # {"op": ["order", "dead"], "user_bucket": [1, 2], "invoice_id": [1, 0], "error": [None, "payload is …"], …}
    """
    n = len(payloads)
    columns = {name: ([0] * n if name in ID_COLUMNS else [None] * n) for name in DECIDED_COLUMNS}
    ops, errors, raw = columns["op"], columns["error"], columns["payload"]
    user_ids, item_ids = columns["user_id"], columns["item_id"]
    user_buckets, item_buckets = columns["user_bucket"], columns["item_bucket"]
    targets = {kind: [(name, columns[column], column in TIME_COLUMNS) for name, column in fields.items()]
               for kind, fields in RECORD_COLUMNS.items()}
    parse = wire.parse_payload
    for i, (kind, payload) in enumerate(zip(kinds, payloads)):
        spread = (positions[i] or 0) % buckets
        try:
            record = parse(kind, payload)
            deleted = wire.tombstone_key(keys[i]) if record is None else None
        except Exception as exc:  # noqa: BLE001 - no message, whatever its bytes, may fail the batch
            ops[i], errors[i], raw[i] = "dead", dead_letter_error(exc), payload_text(payload)
            user_buckets[i] = item_buckets[i] = spread
            continue
        if record is None:
            ops[i] = "delete"
            (user_ids if kind == "users" else item_ids)[i] = deleted
        else:
            ops[i] = "order" if kind == "orders" else "upsert"
            for name, column, is_time in targets[kind]:
                value = record[name]
                # the Java model's -1 means "no time"
                column[i] = None if is_time and value is not None and value < 0 else value
        user_buckets[i] = spread if kind == "items" else bucket_of(user_ids[i], buckets)
        item_buckets[i] = spread if kind == "users" else bucket_of(item_ids[i], buckets)
    return columns


def dead_letter_error(exc: Exception) -> str:
    """The one-line error of a dead letter: a wire check's own text, or the failure named."""
    if isinstance(exc, wire.BadMessage):
        return str(exc)
    text = " ".join(str(exc).split())[:300]
    return f"cannot read the message: {type(exc).__name__}: {text}"


def route_message(kind: str, key: str | None, payload: bytes | None, position: int | None, buckets: int) -> dict:
    """:func:`route_messages` for one message, as one dict of envelope columns."""
    return {name: values[0] for name, values in route_messages([kind], [key], [payload], [position], buckets).items()}


def redrive_of(properties_json: str | None) -> str | None:
    """The ``redrive-of`` message property, if the order is a re-drive."""
    if not properties_json:
        return None
    try:
        value = json.loads(properties_json).get(REDRIVE_PROPERTY)
    except (ValueError, AttributeError):
        return None
    if not isinstance(value, str):
        return None if value is None else str(value)
    # A lone surrogate escaped in the JSON would fail the whole Arrow batch; keep it visible instead.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


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

    ``entries`` are envelope rows (dicts) with ``first_seen_ms`` set; the list is one pickled value.
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


# -- The same decisions over a whole key bucket at once (pandas frames of envelope rows).

def in_apply_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Changelog messages first, then everything else; each topic partition in read order."""
    if len(frame) < 2:
        return frame
    later = (~frame["op"].isin(("upsert", "delete"))).astype("int8")
    keys = pd.DataFrame({"later": later, "partition": frame["source_partition"].fillna(0),
                         "position": frame["position"].fillna(0)})
    return frame.loc[keys.sort_values(["later", "partition", "position"], kind="stable").index]


def passes_through(frame: pd.DataFrame, lookup: str) -> pd.Series:
    """Rows a lookup does not act on: dead letters and the other lookup's changelog."""
    return (frame["op"] == "dead") | (frame["op"].isin(("upsert", "delete")) & (frame["kind"] != lookup))


def latest_changes(changes: pd.DataFrame, id_column: str, lookup: str) -> dict[int, tuple | None]:
    """The last change per id of a changelog frame (in apply order): its state values, None if deleted."""
    last = changes.drop_duplicates(id_column, keep="last")
    values = last[list(STATE_COLUMNS[lookup])].astype(object).where(last[list(STATE_COLUMNS[lookup])].notna(), None)
    ids = last[id_column].tolist()
    deleted = (last["op"] == "delete").tolist()
    return {ident: (None if gone else row) for ident, gone, row in
            zip(ids, deleted, values.itertuples(index=False, name=None))}


def attach_state(orders: pd.DataFrame, records: list[tuple | None], lookup: str) -> pd.DataFrame:
    """Orders with the state values of their looked-up records (nulls where none was found)."""
    columns = STATE_COLUMNS[lookup]
    empty = (None,) * len(columns)
    filled = list(zip(*[record if record is not None else empty for record in records])) if records else \
        [() for _ in columns]
    return orders.assign(**{column: np.array(values, dtype=object) for column, values in zip(columns, filled)})


def finish_user(orders: pd.DataFrame, found: np.ndarray) -> pd.DataFrame:
    """After the user lookup: record whether the user was there."""
    return orders.assign(user_state=np.where(found, FOUND, MISSING).astype(object))


def finish_orders(orders: pd.DataFrame, item_found: np.ndarray, now_ms: int) -> pd.DataFrame:
    """After the item lookup: route each order to enriched or missing_state, with its wait."""
    user_found = (orders["user_state"] == FOUND).to_numpy()
    item_found = np.asarray(item_found, dtype=bool)
    first_seen = orders["first_seen_ms"]
    reason = np.select([~user_found & item_found, user_found & ~item_found, ~user_found & ~item_found],
                       ["user", "item", "user_and_item"], default=None).astype(object)
    return orders.assign(
        waited_ms=(now_ms - first_seen).where(first_seen.notna(), 0), reason=reason,
        sink=np.where(user_found & item_found, "enriched", "missing_state").astype(object))


def finish_dead(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(sink="dead_letter")
