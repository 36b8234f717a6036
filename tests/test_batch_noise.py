"""The vector samplers (dpproxy.batch_noise) and release's column-wise fast paths.

Statistical tests use fixed sample sizes and distribution-free bounds (DKW for CDFs,
Hoeffding for frequencies; see tests/test_mechanisms.py), each with a false-failure
probability <= 1e-7; there are 9 of them, so a correct implementation fails this file
with probability <= 9e-7 per run. The other tests are deterministic.
"""

from __future__ import annotations

import datetime as dt
import inspect
import math
import random
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from dpproxy import batch_noise as b
from dpproxy import mechanisms as m
from dpproxy import release as r
from dpproxy.analyze import GroupKey
from dpproxy.analyze.aggregates import RULES, Statistic, combine, interval
from dpproxy.analyze.keys import normalize_key
from dpproxy.errors import InvalidParameterValue
from dpproxy.policy import ColumnPolicy

from .test_mechanisms import (
    bernstein_margin,
    dkw_margin,
    gaussian_pmf,
    hoeffding_margin,
    ks_statistic,
    laplace_cdf,
    table_cdf,
)

FAILURE = 1e-7  # per statistical test


# ------------------------------------------------------------------------------- samplers


def test_discrete_laplace_distribution() -> None:
    """DKW against the exact discrete Laplace CDF, all scales drawn in one batch (each takes
    its own accepted trials): scales 1/3, 0.7, 1, 2, 40, 12345678/7 and a 48-bit grid
    parameter. n = 40000 per scale, failure 1e-7/7 each. False-failure rate <= 1e-7."""
    scales = [Fraction(1, 3), Fraction(7, 10), Fraction(1), Fraction(2), Fraction(40),
              Fraction(12345678, 7), Fraction(117281240296107, 35184372088832)]
    n = 40000
    eta = dkw_margin(n, FAILURE / len(scales))
    draws = b.discrete_laplace([(s.numerator, s.denominator, n) for s in scales])
    for scale, noise in zip(scales, draws, strict=True):
        assert noise.size == n and noise.dtype == np.int64
        stat = ks_statistic(noise.tolist(), laplace_cdf(float(scale)))
        assert stat <= eta, (scale, stat, eta)


def test_discrete_gaussian_distribution() -> None:
    """DKW against the exact discrete Gaussian CDF for σ² = 1/10, 1, 10, 500 and 123456.789,
    in one batch. n = 40000 per σ², failure 1e-7/5 each. False-failure rate <= 1e-7."""
    variances = [Fraction(1, 10), Fraction(1), Fraction(10), Fraction(500),
                 Fraction(123456789, 1000)]
    n = 40000
    eta = dkw_margin(n, FAILURE / len(variances))
    draws = b.discrete_gaussian([(v.numerator, v.denominator, n) for v in variances])
    for sigma_sq, noise in zip(variances, draws, strict=True):
        assert noise.size == n
        stat = ks_statistic(noise.tolist(), table_cdf(*gaussian_pmf(float(sigma_sq))))
        assert stat <= eta, (sigma_sq, stat, eta)


# (t, s) of P(x) ∝ exp(-|x|·s/t): period t/gcd(t, s) = 5; 20 with s/gcd = 3; s > t; and a
# period longer than any least (every lane draws whole)
REACHING_SCALES = [(5, 1), (40, 6), (3, 10), (12345678, 7)]
REACHING_LEAST = [-7, 0, 1, 4, 5, 11, 23, 45]


def test_laplace_reaching_distribution() -> None:
    """discrete_laplace_reaching against the law of a whole draw kept where Z >= least:
    per (scale, least), how often a lane is kept (Bernstein, with the variance of the exact
    probability: rare keeps too are checked) and the kept draws' CDF, that of Z given
    Z >= least (DKW on the n kept, which given n are i.i.d. from it). 20000 lanes per least,
    all leasts of a scale in one shuffled call; 4 · 8 · 2 tests, failure 1e-7/64 each.
    False-failure rate <= 1e-7."""
    n = 20000
    tests = len(REACHING_SCALES) * len(REACHING_LEAST) * 2
    for t, s in REACHING_SCALES:
        least = np.repeat(np.array(REACHING_LEAST, dtype=np.int64), n)
        order = np.array(random.Random(t).sample(range(least.size), least.size))
        least = least[order]
        lanes, z = b.discrete_laplace_reaching(t, s, least)
        assert (np.diff(lanes) > 0).all() and (z >= least[lanes]).all()
        cdf = laplace_cdf(t / s)
        for k in REACHING_LEAST:
            kept = z[least[lanes] == k]
            reach = 1 - float(cdf(np.array([k - 1]))[0])  # P(Z >= k)
            margin = bernstein_margin(n, reach * (1 - reach), 1.0, FAILURE / tests)
            assert abs(kept.size / n - reach) <= margin, \
                (t, s, k, kept.size / n, reach)
            if kept.size:
                def given(x: np.ndarray, k: int = k, reach: float = reach,
                          cdf: Any = cdf) -> np.ndarray:
                    return np.where(x < k, 0.0, (cdf(x) - (1 - reach)) / reach)
                stat = ks_statistic(kept.tolist(), given)
                assert stat <= dkw_margin(kept.size, FAILURE / tests), (t, s, k, stat)


