"""Whole years between dates, `EXTRACT(YEAR FROM AGE(a, b))` (`dpproxy.analyze.ages`): the
same years as PostgreSQL's own AGE on both backends, leap days and dates before the
other included; bounded by the dates' bounds; other uses of AGE refused."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlglot

from dpproxy.analyze.ages import fold_ages
from dpproxy.policy import ColumnPolicy, TablePolicy
from dpproxy.session import Engine

from .exact import read_directly
from .refusals import assert_refused
from .rewrites import Connections, disagreements, folded, loaded

BACKENDS = ("duckdb", "postgres")

# every third day from 1995 to 2031 (leap days, month ends, both sides of each anchor
# below), every 29 February in it, the ends of the calendar, and NULL
DAYS: list[dt.date | None] = [dt.date(1995, 1, 1) + dt.timedelta(days=3 * i)
                              for i in range(4400)]
DAYS += [dt.date(y, 2, 29) for y in range(1996, 2032, 4)]
DAYS += [dt.date(y, m, d) for y in (2000, 2024) for m, d in ((2, 28), (3, 1), (12, 31))]
DAYS += [dt.date(1, 1, 1), dt.date(9999, 12, 31), None]
TABLE = TablePolicy("days", {"d": ColumnPolicy("d", "date")})
CALLS = [
    "EXTRACT(YEAR FROM AGE(DATE '2024-02-29', d))",
    "EXTRACT(YEAR FROM AGE(d, DATE '2000-02-29'))",
    "EXTRACT(YEAR FROM AGE(d, DATE '2010-06-15'))",
    "date_part('year', age(DATE '1999-12-31', d))",
]


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "days", "d", "date", DAYS)


def _folded(call: str) -> str:
    return folded(call, fold_ages)


def _mismatches(connections: Connections, calls: list[str]) -> list[tuple[str, object, object]]:
    return disagreements(connections, TABLE, DAYS, [(_folded(c), c) for c in calls])


def test_years_are_postgresqls(connections: Connections) -> None:
    """4 calls on 4,418 dates: DuckDB's rewrite, PostgreSQL's rewrite and PostgreSQL's own
    EXTRACT(YEAR FROM AGE(…)) agree on every one (NULL included)."""
    assert len(DAYS) * len(CALLS) > 17_000
    assert _mismatches(connections, CALLS) == []


def test_a_wrong_borrow_is_caught(connections: Connections,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: borrowing a year only when the month is before (not on
    the same month with an earlier day) misses the days of each anchor's month."""
    from dpproxy.analyze import ages

    def coarse(later: sqlglot.exp.Expression, earlier: sqlglot.exp.Expression
               ) -> sqlglot.exp.Expression:
        years = right(later, earlier)
        return years.transform(lambda n: sqlglot.exp.false() if isinstance(n, sqlglot.exp.And)
                               else n)

    right = ages._whole_years
    monkeypatch.setattr(ages, "_whole_years", coarse)
    wrong = _mismatches(connections, ["EXTRACT(YEAR FROM AGE(d, DATE '2010-06-15'))"])
    assert len(wrong) > 20 and all(d.month == 6 for _, d, _ in wrong)  # type: ignore[union-attr]


def test_average_years_through_the_engine(engine: Engine) -> None:
    """visits bounds day to 2024, so years to 2030-06-15 are bounded (5 or 6) with no
    clamp. The DP average is within 0.05 of all rows' average: at ε = 5 its noise is below
    1e-4; bounding keeps each person's rows at random, independently of their days (which
    the demo draws alike for everyone), so on the ~200,000 kept rows the kept average
    moves by about 0.5/√200,000 ≈ 0.001 (0.05 is some 40 of those)."""
    session = engine.session("alice", epsilon=5.0)
    value = session.execute("SELECT AVG(EXTRACT(YEAR FROM AGE(DATE '2030-06-15', day))) "
                            "FROM visits").rows[0][0]
    exact = read_directly(engine, "SELECT AVG(EXTRACT(YEAR FROM AGE(DATE '2030-06-15', "
                                  "day))) FROM visits")[0][0]
    assert 5 <= float(exact) <= 6 and abs(value - float(exact)) <= 0.05


@pytest.mark.parametrize("sql, words", [
    ("SELECT COUNT(*) FROM visits GROUP BY EXTRACT(MONTH FROM AGE(DATE '2025-01-01', day))",
     "EXTRACT(MONTH FROM AGE"),
    ("SELECT COUNT(*) FROM visits WHERE EXTRACT(YEAR FROM AGE(day)) > 0", "AGE(CURRENT_DATE"),
    ("SELECT COUNT(*) FROM visits WHERE AGE(DATE '2025-01-01', day) > INTERVAL '1 year'",
     "AGE is not supported"),
])
def test_other_ages_are_refused(engine: Engine, sql: str, words: str) -> None:
    assert_refused(engine, sql, "0A000", words)
