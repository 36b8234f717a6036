"""One exception hierarchy for dpproxy, shaped like PEP 249 and carrying SQLSTATEs.

The DB-API module re-exports these classes; the wire server turns them into
ErrorResponse messages (SQLSTATE, message, detail, hint). Messages never carry
values read from private data.

>>> err = BudgetExceeded("no budget left", hint="ask an admin for more")
>>> (err.sqlstate, isinstance(err, OperationalError), isinstance(err, Error))
('53400', True, True)
>>> lookup("42501") is PrivacyViolation
True
"""

from __future__ import annotations


class Warning(Exception):
    """Important warnings (PEP 249)."""


class Error(Exception):
    """Base of every dpproxy error; `sqlstate` is the PostgreSQL error code."""

    sqlstate: str = "XX000"

    def __init__(self, message: str, *, detail: str | None = None, hint: str | None = None,
                 position: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint
        self.position = position  # 1-based character offset into the statement, if known
        self.audited = False  # its statement's audit record is written already

    def __str__(self) -> str:
        parts = [self.message]
        if self.detail:
            parts.append(f"DETAIL: {self.detail}")
        if self.hint:
            parts.append(f"HINT: {self.hint}")
        return "\n".join(parts)


class InterfaceError(Error):
    """Misuse of the client interface (closed cursor, bad arguments)."""

    sqlstate = "08000"


class DatabaseError(Error):
    """Errors related to the database or the query."""


class DataError(DatabaseError):
    sqlstate = "22000"


class InvalidParameterValue(DataError):
    """A session option or parameter has a value outside what is allowed."""

    sqlstate = "22023"


class InvalidTextRepresentation(DataError):
    """A literal cannot be read as the type it is compared with ('abc' for a number)."""

    sqlstate = "22P02"


class InvalidFrameOffset(DataError):
    """A window frame's PRECEDING or FOLLOWING offset is negative."""

    sqlstate = "22013"


class InvalidNtileArgument(DataError):
    """NTILE's bucket count is not a positive integer."""

    sqlstate = "22014"


class InvalidNthValueArgument(DataError):
    """NTH_VALUE's position is not a positive integer."""

    sqlstate = "22016"


class InvalidArgumentForWidthBucket(DataError):
    """WIDTH_BUCKET's count is not positive, its bounds are equal or not finite, or its
    thresholds are not sorted."""

    sqlstate = "2201G"


class InvalidRegularExpression(DataError):
    """A regular expression the backend cannot compile (refused before the charge)."""

    sqlstate = "2201B"


class OperationalError(DatabaseError):
    sqlstate = "58000"


class BudgetExceeded(OperationalError):
    """The query's privacy cost does not fit a budget it touches."""

    sqlstate = "53400"


class BackendError(OperationalError):
    """The backend failed; its own message is withheld because it may quote data."""

    sqlstate = "58000"


class IntegrityError(DatabaseError):
    sqlstate = "23000"


class InternalError(DatabaseError):
    sqlstate = "XX000"


class ProgrammingError(DatabaseError):
    """The statement is wrong or not allowed: syntax, names, privacy rules."""

    sqlstate = "42000"


class SyntaxError(ProgrammingError):
    sqlstate = "42601"


class UndefinedTable(ProgrammingError):
    sqlstate = "42P01"


class UndefinedColumn(ProgrammingError):
    sqlstate = "42703"


class InvalidColumnReference(ProgrammingError):
    """More column names given for a subquery (`AS t(a, b)`) than it has columns."""

    sqlstate = "42P10"


class UndefinedObject(ProgrammingError):
    sqlstate = "42704"


class AmbiguousColumn(ProgrammingError):
    """An unqualified column name that more than one joined table has."""

    sqlstate = "42702"


class DuplicateAlias(ProgrammingError):
    """The same table name or alias twice in one FROM clause."""

    sqlstate = "42712"


class DatatypeMismatch(ProgrammingError):
    sqlstate = "42804"


class GroupingError(ProgrammingError):
    sqlstate = "42803"


class WindowingError(ProgrammingError):
    """A window function where SQL allows none (WHERE, HAVING, nested), or a bad frame."""

    sqlstate = "42P20"


class PrivacyViolation(ProgrammingError):
    """The query would release something no noise protects (raw rows, unbounded sums...)."""

    sqlstate = "42501"


class InvalidAuthorization(OperationalError):
    """Who is connecting is not an analyst of the policy."""

    sqlstate = "28000"


class ObjectInUse(OperationalError):
    """The object is in use by this very connection (removing the analyst connected)."""

    sqlstate = "55006"


class InvalidSqlStatementName(OperationalError):
    """No prepared statement has that name (or the name is empty)."""

    sqlstate = "26000"


class InvalidCursorName(OperationalError):
    """FETCH, MOVE or CLOSE of a cursor this connection has not declared (or that closed)."""

    sqlstate = "34000"


class ObjectNotInPrerequisiteState(OperationalError):
    """A cursor asked to move backward that was declared NO SCROLL."""

    sqlstate = "55000"


class DuplicateCursor(ProgrammingError):
    sqlstate = "42P03"


class NoActiveSqlTransaction(InternalError):
    """A statement that needs a transaction block (DECLARE without HOLD) outside one."""

    sqlstate = "25P01"


class ProgramLimitExceeded(OperationalError):
    """A limit of the server: the most rows a result may have, how deeply a query nests."""

    sqlstate = "54000"


class NotSupportedError(DatabaseError):
    """Valid SQL that dpproxy does not (yet) answer privately."""

    sqlstate = "0A000"


class InvalidPolicy(OperationalError):
    """A policy file does not validate; the message names file, field and what is allowed.
    An OperationalError, as PEP 249 classes a data source that cannot be opened (psycopg
    raises one for a bad connection string)."""

    sqlstate = "F0000"


def _all_subclasses(cls: type[Error]) -> list[type[Error]]:
    found: list[type[Error]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def lookup(sqlstate: str) -> type[Error]:
    """The most specific class for a SQLSTATE (Error when none is specific)."""
    for cls in _all_subclasses(Error):
        if cls.sqlstate == sqlstate:
            return cls
    return Error
