"""The event-time temporal join ``FOR SYSTEM_TIME AS OF`` and the DDL's ``WATERMARK FOR``, planned (pure).

Flink's event-time temporal join, on upsert tables::

    CREATE TABLE orders (…, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '5' SECOND, PRIMARY KEY (id) …)
    CREATE TABLE users (…, eventTime TIMESTAMP(3) METADATA, WATERMARK FOR eventTime AS eventTime, …)
    INSERT INTO t SELECT … FROM orders o [LEFT] JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON o.user_id = u.id

joins each row of the driving (probe) table with the version of the versioned table's row whose
key is the join value, current at the driving row's time (the newest version at or before it, a
tombstone meaning none), once the watermark passes that time: INNER drops a row without one, LEFT
pads it with NULLs. Several temporal joins may follow one another, each AS OF the driving row's
time (``… JOIN users FOR SYSTEM_TIME AS OF o.ts AS u ON … JOIN items FOR SYSTEM_TIME AS OF o.ts
AS i ON …``: the order with its user and its item as of its time, as the job's event time).

:func:`build_watermark` reads the DDL's clause, :func:`plan_temporal_join` checks the joins and
gives their :class:`Temporal`; pipeline/sql/temporal_stream.py runs it. Every table needs a
watermark on a TIMESTAMP(3) column (JSON text, e.g. ``"2024-05-01 12:00:00.000"``) or the
``eventTime`` METADATA column, the AS OF column must be the driving table's, and each ON must
equate a column of it with its versioned table's PRIMARY KEY; anything else (a regular join
beside a temporal one, a table joined twice) is refused with one line naming the clause.
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
            "v.<v's PRIMARY KEY> [[LEFT] JOIN w FOR SYSTEM_TIME AS OF t.<…> ON t.col2 = w.<…> …] [WHERE …] "
            "[GROUP BY … [HAVING …]], every table with a WATERMARK FOR")
UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000}


@dataclass(frozen=True)
class VersionedJoin:
    """One ``JOIN v FOR SYSTEM_TIME AS OF``: the versioned table is the plan's ``sides[side]``."""

    side: int
    join_column: str  # the driving table's column equated with the versioned table's primary key
    time: str  # the versioned table's time attribute (its WATERMARK FOR column)
    inner: bool  # [INNER] JOIN: a row without a version is dropped (LEFT: padded with NULLs)


@dataclass(frozen=True)
class Temporal:
    """A plan's temporal joins: the driving table (sides[0]) AS OF ``left_time``, then each
    versioned table in the order written."""

    left_time: str  # the driving table's time attribute (its WATERMARK FOR column)
    joins: tuple[VersionedJoin, ...]

    def fingerprint(self) -> dict | list:
        """What the plan's fingerprint holds (pipeline/sql/runner.py): one join as it always has,
        so a one-join pipeline's checkpoint stays its own."""
        described = [{"join_column": j.join_column, "left_time": self.left_time, "right_time": j.time,
                      "inner": j.inner} for j in self.joins]
        return described[0] if len(described) == 1 else described


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
    """Check a SELECT's temporal joins and add their versioned tables to ``sides`` and ``aliases``."""
    from pipeline.sql.settings import state_ttl_ms

    joins = select.args.get("joins") or []
    for join in joins:
        if join.this.args.get("version") is None:
            text = join.sql(dialect=Flink).strip()
            raise UnsupportedSql(f"{text!r}: a regular JOIN beside a temporal join is not supported; supported: "
                                 f"{TEMPORAL}")
    if state_ttl_ms(tuple(settings.items())):
        raise UnsupportedSql(f"SET 'table.exec.state.ttl' with a temporal join ({joins[0].sql(dialect=Flink).strip()!r}) "
                             "is not supported: its versions are dropped as the watermark passes them; supported: no "
                             "state TTL")
    driving = sides[0]
    if driving.watermark is None:
        raise UnsupportedSql(f"{joins[0].sql(dialect=Flink).strip()!r}: table {driving.name!r} has no WATERMARK FOR; "
                             f"a temporal join needs one on every table ({WATERMARKS})")
    planned = tuple(_plan_one(join, tables, sides, aliases) for join in joins)
    return Temporal(driving.watermark[0], planned)


