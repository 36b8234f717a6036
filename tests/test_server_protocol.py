"""The server over real sockets: startup and authentication, TLS, the extended protocol
message by message, transaction status, admin commands, cancel, limits, robustness,
concurrency and shutdown. Every wait is bounded; nothing asserts on time."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.accountant import Cost
from dpproxy.server import codec
from dpproxy.server.connection import ClientConnection
from dpproxy.session import Result

from .test_server_support import (
    ADMIN_PASSWORD,
    PASSWORD,
    RawClient,
    Served,
    ServeFactory,
    admin_policy_snippet,
    errors_in,
    first_error,
    raw_clients,
    rows_in,
)

ROOT = Path(__file__).resolve().parents[1]
ACCEPTED = "SELECT occupation, COUNT(*) AS n FROM adult GROUP BY occupation"
Raw = tuple[Served, Callable[..., RawClient]]


@pytest.fixture
def raw(serve: ServeFactory) -> Iterator[Raw]:
    """A default server and a factory of logged-in raw clients."""
    served = serve()
    for connect in raw_clients(served):
        yield served, connect


# startup ---------------------------------------------------------------------------------------
def test_startup_reports_what_clients_expect(raw: Raw) -> None:
    _, connect = raw
    client = connect(login=False)
    messages = client.login(application_name="tests")
    statuses = {m.name: m.value for m in messages if isinstance(m, codec.ParameterStatus)}
    assert re.match(r"15\.\d+ \(dpproxy ", statuses["server_version"])
    assert statuses["client_encoding"] == statuses["server_encoding"] == "UTF8"
    assert statuses["DateStyle"] == "ISO, MDY" and statuses["TimeZone"] == "UTC"
    assert statuses["integer_datetimes"] == statuses["standard_conforming_strings"] == "on"
    assert statuses["application_name"] == "tests" and statuses["is_superuser"] == "off"
    assert statuses["session_authorization"] == "alice"
    keys = [m for m in messages if isinstance(m, codec.BackendKeyData)]
    assert len(keys) == 1 and messages[-1] == codec.ReadyForQuery("I")


def test_ssl_and_gssenc_requests_are_declined_without_tls(raw: Raw) -> None:
    _, connect = raw
    client = connect(login=False)
    client.send(codec.GSSENCRequest())
    assert client.sock.recv(1) == b"N"
    client.send(codec.SSLRequest())
    assert client.sock.recv(1) == b"N"
    assert isinstance(client.login()[-1], codec.ReadyForQuery)


def test_protocol_versions(raw: Raw) -> None:
    _, connect = raw
    old = connect(login=False)
    old.send(codec.StartupMessage(2 << 16, {"user": "alice"}))
    assert first_error([old.receive()]).get("C") == "0A000"
    newer = connect(login=False)
    newer.send(codec.StartupMessage((3 << 16) | 2, {"user": "alice", "database": "demo",
                                                    "_pq_.fancy": "1"}))
    assert newer.receive() == codec.NegotiateProtocolVersion(0, ("_pq_.fancy",))


@pytest.mark.parametrize(("user", "password", "database", "sqlstate"), [
    ("alice", "wrong", "demo", "28P01"),
    ("mallory", PASSWORD, "demo", "28P01"),  # unknown analyst: the same answer
    ("admin", "anything", "demo", "28P01"),  # no password set: the same answer
    ("alice", PASSWORD, "postgres", "3D000"),  # only after a good password
    ("", PASSWORD, "demo", "28000"),
])
def test_authentication_failures(raw: Raw, user: str, password: str,
                                 database: str, sqlstate: str) -> None:
    _, connect = raw
    client = connect(login=False)
    error = first_error(client.login(user, password, database))
    assert (error.get("S"), error.get("C")) == ("FATAL", sqlstate)
    if sqlstate == "28P01":
        assert error.get("M") == f'password authentication failed for user "{user}"'
    assert client.closed()


def test_psycopg_auth_failure_sqlstates(serve: ServeFactory) -> None:
    served = serve()
    for dsn in (served.dsn(password="wrong"), served.dsn(user="mallory")):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn)


def test_dpproxy_options_in_the_startup_packet(serve: ServeFactory) -> None:
    served = serve()
    dsn = served.dsn(options="'-c dpproxy.epsilon=0.5 -c search_path=public'")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)
        conn.execute("SELECT COUNT(*) FROM adult").fetchall()
    assert served.spent() == pytest.approx(0.5)
    with pytest.raises(psycopg.OperationalError, match=r"dpproxy\.epsilon"):
        psycopg.connect(served.dsn(options="'-c dpproxy.epsilon=lots'"))


def test_trust_loopback(serve: ServeFactory) -> None:
    served = serve(trust_loopback=True)
    with psycopg.connect(served.dsn(password=None)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 0


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "server.crt", folder / "server.key"
    try:
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither cryptography nor openssl is available")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "2", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(days=1))
                   .not_valid_after(now + dt.timedelta(days=2)).sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key


def test_tls_required(serve: ServeFactory, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    served = serve(tls_cert=cert, tls_key=key, require_tls=True)
    with psycopg.connect(served.dsn(sslmode="require")) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 0
    with pytest.raises(psycopg.OperationalError, match="requires TLS"):
        psycopg.connect(served.dsn(sslmode="disable"))
    client = RawClient(served.port)
    try:
        error = first_error(client.login())
        assert (error.get("S"), error.get("C")) == ("FATAL", "28000")
    finally:
        client.close()


def test_plaintext_after_ssl_request_is_refused(serve: ServeFactory,
                                                tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    client = RawClient(serve(tls_cert=cert, tls_key=key).port)
    try:  # bytes sent along with SSLRequest could be injected before the handshake
        client.send_raw(codec.encode(codec.SSLRequest()) + codec.encode(codec.StartupMessage(
            codec.PROTOCOL_VERSION, {"user": "alice"})))
        assert client.closed()
    finally:
        client.close()


def test_plaintext_sent_with_a_gssenc_request_is_refused(raw: Raw) -> None:
    """Bytes sent along with GSSENCRequest, before its answer, were taken as the startup;
    PostgreSQL refuses them as it does after SSLRequest."""
    served, _ = raw
    client = RawClient(served.port)
    try:
        client.send_raw(codec.encode(codec.GSSENCRequest()) + codec.encode(
            codec.StartupMessage(codec.PROTOCOL_VERSION, {"user": "alice"})))
        assert client.closed()
    finally:
        client.close()


# simple and extended query, message by message ------------------------------------------------
def test_simple_query_results_notices_and_tags(raw: Raw) -> None:
    served, connect = raw
    client = connect()
    messages = client.query("SET dpproxy.epsilon = 0.2; " + ACCEPTED)
    kinds = [type(m).__name__ for m in messages]
    assert kinds[0] == "CommandComplete" and messages[0].tag == "SET"
    description = next(m for m in messages if isinstance(m, codec.RowDescription))
    assert [(f.name, f.type_oid, f.format) for f in description.fields] == \
        [("occupation", 25, 0), ("n", 20, 0)]
    assert len(rows_in(messages)) == 14
    notices = [m for m in messages if type(m) is codec.NoticeResponse]
    assert notices and all(n.get("S") == "NOTICE" for n in notices)
    assert any("budget left" in (n.get("M") or "") for n in notices)
    assert messages[-2] == codec.CommandComplete("SELECT 14")
    assert served.spent() == pytest.approx(0.2)

    assert client.query("") == [codec.EmptyQueryResponse(), codec.ReadyForQuery("I")]
    assert client.query(";  -- nothing") == [codec.EmptyQueryResponse(),
                                             codec.ReadyForQuery("I")]
    several = client.query("SELECT COUNT(*) FROM adult; SELECT COUNT(*) FROM visits")
    assert errors_in(several) == ["0A000"] and not rows_in(several)
    pool_reset = client.query("SELECT pg_advisory_unlock_all();\nCLOSE ALL;\nUNLISTEN *;\n"
                              "RESET ALL;")
    assert [m.tag for m in pool_reset if isinstance(m, codec.CommandComplete)][-1] == "RESET"
    assert served.spent() == pytest.approx(0.2)


def test_transaction_status(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    assert client.query("BEGIN")[-1] == codec.ReadyForQuery("T")
    assert client.query("SELECT COUNT(*) FROM adult")[-1] == codec.ReadyForQuery("T")
    failed = client.query("SELECT age FROM adult")
    assert errors_in(failed) == ["42501"] and failed[-1] == codec.ReadyForQuery("E")
    ignored = client.query("SELECT COUNT(*) FROM adult")
    assert errors_in(ignored) == ["25P02"] and ignored[-1] == codec.ReadyForQuery("E")
    assert client.query("COMMIT")[-2:] == [codec.CommandComplete("ROLLBACK"),
                                           codec.ReadyForQuery("I")]
    assert client.query("START TRANSACTION")[-1] == codec.ReadyForQuery("T")
    assert client.query("ROLLBACK")[-1] == codec.ReadyForQuery("I")


def test_extended_protocol_named_statements_portals_and_suspension(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    sql = "SELECT occupation, COUNT(*) AS n FROM adult WHERE age > $1 GROUP BY occupation"
    client.send(codec.Parse("by_job", sql), codec.Describe("S", "by_job"), codec.Flush())
    assert client.receive() == codec.ParseComplete()
    assert client.receive() == codec.ParameterDescription((20,))
    description = client.receive()
    assert [(f.name, f.type_oid) for f in description.fields] == [("occupation", 25), ("n", 20)]
    client.send(codec.Bind("cursor", "by_job", (1,), (struct.pack("!q", 30),), (0, 1)),
                codec.Execute("cursor", 5), codec.Execute("cursor", 0),
                codec.Close("P", "cursor"), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    kinds = [type(m).__name__ for m in messages]
    assert kinds[:1] == ["BindComplete"] and kinds.count("DataRow") == 14
    assert kinds.index("PortalSuspended") == 1 + 5 + kinds.count("NoticeResponse")
    assert codec.CommandComplete("SELECT 9") in messages and codec.CloseComplete() in messages
    counts = [struct.unpack("!q", row[1])[0] for row in rows_in(messages)]  # binary int8
    assert all(isinstance(c, int) for c in counts)
    # the statement stays; a duplicate name is an error that skips to Sync
    client.send(codec.Parse("by_job", "SELECT 1"), codec.Bind("", "by_job", (), (b"1",), ()),
                codec.Execute("", 0), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    assert errors_in(messages) == ["42P05"] and not rows_in(messages)
    client.send(codec.Close("S", "by_job"), codec.Sync())
    assert client.until(codec.ReadyForQuery)[0] == codec.CloseComplete()


def test_deallocate_drops_a_prepared_statement(raw: Raw) -> None:
    """SQL's DEALLOCATE closes a named statement as Close does: psqlODBC prepares each
    statement of a handle under one name and DEALLOCATEs it before preparing the next
    (which then failed with 42P05). A name not prepared is 26000, as in PostgreSQL;
    DEALLOCATE ALL drops every one, with their portals."""
    _, connect = raw
    client = connect()
    sql = "SELECT COUNT(*) FROM adult WHERE age > $1"
    for _ in range(2):
        client.send(codec.Parse("_PLAN0x55", sql), codec.Sync())
        assert client.until(codec.ReadyForQuery)[0] == codec.ParseComplete()
        assert client.query('DEALLOCATE "_PLAN0x55"')[-2:] == [
            codec.CommandComplete("DEALLOCATE"), codec.ReadyForQuery("I")]
    assert errors_in(client.query('DEALLOCATE PREPARE "_PLAN0x55"')) == ["26000"]
    client.send(codec.Parse("a", sql), codec.Parse("b", sql),
                codec.Bind("open", "a", (), (b"30",), ()), codec.Sync())
    client.until(codec.ReadyForQuery)
    assert client.query("DEALLOCATE ALL")[-2] == codec.CommandComplete("DEALLOCATE ALL")
    client.send(codec.Execute("open", 0), codec.Sync())
    assert errors_in(client.until(codec.ReadyForQuery)) == ["34000"]  # its portal went too
    client.send(codec.Parse("a", sql), codec.Parse("b", sql), codec.Sync())
    assert not errors_in(client.until(codec.ReadyForQuery))


def test_a_parsed_execute_cannot_run_itself(raw: Raw) -> None:
    """Parse keeps any statement text, `EXECUTE a` under the name a too: executing it is
    refused at once as not a query (42601), rather than running itself until Python's
    recursion limit, and the connection goes on."""
    _, connect = raw
    client = connect()
    client.send(codec.Parse("a", "EXECUTE a"), codec.Bind("", "a", (), (), ()),
                codec.Execute("", 0), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    assert errors_in(messages) == ["42601"]
    refused = next(m for m in messages if isinstance(m, codec.ErrorResponse))
    assert 'prepared statement "a" is not a query' in dict(refused.fields)["M"]
    assert errors_in(client.query("EXECUTE a")) == ["42601"]
    assert not errors_in(client.query("SELECT 1"))


def test_extended_protocol_errors_skip_to_sync(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    for bad, sqlstate in (
            ([codec.Execute("", 0)], "34000"),  # Execute without Bind
            ([codec.Bind("", "missing", (), (), ())], "26000"),
            ([codec.Parse("", "SELECT COUNT(*) FROM adult WHERE age > $1"),
              codec.Bind("", "", (), (), ())], "08P01"),  # wrong parameter count
            ([codec.Parse("", "SELECT COUNT(*) FROM adult WHERE age > $1", (20,)),
              codec.Bind("", "", (0,), (b"thirty",), ())], "22P02"),
            ([codec.Parse("", "SELECT 1; SELECT 2")], "42601")):
        client.send(*bad, codec.Execute("", 0), codec.Sync())
        messages = client.until(codec.ReadyForQuery)
        assert errors_in(messages) == [sqlstate] and messages[-1] == codec.ReadyForQuery("I")
    # the connection is still good
    client.send(codec.Parse("", ""), codec.Bind("", "", (), (), ()), codec.Describe("P", ""),
                codec.Execute("", 0), codec.Sync())
    assert client.until(codec.ReadyForQuery)[-3:] == [codec.NoData(), codec.EmptyQueryResponse(),
                                                      codec.ReadyForQuery("I")]


def test_describe_then_other_messages_in_one_packet(raw: Raw) -> None:
    """After Describe(portal) the server reads ahead to see whether Execute follows; any
    message read so is handled in its turn, once."""
    served, connect = raw
    client = connect()
    sql = "SELECT COUNT(*) AS n FROM adult WHERE age > $1"
    client.send(codec.Parse("", sql), codec.Bind("a", "", (), (b"30",), ()),
                codec.Describe("P", "a"), codec.Bind("b", "", (), (b"40",), ()),
                codec.Execute("b", 0), codec.Execute("a", 0), codec.Close("P", "a"),
                codec.Describe("P", "a"), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    kinds = [type(m).__name__ for m in messages if not isinstance(m, codec.NoticeResponse)]
    assert kinds == ["ParseComplete", "BindComplete", "RowDescription", "BindComplete",
                     "DataRow", "CommandComplete", "DataRow", "CommandComplete",
                     "CloseComplete", "ErrorResponse", "ReadyForQuery"]
    assert errors_in(messages) == ["34000"]  # portal "a" was closed before the Describe
    assert served.spent() == pytest.approx(0.2)  # each portal ran once


def test_binary_results_of_each_type(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    client.send(codec.Parse("", "SELECT true AS b, 1.5::float8 AS f, 'x' AS t, 42 AS i"),
                codec.Bind("", "", (), (), (1,)), codec.Describe("P", ""),
                codec.Execute("", 0), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    description = next(m for m in messages if isinstance(m, codec.RowDescription))
    assert [(f.type_oid, f.format) for f in description.fields] == \
        [(16, 1), (701, 1), (25, 1), (20, 1)]
    assert rows_in(messages) == [(b"\x01", struct.pack("!d", 1.5), b"x", struct.pack("!q", 42))]


def test_describe_a_rejected_statement_answers_its_sqlstate(raw: Raw) -> None:
    served, connect = raw
    client = connect()
    client.send(codec.Parse("s", "SELECT age FROM adult"), codec.Describe("S", "s"), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    assert errors_in(messages) == ["42501"]
    assert not any(isinstance(m, codec.ParameterDescription) for m in messages)
    assert served.spent() == 0


def test_notices_are_sent_once_per_portal(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    client.send(codec.Parse("", ACCEPTED), codec.Bind("", "", (), (), ()),
                codec.Execute("", 3), codec.Execute("", 3), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    notices = [m for m in messages if type(m) is codec.NoticeResponse]
    assert len(notices) == 2  # the count's accuracy, the budget left


# admin over the wire ---------------------------------------------------------------------------
def test_admin_commands(serve: ServeFactory) -> None:
    served = serve(admin_policy_snippet())
    with psycopg.connect(served.dsn("admin", ADMIN_PASSWORD), autocommit=True) as conn:
        budgets = conn.execute("SELECT * FROM dpproxy.budgets").fetchall()
        assert ("analyst:alice", 10.0) in [row[:2] for row in budgets]
        granted = conn.execute("CALL dpproxy.grant('alice', 1.5, 0)").fetchone()
        assert granted[:2] == ("analyst:alice", 11.5)
        conn.execute("CALL dpproxy.set_budget(%s, %s, %s)", ["alice", 5.0, 1e-5])
        assert served.engine.ledger.status("analyst:alice").budget == Cost(5.0, 1e-5)
        conn.execute("CALL dpproxy.set_budget('alice', 6.0)")  # ε only: δ stays
    assert served.engine.ledger.status("analyst:alice").budget == Cost(6.0, 1e-5)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        conn.execute(ACCEPTED)  # alice spends
    with psycopg.connect(served.dsn("admin", ADMIN_PASSWORD), autocommit=True) as conn:
        (reset,) = conn.execute("CALL dpproxy.reset('alice')").fetchall()
        assert reset[0] == "analyst:alice" and reset[2] == 0.0  # spent: nothing
        history = conn.execute("SELECT * FROM dpproxy.history").fetchall()
        assert [c.name for c in conn.execute("SELECT * FROM dpproxy.history").description] \
            == ["at", "who", "what", "accounts", "epsilon", "delta", "detail"]
        assert [h[2] for h in history[:5]] == ["reset", "charge", "set_budget", "set_budget",
                                               "grant"]  # newest first
        assert history[1][1] == "alice" and "occupation" in history[1][6]
        assert history[0][1] == "analyst:admin" and isinstance(history[0][0], dt.datetime)
        with pytest.raises(psycopg.errors.SyntaxError, match="takes"):
            conn.execute("CALL dpproxy.reset('alice', 1.0)")
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for command in ("SELECT * FROM dpproxy.budgets", "CALL dpproxy.grant('alice', 100, 0)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(command)
    assert served.engine.ledger.status("analyst:alice").budget.epsilon == 6.0
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        for command in ("SELECT * FROM dpproxy.history", "CALL dpproxy.reset('alice')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(command)
        conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert served.engine.audit.path is not None
    records = [json.loads(line) for line in served.engine.audit.path.read_text().splitlines()]
    admin_runs = [r for r in records if r["outcome"] == "admin"]
    assert [r["analyst"] for r in admin_runs] == ["admin"] * 7
    assert "dpproxy.set_budget('alice', 6.0)" in admin_runs[3]["statement"]
    refused = [r for r in records if r["outcome"] == "rejected" and "dpproxy" in r["statement"]]
    assert [(r["analyst"], r["sqlstate"]) for r in refused] == \
        [("admin", "42601")] + [("alice", "42501")] * 4
    assert any(r["outcome"] == "catalog" and r["analyst"] == "alice" for r in records)


# cancel, timeouts, disconnects -------------------------------------------------------------------
class _Hold:
    """Holds statements that read `adult` in their worker thread (before analysis, so
    before any charge) until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()