def test_laplace_reaching_draws_whole_only_where_it_may_reach(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane 80 periods below its least asks for no whole draw (it would with probability
    e^-80 each); every lane at or above its least does, once. Leasts too large for int64
    arithmetic leave every lane to a whole draw."""
    asked: list[int] = []
    whole = b.discrete_laplace

    def spy(params: list[tuple[int, int, int]]) -> list[np.ndarray]:
        asked.extend(m for _, _, m in params)
        return whole(params)

    monkeypatch.setattr(b, "discrete_laplace", spy)
    least = np.array([400] * 5000 + [0, -3, -1000], dtype=np.int64)
    lanes, _ = b.discrete_laplace_reaching(5, 1, least)
    assert asked == [3]
    assert set(lanes.tolist()) <= {5000, 5001, 5002}
    asked.clear()
    b.discrete_laplace_reaching(1, 2**61, np.array([2**61, 5], dtype=np.int64))
    assert asked == [2]


def test_release_reaching_is_release_array_at_the_threshold() -> None:
    """release_reaching keeps exactly the values at or above the threshold, with
    release_array's types, on its Laplace path and on the ones it leaves to release_array
    (Gaussian noise, a finer grid, few values, values beyond 2^61)."""
    counts = m.calibrate("laplace", 5.0, 1.0, integer_valued=True)
    gauss = m.calibrate("gaussian", 5.0, 1.0, 1e-6, integer_valued=True)
    sums = m.calibrate("laplace", 2.5, 1.0, integer_valued=False)
    for values, spec, threshold, kind in [
        (list(range(200)), counts, 100, int), (np.arange(200), counts, -5, int),
        (list(range(200)), gauss, 100, int), ([0.5 * i for i in range(200)], sums, 50, float),
        (list(range(10)), counts, 5, int), ([2**62 + i for i in range(100)], counts, 2**62, int),
    ]:
        lanes, noisy = m.release_reaching(values, spec, threshold)  # type: ignore[arg-type]
        assert (np.diff(lanes) > 0).all() and lanes.size == noisy.size
        assert all(type(v) is kind and v >= threshold for v in noisy.tolist())
        # the noise is small next to the spread of these values: those far above are kept,
        # those far below are not, each near its exact value
        exact = [values[i] for i in lanes.tolist()]
        assert all(abs(a - e) < 1000 for a, e in zip(noisy.tolist(), exact, strict=True))
        below = [i for i, v in enumerate(values) if v < threshold - 1000]
        assert not set(below) & set(lanes.tolist())
        assert {i for i, v in enumerate(values) if v > threshold + 1000} <= set(lanes.tolist())


def test_sizes_and_empty_requests() -> None:
    out = b.discrete_laplace([(3, 1, 0), (5, 2, 1), (7, 1, 17)])
    assert [a.size for a in out] == [0, 1, 17]
    assert [a.size for a in b.discrete_gaussian([(2, 1, 0), (9, 4, 3)])] == [0, 3]
    assert b.discrete_laplace([]) == []


def test_below_is_uniform() -> None:
    """_below(b) against the uniform CDF on [0, b): bounds that take the masked words (6,
    7, 120, 2^40 + 3·2^38, 3·2^62, 2^64 − 5) and those taken mod b (3, 5, 9, 1000,
    2^40 + 1, 2^63 + 1). DKW, n = 20000 per bound, failure 1e-7/12 each. False-failure
    rate <= 1e-7."""
    bounds = [6, 7, 120, 2**40 + 3 * 2**38, 3 * 2**62, 2**64 - 5, 3, 5, 9, 1000, 2**40 + 1,
              2**63 + 1]
    n = 20000
    eta = dkw_margin(n, FAILURE / len(bounds))
    for bound in bounds:
        draws = b._below(bound, n)
        assert draws.size == n and draws.dtype.kind == "u" and int(draws.max()) < bound
        # ranks in 1/1000ths of the range: a CDF at integer points, exact for bounds below
        # 1000 and within 1/bound of the uniform's otherwise
        cells = min(bound, 1000)
        scaled = (draws.astype(object) * cells // bound).astype(np.int64)  # exactly
        edges = np.array([-(-(c + 1) * bound // cells) for c in range(cells)], dtype=object)
        cdf = edges.astype(np.float64) / bound  # P(draw < ⌈(c+1)·bound/cells⌉)

        def uniform_cdf(k: np.ndarray, cdf: np.ndarray = cdf, cells: int = cells
                        ) -> np.ndarray:
            return np.where(k < 0, 0.0, cdf[np.clip(k, 0, cells - 1)])

        assert ks_statistic(scaled.tolist(), uniform_cdf) <= eta, bound


def test_first_failed_round_and_geometric() -> None:
    """The first failed round F of von Neumann's Bernoulli(1/k) (P(F > k) = 1/k!), and the
    geometric count G (P(G <= g) = 1 − e^-(g+1)): DKW, n = 100000 each, failure 5e-8 each.
    False-failure rate <= 1e-7."""
    n = 100000
    eta = dkw_margin(n, FAILURE / 2)
    first = b._first_failed_round(n)
    assert first.min() >= 2

    def first_cdf(k: np.ndarray) -> np.ndarray:
        return np.array([1 - 1 / math.factorial(int(x)) if x >= 1 else 0.0 for x in k])

    assert ks_statistic(first.tolist(), first_cdf) <= eta
    runs = b._geometric(n)
    assert runs.size == n and runs.min() >= 0
    assert ks_statistic(runs.tolist(),
                        lambda g: np.where(g >= 0, 1 - np.exp(-(g + 1.0)), 0.0)) <= eta


def test_bernoulli_exp_frequencies() -> None:
    """Bernoulli(exp(-1)), Bernoulli(exp(-u/t)) and the Gaussian's Bernoulli(exp(-(w + r/d)))
    against their probabilities: Hoeffding, n = 40000 per case, 7 cases, failure 1e-7/7
    each. False-failure rate <= 1e-7."""
    n = 40000
    eta = hoeffding_margin(n, FAILURE / 7)
    assert abs(b._bern_exp_minus_one(n).mean() - math.exp(-1)) <= eta
    for u, t in ((0, 5), (3, 10), (2**47 - 1, 2**47)):
        us = np.full(n, u, dtype=np.uint64)
        hits = b._von_neumann(n, lambda lane, us=us, t=t: b._below(t, lane.size) < us[lane]
                              ).mean()
        assert abs(hits - math.exp(-u / t)) <= eta, (u, t, hits)
    for whole, rest, den in ((0, 1, 3), (2, 5, 7), (1, 3**70, 2**112)):
        lo = np.full(n, (rest << 64) // den, dtype=np.uint64)
        hits = b._bern_exp_neg_split(np.full(n, whole, dtype=np.int64), lo, [rest], [den],
                                     np.zeros(n, dtype=np.int64)).mean()
        assert abs(hits - math.exp(-(whole + rest / den))) <= eta, (whole, rest, den)


def test_a_tie_with_the_word_is_settled_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A word below ⌊r·2^64/d⌋ succeeds, above it fails, and a tie (forced here) draws
    Bernoulli((r·2^64 − lo·d)/d): for r/d = 1/3 that is 1/3 (2^64 mod 3 = 1). Hoeffding,
    n = 20000, failure 1e-7."""
    rest, den = 1, 3
    lo = (rest << 64) // den
    for word, expected in ((lo - 1, 1.0), (lo + 1, 0.0)):
        monkeypatch.setattr(b, "_words", lambda k, w=word: np.full(k, w, dtype=np.uint64))
        got = b._bernoulli_ratio(np.full(50, lo, dtype=np.uint64), [rest], [den],
                                 np.zeros(50, dtype=np.int64))
        assert got.mean() == expected
    n = 20000
    monkeypatch.setattr(b, "_words", lambda k: np.full(k, lo, dtype=np.uint64))
    got = b._bernoulli_ratio(np.full(n, lo, dtype=np.uint64), [rest], [den],
                             np.zeros(n, dtype=np.int64))
    assert abs(got.mean() - 1 / 3) <= hoeffding_margin(n, FAILURE)


def test_rounds_past_the_last_digit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lanes whose rounds 2..K all went on (forced) continue one round at a time: with
    x = 1 the first failed round is K + 1 with probability K/(K + 1), and odd K + 1 means
    success, so P(success) = Σ over odd k > K of P(F = k | F > K). Hoeffding, n = 4000 per
    sampler, failure 5e-8 each. False-failure rate <= 1e-7."""
    k = b._K
    p = sum((1 / math.factorial(j - 1) - 1 / math.factorial(j)) * math.factorial(k)
            for j in range(k + 1, k + 40) if j % 2 == 1)
    n = 4000
    monkeypatch.setattr(b, "_first_failed_round",
                        lambda size: np.full(size, k + 1, dtype=np.int64))
    eta = hoeffding_margin(n, FAILURE / 2)
    assert abs(b._bern_exp_minus_one(n).mean() - p) <= eta
    always = b._von_neumann(n, lambda lane: np.ones(lane.size, dtype=bool))
    assert abs(always.mean() - p) <= eta
    never = b._von_neumann(n, lambda lane: np.zeros(lane.size, dtype=bool))
    assert never.all()  # round 1 fails: stop at 1, odd


def test_module_uses_only_the_os_csprng() -> None:
    """No numpy generator, no `random`: only secrets (a guard against a future edit)."""
    source = inspect.getsource(b)
    assert "np.random" not in source and "default_rng" not in source
    assert not hasattr(b, "random")
    assert b.secrets.__name__ == "secrets"


# ------------------------------------------------------------------ snapping and releasing


@pytest.mark.parametrize("gamma", [1.0, 2.0**-4, 2.0**-30])
def test_snapped_is_release_snapping(gamma: float) -> None:
    rng = random.Random(7)
    floats = [rng.uniform(-1e6, 1e6) for _ in range(300)] + [0.5, 1.5, 2.5, -0.5, -2.5, 0.0]
    ints = [rng.randrange(-10**9, 10**9) for _ in range(300)]
    odd: list[Any] = [[True, 1, False], [np.float64(1.5), 2.5], [np.int64(7), 3],
                      [np.float32(0.1), np.float32(-3.75)], [2.0**60, 1.5]]
    for values in (floats, ints, floats + ints, [float(i) for i in ints], *odd):
        got = b.snapped(values, gamma)
        expected = [m._snap(v, gamma) for v in values]
        if got is None:  # only when a snapped value leaves no room for noise in int64
            assert values == odd[-1] and max(map(abs, expected)) >= 2**62
        else:
            assert got.tolist() == expected


@pytest.mark.parametrize("values", [
    [1.0, math.nan], [math.inf, 2.0], [1e308, 1.0], [2**62, 1], [2**70], [Decimal("1.5"), 2.0],
    [1.0, None], ["1.0"], [1.0, 2**60],  # 2^60 is exact as an int, not as a float
])
def test_snapped_leaves_the_rest_to_python(values: list[Any]) -> None:
    assert b.snapped(values, 1.0) is None


def test_release_vectors_types_grid_and_validation() -> None:
    lap = m.calibrate("laplace", 1.0, 1.0, integer_valued=True)
    real = m.calibrate("laplace", 0.37, 1.0, integer_valued=False, changed_outputs=2)
    gauss = m.calibrate("gaussian", 1.0, 1.0, 1e-6, integer_valued=True)
    out = m.release_vectors([([5] * 40, lap), ([123.456, -0.001] * 20, real), ([], lap),
                             ([1.0, 2.0, 3.0], gauss), ([10**30], lap)])
    assert [len(v) for v in out] == [40, 40, 0, 3, 1]
    assert all(type(v) is int for v in out[0] + out[3] + out[4])
    assert all(type(v) is float and (v / real.granularity).is_integer() for v in out[1])
    assert abs(out[4][0] - 10**30) < 10**6  # a big int stays exact
    with pytest.raises(InvalidParameterValue):
        m.release_vectors([([1.0] * 60, lap), ([math.nan], lap)])


def test_release_vectors_noise_distribution() -> None:
    """Three vectors released together (integer Laplace, real Laplace, integer Gaussian):
    each one's noise on its grid has its own law (DKW, n = 20000 each, failure 1e-7/3
    each). False-failure rate <= 1e-7."""
    lap = m.calibrate("laplace", 1.0, 0.5, integer_valued=True)
    real = m.calibrate("laplace", 0.75, 1.5, integer_valued=False)
    gauss = m.calibrate("gaussian", 3.0, 1.0, 1e-6, integer_valued=True)
    n = 20000
    eta = dkw_margin(n, FAILURE / 3)
    out_lap, out_real, out_gauss = m.release_vectors(
        [([1000.0] * n, lap), ([123.456] * n, real), ([-7] * n, gauss)])
    assert ks_statistic([v - 1000 for v in out_lap], laplace_cdf(float(lap.grid_param))) <= eta
    gamma = real.granularity
    noise = [round(v / gamma) - round(123.456 / gamma) for v in out_real]
    assert ks_statistic(noise, laplace_cdf(float(real.grid_param))) <= eta
    noise = [v + 7 for v in out_gauss]
    assert ks_statistic(noise, table_cdf(*gaussian_pmf(float(gauss.grid_param)))) <= eta


# ------------------------------------------------------------------ release's fast paths


@pytest.mark.parametrize("rule,lower,upper", [("count", 0, 0), ("count_units", 0, 0),
                                              ("sum", -5.0, 7.0), ("sum", 0.0, 7.0),
                                              ("sum", -5.0, 0.0)])
def test_single_columns_match_combine_and_interval(rule: str, lower: float, upper: float
                                                   ) -> None:
    stats = [Statistic("sum", None, lower, upper)] if rule == "sum" else [Statistic("count")]
    rng = random.Random(3)
    released = [rng.uniform(-50, 50) for _ in range(500)] + [0.0, -0.0, 3.5, -3.5, math.inf,
                                                             -math.inf, math.nan]
    for column in (released, released[-12:]):  # numpy's path and the short one
        values, intervals = r._single_columns(column, 3.5, RULES[rule].value_range(stats))
        # repr: NaN and the sign of zero must match too
        assert repr(values) == repr([combine(RULES[rule], [v], stats) for v in column])
        assert repr(intervals) == repr([interval(RULES[rule], [v], [3.5], stats)
                                        for v in column])


def test_single_columns_take_arrays_and_round() -> None:
    """Noisy counts arrive as int64 arrays: read as float() reads them, and with `integer`
    rounded as _rounded rounds the list path's values."""
    rng = random.Random(4)
    stats = [Statistic("count")]
    bounds = RULES["count"].value_range(stats)
    ints = [rng.randrange(-60, 2**53) for _ in range(500)] + [0, -1, 2**53 - 1]
    for column in (ints, ints[-12:]):
        array = np.array(column, dtype=np.int64)
        floats = [float(v) for v in column]
        assert repr(r._single_columns(array, 3.5, bounds)) \
            == repr(r._single_columns(floats, 3.5, bounds))
        values, intervals = r._single_columns(array, 3.5, bounds, integer=True)
        assert values == [round(combine(RULES["count"], [v], stats)) for v in floats]
        assert all(type(v) is int for v in values)
        assert repr(intervals) == repr([interval(RULES["count"], [v], [3.5], stats)
                                        for v in floats])


