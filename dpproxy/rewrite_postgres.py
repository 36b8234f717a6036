"""Totality on PostgreSQL: row expressions that cannot raise, whatever the data.

DuckDB's `make_total` relies on DOUBLE (overflow gives inf) and TRY_CAST. PostgreSQL has
neither: float8 arithmetic raises on overflow *and* underflow, and a cast raises on bad
input (sqlglot renders TRY_CAST as a plain CAST for PostgreSQL). So on PostgreSQL each
construct the analyzer accepts is rewritten as follows (children first):

* numbers are NUMERIC: columns, number literals, LENGTH and EXTRACT are
  cast to NUMERIC, which neither overflows below 10^131072 nor underflows; an expression
  whose values could come near that limit is rejected up front (`check_magnitude`);
* `a / b` → `a / NULLIF(b, 0)` (TRUNC for integer division), `a % b` → `a % NULLIF(b, 0)`;
* casts are guarded: text → number or date only through a CASE whose regular expression
  admits exactly the strings the cast accepts (else NULL), number → integer type rounds
  half to even (as DuckDB) and is NULL outside the type's range, number → boolean is
  `x <> 0`; casts PostgreSQL has no rule for (date → number) are rejected up front;
* date ± n is NULL near the ends of PostgreSQL's date range, date − date is NULL for an
  infinite date; EXTRACT and DATE_TRUNC read a TIMESTAMP (no "unit not supported for
  type date"), as does a cast to a timestamp type: NULL for dates outside TIMESTAMP's
  range, and for DATE_TRUNC also for dates it would truncate to before that range;
* SUBSTRING positions are INT within range (a negative length is NULL, not an error);
* LIKE / ILIKE get `ESCAPE ''`: no escape character, as in DuckDB, so no pattern can end
  in a dangling escape.

A bare column computes nothing and cannot raise: as a COUNT argument it is read as it
is, and as a value to clamp (`clamp_source_postgres`) in DOUBLE PRECISION where the
database stores it as an integer or floating-point type, which is much cheaper than a
NUMERIC conversion per row (a NUMERIC column is clamped in NUMERIC; an int column stored
as an integer type, with whole bounds, in that type: `clamps_in_integer`). Aggregates stay
NUMERIC up to the client, which reads them as Python floats (an out-of-range value
becomes inf there instead of raising in the server).

>>> from dpproxy.policy import ColumnPolicy, TablePolicy
>>> from sqlglot import parse_one
>>> t = TablePolicy("t", {"a": ColumnPolicy("a", "int", 0, 10), "b": ColumnPolicy("b", "int")})
>>> make_total_postgres(parse_one("a / b > 1", read="postgres"), t).sql("postgres")
'TRUNC(CAST("a" AS DECIMAL) / NULLIF(CAST("b" AS DECIMAL), 0)) > CAST(1 AS DECIMAL)'
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from .analyze import to_char
from .analyze.expressions import (
    ExprType,
    make_resolver,
    read_as_declared,
    rebuilt,
    type_row_expression,
)
from .errors import NotSupportedError
from .policy import ColumnPolicy, TablePolicy

_NUMERIC = exp.DataType.build("DECIMAL")  # PostgreSQL NUMERIC, without a typmod
_TEXT = exp.DataType.build("TEXT")
_TIMESTAMP = exp.DataType.build("TIMESTAMP")
_INT = exp.DataType.build("INT")
T = exp.DataType.Type
# Ranges of the integer types a cast may name (DuckDB's, so both backends agree).
_INTEGER_RANGES: dict[exp.DataType.Type, tuple[int, int]] = {
    T.TINYINT: (-(2**7), 2**7 - 1), T.SMALLINT: (-(2**15), 2**15 - 1),
    T.INT: (-(2**31), 2**31 - 1), T.BIGINT: (-(2**63), 2**63 - 1),
    T.INT128: (-(2**127), 2**127 - 1), T.UTINYINT: (0, 2**8 - 1),
    T.USMALLINT: (0, 2**16 - 1), T.UINT: (0, 2**32 - 1), T.UBIGINT: (0, 2**64 - 1),
}
_FLOAT_TYPES = {T.FLOAT, T.DOUBLE, T.DECIMAL}
_DATE_TYPES = {T.DATE, T.TIMESTAMP, T.TIMESTAMPTZ}
_SPACE = "[ \t\n\r]*"
# What NUMERIC's input accepts, limited to 200 digits and a 3-digit exponent so the value
# stays far below NUMERIC's limits.
NUMBER_PATTERN = (f"^{_SPACE}[+-]?([0-9]{{1,200}}([.][0-9]{{0,200}})?|[.][0-9]{{1,200}})"
                  f"([eE][+-]?[0-9]{{1,3}})?{_SPACE}$")
_MONTH_DAY = ("((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)"
              "|(0[13578]|1[02])-31)")
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
# Calendar dates of years 0001-9999 (leap years included), optionally with a time of day.
DATE_PATTERN = (f"^{_SPACE}(?!0000)([0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
                "([ T]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]{1,6})?)?)?"
                f"{_SPACE}$")
BOOLEAN_WORDS = ("true", "t", "yes", "y", "on", "1", "false", "f", "no", "n", "off", "0")
# date ± n takes n below 10^6 days (the analyzer's rule); PostgreSQL's dates run from
# 4714 BC to 5874897 AD, so these dates stay in range after such a shift.
_FIRST_SHIFTABLE_DATE = "1900-01-01 BC"
_LAST_SHIFTABLE_DATE = "5870000-01-01"
# TIMESTAMP runs from 4714-11-24 BC (DATE's first day) to 294276-12-31; a day inside each
# end, a date's midnight is a TIMESTAMPTZ in every time zone.
_FIRST_TIMESTAMP_DATE = "4714-11-25 BC"
_LAST_TIMESTAMP_DATE = "294276-01-01"
# DATE_TRUNC to these units would move the first dates to before the first timestamp.
_FIRST_TRUNCATABLE_DATES = {
    "month": "4714-12-01 BC", "quarter": "4713-01-01 BC", "year": "4713-01-01 BC",
    "decade": "4711-01-01 BC", "century": "4700-01-01 BC", "millennium": "4000-01-01 BC",
}
# NUMERIC overflows beyond 131072 digits before the decimal point; stay well below.
MAX_DIGITS = 100_000
# The digits² a row's NUMERIC divisions (and %) may cost together: a division's time grows
# with the product of its operands' digits (98,000 by 49,000 digits: 0.4 s), and only the
# rows an expression reaches pay it, so wide divisions could make a query's time tell
# whether a chosen row exists. This bound is about 4 ms a row; two columns' division is
# 640,000 (they count 800 digits each).
MAX_DIVISION_WORK = 50_000_000
# A value per person (`analyze.per_unit`) is read by the outer query as a column, of
# _COLUMN_DIGITS: its argument may be no wider than a column. (A sum over up to 10^20 rows
# adds 20 digits the outer estimate does not see: within MAX_DIGITS that leaves NUMERIC's
# limit more than 30,000 digits away. n · 1e50000 of n = MAX(x · 1e99000) overflowed.)
PER_UNIT_DIGITS = 400
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
# A literal compared with a column as it is: converted to float4 at worst, never overflowing.
_PLAIN_LITERAL_LIMIT = 1e15

Typer = Callable[[exp.Expression], ExprType]


def _typer(table: TablePolicy) -> tuple[Typer, Callable[[exp.Column], ColumnPolicy]]:
    """The types of the table's row expressions (each node typed once) and its columns'
    policies, as the rewrite reads them (qualifiers were checked by the analyzer)."""
    resolve = make_resolver(table.name, None, table.columns)

    def lookup(column: exp.Column) -> ColumnPolicy:
        return resolve(exp.column(column.name))

    types: dict[int, ExprType] = {}

    def typed(n: exp.Expression) -> ExprType:
        if id(n) not in types:
            types[id(n)] = type_row_expression(n, lookup)
        return types[id(n)]

    return typed, lookup


def make_total_postgres(node: exp.Expression, table: TablePolicy) -> exp.Expression:
    """A copy of a row expression that cannot raise on PostgreSQL on any data, or a
    NotSupportedError (raised before anything is charged) when none can be built."""
    typed, lookup = _typer(table)
    check_magnitude(node, typed)
    if isinstance(node, exp.Column):
        # a bare column computes nothing, so it cannot raise: no NUMERIC conversion (a
        # COUNT argument or a value to clamp is read as it is)
        return read_as_declared(exp.column(lookup(node).name, quoted=True), lookup(node))
    return rebuilt(node, lambda old, new: _total_node(old, new, table, typed))


def _total_node(old: exp.Expression, new: exp.Expression, table: TablePolicy, typed: Typer
                ) -> exp.Expression:
    """`new` (a copy of `old` over already-total children) made total; `old` is typed."""
    if isinstance(new, exp.Column):
        column = table.column(new.name)
        assert column is not None, "the analyzer resolved every column"
        bare = exp.column(column.name, quoted=True)
        if column.type not in ("int", "float") or column.ldp is not None:
            return read_as_declared(bare, column)  # a local-DP column: its reports
        # NUMERIC holds up to 10^131072 (the engine reads types without their modifiers,
        # so a numeric(10,2) column is held too: one CASE per use)
        return _within_column_digits(_numeric(bare)) if column.storage == "numeric" \
            else _numeric(read_as_declared(bare, column))
    if isinstance(new, exp.Literal) and not new.is_string:
        # NUMERIC, not int4: CASE WHEN … THEN 2147483647 END * 2 cannot overflow. Kept:
        # ROUND's digits and the days of date ± n, which PostgreSQL wants as integers.
        negated_digits = isinstance(old.parent, exp.Neg) and old.parent.arg_key == "decimals"
        if old.arg_key == "decimals" or negated_digits or _is_date_arithmetic(old.parent,
                                                                               typed):
            return new
        return _numeric(new)
    if isinstance(new, exp.Div):
        # typed: a plain `/`, exact on NUMERIC operands (sqlglot would cast an untyped
        # division's operand to DOUBLE PRECISION)
        quotient = exp.Div(this=new.this, expression=_nonzero(new.expression), typed=True,
                           safe=False)
        integer = bool(old.args.get("typed")) and typed(old.this).integer \
            and typed(old.expression).integer
        return exp.func("TRUNC", quotient) if integer else quotient
    if isinstance(new, exp.Mod):
        return exp.Mod(this=new.this, expression=_nonzero(new.expression))
    if isinstance(new, exp.Add | exp.Sub) and _is_date_arithmetic(old, typed):
        return _date_arithmetic(old, new, typed)
    if isinstance(new, exp.Cast | exp.TryCast):
        return _cast(new.this, typed(old.this).kind, new.to)
    if isinstance(new, exp.Substring):
        for arg, low in (("start", -(2**31)), ("length", 0)):
            if new.args.get(arg) is not None:
                new.set(arg, _integer_in(new.args[arg], low, 2**31 - 1, _INT))
        return new
    if isinstance(new, exp.Extract):
        source = _timestamp(new.expression, typed(old.expression).kind)
        return _numeric(exp.Extract(this=new.this, expression=source))
    if isinstance(new, exp.TimeToStr):  # NULL outside the years DuckDB formats alike
        new.set("this", exp.cast(new.this, exp.DataType.build("TIMESTAMP")))
        return to_char.in_range(new.this.this, new)
    if isinstance(new, exp.DateTrunc | exp.TimestampTrunc):
        unit = new.args.get("unit")
        first = _FIRST_TRUNCATABLE_DATES.get(unit.name.lower() if unit is not None else "",
                                             _FIRST_TIMESTAMP_DATE)
        new.set("this", _timestamp(new.this, typed(old.this).kind, first))
        return new
    if isinstance(new, exp.Length):
        return _numeric(new)
    if isinstance(new, exp.Like | exp.ILike | exp.RegexpLike | exp.RegexpILike):
        new.set("this", _default_collation(new.this))
        if isinstance(new, exp.Like | exp.ILike):
            return exp.Escape(this=new, expression=exp.Literal.string(""))
        return new
    if isinstance(new, exp.DPipe):
        for arg in ("this", "expression"):
            if typed(old.args[arg]).kind != "text":
                new.set(arg, exp.cast(new.args[arg], _TEXT.copy()))
        return new
    if isinstance(new, _COMPARISONS) and all(_plain_number(old.args[arg], typed, table)
                                             for arg in ("this", "expression")):
        # comparing numeric columns and number literals cannot raise (PostgreSQL widens
        # within its numeric types): no NUMERIC conversion of every row
        for arg in ("this", "expression"):
            source = old.args[arg]
            column = table.column(source.name) if isinstance(source, exp.Column) else None
            new.set(arg, exp.column(column.name, quoted=True) if column is not None
                    else source.copy())
        return new
    if isinstance(new, exp.Floor | exp.Ceil) and new.args.get("decimals") is not None:
        raise NotSupportedError(f"{new.sql_name()} with a number of digits is not available "
                                "on PostgreSQL", hint="use ROUND(x, digits)")
    return new


def _default_collation(subject: exp.Expression) -> exp.Expression:
    """A pattern match's subject under the database's default collation. PostgreSQL 15
    matches no pattern under a nondeterministic collation (an ICU one with
    `deterministic = false`): LIKE, ILIKE and `~` fail there as soon as a row reaches
    them, after the charge, so whether the query failed told whether such a row exists.
    A column of the default collation (the usual case) matches as before; citext keeps
    its own case-insensitive operators."""
    operand = subject if isinstance(subject, exp.Column | exp.Paren) \
        else exp.Paren(this=subject)
    return exp.Collate(this=operand, expression=exp.to_identifier("default", quoted=True))


def _plain_number(node: exp.Expression, typed: Typer, table: TablePolicy) -> bool:
    """A numeric column stored as a number, or a number literal well inside every numeric
    type's range."""
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return typed(node).kind == "num" and column is not None \
            and read_as_declared(node, column) is node
    if isinstance(node, exp.Neg):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string \
        and abs(float(node.this)) <= _PLAIN_LITERAL_LIMIT


