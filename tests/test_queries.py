"""The SQL surface end to end through a Session: what is accepted (names, rows, cost, values),
what is rejected (exact SQLSTATE, nothing charged), and the privacy behaviours around them.

Noise and tolerances. Value checks run at ε = 1000 per query (`EPS`). A query with k noisy
statistics gives each ε/k, so a statistic of L1 sensitivity Δ gets Laplace scale b ≈ kΔ/1000
(never less). Every tolerance below is at least 50·b of the statistics involved (divided by
the group's count for AVG); a (discrete) Laplace draw exceeds 50·b with probability
< 2·e^-50 ≈ 4e-22, so no test here fails by bad luck with any noticeable probability.
Tests that need noise to be visible run at the policy's default ε = 0.1 and state their
false-failure probability where they make the assertion.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dpproxy import errors
from dpproxy.accountant import Cost
from dpproxy.session import Engine, Result, Session

from .test_server_support import BIG_BUDGET

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


EPS = 1000.0
NO_VISITS = {'tables = ["adult", "visits", "occupation_groups"]':
             'tables = ["adult", "occupation_groups"]'}


# -- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exact_db(demo_database: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[duckdb.DuckDBPyConnection]:
    """The demo data read directly: the noiseless answers the released values are checked
    against (never through dpproxy). A copy of the file: a connection to the very file the
    engines use would share (and keep alive) their locked DuckDB instance."""
    copy = tmp_path_factory.mktemp("exact") / "demo.duckdb"
    shutil.copyfile(demo_database, copy)
    con = duckdb.connect(str(copy), read_only=True)
    yield con
    con.close()


@pytest.fixture
def big_engine(make_policy: Any) -> Iterator[Engine]:
    with Engine.from_path(make_policy(replace=BIG_BUDGET)) as eng:
        yield eng


def exact(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in con.execute(sql).fetchall()]


def one_value(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    rows = exact(con, sql)
    assert len(rows) == 1 and len(rows[0]) == 1
    return rows[0][0]


def visits_bounded_count(where: str = "") -> str:
    """COUNT(*) over visits after user-level bounding: each person keeps at most
    max_rows_per_unit = 10 rows (no GROUP BY: one group), whichever 10 are chosen."""
    return ("SELECT SUM(LEAST(n, 10)) FROM (SELECT COUNT(*) AS n FROM visits "
            f"{where} GROUP BY person_id)")


def policy_order(values: list[str], column: str) -> str:
    """A DuckDB ORDER BY term that sorts keys in the policy's order of public values."""
    quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in values)
    return f"list_position([{quoted}], {column})"


# -- 1. accepted queries -------------------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    id: str
    sql: str
    columns: tuple[str, ...]
    rows: int
    exact: str | None = None  # DuckDB SQL giving the noiseless rows: keys first, then values
    tol: float = 1.0  # absolute tolerance per value (see the module docstring)
    keys: tuple[str, ...] = ()  # policy names of the leading key columns of the output
    ordered: bool = False  # compare rows in order (ORDER BY / LIMIT); else by key
    params: Any = None
    epsilon: float = EPS  # expected charge
    delta: float = 0.0
    charged: bool = True
    table: str = "adult"


OCCUPATIONS = ["Adm-clerical", "Exec-managerial", "Handlers-cleaners", "Prof-specialty",
               "Other-service", "Sales", "Craft-repair", "Transport-moving", "Farming-fishing",
               "Machine-op-inspct", "Tech-support", "Protective-serv", "Armed-Forces",
               "Priv-house-serv"]

