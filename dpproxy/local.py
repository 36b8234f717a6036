"""Local differential privacy: answers randomized on the respondent's own device.

A client library for collecting data when no curator can be trusted. It has no
dependency on the rest of dpproxy (numpy only), so it can ship inside a survey
app. Two encoders, each with the estimator that debiases the collected reports:

* `RandomizedResponse` for a yes/no answer. With probability 1 − h the respondent
  answers truthfully; otherwise a second coin says "yes" with probability s. So
  P(yes | yes) = 1 − h + h·s and P(yes | no) = h·s. With s = 1/2 this is the
  symmetric form P(yes | yes) = f, P(yes | no) = 1 − f, ε = ln(f / (1 − f)); with
  h = s = 1/2 it is the classic scheme (f = 3/4, ε = ln 3).
* `UnaryEncoding` over a declared domain: the answer becomes a one-hot vector and
  each bit is reported as 1 with probability p if it was 1, q if it was 0;
  ε = ln(p(1 − q) / ((1 − p)q)). `UnaryEncoding.optimized` (OUE: p = 1/2,
  q = 1/(e^ε + 1)) is the accurate default; `UnaryEncoding.symmetric` has
  p = e^{ε/2}/(1 + e^{ε/2}), q = 1 − p.

Both are one "bit kept with probability `p_one`, raised with probability `p_zero`"
channel, so they share one estimator (`debias`): from `ones` reported 1s among
`n` reports, r = ones/n, the true proportion is (r − p_zero)/(p_one − p_zero) with
standard error √(v/n)/(p_one − p_zero), v = π(1 − π) at the π in [p_zero, p_one]
nearest 1/2 (`report_variance`): every report is yes with some such π, so v/n bounds
the variance of their mean whatever the true answers, as the observed r(1 − r) does
not (it is 0 when every report agrees). For symmetric randomized response that is
p̂ = (r + f − 1)/(2f − 1) and Δp = 2/(2f − 1)·√(1/(4N)) = 2 standard errors.

Randomness comes from the OS (`os.urandom`) in bulk: 32 random bits per reported
bit, compared with P·2^32 (no floating point on random data). So an encoder rounds
its probabilities to multiples of 2^-32 when it is built, toward less information
(the probability of reporting the truth down, of reporting the other answer up):
its `epsilon` is then the ε its reports realize, never above the one asked for.
Rounding to nearest instead could turn P(yes | no) ≈ 1e-10 (ε = 23) into 0, and
every report into the truth.

>>> rr = RandomizedResponse.from_coins(h=0.5, s=0.5)
>>> (rr.p_one, rr.p_zero, round(rr.epsilon, 4))
(0.75, 0.25, 1.0986)
>>> est = rr.estimate_counts(ones=450, n=1000)   # 45% said yes
>>> (round(est.value, 4), round(est.standard_error, 4), round(est.delta, 4))
(0.4, 0.0316, 0.0632)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = ["Estimate", "RandomizedResponse", "UnaryEncoding", "bernoulli", "debias"]

_RESOLUTION = 2 ** 32  # random bits per reported bit


def bernoulli(probability: float | np.ndarray, shape: int | tuple[int, ...]) -> np.ndarray:
    """Independent booleans, True with `probability` (a number, or an array broadcast to
    `shape`), from the OS's secure random source."""
    size = int(np.prod(shape))
    uniform = np.frombuffer(os.urandom(4 * size), dtype=np.uint32).reshape(shape)
    # P(u < t) = t / 2^32 exactly for u uniform on 32 bits; t = 2^32 gives True always.
    threshold = np.rint(np.asarray(probability, dtype=np.float64) * _RESOLUTION)
    return uniform < threshold.astype(np.uint64)


def _on_grid(value: float, up: bool) -> float:
    """value rounded up or down to a multiple of 2^-32, the probabilities `bernoulli`
    realizes exactly (the scaling by a power of two is exact)."""
    scaled = value * _RESOLUTION
    return (math.ceil(scaled) if up else math.floor(scaled)) / _RESOLUTION


def _unlikely(epsilon: float) -> float:
    """1/(e^ε + 1) rounded up on the grid: at least one step, where ε beyond ~22.18 would
    round it (or, beyond ~745, underflow it) to 0, a report that tells the truth for
    certain; the channel's ε then stops at ln(2^32 − 1)."""
    return _on_grid(max(_logistic(-_check_epsilon(epsilon)), 1 / _RESOLUTION), up=True)


def _check_probability(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return value


def _check_epsilon(epsilon: float) -> float:
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")
    return epsilon


def _logistic(x: float) -> float:
    """e^x / (1 + e^x), without overflow for large |x|."""
    if x < 0:
        e = math.exp(x)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(-x))


