"""WIDTH_BUCKET (`dpproxy.analyze.buckets`): the folded CASE bins every value as
PostgreSQL's own width_bucket does, on both backends; bins over a column with public values
are public groups; bad constants are refused before anything is charged."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from typing import Any

import pytest
import sqlglot

from dpproxy.analyze.buckets import fold_width_buckets
from dpproxy.policy import ColumnPolicy, TablePolicy
from dpproxy.rewrite import make_total
from dpproxy.session import Engine

from .refusals import assert_refused
from .rewrites import Connections, disagreements, folded, loaded, three_ways

BACKENDS = ("duckdb", "postgres")

# Every eighth from -25 to 125: whole numbers around every edge of the calls below, and
# fractions on and between edges (the calls' fractional bounds are eighths too); the
# infinities and NULL. Eighths keep the comparison exact on all three: each is exactly a
# double and exactly its NUMERIC (PostgreSQL's rewrite reads a float column in NUMERIC,
# DuckDB in DOUBLE), and n · (x − low) is exact in both, so the one rounding left, DOUBLE's
# division, cannot carry a position across a whole number. Elsewhere a float a hair from an
# edge can land in different bins on the two backends (DOUBLE reads 32.3 · 1000 / 100 as
# 322.99999999999997, NUMERIC as 323), as with FLOOR(x * 10): why float keys are never
# enumerated (`dpproxy.analyze.keys.enumerable`).
NUMBERS: list[float | None] = [
    *[i / 8 for i in range(-200, 1001)], 1e300, -1e300, math.inf, -math.inf, None]
WHOLE: list[int | None] = [*range(-25, 126), None]
TABLE = TablePolicy("nums", {"x": ColumnPolicy("x", "float")})
WHOLE_TABLE = TablePolicy("whole", {"x": ColumnPolicy("x", "int")})
# (WIDTH_BUCKET call, PostgreSQL's own call): bounds up and down, negative and fractional
# bounds, one bin, many bins, thresholds
CALLS = [
    "WIDTH_BUCKET(x, 0, 100, 10)",
    "WIDTH_BUCKET(x, 0, 1, 10)",
    "WIDTH_BUCKET(x, 0, 100, 100)",
    "WIDTH_BUCKET(x, 10, 100, 9)",
    "WIDTH_BUCKET(x, -20, 120, 7)",
    "WIDTH_BUCKET(x, 0.5, 99.5, 3)",
    "WIDTH_BUCKET(x, 100, 0, 10)",
    "WIDTH_BUCKET(x, 5, -5, 4)",
    "WIDTH_BUCKET(x, 0, 1, 1)",
    "WIDTH_BUCKET(x, 0, 100, 1000)",
    "WIDTH_BUCKET(x, ARRAY[0, 18, 30.5, 65, 100])",
    "WIDTH_BUCKET(x, ARRAY[-1])",
    "WIDTH_BUCKET(x, ARRAY[1, 1, 2])",
]


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "nums", "x", "double precision", NUMBERS)


@pytest.fixture(scope="module")
def whole_connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "whole", "x", "int", WHOLE)


def _folded(call: str) -> str:
    return folded(call, fold_width_buckets)


def _mismatches(connections: Connections, calls: list[str], table: TablePolicy = TABLE,
                values: list[Any] = NUMBERS) -> list[tuple[str, Any, Any]]:
    """(call, value, the three bins) wherever DuckDB's rewrite, PostgreSQL's rewrite and
    PostgreSQL's own width_bucket disagree."""
    return disagreements(connections, table, values, [(_folded(c), c) for c in calls])


def test_bins_are_postgresqls(connections: Connections) -> None:
    """13 calls on 1,206 values of a float column: the folded CASE gives PostgreSQL's bin
    on both backends, edges, infinities and NULL included."""
    assert len(NUMBERS) * len(CALLS) > 15_000
    assert _mismatches(connections, CALLS) == []


def test_bins_of_whole_numbers(whole_connections: Connections) -> None:
    """The same calls on an int column, whose arithmetic is integer division on both
    backends (TRUNC of the exact quotient, a floor here: the distance is never negative)."""
    assert _mismatches(whole_connections, CALLS, WHOLE_TABLE, WHOLE) == []


