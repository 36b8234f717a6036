"""Column types beyond the demo's, as a review of real PostgreSQL tables found them.

Group keys whose values the backend compares otherwise than their text: a
nondeterministic collation (as citext) groups 'Foo' with 'foo', char(n) pads, jsonb loads
as Python objects, -0 and 0 are one group. A key is released as the text (or number) of
its own group, never a spelling one row decides (one unit moved a public key's count from
0 to 501). Columns whose values one row could make fail the query after the charge: text
declared a number or date, NUMERIC without a precision."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.session import Engine
from tests.pg import scratch_database

EPSILON = 1e6  # noise far below 1: the released counts are the exact ones

POLICY = """
[backend]
kind = "postgres"
dsn = "DSN"

[ledger]
path = "keys.ledger.sqlite"

[tables.t]
privacy_unit = "pid"
max_rows_per_unit = 1
max_groups_per_unit = 1

[tables.t.columns]
pid = { type = "int", nullable = false }
name = { type = "text", public_values = ["foo", "bar"] }
secret = { type = "text" }
ch = { type = "text", public_values = ["c0", "c1"] }
js = { type = "text" }
f = { type = "float" }

[analysts.a]
budget = { epsilon = 1e12, delta = 0.5 }
tables = ["t"]
"""


@pytest.fixture
def database(pg_dsn: str) -> Iterator[str]:
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE COLLATION nocase (provider = icu, "
                        "locale = 'und-u-ks-level2', deterministic = false)")
            con.execute("CREATE TABLE t (pid INTEGER NOT NULL, name TEXT COLLATE nocase, "
                        "secret TEXT COLLATE nocase, ch CHAR(5), js JSONB, "
                        "f DOUBLE PRECISION)")
        yield dsn


def answers(dsn: str, tmp_path: Path, rows: list[tuple[object, ...]], sql: str
            ) -> list[tuple[object, ...]]:
    """The released rows of `sql` at ε = 1e6 on a table holding `rows`."""
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute("TRUNCATE t")
        with con.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s, %s)", rows)
    policy = tmp_path / "keys.toml"
    policy.write_text(POLICY.replace("DSN", dsn))
    (tmp_path / "keys.ledger.sqlite").unlink(missing_ok=True)  # no cached answers
    with Engine.from_path(policy) as engine:
        return [tuple(r) for r in engine.session("a", epsilon=EPSILON).execute(sql).rows]


def crowd(spelling: str) -> list[tuple[object, ...]]:
    return [(pid, spelling, spelling.upper(), "c0", '"plain"', 0.0) for pid in range(1, 501)]


def test_a_case_insensitive_key_is_grouped_by_its_own_spelling(database: str,
                                                               tmp_path: Path) -> None:
    """500 people spelled 'Foo' and one spelled 'foo', read first: PostgreSQL made them one
    group keyed 'foo' (501 for the public value 'foo', where without that person it was
    0) and released that person's spelling 'SECRET' of the private key. Grouped byte by
    byte, the one person moves the count of 'foo' by 1, and 'SECRET', a group of one, is
    not selected."""
    public = "SELECT name, COUNT(*) FROM t GROUP BY name ORDER BY name"
    private = "SELECT secret, COUNT(*) FROM t GROUP BY secret"
    without = answers(database, tmp_path, crowd("Foo"), public)
    one = (0, "foo", "SECRET", "c0", '"plain"', 0.0)
    with_one = answers(database, tmp_path, [one, *crowd("Foo")], public)
    assert without == [("bar", 0), ("foo", 0)] and with_one == [("bar", 0), ("foo", 1)]
    assert answers(database, tmp_path, [one, *crowd("Foo")], private) == [("FOO", 500)]


def test_char_keys_match_their_public_values(database: str, tmp_path: Path) -> None:
    """char(5) values come padded ('c0   '): they matched no public value, and every
    count was released as 0."""
    rows = [(pid, "foo", "x", f"c{pid % 2}", '"plain"', 1.0) for pid in range(1, 101)]
    assert answers(database, tmp_path, rows, "SELECT ch, COUNT(*) FROM t GROUP BY ch "
                                             "ORDER BY ch") == [("c0", 50), ("c1", 50)]


def test_a_json_key_is_released_as_its_text(database: str, tmp_path: Path) -> None:
    """A jsonb object loads as a dict, which cannot key a group: the query was charged,
    then failed, where a neighbour without that row answered."""
    rows = [*crowd("foo"), *[(pid, "foo", "x", "c0", '{"x": 1}', 0.0)
                             for pid in range(600, 700)]]
    got = answers(database, tmp_path, rows, "SELECT js, COUNT(*) FROM t GROUP BY js "
                                            "ORDER BY js")
    assert got == [('"plain"', 500), ('{"x": 1}', 100)]


@pytest.mark.parametrize("first", [-0.0, 0.0])
def test_minus_zero_is_released_as_zero(database: str, tmp_path: Path, first: float) -> None:
    """-0 and 0 are one group, keyed by whichever row PostgreSQL reads first: the key
    released is 0.0 either way."""
    rows = [(0, "foo", "x", "c0", '"plain"', first), *crowd("foo")]
    ((key, count),) = answers(database, tmp_path, rows, "SELECT f, COUNT(*) FROM t "
                                                       "GROUP BY f")
    assert key == 0.0 and math.copysign(1.0, key) == 1.0 and count == 501


MISMATCHED = """
[backend]
kind = "postgres"
dsn = "DSN"

