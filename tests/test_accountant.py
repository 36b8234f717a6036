"""The privacy budget ledger: exact arithmetic, atomic multi-account charges, concurrency
across threads and processes, durability across a killed process, schema versioning."""

from __future__ import annotations

import math
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dpproxy.accountant import (
    SCHEMA_VERSION,
    AnswerAvailable,
    Cost,
    Ledger,
    Loss,
    PostgresStorage,
)
from dpproxy.errors import (
    BudgetExceeded,
    InterfaceError,
    InvalidParameterValue,
    OperationalError,
    UndefinedObject,
)
from dpproxy.mechanisms import zcdp_epsilon
from tests.threads import run_in_threads

REPO = str(Path(__file__).resolve().parents[1])
ALICE, ADULT = "analyst:alice", "table:adult"
LedgerAt = Callable[..., Ledger]


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LedgerAt]:
    """Open a ledger by name: a SQLite file in tmp_path, or a fresh PostgreSQL schema per
    name (the same name reopens the same ledger), dropped after the test."""
    if request.param == "sqlite":
        yield lambda name, budgets, **kw: Ledger(tmp_path / name, budgets, **kw)
        return
    dsn = request.getfixturevalue("pg_dsn")
    schemas: dict[str, str] = {}

    def make(name: str, budgets: Mapping[str, Cost], **kw: Any) -> Ledger:
        schema = schemas.setdefault(name, f"dpproxy_test_{secrets.token_hex(6)}")
        return Ledger(PostgresStorage(dsn, schema), budgets, **kw)

    yield make
    with psycopg.connect(dsn, autocommit=True) as con:
        for schema in schemas.values():
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def spend(ledger: Ledger, cost: Cost, accounts: tuple[str, ...] = (ALICE,)) -> None:
    ledger.charge(accounts, cost, analyst="alice", statement="SELECT COUNT(*) FROM adult")


# -- exact decimal ----------------------------------------------------------------------------

def test_budget_of_one_buys_exactly_ten_queries_of_a_tenth(ledger_at: LedgerAt) -> None:
    assert sum([0.1] * 10) != 1.0  # why floats are not enough
    with ledger_at("l.db", {ALICE: Cost(1.0)}) as ledger:
        for _ in range(10):
            spend(ledger, Cost(0.1))
        with pytest.raises(BudgetExceeded) as exc:
            spend(ledger, Cost(0.1))
        assert exc.value.sqlstate == "53400"
        assert exc.value.message == ("privacy budget exceeded for analyst alice: query costs "
                                     "ε=0.1, δ=0; remaining ε=0, δ=0")
        assert "SET dpproxy.epsilon" in (exc.value.hint or "")
        st = ledger.status(ALICE)
        assert st.spent == Cost(1.0, 0.0)
        assert st.remaining == Cost(0.0, 0.0)
        assert len(ledger.history(ALICE)) == 10


def test_delta_is_exact_too(ledger_at: LedgerAt) -> None:
    with ledger_at("l.db", {ALICE: Cost(10.0, 1e-5)}) as ledger:
        for _ in range(10):
            spend(ledger, Cost(0.0, 1e-6))
        with pytest.raises(BudgetExceeded) as exc:
            spend(ledger, Cost(0.0, 1e-6))
        assert exc.value.sqlstate == "53400"
        assert "query costs ε=0, δ=1e-06; remaining ε=10, δ=0" in exc.value.message
        assert "SET dpproxy.delta" in (exc.value.hint or "")
        assert ledger.status(ALICE).spent == Cost(0.0, 1e-5)


def test_refusal_message_shows_exact_remaining(ledger_at: LedgerAt) -> None:
    with ledger_at("l.db", {ALICE: Cost(0.8, 1e-5)}) as ledger:
        spend(ledger, Cost(0.5))
        assert ledger.status(ALICE).remaining == Cost(0.3, 1e-5)  # 0.8 - 0.5 in floats is not 0.3
        with pytest.raises(BudgetExceeded) as exc:
            spend(ledger, Cost(0.5))
        assert exc.value.message == ("privacy budget exceeded for analyst alice: query costs "
                                     "ε=0.5, δ=0; remaining ε=0.3, δ=1e-05")
        assert exc.value.hint == ("lower the query's epsilon (SET dpproxy.epsilon = …) or ask "
                                  "an admin to grant more budget")
        spend(ledger, Cost(0.3))  # exactly what remains still fits
        assert ledger.status(ALICE).remaining == Cost(0.0, 1e-5)


# -- multi-account ----------------------------------------------------------------------------

