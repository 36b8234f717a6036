"""Tests for dpproxy.mechanisms.

Statistical tests use fixed sample sizes and thresholds from distribution-free bounds, so
each has a stated false-failure probability <= 1e-7; there are 9 of them, so a correct
implementation fails this file with probability <= 9e-7 per run. Bounds used:

* DKW with Massart's constant: P(sup_x |F_n(x) - F(x)| > η) <= 2·exp(-2nη²). It holds for
  any F; for a discrete F the statistic is stochastically smaller than in the continuous
  case, so the bound stays valid.
* Hoeffding for a mean of [0, 1] variables: P(|p̂ - p| >= η) <= 2·exp(-2nη²).
* Bernstein for a mean of [0, M] variables with variance v:
  P(|Z̄ - EZ| >= η) <= 2·exp(-nη² / (2v + 2Mη/3)).
* The exact binomial tail (scipy.stats.binom.sf) for coverage counts.
"""

from __future__ import annotations

import doctest
import itertools
import math
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import logsumexp, ndtri
from scipy.stats import binom

from dpproxy import mechanisms as m
from dpproxy.errors import InvalidParameterValue
from dpproxy.mechanisms import (
    bernoulli_exp_neg,
    calibrate,
    classic_gaussian_sigma,
    discrete_gaussian_sigma,
    gaussian_delta,
    gaussian_sigma,
    half_width,
    laplace_scale,
    release,
    release_many,
    sample_discrete_gaussian,
    sample_discrete_laplace,
    zcdp_delta,
    zcdp_rho,
)

TEST_FAILURE_RATE = 1e-7  # per statistical test


# ----------------------------------------------------------------------------- helpers


def dkw_margin(n: int, failure: float) -> float:
    """η with 2·exp(-2nη²) = failure."""
    return math.sqrt(math.log(2 / failure) / (2 * n))


def hoeffding_margin(n: int, failure: float) -> float:
    """Two-sided η for a mean of n variables in [0, 1]: 2·exp(-2nη²) = failure."""
    return math.sqrt(math.log(2 / failure) / (2 * n))


def bernstein_margin(n: int, variance: float, bound: float, failure: float) -> float:
    """η solving n·η² = L·(2v + 2Mη/3) with L = ln(2/failure) (the Bernstein bound)."""
    big_l = math.log(2 / failure)
    b = 2 * bound * big_l / 3
    return (b + math.sqrt(b * b + 8 * n * big_l * variance)) / (2 * n)


def ks_statistic(samples: list[int], cdf: Callable[[np.ndarray], np.ndarray]) -> float:
    """sup_x |F_n(x) - F(x)| for integer samples and an integer-supported CDF.

    Both functions are constant on [k, k+1), so the sup is attained at an integer; between
    consecutive distinct sample values u < v, F_n is constant and F is monotone, so
    checking k = u and k = v - 1 (and min - 1) covers every integer.
    """
    xs = np.sort(np.asarray(samples, dtype=np.int64))
    uniq = np.unique(xs)
    points = np.union1d(uniq, uniq - 1)
    empirical = np.searchsorted(xs, points, side="right") / len(xs)
    return float(np.max(np.abs(empirical - cdf(points))))


def laplace_cdf(t: float) -> Callable[[np.ndarray], np.ndarray]:
    """Exact CDF of P(x) ∝ exp(-|x|/t): 1 - a^(k+1)/(1+a) for k >= 0, a^(-k)/(1+a) else."""
    a = math.exp(-1 / t)

    def cdf(k: np.ndarray) -> np.ndarray:
        k = k.astype(np.float64)
        upper = 1 - np.exp(-(np.maximum(k, 0) + 1) / t) / (1 + a)
        lower = np.exp(np.minimum(k, 0) / t) / (1 + a)
        return np.where(k >= 0, upper, lower)

    return cdf


