"""The Flink SQL dialect of the seed's statements, as a sqlglot dialect.

sqlglot's Spark dialect reads the seed's statements except Flink's metadata columns
(``eventTime TIMESTAMP(3) METADATA``, ``topic STRING METADATA VIRTUAL``, ``… METADATA FROM 'key'``)
and the DDL's ``WATERMARK FOR col AS expr`` (read as sqlglot's RisingWave dialect reads it);
this dialect adds those and nothing else. Parsing only: nothing here
runs SQL.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import TokenType


class MetadataColumnConstraint(exp.Expression, exp.ColumnConstraintKind):
    """``METADATA [FROM 'name']``: the column comes from the message's metadata, not its payload."""

    arg_types = {"this": False}


class VirtualColumnConstraint(exp.Expression, exp.ColumnConstraintKind):
    """``VIRTUAL``: a metadata column that is read, never written."""

    arg_types = {}


def _parse_metadata(parser) -> MetadataColumnConstraint:
    source = parser._parse_string() if parser._match_text_seq("FROM") else None
    return parser.expression(MetadataColumnConstraint(this=source))


class Flink(Spark):
    """Spark's dialect plus Flink's ``METADATA [FROM '…'] [VIRTUAL]`` column constraints and ``WATERMARK FOR``."""

    class Parser(Spark.Parser):
        CONSTRAINT_PARSERS = {
            **Spark.Parser.CONSTRAINT_PARSERS,
            "METADATA": _parse_metadata,
            "VIRTUAL": lambda self: self.expression(VirtualColumnConstraint()),
            "WATERMARK": lambda self: self.expression(exp.WatermarkColumnConstraint(
                this=self._match(TokenType.FOR) and self._parse_column(),
                expression=self._match(TokenType.ALIAS) and self._parse_disjunction())),
        }
        SCHEMA_UNNAMED_CONSTRAINTS = {*Spark.Parser.SCHEMA_UNNAMED_CONSTRAINTS, "WATERMARK"}

    class Generator(Spark.Generator):
        TRANSFORMS = {
            **Spark.Generator.TRANSFORMS,
            MetadataColumnConstraint: lambda self, e: "METADATA" + (f" FROM {self.sql(e, 'this')}" if e.this else ""),
            VirtualColumnConstraint: lambda self, e: "VIRTUAL",
        }
