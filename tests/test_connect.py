"""End to end through the DB-API: `dpproxy.connect` on a copy of the demo policy."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import dpproxy

from .conftest import PolicyFactory

BIG = {"budget = { epsilon = 10.0, delta = 1e-5 }": "budget = { epsilon = 1e6, delta = 0.5 }"}


def test_module_globals_and_exceptions() -> None:
    assert (dpproxy.apilevel, dpproxy.paramstyle) == ("2.0", "pyformat")
    assert dpproxy.threadsafety in (0, 1, 2, 3)
    assert issubclass(dpproxy.Error, Exception) and issubclass(dpproxy.Warning, Exception)
    for cls in (dpproxy.InterfaceError, dpproxy.DatabaseError):
        assert issubclass(cls, dpproxy.Error)
    for cls in (dpproxy.DataError, dpproxy.OperationalError, dpproxy.IntegrityError,
                dpproxy.InternalError, dpproxy.ProgrammingError, dpproxy.NotSupportedError):
        assert issubclass(cls, dpproxy.DatabaseError)


def test_query_fetch_description_and_accuracy(make_policy: PolicyFactory,
                                              demo_database: Path) -> None:
    exact = dict(duckdb.connect(str(demo_database), read_only=True).execute(
        "SELECT sex, COUNT(*) FROM adult WHERE hours_per_week > 40 GROUP BY sex").fetchall())
    with dpproxy.connect(make_policy(replace=BIG), analyst="alice", epsilon=1000) as conn:
        cur = conn.cursor()
        cur.execute("SELECT sex, COUNT(*) AS n, AVG(age) FROM adult "
                    "WHERE hours_per_week > %s GROUP BY sex", [40])
        assert [d[0] for d in cur.description] == ["sex", "n", "avg"]
        assert cur.description[0][1] == dpproxy.STRING
        assert cur.description[1][1] == dpproxy.NUMBER
        assert cur.rowcount == 2
        first = cur.fetchone()
        rest = cur.fetchall()
        assert cur.fetchone() is None
        rows = [first, *rest]
        # ε = 1000 split in two (AVG(age) divides by COUNT(*): age is never NULL): Laplace
        # scale 0.002 on counts; |noise| >= 1 has prob ~e^-500
        assert {r[0]: r[1] for r in rows} == exact
        assert cur.accuracy[0] is None
        count_acc = cur.accuracy[1]
        assert count_acc is not None and count_acc.mechanism == "laplace"
        assert count_acc.half_width is not None and count_acc.epsilon == pytest.approx(1000 / 2)
        assert cur.accuracy[2] is not None and cur.accuracy[2].half_width is None
        low, high = cur.intervals[0][2]
        assert low <= rows[0][2] <= high


def test_parameters_are_values_never_sql(make_policy: PolicyFactory) -> None:
    with dpproxy.connect(make_policy(replace=BIG), analyst="alice", epsilon=1000) as conn:
        cur = conn.cursor()
        for value in ("x' OR 1=1 --", "O'Brien"):
            cur.execute("SELECT COUNT(*) FROM adult WHERE occupation = %(o)s", {"o": value})
            assert cur.fetchone() == (0,)  # no such occupation: a true count of 0
        with pytest.raises(dpproxy.ProgrammingError):
            cur.execute("SELECT COUNT(*) FROM adult WHERE age > %s", [1, 2])


def test_errors_carry_sqlstate_and_cost_nothing(make_policy: PolicyFactory) -> None:
    with dpproxy.connect(make_policy(), analyst="alice") as conn:
        cur = conn.cursor()
        for sql, state, cls in (("SELECT * FROM adult", "42501", dpproxy.ProgrammingError),
                                ("SELEC 1", "42601", dpproxy.ProgrammingError),
                                ("SELECT CORR(age, hours_per_week) FROM adult", "0A000",
                                 dpproxy.NotSupportedError)):
            with pytest.raises(cls) as caught:
                cur.execute(sql)
            assert caught.value.sqlstate == state
        cur.execute("SHOW dpproxy.budget")
        assert cur.fetchone()[2] == 0.0  # ε spent


def test_options_apply_and_connections_share_the_ledger(make_policy: PolicyFactory) -> None:
    policy = make_policy()
    with dpproxy.connect(policy, analyst="alice", epsilon=0.5, mechanism="gaussian",
                         delta=1e-6) as first, \
            dpproxy.connect(policy, analyst="alice") as second:
        assert first.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        assert first.execute("SHOW dpproxy.mechanism").fetchone() == ("gaussian",)
        first.execute("SELECT COUNT(*) FROM adult")
        assert second.execute("SHOW dpproxy.budget").fetchone()[2] == 0.5
    with pytest.raises(dpproxy.DataError) as bad:
        dpproxy.connect(policy, analyst="alice", epsilon=-1)
    assert bad.value.sqlstate == "22023"
    with pytest.raises(dpproxy.Error, match="alice"):
        dpproxy.connect(policy, analyst="mallory")


def test_closed_objects_raise_interface_error(make_policy: PolicyFactory) -> None:
    conn = dpproxy.connect(make_policy(), analyst="alice")
    cur = conn.cursor()
    with pytest.raises(dpproxy.ProgrammingError):
        cur.fetchone()  # nothing executed yet
    conn.commit()
    conn.rollback()
    cur.close()
    with pytest.raises(dpproxy.InterfaceError):
        cur.execute("SELECT COUNT(*) FROM adult")
    conn.close()
    assert conn.closed
    with pytest.raises(dpproxy.InterfaceError):
        conn.cursor().execute("SELECT 1")
