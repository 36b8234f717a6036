"""Rewrite a query plan into one SQL statement the backend runs whole.

The statement returns one row per group with the exact statistics of the plan,
never a raw row. Three transformations make it safe to run:

* totality (`make_total`): numbers are computed in DOUBLE, constants included (no
  overflow errors), divisors go through NULLIF(…, 0), casts become TRY_CAST, dates near
  the ends of the range become NULL before a shift or truncation could leave it (on
  PostgreSQL: `rewrite_postgres`), so whether the query fails never depends on
  private values;
* clamping: each summed value is clamped to its bounds after the row
  expression is evaluated (NULL stays NULL), then centred, and a real-valued one
  taken in fixed point (`clamped`), so that its sum is exact;
* contribution bounding: each privacy unit keeps at most `max_groups` groups, chosen
  by a hash salted afresh for every query, and adds at most `max_rows` rows' worth to
  each — by hash aggregation per (unit, group) pair rather than a window sort over all
  rows (`_bounded_pairs`: a SUM adds the pair's total clamped to `max_rows` × the
  bounds, `_clamped_total`; the sums inside AVG and the variance family add `max_rows`
  × the mean of a pair over `max_rows` values, `_bounded_sum`, in proportion to its
  bounded count); plans with a quantile, and joins that number rows, keep
  `max_rows` rows drawn at random, ranking rows with windows (`_ranked_rows`);
* joins with public tables (`joined_source`) happen first, in the innermost
  subquery, so bounding counts every match of a row as a row of its unit.

A quantile measurement (`dpproxy.quantiles`) needs each group's histogram of its
clamped argument over fixed bins. The statement then aggregates twice: first per
group *and bin* (so every other statistic is computed as a partial per bin, the
distinct-unit counts as rows ranked first of their unit and group), then per group,
summing the partials and collecting the (bin, rows) pairs with ARRAY_AGG. Each pair
counts rows, like COUNT(*): no row and no value crosses, only the sparse histogram.

>>> from dpproxy.policy import ColumnPolicy, TablePolicy
>>> from sqlglot import parse_one
>>> t = TablePolicy("t", {"a": ColumnPolicy("a", "int", 0, 10), "b": ColumnPolicy("b", "int")})
>>> make_total(parse_one("a / b > 1", read="postgres"), t).sql("duckdb")
'TRUNC(CAST("a" AS DOUBLE) / NULLIF(CAST("b" AS DOUBLE), 0)) > CAST(1.0 AS DOUBLE)'
"""

from __future__ import annotations

import math
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property

from sqlglot import exp

from .analyze import Analysis, GroupKey, to_char
from .analyze.aggregates import Statistic
from .analyze.expressions import (
    constant_digits,
    make_resolver,
    read_as_declared,
    rebuilt,
    type_row_expression,
)
from .analyze.per_unit import PerUnit
from .bounds import BoundCheck, Unbounded, bound_check, read_table
from .clock import date_literal
from .plan import Measurement, QueryPlan
from .policy import ColumnPolicy, TablePolicy
from .quantiles import binning_for
from .rewrite_postgres import (
    NATIVE_NUMBER_TYPES,
    as_date,
    clamp_source_postgres,
    clamps_in_double,
    clamps_in_integer,
    make_total_postgres,
    per_unit_digits,
)
from .shapes import parameter_type, slot_index

UNIT = "__unit"
ROWS = "__rows"
ROW_RANK = "__row_rank"
GROUP_RANK = "__group_rank"
RANDOM = "__random"
ROW_ID = "__row_id"
SELECTION = "units_for_selection"
BIN_ROWS = "__bin_rows"
GROUP_ORDER = "__group_order"
_DOUBLE = exp.DataType.build("DOUBLE")
_BIGINT = exp.DataType.build("BIGINT")
_UBIGINT = exp.DataType.build("UBIGINT", dialect="duckdb")
# Most public-key combinations packed under a group's hash (`_group_codes`): 2^20 leaves 44
# hash bits to order a unit's groups, the code breaking their (astronomically rare) ties
_MAX_CODES = 1 << 20


@dataclass(frozen=True, eq=False)
class Rewritten:
    """One backend statement, generated on first use of `sql` (a backend that runs the
    `unbounded` form instead never needs it); its parameters are the per-query salt, if
    any, then the values of its WHERE slots (`dpproxy.shapes`), if any."""

    key_columns: tuple[str, ...]  # result columns holding group keys, in order
    measurement_columns: tuple[str, ...]  # result columns holding plan.measurements, in order
    salted: bool  # True: bind a fresh salt (`new_salt()`) as its first parameter
    generate: Callable[[], str] = field(repr=False)  # the statement, in the backend's dialect
    # the same statistics unbounded, for data where no unit exceeds the bounds
    unbounded: Unbounded | None = None
    slots: int = 0  # WHERE literals left as parameters, bound per execution
    # True: a last column holds each group's count of distinct units (partition selection by
    # units); a plan selecting by its released count needs none
    unit_counts: bool = False

    @cached_property
    def sql(self) -> str:
        return self.generate()

    def parameters(self, values: Sequence[object] = ()) -> tuple[object, ...]:
        """The statement's parameters for one execution: a salt drawn afresh, then the
        slots' values (exactly one per slot)."""
        if len(values) != self.slots:
            raise ValueError(f"the statement has {self.slots} slots, {len(values)} values "
                             "were given")
        return ((new_salt(),) if self.salted else ()) + tuple(values)


def new_salt() -> str:
    return secrets.token_hex(16)


def make_total(node: exp.Expression, table: TablePolicy, dialect: str = "duckdb"
               ) -> exp.Expression:
    """A copy of a row expression that cannot raise on any data: DOUBLE, NULLIF, TRY_CAST
    (on PostgreSQL: NUMERIC, NULLIF and guarded casts, see `rewrite_postgres`)."""
    if dialect == "postgres":
        return make_total_postgres(node, table)
    resolve = make_resolver(table.name, None, table.columns)
    # Types are read off the original tree, before any node is replaced.
    def integer(n: exp.Expression) -> bool:
        return type_row_expression(n, _lenient(resolve)).integer

    integer_division = {
        id(div): bool(div.args.get("typed")) and integer(div.this) and integer(div.expression)
        for div in node.find_all(exp.Div)
    }
    # Integers are computed in DOUBLE; as text they must still read '39', not '39.0'.
    integer_to_text = {
        id(cast): integer(cast.this) for cast in node.find_all(exp.Cast, exp.TryCast)
        if cast.to.is_type(*exp.DataType.TEXT_TYPES)
    }
    return rebuilt(node, lambda old, new: _total_node(
        new, table, integer_division.get(id(old), False) or integer_to_text.get(id(old), False)))


def _lenient(resolve):  # type: ignore[no-untyped-def]
    def lookup(node: exp.Column) -> ColumnPolicy:
        # qualifiers were checked by the analyzer; the rewrite strips them
        return resolve(exp.column(node.name))
    return lookup


