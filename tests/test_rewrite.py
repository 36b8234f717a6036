"""Sensitivity, bounds and the rewritten SQL, checked without noise.

Plan-level tests read no data: they assert what `plan_query` promises (sensitivities,
noise scales, the ε split, cost) for queries on the demo tables and on a small policy.
Bound tests check the interval arithmetic of `type_row_expression` exactly where it is
exact and, against DuckDB evaluating the total expression, that it is sound everywhere.
Rewrite-level tests run `rewrite(plan).sql` directly on a small DuckDB file where one
privacy unit has 50 rows, and compare its exact per-group statistics with the data minus
that unit: the difference is what the unit can change, and must fit the plan's
sensitivity.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from sqlglot import exp, parse_one

from dpproxy import errors
from dpproxy.accountant import Cost
from dpproxy.analyze import Analysis, analyze
from dpproxy.analyze.expressions import type_row_expression
from dpproxy.mechanisms import discrete_gaussian_sigma
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import ColumnPolicy, Policy, TablePolicy, load_policy
from dpproxy.rewrite import Rewritten, make_total, rewrite
from dpproxy.session import Engine
from tests.exact import as_released

# -- the small database and its policy --------------------------------------------------------

HEAVY_UNIT = 0  # 50 rows, v = 100 on each, spread over the three public groups
HEAVY_ROWS = 50
LIGHT_UNITS = range(1, 201)  # one row each
MAX_ROWS, MAX_GROUPS, UPPER = 3, 2, 100

SMALL_POLICY = """
database = "small"

[backend]
kind = "duckdb"
path = "small.duckdb"

[ledger]
path = "small.ledger.sqlite"

[audit]
path = "small.audit.jsonl"

[privacy]
default_epsilon = 1.0
default_delta = 1e-7

