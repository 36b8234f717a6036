"""Post-processing expressions: outputs, HAVING and ORDER BY over released values.

The analyzer checks these expressions with `check_output_expression`; the
release step evaluates them with `evaluate` over already-noisy aggregates and
public group keys, in Python, with SQL's NULL semantics. Post-processing of
differentially private values costs no budget. Errors never happen here: a
division by zero gives NULL, as the rewrite does for row expressions.

>>> from sqlglot import parse_one
>>> node = parse_one("ROUND(SUM(x) / COUNT(*), 1)", read="postgres")
>>> evaluate(node, {"SUM(x)": 10.0, "COUNT(*)": 3}, {})
3.3
>>> evaluate(parse_one("COUNT(*) / 2", read="postgres"), {"COUNT(*)": 7}, {})
3
"""

from __future__ import annotations

import datetime as dt
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal
from typing import Any, ClassVar

from sqlglot import exp

from .clock import parse_date
from .errors import DatatypeMismatch, InvalidTextRepresentation, NotSupportedError

OUTPUT_FUNCTIONS_HELP = (
    "+ - * / %, ROUND, TRUNC, ABS, FLOOR, CEIL, SQRT, POWER, LEAST, GREATEST, COALESCE, "
    "NULLIF, CASE, CAST, comparisons, AND/OR/NOT, IS NULL"
)

Value = Any  # int | float | str | bool | None


class AggregateRef(exp.Expression):
    """Stands for one aggregate's released value inside an output expression.

    The analyzer puts it where the aggregate call was, so evaluating a row looks the
    value up by name instead of regenerating SQL text.
    """

    arg_types: ClassVar[dict[str, bool]] = {"this": True}


class WindowRef(exp.Expression):
    """Stands for one window function call's value (`dpproxy.windows`) inside an output
    or ORDER BY expression; `function` is its SQL name, which names an unaliased output."""

    arg_types: ClassVar[dict[str, bool]] = {"this": True, "function": False}


@dataclass(frozen=True)
class OrderItem:
    """One ORDER BY item, of the query or of a window: an expression over aggregates and
    keys, and where it puts NULLs (PostgreSQL's default: last ascending, first descending)."""

    expression: exp.Expression
    descending: bool
    nulls_first: bool


def refer_to_aggregates(node: exp.Expression, names: Mapping[str, str]) -> exp.Expression:
    """A copy of `node` with each aggregate call replaced by an AggregateRef to its name."""
    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.AggFunc):
            return AggregateRef(this=names[n.sql("postgres")])
        return n
    if isinstance(node, exp.AggFunc):  # the usual output: no copy of what is replaced
        return swap(node)
    return node.transform(swap)
Env = tuple[Mapping[str, Value], Mapping[str, Value]]  # (aggregates by SQL, keys by name)


# sqlglot nodes whose own name is not the function's as analysts write it in PostgreSQL
# (or DuckDB, for the ones PostgreSQL lacks)
_WRITTEN_NAMES: dict[type[exp.Expression], str] = {
    exp.GroupConcat: "STRING_AGG", exp.LogicalOr: "BOOL_OR", exp.LogicalAnd: "BOOL_AND",
    exp.ApproxDistinct: "APPROX_COUNT_DISTINCT", exp.JSONArrayAgg: "JSON_AGG",
    exp.BitwiseOrAgg: "BIT_OR", exp.BitwiseAndAgg: "BIT_AND", exp.CountIf: "COUNT_IF",
    exp.TimeToStr: "TO_CHAR", exp.DateTrunc: "DATE_TRUNC", exp.TimestampTrunc: "DATE_TRUNC",
}


def written_name(node: exp.Func) -> str:
    """A function's name as the analyst wrote it, for messages: `STRING_AGG`, not sqlglot's
    GROUP_CONCAT; an unknown function's own name, not ANONYMOUS.

    >>> import sqlglot
    >>> [written_name(sqlglot.parse_one(f"SELECT {f}", read="postgres").expressions[0])
    ...  for f in ("STRING_AGG(a, ',')", "age(a, b)", "SUM(a)")]
    ['STRING_AGG', 'AGE', 'SUM']
    """
    if isinstance(node, exp.Anonymous):
        return node.name.upper()
    return _WRITTEN_NAMES.get(type(node), node.sql_name())