@pytest.fixture
def hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Hold]:
    holder = _Hold()
    original = ClientConnection._run_statement

    def held(self: ClientConnection, text: str, params: list[object] | None) -> Result:
        if "adult" not in text:
            return original(self, text, params)
        holder.entered.set()
        holder.release.wait(30)
        try:
            return original(self, text, params)
        finally:
            holder.finished.set()

    monkeypatch.setattr(ClientConnection, "_run_statement", held)
    yield holder
    holder.release.set()


def _eventually(condition: Callable[[], bool], attempts: int = 3000) -> bool:
    """Poll a condition a bounded number of times (at most ~30 s)."""
    for _ in range(attempts):
        if condition():
            return True
        time.sleep(0.01)
    return False


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except Exception as exc:  # reported to the test through `outcome`
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_cancel_before_charge(serve: ServeFactory, hold: _Hold) -> None:
    served = serve()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        thread, outcome = _in_thread(lambda: conn.execute(ACCEPTED).fetchall())
        assert hold.entered.wait(30)
        conn.cancel_safe()  # returns once the server has handled the request
        hold.release.set()
        thread.join(30)
        assert isinstance(outcome[0], psycopg.errors.QueryCanceled)
        assert hold.finished.wait(30)
        assert served.spent() == 0
        assert len(conn.execute(ACCEPTED).fetchall()) == 14  # the connection goes on


