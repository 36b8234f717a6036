"""A row expression three ways, row by row: DuckDB running dpproxy's DuckDB rewrite,
PostgreSQL running its PostgreSQL rewrite, and PostgreSQL running the expression itself
(or a form of it PostgreSQL has an operator for). The differential tests of TO_CHAR,
regular expressions and date arithmetic compare the three."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import duckdb
import psycopg
import sqlglot

from dpproxy.clock import fold
from dpproxy.policy import TablePolicy
from dpproxy.rewrite import make_total

Connections = tuple[duckdb.DuckDBPyConnection, psycopg.Connection[Any]]


def loaded(pg_dsn: str, table: str, column: str, sql_type: str, values: Sequence[object]
           ) -> Iterator[Connections]:
    """For a module fixture: an in-memory DuckDB and a PostgreSQL session (in UTC, as
    dpproxy's are), each holding the table (i int, <column> <sql_type>) of `values` in
    order (in PostgreSQL a temporary one)."""
    with psycopg.connect(pg_dsn, autocommit=True) as postgres:
        postgres.execute("SET TIME ZONE 'UTC'")
        postgres.execute(f"CREATE TEMP TABLE {table} (i int, {column} {sql_type})")
        with postgres.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} VALUES (%s, %s)", list(enumerate(values)))
        duck = duckdb.connect()
        duck.execute(f"CREATE TABLE {table} (i INT, {column} {sql_type})")
        duck.executemany(f"INSERT INTO {table} VALUES (?, ?)", list(enumerate(values)))
        yield duck, postgres
        duck.close()


def three_ways(duck: duckdb.DuckDBPyConnection, postgres: psycopg.Connection[Any],
               table: TablePolicy, expression: str, native: str | None = None
               ) -> list[tuple[Any, Any, Any]]:
    """(DuckDB's rewrite, PostgreSQL's rewrite, PostgreSQL's own) value per row of the
    table, in order of i. The expression is bound as a statement is (`clock.fold`, no
    clock): its constant date arithmetic is evaluated first."""
    node = fold(sqlglot.parse_one(f"SELECT {expression}", read="postgres"), None).expressions[0]
    order = f"FROM {table.name} ORDER BY i"
    on_duckdb = duck.execute(f"SELECT {make_total(node, table).sql('duckdb')} {order}")
    on_postgres = postgres.execute(
        f"SELECT {make_total(node, table, 'postgres').sql('postgres')} {order}")
    own = postgres.execute(f"SELECT {native or expression} {order}")
    return [(a, b, c) for (a,), (b,), (c,) in zip(on_duckdb.fetchall(), on_postgres.fetchall(),
                                                  own.fetchall(), strict=True)]


def disagreements(connections: Connections, table: TablePolicy, values: Sequence[object],
                  calls: Sequence[tuple[str, str]]) -> list[tuple[str, object, tuple[Any, ...]]]:
    """(expression, value, its three results) wherever `three_ways` disagrees, for each
    (expression as dpproxy runs it, PostgreSQL's own form) of `calls`: numbers compare as
    floats (DuckDB's DOUBLE, PostgreSQL's NUMERIC), NULL only with NULL."""
    def same(row: tuple[Any, Any, Any]) -> bool:
        if any(v is None for v in row):
            return all(v is None for v in row)
        return float(row[0]) == float(row[1]) == float(row[2])

    out = []
    for expression, native in calls:
        rows = three_ways(*connections, table, expression, native=native)
        out += [(expression, v, r) for v, r in zip(values, rows, strict=True) if not same(r)]
    return out


def folded(call: str, fold: Callable[[sqlglot.exp.Expression], sqlglot.exp.Expression]
           ) -> str:
    """The SQL an analyzer fold (`fold_width_buckets`, `fold_ages`) makes of one
    select-list expression, without the alias a fold may give it."""
    item = fold(sqlglot.parse_one(f"SELECT {call}", read="postgres")).expressions[0]
    return (item.this if isinstance(item, sqlglot.exp.Alias) else item).sql("postgres")
