"""Quantiles by the exponential mechanism (dpproxy.quantiles) and end to end.

Statistical tests and their false-failure rates (a correct implementation fails this file
by bad luck with probability < 1e-6 per run):

* the two chi-square goodness-of-fit tests of the sampler use the threshold
  scipy.stats.chi2.isf(4e-7, df): false failure 4e-7 each (asymptotically; with every
  expected count above 250 the chi-square approximation is accurate at that level);
* end-to-end checks run at confidence 1 − 1e-9 per released quantile (the reported rank
  error is a proven bound, see `rank_error`), fewer than 200 quantiles per run: < 2e-7.
"""

from __future__ import annotations

import decimal
import itertools
import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from scipy.stats import chi2
from sqlglot import exp, parse_one

import dpproxy
from dpproxy import quantiles
from dpproxy.analyze import Analysis, analyze
from dpproxy.errors import InvalidParameterValue
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import load_policy
from dpproxy.quantiles import (
    MAX_BINS,
    Binning,
    QuantileSpec,
    binning_for,
    decode_histogram,
    probabilities,
    rank_error,
    release_quantile,
    sample_bin,
    utilities,
)
from dpproxy.rewrite import rewrite
from dpproxy.session import Engine

from .conftest import DEMO_POLICY, PolicyFactory

BOTH = pytest.mark.parametrize("backend_kind", ["duckdb", "postgres"])
BIG = {"budget = { epsilon = 10.0, delta = 1e-5 }": "budget = { epsilon = 1e6, delta = 0.5 }"}
CONFIDENCE = 1 - 1e-9


# -- the mechanism, without data --------------------------------------------------------------

def spec(p: Fraction, epsilon: float, bins: int, groups: int = 1, rows: int = 1
         ) -> QuantileSpec:
    return QuantileSpec(p, epsilon, groups, rows, Binning(0.0, bins - 1.0, bins, True))


@pytest.mark.parametrize(("histogram", "p", "expected"), [
    # n = 4, p·n = 2: the bin holding ranks [1, 3] contains 2
    ((1, 0, 2, 1), Fraction(1, 2), [-1, -1, 0, -1]),
    # p = 0: every bin whose rank interval starts at 0 (the empty ones before the minimum
    # too) is as good as the minimum's bin
    ((0, 0, 3, 1), Fraction(0), [0, 0, 0, -3]),
    # p = 1: the maximum's bin and the empty ones after it; bin 0 is 4 rows away
    ((0, 3, 1, 0, 0), Fraction(1), [-4, -1, 0, 0, 0]),
    # p·n = 0.9·10 = 9 lies in the last bin's ranks [8, 10]
    ((4, 4, 2), Fraction(9, 10), [-5, -1, 0]),
    # p·n = 0.9·11 = 9.9: distances 5.9 and 1.9 round up
    ((4, 4, 3), Fraction(9, 10), [-6, -2, 0]),
    # p·n = 4/3 lies in bin 2's ranks [1, 2]; distances 1/3 and 2/3 round up to 1
    ((1, 0, 1, 2), Fraction(1, 3), [-1, -1, 0, -1]),
    ((0, 0, 0), Fraction(1, 2), [0, 0, 0]),  # no rows: every bin is equally good
])
def test_utilities_by_hand(histogram: tuple[int, ...], p: Fraction, expected: list[int]
                           ) -> None:
    assert utilities(histogram, p) == expected


