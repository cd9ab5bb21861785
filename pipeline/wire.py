"""The wire format of the topics (DESIGN.md §3): field names, types, and validation.

Payloads are UTF-8 JSON objects with the field names of the original Java model, so a
producer written for the original job works unchanged. :func:`parse_payload` is the one
place that decides whether a message is valid; a bad one raises :class:`BadMessage` whose
text is the one-line ``error`` of its dead-letter row.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from typing import Any

from pipeline.enrich.lookups import CHANGELOGS, LOOKUPS
from pipeline.fields import NONE, Field  # noqa: F401 - wire.Field, wire.NONE

MAX_PAYLOAD_BYTES = 1 << 20  # far above any real record; bigger ones are poison
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Times are epoch milliseconds within years 1 to 9999 (ISO 8601's, Python's datetime's): beyond
# about year 294247 DuckDB cannot read a sink's timestamp column at all, so one order would
# make the whole sink unreadable.
MIN_TIME_MS, MAX_TIME_MS = -62_135_596_800_000, 253_402_300_799_999


# The topics: each lookup's changelog (its fields declared in pipeline/enrich/lookups.py), then
# the orders, which carry each lookup's id after the line item id.
ORDER_FIELDS = (
    Field("invoiceId", int, True), Field("lineItemId", int, True),
    *(Field(lookup.order_field, int, True) for lookup in LOOKUPS),
    Field("itemName", str, False), Field("itemCategory", str, False),
    Field("price", float, True), Field("createdAt", int, True, time=True), Field("paidAt", int, False, NONE, time=True),
)
FIELDS = {**{lookup.changelog: lookup.wire_fields for lookup in LOOKUPS}, "orders": ORDER_FIELDS}
KEY_FIELD = {**{lookup.changelog: "id" for lookup in LOOKUPS}, "orders": "invoiceId"}


_ABSENT = object()


class BadMessage(ValueError):
    """A message that cannot be used; ``str(exc)`` is its one-line dead-letter error."""


def _coerce(field: Field, value: Any) -> Any:
    if value is None:
        if field.required:
            raise BadMessage(f"field {field.name!r} is null; it is required")
        return field.default
    if field.kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadMessage(f"field {field.name!r} must be an integer, got {type(value).__name__} {_short(value)}")
        if isinstance(value, float):
            if not value.is_integer():
                raise BadMessage(f"field {field.name!r} must be an integer, got {value!r}")
            value = int(value)
        if not INT64_MIN <= value <= INT64_MAX:
            raise BadMessage(f"field {field.name!r} = {_short(value)} is outside the 64-bit range")
        return _check_time(field, value)
    if field.kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadMessage(f"field {field.name!r} must be a number, got {type(value).__name__} {_short(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer past the float range
            number = float("inf")
        if number - number != 0.0:  # inf or nan
            raise BadMessage(f"field {field.name!r} must be a finite number, got {_short(value)}")
        return number
    if not isinstance(value, str):
        raise BadMessage(f"field {field.name!r} must be a string, got {type(value).__name__} {_short(value)}")
    if not encodable_text(value):
        # JSON may escape a lone UTF-16 surrogate (\ud800): valid JSON, but no UTF-8 sink can hold it.
        bad = next(i for i, char in enumerate(value) if 0xD800 <= ord(char) <= 0xDFFF)
        raise BadMessage(f"field {field.name!r} holds a lone surrogate \\u{ord(value[bad]):04x} at character {bad}; "
                         "text must be valid Unicode")
    return value


def _check_time(field: Field, value: int) -> int:
    if field.time and not MIN_TIME_MS <= value <= MAX_TIME_MS:
        raise BadMessage(f"field {field.name!r} = {value} is not a time in years 1 to 9999 "
                         f"({MIN_TIME_MS}..{MAX_TIME_MS} epoch milliseconds)")
    return value


def _short(value: Any, limit: int = 40) -> str:
    """A value as a short one-line ASCII text for an error (never the whole of a huge one)."""
    if isinstance(value, str):
        text = repr(value[:limit])
    elif isinstance(value, int) and abs(value) >= 10**limit:
        text = f"a {len(str(abs(value)))}-digit integer"
    else:
        try:
            text = json.dumps(value)
        except (RecursionError, ValueError):  # nested deeper than the encoder goes
            text = f"a nested {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_record(topic: str, record: Any) -> dict[str, Any]:
    """Check a decoded JSON value against the topic's fields; extra fields are ignored."""
    if not isinstance(record, dict):
        raise BadMessage(f"payload must be a JSON object, got {type(record).__name__}")
    parsed = {}
    for field in FIELDS[topic]:
        value = record.get(field.name, _ABSENT)
        if value is _ABSENT:
            if field.required:
                raise BadMessage(f"required field {field.name!r} is missing")
            parsed[field.name] = field.default
        elif type(value) is field.kind and (encodable_text(value) if field.kind is str else plain_number(value)):
            parsed[field.name] = _check_time(field, value)  # the common case, without _coerce's detours
        else:
            parsed[field.name] = _coerce(field, value)
    return parsed


