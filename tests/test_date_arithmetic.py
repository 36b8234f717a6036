"""Date arithmetic over rows: date ± n days (also written as an INTERVAL of days, as
Metabase's weeks starting on Sunday are), DATE_TRUNC ± n, a date minus a DATE_TRUNC. Each
rewrite runs on its backend and gives PostgreSQL's own value, day for day; none fails
after its query was charged."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator

import pytest
from sqlglot import exp

from dpproxy import errors
from dpproxy.analyze.expressions import date_bounds, make_resolver, type_row_expression
from dpproxy.clock import day_number
from dpproxy.parse import parse_statements
from dpproxy.policy import ColumnPolicy, TablePolicy
from dpproxy.session import Engine

from .rewrites import Connections, loaded, three_ways

BACKENDS = ("duckdb", "postgres")
# (as written, PostgreSQL's own form where it has no operator for the first: DATE_TRUNC
# gives a TIMESTAMP, and TIMESTAMP ± integer does not exist; dpproxy reads it as its day)
EXPRESSIONS = [
    ("d + 6", None), ("d - 6", None), ("d + -1", None), ("d - -3", None), ("6 + d", None),
    ("DATE_TRUNC('week', d) + 6", "CAST(DATE_TRUNC('week', d) AS DATE) + 6"),
    ("DATE_TRUNC('month', d) - 1", "CAST(DATE_TRUNC('month', d) AS DATE) - 1"),
    ("d - DATE_TRUNC('month', d)", None),
    ("DATE_TRUNC('year', d) - DATE_TRUNC('month', d)", None),
    ("d + INTERVAL '1 day'", None), ("d - INTERVAL '2 weeks'", None),
    ("INTERVAL '3 days' + d", None),
    ("DATE_TRUNC('week', (d + INTERVAL '1 day')) + INTERVAL '-1 day'", None),  # Metabase
    ("CAST(DATE_TRUNC('month', d) AS DATE) + 40", None),
    # found by tests/test_fuzz_rows.py: a CASE holding a DATE_TRUNC, and a timestamp
    # constant (a date minus an interval) minus a date
    ("CASE WHEN d > DATE '2024-01-15' THEN DATE_TRUNC('month', d) ELSE d END + 30",
     "CAST(CASE WHEN d > DATE '2024-01-15' THEN DATE_TRUNC('month', d) ELSE d END AS DATE)"
     " + 30"),
    ("(DATE '2024-03-01' - INTERVAL '8 weeks') - GREATEST(d, DATE '2024-01-01')", None),
]
DATES = [dt.date(2023, 12, 20) + dt.timedelta(days=i) for i in range(80)] + [
    dt.date(2024, 2, 29), dt.date(1999, 12, 31), dt.date(2000, 3, 1), dt.date(1000, 1, 10)]
TABLE = TablePolicy("dates", {"d": ColumnPolicy("d", "date")})


def _day(value: object) -> object:
    """A date or a midnight timestamp as its day; a number as it is."""
    if isinstance(value, dt.datetime):
        assert value.time() == dt.time(0), value
        return value.date()
    if isinstance(value, dt.timedelta):  # PostgreSQL's date − timestamp is an interval
        assert value.seconds == value.microseconds == 0
        return value.days
    return float(value) if value is not None and not isinstance(value, dt.date) else value


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "dates", "d", "date", DATES)


def _mismatches(connections: Connections) -> list[tuple[object, ...]]:
    wrong = []
    for expression, own in EXPRESSIONS:
        rows = three_ways(*connections, TABLE, expression, own)
        for day, (a, b, c) in zip(DATES, rows, strict=True):
            if not _day(a) == _day(b) == _day(c):
                wrong.append((expression, day, a, b, c))
    return wrong


def test_both_backends_compute_postgresqls_value(connections: Connections) -> None:
    """16 expressions on 84 dates (month, leap-day and year ends): the DuckDB and the
    PostgreSQL rewrites give PostgreSQL's value of the expression as written."""
    assert _mismatches(connections) == []


