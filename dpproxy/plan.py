"""Plan the privacy of an analyzed query: sensitivities, the ε/δ split, noise scales.

Like an OpenDP measurement, a `QueryPlan` knows before anything runs what each
noisy output costs: its statistic, its L1/L2 sensitivity under the table's
contribution bounds, its mechanism and scale. `EXPLAIN` prints it, the
accountant charges `plan.cost`, and tests assert on it without touching data.

Sensitivity, for neighbouring databases that differ in one privacy unit: the
rewrite keeps at most `max_rows` rows of a unit in each group and lets a unit
touch at most `max_groups` groups, so one unit moves one group's statistic by
at most `max_rows × row_contribution`, and the vector of all groups by

    L1 = max_groups × max_rows × row_contribution
    L2 = √max_groups × max_rows × row_contribution.

The groups of a GROUP BY are paid for once, through this sensitivity.

A quantile (MEDIAN, PERCENTILE_CONT, MIN, MAX) takes one share of ε like any statistic,
under either mechanism; its share is spent by the exponential mechanism, whose per-group
ε is the share divided by max_groups (see `dpproxy.quantiles`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from .accountant import Cost, Loss
from .analyze import Analysis
from .analyze.aggregates import Statistic
from .errors import InvalidParameterValue
from .mechanisms import Mechanism, NoiseSpec, calibrate, half_width
from .quantiles import QuantileSpec, binning_for
from .selection import SelectionSpec, count_selection, effective_threshold, plan_selection

# How partition selection decides which groups with private keys to release: by a noisy
# count of each group's distinct units (its own share of ε), by the query's released
# COUNT(*) (no share of its own), or "auto": the released count where one unit adds at
# most one row to a group and that threshold is no higher (see `plan_query`).
SelectionMode = Literal["auto", "units", "rows"]
SELECTION_MODES: tuple[SelectionMode, ...] = ("auto", "units", "rows")


@dataclass(frozen=True)
class QueryOptions:
    """Per-query privacy parameters: session options, else the policy's defaults."""

    epsilon: float
    delta: float
    mechanism: Mechanism
    confidence: float = 0.95
    min_units_per_group: int = 0  # extra floor for partition selection
    # Relative weights of the query's aggregates in the ε/δ split (see `budget_fractions`);
    # None: split evenly over the noisy statistics.
    split: tuple[float, ...] | None = None
    selection: SelectionMode = "auto"

    def __post_init__(self) -> None:
        if self.selection not in SELECTION_MODES:
            raise InvalidParameterValue(
                f"invalid value for dpproxy.selection: {self.selection!r}",
                hint="use 'auto', 'units' or 'rows'")
        if self.split is not None and not (
                self.split and all(math.isfinite(w) and w > 0 for w in self.split)):
            raise InvalidParameterValue(
                f"dpproxy.split weights must be positive finite numbers, got "
                f"{format_split(self.split) or 'none'}", hint=SPLIT_HINT)
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InvalidParameterValue(f"epsilon must be a positive number, got {self.epsilon}")
        if self.epsilon > MAX_EPSILON:
            # beyond any use (e^ε bounds nothing), and ε²/2 of zCDP would overflow from 1e154
            raise InvalidParameterValue(
                f"epsilon must be at most {MAX_EPSILON:g}, got {self.epsilon:g}",
                hint="a query's ε is usually between 0.01 and 10")
        if not (0 <= self.delta < 1):
            raise InvalidParameterValue(f"delta must be in [0, 1), got {self.delta}")
        if self.mechanism == "gaussian" and self.delta == 0:
            raise InvalidParameterValue("the Gaussian mechanism needs delta > 0",
                                        hint="SET dpproxy.delta = 1e-7, or use laplace")
        if not 0 < self.confidence < 1:
            raise InvalidParameterValue(
                f"confidence must be between 0 and 1, got {self.confidence}")
        if self.min_units_per_group < 0 or self.min_units_per_group != int(
                self.min_units_per_group):
            raise InvalidParameterValue(
                f"min_units_per_group must be a non-negative integer, got "
                f"{self.min_units_per_group}")


MAX_EPSILON = 1e9  # a query's ε (`QueryOptions`)

