"""Integer-valued sums whose declared bounds are not whole numbers, on real DuckDB and
PostgreSQL.

The rewrite rounds each clamped value of an integer-valued sum, so that the noise, which
is calibrated for whole numbers, sees one. A column declared `int` with bounds 0.5–11.5
would clamp 12 to 11.5 and round it back to 12 (on both engines: DuckDB rounds halves
away from zero, PostgreSQL to even): above the bound the sensitivity was computed from.
So the analyzer widens such bounds to whole numbers (0–12), and these tests check, from
the exact pre-noise statistics, that a unit over every bound moves no statistic by more
than the plan's sensitivity.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpproxy.backends import Backend, open_backend
from dpproxy.policy import Policy, load_policy
from tests.exact import assert_within_bounds, exact_rows, plan_for
from tests.tables import backend_section, database_fixtures

MAX_ROWS = 2
POLICY = f"""
[backend]
BACKEND

[ledger]
path = "whole.ledger.sqlite"

[privacy]
default_epsilon = 1.0

[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = {MAX_ROWS}
max_groups_per_unit = 1

[tables.NAME.columns]
uid = {{ type = "int", nullable = false }}
h = {{ type = "int", lower = 0.5, upper = 11.5 }}

[analysts.bob]
budget = {{ epsilon = 1e9, delta = 0.5 }}
tables = ["NAME"]
"""

COLUMNS = "uid INTEGER NOT NULL, h INTEGER"
LIGHT = [(u, u % 11 + 1) for u in range(1, 23)]  # one row each, within 1..11
HEAVY = [(0, 12)] * 5  # unit 0: 5 rows of 12, above the upper bound
TABLES = {"w": (COLUMNS, HEAVY + LIGHT), "w0": (COLUMNS, LIGHT)}


duckdb_file, postgres_dsn = database_fixtures("whole", TABLES)


@pytest.fixture(params=["duckdb", "postgres"])
def policies(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Policy]:
    backend = backend_section(request)
    out = {}
    for name in TABLES:
        file = tmp_path / f"{name}.toml"
        file.write_text(POLICY.replace("BACKEND", backend).replace("NAME", name))
        out[name] = load_policy(file)
    return out


@pytest.fixture
def backend(policies: dict[str, Policy]) -> Iterator[Backend]:
    opened = open_backend(policies["w"])
    yield opened
    opened.close()


@pytest.mark.parametrize("sql", ["SELECT SUM(h) FROM TABLE", "SELECT AVG(h) FROM TABLE",
                                 "SELECT VAR_POP(h) FROM TABLE"])
def test_unit_over_non_whole_bounds_moves_no_sum_beyond_its_sensitivity(
        policies: dict[str, Policy], backend: Backend, sql: str) -> None:
    """Unit 0 adds 2 rows' worth of 12 (clamped and rounded); the light units never reach
    a bound. Every measurement's change stays within the plan's sensitivity, and the
    sum's is exactly 2 × 12, which 2 × 11.5 would not cover."""
    plan = plan_for(policies["w"], sql.replace("TABLE", "w"), analyst="bob")
    without = exact_rows(backend, plan_for(policies["w0"], sql.replace("TABLE", "w0"),
                                           analyst="bob"))
    changes = assert_within_bounds(plan, exact_rows(backend, plan), without, MAX_ROWS, 1)
    sums = [m for m in plan.measurements if m.statistic.kind == "sum"]
    assert (sums[0].statistic.lower, sums[0].statistic.upper) == (0.0, 12.0)
    if sql.startswith("SELECT SUM"):
        assert changes[0][()] == 2 * 12