def _total_node(node: exp.Expression, table: TablePolicy, integer_valued: bool
                ) -> exp.Expression:
    """One node made total; `integer_valued`: an integer division, or a cast of an
    integer to text."""
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        assert column is not None, "the analyzer resolved every column"
        bare = exp.column(column.name, quoted=True)
        # a local-DP column holds reports (read_as_declared), whatever its declared type
        return exp.cast(bare, _DOUBLE) if column.type in ("int", "float") \
            and column.ldp is None else read_as_declared(bare, column)
    if isinstance(node, exp.Literal) and not node.is_string and not _kept_as_written(node):
        # DOUBLE, as the columns: DuckDB reads 28 digits as a HUGEINT and 0.00000000001 as a
        # DECIMAL(11,11), and converts them to a common type only when a row reaches them
        # (CASE WHEN <a rare row> THEN 10^28 END = 0.00000000001 failed there alone), and a
        # DECIMAL key would group apart values released as one float. Written as the double
        # itself: 400 digits are a BIGNUM, which fails to convert (where a row reaches it)
        if slot_index(node) is not None:  # a parameter of the shape, bound as a DOUBLE
            return exp.cast(node, _DOUBLE)
        value = float(node.this)
        if not math.isfinite(value):
            return exp.cast(exp.Literal.string("inf"), _DOUBLE)
        return exp.cast(exp.Literal.number(repr(value)), _DOUBLE)
    if isinstance(node, exp.Div):
        quotient = exp.Div(this=node.this, expression=_nonzero(node.expression), typed=False,
                           safe=False)
        return exp.func("TRUNC", quotient) if integer_valued else quotient
    if isinstance(node, exp.Mod):
        return _in_double(exp.Mod(this=node.this, expression=_nonzero(node.expression)))
    if isinstance(node, exp.Mul | exp.Neg | exp.Abs):
        return _in_double(node)
    if isinstance(node, exp.Cast | exp.TryCast):
        source = exp.TryCast(this=node.this, to=_BIGINT.copy()) if integer_valued else node.this
        # a date-valued cast is a DATE (see the DATE_TRUNC branch), and within the dates
        # DuckDB can also hold as a TIMESTAMP, the type a DATE meets beside a TIMESTAMP
        if node.to.is_type(exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP,
                           exp.DataType.Type.TIMESTAMPTZ):
            return _date_within(exp.TryCast(this=source, to=_DATE.copy()),
                                _FIRST_TIMESTAMP_DATE, _LAST_TIMESTAMP_DATE)
        safe = exp.TryCast(this=source, to=node.to)
        return exp.cast(safe, _DOUBLE) if _is_numeric_type(node.to) else safe
    if isinstance(node, exp.Substring):
        # positions are INT for the backend, NULL beyond (DuckDB raises beyond ±2^32, and
        # PostgreSQL's positions are INT too)
        for arg in ("start", "length"):
            if node.args.get(arg) is not None:
                node.set(arg, exp.TryCast(this=node.args[arg], to=_INT.copy()))
        return node
    if isinstance(node, exp.Add | exp.Sub):
        return _date_arithmetic(node, table)
    if isinstance(node, exp.Extract):
        if node.this.name.lower() in ("week", "isoyear"):
            # both read the ISO year's first day, which precedes DuckDB's first date for
            # dates before this one (a TIMESTAMP is read as its date: always in range)
            first = exp.GTE(this=exp.cast(node.expression.copy(), _DATE),
                            expression=date_literal(_FIRST_ISO_WEEK_DATE))
            node.set("expression", exp.Case(ifs=[exp.If(this=first, true=node.expression)]))
        return exp.cast(node, _DOUBLE)  # integer-valued; DOUBLE keeps later arithmetic total
    if isinstance(node, exp.Length):
        return exp.cast(node, _DOUBLE)
    if isinstance(node, exp.Round) and node.args.get("decimals") is not None:
        digits = constant_digits(node.args["decimals"])
        assert digits is not None, "the analyzer takes constant digits only"
        return _round_to_digits(node.this, digits)
    if isinstance(node, exp.Trunc) and node.args.get("decimals") is not None:
        # whole tens, hundreds… (the analyzer takes no positive digits), written out as
        # ROUND is: TRUNC(x / 10^k) · 10^k, in DOUBLE
        digits = constant_digits(node.args["decimals"])
        assert digits is not None, "the analyzer takes constant digits only"
        if digits >= 0:
            return exp.func("TRUNC", node.this)
        scale = exp.Literal.number(repr(10.0 ** min(-digits, 300)))
        return _in_double(exp.Mul(this=exp.func("TRUNC", exp.Div(
            this=node.this, expression=scale.copy(), typed=False, safe=False)),
            expression=scale))
    if isinstance(node, exp.RegexpLike | exp.RegexpILike):
        # `.` matches a newline, as in PostgreSQL (option s); ~* ignores case (option i)
        options = "is" if isinstance(node, exp.RegexpILike) else "s"
        return exp.func("REGEXP_MATCHES", node.this, node.expression,
                        exp.Literal.string(options))
    if isinstance(node, exp.TimeToStr):  # the same text PostgreSQL's TO_CHAR writes
        return to_char.duckdb_expression(node.this, to_char.parse_format(to_char.format_of(node)))
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):
        # DATE_TRUNC computes in TIMESTAMP, whose range is narrower than DATE's
        unit = node.args.get("unit")
        first = _FIRST_TRUNCATABLE_DATES.get(unit.name.lower() if unit is not None else "",
                                             _FIRST_TIMESTAMP_DATE)
        node.set("this", _date_within(node.this, first, _LAST_TIMESTAMP_DATE))
        # its TIMESTAMP as a DATE (the same day): beside a DATE, DuckDB would convert the
        # DATE to a TIMESTAMP, which fails, where a row reaches it, for a date beyond
        # TIMESTAMP's range (294247-01-11 compared with DATE_TRUNC('year', day))
        return exp.cast(node, _DATE.copy())
    return node


def _kept_as_written(node: exp.Literal) -> bool:
    """ROUND's or TRUNC's digits (the rewrite reads them as a constant), also negated, an
    array index (a local-DP report's bit) and a type's parameter (DECIMAL(3, 1)):
    integers, as the backend wants them."""
    parent = node.parent
    while isinstance(parent, exp.Neg):
        node, parent = parent, parent.parent  # type: ignore[assignment]
    return isinstance(parent, exp.Bracket | exp.DataTypeParam) or (
        isinstance(parent, exp.Round | exp.Trunc) and node.arg_key == "decimals")


def _round_to_digits(value: exp.Expression, digits: int) -> exp.Expression:
    """ROUND(value, digits) as value scaled by 10^digits, rounded half away from zero and
    scaled back, in DOUBLE; the value itself where that is not finite (digits beyond the
    DOUBLE range).

    Written out, not DuckDB's ROUND(x, n), whose result changed between releases (2.0.1
    rounds the exact binary value: 12.45 is 12.4499… and goes down, where 2.0.0 and
    PostgreSQL's NUMERIC give 12.5), and answers must not depend on the engine's version.
    """
    if digits > 300:  # no DOUBLE has digits this far down (10^digits would overflow)
        return value
    scale = exp.Literal.number(repr(10.0 ** abs(digits)))
    if digits >= 0:
        rounded: exp.Expression = exp.Div(
            this=exp.func("ROUND", _in_double(exp.Mul(this=value.copy(),
                                                      expression=scale.copy()))),
            expression=scale, typed=False, safe=False)
    else:  # the analyzer takes non-negative digits only; kept total all the same
        rounded = _in_double(exp.Mul(this=exp.func("ROUND", exp.Div(
            this=value.copy(), expression=scale.copy(), typed=False, safe=False)),
            expression=scale))
    return exp.Case(ifs=[exp.If(this=exp.func("ISFINITE", rounded.copy()), true=rounded)],
                    default=value)


_INT = exp.DataType.build("INT")
_DATE = exp.DataType.build("DATE")
# DuckDB's DATE runs from 5877642-06-25 (BC) to 5881580-07-10, its TIMESTAMP from
# 290309-12-22 (BC) to 294247-01-10 04:00:54. date ± n takes n below 10^6 days (the
# analyzer's rule): dates between these stay in range after such a shift.
_FIRST_SHIFTABLE_DATE = "5870000-01-01 (BC)"
_LAST_SHIFTABLE_DATE = "5870000-01-01"
# The dates DATE_TRUNC reads: those whose midnight is a TIMESTAMP, later for the units that
# would truncate the first ones to before the first TIMESTAMP.
_FIRST_TIMESTAMP_DATE = "290309-12-22 (BC)"
_LAST_TIMESTAMP_DATE = "294247-01-10"
_FIRST_TRUNCATABLE_DATES = {unit: "290308-01-01 (BC)" for unit in ("month", "quarter", "year")}
_FIRST_ISO_WEEK_DATE = "5877641-01-04 (BC)"


def _is_date(node: exp.Expression, table: TablePolicy) -> bool:
    """Whether a row expression the analyzer accepted is a date, read off its shape (the
    analyzer made the branches of CASE, COALESCE, … agree; a date minus a date is a
    number)."""
    if isinstance(node, exp.Paren | exp.Nullif):
        return _is_date(node.this, table)
    if isinstance(node, exp.Column):
        column = table.column(node.name)
        return column is not None and column.type == "date"
    if isinstance(node, exp.Cast | exp.TryCast):
        return node.to.is_type(exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP,
                               exp.DataType.Type.TIMESTAMPTZ)
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):
        return True
    if isinstance(node, exp.Add):
        return _is_date(node.this, table) or _is_date(node.expression, table)
    if isinstance(node, exp.Sub):
        return _is_date(node.this, table) and not _is_date(node.expression, table)
    if isinstance(node, exp.Case | exp.If):
        branches = [b.args.get("true") for b in node.args.get("ifs", [])]
        branches += [node.args.get("true"), node.args.get("default"), node.args.get("false")]
        return any(_is_date(b, table) for b in branches if b is not None)
    if isinstance(node, exp.Coalesce | exp.Least | exp.Greatest):
        return any(_is_date(a, table) for a in (node.this, *node.expressions))
    return False


def _date_arithmetic(node: exp.Add | exp.Sub, table: TablePolicy) -> exp.Expression:
    """date ± n NULL where the date is near an end of DuckDB's range (the shift would
    overflow there); date − date (a BIGINT) as DOUBLE, so later arithmetic cannot overflow."""
    dates = [arg for arg in ("this", "expression") if _is_date(node.args[arg], table)]
    for arg in dates:  # a DATE_TRUNC is a TIMESTAMP: TIMESTAMP ± n and − DATE do not exist
        node.set(arg, as_date(node.args[arg]))
    if len(dates) == 2:
        return exp.cast(node, _DOUBLE)
    if not dates:
        return _in_double(node)
    for arg in dates:
        node.set(arg, _date_within(node.args[arg], _FIRST_SHIFTABLE_DATE, _LAST_SHIFTABLE_DATE))
    # the days: a constant the analyzer took (`-1` would be -CAST(1 AS DOUBLE) by now)
    days = "expression" if dates == ["this"] else "this"
    node.set(days, exp.cast(node.args[days], _INT.copy()))
    return node



def _in_double(node: exp.Expression) -> exp.Expression:
    """Arithmetic on numbers with its operands in DOUBLE, which overflows to ±inf instead of
    raising: columns are DOUBLE already, but integer constants are INTEGER, and a CASE can
    pick a constant by the data (`CASE WHEN x > 0 THEN 2147483647 ELSE 0 END * 2`)."""
    for arg in ("this", "expression"):
        operand = node.args.get(arg)
        if isinstance(operand, exp.Expression) and not _is_double(operand):
            node.set(arg, exp.cast(operand, _DOUBLE))
    return node


