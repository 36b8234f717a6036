"""GROUP BY over row expressions, public key sets (`public_range`), and bounds through
expressions, from the policy file to released rows on DuckDB and PostgreSQL.

Noise and tolerances, as in test_queries: value checks run at ε = 1000 per query, so a
statistic of L1 sensitivity Δ among k gets Laplace scale b ≈ kΔ/1000, and every tolerance
is at least 50·b; a (discrete) Laplace draw exceeds 50·b with probability < 2·e^-50 ≈ 4e-22,
so no test here fails by bad luck with any noticeable probability.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import doctest
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from sqlglot import exp

from dpproxy import errors
from dpproxy.accountant import Cost
from dpproxy.analyze import Analysis, analyze
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import Policy, load_policy
from dpproxy.rewrite import rewrite
from dpproxy.session import Engine
from tests.exact import as_released

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


EPS = 1000.0
# The demo policy, with a budget that never runs out and public ranges on age and day
RANGES = {
    "budget = { epsilon = 10.0, delta = 1e-5 }": "budget = { epsilon = 1e9, delta = 0.5 }",
    'age = { type = "int", lower = 17, upper = 90, nullable = false }':
        'age = { type = "int", lower = 17, upper = 90, nullable = false, '
        "public_range = { step = 1 } }",
    'day = { type = "date", lower = 2024-01-01, upper = 2024-12-31, nullable = false }':
        'day = { type = "date", nullable = false, '
        'public_range = { first = "2024-01-01", last = "2024-12-31" } }',
}
MONTHS = tuple(dt.date(2024, m, 1).isoformat() for m in range(1, 13))


@pytest.fixture
def engine(make_policy: Any) -> Iterator[Engine]:
    with Engine.from_path(make_policy(replace=RANGES)) as eng:
        yield eng


@pytest.fixture(scope="module")
def exact_db(demo_database: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[duckdb.DuckDBPyConnection]:
    """The demo data read directly (a copy: see test_queries.exact_db)."""
    copy = tmp_path_factory.mktemp("exact") / "demo.duckdb"
    copy.write_bytes(demo_database.read_bytes())
    con = duckdb.connect(str(copy), read_only=True)
    yield con
    con.close()


def exact(con: duckdb.DuckDBPyConnection, sql: str, width: int = 1
          ) -> dict[Any, tuple[Any, ...]]:
    """Rows by key: the first column, or a tuple of the first `width` columns."""
    return {(row[0] if width == 1 else tuple(row[:width])): tuple(row[width:])
            for row in con.execute(sql).fetchall()}


# -- 1. accepted expression keys, both backends --------------------------------------------------

# (id, query, output columns, the released keys in order, DuckDB SQL of the exact values by
# key, tolerance). Keys are public (enumerated from public_values or public_range), so every
# one is released, zeros included, in the order of the public values; adult has one row per
# person, so the exact values are plain GROUP BY results.
PUBLIC_CASES = [
    ("decades", "SELECT age / 10 * 10, COUNT(*) FROM adult GROUP BY 1",
     ("?column?", "count"), tuple(range(10, 100, 10)),
     "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("decades_alias_desc",
     "SELECT age / 10 * 10 AS decade, COUNT(*) AS n FROM adult GROUP BY decade "
     "ORDER BY decade DESC", ("decade", "n"), tuple(range(90, 0, -10)),
     "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("decades_repeated_expression",
     "SELECT age / 10 * 10, SUM(hours_per_week * 52) FROM adult GROUP BY age / 10 * 10",
     ("?column?", "sum"), tuple(range(10, 100, 10)),
     "SELECT age // 10 * 10, SUM(hours_per_week * 52) FROM adult GROUP BY 1", 260.0),
    ("floor_bins", "SELECT FLOOR(age / 5) * 5 AS b, COUNT(*) FROM adult GROUP BY 1",
     ("b", "count"), tuple(range(15, 95, 5)),
     "SELECT age // 5 * 5, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("qualified_and_parenthesized",
     "SELECT (a.age / 10) * 10, COUNT(*) FROM adult a GROUP BY (age / 10) * 10",
     ("?column?", "count"), tuple(range(10, 100, 10)),
     "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("lower_sex", "SELECT LOWER(sex), COUNT(*) FROM adult GROUP BY LOWER(sex)",
     ("lower", "count"), ("female", "male"),
     "SELECT lower(sex), COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("upper_income_avg",
     "SELECT UPPER(income) AS i, AVG(age) FROM adult GROUP BY 1", ("i", "avg"),
     ("<=50K", ">50K"), "SELECT upper(income), AVG(age) FROM adult GROUP BY 1", 0.05),
    # NULL occupations fall in the ELSE branch: 'b' counts them too, as PostgreSQL would
    ("case_over_public_values",
     "SELECT CASE WHEN occupation IN ('Sales', 'Tech-support') THEN 'a' ELSE 'b' END AS grp, "
     "COUNT(*) FROM adult GROUP BY grp", ("grp", "count"), ("b", "a"),
     "SELECT CASE WHEN occupation IN ('Sales', 'Tech-support') THEN 'a' ELSE 'b' END, "
     "COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("key_in_output_arithmetic",
     "SELECT age / 10 * 10 + 9 AS top, COUNT(*) FROM adult GROUP BY age / 10 * 10",
     ("top", "count"), tuple(range(19, 109, 10)),
     "SELECT age // 10 * 10 + 9, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("having_on_key",
     "SELECT age / 10 * 10 AS d, COUNT(*) FROM adult GROUP BY 1 HAVING age / 10 * 10 >= 60",
     ("d", "count"), (60, 70, 80, 90),
     "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("two_keys_column_and_expression",
     "SELECT sex, age / 30 AS third, COUNT(*) FROM adult GROUP BY sex, 2",
     ("sex", "third", "count"),
     (("Female", 0), ("Female", 1), ("Female", 2), ("Female", 3),
      ("Male", 0), ("Male", 1), ("Male", 2), ("Male", 3)),
     "SELECT sex, age // 30, COUNT(*) FROM adult GROUP BY 1, 2", 1.0),
    ("where_and_expression_key",
     "SELECT age / 10 * 10, COUNT(*) FROM adult WHERE sex = 'Female' GROUP BY 1",
     ("?column?", "count"), tuple(range(10, 100, 10)),
     "SELECT age // 10 * 10, COUNT(*) FROM adult WHERE sex = 'Female' GROUP BY 1", 1.0),
    # boolean keys: the filter on the key needs parentheses, (x LIKE 'S%') IN (FALSE, TRUE)
    ("like_key", "SELECT occupation LIKE 'S%' AS s, COUNT(*) FROM adult GROUP BY 1",
     ("s", "count"), (False, True),
     "SELECT occupation LIKE 'S%', COUNT(*) FROM adult GROUP BY 1", 1.0),
    ("between_key", "SELECT age BETWEEN 20 AND 29 AS twenties, SUM(hours_per_week) "
     "FROM adult GROUP BY 1", ("twenties", "sum"), (False, True),
     "SELECT age BETWEEN 20 AND 29, SUM(hours_per_week) FROM adult GROUP BY 1", 5.0),
    ("substring_key", "SELECT SUBSTRING(education, 1, 1) AS e, COUNT(*) FROM adult "
     "GROUP BY 1", ("e", "count"), ("P", "1", "5", "7", "9", "H", "S", "A", "B", "M", "D"),
     "SELECT substring(education, 1, 1), COUNT(*) FROM adult GROUP BY 1", 1.0),
]


@pytest.mark.parametrize(("sql", "columns", "keys", "truth", "tol"),
                         [pytest.param(*c[1:], id=c[0]) for c in PUBLIC_CASES])
def test_public_expression_keys(engine: Engine, exact_db: duckdb.DuckDBPyConnection, sql: str,
                                columns: tuple[str, ...], keys: tuple[Any, ...], truth: str,
                                tol: float) -> None:
    session = engine.session("alice", epsilon=EPS)
    result = session.execute(sql)
    assert result.columns == columns
    width = len(keys[0]) if isinstance(keys[0], tuple) else 1
    released = [row[:width] if width > 1 else row[0] for row in result.rows]
    assert tuple(released) == keys
    # public keys: no partition selection, so no δ
    assert result.cost == Cost(EPS, 0.0)
    expected = exact(exact_db, truth, width)
    for row in result.rows:
        key = row[:width] if width > 1 else row[0]
        # a public key absent from the data has the exact value 0 (zeros are released)
        want = expected.get(key, (0,))
        for got, w in zip(row[width:], want, strict=True):
            assert abs(got - w) <= tol, (row, want)
    # whole-number keys are ints on both backends (DOUBLE and NUMERIC would differ)
    for row in result.rows:
        for value in row[:width]:
            assert type(value) in (int, str, bool), row


def test_case_key_with_null_branch_drops_null(engine: Engine) -> None:
    """A key expression that is NULL for some public values: NULL is not enumerated, so
    those rows are dropped (as a NULL column value is for public_values)."""
    result = engine.session("alice", epsilon=EPS).execute(
        "SELECT CASE WHEN sex = 'Female' THEN 'f' END AS s, COUNT(*) FROM adult GROUP BY 1")
    assert [r[0] for r in result.rows] == ["f"]
    assert abs(result.rows[0][1] - 10764) <= 1


def test_date_trunc_month_keys_match_backend_exactly(
        engine: Engine, exact_db: duckdb.DuckDBPyConnection) -> None:
    """The 12 month starts enumerated from day's public range are exactly the values the
    backend computes (a TIMESTAMP there): a mismatch would leave a month at zero. Each
    person keeps ≤ 10 rows in each of ≤ 4 months; the bounded count of a month lies between
    the rows of people who visit in at most 4 months (kept whole, capped at 10) and the
    rows of everyone capped at 10 (L1 = 40 → b = 0.04, tolerance 2)."""
    result = engine.session("alice", epsilon=EPS).execute(
        "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1")
    assert result.columns == ("date_trunc", "count")
    assert tuple(r[0] for r in result.rows) == MONTHS
    assert result.cost == Cost(EPS, 0.0)
    bounds = exact(exact_db, """
        WITH per AS (SELECT person_id, date_trunc('month', day) AS m, COUNT(*) AS n
                     FROM visits GROUP BY ALL),
             spread AS (SELECT person_id, COUNT(*) AS months FROM per GROUP BY 1)
        SELECT strftime(m, '%Y-%m-%d'), SUM(CASE WHEN months <= 4 THEN LEAST(n, 10) ELSE 0 END),
               SUM(LEAST(n, 10))
        FROM per JOIN spread USING (person_id) GROUP BY 1""")
    for month, count in result.rows:
        low, high = bounds[month]
        assert low > 100  # far from zero: a key mismatch would show
        assert low - 2 <= count <= high + 2


def test_extract_month_with_public_range_is_enumerated(engine: Engine) -> None:
    result = engine.session("alice", epsilon=EPS).execute(
        "SELECT EXTRACT(month FROM day) AS m, EXTRACT(dow FROM day) AS w, COUNT(*) "
        "FROM visits GROUP BY m, w")
    assert result.cost == Cost(EPS, 0.0)
    # keys come in the order of the public values first yielding them: 2024-01-01 is a
    # Monday (dow 1), so the weekdays run 1..6, then Sunday 0
    weekdays = (1, 2, 3, 4, 5, 6, 0)
    assert [r[:2] for r in result.rows] == [(m, w) for m in range(1, 13) for w in weekdays]
    assert all(r[2] > 0 for r in result.rows)


def test_private_expression_keys_pass_partition_selection(
        engine: Engine, exact_db: duckdb.DuckDBPyConnection) -> None:
    """hours_per_week has no public values: its bins are private, released only when their
    noisy count of people clears the threshold, so δ is charged. At ε = 500 for selection the
    threshold is a handful of people; bins with 20 or more people are certainly released."""
    session = engine.session("alice", epsilon=EPS)
    result = session.execute(
        "SELECT hours_per_week / 10 * 10 AS h, COUNT(*) FROM adult GROUP BY h")
    assert result.cost == Cost(EPS, session.options.delta)
    truth = exact(exact_db, "SELECT hours_per_week // 10 * 10, COUNT(*) FROM adult GROUP BY 1")
    keys = [row[0] for row in result.rows]
    assert keys == sorted(keys) and set(keys) <= set(truth)
    assert {k for k, (n,) in truth.items() if n >= 20} <= set(keys)
    for h, count in result.rows:
        assert type(h) is int
        assert abs(count - truth[h][0]) <= 1


def test_date_trunc_without_public_range_passes_selection(make_policy: Any) -> None:
    """Without day's public range the months are private: partition selection (δ charged)."""
    budget = {"budget = { epsilon = 10.0, delta = 1e-5 }":
              "budget = { epsilon = 1e9, delta = 0.5 }"}
    with Engine.from_path(make_policy(replace=budget)) as eng:
        session = eng.session("alice", epsilon=EPS)
        result = session.execute("SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits "
                                 "GROUP BY m")
        assert result.cost == Cost(EPS, session.options.delta)
        assert tuple(r[0] for r in result.rows) == MONTHS  # every month has thousands