def laplace_pmf(t: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the discrete Laplace, truncated where the mass is < e^-80."""
    half = math.ceil(80 * t) + 2
    x = np.arange(-half, half + 1)
    logw = -np.abs(x) / t
    return x, np.exp(logw - logsumexp(logw))


def gaussian_pmf(sigma_sq: float) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of the discrete Gaussian over ±(40σ + 2); the rest is < e^-800."""
    half = math.ceil(40 * math.sqrt(sigma_sq)) + 2
    x = np.arange(-half, half + 1)
    logw = -(x.astype(np.float64) ** 2) / (2 * sigma_sq)
    return x, np.exp(logw - logsumexp(logw))


def table_cdf(x: np.ndarray, pmf: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    cum = np.cumsum(pmf)
    cum = cum / cum[-1]
    lo, hi = int(x[0]), int(x[-1])

    def cdf(k: np.ndarray) -> np.ndarray:
        out = cum[np.clip(k - lo, 0, hi - lo)]
        return np.where(k < lo, 0.0, np.where(k >= hi, 1.0, out))

    return cdf


def discrete_gaussian_delta_1d(shift: int, epsilon: float, sigma: float) -> float:
    """Exact δ at ε of discrete Gaussian noise on a scalar integer query moved by `shift`.

    δ = Σ_x max(0, P(x) - e^ε P(x - shift)): the hockey-stick divergence (CKS20).
    """
    half = math.ceil(60 * sigma) + shift + 10
    x = np.arange(-half, half + 1).astype(np.float64)
    lognorm = logsumexp(-(x**2) / (2 * sigma**2))
    diff = np.exp(-(x**2) / (2 * sigma**2) - lognorm) - np.exp(
        epsilon - (x - shift) ** 2 / (2 * sigma**2) - lognorm)
    return float(diff[diff > 0].sum())


# ----------------------------------------------------------------------- exact samplers


def test_bernoulli_exp_neg_frequencies() -> None:
    """Success frequencies match exp(-γ) for γ in {1/3, 1, 5/2, 7}.

    n = 40000 per γ; Hoeffding two-sided with failure 1e-7/4 per γ gives
    η = sqrt(ln(8e7)/80000) ≈ 0.0151. False-failure rate <= 1e-7.
    """
    n = 40000
    gammas = [Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(7)]
    eta = hoeffding_margin(n, TEST_FAILURE_RATE / len(gammas))
    for gamma in gammas:
        hits = sum(bernoulli_exp_neg(gamma) for _ in range(n))
        assert abs(hits / n - math.exp(-gamma)) <= eta, (gamma, hits / n)


def test_bernoulli_exp_neg_zero_is_certain() -> None:
    """exp(-0) = 1 exactly: every draw succeeds (deterministic)."""
    assert all(bernoulli_exp_neg(Fraction(0)) for _ in range(1000))


@pytest.mark.parametrize("draw", [sample_discrete_laplace, sample_discrete_gaussian])
def test_samplers_return_python_ints(draw: Callable[[Fraction], int]) -> None:
    """Noise is integer-valued (deterministic)."""
    assert all(type(draw(Fraction(5, 2))) is int for _ in range(200))


def test_discrete_laplace_distribution() -> None:
    """DKW test against the exact discrete Laplace CDF for scales 0.7, 3, 40, 12345678/7.

    n = 50000 per scale, η = sqrt(ln(2/(2.5e-8))/(2n)) ≈ 0.0135 (1e-7 split over the
    four scales by a union bound). False-failure rate <= 1e-7.
    """
    n = 50000
    scales = [Fraction(7, 10), Fraction(3), Fraction(40), Fraction(12345678, 7)]
    eta = dkw_margin(n, TEST_FAILURE_RATE / len(scales))
    for scale in scales:
        draws = [sample_discrete_laplace(scale) for _ in range(n)]
        stat = ks_statistic(draws, laplace_cdf(float(scale)))
        assert stat <= eta, (scale, stat, eta)


def test_discrete_gaussian_distribution() -> None:
    """DKW test against the exact discrete Gaussian CDF for σ² = 1, 10, 500.

    The pmf is normalised over ±(40σ + 2). n = 50000 per σ², η = sqrt(ln(6e7)/(2n))
    ≈ 0.0134 (union bound over three). False-failure rate <= 1e-7.
    """
    n = 50000
    variances = [Fraction(1), Fraction(10), Fraction(500)]
    eta = dkw_margin(n, TEST_FAILURE_RATE / len(variances))
    for sigma_sq in variances:
        draws = [sample_discrete_gaussian(sigma_sq) for _ in range(n)]
        stat = ks_statistic(draws, table_cdf(*gaussian_pmf(float(sigma_sq))))
        assert stat <= eta, (sigma_sq, stat, eta)


def _check_truncated_second_moment(draws: list[int], x: np.ndarray, pmf: np.ndarray,
                                   failure: float) -> None:
    """Z = min(X², M) with M = 9·Var X lies in [0, M]; compare its mean by Bernstein."""
    var = float(np.sum(pmf * x.astype(np.float64) ** 2))
    bound = 9 * var
    z = np.minimum(x.astype(np.float64) ** 2, bound)
    mean_z = float(np.sum(pmf * z))
    var_z = float(np.sum(pmf * (z - mean_z) ** 2))
    eta = bernstein_margin(len(draws), var_z, bound, failure)
    sample = np.minimum(np.asarray(draws, dtype=np.float64) ** 2, bound)
    assert abs(float(sample.mean()) - mean_z) <= eta, (var, sample.mean(), mean_z, eta)
    # The margin is tight enough to catch a 10% error in the noise scale (~20% in Z).
    assert eta < 0.08 * mean_z


def test_discrete_laplace_scale() -> None:
    """The spread is right: E[min(X², 9·Var X)] for scales 3 and 40 vs its exact value.

    Bernstein with the exact Var Z from the pmf, n = 50000, failure 5e-8 per scale (the
    margin is ≈ 5% of E Z). False-failure rate <= 1e-7.
    """
    for scale in (3, 40):
        draws = [sample_discrete_laplace(Fraction(scale)) for _ in range(50000)]
        _check_truncated_second_moment(draws, *laplace_pmf(scale), TEST_FAILURE_RATE / 2)


def test_discrete_gaussian_scale() -> None:
    """The spread is right: E[min(X², 9·Var X)] for σ² = 10 and 500 vs its exact value.

    Bernstein with the exact Var Z from the pmf, n = 50000, failure 5e-8 per σ².
    False-failure rate <= 1e-7.
    """
    for sigma_sq in (10, 500):
        draws = [sample_discrete_gaussian(Fraction(sigma_sq)) for _ in range(50000)]
        _check_truncated_second_moment(draws, *gaussian_pmf(sigma_sq), TEST_FAILURE_RATE / 2)


def test_sampler_speed() -> None:
    """Print mean µs/draw (no timing assertion); the draws themselves must be ints."""
    for name, draw, params in [
        ("laplace scale", sample_discrete_laplace, [1, 1000, 10**7]),
        ("gaussian sigma", sample_discrete_gaussian, [1, 1000, 10**7]),
    ]:
        for p in params:
            arg = Fraction(p) if draw is sample_discrete_laplace else Fraction(p) ** 2
            n = 3000
            start = time.perf_counter()
            out = [draw(arg) for _ in range(n)]
            micros = (time.perf_counter() - start) / n * 1e6
            print(f"{name}={p:g}: {micros:.1f} µs/draw")
            assert all(type(v) is int for v in out)


def test_module_uses_no_insecure_randomness() -> None:
    """Only `secrets` supplies randomness (a guard against a future edit)."""
    assert not hasattr(m, "random") and not hasattr(m, "np") and not hasattr(m, "numpy")
    assert m.secrets.__name__ == "secrets"


# -------------------------------------------------------------------------- calibration


def test_laplace_scale() -> None:
    assert laplace_scale(2.0, 0.5) == 4.0


def test_analytic_gaussian_worked_value() -> None:
    """σ(Δ=1, ε=1, δ=1e-5) ≈ 3.73; it is the smallest: δ(σ) <= δ < δ(0.99σ)."""
    sigma = gaussian_sigma(1.0, 1.0, 1e-5)
    assert sigma == pytest.approx(3.73, rel=0.01)
    assert gaussian_delta(1.0, 1.0, sigma) <= 1e-5
    assert gaussian_delta(1.0, 1.0, 0.99 * sigma) > 1e-5
    assert classic_gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(4.85, rel=0.01)


@pytest.mark.parametrize("delta", [0.1, 1e-5, 1e-12, 1e-300])
@pytest.mark.parametrize("epsilon", [0.01, 0.5, 1.0, 4.0])
def test_analytic_gaussian_is_tight_and_safe(epsilon: float, delta: float) -> None:
    sigma = gaussian_sigma(2.0, epsilon, delta)
    assert gaussian_delta(2.0, epsilon, sigma) <= delta
    assert gaussian_delta(2.0, epsilon, sigma * (1 - 1e-9)) > delta * (1 - 1e-6)
    if epsilon < 1:
        assert classic_gaussian_sigma(2.0, epsilon, delta) > sigma


def test_gaussian_sigma_monotone_and_linear() -> None:
    """σ decreases in ε and δ and scales linearly with Δ."""
    eps_grid = [0.05, 0.1, 0.5, 1, 2, 5]
    sig = [gaussian_sigma(1.0, e, 1e-6) for e in eps_grid]
    assert all(a > b for a, b in itertools.pairwise(sig))
    sig = [gaussian_sigma(1.0, 1.0, d) for d in [1e-12, 1e-9, 1e-6, 1e-3, 0.1]]
    assert all(a > b for a, b in itertools.pairwise(sig))
    assert gaussian_sigma(3.0, 0.7, 1e-7) == pytest.approx(3 * gaussian_sigma(1.0, 0.7, 1e-7),
                                                          rel=1e-9)


def test_zcdp_delta_matches_brute_force() -> None:
    """zcdp_delta is the minimum over α of CKS20's bound (checked on a dense α grid)."""
    alpha = 1 + np.logspace(-8, 6, 200001)
    for rho, eps in [(0.025, 1.0), (0.5, 0.1), (0.001, 1.0), (3.0, 2.0)]:
        brute = np.exp(np.min((alpha - 1) * (alpha * rho - eps)
                              + alpha * np.log1p(-1 / alpha) - np.log(alpha - 1)))
        best = min(1.0, float(brute))
        assert best * (1 - 1e-5) <= zcdp_delta(rho, eps) <= best * (1 + 1e-9)


def test_analytic_sigma_is_not_enough_for_discrete_noise() -> None:
    """Why calibrate() does not use gaussian_sigma: the discrete curve can lie above."""
    sigma = gaussian_sigma(1.0, 1.0, 1e-5)
    assert discrete_gaussian_delta_1d(1, 1.0, sigma) > 1.02e-5


@pytest.mark.parametrize("delta", [0.1, 1e-3, 1e-5, 1e-9, 1e-14])
@pytest.mark.parametrize("epsilon", [0.05, 0.3, 1.0, 3.0, 8.0])
def test_discrete_gaussian_sigma_is_safe(epsilon: float, delta: float) -> None:
    """At the σ calibrate() uses, the exact 1-D discrete δ (shifts 1..3) is <= δ."""
    for shift in (1, 2, 3):
        sigma = discrete_gaussian_sigma(float(shift), epsilon, delta)
        assert sigma >= gaussian_sigma(float(shift), epsilon, delta)
        assert discrete_gaussian_delta_1d(shift, epsilon, sigma) <= delta
        assert zcdp_delta(zcdp_rho(float(shift), sigma), epsilon) <= delta


def test_calibrate_laplace_integer() -> None:
    spec = calibrate("laplace", 2.5, 0.5, integer_valued=True)
    assert (spec.mechanism, spec.granularity, spec.delta, spec.rho) == ("laplace", 1.0, 0.0, None)
    assert spec.scale == 6.0  # ceil(2.5) / 0.5
    assert spec.grid_param == Fraction(6)


@pytest.mark.parametrize("sensitivity", [1e-9, 0.3, 1.0, 1.5, 1000.0, 3e12])
@pytest.mark.parametrize("changed", [1, 7])
def test_calibrate_laplace_real_grid(sensitivity: float, changed: int) -> None:
    """γ = 2**(⌊log2 Δ⌋ - 20); grid L1 = ⌈Δ/γ⌉ + 3·changed; noise never below asked."""
    eps = 0.3
    spec = calibrate("laplace", sensitivity, eps, integer_valued=False, changed_outputs=changed)
    gamma = 2.0 ** (math.floor(math.log2(sensitivity)) - 20)
    assert spec.granularity == gamma
    grid_l1 = math.ceil(sensitivity / gamma) + 3 * changed  # snap, fixed point, double
    assert spec.grid_sensitivity == grid_l1
    assert spec.grid_param >= Fraction(grid_l1) / Fraction(eps)
    assert spec.grid_param <= Fraction(grid_l1) / Fraction(eps) * (1 + Fraction(1, 2**46))
    assert sensitivity / eps <= spec.scale <= sensitivity / eps * (1 + 4.1e-6 * changed)


@pytest.mark.parametrize("integer_valued", [True, False])
def test_calibrate_gaussian(integer_valued: bool) -> None:
    spec = calibrate("gaussian", 1.5, 0.8, 1e-6, integer_valued=integer_valued,
                     changed_outputs=4)
    gamma = spec.granularity
    grid_l2 = 1.5 if integer_valued else 1.5 / gamma + 3 * 2.0
    assert spec.grid_sensitivity == pytest.approx(grid_l2, rel=1e-15)
    assert spec.grid_sensitivity >= grid_l2
    sigma = discrete_gaussian_sigma(spec.grid_sensitivity, 0.8, 1e-6)
    assert spec.grid_param >= Fraction(sigma) ** 2
    assert spec.scale == pytest.approx(gamma * sigma, rel=1e-12)
    assert spec.rho == pytest.approx(spec.grid_sensitivity**2 / (2 * sigma**2), rel=1e-12)
    assert zcdp_delta(spec.rho, 0.8) <= 1e-6
    assert spec.scale >= gaussian_sigma(1.5, 0.8, 1e-6)


# ------------------------------------------------------------------------------ release


def test_release_integer_outputs_are_python_ints() -> None:
    spec = calibrate("laplace", 1.0, 1.0, integer_valued=True)
    for exact in (41, 41.0, np.int64(41), 10**30):
        out = release(exact, spec)
        assert type(out) is int
    assert abs(release(10**30, spec) - 10**30) < 10**6  # no float rounding of big ints
    gspec = calibrate("gaussian", 1.0, 1.0, 1e-6, integer_valued=True)
    assert all(type(v) is int for v in release_many([1, 2.0, 3], gspec))


@pytest.mark.parametrize("mechanism,delta", [("laplace", 0.0), ("gaussian", 1e-6)])
def test_release_real_outputs_are_grid_multiples(mechanism: m.Mechanism, delta: float) -> None:
    spec = calibrate(mechanism, 0.37, 1.0, delta, integer_valued=False, changed_outputs=2)
    outs = release_many([123.456, -0.001, 0.0, 1e6], spec)
    assert len(outs) == 4
    for out in outs:
        assert type(out) is float
        assert (out / spec.granularity).is_integer()


def test_release_laplace_integer_noise_distribution() -> None:
    """release() - exact with Δ = 1, ε = 0.5 is discrete Laplace of scale 2 (DKW).

    n = 20000, η = sqrt(ln(2e7)/(2n)) ≈ 0.0205. False-failure rate <= 1e-7.
    """
    spec = calibrate("laplace", 1.0, 0.5, integer_valued=True)
    n = 20000
    noise = [release(1000, spec) - 1000 for _ in range(n)]
    assert ks_statistic(noise, laplace_cdf(2.0)) <= dkw_margin(n, TEST_FAILURE_RATE)


def test_release_laplace_real_noise_distribution() -> None:
    """Real-valued release: (out - snapped)/γ is discrete Laplace with the grid scale (DKW).

    Also the spread in output units is ≈ Δ/ε. n = 20000, η ≈ 0.0205. Failure <= 1e-7.
    """
    spec = calibrate("laplace", 0.75, 1.5, integer_valued=False)
    gamma = spec.granularity
    exact = 123.456
    snapped = round(exact / gamma)
    n = 20000
    noise = [round(release(exact, spec) / gamma) - snapped for _ in range(n)]
    t = float(spec.grid_param)
    assert t * gamma == pytest.approx(0.75 / 1.5, rel=3e-6)
    assert ks_statistic(noise, laplace_cdf(t)) <= dkw_margin(n, TEST_FAILURE_RATE)


def test_release_gaussian_noise_distribution() -> None:
    """Integer Gaussian release - exact is discrete Gaussian with σ² = grid_param (DKW).

    n = 20000, η ≈ 0.0205. False-failure rate <= 1e-7.
    """
    spec = calibrate("gaussian", 1.0, 1.0, 1e-5, integer_valued=True)
    n = 20000
    noise = [release(-7, spec) + 7 for _ in range(n)]
    cdf = table_cdf(*gaussian_pmf(float(spec.grid_param)))
    assert ks_statistic(noise, cdf) <= dkw_margin(n, TEST_FAILURE_RATE)


@pytest.mark.parametrize("mechanism,delta", [("laplace", 0.0), ("gaussian", 1e-5)])
def test_release_many_draws_each_coordinate_afresh(mechanism: m.Mechanism, delta: float
                                                   ) -> None:
    """release_many (one sampler for the whole vector) adds, to every coordinate, noise of
    the spec's distribution (DKW), and the coordinates' noises are not all equal.

    n = 20000 coordinates, η ≈ 0.0205; the all-equal check fails with probability far
    below 1e-100. False-failure rate <= 1e-7.
    """
    spec = calibrate(mechanism, 1.0, 1.0, delta, integer_valued=True)
    n = 20000
    noise = [out - 5 for out in release_many([5] * n, spec)]
    cdf = laplace_cdf(float(spec.grid_param)) if mechanism == "laplace" \
        else table_cdf(*gaussian_pmf(float(spec.grid_param)))
    assert ks_statistic(noise, cdf) <= dkw_margin(n, TEST_FAILURE_RATE)
    assert len(set(noise)) > 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e308])