def _is_double(node: exp.Expression) -> bool:
    """Whether a node made total is DOUBLE already: a cast to it, `/`, or arithmetic over
    DOUBLE operands (children are made total first)."""
    if isinstance(node, exp.Cast | exp.TryCast):
        return node.to.is_type(exp.DataType.Type.DOUBLE)
    if isinstance(node, exp.Div):
        return True
    if isinstance(node, exp.Paren | exp.Nullif):
        return _is_double(node.this)
    if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Mod | exp.Neg | exp.Abs):
        return all(_is_double(node.args[a]) for a in ("this", "expression")
                   if isinstance(node.args.get(a), exp.Expression))
    return False


def _date_within(date: exp.Expression, first: str, last: str) -> exp.Expression:
    """The date where it lies in [first, last] or is ±infinity, else NULL."""
    inside = exp.or_(exp.Between(this=date.copy(), low=date_literal(first),
                                 high=date_literal(last)),
                     exp.not_(exp.func("ISFINITE", date.copy())))
    return exp.Case(ifs=[exp.If(this=inside, true=date)])


def _nonzero(divisor: exp.Expression) -> exp.Expression:
    return exp.Nullif(this=divisor, expression=exp.Literal.number(0))


def _is_numeric_type(to: exp.DataType) -> bool:
    return to.is_type(*exp.DataType.NUMERIC_TYPES)


def _clamp(statistic: Statistic, table: TablePolicy, dialect: str
           ) -> tuple[exp.Expression, exp.Expression | None]:
    """The argument clamped to [lower, upper] (a NULL argument clamps to NULL, NaN to
    upper), and the NULL test to guard it with, if the clamp needs one."""
    assert statistic.argument is not None
    if clamps_in_integer(statistic.argument, table, statistic.lower, statistic.upper):
        # the column as stored, by its policy name (the query may spell it in other
        # case): a NULL fails both comparisons and stays NULL
        stored = table.column(statistic.argument.name)
        assert stored is not None
        column = exp.column(stored.name, quoted=True)
        low, high = _whole(statistic.lower), _whole(statistic.upper)
        return exp.Case(ifs=[exp.If(this=exp.LT(this=column, expression=low), true=low.copy()),
                             exp.If(this=exp.GT(this=column.copy(), expression=high),
                                    true=high.copy())],
                        default=column.copy()), None
    if dialect == "postgres":  # NUMERIC, or DOUBLE PRECISION for a bare column
        value, number = clamp_source_postgres(statistic.argument, table, statistic.lower,
                                              statistic.upper)
    else:
        value, number = make_total(statistic.argument, table, dialect), _DOUBLE
    source = exp.cast(value.copy(), number)
    lower, upper = exp.Literal.number(statistic.lower), exp.Literal.number(statistic.upper)
    if number.is_type(exp.DataType.Type.DOUBLE) and (
            dialect != "postgres" or isinstance(statistic.argument, exp.Column)):
        # One CASE reads the value without a NULL test: a NULL fails both comparisons and
        # stays NULL, and both engines order NaN above every number, as GREATEST does.
        # DuckDB computes it at a fraction of LEAST/GREATEST's cost (and evaluates a
        # repeated expression once); PostgreSQL does not share the three reads of the
        # value, so it takes this form only for a bare column.
        clamp: exp.Expression = exp.Case(
            ifs=[exp.If(this=exp.LT(this=source, expression=lower), true=lower.copy()),
                 exp.If(this=exp.GT(this=source.copy(), expression=upper),
                        true=upper.copy())],
            default=source.copy())
        guard = None
    else:
        clamp = exp.Least(this=exp.Greatest(this=source, expressions=[lower],
                                            ignore_nulls=True),
                          expressions=[upper], ignore_nulls=True)
        # LEAST/GREATEST skip NULLs, so a NULL would become a bound: keep it NULL.
        guard = exp.Is(this=value, expression=exp.Null())
    if statistic.integer_valued:
        # the noise is calibrated for whole numbers: make sure every summed value is one
        clamp = exp.func("ROUND", clamp)
    return clamp, guard


def _whole(value: float) -> exp.Expression:
    """A whole number up to 2^53 as an integer literal (negative ones as a negation); any
    other number as it is."""
    if not (float(value).is_integer() and abs(value) <= 2**53):
        return exp.Literal.number(value)
    literal = exp.Literal.number(abs(int(value)))
    return exp.Neg(this=literal) if value < 0 else literal


def _guarded(value: exp.Expression, guard: exp.Expression | None) -> exp.Expression:
    if guard is None:
        return value
    return exp.Case(ifs=[exp.If(this=guard, true=exp.Null())], default=value)


def clamped(statistic: Statistic, table: TablePolicy, dialect: str) -> exp.Expression:
    """The summed value of one row: the clamped argument minus the centre; for a
    real-valued sum, in fixed point (`Statistic.fixed_point_bits`): round(value · 2^k) as
    BIGINT, which both engines sum exactly (DuckDB in HUGEINT, PostgreSQL in NUMERIC)."""
    clamp, guard = _clamp(statistic, table, dialect)
    if statistic.center:
        # a whole centre as an integer literal: an integer clamp minus it stays an integer
        clamp = exp.Sub(this=clamp, expression=_whole(statistic.center))
    bits = statistic.fixed_point_bits
    if bits is None and _whole_rows(statistic) and statistic.row_contribution <= 2**53 \
            and _sums_in_double(statistic, table, dialect):
        # whole numbers summed in DOUBLE err once a total passes 2^53, and neighbouring
        # tables can err differently: summed as integers instead, exactly (DuckDB in
        # HUGEINT, PostgreSQL in NUMERIC); each is whole (ROUND, a whole centre) and
        # within BIGINT
        clamp = exp.cast(clamp, _BIGINT)
    if bits is not None:
        scale = exp.Literal.number(_power_of_two(bits))
        clamp = exp.cast(exp.func("ROUND", exp.Mul(this=exp.Paren(this=clamp),
                                                   expression=scale)), _BIGINT)
    return _guarded(clamp, guard)


def _whole_rows(statistic: Statistic) -> bool:
    """Whether a sum's rows are whole numbers: a whole-number statistic (clamped values
    rounded) less a whole centre."""
    return statistic.integer_valued and float(statistic.center).is_integer()


def _sums_in_double(statistic: Statistic, table: TablePolicy, dialect: str) -> bool:
    """Whether `_clamp` gives a whole-number sum's rows as DOUBLE: a bare int column
    stored as an integer clamps in its own type; any other argument on DuckDB, and a bare
    float column on PostgreSQL (any other argument clamps in NUMERIC there)."""
    assert statistic.argument is not None
    bounds = (statistic.argument, table, statistic.lower, statistic.upper)
    if clamps_in_integer(*bounds):
        return False
    return dialect != "postgres" or clamps_in_double(*bounds)


def _power_of_two(bits: int) -> str:
    """2^bits as an exact decimal literal (a power of two has a finite one)."""
    if bits >= 0:
        return str(2**bits)
    return format(Decimal(1) / Decimal(2**-bits), "f")


def _bin_index(statistic: Statistic, table: TablePolicy, dialect: str) -> exp.Expression:
    """The bin of the clamped argument (NULL stays NULL), as BIGINT: value − lower for
    one-integer bins, else ⌊(value − lower) · bins/(upper − lower)⌋ capped at bins − 1.
    Computed in DOUBLE on both backends, with the same operations, so that both put a
    value in the same bin."""
    binning = binning_for(statistic.lower, statistic.upper, statistic.integer_valued)
    clamp, guard = _clamp(statistic, table, dialect)
    assert statistic.argument is not None
    if dialect == "postgres" and not clamps_in_double(statistic.argument, table,
                                                      statistic.lower, statistic.upper):
        # a clamped NUMERIC may be too small for DOUBLE PRECISION (1e-330 raises): round
        # it first, far below any bin's width
        clamp = exp.func("ROUND", clamp, exp.Literal.number(300))
    offset = exp.Sub(this=exp.cast(clamp, _DOUBLE), expression=_double(statistic.lower))
    if binning.integer_points:
        index: exp.Expression = offset  # a whole number: the clamp rounds integer values
    else:
        index = exp.Least(
            this=exp.func("FLOOR", exp.Mul(this=exp.Paren(this=offset),
                                           expression=_double(binning.scale))),
            expressions=[_double(binning.bins - 1)], ignore_nulls=True)
    return _guarded(exp.cast(index, _BIGINT), guard)


def _double(value: float) -> exp.Expression:
    return exp.cast(exp.Literal.number(value), _DOUBLE)


def _key_literal(value: object, column: ColumnPolicy) -> exp.Expression:
    if column.type == "bool":
        return exp.Boolean(this=bool(value))
    if column.type in ("int", "float"):
        return exp.Literal.number(value)
    if column.type == "date":
        return exp.cast(exp.Literal.string(str(value)), "DATE")
    return exp.Literal.string(str(value))


def _group_hash(dialect: str, parts: Sequence[exp.Expression]) -> exp.Expression:
    """A per-query pseudo-random order of (unit, group) pairs; the salt is a parameter."""
    if dialect == "duckdb":
        return exp.Anonymous(this="hash", expressions=[*parts, exp.Placeholder()])
    # PostgreSQL: $1, for psycopg's raw cursor (a `%s` would make every `%` of the
    # statement a placeholder, LIKE patterns and modulo included); CONCAT skips NULL keys.
    # HASHTEXTEXTENDED (64 bits, seeded like DuckDB's HASH by the secret salt in the text):
    # MD5's text took a third of a GROUP BY over bounds (845k pairs: 2.8 s against 2.0 s).
    salted = [*parts, exp.Parameter(this=exp.Literal.number(1))]
    text = exp.Concat(expressions=[exp.cast(p, "TEXT") for p in salted], safe=True,
                      coalesce=True)
    return exp.Anonymous(this="HASHTEXTEXTENDED", expressions=[text, exp.Literal.number(0)])


