"""``CREATE [TEMPORARY] VIEW`` → a named SELECT, inlined into the statements that read it.

Pure: a view is kept as its SELECT (sqlglot, the Flink dialect of pipeline/sql/dialect.py), with
the views it reads already inlined. :func:`inline_views` rewrites a query whose ``FROM`` is a view
into one query over the view's tables, as Flink's planner merges a view into its reader:

- each reference to a view column (``v.n`` or ``n``) becomes the view's expression for it;
- over a view without ``GROUP BY``, the query reads the view's ``FROM`` and ``JOIN``s, then its
  own ``JOIN``s, and its ``WHERE`` is the view's ``AND`` its own;
- over a view with ``GROUP BY``, the query is the view's aggregation with the query's columns,
  and its ``WHERE`` (on the view's result rows) joins the view's ``HAVING``.

So a view changes nothing downstream: the plan (pipeline/sql/plan.py) sees tables only, and a view
costs no state of its own. Refused, with one line: a view in a ``JOIN`` (only ``FROM`` a view),
``SELECT *`` in a view, ``GROUP BY`` over a view that aggregates, a view that reads itself or a
view defined twice, and ``DISTINCT``, ``ORDER BY`` or ``LIMIT`` in a view.
"""

from __future__ import annotations

from sqlglot import exp

from pipeline.sql.dialect import Flink
from pipeline.sql.sqltypes import UnsupportedSql

VIEWS = "CREATE [TEMPORARY] VIEW v [(cols)] AS SELECT … read in FROM v"


def build_view(create: exp.Create, views: dict[str, exp.Select], tables: set[str]) -> tuple[str, exp.Select]:
    """(name, its SELECT with the views it reads inlined) of a ``CREATE [TEMPORARY] VIEW``."""
    target = create.this
    name = (target.this if isinstance(target, exp.Schema) else target).name
    if name.lower() in views or name.lower() in tables:
        raise UnsupportedSql(f"CREATE VIEW {name}: a table or view named {name!r} exists already; supported: "
                             "one definition per name")
    select = create.expression
    if not isinstance(select, exp.Select):
        shown = select.sql(dialect=Flink) if select is not None else "nothing"
        raise UnsupportedSql(f"CREATE VIEW {name} AS {shown!r} is not supported; supported: {VIEWS}")
    for clause, words in (("order", "ORDER BY"), ("limit", "LIMIT"), ("distinct", "DISTINCT"), ("with_", "WITH")):
        if select.args.get(clause):
            raise UnsupportedSql(f"{words} is not supported in CREATE VIEW {name}; supported: {VIEWS}")
    if any(isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
           for item in select.expressions):
        raise UnsupportedSql(f"CREATE VIEW {name}: SELECT * is not supported; supported: the view's columns named "
                             "one by one")
    select = inline_views(select.copy(), views)
    if isinstance(target, exp.Schema):
        names = [column.name for column in target.expressions]
        if len(names) != len(select.expressions):
            raise UnsupportedSql(f"CREATE VIEW {name} names {len(names)} columns but SELECT gives "
                                 f"{len(select.expressions)}")
        select.set("expressions", [exp.alias_(_unaliased(item).copy(), column)
                                   for item, column in zip(select.expressions, names)])
    columns = [item.alias_or_name for item in select.expressions]
    unnamed = [item.sql(dialect=Flink) for item in select.expressions if not item.alias_or_name
               or (not isinstance(item, (exp.Alias, exp.Column)))]
    if unnamed:
        raise UnsupportedSql(f"CREATE VIEW {name}: column {unnamed[0]!r} has no name; name it with AS")
    if len({c.lower() for c in columns}) != len(columns):
        raise UnsupportedSql(f"CREATE VIEW {name}: two columns named alike in {columns}; name them apart with AS")
    return name, select