def _channel_epsilon(p_one: float, p_zero: float) -> float:
    """The ε of a bit kept as 1 with p_one and raised to 1 with p_zero: the worst ratio of
    the probabilities of either report."""
    ratios = []
    for yes, no in ((p_one, p_zero), (1 - p_zero, 1 - p_one)):
        if yes == 0 and no == 0:
            continue
        ratios.append(math.inf if no == 0 else math.log(yes / no))
    return max(ratios)


@dataclass(frozen=True)
class Estimate:
    """A debiased estimate and its standard error (from the randomization alone)."""

    value: float
    standard_error: float
    n: int

    @property
    def delta(self) -> float:
        """Two standard errors: the Δ of the textbook formulas (about a 95% half-width)."""
        return 2 * self.standard_error

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """A normal-approximation confidence interval."""
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        return (self.value - z * self.standard_error, self.value + z * self.standard_error)


def debias(ones: float, n: float, p_one: float, p_zero: float) -> Estimate:
    """The true proportion of 1s from `ones` reported 1s among `n` reports.

    (r − p_zero)/(p_one − p_zero), r = ones/n, and a standard error that bounds the
    true one: √(v/n)/(p_one − p_zero), v the most any report's variance π(1 − π) can be
    for a π in [p_zero, p_one] (each report is yes with such a π). The observed r(1 − r)
    would be 0 when every report agrees, and a "95%" interval of width 0 covered the
    truth for 73% of single reports. Not clipped to [0, 1]: clipping would bias it.
    """
    if not p_one > p_zero:
        raise ValueError(f"reports carry no information unless p_one > p_zero "
                         f"(got {p_one}, {p_zero})")
    if n <= 0:
        return Estimate(math.nan, math.inf, 0)
    r = min(max(ones / n, 0.0), 1.0)
    gap = p_one - p_zero
    return Estimate((r - p_zero) / gap, math.sqrt(report_variance(p_one, p_zero) / n) / gap,
                    int(n))


def report_variance(p_one: float, p_zero: float) -> float:
    """The most one report's variance π(1 − π) can be, π in [p_zero, p_one]: what the
    true answers are does not change it, so it bounds a sum's variance for any data."""
    nearest = min(max(0.5, p_zero), p_one)  # the π in the range closest to 1/2
    return nearest * (1 - nearest)


_YES = {"1", "yes", "y", "true", "t"}
_NO = {"0", "no", "n", "false", "f"}


def parse_yes_no(values: Iterable[Any]) -> np.ndarray:
    """Booleans from 1/0, yes/no, y/n, true/false, t/f (any case) or bools."""
    out = []
    for value in values:
        if isinstance(value, bool | np.bool_):
            out.append(bool(value))
            continue
        text = str(value).strip().lower()
        if text in _YES:
            out.append(True)
        elif text in _NO:
            out.append(False)
        else:
            raise ValueError(f"not a yes/no answer: {value!r}")
    return np.asarray(out, dtype=bool)


@dataclass(frozen=True)
class RandomizedResponse:
    """Randomized response: report "yes" with p_one if the answer is yes, p_zero if no."""

    p_one: float  # P(report yes | true yes)
    p_zero: float  # P(report yes | true no)

    def __post_init__(self) -> None:
        # realized exactly, and never more telling than asked (see the module docstring)
        object.__setattr__(self, "p_one", _on_grid(_check_probability("p_one", self.p_one),
                                                   up=False))
        object.__setattr__(self, "p_zero", _on_grid(_check_probability("p_zero", self.p_zero),
                                                    up=True))
        if not self.p_one > self.p_zero:
            raise ValueError("P(yes | yes) must exceed P(yes | no), or the reports say nothing")

    @classmethod
    def from_coins(cls, h: float, s: float = 0.5) -> RandomizedResponse:
        """First coin: answer truthfully with probability 1 − h; otherwise say yes with
        probability s (the second coin)."""
        h, s = _check_probability("h", h), _check_probability("s", s)
        if h == 0:
            raise ValueError("h = 0 always answers truthfully: no privacy (ε = ∞)")
        # P(no | yes) = h·(1 − s) rounded first: 1 − h + h·s could round to 1 for a small h
        return cls(1 - _on_grid(h * (1 - s), up=True), h * s)

    @classmethod
    def from_f(cls, f: float) -> RandomizedResponse:
        """Symmetric form: P(yes | yes) = f, P(yes | no) = 1 − f, for 1/2 < f ≤ 1."""
        f = _check_probability("f", f)
        if not f > 0.5:
            raise ValueError(f"f must exceed 1/2, got {f}")
        return cls(f, 1 - f)

    @classmethod
    def from_epsilon(cls, epsilon: float) -> RandomizedResponse:
        """The symmetric scheme with ε = ln(f/(1 − f)): f = e^ε/(1 + e^ε)."""
        # 1 − f from f would lose a small 1 − f to 0: it is computed, and rounded, first
        no = _unlikely(epsilon)
        return cls(1 - no, no)

    @property
    def symmetric(self) -> bool:
        return math.isclose(self.p_one + self.p_zero, 1.0, rel_tol=0, abs_tol=1e-12)

    @property
    def f(self) -> float:
        """P(yes | yes) of the symmetric form."""
        if not self.symmetric:
            raise ValueError("f is defined for the symmetric form (second coin s = 1/2)")
        return self.p_one

    @property
    def epsilon(self) -> float:
        return _channel_epsilon(self.p_one, self.p_zero)

    def encode(self, answers: Iterable[Any] | np.ndarray) -> np.ndarray:
        """Randomized reports (booleans) for true yes/no answers."""
        truth = np.asarray(answers, dtype=bool) if isinstance(answers, np.ndarray) \
            else parse_yes_no(answers)
        return bernoulli(np.where(truth, self.p_one, self.p_zero), truth.shape)

    def estimate(self, reports: Iterable[Any] | np.ndarray) -> Estimate:
        """The proportion of true "yes" among respondents, from their reports."""
        bits = np.asarray(reports, dtype=bool) if isinstance(reports, np.ndarray) \
            else parse_yes_no(reports)
        return self.estimate_counts(int(bits.sum()), int(bits.size))

    def estimate_counts(self, ones: int, n: int) -> Estimate:
        """Like `estimate`, from the number of "yes" reports and of reports."""
        return debias(ones, n, self.p_one, self.p_zero)