def test_cancel_after_charge_delivers_the_result(serve: ServeFactory) -> None:
    served = serve()
    backend = served.engine.backend
    running, release = threading.Event(), threading.Event()

    class SlowBackend:
        def run_aggregate(self, sql: str, parameters: object = (), **kwargs: object
                          ) -> object:
            running.set()
            release.wait(30)
            return backend.run_aggregate(sql, parameters, **kwargs)

        def __getattr__(self, name: str) -> object:
            return getattr(backend, name)

    served.engine.backend = SlowBackend()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        thread, outcome = _in_thread(lambda: conn.execute(ACCEPTED).fetchall())
        assert running.wait(30)  # charged: the backend runs after the ledger
        conn.cancel_safe()
        release.set()
        thread.join(30)
        assert isinstance(outcome[0], list) and len(outcome[0]) == 14
    assert served.spent() == pytest.approx(0.1)


def test_statement_timeout(serve: ServeFactory, hold: _Hold) -> None:
    served = serve(statement_timeout_s=0.2)
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            conn.execute(ACCEPTED)
        hold.release.set()
        assert hold.finished.wait(30)
        assert served.spent() == 0
        assert conn.execute("SELECT 1 AS one").fetchone() == (1,)


@pytest.mark.parametrize("filtered", [False, True])
def test_a_catalog_query_past_the_statement_timeout_is_stopped(serve: ServeFactory,
                                                               filtered: bool) -> None:
    """A catalog query costs nothing and reads nothing private, and it ran on in its thread
    after the timeout (a cross join of pg_attribute: for hours), holding a statement
    thread and the connection's next statement: it is interrupted. `filtered`: a long
    NOT IN list keeps it in parsing past the timeout, where an interrupt reached nothing
    and DuckDB then ran it whole."""
    served = serve(statement_timeout_s=0.3)
    cross = ("SELECT count(*) FROM pg_catalog.pg_attribute a, pg_catalog.pg_attribute b, "
             "pg_catalog.pg_attribute c, pg_catalog.pg_attribute d, pg_catalog.pg_attribute e")
    if filtered:
        cross += " WHERE a.attname NOT IN (" + ", ".join(
            f"'n{i}'" for i in range(10000)) + ")"
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            conn.execute(cross)
        thread, outcome = _in_thread(lambda: conn.execute("SELECT 1 AS one").fetchone())
        thread.join(30)  # waits for the catalog query's thread to be free
        assert outcome == [(1,)]


