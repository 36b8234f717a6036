"""WIDTH_BUCKET: PostgreSQL's histogram bins, read as the CASE expression they are.

`WIDTH_BUCKET(x, lo, hi, n)` numbers n equal-width bins over [lo, hi): 0 below lo, n + 1
from hi up, NULL for NULL; with lo > hi the bins run downwards (0 above lo, n + 1 from hi
down). `WIDTH_BUCKET(x, ARRAY[t1, …, tk])` counts the thresholds at or below x (numbers,
or dates: `ARRAY[DATE '2024-04-01', DATE '2024-07-01']` for quarters of one's own). Both are
folded into a CASE over comparisons, FLOOR, LEAST and GREATEST before analysis, so a bin is
a row expression like any other: typed and bounded by the interval pass (0 … n + 1 whatever
the column's bounds), made total on each backend, and, over a column with public values,
a group key with public bins (every bin released, none suppressed).

Bounds, count and thresholds must be constants: which bins exist is then public. Where
PostgreSQL raises on the data (a NaN operand) the fold does not: NaN sorts above every
number on both backends, so it falls in bin n + 1 (bin 0 with lo > hi). A value just below
hi is in bin n on both backends, even where floating point would round its position up.

>>> from sqlglot import parse_one
>>> q = parse_one("SELECT WIDTH_BUCKET(age, 0, 100, 10) FROM t", read="postgres")
>>> fold_width_buckets(q).expressions[0].sql("postgres")
'CASE WHEN age < 0 THEN 0 WHEN age >= 100 THEN 11 WHEN age >= 0 THEN LEAST(GREATEST(FLOOR(10 \
* (LEAST(GREATEST(age, 0), 100) - 0) / (100 - 0)), 0), 9) + 1 END AS width_bucket'
>>> q = parse_one("SELECT WIDTH_BUCKET(age, ARRAY[18, 65]) AS band FROM t", read="postgres")
>>> fold_width_buckets(q).expressions[0].sql("postgres")
'CASE WHEN age < 18 THEN 0 WHEN age < 65 THEN 1 WHEN age >= 65 THEN 2 END AS band'
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal, InvalidOperation

from sqlglot import exp

from ..clock import parse_date
from ..errors import InvalidArgumentForWidthBucket, InvalidTextRepresentation, NotSupportedError

_MAX_COUNT = 2**31 - 1  # PostgreSQL's count is an integer; n + 1 must fit one too
_MAX_SPAN = Decimal("1e300")  # n · (high − low): far inside DOUBLE's range


def fold_width_buckets(select: exp.Expression) -> exp.Expression:
    """`select` with every WIDTH_BUCKET call replaced by its CASE (a copy; the tree as
    written is left alone). A select-list item that was a bare call keeps PostgreSQL's
    column name, width_bucket."""
    if select.find(exp.WidthBucket) is None:
        return select

    def fold(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.WidthBucket):
            return node
        case = _case(node)
        case.meta["written"] = node.sql("postgres")  # for EXPLAIN (`written_sql`)
        return case

    folded = select.transform(fold)
    if isinstance(folded, exp.Select):
        written = select.expressions
        folded.set("expressions", [
            exp.alias_(item, "width_bucket") if isinstance(before, exp.WidthBucket) else item
            for item, before in zip(folded.expressions, written, strict=True)])
    return folded


def _case(node: exp.WidthBucket) -> exp.Case:
    operand = node.this
    thresholds = node.args.get("threshold")
    if thresholds is not None:
        return _threshold_case(operand, thresholds)
    lo, hi, count = (node.args.get(a) for a in ("min_value", "max_value", "num_buckets"))
    if lo is None or hi is None or count is None:
        raise NotSupportedError("WIDTH_BUCKET takes (operand, low, high, count) or "
                                "(operand, ARRAY[thresholds])")
    low, high = _constant(lo, "bounds"), _constant(hi, "bounds")
    n = _constant(count, "count")
    if n != n.to_integral_value() or not 0 < n <= _MAX_COUNT - 1:
        raise InvalidArgumentForWidthBucket(
            "count must be a whole number greater than zero", hint="e.g. WIDTH_BUCKET(age, "
            "0, 100, 10) for ten bins of width 10")
    if low == high:
        raise InvalidArgumentForWidthBucket("lower bound cannot equal upper bound")
    if n * abs(high - low) >= _MAX_SPAN:
        # n · (x − low) would overflow DOUBLE on DuckDB and saturate every bin to n
        raise NotSupportedError(
            f"WIDTH_BUCKET's count × (high − low) must stay below {_MAX_SPAN:.0e}",
            hint="use fewer bins or narrower bounds")
    bins = int(n)
    # x in [lo, hi) (or (hi, lo] downwards): FLOOR(n · distance from lo / width) + 1, the
    # distance clamped and the bin capped at n so the branch is bounded on its own
    up = low < high
    clamped = exp.Least(this=exp.Greatest(this=operand.copy(), expressions=[
        (lo if up else hi).copy()]), expressions=[(hi if up else lo).copy()])
    distance = exp.Sub(this=clamped, expression=lo.copy()) if up \
        else exp.Sub(this=lo.copy(), expression=clamped)
    width = exp.Sub(this=hi.copy(), expression=lo.copy()) if up \
        else exp.Sub(this=lo.copy(), expression=hi.copy())
    position = exp.Floor(this=exp.Div(
        this=exp.Mul(this=exp.Literal.number(bins), expression=exp.paren(distance)),
        expression=exp.paren(width), typed=True))
    inside = exp.Add(this=exp.Least(this=exp.Greatest(this=position, expressions=[
        exp.Literal.number(0)]), expressions=[exp.Literal.number(bins - 1)]),
        expression=exp.Literal.number(1))
    below, above, within = (exp.LT, exp.GTE, exp.GTE) if up else (exp.GT, exp.LTE, exp.LTE)
    return exp.Case(ifs=[
        exp.If(this=below(this=operand.copy(), expression=lo.copy()),
               true=exp.Literal.number(0)),
        exp.If(this=above(this=operand.copy(), expression=hi.copy()),
               true=exp.Literal.number(bins + 1)),
        exp.If(this=within(this=operand.copy(), expression=lo.copy()), true=inside),
    ])


def _threshold_case(operand: exp.Expression, thresholds: exp.Expression) -> exp.Case:
    while isinstance(thresholds, exp.Paren):
        thresholds = thresholds.this
    if not isinstance(thresholds, exp.Array) or not thresholds.expressions:
        raise NotSupportedError("WIDTH_BUCKET's thresholds must be an ARRAY[…] of constants",
                                hint="e.g. WIDTH_BUCKET(age, ARRAY[18, 30, 65]), or of dates")
    items = list(thresholds.expressions)
    values = [_threshold(t) for t in items]
    if len({type(v) for v in values}) > 1:
        raise NotSupportedError("WIDTH_BUCKET's thresholds must be all numbers or all dates")
    if any(b < a for a, b in itertools.pairwise(values)):  # type: ignore[operator]
        raise InvalidArgumentForWidthBucket(
            "thresholds must be sorted, smallest first",
            hint="PostgreSQL returns unspecified bins for unsorted thresholds")
    ifs = [exp.If(this=exp.LT(this=operand.copy(), expression=t.copy()),
                  true=exp.Literal.number(i)) for i, t in enumerate(items)]
    ifs.append(exp.If(this=exp.GTE(this=operand.copy(), expression=items[-1].copy()),
                      true=exp.Literal.number(len(items))))
    return exp.Case(ifs=ifs)


def _threshold(node: exp.Expression) -> Decimal | dt.date:
    """A threshold: a number constant, or a date one (DATE '…', '…'::date)."""
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.DATE \
            and isinstance(node.this, exp.Literal) and node.this.is_string:
        try:
            return parse_date(node.this.this)
        except ValueError:
            raise InvalidTextRepresentation(
                f"invalid input syntax for type date: \"{node.this.this}\"") from None
    return _constant(node, "thresholds")


def _constant(node: exp.Expression, what: str) -> Decimal:
    """A number literal, possibly negated or parenthesized, exactly; NaN and infinities are
    refused as PostgreSQL refuses them."""
    inner, sign = node, 1
    while isinstance(inner, exp.Paren | exp.Neg):
        sign = -sign if isinstance(inner, exp.Neg) else sign
        inner = inner.this
    if not isinstance(inner, exp.Literal) or inner.is_string:
        raise NotSupportedError(f"WIDTH_BUCKET's {what} must be number constants, got "
                                f"{node.sql('postgres')}",
                                hint="the bins are then public: write the numbers out")
    try:
        value = Decimal(inner.this) * sign
    except InvalidOperation:
        raise NotSupportedError(f"WIDTH_BUCKET's {what} must be number constants") from None
    if not value.is_finite():
        raise InvalidArgumentForWidthBucket(f"WIDTH_BUCKET's {what} must be finite")
    return value
