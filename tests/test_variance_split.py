"""VAR_POP / VAR_SAMP / STDDEV_POP / STDDEV_SAMP, the per-aggregate budget split
(`SET dpproxy.split`), and COUNT(DISTINCT …): accepted and rejected queries on both
backends, plan-level sensitivities and scales, EXPLAIN, post-processing into range, and
accuracy on a million generated rows.

Noise and tolerances. The table-driven cases run at ε = 1000 (`EPS`), as in
test_queries.py: every tolerance is at least 50 Laplace scales of the statistics
involved, propagated to first order through var = S2/n − (S1/n)² (|Δvar| ≤ (ΔS2 + 2h·ΔS1 +
2h²·Δn)/n, h the half-range; Δstddev ≈ Δvar / 2·stddev), with the numbers given per
case. A (discrete) Laplace draw exceeds 50 scales with probability < 2e-22. Tests that
need visible noise state their false-failure probability where they assert.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dpproxy import errors
from dpproxy.analyze import Analysis, analyze
from dpproxy.analyze.aggregates import RULES, combine, interval
from dpproxy.parse import parse_statements
from dpproxy.plan import (
    QueryOptions,
    QueryPlan,
    aggregate_epsilons,
    budget_fractions,
    parse_split,
    plan_query,
)
from dpproxy.policy import Policy, load_policy
from dpproxy.release import release
from dpproxy.session import Engine
from tests.test_queries import (
    BIG_BUDGET,
    EPS,
    Accepted,
    Rejected,
    _check_values,
    exact,
    exact_db,  # noqa: F401  (a fixture, used by name)
)

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


@pytest.fixture
def big_engine(make_policy: Any) -> Iterator[Engine]:
    with Engine.from_path(make_policy(replace=BIG_BUDGET)) as eng:
        yield eng


# -- 1. accepted queries ------------------------------------------------------------------------

ACCEPTED = [
    # VAR/STDDEV on adult (32,561 rows, one per person). age ∈ [17, 90]: h = 36.5; at ε/3
    # each, b(S1) = 0.11, b(S2) = 4.0, b(n) = 0.003: |Δvar| ≤ (200 + 73·5.5)/32561 = 0.02
    Accepted("var_pop", "SELECT VAR_POP(age) FROM adult", ("var_pop",), 1,
             "SELECT VAR_POP(age) FROM adult", tol=0.05),
    Accepted("var_samp", "SELECT VAR_SAMP(age) FROM adult", ("var_samp",), 1,
             "SELECT VAR_SAMP(age) FROM adult", tol=0.05),
    # stddev ≈ 13.7: |Δ| ≤ 0.02 / 27
    Accepted("stddev_pop", "SELECT STDDEV_POP(age) FROM adult", ("stddev_pop",), 1,
             "SELECT STDDEV_POP(age) FROM adult", tol=0.01),
    # hours_per_week ∈ [1, 99], h = 49: b(S1) = 0.15, b(S2) = 7.2 → |Δvar| ≤ 0.04
    Accepted("stddev_samp", "SELECT STDDEV_SAMP(hours_per_week) FROM adult", ("stddev_samp",),
             1, "SELECT STDDEV_SAMP(hours_per_week) FROM adult", tol=0.01),
    # VARIANCE is VAR_SAMP in PostgreSQL (sqlglot names the column var_samp)
    Accepted("variance_alias", "SELECT VARIANCE(hours_per_week) FROM adult", ("var_samp",), 1,
             "SELECT VAR_SAMP(hours_per_week) FROM adult", tol=0.1),
    # STDDEV is STDDEV_SAMP; education_num ∈ [1, 16], h = 7.5: b(S1) = 0.02, b(S2) = 0.17
    Accepted("stddev_alias", "SELECT STDDEV(education_num) AS sd FROM adult", ("sd",), 1,
             "SELECT STDDEV_SAMP(education_num) FROM adult", tol=0.01),
    # groups of ~10,000 and ~22,000: 3× the error of the whole table
    Accepted("var_pop_grouped", "SELECT sex, VAR_POP(age) AS v FROM adult GROUP BY sex",
             ("sex", "v"), 2, "SELECT sex, VAR_POP(age) FROM adult GROUP BY sex", tol=0.1,
             keys=("sex",)),
    # smallest group ~1,200 rows: |Δvar| ≤ (360 + 98·7.4)/1200 < 1, Δsd < 1/(2·10)
    Accepted("stddev_two_keys",
             "SELECT sex, income, STDDEV_POP(hours_per_week) FROM adult GROUP BY sex, income",
             ("sex", "income", "stddev_pop"), 4,
             "SELECT sex, income, STDDEV_POP(hours_per_week) FROM adult GROUP BY sex, income",
             tol=0.1, keys=("sex", "income")),
    Accepted("var_samp_where", "SELECT VAR_SAMP(age) FROM adult WHERE sex = 'Female'",
             ("var_samp",), 1, "SELECT VAR_SAMP(age) FROM adult WHERE sex = 'Female'", tol=0.1),
    # NULL for men: the variance of the 10,764 women's ages
    Accepted("var_samp_case_nulls",
             "SELECT VAR_SAMP(CASE WHEN sex = 'Female' THEN age END) FROM adult",
             ("var_samp",), 1,
             "SELECT VAR_SAMP(CASE WHEN sex = 'Female' THEN age END) FROM adult", tol=0.1),
    # bounds [52, 5148], h = 2548: b(S1) = 7.6, b(S2) = 19477 →
    # |Δvar| ≤ (974k + 2·2548·380)/32561 = 90, on a variance of ~370,000
    Accepted("var_pop_expression", "SELECT VAR_POP(hours_per_week * 52) FROM adult",
             ("var_pop",), 1, "SELECT VAR_POP(hours_per_week * 52) FROM adult", tol=100),
    # clamped by the analyst to [0, 1000], h = 500: b(S1) = 1.5, b(S2) = 750 → |Δvar| ≤ 3.5
    Accepted("var_pop_clamped",
             "SELECT VAR_POP(LEAST(GREATEST(capital_gain, 0), 1000)) FROM adult", ("var_pop",),
             1, "SELECT VAR_POP(LEAST(GREATEST(capital_gain, 0), 1000)) FROM adult", tol=5),
    # AVG and VAR_POP of one column share the centred sum and the count: 3 statistics
    Accepted("avg_and_var_share_statistics", "SELECT AVG(age), VAR_POP(age) FROM adult",
             ("avg", "var_pop"), 1, "SELECT AVG(age), VAR_POP(age) FROM adult", tol=0.05),
    Accepted("stddev_post_processed", "SELECT ROUND(STDDEV_POP(age), 1) AS sd FROM adult",
             ("sd",), 1, "SELECT ROUND(STDDEV_POP(age), 1) FROM adult", tol=0.11),
    Accepted("variance_in_having",
             "SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING VAR_POP(age) > 1",
             ("sex", "count"), 2, "SELECT sex, COUNT(*) FROM adult GROUP BY sex",
             keys=("sex",)),
    # a constant argument: h = 0, so the variance is exactly 0 after post-processing
    Accepted("var_pop_constant", "SELECT VAR_POP(age * 0 + 5) FROM adult", ("var_pop",), 1,
             "SELECT 0.0", tol=0.0),
    # visits: user-level bounding keeps ≤ 10 rows' worth per person, which plain SQL
    # does not compute; the shape and the charge are checked
    Accepted("visits_var_pop", "SELECT VAR_POP(amount) FROM visits", ("var_pop",), 1,
             table="visits"),
    Accepted("visits_stddev_where",
             "SELECT STDDEV_SAMP(amount) FROM visits WHERE day >= DATE '2024-07-01'",
             ("stddev_samp",), 1, table="visits"),
    # the budget split: the total charged (ε = EPS) never changes -------------------------
    # COUNT gets 250 (b = 0.004), SUM 750 (b = 99/750 = 0.13)
    Accepted("split_count_sum",
             "SET dpproxy.split = '1,3'; SELECT COUNT(*), SUM(hours_per_week) FROM adult",
             ("count", "sum"), 1, "SELECT COUNT(*), SUM(hours_per_week) FROM adult", tol=7),
    # AVG weight 2 over (S1, n), STDDEV weight 1 over (S1, n, S2): S2 gets ε/9, b = 12
    Accepted("split_avg_stddev",
             "SET dpproxy.split = '2,1'; SELECT AVG(age), STDDEV_POP(age) FROM adult",
             ("avg", "stddev_pop"), 1, "SELECT AVG(age), STDDEV_POP(age) FROM adult",
             tol=0.05),
    Accepted("split_gaussian",
             "SET dpproxy.mechanism = 'gaussian'; SET dpproxy.delta = 1e-6; "
             "SET dpproxy.split = '1,4'; SELECT COUNT(*), AVG(age) FROM adult",
             ("count", "avg"), 1, "SELECT COUNT(*), AVG(age) FROM adult", tol=1, delta=1e-6),
    Accepted("split_grouped",
             "SET dpproxy.split = '1,1,2'; SELECT sex, COUNT(*), SUM(hours_per_week), AVG(age) "
             "FROM adult GROUP BY sex", ("sex", "count", "sum", "avg"), 2,
             "SELECT sex, COUNT(*), SUM(hours_per_week), AVG(age) FROM adult GROUP BY sex",
             tol=10, keys=("sex",)),
    # the aggregates in HAVING count: COUNT(*) first, then SUM(hours_per_week)
    Accepted("split_counts_having_aggregates",
             "SET dpproxy.split = '3,1'; SELECT sex, COUNT(*) FROM adult GROUP BY sex "
             "HAVING SUM(hours_per_week) > 0", ("sex", "count"), 2,
             "SELECT sex, COUNT(*) FROM adult GROUP BY sex", keys=("sex",)),
    # a list value, as PostgreSQL writes one for settings
    Accepted("split_unquoted_list",
             "SET dpproxy.split = 1, 3; SELECT COUNT(*), SUM(education_num) FROM adult",
             ("count", "sum"), 1, "SELECT COUNT(*), SUM(education_num) FROM adult", tol=2),
    Accepted("split_reset", "SET dpproxy.split = '1,2'; RESET dpproxy.split; "
             "SELECT COUNT(*) FROM adult", ("count",), 1, "SELECT COUNT(*) FROM adult"),
    Accepted("split_even_word", "SET dpproxy.split = 'even'; SELECT COUNT(*), AVG(age) "
             "FROM adult", ("count", "avg"), 1, "SELECT COUNT(*), AVG(age) FROM adult"),
    Accepted("split_single_number", "SET dpproxy.split = 5; SELECT COUNT(*) FROM adult",
             ("count",), 1, "SELECT COUNT(*) FROM adult"),
    # COUNT(DISTINCT <privacy unit>) ------------------------------------------------------------
    Accepted("count_distinct_unit_grouped",
             "SELECT sex, COUNT(DISTINCT person_id) AS people FROM adult GROUP BY sex",
             ("sex", "people"), 2, "SELECT sex, COUNT(DISTINCT person_id) FROM adult GROUP BY sex",
             keys=("sex",)),
    # every person with a matching visit keeps at least one row, so bounding loses no one
    Accepted("visits_count_distinct_where",
             "SELECT COUNT(DISTINCT person_id) FROM visits WHERE amount > 100", ("count",), 1,
             "SELECT COUNT(DISTINCT person_id) FROM visits WHERE amount > 100",
             table="visits"),
    Accepted("count_distinct_unit_with_variance",
             "SELECT COUNT(DISTINCT person_id), STDDEV_POP(age) FROM adult",
             ("count", "stddev_pop"), 1,
             "SELECT COUNT(DISTINCT person_id), STDDEV_POP(age) FROM adult", tol=1),
]


SPREADS = {"var_pop", "var_samp", "stddev_pop", "stddev_samp", "sd", "v"}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in ACCEPTED])
def test_accepted_query(case: Accepted, big_engine: Engine,
                        exact_db: duckdb.DuckDBPyConnection) -> None:  # noqa: F811
    session = big_engine.session("alice", epsilon=EPS)
    before = session.remaining()
    result = session.execute(case.sql, case.params)
    assert result.columns == case.columns
    assert len(result.rows) == case.rows
    assert result.cost is not None
    assert result.cost.epsilon == case.epsilon
    assert result.cost.delta == pytest.approx(case.delta, rel=1e-12, abs=0)
    after = session.remaining()
    assert after.epsilon == before.epsilon - case.epsilon
    for row in result.rows:
        for name, value in zip(result.columns, row, strict=True):
            if name in SPREADS:  # float8, post-processed into [0, …]
                assert isinstance(value, float) and value >= 0
    if case.exact is not None:
        _check_values(case, result, exact(exact_db, case.exact))


def test_accepted_table_is_large_and_distinct() -> None:
    assert len(ACCEPTED) >= 25
    assert len({c.id for c in ACCEPTED}) == len(ACCEPTED)
    assert len({c.sql for c in ACCEPTED}) == len(ACCEPTED)


# -- 2. rejected queries ------------------------------------------------------------------------

SPLIT_HINT = ("one positive weight per aggregate",)

REJECTED = [
    # VAR/STDDEV arguments
    Rejected("var_pop_squares_beyond_limit",
             "SELECT VAR_POP(capital_gain * 100000000) FROM adult", "0A000",
             ("squared deviations",), ("range at most",)),
    Rejected("var_pop_unbounded", "SELECT VAR_POP(capital_gain / (age - 40)) FROM adult",
             "42501", ("no bound",), ("VAR_POP(LEAST(GREATEST(capital_gain / (age - 40)",)),
    Rejected("stddev_unbounded_length", "SELECT STDDEV_POP(LENGTH(occupation)) FROM adult",
             "42501", ("no bound",), ("STDDEV_POP(LEAST(GREATEST(LENGTH(occupation)",)),
    Rejected("stddev_pop_text", "SELECT STDDEV_POP(sex) FROM adult", "42804",
             ("STDDEV_POP needs a number",)),
    Rejected("var_pop_date", "SELECT VAR_POP(day) FROM visits", "42804", ("needs a number",)),
    Rejected("var_samp_distinct", "SELECT VAR_SAMP(DISTINCT age) FROM adult", "0A000",
             ("VAR_SAMP(DISTINCT",)),
    Rejected("var_pop_nested", "SELECT VAR_POP(COUNT(*)) FROM adult", "42803", ("COUNT(*)",)),
    Rejected("stddev_beside_raw_column", "SELECT age, STDDEV(age) FROM adult", "42501",
             ("age",)),
    Rejected("var_pop_group_by_unit",
             "SELECT person_id, VAR_POP(age) FROM adult GROUP BY person_id", "42501",
             ("privacy unit",)),
    # the split
    Rejected("split_too_many_weights", "SET dpproxy.split = '1,2,3'; SELECT COUNT(*) FROM adult",
             "22023", ("3 weight(s)", "1 aggregate(s): COUNT(*)"), ("give 1 weight(s)",)),
    Rejected("split_too_few_weights", "SET dpproxy.split = '1'; "
             "SELECT COUNT(*), AVG(age) FROM adult", "22023",
             ("1 weight(s)", "2 aggregate(s): COUNT(*), AVG(age)"), SPLIT_HINT),
    Rejected("split_no_aggregates", "SET dpproxy.split = '1'; SELECT sex FROM adult GROUP BY sex",
             "22023", ("0 aggregate(s)",)),
    Rejected("split_explain_checks_count",
             "SET dpproxy.split = '1,1'; EXPLAIN SELECT COUNT(*) FROM adult", "22023",
             ("2 weight(s)",)),
    Rejected("split_zero_weight", "SET dpproxy.split = '1,0'", "22023", ("positive",),
             SPLIT_HINT),
    Rejected("split_negative_weight", "SET dpproxy.split = '-1,2'", "22023", ("positive",)),
    Rejected("split_nan_weight", "SET dpproxy.split = 'nan,1'", "22023", ("positive",)),
    Rejected("split_infinite_weight", "SET dpproxy.split = 'inf'", "22023", ("positive",)),
    Rejected("split_text_weights", "SET dpproxy.split = 'a,b'", "22023", ("dpproxy.split",),
             SPLIT_HINT),
    Rejected("split_empty_item", "SET dpproxy.split = '1,,2'", "22023", ("dpproxy.split",)),
    Rejected("split_zero_number", "SET dpproxy.split = 0", "22023", ("positive",)),
    Rejected("split_negative_in_list", "SET dpproxy.split = 1, -3", "22023", ("positive",)),
    # never dropped as if it were a client setting
    Rejected("split_list_with_word", "SET dpproxy.split = 1, x", "22023",
             ("invalid value for dpproxy.split",)),
    Rejected("epsilon_list", "SET dpproxy.epsilon = 1, 2", "22023", ("epsilon",)),
    # COUNT(DISTINCT …) of one expression only (any other column: tests/test_count_distinct.py)
    Rejected("count_distinct_two_columns",
             "SELECT COUNT(DISTINCT person_id, age) FROM adult", "0A000",
             ("takes one expression",)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in REJECTED])
def test_rejected_query(case: Rejected, make_policy: Any) -> None:
    with Engine.from_path(make_policy(replace=case.replace)) as engine:
        session = engine.session(case.analyst)
        before = session.remaining()
        options = session.options
        with pytest.raises(errors.Error) as caught:
            session.execute(case.sql)
        err = caught.value
        assert err.sqlstate == case.sqlstate, str(err)
        for part in case.message:
            assert part in err.message
        for part in case.hint:
            assert err.hint is not None and part in err.hint
        assert session.remaining() == before  # nothing charged
        assert engine.ledger.history() == []
        if ";" not in case.sql:
            # a rejected SET changes nothing (a valid SET before a rejected query applies)
            assert session.options == options


def test_rejected_table_is_large_and_distinct() -> None:
    assert len(REJECTED) >= 20
    assert len({c.id for c in REJECTED}) == len(REJECTED)
    assert len({c.sql for c in REJECTED}) == len(REJECTED)


# -- 3. plan level: statistics, sensitivities, the split ------------------------------------

@pytest.fixture(scope="module")
def policy() -> Policy:
    # analysis and planning read no data: the demo policy as shipped is enough
    return load_policy(Path(__file__).resolve().parent.parent / "policies" / "demo.toml")


def analysis_of(policy: Policy, sql: str) -> Analysis:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    result = analyze(ast, policy, policy.analyst("alice"))
    assert isinstance(result, Analysis)
    return result


def plan_of(policy: Policy, sql: str, *, epsilon: float = 1.0, delta: float = 1e-6,
            mechanism: str = "laplace", split: tuple[float, ...] | None = None) -> QueryPlan:
    return plan_query(analysis_of(policy, sql),
                      QueryOptions(epsilon, delta, mechanism, split=split))  # type: ignore[arg-type]


def test_variance_statistics_and_sensitivities(policy: Policy) -> None:
    plan = plan_of(policy, "SELECT VAR_POP(age) FROM adult")
    s1, n, s2 = (m.statistic for m in plan.measurements)
    assert (s1.kind, s1.lower, s1.upper, s1.center) == ("sum", 17, 90, 53.5)
    assert n.kind == "count"
    # S2 sums the square of the centred value, clamped to [0, h²], h = (90 - 17)/2
    assert (s2.kind, s2.lower, s2.upper, s2.center) == ("sum", 0, 36.5 ** 2, 0)
    assert s2.argument is not None and s2.argument.sql("postgres") == \
        "(age - 53.5) * (age - 53.5)"
    assert not s2.integer_valued  # (x − 53.5)² is not a whole number
    assert [m.sensitivity for m in plan.measurements] == [36.5, 1, 36.5 ** 2]
    assert plan.cost.epsilon == 1.0


def test_variance_sensitivity_under_user_level_bounding(policy: Policy) -> None:
    """visits: ≤ 10 rows per person per group, ≤ 4 groups (private keys: not capped by a
    known group count): L1 = 4·10·h for S1, 4·10·h² for S2, L2 = √4 of the same."""
    sql = "SELECT day, STDDEV_POP(amount) FROM visits GROUP BY day"
    laplace = plan_of(policy, sql)
    assert [m.sensitivity for m in laplace.measurements] == [4 * 10 * 250, 4 * 10,
                                                             4 * 10 * 250 ** 2]
    gaussian = plan_of(policy, sql, mechanism="gaussian")
    assert [m.sensitivity for m in gaussian.measurements] == [2 * 10 * 250, 2 * 10,
                                                              2 * 10 * 250 ** 2]
    assert gaussian.selection is not None


def test_integer_centre_keeps_the_square_integer(policy: Policy) -> None:
    # hours_per_week ∈ [1, 99]: centre 50, so (x − 50)² is a whole number (grid 1)
    plan = plan_of(policy, "SELECT STDDEV(hours_per_week) FROM adult")
    s2 = plan.measurements[2]
    assert s2.statistic.integer_valued and s2.noise is not None
    assert s2.noise.granularity == 1.0


def test_variances_and_avg_of_one_column_share_statistics(policy: Policy) -> None:
    plan = plan_of(policy, "SELECT AVG(age), VAR_POP(age), VAR_SAMP(age), STDDEV_POP(age), "
                           "STDDEV(age) FROM adult")
    assert len(plan.measurements) == 3
    assert [a.statistics for a in plan.analysis.aggregates] == [(0, 1)] + [(0, 1, 2)] * 4
    assert plan.analysis.output_types == ("float8",) * 5


def test_count_distinct_unit_sensitivity_is_max_groups(policy: Policy) -> None:
    """One person is one unit in each group it touches: 1 per group, max_groups_per_unit = 4
    across the groups of visits, whatever max_rows_per_unit (10) is."""
    def sensitivity(sql: str, mechanism: str = "laplace") -> float:
        (m,) = plan_of(policy, sql, mechanism=mechanism).measurements
        return m.sensitivity

    grouped = "SELECT day, COUNT(DISTINCT person_id) FROM visits GROUP BY day"
    assert sensitivity(grouped) == 4
    assert sensitivity(grouped, "gaussian") == 2
    assert sensitivity("SELECT COUNT(DISTINCT person_id) FROM visits") == 1
    assert sensitivity("SELECT day, COUNT(*) FROM visits GROUP BY day") == 40  # rows count
    assert sensitivity("SELECT sex, COUNT(DISTINCT person_id) FROM adult GROUP BY sex") == 1


def test_split_moves_scales_not_cost(policy: Policy) -> None:
    sql = "SELECT COUNT(*), SUM(hours_per_week) FROM adult"
    even = plan_of(policy, sql, epsilon=2.0)
    weighted = plan_of(policy, sql, epsilon=2.0, split=(1, 3))
    assert weighted.cost == even.cost
    assert weighted.loss.epsilon == even.loss.epsilon == 2.0
    count, total = (m.noise for m in weighted.measurements)
    assert count is not None and total is not None
    assert (count.epsilon, total.epsilon) == (pytest.approx(0.5), pytest.approx(1.5))
    assert count.epsilon + total.epsilon == pytest.approx(2.0, rel=1e-15)
    # Laplace b = Δ/ε: the count's scale is 4× the even split's ε=1 scale ratio
    assert count.scale == pytest.approx(1 / 0.5, rel=1e-9)
    assert total.scale == pytest.approx(99 / 1.5, rel=1e-9)
    assert even.measurements[1].noise is not None
    assert even.measurements[1].noise.scale == pytest.approx(99 / 1.0, rel=1e-9)


def test_split_even_weights_equal_the_default(policy: Policy) -> None:
    # (NULLIF: an argument that may be NULL, so AVG needs a count of its own)
    sql = "SELECT COUNT(*), SUM(hours_per_week), AVG(NULLIF(age, 17)) FROM adult"
    even = plan_of(policy, sql)
    # weights 2, 2, 4 give each of the 4 statistics the same share
    weighted = plan_of(policy, sql, split=(2, 2, 4))
    for a, b in zip(even.measurements, weighted.measurements, strict=True):
        assert a.noise is not None and b.noise is not None
        assert b.noise.scale == pytest.approx(a.noise.scale, rel=1e-12)


def test_split_shared_statistics_add_up(policy: Policy) -> None:
    """AVG(age) (S1, n) weight 1 and VAR_POP(age) (S1, n, S2) weight 1: S1 and n get
    1/2 + 1/3 each, S2 gets 1/3, out of 2."""
    plan = plan_of(policy, "SELECT AVG(age), VAR_POP(age) FROM adult", epsilon=12.0,
                   split=(1, 1))
    assert budget_fractions(plan.analysis, (1, 1)) == pytest.approx([5 / 12, 5 / 12, 2 / 12])
    assert [m.noise.epsilon for m in plan.measurements if m.noise] == \
        pytest.approx([5.0, 5.0, 2.0])
    # EXPLAIN's parts give each aggregate its weight's fraction
    assert aggregate_epsilons(plan) == pytest.approx([6.0, 6.0])


def test_split_keeps_partition_selection_share(policy: Policy) -> None:
    sql = "SELECT day, COUNT(*), SUM(amount) FROM visits GROUP BY day"
    even = plan_of(policy, sql, epsilon=3.0, delta=1e-6)
    weighted = plan_of(policy, sql, epsilon=3.0, delta=1e-6, split=(1, 3))
    assert even.selection is not None and weighted.selection is not None
    assert weighted.selection.epsilon == even.selection.epsilon == pytest.approx(1.0)
    assert [m.noise.epsilon for m in weighted.measurements if m.noise] == \
        pytest.approx([0.5, 1.5])
    assert weighted.cost == even.cost


def test_split_divides_gaussian_delta(policy: Policy) -> None:
    plan = plan_of(policy, "SELECT COUNT(*), SUM(hours_per_week) FROM adult",
                   mechanism="gaussian", delta=1e-6, split=(1, 4))
    noises = [m.noise for m in plan.measurements if m.noise]
    assert [n.delta for n in noises] == pytest.approx([2e-7, 8e-7])
    assert [n.epsilon for n in noises] == pytest.approx([0.2, 0.8])
    assert plan.cost.delta == 1e-6


def test_set_with_a_list_value_parses_to_the_dpproxy_setting() -> None:
    (statement,) = parse_statements("SET dpproxy.split TO 2, '0.5'")
    assert (statement.kind, statement.name, statement.value) == ("set", "dpproxy.split",
                                                                 ("2", "0.5"))
    assert parse_split(statement.value) == (2.0, 0.5)
    (client,) = parse_statements("SET search_path = public, other")
    assert client.kind == "set" and client.name is None  # a client setting: a no-op


def test_split_weights_are_validated() -> None:
    assert parse_split("1, 3") == (1.0, 3.0)
    assert parse_split(" 0.5 ") == (0.5,)
    assert parse_split(2) == (2.0,)
    for even in (None, "", "even", "DEFAULT"):
        assert parse_split(even) is None
    for bad in ("0", "-1", "1,nan", "inf,1", "x", "1;2", "1,", ","):
        with pytest.raises(errors.InvalidParameterValue) as caught:
            parse_split(bad)
        assert caught.value.sqlstate == "22023"
    with pytest.raises(errors.InvalidParameterValue):
        QueryOptions(1.0, 0.0, "laplace", split=())


# -- 4. combining: post-processing into range, the fallback, intervals ---------------------------

def _stats(policy: Policy, sql: str) -> list[Any]:
    return list(analysis_of(policy, sql).statistics)


@pytest.mark.parametrize("name", ["var_pop", "var_samp", "stddev_pop", "stddev_samp"])
def test_variance_is_post_processed_into_range(policy: Policy, name: str) -> None:
    stats = _stats(policy, f"SELECT {name.upper()}(age) FROM adult")
    rule = RULES[name]
    h2 = 36.5 ** 2
    top = {"var_pop": h2, "var_samp": 2 * h2, "stddev_pop": 36.5,
           "stddev_samp": math.sqrt(2 * h2)}[name]
    # noisy statistics of every sign and size, including ones no data could produce
    for s1 in (-1e6, -500.0, 0.0, 730.0, 1e6):
        for n in (-5.0, 0.0, 1.0, 1.99, 2.0, 3.0, 20.0, 1e5):
            for s2 in (-1e7, 0.0, 100.0, 5e4, 1e9):
                value = combine(rule, [s1, n, s2], stats)
                assert 0.0 <= value <= top, (s1, n, s2, value)
                if n < 2:  # the documented fallback: uniform variance over the bounds, h²/3
                    expected = h2 / 3
                    assert value == pytest.approx(math.sqrt(expected) if "stddev" in name
                                                  else expected)


def test_variance_of_exact_statistics_is_the_variance(policy: Policy) -> None:
    # ages 20, 30, 40, 50 (centre 53.5): var_pop = 125, var_samp = 166.67
    ages = [20, 30, 40, 50]
    values = [sum(a - 53.5 for a in ages), 4.0, sum((a - 53.5) ** 2 for a in ages)]
    stats = _stats(policy, "SELECT VAR_POP(age) FROM adult")
    assert combine(RULES["var_pop"], values, stats) == pytest.approx(125.0)
    assert combine(RULES["var_samp"], values, stats) == pytest.approx(500 / 3)
    assert combine(RULES["stddev_pop"], values, stats) == pytest.approx(math.sqrt(125.0))
    assert combine(RULES["stddev_samp"], values, stats) == pytest.approx(math.sqrt(500 / 3))


@pytest.mark.parametrize("name", ["var_pop", "var_samp", "stddev_pop", "stddev_samp"])
def test_interval_covers_every_point_of_the_box(policy: Policy, name: str) -> None:
    """The interval is conservative: every (S1, n, S2) within the half-widths (checked on an
    11×11×11 grid including the corners) gives a value inside it."""
    stats = _stats(policy, f"SELECT {name.upper()}(age) FROM adult")
    rule = RULES[name]
    for values, half in [([-3000.0, 200.0, 40000.0], [400.0, 30.0, 9000.0]),
                         ([100.0, 50.0, 60000.0], [300.0, 20.0, 30000.0]),
                         ([0.0, 1e5, 1.8e7], [50.0, 3.0, 2e4])]:
        low, high = interval(rule, values, half, stats)
        assert low <= combine(rule, values, stats) <= high
        steps = [i / 5 - 1 for i in range(11)]
        for a in steps:
            for b in steps:
                for c in steps:
                    point = [values[0] + a * half[0], values[1] + b * half[1],
                             values[2] + c * half[2]]
                    assert low - 1e-9 <= combine(rule, point, stats) <= high + 1e-9


@pytest.mark.parametrize("name", ["avg", "var_pop", "var_samp"])
def test_explain_error_bounds_the_interval_in_large_groups(policy: Policy, name: str) -> None:
    """EXPLAIN's first-order error for n rows is at least half the width of the released
    interval of a group of n rows, wherever its mean and spread lie (second-order terms
    are below 0.1 % at n = 100,000)."""
    stats = _stats(policy, f"SELECT {name.upper()}(age) FROM adult")
    rule = RULES[name]
    assert rule.error_at is not None
    half = [400.0, 12.0, 20000.0][:len(stats)]
    n = 100_000.0
    for mean in (-36.5, -10.0, 0.0, 20.0, 36.5):  # centred mean, |mean| <= h
        for spread in (0.0, 100.0, 600.0):  # (some pairs no data gives: it holds there too)
            s2 = n * (spread + mean * mean)
            values = [n * mean, n, s2][:len(stats)]
            low, high = rule.interval(values, half, stats)
            assert (high - low) / 2 <= rule.error_at(half, stats, n) * 1.001


def test_interval_of_tiny_count_is_the_whole_range(policy: Policy) -> None:
    stats = _stats(policy, "SELECT VAR_SAMP(age) FROM adult")
    assert interval(RULES["var_samp"], [10.0, 3.0, 900.0], [5.0, 2.0, 50.0], stats) == \
        (0.0, 2 * 36.5 ** 2)


def test_release_never_negative_at_small_epsilon(policy: Policy) -> None:
    """A group of 3 rows at ε = 0.01 (scales: n 300, S1 11,000, S2 400,000): the raw formula is
    negative or huge most of the time; the released values stay in range, always."""
    plan = plan_of(policy, "SELECT sex, VAR_POP(age), VAR_SAMP(age), STDDEV_POP(age), "
                           "STDDEV_SAMP(age) FROM adult GROUP BY sex", epsilon=0.01)
    exact_rows = [("Female", sum(a - 53.5 for a in (17, 18, 90)), 3,
                   sum((a - 53.5) ** 2 for a in (17, 18, 90))),
                  ("Male", 0.0, 0, 0.0)]
    h2 = 36.5 ** 2
    for _ in range(200):
        released = release(plan, exact_rows)
        for row, intervals in zip(released.rows, released.intervals, strict=True):
            var_pop, var_samp, sd_pop, sd_samp = row[1:]
            assert 0 <= var_pop <= h2 and 0 <= var_samp <= 2 * h2
            assert 0 <= sd_pop <= 36.5 and 0 <= sd_samp <= math.sqrt(2 * h2)
            for value, span in zip(row[1:], intervals[1:], strict=True):
                assert span is not None and span[0] <= value <= span[1]


# -- 5. sessions: SET/SHOW/RESET, cache keys, EXPLAIN ------------------------------------------

def test_set_show_reset_split(big_engine: Engine) -> None:
    session = big_engine.session("alice")
    assert session.execute("SHOW dpproxy.split").rows == [("even",)]
    session.execute("SET dpproxy.split = '1, 3'")
    assert session.execute("SHOW dpproxy.split").rows == [("1,3",)]
    assert ("dpproxy.split", "1,3") in session.execute("SHOW all").rows
    session.execute("RESET dpproxy.split")
    assert session.execute("SHOW dpproxy.split").rows == [("even",)]
    session.execute("SET dpproxy.split = '0.5,2'")
    session.execute("RESET all")
    assert session.options.split is None
    assert big_engine.session("alice", split="2,1").options.split == (2.0, 1.0)


def test_dbapi_connect_takes_a_split(make_policy: Any) -> None:
    import dpproxy

    with dpproxy.connect(make_policy(), analyst="alice", split="1,4") as conn:
        (split,) = conn.execute("SHOW dpproxy.split").fetchone() or ()
        assert split == "1,4"
        cur = conn.execute("SELECT COUNT(*), SUM(hours_per_week) FROM adult")
        count, total = cur.accuracy
        assert count is not None and total is not None
        # the policy's default ε = 0.1, split 1:4
        assert (count.epsilon, total.epsilon) == (pytest.approx(0.02), pytest.approx(0.08))
    with pytest.raises(errors.InvalidParameterValue):
        dpproxy.connect(make_policy(), analyst="alice", split="1,-4")


def test_cli_explain_takes_a_split(demo_policy: Path) -> None:
    from tests.test_cli import dpproxy as run_cli

    run = run_cli("explain", "--policy", demo_policy, "--epsilon", "1", "--split", "3,1",
                  "SELECT COUNT(*), VAR_SAMP(age) FROM adult")
    assert run.returncode == 0, run.stderr
    assert "split by aggregate weights 3,1" in run.stdout
    assert "COUNT(*) from m0: ε=0.75 (75% of the query's)" in run.stdout
    assert "VAR_SAMP(age) from m1, m0, m2: ε=0.25 (25% of the query's)" in run.stdout
    bad = run_cli("query", "--policy", demo_policy, "--split", "1",
                  "SELECT COUNT(*), VAR_SAMP(age) FROM adult")
    assert bad.returncode != 0
    assert "22023" in bad.stderr + bad.stdout and "2 aggregate(s)" in bad.stderr + bad.stdout


def test_a_different_split_is_not_served_a_cached_answer(big_engine: Engine) -> None:
    session = big_engine.session("alice", epsilon=1.0)
    sql = "SELECT COUNT(*), SUM(hours_per_week) FROM adult"
    session.execute("SET dpproxy.split = '1,3'")
    first = session.execute(sql)
    repeat = session.execute(sql)
    assert first.cost is not None and repeat.cost is None  # same split: the cached answer
    assert repeat.rows == first.rows
    session.execute("SET dpproxy.split = '3,1'")
    other = session.execute(sql)
    assert other.cost is not None and other.cost.epsilon == 1.0  # charged: a new answer
    count_first, count_other = first.accuracy[0], other.accuracy[0]
    assert count_first is not None and count_other is not None
    assert count_first.epsilon == pytest.approx(0.25)
    assert count_other.epsilon == pytest.approx(0.75)
    assert count_first.noise_scales[0] == pytest.approx(3 * count_other.noise_scales[0],
                                                        rel=1e-6)


def test_explain_shows_split_and_expected_errors(big_engine: Engine) -> None:
    session = big_engine.session("alice", epsilon=1.0)
    sql = "EXPLAIN SELECT COUNT(*), AVG(age), STDDEV_POP(age) FROM adult"
    even = "\n".join(r[0] for r in session.execute(sql).rows)
    assert "split evenly over 3 noisy statistic(s)" in even
    assert "SUM(clamp((age - 53.5) * (age - 53.5), 0, 1332.25))" in even
    assert "L1 sensitivity 1332.25" in even
    # even split, 1/3 per statistic (age is never NULL: AVG's and STDDEV's n is COUNT(*));
    # n is claimed by COUNT (1), AVG (1/2) and STDDEV (1/3), S1 by AVG and STDDEV: COUNT's
    # part (1/3)·(6/11) = 2/11, AVG's (1/3)·(3/5) + (1/3)·(3/11), STDDEV's the rest
    assert "COUNT(*) from m0: ε=0.181818 (18% of the query's), 95% ± " in even
    assert "AVG(age) from m1, m0: ε=0.290909 (29% of the query's), 95% about ± " in even
    assert "STDDEV_POP(age) from m1, m0, m2: ε=0.527273 (53% of the query's)" in even
    assert "at 1,000 rows" in even and "at 100,000 rows" in even
    session.execute("SET dpproxy.split = '1,1,2'")
    weighted = "\n".join(r[0] for r in session.execute(sql).rows)
    assert "split by aggregate weights 1,1,2 (SET dpproxy.split)" in weighted
    assert "COUNT(*) from m0: ε=0.25 (25% of the query's)" in weighted
    assert "AVG(age) from m1, m0: ε=0.25 (25% of the query's)" in weighted
    assert "STDDEV_POP(age) from m1, m0, m2: ε=0.5 (50% of the query's)" in weighted
    assert session.remaining().epsilon == 1e9  # EXPLAIN charges nothing


def test_explain_error_matches_released_accuracy(big_engine: Engine) -> None:
    """EXPLAIN's ± for a COUNT is the half-width the released answer reports."""
    session = big_engine.session("alice", epsilon=0.5, split="1,2")
    sql = "SELECT COUNT(*), SUM(age) FROM adult"
    text = "\n".join(r[0] for r in session.execute("EXPLAIN " + sql).rows)
    result = session.execute(sql)
    count = result.accuracy[0]
    assert count is not None and count.half_width is not None
    assert f"COUNT(*) from m0: ε=0.166667 (33% of the query's), 95% ± {count.half_width:.6g}" \
        in text


