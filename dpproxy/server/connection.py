"""One client connection: startup, SCRAM authentication, simple and extended query.

Every statement goes, in order, to the admin commands (`admin`), the catalog
built from the policy (`catalog`), then the analyst's `Session`; nothing is
passed through to the backend. Statements run in the server's worker
threads (`jobs`), so one slow query never stalls other clients; while one
runs, the connection still reads its socket, to notice a client that leaves.
A cursor (`cursors`) is a portal the connection keeps: DECLARE sends its query
down that same path once, and FETCH and MOVE read the rows it kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import decimal
import functools
import ipaddress
import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import __version__, errors
from ..audit import AuditRecord
from ..parse import split_statements
from ..session import Description, Result
from . import admin, codec, cursors, paramtypes, prepared
from .codec import (
    BackendKeyData,
    Bind,
    Close,
    CloseComplete,
    CommandComplete,
    CopyData,
    CopyDone,
    CopyFail,
    Describe,
    EmptyQueryResponse,
    ErrorResponse,
    Execute,
    Field,
    Flush,
    FunctionCall,
    GSSENCRequest,
    Message,
    NegotiateProtocolVersion,
    NoData,
    ParameterDescription,
    ParameterStatus,
    Parse,
    ParseComplete,
    PasswordMessage,
    PortalSuspended,
    ProtocolViolation,
    Query,
    ReadyForQuery,
    RowDescription,
    SASLInitialResponse,
    SSLRequest,
    StartupMessage,
    Sync,
    Terminate,
)
from .jobs import Job, QueryCanceled
from .scram import MECHANISM, ScramError, ScramExchange, mock_verifier, parse_verifier

if TYPE_CHECKING:
    from ..session import Session
    from .server import Server

log = logging.getLogger("dpproxy.server")
T = TypeVar("T")

SERVER_VERSION = f"15.0 (dpproxy {__version__})"  # clients parse the leading number
AUTH_TIMEOUT_S = 60.0  # PostgreSQL's authentication_timeout
READ_SIZE = 256 * 1024
FLUSH_AT = 256 * 1024  # bytes of pending output that trigger a write mid-result


class ClientGone(Exception):
    """The client closed the connection (or it broke)."""


class IdleTimeout(Exception):
    """The client sent nothing for longer than the idle limit."""


class ServerError(errors.Error):
    """An error of the server layer, with its own SQLSTATE."""

    def __init__(self, sqlstate: str, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.sqlstate = sqlstate


class FatalError(ServerError):
    """An error that ends the connection (sent with severity FATAL)."""


def _transaction_words(text: str) -> tuple[str, str]:
    """The first two words of a statement, upper case: enough to track BEGIN/COMMIT/
    ROLLBACK [TO]. Only keywords are read, so splitting on whitespace is enough."""
    words = text.split(None, 2)
    first = words[0].upper().rstrip(";") if words else ""
    second = words[1].upper().rstrip(";") if len(words) > 1 else ""
    return first, second


@dataclass
class PreparedStatement:
    name: str
    sql: str  # the one statement ("" for an empty query)
    param_oids: tuple[int, ...]
    words: tuple[str, str]
    description: Description | None = None


@dataclass
class Portal:
    name: str
    statement: PreparedStatement
    params: list[Any]
    result_formats: tuple[int, ...]
    result: Result | None = None
    position: int = 0
    notices_sent: bool = False
    # a cursor (DECLARE): how it was declared, where it stands, whether a commit kept it
    cursor: cursors.Declare | None = None
    at: cursors.Position | None = None
    committed: bool = False


@dataclass(frozen=True)
class _Shape:
    fields: tuple[Field, ...]
    encoders: tuple[Callable[[Any], bytes | None], ...]
    row_description: bytes  # the RowDescription message, encoded


_DUMMY_VALUES: dict[int, Any] = {
    codec.INT2: 0, codec.INT4: 0, codec.INT8: 0, codec.OID: 0, codec.FLOAT4: 0.0,
    codec.FLOAT8: 0.0, codec.NUMERIC: decimal.Decimal(0), codec.BOOL: False,
    codec.DATE: dt.date(2000, 1, 1), codec.TIMESTAMP: dt.datetime(2000, 1, 1),
}


def _dummy_parameters(oids: Sequence[int]) -> list[Any] | None:
    """Values of the right types to describe a statement before its parameters are bound
    (an array: a list of one such value)."""
    return [_dummy_value(oid) for oid in oids] if oids else None


def _dummy_value(oid: int) -> Any:
    known = codec.TYPES_BY_OID.get(oid)
    if known is not None and known.element:
        return [_DUMMY_VALUES.get(known.element, "")]
    return _DUMMY_VALUES.get(oid, "")


def _formats(codes: Sequence[int], count: int) -> list[int]:
    if not codes:
        return [codec.TEXT] * count
    if len(codes) == 1:
        return [codes[0]] * count
    if len(codes) != count:
        raise ServerError("08P01", f"bind message has {len(codes)} result formats but query has "
                          f"{count} columns")
    return list(codes)


def _columns(names: Sequence[str], types: Sequence[str], formats: Sequence[int]) -> _Shape:
    """The fields and encoders of a result's columns (the same few shapes come again and
    again: remembered)."""
    return _column_shape(tuple(names), tuple(types), tuple(formats))


@functools.lru_cache(maxsize=256)
def _column_shape(names: tuple[str, ...], types: tuple[str, ...], formats: tuple[int, ...]
                  ) -> _Shape:
    fields, encoders = [], []
    for i, name in enumerate(names):
        pg = codec.pg_type(types[i] if i < len(types) else "text")
        fields.append(Field(name, pg.oid, pg.size, formats[i]))
        encoders.append(codec.value_encoder(pg.oid, formats[i]))
    return _Shape(tuple(fields), tuple(encoders), RowDescription(tuple(fields)).encode())


# Cursor statements that read no data: a string may hold any number of them
_CURSOR_WALKS = frozenset({"FETCH", "MOVE", "CLOSE"})


@functools.lru_cache(maxsize=1024)
def _statement_texts(sql: str) -> tuple[str, ...]:
    """The statements of a string (`split_statements`), remembered by text: clients parse
    the same few strings again and again."""
    return tuple(piece[0] for piece in split_statements(sql))


def _loopback(peer: Any) -> bool:
    try:
        return ipaddress.ip_address(peer[0]).is_loopback
    except (TypeError, ValueError, IndexError):
        return False  # a Unix socket or an unknown peer is never trusted


def _startup_options(parameters: dict[str, str]) -> dict[str, str]:
    """dpproxy.* settings from the startup packet: as parameters of their own, or in
    `options` as `-c name=value` / `--name=value` (what libpq's PGOPTIONS sends)."""
    found = {k: v for k, v in parameters.items() if k.lower().startswith("dpproxy.")}
    try:
        words = shlex.split(parameters.get("options", ""))
    except ValueError:
        raise FatalError("22023", "invalid options in the startup packet") from None
    pending_c = False
    for word in words:
        if word == "-c":
            pending_c = True
            continue
        setting = word[2:] if word.startswith("--") else word[2:] if word.startswith("-c") \
            else word if pending_c else ""
        pending_c = False
        name, sep, value = setting.partition("=")
        if sep and name.lower().startswith("dpproxy."):
            found[name] = value
    return found


class ClientConnection:
    """The state of one client: its session, catalog, prepared statements and portals."""

    def __init__(self, server: Server, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self._reader, self._writer = reader, writer
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._peeked: tuple[Any, int] | None = None  # the buffer's first message, parsed
        self._out = bytearray()
        self._read_task: asyncio.Future[bytes] | None = None
        self._eof = False
        self.peer = writer.get_extra_info("peername")
        self.tls = False
        self.process_id = 0
        self.secret_key = 0
        self.user = ""
        self._session: Session | None = None
        self._catalog: Any = None
        self._role = "analyst"
        self._status = "I"
        self._skip_until_sync = False
        self._statements: dict[str, PreparedStatement] = {}
        self._portals: dict[str, Portal] = {}
        self._job: Job | None = None
        self._future: asyncio.Future[Any] | None = None  # the running job's outcome
        self._orphan: asyncio.Future[Any] | None = None
        self._idle = False
        self.stopping = False
        self.task: asyncio.Task[None] | None = None

    # I/O ------------------------------------------------------------------------------------
    def _send(self, message: Message) -> None:
        self._out += message.encode()

    async def _flush(self) -> None:
        if not self._out:
            return
        data = bytes(self._out)
        self._out.clear()
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            raise ClientGone from None

    def _pending_read(self) -> asyncio.Future[bytes]:
        if self._read_task is None:
            self._read_task = asyncio.ensure_future(self._reader.read(READ_SIZE))
        return self._read_task

    def _consume_read(self) -> None:
        task, self._read_task = self._read_task, None
        assert task is not None and task.done()
        try:
            data = task.result()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            data = b""
        if data:
            self._buffer += data
        else:
            self._eof = True

    async def _next_message(self, parse: Callable[[bytearray], tuple[Any, int]],
                            timeout: float | None) -> Any:
        while True:
            if self._peeked is not None and parse is codec.parse_frontend:
                (message, used), self._peeked = self._peeked, None  # read by a peek
            else:
                message, used = parse(self._buffer)
            if message is not None:
                del self._buffer[:used]
                return message
            if self._eof:
                if self._buffer:
                    log.info("connection %s: closed mid-message (%d bytes pending)",
                             self.peer, len(self._buffer))
                raise ClientGone
            await self._flush()
            read = self._pending_read()
            self._idle = not self._buffer
            try:
                done = await self._await_read(read, timeout)
            finally:
                self._idle = False
            if not done:
                raise IdleTimeout
            self._consume_read()

    async def _await_read(self, read: asyncio.Future[bytes], timeout: float | None) -> bool:
        """Wait at most `timeout` seconds for the pending read (never cancelling it);
        whether it is done."""
        if not read.done():
            await _first_done(self._loop, [read],
                              None if timeout is None else self._loop.time() + timeout)
        return read.done()

    # lifecycle --------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if await self._startup():
                await self._serve()
        except ClientGone:
            log.info("connection %s (%s): client went away", self.peer, self.user or "-")
        except IdleTimeout:
            await self._fatal(
                FatalError("57P05", "terminating connection due to idle-session timeout")
                if self._session is not None else
                FatalError("57014", "canceling authentication due to timeout"))
        except (FatalError, ProtocolViolation) as exc:
            await self._fatal(exc)
        except (asyncio.CancelledError, QueryCanceled) as exc:
            if isinstance(exc, QueryCanceled) and not self.stopping:
                # only the session's setup lets this through: its statement timeout
                await self._fatal(FatalError(exc.sqlstate, exc.message))
            else:  # server shutdown: tell the client why, as PostgreSQL does
                await self._fatal(FatalError("57P01", "terminating connection due to "
                                             "administrator command"))
        except Exception:
            log.exception("connection %s: internal error", self.peer)
            await self._fatal(FatalError("XX000", "internal error"))
        finally:
            if self._read_task is not None:
                self._read_task.cancel()
            if self._catalog is not None:
                with contextlib.suppress(Exception):
                    self._catalog.close()
            self.server.release(self)
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                self._writer.close()

    async def _fatal(self, exc: errors.Error) -> None:
        log.info("connection %s (%s): %s %s", self.peer, self.user or "-", exc.sqlstate,
                 exc.message)
        self._send(ErrorResponse.from_error(exc, "FATAL"))
        with contextlib.suppress(TimeoutError, ClientGone):
            await asyncio.wait_for(self._flush(), timeout=5)

    def cancel(self) -> None:
        """A CancelRequest for this connection: stop the running statement unless it has
        been charged (then it finishes and is delivered). A queued job stops as it starts,
        a running one at its charge; the thread is never abandoned, so the session never
        runs two statements at once."""
        if self._job is not None:
            self._stop(self._job)

    def _stop(self, job: Job, reason: str | None = None) -> bool:
        """Cancel `job` unless it is being charged (True: it will stop); a catalog query
        reads nothing private and is interrupted at once, where its thread would otherwise
        run on after a timeout or a departed client, holding a statement thread."""
        if not job.try_cancel(reason):
            return False
        if self._catalog is not None and self._future is not None:
            self._keep_interrupting(self._catalog, self._future)
        return True

    def _keep_interrupting(self, catalog: Any, future: asyncio.Future[Any]) -> None:
        """Interrupt the catalog until the stopped statement is done: an interrupt reaches
        only a query DuckDB is running, and one stopped just before it starts would run
        whole (the catalog checks the job first, this closes the moment in between)."""
        if future.done():
            return
        catalog.interrupt()
        self._loop.call_later(0.05, self._keep_interrupting, catalog, future)

    def shutdown(self) -> None:
        """Server shutdown: stop now if idle, after the running statement otherwise;
        a statement not yet charged is cancelled."""
        self.stopping = True
        if self._job is not None:
            self._stop(self._job, "canceling statement due to server shutdown")
        if self._idle and self.task is not None:
            self.task.cancel()

    # startup ----------------------------------------------------------------------------------
    async def _raw(self, data: bytes) -> None:
        self._out += data
        await self._flush()

    async def _startup(self) -> bool:
        ssl_answered = gss_answered = False
        while True:
            packet = await self._next_message(codec.parse_startup, AUTH_TIMEOUT_S)
            if isinstance(packet, SSLRequest):
                if ssl_answered:
                    raise ProtocolViolation("duplicate SSLRequest")
                ssl_answered = True
                if self._buffer:  # bytes sent before the TLS handshake could be injected
                    raise ProtocolViolation("received unencrypted data after SSL request")
                if self.server.ssl_context is None:
                    await self._raw(b"N")
                    continue
                await self._raw(b"S")
                try:
                    await self._writer.start_tls(self.server.ssl_context)
                except (ConnectionError, OSError) as exc:
                    log.info("connection %s: TLS handshake failed: %s", self.peer, exc)
                    raise ClientGone from None
                self.tls = True
                continue
            if isinstance(packet, GSSENCRequest):
                if gss_answered or self.tls:
                    raise ProtocolViolation("unexpected GSSENCRequest")
                gss_answered = True
                if self._buffer:  # as after SSLRequest: PostgreSQL refuses it alike
                    raise ProtocolViolation("received unencrypted data after GSSAPI "
                                            "encryption request")
                await self._raw(b"N")
                continue
            if isinstance(packet, codec.CancelRequest):
                self.server.cancel(packet.process_id, packet.secret_key)
                return False
            assert isinstance(packet, StartupMessage)
            return await self._start_session(packet)

    async def _start_session(self, startup: StartupMessage) -> bool:
        if startup.major != 3:
            raise FatalError("0A000", f"unsupported frontend protocol {startup.major}."
                             f"{startup.minor}: server supports 3.0 to 3.0")
        parameters = startup.parameters
        unknown_options = tuple(k for k in parameters if k.startswith("_pq_."))
        if startup.minor != 0 or unknown_options:
            self._send(NegotiateProtocolVersion(0, unknown_options))
        user = parameters.get("user", "")
        if not user:
            raise FatalError("28000", "no PostgreSQL user name specified in startup packet")
        self.user = user
        if parameters.get("replication", "false").lower() not in ("false", "off", "no", "0"):
            raise FatalError("0A000", "replication connections are not supported")
        if not self.server.admit(self):
            raise FatalError("53300", "sorry, too many clients already",
                             hint=f"server.max_connections is "
                                  f"{self.server.settings.max_connections}")
        settings = self.server.settings
        if settings.require_tls and not self.tls:
            raise FatalError("28000", f"connection for user \"{user}\" requires TLS",
                             hint="connect with sslmode=require")
        await self._refresh_analysts()
        await self._authenticate(user)
        database = parameters.get("database") or user
        policy = self.server.engine.policy
        if database != policy.database:
            raise FatalError("3D000", f"database \"{database}\" does not exist",
                             hint=f"this server serves database \"{policy.database}\"")
        analyst = policy.analysts[user]
        self._role = analyst.role
        self._session = self.server.engine.session(user)
        self._session.max_result_rows = self.server.settings.max_result_rows
        if parameters.get("application_name"):  # for SHOW and current_setting()
            self._session.client_settings["application_name"] = parameters["application_name"]
        try:
            for name, value in _startup_options(parameters).items():
                self._session.set_option(name, value)
        except errors.Error as exc:
            raise FatalError(exc.sqlstate, exc.message, hint=exc.hint) from None
        # The catalog reads the session's client settings (SHOW, current_setting) and
        # writes them (set_config), so both see one set.
        self._catalog = await self._call(functools.partial(
            self.server.catalog_factory, policy, analyst, database=database, user=user,
            server_version=SERVER_VERSION, settings=self._session.client_settings,
            backend_pid=self.process_id))
        statuses = {
            "application_name": parameters.get("application_name", ""),
            "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
            "default_transaction_read_only": "on", "in_hot_standby": "off",
            "integer_datetimes": "on", "IntervalStyle": "postgres", "is_superuser": "off",
            "server_encoding": "UTF8", "server_version": SERVER_VERSION,
            "session_authorization": user, "standard_conforming_strings": "on",
            "TimeZone": "UTC",
        }
        for name, value in statuses.items():
            self._send(ParameterStatus(name, value))
        self._send(BackendKeyData(self.process_id, self.secret_key))
        self._send(ReadyForQuery(self._status))
        await self._flush()
        log.info("connection %s: %s connected%s", self.peer, user, " over TLS" if self.tls
                 else "")
        return True

    async def _authenticate(self, user: str) -> None:
        """SCRAM-SHA-256 (or trust from loopback, when the policy says so); raises
        FatalError 28P01 on any failure."""
        policy = self.server.engine.policy
        known = user in policy.analysts
        if known and self.server.settings.trust_loopback and _loopback(self.peer):
            self._send(codec.Authentication(codec.AUTH_OK))
            return
        text = await self._call(self.server.credentials.verifier, user) if known else None
        verifier = None
        if text is not None:
            try:
                verifier = parse_verifier(text)
            except ValueError:
                log.error("the stored verifier of %s is malformed", user)
        if known and text is None:
            log.info("%s has no password: set one with `dpproxy analyst passwd %s`", user, user)
        # An unknown user or one without a password goes through the same exchange with a
        # verifier nothing matches, so the answer does not say which part was wrong.
        exchange = ScramExchange(verifier or mock_verifier(user, self.server.secret),
                                 valid=verifier is not None)
        self._send(codec.Authentication.sasl([MECHANISM]))
        message = await self._next_message(codec.parse_frontend, AUTH_TIMEOUT_S)
        if not isinstance(message, PasswordMessage):
            raise ProtocolViolation("expected a SASLInitialResponse")
        initial = SASLInitialResponse.from_password_message(message)
        if initial.mechanism != MECHANISM:
            raise ProtocolViolation("client selected an invalid SASL authentication mechanism")
        try:
            self._send(codec.Authentication(codec.AUTH_SASL_CONTINUE,
                                            exchange.first(initial.response or b"")))
            message = await self._next_message(codec.parse_frontend, AUTH_TIMEOUT_S)
            if not isinstance(message, PasswordMessage):
                raise ProtocolViolation("expected a SASLResponse")
            final = exchange.final(message.data)
        except ScramError as exc:
            log.info("connection %s: authentication of %r failed: %s", self.peer, user, exc)
            raise FatalError("28P01", f"password authentication failed for user \"{user}\"") \
                from None
        self._send(codec.Authentication(codec.AUTH_SASL_FINAL, final))
        self._send(codec.Authentication(codec.AUTH_OK))

    # running statements off the loop ----------------------------------------------------------
    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in a worker thread as a cancellable job, bounded by the statement
        timeout, while watching the socket for a client that leaves."""
        if self._orphan is not None:
            # A statement abandoned by a timeout may still be running in its thread; the
            # session runs one statement at a time.
            await asyncio.wait({self._orphan})
            self._orphan = None
        job = Job()
        future = self.server.executor.submit(self._loop, job.run, fn, *args)
        future.add_done_callback(_retrieve)
        self._job, self._future = job, future
        try:
            return await self._await_job(job, future)
        finally:
            self._job = self._future = None

    async def _await_job(self, job: Job, future: asyncio.Future[T]) -> T:
        timeout = self.server.settings.statement_timeout_s or None
        deadline = self._loop.time() + timeout if timeout else None
        while True:
            read = None if self._eof else self._pending_read()
            if not future.done() and not (read is not None and read.done()):
                # woken by whichever comes first: the result, the client, the deadline
                await _first_done(self._loop, [future] if read is None else [future, read],
                                  deadline)
            if future.done():
                if job.cancelled and not job.charged:
                    raise QueryCanceled(job.reason, detail="nothing was charged")
                return future.result()
            if read is not None and read.done():
                self._consume_read()
                if self._eof:
                    # The client left mid-statement: stop it unless it is being charged.
                    self._stop(job, "client disconnected")
                    self._orphan = future
                    raise ClientGone
                continue
            charged = not self._stop(job, "canceling statement due to statement timeout")
            self._orphan = future  # the next statement waits for this one's thread
            raise QueryCanceled(
                "canceling statement due to statement timeout",
                detail="the query had already been charged: it finishes, and repeating it "
                       "returns its answer at no further cost" if charged
                else "nothing was charged",
                hint=f"server.statement_timeout_s is {timeout:g}")

    def _run_statement(self, text: str, params: list[Any] | None) -> Result:
        """Worker thread: admin command, catalog query, or the session (which writes its own
        audit records; the other two are audited here)."""
        assert self._session is not None
        try:
            command = admin.command(text, params)
            if command is not None:
                result = admin.run(command, self.server.engine, self.user, self._role,
                                   self.server.credentials)
                self._audit(text, "admin", rows=len(result.rows))
                return result
            answer = self._catalog.answer(text, params) if self._catalog is not None else None
        except errors.Error as exc:  # a refused admin command above all: who tried what
            self._audit(text, "rejected", sqlstate=exc.sqlstate)
            raise
        if answer is not None:
            self._audit(text, "catalog", rows=len(answer.rows))
            return answer
        return self._session.execute(text, params)

    def _audit(self, text: str, outcome: str, **extra: Any) -> None:
        self.server.engine.audit.write(AuditRecord(analyst=self.user, statement=text,
                                                   outcome=outcome, **extra))

    def _describe_statement(self, text: str, oids: Sequence[int],
                            params: list[Any] | None) -> Description:
        """Worker thread: the result shape, without running or charging anything."""
        assert self._session is not None
        values = params if params is not None else _dummy_parameters(oids)
        command = admin.command(text, values)
        if command is not None:
            return admin.describe(command, self._role, self.user)
        if self._catalog is not None:
            described = self._catalog.describe(text)
            if described is not None:
                return described
        return self._session.describe(text, values)

    async def _run(self, text: str, words: tuple[str, str], params: list[Any] | None
                   ) -> Result:
        """Run one statement, keeping the transaction status as PostgreSQL would."""
        first, second = words
        if self._status == "E":
            if first in ("COMMIT", "END") or (first in ("ROLLBACK", "ABORT")
                                              and second != "TO"):
                self._status = "I"
                self._end_transaction(committed=False)
                return Result(tag="ROLLBACK")
            if not (first == "ROLLBACK" and second == "TO"):
                raise ServerError("25P02", "current transaction is aborted, commands ignored until "
                                  "end of transaction block")
        cursor = cursors.parse(text) if first in cursors.WORDS else None
        if cursor is not None:
            return await self._cursor_statement(cursor, params)
        if first == "DEALLOCATE":
            return self._deallocate(cursors.deallocated(text))
        sql_prepared = prepared.parse(text) if first in prepared.WORDS else None
        if isinstance(sql_prepared, prepared.Prepare):
            self._prepare_sql(sql_prepared)
            return Result(tag="PREPARE")
        if isinstance(sql_prepared, prepared.ExecutePrepared):
            statement = self._executed(sql_prepared)
            values = self._sql_parameters(statement, sql_prepared.params)
            return await self._run(statement.sql, statement.words, values or None)
        result = self._within_limit(await self._call(self._run_statement, text, params))
        if first in ("BEGIN", "START"):
            if self._status == "T":
                result.notices.insert(0, "there is already a transaction in progress")
            self._status = "T"
        elif first in ("COMMIT", "END", "ABORT") or (first == "ROLLBACK" and second != "TO"):
            self._status = "I"
            self._end_transaction(committed=first in ("COMMIT", "END"))
        elif first == "ROLLBACK" and self._status == "E":
            self._status = "T"
        return result

    def _within_limit(self, result: Result) -> Result:
        limit = self.server.settings.max_result_rows
        if len(result.rows) > limit:
            charged = (f"; the query was charged (ε={result.cost.epsilon:g}) and its result "
                       "is withheld") if result.cost is not None else ""
            raise ServerError("54000", f"the result has {len(result.rows)} rows, more than this "
                              f"server allows ({limit}){charged}",
                              hint="add LIMIT, or raise server.max_result_rows in the policy")
        return result

    # cursors ------------------------------------------------------------------------------------
    async def _cursor_statement(self, statement: cursors.CursorStatement,
                                params: list[Any] | None) -> Result:
        """DECLARE answers its query (charged as if sent alone) and keeps the rows; FETCH
        and MOVE walk them; CLOSE forgets them. See `cursors`."""
        if isinstance(statement, cursors.Declare):
            if statement.name in self._portals:
                raise errors.DuplicateCursor(f"cursor \"{statement.name}\" already exists")
            if not statement.hold and self._status != "T":
                raise errors.NoActiveSqlTransaction(
                    "DECLARE CURSOR can only be used in transaction blocks",
                    hint="send BEGIN first, or declare it WITH HOLD")
            text = statement.query
            result = self._within_limit(await self._call(self._run_statement, text, params))
            self._portals[statement.name] = Portal(
                statement.name, PreparedStatement("", text, (), _transaction_words(text)),
                [], (), result=result, notices_sent=True, cursor=statement,
                at=cursors.Position())
            return Result(tag="DECLARE CURSOR", notices=result.notices)
        if isinstance(statement, cursors.CloseCursor):
            if statement.name is None:
                self._portals = {k: p for k, p in self._portals.items() if p.cursor is None}
                return Result(tag="CLOSE CURSOR ALL")
            self._cursor(statement.name)
            del self._portals[statement.name]
            return Result(tag="CLOSE CURSOR")
        portal = self._cursor(statement.name)
        assert portal.result is not None and portal.at is not None and portal.cursor is not None
        answered = portal.result
        picked = cursors.fetch(statement, portal.at, len(answered.rows), portal.cursor.scroll)
        tag = cursors.tag(statement, len(picked))
        if statement.move:
            return Result(tag=tag)
        return Result(answered.columns, [answered.rows[i] for i in picked], tag, answered.types)

    def _cursor(self, name: str) -> Portal:
        portal = self._portals.get(name)
        if portal is None or portal.cursor is None:
            raise errors.InvalidCursorName(f"cursor \"{name}\" does not exist")
        return portal

    def _end_transaction(self, committed: bool, portals: bool = False) -> None:
        """A transaction ends: its cursors close, but for those declared WITH HOLD that a
        commit keeps (ones committed earlier survive a rollback too). `portals`: the
        protocol's portals close too (at the end of an implicit transaction; within a
        batch of extended-protocol messages, those after a COMMIT still name theirs)."""
        kept = {}
        for name, portal in self._portals.items():
            if portal.cursor is None:
                if not portals:
                    kept[name] = portal
            elif portal.cursor.hold and (committed or portal.committed):
                portal.committed = True
                kept[name] = portal
        self._portals = kept

    # messages ---------------------------------------------------------------------------------
    def _send_error(self, exc: BaseException) -> None:
        if isinstance(exc, errors.Error):
            self._send(ErrorResponse.from_error(exc))
        else:
            log.error("connection %s (%s): internal error", self.peer, self.user,
                      exc_info=exc)
            self._send(ErrorResponse.build("ERROR", "XX000", "internal error"))
        if self._status == "T":
            self._status = "E"

    def _send_notices(self, result: Result) -> None:
        for note in result.notices:
            self._out += codec.notice_bytes(note)

    async def _send_rows(self, rows: Sequence[Sequence[Any]], columns: _Shape) -> None:
        encoders = columns.encoders
        for row in rows:
            self._out += codec.data_row_bytes(
                [enc(v) for enc, v in zip(encoders, row, strict=True)])
            if len(self._out) > FLUSH_AT:
                await self._flush()

    async def _refresh_analysts(self) -> None:
        """Analysts added to or removed from the policy file since it was read."""
        engine = self.server.engine
        if engine.analysts_stale():
            await self._call(engine.refresh_analysts)

    async def _still_an_analyst(self) -> None:
        """Before a statement: the connection ends once its analyst left the policy, and
        takes a changed role (the session takes changed grants itself)."""
        await self._refresh_analysts()
        analyst = self.server.engine.policy.analysts.get(self.user)
        if analyst is None:
            raise FatalError("28000", f"terminating connection: analyst \"{self.user}\" was "
                             "removed from the policy")
        self._role = analyst.role

    async def _serve(self) -> None:
        while True:
            if self.stopping:
                raise FatalError("57P01", "terminating connection due to administrator command")
            message = await self._next_message(
                codec.parse_frontend, self.server.settings.idle_timeout_s or None)
            if isinstance(message, Terminate):
                return
            if self._skip_until_sync and not isinstance(message, Sync):
                continue  # after an error in the extended protocol, up to the next Sync
            # Bind: a prepared statement's run; Execute: a portal bound before a revocation
            if isinstance(message, Query | Parse | Bind | Execute):
                await self._still_an_analyst()
            if isinstance(message, Query):
                await self._simple_query(message.sql)
            elif isinstance(message, Parse | Bind | Describe | Execute | Close):
                try:
                    await self._extended(message)
                except (errors.Error, ValueError) as exc:
                    self._send_error(exc)
                    self._skip_until_sync = True
            elif isinstance(message, Sync):
                if self._status == "I":  # the implicit transaction ends: portals close
                    self._end_transaction(committed=not self._skip_until_sync, portals=True)
                self._skip_until_sync = False
                self._send(ReadyForQuery(self._status))
                await self._flush()
            elif isinstance(message, Flush):
                await self._flush()
            elif isinstance(message, FunctionCall):
                self._send_error(errors.NotSupportedError("the function call protocol is not "
                                                          "supported"))
                self._send(ReadyForQuery(self._status))
            elif isinstance(message, CopyData | CopyDone | CopyFail):
                continue  # PostgreSQL ignores these outside COPY, which never starts here
            else:
                raise ProtocolViolation(f"unexpected message type {message.code.decode()!r}")

    # simple query -----------------------------------------------------------------------------
    async def _simple_query(self, sql: str) -> None:
        self._statements.pop("", None)
        self._portals.pop("", None)
        try:
            pieces = list(_statement_texts(sql))
            if len(pieces) > 1:
                await self._check_multi(pieces)
        except errors.Error as exc:
            self._send_error(exc)
            pieces = None
        if pieces == []:
            self._send(EmptyQueryResponse())
        failed = pieces is None
        for text in pieces or ():
            try:
                result = await self._run(text, _transaction_words(text), None)
            except (errors.Error, ValueError) as exc:
                self._send_error(exc)
                failed = True
                break  # the rest of the string is skipped, as in PostgreSQL
            self._send_notices(result)
            if result.columns:
                columns = _columns(result.columns, result.types, [codec.TEXT] * len(
                    result.columns))
                self._out += columns.row_description
                await self._send_rows(result.rows, columns)
            self._send(CommandComplete(result.tag))
        if self._status == "I":
            self._end_transaction(committed=not failed, portals=True)
        self._send(ReadyForQuery(self._status))
        await self._flush()

    async def _check_multi(self, pieces: list[str]) -> None:
        """Several statements in one string: allowed when all but at most one are session
        statements (SPEC §4), as the session decides for itself."""
        from ..parse import parse_statements

        def queries() -> int:
            count = 0
            for text in pieces:
                if _transaction_words(text)[0] in _CURSOR_WALKS:
                    continue  # walks rows answered already
                try:
                    is_session = parse_statements(text)[0].is_session_statement
                except errors.Error:
                    is_session = False
                count += not is_session
            return count

        if await self._call(queries) > 1:
            raise errors.NotSupportedError(
                "several queries in one string are not supported",
                hint="send one query at a time; each is charged separately")

    # extended query ---------------------------------------------------------------------------
    async def _extended(self, message: Message) -> None:
        if isinstance(message, Parse):
            self._parse(message)
        elif isinstance(message, Bind):
            self._bind(message)
        elif isinstance(message, Describe):
            await self._describe(message)
        elif isinstance(message, Execute):
            await self._execute(message)
        elif isinstance(message, Close):
            if message.kind == "S":
                self._drop_statement(message.name)
            else:
                self._portals.pop(message.name, None)
            self._send(CloseComplete())

    def _drop_statement(self, name: str) -> bool:
        """Drop a prepared statement and its portals; whether there was one."""
        statement = self._statements.pop(name, None)
        if statement is None:
            return False
        self._portals = {k: p for k, p in self._portals.items() if p.statement is not statement}
        return True

    def _deallocate(self, name: str | None) -> Result:
        """DEALLOCATE name (or ALL): SQL's Close of a prepared statement, as psqlODBC sends
        it before it prepares again under the same name."""
        if name is None:
            for each in [n for n in self._statements if n]:
                self._drop_statement(each)
            return Result(tag="DEALLOCATE ALL")
        if not name or not self._drop_statement(name):
            raise ServerError("26000", f"prepared statement \"{name}\" does not exist")
        return Result(tag="DEALLOCATE")

    def _parse(self, message: Parse) -> None:
        self._keep_statement(message.name, message.sql, message.param_oids)
        self._send(ParseComplete())

    def _keep_statement(self, name: str, sql: str, declared: Sequence[int]) -> None:
        """A prepared statement, from Parse or SQL's PREPARE: its parameter types as
        declared, the rest inferred."""
        if name and name in self._statements:
            raise ServerError("42P05", f"prepared statement \"{name}\" already exists")
        texts = _statement_texts(sql)
        if len(texts) > 1:
            raise errors.SyntaxError("cannot insert multiple commands into a prepared "
                                     "statement")
        text = texts[0] if texts else ""
        count = max(paramtypes.count_parameters(text), len(declared))
        oids = list(declared) + [0] * (count - len(declared))
        if 0 in oids:
            oids = [o or inferred for o, inferred in zip(oids, self._infer(text, count),
                                                         strict=True)]
        self._statements[name] = PreparedStatement(name, text, tuple(oids),
                                                   _transaction_words(text))

    def _prepare_sql(self, statement: prepared.Prepare) -> None:
        """SQL's PREPARE: the statement kept as a Parse message would keep it."""
        oids = []
        for name in statement.types:
            found = codec.find_type(name)
            if found is None:
                raise errors.UndefinedObject(f"type \"{name}\" does not exist")
            oids.append(found.oid)
        self._keep_statement(statement.name, statement.query, oids)

    def _executed(self, execute: prepared.ExecutePrepared) -> PreparedStatement:
        """The statement EXECUTE names; never another EXECUTE or PREPARE, which a Parse
        message could keep (`EXECUTE a` kept as a would run itself forever)."""
        statement = self._statement(execute.name)
        if statement.words[0] in prepared.WORDS:
            raise errors.SyntaxError(f"prepared statement \"{statement.name}\" is not a query",
                                     hint="EXECUTE runs a query kept by PREPARE or Parse")
        return statement

    @staticmethod
    def _sql_parameters(statement: PreparedStatement, texts: Sequence[str | None]
                        ) -> list[Any]:
        """EXECUTE's constants as a Bind of their text forms would give them."""
        oids = statement.param_oids
        if len(texts) != len(oids):
            raise errors.SyntaxError(
                f"wrong number of parameters for prepared statement \"{statement.name}\"",
                detail=f"Expected {len(oids)} parameters but got {len(texts)}.")
        return [codec.decode_parameter(None if t is None else t.encode(), oid, codec.TEXT,
                                       i + 1)
                for i, (t, oid) in enumerate(zip(texts, oids, strict=True))]

    def _infer(self, text: str, count: int) -> list[int]:
        """Parameter types the client left open: the catalog's for a catalog statement,
        else from the policy's column types."""
        assert self._session is not None
        if _transaction_words(text)[0] == "DECLARE":
            declared = cursors.parse(text)
            if isinstance(declared, cursors.Declare):
                text = declared.query
        types = None
        if self._catalog is not None and hasattr(self._catalog, "parameter_types"):
            types = self._catalog.parameter_types(text)
        if types is not None and len(types) >= count:
            return [codec.pg_type(t).oid for t in types[:count]]
        return paramtypes.infer(text, count, self.server.engine.policy, self._session.analyst)

    def _statement(self, name: str) -> PreparedStatement:
        statement = self._statements.get(name)
        if statement is None:
            raise ServerError("26000", f"prepared statement \"{name}\" does not exist")
        return statement

    def _portal(self, name: str) -> Portal:
        portal = self._portals.get(name)
        if portal is None:
            raise ServerError("34000", f"portal \"{name}\" does not exist")
        return portal

    def _bind(self, message: Bind) -> None:
        for code in (*message.param_formats, *message.result_formats):
            if code not in (codec.TEXT, codec.BINARY):
                raise ServerError("22023", f"unsupported format code: {code}")
        statement = self._statement(message.statement)
        if message.portal and message.portal in self._portals:
            raise ServerError("42P03", f"portal \"{message.portal}\" already exists")
        oids = statement.param_oids
        if len(message.params) != len(oids):
            raise ServerError("08P01", f"bind message supplies {len(message.params)} parameters, "
                              f"but prepared statement \"{statement.name}\" requires {len(oids)}")
        if len(message.param_formats) not in (0, 1, len(oids)):
            raise ServerError("08P01", f"bind message has {len(message.param_formats)} parameter "
                              f"formats but {len(oids)} parameters")
        formats = _formats(message.param_formats, len(oids)) if oids else []
        values = [codec.decode_parameter(raw, oid, fmt, i + 1)
                  for i, (raw, oid, fmt) in enumerate(zip(message.params, oids, formats,
                                                          strict=True))]
        self._portals[message.portal] = Portal(message.portal, statement, values,
                                               message.result_formats)
        self._send(codec.BindComplete())

    def _next_is_execute(self, portal: str) -> bool:
        """Whether the client already sent Execute for this portal right after Describe
        (psycopg pipelines both): then the statement runs once, not described and run."""
        try:
            peeked = codec.parse_frontend(self._buffer)
        except ProtocolViolation:
            return False
        following = peeked[0]
        if following is not None:
            self._peeked = peeked  # the front of the buffer: the next read takes it as is
        return isinstance(following, Execute) and following.portal == portal

    async def _describe(self, message: Describe) -> None:
        if message.kind == "S":
            statement = self._statement(message.name)
            if statement.description is None:
                statement.description = await self._shape(statement, None)
            shape = statement.description
            formats = [codec.TEXT] * len(shape.columns)
            # sent after the shape is known: a rejected statement answers with its error only
            self._send(ParameterDescription(statement.param_oids))
        else:
            portal = self._portal(message.name)
            if portal.result is None and self._next_is_execute(portal.name) \
                    and portal.statement.sql:
                await self._check_result_formats(portal)
                await self._run_portal(portal)
            if portal.result is not None:
                shape = Description(portal.result.columns, portal.result.types)
            else:
                shape = await self._shape(portal.statement, portal.params)
            formats = _formats(portal.result_formats, len(shape.columns))
        if shape.columns:
            self._out += _columns(shape.columns, shape.types, formats).row_description
        else:
            self._send(NoData())

    async def _shape(self, statement: PreparedStatement, params: list[Any] | None
                     ) -> Description:
        if not statement.sql:
            return Description((), ())
        if statement.words[0] in prepared.WORDS:
            sql_prepared = prepared.parse(statement.sql)
            if isinstance(sql_prepared, prepared.ExecutePrepared):  # the kept statement's
                target = self._executed(sql_prepared)
                return await self._shape(target, self._sql_parameters(target,
                                                                      sql_prepared.params))
            return Description((), ())
        if statement.words[0] in cursors.WORDS:
            cursor = cursors.parse(statement.sql)
            if isinstance(cursor, cursors.Fetch) and not cursor.move:
                answered = self._cursor(cursor.name).result
                assert answered is not None
                return Description(answered.columns, answered.types)
            if cursor is not None:
                return Description((), ())
        return await self._call(self._describe_statement, statement.sql, statement.param_oids,
                                params)

    async def _check_result_formats(self, portal: Portal) -> None:
        """One format per column, checked before the query runs (and is charged), as
        PostgreSQL checks it at Bind: against the shape analysis gives for free."""
        if len(portal.result_formats) > 1:
            shape = portal.statement.description \
                or await self._shape(portal.statement, portal.params)
            _formats(portal.result_formats, len(shape.columns))

    async def _run_portal(self, portal: Portal) -> None:
        portal.result = await self._run(portal.statement.sql, portal.statement.words,
                                        portal.params or None)

    async def _execute(self, message: Execute) -> None:
        portal = self._portal(message.portal)
        if portal.cursor is not None:  # a declared cursor run by name: its next rows
            assert portal.result is not None
            fetched = await self._cursor_statement(cursors.Fetch(
                portal.name, "forward", message.max_rows or None), None)
            await self._send_rows(fetched.rows, _columns(
                fetched.columns, fetched.types,
                _formats(portal.result_formats, len(fetched.columns))))
            # the row limit reached: suspended, as PostgreSQL answers (rows may remain)
            self._send(PortalSuspended() if 0 < message.max_rows == len(fetched.rows)
                       else CommandComplete(fetched.tag))
            return
        if not portal.statement.sql:
            self._send(EmptyQueryResponse())
            return
        if portal.result is None:
            await self._check_result_formats(portal)
            await self._run_portal(portal)
        result = portal.result
        assert result is not None
        if not portal.notices_sent:
            self._send_notices(result)
            portal.notices_sent = True
        if not result.columns:
            self._send(CommandComplete(result.tag))
            return
        rows = result.rows[portal.position:]
        suspended = 0 < message.max_rows < len(rows)
        if suspended:
            rows = rows[:message.max_rows]
        columns = _columns(result.columns, result.types,
                           _formats(portal.result_formats, len(result.columns)))
        await self._send_rows(rows, columns)
        portal.position += len(rows)
        if suspended:
            self._send(PortalSuspended())
        else:
            tag = f"SELECT {len(rows)}" if result.tag.startswith("SELECT ") else result.tag
            self._send(CommandComplete(tag))


async def _first_done(loop: asyncio.AbstractEventLoop, futures: list[asyncio.Future[Any]],
                      deadline: float | None) -> None:
    """Wait until one of `futures` is done or the loop's clock reaches `deadline`, never
    cancelling them (lighter than asyncio.wait: no task, no set)."""
    waiter = loop.create_future()
    wake = functools.partial(_wake, waiter)
    for future in futures:
        future.add_done_callback(wake)
    timer = loop.call_at(deadline, wake, None) if deadline is not None else None
    try:
        await waiter
    finally:
        for future in futures:
            future.remove_done_callback(wake)
        if timer is not None:
            timer.cancel()


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an abandoned statement's outcome as seen (it was answered with an error)."""
    if not future.cancelled():
        future.exception()