def joined_source(analysis: Analysis, row_ids: bool) -> exp.Expression:
    """The private table joined with the public tables of the analysis, one column per
    column of the combined table (public ones named "<alias>.<column>").

    `row_ids`: number the private rows first (`__row_id`), so that a table without privacy
    unit can bound what each of its rows contributes after the join fans it out. A public
    table joined on a key the policy declares unique is joined one row per key value
    (DISTINCT ON), so the policy's claim holds whatever the table holds.

    >>> from dpproxy.policy import AnalystPolicy, ColumnPolicy, Policy, TablePolicy
    >>> from dpproxy.analyze import analyze
    >>> from pathlib import Path
    >>> from sqlglot import parse_one
    >>> p = TablePolicy("p", {"k": ColumnPolicy("k", "text")})
    >>> q = TablePolicy("q", {"k": ColumnPolicy("k", "text", unique=True)}, public=True)
    >>> policy = Policy(Path("x"), "db", None, None, {"p": p, "q": q}, {}, Path(), Path())
    >>> a = analyze(parse_one("SELECT COUNT(*) FROM p LEFT JOIN q ON p.k = q.k"), policy,
    ...             AnalystPolicy("a", tables=("p",)))
    >>> print(joined_source(a, False).sql("postgres"))  # doctest: +NORMALIZE_WHITESPACE
    SELECT "__t0"."k" AS "k", "__t1"."k" AS "q.k" FROM "p" AS "__t0" LEFT JOIN (SELECT DISTINCT
    ON ("k") * FROM "q" ORDER BY "k") AS "__t1" ON "__t0"."k" = "__t1"."k"
    """
    assert analysis.per_unit is None, "values per unit are never joined (analyze refuses it)"
    table = analysis.table
    public = {f"{j.prefix}.{name}": (f"__t{i + 1}", name)
              for i, j in enumerate(analysis.joins) for name in j.table.columns}

    policies = {**table.columns, **{f"{j.prefix}.{name}": c for j in analysis.joins
                                    for name, c in j.table.columns.items()}}

    def ref(name: str) -> exp.Column:
        alias, column = public.get(name, ("__t0", name))
        return exp.column(column, table=alias, quoted=True)

    def declared(column: exp.Column, policy: ColumnPolicy | None) -> exp.Expression:
        return column if policy is None else read_as_declared(column, policy)

    private: exp.Expression = _quoted_table(table.name)
    if row_ids:
        numbered = exp.alias_(exp.Window(this=exp.RowNumber()), ROW_ID, quoted=True)
        private = exp.select(exp.Star(), numbered, copy=False).from_(private, copy=False)
        private = private.subquery(exp.to_identifier("__t0", quoted=True), copy=False)
    else:
        private = private.as_("__t0", quoted=True, copy=False)
    items = [exp.alias_(ref(name), name, quoted=True) for name in table.columns]
    if row_ids:
        items.append(exp.alias_(exp.column(ROW_ID, table="__t0", quoted=True), ROW_ID,
                                quoted=True))
    joined = exp.select(*items, copy=False).from_(private, copy=False)
    for i, join in enumerate(analysis.joins, start=1):
        target: exp.Expression = _quoted_table(join.table.name)
        if join.unique_key is not None:
            # one row per key as the join reads it: 50 timestamps of one day, their key
            # declared date, were 50 rows for each joined row
            key = declared(exp.column(join.unique_key, quoted=True),
                           join.table.columns.get(join.unique_key))
            deduplicated = exp.select(exp.Star(), copy=False).from_(target, copy=False)
            deduplicated.set("distinct", exp.Distinct(on=exp.Tuple(expressions=[key])))
            # then every column: the same row is kept each time, even if the claim is false
            order = [key.copy(), *(exp.column(c, quoted=True) for c in join.table.columns
                                   if c != join.unique_key)]
            target = deduplicated.order_by(*order, copy=False).subquery(
                exp.to_identifier(f"__t{i}", quoted=True), copy=False)
        else:
            target = target.as_(f"__t{i}", quoted=True, copy=False)
        # each key read as declared: a uuid key declared text compared with a text key
        # failed on PostgreSQL, and on DuckDB where a key was no uuid, after the charge
        on = exp.and_(*(exp.EQ(this=declared(ref(left), policies.get(left)),
                               expression=declared(exp.column(right, table=f"__t{i}",
                                                              quoted=True),
                                                   join.table.columns.get(right)))
                        for left, right in join.keys), copy=False)
        joined = joined.join(target, on=on, join_type="LEFT" if join.left else "INNER",
                             copy=False)
    return joined


def per_unit_source(per_unit: PerUnit, dialect: str) -> exp.Expression:
    """The subquery of values per unit (`analyze.per_unit`), total on any data: each value
    of each unit of its table over the rows passing its WHERE, named by the table (the
    outer query's columns are read as the table's). The values are the exact ones; the
    outer statement clamps each one where it sums or ranks it."""
    table = per_unit.table
    items: list[exp.Expression] = []
    for value in per_unit.values:
        if dialect == "postgres" and value.argument is not None \
                and value.function in ("sum", "avg", "min", "max"):
            per_unit_digits(value.argument, table)
        argument = None if value.argument is None \
            else make_total(value.argument, table, dialect)
        call: exp.Expression
        if argument is None:
            call = exp.Count(this=exp.Star())
        elif value.function == "count_distinct":
            call = exp.Count(this=exp.Distinct(expressions=[argument]))
        elif value.function in ("sum", "avg"):
            # summed in NUMERIC on PostgreSQL (DOUBLE PRECISION raises on overflow, and
            # AVG's sum of squares overflows from about 1e154) and in DOUBLE on DuckDB
            # (a HUGEINT sum raises): a total beyond the range is inf or huge, never an
            # error that only some rows would cause; the outer query clamps it anyway
            number = exp.DataType.build("DECIMAL") if dialect == "postgres" else _DOUBLE
            call = _PER_UNIT_CALLS[value.function](this=exp.cast(argument, number.copy()))
        else:
            call = _PER_UNIT_CALLS[value.function](this=argument)
        items.append(exp.alias_(call, value.name, quoted=True))
    inner = exp.select(*items, copy=False).from_(exp.to_table(table.name, quoted=True),
                                                 copy=False)
    if per_unit.where is not None:
        inner = inner.where(make_total(per_unit.where, table, dialect), copy=False)
    inner = inner.group_by(exp.column(per_unit.unit, quoted=True), copy=False)
    return inner.subquery(exp.to_identifier(table.name, quoted=True), copy=False)


_PER_UNIT_CALLS: dict[str, type[exp.Func]] = {
    "count": exp.Count, "sum": exp.Sum, "avg": exp.Avg, "min": exp.Min, "max": exp.Max}


def _quoted_table(name: str) -> exp.Table:
    return exp.Table(this=exp.to_identifier(name, quoted=True))


def rewrite(plan: QueryPlan, dialect: str = "duckdb") -> Rewritten:
    """The backend statement computing every measurement of the plan per group.

    It depends only on the analysis and the policy's contribution bounds, so a caller
    may reuse it for the same normalized query; randomness enters through the salt
    parameter and, where rows are ranked, the backend's RANDOM(). A plan bounded by
    per-pair aggregation also gets its `unbounded` form (see `dpproxy.bounds`).
    """
    analysis = plan.analysis
    if plan.contribution.privacy_unit is None or analysis.joins or any(
            m.quantile is not None or m.statistic.kind == "count_distinct"
            for m in plan.measurements):
        return _statement(plan, dialect, bounded=True)
    # bounded by pairs: salted exactly when there is a GROUP BY; unbounded, never
    keys = tuple(f"k{i}" for i in range(len(analysis.keys)))
    columns = tuple(m.column for m in plan.measurements)
    salted, slots = bool(analysis.keys), slot_count(plan)

    def generate(bounded: bool, late: bool = False) -> str:
        statement = _statement(plan, dialect, bounded, late)
        # the layout promised before generating must be the one generated
        assert (statement.key_columns, statement.measurement_columns, statement.salted,
                statement.slots, statement.unit_counts) == (
                    keys, columns, bounded and salted, slots, plan.counts_units)
        return statement.sql

    # public keys filtered after aggregation, where the check finds few groups
    public = [k.values for k in analysis.keys if k.values is not None]
    late = bool(public) and all(public)
    unit_column = analysis.table.columns.get(plan.contribution.privacy_unit or "")
    # DuckDB keeps heavy units in a temporary table (`dpproxy.bounds`) made from their
    # values, so only unit types that round-trip through Python exactly are split; a
    # count of distinct units costs the light units' rows a hash of their units anyway,
    # about what bounding them costs (10M rows: 156 against 111 ms bounded), so not those
    split = dialect == "duckdb" and unit_column is not None and unit_column.type in (
        "int", "text") and not plan.counts_units and all(
        m.statistic.kind != "count_units" for m in plan.measurements)
    # a whole table's COUNT(*): its rows less the rows over the bound, as the check reads
    excess = not analysis.keys and analysis.where is None and not plan.counts_units and all(
        m.statistic.kind == "count" and m.statistic.argument is None
        for m in plan.measurements)
    unbounded = Unbounded(lambda: generate(False), _check_for(plan, dialect, late), slots,
                          (lambda: generate(False, late=True)) if late else None,
                          (lambda heavy: _split_statement(plan, dialect, heavy))
                          if split else None,
                          (lambda: _excess_statement(plan, dialect)) if excess else None)
    return Rewritten(keys, columns, salted, lambda: generate(True), unbounded, slots,
                     plan.counts_units)