def test_key_null_for_every_public_value_is_private(engine: Engine) -> None:
    """CAST(sex AS INT) is NULL for 'Female' and 'Male': no public key at all, so the key is
    left to partition selection, which releases the NULL group of all 32,561 people."""
    session = engine.session("alice", epsilon=EPS)
    result = session.execute("SELECT CAST(sex AS INT) AS x, COUNT(*) FROM adult GROUP BY 1")
    assert result.cost == Cost(EPS, session.options.delta)
    assert len(result.rows) == 1 and result.rows[0][0] is None
    assert abs(result.rows[0][1] - 32561) <= 1


def test_date_trunc_century_is_not_enumerated(policy: Policy) -> None:
    """DuckDB truncates 2024 to the century 2000-01-01, PostgreSQL to 2001-01-01: keys
    enumerated with one would miss the other's groups, so these keys are private."""
    plan = _plan(policy, "SELECT date_trunc('century', day), COUNT(*) FROM visits GROUP BY 1")
    assert plan.analysis.keys[0].values is None and plan.selection is not None
    plan = _plan(policy, "SELECT date_trunc('decade', day), COUNT(*) FROM visits GROUP BY 1")
    assert plan.analysis.keys[0].values == ("2020-01-01",)


def test_non_integer_numeric_key_is_not_enumerated(engine: Engine) -> None:
    """age / 4.0 could round differently in DOUBLE and NUMERIC: partition selection."""
    session = engine.session("alice", epsilon=EPS)
    result = session.execute("SELECT age / 4.0 AS q, COUNT(*) FROM adult GROUP BY q")
    assert result.cost == Cost(EPS, session.options.delta)
    assert all(isinstance(r[0], float) for r in result.rows)
    assert 17 / 4 in {r[0] for r in result.rows}