ACCEPTED = [
    # aggregates ------------------------------------------------------------------------------
    Accepted("count_star", "SELECT COUNT(*) FROM adult", ("count",), 1,
             "SELECT COUNT(*) FROM adult"),
    Accepted("count_column_skips_null", "SELECT COUNT(occupation) FROM adult", ("count",), 1,
             "SELECT COUNT(occupation) FROM adult"),
    Accepted("count_distinct_unit", "SELECT COUNT(DISTINCT person_id) FROM adult", ("count",),
             1, "SELECT COUNT(DISTINCT person_id) FROM adult"),
    # Δ = max_rows = 1 → b ≈ 0.001 (one row per person in adult)
    Accepted("count_distinct_column", "SELECT COUNT(DISTINCT age) FROM adult", ("count",), 1,
             "SELECT COUNT(DISTINCT age) FROM adult"),
    Accepted("count_distinct_expression_by_key",
             "SELECT sex, COUNT(DISTINCT occupation || '/' || education) AS pairs FROM adult "
             "GROUP BY sex", ("sex", "pairs"), 2,
             "SELECT sex, COUNT(DISTINCT occupation || '/' || education) FROM adult GROUP BY sex",
             keys=("sex",)),
    Accepted("count_distinct_filter",
             "SELECT COUNT(DISTINCT age) FILTER (WHERE sex = 'Male') AS ages FROM adult",
             ("ages",), 1, "SELECT COUNT(DISTINCT age) FILTER (WHERE sex = 'Male') FROM adult"),
    # visits: up to 10 rows per person, so a distinct count is over each one's kept rows
    Accepted("visits_count_distinct_day", "SELECT COUNT(DISTINCT day) FROM visits",
             ("count",), 1, "SELECT COUNT(DISTINCT day) FROM visits", table="visits"),
    # Δ = 99 → b ≈ 0.1
    Accepted("sum_bounded_column", "SELECT SUM(hours_per_week) FROM adult", ("sum",), 1,
             "SELECT SUM(hours_per_week) FROM adult", tol=5),
    # centred sum Δ = 36.5 at ε/2 → b ≈ 0.07; / n = 32,561
    Accepted("avg_bounded_column", "SELECT AVG(age) FROM adult", ("avg",), 1,
             "SELECT AVG(age) FROM adult", tol=0.01),
    # Δ = 99·52 = 5148 → b ≈ 5.1
    Accepted("sum_times_constant", "SELECT SUM(hours_per_week * 52) FROM adult", ("sum",), 1,
             "SELECT SUM(hours_per_week * 52) FROM adult", tol=260),
    Accepted("avg_minus_constant", "SELECT AVG(age - 17) FROM adult", ("avg",), 1,
             "SELECT AVG(age - 17) FROM adult", tol=0.01),
    # bounds [0, 50] → b = 0.05
    Accepted("sum_abs", "SELECT SUM(ABS(age - 40)) FROM adult", ("sum",), 1,
             "SELECT SUM(ABS(age - 40)) FROM adult", tol=3),
    # NULL for men: AVG over the 10,764 women only
    Accepted("avg_case_without_else",
             "SELECT AVG(CASE WHEN sex = 'Female' THEN age END) FROM adult", ("avg",), 1,
             "SELECT AVG(CASE WHEN sex = 'Female' THEN age END) FROM adult", tol=0.02),
    Accepted("sum_coalesce",
             "SELECT SUM(COALESCE(CASE WHEN income = '>50K' THEN hours_per_week END, 0)) "
             "FROM adult", ("sum",), 1,
             "SELECT SUM(CASE WHEN income = '>50K' THEN hours_per_week ELSE 0 END) FROM adult",
             tol=5),
    # An explicit clamp bounds an unbounded expression (Δ = 1000 → b = 1). Integer division
    # truncates as in PostgreSQL; a zero divisor gives NULL (made total), which GREATEST skips.
    Accepted("sum_explicit_clamp_of_unbounded",
             "SELECT SUM(LEAST(GREATEST(capital_gain / (age - 40), -1000), 1000)) FROM adult",
             ("sum",), 1,
             "SELECT SUM(LEAST(GREATEST(TRUNC(capital_gain / NULLIF(age - 40, 0)), -1000), "
             "1000)) FROM adult", tol=50),
    Accepted("sum_explicit_clamp_of_length",
             "SELECT SUM(LEAST(GREATEST(LENGTH(occupation), 0), 20)) FROM adult", ("sum",), 1,
             "SELECT SUM(LEAST(GREATEST(LENGTH(occupation), 0), 20)) FROM adult", tol=2),
    Accepted("sum_case_indicator",
             "SELECT SUM(CASE WHEN age > 50 THEN 1 ELSE 0 END) AS over_50 FROM adult",
             ("over_50",), 1, "SELECT COUNT(*) FILTER (WHERE age > 50) FROM adult"),
    # quantiles (exponential mechanism, dpproxy/quantiles.py): at ε = 1000 the bin holding the
    # exact quantile wins against each other bin by a factor e^500 or more, so the value is
    # that bin's point; tol covers DuckDB's interpolation between neighbouring values
    Accepted("median", "SELECT MEDIAN(age) FROM adult", ("median",), 1,
             "SELECT MEDIAN(age) FROM adult", tol=1),
    Accepted("percentile_cont_by_public_key",
             "SELECT sex, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY hours_per_week) AS p90 "
             "FROM adult GROUP BY sex", ("sex", "p90"), 2,
             "SELECT sex, QUANTILE_CONT(hours_per_week, 0.9) FROM adult GROUP BY sex", tol=1,
             keys=("sex",)),
    Accepted("percentile_cont_descending",
             "SELECT PERCENTILE_CONT(0.75) WITHIN GROUP (ORDER BY age DESC) FROM adult",
             ("percentile_cont",), 1, "SELECT QUANTILE_CONT(age, 0.25) FROM adult", tol=1),
    # the demo's ages reach both policy bounds, so the extreme quantiles are exact here
    Accepted("min_max_as_extreme_quantiles", "SELECT MIN(age), MAX(age) FROM adult",
             ("min", "max"), 1, "SELECT MIN(age), MAX(age) FROM adult", tol=0),
    Accepted("median_with_count_where_having",
             "SELECT sex, COUNT(*) AS n, MEDIAN(age) AS m FROM adult WHERE hours_per_week > 40 "
             "GROUP BY sex HAVING MEDIAN(age) > 0", ("sex", "n", "m"), 2,
             "SELECT sex, COUNT(*), MEDIAN(age) FROM adult WHERE hours_per_week > 40 "
             "GROUP BY sex", tol=1, keys=("sex",)),
    # 5,001 integers: 1,024 equal bins of width 4.88, released at the midpoint (2.44 here)
    Accepted("median_of_clamped_expression",
             "SELECT MEDIAN(LEAST(GREATEST(capital_gain, 0), 5000)) AS m FROM adult", ("m",),
             1, "SELECT MEDIAN(LEAST(capital_gain, 5000)) FROM adult", tol=2.5),
    Accepted("where_and", "SELECT COUNT(*) FROM adult WHERE age > 30 AND sex = 'Male'",
             ("count",), 1, "SELECT COUNT(*) FROM adult WHERE age > 30 AND sex = 'Male'"),
    Accepted("where_or_not",
             "SELECT COUNT(*) FROM adult WHERE age > 60 OR NOT (sex = 'Male')", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age > 60 OR NOT (sex = 'Male')"),
    Accepted("where_in",
             "SELECT COUNT(*) FROM adult WHERE occupation IN ('Sales', 'Tech-support')",
             ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE occupation IN ('Sales', 'Tech-support')"),
    Accepted("where_not_in",
             "SELECT COUNT(*) FROM adult WHERE education NOT IN ('HS-grad', 'Bachelors')",
             ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE education NOT IN ('HS-grad', 'Bachelors')"),
    Accepted("where_between", "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30",
             ("count",), 1, "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 30"),
    Accepted("where_like", "SELECT COUNT(*) FROM adult WHERE education LIKE '%th'",
             ("count",), 1, "SELECT COUNT(*) FROM adult WHERE education LIKE '%th'"),
    Accepted("where_is_null", "SELECT COUNT(*) FROM adult WHERE occupation IS NULL",
             ("count",), 1, "SELECT COUNT(*) FROM adult WHERE occupation IS NULL"),
    Accepted("where_is_not_null_and_arithmetic",
             "SELECT COUNT(*) FROM adult WHERE occupation IS NOT NULL "
             "AND hours_per_week * 52 > 2000", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE occupation IS NOT NULL "
             "AND hours_per_week * 52 > 2000"),
    Accepted("where_lower", "SELECT COUNT(*) FROM adult WHERE LOWER(sex) = 'female'",
             ("count",), 1, "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"),
    Accepted("where_cast_double",
             "SELECT COUNT(*) FROM adult WHERE CAST(age AS DOUBLE) / 2 > 20.25", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age / 2 > 20.25"),
    # visits: user-level bounding, at most 10 rows per person (L1 = 10 → b = 0.01)
    Accepted("visits_count_bounded", "SELECT COUNT(*) FROM visits", ("count",), 1,
             visits_bounded_count(), table="visits"),
    Accepted("visits_count_distinct_unit", "SELECT COUNT(DISTINCT person_id) FROM visits",
             ("count",), 1, "SELECT COUNT(DISTINCT person_id) FROM visits", table="visits"),
    Accepted("visits_date_comparison",
             "SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-06-01'", ("count",), 1,
             visits_bounded_count("WHERE day >= DATE '2024-06-01'"), table="visits"),
    Accepted("visits_extract_month",
             "SELECT COUNT(*) FROM visits WHERE EXTRACT(month FROM day) = 3", ("count",), 1,
             visits_bounded_count("WHERE month(day) = 3"), table="visits"),
    Accepted("visits_date_difference",
             "SELECT COUNT(*) FROM visits WHERE day - DATE '2024-01-01' < 10", ("count",), 1,
             visits_bounded_count("WHERE day - DATE '2024-01-01' < 10"), table="visits"),
    # GROUP BY public keys --------------------------------------------------------------------
    Accepted("group_by_sex", "SELECT sex, COUNT(*) FROM adult GROUP BY sex", ("sex", "count"),
             2, "SELECT sex, COUNT(*) FROM adult GROUP BY sex", keys=("sex",)),
    Accepted("group_by_two_keys",
             "SELECT sex, income, COUNT(*) FROM adult GROUP BY sex, income",
             ("sex", "income", "count"), 4,
             "SELECT sex, income, COUNT(*) FROM adult GROUP BY sex, income",
             keys=("sex", "income")),
    # 14 public occupations; the 1,843 NULL occupations are not a public key: dropped
    Accepted("group_by_occupation_sum",
             "SELECT occupation, SUM(hours_per_week) FROM adult GROUP BY occupation",
             ("occupation", "sum"), 14,
             "SELECT occupation, SUM(hours_per_week) FROM adult GROUP BY occupation",
             keys=("occupation",), tol=5),
    # smallest group: 51 people (Preschool); b_sum ≈ 0.1 → 5 / 51 ≈ 0.1
    Accepted("group_by_education_avg",
             "SELECT education, AVG(hours_per_week) FROM adult GROUP BY education",
             ("education", "avg"), 16,
             "SELECT education, AVG(hours_per_week) FROM adult GROUP BY education",
             keys=("education",), tol=0.2),
    Accepted("group_by_position", "SELECT occupation, COUNT(*) FROM adult GROUP BY 1",
             ("occupation", "count"), 14,
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation",
             keys=("occupation",)),
    Accepted("group_by_alias",
             "SELECT occupation AS o, COUNT(*) AS n FROM adult GROUP BY o", ("o", "n"), 14,
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation",
             keys=("occupation",)),
    # joins with the public occupation_groups (occupation declared unique: no fan-out)
    Accepted("join_public_count",
             "SELECT COUNT(*) FROM adult a JOIN occupation_groups g "
             "ON a.occupation = g.occupation", ("count",), 1,
             "SELECT COUNT(*) FROM adult a JOIN occupation_groups g "
             "ON a.occupation = g.occupation"),
    # collar has no public values: partition selection (δ), NULL group of unmatched rows kept
    Accepted("join_public_left_group_by_public_column",
             "SELECT g.collar, COUNT(*) FROM adult a LEFT JOIN occupation_groups g "
             "USING (occupation) GROUP BY g.collar ORDER BY 1", ("collar", "count"), 5,
             "SELECT g.collar, COUNT(*) FROM adult a LEFT JOIN occupation_groups g "
             "USING (occupation) GROUP BY g.collar ORDER BY 1 NULLS LAST", keys=("collar",),
             ordered=True, delta=1e-7),
    Accepted("group_by_key_not_selected", "SELECT COUNT(*) FROM adult GROUP BY sex",
             ("count",), 2, "SELECT COUNT(*) FROM adult GROUP BY sex ORDER BY sex",
             ordered=True),
    Accepted("group_by_with_where_on_key",
             "SELECT occupation, COUNT(*) FROM adult "
             "WHERE occupation IN ('Sales', 'Tech-support') GROUP BY occupation",
             ("occupation", "count"), 14,
             "SELECT occupation, COUNT(*) FROM adult "
             "WHERE occupation IN ('Sales', 'Tech-support') GROUP BY occupation",
             keys=("occupation",)),
    # outputs: aliases and arithmetic over aggregates -----------------------------------------
    Accepted("aliases", "SELECT COUNT(*) AS n, SUM(age) AS total FROM adult", ("n", "total"), 1,
             "SELECT COUNT(*), SUM(age) FROM adult", tol=5),
    # bigint / bigint truncates: 1,258,335 / 32,561 = 38.6 → 38, far from 38 and 39
    Accepted("ratio_of_aggregates", "SELECT SUM(age) / COUNT(*) FROM adult", ("?column?",), 1,
             "SELECT SUM(age) // COUNT(*) FROM adult", tol=0),
    Accepted("count_times_two", "SELECT COUNT(*) * 2 FROM adult", ("?column?",), 1,
             "SELECT COUNT(*) * 2 FROM adult", tol=2),
    # ROUND may flip one step of 0.1 when the mean is within noise of a rounding edge
    Accepted("round_avg", "SELECT ROUND(AVG(age), 1) FROM adult", ("round",), 1,
             "SELECT ROUND(AVG(age), 1) FROM adult", tol=0.11),
    Accepted("case_on_output",
             "SELECT CASE WHEN COUNT(*) > 1000 THEN 'big' ELSE 'small' END AS size FROM adult",
             ("size",), 1, "SELECT 'big'"),
    # HAVING, ORDER BY, LIMIT / OFFSET (post-processing) --------------------------------------
    # occupation hour sums: 78,700 is the largest below and 128,684 the smallest above 100,000
    Accepted("having_aggregate_not_selected",
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation "
             "HAVING SUM(hours_per_week) > 100000", ("occupation", "count"), 6,
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation "
             "HAVING SUM(hours_per_week) > 100000", keys=("occupation",)),
    Accepted("having_alias",
             "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex HAVING n > 15000",
             ("sex", "n"), 1,
             "SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING COUNT(*) > 15000",
             keys=("sex",)),
    Accepted("order_by_alias_desc_limit",
             "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation "
             "ORDER BY n DESC LIMIT 3", ("occupation", "n"), 3,
             "SELECT occupation, COUNT(*) AS n FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation ORDER BY n DESC LIMIT 3", keys=("occupation",), ordered=True),
    Accepted("order_by_position_limit_offset",
             "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation "
             "ORDER BY 2 DESC LIMIT 3 OFFSET 2", ("occupation", "n"), 3,
             "SELECT occupation, COUNT(*) AS n FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation ORDER BY n DESC LIMIT 3 OFFSET 2", keys=("occupation",),
             ordered=True),
    # sums are at least 3,500 apart: the noisy order is the exact order
    Accepted("order_by_aggregate",
             "SELECT occupation, SUM(hours_per_week) FROM adult GROUP BY occupation "
             "ORDER BY SUM(hours_per_week)", ("occupation", "sum"), 14,
             "SELECT occupation, SUM(hours_per_week) FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation ORDER BY 2", keys=("occupation",), ordered=True, tol=5),
    Accepted("order_by_key_desc",
             "SELECT income, COUNT(*) FROM adult GROUP BY income ORDER BY income DESC",
             ("income", "count"), 2,
             "SELECT income, COUNT(*) FROM adult GROUP BY income ORDER BY income DESC",
             keys=("income",), ordered=True),
    Accepted("limit_keeps_policy_order",
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation LIMIT 5",
             ("occupation", "count"), 5,
             "SELECT occupation, COUNT(*) FROM adult WHERE occupation IS NOT NULL "
             f"GROUP BY occupation ORDER BY {policy_order(OCCUPATIONS, 'occupation')} LIMIT 5",
             keys=("occupation",), ordered=True),
    Accepted("fetch_first_rows_only",
             "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation "
             "ORDER BY 2 DESC OFFSET 2 ROWS FETCH FIRST 3 ROWS ONLY", ("occupation", "n"), 3,
             "SELECT occupation, COUNT(*) AS n FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation ORDER BY n DESC LIMIT 3 OFFSET 2", keys=("occupation",),
             ordered=True),
    Accepted("fetch_first_row_only",
             "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation "
             "ORDER BY 2 DESC FETCH NEXT ROW ONLY", ("occupation", "n"), 1,
             "SELECT occupation, COUNT(*) AS n FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation ORDER BY n DESC LIMIT 1", keys=("occupation",),
             ordered=True),
    Accepted("limit_all",
             "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation LIMIT ALL",
             ("occupation", "count"), 14,
             "SELECT occupation, COUNT(*) FROM adult WHERE occupation IS NOT NULL "
             "GROUP BY occupation", keys=("occupation",)),
    # names ---------------------------------------------------------------------------------
    Accepted("table_alias_qualified_column",
             "SELECT COUNT(*) FROM adult a WHERE a.age > 50", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age > 50"),
    Accepted("column_qualified_by_table", "SELECT SUM(adult.age) FROM adult", ("sum",), 1,
             "SELECT SUM(age) FROM adult", tol=5),
    Accepted("schema_qualified_table", "SELECT COUNT(*) FROM public.adult", ("count",), 1,
             "SELECT COUNT(*) FROM adult"),
    # parameters are bound as literals ----------------------------------------------------------
    Accepted("params_positional",
             "SELECT COUNT(*) FROM adult WHERE age > %s AND sex = %s", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age > 40 AND sex = 'Female'",
             params=[40, "Female"]),
    Accepted("params_named",
             "SELECT COUNT(*) FROM adult WHERE age BETWEEN %(lo)s AND %(hi)s", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 29",
             params={"lo": 20, "hi": 29}),
    Accepted("params_dollar", "SELECT COUNT(*) FROM adult WHERE age > $1", ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age > 50", params=[50]),
    Accepted("params_date", "SELECT COUNT(*) FROM visits WHERE day < %s", ("count",), 1,
             visits_bounded_count("WHERE day < DATE '2024-03-01'"),
             params=[dt.date(2024, 3, 1)], table="visits"),
    Accepted("params_quote_in_string",
             "SELECT COUNT(*) FROM adult WHERE occupation = %s", ("count",), 1,
             "SELECT 0", params=["Sales' OR 'a' = 'a"]),
    Accepted("params_list_any",  # psycopg's idiom for a list: read as IN
             "SELECT COUNT(*) FROM adult WHERE age = ANY(%s) AND occupation <> ALL(%s)",
             ("count",), 1,
             "SELECT COUNT(*) FROM adult WHERE age IN (30, 40, 50) "
             "AND occupation NOT IN ('Sales', 'Tech-support')",
             params=[[30, 40, 50], ("Sales", "Tech-support")]),
    Accepted("any_array_literal",
             "SELECT sex, COUNT(*) FROM adult WHERE age = ANY(ARRAY[30, 40]) GROUP BY sex",
             ("sex", "count"), 2,
             "SELECT sex, COUNT(*) FROM adult WHERE age IN (30, 40) GROUP BY sex",
             keys=("sex",)),
    Accepted("any_empty_list", "SELECT COUNT(*) FROM adult WHERE age = ANY(%s)", ("count",),
             1, "SELECT 0", params=[[]]),
    # several statements, options -------------------------------------------------------------
    # ε = 0.5 → b = 2
    Accepted("set_then_query", "SET dpproxy.epsilon = 0.5; SELECT COUNT(*) FROM adult",
             ("count",), 1, "SELECT COUNT(*) FROM adult", tol=100, epsilon=0.5),
    Accepted("gaussian_charges_delta",
             "SET dpproxy.mechanism = 'gaussian'; SET dpproxy.delta = 1e-6; "
             "SELECT COUNT(*) FROM adult", ("count",), 1, "SELECT COUNT(*) FROM adult",
             delta=1e-6),
    # constant queries read no data and cost nothing -------------------------------------------
    Accepted("constant_alias", "SELECT 1 AS one", ("one",), 1, "SELECT 1", charged=False),
    Accepted("constant_expression", "SELECT 2 * 3", ("?column?",), 1, "SELECT 6",
             charged=False),
    # GROUP BY row expressions (more in test_expression_keys.py) ------------------------------
    # over a column with public values: the keys are its image, in the order of those values
    # (ordered: `keys` only says how many leading columns are keys)
    Accepted("expr_key_lower_public", "SELECT LOWER(sex) AS s, COUNT(*) FROM adult GROUP BY 1",
             ("s", "count"), 2, "SELECT lower(sex), COUNT(*) FROM adult GROUP BY 1 ORDER BY 1",
             keys=("sex",), ordered=True),
    Accepted("expr_key_case_public",
             "SELECT CASE WHEN income = '>50K' THEN 'high' ELSE 'low' END AS band, COUNT(*) "
             "FROM adult GROUP BY band", ("band", "count"), 2,
             "SELECT CASE WHEN income = '>50K' THEN 'high' ELSE 'low' END, COUNT(*) "
             "FROM adult GROUP BY 1 ORDER BY 1 DESC", keys=("income",), ordered=True),
    # private keys (age has no public values here): partition selection charges δ; every
    # decade has at least 45 people, far above the threshold at ε = 500
    Accepted("expr_key_decade_selection",
             "SELECT age / 10 * 10, COUNT(*) FROM adult GROUP BY 1", ("?column?", "count"), 9,
             "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1 ORDER BY 1",
             keys=("age",), ordered=True, delta=1e-7),
    Accepted("expr_key_order_by_expression",
             "SELECT age / 10 * 10 AS d, COUNT(*) FROM adult GROUP BY age / 10 * 10 "
             "ORDER BY age / 10 * 10 DESC", ("d", "count"), 9,
             "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1 ORDER BY 1 DESC",
             keys=("age",), ordered=True, delta=1e-7),
    Accepted("expr_key_having_on_key",
             "SELECT age / 10 * 10 AS d, COUNT(*) FROM adult GROUP BY d HAVING d < 50",
             ("d", "count"), 4,
             "SELECT age // 10 * 10 AS d, COUNT(*) FROM adult GROUP BY 1 HAVING d < 50 "
             "ORDER BY 1", keys=("age",), ordered=True, delta=1e-7),
    # hours bins 0..3 (each with thousands of people); Δ = 99999 at ε/2 → b = 200
    Accepted("expr_key_bins_sum",
             "SELECT hours_per_week / 25 AS q, SUM(capital_gain) FROM adult GROUP BY q",
             ("q", "sum"), 4,
             "SELECT hours_per_week // 25, SUM(capital_gain) FROM adult GROUP BY 1 ORDER BY 1",
             keys=("hours_per_week",), ordered=True, tol=10_000, delta=1e-7),
    Accepted("expr_key_extract_month",
             "SELECT EXTRACT(month FROM day), COUNT(*) FROM visits "
             "GROUP BY EXTRACT(month FROM day)", ("extract", "count"), 12, table="visits",
             delta=1e-7),
    Accepted("expr_key_alias_of_extract",
             "SELECT EXTRACT(month FROM day) AS m, COUNT(*) FROM visits GROUP BY m",
             ("m", "count"), 12, table="visits", delta=1e-7),
    Accepted("expr_key_date_trunc",
             "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1",
             ("date_trunc", "count"), 12, table="visits", delta=1e-7),
    # bounds through expressions ---------------------------------------------------------------
    # Δ = 99,999 centred to 50,000 at ε/2 → b = 100, over 10,764 women → 0.01
    Accepted("avg_case_female_numeric",
             "SELECT AVG(CASE WHEN sex = 'Female' THEN capital_gain END) FROM adult", ("avg",),
             1, "SELECT AVG(CASE WHEN sex = 'Female' THEN capital_gain END) FROM adult",
             tol=1),
    Accepted("sum_least_greatest_bounds",
             "SELECT SUM(LEAST(GREATEST(hours_per_week, 20), 60)) FROM adult", ("sum",), 1,
             "SELECT SUM(LEAST(GREATEST(hours_per_week, 20), 60)) FROM adult", tol=5),
    Accepted("sum_coalesce_nullif",
             "SELECT SUM(COALESCE(NULLIF(education_num, 16), 0)) FROM adult", ("sum",), 1,
             "SELECT SUM(COALESCE(NULLIF(education_num, 16), 0)) FROM adult", tol=2),
    Accepted("sum_cast_half", "SELECT SUM(CAST(age AS DOUBLE) / 2) FROM adult", ("sum",), 1,
             "SELECT SUM(age / 2) FROM adult", tol=3),
    # the adversarial branch: bounded by the CASE union [0, 1e12], so noise of that size
    Accepted("sum_case_huge_branch",
             "SELECT SUM(CASE WHEN person_id = 7 THEN 1e12 ELSE 0 END) FROM adult", ("sum",),
             1),
]


def _check_values(case: Accepted, result: Result, expected: list[tuple[Any, ...]]) -> None:
    k = len(case.keys)
    if case.ordered:
        assert [r[:k] for r in result.rows] == [r[:k] for r in expected]
        pairs = list(zip(result.rows, expected, strict=True))
    else:
        by_key = {r[:k]: r for r in expected}
        width = len(result.columns)
        # a public key absent from the data has the exact value 0 (zeros are released)
        pairs = [(row, by_key.get(row[:k], row[:k] + (0,) * (width - k)))
                 for row in result.rows]
    for got, want in pairs:
        for g, w in zip(got[k:], want[k:], strict=True):
            if isinstance(w, str) or isinstance(g, str):
                assert g == w
            else:
                assert g is not None and abs(float(g) - float(w)) <= case.tol, (got, want)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ACCEPTED])
def test_accepted_query(case: Accepted, big_engine: Engine,
                        exact_db: duckdb.DuckDBPyConnection) -> None:
    session = big_engine.session("alice", epsilon=EPS)
    before = session.remaining()
    result = session.execute(case.sql, case.params)

    assert result.columns == case.columns
    assert len(result.rows) == case.rows
    assert result.tag == f"SELECT {case.rows}"
    after = session.remaining()
    if case.charged:
        assert result.cost is not None
        assert result.cost.epsilon == case.epsilon
        assert result.cost.delta == pytest.approx(case.delta, rel=1e-12, abs=0)
        assert after.epsilon == before.epsilon - case.epsilon
        assert after.delta == pytest.approx(before.delta - case.delta, rel=1e-12)
        assert result.remaining == after
    else:
        assert result.cost is None
        assert after == before

    if case.keys and not case.ordered:
        # without ORDER BY, groups come in the policy's order of public values
        public = [big_engine.policy.tables[case.table].columns[c].public_values
                  for c in case.keys]
        order = {combo: i for i, combo in enumerate(product(*public))}
        positions = [order[row[:len(case.keys)]] for row in result.rows]
        assert positions == sorted(positions)
    if case.exact is not None:
        _check_values(case, result, exact(exact_db, case.exact))


def test_accepted_table_is_large_and_distinct() -> None:
    assert len(ACCEPTED) >= 45
    assert len({c.id for c in ACCEPTED}) == len(ACCEPTED)
    assert len({c.sql for c in ACCEPTED}) == len(ACCEPTED)


def test_accuracy_intervals_cover_exact_values(big_engine: Engine,
                                               exact_db: duckdb.DuckDBPyConnection) -> None:
    """Each aggregate column reports its mechanism and scale, and its interval holds the
    exact value. At confidence 1 − 1e-9 each of the 6 intervals misses with probability at
    most 1e-9 (AVG's pair of statistics is covered jointly), so this fails by chance with
    probability < 6e-9; ε = 1 keeps the noise (and the intervals) far from trivial."""
    session = big_engine.session("alice", epsilon=1.0, confidence=1 - 1e-9)
    result = session.execute("SELECT sex, COUNT(*) AS n, SUM(hours_per_week) AS h, "
                             "AVG(age) AS a FROM adult GROUP BY sex")
    assert result.accuracy[0] is None  # a key: public, not noised
    n_acc, h_acc, a_acc = result.accuracy[1:]
    assert n_acc is not None and h_acc is not None and a_acc is not None
    assert (n_acc.aggregate, n_acc.mechanism) == ("COUNT(*)", "laplace")
    # three statistics share ε = 1 (AVG(age) divides by COUNT(*): age is never NULL); Δ(SUM)
    # = 99
    assert n_acc.noise_scales[0] == pytest.approx(3, rel=1e-9)
    assert h_acc.noise_scales[0] == pytest.approx(99 * 3, rel=1e-9)
    assert len(a_acc.noise_scales) == 2 and a_acc.half_width is None
    # a Laplace draw exceeds b·ln(1/(1 - c)) with probability about 1 - c
    assert n_acc.half_width is not None and n_acc.half_width >= 3 * math.log(1e9) - 1
    truth = {r[0]: r[1:] for r in exact(exact_db, "SELECT sex, COUNT(*), SUM(hours_per_week), "
                                                  "AVG(age) FROM adult GROUP BY sex")}
    for row, intervals in zip(result.rows, result.intervals, strict=True):
        assert intervals[0] is None
        for value, released, (lo, hi) in zip(truth[row[0]], row[1:], intervals[1:],
                                             strict=True):
            assert lo <= released <= hi
            assert lo - 1e-9 <= value <= hi + 1e-9


def test_monotone_outputs_of_one_aggregate_carry_its_interval(
        big_engine: Engine, exact_db: duckdb.DuckDBPyConnection) -> None:
    """ROUND(AVG(age), 1), COUNT(*) * 2 and 100 - COUNT(*) are monotone in one aggregate:
    their accuracy is that aggregate's, and their interval its interval's ends mapped
    through them (decreasing ones swapped), which holds the function of the exact value
    whenever the aggregate's holds it (each misses with probability at most 1e-9, so this
    fails by chance with probability < 6e-9). SUM / COUNT depends on two aggregates: none."""
    session = big_engine.session("alice", epsilon=1.0, confidence=1 - 1e-9)
    result = session.execute("SELECT sex, ROUND(AVG(age), 1) AS a, COUNT(*) * 2 AS c2, "
                             "100 - COUNT(*) AS d, SUM(age) / COUNT(*) AS ratio FROM adult "
                             "GROUP BY sex")
    a_acc, c2_acc, d_acc, ratio_acc = result.accuracy[1:]
    assert ratio_acc is None
    assert a_acc is not None and a_acc.aggregate == "AVG(age)" and a_acc.name == "a"
    assert c2_acc is not None and d_acc is not None and c2_acc.noise_scales == d_acc.noise_scales
    truth = {r[0]: r[1:] for r in exact(exact_db, "SELECT sex, AVG(age), COUNT(*) FROM adult "
                                                  "GROUP BY sex")}
    for row, intervals in zip(result.rows, result.intervals, strict=True):
        mean, count = truth[row[0]]
        assert intervals[4] is None
        for released, (lo, hi), exact_value in zip(
                row[1:4], intervals[1:4], (round(mean, 1), 2 * count, 100 - count),
                strict=True):
            assert lo <= released <= hi
            assert lo - 0.05 <= exact_value <= hi + 0.05  # ROUND: up to half a digit


def test_private_keys_pass_partition_selection(big_engine: Engine,
                                               exact_db: duckdb.DuckDBPyConnection) -> None:
    """age has no public values: groups are released only when their noisy count of people
    clears a threshold set by δ, so the query costs δ too. At ε = 1000 (500 for selection)
    the threshold is a handful of people, and every age has at least 3 in the demo data;
    ages with 20 or more people are certainly released (noise scale 0.002)."""
    session = big_engine.session("alice", epsilon=EPS)
    result = session.execute("SELECT age, COUNT(*) FROM adult GROUP BY age")
    assert result.columns == ("age", "count")
    assert result.cost == Cost(EPS, session.options.delta)
    truth = dict(exact(exact_db, "SELECT age, COUNT(*) FROM adult GROUP BY age"))
    ages = [row[0] for row in result.rows]
    assert ages == sorted(ages)  # key order, not the backend's (data-dependent) order
    assert set(ages) <= set(truth)
    assert {a for a, n in truth.items() if n >= 20} <= set(ages)
    for age, count in result.rows:
        assert abs(count - truth[age]) <= 1


def test_visits_sum_is_bounded_per_person(big_engine: Engine,
                                          exact_db: duckdb.DuckDBPyConnection) -> None:
    """SUM(amount) over visits keeps at most 10 visits' worth per person: each person's
    total, clamped to 10 × 500 (amounts lie in [0, 500] already). No person's visits add
    up to that much, so the released sum is the whole total up to the noise, where 10
    visits drawn at random would have lost over a million. L1 = 10 × 500 → b = 5,
    tolerance 50·b (exceeded with probability e^-50)."""
    session = big_engine.session("alice", epsilon=EPS)
    released = session.execute("SELECT SUM(amount) FROM visits").rows[0][0]
    bounded, drawn, most = exact(exact_db, """
        SELECT SUM(LEAST(list_sum(a), 10 * 500)),
               SUM(CASE WHEN len(a) <= 10 THEN list_sum(a) ELSE 10 * list_avg(a) END),
               MAX(len(a))
        FROM (SELECT list(amount) AS a FROM visits GROUP BY person_id)""")[0]
    total = one_value(exact_db, "SELECT SUM(amount) FROM visits")
    assert most > 10 and drawn < total - 1_000_000  # the row bound binds on this data
    assert bounded == pytest.approx(total, rel=1e-12)
    assert abs(released - bounded) <= 250


# -- session statements ---------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "tag", "columns", "rows"), [
    ("SET dpproxy.epsilon = 0.5", "SET", (), []),
    ("SET dpproxy.mechanism = 'gaussian'", "SET", (), []),
    ("SET application_name = 'psql'", "SET", (), []),
    ("SHOW dpproxy.epsilon", "SHOW", ("dpproxy.epsilon",), [("0.1",)]),
    ("SHOW dpproxy.mechanism", "SHOW", ("dpproxy.mechanism",), [("laplace",)]),
    ("RESET dpproxy.epsilon", "RESET", (), []),
    ("RESET ALL", "RESET", (), []),
    ("BEGIN", "BEGIN", (), []),
    ("START TRANSACTION", "START TRANSACTION", (), []),
    ("COMMIT", "COMMIT", (), []),
    ("ROLLBACK", "ROLLBACK", (), []),
    ("DISCARD ALL", "DISCARD ALL", (), []),
    ("SELECT pg_advisory_unlock_all()", "SELECT 1", ("pg_advisory_unlock_all",), [(None,)]),
])
def test_session_statement_is_answered_locally_for_free(
        alice: Session, sql: str, tag: str, columns: tuple[str, ...], rows: list) -> None:
    before = alice.remaining()
    result = alice.execute(sql)
    assert (result.tag, result.columns, result.rows) == (tag, columns, rows)
    assert result.cost is None
    assert alice.remaining() == before


def test_set_show_reset_round_trip(alice: Session) -> None:
    alice.execute("SET dpproxy.epsilon = 0.25")
    alice.execute("SET dpproxy.mechanism = 'gaussian'")
    assert alice.execute("SHOW dpproxy.epsilon").rows == [("0.25",)]
    assert alice.execute("SHOW dpproxy.mechanism").rows == [("gaussian",)]
    alice.execute("RESET dpproxy.epsilon")
    assert alice.execute("SHOW dpproxy.epsilon").rows == [("0.1",)]  # the policy's default
    assert alice.execute("SHOW dpproxy.mechanism").rows == [("gaussian",)]
    alice.execute("RESET ALL")
    assert alice.execute("SHOW dpproxy.mechanism").rows == [("laplace",)]
    alice.execute("SET application_name = 'psql'")
    assert alice.execute("SHOW application_name").rows == [("psql",)]


def test_show_budget_reflects_spending_and_is_free(alice: Session) -> None:
    alice.execute("SET dpproxy.epsilon = 0.5")
    alice.execute("SELECT COUNT(*) FROM adult")
    result = alice.execute("SHOW dpproxy.budget")
    assert result.columns[:4] == ("account", "epsilon_budget", "epsilon_spent",
                                  "epsilon_remaining")
    assert result.rows[0][:4] == ("analyst:alice", 10.0, 0.5, 9.5)
    assert alice.remaining().epsilon == 9.5


def test_explain_shows_plan_and_charges_nothing(alice: Session) -> None:
    before = alice.remaining()
    result = alice.execute("EXPLAIN SELECT occupation, SUM(hours_per_week) FROM adult "
                           "GROUP BY occupation")
    text = "\n".join(row[0] for row in result.rows)
    assert result.columns == ("QUERY PLAN",)
    assert result.cost is None
    assert alice.remaining() == before
    assert "L1 sensitivity 99" in text
    assert "Cost: ε=0.1" in text
    assert "14 group(s) released" in text
    assert "SELECT" in text and "__group_rank" in text  # the rewritten SQL
    # nothing about the data: the exact sum is nowhere in the plan
    assert "163016" not in text


def test_explain_format_json_is_the_same_plan(alice: Session) -> None:
    """EXPLAIN (FORMAT JSON, …), as pgAdmin and DBeaver send it: one json value in
    PostgreSQL's shape, [{"Plan": …}], holding the text plan's lines; charges nothing."""
    query = "SELECT occupation, SUM(hours_per_week) FROM adult GROUP BY occupation"
    before = alice.remaining()
    text = [row[0] for row in alice.execute(f"EXPLAIN {query}").rows]
    result = alice.execute(f"EXPLAIN (FORMAT JSON, ANALYZE false, COSTS true) {query}")
    assert (result.columns, result.types) == (("QUERY PLAN",), ("json",))
    (document,), = result.rows
    assert json.loads(document) == [{"Plan": {"Node Type": "DP Query",
                                              "Relation Name": "adult"}, "DP Plan": text}]
    assert alice.remaining() == before


# -- 2. rejected queries --------------------------------------------------------------------------

@dataclass(frozen=True)
class Rejected:
    id: str
    sql: str
    sqlstate: str
    message: tuple[str, ...] = ()  # substrings of the message
    hint: tuple[str, ...] = ()  # substrings of the hint
    replace: dict[str, str] = field(default_factory=dict)  # policy edits
    analyst: str = "alice"


HELP_FUNCTIONS = ("supported: ",)
ADULT_COLUMNS = "person_id, age, sex, education, education_num, hours_per_week, capital_gain"

REJECTED = [
    # writes and other statements
    Rejected("insert", "INSERT INTO adult (age) VALUES (1)", "42501", ("read-only",)),
    Rejected("update", "UPDATE adult SET age = 1", "42501", ("read-only",)),
    Rejected("delete", "DELETE FROM adult", "42501", ("read-only",)),
    Rejected("create", "CREATE TABLE x (a INT)", "42501", ("read-only",)),
    Rejected("drop", "DROP TABLE adult", "42501", ("read-only",)),
    Rejected("copy", "COPY adult TO 'out.csv'", "42501", ("read-only",)),
    # raw values
    Rejected("select_star", "SELECT * FROM adult", "42501", ("raw rows",), ("COUNT(*)",)),
    Rejected("raw_column", "SELECT age FROM adult", "42501", ("age",)),
    Rejected("column_not_grouped", "SELECT sex, COUNT(*) FROM adult", "42501", ("sex",),
             ("GROUP BY sex",)),
    Rejected("having_raw_column",
             "SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING age > 30", "42501", ("age",)),
    Rejected("order_by_raw_column", "SELECT COUNT(*) FROM adult ORDER BY age", "42501",
             ("age",)),
    # unbounded or ill-typed aggregate arguments
    Rejected("sum_unbounded", "SELECT SUM(capital_gain / (age - 40)) FROM adult", "42501",
             ("no bound",), ("LEAST(GREATEST(capital_gain / (age - 40)",)),
    Rejected("avg_unbounded", "SELECT AVG(LENGTH(occupation)) FROM adult", "42501",
             ("no bound",), ("AVG(LEAST(GREATEST(LENGTH(occupation)",)),
    Rejected("sum_half_clamped", "SELECT SUM(GREATEST(capital_gain / (age - 40), 0)) FROM adult",
             "42501", (), ("LEAST(GREATEST(",)),
    Rejected("sum_text", "SELECT SUM(sex) FROM adult", "42804", ("text",)),
    Rejected("compare_text_with_number", "SELECT COUNT(*) FROM adult WHERE sex > 3", "42804"),
    Rejected("where_not_boolean", "SELECT COUNT(*) FROM adult WHERE age", "42804",
             ("boolean",)),
    # query shapes
    Rejected("window_function", "SELECT COUNT(*) OVER () FROM adult", "0A000", ("window",)),
    Rejected("union", "SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult", "0A000",
             ("UNION",)),
    Rejected("intersect", "SELECT COUNT(*) FROM adult INTERSECT SELECT COUNT(*) FROM adult",
             "0A000", ("INTERSECT",)),
    Rejected("except", "SELECT COUNT(*) FROM adult EXCEPT SELECT COUNT(*) FROM adult", "0A000",
             ("EXCEPT",)),
    Rejected("subquery_in_from",  # one that only selects rows is merged (test_inline.py)
             "SELECT COUNT(*) FROM (SELECT age FROM adult GROUP BY age) t", "0A000",
             ("subquer",)),
    Rejected("subquery_in_where",
             "SELECT COUNT(*) FROM adult WHERE age > (SELECT AVG(age) FROM adult)", "0A000",
             ("subquer",)),
    Rejected("subquery_in_select", "SELECT COUNT(*), (SELECT 1) FROM adult", "0A000",
             ("subquer",)),
    Rejected("in_subquery",
             "SELECT COUNT(*) FROM adult WHERE person_id IN (SELECT person_id FROM visits)",
             "0A000", ("subquer",)),
    Rejected("exists", "SELECT COUNT(*) FROM adult WHERE EXISTS (SELECT 1 FROM visits)",
             "0A000", ("subquer",)),
    Rejected("cte", "WITH t AS (SELECT age, COUNT(*) AS n FROM adult GROUP BY age) "
             "SELECT SUM(n) FROM t", "0A000", ("value per age (GROUP BY age)",)),
    Rejected("join_private", "SELECT COUNT(*) FROM adult JOIN visits USING (person_id)",
             "42501", ("two private tables",), ("public",)),
    Rejected("join_self", "SELECT COUNT(*) FROM adult a JOIN adult b USING (occupation)",
             "42501", ("self-join",)),
    Rejected("join_right", "SELECT COUNT(*) FROM adult a RIGHT JOIN occupation_groups g "
             "ON a.occupation = g.occupation", "0A000", ("RIGHT JOIN",), ("LEFT JOIN",)),
    Rejected("join_on_inequality", "SELECT COUNT(*) FROM adult a JOIN occupation_groups g "
             "ON a.occupation <> g.occupation", "0A000", ("join condition",)),
    Rejected("join_ambiguous_column", "SELECT COUNT(*) FROM adult a JOIN occupation_groups g "
             "ON a.occupation = g.occupation WHERE occupation = 'Sales'", "42702",
             ("ambiguous",), ("a.occupation",)),
    Rejected("distinct", "SELECT DISTINCT sex FROM adult", "0A000", ("DISTINCT",),
             ("GROUP BY",)),
    Rejected("two_queries", "SELECT COUNT(*) FROM adult; SELECT COUNT(*) FROM adult", "0A000",
             ("several queries",)),
    Rejected("for_update", "SELECT COUNT(*) FROM adult FOR UPDATE", "0A000"),
    Rejected("negative_limit", "SELECT COUNT(*) FROM adult LIMIT -1", "0A000", ("LIMIT",)),
    Rejected("fetch_with_ties", "SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY 2 "
             "FETCH FIRST 1 ROWS WITH TIES", "0A000", ("WITH TIES",), ("LIMIT",)),
    Rejected("aggregate_filter",  # read as CASE WHEN where it can be (test_inline.py)
             "SELECT SUM(DISTINCT age) FILTER (WHERE age > 3) FROM adult", "0A000",
             ("FILTER",), ("CASE WHEN",)),
    Rejected("rollup", "SELECT COUNT(*) FROM adult GROUP BY ROLLUP (sex)", "0A000",
             ("ROLLUP are not supported",)),
    Rejected("cube", "SELECT COUNT(*) FROM adult GROUP BY sex, CUBE (income)", "0A000",
             ("ROLLUP are not supported",)),
    Rejected("grouping_sets", "SELECT COUNT(*) FROM adult GROUP BY GROUPING SETS ((sex), ())",
             "0A000", ("ROLLUP are not supported",)),
    Rejected("public_table_alone", "SELECT COUNT(*) FROM occupation_groups", "0A000",
             ("public",)),
    pytest.param(Rejected("tablesample", "SELECT COUNT(*) FROM adult TABLESAMPLE SYSTEM (10)",
                          "0A000", ("TABLESAMPLE",)), id="tablesample"),
    # GROUP BY
    Rejected("group_by_privacy_unit", "SELECT person_id, COUNT(*) FROM adult GROUP BY person_id",
             "42501", ("privacy unit",), ("COUNT(DISTINCT person_id)",)),
    Rejected("group_by_privacy_unit_position",
             "SELECT person_id, COUNT(*) FROM adult GROUP BY 1", "42501", ("privacy unit",)),
    Rejected("group_by_unit_expression", "SELECT COUNT(*) FROM adult GROUP BY person_id / 100",
             "42501", ("privacy unit person_id",), ("COUNT(DISTINCT person_id)",)),
    Rejected("group_by_expression_column_not_key",
             "SELECT age, COUNT(*) FROM adult GROUP BY age / 10", "42501", ("age",)),
    Rejected("group_by_aggregate", "SELECT SUM(age) FROM adult GROUP BY 1", "42803",
             ("GROUP BY",)),
    Rejected("group_by_volatile", "SELECT COUNT(*) FROM adult GROUP BY random()", "0A000",
             (), HELP_FUNCTIONS),
    Rejected("group_by_constant", "SELECT COUNT(*) FROM adult GROUP BY 1 + 1", "0A000",
             ("constant",)),
    Rejected("group_by_string_literal", "SELECT COUNT(*) FROM adult GROUP BY 'a'", "0A000"),
    Rejected("sum_bound_above_cap",
             "SELECT SUM(CASE WHEN person_id = 7 THEN 1e16 ELSE 0 END) FROM adult", "0A000",
             ("1e+15",), ("LEAST(GREATEST(",)),
    # names and grants
    Rejected("unknown_table", "SELECT COUNT(*) FROM nosuch", "42P01", ("nosuch",),
             ("adult",)),
    Rejected("other_schema", "SELECT COUNT(*) FROM other.adult", "42P01"),
    Rejected("unknown_column", "SELECT COUNT(nosuch) FROM adult", "42703", ("nosuch",),
             (ADULT_COLUMNS,)),
    Rejected("unknown_column_in_where", "SELECT COUNT(*) FROM adult WHERE wage > 3", "42703",
             ("wage",), (ADULT_COLUMNS,)),
    Rejected("unknown_qualifier", "SELECT COUNT(b.age) FROM adult a", "42703", ("b",)),
    Rejected("table_not_granted", "SELECT COUNT(*) FROM visits", "42501", ("visits",),
             ("adult",), replace=NO_VISITS),
    Rejected("admin_has_no_tables", "SELECT COUNT(*) FROM adult", "42501", ("adult",),
             ("none",), analyst="admin"),
    # aggregates
    Rejected("median_unbounded", "SELECT MEDIAN(capital_gain / (age - 40)) FROM adult",
             "42501", ("no bound",), ("MEDIAN(LEAST(GREATEST(capital_gain / (age - 40)",)),
    Rejected("percentile_unbounded",
             "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY LENGTH(occupation)) "
             "FROM adult", "42501", ("no bound",),
             ("WITHIN GROUP (ORDER BY LEAST(GREATEST(LENGTH(occupation)",)),
    Rejected("max_unbounded", "SELECT MAX(LENGTH(occupation)) FROM adult", "42501",
             ("no bound",), ("MAX(LEAST(GREATEST(LENGTH(occupation), 0), <upper>))",)),
    Rejected("percentile_above_one",
             "SELECT PERCENTILE_CONT(1.5) WITHIN GROUP (ORDER BY age) FROM adult", "22023",
             ("1.5", "between 0 and 1")),
    Rejected("percentile_negative",
             "SELECT PERCENTILE_CONT(-0.1) WITHIN GROUP (ORDER BY age) FROM adult", "22023",
             ("between 0 and 1",)),
    Rejected("percentile_not_constant",
             "SELECT PERCENTILE_CONT(age) WITHIN GROUP (ORDER BY age) FROM adult", "0A000",
             ("constant",)),
    Rejected("percentile_without_within_group", "SELECT PERCENTILE_CONT(0.5) FROM adult",
             "0A000", ("WITHIN GROUP",)),
    Rejected("percentile_two_order_keys",
             "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age, hours_per_week) "
             "FROM adult", "0A000", ("one ORDER BY",)),
    Rejected("percentile_disc",
             "SELECT PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY age) FROM adult", "0A000",
             ("PERCENTILE_DISC",), ("PERCENTILE_CONT",)),
    Rejected("median_of_text", "SELECT MEDIAN(occupation) FROM adult", "42804",
             ("MEDIAN needs a number", "text")),
    # (day + 1 has day's bounds, a day later; a decade's start, none)
    Rejected("min_of_date_unbounded", "SELECT MIN(DATE_TRUNC('decade', day)) FROM visits",
             "42501", ("no bound",), ("LEAST(GREATEST(DATE_TRUNC('DECADE', day), DATE",)),
    Rejected("median_distinct", "SELECT MEDIAN(DISTINCT age) FROM adult", "0A000",
             ("DISTINCT",)),
    Rejected("stddev_distinct", "SELECT STDDEV(DISTINCT age) FROM adult", "0A000",
             ("STDDEV_SAMP(DISTINCT",)),
    Rejected("variance_unbounded", "SELECT VARIANCE(capital_gain / (age - 40)) FROM adult",
             "42501", ("no bound",), ("VAR_SAMP(LEAST(GREATEST(capital_gain / (age - 40)",)),
    # named as written (STRING_AGG, BOOL_OR, AGE), not as sqlglot's nodes (GROUP_CONCAT,
    # LOGICAL_OR, ANONYMOUS)
    # the query's shape, not its data, exhausts Python's recursion: 54000, not a crash
    Rejected("nested_too_deeply", "SELECT COUNT(*) FROM adult WHERE "
             + " AND ".join(f"age <> {i}" for i in range(750)), "54000",
             ("nested too deeply",), ("IN (…)",)),
    Rejected("cast_char_length", "SELECT COUNT(*) FROM adult WHERE CAST(age AS CHAR(10485760)) "
             "= '3'", "0A000", ("text casts take no length",), ("CAST(x AS TEXT)",)),
    Rejected("ignore_nulls", "SELECT SUM(age IGNORE NULLS) FROM adult", "0A000",
             ("IGNORE NULLS and RESPECT NULLS are not supported",), ("write SUM(x)",)),
    Rejected("count_two_arguments", "SELECT COUNT(age, sex) FROM adult", "0A000",
             ("COUNT with more than one argument",)),
    Rejected("round_truncate", "SELECT SUM(ROUND(age, 0, 1)) FROM adult", "0A000",
             ("ROUND with a third argument",)),
    Rejected("string_agg", "SELECT STRING_AGG(sex, ',') FROM adult", "42501",
             ("STRING_AGG returns values of the rows",), ("COUNT(*)",)),
    Rejected("array_agg", "SELECT sex, ARRAY_AGG(age) FROM adult GROUP BY sex", "42501",
             ("ARRAY_AGG returns values of the rows",)),
    Rejected("bool_or", "SELECT BOOL_OR(age > 80) FROM adult", "0A000",
             ("aggregate BOOL_OR is not supported",), ("COUNT(*) FILTER (WHERE",)),
    Rejected("age_function", "SELECT COUNT(*) FROM visits WHERE AGE(day) > INTERVAL '1 year'",
             "0A000", ("AGE is not supported in a row expression",)),
    Rejected("count_distinct_two_columns", "SELECT COUNT(DISTINCT age, sex) FROM adult",
             "0A000", ("takes one expression",)),
    Rejected("count_distinct_with_quantile",
             "SELECT COUNT(DISTINCT age), MEDIAN(hours_per_week) FROM adult", "0A000",
             ("quantile",), ("two queries",)),
    Rejected("count_distinct_unbounded_type", "SELECT COUNT(DISTINCT RANDOM()) FROM adult",
             "0A000"),
    Rejected("sum_distinct", "SELECT SUM(DISTINCT age) FROM adult", "0A000"),
    # named as written, not as sqlglot's node (TIME_TO_STR)
    Rejected("to_char_of_a_count", "SELECT TO_CHAR(COUNT(*), '999G999') FROM adult", "0A000",
             ("TO_CHAR is not supported on query outputs",)),
    Rejected("nested_aggregates", "SELECT SUM(COUNT(*)) FROM adult", "42803"),
    Rejected("aggregate_in_where", "SELECT COUNT(*) FROM adult WHERE COUNT(*) > 1", "42803"),
    # functions outside the allowlist (non-deterministic, side effects, file access)
    Rejected("random_in_where", "SELECT COUNT(*) FROM adult WHERE random() > 0.5", "0A000",
             (), HELP_FUNCTIONS),
    # now() is bound to the statement's clock (tests/test_clock.py); this one moves per row
    Rejected("clock_timestamp_in_where",
             "SELECT COUNT(*) FROM adult WHERE clock_timestamp() > DATE '2020-01-01'",
             "0A000", (), HELP_FUNCTIONS),
    Rejected("read_csv", "SELECT COUNT(*) FROM read_csv('x')", "0A000"),
    Rejected("read_csv_in_where",
             "SELECT COUNT(*) FROM adult WHERE age IN (SELECT 1 FROM read_csv('x'))", "0A000"),
    Rejected("current_setting", "SELECT COUNT(*) FROM adult WHERE current_setting('x') = 'a'",
             "0A000", (), HELP_FUNCTIONS),
    Rejected("pg_sleep", "SELECT COUNT(*) FROM adult WHERE pg_sleep(1) IS NULL", "0A000"),
    Rejected("md5", "SELECT COUNT(*) FROM adult WHERE md5(sex) = 'x'", "0A000"),
    # ~ with a pattern both backends read alike is accepted (tests/test_regex.py)
    Rejected("regex_class_escape", "SELECT COUNT(*) FROM adult WHERE sex ~ '\\w'", "0A000",
             ("read differently",)),
    # syntax
    Rejected("unbalanced_parenthesis", "SELECT COUNT(* FROM adult", "42601"),
    Rejected("misspelled_keyword", "SELEC COUNT(*) FROM adult", "42601"),
    Rejected("missing_table_name", "SELECT COUNT(*) FROM WHERE age > 3", "42601"),
    # EXPLAIN and options
    Rejected("explain_analyze", "EXPLAIN ANALYZE SELECT COUNT(*) FROM adult", "0A000",
             ("ANALYZE",)),
    Rejected("explain_of_rejected_query", "EXPLAIN SELECT age FROM adult", "42501"),
    Rejected("explain_analyze_option", "EXPLAIN (FORMAT JSON, ANALYZE) SELECT COUNT(*) "
             "FROM adult", "0A000", ("ANALYZE",)),
    Rejected("explain_format_xml", "EXPLAIN (FORMAT XML) SELECT COUNT(*) FROM adult",
             "0A000", ("XML",), ("FORMAT JSON",)),
    Rejected("set_negative_epsilon", "SET dpproxy.epsilon = -1", "22023", ("epsilon",)),
    Rejected("set_zero_epsilon", "SET dpproxy.epsilon = 0", "22023", ("epsilon",)),
    Rejected("set_text_epsilon", "SET dpproxy.epsilon = 'abc'", "22023", ("epsilon",)),
    Rejected("set_unknown_mechanism", "SET dpproxy.mechanism = 'foo'", "22023", ("foo",),
             ("laplace",)),
    Rejected("set_delta_above_one", "SET dpproxy.delta = 2", "22023", ("delta",)),
    Rejected("set_confidence_out_of_range", "SET dpproxy.confidence = 1.5", "22023"),
    Rejected("set_unknown_option", "SET dpproxy.nosuch = 1", "42704", ("nosuch",),
             ("epsilon",)),
    Rejected("show_unknown", "SHOW nosuch", "42704", ("nosuch",), ("dpproxy.epsilon",)),
    # budget: alice has ε = 10 in the demo policy
    Rejected("over_budget", "SET dpproxy.epsilon = 11; SELECT COUNT(*) FROM adult", "53400",
             ("remaining ε=10",), ("epsilon",)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) if isinstance(c, Rejected) else c
                                  for c in REJECTED])
def test_rejected_query(case: Rejected, make_policy: Any) -> None:
    with Engine.from_path(make_policy(replace=case.replace)) as engine:
        session = engine.session(case.analyst)
        watch = engine.session("alice")  # admin has no budget account: watch alice's
        before = watch.remaining()
        options = session.options
        with pytest.raises(errors.Error) as caught:
            session.execute(case.sql)
        err = caught.value
        assert err.sqlstate == case.sqlstate, str(err)
        for part in case.message:
            assert part in err.message
        for part in case.hint:
            assert err.hint is not None and part in err.hint
        if case.sqlstate == "42601":
            assert err.position is not None and 1 <= err.position <= len(case.sql)
        assert watch.remaining() == before  # nothing charged
        assert engine.ledger.history() == []
        if case.sqlstate != "53400":  # (the SET before the over-budget query did apply)
            assert session.options == options


def test_rejected_table_is_large_and_distinct() -> None:
    cases = [c if isinstance(c, Rejected) else c.values[0] for c in REJECTED]
    assert len(cases) >= 45
    assert len({c.id for c in cases}) == len(cases)
    assert len({(c.sql, c.analyst, tuple(c.replace)) for c in cases}) == len(cases)


def test_syntax_error_position_points_at_the_offending_token(alice: Session) -> None:
    sql = "SELECT COUNT(* FROM adult"
    with pytest.raises(errors.SyntaxError) as caught:
        alice.execute(sql)
    assert caught.value.position == sql.index("FROM") + 1


# -- 3. privacy behaviours ------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "exact_sql", "tol"), [
    # a zero divisor for everyone aged 40 (NULL, skipped by GREATEST) → clamped to [-1, 1]
    ("SELECT SUM(LEAST(GREATEST(1 / (age - 40), -1), 1)) FROM adult",
     "SELECT SUM(LEAST(GREATEST(TRUNC(1 / NULLIF(age - 40, 0)), -1), 1)) FROM adult", 1),
    # the cast fails on every non-NULL row: TRY_CAST gives NULL, nobody matches
    ("SELECT COUNT(*) FROM adult WHERE CAST(occupation AS INT) > 0", "SELECT 0", 1),
    # 99999⁴ ≈ 1e20 overflows int64; computed in DOUBLE it does not
    ("SELECT COUNT(*) FROM adult WHERE "
     "capital_gain * capital_gain * capital_gain * capital_gain > 0",
     "SELECT COUNT(*) FROM adult WHERE capital_gain > 0", 1),
    # modulo by zero on every row: NULL, nobody matches
    ("SELECT COUNT(*) FROM adult WHERE hours_per_week % (age - age) = 0", "SELECT 0", 1),
    ("SELECT SUM(LEAST(GREATEST(hours_per_week / (age - age), 0), 10)) FROM adult",
     "SELECT 0", 1),
])
def test_data_dependent_failures_are_made_total(big_engine: Engine,
                                                exact_db: duckdb.DuckDBPyConnection,
                                                sql: str, exact_sql: str, tol: float) -> None:
    """Expressions that would raise on some rows (division by zero, failed casts, integer
    overflow) run to completion, so whether a query fails never depends on the data."""
    session = big_engine.session("alice", epsilon=EPS)
    result = session.execute(sql)
    assert result.cost is not None and result.cost.epsilon == EPS
    assert abs(result.rows[0][0] - one_value(exact_db, exact_sql)) <= tol


