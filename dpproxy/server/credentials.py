"""Where analysts' SCRAM verifiers live: the policy (`password_scram`) or the ledger file.

`dpproxy analyst passwd NAME` stores a verifier in a `credentials` table of
the policy's ledger SQLite file, which then wins over the policy's. Only
verifiers are stored, never passwords, and nothing here logs either.

With a PostgreSQL ledger (`[ledger] dsn`) verifiers come from the policy only:
`analyst passwd` is refused, so every proxy sharing the ledger reads the same
`password_scram` from its policy and no verifier is written to a shared database.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from contextlib import closing, suppress

from .. import errors
from ..policy import Policy
from ..session import open_ledger
from .scram import DEFAULT_ITERATIONS, make_verifier, parse_verifier

_SCHEMA = ("CREATE TABLE IF NOT EXISTS credentials (analyst TEXT PRIMARY KEY, "
           "verifier TEXT NOT NULL, updated_at REAL NOT NULL)")


class CredentialStore:
    """Verifiers for one policy's analysts: that policy, or the one a callable gives on
    each use (a server's, whose analysts change while it runs)."""

    def __init__(self, policy: Policy | Callable[[], Policy]) -> None:
        self._current: Callable[[], Policy] = policy if callable(policy) else lambda: policy
        self._path = self.policy.ledger_path

    @property
    def policy(self) -> Policy:
        return self._current()

    def _connect(self) -> sqlite3.Connection:
        try:
            return sqlite3.connect(self._path, timeout=30.0)
        except sqlite3.Error as exc:
            raise errors.OperationalError(f"cannot open credentials in {self._path}: {exc}") \
                from None

    def verifier(self, analyst: str) -> str | None:
        """The analyst's verifier: the one set with `analyst passwd`, else the policy's;
        None for an unknown analyst or one without a password."""
        if analyst not in self.policy.analysts:
            return None
        if self.policy.shared_ledger is None and self._path.exists():
            try:
                with closing(self._connect()) as db:
                    row = db.execute("SELECT verifier FROM credentials WHERE analyst = ?",
                                     (analyst,)).fetchone()
            except sqlite3.OperationalError:
                row = None  # no credentials table yet: only the policy's verifiers exist
            if row is not None:
                return str(row[0])
        return self.policy.analysts[analyst].password_scram

    def check_writable(self, analyst: str) -> None:
        """Refuse (NotSupportedError) when verifiers cannot be stored: a PostgreSQL ledger."""
        if self.policy.shared_ledger is not None:
            raise errors.NotSupportedError(
                "analyst passwd stores verifiers in a SQLite ledger file; this policy's "
                "ledger is in PostgreSQL ([ledger] dsn)",
                hint=f"put the analyst's SCRAM-SHA-256 verifier in the policy: [analysts."
                     f"{analyst}] password_scram = \"SCRAM-SHA-256$…\"")

    def set_password(self, analyst: str, password: str,
                     iterations: int = DEFAULT_ITERATIONS) -> None:
        """Store a fresh verifier for the analyst's password."""
        if not password:
            raise errors.InvalidParameterValue("the password must not be empty")
        self.set_verifier(analyst, make_verifier(password, iterations))

    def set_verifier(self, analyst: str, verifier: str) -> None:
        """Store a SCRAM-SHA-256 verifier made elsewhere (psql's \\password sends one)."""
        if analyst not in self.policy.analysts:
            raise errors.UndefinedObject(
                f"analyst {analyst!r} is not in policy {self.policy.path.name}",
                hint=f"analysts: {', '.join(sorted(self.policy.analysts))}")
        self.check_writable(analyst)
        try:
            parse_verifier(verifier)
        except ValueError:
            raise errors.InvalidParameterValue(
                "not a SCRAM-SHA-256 verifier", hint="send the password itself, or "
                "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>") from None
        # Open the ledger first: it creates the file with its schema, and refuses a
        # SQLite file that is not a ledger, so credentials never land in some other file.
        open_ledger(self.policy).close()  # creates the file with its schema if it is new
        with closing(self._connect()) as db, db:
            db.execute(_SCHEMA)
            db.execute("INSERT INTO credentials (analyst, verifier, updated_at) VALUES (?, ?, ?)"
                       " ON CONFLICT (analyst) DO UPDATE SET verifier = excluded.verifier,"
                       " updated_at = excluded.updated_at", (analyst, verifier, time.time()))

    def forget(self, analyst: str) -> None:
        """Drop the analyst's stored verifier, if any (the analyst was removed: a later one
        of that name must not inherit its password)."""
        if self.policy.shared_ledger is not None or not self._path.exists():
            return
        # no credentials table: nothing was stored
        with closing(self._connect()) as db, db, suppress(sqlite3.OperationalError):
            db.execute("DELETE FROM credentials WHERE analyst = ?", (analyst,))
