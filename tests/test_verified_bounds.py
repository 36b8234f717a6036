"""Verified contribution bounds (`dpproxy.bounds`), on real DuckDB and PostgreSQL.

Where a check proves that no unit exceeds the bounds, the backend runs the plan's
statistics without bounding. These tests show that this changes no statistic, that a
unit over a bound always makes the backend bound as before (a 50-row unit still moves
no answer beyond the plan's sensitivity), that a change to the data after a check is
seen before the check is trusted again, and that the two facts the proof rests on hold
on these engines: DuckDB's lock on a file held read-only, and PostgreSQL's snapshot.
Where a few units exceed the bounds, DuckDB bounds only theirs (the split statement):
it computes the bounded statement's very statistics for the same salt.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlglot import exp

from dpproxy.backends import Backend, open_backend
from dpproxy.bounds import LATE_FILTER_GROUPS, BoundCheck, bound_check
from dpproxy.errors import InvalidPolicy
from dpproxy.policy import Policy, load_policy
from dpproxy.rewrite import rewrite
from dpproxy.session import Engine
from tests.conftest import PolicyFactory
from tests.exact import as_released, assert_within_bounds, exact_rows, plan_for
from tests.tables import backend_section, database_fixtures

ANALYST = "bob"
MAX_ROWS, MAX_GROUPS = 2, 2
GROUPS = "abcde"
HEAVY_ROWS = 50

POLICY = """
[backend]
BACKEND

[ledger]
path = "verified.ledger.sqlite"

[audit]
path = "verified.audit.jsonl"

TABLES

[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["w", "h", "h0", "m", "cw", "cr", "cd", "k", "many", "h1", "hh", "n1", "n2", "s",
          "lr", "ld", "ca", "cq", "en"]
"""

TABLE = """
[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = 2
max_groups_per_unit = 2

[tables.NAME.columns]
uid = UNIT
g = { type = "text", public_values = ["a", "b", "c", "d", "e"] }
c = { type = "text" }
v = { type = "int", lower = 0, upper = 100 }
x = { type = "float", lower = 0, upper = 100 }
"""


def within_rows() -> list[tuple[Any, ...]]:
    """Units 1..300: 1 or 2 rows in group g(u), and every third unit 2 more rows in the
    next group: ≤ 2 rows per (unit, group) and ≤ 2 groups per unit, so a GROUP BY g is
    within the bounds; but up to 4 rows per unit, so a query without GROUP BY is not.
    c is constant per unit (a private key within the bounds too)."""
    rows = []
    for u in range(1, 301):
        city = f"city{u % 7}"
        for j in range(1 + u % 2):
            rows.append((u, GROUPS[u % 5], city, (u * 7 + j) % 101, float((u + j) % 100)))
        if u % 3 == 0:
            rows += [(u, GROUPS[(u + 1) % 5], city, 50, 25.5)] * 2
    return rows


def light_rows() -> list[tuple[Any, ...]]:
    """Units 1..200 with 1 or 2 rows in one group: within every bound."""
    return [(u, GROUPS[u % 5], f"city{u % 3}", u % 101, float((u + j) % 100))
            for u in range(1, 201) for j in range(1 + u % 2)]


def heavy_rows() -> list[tuple[Any, ...]]:
    """Unit 0: 50 rows, 10 in each group."""
    return [(0, GROUPS[j % 5], "city0", 100, float(j)) for j in range(HEAVY_ROWS)]


def keyed_rows(extra_keys: int) -> list[tuple[Any, ...]]:
    """light_rows, and as many units again with keys outside the public list: NULL, 'zz'
    and `extra_keys` keys of one unit each (each unit within the bounds)."""
    outside = [None, "zz", *(f"g{i:05d}" for i in range(extra_keys))]
    return light_rows() + [(1000 + i, outside[i % len(outside)], "city0", i % 101, 1.5)
                           for i in range(max(200, len(outside)))]


def null_unit(rows_of_it: int) -> list[tuple[Any, ...]]:
    """Rows whose unit is NULL (one unit, as bounding groups them)."""
    return [(None, GROUPS[j % 5], "city1", 7, 2.5) for j in range(rows_of_it)]


def spread_unit() -> list[tuple[Any, ...]]:
    """Unit 500: one row in each of 3 groups, over max_groups by its groups alone."""
    return [(500, g, "city2", 60, 3.5) for g in GROUPS[:3]]


TABLES = {"w": within_rows(), "h": heavy_rows() + light_rows(), "h0": light_rows(),
          "m": light_rows(), "cw": light_rows(), "cr": light_rows(),
          "crh": heavy_rows() + light_rows(), "cd": within_rows(), "k": keyed_rows(3),
          "many": keyed_rows(LATE_FILTER_GROUPS),
          # h with at most 1 group per unit; a heavy unit holding most rows; a NULL unit
          # within the bounds beside the heavy unit 0, and one over them; text units
          "h1": heavy_rows() + light_rows(), "hh": heavy_rows() + light_rows()[:20],
          "n1": heavy_rows() + light_rows() + null_unit(1) + spread_unit(),
          "n2": null_unit(HEAVY_ROWS) + light_rows(),
          "s": [(f"u{r[0]}", *r[1:]) for r in heavy_rows() + light_rows()],
          # changed while a query waits for the table's lock; a child attached meanwhile;
          # a parent whose child is there from the start
          "lr": light_rows(), "lrh": heavy_rows() + light_rows(), "ld": within_rows(),
          "ca": light_rows(), "ca_child": heavy_rows(), "cq": light_rows(),
          "cq_child": [(r[0] + 10_000, *r[1:]) for r in light_rows()[:10]],
          # 2 rows in each of 2 groups per unit: within the bounds, until the labels merge
          "en": [(u, g, "city0", 1, 1.0) for u in range(1, 101) for g in "Abb" + "A"]}
COLUMNS = "uid INTEGER NOT NULL, g TEXT, c TEXT, v INTEGER, x DOUBLE PRECISION"
UNITS = {"n1": ("INTEGER", '{ type = "int" }'), "n2": ("INTEGER", '{ type = "int" }'),
         "s": ("TEXT NOT NULL", '{ type = "text", nullable = false }')}


duckdb_file, postgres_dsn = database_fixtures("verified", {
    name: (COLUMNS.replace("INTEGER NOT NULL", UNITS.get(name, ("INTEGER NOT NULL",))[0], 1),
           rows) for name, rows in TABLES.items()})


def write_policy(tmp_path: Path, backend: str, extra: str = "") -> Path:
    tables = "\n".join(
        TABLE.replace("NAME", name)
        .replace("UNIT", UNITS.get(name, ("", '{ type = "int", nullable = false }'))[1])
        .replace("max_groups_per_unit = 2", f"max_groups_per_unit = {1 if name == 'h1' else 2}")
        for name in TABLES)
    file = tmp_path / "verified.toml"
    file.write_text(POLICY.replace("BACKEND", backend).replace("TABLES", extra + tables))
    return file


@pytest.fixture(params=["duckdb", "postgres"])
def policy(request: pytest.FixtureRequest, tmp_path: Path) -> Policy:
    return load_policy(write_policy(tmp_path, backend_section(request)))


@pytest.fixture
def backend(policy: Policy) -> Iterator[Backend]:
    opened = open_backend(policy)
    if hasattr(opened, "recheck_s"):
        # other tests may write to this server at any time: read a check again whenever
        # the snapshot changed, so whether a statement runs unbounded is deterministic
        opened.recheck_s = 0.0
    yield opened
    opened.close()


def unit_rows(table: str) -> dict[object, int]:
    """Each unit's row count in one of TABLES (NULL units as one, as GROUP BY has them)."""
    return dict(Counter(row[0] for row in TABLES[table]))


def counts(backend: Backend) -> tuple[int, int, int]:
    """Checks read, statements run unbounded, and answers computed with bounding."""
    b = backend.bounding  # type: ignore[attr-defined]
    return b.checks, b.skipped, bounded_runs(backend)


def bounded_runs(backend: Backend) -> int:
    """Answers computed with bounding: by the bounded statement, for the heavy units only
    (split), or as a whole table's count less the rows the check saw bounding drop."""
    b = backend.bounding  # type: ignore[attr-defined]
    return int(b.enforced + b.split + b.excess)


# -- the check -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("table", "keys", "maxima"), [
    ("w", [], (4, 1)), ("w", ["g"], (2, 2)), ("w", ["c"], (4, 1)),
    ("h", [], (50, 1)), ("h", ["g"], (10, 5)), ("h", ["g", "c"], (10, 5)),
    ("h0", [], (2, 1)),
])
def test_check_reads_the_most_rows_per_group_and_groups_per_unit(
        backend: Backend, table: str, keys: list[str], maxima: tuple[int, int]) -> None:
    """Without GROUP BY the check also reads the rows bounding drops: Σ max(n − 2, 0)."""
    check = bound_check(table, exp.column("uid", quoted=True),
                        [exp.column(k, quoted=True) for k in keys], backend.dialect, 2, 2)
    (row,) = backend.run_aggregate(check.sql)
    assert tuple(int(v) for v in row[:2]) == maxima
    assert check.holds(row) == (maxima[0] <= 2 and maxima[1] <= 2)
    dropped = sum(max(n - 2, 0) for n in unit_rows(table).values())
    assert check.excess(row) == (None if keys else dropped)
    assert len(row) == (2 if keys else 3)