@pytest.mark.parametrize(("table", "predicate"), [
    ("adult", "age > 'abc'"),
    ("adult", "age IN ('abc')"),
    ("visits", "day > '2024-13-45'"),
])
def test_error_outcome_does_not_reveal_membership(big_engine: Engine, table: str,
                                                  predicate: str) -> None:
    session = big_engine.session("alice")
    outcomes = []
    for person in (1, -1):  # person 1 exists in the demo data, person -1 does not
        try:
            session.execute(f"SELECT COUNT(*) FROM {table} WHERE person_id = {person} "
                            f"AND {predicate}")
            outcomes.append("answered")
        except errors.Error as exc:
            outcomes.append(exc.sqlstate)
    assert outcomes[0] == outcomes[1]


def test_date_literal_with_a_zone_reads_as_the_date(alice: Session) -> None:
    """'2024-06-01 +00' (as pgjdbc binds a java.sql.Date) compares as the date itself: the
    same plan and statement as '2024-06-01', whether written as text, DATE '…' or CAST;
    text that is no date is refused (22P02, as PostgreSQL does), uncharged."""
    sql = "EXPLAIN SELECT COUNT(*) FROM visits WHERE day >= {}"
    plain = alice.execute(sql.format("'2024-06-01'")).rows
    # DATE '…' and CAST too: DuckDB's TRY_CAST would otherwise read these as NULL, no rows
    for literal in ("'2024-06-01 +00'", "DATE '2024-06-01 +00'", "CAST('20240601' AS DATE)",
                    "DATE '2024-06-01 10:30'"):
        assert alice.execute(sql.format(literal)).rows == plain, literal
    before = alice.remaining()
    for literal in ("'2024-06-01 junk'", "DATE '2024-13-01'"):
        with pytest.raises(errors.Error) as caught:
            alice.execute(f"SELECT COUNT(*) FROM visits WHERE day >= {literal}")
        assert caught.value.sqlstate == "22P02" and alice.remaining() == before


