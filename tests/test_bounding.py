"""Contribution bounding by per-(unit, group) aggregation, on real DuckDB and PostgreSQL.

`rewrite._bounded_pairs` replaces the window sort over all rows by one hash aggregation
per (unit, group) pair: LEAST(COUNT(*), max_rows) and LEAST(COUNT(v), max_rows) for counts;
for SUM, the pair's total clamped to max_rows × the bounds; for the sums inside AVG, the
plain SUM where the pair has at most max_rows values, else max_rows × their mean (rounded
for whole-number statistics); and a salted-hash choice of each unit's groups
(tests/test_bounding_duckdb.py covers DuckDB's per-unit path for max_groups = 1). These
tests read the exact, pre-noise statistics through `rewrite()` + `backend.run_aggregate()`
and check:

* on hand-built data where every unit exceeds the bounds, the bounded statistics equal
  their closed-form values exactly;
* a unit with 50 rows moves no statistic by more than the plan's declared sensitivity:
  table `h` holds it plus light units that never reach a bound, table `h0` the same
  light units alone, so the difference of the two answers is that unit's contribution.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import chi2

from dpproxy.backends import Backend
from dpproxy.policy import Policy, load_policy
from dpproxy.rewrite import rewrite
from tests.exact import assert_within_bounds, exact_rows, plan_for
from tests.tables import backend_section, database_fixtures

ANALYST = "bob"  # the analyst of this file's policy

MAX_ROWS, MAX_GROUPS, UPPER = 2, 2, 100
GROUPS = "abcde"
HEAVY_ROWS = 50

POLICY = """
[backend]
BACKEND

[ledger]
path = "bounding.ledger.sqlite"

[audit]
path = "bounding.audit.jsonl"

[privacy]
default_epsilon = 1.0

