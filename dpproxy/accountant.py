"""The privacy budget ledger: durable, atomic check-and-charge in SQLite or PostgreSQL.

A budget belongs to an *account* (``"analyst:alice"``, ``"table:adult"``). A query
charges a list of accounts in one transaction and runs only if every one can pay.

Arithmetic is exact decimal: every ε/δ enters as ``Decimal(repr(x))`` (the float's
shortest repr, i.e. the number the user typed) and is summed in Decimal and stored
as TEXT. A budget of 1.0 must buy exactly ten queries of ε = 0.1: with binary floats
0.1 summed ten times is 0.9999999999999999 (an eleventh query nearly fits) and with
exact binary rationals 10 * float(0.1) > 1.0 (the tenth is refused). Decimal of the
repr gives 0.1 * 10 == 1.0 exactly. Where a sum could ever need rounding (more than
50 digits) spent rounds up and budgets round down, so rounding never creates budget.

Accounting: every charge records its loss in two forms that compose — (ε, δ), summed
under basic composition, and (ρ, δ outside zCDP), where ρ adds up under zCDP (Gaussian
noise Δ²/2σ², pure-ε releases ε²/2) and the extra δ (partition selection's threshold) adds
to δ. Under ``accounting = "zcdp"`` an account can pay when the summed ρ converts (CKS20)
to at most its ε at its δ minus the extra δ. Budgets may renew daily, weekly or monthly
(UTC): spending then counts from the start of the current window.

Answer cache: a charge may claim a cache key in the same transaction, so two sessions
asking the same query cannot both pay and release two different noisy answers; the answer
is stored before it is returned (committed, but without waiting for its own fsync: see
`Ledger.store_answer`).

Group commit: on SQLite, charges made at the same time by the threads sharing a Ledger are
committed together: whichever thread takes the ledger's lock runs every queued charge in
one ``BEGIN IMMEDIATE … COMMIT`` (one fsync), each under its own savepoint so a refused
charge is rolled back alone, and every caller returns only after that COMMIT. Stored
answers join the same batches (a batch of answers alone commits without waiting for
fsync). Writers in other processes on the same file wait on an OS lock (flock) held for
each write transaction, which wakes them as soon as it is free, rather than in SQLite's
busy handler, which sleeps up to 100 ms between tries.

Storage: one Ledger class holds every rule; a small storage adapter says how to talk to
the database. `SQLiteStorage` (the default, one proxy): one connection per Ledger guarded
by a lock (threads), WAL, ``BEGIN IMMEDIATE`` and a busy timeout (other Ledgers and
processes on the file), ``synchronous=FULL`` so a charge is on disk before ``charge()``
returns. `PostgresStorage` (several proxies on one ledger): the same SQL (``?`` becomes
``%s``), a READ COMMITTED transaction that locks the charged account rows with ``SELECT …
FOR UPDATE`` in sorted order (and the claimed cache key with an advisory lock, taken
first), ``synchronous_commit=on``; the tables live in their own schema, created and
migrated under an advisory lock, versioned in ``dpproxy_ledger_meta``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Generic, Protocol, TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: SQLite's busy timeout alone
    fcntl = None  # type: ignore[assignment]

from .errors import (
    BudgetExceeded,
    InterfaceError,
    InvalidParameterValue,
    OperationalError,
    UndefinedObject,
)
from .mechanisms import zcdp_epsilon

T = TypeVar("T")
# "off" disables group commit and the fsync-free answer store, for A/B benchmarks.
FAST_COMMITS = os.environ.get("DPPROXY_LEDGER_FAST_COMMITS", "on").lower() != "off"

SCHEMA_VERSION = 2
ACCOUNTING = ("basic", "zcdp")
WINDOWS = ("never", "daily", "weekly", "monthly")
# A claimed answer that never arrived (its process died) is abandoned after this long.
STALE_CLAIM_S = 600.0

# Released answers by analyst and cache key; answer is NULL while the charge's query runs.
_ANSWERS = """
CREATE TABLE answers (
    analyst   TEXT NOT NULL,
    cache_key TEXT NOT NULL,
    charge_id TEXT NOT NULL,
    at        REAL NOT NULL,
    answer    TEXT,
    PRIMARY KEY (analyst, cache_key)
);
"""

_SCHEMA = """
CREATE TABLE accounts (
    account        TEXT PRIMARY KEY,
    budget_epsilon TEXT NOT NULL,
    budget_delta   TEXT NOT NULL,
    spent_epsilon  TEXT NOT NULL DEFAULT '0',
    spent_delta    TEXT NOT NULL DEFAULT '0',
    spent_rho        TEXT NOT NULL DEFAULT '0',
    spent_zcdp_delta TEXT NOT NULL DEFAULT '0',
    window_start     REAL
);
CREATE TABLE charges (
    charge_id TEXT PRIMARY KEY,
    at        REAL NOT NULL,
    analyst   TEXT NOT NULL,
    statement TEXT NOT NULL,
    epsilon   TEXT NOT NULL,
    delta     TEXT NOT NULL,
    rho        TEXT NOT NULL DEFAULT '0',
    zcdp_delta TEXT NOT NULL DEFAULT '0'
);
CREATE TABLE charge_accounts (
    charge_id TEXT NOT NULL REFERENCES charges (charge_id),
    account   TEXT NOT NULL REFERENCES accounts (account),
    PRIMARY KEY (charge_id, account)
);
CREATE INDEX charge_accounts_by_account ON charge_accounts (account);
CREATE TABLE admin_events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    at       REAL NOT NULL,
    by       TEXT NOT NULL,
    account  TEXT NOT NULL,
    action   TEXT NOT NULL,
    epsilon  TEXT NOT NULL,
    delta    TEXT NOT NULL
);
""" + "\n;" + _ANSWERS
# v1 -> v2: loss in zCDP form (v1 charges are taken as (ε, δ)-DP: ρ = ε²/2 plus δ outside),
# renewal windows, and the answer cache.
_MIGRATE_1_TO_2 = """
ALTER TABLE accounts ADD COLUMN spent_rho TEXT NOT NULL DEFAULT '0';
ALTER TABLE accounts ADD COLUMN spent_zcdp_delta TEXT NOT NULL DEFAULT '0';
ALTER TABLE accounts ADD COLUMN window_start REAL;
ALTER TABLE charges ADD COLUMN rho TEXT NOT NULL DEFAULT '0';
ALTER TABLE charges ADD COLUMN zcdp_delta TEXT NOT NULL DEFAULT '0';
""" + _ANSWERS

# The same tables in PostgreSQL: DOUBLE PRECISION times, identity columns for the order
# that SQLite's rowid gives, and the schema version in a table of its own.
_PG_SCHEMA = """
CREATE TABLE accounts (
    account        TEXT PRIMARY KEY,
    budget_epsilon TEXT NOT NULL,
    budget_delta   TEXT NOT NULL,
    spent_epsilon  TEXT NOT NULL DEFAULT '0',
    spent_delta    TEXT NOT NULL DEFAULT '0',
    spent_rho        TEXT NOT NULL DEFAULT '0',
    spent_zcdp_delta TEXT NOT NULL DEFAULT '0',
    window_start     DOUBLE PRECISION
);
CREATE TABLE charges (
    seq       BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    charge_id TEXT PRIMARY KEY,
    at        DOUBLE PRECISION NOT NULL,
    analyst   TEXT NOT NULL,
    statement TEXT NOT NULL,
    epsilon   TEXT NOT NULL,
    delta     TEXT NOT NULL,
    rho        TEXT NOT NULL DEFAULT '0',
    zcdp_delta TEXT NOT NULL DEFAULT '0'
);
CREATE TABLE charge_accounts (
    seq       BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    charge_id TEXT NOT NULL REFERENCES charges (charge_id),
    account   TEXT NOT NULL REFERENCES accounts (account),
    PRIMARY KEY (charge_id, account)
);
CREATE INDEX charge_accounts_by_account ON charge_accounts (account);
CREATE TABLE admin_events (
    event_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       DOUBLE PRECISION NOT NULL,
    "by"     TEXT NOT NULL,
    account  TEXT NOT NULL,
    action   TEXT NOT NULL,
    epsilon  TEXT NOT NULL,
    delta    TEXT NOT NULL
);
CREATE TABLE answers (
    analyst   TEXT NOT NULL,
    cache_key TEXT NOT NULL,
    charge_id TEXT NOT NULL,
    at        DOUBLE PRECISION NOT NULL,
    answer    TEXT,
    PRIMARY KEY (analyst, cache_key)
);
CREATE TABLE dpproxy_ledger_meta (version INTEGER NOT NULL);
"""

# Sums of repr'd floats are exact at 50 digits; the rounding mode only matters beyond.
_UP = decimal.Context(prec=50, rounding=decimal.ROUND_CEILING)
_DOWN = decimal.Context(prec=50, rounding=decimal.ROUND_FLOOR)
_ZERO = Decimal(0)
_HINT = "lower the query's epsilon (SET dpproxy.epsilon = …) or ask an admin to grant more budget"
_HINT_DELTA = ("lower the query's epsilon or delta (SET dpproxy.epsilon = … / SET dpproxy.delta"
               " = …) or ask an admin to grant more budget")


@dataclass(frozen=True)
class Cost:
    """A privacy cost (ε, δ); also used for budgets."""

    epsilon: float
    delta: float = 0.0


@dataclass(frozen=True)
class Loss:
    """What one release costs, in the forms that compose (see the module docstring)."""

    epsilon: float
    delta: float = 0.0
    rho: float | None = None  # None: ε²/2 (an ε-DP release is ε²/2-zCDP)
    zcdp_delta: float | None = None  # δ not covered by ρ; None: all of delta

    @classmethod
    def of(cls, cost: Cost | Loss) -> Loss:
        return cost if isinstance(cost, Loss) else cls(cost.epsilon, cost.delta)

    @property
    def zcdp(self) -> tuple[float, float]:
        rho = self.rho if self.rho is not None else self.epsilon ** 2 / 2
        return rho, self.zcdp_delta if self.zcdp_delta is not None else self.delta


class AnswerAvailable(Exception):
    """The query's answer is cached (or being computed): nothing was charged."""

    def __init__(self, answer: str | None) -> None:
        super().__init__("answer cached" if answer is not None else "answer pending")
        self.answer = answer  # None: another session is computing it now


