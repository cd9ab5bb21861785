"""SQL statements → a pipeline plan: what the seed's Flink SQL subset means, checked at start.

Pure: :func:`build_plan` parses the statements with sqlglot (the Flink dialect of
pipeline/sql/dialect.py) and returns a :class:`Plan`, or raises :class:`UnsupportedSql` with one
line naming the clause and what is supported. Nothing here touches Spark or Pulsar.

The supported subset (DESIGN.md §11):

- ``CREATE TABLE name (col TYPE, …, [col TYPE METADATA [FROM '…'] [VIRTUAL]], PRIMARY KEY (k) NOT ENFORCED)
  WITH ('connector' = 'upsert-pulsar', 'topic' = …, 'key.format' = 'raw', 'value.format' = 'json', …)``:
  a table over an upsert topic: its latest row per primary key (the message key); an empty payload
  deletes the key. Payload types: STRING/VARCHAR/CHAR, INT/INTEGER/SMALLINT/TINYINT, BIGINT,
  DOUBLE/FLOAT/DECIMAL, BOOLEAN. METADATA columns (pipeline/sql/metadata.py) are read in the SELECT
  and WHERE of a query without GROUP BY; any other use, and writing one, is refused.
- an ``INSERT INTO target (cols) SELECT …`` (pipeline/sql/script.py: several make a statement set;
  views are merged in first, pipeline/sql/views.py) of one of two shapes:
  - ``SELECT g…, COUNT(1|*|x) | SUM(x) | MIN(x) | MAX(x) | AVG(x) | expressions of them … FROM t
    [JOIN …]… [WHERE …] GROUP BY g… [HAVING …]`` (the target's primary key is the group column,
    or one expression of every group column; over JOINs, the joined rows are grouped);
  - ``SELECT expressions FROM t [a] [LEFT [OUTER] | [INNER] JOIN t2 [b] ON a.pk = b.pk]… [WHERE …]``
    (each join on the two tables' primary keys, or of a column of a table before it to the joined
    table's primary key, a foreign-key join, in any N-way chain: pipeline/sql/foreign_key.py; or one
    event-time temporal join, ``[LEFT] JOIN t2 FOR SYSTEM_TIME AS OF a.time``: pipeline/sql/temporal.py;
    WHERE's conditions on the driving table run before the operators, the others on the joined
    rows, with an inner join's "its side has a row"; the target's primary key is the driving table's).
  Expressions are translated to Spark SQL (pipeline/sql/expressions.py, pipeline/sql/select.py)
  and typed: a value that does not fit its target column is refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.metadata import METADATA_READ, metadata_problem
from pipeline.sql.sqltypes import SPARK_NAMES, UnsupportedSql
from pipeline.sql.tables import Column, Table, build_table

if TYPE_CHECKING:
    from pipeline.sql.select import AggregateCall, Derived
    from pipeline.sql.temporal import Temporal

AGGREGATES = {exp.Count: "COUNT", exp.Sum: "SUM", exp.Min: "MIN", exp.Max: "MAX"}
SHAPES = ("SELECT … FROM t [JOIN …] [WHERE …] GROUP BY … [HAVING …] with COUNT, SUM, MIN, MAX, AVG; "
          "or SELECT … FROM t [[LEFT|INNER] JOIN t2 ON t.pk = t2.pk …] [WHERE …]")
JOINS = "LEFT [OUTER] JOIN or [INNER] JOIN table ON a.pk = b.pk (or ON a.fk = b.pk)"
__all__ = ["UnsupportedSql", "build_plan", "build_table", "Plan", "Table", "Column", "Output", "field_name", "present_field",
           "resolve_column"]


def field_name(side: int, column: str) -> str:
    """The envelope's column of a table's column: ``s<side>_<column>``."""
    return f"s{side}_{column}"


def present_field(side: int) -> str:
    """The column that is TRUE on an inner-joined side's rows (``present<side>``), kept in
    UpsertJoin's state with the side's row: NULL in a joined row that side is missing from."""
    return f"present{side}"


@dataclass(frozen=True)
class Output:
    """One target column and where its value comes from."""

    name: str  # the target's column
    side: int | None  # the source table (index into Plan.sides) of a plain column
    column: str | None  # its column in that table
    aggregate: str | None = None  # COUNT, SUM, MIN, MAX
    argument: str | None = None  # the aggregate's column (None: COUNT(*) / COUNT(1))
    expression: str | None = None  # anything else: Spark SQL over the query's output columns
    spark_type: str | None = None  # the expression's type
    fields: tuple[str, ...] = ()  # in an aggregate: the group and aggregate columns it reads


@dataclass(frozen=True)
class Plan:
    """A pipeline: source tables (the driving one first), the target, and what fills it."""

    kind: str  # "aggregate" or "join"
    sides: tuple[Table, ...]
    target: Table
    outputs: tuple[Output, ...]
    group_by: tuple[str, ...]  # plain GROUP BY columns of sides[0] (aggregate only)
    statements: tuple[str, ...]
    where: str | None = None  # Spark SQL over the driving table's envelope columns, before the operators
    where_joined: str | None = None  # WHERE's conjuncts that read a joined table: after UpsertJoin
    having: str | None = None  # Spark SQL over GroupAggregate's output
    derived: tuple["Derived", ...] = ()  # columns computed on the driving table's rows
    aggregates: tuple["AggregateCall", ...] = ()  # what GroupAggregate computes
    group_fields: tuple[str, ...] = ()  # every group's envelope column (s0_x or d<n>)
    reads: tuple[tuple[int, str], ...] = ()  # (side, column) the expressions read
    group_labels: tuple[str, ...] = ()  # the GROUP BY items as written
    inner: tuple[int, ...] = ()  # the sides joined by an [INNER] JOIN: a result row needs their row
    settings: tuple[tuple[str, str], ...] = ()  # the script's SET 'key' = 'value' (pipeline/sql/settings.py)
    foreign_key: str | None = None  # a foreign-key join: the first one's column (of the table foreign_keys names)
    foreign_keys: tuple[tuple[int, int, str], ...] = ()  # each foreign-key join: (joined side, side, its column)
    temporal: "Temporal | None" = None  # FOR SYSTEM_TIME AS OF: pipeline/sql/temporal.py

    @property
    def derived_on_joined_rows(self) -> bool:
        """GROUP BY over a JOIN: the derived columns (groups, aggregates' arguments) are computed
        on UpsertJoin's joined rows, not kept with the driving table's rows."""
        return self.kind == "aggregate" and len(self.sides) > 1

    @property
    def key_output(self) -> Output:
        return next(o for o in self.outputs if o.name.lower() == self.target.primary_key.lower())


def split_statements(text: str) -> list[str]:
    """The statements of a script as written, split at sqlglot's semicolon tokens (never inside
    a string), without leading comment lines."""
    from sqlglot.tokens import TokenType

    cuts = [token.end + 1 for token in Flink().tokenize(text) if token.token_type == TokenType.SEMICOLON]
    pieces, start = [], 0
    for cut in cuts + [len(text)]:
        piece = "\n".join(line for line in text[start:cut].rstrip().rstrip(";").splitlines()
                          if not line.lstrip().startswith("--")).strip()
        if piece:
            pieces.append(piece)
        start = cut
    return pieces


def build_plan(text: str, topic_map: dict[str, str] | None = None) -> Plan:
    """The plan of a script of one INSERT; ``topic_map`` maps a table name (or a topic) to another
    topic. A script of several INSERTs (a statement set) is pipeline/sql/script.py build_pipeline's."""
    from pipeline.sql.script import build_pipeline

    plans = build_pipeline(text, topic_map)
    if len(plans) != 1:
        raise UnsupportedSql(f"{len(plans)} INSERT INTO statements where one plan is asked for; "
                             "build_pipeline plans a statement set")
    return plans[0]


