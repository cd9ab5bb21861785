"""Flink SQL scalar expressions → Spark SQL text and a type, checked when a statement is planned.

Pure: :func:`translate` walks a sqlglot expression (parsed with the Flink dialect of
pipeline/sql/dialect.py) and returns a :class:`Typed`: the Spark SQL that computes it and its
type (``string``, ``int``, ``bigint``, ``double``, ``boolean``, or ``null`` for a NULL literal; a
METADATA column may be ``timestamp`` or ``map<string,string>``).
Anything outside the supported set, or of the wrong type, raises :class:`UnsupportedSql` with one
line naming the expression. Columns (and, in an aggregate, group expressions and aggregate calls)
are resolved by the caller's ``resolve`` function.

Flink's meaning is kept where Spark's differs: ``INT / INT`` is an INT (truncated toward zero, as
in Java), ``AVG`` of whole numbers is whole (pipeline/sql/plan.py), ``FLOOR``/``CEIL``/``ROUND``
keep their argument's type, ``GREATEST``/``LEAST`` are NULL when an argument is. Where Flink
fails the job at run time (a CAST that cannot convert, a division by zero, an overflow), the
value here is NULL: the translation uses Spark's ``TRY_CAST`` and ``try_*`` arithmetic, so that
no value stops a pipeline (Spark's ANSI mode would fail the batch on every restart).
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

from pipeline.sql.sqltypes import CAST_TYPES, NUMERIC, SPARK_NAMES, WHOLE, Typed, UnsupportedSql

__all__ = ["translate", "common_type", "flink_text", "Typed", "UnsupportedSql", "NUMERIC", "FUNCTIONS"]

FUNCTIONS = ("CAST, CASE, IF, COALESCE, NULLIF, ||, CONCAT, CONCAT_WS, UPPER, LOWER, INITCAP, TRIM, LTRIM, RTRIM, "
             "CHAR_LENGTH, SUBSTRING, REPLACE, POSITION, LIKE, ABS, ROUND, FLOOR, CEIL, MOD, POWER, SQRT, LN, LOG, "
             "LOG10, EXP, SIGN, GREATEST, LEAST, + - * / %, comparisons, AND, OR, NOT, IS [NOT] NULL, BETWEEN, IN")
TRY_ARITHMETIC = {"+": "try_add", "-": "try_subtract", "*": "try_multiply"}
# |x| at or past 2^52: every double there is whole, and FLOOR's long would lose it
WHOLE_DOUBLES = "4503599627370496"


Resolve = Callable[[exp.Expression], "Typed | None"]


def flink_text(node: exp.Expression) -> str:
    from pipeline.sql.dialect import Flink

    return node.sql(dialect=Flink)


def translate(node: exp.Expression, resolve: Resolve, clause: str) -> Typed:
    """``node`` as Spark SQL and its type; ``resolve`` answers columns (and group expressions and
    aggregates) first, or returns None for the rest."""
    found = resolve(node)
    if found is not None:
        return found
    handler = _HANDLERS.get(type(node))
    if handler is None:
        raise UnsupportedSql(f"{clause} {flink_text(node)!r} is not supported; supported: columns, literals and "
                             f"{FUNCTIONS}")
    return handler(node, lambda child: translate(child, resolve, clause), clause)


def _refuse(node, clause: str, why: str) -> UnsupportedSql:
    return UnsupportedSql(f"{clause} {flink_text(node)!r}: {why}")


def _name(kind: str) -> str:
    return SPARK_NAMES[kind]


def common_type(node, clause: str, kinds: list[str]) -> str:
    """The one type values of ``kinds`` share: the widest number, or the one other type."""
    known = [k for k in kinds if k != "null"]
    if not known:
        return "null"
    if all(k in NUMERIC for k in known):
        return max(known, key=NUMERIC.index)
    if len(set(known)) == 1:
        return known[0]
    raise _refuse(node, clause, f"mixes {', '.join(sorted({_name(k) for k in known}))}; CAST them to one type")


def _need(node, clause: str, value: Typed, allowed: tuple[str, ...], what: str) -> Typed:
    if value.type != "null" and value.type not in allowed:
        raise _refuse(node, clause, f"{what} is {_name(value.type)}; supported: {', '.join(map(_name, allowed))}")
    return value


def _literal(node: exp.Literal, _t, clause: str) -> Typed:
    if node.is_string:
        return Typed(exp.Literal.string(node.this).sql(dialect="spark"), "string")
    return _number(node, node.this, clause)


def _number(node, text: str, clause: str) -> Typed:
    if any(ch in text.lower() for ch in ".e"):
        return Typed(f"CAST({text} AS DOUBLE)", "double")
    number = int(text)
    if -2**31 <= number < 2**31:
        return Typed(text, "int")
    if -2**63 <= number < 2**63:
        return Typed(f"{text}L", "bigint")
    raise _refuse(node, clause, "the number is past BIGINT's range")


def _arithmetic(name: str):
    def handle(node, t, clause: str) -> Typed:
        left, right = (_need(node, clause, t(side), NUMERIC, "an operand") for side in (node.this, node.expression))
        kind = common_type(node, clause, [left.type, right.type])
        if kind == "double":
            return Typed(f"({left.sql} {name} {right.sql})", kind)
        return Typed(f"{TRY_ARITHMETIC[name]}({left.sql}, {right.sql})", kind)  # NULL on overflow
    return handle


def _divide(node, t, clause: str) -> Typed:
    left, right = (_need(node, clause, t(side), NUMERIC, "an operand") for side in (node.this, node.expression))
    kind = common_type(node, clause, [left.type, right.type])
    if kind in WHOLE or kind == "null":
        # Flink: whole / whole is whole, truncated toward zero; here NULL where Flink fails
        kind = "int" if kind == "null" else kind
        return Typed(f"(CASE WHEN {right.sql} = 0 THEN NULL WHEN {right.sql} = -1 THEN try_multiply({left.sql}, -1) "
                     f"ELSE CAST({left.sql} DIV {right.sql} AS {_name(kind)}) END)", kind)
    return Typed(f"try_divide({left.sql}, {right.sql})", "double")


def _mod(node, t, clause: str) -> Typed:
    left, right = (_need(node, clause, t(side), WHOLE, "an operand") for side in (node.this, node.expression))
    return Typed(f"try_mod({left.sql}, {right.sql})", common_type(node, clause, [left.type, right.type]))


def _negate(node, t, clause: str) -> Typed:
    if isinstance(node.this, exp.Literal) and not node.this.is_string:
        return _number(node, f"-{node.this.this}", clause)
    value = _need(node, clause, t(node.this), NUMERIC, "the operand")
    if value.type == "double":
        return Typed(f"(- {value.sql})", "double")
    return Typed(f"try_subtract(0, {value.sql})", value.type)


def _comparison(symbol: str):
    def handle(node, t, clause: str) -> Typed:
        left, right = t(node.this), t(node.expression)
        common_type(node, clause, [left.type, right.type])
        return Typed(f"({left.sql} {symbol} {right.sql})", "boolean")
    return handle


def _logic(word: str):
    def handle(node, t, clause: str) -> Typed:
        left, right = (_need(node, clause, t(side), ("boolean",), "an operand") for side in (node.this, node.expression))
        return Typed(f"({left.sql} {word} {right.sql})", "boolean")
    return handle


def _not(node, t, clause: str) -> Typed:
    value = _need(node, clause, t(node.this), ("boolean",), "the operand")
    return Typed(f"(NOT {value.sql})", "boolean")


def _is(node, t, clause: str) -> Typed:
    value = t(node.this)
    if isinstance(node.expression, exp.Null):
        return Typed(f"({value.sql} IS NULL)", "boolean")
    if isinstance(node.expression, exp.Boolean):
        _need(node, clause, value, ("boolean",), "the operand")
        return Typed(f"({value.sql} IS {'TRUE' if node.expression.this else 'FALSE'})", "boolean")
    raise _refuse(node, clause, "supported: IS [NOT] NULL, IS [NOT] TRUE, IS [NOT] FALSE")


def _strings(node, t, clause: str, values: list) -> list[Typed]:
    return [_need(node, clause, t(v), ("string",), "an argument") for v in values]


def _concat(node, t, clause: str) -> Typed:
    values = [node.this, node.expression] if isinstance(node, exp.DPipe) else node.expressions
    return Typed(f"concat({', '.join(v.sql for v in _strings(node, t, clause, values))})", "string")


def _concat_ws(node, t, clause: str) -> Typed:
    return Typed(f"concat_ws({', '.join(v.sql for v in _strings(node, t, clause, node.expressions))})", "string")


def _cast(node, t, clause: str) -> Typed:
    value = t(node.this)
    target = CAST_TYPES.get(node.to.this.name)
    if target is None:
        raise _refuse(node, clause, f"CAST to {flink_text(node.to)} is not supported; supported: STRING, VARCHAR, "
                                    "CHAR, INT, BIGINT, DOUBLE, BOOLEAN")
    if value.type == "map<string,string>":
        raise _refuse(node, clause, "CAST of a MAP is not supported; supported: its values, map['key']")
    if value.type == "timestamp":
        if target != "string":
            raise _refuse(node, clause, f"CAST of a TIMESTAMP(3) to {_name(target)} is not supported; supported: STRING")
        # Flink's text of a TIMESTAMP(3): always three fraction digits (Spark's CAST drops zeros)
        return Typed(f"date_format({value.sql}, 'yyyy-MM-dd HH:mm:ss.SSS')", "string")
    # NULL where Flink's CAST fails the job
    return Typed(f"TRY_CAST({value.sql} AS {_name(target)})", target)


def _item(node, t, clause: str) -> Typed:
    """``map['key']``: the value, NULL when the map has no such key (as in Flink)."""
    value = t(node.this)
    if value.type != "map<string,string>" or len(node.expressions) != 1:
        raise _refuse(node, clause, "[…] is supported on a MAP<STRING, STRING> with one key")
    key = _need(node, clause, t(node.expressions[0]), ("string",), "the key")
    return Typed(f"try_element_at({value.sql}, {key.sql})", "string")


def _case(node, t, clause: str) -> Typed:
    subject = t(node.this) if node.this else None
    parts, results = [], []
    for branch in node.args["ifs"]:
        condition = t(branch.this)
        if subject is not None:
            common_type(branch, clause, [subject.type, condition.type])
            condition = Typed(f"({subject.sql} = {condition.sql})", "boolean")
        _need(branch, clause, condition, ("boolean",), "a WHEN condition")
        result = t(branch.args["true"])
        results.append(result)
        parts.append(f"WHEN {condition.sql} THEN {result.sql}")
    default = t(node.args["default"]) if node.args.get("default") else Typed("NULL", "null")
    kind = common_type(node, clause, [r.type for r in results] + [default.type])
    return Typed(f"(CASE {' '.join(parts)} ELSE {default.sql} END)", kind)


def _if(node, t, clause: str) -> Typed:
    return _case(exp.Case(ifs=[exp.If(this=node.this, true=node.args["true"])], default=node.args.get("false")),
                 t, clause)


def _coalesce(node, t, clause: str) -> Typed:
    values = [t(v) for v in [node.this, *node.expressions]]
    return Typed(f"coalesce({', '.join(v.sql for v in values)})", common_type(node, clause, [v.type for v in values]))


def _nullif(node, t, clause: str) -> Typed:
    left, right = t(node.this), t(node.expression)
    common_type(node, clause, [left.type, right.type])
    return Typed(f"nullif({left.sql}, {right.sql})", left.type)


def _string_function(name: str, result: str = "string"):
    def handle(node, t, clause: str) -> Typed:
        # sqlglot fills INITCAP's delimiters with its default; Flink's INITCAP has none
        if any(node.args.get(k) for k in node.args if k != "this" and not (name == "initcap" and k == "expression")):
            raise _refuse(node, clause, f"{name.upper()} takes one argument")
        (value,) = _strings(node, t, clause, [node.this])
        return Typed(f"{name}({value.sql})", result)
    return handle


def _trim(node, t, clause: str) -> Typed:
    value, = _strings(node, t, clause, [node.this])
    position = (node.args.get("position") or "BOTH").upper()
    characters = node.args.get("expression")
    chars = f"{_strings(node, t, clause, [characters])[0].sql} " if characters else ""
    return Typed(f"trim({position} {chars}FROM {value.sql})", "string")


def _substring(node, t, clause: str) -> Typed:
    value, = _strings(node, t, clause, [node.this])
    numbers = [_need(node, clause, t(node.args[k]), WHOLE, f"its {k}") for k in ("start", "length") if node.args.get(k)]
    return Typed(f"substring({', '.join([value.sql] + [n.sql for n in numbers])})", "string")


def _replace(node, t, clause: str) -> Typed:
    values = _strings(node, t, clause, [node.this, node.expression, node.args["replacement"]])
    return Typed(f"replace({', '.join(v.sql for v in values)})", "string")


def _position(node, t, clause: str) -> Typed:
    if node.args.get("position") or node.args.get("occurrence"):
        raise _refuse(node, clause, "supported: POSITION(sub IN text)")
    text, sub = _strings(node, t, clause, [node.this, node.args["substr"]])
    return Typed(f"locate({sub.sql}, {text.sql})", "int")


def _like(node, t, clause: str) -> Typed:
    left, pattern = _strings(node, t, clause, [node.this, node.expression])
    return Typed(f"({left.sql} {'NOT ' if node.args.get('negate') else ''}LIKE {pattern.sql})", "boolean")


def _between(node, t, clause: str) -> Typed:
    if node.args.get("symmetric"):
        raise _refuse(node, clause, "BETWEEN SYMMETRIC is not supported")
    value, low, high = t(node.this), t(node.args["low"]), t(node.args["high"])
    common_type(node, clause, [value.type, low.type, high.type])
    return Typed(f"({value.sql} BETWEEN {low.sql} AND {high.sql})", "boolean")


def _in(node, t, clause: str) -> Typed:
    if node.args.get("query") or not node.expressions:
        raise _refuse(node, clause, "IN takes a list of values here, not a subquery")
    value, items = t(node.this), [t(v) for v in node.expressions]
    common_type(node, clause, [value.type] + [i.type for i in items])
    return Typed(f"({value.sql} IN ({', '.join(i.sql for i in items)}))", "boolean")


def _abs(node, t, clause: str) -> Typed:
    value = _need(node, clause, t(node.this), NUMERIC, "the argument")
    if value.type == "double":
        return Typed(f"abs({value.sql})", "double")
    return Typed(f"(CASE WHEN {value.sql} < 0 THEN try_subtract(0, {value.sql}) ELSE {value.sql} END)", value.type)


def _round(node, t, clause: str) -> Typed:
    value = _need(node, clause, t(node.this), NUMERIC, "the argument")
    digits = node.args.get("decimals")
    if digits is not None and not (isinstance(digits, exp.Literal) and not digits.is_string and digits.this.isdigit()):
        raise _refuse(node, clause, "ROUND's decimals must be a whole number literal of 0 or more")
    if value.type != "double":
        return value  # a whole number rounded to 0 or more decimals is itself
    return Typed(f"round({value.sql}, {digits.this if digits is not None else 0})", "double")


def _floor_ceil(name: str):
    def handle(node, t, clause: str) -> Typed:
        if node.args.get("decimals") or node.args.get("to"):
            raise _refuse(node, clause, f"{name.upper()} takes one argument")
        value = _need(node, clause, t(node.this), NUMERIC, "the argument")
        if value.type != "double":
            return value
        return Typed(f"(CASE WHEN abs({value.sql}) >= {WHOLE_DOUBLES} THEN {value.sql} "
                     f"ELSE CAST({name}({value.sql}) AS DOUBLE) END)", "double")
    return handle


def _math(name: str, arity: int = 1):
    def handle(node, t, clause: str) -> Typed:
        values = [node.this] + ([node.expression] if arity == 2 else [])
        typed = [_need(node, clause, t(v), NUMERIC, "an argument") for v in values]
        return Typed(f"{name}({', '.join(v.sql for v in typed)})", "double")
    return handle


def _log(node, t, clause: str) -> Typed:
    if node.expression is None:
        return _math("ln")(node, t, clause)
    base, value = (_need(node, clause, t(v), NUMERIC, "an argument") for v in (node.this, node.expression))
    if base.sql == "10":
        return Typed(f"log10({value.sql})", "double")  # exact on powers of ten, as Flink's LOG10
    return Typed(f"log({base.sql}, {value.sql})", "double")


def _sign(node, t, clause: str) -> Typed:
    value = _need(node, clause, t(node.this), NUMERIC, "the argument")
    return Typed(f"CAST(sign({value.sql}) AS {_name(value.type)})", value.type)


def _extreme(name: str):
    def handle(node, t, clause: str) -> Typed:
        values = [t(v) for v in [node.this, *node.expressions]]
        kind = common_type(node, clause, [v.type for v in values])
        # Flink: NULL when any argument is (Spark's skips NULLs)
        nulls = " OR ".join(f"{v.sql} IS NULL" for v in values)
        return Typed(f"(CASE WHEN {nulls} THEN NULL ELSE {name}({', '.join(v.sql for v in values)}) END)", kind)
    return handle


def _paren(node, t, _clause: str) -> Typed:
    return t(node.this)


def _boolean(node, _t, _clause: str) -> Typed:
    return Typed("TRUE" if node.this else "FALSE", "boolean")


_HANDLERS = {
    exp.Paren: _paren, exp.Literal: _literal, exp.Boolean: _boolean, exp.Null: lambda n, t, c: Typed("NULL", "null"),
    exp.Add: _arithmetic("+"), exp.Sub: _arithmetic("-"), exp.Mul: _arithmetic("*"), exp.Div: _divide,
    exp.Mod: _mod, exp.Neg: _negate,
    exp.EQ: _comparison("="), exp.NEQ: _comparison("<>"), exp.LT: _comparison("<"), exp.LTE: _comparison("<="),
    exp.GT: _comparison(">"), exp.GTE: _comparison(">="),
    exp.And: _logic("AND"), exp.Or: _logic("OR"), exp.Not: _not, exp.Is: _is,
    exp.DPipe: _concat, exp.Concat: _concat, exp.ConcatWs: _concat_ws,
    exp.Cast: _cast, exp.TryCast: _cast, exp.Case: _case, exp.If: _if, exp.Coalesce: _coalesce, exp.Nullif: _nullif,
    exp.Bracket: _item,
    exp.Upper: _string_function("upper"), exp.Lower: _string_function("lower"),
    exp.Initcap: _string_function("initcap"), exp.Length: _string_function("char_length", "int"),
    exp.Trim: _trim, exp.Substring: _substring, exp.Replace: _replace, exp.StrPosition: _position,
    exp.Like: _like, exp.Between: _between, exp.In: _in,
    exp.Abs: _abs, exp.Round: _round, exp.Floor: _floor_ceil("floor"), exp.Ceil: _floor_ceil("ceil"),
    exp.Pow: _math("power", 2), exp.Sqrt: _math("sqrt"), exp.Ln: _math("ln"), exp.Exp: _math("exp"), exp.Log: _log,
    exp.Sign: _sign, exp.Greatest: _extreme("greatest"), exp.Least: _extreme("least"),
}
