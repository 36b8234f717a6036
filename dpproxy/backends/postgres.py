"""The PostgreSQL backend: a pool of read-only connections with a server-side timeout.

Every connection starts with `default_transaction_read_only = on`, so each statement is
a read-only transaction of its own; a bound check (`dpproxy.bounds`) and the query it
licenses run in one `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY` transaction, so
they read one snapshot. Everything runs under
`statement_timeout` (the policy's `[server] statement_timeout_s`) but the charged
statement itself, which runs to its end (`SET LOCAL statement_timeout = 0` in its
transaction): it was paid for, and a cancel would fail it only where the data make it
slow, and fail its every repeat; the server answers the client at the timeout and keeps
the answer for a repeat. All in UTC with ISO dates so casts to text read the same
everywhere. Statements go through psycopg's raw cursor:
the rewrite's only parameter, the salt, is `$1`, and no `%` in the statement is ever read
as a placeholder.

The password never appears in the policy: it comes from the environment variable named
by `password_env`, from `passfile` (.pgpass format), or from libpq's own PGPASSWORD /
~/.pgpass. Error messages name the server, never the password or the backend's text.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import psycopg.sql
from psycopg.adapt import Loader
from psycopg.types.datetime import DateLoader, TimestampLoader, TimestamptzLoader
from psycopg_pool import ConnectionPool, PoolTimeout

from ..bounds import BoundCheck, BoundingCounts, Unbounded
from ..errors import BackendError, InvalidPolicy
from ..policy import Policy, env_password
from . import uncompilable, unplannable

POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 10
CONNECT_TIMEOUT_S = 10
# How the data version is read: per policy table (resolved in the connection's search
# path), its kind and catalog row (ALTER TABLE, row security), its file node (changes on
# TRUNCATE, VACUUM FULL, a new table), its row counters, and the same of every table
# under it (inheritance children, partitions: rows written to a child move the child's
# counters, not the parent's); and the server's and the statistics' start times
# (counters restart with them). A view's or a foreign table's rows have no counters at
# all, so their version is the read's own time: it never repeats, and their answers are
# never served again from the cache (each repeat is a new query). The statistics
# functions are called directly: the pg_stat_user_tables view they sit under costs more
# to plan than the whole read takes to run.
_DATA_VERSION_SQL = """
SELECT pg_postmaster_start_time()::text,
       (SELECT pg_stat_get_db_stat_reset_time(oid)::text FROM pg_database
         WHERE datname = current_database()),
       (SELECT string_agg(COALESCE((
                 WITH RECURSIVE tree(oid) AS (
                   SELECT r::oid
                   UNION
                   SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid)
                 SELECT string_agg(concat_ws(':', t.oid, c.relkind, c.xmin,
                                             pg_relation_filenode(t.oid),
                                             pg_stat_get_tuples_inserted(t.oid),
                                             pg_stat_get_tuples_updated(t.oid),
                                             pg_stat_get_tuples_deleted(t.oid),
                                             pg_stat_get_live_tuples(t.oid),
                                             CASE WHEN c.relkind IN ('v', 'f')
                                                  THEN clock_timestamp()::text END),
                                   '/' ORDER BY t.oid)
                   FROM tree t JOIN pg_class c ON c.oid = t.oid), ''), ',' ORDER BY ord)
          FROM (SELECT to_regclass(quote_ident(name)) AS r, ord
                  FROM unnest($1::text[]) WITH ORDINALITY AS t(name, ord)) AS tables)
"""

# Each column's type, a domain read as the type it is over (a domain over text holds
# text, whatever its name), and whether it is NOT NULL.
_COLUMN_TYPES_SQL = """
WITH RECURSIVE base AS (
  SELECT t.name, a.attname, a.atttypid AS type, a.attnotnull, 0 AS depth
    FROM unnest($1::text[]) AS t(name)
    JOIN pg_attribute a ON a.attrelid = to_regclass(quote_ident(t.name))
   WHERE a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT b.name, b.attname, d.typbasetype, b.attnotnull, b.depth + 1
    FROM base b JOIN pg_type d ON d.oid = b.type
   WHERE d.typtype = 'd' AND b.depth < 32
)
SELECT DISTINCT ON (name, attname) name, attname, format_type(type, NULL), attnotnull
  FROM base ORDER BY name, attname, depth DESC
