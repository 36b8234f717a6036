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
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from ..quantiles import binning_for
from .expressions import ExprType, written_sql

StatisticKind = Literal["count", "sum", "count_units", "count_distinct", "quantile"]
INF = math.inf


@dataclass(frozen=True)
class Statistic:
    """One exact per-group number computed by the backend, before any noise.

    For "sum", each row contributes clamp(argument, lower, upper) - center; for
    "count", 1 per row where the argument is not NULL (every row when argument is
    None); for "count_units", 1 per privacy unit in the group; for "count_distinct", 1 per
    distinct non-NULL value of the argument over the group's kept rows (one unit's kept rows,
    at most `max_rows`, add or remove at most that many); for "quantile", the histogram
    of clamp(argument, lower, upper) over bins of that range (`dpproxy.quantiles`), from
    which the exponential mechanism picks the `quantile` (p in [0, 1]).

    An `exact` statistic is released without central noise: only local-DP aggregates over a
    table with public membership have them (see `analyze/ldp.py`).

    A `unit_total` sum (SUM's own) takes from each bounded (unit, group) pair its total,
    clamped to what `max_rows` rows could add up to; the sums inside AVG and the variance
    family take `max_rows` × the pair's mean instead, so that they stay in proportion to
    its bounded count (`rewrite._bounded_pairs`).
    """

    kind: StatisticKind
    argument: exp.Expression | None = None
    lower: float = 0.0
    upper: float = 0.0
    center: float = 0.0
    integer_valued: bool = True
    exact: bool = False
    quantile: Fraction | None = None  # p, for kind "quantile"
    unit_total: bool = False
    mode: bool = False  # kind "quantile" drawn by the count utility: MODE (see quantiles.py)

    @property
    def row_contribution(self) -> float:
        """Largest change one row (one unit, for count_units) makes to this statistic (for a
        quantile: to the rank utility of every candidate bin)."""
        if self.kind == "sum":
            return max(abs(self.lower - self.center), abs(self.upper - self.center))
        return 1.0

    @property
    def fixed_point_bits(self) -> int | None:
        """For a real-valued sum: the backend sums each row's value as the integer
        round(value · 2^k), exactly, and the release scales the sum back by 2^-k (None:
        whole numbers, summed as they are). k puts the largest row value at 2^40, so a
        row's rounding (≤ 2^-k/2) is far below the noise grid (`mechanisms.noise_spec`).

        A floating-point sum of n values errs by up to about n·2^-53·Σ|x|, and two
        neighbouring tables can err differently: on millions of rows by far more than the
        sensitivity's last digits the grid allows for. An integer sum does not err."""
        if self.kind != "sum" or self.integer_valued:
            return None
        largest = self.row_contribution
        return FIXED_POINT_BITS - math.frexp(largest)[1] if largest > 0 else 0

    @property
    def identity(self) -> tuple[object, ...]:
        """Equal identities compute the same number: measure it once."""
        arg = self.argument.sql("postgres") if self.argument is not None else None
        return (self.kind, arg, self.lower, self.upper, self.center, self.exact,
                self.quantile, self.unit_total, self.mode)

    def describe(self) -> str:
        arg = written_sql(self.argument) if self.argument is not None else "*"
        if self.kind == "count":
            return f"COUNT({arg})"
        if self.kind == "count_units":
            return "COUNT(DISTINCT privacy unit)"
        if self.kind == "count_distinct":
            return f"COUNT(DISTINCT {arg})"
        clamp = f"clamp({arg}, {self.lower:g}, {self.upper:g})"
        if self.kind == "quantile" and self.mode:
            candidates = self.argument.meta.get("candidates") if self.argument else None
            return f"MODE of histogram({arg} over its {candidates} values)" \
                if candidates else f"MODE of histogram({clamp})"
        if self.kind == "quantile":
            return f"QUANTILE {float(self.quantile or 0):g} of histogram({clamp})"
        return f"SUM({clamp} - {self.center:g})" if self.center else f"SUM({clamp})"