# -- 2. bounds through expressions, and the adversarial CASE ----------------------------------

def test_sum_of_huge_case_branch_is_noised_to_its_bound(engine: Engine) -> None:
    """SUM(CASE WHEN person_id = 7 THEN 1e12 ELSE 0 END): the branch union bounds it to
    [0, 1e12], so the noise is calibrated to 1e12 — the answer is noise, not a leak. It runs
    on both backends without overflow and the released value is finite. The probability that
    |noise| exceeds 50·b = 5e10 (b = 1e12/1000) is < 4e-22, so the value lies in
    [-5e10, 1e12 + 5e10]."""
    session = engine.session("alice", epsilon=EPS)
    sql = "SUM(CASE WHEN person_id = 7 THEN 1e12 ELSE 0 END)"
    plan = "\n".join(r[0] for r in session.execute(f"EXPLAIN SELECT {sql} FROM adult").rows)
    assert "L1 sensitivity 1e+12" in plan
    assert "argument bounds [0, 1e+12]" in plan
    (value,), = session.execute(f"SELECT {sql} FROM adult").rows
    assert math.isfinite(value)
    assert -5e10 <= value <= 1e12 + 5e10


def test_clamp_applies_after_evaluation(engine: Engine) -> None:
    """A huge branch inside an explicit clamp: the row value 1e300 is computed (NUMERIC on
    PostgreSQL, DOUBLE on DuckDB) and then clamped to 100, so person 7 adds exactly 100
    (b = 0.1, tolerance 5)."""
    session = engine.session("alice", epsilon=EPS)
    (value,), = session.execute(
        "SELECT SUM(LEAST(GREATEST(CASE WHEN person_id = 7 THEN 1e300 ELSE 0 END, 0), 100)) "
        "FROM adult").rows
    assert abs(value - 100) <= 5


