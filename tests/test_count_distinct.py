"""COUNT(DISTINCT expr) of any column or row expression, end to end on both backends.

A unit keeps at most max_rows rows in each of at most max_groups groups (drawn at random,
`rewrite._ranked_rows`), and its kept rows add or remove at most that many distinct
values in a group: L1 sensitivity max_groups × max_rows, as COUNT(*)'s. The bound itself
is tested in tests/test_bounding.py (a unit of 50 rows moves a distinct count by exactly
max_rows per kept group); here the values, costs and types clients see.

Noise: the demo's adult table has one row per person (max_rows = max_groups = 1), so a
distinct count there has sensitivity 1; at ε = 5 split over k statistics its discrete
Laplace scale is k/5, and a tolerance of 40·k/5 is exceeded with probability below
2·e^-40 ≈ 8e-18 per value.
"""

from __future__ import annotations

import psycopg
import pytest

from dpproxy.session import Engine

from .conftest import PolicyFactory
from .exact import read_directly
from .refusals import assert_refused
from .test_server_support import ServeFactory

BACKENDS = ("duckdb", "postgres")

BY_OCCUPATION = ("SELECT occupation, COUNT(DISTINCT age) AS ages, "
                 "COUNT(DISTINCT education) FILTER (WHERE sex = 'Female') AS women_levels "
                 "FROM adult GROUP BY occupation ORDER BY occupation")
EXACT = ("SELECT occupation, COUNT(DISTINCT age), "
         "COUNT(DISTINCT education) FILTER (WHERE sex = 'Female') "
         "FROM adult WHERE occupation IS NOT NULL GROUP BY occupation ORDER BY occupation")


def test_distinct_counts_over_psycopg(serve: ServeFactory) -> None:
    """Per occupation (public keys: all 14), the distinct ages and, with FILTER, the
    distinct education levels among women: int8 columns within 16 (40·2/5) of the exact
    counts, charged ε once; the repeat is the stored answer, free."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 5")
        cur = conn.execute(BY_OCCUPATION)
        rows = cur.fetchall()
        assert cur.description is not None
        assert [(c.name, c.type_code) for c in cur.description] == [
            ("occupation", 25), ("ages", 20), ("women_levels", 20)]
        assert served.spent() == pytest.approx(5.0)
        assert conn.execute(BY_OCCUPATION).fetchall() == rows
        assert served.spent() == pytest.approx(5.0)
    exact = read_directly(served.engine, EXACT)
    assert [r[0] for r in rows] == [r[0] for r in exact] and len(rows) == 14
    for mine, truth in zip(rows, exact, strict=True):
        assert all(isinstance(v, int) and v >= 0 for v in mine[1:])
        assert abs(mine[1] - truth[1]) <= 16 and abs(mine[2] - truth[2]) <= 16, (mine, truth)


def test_explain_states_the_sensitivity_of_kept_rows(make_policy: PolicyFactory) -> None:
    """visits keeps 10 rows in each of 4 groups per person: a distinct count's L1
    sensitivity is 40 with GROUP BY (4 groups), 10 without; EXPLAIN charges nothing."""
    with Engine.from_path(make_policy()) as engine:
        alice = engine.session("alice")
        grouped = alice.execute("EXPLAIN SELECT day, COUNT(DISTINCT amount) FROM visits "
                                "GROUP BY day")
        whole = alice.execute("EXPLAIN SELECT COUNT(DISTINCT day) FROM visits")
        text = ["\n".join(str(r[0]) for r in result.rows) for result in (grouped, whole)]
        assert "COUNT(DISTINCT amount): L1 sensitivity 40," in text[0]
        assert "COUNT(DISTINCT day): L1 sensitivity 10," in text[1]
        assert engine.ledger.status("analyst:alice").spent.epsilon == 0


def test_duckdb_spellings_measure_what_they_stand_for(make_policy: PolicyFactory) -> None:
    """APPROX_COUNT_DISTINCT(x) is COUNT(DISTINCT x) (of the privacy unit: its own
    statistic), COUNT_IF(c) is COUNT(*) FILTER (WHERE c): beside each other they are one
    measurement, and the columns keep the names written."""
    with Engine.from_path(make_policy()) as engine:
        alice = engine.session("alice")
        plan = "\n".join(str(r[0]) for r in alice.execute(
            "EXPLAIN SELECT APPROX_COUNT_DISTINCT(day), COUNT(DISTINCT day), "
            "APPROX_COUNT_DISTINCT(person_id), COUNT_IF(amount > 100), "
            "COUNT(*) FILTER (WHERE amount > 100) FROM visits").rows)
        measured = [line for line in plan.splitlines() if line.startswith("  m")]
        assert len(measured) == 3, plan
        assert any("COUNT(DISTINCT day)" in line for line in measured)
        assert any("COUNT(DISTINCT privacy unit)" in line for line in measured)
        result = alice.execute("SELECT APPROX_COUNT_DISTINCT(day), COUNT_IF(amount > 100) "
                               "FROM visits")
        assert result.columns == ("approx_count_distinct", "count_if")


NO_UNIT = {'privacy_unit = "person_id"\nmax_groups_per_unit = 1\nmax_rows_per_unit = 1\n': ""}


def test_table_without_a_privacy_unit_counts_rows_distinct(make_policy: PolicyFactory
                                                           ) -> None:
    """Where each row is its own unit (no privacy_unit), nothing is bounded: COUNT(DISTINCT
    person_id) is an ordinary distinct count of sensitivity 1, here within 8 (40/5) of the
    exact count, with a parameter in the WHERE as a prepared query sends it."""
    with Engine.from_path(make_policy(NO_UNIT)) as engine:
        alice = engine.session("alice")
        alice.execute("SET dpproxy.epsilon = 5")
        sql = "SELECT COUNT(DISTINCT person_id) AS people FROM adult WHERE age > {}"
        result = alice.execute(sql.format("%s"), (40,))
        (released,), = result.rows
        explained = alice.execute("EXPLAIN " + sql.format(40))
        assert "L1 sensitivity 1," in "\n".join(str(r[0]) for r in explained.rows)
        (exact,), = read_directly(engine, sql.format(40))
    assert abs(released - exact) <= 8


@pytest.mark.parametrize(("sql", "sqlstate", "words"), [
    ("SELECT COUNT(DISTINCT age, sex) FROM adult", "0A000", "takes one expression"),
    ("SELECT COUNT(DISTINCT age), MEDIAN(age) FROM adult", "0A000", "two queries"),
    ("SELECT COUNT(DISTINCT occupation) FROM adult GROUP BY person_id", "42501",
     "privacy unit"),
    ("SELECT SUM(DISTINCT age) FROM adult", "0A000", "SUM(DISTINCT"),
])
def test_refusals_charge_nothing(engine: Engine, sql: str, sqlstate: str, words: str
                                 ) -> None:
    assert_refused(engine, sql, sqlstate, words)