def build_query(insert: exp.Insert, tables: dict[str, Table], statements: tuple[str, ...],
                views: dict[str, exp.Select] | None = None, settings: dict[str, str] | None = None) -> Plan:
    from pipeline.sql.select import Query
    from pipeline.sql.views import inline_views
    target = _table(tables, insert.this.this.name if isinstance(insert.this, exp.Schema) else insert.this.name, "INSERT INTO")
    names = [i.name for i in insert.this.expressions] if isinstance(insert.this, exp.Schema) else [
        c.name for c in target.payload_columns]
    select = insert.expression
    if not isinstance(select, exp.Select):
        raise UnsupportedSql(f"INSERT INTO {target.name} {select.key.upper()} is not supported; supported: {SHAPES}")
    select = inline_views(select, views or {})
    for clause, words in (("order", "ORDER BY"), ("limit", "LIMIT"), ("qualify", "QUALIFY"), ("distinct", "DISTINCT"),
                          ("with_", "WITH")):
        if select.args.get(clause):
            raise UnsupportedSql(f"{words} is not supported in INSERT INTO {target.name}; supported: {SHAPES}")
    for name in names:
        if target.column(name).metadata:
            raise UnsupportedSql(f"INSERT INTO {target.name}: column {target.column(name).name!r} is a METADATA column; "
                                 "writing METADATA is not supported; supported: payload columns")
    if len(names) != len(select.expressions):
        raise UnsupportedSql(f"INSERT INTO {target.name} names {len(names)} columns but SELECT gives "
                             f"{len(select.expressions)}")
    driving = select.args["from_"].this
    if not isinstance(driving, exp.Table):
        raise UnsupportedSql(f"FROM {driving.sql(dialect=Flink)} is not supported; supported: FROM a table")
    joins = select.args.get("joins") or []
    temporal_first = bool(joins) and isinstance(joins[0].this, exp.Table) and joins[0].this.args.get("version") is not None
    if driving.args.get("version") is not None or (not temporal_first and any(
            j.this.args.get("version") is not None for j in joins[1:])):
        # refused, not run as a regular join: the versions would be today's, not as of the time
        from pipeline.sql.temporal import TEMPORAL
        where = "FROM" if driving.args.get("version") else "a JOIN after a regular JOIN"
        raise UnsupportedSql(f"FOR SYSTEM_TIME AS OF on {where} is not supported; supported: {TEMPORAL}")
    sides = [_table(tables, driving.name, "FROM")]
    aliases = {(driving.alias_or_name).lower(): 0, driving.name.lower(): 0}
    inner, foreign_keys, temporal = [], [], None
    if temporal_first:
        from pipeline.sql.temporal import plan_temporal_join
        temporal = plan_temporal_join(select, tables, sides, aliases, settings or {})
    for join in joins if temporal is None else []:
        side, referencing = _join(join, tables, sides, aliases)
        if join.side != "LEFT":
            inner.append(side)
        aliases[join.this.alias_or_name.lower()] = side
        aliases[join.this.name.lower()] = side
        if referencing:
            foreign_keys.append((side, *referencing))
    group = select.args.get("group")
    query = Query(sides, aliases, metadata=not group)
    if temporal is not None:  # the joins' and the times' columns, which no expression may read
        for n, join in enumerate(temporal.joins):  # in this order: a one-join plan's fingerprint is as it was
            query.reads += [(0, join.join_column), *([(0, temporal.left_time)] if n == 0 else []),
                            (join.side, join.time), (join.side, sides[join.side].primary_key)]
    where = select.args.get("where")
    where_sql, where_joined = query.where(where.this) if where else (None, None)
    query.reads += [(side, column) for _, side, column in foreign_keys if (side, column) not in query.reads]
    # an inner join as Flink means it on upsert tables: the joined row is there while each inner
    # side has its row, and retracted (resolve_changes, as a WHERE on a joined table) when one goes;
    # a foreign-key join's operator decides that itself (pipeline/sql/foreign_key.py)
    referenced = {side for side, _, _ in foreign_keys}
    present = ([f"`{present_field(side)}`" for side in inner if side not in referenced]
               + ([where_joined] if where_joined else []))
    where_joined = None if not present else present[0] if len(present) == 1 else f"({' AND '.join(present)})"
    having = select.args.get("having")
    if having and not group:
        raise UnsupportedSql(f"HAVING without GROUP BY is not supported in INSERT INTO {target.name}; supported: {SHAPES}")
    if group:
        outputs = query.aggregate_outputs(names, select.expressions, group.expressions)
        having_sql = query.condition(having.this, "HAVING", query.aggregate_scope("HAVING")) if having else None
    else:
        outputs, having_sql = query.row_outputs(names, select.expressions), None
    plan = Plan("aggregate" if group else "join", tuple(sides), target, tuple(outputs), tuple(query.group_by), statements,
                where=where_sql, where_joined=where_joined, having=having_sql, derived=tuple(query.derived), aggregates=tuple(query.aggregates),
                group_fields=tuple(query.group_fields), reads=tuple(query.reads),
                group_labels=tuple(g.sql(dialect=Flink) for g in (group.expressions if group else [])), inner=tuple(inner),
                settings=tuple(sorted((settings or {}).items())), temporal=temporal,
                foreign_key=foreign_keys[0][2] if foreign_keys else None, foreign_keys=tuple(foreign_keys))
    if temporal is None:
        from pipeline.sql.temporal import refuse_timestamp_columns
        refuse_timestamp_columns(plan)
    _check_key(plan)
    _check_types(plan)
    return plan