def output_name(item: exp.Expression) -> str:
    """The column name PostgreSQL gives a select-list item: alias, column, function, ?column?."""
    if isinstance(item, exp.Alias | exp.Column):
        # an unquoted name is folded to lower case, as PostgreSQL folds it (`AS Total`)
        name = item.args.get("alias") if isinstance(item, exp.Alias) else item.this
        if isinstance(name, exp.Identifier) and not name.quoted:
            return name.this.lower()
        return item.alias if isinstance(item, exp.Alias) else item.name
    if isinstance(item, exp.Paren):
        return output_name(item.this)
    if isinstance(item, WindowRef):
        return str(item.args.get("function") or "?column?")
    if isinstance(item, exp.Cast):
        # PostgreSQL names a cast after its argument, or else after the target type
        inner = output_name(item.this)
        return inner if inner != "?column?" else _PG_TYPE_NAMES.get(item.to.this, inner)
    if isinstance(item, exp.Count | exp.Sum | exp.Avg | exp.Min | exp.Max):
        return item.key.lower()
    if isinstance(item, exp.VariancePop):
        return "var_pop"
    if isinstance(item, exp.Variance):  # VAR_SAMP; sqlglot reads VARIANCE as the same node
        return "var_samp"
    if isinstance(item, exp.Anonymous):
        return item.name.lower()
    if isinstance(item, exp.CurrentTimestamp | exp.Pow | exp.Mod) and "start" in item.meta:
        # sqlglot reads now() and CURRENT_TIMESTAMP as one node, POWER(a, b) and a ^ b,
        # MOD(a, b) and a % b too; only a call (the function syntax) records where its name
        # was written, and PostgreSQL names only calls
        if isinstance(item, exp.CurrentTimestamp):
            return "now"
        if isinstance(item, exp.Mod):
            return "mod"
        return "pow" if item.meta["end"] - item.meta["start"] == 2 else "power"
    if isinstance(item, exp.ApproxDistinct | exp.CountIf | exp.DateTrunc | exp.TimestampTrunc
                  | exp.TimeToStr):
        return written_name(item).lower()  # sqlglot's node names differ from the function's
    if isinstance(item, exp.Trim):  # PostgreSQL runs TRIM as btrim, ltrim or rtrim
        position = str(item.args.get("position") or "").upper()
        return {"LEADING": "ltrim", "TRAILING": "rtrim"}.get(position, "btrim")
    if isinstance(item, exp.Func) and not isinstance(item, exp.Binary):
        return item.sql_name().lower()
    return "?column?"


def check_output_expression(node: exp.Expression, check_key: Callable[[exp.Column], None],
                            whole_output: bool = False) -> None:
    """Reject anything the evaluator cannot compute; columns must pass `check_key`.
    `whole_output`: `node` is an output column's whole expression, which may be a constant
    date or timestamp (`SELECT now()`, `CURRENT_DATE AS as_of`, as `clock` folds them)."""
    if whole_output and constant_moment(node) is not None:
        return
    if isinstance(node, exp.AggFunc | WindowRef):
        return  # measured by the plan, or computed over its rows (windows); a leaf here
    if isinstance(node, exp.Column):
        check_key(node)
        return
    if type(node) not in _HANDLERS:
        if isinstance(node, exp.Anonymous):
            what = f"function {node.name}"
        elif isinstance(node, exp.Func):
            what = written_name(node)
        else:
            what = _written(node)
        raise NotSupportedError(f"{what} is not supported on query outputs",
                                hint=f"supported: {OUTPUT_FUNCTIONS_HELP}")
    if isinstance(node, exp.Cast) and node.to.this not in _CAST_TYPES:
        raise NotSupportedError(f"CAST to {node.to.sql('postgres')} is not supported on outputs",
                                hint="cast to a number, text or boolean type")
    if isinstance(node, _COMPARISON_NODES):
        for literal, other in ((node.this, node.expression), (node.expression, node.this)):
            if isinstance(literal, exp.Literal) and literal.is_string \
                    and other.find(exp.AggFunc, AggregateRef) is not None:
                try:
                    float(literal.this)
                except ValueError:
                    raise InvalidTextRepresentation(
                        f"invalid input syntax for a number: {literal.this!r}") from None
    for child in node.iter_expressions():
        if isinstance(child, exp.DataType | exp.Var):
            continue
        check_output_expression(child, check_key)


def _written(node: exp.Expression) -> str:
    """`node` as SQL for a message, a window call shown by its function's name (sqlglot
    cannot write the WindowRef standing for it)."""
    return node.transform(lambda n: exp.var(f"{n.args.get('function') or 'window'}(…) OVER (…)")
                          if isinstance(n, WindowRef) else n).sql("postgres")


