"""The PostgreSQL backend on a real server: totality, same answers as DuckDB, bounding.

The server is the one `pg_dsn` finds (tests/pg.py); every database here is a throwaway
created and dropped by the fixtures. Exact (noiseless) aggregates are read through
`rewrite()` + `backend.run_aggregate()` directly — a hook neither the DB-API nor the wire
exposes.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
from sqlglot import exp, parse_one

from dpproxy import errors
from dpproxy.analyze.aggregates import Statistic
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.cli import main as cli_main
from dpproxy.policy import ColumnPolicy, Policy, TablePolicy, load_policy
from dpproxy.rewrite import clamped, make_total
from dpproxy.rewrite_postgres import DATE_PATTERN, NUMBER_PATTERN
from dpproxy.session import Engine, analyst_account
from tests.exact import exact_rows, plan_for
from tests.pg import answers, scratch_database, throwaway_cluster
from tests.test_rewrite import (
    COLUMNS,
    GRID_EXPRESSIONS,
    HEAVY_UNIT,
    LIGHT_UNITS,
    MAX_GROUPS,
    MAX_ROWS,
    SMALL_POLICY,
    UPPER,
    _grid_rows,
    heavy_rows,
    light_row,
    typed,
)

PG_GRID_TYPES = "age INTEGER, hours INTEGER, gain INTEGER, x DOUBLE PRECISION, n INTEGER, " \
                "u INTEGER, s TEXT, d DATE"


# -- helpers ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_backend(pg_demo_dsn: str) -> Iterator[PostgresBackend]:
    backend = PostgresBackend(pg_demo_dsn, ["adult", "visits", "occupation_groups"],
                              statement_timeout_s=60)
    yield backend
    backend.close()


@pytest.fixture
def wide_policy(make_policy: Any) -> Policy:
    """The demo policy with bounds that never bind on the demo data (at most 50 visits and
    50 days per person), so bounding keeps every row and both backends see the same rows."""
    return load_policy(make_policy(replace={
        "max_groups_per_unit = 4\nmax_rows_per_unit = 10":
            "max_groups_per_unit = 400\nmax_rows_per_unit = 50",
        "budget = { epsilon = 10.0, delta = 1e-5 }": "budget = { epsilon = 1e9, delta = 0.5 }",
    }))


# -- 1. the throwaway cluster -----------------------------------------------------------------

def test_throwaway_cluster_starts_answers_and_stops() -> None:
    """The fallback used when no server answers: started, reachable, stopped and gone."""
    try:
        cluster = throwaway_cluster()
        dsn = cluster.__enter__()
    except Exception as exc:  # reported with its reason
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"cannot start a throwaway cluster in CI: {exc}")
        pytest.skip(f"cannot start a cluster here: {exc}")
    try:
        assert answers(dsn)
        with psycopg.connect(dsn) as con:
            (version,) = con.execute("SHOW server_version_num").fetchone()  # type: ignore[misc]
            assert int(version) >= 130000
    finally:
        cluster.__exit__(None, None, None)
    assert not answers(dsn, timeout_s=1)


# -- 2. totality --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_grid(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """test_rewrite's grid of column values in PostgreSQL, plus rows at the edges of every
    type: int4 extremes, ±1e300, 1e-300, NaN, ±Infinity, junk text, infinite and extreme
    dates."""
    with scratch_database(pg_dsn) as dsn, psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"CREATE TABLE g ({PG_GRID_TYPES})")
        con.execute(f"CREATE TABLE edge ({PG_GRID_TYPES})")
        with con.cursor() as cur:
            cur.executemany("INSERT INTO g VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            _grid_rows())
        con.execute("""INSERT INTO edge VALUES
            (2147483647, -2147483648, 0, 1e300, 0, -2147483648, '1e999', 'infinity'),
            (-2147483648, 2147483647, 1, -1e300, -1, 2147483647, '2024-02-30', '-infinity'),
            (0, 0, -1, 1e-300, 1, 0, 'abc\\', '5874897-12-31'),
            (1, 1, 2147483647, 'NaN', 2, -1, ' 12 ', '4713-11-24 BC'),
            (40, 7, 7, 'Infinity', 3, 1, '2024-02-29', '2024-02-29'),
            (NULL, NULL, NULL, '-Infinity', NULL, NULL, NULL, NULL)""")
        yield con


@pytest.mark.parametrize("sql", GRID_EXPRESSIONS)
def test_bounds_are_sound_on_postgres(pg_grid: psycopg.Connection[Any], sql: str) -> None:
    """As test_rewrite's DuckDB check: the total expression, evaluated by PostgreSQL on
    values within the column bounds, stays in the analyzer's interval and never raises."""
    t = typed(sql)
    total = make_total(parse_one(sql, read="postgres"), TablePolicy("g", COLUMNS), "postgres")
    values = [r[0] for r in pg_grid.execute(f"SELECT {total.sql('postgres')} FROM g")]
    present = [float(v) for v in values if v is not None]
    assert present or t.nullable
    for value in present:
        assert t.lower - 1e-9 <= value <= t.upper + 1e-9, (sql, value)
        if t.integer:
            assert value == math.floor(value)
    if not t.nullable:
        assert None not in values


CLAMP_VALUES = [None, math.nan, math.inf, -math.inf, -0.0, 0.0, 5.5, -3.0, 1e300, -1e300,
                100.0, 100.5, 7.0]
CLAMP_TABLE = TablePolicy("c", {"x": ColumnPolicy("x", "float"), "i": ColumnPolicy("i", "int")})
# as the engine reads c from PostgreSQL: `i` INTEGER, clamped in its own type
STORED_TABLE = TablePolicy("c", {"x": ColumnPolicy("x", "float", storage="double precision"),
                                 "i": ColumnPolicy("i", "int", storage="integer")})