def test_check_on_an_empty_table_holds(backend: Backend) -> None:
    """An empty table (no row matches uid < 0) reads NULL maxima, which hold; a check that
    could not be read never holds."""
    check = bound_check("w", exp.column("uid", quoted=True), [], backend.dialect, 1, 1)
    table = 'FROM ONLY "w"' if backend.dialect == "postgres" else 'FROM "w"'
    empty = check.sql.replace(table, 'FROM (SELECT * FROM "w" WHERE "uid" < 0) AS "w"')
    assert empty != check.sql
    (row,) = backend.run_aggregate(empty)
    assert tuple(row) == (None, None, 0) and check.holds(row) and check.excess(row) == 0
    assert not check.holds(None) and check.excess(None) is None


def test_check_holds_only_within_both_bounds() -> None:
    assert BoundCheck("", 5, 1).holds((5, 1))
    assert not BoundCheck("", 5, 1).holds((5, 2))
    assert not BoundCheck("", 5, 1).holds((6, 1))


# -- within the bounds: the same statistics, without bounding ------------------------------------

WITHIN = [
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(x), COUNT(DISTINCT uid) FROM w GROUP BY g",
    "SELECT g, SUM(x) FROM w WHERE v > 30 GROUP BY g",
    "SELECT LOWER(g) AS lg, COUNT(*), SUM(v) FROM w GROUP BY lg",
    "SELECT c, COUNT(*), SUM(x) FROM h0 GROUP BY c",  # a private key: partition selection
    "SELECT COUNT(*), SUM(v), VAR_POP(x) FROM h0",
    "SELECT g, c, COUNT(*) FROM h0 GROUP BY g, c",
]


