"""TRUNC(x), TRUNC(x, -k) and ROUND(x, -k) in row expressions: the same values on both
backends as PostgreSQL's own NUMERIC functions; TRUNC to decimal places is refused, since
DuckDB's DOUBLE and PostgreSQL's NUMERIC truncate 0.29 · 100 differently."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpproxy.policy import ColumnPolicy, TablePolicy
from dpproxy.session import Engine

from .refusals import assert_refused
from .rewrites import Connections, disagreements, loaded, three_ways

BACKENDS = ("duckdb", "postgres")

# whole numbers around every multiple of 10 and 100 and both signs, eighths between them
# (exact in DOUBLE and NUMERIC alike), halves for ROUND, and NULL
NUMBERS: list[float | None] = [*(i / 8 for i in range(-2000, 2001)), 1e15, -1e15, None]
TABLE = TablePolicy("nums", {"x": ColumnPolicy("x", "float")})
# (row expression, PostgreSQL's own form: its trunc/round with digits read NUMERIC)
CALLS = [
    ("TRUNC(x)", "trunc(x)"),
    ("TRUNC(x, 0)", "trunc(x::numeric, 0)"),
    ("TRUNC(x, -1)", "trunc(x::numeric, -1)"),
    ("TRUNC(x, -2)", "trunc(x::numeric, -2)"),
    ("ROUND(x, -1)", "round(x::numeric, -1)"),
    ("ROUND(x, -2)", "round(x::numeric, -2)"),
]


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "nums", "x", "double precision", NUMBERS)


def test_both_backends_truncate_as_postgresql(connections: Connections) -> None:
    """6 calls on 4,004 values: DuckDB's rewrite, PostgreSQL's rewrite and PostgreSQL's own
    function agree on every value (NULL included)."""
    assert disagreements(connections, TABLE, NUMBERS, CALLS) == []


def test_the_comparison_can_fail(connections: Connections) -> None:
    """ROUND against PostgreSQL's TRUNC differs on every value whose last digit is 5 or
    more: the comparison above sees a wrong rewrite."""
    rows = three_ways(*connections, TABLE, "ROUND(x, -1)", native="trunc(x::numeric, -1)")
    assert sum(r[0] is not None and float(r[0]) != float(r[2]) for r in rows) > 1000


def test_group_by_tens(engine: Engine) -> None:
    """TRUNC(age, -1) groups ages by decade (17 → 10), an integer key; the three youngest
    decades hold thousands each, far above partition selection's threshold at ε = 5."""
    result = engine.session("alice", epsilon=5.0).execute(
        "SELECT TRUNC(age, -1) AS decade, COUNT(*) FROM adult GROUP BY 1 ORDER BY 1")
    assert result.columns == ("decade", "count")
    assert [r[0] for r in result.rows][:3] == [10, 20, 30]


@pytest.mark.parametrize("sql, words", [
    ("SELECT SUM(TRUNC(age, 1)) FROM adult", "decimal places"),
    ("SELECT SUM(TRUNC(age, hours_per_week)) FROM adult", "constant number of digits"),
])
def test_refusals(engine: Engine, sql: str, words: str) -> None:
    assert_refused(engine, sql, "0A000", words)