[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 2

[tables.t.columns]
uid = { type = "int", nullable = false }
v = { type = "int", lower = 0, upper = 100 }
x = { type = "float", lower = 0, upper = 100 }
w = { type = "int", lower = 10, upper = 100 }
g = { type = "text", public_values = ["a", "b", "c"] }
p = { type = "text" }

# plan-level only (no data): visits-like bounds with public keys of 6 and 3 values
[tables.v]
privacy_unit = "uid"
max_rows_per_unit = 10
max_groups_per_unit = 4

[tables.v.columns]
uid = { type = "int", nullable = false }
amount = { type = "float", lower = 0, upper = 500 }
channel = { type = "text", public_values = ["web", "app", "phone", "mail", "shop", "kiosk"] }
region = { type = "text", public_values = ["north", "south", "east"] }
day = { type = "date" }

# no privacy unit: each row is its own unit
[tables.r]
[tables.r.columns]
score = { type = "int", lower = -5, upper = 20 }

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["t", "v", "r"]
"""


def light_row(i: int) -> tuple[Any, ...]:
    """(uid, v, x, w, g, p) of a one-row unit: x has values outside [0, 100] and NULLs, w
    has NULLs, g has a key outside the public list and NULL, p is a private key."""
    x: float | None = {1: -20.0, 2: 150.0, 3: None, 4: None, 5: None}.get(i, float(i * 7 % 101))
    w = None if i % 10 == 0 else 10 + i % 91
    g = "zzz" if i % 50 == 0 else (None if i == 199 else "abc"[i % 3])
    p = "common" if i <= 150 else ("rare" if i <= 152 else f"own{i}")
    return (i, i % 101, x, w, g, p)


def heavy_rows() -> list[tuple[Any, ...]]:
    # x = row number, so which rows were kept shows in SUM(x); p = 'solo': one unit only
    return [(HEAVY_UNIT, UPPER, float(j), 50, "abc"[j % 3], "solo") for j in range(HEAVY_ROWS)]


@pytest.fixture(scope="module")
def small_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("small")
    path = folder / "small.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (uid INTEGER NOT NULL, v INTEGER, x DOUBLE, w INTEGER, "
                "g VARCHAR, p VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
                    heavy_rows() + [light_row(i) for i in LIGHT_UNITS])
    con.close()
    return path


@pytest.fixture
def small_policy(small_database: Path, make_policy: Any) -> Policy:
    text = SMALL_POLICY.replace('path = "small.duckdb"',
                                f'path = "{small_database.as_posix()}"')
    return load_policy(make_policy(text=text))


@pytest.fixture
def demo_policy_object(make_policy: Any) -> Policy:
    return load_policy(make_policy())


@pytest.fixture
def run_sql(small_database: Path) -> Iterator[Callable[..., list[tuple[Any, ...]]]]:
    """Run SQL directly on the small database (never through dpproxy)."""
    con = duckdb.connect(str(small_database), read_only=True)

    def run(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in con.execute(sql, list(params)).fetchall()]

    yield run
    con.close()


def analysis_of(policy: Policy, sql: str, analyst: str) -> Analysis:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    result = analyze(ast, policy, policy.analyst(analyst))
    assert isinstance(result, Analysis)
    return result


def plan_of(policy: Policy, sql: str, *, analyst: str = "bob", epsilon: float = 1.0,
            delta: float = 1e-6, mechanism: str = "laplace") -> QueryPlan:
    return plan_query(analysis_of(policy, sql, analyst),
                      QueryOptions(epsilon, delta, mechanism))  # type: ignore[arg-type]


def sensitivities(plan: QueryPlan) -> list[float]:
    return [m.sensitivity for m in plan.measurements]


# -- plan level: sensitivities, scales, cost --------------------------------------------------

def test_count_on_adult(demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT COUNT(*) FROM adult", analyst="alice",
                   epsilon=0.5)
    (m,) = plan.measurements
    assert m.sensitivity == 1
    assert (m.noise.mechanism, m.noise.granularity) == ("laplace", 1.0)
    assert m.noise.epsilon == 0.5
    assert m.noise.scale == pytest.approx(2.0, rel=1e-12) and m.noise.scale >= 2.0
    assert plan.cost == Cost(0.5, 0.0)
    assert plan.contribution.max_rows == 1 and plan.contribution.max_groups == 1


def test_sum_of_bounded_column(demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT SUM(hours_per_week) FROM adult",
                   analyst="alice", epsilon=0.25)
    (m,) = plan.measurements
    assert m.sensitivity == 99
    assert m.noise.scale == pytest.approx(99 / 0.25, rel=1e-12) and m.noise.scale >= 396
    assert (m.statistic.lower, m.statistic.upper) == (1, 99)


def test_sum_of_expression_uses_its_bounds(demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT SUM(hours_per_week * 52) FROM adult",
                   analyst="alice")
    assert sensitivities(plan) == [99 * 52]
    plan = plan_of(demo_policy_object, "SELECT SUM(age - 100) FROM adult", analyst="alice")
    assert sensitivities(plan) == [83]  # |17 - 100|


def test_avg_is_a_centred_sum_and_a_count_with_epsilon_split(demo_policy_object: Policy
                                                            ) -> None:
    plan = plan_of(demo_policy_object, "SELECT AVG(age) FROM adult", analyst="alice",
                   epsilon=1.0)
    total, count = plan.measurements
    assert total.statistic.kind == "sum" and count.statistic.kind == "count"
    assert total.statistic.center == (17 + 90) / 2
    assert total.sensitivity == 36.5  # (90 - 17) / 2, not 90
    assert count.sensitivity == 1
    assert total.noise.epsilon == count.noise.epsilon == 0.5
    # real-valued (a half-integer centre): snapped to a fine grid, scale just above Δ/ε
    assert total.noise.granularity < 1e-3
    assert 73.0 <= total.noise.scale <= 73.0 * (1 + 1e-4)
    assert plan.cost == Cost(1.0, 0.0)


def test_several_aggregates_share_epsilon_and_duplicates_are_measured_once(
        demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT COUNT(*), COUNT(*) * 2, SUM(age), AVG(age) "
                   "FROM adult", analyst="alice", epsilon=2.0)
    kinds = [m.statistic.kind for m in plan.measurements]
    # age is never NULL: AVG's count is COUNT(*), measured once with the first
    assert kinds == ["count", "sum", "sum"]
    assert plan.analysis.aggregates[-1].statistics == (2, 0)
    assert all(m.noise.epsilon == pytest.approx(2 / 3) for m in plan.measurements)
    assert plan.cost == Cost(2.0, 0.0)


def test_a_nullable_argument_keeps_its_own_count(demo_policy_object: Policy) -> None:
    """COUNT(x) and AVG(x) count the rows where x is not NULL: the same number as COUNT(*)
    only where x can never be NULL."""
    plan = plan_of(demo_policy_object, "SELECT COUNT(*), AVG(NULLIF(age, 17)), "
                   "COUNT(NULLIF(age, 17)), COUNT(age) FROM adult", analyst="alice")
    described = [m.statistic.describe() for m in plan.measurements]
    assert described == ["COUNT(*)", "SUM(clamp(NULLIF(age, 17), 17, 90) - 53.5)",
                         "COUNT(NULLIF(age, 17))"]
    assert [a.statistics for a in plan.analysis.aggregates] == [(0,), (1, 2), (2,), (0,)]


def test_count_distinct_unit_ignores_rows_per_unit(demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT COUNT(DISTINCT person_id) FROM visits",
                   analyst="alice")
    assert sensitivities(plan) == [1]


def test_visits_without_group_by(demo_policy_object: Policy) -> None:
    """visits: max_rows_per_unit = 10, max_groups_per_unit = 4; one group when there is no
    GROUP BY, so a person moves COUNT(*) by at most 10 and SUM(amount) by 10 × 500."""
    plan = plan_of(demo_policy_object, "SELECT COUNT(*), SUM(amount) FROM visits",
                   analyst="alice", epsilon=1.0)
    assert plan.contribution.max_groups == 1 and plan.contribution.max_rows == 10
    assert sensitivities(plan) == [10, 5000]
    count, total = plan.measurements
    assert count.noise.scale == pytest.approx(10 / 0.5, rel=1e-12)
    assert total.noise.scale == pytest.approx(5000 / 0.5, rel=1e-5)
    assert total.noise.scale >= 5000 / 0.5


def test_gaussian_uses_l2_and_charges_delta(demo_policy_object: Policy) -> None:
    plan = plan_of(demo_policy_object, "SELECT COUNT(*) FROM visits", analyst="alice",
                   epsilon=1.0, delta=1e-6, mechanism="gaussian")
    (m,) = plan.measurements
    assert m.sensitivity == 10  # √1 × 10
    sigma = discrete_gaussian_sigma(10, 1.0, 1e-6)
    assert m.noise.scale >= sigma and m.noise.scale == pytest.approx(sigma, rel=1e-9)
    assert m.noise.rho == pytest.approx(10**2 / (2 * sigma**2), rel=1e-9)
    assert plan.cost == Cost(1.0, 1e-6)


@pytest.mark.parametrize(("group_by", "groups"), [
    ("channel", 4),  # 6 public values, a unit touches at most max_groups = 4
    ("region", 3),  # only 3 public values: min(4, 3)
    ("channel, region", 4),  # 18 groups
])
def test_group_by_bounds_groups_per_unit(small_policy: Policy, group_by: str, groups: int
                                         ) -> None:
    sql = f"SELECT {group_by}, COUNT(*), SUM(amount) FROM v GROUP BY {group_by}"
    laplace = plan_of(small_policy, sql, epsilon=2.0)
    assert laplace.contribution.max_groups == groups
    assert sensitivities(laplace) == [groups * 10, groups * 10 * 500]
    gaussian = plan_of(small_policy, sql, epsilon=2.0, mechanism="gaussian")
    assert sensitivities(gaussian) == pytest.approx(
        [math.sqrt(groups) * 10, math.sqrt(groups) * 10 * 500], rel=1e-12)
    for m in gaussian.measurements:
        assert m.noise.delta == pytest.approx(1e-6 / 2, rel=1e-12)
    assert laplace.selection is None and gaussian.selection is None  # public keys


def test_private_key_needs_partition_selection(small_policy: Policy) -> None:
    plan = plan_of(small_policy, "SELECT day, COUNT(*) FROM v GROUP BY day", epsilon=1.0,
                   delta=1e-6)
    assert plan.selection is not None
    assert plan.contribution.max_groups == 4  # unknown number of groups: the policy's bound
    assert plan.selection.max_groups == 4
    (m,) = plan.measurements
    assert m.sensitivity == 40
    assert m.noise.epsilon == pytest.approx(0.5) and plan.selection.epsilon == pytest.approx(0.5)
    assert plan.cost == Cost(1.0, 1e-6)  # δ pays for the threshold even under Laplace
    assert plan.selection.threshold > 1  # a group of one unit is not released outright


def test_table_without_privacy_unit(small_policy: Policy) -> None:
    plan = plan_of(small_policy, "SELECT COUNT(*), SUM(score), AVG(score) FROM r")
    assert plan.contribution.privacy_unit is None
    assert sensitivities(plan) == [1, 20, 12.5, 1]  # AVG: centred at 7.5, |20 - 7.5|


# -- bounds through row expressions -----------------------------------------------------------

COLUMNS = {
    "age": ColumnPolicy("age", "int", 17, 90, nullable=False),
    "hours": ColumnPolicy("hours", "int", 1, 99, nullable=False),
    "gain": ColumnPolicy("gain", "int", 0, 99999, nullable=False),
    "x": ColumnPolicy("x", "float", -5, 5),
    "n": ColumnPolicy("n", "int", 0, 10),
    "u": ColumnPolicy("u", "int"),
    "s": ColumnPolicy("s", "text"),
    "d": ColumnPolicy("d", "date"),
}
INF = math.inf


def typed(sql: str) -> Any:
    return type_row_expression(parse_one(sql, read="postgres"), COLUMNS)


# (expression, lower, upper, integer, nullable): exact interval arithmetic
EXACT_BOUNDS = [
    ("hours * 52", 52, 5148, True, False),
    ("age - 17", 0, 73, True, False),
    ("-age", -90, -17, True, False),
    ("age * -2", -180, -34, True, False),
    ("age + n", 17, 100, True, True),
    ("age / 2", 8, 45, True, False),  # integer division truncates
    ("age / 2.0", 8.5, 45, False, False),
    ("100 / age", 1, 5, True, False),
    ("age / (age - 40)", -INF, INF, True, True),  # the divisor may be 0: NULLIF, unbounded
    ("ABS(age - 40)", 0, 50, True, False),
    ("ABS(age - 100)", 10, 83, True, False),
    ("LEAST(GREATEST(u, -3), 7)", -3, 7, True, False),  # GREATEST skips a NULL u
    ("LEAST(GREATEST(gain / (age - 40), -1000), 1000)", -1000, 1000, True, False),
    ("GREATEST(u, 0)", 0, INF, True, False),
    ("LEAST(n, 5)", 0, 5, True, False),
    ("LEAST(n, x)", -5, 10, False, True),  # either may be NULL: the other alone decides
    ("GREATEST(n, x)", -5, 10, False, True),
    ("CASE WHEN s = 'a' THEN age ELSE hours END", 1, 99, True, False),
    ("CASE WHEN s = 'a' THEN age END", 17, 90, True, True),
    ("CASE WHEN s = 'a' THEN age WHEN s = 'b' THEN -hours ELSE 0 END", -99, 90, True, False),
    ("COALESCE(n, 50)", 0, 50, True, False),
    ("COALESCE(n, x)", -5, 10, False, True),
    ("NULLIF(age, 40)", 17, 90, True, True),
    ("EXTRACT(month FROM d)", 1, 12, True, True),
    ("gain * gain", 0, 99999**2, True, False),
    ("LENGTH(s)", 0, INF, True, True),
]


@pytest.mark.parametrize(("sql", "lower", "upper", "integer", "nullable"), EXACT_BOUNDS,
                         ids=[b[0] for b in EXACT_BOUNDS])
def test_interval_arithmetic(sql: str, lower: float, upper: float, integer: bool,
                             nullable: bool) -> None:
    t = typed(sql)
    assert t.kind == "num"
    assert (t.lower, t.upper) == (lower, upper)
    assert t.integer is integer
    assert t.nullable is nullable


@pytest.mark.parametrize(("sql", "true_lower", "true_upper"), [
    ("x * x", 0, 25),  # interval arithmetic does not know both factors are one value
    ("CAST(age / 2.0 AS INT)", 8, 45),
    ("CAST(x AS INT)", -5, 5),
    ("age % 7", 0, 6),
    ("ROUND(x, 1)", -5, 5),
    ("FLOOR(age / 10.0)", 1, 9),
])
def test_conservative_bounds_contain_the_true_range(sql: str, true_lower: float,
                                                    true_upper: float) -> None:
    t = typed(sql)
    assert t.bounded
    assert t.lower <= true_lower and t.upper >= true_upper


@pytest.mark.parametrize("sql", ["s", "s || 'x'", "LOWER(s)", "d", "age > 3", "s LIKE 'a%'"])
def test_non_numeric_expressions_are_unbounded(sql: str) -> None:
    assert not typed(sql).bounded


@pytest.mark.parametrize(("sql", "sqlstate"), [
    ("s + 1", "42804"),
    ("CASE WHEN age > 3 THEN s ELSE age END", "42804"),
    ("random()", "0A000"),
    ("nosuch + 1", "42703"),
    ("SUM(age)", "42803"),
])
def test_expression_rejections(sql: str, sqlstate: str) -> None:
    with pytest.raises(errors.Error) as caught:
        typed(sql)
    assert caught.value.sqlstate == sqlstate


def test_cast_of_unbounded_expression_to_int_is_typed() -> None:
    t = typed("CAST(gain / (age - 40) AS INT)")
    assert t.kind == "num" and t.integer and not t.bounded


GRID_EXPRESSIONS = [b[0] for b in EXACT_BOUNDS] + [
    "x * x", "CAST(age / 2.0 AS INT)", "CAST(x AS INT)", "age % 7", "ROUND(x, 1)",
    "FLOOR(age / 10.0)", "LEAST(GREATEST(u / (age - 40), -3), 7)",
    "LEAST(GREATEST(hours % (age - age), 0), 1)", "ABS(x) * n - u / NULLIF(u, 0)",
    "age / LEAST(GREATEST(u, 1), 50)",
    "age / GREATEST(u, 1)",
    "EXTRACT(epoch FROM CAST('2024-01-01 00:00:00.5' AS TIMESTAMP))",
]


def _grid_rows() -> list[tuple[Any, ...]]:
    """Column values at their bounds, inside, and NULL where allowed (fixed seed)."""
    rng = random.Random(20261123)
    choices = {
        "age": [17, 18, 39, 40, 41, 89, 90], "hours": [1, 2, 50, 98, 99],
        "gain": [0, 1, 99998, 99999], "x": [-5.0, -4.99, -0.5, 0.0, 0.5, 2.5, 4.99, 5.0, None],
        "n": [0, 1, 5, 9, 10, None], "u": [-1_000_000, -1, 0, 1, 1_000_000, None],
        "s": ["a", "b", "", None], "d": ["2024-01-31", "2024-12-01", None],
    }
    rows = [tuple(rng.choice(values) for values in choices.values()) for _ in range(600)]
    rows += [tuple(values[0] for values in choices.values()),
             tuple(values[-1] for values in choices.values())]
    return rows


@pytest.fixture(scope="module")
def grid() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.execute("CREATE TABLE g (age INTEGER, hours INTEGER, gain INTEGER, x DOUBLE, "
                "n INTEGER, u INTEGER, s VARCHAR, d DATE)")
    con.executemany("INSERT INTO g VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _grid_rows())
    yield con
    con.close()


@pytest.mark.parametrize("sql", GRID_EXPRESSIONS)
def test_bounds_are_sound_on_the_backend(grid: duckdb.DuckDBPyConnection, sql: str) -> None:
    """The total expression, evaluated by DuckDB on values within the column bounds (and
    NULL where allowed), never leaves the analyzer's interval nor raises."""
    t = typed(sql)
    total = make_total(parse_one(sql, read="postgres"), TablePolicy("g", COLUMNS))
    values = [r[0] for r in grid.execute(f"SELECT {total.sql('duckdb')} FROM g").fetchall()]
    present = [float(v) for v in values if v is not None]
    assert present or t.nullable
    for value in present:
        assert t.lower - 1e-9 <= value <= t.upper + 1e-9, (sql, value)
        if t.integer:
            assert value == math.floor(value)
    if not t.nullable:
        assert None not in values


# -- make_total: no data-dependent errors -----------------------------------------------------

TOTAL_TABLE = TablePolicy("t", {"a": ColumnPolicy("a", "int", 0, 10),
                                "b": ColumnPolicy("b", "int"),
                                "f": ColumnPolicy("f", "float", 0, 1),
                                "s": ColumnPolicy("s", "text")})


@pytest.mark.parametrize(("sql", "total"), [
    ("a / b > 1",
     'TRUNC(CAST("a" AS DOUBLE) / NULLIF(CAST("b" AS DOUBLE), 0)) > CAST(1.0 AS DOUBLE)'),
    ("a / 2.0", 'CAST("a" AS DOUBLE) / NULLIF(CAST(2.0 AS DOUBLE), 0)'),
    ("f / a", 'CAST("f" AS DOUBLE) / NULLIF(CAST("a" AS DOUBLE), 0)'),
    ("a % b", 'CAST("a" AS DOUBLE) % NULLIF(CAST("b" AS DOUBLE), 0)'),
    ("CAST(s AS INT)", 'CAST(TRY_CAST("s" AS INT) AS DOUBLE)'),
    ("CAST(s AS DATE)",  # within the dates a TIMESTAMP holds too
     'CASE WHEN TRY_CAST("s" AS DATE) BETWEEN CAST(\'290309-12-22 (BC)\' AS DATE) AND '
     'CAST(\'294247-01-10\' AS DATE) OR NOT ISFINITE(TRY_CAST("s" AS DATE)) THEN '
     'TRY_CAST("s" AS DATE) END'),
    ("LENGTH(s) + 1", 'CAST(LENGTH("s") AS DOUBLE) + CAST(1.0 AS DOUBLE)'),
    ("a * a * a", 'CAST("a" AS DOUBLE) * CAST("a" AS DOUBLE) * CAST("a" AS DOUBLE)'),
    # children held in lists (rebuilt one list at a time)
    ("a IN (1, b, 3)",
     'CAST("a" AS DOUBLE) IN (CAST(1.0 AS DOUBLE), CAST("b" AS DOUBLE), CAST(3.0 AS DOUBLE))'),
    ("COALESCE(a, b / 2, 1)",
     'COALESCE(CAST("a" AS DOUBLE), TRUNC(CAST("b" AS DOUBLE) / NULLIF(CAST(2.0 AS DOUBLE), '
     '0)), CAST(1.0 AS DOUBLE))'),
    ("CASE WHEN a > 1 THEN 1 WHEN b < 2 THEN b ELSE 0 END",
     'CASE WHEN CAST("a" AS DOUBLE) > CAST(1.0 AS DOUBLE) THEN CAST(1.0 AS DOUBLE) WHEN '
     'CAST("b" AS DOUBLE) < CAST(2.0 AS DOUBLE) THEN CAST("b" AS DOUBLE) ELSE '
     'CAST(0.0 AS DOUBLE) END'),
])
def test_make_total_rewrites(sql: str, total: str) -> None:
    assert make_total(parse_one(sql, read="postgres"), TOTAL_TABLE).sql("duckdb") == total


@pytest.mark.parametrize("dialect", ["duckdb", "postgres"])
def test_a_total_tree_is_linked_and_the_input_untouched(dialect: str) -> None:
    """Each node of a total expression sits where its parent holds it (the rewrite sets a
    list of children once, not child by child), and the input is left as written."""
    sql = "COALESCE(a, 2) IN (" + ", ".join(f"{i}, b + {i}" for i in range(300)) + ")"
    tree = parse_one(sql, read="postgres")
    total = make_total(tree, TOTAL_TABLE, dialect)
    for node in total.walk():
        if node is not total:
            held = node.parent.args[node.arg_key]
            assert (held if node.index is None else held[node.index]) is node
    assert tree.sql("postgres") == parse_one(sql, read="postgres").sql("postgres")
    # every item was rebuilt: no bare literal is left in the list
    assert len(total.expressions) == 600 \
        and not any(isinstance(e, exp.Literal) for e in total.expressions)


@pytest.mark.parametrize(("sql", "expected"), [
    ("a / b", None),  # b = 0: NULL, not an error
    ("a % b", None),
    ("CAST(s AS INT)", None),  # s = 'x': NULL, not a conversion error
    ("CAST(s AS DATE)", None),
    ("b * b * b * b", 99999.0**4),  # beyond int64: DOUBLE, not an overflow error
    ("-7 / 2", -3.0),  # integer division truncates toward zero, as in PostgreSQL
    ("7 / -2", -3.0),
    # DuckDB reads 28 digits as HUGEINT and 0.00000000001 as DECIMAL(11,11), converted only
    # where a row reaches them (a red-team review): constants are DOUBLE like the columns
    ("CASE WHEN a > 5 THEN 9999999999999999999999999999 ELSE 1 END = 0.00000000001", False),
    ("ROUND(CASE WHEN a > 5 THEN 9999999999999999999999999999 ELSE 1 END, 12)", 1e28),
    ("ROUND(f, 2) + ROUND(a, -1)", 10.5),  # digits stay constants: the rewrite reads them
    ("CAST(f AS DECIMAL(3, 1))", 0.5),  # and a type's parameters
])
def test_total_expressions_never_raise(sql: str, expected: float | None) -> None:
    total = make_total(parse_one(sql, read="postgres"), TOTAL_TABLE).sql("duckdb")
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE t (a INTEGER, b INTEGER, f DOUBLE, s VARCHAR)")
        con.execute("INSERT INTO t VALUES (7, 0, 0.5, 'x')")
        if "b * b" in sql:
            con.execute("UPDATE t SET b = 99999")
        (value,) = con.execute(f"SELECT {total} FROM t").fetchone()  # type: ignore[misc]
    finally:
        con.close()
    assert value == expected


def test_the_original_expression_is_not_modified() -> None:
    node = parse_one("a / b + CAST(s AS INT)", read="postgres")
    before = node.sql("postgres")
    make_total(node, TOTAL_TABLE)
    assert node.sql("postgres") == before


# -- rewrite level, on real DuckDB ------------------------------------------------------------

def by_key(rows: list[tuple[Any, ...]]) -> dict[Any, tuple[Any, ...]]:
    return {row[0]: row[1:] for row in rows}


def run_rewritten(run_sql: Callable[..., list[tuple[Any, ...]]], rewritten: Rewritten,
                  plan: QueryPlan | None = None) -> list[tuple[Any, ...]]:
    """The statement's rows; with its plan, each measurement as the number it stands for
    (a real-valued sum comes in fixed point: `tests.exact.as_released`)."""
    rows = run_sql(rewritten.sql, rewritten.parameters())
    return rows if plan is None else [as_released(plan, r) for r in rows]


def test_heavy_unit_is_bounded_per_group_and_across_groups(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    """Unit 0 has 50 rows (v = 100, x = 0..49) spread over groups a, b, c; every other unit
    one row. The rewritten statement keeps 3 of unit 0's rows in each of 2 groups, so it
    changes COUNT by exactly 3·2 = 6 and SUM(v) by 3·2·100 = 600 — the plan's L1
    sensitivities — whichever rows and groups the salt picks. Over 20 runs the kept groups
    are the same every time with probability about 3·(1/3)^20 < 1e-9."""
    plan = plan_of(small_policy, "SELECT g, COUNT(*), SUM(v), SUM(x) FROM t GROUP BY g")
    count_m, v_m, x_m = plan.measurements
    assert (count_m.sensitivity, v_m.sensitivity, x_m.sensitivity) == (6, 600, 600)
    rewritten = rewrite(plan, "duckdb")
    assert rewritten.salted
    assert rewritten.measurement_columns == ("m0", "m1", "m2")
    # the exact statistics without unit 0 (its neighbouring database), keys in the list only
    without = by_key(run_sql(
        "SELECT g, COUNT(*), SUM(v), SUM(LEAST(GREATEST(x, 0), 100)) FROM t "
        "WHERE uid <> 0 AND g IN ('a', 'b', 'c') GROUP BY g"))
    kept_groups: Counter[tuple[str, ...]] = Counter()
    for _ in range(20):
        rows = run_rewritten(run_sql, rewritten, plan)
        assert all(len(row) == 4 for row in rows)  # keys and measurements only
        got = by_key(rows)
        assert set(got) == {"a", "b", "c"}
        count_change = {k: got[k][0] - without[k][0] for k in got}
        v_change = {k: got[k][1] - without[k][1] for k in got}
        x_change = {k: got[k][2] - without[k][2] for k in got}
        touched = tuple(sorted(k for k, c in count_change.items() if c))
        assert len(touched) <= MAX_GROUPS
        assert all(0 <= c <= MAX_ROWS for c in count_change.values())
        assert sum(abs(c) for c in count_change.values()) <= count_m.sensitivity
        assert sum(abs(c) for c in v_change.values()) <= v_m.sensitivity
        assert sum(abs(c) for c in x_change.values()) <= x_m.sensitivity
        # unit 0 has at least 3 rows in each group: the bound is reached exactly
        assert sum(count_change.values()) == MAX_ROWS * MAX_GROUPS
        assert all(v_change[k] == UPPER * count_change[k] for k in got)
        # its x in each group adds up to more than 3 × 100: SUM keeps that, in the kept ones
        assert {k: x_change[k] for k in touched} == {k: MAX_ROWS * 100 for k in touched}
        kept_groups[touched] += 1
    assert len(kept_groups) > 1  # the salt changes which groups unit 0 keeps


def test_heavy_unit_is_bounded_without_group_by(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    plan = plan_of(small_policy, "SELECT COUNT(*), SUM(v), COUNT(DISTINCT uid) FROM t")
    assert sensitivities(plan) == [MAX_ROWS, MAX_ROWS * UPPER, 1]
    rewritten = rewrite(plan, "duckdb")
    assert not rewritten.salted and rewritten.parameters() == ()
    (without,) = run_sql("SELECT COUNT(*), SUM(v), COUNT(DISTINCT uid) FROM t WHERE uid <> 0")
    for _ in range(5):
        (got,) = run_rewritten(run_sql, rewritten)
        assert got[0] - without[0] == MAX_ROWS
        assert got[1] - without[1] == MAX_ROWS * UPPER
        assert got[2] - without[2] == 1


def test_nulls_stay_null_through_clamping(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    """w is declared [10, 100] and NULL for every tenth unit: COUNT(w) skips the NULLs, and
    SUM and AVG ignore them — a NULL is not turned into the lower bound 10."""
    plan = plan_of(small_policy, "SELECT COUNT(w), SUM(w), AVG(w) FROM t WHERE uid > 0")
    rewritten = rewrite(plan, "duckdb")
    (got,) = run_rewritten(run_sql, rewritten)
    columns = dict(zip(rewritten.measurement_columns, got, strict=True))
    stats = {m.column: m.statistic for m in plan.measurements}
    (count_w, sum_w, n_nulls) = run_sql(
        "SELECT COUNT(w), SUM(w), COUNT(*) - COUNT(w) FROM t WHERE uid > 0")[0]
    assert n_nulls == 20
    for column, statistic in stats.items():
        value = columns[column]
        if statistic.kind == "count":
            assert value == count_w
        elif statistic.center:  # AVG's centred sum
            assert value == pytest.approx(sum_w - statistic.center * count_w, abs=1e-6)
        else:
            assert value == sum_w


def test_values_are_clamped_after_the_expression(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    """x is declared [0, 100] but holds -20 and 150. Each summed value is the row
    expression of the raw value, clamped to the expression's bounds: SUM(x) sees 0 and
    100; SUM(x * x) sees 400 (not 0) and 10,000 (not 22,500)."""
    plan = plan_of(small_policy, "SELECT SUM(x), SUM(x - 50), SUM(x * x), COUNT(x) FROM t "
                   "WHERE uid > 0")
    bounds = [(m.statistic.lower, m.statistic.upper) for m in plan.measurements[:3]]
    assert bounds == [(0, 100), (-50, 50), (0, 10000)]
    (got,) = run_rewritten(run_sql, rewrite(plan, "duckdb"), plan)
    xs = [r[0] for r in run_sql("SELECT x FROM t WHERE uid > 0")]
    present = [x for x in xs if x is not None]
    assert -20.0 in present and 150.0 in present
    expected = [sum(min(max(f(x), lo), hi) for x in present)
                for f, (lo, hi) in zip([lambda x: x, lambda x: x - 50, lambda x: x * x],
                                       bounds, strict=True)]
    assert got[:3] == pytest.approx(expected, abs=1e-6)
    assert got[3] == len(present)  # out-of-bounds values still count; NULLs do not


def test_keys_outside_public_values_are_dropped_before_bounding(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    plan = plan_of(small_policy, "SELECT g, COUNT(*) FROM t WHERE uid > 0 GROUP BY g")
    got = by_key(run_rewritten(run_sql, rewrite(plan, "duckdb")))
    assert set(got) <= {"a", "b", "c"}
    (public,) = run_sql("SELECT COUNT(*) FROM t WHERE uid > 0 AND g IN ('a', 'b', 'c')")[0]
    assert sum(v[0] for v in got.values()) == public
    assert public < len(LIGHT_UNITS)  # 'zzz' and NULL keys exist and were left out


def test_partition_selection_counts_units_not_rows(
        small_policy: Policy, run_sql: Callable[..., list[tuple[Any, ...]]]) -> None:
    """p = 'solo' belongs to unit 0 alone (50 rows): its count of units is 1, below any
    threshold, so it is never released; 'common' (150 units) is. At ε = 1000 the selection
    noise has scale 4e-3 (k = 2 groups per unit over ε/2 = 500): a draw of 1 or more has
    probability < e^-200."""
    plan = plan_of(small_policy, "SELECT p, COUNT(*) FROM t GROUP BY p", epsilon=1000.0,
                   delta=1e-7)
    assert plan.selection is not None and plan.selection.threshold >= 2
    got = by_key(run_rewritten(run_sql, rewrite(plan, "duckdb")))
    assert got["solo"] == (MAX_ROWS, 1)  # COUNT(*) after bounding, distinct units
    assert got["common"] == (150, 150)
    with Engine(small_policy) as engine:
        session = engine.session("bob", epsilon=1000.0, delta=1e-7)
        released = session.execute("SELECT p, COUNT(*) FROM t GROUP BY p").rows
    keys = [row[0] for row in released]
    assert "solo" not in keys and "common" in keys
    assert all(not k.startswith("own") for k in keys)  # one unit each: never released
    assert keys == sorted(keys)


def test_rewritten_statement_is_stable_and_the_salt_is_a_fresh_parameter(
        small_policy: Policy) -> None:
    """The statement depends only on the plan (so it can be cached per normalized query);
    the secret salt is bound as a parameter, drawn afresh for every execution, and never
    appears in the SQL text."""
    plan = plan_of(small_policy, "SELECT g, SUM(v) FROM t GROUP BY g")
    first, second = rewrite(plan, "duckdb"), rewrite(plan, "duckdb")
    assert first.sql == second.sql
    assert first.sql.count("?") == 1
    salts = {first.parameters()[0] for _ in range(50)}
    assert len(salts) == 50
    assert all(len(s) >= 32 and s not in first.sql for s in salts)


def test_rewritten_statement_returns_only_aggregates(small_policy: Policy) -> None:
    plan = plan_of(small_policy, "SELECT g, COUNT(x), SUM(v), AVG(w) FROM t "
                   "WHERE x > 3 GROUP BY g")
    rewritten = rewrite(plan, "duckdb")
    outer = parse_one(rewritten.sql, read="duckdb")
    assert isinstance(outer, exp.Select)
    names = [e.alias_or_name for e in outer.expressions]
    assert names == ["k0", *rewritten.measurement_columns]
    assert all(isinstance(e.this, exp.AggFunc | exp.Coalesce) for e in outer.expressions[1:])
    assert outer.args.get("group") is not None


def test_policy_for_small_database_is_valid(small_policy: Policy) -> None:
    table = small_policy.tables["t"]
    assert (table.privacy_unit, table.max_rows_per_unit, table.max_groups_per_unit) == (
        "uid", MAX_ROWS, MAX_GROUPS)
    assert len(heavy_rows()) == HEAVY_ROWS
    assert min(Counter(r[4] for r in heavy_rows()).values()) >= MAX_ROWS
