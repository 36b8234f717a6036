"""Real clients against `dpproxy serve`: psql, psycopg 3, psycopg2, asyncpg, SQLAlchemy 2 and
pandas. Each connects, lists the tables, runs an accepted DP query and gets the right
SQLSTATE for a rejected one."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .test_server_support import PASSWORD, Served, ServeFactory

GRANTED = {"adult", "visits", "occupation_groups"}
ACCEPTED = "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation ORDER BY occupation"
REJECTED = "SELECT age FROM adult"  # a raw private column: 42501
OCCUPATIONS = 14


def _psql(served: Served, *args: str, password: str = PASSWORD) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env |= {"PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10", "PGSSLMODE": "disable"}
    conninfo = f"host=127.0.0.1 port={served.port} user=alice dbname=demo"
    return subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", conninfo, *args], env=env,
                          capture_output=True, text=True, timeout=60)


needs_psql = pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")


@needs_psql
def test_psql(serve: ServeFactory, tmp_path: Path) -> None:
    served = serve()
    tables = _psql(served, "-c", r"\dt")
    assert tables.returncode == 0, tables.stderr
    assert all(t in tables.stdout for t in GRANTED)
    described = _psql(served, "-c", r"\d adult")
    assert described.returncode == 0, described.stderr
    assert "hours_per_week" in described.stdout and "bigint" in described.stdout
    databases = _psql(served, "-c", r"\l")
    assert databases.returncode == 0 and "demo" in databases.stdout
    info = _psql(served, "-c", r"\conninfo")
    assert info.returncode == 0 and 'database "demo" as user "alice"' in info.stdout

    accepted = _psql(served, "-A", "-t", "-c", ACCEPTED)
    assert accepted.returncode == 0, accepted.stderr
    assert len(accepted.stdout.strip().splitlines()) == OCCUPATIONS
    assert "NOTICE:  n: laplace" in accepted.stderr and "budget left" in accepted.stderr

    rejected = _psql(served, "-v", "VERBOSITY=verbose", "-c", REJECTED)
    assert rejected.returncode != 0 and "ERROR:  42501" in rejected.stderr

    script = tmp_path / "session.sql"
    script.write_text("SET dpproxy.epsilon = 0.5;\nBEGIN;\n"
                      "SELECT COUNT(*) AS people FROM adult WHERE age >= 40;\n"
                      "SHOW dpproxy.epsilon;\nCOMMIT;\n")
    ran = _psql(served, "-A", "-t", "-f", str(script))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["SET", "BEGIN", ran.stdout.split()[2], "0.5", "COMMIT"]


@needs_psql
def test_psql_describe_plus(serve: ServeFactory) -> None:
    # \d+ reads the table's options through `pg_catalog.unnest` in a subquery: catalog too
    described = _psql(serve(), "-c", r"\d+ adult")
    assert described.returncode == 0, described.stderr
    assert "Storage" in described.stdout and "extended" in described.stdout
    assert "Access method: heap" in described.stdout


@needs_psql
def test_psql_wrong_password(serve: ServeFactory) -> None:
    failed = _psql(serve(), "-c", "SELECT 1", password="nope")
    assert failed.returncode != 0
    assert 'password authentication failed for user "alice"' in failed.stderr


def test_psycopg(serve: ServeFactory) -> None:
    import psycopg

    served = serve()
    notices: list[str] = []
    with psycopg.connect(served.dsn()) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        tables = conn.execute("SELECT table_name FROM information_schema.tables "
                              "WHERE table_schema = 'public'").fetchall()
        assert {t for (t,) in tables} == GRANTED
        # simple protocol (no parameters)
        cur = conn.execute(ACCEPTED)
        assert [c.name for c in cur.description] == ["occupation", "n"]
        assert [c.type_code for c in cur.description] == [25, 20]
        rows = cur.fetchall()
        assert len(rows) == OCCUPATIONS and all(isinstance(n, int) for _, n in rows)
        assert any(n.startswith("n: laplace") for n in notices)
        # extended protocol: binary int2 and text parameters
        cur = conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s AND occupation = %s",
                           [30, "Sales"])
        assert cur.description[0].name == "count" and isinstance(cur.fetchone()[0], int)
        # server-side prepared statements, reused
        for value in (1.5, 2.5):
            assert conn.execute("SELECT %s::float8 AS x", [value], prepare=True).fetchone() \
                == (value,)
        # binary results
        with conn.cursor(binary=True) as bcur:
            bcur.execute("SELECT sex, COUNT(*) AS n, AVG(hours_per_week) AS h FROM adult "
                         "GROUP BY sex")
            result = bcur.fetchall()
            assert [r[0] for r in result] == ["Female", "Male"]
            assert all(isinstance(r[1], int) and isinstance(r[2], float) for r in result)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(REJECTED)
        conn.rollback()
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT COUNT(*) FROM nowhere WHERE 1 = %s", [1])
        conn.rollback()
        budget = conn.execute("SHOW dpproxy.budget").fetchone()
        assert budget[0] == "analyst:alice" and budget[2] == pytest.approx(0.3)
    assert served.spent() == pytest.approx(0.3)


def test_psycopg_parameters_written_without_spaces(serve: ServeFactory) -> None:
    """psycopg writes `IN (%s,%s)` as `IN ($1,$2)`, which sqlglot read as a dollar-quoted
    string's tag `$1,$` (42601); PostgreSQL reads two parameters, and so does dpproxy."""
    import psycopg

    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        listed = conn.execute("SELECT COUNT(*) FROM adult WHERE age IN (%s,%s,%s)",
                              [30, 40, 50]).fetchone()
        assert listed is not None and isinstance(listed[0], int)
        assert conn.execute("SELECT %s::int4,%s::text AS t", [1, "x"]).fetchone() == (1, "x")
    assert served.spent() == pytest.approx(0.1)