@pytest.mark.parametrize("sql", WITHIN)
def test_within_the_bounds_the_unbounded_statement_computes_the_same(
        policy: Policy, backend: Backend, sql: str) -> None:
    """The check holds, so the backend runs the unbounded statement; its statistics equal
    the bounded statement's (counts exactly, sums to rounding: summation order differs)."""
    plan = plan_for(policy, sql, analyst=ANALYST)
    assert rewrite(plan, backend.dialect).unbounded is not None
    before = counts(backend)
    unbounded = exact_rows(backend, plan, verify_bounds=True)
    after = counts(backend)
    assert after[1] == before[1] + 1 and after[2] == before[2]  # skipped, not enforced
    bounded = exact_rows(backend, plan)
    assert set(unbounded) == set(bounded)
    for key, values in bounded.items():
        assert unbounded[key] == pytest.approx(values, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize(("table", "late"), [("k", True), ("many", False)])
def test_public_keys_filter_the_groups_of_a_table_with_few(
        policy: Policy, backend: Backend, table: str, late: bool) -> None:
    """k holds NULL, 'zz' and 3 more keys outside the public list: the check counts its
    groups (10 ≤ LATE_FILTER_GROUPS), so the backend filters the groups after aggregating
    every row. many holds 1,026 keys outside the list: the check stops counting past the
    limit and the rows are filtered first. Either way the groups and statistics are those
    of the bounded statement, which filters rows before bounding."""
    sql = f"SELECT g, COUNT(*), SUM(v), AVG(x), COUNT(DISTINCT uid) FROM {table} GROUP BY g"
    plan = plan_for(policy, sql, analyst=ANALYST)
    unbounded = rewrite(plan, backend.dialect).unbounded
    assert unbounded is not None and unbounded.late_sql is not None
    (observed,) = backend.run_aggregate(unbounded.check.sql)
    groups = 5 + 2 + (3 if late else LATE_FILTER_GROUPS)  # public, NULL and 'zz', others
    assert int(observed[2]) == min(groups, LATE_FILTER_GROUPS + 1)
    chosen = unbounded.sql_for(observed)
    assert chosen == (unbounded.late_sql if late else unbounded.sql)
    assert unbounded.late_sql != unbounded.sql
    bounded = exact_rows(backend, plan)
    assert set(bounded) == {(g,) for g in GROUPS}  # no NULL, no 'zz', no other key
    before = counts(backend)
    for rows in (exact_rows(backend, plan, verify_bounds=True),
                 {tuple(r[:1]): tuple(float(v) for v in as_released(plan, r)[1:1 + len(
                     plan.measurements)]) for r in backend.run_aggregate(unbounded.late_sql)}):
        assert set(rows) == set(bounded)
        for key, values in bounded.items():
            assert rows[key] == pytest.approx(values, rel=1e-12, abs=1e-9)
    assert counts(backend)[1] == before[1] + 1  # run unbounded


def test_a_check_is_read_once_per_data(policy: Policy, backend: Backend) -> None:
    """Queries with the same table and keys share one check; other keys need their own."""
    plans = [plan_for(policy, sql, analyst=ANALYST) for sql in (
        "SELECT g, COUNT(*) FROM w GROUP BY g", "SELECT g, SUM(v) FROM w GROUP BY g",
        "SELECT g, AVG(x) FROM w WHERE x > 3 GROUP BY g", "SELECT COUNT(*) FROM w")]
    before = counts(backend)
    for plan in plans:
        exact_rows(backend, plan, verify_bounds=True)
    checks, skipped, bounded = (a - b for a, b in zip(counts(backend), before, strict=True))
    assert (skipped, bounded) == (3, 1)  # without GROUP BY a unit has up to 4 rows
    if backend.dialect == "duckdb":
        assert checks == 2
    else:  # a snapshot may have changed between the queries (other tests write)
        assert 2 <= checks <= 4


def test_over_the_bounds_the_backend_bounds(policy: Policy, backend: Backend) -> None:
    """Without GROUP BY, w has units of 3 and 4 rows: the check fails and COUNT(*) is the
    bounded one, Σ min(rows, 2), never the plain row count."""
    plan = plan_for(policy, "SELECT COUNT(*) FROM w", analyst=ANALYST)
    bounded = sum(min(n, MAX_ROWS) for n in unit_rows("w").values())
    assert bounded < len(TABLES["w"])
    before = counts(backend)
    excess = backend.bounding.excess  # type: ignore[attr-defined]
    assert exact_rows(backend, plan, verify_bounds=True) == {(): (float(bounded),)}
    assert counts(backend)[2] == before[2] + 1
    # as the rows less the check's excess (`Unbounded.excess_for`)
    assert backend.bounding.excess == excess + 1  # type: ignore[attr-defined]


HEAVY = [
    "SELECT COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE",
    "SELECT g, COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), COUNT(DISTINCT uid) FROM TABLE "
    "GROUP BY g",
    "SELECT c, COUNT(*), SUM(x) FROM TABLE GROUP BY c",
    # no count of units: on DuckDB, split
    "SELECT COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x) FROM TABLE",
    "SELECT g, COUNT(*), SUM(v), AVG(x) FROM TABLE GROUP BY g",
    # the rows less the check's excess
    "SELECT COUNT(*) FROM TABLE",
]


@pytest.mark.parametrize("sql", HEAVY)
def test_heavy_unit_moves_no_answer_beyond_its_bound(policy: Policy, backend: Backend,
                                                     sql: str) -> None:
    """With the shortcut on: h0 (light units only) runs unbounded, h (the same plus a
    unit of 50 rows) is bounded, and the difference, unit 0's contribution, is within
    the plan's sensitivity per measurement, in at most max_groups groups."""
    plan = plan_for(policy, sql.replace("TABLE", "h"), analyst=ANALYST)
    without_plan = plan_for(policy, sql.replace("TABLE", "h0"), analyst=ANALYST)
    before = counts(backend)
    without = exact_rows(backend, without_plan, verify_bounds=True)
    assert counts(backend)[1] == before[1] + 1
    for _ in range(5):
        before = bounded_runs(backend)
        got = exact_rows(backend, plan, verify_bounds=True)
        assert bounded_runs(backend) == before + 1
        assert_within_bounds(plan, got, without, MAX_ROWS, MAX_GROUPS)


# -- a few units over the bounds: only theirs are bounded (DuckDB) -------------------------------

SPLIT = [
    "SELECT COUNT(*), COUNT(v), SUM(v), AVG(v), SUM(x), VAR_POP(x) FROM TABLE",
    "SELECT g, COUNT(*), SUM(v), AVG(x) FROM TABLE GROUP BY g",
    "SELECT g, SUM(x), COUNT(*) FROM TABLE WHERE v > 30 GROUP BY g",
    "SELECT LOWER(g) AS lg, COUNT(*), SUM(v) FROM TABLE GROUP BY lg",
    "SELECT g, COUNT(v), SUM(v) FROM TABLE WHERE x > 10.5 AND c <> 'city2' GROUP BY g",
]


@pytest.fixture
def duckdb_backend(duckdb_file: Path, tmp_path: Path) -> Iterator[Backend]:
    opened = open_backend(load_policy(write_policy(
        tmp_path, f'kind = "duckdb"\npath = "{duckdb_file.as_posix()}"')))
    yield opened
    opened.close()


def bounded_and_split(policy: Policy, backend: Backend, sql: str
                      ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """The bounded statement's rows and the backend's own choice's rows, with the same
    parameters (salt included), and how many statements it split meanwhile."""
    plan = plan_for(policy, sql, analyst=ANALYST)
    rewritten = rewrite(plan, backend.dialect)
    parameters = rewritten.parameters()
    bounded = backend.run_aggregate(rewritten.sql, parameters)
    before = backend.bounding.split  # type: ignore[attr-defined]
    chosen = backend.run_aggregate(rewritten.sql, parameters, unbounded=rewritten.unbounded)
    return bounded, chosen, backend.bounding.split - before  # type: ignore[attr-defined]


def assert_same_statistics(one: list[tuple[Any, ...]], other: list[tuple[Any, ...]],
                           keys: int) -> None:
    """The same groups with the same statistics (sums to rounding: summation order)."""
    mine = {tuple(r[:keys]): [float(v) for v in r[keys:]] for r in one}
    theirs = {tuple(r[:keys]): [float(v) for v in r[keys:]] for r in other}
    assert set(mine) == set(theirs) and len(mine) == len(one)
    for key, values in theirs.items():
        assert mine[key] == pytest.approx(values, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("table", ["h", "h1", "n1", "s"])
@pytest.mark.parametrize("sql", SPLIT)
def test_split_statement_computes_the_bounded_statistics(
        duckdb_backend: Backend, tmp_path: Path, duckdb_file: Path, table: str,
        sql: str) -> None:
    """Unit 0 has 50 rows in 5 groups, the others 1 or 2 in one (n1: and a NULL unit of
    one row, and a unit of one row in each of 3 groups; s: units are text; h1: one group
    per unit, DuckDB's per-unit path): the
    backend splits, and its statistics are the bounded statement's for the same salt —
    which groups unit 0 keeps included."""
    policy = load_policy(write_policy(tmp_path, f'kind = "duckdb"\npath = "{duckdb_file}"'))
    query = sql.replace("TABLE", table)
    keys = len(plan_for(policy, query, analyst=ANALYST).analysis.keys)
    for _ in range(3):  # three salts
        bounded, split, splits = bounded_and_split(policy, duckdb_backend, query)
        assert splits == 1
        assert_same_statistics(split, bounded, keys)
    if keys == 0 and table != "n1":  # unit 0 was bounded: 50 rows count as max_rows
        assert int(split[0][0]) == len(TABLES[table]) - HEAVY_ROWS + MAX_ROWS


@pytest.mark.parametrize("table", ["h", "h1", "hh", "n1", "n2", "s"])
def test_whole_table_count_is_its_rows_less_the_checks_excess(
        policy: Policy, backend: Backend, table: str) -> None:
    """SELECT COUNT(*) without WHERE, over the bounds: the table's rows less the rows the
    check saw bounding drop, on both backends. It is the bounded statement's count and
    Σ min(n, max_rows) over the units (unit 0's 50 rows count as max_rows), whatever
    share of the rows the heavy units hold (hh: most), NULL units included (n1: one
    within the bounds; n2: one of 50 rows). With a WHERE, beside another statistic, or of
    a column, the count is bounded as before."""
    plan = plan_for(policy, f"SELECT COUNT(*), COUNT(*) * 2 FROM {table}", analyst=ANALYST)
    rewritten = rewrite(plan, backend.dialect)
    before = backend.bounding.excess  # type: ignore[attr-defined]
    chosen = backend.run_aggregate(rewritten.sql, rewritten.parameters(),
                                   unbounded=rewritten.unbounded)
    assert backend.bounding.excess == before + 1  # type: ignore[attr-defined]
    bounded = backend.run_aggregate(rewritten.sql, rewritten.parameters())
    assert chosen == bounded
    assert chosen[0][0] == sum(min(n, MAX_ROWS) for n in unit_rows(table).values())
    assert chosen[0][0] <= len(TABLES[table]) - HEAVY_ROWS + MAX_ROWS
    for sql in (f"SELECT COUNT(*) FROM {table} WHERE v > 30", f"SELECT COUNT(*), SUM(v) "
                f"FROM {table}", f"SELECT COUNT(v) FROM {table}"):
        offered = rewrite(plan_for(policy, sql, analyst=ANALYST), backend.dialect).unbounded
        assert offered is not None and offered.excess_sql is None, sql


@pytest.mark.parametrize(("table", "why"), [
    ("hh", "unit 0's 50 rows are most of the table's 70"),
    ("n2", "the unit over the bounds is NULL, which a list of units cannot hold"),
])
def test_no_split_where_it_would_not_pay_or_cannot_list_the_units(
        tmp_path: Path, duckdb_file: Path, duckdb_backend: Backend, table: str,
        why: str) -> None:
    policy = load_policy(write_policy(tmp_path, f'kind = "duckdb"\npath = "{duckdb_file}"'))
    before = counts(duckdb_backend)
    bounded, chosen, splits = bounded_and_split(policy, duckdb_backend,
                                                f"SELECT COUNT(*), SUM(v) FROM {table}")
    assert splits == 0, why
    assert counts(duckdb_backend)[2] == before[2] + 1
    assert_same_statistics(chosen, bounded, 0)


def test_split_in_another_thread_makes_its_own_table(
        tmp_path: Path, duckdb_file: Path, duckdb_backend: Backend) -> None:
    """The heavy units' table is temporary, so per cursor, and each thread has its own
    cursor: a thread after the first still finds its table."""
    policy = load_policy(write_policy(tmp_path, f'kind = "duckdb"\npath = "{duckdb_file}"'))
    sql = "SELECT COUNT(*), SUM(x) FROM h"
    first = bounded_and_split(policy, duckdb_backend, sql)
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.append(
        bounded_and_split(policy, duckdb_backend, sql)))
    worker.start()
    worker.join(60)
    assert found and found[0][2] == 1 and first[2] == 1
    assert_same_statistics(found[0][1], first[1], 0)


@pytest.mark.parametrize(("dialect", "kind", "offered"), [
    ("duckdb", "", True), ("postgres", "", False),
    ("duckdb", "COUNT(DISTINCT uid)", False), ("duckdb", "", False)])
def test_split_is_offered_on_duckdb_without_counts_of_units(
        policy: Policy, dialect: str, kind: str, offered: bool) -> None:
    """PostgreSQL keeps no table of heavy units (a check holds for one snapshot only); a
    count of distinct units would hash the light units' rows by unit anyway; the last
    case is a private key, selected by its units."""
    sql = f"SELECT COUNT(*), {kind or 'SUM(v)'} FROM h" if offered or kind or \
        dialect == "postgres" else "SELECT c, COUNT(*) FROM h GROUP BY c"
    unbounded = rewrite(plan_for(policy, sql, analyst=ANALYST), dialect).unbounded
    assert unbounded is not None
    assert (unbounded.generate_split is not None) == offered


# -- the facts the proof rests on ----------------------------------------------------------------

def test_duckdb_file_held_read_only_cannot_be_written(duckdb_file: Path,
                                                      tmp_path: Path) -> None:
    """While the backend holds the file, another process cannot open it for writing, so
    a check read once holds for the backend's life."""
    policy = load_policy(write_policy(tmp_path, f'kind = "duckdb"\npath = "{duckdb_file}"'))
    backend = open_backend(policy)
    try:
        script = (f"import duckdb; c = duckdb.connect({str(duckdb_file)!r}); "
                  "c.execute('INSERT INTO w VALUES (0, NULL, NULL, NULL, NULL)'); print('wrote')")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode != 0 and "wrote" not in done.stdout
        assert "lock" in done.stderr.lower()
    finally:
        backend.close()


def test_postgres_snapshot_is_the_transactions(postgres_dsn: str) -> None:
    """In a REPEATABLE READ transaction the snapshot text read first stays the same, and
    the rows it sees stay the same, while another session commits a change."""
    with psycopg.connect(postgres_dsn, autocommit=True) as writer, \
            psycopg.connect(postgres_dsn) as reader:
        reader.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        writer.execute("CREATE TABLE snap (x INTEGER)")
        first = reader.execute("SELECT pg_current_snapshot()::text").fetchone()
        writer.execute("INSERT INTO snap VALUES (1)")
        again = reader.execute("SELECT pg_current_snapshot()::text, "
                               "(SELECT COUNT(*) FROM snap)").fetchone()
        assert again is not None and first is not None
        assert (again[0], again[1]) == (first[0], 0)
        reader.commit()
        later = reader.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert later is not None and later[0] != first[0]  # a commit moves the snapshot


def test_postgres_change_after_a_check_is_seen(postgres_dsn: str, tmp_path: Path) -> None:
    """A check that held is not reused once a unit of 50 rows is committed: within
    recheck_s the backend bounds without checking; after it, it checks again, finds the
    unit, and bounds. Either way the new unit moves COUNT(*) by max_rows · max_groups
    at most."""
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, "SELECT g, COUNT(*) FROM m GROUP BY g", analyst=ANALYST)
    backend = open_backend(policy)
    try:
        before = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (1, 1, 0)
        with psycopg.connect(postgres_dsn, autocommit=True) as writer:
            writer.execute("INSERT INTO m SELECT 999, 'a', 'x', 1, 1.0 "
                           "FROM generate_series(1, 50)")
        backend.recheck_s = 3600.0  # type: ignore[attr-defined]
        got = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (1, 1, 1)  # a new snapshot: bounded, not checked
        assert got[("a",)][0] - before[("a",)][0] == MAX_ROWS
        backend.recheck_s = 0.0  # type: ignore[attr-defined]
        got = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (2, 1, 2)  # checked again: the unit is over the bound
        assert got[("a",)][0] - before[("a",)][0] == MAX_ROWS
    finally:
        backend.close()


def carried(backend: Backend) -> int:
    return int(backend.bounding.carried)  # type: ignore[attr-defined]


def test_postgres_check_carried_to_snapshots_without_new_rows(postgres_dsn: str,
                                                              tmp_path: Path) -> None:
    """A check that held is carried to a later snapshot, without reading it again, past a
    commit to another table and past a deletion from its own (fewer rows: the answer is
    that of the rows left); past an update and an insert, by checking again only the
    units with new row versions. A new unit over the bounds stops that: the query is
    bounded (the unit adds max_rows to its group) until the check is read anew."""
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, "SELECT g, COUNT(*), SUM(v) FROM cw GROUP BY g", analyst=ANALYST)
    backend = open_backend(policy)
    backend.recheck_s = 3600.0  # type: ignore[attr-defined]
    try:
        first = exact_rows(backend, plan, verify_bounds=True)
        assert (counts(backend), carried(backend)) == ((1, 1, 0), 0)
        with psycopg.connect(postgres_dsn, autocommit=True) as writer:
            writer.execute("CREATE TABLE elsewhere (x INTEGER)")
            writer.execute("INSERT INTO elsewhere VALUES (1)")
            assert exact_rows(backend, plan, verify_bounds=True) == first
            assert (counts(backend), carried(backend)) == ((1, 2, 0), 1)
            writer.execute("DELETE FROM cw WHERE uid = 1")  # group b, 2 rows, v = 1 each
            got = exact_rows(backend, plan, verify_bounds=True)
            assert (counts(backend), carried(backend)) == ((1, 3, 0), 2)
            assert got == exact_rows(backend, plan) != first  # the bounded statement's
            assert got[("b",)] == (first[("b",)][0] - 2, first[("b",)][1] - 2)
            # unit 2's rows are new versions: it is checked again, and within the bounds
            writer.execute("UPDATE cw SET v = v WHERE uid = 2")
            assert exact_rows(backend, plan, verify_bounds=True) == got
            assert (counts(backend), carried(backend)) == ((1, 4, 0), 3)
            # a new unit within the bounds, then one over them
            writer.execute("INSERT INTO cw VALUES (900, 'a', 'x', 7, 1.0), "
                           "(900, 'a', 'x', 7, 1.0)")
            got = exact_rows(backend, plan, verify_bounds=True)
            assert (counts(backend), carried(backend)) == ((1, 5, 0), 4)
            assert got == exact_rows(backend, plan)
            writer.execute("INSERT INTO cw SELECT 999, 'a', 'x', 1, 1.0 "
                           "FROM generate_series(1, 50)")
            bounded = exact_rows(backend, plan, verify_bounds=True)
            assert (counts(backend), carried(backend)) == ((1, 5, 1), 4)  # bounded
            # the unit adds max_rows rows' worth to its group, not its 50 rows
            assert bounded[("a",)][0] == got[("a",)][0] + MAX_ROWS
            assert 0 <= bounded[("a",)][1] - got[("a",)][1] <= MAX_ROWS * 100
            backend.recheck_s = 0.0  # type: ignore[attr-defined]
            assert exact_rows(backend, plan, verify_bounds=True) == bounded
            assert (counts(backend), carried(backend)) == ((2, 5, 2), 4)  # read anew
    finally:
        backend.close()


