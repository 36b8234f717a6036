"""MODE() WITHIN GROUP (ORDER BY x): the exponential mechanism with the count utility
(`dpproxy.quantiles`), over public values, truth values, whole numbers and dates.

Statistical tests and their false-failure rates (a correct implementation fails this file
by bad luck with probability < 1e-6 per run):

* the chi-square goodness-of-fit test of the sampler uses the threshold
  scipy.stats.chi2.isf(4e-7, df): false failure 4e-7 (every expected count is above 250);
* end-to-end checks run at confidence 1 − 1e-9 per released mode (the reported count error
  is a proven bound, see `quantiles.rank_error`), fewer than 100 modes per run: < 1e-7.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from fractions import Fraction
from typing import Any

import psycopg
import pytest
from scipy.stats import chi2

import dpproxy
from dpproxy.quantiles import Binning, QuantileSpec, probabilities, sample_bin, utilities
from dpproxy.session import Engine

from .conftest import PolicyFactory
from .exact import read_directly
from .refusals import assert_refused
from .test_server_support import BIG_BUDGET, ServeFactory

BACKENDS = ("duckdb", "postgres")
CONFIDENCE = 1 - 1e-9


def spec(epsilon: float, bins: int, rows: int = 1) -> QuantileSpec:
    return QuantileSpec(Fraction(0), epsilon, 1, rows, Binning(0.0, bins - 1.0, bins, True),
                        mode=True)


# -- the mechanism, without data --------------------------------------------------------------

def test_count_utilities_by_hand() -> None:
    """Each value's count less the top count: ties share the top."""
    assert utilities((3, 0, 5, 5), Fraction(0), mode=True) == [-2, -5, 0, 0]
    assert utilities((0, 0), Fraction(0), mode=True) == [0, 0]


def test_mode_probabilities_are_epsilon_dp() -> None:
    """For every pair of small histograms one person apart (one person adds rows, up to
    max_rows = 2, and never removes any: the count utility is monotone), each value's
    probability changes by a factor of at most e^ε, checked exactly, at the rate ε / Δu,
    twice the rank utility's; and the bound is tight enough to need monotonicity: a
    replacement (one bin up, another down) exceeds it."""
    s = spec(0.7, 4, rows=2)
    assert s.rate == pytest.approx(0.35, rel=1e-12)
    worst = 0.0
    for histogram in itertools.product(range(4), repeat=4):
        before = probabilities(s, histogram)
        for added in itertools.product(range(3), repeat=4):
            if not 0 < sum(added) <= 2:
                continue
            after = probabilities(s, [h + a for h, a in zip(histogram, added, strict=True)])
            ratio = max(max(a / b, b / a) for a, b in zip(before, after, strict=True))
            worst = max(worst, ratio)
    assert worst <= math.exp(0.7) * (1 + 1e-12)
    assert worst > math.exp(0.7) * 0.9  # the bound is nearly met: the rate is not loose
    replaced = max(max(a / b, b / a) for a, b in zip(
        probabilities(s, (3, 0, 0, 0)), probabilities(s, (1, 2, 0, 0)), strict=True))
    assert replaced > math.exp(0.7)


def test_exact_probabilities() -> None:
    """ε = 1, one row per unit: a = ε / Δu = 1, so P ∝ e^(count − top) = e^-2, e^-5, 1, 1."""
    weights = [math.exp(-2), math.exp(-5), 1.0, 1.0]
    assert probabilities(spec(1.0, 4), (3, 0, 5, 5)) == pytest.approx(
        [w / sum(weights) for w in weights], rel=1e-12)


def test_sampler_matches_the_exact_probabilities_chi_square() -> None:
    """N = 40,000 draws on a fixed histogram; false-failure rate 4e-7. The rank utility
    (a median) puts most of its mass elsewhere, so a sampler reading it fails."""
    s = spec(0.5, 5)  # a = 1/2
    histogram = (4, 1, 2, 3, 4)
    expected_p = probabilities(s, histogram)
    counts = [0] * len(histogram)
    n = 40_000
    for _ in range(n):
        counts[sample_bin(s, histogram)] += 1
    expected = [n * q for q in expected_p]
    assert min(expected) > 250
    statistic = sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True))
    assert statistic < chi2.isf(4e-7, df=len(histogram) - 1), (counts, expected)


# -- end to end ---------------------------------------------------------------------------

def _counts(engine: Engine, column: str, table: str, where: str = "TRUE",
            group: str | None = None) -> dict[Any, dict[Any, int]]:
    """Per group (None without one), the number of rows of each value of `column`."""
    key = group or "NULL"
    out: dict[Any, dict[Any, int]] = {}
    for g, value, n in read_directly(engine, f"SELECT {key}, {column}, COUNT(*) FROM {table} "
                                             f"WHERE {where} GROUP BY 1, 2"):
        if value is not None:
            out.setdefault(g, {})[value] = int(n)
    return out