def test_client_leaving_mid_query_stops_it_and_others_are_served(
        raw: Raw, hold: _Hold) -> None:
    served, connect = raw
    leaving = connect()
    leaving.send(codec.Query(ACCEPTED))
    assert hold.entered.wait(30)
    leaving.close()
    server = served.background.server
    assert server is not None
    # the server drops the connection once it sees the close; only then may the query go on
    assert _eventually(lambda: server.connection_count == 0)
    hold.release.set()
    assert hold.finished.wait(30)
    other = connect()
    assert len(rows_in(other.query("SELECT COUNT(*) FROM visits"))) == 1
    assert served.spent() == pytest.approx(0.1)  # only the second client's query


# robustness --------------------------------------------------------------------------------------
@pytest.mark.parametrize("data", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello
    bytes(range(256)),
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
])
def test_garbage_at_startup(raw: Raw, data: bytes) -> None:
    _, connect = raw
    client = connect(login=False)
    client.send_raw(data)
    reply = client.receive()
    assert reply is None or first_error([reply]).get("C") == "08P01"
    assert client.closed()
    assert rows_in(connect().query("SELECT 1 AS one")) == [(b"1",)]


@pytest.mark.parametrize("data", [
    b"Z\x00\x00\x00\x04",  # a type clients never send
    b"Q" + struct.pack("!i", 64 * 1024 * 1024),  # oversized
    b"Q\x00\x00\x00\x09abc\x00x",  # trailing byte after the string
    codec.encode(codec.PasswordMessage(b"late")),  # a password after login
])
def test_protocol_violations_after_login(raw: Raw, data: bytes) -> None:
    _, connect = raw
    client = connect()
    client.send_raw(data)
    error = first_error(client.until(codec.ErrorResponse))
    assert (error.get("S"), error.get("C")) == ("FATAL", "08P01")
    assert client.closed()
    assert rows_in(connect().query("SELECT 1 AS one")) == [(b"1",)]


