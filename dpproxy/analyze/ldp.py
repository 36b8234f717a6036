"""Local-DP columns: the aggregates the proxy answers over them, as rules of the rule table.

A column declared `ldp = {…}` holds reports randomized on each respondent's device
(`dpproxy.local`): a boolean for randomized response, a boolean array in domain order
(one element per domain value, 1-based in SQL) for unary encoding. The analyst asks

* `AVG(col)`, `AVG(col = 'value')`: the estimated share of rows whose true answer is
  yes, or is that value;
* `COUNT(col)`, `COUNT(col = 'value')`: the estimated number of such rows (unlike
  SQL's COUNT(col), which counts non-NULL values: every report is non-NULL, and what
  the analyst wants is the debiased count of true answers).

Anything else that reads the column (SELECT it, WHERE, GROUP BY, HAVING, ORDER BY, other
aggregates or expressions over it) is refused with 42501.

Each such aggregate measures two statistics per group: s, the sum of reported 1s, and
n, the number of reports. The backend computes only these; the rule debiases them,
count = (s − n·p_zero)/(p_one − p_zero), and gives an interval from the randomization
(normal approximation with the largest binomial standard error the channel allows,
`report_variance`, so it holds whatever the reports).

Who is in a group is not protected by local DP: s and n change when a person joins or
leaves the table, or when a WHERE/GROUP BY column changes. So unless the table declares
`membership = "public"` (who is in it is public knowledge, as a survey's roster can be)
and the query's WHERE and GROUP BY read only public columns (`rows_are_public`), s and n
are noised centrally and charged like COUNT and SUM; the interval then covers that noise
too. Otherwise they are `exact`: released as computed, at no central cost
(post-processing of already private reports).

>>> from dpproxy.local import RandomizedResponse
>>> rule = local_rule("avg", RandomizedResponse.from_epsilon(1.0))
>>> exact = [Statistic("sum", exact=True), Statistic("count", exact=True)]
>>> round(rule.combine([4000.0, 10000.0], exact), 4)   # r = 0.4, f = 0.731
0.2836
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable

from sqlglot import exp

from ..errors import InvalidParameterValue, PrivacyViolation
from ..local import RandomizedResponse, UnaryEncoding, report_variance
from ..policy import ColumnPolicy, LocalDP, TablePolicy
from .aggregates import AggregateRule, Interval, Statistic, Stats, Values
from .expressions import Resolver

__all__ = ["local_aggregate", "local_rule", "raw_read_error", "reject_raw_local",
           "rows_are_public"]


def _usage(column: ColumnPolicy) -> str:
    if isinstance(column.ldp, UnaryEncoding):
        value = column.ldp.domain[0]
        literal = f"'{value}'" if isinstance(value, str) else str(value)
        return (f"AVG({column.name} = {literal}) (estimated share) or "
                f"COUNT({column.name} = {literal}) (estimated count)")
    return (f"AVG({column.name}) (estimated share of yes) or COUNT({column.name}) "
            "(estimated number of yes)")


def raw_read_error(column: ColumnPolicy, where: str) -> PrivacyViolation:
    return PrivacyViolation(
        f"column {column.name} was collected under local differential privacy: {where} would "
        "read its randomized reports, which are never released",
        hint=f"ask for {_usage(column)}")


def reject_raw_local(node: exp.Expression, resolve: Resolver, where: str) -> None:
    """Refuse `node` (a WHERE predicate, a GROUP BY key) if it reads a local-DP column."""
    for column_node in node.find_all(exp.Column):
        column = resolve(column_node)
        if column.ldp is not None:
            raise raw_read_error(column, where)


def _indicator(arg: exp.Expression, column: ColumnPolicy) -> exp.Expression | None:
    """The 0/1 report an aggregate argument asks about (NULL where there is no report)."""
    while isinstance(arg, exp.Paren):
        arg = arg.this
    ref = exp.column(column.name, quoted=True)
    if isinstance(column.ldp, RandomizedResponse):
        bit: exp.Expression = ref
        if not isinstance(arg, exp.Column):
            return None
    else:
        assert isinstance(column.ldp, UnaryEncoding)
        if not isinstance(arg, exp.EQ):
            return None
        sides = (arg.this, arg.expression)
        literal = next((s for s in sides if isinstance(s, exp.Literal)), None)
        if literal is None or not any(isinstance(s, exp.Column) for s in sides):
            return None
        value: object = literal.this if literal.is_string else _number(literal.this)
        if value not in column.ldp.domain:
            raise InvalidParameterValue(
                f"{literal.sql('postgres')} is not in the declared domain of {column.name}",
                hint=f"domain: {', '.join(map(str, column.ldp.domain))}")
        index = column.ldp.domain.index(value) + 1
        bit = exp.Bracket(this=ref, expressions=[exp.Literal.number(index)], offset=1)
    # NULL (no report) stays NULL, so n counts reports, not rows
    return exp.Case(ifs=[exp.If(this=bit, true=exp.Literal.number(1)),
                         exp.If(this=exp.Not(this=bit.copy()), true=exp.Literal.number(0))])


def _number(text: str) -> object:
    try:
        return int(text)
    except ValueError:
        return float(text)


def local_aggregate(node: exp.AggFunc, table: TablePolicy, resolve: Resolver,
                    public_rows: bool = False
                    ) -> tuple[AggregateRule, list[Statistic]] | None:
    """The rule and statistics of an aggregate over a local-DP column; None when the
    aggregate reads no such column. Any other use of one is refused. `public_rows`: the
    query's WHERE and GROUP BY read only public columns (`rows_are_public`), so with
    public membership which rows each group holds is public, and with a report in every
    row (NOT NULL in the database) so is how many reports it holds: released exactly."""
    columns = [resolve(c) for c in node.find_all(exp.Column)]
    local = [c for c in columns if c.ldp is not None]
    if not local:
        return None
    column = local[0]
    kind = "count" if isinstance(node, exp.Count) else "avg" if isinstance(node, exp.Avg) \
        else None
    bit = _indicator(node.this, column) if kind is not None and len(columns) == 1 else None
    if kind is None or bit is None:
        raise PrivacyViolation(
            f"{node.sql('postgres')}: column {column.name} was collected under local "
            "differential privacy; only its debiased COUNT and AVG are answered",
            hint=f"ask for {_usage(column)}")
    assert column.ldp is not None
    # whether a person reported at all is no randomized answer: exact only where the
    # database holds a report in every row (the column NOT NULL there: a declaration alone
    # is not checked), so that a group's report count is its public row count
    # (`COUNT(col) WHERE person_id = 7` told whether person 7 answered)
    exact = table.membership == "public" and public_rows and column.database_not_null
    statistics = [Statistic("sum", bit, 0.0, 1.0, 0.0, True, exact),
                  Statistic("count", bit.copy(), exact=exact)]
    return local_rule(kind, column.ldp), statistics


def rows_are_public(read: Iterable[ColumnPolicy], table: TablePolicy,
                    public_columns: Collection[str] = ()) -> bool:
    """Whether the columns the WHERE and the GROUP BY keys read all hold values public
    row by row: the privacy unit, columns declared `public = true`, and `public_columns`
    (those of joined public tables).

    Public membership makes the roster public, not every column: a filter on a private
    column (`WHERE income > 50000`) makes a group's report count a private count, which
    exact release would give away. `public_values` and `public_range` do not make a column
    public here: they publish the values a column can take, not which person holds which
    (`WHERE person_id = 3 AND diagnosis = 'hiv'` would tell exactly)."""
    return all(c.name == table.privacy_unit or c.public or c.name in public_columns
               for c in read)


def _describe(channel: LocalDP) -> str:
    if isinstance(channel, RandomizedResponse):
        return f"local randomized response (ε={channel.epsilon:.4g})"
    return (f"local unary encoding (p={channel.p:.4g}, q={channel.q:.4g}, "
            f"ε={channel.epsilon:.4g})")


def local_rule(kind: str, channel: LocalDP) -> AggregateRule:
    """The rule for COUNT ("count") or AVG ("avg") over a column randomized by `channel`."""
    if isinstance(channel, RandomizedResponse):
        return _rule(kind, channel.p_one, channel.p_zero, _describe(channel))
    return _rule(kind, channel.p, channel.q, _describe(channel))


@functools.lru_cache(maxsize=256)
def _rule(kind: str, p_one: float, p_zero: float, mechanism: str) -> AggregateRule:
    gap = p_one - p_zero

    def count_value(values: Values, _: Stats) -> float:
        ones, n = values
        return (ones - n * p_zero) / gap

    def share_value(values: Values, stats: Stats) -> float:
        n = values[1]
        # with under one report nothing is known: the midpoint, as AVG does
        return count_value(values, stats) / n if n >= 1 else 0.5

    def count_interval(values: Values, half: Values, stats: Stats) -> Interval:
        ones, n = values
        half_ones, half_n, z = half
        if stats[0].exact:
            sampling = z * math.sqrt(max(n, 0.0) * report_variance(p_one, p_zero)) / gap
        else:
            # n itself is noisy; r(1 − r) ≤ 1/4 bounds the binomial variance at any r
            sampling = z * math.sqrt(max(n + half_n, 0.0) / 4) / gap
        # the estimate grows with the ones and shrinks with n: its extremes sit at corners
        low = (ones - half_ones - (n + half_n) * p_zero) / gap - sampling
        high = (ones + half_ones - (n - half_n) * p_zero) / gap + sampling
        return (low, high)

    def share_interval(values: Values, half: Values, stats: Stats) -> Interval:
        ones, n = values
        half_n, z = half[1], half[2]
        if stats[0].exact:
            if n < 1:
                return (0.0, 1.0)
            value = (ones / n - p_zero) / gap
            error = z * math.sqrt(report_variance(p_one, p_zero) / n) / gap
            return (value - error, value + error)
        n_low, n_high = n - half_n, n + half_n
        if n_low < 1:
            return (0.0, 1.0)
        low_count, high_count = count_interval(values, half, stats)
        shares = [c / m for c in (low_count, high_count) for m in (n_low, n_high)]
        return (min(shares), max(shares))

    if kind == "count":
        return AggregateRule("count", _unused_statistics, count_value, count_interval,
                             lambda stats: (0.0, math.inf), lambda stats: False,
                             local_sampling=True, mechanism=mechanism)
    return AggregateRule("avg", _unused_statistics, share_value, share_interval,
                         lambda stats: (0.0, 1.0), lambda stats: False,
                         local_sampling=True, mechanism=mechanism)


def _unused_statistics(*_: object) -> list[Statistic]:
    raise AssertionError("local-DP statistics come from local_aggregate, which sees the column")