"""

# The transaction's snapshot, as text, and the server's start time: two transactions with
# equal values see the same committed rows. Read first, so it is the transaction's.
_SNAPSHOT_SQL = "SELECT pg_current_snapshot()::text || '@' || pg_postmaster_start_time()::text"
# Sent as one simple query with it (one round trip, not two): the transaction whose
# snapshot the check and the query read.
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
# The charged statement runs to its end, whatever the sessions' statement_timeout
_UNTIMED = "SET LOCAL statement_timeout = 0"
_LOCK_SAVEPOINT = "__dpproxy_lock"
# After the data changed, a bound check is read again at most this often (seconds): until
# then queries are bounded as always, so a busy server does not pay a check per query.
RECHECK_S = 60.0
# What, besides its rows' versions, decides what a table's rows read as, and changes with
# no new row version: which relation the name resolves to, its kind (a view, a foreign or
# partitioned table, inheritance children, row security whose policies may depend on the
# role: never carried), its file, its own catalog row and its columns' (ALTER TABLE: a
# type, a collation, a dropped column added back with a default), and enum labels (all
# of the database's, so that a domain over an enum is covered too). Catalog rows updated
# in place (VACUUM's and ANALYZE's statistics) keep their xmin.
_CATALOG_SQL = """
SELECT c.relkind = 'r' AND NOT c.relhassubclass AND NOT c.relrowsecurity,
       concat_ws('/', c.oid, c.xmin, pg_relation_filenode(c.oid),
                 (SELECT string_agg(concat_ws(':', a.attnum, a.xmin, a.atttypid,
                                              a.attcollation), ',' ORDER BY a.attnum)
                    FROM pg_attribute a WHERE a.attrelid = c.oid),
                 (SELECT string_agg(concat_ws(':', e.oid, e.xmin), ',' ORDER BY e.oid)
                    FROM pg_enum e))
  FROM pg_class c WHERE c.oid = to_regclass(quote_ident($1))