def test_truncated_message_then_disconnect(raw: Raw) -> None:
    _, connect = raw
    client = connect()
    client.send_raw(codec.encode(codec.Query(ACCEPTED))[:10])
    client.close()
    half_startup = connect(login=False)
    half_startup.send_raw(codec.encode(codec.StartupMessage(
        codec.PROTOCOL_VERSION, {"user": "alice"}))[:7])
    half_startup.close()
    assert rows_in(connect().query("SELECT 1 AS one")) == [(b"1",)]


# limits -------------------------------------------------------------------------------------------
def test_max_connections(serve: ServeFactory) -> None:
    served = serve(max_connections=2)
    clients = [RawClient(served.port) for _ in range(3)]
    try:
        assert isinstance(clients[0].login()[-1], codec.ReadyForQuery)
        assert isinstance(clients[1].login()[-1], codec.ReadyForQuery)
        error = first_error(clients[2].login())
        assert (error.get("S"), error.get("C")) == ("FATAL", "53300")
        clients[0].send(codec.Terminate())
        assert clients[0].closed()
        for _ in range(100):  # bounded: the server notices the goodbye quickly
            retry = RawClient(served.port)
            if isinstance(retry.login()[-1], codec.ReadyForQuery):
                retry.close()
                break
            retry.close()
        else:
            pytest.fail("a freed connection slot was never reused")
    finally:
        for client in clients:
            client.close()