# Magnitude of the largest row value of a real-valued sum in its fixed-point form
FIXED_POINT_BITS = 40

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
    # For rules over several statistics, whose error depends on the group's count n: the
    # statistics' half-widths and n -> a first-order half-width of the value in a group of
    # n rows (EXPLAIN's expected error; the released interval is the rigorous one).
    error_at: Callable[[Values, Stats, float], float] | None = None
    # "date": a quantile of a date measured as its day number (days since 1970-01-01),
    # released as the date (PostgreSQL type date); None: a number (int8 or float8)
    value_type: str | None = None
    # MODE of a column with public values: the bins are those values' positions, released
    # as the value itself (PostgreSQL type text)
    labels: tuple[object, ...] | None = None

    @property
    def releases_its_statistic(self) -> bool:
        """Whether the value is its one released statistic and the interval that value ±
        its half-width (COUNT, SUM), so release can compute both for a whole column."""
        return self.combine is _single and self.interval is _single_interval


def _clip(value: float, bounds: Interval) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _count_of(arg: exp.Expression | None, t: ExprType | None) -> Statistic:
    """COUNT(arg); an argument that is never NULL counts every row, so it is COUNT(*) and
    shares that statistic (and its share of ε) with every other count of the query."""
    never_null = t is not None and not t.nullable
    return Statistic("count", None if never_null else arg)


def _count_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    return [_count_of(arg, t)]


def _whole_bounds(t: ExprType) -> ExprType:
    """An integer-valued type's bounds widened to whole numbers. The rewrite rounds each
    clamped value of an integer-valued sum (its noise is calibrated for whole numbers):
    a value clamped to 10.5 would round to 11, above the bound its sensitivity is
    computed from, unless the bound itself is whole."""
    if not t.integer or not (math.isfinite(t.lower) and math.isfinite(t.upper)) or (
            float(t.lower).is_integer() and float(t.upper).is_integer()):
        return t
    return replace(t, lower=float(math.floor(t.lower)), upper=float(math.ceil(t.upper)))


def _sum_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    assert arg is not None and t is not None
    t = _whole_bounds(t)
    return [Statistic("sum", arg, t.lower, t.upper, 0.0, t.integer, unit_total=True)]


def _avg_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    # Centring the values halves the sum's sensitivity: |x - mid| <= (upper - lower) / 2.
    assert arg is not None and t is not None
    t = _whole_bounds(t)
    center = (t.lower + t.upper) / 2
    centred_integer = t.integer and float(center).is_integer()
    return [Statistic("sum", arg, t.lower, t.upper, center, centred_integer),
            _count_of(arg, t)]


def _units_statistics(arg: exp.Expression | None, _: ExprType | None) -> list[Statistic]:
    return [Statistic("count_units", arg)]


def _distinct_statistics(arg: exp.Expression | None, _: ExprType | None) -> list[Statistic]:
    return [Statistic("count_distinct", arg)]


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


@functools.lru_cache(maxsize=256)  # p is the analyst's: keep only recent ones
def quantile_rule(quantile: Fraction, continuous: bool = True) -> AggregateRule:
    """MEDIAN, PERCENTILE_CONT(p), MIN (p = 0), MAX (p = 1): the exponential mechanism over
    a histogram of the clamped argument (`dpproxy.quantiles`). MIN and MAX are the DP
    estimates of quantiles 0 and 1 of the clamped values, not the true extremes.
    `continuous` (MEDIAN, PERCENTILE_CONT): double precision, as PostgreSQL's
    percentile_cont, so that `MEDIAN(age) / 2` divides as it does there; else (MIN, MAX)
    whole numbers where each bin is one integer, as the column's own type."""
    def statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
        assert arg is not None and t is not None
        return [Statistic("quantile", arg, t.lower, t.upper, 0.0, t.integer,
                          quantile=quantile)]

    return AggregateRule(
        f"quantile {quantile}", statistics, _single, _no_interval,
        lambda stats: (stats[0].lower, stats[0].upper),
        # whole numbers when each bin is one integer (see quantiles.binning_for)
        lambda stats: not continuous and _quantile_integer(stats[0]), exponential=True)


@functools.lru_cache(maxsize=256)  # labels are a policy's public values: few distinct
def mode_rule(labels: tuple[object, ...] | None = None, value_type: str | None = None
              ) -> AggregateRule:
    """MODE() WITHIN GROUP (ORDER BY x): the exponential mechanism with the count utility
    over one bin per candidate (`dpproxy.quantiles`): the integers of x's bounded range, or
    with `labels` the positions 0 … k − 1 of a column's public values, released as the
    value at that position, of PostgreSQL type `value_type`."""
    def statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
        assert arg is not None and t is not None
        return [Statistic("quantile", arg, t.lower, t.upper, 0.0, True,
                          quantile=Fraction(0), mode=True)]

    return AggregateRule(
        "mode", statistics, _single, _no_interval, lambda stats: (stats[0].lower,
                                                                 stats[0].upper),
        lambda stats: True, exponential=True,
        value_type=value_type, labels=labels)