def test_invalid_numeric_literal_is_rejected_before_charging(alice: Session) -> None:
    before = alice.remaining()
    with pytest.raises(errors.Error) as caught:
        alice.execute("SELECT COUNT(*) FROM adult WHERE age > 'abc'")
    assert caught.value.sqlstate in ("22P02", "42804")
    assert alice.remaining() == before


@pytest.mark.parametrize("sql", [
    pytest.param("SELECT COUNT(*) FROM adult WHERE SUBSTRING(education, 1, 2) = 'HS'",
                 id="substring_constant_arguments"),
    pytest.param("SELECT COUNT(*) FROM visits WHERE day + 1 > DATE '2024-12-31'",
                 id="date_plus_constant"),
    pytest.param("SELECT COUNT(*) FROM adult WHERE SUBSTRING(education, age - 16, 2) = 'HS'",
                 id="substring_column_argument"),
    pytest.param("SELECT COUNT(*) FROM visits "
                 "WHERE day + CAST(amount AS INT) > DATE '2024-06-01'",
                 id="date_plus_column"),
    pytest.param("SELECT COUNT(*) FROM visits WHERE DATE_TRUNC('fortnight', day) = day",
                 id="date_trunc_unknown_unit"),
])
def test_accepted_row_expression_never_fails_after_charging(alice: Session, sql: str) -> None:
    """A query is either rejected before the charge or answered: a backend failure after the
    charge costs budget for nothing."""
    before = alice.remaining()
    try:
        alice.execute(sql)
    except errors.Error as exc:
        assert exc.sqlstate != "58000", "failed in the backend after the charge"
        assert alice.remaining() == before


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE CAST(capital_gain / (age - 40) AS INT) > 0",
    "SELECT COUNT(*) FROM adult WHERE CAST(LENGTH(occupation) AS INT) > 5",
])
def test_cast_of_unbounded_expression_to_int(alice: Session, sql: str) -> None:
    result = alice.execute(sql)
    assert len(result.rows) == 1


