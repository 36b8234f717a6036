"""Several `dpproxy serve` processes on one PostgreSQL ledger (issue 5): concurrent clients on
two proxies release exactly what the shared budget buys, and a proxy killed with SIGKILL in
the middle of the load loses no charge."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from dpproxy.accountant import Cost, Ledger, PostgresStorage
from dpproxy.errors import InvalidPolicy, NotSupportedError
from dpproxy.policy import load_policy
from dpproxy.session import open_ledger
from tests.pg import free_port

from .test_server_support import PASSWORD

REPO = Path(__file__).resolve().parents[1]
ALICE = "analyst:alice"
CLIENTS_PER_PROXY = 16
COST = Decimal("0.1")  # the demo policy's default ε per query
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL and fork")


@pytest.fixture
def ledger_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema name for one test's ledger; dropped afterwards."""
    schema = f"dpproxy_test_{secrets.token_hex(6)}"
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as con:
        con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def shared_policy(make_policy: Callable[..., Path], dsn: str, schema: str,
                  budget: str = "epsilon = 10.0, delta = 1e-5") -> Path:
    """A copy of the demo policy whose ledger is the PostgreSQL schema."""
    path = make_policy({"budget = { epsilon = 10.0, delta = 1e-5 }": f"budget = {{ {budget} }}"})
    text = re.sub(r'\[ledger\]\npath = "[^"]*"',
                  f'[ledger]\ndsn = "{dsn}"\nschema = "{schema}"', path.read_text())
    path.write_text(text)
    return path


class Proxy:
    """`dpproxy serve` in a subprocess on its own port."""

    def __init__(self, policy: Path, log: Path) -> None:
        self.port = free_port()
        self._log = log.open("w")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dpproxy", "serve", "--policy", str(policy), "--port",
             str(self.port), "--log-level", "WARNING"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=5):
                    break
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"proxy did not start: {log.read_text()[-2000:]}") \
                        from None
                time.sleep(0.1)

    def dsn(self) -> str:
        return (f"host=127.0.0.1 port={self.port} user=alice dbname=demo "
                f"password={PASSWORD} connect_timeout=10")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


class Load:
    """Client threads, each on its own connection, sending distinct queries (a repeat would
    be served from the answer cache for free) until refused, cut off, or `per_client`."""

    def __init__(self, proxies: list[Proxy], per_client: int) -> None:
        self.answers = 0
        self.refused = 0
        self.cut_off = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(proxy, n, per_client))
                         for n, proxy in enumerate(p for p in proxies
                                                   for _ in range(CLIENTS_PER_PROXY))]

    def _client(self, proxy: Proxy, n: int, per_client: int) -> None:
        try:
            conn = psycopg.connect(proxy.dsn(), autocommit=True)
        except psycopg.Error as exc:
            with self._lock:
                self.errors.append(f"connect: {exc}")
            return
        with conn:
            for i in range(per_client):
                try:
                    rows = conn.execute(f"SELECT COUNT(*) FROM adult WHERE age <> "
                                        f"{100_000 + n * 1000 + i}").fetchall()
                except psycopg.OperationalError as exc:
                    with self._lock:
                        if exc.sqlstate == "53400":  # privacy budget exceeded
                            self.refused += 1
                        else:  # the proxy is gone
                            self.cut_off += 1
                    return
                except psycopg.Error as exc:
                    with self._lock:
                        self.errors.append(f"{exc.sqlstate}: {exc}")
                    return
                assert len(rows) == 1
                with self._lock:
                    self.answers += 1

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads)


def test_two_proxies_release_exactly_the_shared_budget(
        make_policy: Callable[..., Path], pg_dsn: str, ledger_schema: str,
        tmp_path: Path) -> None:
    budget = Decimal("4.0")  # exactly 40 queries of ε = 0.1
    policies = [shared_policy(make_policy, pg_dsn, ledger_schema,
                              f"epsilon = {budget}, delta = 1e-5") for _ in range(2)]
    proxies = [Proxy(p, tmp_path / f"proxy{n}.log") for n, p in enumerate(policies)]
    try:
        load = Load(proxies, per_client=40).start()
        load.join()
    finally:
        for proxy in proxies:
            proxy.stop()
    assert load.errors == []
    assert load.cut_off == 0
    assert load.answers == 40  # exactly what the shared budget buys, across both proxies
    assert load.refused == 2 * CLIENTS_PER_PROXY  # every client ran until refused
    with Ledger(PostgresStorage(pg_dsn, ledger_schema), {}) as ledger:
        status = ledger.status(ALICE)
        assert status.spent.epsilon == float(budget) == status.budget.epsilon
        assert status.remaining.epsilon == 0.0
        assert len(ledger.history(ALICE, limit=1000)) == 40