@pytest.mark.parametrize(("sql", "sqlstate", "message", "hint"), [
    pytest.param("SELECT SUM(CASE WHEN person_id = 7 THEN 1e16 ELSE 0 END) FROM adult",
                 "0A000", "exceed ±1e+15", "LEAST(GREATEST(", id="bound_above_cap"),
    pytest.param("SELECT AVG(age * 1e14) FROM adult", "0A000", "[1.7e+15, 9e+15]",
                 "AVG(LEAST(GREATEST(age * 1e14", id="derived_bound_above_cap"),
    pytest.param("SELECT SUM(CASE WHEN person_id = 7 THEN 1e300 * 1e300 ELSE 0 END) FROM adult",
                 "42501", "no bound", "LEAST(GREATEST(", id="overflowing_constant"),
    pytest.param("SELECT SUM(CASE WHEN person_id = 7 THEN capital_gain / (age - 40) END) "
                 "FROM adult", "42501", "no bound", "LEAST(GREATEST(", id="unbounded_branch"),
], )
def test_rejected_bounds(engine: Engine, sql: str, sqlstate: str, message: str, hint: str
                         ) -> None:
    session = engine.session("alice")
    before = session.remaining()
    with pytest.raises(errors.Error) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == sqlstate
    assert message in caught.value.message
    assert caught.value.hint is not None and hint in caught.value.hint
    assert session.remaining() == before


# (table, expression, lower, upper): the bounds interval arithmetic derives from the demo
# policy's column bounds, for each construct of the issue
BOUNDS = [
    ("adult", "hours_per_week * 52", 52, 5148),
    ("adult", "age * -2", -180, -34),
    ("adult", "100 - age", 10, 83),
    ("adult", "-age", -90, -17),
    ("adult", "CAST(age AS DOUBLE) / 2", 8.5, 45),
    ("adult", "age / hours_per_week", 0, 90),  # integer division, divisor in [1, 99]
    ("adult", "age % 7", 0, 7),
    ("adult", "ABS(age - 40)", 0, 50),
    ("adult", "LEAST(age, 50)", 17, 50),
    ("adult", "GREATEST(age, 50)", 50, 90),
    ("adult", "LEAST(GREATEST(capital_gain, 10), 20)", 10, 20),
    ("adult", "CASE WHEN sex = 'Female' THEN age ELSE 0 END", 0, 90),
    ("adult", "CASE WHEN sex = 'Female' THEN age END", 17, 90),
    ("adult", "CASE WHEN age > 40 THEN age * 2 WHEN age > 30 THEN -age ELSE 5 END", -90, 180),
    ("adult", "CASE WHEN person_id = 7 THEN 1e12 ELSE 0 END", 0, 1e12),
    ("adult", "COALESCE(NULLIF(education_num, 16), 0)", 0, 16),
    ("adult", "CAST(age / 3.0 AS INT)", 5, 31),  # rounding moves a value by at most 1/2
    ("adult", "ROUND(age / 4.0)", 3.25, 23.5),
    ("visits", "EXTRACT(month FROM day)", 1, 12),
    ("visits", "EXTRACT(dow FROM day)", 0, 6),
    ("visits", "amount / 2 + 1", 1, 251),
]


@pytest.mark.parametrize(("table", "expression", "lower", "upper"),
                         [pytest.param(*b, id=b[1]) for b in BOUNDS])