[ledger]
path = "mismatch.ledger.sqlite"

[tables.m]
privacy_unit = "pid"

[tables.m.columns]
pid = { type = "int", nullable = false }
age = { type = "int", lower = 0, upper = 100 }
day = { type = "date", lower = "2024-01-01", upper = "2024-12-31" }
g = { type = "text", public_values = ["a", "b"] }

[analysts.a]
budget = { epsilon = 10.0 }
tables = ["m"]
"""


@pytest.mark.parametrize("sql", [
    "SELECT SUM(age) FROM m WHERE g = 'b'", "SELECT g, AVG(age + 1) FROM m GROUP BY g",
    "SELECT COUNT(*) FROM m WHERE day > DATE '2024-02-01'", "SELECT MIN(day) FROM m"])
def test_a_text_column_declared_a_number_or_date_is_refused_uncharged(
        pg_dsn: str, tmp_path: Path, sql: str) -> None:
    """Each value was cast per row: one row reading 'unknown' made the query fail after
    the charge, and only where that row was read (whether it failed told whether such a
    row exists). Such a column is refused before the charge, whatever the data."""
    from dpproxy import errors

    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE TABLE m (pid INTEGER NOT NULL, age TEXT, day VARCHAR(10), "
                        "g TEXT)")
            con.execute("INSERT INTO m VALUES (1, '30', '2024-03-01', 'a'), "
                        "(2, 'unknown', 'n/a', 'b')")
        policy = tmp_path / "m.toml"
        policy.write_text(MISMATCHED.replace("DSN", dsn))
        with Engine.from_path(policy) as engine:
            with pytest.raises(errors.DatatypeMismatch, match="stored as"):
                engine.session("a", epsilon=0.5).execute(sql)
            assert engine.ledger.history() == []


def test_a_huge_numeric_value_fails_no_query(pg_dsn: str, tmp_path: Path) -> None:
    """NUMERIC without a precision holds up to 10^131072: n * n (a sum of squares, or
    written) overflowed NUMERIC on a row holding 1e70000, after the charge. A wide
    NUMERIC column is read within ±10^400, as every bound on digits assumes."""
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE TABLE m (pid INTEGER NOT NULL, age NUMERIC, day DATE, g TEXT)")
            con.execute("INSERT INTO m SELECT i, i % 7, NULL, 'a' FROM generate_series(1, 50) i")
            con.execute("INSERT INTO m VALUES (0, 1e70000, NULL, 'b')")
        policy = tmp_path / "m.toml"
        policy.write_text(MISMATCHED.replace("DSN", dsn))
        with Engine.from_path(policy) as engine:
            session = engine.session("a", epsilon=0.5)
            for sql in ("SELECT VAR_POP(age) FROM m", "SELECT g, SUM(age * age) FROM m GROUP BY g"):
                assert session.execute(sql).rows


def test_a_tiny_numeric_value_fails_no_query(pg_dsn: str, tmp_path: Path) -> None:
    """NUMERIC also holds 1e-16383: nine divisions by it overflowed NUMERIC on that one
    row, after the charge, and the same query answered on the table without it. A wide
    NUMERIC column is read to 400 decimal places, as every bound on digits assumes, so
    such a value reads as 0 and the division by it as NULL: both tables answer, charged."""
    chain = " / age" * 9
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE TABLE m (pid INTEGER NOT NULL, age NUMERIC, day DATE, g TEXT)")
            con.execute("INSERT INTO m SELECT i, i % 7 + 1, NULL, 'a' "
                        "FROM generate_series(1, 50) i")
        policy = tmp_path / "m.toml"
        policy.write_text(MISMATCHED.replace("DSN", dsn))
        for tiny in (False, True):
            if tiny:
                with psycopg.connect(dsn, autocommit=True) as con:
                    con.execute("INSERT INTO m VALUES (0, 1e-16383, NULL, 'b')")
            with Engine.from_path(policy) as engine:
                session = engine.session("a", epsilon=0.5)
                for sql in (f"SELECT COUNT(*) FROM m WHERE 1{chain} > 0",
                            f"SELECT g, SUM(LEAST(GREATEST(1{chain}, 0), 1)) FROM m GROUP BY g"):
                    assert session.execute(sql).rows


def duckdb_policy(tmp_path: Path, name: str, statements: list[str], columns: str,
                  budget: str = "{ epsilon = 1e9, delta = 0.5 }") -> Path:
    """A DuckDB file `name`.duckdb made by `statements`, and a policy on it: table t of
    privacy unit pid with these column lines, analyst a with `budget`."""
    import duckdb

    database = tmp_path / f"{name}.duckdb"
    con = duckdb.connect(str(database))
    for statement in statements:
        con.execute(statement)
    con.close()
    policy = tmp_path / f"{name}.toml"
    policy.write_text(f'[backend]\nkind = "duckdb"\npath = "{database.as_posix()}"\n'
                      f'[ledger]\npath = "{tmp_path.as_posix()}/{name}.ledger.sqlite"\n'
                      '[tables.t]\nprivacy_unit = "pid"\n[tables.t.columns]\n'
                      f'pid = {{ type = "int", nullable = false }}\n{columns}'
                      f'[analysts.a]\nbudget = {budget}\ntables = ["t"]\n')
    return policy


def postgres_policy(dsn: str, tmp_path: Path, name: str, statements: list[str],
                    columns: str) -> Path:
    """duckdb_policy's twin on the PostgreSQL database `dsn`: `statements` run there, and
    a policy on it: table t of privacy unit pid with these column lines, analyst a."""
    with psycopg.connect(dsn, autocommit=True) as con:
        for statement in statements:
            con.execute(statement)
    policy = tmp_path / f"{name}.toml"
    policy.write_text(f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n'
                      f'[ledger]\npath = "{tmp_path.as_posix()}/{name}.ledger.sqlite"\n'
                      '[tables.t]\nprivacy_unit = "pid"\n[tables.t.columns]\n'
                      f'pid = {{ type = "int", nullable = false }}\n{columns}'
                      '[analysts.a]\nbudget = { epsilon = 1e9, delta = 0.5 }\ntables = ["t"]\n')
    return policy


def released(policy: Path, sql: str) -> list[tuple[object, ...]]:
    """The released rows of `sql` at ε = 1e6."""
    with Engine.from_path(policy) as engine:
        return [tuple(r) for r in engine.session("a", epsilon=EPSILON).execute(sql).rows]


def test_a_list_or_struct_key_is_released_as_its_text(tmp_path: Path) -> None:
    """DuckDB: a list or struct column declared text loads as a Python list or dict,
    which cannot key a group: the query was charged, then failed."""
    policy = duckdb_policy(tmp_path, "l", [
        "CREATE TABLE t (pid INTEGER, tags INTEGER[], st STRUCT(a INTEGER))",
        "INSERT INTO t SELECT i, [i % 2], {'a': i % 3} FROM range(200) r(i)"],
        'tags = { type = "text" }\nst = { type = "text" }\n')
    assert released(policy, "SELECT tags, COUNT(*) FROM t GROUP BY tags ORDER BY tags") \
        == [("[0]", 100), ("[1]", 100)]
    assert released(policy, "SELECT st, COUNT(*) FROM t GROUP BY st ORDER BY st") \
        == [("{'a': 0}", 67), ("{'a': 1}", 67), ("{'a': 2}", 66)]


def test_a_nocase_key_on_duckdb_is_grouped_by_its_own_spelling(tmp_path: Path) -> None:
    """DuckDB keeps a NOCASE column's collation: 500 people spelled 'foo' and one 'FOO',
    read first, were one group keyed 'FOO', so the public value 'foo' was released with
    0 where without that person it had 500."""
    def count_of_foo(rows: list[tuple[int, str]]) -> list[tuple[object, ...]]:
        values = ", ".join(f"({pid}, '{name}')" for pid, name in rows)
        policy = duckdb_policy(tmp_path, f"n{len(rows)}", [
            "CREATE TABLE t (pid INTEGER NOT NULL, name VARCHAR COLLATE NOCASE)",
            f"INSERT INTO t VALUES {values}"],
            'name = { type = "text", public_values = ["foo", "bar"] }\n')
        return released(policy, "SELECT name, COUNT(*) FROM t GROUP BY name ORDER BY name")

    crowd = [(pid, "foo") for pid in range(1, 501)]
    assert count_of_foo(crowd) == [("bar", 0), ("foo", 500)]
    assert count_of_foo([(0, "FOO"), *crowd]) == [("bar", 0), ("foo", 500)]


def test_avg_of_whole_numbers_sums_exactly_over_pairs(tmp_path: Path) -> None:
    """AVG's sum of whole numbers, bounded by pairs on DuckDB: a pair over the bound has
    its sum scaled (limit × mean), which DuckDB computes in DOUBLE, and the sum over pairs
    was DOUBLE again: 1880 off the exact sum near 2^61. It stays an integer now."""
    import random
    from fractions import Fraction

    import duckdb

    from dpproxy.analyze import analyze
    from dpproxy.parse import parse_statements
    from dpproxy.plan import QueryOptions, plan_query
    from dpproxy.rewrite import rewrite

    database = tmp_path / "a.duckdb"
    random.seed(1)
    top = 10**15
    # odd values, 3 rows for every second unit (over the bound of 2): each scaled sum is
    # a third away from a half, far beyond DOUBLE's rounding of it
    rows = [(u, "a", random.randrange(top - 2**20, top) | 1)
            for u in range(1, 3001) for _ in range(1 if u % 2 else 3)]
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE t (uid BIGINT NOT NULL, g VARCHAR, x BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.close()
    policy_file = tmp_path / "a.toml"
    policy_file.write_text(
        f'[backend]\nkind = "duckdb"\npath = "{database.as_posix()}"\n[tables.t]\n'
        'privacy_unit = "uid"\nmax_rows_per_unit = 2\nmax_groups_per_unit = 1\n'
        '[tables.t.columns]\nuid = { type = "int", nullable = false }\n'
        'g = { type = "text", public_values = ["a"] }\n'
        f'x = {{ type = "int", lower = 0, upper = {top} }}\n'
        '[analysts.bob]\nbudget = { epsilon = 1e9, delta = 0.5 }\ntables = ["t"]\n')
    with Engine.from_path(policy_file) as engine:
        ast = parse_statements("SELECT g, AVG(x) FROM t GROUP BY g")[0].ast
        assert ast is not None
        plan = plan_query(analyze(ast, engine.policy, engine.policy.analysts["bob"]),
                          QueryOptions(1e6, 1e-6, "laplace"))
        rewritten = rewrite(plan, "duckdb")
        (row,) = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
    (index, statistic), = [(i, m.statistic) for i, m in enumerate(plan.measurements)
                           if m.statistic.kind == "sum"]
    per_unit: dict[int, list[int]] = {}
    for u, _, x in rows:
        per_unit.setdefault(u, []).append(x - int(statistic.center))
    exact = sum(sum(v) if len(v) <= 2 else round(Fraction(sum(v) * 2, len(v)))
                for v in per_unit.values())
    assert exact > 2**53 and row[1 + index] == exact and isinstance(row[1 + index], int)


def test_domains_are_read_as_the_types_they_are_over(pg_dsn: str, tmp_path: Path) -> None:
    """A domain over text declared int was cast per row (a row 'x' failed the query after
    the charge), a domain over NUMERIC was not held within ±10^400 (1e70000 squared
    overflowed), and a domain over integer named name_id was refused as text. The engine
    reads a domain as its base type."""
    from dpproxy import errors

    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE DOMAIN code AS text")
            con.execute("CREATE DOMAIN amount AS numeric")
            con.execute("CREATE DOMAIN name_id AS integer")
            con.execute("CREATE DOMAIN amount2 AS amount")  # over a domain
            con.execute("CREATE TABLE d (pid INTEGER NOT NULL, a code, b amount2, "
                        "n name_id)")
            con.execute("INSERT INTO d SELECT i, '1', i % 7, i FROM generate_series(1, 50) i")
            con.execute("INSERT INTO d VALUES (0, 'x', 1e70000, 0)")
        policy = tmp_path / "d.toml"
        policy.write_text(
            f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n[tables.d]\nprivacy_unit = "pid"\n'
            '[tables.d.columns]\npid = { type = "int", nullable = false }\n'
            'a = { type = "int", lower = 0, upper = 10 }\n'
            'b = { type = "float", lower = 0, upper = 10 }\n'
            'n = { type = "int", lower = 0, upper = 100 }\n'
            '[analysts.a]\nbudget = { epsilon = 10.0 }\ntables = ["d"]\n')
        with Engine.from_path(policy) as engine:
            storage = {c.name: c.storage for c in engine.policy.tables["d"].columns.values()}
            assert (storage["a"], storage["b"], storage["n"]) == ("text", "numeric", "integer")
            session = engine.session("a", epsilon=0.5)
            with pytest.raises(errors.DatatypeMismatch):
                session.execute("SELECT SUM(a) FROM d")
            assert session.execute("SELECT SUM(b * b) FROM d").rows
            assert session.execute("SELECT SUM(n) FROM d").rows


def test_duckdb_enums_and_text_booleans_declared_otherwise_are_refused(
        tmp_path: Path) -> None:
    """DuckDB casts an ENUM('1', 'x') column declared int per row, and a VARCHAR declared
    bool: a row 'x' or 'maybe' failed the query after the charge."""
    from dpproxy import errors

    policy = duckdb_policy(tmp_path, "e", [
        "CREATE TYPE e AS ENUM ('1', '2', 'x')",
        "CREATE TABLE t (pid INTEGER NOT NULL, a e, b VARCHAR)",
        "INSERT INTO t VALUES (1, '1', 'true'), (2, 'x', 'maybe')"],
        'a = { type = "int", lower = 0, upper = 10 }\nb = { type = "bool" }\n',
        budget="{ epsilon = 10.0 }")
    with Engine.from_path(policy) as engine:
        session = engine.session("a", epsilon=0.5)
        for sql in ("SELECT SUM(a) FROM t", "SELECT COUNT(*) FROM t WHERE b"):
            with pytest.raises(errors.DatatypeMismatch):
                session.execute(sql)
        assert engine.ledger.history() == []


@pytest.mark.parametrize(("stored", "value", "declared", "sql"), [
    ("DATE", "DATE '2020-01-01'", 'type = "int", lower = 0, upper = 9',
     "SELECT COUNT(*) FROM t WHERE pid = 7 AND c > 0"),
    ("INTERVAL", "INTERVAL 1 DAY", 'type = "float", lower = 0, upper = 9',
     "SELECT SUM(c) FROM t WHERE pid = 7"),
    ("TIME", "TIME '10:00'", 'type = "int", lower = 0, upper = 9',
     "SELECT COUNT(*) FROM t WHERE pid = 7 AND c > 0"),
    ("TIMESTAMP", "TIMESTAMP '2020-01-01'", 'type = "bool"',
     "SELECT COUNT(*) FROM t WHERE pid = 7 AND c"),
    ("INTEGER[]", "[1]", 'type = "bool"', "SELECT COUNT(*) FROM t WHERE pid = 7 AND c"),
    ("BIT", "'1'::BIT", 'type = "bool"', "SELECT COUNT(*) FROM t WHERE pid = 7 AND c"),
    ("INTEGER", "1", 'type = "date", public_values = ["2020-01-01"]',
     "SELECT c, COUNT(*) FROM t WHERE pid = 7 GROUP BY c"),
])
def test_duckdb_storage_unreadable_as_declared_is_refused_uncharged(
        tmp_path: Path, stored: str, value: str, declared: str, sql: str) -> None:
    """A DATE, TIME or INTERVAL declared a number, a timestamp, list or BIT declared bool,
    an integer declared date: DuckDB plans the conversion but runs it per row, so the
    query was charged and then failed only where person 7 had a row (whether it failed
    told whether they are in the table). Refused before the charge, whatever the data."""
    from dpproxy import errors

    for present in (True, False):
        policy = duckdb_policy(tmp_path, f"u{present}", [
            f"CREATE TABLE t (pid INTEGER NOT NULL, c {stored})",
            f"INSERT INTO t SELECT i, {value} FROM range({0 if present else 8}, 50) r(i)"],
            f"c = {{ {declared} }}\n")
        with Engine.from_path(policy) as engine:
            with pytest.raises(errors.DatatypeMismatch,
                               match=re.escape(f"stored as {stored.lower()}")):
                engine.session("a", epsilon=0.5).execute(sql)
            assert engine.ledger.history() == []


def test_duckdb_text_expression_keys_of_other_types_are_answered(tmp_path: Path) -> None:
    """`k COLLATE c` takes VARCHAR only: an expression key of an ENUM, or a NULL, failed
    planning (nothing charged, but no answer) until it was cast first."""
    policy = duckdb_policy(tmp_path, "x", [
        "CREATE TYPE mood AS ENUM ('happy', 'ok', 'sad')",
        "CREATE TABLE t (pid INTEGER NOT NULL, e mood, age INTEGER)",
        "INSERT INTO t SELECT i, ['happy', 'ok', 'sad'][i % 3 + 1], i % 90 "
        "FROM range(300) r(i)"],
        'e = { type = "text" }\nage = { type = "int", lower = 0, upper = 100 }\n')
    assert released(policy, "SELECT NULLIF(e, 'ok') AS k, COUNT(*) FROM t GROUP BY 1 "
                            "ORDER BY 1") == [("happy", 100), ("sad", 100), (None, 100)]
    assert released(policy, "SELECT CASE WHEN age > 200 THEN NULL END AS k, COUNT(*) "
                            "FROM t GROUP BY 1") == [(None, 300)]


# Columns declared text in the policy but stored as another type, with the text each row
# reads as: (a row's text, how many rows) per query below
_TEXT_QUERIES = [
    ("SELECT COUNT(*) FROM t WHERE u = 'x'", 0),
    ("SELECT COUNT(*) FROM t WHERE u = '00000000-0000-4000-8000-000000000007'", 1),
    ("SELECT COUNT(*) FROM t WHERE u LIKE '%-00000000001_'", 10),
    ("SELECT COUNT(NULLIF(u, 'x')) FROM t", 200),
    ("SELECT COUNT(*) FROM t WHERE ts LIKE '2020-01-01 10:00%'", 200),
    ("SELECT COUNT(*) FROM t WHERE ts < 'm' AND ts IN ('x', 'y') ", 0),
    ("SELECT COUNT(*) FROM t WHERE UPPER(e) = 'OK'", 200),
    ("SELECT COUNT(*) FROM t WHERE e = '2'", 0),
    ("SELECT COUNT(*) FROM t WHERE l = '[1]' OR l = '{1}'", 100),
    ("SELECT COUNT(*) FROM t WHERE j || '' LIKE '%\"a\"%'", 200),
    ("SELECT COUNT(*) FROM t WHERE LENGTH(SUBSTRING(u, 1, 8)) = 8", 200),
]
_TEXT_COLUMNS = "".join(f'{c} = {{ type = "text" }}\n' for c in ("u", "ts", "l", "j")) \
    + 'e = { type = "text", public_values = ["sad", "ok"] }\n'
_TEXT_ROWS = ("CAST('00000000-0000-4000-8000-' || lpad(CAST(i AS TEXT), 12, '0') AS UUID), "
              "TIMESTAMP '2020-01-01 10:00:00', CAST('ok' AS mood)")


@contextlib.contextmanager
def policy_on(backend: str, pg_dsn: str, tmp_path: Path, name: str,
              statements: list[str], columns: str) -> Iterator[Path]:
    """duckdb_policy, or postgres_policy on a scratch database, by `backend`; "{rows}" in
    a statement reads as that backend's FROM clause of i = 0 … 199."""
    rows = ROWS[backend]
    statements = [s.replace("{rows}", rows) for s in statements]
    if backend == "duckdb":
        yield duckdb_policy(tmp_path, name, statements, columns)
        return
    with scratch_database(pg_dsn) as dsn:
        yield postgres_policy(dsn, tmp_path, name, statements, columns)


