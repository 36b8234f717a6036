"""Shared by the server tests: a server-per-test fixture and a raw protocol client.

The raw client speaks the protocol message by message (through dpproxy's own codec)
so tests can send what real clients never would.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dpproxy.server import codec
from dpproxy.server.scram import ScramClient, make_verifier
from dpproxy.server.server import BackgroundServer
from dpproxy.session import Engine

PASSWORD = "alice-demo"  # the demo policy's verifier is for this password
ADMIN_PASSWORD = "admin-secret"
ADMIN_SNIPPET = '[analysts.admin]\nrole = "admin"'
# alice's demo budget raised so far that no test runs out of it
BIG_BUDGET = {"budget = { epsilon = 10.0, delta = 1e-5 }":
              "budget = { epsilon = 1e9, delta = 0.5 }"}
IO_TIMEOUT_S = 30.0  # a bound on every socket wait, never an assertion


@dataclass
class Served:
    port: int
    engine: Engine
    policy_path: Path
    background: BackgroundServer

    def dsn(self, user: str = "alice", password: str | None = PASSWORD, **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": user, "dbname": "demo",
                 "connect_timeout": "10", **extra}
        if password is not None:
            parts["password"] = password
        return " ".join(f"{k}={v}" for k, v in parts.items())

    def spent(self, analyst: str = "alice") -> float:
        return self.engine.ledger.status(f"analyst:{analyst}").spent.epsilon


ServeFactory = Callable[..., Served]


def admin_policy_snippet() -> dict[str, str]:
    verifier = make_verifier(ADMIN_PASSWORD)
    return {ADMIN_SNIPPET: f'{ADMIN_SNIPPET}\npassword_scram = "{verifier}"'}


def serving(make_policy: Callable[..., Path]) -> Iterator[ServeFactory]:
    """For a `serve` fixture: start(replace_snippets, **settings) runs a server on a fresh
    copy of the demo policy (see conftest's make_policy); all stop at teardown."""
    started: list[Served] = []

    def start(replace_snippets: dict[str, str] | None = None, **settings: Any) -> Served:
        options = {k: settings.pop(k) for k in ("catalog_factory",) if k in settings}
        path = make_policy(replace_snippets)
        engine = Engine.from_path(path)
        server_settings = replace(engine.policy.server, host="127.0.0.1", port=0, **settings)
        background = BackgroundServer(engine, server_settings, **options).start()
        served = Served(background.port, engine, path, background)
        started.append(served)
        return served

    yield start
    for served in started:
        served.background.stop()
        served.engine.close()


class RawClient:
    """A blocking protocol client over a plain socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)
        self.buffer = bytearray()

    def send(self, *messages: Any) -> None:
        self.sock.sendall(b"".join(codec.encode(m) for m in messages))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> codec.Message | None:
        """The next server message, or None when the server closed the connection."""
        while True:
            message, used = codec.parse_backend(self.buffer)
            if message is not None:
                del self.buffer[:used]
                return message
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                return None
            self.buffer += data

    def until(self, kind: type, limit: int = 10_000) -> list[codec.Message]:
        """Messages up to and including the first of `kind` (or the close)."""
        seen: list[codec.Message] = []
        for _ in range(limit):
            message = self.receive()
            if message is None:
                return seen
            seen.append(message)
            if isinstance(message, kind):
                return seen
        raise AssertionError(f"no {kind.__name__} in {limit} messages")

    def closed(self) -> bool:
        """Whether the server closed the connection (reading what is left)."""
        return any(self.receive() is None for _ in range(1000))

    def login(self, user: str = "alice", password: str = PASSWORD, database: str = "demo",
              **parameters: str) -> list[codec.Message]:
        """Startup and SCRAM; returns the messages up to ReadyForQuery (or the error)."""
        self.send(codec.StartupMessage(codec.PROTOCOL_VERSION,
                                       {"user": user, "database": database, **parameters}))
        first = self.receive()
        if not isinstance(first, codec.Authentication) or first.kind != codec.AUTH_SASL:
            return [first] if first is not None else []
        scram = ScramClient(password)
        self.send(codec.SASLInitialResponse("SCRAM-SHA-256", scram.first())
                  .to_password_message())
        challenge = self.receive()
        if not isinstance(challenge, codec.Authentication):
            return [challenge] if challenge is not None else []
        self.send(codec.PasswordMessage(scram.final(challenge.data)))
        return self.until(codec.ReadyForQuery)

    def query(self, sql: str) -> list[codec.Message]:
        self.send(codec.Query(sql))
        return self.until(codec.ReadyForQuery)

    def close(self) -> None:
        self.sock.close()


def errors_in(messages: list[codec.Message]) -> list[str]:
    return [m.get("C") or "" for m in messages if type(m) is codec.ErrorResponse]


def first_error(messages: list[codec.Message]) -> codec.ErrorResponse:
    found = [m for m in messages if type(m) is codec.ErrorResponse]
    assert found, f"no ErrorResponse in {messages}"
    return found[0]


def rows_in(messages: list[codec.Message]) -> list[tuple[bytes | None, ...]]:
    return [m.values for m in messages if isinstance(m, codec.DataRow)]


def raw_clients(served: Served) -> Iterator[Callable[..., RawClient]]:
    """For a `raw` fixture: a factory of (logged-in) raw clients, closed at teardown."""
    clients: list[RawClient] = []

    def connect(login: bool = True) -> RawClient:
        client = RawClient(served.port)
        clients.append(client)
        if login:
            messages = client.login()
            assert isinstance(messages[-1], codec.ReadyForQuery), messages
        return client

    yield connect
    for client in clients:
        client.close()
