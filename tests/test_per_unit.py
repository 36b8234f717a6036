"""Values per person in a subquery (`dpproxy.analyze.per_unit`): the subquery groups by
the table's privacy unit, so each person is one of its rows, whatever their rows in the
table; the outer query is a DP query over those rows, each its own unit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from dpproxy import errors
from dpproxy.session import Engine
from tests.pg import scratch_database

from .conftest import PolicyFactory

BACKENDS = ("duckdb", "postgres")

HISTOGRAM = ("SELECT n, COUNT(*) AS people FROM (SELECT person_id, COUNT(*) AS n FROM visits "
             "GROUP BY person_id) AS t GROUP BY n ORDER BY n")


@pytest.fixture
def rich(make_policy: PolicyFactory) -> Iterator[Engine]:
    """The demo with a budget large enough for ε = 10^4 a query: Laplace noise of scale
    at most 10^-2 here, so a count is released exactly but with probability below e^-50,
    and an average within 10^-4 of the exact one."""
    with Engine.from_path(make_policy({"budget = { epsilon = 10.0,":
                                       "budget = { epsilon = 1e9,"})) as engine:
        yield engine


def _exact(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    """The exact answer of a statement, read on the engine's own backend."""
    return [tuple(r) for r in engine.backend.run_aggregate(sql)]


def test_histogram_of_people_by_visits(rich: Engine) -> None:
    """Every bin of the histogram with 30 people or more is released, at its exact count
    (partition selection's threshold at ε = 10^4 is a few people); none is invented."""
    alice = rich.session("alice", epsilon=1e4)
    released = dict(alice.execute(HISTOGRAM).rows)
    exact = dict(_exact(rich, "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n "
                              "FROM visits GROUP BY person_id) t GROUP BY n"))
    assert set(released) <= set(exact)
    assert {n for n, people in exact.items() if people >= 30} <= set(released)
    assert all(released[n] == exact[n] for n in released)
    assert sum(exact.values()) == 32_561  # one row per person, whatever their visits


def test_values_per_person_are_clamped_outside(rich: Engine) -> None:
    """Averages over people of values per person, each within the bounds the outer query
    clamps it to: COUNT(*) clamped by LEAST to 20, AVG(amount) within amount's [0, 500],
    the first day within the year; and the people with more than 20 visits."""
    alice = rich.session("alice", epsilon=1e4)
    sql = ("SELECT AVG(LEAST(n, 20)), AVG(spent), MIN(first_day), COUNT(*) FILTER "
           "(WHERE n > 20) FROM (SELECT person_id, COUNT(*) AS n, AVG(amount) AS spent, "
           "MIN(day) AS first_day FROM visits WHERE amount > 5 GROUP BY person_id) AS t")
    mean_visits, mean_spent, first_day, many = alice.execute(sql).rows[0]
    exact = _exact(rich, "SELECT AVG(LEAST(n, 20)), AVG(spent), COUNT(*) FILTER (WHERE n > 20) "
                         "FROM (SELECT person_id, COUNT(*) AS n, AVG(amount) AS spent "
                         "FROM visits WHERE amount > 5 GROUP BY person_id) t")[0]
    assert mean_visits == pytest.approx(float(exact[0]), abs=1e-3)
    assert mean_spent == pytest.approx(float(exact[1]), abs=1e-2)
    assert many == exact[2]
    assert str(first_day).startswith("2024-01")  # the earliest first visit, of 32k people


def test_a_person_is_one_row_whatever_their_rows(tmp_path: Path, make_policy: PolicyFactory,
                                                  backend_kind: str, request: Any) -> None:
    """One person more, with 50 visits, moves the histogram by one person in one bin (n =
    50), as one more person with one visit moves it in bin 1: the sensitivity the noise is
    calibrated for is one row, however many rows a person has. Exact at ε = 10^4 (a bin
    of one person alone is never released: partition selection)."""
    # 100 people each with 1, 2, 3 and 50 visits
    rows = [(p, (1, 2, 3, 50)[p % 4]) for p in range(400)]
    answers = []
    for extra in ([], [(1000, 50)], [(1000, 1)]):
        values = [(person, 10.0) for person, visits in rows + extra for _ in range(visits)]
        source = _visits_table(tmp_path, backend_kind, request, values, len(answers))
        policy = make_policy(text=_policy(source, tmp_path, len(answers)))
        with Engine.from_path(policy) as engine:
            alice = engine.session("alice", epsilon=1e4)
            answers.append(dict(alice.execute(
                "SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits "
                "GROUP BY person_id) t GROUP BY n").rows))
    base, heavy, light = answers
    assert base == {1: 100, 2: 100, 3: 100, 50: 100}
    assert heavy == {**base, 50: 101}
    assert light == {**base, 1: 101}