def _numeric(node: exp.Expression) -> exp.Expression:
    return exp.cast(node, _NUMERIC.copy())


def _within_column_digits(value: exp.Expression) -> exp.Expression:
    """A NUMERIC column's value held to 400 digits on either side of the point, as
    check_magnitude reads every column: within ±(10^400 − 1) (1e70000 squared overflowed
    NUMERIC on that one row, after the charge), and rounded to 400 decimal places where
    it has more (a chain of nine divisions by 1e-16383 overflowed it: a magnitude below
    10^-400 reads as 0, which a division's NULLIF then guards). NULL stays NULL, NaN
    becomes the upper end (as every clamp reads it)."""
    limit = exp.Literal.number("9" * _COLUMN_DIGITS[0])
    negative = exp.Neg(this=limit.copy())
    places = exp.Literal.number(_COLUMN_DIGITS[1])
    return exp.Case(ifs=[exp.If(this=exp.GT(this=value.copy(), expression=limit.copy()),
                                true=limit.copy()),
                         exp.If(this=exp.LT(this=value.copy(), expression=negative.copy()),
                                true=negative.copy()),
                         exp.If(this=exp.GT(this=exp.Anonymous(this="SCALE",
                                                               expressions=[value.copy()]),
                                            expression=places.copy()),
                                true=exp.func("ROUND", value.copy(), places.copy()))],
                    default=value.copy())


