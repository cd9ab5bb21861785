"""A SELECT's WHERE, outputs, GROUP BY and HAVING → Spark SQL over the operators' columns (pure).

:class:`Query` gathers, while pipeline/sql/plan.py builds a plan, what the query reads and computes:

- WHERE and the projections as Spark SQL over the envelope's ``s<side>_<column>`` columns;
- the :class:`Derived` columns (GROUP BY expressions, aggregates' arguments), computed by Spark
  on the driving table's rows before the operators and kept by UpsertJoin with their row, or,
  for a GROUP BY over a JOIN, on UpsertJoin's joined rows (``Plan.derived_on_joined_rows``);
- the :class:`AggregateCall`s GroupAggregate computes (AVG is SUM and COUNT, divided by Spark;
  COUNT(DISTINCT x) is its COUNT_DISTINCT);
- HAVING and the aggregate outputs as Spark SQL over GroupAggregate's output columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.expressions import NUMERIC, Typed, UnsupportedSql, translate
from pipeline.sql.plan import AGGREGATES, SHAPES, Output, Table, field_name, resolve_column


@dataclass(frozen=True)
class Derived:
    """A column computed by Spark on the driving table's rows, before the operators (a GROUP BY
    expression, an aggregate's argument); UpsertJoin keeps it with the row."""

    name: str  # d0, d1, …
    sql: str  # Spark SQL over the envelope's s0_* columns
    spark_type: str


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate GroupAggregate computes: ``function`` of the ``input`` column ("" for COUNT(*))."""

    function: str  # COUNT, COUNT_DISTINCT, SUM, MIN, MAX
    input: str
    name: str  # its column in GroupAggregate's output


class Query:
    """What one SELECT reads and computes, gathered while its expressions are translated."""

    def __init__(self, sides: list[Table], aliases: dict[str, int], metadata: bool = False):
        self.sides, self.aliases = sides, aliases
        self.metadata = metadata  # METADATA columns readable (SELECT and WHERE without GROUP BY)
        self.reads: list[tuple[int, str]] = []
        self.derived: list[Derived] = []
        self.aggregates: list[AggregateCall] = []
        self.group_by: list[str] = []  # plain group columns
        self.group_fields: list[str] = []  # every group's envelope column (s0_x or d<n>)
        self.groups: dict[str, Typed] = {}  # a group's row-level Spark SQL -> its column
        self.fields_used: list[str] = []  # the query output columns the last aggregate-scope expression read

    def row_scope(self, clause: str):
        """Resolves columns of the tables to their envelope columns."""
        def resolve(node: exp.Expression) -> Typed | None:
            if isinstance(node, exp.Column):
                side, column = resolve_column(node, self.sides, self.aliases, clause, self.metadata)
                if (side, column) not in self.reads:
                    self.reads.append((side, column))
                return Typed(f"`{field_name(side, column)}`", self.sides[side].column(column).spark_type)
            if isinstance(node, exp.AggFunc):
                raise UnsupportedSql(f"{clause} {node.sql(dialect=Flink)!r}: an aggregate is not allowed there"
                                     + ("; use HAVING" if clause == "WHERE" else ""))
            return None
        return resolve

    def where(self, node: exp.Expression) -> tuple[str | None, str | None]:
        """WHERE as (its conjuncts on the driving table's columns, which run before the operators;
        the others, which run on the joined rows), each Spark SQL or None."""
        conjuncts = list(node.flatten()) if isinstance(node, exp.And) else [node]
        driving, joined = [], []
        for conjunct in conjuncts:
            sides = {resolve_column(c, self.sides, self.aliases, "WHERE", self.metadata)[0] for c in conjunct.find_all(exp.Column)}
            if sides <= {0}:
                driving.append(self.condition(conjunct, "WHERE", self.row_scope("WHERE")))
            else:
                joined.append(self.condition(conjunct, "WHERE", self.row_scope("WHERE")))
        return _all(driving), _all(joined)

    def condition(self, node: exp.Expression, clause: str, resolve) -> str:
        value = translate(node, resolve, clause)
        if value.type not in ("boolean", "null"):
            raise UnsupportedSql(f"{clause} {node.sql(dialect=Flink)!r} is {value.type.upper()}; supported: a BOOLEAN condition")
        return value.sql

    def row_value(self, node: exp.Expression, clause: str) -> Typed:
        """A driving-table expression as an envelope column: the column itself, or a Derived one."""
        value = translate(node, self.row_scope(clause), clause)
        if value.sql.startswith("`") and value.sql.endswith("`"):
            return value
        for derived in self.derived:
            if derived.sql == value.sql:
                return Typed(f"`{derived.name}`", derived.spark_type)
        self.derived.append(Derived(f"d{len(self.derived)}", value.sql, value.type))
        return Typed(f"`{self.derived[-1].name}`", value.type)

    def row_outputs(self, names: list[str], items: list[exp.Expression]) -> list[Output]:
        outputs = []
        for name, item in zip(names, items):
            inner = item.this if isinstance(item, exp.Alias) else item
            if type(inner) in AGGREGATES or isinstance(inner, exp.Avg):
                raise UnsupportedSql(f"{inner.sql(dialect=Flink)} without GROUP BY is not supported; supported: {SHAPES}")
            if isinstance(inner, exp.Column):
                side, column = resolve_column(inner, self.sides, self.aliases, "SELECT", self.metadata)
                outputs.append(Output(name, side, column))
            else:
                value = translate(inner, self.row_scope("SELECT"), "SELECT")
                outputs.append(Output(name, None, None, expression=value.sql, spark_type=value.type))
        return outputs

    def aggregate_outputs(self, names: list[str], items: list[exp.Expression], groups: list[exp.Expression]) -> list[Output]:
        for group in groups:
            value = self.row_value(group, "GROUP BY")
            if isinstance(group, exp.Column) and self._side(group, "GROUP BY") == 0:
                self.group_by.append(resolve_column(group, self.sides, self.aliases, "GROUP BY")[1])
            self.group_fields.append(value.sql.strip("`"))
            self.groups[translate(group, self.row_scope("GROUP BY"), "GROUP BY").sql] = value
        outputs = []
        for index, (name, item) in enumerate(zip(names, items)):
            inner = item.this if isinstance(item, exp.Alias) else item
            if type(inner) in AGGREGATES and not isinstance(inner.this, exp.Distinct) and (
                    (isinstance(inner.this, exp.Column) and self._side(inner.this, "SELECT") == 0)
                    or (type(inner) is exp.Count and isinstance(inner.this, (exp.Star, exp.Literal)))):
                # a plain aggregate keeps the column name (agg<i>) its state had before expressions
                self._aggregate(inner, f"agg{index}")
                argument = inner.this.name if isinstance(inner.this, exp.Column) else None
                outputs.append(Output(name, None, None, AGGREGATES[type(inner)],
                                      argument and resolve_column(inner.this, self.sides, self.aliases, "SELECT")[1]))
                continue
            value = translate(inner, self.aggregate_scope("SELECT"), "SELECT")
            if isinstance(inner, exp.Column):
                side, column = resolve_column(inner, self.sides, self.aliases, "SELECT")
                outputs.append(Output(name, side, column, fields=tuple(self.fields_used)))
            else:
                outputs.append(Output(name, None, None, expression=value.sql, spark_type=value.type,
                                      fields=tuple(self.fields_used)))
        return outputs

    def _side(self, column: exp.Column, clause: str) -> int:
        return resolve_column(column, self.sides, self.aliases, clause)[0]

    def aggregate_scope(self, clause: str):
        """Resolves aggregate calls and GROUP BY expressions to GroupAggregate's output columns."""
        self.fields_used = []

        def resolve(node: exp.Expression) -> Typed | None:
            if isinstance(node, (*AGGREGATES, exp.Avg)):
                found = self._aggregate(node, None)
            else:
                try:
                    found = self.groups.get(translate(node, self.row_scope(clause), clause).sql)
                except UnsupportedSql:
                    found = None  # it holds an aggregate: its parts are resolved one by one
                if found is None and isinstance(node, exp.Column):
                    raise UnsupportedSql(f"{clause} column {node.sql(dialect=Flink)!r} is neither grouped nor aggregated")
            if found is not None:
                self.fields_used.extend(f for f in _fields(found.sql) if f not in self.fields_used)
            return found
        return resolve

    def _aggregate(self, node: exp.Expression, name: str | None) -> Typed:
        """The output column of an aggregate call (AVG: SUM / COUNT, Flink's type)."""
        text = node.sql(dialect=Flink)
        argument = node.this
        if isinstance(argument, exp.Distinct):
            if type(node) is not exp.Count or len(argument.expressions) != 1:
                raise UnsupportedSql(f"{text} is not supported; supported: COUNT(DISTINCT x) of one value, and "
                                     "COUNT, SUM, MIN, MAX, AVG without DISTINCT")
            value = self.row_value(argument.expressions[0], f"{text}:")
            return Typed(f"`{self._call('COUNT_DISTINCT', value.sql.strip('`'), name)}`", "bigint")
        if type(node) is exp.Count and isinstance(argument, (exp.Star, exp.Literal)):
            return Typed(f"`{self._call('COUNT', '', name)}`", "bigint")
        value = self.row_value(argument, f"{text}:")
        field = value.sql.strip("`")
        if isinstance(node, exp.Count):
            return Typed(f"`{self._call('COUNT', field, name)}`", "bigint")
        if not isinstance(node, (exp.Min, exp.Max)) and value.type not in NUMERIC:
            raise UnsupportedSql(f"{text}: its argument is {value.type.upper()}; supported: INT, BIGINT, DOUBLE")
        if isinstance(node, exp.Sum):
            return Typed(f"`{self._call('SUM', field, name)}`", "double" if value.type == "double" else "bigint")
        if isinstance(node, (exp.Min, exp.Max)):
            return Typed(f"`{self._call(AGGREGATES[type(node)], field, name)}`", value.type)
        total, count = f"`{self._call('SUM', field, None)}`", f"`{self._call('COUNT', field, None)}`"
        if value.type == "double":
            return Typed(f"(CASE WHEN {count} = 0 THEN NULL ELSE {total} / {count} END)", "double")
        # Flink: AVG of whole numbers is whole, of the argument's type
        return Typed(f"(CASE WHEN {count} = 0 THEN NULL ELSE CAST({total} DIV {count} AS {value.type.upper()}) END)",
                     value.type)

    def _call(self, function: str, field: str, name: str | None) -> str:
        for call in self.aggregates:
            if (call.function, call.input) == (function, field):
                return call.name
        self.aggregates.append(AggregateCall(function, field, name or f"agg_{len(self.aggregates)}"))
        return self.aggregates[-1].name


def _all(conditions: list[str]) -> str | None:
    """Spark SQL of every condition together (None for none)."""
    return None if not conditions else conditions[0] if len(conditions) == 1 else f"({' AND '.join(conditions)})"


def _fields(sql: str) -> list[str]:
    """The backticked column names in generated Spark SQL."""
    return re.findall(r"`([^`]+)`", sql)