def test_release_rejects_non_finite(bad: float) -> None:
    spec = calibrate("laplace", 1e-6, 1.0, integer_valued=False)
    with pytest.raises(InvalidParameterValue):
        release(bad, spec)
    with pytest.raises(InvalidParameterValue):
        release_many([1.0, bad], spec)


# ---------------------------------------------------------------------------- half_width


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.999])
@pytest.mark.parametrize("eps", [0.1, 1.0, 7.0])
def test_half_width_laplace_is_exact(confidence: float, eps: float) -> None:
    """h/γ = k is the smallest k with P(|X| > k) = 2a^(k+1)/(1+a) <= 1 - c."""
    spec = calibrate("laplace", 1.0, eps, integer_valued=True)
    k = half_width(spec, confidence)
    assert k == int(k)
    t = float(spec.grid_param)
    a = math.exp(-1 / t)

    def tail(j: float) -> float:
        return 2 * a ** (j + 1) / (1 + a)

    assert tail(k) <= 1 - confidence
    assert k == 0 or tail(k - 1) > 1 - confidence


@pytest.mark.parametrize("confidence", [0.5, 0.95, 0.999])
@pytest.mark.parametrize("sigma_eps", [0.2, 1.0, 5.0])
def test_half_width_gaussian_is_conservative(confidence: float, sigma_eps: float) -> None:
    """The exact discrete tail beyond h is <= 1 - c, and h is at most 1 step over z·σ."""
    spec = calibrate("gaussian", 1.0, sigma_eps, 1e-5, integer_valued=True)
    k = int(half_width(spec, confidence))
    x, pmf = gaussian_pmf(float(spec.grid_param))
    assert float(pmf[np.abs(x) > k].sum()) <= 1 - confidence
    z = float(-ndtri((1 - confidence) / 2))
    assert k <= z * math.sqrt(spec.grid_param) + 1


