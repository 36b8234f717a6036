"""The embedded DuckDB backend: a read-only connection with external access disabled.

Read-only also fixes the data: while this backend holds the file open, DuckDB's file lock
keeps every other process from opening it for writing, and no connection of this process
can write it (DuckDB opens a file with one configuration per process). So a bound check
(`dpproxy.bounds`) read once holds for as long as the backend is open.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import duckdb

from ..bounds import SPLIT_MAX_HEAVY_SHARE, UNIT, BoundCheck, BoundingCounts, Unbounded
from ..errors import BackendError, InvalidPolicy
from ..policy import Policy
from . import uncompilable, unplannable
from .shared_scans import SharedScans

# "off": run every statement from its text, for A/B benchmarks.
PREPARED_STATEMENTS = os.environ.get("DPPROXY_PREPARED", "on").lower() != "off"
PREPARED_PER_THREAD = 64  # statements each thread's cursor keeps prepared
DISABLED_OPTIMIZERS = "common_subplan"
# "off": a query over data where some unit exceeds the bounds runs bounded whole, never as
# the split statement or a count less the check's excess rows (`dpproxy.bounds`), for A/B
# benchmarks.
SPLIT_BOUNDING = os.environ.get("DPPROXY_SPLIT_BOUNDING", "on").lower() != "off"
# "off": every statement runs alone, none shares a scan, for A/B benchmarks.
SHARED_SCANS = os.environ.get("DPPROXY_SHARED_SCANS", "on").lower() != "off"


class _Prepared:
    """One cursor's prepared statements, by SQL text: a text is prepared the second time it
    is run (the first may well be the only one), and the least recently run is deallocated
    beyond PREPARED_PER_THREAD. Parameters are passed to EXECUTE as literals typed exactly as
    DuckDB types them when bound from Python; a value without such a literal runs the text
    as it is."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self._cursor = cursor
        self._names: OrderedDict[str, str] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()  # texts run once
        self._numbers = itertools.count()
        self._decimal_types: dict[tuple[int, int, int], str] = {}

    def name(self, sql: str) -> str | None:
        """The prepared statement for `sql`, prepared now if `sql` ran once before."""
        name = self._names.get(sql)
        if name is not None:
            self._names.move_to_end(sql)
            return name
        if sql not in self._seen:
            self._seen[sql] = None
            if len(self._seen) > PREPARED_PER_THREAD:
                self._seen.popitem(last=False)
            return None
        name = f"dpproxy_prepared_{next(self._numbers)}"
        try:
            self._cursor.execute(f"PREPARE {name} AS {sql}")
        except duckdb.Error:
            return None  # not preparable: run as text (which raises its own error, if any)
        del self._seen[sql]
        self._names[sql] = name
        if len(self._names) > PREPARED_PER_THREAD:
            _, oldest = self._names.popitem(last=False)
            self._cursor.execute(f"DEALLOCATE {oldest}")
        return name

    def arguments(self, parameters: Sequence[object]) -> str | None:
        """`(literal, …)` for EXECUTE (empty without parameters), or None."""
        literals = []
        for value in parameters:
            literal = self._literal(value)
            if literal is None:
                return None
            literals.append(literal)
        return f"({', '.join(literals)})" if literals else ""

    def _literal(self, value: object) -> str | None:
        """A literal of the type DuckDB gives `value` bound from Python, or None."""
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, int):
            if -2**31 <= value < 2**31:
                return f"CAST({value} AS INTEGER)"
            return f"CAST({value} AS BIGINT)" if -2**63 <= value < 2**63 else None
        if isinstance(value, float):
            return f"CAST('{value!r}' AS DOUBLE)" if math.isfinite(value) else None
        if isinstance(value, Decimal):
            if not value.is_finite():
                return None
            sign, digits, exponent = value.as_tuple()
            assert isinstance(exponent, int)
            shape = (sign, len(digits), exponent)
            kind = self._decimal_types.get(shape)
            if kind is None:  # DuckDB's own rule, asked once per shape of number
                found = self._cursor.execute("SELECT typeof($1)", [value]).fetchone()
                kind = str(found[0]) if found else ""
                if not kind.startswith("DECIMAL("):
                    return None
                self._decimal_types[shape] = kind
            return f"CAST('{value:f}' AS {kind})"
        if isinstance(value, str):
            return None if "\x00" in value else "'" + value.replace("'", "''") + "'"
        return None


_CHECKED = "__dpproxy_checked"  # the name `check_plans` prepares a statement under


