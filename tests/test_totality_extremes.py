"""Row expressions stay total at the ends of the date range and for huge positions, on
real DuckDB and PostgreSQL.

A statement that runs on a table and fails on the same table plus one row tells whether
that row exists, and no noise covers it. Each query here runs on a table of ordinary rows
and on the same table plus two rows (name 'omega') at the backend's extremes: its first
and last DATE and TIMESTAMP, and x = ±1e10 (a string position beyond ±2^32). It must run
on both, and the extreme rows may only add groups of their own: every other group keeps
its exact statistics. Where SQL's semantics exclude the extreme rows once their values
are NULL (a shifted date out of range, a position out of range), they add no group.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from dpproxy.backends import Backend, open_backend
from dpproxy.policy import Policy, load_policy
from tests.exact import exact_rows, plan_for
from tests.tables import Tables, backend_section, duckdb_with, postgres_with

POLICY = """
[backend]
BACKEND

[ledger]
path = "extremes.ledger.sqlite"

[privacy]
default_epsilon = 1.0

[tables.NAME]
privacy_unit = "uid"
max_rows_per_unit = 1
max_groups_per_unit = 1

[tables.NAME.columns]
uid = { type = "int", nullable = false }
day = { type = "date" }
ts = { type = "date" }
name = { type = "text" }
x = { type = "float" }