# Which value types a target column of each type holds: its own, and the narrower numbers.
HOLDS = {"string": {"string"}, "boolean": {"boolean"}, "int": {"int"}, "bigint": {"int", "bigint"},
         "double": {"int", "bigint", "double"}}


def output_type(plan: Plan, output: Output) -> str:
    """The Spark type of what fills one target column: a column's own, COUNT's bigint, SUM's
    bigint (of whole numbers) or double, MIN's and MAX's their column's."""
    if output.expression is not None:
        return output.spark_type
    if output.aggregate == "COUNT":
        return "bigint"
    source = plan.sides[0 if output.aggregate else output.side].column(output.argument or output.column).spark_type
    if output.aggregate == "SUM":
        return "double" if source == "double" else "bigint"
    return source


def _check_types(plan: Plan) -> None:
    """Refuse a SELECT whose value does not fit its target column (SUM of a DOUBLE into a BIGINT):
    found at --check, not on every batch."""
    for output in plan.outputs:
        target = plan.target.column(output.name)
        given = output_type(plan, output)
        if given != "null" and given not in HOLDS.get(target.spark_type or "", set()):
            source = (f"{output.aggregate}(…)" if output.aggregate else output.column if output.expression is None
                      else "its expression")
            # a METADATA type (TIMESTAMP(3), MAP) is no target column's
            declare = f", or declare the target column as {given.upper()}" if given in HOLDS else ""
            raise UnsupportedSql(f"INSERT INTO {plan.target.name}: column {target.name!r} is {target.sql_type} but "
                                 f"{source} gives {SPARK_NAMES.get(given, given.upper())}; CAST it to {target.sql_type}"
                                 f"{declare}")


