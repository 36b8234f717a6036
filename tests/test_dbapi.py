"""DB-API 2.0 (PEP 249) over the demo policy: module globals, exceptions with SQLSTATEs,
connections and cursors, parameters bound as literals, accuracy, options, a shared ledger.

Noise and tolerances. Value checks connect with ε = 1000 per query on a policy whose budget is
ε = 1e9. A query here has at most 5 noisy statistics, so each gets ε >= 200; a statistic of L1
sensitivity Δ then has Laplace scale b <= Δ/200: b <= 0.005 for a count (Δ = 1) and b <= 0.45
for SUM(age) (Δ <= 90). Every tolerance is at least 50·b; a (discrete) Laplace draw exceeds
50·b with probability < 2·e^-50 ≈ 4e-22, so no assertion here fails by bad luck with any
noticeable probability. Interval checks use confidence 1 - 1e-9: a conservative interval misses
the exact value with probability <= 1e-9 each (<= 1e-8 for the whole test).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import dpproxy
from dpproxy.release import ColumnAccuracy

from .test_server_support import BIG_BUDGET

EPS = 1000.0
BY_SEX = "SELECT sex, COUNT(*), SUM(age), AVG(age), COUNT(*) AS n FROM adult GROUP BY sex"
TOTAL_PEOPLE = "SELECT COUNT(*) FROM adult"

Connect = Callable[..., dpproxy.Connection]



@pytest.fixture(scope="module")
def exact_db(demo_database: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[duckdb.DuckDBPyConnection]:
    """The demo data read directly (a copy, so no engine's DuckDB instance is shared): the
    noiseless answers released values are compared with."""
    copy = tmp_path_factory.mktemp("exact_dbapi") / "demo.duckdb"
    shutil.copyfile(demo_database, copy)
    con = duckdb.connect(str(copy), read_only=True)
    yield con
    con.close()


def exact(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None
          ) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in con.execute(sql, params or []).fetchall()]


@pytest.fixture
def big_policy(make_policy: Any) -> Path:
    return make_policy(replace=BIG_BUDGET)


@pytest.fixture
def connect(big_policy: Path) -> Iterator[Connect]:
    """dpproxy.connect on the big-budget policy; every connection is closed afterwards."""
    opened: list[dpproxy.Connection] = []

    def make(analyst: str = "alice", **options: Any) -> dpproxy.Connection:
        conn = dpproxy.connect(big_policy, analyst=analyst, **options)
        opened.append(conn)
        return conn

    yield make
    for conn in opened:
        conn.close()


@pytest.fixture
def conn(connect: Connect) -> dpproxy.Connection:
    return connect(epsilon=EPS)


def budget_row(conn: dpproxy.Connection) -> dict[str, Any]:
    cur = conn.execute("SHOW dpproxy.budget")
    assert cur.description is not None
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    (row,) = [r for r in rows if r["account"] == "analyst:alice"]
    return row


# -- module globals and exceptions --------------------------------------------------------------

def test_module_globals() -> None:
    assert dpproxy.apilevel == "2.0"
    assert dpproxy.threadsafety in (0, 1, 2, 3)
    assert dpproxy.paramstyle == "pyformat"
    assert callable(dpproxy.connect)
    for name in ("Date", "Time", "Timestamp", "DateFromTicks", "TimeFromTicks",
                 "TimestampFromTicks", "Binary", "STRING", "BINARY", "NUMBER", "DATETIME",
                 "ROWID"):
        assert hasattr(dpproxy, name), name


def test_exception_hierarchy_is_pep_249() -> None:
    assert issubclass(dpproxy.Warning, Exception)
    assert issubclass(dpproxy.Error, Exception)
    assert not issubclass(dpproxy.Warning, dpproxy.Error)
    for name in ("InterfaceError", "DatabaseError"):
        assert issubclass(getattr(dpproxy, name), dpproxy.Error), name
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError",
                 "ProgrammingError", "NotSupportedError"):
        assert issubclass(getattr(dpproxy, name), dpproxy.DatabaseError), name
    assert not issubclass(dpproxy.InterfaceError, dpproxy.DatabaseError)
    assert dpproxy.Error is dpproxy.errors.Error


@pytest.mark.parametrize(("sql", "sqlstate", "family"), [
    ("SELECT * FROM adult", "42501", "ProgrammingError"),
    ("SELECT age FROM adult", "42501", "ProgrammingError"),
    ("SELECT COUNT(* FROM adult", "42601", "ProgrammingError"),
    ("DELETE FROM adult", "42501", "ProgrammingError"),
    ("SELECT COUNT(*) FROM nowhere", "42P01", "ProgrammingError"),
    ("SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult", "0A000",
     "NotSupportedError"),
])
def test_execute_errors_carry_sqlstate(conn: dpproxy.Connection, sql: str, sqlstate: str,
                                       family: str) -> None:
    cur = conn.cursor()
    with pytest.raises(getattr(dpproxy, family)) as info:
        cur.execute(sql)
    assert info.value.sqlstate == sqlstate
    assert isinstance(info.value, dpproxy.DatabaseError)
    with pytest.raises(dpproxy.ProgrammingError):
        cur.fetchall()  # a failed execute leaves no result behind


def test_syntax_error_has_a_position(conn: dpproxy.Connection) -> None:
    with pytest.raises(dpproxy.ProgrammingError) as info:
        conn.execute("SELECT COUNT(* FROM adult")
    assert info.value.position == len("SELECT COUNT(* ") + 1


# -- connections and cursors --------------------------------------------------------------------

def test_execute_and_fetch(conn: dpproxy.Connection, exact_db: duckdb.DuckDBPyConnection
                           ) -> None:
    expected = dict(exact(exact_db, "SELECT sex, COUNT(*) FROM adult GROUP BY sex"))
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1
    assert cur.arraysize == 1
    assert cur.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex") is cur
    assert cur.rowcount == 2
    first = cur.fetchone()
    assert first is not None and first[0] == "Female"
    rest = cur.fetchall()
    assert [row[0] for row in rest] == ["Male"]
    assert cur.fetchone() is None
    assert cur.fetchall() == []
    assert cur.fetchmany() == []
    for sex, count in [first, *rest]:
        assert isinstance(count, int)
        assert abs(count - expected[sex]) <= 1

    occupations = "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation"
    cur.execute(occupations)
    assert cur.rowcount == 14
    assert len(cur.fetchmany()) == 1  # arraysize
    assert len(cur.fetchmany(5)) == 5
    cur.arraysize = 3
    assert len(cur.fetchmany()) == 3
    assert len(cur.fetchmany(100)) == 5
    assert cur.fetchmany(2) == []

    cur.execute(occupations)  # a repeat: its first answer, rewound
    rows = list(cur)
    assert len(rows) == 14
    assert rows[0][0] == "Adm-clerical"
    assert list(cur) == []


def test_description_names_and_types(conn: dpproxy.Connection) -> None:
    cur = conn.execute(BY_SEX)
    description = cur.description
    assert description is not None
    assert all(len(column) == 7 for column in description)
    assert [d[0] for d in description] == ["sex", "count", "sum", "avg", "n"]
    codes = [d[1] for d in description]
    assert codes[0] == dpproxy.STRING and codes[0] != dpproxy.NUMBER
    assert all(code == dpproxy.NUMBER for code in codes[1:])
    assert all(code != dpproxy.STRING for code in codes[1:])
    assert dpproxy.NUMBER == codes[1]  # noqa: SIM300 - either side compares

    cur.execute("SELECT sex AS key, ROUND(AVG(age), 1), COUNT(*) + 1 FROM adult GROUP BY sex")
    assert cur.description is not None
    assert [d[0] for d in cur.description] == ["key", "round", "?column?"]


def test_session_statements_have_no_result_set(conn: dpproxy.Connection) -> None:
    cur = conn.cursor()
    for sql in ("BEGIN", "SET application_name = 'x'", "COMMIT", "RESET ALL"):
        cur.execute(sql)
        assert cur.description is None
        assert cur.rowcount == -1
        with pytest.raises(dpproxy.ProgrammingError):
            cur.fetchone()


def test_fetch_before_execute_raises(conn: dpproxy.Connection) -> None:
    cur = conn.cursor()
    for fetch in (cur.fetchone, cur.fetchall, cur.fetchmany):
        with pytest.raises(dpproxy.ProgrammingError):
            fetch()


def test_closed_cursor_raises_interface_error(conn: dpproxy.Connection) -> None:
    cur = conn.execute(TOTAL_PEOPLE)
    cur.close()
    cur.close()  # closing twice is harmless
    with pytest.raises(dpproxy.InterfaceError):
        cur.execute(TOTAL_PEOPLE)
    with pytest.raises(dpproxy.InterfaceError):
        cur.fetchone()
    with pytest.raises(dpproxy.InterfaceError):
        cur.fetchall()
    assert conn.execute("SHOW dpproxy.epsilon").fetchone() is not None  # the connection lives


def test_closed_connection_raises_interface_error(connect: Connect) -> None:
    conn = connect(epsilon=EPS)
    cur = conn.execute(TOTAL_PEOPLE)
    assert not conn.closed
    conn.close()
    conn.close()
    assert conn.closed
    for action in (lambda: cur.execute(TOTAL_PEOPLE), cur.fetchone,
                   lambda: conn.execute(TOTAL_PEOPLE), conn.commit, conn.rollback):
        with pytest.raises(dpproxy.InterfaceError):
            action()


def test_cursor_on_a_closed_connection_raises(connect: Connect) -> None:
    conn = connect()
    conn.close()
    with pytest.raises(dpproxy.InterfaceError):
        conn.cursor()


def test_context_managers_close(connect: Connect, big_policy: Path) -> None:
    with dpproxy.connect(big_policy, analyst="alice", epsilon=EPS) as conn:
        with conn.cursor() as cur:
            cur.execute(TOTAL_PEOPLE)
            assert cur.fetchone() is not None
        with pytest.raises(dpproxy.InterfaceError):
            cur.fetchone()
        assert not conn.closed
    assert conn.closed
    with pytest.raises(dpproxy.InterfaceError):
        conn.execute(TOTAL_PEOPLE)
    # the engine was released: a new connection to the same policy works
    assert connect(epsilon=EPS).execute(TOTAL_PEOPLE).fetchone() is not None


def test_commit_and_rollback_are_noops(conn: dpproxy.Connection) -> None:
    before = budget_row(conn)
    cur = conn.execute(TOTAL_PEOPLE)
    conn.rollback()
    conn.commit()
    assert cur.fetchone() is not None
    spent = budget_row(conn)["epsilon_spent"] - before["epsilon_spent"]
    assert spent == pytest.approx(EPS)  # a rollback does not take a charge back


def test_connection_execute_shortcut(conn: dpproxy.Connection) -> None:
    cur = conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s", [200])
    assert isinstance(cur, dpproxy.Cursor)
    assert cur.connection is conn
    (row,) = cur.fetchall()
    assert abs(row[0]) <= 1  # nobody is over 200; scale <= 0.001


# -- parameters ---------------------------------------------------------------------------------

def test_parameters_are_literal_values(conn: dpproxy.Connection,
                                       exact_db: duckdb.DuckDBPyConnection) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE occupation = %s"
    total = exact(exact_db, TOTAL_PEOPLE)[0][0]
    sales = exact(exact_db, "SELECT COUNT(*) FROM adult WHERE occupation = 'Sales'")[0][0]
    assert total > 30_000 and sales > 1_000

    (count,) = conn.execute(sql, ["Sales"]).fetchone() or ()
    assert abs(count - sales) <= 1
    for value in ("O'Brien", "x' OR 1=1 --", "Sales' OR '1'='1", "a\\'; DROP TABLE adult; --"):
        (count,) = conn.execute(sql, [value]).fetchone() or ()
        assert abs(count) <= 1, value  # matches no row; an injection would count everyone
    (count,) = conn.execute(TOTAL_PEOPLE).fetchone() or ()
    assert abs(count - total) <= 1  # the table is still there


def test_named_parameters(conn: dpproxy.Connection, exact_db: duckdb.DuckDBPyConnection
                          ) -> None:
    (expected,) = exact(exact_db, "SELECT COUNT(*) FROM adult WHERE occupation = ? AND age > ?",
                        ["Sales", 40])[0]
    cur = conn.execute("SELECT COUNT(*) FROM adult WHERE occupation = %(occ)s "
                       "AND age > %(age)s", {"occ": "Sales", "age": 40})
    (count,) = cur.fetchone() or ()
    assert abs(count - expected) <= 1


@pytest.mark.parametrize(("sql", "params"), [
    ("SELECT COUNT(*) FROM adult WHERE age > %s", []),
    ("SELECT COUNT(*) FROM adult WHERE age > %s", [1, 2]),
    ("SELECT COUNT(*) FROM adult WHERE age > %s AND age < %s", [1]),
    ("SELECT COUNT(*) FROM adult", [1]),
    ("SELECT COUNT(*) FROM adult WHERE age > %(a)s", {"b": 1}),
    ("SELECT COUNT(*) FROM adult WHERE age > %s", [b"\x00"]),
])
def test_wrong_parameters_raise_programming_error(conn: dpproxy.Connection, sql: str,
                                                  params: Any) -> None:
    before = budget_row(conn)["epsilon_spent"]
    with pytest.raises(dpproxy.ProgrammingError):
        conn.execute(sql, params)
    assert budget_row(conn)["epsilon_spent"] == before


# -- accuracy -----------------------------------------------------------------------------------

def test_accuracy_per_column(connect: Connect) -> None:
    conn = connect(epsilon=1.0)
    cur = conn.execute(BY_SEX)
    assert cur.description is not None
    accuracy = cur.accuracy
    assert len(accuracy) == len(cur.description)
    assert accuracy[0] is None  # a group key
    count = accuracy[1]
    assert isinstance(count, ColumnAccuracy)
    assert count.mechanism == "laplace"
    assert count.half_width is not None and count.half_width > 0
    assert 0 < count.epsilon <= 1.0
    assert count.confidence == 0.95
    assert all(s > 0 for s in count.noise_scales)
    avg = accuracy[3]
    assert isinstance(avg, ColumnAccuracy)
    assert avg.half_width is None  # its interval depends on the row
    assert len(avg.noise_scales) == 2  # a sum and a count
    # age is never NULL: AVG divides by the COUNT(*) measurement, measured once
    assert avg.noise_scales[1] == count.noise_scales[0]
    n = accuracy[4]
    assert n is not None and n.name == "n"
    assert (n.aggregate, n.noise_scales, n.epsilon) == (  # the same measurement as `count`
        count.aggregate, count.noise_scales, count.epsilon)
    total = accuracy[2].epsilon + avg.epsilon  # SUM, AVG's sum and count: each statistic once
    assert total == pytest.approx(1.0)  # the query's ε, COUNT(*) and n not charged again
    assert cur.result is not None and cur.result.cost is not None
    assert cur.result.cost.epsilon == pytest.approx(1.0)
    assert any("laplace" in notice for notice in cur.notices)

    rows = cur.fetchall()
    assert len(cur.intervals) == len(rows)
    for row, intervals in zip(rows, cur.intervals, strict=True):
        assert intervals[0] is None
        for value, interval in zip(row[1:], intervals[1:], strict=True):
            assert interval is not None
            low, high = interval
            assert low <= value <= high
        low, high = intervals[1]
        assert high - low == pytest.approx(2 * count.half_width)


def test_intervals_contain_the_exact_answer(connect: Connect,
                                            exact_db: duckdb.DuckDBPyConnection) -> None:
    """Confidence 1 - 1e-9 per interval (see the module docstring for the rate)."""
    conn = connect(epsilon=EPS, confidence=1 - 1e-9)
    expected = {row[0]: row[1:] for row in exact(
        exact_db, "SELECT sex, COUNT(*), SUM(LEAST(GREATEST(age, 17), 90)), "
                  "AVG(LEAST(GREATEST(age, 17), 90)), COUNT(*) FROM adult GROUP BY sex")}
    cur = conn.execute(BY_SEX)
    rows = cur.fetchall()
    assert {row[0] for row in rows} == set(expected)
    for row, intervals in zip(rows, cur.intervals, strict=True):
        truth = expected[row[0]]
        for value, interval, exact_value in zip(row[1:], intervals[1:], truth, strict=True):
            assert interval is not None
            assert interval[0] <= exact_value <= interval[1], (row, interval, exact_value)
            assert interval[0] <= value <= interval[1]
        count, total, mean = row[1], row[2], row[3]
        assert abs(count - truth[0]) <= 1
        assert abs(total - truth[1]) <= 25
        assert abs(mean - truth[2]) <= 0.01


# -- options ------------------------------------------------------------------------------------

def test_connect_options_apply(connect: Connect) -> None:
    conn = connect(epsilon=0.25, delta=1e-6, mechanism="gaussian", confidence=0.9)
    shown = {}
    for name in ("epsilon", "delta", "mechanism", "confidence"):
        cur = conn.execute(f"SHOW dpproxy.{name}")
        assert cur.description is not None and cur.description[0][0] == f"dpproxy.{name}"
        (shown[name],) = cur.fetchone() or ()
    assert float(shown["epsilon"]) == 0.25
    assert float(shown["delta"]) == 1e-6
    assert shown["mechanism"] == "gaussian"
    assert float(shown["confidence"]) == 0.9

    other = connect()  # options are per connection
    (epsilon,) = other.execute("SHOW dpproxy.epsilon").fetchone() or ()
    assert float(epsilon) == 0.1  # the policy's default


def test_gaussian_with_delta(connect: Connect, exact_db: duckdb.DuckDBPyConnection) -> None:
    conn = connect(epsilon=EPS, delta=1e-6, mechanism="gaussian")
    total = exact(exact_db, TOTAL_PEOPLE)[0][0]
    cur = conn.execute(TOTAL_PEOPLE)
    (count,) = cur.fetchone() or ()
    (accuracy,) = cur.accuracy
    assert accuracy is not None
    assert accuracy.mechanism == "gaussian"
    assert accuracy.delta == pytest.approx(1e-6)
    # σ of a count at ε = 1000, δ = 1e-6 is about 0.005: 1 is far beyond 50σ
    assert abs(count - total) <= 1


def test_set_option_in_sql(conn: dpproxy.Connection) -> None:
    conn.execute("SET dpproxy.epsilon = 0.5")
    (epsilon,) = conn.execute("SHOW dpproxy.epsilon").fetchone() or ()
    assert float(epsilon) == 0.5
    conn.execute("RESET dpproxy.epsilon")
    (epsilon,) = conn.execute("SHOW dpproxy.epsilon").fetchone() or ()
    assert float(epsilon) == 0.1



def test_set_option_from_a_parameter(conn: dpproxy.Connection) -> None:
    """`SET dpproxy.epsilon = %s` binds its value, as a client-side driver would (the
    placeholder's text was read as the value: 22023 for '%s')."""
    conn.execute("SET dpproxy.epsilon = %s", [0.5])
    conn.execute("SET dpproxy.mechanism = %(m)s", {"m": "gaussian"})
    assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
    assert conn.execute("SHOW dpproxy.mechanism").fetchone() == ("gaussian",)
    with pytest.raises(dpproxy.ProgrammingError, match="no parameters were given"):
        conn.execute("SET dpproxy.epsilon = %s")
    with pytest.raises(dpproxy.DataError) as info:
        conn.execute("SET dpproxy.epsilon = %s", ["lots"])
    assert info.value.sqlstate == "22023"
    assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
    # in a string with a query, the parameters are the statement's that has placeholders;
    # two such statements are refused (each took the first's: ε = 3 and age > 3)
    conn.execute("SET dpproxy.epsilon = %s; SELECT COUNT(*) FROM adult", [0.25])
    assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.25",)
    # a string parsed once without parameters (then cached) still refuses some
    conn.execute("SET dpproxy.epsilon = 0.25; SELECT COUNT(*) FROM adult")
    with pytest.raises(dpproxy.ProgrammingError, match="no placeholders"):
        conn.execute("SET dpproxy.epsilon = 0.25; SELECT COUNT(*) FROM adult", [30])
    for params in ([3], [3, 30]):  # the refusal, not a count of parameters
        with pytest.raises(dpproxy.NotSupportedError):
            conn.execute("SET dpproxy.epsilon = %s; SELECT COUNT(*) FROM adult "
                         "WHERE age > %s", params)
    assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.25",)

@pytest.mark.parametrize("options", [
    {"epsilon": -1}, {"epsilon": 0}, {"epsilon": "lots"}, {"epsilon": float("nan")},
    {"epsilon": 1e308},
    {"delta": 1.5}, {"delta": -0.1}, {"mechanism": "exponential"}, {"confidence": 1.5},
    {"mechanism": "gaussian", "delta": 0},
])
def test_invalid_connect_option_is_22023(big_policy: Path, options: dict[str, Any]) -> None:
    with pytest.raises(dpproxy.DataError) as info:
        dpproxy.connect(big_policy, analyst="alice", **options)
    assert info.value.sqlstate == "22023"


@pytest.mark.parametrize("sql", ["SET dpproxy.epsilon = -1", "SET dpproxy.delta = 2",
                                 "SET dpproxy.mechanism = 'exponential'",
                                 "SET dpproxy.epsilon = 1e308"])  # was an internal error
def test_invalid_set_option_is_22023(conn: dpproxy.Connection, sql: str) -> None:
    with pytest.raises(dpproxy.Error) as info:
        conn.execute(sql)
    assert info.value.sqlstate == "22023"
    (epsilon,) = conn.execute("SHOW dpproxy.epsilon").fetchone() or ()
    assert float(epsilon) == EPS  # unchanged


def test_unknown_analyst_names_the_known_ones(big_policy: Path) -> None:
    with pytest.raises(dpproxy.OperationalError) as info:
        dpproxy.connect(big_policy, analyst="mallory")
    assert info.value.sqlstate == "28000"  # who connects is wrong, not the policy
    text = str(info.value)
    assert "mallory" in text
    assert "alice" in text and "admin" in text


def test_policy_that_fails_to_load_is_an_operational_error(tmp_path: Path) -> None:
    """A DB-API caller catching DatabaseError (or OperationalError, as for psycopg's bad
    connection string) also catches a policy that does not load, with its SQLSTATE."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[backend]\nkind = \"nosuch\"\n")
    with pytest.raises(dpproxy.OperationalError) as info:
        dpproxy.connect(bad, analyst="alice")
    assert isinstance(info.value, dpproxy.errors.InvalidPolicy)
    assert isinstance(info.value, dpproxy.DatabaseError)
    assert info.value.sqlstate == "F0000"
    assert "bad.toml" in str(info.value)


# -- the ledger ---------------------------------------------------------------------------------

def test_connections_to_one_policy_share_the_ledger(connect: Connect, big_policy: Path) -> None:
    first = connect(epsilon=2.5)
    second = connect(epsilon=EPS)
    start = budget_row(second)
    assert start["epsilon_spent"] == 0
    first.execute(TOTAL_PEOPLE)
    after = budget_row(second)
    assert after["epsilon_spent"] == pytest.approx(2.5)
    assert after["epsilon_remaining"] == pytest.approx(start["epsilon_remaining"] - 2.5)

    second.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
    assert budget_row(first)["epsilon_spent"] == pytest.approx(2.5 + EPS)

    first.close()
    second.close()
    with dpproxy.connect(big_policy, analyst="alice") as again:  # a new engine, same file
        assert budget_row(again)["epsilon_spent"] == pytest.approx(2.5 + EPS)


def test_budget_is_enforced_through_the_dbapi(make_policy: Any) -> None:
    with dpproxy.connect(make_policy(), analyst="alice", epsilon=6.0) as conn:
        conn.execute(TOTAL_PEOPLE)
        with pytest.raises(dpproxy.OperationalError) as info:
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
        assert info.value.sqlstate == "53400"
        assert budget_row(conn)["epsilon_spent"] == pytest.approx(6.0)


# -- known bugs seen through the DB-API ---------------------------------------------------------

def test_having_is_not_null_keeps_every_group(conn: dpproxy.Connection) -> None:
    cur = conn.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex "
                       "HAVING COUNT(*) IS NOT NULL")
    assert [row[0] for row in cur.fetchall()] == ["Female", "Male"]


def test_unsupported_cast_costs_nothing(conn: dpproxy.Connection) -> None:
    before = budget_row(conn)["epsilon_spent"]
    with pytest.raises(dpproxy.NotSupportedError):
        conn.execute("SELECT CAST(COUNT(*) AS DATE) FROM adult")
    assert budget_row(conn)["epsilon_spent"] == before


def test_infinite_parameter_is_refused_or_answered(conn: dpproxy.Connection,
                                                   exact_db: duckdb.DuckDBPyConnection) -> None:
    total = exact(exact_db, TOTAL_PEOPLE)[0][0]
    before = budget_row(conn)["epsilon_spent"]
    try:
        (count,) = conn.execute("SELECT COUNT(*) FROM adult WHERE age < %s",
                                [float("inf")]).fetchone() or ()
    except dpproxy.ProgrammingError:
        assert budget_row(conn)["epsilon_spent"] == before
    else:
        assert abs(count - total) <= 1


def test_date_columns_are_dates(conn: dpproxy.Connection) -> None:
    """A date key and a date's quantile come as datetime.date, as psycopg reads the same
    columns from `dpproxy serve`; `cursor.result` keeps the released ISO text."""
    cur = conn.cursor()
    cur.execute("SELECT DATE_TRUNC('month', day) AS month, MAX(day) AS last FROM visits "
                "GROUP BY 1 ORDER BY 1")
    assert cur.description is not None
    assert [d[1] for d in cur.description] == ["date", "date"]
    rows = cur.fetchall()
    assert [r[0] for r in rows] == [dt.date(2024, m, 1) for m in range(1, 13)]
    assert all(isinstance(last, dt.date) and dt.date(2024, 1, 1) <= last
               <= dt.date(2024, 12, 31) for _, last in rows)
    assert cur.result is not None and cur.result.rows[0][0] == "2024-01-01"


def test_grants_follow_the_policy_file(make_policy: Any) -> None:
    """An open DB-API connection sees an edit of alice's tables from its next statement, as
    the wire server's do: a revoked table is refused (42501), repeats included, and
    charges nothing; granted back, it answers again."""
    path = make_policy()
    text = path.read_text()
    granted = 'tables = ["adult", "visits", "occupation_groups"]'
    assert granted in text
    with dpproxy.connect(path, analyst="alice") as conn:
        conn.execute("SELECT COUNT(*) FROM visits").fetchall()
        path.write_text(text.replace(granted, 'tables = ["adult", "occupation_groups"]'))
        ledger = conn.session.engine.ledger
        spent = ledger.status("analyst:alice").spent.epsilon
        with pytest.raises(dpproxy.ProgrammingError) as refused:
            conn.execute("SELECT COUNT(*) FROM visits")
        assert refused.value.sqlstate == "42501" and "visits" in str(refused.value)
        assert ledger.status("analyst:alice").spent.epsilon == spent
        path.write_text(text)
        assert conn.execute("SELECT COUNT(*) FROM visits WHERE amount > 1").fetchall()


def test_a_removed_analyst_runs_nothing_more(make_policy: Any) -> None:
    """Removing alice from the policy file ends what her open DB-API connection can do, as
    the wire server ends her connections: her next statement is 28000 and charges
    nothing."""
    path = make_policy()
    text = path.read_text()
    start, end = text.index("[analysts.alice]"), text.index("[analysts.admin]")
    with dpproxy.connect(path, analyst="alice") as conn:
        conn.execute("SELECT COUNT(*) FROM adult").fetchall()
        ledger = conn.session.engine.ledger
        spent = ledger.status("analyst:alice").spent.epsilon
        path.write_text(text[:start] + text[end:])
        with pytest.raises(dpproxy.OperationalError) as refused:
            conn.execute("SELECT COUNT(*) FROM visits")
        assert refused.value.sqlstate == "28000" and "removed" in str(refused.value)
        assert ledger.status("analyst:alice").spent.epsilon == spent


def test_executemany_without_parameter_sets_leaves_no_result(conn: dpproxy.Connection
                                                              ) -> None:
    """An empty executemany kept the previous statement's rows and description, even on a
    closed cursor."""
    cur = conn.cursor()
    cur.execute("SELECT COUNT(*) FROM adult")
    assert cur.rowcount == 1
    cur.executemany("SELECT COUNT(*) FROM adult WHERE age > %s", [])
    assert cur.rowcount == -1 and cur.description is None
    cur.close()
    with pytest.raises(dpproxy.InterfaceError):
        cur.executemany("SELECT COUNT(*) FROM adult", [])


def test_the_statement_is_text_or_utf8_bytes(conn: dpproxy.Connection) -> None:
    """Bytes are read as UTF-8, as psycopg reads them; anything else is a ProgrammingError
    (it was a bare TypeError, outside dpproxy.Error)."""
    cur = conn.cursor()
    assert cur.execute(b"SELECT COUNT(*) FROM adult").rowcount == 1
    for bad in (None, 42, b"\xff"):
        with pytest.raises(dpproxy.ProgrammingError):
            cur.execute(bad)  # type: ignore[arg-type]


def test_a_cursor_is_an_iterator(conn: dpproxy.Connection) -> None:
    """next(cursor) reads the next row, as PEP 249's extension and psycopg have it."""
    cur = conn.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
    assert next(cur)[0] == "Female"
    assert [r[0] for r in cur] == ["Male"]
    with pytest.raises(StopIteration):
        next(cur)