_checks: OrderedDict[tuple[object, ...], tuple[TablePolicy, BoundCheck]] = OrderedDict()
_checks_lock = threading.Lock()
CHECK_CACHE_SIZE = 1024


def _check_for(plan: QueryPlan, dialect: str, counts_groups: bool) -> BoundCheck:
    """The bound check of a plan's table and keys, built once per table policy, keys and
    bounds (building it costs about as much as the statement)."""
    # a check reads the table by its name: never the table of a subquery of values per unit
    assert plan.analysis.per_unit is None, "a table of one row per unit needs no check"
    analysis, bound = plan.analysis, plan.contribution
    table = analysis.table
    key = (dialect, id(table), bound.privacy_unit, bound.max_rows, bound.max_groups,
           counts_groups,
           *(("column", k.column.name) if k.expression is None
             else ("expression", k.expression.sql()) for k in analysis.keys))
    with _checks_lock:
        cached = _checks.get(key)
        # the table policy is kept with its check, so its id cannot be reused meanwhile
        if cached is not None and cached[0] is table:
            _checks.move_to_end(key)
            return cached[1]
    assert bound.privacy_unit is not None
    check = bound_check(table.name, exp.column(bound.privacy_unit, quoted=True),
                        [_key_expression(k, table, dialect) for k in analysis.keys],
                        dialect, bound.max_rows, bound.max_groups, counts_groups)
    with _checks_lock:
        _checks[key] = (table, check)
        if len(_checks) > CHECK_CACHE_SIZE:
            _checks.popitem(last=False)
    return check


def _key_expression(key: GroupKey, table: TablePolicy, dialect: str) -> exp.Expression:
    # an expression key is computed once per row, made total like any row expression
    if key.expression is not None:
        value = make_total(key.expression, table, dialect)
    else:
        value = exp.column(key.column.name, quoted=True)
        column = table.column(key.column.name)
        if column is not None and key.column.type in ("bool", "int", "float"):
            # a smallint declared bool keyed as true and false, not 1 and 0 (text and date
            # keys are read as their text and day by released_key)
            value = read_as_declared(value, column)
    return released_key(value, key, table, dialect)


# Database types whose values reach Python as they are (ints, floats, text, dates): two
# distinct values of them are two distinct released keys
_EXACT_KEY_TYPES = {
    "duckdb": {"tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
               "uinteger", "ubigint", "uhugeint", "float", "double"},
    "postgres": NATIVE_NUMBER_TYPES,
}


def released_key(value: exp.Expression, key: GroupKey, table: TablePolicy, dialect: str
                 ) -> exp.Expression:
    """A number key as it is released: as a double where the backend's value would lose
    digits on its way to Python (DECIMAL and NUMERIC columns, PostgreSQL's NUMERIC
    arithmetic), so that the backend groups rows by the key released.

    Otherwise two groups the backend keeps apart (9.99 and 9.990000000000000000001)
    would become one key in Python, where one would replace the other: a single unit
    could then remove a large group. A coarser key computed per row changes nothing a
    unit contributes. A date key likewise, as a date within the years Python holds (see
    `_released_date`)."""
    if key.column.type == "date":
        return _released_date(value)
    if key.column.type == "text":
        return _released_text(value, key, table, dialect)
    if key.column.type not in ("int", "float"):
        return value
    if key.expression is None:
        column = table.column(key.column.name)
        if column is not None and column.storage in _EXACT_KEY_TYPES[dialect]:
            return value
    if dialect == "duckdb":
        # an expression is computed in DOUBLE already (`make_total`: its constants too);
        # the cast costs nothing then, and keeps the key a double if a new construct is not
        return exp.cast(value, _DOUBLE)
    return _double_postgres(value)


def _released_text(value: exp.Expression, key: GroupKey, table: TablePolicy, dialect: str
                   ) -> exp.Expression:
    """A text key as it is released: its text, grouped byte by byte. A column with a
    case-insensitive collation (DuckDB's NOCASE, PostgreSQL's citext or a nondeterministic
    collation) groups 'Foo' and 'foo' as one, and the group's key is whichever row the
    backend reads first: one unit's spelling decided whether a crowd's group matched its
    public value (a count of 0 or 501) and was the private key released. On PostgreSQL
    char(n) keys come padded, and json, interval or array values (DuckDB: lists,
    structs, JSON) load as other Python values: as text they compare with the public
    values."""
    if dialect == "postgres":
        return exp.Collate(this=exp.cast(value, exp.DataType.build("TEXT")),
                           expression=exp.to_identifier("C", quoted=True))
    column = table.column(key.column.name) if key.expression is None else None
    if column is None or column.storage != "varchar":
        # an expression may be of another type (an ENUM, JSON, a NULL): COLLATE takes
        # VARCHAR only, and a cast of a VARCHAR costs nothing
        value = exp.cast(value, exp.DataType.build("VARCHAR"))
    # DuckDB keeps a column's collation through a cast; `c` compares bytes
    return exp.Collate(this=value, expression=exp.to_identifier("c"))


_FIRST_RELEASED_DATE = date_literal("0001-01-01")
_LAST_RELEASED_DATE = date_literal("9999-12-31")


def _released_date(value: exp.Expression) -> exp.Expression:
    """A date key as it is released: its date (a DATE_TRUNC to the hour is a TIMESTAMP,
    released as its day), within years 1 to 9999, which Python's dates hold (the backends
    give infinity, BC dates and later years to Python as 0001-01-01 or 9999-12-31, or as
    text); NULL stays NULL. Grouped apart, `infinity` and 9999-12-31 would be one key in
    the release, where one person's group replaced a crowd's."""
    day = exp.cast(value, _DATE.copy())
    return exp.Case(ifs=[
        exp.If(this=exp.GT(this=day.copy(), expression=_LAST_RELEASED_DATE.copy()),
               true=_LAST_RELEASED_DATE.copy()),
        exp.If(this=exp.LT(this=day.copy(), expression=_FIRST_RELEASED_DATE.copy()),
               true=_FIRST_RELEASED_DATE.copy())], default=day)


def _double_postgres(value: exp.Expression) -> exp.Expression:
    """A NUMERIC (or any number) as DOUBLE PRECISION without an error: a magnitude below
    1e-300 is 0, above 1e300 ±Infinity (NaN is +Infinity), NULL stays NULL."""
    double = exp.DataType.build("DOUBLE")
    magnitude = exp.Abs(this=value.copy())

    def below(limit: str) -> exp.Expression:
        return exp.LT(this=magnitude.copy(), expression=exp.Literal.number(limit))

    def infinity(sign: str) -> exp.Expression:
        return exp.cast(exp.Literal.string(f"{sign}Infinity"), double)

    zero = exp.Literal.number(0)
    return exp.Case(ifs=[
        exp.If(this=below("1e-300"), true=exp.cast(zero.copy(), double)),
        exp.If(this=below("1e300"), true=exp.cast(value.copy(), double)),
        exp.If(this=exp.GT(this=value.copy(), expression=zero.copy()), true=infinity("")),
        exp.If(this=exp.LT(this=value.copy(), expression=zero.copy()), true=infinity("-")),
    ])


def _statement(plan: QueryPlan, dialect: str, bounded: bool, late: bool = False
               ) -> Rewritten:
    """`rewrite`'s statement; `bounded=False`: the same statistics with no contribution
    bounding (valid only where `dpproxy.bounds` proved it changes nothing); `late` (only
    then): the public key lists filter the groups, not the rows."""
    built = _statement_tree(plan, dialect, bounded, late)
    if isinstance(built, Rewritten):
        return built
    outer, salted = built
    statement, slots = _generate(outer, plan, dialect, salted)
    return Rewritten(tuple(f"k{i}" for i in range(len(plan.analysis.keys))),
                     tuple(m.column for m in plan.measurements), salted,
                     lambda: statement, slots=slots, unit_counts=plan.counts_units)


def _split_statement(plan: QueryPlan, dialect: str, heavy_table: str) -> str:
    """The plan's statistics as the unbounded statement over the units not in
    `heavy_table` plus the bounded one over the units in it, added per group (see
    `dpproxy.bounds`); parameters as the bounded statement's."""
    light = _statement_tree(plan, dialect, bounded=False, units=(heavy_table, False))
    heavy = _statement_tree(plan, dialect, bounded=True, units=(heavy_table, True))
    assert not isinstance(light, Rewritten) and not isinstance(heavy, Rewritten)
    (light_tree, _), (heavy_tree, salted) = light, heavy
    # both parts return the same columns in the same order: keys, measurements, units
    parts = exp.union(light_tree, heavy_tree, distinct=False, copy=False).subquery(
        "parts", copy=False)
    key_refs = [exp.column(f"k{i}") for i in range(len(plan.analysis.keys))]
    totals = [m.column for m in plan.measurements] + ([SELECTION] if plan.counts_units else [])
    outer = exp.select(*key_refs, *(exp.alias_(exp.Sum(this=exp.column(c)), c) for c in totals),
                       copy=False).from_(parts, copy=False)
    if key_refs:
        outer = outer.group_by(*(k.copy() for k in key_refs), copy=False)
    return _generate(outer, plan, dialect, salted)[0]


