"""Shared scans (`dpproxy.backends.shared_scans`): overlapping runs of one statement text
run as one statement on real DuckDB, and each run gets exactly the rows its own statement
returns; anything that cannot be shared runs alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest

from dpproxy.backends.duckdb import DuckDBBackend
from dpproxy.backends.shared_scans import SharedScans, shared_template
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryPlan
from dpproxy.session import Engine
from tests.threads import run_in_threads

Rows = list[tuple[object, ...]]

# (query with parameters, parameter sets: each a run of the same text)
SHAREABLE: list[tuple[str, list[list[Any]]]] = [
    ("SELECT COUNT(*) FROM adult WHERE capital_gain > %s",
     [[0], [5000], [99999], [1], [2500]]),
    ("SELECT occupation, COUNT(*) FROM adult WHERE capital_gain > %s GROUP BY occupation",
     [[0], [20000], [99999], [15000], [30000]]),
    ("SELECT AVG(hours_per_week) FROM adult WHERE capital_gain > %s",
     [[0], [7000], [99999], [3000]]),
    ("SELECT sex, income, SUM(age), COUNT(*) FROM adult WHERE age BETWEEN %s AND %s "
     "GROUP BY sex, income", [[17, 90], [30, 31], [89, 90], [60, 20], [40, 50]]),
    ("SELECT education, AVG(capital_gain), SUM(hours_per_week) FROM adult "
     "WHERE age > %s AND hours_per_week < %s GROUP BY education",
     [[20, 40], [80, 99], [17, 10], [50, 60]]),
    ("SELECT COUNT(*), SUM(amount) FROM visits WHERE amount > %s", [[0], [250], [499.5], [10]]),
]


@pytest.fixture
def backend(demo_database: Path) -> Iterator[DuckDBBackend]:
    opened = DuckDBBackend(demo_database)
    yield opened
    opened.close()


def _unbounded(engine: Engine, sql: str, params: Sequence[object], late: bool = False
               ) -> tuple[str, tuple[object, ...]]:
    """The statement the backend runs for `sql` where the bounds hold, and its parameters;
    `late`: its form that filters groups by the public keys (`dpproxy.bounds`)."""
    planned, shaped = engine.session("alice")._shaped_plan(parse_statements(sql, params)[0])
    assert isinstance(planned, QueryPlan) and shaped is not None
    rewritten, values = shaped
    unbounded = rewritten.unbounded
    assert unbounded is not None
    text = unbounded.late_sql if late else unbounded.sql
    assert text is not None
    return text, unbounded.parameters(rewritten.parameters(values))


def _same_rows(shared: Rows, alone: Rows, keys: int) -> None:
    """Equal rows, in any order: keys and integers exactly, floats to rounding (a shared
    statement may add a group's values in another order)."""
    assert len(shared) == len(alone)
    by_key = {row[:keys]: row[keys:] for row in alone}
    assert len(by_key) == len(alone)
    for row in shared:
        expected = by_key[row[:keys]]
        assert [type(v) for v in row[keys:]] == [type(v) for v in expected]
        for got, want in zip(row[keys:], expected, strict=True):
            if isinstance(want, float):
                assert got == pytest.approx(want, rel=1e-12, abs=1e-9)
            else:
                assert got == want


# queries of SHAREABLE grouped by public keys only: their statements have a late form
LATE = [(sql, runs) for sql, runs in SHAREABLE if "occupation" in sql or "sex" in sql]


@pytest.mark.parametrize(("sql", "runs", "late"),
                         [(sql, runs, False) for sql, runs in SHAREABLE]
                         + [(sql, runs, True) for sql, runs in LATE])
def test_each_run_of_a_shared_statement_gets_exactly_its_own_rows(
        engine: Engine, backend: DuckDBBackend, sql: str, runs: list[list[Any]],
        late: bool) -> None:
    statements = [_unbounded(engine, sql, params, late) for params in runs]
    text = statements[0][0]
    assert all(s == text for s, _ in statements)  # one text, parameters differ
    template = shared_template(text)
    assert template is not None
    assert (template.groups_filter is not None) == late
    cursor = backend._cursor()
    alone = [cursor.execute(text, list(p)).fetchall() for _, p in statements]
    assert any(a != alone[0] for a in alone)  # the parameter sets do select different rows
    for count in range(2, len(statements) + 1):
        parameters = [v for _, p in statements[:count] for v in p]
        shared = cursor.execute(template.sql(count), parameters).fetchall()
        split = template.split(shared, count)
        assert len(split) == count
        for own, expected in zip(split, alone, strict=False):
            _same_rows(own, expected, template.keys)


def test_a_run_with_no_rows_gets_no_groups_and_a_scalar_run_its_one_row(
        engine: Engine, backend: DuckDBBackend) -> None:
    grouped = _unbounded(engine, SHAREABLE[1][0], [0])[0]
    scalar = _unbounded(engine, SHAREABLE[0][0], [0])[0]
    cursor = backend._cursor()
    for text, none in ((grouped, []), (scalar, [(0,)])):
        template = shared_template(text)
        assert template is not None
        split = template.split(cursor.execute(template.sql(2), [0, 10**9]).fetchall(), 2)
        assert split[1] == none
        _same_rows(split[0], cursor.execute(text, [0]).fetchall(), template.keys)


UNSHAREABLE = [
    "SELECT COUNT(*) FROM t",  # no parameter
    "SELECT COUNT(*) FROM (SELECT a FROM t WHERE a > ?) AS f",  # not $n
    "SELECT COUNT(*) FROM (SELECT a FROM t WHERE a > $2) AS f",  # not $1 … $n
    "SELECT COUNT(*) + $1 FROM (SELECT a FROM t WHERE a > $1) AS f",  # outside the WHERE
    "SELECT COUNT(*) FROM (SELECT a + $1 AS a FROM t WHERE a > $1) AS f",
    "SELECT k, COUNT(*) FROM (SELECT a AS k FROM t WHERE a > $1) AS f GROUP BY k HAVING "
    "COUNT(*) > 1",
    "SELECT k, COUNT(*) FROM (SELECT a AS k FROM t WHERE a > $1) AS f GROUP BY k ORDER BY k",
    "SELECT k, COUNT(*) FROM (SELECT a AS k FROM t WHERE a > $1) AS f GROUP BY k LIMIT 3",
    "SELECT COUNT(*), k FROM (SELECT a AS k FROM t WHERE a > $1) AS f GROUP BY k",
    "SELECT COUNT(DISTINCT k) FILTER (WHERE k > 0) FROM (SELECT a AS k FROM t WHERE a > $1) f",
    "SELECT k FROM (SELECT a AS k FROM t WHERE a > $1) AS f",  # no aggregate
    "SELECT COUNT(*) FROM (SELECT a, COUNT(*) AS n FROM t WHERE a > $1 GROUP BY a) AS f",
    "SELECT COUNT(*) FROM (SELECT a, ROW_NUMBER() OVER () AS r FROM t WHERE a > $1) AS f",
    "SELECT COUNT(*) FROM (SELECT a FROM (SELECT a FROM t) s WHERE a > $1) AS f",
    "SELECT COUNT(*) FROM t WHERE a > $1",  # not over a subquery
    "SELECT COUNT(*) FROM (SELECT a FROM t WHERE a > $1) AS f WHERE a < 3",
    "not sql at all (",
]


@pytest.mark.parametrize("sql", UNSHAREABLE)
def test_a_statement_of_another_shape_is_not_shared(sql: str) -> None:
    assert shared_template(sql) is None


def test_a_bounded_statement_is_not_shared(engine: Engine) -> None:
    """With per-person bounding (a salt, and aggregation per person) nothing is shared."""
    sql = "SELECT COUNT(*), SUM(amount) FROM visits WHERE amount > %s"
    planned, shaped = engine.session("alice")._shaped_plan(parse_statements(sql, [5])[0])
    assert isinstance(planned, QueryPlan) and shaped is not None
    assert shared_template(shaped[0].sql) is None


class _Gate:
    """A runner over real DuckDB whose first statement waits until `open` is set, so that
    the runs arriving meanwhile queue behind it; it records the statements it ran."""

    def __init__(self, cursor_for: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self._cursor_for = cursor_for
        self.open = threading.Event()
        self.started = threading.Event()
        self.ran: list[tuple[str, list[object]]] = []
        self.fail_shared = False

    def __call__(self, sql: str, parameters: Sequence[object]) -> Rows:
        self.ran.append((sql, list(parameters)))
        if len(self.ran) == 1:
            self.started.set()
            assert self.open.wait(10)
        if self.fail_shared and "__run_" in sql:
            raise duckdb.InvalidInputException("failed on purpose")
        return self._cursor_for().execute(sql, list(parameters)).fetchall()


def _until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):
        if condition():
            return
        time.sleep(0.005)
    raise AssertionError("the condition did not come true within 10 s")


def _overlapping(scans: SharedScans, gate: _Gate, text: str, runs: list[list[object]]
                 ) -> list[Rows | BaseException]:
    """Run `runs` at once: the first alone (held at the gate), the rest queued behind it."""
    results: list[Rows | BaseException] = [[] for _ in runs]

    def run(i: int) -> None:
        try:
            results[i] = scans.run(text, runs[i])
        except BaseException as exc:  # checked by the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(0,))]
    threads[0].start()
    assert gate.started.wait(10)
    threads += [threading.Thread(target=run, args=(i,)) for i in range(1, len(runs))]
    for thread in threads[1:]:
        thread.start()
    _until(lambda: len(scans._waiting.get(text, [])) == len(runs) - 1)
    gate.open.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    return results


def test_runs_arriving_while_one_runs_share_the_next_statement(
        engine: Engine, backend: DuckDBBackend) -> None:
    sql, runs = SHAREABLE[3]
    statements = [_unbounded(engine, sql, params) for params in runs]
    text = statements[0][0]
    gate = _Gate(backend._cursor)
    scans = SharedScans(gate)
    results = _overlapping(scans, gate, text, [list(p) for _, p in statements])
    cursor = backend._cursor()
    for (_, params), got in zip(statements, results, strict=True):
        assert isinstance(got, list)
        _same_rows(got, cursor.execute(text, list(params)).fetchall(), 2)
    # the first alone, then the other four in one statement with their parameters in order
    assert gate.ran[0][0] == text
    assert len(gate.ran) == 2 and "__run_3" in gate.ran[1][0] and "__run_4" not in gate.ran[1][0]
    assert gate.ran[1][1] == [v for _, p in statements[1:] for v in p]
    assert (scans.counts.statements, scans.counts.runs, scans.counts.largest) == (2, 5, 4)


def test_a_shared_statement_that_fails_runs_each_alone_with_its_own_outcome(
        engine: Engine, backend: DuckDBBackend) -> None:
    sql = SHAREABLE[2][0]
    text, _ = _unbounded(engine, sql, [0])
    gate = _Gate(backend._cursor)
    scans = SharedScans(gate)
    # "x" is no number: its own statement fails, so the shared one does; the others answer
    runs: list[list[object]] = [[0], [7000], ["x"], [3000]]
    results = _overlapping(scans, gate, text, runs)
    cursor = backend._cursor()
    for params, got in zip(runs, results, strict=True):
        if params == ["x"]:
            assert isinstance(got, duckdb.ConversionException)
        else:
            assert isinstance(got, list)
            _same_rows(got, cursor.execute(text, params).fetchall(), 0)
    assert [("__run_" in s) for s, _ in gate.ran] == [False, True, False, False, False]


def test_an_injected_failure_of_the_shared_statement_falls_back(
        engine: Engine, backend: DuckDBBackend) -> None:
    text, _ = _unbounded(engine, SHAREABLE[1][0], [0])
    gate = _Gate(backend._cursor)
    gate.fail_shared = True
    scans = SharedScans(gate)
    runs: list[list[object]] = [[0], [20000], [15000]]
    results = _overlapping(scans, gate, text, runs)
    cursor = backend._cursor()
    for params, got in zip(runs, results, strict=True):
        assert isinstance(got, list)
        _same_rows(got, cursor.execute(text, params).fetchall(), 1)


def test_a_run_with_the_wrong_number_of_parameters_runs_alone(
        engine: Engine, backend: DuckDBBackend) -> None:
    text, _ = _unbounded(engine, SHAREABLE[0][0], [0])
    ran: list[str] = []

    def runner(sql: str, parameters: Sequence[object]) -> Rows:
        ran.append(sql)
        return backend._cursor().execute(sql, list(parameters)).fetchall()

    with pytest.raises(duckdb.InvalidInputException):
        SharedScans(runner).run(text, [1, 2])
    assert ran == [text]


def test_a_statement_of_many_parameters_runs_alone_untaken_apart(
        engine: Engine, backend: DuckDBBackend) -> None:
    """Taking a statement apart parses it whole: 5 s for an IN list of 8,000 literals.
    One of more than MAX_PARAMETERS parameters runs as it is, and no template is made."""
    from dpproxy.backends.shared_scans import MAX_PARAMETERS

    ages = [17 + i % 70 for i in range(MAX_PARAMETERS + 1)]
    text, params = _unbounded(engine, "SELECT COUNT(*) FROM adult WHERE age IN ("
                              + ", ".join(["%s"] * len(ages)) + ")", ages)
    assert len(params) > MAX_PARAMETERS
    ran: list[str] = []

    def runner(sql: str, parameters: Sequence[object]) -> Rows:
        ran.append(sql)
        return backend._cursor().execute(sql, list(parameters)).fetchall()

    scans = SharedScans(runner)
    assert scans.run(text, params) == backend._cursor().execute(text, list(params)).fetchall()
    assert ran == [text] and not scans._templates


def test_sessions_running_at_once_share_scans_and_all_answer(engine: Engine) -> None:
    """Through the engine: 12 threads, each a new query of one shape; every answer has its
    14 public groups, and every run went through the shared scans."""
    backend = engine.backend
    assert isinstance(backend, DuckDBBackend)
    sql = SHAREABLE[1][0]
    rows: list[int] = []

    def client(i: int) -> None:
        session = engine.session("alice", epsilon=0.001)
        for j in range(6):
            result = session.execute(sql, [1000 * i + j])
            rows.append(len(result.rows))

    run_in_threads(client, 12)
    assert rows == [14] * 72
    assert backend.shared.counts.runs == 72


def test_a_statement_run_with_its_bounding_never_reaches_the_shared_scans(
        engine: Engine) -> None:
    """visits has people over its bounds, so its statements run bounded: the backend runs
    them alone without parsing them; adult's run without bounding and are shared."""
    backend = engine.backend
    assert isinstance(backend, DuckDBBackend)
    session = engine.session("alice", epsilon=0.01)
    session.execute(SHAREABLE[5][0], [5])
    assert backend.bounding.enforced == 1 and backend.shared.counts.runs == 0
    assert backend.shared._templates == {}
    session.execute(SHAREABLE[0][0], [5])
    assert backend.bounding.skipped == 1 and backend.shared.counts.runs == 1