@dataclass(frozen=True)
class CachedAnswer:
    answer: str | None  # None: claimed, not stored yet
    at: float
    charge_id: str
    # with `lookup_answer(…, status_of=account)` and a stored answer: that account's
    # status, read in the same transaction
    status: AccountStatus | None = field(default=None, compare=False)


class _CostLike(Protocol):  # Cost, or policy.Budget which has the same two fields
    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...


@dataclass(frozen=True)
class AccountStatus:
    """Budget and spending of one account. Under zCDP, `spent.epsilon` is the ε that the
    summed ρ converts to at the budget's δ (minus the δ spent outside zCDP), and
    `spent.delta` that outside δ."""

    account: str
    budget: Cost
    spent: Cost
    rho: float = 0.0  # summed zCDP ρ
    accounting: str = "basic"
    window_start: float | None = None  # when the current renewal window began

    @property
    def remaining(self) -> Cost:
        """budget − spent per component, computed in decimal, never negative."""
        return Cost(_num(_left(_dec(self.budget.epsilon), _dec(self.spent.epsilon))),
                    _num(_left(_dec(self.budget.delta), _dec(self.spent.delta))))


@dataclass(frozen=True)
class Charge:
    charge_id: str  # uuid4 hex
    accounts: tuple[str, ...]
    cost: Cost
    analyst: str
    statement: str  # normalized SQL of the query (never results)
    at: float  # unix time
    # from `Ledger.charge`: each charged account's status right after this charge
    statuses: tuple[AccountStatus, ...] = field(default=(), compare=False, repr=False)

    def status(self, account: str) -> AccountStatus | None:
        return next((s for s in self.statuses if s.account == account), None)


@dataclass(frozen=True)
class AdminEvent:
    at: float
    by: str
    account: str
    action: str  # "create" (from the policy), "grant", "set_budget", "reset" or "renew"
    amount: Cost  # the budget created or set, or the amount granted


@dataclass(frozen=True)
class HistoryEntry:
    """One line of an account's history: a charge or an admin event."""

    at: float  # unix time
    who: str  # the analyst charged, or who made the change
    what: str  # "charge", or the admin event's action
    accounts: str  # the accounts touched, comma-separated
    amount: Cost
    detail: str  # a charge's normalized SQL (never results)


def _dec(x: float) -> Decimal:
    return Decimal(repr(float(x) + 0.0))  # + 0.0 turns -0.0 into 0.0


def _num(d: Decimal) -> float:
    return float(d)


def _left(budget: Decimal, spent: Decimal) -> Decimal:
    """What remains, rounded down and never negative (a lowered budget may be below spent)."""
    d = _DOWN.subtract(budget, spent)
    return d if d > 0 else _ZERO


def _fmt(d: Decimal) -> str:
    s = repr(float(d))
    return s[:-2] if s.endswith(".0") else s