def _excess_statement(plan: QueryPlan, dialect: str) -> str:
    """A whole table's bounded COUNT(*), for each of the plan's measurements: its rows
    less the rows bounding drops, Σ max(n − max_rows, 0) over the units' row counts n,
    which the bound check reads (`BoundCheck.excess`) and the caller binds as $1."""
    assert plan.analysis.per_unit is None, "a table of one row per unit needs no check"
    count = exp.Sub(this=exp.Count(this=exp.Star()),
                    expression=exp.cast(exp.Parameter(this=exp.Literal.number(1)), _BIGINT))
    outer = exp.select(*(exp.alias_(count.copy(), m.column) for m in plan.measurements),
                       copy=False).from_(read_table(plan.analysis.table.name, dialect),
                                         copy=False)
    return outer.sql(dialect=dialect)


def _unit_filter(unit: exp.Expression, heavy_table: str, heavy: bool) -> exp.Expression:
    """Rows of the units in `heavy_table` (which holds no NULL), or of every other unit."""
    members = exp.select(exp.column(UNIT), copy=False).from_(
        exp.to_table(heavy_table, quoted=True), copy=False)
    listed = exp.In(this=unit.copy(), query=exp.Subquery(this=members))
    if heavy:
        return listed
    # a NULL unit is never listed: NOT IN alone would drop its rows
    return exp.Paren(this=exp.or_(exp.Is(this=unit.copy(), expression=exp.Null()),
                                  exp.Not(this=listed), copy=False))


def _statement_tree(plan: QueryPlan, dialect: str, bounded: bool, late: bool = False,
                    units: tuple[str, bool] | None = None
                    ) -> Rewritten | tuple[exp.Expression, bool]:
    """`_statement`'s tree and whether it takes a salt (a quantile plan's statement comes
    whole); `units` (table, heavy): only the rows of the units listed in that table, or
    of the others."""
    assert not (late and bounded), "bounding must only ever see rows of public keys"
    analysis = plan.analysis
    table = analysis.table
    bound = plan.contribution

    key_names = tuple(f"k{i}" for i in range(len(analysis.keys)))
    inner_items: list[exp.Expression] = []
    key_refs: list[exp.Expression] = []
    filters: list[exp.Expression] = []
    group_filters: list[exp.Expression] = []
    for name, key in zip(key_names, analysis.keys, strict=True):
        column = _key_expression(key, table, dialect)
        inner_items.append(exp.alias_(column.copy(), name))
        key_refs.append(exp.column(name))
        if key.values is not None:
            # keys outside the public list are dropped before bounding, so they use no slot;
            # parentheses: `x LIKE 'S%' IN (…)` would not parse
            tested = exp.column(name) if late else column.copy() if key.expression is None \
                else exp.Paren(this=column.copy())
            (group_filters if late else filters).append(
                exp.In(this=tested, expressions=[_key_literal(v, key.column)
                                                 for v in key.values])
                if key.values else exp.false())

    value_names: list[str | None] = []
    for index, measurement in enumerate(plan.measurements):
        statistic = measurement.statistic
        if statistic.kind == "sum":
            value: exp.Expression | None = clamped(statistic, table, dialect)
        elif statistic.kind == "quantile":
            value = _bin_index(statistic, table, dialect)
        elif statistic.kind in ("count", "count_distinct") and statistic.argument is not None:
            value = make_total(statistic.argument, table, dialect)
        else:
            value = None
        if value is None:
            value_names.append(None)
            continue
        value_names.append(f"v{index}")
        inner_items.append(exp.alias_(value, f"v{index}"))

    where = analysis.where
    if where is not None:
        filters.insert(0, make_total(where, table, dialect))
    unit = exp.column(bound.privacy_unit, quoted=True) if bound.privacy_unit else None
    if units is not None:
        assert unit is not None and not analysis.joins, "only pairs-bounded plans are split"
        filters.append(_unit_filter(unit, *units))
    # Without a privacy unit, a row is the unit; a join that may match it several times
    # needs its identity to keep max_rows (1) joined rows of it.
    row_ids = unit is None and analysis.fans_out
    if row_ids:
        unit = exp.column(ROW_ID, quoted=True)
    quantiles = any(m.quantile is not None for m in plan.measurements)
    distinct = any(m.statistic.kind == "count_distinct" for m in plan.measurements)
    # Quantile histograms need each kept row's bin, distinct counts each kept row's value,
    # and numbered rows a window of their own: all rank rows; every other plan bounds by
    # aggregation per (unit, group) pair.
    rank_rows = quantiles or distinct or row_ids
    assert bounded or not rank_rows, "only plans bounded by pairs have an unbounded form"
    if unit is not None:
        inner_items.append(exp.alias_(unit, UNIT))
        if rank_rows:
            # drawn here: a window's ORDER BY may not be volatile (DuckDB)
            inner_items.append(exp.alias_(exp.Rand(), RANDOM))
    if not inner_items:  # COUNT(*) alone, without a privacy unit, needs no column
        inner_items.append(exp.alias_(exp.Literal.number(1), "__row"))
    # unbounded: the table as its bound check reads it (`dpproxy.bounds.read_table`)
    base: exp.Expression = exp.to_table(table.name, quoted=True) if bounded \
        else read_table(table.name, dialect)
    if analysis.per_unit is not None:
        base = per_unit_source(analysis.per_unit, dialect)
    if analysis.joins:
        base = joined_source(analysis, row_ids).subquery("joined", copy=False)
    inner = exp.select(*inner_items, copy=False).from_(base, copy=False)
    if filters:
        inner = inner.where(exp.and_(*filters, copy=False), copy=False)
    source: exp.Expression = inner.subquery("filtered", copy=False)

    bounded_filter: list[exp.Expression] = []
    pairs = bounded and unit is not None and not rank_rows
    if pairs:
        source = _bounded_pairs(plan, dialect, source, key_refs, value_names)
    elif unit is not None and bounded:
        source, bounded_filter = _ranked_rows(plan, dialect, source, key_refs, row_ids)

    if quantiles:
        return _rewrite_binned(plan, dialect, source, bounded_filter, key_names, value_names)
    outer_items: list[exp.Expression] = list(key_refs)
    for measurement, value_name in zip(plan.measurements, value_names, strict=True):
        statistic = measurement.statistic
        agg: exp.Expression
        if pairs:
            # one row per kept (unit, group) pair, its contribution already bounded
            if statistic.kind == "count_units":
                agg = exp.Count(this=exp.column(UNIT))
            else:
                agg = exp.Coalesce(this=exp.Sum(this=exp.column(value_name or ROWS)),
                                   expressions=[exp.Literal.number(0)])
        elif statistic.kind == "sum":
            agg = exp.Coalesce(
                this=exp.Sum(this=exp.column(value_name)),
                expressions=[exp.Literal.number(0)])
        elif statistic.kind == "count_units" and unit is not None:
            agg = exp.Count(this=exp.Distinct(expressions=[exp.column(UNIT)]))
        elif statistic.kind == "count_distinct":
            agg = exp.Count(this=exp.Distinct(expressions=[exp.column(value_name)]))
        elif value_name is not None:
            agg = exp.Count(this=exp.column(value_name))
        else:
            agg = exp.Count(this=exp.Star())
        outer_items.append(exp.alias_(agg, measurement.column))
    if plan.counts_units:
        # each group's count of distinct units (one kept pair each), for partition selection
        units = (exp.Count(this=exp.column(UNIT)) if pairs
                 else exp.Count(this=exp.Distinct(expressions=[exp.column(UNIT)]))
                 if unit is not None else exp.Count(this=exp.Star()))
        outer_items.append(exp.alias_(units, SELECTION))
    if not plan.reads_data:
        raise ValueError("a plan without measurements reads no data: do not run it")
    outer = exp.select(*outer_items, copy=False).from_(source, copy=False)
    if pairs and analysis.keys:
        bounded_filter.append(exp.LTE(this=exp.column(GROUP_RANK),
                                      expression=exp.Literal.number(bound.max_groups)))
    if bounded_filter:
        outer = outer.where(exp.and_(*bounded_filter, copy=False), copy=False)
    if key_refs:
        outer = outer.group_by(*(k.copy() for k in key_refs), copy=False)
    if group_filters:
        # OFFSET 0: neither engine may push the filter below the aggregation again
        outer = exp.select(exp.Star(), copy=False).from_(
            outer.offset(0, copy=False).subquery("grouped", copy=False), copy=False).where(
            exp.and_(*group_filters, copy=False), copy=False)
    # a unit's groups are chosen by a salted hash, whether its pairs or its rows are ranked
    return outer, bounded and unit is not None and bool(key_refs) and not row_ids



