"""Partition selection by the released COUNT(*) (`selection.count_selection`), on real DuckDB
and PostgreSQL.

A query that releases COUNT(*) under Laplace noise may threshold that noisy count rather
than a second noisy count of units: no share of ε goes to selection, so the count's noise
is smaller, and the backend computes no count of distinct units. These tests show the
threshold's tail bound against the noise's own mass function, which plans take it, that a
released count is the very draw that was thresholded, that a group held by one unit (even
one with 50 rows) is not released, and that switching modes in a session never reuses a
statement of the other layout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from dpproxy import errors
from dpproxy.analyze import Analysis, analyze
from dpproxy.mechanisms import calibrate
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import Policy, load_policy
from dpproxy.rewrite import rewrite
from dpproxy.selection import (
    count_selection,
    effective_threshold,
    per_group_delta,
    single_unit_release_probability,
)
from dpproxy.session import Engine
from tests.tables import Tables, backend_section, database_fixtures

MAX_ROWS = 10
EPSILON, DELTA = 1.0, 1e-9

POLICY = """
[backend]
BACKEND

[ledger]
path = "count-selection.ledger.sqlite"

[audit]
path = "count-selection.audit.jsonl"

[tables.s]
privacy_unit = "uid"
max_rows_per_unit = 10
max_groups_per_unit = 1

[tables.s.columns]
uid = { type = "int", nullable = false }
c = { type = "text" }
v = { type = "int", lower = 0, upper = 100, nullable = false }
w = { type = "int", lower = 0, upper = 100 }

[tables.r1]
privacy_unit = "uid"
max_rows_per_unit = 1
max_groups_per_unit = 1

