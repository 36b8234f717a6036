"""dpproxy: a differential-privacy gateway for SQL.

`dpproxy.connect(policy, analyst=...)` opens a DB-API 2.0 connection; see
`dpproxy.dbapi`. The data flow is one module per step: parse, analyze, plan,
rewrite, accountant (charge), backends (execute), release, session (respond).
"""

from .dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Binary,
    Connection,
    Cursor,
    DatabaseError,
    DataError,
    Date,
    DateFromTicks,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Time,
    TimeFromTicks,
    Timestamp,
    TimestampFromTicks,
    Warning,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)

__version__ = "0.1.0"

__all__ = [
    "BINARY", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor",
    "DataError", "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError",
    "InterfaceError", "InternalError", "NotSupportedError", "OperationalError",
    "ProgrammingError", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning",
    "__version__", "apilevel", "connect", "paramstyle", "threadsafety",
]