def constant_moment(node: exp.Expression) -> tuple[str, str] | None:
    """("date" or "timestamp", its ISO text) of a constant CAST('…' AS DATE / TIMESTAMP),
    as outputs release them; None for anything else. An invalid text is refused (22P02)."""
    if not (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal)
            and node.this.is_string and node.to.this in _MOMENT_TYPES):
        return None
    kind, text = _MOMENT_TYPES[node.to.this], node.this.this
    try:
        if kind == "date":
            return kind, parse_date(text).isoformat()
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidTextRepresentation(
            f"invalid input syntax for type {kind}: {text!r}") from None
    if moment.tzinfo is not None:
        return None  # a timestamp with a zone: not a value dpproxy releases
    return kind, moment.isoformat(sep=" ")


_MOMENT_TYPES = {exp.DataType.Type.DATE: "date", exp.DataType.Type.TIMESTAMP: "timestamp"}


def evaluate(node: exp.Expression, aggregates: Mapping[str, Value], keys: Mapping[str, Value]
             ) -> Value:
    """Evaluate a checked output expression over released aggregates and group keys."""
    if isinstance(node, AggregateRef | WindowRef):
        return aggregates[node.this]
    if isinstance(node, exp.AggFunc):
        return aggregates[node.sql("postgres")]
    if isinstance(node, exp.Column):
        return keys[node.name]
    return _HANDLERS[type(node)](node, (aggregates, keys))


def compare_values(a: Value, b: Value, descending: bool, nulls_first: bool) -> int:
    """-1, 0 or 1 as a sorts before, with or after b in an ORDER BY item: NULLs first or
    last whatever the direction, NaN above every number (as PostgreSQL sorts floats), a
    text compared with a non-text as texts."""
    if a is None or b is None:
        if a is None and b is None:
            return 0
        return (-1 if a is None else 1) * (1 if nulls_first else -1)
    a_nan = isinstance(a, float) and math.isnan(a)
    b_nan = isinstance(b, float) and math.isnan(b)
    if a_nan or b_nan:
        result = int(a_nan) - int(b_nan)
    else:
        if type(a) is not type(b) and (isinstance(a, str) or isinstance(b, str)):
            a, b = str(a), str(b)
        result = int(a > b) - int(a < b)
    return -result if descending else result


def monotone_of(node: exp.Expression) -> tuple[str, int] | None:
    """(aggregate, direction) where `node` is a monotone function of that one aggregate
    and number constants (`ROUND(AVG(x), 1)`, `COUNT(*) * 2`, `100 - SUM(x) / 10`):
    direction 1 non-decreasing, -1 non-increasing; else None. Mapping an interval's ends
    through such a function gives an interval that covers the function of the truth
    exactly when the first covers the truth.

    >>> from sqlglot import parse_one
    >>> node = refer_to_aggregates(parse_one("10 - ROUND(AVG(x) * -2, 1)"), {"AVG(x)": "AVG(x)"})
    >>> monotone_of(node)
    ('AVG(x)', 1)
    """
    if isinstance(node, AggregateRef):
        return str(node.this), 1
    if isinstance(node, exp.Paren | exp.Round | exp.Floor | exp.Ceil | exp.Trunc):
        return monotone_of(node.this)
    if isinstance(node, exp.Cast):
        return monotone_of(node.this) if node.to.is_type(*exp.DataType.NUMERIC_TYPES) else None
    if isinstance(node, exp.Neg):
        inner = monotone_of(node.this)
        return (inner[0], -inner[1]) if inner else None
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
        left, right = node.this, node.expression
        constant = _number_constant(right)
        varying, sign = left, 1.0
        if constant is None:
            constant = _number_constant(left)
            if constant is None or isinstance(node, exp.Div):
                return None  # c / x is not monotone across 0
            varying = right
            sign = -1.0 if isinstance(node, exp.Sub) else 1.0
        if isinstance(node, exp.Mul | exp.Div):
            if constant == 0:
                return None
            sign *= 1.0 if constant > 0 else -1.0
        inner = monotone_of(varying)
        return (inner[0], inner[1] * (1 if sign > 0 else -1)) if inner else None
    return None


