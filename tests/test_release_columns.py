"""The column-wise release of private-key groups (`release._selected_columns`) against the
row-by-row one (`release.COLUMNAR` off), on real DuckDB and PostgreSQL.

With private keys, `release` reads the backend's rows column by column, thresholds every
candidate group's noisy count with numpy and builds tuples for the kept groups only. It
must give exactly what the rows and their dict of groups give. To compare two runs value
for value, the noise is made deterministic here (each vector's k-th draw a fixed function
of k): both readings then see the very same draws, so any difference in groups, keys,
order, values, their types or intervals is the reading's. Without that patch, the last
tests check the threshold itself with real noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpproxy import batch_noise, mechanisms
from dpproxy import release as r
from dpproxy.analyze import Analysis, analyze
from dpproxy.mechanisms import calibrate, release_array, release_many
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import Policy, load_policy
from dpproxy.release import Released, release
from dpproxy.selection import effective_threshold
from dpproxy.session import Engine
from tests.tables import Tables, backend_section, database_fixtures

POLICY = """
[backend]
BACKEND

[ledger]
path = "LEDGER.sqlite"

[audit]
path = "LEDGER.jsonl"

# g: one row per person (no privacy unit), so DuckDB's counts are BIGINT; u: a privacy
# unit, whose COUNT(*) is a sum (HUGEINT on DuckDB)
[tables.g.columns]
c = { type = "text" }
x = { type = "float", lower = 0, upper = 100 }
n = { type = "int", lower = 0, upper = 100 }
v = { type = "int", lower = 0, upper = 10, nullable = false }
w = { type = "int", lower = 0, upper = 100, nullable = false }

[tables.u]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 1

[tables.u.columns]
uid = { type = "int", nullable = false }
c = { type = "text" }

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["g", "u"]
"""


def g_rows() -> list[tuple[Any, ...]]:
    """90 groups of c (c00..c89, 1 to 90 rows each) and 10 rows of NULL c; x takes 80
    values (whole numbers and halves, -0.0 among them) and NULL, n 90 and NULL, w 45 (0..44):
    each has groups far above the thresholds and some below."""
    rows = []
    for k in range(90):
        for j in range(k + 1):
            x = None if (k + j) % 17 == 0 else -0.0 if (k + j) % 13 == 0 else (j % 80) / 2
            n = None if (k * j) % 11 == 5 else (3 * j) % 100
            rows.append((f"c{k:02d}", x, n, (k + j) % 11, j // 2))
    rows += [(None, 1.5, 4, 3, 44)] * 10
    return rows


def u_rows() -> list[tuple[Any, ...]]:
    """60 groups of c held by 1 to 60 people with 2 rows each, and a NULL group."""
    rows, uid = [], 0
    for k in range(60):
        for _ in range(k + 1):
            uid += 1
            rows += [(uid, f"u{k:02d}")] * 2
    for _ in range(30):
        uid += 1
        rows.append((uid, None))
    return rows


TABLES: Tables = {
    "g": ("c TEXT, x DOUBLE PRECISION, n INTEGER, v INTEGER NOT NULL, w INTEGER NOT NULL",
          g_rows()),
    "u": ("uid INTEGER NOT NULL, c TEXT", u_rows()),
}


duckdb_file, postgres_dsn = database_fixtures("release-columns", TABLES)


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return backend_section(request)


def policy_file(tmp_path: Path, backend: str, name: str = "ledger") -> Path:
    file = tmp_path / f"{name}.toml"
    file.write_text(POLICY.replace("BACKEND", backend).replace("LEDGER", name))
    return file


def _draws(m: int) -> np.ndarray:
    """A vector's m draws: a fixed spread of -9..9, the same for any scale."""
    return (np.arange(m, dtype=np.int64) * 7) % 19 - 9


def _no_draws(m: int) -> np.ndarray:
    return np.zeros(m, dtype=np.int64)


