"""The asyncio listener: connection limit, cancel routing, TLS, graceful shutdown.

`Server` serves one `Engine` (one policy); `serve()` runs it until SIGTERM or
SIGINT; `BackgroundServer` runs it in a thread, for tests and benchmarks. With
several worker processes (`workers.serve_workers`) each runs a `Server` given a
`WorkerLink`: the connection limit is then counted across workers and a cancel
request reaching the wrong worker is passed to the one owning the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import secrets
import signal
import ssl
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from .. import errors
from ..policy import AnalystPolicy, Policy, ServerSettings
from ..session import Engine
from .connection import ClientConnection
from .credentials import CredentialStore
from .jobs import StatementThreads, install_gate

log = logging.getLogger("dpproxy.server")

SHUTDOWN_GRACE_S = 30.0
CatalogFactory = Callable[..., Any]  # called like catalog.Catalog


class WorkerLink(Protocol):
    """What a worker process shares with the others (see `workers.WorkerShared`)."""

    index: int

    def take_slot(self, limit: int) -> bool: ...

    def free_slot(self) -> None: ...

    def forward_cancel(self, owner: int, process_id: int, secret_key: int) -> None: ...


PID_WORKER_SHIFT = 24  # a worker's BackendKeyData process ids: (index + 1) << 24 | n


def pid_owner(process_id: int) -> int:
    """The worker index encoded in a process id (-1: none)."""
    return (process_id >> PID_WORKER_SHIFT) - 1


def default_catalog(policy: Policy, analyst: AnalystPolicy, **options: Any) -> Any:
    """The catalog answering pg_catalog / information_schema queries from the policy."""
    from .catalog import Catalog

    return Catalog(policy, analyst, **options)


def make_ssl_context(settings: ServerSettings) -> ssl.SSLContext | None:
    if settings.tls_cert is None or settings.tls_key is None:
        if settings.require_tls:
            raise errors.InvalidPolicy("server.require_tls needs a certificate: set "
                                       "server.tls_cert and server.tls_key, or pass "
                                       "--tls-cert and --tls-key")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise errors.InvalidPolicy(f"cannot load the TLS certificate {settings.tls_cert} and "
                                   f"key {settings.tls_key}: {exc}") from None
    return context


class Server:
    """The PostgreSQL protocol server for one engine."""

    def __init__(self, engine: Engine, settings: ServerSettings | None = None, *,
                 credentials: CredentialStore | None = None,
                 catalog_factory: CatalogFactory = default_catalog,
                 worker: WorkerLink | None = None) -> None:
        install_gate(engine)
        self.worker = worker
        self.engine = engine
        self.settings = settings or engine.policy.server
        self.credentials = credentials or CredentialStore(lambda: engine.policy)
        self.catalog_factory = catalog_factory
        self.ssl_context = make_ssl_context(self.settings)
        # DuckDB releases the GIL while it scans: a few threads per core keep both busy.
        self.executor = StatementThreads(min(32, self.settings.max_connections) + 4)
        self.secret = secrets.token_bytes(32)  # keys the mock verifiers of unknown users
        self.port = self.settings.port
        self._connections: dict[int, ClientConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pids = itertools.count(1000 + secrets.randbelow(1 << 20))
        if worker is not None:
            base = (worker.index + 1) << PID_WORKER_SHIFT
            self._pids = (base | (n & ((1 << PID_WORKER_SHIFT) - 1))
                          for n in itertools.count(secrets.randbelow(1 << 20)))
        self._listener: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        # Worker processes each listen on the same port (SO_REUSEPORT): the kernel spreads
        # the connections among them.
        self._listener = await asyncio.start_server(
            self._handle, self.settings.host, self.settings.port, reuse_address=True,
            reuse_port=self.worker is not None or None)
        sockets = self._listener.sockets
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("listening on %s:%d", self.settings.host, self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = ClientConnection(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        connection.task = task
        self._tasks.add(task)
        try:
            await connection.run()
        finally:
            self._tasks.discard(task)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def admit(self, connection: ClientConnection) -> bool:
        """Register a connection that sent its startup packet; False when full."""
        if self.worker is not None:
            if not self.worker.take_slot(self.settings.max_connections):
                return False
        elif len(self._connections) >= self.settings.max_connections:
            return False
        connection.process_id = next(self._pids)
        connection.secret_key = secrets.randbits(32)
        self._connections[connection.process_id] = connection
        return True

    def release(self, connection: ClientConnection) -> None:
        if self._connections.get(connection.process_id) is connection:
            del self._connections[connection.process_id]
            if self.worker is not None:
                self.worker.free_slot()

    def cancel(self, process_id: int, secret_key: int) -> None:
        """A CancelRequest: cancel the connection's statement if the key matches (passed on
        to the worker owning the connection when it is another)."""
        if self.worker is not None:
            owner = pid_owner(process_id)
            if owner != self.worker.index:
                log.info("cancel request for backend %d passed to worker %d", process_id,
                         owner)
                self.worker.forward_cancel(owner, process_id, secret_key)
                return
        connection = self._connections.get(process_id)
        if connection is None or not hmac.compare_digest(
                connection.secret_key.to_bytes(4, "big"), secret_key.to_bytes(4, "big")):
            log.info("cancel request for an unknown backend %d ignored", process_id)
            return
        log.info("cancel request for %s (backend %d)", connection.user, process_id)
        connection.cancel()

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, end idle connections, let charged statements finish (uncharged
        ones are cancelled), then wait for the worker threads."""
        if self._listener is not None:
            self._listener.close()
        for connection in list(self._connections.values()):
            connection.shutdown()
        tasks = set(self._tasks)
        registered = {c.task for c in self._connections.values()}
        for task in tasks - registered:  # before their startup packet: nothing to finish
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._listener is not None:
            await self._listener.wait_closed()
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
        log.info("server stopped")


def settings_with(policy: Policy, host: str | None = None, port: int | None = None,
                  tls_cert: Path | None = None, tls_key: Path | None = None
                  ) -> ServerSettings:
    """The policy's [server] settings with command-line overrides."""
    changes: dict[str, Any] = {k: v for k, v in (("host", host), ("port", port),
                                                  ("tls_cert", tls_cert), ("tls_key", tls_key))
                               if v is not None}
    if (tls_cert is None) != (tls_key is None):
        raise errors.InterfaceError("give both --tls-cert and --tls-key")
    return replace(policy.server, **changes)


def serve(engine: Engine, settings: ServerSettings,
          announce: Callable[[Server], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""

    async def main() -> None:
        server = Server(engine, settings)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if announce is not None:
            announce(server)
        await stop.wait()
        log.info("shutting down")
        await server.shutdown()

    asyncio.run(main())


class BackgroundServer:
    """A server on its own event loop in a thread: `with BackgroundServer(engine) as s:`
    then connect to 127.0.0.1:`s.port`."""

    def __init__(self, engine: Engine, settings: ServerSettings | None = None,
                 **server_options: Any) -> None:
        self.engine = engine
        self.settings = settings or replace(engine.policy.server, host="127.0.0.1", port=0)
        self._options = server_options
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="dpproxy-server", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.server: Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.server = Server(self.engine, self.settings, **self._options)
            await self.server.start()
            self._ready.set()
            await self._stop.wait()
            await self.server.shutdown(grace_s=10)

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported to the thread that started us
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> BackgroundServer:
        self._thread.start()
        if not self._ready.wait(timeout=60) or self._error is not None:
            raise RuntimeError("the server did not start") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