class DuckDBBackend:
    dialect = "duckdb"

    def __init__(self, path: Path) -> None:
        if not path.exists():
            raise InvalidPolicy(f"the DuckDB database {path} does not exist",
                                hint="build the demo with `dpproxy demo`, or fix backend.path")
        # Read-only, and no file or network access from SQL: the rewrite never needs either,
        # so nothing that slipped through could read a file. Set after connecting (not as
        # connect config) so other read-only connections in this process can still open
        # the file; the settings hold for the whole database instance.
        self._path = path
        self._connection = duckdb.connect(str(path), read_only=True)
        stat = path.stat()  # after connecting: from now on the file is fixed
        self._version = f"{stat.st_size}:{stat.st_mtime_ns}"
        locked = self._connection.execute(
            "SELECT current_setting('lock_configuration')").fetchone()
        if not (locked and locked[0]):  # another engine in this process may have locked it
            self._connection.execute("SET enable_external_access = false")
            # A bounded statement that chooses each unit's group first reads its filtered
            # rows twice (for the choice, then the chosen group's rows); DuckDB would
            # materialize them once for both, which costs more than scanning again (10M
            # rows: 0.8 s against 30 ms).
            self._connection.execute(f"SET disabled_optimizers = '{DISABLED_OPTIMIZERS}'")
            # a TIMESTAMPTZ's day (a date key, a timestamp read as its declared date) in
            # UTC, as the PostgreSQL backend's sessions read it, not in the host's zone
            self._connection.execute("SET GLOBAL TimeZone = 'UTC'")
            self._connection.execute("SET lock_configuration = true")
        external = self._connection.execute(
            "SELECT current_setting('enable_external_access')").fetchone()
        if external and external[0]:
            raise InvalidPolicy(f"the DuckDB database {path} is open in this process with "
                                "external access enabled and its configuration locked",
                                hint="open it read-only without locking its configuration")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._checks: dict[str, tuple[object, ...] | None] = {}  # check SQL → observed maxima
        # heavy_sql → the units over the bounds, where the split statement is worth running
        self._heavy: dict[str, list[object] | None] = {}
        self.bounding = BoundingCounts()
        self.shared = SharedScans(self._run)

    @classmethod
    def open(cls, policy: Policy) -> DuckDBBackend:
        path = policy.backend.path
        assert path is not None
        if policy.backend.demo_seed is not None and not path.exists():
            from ..demo import ensure_demo

            ensure_demo(path, seed=policy.backend.demo_seed)
        return cls(path)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        # DuckDB connections are not thread-safe; each thread gets its own cursor.
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            with self._lock:
                cursor = self._connection.cursor()
            self._local.cursor = cursor
            self._local.prepared = _Prepared(cursor)
        return cursor

    def _run(self, sql: str, parameters: Sequence[object]) -> list[tuple[object, ...]]:
        """Run `sql` with `parameters` on this thread's cursor: a text run before runs as
        the statement prepared then (DuckDB skips parsing, binding and planning it)."""
        cursor = self._cursor()
        if PREPARED_STATEMENTS:
            prepared: _Prepared = self._local.prepared
            name = prepared.name(sql)
            if name is not None:
                arguments = prepared.arguments(parameters)
                if arguments is not None:
                    return cursor.execute(f"EXECUTE {name}{arguments}").fetchall()
        return cursor.execute(sql, list(parameters)).fetchall()

    def check_plans(self, statements: Sequence[tuple[str, Sequence[object]]]) -> None:
        # PREPARE binds and plans, and runs nothing (EXPLAIN takes twice as long here)
        cursor = self._cursor()
        try:
            for sql, _ in statements:
                cursor.execute(f"PREPARE {_CHECKED} AS {sql}")
                cursor.execute(f"DEALLOCATE {_CHECKED}")
        except duckdb.Error as exc:
            raise unplannable(type(exc).__name__) from None

    def check_patterns(self, patterns: Sequence[tuple[str, bool]]) -> None:
        # a parameter, not a constant: compiled when the one row reaches it, as in a query
        cursor = self._cursor()
        for pattern, insensitive in patterns:
            try:
                cursor.execute("SELECT REGEXP_MATCHES('', ?, ?)",
                               [pattern, "is" if insensitive else "s"]).fetchall()
            except duckdb.Error:
                raise uncompilable(pattern) from None

    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None) -> list[tuple[object, ...]]:
        shareable = False
        if unbounded is not None:
            observed = self._observed(unbounded.check)
            plain = unbounded.sql_for(observed)
            if plain is not None:
                sql, parameters = plain, unbounded.parameters(parameters)
                self.bounding.skipped += 1
                # only the statement without bounding can be shared (and only it is worth
                # parsing to see whether it can: a bounded one is large and never can)
                shareable = SHARED_SCANS
            elif SPLIT_BOUNDING and (excess := unbounded.excess_for(observed)) is not None:
                sql, parameters = excess
                self.bounding.excess += 1
            elif (split := self._split(unbounded)) is not None:
                sql = split  # the bounded statement's parameters
                self.bounding.split += 1
            else:
                self.bounding.enforced += 1
        try:
            if shareable:
                return self.shared.run(sql, parameters)
            return self._run(sql, parameters)
        except duckdb.Error as exc:
            raise BackendError(
                "the backend could not run the rewritten query",
                detail=f"backend error class: {type(exc).__name__}",
                hint="the backend's message is withheld because it may quote private data",
            ) from None

    def _observed(self, check: BoundCheck) -> tuple[object, ...] | None:
        """What `check` read on this data (None: not verified), read once."""
        with self._lock:
            known = check.sql in self._checks
            observed = self._checks.get(check.sql)
        if not known:
            try:
                observed = self._cursor().execute(check.sql).fetchone()
            except duckdb.Error:
                observed = None  # not verified: bound as always
            with self._lock:
                self._checks[check.sql] = observed
                self.bounding.checks += 1
        return observed

    def _split(self, unbounded: Unbounded) -> str | None:
        """The split statement where it is offered and worth running, its heavy units'
        table made on this thread's cursor; None: run the bounded statement."""
        if not SPLIT_BOUNDING or unbounded.generate_split is None:
            return None
        check = unbounded.check
        with self._lock:  # by heavy_sql: who is heavy depends on the bounds
            known = check.heavy_sql in self._heavy
            units = self._heavy.get(check.heavy_sql)
        if not known:
            units = self._heavy_units(check)
            with self._lock:
                self._heavy[check.heavy_sql] = units
        if units is None:
            return None
        made: set[str] = self._local.__dict__.setdefault("heavy_tables", set())
        if check.heavy_table not in made:
            try:
                # a temporary table belongs to its cursor: each thread's makes its own
                self._cursor().execute(f'CREATE TEMPORARY TABLE "{check.heavy_table}" AS '
                                       f"SELECT UNNEST($1) AS {UNIT}", [units])
            except duckdb.Error:
                return None
            made.add(check.heavy_table)
        return unbounded.split_sql

    def _heavy_units(self, check: BoundCheck) -> list[object] | None:
        """The units over the bounds, read once; None where splitting would not pay (they
        hold more than SPLIT_MAX_HEAVY_SHARE of the rows) or is not possible (a NULL
        unit is one of them, or the read fails)."""
        try:
            cursor = self._cursor()
            heavy = cursor.execute(check.heavy_sql).fetchall()
            counted = cursor.execute(check.rows_sql).fetchone()
        except duckdb.Error:
            return None
        rows = int(counted[0]) if counted else 0
        if any(unit is None for unit, _ in heavy) or \
                sum(int(n) for _, n in heavy) > SPLIT_MAX_HEAVY_SHARE * rows:  # type: ignore[call-overload]
            return None
        return [unit for unit, _ in heavy]

    def column_types(self, tables: Sequence[str]) -> dict[tuple[str, str], str]:
        """The type of each column of these tables, by lowercase (table, column)."""
        found = self._cursor().execute(
            "SELECT lower(table_name), lower(column_name), lower(data_type) "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND lower(table_name) IN (SELECT lower(UNNEST($1::VARCHAR[])))",
            [list(tables)]).fetchall()
        return {(t, c): d for t, c, d in found}

    def not_null_columns(self, tables: Sequence[str]) -> set[tuple[str, str]]:
        """The columns of these tables declared NOT NULL, by lowercase (table, column)."""
        found = self._cursor().execute(
            "SELECT lower(table_name), lower(column_name) "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND is_nullable = 'NO' "
            "AND lower(table_name) IN (SELECT lower(UNNEST($1::VARCHAR[])))",
            [list(tables)]).fetchall()
        return {(t, c) for t, c in found}

    def data_version(self) -> str:
        """The file's size and modification time when opened: the data cannot change while
        the backend holds it open (see the module docstring), so it is read once."""
        return self._version

    def close(self) -> None:
        self._connection.close()