def _fix_noise(monkeypatch: pytest.MonkeyPatch, draws: Any) -> None:
    """Every sampler, batched or scalar, gives `draws`: not private, for comparisons only."""
    monkeypatch.setattr(batch_noise, "discrete_laplace",
                        lambda params: [draws(m) for _, _, m in params])
    monkeypatch.setattr(batch_noise, "discrete_gaussian",
                        lambda params: [draws(m) for _, _, m in params])

    def reaching(t: int, s: int, least: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = draws(least.size)
        lanes = np.flatnonzero(z >= least)
        return lanes, z[lanes]

    monkeypatch.setattr(batch_noise, "discrete_laplace_reaching", reaching)
    monkeypatch.setattr(mechanisms, "_grid_sampler",
                        lambda mechanism, n, d: iter(draws(10_000).tolist()).__next__)


@pytest.fixture
def fixed_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    _fix_noise(monkeypatch, _draws)


@pytest.fixture
def zero_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noiseless, so the answer does not depend on the order of the backend's rows."""
    _fix_noise(monkeypatch, _no_draws)


def plan_of(policy: Policy, sql: str, selection: str, epsilon: float = 1.0,
            delta: float = 1e-6) -> QueryPlan:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst("bob"))
    assert isinstance(analysis, Analysis)
    return plan_query(analysis, QueryOptions(epsilon, delta, "laplace",
                                             selection=selection))  # type: ignore[arg-type]


def unread_policy(tmp_path: Path) -> Policy:
    """The policy for planning alone (no data is read)."""
    return load_policy(policy_file(tmp_path, 'kind = "duckdb"\npath = "unused.duckdb"'))


def typed(released: Released) -> tuple[Any, ...]:
    """Everything a Released holds, each value with its type."""
    return (released.columns, released.accuracy,
            [[(type(v), v) for v in row] for row in released.rows], released.intervals)