def _clamp(v: float | None, lower: float, upper: float) -> float | None:
    """The clamp as specified: NULL stays NULL, NaN is above every number."""
    if v is None:
        return None
    return upper if math.isnan(v) else min(max(v, lower), upper)


@pytest.mark.parametrize(("sql", "lower", "upper", "integer", "center", "reference"), [
    ("x", 0.0, 100.0, False, 0.0, lambda v: v),  # a bare column: one CASE on both
    ("x", -10.0, 10.0, False, 2.5, lambda v: v),  # centred (AVG's sums)
    ("x * 2", 0.0, 100.0, False, 0.0, lambda v: None if v is None else v * 2),
    ("i", 0.0, 10.0, True, 0.0, lambda v: v),  # rounded: whole numbers for the noise
    ("i - 1", 0.0, 10.0, True, 0.0, lambda v: None if v is None else v - 1),
    ("i", -6.0, 10.0, True, 2.0, lambda v: v),  # as stored: no cast, no ROUND
    ("i", -5.0, 10.0, True, 2.5, lambda v: v),
    ("x", 0.0, 100.0, False, 0.0, lambda v: v),
], ids=["column", "centred", "expression", "int", "int-expression", "int-stored",
        "int-stored-half-centre", "double-stored"])
def test_clamped_values_agree_on_both_backends(
        pg_dsn: str, sql: str, lower: float, upper: float, integer: bool, center: float,
        reference: Any, request: pytest.FixtureRequest) -> None:
    """Each summed value, as the rewrite computes it per row, on PostgreSQL and DuckDB:
    NULL stays NULL, NaN and +Infinity clamp to the upper bound, -Infinity to the lower
    one, everything else to [lower, upper], then minus the centre. The two backends take
    different forms (one CASE, or LEAST/GREATEST guarded against NULL) for some of these."""
    rows = [(k, v, None if v is None or not math.isfinite(v) else int(max(min(v, 1e9), -1e9)))
            for k, v in enumerate(CLAMP_VALUES)]
    statistic = Statistic("sum", parse_one(sql), lower, upper, center, integer)
    source = "i" if sql.startswith("i") else "x"
    expected = [None if (r := reference(v if source == "x" else i)) is None
                else _clamp(float(r), lower, upper) - center for _, v, i in rows]
    got = {}
    with scratch_database(pg_dsn) as dsn, psycopg.connect(dsn, autocommit=True) as con:
        con.execute("CREATE TABLE c (k INTEGER, x DOUBLE PRECISION, i INTEGER)")
        with con.cursor() as cur:
            cur.executemany("INSERT INTO c VALUES (%s, %s, %s)", rows)
        stored = "stored" in request.node.callspec.id
        value = clamped(statistic, STORED_TABLE if stored else CLAMP_TABLE,
                        "postgres").sql("postgres")
        # an int column stored as an integer, with whole bounds, is clamped as it is
        assert ("CAST" not in value and "ROUND" not in value) \
            == (request.node.callspec.id in ("int-stored", "int-stored-half-centre"))
        got["postgres"] = [r[0] for r in con.execute(f"SELECT {value} FROM c ORDER BY k")]
    duck = duckdb.connect()
    duck.execute("CREATE TABLE c (k INTEGER, x DOUBLE, i INTEGER)")
    duck.executemany("INSERT INTO c VALUES (?, ?, ?)", rows)
    value = clamped(statistic, CLAMP_TABLE, "duckdb").sql("duckdb")
    got["duckdb"] = [r[0] for r in duck.execute(f"SELECT {value} FROM c ORDER BY k").fetchall()]
    # a real-valued sum's rows are in fixed point: round(value · 2^bits), exact as such
    bits = statistic.fixed_point_bits
    fixed = expected if bits is None else \
        [None if e is None else round(math.ldexp(e, bits)) for e in expected]
    for backend, values in got.items():
        assert [None if v is None else float(v) for v in values] == fixed, backend


UNBOUNDED = TablePolicy("edge", {name: ColumnPolicy(name, kind) for name, kind in [
    ("age", "int"), ("hours", "int"), ("gain", "int"), ("x", "float"), ("n", "int"),
    ("u", "int"), ("s", "text"), ("d", "date")]})

# Each raises on PostgreSQL for some rows of `edge` when run as written (the comment says
# how); made total, it must run on every row.
RAISING_AS_WRITTEN = [
    "1 / (age - 40)",  # division by zero
    "hours % (age - age)",  # modulo by zero
    "age * hours * gain * u",  # integer overflow
    "x * x",  # float8 overflow (1e600) and underflow (1e-600)
    "x / (x * x * x)",  # float8 overflow and underflow, division
    "2147483647 * 2 + age",  # int4 constant arithmetic
    "CASE WHEN age > 0 THEN 2147483647 END * 2",
    "CAST(s AS INT)",  # 'abc\', ' 12 ' and '1e999' are not int4 text
    "CAST(s AS DOUBLE PRECISION) * 1e300",  # '1e999' overflows float8
    "CAST(s AS DECIMAL(4, 1))",  # numeric field overflow
    "CAST(s AS DATE)",  # 2024-02-30
    "CAST(s AS TIMESTAMP)",
    "CAST(s AS BOOLEAN)",
    "CAST(x AS INT)",  # NaN, Infinity, 1e300 out of range
    "CAST(x AS SMALLINT)",
    "CAST(u * 1000 AS INT)",  # out of int4 range
    "CAST(age AS TEXT) || CAST(x AS TEXT)",
    "SUBSTRING(s, age, hours)",  # negative length; positions beyond int4
    "SUBSTRING(s, x, 2)",  # NaN and 1e300 as a position
    "d + 7",  # date out of range at 5874897-12-31
    "d - 7",  # and at 4713 BC
    "d - DATE '2024-01-01'",  # cannot subtract infinite dates
    "EXTRACT(hour FROM d)",  # unit not supported for type date
    "EXTRACT(year FROM d) * 1000",
    "DATE_TRUNC('month', d)",  # beyond the timestamp range
    "s LIKE 'abc\\'",  # LIKE pattern must not end with escape character
    "ROUND(x * 1e300, 2)",
    "ABS(-age) + -(hours)",  # -(-2147483648) overflows int4
    "LEAST(GREATEST(capital / 0, 0), 1)".replace("capital", "gain"),
    "COALESCE(CAST(s AS INT), 0) / NULLIF(age, 0)",
    "LENGTH(s) * 2147483647 * 2147483647",
]


