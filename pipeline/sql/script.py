"""A script's statements → the plans of one pipeline: tables, views, settings and its INSERTs.

Pure: :func:`build_pipeline` reads a script statement by statement (split at its semicolons,
pipeline/sql/plan.py split_statements) and returns one :class:`Plan` per ``INSERT INTO``, in the
order written. Statements:

- ``CREATE [TEMPORARY] TABLE`` (pipeline/sql/tables.py) and ``CREATE [TEMPORARY] VIEW``
  (pipeline/sql/views.py), each usable in the statements after it;
- ``SET 'key' = 'value'`` of the keys in :data:`SETTINGS` (pipeline/sql/settings.py);
- ``INSERT INTO … SELECT …``, any number, bare or inside Flink's ``EXECUTE STATEMENT SET BEGIN
  … END;`` (or the SQL client's ``BEGIN STATEMENT SET; … END;``). Either way the INSERTs of one
  script run as one pipeline: one Spark query that reads each source message once
  (pipeline/sql/statement_set.py). Two INSERTs into one table are refused.

Anything else is refused with one line naming the statement.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.plan import Plan, Table, build_query, split_statements
from pipeline.sql.settings import apply_setting
from pipeline.sql.sqltypes import UnsupportedSql
from pipeline.sql.tables import build_table
from pipeline.sql.views import build_view

EXECUTE_SET = re.compile(r"^EXECUTE\s+STATEMENT\s+SET\s+BEGIN\b", re.IGNORECASE)
BEGIN_SET = re.compile(r"^BEGIN\s+STATEMENT\s+SET$", re.IGNORECASE)
STATEMENTS = ("CREATE [TEMPORARY] TABLE … WITH ('connector' = 'upsert-pulsar', …), CREATE [TEMPORARY] VIEW, "
              "SET 'key' = 'value', INSERT INTO … SELECT … and EXECUTE STATEMENT SET BEGIN … END")


def parse_statement(text: str) -> exp.Expression:
    """One statement, parsed with the Flink dialect; one line if it does not parse."""
    try:
        parsed = [s for s in sqlglot.parse(text, read=Flink) if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise UnsupportedSql(f"SQL does not parse: {str(exc).splitlines()[0]}") from exc
    if len(parsed) != 1:
        raise UnsupportedSql(f"SQL does not parse as one statement: {text.splitlines()[0]!r}")
    return parsed[0]


def unwrap_statement_sets(pieces: list[str]) -> list[tuple[str, bool]]:
    """(statement, inside a statement set) per statement, the set's BEGIN and END taken out."""
    found, inside = [], False
    for piece in pieces:
        if BEGIN_SET.match(piece):
            inside = _open_set(inside)
            continue
        match = EXECUTE_SET.match(piece)
        if match:
            inside = _open_set(inside)
            piece = piece[match.end():].strip()
        if piece.upper() == "END":
            if not inside:
                raise UnsupportedSql("END without EXECUTE STATEMENT SET BEGIN; supported: "
                                     "EXECUTE STATEMENT SET BEGIN INSERT …; INSERT …; END;")
            inside = False
            continue
        if piece:
            found.append((piece, inside))
    if inside:
        raise UnsupportedSql("EXECUTE STATEMENT SET BEGIN has no END; supported: "
                             "EXECUTE STATEMENT SET BEGIN INSERT …; INSERT …; END;")
    return found


def _open_set(inside: bool) -> bool:
    if inside:
        raise UnsupportedSql("a statement set inside a statement set is not supported; supported: "
                             "EXECUTE STATEMENT SET BEGIN INSERT …; INSERT …; END;")
    return True


def build_pipeline(text: str, topic_map: dict[str, str] | None = None) -> tuple[Plan, ...]:
    """The plans of a script's INSERTs (see the module docstring); ``topic_map`` maps a table name
    (or a topic) to another topic."""
    statements = tuple(split_statements(text))
    tables: dict[str, Table] = {}
    views: dict[str, exp.Select] = {}
    settings: dict[str, str] = {}
    inserts = []
    for piece, in_set in unwrap_statement_sets(list(statements)):
        statement = parse_statement(piece)
        if in_set and not isinstance(statement, exp.Insert):
            raise UnsupportedSql(f"statement {statement.key.upper()} inside EXECUTE STATEMENT SET is not supported; "
                                 "supported there: INSERT INTO … SELECT …")
        if isinstance(statement, exp.Create) and statement.kind == "TABLE":
            table = build_table(statement, topic_map or {})
            if table.name.lower() in tables or table.name.lower() in views:
                raise UnsupportedSql(f"CREATE TABLE {table.name}: a table or view named {table.name!r} exists already")
            tables[table.name.lower()] = table
        elif isinstance(statement, exp.Create) and statement.kind == "VIEW":
            name, select = build_view(statement, views, set(tables))
            views[name.lower()] = select
        elif isinstance(statement, exp.Set):
            apply_setting(statement, settings)
        elif isinstance(statement, exp.Insert):
            inserts.append((statement, dict(tables), dict(views)))  # what is defined before it
        else:
            raise UnsupportedSql(f"statement {statement.key.upper()} is not supported; supported: {STATEMENTS}")
    if not inserts:
        raise UnsupportedSql(f"0 INSERT INTO statements; supported: one or more INSERT INTO … SELECT … ({STATEMENTS})")
    plans = tuple(build_query(insert, known, statements, seen, settings) for insert, known, seen in inserts)
    temporal = [plan.target.name for plan in plans if plan.temporal is not None]
    if len(temporal) > 1:
        raise UnsupportedSql(f"{len(temporal)} INSERTs with a temporal join (FOR SYSTEM_TIME AS OF) in one statement "
                             f"set (into {', '.join(temporal)}); supported: one per set, since a Spark query keeps one "
                             "watermark and one join's tables would hold the other's back: run each in a script of its own")
    targets = [plan.target.name.lower() for plan in plans]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise UnsupportedSql(f"INSERT INTO {twice[0]} appears {targets.count(twice[0])} times; supported: one INSERT "
                             "per target table (UNION ALL of INSERTs into one table is not)")
    return plans

