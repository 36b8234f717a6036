"""Row-level subqueries and WITH queries in FROM, and aggregate FILTER clauses
(`dpproxy.analyze.inline`, `analyze._fold_filters`): the query BI tools send means what
the flat query means, on the data (both run exactly in DuckDB) and to the analyzer (the
same backend statement and cost); every other subquery is still refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import sqlglot

from dpproxy import errors
from dpproxy.analyze import Analysis, analyze
from dpproxy.analyze.inline import inline
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, plan_query
from dpproxy.rewrite import rewrite
from dpproxy.session import Engine

from .test_server_support import ServeFactory

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")

# (what a tool or an analyst sends, the same query written flat)
PAIRS = [
    pytest.param(  # Metabase: a nested question
        'SELECT "source"."occupation" AS "occupation", COUNT(*) AS "count" FROM (SELECT '
        '"public"."adult"."occupation" AS "occupation", "public"."adult"."age" AS "age" '
        'FROM "public"."adult") AS "source" WHERE "source"."age" > 40 '
        'GROUP BY "source"."occupation" ORDER BY "source"."occupation" ASC',
        "SELECT occupation, COUNT(*) AS count FROM adult WHERE age > 40 GROUP BY occupation "
        "ORDER BY occupation", id="metabase"),
    pytest.param(  # Superset: a virtual dataset
        "SELECT occupation AS occupation, COUNT(*) AS count FROM (SELECT * FROM adult WHERE "
        "sex = 'Female') AS virtual_table GROUP BY occupation ORDER BY count DESC LIMIT 10000",
        "SELECT occupation, COUNT(*) AS count FROM adult WHERE sex = 'Female' "
        "GROUP BY occupation ORDER BY count DESC LIMIT 10000", id="superset"),
    pytest.param(  # Tableau: custom SQL
        'SELECT "Custom SQL Query"."occupation" AS "occupation", SUM("Custom SQL Query"."h") '
        'AS "sum:h:ok" FROM (SELECT occupation, LEAST(hours_per_week, 60) AS h FROM adult) '
        '"Custom SQL Query" GROUP BY 1',
        'SELECT occupation, SUM(LEAST(hours_per_week, 60)) AS "sum:h:ok" FROM adult '
        "GROUP BY 1", id="tableau"),
    pytest.param(
        "SELECT decade, COUNT(*), AVG(h) FROM (SELECT age / 10 AS decade, hours_per_week AS "
        "h FROM adult) s GROUP BY decade ORDER BY decade",
        "SELECT age / 10 AS decade, COUNT(*), AVG(hours_per_week) AS avg FROM adult "
        "GROUP BY age / 10 ORDER BY decade", id="expression-key"),
    pytest.param(
        "WITH older AS (SELECT * FROM adult WHERE age > 30), mid AS (SELECT occupation, sex "
        "FROM older WHERE age < 60) SELECT occupation, COUNT(*) FROM mid WHERE sex = 'Male' "
        "GROUP BY occupation",
        "SELECT occupation, COUNT(*) FROM adult WHERE age > 30 AND age < 60 AND sex = 'Male' "
        "GROUP BY occupation", id="cte-chain"),
    pytest.param(
        "SELECT COUNT(*) FROM (SELECT * FROM (SELECT * FROM adult WHERE age > 20) a "
        "WHERE age < 50) b WHERE sex = 'Male'",
        "SELECT COUNT(*) FROM adult WHERE age > 20 AND age < 50 AND sex = 'Male'",
        id="nested"),
    pytest.param(
        "SELECT s.age / 10 AS decade, COUNT(*) FROM (SELECT age FROM adult) s "
        "GROUP BY decade",
        "SELECT age / 10 AS decade, COUNT(*) FROM adult GROUP BY decade",
        id="group-by-output"),
    pytest.param(
        "SELECT a, COUNT(*) FROM (SELECT occupation, age FROM adult) AS t(a, b) "
        "WHERE b > 40 GROUP BY a",
        "SELECT occupation AS a, COUNT(*) FROM adult WHERE age > 40 GROUP BY occupation",
        id="column-names"),
    pytest.param(
        "WITH t(k, h) AS (SELECT sex, hours_per_week FROM adult) "
        "SELECT k, SUM(h) FROM t GROUP BY k",
        "SELECT sex AS k, SUM(hours_per_week) AS sum FROM adult GROUP BY sex",
        id="cte-column-names"),
    pytest.param(
        "SELECT COUNT(*) FROM (SELECT * FROM adult WHERE age < 20 OR age > 60) s "
        "WHERE sex = 'Male' OR sex = 'Female'",
        "SELECT COUNT(*) FROM adult WHERE (age < 20 OR age > 60) AND (sex = 'Male' OR "
        "sex = 'Female')", id="or"),
    pytest.param(
        "SELECT g.collar, COUNT(*) FROM (SELECT occupation FROM adult WHERE age > 30) s "
        "JOIN occupation_groups g ON s.occupation = g.occupation GROUP BY g.collar",
        "SELECT g.collar, COUNT(*) FROM adult JOIN occupation_groups g "
        "ON adult.occupation = g.occupation WHERE adult.age > 30 GROUP BY g.collar",
        id="join"),
    pytest.param(
        "SELECT collar, COUNT(*) FROM (SELECT occupation FROM adult WHERE age > 50) s "
        "JOIN occupation_groups USING (occupation) GROUP BY collar",
        "SELECT collar, COUNT(*) FROM adult JOIN occupation_groups USING (occupation) "
        "WHERE adult.age > 50 GROUP BY collar", id="join-using"),
    pytest.param(
        "SELECT sex, COUNT(*) FILTER (WHERE age > 40) AS older, AVG(hours_per_week) "
        "FILTER (WHERE age > 40) AS hours, SUM(capital_gain) FILTER (WHERE sex = 'Male') "
        "FROM adult GROUP BY sex",
        "SELECT sex, COUNT(CASE WHEN age > 40 THEN 1 END) AS older, AVG(CASE WHEN age > 40 "
        "THEN hours_per_week END) AS hours, SUM(CASE WHEN sex = 'Male' THEN capital_gain END) "
        "AS sum FROM adult GROUP BY sex", id="filter"),
    pytest.param(
        "SELECT VAR_POP(age) FILTER (WHERE sex = 'Male') FROM adult",
        "SELECT VAR_POP(CASE WHEN sex = 'Male' THEN age END) AS var_pop FROM adult",
        id="variance-filter"),
]


def _rows(con: duckdb.DuckDBPyConnection, sql: str | sqlglot.exp.Expression
          ) -> list[tuple[Any, ...]]:
    """The rows of a PostgreSQL query run in DuckDB (schema public is DuckDB's main)."""
    tree = sqlglot.parse_one(sql, read="postgres") if isinstance(sql, str) else sql.copy()
    for node in tree.find_all(sqlglot.exp.Table, sqlglot.exp.Column):
        if node.args.get("db") is not None and node.text("db") == "public":
            node.set("db", None)
    return sorted(con.execute(tree.sql("duckdb")).fetchall(), key=repr)


def _close(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(
            math.isclose(u, v, rel_tol=1e-12) if isinstance(u, float) and isinstance(v, float)
            else u == v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("wrapped", "flat"), PAIRS)
def test_wrapped_and_flat_queries_mean_the_same(wrapped: str, flat: str,
                                                demo_database: Path, engine: Engine) -> None:
    """On the data: the query as sent, its merged form and the flat query return the same
    rows, run exactly in DuckDB (which reads subqueries, WITH and FILTER itself). To the
    analyzer: the same outputs, backend statement and cost as the flat query."""
    merged = inline(sqlglot.parse_one(wrapped, read="postgres"))
    with duckdb.connect(str(demo_database), read_only=True) as con:
        sent = _rows(con, wrapped)
        assert sent  # the pair is not vacuous
        assert _close(_rows(con, merged), sent)
        assert _close(_rows(con, flat), sent)
    policy = engine.policy
    alice = policy.analysts["alice"]
    options = QueryOptions(1.0, 1e-6, "laplace")
    plans = []
    for sql in (wrapped, flat):
        ast = parse_statements(sql)[0].ast
        assert ast is not None
        analysis = analyze(ast, policy, alice)
        assert isinstance(analysis, Analysis)
        assert analysis.statement == ast.sql("postgres")  # the text as sent is kept
        plans.append(plan_query(analysis, options))
    (mine, theirs) = plans
    assert [o.name for o in mine.analysis.outputs] == [o.name for o in theirs.analysis.outputs]
    assert rewrite(mine).sql == rewrite(theirs).sql
    assert mine.cost == theirs.cost


@pytest.mark.parametrize(("wrapped", "flat"), PAIRS)
def test_a_wrapped_query_runs_on_the_backend(wrapped: str, flat: str, engine: Engine) -> None:
    """Through a session, on DuckDB and on PostgreSQL: the merged statement runs and gives
    the flat query's columns and groups, at one charge of the query's ε. (`age / 10` is a
    private key: at ε = 5 partition selection's threshold is about 7 units, which the
    smallest decade, 43 people aged 90, misses with probability below e^-80; a join's
    smallest collar other than 'military' has 813 people.)"""
    alice = engine.session("alice", epsilon=5.0)
    result = alice.execute(wrapped)
    assert result.cost is not None and result.cost.epsilon == pytest.approx(5.0)
    expected = alice.execute(flat)
    assert result.columns == expected.columns and result.types == expected.types
    ast = parse_statements(flat)[0].ast
    assert ast is not None
    analysis = analyze(ast, engine.policy, engine.policy.analysts["alice"])
    assert isinstance(analysis, Analysis)
    keys = [i for i, o in enumerate(analysis.outputs) if o.aggregate is None]

    def groups(rows: list[tuple[Any, ...]]) -> list[str]:
        # collar 'military' (5 people over 30, 2 over 50) is near the threshold: released
        # by chance, in either query or both
        return sorted(repr([r[i] for i in keys]) for r in rows if "military" not in r)
    assert groups(result.rows) == groups(expected.rows)
    assert len(groups(result.rows)) > 0


@pytest.mark.parametrize(("sql", "problem", "says"), [
    ("SELECT COUNT(*) FROM (SELECT occupation, COUNT(*) AS n FROM adult GROUP BY "
     "occupation) s", errors.NotSupportedError, "GROUP BY"),
    ("SELECT AVG(n) FROM (SELECT COUNT(*) AS n FROM adult) s", errors.NotSupportedError,
     "aggregates"),
    # a value per day (not per person), to average outside: the hint is the one query
    # that does it (values per person are tests/test_per_unit.py's)
    ("SELECT AVG(n) FROM (SELECT day, COUNT(*) AS n FROM visits GROUP BY day) t",
     errors.NotSupportedError, "COUNT(*) * 1.0 / COUNT(DISTINCT day) FROM visits"),
    ("SELECT COUNT(*) FROM (SELECT * FROM adult LIMIT 10) s", errors.NotSupportedError,
     "LIMIT"),
    ("SELECT COUNT(*) FROM (SELECT DISTINCT person_id FROM adult) s",
     errors.NotSupportedError, "DISTINCT"),
    ("SELECT COUNT(*) FROM (SELECT age, ROW_NUMBER() OVER () AS r FROM adult) s",
     errors.NotSupportedError, "aggregates"),
    ("SELECT COUNT(*) FROM (SELECT age FROM adult UNION ALL SELECT age FROM adult) s",
     errors.NotSupportedError, "UNION"),
    ("WITH RECURSIVE r AS (SELECT * FROM adult) SELECT COUNT(*) FROM r",
     errors.NotSupportedError, "RECURSIVE"),
    ("WITH t(a) AS (SELECT * FROM adult) SELECT COUNT(a) FROM t",
     errors.NotSupportedError, "SELECT *"),
    ("SELECT COUNT(*) FROM (SELECT age FROM adult) AS t(a, b)",
     errors.InvalidColumnReference, "2 columns specified"),
    ("WITH a AS (SELECT * FROM adult) SELECT COUNT(*) FROM adult JOIN a ON "
     "adult.person_id = a.person_id", errors.NotSupportedError, "joined"),
    ("SELECT COUNT(nope) FROM (SELECT age FROM adult) s", errors.UndefinedColumn, "nope"),
    ("SELECT COUNT(*) FROM (SELECT 1 AS x) s", errors.NotSupportedError, "without a table"),
    ("SELECT collar, COUNT(*) FROM (SELECT LOWER(occupation) AS occupation FROM adult) s "
     "JOIN occupation_groups USING (occupation) GROUP BY collar", errors.NotSupportedError,
     "USING"),
    ("SELECT x FROM (SELECT age AS x FROM adult) s", errors.PrivacyViolation,
     "raw values"),
    ("SELECT * FROM (SELECT age FROM adult) s", errors.PrivacyViolation, "SELECT *"),
    ("SELECT COUNT(*) FROM (SELECT * FROM nowhere) s", errors.UndefinedTable, "nowhere"),
    ("SELECT COUNT(*) FROM (SELECT (SELECT MAX(age) FROM adult) AS m FROM adult) s",
     errors.NotSupportedError, "aggregates"),
    ("SELECT SUM(m) FROM (SELECT age + (SELECT 1) AS m FROM adult) s",
     errors.NotSupportedError, "subqueries"),
    ("SELECT COUNT(*) FROM adult WHERE age IN (SELECT age FROM adult)",
     errors.NotSupportedError, "subqueries"),
    ("SELECT person_id, COUNT(*) FROM (SELECT * FROM adult) s GROUP BY person_id",
     errors.PrivacyViolation, "privacy unit"),
    ("SELECT SUM(DISTINCT age) FILTER (WHERE age > 3) FROM adult",
     errors.NotSupportedError, "FILTER"),
    ("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) FILTER (WHERE sex = 'Male') "
     "FROM adult", errors.NotSupportedError, "FILTER"),
])
def test_what_is_not_a_selection_of_rows_is_refused(engine: Engine, sql: str,
                                                    problem: type[errors.Error],
                                                    says: str) -> None:
    """Nothing else in FROM is merged: an inner aggregate, LIMIT, DISTINCT, window or set
    operation would change how many rows a person has, so the query is refused, and so is
    whatever the merged query would be refused for written flat."""
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    with pytest.raises(problem) as raised:
        analyze(ast, engine.policy, engine.policy.analysts["alice"])
    assert says in str(raised.value)
    if isinstance(raised.value, errors.NotSupportedError) and "FILTER" not in sql:
        assert raised.value.hint  # says what to write instead


def test_bi_tool_queries_over_the_wire(serve: ServeFactory) -> None:
    """Each wrapped query over psycopg: answered with the flat query's columns and groups.

    The two are noised separately, so a group near partition selection's threshold (5
    rows at ε = 5, Laplace scale 0.2: the 'military' collar holds 2 people over 50) may
    pass in one and not the other. Every group of ≥ 30 passes in both (missing it takes
    noise below -25: probability e^-125), and a group in only one of them was released
    with a count under 30 (a count of ≤ 10 would need noise above 20: e^-100)."""
    served = serve({"budget = { epsilon = 10.0, delta = 1e-5 }":
                    "budget = { epsilon = 1000.0, delta = 1e-5 }"})
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 5")  # every decade passes selection (see above)
        for pair in PAIRS:
            wrapped, flat = pair.values
            got = conn.execute(wrapped)
            rows = got.fetchall()
            assert got.description is not None
            names = [c.name for c in got.description]
            expected = conn.execute(flat)
            assert expected.description is not None
            assert names == [c.name for c in expected.description]
            flat_rows = expected.fetchall()
            key_count = 1 if len(flat_rows[0]) > 1 else 0
            mine = {r[:key_count]: r for r in rows}
            theirs = {r[:key_count]: r for r in flat_rows}
            assert len(mine) == len(rows) and len(theirs) == len(flat_rows)
            for key in set(mine) ^ set(theirs):
                released = mine.get(key) or theirs[key]
                assert released[1] < 30, (pair.id, released)  # a small group's COUNT(*)
            assert len(set(mine) & set(theirs)) >= max(len(mine), len(theirs)) - 1


def test_parameters_inside_and_outside_a_subquery(engine: Engine, demo_database: Path) -> None:
    """A wrapped query run again with new values (a repeated shape takes its cached
    analysis) answers for those values: within 200 of the exact count, which the demo's
    Laplace noise (scale 10) exceeds with probability e^-20 per answer; the counts of
    these settings lie thousands apart."""
    alice = engine.session("alice")
    sql = "SELECT COUNT(*) FROM (SELECT * FROM adult WHERE age > %s) s WHERE s.sex = %s"
    with duckdb.connect(str(demo_database), read_only=True) as con:
        for age, sex in [(40, "Male"), (70, "Female"), (40, "Female"), (20, "Male")]:
            row = con.execute("SELECT COUNT(*) FROM adult WHERE age > ? AND sex = ?",
                              [age, sex]).fetchone()
            assert row is not None
            (released,) = alice.execute(sql, [age, sex]).rows[0]
            assert abs(released - row[0]) < 200, (age, sex)


def test_the_hint_for_a_value_per_day_runs(make_policy: Any) -> None:
    """The refusal of a value per group of a column other than the privacy unit names a
    query that is answered: visits per day, from the noisy count of visits and of days
    (bounded: at most 10 visits of a person count, in at most 4 days). At ε = 10⁴ the
    noise is below 1 but with probability ~e^-100; the bounded answer is about 534."""
    sql = "SELECT AVG(n) FROM (SELECT day, COUNT(*) AS n FROM visits GROUP BY day) t"
    policy = make_policy({"budget = { epsilon = 10.0,": "budget = { epsilon = 1e5,"})
    with Engine.from_path(policy) as engine:
        alice = engine.session("alice", epsilon=1e4)
        with pytest.raises(errors.NotSupportedError) as raised:
            alice.execute(sql)
        assert raised.value.hint is not None
        hinted = raised.value.hint.split("divide in one query: ")[1].split(" (")[0]
        (per_day,), = alice.execute(hinted).rows
    assert 300 <= per_day <= 712  # 712 visits a day before bounding