@pytest.mark.parametrize("sql", RAISING_AS_WRITTEN)
def test_expressions_that_raise_as_written_are_total(pg_grid: psycopg.Connection[Any],
                                                     sql: str) -> None:
    ast = parse_one(sql, read="postgres")
    total = make_total(ast, UNBOUNDED, "postgres").sql("postgres")
    # as text: the server evaluates everything; loading values is not what is tested
    rows = pg_grid.execute(f"SELECT CAST(({total}) AS TEXT) FROM edge").fetchall()
    assert len(rows) == 6


PLAIN_COMPARISONS = ["x > 1e15", "x <= -1e15", "age > 1e15", "gain = 40.5", "x > age",
                     "hours >= 2147483647", "n <> 0.1", "1e15 < u"]


@pytest.mark.parametrize("sql", PLAIN_COMPARISONS)
def test_plain_comparisons_skip_numeric_and_agree_with_it(pg_grid: psycopg.Connection[Any],
                                                          sql: str) -> None:
    """A numeric column compared with a number runs as written (no NUMERIC conversion
    per row): on the edge rows (±1e300, NaN, ±Infinity, int4 extremes) it never raises
    and gives what the NUMERIC comparison gives (NaN sorts above every number in both)."""
    total = make_total(parse_one(sql, read="postgres"), UNBOUNDED, "postgres").sql("postgres")
    assert "DECIMAL" not in total
    numeric = parse_one(sql, read="postgres")
    for column in numeric.find_all(exp.Column):
        column.replace(exp.cast(column.copy(), "DECIMAL"))
    rows = pg_grid.execute(f"SELECT {total}, {numeric.sql('postgres')} FROM edge "
                           "WHERE x IS NULL OR x NOT IN ('Infinity', '-Infinity')").fetchall()
    assert len(rows) == 4
    assert all(plain == exact for plain, exact in rows)


def test_the_edge_rows_do_raise_as_written(pg_grid: psycopg.Connection[Any]) -> None:
    """The table above is not vacuous: PostgreSQL raises on these, written plainly."""
    raising = ["1 / (age - 40)", "age * hours * gain * u", "x * x", "CAST(s AS INT)",
               "CAST(s AS DATE)", "d + 7", "d - DATE '2024-01-01'", "EXTRACT(hour FROM d)",
               "s LIKE 'abc\\'", "SUBSTRING(s, age, hours)", "CAST(x AS INT)"]
    for sql in raising:
        with pytest.raises(psycopg.Error):
            pg_grid.execute(f"SELECT {sql} FROM edge").fetchall()
        pg_grid.execute("SELECT 1")  # autocommit: the connection is usable again


@pytest.mark.parametrize(("text", "number", "date"), [
    ("12", True, False), (" -1.5e3 ", True, False), (".5", True, False), ("1e999", True, False),
    ("1e1000", False, False), ("abc", False, False), ("1_000", False, False),
    ("NaN", False, False), ("٣", False, False), ("2024-02-29", False, True),
    ("2023-02-29", False, False), ("2000-02-29", False, True), ("1900-02-29", False, False),
    ("0000-01-01", False, False), ("2024-04-31", False, False),
    ("2024-01-05 23:59:59.5", False, True), ("2024-01-05T10:00", False, True),
    ("2024-1-5", False, False),
])
def test_cast_guards_admit_exactly_what_the_cast_accepts(pg_grid: psycopg.Connection[Any],
                                                         text: str, number: bool,
                                                         date: bool) -> None:
    """Where a guard admits a string, PostgreSQL's cast succeeds (checked here); where it
    refuses one, the value is NULL."""
    row = pg_grid.execute("SELECT %s ~ %s, %s ~ %s",
                          [text, NUMBER_PATTERN, text, DATE_PATTERN]).fetchone()
    assert row == (number, date)
    if number:
        pg_grid.execute("SELECT CAST(%s::text AS NUMERIC)", [text])
    if date:
        pg_grid.execute("SELECT CAST(%s::text AS DATE), CAST(%s::text AS TIMESTAMP)",
                        [text, text])


# Queries that would fail at execution on some data, through the whole session on the
# PostgreSQL demo: each is answered, or rejected before the charge — never a backend error.
SESSION_QUERIES = [
    "SELECT SUM(1 / (age - 40)) FROM adult",
    "SELECT SUM(LEAST(GREATEST(1 / (age - 40), -1), 1)) FROM adult",
    "SELECT COUNT(*) FROM adult WHERE hours_per_week % (age - age) = 0",
    "SELECT COUNT(*) FROM adult WHERE CAST(occupation AS INT) > 0",
    "SELECT COUNT(*) FROM adult WHERE CAST(education AS DATE) > DATE '2024-01-01'",
    "SELECT COUNT(*) FROM adult WHERE CAST(sex AS BOOLEAN)",
    "SELECT COUNT(*) FROM adult WHERE capital_gain * capital_gain * capital_gain * "
    "capital_gain * capital_gain > 0",
    "SELECT COUNT(*) FROM visits WHERE amount * 1e300 * 1e300 > 0",
    "SELECT COUNT(*) FROM visits WHERE amount * 1e-300 * 1e-300 > 0",
    "SELECT COUNT(*) FROM adult WHERE CAST(capital_gain * 100000 AS INT) > 0",
    "SELECT COUNT(*) FROM adult WHERE SUBSTRING(education, age - 100, age - 60) = ''",
    "SELECT COUNT(*) FROM visits WHERE day + 999999 > DATE '2024-01-01'",
    "SELECT COUNT(*) FROM visits WHERE EXTRACT(hour FROM day) = 0",
    "SELECT COUNT(*) FROM adult WHERE education LIKE 'abc\\'",
    "SELECT SUM(CASE WHEN age > 50 THEN 2147483647 END * 2) FROM adult",
    "SELECT AVG(CAST(amount AS DECIMAL(3, 1))) FROM visits",
    "SELECT COUNT(*) FROM visits WHERE CAST(day AS INT) > 0",
    "SELECT COUNT(*) FROM adult WHERE FLOOR(age, 1) > 3",
    "SELECT COUNT(*) FROM adult WHERE age * 1e99999 * 1e99999 > 0",
]


