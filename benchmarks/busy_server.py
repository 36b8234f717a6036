"""User-level queries on a PostgreSQL server that other clients write to.

A bound check (`dpproxy.bounds`) lets the backend run a query without contribution
bounding where no person exceeds the bounds. On PostgreSQL a check is read in one
snapshot, and any commit on the server, to any table, makes a new one. Before checks
were carried, a query after such a commit was bounded (until the check was read again,
at most once a minute): on a server with other writers, nearly always. Now a check that
held is carried to the new snapshot: one scan of the table's row headers lists the
people with a row version since, and only theirs are checked again.

Table `t` of Adult-like people with 1–5 rows each (within the policy's bounds of 5 rows
and one occupation per person), in a schema `busy_bench` of the database --pg-dsn names
(dropped afterwards). Each query runs, interleaved in every repetition so all see the
same machine load: exactly, on the server; through a dpproxy session with no commit
since its last query (the check reused); through it after a commit to another table,
and after a new person's rows were inserted into `t` (the check carried); and, after a
commit elsewhere, through a session that does not carry checks (`CARRY_CHECKS` off,
its check never read again during the run: bounded, as before). The median of
--repeat runs of each, and each ÷ the exact query.

    python benchmarks/busy_server.py [--pg-rows 1000000] [--repeat 7]
        [--pg-dsn postgresql://postgres@127.0.0.1:5432/postgres] [--out DIR]

Writes benchmarks/results/busy_server.json and busy_server.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.backends import postgres as pg_backend  # noqa: E402
from dpproxy.session import Engine  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import (  # noqa: E402
    OCCUPATIONS,
    add_out_argument,
    drop_pg_schema,
    occupation_case,
    publish,
)

SCHEMA = "busy_bench"
QUERIES = [
    ("(a) COUNT(*)", "SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t"),
    ("(b) occupation, COUNT, AVG(income)",
     "SELECT occupation, COUNT(*), AVG(income) FROM t GROUP BY occupation",
     "SELECT occupation, COUNT(*), AVG(income) FROM t GROUP BY occupation"),
    ("(c) SUM(hours) WHERE age > 40", "SELECT SUM(hours_per_week) FROM t WHERE age > 40",
     "SELECT SUM(hours_per_week) FROM t WHERE age > 40"),
]


def build(dsn: str, rows: int) -> str:
    """Table t (~rows rows, people of 1–5 rows) and an unrelated table `elsewhere` in schema
    busy_bench; the DSN that reads them."""
    people = max(1, rows // 3)
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        con.execute(f"CREATE SCHEMA {SCHEMA}")
        con.execute("SELECT setseed(0.42)")
        con.execute(f"""
            CREATE TABLE {SCHEMA}.people AS
            SELECT p AS uid, CAST(17 + floor(random() * 74) AS INTEGER) AS age,
                   CAST(1 + floor(random() * 5) AS INTEGER) AS n, random() AS r
              FROM generate_series(1, {people}) AS p""")
        con.execute(f"""
            CREATE TABLE {SCHEMA}.t AS
            SELECT uid, age, {occupation_case()} AS occupation,
                   CAST(round(CAST(random() * 100000 AS NUMERIC), 2) AS DOUBLE PRECISION)
                       AS income,
                   CAST(1 + floor(random() * 99) AS INTEGER) AS hours_per_week
              FROM {SCHEMA}.people, generate_series(1, n) AS j""")
        con.execute(f"DROP TABLE {SCHEMA}.people")
        con.execute(f"ANALYZE {SCHEMA}.t")
        # no autovacuum there: its ANALYZE would be one more commit between the queries
        con.execute(f"CREATE TABLE {SCHEMA}.elsewhere (x INTEGER) "
                    "WITH (autovacuum_enabled = false)")
    return psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={SCHEMA}")


def policy_text(dsn: str, ledger: Path) -> str:
    occupations = ", ".join(f'"{o}"' for o in OCCUPATIONS)
    return f"""
