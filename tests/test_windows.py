"""Window functions over released groups (`dpproxy.windows`): PostgreSQL's semantics,
checked against PostgreSQL itself; post-processing only (one charge, the same as without
the window); and the refusals, with PostgreSQL's SQLSTATEs."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlglot

from dpproxy.postprocess import Value, evaluate
from dpproxy.session import Engine
from dpproxy.windows import compute, describe, extract

from .refusals import assert_refused
from .test_server_support import ServeFactory

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")

# Window expressions over a table r(id, g, a, b): id unique, g a partition text, a an
# integer and b a float, with NULLs and ties. Where a function's value depends on the
# order of peers (which PostgreSQL leaves open), the window's ORDER BY ends with id.
EXPRESSIONS = [
    "SUM(a) OVER ()",
    "SUM(b) OVER (PARTITION BY g)",
    "AVG(a) OVER (PARTITION BY g)",
    "COUNT(*) OVER (PARTITION BY g)",
    "COUNT(*) OVER ()",
    "COUNT(a) OVER (ORDER BY b)",
    "SUM(a) OVER (ORDER BY b)",
    "SUM(a) OVER (ORDER BY b DESC NULLS LAST)",
    "MIN(b) OVER (ORDER BY a NULLS FIRST)",
    "MAX(a) OVER (PARTITION BY g ORDER BY b)",
    "MAX(g) OVER (PARTITION BY a)",
    "MAX(b) OVER (ORDER BY id ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING)",
    "MIN(a) OVER (ORDER BY id ROWS BETWEEN 1 FOLLOWING AND 3 FOLLOWING)",
    "SUM(a) OVER (ORDER BY id ROWS 2 PRECEDING)",
    "SUM(b) OVER (ORDER BY id ROWS BETWEEN 3 PRECEDING AND 1 PRECEDING)",
    "AVG(b) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)",
    "COUNT(*) OVER (ORDER BY a RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)",
    "SUM(a) OVER (ORDER BY a RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)",
    "MIN(b) OVER (ORDER BY a, id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
    "ROW_NUMBER() OVER (ORDER BY b, id)",
    "ROW_NUMBER() OVER (PARTITION BY g ORDER BY a DESC, id)",
    "RANK() OVER (ORDER BY a DESC)",
    "RANK() OVER (PARTITION BY g ORDER BY b NULLS FIRST)",
    "RANK() OVER (ORDER BY a + b)",
    "DENSE_RANK() OVER (ORDER BY a)",
    "PERCENT_RANK() OVER (PARTITION BY g ORDER BY a)",
    "CUME_DIST() OVER (ORDER BY b)",
    "NTILE(3) OVER (ORDER BY a, id)",
    "NTILE(10) OVER (PARTITION BY g ORDER BY id)",
    "LAG(a) OVER (ORDER BY id)",
    "LEAD(b, 2, -1.5) OVER (PARTITION BY g ORDER BY id)",
    "LAG(g, 1, 'none') OVER (ORDER BY id)",
    "LAG(a, -1) OVER (ORDER BY id)",
    "FIRST_VALUE(a) OVER (ORDER BY b, id)",
    "LAST_VALUE(b) OVER (ORDER BY a, id)",
    "NTH_VALUE(a, 2) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED "
    "FOLLOWING)",
    "a * 100.0 / NULLIF(SUM(a) OVER (), 0)",
    "SUM(a) OVER () - a",
    "SUM(a) OVER (PARTITION BY a > 2)",
    "COALESCE(MAX(b) OVER (PARTITION BY g ORDER BY id ROWS BETWEEN 1 FOLLOWING AND 1 "
    "FOLLOWING), 0)",
]


def _table(rng: random.Random, n: int) -> list[dict[str, Value]]:
    return [{"id": i,
             "g": rng.choice(["x", "y", "z", None]),
             "a": rng.choice([0, 1, 2, 3, 4, -2, None]),
             "b": rng.choice([0.5, 1.25, -3.0, 2.0, 1e6, None])} for i in range(n)]


def _same(mine: Value, theirs: Any) -> bool:
    if mine is None or theirs is None:
        return mine is None and theirs is None
    if isinstance(theirs, Decimal | float) or isinstance(mine, float):
        return math.isclose(float(mine), float(theirs), rel_tol=1e-9, abs_tol=1e-9)
    return bool(mine == theirs)


def _dpproxy_values(expression: str, table: list[dict[str, Value]]) -> list[Value]:
    """The expression over the table's rows, as the release step computes it: the table's
    columns stand where keys and aggregates stand in a real query."""
    select, found = extract(sqlglot.parse_one(f"SELECT {expression} FROM r", read="postgres"))
    calls = [describe(node, f"__window{i}", lambda n: n) for i, node in enumerate(found)]
    rows: list[dict[str, Value]] = [{} for _ in table]
    compute(calls, list(range(len(table))), rows, table)
    return [evaluate(select.expressions[0], rows[i], table[i]) for i in range(len(table))]


def _compare_with_postgresql(pg_dsn: str, tables: int = 25) -> tuple[int, int]:
    """(values compared, values that differ): every expression on `tables` random tables
    of 0-40 rows (ties and NULLs in every column), row by row, against PostgreSQL."""
    rng = random.Random(20261124)
    checked = differ = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for _ in range(tables):
            table = _table(rng, rng.choice([0, 1, 2, 5, 13, 40]))
            conn.execute("DROP TABLE IF EXISTS pg_temp.r")
            conn.execute("CREATE TEMP TABLE r (id int, g text, a bigint, b float8)")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO r VALUES (%s, %s, %s, %s)",
                                [(r["id"], r["g"], r["a"], r["b"]) for r in table])
            for expression in EXPRESSIONS:
                theirs = dict(conn.execute(f"SELECT id, {expression} FROM r").fetchall())
                mine = _dpproxy_values(expression, table)
                for row, value in zip(table, mine, strict=True):
                    checked += 1
                    differ += not _same(value, theirs[row["id"]])
    return checked, differ


def test_windows_match_postgresql(pg_dsn: str) -> None:
    """Each of 40 window expressions, on each row of 25 random tables, equals PostgreSQL's
    value over the same rows."""
    checked, differ = _compare_with_postgresql(pg_dsn)
    assert checked > 10_000
    assert differ == 0


def test_an_injected_frame_bug_is_caught(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: RANGE's CURRENT ROW read as ROWS' (peers left out of the
    default frame) differs from PostgreSQL."""
    import dpproxy.windows as windows

    real = windows._frame_of

    def rows_only(frame: windows.Frame, j: int, n: int, starts: list[int], ends: list[int]
                  ) -> tuple[int, int]:
        return real(windows.Frame(True, frame.start, frame.end), j, n, starts, ends)

    monkeypatch.setattr(windows, "_frame_of", rows_only)
    assert _compare_with_postgresql(pg_dsn, tables=5)[1] > 0