@pytest.mark.parametrize("backend_kind", ["postgres"])
@pytest.mark.parametrize("sql", SESSION_QUERIES)
def test_queries_run_or_are_rejected_up_front(make_policy: Any, sql: str) -> None:
    with Engine(load_policy(make_policy(replace={
            "budget = { epsilon = 10.0, delta = 1e-5 }":
            "budget = { epsilon = 1e9, delta = 0.5 }"}))) as engine:
        session = engine.session("alice")
        before = session.remaining()
        try:
            result = session.execute(sql)
        except errors.Error as exc:
            assert not isinstance(exc, errors.BackendError), f"failed at execution: {exc}"
            assert session.remaining() == before  # rejected up front: free
            assert engine.ledger.history() == []
        else:
            assert len(result.rows) == 1 and result.cost is not None


@pytest.mark.parametrize("backend_kind", ["postgres"])
@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT COUNT(*) FROM visits WHERE CAST(day AS INT) > 0", "CAST of a date"),
    ("SELECT COUNT(*) FROM adult WHERE FLOOR(age, 1) > 3", "ROUND"),
    ("SELECT COUNT(*) FROM adult WHERE age * 1e99999 * 1e99999 > 0", "too large"),
    # a division's cost grows with its digits (98,000 by 49,000: 0.4 s a row), so wide
    # numbers could make a query's time tell whether a chosen row exists (a review)
    ("SELECT COUNT(*) FROM adult WHERE (age + 1e98000 / 7) / (age + 1e49000 / 7) > 0",
     "divides numbers too wide"),
    # a value per person is read outside as a column of at most 400 digits: its argument
    # must not be wider (n * 1e50000 overflowed NUMERIC only where the person was)
    ("SELECT COUNT(*) FROM (SELECT person_id, MAX(age * 1e990) AS n FROM adult GROUP BY "
     "person_id) s WHERE n * 1e600 > 0", "value per person"),
    ("SELECT COUNT(*) FROM (SELECT person_id, SUM(age * 1e500) AS n FROM adult GROUP BY "
     "person_id) s WHERE n > 0", "value per person"),
])
def test_what_cannot_be_total_is_rejected_for_free(make_policy: Any, sql: str,
                                                   message: str) -> None:
    with Engine(load_policy(make_policy())) as engine:
        session = engine.session("alice")
        with pytest.raises(errors.NotSupportedError) as caught:
            session.execute(sql)
        assert message in str(caught.value)
        assert engine.ledger.history() == []


# -- 3. same answers on both backends ---------------------------------------------------------

SAME_ANSWER_QUERIES = [
    "SELECT COUNT(*), SUM(hours_per_week), AVG(age), COUNT(DISTINCT person_id) FROM adult",
    "SELECT occupation, COUNT(*), SUM(capital_gain), AVG(hours_per_week) FROM adult "
    "GROUP BY occupation",
    "SELECT sex, income, COUNT(occupation), SUM(age * 52 - 100) FROM adult "
    "GROUP BY sex, income",
    "SELECT education, SUM(LEAST(GREATEST(capital_gain / (age - 40), -1000), 1000)) "
    "FROM adult GROUP BY education",
    "SELECT age, COUNT(*), SUM(hours_per_week % 7) FROM adult GROUP BY age",
    "SELECT COUNT(*) FROM adult WHERE CAST(age AS TEXT) = '39' AND education LIKE '%th'",
    "SELECT COUNT(*) FROM adult WHERE LOWER(sex) = 'female' AND "
    "SUBSTRING(education, 1, 2) = 'HS' OR CAST(age AS DOUBLE PRECISION) / 2 > 40.25",
    "SELECT SUM(CASE WHEN age > 50 THEN 1 ELSE 0 END), SUM(ABS(age - 40)) FROM adult",
    "SELECT COUNT(*), SUM(amount), AVG(amount) FROM visits",
    "SELECT day, COUNT(*), SUM(amount) FROM visits GROUP BY day",
    "SELECT COUNT(*), SUM(amount * 2 - 100) FROM visits WHERE EXTRACT(month FROM day) = 3 "
    "AND day - DATE '2024-01-01' > 10 AND day + 7 < DATE '2024-12-01'",
    "SELECT COUNT(*) FROM visits WHERE DATE_TRUNC('month', day) = DATE '2024-06-01'",
    "SELECT SUM(CAST(amount AS INT)), SUM(ROUND(amount, 1)) FROM visits",
]


@pytest.mark.parametrize("sql", SAME_ANSWER_QUERIES)
def test_exact_aggregates_are_the_same_on_duckdb_and_postgres(
        wide_policy: Policy, demo_database: Path, pg_backend: PostgresBackend, sql: str
) -> None:
    """Counts identical, sums within 1e-9 relative (DuckDB sums DOUBLEs, PostgreSQL exact
    NUMERICs), same groups."""
    plan = plan_for(wide_policy, sql)
    duck = DuckDBBackend(demo_database)
    try:
        on_duckdb = exact_rows(duck, plan)
    finally:
        duck.close()
    on_postgres = exact_rows(pg_backend, plan)
    assert on_duckdb.keys() == on_postgres.keys()
    assert len(on_duckdb) >= 1
    for key, values in on_duckdb.items():
        for ours, theirs in zip(values, on_postgres[key], strict=True):
            assert theirs == pytest.approx(ours, rel=1e-9, abs=1e-9), (key, ours, theirs)