def _plan_one(join: exp.Join, tables: dict, sides: list, aliases: dict[str, int]) -> VersionedJoin:
    """One ``JOIN v FOR SYSTEM_TIME AS OF t.time ON t.col = v.key``, checked; v becomes the next side."""
    from pipeline.sql.plan import _table, resolve_column

    text = join.sql(dialect=Flink).strip()
    left = join.side == "LEFT" and join.kind in ("", "OUTER")
    inner = not join.side and join.kind in ("", "INNER")
    version = join.this.args["version"]
    if not (left or inner) or join.method or version.name.upper() != "TIMESTAMP" or version.text("kind") != "AS OF":
        raise UnsupportedSql(f"{text!r} is not supported; supported: {TEMPORAL}")
    driving, versioned = sides[0], _table(tables, join.this.name, "JOIN")
    if versioned.name.lower() == driving.name.lower():
        raise UnsupportedSql(f"{text!r}: table {driving.name!r} is joined to itself; supported: {TEMPORAL}")
    if any(versioned.name.lower() == other.name.lower() for other in sides[1:]):
        raise UnsupportedSql(f"{text!r}: table {versioned.name!r} is joined twice; supported: each table once")
    if versioned.watermark is None:
        raise UnsupportedSql(f"{text!r}: table {versioned.name!r} has no WATERMARK FOR; a temporal join needs one on "
                             f"every table ({WATERMARKS})")
    side = len(sides)
    sides.append(versioned)
    scope = {**aliases, join.this.alias_or_name.lower(): side, versioned.name.lower(): side}
    as_of = version.expression
    # the AS OF column may be a METADATA column (eventTime): resolved here, not as a SELECT's column
    of = (scope.get(as_of.table.lower()) if as_of.table else 0) if isinstance(as_of, exp.Column) else None
    wanted = f"supported: AS OF {driving.name}.{driving.watermark[0]} (its WATERMARK FOR column)"
    shown = as_of.sql(dialect=Flink)
    if of is not None and not any(c.name.lower() == as_of.name.lower() for c in sides[of].columns):
        raise UnsupportedSql(f"{text!r}: AS OF {shown!r}: table {sides[of].name!r} has no column {as_of.name!r}; "
                             f"{wanted}")
    if of != 0 or as_of.name.lower() != driving.watermark[0].lower():
        raise UnsupportedSql(f"{text!r}: AS OF {shown!r} is not the time attribute of {driving.name}; {wanted}")
    condition = join.args.get("on")
    ends = ([resolve_column(end, sides, scope, "ON") for end in (condition.this, condition.expression)]
            if isinstance(condition, exp.EQ) else [])
    if sorted(s for s, _ in ends) != [0, side] or sorted(ends)[1][1].lower() != versioned.primary_key.lower():
        raise UnsupportedSql(f"{text!r}: ON must equate one column of {driving.name} with the PRIMARY KEY of "
                             f"{versioned.name} ({versioned.primary_key!r}: the key whose versions are looked up); "
                             f"supported: {TEMPORAL}")
    join_column = sorted(ends)[0][1]
    if driving.column(join_column).spark_type != "string":
        raise UnsupportedSql(f"{text!r}: {driving.name}.{join_column} is {driving.column(join_column).sql_type} but "
                             f"{versioned.name}.{versioned.primary_key} is STRING; CAST is not supported in ON: "
                             f"declare {join_column} STRING")
    aliases.update(scope)
    return VersionedJoin(side, join_column, versioned.watermark[0], inner)


def refuse_timestamp_columns(plan) -> None:
    """A TIMESTAMP(3) payload column is read only in a temporal join (JSON text parsed by
    pipeline/sql/temporal_stream.py); elsewhere the envelope has no such type. A query that does
    not read it (a count over the orders of a temporal join's statement set) may have it."""
    from pipeline.sql.envelope import used_columns

    for side, name in used_columns(plan):
        table = plan.sides[side]
        column = table.column(name)
        if column.spark_type == "timestamp" and not column.metadata:
            raise UnsupportedSql(f"table {table.name!r} column {column.name!r} is TIMESTAMP(3), read only in a "
                                 f"temporal join ({TEMPORAL}); declare it STRING to read it elsewhere")