def test_cast_of_integer_column_to_text(big_engine: Engine,
                                        exact_db: duckdb.DuckDBPyConnection) -> None:
    session = big_engine.session("alice", epsilon=EPS)
    released = session.execute("SELECT COUNT(*) FROM adult "
                                "WHERE CAST(age AS TEXT) = '39'").rows[0][0]
    assert abs(released - one_value(exact_db, "SELECT COUNT(*) FROM adult WHERE age = 39")) <= 1


def test_public_keys_released_in_full_in_policy_order(big_engine: Engine) -> None:
    """Every public occupation is released, zeros included and in the policy's order, even
    when WHERE keeps a single one: the row set says nothing about the data."""
    session = big_engine.session("alice", epsilon=EPS)
    result = session.execute("SELECT occupation, COUNT(*) FROM adult "
                             "WHERE occupation = 'Armed-Forces' GROUP BY occupation")
    public = big_engine.policy.tables["adult"].columns["occupation"].public_values
    assert public is not None and len(public) == 14
    assert [row[0] for row in result.rows] == list(public)
    for occupation, count in result.rows:
        # 9 people are in the Armed Forces (demo data); b = 0.001 here, tolerance 1
        assert abs(count - (9 if occupation == "Armed-Forces" else 0)) <= 1


def test_keys_outside_public_list_are_dropped(big_engine: Engine) -> None:
    session = big_engine.session("alice", epsilon=EPS)
    result = session.execute("SELECT occupation, COUNT(*) FROM adult "
                             "WHERE occupation IS NULL GROUP BY occupation")
    assert len(result.rows) == 14
    assert None not in [row[0] for row in result.rows]
    assert all(abs(count) <= 1 for _, count in result.rows)  # the 1,843 NULLs: dropped