def test_proxy_killed_mid_load_loses_no_charge(
        make_policy: Callable[..., Path], pg_dsn: str, ledger_schema: str,
        tmp_path: Path) -> None:
    policies = [shared_policy(make_policy, pg_dsn, ledger_schema) for _ in range(2)]
    victim, survivor = (Proxy(p, tmp_path / f"proxy{n}.log") for n, p in enumerate(policies))
    try:
        load = Load([victim], per_client=20).start()  # 320 queries: more than ε = 10 buys
        deadline = time.monotonic() + 30
        while load.answers < 16 and time.monotonic() < deadline:
            time.sleep(0.005)
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(timeout=10)
        load.join()
        # the other proxy goes on charging the same ledger
        with psycopg.connect(survivor.dsn(), autocommit=True) as conn:
            conn.execute("SELECT COUNT(*) FROM adult WHERE age <> -1").fetchall()
    finally:
        victim.stop()
        survivor.stop()
    assert victim.process.returncode == -signal.SIGKILL
    assert load.errors == []
    assert load.answers >= 16 and load.cut_off > 0  # killed in the middle of the load
    with Ledger(PostgresStorage(pg_dsn, ledger_schema), {}) as ledger:
        charges = len(ledger.history(ALICE, limit=10_000))
        # every answer received was charged; in-flight charges may add a few, never fewer
        assert load.answers + 1 <= charges <= load.answers + 1 + 2 * CLIENTS_PER_PROXY
        assert ledger.status(ALICE).spent.epsilon == float(COST * charges)


def test_policy_ledger_dsn_opens_the_postgres_ledger(
        make_policy: Callable[..., Path], pg_dsn: str, ledger_schema: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = shared_policy(make_policy, pg_dsn, ledger_schema)
    policy = load_policy(path)
    assert policy.shared_ledger is not None and policy.shared_ledger.schema == ledger_schema
    with open_ledger(policy) as ledger:
        assert ledger.status(ALICE).budget == Cost(10.0, 1e-5)
        assert ledger._store.kind == "postgresql"
    # the password comes from the environment variable named by password_env
    text = path.read_text().replace(f'schema = "{ledger_schema}"',
                                    f'schema = "{ledger_schema}"\npassword_env = "DPP_LEDGER_PW"')
    path.write_text(text)
    with pytest.raises(InvalidPolicy, match="DPP_LEDGER_PW, which is not set"):
        open_ledger(load_policy(path))
    monkeypatch.setenv("DPP_LEDGER_PW", "unused-with-trust-auth")
    with open_ledger(load_policy(path)) as ledger:
        assert ledger.status(ALICE).spent == Cost(0.0, 0.0)
    # verifiers cannot be stored in a PostgreSQL ledger: `analyst passwd` refuses clearly
    from dpproxy.server.credentials import CredentialStore

    with pytest.raises(NotSupportedError, match="ledger is in PostgreSQL"):
        CredentialStore(load_policy(path)).set_password("alice", "secret")


@pytest.mark.parametrize(("section", "problem"), [
    ('dsn = "postgresql://u:secret@127.0.0.1/db"', "must not contain a password"),
    ('dsn = "postgresql://u@127.0.0.1/db"\npath = "x.sqlite"', "not both"),
    ('dsn = "postgresql://u@127.0.0.1/db"\nschema = "a-b"', "plain identifier"),
    ('path = "x.sqlite"\nschema = "s"', "only applies to a PostgreSQL ledger"),
])
def test_bad_ledger_sections_are_refused(make_policy: Callable[..., Path], section: str,
                                         problem: str) -> None:
    path = make_policy()
    path.write_text(re.sub(r'\[ledger\]\npath = "[^"]*"', f"[ledger]\n{section}",
                           path.read_text()))
    with pytest.raises(InvalidPolicy, match=problem):
        load_policy(path)
