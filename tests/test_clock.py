"""Time functions and constant date arithmetic (`dpproxy.clock`): evaluated as PostgreSQL
evaluates them, bound into the query as its literals (so the answer cache sees the day),
and accepted where dashboards send them."""

from __future__ import annotations

import datetime as dt
import math

import psycopg
import pytest
import sqlglot

import dpproxy.parse
from dpproxy.clock import _constant, fold
from dpproxy.errors import NotSupportedError
from dpproxy.session import Engine

from .test_server_support import ServeFactory

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")

CLOCKS = [
    dt.datetime(2026, 11, 24, 20, 55, 1, 123456),
    dt.datetime(2024, 2, 29, 0, 0, 0),  # a leap day
    dt.datetime(2026, 3, 31, 23, 59, 59, 999999),  # a month end: one month back clamps
    dt.datetime(2025, 12, 31, 12, 0, 0),
    dt.datetime(2026, 1, 1, 0, 30, 0),
]
EXPRESSIONS = [
    "NOW() + INTERVAL '-30 day'",
    "CAST((NOW() + INTERVAL '-30 day') AS date)",
    "CAST((NOW() + INTERVAL '-1 month') AS date)",
    "NOW() - INTERVAL '1 year 2 months'",
    "NOW() - INTERVAL '1 month' - INTERVAL '1 month'",
    "NOW() - '36 hours'::interval",
    "NOW() + INTERVAL '90 minutes' + INTERVAL '1 day'",
    "NOW() + INTERVAL '2 weeks 3 days'",
    "CURRENT_DATE - 30",
    "CURRENT_DATE + 7",
    "CURRENT_DATE - INTERVAL '3 weeks'",
    "INTERVAL '2 months' + CURRENT_DATE",
    "CAST(NOW() AS date)",
    "CAST(CURRENT_DATE AS timestamp)",
    "date_trunc('year', NOW())",
    "date_trunc('quarter', NOW())",
    "date_trunc('month', CURRENT_DATE)",
    "date_trunc('week', NOW())",
    "date_trunc('day', NOW())",
    "date_trunc('hour', NOW())",
    "date_trunc('minute', NOW())",
    "date_trunc('second', NOW())",
    "CAST(date_trunc('month', NOW()) - INTERVAL '1 month' AS date)",
    "LOCALTIMESTAMP - INTERVAL '1 day'",
    "DATE '2024-06-01' - INTERVAL '30 days'",
    "TIMESTAMP '2024-03-31 10:00:00' + INTERVAL '1 mon'",
]


def _literal_sql(expression: str, clock: dt.datetime) -> str:
    """The expression with the clock written in, as PostgreSQL reads it in any time zone."""
    tree = sqlglot.parse_one(f"SELECT {expression}", read="postgres")

    def swap(node: sqlglot.exp.Expression) -> sqlglot.exp.Expression:
        if isinstance(node, sqlglot.exp.CurrentTimestamp | sqlglot.exp.Localtimestamp):
            return sqlglot.exp.Cast(this=sqlglot.exp.Literal.string(clock.isoformat(sep=" ")),
                                    to=sqlglot.exp.DataType.build("TIMESTAMP"))
        if isinstance(node, sqlglot.exp.CurrentDate):
            return sqlglot.exp.Cast(this=sqlglot.exp.Literal.string(clock.date().isoformat()),
                                    to=sqlglot.exp.DataType.build("DATE"))
        return node
    return tree.transform(swap).sql("postgres")


