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

import math
from dataclasses import dataclass

from .accountant import Cost, Loss
from .analyze import Analysis
from .analyze.aggregates import Statistic
from .errors import InvalidParameterValue
from .mechanisms import Mechanism, NoiseSpec, calibrate, half_width
from .quantiles import QuantileSpec, binning_for
from .selection import SelectionSpec, plan_selection


@dataclass(frozen=True)
class QueryOptions:
    """Per-query privacy parameters: session options, else the policy's defaults."""

    epsilon: float
    delta: float
    mechanism: Mechanism
    confidence: float = 0.95
    min_units_per_group: int = 0  # extra floor for partition selection

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
        if self.min_units_per_group < 0 or self.min_units_per_group != int(
                self.min_units_per_group):
            raise InvalidParameterValue(
                f"min_units_per_group must be a non-negative integer, got "
                f"{self.min_units_per_group}")


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
    def reads_data(self) -> bool:
        return bool(self.measurements) or self.selection is not None

    @property
    def cost(self) -> Cost:
        if self.selection is None and not any(m.private for m in self.measurements):
            return Cost(0.0, 0.0)  # nothing noised: reads no data, or only exact statistics
        uses_delta = self.options.mechanism == "gaussian" or self.selection is not None
        return Cost(self.options.epsilon, self.options.delta if uses_delta else 0.0)

    @property
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


def plan_query(analysis: Analysis, options: QueryOptions) -> QueryPlan:
    """Split the query's budget evenly over its statistics (and partition selection, when
    group keys are private) and calibrate each one's noise."""
    bound = contribution_bound(analysis)
    selecting = not analysis.public_groups
    shares = sum(not s.exact for s in analysis.statistics) + (1 if selecting else 0)
    measurements = []
    for index, statistic in enumerate(analysis.statistics):
        if statistic.exact:  # already private (local DP): computed, not noised, not charged
            measurements.append(Measurement(f"m{index}", statistic, 0.0, None, 0.0))
            continue
        epsilon = options.epsilon / shares
        if statistic.kind == "quantile":
            assert statistic.quantile is not None
            spec = QuantileSpec(statistic.quantile, epsilon, bound.max_groups, bound.max_rows,
                                binning_for(statistic.lower, statistic.upper,
                                            statistic.integer_valued))
            measurements.append(Measurement(f"m{index}", statistic, spec.utility_sensitivity,
                                            None, 0.0, spec))
            continue
        sensitivity = statistic_sensitivity(statistic, bound, options.mechanism)
        delta = options.delta / shares if options.mechanism == "gaussian" else 0.0
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
    if selecting:
        # Under Laplace noise all of δ goes to selection; under Gaussian, one share.
        delta = options.delta / shares if options.mechanism == "gaussian" else options.delta
        selection = plan_selection(options.epsilon / shares, delta, bound.max_groups,
                                   int(options.min_units_per_group))
    return QueryPlan(analysis, bound, options, tuple(measurements), selection)