def _label(account: str) -> str:
    return account.replace(":", " ", 1)


def _check_cost(cost: _CostLike, what: str) -> tuple[Decimal, Decimal]:
    """Validate a cost or budget and return it as exact decimals."""
    values: list[Decimal] = []
    for name in ("epsilon", "delta"):
        x = getattr(cost, name, None)
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise InvalidParameterValue(f"{what} {name} must be a number, got {x!r}")
        if not math.isfinite(x) or x < 0:
            raise InvalidParameterValue(f"{what} {name} must be finite and >= 0, got {x!r}")
        values.append(_dec(x))
    if values[1] >= 1:
        raise InvalidParameterValue(f"{what} delta must be < 1, got {cost.delta!r}")
    return values[0], values[1]


def _set_wal(db: Any, timeout: float) -> None:
    """Switch to WAL. On a file that other connections are creating at the same moment,
    SQLite can answer "locked" here without waiting on the busy timeout: retry."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class _WriterLock:
    """An OS lock (flock) on the ledger file, held around each write transaction.

    SQLite's own lock is what keeps writers apart; this one only makes waiting cheap. A
    writer in another process (`dpproxy serve --workers N` shares one ledger) that finds
    SQLite's lock taken sleeps in SQLite's busy handler 1, 2, 5, … up to 100 ms between
    tries, and its whole group commit (every query it carries) waits that long, with the
    core idle; here it polls a lock held only for one commit, from 50 µs up to 1 ms
    apart. After `timeout` it goes on without it, to SQLite's busy timeout, whose error
    is the ledger's. Without flock (not POSIX) or on a file it cannot open, a no-op."""

    def __init__(self, path: str, timeout: float) -> None:
        self._path, self._timeout = path, timeout
        self._fd: int | None = None
        self._held = False

    def acquire(self) -> None:
        if fcntl is None:
            return
        if self._fd is None:
            try:
                self._fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:  # e.g. ":memory:": SQLite's lock alone
                return
        pause, deadline = 50e-6, None
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._held = True
                return
            except BlockingIOError:
                pass
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + self._timeout
            if now > deadline:
                return
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def release(self) -> None:
        if self._held:
            self._held = False
            assert fcntl is not None and self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _zcdp_spent_epsilon(rho: Decimal, outside_delta: Decimal, budget_delta: Decimal) -> float:
    """The ε that summed ρ converts to at the δ left after the δ spent outside zCDP."""
    if rho <= 0:
        return 0.0
    left = _num(budget_delta - outside_delta)
    if left <= 0:
        return math.inf
    return zcdp_epsilon(_num(rho), min(left, 0.999999))


def window_start_at(now: float, window: str) -> float:
    """Unix time at which the renewal window containing `now` began (UTC)."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0,
                                                         microsecond=0)
    if window == "weekly":
        day -= dt.timedelta(days=day.weekday())
    elif window == "monthly":
        day = day.replace(day=1)
    return day.timestamp()


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidParameterValue(f"{what} must be a non-empty string, got {value!r}")
    return value


class SQLiteStorage:
    """The ledger in one SQLite file (the default: one proxy, or processes on one host)."""

    kind = "sqlite"
    order = "rowid"  # insertion order of charges and their accounts

    def __init__(self, path: str | os.PathLike[str], timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.timeout = timeout
        self.errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        self._writer = _WriterLock(self.path, timeout)

    def connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN/COMMIT ourselves
            return sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as e:
            raise OperationalError(f"cannot open privacy ledger {self.path}: {e}") from None

    def configure(self, db: Any) -> None:
        db.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        _set_wal(db, self.timeout)
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA fullfsync = ON")  # macOS: fsync alone does not reach the disk
        db.execute("PRAGMA foreign_keys = ON")

    def usable(self, db: Any) -> bool:
        return True

    def close(self) -> None:
        """Release what the storage holds besides its connections (the writer lock)."""
        self._writer.close()

    # One connection per Ledger and one write lock per file: a batch of charges can
    # share a transaction without any risk of deadlock.
    group_commit = True

    def begin_write(self, db: Any) -> None:
        self._writer.acquire()
        try:
            db.execute("BEGIN IMMEDIATE")  # the file's write lock serializes every writer
        except BaseException:
            self._writer.release()
            raise

    def end_write(self, db: Any) -> None:
        """After the COMMIT or ROLLBACK of a transaction begun by `begin_write`."""
        self._writer.release()

    def begin_lazy_write(self, db: Any) -> None:
        """A write transaction whose COMMIT does not wait for fsync (WAL, synchronous
        NORMAL): it survives a killed process, and the next durable commit syncs it."""
        db.execute("PRAGMA synchronous = NORMAL")  # per connection, set outside transactions
        try:
            self.begin_write(db)
        except BaseException:
            db.execute("PRAGMA synchronous = FULL")
            raise

    def end_lazy_write(self, db: Any) -> None:
        self.end_write(db)
        db.execute("PRAGMA synchronous = FULL")

    def begin_read(self, db: Any) -> None:
        db.execute("BEGIN")

    def lock_accounts(self, db: Any, accounts: Sequence[str]) -> None:
        """Nothing to do: BEGIN IMMEDIATE already holds the whole file."""

    def lock_claim(self, db: Any, analyst: str, key: str) -> None:
        """Nothing to do: BEGIN IMMEDIATE already holds the whole file."""

    def prepare(self, db: Any) -> None:
        """Nothing to do: the file is the ledger."""

    def version(self, db: Any) -> int:
        return int(db.execute("PRAGMA user_version").fetchone()[0])

    def has_tables(self, db: Any) -> bool:
        return bool(db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])

    def create(self, db: Any) -> None:
        for stmt in _SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def set_version(self, db: Any, version: int) -> None:
        db.execute(f"PRAGMA user_version = {int(version)}")


class _PgConnection:
    """A psycopg connection (autocommit: we issue BEGIN/COMMIT) that takes the ledger's
    ``?`` placeholders; its ``execute`` returns a cursor like sqlite3's."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql.replace("?", "%s"), tuple(params) or None)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.conn.info.transaction_status != TransactionStatus.IDLE)

    def close(self) -> None:
        self.conn.close()