def test_noise_is_added(alice: Session, exact_db: duckdb.DuckDBPyConnection) -> None:
    """Five queries with the same exact answer (32,561), at the default ε = 0.1: discrete
    Laplace of scale t = 10. One draw is exactly 0 with probability tanh(1/(2t)) < 0.05,
    so all five noisy answers equal the exact one with probability < 0.05^5 ≈ 3e-7, and all
    five are equal to each other with probability < 0.05^4 ≈ 6e-6. Each is within 50·t of
    the truth (failure < 5·4e-22). The texts differ so no cache of released answers can
    return the same draw."""
    queries = ["SELECT COUNT(*) FROM adult", "SELECT COUNT(*) FROM adult WHERE age >= 17",
               "SELECT COUNT(*) FROM adult WHERE age <= 90",
               "SELECT COUNT(*) FROM adult WHERE hours_per_week > 0",
               "SELECT COUNT(*) AS n FROM adult"]
    truth = one_value(exact_db, "SELECT COUNT(*) FROM adult")
    answers = [alice.execute(q).rows[0][0] for q in queries]
    assert all(abs(a - truth) <= 500 for a in answers)
    assert any(a != truth for a in answers)
    assert len(set(answers)) > 1
    assert alice.remaining().epsilon == pytest.approx(10 - 5 * 0.1, abs=1e-12)