def _number_constant(node: exp.Expression) -> float | None:
    """The value of a number literal (possibly negated, in parentheses), else None."""
    if isinstance(node, exp.Paren):
        return _number_constant(node.this)
    if isinstance(node, exp.Neg):
        inner = _number_constant(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
    return None


def _ev(node: exp.Expression | None, env: Env) -> Value:
    if node is None:
        return None
    return evaluate(node, env[0], env[1])


def _literal(node: exp.Literal, env: Env) -> Value:
    if node.is_string:
        return node.this
    text = node.this
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _arith(op: Callable[[Value, Value], Value]) -> Callable[[exp.Expression, Env], Value]:
    def handler(node: exp.Expression, env: Env) -> Value:
        a, b = _as_number(_ev(node.this, env)), _as_number(_ev(node.expression, env))
        if a is None or b is None or not _numbers(a, b):
            return None
        try:
            return op(a, b)
        except (ArithmeticError, ValueError):  # inf % 2, an int beyond a float's range
            return None
    return handler


def _as_number(value: Value) -> Value:
    """A quoted literal computed with as a number (`infer_type` let only number text
    through), as a number; anything else as it is."""
    if not isinstance(value, str):
        return value
    try:
        return int(value) if _literal_number_type(value) == "int8" else float(value)
    except ValueError:
        return value


def _numbers(*values: Value) -> bool:
    """Whether arithmetic may take these: numbers, not text or truth values (a text key
    times 2 would be Python's repeated string). The values are released ones: what this
    decides is post-processing."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _divide(a: Value, b: Value) -> Value:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):  # PostgreSQL truncates integer division
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    return a / b


def _modulo(a: Value, b: Value) -> Value:
    if b == 0:
        return None
    return math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else \
        int(math.copysign(abs(a) % abs(b), a))


def _to_digits(mode: str) -> Callable[[exp.Expression, Env], Value]:
    """ROUND (halves away from zero, as PostgreSQL) or TRUNC (toward zero) at a number of
    digits, in decimal as NUMERIC computes them."""
    def handler(node: exp.Expression, env: Env) -> Value:
        value = _ev(node.this, env)
        digits = _ev(node.args.get("decimals"), env) if node.args.get("decimals") else 0
        if value is None or digits is None or not _numbers(value, digits):
            return None
        if isinstance(value, float) and not math.isfinite(value):
            return value
        try:
            number, exponent = Decimal(repr(value)), -int(digits)
            written = number.as_tuple()
            assert isinstance(written.exponent, int)  # finite
            if written.exponent >= exponent:  # no digit there to drop: the value as it is
                return float(value)
            # at most the value's own digits and a carry (9.99 → 10.0): within precision
            context = Context(prec=len(written.digits) + 2)
            done = number.quantize(Decimal(1).scaleb(exponent), rounding=mode, context=context)
            return float(done)
        except (ArithmeticError, ValueError):  # digits beyond any exponent (-10^9)
            return None
    return handler


def _unary(fn: Callable[[Value], Value]) -> Callable[[exp.Expression, Env], Value]:
    def handler(node: exp.Expression, env: Env) -> Value:
        value = _ev(node.this, env)
        if value is None:
            return None
        try:
            return fn(value)
        except (ValueError, OverflowError):
            return None
    return handler


def _power(node: exp.Pow, env: Env) -> Value:
    a, b = _ev(node.this, env), _ev(node.expression, env)
    if a is None or b is None:
        return None
    try:
        result = float(a) ** float(b)
    except (ZeroDivisionError, OverflowError):
        return None
    return None if isinstance(result, complex) else result


def _compare(op: Callable[[Value, Value], bool]) -> Callable[[exp.Expression, Env], Value]:
    def handler(node: exp.Expression, env: Env) -> Value:
        return _compared(_ev(node.this, env), _ev(node.expression, env), op)
    return handler


def _compared(a: Value, b: Value, op: Callable[[Value, Value], bool]) -> Value:
    """`op(a, b)` as SQL compares: NULL with NULL; a quoted literal compared with a number
    read as a number (typed numeric: `infer_type`), as in comparisons, CASE x WHEN and
    NULLIF alike; text that is no number (a text key compared with one) compares as NULL."""
    if a is None or b is None:
        return None
    try:
        if isinstance(a, str) and isinstance(b, int | float) and not isinstance(b, bool):
            a = float(a)
        elif isinstance(b, str) and isinstance(a, int | float) and not isinstance(a, bool):
            b = float(b)
    except ValueError:
        return None
    try:
        return op(a, b)
    except TypeError:
        return op(str(a), str(b))


def _and(node: exp.And, env: Env) -> Value:
    a, b = _ev(node.this, env), _ev(node.expression, env)
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(node: exp.Or, env: Env) -> Value:
    a, b = _ev(node.this, env), _ev(node.expression, env)
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _not(node: exp.Not, env: Env) -> Value:
    value = _ev(node.this, env)
    return None if value is None else not value


def _is(node: exp.Is, env: Env) -> Value:
    value = _ev(node.this, env)
    target = node.expression
    result = value is None if isinstance(target, exp.Null) else value is _ev(target, env)
    return not result if node.args.get("negate") else result


def _case(node: exp.Case, env: Env) -> Value:
    subject = _ev(node.this, env) if node.this is not None else None
    for branch in node.args.get("ifs", []):
        test = _ev(branch.this, env)
        hit = _compared(subject, test, operator.eq) is True if node.this is not None \
            else test is True
        if hit:
            return _ev(branch.args["true"], env)
    return _ev(node.args.get("default"), env)


def _if(node: exp.If, env: Env) -> Value:
    if _ev(node.this, env) is True:
        return _ev(node.args["true"], env)
    return _ev(node.args.get("false"), env)


def _present(node: exp.Expression, env: Env) -> list[Value]:
    values = [_ev(n, env) for n in (node.this, *node.expressions)]
    return [v for v in values if v is not None]


def _coalesce(node: exp.Coalesce, env: Env) -> Value:
    for n in (node.this, *node.expressions):
        value = _ev(n, env)
        if value is not None:
            return value
    return None


def _nullif(node: exp.Nullif, env: Env) -> Value:
    a = _ev(node.this, env)
    return None if _compared(a, _ev(node.expression, env), operator.eq) is True else a


def _least(node: exp.Least, env: Env) -> Value:
    values = _present(node, env)
    return min(values) if values else None


def _greatest(node: exp.Greatest, env: Env) -> Value:
    values = _present(node, env)
    return max(values) if values else None


def _cast(node: exp.Cast, env: Env) -> Value:
    moment = constant_moment(node)
    if moment is not None:
        return moment[1]
    value = _ev(node.this, env)
    if value is None:
        return None
    target = node.to.this
    t = exp.DataType.Type
    try:
        if target in _INTEGER_BITS:
            if isinstance(value, bool):  # true::int is 1
                return int(value)
            whole = int(Decimal(str(value)).quantize(Decimal(1), ROUND_HALF_UP))
            # NULL beyond the type's range, where PostgreSQL raises (22003: smallint out
            # of range): the released value, not its number beyond the type it names
            half = 1 << (_INTEGER_BITS[target] - 1)
            return whole if -half <= whole < half else None
        if target == t.DECIMAL and node.to.expressions:
            return _to_numeric(value, node.to.expressions)
        if target in (t.FLOAT, t.DOUBLE, t.DECIMAL):
            return float(value)
        if target in (t.TEXT, t.VARCHAR, t.CHAR):
            return _to_text(value, node.to)
        if target == t.BOOLEAN:
            return _to_bool(value)
    except (ArithmeticError, ValueError):
        return None
    raise NotSupportedError(f"CAST to {node.to.sql('postgres')} is not supported on outputs")


# The integer types a cast of an output may name, and their widths
_INTEGER_BITS = {exp.DataType.Type.TINYINT: 8, exp.DataType.Type.SMALLINT: 16,
                 exp.DataType.Type.INT: 32, exp.DataType.Type.BIGINT: 64}


def _to_numeric(value: Value, params: list[exp.Expression]) -> Value:
    """NUMERIC(p, s): rounded to s places (halves away from zero), as a float; NULL where
    it has more than p − s integer digits (PostgreSQL: numeric field overflow). A float
    is read at 15 significant digits first, as PostgreSQL converts float8 to numeric."""
    numbers = [int(p.name) for p in params]
    precision, scale = numbers[0], numbers[1] if len(numbers) > 1 else 0
    exact = Decimal(value) if isinstance(value, int) else Decimal(f"{float(value):.15g}")
    context = Context(prec=max(precision, 1) + 2)  # PostgreSQL allows up to 1000 digits
    number = exact.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP,
                            context=context)
    if number.adjusted() >= precision - scale:
        return None
    return float(number) + 0.0  # (-0.00 is 0.00)


def _to_text(value: Value, to: exp.DataType) -> str:
    """As PostgreSQL writes a value as text: true/false for truth values; VARCHAR(n) cut
    to n characters, CHAR(n) cut or padded to n."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if not to.expressions:
        return text
    length = int(to.expressions[0].name)
    if to.this == exp.DataType.Type.CHAR:
        return text[:length].ljust(length)
    return text[:length]


def _to_bool(value: Value) -> Value:
    """A truth value as PostgreSQL reads one: a number is true unless 0; a text as its
    boolean input, any unambiguous prefix of true, yes, on, 1 or false, no, off, 0 ('o'
    is both); other text is NULL (PostgreSQL: 22P02, which a released key must not raise
    after the charge)."""
    if not isinstance(value, str):
        return bool(value)
    text = value.strip().lower()
    for truth, words in ((True, ("true", "yes", "on", "1")), (False, ("false", "no", "off", "0"))):
        if text and text != "o" and any(word.startswith(text) for word in words):
            return truth
    return None


_HANDLERS: dict[type[exp.Expression], Callable[[Any, Env], Value]] = {
    exp.Literal: _literal,
    exp.Null: lambda node, env: None,
    exp.Boolean: lambda node, env: bool(node.this),
    exp.Paren: lambda node, env: _ev(node.this, env),
    exp.Neg: _unary(lambda v: -v),
    exp.Add: _arith(lambda a, b: a + b),
    exp.Sub: _arith(lambda a, b: a - b),
    exp.Mul: _arith(lambda a, b: a * b),
    exp.Div: _arith(_divide),
    exp.Mod: _arith(_modulo),
    exp.Round: _to_digits(ROUND_HALF_UP),
    exp.Trunc: _to_digits(ROUND_DOWN),
    exp.Abs: _unary(abs),
    exp.Floor: _unary(lambda v: float(math.floor(v))),  # double precision: `infer_type`
    exp.Ceil: _unary(lambda v: float(math.ceil(v))),
    exp.Sqrt: _unary(math.sqrt),
    exp.Pow: _power,
    exp.EQ: _compare(lambda a, b: a == b),
    exp.NEQ: _compare(lambda a, b: a != b),
    exp.GT: _compare(lambda a, b: a > b),
    exp.GTE: _compare(lambda a, b: a >= b),
    exp.LT: _compare(lambda a, b: a < b),
    exp.LTE: _compare(lambda a, b: a <= b),
    exp.And: _and,
    exp.Or: _or,
    exp.Not: _not,
    exp.Is: _is,
    exp.Case: _case,
    exp.If: _if,
    exp.Coalesce: _coalesce,
    exp.Nullif: _nullif,
    exp.Least: _least,
    exp.Greatest: _greatest,
    exp.Cast: _cast,
}


# PostgreSQL type names of released values, for RowDescription and DB-API descriptions.
_CAST_TYPES = {
    exp.DataType.Type.TINYINT: "int8", exp.DataType.Type.SMALLINT: "int8",
    exp.DataType.Type.INT: "int8", exp.DataType.Type.BIGINT: "int8",
    exp.DataType.Type.FLOAT: "float8", exp.DataType.Type.DOUBLE: "float8",
    exp.DataType.Type.DECIMAL: "float8", exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.VARCHAR: "text", exp.DataType.Type.CHAR: "text",
    exp.DataType.Type.BOOLEAN: "bool",
}
# PostgreSQL's own names for types, which name an unnamed cast's output column
_PG_TYPE_NAMES = {
    exp.DataType.Type.SMALLINT: "int2", exp.DataType.Type.INT: "int4",
    exp.DataType.Type.BIGINT: "int8", exp.DataType.Type.FLOAT: "float8",
    exp.DataType.Type.DOUBLE: "float8", exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.TEXT: "text", exp.DataType.Type.VARCHAR: "varchar",
    exp.DataType.Type.CHAR: "bpchar", exp.DataType.Type.BOOLEAN: "bool",
}
_COMPARISON_NODES = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_BOOL_NODES = (*_COMPARISON_NODES, exp.And, exp.Or, exp.Not, exp.Is)


def infer_type(node: exp.Expression, aggregate_types: Mapping[str, str],
               key_types: Mapping[str, str]) -> str:
    """The PostgreSQL type name of an output expression's values (int8, float8, text,
    date, timestamp, bool).

    Refuses, as PostgreSQL does when it plans, what the evaluator could only answer with a
    NULL or a fault: arithmetic or a numeric function over text, dates or truth values,
    values of different types compared or in one CASE or COALESCE, AND/OR/NOT over
    non-booleans, casts PostgreSQL has not. `analyze` types every post-processing place
    before anything is charged; RowDescription reads the type.

    >>> from sqlglot import parse_one
    >>> infer_type(parse_one("sex * 2"), {}, {"sex": "text"})
    Traceback (most recent call last):
    ...
    dpproxy.errors.DatatypeMismatch: operator does not exist: text * int8
    HINT: compute with numbers: aggregates or number keys
    """
    found = _typed(node, aggregate_types, key_types)
    return "text" if found == _UNKNOWN else found


_UNKNOWN = "unknown"  # a quoted literal or NULL, typed by where it stands
_NUMBER_TYPES = ("int8", "float8")
_MOMENTS = ("date", "timestamp")


def _typed(node: exp.Expression, aggregate_types: Mapping[str, str],
           key_types: Mapping[str, str]) -> str:
    def typed(n: exp.Expression) -> str:
        return _typed(n, aggregate_types, key_types)

    if isinstance(node, AggregateRef | WindowRef):
        return aggregate_types[node.this]
    if isinstance(node, exp.Column):
        return key_types[node.name]
    if isinstance(node, exp.Literal):
        if node.is_string:
            return _UNKNOWN
        return "int8" if node.this.lstrip("-").isdigit() else "float8"
    if isinstance(node, exp.Null):
        return _UNKNOWN
    if isinstance(node, exp.Boolean):
        return "bool"
    if isinstance(node, exp.Paren):
        return typed(node.this)
    if isinstance(node, _COMPARISON_NODES):
        _comparable(node.this, node.expression, typed, _OPERATORS[type(node)])
        return "bool"
    if isinstance(node, exp.And | exp.Or | exp.Not):
        for part in (node.this, node.expression) if not isinstance(node, exp.Not) \
                else (node.this,):
            _boolean(part, typed(part), node.key.upper())
        return "bool"
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            _boolean(node.this, typed(node.this), "IS " + node.expression.sql("postgres"))
        return "bool"
    if isinstance(node, exp.Cast):
        moment = constant_moment(node)
        if moment is not None:
            return moment[0]
        target = _CAST_TYPES.get(node.to.this, "text")
        source = typed(node.this)
        if (source in _MOMENTS and target != "text") or (source == "bool" and target == "float8") \
                or (source == "float8" and target == "bool"):
            raise DatatypeMismatch(f"cannot cast type {source} to {target}",
                                   hint="cast it to text, or compute with the value itself")
        return target
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.Mod | exp.Pow):
        left, right = typed(node.this), typed(node.expression)
        operands = []
        for part, t, other in ((node.this, left, right), (node.expression, right, left)):
            if t == _UNKNOWN and isinstance(part, exp.Literal) and other in _NUMBER_TYPES:
                _readable(part, other)  # '3' * COUNT(*): read as a number, as PostgreSQL does
                t = _literal_number_type(part.this)
            else:
                _number(part, t, f"operator does not exist: {_shown(left)} "
                                 f"{_OPERATORS[type(node)]} {_shown(right)}")
            operands.append(t)
        known = set(operands) - {_UNKNOWN}
        if isinstance(node, exp.Pow):
            return "float8"
        return _UNKNOWN if not known else "int8" if known == {"int8"} else "float8"
    if isinstance(node, exp.Neg | exp.Abs | exp.Floor | exp.Ceil | exp.Sqrt | exp.Round
                  | exp.Trunc):
        inner = typed(node.this)
        name = "-" if isinstance(node, exp.Neg) else written_name(node)
        _number(node.this, inner, f"function {name}({_shown(inner)}) does not exist")
        digits = node.args.get("decimals")
        if digits is not None:
            _number(digits, typed(digits), f"function {name}(…, {_shown(typed(digits))}) "
                                           "does not exist")
        if inner == _UNKNOWN:
            return _UNKNOWN
        # PostgreSQL has no round, trunc, floor or ceil of bigint: it rounds in double
        # precision (numeric with digits), so ROUND(COUNT(*)) / 2 does not truncate
        return inner if isinstance(node, exp.Neg | exp.Abs) else "float8"

    if isinstance(node, exp.Case):
        subject = node.this
        for branch in node.args.get("ifs", []):
            if subject is not None:
                _comparable(subject, branch.this, typed, "=")
            else:
                _boolean(branch.this, typed(branch.this), "CASE WHEN")
        results = [b.args["true"] for b in node.args.get("ifs", [])]
        results += [node.args["default"]] if node.args.get("default") is not None else []
        return _common(results, typed, "CASE")
    if isinstance(node, exp.If):
        _boolean(node.this, typed(node.this), "IF")
        parts = [node.args["true"]] + ([node.args["false"]] if node.args.get("false") else [])
        return _common(parts, typed, "IF")
    if isinstance(node, exp.Coalesce | exp.Least | exp.Greatest):
        return _common([node.this, *node.expressions], typed, node.key.upper())
    if isinstance(node, exp.Nullif):
        _comparable(node.this, node.expression, typed, "=")
        return typed(node.this)
    return "text"


