"""Real-valued sums are computed exactly, in fixed point, on real DuckDB and PostgreSQL.

A floating-point sum of n values errs by up to about n·2^-53·Σ|x|, and the error depends
on the values and their order, so two neighbouring tables can differ by more than the
sensitivity the noise is calibrated for. The rewrite sums each clamped value as the
integer round(v · 2^k) (`Statistic.fixed_point_bits`) instead; these tests check that
the backend's sum is exactly that integer sum, on data where a DOUBLE sum is not exact.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest

from dpproxy.backends import Backend
from dpproxy.policy import Policy, load_policy
from tests.exact import exact_rows, plan_for
from tests.tables import backend_section, database_fixtures

POLICY = """
[backend]
BACKEND

[ledger]
path = "fixed.ledger.sqlite"

[tables.f]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 1

[tables.f.columns]
uid = { type = "int", nullable = false }
g = { type = "text", public_values = ["a", "b"] }
x = { type = "float", lower = 0, upper = 1 }

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["f"]
"""

# 0.1, 0.2, 0.7 are not dyadic, so every DOUBLE partial sum rounds; unit 0 has 5 rows,
# whose total 3.5 is over max_rows × upper = 3
ROWS = [(u, "ab"[u % 2], (0.1, 0.2, 0.7)[u % 3]) for u in range(1, 12_001)] + \
       [(0, "a", 0.7)] * 5
TABLES = {"f": ("uid INTEGER NOT NULL, g TEXT, x DOUBLE PRECISION", ROWS)}


duckdb_file, postgres_dsn = database_fixtures("fixed", TABLES)


@pytest.fixture(params=["duckdb", "postgres"])
def policy(request: pytest.FixtureRequest, tmp_path: Path) -> Policy:
    file = tmp_path / "fixed.toml"
    file.write_text(POLICY.replace("BACKEND", backend_section(request)))
    return load_policy(file)


def fixed(value: float, bits: int) -> int:
    """The row's value as the backend sums it: round(v · 2^bits), half to even."""
    return round(Fraction(value) * 2**bits)


def test_real_sum_is_the_exact_fixed_point_sum(policy: Policy, backend: Backend) -> None:
    plan = plan_for(policy, "SELECT g, SUM(x), AVG(x) FROM f GROUP BY g", analyst="bob")
    total = plan.measurements[0]
    c, centred = next((i, m) for i, m in enumerate(plan.measurements) if m.statistic.center)
    bits = total.statistic.fixed_point_bits
    # largest values 1 and 0.5 (AVG's sum is centred on 0.5): 2^39 and 2^40 units each
    assert bits == 40 - 1 and centred.statistic.fixed_point_bits == 40 - 0
    got = exact_rows(backend, plan)
    for group in "ab":
        rows = [x for u, g, x in ROWS if g == group and u != 0]
        # unit 0: SUM keeps its total clamped to 3 × upper, AVG 3 × its mean
        clamped = 3 * 2**bits if group == "a" else 0
        heavy = [0.7] * 3 if group == "a" else []
        exact = sum(fixed(x, bits) for x in rows) + clamped
        assert got[(group,)][0] == math.ldexp(float(exact), -bits)  # exactly
        # the data exercises rounding: a plain DOUBLE sum of these values is not exact
        assert math.fsum(rows) != sum(rows) or sum(rows) != sum(reversed(rows))
        centre = centred.statistic.center
        assert got[(group,)][c] == math.ldexp(float(sum(
            fixed(x - centre, centred.statistic.fixed_point_bits or 0)
            for x in rows + heavy)), -(centred.statistic.fixed_point_bits or 0))


def test_a_unit_over_the_bound_adds_max_rows_in_fixed_point(policy: Policy,
                                                            backend: Backend) -> None:
    """Unit 0's 5 rows of 0.7 add up to 3.5: SUM keeps 3 × the upper bound 1, exactly
    3 · 2^bits fixed-point units; AVG's sum (centred on 0.5) keeps 3 × their mean,
    rounded to a fixed-point integer once per pair. Both stay integer sums."""
    plan = plan_for(policy, "SELECT SUM(x), AVG(x) FROM f WHERE uid = 0", analyst="bob")
    total, centred = plan.measurements[0].statistic, plan.measurements[1].statistic
    assert total.fixed_point_bits is not None and centred.fixed_point_bits is not None
    (got,) = exact_rows(backend, plan).values()
    assert got[0] == 3.0
    bits = centred.fixed_point_bits
    assert got[1] == math.ldexp(float(round(Fraction(fixed(0.7 - 0.5, bits) * 5 * 3, 5))),
                                -bits)