TABLES

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["e", "f", "h", "h0", "u"]
"""

TABLE = """
[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = 2
max_groups_per_unit = 2

[tables.NAME.columns]
uid = { type = "int", nullable = false }
g = { type = "text", public_values = ["a", "b", "c", "d", "e"] }
v = { type = "int", lower = 0, upper = 100 }
x = { type = "float", lower = 0, upper = 100 }
"""


def even_rows() -> list[tuple[Any, ...]]:
    """Units 1..100: 5 rows, one in each group; units 101..150: 5 rows, all in group a.
    v = 10 everywhere; x = the row's index within its unit."""
    rows = [(u, GROUPS[j], 10, float(j)) for u in range(1, 101) for j in range(5)]
    rows += [(u, "a", 10, float(j)) for u in range(101, 151) for j in range(5)]
    return rows


def light_rows() -> list[tuple[Any, ...]]:
    """Units 1..200 with 1 or 2 rows, all in one group: no bound ever binds for them, so
    bounding keeps all their rows whatever the salt and the random draws."""
    rows = []
    for u in range(1, 201):
        for j in range(1 + u % 2):
            rows.append((u, GROUPS[u % 5], u % 101, float((u + j) % 100)))
    return rows


def heavy_rows() -> list[tuple[Any, ...]]:
    """Unit 0: 50 rows, 10 in each group; v = 100 except NULL on every 7th row; x = j."""
    return [(0, GROUPS[j % 5], None if j % 7 == 0 else UPPER, float(j))
            for j in range(HEAVY_ROWS)]


def fraction_rows() -> list[tuple[Any, ...]]:
    """Units 1..10: 3 rows in group a, v = 1, 1, 2 and x = 0.5, 0.5, 1.0, and a fourth
    row with v and x NULL: AVG's kept sums are 2 × a mean of 4/3 and 2/3."""
    return [(u, "a", v, x) for u in range(1, 11)
            for v, x in ((1, 0.5), (1, 0.5), (2, 1.0), (None, None))]


UNEVEN_UNITS = 1500


def uneven_group_rows() -> list[tuple[Any, ...]]:
    """Units 0..1499 with 1 row in group a, 2 in b and 3 in c: each keeps 2 of its 3 groups
    (max_groups = 2), and which one it drops must be uniform, not weighted by rows."""
    return [(u, g, 1, 1.0) for u in range(UNEVEN_UNITS) for g, n in (("a", 1), ("b", 2),
                                                                     ("c", 3)) for _ in range(n)]


TABLES = {"e": even_rows(), "h": heavy_rows() + light_rows(), "h0": light_rows(),
          "f": fraction_rows(), "u": uneven_group_rows()}


COLUMNS = "uid INTEGER NOT NULL, g TEXT, v INTEGER, x DOUBLE PRECISION"


duckdb_file, postgres_dsn = database_fixtures(
    "bounding", {name: (COLUMNS, rows) for name, rows in TABLES.items()})


@pytest.fixture(params=["duckdb", "postgres"])
def policy(request: pytest.FixtureRequest, tmp_path: Path) -> Policy:
    backend = backend_section(request)
    tables = "\n".join(TABLE.replace("NAME", name) for name in TABLES)
    file = tmp_path / "bounding.toml"
    file.write_text(POLICY.replace("BACKEND", backend).replace("TABLES", tables))
    return load_policy(file)


# -- exact values on hand-built data ----------------------------------------------------------

def test_every_unit_over_the_row_bound_keeps_exactly_max_rows(policy: Policy,
                                                              backend: Backend) -> None:
    """150 units of 5 rows each, max_rows = 2: COUNT(*) = COUNT(v) = 2·150 = 300 exactly;
    SUM(v) keeps each unit's total 50, below 2 × the upper bound 100: 7500; AVG(v)'s sum
    keeps 2 × the mean 10 per unit (it stays in proportion to the count): 3000.
    COUNT(DISTINCT uid) is not bounded by rows: 150."""
    plan = plan_for(policy, "SELECT COUNT(*), COUNT(v), SUM(v), COUNT(DISTINCT uid), AVG(v) "
                            "FROM e", analyst=ANALYST)
    avg_sum = [m.statistic for m in plan.measurements].index(
        next(m.statistic for m in plan.measurements if m.statistic.center))
    for _ in range(3):
        got = exact_rows(backend, plan)[()]
        assert got[:4] == (300.0, 300.0, 7500.0, 150.0)
        assert got[avg_sum] == 300 * (10 - 50)  # AVG sums values minus the centre 50


def test_distinct_count_keeps_max_rows_rows_of_each_unit(policy: Policy,
                                                         backend: Backend) -> None:
    """COUNT(DISTINCT uid·10 + x) counts each kept row once (x = 0..4 within a unit): 150
    units keep 2 rows each, 300; per group as COUNT(*) per group, adding up to 300 again.
    COUNT(DISTINCT g) is 5: units 1..100 each keep 2 of their 5 groups' rows at random, so
    a group is missed by all of them with probability (6/10)^100 < 1e-22."""
    plan = plan_for(policy, "SELECT COUNT(DISTINCT uid * 10 + x), COUNT(DISTINCT g) FROM e",
                    analyst=ANALYST)
    assert [exact_rows(backend, plan)[()] for _ in range(3)] == [(300.0, 5.0)] * 3
    grouped = plan_for(policy, "SELECT g, COUNT(DISTINCT uid * 10 + x), COUNT(*) FROM e "
                               "GROUP BY g", analyst=ANALYST)
    for _ in range(3):
        got = exact_rows(backend, grouped)
        assert all(d == c for d, c in got.values())
        assert sum(d for d, _ in got.values()) == 300
        assert got[("a",)][0] >= 100


def test_sum_over_the_row_bound_is_the_total_clamped_to_max_rows_bounds(
        policy: Policy, backend: Backend) -> None:
    """SUM(x) with x = 0..4 per unit keeps each unit's total 10 (below 2 × 100) for each
    of 150 units: 1500, every time (no rows are drawn); the heavy unit of table h, 50 rows
    of x = 0..49 (total 1225), adds 2 × 100 = 200 to the light units' sum."""
    plan = plan_for(policy, "SELECT SUM(x) FROM e", analyst=ANALYST)
    assert [exact_rows(backend, plan)[()][0] for _ in range(3)] == [1500.0] * 3
    light = exact_rows(backend, plan_for(policy, "SELECT SUM(x) FROM h0", analyst=ANALYST))
    heavy = exact_rows(backend, plan_for(policy, "SELECT SUM(x) FROM h", analyst=ANALYST))
    assert heavy[()][0] - light[()][0] == 2 * UPPER


def test_scaled_sum_counts_values_and_rounds_whole_numbers(policy: Policy,
                                                          backend: Backend) -> None:
    """10 units of 3 values and a NULL: AVG's mean is over the values (the NULL row is not
    a value), and its whole-number sum of v − 50 rounds each unit's 2 × (4/3 − 50) to
    −97 (−970, not −973.3) while its sum of x − 50 keeps 2 × (2/3 − 50) (−986.7). SUM
    keeps the totals, 4 and 2 per unit. COUNT(*) keeps 2 of 4 rows, COUNT(v) 2 of 3."""
    plan = plan_for(policy, "SELECT AVG(v), AVG(x), SUM(v), SUM(x), COUNT(*) FROM f",
                    analyst=ANALYST)
    got, = exact_rows(backend, plan).values()
    names = [m.statistic.describe() for m in plan.measurements]
    v, x = got[names.index("SUM(clamp(v, 0, 100) - 50)")], \
        got[names.index("SUM(clamp(x, 0, 100) - 50)")]
    totals = got[names.index("SUM(clamp(v, 0, 100))")], got[names.index("SUM(clamp(x, 0, 100))")]
    assert (v, totals) == (-970.0, (40.0, 20.0))
    assert (got[names.index("COUNT(*)")], got[names.index("COUNT(v)")]) == (20.0, 20.0)
    # x sums in fixed point (`Statistic.fixed_point_bits`): each pair's 2 × (2/3 − 50)
    # rounds to a multiple of 2^-bits
    bits = plan.measurements[names.index("SUM(clamp(x, 0, 100) - 50)")].statistic \
        .fixed_point_bits
    assert bits is not None
    assert x == pytest.approx(10 * 2 * (2 / 3 - 50), abs=10 * math.ldexp(1, -bits))


def test_every_unit_over_the_group_bound_keeps_exactly_max_groups(policy: Policy,
                                                                  backend: Backend) -> None:
    """Units 1..100 have one row in each of 5 groups (max_groups = 2): 2 rows each;
    units 101..150 have 5 rows in group a (max_rows = 2): 2 rows each. So the counts over
    all groups add up to 300 exactly, group a holds at least 100, and COUNT(DISTINCT uid)
    adds up to 2·100 + 50 = 250. SUM(v) keeps 2 groups' v = 10 of units 1..100 and the
    whole total 50 (below 2 × 100) of units 101..150: 4500."""
    plan = plan_for(policy, "SELECT g, COUNT(*), SUM(v), COUNT(DISTINCT uid) FROM e "
                   "GROUP BY g", analyst=ANALYST)
    seen = set()
    for _ in range(3):
        got = exact_rows(backend, plan)
        assert set(got) <= {(g,) for g in GROUPS}
        assert sum(c for c, _, _ in got.values()) == 300
        assert sum(s for _, s, _ in got.values()) == 100 * 2 * 10 + 50 * 5 * 10
        assert sum(u for _, _, u in got.values()) == 250
        assert got[("a",)][0] >= 100
        seen.add(tuple(sorted(got.items())))
    # the salt changes which groups the units keep: 3 identical draws for 100 units choosing
    # 2 of 5 groups each have probability 10^-200
    assert len(seen) > 1


def test_dropped_group_is_uniform_over_the_units_groups(policy: Policy,
                                                        backend: Backend) -> None:
    """1500 units with 1, 2 and 3 rows in groups a, b, c keep 2 groups each, chosen by the
    salted hash: the group each drops is Multinomial(1500; 1/3, 1/3, 1/3), so the units
    missing from each group are too. A chi-square statistic over 3 cells (2 degrees of
    freedom) exceeds its 1 - 1e-6 quantile with probability 1e-6, treating the salted
    hash as ideal randomness; a choice weighted by rows fails it by far."""
    plan = plan_for(policy, "SELECT g, COUNT(DISTINCT uid) FROM u GROUP BY g",
                    analyst=ANALYST)
    got = exact_rows(backend, plan)
    dropped = [UNEVEN_UNITS - got[(g,)][0] for g in "abc"]
    assert sum(dropped) == UNEVEN_UNITS
    expected = UNEVEN_UNITS / 3
    statistic = sum((n - expected) ** 2 / expected for n in dropped)
    assert statistic < chi2.isf(1e-6, df=2), dropped


# -- a unit with 50 rows moves each statistic by at most its sensitivity --------------------

QUERIES = [
    "SELECT COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE",
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE "
    "GROUP BY g",
    "SELECT g, SUM(x) FROM TABLE WHERE x > 10 GROUP BY g",
    # distinct counts bound by rows drawn at random (`rewrite._ranked_rows`); each row's
    # value uid·1000 + x is its own, so unit 0's kept rows are all new values
    "SELECT COUNT(DISTINCT uid * 1000 + x), COUNT(DISTINCT g), COUNT(*) FROM TABLE",
    "SELECT g, COUNT(DISTINCT uid * 1000 + x), COUNT(v) FROM TABLE GROUP BY g",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_heavy_unit_moves_no_answer_beyond_its_bound(policy: Policy, backend: Backend,
                                                     sql: str) -> None:
    """Unit 0 has 50 rows, 10 per group. Light units never reach a bound, so the answer
    on h minus the answer on h0 (the same rows without unit 0) is exactly what unit 0
    contributes after bounding: per measurement, the sum over groups of its absolute
    value is at most the plan's L1 sensitivity, no group moves by more than max_rows
    rows' worth, and at most max_groups groups move at all."""
    plan = plan_for(policy, sql.replace("TABLE", "h"), analyst=ANALYST)
    without_plan = plan_for(policy, sql.replace("TABLE", "h0"), analyst=ANALYST)
    without = exact_rows(backend, without_plan)
    assert exact_rows(backend, without_plan) == without  # light units: no randomness at all
    for _ in range(10):
        changes = assert_within_bounds(plan, exact_rows(backend, plan), without, MAX_ROWS,
                                       MAX_GROUPS)
        for measurement, change in zip(plan.measurements, changes, strict=True):
            if measurement.statistic.kind == "count" and measurement.statistic.argument \
                    is None:
                # unit 0 has ≥ 10 rows in every group: COUNT(*)'s bound is met exactly,
                # in 1 group without GROUP BY (COUNT(v) may keep a NULL row on PostgreSQL)
                groups = MAX_GROUPS if plan.analysis.keys else 1
                assert sum(change.values()) == MAX_ROWS * groups
            if measurement.statistic.describe().startswith("COUNT(DISTINCT uid * 1000"):
                # max_rows of unit 0's 50 distinct values in each kept group: the bound,
                # met exactly (a draw keeping more rows, or fewer, fails here)
                groups = MAX_GROUPS if plan.analysis.keys else 1
                assert sum(change.values()) == MAX_ROWS * groups
                assert measurement.sensitivity == MAX_ROWS * groups


def test_heavy_unit_moves_a_mode_histogram_by_its_bound(policy: Policy, backend: Backend
                                                        ) -> None:
    """MODE reads per group a histogram of v (one bin per integer 0-100), bounded by rows
    drawn at random as quantiles are: unit 0's 50 rows (10 per group, v = 100 but for a
    NULL every 7th row) add at most max_rows rows to at most max_groups groups'
    histograms, over 10 fresh salts; without bounding they would add 8 or 9 per group."""
    from dpproxy.quantiles import decode_histogram

    def histograms(table: str) -> dict[Any, tuple[int, ...]]:
        plan = plan_for(policy, f"SELECT g, MODE() WITHIN GROUP (ORDER BY v) FROM {table} "
                                "GROUP BY g", analyst=ANALYST)
        spec = plan.measurements[0].quantile
        assert spec is not None and spec.mode and spec.binning.bins == UPPER + 1
        rewritten = rewrite(plan, backend.dialect)
        return {row[0]: decode_histogram(row[1], spec.binning.bins)
                for row in backend.run_aggregate(rewritten.sql, rewritten.parameters())}

    without = histograms("h0")
    moved = 0
    for _ in range(10):
        got = histograms("h")
        changes = {g: [a - b for a, b in zip(got[g], without.get(g, (0,) * len(got[g])),
                                               strict=True)] for g in got}
        assert all(c >= 0 for change in changes.values() for c in change)
        assert all(sum(change) <= MAX_ROWS for change in changes.values())
        assert sum(1 for change in changes.values() if any(change)) <= MAX_GROUPS
        assert all(c == 0 for change in changes.values() for c in change[:UPPER])
        moved += sum(sum(change) for change in changes.values())
    assert moved > 0  # unit 0's rows do reach the histograms