DAYS: list[dt.date | None] = [dt.date(2023, 12, 25) + dt.timedelta(days=i) for i in range(380)]
DAYS += [dt.date(1, 1, 1), dt.date(9999, 12, 31), None]
DAY_TABLE = TablePolicy("days", {"d": ColumnPolicy("d", "date")})


@pytest.fixture(scope="module")
def day_connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "days", "d", "date", DAYS)


def test_date_thresholds_are_postgresqls(day_connections: Connections) -> None:
    """Date thresholds (quarters of one's own, a single cut): every day of a year and a
    bit, the ends of the calendar and NULL, binned as PostgreSQL's own width_bucket over a
    date array bins them, on both backends."""
    calls = [("WIDTH_BUCKET(d, ARRAY[DATE '2024-04-01', '2024-07-01'::date, "
              "CAST('2024-10-01' AS DATE)])",
              "width_bucket(d, ARRAY['2024-04-01', '2024-07-01', '2024-10-01']::date[])"),
             ("WIDTH_BUCKET(d, ARRAY[DATE '2024-02-29'])",
              "width_bucket(d, ARRAY['2024-02-29']::date[])")]
    assert disagreements(day_connections, DAY_TABLE, DAYS,
                         [(_folded(call), native) for call, native in calls]) == []
    for call, native in calls:  # every bin occurs
        rows = three_ways(*day_connections, DAY_TABLE, _folded(call), native=native)
        assert {r[2] for r in rows} >= ({0, 1, 2, 3} if "10-01" in call else {0, 1})


