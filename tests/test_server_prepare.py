"""SQL's PREPARE and EXECUTE over the wire (`dpproxy.server.prepared`): a statement kept
by name, each EXECUTE charged as the same query sent alone, the same errors as
PostgreSQL's."""

from __future__ import annotations

import psycopg
import pytest

from .exact import read_directly
from .test_server_clients import _psql, needs_psql
from .test_server_support import BIG_BUDGET, ServeFactory

BACKENDS = ("duckdb", "postgres")


def test_prepare_and_execute(serve: ServeFactory) -> None:
    """PREPARE with a declared type, EXECUTE with constants: each new value is charged once
    and answered near the data (ε = 5: scale 0.2, so within 10 is a miss of probability
    below e^-50), a repeat is its first answer for free, and DEALLOCATE forgets the name.
    A date parameter's type is inferred from the policy."""
    served = serve(BIG_BUDGET)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 5")
        cur = conn.execute("PREPARE older (int) AS SELECT COUNT(*) AS n FROM adult "
                           "WHERE age > $1")
        assert cur.statusmessage == "PREPARE"
        assert served.spent() == 0
        cur = conn.execute("EXECUTE older(40)")
        assert cur.description is not None and cur.description[0].name == "n"
        (n40,), = cur.fetchall()
        assert served.spent() == pytest.approx(5.0)
        assert conn.execute("EXECUTE older (40)").fetchall() == [(n40,)]  # its first answer
        assert served.spent() == pytest.approx(5.0)
        (n60,), = conn.execute("EXECUTE older(60)").fetchall()
        assert served.spent() == pytest.approx(10.0)
        conn.execute("PREPARE since AS SELECT COUNT(*) FROM visits WHERE day >= $1")
        (visits,), = conn.execute("EXECUTE since('2024-12-01')").fetchall()
        conn.execute("DEALLOCATE older")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE older(40)")
    exact = {a: read_directly(served.engine, f"SELECT COUNT(*) FROM adult WHERE age > {a}")[0][0]
             for a in (40, 60)}
    assert abs(n40 - exact[40]) <= 10 and abs(n60 - exact[60]) <= 10
    december = read_directly(served.engine,
                             "SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-12-01'")[0][0]
    assert abs(visits - december) <= 10 * 10  # a visits person adds up to 10 rows


@pytest.mark.parametrize("statements, sqlstate", [
    (["EXECUTE nothing"], "26000"),
    (["PREPARE twice AS SELECT COUNT(*) FROM adult",
      "PREPARE twice AS SELECT COUNT(*) FROM adult"], "42P05"),
    (["PREPARE p (int) AS SELECT COUNT(*) FROM adult WHERE age > $1", "EXECUTE p"], "42601"),
    (["PREPARE p (int) AS SELECT COUNT(*) FROM adult WHERE age > $1", "EXECUTE p(1, 2)"],
     "42601"),
    (["PREPARE p (int) AS SELECT COUNT(*) FROM adult WHERE age > $1", "EXECUTE p('x')"],
     "22P02"),
    (["PREPARE p (int) AS SELECT COUNT(*) FROM adult WHERE age > $1", "EXECUTE p(age)"],
     "0A000"),
    (["PREPARE p (nosuchtype) AS SELECT COUNT(*) FROM adult WHERE age > $1"], "42704"),
    (["PREPARE p AS DELETE FROM adult"], "42601"),
    (["PREPARE p AS SELECT age FROM adult", "EXECUTE p"], "42501"),
])
def test_errors_are_postgresqls(serve: ServeFactory, statements: list[str], sqlstate: str
                                ) -> None:
    """Each mistake gets PostgreSQL's SQLSTATE and charges nothing; the last statement is
    the one refused."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for sql in statements[:-1]:
            conn.execute(sql)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(statements[-1])
        assert refused.value.sqlstate == sqlstate, str(refused.value)
    assert served.spent() == 0


@needs_psql
def test_psql_prepare_execute(serve: ServeFactory) -> None:
    """psql sends each as a simple query: PREPARE, then EXECUTE twice (the second one the
    stored answer, the same rows), then DEALLOCATE."""
    served = serve()
    done = _psql(served, "-A", "-t",
                 "-c", "PREPARE by_sex (text) AS SELECT COUNT(*) FROM adult WHERE sex = $1",
                 "-c", "EXECUTE by_sex('Female')", "-c", "EXECUTE by_sex('Female')",
                 "-c", "DEALLOCATE by_sex")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "PREPARE" and lines[-1] == "DEALLOCATE"
    assert lines[1] == lines[2] and lines[1].isdigit()  # one charge, the same answer twice