def test_rounded_is_round() -> None:
    rng = random.Random(5)
    values = [rng.uniform(-1e6, 1e6) for _ in range(500)] + [0.5, 1.5, 2.5, -0.5, -2.5, -0.0,
                                                             2.0**61 + 0.5, 1e300]
    for column in (values, values[-8:]):
        got = r._rounded(column)
        assert got == [round(v) for v in column] and all(type(v) is int for v in got)
    with pytest.raises((OverflowError, ValueError)):
        r._rounded([1.0, math.inf])


@pytest.mark.parametrize("groups,plain", [
    ([("b",), ("a",), ("c",), ("aa",)], True),
    ([(3, "x"), (1, "y"), (3, "a"), (2, "z")], True),
    ([("b",), (None,), ("a",)], False),
    ([(1,), (True,), (0,)], False),
    ([(2.5,), (float("nan"),), (1.0,)], True),
    ([], True),
])
def test_plain_keys_sort_in_key_order(groups: list[tuple[object, ...]], plain: bool) -> None:
    assert r._plain_keys(groups) == plain
    if plain:
        assert sorted(groups) == sorted(groups, key=r._key_order)


@dataclass
class _Analysis:  # what _exact_by_group reads of an Analysis
    keys: tuple[GroupKey, ...]


def _reference_exact_by_group(analysis: _Analysis, rows: list[tuple[object, ...]]
                              ) -> dict[tuple[object, ...], tuple[object, ...]]:
    """The row-by-row implementation the column-wise one replaced."""
    count = len(analysis.keys)
    out = {}
    for row in rows:
        key = tuple(r._normalize_key(v, k) for v, k in zip(row[:count], analysis.keys,
                                                             strict=True))
        out[key] = tuple(v if isinstance(v, list) else float(v) if v is not None else 0.0
                         for v in row[count:])  # type: ignore[arg-type]
    return out