def test_a_wrong_fold_is_caught(connections: Connections,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: counting thresholds strictly below x (`<=` for `<`) moves
    every value equal to a threshold into the bin below."""
    from dpproxy.analyze import buckets

    right = buckets._threshold_case

    def off_by_one(operand: sqlglot.exp.Expression, thresholds: sqlglot.exp.Expression
                   ) -> sqlglot.exp.Expression:
        return right(operand, thresholds).transform(
            lambda n: sqlglot.exp.LTE(this=n.this, expression=n.expression)
            if isinstance(n, sqlglot.exp.LT) else n)

    monkeypatch.setattr(buckets, "_threshold_case", off_by_one)
    wrong = _mismatches(connections, ["WIDTH_BUCKET(x, ARRAY[0, 18, 30.5, 65, 100])"])
    assert {x for _, x, _ in wrong} == {0.0, 18.0, 30.5, 65.0, 100.0}


def test_nan_falls_in_the_last_bin(connections: Connections) -> None:
    """PostgreSQL raises on a NaN operand, from the data; the fold does not: NaN sorts
    above every number on both backends, so it is bin n + 1 (bin 0 counting down)."""
    duck, postgres = connections
    for call, expected in [("WIDTH_BUCKET(x, 0, 100, 10)", 11), ("WIDTH_BUCKET(x, 100, 0, 10)", 0),
                           ("WIDTH_BUCKET(x, ARRAY[1, 2])", 2)]:
        total = sqlglot.parse_one(_folded(call), read="postgres")
        on_duck = duck.execute(
            f"SELECT {make_total(total, TABLE).sql('duckdb')} "
            "FROM (SELECT CAST('NaN' AS DOUBLE) AS x)").fetchone()
        on_postgres = postgres.execute(
            f"SELECT {make_total(total, TABLE, 'postgres').sql('postgres')} "
            "FROM (SELECT 'NaN'::float8 AS x) AS nums").fetchone()
        assert on_duck == on_postgres == (expected,)


# -- through the engine ----------------------------------------------------------------------

# the demo policy with a public range on age (its bins are then public groups) and a budget
# that never runs out
RANGES = {
    "budget = { epsilon = 10.0, delta = 1e-5 }": "budget = { epsilon = 1e9, delta = 0.5 }",
    'age = { type = "int", lower = 17, upper = 90, nullable = false }':
        'age = { type = "int", lower = 17, upper = 90, nullable = false, '
        "public_range = { step = 1 } }",
}


@pytest.fixture
def engine(make_policy: Any) -> Iterator[Engine]:
    with Engine.from_path(make_policy(replace=RANGES)) as eng:
        yield eng


def _exact(engine: Engine, sql: str) -> dict[Any, int]:
    return {k: int(n) for k, n in engine.backend.run_aggregate(sql, ())}


def test_public_bins_are_all_released(engine: Engine) -> None:
    """Bins of a public range are public groups: every bin ages 17-90 reach comes back,
    the ones WHERE empties too (as zeros within noise), with counts within 50 noise scales
    of the data's (scale 1/1000 here: a miss has probability below e^-50)."""
    session = engine.session("alice", epsilon=1000.0)
    result = session.execute("SELECT WIDTH_BUCKET(age, 0, 100, 10), COUNT(*) FROM adult "
                             "WHERE age < 40 GROUP BY 1 ORDER BY 1")
    assert result.columns == ("width_bucket", "count")
    assert [r[0] for r in result.rows] == list(range(2, 11))  # ages 17-90: bins 2..10
    exact = _exact(engine, "SELECT CAST(FLOOR(age / 10) + 1 AS INT), COUNT(*) FROM adult "
                           "WHERE age < 40 GROUP BY 1")
    assert set(exact) == {2, 3, 4}
    assert all(abs(n - exact.get(b, 0)) <= 0.05 for b, n in result.rows)
    explained = session.execute("EXPLAIN SELECT WIDTH_BUCKET(age, 0, 100, 10), COUNT(*) "
                                "FROM adult GROUP BY 1").rows
    # shown as written, not as the CASE it folds to
    assert any("Groups: WIDTH_BUCKET(age, 0, 100, 10) (9 public values" in str(r[0])
               for r in explained)
    assert not any("partition selection" in str(r[0]) for r in explained)


def test_threshold_bands_with_averages(engine: Engine) -> None:
    """Age bands from thresholds, with a count and an average per band: every band of the
    public range is released and both statistics match the data."""
    session = engine.session("alice", epsilon=1000.0)
    result = session.execute(
        "SELECT WIDTH_BUCKET(age, ARRAY[18, 30, 50, 65]) AS band, COUNT(*), "
        "AVG(hours_per_week) FROM adult GROUP BY band ORDER BY band DESC")
    exact = {b: (int(n), float(a)) for b, n, a in engine.backend.run_aggregate(
        "SELECT CASE WHEN age < 18 THEN 0 WHEN age < 30 THEN 1 WHEN age < 50 THEN 2 "
        "WHEN age < 65 THEN 3 ELSE 4 END, COUNT(*), AVG(hours_per_week) FROM adult "
        "GROUP BY 1", ())}
    assert [r[0] for r in result.rows] == [4, 3, 2, 1, 0]
    for band, n, avg in result.rows:
        assert abs(n - exact[band][0]) <= 0.1
        assert abs(avg - exact[band][1]) <= 0.05 * 99 / exact[band][0] + 1e-6


def test_date_bins_through_the_engine(engine: Engine) -> None:
    """Quarters cut by date thresholds, per person bounded as visits declares: the four
    quarters of 2024 come back, each count within 2 of [0, its rows] (bounding only
    removes rows; the Laplace scale is 0.08 here, so 2 is 25 scales: e^-25 per count)."""
    session = engine.session("alice", epsilon=1000.0)
    result = session.execute(
        "SELECT WIDTH_BUCKET(day, ARRAY[DATE '2024-04-01', DATE '2024-07-01', "
        "DATE '2024-10-01']) AS quarter, COUNT(*) FROM visits GROUP BY quarter ORDER BY 1")
    exact = _exact(engine, "SELECT CASE WHEN day < DATE '2024-04-01' THEN 0 WHEN day < "
                           "DATE '2024-07-01' THEN 1 WHEN day < DATE '2024-10-01' THEN 2 "
                           "ELSE 3 END, COUNT(*) FROM visits GROUP BY 1")
    assert [r[0] for r in result.rows] == [0, 1, 2, 3] == sorted(exact)
    assert all(-2 <= n <= exact[q] + 2 for q, n in result.rows)


def test_private_bins_pass_partition_selection(engine: Engine) -> None:
    """Without public values the bins are private: partition selection releases the bins
    the data fills well and no others. hours_per_week 1-99 in bins of 10."""
    session = engine.session("alice", epsilon=1000.0)
    result = session.execute("SELECT WIDTH_BUCKET(hours_per_week, 0, 100, 10) AS b, "
                             "COUNT(*) FROM adult GROUP BY b")
    exact = _exact(engine, "SELECT CAST(FLOOR(hours_per_week / 10) + 1 AS INT), COUNT(*) "
                           "FROM adult GROUP BY 1")
    released = {b: n for b, n in result.rows}
    assert set(released) <= set(exact)
    assert {b for b, n in exact.items() if n >= 100} <= set(released)


def test_bounded_sum_of_bins(engine: Engine) -> None:
    """A bin number is bounded by 0 … n + 1 whatever the column's bounds: its SUM needs no
    clamp, and its sensitivity is n + 1 per row."""
    session = engine.session("alice", epsilon=1000.0)
    value = session.execute("SELECT SUM(WIDTH_BUCKET(capital_gain, 0, 100000, 5)) "
                            "FROM adult").rows[0][0]
    exact = engine.backend.run_aggregate(
        "SELECT SUM(CASE WHEN capital_gain >= 100000 THEN 6 ELSE "
        "CAST(FLOOR(capital_gain / 20000) AS INT) + 1 END) FROM adult", ())[0][0]
    assert abs(value - int(exact)) <= 50 * 6 / 1000
    plan = session.execute("EXPLAIN SELECT SUM(WIDTH_BUCKET(capital_gain, 0, 100000, 5)) "
                           "FROM adult").rows
    assert any("SUM(clamp(WIDTH_BUCKET(capital_gain, 0, 100000, 5), 0, 6)): L1 sensitivity 6"
               in str(r[0]) for r in plan)
    assert any(str(r[0]).startswith("  SUM(WIDTH_BUCKET(capital_gain, 0, 100000, 5)) from")
               for r in plan)


@pytest.mark.parametrize("sql, sqlstate, words", [
    ("SELECT WIDTH_BUCKET(age, 0, 100, 0), COUNT(*) FROM adult GROUP BY 1", "2201G",
     "greater than zero"),
    ("SELECT WIDTH_BUCKET(age, 0, 100, 2.5), COUNT(*) FROM adult GROUP BY 1", "2201G",
     "whole number"),
    ("SELECT WIDTH_BUCKET(age, 10, 10, 3), COUNT(*) FROM adult GROUP BY 1", "2201G",
     "cannot equal"),
    ("SELECT WIDTH_BUCKET(age, ARRAY[30, 18]), COUNT(*) FROM adult GROUP BY 1", "2201G",
     "sorted"),
    ("SELECT WIDTH_BUCKET(age, 0, hours_per_week, 3), COUNT(*) FROM adult GROUP BY 1",
     "0A000", "write the numbers out"),
    ("SELECT WIDTH_BUCKET(age, ARRAY[age]), COUNT(*) FROM adult GROUP BY 1", "0A000",
     "constants"),
    ("SELECT WIDTH_BUCKET(age, 0, 'NaN', 3), COUNT(*) FROM adult GROUP BY 1", "0A000",
     "constants"),
    ("SELECT WIDTH_BUCKET(capital_gain, -1e300, 1e300, 10), COUNT(*) FROM adult GROUP BY 1",
     "0A000", "fewer bins"),
    ("SELECT WIDTH_BUCKET(day, ARRAY[DATE '2024-07-01', DATE '2024-04-01']), COUNT(*) "
     "FROM visits GROUP BY 1", "2201G", "sorted"),
    ("SELECT WIDTH_BUCKET(day, ARRAY[DATE '2024-07-01', 5]), COUNT(*) FROM visits GROUP BY 1",
     "0A000", "all numbers or all dates"),
    ("SELECT WIDTH_BUCKET(day, ARRAY[DATE '2024-13-01']), COUNT(*) FROM visits GROUP BY 1",
     "22P02", "type date"),
])
def test_bad_constants_are_refused(engine: Engine, sql: str, sqlstate: str, words: str
                                   ) -> None:
    """A bad count, equal bounds or unsorted thresholds are PostgreSQL's 2201G; a bound
    read from the row is 0A000 (which bins exist would depend on the data). Nothing is
    charged."""
    assert_refused(engine, sql, sqlstate, words)


def test_constant_query(engine: Engine) -> None:
    """Without a table the bins are computed from the constants alone, as PostgreSQL
    computes them, and each column keeps PostgreSQL's name; nothing is charged."""
    session = engine.session("alice")
    result = session.execute("SELECT WIDTH_BUCKET(5, 0, 10, 5), WIDTH_BUCKET(-1, 10, 0, 3), "
                             "WIDTH_BUCKET(2.5, ARRAY[1, 2.5, 4]) AS t")
    assert result.columns == ("width_bucket", "width_bucket", "t")
    assert result.rows == [(3, 4, 2)]
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0
