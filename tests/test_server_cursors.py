"""SQL cursors through `dpproxy serve` (`dpproxy.server.cursors`): psql with FETCH_COUNT,
psycopg's and psycopg2's named cursors, SQLAlchemy's stream_results, and FETCH / MOVE
checked step by step against a real PostgreSQL server. A cursor's query is charged once,
at DECLARE; walking its rows costs nothing."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg2
import pytest
import sqlalchemy as sa

from dpproxy import errors
from dpproxy.server import cursors
from dpproxy.session import Engine

from .test_server_clients import _psql, needs_psql
from .test_server_support import Served, ServeFactory

QUERY = "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation"
OCCUPATIONS = 14
COST = 0.1  # the demo policy's default ε per query


def _plain(served: Served, sql: str = QUERY) -> list[tuple[Any, ...]]:
    """The query's rows without a cursor: a repeat of it returns this very answer."""
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


# FETCH and MOVE forms, with counts past both ends of the rows and of either sign
_FORMS = ["NEXT", "PRIOR", "FIRST", "LAST", "ABSOLUTE {a}", "RELATIVE {a}", "{c}", "ALL",
          "FORWARD", "FORWARD {c}", "FORWARD ALL", "BACKWARD", "BACKWARD {c}", "BACKWARD ALL",
          ""]


def _walks(rows: int, count: int, seed: int) -> list[list[str]]:
    """`count` sequences of 10 random FETCH / MOVE statements on cursor c."""
    rng = random.Random(seed)
    reach = rows + 3
    return [[f"{rng.choice(['FETCH', 'MOVE'])} "
             + rng.choice(_FORMS).format(a=rng.randint(-reach, reach), c=rng.randint(-4, reach))
             + f" {rng.choice(['FROM', 'IN', ''])} c"
             for _ in range(10)] for _ in range(count)]


def _outcome(conn: Any, statement: str, row_index: Callable[[tuple[Any, ...]], int]
             ) -> tuple[Any, ...]:
    """(indices of the rows returned or None for MOVE, command tag, SQLSTATE)."""
    try:
        cur = conn.execute(statement)
    except psycopg.Error as exc:
        return None, None, exc.sqlstate
    rows = [row_index(r) for r in cur.fetchall()] if cur.description else None
    return rows, cur.statusmessage, None


def _replay(conn: Any, declare: str, walks: list[list[str]],
            row_index: Callable[[tuple[Any, ...]], int]) -> list[list[tuple[Any, ...]]]:
    """Each walk in a transaction of its own, up to its first error."""
    out = []
    for walk in walks:
        conn.execute("BEGIN")
        conn.execute(declare)
        seen = []
        for statement in walk:
            seen.append(_outcome(conn, statement, row_index))
            if seen[-1][2] is not None:
                break
        conn.execute("ROLLBACK")
        out.append(seen)
    return out


@pytest.mark.parametrize("scroll", ["SCROLL", "NO SCROLL", ""])
def test_fetch_and_move_walk_rows_as_postgresql_does(serve: ServeFactory, pg_dsn: str,
                                                     scroll: str) -> None:
    """The same FETCH and MOVE statements on a cursor over dpproxy's answer and on one over
    PostgreSQL's generate_series of as many rows return the same rows (by position), tags
    and SQLSTATEs (NO SCROLL: 55000 at the first step back), at one charge in all."""
    served = serve()
    answer = _plain(served)
    assert len(answer) == OCCUPATIONS
    spent = served.spent()
    walks = _walks(OCCUPATIONS, 40, seed=len(scroll))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        expected = _replay(
            conn, f"DECLARE c {scroll} CURSOR FOR SELECT i FROM generate_series(1, "
                  f"{OCCUPATIONS}) i", walks, lambda r: r[0] - 1)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        got = _replay(conn, f"DECLARE c {scroll} CURSOR FOR {QUERY}", walks, answer.index)
    assert got == expected
    errored = sum(1 for walk in expected if walk[-1][2] is not None)
    assert (errored > 10) == (scroll == "NO SCROLL")  # the walks did step back
    assert served.spent() == pytest.approx(spent)  # the repeats were answered from the store


