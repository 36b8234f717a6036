"""DuckDB's contribution bounding (`rewrite._bounded_pairs`), on real DuckDB.

On DuckDB, with max_groups = 1 and public keys, each unit's group is the least salted hash
of (unit, group code), chosen before any per-group aggregation; a SUM adds each pair's
total clamped to max_rows × the bounds (AVG's sums: every value of a pair with at most
max_rows values and max_rows × their mean for a pair with more).
These tests read the exact, pre-noise statistics through `rewrite()` +
`backend.run_aggregate()` and check:

* a unit with 50 rows in many groups moves no statistic by more than the plan's
  sensitivity, nor more than max_rows rows per group in more than max_groups groups
  (table `h` holds it plus light units that never reach a bound, `h0` the light units
  alone, so the difference of the two answers is that unit's contribution);
* with max_groups = 1, the kept group is uniform over the unit's groups, whatever their
  row counts, and a SUM over a pair with more than max_rows values is its total, clamped
  to max_rows × the bounds;
* when no unit exceeds the bounds, every statistic equals the unbounded one computed by
  plain SQL (counts exactly, sums within float rounding).

Statistical tests use fixed sample sizes and thresholds with a false-failure rate ≤ 1e-6,
treating the salted hash and RANDOM() as ideal randomness.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from scipy.stats import chi2

from dpproxy.backends import Backend, open_backend
from dpproxy.policy import Policy, load_policy
from tests.exact import assert_within_bounds, exact_rows, plan_for

ANALYST = "bob"
GROUPS = "abcde"
KINDS = ("p", "q")  # a second public key, for codes over two keys
HEAVY_ROWS = 50
FALSE_FAILURE = 1e-6

POLICY = """
[backend]
kind = "duckdb"
path = "DB"

[ledger]
path = "bounding.ledger.sqlite"

[audit]
path = "bounding.audit.jsonl"

[privacy]
default_epsilon = 1.0