def inline_views(select: exp.Select, views: dict[str, exp.Select]) -> exp.Select:
    """``select`` over tables only: a view in its FROM merged in (see the module docstring)."""
    for join in select.args.get("joins") or []:
        if isinstance(join.this, exp.Table) and join.this.name.lower() in views:
            raise UnsupportedSql(f"{join.sql(dialect=Flink).strip()!r}: a view in a JOIN is not supported; "
                                 f"supported: {VIEWS}, joined to tables")
    source = select.args.get("from_")
    driving = source.this if source is not None else None
    if not isinstance(driving, exp.Table) or driving.name.lower() not in views:
        return select
    view = views[driving.name.lower()].copy()
    alias = driving.alias_or_name.lower()
    columns = {item.alias_or_name.lower(): _unaliased(item) for item in view.expressions}
    outer_tables = {join.this.alias_or_name.lower() for join in select.args.get("joins") or []}
    inner_tables = {t.alias_or_name.lower() for t in [view.args["from_"].this, *(j.this for j in view.args.get("joins") or [])]}
    if outer_tables & inner_tables:
        raise UnsupportedSql(f"view {driving.name!r} reads {sorted(inner_tables)} and the query joins "
                             f"{sorted(outer_tables & inner_tables)} under the same name; give the JOIN another alias")

    def substitute(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        if node.table and node.table.lower() != alias:
            return node
        if not node.table and node.name.lower() not in columns and outer_tables:
            return node  # a joined table's column
        if node.name.lower() not in columns:
            raise UnsupportedSql(f"{node.sql(dialect=Flink)!r}: view {driving.name!r} has no column {node.name!r}; "
                                 f"its columns are {[item.alias_or_name for item in view.expressions]}")
        return _paren(columns[node.name.lower()])

    merged = select.copy()
    merged.set("expressions", [_keep_name(item, substitute) for item in merged.expressions])
    for clause in ("where", "group", "having"):
        if merged.args.get(clause) is not None:
            merged.set(clause, merged.args[clause].transform(substitute))
    for join in merged.args.get("joins") or []:
        if join.args.get("on") is not None:
            join.set("on", join.args["on"].transform(substitute))
    where = merged.args.get("where")
    if view.args.get("group"):
        if merged.args.get("group") or merged.args.get("joins"):
            clause = "GROUP BY" if merged.args.get("group") else "JOIN"
            raise UnsupportedSql(f"{clause} over view {driving.name!r}, which has GROUP BY, is not supported; "
                                 "supported: SELECT and WHERE over an aggregating view")
        having = _both(view.args.get("having"), where)
        result = view
        result.set("expressions", merged.expressions)
        result.set("having", exp.Having(this=having) if having is not None else None)
    else:
        result = merged
        result.set("from_", view.args["from_"])
        result.set("joins", [*(view.args.get("joins") or []), *(merged.args.get("joins") or [])] or None)
        both = _both(view.args.get("where"), where)
        result.set("where", exp.Where(this=both) if both is not None else None)
    for clause in ("order", "limit", "distinct", "qualify"):
        if select.args.get(clause) is not None:
            result.set(clause, select.args[clause])  # refused with its own line by the plan
    return result


def _unaliased(item: exp.Expression) -> exp.Expression:
    return item.this if isinstance(item, exp.Alias) else item


def _paren(node: exp.Expression) -> exp.Expression:
    """A copy of a view's expression, in parentheses where it is more than a column or literal."""
    node = node.copy()
    return node if isinstance(node, (exp.Column, exp.Literal, exp.Func)) else exp.Paren(this=node)


def _keep_name(item: exp.Expression, substitute) -> exp.Expression:
    """A SELECT item with the view's expressions in it, keeping the name it had (its alias)."""
    inner = _unaliased(item)
    replaced = inner.transform(substitute)
    if isinstance(item, exp.Alias):
        return exp.alias_(replaced, item.alias)
    return exp.alias_(replaced, inner.name) if isinstance(inner, exp.Column) and replaced is not inner \
        and not isinstance(replaced, exp.Column) else replaced


def _both(first: exp.Expression | None, second: exp.Expression | None) -> exp.Expression | None:
    """``first AND second`` of two conditions (a Where/Having's condition), either may be None."""
    parts = [part.this if isinstance(part, (exp.Where, exp.Having)) else part for part in (first, second)
             if part is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else exp.and_(*[exp.Paren(this=p) for p in parts])