def test_exact_by_group_matches_the_row_by_row_reading() -> None:
    from sqlglot import exp
    text = GroupKey("city", ColumnPolicy("city", "text"), None)
    day = GroupKey("day", ColumnPolicy("day", "date"), None)
    real = GroupKey("x", ColumnPolicy("x", "float"), None)
    bucket = GroupKey("b", ColumnPolicy("b", "int"), None, expression=exp.column("age"))
    cases = [
        ((text,), [("a", 3, 2), ("b", 5, 1), (None, 1, 1)]),
        ((text,), [("a", 3.5, 2), ("b", None, Decimal("4")), ("c", True, 1)]),
        ((day, text), [(dt.date(2024, 1, 2), "x", 1), (dt.datetime(2024, 1, 3, 4), "y", 2)]),
        ((real,), [(1, 2), (2.5, 3), (None, 4)]),
        ((bucket,), [(40.0, 1), (Decimal("40"), 2), (41.5, 3)]),  # 40.0 and 40: one key
        ((text,), [("q", [[0, 3], [2, 1]], 5)]),  # a quantile's histogram stays a list
        ((), [(7, 8)]),
        ((text,), []),
    ]
    for keys, rows in cases:
        analysis = _Analysis(keys)
        got = r._exact_by_group(analysis, rows, len(keys))  # type: ignore[arg-type]
        assert got == _reference_exact_by_group(analysis, rows)
        for values in got.values():
            assert all(type(v) in (int, float, list) for v in values)
    assert normalize_key(Decimal("40"), "int") == 40