def test_charge_touching_two_accounts_needs_both(ledger_at: LedgerAt) -> None:
    budgets = {ALICE: Cost(1.0, 1e-6), ADULT: Cost(0.5, 1e-6), "analyst:bob": Cost(0.3)}
    with ledger_at("l.db", budgets) as ledger:
        c = ledger.charge([ALICE, ADULT], Cost(0.4), analyst="alice", statement="q1")
        assert c.accounts == (ALICE, ADULT) and len(c.charge_id) == 32
        # the table cannot pay 0.4 more: nothing is written to alice either
        with pytest.raises(BudgetExceeded) as exc:
            ledger.charge([ALICE, ADULT], Cost(0.4), analyst="alice", statement="q2")
        assert "for table adult:" in exc.value.message and "alice" not in exc.value.message
        assert "remaining ε=0.1, δ=1e-06" in exc.value.message
        assert ledger.status(ALICE).spent == Cost(0.4)
        assert ledger.status(ADULT).spent == Cost(0.4)
        # the analyst cannot pay: nothing is written to the table
        with pytest.raises(BudgetExceeded) as exc:
            ledger.charge(["analyst:bob", ADULT], Cost(0.5, 0.0), analyst="bob", statement="q3")
        assert "analyst bob and table adult" in exc.value.message
        with pytest.raises(BudgetExceeded):
            ledger.charge(["analyst:bob", ADULT], Cost(0.31), analyst="bob", statement="q4")
        assert ledger.status(ADULT).spent == Cost(0.4)
        assert ledger.status("analyst:bob").spent == Cost(0.0)
        assert [h.statement for h in ledger.history()] == ["q1"]
        assert ledger.history("analyst:bob") == []
        # an unknown account among known ones: refused, nothing written
        with pytest.raises(UndefinedObject):
            ledger.charge([ALICE, "table:nope"], Cost(0.1), analyst="alice", statement="q5")
        assert ledger.status(ALICE).spent == Cost(0.4)
        assert len(ledger.history()) == 1


def test_duplicate_accounts_are_charged_once(ledger_at: LedgerAt) -> None:
    with ledger_at("l.db", {ALICE: Cost(1.0)}) as ledger:
        c = ledger.charge([ALICE, ALICE], Cost(0.25), analyst="alice", statement="q")
        assert c.accounts == (ALICE,)
        assert ledger.status(ALICE).spent == Cost(0.25)


def test_history_is_newest_first_and_filtered(ledger_at: LedgerAt) -> None:
    budgets = {ALICE: Cost(1.0, 1e-6), ADULT: Cost(1.0, 1e-6), "analyst:bob": Cost(1.0)}
    with ledger_at("l.db", budgets) as ledger:
        ledger.charge([ALICE, ADULT], Cost(0.1, 1e-9), analyst="alice", statement="a1")
        ledger.charge(["analyst:bob", ADULT], Cost(0.2), analyst="bob", statement="b1")
        ledger.charge([ALICE], Cost(0.3), analyst="alice", statement="a2")
        assert [h.statement for h in ledger.history()] == ["a2", "b1", "a1"]
        assert [h.statement for h in ledger.history(ALICE)] == ["a2", "a1"]
        assert [h.statement for h in ledger.history(ADULT, limit=1)] == ["b1"]
        first = ledger.history(ALICE)[-1]
        assert first.accounts == (ALICE, ADULT) and first.cost == Cost(0.1, 1e-9)
        assert first.analyst == "alice" and abs(first.at - time.time()) < 60
        assert [s.account for s in ledger.statuses()] == [ALICE, "analyst:bob", ADULT]
        assert ledger.status(ADULT).spent == Cost(0.3, 1e-9)  # 0.1 + 0.2, exactly


# -- concurrency ------------------------------------------------------------------------------

N = 25
RACE_BUDGET = Cost(2.5, 2.5e-6)  # fits exactly N charges of RACE_COST
RACE_COST = Cost(0.1, 1e-7)


def _race(ledger_at: LedgerAt, own_ledger: bool) -> None:
    budgets = {ALICE: RACE_BUDGET, ADULT: Cost(100.0, 0.5)}
    shared = ledger_at("race.db", budgets)
    barrier = threading.Barrier(8)
    ok: list[int] = []
    refused: list[int] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            ledger = ledger_at("race.db", budgets) if own_ledger else shared
            barrier.wait(timeout=30)
            for _ in range(8):
                try:
                    ledger.charge([ADULT, ALICE], RACE_COST, analyst="alice", statement="q")
                    ok.append(1)
                except BudgetExceeded:
                    refused.append(1)
            if own_ledger:
                ledger.close()
        except BaseException as e:
            errors.append(e)
            barrier.abort()  # a thread that fails early must not leave the others waiting

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert (len(ok), len(refused)) == (N, 64 - N)
    st = shared.status(ALICE)
    assert st.spent == RACE_BUDGET and st.remaining == Cost(0.0, 0.0)
    assert shared.status(ADULT).spent == Cost(2.5, 2.5e-6)
    assert len(shared.history(ALICE, limit=1000)) == N
    shared.close()


def test_threads_with_their_own_ledgers_spend_exactly_the_budget(ledger_at: LedgerAt) -> None:
    _race(ledger_at, own_ledger=True)


def test_threads_sharing_one_ledger_spend_exactly_the_budget(ledger_at: LedgerAt) -> None:
    _race(ledger_at, own_ledger=False)


def test_concurrent_creation_of_a_fresh_file(ledger_at: LedgerAt) -> None:
    name = "fresh.db"
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=30)
            ledger_at(name, {ALICE: Cost(1.0)}).close()
        except BaseException as e:
            errors.append(e)
            barrier.abort()  # a thread that fails early must not leave the others waiting

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    with ledger_at(name, {}) as ledger:
        assert [e.action for e in ledger.admin_history()] == ["create"]  # created once