SPLIT_HINT = ("one positive weight per aggregate, in the order the aggregates first appear "
              "(select list, then HAVING, then ORDER BY), e.g. SET dpproxy.split = '1,3'; "
              "RESET dpproxy.split splits evenly")


def parse_split(value: object) -> tuple[float, ...] | None:
    """The weights of `SET dpproxy.split = '…'`: comma-separated numbers, or None (even split)
    for NULL, '', 'even' or 'default'.

    >>> parse_split("1, 3")
    (1.0, 3.0)
    >>> parse_split("even") is None
    True
    """
    if value is None:
        return None
    if isinstance(value, tuple | list):
        parts = [str(v) for v in value]
    else:
        text = str(value).strip()
        if text.lower() in ("", "even", "default"):
            return None
        parts = text.split(",")
    try:
        weights = tuple(float(part) for part in parts)
    except ValueError:
        raise InvalidParameterValue(f"invalid value for dpproxy.split: {value!r}",
                                    hint=SPLIT_HINT) from None
    QueryOptions(1.0, 0.0, "laplace", split=weights)  # validates the weights
    return weights


def format_split(split: tuple[float, ...] | None) -> str:
    """How SHOW prints a split: 'even', or the weights as SET takes them."""
    return "even" if split is None else ",".join(f"{w:g}" for w in split)


@dataclass(frozen=True)
class ContributionBound:
    """How much one privacy unit may contribute, enforced by the rewritten SQL."""

    privacy_unit: str | None  # None: every row is its own unit, nothing to enforce
    max_groups: int
    max_rows: int


@dataclass(frozen=True)
class Measurement:
    """One noisy statistic: computed exactly per group by the backend, then noised."""

    column: str  # its column in the rewritten SQL
    statistic: Statistic
    sensitivity: float  # L1 for Laplace, L2 for Gaussian, of the vector over all groups
    # None: an exact statistic, released without central noise (local-DP reports in a table
    # with public membership; see analyze/ldp.py)
    noise: NoiseSpec | None
    half_width: float  # at the plan's confidence level
    # A quantile, released by the exponential mechanism (noise is None, sensitivity is the
    # rank utility's per group): see dpproxy.quantiles
    quantile: QuantileSpec | None = None

    @property
    def private(self) -> bool:
        """True when releasing it spends budget (noise or the exponential mechanism)."""
        return self.noise is not None or self.quantile is not None


@dataclass(frozen=True)
class QueryPlan:
    analysis: Analysis
    contribution: ContributionBound
    options: QueryOptions
    measurements: tuple[Measurement, ...]
    selection: SelectionSpec | None = None  # partition selection, for private group keys

    @property
    def counts_units(self) -> bool:
        """Whether its statements compute each group's count of distinct units (partition
        selection by units; selection by the released count needs none)."""
        return self.selection is not None and self.selection.counts_units

    @property
    def reads_data(self) -> bool:
        return bool(self.measurements) or self.selection is not None

    @functools.cached_property  # (a frozen plan: read at the charge, the audit, the result)
    def cost(self) -> Cost:
        if self.selection is None and not any(m.private for m in self.measurements):
            return Cost(0.0, 0.0)  # nothing noised: reads no data, or only exact statistics
        uses_delta = self.options.mechanism == "gaussian" or self.selection is not None
        return Cost(self.options.epsilon, self.options.delta if uses_delta else 0.0)

    @functools.cached_property
    def loss(self) -> Loss:
        """The cost in the forms that compose: (ε, δ) as charged under basic composition, and
        zCDP ρ — Gaussian measurements Δ²/2σ², Laplace ones ε²/2 each, quantiles ε²/8 — plus
        the δ that lies outside zCDP (partition selection's threshold)."""
        cost = self.cost
        rho = sum(m.noise.rho if m.noise.rho is not None else m.noise.epsilon ** 2 / 2
                  for m in self.measurements if m.noise is not None)
        rho += sum(m.quantile.rho for m in self.measurements if m.quantile is not None)
        outside_delta = 0.0
        if self.selection is not None:
            sel = self.selection
            if sel.mechanism == "gaussian":
                rho += sel.noise.rho or 0.0
                outside_delta += sel.delta / 2  # the threshold's half; the noise's is in ρ
            else:
                rho += sel.epsilon ** 2 / 2
                outside_delta += sel.delta
        return Loss(cost.epsilon, cost.delta, rho, outside_delta)