def _visits_table(tmp_path: Path, backend_kind: str, request: Any,
                  values: list[tuple[int, float]], n: int) -> str:
    """A table visits(person_id, amount) of these rows, in a DuckDB file or a scratch
    PostgreSQL database; the policy's [backend] lines."""
    if backend_kind == "duckdb":
        path = tmp_path / f"visits{n}.duckdb"
        with duckdb.connect(str(path)) as con:
            con.execute("CREATE TABLE visits (person_id INTEGER, amount DOUBLE)")
            con.executemany("INSERT INTO visits VALUES (?, ?)", values)
        return f'kind = "duckdb"\npath = "{path.as_posix()}"'
    dsn = request.getfixturevalue("pg_dsn")
    scratch = request.getfixturevalue("per_unit_scratch")
    database = scratch(dsn)
    with psycopg.connect(database, autocommit=True) as con:
        con.execute("CREATE TABLE visits (person_id integer, amount double precision)")
        with con.cursor() as cur:
            cur.executemany("INSERT INTO visits VALUES (%s, %s)", values)
    return f'kind = "postgres"\ndsn = "{database}"'


@pytest.fixture
def per_unit_scratch() -> Iterator[Any]:
    """Scratch PostgreSQL databases, dropped after the test."""
    import contextlib

    with contextlib.ExitStack() as stack:
        yield lambda dsn: stack.enter_context(scratch_database(dsn))


def _policy(backend: str, tmp_path: Path, n: int) -> str:
    return f"""
[backend]
{backend}
[ledger]
path = "{(tmp_path / f'ledger{n}.sqlite').as_posix()}"
[privacy]
default_epsilon = 1.0
[tables.visits]
privacy_unit = "person_id"
max_rows_per_unit = 5
max_groups_per_unit = 1
[tables.visits.columns]
person_id = {{ type = "int", nullable = false }}
amount = {{ type = "float", lower = 0, upper = 100, nullable = false }}
[analysts.alice]
budget = {{ epsilon = 1e9, delta = 1e-5 }}
tables = ["visits"]
"""


def test_sums_per_person_beyond_the_float_range(tmp_path: Path, make_policy: PolicyFactory,
                                                 backend_kind: str, request: Any) -> None:
    """Values far outside the policy's bounds (amount in [0, 100]) neither overflow nor
    raise, whichever person the WHERE picks: person 7's AVG (whose sum of squares would
    pass 1e308 in DOUBLE PRECISION) and person 8's SUM (2e308) are summed in NUMERIC on
    PostgreSQL, in DOUBLE on DuckDB (inf), and clamped outside to the derived bounds."""
    values = [(7, 1e160), (7, 1e160), (8, 1e308), (8, 1e308), *((p, 1.0) for p in range(20))]
    source = _visits_table(tmp_path, backend_kind, request, values, 0)
    with Engine.from_path(make_policy(text=_policy(source, tmp_path, 0))) as engine:
        alice = engine.session("alice", epsilon=1e4)
        for person in (7, 8, 1):
            for value in ("AVG(amount)", "SUM(amount)"):
                (count,), = alice.execute(
                    f"SELECT COUNT(*) FROM (SELECT person_id, {value} AS s FROM visits "
                    f"WHERE person_id = {person} GROUP BY person_id) t WHERE s > 0").rows
                assert count == 1  # the one person picked
                (total,), = alice.execute(
                    f"SELECT SUM(LEAST(s, 100)) FROM (SELECT person_id, {value} AS s FROM "
                    f"visits WHERE person_id = {person} GROUP BY person_id) t").rows
                assert total == pytest.approx(100 if person != 1 else 1, abs=0.1)


def test_a_with_query_of_values_per_person(rich: Engine) -> None:
    alice = rich.session("alice", epsilon=1e4)
    sql = ("WITH per_person AS (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY "
           "person_id) SELECT COUNT(*) FROM per_person WHERE n >= 20")
    exact = _exact(rich, "SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits "
                         "GROUP BY person_id) t WHERE n >= 20")[0][0]
    assert alice.execute(sql).rows == [(exact,)]


def test_literals_inside_and_outside_take_their_values(rich: Engine) -> None:
    """A repeated query shape with new values inside the subquery and outside it answers
    for those values (no cached analysis keeps an old one)."""
    alice = rich.session("alice", epsilon=1e4)
    sql = ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits WHERE amount > %s "
           "GROUP BY person_id) t WHERE n > %s")
    for amount, visits in [(10, 3), (400, 1), (10, 8), (250, 3)]:
        exact = _exact(rich, "SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM "
                             f"visits WHERE amount > {amount} GROUP BY person_id) t "
                             f"WHERE n > {visits}")[0][0]
        assert alice.execute(sql, [amount, visits]).rows == [(exact,)], (amount, visits)


