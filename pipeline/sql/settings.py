"""``SET 'key' = 'value'`` in a script: the Flink configuration keys a pipeline honours.

Pure: :func:`apply_setting` checks one ``SET`` statement and records its value in the script's
settings (key -> value as written); a key outside :data:`SETTINGS`, or a value it cannot take,
is refused with one line naming it. ``table.exec.state.ttl`` is taken at ``'0'`` (Flink's
default: state is kept for every key); a positive TTL is refused until the operators' state
can expire (README, "Conformance with Flink SQL"). :func:`duration_ms` reads Flink's duration syntax
(``'90 s'``, ``'1 h'``, ``'1d'``, ``'500 ms'``, a bare number of milliseconds).
"""

from __future__ import annotations

import re

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.sqltypes import UnsupportedSql

STATE_TTL = "table.exec.state.ttl"
SETTINGS = (STATE_TTL,)
# Flink's TimeUtils units, long and short forms
UNITS_MS = {"ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1,
            "s": 1000, "sec": 1000, "secs": 1000, "second": 1000, "seconds": 1000,
            "min": 60_000, "m": 60_000, "minute": 60_000, "minutes": 60_000,
            "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
            "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}
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
        ttl = duration_ms(value)
    except ValueError:
        raise UnsupportedSql(f"SET {key!r} = {value!r} is not a duration; supported: a number and a unit "
                             "(ms, s, min, h, d), e.g. '1 h'; '0' keeps state forever") from None
    if ttl > 0:
        # Dropping idle keys needs a TTL on the operators' state (UpsertJoin's rows per side,
        # GroupAggregate's members and last result), which they do not have yet: refused, not ignored.
        raise UnsupportedSql(f"SET {key!r} = {value!r} is not supported yet: the pipeline's state has no TTL; "
                             "supported: '0' (state kept for every key, Flink's default)")
    settings[key] = value