def test_psycopg_sets_an_option_from_a_parameter(serve: ServeFactory) -> None:
    """psycopg sends `SET dpproxy.epsilon = %s` as `= $1` with the value bound: applied."""
    import psycopg

    with psycopg.connect(serve().dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = %s", [0.25])
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.25",)

def test_psycopg_autocommit_transaction_status(serve: ServeFactory) -> None:
    import psycopg
    from psycopg.pq import TransactionStatus

    with psycopg.connect(serve().dsn(), autocommit=True) as conn:
        assert conn.info.transaction_status == TransactionStatus.IDLE
        conn.execute("BEGIN")
        assert conn.info.transaction_status == TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(REJECTED)
        assert conn.info.transaction_status == TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT COUNT(*) FROM adult")
        conn.execute("ROLLBACK")
        assert conn.info.transaction_status == TransactionStatus.IDLE
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 0


def test_psycopg2(serve: ServeFactory) -> None:
    pytest.importorskip("psycopg2")
    import psycopg2
    import psycopg2.errors

    conn = psycopg2.connect(serve().dsn())
    try:
        cur = conn.cursor()
        cur.execute("SELECT COUNT(*) FROM adult WHERE age > %s", (30,))
        assert cur.description[0].name == "count" and cur.fetchone()[0] > 0
        with pytest.raises(psycopg2.errors.InsufficientPrivilege):
            cur.execute(REJECTED)
        conn.rollback()
        assert conn.notices and "laplace" in "".join(conn.notices)
    finally:
        conn.close()


def test_asyncpg(serve: ServeFactory) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    served = serve()

    async def main() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="alice",
                                     database="demo", password=PASSWORD, ssl=False)
        try:
            tables = await conn.fetch("SELECT tablename FROM pg_catalog.pg_tables "
                                      "WHERE schemaname = 'public'")
            assert {r["tablename"] for r in tables} == GRANTED
            rows = await conn.fetch(ACCEPTED)
            assert len(rows) == OCCUPATIONS and isinstance(rows[0]["n"], int)
            # Parse without types: the server answers ParameterDescription with int8
            assert await conn.fetchval("SELECT COUNT(*) FROM adult WHERE age > $1", 30) > 0
            statement = await conn.prepare("SELECT AVG(amount) FROM visits WHERE day >= $1")
            assert [t.name for t in statement.get_parameters()] == ["date"]
            import datetime as dt

            assert isinstance(await statement.fetchval(dt.date(2024, 7, 1)), float)
            # PortalSuspended: fetchrow asks for one row
            assert (await conn.fetchrow(ACCEPTED))["occupation"] == "Adm-clerical"
            with pytest.raises(asyncpg.exceptions.InsufficientPrivilegeError):
                await conn.fetch(REJECTED)
            with pytest.raises(asyncpg.exceptions.FeatureNotSupportedError):
                await conn.fetch("SELECT occupation FROM adult UNION SELECT sex FROM adult")
        finally:
            await conn.close()

        pool = await asyncpg.create_pool(host="127.0.0.1", port=served.port, user="alice",
                                         database="demo", password=PASSWORD, ssl=False,
                                         min_size=1, max_size=2)
        try:
            for _ in range(2):  # a release resets the connection with a multi-statement string
                async with pool.acquire() as conn:
                    assert await conn.fetchval("SELECT COUNT(*) FROM adult") > 0
        finally:
            await pool.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def test_sqlalchemy_and_pandas(serve: ServeFactory) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pandas = pytest.importorskip("pandas")
    served = serve()
    for driver in ("psycopg", "psycopg2"):
        engine = sqlalchemy.create_engine(
            f"postgresql+{driver}://alice:{PASSWORD}@127.0.0.1:{served.port}/demo")
        try:
            inspector = sqlalchemy.inspect(engine)
            assert set(inspector.get_table_names()) == GRANTED
            columns = {c["name"]: c for c in inspector.get_columns("adult")}
            assert isinstance(columns["age"]["type"], sqlalchemy.BigInteger)
            frame = pandas.read_sql(ACCEPTED, engine)
            assert list(frame.columns) == ["occupation", "n"] and len(frame) == OCCUPATIONS
            frame = pandas.read_sql(sqlalchemy.text(
                "SELECT COUNT(*) AS n FROM adult WHERE age > :age"), engine,
                params={"age": 30})
            assert frame["n"][0] > 0
            with engine.connect() as conn, pytest.raises(sqlalchemy.exc.ProgrammingError) as info:
                conn.execute(sqlalchemy.text(REJECTED))
            orig = info.value.orig
            assert (getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)) == "42501"
        finally:
            engine.dispose()