def test_derived_bounds_are_exact_and_sound(
        policy: Policy, exact_db: duckdb.DuckDBPyConnection, table: str, expression: str,
        lower: float, upper: float) -> None:
    """The analyzer's bounds for each construct, and — evaluated on the demo data with the
    total expression the backend runs — every row value lies inside them."""
    from sqlglot import parse_one

    from dpproxy.analyze.expressions import make_resolver, type_row_expression
    from dpproxy.rewrite import make_total

    policy_table = policy.tables[table]
    node = parse_one(expression, read="postgres")
    typed = type_row_expression(node, make_resolver(table, None, policy_table.columns))
    assert (typed.lower, typed.upper) == (lower, upper)
    total = make_total(node, policy_table, "duckdb").sql("duckdb")
    low, high = exact_db.execute(f"SELECT MIN(x), MAX(x) FROM (SELECT {total} AS x "
                                 f"FROM {table})").fetchone()  # type: ignore[misc]
    assert lower <= low <= high <= upper


# -- 3. rejected GROUP BY expressions, both backends ---------------------------------------------

@pytest.mark.parametrize(("sql", "sqlstate", "message"), [
    pytest.param("SELECT person_id / 10, COUNT(*) FROM adult GROUP BY 1", "42501",
                 "privacy unit person_id", id="unit_in_expression"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY CASE WHEN person_id > 5 THEN 1 END",
                 "42501", "privacy unit", id="unit_in_case"),
    pytest.param("SELECT COUNT(*) FROM visits GROUP BY person_id % 2", "42501",
                 "privacy unit", id="unit_modulo"),
    pytest.param("SELECT age, COUNT(*) FROM adult GROUP BY age / 10", "42501",
                 "neither aggregated nor a GROUP BY key", id="select_column_not_key"),
    pytest.param("SELECT age / 5, COUNT(*) FROM adult GROUP BY age / 10", "42501",
                 "neither aggregated", id="select_other_expression"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY random() > 0.5", "0A000",
                 "not supported in a row expression", id="volatile_key"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY md5(sex)", "0A000",
                 "not supported in a row expression", id="function_off_allowlist"),
    pytest.param("SELECT SUM(age) FROM adult GROUP BY 1", "42803",
                 "aggregate functions are not allowed in GROUP BY", id="aggregate_key"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY 1 + 1", "0A000",
                 "a constant groups nothing", id="constant_key"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY sex + 1", "42804", "needs a number",
                 id="ill_typed_key"),
    pytest.param("SELECT COUNT(*) FROM adult GROUP BY nosuch / 2", "42703", "nosuch",
                 id="unknown_column_in_key"),
    pytest.param("SELECT COUNT(*) FROM visits GROUP BY day + amount", "0A000",
                 "constant whole number of days", id="date_plus_column"),
    pytest.param("SELECT COUNT(*) FROM visits GROUP BY date_trunc('fortnight', day)", "22023",
                 "FORTNIGHT", id="date_trunc_bad_unit"),
])
def test_rejected_expression_keys(engine: Engine, sql: str, sqlstate: str, message: str
                                  ) -> None:
    session = engine.session("alice")
    before = session.remaining()
    with pytest.raises(errors.Error) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == sqlstate, str(caught.value)
    assert message in caught.value.message
    assert session.remaining() == before
    assert engine.ledger.history() == []


@pytest.mark.parametrize("key", ["CAST(high_income AS TEXT)", "NOT high_income",
                                 "CASE WHEN age > 30 THEN high_income END"])
def test_local_dp_column_in_key_is_rejected(make_policy: Any, key: str) -> None:
    """Local-DP reports are never read raw, in a key expression neither (analysis only)."""
    text = (Path(__file__).parent.parent / "policies" / "survey.toml").read_text()
    policy = load_policy(make_policy(text=text))
    ast = parse_statements(f"SELECT COUNT(*) FROM survey GROUP BY {key}")[0].ast
    assert ast is not None
    with pytest.raises(errors.PrivacyViolation) as caught:
        analyze(ast, policy, policy.analyst("alice"))
    assert "high_income" in caught.value.message and "GROUP BY" in caught.value.message


# -- 4. plans without data: types, values, EXPLAIN ------------------------------------------------

def _plan(policy: Policy, sql: str) -> QueryPlan:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst("alice"))
    assert isinstance(analysis, Analysis)
    return plan_query(analysis, QueryOptions(1.0, 1e-6, "laplace"))


@pytest.fixture
def policy(make_policy: Any) -> Policy:
    return load_policy(make_policy(replace=RANGES))


def test_plain_column_with_public_range_is_public(policy: Policy) -> None:
    plan = _plan(policy, "SELECT age, COUNT(*) FROM adult GROUP BY age")
    (key,) = plan.analysis.keys
    assert key.values == tuple(range(17, 91))
    assert plan.selection is None
    # a unit is in one group whatever the key set: sensitivity stays 1
    assert plan.measurements[0].sensitivity == 1


def test_expression_key_metadata(policy: Policy) -> None:
    plan = _plan(policy, "SELECT age / 10 * 10, LOWER(sex), COUNT(*) FROM adult "
                         "GROUP BY 1, LOWER(sex)")
    decade, lowered = plan.analysis.keys
    assert (decade.name, decade.column.type, decade.source) == ("age / 10 * 10", "int", "age")
    assert (decade.column.lower, decade.column.upper) == (10, 90)
    assert (lowered.name, lowered.column.type, lowered.values) == \
        ("LOWER(sex)", "text", ("female", "male"))
    assert plan.analysis.group_count == 18
    assert plan.analysis.output_types == ("int8", "text", "int8")


