"""The SQL pipelines' types: declared column types → Spark types, and a translated value's type.

Pure data and two small classes shared by the planner (pipeline/sql/plan.py, tables.py) and the
expression translator (pipeline/sql/expressions.py): which declared types a table's columns may
have and the Spark type each is read as, the CAST targets whose meaning is exact, the names a
type is shown by in messages, :class:`Typed` (Spark SQL and its type) and :class:`UnsupportedSql`
(a statement outside the subset; the message names the clause).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import StatefulStreamsError

# Declared SQL type -> the Spark type of a table's column.
PAYLOAD_TYPES = {
    "TEXT": "string", "VARCHAR": "string", "CHAR": "string", "NCHAR": "string", "NVARCHAR": "string",
    "INT": "int", "SMALLINT": "int", "TINYINT": "int", "BIGINT": "bigint",
    "DOUBLE": "double", "FLOAT": "double", "DECIMAL": "double", "BOOLEAN": "boolean",
}
SUPPORTED_TYPES = "STRING, VARCHAR, CHAR, INT, SMALLINT, TINYINT, BIGINT, DOUBLE, FLOAT, DECIMAL, BOOLEAN"
# CAST targets whose meaning is exact here (DECIMAL(p, s) would round; SMALLINT would narrow).
CAST_TYPES = {"TEXT": "string", "VARCHAR": "string", "CHAR": "string", "INT": "int", "BIGINT": "bigint",
              "DOUBLE": "double", "BOOLEAN": "boolean"}
SPARK_NAMES = {"string": "STRING", "int": "INT", "bigint": "BIGINT", "double": "DOUBLE", "boolean": "BOOLEAN",
               "null": "NULL", "timestamp": "TIMESTAMP(3)", "map<string,string>": "MAP<STRING, STRING>"}
NUMERIC = ("int", "bigint", "double")
WHOLE = ("int", "bigint")


class UnsupportedSql(StatefulStreamsError):
    """A statement outside the supported subset; the message names the clause."""


@dataclass(frozen=True)
class Typed:
    """An expression as Spark SQL (parenthesised where it matters) and its type."""

    sql: str
    type: str
