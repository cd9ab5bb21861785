"""The event-time temporal join ``FOR SYSTEM_TIME AS OF`` and the DDL's ``WATERMARK FOR``, planned (pure).

Flink's event-time temporal join, on upsert tables::

    CREATE TABLE orders (…, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '5' SECOND, PRIMARY KEY (id) …)
    CREATE TABLE users (…, eventTime TIMESTAMP(3) METADATA, WATERMARK FOR eventTime AS eventTime, …)
    INSERT INTO t SELECT … FROM orders o [LEFT] JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id

joins each row of the driving (probe) table with the version of the versioned table's row whose
key is the join value, current at the driving row's time (the newest version at or before it, a
tombstone meaning none), once the watermark passes that time: INNER drops a row without one, LEFT
pads it with NULLs. :func:`build_watermark` reads the DDL's clause, :func:`plan_temporal_join`
checks the join and gives its :class:`Temporal`; pipeline/sql/temporal_stream.py runs it. Both
tables need a watermark on a TIMESTAMP(3) column (JSON text, e.g. ``"2024-05-01 12:00:00.000"``)
or the ``eventTime`` METADATA column, the AS OF column must be the driving table's, and ON must
equate a column of it with the versioned table's PRIMARY KEY; anything else is refused with one
line naming the clause.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.sqltypes import UnsupportedSql

WATERMARKS = ("WATERMARK FOR col AS col, or col - INTERVAL 'n' SECOND (MILLISECOND, MINUTE, HOUR), on a "
              "TIMESTAMP(3) column or the eventTime METADATA column")
TEMPORAL = ("SELECT … FROM t [LEFT] JOIN v FOR SYSTEM_TIME AS OF t.<t's WATERMARK column> [AS a] ON t.col = "
            "v.<v's PRIMARY KEY> [WHERE …] [GROUP BY … [HAVING …]], both tables with a WATERMARK FOR")
UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000}


@dataclass(frozen=True)
class Temporal:
    """A planned temporal join: sides[0] (driving) AS OF its time column, sides[1] (versioned)."""

    join_column: str  # the driving table's column equated with sides[1]'s primary key
    left_time: str  # the driving table's time attribute (its WATERMARK FOR column)
    right_time: str  # the versioned table's
    inner: bool  # [INNER] JOIN: a row without a version is dropped (LEFT: padded with NULLs)


def build_watermark(table, constraint: exp.WatermarkColumnConstraint) -> tuple[str, int]:
    """(column, delay in ms) of a table's ``WATERMARK FOR col AS col [- INTERVAL 'n' unit]``."""
    text = constraint.sql(dialect=Flink)
    column, strategy = constraint.this, constraint.expression
    delay = 0
    if isinstance(strategy, exp.Sub) and isinstance(strategy.expression, exp.Interval):
        delay = _interval_ms(strategy.expression)
        strategy = strategy.this
    if (delay is None or not isinstance(column, exp.Column) or not isinstance(strategy, exp.Column)
            or strategy.name.lower() != column.name.lower()):
        raise UnsupportedSql(f"table {table.name!r}: {text!r} is not supported; supported: {WATERMARKS}")
    if not any(c.name.lower() == column.name.lower() for c in table.columns):
        raise UnsupportedSql(f"table {table.name!r}: {text!r}: no column {column.name!r}; supported: {WATERMARKS}")
    declared = table.column(column.name)
    if not (declared.spark_type == "timestamp" and (not declared.metadata or declared.metadata_key == "eventTime")):
        kind = f"{declared.sql_type}{' METADATA' if declared.metadata else ''}"
        raise UnsupportedSql(f"table {table.name!r}: {text!r} is on column {declared.name!r} ({kind}); "
                             f"supported: {WATERMARKS}")
    return declared.name, delay


def _interval_ms(interval: exp.Interval) -> int | None:
    unit = (interval.unit.name if interval.unit else "").upper().rstrip("S")
    try:
        amount = Decimal(interval.this.name) if isinstance(interval.this, exp.Literal) else None
    except InvalidOperation:
        amount = None
    if unit not in UNIT_MS or amount is None or amount < 0:
        return None
    return int(amount * UNIT_MS[unit])