def _nonzero(divisor: exp.Expression) -> exp.Expression:
    return exp.Nullif(this=divisor, expression=exp.Literal.number(0))


def _case(condition: exp.Expression, value: exp.Expression) -> exp.Expression:
    """CASE WHEN condition THEN value END: PostgreSQL evaluates value only when the
    condition holds (also when folding constants), so a guarded cast never runs."""
    return exp.Case(ifs=[exp.If(this=condition, true=value)])


def _is_date_arithmetic(node: exp.Expression | None, typed: Typer) -> bool:
    return isinstance(node, exp.Add | exp.Sub) and "date" in (
        typed(node.this).kind, typed(node.expression).kind)


def as_date(node: exp.Expression) -> exp.Expression:
    """A date-valued row expression as a DATE: as it is where it is one already (a date
    column, a cast to DATE, date arithmetic), else cast (a midnight TIMESTAMP from
    DATE_TRUNC or a timestamp literal, or a CASE, COALESCE, GREATEST… that may hold one:
    the same day)."""
    inner = node
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Column | exp.Add | exp.Sub) \
            or (isinstance(inner, exp.Cast | exp.TryCast)
                and inner.to.is_type(exp.DataType.Type.DATE)):
        return node
    return exp.cast(node, "DATE")


def _date_arithmetic(old: exp.Expression, new: exp.Expression, typed: Typer
                     ) -> exp.Expression:
    for arg in ("this", "expression"):  # a DATE_TRUNC is a TIMESTAMP: no TIMESTAMP ± n
        if typed(old.args[arg]).kind == "date":
            new.set(arg, as_date(new.args[arg]))
    if typed(old.this).kind == "date" and typed(old.expression).kind == "date":
        finite = exp.and_(exp.func("ISFINITE", new.this.copy()),
                          exp.func("ISFINITE", new.expression.copy()))
        return _case(finite, _numeric(new))  # an infinite date: NULL, not an error
    date = new.this if typed(old.this).kind == "date" else new.expression
    days = "expression" if date is new.this else "this"  # a constant (NUMERIC by now)
    new.set(days, exp.cast(new.args[days], _INT.copy()))
    shiftable = exp.or_(
        exp.not_(exp.func("ISFINITE", date.copy())),
        exp.Between(this=date.copy(),
                    low=exp.cast(exp.Literal.string(_FIRST_SHIFTABLE_DATE), "DATE"),
                    high=exp.cast(exp.Literal.string(_LAST_SHIFTABLE_DATE), "DATE")))
    return _case(shiftable, new)


