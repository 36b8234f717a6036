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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .accountant import Cost
from .analyze import Analysis
from .analyze.aggregates import Statistic
from .errors import InvalidParameterValue
from .mechanisms import Mechanism, NoiseSpec, calibrate, half_width


@dataclass(frozen=True)
class QueryOptions:
    """Per-query privacy parameters: session options, else the policy's defaults."""

    epsilon: float
    delta: float
    mechanism: Mechanism
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InvalidParameterValue(f"epsilon must be a positive number, got {self.epsilon}")
        if not (0 <= self.delta < 1):
            raise InvalidParameterValue(f"delta must be in [0, 1), got {self.delta}")
        if self.mechanism == "gaussian" and self.delta == 0:
            raise InvalidParameterValue("the Gaussian mechanism needs delta > 0",
                                        hint="SET dpproxy.delta = 1e-7, or use laplace")
        if not 0 < self.confidence < 1:
            raise InvalidParameterValue(
                f"confidence must be between 0 and 1, got {self.confidence}")


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
    noise: NoiseSpec
    half_width: float  # at the plan's confidence level


@dataclass(frozen=True)
class QueryPlan:
    analysis: Analysis
    contribution: ContributionBound
    options: QueryOptions
    measurements: tuple[Measurement, ...]

    @property
    def cost(self) -> Cost:
        if not self.measurements:
            return Cost(0.0, 0.0)
        delta = self.options.delta if self.options.mechanism == "gaussian" else 0.0
        return Cost(self.options.epsilon, delta)


def contribution_bound(analysis: Analysis) -> ContributionBound:
    table = analysis.table
    if table.privacy_unit is None:
        return ContributionBound(None, 1, 1)
    # A unit cannot touch more groups than exist; with public keys that number is known.
    groups = min(table.max_groups_per_unit, analysis.group_count) if analysis.keys else 1
    return ContributionBound(table.privacy_unit, groups, table.max_rows_per_unit)


def statistic_sensitivity(statistic: Statistic, bound: ContributionBound, mechanism: Mechanism
                          ) -> float:
    rows = 1 if statistic.kind == "count_units" else bound.max_rows
    per_group = rows * statistic.row_contribution
    groups = bound.max_groups if mechanism == "laplace" else math.sqrt(bound.max_groups)
    return groups * per_group


def plan_query(analysis: Analysis, options: QueryOptions) -> QueryPlan:
    """Split the query's budget evenly over its statistics and calibrate each one's noise."""
    bound = contribution_bound(analysis)
    count = len(analysis.statistics)
    measurements = []
    for index, statistic in enumerate(analysis.statistics):
        sensitivity = statistic_sensitivity(statistic, bound, options.mechanism)
        epsilon = options.epsilon / count
        delta = options.delta / count if options.mechanism == "gaussian" else 0.0
        if sensitivity == 0:
            # A sum of a constant zero: nothing about any unit is in it. Noise it anyway at
            # the smallest grid so every output is produced the same way.
            sensitivity = 1.0
        noise = calibrate(options.mechanism, sensitivity, epsilon, delta,
                          integer_valued=statistic.integer_valued,
                          changed_outputs=bound.max_groups)
        measurements.append(Measurement(f"m{index}", statistic, sensitivity, noise,
                                        half_width(noise, options.confidence)))
    return QueryPlan(analysis, bound, options, tuple(measurements))
