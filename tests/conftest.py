"""Shared fixtures: the demo database built once per run, a fresh ledger per test."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpproxy.backends import Backend, open_backend
from dpproxy.demo import DEFAULT_SEED, build_demo
from dpproxy.policy import Policy
from dpproxy.session import Engine, Session
from tests.test_server_support import ServeFactory, serving

ROOT = Path(__file__).resolve().parent.parent
DEMO_POLICY = ROOT / "policies" / "demo.toml"


@pytest.fixture
def backend(policy: Policy) -> Iterator[Backend]:
    """The backend of the module's `policy` fixture, opened for one test."""
    opened = open_backend(policy)
    yield opened
    opened.close()


@pytest.fixture(scope="session")
def demo_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo(tmp_path_factory.mktemp("demo") / "demo.duckdb", seed=DEFAULT_SEED)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """Admin DSN of a PostgreSQL server (see tests/pg.py); skips without one, except in
    CI (CI=true), where it fails."""
    from tests.pg import PostgresUnavailable, postgres_server

    with contextlib.ExitStack() as stack:
        try:
            dsn = stack.enter_context(postgres_server())
        except PostgresUnavailable as exc:
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                pytest.fail(f"PostgreSQL is required in CI: {exc}")
            pytest.skip(f"no PostgreSQL: {exc}")
        yield dsn


@pytest.fixture(scope="session")
def pg_demo_dsn(pg_dsn: str) -> Iterator[str]:
    """A throwaway database holding the demo tables, the same rows as `demo_database`."""
    from dpproxy.demo import load_demo_postgres
    from tests.pg import scratch_database

    with scratch_database(pg_dsn) as dsn:
        load_demo_postgres(dsn, seed=DEFAULT_SEED)
        yield dsn


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    """The backend `make_policy` points at: DuckDB, or each of a module's `BACKENDS`
    (`pytest_generate_tests`)."""
    return str(getattr(request, "param", "duckdb"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module declaring BACKENDS = ("duckdb", "postgres") runs each test that builds
    on `backend_kind` once per backend (unless the test parametrizes it itself)."""
    backends = getattr(metafunc.module, "BACKENDS", None)
    if not backends or "backend_kind" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "backend_kind" in (names.replace(" ", "").split(",") if isinstance(names, str)
                              else names):
            return  # the test names its own backends
    metafunc.parametrize("backend_kind", backends, indirect=True)


PolicyFactory = Callable[..., Path]


@pytest.fixture
def make_policy(tmp_path: Path, demo_database: Path, backend_kind: str,
                request: pytest.FixtureRequest) -> PolicyFactory:
    """Write a copy of the demo policy into tmp_path, on the shared demo database (in
    DuckDB, or in PostgreSQL when `backend_kind` says so), with its own ledger and audit
    log; `replace` maps TOML snippets to their replacements."""
    counter = iter(range(1_000_000))
    pg_dsn = request.getfixturevalue("pg_demo_dsn") if backend_kind == "postgres" else None

    def make(replace: dict[str, str] | None = None, text: str | None = None) -> Path:
        source = text if text is not None else DEMO_POLICY.read_text()
        n = next(counter)
        source = source.replace('path = "../data/demo.duckdb"',
                                f'path = "{demo_database.as_posix()}"')
        if pg_dsn is not None and text is None:
            source = re.sub(r'\[backend\]\n[^\[]*',
                            f'[backend]\nkind = "postgres"\ndsn = "{pg_dsn}"\n\n', source,
                            count=1)
        source = re.sub(r'\[ledger\]\npath = "[^"]*"', f'[ledger]\npath = "ledger{n}.sqlite"',
                        source)
        source = re.sub(r'\[audit\]\npath = "[^"]*"', f'[audit]\npath = "audit{n}.jsonl"',
                        source)
        for old, new in (replace or {}).items():
            assert old in source, f"policy snippet not found: {old!r}"
            source = source.replace(old, new)
        path = tmp_path / f"policy{n}.toml"
        path.write_text(source)
        return path

    return make


@pytest.fixture
def demo_policy(make_policy: PolicyFactory) -> Path:
    return make_policy()


@pytest.fixture
def engine(demo_policy: Path) -> Iterator[Engine]:
    with Engine.from_path(demo_policy) as eng:
        yield eng


@pytest.fixture
def alice(engine: Engine) -> Session:
    return engine.session("alice")


@pytest.fixture
def serve(make_policy: PolicyFactory) -> Iterator[ServeFactory]:
    """Wire servers on fresh copies of the demo policy (`serving`), stopped at teardown."""
    yield from serving(make_policy)
