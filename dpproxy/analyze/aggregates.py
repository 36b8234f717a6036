"""The aggregate rule table: what each supported aggregate measures and how it is combined.

Adding an aggregate means adding one `AggregateRule` to `RULES`: which exact
per-group statistics the backend computes (each later gets its own noise), how
the released statistics combine into the analyst's value, its range for
post-processing, and a conservative confidence interval.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from ..quantiles import binning_for
from .expressions import ExprType

StatisticKind = Literal["count", "sum", "count_units", "quantile"]
INF = math.inf


@dataclass(frozen=True)
class Statistic:
    """One exact per-group number computed by the backend, before any noise.

    For "sum", each row contributes clamp(argument, lower, upper) - center; for
    "count", 1 per row where the argument is not NULL (every row when argument is
    None); for "count_units", 1 per privacy unit in the group; for "quantile", the histogram
    of clamp(argument, lower, upper) over bins of that range (`dpproxy.quantiles`), from
    which the exponential mechanism picks the `quantile` (p in [0, 1]).

    An `exact` statistic is released without central noise: only local-DP aggregates over a
    table with public membership have them (see `analyze/ldp.py`).
    """

    kind: StatisticKind
    argument: exp.Expression | None = None
    lower: float = 0.0
    upper: float = 0.0
    center: float = 0.0
    integer_valued: bool = True
    exact: bool = False
    quantile: Fraction | None = None  # p, for kind "quantile"

    @property
    def row_contribution(self) -> float:
        """Largest change one row (one unit, for count_units) makes to this statistic (for a
        quantile: to the rank utility of every candidate bin)."""
        if self.kind == "sum":
            return max(abs(self.lower - self.center), abs(self.upper - self.center))
        return 1.0

    @property
    def identity(self) -> tuple[object, ...]:
        """Equal identities compute the same number: measure it once."""
        arg = self.argument.sql("postgres") if self.argument is not None else None
        return (self.kind, arg, self.lower, self.upper, self.center, self.exact,
                self.quantile)

    def describe(self) -> str:
        arg = self.argument.sql("postgres") if self.argument is not None else "*"
        if self.kind == "count":
            return f"COUNT({arg})"
        if self.kind == "count_units":
            return "COUNT(DISTINCT privacy unit)"
        clamp = f"clamp({arg}, {self.lower:g}, {self.upper:g})"
        if self.kind == "quantile":
            return f"QUANTILE {float(self.quantile or 0):g} of histogram({clamp})"
        return f"SUM({clamp} - {self.center:g})" if self.center else f"SUM({clamp})"


Interval = tuple[float, float]
Values = Sequence[float]
Stats = Sequence[Statistic]


@dataclass(frozen=True)
class AggregateRule:
    name: str
    statistics: Callable[[exp.Expression | None, ExprType | None], list[Statistic]]
    # released statistic values -> the analyst's value (before clipping to value_range)
    combine: Callable[[Values, Stats], float]
    # released values and their half-widths -> a conservative interval for the value
    interval: Callable[[Values, Values, Stats], Interval]
    value_range: Callable[[Stats], Interval]
    integer_result: Callable[[Stats], bool]
    # Local-DP rules: the value also carries sampling error from the randomized reports, so
    # `interval` gets one more half-width, the standard normal quantile at the same level,
    # which the rule scales by its own standard error. `mechanism` names the randomization.
    local_sampling: bool = False
    mechanism: str | None = None
    # Released by the exponential mechanism (quantiles): no value interval, a rank bound.
    exponential: bool = False


def _clip(value: float, bounds: Interval) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _count_statistics(arg: exp.Expression | None, _: ExprType | None) -> list[Statistic]:
    return [Statistic("count", arg)]


def _sum_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    assert arg is not None and t is not None
    return [Statistic("sum", arg, t.lower, t.upper, 0.0, t.integer)]


def _avg_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    # Centring the values halves the sum's sensitivity: |x - mid| <= (upper - lower) / 2.
    assert arg is not None and t is not None
    center = (t.lower + t.upper) / 2
    centred_integer = t.integer and float(center).is_integer()
    return [Statistic("sum", arg, t.lower, t.upper, center, centred_integer),
            Statistic("count", arg)]


def _units_statistics(arg: exp.Expression | None, _: ExprType | None) -> list[Statistic]:
    return [Statistic("count_units", arg)]


def _single(values: Values, _: Stats) -> float:
    return values[0]


def _single_interval(values: Values, half: Values, _: Stats) -> Interval:
    return (values[0] - half[0], values[0] + half[0])


def _nonnegative(_: Stats) -> Interval:
    return (0.0, INF)


def _sum_range(stats: Stats) -> Interval:
    s = stats[0]
    return (-INF if s.lower < 0 else 0.0, INF if s.upper > 0 else 0.0)


def _avg_value(values: Values, stats: Stats) -> float:
    s = stats[0]
    noisy_sum, noisy_count = values
    # A noisy count below 1 carries no usable information about the mean: use the midpoint.
    return s.center + noisy_sum / noisy_count if noisy_count >= 1 else s.center


def _avg_interval(values: Values, half: Values, stats: Stats) -> Interval:
    """Every (sum, count) pair inside both intervals gives a mean inside this one."""
    s = stats[0]
    noisy_sum, noisy_count = values
    count_low = noisy_count - half[1]
    if count_low < 1:
        return (s.lower, s.upper)
    corners = [(noisy_sum + ds) / c for ds in (-half[0], half[0])
               for c in (count_low, noisy_count + half[1])]
    return (s.center + min(corners), s.center + max(corners))


def _no_interval(values: Values, half: Values, stats: Stats) -> Interval:
    # never called: release gives exponential rules no value interval (see quantiles.py)
    return (-INF, INF)


@functools.cache
def quantile_rule(quantile: Fraction) -> AggregateRule:
    """MEDIAN, PERCENTILE_CONT(p), MIN (p = 0), MAX (p = 1): the exponential mechanism over
    a histogram of the clamped argument (`dpproxy.quantiles`). MIN and MAX are the DP
    estimates of quantiles 0 and 1 of the clamped values, not the true extremes."""
    def statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
        assert arg is not None and t is not None
        return [Statistic("quantile", arg, t.lower, t.upper, 0.0, t.integer,
                          quantile=quantile)]

    return AggregateRule(
        f"quantile {quantile}", statistics, _single, _no_interval,
        lambda stats: (stats[0].lower, stats[0].upper),
        # whole numbers when each bin is one integer (see quantiles.binning_for)
        lambda stats: _quantile_integer(stats[0]), exponential=True)


def _quantile_integer(s: Statistic) -> bool:
    return binning_for(s.lower, s.upper, s.integer_valued).integer_points


RULES: dict[str, AggregateRule] = {
    "count": AggregateRule("count", _count_statistics, _single, _single_interval,
                           _nonnegative, lambda stats: True),
    "sum": AggregateRule("sum", _sum_statistics, _single, _single_interval, _sum_range,
                         lambda stats: stats[0].integer_valued),
    "avg": AggregateRule("avg", _avg_statistics, _avg_value, _avg_interval,
                         lambda stats: (stats[0].lower, stats[0].upper), lambda stats: False),
    "count_units": AggregateRule("count_units", _units_statistics, _single, _single_interval,
                                 _nonnegative, lambda stats: True),
    "median": quantile_rule(Fraction(1, 2)),
    "min": quantile_rule(Fraction(0)),
    "max": quantile_rule(Fraction(1)),
}

SUPPORTED_HELP = ("COUNT(*), COUNT(expr), COUNT(DISTINCT <privacy unit>), SUM(expr), AVG(expr), "
                  "MEDIAN(expr), PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY expr), MIN(expr), "
                  "MAX(expr)")


def combine(rule: AggregateRule, values: Values, stats: Stats) -> float:
    """The analyst's value from released statistics, post-processed into its range."""
    return _clip(rule.combine(values, stats), rule.value_range(stats))


def interval(rule: AggregateRule, values: Values, half: Values, stats: Stats) -> Interval:
    """A confidence interval for the analyst's value, clipped to its range."""
    low, high = rule.interval(values, half, stats)
    bounds = rule.value_range(stats)
    return (_clip(low, bounds), _clip(high, bounds))