def _table(tables: dict[str, Table], name: str, clause: str) -> Table:
    if name.lower() not in tables:
        raise UnsupportedSql(f"{clause} {name}: no such table; CREATE TABLE it first (tables: {sorted(tables)})")
    return tables[name.lower()]


def resolve_column(column: exp.Expression, sides: list[Table], aliases: dict[str, int], clause: str,
                   metadata: bool = False) -> tuple[int, str]:
    """(side index, column name) of a column reference; a METADATA column only where ``metadata``."""
    if not isinstance(column, exp.Column):
        raise UnsupportedSql(f"{clause} {column.sql(dialect=Flink)!r} is not supported; supported: plain columns")
    if column.table:
        if column.table.lower() not in aliases:
            raise UnsupportedSql(f"{clause} {column.sql(dialect=Flink)!r}: no table or alias {column.table!r}")
        side = aliases[column.table.lower()]
    else:
        found = [i for i, table in enumerate(sides) if any(c.name.lower() == column.name.lower() for c in table.columns)]
        if len(found) != 1:
            raise UnsupportedSql(f"{clause} column {column.name!r} is {'ambiguous' if found else 'unknown'}; "
                                 "qualify it with its table")
        side = found[0]
    declared = sides[side].column(column.name)
    if declared.metadata and not (metadata and clause in ("SELECT", "WHERE")):
        raise UnsupportedSql(f"{clause} {column.sql(dialect=Flink)!r} is a METADATA column; supported there: payload "
                             f"columns ({METADATA_READ})")
    problem = declared.metadata and metadata_problem(declared.metadata_key, declared.sql_type)
    if problem:
        raise UnsupportedSql(f"{clause} {column.sql(dialect=Flink)!r} is {problem}")
    return side, declared.name


