"""Partition selection: release a group only when its noisy count of units clears a threshold.

When group keys are not public, which groups exist is itself private. Each
group's count of distinct privacy units gets noise; a group is released only
when that noisy count reaches a threshold T. A unit touches at most k groups
(`max_groups_per_unit`), so the vector of counts has L1 sensitivity k and L2
sensitivity √k; a group that exists only because of one unit (true count 1) is
released with probability at most δ' = 1 − (1 − δ)^{1/k}, hence at most δ for
all of that unit's k groups together.

The textbook thresholds (for continuous noise) are `laplace_threshold` and
`gaussian_threshold`. We draw *discrete* noise, whose tails are heavier (up to
2× for the discrete Laplace), so the threshold actually used is computed from
the exact tail of the discrete noise with the exact sampler parameter:

>>> round(laplace_threshold(1.0, 1e-5, 1), 1), round(laplace_threshold(1.0, 1e-5, 5), 1)
(11.8, 63.1)
>>> sigma, tau = gaussian_threshold(1.0, 1e-5, 5)
>>> round(sigma, 2), round(tau, 1)
(8.69, 42.3)
>>> plan_selection(1.0, 1e-5, 5).threshold >= 42
True

A query that releases COUNT(*) under Laplace noise can instead threshold that released
count (`count_selection`): its noise already covers every group's count, so selection
needs no ε of its own, only δ. A group held by one unit then counts up to
`max_rows_per_unit` rows rather than one unit, so the threshold starts there.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

from scipy.special import ndtri

from .errors import InvalidParameterValue
from .mechanisms import (
    Mechanism,
    NoiseSpec,
    calibrate,
    gaussian_sigma,
)


@dataclass(frozen=True)
class SelectionSpec:
    """How groups with private keys are selected, and what it costs."""

    mechanism: Mechanism
    epsilon: float
    delta: float  # all of it: threshold δ (and, for Gaussian, the noise's δ)
    max_groups: int  # k: groups one unit can touch
    noise: NoiseSpec  # noise on each group's count of distinct units
    threshold: int  # released iff unit count + noise >= threshold
    textbook_threshold: float  # the continuous-noise formula, for comparison
    min_units: int = 0  # an extra floor the policy or session asked for
    # None: the threshold applies to each group's own noisy count of distinct units. Else the
    # index of the plan's COUNT(*) measurement whose released noisy value is thresholded; it
    # pays for the noise, so `epsilon` is 0 here and only δ is selection's own.
    measurement: int | None = None
    unit_rows: int = 1  # the most one unit adds to the thresholded count of a group

    @property
    def counts_units(self) -> bool:
        """Whether the backend must compute each group's count of distinct units."""
        return self.measurement is None

    @property
    def rho(self) -> float | None:
        return self.noise.rho


def per_group_delta(delta: float, k: int) -> float:
    """δ' = 1 − (1 − δ)^{1/k}, computed without cancellation."""
    return -math.expm1(math.log1p(-delta) / k)


def laplace_threshold(epsilon: float, delta: float, k: int) -> float:
    """Textbook Laplace thresholding: b = k/ε, τ = 1 − b·ln(2δ')."""
    _check(epsilon, delta, k)
    return 1 - (k / epsilon) * math.log(2 * per_group_delta(delta, k))