def _quantile_integer(s: Statistic) -> bool:
    return binning_for(s.lower, s.upper, s.integer_valued).integer_points
def _variance_statistics(arg: exp.Expression | None, t: ExprType | None) -> list[Statistic]:
    """Count n, centred sum S1 = Σ(x − c) and centred sum of squares S2 = Σ(x − c)².

    S1 and n are AVG's statistics (an AVG of the same argument measures them once). S2 is a
    plain "sum" over the row expression (x − c)², clamped to [0, h²] with h = (upper −
    lower)/2, rather than a new statistic kind: because c is the midpoint of [lower,
    upper], clamping the square gives exactly the square of the clamped value,
    min((x − c)², h²) = (clamp(x, lower, upper) − c)², so the rewrite, sensitivity (h² per
    row) and noise of sums apply unchanged.
    """
    assert arg is not None and t is not None
    t = _whole_bounds(t)
    center = (t.lower + t.upper) / 2
    half = (t.upper - t.lower) / 2
    integer = t.integer and float(center).is_integer()
    centred = _centred(arg, center)
    square = exp.Mul(this=exp.Paren(this=centred), expression=exp.Paren(this=centred.copy()))
    return [Statistic("sum", arg, t.lower, t.upper, center, integer),
            _count_of(arg, t),
            Statistic("sum", square, 0.0, half * half, 0.0, integer)]


def _centred(arg: exp.Expression, center: float) -> exp.Expression:
    if center == 0:
        return arg.copy()
    offset = exp.Literal.number(abs(center))
    if center < 0:
        return exp.Add(this=arg.copy(), expression=offset)
    return exp.Sub(this=arg.copy(), expression=offset)


# Below this noisy count the statistics say nothing usable about the spread; the value is
# then the variance of a uniform distribution over the bounds, h²/3 (h = (upper − lower)/2),
# which is what the bounds alone suggest (as AVG falls back to the midpoint).
MIN_VARIANCE_COUNT = 2.0


def _half_range(stats: Stats) -> float:
    return (stats[0].upper - stats[0].lower) / 2


def _variance_value(values: Values, stats: Stats, sample: bool) -> float:
    noisy_s1, noisy_count, noisy_s2 = values
    half = _half_range(stats)
    if noisy_count < MIN_VARIANCE_COUNT:
        return half * half / 3
    mean = _clip(noisy_s1 / noisy_count, (-half, half))  # centred: |mean| <= h
    variance = _clip(noisy_s2 / noisy_count - mean * mean, (0.0, half * half))
    return variance * noisy_count / (noisy_count - 1) if sample else variance


def _variance_interval(values: Values, half_widths: Values, stats: Stats, sample: bool
                       ) -> Interval:
    """Every (S1, n, S2) inside the three intervals gives a variance inside this one."""
    noisy_s1, noisy_count, noisy_s2 = values
    h1, hn, h2 = half_widths[:3]
    half = _half_range(stats)
    top = _variance_range(stats, sample)[1]
    count_low, count_high = noisy_count - hn, noisy_count + hn
    if count_low < MIN_VARIANCE_COUNT:
        return (0.0, top)
    squares_low, squares_high = max(noisy_s2 - h2, 0.0), max(noisy_s2 + h2, 0.0)
    means = [_clip((noisy_s1 + d) / c, (-half, half)) for d in (-h1, h1)
             for c in (count_low, count_high)]
    mean_low, mean_high = min(means), max(means)
    square_high = max(mean_low ** 2, mean_high ** 2)
    square_low = 0.0 if mean_low <= 0 <= mean_high else min(mean_low ** 2, mean_high ** 2)
    low = _clip(squares_low / count_high - square_high, (0.0, half * half))
    high = _clip(squares_high / count_low - square_low, (0.0, half * half))
    if sample:  # n/(n − 1) falls as n grows
        low, high = low * count_high / (count_high - 1), high * count_low / (count_low - 1)
    return (low, high)


def _variance_range(stats: Stats, sample: bool) -> Interval:
    # n values in [lower, upper] have population variance at most h²; the sample variance
    # is at most h²·n/(n − 1), which is largest (2h²) for n = 2.
    half = _half_range(stats)
    return (0.0, (2.0 if sample else 1.0) * half * half)