@dataclass(frozen=True)
class UnaryEncoding:
    """Unary encoding over `domain`: each one-hot bit is reported as 1 with probability p
    if it is 1, q if it is 0. Answers outside the domain (or None) encode as all zeros."""

    domain: tuple[Any, ...]
    p: float
    q: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "domain", tuple(self.domain))
        if not self.domain:
            raise ValueError("the domain must list at least one value")
        if len(set(self.domain)) != len(self.domain):
            raise ValueError("domain values must be distinct")
        # realized exactly, and never more telling than asked (see the module docstring)
        object.__setattr__(self, "p", _on_grid(_check_probability("p", self.p), up=False))
        object.__setattr__(self, "q", _on_grid(_check_probability("q", self.q), up=True))
        if not self.p > self.q:
            raise ValueError("p must exceed q, or the reports say nothing")

    @classmethod
    def optimized(cls, domain: Sequence[Any], epsilon: float) -> UnaryEncoding:
        """OUE (Wang et al. 2017): p = 1/2, q = 1/(e^ε + 1); the lowest variance."""
        return cls(tuple(domain), 0.5, _unlikely(epsilon))

    @classmethod
    def symmetric(cls, domain: Sequence[Any], epsilon: float) -> UnaryEncoding:
        """SUE (basic RAPPOR): p = e^{ε/2}/(1 + e^{ε/2}), q = 1 − p."""
        q = _unlikely(_check_epsilon(epsilon) / 2)
        return cls(tuple(domain), 1 - q, q)

    @property
    def epsilon(self) -> float:
        """ln(p(1 − q)/((1 − p)q)): two answers differ in two bits, one each way."""
        p, q = self.p, self.q
        if q == 0 or p == 1:
            return math.inf
        return math.log(p * (1 - q) / ((1 - p) * q))

    def codes(self, answers: Iterable[Any]) -> np.ndarray:
        """Index of each answer in the domain; -1 for anything outside it (or None)."""
        index = {value: i for i, value in enumerate(self.domain)}
        return np.fromiter((index.get(a, -1) for a in answers), dtype=np.int64)

    def encode(self, answers: Iterable[Any]) -> np.ndarray:
        """Reports: a boolean array of shape (answers, len(domain))."""
        return self.encode_codes(self.codes(answers))

    def encode_codes(self, codes: np.ndarray) -> np.ndarray:
        """Like `encode`, from domain indexes (-1: no value)."""
        codes = np.asarray(codes, dtype=np.int64)
        reports = bernoulli(self.q, (codes.size, len(self.domain)))
        rows = np.flatnonzero(codes >= 0)
        # the true bit of each answer is redrawn with p (a fresh, independent draw)
        reports[rows, codes[rows]] = bernoulli(self.p, rows.size)
        return reports

    def estimate(self, reports: np.ndarray) -> list[Estimate]:
        """Per domain value, the number of respondents with that true answer."""
        bits = np.asarray(reports, dtype=bool)
        return self.estimate_counts(bits.sum(axis=0).tolist(), bits.shape[0])

    def estimate_counts(self, ones: Sequence[int], n: int) -> list[Estimate]:
        """Per bin: (Σ_j B'_j[i] − n·q)/(p − q) and its standard error, from the bit sums."""
        out = []
        for total in ones:
            share = debias(total, n, self.p, self.q)
            out.append(Estimate(share.value * n, share.standard_error * n, n))
        return out