def contribution_bound(analysis: Analysis) -> ContributionBound:
    table = analysis.table
    if table.privacy_unit is None:
        return ContributionBound(None, 1, 1)
    # A unit cannot touch more groups than exist; with public keys that number is known.
    if not analysis.keys:
        groups = 1
    elif analysis.group_count is not None:
        groups = min(table.max_groups_per_unit, analysis.group_count)
    else:
        groups = table.max_groups_per_unit
    return ContributionBound(table.privacy_unit, groups, table.max_rows_per_unit)


def statistic_sensitivity(statistic: Statistic, bound: ContributionBound, mechanism: Mechanism
                          ) -> float:
    rows = 1 if statistic.kind == "count_units" else bound.max_rows
    per_group = rows * statistic.row_contribution
    groups = bound.max_groups if mechanism == "laplace" else math.sqrt(bound.max_groups)
    return groups * per_group


def budget_fractions(analysis: Analysis, split: tuple[float, ...] | None,
                     selection_share: bool | None = None) -> list[float]:
    """Each statistic's fraction of the query's ε (and Gaussian δ); exact statistics get 0.

    Partition selection, when the query has it (`selection_share`, by default when its
    keys are private) and counts units itself, keeps one even share, 1/(noisy statistics
    + 1), whatever the split. Even split: every noisy statistic gets that same share. With
    weights (one per aggregate, in `analysis.aggregates` order), the rest is divided in
    proportion to them; an aggregate's weight is divided evenly over its noisy statistics,
    and a statistic two aggregates share (AVG and VAR_POP of one column share the sum and
    the count) adds up its parts. The fractions sum to 1, so the cost is the same.
    """
    noisy = [not s.exact for s in analysis.statistics]
    selecting = not analysis.public_groups if selection_share is None else selection_share
    shares = sum(noisy) + (1 if selecting else 0)
    if split is None:
        return [1 / shares if n else 0.0 for n in noisy]
    aggregates = analysis.aggregates
    if len(split) != len(aggregates):
        listed = ", ".join(a.sql for a in aggregates) or "none"
        raise InvalidParameterValue(
            f"dpproxy.split has {len(split)} weight(s) but the query has {len(aggregates)} "
            f"aggregate(s): {listed}",
            hint=f"give {len(aggregates)} weight(s): {SPLIT_HINT}")
    weights = [0.0 for _ in noisy]
    for aggregate, weight in zip(aggregates, split, strict=True):
        own = sorted({i for i in aggregate.statistics if noisy[i]})
        for i in own:  # an aggregate of exact statistics only costs nothing: no share
            weights[i] += weight / len(own)
    total = sum(weights)
    if total == 0:
        return [0.0 for _ in noisy]
    left = 1 - (1 / shares if selecting else 0.0)
    return [w / total * left for w in weights]


def aggregate_epsilons(plan: QueryPlan) -> list[float]:
    """Each aggregate's part of the query's ε, for EXPLAIN: a statistic's ε is divided among
    the aggregates that use it in proportion to weight / (its noisy statistics), weight 1
    under the even split. With weights, part / ε is each weight's fraction of their sum
    (less partition selection's share); the parts never add up to more than ε."""
    analysis = plan.analysis
    split = plan.options.split or tuple(1.0 for _ in analysis.aggregates)
    noisy = [m.private for m in plan.measurements]
    claims: list[list[tuple[int, float]]] = [[] for _ in noisy]
    for a, (aggregate, weight) in enumerate(zip(analysis.aggregates, split, strict=True)):
        own = sorted({i for i in aggregate.statistics if noisy[i]})
        for i in own:
            claims[i].append((a, weight / len(own)))
    parts = [0.0 for _ in analysis.aggregates]
    for measurement, statistic_claims in zip(plan.measurements, claims, strict=True):
        spent = (measurement.noise.epsilon if measurement.noise is not None
                 else measurement.quantile.epsilon if measurement.quantile is not None
                 else 0.0)
        if not spent:
            continue
        total = sum(c for _, c in statistic_claims)
        for a, c in statistic_claims:
            parts[a] += spent * c / total
    return parts