def test_idle_timeout(serve: ServeFactory) -> None:
    client = RawClient(serve(idle_timeout_s=0.2).port)
    try:
        assert isinstance(client.login()[-1], codec.ReadyForQuery)
        error = first_error(client.until(codec.ErrorResponse))
        assert (error.get("S"), error.get("C")) == ("FATAL", "57P05")
        assert client.closed()
    finally:
        client.close()


def test_max_result_rows(serve: ServeFactory) -> None:
    """Public keys: the row count is known before anything runs, so the refusal is free.
    Private keys: the count is known only once released, so it is charged and withheld."""
    served = serve(max_result_rows=5)
    before = served.engine.ledger.status("analyst:alice").spent
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="nothing was charged"):
            conn.execute(ACCEPTED)
        assert served.engine.ledger.status("analyst:alice").spent == before
        assert len(conn.execute(ACCEPTED + " LIMIT 5").fetchall()) == 5
        assert len(conn.execute(ACCEPTED + " LIMIT 5 OFFSET 10").fetchall()) == 4
        spent = served.engine.ledger.status("analyst:alice").spent
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="withheld"):
            conn.execute("SELECT age, COUNT(*) FROM adult GROUP BY age")
        assert served.engine.ledger.status("analyst:alice").spent.epsilon > spent.epsilon