def test_sqlalchemy_reflects_a_table(serve: ServeFactory) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    served = serve()
    for driver in ("psycopg2", "psycopg"):
        engine = sqlalchemy.create_engine(
            f"postgresql+{driver}://alice:{PASSWORD}@127.0.0.1:{served.port}/demo")
        try:
            # reflection compares pg_am.amname with current_setting('default_table_access_method')
            table = sqlalchemy.Table("adult", sqlalchemy.MetaData(), autoload_with=engine)
            assert "hours_per_week" in table.columns
            assert table.columns["occupation"].nullable and not table.columns["age"].nullable
            with engine.connect() as conn:
                assert conn.execute(sqlalchemy.select(sqlalchemy.func.current_setting(
                    "default_table_access_method"))).scalar_one() == "heap"
        finally:
            engine.dispose()


def test_asyncpg_reads_settings(serve: ServeFactory) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    served = serve()

    async def main() -> None:
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="alice",
                                     database="demo", password=PASSWORD, ssl=False)
        try:  # a parameter: described before it is bound
            assert await conn.fetchval("SELECT current_setting($1)",
                                       "default_table_access_method") == "heap"
            assert await conn.fetchval("SHOW password_encryption") == "scram-sha-256"
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_pandas_with_a_dbapi_connection(serve: ServeFactory) -> None:
    pandas = pytest.importorskip("pandas")
    import warnings

    import psycopg

    with psycopg.connect(serve().dsn()) as conn, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pandas prefers SQLAlchemy
        frame = pandas.read_sql(ACCEPTED, conn)
    assert len(frame) == OCCUPATIONS


def test_list_parameters_from_every_driver(serve: ServeFactory, demo_database: Path) -> None:
    """`col = ANY(<list>)` as each driver sends a list: psycopg as a text array, asyncpg
    as a binary one (its type, int8[], from ParameterDescription), psycopg2 spelled out as
    ARRAY[…]. Each is answered as `col IN (…)`: within 200 of the exact count, which the
    demo's Laplace noise (scale 10) exceeds with probability e^-20 per answer."""
    import duckdb
    import psycopg
    import psycopg2

    asyncpg = pytest.importorskip("asyncpg")
    served = serve()
    ages = [30, 40, 50]
    with duckdb.connect(str(demo_database), read_only=True) as con:
        (exact,) = con.execute("SELECT COUNT(*) FROM adult WHERE age IN (30, 40, 50)"
                               ).fetchone() or (None,)
    sql = "SELECT COUNT(*) FROM adult WHERE age = ANY(%s)"
    answers = []
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        answers.append(conn.execute(sql, [ages]).fetchone()[0])  # type: ignore[index]
        answers.append(conn.execute(sql + " AND sex <> ALL(%s)",
                                    [ages, ["Female"]]).fetchone()[0])  # type: ignore[index]
    pg2 = psycopg2.connect(served.dsn())
    try:
        cur = pg2.cursor()
        cur.execute(sql + " ", [ages])  # another text: a fresh answer
        answers.append(cur.fetchone()[0])  # type: ignore[index]
    finally:
        pg2.close()

    async def main() -> int:
        conn = await asyncpg.connect(host="127.0.0.1", port=served.port, user="alice",
                                     database="demo", password=PASSWORD, ssl=False)
        try:
            return int(await conn.fetchval(
                "SELECT COUNT(*) FROM adult WHERE age = ANY($1)", ages))
        finally:
            await conn.close()

    answers.append(asyncio.run(asyncio.wait_for(main(), 60)))
    with duckdb.connect(str(demo_database), read_only=True) as con:
        (males,) = con.execute("SELECT COUNT(*) FROM adult WHERE age IN (30, 40, 50) "
                               "AND sex <> 'Female'").fetchone() or (None,)
    assert abs(answers[0] - exact) < 200 and abs(answers[2] - exact) < 200
    assert abs(answers[3] - exact) < 200
    assert abs(answers[1] - males) < 200 and abs(exact - males) > 400  # the ALL applied