def test_multi_column_key_is_private(policy: Policy) -> None:
    plan = _plan(policy, "SELECT sex || income AS si, COUNT(*) FROM adult GROUP BY si")
    (key,) = plan.analysis.keys
    assert key.values is None and plan.selection is not None


def test_explain_shows_derived_bounds_and_key_source(engine: Engine) -> None:
    session = engine.session("alice")
    text = "\n".join(r[0] for r in session.execute(
        "EXPLAIN SELECT age / 10 * 10, SUM(hours_per_week * 52), "
        "AVG(CASE WHEN sex = 'Female' THEN capital_gain END), "
        "SUM(LEAST(GREATEST(ABS(age - 40), 5), 30)) FROM adult GROUP BY 1").rows)
    assert "age / 10 * 10 (9 public values, the image of the public values of age)" in text
    line = next(t for t in text.splitlines() if "SUM(hours_per_week * 52) from m0" in t)
    assert line.endswith("; argument bounds [52, 5148]")
    assert "argument bounds [0, 99999]" in text
    assert "argument bounds [5, 30]" in text
    assert "IN (10, 20, 30, 40, 50, 60, 70, 80, 90)" in text  # the public key filter
    assert session.remaining().epsilon == 1e9


# -- 5. a unit with 50 rows moves an expression-keyed COUNT by at most its bound --------------

SMALL = """
database = "small"

[backend]
kind = "duckdb"
path = "small.duckdb"

[ledger]
path = "small.ledger.sqlite"

[audit]
path = "small.audit.jsonl"

[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 2

[tables.t.columns]
uid = { type = "int", nullable = false }
v = { type = "int", lower = 0, upper = 60, public_range = { step = 1 } }
x = { type = "float", lower = 0, upper = 100 }

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["t"]
"""


SMALL_ROWS = [(0, j, float(j)) for j in range(50)] \
    + [(i, i % 61, float(i % 101)) for i in range(1, 201)]


@pytest.fixture
def small(tmp_path: Path, make_policy: Any, backend_kind: str, request: pytest.FixtureRequest
          ) -> Iterator[tuple[Policy, Callable[..., list[Any]], Callable[..., list[Any]]]]:
    """Unit 0 has 50 rows, v = 0..49 (bins v / 20: 0, 1, 2), x = row number; units 1..200
    one row each. Yields the policy, a function running the rewritten statement on the
    backend, and one running plain SQL on the same data in DuckDB (the neighbour's truth)."""
    path = tmp_path / "small.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (uid INTEGER NOT NULL, v INTEGER, x DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", SMALL_ROWS)
    con.close()
    policy = load_policy(make_policy(text=SMALL.replace('path = "small.duckdb"',
                                                        f'path = "{path.as_posix()}"')))
    reader = duckdb.connect(str(path), read_only=True)

    def truth(sql: str) -> list[Any]:
        return [tuple(r) for r in reader.execute(sql).fetchall()]

    with contextlib.ExitStack() as stack:
        if backend_kind == "postgres":
            import psycopg

            from dpproxy.backends.postgres import PostgresBackend
            from tests.pg import scratch_database

            dsn = stack.enter_context(scratch_database(request.getfixturevalue("pg_dsn")))
            with psycopg.connect(dsn) as pg, pg.cursor() as cur:
                cur.execute("CREATE TABLE t (uid INTEGER NOT NULL, v INTEGER, "
                            "x DOUBLE PRECISION)")
                cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", SMALL_ROWS)
            backend = PostgresBackend(dsn, ["t"])
            stack.callback(backend.close)

            def run(plan: QueryPlan) -> list[Any]:
                rewritten = rewrite(plan, "postgres")
                return [tuple(float(v) if v is not None else None for v in as_released(plan, r))
                        for r in backend.run_aggregate(rewritten.sql, rewritten.parameters())]
        else:
            def run(plan: QueryPlan) -> list[Any]:
                rewritten = rewrite(plan, "duckdb")
                return [as_released(plan, r) for r in reader.execute(
                    rewritten.sql, list(rewritten.parameters())).fetchall()]
        yield policy, run, truth
    reader.close()