def _bounded_pairs(plan: QueryPlan, dialect: str, source: exp.Expression,
                   key_refs: Sequence[exp.Expression], value_names: Sequence[str | None]
                   ) -> exp.Expression:
    """The filtered rows reduced to one row per kept (unit, group) pair, each column
    already bounded, and (with GROUP BY) a `__group_rank` column the caller keeps
    ≤ `max_groups` of.

    One hash aggregation per (unit, group) pair, never a sort of the rows: COUNT(*) keeps
    LEAST(COUNT(*), max_rows), COUNT(v) LEAST(COUNT(v), max_rows), SUM `_clamped_total`,
    and the sums of AVG and the variance family `_bounded_sum`.
    The pairs (far fewer than rows) are then ranked per unit by a hash salted afresh for
    each query. On DuckDB, with max_groups = 1 and public values for every key, each
    unit's group is chosen before anything is aggregated per group: the least salted hash
    of (unit, group code) per unit (`_group_codes`; the code in the low bits makes it
    exact), then a join keeps the rows of that group, aggregated per unit alone (a cheap
    integer grouping) instead of per (unit, group) pair and a window over the pairs.
    """
    limit = plan.contribution.max_rows
    codes = _group_codes(plan, key_refs) if dialect == "duckdb" and key_refs \
        and plan.contribution.max_groups == 1 else None
    rows = source if codes is None else _rows_of_chosen_group(source, codes)
    unit = exp.column(UNIT)
    items: list[exp.Expression] = [exp.alias_(unit.copy(), UNIT)]
    if codes is None:
        group_keys = [unit, *key_refs]
        items += [exp.alias_(k.copy(), k.name) for k in key_refs]
    else:
        # per unit alone when its one group was chosen first: a grouping on the unit only
        # (cheap), the group's code taken from the least order (a string aggregate per row,
        # as ANY_VALUE(key), would cost more than the grouping)
        group_keys = [unit]
        items.append(exp.alias_(exp.Min(this=exp.column(GROUP_ORDER)), GROUP_ORDER))
    items.append(exp.alias_(_at_most(exp.Count(this=exp.Star()), limit), ROWS))
    for measurement, name in zip(plan.measurements, value_names, strict=True):
        if name is None or any(name == i.alias for i in items):
            continue
        statistic = measurement.statistic
        value = exp.column(name)
        if statistic.kind != "sum":
            kept = _at_most(exp.Count(this=value), limit)
        elif statistic.unit_total:
            kept = _clamped_total(value, limit, statistic)
        else:
            # an integer sum (fixed point, or whole values) stays one: exact over pairs
            kept = _bounded_sum(value, limit, statistic.integer_valued,
                                statistic.fixed_point_bits is not None
                                or (_whole_rows(statistic)
                                    and limit * statistic.row_contribution < 2**62))
        items.append(exp.alias_(kept, name))
    pairs: exp.Expression = exp.select(*items, copy=False).from_(rows, copy=False).group_by(
        *(k.copy() for k in group_keys), copy=False)
    if codes is not None:
        decoded = [exp.alias_(k, r.name) for k, r in zip(_decoded_keys(plan, codes[1]),
                                                         key_refs, strict=True)]
        rest = [exp.column(i.alias) for i in items[2:]]
        pairs = exp.select(exp.column(UNIT), *decoded, *rest, copy=False).from_(
            pairs.subquery("per_unit", copy=False), copy=False)
        # one group per unit already: every pair ranks first
        return exp.select(exp.Star(), exp.alias_(exp.Literal.number(1), GROUP_RANK),
                          copy=False).from_(pairs.subquery("pairs", copy=False), copy=False) \
            .subquery("ranked", copy=False)
    pairs = pairs.subquery("pairs", copy=False)
    if not key_refs:
        return pairs
    return _ranked_pairs(dialect, pairs, key_refs)


def _clamped_total(value: exp.Expression, limit: int, statistic: Statistic
                   ) -> exp.Expression:
    """A pair's bounded SUM(v) for SUM itself: its total, clamped to the range `limit` rows
    could add up to, [limit · min(lower, 0), limit · max(upper, 0)] in the summed units
    (a NULL total stays NULL).

    The same bound as `_bounded_sum`'s (limit × the largest row value), so the same
    noise, and never farther from the pair's true total: for a total t ≥ 0 over n > limit
    values, limit × the mean is t · limit/n ≤ t, and limit × upper ≥ limit × the mean,
    so min(t, limit × upper) lies between it and t (alike below 0). A pair within the
    bounds keeps its total exactly, as the unbounded statement does.
    """
    total = exp.Sum(this=value.copy())
    ifs = []
    for side, beyond in ((-1, exp.LT), (1, exp.GT)):
        extreme = _row_extreme(statistic, side)
        if extreme:  # (no values beyond 0 on this side: no total beyond it either)
            bound = exp.Literal.number(limit * extreme)
            ifs.append(exp.If(this=beyond(this=total.copy(), expression=bound),
                              true=bound.copy()))
    return exp.Case(ifs=ifs, default=total) if ifs else total


def _row_extreme(statistic: Statistic, side: int) -> int | float:
    """The largest summed row value (side 1) or the least (-1), or 0 where that is beyond
    it, in the units `clamped` sums: whole numbers, or fixed point rounded half away from
    zero as the backend rounds it (computed in DOUBLE, as DuckDB does)."""
    extreme = (statistic.upper if side > 0 else statistic.lower) - statistic.center
    extreme = max(extreme, 0.0) if side > 0 else min(extreme, 0.0)
    bits = statistic.fixed_point_bits
    if bits is None:
        return int(extreme) if float(extreme).is_integer() else extreme
    scaled = math.ldexp(extreme, bits)
    return int(math.copysign(math.floor(abs(scaled) + 0.5), scaled))


def _bounded_sum(value: exp.Expression, limit: int, integer_valued: bool,
                 integer_sum: bool = False) -> exp.Expression:
    """A pair's bounded SUM(v) inside AVG or a variance: the plain SUM where the pair has
    at most `limit` values, else `limit` × their mean, so that it stays in proportion to
    the pair's bounded count, LEAST(COUNT(v), limit).

    That is the expected sum of `limit` of its values drawn at random, without the draw:
    the same bound (each clamped value lies within the clamp's bounds, so does their
    mean, so `limit` × the mean lies within `limit` × those bounds), no sampling variance
    on top of the noise, and no sort or list state per pair to draw rows with. A whole-
    number statistic rounds it: its noise is calibrated for whole numbers, and a
    fractional part would pass through integer noise unchanged. An `integer_sum` (of
    integers standing for reals, `Statistic.fixed_point_bits`, or of whole values within
    BIGINT) rounds it to a BIGINT, so that the sum over pairs stays exact.
    """
    values = exp.Count(this=value.copy())
    # typed: a plain `/`, as the sum is DOUBLE or NUMERIC already (sqlglot would otherwise
    # cast a PostgreSQL NUMERIC sum to DOUBLE PRECISION, rounding it)
    scaled: exp.Expression = exp.Div(
        this=exp.Mul(this=exp.Sum(this=value.copy()), expression=exp.Literal.number(limit)),
        expression=values.copy(), typed=True)
    if integer_valued or integer_sum:
        scaled = exp.func("ROUND", scaled)
    if integer_sum:  # DuckDB's `/` gives a DOUBLE: the sum over pairs must stay integer
        scaled = exp.cast(scaled, _BIGINT)
    return exp.Case(ifs=[exp.If(this=exp.LTE(this=values, expression=exp.Literal.number(limit)),
                                true=exp.Sum(this=value.copy()))], default=scaled)


def _group_codes(plan: QueryPlan, key_refs: Sequence[exp.Expression]
                 ) -> tuple[exp.Expression, int] | None:
    """Each filtered row's group as an integer 1…n (n = the product of the keys' public
    value counts) and its bit width, when every key has public values and n ≤ 2^20 — the
    rows of other keys were filtered out before bounding, so every row has a code."""
    keys = plan.analysis.keys
    if not keys or any(not k.values for k in keys):
        return None
    total = 1
    for key in keys:
        total *= len(key.values or ())
    if total >= _MAX_CODES:
        return None
    # a mixed-radix number: the first key's 1-based position, plus (position - 1) × the
    # product of the value counts before it for every other key
    code: exp.Expression | None = None
    stride = 1
    for key, ref in zip(keys, key_refs, strict=True):
        values = exp.Array(expressions=[_key_literal(v, key.column) for v in key.values or ()])
        position: exp.Expression = exp.Anonymous(this="LIST_POSITION",
                                                 expressions=[values, ref.copy()])
        if code is None:
            code = position
        else:
            offset = exp.Sub(this=position, expression=exp.Literal.number(1))
            code = exp.Add(this=code, expression=exp.Mul(
                this=exp.Paren(this=offset), expression=exp.Literal.number(stride)))
        stride *= len(key.values or ())
    assert code is not None
    return code, total.bit_length()


def _decoded_keys(plan: QueryPlan, bits: int) -> list[exp.Expression]:
    """Each key's public value from the code in the low `bits` of `__group_order`."""
    mask = exp.Literal.number((1 << bits) - 1)
    code = exp.cast(exp.BitwiseAnd(this=exp.column(GROUP_ORDER), expression=mask), _BIGINT)
    decoded: list[exp.Expression] = []
    stride = 1
    for key in plan.analysis.keys:
        values = key.values or ()
        # the inverse of `_group_codes`: ((code - 1) // stride) % n, 1-based
        digit = exp.Sub(this=code.copy(), expression=exp.Literal.number(1))
        if stride > 1:
            digit = exp.IntDiv(this=exp.Paren(this=digit), expression=exp.Literal.number(stride))
        index = exp.Add(this=exp.Mod(this=exp.Paren(this=digit),
                                     expression=exp.Literal.number(len(values))),
                        expression=exp.Literal.number(1))
        decoded.append(exp.Anonymous(this="LIST_EXTRACT", expressions=[
            exp.Array(expressions=[_key_literal(v, key.column) for v in values]), index]))
        stride *= len(values)
    return decoded


