"""Backends run one rewritten statement and return per-group aggregate rows.

A backend never receives the analyst's SQL, only what `rewrite` produced, and
its own error messages are withheld from the analyst (they may quote data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..bounds import Unbounded
from ..errors import BackendError, InvalidRegularExpression
from ..policy import Policy


class Backend(Protocol):
    dialect: str  # sqlglot dialect the rewrite emits for this backend

    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None) -> list[tuple[object, ...]]:
        """Run one rewritten statement; raise BackendError (never the raw error) on failure.

        `unbounded`: the same statistics without contribution bounding, which the backend
        runs instead where it can prove, for the data the query reads, that bounding
        removes nothing (`dpproxy.bounds`)."""
        ...

    def check_plans(self, statements: Sequence[tuple[str, Sequence[object]]]) -> None:
        """Plan each (statement, parameters) without running it; raise BackendError where
        the backend cannot: a fault of the rewrite, found before the query is charged."""
        ...

    def check_patterns(self, patterns: Sequence[tuple[str, bool]]) -> None:
        """Compile each (regular expression, case-insensitive) as the rewritten statements
        match with it, on a constant: InvalidRegularExpression for one the backend cannot
        compile. Both engines compile a pattern only when a row first reaches it, so
        whether a query fails would otherwise tell whether such a row exists."""
        ...

    def data_version(self) -> str:
        """Changes whenever the data may have changed: cached answers belong to one version."""
        ...

    def column_types(self, tables: Sequence[str]) -> dict[tuple[str, str], str]:
        """The database type of each column of these tables (lowercase), by lowercase
        (table, column); a table the database lacks has no entry."""
        ...

    def not_null_columns(self, tables: Sequence[str]) -> set[tuple[str, str]]:
        """The columns of these tables declared NOT NULL in the database, by lowercase
        (table, column)."""
        ...

    def close(self) -> None: ...


def unplannable(error_class: str) -> BackendError:
    """The error for a rewritten statement the backend cannot plan (`check_plans`)."""
    return BackendError("the backend cannot plan the rewritten query; nothing was charged",
                        detail=f"backend error class: {error_class}",
                        hint="this is a fault of dpproxy's rewrite: please report the query "
                             "(the backend's message is withheld: it may quote data)")


def uncompilable(pattern: str) -> InvalidRegularExpression:
    """The error for a pattern the backend cannot compile (`check_patterns`)."""
    from ..analyze.regex import HINT

    return InvalidRegularExpression(
        f"invalid regular expression {pattern!r}: the backend cannot compile it; nothing "
        "was charged", hint=HINT)


def open_backend(policy: Policy) -> Backend:
    """The backend the policy names, ready to run queries."""
    if policy.backend.kind == "duckdb":
        from .duckdb import DuckDBBackend

        return DuckDBBackend.open(policy)
    if policy.backend.kind == "postgres":
        from .postgres import PostgresBackend

        return PostgresBackend.open(policy)
    from ..errors import NotSupportedError

    raise NotSupportedError(f"backend kind {policy.backend.kind!r} is not available yet",
                            hint="use kind = \"duckdb\" or \"postgres\"")