def _timestamp(source: exp.Expression, kind: str, first: str = _FIRST_TIMESTAMP_DATE,
               to: exp.DataType = _TIMESTAMP) -> exp.Expression:
    """The source as a TIMESTAMP or `to` (EXTRACT(hour FROM a DATE) raises); a date is
    NULL before `first` and from year 294276 (dates run further than timestamps), an
    infinite one is kept."""
    if kind != "date":
        return _cast(source, kind, to.copy())
    representable = exp.or_(
        exp.not_(exp.func("ISFINITE", source.copy())),
        exp.and_(exp.GTE(this=source.copy(),
                         expression=exp.cast(exp.Literal.string(first), "DATE")),
                 exp.LT(this=source.copy(),
                        expression=exp.cast(exp.Literal.string(_LAST_TIMESTAMP_DATE), "DATE"))))
    return _case(representable, exp.cast(source, to.copy()))


def _as_text(node: exp.Expression) -> exp.Expression:
    # a quoted literal is typed text first: CAST('abc' AS NUMERIC) would fail while the
    # statement is parsed, before any guard could skip it
    return exp.cast(node, _TEXT.copy())


def _matches(text: exp.Expression, pattern: str) -> exp.Expression:
    return exp.RegexpLike(this=text, expression=exp.Literal.string(pattern))


