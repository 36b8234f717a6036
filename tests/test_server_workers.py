"""`dpproxy serve --workers 2` over real sockets: both workers serve, a CancelRequest
reaching the wrong worker is passed to the owner, the connection limit holds across
workers, 32 clients never overspend a shared budget, SIGTERM drains every worker.
Every wait is bounded; nothing asserts on time."""

from __future__ import annotations

import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from dpproxy.accountant import Ledger
from dpproxy.errors import InvalidParameterValue
from dpproxy.policy import load_policy
from dpproxy.server.server import pid_owner
from dpproxy.server.workers import parse_workers

from .test_server_support import ADMIN_PASSWORD, PASSWORD, admin_policy_snippet

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="worker processes share the port with SO_REUSEPORT")


class Workers:
    """A `dpproxy serve --workers 2` process; its log lines are collected as they come."""

    def __init__(self, policy: Path) -> None:
        self.policy = policy
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dpproxy", "serve", "--policy", str(policy), "--workers",
             "2", "--log-level", "INFO"], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.log: list[str] = []
        self._log_changed = threading.Condition()
        threading.Thread(target=self._read_log, daemon=True).start()
        assert self.process.stdout is not None
        self.port = 0
        for _ in range(50):
            line = self.process.stdout.readline()
            found = re.search(r'postgresql://alice@127\.0\.0\.1:(\d+)/demo', line)
            if found:
                self.port = int(found.group(1))
                break
            if not line:
                break
        assert self.port, "\n".join(self.log)

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._log_changed:
                self.log.append(line)
                self._log_changed.notify_all()

    def wait_for_log(self, condition: Callable[[list[str]], bool]) -> bool:
        """Wait (at most ~60 s) until the log satisfies `condition`."""
        with self._log_changed:
            return self._log_changed.wait_for(lambda: condition(self.log), timeout=60)

    def dsn(self) -> str:
        return (f"host=127.0.0.1 port={self.port} user=alice dbname=demo "
                f"password={PASSWORD} connect_timeout=10")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=90)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)


@pytest.fixture
def workers(make_policy: Callable[..., Path]) -> Iterator[Callable[..., Workers]]:
    started: list[Workers] = []

    def start(replace: dict[str, str] | None = None) -> Workers:
        served = Workers(make_policy({"port = 6432": "port = 0", **(replace or {})}))
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