def test_repeated_query_returns_cached_answer_for_free(alice: Session) -> None:
    sql = "SELECT occupation, SUM(hours_per_week) FROM adult GROUP BY occupation"
    first = alice.execute(sql)
    spent = alice.remaining()
    second = alice.execute(sql)
    assert second.rows == first.rows
    assert alice.remaining() == spent


def test_budget_is_spent_exactly_and_refused_when_short(alice: Session) -> None:
    alice.execute("SET dpproxy.epsilon = 0.5")
    for k in range(1, 5):
        result = alice.execute(f"SELECT COUNT(*) FROM adult WHERE age > {20 + k}")
        assert result.cost == Cost(0.5, 0.0)
        assert alice.remaining().epsilon == 10 - 0.5 * k  # exact (decimal ledger)
    alice.execute("SET dpproxy.epsilon = 9")
    with pytest.raises(errors.BudgetExceeded) as caught:
        alice.execute("SELECT COUNT(*) FROM adult WHERE age > 60")
    assert caught.value.sqlstate == "53400"
    assert "remaining ε=8," in caught.value.message
    assert alice.remaining().epsilon == 8.0  # the refused query cost nothing
    alice.execute("SET dpproxy.epsilon = 8")
    alice.execute("SELECT COUNT(*) FROM adult WHERE age > 61")  # fits exactly
    assert alice.remaining().epsilon == 0.0
    alice.execute("SET dpproxy.epsilon = 0.001")
    with pytest.raises(errors.BudgetExceeded) as caught:
        alice.execute("SELECT COUNT(*) FROM adult WHERE age > 62")
    assert "remaining ε=0," in caught.value.message


