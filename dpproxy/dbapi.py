"""DB-API 2.0 (PEP 249) over an in-process session.

    import dpproxy

    with dpproxy.connect("policies/demo.toml", analyst="alice") as conn:
        cur = conn.cursor()
        cur.execute("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
        print(cur.fetchall(), cur.accuracy)

Parameters use the `pyformat` style (`%s`, `%(name)s`) and are bound into the
parsed query as literals, never spliced into the SQL text. Every error is a
subclass of `dpproxy.Error` with a `sqlstate`.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import (
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)
from .parse import Parameters
from .release import ColumnAccuracy, Interval
from .session import Engine, Result, Session

apilevel = "2.0"
threadsafety = 1  # threads may share the module; give each thread its own connection
paramstyle = "pyformat"

__all__ = [
    "BINARY", "BOOLEAN", "DATETIME", "NUMBER", "ROWID", "STRING", "Binary", "Connection", "Cursor",
    "DataError", "DatabaseError", "Date", "DateFromTicks", "Error", "IntegrityError",
    "InterfaceError", "InternalError", "NotSupportedError", "OperationalError",
    "ProgrammingError", "Time", "TimeFromTicks", "Timestamp", "TimestampFromTicks", "Warning",
    "apilevel", "connect", "paramstyle", "threadsafety",
]


class _TypeObject:
    def __init__(self, *names: str) -> None:
        self.names = names

    def __eq__(self, other: object) -> bool:
        return other in self.names

    def __hash__(self) -> int:
        return hash(self.names)


STRING = _TypeObject("text")
NUMBER = _TypeObject("int8", "float8", "numeric")
BOOLEAN = _TypeObject("bool")
DATETIME = _TypeObject("date", "timestamp")
BINARY = _TypeObject("bytea")
ROWID = _TypeObject("oid")

Date = dt.date
Time = dt.time
Timestamp = dt.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> dt.date:
    return dt.date.fromtimestamp(ticks)


def TimeFromTicks(ticks: float) -> dt.time:
    return dt.datetime.fromtimestamp(ticks).time()


def TimestampFromTicks(ticks: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ticks)


class _Engines:
    """One engine per policy file in a process, shared by its connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[Path, tuple[Engine, int]] = {}

    def acquire(self, path: Path) -> Engine:
        with self._lock:
            engine, users = self._engines.get(path, (None, 0))
            if engine is None:
                engine = Engine.from_path(path)
            self._engines[path] = (engine, users + 1)
            return engine

    def release(self, path: Path) -> None:
        with self._lock:
            engine, users = self._engines[path]
            if users > 1:
                self._engines[path] = (engine, users - 1)
                return
            del self._engines[path]
        engine.close()


_engines = _Engines()


def connect(policy: str | Path, analyst: str, *, epsilon: float | None = None,
            delta: float | None = None, mechanism: str | None = None,
            confidence: float | None = None, split: str | None = None) -> Connection:
    """Open a connection for `analyst` under the policy file; options apply to every query
    (`split`: per-aggregate weights of the budget split, as `SET dpproxy.split` takes)."""
    path = Path(policy).resolve()
    engine = _engines.acquire(path)
    options = {k: v for k, v in (("epsilon", epsilon), ("delta", delta),
                                 ("mechanism", mechanism), ("confidence", confidence),
                                 ("split", split))
               if v is not None}
    try:
        session = engine.session(analyst, **options)
    except Error:
        _engines.release(path)
        raise
    return Connection(path, session)


class Connection:
    def __init__(self, path: Path, session: Session) -> None:
        self._path = path
        self._session: Session | None = session

    @property
    def session(self) -> Session:
        if self._session is None:
            raise InterfaceError("the connection is closed")
        return self._session

    @property
    def closed(self) -> bool:
        return self._session is None

    def cursor(self) -> Cursor:
        self.session  # noqa: B018 - raises on a closed connection
        return Cursor(self)

    def execute(self, sql: str | bytes, params: Parameters = None) -> Cursor:
        """Shortcut: a new cursor that has run `sql` (as in psycopg 3)."""
        return self.cursor().execute(sql, params)

    def commit(self) -> None:
        self.session  # noqa: B018 - raises on a closed connection
        # Nothing to commit: budget charges are durable before any answer is released.

    def rollback(self) -> None:
        self.session  # noqa: B018
        # A released answer cannot be taken back, and neither can its charge.

    def close(self) -> None:
        if self._session is not None:
            self._session = None
            _engines.release(self._path)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_session", None) is not None:
            self.close()