[analysts.alice]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["NAME"]
"""

COLUMNS = "uid INTEGER NOT NULL, day DATE, ts TIMESTAMP, name VARCHAR, x DOUBLE PRECISION"
ORDINARY = [
    (1, "2020-01-05", "2020-01-05 10:00:00", "alpha", 5.0),
    (2, "2020-02-10", "2020-02-10 11:30:00", "beta", 2.0),
    (3, "2021-03-15", "2021-03-15 00:00:00", "gamma", 1.0),
    (4, "2019-12-31", "2019-12-31 23:59:59", "delta", 4.0),
]
EXTREME = "omega"
# Each engine's last and first DATE and TIMESTAMP.
DUCKDB_EXTREMES = [
    (10, "5881580-07-10", "294247-01-10 04:00:54.775806", EXTREME, 1e10),
    (11, "-5877641-06-25", "290309-12-22 (BC) 00:00:00", EXTREME, -1e10),
]
POSTGRES_EXTREMES = [
    (10, "5874897-12-31", "294276-12-31 23:59:59.999999", EXTREME, 1e10),
    (11, "4714-11-24 BC", "4714-11-24 00:00:00 BC", EXTREME, -1e10),
]


def _tables(extremes: list[tuple[Any, ...]]) -> Tables:
    return {"base": (COLUMNS, ORDINARY), "extreme": (COLUMNS, ORDINARY + extremes)}


@pytest.fixture(scope="module")
def duckdb_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return duckdb_with(tmp_path_factory.mktemp("extremes") / "extremes.duckdb",
                       _tables(DUCKDB_EXTREMES))


@pytest.fixture(scope="module")
def postgres_dsn(pg_dsn: str) -> Iterator[str]:
    with postgres_with(pg_dsn, _tables(POSTGRES_EXTREMES)) as dsn:
        yield dsn


@pytest.fixture(scope="module", params=["duckdb", "postgres"])
def tables(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[dict[str, Policy], Backend]]:
    """A policy per table ("base", "extreme") and the backend holding both."""
    section = backend_section(request)
    folder = tmp_path_factory.mktemp(f"policies-{request.param}")
    policies = {}
    for name in ("base", "extreme"):
        file = folder / f"{name}.toml"
        file.write_text(POLICY.replace("BACKEND", section).replace("NAME", name))
        policies[name] = load_policy(file)
    backend = open_backend(policies["extreme"])
    yield policies, backend
    backend.close()


Extremes = Literal["none", "null", "any"]


def assert_extremes_apart(tables: tuple[dict[str, Policy], Backend], sql: str,
                          extremes: Extremes) -> None:
    """`sql` (grouped by name first, reading TABLE) runs on both tables; the extreme rows
    change no group of the ordinary rows, and add: no group ("none"), only groups whose
    other keys are NULL ("null"), or groups of their own ("any")."""
    policies, backend = tables
    rows = {name: exact_rows(backend, plan_for(policy, sql.replace("TABLE", name)))
            for name, policy in policies.items()}
    ordinary = {key: value for key, value in rows["extreme"].items() if key[0] != EXTREME}
    assert ordinary == rows["base"], sql
    added = {key: value for key, value in rows["extreme"].items() if key[0] == EXTREME}
    assert sum(value[0] for value in added.values()) <= 2
    if extremes == "none":
        assert added == {}
    elif extremes == "null":
        assert all(value is None for key in added for value in key[1:])


@pytest.mark.parametrize("predicate", [
    "day + 7 > DATE '2020-01-01'", "day - 7 < DATE '2022-01-01'",
    "7 + day > DATE '2020-01-01'", "day + 999999 > DATE '2020-01-01'",
    "day - 999999 < DATE '2020-01-01'", "(day + 7) - 7 >= DATE '2019-01-01'",
])
def test_date_shift_is_null_at_the_ends_of_the_range(
        tables: tuple[dict[str, Policy], Backend], predicate: str) -> None:
    assert_extremes_apart(
        tables, f"SELECT name, COUNT(*) FROM TABLE WHERE {predicate} GROUP BY name", "none")


def test_shifted_date_key_is_null_at_the_ends_of_the_range(
        tables: tuple[dict[str, Policy], Backend]) -> None:
    assert_extremes_apart(
        tables, "SELECT name, day + 7 AS d, COUNT(*) FROM TABLE GROUP BY name, d", "null")


def test_date_difference_cannot_overflow_later_arithmetic(
        tables: tuple[dict[str, Policy], Backend]) -> None:
    # DuckDB's date − date is a BIGINT: × 10^10 overflowed at the far ends
    assert_extremes_apart(
        tables, "SELECT name, (day - DATE '2020-01-01') * 10000000000 AS d, COUNT(*) "
                "FROM TABLE GROUP BY name, d", "any")


UNITS = ("microseconds", "milliseconds", "second", "minute", "hour", "day", "week", "month",
         "quarter", "year", "decade", "century", "millennium")
PARTS = ("year", "month", "day", "dow", "isodow", "doy", "quarter", "hour", "minute", "week",
         "decade", "century", "millennium", "isoyear", "second", "epoch", "milliseconds",
         "microseconds")


def test_date_trunc_reads_every_date(tables: tuple[dict[str, Policy], Backend]) -> None:
    # every unit the analyzer admits, on a DATE and a TIMESTAMP column
    for column in ("day", "ts"):
        for unit in UNITS:
            assert_extremes_apart(
                tables, f"SELECT name, date_trunc('{unit}', {column}) AS m, COUNT(*) "
                        "FROM TABLE GROUP BY name, m", "any")


def test_date_trunc_filter_excludes_what_it_cannot_truncate(
        tables: tuple[dict[str, Policy], Backend]) -> None:
    for sql in ("SELECT name, COUNT(*) FROM TABLE WHERE date_trunc('year', day) "
                "> DATE '2020-06-01' GROUP BY name",
                "SELECT date_trunc('month', day) AS m, name, COUNT(*) FROM TABLE "
                "GROUP BY name, m"):
        assert_extremes_apart(tables, sql, "none" if "WHERE" in sql else "null")


def test_extract_reads_every_date(tables: tuple[dict[str, Policy], Backend]) -> None:
    # every field the analyzer admits, on a DATE and a TIMESTAMP column
    for column in ("day", "ts"):
        for part in PARTS:
            assert_extremes_apart(
                tables, f"SELECT name, EXTRACT({part} FROM {column}) AS e, COUNT(*) "
                        "FROM TABLE GROUP BY name, e", "any")


def test_cast_to_timestamp_reads_every_date(
        tables: tuple[dict[str, Policy], Backend]) -> None:
    assert_extremes_apart(
        tables, "SELECT name, CAST(day AS TIMESTAMP) AS t, COUNT(*) FROM TABLE "
                "GROUP BY name, t", "null")


@pytest.mark.parametrize("text", [
    "SUBSTRING(name, x)", "SUBSTRING(name FROM 2 FOR x)", "SUBSTRING(name, CAST(x AS BIGINT))",
    "SUBSTRING(name FROM CAST(x AS BIGINT) FOR CAST(x AS BIGINT))",
])
def test_substring_position_beyond_int_is_null(
        tables: tuple[dict[str, Policy], Backend], text: str) -> None:
    assert_extremes_apart(
        tables, f"SELECT name, COUNT(*) FROM TABLE WHERE {text} <> '' GROUP BY name", "none")


@pytest.mark.parametrize("key", [
    "CASE WHEN x > 1e9 THEN 2147483647 ELSE 0 END * 2",
    "CASE WHEN x > 1e9 THEN 9223372036854775807 ELSE 0 END + 1",
    "0 - CASE WHEN x < -1e9 THEN 9223372036854775807 ELSE 0 END - 2",
    "-(CASE WHEN x > 1e9 THEN 2147483647 ELSE 0 END * 3)",
])
def test_integer_constants_picked_by_the_data_cannot_overflow(
        tables: tuple[dict[str, Policy], Backend], key: str) -> None:
    # DuckDB types these constants INTEGER or BIGINT: arithmetic on them overflowed only on
    # the rows whose x picks the large one
    assert_extremes_apart(tables, f"SELECT name, {key} AS k, COUNT(*) FROM TABLE "
                                  "GROUP BY name, k", "any")


def test_round_to_digits_rounds_decimal_ties_away_from_zero(
        tables: tuple[dict[str, Policy], Backend]) -> None:
    """12.45 and -2.65 as DOUBLEs lie just below their ties (12.4499…): PostgreSQL's NUMERIC
    and the DuckDB rewrite both round the decimal away from zero, whatever DuckDB's own
    ROUND(x, n) does in the installed release (2.0.1 gives 12.4)."""
    policies, backend = tables
    sql = ("SELECT ROUND(x * 0 + 12.45, 1) AS r, ROUND(x * 0 - 2.65, 1) AS s, "
           "ROUND(x * 0 + 1234.5678, 400) AS t, COUNT(*) FROM base GROUP BY r, s, t")
    assert set(exact_rows(backend, plan_for(policies["base"], sql))) == {(12.5, -2.7, 1234.5678)}