def both_ways(plan: QueryPlan, exact: Sequence[tuple[object, ...]],
              monkeypatch: pytest.MonkeyPatch) -> tuple[Released, Released]:
    """release() column-wise (checking it was taken) and row by row, on the same draws."""
    taken = []
    columns = r._selected_columns

    def spy(*args: Any) -> Any:
        out = columns(*args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(r, "_selected_columns", spy)
    columnwise = release(plan, exact)
    assert taken == [True]
    monkeypatch.setattr(r, "COLUMNAR", False)
    by_rows = release(plan, exact)
    monkeypatch.setattr(r, "COLUMNAR", True)
    assert taken == [True]  # the row path never asked
    return columnwise, by_rows


# (query, selection mode, whether its last output is the COUNT(*) that selects groups)
QUERIES = [
    ("SELECT c, COUNT(*) FROM g GROUP BY c", "rows", True),  # a NULL key among 91
    ("SELECT c, COUNT(*) FROM g GROUP BY c", "units", False),
    ("SELECT x, COUNT(*), SUM(v) FROM g GROUP BY x", "rows", False),  # floats, NULL, -0.0
    ("SELECT n, AVG(v) FROM g GROUP BY n", "rows", False),  # ints, NULL; by AVG's COUNT(*)
    ("SELECT w, COUNT(*) FROM g GROUP BY w", "rows", True),  # 45: the scalar samplers
    ("SELECT c, n, COUNT(*) FROM g GROUP BY c, n", "rows", True),  # two keys
    ("SELECT x * 2 AS q, COUNT(*) FROM g GROUP BY x * 2", "rows", False),  # an expression
    ("SELECT c, SUM(v) AS s, COUNT(*) FROM g GROUP BY c HAVING COUNT(*) > 40 "
     "ORDER BY s DESC, c LIMIT 12 OFFSET 2", "rows", False),
    ("SELECT c, COUNT(*) FROM u GROUP BY c", "rows", True),  # HUGEINT counts in DuckDB
    ("SELECT c, COUNT(*) FROM u GROUP BY c", "units", False),
]


@pytest.mark.parametrize(("sql", "selection", "counted"), QUERIES)
def test_columns_and_rows_release_the_same(backend: str, tmp_path: Path, sql: str,
                                           selection: str, counted: bool, fixed_noise: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The same groups, keys, order, values, types and intervals column-wise as row by
    row, from the backend's rows; a released count that selected its group is the group's
    exact count plus that group's draw, and reaches the threshold."""
    with Engine.from_path(policy_file(tmp_path, backend)) as engine:
        plan = plan_of(engine.policy, sql, selection)
        assert plan.selection is not None
        rewritten = engine.rewritten(plan)
        rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
    columnwise, by_rows = both_ways(plan, rows, monkeypatch)
    assert typed(columnwise) == typed(by_rows)
    assert len(columnwise.rows) >= 3  # something was kept …
    if "LIMIT" not in sql:  # … and something was not: the threshold bit
        assert len(columnwise.rows) < len(rows)
    if counted:  # the draws went to the candidates in the rows' order
        keys = len(plan.analysis.keys)
        exact = {row[:keys]: row[keys] for row in rows}
        draws = dict(zip(exact, _draws(len(rows)).tolist(), strict=True))
        assert plan.selection is not None
        threshold = effective_threshold(plan.selection)
        for row in columnwise.rows:
            group = tuple(row[:keys])
            assert row[-1] >= threshold
            assert row[-1] == exact[group] + draws[group]


def test_a_session_releases_the_same_either_way(backend: str, tmp_path: Path,
                                                zero_noise: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Through a session: the same result column-wise as row by row (two engines, each its
    own ledger; noiseless, since the backend's row order, which decides who gets which
    draw, may differ)."""
    sql = "SELECT x, COUNT(*), SUM(v) FROM g GROUP BY x"
    results = []
    for columnar in (True, False):
        monkeypatch.setattr(r, "COLUMNAR", columnar)
        with Engine.from_path(policy_file(tmp_path, backend, f"l{columnar}")) as engine:
            session = engine.session("bob", epsilon=1.0, delta=1e-6)
            session.execute("SET dpproxy.selection = 'rows'")
            result = session.execute(sql)
        results.append((result.columns, result.types, result.intervals,
                        [[(type(v), v) for v in row] for row in result.rows]))
    assert results[0] == results[1]
    assert 3 < len(results[0][3]) < 80


def test_keys_that_normalize_alike_are_read_by_rows(tmp_path: Path, fixed_noise: None,
                                                    monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """Two rows whose keys are one group once normalized (float keys 1 and 1.0; 2^53 and
    2^53 + 1; -0.0 and 0.0) take the row path: the dict keeps the first one's place and
    the last one's statistics."""
    plan = plan_of(unread_policy(tmp_path), "SELECT x, COUNT(*) FROM g GROUP BY x", "rows")
    analysis = plan.analysis
    assert plan.selection is not None
    threshold = effective_threshold(plan.selection)
    base: list[tuple[object, ...]] = [(float(k) + 0.5, threshold + 20 + k) for k in range(40)]
    for twins in [[(1, threshold + 30), (1.0, threshold + 50)],
                  [(2**53, threshold + 30), (2**53 + 1, threshold + 60)],
                  [(-0.0, threshold + 30), (0.0, threshold + 70)]]:
        rows = base[:10] + twins[:1] + base[10:] + twins[1:]
        assert r._selected_columns(analysis, plan.selection, rows) is None
        monkeypatch.setattr(r, "COLUMNAR", False)
        expected = release(plan, rows)
        monkeypatch.setattr(r, "COLUMNAR", True)
        assert typed(release(plan, rows)) == typed(expected)
        keys = [row[0] for row in expected.rows]
        assert len(keys) == len(set(keys)) == 41  # one group for the twins
        if twins[0][0] == -0.0:  # the key 0.0 (never a row's sign), the last one's count
            (twin,) = [row for row in expected.rows if row[0] == 0.0]
            assert math.copysign(1.0, twin[0]) == 1.0
            assert twin[1] == threshold + 70 + _draws(42).tolist()[10]


def test_release_array_is_release_many_as_an_array() -> None:
    """release_array(...).tolist() has release_many's types: int64 for integer noise, float64
    on a finer grid, an object array of ints from the scalar samplers (few values) or where
    int64 would overflow."""
    counts = calibrate("laplace", 5.0, 1.0, integer_valued=True)
    sums = calibrate("laplace", 2.5, 1.0, integer_valued=False)
    for values, spec, dtype, kind in [
        (list(range(100)), counts, np.int64, int), (np.arange(100), counts, np.int64, int),
        ([0.5] * 100, sums, np.float64, float), (list(range(10)), counts, object, int),
        ([2**70] * 100, counts, object, int),
    ]:
        noisy = release_array(values, spec)  # type: ignore[arg-type]
        assert noisy.dtype == dtype and noisy.shape == (len(values),)
        assert all(type(v) is kind for v in noisy.tolist())
        assert [type(v) for v in release_many(values, spec)] == [kind] * len(values)  # type: ignore[arg-type]
        # the noise is small next to these values: each stays near its exact value
        assert all(abs(a - b) < 1000 for a, b in zip(noisy.tolist(), values, strict=True))


# -- the threshold with real noise ---------------------------------------------------------------

def test_the_released_count_is_the_draw_that_cleared_the_threshold(backend: str,
                                                                   tmp_path: Path) -> None:
    """With real noise, 20 releases: every released COUNT(*) reaches the threshold (it is
    the very draw that selected its group), and the groups of 1 to 3 people never appear.

    Chance of a false failure: the threshold T holds a group of one person (at most 3
    rows) to P(3 + Z ≥ T) ≤ δ' = 1e-12, Z discrete Laplace of scale t ≈ 3; a group of k ≤ 3
    people has 2k ≤ 6 rows, so P(6 + Z ≥ T) = e^{3/t}·P(Z ≥ T − 3) ≤ e·δ' < 3e-12, and 3
    groups × 20 runs < 2e-10. A big group (60 people, 120 rows, T ≈ 86) is missed with
    probability P(Z ≤ −34) < 1e-5 per run; it is only asked to appear once in 20."""
    sql = "SELECT c, COUNT(*) FROM u GROUP BY c"
    with Engine.from_path(policy_file(tmp_path, backend)) as engine:
        session = engine.session("bob", epsilon=1.0, delta=1e-12)
        session.execute("SET dpproxy.selection = 'rows'")
        seen: set[object] = set()
        for i in range(20):
            epsilon = 1.0 + i * 1e-9  # a new answer each time
            session.set_option("epsilon", epsilon)
            selection = plan_of(engine.policy, sql, "rows", epsilon, 1e-12).selection
            assert selection is not None and 80 < effective_threshold(selection) < 90
            result = session.execute(sql)
            for key, count in result.rows:
                assert isinstance(count, int) and count >= effective_threshold(selection)
                seen.add(key)
    assert not seen & {"u00", "u01", "u02", None}
    assert "u59" in seen


def test_a_count_just_below_the_threshold_is_never_released(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the boundary: noisy counts T − 1 are dropped and T kept, column-wise and row by
    row alike (the noise here takes every group to T − 1 or T)."""
    plan = plan_of(unread_policy(tmp_path), "SELECT c, COUNT(*) FROM g GROUP BY c", "rows")
    assert plan.selection is not None
    threshold = effective_threshold(plan.selection)
    exact = [(f"k{i:03d}", 100 + i) for i in range(200)]
    # draws taking group i to T − 1 (i odd) or T (i even)
    monkeypatch.setattr(batch_noise, "discrete_laplace", lambda params: [
        np.array([threshold - (i % 2) - 100 - i for i in range(m)], dtype=np.int64)
        for _, _, m in params])
    expected = [(f"k{i:03d}", threshold) for i in range(0, 200, 2)]
    for columnar in (True, False):
        monkeypatch.setattr(r, "COLUMNAR", columnar)
        got = release(plan, exact).rows
        assert got == expected
        assert all(type(n) is int for _, n in got)
