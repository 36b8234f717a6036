"""Joins of a private table with public lookup tables, on DuckDB and PostgreSQL.

A small database (`SCHEMA`, `rows_of`) is loaded into both backends:

* `t`: private, privacy unit `uid`, ≤ 3 rows per group and ≤ 2 groups per unit. Units 1–60
  have one row each, key k cycling a, b, c, NULL; unit 0 (the heavy unit) has one row with
  k = 'hot', which matches 50 rows of `pub`. `tn` is `t` without unit 0: its neighbour.
* `r` / `rn`: the same rows without a privacy unit (each row its own unit); `rn` lacks the
  'hot' row.
* `pub`: public, NOT granted (public tables need no grant): k 'hot' × 50 (w = 0…9, grp
  alternating x, y), 'a', 'b', and 'c' twice (so a 'c' row fans out to 2 rows).
* `lut`: public, k declared `unique = true` although 'c' appears twice in the data: the
  rewrite joins one row per key, so the claim holds whatever the table holds.

Noise and tolerances. Released values are read at ε = 10⁶ per query. The largest L1
sensitivity of a statistic below is 300 (SUM(v), v ≤ 100, 3 rows per unit) and a query
has at most 2 noisy statistics, so every Laplace scale is b ≤ 2·300/10⁶ = 6e-4; the
tolerance 0.05 is > 50·b, exceeded with probability < 2e-21 per value: no test here fails
by chance. The fan-out tests read exact (pre-noise) aggregates through `rewrite()` and
`backend.run_aggregate()`, the hook the PostgreSQL-vs-DuckDB comparison uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

from dpproxy import errors
from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.postgres import PostgresBackend
from dpproxy.policy import Policy, load_policy
from dpproxy.rewrite import ROW_ID, rewrite
from dpproxy.session import Engine, Session
from tests.exact import exact_rows, plan_for

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


ANALYST = "ana"  # the analyst of this file's policy

EPS = 1_000_000.0
TOL = 0.05
HEAVY_MATCHES = 50
MAX_ROWS = 3
MAX_GROUPS = 2
TABLES = ["t", "tn", "r", "rn", "pub", "lut", "other", "secret"]

SCHEMA = [
    "CREATE TABLE t (uid INTEGER NOT NULL, k TEXT, v INTEGER)",
    "CREATE TABLE tn (uid INTEGER NOT NULL, k TEXT, v INTEGER)",
    "CREATE TABLE r (k TEXT, v INTEGER)",
    "CREATE TABLE rn (k TEXT, v INTEGER)",
    "CREATE TABLE pub (k TEXT, w INTEGER, grp TEXT)",
    "CREATE TABLE lut (k TEXT, label TEXT)",
    "CREATE TABLE other (uid INTEGER, k TEXT)",
    "CREATE TABLE secret (uid INTEGER, k TEXT)",
]

POLICY = """
database = "joins"

[backend]
kind = "duckdb"
path = "joins.duckdb"

[ledger]
path = "joins.ledger.sqlite"

[audit]
path = "joins.audit.jsonl"

[privacy]
default_epsilon = 1.0
default_delta = 1e-7