SHARE = ("SELECT occupation, COUNT(*) AS c, SUM(COUNT(*)) OVER () AS total, "
         "COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () AS pct, "
         "RANK() OVER (ORDER BY COUNT(*) DESC) AS r, "
         "AVG(AVG(age)) OVER (PARTITION BY COUNT(*) > 2000) AS mean_age, AVG(age) AS age "
         "FROM adult GROUP BY occupation ORDER BY r, occupation")


def test_share_of_total_over_the_wire(serve: ServeFactory, pg_dsn: str) -> None:
    """Percent of total, a rank and a partitioned mean over psycopg: PostgreSQL computing
    the same windows over the released rows gives the same values; the query costs what
    it costs without them (one charge, nothing more)."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        got = conn.execute(SHARE)
        rows = got.fetchall()
        assert got.description is not None
        assert [c.name for c in got.description] == ["occupation", "c", "total", "pct", "r",
                                                     "mean_age", "age"]
        assert [c.type_code for c in got.description] == [25, 20, 701, 701, 20, 701, 701]
        spent = served.spent()
        conn.execute("SELECT occupation, COUNT(*), AVG(age) FROM adult GROUP BY occupation "
                     "ORDER BY occupation")
        assert math.isclose(served.spent(), 2 * spent)
    assert len(rows) == 14  # public keys: every occupation
    with psycopg.connect(pg_dsn, autocommit=True) as pg:
        pg.execute("CREATE TEMP TABLE released (occupation text, c bigint, age float8)")
        with pg.cursor() as cur:
            cur.executemany("INSERT INTO released VALUES (%s, %s, %s)",
                            [(r[0], r[1], r[6]) for r in rows])
        expected = pg.execute(
            "SELECT occupation, c, SUM(c) OVER (), c * 100.0 / SUM(c) OVER (), "
            "RANK() OVER (ORDER BY c DESC), AVG(age) OVER (PARTITION BY c > 2000), age "
            "FROM released ORDER BY 5, occupation").fetchall()
    assert len(expected) == len(rows)
    for mine, theirs in zip(rows, expected, strict=True):
        assert all(_same(m, t) for m, t in zip(mine, theirs, strict=True)), (mine, theirs)


def test_having_before_and_limit_after(engine: Engine) -> None:
    """Windows see the groups HAVING keeps, all of them: ORDER BY and LIMIT come after."""
    alice = engine.session("alice", epsilon=1.0)
    every = alice.execute(
        "SELECT occupation, COUNT(*) AS c, SUM(COUNT(*)) OVER () AS total, COUNT(*) OVER () "
        "AS n FROM adult GROUP BY occupation HAVING COUNT(*) > 1000").rows
    assert every and all(r[2] == sum(x[1] for x in every) and r[3] == len(every)
                         for r in every)
    assert all(r[1] > 1000 for r in every)
    smallest = alice.execute(
        "SELECT occupation, COUNT(*) AS c, ROW_NUMBER() OVER (ORDER BY COUNT(*) DESC, "
        "occupation) AS place, COUNT(*) OVER () AS n FROM adult GROUP BY occupation "
        "ORDER BY c, occupation DESC LIMIT 3").rows
    assert len(smallest) == 3
    n = smallest[0][3]
    assert n == 14  # LIMIT left every group to the window
    assert [r[2] for r in smallest] == [n, n - 1, n - 2]


def test_windows_in_order_by_and_on_private_keys(engine: Engine) -> None:
    """ORDER BY a window, and windows over the groups partition selection released."""
    alice = engine.session("alice", epsilon=1.0)
    result = alice.execute(
        "SELECT day, COUNT(*) AS c, SUM(COUNT(*)) OVER (ORDER BY day) AS running "
        "FROM visits GROUP BY day ORDER BY SUM(COUNT(*)) OVER (ORDER BY day) DESC")
    rows = result.rows
    assert len(rows) > 100
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    total = 0
    for day, count, running in sorted(rows):
        total += count
        assert running == total, day


REFUSED = [
    ("SELECT sex, COUNT(*) FROM adult WHERE ROW_NUMBER() OVER () > 1 GROUP BY sex", "42P20"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING RANK() OVER () > 1", "42P20"),
    ("SELECT COUNT(*) FROM adult GROUP BY RANK() OVER ()", "42P20"),
    ("SELECT sex, RANK() OVER (ORDER BY COUNT(*)) FROM adult GROUP BY 2", "42P20"),
    ("SELECT sex, RANK() OVER (ORDER BY COUNT(*)) AS r FROM adult GROUP BY r", "42P20"),
    ("SELECT sex, RANK() OVER (ORDER BY COUNT(*)) AS r FROM adult GROUP BY sex HAVING r > 1",
     "42P20"),
    ("SELECT sex, SUM(SUM(COUNT(*)) OVER ()) OVER () FROM adult GROUP BY sex", "42P20"),
    ("SELECT sex, SUM(RANK() OVER ()) FROM adult GROUP BY sex", "42803"),
    ("SELECT COUNT(*) OVER () FROM adult", "0A000"),
    ("SELECT ROW_NUMBER() OVER (ORDER BY age) FROM adult", "0A000"),
    ("SELECT sex, SUM(age) OVER () FROM adult GROUP BY sex", "42501"),
    ("SELECT sex, MAX(age) OVER (PARTITION BY sex) FROM adult GROUP BY sex", "42501"),
    ("SELECT sex, COUNT(*), RANK() OVER (ORDER BY education) FROM adult GROUP BY sex",
     "42501"),
    ("SELECT sex, SUM(COUNT(*)) OVER w FROM adult GROUP BY sex", "0A000"),
    ("SELECT sex, SUM(COUNT(*)) OVER (ORDER BY sex RANGE 1 PRECEDING) FROM adult "
     "GROUP BY sex", "0A000"),
    ("SELECT sex, SUM(COUNT(*)) OVER (ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING EXCLUDE "
     "CURRENT ROW) FROM adult GROUP BY sex", "0A000"),
    ("SELECT sex, NTILE(0) OVER (ORDER BY sex) FROM adult GROUP BY sex", "22014"),
    ("SELECT sex, NTH_VALUE(COUNT(*), 0) OVER () FROM adult GROUP BY sex", "22016"),
    ("SELECT sex, SUM(COUNT(*)) OVER (ROWS -1 PRECEDING) FROM adult GROUP BY sex", "22013"),
    ("SELECT sex, SUM(COUNT(*)) OVER (ROWS BETWEEN UNBOUNDED FOLLOWING AND CURRENT ROW) "
     "FROM adult GROUP BY sex", "42P20"),
    ("SELECT sex, SUM(COUNT(*)) OVER (ROWS BETWEEN CURRENT ROW AND 1 PRECEDING) FROM adult "
     "GROUP BY sex", "42P20"),
    ("SELECT sex, SUM(sex) OVER () FROM adult GROUP BY sex", "42804"),
    ("SELECT sex, STDDEV(COUNT(*)) OVER () FROM adult GROUP BY sex", "0A000"),
    ("SELECT sex, COUNT(DISTINCT COUNT(*)) OVER () FROM adult GROUP BY sex", "0A000"),
    ("SELECT sex, LAG(COUNT(*), COUNT(*)) OVER () FROM adult GROUP BY sex", "0A000"),
]


@pytest.mark.parametrize(("sql", "sqlstate"), REFUSED)
def test_refused_before_anything_is_charged(engine: Engine, sql: str, sqlstate: str) -> None:
    assert_refused(engine, sql, sqlstate)


def test_explain_names_each_window_as_free(engine: Engine) -> None:
    alice = engine.session("alice", epsilon=1.0)
    lines = [r[0] for r in alice.execute(
        "EXPLAIN SELECT sex, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () FROM adult "
        "GROUP BY sex").rows]
    assert "  SUM(COUNT(*)) OVER (): over the released groups, after HAVING " \
           "(post-processing: costs nothing)" in lines
    assert engine.ledger.status("analyst:alice").spent.epsilon == 0


def test_windows_over_a_wrapped_query(engine: Engine) -> None:
    """A BI tool's wrapped query (a WITH query merged in): shares of the total add to 1,
    and a partition's sum is the sum of its groups' released counts."""
    alice = engine.session("alice", epsilon=1.0)
    rows = alice.execute(
        "WITH t AS (SELECT occupation, sex AS s FROM adult WHERE age > 30) SELECT occupation, "
        "s, COUNT(*) AS c, COUNT(*) * 1.0 / SUM(COUNT(*)) OVER () AS share, "
        "SUM(COUNT(*)) OVER (PARTITION BY s) AS per_sex FROM t GROUP BY occupation, s").rows
    assert len(rows) == 28
    assert math.isclose(sum(r[3] for r in rows), 1.0, rel_tol=1e-12)
    for sex in ("Female", "Male"):
        mine = [r for r in rows if r[1] == sex]
        assert all(r[4] == sum(x[2] for x in mine) for r in mine)
