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

Sampling, exactly. a is rounded *down* to a fraction (less privacy loss, never more). The bin
is found by inverse CDF on a uniform V from `secrets` whose bits are drawn lazily: every
weight exp(−a·d_j) is bracketed by integer bounds, so every boundary between bins is
bracketed, and V is placed only when its interval lies surely inside one bin; otherwise
more bits of V are drawn and the weights recomputed with more digits (`decimal`, correctly
rounded). No floating-point Gumbel noise decides anything: the output has exactly the
mechanism's distribution. The float pass's bounds assume libm's exp is within 2^-40
relative of the truth (it is within an ulp or two); everything else is integer
arithmetic. The draw runs after the budget is charged; its time (one pass over the
bins, rarely more) depends little on the data.

MODE. The most frequent value (`MODE() WITHIN GROUP (ORDER BY x)`) is drawn by the same
mechanism over one bin per candidate value (a public value, or an integer of a bounded
range), with the count utility u_j = h_j (sampled as h_j − max h: shifting every utility
by the same amount changes no probability). One row moves each count by at most 1, one
unit by `max_rows`, and the utility is monotone: adding a unit only adds rows (each unit's
rows are bounded on their own), so every count rises or stays. For a monotone utility
P(bin j) ∝ exp(a·u_j) with a = ε_group / Δu, twice the rank utility's rate, is ε_group-DP
(McSherry & Talwar 2007): on adding a unit the weight of j grows by at most e^ε_group and
the normaliser does not shrink, and on removing one the reverse. It is ε_group-bounded-
range as well (every log-ratio lies in [−ln(Z'/Z), ε_group − ln(Z'/Z)]), so the zCDP
and the composition over groups are those above. `rank_error` reads as rows short of the
top count.

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

import decimal
import itertools
import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .errors import InvalidParameterValue

__all__ = ["MAX_BINS", "Binning", "QuantileSpec", "binning_for", "decode_histogram",
           "error_phrase", "probabilities", "rank_error", "release_quantile", "sample_bin",
           "utilities"]