def test_folding_matches_postgresql(pg_dsn: str) -> None:
    """26 expressions at 5 clocks (leap day, month ends, year ends): each folds to one
    literal, of PostgreSQL's value for the same expression at the same time (in UTC)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET TIME ZONE 'UTC'")  # dpproxy's sessions are in UTC
        for clock in CLOCKS:
            for expression in EXPRESSIONS:
                tree = sqlglot.parse_one(f"SELECT {expression}", read="postgres")
                folded = fold(tree, clock).expressions[0]
                mine = _constant(folded)
                assert isinstance(mine, dt.date), (expression, folded.sql("postgres"))
                row = conn.execute(_literal_sql(expression, clock)).fetchone()
                assert row is not None
                theirs = row[0]
                if isinstance(theirs, dt.datetime) and theirs.tzinfo is not None:
                    # date_trunc of a date is a timestamptz: the same instant in UTC
                    assert theirs.utcoffset() == dt.timedelta(0)
                    theirs = theirs.replace(tzinfo=None)
                assert type(mine) is type(theirs) and mine == theirs, \
                    (clock, expression, mine, theirs)


def test_an_injected_month_bug_is_caught() -> None:
    """The comparison can fail: a month back from March 31 is February's last day."""
    tree = sqlglot.parse_one("SELECT NOW() - INTERVAL '1 month'", read="postgres")
    assert _constant(fold(tree, CLOCKS[2]).expressions[0]) \
        == dt.datetime(2026, 2, 28, 23, 59, 59, 999999)


@pytest.mark.parametrize("expression", [
    "day + INTERVAL '1 month'",  # over a column, and not whole days: refused later
    "NOW() + INTERVAL '1 fortnight'",
    "NOW() + INTERVAL '1.5 days'",
])
def test_what_is_not_folded_is_left_as_written(expression: str) -> None:
    """(An INTERVAL of whole days added to a row expression becomes its days:
    tests/test_date_arithmetic.py.)"""
    tree = sqlglot.parse_one(f"SELECT {expression} FROM t", read="postgres")
    folded = fold(tree.copy(), CLOCKS[0]).expressions[0]
    assert folded.find(sqlglot.exp.Interval) is not None


@pytest.mark.parametrize("literal", ["1 day 02:00:00", "1 day ago", "@ 1 day"])
def test_an_interval_sqlglot_would_misread_is_refused(engine: Engine, literal: str) -> None:
    """sqlglot keeps only the first number-unit pair of these ('1 day ago' would be +1
    day): refused before anything is read, with the form to write."""
    alice = engine.session("alice", epsilon=1.0)
    with pytest.raises(NotSupportedError) as raised:
        alice.execute(f"SELECT COUNT(*) FROM visits WHERE day > NOW() - INTERVAL '{literal}'")
    assert "number-unit pairs" in (raised.value.hint or "")