@pytest.mark.parametrize("key", ["v / 20", "FLOOR(x / 20)"])
def test_heavy_unit_moves_expression_keyed_count_by_its_bound(
        small: tuple[Policy, Callable[..., list[Any]], Callable[..., list[Any]]], key: str
        ) -> None:
    """Public bins (v / 20, enumerated from v's range) and private ones (FLOOR(x / 20),
    partition selection): either way the rewritten statement keeps at most 3 of unit 0's rows
    in each of at most 2 bins, so COUNT moves by at most 6, the plan's L1 sensitivity — and
    exactly 6 here, since unit 0 has ≥ 3 rows in each of 3 bins; SUM(x) by at most 600."""
    policy, run, truth = small
    ast = parse_statements(f"SELECT {key}, COUNT(*), SUM(x) FROM t GROUP BY 1")[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst("bob"))
    assert isinstance(analysis, Analysis)
    plan = plan_query(analysis, QueryOptions(1.0, 1e-6, "laplace"))
    assert plan.measurements[0].sensitivity == 6
    assert plan.measurements[1].sensitivity == 600
    public = key == "v / 20"
    assert (plan.selection is None) == public
    if public:
        assert analysis.keys[0].values == (0, 1, 2, 3)
    exact_key = key.replace("v / 20", "v // 20")
    without = {r[0]: r[1:] for r in truth(
        f"SELECT {exact_key}, COUNT(*), SUM(LEAST(GREATEST(x, 0), 100)) FROM t "
        "WHERE uid <> 0 GROUP BY 1")}
    for _ in range(10):
        got = {r[0]: r[1:3] for r in run(plan)}
        counts = {k: got[k][0] - without.get(k, (0, 0))[0] for k in got}
        sums = {k: got[k][1] - without.get(k, (0, 0))[1] for k in got}
        assert sum(abs(c) for c in counts.values()) == 6
        assert sum(1 for c in counts.values() if c) == 2
        assert all(0 <= c <= 3 for c in counts.values())
        assert sum(abs(s) for s in sums.values()) <= 600 + 1e-9


# -- 6. policy: public_range ----------------------------------------------------------------------

@pytest.mark.parametrize(("column", "problem"), [
    ('{ type = "int", public_range = { step = 1 } }', "declare lower and upper"),
    ('{ type = "int", lower = 0, upper = 10, public_range = { step = 0 } }', "step: must be >"),
    ('{ type = "int", lower = 0, upper = 10, public_range = { step = 0.5 } }', "whole step"),
    ('{ type = "int", lower = 0, upper = 1e9, public_range = { step = 1 } }', "at most 100,000"),
    ('{ type = "int", lower = 0, upper = 9, public_range = { stride = 1 } }', "stride"),
    ('{ type = "text", public_range = { step = 1 } }', "not text"),
    ('{ type = "date", public_range = { first = "2024-01-01" } }', "last: required"),
    ('{ type = "date", public_range = { first = "2024-13-01", last = "2024-12-31" } }',
     "first: '2024-13-01' is not a date"),
    ('{ type = "date", public_range = { first = "2024-02-01", last = "2024-01-01" } }',
     "must not be after"),
    ('{ type = "date", public_range = { first = "2024-01-01", last = "2024-02-01", '
     'step = 0 } }', "step: must be a whole number of days"),
    ('{ type = "text", public_values = ["a"], public_range = { step = 1 } }',
     "public_range"),
])
def test_public_range_validation(make_policy: Any, column: str, problem: str) -> None:
    path = make_policy(replace={'amount = { type = "float", lower = 0, upper = 500, '
                                'nullable = false }': f"amount = {column}"})
    with pytest.raises(errors.InvalidPolicy) as caught:
        load_policy(path)
    assert "tables.visits.columns.amount.public_range" in str(caught.value)
    assert problem in str(caught.value)


def test_public_range_values(make_policy: Any) -> None:
    path = make_policy(replace={
        'amount = { type = "float", lower = 0, upper = 500, nullable = false }':
        'amount = { type = "float", lower = 0, upper = 1, public_range = { step = 0.25 } }',
        'day = { type = "date", lower = 2024-01-01, upper = 2024-12-31, nullable = false }':
        "day = { type = \"date\", public_range = { first = 2024-01-30, last = 2024-03-01, "
        "step = 15 } }"})
    columns = load_policy(path).tables["visits"].columns
    assert columns["amount"].public_domain == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert columns["day"].public_domain == ("2024-01-30", "2024-02-14", "2024-02-29")


def test_doctests() -> None:
    import dpproxy.analyze.expressions
    import dpproxy.analyze.keys
    import dpproxy.policy
    import dpproxy.rewrite

    for module in (dpproxy.analyze.keys, dpproxy.policy, dpproxy.analyze.expressions,
                   dpproxy.rewrite):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


def test_key_expression_sql_is_total_on_both_dialects(policy: Policy) -> None:
    plan = _plan(policy, "SELECT age / 10 * 10, COUNT(*) FROM adult GROUP BY 1")
    duck = rewrite(plan, "duckdb").sql
    pg = rewrite(plan, "postgres").sql
    assert "NULLIF(CAST(10.0 AS DOUBLE), 0)" in duck and "NULLIF(CAST(10 AS DECIMAL), 0)" in pg
    assert isinstance(plan.analysis.keys[0].expression, exp.Mul)


def test_dbapi_describes_expression_keys(make_policy: Any) -> None:
    """Types reach DB-API clients (and the wire): whole-number keys are int8 numbers, month
    starts dates, LOWER(sex) text."""
    import dpproxy

    with dpproxy.connect(make_policy(replace=RANGES), analyst="alice", epsilon=EPS) as conn:
        cur = conn.execute("SELECT age / 10 * 10 AS d, LOWER(sex), COUNT(*) FROM adult "
                           "GROUP BY 1, 2")
        assert cur.description is not None
        assert [d[0] for d in cur.description] == ["d", "lower", "count"]
        assert [d[1] for d in cur.description] == [dpproxy.NUMBER, dpproxy.STRING,
                                                   dpproxy.NUMBER]
        assert len(cur.fetchall()) == 18
        cur.execute("SELECT date_trunc('month', day) AS m, COUNT(*) FROM visits GROUP BY m")
        assert cur.description is not None
        assert cur.description[0][1] == dpproxy.DATETIME
        # as datetime.date, as psycopg reads them (the result keeps the ISO text)
        assert [row[0] for row in cur.fetchall()] == [dt.date.fromisoformat(m) for m in MONTHS]