"""
# Whether a check that held is carried to later snapshots (`_carried`); off, it is
# reused only for an equal snapshot (benchmarks/busy_server.py compares the two)
CARRY_CHECKS = True
# A check is carried only across fewer xids than this (64-bit, from the snapshots' text),
# far inside the 2^31 that 32-bit xid arithmetic compares correctly
_XID_SPAN = 1 << 30


def _catalog(conn: psycopg.Connection[Any], cursor: psycopg.Cursor[Any], check: BoundCheck
             ) -> str | None:
    """The check's table's `_CATALOG_SQL` text in this transaction; None where a check on
    it is never carried (not a plain table without children or row security) or it cannot
    be read."""
    if not check.table:
        return None
    try:
        with conn.transaction():
            found = cursor.execute(_CATALOG_SQL, [check.table]).fetchone()
    except psycopg.Error:
        return None
    return str(found[1]) if found and found[0] is True else None


@dataclass(frozen=True)
class _CheckRead:
    """A bound check as read: the snapshot it holds for, what it observed, when it was
    read (monotonic), the table's `_CATALOG_SQL` text read with it, and whether it may be
    carried to a later snapshot where that text is the same (it held)."""

    snapshot: str
    observed: tuple[object, ...] | None
    read_at: float
    catalog: str | None
    carries: bool


@dataclass(frozen=True)
class _Snapshot:
    """A `_SNAPSHOT_SQL` text read: "xmin:xmax:xip,…@server start"."""

    xmin: int
    xmax: int
    running: frozenset[int]  # xip: top-level transactions in progress
    start: str

    @classmethod
    def read(cls, text: str) -> _Snapshot | None:
        xids, _, start = text.partition("@")
        parts = xids.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts[:2]) \
                or not all(p.isdigit() for p in parts[2].split(",") if p):
            return None
        return cls(int(parts[0]), int(parts[1]),
                   frozenset(int(p) for p in parts[2].split(",") if p), start)

    def follows(self, before: _Snapshot) -> bool:
        """Whether every transaction `before` sees as committed, this one does too: the same
        server run, no smaller xmax, and none of the transactions below `before`'s xmax that
        this one sees running was unseen (ended) in `before`; and few enough xids apart
        for 32-bit xid arithmetic (`_XID_SPAN`).

        >>> old = _Snapshot.read("100:105:100,103@s")
        >>> _Snapshot.read("103:110:103,107@s").follows(old)
        True
        >>> _Snapshot.read("101:110:101@s").follows(old)  # 101 ended before `old`
        False
        >>> _Snapshot.read("100:104:100@s").follows(old)  # an earlier snapshot
        False
        >>> _Snapshot.read("103:110:103@t").follows(old)  # another server start
        False
        """
        return self.start == before.start and before.xmax <= self.xmax \
            and self.xmax - before.xmin < _XID_SPAN \
            and all(x in before.running for x in self.running if x < before.xmax)


class _NumericAsFloat(Loader):
    """NUMERIC as a Python float: beyond float range it is ±inf, never an error."""

    def load(self, data: Any) -> float:
        return float(bytes(data))


class _InfinityDateLoader(DateLoader):
    """Dates Python cannot hold (infinity, BC, after 9999) as date.min / date.max, so a
    group key never makes loading fail."""

    def load(self, data: Any) -> dt.date:
        try:
            return super().load(data)
        except psycopg.DataError:
            return dt.date.min if bytes(data).startswith(b"-") or b"BC" in bytes(data) \
                else dt.date.max


class _InfinityTimestampLoader(TimestampLoader):
    def load(self, data: Any) -> dt.datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            return dt.datetime.min if bytes(data).startswith(b"-") or b"BC" in bytes(data) \
                else dt.datetime.max


class _InfinityTimestamptzLoader(TimestamptzLoader):
    def load(self, data: Any) -> dt.datetime:
        try:
            return super().load(data)
        except psycopg.DataError:
            edge = dt.datetime.min if bytes(data).startswith(b"-") or b"BC" in bytes(data) \
                else dt.datetime.max
            return edge.replace(tzinfo=dt.UTC)


def connection_options(dsn: str, statement_timeout_s: float, work_mem: str | None = None
                       ) -> str:
    """libpq `options` for dpproxy's sessions, after any the DSN already sets
    (a search_path, say); `work_mem` None keeps the server's (or the role's) setting.

    >>> connection_options("postgresql://h/db?options=-csearch_path%3Dx", 2.5, "32MB")
    '-csearch_path=x -c default_transaction_read_only=on -c statement_timeout=2500 \
-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=3 \
-c work_mem=32MB'
    """
    given = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    # extra_float_digits: every double as its shortest exact text (values are read as
    # text): with 0, 15 digits would make two groups of distinct doubles one key in Python
    ours = ["-c default_transaction_read_only=on",
            f"-c statement_timeout={round(statement_timeout_s * 1000)}",
            "-c TimeZone=UTC", "-c DateStyle=ISO,YMD", "-c IntervalStyle=postgres",
            "-c extra_float_digits=3"]
    if work_mem is not None:
        ours.append(f"-c work_mem={work_mem}")
    return " ".join([str(given), *ours]).strip()


def describe_server(dsn: str) -> str:
    """host:port/dbname of a DSN, for messages (never its password)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}/" \
           f"{info.get('dbname') or info.get('user') or ''}"