def _neighbours(histogram: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Histograms with one row added or removed."""
    for j in range(len(histogram)):
        yield (*histogram[:j], histogram[j] + 1, *histogram[j + 1:])
        if histogram[j] > 0:
            yield (*histogram[:j], histogram[j] - 1, *histogram[j + 1:])


@pytest.mark.parametrize("p", [Fraction(0), Fraction(1, 3), Fraction(1, 2), Fraction(9, 10),
                               Fraction(1)])
def test_utility_sensitivity_is_one_row(p: Fraction) -> None:
    """Exhaustively over all histograms of 4 bins with at most 4 rows per bin: one row
    more or less moves every bin's utility by at most 1 (the privacy argument's step)."""
    for histogram in itertools.product(range(5), repeat=4):
        before = utilities(histogram, p)
        for other in _neighbours(histogram):
            after = utilities(other, p)
            assert max(abs(a - b) for a, b in zip(before, after, strict=True)) <= 1
        assert max(before) == 0  # the bin holding the quantile is always a candidate


def test_exact_probabilities_on_a_tiny_dataset() -> None:
    # ε = 2, one group, one row per unit: a = ε / 2 = 1, so P ∝ exp(u) = e^-1, e^-1, 1, e^-1
    s = spec(Fraction(1, 2), 2.0, 4)
    assert s.rate == 1
    z = 1 + 3 / math.e
    assert probabilities(s, (1, 0, 2, 1)) == pytest.approx([1 / math.e / z, 1 / math.e / z,
                                                            1 / z, 1 / math.e / z], rel=1e-12)


def test_probabilities_are_epsilon_dp_per_group() -> None:
    """For every neighbouring pair of small histograms, each bin's probability changes by a
    factor of at most e^ε_group (the exponential mechanism's guarantee, checked exactly)."""
    s = spec(Fraction(1, 2), 0.7, 4)
    for histogram in itertools.product(range(4), repeat=4):
        before = probabilities(s, histogram)
        for other in _neighbours(histogram):
            after = probabilities(s, other)
            ratio = max(max(a / b, b / a) for a, b in zip(before, after, strict=True))
            assert ratio <= math.exp(0.7) * (1 + 1e-12)


def test_epsilon_is_divided_over_groups_and_rows() -> None:
    s = spec(Fraction(1, 2), 1.2, 8, groups=4, rows=3)
    assert s.epsilon_per_group == pytest.approx(0.3)
    assert s.utility_sensitivity == 3
    # a = ε / (2 · groups · rows), rounded down (never more privacy loss than planned)
    assert s.rate <= Fraction(1.2) / 24
    assert float(s.rate) == pytest.approx(0.05, rel=1e-13)
    assert s.rho == pytest.approx(1.2 ** 2 / 8)


CHI_SQUARE_FAILURE = 4e-7


def _chi_square(s: QuantileSpec, histogram: tuple[int, ...], n: int) -> None:
    expected_p = probabilities(s, histogram)
    counts = [0] * len(histogram)
    for _ in range(n):
        counts[sample_bin(s, histogram)] += 1
    expected = [n * q for q in expected_p]
    assert min(expected) > 250
    statistic = sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))
    assert statistic < chi2.isf(CHI_SQUARE_FAILURE, df=len(histogram) - 1), (counts, expected)


def test_sampler_matches_exact_probabilities_chi_square() -> None:
    """N = 40,000 draws on a fixed histogram; false-failure rate 4e-7."""
    s = spec(Fraction(1, 2), 1.0, 6)  # a = 1/2
    histogram = (2, 1, 1, 1, 0, 3)  # n = 8, p·n = 4
    assert utilities(histogram, s.quantile) == [-2, -1, 0, 0, -1, -1]
    _chi_square(s, histogram, 40_000)