TABLES

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["h1", "h10", "h2", "h20", "u", "s", "n", "light"]
"""

TABLE = """
[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = ROWS
max_groups_per_unit = GROUPS

[tables.NAME.columns]
uid = { type = "int", nullable = false }
g = { type = "text", public_values = ["a", "b", "c", "d", "e"] }
k = { type = "text", public_values = ["p", "q"] }
w = { type = "text" }
v = { type = "int", lower = 0, upper = 100 }
x = { type = "float", lower = 0, upper = 256 }
"""

# table → (max_rows, max_groups): h1/h10 take the per-unit choice (max_groups = 1), h2/h20
# the general path (pairs ranked by a window); u, s and n test max_groups = 1 choices.
BOUNDS = {"h1": (3, 1), "h10": (3, 1), "h2": (3, 2), "h20": (3, 2), "u": (3, 1),
          "s": (3, 1), "n": (3, 1), "light": (5, 1)}


def light_rows() -> list[tuple[Any, ...]]:
    """Units 1..200 with 1 or 2 rows, all in one (g, k, w) group: no bound ever binds, so
    bounding keeps all their rows whatever the salt and the random draws."""
    return [(u, GROUPS[u % 5], KINDS[u % 2], f"w{u % 3}", u % 101, float((u + j) % 100))
            for u in range(1, 201) for j in range(1 + u % 2)]


def heavy_rows() -> list[tuple[Any, ...]]:
    """Unit 0: 50 rows over 10 (g, k) groups, 5 rows each; w is NULL on every 4th row,
    v = 100 except NULL on every 7th row; x = 200 + j % 50."""
    return [(0, GROUPS[j % 5], KINDS[j // 25], None if j % 4 == 0 else f"w{j % 3}",
             None if j % 7 == 0 else 100, 200.0 + j % 50) for j in range(HEAVY_ROWS)]


UNIFORM_UNITS = 3000


def uneven_group_rows() -> list[tuple[Any, ...]]:
    """Units 0..2999 with 1 row in group a, 3 in b and 6 in c: the kept group must be
    uniform over {a, b, c}, not weighted by rows."""
    return [(u, g, "p", "w", 1, 1.0) for u in range(UNIFORM_UNITS)
            for g, n in (("a", 1), ("b", 3), ("c", 6)) for _ in range(n)]


SAMPLE_UNITS = 250  # one group each: g × k × w give at most 10 public groups, so w
SAMPLE_ROWS = 8  # (private) tells the units apart in the answer


def sample_rows() -> list[tuple[Any, ...]]:
    """Units 0..249, each alone in its group w = 'u<n>', with 8 rows x = 1, 2, 4, …, 128."""
    return [(u, "a", "p", f"u{u}", 1, float(2 ** j)) for u in range(SAMPLE_UNITS)
            for j in range(SAMPLE_ROWS)]


def null_key_rows() -> list[tuple[Any, ...]]:
    """Unit 0: 10 rows with a NULL private key w, x = 1; unit 1: 10 rows with w = 'w0'."""
    return [(u, "a", "p", None if u == 0 else "w0", 1, 1.0) for u in (0, 1) for _ in range(10)]


TABLES = {"h1": heavy_rows() + light_rows(), "h10": light_rows(),
          "h2": heavy_rows() + light_rows(), "h20": light_rows(),
          "u": uneven_group_rows(), "s": sample_rows(), "n": null_key_rows(),
          "light": light_rows()}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bounding_duckdb")
    path = folder / "bounding.duckdb"
    con = duckdb.connect(str(path))
    for name, rows in TABLES.items():
        con.execute(f"CREATE TABLE {name} (uid INTEGER NOT NULL, g VARCHAR, k VARCHAR, "
                    "w VARCHAR, v INTEGER, x DOUBLE)")
        # through a CSV file: executemany inserts tens of thousands of rows slowly
        data = folder / f"{name}.csv"
        with data.open("w", newline="") as out:
            csv.writer(out).writerows(["NULL" if c is None else c for c in r] for r in rows)
        con.execute(f"COPY {name} FROM '{data.as_posix()}' (HEADER false, NULLSTR 'NULL')")
    con.close()
    return path


@pytest.fixture(scope="module")
def policy(database: Path) -> Policy:
    tables = "\n".join(TABLE.replace("NAME", name).replace("ROWS", str(rows))
                       .replace("GROUPS", str(groups)) for name, (rows, groups) in BOUNDS.items())
    file = database.with_suffix(".toml")
    file.write_text(POLICY.replace("DB", database.as_posix()).replace("TABLES", tables))
    return load_policy(file)


@pytest.fixture(scope="module")
def backend(policy: Policy) -> Iterator[Backend]:
    opened = open_backend(policy)
    yield opened
    opened.close()


# -- a unit with 50 rows moves each statistic by at most its bound ---------------------------

QUERIES = [
    "SELECT COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE",
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE "
    "GROUP BY g",
    "SELECT g, k, COUNT(*), SUM(x) FROM TABLE GROUP BY g, k",
    "SELECT k, g, SUM(x), AVG(x) FROM TABLE WHERE x > 10 GROUP BY k, g",
    "SELECT w, COUNT(*), SUM(x) FROM TABLE GROUP BY w",
]


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("tables", [("h1", "h10"), ("h2", "h20")])
def test_heavy_unit_moves_no_answer_beyond_its_bound(policy: Policy, backend: Backend,
                                                     sql: str, tables: tuple[str, str]) -> None:
    """Unit 0 has 50 rows, 5 in each of 10 (g, k) groups (w: 3 values and NULL). The
    answer on h minus the answer on h0 is what unit 0 contributes after bounding: per
    measurement, the sum over groups of its absolute value is at most the plan's L1
    sensitivity, no count moves by more than max_rows, at most max_groups groups move,
    and COUNT(*) moves by max_rows in exactly max_groups groups (every group of unit 0
    has more than max_rows rows, except the w groups, which have at least 4 ≥ 3)."""
    heavy, light = tables
    max_rows, max_groups = BOUNDS[heavy]
    plan = plan_for(policy, sql.replace("TABLE", heavy), analyst=ANALYST)
    without_plan = plan_for(policy, sql.replace("TABLE", light), analyst=ANALYST)
    without = exact_rows(backend, without_plan)
    assert exact_rows(backend, without_plan) == without  # light units: no randomness
    for _ in range(10):
        changes = assert_within_bounds(plan, exact_rows(backend, plan), without, max_rows,
                                       max_groups)
        for measurement, change in zip(plan.measurements, changes, strict=True):
            if measurement.statistic.kind == "count" and measurement.statistic.argument \
                    is None:
                groups = max_groups if plan.analysis.keys else 1
                assert sum(change.values()) == max_rows * groups


def test_heavy_unit_keeps_max_rows_of_one_group(policy: Policy, backend: Backend) -> None:
    """Unit 0's SUM(x) in h1 (max_rows = 3, max_groups = 1) moves exactly one (g, k)
    group, by 3 × the upper bound 256: that group's 5 rows, x = 200 + j % 50 with j ≡ the
    group's offset (mod 5), add up to more; which group varies with the salt."""
    plan = plan_for(policy, "SELECT g, k, SUM(x) FROM h1 GROUP BY g, k", analyst=ANALYST)
    without = exact_rows(backend, plan_for(policy, "SELECT g, k, SUM(x) FROM h10 "
                                           "GROUP BY g, k", analyst=ANALYST))
    chosen = set()
    for _ in range(10):
        got = exact_rows(backend, plan)
        moved = {key: got[key][0] - without.get(key, (0.0,))[0] for key in got
                 if got[key][0] != without.get(key, (0.0,))[0]}
        assert len(moved) == 1
        ((g, k), added), = moved.items()
        rows = [200.0 + j % 50 for j in range(HEAVY_ROWS)
                if GROUPS[j % 5] == g and KINDS[j // 25] == k]
        assert len(rows) == 5 and sum(rows) > 3 * 256
        assert added == 3 * 256
        chosen.add((g, k))
    # 10 uniform choices among 10 groups all equal: probability 10^-9
    assert len(chosen) > 1


def test_null_private_key_is_a_group_of_its_own(policy: Policy, backend: Backend) -> None:
    """A NULL key (no public values, so the general path) is one group, like in GROUP BY:
    unit 0's 10 rows with w NULL count 3 and add their whole total 10 (x = 1 each, within
    3 × 256), and so do unit 1's with w = 'w0'."""
    plan = plan_for(policy, "SELECT w, COUNT(*), SUM(x) FROM n GROUP BY w", analyst=ANALYST)
    for _ in range(3):
        assert exact_rows(backend, plan) == {(None,): (3.0, 10.0), ("w0",): (3.0, 10.0)}


# -- the kept group and the kept rows are uniform ---------------------------------------------

def test_kept_group_is_uniform_over_the_units_groups(policy: Policy,
                                                     backend: Backend) -> None:
    """3000 units with 1, 3 and 6 rows in groups a, b, c keep one group each: the numbers
    of units per group (COUNT(DISTINCT uid)) are Multinomial(3000; 1/3, 1/3, 1/3). A
    chi-square statistic over 3 cells (2 degrees of freedom) exceeds its 1 - 1e-6
    quantile with probability 1e-6; a choice weighted by rows (1/10, 3/10, 6/10) gives a
    statistic near 3000 · 0.62 ≈ 1860."""
    plan = plan_for(policy, "SELECT g, COUNT(DISTINCT uid), COUNT(*) FROM u GROUP BY g",
                    analyst=ANALYST)
    got = exact_rows(backend, plan)
    units = [got.get((g,), (0.0, 0.0))[0] for g in "abc"]
    assert sum(units) == UNIFORM_UNITS
    expected = UNIFORM_UNITS / 3
    statistic = sum((n - expected) ** 2 / expected for n in units)
    assert statistic < chi2.isf(FALSE_FAILURE, df=2), units
    # rows: a unit keeps min(rows, 3) of its chosen group's rows
    assert [got.get((g,), (0.0, 0.0))[1] for g in "abc"] == [units[0], 3 * units[1],
                                                              3 * units[2]]


def test_sum_over_the_row_bound_keeps_the_total_within_max_rows_bounds(
        policy: Policy, backend: Backend) -> None:
    """250 units with 8 rows x = 2^j (j < 8), max_rows = 3: each unit keeps 3 rows in
    its COUNT(*) and its whole total 255 (within 3 × 256) in its SUM(x), on the general
    path (a private key w, one group per unit) as on the per-unit one (public keys g, k:
    one group)."""
    each = 255
    got = exact_rows(backend, plan_for(policy, "SELECT w, COUNT(*), SUM(x) FROM s GROUP BY w",
                                       analyst=ANALYST))
    assert len(got) == SAMPLE_UNITS
    for count, total in got.values():
        assert count == 3
        assert total == pytest.approx(each, rel=1e-12)
    got = exact_rows(backend, plan_for(policy, "SELECT g, k, COUNT(*), SUM(x) FROM s "
                                       "GROUP BY g, k", analyst=ANALYST))
    assert list(got) == [("a", "p")]
    count, total = got[("a", "p")]
    assert count == 3 * SAMPLE_UNITS
    assert total == pytest.approx(SAMPLE_UNITS * each, rel=1e-12)


# -- no unit over the bounds: the unbounded answers ---------------------------------------------

UNBOUNDED = [  # each runs as a DP query and as plain SQL on the same data
    "SELECT COUNT(*), COUNT(v), SUM(v), SUM(x), COUNT(DISTINCT uid) FROM light",
    "SELECT g, COUNT(*), COUNT(v), SUM(v), SUM(x), COUNT(DISTINCT uid) FROM light "
    "GROUP BY g",
    "SELECT k, g, COUNT(*), SUM(x) FROM light WHERE v > 20 GROUP BY k, g",
    "SELECT w, COUNT(*), SUM(v) FROM light GROUP BY w",
]


@pytest.mark.parametrize("sql", UNBOUNDED)
def test_no_unit_over_the_bounds_gives_the_unbounded_answer(
        policy: Policy, backend: Backend, database: Path, sql: str) -> None:
    """Units 1..200 of `light` have 1 or 2 rows in one group (max_rows = 5, max_groups =
    1): bounding keeps every row, so each statistic equals plain SQL's, counts exactly."""
    plan = plan_for(policy, sql, analyst=ANALYST)
    width = len(plan.analysis.keys)
    con = duckdb.connect(str(database), read_only=True)
    try:
        plain = {tuple(r[:width]): tuple(float(v or 0) for v in r[width:])
                 for r in con.execute(sql).fetchall()}
    finally:
        con.close()
    got = exact_rows(backend, plan)
    assert set(got) == set(plain)
    for key, values in got.items():
        for measurement, value, want in zip(plan.measurements, values, plain[key],
                                            strict=True):
            if measurement.statistic.kind == "sum":
                assert math.isclose(value, want, rel_tol=1e-12, abs_tol=1e-9), (key, values)
            else:
                assert value == want, (key, values)