# -- 6. accuracy on a million rows --------------------------------------------------------------

MILLION_POLICY = """
[backend]
kind = "duckdb"
path = "{database}"

[ledger]
path = "ledger.sqlite"

[audit]
path = "audit.jsonl"

[privacy]
default_epsilon = 1.0
default_delta = 1e-7
mechanism = "laplace"
confidence = 0.95

[tables.big]
[tables.big.columns]
x = {{ type = "int", lower = 0, upper = 100, nullable = false }}
y = {{ type = "float", lower = -10, upper = 10 }}

[analysts.carol]
budget = {{ epsilon = 100.0, delta = 1e-5 }}
tables = ["big"]
"""


@pytest.fixture(scope="module")
def million_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """1,000,000 rows, each its own unit: x = 7919·i mod 101 (every value 0…100, near
    uniform, variance ≈ 850) and y, outside its declared [-10, 10] for one row in 20 (so
    clamping matters), NULL for one in 7."""
    folder = tmp_path_factory.mktemp("million")
    database = folder / "big.duckdb"
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE big AS SELECT (7919 * i) % 101 AS x, "
                "CASE WHEN i % 7 = 0 THEN NULL WHEN i % 20 = 0 THEN 500.0 + (i % 13) "
                "ELSE ((i * 31) % 2001) / 100.0 - 10 END AS y FROM range(1000000) r(i)")
    con.close()
    policy = folder / "policy.toml"
    policy.write_text(MILLION_POLICY.format(database=database.as_posix()))
    with Engine.from_path(policy) as engine:
        yield engine