def _cast(value: exp.Expression, kind: str, to: exp.DataType) -> exp.Expression:
    """CAST(value AS to) for a value of analyzer kind `kind`, total on PostgreSQL."""
    target = to.this
    if kind in ("text", "unknown"):
        text = _as_text(value)
        if target in _INTEGER_RANGES or target in _FLOAT_TYPES:
            number = exp.cast(text.copy(), _NUMERIC.copy())
            return _case(_matches(text, NUMBER_PATTERN), _number_as(number, to))
        if target in _DATE_TYPES:
            return _case(_matches(text, DATE_PATTERN), exp.cast(text.copy(), to))
        if target == T.BOOLEAN:
            word = exp.Lower(this=exp.Trim(this=text))
            words = [exp.Literal.string(w) for w in BOOLEAN_WORDS]
            return _case(exp.In(this=word, expressions=words), exp.cast(word.copy(), to))
        return exp.cast(text, to)
    if kind == "null":
        return exp.cast(value, _NUMERIC.copy() if _is_number(to) else to)
    if kind == "num":
        if _is_number(to):
            return _number_as(value, to)
        if target == T.BOOLEAN:
            return exp.NEQ(this=value, expression=exp.Literal.number(0))
        if to.is_type(*exp.DataType.TEXT_TYPES):
            return exp.cast(value, to)
    if kind == "bool":
        if _is_number(to):
            bit = exp.Case(ifs=[exp.If(this=value, true=exp.Literal.number(1)),
                                exp.If(this=exp.not_(value.copy()),
                                       true=exp.Literal.number(0))])
            return _numeric(bit)
        if target == T.BOOLEAN or to.is_type(*exp.DataType.TEXT_TYPES):
            return exp.cast(value, to)
    if kind == "date" and target in (T.TIMESTAMP, T.TIMESTAMPTZ):
        return _timestamp(value, kind, to=to)
    if kind == "date" and (target in _DATE_TYPES or to.is_type(*exp.DataType.TEXT_TYPES)):
        return exp.cast(value, to)
    raise NotSupportedError(f"CAST of a {kind} to {to.sql('postgres')} is not available on "
                            "PostgreSQL", hint="EXTRACT(epoch FROM d) turns a date into a "
                            "number; compare a boolean instead of casting it")


def _is_number(to: exp.DataType) -> bool:
    return to.this in _INTEGER_RANGES or to.this in _FLOAT_TYPES