def test_fetch_matches_postgresql_on_empty_and_short_results(pg_dsn: str) -> None:
    """`cursors.fetch` itself against PostgreSQL on 0, 1 and 3 rows, where the ends meet."""
    declares = {"SCROLL": True, "NO SCROLL": False, "": None}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for total in (0, 1, 3):
            for scroll, flag in declares.items():
                for walk in _walks(total, 30, seed=total):
                    conn.execute("BEGIN")
                    conn.execute(f"DECLARE c {scroll} CURSOR FOR SELECT i FROM "
                                 f"generate_series(1, {total}) i")
                    at = cursors.Position()
                    for statement in walk:
                        pg = _outcome(conn, statement, lambda r: r[0] - 1)
                        parsed = cursors.parse(statement)
                        assert isinstance(parsed, cursors.Fetch)
                        moved = copy.copy(at)
                        try:
                            rows = cursors.fetch(parsed, moved, total, flag)
                        except errors.Error as exc:
                            assert pg == (None, None, exc.sqlstate), statement
                            break
                        assert pg == (None if parsed.move else rows,
                                      cursors.tag(parsed, len(rows)), None), statement
                        at = moved
                    conn.execute("ROLLBACK")


@needs_psql
def test_psql_with_fetch_count(serve: ServeFactory) -> None:
    """psql reads a result through a cursor when FETCH_COUNT is set (BEGIN, DECLARE, FETCH
    FORWARD n until short, CLOSE, COMMIT): the same rows as without, charged once."""
    served = serve()
    plain = _psql(served, "-A", "-t", "-c", QUERY)
    assert plain.returncode == 0, plain.stderr
    spent = served.spent()
    assert spent == pytest.approx(COST)
    for fetch_count in (1, 4, 14, 100):
        chunked = _psql(served, "-A", "-t", "-v", f"FETCH_COUNT={fetch_count}", "-c", QUERY)
        assert chunked.returncode == 0, chunked.stderr
        assert chunked.stdout.splitlines() == plain.stdout.splitlines()
        assert len(plain.stdout.splitlines()) == OCCUPATIONS
    other = "SELECT occupation, AVG(age) FROM adult GROUP BY occupation"
    fresh = _psql(served, "-A", "-t", "-v", "FETCH_COUNT=5", "-c", other)
    assert fresh.returncode == 0, fresh.stderr
    assert len(fresh.stdout.splitlines()) == OCCUPATIONS
    assert "budget left" in fresh.stderr  # DECLARE passes the query's notices on
    assert served.spent() == pytest.approx(spent + COST)  # the query's ε, split in two
    refused = _psql(served, "-v", "FETCH_COUNT=5", "-c", "SELECT age FROM adult")
    assert refused.returncode != 0 and "ERROR:" in refused.stderr
    assert served.spent() == pytest.approx(spent + COST)


