"""``SET 'key' = 'value'`` in a script: the Flink configuration keys a pipeline honours.

Pure: :func:`apply_setting` checks one ``SET`` statement and records its value in the script's
settings (key -> value as written); a key outside :data:`SETTINGS`, or a value it cannot take,
is refused with one line naming it. :func:`duration_ms` reads Flink's duration syntax
(``'90 s'``, ``'1 h'``, ``'1d'``, ``'500 ms'``, a bare number of milliseconds).

``table.exec.source.idle-timeout`` (:func:`idle_timeout_ms`) lets a temporal join's watermark pass
a table that has sent nothing for that long (pipeline/sql/join_clock.py).

``table.exec.state.ttl`` (:func:`state_ttl_ms`) is Flink's idle-state retention, in processing
time: ``'0'`` (Flink's default) keeps state for every key; a positive TTL drops a join side's row
not written for the TTL (each side on its own; a foreign-key join's referencing rows and
referenced row each on its own too) and a group not updated for the TTL (members and last result
at once), sending nothing (README, "Conformance with Flink SQL"; the operators are
pipeline/jvm/statefulstreams/UpsertJoin.java, ForeignKeyJoin.java and GroupAggregate.java).
"""

from __future__ import annotations

import re

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.sqltypes import UnsupportedSql

STATE_TTL = "table.exec.state.ttl"
IDLE_TIMEOUT = "table.exec.source.idle-timeout"  # a temporal join's idle tables (pipeline/sql/join_clock.py)
SETTINGS = (STATE_TTL, IDLE_TIMEOUT)
# what '0' means for each key, as a refusal says it
ZERO_MEANS = {STATE_TTL: "'0' keeps state forever", IDLE_TIMEOUT: "'0' never marks a table idle"}
# Flink's TimeUtils units, long and short forms
UNITS_MS = {"ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
            "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
            "min": 60_000, "m": 60_000, "minute": 60_000, "minutes": 60_000,
            "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
            "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}
MAX_TTL_MS = 100_000 * 86_400_000
DURATION = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


def duration_ms(text: str) -> int:
    """Milliseconds of a Flink duration; ValueError if it is not one."""
    match = DURATION.match(text)
    if not match or match.group(2).lower() not in {"", *UNITS_MS}:
        raise ValueError(text)
    return int(match.group(1)) * (UNITS_MS[match.group(2).lower()] if match.group(2) else 1)


def apply_setting(statement: exp.Set, settings: dict[str, str]) -> None:
    """Record a ``SET 'key' = 'value'`` in ``settings``, or refuse it in one line."""
    text = statement.sql(dialect=Flink)
    items = statement.expressions
    item = items[0].this if len(items) == 1 and isinstance(items[0], exp.SetItem) else None
    if not isinstance(item, exp.EQ) or not isinstance(item.expression, exp.Literal):
        raise UnsupportedSql(f"{text!r} is not supported; supported: SET 'key' = 'value' with a key of {list(SETTINGS)}")
    key, value = item.this.name, item.expression.name
    if key not in SETTINGS:
        raise UnsupportedSql(f"SET {key!r} is not supported; supported keys: {', '.join(SETTINGS)}")
    try:
        ms = duration_ms(value)
    except ValueError:
        raise UnsupportedSql(f"SET {key!r} = {value!r} is not a duration; supported: a number and a unit "
                             f"(ms, s, min, h, d), e.g. '1 h'; {ZERO_MEANS[key]}") from None
    if ms > MAX_TTL_MS:  # far beyond any retention; keeps now + TTL inside Spark's long milliseconds
        raise UnsupportedSql(f"SET {key!r} = {value!r} is too long; supported: up to 100000 d, or {ZERO_MEANS[key]}")
    settings[key] = value


def state_ttl_ms(settings: dict[str, str] | tuple[tuple[str, str], ...]) -> int:
    """The script's ``table.exec.state.ttl`` in milliseconds; 0 (keep every key) when not set."""
    value = dict(settings).get(STATE_TTL)
    return 0 if value is None else duration_ms(value)


def idle_timeout_ms(settings: dict[str, str] | tuple[tuple[str, str], ...]) -> int:
    """The script's ``table.exec.source.idle-timeout`` in milliseconds; 0 (Flink's default: no
    table is ever idle) when not set. It matters to a temporal join only: no other query here
    has a watermark."""
    value = dict(settings).get(IDLE_TIMEOUT)
    return 0 if value is None else duration_ms(value)