_OPERATORS: dict[type[exp.Expression], str] = {
    exp.EQ: "=", exp.NEQ: "<>", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=",
    exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%", exp.Pow: "^",
}


def _shown(t: str) -> str:
    return "unknown" if t == _UNKNOWN else t


def _number(node: exp.Expression, t: str, message: str) -> None:
    """`node`, of type `t`, computed with as a number: a number, or NULL."""
    if t in _NUMBER_TYPES or isinstance(node, exp.Null):
        return
    if t == _UNKNOWN:
        raise DatatypeMismatch(f"{node.sql('postgres')} is quoted text where a number is "
                               "computed with", hint="write the number without quotes")
    if t in _MOMENTS:
        raise DatatypeMismatch(message, hint="shift or truncate the date in GROUP BY itself, "
                                             "e.g. GROUP BY day + 7")
    raise DatatypeMismatch(message, hint="compute with numbers: aggregates or number keys")


def _boolean(node: exp.Expression, t: str, what: str) -> None:
    if t != "bool" and not isinstance(node, exp.Null):
        raise DatatypeMismatch(f"argument of {what} must be type boolean, not type {_shown(t)}",
                               hint="compare the value, e.g. COUNT(*) > 100")


def _comparable(a: exp.Expression, b: exp.Expression, typed: Callable[[exp.Expression], str],
                operator: str) -> None:
    """Two values compared: of one type (numbers with numbers, dates with moments), or a
    quoted literal read as the other's type, which it must be written as."""
    left, right = typed(a), typed(b)
    for literal, t, other in ((a, left, right), (b, right, left)):
        if t == _UNKNOWN and other != _UNKNOWN and isinstance(literal, exp.Literal):
            _readable(literal, other)
    known = {left, right} - {_UNKNOWN}
    if len(known) < 2 or known <= set(_NUMBER_TYPES) or known <= set(_MOMENTS):
        return
    raise DatatypeMismatch(f"operator does not exist: {left} {operator} {right}",
                           hint="compare values of one type, or CAST one side")