def test_audit_log_has_one_line_per_statement_and_no_exact_values(
        engine: Engine, alice: Session, exact_db: duckdb.DuckDBPyConnection) -> None:
    statements = [
        ("SELECT SUM(capital_gain) FROM adult", "released"),
        ("SELECT age FROM adult", "rejected"),
        ("EXPLAIN SELECT SUM(hours_per_week) FROM adult", "answered"),
        ("SELECT 1 AS one", "answered"),
        ("SELECT COUNT(* FROM adult", "rejected"),
        ("SELECT SUM(hours_per_week) FROM adult GROUP BY sex", "released"),
    ]
    for sql, _ in statements:
        with contextlib.suppress(errors.Error):
            alice.execute(sql)
    path = engine.policy.audit_log_path
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(statements)
    records = [json.loads(line) for line in lines]
    for record, (sql, outcome) in zip(records, statements, strict=True):
        assert record["analyst"] == "alice"
        assert record["outcome"] == outcome
        assert record["statement"].replace(" ", "") in sql.replace(" ", "") or \
            sql.replace(" ", "") in record["statement"].replace(" ", "")
        assert "at" in record
    assert records[0]["epsilon"] == 0.1 and records[1]["sqlstate"] == "42501"
    assert records[4]["sqlstate"] == "42601"
    text = path.read_text(encoding="utf-8")
    secrets = [one_value(exact_db, "SELECT SUM(capital_gain) FROM adult")]
    secrets += [v for _, v in exact(exact_db, "SELECT sex, SUM(hours_per_week) FROM adult "
                                              "GROUP BY sex")]
    for value in secrets:
        assert value > 100_000 and str(value) not in text


def test_session_statements_are_audited(engine: Engine, alice: Session) -> None:
    for sql in ("SET dpproxy.epsilon = 0.5", "SHOW dpproxy.epsilon", "BEGIN", "COMMIT"):
        alice.execute(sql)
    path = engine.policy.audit_log_path
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    assert len(lines) == 4


def test_gaussian_mechanism_uses_l2_and_charges_delta(big_engine: Engine,
                                                      exact_db: duckdb.DuckDBPyConnection
                                                      ) -> None:
    session = big_engine.session("alice", epsilon=EPS, mechanism="gaussian", delta=1e-6)
    result = session.execute("SELECT SUM(hours_per_week) FROM adult")
    accuracy = result.accuracy[0]
    assert accuracy is not None and accuracy.mechanism == "gaussian"
    assert result.cost == Cost(EPS, 1e-6)
    # σ is a fraction of Δ = 99 at ε = 1000: 50σ is far below the tolerance
    sigma = accuracy.noise_scales[0]
    assert 0 < sigma < 99
    truth = one_value(exact_db, "SELECT SUM(hours_per_week) FROM adult")
    assert abs(result.rows[0][0] - truth) <= 50 * sigma + 1
    assert not math.isnan(sigma)


def test_two_engines_on_one_database_file(make_policy: Any) -> None:
    with Engine.from_path(make_policy()) as first, Engine.from_path(make_policy()) as second:
        for engine in (first, second):
            result = engine.session("alice").execute("SELECT COUNT(*) FROM adult")
            assert len(result.rows) == 1