@pytest.mark.parametrize(("table", "change"), [
    # another table, with a unit of 50 rows inserted long before, takes the name
    ("cr", "ALTER TABLE cr RENAME TO cr_old; ALTER TABLE crh RENAME TO cr"),
    # every row's key becomes 'a' with no new row version: units of 3–4 rows in one group
    ("cd", "ALTER TABLE cd DROP COLUMN g; ALTER TABLE cd ADD COLUMN g TEXT DEFAULT 'a'"),
])
def test_postgres_check_not_carried_past_a_change_of_the_table_itself(
        postgres_dsn: str, tmp_path: Path, table: str, change: str) -> None:
    """Changes that leave every row version's xmin as it was, but not what the rows read
    as, stop the carry (the table's catalog rows moved): the query is bounded, and once
    read anew the check fails. The answer is the bounded statement's either way."""
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, f"SELECT g, COUNT(*) FROM {table} GROUP BY g", analyst=ANALYST)
    # the rows the name reads after the change, and the bounded count of them all: each
    # unit's rows per group up to 2, in its 2 fullest groups
    rows = TABLES["crh"] if table == "cr" else [(r[0], "a") for r in TABLES["cd"]]
    per_unit: dict[object, Counter[object]] = {}
    for row in rows:
        per_unit.setdefault(row[0], Counter())[row[1]] += 1
    bounded_total = sum(sum(sorted((min(n, MAX_ROWS) for n in groups.values()),
                                   reverse=True)[:MAX_GROUPS])
                        for groups in per_unit.values())
    assert bounded_total < len(rows)  # the change puts units over the bounds

    def total() -> float:
        return sum(v[0] for v in exact_rows(backend, plan, verify_bounds=True).values())

    backend = open_backend(policy)
    backend.recheck_s = 3600.0  # type: ignore[attr-defined]
    try:
        exact_rows(backend, plan, verify_bounds=True)
        assert (counts(backend), carried(backend)) == ((1, 1, 0), 0)
        with psycopg.connect(postgres_dsn, autocommit=True) as writer:
            writer.execute(change)
        assert total() == bounded_total
        assert (counts(backend), carried(backend)) == ((1, 1, 1), 0)
        backend.recheck_s = 0.0  # type: ignore[attr-defined]
        assert total() == bounded_total
        assert (counts(backend), carried(backend)) == ((2, 1, 2), 0)  # over the bounds
    finally:
        backend.close()