class PostgresStorage:
    """The ledger in a PostgreSQL schema, shared by several proxies."""

    kind = "postgresql"
    order = "seq"

    def __init__(self, dsn: str, schema: str = "dpproxy", *, password: str | None = None,
                 passfile: str | None = None, timeout: float = 30.0) -> None:
        import psycopg

        if not schema or '"' in schema or "\0" in schema:
            raise InvalidParameterValue(f"invalid ledger schema name {schema!r}")
        self.dsn, self.schema = dsn, schema
        self.timeout = timeout
        self._password, self._passfile = password, passfile
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        self.name = (f"postgresql://{info.get('host') or 'localhost'}:{info.get('port') or 5432}"
                     f"/{info.get('dbname') or info.get('user') or ''} schema {schema}")
        self.errors = (psycopg.Error,)

    def _quoted(self) -> str:
        return '"' + self.schema + '"'

    def connect(self) -> _PgConnection:
        import psycopg

        kwargs: dict[str, Any] = {"autocommit": True, "application_name": "dpproxy-ledger",
                                  "connect_timeout": max(1, int(self.timeout))}
        if self._password is not None:
            kwargs["password"] = self._password
        if self._passfile is not None:
            kwargs["passfile"] = self._passfile
        try:
            conn = psycopg.connect(self.dsn, **kwargs)
        except psycopg.Error as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise OperationalError(f"cannot open privacy ledger {self.name}: {first}") from None
        try:
            # the ledger's schema first; commits durable before charge() returns; lock
            # waits bounded like SQLite's busy timeout
            conn.execute(f"SET search_path = {self._quoted()}")
            conn.execute("SET synchronous_commit = on")
            conn.execute(f"SET lock_timeout = {int(self.timeout * 1000)}")
        except BaseException:
            conn.close()
            raise
        return _PgConnection(conn)

    def configure(self, db: Any) -> None:
        """Nothing to do: the session settings are set when connecting."""

    def usable(self, db: Any) -> bool:
        return not (db.conn.closed or db.conn.broken)

    def close(self) -> None:
        """Nothing besides the connections."""

    # Charges lock account rows in sorted order per charge; a batch of several charges
    # could lock them out of order against another proxy's batch and deadlock: one
    # charge per transaction.
    group_commit = False

    def begin_write(self, db: Any) -> None:
        db.execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def end_write(self, db: Any) -> None:
        """Nothing to do: the row locks ended with the transaction."""

    def begin_lazy_write(self, db: Any) -> None:
        """A write transaction whose COMMIT does not wait for the WAL flush."""
        db.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        db.execute("SET LOCAL synchronous_commit = off")

    def end_lazy_write(self, db: Any) -> None:
        """Nothing to do: SET LOCAL ended with the transaction."""

    def begin_read(self, db: Any) -> None:
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def lock_accounts(self, db: Any, accounts: Sequence[str]) -> None:
        """Lock the account rows one by one in sorted order (so charges never deadlock);
        reads after this see the latest committed spending."""
        for account in sorted(set(accounts)):
            db.execute("SELECT 1 FROM accounts WHERE account = ? FOR UPDATE", (account,))

    def lock_claim(self, db: Any, analyst: str, key: str) -> None:
        """Serialize charges claiming the same cache key (taken before any account lock)."""
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",
                   (f"dpproxy-claim/{self.schema}/{analyst}/{key}",))

    def prepare(self, db: Any) -> None:
        """Serialize schema creation between proxies starting together; create the schema."""
        db.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))",
                   (f"dpproxy-ledger/{self.schema}",))
        db.execute(f"CREATE SCHEMA IF NOT EXISTS {self._quoted()}")

    def version(self, db: Any) -> int:
        if db.execute("SELECT to_regclass(?)",
                      (f"{self._quoted()}.dpproxy_ledger_meta",)).fetchone()[0] is None:
            return 0
        row = db.execute("SELECT max(version) FROM dpproxy_ledger_meta").fetchone()
        return int(row[0] or 0)

    def has_tables(self, db: Any) -> bool:
        return bool(db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = ?",
                               (self.schema,)).fetchone()[0])

    def create(self, db: Any) -> None:
        for stmt in _PG_SCHEMA.split(";"):
            if stmt.strip():
                db.execute(stmt)
        db.execute("INSERT INTO dpproxy_ledger_meta (version) VALUES (?)", (SCHEMA_VERSION,))

    def set_version(self, db: Any, version: int) -> None:
        db.execute("UPDATE dpproxy_ledger_meta SET version = ?", (version,))


Storage = SQLiteStorage | PostgresStorage


class _Pending(Generic[T]):
    """One caller's work waiting for a group commit."""

    def __init__(self, work: Callable[[Any], T], durable: bool = True) -> None:
        self.work = work
        self.durable = durable  # False: may commit without waiting for fsync
        self.result: T | None = None
        self.error: BaseException | None = None
        self.done = False