def test_half_width_real_grid_in_output_units() -> None:
    spec = calibrate("laplace", 0.75, 1.5, integer_valued=False)
    h = half_width(spec, 0.95)
    assert (h / spec.granularity).is_integer()
    assert h == pytest.approx(0.5 * math.log(1 / 0.05), rel=1e-4)  # b·ln(1/α) for Laplace


def test_half_width_coverage() -> None:
    """Fraction of released noise outside ±h is <= 1 - c up to a binomial-tail margin.

    Three checks (Laplace c = 0.5 and 0.95 with real-valued grid, Gaussian c = 0.95 with
    integers), n = 30000 each. Since the true outside probability p is <= α = 1 - c,
    the count is stochastically below Bin(n, α); the threshold is the smallest c* with
    P(Bin(n, α) > c*) <= 1e-7/3. False-failure rate <= 1e-7.
    """
    n = 30000
    cases = [
        (calibrate("laplace", 0.75, 1.5, integer_valued=False), 0.5),
        (calibrate("laplace", 0.75, 1.5, integer_valued=False), 0.95),
        (calibrate("gaussian", 1.0, 1.0, 1e-5, integer_valued=True), 0.95),
    ]
    for spec, confidence in cases:
        alpha = 1 - confidence
        threshold = int(binom.isf(TEST_FAILURE_RATE / len(cases), n, alpha))
        while binom.sf(threshold, n, alpha) > TEST_FAILURE_RATE / len(cases):
            threshold += 1
        h = half_width(spec, confidence)
        outside = sum(abs(release(0.0, spec)) > h for _ in range(n))
        assert outside <= threshold, (spec.mechanism, confidence, outside, threshold)


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("call", [
    lambda: calibrate("cauchy", 1.0, 1.0, integer_valued=True),  # type: ignore[arg-type]
    lambda: calibrate("laplace", 0.0, 1.0, integer_valued=True),
    lambda: calibrate("laplace", -1.0, 1.0, integer_valued=True),
    lambda: calibrate("laplace", math.inf, 1.0, integer_valued=True),
    lambda: calibrate("laplace", 1.0, 0.0, integer_valued=True),
    lambda: calibrate("laplace", 1.0, math.nan, integer_valued=True),
    lambda: calibrate("laplace", 1.0, math.inf, integer_valued=True),
    lambda: calibrate("laplace", 1.0, 1.0, 1e-6, integer_valued=True),
    lambda: calibrate("gaussian", 1.0, 1.0, 0.0, integer_valued=True),
    lambda: calibrate("gaussian", 1.0, 1.0, 1.0, integer_valued=True),
    lambda: calibrate("gaussian", 1.0, 1.0, math.nan, integer_valued=True),
    lambda: calibrate("laplace", 1.0, 1.0, integer_valued=False, changed_outputs=0),
    lambda: calibrate("laplace", 1.0, 1.0, integer_valued=False, changed_outputs=1.5),
    lambda: half_width(calibrate("laplace", 1.0, 1.0, integer_valued=True), 1.0),
    lambda: half_width(calibrate("laplace", 1.0, 1.0, integer_valued=True), 0.0),
    lambda: gaussian_sigma(1.0, -1.0, 1e-5),
    lambda: gaussian_sigma(1.0, 1.0, 2.0),
    lambda: classic_gaussian_sigma(1.0, 1.0, 0.0),
    lambda: laplace_scale(0.0, 1.0),
    lambda: zcdp_rho(1.0, 0.0),
    lambda: zcdp_delta(-1.0, 1.0),
    lambda: bernoulli_exp_neg(Fraction(-1, 2)),
    lambda: sample_discrete_laplace(Fraction(0)),
    lambda: sample_discrete_gaussian(Fraction(-1)),
])
def test_invalid_arguments_raise(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidParameterValue):
        call()


