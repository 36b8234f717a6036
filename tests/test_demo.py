"""The bundled demo database: exact counts, ranges, skew, reproducibility, atomic writes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import duckdb
import pytest

from dpproxy import demo
from dpproxy.demo import (
    ADULT_ROWS,
    DEFAULT_SEED,
    OCCUPATION_COUNTS,
    build_demo,
    ensure_demo,
)

TABLES = ("adult", "visits", "occupation_groups")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    messages: list[str] = []
    path = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    start = time.perf_counter()
    result = build_demo(path, progress=messages.append)
    print(f"\ndemo build (seed {DEFAULT_SEED}) took {time.perf_counter() - start:.2f} s")
    assert result == path
    return path, messages


@pytest.fixture(scope="module")
def con(built: tuple[Path, list[str]]) -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(str(built[0]), read_only=True)
    yield connection
    connection.close()


def one(con: duckdb.DuckDBPyConnection, sql: str) -> tuple:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row


def checksums(path: Path) -> dict[str, tuple]:
    """Order-insensitive (row count, sum of row hashes) per table."""
    with duckdb.connect(str(path), read_only=True) as c:
        return {t: one(c, f"SELECT count(*), sum(hash(t)) FROM {t} t") for t in TABLES}


def test_schema(con: duckdb.DuckDBPyConnection) -> None:
    def columns(table: str) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in con.execute(f"DESCRIBE {table}").fetchall()]

    assert columns("adult") == [
        ("person_id", "INTEGER"), ("age", "INTEGER"), ("sex", "VARCHAR"),
        ("education", "VARCHAR"), ("education_num", "INTEGER"), ("hours_per_week", "INTEGER"),
        ("capital_gain", "INTEGER"), ("income", "VARCHAR"), ("occupation", "VARCHAR"),
    ]
    assert columns("visits") == [
        ("visit_id", "BIGINT"), ("person_id", "INTEGER"), ("day", "DATE"), ("amount", "DOUBLE"),
    ]
    assert columns("occupation_groups") == [("occupation", "VARCHAR"), ("collar", "VARCHAR")]
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    assert tables == set(TABLES)


def test_adult_rows_and_person_ids(con: duckdb.DuckDBPyConnection) -> None:
    assert ADULT_ROWS == 32_561
    row = one(con, "SELECT count(*), count(DISTINCT person_id), min(person_id), max(person_id),"
                   " count(person_id) FROM adult")
    assert row == (ADULT_ROWS, ADULT_ROWS, 1, ADULT_ROWS, ADULT_ROWS)


def test_occupation_counts_exact(con: duckdb.DuckDBPyConnection) -> None:
    got = dict(con.execute("SELECT occupation, count(*) FROM adult GROUP BY ALL").fetchall())
    assert sum(OCCUPATION_COUNTS.values()) + 1_843 == ADULT_ROWS
    assert got == {**OCCUPATION_COUNTS, None: 1_843}
    assert list(OCCUPATION_COUNTS)[:3] == ["Adm-clerical", "Exec-managerial", "Handlers-cleaners"]


def test_adult_ranges(con: duckdb.DuckDBPyConnection) -> None:
    row = one(con, """
        SELECT min(age), max(age), min(hours_per_week), max(hours_per_week),
               min(capital_gain), max(capital_gain), min(education_num), max(education_num)
        FROM adult""")
    assert row[0] >= 17 and row[1] <= 90
    assert row[2] >= 1 and row[3] <= 99
    assert row[4] == 0 and row[5] <= 99_999
    assert (row[6], row[7]) == (1, 16)
    for column in ("age", "sex", "education", "education_num", "hours_per_week",
                   "capital_gain", "income"):
        assert one(con, f"SELECT count(*) FROM adult WHERE {column} IS NULL") == (0,)
    assert {r[0] for r in con.execute("SELECT DISTINCT sex FROM adult").fetchall()} == {
        "Male", "Female"}
    assert {r[0] for r in con.execute("SELECT DISTINCT income FROM adult").fetchall()} == {
        "<=50K", ">50K"}


def test_education_consistent(con: duckdb.DuckDBPyConnection) -> None:
    pairs = con.execute("SELECT DISTINCT education, education_num FROM adult").fetchall()
    expected = {name: i for i, name in enumerate(demo.EDUCATION_COUNTS, start=1)}
    assert len(pairs) == 16
    assert dict(pairs) == expected
    assert expected["HS-grad"] == 9 and expected["Bachelors"] == 13 and expected["Doctorate"] == 16
    counts = dict(con.execute("SELECT education, count(*) FROM adult GROUP BY ALL").fetchall())
    assert counts["HS-grad"] > counts["Some-college"] > counts["Bachelors"] > counts["Masters"]
    assert counts["Preschool"] < 200
    # Nobody aged 17 has finished high school.
    assert one(con, "SELECT max(education_num) FROM adult WHERE age = 17")[0] <= 8


def test_adult_distributions_like_census(con: duckdb.DuckDBPyConnection) -> None:
    mean_age, male, high, zero_gain, hours_mode = one(con, """
        SELECT avg(age), avg((sex = 'Male')::INT), avg((income = '>50K')::INT),
               avg((capital_gain = 0)::INT), mode(hours_per_week) FROM adult""")
    assert 37.0 < mean_age < 40.5
    assert 0.62 < male < 0.72
    assert 0.22 < high < 0.26
    assert 0.89 < zero_gain < 0.95
    assert hours_mode == 40
    # More young adults than old people: the age distribution is right-skewed.
    assert one(con, "SELECT median(age) < avg(age) FROM adult") == (True,)
    # Income is correlated with education, age and hours.
    rate = "avg((income = '>50K')::INT)"
    by_degree = one(con, f"SELECT {rate} FILTER (education_num >= 13),"
                         f" {rate} FILTER (education_num <= 9) FROM adult")
    assert by_degree[0] > by_degree[1] + 0.2
    by_age = one(con, f"SELECT {rate} FILTER (age BETWEEN 40 AND 55),"
                      f" {rate} FILTER (age < 25) FROM adult")
    assert by_age[0] > by_age[1] + 0.1
    by_hours = one(con, f"SELECT {rate} FILTER (hours_per_week > 45),"
                        f" {rate} FILTER (hours_per_week < 35) FROM adult")
    assert by_hours[0] > by_hours[1]


def test_visits_ranges(con: duckdb.DuckDBPyConnection) -> None:
    row = one(con, """
        SELECT count(*), count(DISTINCT visit_id), min(day), max(day), min(amount), max(amount),
               count(*) FILTER (amount <> round(amount, 2))
        FROM visits""")
    count, distinct_ids, first, last, low, high, not_cents = row
    assert distinct_ids == count
    assert first >= date(2024, 1, 1) and last <= date(2024, 12, 31)
    assert low >= 0.0 and high <= 500.0
    assert not_cents == 0
    orphans = one(con, "SELECT count(*) FROM visits v ANTI JOIN adult a USING (person_id)")
    assert orphans == (0,)


def test_visits_per_person_skewed(con: duckdb.DuckDBPyConnection) -> None:
    row = one(con, """
        WITH per AS (
            SELECT a.person_id, count(v.visit_id) AS n
            FROM adult a LEFT JOIN visits v USING (person_id) GROUP BY a.person_id
        )
        SELECT count(*), min(n), max(n), avg(n), median(n), count(*) FILTER (n = 50) FROM per""")
    people, low, high, mean, median, at_cap = row
    assert people == ADULT_ROWS
    assert (low, high) == (1, demo.MAX_VISITS_PER_PERSON) == (1, 50)
    assert 6.0 < mean < 10.0
    assert median < mean  # a long right tail
    assert at_cap >= 1


def test_occupation_groups(con: duckdb.DuckDBPyConnection) -> None:
    rows = con.execute("SELECT occupation, collar FROM occupation_groups").fetchall()
    assert len(rows) == 14
    assert sorted(o for o, _ in rows) == sorted(OCCUPATION_COUNTS)
    assert {c for _, c in rows} == {"white", "blue", "service", "military"}
    assert dict(rows)["Armed-Forces"] == "military"


def test_progress_messages(built: tuple[Path, list[str]], con: duckdb.DuckDBPyConnection) -> None:
    messages = built[1]
    visits = one(con, "SELECT count(*) FROM visits")[0]
    assert "adult: 32,561 people" in messages
    assert f"visits: {visits:,} rows" in messages


def test_same_seed_same_data(built: tuple[Path, list[str]], tmp_path: Path) -> None:
    again = build_demo(tmp_path / "again.duckdb", seed=DEFAULT_SEED)
    assert checksums(again) == checksums(built[0])


def test_different_seed_different_data(built: tuple[Path, list[str]], tmp_path: Path) -> None:
    other = checksums(build_demo(tmp_path / "other.duckdb", seed=DEFAULT_SEED + 1))
    base = checksums(built[0])
    assert other["adult"] != base["adult"]
    assert other["visits"] != base["visits"]
    assert other["adult"][0] == ADULT_ROWS
    assert other["occupation_groups"] == base["occupation_groups"]  # public, not random


def test_ensure_demo_builds_when_missing(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "data" / "demo.duckdb"
    messages: list[str] = []
    assert ensure_demo(path, progress=messages.append) == path
    assert path.is_file() and messages
    assert checksums(path)["adult"][0] == ADULT_ROWS


def test_ensure_demo_keeps_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.duckdb"
    build_demo(path)
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = checksums(path)
    messages: list[str] = []
    assert ensure_demo(path, seed=DEFAULT_SEED + 7, progress=messages.append) == path
    assert path.stat().st_mtime_ns == 1_000_000_000_000_000_000
    assert messages == []
    assert checksums(path) == before


def test_build_replaces_existing_file_and_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "demo.duckdb"
    path.write_bytes(b"not a database")
    Path(f"{path}.wal").write_bytes(b"stale log from an old file")
    assert build_demo(str(path)) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.duckdb"]
    assert checksums(path)["adult"][0] == ADULT_ROWS


def test_failed_build_keeps_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "demo.duckdb"
    path.write_bytes(b"previous contents")

    def broken(*_args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(demo, "_write", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        build_demo(path)
    assert path.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.duckdb"]


def test_build_time(tmp_path: Path) -> None:
    start = time.perf_counter()
    path = build_demo(tmp_path / "timed.duckdb")
    elapsed = time.perf_counter() - start
    print(f"\ndemo build took {elapsed:.2f} s ({path.stat().st_size / 1e6:.1f} MB)")
    assert path.is_file()
