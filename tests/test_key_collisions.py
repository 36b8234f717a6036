"""Group keys the backend keeps apart must stay apart when released, on real DuckDB and
PostgreSQL.

PostgreSQL's NUMERIC reaches Python as a float, DuckDB's DECIMAL as a Decimal that a
float key becomes a float: 9.99 and 9.990000000000000000001, or 2^53 and 2^53 + 1,
would be two groups in the backend and one key in Python, where one group's statistics
replaced the other's. One unit with the second value then removed a group of 100 from
the answer. So the rewrite groups such keys by the double they are released as
(`rewrite.released_key`), and these tests check, from the exact pre-noise statistics,
that the neighbour's unit joins the large group instead.

The engine reads each column's database type when it opens its backend; a policy column
or table the database lacks is refused before anything is charged.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpproxy import errors
from dpproxy.analyze.keys import normalize_key
from dpproxy.release import release
from dpproxy.session import Engine
from tests.exact import exact_rows, plan_for
from tests.tables import backend_section, database_fixtures

POLICY = """
[backend]
BACKEND

[ledger]
path = "collisions.ledger.sqlite"

[privacy]
default_epsilon = 1.0

[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = 1
max_groups_per_unit = 1

[tables.NAME.columns]
uid = { type = "int", nullable = false }
price = { type = "float" }
big = { type = "int" }
EXTRA
[analysts.bob]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["NAME"]
"""

TWO_53 = 2**53
FILLER = [(1000 + u, float(u % 7), u % 5) for u in range(300)]
CROWD = [(u, "9.99", TWO_53) for u in range(100)]  # 100 units with one price and one big
NEIGHBOUR = [(999, "9.990000000000000000001", TWO_53 + 1)]  # one more unit, a hair apart
# DECIMAL(38,30) / NUMERIC(38,30) hold both prices exactly, DECIMAL(38,0) both bigs
COLUMNS = "uid INTEGER NOT NULL, price DECIMAL(38,30), big DECIMAL(38,0)"
TABLES = {"d": CROWD + FILLER, "d1": CROWD + FILLER + NEIGHBOUR}
# Dates: Python holds years 1 to 9999; the backends give it infinity as 9999-12-31. A
# timestamp column declared a date is released by its day.
DATE_COLUMNS = "uid INTEGER NOT NULL, day DATE, ts TIMESTAMP"
DATE_CROWD = [(u, "infinity", "2024-03-01 10:00:00") for u in range(100)]
DATE_FILLER = [(1000 + u, f"2024-01-0{1 + u % 5}", f"2024-01-0{1 + u % 5} 00:00:00")
               for u in range(300)]
DATE_NEIGHBOUR = [(999, "9999-12-31", "2024-03-01 11:00:00")]
DATE_TABLES = {"dd": DATE_CROWD + DATE_FILLER, "dd1": DATE_CROWD + DATE_FILLER + DATE_NEIGHBOUR}
DATE_POLICY_COLUMNS = 'uid = { type = "int", nullable = false }\nday = { type = "date" }\n' \
    'ts = { type = "date" }\n'


duckdb_file, postgres_dsn = database_fixtures(
    "collisions", {**{name: (COLUMNS, rows) for name, rows in TABLES.items()},
                   **{name: (DATE_COLUMNS, rows) for name, rows in DATE_TABLES.items()}})


def policy_file(tmp_path: Path, backend: str, table: str, extra: str = "") -> Path:
    file = tmp_path / f"{table}.toml"
    file.write_text(POLICY.replace("BACKEND", backend).replace("NAME", table)
                    .replace("EXTRA", extra))
    return file


@pytest.fixture(params=["duckdb", "postgres"])
def backend_lines(request: pytest.FixtureRequest) -> str:
    return backend_section(request)


@pytest.fixture
def engines(backend_lines: str, tmp_path: Path) -> Iterator[dict[str, Engine]]:
    opened = {t: Engine.from_path(policy_file(tmp_path / t, backend_lines, t))
              for t in TABLES if (tmp_path / t).mkdir() is None}
    yield opened
    for engine in opened.values():
        engine.close()


def exact(engine: Engine, sql: str) -> dict[tuple[Any, ...], tuple[float, ...]]:
    return exact_rows(engine.backend, plan_for(engine.policy, sql, analyst="bob"))


@pytest.mark.parametrize(("sql", "key"), [
    ("SELECT price, COUNT(*) FROM TABLE GROUP BY price", 9.99),
    ("SELECT big, COUNT(*) FROM TABLE GROUP BY big", TWO_53),
    ("SELECT big + 0 AS b, COUNT(*) FROM TABLE GROUP BY b", TWO_53),
    ("SELECT price * 1 AS p, COUNT(*) FROM TABLE GROUP BY p", 9.99),
])
def test_a_neighbour_a_hair_apart_joins_the_group(engines: dict[str, Engine], sql: str,
                                                  key: object) -> None:
    """The backend returns one row per released key, and the neighbour's unit counts in
    the crowd's group: 100 units, then 101 (not the neighbour's 1 replacing them)."""
    before = exact(engines["d"], sql.replace("TABLE", "d"))
    after = exact(engines["d1"], sql.replace("TABLE", "d1"))
    assert before[(key,)][0] == 100
    assert after[(key,)][0] == 101
    assert set(after) == set(before)


def test_released_groups_come_from_distinct_backend_rows(engines: dict[str, Engine]) -> None:
    """Through release: the crowd's key is released with the crowd's count (a group of
    101 units is far above the selection threshold, its noise sd about 1.4)."""
    engine = engines["d1"]
    plan = plan_for(engine.policy, "SELECT price, COUNT(*) FROM d1 GROUP BY price",
                    analyst="bob")
    rewritten = engine.rewritten(plan)
    rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
    released = {r[0]: r[1] for r in release(plan, rows).rows}
    assert abs(released[9.99] - 101) < 30  # 1e-6 false-failure rate is ~20 sd away


def test_engine_reads_column_types(engines: dict[str, Engine]) -> None:
    columns = engines["d"].policy.tables["d"].columns
    assert columns["uid"].storage == "integer"
    assert columns["price"].storage in ("decimal(38,30)", "numeric")  # DuckDB, PostgreSQL


@pytest.mark.parametrize(("table", "extra", "sql", "sqlstate"), [
    ("d", 'typo = { type = "int", lower = 0, upper = 9 }\n', "SELECT SUM(typo) FROM d",
     "42703"),
    ("absent", "", "SELECT COUNT(*) FROM absent", "42P01")])
def test_what_the_database_lacks_is_refused_before_any_charge(
        backend_lines: str, tmp_path: Path, table: str, extra: str, sql: str,
        sqlstate: str) -> None:
    """A policy column (or a whole table) the database does not have: refused at analysis,
    for free, not charged and then failed in the backend."""
    with Engine.from_path(policy_file(tmp_path, backend_lines, table, extra)) as engine:
        session = engine.session("bob")
        before = session.remaining()
        with pytest.raises(errors.ProgrammingError) as info:
            session.execute(sql)
        assert info.value.sqlstate == sqlstate and "not in the database" in str(info.value)
        assert session.remaining() == before
        if table == "d":
            assert session.execute("SELECT COUNT(*) FROM d").rows  # the rest still works


@pytest.mark.parametrize(("sql", "key"), [
    ("SELECT day, COUNT(*) FROM TABLE GROUP BY day", "9999-12-31"),
    ("SELECT DATE_TRUNC('hour', ts) AS h, COUNT(*) FROM TABLE GROUP BY h", "2024-03-01"),
])
def test_a_neighbour_on_the_same_released_date_joins_the_group(
        backend_lines: str, tmp_path: Path, sql: str, key: str) -> None:
    """infinity and 9999-12-31, or 10:00 and 11:00 of one day, are released as one date:
    grouped apart, the neighbour's group of 1 replaced the crowd's 100 (a review found it
    on PostgreSQL). Grouped as released, the crowd has 101."""
    counts = []
    for table in DATE_TABLES:
        policy = POLICY.replace("BACKEND", backend_lines).replace("NAME", table).replace(
            'price = { type = "float" }\nbig = { type = "int" }\n', DATE_POLICY_COLUMNS
        ).replace("uid = { type = \"int\", nullable = false }\n", "", 1).replace("EXTRA", "")
        (tmp_path / table).mkdir()
        path = tmp_path / table / "p.toml"
        path.write_text(policy)
        with Engine.from_path(path) as engine:
            plan = plan_for(engine.policy, sql.replace("TABLE", table), analyst="bob")
            rewritten = engine.rewritten(plan)
            rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
        # the backend's rows, keyed as released: exactly one holds the key
        mine = [r for r in rows if normalize_key(r[0], "date") == key]
        assert len(mine) == 1, rows
        counts.append(mine[0][1])
    assert counts == [100, 101]