def _rows_of_chosen_group(source: exp.Expression, codes: tuple[exp.Expression, int]
                          ) -> exp.Expression:
    """The filtered rows of each unit's one group chosen at random (max_groups = 1): the
    group whose salted hash of (unit, code) is least, the code filling the hash's low bits
    so that two groups never tie."""
    code, bits = codes
    width = exp.Literal.number(bits)
    salted = exp.Anonymous(this="HASH", expressions=[
        exp.column(UNIT), code.copy(), exp.Parameter(this=exp.Literal.number(1))])
    order = exp.BitwiseOr(
        this=exp.BitwiseLeftShift(this=exp.BitwiseRightShift(this=salted, expression=width),
                                  expression=width.copy()),
        expression=exp.cast(code, _UBIGINT))

    def ordered(alias: str) -> exp.Expression:
        return exp.select(exp.Star(), exp.alias_(order.copy(), GROUP_ORDER), copy=False) \
            .from_(source.copy(), copy=False).subquery(alias, copy=False)

    choice = exp.select(exp.alias_(exp.column(UNIT), UNIT),
                        exp.alias_(exp.Min(this=exp.column(GROUP_ORDER)), GROUP_ORDER),
                        copy=False).from_(ordered("ordered"), copy=False) \
        .group_by(exp.column(UNIT), copy=False).subquery("choice", copy=False)
    on = exp.and_(*(exp.EQ(this=exp.column(c, table="rows"), expression=exp.column(
        c, table="choice")) for c in (UNIT, GROUP_ORDER)), copy=False)
    return exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("rows")),
                      copy=False).from_(
        ordered("rows"), copy=False).join(choice, on=on, copy=False) \
        .subquery("chosen", copy=False)


def _at_most(count: exp.Expression, limit: int) -> exp.Expression:
    # a count is never NULL: a plain LEAST, not sqlglot's NULL-guarded form
    return exp.Least(this=count, expressions=[exp.Literal.number(limit)], ignore_nulls=True)


def _ranked_pairs(dialect: str, pairs: exp.Expression, key_refs: Sequence[exp.Expression]
                  ) -> exp.Expression:
    """One row per (unit, group) pair, ranked per unit (`__group_rank`) in random order."""
    unit_ref = exp.column(UNIT)
    # each pair is one distinct group of its unit: a ROW_NUMBER by salted hash picks
    # `max_groups` of them at random (the keys break astronomically unlikely hash ties)
    rank = exp.Window(
        this=exp.RowNumber(), partition_by=[unit_ref.copy()],
        order=exp.Order(expressions=[
            exp.Ordered(this=_group_hash(dialect, [unit_ref.copy(),
                                                   *(k.copy() for k in key_refs)])),
            *(exp.Ordered(this=k.copy()) for k in key_refs)]))
    return exp.select(exp.Star(), exp.alias_(rank, GROUP_RANK), copy=False).from_(
        pairs, copy=False).subquery("ranked", copy=False)


def _ranked_rows(plan: QueryPlan, dialect: str, source: exp.Expression,
                 key_refs: Sequence[exp.Expression], row_ids: bool
                 ) -> tuple[exp.Expression, list[exp.Expression]]:
    """The filtered rows with window ranks, and the filter that keeps a unit's first
    `max_rows` rows (in random order) per group in its first `max_groups` groups (by salted
    hash); with numbered rows (`row_ids`), one random joined row per row."""
    bound = plan.contribution
    bounded_filter: list[exp.Expression] = []
    unit_ref = exp.column(UNIT)
    # A numbered row may touch 1 group with 1 row (max_groups = max_rows = 1): keeping
    # one random joined row per row satisfies both, with one window instead of two.
    assert not row_ids or (bound.max_rows, bound.max_groups) == (1, 1)
    per_group = [] if row_ids else [k.copy() for k in key_refs]
    ranks: list[exp.Expression] = [exp.alias_(exp.Window(
        this=exp.RowNumber(),
        partition_by=[unit_ref.copy(), *per_group],
        order=exp.Order(expressions=[exp.Ordered(this=exp.column(RANDOM))])), ROW_RANK)]
    bounded_filter.append(exp.LTE(this=exp.column(ROW_RANK),
                                  expression=exp.Literal.number(bound.max_rows)))
    if key_refs and not row_ids:
        ranks.append(exp.alias_(exp.Window(
            this=exp.Anonymous(this="DENSE_RANK"),
            partition_by=[unit_ref.copy()],
            # the keys break (astronomically unlikely) hash ties between distinct groups
            order=exp.Order(expressions=[
                exp.Ordered(this=_group_hash(dialect, [unit_ref.copy(), *key_refs])),
                *(exp.Ordered(this=k.copy()) for k in key_refs)])), GROUP_RANK))
        bounded_filter.append(exp.LTE(this=exp.column(GROUP_RANK),
                                      expression=exp.Literal.number(bound.max_groups)))
    source = exp.select(exp.Star(), *ranks, copy=False).from_(source, copy=False) \
        .subquery("ranked", copy=False)
    return source, bounded_filter


def _rewrite_binned(plan: QueryPlan, dialect: str, source: exp.Expression,
                    bounded_filter: list[exp.Expression], key_names: tuple[str, ...],
                    value_names: list[str | None]) -> Rewritten:
    """The two-level form for plans with quantiles (see the module docstring): partials per
    group and bin, then per group sums of the partials and ARRAY_AGG of (bin, rows)."""
    if not plan.reads_data:
        raise ValueError("a plan without measurements reads no data: do not run it")
    unit = plan.contribution.privacy_unit is not None
    key_refs = [exp.column(k) for k in key_names]
    bin_names = [v for m, v in zip(plan.measurements, value_names, strict=True)
                 if m.quantile is not None and v is not None]
    first_row = exp.Case(ifs=[exp.If(this=exp.EQ(this=exp.column(ROW_RANK),
                                                 expression=exp.Literal.number(1)),
                                     true=exp.Literal.number(1))],
                         default=exp.Literal.number(0))

    def partial(measurement: Measurement, value_name: str | None) -> exp.Expression:
        kind = measurement.statistic.kind
        if kind == "sum":
            return exp.Coalesce(this=exp.Sum(this=exp.column(value_name)),
                                expressions=[exp.Literal.number(0)])
        if kind == "count_units" and unit:
            # COUNT(DISTINCT unit) does not add up over bins; each unit has exactly one
            # row ranked 1 in each of its groups, and it is always kept with the group
            return exp.Sum(this=first_row.copy())
        if value_name is not None:
            return exp.Count(this=exp.column(value_name))
        return exp.Count(this=exp.Star())

    inner_items: list[exp.Expression] = [k.copy() for k in key_refs]
    inner_items += [exp.column(b) for b in bin_names]
    outer_items: list[exp.Expression] = [k.copy() for k in key_refs]
    for measurement, value_name in zip(plan.measurements, value_names, strict=True):
        column = measurement.column
        if measurement.quantile is not None:
            pair = exp.Array(expressions=[exp.column(value_name), exp.column(BIN_ROWS)])
            outer_items.append(exp.alias_(exp.ArrayAgg(this=pair), column))
            continue
        inner_items.append(exp.alias_(partial(measurement, value_name), column))
        outer_items.append(exp.alias_(exp.Sum(this=exp.column(column)), column))
    inner_items.append(exp.alias_(exp.Count(this=exp.Star()), BIN_ROWS))
    if plan.counts_units:
        units = exp.Sum(this=first_row.copy()) if unit else exp.Count(this=exp.Star())
        inner_items.append(exp.alias_(units, SELECTION))
        outer_items.append(exp.alias_(exp.Sum(this=exp.column(SELECTION)), SELECTION))

    binned = exp.select(*inner_items, copy=False).from_(source, copy=False)
    if bounded_filter:
        binned = binned.where(exp.and_(*bounded_filter, copy=False), copy=False)
    binned = binned.group_by(*(k.copy() for k in key_refs), *(exp.column(b) for b in bin_names),
                             copy=False)
    outer = exp.select(*outer_items, copy=False).from_(binned.subquery("binned", copy=False),
                                                       copy=False)
    if key_refs:
        outer = outer.group_by(*(k.copy() for k in key_refs), copy=False)
    salted = unit and bool(key_names)
    statement, slots = _generate(outer, plan, dialect, bool(salted))
    return Rewritten(key_names, tuple(m.column for m in plan.measurements), salted,
                     lambda: statement, slots=slots, unit_counts=plan.counts_units)


def slot_count(plan: QueryPlan) -> int:
    """How many WHERE slots (`dpproxy.shapes`) the plan's statements take as parameters."""
    where = plan.analysis.where
    return 0 if where is None else sum(slot_index(n) is not None
                                        for n in where.find_all(exp.Literal))


def _generate(outer: exp.Expression, plan: QueryPlan, dialect: str, salted: bool
              ) -> tuple[str, int]:
    """The statement's SQL and its slot count, its WHERE slots (`dpproxy.shapes`) as typed
    parameters after the salt (`shapes.parameter_type`)."""
    expected = slot_count(plan)
    slots = [n for n in outer.find_all(exp.Literal) if slot_index(n) is not None] \
        if expected else []
    # every WHERE literal reaches the statement (some twice, where the filter is read
    # twice: each occurrence is the same parameter); a missing one would be a bug
    if {slot_index(n) for n in slots} != set(range(expected)):
        raise ValueError(f"the statement does not hold each of its {expected} slots")
    if slots:
        if dialect == "duckdb":  # `?` and `$n` do not mix: the salt is `$1` here
            for placeholder in list(outer.find_all(exp.Placeholder)):
                placeholder.replace(exp.Parameter(this=exp.Literal.number(1)))
        for slot in slots:
            index = slot_index(slot)
            assert index is not None
            slot.replace(exp.cast(exp.Parameter(this=exp.Literal.number(index + 1 + int(salted))),
                                  parameter_type(slot.this, dialect)))
    # The tree was built for this call alone: the generator may transform it in place
    # (copy=False spares a deep copy of the whole statement, a tenth of a query's CPU).
    return outer.sql(dialect=dialect, copy=False), expected