def gaussian_threshold(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """Textbook Gaussian thresholding: δ split evenly between noise and threshold; σ from
    the analytic Gaussian at L2 sensitivity √k; τ = 1 − σ·Φ⁻¹(δ'). Returns (σ, τ)."""
    _check(epsilon, delta, k)
    sigma = gaussian_sigma(math.sqrt(k), epsilon, delta / 2)
    return sigma, 1 - sigma * float(ndtri(per_group_delta(delta / 2, k)))


def _check(epsilon: float, delta: float, k: int) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidParameterValue(f"partition selection needs epsilon > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise InvalidParameterValue(
            "partition selection needs delta > 0: the groups that exist are private",
            hint="SET dpproxy.delta = 1e-7, or group by columns with public_values or "
                 "public_range")
    if k < 1:
        raise InvalidParameterValue(f"max_groups_per_unit must be >= 1, got {k}")


def _discrete_laplace_threshold(spec: NoiseSpec, target: float) -> int:
    # P(Z >= m) = e^{-m/t} / (1 + e^{-1/t}) for integer m >= 1 (discrete Laplace, scale t)
    t = float(spec.grid_param)
    m = math.ceil(t * (-math.log(target) - math.log1p(math.exp(-1 / t))))
    return 1 + max(m, 1)


@functools.lru_cache(maxsize=64)
def _discrete_gaussian_tails(sigma_sq: float) -> tuple[tuple[float, ...], float]:
    """The unnormalized upper tails Σ_{x ≥ m} e^{−x²/2σ²} for m = 0 … 40σ + 2 (the mass
    beyond is below any δ), and the total mass. Computed once per σ²: the threshold search
    and every plan with the same noise read them instead of summing tens of thousands of
    terms again."""
    reach = math.ceil(40 * math.sqrt(sigma_sq)) + 2
    weights = [math.exp(-(x * x) / (2 * sigma_sq)) for x in range(reach + 1)]
    # summed from the far end: the small terms first, the most accurate order
    tails = tuple(itertools.accumulate(reversed(weights)))[::-1]
    return tails, weights[0] + 2 * tails[1]


def _discrete_gaussian_tail(sigma_sq: float, m: int) -> float:
    """P(Z >= m) for the discrete Gaussian, by summing the mass function."""
    tails, total = _discrete_gaussian_tails(sigma_sq)
    return tails[m] / total if m < len(tails) else 0.0


def _discrete_gaussian_threshold(spec: NoiseSpec, target: float) -> int:
    sigma_sq = float(spec.grid_param)
    m = max(1, math.floor(math.sqrt(sigma_sq) * -float(ndtri(target))) - 1)
    # a margin of 1e-9 relative covers the float error of the summed tail
    while _discrete_gaussian_tail(sigma_sq, m) > target * (1 - 1e-9):
        m += 1
    return 1 + m


def laplace_selection(epsilon: float, delta: float, k: int, min_units: int = 0
                      ) -> SelectionSpec:
    """Laplace thresholding: noise scale k/ε, all of δ for the threshold."""
    _check(epsilon, delta, k)
    noise = calibrate("laplace", float(k), epsilon, integer_valued=True, changed_outputs=k)
    return SelectionSpec("laplace", epsilon, delta, k, noise,
                         _discrete_laplace_threshold(noise, per_group_delta(delta, k)),
                         laplace_threshold(epsilon, delta, k), min_units)


def gaussian_selection(epsilon: float, delta: float, k: int, min_units: int = 0
                       ) -> SelectionSpec:
    """Gaussian thresholding: half of δ for the noise (L2 sensitivity √k), half for the
    threshold."""
    _check(epsilon, delta, k)
    noise = calibrate("gaussian", math.sqrt(k), epsilon, delta / 2, integer_valued=True,
                      changed_outputs=k)
    return SelectionSpec("gaussian", epsilon, delta, k, noise,
                         _discrete_gaussian_threshold(noise, per_group_delta(delta / 2, k)),
                         gaussian_threshold(epsilon, delta, k)[1], min_units)


def plan_selection(epsilon: float, delta: float, k: int, min_units: int = 0) -> SelectionSpec:
    """Calibrate both thresholding mechanisms and keep the one with the lower threshold."""
    return min(laplace_selection(epsilon, delta, k, min_units),
               gaussian_selection(epsilon, delta, k, min_units), key=lambda s: s.threshold)


def count_selection(noise: NoiseSpec, delta: float, k: int, max_rows: int, measurement: int
                    ) -> SelectionSpec:
    """Threshold the released COUNT(*) (Laplace `noise` over the vector of group counts, L1
    sensitivity k·max_rows): a group held by one unit counts at most `max_rows` rows, so
    T = max_rows − 1 + the units threshold for that noise, and P(max_rows + noise ≥ T) ≤ δ'
    per group, δ for a unit's k groups together.

    >>> from dpproxy.mechanisms import calibrate
    >>> noise = calibrate("laplace", 5.0, 1.0, integer_valued=True)
    >>> spec = count_selection(noise, 1e-6, 1, 5, 0)
    >>> spec.threshold, round(spec.textbook_threshold, 1)
    (72, 70.6)
    >>> single_unit_release_probability(spec) <= 1e-6
    True
    """
    if noise.mechanism != "laplace":
        raise ValueError("count selection thresholds a Laplace-noised count")
    _check(noise.epsilon, delta, k)
    if max_rows < 1:
        raise InvalidParameterValue(f"max_rows_per_unit must be >= 1, got {max_rows}")
    target = per_group_delta(delta, k)
    return SelectionSpec("laplace", 0.0, delta, k, noise,
                         max_rows - 1 + _discrete_laplace_threshold(noise, target),
                         max_rows - noise.scale * math.log(2 * target), 0, measurement,
                         max_rows)


def single_unit_release_probability(spec: SelectionSpec) -> float:
    """P(a group held by one unit is released) = P(unit_rows + noise >= T), from the exact
    tail."""
    # T >= unit_rows + 1, so the margin is >= 1
    return _upper_tail(spec, effective_threshold(spec) - spec.unit_rows)


def _upper_tail(spec: SelectionSpec, m: int) -> float:
    """P(noise >= m) for m >= 1."""
    if spec.mechanism == "laplace":
        t = float(spec.noise.grid_param)
        return math.exp(-m / t) / (1 + math.exp(-1 / t))
    return _discrete_gaussian_tail(float(spec.noise.grid_param), m)


def effective_threshold(spec: SelectionSpec) -> int:
    return max(spec.threshold, spec.min_units)