def bounded_total_of(rows: list[tuple[Any, ...]]) -> int:
    """The bounded COUNT(*) of these rows over all groups: each unit's rows per group up to
    MAX_ROWS, in its MAX_GROUPS fullest groups."""
    per_unit: dict[object, Counter[object]] = {}
    for row in rows:
        per_unit.setdefault(row[0], Counter())[row[1]] += 1
    return sum(sum(sorted((min(n, MAX_ROWS) for n in groups.values()),
                          reverse=True)[:MAX_GROUPS]) for groups in per_unit.values())


def wait_for_a_lock_request(dsn: str, table: str) -> None:
    """Until some session waits for a lock on `table`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(3000):
            row = conn.execute("SELECT COUNT(*) FROM pg_locks WHERE NOT granted "
                               "AND relation = to_regclass(%s)", [table]).fetchone()
            if row is not None and row[0] > 0:
                return
            threading.Event().wait(0.01)
    raise AssertionError(f"no session waited for {table}")


@pytest.mark.parametrize(("table", "change"), [
    ("lr", "ALTER TABLE lr RENAME TO lr_old; ALTER TABLE lrh RENAME TO lr"),
    ("ld", "ALTER TABLE ld DROP COLUMN g; ALTER TABLE ld ADD COLUMN g TEXT DEFAULT 'a'"),
])
def test_postgres_change_committed_while_a_query_waits_is_seen(
        postgres_dsn: str, tmp_path: Path, table: str, change: str) -> None:
    """A change of what the table's rows read as (ACCESS EXCLUSIVE), committed while the
    next query waits for the table: PostgreSQL resolves the query's names and columns
    from the catalog as it is once the lock is granted. The query took its snapshot
    before waiting, so the check, reused for that snapshot (or carried, the catalog read
    in it not showing the change), let it read the changed table unbounded: 50 rows of
    one unit. The backend now locks the table before its snapshot: the change shows in
    the snapshot, and the query is bounded."""
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, f"SELECT g, COUNT(*) FROM {table} GROUP BY g", analyst=ANALYST)
    after = TABLES["lrh"] if table == "lr" else [(r[0], "a") for r in TABLES[table]]
    assert bounded_total_of(after) < len(after)  # the change puts units over the bounds
    backend = open_backend(policy)
    backend.recheck_s = 3600.0  # type: ignore[attr-defined]
    answer: dict[str, Any] = {}
    try:
        exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (1, 1, 0)
        with psycopg.connect(postgres_dsn) as writer:
            writer.execute(change)  # holds ACCESS EXCLUSIVE until it commits
            query = threading.Thread(target=lambda: answer.update(
                rows=exact_rows(backend, plan, verify_bounds=True)))
            query.start()
            wait_for_a_lock_request(postgres_dsn, table)
            writer.commit()
            query.join(timeout=60)
        assert sum(v[0] for v in answer["rows"].values()) == bounded_total_of(after)
        assert counts(backend) == (1, 1, 1)  # bounded, not run unbounded again
    finally:
        backend.close()


class _AfterTheCheck:
    """Runs `statement` on its own connection (committed) right after the backend has read
    its check and before it runs the query: the interleaving of a change committed while a
    check runs, which ATTACH PARTITION, INHERIT and ALTER TYPE … RENAME VALUE allow (they
    wait for no reader of the table)."""

    def __init__(self, backend: Backend, dsn: str, statement: str) -> None:
        self.observed = backend._observed  # type: ignore[attr-defined]
        self.dsn, self.statement = dsn, statement
        backend._observed = self  # type: ignore[attr-defined]

    def __call__(self, *args: Any) -> Any:
        observed = self.observed(*args)
        with psycopg.connect(self.dsn, autocommit=True) as writer:
            writer.execute(self.statement)
        return observed


def test_postgres_child_attached_after_the_check_is_read_by_no_unbounded_statement(
        postgres_dsn: str, tmp_path: Path) -> None:
    """A child holding a unit of 50 rows, attached (INHERIT) between the check and the
    query of one transaction: the query, reading the parent with its children, counted
    that unit's 50 rows unbounded. Check and unbounded statement now read ONLY the table,
    and the catalog read after it shows the table has a child: the answer is the bounded
    statement's, the child's unit bounded."""
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, "SELECT g, COUNT(*) FROM ca GROUP BY g", analyst=ANALYST)
    backend = open_backend(policy)
    backend.recheck_s = 0.0  # type: ignore[attr-defined]
    both = bounded_total_of(TABLES["ca"] + TABLES["ca_child"])
    assert both < len(TABLES["ca"]) + len(TABLES["ca_child"])
    try:
        _AfterTheCheck(backend, postgres_dsn, "ALTER TABLE ca_child INHERIT ca")
        got = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (1, 0, 1)  # checked, held, then bounded after all
        assert sum(v[0] for v in got.values()) == both
    finally:
        backend.close()
    backend = open_backend(policy)  # the child is attached now: a parent is bounded
    try:
        got = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (0, 0, 1)
        assert sum(v[0] for v in got.values()) == bounded_total_of(
            TABLES["ca"] + TABLES["ca_child"])
    finally:
        backend.close()


def test_postgres_enum_label_renamed_after_the_check_is_seen(postgres_dsn: str,
                                                            tmp_path: Path) -> None:
    """An enum label renamed between the check and the query (no lock on the table): the
    query read the new labels, merging each unit's two groups into one of 4 rows (the
    bound is 2), unbounded. The backend reads the latest catalog after an unbounded
    statement, finds it changed, and answers with the bounded statement instead."""
    with psycopg.connect(postgres_dsn, autocommit=True) as writer:
        writer.execute("CREATE TYPE en_label AS ENUM ('A', 'b')")
        writer.execute("ALTER TABLE en ALTER COLUMN g TYPE en_label USING g::en_label")
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, "SELECT LOWER(CAST(g AS TEXT)) AS k, COUNT(*) FROM en "
                            "GROUP BY LOWER(CAST(g AS TEXT))", analyst=ANALYST)
    backend = open_backend(policy)
    backend.recheck_s = 0.0  # type: ignore[attr-defined]
    try:
        assert exact_rows(backend, plan, verify_bounds=True) == {("a",): (200.0,),
                                                                 ("b",): (200.0,)}
        assert counts(backend) == (1, 1, 0)
        _AfterTheCheck(backend, postgres_dsn, "ALTER TYPE en_label RENAME VALUE 'b' TO 'a'")
        # a unit's 4 rows in one group, bounded to 2
        assert exact_rows(backend, plan, verify_bounds=True) == {("a",): (200.0,)}
        assert counts(backend)[1:] == (1, 1)
        assert backend.bounding.recomputed == 1  # type: ignore[attr-defined]
    finally:
        backend.close()


def test_postgres_parent_table_is_never_run_unbounded(postgres_dsn: str,
                                                      tmp_path: Path) -> None:
    """A table with children is read with them, so never as ONLY the table: no check is
    read, and the bounded statement counts the child's rows too."""
    with psycopg.connect(postgres_dsn, autocommit=True) as writer:
        writer.execute("ALTER TABLE cq_child INHERIT cq")
    policy = load_policy(write_policy(tmp_path, f'kind = "postgres"\ndsn = "{postgres_dsn}"'))
    plan = plan_for(policy, "SELECT g, COUNT(*) FROM cq GROUP BY g", analyst=ANALYST)
    backend = open_backend(policy)
    try:
        got = exact_rows(backend, plan, verify_bounds=True)
        assert counts(backend) == (0, 0, 1)
        assert sum(v[0] for v in got.values()) == len(TABLES["cq"]) + len(TABLES["cq_child"])
    finally:
        backend.close()