def test_named_cursors_of_python_clients(serve: ServeFactory) -> None:
    """psycopg's ServerCursor (fetchmany, scroll, binary, parameters, WITH HOLD across a
    commit), psycopg2's named cursor and SQLAlchemy's stream_results on both drivers all
    read the very rows a plain query returns."""
    served = serve()
    answer = _plain(served)
    with psycopg.connect(served.dsn()) as conn:
        with conn.cursor("first") as cur:
            cur.execute(QUERY)
            assert cur.fetchmany(5) + cur.fetchall() == answer
            assert cur.description is not None and cur.description[1].name == "n"
        with conn.cursor("scrolled", scrollable=True) as cur:
            cur.execute(QUERY)
            cur.scroll(10, "absolute")
            assert cur.fetchone() == answer[10]
            cur.scroll(-3)
            assert cur.fetchone() == answer[8]
        with conn.cursor("binary", binary=True) as cur:
            cur.execute(QUERY)
            assert cur.fetchall() == answer
        with conn.cursor("bound") as cur:
            cur.execute("SELECT occupation, COUNT(*) FROM adult WHERE age > %s "
                        "GROUP BY occupation", (40,))
            assert len(cur.fetchall()) == OCCUPATIONS
        conn.commit()
        with conn.cursor("held", withhold=True) as cur:
            cur.execute(QUERY)
            conn.commit()  # a cursor WITH HOLD outlives the transaction that declared it
            assert cur.fetchall() == answer
    pg2 = psycopg2.connect(served.dsn())
    try:
        cur2 = pg2.cursor("psycopg2_named")
        cur2.itersize = 3
        cur2.execute(QUERY)
        assert [tuple(r) for r in cur2] == answer
    finally:
        pg2.close()
    for driver in ("postgresql+psycopg", "postgresql+psycopg2"):
        url = sa.URL.create(driver, "alice", "alice-demo", "127.0.0.1", served.port, "demo")
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn2:
                streamed = conn2.execution_options(stream_results=True, max_row_buffer=4) \
                    .execute(sa.text(QUERY))
                assert [tuple(r) for r in streamed] == answer
        finally:
            engine.dispose()
    # the plain query, and the one with a parameter: nothing else was charged
    assert served.spent() == pytest.approx(2 * COST)


def _sqlstate(conn: psycopg.Connection, statement: str) -> str | None:
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_cursor_errors_and_lifetimes(serve: ServeFactory) -> None:
    """PostgreSQL's errors and rules: DECLARE needs a transaction block unless WITH HOLD;
    a name is declared once; a cursor without HOLD closes at COMMIT, one WITH HOLD
    declared in a rolled-back transaction goes with it; a refused query charges nothing
    and aborts the block; CLOSE ALL closes every cursor; FETCH and MOVE may share a
    string."""
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert _sqlstate(conn, f"DECLARE c CURSOR FOR {QUERY}") == "25P01"
        assert _sqlstate(conn, "FETCH 1 FROM c") == "34000"
        assert served.spent() == 0.0
        conn.execute("BEGIN")
        conn.execute(f"DECLARE c CURSOR FOR {QUERY}")
        assert served.spent() == pytest.approx(COST)
        assert _sqlstate(conn, f"DECLARE c CURSOR FOR {QUERY}") == "42P03"
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute(f'DECLARE "Mixed" CURSOR FOR {QUERY}')
        assert len(conn.execute('FETCH ALL FROM "Mixed"').fetchall()) == OCCUPATIONS
        assert _sqlstate(conn, "FETCH 1 FROM mixed") == "34000"  # unquoted names fold
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute(f"DECLARE plain CURSOR FOR {QUERY}")
        conn.execute(f"DECLARE held CURSOR WITH HOLD FOR {QUERY}")
        conn.execute("COMMIT")
        assert _sqlstate(conn, "FETCH 1 FROM plain") == "34000"
        assert len(conn.execute("FETCH 3 FROM held").fetchall()) == 3
        conn.execute("BEGIN")
        conn.execute(f"DECLARE undone CURSOR WITH HOLD FOR {QUERY}")
        conn.execute("ROLLBACK")
        assert _sqlstate(conn, "FETCH 1 FROM undone") == "34000"
        assert len(conn.execute("FETCH ALL FROM held").fetchall()) == OCCUPATIONS - 3
        conn.execute("CLOSE held")
        assert _sqlstate(conn, "CLOSE held") == "34000"
        conn.execute(f"DECLARE again CURSOR WITH HOLD FOR {QUERY}")  # autocommit: kept
        cur = conn.execute("FETCH 2 FROM again; MOVE 5 IN again; FETCH 1 FROM again")
        tags = [cur.statusmessage]
        while cur.nextset():
            tags.append(cur.statusmessage)
        assert tags == ["FETCH 2", "MOVE 5", "FETCH 1"]
        assert cur.fetchall() == [_plain(served)[7]]
        conn.execute("CLOSE ALL")
        assert _sqlstate(conn, "FETCH 1 FROM again") == "34000"
        spent = served.spent()
        conn.execute("BEGIN")
        assert _sqlstate(conn, "DECLARE bad CURSOR FOR SELECT age FROM adult") == "42501"
        assert _sqlstate(conn, "FETCH 1 FROM bad") == "25P02"
        conn.execute("ROLLBACK")
        assert served.spent() == spent
        conn.execute("BEGIN")
        assert _sqlstate(conn, f"DECLARE b BINARY CURSOR FOR {QUERY}") == "0A000"
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute(f"DECLARE n NO SCROLL CURSOR FOR {QUERY}")
        conn.execute("FETCH 2 FROM n")
        assert _sqlstate(conn, "FETCH PRIOR FROM n") == "55000"
        conn.execute("ROLLBACK")
        assert _sqlstate(conn, "DECLARE c CURSOR WITH HOLD FOR SHOW dpproxy.epsilon") \
            == "42601"
        assert served.spent() == spent