_CHILD = """
import os, sys, time
sys.path.insert(0, {repo!r})
from dpproxy.accountant import Cost, Ledger
from dpproxy.errors import BudgetExceeded
ledger = Ledger({path!r}, {{}})
print("ready", flush=True)
while not os.path.exists({go!r}):
    time.sleep(0.005)
ok = 0
for _ in range(15):
    try:
        ledger.charge(["analyst:alice"], Cost(0.1, 1e-7), analyst="alice", statement="q")
        ok += 1
    except BudgetExceeded:
        pass
ledger.close()
print(ok, flush=True)
"""


def test_processes_spend_exactly_the_budget(tmp_path: Path) -> None:
    path, go = str(tmp_path / "race.db"), str(tmp_path / "go")
    Ledger(path, {ALICE: RACE_BUDGET}).close()
    code = _CHILD.format(repo=REPO, path=path, go=go)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        Path(go).touch()
        counts = [int(p.communicate(timeout=60)[0].strip()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    assert sum(counts) == N
    with Ledger(path, {}) as ledger:
        assert ledger.status(ALICE).spent == RACE_BUDGET
        assert len(ledger.history(limit=1000)) == N


# -- durability -------------------------------------------------------------------------------

_CRASH = """
import sys, time
sys.path.insert(0, {repo!r})
from dpproxy.accountant import Cost, Ledger
ledger = Ledger({path!r}, {{"analyst:alice": Cost(1.0, 1e-5)}})
c = ledger.charge(["analyst:alice"], Cost(0.7, 1e-6), analyst="alice", statement="SELECT 1")
print("CHARGED", c.charge_id, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_charge_survives_a_killed_process(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    p = subprocess.Popen([sys.executable, "-c", _CRASH.format(repo=REPO, path=path)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        marker, charge_id = p.stdout.readline().split()
        assert marker == "CHARGED"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL
    with Ledger(path, {ALICE: Cost(1.0, 1e-5)}) as ledger:
        assert ledger.status(ALICE).spent == Cost(0.7, 1e-6)
        assert [c.charge_id for c in ledger.history(ALICE)] == [charge_id]
        with pytest.raises(BudgetExceeded):
            spend(ledger, Cost(0.31))


def test_reopening_keeps_spent_and_ignores_changed_policy_budget(ledger_at: LedgerAt) -> None:
    name = "l.db"
    with ledger_at(name, {ALICE: Cost(1.0)}) as ledger:
        spend(ledger, Cost(0.6))
    with ledger_at(name, {ALICE: Cost(5.0, 1e-3), ADULT: Cost(2.0)}) as ledger:
        st = ledger.status(ALICE)
        assert (st.budget, st.spent) == (Cost(1.0), Cost(0.6))  # the ledger wins
        assert ledger.status(ADULT).budget == Cost(2.0)  # new in the policy: created
        with pytest.raises(BudgetExceeded):
            spend(ledger, Cost(0.5))
        events = ledger.admin_history()
        assert [(e.account, e.action, e.by) for e in events] == [
            (ADULT, "create", "policy"), (ALICE, "create", "policy")]


def test_grant_and_set_budget_are_admin_events(ledger_at: LedgerAt) -> None:
    name = "l.db"
    with ledger_at(name, {ALICE: Cost(1.0, 1e-6)}) as ledger:
        for _ in range(10):
            spend(ledger, Cost(0.1))
        with pytest.raises(BudgetExceeded):
            spend(ledger, Cost(0.1))
        st = ledger.grant(ALICE, Cost(0.2, 1e-6), by="admin:root")
        assert st.budget == Cost(1.2, 2e-6) and st.remaining == Cost(0.2, 2e-6)
        spend(ledger, Cost(0.1))
        st = ledger.set_budget(ALICE, Cost(0.5), by="admin:root")
        assert st.budget == Cost(0.5) and st.spent == Cost(1.1)
        assert st.remaining == Cost(0.0, 0.0)  # never negative
        with pytest.raises(BudgetExceeded):
            spend(ledger, Cost(0.0))  # spent already exceeds the lowered budget
        st = ledger.set_budget(ALICE, Cost(3.0, 1e-5), by="admin:ops")
        assert st.remaining == Cost(1.9, 1e-5)
        events = ledger.admin_history(ALICE)
        assert [(e.action, e.by, e.amount) for e in events] == [
            ("set_budget", "admin:ops", Cost(3.0, 1e-5)),
            ("set_budget", "admin:root", Cost(0.5)),
            ("grant", "admin:root", Cost(0.2, 1e-6)),
            ("create", "policy", Cost(1.0, 1e-6)),
        ]
        db = ledger._db  # stored as exact decimal text, in SQLite and PostgreSQL alike
        rows = db.execute("SELECT action, epsilon, delta FROM admin_events ORDER BY event_id")
        assert [tuple(r) for r in rows.fetchall()] == [
            ("create", "1.0", "0.000001"), ("grant", "0.2", "0.000001"),
            ("set_budget", "0.5", "0.0"), ("set_budget", "3.0", "0.00001")]
        row = db.execute("SELECT budget_epsilon, spent_epsilon FROM accounts").fetchone()
        assert tuple(row) == ("3.0", "1.1")


def test_set_budget_may_keep_delta(ledger_at: LedgerAt) -> None:
    """Replacing only ε keeps the δ budget: a δ of 0 would leave an analyst who had spent
    any δ unable to run even a pure-ε query, and the refusal says why."""
    with ledger_at("keep.db", {ALICE: Cost(1.0, 1e-5)}) as ledger:
        spend(ledger, Cost(0.1, 4e-7))
        st = ledger.set_budget(ALICE, Cost(50.0), by="admin:root", keep_delta=True)
        assert st.budget == Cost(50.0, 1e-5)
        spend(ledger, Cost(0.1))  # a pure-ε query still runs
        assert ledger.admin_history(ALICE)[0].amount == Cost(50.0, 1e-5)
        ledger.set_budget(ALICE, Cost(50.0), by="admin:root")  # δ set to 0, below spent
        with pytest.raises(BudgetExceeded, match="δ already spent exceeds the δ budget"):
            spend(ledger, Cost(0.1))


def test_set_budget_keeps_delta_exactly_as_stored(tmp_path: Path) -> None:
    """Not through a float, which rounded 0.29999999999999999 up to 0.3: budget out of
    rounding (a review found)."""
    path = tmp_path / "exact.db"
    with Ledger(path, {ALICE: Cost(1.0, 0.2)}) as ledger:
        ledger.grant(ALICE, Cost(0.0, 0.09999999999999999), by="admin:root")
        ledger.set_budget(ALICE, Cost(2.0), by="admin:root", keep_delta=True)
    with closing(sqlite3.connect(path)) as db:
        (delta,), = db.execute("SELECT budget_delta FROM accounts WHERE account = ?",
                               (ALICE,)).fetchall()
    assert Decimal(delta) == Decimal("0.29999999999999999")


def test_grants_cannot_add_up_to_infinity(ledger_at: LedgerAt) -> None:
    with ledger_at("inf.db", {ALICE: Cost(1.0)}) as ledger:
        ledger.grant(ALICE, Cost(1e308, 0.0), by="admin:root")
        with pytest.raises(InvalidParameterValue, match="beyond"):
            ledger.grant(ALICE, Cost(1e308, 0.0), by="admin:root")
        assert math.isfinite(ledger.status(ALICE).budget.epsilon)


# -- schema -----------------------------------------------------------------------------------

def test_schema_version_is_set_and_newer_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger(path, {ALICE: Cost(1.0)}).close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"accounts", "charges", "charge_accounts", "admin_events", "answers"} <= tables
    db.execute("PRAGMA user_version = 3")
    db.close()
    with pytest.raises(OperationalError, match="schema version 3, newer than the 2"):
        Ledger(path, {ALICE: Cost(1.0)})


def test_connection_settings_make_commits_durable(tmp_path: Path) -> None:
    # synchronous is per connection, so look at the ledger's own (a crash test cannot see it)
    with Ledger(tmp_path / "l.db", {}) as ledger:
        db = ledger._db
        assert db is not None
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[tuple[str, str]]:
    """(admin DSN, a schema name that does not exist yet); the schema is dropped after."""
    schema = f"dpproxy_test_{secrets.token_hex(6)}"
    yield pg_dsn, schema
    with psycopg.connect(pg_dsn, autocommit=True) as con:
        con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_postgres_schema_is_versioned_and_newer_versions_are_refused(
        pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    with Ledger(PostgresStorage(dsn, schema), {ALICE: Cost(1.0)}) as ledger:
        db = ledger._db
        assert db.execute("SHOW synchronous_commit").fetchone()[0] == "on"  # durable commits
        assert db.execute("SELECT current_schema()").fetchone()[0] == schema
    with psycopg.connect(dsn, autocommit=True) as con:
        tables = {r[0] for r in con.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
        assert {"accounts", "charges", "charge_accounts", "admin_events", "answers",
                "dpproxy_ledger_meta"} <= tables
        assert con.execute(f'SELECT version FROM "{schema}".dpproxy_ledger_meta').fetchall() \
            == [(SCHEMA_VERSION,)]
        con.execute(f'UPDATE "{schema}".dpproxy_ledger_meta SET version = 3')
    with pytest.raises(OperationalError, match="schema version 3, newer than the 2"):
        Ledger(PostgresStorage(dsn, schema), {ALICE: Cost(1.0)})


def test_postgres_schema_with_other_tables_is_refused(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f'CREATE SCHEMA "{schema}"')
        con.execute(f'CREATE TABLE "{schema}".t (x int)')
    with pytest.raises(OperationalError, match="not a dpproxy ledger"):
        Ledger(PostgresStorage(dsn, schema), {})


def test_postgres_ledger_reconnects_after_a_lost_connection(pg_schema: tuple[str, str]) -> None:
    dsn, schema = pg_schema
    with Ledger(PostgresStorage(dsn, schema), {ALICE: Cost(1.0)}) as ledger:
        spend(ledger, Cost(0.25))
        pid = ledger._db.execute("SELECT pg_backend_pid()").fetchone()[0]
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(OperationalError):  # the statement in flight fails, nothing more
            ledger.status(ALICE)
        spend(ledger, Cost(0.25))  # a new connection
        assert ledger.status(ALICE).spent == Cost(0.5)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(OperationalError, match="not a dpproxy ledger"):
        Ledger(path, {})


# -- validation -------------------------------------------------------------------------------

BAD_COSTS = [Cost(-0.1), Cost(float("nan")), Cost(float("inf")), Cost(0.1, 1.0),
             Cost(0.1, -1e-9), Cost(0.1, float("nan")), Cost(True), Cost("0.1")]  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", BAD_COSTS, ids=repr)
def test_bad_costs_are_refused(tmp_path: Path, bad: Cost) -> None:
    with pytest.raises(InvalidParameterValue) as exc:
        Ledger(tmp_path / "a.db", {ALICE: bad})
    assert exc.value.sqlstate == "22023"
    with Ledger(tmp_path / "b.db", {ALICE: Cost(1.0)}) as ledger:
        for call in (lambda: spend(ledger, bad), lambda: ledger.grant(ALICE, bad, by="root"),
                     lambda: ledger.set_budget(ALICE, bad, by="root")):
            with pytest.raises(InvalidParameterValue):
                call()
        assert ledger.status(ALICE).budget == Cost(1.0)
        assert ledger.history() == [] and len(ledger.admin_history()) == 1


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db", {ALICE: Cost(1.0, 0.5)}) as ledger:
        for accounts in (ALICE, [], [""]):  # a bare string is a sequence of characters
            with pytest.raises(InvalidParameterValue):
                ledger.charge(accounts, Cost(0.1), analyst="alice", statement="q")
        with pytest.raises(InvalidParameterValue):
            ledger.charge([ALICE], Cost(0.1), analyst="", statement="q")
        with pytest.raises(InvalidParameterValue):
            ledger.history(limit=-1)
        with pytest.raises(InvalidParameterValue, match="must stay < 1"):
            ledger.grant(ALICE, Cost(0.0, 0.5), by="root")
        assert ledger.status(ALICE).budget == Cost(1.0, 0.5)
        assert ledger.history() == []


def test_unknown_account_names_it_and_the_known_ones(ledger_at: LedgerAt) -> None:
    with ledger_at("l.db", {ALICE: Cost(1.0), ADULT: Cost(1.0)}) as ledger:
        for call in (lambda: ledger.status("analyst:bob"),
                     lambda: ledger.charge(["analyst:bob"], Cost(0.1), analyst="bob",
                                           statement="q"),
                     lambda: ledger.grant("analyst:bob", Cost(1.0), by="root"),
                     lambda: ledger.set_budget("analyst:bob", Cost(1.0), by="root"),
                     lambda: ledger.history("analyst:bob")):
            with pytest.raises(UndefinedObject) as exc:
                call()
            assert exc.value.sqlstate == "42704"
            assert "'analyst:bob'" in exc.value.message
            assert "analyst:alice, table:adult" in exc.value.message
        assert ledger.history() == [] and len(ledger.admin_history()) == 2


def test_closed_ledger_refuses_use(ledger_at: LedgerAt) -> None:
    with ledger_at("l.db", {ALICE: Cost(1.0)}) as ledger:
        pass
    with pytest.raises(InterfaceError):
        ledger.status(ALICE)
    ledger.close()  # idempotent


# -- zCDP accounting, windows, reset, answer claims (issue: privacy core) ---------------------

def _gaussian_loss(sigma: float, epsilon: float = 0.1, delta: float = 1e-8) -> Loss:
    return Loss(epsilon, delta, rho=1 / (2 * sigma ** 2), zcdp_delta=0.0)


def test_zcdp_buys_the_published_number_of_gaussian_queries(ledger_at: LedgerAt) -> None:
    """100 Gaussian releases at σ = 45.31 (Δ = 1) are (1.0, 1e-6)-DP under CKS20; at σ = 50,
    (0.90, 1e-6). Basic composition of the same releases' (ε, δ) would need far more."""
    with ledger_at("z.db", {ALICE: Cost(1.0, 1e-6)}, accounting="zcdp") as ledger:
        for _ in range(100):
            ledger.charge([ALICE], _gaussian_loss(45.4), analyst="alice", statement="q")
        status = ledger.status(ALICE)
        assert 0.99 < status.spent.epsilon <= 1.0
        with pytest.raises(BudgetExceeded):
            ledger.charge([ALICE], _gaussian_loss(45.4), analyst="alice", statement="q")
    with ledger_at("z50.db", {ALICE: Cost(1.0, 1e-6)}, accounting="zcdp") as ledger:
        for _ in range(100):
            ledger.charge([ALICE], _gaussian_loss(50.0), analyst="alice", statement="q")
        assert abs(ledger.status(ALICE).spent.epsilon - 0.90) < 0.005
        assert abs(ledger.status(ALICE).rho - 100 / (2 * 50.0 ** 2)) < 1e-12


def test_zcdp_counts_pure_epsilon_as_half_its_square_and_outside_delta(ledger_at: LedgerAt) -> None:
    with ledger_at("z.db", {ALICE: Cost(1.0, 1e-5)}, accounting="zcdp") as ledger:
        ledger.charge([ALICE], Loss(0.1, 4e-6, zcdp_delta=4e-6), analyst="a", statement="q")
        status = ledger.status(ALICE)
        assert status.rho == pytest.approx(0.1 ** 2 / 2)
        assert status.spent.delta == pytest.approx(4e-6)
        # the outside δ leaves 6e-6 for the conversion
        assert status.spent.epsilon == pytest.approx(zcdp_epsilon(0.005, 6e-6))
        with pytest.raises(BudgetExceeded):  # outside δ would reach the whole δ budget
            ledger.charge([ALICE], Loss(0.01, 6e-6, zcdp_delta=6e-6), analyst="a",
                          statement="q")


def test_basic_accounting_ignores_rho(ledger_at: LedgerAt) -> None:
    with ledger_at("b.db", {ALICE: Cost(1.0, 1e-6)}) as ledger:
        for _ in range(10):
            ledger.charge([ALICE], _gaussian_loss(45.0, 0.1, 1e-7), analyst="a", statement="q")
        with pytest.raises(BudgetExceeded):
            ledger.charge([ALICE], _gaussian_loss(45.0, 0.1, 1e-7), analyst="a", statement="q")


def test_version_1_ledger_is_migrated_with_conservative_zcdp_sums(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE accounts (account TEXT PRIMARY KEY, budget_epsilon TEXT NOT NULL,
            budget_delta TEXT NOT NULL, spent_epsilon TEXT NOT NULL DEFAULT '0',
            spent_delta TEXT NOT NULL DEFAULT '0');
        CREATE TABLE charges (charge_id TEXT PRIMARY KEY, at REAL NOT NULL, analyst TEXT NOT NULL,
            statement TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL);
        CREATE TABLE charge_accounts (charge_id TEXT NOT NULL, account TEXT NOT NULL,
            PRIMARY KEY (charge_id, account));
        CREATE TABLE admin_events (event_id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL,
            by TEXT NOT NULL, account TEXT NOT NULL, action TEXT NOT NULL, epsilon TEXT NOT NULL,
            delta TEXT NOT NULL);
        INSERT INTO accounts VALUES ('analyst:alice', '2.0', '0.00001', '0.5', '0.000001');
        INSERT INTO charges VALUES ('c1', 1.0, 'alice', 'q', '0.3', '0.000001');
        INSERT INTO charges VALUES ('c2', 2.0, 'alice', 'q', '0.2', '0');
        INSERT INTO charge_accounts VALUES ('c1', 'analyst:alice'), ('c2', 'analyst:alice');
        PRAGMA user_version = 1;
    """)
    db.close()
    with Ledger(path, {ALICE: Cost(9.0)}) as ledger:
        status = ledger.status(ALICE)
        assert (status.budget, status.spent) == (Cost(2.0, 1e-5), Cost(0.5, 1e-6))
        assert status.rho == pytest.approx(0.3 ** 2 / 2 + 0.2 ** 2 / 2)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2


def test_budget_window_renews_spending(ledger_at: LedgerAt,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import dpproxy.accountant as accountant

    clock = [1_700_000_000.0]  # a Tuesday, 22:13 UTC
    monkeypatch.setattr(accountant.time, "time", lambda: clock[0])
    with ledger_at("w.db", {ALICE: Cost(1.0)}, window="daily") as ledger:
        for _ in range(10):
            ledger.charge([ALICE], Cost(0.1), analyst="a", statement="q")
        with pytest.raises(BudgetExceeded):
            ledger.charge([ALICE], Cost(0.1), analyst="a", statement="q")
        clock[0] += 2 * 3600  # past midnight UTC: a new day
        assert ledger.status(ALICE).spent == Cost(0.0, 0.0)
        ledger.charge([ALICE], Cost(0.1), analyst="a", statement="q")
        assert ledger.status(ALICE).spent == Cost(0.1, 0.0)
        assert [e.action for e in ledger.admin_history(ALICE)][:1] == ["renew"]
        assert len(ledger.history(ALICE)) == 11  # history is kept across windows


def test_a_ledger_is_used_with_one_budget_window(ledger_at: LedgerAt,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two proxies sharing a ledger with different windows overspent: the "daily" one's
    renewal zeroed the spending that the "never" one read as the lifetime total, so the
    analyst spent the lifetime budget twice. A ledger keeps the window it was first used
    with and refuses another; changing it is an admin's act, recorded."""
    import dpproxy.accountant as accountant

    clock = [1_700_000_000.0]
    monkeypatch.setattr(accountant.time, "time", lambda: clock[0])
    with ledger_at("one.db", {ALICE: Cost(1.0)}) as lifetime:
        lifetime.charge([ALICE], Cost(1.0), analyst="a", statement="q")
    with pytest.raises(OperationalError, match="budget_window = 'never'") as refused:
        ledger_at("one.db", {ALICE: Cost(1.0)}, window="daily")
    assert "dpproxy budget window" in (refused.value.hint or "")
    with ledger_at("one.db", {ALICE: Cost(1.0)}) as lifetime:  # the same window: opens
        assert lifetime.status(ALICE).spent == Cost(1.0, 0.0)
    with ledger_at("one.db", {ALICE: Cost(1.0)}, window="daily",
                   adopt_window_by="admin") as daily:
        assert daily.admin_history("ledger")[0].action == "budget_window never -> daily"
    with ledger_at("one.db", {ALICE: Cost(1.0)}, window="daily") as daily:
        assert daily.window == "daily"
    with pytest.raises(OperationalError, match="budget_window = 'daily'"):
        ledger_at("one.db", {ALICE: Cost(1.0)})


@pytest.mark.parametrize("accounting", ["basic", "zcdp"])
def test_a_charge_returns_each_account_as_it_left_it(
        ledger_at: LedgerAt, accounting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The statuses a charge returns (read in its own transaction, so a session needs no
    second read for the budget left) are what `status` reads right after it, through a
    window's renewal too."""
    import dpproxy.accountant as accountant

    clock = [1_700_000_000.0]
    monkeypatch.setattr(accountant.time, "time", lambda: clock[0])
    budgets = {ALICE: Cost(3.0, 1e-5), ADULT: Cost(2.0, 1e-5)}
    with ledger_at("s.db", budgets, accounting=accounting, window="daily") as ledger:
        for step, loss in enumerate([Loss(0.25, 1e-7), Loss(0.5, 1e-6, rho=0.02),
                                     Loss(0.125, 0.0, rho=0.01, zcdp_delta=0.0)]):
            if step == 2:
                clock[0] += 2 * 3600  # past midnight: the charge renews both windows
            charge = ledger.charge([ALICE, ADULT], loss, analyst="alice", statement="q")
            assert [s.account for s in charge.statuses] == [ALICE, ADULT]
            for account in (ALICE, ADULT):
                assert charge.status(account) == ledger.status(account)
            assert charge.status("analyst:bob") is None
        assert charge.status(ALICE).spent.epsilon == pytest.approx(  # type: ignore[union-attr]
            0.125 if accounting == "basic" else zcdp_epsilon(0.01, 1e-5))
        # a refused charge returns nothing and leaves no transaction open
        with pytest.raises(BudgetExceeded):
            ledger.charge([ALICE], Cost(5.0), analyst="alice", statement="q")
        assert ledger.charge([ALICE], Cost(0.5), analyst="alice",
                             statement="q").status(ALICE) == ledger.status(ALICE)


def test_window_starts() -> None:
    from dpproxy.accountant import window_start_at

    t = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC, a Tuesday
    assert window_start_at(t, "daily") == 1_699_920_000.0  # 2023-11-14 00:00
    assert window_start_at(t, "weekly") == 1_699_833_600.0  # Monday 2023-11-13
    assert window_start_at(t, "monthly") == 1_698_796_800.0  # 2023-11-01


def test_reset_forgets_spending_and_is_recorded(ledger_at: LedgerAt) -> None:
    with ledger_at("r.db", {ALICE: Cost(1.0)}) as ledger:
        ledger.charge([ALICE], Cost(0.7), analyst="a", statement="q")
        status = ledger.reset(ALICE, by="admin")
        assert status.spent == Cost(0.0, 0.0) and status.remaining == Cost(1.0, 0.0)
        event = ledger.admin_history(ALICE)[0]
        assert (event.by, event.action, event.amount) == ("admin", "reset", Cost(0.7, 0.0))


def test_claimed_answer_is_charged_once(ledger_at: LedgerAt) -> None:
    with ledger_at("c.db", {ALICE: Cost(1.0)}) as ledger:
        charge = ledger.charge([ALICE], Cost(0.5), analyst="alice", statement="q", claim="k")
        with pytest.raises(AnswerAvailable) as pending:
            ledger.charge([ALICE], Cost(0.5), analyst="alice", statement="q", claim="k")
        assert pending.value.answer is None
        ledger.store_answer("alice", "k", charge.charge_id, '{"rows": [[1]]}')
        with pytest.raises(AnswerAvailable) as cached:
            ledger.charge([ALICE], Cost(0.5), analyst="alice", statement="q", claim="k")
        assert cached.value.answer == '{"rows": [[1]]}'
        assert ledger.status(ALICE).spent == Cost(0.5, 0.0)
        found = ledger.lookup_answer("alice", "k")
        assert found is not None and found.answer == '{"rows": [[1]]}'
        assert ledger.lookup_answer("bob", "k") is None  # answers are per analyst


def test_a_stored_answer_is_read_with_the_budget_status(ledger_at: LedgerAt) -> None:
    """A repeat reads its answer and the analyst's budget in one transaction."""
    with ledger_at("c.db", {ALICE: Cost(1.0)}) as ledger:
        charge = ledger.charge([ALICE], Cost(0.25), analyst="alice", statement="q", claim="k")
        pending = ledger.lookup_answer("alice", "k", status_of=ALICE)
        assert pending is not None and pending.answer is None and pending.status is None
        ledger.store_answer("alice", "k", charge.charge_id, "[1]")
        ledger.charge([ALICE], Cost(0.5), analyst="alice", statement="q2")
        found = ledger.lookup_answer("alice", "k", status_of=ALICE)
        assert found is not None and found.answer == "[1]"
        assert found.status == ledger.status(ALICE) and found.status.spent == Cost(0.75)
        plain = ledger.lookup_answer("alice", "k")
        assert plain is not None and plain.status is None and plain == found
        with pytest.raises(UndefinedObject):
            ledger.lookup_answer("alice", "k", status_of="analyst:nobody")


def test_dropped_claim_can_be_charged_again(ledger_at: LedgerAt) -> None:
    with ledger_at("d.db", {ALICE: Cost(1.0)}) as ledger:
        charge = ledger.charge([ALICE], Cost(0.25), analyst="alice", statement="q", claim="k")
        ledger.drop_claim("alice", "k", charge.charge_id)
        ledger.charge([ALICE], Cost(0.25), analyst="alice", statement="q", claim="k")
        assert ledger.status(ALICE).spent == Cost(0.5, 0.0)


def test_32_threads_release_exactly_the_budget(ledger_at: LedgerAt) -> None:
    """32 threads, each with its own Ledger, race for a budget that fits exactly 40 charges."""
    name = "t.db"
    ledger_at(name, {ALICE: Cost(4.0)}).close()
    wins: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(32, timeout=30)

    def worker() -> None:
        with ledger_at(name, {ALICE: Cost(4.0)}) as ledger:
            barrier.wait()
            for _ in range(4):
                try:
                    ledger.charge([ALICE], Cost(0.1), analyst="alice", statement="q")
                except BudgetExceeded:
                    continue
                with lock:
                    wins.append(1)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(wins) == 40
    with ledger_at(name, {ALICE: Cost(4.0)}) as ledger:
        assert ledger.status(ALICE).spent == Cost(4.0, 0.0)


# -- writers across processes wait on an OS lock, answers ride the charges' commits ---------

def _lock_is_free(path: Path) -> bool:
    """Whether another open file description can take the ledger's writer lock now."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_writer_lock_is_held_exactly_during_write_transactions(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    seen: list[bool] = []
    with Ledger(path, {ALICE: Cost(1.0)}) as ledger:
        assert _lock_is_free(path)
        # observed from inside a charge's transaction, then after it, after a refused
        # charge, after an answer stored and after an admin write
        ledger._batched(lambda db: seen.append(_lock_is_free(path)))
        assert seen == [False]
        charge = ledger.charge([ALICE], Cost(0.5), analyst="alice", statement="q", claim="k")
        assert _lock_is_free(path)
        with pytest.raises(BudgetExceeded):
            spend(ledger, Cost(0.75))
        assert _lock_is_free(path)
        ledger.store_answer("alice", "k", charge.charge_id, "[1]")
        assert _lock_is_free(path)
        ledger.reset(ALICE, by="admin")
        assert _lock_is_free(path)
        found = ledger.lookup_answer("alice", "k")
        assert found is not None and found.answer == "[1]"


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_a_writer_waits_for_the_lock_then_writes(tmp_path: Path) -> None:
    """Another process's writer holds the lock: a charge waits for it rather than failing,
    and goes through once it is released."""
    import fcntl

    path = tmp_path / "w.db"
    Ledger(path, {ALICE: Cost(1.0)}).close()
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = threading.Event()

    def charge() -> None:
        with Ledger(path, {ALICE: Cost(1.0)}) as ledger:
            spend(ledger, Cost(0.25))
        done.set()

    thread = threading.Thread(target=charge)
    thread.start()
    try:
        assert not done.wait(0.3)  # still waiting on the lock held here
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    thread.join(timeout=30)
    assert done.is_set()
    with Ledger(path, {ALICE: Cost(1.0)}) as ledger:
        assert ledger.status(ALICE).spent == Cost(0.25, 0.0)


def test_answers_stored_among_concurrent_charges_are_all_kept(ledger_at: LedgerAt) -> None:
    """16 threads on one Ledger each charge with a claim and store its answer: answers share
    commits with other threads' charges, and every one is there afterwards."""
    with ledger_at("a.db", {ALICE: Cost(100.0)}) as ledger:
        barrier = threading.Barrier(16, timeout=30)

        def worker(n: int) -> None:
            barrier.wait()
            for i in range(10):
                key = f"k{n}-{i}"
                charge = ledger.charge([ALICE], Cost(0.5), analyst="alice",
                                       statement="q", claim=key)
                ledger.store_answer("alice", key, charge.charge_id, f"[{n}, {i}]")

        run_in_threads(worker, 16)
        for n in range(16):
            for i in range(10):
                found = ledger.lookup_answer("alice", f"k{n}-{i}")
                assert found is not None and found.answer == f"[{n}, {i}]"
        assert ledger.status(ALICE).spent == Cost(80.0, 0.0)