def test_postgres_checks_on_views_and_partitioned_tables_are_not_carried(
        postgres_dsn: str) -> None:
    """Only a plain table without children or row security has its catalog text read (a
    view's or a foreign table's rows have no versions of their own to scan; row security
    policies may read the role, whose grants change no row)."""
    from dpproxy.backends.postgres import _catalog

    def catalog(name: str) -> str | None:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn, \
                psycopg.RawCursor(conn) as cursor:
            return _catalog(conn, cursor, BoundCheck("", 1, 1, table=name))

    with psycopg.connect(postgres_dsn, autocommit=True) as writer:
        writer.execute("CREATE VIEW cv AS SELECT * FROM m")
        writer.execute("CREATE TABLE cp (uid INTEGER, g TEXT) PARTITION BY LIST (g)")
        writer.execute("CREATE TABLE cp_a PARTITION OF cp FOR VALUES IN ('a')")
        writer.execute("CREATE TABLE ci (uid INTEGER)")
        writer.execute("CREATE TABLE ci_child () INHERITS (ci)")
        writer.execute("CREATE TABLE cs (uid INTEGER)")
        writer.execute("ALTER TABLE cs ENABLE ROW LEVEL SECURITY")
    assert catalog("m") is not None
    assert catalog("cv") is None and catalog("cp") is None and catalog("ci") is None
    assert catalog("cs") is None
    before = catalog("m")
    with psycopg.connect(postgres_dsn, autocommit=True) as writer:
        # an enum label read through a domain is no column type of m, but is covered
        writer.execute("CREATE TYPE mood AS ENUM ('low', 'high')")
        writer.execute("CREATE DOMAIN feeling AS mood")
        after_create = catalog("m")
        writer.execute("ALTER TYPE mood RENAME VALUE 'low' TO 'calm'")
    assert before != after_create != catalog("m") is not None
    assert catalog("no_such_table") is None