[tables.r1.columns]
uid = { type = "int", nullable = false }
c = { type = "text" }

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["s", "r1"]
"""


def s_rows() -> list[tuple[Any, ...]]:
    """Groups of private key c (values of v all 7):
    big0..4: 300 units × 2 rows, released in either mode;
    mid0..9: 210 units × 1 row, about the rows threshold (≈ 210 at ε = 1, δ = 1e-9);
    few0..4: 6 units × 10 rows, 60 rows but 6 units: never released by units;
    solo0..19: one unit with 50 rows (bounded to 10): never released."""
    rows: list[tuple[Any, ...]] = []
    uid = 0

    def units(group: str, count: int, each: int) -> None:
        nonlocal uid
        for _ in range(count):
            uid += 1
            rows.extend((uid, group, 7, 7) for _ in range(each))

    for i in range(5):
        units(f"big{i}", 300, 2)
    for i in range(10):
        units(f"mid{i}", 210, 1)
    for i in range(5):
        units(f"few{i}", 6, 10)
    for i in range(20):
        units(f"solo{i}", 1, 50)
    return rows


COLUMNS = "uid INTEGER NOT NULL, c TEXT, v INTEGER NOT NULL, w INTEGER"


TABLES: Tables = {"s": (COLUMNS, s_rows()), "r1": ("uid INTEGER NOT NULL, c TEXT", [])}


duckdb_file, postgres_dsn = database_fixtures("count-selection", TABLES)


@pytest.fixture(params=["duckdb", "postgres"])
def policy_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    file = tmp_path / "count-selection.toml"
    file.write_text(POLICY.replace("BACKEND", backend_section(request)))
    return file


@pytest.fixture
def plain_policy(tmp_path: Path) -> Policy:
    """The policy for planning alone (no data is read)."""
    file = tmp_path / "plan.toml"
    file.write_text(POLICY.replace("BACKEND", 'kind = "duckdb"\npath = "unused.duckdb"'))
    return load_policy(file)


def analysis_of(policy: Policy, sql: str) -> Analysis:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    result = analyze(ast, policy, policy.analyst("bob"))
    assert isinstance(result, Analysis)
    return result


def plan(policy: Policy, sql: str, selection: str = "rows", **options: Any) -> QueryPlan:
    return plan_query(analysis_of(policy, sql), QueryOptions(
        options.pop("epsilon", EPSILON), options.pop("delta", DELTA),
        options.pop("mechanism", "laplace"), selection=selection, **options))  # type: ignore[arg-type]


# -- the threshold ------------------------------------------------------------------------------

def tail_by_summation(t: float, m: int) -> float:
    """P(Z ≥ m) for the discrete Laplace of scale t, summing its mass function e^{−|x|/t}
    (to where the terms vanish) rather than using the closed form."""
    reach = m + int(60 * t) + 10
    upper = math.fsum(math.exp(-x / t) for x in range(m, reach))
    total = 1 + 2 * math.fsum(math.exp(-x / t) for x in range(1, int(60 * t) + 10))
    return upper / total


@pytest.mark.parametrize(("epsilon", "delta", "k", "max_rows"), [
    (1.0, 1e-6, 1, 5), (0.1, 1e-9, 1, 1), (2.0, 1e-5, 3, 10), (0.5, 1e-7, 2, 3),
])
def test_threshold_is_the_least_that_bounds_a_single_unit(
        epsilon: float, delta: float, k: int, max_rows: int) -> None:
    """One unit adds at most max_rows rows to each of its k groups: a group it alone holds is
    released with probability P(max_rows + Z ≥ T) ≤ δ' (δ for its k groups together), and
    T is the least threshold that does so."""
    noise = calibrate("laplace", float(k * max_rows), epsilon, integer_valued=True,
                      changed_outputs=k)
    spec = count_selection(noise, delta, k, max_rows, 0)
    target = per_group_delta(delta, k)
    t = float(noise.grid_param)
    margin = spec.threshold - max_rows
    assert tail_by_summation(t, margin) <= target * (1 + 1e-9)
    assert tail_by_summation(t, margin - 1) > target
    assert single_unit_release_probability(spec) == pytest.approx(
        tail_by_summation(t, margin), rel=1e-9)
    assert 1 - (1 - single_unit_release_probability(spec)) ** k <= delta * (1 + 1e-9)
    assert (spec.epsilon, spec.measurement, spec.unit_rows) == (0.0, 0, max_rows)


def test_a_gaussian_count_is_refused() -> None:
    noise = calibrate("gaussian", 5.0, 1.0, 1e-6, integer_valued=True)
    with pytest.raises(ValueError, match="Laplace"):
        count_selection(noise, 1e-6, 1, 5, 0)


# -- plans --------------------------------------------------------------------------------------

def test_rows_mode_gives_selection_no_share(plain_policy: Policy) -> None:
    sql = "SELECT c, COUNT(*), SUM(v) FROM s GROUP BY c"
    rows, units = plan(plain_policy, sql, "rows"), plan(plain_policy, sql, "units")
    assert rows.selection is not None and units.selection is not None
    assert rows.selection.measurement == 0 and units.selection.measurement is None
    # two noisy statistics share ε; by units a third share goes to selection
    assert [m.noise.epsilon for m in rows.measurements if m.noise] == [0.5, 0.5]
    assert [m.noise.epsilon for m in units.measurements if m.noise] == \
        pytest.approx([1 / 3, 1 / 3])
    assert rows.selection.noise == rows.measurements[0].noise
    assert rows.selection.threshold == count_selection(
        rows.measurements[0].noise, DELTA, 1, MAX_ROWS, 0).threshold
    # the same (ε, δ) charged; in zCDP the selection adds no ρ of its own, all δ outside
    assert rows.cost == units.cost and rows.cost.epsilon == EPSILON
    assert rows.cost.delta == DELTA
    assert rows.loss.rho == pytest.approx(2 * 0.5 ** 2 / 2)
    assert rows.loss.zcdp_delta == DELTA
    # the backend computes no count of units
    assert not rewrite(rows).unit_counts and rewrite(units).unit_counts
    assert "units_for_selection" not in rewrite(rows).sql
    assert "units_for_selection" in rewrite(units).sql


@pytest.mark.parametrize(("sql", "options", "why"), [
    ("SELECT c, SUM(v) FROM s GROUP BY c", {}, "no COUNT(*)"),
    ("SELECT c, COUNT(w) FROM s GROUP BY c", {}, "a count of a nullable column"),
    ("SELECT c, COUNT(*) FROM s GROUP BY c", {"mechanism": "gaussian"}, "Gaussian noise"),
    ("SELECT c, COUNT(*) FROM s GROUP BY c", {"min_units_per_group": 5}, "a floor on units"),
])
def test_rows_mode_falls_back_to_units(plain_policy: Policy, sql: str,
                                       options: dict[str, Any], why: str) -> None:
    planned = plan(plain_policy, sql, "rows", **options)
    assert planned.selection is not None and planned.selection.measurement is None, why


def test_avg_of_a_column_never_null_selects_by_its_count(plain_policy: Policy) -> None:
    planned = plan(plain_policy, "SELECT c, AVG(v) FROM s GROUP BY c", "rows")
    assert planned.selection is not None and planned.selection.measurement == 1
    assert planned.measurements[1].statistic.describe() == "COUNT(*)"


def test_auto_takes_rows_only_at_one_row_per_unit(plain_policy: Policy) -> None:
    one_row = plan(plain_policy, "SELECT c, COUNT(*) FROM r1 GROUP BY c", "auto")
    assert one_row.selection is not None and one_row.selection.measurement == 0
    by_units = plan(plain_policy, "SELECT c, COUNT(*) FROM r1 GROUP BY c", "units")
    assert by_units.selection is not None
    assert one_row.selection.threshold <= effective_threshold(by_units.selection)
    assert one_row.measurements[0].noise.scale < by_units.measurements[0].noise.scale
    many_rows = plan(plain_policy, "SELECT c, COUNT(*) FROM s GROUP BY c", "auto")
    assert many_rows.selection is not None and many_rows.selection.measurement is None


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(errors.InvalidParameterValue, match="selection"):
        QueryOptions(1.0, 1e-6, "laplace", selection="groups")  # type: ignore[arg-type]


# -- end to end ---------------------------------------------------------------------------------

def released(engine: Engine, sql: str, selection: str, runs: range) -> list[dict[str, int]]:
    """One session; each run a new text (WHERE v >= -i): a new answer, the same shape."""
    session = engine.session("bob", epsilon=EPSILON, delta=DELTA)
    session.execute(f"SET dpproxy.selection = '{selection}'")
    answers = []
    for i in runs:
        result = session.execute(sql.replace("WHERE", f"WHERE v >= {-i} AND"))
        assert result.cost is not None and result.cost.epsilon == EPSILON  # a new release
        answers.append({str(row[0]): int(row[1]) for row in result.rows})
    return answers


SQL = "SELECT c, COUNT(*) FROM s WHERE v = 7 GROUP BY c"


def test_rows_then_units_then_rows_in_one_engine(policy_file: Path) -> None:
    """Across modes: each answer comes from a statement of its own layout.

    Chance of a false failure: a solo group is released with probability ≤ δ = 1e-9 per
    run (20 of them, 7 runs: ≤ 1.4e-7); a few-units group by units with P(6 + Z ≥ T) for
    Laplace noise of scale 2 and T ≥ 40, ≤ e^{-17}/2 < 3e-8 (5 groups, 3 runs: < 5e-7); a
    big group is missed with probability below 1e-100."""
    with Engine.from_path(policy_file) as engine:
        planned = plan(engine.policy, SQL, "rows")
        assert planned.selection is not None
        threshold = planned.selection.threshold
        by_units = plan(engine.policy, SQL, "units").selection
        assert by_units is not None and effective_threshold(by_units) >= 40
        first = released(engine, SQL, "rows", range(3))
        middle = released(engine, SQL, "units", range(3, 6))
        last = released(engine, SQL, "rows", range(6, 7))
    for answer in first + last:
        assert {f"big{i}" for i in range(5)} <= set(answer)
        assert not any(k.startswith("solo") for k in answer)
        # the released count is the draw that cleared the threshold
        assert all(n >= threshold for n in answer.values()), (threshold, answer)
        for i in range(5):
            assert abs(answer[f"big{i}"] - 600) < 400
    for answer in middle:
        assert {f"big{i}" for i in range(5)} | {f"mid{i}" for i in range(10)} <= set(answer)
        assert not any(k.startswith(("solo", "few")) for k in answer)
    # about half the mid groups clear the rows threshold: the check above bit on some
    assert any(k.startswith("mid") for answer in first + last for k in answer)


def test_explain_says_how_groups_are_selected(policy_file: Path) -> None:
    with Engine.from_path(policy_file) as engine:
        session = engine.session("bob", epsilon=EPSILON, delta=DELTA)
        session.execute("SET dpproxy.selection = 'rows'")
        rows = "\n".join(r[0] for r in session.execute("EXPLAIN " + SQL).rows)
        session.execute("SET dpproxy.selection = 'units'")
        units = "\n".join(r[0] for r in session.execute("EXPLAIN " + SQL).rows)
        assert session.execute("SHOW dpproxy.selection").rows == [("units",)]
        with pytest.raises(errors.InvalidParameterValue):
            session.execute("SET dpproxy.selection = 'everything'")
    assert "when its released COUNT(*) reaches" in rows
    assert "selection takes no ε" in rows and "split evenly over 1 noisy" in rows
    assert "noisy count of distinct units" in units
    assert "split evenly over 1 noisy statistic(s) and partition selection" in units


def test_the_policy_sets_the_default(tmp_path: Path) -> None:
    file = tmp_path / "rows.toml"
    text = POLICY.replace("BACKEND", 'kind = "duckdb"\npath = "unused.duckdb"')
    file.write_text(text.replace("[tables.s]\n", '[privacy]\nselection = "rows"\n\n[tables.s]\n'))
    assert load_policy(file).privacy.selection == "rows"
    file.write_text(text.replace("[tables.s]\n", '[privacy]\nselection = "some"\n\n[tables.s]\n'))
    with pytest.raises(errors.InvalidPolicy, match=r"privacy\.selection"):
        load_policy(file)