ROWS = {"duckdb": "FROM range(200) r(i)", "postgres": "FROM generate_series(0, 199) i"}
BACKENDS = ["duckdb", "postgres"]
# the types a backend names otherwise
_JSON, _LIST = {"duckdb": "JSON", "postgres": "JSONB"}, {"duckdb": "[i % 2]",
                                                         "postgres": "ARRAY[i % 2]"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_columns_declared_text_are_read_as_text(pg_dsn: str, tmp_path: Path, backend: str
                                                ) -> None:
    """A uuid, timestamp, enum, list or JSON column declared text. DuckDB converted 'x'
    in `u = 'x'` to a UUID and failed after the charge, where a row reached it; LIKE, ||,
    UPPER or SUBSTRING of one failed planning. PostgreSQL failed planning for each of
    these (nothing charged, but a message blaming dpproxy), and for MODE of an enum with
    public values. Such a column is read as its text."""
    with policy_on(backend, pg_dsn, tmp_path, "x", [
            "CREATE TYPE mood AS ENUM ('sad', 'ok')",
            "CREATE TABLE t (pid INTEGER NOT NULL, u UUID, ts TIMESTAMP, e mood, "
            f"l INTEGER[], j {_JSON[backend]})",
            f"INSERT INTO t SELECT i, {_TEXT_ROWS}, {_LIST[backend]}, '{{\"a\": 1}}' {{rows}}"],
            _TEXT_COLUMNS) as policy:
        assert [released(policy, sql)[0][0] for sql, _ in _TEXT_QUERIES] \
            == [count for _, count in _TEXT_QUERIES]
        assert released(policy, "SELECT MODE(e) FROM t") == [("ok",)]


_DATE_COLUMN = 'd = { type = "date", lower = "2000-01-01", upper = "2030-12-31" }\n'


@pytest.mark.parametrize(("backend", "stored"), [
    ("duckdb", "TIMESTAMP"), ("duckdb", "TIMESTAMPTZ"),
    ("postgres", "timestamp"), ("postgres", "timestamptz")])
def test_timestamps_declared_date_are_read_as_days(pg_dsn: str, tmp_path: Path, backend: str,
                                                   stored: str) -> None:
    """A timestamp column declared date. On DuckDB MEDIAN and `d - DATE …` were charged,
    then failed, and `d + 1` failed planning; on PostgreSQL these failed planning, blaming
    dpproxy's rewrite. On both `d = '2020-01-02'` counted no row of that day at 10:00
    while GROUP BY d released the day. Such a column is read as its day."""
    import datetime

    with policy_on(backend, pg_dsn, tmp_path, "d", [
            f"CREATE TABLE t (pid INTEGER NOT NULL, d {stored})",
            "INSERT INTO t SELECT i, TIMESTAMP '2020-01-02 10:00:00' {rows}"],
            _DATE_COLUMN) as policy:
        assert released(policy, "SELECT COUNT(*) FROM t WHERE d = '2020-01-02'") == [(200,)]
        assert released(policy, "SELECT COUNT(*) FROM t WHERE d + 1 > DATE '2020-01-02'") \
            == [(200,)]
        assert released(policy, "SELECT AVG(d - DATE '2020-01-01') FROM t") == [(1.0,)]
        (median,), = released(policy, "SELECT MEDIAN(d) FROM t")
        assert abs(datetime.date.fromisoformat(str(median)) - datetime.date(2020, 1, 2)) \
            < datetime.timedelta(days=31)


_JOIN_POLICY = """
[tables.t]
privacy_unit = "pid"
columns.pid = { type = "int", nullable = false }
columns.u = { type = "text" }
[tables.lut]
public = true
columns.k = { type = "text", unique = true }
columns.label = { type = "text", public_values = ["A", "B"] }
[analysts.a]
budget = { epsilon = 1e9, delta = 0.5 }
tables = ["t"]
"""
_JOIN_SQL = "SELECT lut.label, COUNT(*) FROM t JOIN lut ON t.u = lut.k GROUP BY lut.label"
_UUID = "00000000-0000-4000-8000-000000000001"


@pytest.mark.parametrize("backend", ["duckdb", "postgres"])
def test_a_uuid_join_key_declared_text_meets_a_text_key(pg_dsn: str, tmp_path: Path,
                                                         backend: str) -> None:
    """A uuid key declared text joined with a text key of a lookup table: PostgreSQL has
    no uuid = text (planning failed), and DuckDB converted the lookup's keys to UUID,
    failing after the charge on one that is no uuid ('x'). Both keys are read as text."""
    lut = [(_UUID, "A"), ("x", "B")]
    if backend == "duckdb":
        import duckdb

        database = tmp_path / "j.duckdb"
        con = duckdb.connect(str(database))
        con.execute("CREATE TABLE t (pid INTEGER NOT NULL, u UUID)")
        con.execute(f"INSERT INTO t SELECT i, '{_UUID}' FROM range(100) r(i)")
        con.execute("CREATE TABLE lut (k VARCHAR, label VARCHAR)")
        con.executemany("INSERT INTO lut VALUES (?, ?)", lut)
        con.close()
        policy = tmp_path / "j.toml"
        policy.write_text(f'[backend]\nkind = "duckdb"\npath = "{database.as_posix()}"\n'
                          f'[ledger]\npath = "{tmp_path.as_posix()}/j.sqlite"\n{_JOIN_POLICY}')
        assert released(policy, _JOIN_SQL) == [("A", 100), ("B", 0)]
        return
    with scratch_database(pg_dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("CREATE TABLE t (pid INTEGER NOT NULL, u UUID)")
            con.execute(f"INSERT INTO t SELECT i, '{_UUID}' FROM generate_series(1, 100) i")
            con.execute("CREATE TABLE lut (k TEXT, label TEXT)")
            with con.cursor() as cur:
                cur.executemany("INSERT INTO lut VALUES (%s, %s)", lut)
        policy = tmp_path / "j.toml"
        policy.write_text(f'[backend]\nkind = "postgres"\ndsn = "{dsn}"\n'
                          f'[ledger]\npath = "{tmp_path.as_posix()}/j.sqlite"\n{_JOIN_POLICY}')
        assert released(policy, _JOIN_SQL) == [("A", 100), ("B", 0)]


_FLAG_COLUMNS = ('f = { type = "bool" }\nc = { type = "bool", public_values = [true, false] }\n'
                 'b = { type = "int", lower = 0, upper = 1 }\n')
_FLAG_QUERIES = [
    ("SELECT COUNT(*) FROM t WHERE f", [(50,)]),
    ("SELECT COUNT(*) FROM t WHERE NOT f AND c = false", [(50,)]),
    ("SELECT f, COUNT(*) FROM t GROUP BY f ORDER BY f", [(False, 50), (True, 50)]),
    ("SELECT c, COUNT(*) FROM t GROUP BY c ORDER BY c", [(False, 50), (True, 50)]),
    ("SELECT SUM(b) FROM t", [(50,)]),
    ("SELECT COUNT(*) FROM t WHERE b > 0", [(50,)]),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_numbers_declared_bool_and_booleans_declared_numbers(pg_dsn: str, tmp_path: Path,
                                                             backend: str) -> None:
    """A smallint of 0 and 1 declared bool, and a boolean declared int: on PostgreSQL
    `WHERE f`, GROUP BY of public truth values, SUM(b) and `b > 0` failed planning
    (a message blaming dpproxy), and on both a key f was released as 0 and 1. They are
    read as `f <> 0` and as 1 or 0."""
    with policy_on(backend, pg_dsn, tmp_path, "f", [
            "CREATE TABLE t (pid INTEGER NOT NULL, f SMALLINT, c INTEGER, b BOOLEAN)",
            "INSERT INTO t SELECT i, i % 2, i % 2, i % 2 = 0 {rows} WHERE i < 100"],
            _FLAG_COLUMNS) as policy:
        # repr: False == 0, so only the text tells a truth value from a number
        assert repr([released(policy, sql) for sql, _ in _FLAG_QUERIES]) \
            == repr([rows for _, rows in _FLAG_QUERIES])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unique_join_key_is_one_row_per_key_as_declared(pg_dsn: str, tmp_path: Path,
                                                          backend: str) -> None:
    """A lookup key declared a unique date but stored as 50 timestamps of one day: the
    lookup was made unique by its stored value and joined by its day, so the one row of
    a table without privacy unit (each row its own unit, no bound after a unique join)
    was counted 50 times, with noise for 1. It is made unique by the key as joined."""
    lookup = ", ".join(f"(TIMESTAMP '2020-01-02 {h:02d}:{m:02d}:00', 'A')"
                       for h in range(5) for m in range(10))
    columns = ('d = { type = "date", lower = "2020-01-01", upper = "2020-12-31" }\n'
               '[tables.lut]\npublic = true\n[tables.lut.columns]\n'
               'k = { type = "date", unique = true }\n'
               'label = { type = "text", public_values = ["A", "B"] }\n')
    with policy_on(backend, pg_dsn, tmp_path, "u", [
            "CREATE TABLE t (pid INTEGER NOT NULL, d DATE)",
            "INSERT INTO t VALUES (1, DATE '2020-01-02')",
            "CREATE TABLE lut (k TIMESTAMP, label TEXT)",
            f"INSERT INTO lut VALUES {lookup}"], columns) as policy:
        assert released(policy, "SELECT COUNT(*) FROM t JOIN lut ON t.d = lut.k") == [(1,)]


def test_postgres_money_declared_a_number(pg_dsn: str, tmp_path: Path) -> None:
    """PostgreSQL has no money > numeric nor ABS(money): `c > 1` and GROUP BY c failed
    planning, blaming dpproxy's rewrite. A money column declared a number is read as
    its NUMERIC value; declared bool, it is refused (money has no <> 0)."""
    from dpproxy import errors

    with scratch_database(pg_dsn) as dsn:
        policy = postgres_policy(dsn, tmp_path, "m", [
            "CREATE TABLE t (pid INTEGER NOT NULL, c MONEY, f MONEY)",
            "INSERT INTO t SELECT i, 1 + i % 2, 0 FROM generate_series(1, 100) i"],
            'c = { type = "float", lower = 0, upper = 10 }\nf = { type = "bool" }\n')
        assert released(policy, "SELECT COUNT(*) FROM t WHERE c > 1") == [(50,)]
        assert released(policy, "SELECT c, COUNT(*) FROM t GROUP BY c ORDER BY c") \
            == [(1.0, 50), (2.0, 50)]
        with pytest.raises(errors.DatatypeMismatch, match="stored as money"):
            released(policy, "SELECT COUNT(*) FROM t WHERE f")


def test_duckdb_reads_a_timestamptz_day_in_utc_whatever_the_host_zone(tmp_path: Path
                                                                      ) -> None:
    """DuckDB read a TIMESTAMPTZ's day in the host's time zone: at TZ=America/Los_Angeles
    2020-01-02 02:00 UTC was keyed 2020-01-01, where the PostgreSQL backend (its sessions
    in UTC) keys 2020-01-02. The DuckDB backend reads in UTC too."""
    import os
    import subprocess
    import sys

    policy = duckdb_policy(tmp_path, "z", [
        "CREATE TABLE t (pid INTEGER NOT NULL, d TIMESTAMPTZ)",
        "INSERT INTO t SELECT i, TIMESTAMPTZ '2020-01-02 02:00:00+00' FROM range(100) r(i)"],
        'd = { type = "date", lower = "2000-01-01", upper = "2030-12-31", '
        'public_values = ["2020-01-01", "2020-01-02"] }\n')
    code = ("import sys; from pathlib import Path; from tests.test_column_types import "
            f"released; p = Path(sys.argv[1]); print(released(p, '{_DAY_KEYS}'), "
            f"released(p, \"{_ONE_DAY}\"))")
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", code, str(policy)], cwd=root, text=True,
                         capture_output=True, env={**os.environ, "TZ": "America/Los_Angeles"},
                         timeout=300)
    assert run.stdout.strip() == "[('2020-01-01', 0), ('2020-01-02', 100)] [(100,)]", \
        run.stderr


_DAY_KEYS = "SELECT d, COUNT(*) FROM t GROUP BY d ORDER BY d"
_ONE_DAY = "SELECT COUNT(*) FROM t WHERE d = '2020-01-02'"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_unary_report_column_of_an_int_domain_is_read_as_its_reports(
        pg_dsn: str, tmp_path: Path, backend: str) -> None:
    """A local-DP column of unary reports (BOOLEAN[]) over an int domain was read as a
    number, CAST(occ AS DOUBLE)[k], which neither backend could plan. Its reports are
    read as stored, as for a text domain. Every report sets the bit of 3 alone, so the
    debiased shares are clipped to 1 and 0 (the reports are exact: nothing is drawn)."""
    report = {"duckdb": "[true, false, false]", "postgres": "ARRAY[true, false, false]"}
    with policy_on(backend, pg_dsn, tmp_path, "l", [
            "CREATE TABLE t (pid INTEGER NOT NULL, occ BOOLEAN[] NOT NULL)",
            f"INSERT INTO t SELECT i, {report[backend]} {{rows}}"],
            'occ = { type = "int", nullable = false, ldp = { mechanism = "unary", '
            'epsilon = 1.0, domain = [3, 5, 7] } }\n') as policy:
        assert released(policy, "SELECT AVG(occ = 3), AVG(occ = 5) FROM t") == [(1.0, 0.0)]


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM t WHERE CASE WHEN x = 5 THEN name LIKE 'n%' ELSE FALSE END",
    "SELECT COUNT(CASE WHEN x = 5 AND name ~ 'n' THEN 1 END) FROM t",
    "SELECT COUNT(*) FROM t WHERE name ILIKE 'N1%' OR NOT name ~* '^n'",
])
def test_pattern_match_under_a_nondeterministic_collation(pg_dsn: str, tmp_path: Path,
                                                           sql: str) -> None:
    """PostgreSQL 15 matches no pattern under a nondeterministic collation: LIKE and `~`
    over such a column failed once a row reached them, after the charge, so the table
    with one more row (x = 5) failed where the other answered. The subject is matched
    under the database's default collation: both answer, each charged once."""
    from dpproxy.session import analyst_account

    with scratch_database(pg_dsn) as dsn:
        for extra in (False, True):
            policy = postgres_policy(dsn, tmp_path, f"nocase{int(extra)}", [
                "CREATE COLLATION IF NOT EXISTS nocase (provider = icu, "
                "locale = 'und-u-ks-level2', deterministic = false)",
                "DROP TABLE IF EXISTS t",
                "CREATE TABLE t (pid INTEGER NOT NULL, name TEXT COLLATE nocase, x INTEGER)",
                "INSERT INTO t SELECT g, 'n' || g, g FROM generate_series(10, 50) AS g",
                *(["INSERT INTO t VALUES (5, 'n5', 5)"] if extra else [])],
                'name = { type = "text" }\nx = { type = "int", lower = 0, upper = 100 }\n')
            with Engine.from_path(policy) as engine:
                ((count,),) = engine.session("a", epsilon=1.0).execute(sql).rows
                assert isinstance(count, int)
                spent = engine.ledger.status(analyst_account("a")).spent
                assert spent.epsilon == pytest.approx(1.0)