def test_variance_is_accurate_on_a_million_rows(million_engine: Engine) -> None:
    """At ε = 1 over three statistics (b = 3 for n, 150 for S1, 7,500 for S2) the released
    variances and standard deviations are within a bound derived from the noise scales.

    Each discrete Laplace draw of scale b exceeds b·L, L = ln(6·10⁶), with probability at
    most 2e^(−L) = 1/(3·10⁶), so all three stay inside with probability ≥ 1 − 10⁻⁶: that
    is this test's false-failure rate. Inside that box the error of var = S2/n − (S1/n)²
    is at most (e2 + 2h·e1 + 3h²·en)/(n − en) (h = 50): |ΔS2/n| ≤ (e2 + h²·en)/(n − en)
    and |Δ(S1/n)²| ≤ 2h·(e1 + h·en)/(n − en). That is < 0.1 % of the variance. The
    released intervals (at confidence 1 − 10⁻⁶) must hold the exact values too. The exact
    values are read from the backend directly, not through dpproxy.
    """
    session = million_engine.session("carol", epsilon=1.0, confidence=1 - 1e-6)
    exact_values = million_engine.backend.run_aggregate(
        "SELECT VAR_POP(x), VAR_SAMP(x), STDDEV_POP(x), STDDEV_SAMP(x) FROM big", ())[0]
    result = session.execute("SELECT VAR_POP(x), VAR_SAMP(x), STDDEV_POP(x), STDDEV_SAMP(x) "
                             "FROM big")
    (row,) = result.rows
    accuracy = result.accuracy[0]
    assert accuracy is not None
    b1, bn, b2 = accuracy.noise_scales
    assert (b1, bn, b2) == (pytest.approx(150, rel=1e-5), pytest.approx(3.0),
                            pytest.approx(7500, rel=1e-5))
    spread = math.log(6e6)
    n, h = 1_000_000, 50.0
    var_bound = (b2 + 2 * h * b1 + 3 * h * h * bn) * spread / (n - bn * spread)
    true_var = float(exact_values[0])
    assert 800 < true_var < 900 and var_bound < 0.001 * true_var
    for released, truth, kind in zip(row, exact_values, ("var", "var", "sd", "sd"),
                                     strict=True):
        truth = float(truth)
        # var_samp = var_pop·n/(n − 1): the same bound up to a factor 1 + O(1/n);
        # |√a − √b| ≤ |a − b|/√b for the standard deviations
        bound = var_bound * 1.001 / (1.0 if kind == "var" else math.sqrt(true_var))
        assert abs(released - truth) <= bound, (released, truth, bound)
    for truth, (low, high) in zip(exact_values, result.intervals[0], strict=True):
        assert low <= float(truth) <= high


def test_clamping_happens_before_squaring(million_engine: Engine) -> None:
    """y has values outside [-10, 10] and NULLs: the released variance is that of the
    clamped, non-NULL values (S2 clamps (y − c)², which equals (clamp(y) − c)² since c is
    the midpoint), not that of the raw values (> 100× larger). At ε = 1: b(S2) = 300,
    b(S1) = 30, b(n) = 3 over ~857,000 rows, h = 10, give an error below
    (300 + 2·10·30 + 3·100·3)·ln(6·10⁶)/857,000 < 0.04 with probability ≥ 1 − 10⁻⁶ (the
    bound of the test above)."""
    session = million_engine.session("carol", epsilon=1.0)
    clamped, raw = (float(v) for v in million_engine.backend.run_aggregate(
        # (DuckDB's GREATEST skips NULLs: they are filtered out first)
        "SELECT VAR_POP(LEAST(GREATEST(y, -10), 10)), VAR_POP(y) FROM big WHERE y IS NOT NULL",
        ())[0])
    ((released,),) = session.execute("SELECT VAR_POP(y) FROM big").rows
    assert raw > 100 * clamped
    assert abs(released - clamped) <= 0.04