def test_an_injected_bug_is_caught(connections: Connections,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: an INTERVAL of weeks read as that many days."""
    import dpproxy.clock as clock

    monkeypatch.setitem(clock._UNITS, "weeks", (0, 1, 0))
    assert any(w[0] == "d - INTERVAL '2 weeks'" for w in _mismatches(connections))


QUERIES = [
    'SELECT (DATE_TRUNC(\'week\', ("public"."visits"."day" + INTERVAL \'1 day\')) + '
    'INTERVAL \'-1 day\') AS "day", COUNT(*) AS "count" FROM "public"."visits" '
    'GROUP BY 1 ORDER BY 1 ASC',
    "SELECT DATE_TRUNC('week', day) + 6 AS week_end, COUNT(*) FROM visits GROUP BY 1",
    "SELECT COUNT(*) FROM visits WHERE day - DATE_TRUNC('month', day) < 3",
    "SELECT COUNT(*) FROM visits WHERE day + -1 >= DATE '2024-06-01'",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_queries_run_on_both_backends(engine: Engine, sql: str) -> None:
    """Accepted and answered (these raised a backend error after their charge before)."""
    rows = engine.session("alice", epsilon=1.0).execute(sql).rows
    assert rows
    if "week" in sql and "DATE_TRUNC('week', (" in sql.replace('"public"."visits".', ""):
        assert all(dt.date.fromisoformat(r[0]).weekday() == 6 for r in rows)  # Sundays


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE age + INTERVAL '1 day' > 30",
    "SELECT COUNT(*) FROM adult WHERE age - INTERVAL '-1 day' > 30",
])
def test_an_interval_added_to_a_number_is_refused(engine: Engine, sql: str) -> None:
    with pytest.raises(errors.DatatypeMismatch):
        engine.session("alice", epsilon=1.0).execute(sql)
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0


def test_a_statement_the_backend_cannot_plan_is_refused_uncharged(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite fault (here: DATE_TRUNC's TIMESTAMP left as it is, which is how these
    queries failed, or cast to an INTERVAL) is found by planning the statement before the
    charge: BackendError, nothing charged; planned statements are not planned again."""
    from sqlglot import exp

    import dpproxy.rewrite
    import dpproxy.rewrite_postgres

    for module in (dpproxy.rewrite, dpproxy.rewrite_postgres):
        monkeypatch.setattr(module, "as_date", lambda node: node)
    monkeypatch.setattr(dpproxy.rewrite, "_DATE", exp.DataType.build("INTERVAL"))
    alice = engine.session("alice", epsilon=1.0)
    with pytest.raises(errors.BackendError) as raised:
        alice.execute(QUERIES[1])
    assert "nothing was charged" in raised.value.message
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0
    monkeypatch.undo()
    assert alice.execute("SELECT COUNT(*) FROM visits").rows
    planned = len(engine._planned)
    alice.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
    alice.execute("SELECT COUNT(*) FROM adult WHERE age > 31")  # its shape: planned already
    assert len(engine._planned) == planned + 1


# -- bounds through date arithmetic ---------------------------------------------------------------

BOUNDED = TablePolicy("dates", {
    "d": ColumnPolicy("d", "date", float(day_number(dt.date(2024, 1, 1))),
                      float(day_number(dt.date(2024, 12, 31)))),
    "e": ColumnPolicy("e", "date", float(day_number(dt.date(2020, 1, 1))),
                      float(day_number(dt.date(2020, 1, 31)))),
    "u": ColumnPolicy("u", "date")})


def _first_output(sql: str) -> exp.Expression:
    ast = parse_statements(f"SELECT {sql} FROM dates")[0].ast
    assert isinstance(ast, exp.Select)
    return ast.expressions[0]


@pytest.mark.parametrize(("sql", "first", "last"), [
    ("d + 6", "2024-01-07", "2025-01-06"), ("6 + d", "2024-01-07", "2025-01-06"),
    ("d - 6", "2023-12-26", "2024-12-25"), ("d + -1", "2023-12-31", "2024-12-30"),
    ("d - -3", "2024-01-04", "2025-01-03"), ("d - INTERVAL '2 weeks'", "2023-12-18", "2024-12-17"),
    ("INTERVAL '3 days' + (d + 1)", "2024-01-05", "2025-01-04"),
    ("LEAST(u, DATE '2024-03-01') + 1", None, "2024-03-02"),
    ("u + 1", None, None),
    ("DATE_TRUNC('month', d)", "2024-01-01", "2024-12-01"),
    ("DATE_TRUNC('quarter', d + 100)", "2024-04-01", "2025-04-01"),  # to 2025-04-09
    ("DATE_TRUNC('year', d - 1)", "2023-01-01", "2024-01-01"),
    ("DATE_TRUNC('week', e)", "2019-12-30", "2020-01-27"),  # Mondays
    ("DATE_TRUNC('day', d)", "2024-01-01", "2024-12-31"),
    ("DATE_TRUNC('decade', d)", None, None),
])
def test_a_shifted_date_keeps_its_bounds_shifted(sql: str, first: str | None,
                                                  last: str | None) -> None:
    """MIN, MAX and quantiles of date ± n days and of DATE_TRUNC need no clamp where the
    date has bounds; an unbounded end stays unbounded, and so do decades (PostgreSQL's
    start in a year ending in 1)."""
    lo, hi = date_bounds(_first_output(sql), make_resolver("dates", None, BOUNDED.columns))
    assert lo == (day_number(dt.date.fromisoformat(first)) if first else -math.inf)
    assert hi == (day_number(dt.date.fromisoformat(last)) if last else math.inf)


@pytest.mark.parametrize(("sql", "lower", "upper"), [
    ("d - DATE '2024-01-01'", 0, 365),  # 2024 is a leap year
    ("DATE '2030-06-15' - d", 1992, 2357),
    ("d - e", 1431, 1826),
    ("(d + 7) - DATE '2024-01-01'", 7, 372),
    ("d - u", -math.inf, math.inf),
])
def test_days_between_bounded_dates_are_bounded(sql: str, lower: float, upper: float) -> None:
    typed = type_row_expression(_first_output(sql), BOUNDED.columns)
    assert (typed.kind, typed.integer, typed.lower, typed.upper) == ("num", True, lower, upper)


def test_sums_and_extremes_of_date_arithmetic_run_without_a_clamp(engine: Engine) -> None:
    """The demo's visits.day lies in 2024: days since New Year average within 0–365, and
    the first visit plus a day is a 2024 date after January 1st (both were refused for
    want of a bound before)."""
    alice = engine.session("alice", epsilon=1.0)
    (avg, first), = alice.execute("SELECT AVG(day - DATE '2024-01-01'), MIN(day + 1) "
                                  "FROM visits").rows
    assert 0 <= avg <= 365
    assert "2024-01-02" <= first <= "2025-01-01"
    (day_of_month,), = alice.execute(
        "SELECT AVG(day - DATE_TRUNC('month', day)) FROM visits").rows
    assert -335 <= day_of_month <= 365  # the differences of the bounds: both ends move
    with pytest.raises(errors.PrivacyViolation, match="no bound"):
        alice.execute("SELECT AVG(day - DATE_TRUNC('decade', day)) FROM visits")