def test_error_messages_say_what_is_allowed() -> None:
    with pytest.raises(InvalidParameterValue, match="strictly between 0 and 1"):
        calibrate("gaussian", 1.0, 1.0, 0.0, integer_valued=True)
    with pytest.raises(InvalidParameterValue, match="> 0"):
        calibrate("laplace", 1.0, -2.0, integer_valued=True)


def test_doctests() -> None:
    result = doctest.testmod(m)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("integer_valued", [True, False])
def test_an_epsilon_too_small_to_draw_is_refused(integer_valued: bool) -> None:
    """ε = 1e-30 once sent the half-width's search into a loop that never ended (the
    float form of (k + 1)/t stopped changing): calibration refuses Laplace noise wider
    than MAX_GRID_SCALE steps, and just within it the half-width is found. (The discrete
    Gaussian's σ, held by δ, stays far narrower: it is answered.)"""
    # a subnormal ε, whose scale no float holds, is refused alike (it raised an
    # OverflowError while the message was written: an internal error on the wire)
    for tiny in (1e-30, 1e-320):
        with pytest.raises(InvalidParameterValue, match="too small"):
            calibrate("laplace", 1.0, tiny, integer_valued=integer_valued)
    widest = 1e-14 if integer_valued else 1e-8
    spec = calibrate("laplace", 1.0, widest, integer_valued=integer_valued)
    assert spec.grid_param <= m.MAX_GRID_SCALE
    assert half_width(spec) > spec.scale
    gaussian = calibrate("gaussian", 1.0, 1e-30, 1e-6, integer_valued=integer_valued)
    assert gaussian.grid_param <= m.MAX_GRID_SCALE ** 2 and half_width(gaussian) > 0


def test_the_half_width_search_ends_for_any_spec() -> None:
    """A spec made by hand, beyond calibrate's limit, still gets an answer: the search's
    steps are capped."""
    spec = m.NoiseSpec("laplace", 1.0, 1e-30, 0.0, 1.0, 1e30, None, 1.0, Fraction(10 ** 30))
    assert half_width(spec) > 1e30