def plan_query(analysis: Analysis, options: QueryOptions) -> QueryPlan:
    """Split the query's budget over its statistics — evenly, or by the aggregate weights of
    `options.split` (`budget_fractions`) — and partition selection, when group keys are
    private, and calibrate each one's noise.

    Partition selection thresholds a noisy count of each group's distinct units, with its
    own share of ε, or (`options.selection`) the query's released COUNT(*), which needs no
    share: possible under Laplace noise without a min_units_per_group floor. A unit adds up
    to max_rows rows to a group's count but one to its unit count, so "auto" takes the
    released count only where max_rows is 1 (no privacy unit, or one row per unit and
    group) and its threshold is no higher; "rows" takes it wherever possible.
    """
    if analysis.public_groups or options.selection == "units":
        return _plan_query(analysis, options, None)
    count = released_count(analysis, options)
    if count is None:
        return _plan_query(analysis, options, None)
    if options.selection == "auto":
        if contribution_bound(analysis).max_rows != 1:
            return _plan_query(analysis, options, None)
        by_units = _plan_query(analysis, options, None)
        by_rows = _plan_query(analysis, options, count)
        assert by_units.selection is not None and by_rows.selection is not None
        return by_rows if by_rows.selection.threshold <= effective_threshold(
            by_units.selection) else by_units
    return _plan_query(analysis, options, count)


def released_count(analysis: Analysis, options: QueryOptions) -> int | None:
    """The index of the noisy COUNT(*) statistic partition selection could threshold, if
    the query has one and the options allow it."""
    if options.mechanism != "laplace" or options.min_units_per_group:
        return None
    return next((i for i, s in enumerate(analysis.statistics)
                 if s.kind == "count" and s.argument is None and not s.exact), None)


def _plan_query(analysis: Analysis, options: QueryOptions, count: int | None) -> QueryPlan:
    """`plan_query` with selection, if any, by the measurement of statistic `count`, or by
    units (None)."""
    bound = contribution_bound(analysis)
    selecting = not analysis.public_groups
    own_share = selecting and count is None
    shares = sum(not s.exact for s in analysis.statistics) + (1 if own_share else 0)
    fractions = budget_fractions(analysis, options.split, own_share)
    measurements = []
    for index, statistic in enumerate(analysis.statistics):
        if statistic.exact:  # already private (local DP): computed, not noised, not charged
            measurements.append(Measurement(f"m{index}", statistic, 0.0, None, 0.0))
            continue
        if options.split is None:  # (divided, not multiplied: exactly the even share)
            epsilon, delta = options.epsilon / shares, options.delta / shares
        else:
            epsilon, delta = (options.epsilon * fractions[index],
                              options.delta * fractions[index])
        if statistic.kind == "quantile":
            assert statistic.quantile is not None
            spec = QuantileSpec(statistic.quantile, epsilon, bound.max_groups, bound.max_rows,
                                binning_for(statistic.lower, statistic.upper,
                                            statistic.integer_valued), statistic.mode)
            measurements.append(Measurement(f"m{index}", statistic, spec.utility_sensitivity,
                                            None, 0.0, spec))
            continue
        sensitivity = statistic_sensitivity(statistic, bound, options.mechanism)
        if options.mechanism != "gaussian":
            delta = 0.0
        if sensitivity == 0:
            # A sum of a constant zero: nothing about any unit is in it. Noise it anyway at
            # the smallest grid so every output is produced the same way.
            sensitivity = 1.0
        noise = calibrate(options.mechanism, sensitivity, epsilon, delta,
                          integer_valued=statistic.integer_valued,
                          changed_outputs=bound.max_groups)
        measurements.append(Measurement(f"m{index}", statistic, sensitivity, noise,
                                        half_width(noise, options.confidence)))
    selection = None
    if selecting and count is not None:
        noise = measurements[count].noise
        assert noise is not None  # a noisy count: not exact
        selection = count_selection(noise, options.delta, bound.max_groups, bound.max_rows,
                                    count)
    elif selecting:
        # Under Laplace noise all of δ goes to selection; under Gaussian, one share.
        delta = options.delta / shares if options.mechanism == "gaussian" else options.delta
        selection = plan_selection(options.epsilon / shares, delta, bound.max_groups,
                                   int(options.min_units_per_group))
    return QueryPlan(analysis, bound, options, tuple(measurements), selection)