def encodable_text(value: str) -> bool:
    """A string that UTF-8 can encode (no lone surrogates): what every sink and Arrow needs."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def plain_number(value: int | float) -> bool:
    """An int in the 64-bit range or a finite float: accepted as it is."""
    if type(value) is int:
        return INT64_MIN <= value <= INT64_MAX
    return value - value == 0.0  # False for inf and nan


def parse_payload(topic: str, payload: bytes | None) -> dict[str, Any] | None:
    """The record in a message, or None for a changelog tombstone (empty payload).

    Raises BadMessage, and nothing else, for: an empty payload on ``orders``, over-size payloads,
    invalid UTF-8, invalid JSON (NaN, Infinity, numbers past 4300 digits included), a JSON value
    that is not an object, a missing, null or mistyped field, text with a lone surrogate, an
    integer past 64 bits, a non-finite number, a time outside years 1 to 9999.
    """
    if topic not in FIELDS:
        raise ValueError(f"unknown topic kind {topic!r}; expected one of {sorted(FIELDS)}")
    if not payload:
        if topic in CHANGELOGS:
            return None
        raise BadMessage("empty payload; only changelog topics take tombstones")
    return parse_record(topic, load_json(payload))


def payload_text(payload: bytes | None) -> str | None:
    """The raw payload as a dead letter holds it, in the job's and the SQL pipelines' alike: its
    text, or ``base64:`` and its base64 when it is not UTF-8."""
    if payload is None:
        return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode("ascii")


def load_json(payload: bytes) -> Any:
    """The JSON value of a payload, or BadMessage (one line, nothing else) for a payload over
    MAX_PAYLOAD_BYTES or invalid UTF-8 or JSON: NaN and Infinity, numbers past 4300 digits and
    nesting too deep included. The job's topics and the SQL pipelines' tables read their payloads
    through it."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise BadMessage(f"payload is {len(payload)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadMessage(f"payload is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BadMessage(f"payload is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadMessage("payload is not valid JSON: nested too deeply") from None
    except BadMessage:
        raise
    except ValueError:  # Python's int() limit: a number of more than 4300 digits
        raise BadMessage(f"payload is not valid JSON: a number has over {sys.get_int_max_str_digits()} digits") from None


def _reject_constant(name: str) -> None:
    # Python's json reads NaN and Infinity, which JSON (and the Java model's Jackson) does not have.
    raise BadMessage(f"payload is not valid JSON: {name} is not a JSON number")


def tombstone_key(key: str | None) -> int:
    """The id a tombstone deletes: its message key, which must be a 64-bit integer in ASCII digits.

    Stricter than Python's int(), which also reads "4_2" and other scripts' digits as 42.
    """
    text = "" if key is None else str(key).strip()
    if _ID_TEXT.fullmatch(text) and INT64_MIN <= int(text) <= INT64_MAX:
        return int(text)
    if key is None:
        raise BadMessage("tombstone key is missing; it must be the 64-bit integer id to delete")
    raise BadMessage(f"tombstone key {_short(key)} is not a 64-bit integer id")


_ID_TEXT = re.compile(r"[+-]?[0-9]{1,19}")


def encode(record: dict[str, Any]) -> bytes:
    """The compact UTF-8 JSON payload of a record."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def message_key(topic: str, record: dict[str, Any]) -> str:
    """The message key of a record: ``str(id)`` or ``str(invoiceId)``."""
    return str(record[KEY_FIELD[topic]])