[backend]
kind = "postgres"
dsn = "{dsn}"
[ledger]
path = "{ledger.as_posix()}"
[audit]
path = "{ledger.with_suffix('.jsonl').as_posix()}"
[tables.t]
privacy_unit = "uid"
max_rows_per_unit = 5
max_groups_per_unit = 1
[tables.t.columns]
uid = {{ type = "int", nullable = false }}
age = {{ type = "int", lower = 17, upper = 90, nullable = false }}
occupation = {{ type = "text", public_values = [{occupations}] }}
income = {{ type = "float", lower = 0, upper = 100000, nullable = false }}
hours_per_week = {{ type = "int", lower = 1, upper = 99, nullable = false }}
[analysts.bench]
budget = {{ epsilon = 1e12, delta = 0.5 }}
tables = ["t"]
"""


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def measure(dsn: str, repeat: int, tmp: Path) -> dict[str, Any]:
    states = ["exact", "quiet", "carried", "appended", "bounded"]
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as raw, \
            Engine.from_path(_policy(tmp, dsn, "carry")) as carrying, \
            Engine.from_path(_policy(tmp, dsn, "bound")) as bounding:
        sessions = {"carry": carrying.session("bench"), "bound": bounding.session("bench")}
        # the session that does not carry its check never reads it again meanwhile
        bounding.backend.recheck_s = float("inf")  # type: ignore[attr-defined]
        run = 0
        newcomer = 10**9  # uids of people inserted during the run

        def dp(sql: str, carry: bool) -> float:
            nonlocal run
            run += 1
            session = sessions["carry" if carry else "bound"]
            # a fresh ε each time: a repeat would be answered from the answer cache
            session.set_option("epsilon", 1.0 + run * 1e-9)
            pg_backend.CARRY_CHECKS = carry
            try:
                return timed(lambda: session.execute(sql))
            finally:
                pg_backend.CARRY_CHECKS = True

        def commit_elsewhere() -> None:
            raw.execute(f"INSERT INTO {SCHEMA}.elsewhere VALUES (1)")

        def insert_a_person() -> None:
            nonlocal newcomer
            newcomer += 1
            raw.execute(f"INSERT INTO {SCHEMA}.t VALUES ({newcomer}, 40, 'Sales', 5e4, 40), "
                        f"({newcomer}, 40, 'Sales', 6e4, 38)")

        for label, dp_sql, exact_sql in QUERIES:
            for carry in (True, False):  # warm-up: each session reads its check once
                dp(dp_sql, carry)
            raw.execute(exact_sql).fetchall()
            times: dict[str, list[float]] = {s: [] for s in states}
            before = {k: _counts(e) for k, e in (("carry", carrying), ("bound", bounding))}
            for _ in range(repeat):
                times["exact"].append(timed(lambda sql=exact_sql: raw.execute(sql).fetchall()))
                commit_elsewhere()
                times["carried"].append(dp(dp_sql, True))
                times["quiet"].append(dp(dp_sql, True))  # no commit since
                insert_a_person()
                times["appended"].append(dp(dp_sql, True))
                commit_elsewhere()
                times["bounded"].append(dp(dp_sql, False))
            medians = {s: statistics.median(t) for s, t in times.items()}
            out[label] = {
                "ms": medians,
                "ratio": {s: medians[s] / medians["exact"] for s in states[1:]},
                "carried_over_bounded": medians["bounded"] / medians["carried"],
                # how each session's backend ran the timed queries
                "bounding": {k: {f: v - before[k][f] for f, v in _counts(e).items()}
                             for k, e in (("carry", carrying), ("bound", bounding))},
            }
    return out


def _policy(tmp: Path, dsn: str, name: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(policy_text(dsn, tmp / f"{name}.sqlite"))
    return path


def _counts(engine: Engine) -> dict[str, int]:
    b = engine.backend.bounding  # type: ignore[attr-defined]
    return {"checks": b.checks, "carried": b.carried, "unbounded": b.skipped,
            "bounded": b.enforced + b.split + b.excess}


def markdown(results: dict[str, Any]) -> str:
    lines = [
        f"PostgreSQL {results['server']}, {results['rows']:,} rows of "
        f"~{results['rows'] // 3:,} people (1–5 rows each, within the bounds); median of "
        f"{results['repeat']} interleaved runs (ms, and ÷ the exact query); "
        f"Python {results['python']}.",
        "",
        "| query | exact | no commit since the last query | after a commit elsewhere: "
        "check carried | after an insert into t: check carried | after a commit "
        "elsewhere: bounded (check not carried) | bounded ÷ carried |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in results["queries"].items():
        ms, ratio = r["ms"], r["ratio"]
        lines.append(
            f"| {label} | {ms['exact']:.1f} | {ms['quiet']:.1f} ({ratio['quiet']:.2f}×) "
            f"| {ms['carried']:.1f} ({ratio['carried']:.2f}×) "
            f"| {ms['appended']:.1f} ({ratio['appended']:.2f}×) "
            f"| {ms['bounded']:.1f} ({ratio['bounded']:.2f}×) "
            f"| {r['carried_over_bounded']:.2f}× |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    add_out_argument(parser)
    args = parser.parse_args()
    with psycopg.connect(args.pg_dsn, connect_timeout=5) as con:
        (server,) = con.execute("SHOW server_version").fetchone()  # type: ignore[misc]
    print(f"building {args.pg_rows:,} rows in PostgreSQL …", file=sys.stderr)
    dsn = build(args.pg_dsn, args.pg_rows)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            queries = measure(dsn, args.repeat, Path(tmp))
    finally:
        drop_pg_schema(args.pg_dsn, SCHEMA)
    results = {"server": str(server).split()[0], "rows": args.pg_rows,
               "repeat": args.repeat, "python": platform.python_version(),
               "queries": queries}
    table = markdown(results)
    publish("busy_server", args.out, results, table)
    print(table)


if __name__ == "__main__":
    main()