def _join(join: exp.Join, tables: dict[str, Table], sides: list[Table],
          aliases: dict[str, int]) -> tuple[int, tuple[int, str] | None]:
    """(the joined table's side index, the (side, column) of a foreign-key join's key or None)."""
    text = join.sql(dialect=Flink)
    left = join.side == "LEFT" and join.kind in ("", "OUTER")
    inner = not join.side and join.kind in ("", "INNER")
    if not (left or inner) or join.method or not isinstance(join.this, exp.Table):
        raise UnsupportedSql(f"{text.strip()!r} is not supported; supported: {JOINS}")
    table = _table(tables, join.this.name, "LEFT JOIN" if left else "JOIN")
    if any(side.name.lower() == table.name.lower() for side in sides):
        # one table's rows would meet themselves in one keyed state: refused rather than write nothing
        raise UnsupportedSql(f"{text.strip()!r}: table {table.name!r} is joined to itself; supported: "
                             "JOINs of different tables")
    sides.append(table)
    index = len(sides) - 1
    scope = {**aliases, join.this.alias_or_name.lower(): index, table.name.lower(): index}
    condition = join.args.get("on")
    if not isinstance(condition, exp.EQ):
        raise UnsupportedSql(f"{text.strip()!r}: ON must be one equality of primary keys; supported: {JOINS}")
    ends = sorted((resolve_column(condition.this, sides, scope, "ON"), resolve_column(condition.expression, sides, scope, "ON")))
    (left, left_col), (right, right_col) = ends
    if left == right or right != index or right_col.lower() != table.primary_key.lower():
        before = " or ".join(side.name for side in sides[:-1])
        raise UnsupportedSql(f"{text.strip()!r}: ON must equate a column of {before} with "
                             f"{table.name}.{table.primary_key}; supported: JOINs on the driving table's "
                             "primary key or on a foreign key of it or of a table joined before")
    if left == 0 and left_col.lower() == sides[0].primary_key.lower():
        return index, None
    from pipeline.sql.foreign_key import check_foreign_key_types
    check_foreign_key_types(text.strip(), sides[left], left_col, table)
    return index, (left, left_col)


def _check_key(plan: Plan) -> None:
    key = next((o for o in plan.outputs if o.name.lower() == plan.target.primary_key.lower()), None)
    if plan.kind == "aggregate":
        # each group one key: a group column, or one expression of every group column
        ok = key is not None and key.aggregate is None and set(key.fields) == set(plan.group_fields)
        labels = ", ".join(plan.group_labels)
        wanted = (f"the GROUP BY column ({labels})" if len(plan.group_fields) == 1 else
                  f"the GROUP BY columns ({labels}), all in one value such as CONCAT(a, ':', b)")
    else:
        ok = (key is not None and key.expression is None and key.side == 0
              and key.column.lower() == plan.sides[0].primary_key.lower())
        wanted = f"{plan.sides[0].name}.{plan.sides[0].primary_key}"
    if not ok:
        raise UnsupportedSql(f"INSERT INTO {plan.target.name}: its PRIMARY KEY {plan.target.primary_key!r} must be "
                             f"filled from {wanted}, so each result row has one key")