def test_empty_draws() -> None:
    """Zero-sized requests at every step (a batch whose trials are all rejected asks for
    zero geometric counts)."""
    assert b._below(1000, 0).size == 0 and b._below(2, 0).size == 0
    assert b._geometric(0).size == 0
    assert b._von_neumann(0, lambda lane: np.ones(lane.size, dtype=bool)).size == 0
    assert b._bern_exp_minus_one(0).size == 0
    assert b._first_failed_round(0).size == 0
    empty = np.zeros(0, dtype=np.int64)
    assert b._bern_exp_neg_split(empty, empty.astype(np.uint64), [], [], empty).size == 0


@pytest.mark.parametrize("groups", [
    [("b",), ("a",), ("c",), ("aa",), ("d",)],
    [(3, "x"), (1, "y"), (3, "a"), (2, "z"), (0, "q")],
    [("b",), (None,), ("a",), ("c",), ("e",)],
    [(2,), (True,), (0,), (5,), (4,)],
])
def test_selections_keep_key_order(groups: list[tuple[object, ...]],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Both selections keep the groups reaching the threshold in _key_order's order (with
    the noise replaced by none, to compare with the row-by-row reference)."""
    from types import SimpleNamespace
    monkeypatch.setattr(r, "release_reaching", lambda values, spec, threshold: b.at_least(
        np.array(values), threshold))
    counts = [5, 1, 7, 9, 3]
    exact = {g: (float(c), float(c)) for g, c in zip(groups, counts, strict=True)}
    by_units = SimpleNamespace(noise=None, threshold=3, min_units=0, measurement=None)
    by_count = SimpleNamespace(noise=None, threshold=3, min_units=0, measurement=0)
    expected = sorted((g for g, c in zip(groups, counts, strict=True) if c >= 3),
                      key=r._key_order)
    assert r._selected(by_units, exact)[0] == expected  # type: ignore[arg-type]
    kept, noisy = r._selected(by_count, exact)  # type: ignore[arg-type]
    assert kept == expected and noisy == [exact[g][0] for g in expected]