def _cancel_request(port: int, process_id: int, secret_key: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(struct.pack("!IIII", 16, 80877102, process_id, secret_key))
        sock.recv(1)  # the server closes the connection once it has handled the request


def test_both_workers_serve_and_cancels_reach_the_owner(
        workers: Callable[..., Workers]) -> None:
    served = workers()
    # 32 connections spread by the kernel's hash: all on one worker has probability
    # 2 * 2**-32 (< 1e-9), the false-failure rate of this test's first assertion.
    conns = [psycopg.connect(served.dsn(), autocommit=True) for _ in range(32)]
    try:
        owners = {pid_owner(c.info.backend_pid) for c in conns}
        assert owners == {0, 1}
        assert conns[0].execute("SELECT COUNT(*) FROM adult WHERE age > %s",
                                [30]).fetchone()[0] > 0
        for conn in conns:  # each CancelRequest on a fresh connection, to either worker
            conn.cancel_safe()
        pids = {c.info.backend_pid for c in conns}
        handled = re.compile(r"cancel request for alice \(backend (\d+)\)")
        assert served.wait_for_log(
            lambda log: {int(m.group(1)) for line in log if (m := handled.search(line))}
            >= pids)
        # all 32 landing on the owning worker (nothing to pass on): probability 2**-32
        assert any("passed to worker" in line for line in served.log)
        # a wrong secret key is ignored by the owner, wherever the request lands
        for _ in range(4):
            _cancel_request(served.port, conns[0].info.backend_pid, 12345)
        assert served.wait_for_log(
            lambda log: sum("unknown backend" in line for line in log) >= 4)
        assert conns[0].execute("SELECT 1").fetchone() == (1,)  # nothing was disturbed
    finally:
        for conn in conns:
            conn.close()


def test_connection_limit_holds_across_workers(workers: Callable[..., Workers]) -> None:
    served = workers({"max_connections = 100": "max_connections = 3"})
    conns = [psycopg.connect(served.dsn(), autocommit=True) for _ in range(3)]
    try:
        for _ in range(4):  # wherever it lands, the fourth is one too many
            with pytest.raises(psycopg.OperationalError) as refused:
                psycopg.connect(served.dsn())
            assert "too many" in str(refused.value)
        conns.pop().close()
        for _ in range(200):  # bounded: the owning worker frees the slot on the goodbye
            try:
                psycopg.connect(served.dsn()).close()
                break
            except psycopg.OperationalError:
                continue
        else:
            pytest.fail("a freed connection slot was never reused")
    finally:
        for conn in conns:
            conn.close()


def test_analysts_added_and_removed_reach_every_worker(
        workers: Callable[..., Workers]) -> None:
    """An admin adds bob (and his password) through one worker: 32 logins of bob succeed,
    on both workers. Removed through one worker, bob's connections end on both at their
    next statement. (All 32 on one worker: probability 2 * 2**-32, this test's
    false-failure rate.)"""
    served = workers(admin_policy_snippet())
    admin = f"{served.dsn().replace('user=alice', 'user=admin').replace(PASSWORD, ADMIN_PASSWORD)}"
    bob_dsn = served.dsn().replace("user=alice", "user=bob").replace(PASSWORD, "bob-secret")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CALL dpproxy.add_analyst('bob', ARRAY['adult'], 5.0)")
        conn.execute("ALTER ROLE bob PASSWORD 'bob-secret'")
    bobs = [psycopg.connect(bob_dsn, autocommit=True) for _ in range(32)]
    try:
        assert {pid_owner(c.info.backend_pid) for c in bobs} == {0, 1}
        for bob in bobs:
            assert bob.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CALL dpproxy.remove_analyst('bob')")
        for bob in bobs:
            with pytest.raises(psycopg.OperationalError) as gone:
                bob.execute("SELECT 1")
            assert gone.value.sqlstate == "28000"
    finally:
        for bob in bobs:
            bob.close()


def _worker_pids(parent: int) -> list[int]:
    """The server's worker processes (spawned children; not multiprocessing's tracker)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_restarted_worker_serves_the_policy_its_siblings_serve(
        workers: Callable[..., Workers]) -> None:
    """A policy edit beyond the analysts waits for the server's restart: a worker killed
    and started again serves the policy the server started with, as its sibling does (it
    read the file anew, a review found: one query, two ε). An analyst edit made meanwhile
    reaches it all the same. All 32 connections on one worker: probability 2 * 2**-32."""
    served = workers()
    text = served.policy.read_text()
    assert "default_epsilon = 0.1 " in text and '"visits", ' in text
    served.policy.write_text(text.replace("default_epsilon = 0.1 ", "default_epsilon = 0.3 ")
                             .replace('"visits", ', "", 1))
    pids = _worker_pids(served.process.pid)
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGKILL)
    assert served.wait_for_log(lambda log: any("starting another" in line for line in log))
    deadline = time.monotonic() + 60
    while True:  # until the new worker listens too
        conns = [psycopg.connect(served.dsn(), autocommit=True) for _ in range(32)]
        if {pid_owner(c.info.backend_pid) for c in conns} == {0, 1} \
                or time.monotonic() > deadline:
            break
        for conn in conns:
            conn.close()
        time.sleep(0.2)
    try:
        assert {pid_owner(c.info.backend_pid) for c in conns} == {0, 1}
        for conn in conns:
            assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.1",)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT COUNT(*) FROM visits")
    finally:
        for conn in conns:
            conn.close()


def test_32_clients_on_2_workers_never_overspend(workers: Callable[..., Workers]) -> None:
    served = workers()
    clients, queries_each = 32, 4  # 128 distinct queries at ε=0.1 against a budget of ε=10
    start = threading.Barrier(clients, timeout=60)
    answered: list[str] = []
    lock = threading.Lock()

    def client(number: int) -> None:
        with psycopg.connect(served.dsn(), autocommit=True) as conn:
            start.wait()
            for i in range(queries_each):
                try:
                    conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s",
                                 [number * queries_each + i]).fetchall()
                    outcome = "rows"
                except psycopg.Error as exc:
                    outcome = exc.sqlstate or "?"
                with lock:
                    answered.append(outcome)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(answered) == clients * queries_each
    assert set(answered) <= {"rows", "53400"}
    assert answered.count("rows") == 100  # exactly the budget, across both workers
    assert served.stop() == 0
    with Ledger(load_policy(served.policy).ledger_path, {}) as ledger:
        assert ledger.status("analyst:alice").spent.epsilon == 10.0
        assert len(ledger.history("analyst:alice", limit=1000)) == 100


def test_sigterm_drains_every_worker(workers: Callable[..., Workers]) -> None:
    served = workers()
    idle = [psycopg.connect(served.dsn(), autocommit=True) for _ in range(8)]
    released: list[int] = []
    stop = threading.Event()

    def busy(number: int) -> None:  # clients querying while the server stops
        try:
            with psycopg.connect(served.dsn(), autocommit=True) as conn:
                for i in range(10_000):
                    if stop.is_set():
                        return
                    conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s",
                                 [number * 10_000 + i]).fetchall()
                    released.append(1)
        except psycopg.Error:
            return  # the server went away: expected

    threads = [threading.Thread(target=busy, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(3000):  # bounded: wait until queries are flowing
            if len(released) >= 8:
                break
            threading.Event().wait(0.01)
        assert served.stop() == 0  # every worker stopped cleanly
        for conn in idle:  # idle clients were told, with PostgreSQL's admin_shutdown
            with pytest.raises(psycopg.OperationalError) as ended:
                conn.execute("SELECT 1")
            assert "terminating connection" in str(ended.value) or conn.closed
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for conn in idle:
            conn.close()
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", served.port), timeout=5).close()
    assert sum("server stopped" in line for line in served.log) == 2
    with Ledger(load_policy(served.policy).ledger_path, {}) as ledger:
        # no released answer without its charge
        assert len(ledger.history("analyst:alice", limit=10**6)) >= len(released)


def test_workers_stop_when_their_parent_is_killed(workers: Callable[..., Workers]) -> None:
    served = workers()
    with psycopg.connect(served.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    served.process.send_signal(signal.SIGKILL)
    served.process.wait(timeout=30)
    # the kernel tells each worker (SIGTERM): they shut down and stop listening
    assert served.wait_for_log(lambda log: sum("server stopped" in line for line in log) == 2)
    for _ in range(300):  # bounded: both listening sockets close as the workers exit
        try:
            socket.create_connection(("127.0.0.1", served.port), timeout=5).close()
        except OSError:
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail("a worker kept listening after its parent was killed")


def test_workers_argument() -> None:
    assert parse_workers("3") == 3
    assert parse_workers("auto") == (os.cpu_count() or 1)  # Linux: one per core
    for bad in ("0", "128", "two", ""):
        with pytest.raises(InvalidParameterValue, match="--workers must be 1 to 127 or auto"):
            parse_workers(bad)
