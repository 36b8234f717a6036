"""Whole years between two dates: `EXTRACT(YEAR FROM AGE(a, b))`, the idiom for a
person's age from a birth date, read as the date arithmetic it is.

PostgreSQL's AGE(a, b) subtracts field by field, borrowing a month when a's day of the
month is before b's and a year when a's month is then before b's, and negates the swapped
difference when a < b. Its years are therefore b's years to a's, less one when a's
(month, day) comes before b's; negated with a and b swapped when a < b. The fold writes
that with EXTRACT and CASE, which both backends compute alike and the interval pass
types (no interval value is ever computed). Other uses of AGE stay refused: an interval
is no value an aggregate can take.

>>> from sqlglot import parse_one
>>> q = parse_one("SELECT EXTRACT(YEAR FROM AGE(DATE '2024-06-01', born)) FROM t",
...               read="postgres")
>>> "CASE WHEN" in fold_ages(q).expressions[0].sql("postgres")
True
"""

from __future__ import annotations

from sqlglot import exp

from ..errors import NotSupportedError


def fold_ages(select: exp.Expression) -> exp.Expression:
    """`select` with each EXTRACT(YEAR FROM AGE(a, b)) (and DATE_PART('year', …)) replaced
    by its whole years; a copy."""
    if not any(_is_age(n) for n in select.find_all(exp.Anonymous)):
        return select

    def fold(node: exp.Expression) -> exp.Expression:
        if not (isinstance(node, exp.Extract) and _is_age(node.expression)):
            return node
        unit = node.this.name.lower() if node.this is not None else ""
        if unit not in ("year", "years"):
            raise NotSupportedError(
                f"EXTRACT({unit.upper()} FROM AGE(…)) is not supported",
                hint="whole years are: EXTRACT(YEAR FROM AGE(a, b)); for days subtract the "
                     "dates, a - b")
        arguments = node.expression.expressions
        if len(arguments) != 2:
            raise NotSupportedError(
                "AGE takes two dates here", hint="write AGE(CURRENT_DATE, born) for the "
                                                 "age today")
        years = _whole_years(*arguments)
        years.meta["written"] = node.sql("postgres")  # for EXPLAIN (`written_sql`)
        return years

    return select.transform(fold)


def _is_age(node: exp.Expression) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == "age"


def _whole_years(later: exp.Expression, earlier: exp.Expression) -> exp.Expression:
    def part(unit: str, date: exp.Expression) -> exp.Expression:
        return exp.Extract(this=exp.var(unit.upper()), expression=date.copy())

    def years_from(start: exp.Expression, end: exp.Expression) -> exp.Expression:
        """end's year less start's, less one where end's (month, day) is before start's."""
        before = exp.or_(
            exp.LT(this=part("month", end), expression=part("month", start)),
            exp.and_(exp.EQ(this=part("month", end), expression=part("month", start)),
                     exp.LT(this=part("day", end), expression=part("day", start))))
        borrowed = exp.Case(ifs=[exp.If(this=before, true=exp.Literal.number(1))],
                            default=exp.Literal.number(0))
        return exp.Sub(this=exp.Sub(this=part("year", end), expression=part("year", start)),
                       expression=borrowed)

    return exp.Case(ifs=[
        exp.If(this=exp.GTE(this=later.copy(), expression=earlier.copy()),
               true=years_from(earlier, later)),
        exp.If(this=exp.LT(this=later.copy(), expression=earlier.copy()),
               true=exp.Neg(this=exp.paren(years_from(later, earlier)))),
    ])