# Bins of a real-valued domain: fine enough that half a bin (0.05% of the range) is far
# below the mechanism's own error at usual ε, small enough to sample in microseconds.
MAX_BINS = 1024
_RATE_BITS = 48  # significant bits kept when the sampling rate a becomes a fraction
_MIN_RATE = 1e-300  # below it a rate is refused (QuantileSpec)


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
    mode: bool = False  # the count utility (MODE) instead of the rank utility

    def __post_init__(self) -> None:
        if not 0 <= self.quantile <= 1:
            raise InvalidParameterValue(f"quantile must be in [0, 1], got {self.quantile}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise InvalidParameterValue(f"epsilon must be > 0, got {self.epsilon}")
        if self.max_groups < 1 or self.max_rows < 1:
            raise InvalidParameterValue("contribution bounds must be >= 1")
        if float(self.rate) < _MIN_RATE:
            # a subnormal ε: its rate rounds to 0 (1/rate, the scale reported, failed after
            # the charge), and any rate this small draws every bin alike
            raise InvalidParameterValue(
                f"ε = {self.epsilon:g} is too small for the exponential mechanism: every "
                "candidate would be about equally likely",
                hint="give the query (or this aggregate's share of the split) a larger ε")

    @property
    def utility_sensitivity(self) -> int:
        return self.max_rows

    @property
    def epsilon_per_group(self) -> float:
        return self.epsilon / self.max_groups

    @property
    def rate(self) -> Fraction:
        """a = ε_group / (2·Δu), rounded down: P(bin j) ∝ exp(a·u_j); ε_group / Δu for the
        mode, whose count utility is monotone (see the module docstring)."""
        halves = 1 if self.mode else 2
        exact = Fraction(self.epsilon) / (halves * self.max_groups * self.max_rows)
        return _round_down(exact)

    @property
    def rho(self) -> float:
        """zCDP of the measurement: ε²/8 (bounded range), an upper bound over all groups."""
        return self.epsilon ** 2 / 8


def utilities(histogram: Sequence[int], quantile: Fraction, mode: bool = False) -> list[int]:
    """−⌈distance of p·n from each bin's rank interval⌉, or for the mode each bin's count
    less the largest (see the module docstring).

    >>> utilities((3, 0, 5, 5), Fraction(0), mode=True)
    [-2, -5, 0, 0]
    """
    distances = _mode_distances(histogram) if mode else _distances(histogram, quantile)
    return [-d for d in distances.tolist()]


def _mode_distances(histogram: Sequence[int]) -> np.ndarray:
    """max h − h_j per bin (int64: each is at most the group's rows)."""
    counts = np.asarray(histogram, dtype=np.int64)
    return (counts.max() - counts) if counts.size else counts


def _distances(histogram: Sequence[int], quantile: Fraction) -> np.ndarray:
    """⌈distance of p·n from each bin's rank interval⌉ as int64, computed in integers scaled
    by p's denominator: exact (Python integers when int64 could overflow)."""
    num, den = quantile.numerator, quantile.denominator
    n = sum(histogram)
    target = num * n  # p·n·den
    if max(n, 1) * max(num, den) < 2 ** 62:
        counts = np.asarray(histogram, dtype=np.int64)
        above = np.cumsum(counts)
        below = above - counts
        scaled = np.maximum(np.maximum(below * den - target, target - above * den), 0)
        return -(-scaled // den)
    result = []
    below = 0
    for count in histogram:
        above = below + count
        scaled = max(below * den - target, target - above * den, 0)
        result.append(-(-scaled // den))
        below = above
    # each distance is at most n rows, so int64 holds it: the float fast path stays on
    return np.asarray(result, dtype=np.int64)


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
    logs = [rate * u for u in utilities(histogram, spec.quantile, spec.mode)]
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def sample_bin(spec: QuantileSpec, histogram: Sequence[int]) -> int:
    """One exact draw of a bin with P(j) ∝ exp(−a·d_j), d_j = −u_j, from the OS's CSPRNG.

    Inverse CDF on a uniform V whose bits are drawn lazily: the weights exp(−a·d_j) are
    bracketed by integer bounds (`_weight_bounds`), the bracket of every boundary
    C_j / Z between bins follows, and V is placed once its interval lies between two
    bracketed boundaries (`_locate`). While it straddles one (probability ~2^-50), more
    bits of V are drawn and the weights recomputed with more digits: the output is
    exactly distributed, with one 64-bit draw and one pass in floats nearly always.
    """
    if len(histogram) != spec.binning.bins:
        raise InvalidParameterValue(
            f"histogram has {len(histogram)} bins, the spec {spec.binning.bins}")
    distances = _mode_distances(histogram) if spec.mode \
        else _distances(histogram, spec.quantile)  # γ_j = a·d_j
    v, v_bits = secrets.randbits(64), 64
    digits = 0  # 0: the float pass; then decimal digits of the exact pass
    while True:
        low, high = _weight_bounds(distances, spec.rate, digits)
        found = _locate(v, v_bits, low, high)
        if found is not None:
            return found
        v, v_bits = (v << 64) | secrets.randbits(64), v_bits + 64
        digits += 40


# Float pass: a has at most 48 significant bits (exact as a float), d becomes a float within
# 2^-53 relative, so the float γ = a·d is within 2^-52 relative of the true one, and numpy's
# exp is within an ulp or two; the bounds allow γ·2^-50 + 2^-40 of relative error, more
# than both. The scale 2^52 keeps the sums of 1,024 bounds inside int64.
_FLOAT_SCALE = 2.0 ** 52
_FLOAT_SLACK = 2.0 ** -40


def _weight_bounds(distances: np.ndarray, rate: Fraction, digits: int
                   ) -> tuple[list[int], list[int]]:
    """Integers lo_j ≤ exp(−γ_j)·S ≤ hi_j for γ_j = rate·distances[j], with S = 2^52
    (digits = 0, the float pass) or 10^digits."""
    if digits == 0 and distances.dtype == np.int64 and float(rate) == rate:
        g = distances.astype(np.float64) * float(rate)
        w = np.exp(-g) * _FLOAT_SCALE
        slack = g * 2.0 ** -50 + _FLOAT_SLACK
        low = np.maximum(np.floor(w * (1 - slack)) - 1, 0)
        high = np.ceil(w * (1 + slack)) + 1
        return [int(x) for x in low], [int(x) for x in high]
    digits = max(digits, 20)
    numerators = [rate.numerator * int(d) for d in distances.tolist()]
    denominator = rate.denominator
    low, high = [], []
    # Exact pass: decimal's exp is correctly rounded and the quotient γ is rounded once, at
    # `extra` more digits than asked, enough for γ's integer digits and a guard of 10
    extra = 10 + len(str(max(numerators) // denominator + 1))
    context = decimal.Context(prec=digits + extra, Emin=decimal.MIN_EMIN,
                              Emax=decimal.MAX_EMAX)
    scale = 10 ** digits
    for n in numerators:
        x = context.divide(decimal.Decimal(n), decimal.Decimal(denominator))
        w = Fraction(context.exp(-x)) * scale
        # relative error ≤ (γ + 1)·10^-(precision − 1) ≤ 2·10^-(digits + 9); plus one unit
        margin = w * 2 / 10 ** (digits + 9) + 1
        low.append(max(0, math.floor(w - margin)))
        high.append(math.ceil(w + margin))
    return low, high


def _locate(v: int, v_bits: int, low: Sequence[int], high: Sequence[int]) -> int | None:
    """The bin j with C_{j−1}/Z ≤ V < C_j/Z for every weight vector within the bounds, V
    anywhere in [v, v + 1) / 2^v_bits; None when the bounds cannot decide.

    C_j / Z = C_j / (C_j + R_j) grows with C_j and falls with the rest R_j, so boundary j
    lies in [lo C_j / (lo C_j + hi R_j), hi C_j / (hi C_j + lo R_j)].
    """
    bins = len(low)
    low_prefix = list(itertools.accumulate(low, initial=0))
    high_prefix = list(itertools.accumulate(high, initial=0))
    low_total, high_total = low_prefix[-1], high_prefix[-1]
    unit = 1 << v_bits

    def below_boundary(j: int) -> bool:
        """V's whole interval lies below boundary j (after bin j) for sure."""
        if j == bins - 1:
            return True
        c, r = low_prefix[j + 1], high_total - high_prefix[j + 1]
        return (v + 1) * (c + r) <= unit * c

    def above_boundary(j: int) -> bool:
        """V's whole interval lies at or above boundary j for sure."""
        if j < 0:
            return True
        c, r = high_prefix[j + 1], low_total - low_prefix[j + 1]
        return v * (c + r) >= unit * c

    # the first bin whose upper boundary is surely above V's interval
    lo, hi = 0, bins - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if below_boundary(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo if above_boundary(lo - 1) else None


def release_quantile(spec: QuantileSpec, histogram: Sequence[int]) -> float:
    """The released quantile: the point of a bin drawn by the exponential mechanism."""
    return spec.binning.point(sample_bin(spec, histogram))


def error_phrase(rows: float, mode: bool, digits: int = 4) -> str:
    """`rank_error` in words: of a quantile's rank, or of a mode's count.

    >>> error_phrase(10.6, False), error_phrase(10.6, True)
    ('rank within ± 10.6 rows of p·n', 'count within 10.6 rows of the most frequent')
    """
    if mode:
        return f"count within {rows:.{digits}g} rows of the most frequent"
    return f"rank within ± {rows:.{digits}g} rows of p·n"


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
