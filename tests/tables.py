"""The same small tables in a DuckDB file and in a scratch PostgreSQL database, for tests
that run one policy on both backends (their fixtures `duckdb_file` and `postgres_dsn`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest

# name → (column definitions, in types both engines know, and rows)
Tables = Mapping[str, tuple[str, Sequence[tuple[Any, ...]]]]


def duckdb_with(path: Path, tables: Tables) -> Path:
    con = duckdb.connect(str(path))
    for name, (columns, rows) in tables.items():
        con.execute(f"CREATE TABLE {name} ({columns})")
        if rows:
            marks = ", ".join("?" for _ in rows[0])
            con.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    con.close()
    return path


@contextlib.contextmanager
def postgres_with(admin_dsn: str, tables: Tables) -> Iterator[str]:
    """A scratch database holding the tables; its DSN."""
    from tests.pg import scratch_database

    with scratch_database(admin_dsn) as dsn:
        with psycopg.connect(dsn) as con, con.cursor() as cur:
            for name, (columns, rows) in tables.items():
                cur.execute(f"CREATE TABLE {name} ({columns})")
                if rows:
                    marks = ", ".join("%s" for _ in rows[0])
                    cur.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
        yield dsn


def database_fixtures(name: str, tables: Tables) -> tuple[Any, Any]:
    """The module-scoped fixtures `duckdb_file` and `postgres_dsn`, each holding `tables`
    (a DuckDB file named after `name`, a scratch PostgreSQL database), that
    `backend_section` reads. A test module binds them to those names:
    `duckdb_file, postgres_dsn = database_fixtures("name", TABLES)`."""

    @pytest.fixture(scope="module")
    def duckdb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return duckdb_with(tmp_path_factory.mktemp(name) / f"{name}.duckdb", tables)

    @pytest.fixture(scope="module")
    def postgres_dsn(pg_dsn: str) -> Iterator[str]:
        with postgres_with(pg_dsn, tables) as dsn:
            yield dsn

    return duckdb_file, postgres_dsn


def backend_section(request: pytest.FixtureRequest) -> str:
    """The policy's [backend] lines for the test's backend parameter, "duckdb" or
    "postgres", from the module's `duckdb_file` or `postgres_dsn` fixture."""
    if request.param == "duckdb":
        return f'kind = "duckdb"\npath = "{request.getfixturevalue("duckdb_file").as_posix()}"'
    return f'kind = "postgres"\ndsn = "{request.getfixturevalue("postgres_dsn")}"'
