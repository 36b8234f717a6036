"""The DuckDB backend's prepared statements: a text run a second time runs as a statement
prepared from it, with its parameters as literals of exactly the types DuckDB gives them
when bound from Python; anything else runs as text, as before."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

from dpproxy import errors
from dpproxy.backends import duckdb as backend_module
from dpproxy.backends.duckdb import DuckDBBackend, _Prepared

TYPED = [0, 5, -3, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40, -2**63, 2**63 - 1,
         Decimal("0.001"), Decimal("1E+3"), Decimal("-0.5"), Decimal("123.4500"),
         Decimal("0.000"), Decimal("99999999999999.9"), Decimal("1234567890123456789"),
         Decimal("-12345678901234567890.5"), 1.5, -0.0, 1e300, 5e-324, True, False,
         "", "it's", "Äö '' \\n", "df529b6b407a4877bcaf69dbb046c504"]


def test_each_literal_has_the_type_and_value_of_the_bound_parameter() -> None:
    con = duckdb.connect()
    prepared = _Prepared(con)
    con.execute("PREPARE typed AS SELECT typeof($1), $1")
    for value in TYPED:
        arguments = prepared.arguments([value])
        assert arguments is not None, value
        as_literal = con.execute(f"EXECUTE typed{arguments}").fetchall()
        bound = con.execute("SELECT typeof($1), $1", [value]).fetchall()
        assert as_literal == bound, value
        assert type(as_literal[0][1]) is type(bound[0][1])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**63, -2**63 - 1, None,
                                   Decimal("NaN"), Decimal("Infinity"), "a\x00b", b"x",
                                   object()])
def test_a_value_without_an_exact_literal_runs_as_text(value: object) -> None:
    assert _Prepared(duckdb.connect()).arguments([1, value]) is None


@pytest.fixture
def backend(demo_database: Path) -> Iterator[DuckDBBackend]:
    opened = DuckDBBackend(demo_database)
    yield opened
    opened.close()


def test_a_text_is_prepared_the_second_time_and_answers_as_text_does(
        backend: DuckDBBackend) -> None:
    sql = ("SELECT sex, COUNT(*), SUM(capital_gain) FROM adult WHERE capital_gain > $1 "
           "AND age < $2 GROUP BY sex ORDER BY sex")
    plain = backend._cursor().execute(sql, [1000, Decimal("40.5")]).fetchall()
    runs = [backend.run_aggregate(sql, [1000, Decimal("40.5")]) for _ in range(3)]
    assert runs == [plain] * 3
    prepared: _Prepared = backend._local.prepared
    assert list(prepared._names) == [sql]
    assert backend.run_aggregate(sql, [50000, Decimal("90")]) == backend._cursor().execute(
        sql, [50000, Decimal("90")]).fetchall()


def test_random_is_drawn_afresh_by_each_execution(backend: DuckDBBackend) -> None:
    """Bounding picks rows with RANDOM(): a prepared statement must not fix its draws.
    (Equal draws in 6 runs of a 53-bit uniform: probability about 6 * 2**-53.)"""
    draws = [backend.run_aggregate("SELECT random()")[0][0] for _ in range(6)]
    assert "SELECT random()" in backend._local.prepared._names
    assert len(set(draws)) == 6


def test_a_statement_that_cannot_be_prepared_runs_as_text(backend: DuckDBBackend) -> None:
    for _ in range(3):
        assert backend.run_aggregate("PRAGMA version") \
            == backend._cursor().execute("PRAGMA version").fetchall()
    assert backend._local.prepared._names == {}


def test_errors_say_nothing_of_the_data_either_way(backend: DuckDBBackend) -> None:
    for _ in range(3):  # as text, then prepared, then prepared again
        with pytest.raises(errors.BackendError) as caught:
            backend.run_aggregate("SELECT CAST(sex AS INTEGER) FROM adult WHERE age > $1",
                                  [20])
        assert "Male" not in str(caught.value) and "Female" not in str(caught.value)
        assert caught.value.detail == "backend error class: ConversionException"
    assert len(backend._local.prepared._names) == 1


def test_the_least_recently_run_statement_is_deallocated(
        backend: DuckDBBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "PREPARED_PER_THREAD", 2)
    texts = [f"SELECT COUNT(*) + {n} FROM adult WHERE age > $1" for n in range(4)]
    for sql in texts:
        for _ in range(2):
            assert backend.run_aggregate(sql, [30]) == backend._cursor().execute(
                sql, [30]).fetchall()
    prepared: _Prepared = backend._local.prepared
    assert list(prepared._names) == texts[2:]
    with pytest.raises(duckdb.Error):  # the first one's statement is gone from DuckDB too
        backend._cursor().execute("EXECUTE dpproxy_prepared_0(30)")


def test_each_thread_prepares_on_its_own_cursor(backend: DuckDBBackend) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE capital_gain > $1"
    expected = backend._cursor().execute(sql, [0]).fetchall()
    results: list[object] = []

    def worker() -> None:
        results.extend(backend.run_aggregate(sql, [0]) for _ in range(3))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 12


def test_switched_off_it_runs_every_text_as_text(backend: DuckDBBackend,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_module, "PREPARED_STATEMENTS", False)
    for _ in range(3):
        backend.run_aggregate("SELECT COUNT(*) FROM adult")
    assert backend._local.prepared._names == {}


def test_statements_run_without_materializing_common_subplans(backend: DuckDBBackend) -> None:
    """Bounded statements read their filtered rows several times; the backend has DuckDB
    scan them again rather than materialize them (a setting of the whole database, so
    every thread's cursor has it)."""
    seen: list[object] = []

    def read() -> None:
        seen.extend(backend.run_aggregate("SELECT current_setting('disabled_optimizers')")[0])

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(10)
    read()
    assert seen == ["common_subplan", "common_subplan"]