# concurrency and shutdown ----------------------------------------------------------------------
def test_32_clients_at_once_never_overspend(serve: ServeFactory) -> None:
    served = serve()
    clients, queries_each = 32, 4  # 128 queries at ε=0.1 against a budget of ε=10
    start = threading.Barrier(clients, timeout=60)
    answered: list[str] = []
    lock = threading.Lock()

    def client(number: int) -> None:
        with psycopg.connect(served.dsn(), autocommit=True) as conn:
            start.wait()
            for i in range(queries_each):
                # every query distinct: a repeat would be answered from the answer cache
                threshold = number * queries_each + i
                sql = ("SELECT COUNT(*) FROM adult WHERE age > %s" if i % 2 else
                       "SELECT occupation, COUNT(*) FROM adult WHERE hours_per_week > %s "
                       "GROUP BY occupation")
                try:
                    outcome = "rows" if conn.execute(sql, [threshold]).fetchall() else "empty"
                except psycopg.Error as exc:
                    outcome = exc.sqlstate or "?"
                with lock:
                    answered.append(outcome)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(answered) == clients * queries_each
    assert set(answered) <= {"rows", "53400"}
    released = answered.count("rows")
    assert served.spent() == pytest.approx(released * 0.1) and served.spent() <= 10.0
    assert released == 100  # exact decimal budgets: every ε of the budget is usable


def test_graceful_shutdown_tells_idle_clients(serve: ServeFactory) -> None:
    served = serve()
    client = RawClient(served.port)
    try:
        assert isinstance(client.login()[-1], codec.ReadyForQuery)
        served.background.stop()
        error = first_error(client.until(codec.ErrorResponse))
        assert (error.get("S"), error.get("C")) == ("FATAL", "57P01")
    finally:
        client.close()