def test_visits_bounding_binds_the_same_way_in_total(pg_backend: PostgresBackend,
                                                     make_policy: Any) -> None:
    """With the demo's binding bounds (10 rows per person), COUNT(*) keeps exactly
    Σ min(visits, 10) rows on PostgreSQL whichever rows the random order picks."""
    plan = plan_for(load_policy(make_policy()), "SELECT COUNT(*) FROM visits")
    with psycopg.connect(pg_backend_dsn(pg_backend)) as con:
        (expected,) = con.execute("SELECT SUM(LEAST(n, 10)) FROM (SELECT COUNT(*) AS n "
                                  "FROM visits GROUP BY person_id) c").fetchone()  # type: ignore[misc]
    (got,) = exact_rows(pg_backend, plan)[()]
    assert got == expected


def pg_backend_dsn(backend: PostgresBackend) -> str:
    return backend._pool.conninfo  # the DSN the pool connects with


# -- 4. contribution bounding on PostgreSQL ---------------------------------------------------

@pytest.fixture(scope="module")
def small_pg(pg_dsn: str) -> Iterator[str]:
    """test_rewrite's small table (unit 0 has 50 rows) in a throwaway database."""
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn) as con, con.cursor() as cur:
            cur.execute("CREATE TABLE t (uid INTEGER NOT NULL, v INTEGER, x DOUBLE PRECISION, "
                        "w INTEGER, g TEXT, p TEXT)")
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s)",
                            heavy_rows() + [light_row(i) for i in LIGHT_UNITS])
        yield dsn


def test_heavy_unit_is_bounded_on_postgres(small_pg: str, make_policy: Any) -> None:
    """Unit 0 (50 rows, v = 100) keeps 3 rows in each of 2 groups: it moves COUNT by exactly
    3·2 = 6 and SUM(v) by 600 — the plan's L1 sensitivities — on every run. Over 20 runs the
    kept groups are the same every time with probability about 3·(1/3)^20 < 1e-9."""
    text = SMALL_POLICY.replace('kind = "duckdb"\npath = "small.duckdb"',
                                f'kind = "postgres"\ndsn = "{small_pg}"')
    policy = load_policy(make_policy(text=text))
    plan = plan_for(policy, "SELECT g, COUNT(*), SUM(v) FROM t GROUP BY g", analyst="bob")
    count_m, v_m = plan.measurements
    assert (count_m.sensitivity, v_m.sensitivity) == (MAX_ROWS * MAX_GROUPS,
                                                      MAX_ROWS * MAX_GROUPS * UPPER)
    backend = PostgresBackend(small_pg, ["t"])
    try:
        with psycopg.connect(small_pg) as con:
            without = {r[0]: (r[1], r[2]) for r in con.execute(
                "SELECT g, COUNT(*), SUM(v) FROM t WHERE uid <> %s AND g IN ('a', 'b', 'c') "
                "GROUP BY g", [HEAVY_UNIT])}
        kept: set[tuple[str, ...]] = set()
        for _ in range(20):
            got = exact_rows(backend, plan)
            count_change = {k[0]: got[k][0] - without[k[0]][0] for k in got}
            v_change = {k[0]: got[k][1] - without[k[0]][1] for k in got}
            assert set(count_change) == {"a", "b", "c"}
            assert all(0 <= c <= MAX_ROWS for c in count_change.values())
            assert sum(count_change.values()) == count_m.sensitivity
            assert sum(abs(c) for c in v_change.values()) == v_m.sensitivity
            kept.add(tuple(sorted(k for k, c in count_change.items() if c)))
        assert len(kept) > 1  # the salt changes which groups unit 0 keeps
    finally:
        backend.close()


# -- 5. the backend itself --------------------------------------------------------------------

@pytest.fixture
def scratch(pg_dsn: str) -> Iterator[str]:
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn) as con:
            con.execute("CREATE TABLE secret (name TEXT, n INTEGER)")
            con.execute("INSERT INTO secret VALUES ('Zebulon Quist', 1)")
        yield dsn


def test_connections_are_read_only(scratch: str) -> None:
    backend = PostgresBackend(scratch, ["secret"])
    try:
        for sql in ("DELETE FROM secret", "CREATE TABLE other (a int)",
                    "SET TRANSACTION READ WRITE; DELETE FROM secret",
                    "COMMIT; SET default_transaction_read_only = off; DELETE FROM secret"):
            with pytest.raises(errors.BackendError):
                backend.run_aggregate(sql)
        assert backend.run_aggregate("SELECT COUNT(*) FROM secret") == [(1,)]
    finally:
        backend.close()


def test_backend_errors_do_not_quote_data(scratch: str) -> None:
    backend = PostgresBackend(scratch, ["secret"])
    try:
        with pytest.raises(errors.BackendError) as caught:
            backend.run_aggregate("SELECT CAST(name AS INT) FROM secret")
        err = caught.value
        assert "Zebulon" not in f"{err} {err.detail} {err.hint}"
        assert err.sqlstate == "58000"
    finally:
        backend.close()


@pytest.mark.parametrize(("policy_line", "expected"), [
    ("", "32MB"), ('work_mem = "64MB"', "64MB"), ('work_mem = ""', None)])