def _literal_number_type(text: str) -> str:
    return "int8" if text.strip().lstrip("+-").isdigit() else "float8"


def _readable(literal: exp.Literal, t: str) -> None:
    """A quoted literal compared with a value of type `t`: read as one (the evaluator
    compares numbers as numbers, moments as their ISO text, so it must be written so)."""
    text = literal.this
    if t in _NUMBER_TYPES:
        try:
            float(text)
        except ValueError:
            raise InvalidTextRepresentation(
                f"invalid input syntax for a number: {text!r}") from None
    elif t == "bool":
        raise DatatypeMismatch(f"{literal.sql('postgres')} is quoted text compared with a "
                               "truth value", hint="write TRUE or FALSE")
    elif t in _MOMENTS:
        try:
            canonical = parse_date(text).isoformat()
        except ValueError:
            canonical = None
        if canonical != text:
            raise InvalidTextRepresentation(
                f"invalid input syntax for a date: {text!r}",
                hint="write the date as YYYY-MM-DD, or CAST('…' AS DATE)")


def _common(parts: list[exp.Expression], typed: Callable[[exp.Expression], str],
            what: str) -> str:
    """The one type of values that stand for each other (CASE's branches, COALESCE's
    arguments): numbers mixed give float8; quoted literals take it."""
    types = [typed(p) for p in parts]
    known = [t for t in types if t != _UNKNOWN]
    if not known:
        return _UNKNOWN
    if set(known) <= set(_NUMBER_TYPES):
        result = "float8" if "float8" in known else "int8"
    elif len(set(known)) == 1:
        result = known[0]
    else:
        first, other = known[0], next(t for t in known if t != known[0])
        raise DatatypeMismatch(f"{what} types {first} and {other} cannot be matched",
                               hint="give every branch one type, or CAST them")
    for part, t in zip(parts, types, strict=True):
        if t != _UNKNOWN or not isinstance(part, exp.Literal) or result == "text":
            continue
        if result in _NUMBER_TYPES:  # COALESCE(COUNT(*), '2'): refused, as in arithmetic
            _number(part, t, "")
        else:
            _readable(part, result)
    return result