def _variance_rule(name: str, sample: bool, root: bool) -> AggregateRule:
    """VAR_POP, VAR_SAMP, STDDEV_POP or STDDEV_SAMP from (S1, n, S2): var_pop = S2/n −
    (S1/n)², clipped to [0, h²]; var_samp = var_pop·n/(n − 1); stddev = √variance."""
    def value(values: Values, stats: Stats) -> float:
        variance = _variance_value(values, stats, sample)
        return math.sqrt(variance) if root else variance

    def bounds(values: Values, half_widths: Values, stats: Stats) -> Interval:
        low, high = _variance_interval(values, half_widths, stats, sample)
        return (math.sqrt(low), math.sqrt(high)) if root else (low, high)

    def value_range(stats: Stats) -> Interval:
        low, high = _variance_range(stats, sample)
        return (math.sqrt(low), math.sqrt(high)) if root else (low, high)

    def error_at(half_widths: Values, stats: Stats, count: float) -> float:
        return _variance_error(half_widths, stats, count, sample, root)

    return AggregateRule(name, _variance_statistics, value, bounds, value_range,
                         lambda stats: False, error_at=error_at)


def _avg_error(half_widths: Values, stats: Stats, count: float) -> float:
    # mean = c + S1/n: |Δ| <= (|ΔS1| + |S1/n|·|Δn|)/n to first order, and |S1/n| <= h
    return (half_widths[0] + _half_range(stats) * half_widths[1]) / count


def _variance_error(half_widths: Values, stats: Stats, count: float, sample: bool,
                    root: bool) -> float:
    # v = S2/n − (S1/n)²: |∂v/∂S2| = 1/n, |∂v/∂S1| = 2|S1/n|/n <= 2h/n and
    # |∂v/∂n| = |2(S1/n)² − S2/n|/n <= 2h²/n; |√a − √b| <= √|a − b| for the root
    h1, hn, h2 = half_widths[:3]
    half = _half_range(stats)
    error = (h2 + 2 * half * h1 + 2 * half * half * hn) / count
    if sample:
        error *= count / (count - 1)
    error = min(error, _variance_range(stats, sample)[1])
    return math.sqrt(error) if root else error


RULES: dict[str, AggregateRule] = {
    "count": AggregateRule("count", _count_statistics, _single, _single_interval,
                           _nonnegative, lambda stats: True),
    "sum": AggregateRule("sum", _sum_statistics, _single, _single_interval, _sum_range,
                         lambda stats: stats[0].integer_valued),
    "avg": AggregateRule("avg", _avg_statistics, _avg_value, _avg_interval,
                         lambda stats: (stats[0].lower, stats[0].upper), lambda stats: False,
                         error_at=_avg_error),
    "count_units": AggregateRule("count_units", _units_statistics, _single, _single_interval,
                                 _nonnegative, lambda stats: True),
    "count_distinct": AggregateRule("count_distinct", _distinct_statistics, _single,
                                    _single_interval, _nonnegative, lambda stats: True),
    "median": quantile_rule(Fraction(1, 2)),
    "min": quantile_rule(Fraction(0), continuous=False),
    "max": quantile_rule(Fraction(1), continuous=False),
    "var_pop": _variance_rule("var_pop", sample=False, root=False),
    "var_samp": _variance_rule("var_samp", sample=True, root=False),
    "stddev_pop": _variance_rule("stddev_pop", sample=False, root=True),
    "stddev_samp": _variance_rule("stddev_samp", sample=True, root=True),
}
VARIANCE_RULES = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")

SUPPORTED_HELP = ("COUNT(*), COUNT(expr), COUNT(DISTINCT expr), SUM(expr), AVG(expr), "
                  "MEDIAN(expr), PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY expr), MIN(expr), "
                  "MAX(expr), MODE() WITHIN GROUP (ORDER BY expr), VAR_POP, VAR_SAMP "
                  "(VARIANCE), STDDEV_POP, STDDEV_SAMP (STDDEV)")


def combine(rule: AggregateRule, values: Values, stats: Stats) -> float:
    """The analyst's value from released statistics, post-processed into its range."""
    return _clip(rule.combine(values, stats), rule.value_range(stats))


def interval(rule: AggregateRule, values: Values, half: Values, stats: Stats) -> Interval:
    """A confidence interval for the analyst's value, clipped to its range."""
    low, high = rule.interval(values, half, stats)
    bounds = rule.value_range(stats)
    return (_clip(low, bounds), _clip(high, bounds))
