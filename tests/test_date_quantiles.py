"""MIN, MAX, MEDIAN and PERCENTILE_CONT of dates, on both backends.

A date's quantile is measured as its day number (days since 1970-01-01) between bounds
from the policy (`lower`/`upper` dates, or a `public_range`) or from a clamp in the query,
by the exponential mechanism as for numbers, and released as a date.

Values are checked at ε = 1000 per query. The exponential mechanism's rank error (as
EXPLAIN states it) is then a few rows at a confidence of 1 − 1e-9 per quantile, while
every day of the demo holds hundreds of kept visits: a day checked exactly is the true
one, and a range checked (a median in its month) is far wider than the error. MIN and MAX
are exact only where the true extreme is the bound itself (a bin beyond the data would
tie with it).
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pytest

from dpproxy.session import Engine

from .conftest import PolicyFactory
from .refusals import assert_refused
from .test_server_support import BIG_BUDGET, ServeFactory

BACKENDS = ("duckdb", "postgres")



def test_extremes_and_median_of_dates_over_psycopg(serve: ServeFactory) -> None:
    """The demo's visits cover every day of 2024: with the policy's bounds 2024-01-01 and
    2024-12-31 on visits.day, MIN and MAX are those days and the median a day near
    mid-year; each is a date column (OID 1082) whatever the backend. A clamp in the query
    narrows the range: its MIN is the clamp's lower end (every earlier visit counts as
    it)."""
    served = serve(BIG_BUDGET)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 1000")
        cur = conn.execute("SELECT MIN(day) AS first, MAX(day) AS last, MEDIAN(day) AS mid, "
                           "PERCENTILE_CONT(0.25) WITHIN GROUP (ORDER BY day) AS q1 "
                           "FROM visits")
        assert cur.description is not None
        assert [(c.name, c.type_code) for c in cur.description] == [
            ("first", 1082), ("last", 1082), ("mid", 1082), ("q1", 1082)]
        (first, last, mid, q1), = cur.fetchall()
        clamped = conn.execute(
            "SELECT MIN(LEAST(GREATEST(day, DATE '2024-03-01'), DATE '2024-06-30')) "
            "FROM visits").fetchone()
    assert (first, last) == (dt.date(2024, 1, 1), dt.date(2024, 12, 31))
    assert dt.date(2024, 6, 1) <= mid <= dt.date(2024, 7, 31)
    assert dt.date(2024, 3, 1) <= q1 <= dt.date(2024, 4, 30) and q1 < mid
    assert clamped == (dt.date(2024, 3, 1),)


def test_median_per_month_lies_in_its_month(make_policy: PolicyFactory) -> None:
    """Per month (a key through partition selection, all 12 released at this ε), the
    median visit day is a day of that month: day numbers and dates line up per group."""
    with Engine.from_path(make_policy(BIG_BUDGET)) as engine:
        alice = engine.session("alice", epsilon=1000)
        result = alice.execute("SELECT DATE_TRUNC('month', day) AS month, MEDIAN(day) AS mid "
                               "FROM visits GROUP BY 1 ORDER BY 1")
    assert result.types == ("date", "date")
    assert [m for m, _ in result.rows] == [f"2024-{i:02d}-01" for i in range(1, 13)]
    for month, mid in result.rows:
        assert mid[:7] == month[:7], (month, mid)


DAY = 'day = { type = "date", lower = 2024-01-01, upper = 2024-12-31, nullable = false }'


@pytest.mark.parametrize(("column", "bounds"), [
    (DAY, "[2024-01-01, 2024-12-31]"),
    # a public range's ends bound it too
    ('day = { type = "date", nullable = false, public_range = { first = "2024-02-01", '
     'last = "2024-03-31" } }', "[2024-02-01, 2024-03-31]"),
])
def test_explain_shows_the_bounds_as_dates(make_policy: PolicyFactory, column: str,
                                           bounds: str) -> None:
    with Engine.from_path(make_policy({**BIG_BUDGET, DAY: column})) as engine:
        text = "\n".join(r[0] for r in engine.session("alice").execute(
            "EXPLAIN SELECT MAX(day) FROM visits").rows)
    assert f"argument bounds {bounds}" in text


@pytest.mark.parametrize(("sql", "sqlstate", "words"), [
    # no bounds known for a date (a decade's start; day + 7 has day's, a week later):
    # refused with a clamp to copy
    ("SELECT MIN(DATE_TRUNC('decade', day) + 7) FROM visits", "42501",
     "MIN(LEAST(GREATEST(DATE_TRUNC('DECADE', day) + 7, DATE '2024-01-01'), "
     "DATE '2024-12-31'))"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY GREATEST(DATE_TRUNC('decade', day), "
     "DATE '2024-01-01')) FROM visits", "42501", "WITHIN GROUP (ORDER BY LEAST(GREATEST("),
    # a released date is an output or ORDER BY item on its own
    ("SELECT MAX(LEAST(GREATEST(day, DATE '2024-01-01'), DATE '2024-12-31')) - 1 "
     "FROM visits", "0A000", "is a date"),
    ("SELECT DATE_TRUNC('month', day), COUNT(*) FROM visits GROUP BY 1 HAVING "
     "MIN(LEAST(GREATEST(day, DATE '2024-01-01'), DATE '2024-12-31')) IS NOT NULL",
     "0A000", "is a date"),
    # compared with a quoted date: the same refusal, not a number's 22P02
    ("SELECT COUNT(*) FROM visits HAVING MIN(day) > '2024-03-01'", "0A000", "is a date"),
    ("SELECT SUM(day) FROM visits", "42804", "needs a number"),
])
def test_refusals_charge_nothing(engine: Engine, sql: str, sqlstate: str, words: str
                                 ) -> None:
    assert_refused(engine, sql, sqlstate, words)