def test_sessions_take_work_mem_from_the_policy(scratch: str, tmp_path: Path,
                                                 policy_line: str, expected: str | None
                                                 ) -> None:
    """dpproxy's sessions run with the policy's work_mem (32MB unless it says otherwise),
    or, with work_mem = "", whatever the server gives a new session."""
    with psycopg.connect(scratch) as con:
        server = con.execute("SHOW work_mem").fetchone()
    policy = tmp_path / "p.toml"
    policy.write_text(f'[backend]\nkind = "postgres"\ndsn = "{scratch}"\n{policy_line}\n'
                      '[tables.secret]\n[tables.secret.columns]\nn = { type = "int" }\n'
                      '[analysts.a]\nbudget = { epsilon = 1.0 }\ntables = ["secret"]\n')
    backend = PostgresBackend.open(load_policy(policy))
    try:
        assert backend.run_aggregate("SHOW work_mem") == [(expected or server[0],)]
    finally:
        backend.close()


def test_a_failure_after_the_charge_is_audited_once_with_its_charge(
        scratch: str, tmp_path: Path) -> None:
    """The table is dropped after its query ran once (and the backend planned it): run
    again at another ε, the query is charged, then fails in the backend, and the audit log
    holds one record of that, with its cost and charge."""
    policy = tmp_path / "p.toml"
    policy.write_text(f'[backend]\nkind = "postgres"\ndsn = "{scratch}"\n'
                      '[tables.secret]\n[tables.secret.columns]\nn = { type = "int" }\n'
                      '[analysts.a]\nbudget = { epsilon = 1.0 }\ntables = ["secret"]\n')
    with Engine.from_path(policy) as engine:
        session = engine.session("a", epsilon=0.25)
        session.execute("SELECT COUNT(*) FROM secret")
        with psycopg.connect(scratch, autocommit=True) as con:
            con.execute("DROP TABLE secret")
        session.set_option("epsilon", 0.5)
        with pytest.raises(errors.BackendError):
            session.execute("SELECT COUNT(*) FROM secret")
        assert engine.audit.path is not None
        records = [json.loads(line) for line in engine.audit.path.read_text().splitlines()]
    assert [(r["outcome"], r["charge_id"] is not None) for r in records] \
        == [("released", True), ("failed", True)]
    assert records[1]["epsilon"] == 0.5


def test_a_table_gone_before_its_first_query_is_refused_uncharged(
        scratch: str, tmp_path: Path) -> None:
    """Dropped before any query: planning the statement before the charge finds it."""
    policy = tmp_path / "p.toml"
    policy.write_text(f'[backend]\nkind = "postgres"\ndsn = "{scratch}"\n'
                      '[tables.secret]\n[tables.secret.columns]\nn = { type = "int" }\n'
                      '[analysts.a]\nbudget = { epsilon = 1.0 }\ntables = ["secret"]\n')
    with Engine.from_path(policy) as engine:
        with psycopg.connect(scratch, autocommit=True) as con:
            con.execute("DROP TABLE secret")
        with pytest.raises(errors.BackendError) as raised:
            engine.session("a").execute("SELECT COUNT(*) FROM secret")
        assert "nothing was charged" in raised.value.message
        assert engine.ledger.status("analyst:a").spent.epsilon == 0


@pytest.mark.parametrize("sql", [
    "SELECT SUM(x), AVG(x), COUNT(x) FROM n", "SELECT MEDIAN(x) FROM n",
    "SELECT SUM(x) FROM n WHERE x > 0.5", "SELECT x, COUNT(*) FROM n GROUP BY x"])
def test_a_numeric_column_beyond_double_range_raises_nothing(
        pg_dsn: str, tmp_path: Path, sql: str) -> None:
    """A column declared float [0, 100] but stored as NUMERIC, holding 1e400, -1e400 and
    1e-330, none of which converts to DOUBLE PRECISION: the engine reads its type, so the
    rewrite clamps it in NUMERIC, and the query runs on that table as on one without
    those rows."""
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            for table, extra in (("n", ["1e400", "-1e400", "1e-330"]), ("n0", [])):
                con.execute(f"CREATE TABLE {table} (uid INTEGER, x NUMERIC)")
                values = ["1.5", "20", "99", *extra]
                with con.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table} VALUES (%s, %s::numeric)",
                                    list(enumerate(values)))
        policy = tmp_path / "n.toml"
        policy.write_text(
            f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n[privacy]\nmechanism = "laplace"\n'
            + "".join(f'[tables.{t}]\n[tables.{t}.columns]\n'
                      'x = { type = "float", lower = 0, upper = 100 }\n' for t in ("n", "n0"))
            + '[analysts.a]\nbudget = { epsilon = 100.0, delta = 0.1 }\n'
              'tables = ["n", "n0"]\n')
        with Engine.from_path(policy) as engine:
            assert engine.policy.tables["n"].columns["x"].storage == "numeric"
            session = engine.session("a")
            for table in ("n", "n0"):
                assert session.execute(sql.replace(" n", f" {table}")).columns


def test_an_integer_column_is_clamped_by_its_policy_name(
        pg_dsn: str, tmp_path: Path) -> None:
    """A BIGINT column named "Hx" in the database and the policy, spelt hx in the query:
    clamped in its own type, under the name the database knows. Exact statistics, before
    noise: SUM and AVG's sum of the clamped values, unit by unit (one row each)."""
    values = [-3, 0, 4, 10, 25, None]
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute('CREATE TABLE m (uid INTEGER, "Hx" BIGINT)')
            with con.cursor() as cur:
                cur.executemany("INSERT INTO m VALUES (%s, %s)", list(enumerate(values)))
        policy = tmp_path / "m.toml"
        policy.write_text(
            f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n[tables.m]\nprivacy_unit = "uid"\n'
            '[tables.m.columns]\nuid = { type = "int" }\n'
            'Hx = { type = "int", lower = 0, upper = 10 }\n'
            '[analysts.a]\nbudget = { epsilon = 100.0, delta = 0.1 }\ntables = ["m"]\n')
        with Engine.from_path(policy) as engine:
            assert engine.policy.tables["m"].columns["Hx"].storage == "bigint"
            clamped_sum = sum(min(max(v, 0), 10) for v in values if v is not None)
            plan = plan_for(engine.policy, "SELECT SUM(hx) FROM m", analyst="a")
            assert exact_rows(engine.backend, plan) == {(): (float(clamped_sum),)}
            avg = plan_for(engine.policy, "SELECT AVG(hx) FROM m", analyst="a")
            # AVG's sum is centred on 5: Σ (clamp − 5) over the 5 non-NULL values
            (sums,) = [i for i, m in enumerate(avg.measurements) if m.statistic.kind == "sum"]
            assert exact_rows(engine.backend, avg)[()][sums] == float(clamped_sum - 5 * 5)