def test_postgres_young_units_include_those_running_at_the_snapshot(
        postgres_dsn: str) -> None:
    """The carry's check reads the units with a row version as young as an earlier
    snapshot's xmin: one committed after the snapshot was taken, and one that was running
    while it was (at or past its xmax, or in its xip) and committed later; units whose
    rows were all committed before it are not read (NULL maxima), and a NULL unit is one.
    The running case is the one a test of "committed after" alone would miss."""
    from dpproxy.backends.postgres import _Snapshot

    check = bound_check("young", exp.column("uid", quoted=True), [], "postgres", 2, 1)

    def young(xmin: int) -> tuple[object, ...]:
        with psycopg.connect(postgres_dsn, autocommit=True) as reader, \
                psycopg.RawCursor(reader) as cursor:  # $1, as the backend's cursors
            row = cursor.execute(check.young_sql, [str(xmin % (1 << 32))]).fetchone()
        assert row is not None
        return tuple(row)

    def snapshot(after: int = 0) -> _Snapshot:
        """A new snapshot; with `after`, one whose xmin is past that transaction: another
        session's open transaction (a test run beside this one, on any database of the
        server) holds xmin back, and is waited out for up to a minute."""
        deadline = time.monotonic() + 60
        while True:
            with psycopg.connect(postgres_dsn, autocommit=True) as reader:
                row = reader.execute("SELECT pg_current_snapshot()::text || '@'").fetchone()
            assert row is not None
            read = _Snapshot.read(str(row[0]))
            assert read is not None
            if read.xmin > after or time.monotonic() > deadline:
                return read
            time.sleep(0.05)

    def write(sql: str) -> int:
        """Run one insert or delete on its own: its transaction id."""
        row = writer.execute(f"{sql} RETURNING pg_current_xact_id()::text").fetchone()
        assert row is not None
        return int(row[0])

    with psycopg.connect(postgres_dsn, autocommit=True) as writer, \
            psycopg.connect(postgres_dsn) as running:
        writer.execute("CREATE TABLE young (uid INTEGER)")
        written = write("INSERT INTO young VALUES (1), (1), (1), (2)")
        assert young(snapshot(written).xmin) == (None, None)
        running.execute("INSERT INTO young VALUES (2)")  # its transaction stays open
        row = running.execute("SELECT pg_current_xact_id()::text").fetchone()
        assert row is not None
        xid = int(row[0])
        during = snapshot()
        # running while the snapshot was taken: listed (xip), or at or past its xmax
        assert during.xmin <= xid and (xid in during.running or xid >= during.xmax)
        assert young(during.xmin) == (None, None)  # its row is not seen yet
        running.commit()
        assert young(during.xmin) == (2, 1)  # unit 2, both its rows, not unit 1's 3
        after = snapshot(xid)
        assert young(after.xmin) == (None, None)
        written = write("INSERT INTO young VALUES (1)")
        assert young(after.xmin) == (4, 1)  # unit 1 again: all its rows
        after = snapshot(written)
        write("INSERT INTO young VALUES (NULL), (NULL), (NULL)")
        written = write("INSERT INTO young VALUES (NULL)")
        assert young(after.xmin) == (4, 1)  # the NULL unit, one unit of 4 rows
        after = snapshot(written)
        write("DELETE FROM young WHERE uid IS NULL")
        assert young(after.xmin) == (None, None)  # a deleted version is not seen


# -- through the session ---------------------------------------------------------------------------

def test_session_uses_the_check_unless_the_policy_turns_it_off(
        make_policy: PolicyFactory) -> None:
    """On the demo (one row per person in adult) the session's query runs unbounded; with
    `verify_bounds = false` the backend is never offered the unbounded form."""
    sql = "SELECT education, COUNT(*), AVG(age) FROM adult GROUP BY education"
    with Engine.from_path(make_policy()) as engine:
        engine.session("alice").execute(sql)
        assert counts(engine.backend) == (1, 1, 0)
    off = make_policy({"[privacy]\n": "[privacy]\nverify_bounds = false\n"})
    with Engine.from_path(off) as engine:
        engine.session("alice").execute(sql)
        assert counts(engine.backend) == (0, 0, 0)


def test_verify_bounds_must_be_a_boolean(tmp_path: Path) -> None:
    file = write_policy(tmp_path, 'kind = "duckdb"\npath = "x.duckdb"',
                        extra='[privacy]\nverify_bounds = "yes"\n')
    with pytest.raises(InvalidPolicy, match="verify_bounds"):
        load_policy(file)
