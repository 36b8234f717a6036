"""Shared fixtures: the demo database built once per run, a fresh ledger per test."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dpproxy.demo import DEFAULT_SEED, build_demo
from dpproxy.session import Engine, Session

ROOT = Path(__file__).resolve().parent.parent
DEMO_POLICY = ROOT / "policies" / "demo.toml"


@pytest.fixture(scope="session")
def demo_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo(tmp_path_factory.mktemp("demo") / "demo.duckdb", seed=DEFAULT_SEED)


PolicyFactory = Callable[..., Path]


@pytest.fixture
def make_policy(tmp_path: Path, demo_database: Path) -> PolicyFactory:
    """Write a copy of the demo policy into tmp_path, on the shared demo database, with its
    own ledger and audit log; `replace` maps TOML snippets to their replacements."""
    counter = iter(range(1_000_000))

    def make(replace: dict[str, str] | None = None, text: str | None = None) -> Path:
        source = text if text is not None else DEMO_POLICY.read_text()
        n = next(counter)
        source = source.replace('path = "../data/demo.duckdb"',
                                f'path = "{demo_database.as_posix()}"')
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