def _number_as(number: exp.Expression, to: exp.DataType) -> exp.Expression:
    """A NUMERIC value as the number type `to`: integers round half to even and are NULL
    out of range; DECIMAL(p, s) rounds to s digits and is NULL when too large; other
    types keep the exact value."""
    if to.this in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[to.this]
        return _integer_in(number, low, high, None)
    if to.this == T.DECIMAL and to.expressions:
        precision = int(to.expressions[0].name)
        scale = int(to.expressions[1].name) if len(to.expressions) > 1 else 0
        rounded = exp.func("ROUND", number, exp.Literal.number(scale))
        fits = exp.LT(this=exp.Abs(this=rounded.copy()),
                      expression=exp.Literal.number(f"1e{precision - scale}"))
        return _case(fits, rounded)
    return number


def _integer_in(number: exp.Expression, low: int, high: int, to: exp.DataType | None
                ) -> exp.Expression:
    """The nearest integer (ties to even) if it lies in [low, high], else NULL; cast to
    `to` when given (safe: the value is in range). NaN and ±Infinity give NULL."""
    half = exp.EQ(this=exp.Abs(this=exp.Sub(this=number.copy(),
                                            expression=exp.func("TRUNC", number.copy()))),
                  expression=exp.Literal.number("0.5"))
    even = exp.Mul(this=exp.Literal.number(2), expression=exp.func(
        "ROUND", exp.Div(this=number.copy(), expression=exp.Literal.number(2), typed=True)))
    nearest = exp.Case(ifs=[exp.If(this=half, true=even)],
                       default=exp.func("ROUND", number.copy()))
    inside = exp.Between(this=nearest.copy(), low=exp.Literal.number(low),
                         high=exp.Literal.number(high))
    return _case(inside, exp.cast(nearest, to) if to is not None else nearest)


# -- magnitude ---------------------------------------------------------------------------------
# Bounds on the decimal digits of a value: (before the point, after it). Columns of
# PostgreSQL's number types hold less than 10^400 with fewer than 400 decimals.
_COLUMN_DIGITS = (400, 400)
_TEXT_NUMBER_DIGITS = (1200, 1200)  # NUMBER_PATTERN: 200 digits, exponent below 1000
_DIVISION_SCALE = 1000  # NUMERIC division keeps at most 1000 decimals


def check_magnitude(node: exp.Expression, typed: Typer) -> tuple[int, int]:
    """Bound the digits of every NUMERIC value the total expression computes; reject
    (free, before any charge) an expression that could come near NUMERIC's overflow.

    >>> from sqlglot import parse_one
    >>> check_magnitude(parse_one("2 * 3.25"), lambda n: ExprType("num"))
    (2, 2)
    """
    work = [0]
    digits = _digits(node, typed, work)
    if digits[0] > MAX_DIGITS:
        raise NotSupportedError(
            "the expression could produce numbers too large for PostgreSQL's NUMERIC",
            hint="clamp intermediate values with LEAST/GREATEST, or simplify the expression")
    if work[0] > MAX_DIVISION_WORK:
        raise NotSupportedError(
            "the expression divides numbers too wide for PostgreSQL's NUMERIC to do it "
            "quickly on every row", hint="divide narrower values (clamp them with "
                                         "LEAST/GREATEST), or fewer times")
    return digits


def per_unit_digits(node: exp.Expression, table: TablePolicy) -> None:
    """Refuse (before any charge) an argument of a value per person whose sum could have
    more digits than the outer query reads a column to have (PER_UNIT_DIGITS)."""
    digits = check_magnitude(node, _typer(table)[0])
    if digits[0] > PER_UNIT_DIGITS:
        raise NotSupportedError(
            "a value per person could be too large for PostgreSQL's NUMERIC",
            hint="clamp the argument inside the subquery with LEAST/GREATEST")