KEY_EXPRESSIONS = [
    "LOWER(sex)", "UPPER(sex)", "TRIM(sex)", "TRIM(LEADING 'x' FROM sex)", "SUBSTRING(sex, 1, 2)",
    "LENGTH(sex)", "ABS(age)", "ROUND(age / 3.0)", "LEAST(age, 3)", "GREATEST(age, 3)",
    "NULLIF(age, 3)", "COALESCE(age, 3)", "date_trunc('month', day)",
    "EXTRACT(month FROM day)", "CASE WHEN age > 3 THEN 1 END", "CAST(age AS TEXT)",
    "CAST(age / 2 AS INT)", "sex || 'x'", "FLOOR(age / 5) * 5", "CEIL(age / 5.0)",
    "age BETWEEN 1 AND 2", "day + 7", "age % 7", "-age",
]


def test_output_names_match_postgresql(pg_dsn: str) -> None:
    """Each key expression's output column is named as PostgreSQL itself names it."""
    import psycopg
    from sqlglot import parse_one

    from dpproxy.postprocess import output_name

    with psycopg.connect(pg_dsn) as pg:
        pg.execute("CREATE TEMP TABLE t (age int, sex text, day date)")
        for expression in KEY_EXPRESSIONS:
            cur = pg.execute(f"SELECT {expression} FROM t GROUP BY 1")
            assert cur.description is not None
            item = parse_one(f"SELECT {expression} FROM t", read="postgres").expressions[0]
            assert output_name(item) == cur.description[0].name, expression


SAME_KEYS = [
    ("adult", "age / 10 * 10"), ("adult", "FLOOR(age / 5) * 5"), ("adult", "ABS(age - 50) / 10"),
    ("adult", "age % 7"), ("adult", "CAST(age / 2 AS INT)"), ("adult", "CAST(age AS TEXT)"),
    ("adult", "LOWER(sex)"), ("adult", "SUBSTRING(education, 1, 1)"),
    ("adult", "occupation LIKE 'S%'"), ("adult", "age BETWEEN 20 AND 29"),
    ("adult", "CASE WHEN occupation IN ('Sales', 'Tech-support') THEN 'a' ELSE 'b' END"),
    ("visits", "date_trunc('month', day)"), ("visits", "date_trunc('week', day)"),
    ("visits", "date_trunc('quarter', day)"), ("visits", "EXTRACT(dow FROM day)"),
    ("visits", "EXTRACT(week FROM day)"), ("visits", "EXTRACT(doy FROM day)"),
    ("visits", "day + 7"),
]


@pytest.mark.parametrize("backend_kind", ["duckdb"])  # runs both backends itself
@pytest.mark.parametrize(("table", "key"), [pytest.param(*k, id=k[1]) for k in SAME_KEYS])
def test_both_backends_compute_exactly_the_enumerated_keys(
        make_policy: Any, demo_database: Path, pg_demo_dsn: str, table: str, key: str) -> None:
    """The rewritten statement, run on DuckDB and on PostgreSQL, yields exactly the public
    keys the analyzer enumerated (no group missed for a type or rounding difference), with
    identical counts. Bounds that never bind on the demo data (50 rows and 400 groups per
    person) keep every row on both, so the counts are the data's."""
    from dpproxy.analyze.keys import normalize_key
    from dpproxy.backends.duckdb import DuckDBBackend
    from dpproxy.backends.postgres import PostgresBackend

    wide = dict(RANGES)
    wide["max_groups_per_unit = 4\nmax_rows_per_unit = 10"] = \
        "max_groups_per_unit = 400\nmax_rows_per_unit = 50"
    policy = load_policy(make_policy(replace=wide))
    plan = _plan(policy, f"SELECT {key}, COUNT(*) FROM {table} GROUP BY 1")
    (group_key,) = plan.analysis.keys
    assert group_key.values is not None and plan.selection is None

    def counts(backend: Any) -> dict[Any, int]:
        rewritten = rewrite(plan, backend.dialect)
        rows = backend.run_aggregate(rewritten.sql, rewritten.parameters())
        return {normalize_key(r[0], group_key.column.type): int(r[1]) for r in rows}

    duck = DuckDBBackend(demo_database)
    pg = PostgresBackend(pg_demo_dsn, ["adult", "visits"])
    try:
        on_duckdb, on_postgres = counts(duck), counts(pg)
    finally:
        duck.close()
        pg.close()
    assert on_duckdb == on_postgres
    assert list(on_duckdb) and set(on_duckdb) <= set(group_key.values)
    if table == "adult":  # every public key has people in the demo data
        assert set(on_duckdb) == set(group_key.values)