def plan_temporal_join(select: exp.Select, tables: dict, sides: list, aliases: dict[str, int],
                       settings: dict[str, str]) -> Temporal:
    """Check a SELECT's temporal join and add its versioned table to ``sides`` and ``aliases``."""
    from pipeline.sql.plan import _table, resolve_column
    from pipeline.sql.settings import state_ttl_ms

    joins = select.args.get("joins") or []
    join = joins[0]
    text = join.sql(dialect=Flink).strip()
    if len(joins) != 1:
        raise UnsupportedSql(f"{text!r}: a temporal join with another JOIN is not supported; supported: {TEMPORAL}")
    if state_ttl_ms(tuple(settings.items())):
        raise UnsupportedSql(f"SET 'table.exec.state.ttl' with a temporal join ({text!r}) is not supported: its "
                             "versions are dropped as the watermark passes them; supported: no state TTL")
    left = join.side == "LEFT" and join.kind in ("", "OUTER")
    inner = not join.side and join.kind in ("", "INNER")
    version = join.this.args["version"]
    if not (left or inner) or join.method or version.name.upper() != "TIMESTAMP" or version.text("kind") != "AS OF":
        raise UnsupportedSql(f"{text!r} is not supported; supported: {TEMPORAL}")
    driving, versioned = sides[0], _table(tables, join.this.name, "JOIN")
    if versioned.name.lower() == driving.name.lower():
        raise UnsupportedSql(f"{text!r}: table {driving.name!r} is joined to itself; supported: {TEMPORAL}")
    for table in (driving, versioned):
        if table.watermark is None:
            raise UnsupportedSql(f"{text!r}: table {table.name!r} has no WATERMARK FOR; a temporal join needs one on "
                                 f"both tables ({WATERMARKS})")
    sides.append(versioned)
    scope = {**aliases, join.this.alias_or_name.lower(): 1, versioned.name.lower(): 1}
    as_of = version.expression
    # the AS OF column may be a METADATA column (eventTime): resolved here, not as a SELECT's column
    side = (scope.get(as_of.table.lower()) if as_of.table else 0) if isinstance(as_of, exp.Column) else None
    wanted = f"supported: AS OF {driving.name}.{driving.watermark[0]} (its WATERMARK FOR column)"
    shown = as_of.sql(dialect=Flink)
    if side is not None and not any(c.name.lower() == as_of.name.lower() for c in sides[side].columns):
        raise UnsupportedSql(f"{text!r}: AS OF {shown!r}: table {sides[side].name!r} has no column {as_of.name!r}; "
                             f"{wanted}")
    if side != 0 or as_of.name.lower() != driving.watermark[0].lower():
        raise UnsupportedSql(f"{text!r}: AS OF {shown!r} is not the time attribute of {driving.name}; {wanted}")
    condition = join.args.get("on")
    ends = ([resolve_column(end, sides, scope, "ON") for end in (condition.this, condition.expression)]
            if isinstance(condition, exp.EQ) else [])
    if sorted(s for s, _ in ends) != [0, 1] or sorted(ends)[1][1].lower() != versioned.primary_key.lower():
        raise UnsupportedSql(f"{text!r}: ON must equate one column of {driving.name} with the PRIMARY KEY of "
                             f"{versioned.name} ({versioned.primary_key!r}: the key whose versions are looked up); "
                             f"supported: {TEMPORAL}")
    join_column = sorted(ends)[0][1]
    if driving.column(join_column).spark_type != "string":
        raise UnsupportedSql(f"{text!r}: {driving.name}.{join_column} is {driving.column(join_column).sql_type} but "
                             f"{versioned.name}.{versioned.primary_key} is STRING; CAST is not supported in ON: "
                             f"declare {join_column} STRING")
    aliases.update(scope)
    return Temporal(join_column, driving.watermark[0], versioned.watermark[0], inner)


def refuse_timestamp_columns(sides) -> None:
    """A TIMESTAMP(3) payload column is read only as a temporal join's time attribute (JSON text
    parsed by pipeline/sql/temporal_stream.py); elsewhere the envelope has no such type."""
    for table in sides:
        for column in table.payload_columns:
            if column.spark_type == "timestamp":
                raise UnsupportedSql(f"table {table.name!r} column {column.name!r} is TIMESTAMP(3), read only in a "
                                     f"temporal join ({TEMPORAL}); declare it STRING to read it elsewhere")