def test_statement_timeout_spares_the_charged_statement(scratch: str) -> None:
    """The sessions run under statement_timeout_s, but the charged statement runs to its
    end: cancelled, it failed where the data made it slow, and so did its every repeat,
    each charged again (README: such a query stays charged and is not stopped, and its
    answer is kept for a repeat). The setting is back for the connection's next use."""
    backend = PostgresBackend(scratch, ["secret"], statement_timeout_s=0.2)
    try:
        assert backend.run_aggregate("SELECT 7 FROM pg_sleep(0.6)") == [(7,)]
        with backend._pool.connection() as conn:  # the pool's one connection, reused
            assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
            with pytest.raises(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(30)")
    finally:
        backend.close()


def test_slow_query_answers_through_a_session_under_the_timeout(scratch: str, tmp_path: Path
                                                                 ) -> None:
    """A grouped MEDIAN over 300,000 rows takes longer than the policy's 50 ms statement
    timeout: it is charged once and answered (through the DB-API's session, which has no
    timeout of its own), where PostgreSQL cancelled it after the charge before."""
    with psycopg.connect(scratch, autocommit=True) as con:
        con.execute("CREATE TABLE slow AS SELECT g AS uid, g % 7 AS k, g % 1000 AS x "
                    "FROM generate_series(1, 300000) AS g")
    policy = tmp_path / "slow.toml"
    policy.write_text(
        f'[backend]\nkind = "postgres"\ndsn = "{scratch}"\n'
        f'[ledger]\npath = "{(tmp_path / "l.sqlite").as_posix()}"\n'
        f'[audit]\npath = "{(tmp_path / "a.jsonl").as_posix()}"\n'
        '[server]\nstatement_timeout_s = 0.05\n'
        '[tables.slow]\nprivacy_unit = "uid"\n[tables.slow.columns]\n'
        'uid = { type = "int" }\n'
        'k = { type = "int", public_values = [0, 1, 2, 3, 4, 5, 6] }\n'
        'x = { type = "int", lower = 0, upper = 999 }\n'
        '[analysts.a]\nbudget = { epsilon = 100.0 }\ntables = ["slow"]\n')
    with Engine.from_path(policy) as engine:
        session = engine.session("a", epsilon=1.0)
        result = session.execute("SELECT k, MEDIAN(x), COUNT(*) FROM slow GROUP BY k")
        assert len(result.rows) == 7
        assert engine.ledger.status(analyst_account("a")).spent.epsilon == pytest.approx(1.0)


def test_data_version_changes_with_the_data(scratch: str) -> None:
    """Writes reach the statistics counters when the writing session ends (its connection
    is closed here), and TRUNCATE gives the table a new file node."""
    backend = PostgresBackend(scratch, ["secret"])
    try:
        first = backend.data_version()
        assert backend.data_version() == first  # nothing changed
        with psycopg.connect(scratch) as con:
            con.execute("INSERT INTO secret VALUES ('Ada', 2)")
        second = _version_after_change(backend, first)
        with psycopg.connect(scratch) as con:
            con.execute("TRUNCATE secret")
        third = _version_after_change(backend, second)
        assert len({first, second, third}) == 3
    finally:
        backend.close()


@pytest.mark.parametrize("layout", ["inheritance", "partitions"])
def test_data_version_sees_rows_written_to_a_child(scratch: str, layout: str) -> None:
    """Rows written straight into an inheritance child or a partition move the child's
    counters, not the parent's: the parent's version reads its children's too."""
    with psycopg.connect(scratch, autocommit=True) as con:
        if layout == "inheritance":
            con.execute("CREATE TABLE parent (uid INTEGER, n INTEGER)")
            con.execute("CREATE TABLE child () INHERITS (parent)")
        else:
            con.execute("CREATE TABLE parent (uid INTEGER, n INTEGER) PARTITION BY RANGE (uid)")
            con.execute("CREATE TABLE child PARTITION OF parent FOR VALUES FROM (0) TO (1000)")
    backend = PostgresBackend(scratch, ["parent"])
    try:
        first = backend.data_version()
        with psycopg.connect(scratch) as con:
            con.execute("INSERT INTO child SELECT g, 1 FROM generate_series(1, 50) AS g")
        second = _version_after_change(backend, first)
        assert second != first
        assert backend.data_version() == second  # nothing changed since
    finally:
        backend.close()


def test_data_version_of_a_view_never_repeats(scratch: str) -> None:
    """A view's rows have no counters, so its version is never the same twice: a
    cached answer over it is never served again, however its base tables change."""
    with psycopg.connect(scratch, autocommit=True) as con:
        con.execute("CREATE VIEW shown AS SELECT * FROM secret")
    backend = PostgresBackend(scratch, ["shown"])
    try:
        assert len({backend.data_version() for _ in range(3)}) == 3
    finally:
        backend.close()


def test_repeat_over_a_view_sees_its_base_tables_change(scratch: str, tmp_path: Path
                                                        ) -> None:
    """The same query over a view, asked again after 4,000 rows were added under it, is
    charged again and answers from the new rows (at ε = 5 the noise is a few units), where
    it was served the old answer free from the cache before."""
    with psycopg.connect(scratch, autocommit=True) as con:
        con.execute("CREATE TABLE base (uid INTEGER NOT NULL)")
        con.execute("INSERT INTO base SELECT g FROM generate_series(1, 1000) AS g")
        con.execute("CREATE VIEW shown AS SELECT * FROM base")
    policy = tmp_path / "view.toml"
    policy.write_text(
        f'[backend]\nkind = "postgres"\ndsn = "{scratch}"\n'
        f'[ledger]\npath = "{(tmp_path / "l.sqlite").as_posix()}"\n'
        f'[audit]\npath = "{(tmp_path / "a.jsonl").as_posix()}"\n'
        '[tables.shown]\nprivacy_unit = "uid"\n[tables.shown.columns]\n'
        'uid = { type = "int" }\n'
        '[analysts.a]\nbudget = { epsilon = 100.0 }\ntables = ["shown"]\n')
    with Engine.from_path(policy) as engine:
        session = engine.session("a", epsilon=5.0)
        ((before,),) = session.execute("SELECT COUNT(*) FROM shown").rows
        with psycopg.connect(scratch) as con:
            con.execute("INSERT INTO base SELECT g FROM generate_series(1001, 5000) AS g")
        ((after,),) = session.execute("SELECT COUNT(*) FROM shown").rows
        spent = engine.ledger.status(analyst_account("a")).spent
    assert abs(before - 1000) < 100 and abs(after - 5000) < 100
    assert spent.epsilon == pytest.approx(10.0)  # both charged


def _version_after_change(backend: PostgresBackend, old: str) -> str:
    """The new data version; the statistics of a finished session can take a moment to
    be visible, so this polls (up to 10 s) rather than asserting on timing."""
    import time

    deadline = time.monotonic() + 10
    while (version := backend.data_version()) == old and time.monotonic() < deadline:
        time.sleep(0.05)
    return version


def test_password_comes_from_the_environment_and_is_never_shown(
        monkeypatch: pytest.MonkeyPatch, make_policy: Any) -> None:
    secret = "s3cret-never-shown"
    dead = "postgresql://nobody@127.0.0.1:1/none"  # nothing listens on port 1
    policy = load_policy(make_policy(replace={
        'kind = "duckdb"': f'kind = "postgres"\ndsn = "{dead}"\npassword_env = "DPX_PW"'}))
    with pytest.raises(errors.InvalidPolicy) as unset:
        PostgresBackend.open(policy)
    assert "DPX_PW" in str(unset.value)
    monkeypatch.setenv("DPX_PW", secret)
    monkeypatch.setattr("dpproxy.backends.postgres.CONNECT_TIMEOUT_S", 2)
    with pytest.raises(errors.BackendError) as caught:
        PostgresBackend.open(policy)
    shown = f"{caught.value} {caught.value.detail} {caught.value.hint}"
    assert "127.0.0.1:1/none" in shown and secret not in shown
    with pytest.raises(errors.InvalidPolicy) as inline:
        load_policy(make_policy(replace={
            'kind = "duckdb"': 'kind = "postgres"\ndsn = "postgresql://u:pw@h/db"'}))
    assert "password" in str(inline.value)


def test_infinite_dates_load_as_python_dates(scratch: str) -> None:
    backend = PostgresBackend(scratch, [])
    try:
        rows = backend.run_aggregate("SELECT DATE 'infinity', DATE '-infinity', "
                                     "DATE '20000-01-01', CAST(1e400 AS NUMERIC)")
        assert rows == [(dt.date.max, dt.date.min, dt.date.max, math.inf)]
    finally:
        backend.close()


# -- 6. loading the demo ----------------------------------------------------------------------

def test_demo_cli_loads_the_tables_into_a_schema(pg_dsn: str, demo_database: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import duckdb

    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE SCHEMA demo")
        in_schema = psycopg.conninfo.make_conninfo(dsn, options="-csearch_path=demo")
        assert cli_main(["demo", "--postgres", in_schema]) == 0
        assert "loaded into PostgreSQL" in capsys.readouterr().err
        with psycopg.connect(dsn) as con:
            counts = con.execute(
                "SELECT (SELECT COUNT(*) FROM demo.adult), (SELECT COUNT(*) FROM demo.visits),"
                " (SELECT SUM(amount) FROM demo.visits), (SELECT COUNT(*) FROM "
                "demo.occupation_groups)").fetchone()
        duck = duckdb.connect(str(demo_database), read_only=True)
        try:
            expected = duck.execute(
                "SELECT (SELECT COUNT(*) FROM adult), (SELECT COUNT(*) FROM visits), "
                "(SELECT SUM(amount) FROM visits), (SELECT COUNT(*) FROM occupation_groups)"
            ).fetchone()
        finally:
            duck.close()
        assert counts is not None and expected is not None
        assert counts[:2] == expected[:2] and counts[3] == expected[3]
        assert counts[2] == pytest.approx(expected[2], rel=1e-12)




def test_doubles_come_back_exactly_whatever_the_dsn_sets(pg_dsn: str) -> None:
    """Values are read as text: with extra_float_digits = 0 (a server's, a role's or the
    DSN's setting), 0.1 and the next double print alike, and two groups the backend keeps
    apart would be one key in Python (a review found one unit then removed a crowd's
    group). dpproxy's sessions set it to 3, after whatever the DSN sets."""
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, options="-cextra_float_digits=0")
    backend = PostgresBackend(dsn, [])
    try:
        neighbour = math.nextafter(0.1, 1.0)
        rows = backend.run_aggregate(
            "SELECT x FROM (VALUES (CAST($1 AS DOUBLE PRECISION)), "
            "(CAST($2 AS DOUBLE PRECISION))) AS v(x)", [0.1, neighbour])
        assert sorted(r[0] for r in rows) == [0.1, neighbour]
    finally:
        backend.close()