def unescape_percent(sql: str) -> str:
    """With parameters, pyformat spells a literal % as %% (as psycopg does)."""
    return sql.replace("%%", "%")


def _type_code(values: Sequence[Any]) -> str | None:
    for value in values:
        if value is None:
            continue
        if isinstance(value, bool):
            return "bool"
        if isinstance(value, int):
            return "int8"
        if isinstance(value, float):
            return "float8"
        if isinstance(value, dt.date):
            return "date"
        return "text"
    return None


_READERS: dict[str, Callable[[str], Any]] = {"date": dt.date.fromisoformat,
                                             "timestamp": dt.datetime.fromisoformat}


def _python_values(result: Result) -> list[tuple[Any, ...]]:
    """The result's rows as a PostgreSQL driver reads them: a date or timestamp column's
    ISO text as a datetime.date or datetime.datetime (psycopg does the same with dpproxy
    serve's columns)."""
    read = [(i, _READERS[name]) for i, name in enumerate(result.types) if name in _READERS]
    if not read:
        return result.rows

    def converted(row: tuple[Any, ...]) -> tuple[Any, ...]:
        values = list(row)
        for i, reader in read:
            if isinstance(values[i], str):
                values[i] = reader(values[i])
        return tuple(values)

    return [converted(row) for row in result.rows]


def _statement_text(sql: object) -> str:
    """The statement as text: a str, or bytes in UTF-8 (as psycopg takes them)."""
    if isinstance(sql, bytes):
        try:
            return sql.decode("utf-8")
        except UnicodeDecodeError:
            raise ProgrammingError("the statement is not valid UTF-8") from None
    if not isinstance(sql, str):
        raise ProgrammingError(f"the statement must be a str, not {type(sql).__name__}")
    return sql


class Cursor:
    arraysize = 1

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._result: Result | None = None
        self._python_rows: list[tuple[Any, ...]] | None = None  # of _result, as fetched
        self._position = 0
        self._closed = False

    # results --------------------------------------------------------------------------------
    @property
    def description(self) -> tuple[tuple[Any, ...], ...] | None:
        if self._result is None or not self._result.columns:
            return None
        types = self._result.types or tuple(
            _type_code([r[i] for r in self._result.rows]) for i in range(len(self._result.columns)))
        return tuple((name, type_code, None, None, None, None, None)
                     for name, type_code in zip(self._result.columns, types, strict=True))

    @property
    def rowcount(self) -> int:
        if self._result is None or not self._result.columns:
            return -1
        return len(self._result.rows)

    @property
    def accuracy(self) -> tuple[ColumnAccuracy | None, ...]:
        """Per output column: mechanism, noise scale, ε/δ, confidence half-width (or None)."""
        return self._result.accuracy if self._result else ()

    @property
    def intervals(self) -> list[tuple[Interval | None, ...]]:
        """Per row and column: the confidence interval of each noisy value (None for keys)."""
        return self._result.intervals if self._result else []

    @property
    def notices(self) -> list[str]:
        return self._result.notices if self._result else []

    @property
    def result(self) -> Result | None:
        """The whole last result, including what it cost and the budget left."""
        return self._result

    # execution ------------------------------------------------------------------------------
    def _check(self) -> Session:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        return self.connection.session

    def execute(self, sql: str | bytes, params: Parameters = None) -> Cursor:
        session = self._check()
        self._result = None
        sql = _statement_text(sql)
        if params is not None:
            sql = unescape_percent(sql)
        # grants edited in the policy file apply from the next statement, as on the server
        session.engine.refresh_analysts()
        self._result = session.execute(sql, params)
        self._python_rows = None
        self._position = 0
        return self

    def executemany(self, sql: str | bytes, seq_of_params: Sequence[Parameters]) -> Cursor:
        self._check()
        self._result = None  # no parameter sets: no result, as psycopg leaves it
        for params in seq_of_params:
            self.execute(sql, params)
        return self

    def _rows(self) -> list[tuple[Any, ...]]:
        self._check()
        if self._result is None or not self._result.columns:
            raise ProgrammingError("no results to fetch: execute a query first")
        if self._python_rows is None:
            self._python_rows = _python_values(self._result)
        return self._python_rows

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._rows()
        if self._position >= len(rows):
            return None
        self._position += 1
        return rows[self._position - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        rows = self._rows()
        count = self.arraysize if size is None else size
        chunk = rows[self._position:self._position + count]
        self._position += len(chunk)
        return chunk

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._rows()
        chunk = rows[self._position:]
        self._position = len(rows)
        return chunk

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass

    def close(self) -> None:
        self._closed = True
        self._result = None

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