@pytest.mark.parametrize(("statement", "problem"), [
    ("DECLARE CURSOR FOR SELECT 1", errors.SyntaxError),
    ("DECLARE c FOR SELECT 1", errors.SyntaxError),
    ("DECLARE c CURSOR SELECT 1", errors.SyntaxError),
    ("DECLARE c CURSOR FOR", errors.SyntaxError),
    ('DECLARE "" CURSOR FOR SELECT 1', errors.InvalidCursorName),
    ("DECLARE c BINARY CURSOR FOR SELECT 1", errors.NotSupportedError),
    ("FETCH", errors.SyntaxError),
    ("FETCH FORWARD 2 FROM", errors.SyntaxError),
    ("FETCH ABSOLUTE FROM c", errors.SyntaxError),
    ("FETCH ABSOLUTE ALL FROM c", errors.SyntaxError),
    ("FETCH 2 3 FROM c", errors.SyntaxError),
    ("MOVE 'x' FROM c", errors.SyntaxError),
    ("CLOSE", errors.SyntaxError),
    ("CLOSE a b", errors.SyntaxError),
])
def test_malformed_cursor_statements_say_what_is_wrong(statement: str,
                                                       problem: type[errors.Error]) -> None:
    with pytest.raises(problem) as raised:
        cursors.parse(statement)
    assert raised.value.message


def test_cursor_statements_read_as_postgresql_reads_them() -> None:
    parse = cursors.parse
    assert parse("SELECT 1") is None
    assert parse("declare C scroll cursor with hold for (select 1)") \
        == cursors.Declare("c", True, True, "(select 1)")
    assert parse('DECLARE "C" INSENSITIVE NO SCROLL CURSOR WITHOUT HOLD FOR VALUES (1)') \
        == cursors.Declare("C", False, False, "VALUES (1)")
    assert parse("FETCH c") == cursors.Fetch("c", "forward", 1)
    assert parse("FETCH -2 IN c") == cursors.Fetch("c", "backward", 2)
    assert parse("FETCH BACKWARD -2 FROM c") == cursors.Fetch("c", "forward", 2)
    assert parse("MOVE LAST FROM c") == cursors.Fetch("c", "absolute", -1, move=True)
    assert parse("MOVE RELATIVE -3 c") == cursors.Fetch("c", "relative", -3, move=True)
    assert parse("FETCH ALL c") == cursors.Fetch("c", "forward", None)
    assert parse("CLOSE ALL") == cursors.CloseCursor(None)
    assert parse('CLOSE "All"') == cursors.CloseCursor("All")
    assert parse('FETCH "next"') == cursors.Fetch("next", "forward", 1)


def test_a_session_without_the_server_says_where_cursors_are(engine: Engine) -> None:
    """In process (the DB-API's session) there are no SQL cursors: the hint says so."""
    with pytest.raises(errors.NotSupportedError) as raised:
        engine.session("alice").execute(f"DECLARE c CURSOR FOR {QUERY}")
    assert raised.value.hint is not None and "fetchmany" in raised.value.hint
