"""Quantiles by the exponential mechanism over a fine histogram: MEDIAN, PERCENTILE_CONT,
MIN and MAX. Privacy-critical, no I/O.

What crosses from the backend. The clamped domain [lower, upper] is cut into bins
(`Binning`): one bin per integer when the argument is integer-valued and the domain has at
most `MAX_BINS` integers, else `MAX_BINS` equal-width bins. Per group, the backend returns
only the number of (contribution-bounded) rows in each non-empty bin — a count vector, an
aggregate like COUNT(*) — never the sorted values, which would be private rows.

The mechanism. For quantile p of a group whose histogram h has n = Σ h rows, bin j covers
the ranks [below_j, below_j + h_j] (below_j = rows in bins before j), and its utility is

    u_j = −⌈ distance(p·n, [below_j, below_j + h_j]) ⌉  (an integer ≤ 0; 0 for the bin
                                                         holding the true quantile),

how many rows would have to move for the quantile to fall in bin j. Adding or removing one
row moves below_j and h_j by at most 1 and p·n by p ≤ 1, so the distance moves by at most 1
(and so does its ceiling): the utility's sensitivity is 1 per row, `max_rows` per unit in a
group. Bin j is drawn with probability ∝ exp(a·u_j), a = ε_group / (2·max_rows), which is
ε_group-DP for that group (McSherry & Talwar 2007); uniform bins make this the continuous
exponential mechanism with a utility constant on each bin.

Groups. One unit changes at most `max_groups` groups' histograms (the rewrite enforces it),
and each group's draw is independent, so by composition over the groups a unit touches the
vector of draws is (max_groups × ε_group)-DP: the measurement's ε is divided by max_groups.

zCDP. An ε-DP exponential mechanism is ε-bounded-range, hence ε²/8-zCDP (Cesar & Rogers
2021); the groups compose to max_groups·ε_group²/8 ≤ ε²/8, which `rho` reports.

Sampling, exactly. a is rounded *down* to a fraction (less privacy loss, never more). A bin
is proposed uniformly with `secrets` and accepted with probability exp(a·u_j), drawn exactly
by `bernoulli_exp_neg` (integer arithmetic, no floating-point Gumbel noise); an accepted
bin has probability exactly ∝ exp(a·u_j). The bin holding the quantile is accepted with
probability 1, so at most `bins` proposals are expected; the draw runs after the budget is
charged, in Python, and its running time (like the backend's) is not made constant.

Output. The released value is the chosen bin's point: the integer itself for one-integer
bins, else the bin's midpoint, the point of the bin closest to all of it (error ≤ half a
bin). Turning a bin into its point is post-processing.

Accuracy. With probability ≥ 1 − α the chosen bin has u ≥ −ln(bins/α)/a (its total weight
is at most bins·exp(−a·t) against ≥ 1 for the best bin): `rank_error` is that bound in rows.
A value interval would need the data's density around the quantile, which is private, so no
value interval is released; the rank bound is the accuracy statement.

>>> spec = QuantileSpec(Fraction(1, 2), 1.0, 1, 1, Binning(0.0, 3.0, 4, True))
>>> utilities((1, 0, 2, 1), Fraction(1, 2))
[-1, -1, 0, -1]
>>> spec.binning.point(2)
2.0
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .errors import InvalidParameterValue
from .mechanisms import bernoulli_exp_neg

__all__ = ["MAX_BINS", "Binning", "QuantileSpec", "binning_for", "decode_histogram",
           "probabilities", "rank_error", "release_quantile", "sample_bin", "utilities"]

# Bins of a real-valued domain: fine enough that half a bin (0.05% of the range) is far
# below the mechanism's own error at usual ε, small enough to sample in microseconds.
MAX_BINS = 1024
_RATE_BITS = 48  # significant bits kept when the sampling rate a becomes a fraction


@dataclass(frozen=True)
class Binning:
    """The bins the backend counts rows in: `bins` equal parts of [lower, upper], or one bin
    per integer lower, lower + 1, …, upper when `integer_points`."""

    lower: float
    upper: float
    bins: int
    integer_points: bool

    @property
    def width(self) -> float:
        return 1.0 if self.integer_points else (self.upper - self.lower) / self.bins

    @property
    def scale(self) -> float:
        """Bins per unit of value for real bins: bin = ⌊(x − lower) · scale⌋, at most
        bins − 1 (0 for a single point, or a range too wide for a double)."""
        span = self.upper - self.lower
        if self.integer_points or span <= 0 or not math.isfinite(self.bins / span):
            return 0.0
        return self.bins / span

    def point(self, index: int) -> float:
        """The released value for bin `index`: its integer, or its midpoint."""
        if self.integer_points:
            return self.lower + index
        return min(max(self.lower + (index + 0.5) * self.width, self.lower), self.upper)


def binning_for(lower: float, upper: float, integer_valued: bool) -> Binning:
    """One bin per integer when there are few enough, else MAX_BINS equal bins.

    >>> binning_for(17, 90, True)
    Binning(lower=17, upper=90, bins=74, integer_points=True)
    >>> binning_for(0, 500, False).bins
    1024
    """
    if not (math.isfinite(lower) and math.isfinite(upper) and lower <= upper):
        raise InvalidParameterValue(f"quantile bounds must be finite, got [{lower}, {upper}]")
    if integer_valued and float(lower).is_integer() and float(upper).is_integer() \
            and upper - lower + 1 <= MAX_BINS:
        return Binning(lower, upper, int(upper - lower) + 1, True)
    return Binning(lower, upper, MAX_BINS if upper > lower else 1, False)


def _round_down(x: Fraction, bits: int = _RATE_BITS) -> Fraction:
    """The largest m / 2**k <= x with about `bits` significant bits (x > 0)."""
    magnitude = x.numerator.bit_length() - x.denominator.bit_length()
    k = max(0, bits - magnitude)
    return Fraction((x.numerator << k) // x.denominator, 1 << k)


@dataclass(frozen=True)
class QuantileSpec:
    """One quantile measurement: everything needed to audit it, as a NoiseSpec for noise."""

    quantile: Fraction  # p in [0, 1]
    epsilon: float  # the measurement's share of the query's ε, over all groups
    max_groups: int  # groups one unit may touch
    max_rows: int  # rows one unit may have in a group: the utility's sensitivity
    binning: Binning

    def __post_init__(self) -> None:
        if not 0 <= self.quantile <= 1:
            raise InvalidParameterValue(f"quantile must be in [0, 1], got {self.quantile}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InvalidParameterValue(f"epsilon must be > 0, got {self.epsilon}")
        if self.max_groups < 1 or self.max_rows < 1:
            raise InvalidParameterValue("contribution bounds must be >= 1")

    @property
    def utility_sensitivity(self) -> int:
        return self.max_rows

    @property
    def epsilon_per_group(self) -> float:
        return self.epsilon / self.max_groups

    @property
    def rate(self) -> Fraction:
        """a = ε_group / (2·Δu), rounded down: P(bin j) ∝ exp(a·u_j)."""
        exact = Fraction(self.epsilon) / (2 * self.max_groups * self.max_rows)
        return _round_down(exact)

    @property
    def rho(self) -> float:
        """zCDP of the measurement: ε²/8 (bounded range), an upper bound over all groups."""
        return self.epsilon ** 2 / 8


def utilities(histogram: Sequence[int], quantile: Fraction) -> list[int]:
    """−⌈distance of p·n from each bin's rank interval⌉ (see the module docstring)."""
    # in integers scaled by p's denominator: exact, and far faster than Fractions
    num, den = quantile.numerator, quantile.denominator
    target = num * sum(histogram)  # p·n·den
    result = []
    below = 0
    for count in histogram:
        above = below + count
        scaled = max(below * den - target, target - above * den, 0)
        result.append(-scaled // den)  # ⌊−scaled / den⌋ = −⌈scaled / den⌉
        below = above
    return result


def decode_histogram(pairs: Iterable[Sequence[object]] | None, bins: int) -> tuple[int, ...]:
    """The backend's (bin, rows) pairs as a dense count vector; pairs with a NULL bin (a NULL
    argument) are skipped, and the same bin may come in several pairs (they add up)."""
    counts = [0] * bins
    for pair in pairs or ():
        index, rows = pair[0], pair[1]
        if index is None or rows is None:
            continue
        # the SQL clamps the index into range; this guards against a backend oddity only
        counts[min(max(int(index), 0), bins - 1)] += int(rows)  # type: ignore[call-overload]
    return tuple(counts)


def probabilities(spec: QuantileSpec, histogram: Sequence[int]) -> list[float]:
    """The exact output distribution over bins (for EXPLAIN-style checks and tests)."""
    rate = float(spec.rate)
    logs = [rate * u for u in utilities(histogram, spec.quantile)]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def sample_bin(spec: QuantileSpec, histogram: Sequence[int]) -> int:
    """One exact draw of a bin with P(j) ∝ exp(a·u_j), from the OS's CSPRNG."""
    if len(histogram) != spec.binning.bins:
        raise InvalidParameterValue(
            f"histogram has {len(histogram)} bins, the spec {spec.binning.bins}")
    rate = spec.rate
    # exp(−a·d) as exp(−n/den): the integer pair the exact Bernoulli sampler takes
    numerators = [rate.numerator * -u for u in utilities(histogram, spec.quantile)]
    while True:
        j = secrets.randbelow(len(numerators))
        if numerators[j] == 0 or bernoulli_exp_neg(Fraction(numerators[j], rate.denominator)):
            return j


def release_quantile(spec: QuantileSpec, histogram: Sequence[int]) -> float:
    """The released quantile: the point of a bin drawn by the exponential mechanism."""
    return spec.binning.point(sample_bin(spec, histogram))


def rank_error(spec: QuantileSpec, confidence: float) -> float:
    """Rows t such that, with probability ≥ confidence, the released bin's rank interval is
    within t rows of p·n: t = ln(bins / (1 − confidence)) / a.

    >>> round(rank_error(QuantileSpec(Fraction(1, 2), 1.0, 1, 1, binning_for(0, 9, True)),
    ...                  0.95), 2)
    10.6
    """
    if not 0 < confidence < 1:
        raise InvalidParameterValue(f"confidence must be in (0, 1), got {confidence}")
    return math.log(spec.binning.bins / (1 - confidence)) / float(spec.rate)