def _untimed(conn: psycopg.Connection[Any], cursor: psycopg.Cursor[Any]) -> None:
    """No statement_timeout for the rest of the connection's transaction, opening one (a
    read-only snapshot of its own) where none is open; it ends before the connection goes
    back to the pool, and the setting with it."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        cursor.execute(f"{_BEGIN}; {_UNTIMED}")
    else:
        cursor.execute(_UNTIMED)


def _run(cursor: psycopg.Cursor[Any], sql: str, parameters: Sequence[object]
         ) -> list[tuple[object, ...]]:
    """One statement's rows. Always by the extended protocol (a statement without
    parameters is prepared, as psycopg would after its fifth run anyway), which runs one
    statement only: never `COMMIT; SET …; DELETE …`, whatever the string holds."""
    cursor.execute(sql, list(parameters) or None, prepare=True if not parameters else None)
    return [tuple(row) for row in cursor.fetchall()]


class PostgresBackend:
    dialect = "postgres"

    def __init__(self, dsn: str, tables: Sequence[str], *, statement_timeout_s: float = 0.0,
                 password: str | None = None, passfile: str | None = None,
                 max_size: int = POOL_MAX_SIZE, work_mem: str | None = None) -> None:
        try:
            options = connection_options(dsn, statement_timeout_s, work_mem)
        except psycopg.ProgrammingError:
            raise InvalidPolicy("backend.dsn is not a valid PostgreSQL connection string",
                                hint="write dsn = \"postgresql://user@host:5432/dbname\"") \
                from None
        self._server = describe_server(dsn)
        self._tables = list(tables)
        self._checks: dict[str, _CheckRead] = {}  # by the check's SQL
        self._checks_lock = threading.Lock()
        self.bounding = BoundingCounts()
        self.recheck_s = RECHECK_S
        kwargs: dict[str, Any] = {"options": options, "connect_timeout": CONNECT_TIMEOUT_S,
                                  "cursor_factory": psycopg.RawCursor}
        if password is not None:
            kwargs["password"] = password
        if passfile is not None:
            kwargs["passfile"] = passfile
        # the latest catalog, read after an unbounded statement (`_catalog_now`)
        self._dsn, self._kwargs = dsn, kwargs
        self._reader: psycopg.Connection[Any] | None = None
        self._reader_lock = threading.Lock()
        self._pool = ConnectionPool(dsn, kwargs=kwargs, configure=self._configure,
                                    min_size=POOL_MIN_SIZE, max_size=max_size, open=False,
                                    name="dpproxy-backend")
        try:
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
        except PoolTimeout:
            self._pool.close()
            raise BackendError(f"could not connect to PostgreSQL at {self._server}",
                               hint="check backend.dsn, that the server runs, and the "
                                    "password source (password_env, passfile)") from None

    @classmethod
    def open(cls, policy: Policy) -> PostgresBackend:
        config = policy.backend
        assert config.dsn is not None
        password = env_password(config.password_env, "backend.password_env")
        passfile = str(config.passfile) if config.passfile is not None else None
        return cls(config.dsn, list(policy.tables), password=password, passfile=passfile,
                   statement_timeout_s=policy.server.statement_timeout_s,
                   work_mem=config.work_mem)

    @staticmethod
    def _configure(conn: psycopg.Connection[Any]) -> None:
        # A statement alone runs as its own transaction (read-only by the session default):
        # no BEGIN and COMMIT round trips. A bound check and the query it licenses share
        # one snapshot in an explicit `_BEGIN` transaction.
        conn.autocommit = True
        # NUMERIC aggregates as floats: a value beyond float range is inf, not an error
        conn.adapters.register_loader("numeric", _NumericAsFloat)
        conn.adapters.register_loader("date", _InfinityDateLoader)
        conn.adapters.register_loader("timestamp", _InfinityTimestampLoader)
        conn.adapters.register_loader("timestamptz", _InfinityTimestamptzLoader)

    def check_plans(self, statements: Sequence[tuple[str, Sequence[object]]]) -> None:
        try:
            with self._pool.connection() as conn, conn.cursor() as cursor:
                for sql, parameters in statements:
                    cursor.execute(f"EXPLAIN {sql}", list(parameters) or None)
                    cursor.fetchall()
        except psycopg.Error as exc:
            raise unplannable(type(exc).__name__) from None

    def check_patterns(self, patterns: Sequence[tuple[str, bool]]) -> None:
        with self._pool.connection() as conn, conn.cursor() as cursor:
            for pattern, insensitive in patterns:
                try:
                    with conn.transaction():
                        cursor.execute(f"SELECT '' {'~*' if insensitive else '~'} $1::text",
                                       [pattern])
                        cursor.fetchall()
                except psycopg.Error:
                    raise uncompilable(pattern) from None

    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None) -> list[tuple[object, ...]]:
        try:
            with self._pool.connection() as conn, conn.cursor() as cursor:
                try:
                    if unbounded is None:
                        _untimed(conn, cursor)
                        return _run(cursor, sql, parameters)
                    observed, catalog = self._observed(conn, cursor, unbounded.check)
                    _untimed(conn, cursor)  # the check above stays within the timeout
                    plain = unbounded.sql_for(observed)
                    # the excess form runs in the check's snapshot, as the check and the
                    # query share one transaction (or an equal snapshot)
                    shortcut = (plain, unbounded.parameters(parameters)) \
                        if plain is not None else unbounded.excess_for(observed)
                    if shortcut is not None:
                        rows = _run(cursor, *shortcut)
                        # PostgreSQL reads a statement's names, columns and enum labels
                        # from the latest catalog as it parses it, not from the snapshot:
                        # a change that waits for no lock on the table (an enum label
                        # renamed, a relation of that name made earlier on the search
                        # path) could make it read other than the check did. Any such
                        # change committed before it was parsed shows in the latest
                        # catalog now; a relation it read cannot change back while this
                        # transaction holds it, and a label changed back has a new xmin.
                        if catalog is not None and self._catalog_now(unbounded.check) == catalog:
                            if plain is not None:
                                self.bounding.skipped += 1
                            else:
                                self.bounding.excess += 1
                            return rows
                        self.bounding.recomputed += 1
                    self.bounding.enforced += 1
                    return _run(cursor, sql, parameters)
                finally:
                    # read-only: ending it either way changes nothing; a failed one must
                    # end before the connection goes back to the pool
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        conn.execute("ROLLBACK")
        except psycopg.errors.QueryCanceled:
            # not the sessions' statement_timeout (`_untimed`): a cancel from outside
            raise BackendError("the backend canceled the query",
                               hint="PostgreSQL canceled the statement (an administrator's "
                                    "pg_cancel_backend, or a shutdown); repeat the query") \
                from None
        except Exception as exc:  # whatever failed (loading too), its text is withheld
            raise BackendError(
                "the backend could not run the rewritten query",
                detail=f"backend error class: {type(exc).__name__}",
                hint="the backend's message is withheld because it may quote private data",
            ) from None

    def _catalog_now(self, check: BoundCheck) -> str | None:
        """The check's table's `_CATALOG_SQL` text in the latest catalog: read on a
        connection of its own, outside the query's snapshot (a SELECT from pg_enum in it
        would not see a label renamed since); None where it cannot be read."""
        with self._reader_lock:
            try:
                if self._reader is None or self._reader.closed:
                    self._reader = psycopg.connect(self._dsn, autocommit=True, **self._kwargs)
                with self._reader.cursor() as cursor:
                    return _catalog(self._reader, cursor, check)
            except psycopg.Error:
                if self._reader is not None:
                    self._reader.close()
                self._reader = None
                return None

    def _observed(self, conn: psycopg.Connection[Any], cursor: psycopg.Cursor[Any],
                  check: BoundCheck) -> tuple[tuple[object, ...] | None, str | None]:
        """What `check` reads in this transaction's snapshot (None: not verified): known
        for an equal snapshot, or carried from an earlier one where the check held and the
        units with a row version since are within the bounds (`_carried`), else read now
        (in a savepoint, at most every `recheck_s` per check); and the table's
        `_CATALOG_SQL` text it was read with (None: not a table whose bounds are
        verified). Opens the transaction the caller's query runs in."""
        snapshot = self._lock_then_begin(conn, cursor, check)
        if snapshot is None:
            return None, None  # not a table to verify: bound, in a transaction as any query
        now = time.monotonic()
        with self._checks_lock:
            known = self._checks.get(check.sql)
        if known is not None and known.snapshot == snapshot:
            return known.observed, known.catalog
        if known is not None and known.carries and CARRY_CHECKS:
            assert known.catalog is not None
            carried = self._carried(conn, cursor, check, known.snapshot, snapshot,
                                    known.observed, known.catalog)
            with self._checks_lock:
                # either way a later snapshot starts from here: carried to this one, or
                # not carried again until it is read anew
                self._checks[check.sql] = replace(known, snapshot=snapshot, observed=carried) \
                    if carried is not None else replace(known, carries=False)
                self.bounding.carried += carried is not None
            if carried is not None:
                return carried, known.catalog
        if known is not None and now - known.read_at < self.recheck_s:
            return None, None
        observed: tuple[object, ...] | None = None  # None: not verified, bound as always
        # read first: only a plain table's rows are what the check and the unbounded
        # statement read (both `FROM ONLY`), so anything else is never verified
        catalog = _catalog(conn, cursor, check)
        if catalog is not None:
            try:
                with conn.transaction():  # a failed check leaves the transaction usable
                    found = cursor.execute(check.sql).fetchone()
                observed = tuple(found) if found else None
            except psycopg.Error:  # e.g. too slow to verify within the timeout
                pass
        with self._checks_lock:
            self._checks[check.sql] = _CheckRead(snapshot, observed, now, catalog,
                                                 catalog is not None and check.holds(observed))
            self.bounding.checks += catalog is not None
        return observed, catalog

    @staticmethod
    def _lock_then_begin(conn: psycopg.Connection[Any], cursor: psycopg.Cursor[Any],
                         check: BoundCheck) -> str | None:
        """Open the `_BEGIN` transaction holding ACCESS SHARE on the check's table before
        its snapshot is taken (LOCK takes none), so that a change to what the table's rows
        read as (a rename, a column's type: ACCESS EXCLUSIVE) either committed before the
        snapshot, which then shows it (a new snapshot, a new `_CATALOG_SQL` text), or
        waits until the transaction ends. Without the lock, such a change committed
        between the snapshot and the query's lock was read by the query (PostgreSQL
        resolves names and columns once it holds the lock, from the latest catalog) but
        not by the check. Changes that take a weaker lock (ATTACH PARTITION, INHERIT) are
        kept out by `FROM ONLY` in the check and the unbounded statements. Returns the
        snapshot's `_SNAPSHOT_SQL` text, read in one round trip with the rest; None where
        the table cannot be locked (a materialized view, a foreign table): the
        transaction is open, unlocked, and the query is bounded."""
        if not check.table:
            cursor.execute(_BEGIN)
            return None
        name = psycopg.sql.Identifier(check.table).as_string(conn)
        try:
            cursor.execute(f"{_BEGIN}; SAVEPOINT {_LOCK_SAVEPOINT}; "
                           f"LOCK TABLE ONLY {name} IN ACCESS SHARE MODE; "
                           f"RELEASE SAVEPOINT {_LOCK_SAVEPOINT}; {_SNAPSHOT_SQL}")
        except psycopg.Error:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
                raise  # BEGIN itself failed
            cursor.execute(f"ROLLBACK TO SAVEPOINT {_LOCK_SAVEPOINT}")
            return None
        while cursor.nextset():  # past the results of BEGIN, SAVEPOINT, LOCK and RELEASE
            pass
        row = cursor.fetchone()
        return str(row[0]) if row else ""

    @staticmethod
    def _carried(conn: psycopg.Connection[Any], cursor: psycopg.Cursor[Any],
                 check: BoundCheck, before: str, snapshot: str,
                 observed: tuple[object, ...] | None, catalog: str
                 ) -> tuple[object, ...] | None:
        """What `check` would read in this transaction's `snapshot`, from what it read in
        the earlier snapshot `before` (`observed`, within the bounds), where this one
        `follows` it: the units with a row version as young as `before`'s xmin are
        checked again (`BoundCheck.young_sql`), and the maxima are the larger of theirs
        and the earlier ones. A unit with no such version has only versions whose
        inserting transaction had ended when `before` was taken and committed (they are
        seen now), so `before` saw them; and not deleted there, since every deletion
        `before` saw, this snapshot sees too: its rows now are some of those checked,
        with no more rows or groups. Inserts and updates make young versions; deletions
        only remove rows. What the rows read as must not have changed either: the
        table's `catalog` text (`_CATALOG_SQL`) is the one read with the check. None
        where the bounds no longer hold or this cannot be read (a snapshot that does not
        follow, a failed statement): bound, and read the check anew."""
        old, new = _Snapshot.read(before), _Snapshot.read(snapshot)
        if old is None or new is None or not new.follows(old) or not check.young_sql \
                or observed is None or _catalog(conn, cursor, check) != catalog:
            return None
        try:
            with conn.transaction():
                found = cursor.execute(check.young_sql, [str(old.xmin % (1 << 32))]).fetchone()
        except psycopg.Error:
            return None
        if not found:
            return None
        maxima = tuple(max(int(a or 0), int(b or 0))  # type: ignore[call-overload]
                       for a, b in zip(observed[:2], found[:2], strict=True))
        # the rest (a table's distinct groups: which statement runs, not what it answers)
        # as read before; a count's excess rows are never read from a carried check,
        # since it holds (`Unbounded.sql_for`)
        carried = (*maxima, *observed[2:])
        return carried if check.holds(carried) else None

    def column_types(self, tables: Sequence[str]) -> dict[tuple[str, str], str]:
        """The type of each column of these tables (as the data version finds them, on the
        search path), by lowercase (table, column)."""
        return {(str(t).lower(), str(c).lower()): str(d)
                for t, c, d, _ in self._columns(tables)}

    def not_null_columns(self, tables: Sequence[str]) -> set[tuple[str, str]]:
        """The columns of these tables declared NOT NULL, by lowercase (table, column)."""
        return {(str(t).lower(), str(c).lower())
                for t, c, _, not_null in self._columns(tables) if not_null}

    def _columns(self, tables: Sequence[str]) -> list[tuple[object, ...]]:
        try:
            with self._pool.connection() as conn:
                return [tuple(r) for r in conn.execute(_COLUMN_TYPES_SQL,
                                                       [list(tables)]).fetchall()]
        except (psycopg.Error, PoolTimeout):
            raise BackendError(f"could not read the policy tables' columns from "
                               f"{self._server}") from None

    def data_version(self) -> str:
        """Changes when a policy table may have changed: its and its children's row
        counters (inserts, updates, deletes, live rows), file nodes and catalog rows, and
        the server's and statistics' start times; for a view or a foreign table, at every
        read (`_DATA_VERSION_SQL`). Limits: counters reach the statistics system when the
        writing session flushes them (within about a second), so a cached answer may be
        served that long after a write; a change that bypasses the counters entirely is
        not seen."""
        try:
            with self._pool.connection() as conn:
                row = conn.execute(_DATA_VERSION_SQL, [self._tables]).fetchone()
        except (psycopg.Error, PoolTimeout):
            raise BackendError(f"could not read the data version from {self._server}") \
                from None
        return hashlib.sha256(repr(row).encode()).hexdigest()[:32]

    def close(self) -> None:
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
        self._pool.close()
