"""The embedded DuckDB backend: a read-only connection with external access disabled.

Read-only also fixes the data: while this backend holds the file open, DuckDB's file lock
keeps every other process from opening it for writing, and no connection of this process
can write it (DuckDB opens a file with one configuration per process). So a bound check
(`dpproxy.bounds`) read once holds for as long as the backend is open.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import duckdb

from ..bounds import BoundCheck, BoundingCounts, Unbounded
from ..errors import BackendError, InvalidPolicy
from ..policy import Policy


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
        locked = self._connection.execute(
            "SELECT current_setting('lock_configuration')").fetchone()
        if not (locked and locked[0]):  # another engine in this process may have locked it
            self._connection.execute("SET enable_external_access = false")
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
        self.bounding = BoundingCounts()

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
        return cursor

    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None) -> list[tuple[object, ...]]:
        if unbounded is not None:
            if self._bounds_hold(unbounded.check):
                sql, parameters = unbounded.sql, unbounded.parameters(parameters)
                self.bounding.skipped += 1
            else:
                self.bounding.enforced += 1
        try:
            return self._cursor().execute(sql, list(parameters)).fetchall()
        except duckdb.Error as exc:
            raise BackendError(
                "the backend could not run the rewritten query",
                detail=f"backend error class: {type(exc).__name__}",
                hint="the backend's message is withheld because it may quote private data",
            ) from None

    def _bounds_hold(self, check: BoundCheck) -> bool:
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
        return check.holds(observed)

    def data_version(self) -> str:
        stat = self._path.stat()
        return f"{stat.st_size}:{stat.st_mtime_ns}"

    def close(self) -> None:
        self._connection.close()