class Ledger:
    """The budget ledger on one SQLite file or PostgreSQL schema; safe to share between
    threads.

    Several Ledgers (in threads, processes or, on PostgreSQL, hosts) may open the same
    storage; charges serialize through SQLite's write lock or PostgreSQL's row locks. Do
    not carry a Ledger across fork(): open a new one.
    """

    def __init__(self, path: str | os.PathLike[str] | Storage,
                 initial_budgets: Mapping[str, _CostLike], *, timeout: float = 30.0,
                 accounting: str = "basic", window: str = "never",
                 fast_commits: bool | None = None, adopt_window_by: str | None = None
                 ) -> None:
        """Open or create the ledger (a SQLite file at `path`, or the given storage);
        accounts missing from it are created with their policy budget (the policy is the
        initial state; an existing account's budget in the ledger is NOT overwritten by a
        changed policy). `fast_commits` (default on, unless the environment variable
        DPPROXY_LEDGER_FAST_COMMITS is "off"): group commit and fsync-free answers. The
        ledger keeps the budget window it is used with (`_settle_window`); a different
        one is refused, unless `adopt_window_by` names who changes it."""
        budgets = {_check_name(a, "account"): _check_cost(c, f"budget of {a}")
                   for a, c in initial_budgets.items()}
        if accounting not in ACCOUNTING:
            raise InvalidParameterValue(f"accounting must be one of {ACCOUNTING}, "
                                        f"got {accounting!r}")
        if window not in WINDOWS:
            raise InvalidParameterValue(f"budget window must be one of {WINDOWS}, got {window!r}")
        self.accounting = accounting
        self.window = window
        self._store: Storage = (path if isinstance(path, SQLiteStorage | PostgresStorage)
                                else SQLiteStorage(path, timeout))
        self._path = self._store.name
        self._lock = threading.RLock()
        self._fast = FAST_COMMITS if fast_commits is None else fast_commits
        self._queue: list[_Pending[Any]] = []  # charges waiting for the next group commit
        self._batches = threading.Condition()  # guards _queue, _committing and every done
        self._committing = False  # a thread is committing a batch
        self._pid = os.getpid()
        self._db: Any = None
        db = self._store.connect()
        self._db = db
        try:
            with self._sql():
                self._store.configure(db)
                with self._write():
                    self._store.prepare(db)
                    self._migrate()
                    self._settle_window(db, adopt_window_by)
                    self._create(db, budgets)
        except BaseException:
            db.close()
            self._db = None
            raise

    def add_accounts(self, initial_budgets: Mapping[str, _CostLike]) -> None:
        """Create the accounts missing from the ledger with these budgets, as opening it
        does (an analyst added to the policy while it is open); existing ones stay."""
        budgets = {_check_name(a, "account"): _check_cost(c, f"budget of {a}")
                   for a, c in initial_budgets.items()}
        with self._write() as db:
            self._create(db, budgets)

    def _create(self, db: Any, budgets: Mapping[str, tuple[Decimal, Decimal]]) -> None:
        now = time.time()
        for account, (eps, delta) in budgets.items():
            cur = db.execute("INSERT INTO accounts (account, budget_epsilon, budget_delta)"
                             " VALUES (?, ?, ?) ON CONFLICT (account) DO NOTHING",
                             (account, str(eps), str(delta)))
            if cur.rowcount:
                self._admin_event(now, "policy", account, "create", eps, delta)

    # -- plumbing ---------------------------------------------------------------------------

    @contextmanager
    def _sql(self) -> Iterator[Any]:
        """The connection, under the lock (a broken PostgreSQL connection is replaced);
        database errors become OperationalError."""
        with self._lock:
            if self._db is None:
                raise InterfaceError("the privacy ledger is closed")
            if os.getpid() != self._pid:
                raise InterfaceError("a Ledger cannot be used across fork(); open a new one")
            if not self._store.usable(self._db):
                self._db = self._store.connect()
            try:
                yield self._db
            except self._store.errors as e:
                raise self._ledger_error(e) from None

    def _ledger_error(self, exc: BaseException) -> BaseException:
        """A database error as OperationalError naming the ledger; any other as it is."""
        if isinstance(exc, self._store.errors):
            return OperationalError(f"privacy ledger {self._path}: {exc}")
        return exc

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A write transaction (SQLite: takes the file's write lock now); commits durably on
        success."""
        with self._sql() as db:
            self._store.begin_write(db)
            try:
                yield db
                db.execute("COMMIT")
            finally:
                if db.in_transaction:  # an error before or during COMMIT: write nothing
                    with suppress(*self._store.errors):
                        db.execute("ROLLBACK")
                self._store.end_write(db)

    def _batched(self, work: Callable[[Any], T], durable: bool = True) -> T:
        """Run `work(db)` in a durable write transaction, shared (group commit) with the
        work other threads queued meanwhile; its exception is raised here, and only its
        own writes are undone. Returns after the COMMIT that made its writes durable.
        Not `durable`: the COMMIT need not wait for fsync (`begin_lazy_write`) unless
        other work in the same batch is durable."""
        if not (self._fast and self._store.group_commit):
            with self._write() as db:
                return work(db)
        pending: _Pending[T] = _Pending(work, durable)
        with self._batches:
            self._queue.append(pending)
            # One thread commits at a time, everything queued by the time it holds the
            # connection; a caller whose work another thread committed returns as soon as
            # that batch is done, without queueing behind later batches for the lock.
            while self._committing and not pending.done:
                self._batches.wait()
            committer = not pending.done
            if committer:
                self._committing = True
        if committer:
            batch: list[_Pending[Any]] = []
            try:
                with self._sql() as db:
                    # taken once the connection is ours: what queued meanwhile joins in
                    with self._batches:
                        batch, self._queue = self._queue, []
                    self._commit_batch(db, batch)
            except BaseException as exc:
                # no connection (a closed ledger, a failed reconnect): no queued work ran,
                # and every caller is told so rather than left without a result
                with self._batches:
                    if not batch:
                        batch, self._queue = self._queue, []
                for queued in batch:
                    if not queued.done:
                        queued.error, queued.done = self._ledger_error(exc), True
                if not isinstance(exc, Exception):
                    raise
            finally:
                with self._batches:
                    self._committing = False
                    self._batches.notify_all()
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]

    def _commit_batch(self, db: Any, batch: list[_Pending[Any]]) -> None:
        begun = False
        durable = any(pending.durable for pending in batch)
        try:
            if durable:
                self._store.begin_write(db)
            else:
                self._store.begin_lazy_write(db)
            begun = True
            # a charge alone in its transaction is undone by undoing the transaction
            alone = len(batch) == 1
            for pending in batch:
                if not alone:
                    db.execute("SAVEPOINT dpproxy_charge")
                try:
                    pending.result = pending.work(db)
                except Exception as exc:  # this charge's own failure: undo it alone
                    pending.error = self._ledger_error(exc)
                    db.execute("ROLLBACK" if alone else "ROLLBACK TO SAVEPOINT dpproxy_charge")
                if not alone:
                    db.execute("RELEASE SAVEPOINT dpproxy_charge")
            if db.in_transaction:  # not after the rollback of a lone failed charge
                db.execute("COMMIT")
        except BaseException as exc:
            # Nothing of the batch is written: every caller gets an error, none a charge.
            failure = self._ledger_error(exc)
            for pending in batch:
                if pending.error is None:
                    pending.error, pending.result = failure, None
            if db.in_transaction:
                with suppress(*self._store.errors):
                    db.execute("ROLLBACK")
            if not isinstance(exc, Exception):
                raise
        finally:
            if begun and durable:
                self._store.end_write(db)
            elif begun:
                self._store.end_lazy_write(db)
            for pending in batch:
                pending.done = True

    @contextmanager
    def _read(self) -> Iterator[Any]:
        """A read transaction: one consistent snapshot across several SELECTs."""
        with self._sql() as db:
            self._store.begin_read(db)
            try:
                yield db
            finally:
                if db.in_transaction:
                    with suppress(*self._store.errors):
                        db.execute("ROLLBACK")

    def _migrate(self) -> None:
        assert self._db is not None
        version = self._store.version(self._db)
        if version > SCHEMA_VERSION:
            raise OperationalError(
                f"privacy ledger {self._path} has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this dpproxy knows", hint="upgrade dpproxy to open this ledger")
        if version == 0:
            if self._store.has_tables(self._db):
                what = "a SQLite file" if self._store.kind == "sqlite" else "a schema with tables"
                raise OperationalError(f"{self._path} is {what} but not a dpproxy ledger")
            self._store.create(self._db)
        elif version == 1:  # only SQLite ledgers were ever at version 1
            for stmt in _MIGRATE_1_TO_2.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            sums: dict[str, tuple[Decimal, Decimal]] = {}
            for cid, e, d in self._db.execute("SELECT charge_id, epsilon, delta FROM charges"):
                rho = _UP.multiply(_UP.multiply(Decimal(e), Decimal(e)), Decimal("0.5"))
                self._db.execute("UPDATE charges SET rho = ?, zcdp_delta = ? WHERE charge_id = ?",
                                 (str(rho), d, cid))
                for (account,) in self._db.execute(
                        "SELECT account FROM charge_accounts WHERE charge_id = ?", (cid,)):
                    r0, d0 = sums.get(account, (_ZERO, _ZERO))
                    sums[account] = (_UP.add(r0, rho), _UP.add(d0, Decimal(d)))
            for account, (rho, zd) in sums.items():
                self._db.execute("UPDATE accounts SET spent_rho = ?, spent_zcdp_delta = ?"
                                 " WHERE account = ?", (str(rho), str(zd), account))
            self._store.set_version(self._db, SCHEMA_VERSION)

    def _settle_window(self, db: Any, adopt_by: str | None) -> None:
        """Record the budget window on first use; refuse another one. Every user of a
        shared ledger must count spending alike: a "daily" proxy renewing an account
        zeroes the spending that a "never" proxy reads as the account's lifetime total
        (a review spent twice a lifetime budget so). `adopt_by`: change it, recorded."""
        db.execute("CREATE TABLE IF NOT EXISTS ledger_settings "
                   "(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = db.execute("SELECT value FROM ledger_settings WHERE name = 'budget_window'"
                         ).fetchone()
        if row is None:
            db.execute("INSERT INTO ledger_settings (name, value) VALUES ('budget_window', ?)",
                       (self.window,))
            return
        if row[0] == self.window:
            return
        if adopt_by is None:
            raise OperationalError(
                f"privacy ledger {self._path} counts spending with budget_window = "
                f"{row[0]!r}, the policy says {self.window!r}",
                hint="every proxy sharing a ledger needs the same [privacy] budget_window; to "
                     "change it, stop the other proxies and run `dpproxy budget window`")
        _check_name(adopt_by, "by")
        db.execute("UPDATE ledger_settings SET value = ? WHERE name = 'budget_window'",
                   (self.window,))
        self._admin_event(time.time(), adopt_by, "ledger",
                          f"budget_window {row[0]} -> {self.window}", _ZERO, _ZERO)

    def _admin_event(self, at: float, by: str, account: str, action: str, eps: Decimal,
                     delta: Decimal) -> None:
        assert self._db is not None
        self._db.execute("INSERT INTO admin_events (at, \"by\", account, action, epsilon, delta)"
                         " VALUES (?, ?, ?, ?, ?, ?)", (at, by, account, action, str(eps),
                                                        str(delta)))

    def _row(self, db: Any, account: str) -> tuple[Decimal, ...]:
        """(budget ε, budget δ, spent ε, spent δ, spent ρ, spent zCDP-outside δ), with spending
        before the current renewal window counted as zero."""
        return self._row_and_start(db, account)[0]

    def _row_and_start(self, db: Any, account: str) -> tuple[tuple[Decimal, ...], float | None]:
        """`_row` and the account's window_start, read in one SELECT."""
        row = db.execute("SELECT budget_epsilon, budget_delta, spent_epsilon, spent_delta,"
                         " spent_rho, spent_zcdp_delta, window_start FROM accounts"
                         " WHERE account = ?", (account,)).fetchone()
        if row is None:
            known = [r[0] for r in db.execute("SELECT account FROM accounts ORDER BY account"
                                              " LIMIT 21")]
            listed = ", ".join(known[:20]) + (", …" if len(known) > 20 else "")
            raise UndefinedObject(f"unknown privacy account {account!r}; known accounts: "
                                  f"{listed or '(none)'}")
        values = tuple(Decimal(v) for v in row[:6])
        if self._expired(row[6]):
            values = (*values[:2], _ZERO, _ZERO, _ZERO, _ZERO)
        return values, row[6]

    def _expired(self, window_start: float | None) -> bool:
        if self.window == "never":
            return False
        return window_start is None or window_start < window_start_at(time.time(), self.window)

    def _renew(self, db: Any, account: str, started: float | None) -> float | None:
        """Start a new window for the account if its current one (begun at `started`) has
        ended (write path); the window's start afterwards."""
        if self.window == "never" or not self._expired(started):
            return started
        now = window_start_at(time.time(), self.window)
        db.execute("UPDATE accounts SET spent_epsilon = '0', spent_delta = '0',"
                   " spent_rho = '0', spent_zcdp_delta = '0', window_start = ?"
                   " WHERE account = ?", (now, account))
        if started is not None:
            self._admin_event(time.time(), "window", account, "renew", _ZERO, _ZERO)
        return now

    def _status(self, db: Any, account: str) -> AccountStatus:
        values, started = self._row_and_start(db, account)
        return self._status_of(account, values, started)

    def _status_of(self, account: str, values: Sequence[Decimal], started: float | None
                   ) -> AccountStatus:
        """The status of an account whose `_row` is `values` and window began at `started`."""
        be, bd, se, sd, srho, szd = values
        if self.accounting == "zcdp":
            spent = Cost(_zcdp_spent_epsilon(srho, szd, bd), _num(szd))
        else:
            spent = Cost(_num(se), _num(sd))
        return AccountStatus(account, Cost(_num(be), _num(bd)), spent, _num(srho),
                             self.accounting, None if self._expired(started) else started)

    # -- API --------------------------------------------------------------------------------

    def charge(self, accounts: Sequence[str], cost: Cost | Loss, *, analyst: str,
               statement: str, claim: str | None = None) -> Charge:
        """Atomically check that every account can pay `cost` and record the charge; raise
        BudgetExceeded otherwise (nothing is written). The charge is durable on return.

        With `claim`, the analyst's cache key is claimed in the same transaction; if it is
        already claimed, AnswerAvailable is raised and nothing is charged."""
        if isinstance(accounts, str) or not accounts:
            raise InvalidParameterValue("charge needs a non-empty list of accounts, "
                                        f"got {accounts!r}")
        names = tuple(dict.fromkeys(_check_name(a, "account") for a in accounts))  # dedupe
        loss = Loss.of(cost)
        eps, delta = _check_cost(loss, "query cost")
        rho, zcdp_delta = (_check_cost(Cost(*loss.zcdp), "query cost in zCDP form"))
        _check_name(analyst, "analyst")
        if not isinstance(statement, str):
            raise InvalidParameterValue("statement must be a string")

        def work(db: Any) -> Charge:
            if claim is not None:
                self._store.lock_claim(db, analyst, claim)
                self._check_claim(db, analyst, claim)
            self._store.lock_accounts(db, names)
            short: list[tuple[str, Decimal, Decimal]] = []
            new_spent: list[tuple[str, Decimal, Decimal, Decimal, Decimal]] = []
            after: list[AccountStatus] = []
            delta_short = False
            for name in names:
                # raises for an unknown account before any write; spending before the
                # current window reads as zero, and the window is renewed below
                (be, bd, se, sd, srho, szd), started = self._row_and_start(db, name)
                started = self._renew(db, name, started)
                ne, nd = _UP.add(se, eps), _UP.add(sd, delta)
                nrho, nzd = _UP.add(srho, rho), _UP.add(szd, zcdp_delta)
                if self.accounting == "zcdp":
                    over_delta = nzd >= bd if nrho > 0 else nzd > bd
                    over = over_delta or _zcdp_spent_epsilon(nrho, nzd, bd) > _num(be)
                    left = (_left(be, _dec(_zcdp_spent_epsilon(srho, szd, bd))), _left(bd, szd))
                else:
                    over_delta = nd > bd
                    over = ne > be or over_delta
                    left = (_left(be, se), _left(bd, sd))
                if over:
                    short.append((name, *left))
                    delta_short = delta_short or over_delta
                new_spent.append((name, ne, nd, nrho, nzd))
                after.append(self._status_of(name, (be, bd, ne, nd, nrho, nzd), started))
            if short:
                who = " and ".join(_label(n) for n, _, _ in short)
                if len(short) == 1:
                    left_text = f"ε={_fmt(short[0][1])}, δ={_fmt(short[0][2])}"
                else:
                    left_text = "; ".join(f"{_label(n)} ε={_fmt(e)}, δ={_fmt(d)}"
                                          for n, e, d in short)
                # a query without δ refused for δ: what was spent is above the δ budget
                # (an admin set it lower), which no query can undo
                overspent = "; δ already spent exceeds the δ budget" \
                    if delta_short and delta == 0 else ""
                raise BudgetExceeded(
                    f"privacy budget exceeded for {who}: query costs ε={_fmt(eps)}, "
                    f"δ={_fmt(delta)}; remaining {left_text}{overspent}",
                    hint=_HINT_DELTA if delta_short else _HINT)
            charge = Charge(uuid.uuid4().hex, names, Cost(_num(eps), _num(delta)), analyst,
                            statement, time.time(), tuple(after))
            db.execute("INSERT INTO charges (charge_id, at, analyst, statement, epsilon, delta,"
                       " rho, zcdp_delta) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (charge.charge_id, charge.at, analyst, statement, str(eps), str(delta),
                        str(rho), str(zcdp_delta)))
            for name, ne, nd, nrho, nzd in new_spent:
                db.execute("UPDATE accounts SET spent_epsilon = ?, spent_delta = ?,"
                           " spent_rho = ?, spent_zcdp_delta = ? WHERE account = ?",
                           (str(ne), str(nd), str(nrho), str(nzd), name))
                db.execute("INSERT INTO charge_accounts (charge_id, account) VALUES (?, ?)",
                           (charge.charge_id, name))
            if claim is not None:
                db.execute("INSERT INTO answers (analyst, cache_key, charge_id, at, answer)"
                           " VALUES (?, ?, ?, ?, NULL) ON CONFLICT (analyst, cache_key) DO UPDATE"
                           " SET charge_id = excluded.charge_id, at = excluded.at, answer = NULL",
                           (analyst, claim, charge.charge_id, charge.at))
            return charge

        return self._batched(work)

    # -- answer cache ------------------------------------------------------------------------

    def _check_claim(self, db: Any, analyst: str, key: str) -> None:
        row = db.execute("SELECT answer, at FROM answers WHERE analyst = ? AND cache_key = ?",
                         (analyst, key)).fetchone()
        if row is None:
            return
        answer, at = row
        if answer is not None or time.time() - at < STALE_CLAIM_S:
            raise AnswerAvailable(answer)
        # abandoned: its process died before storing the answer (or an OS crash lost
        # the stored answer, written without its own fsync): charging a repeat again is
        # safe, since the claim was committed with the first charge

    def lookup_answer(self, analyst: str, key: str, *, status_of: str | None = None
                      ) -> CachedAnswer | None:
        """The stored (or claimed, answer None) answer for the analyst's cache key; with
        `status_of`, a stored answer comes with that account's status (one read)."""
        status = None
        with self._read() as db:
            row = db.execute("SELECT answer, at, charge_id FROM answers WHERE analyst = ? AND"
                             " cache_key = ?", (analyst, key)).fetchone()
            if row is not None and row[0] is not None and status_of is not None:
                status = self._status(db, status_of)
        if row is None:
            return None
        answer, at, charge_id = row
        if answer is None and time.time() - at >= STALE_CLAIM_S:
            return None
        return CachedAnswer(answer, at, charge_id, status)

    def store_answer(self, analyst: str, key: str, charge_id: str, answer: str) -> None:
        """Store the released answer of a claimed key before it is returned.

        Committed without waiting for its own fsync (unless fast commits are off): a
        killed process keeps it (it is in the WAL / the database server), only a power or
        OS failure before the next durable commit can lose it. Losing it is safe: the claim
        was committed durably with the charge, so a repeat waits for STALE_CLAIM_S, then
        is charged in full and answered with fresh noise; no answer is ever released
        without its charge."""
        sql = ("UPDATE answers SET answer = ? WHERE analyst = ? AND cache_key = ? AND"
               " charge_id = ?")
        if not self._fast:
            with self._write() as db:
                db.execute(sql, (answer, analyst, key, charge_id))
            return
        if self._store.group_commit:  # with the charges committing meanwhile, if any
            self._batched(lambda db: db.execute(sql, (answer, analyst, key, charge_id)),
                          durable=False)
            return
        with self._sql() as db:
            self._store.begin_lazy_write(db)
            try:
                db.execute(sql, (answer, analyst, key, charge_id))
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    with suppress(*self._store.errors):
                        db.execute("ROLLBACK")
                self._store.end_lazy_write(db)

    def drop_claim(self, analyst: str, key: str, charge_id: str) -> None:
        """Give up a claim whose query failed before producing an answer (the charge stays)."""
        with self._write() as db:
            db.execute("DELETE FROM answers WHERE analyst = ? AND cache_key = ? AND"
                       " charge_id = ? AND answer IS NULL", (analyst, key, charge_id))

    def status(self, account: str) -> AccountStatus:
        with self._read() as db:
            return self._status(db, account)

    def statuses(self) -> list[AccountStatus]:
        with self._read() as db:
            names = [r[0] for r in db.execute("SELECT account FROM accounts ORDER BY account")]
            return [self._status(db, n) for n in names]

    def history(self, account: str | None = None, limit: int = 100) -> list[Charge]:
        """Charges, newest first; only those touching `account` if given."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidParameterValue(f"limit must be an integer >= 0, got {limit!r}")
        with self._read() as db:
            if account is None:
                rows = db.execute("SELECT charge_id, at, analyst, statement, epsilon, delta FROM"
                                  f" charges ORDER BY {self._store.order} DESC LIMIT ?",
                                  (limit,)).fetchall()
            else:
                self._row(db, account)  # raises for an unknown account
                rows = db.execute(
                    "SELECT c.charge_id, c.at, c.analyst, c.statement, c.epsilon, c.delta"
                    " FROM charges c JOIN charge_accounts ca ON ca.charge_id = c.charge_id"
                    f" WHERE ca.account = ? ORDER BY c.{self._store.order} DESC LIMIT ?",
                    (account, limit)).fetchall()
            result = []
            for cid, at, analyst, stmt, e, d in rows:
                accts = tuple(r[0] for r in db.execute(
                    "SELECT account FROM charge_accounts WHERE charge_id = ? ORDER BY "
                    f"{self._store.order}",
                    (cid,)))
                result.append(Charge(cid, accts, Cost(_num(Decimal(e)), _num(Decimal(d))),
                                     analyst, stmt, at))
            return result

    def admin_history(self, account: str | None = None, limit: int = 100) -> list[AdminEvent]:
        """Admin events (creation from policy, grants, budget changes), newest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidParameterValue(f"limit must be an integer >= 0, got {limit!r}")
        where, args = ("", ()) if account is None else (" WHERE account = ?", (account,))
        with self._read() as db:
            rows = db.execute("SELECT at, \"by\", account, action, epsilon, delta FROM admin_events"
                              f"{where} ORDER BY event_id DESC LIMIT ?", (*args, limit))
            return [AdminEvent(at, by, acct, action, Cost(_num(Decimal(e)), _num(Decimal(d))))
                    for at, by, acct, action, e, d in rows]

    def timeline(self, account: str | None = None, limit: int = 100) -> list[HistoryEntry]:
        """Charges and admin events together, newest first (at most `limit`)."""
        entries = [HistoryEntry(c.at, c.analyst, "charge", ",".join(c.accounts), c.cost,
                                c.statement) for c in self.history(account, limit=limit)]
        entries += [HistoryEntry(e.at, e.by, e.action, e.account, e.amount, "")
                    for e in self.admin_history(account, limit=limit)]
        entries.sort(key=lambda e: e.at, reverse=True)
        return entries[:limit]

    def grant(self, account: str, extra: Cost, *, by: str) -> AccountStatus:
        """Add `extra` to the account's budget; recorded as an admin event."""
        eps, delta = _check_cost(extra, "grant")
        _check_name(by, "by")
        with self._write() as db:
            self._store.lock_accounts(db, [account])
            be, bd, *_ = self._row(db, account)
            ne, nd = _DOWN.add(be, eps), _DOWN.add(bd, delta)
            if not math.isfinite(float(ne)):  # finite grants whose sum is not (1e308 twice)
                raise InvalidParameterValue(f"grant would make the epsilon budget of {account} "
                                            f"{_fmt(ne)}, beyond any number of double range")
            if nd >= 1:
                raise InvalidParameterValue(f"grant would make the delta budget of {account} "
                                            f"{_fmt(nd)}, which must stay < 1")
            db.execute("UPDATE accounts SET budget_epsilon = ?, budget_delta = ? WHERE account = ?",
                       (str(ne), str(nd), account))
            self._admin_event(time.time(), by, account, "grant", eps, delta)
            return self._status(db, account)

    def set_budget(self, account: str, budget: Cost, *, by: str,
                   keep_delta: bool = False) -> AccountStatus:
        """Replace the account's budget (spent is kept; below spent, remaining is 0);
        `keep_delta`: replace only ε, the δ budget stays as it is (budget.delta unused)."""
        eps, delta = _check_cost(budget, "budget")
        _check_name(by, "by")
        with self._write() as db:
            self._store.lock_accounts(db, [account])
            row = self._row(db, account)
            if keep_delta:
                delta = Decimal(row[1])  # as stored: a float would round it (up, maybe)
            db.execute("UPDATE accounts SET budget_epsilon = ?, budget_delta = ? WHERE account = ?",
                       (str(eps), str(delta), account))
            self._admin_event(time.time(), by, account, "set_budget", eps, delta)
            return self._status(db, account)

    def affordable(self, account: str, cost: Cost | Loss, limit: int = 10**9) -> int:
        """How many more charges of `cost` the account can pay (at most `limit`)."""
        loss = Loss.of(cost)
        eps, delta = _check_cost(loss, "cost")
        rho, outside = _check_cost(Cost(*loss.zcdp), "cost in zCDP form")
        with self._read() as db:
            be, bd, se, sd, srho, szd = self._row(db, account)

        def fits(n: int) -> bool:
            k = Decimal(n)
            if self.accounting == "zcdp":
                nrho = _UP.add(srho, _UP.multiply(k, rho))
                nzd = _UP.add(szd, _UP.multiply(k, outside))
                if nzd > bd or (nrho > 0 and nzd >= bd):
                    return False
                return _zcdp_spent_epsilon(nrho, nzd, bd) <= _num(be)
            return _UP.add(se, _UP.multiply(k, eps)) <= be \
                and _UP.add(sd, _UP.multiply(k, delta)) <= bd

        if eps == 0 and delta == 0 and rho == 0 and outside == 0:
            return limit
        low, high = 0, 1
        while high < limit and fits(high):
            low, high = high, high * 2
        high = min(high, limit)
        if fits(high):
            return high
        while high - low > 1:  # fits(low) and not fits(high)
            mid = (low + high) // 2
            low, high = (mid, high) if fits(mid) else (low, mid)
        return low

    def reset(self, account: str, *, by: str) -> AccountStatus:
        """Forget what the account has spent (its history stays); recorded as an admin event."""
        _check_name(by, "by")
        with self._write() as db:
            self._store.lock_accounts(db, [account])
            _, _, se, sd, *_ = self._row(db, account)
            db.execute("UPDATE accounts SET spent_epsilon = '0', spent_delta = '0',"
                       " spent_rho = '0', spent_zcdp_delta = '0' WHERE account = ?", (account,))
            self._admin_event(time.time(), by, account, "reset", se, sd)
            return self._status(db, account)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
