"""Backends run one rewritten statement and return per-group aggregate rows.

A backend never receives the analyst's SQL, only what `rewrite` produced, and
its own error messages are withheld from the analyst (they may quote data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, overload

from ..bounds import Unbounded
from ..policy import Policy
from ..release import ExactColumns


class Backend(Protocol):
    dialect: str  # sqlglot dialect the rewrite emits for this backend

    @overload
    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None, columns: Literal[False] = False
                      ) -> list[tuple[object, ...]]: ...

    @overload
    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None, *, columns: bool
                      ) -> list[tuple[object, ...]] | ExactColumns: ...

    def run_aggregate(self, sql: str, parameters: Sequence[object] = (),
                      unbounded: Unbounded | None = None, columns: bool = False
                      ) -> list[tuple[object, ...]] | ExactColumns:
        """Run one rewritten statement; raise BackendError (never the raw error) on failure.

        `unbounded`: the same statistics without contribution bounding, which the backend
        runs instead where it can prove, for the data the query reads, that bounding
        removes nothing (`dpproxy.bounds`). `columns`: the result may come as ExactColumns
        (which `release` takes faster, see `takes_columns`), where the backend can."""
        ...

    def data_version(self) -> str:
        """Changes whenever the data may have changed: cached answers belong to one version."""
        ...

    def close(self) -> None: ...


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