def test_now_is_bound_as_the_statements_clock(engine: Engine,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """now() in WHERE is the literal of the statement's clock: the query normalizes to
    the one with that timestamp written out."""
    monkeypatch.setattr(dpproxy.parse, "now", lambda: dt.datetime(2024, 7, 1, 9, 30, 5, 7))
    statement = dpproxy.parse.parse_statements(
        "SELECT COUNT(*) FROM adult WHERE now() > DATE '2020-01-01'", bind=False)[0]
    assert engine.normalized_query(statement) == (
        "SELECT COUNT(*) FROM adult WHERE CAST('2024-07-01 09:30:05.000007' AS TIMESTAMP) > "
        "CAST('2020-01-01' AS DATE)")
    assert engine.session("alice", epsilon=1.0).execute(statement.text).rows[0][0] > 30_000


def test_a_relative_day_is_one_query_all_day(engine: Engine,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`CURRENT_DATE - 30` binds today's date: a repeat today is the stored answer (free),
    the same query with the date written out is too, and tomorrow it is a new query."""
    alice = engine.session("alice", epsilon=1.0)
    spent = lambda: engine.ledger.status("analyst:alice").spent.epsilon  # noqa: E731
    today = dt.datetime(2024, 7, 1, 9, 30)
    monkeypatch.setattr(dpproxy.parse, "now", lambda: today)
    query = "SELECT COUNT(*) FROM visits WHERE day >= CURRENT_DATE - 30"
    first = alice.execute(query).rows
    assert math.isclose(spent(), 1.0)
    today = dt.datetime(2024, 7, 1, 23, 59)
    assert alice.execute(query).rows == first
    assert alice.execute(
        "SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-06-01'").rows == first
    assert math.isclose(spent(), 1.0)
    today = dt.datetime(2024, 7, 2, 0, 1)
    alice.execute(query)
    assert math.isclose(spent(), 2.0)


def test_now_to_the_microsecond_is_a_new_query_each_time(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW() itself, not cast to a date, is a new instant (and a new charge) each time, as
    the rows it selects may change; the day it falls on is cast with CAST(… AS date)."""
    alice = engine.session("alice", epsilon=1.0)
    clocks = iter([dt.datetime(2024, 7, 1, 9, 30, 0, 1), dt.datetime(2024, 7, 1, 9, 30, 0, 2),
                   dt.datetime(2024, 7, 1, 9, 31), dt.datetime(2024, 7, 1, 9, 32)])
    monkeypatch.setattr(dpproxy.parse, "now", lambda: next(clocks))
    for _ in range(2):
        alice.execute("SELECT COUNT(*) FROM visits WHERE day >= NOW() - INTERVAL '30 days'")
    for _ in range(2):
        alice.execute("SELECT COUNT(*) FROM visits WHERE day >= CAST(NOW() - "
                      "INTERVAL '30 days' AS date)")
    assert math.isclose(engine.ledger.status("analyst:alice").spent.epsilon, 3.0)


def test_dashboard_filters_over_the_wire(serve: ServeFactory) -> None:
    """Metabase's relative filters, and hand-written ones, over psycopg on both backends:
    answered as the same query with the dates written out."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for _attempt in range(2):  # a second try only if the UTC day turned meanwhile
            day = dt.datetime.now(dt.UTC).date()
            days = (day - dt.date(2024, 1, 1)).days
            answers = []
            for relative, written in [
                (f"\"day\" >= CAST((NOW() + INTERVAL '-{days} day') AS date)",
                 "\"day\" >= DATE '2024-01-01'"),
                (f"day >= CURRENT_DATE - {days} AND day < CURRENT_DATE - {days - 31}",
                 "day >= DATE '2024-01-01' AND day < DATE '2024-02-01'"),
            ]:
                got = conn.execute(f"SELECT COUNT(*) FROM visits WHERE {relative}").fetchone()
                spent = served.spent()
                same = conn.execute(f"SELECT COUNT(*) FROM visits WHERE {written}").fetchone()
                answers.append((got, same, spent, served.spent()))
            if dt.datetime.now(dt.UTC).date() == day:
                break
    for got, same, spent, after in answers:
        assert got == same  # the stored answer of the same query: the clock was read
        assert after == spent


def test_the_clock_itself_over_the_wire(serve: ServeFactory) -> None:
    """`SELECT now()` and `SELECT CURRENT_DATE`, as tools send to check a connection, and a
    constant date beside an aggregate: timestamp (OID 1114) and date (1082) columns named
    as PostgreSQL names them, at the statement's UTC clock, free; a constant date inside
    an expression, or an invalid one, is refused."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        before = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        cur = conn.execute("SELECT now(), CURRENT_DATE, LOCALTIMESTAMP AS local, "
                           "CURRENT_TIMESTAMP")
        (moment, day, local, current), = cur.fetchall()
        after = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        assert cur.description is not None
        assert [(c.name, c.type_code) for c in cur.description] == [
            ("now", 1114), ("current_date", 1082), ("local", 1114), ("current_timestamp", 1114)]
        assert before <= moment == local == current <= after and day == moment.date()
        assert served.spent() == 0
        cur = conn.execute("SELECT COUNT(*), CURRENT_DATE AS as_of FROM adult")
        assert cur.description is not None and cur.description[1].type_code == 1082
        assert cur.fetchone()[1] in (day, day + dt.timedelta(days=1))  # (midnight between)
        for sql, sqlstate in (("SELECT CASE WHEN true THEN CURRENT_DATE END", "0A000"),
                              ("SELECT DATE '2024-13-01'", "22P02")):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(sql)
            assert refused.value.sqlstate == sqlstate


def test_the_clock_through_the_dbapi(engine: Engine) -> None:
    """In process, the same columns come as datetime.datetime and datetime.date."""
    import dpproxy

    with dpproxy.connect(engine.policy.path, analyst="alice") as conn:
        (moment, day), = conn.execute("SELECT now(), CURRENT_DATE").fetchall()
    assert isinstance(moment, dt.datetime) and day == moment.date()
