"""PostgreSQL for the tests: a running server, or a throwaway cluster started here.

`postgres_server()` yields an admin DSN: `DPPROXY_TEST_PG_DSN` when set, else the server
on 127.0.0.1:5432 when it answers, else a fresh cluster (`initdb` + `pg_ctl`, found on
PATH or under /usr/lib/postgresql/*/bin) in a temporary folder on a free port, run as the
`postgres` user when the tests run as root (initdb refuses root). `scratch_database()`
creates a database with a random name and drops it afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

DSN_ENV = "DPPROXY_TEST_PG_DSN"
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CLUSTER_USER = "postgres"  # who runs initdb and the server when the tests run as root


class PostgresUnavailable(RuntimeError):
    """No server answers and no cluster could be started."""


def answers(dsn: str, timeout_s: int = 2) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=timeout_s) as con:
            con.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def with_dbname(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


def binaries() -> Path | None:
    """The folder holding initdb and pg_ctl, newest version first."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parent.parent.name)
                        if Path(p).parent.parent.name.isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(command: list[str], as_user: str | None) -> None:
    if as_user is not None:
        command = ["runuser", "-u", as_user, "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise PostgresUnavailable(f"{Path(command[0]).name} failed: "
                                  f"{(done.stderr or done.stdout).strip()[-500:]}")


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[str]:
    """Start a new cluster in a temporary folder on a free port; yield its admin DSN;
    stop it and delete the folder."""
    folder = binaries()
    if folder is None:
        raise PostgresUnavailable("no initdb found on PATH or under /usr/lib/postgresql")
    as_user = None
    root = Path(tempfile.mkdtemp(prefix="dpproxy-pg-"))
    if os.geteuid() == 0:
        as_user = CLUSTER_USER
        shutil.chown(root, user=CLUSTER_USER)
    data = root / "data"
    port = free_port()
    try:
        _run([str(folder / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
              "-E", "UTF8", "--locale=C", "--no-sync"], as_user)
        _run([str(folder / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w",
              "-t", "60", "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 "
              "-c fsync=off -c full_page_writes=off", "start"], as_user)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            _run([str(folder / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                  "stop"], as_user)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """An admin DSN: the configured or local server, else a throwaway cluster."""
    configured = os.environ.get(DSN_ENV)
    if configured:
        if not answers(configured, timeout_s=5):
            raise PostgresUnavailable(f"{DSN_ENV} is set but its server does not answer")
        yield configured
        return
    if answers(LOCAL_DSN):
        yield LOCAL_DSN
        return
    with throwaway_cluster() as dsn:
        yield dsn


@contextlib.contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A new, empty database named dpproxy_test_<random>; dropped afterwards."""
    name = f"dpproxy_test_{secrets.token_hex(6)}"
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