def _digits(node: exp.Expression, typed: Typer, work: list[int]) -> tuple[int, int]:
    """(digits before the point, after it) of node's value; adds its divisions' digits²
    to work[0]."""
    children = [_digits(c, typed, work) for c in node.iter_expressions()]
    for before, _ in children:
        if before > MAX_DIGITS:
            return before, 0
    if isinstance(node, exp.Column):
        return _COLUMN_DIGITS if typed(node).kind == "num" else (0, 0)
    if isinstance(node, exp.Literal):
        return _literal_digits(node)
    if isinstance(node, exp.Cast | exp.TryCast):
        if node.to.this in _INTEGER_RANGES:
            return (40, 0)
        source = typed(node.this).kind
        return _TEXT_NUMBER_DIGITS if source in ("text", "unknown") else children[0]
    if isinstance(node, exp.Length):
        return (10, 0)
    if isinstance(node, exp.Extract):
        return (20, 6)
    if not children:
        return (0, 0)
    before = max(c[0] for c in children)
    after = max(c[1] for c in children)
    if isinstance(node, exp.Add | exp.Sub):
        return before + 1, after
    if isinstance(node, exp.Mul):
        (a, sa), (b, sb) = children[0], children[1]
        return a + b, min(sa + sb, 16383)  # NUMERIC rounds products beyond 16383 decimals
    if isinstance(node, exp.Div | exp.Mod):
        (a, sa), (b, sb) = children[0], children[1]
        work[0] += (a + sa) * (b + sb)
    if isinstance(node, exp.Div):
        # |a / b| <= |a| / (smallest nonzero |b|) = |a| * 10^(decimals of b)
        return a + sb + 1, _DIVISION_SCALE
    if isinstance(node, exp.Round | exp.Floor | exp.Ceil | exp.Trunc):
        return before + 1, after
    return before, after


def _literal_digits(node: exp.Literal) -> tuple[int, int]:
    if node.is_string:
        return (0, 0)
    try:
        value = Decimal(node.this)
    except InvalidOperation:
        return (0, 0)
    if not value.is_finite() or value == 0:
        return (1, 0)
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    return max(value.adjusted() + 1, 1), max(-exponent, 0)


# Bounds below this keep every sum of clamped values (fewer than 10^12 rows) far inside
# DOUBLE PRECISION's range.
_FLOAT_SAFE_BOUND = 1e200


def clamp_source_postgres(argument: exp.Expression, table: TablePolicy, lower: float,
                          upper: float) -> tuple[exp.Expression, exp.DataType]:
    """The total value to clamp to [lower, upper] and the type to clamp it in.

    A bare column stored as an integer or floating-point type (`ColumnPolicy.storage`, read
    when the engine opens its backend) is clamped in DOUBLE PRECISION: without arithmetic
    nothing can overflow or underflow (NaN and ±Infinity clamp to a bound), and converting
    every row to NUMERIC would cost far more than the aggregate. Anything else is NUMERIC,
    a NUMERIC column included: its 1e400 or 1e-330 would not convert to DOUBLE PRECISION.
    """
    if clamps_in_double(argument, table, lower, upper):
        assert isinstance(argument, exp.Column)
        column = table.column(argument.name)
        assert column is not None
        double = exp.DataType.build("DOUBLE")
        return exp.cast(exp.column(column.name, quoted=True), double), double
    return make_total_postgres(argument, table), _NUMERIC.copy()


def clamps_in_double(argument: exp.Expression, table: TablePolicy, lower: float,
                     upper: float) -> bool:
    """Whether `clamp_source_postgres` clamps this argument in DOUBLE PRECISION (else in
    NUMERIC, where a value such as 1e-330 is still exact)."""
    if not isinstance(argument, exp.Column) or max(abs(lower), abs(upper)) > _FLOAT_SAFE_BOUND:
        return False
    column = table.column(argument.name)
    return column is not None and column.type in ("int", "float") \
        and column.storage in NATIVE_NUMBER_TYPES


def clamps_in_integer(argument: exp.Expression, table: TablePolicy, lower: float,
                      upper: float) -> bool:
    """Whether an argument is clamped in its own integer type: a bare int column stored as
    an integer type, with whole bounds well inside BIGINT. Its clamped values are whole
    numbers already (no ROUND) and sum exactly, without a conversion per row."""
    if not (isinstance(argument, exp.Column) and float(lower).is_integer()
            and float(upper).is_integer() and max(abs(lower), abs(upper)) <= _INTEGER_SAFE):
        return False
    column = table.column(argument.name)
    return column is not None and column.type == "int" \
        and column.storage in NATIVE_INTEGER_TYPES


# Whole bounds up to this keep a clamped value minus its centre inside BIGINT, and are
# exact as floats
_INTEGER_SAFE = 2**53


# PostgreSQL's types (as format_type names them) whose values convert to DOUBLE PRECISION
# without an error
NATIVE_INTEGER_TYPES = frozenset({"smallint", "integer", "bigint"})
NATIVE_NUMBER_TYPES = NATIVE_INTEGER_TYPES | {"real", "double precision"}