def test_sampler_exact_pass_matches_exact_probabilities_chi_square(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the float pass's bounds made useless, nearly every draw is placed by the
    decimal (exact) pass: its distribution is the mechanism's too. N = 6,000 draws;
    false-failure rate 4e-7."""
    monkeypatch.setattr(quantiles, "_FLOAT_SLACK", 0.99)
    passes: list[int] = []
    bounds = quantiles._weight_bounds

    def counted(distances: np.ndarray, rate: Fraction, digits: int
                ) -> tuple[list[int], list[int]]:
        passes.append(digits)
        return bounds(distances, rate, digits)

    monkeypatch.setattr(quantiles, "_weight_bounds", counted)
    s = spec(Fraction(1, 3), 1.5, 5)  # a = 3/4
    histogram = (1, 2, 0, 1, 1)  # n = 5, p·n = 5/3
    assert utilities(histogram, s.quantile) == [-1, 0, -2, -2, -3]
    _chi_square(s, histogram, 6_000)
    assert sum(digits > 0 for digits in passes) > 0.9 * 6_000


def test_weight_bounds_bracket_the_true_weights() -> None:
    """Checked against 300-digit decimal arithmetic, for the float and the exact passes."""
    rate = Fraction(3, 2 ** 7)
    distances = np.array([0, 1, 2, 77, 1000, 10 ** 6], dtype=np.int64)
    context = decimal.Context(prec=300, Emin=decimal.MIN_EMIN)
    for digits in (0, 40, 80):
        low, high = quantiles._weight_bounds(distances, rate, digits)
        scale = 2 ** 52 if digits == 0 else 10 ** digits
        for d, lo, hi in zip(distances.tolist(), low, high, strict=True):
            gamma = context.divide(decimal.Decimal(3 * d), decimal.Decimal(2 ** 7))
            true = Fraction(context.exp(-gamma)) * scale
            assert lo <= true <= hi
            assert hi - lo <= max(4, true * Fraction(1, 2 ** 30))  # and they are tight


def test_locate_decides_only_when_the_bounds_allow() -> None:
    # exact weights 1, 1: the boundary is 1/2, which belongs to the upper bin
    half = 1 << 63
    assert quantiles._locate(half, 64, [1, 1], [1, 1]) == 1
    assert quantiles._locate(half - 1, 64, [1, 1], [1, 1]) == 0
    assert quantiles._locate(0, 64, [1, 1], [1, 1]) == 0
    assert quantiles._locate((1 << 64) - 1, 64, [1, 1], [1, 1]) == 1
    # loose bounds: the boundary is somewhere in [1/3, 2/3], so V near 1/2 is undecided
    assert quantiles._locate(half, 64, [1, 1], [2, 2]) is None
    assert quantiles._locate(1 << 61, 64, [1, 1], [2, 2]) == 0  # V ≈ 1/8
    # a zero-weight bin is never chosen, even at its boundary
    assert quantiles._locate(half, 64, [1, 0, 1], [1, 0, 1]) == 2


def test_sampler_picks_the_quantile_at_large_epsilon() -> None:
    # a = 500: any other bin has probability < 10 · e^-500 per draw
    s = spec(Fraction(9, 10), 1000.0, 10)
    histogram = (5, 5, 5, 5, 5, 5, 5, 5, 5, 5)  # p·n = 45: bin 8 covers ranks [40, 45]...
    best = [j for j, u in enumerate(utilities(histogram, s.quantile)) if u == 0]
    assert best == [8, 9]  # ...and bin 9 [45, 50]: both hold rank 45
    assert {sample_bin(s, histogram) for _ in range(200)} <= set(best)
    assert release_quantile(s, histogram) in (8.0, 9.0)


def test_sampler_rejects_a_histogram_of_the_wrong_size() -> None:
    with pytest.raises(InvalidParameterValue):
        sample_bin(spec(Fraction(1, 2), 1.0, 4), (1, 2, 3))


@pytest.mark.parametrize(("lower", "upper", "integer", "bins", "points"), [
    (17, 90, True, 74, True),
    (0, 1023, True, 1024, True),
    (0, 1024, True, MAX_BINS, False),  # 1025 integers: equal-width bins instead
    (0, 500, False, MAX_BINS, False),
    (1.5, 9.5, True, MAX_BINS, False),  # whole-number values between fractional bounds
    (3, 3, False, 1, False),
])
def test_binning(lower: float, upper: float, integer: bool, bins: int, points: bool) -> None:
    b = binning_for(lower, upper, integer)
    assert (b.bins, b.integer_points) == (bins, points)
    values = [b.point(j) for j in range(b.bins)]
    assert all(lower <= v <= upper for v in values)
    assert values == sorted(values)
    if points:
        assert values == list(range(int(lower), int(upper) + 1))
    elif bins > 1:
        assert values[0] == pytest.approx(lower + (upper - lower) / bins / 2)


def test_binning_needs_finite_bounds() -> None:
    with pytest.raises(InvalidParameterValue):
        binning_for(0, math.inf, False)


def test_decode_histogram_adds_pairs_and_skips_null_bins() -> None:
    assert decode_histogram([[2, 5], [0, 1], [2, 3], [None, 7]], 4) == (1, 0, 8, 0)
    assert decode_histogram(None, 3) == (0, 0, 0)


def test_rank_error_is_a_bound_of_the_exact_distribution() -> None:
    """P(distance > rank_error) computed exactly is at most 1 − confidence."""
    s = spec(Fraction(1, 2), 0.5, 50)
    histogram = tuple((j * 7) % 5 for j in range(50))
    probs = probabilities(s, histogram)
    for confidence in (0.5, 0.9, 0.99):
        t = rank_error(s, confidence)
        miss = sum(q for q, u in zip(probs, utilities(histogram, s.quantile), strict=True)
                   if -u > t)
        assert miss <= 1 - confidence


# -- the plan and the rewrite, without data -----------------------------------------------------

def plan_of(sql: str, epsilon: float = 1.0, mechanism: str = "laplace") -> QueryPlan:
    policy = load_policy(DEMO_POLICY)
    analysis = analyze(parse_one(sql, read="postgres"), policy, policy.analysts["alice"])
    assert isinstance(analysis, Analysis)
    return plan_query(analysis, QueryOptions(epsilon, 1e-7, mechanism))  # type: ignore[arg-type]


def test_plan_gives_the_quantile_a_share_and_its_zcdp() -> None:
    plan = plan_of("SELECT MEDIAN(age), COUNT(*) FROM adult", epsilon=1.0)
    quantile, count = plan.measurements
    assert quantile.noise is None and quantile.quantile is not None
    assert quantile.quantile.epsilon == 0.5 and quantile.quantile.quantile == Fraction(1, 2)
    assert quantile.sensitivity == 1
    assert count.noise is not None and count.noise.epsilon == 0.5
    assert plan.cost.epsilon == 1.0 and plan.cost.delta == 0.0
    assert plan.loss.rho == pytest.approx(0.5 ** 2 / 2 + 0.5 ** 2 / 8)


def test_quantile_alone_is_charged() -> None:
    plan = plan_of("SELECT MAX(age) FROM adult", epsilon=0.3)
    assert plan.cost.epsilon == 0.3
    assert plan.loss.rho == pytest.approx(0.3 ** 2 / 8)
    assert plan.measurements[0].quantile.quantile == 1  # type: ignore[union-attr]


def test_quantile_under_gaussian_is_still_the_exponential_mechanism() -> None:
    plan = plan_of("SELECT MIN(hours_per_week) FROM adult", mechanism="gaussian")
    (m,) = plan.measurements
    assert m.noise is None and m.quantile is not None and m.quantile.epsilon == 1.0


def test_private_keys_divide_epsilon_over_groups_a_unit_touches() -> None:
    # visits: ≤ 4 days per person, ≤ 10 visits per day; ε shared with partition selection
    plan = plan_of("SELECT day, MEDIAN(amount) FROM visits GROUP BY day", epsilon=2.0)
    spec_ = plan.measurements[0].quantile
    assert spec_ is not None and plan.selection is not None
    assert (spec_.epsilon, spec_.max_groups, spec_.max_rows) == (1.0, 4, 10)
    assert spec_.epsilon_per_group == 0.25
    assert float(spec_.rate) == pytest.approx(1.0 / (2 * 4 * 10), rel=1e-13)
    assert spec_.binning.bins == MAX_BINS and not spec_.binning.integer_points


@pytest.mark.parametrize("sql", [
    "SELECT PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY age) FROM adult",
    "SELECT PERCENTILE_CONT(0.75) WITHIN GROUP (ORDER BY age DESC) FROM adult",
])
def test_descending_order_is_the_complementary_quantile(sql: str) -> None:
    plan = plan_of(sql)
    assert plan.measurements[0].quantile.quantile == Fraction(1, 4)  # type: ignore[union-attr]


def test_rewrite_returns_bin_counts_not_values() -> None:
    """The statement aggregates per group and bin, then collects (bin, rows) pairs."""
    plan = plan_of("SELECT sex, MEDIAN(age), COUNT(*) FROM adult GROUP BY sex")
    for dialect in ("duckdb", "postgres"):
        sql = rewrite(plan, dialect).sql
        tree = parse_one(sql.replace("$1", "'salt'"), read=dialect)
        groupings = [[e.sql() for e in s.args["group"].expressions]
                     for s in tree.find_all(exp.Select) if s.args.get("group") is not None]
        assert groupings == [["k0"], ["k0", "v0"]]
        # the outermost SELECT returns keys, the (bin, rows) pairs and the count: no values
        assert isinstance(tree.selects[1].this, exp.ArrayAgg)
        assert tree.selects[1].this.this.sql(dialect) in ("[v0, __bin_rows]",
                                                          "ARRAY[v0, __bin_rows]")


# -- end to end: DuckDB and PostgreSQL --------------------------------------------------------

@pytest.fixture(scope="module")
def exact_db(demo_database: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[duckdb.DuckDBPyConnection]:
    """The demo data read directly, for the noiseless answers (never through dpproxy)."""
    copy = tmp_path_factory.mktemp("exact_quantiles") / "demo.duckdb"
    copy.write_bytes(demo_database.read_bytes())
    con = duckdb.connect(str(copy), read_only=True)
    yield con
    con.close()


def rank_distance(con: duckdb.DuckDBPyConnection, column: str, where: str, value: float,
                  p: float) -> float:
    """How far p·n lies from the ranks [#rows < value, #rows <= value] of the data."""
    below, upto, n = con.execute(
        f"SELECT COUNT(*) FILTER (WHERE {column} < ?), COUNT(*) FILTER (WHERE {column} <= ?),"
        f" COUNT(*) FROM adult WHERE {where}", [value, value]).fetchone()
    return max(below - p * n, p * n - upto, 0)


@BOTH
def test_quantiles_land_within_their_rank_error(make_policy: PolicyFactory,
                                                exact_db: duckdb.DuckDBPyConnection) -> None:
    """Adult has one row per person and max_rows = max_groups = 1, so the bounded data is
    all of it. Each released quantile's rank is within its reported rank error (a bound at
    confidence 1 − 1e-9) of p·n in its group; at ε = 1000 that error is below one row."""
    with dpproxy.connect(make_policy(replace=BIG), analyst="alice", epsilon=1000,
                         confidence=CONFIDENCE) as conn:
        cur = conn.cursor()
        cur.execute("SELECT sex, MEDIAN(age) AS med, PERCENTILE_CONT(0.9) WITHIN GROUP "
                    "(ORDER BY hours_per_week) AS p90, MIN(age) AS lo, MAX(age) AS hi "
                    "FROM adult GROUP BY sex")
        assert [d[0] for d in cur.description] == ["sex", "med", "p90", "lo", "hi"]
        assert cur.description[1][1] == dpproxy.NUMBER
        rows = cur.fetchall()
        accuracy = cur.accuracy
        assert cur.intervals[0][1:] == (None, None, None, None)  # no value interval
    assert [r[0] for r in rows] == ["Female", "Male"]
    for acc in accuracy[1:]:
        assert acc is not None and acc.mechanism == "exponential"
        assert acc.epsilon == 250 and acc.half_width is None
        assert acc.rank_error is not None and acc.rank_error < 1
        assert "rank within" in acc.describe()
    for sex, med, p90, lo, hi in rows:
        where = f"sex = '{sex}'"
        # MEDIAN is double precision, as PostgreSQL's percentile_cont; MIN and MAX keep
        # the column's whole numbers
        assert isinstance(med, float) and med.is_integer() and 17 <= med <= 90
        assert isinstance(lo, int) and isinstance(hi, int)
        for column, value, p, acc in (("age", med, 0.5, accuracy[1]),
                                      ("hours_per_week", p90, 0.9, accuracy[2]),
                                      ("age", lo, 0.0, accuracy[3]),
                                      ("age", hi, 1.0, accuracy[4])):
            assert rank_distance(exact_db, column, where, value, p) <= acc.rank_error
    # the demo's ages span the whole policy range: MIN and MAX are the bounds exactly
    assert [(r[3], r[4]) for r in rows] == [(17, 90), (17, 90)]


@BOTH
def test_real_valued_quantile_is_a_bin_midpoint(make_policy: PolicyFactory,
                                                exact_db: duckdb.DuckDBPyConnection) -> None:
    """capital_gain clamped to [0, 5000] has more than 1,024 integers: equal bins of width
    5000/1024, released at their midpoints, within the rank error at confidence 1 − 1e-9."""
    with dpproxy.connect(make_policy(replace=BIG), analyst="alice", epsilon=1000,
                         confidence=CONFIDENCE) as conn:
        cur = conn.cursor()
        cur.execute("SELECT PERCENTILE_CONT(0.95) WITHIN GROUP (ORDER BY "
                    "LEAST(GREATEST(capital_gain, 0), 5000)) FROM adult")
        (value,), = cur.fetchall()
        acc = cur.accuracy[0]
    width = 5000 / 1024
    assert isinstance(value, float)
    index = round(value / width - 0.5)
    assert value == pytest.approx((index + 0.5) * width, abs=1e-9)
    # the rank interval of the rows in that bin
    below, upto, n = exact_db.execute(
        "WITH b AS (SELECT LEAST(FLOOR(LEAST(capital_gain, 5000) * (1024 / 5000)), 1023) AS j "
        "FROM adult) SELECT COUNT(*) FILTER (WHERE j < ?), COUNT(*) FILTER (WHERE j <= ?), "
        "COUNT(*) FROM b", [index, index]).fetchone()
    assert max(below - 0.95 * n, 0.95 * n - upto, 0) <= acc.rank_error < 1


@BOTH
def test_budget_charged_is_the_plan_cost_and_explain_is_free(make_policy: PolicyFactory
                                                              ) -> None:
    with Engine.from_path(make_policy(replace=BIG)) as engine:
        session = engine.session("alice", epsilon=0.8)
        before = session.remaining()
        lines = [r[0] for r in session.execute(
            "EXPLAIN SELECT sex, MEDIAN(age), COUNT(*) FROM adult GROUP BY sex").rows]
        assert session.remaining() == before and engine.ledger.history() == []
        text = "\n".join(lines)
        assert "exponential mechanism over 74 one-integer bins" in text
        assert "ε=0.4 (ε=0.4 per group, ≤ 1 group(s) per unit)" in text
        assert "split evenly over 2 noisy statistic(s)" in text
        assert "ARRAY_AGG" in text.upper()

        plan = plan_of("SELECT sex, MEDIAN(age), COUNT(*) FROM adult GROUP BY sex", 0.8)
        result = session.execute("SELECT sex, MEDIAN(age), COUNT(*) FROM adult GROUP BY sex")
        assert result.cost == plan.cost
        after = session.remaining()
        assert after.epsilon == pytest.approx(before.epsilon - 0.8, abs=1e-12)
        assert after.delta == before.delta
        assert len(engine.ledger.history()) == 1
        # the repeated query is the cached answer, at no further cost
        again = session.execute("SELECT sex, MEDIAN(age), COUNT(*) FROM adult GROUP BY sex")
        assert again.rows == result.rows and session.remaining() == after


def test_a_subnormal_epsilon_is_refused_before_the_charge(engine: Engine) -> None:
    """ε = 5e-324 made the sampling rate round to 0: the quantile was charged, then its
    release failed (1 / rate) with an internal error. Refused while planning (22023)."""
    session = engine.session("alice", epsilon=5e-324)
    for sql in ("SELECT MEDIAN(age) FROM adult",
                "SELECT MODE() WITHIN GROUP (ORDER BY sex) FROM adult"):
        with pytest.raises(InvalidParameterValue, match="too small"):
            session.execute(sql)
    assert engine.ledger.history() == []


@BOTH
def test_empty_group_gets_a_value_from_no_data(make_policy: PolicyFactory) -> None:
    """A public key without rows still gets a quantile: drawn uniformly over the bins (all
    equally good without rows), so its presence says nothing the noise does not cover."""
    with Engine.from_path(make_policy(replace=BIG)) as engine:
        session = engine.session("alice", epsilon=1000)
        result = session.execute("SELECT sex, MEDIAN(age) FROM adult WHERE age > 200 "
                                 "GROUP BY sex")
        assert [r[0] for r in result.rows] == ["Female", "Male"]
        assert all(17 <= r[1] <= 90 for r in result.rows)


HISTOGRAM_QUERIES = [
    # (query, DuckDB SQL of the exact per-group (key, bin, rows) triples)
    ("SELECT MEDIAN(age) FROM adult",
     "SELECT NULL, age - 17, COUNT(*) FROM adult GROUP BY ALL"),
    ("SELECT sex, MEDIAN(hours_per_week) FROM adult WHERE age > 40 GROUP BY sex",
     "SELECT sex, hours_per_week - 1, COUNT(*) FROM adult WHERE age > 40 GROUP BY ALL"),
    ("SELECT MAX(capital_gain) FROM adult",
     "SELECT NULL, LEAST(FLOOR(capital_gain * (1024 / 99999)), 1023), COUNT(*) FROM adult "
     "GROUP BY ALL"),
    ("SELECT sex, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY LEAST(GREATEST("
     "education_num * 2.5, 0), 40)) FROM adult GROUP BY sex",
     # the clamp's own bounds are [2.5, 40]: education_num >= 1
     "SELECT sex, LEAST(FLOOR((CAST(education_num * 2.5 AS DOUBLE) - 2.5) * (1024 / 37.5)), "
     "1023), COUNT(*) FROM adult GROUP BY ALL"),
]


@pytest.mark.parametrize(("sql", "exact_sql"), HISTOGRAM_QUERIES)
def test_exact_histograms_agree_on_duckdb_and_postgres(
        sql: str, exact_sql: str, make_policy: PolicyFactory, pg_demo_dsn: str,
        exact_db: duckdb.DuckDBPyConnection) -> None:
    """The backend's per-group histograms, read before any noise, are the same on both
    backends and equal to the histograms computed directly. (Adult has one row per person:
    contribution bounding keeps every row, so they are deterministic.)"""
    expected: dict[object, dict[int, int]] = {}
    for key, index, rows in exact_db.execute(exact_sql).fetchall():
        expected.setdefault(key, {})[int(index)] = rows
    plan = plan_of(sql)
    histograms = {}
    for kind in ("duckdb", "postgres"):
        policy = (make_policy(text=DEMO_POLICY.read_text()) if kind == "duckdb"
                  else _postgres_policy(make_policy, pg_demo_dsn))
        with Engine.from_path(policy) as engine:
            rewritten = rewrite(plan, engine.backend.dialect)
            rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
        keyed = len(rewritten.key_columns)
        bins = plan.measurements[0].quantile.binning.bins  # type: ignore[union-attr]
        histograms[kind] = {
            (row[0] if keyed else None): decode_histogram(row[keyed], bins) for row in rows}
    assert histograms["duckdb"] == histograms["postgres"]
    for key, dense in histograms["duckdb"].items():
        assert {j: c for j, c in enumerate(dense) if c} == expected[key]


def _postgres_policy(make_policy: Any, dsn: str) -> Path:
    text = DEMO_POLICY.read_text()
    start = text.index("[backend]")
    end = text.index("[ledger]")
    text = text[:start] + f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n\n' + text[end:]
    return make_policy(text=text)


@BOTH
def test_private_keys_pass_partition_selection_with_quantiles(
        make_policy: PolicyFactory, exact_db: duckdb.DuckDBPyConnection) -> None:
    """GROUP BY a key without public values: groups pass partition selection on a unit count
    summed over bins (each unit's first row), which at ε = 1000 equals the exact count
    (Laplace scale 0.003 per count: |noise| >= 1 has probability < e^-300). Every age the
    data has at least 50 people of is released (the threshold is far lower), and each
    group's median lies within its rank error (confidence 1 − 1e-9 per group)."""
    exact = dict(exact_db.execute("SELECT age, COUNT(*) FROM adult GROUP BY age").fetchall())
    with Engine.from_path(make_policy(replace=BIG)) as engine:
        session = engine.session("alice", epsilon=1000, confidence=CONFIDENCE)
        result = session.execute("SELECT age, MEDIAN(hours_per_week) AS m, "
                                 "COUNT(DISTINCT person_id) AS units FROM adult GROUP BY age")
    released = {r[0]: r for r in result.rows}
    assert {a for a, n in exact.items() if n >= 50} <= set(released) <= set(exact)
    bound = result.accuracy[1].rank_error  # type: ignore[union-attr]
    assert bound is not None and bound < 1
    for age, median, units in released.values():
        assert units == exact[age]
        assert rank_distance(exact_db, "hours_per_week", f"age = {age}", median, 0.5) <= bound


def test_median_and_percentile_share_one_cached_answer_under_their_own_names(
        make_policy: PolicyFactory) -> None:
    """MEDIAN(x) is PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY x): the repeat is the first
    answer at no cost, but its column is named as PostgreSQL names it."""
    with Engine.from_path(make_policy(replace=BIG)) as engine:
        session = engine.session("alice", epsilon=0.5)
        first = session.execute("SELECT MEDIAN(age) FROM adult")
        again = session.execute(
            "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) FROM adult")
    assert first.columns == ("median",) and again.columns == ("percentile_cont",)
    assert again.rows == first.rows and again.cost is None