def test_modes_are_within_their_count_error(make_policy: PolicyFactory) -> None:
    """Public text values per group, whole numbers, a truth value: each released mode's
    count is within its reported error (a bound at confidence 1 − 1e-9) of the top count;
    at ε = 1000 that error is below one row, so it is a most frequent value."""
    policy = make_policy(replace=BIG_BUDGET)
    with dpproxy.connect(policy, analyst="alice", epsilon=1000,
                         confidence=CONFIDENCE) as conn:
        cur = conn.cursor()
        cur.execute("SELECT sex, MODE() WITHIN GROUP (ORDER BY education) AS edu, "
                    "MODE() WITHIN GROUP (ORDER BY hours_per_week) AS hours, "
                    "MODE() WITHIN GROUP (ORDER BY age > 40) AS older "
                    "FROM adult GROUP BY sex ORDER BY sex")
        assert [d[0] for d in cur.description] == ["sex", "edu", "hours", "older"]
        rows = cur.fetchall()
        accuracy = cur.accuracy
    for acc in accuracy[1:]:
        assert acc is not None and acc.mechanism == "exponential"
        assert acc.rank_error is not None and acc.rank_error < 1
        assert "count within" in acc.describe()
    assert [r[0] for r in rows] == ["Female", "Male"]
    with Engine.from_path(policy) as engine:
        for row, (index, column) in itertools.product(
                rows, [(1, "education"), (2, "hours_per_week"), (3, "age > 40")]):
            counts = _counts(engine, column, "adult", f"sex = '{row[0]}'")[None]
            error = accuracy[index].rank_error
            assert counts.get(row[index], 0) >= max(counts.values()) - error
    assert all(isinstance(r[1], str) and isinstance(r[2], int) and isinstance(r[3], bool)
               for r in rows)


def test_mode_of_dates_user_level(make_policy: PolicyFactory) -> None:
    """visits bounds each person to 10 rows in 4 groups: per month, the mode of the visit
    days is drawn over every day of 2024 (the policy's bounds) as day numbers, and at this
    ε it is a day of that month (any other day has no visits in the group: a count error
    below one row rules it out), released as a date."""
    policy = make_policy(replace=BIG_BUDGET)
    with dpproxy.connect(policy, analyst="alice", epsilon=1e5,
                         confidence=CONFIDENCE) as conn:
        cur = conn.cursor()
        cur.execute("SELECT DATE_TRUNC('month', day) AS month, MODE() WITHIN GROUP "
                    "(ORDER BY day) AS busiest FROM visits GROUP BY 1 ORDER BY 1")
        rows = cur.fetchall()
        error = cur.accuracy[1].rank_error
    assert error < 1 and len(rows) == 12
    for month, busiest in rows:
        month_start = month.date() if isinstance(month, dt.datetime) else month
        assert isinstance(busiest, dt.date | dt.datetime)
        day = busiest.date() if isinstance(busiest, dt.datetime) else busiest
        assert (day.year, day.month) == (month_start.year, month_start.month)


def test_mode_types_over_the_wire(serve: ServeFactory) -> None:
    """Over psycopg, a mode comes typed as its values are: text (OID 25), int8 (20),
    bool (16), date (1082)."""
    served = serve(BIG_BUDGET)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        cur = conn.execute("SET dpproxy.epsilon = 100")
        cur = conn.execute("SELECT MODE() WITHIN GROUP (ORDER BY occupation), "
                           "MODE() WITHIN GROUP (ORDER BY age), "
                           "MODE() WITHIN GROUP (ORDER BY income = '>50K') FROM adult")
        assert cur.description is not None
        assert [c.type_code for c in cur.description] == [25, 20, 16]
        occupation, age, rich = cur.fetchone()  # type: ignore[misc]
        assert isinstance(occupation, str) and 17 <= age <= 90 and rich in (False, True)
        cur = conn.execute("SELECT MODE() WITHIN GROUP (ORDER BY day) FROM visits")
        assert cur.description is not None and cur.description[0].type_code == 1082


def test_explain_names_the_candidates(engine: Engine) -> None:
    """EXPLAIN shows each mode's candidates and the count utility, and charges nothing."""
    lines = [str(r[0]) for r in engine.session("alice").execute(
        "EXPLAIN SELECT MODE() WITHIN GROUP (ORDER BY education), MODE() WITHIN GROUP "
        "(ORDER BY age > 40), MODE() WITHIN GROUP (ORDER BY age) FROM adult").rows]
    text = "\n".join(lines)
    assert "m0 = MODE of histogram(education over its 16 values): exponential mechanism " \
           "over 16 one-integer bins; count utility" in text
    assert "MODE of histogram(age > 40 over its 2 values)" in text
    assert "MODE of histogram(clamp(age, 17, 90)): exponential mechanism over 74" in text
    assert "candidates: 16 public values" in text and "argument bounds [17, 90]" in text
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0


@pytest.mark.parametrize("sql, sqlstate, words", [
    # candidates read from the data: refused, with the policy change that fixes it
    ("SELECT MODE() WITHIN GROUP (ORDER BY LOWER(sex)) FROM adult", "42501",
     "public_values"),
    ("SELECT MODE() WITHIN GROUP (ORDER BY amount) FROM visits", "0A000", "ROUND"),
    ("SELECT MODE() WITHIN GROUP (ORDER BY capital_gain) FROM adult", "0A000", "1024"),
    ("SELECT MODE() WITHIN GROUP (ORDER BY age * 100) FROM adult", "0A000", "1024"),
    # a text mode is an output of its own: post-processing computes with numbers
    ("SELECT sex, MODE() WITHIN GROUP (ORDER BY education) IS NULL FROM adult GROUP BY sex",
     "0A000", "on its own"),
    ("SELECT sex FROM adult GROUP BY sex HAVING MODE() WITHIN GROUP (ORDER BY age > 40)",
     "0A000", "on its own"),
    # compared with a quoted literal: the same refusal, not a number's 22P02
    ("SELECT sex FROM adult GROUP BY sex HAVING MODE() WITHIN GROUP (ORDER BY education) "
     "= 'HS-grad'", "0A000", "is text"),
    ("SELECT COUNT(DISTINCT education), MODE() WITHIN GROUP (ORDER BY age) FROM adult",
     "0A000", "two queries"),
    ("SELECT MODE() FROM adult", "0A000", "WITHIN GROUP"),
])
def test_refusals(engine: Engine, sql: str, sqlstate: str, words: str) -> None:
    """Refused before anything is charged, with how to fix it."""
    assert_refused(engine, sql, sqlstate, words)