def test_serve_command_prints_how_to_connect_and_stops_on_sigterm(
        make_policy: Callable[..., Path]) -> None:
    policy = make_policy({"port = 6432": "port = 0"})
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "dpproxy", "serve", "--policy",
                                str(policy)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        port = None
        assert process.stdout is not None
        for _ in range(50):
            line = process.stdout.readline()
            found = re.search(r'psql "postgresql://alice@127\.0\.0\.1:(\d+)/demo"', line)
            if found:
                port = int(found.group(1))
                break
            if not line:
                break
        assert port, process.stderr.read() if process.stderr else "no output"
        with psycopg.connect(f"host=127.0.0.1 port={port} user=alice dbname=demo "
                             f"password={PASSWORD}") as conn:
            assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_bad_binary_parameters_are_errors_that_keep_the_connection(raw: Raw) -> None:
    """A binary date beyond Python's years killed the connection with an internal error
    (PostgreSQL: 22008), and a NUL inside a binary text was accepted and charged (text
    format: 22021). A wrong count of result formats was found after the charge."""
    served, connect = raw
    client = connect()
    cases = [
        ("SELECT COUNT(*) FROM visits WHERE day > $1", 1082, struct.pack("!i", 2 ** 31 - 1),
         "22008", ()),
        ("SELECT COUNT(*) FROM visits WHERE day > $1", 1114, struct.pack("!q", 2 ** 63 - 1),
         "22008", ()),
        ("SELECT COUNT(*) FROM adult WHERE sex = $1", 25, b"Ma\x00le", "22021", ()),
        ("SELECT COUNT(*) FROM adult WHERE sex = $1", 25, b"Male", "08P01", (0, 1, 0)),
    ]
    for sql, oid, value, sqlstate, result_formats in cases:
        client.send(codec.Parse("", sql, (oid,)),
                    codec.Bind("", "", (1,), (value,), result_formats),
                    codec.Execute("", 0), codec.Sync())
        messages = client.until(codec.ReadyForQuery)
        assert errors_in(messages) == [sqlstate] and not rows_in(messages)
    assert served.spent() == 0
    assert rows_in(client.query("SELECT 1 AS one")) == [(b"1",)]


def test_a_declared_cursor_run_with_a_row_limit_is_suspended(raw: Raw) -> None:
    """Execute with a row limit on a DECLAREd cursor answered its rows with a FETCH's
    CommandComplete; PostgreSQL suspends the portal (PortalSuspended) when the limit is
    reached, and completes it when it runs out."""
    _, connect = raw
    client = connect()
    client.query("BEGIN")
    client.query("DECLARE c1 CURSOR FOR SELECT occupation, COUNT(*) FROM adult "
                 "GROUP BY occupation")
    for _ in range(2):
        client.send(codec.Execute("c1", 5), codec.Sync())
        messages = client.until(codec.ReadyForQuery)
        assert len(rows_in(messages)) == 5 and codec.PortalSuspended() in messages
    client.send(codec.Execute("c1", 5), codec.Sync())  # 4 of the 14 left
    messages = client.until(codec.ReadyForQuery)
    assert len(rows_in(messages)) == 4 and codec.PortalSuspended() not in messages
    assert any(isinstance(m, codec.CommandComplete) for m in messages)


def test_result_formats_are_checked_before_a_described_portal_runs(raw: Raw) -> None:
    """Describe of a portal followed by its Execute (psycopg pipelines both) runs the
    query at Describe: a wrong count of result formats was refused after the charge."""
    served, connect = raw
    client = connect()
    client.send(codec.Parse("", "SELECT sex, COUNT(*) FROM adult GROUP BY sex"),
                codec.Bind("", "", (), (), (0, 1, 0)), codec.Describe("P", ""),
                codec.Execute("", 0), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    assert errors_in(messages) == ["08P01"] and not rows_in(messages)
    assert served.spent() == 0


@pytest.mark.parametrize(("param_formats", "result_formats"), [((), (7,)), ((), (-1,)),
                                                               ((3,), ())])
def test_an_unknown_format_code_is_an_error_that_keeps_the_connection(
        raw: Raw, param_formats: tuple[int, ...], result_formats: tuple[int, ...]) -> None:
    """A Bind with format code 7 closed the connection (FATAL 08P01); PostgreSQL answers
    an ERROR (22023) and the session goes on."""
    served, connect = raw
    client = connect()
    params = (b"30",) if param_formats else ()
    sql = "SELECT COUNT(*) FROM adult WHERE age > $1" if params else "SELECT COUNT(*) FROM adult"
    client.send(codec.Parse("", sql, (23,) if params else ()),
                codec.Bind("", "", param_formats, params, result_formats),
                codec.Execute("", 0), codec.Sync())
    messages = client.until(codec.ReadyForQuery)
    assert errors_in(messages) == ["22023"] and not rows_in(messages)
    assert served.spent() == 0
    assert rows_in(client.query("SELECT 1 AS one")) == [(b"1",)]