def test_explain_names_the_values_per_person(engine: Engine) -> None:
    lines = [r[0] for r in engine.session("alice").execute("EXPLAIN " + HISTOGRAM).rows]
    assert lines[0] == ("DP query on visits (values per person_id, one row per unit: n = "
                        "COUNT(*); each row is its own unit)")
    assert any("L1 sensitivity 1," in line for line in lines)


def test_the_charge_is_the_tables(make_policy: PolicyFactory) -> None:
    """The query is charged to the analyst and to the table's own total budget."""
    policy = make_policy({"[tables.visits]\n": "[tables.visits]\n"
                                               "total_budget = { epsilon = 5.0, delta = 1e-5 }\n"})
    with Engine.from_path(policy) as engine:
        alice = engine.session("alice", epsilon=2.0)
        alice.execute(HISTOGRAM)
        alice.execute(HISTOGRAM.replace("people", "persons"))
        with pytest.raises(errors.BudgetExceeded):
            alice.execute(HISTOGRAM.replace("people", "folks"))


@pytest.mark.parametrize(("sql", "problem", "says"), [
    # the unit identifies a person: never read outside
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t "
     "WHERE person_id > 3", errors.NotSupportedError, "identifies a person"),
    ("SELECT p, COUNT(*) FROM (SELECT person_id AS p, COUNT(*) AS n FROM visits GROUP BY "
     "person_id) t GROUP BY p", errors.NotSupportedError, "identifies a person"),
    # AS t(a, b) renames by position: here the unit's column becomes n
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) "
     "t(n, a) WHERE n > 3", errors.NotSupportedError, "identifies a person"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY "
     "adult.person_id) t", errors.UndefinedColumn, "adult"),
    # an unbounded value is clamped before it is averaged
    ("SELECT AVG(n) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t",
     errors.PrivacyViolation, "AVG(LEAST(GREATEST(n, 1), <upper>))"),
    ("SELECT SUM(total) FROM (SELECT person_id, SUM(amount) AS total FROM visits GROUP BY "
     "person_id) t", errors.PrivacyViolation, "no bound is known for total"),
    # a group of another column is not one person
    ("SELECT AVG(n) FROM (SELECT day, COUNT(*) AS n FROM visits GROUP BY day) t",
     errors.NotSupportedError, "COUNT(DISTINCT day)"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id "
     "HAVING COUNT(*) > 2) t", errors.NotSupportedError, "HAVING"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id "
     "LIMIT 5) t", errors.NotSupportedError, "LIMIT"),
    ("SELECT COUNT(*) FROM (SELECT person_id, STDDEV(amount) AS s FROM visits GROUP BY "
     "person_id) t", errors.NotSupportedError, "COUNT(*), COUNT(x)"),
    ("SELECT COUNT(*) FROM (SELECT person_id, SUM(amount) / COUNT(*) AS m FROM visits GROUP BY "
     "person_id) t", errors.NotSupportedError, "compute the rest in the outer query"),
    ("SELECT COUNT(*) FROM (SELECT person_id, AVG(day) AS d FROM visits GROUP BY person_id) t",
     errors.NotSupportedError, "needs a number"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t "
     "JOIN occupation_groups g ON g.occupation = 'x'", errors.NotSupportedError, "joins"),
    ("SELECT COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM nowhere GROUP BY person_id) t",
     errors.UndefinedTable, "nowhere"),
    ("SELECT COUNT(*) FROM (SELECT occupation, COUNT(*) AS n FROM occupation_groups "
     "GROUP BY occupation) t", errors.NotSupportedError, "public lookup table"),
])
def test_refused(engine: Engine, sql: str, problem: type[errors.Error], says: str) -> None:
    alice = engine.session("alice")
    with pytest.raises(problem) as raised:
        alice.execute(sql)
    assert says in raised.value.message + (raised.value.hint or "")
    assert alice.remaining().epsilon == pytest.approx(10.0)


def test_a_table_not_granted(make_policy: PolicyFactory) -> None:
    policy = make_policy({'tables = ["adult", "visits", "occupation_groups"]':
                          'tables = ["adult", "occupation_groups"]'})
    with Engine.from_path(policy) as engine, pytest.raises(errors.PrivacyViolation):
        engine.session("alice").execute(HISTOGRAM)
