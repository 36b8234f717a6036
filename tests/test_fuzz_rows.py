"""Seeded random row expressions (numbers, text, dates) in WHERE, GROUP BY and aggregate
arguments: every query is accepted or refused alike on DuckDB and PostgreSQL, and none
that is accepted fails in the backend. (Two rewrite faults this found, a CASE holding a
DATE_TRUNC and a timestamp constant minus a date, are cases of
tests/test_date_arithmetic.py.)"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from dpproxy import errors
from dpproxy.session import Engine

from .test_server_support import BIG_BUDGET

NUMBERS = ["age", "hours_per_week", "education_num", "capital_gain", "3", "-2", "0.5"]
TEXTS = ["sex", "education", "income", "occupation", "'x'"]
UNITS = ["day", "week", "month", "quarter", "year"]



class Grammar:
    """Random expressions of the kinds the analyzer accepts, at most three levels deep."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: list[Callable[[int], str]], depth: int) -> str:
        return self.rng.choice(options[:2] if depth > 2 else options)(depth + 1)

    def number(self, d: int = 0) -> str:
        r = self.rng
        return self.pick([
            lambda d: r.choice(NUMBERS),
            lambda d: r.choice(NUMBERS),
            lambda d: f"({self.number(d)} {r.choice('+-*/%')} {self.number(d)})",
            lambda d: f"ROUND({self.number(d)}, {r.randrange(3)})",
            lambda d: f"LEAST({self.number(d)}, {self.number(d)})",
            lambda d: f"CASE WHEN {self.predicate(d)} THEN {self.number(d)} ELSE "
                      f"{self.number(d)} END",
            lambda d: f"LENGTH({self.text(d)})",
            lambda d: f"COALESCE({self.number(d)}, {self.number(d)})",
        ], d)

    def text(self, d: int = 0) -> str:
        r = self.rng
        return self.pick([
            lambda d: r.choice(TEXTS),
            lambda d: r.choice(TEXTS),
            lambda d: f"LOWER({self.text(d)})",
            lambda d: f"({self.text(d)} || {self.text(d)})",
            lambda d: f"SUBSTRING({self.text(d)}, {r.randrange(1, 4)}, {r.randrange(4)})",
            lambda d: f"CAST({self.number(d)} AS TEXT)",
        ], d)

    def date(self, d: int = 0) -> str:
        r = self.rng
        return self.pick([
            lambda d: "day",
            lambda d: r.choice(["DATE '2024-03-01'", "CURRENT_DATE"]),
            lambda d: f"DATE_TRUNC('{r.choice(UNITS)}', {self.date(d)})",
            lambda d: f"({self.date(d)} + {r.randrange(-40, 40)})",
            lambda d: f"({self.date(d)} - INTERVAL '{r.randrange(1, 9)} "
                      f"{r.choice(['days', 'weeks'])}')",
            lambda d: f"CASE WHEN {self.date(d)} > DATE '2024-05-01' THEN {self.date(d)} "
                      f"ELSE {self.date(d)} END",
            lambda d: f"GREATEST({self.date(d)}, {self.date(d)})",
        ], d)

    def predicate(self, d: int = 0) -> str:
        r = self.rng
        return r.choice([
            lambda: f"{self.number(d + 1)} > {self.number(d + 1)}",
            lambda: f"{self.text(d + 1)} = {self.text(d + 1)}",
            lambda: f"{self.text(d + 1)} LIKE '%a%'",
            lambda: f"{self.number(d + 1)} BETWEEN 1 AND 50",
        ])()

    def query(self) -> str:
        r = self.rng
        n = "LEAST(GREATEST({}, -100), 100)"
        dated = (f"EXTRACT({r.choice(['year', 'month', 'dow', 'doy'])} FROM {self.date()})"
                 if r.random() < 0.5 else f"({self.date()} - {self.date()})")
        return r.choice([
            lambda: f"SELECT COUNT(*) FROM adult WHERE {self.predicate()}",
            lambda: f"SELECT SUM({n.format(self.number())}) FROM adult WHERE "
                    f"{self.predicate()}",
            lambda: f"SELECT {self.text()} AS k, COUNT(*) FROM adult GROUP BY 1",
            lambda: f"SELECT COUNT(*) FROM visits WHERE {self.date()} > {self.date()}",
            lambda: f"SELECT {self.date()} AS k, COUNT(*) FROM visits GROUP BY 1",
            lambda: f"SELECT TO_CHAR({self.date()}, 'YYYY-MM') AS k, COUNT(*) FROM visits "
                    "GROUP BY 1",
            lambda: f"SELECT SUM({n.format(dated)}) FROM visits",
        ])()




@pytest.mark.parametrize("seed", [20261124])
def test_random_queries_run_alike_on_both_backends(make_policy: Callable[..., Path],
                                                   pg_demo_dsn: str, seed: int) -> None:
    """60 queries (about 20 s: each runs on both backends): the same outcome
    class on both, never a backend error (which would come after the charge, or as
    check_plans' refusal). A longer run, 1,200 date queries, found nothing more."""
    duck = make_policy(BIG_BUDGET)
    text = duck.read_text().replace('kind = "duckdb"', f'kind = "postgres"\ndsn = "{pg_demo_dsn}"')
    postgres = duck.with_name(duck.stem + "_pg.toml")
    postgres.write_text(text)
    grammar = Grammar(seed)
    with Engine.from_path(duck) as on_duckdb, Engine.from_path(postgres) as on_postgres:
        sessions = [e.session("alice", epsilon=1.0) for e in (on_duckdb, on_postgres)]
        accepted = 0
        for _ in range(60):
            sql = grammar.query()
            outcomes = []
            for session in sessions:
                try:
                    session.execute(sql)
                    outcomes.append("answered")
                except errors.BackendError as exc:
                    pytest.fail(f"{sql}: {exc.message} ({exc.detail})")
                except errors.Error as exc:
                    outcomes.append(type(exc).__name__)
            assert outcomes[0] == outcomes[1], (sql, outcomes)
            accepted += outcomes[0] == "answered"
    assert accepted > 30  # the grammar makes mostly accepted queries
