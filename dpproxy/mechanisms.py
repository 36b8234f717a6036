"""Noise that is safe to deploy: exact discrete samplers and their calibration.

Every released value is ``γ · (round(v/γ) + Z)`` where ``Z`` is an integer drawn by an exact
sampler (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
Algorithms 1-3). The samplers use only integer arithmetic and the OS's CSPRNG
(`secrets`), so no floating-point artefact can leak the exact value (Mironov 2012).

Parameters arrive as floats; they are turned into fractions by rounding *up* to 48
significant bits (`_round_up`), so the noise is never smaller than calibrated and the
integers stay small enough to be fast.

>>> spec = calibrate("laplace", 1.0, 0.5, integer_valued=True)
>>> (spec.granularity, spec.scale, spec.delta, spec.rho)
(1.0, 2.0, 0.0, None)
>>> isinstance(release(41, spec), int)
True
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal

from scipy.special import log_ndtr, ndtri

from dpproxy import batch_noise
from dpproxy.errors import InvalidParameterValue

if TYPE_CHECKING:  # numpy arrays come from dpproxy.batch_noise; no numpy randomness here
    import numpy as np

__all__ = [
    "Mechanism",
    "NoiseSpec",
    "bernoulli_exp_neg",
    "calibrate",
    "classic_gaussian_sigma",
    "discrete_gaussian_sigma",
    "gaussian_delta",
    "gaussian_sigma",
    "half_width",
    "laplace_scale",
    "release",
    "release_array",
    "release_many",
    "release_reaching",
    "release_vectors",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]

Mechanism = Literal["laplace", "gaussian"]

# Significant bits kept when a float parameter becomes a Fraction (rounded up).
_PARAM_BITS = 48
# Grid step for real-valued outputs is 2**(floor(log2 Δ) - _GRID_BITS): each changed output
# may move _REAL_STEPS grid steps beyond Δ, a relative ~3·2**-20 ≈ 3e-6 on top of it: one
# for snapping; one for the backend's fixed-point rounding (round(v · 2^k) per row and per
# pair, below 2^-30·Δ for max_rows under 2^18: `Statistic.fixed_point_bits`); one for the
# single rounding of the exact integer sum to a double (2^-53 of it: below a step up to
# 2^32 rows).
_GRID_BITS = 20
_REAL_STEPS = 3
# The widest noise drawn, in grid steps (Laplace's scale, the Gaussian's σ): beyond it an
# answer is noise alone, and the half-width's float arithmetic would stop telling k from
# k + 1 (its search would never end). A count reaches it at ε ≈ 3.6e-15, a real-valued
# sum (2^20 steps of sensitivity) at ε ≈ 3.7e-9.
MAX_GRID_SCALE = 2 ** 48
# From this many values on, dpproxy.batch_noise draws the noise: its fixed cost (about a
# hundred numpy calls) is that of this many scalar draws (measured: 48-64).
_VECTOR_MIN = 56


# --------------------------------------------------------------------------- exact samplers


RandBelow = Callable[[int], int]  # uniform on [0, n): secrets.randbelow or _Entropy.randbelow


class _Entropy:
    """Uniform integers from the OS's CSPRNG, its bytes fetched a block at a time: one
    system call for many draws instead of one per draw. randbelow(n) is secrets.randbelow's
    algorithm (the bit length of n − 1 in random bits, redrawn while >= n) on disjoint
    slices of uniform random bytes. Each instance serves one release call and is dropped
    with its unused bytes, so no byte is shared between threads or survives a fork."""

    __slots__ = ("_buffer", "_position")

    def __init__(self) -> None:
        self._buffer = b""
        self._position = 0

    def randbelow(self, n: int) -> int:
        bits = (n - 1).bit_length()
        if bits == 0:
            return 0
        size = (bits + 7) >> 3
        shift = (size << 3) - bits
        while True:
            start = self._position
            end = start + size
            if end > len(self._buffer):
                self._buffer = secrets.token_bytes(max(_ENTROPY_BLOCK, size))
                start, end = 0, size
            self._position = end
            value = int.from_bytes(self._buffer[start:end], "little") >> shift
            if value < n:
                return value


_ENTROPY_BLOCK = 256  # bytes: a few dozen scalar draws


def _bern_exp_neg_unit(n: int, d: int, randbelow: RandBelow = secrets.randbelow) -> bool:
    """Bernoulli(exp(-n/d)) for 0 <= n <= d (CKS20 Algorithm 1, von Neumann's trick)."""
    if n == 0:
        return True  # the first round, randbelow(d) < 0, always fails
    # Each round is Bernoulli(n / (d·k)); the number of rounds survived decides the parity.
    # With d = 1 (so n = 1) the first round, randbelow(1) < 1, always succeeds: skipping
    # its draw (which would cost two random bits on average) changes no outcome.
    k = 2 if d == 1 else 1
    while randbelow(d * k) < n:
        k += 1
    return k % 2 == 1


def _bern_exp_neg(n: int, d: int, randbelow: RandBelow = secrets.randbelow) -> bool:
    """Bernoulli(exp(-n/d)) for n >= 0, d >= 1, as a product of unit-sized pieces."""
    whole, rest = divmod(n, d)
    for _ in range(whole):
        # exp(-γ) = exp(-1)^⌊γ⌋ · exp(-(γ-⌊γ⌋)); stop at the first failure.
        if not _bern_exp_neg_unit(1, 1, randbelow):
            return False
    return _bern_exp_neg_unit(rest, d, randbelow)


def bernoulli_exp_neg(gamma: Fraction) -> bool:
    """One exact draw of Bernoulli(exp(-gamma)) for rational gamma >= 0.

    >>> bernoulli_exp_neg(Fraction(0))
    True
    """
    gamma = Fraction(gamma)
    if gamma < 0:
        raise InvalidParameterValue(f"gamma must be >= 0, got {gamma}")
    return _bern_exp_neg(gamma.numerator, gamma.denominator)


def _discrete_laplace(t: int, s: int, randbelow: RandBelow = secrets.randbelow) -> int:
    """Discrete Laplace with scale t/s, P(x) ∝ exp(-|x|·s/t) (CKS20 Algorithm 2)."""
    while True:
        u = randbelow(t)
        if not _bern_exp_neg_unit(u, t, randbelow):
            continue
        v = 0  # geometric: number of Bernoulli(exp(-1)) successes before a failure
        while _bern_exp_neg_unit(1, 1, randbelow):
            v += 1
        y = (u + t * v) // s
        negative = randbelow(2) == 1
        if negative and y == 0:
            continue  # otherwise 0 would be counted twice
        return -y if negative else y


def sample_discrete_laplace(scale: Fraction) -> int:
    """One exact draw with P(x) ∝ exp(-|x|/scale) over the integers; scale > 0 rational."""
    scale = Fraction(scale)
    if scale <= 0:
        raise InvalidParameterValue(f"scale must be > 0, got {scale}")
    return _discrete_laplace(scale.numerator, scale.denominator)


def sample_discrete_gaussian(sigma_sq: Fraction) -> int:
    """One exact draw with P(x) ∝ exp(-x²/(2σ²)) over the integers; σ² > 0 rational.

    CKS20 Algorithm 3: discrete Laplace proposals with integer scale ⌊σ⌋+1, accepted with
    probability exp(-(|y| - σ²/t)² / (2σ²)), which is computed as an exact fraction.
    """
    sigma_sq = Fraction(sigma_sq)
    if sigma_sq <= 0:
        raise InvalidParameterValue(f"sigma_sq must be > 0, got {sigma_sq}")
    return _discrete_gaussian(sigma_sq.numerator, sigma_sq.denominator)


def _discrete_gaussian(p: int, q: int, randbelow: RandBelow = secrets.randbelow) -> int:
    """Discrete Gaussian with σ² = p/q > 0 (CKS20 Algorithm 3, see above)."""
    t = math.isqrt(p // q) + 1  # ⌊σ⌋ + 1, since ⌊√x⌋ = ⌊√⌊x⌋⌋
    # (|y| - p/(q t))² / (2 p/q) = (|y| q t - p)² / (2 p q t²)
    den = 2 * p * q * t * t
    while True:
        y = _discrete_laplace(t, 1, randbelow)
        if _bern_exp_neg((abs(y) * q * t - p) ** 2, den, randbelow):
            return y


# ------------------------------------------------------------------------------ calibration


def _require_positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidParameterValue(f"{name} must be a finite number > 0, got {value!r}")


def _require_delta(delta: float) -> None:
    if not (0 < delta < 1):
        raise InvalidParameterValue(f"delta must be strictly between 0 and 1, got {delta!r}")


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Scale b = Δ/ε of the Laplace mechanism (ε-DP for L1 sensitivity Δ).

    >>> laplace_scale(2.0, 0.5)
    4.0
    """
    _require_positive_finite("sensitivity", l1_sensitivity)
    _require_positive_finite("epsilon", epsilon)
    return l1_sensitivity / epsilon


def _log_gaussian_delta(l2_sensitivity: float, epsilon: float, sigma: float) -> float:
    """log δ(σ) of the Gaussian mechanism, computed stably for tiny δ (−inf if δ <= 0)."""
    a = l2_sensitivity / (2 * sigma)
    b = epsilon * sigma / l2_sensitivity
    log_first = float(log_ndtr(a - b))
    log_second = epsilon + float(log_ndtr(-a - b))
    diff = log_second - log_first
    if diff >= 0:
        return -math.inf
    # log(e^x − e^y) = x + log(1 − e^(y−x)), without forming either exponential.
    return log_first + math.log(-math.expm1(diff))


def gaussian_delta(l2_sensitivity: float, epsilon: float, sigma: float) -> float:
    """Exact δ at ε of N(0, σ²) noise on an L2-sensitivity-Δ query (Balle & Wang 2018).

    δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ).
    """
    _require_positive_finite("sensitivity", l2_sensitivity)
    _require_positive_finite("epsilon", epsilon)
    _require_positive_finite("sigma", sigma)
    return math.exp(_log_gaussian_delta(l2_sensitivity, epsilon, sigma))


def _bisect_sigma(start: float, too_small: Callable[[float], bool]) -> float:
    """Bisection for the smallest σ with not too_small(σ) (monotone); the safe end."""
    lo = hi = start
    while too_small(hi):
        hi *= 2
    while not too_small(lo):
        lo /= 2
    # Invariant: too_small(lo) and not too_small(hi); hi is what we may return.
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi) or hi - lo <= 1e-12 * hi:
            break
        if too_small(mid):
            lo = mid
        else:
            hi = mid
    return hi


# Pure, and asked again for every query with the same budget: kept for the next one
@functools.lru_cache(maxsize=1024, typed=True)
def gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ of the analytic Gaussian mechanism (Balle & Wang 2018) for (ε, δ)-DP.

    Exact for *continuous* N(0, σ²) noise. Bisection on σ of log δ(σ), which decreases in
    σ; returns the upper end of the final bracket, so gaussian_delta(σ) <= δ.

    >>> round(gaussian_sigma(1.0, 1.0, 1e-5), 2)
    3.73
    """
    _require_positive_finite("sensitivity", l2_sensitivity)
    _require_positive_finite("epsilon", epsilon)
    _require_delta(delta)
    target = math.log(delta)
    return _bisect_sigma(
        l2_sensitivity,
        lambda s: _log_gaussian_delta(l2_sensitivity, epsilon, s) > target)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """A δ such that ρ-zCDP implies (ε, δ)-DP (the conversion proved in CKS20).

    δ = inf over α > 1 of exp((α−1)(αρ−ε)) · (1−1/α)^α / (α−1). Every α gives a valid
    bound, so an inexact minimiser can only make δ larger, never unsafe.
    """
    _require_positive_finite("rho", rho)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise InvalidParameterValue(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    # log δ(α) is convex; its derivative (2α−1)ρ − ε + log(1−1/α) increases from −∞.
    lo, hi = 1.0, (epsilon + 1) / (2 * rho) + 2
    for _ in range(200):
        alpha = (lo + hi) / 2
        if alpha in (lo, hi):
            break
        if (2 * alpha - 1) * rho - epsilon + math.log1p(-1 / alpha) < 0:
            lo = alpha
        else:
            hi = alpha
    alpha = max(hi, 1 + 1e-9)
    log_delta = ((alpha - 1) * (alpha * rho - epsilon) + alpha * math.log1p(-1 / alpha)
                 - math.log(alpha - 1))
    return min(1.0, math.exp(log_delta))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """The ε such that ρ-zCDP implies (ε, δ)-DP, by the same CKS20 conversion:

    ε = inf over α > 1 of αρ + (ln(1/δ) + (α−1)·ln(1 − 1/α) − ln α) / (α − 1).

    Every α gives a valid ε, so an inexact minimiser errs only on the safe side.

    >>> round(zcdp_epsilon(100 * zcdp_rho(1.0, 45.31), 1e-6), 3)
    1.0
    >>> round(zcdp_epsilon(100 * zcdp_rho(1.0, 50.0), 1e-6), 2)
    0.9
    """
    if not (math.isfinite(rho) and rho >= 0):
        raise InvalidParameterValue(f"rho must be a finite number >= 0, got {rho!r}")
    _require_delta(delta)
    if rho == 0:
        return 0.0
    log_inv_delta = -math.log(delta)

    def eps_at(log_excess: float) -> float:  # α = 1 + e^log_excess
        alpha = 1 + math.exp(log_excess)
        return alpha * rho + (log_inv_delta + (alpha - 1) * math.log1p(-1 / alpha)
                              - math.log(alpha)) / (alpha - 1)

    # the objective is unimodal in log(α − 1): coarse grid, then golden-section refinement
    grid = [x / 4 for x in range(-80, 161)]
    best = min(grid, key=eps_at)
    lo, hi = best - 0.25, best + 0.25
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if eps_at(a) < eps_at(b):
            hi = b
        else:
            lo = a
    return min(eps_at(best), eps_at((lo + hi) / 2))


# Pure, and asked again for every query with the same budget: kept for the next one
@functools.lru_cache(maxsize=1024, typed=True)
def discrete_gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ whose zCDP ρ = Δ²/(2σ²) implies (ε, δ)-DP via zcdp_delta().

    This is what calibrate() uses. It is proven for discrete Gaussian noise in any dimension:
    CKS20 show independent discrete Gaussians on an integer query of L2 sensitivity Δ are
    ρ-zCDP, and zcdp_delta() converts. The continuous analytic σ is not enough: at Δ = 1,
    ε = 1, δ = 1e-5 it is ≈ 3.73, where the exact δ of discrete Gaussian noise is ≈ 1.035e-5
    (CKS20's formula for the 1-D discrete curve). The price: 3-14% more σ for δ <= 1e-5.

    >>> round(discrete_gaussian_sigma(1.0, 1.0, 1e-5), 2)
    4.05
    """
    _require_positive_finite("sensitivity", l2_sensitivity)
    _require_positive_finite("epsilon", epsilon)
    _require_delta(delta)
    return _bisect_sigma(
        l2_sensitivity, lambda s: zcdp_delta(zcdp_rho(l2_sensitivity, s), epsilon) > delta)


def classic_gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth Thm A.1; valid only for ε < 1). Not used."""
    _require_positive_finite("sensitivity", l2_sensitivity)
    _require_positive_finite("epsilon", epsilon)
    _require_delta(delta)
    return l2_sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def zcdp_rho(l2_sensitivity: float, sigma: float) -> float:
    """ρ = Δ²/(2σ²): the zCDP of Gaussian noise, and of discrete Gaussian noise (CKS20).

    >>> zcdp_rho(1.0, 2.0)
    0.125
    """
    _require_positive_finite("sensitivity", l2_sensitivity)
    _require_positive_finite("sigma", sigma)
    return l2_sensitivity**2 / (2 * sigma**2)


def _round_up(x: Fraction, bits: int = _PARAM_BITS) -> Fraction:
    """The smallest m / 2**k >= x with about `bits` significant bits (x > 0)."""
    magnitude = x.numerator.bit_length() - x.denominator.bit_length()  # ≈ log2 x
    k = max(0, bits - magnitude)
    m = -((-x.numerator << k) // x.denominator)  # ceiling division
    return Fraction(m, 1 << k)


# ---------------------------------------------------------------------------------- interface


@dataclass(frozen=True)
class NoiseSpec:
    """How one noisy output is released; everything needed to audit it."""

    mechanism: Mechanism
    sensitivity: float  # L1 (laplace) or L2 (gaussian), in output units, before snapping
    epsilon: float
    delta: float  # 0.0 for laplace
    granularity: float  # grid step γ: 1.0 for integer-valued outputs, a power of two otherwise
    scale: float  # Laplace b or Gaussian σ in output units (γ × grid scale), incl. snapping
    rho: float | None  # zCDP ρ for gaussian, None for laplace
    # Sensitivity on the integer grid, including the snapping term.
    grid_sensitivity: float = field(default=0.0, repr=False)
    # Exact sampler parameter on the grid: Laplace scale t, or Gaussian σ².
    grid_param: Fraction = field(default=Fraction(0), repr=False)


# Pure, and asked again for every query with the same budget: kept for the next one
@functools.lru_cache(maxsize=1024, typed=True)
def calibrate(mechanism: Mechanism, sensitivity: float, epsilon: float, delta: float = 0.0,
              *, integer_valued: bool, changed_outputs: int = 1) -> NoiseSpec:
    """Noise for a vector of outputs with the given L1 (laplace) / L2 (gaussian) sensitivity.

    Grid: γ = 1 for integer-valued outputs; otherwise γ = 2**(⌊log2 Δ⌋ − 20) and values are
    snapped to round(v/γ), which moves each of the `changed_outputs` coordinates one unit
    can touch by at most one extra grid step, and the backend's fixed-point sum and its
    conversion to a double by at most one each (`_REAL_STEPS`). Grid sensitivity is
    therefore ⌈Δ⌉ (L1) / Δ (L2) for integers, ⌈Δ/γ⌉ + 3·changed_outputs (L1) /
    Δ/γ + 3·√changed_outputs (L2) otherwise.

    Laplace: grid scale t = grid L1 / ε, rounded up; discrete Laplace on an integer query
    of L1 sensitivity k is k/t-DP, hence ε-DP (δ must be 0).

    Gaussian: grid σ = discrete_gaussian_sigma(grid L2, ε, δ), σ² rounded up; ρ is
    grid L2²/(2σ²). CKS20 prove the discrete Gaussian is ρ-zCDP exactly like the
    continuous one; (ε, δ) follows from that by their conversion. The continuous analytic
    σ (gaussian_sigma) is *not* used: the discrete (ε, δ) curve is close to, but can lie
    above, the continuous one (see discrete_gaussian_sigma).
    """
    if mechanism not in ("laplace", "gaussian"):
        raise InvalidParameterValue(
            f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    _require_positive_finite("sensitivity", sensitivity)
    _require_positive_finite("epsilon", epsilon)
    if mechanism == "gaussian":
        _require_delta(delta)
    elif delta != 0:
        raise InvalidParameterValue(
            f"delta must be 0 for the laplace mechanism (it is pure ε-DP), got {delta!r}")
    if isinstance(changed_outputs, bool) or not isinstance(changed_outputs, Integral) \
            or changed_outputs < 1:
        raise InvalidParameterValue(
            f"changed_outputs must be an integer >= 1, got {changed_outputs!r}")

    if integer_valued:
        gamma = 1.0
        grid_l1 = math.ceil(sensitivity)
        grid_l2 = sensitivity
    else:
        gamma = math.ldexp(1.0, math.frexp(sensitivity)[1] - 1 - _GRID_BITS)
        ratio = sensitivity / gamma  # exact: γ is a power of two
        grid_l1 = math.ceil(ratio) + _REAL_STEPS * int(changed_outputs)
        # Round the float sum up so the L2 bound cannot lose an ulp.
        grid_l2 = math.nextafter(ratio + _REAL_STEPS * math.sqrt(changed_outputs), math.inf)

    if mechanism == "laplace":
        param = _round_up(Fraction(grid_l1) / Fraction(epsilon))
        _require_drawable(param, epsilon)
        return NoiseSpec("laplace", sensitivity, epsilon, 0.0, gamma, gamma * float(param),
                         None, float(grid_l1), param)
    sigma = discrete_gaussian_sigma(grid_l2, epsilon, delta)
    _require_drawable(sigma, epsilon)
    param = _round_up(Fraction(sigma) ** 2)
    return NoiseSpec("gaussian", sensitivity, epsilon, delta, gamma,
                     gamma * math.sqrt(param), zcdp_rho(grid_l2, sigma), grid_l2, param)


def _require_drawable(scale: float | Fraction, epsilon: float) -> None:
    if scale > MAX_GRID_SCALE:
        # a subnormal ε makes a scale beyond any float
        wide = f"{float(scale):.3g}" if scale < 1e300 else "more than 1e300"
        raise InvalidParameterValue(
            f"ε = {epsilon:g} is too small: its noise would be {wide} grid steps "
            f"wide (at most 2^48), an answer of noise alone",
            hint="give the query (or this aggregate's share of the split) a larger ε")


def _noise(spec: NoiseSpec) -> int:
    return _sampler(spec)()


def _grid_fraction(spec: NoiseSpec) -> tuple[int, int]:
    """The spec's exact sampler parameter n/d, checked."""
    param = spec.grid_param
    if type(param) is not Fraction:
        param = Fraction(param)
    if param <= 0:
        raise InvalidParameterValue("NoiseSpec was not built by calibrate()")
    return param.numerator, param.denominator


def _sampler(spec: NoiseSpec) -> Callable[[], int]:
    """The spec's exact sampler, its parameter checked once (a vector of outputs draws
    many times from the same distribution; Fraction arithmetic per draw would cost more
    than the draw)."""
    return _grid_sampler(spec.mechanism, *_grid_fraction(spec))


def _grid_sampler(mechanism: Mechanism, n: int, d: int) -> Callable[[], int]:
    randbelow = _Entropy().randbelow  # this sampler's own bytes
    if mechanism == "laplace":
        return lambda: _discrete_laplace(n, d, randbelow)
    return lambda: _discrete_gaussian(n, d, randbelow)


def _snap(exact: float, gamma: float) -> int:
    if isinstance(exact, Integral) and gamma == 1.0:
        return int(exact)  # exact arithmetic for large integer results
    x = float(exact)
    if not math.isfinite(x) or not math.isfinite(x / gamma):
        raise InvalidParameterValue(
            f"exact value must be finite (clamp before releasing), got {x!r}")
    return round(x / gamma)


def release(exact: float, spec: NoiseSpec) -> float | int:
    """γ·(round(exact/γ) + noise): a Python int when γ == 1, else a float multiple of γ.

    Noise is added to the integer grid value; turning the noisy integer into a float is
    post-processing, so float rounding of large results cannot leak anything.
    """
    n = _snap(exact, spec.granularity) + _noise(spec)
    return n if spec.granularity == 1.0 else float(n) * spec.granularity


def release_many(exact_values: Sequence[float], spec: NoiseSpec) -> list[float | int]:
    """release() applied to each coordinate of a vector whose sensitivity the spec covers."""
    return release_vectors([(exact_values, spec)])[0]


def release_vectors(vectors: Sequence[tuple[Sequence[float], NoiseSpec]]
                    ) -> list[list[float | int]]:
    """release_many() of each (values, spec) pair, every value validated before any noise.

    From _VECTOR_MIN values in all, they are noised together by `dpproxy.batch_noise`: the
    same samplers run on whole vectors (same algorithms and distributions, far fewer Python
    steps), one batch per mechanism.
    """
    return [v if isinstance(v, list) else v.tolist() for v in _release_vectors(vectors)]


def release_array(exact_values: Sequence[float] | np.ndarray, spec: NoiseSpec) -> np.ndarray:
    """release_many() as an array whose tolist() it is (an int64 or float64 array, else an
    object array of its Python numbers): for callers that go on in numpy."""
    noisy = _release_vectors([(exact_values, spec)])[0]
    return batch_noise.object_array(noisy) if isinstance(noisy, list) else noisy


def release_reaching(exact_values: Sequence[float] | np.ndarray, spec: NoiseSpec,
                     threshold: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices i (ascending) where release(exact_values[i], spec) >= threshold, and
    those released values (as release_array gives them): partition selection's step. In
    law it is release_array() and the comparison; Laplace noise on the unit grid draws a
    whole noise value only where it may reach the threshold (see
    `batch_noise.discrete_laplace_reaching`)."""
    n, d = _grid_fraction(spec)
    if spec.mechanism == "laplace" and spec.granularity == 1.0 \
            and len(exact_values) >= _VECTOR_MIN and batch_noise.batch_supported("laplace", n, d):
        grid = batch_noise.snapped(exact_values, 1.0)
        reached = None if grid is None else batch_noise.laplace_reaching(grid, n, d, threshold)
        if reached is not None:
            return reached
    return batch_noise.at_least(release_array(exact_values, spec), threshold)


def _release_vectors(vectors: Sequence[tuple[Sequence[float], NoiseSpec]]
                     ) -> list[list[float | int] | np.ndarray]:
    """release_vectors(), each vector noised by dpproxy.batch_noise as the array it gives."""
    vectorized = sum(len(values) for values, _ in vectors) >= _VECTOR_MIN
    batched: list[tuple[int, tuple[Any, str, int, int, float]]] = []
    scalar: list[tuple[int, list[int], NoiseSpec, Callable[[], int]]] = []
    for i, (values, spec) in enumerate(vectors):
        n, d = _grid_fraction(spec)
        if vectorized and batch_noise.batch_supported(spec.mechanism, n, d):
            grid = batch_noise.snapped(values, spec.granularity)
            if grid is not None:  # else some value needs Python's arithmetic (or is bad)
                batched.append((i, (grid, spec.mechanism, n, d, spec.granularity)))
                continue
        scalar.append((i, [_snap(v, spec.granularity) for v in values], spec,
                       _grid_sampler(spec.mechanism, n, d)))
    out: list[list[float | int] | np.ndarray] = [[] for _ in vectors]
    if batched:
        for i, noisy in zip([i for i, _ in batched],
                            batch_noise.add_noise_arrays([b for _, b in batched]), strict=True):
            out[i] = noisy
    for i, snapped, spec, noise in scalar:
        if spec.granularity == 1.0:
            out[i] = [n + noise() for n in snapped]
        else:
            out[i] = [float(n + noise()) * spec.granularity for n in snapped]
    return out


@functools.lru_cache(maxsize=1024, typed=True)  # pure; every release asks it again
def half_width(spec: NoiseSpec, confidence: float = 0.95) -> float:
    """Half-width h with P(|noise| <= h) >= confidence, in output units (a multiple of γ).

    Laplace: exact; the smallest integer k with P(|X| > k) = 2a^(k+1)/(1+a) <= 1 − c,
    a = e^(−1/t). Gaussian: k = ⌈z·σ⌉ with z the continuous two-sided quantile. This is
    provably conservative: for m >= 1, Σ_{x>=m} e^(−x²/2σ²) <= ∫_{m−1}^∞ e^(−y²/2σ²) dy and
    the normaliser Σ_x e^(−x²/2σ²) >= √(2π)σ (Poisson summation), so
    P(|X| > k) <= P(|N(0,σ²)| >= k) <= 1 − c.
    """
    if not (0 < confidence < 1):
        raise InvalidParameterValue(
            f"confidence must be strictly between 0 and 1, got {confidence!r}")
    alpha = 1 - confidence
    if spec.mechanism == "laplace":
        t = float(spec.grid_param)
        log1p_a = math.log1p(math.exp(-1 / t))

        def log_tail(k: int) -> float:  # log P(|X| > k)
            return math.log(2) - (k + 1) / t - log1p_a

        k = max(0, math.ceil(t * (math.log(2 / alpha) - log1p_a)) - 1)
        # Fix float error in the closed form so k is the smallest that satisfies the bound.
        # (at most a few steps: calibrate keeps t within MAX_GRID_SCALE, where the float
        # form still tells k from k + 1; the cap ends the search whatever the spec)
        for _ in range(64):
            if log_tail(k) <= math.log(alpha):
                break
            k += 1
        for _ in range(64):
            if k == 0 or log_tail(k - 1) > math.log(alpha):
                break
            k -= 1
    else:
        z = -float(ndtri(alpha / 2))
        # The tiny relative margin keeps float rounding from dropping k below z·σ.
        k = math.ceil(z * math.sqrt(spec.grid_param) * (1 + 1e-12))
    return k * spec.granularity