[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 2
columns.uid = { type = "int", nullable = false }
columns.k = { type = "text" }
columns.v = { type = "int", lower = 0, upper = 100 }

[tables.tn]
privacy_unit = "uid"
max_rows_per_unit = 3
max_groups_per_unit = 2
columns.uid = { type = "int", nullable = false }
columns.k = { type = "text" }
columns.v = { type = "int", lower = 0, upper = 100 }

[tables.r]
columns.k = { type = "text" }
columns.v = { type = "int", lower = 0, upper = 100 }

[tables.rn]
columns.k = { type = "text" }
columns.v = { type = "int", lower = 0, upper = 100 }

[tables.pub]
public = true
columns.k = { type = "text" }
columns.w = { type = "int", lower = 0, upper = 9 }
columns.grp = { type = "text", public_values = ["x", "y"] }

[tables.lut]
public = true
columns.k = { type = "text", unique = true }
columns.label = { type = "text", public_values = ["A", "B", "C", "H"] }

[tables.other]
privacy_unit = "uid"
columns.uid = { type = "int" }
columns.k = { type = "text" }

[tables.secret]
privacy_unit = "uid"
columns.uid = { type = "int" }
columns.k = { type = "text" }

[analysts.ana]
budget = { epsilon = 1e12, delta = 0.5 }
tables = ["t", "tn", "r", "rn", "other"]
"""


def rows_of() -> dict[str, list[tuple[Any, ...]]]:
    light = [(i, ["a", "b", "c", None][i % 4], i) for i in range(1, 61)]
    heavy = [(0, "hot", 100)]
    pub = [("hot", j % 10, "xy"[j % 2]) for j in range(HEAVY_MATCHES)]
    pub += [("a", 1, "x"), ("b", 2, "y"), ("c", 3, "x"), ("c", 4, "y")]
    return {
        "t": heavy + light, "tn": light,
        "r": [(k, v) for _, k, v in heavy + light], "rn": [(k, v) for _, k, v in light],
        "pub": pub,
        "lut": [("a", "A"), ("b", "B"), ("c", "C"), ("c", "C"), ("hot", "H")],
        "other": [(1, "a")], "secret": [(1, "a")],
    }


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    return f"'{value}'" if isinstance(value, str) else str(value)


def load(execute: Any) -> None:
    """Create and fill the tables with SQL both backends accept."""
    for statement in SCHEMA:
        execute(statement)
    for table, rows in rows_of().items():
        values = ", ".join("(" + ", ".join(map(_literal, row)) + ")" for row in rows)
        execute(f"INSERT INTO {table} VALUES {values}")


# -- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def joins_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("joins") / "joins.duckdb"
    con = duckdb.connect(str(path))
    load(con.execute)
    con.close()
    return path


@pytest.fixture(scope="module")
def joins_pg_dsn(pg_dsn: str) -> Iterator[str]:
    from tests.pg import scratch_database

    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            load(con.execute)
        yield dsn


@pytest.fixture
def policy_path(backend_kind: str, joins_database: Path, tmp_path: Path,
                request: pytest.FixtureRequest) -> Path:
    text = POLICY.replace('path = "joins.duckdb"', f'path = "{joins_database.as_posix()}"')
    if backend_kind == "postgres":
        dsn = request.getfixturevalue("joins_pg_dsn")
        text = re.sub(r'\[backend\]\n[^\[]*', f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n\n',
                      text, count=1)
    path = tmp_path / "joins.toml"
    path.write_text(text)
    return path


@pytest.fixture
def policy(policy_path: Path) -> Policy:
    return load_policy(policy_path)


@pytest.fixture
def ana(policy_path: Path) -> Iterator[Session]:
    with Engine.from_path(policy_path) as engine:
        session = engine.session("ana")
        session.execute(f"SET dpproxy.epsilon = {EPS:g}")
        yield session


@pytest.fixture
def backend(backend_kind: str, joins_database: Path, request: pytest.FixtureRequest
            ) -> Iterator[Any]:
    if backend_kind == "duckdb":
        duck = DuckDBBackend(joins_database)
        yield duck
        duck.close()
    else:
        pg = PostgresBackend(request.getfixturevalue("joins_pg_dsn"), TABLES,
                             statement_timeout_s=60)
        yield pg
        pg.close()


@pytest.fixture(scope="module")
def exact_con(joins_database: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[duckdb.DuckDBPyConnection]:
    """The data read directly (a copy of the file), for the noiseless answers."""
    copy = tmp_path_factory.mktemp("exact") / "joins.duckdb"
    copy.write_bytes(joins_database.read_bytes())
    con = duckdb.connect(str(copy), read_only=True)
    yield con
    con.close()


def spent(session: Session) -> float:
    rows = session.execute("SHOW dpproxy.budget").rows
    return float(rows[0][2])


# -- accepted queries ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    id: str
    sql: str
    columns: tuple[str, ...]
    exact: str  # DuckDB SQL over the same rows giving the noiseless answer, keys first
    keys: int = 0  # leading key columns


ACCEPTED = [
    Accepted("inner_on", "SELECT COUNT(*) FROM tn JOIN pub ON tn.k = pub.k", ("count",),
             "SELECT COUNT(*) FROM tn JOIN pub ON tn.k = pub.k"),
    # unmatched private rows are kept (NULL k, and no match): 60 rows + 15 extra 'c' matches
    Accepted("left_using", "SELECT COUNT(*) FROM tn LEFT JOIN pub USING (k)", ("count",),
             "SELECT COUNT(*) FROM tn LEFT JOIN pub USING (k)"),
    Accepted("aliases_and_table_name_qualifier",
             "SELECT COUNT(*) FROM tn AS p INNER JOIN pub AS q ON (p.k = q.k) WHERE tn.v > 10",
             ("count",), "SELECT COUNT(*) FROM tn JOIN pub ON tn.k = pub.k WHERE tn.v > 10"),
    Accepted("group_by_public_column_public_values",
             "SELECT q.grp, COUNT(*) FROM tn p JOIN pub q ON p.k = q.k GROUP BY q.grp",
             ("grp", "count"),
             "SELECT grp, COUNT(*) FROM tn JOIN pub USING (k) GROUP BY grp", keys=1),
    # a NULL key is outside the public values: dropped, as for a private key column
    Accepted("left_join_public_values_drop_null",
             "SELECT grp, COUNT(*) FROM tn LEFT JOIN pub USING (k) GROUP BY grp",
             ("grp", "count"),
             "SELECT grp, COUNT(*) FROM tn LEFT JOIN pub USING (k) WHERE grp IS NOT NULL "
             "GROUP BY grp", keys=1),
    # no public values: partition selection, and the NULL group of unmatched rows is a group
    Accepted("left_join_null_group",
             "SELECT q.k, COUNT(*) FROM tn p LEFT JOIN pub q USING (k) GROUP BY q.k",
             ("k", "count"),
             "SELECT pub.k, COUNT(*) FROM tn LEFT JOIN pub USING (k) GROUP BY pub.k", keys=1),
    Accepted("sum_of_public_column", "SELECT SUM(q.w) FROM tn p JOIN pub q ON p.k = q.k",
             ("sum",), "SELECT SUM(w) FROM tn JOIN pub USING (k)"),
    Accepted("where_on_public_column",
             "SELECT AVG(v) FROM tn JOIN pub USING (k) WHERE pub.grp = 'x'", ("avg",),
             "SELECT AVG(v) FROM tn JOIN pub USING (k) WHERE grp = 'x'"),
    # lut declares k unique though 'c' is there twice: joined once per key, 45 rows not 60
    Accepted("unique_key_enforced", "SELECT COUNT(*) FROM tn JOIN lut USING (k)", ("count",),
             "SELECT COUNT(*) FROM tn WHERE k IN ('a', 'b', 'c')"),
    Accepted("unique_key_group_by_label",
             "SELECT label, COUNT(*) FROM tn LEFT JOIN lut USING (k) GROUP BY label",
             ("label", "count"),
             # public values: H is released too, with its zero
             "SELECT l.label, COUNT(tn.k) FROM (SELECT DISTINCT k, label FROM lut) l "
             "LEFT JOIN tn USING (k) GROUP BY l.label", keys=1),
    # without a privacy unit a row counts once, though 'c' rows match twice
    Accepted("row_level_fan_out_bounded", "SELECT COUNT(*) FROM rn JOIN pub USING (k)",
             ("count",), "SELECT COUNT(*) FROM rn WHERE k IN ('a', 'b', 'c')"),
    Accepted("two_public_tables_chained",
             "SELECT lut.label, COUNT(*) FROM tn JOIN pub ON tn.k = pub.k "
             "JOIN lut ON pub.k = lut.k GROUP BY lut.label", ("label", "count"),
             "SELECT l.label, COUNT(j.k) FROM (SELECT DISTINCT k, label FROM lut) l "
             "LEFT JOIN (SELECT k FROM tn JOIN pub USING (k)) j USING (k) GROUP BY l.label",
             keys=1),
    Accepted("using_column_is_the_private_one",
             "SELECT k, COUNT(*) FROM tn JOIN lut USING (k) GROUP BY k", ("k", "count"),
             "SELECT k, COUNT(*) FROM tn WHERE k IN ('a', 'b', 'c') GROUP BY k", keys=1),
    Accepted("alias_position_and_order",
             "SELECT q.grp AS g, COUNT(*) AS n FROM tn p JOIN pub q USING (k) "
             "GROUP BY 1 ORDER BY g DESC", ("g", "n"),
             "SELECT grp, COUNT(*) FROM tn JOIN pub USING (k) GROUP BY grp", keys=1),
    Accepted("count_distinct_units_after_fan_out",
             "SELECT COUNT(DISTINCT p.uid) FROM tn p JOIN pub q USING (k)", ("count",),
             "SELECT COUNT(DISTINCT uid) FROM tn JOIN pub USING (k)"),
]


@pytest.mark.parametrize("case", ACCEPTED, ids=lambda c: c.id)
def test_accepted(case: Accepted, ana: Session, exact_con: duckdb.DuckDBPyConnection) -> None:
    result = ana.execute(case.sql)
    assert tuple(result.columns) == case.columns
    expected = {tuple(row[:case.keys]): tuple(row[case.keys:])
                for row in exact_con.execute(case.exact).fetchall()}
    released = {tuple(row[:case.keys]): tuple(row[case.keys:]) for row in result.rows}
    assert released.keys() == expected.keys()
    for key, values in expected.items():
        for got, want in zip(released[key], values, strict=True):
            assert got == pytest.approx(float(want), abs=TOL), (key, got, want)
    assert result.cost.epsilon == EPS


def test_order_by_public_key_is_kept(ana: Session) -> None:
    result = ana.execute("SELECT q.grp AS g, COUNT(*) AS n FROM tn p JOIN pub q USING (k) "
                         "GROUP BY 1 ORDER BY g DESC")
    assert [row[0] for row in result.rows] == ["y", "x"]


def test_order_by_output_name_before_ambiguous_input_columns(ana: Session) -> None:
    """ORDER BY k names the output column k first, as in PostgreSQL, though both tables
    have a column k (in WHERE, k would be ambiguous)."""
    result = ana.execute("SELECT q.k, COUNT(*) FROM tn p JOIN pub q ON p.k = q.k "
                         "GROUP BY q.k ORDER BY k DESC")
    assert [row[0] for row in result.rows] == ["c", "b", "a"]
    with pytest.raises(errors.AmbiguousColumn):
        ana.execute("SELECT COUNT(*) FROM tn p JOIN pub q ON p.k = q.k ORDER BY k || ''")


# -- rejected queries ---------------------------------------------------------------------------

REJECTED = [
    ("self_join", "SELECT COUNT(*) FROM t a JOIN t b USING (uid)", "42501", "self-join"),
    ("two_private_tables", "SELECT COUNT(*) FROM t JOIN other USING (k)", "42501",
     "two private tables"),
    ("private_not_granted", "SELECT COUNT(*) FROM t JOIN secret USING (k)", "42501",
     "permission denied"),
    ("right_join", "SELECT COUNT(*) FROM t RIGHT JOIN pub USING (k)", "0A000", "RIGHT JOIN"),
    ("full_join", "SELECT COUNT(*) FROM t FULL JOIN pub USING (k)", "0A000", "FULL JOIN"),
    ("cross_join", "SELECT COUNT(*) FROM t CROSS JOIN pub", "0A000", "CROSS JOIN"),
    ("comma_join", "SELECT COUNT(*) FROM t, pub", "0A000", "cross product"),
    ("natural_join", "SELECT COUNT(*) FROM t NATURAL JOIN pub", "0A000", "NATURAL"),
    ("inequality", "SELECT COUNT(*) FROM t JOIN pub ON t.k < pub.k", "0A000",
     "join condition"),
    ("or_condition", "SELECT COUNT(*) FROM t JOIN pub ON t.k = pub.k OR t.v = pub.w", "0A000",
     "join condition"),
    ("constant_in_condition",
     "SELECT COUNT(*) FROM t JOIN pub ON t.k = pub.k AND pub.grp = 'x'", "0A000",
     "join condition"),
    ("same_table_both_sides", "SELECT COUNT(*) FROM t JOIN pub ON pub.k = pub.grp", "0A000",
     "must compare"),
    ("key_is_privacy_unit", "SELECT COUNT(*) FROM t JOIN pub ON t.uid = pub.w", "42501",
     "privacy unit"),
    ("ambiguous_column", "SELECT COUNT(*) FROM t JOIN pub ON t.k = pub.k WHERE k = 'a'",
     "42702", "ambiguous"),
    ("type_mismatch", "SELECT COUNT(*) FROM t JOIN pub ON t.k = pub.w", "42804",
     "operator does not exist"),
    ("duplicate_alias", "SELECT COUNT(*) FROM t JOIN pub AS t ON t.k = t.k", "42712",
     "more than once"),
    ("unknown_table", "SELECT COUNT(*) FROM t JOIN nope ON t.k = nope.k", "42P01",
     "does not exist"),
    ("public_table_first", "SELECT COUNT(*) FROM pub JOIN t USING (k)", "0A000",
     "must start from the private table"),
    ("raw_public_column", "SELECT q.w FROM t JOIN pub q USING (k)", "42501",
     "neither aggregated"),
    ("later_table_in_condition",
     "SELECT COUNT(*) FROM t JOIN pub ON t.k = lut.k JOIN lut ON t.k = lut.k", "42703",
     "missing FROM-clause entry"),
    ("unknown_public_column", "SELECT COUNT(*) FROM t JOIN pub USING (nope)", "42703",
     "USING"),
]


@pytest.mark.parametrize(("sql", "sqlstate", "fragment"), [r[1:] for r in REJECTED],
                         ids=[r[0] for r in REJECTED])
def test_rejected(sql: str, sqlstate: str, fragment: str, ana: Session) -> None:
    with pytest.raises(errors.Error) as info:
        ana.execute(sql)
    assert info.value.sqlstate == sqlstate, str(info.value)
    assert fragment in info.value.message
    assert info.value.hint  # every rejection says how to fix the query
    assert spent(ana) == 0.0


# -- fan-out: one unit's 50 matches stay bounded ----------------------------------------------

FAN_OUT = [
    # query template over {t}, and whether group keys are public
    "SELECT COUNT(*) FROM {t} JOIN pub USING (k)",
    "SELECT COUNT(*) FROM {t} LEFT JOIN pub USING (k)",
    "SELECT SUM(pub.w), SUM(v) FROM {t} JOIN pub USING (k)",
    "SELECT pub.grp, COUNT(*) FROM {t} JOIN pub USING (k) GROUP BY pub.grp",
    "SELECT pub.w, COUNT(*) FROM {t} JOIN pub USING (k) GROUP BY pub.w",
]


@pytest.mark.parametrize("template", FAN_OUT)
def test_unit_with_50_matches_moves_aggregates_by_at_most_the_sensitivity(
        template: str, policy: Policy, backend: Any) -> None:
    """t and tn are neighbours (tn lacks unit 0, whose one row matches 50 public rows): the
    exact per-group statistics differ, summed over all groups, by at most each statistic's
    L1 sensitivity — and by more than nothing, so the heavy unit was counted."""
    with_unit = plan_for(policy, template.format(t="t"), analyst=ANALYST)
    without = plan_for(policy, template.format(t="tn"), analyst=ANALYST)
    assert with_unit.contribution.max_rows == MAX_ROWS
    full, neighbour = exact_rows(backend, with_unit), exact_rows(backend, without)
    width = len(with_unit.measurements)
    for i, measurement in enumerate(with_unit.measurements):
        moved = sum(abs(full.get(key, (0.0,) * width)[i] - neighbour.get(key, (0.0,) * width)[i])
                    for key in full.keys() | neighbour.keys())
        assert 0 < moved <= measurement.sensitivity, (measurement.statistic.describe(), moved)
        # unbounded, the unit would move a statistic by 50 rows' contributions
        assert measurement.sensitivity < HEAVY_MATCHES * measurement.statistic.row_contribution


def test_the_heavy_unit_keeps_max_rows_matches(policy: Policy, backend: Any) -> None:
    """Without GROUP BY the heavy unit keeps exactly max_rows_per_unit of its 50 rows."""
    plan = plan_for(policy, "SELECT COUNT(*) FROM t JOIN pub USING (k)", analyst=ANALYST)
    neighbour = plan_for(policy, "SELECT COUNT(*) FROM tn JOIN pub USING (k)", analyst=ANALYST)
    (full,) = exact_rows(backend, plan).values()
    (rest,) = exact_rows(backend, neighbour).values()
    assert full[0] - rest[0] == MAX_ROWS


@pytest.mark.parametrize("template", [
    "SELECT COUNT(*) FROM {t} JOIN pub USING (k)",
    # k <> 'c': the two runs below draw their random joined rows independently, so the
    # other rows that fan out ('c', to 2 rows of different w and grp) must not be in them;
    # only the 'hot' row's one kept match may differ
    "SELECT SUM(pub.w) FROM {t} LEFT JOIN pub USING (k) WHERE k <> 'c'",
    "SELECT pub.grp, COUNT(*) FROM {t} JOIN pub USING (k) WHERE k <> 'c' GROUP BY pub.grp",
])
def test_row_level_row_with_50_matches_moves_by_at_most_the_sensitivity(
        template: str, policy: Policy, backend: Any) -> None:
    """Without a privacy unit, neighbours differ by one row: r's 'hot' row matches 50 rows,
    yet moves each statistic by at most its sensitivity (the rewrite numbers rows before
    the join and keeps one joined row per row)."""
    with_row = plan_for(policy, template.format(t="r"), analyst=ANALYST)
    without = plan_for(policy, template.format(t="rn"), analyst=ANALYST)
    assert with_row.contribution.privacy_unit is None
    assert ROW_ID in rewrite(with_row, backend.dialect).sql
    full, neighbour = exact_rows(backend, with_row), exact_rows(backend, without)
    (measurement,) = with_row.measurements
    moved = sum(abs(full.get(key, (0.0,))[0] - neighbour.get(key, (0.0,))[0])
                for key in full.keys() | neighbour.keys())
    assert moved <= measurement.sensitivity
    if "COUNT" in template:
        assert moved == 1  # the row is counted once, not 50 times


def test_row_level_rows_keep_one_match_across_groups(policy: Policy, backend: Any) -> None:
    """A 'c' row of rn matches a row of group x and one of group y: it is counted in one of
    them only, so the groups add up to the 45 matching rows, not 60."""
    plan = plan_for(policy, "SELECT pub.grp, COUNT(*) FROM rn JOIN pub USING (k) GROUP BY pub.grp",
                    analyst=ANALYST)
    rows = exact_rows(backend, plan)
    assert set(rows) == {("x",), ("y",)}
    assert sum(values[0] for values in rows.values()) == 45


def test_unique_key_needs_no_row_numbers(policy: Policy, backend: Any,
                                         exact_con: duckdb.DuckDBPyConnection) -> None:
    """A key declared unique: no fan-out, no row ids, and the duplicated 'c' of lut is
    joined once."""
    plan = plan_for(policy, "SELECT COUNT(*) FROM r JOIN lut USING (k)", analyst=ANALYST)
    assert not plan.analysis.fans_out
    sql = rewrite(plan, backend.dialect).sql
    assert ROW_ID not in sql and "DISTINCT ON" in sql
    (row,) = exact_rows(backend, plan).values()
    expected = exact_con.execute("SELECT COUNT(*) FROM r WHERE k IN ('a', 'b', 'c', 'hot')")
    assert row[0] == expected.fetchone()[0]  # type: ignore[index]


# -- plans, EXPLAIN, policy ---------------------------------------------------------------------

def test_sensitivity_is_that_of_the_private_table(policy: Policy) -> None:
    plan = plan_for(policy, "SELECT pub.w, SUM(pub.w) FROM t JOIN pub USING (k) GROUP BY pub.w",
                    analyst=ANALYST)
    (m,) = plan.measurements
    # ≤ 2 groups per unit (w has no public values, so partition selection), 3 rows, w ≤ 9
    assert m.sensitivity == MAX_GROUPS * MAX_ROWS * 9
    assert plan.selection is not None


def test_explain_shows_the_join(ana: Session) -> None:
    rows = ana.execute("EXPLAIN SELECT grp, COUNT(*) FROM t LEFT JOIN pub USING (k) "
                       "GROUP BY grp").rows
    text = "\n".join(row[0] for row in rows)
    assert "Join: LEFT JOIN pub ON k = pub.k (may match several rows" in text
    assert 'LEFT JOIN "pub" AS "__t1" ON "__t0"."k" = "__t1"."k"' in text
    rows = ana.execute("EXPLAIN SELECT COUNT(*) FROM r JOIN lut l USING (k)").rows
    text = "\n".join(row[0] for row in rows)
    assert "l.k is declared unique" in text and "DISTINCT ON" in text
    assert spent(ana) == 0.0


def test_unique_only_on_public_tables(tmp_path: Path, joins_database: Path) -> None:
    text = POLICY.replace('path = "joins.duckdb"', f'path = "{joins_database.as_posix()}"')
    text = text.replace('[tables.r]\ncolumns.k = { type = "text" }',
                        '[tables.r]\ncolumns.k = { type = "text", unique = true }')
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(errors.InvalidPolicy, match="unique applies to columns of public"):
        load_policy(path)
