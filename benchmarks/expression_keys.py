"""What GROUP BY over a row expression costs, next to GROUP BY a column.

On the demo database (DuckDB, 32,561 people and 195,572 visits), with public ranges on
adult.age and visits.day, interleaved in one run so both sides see the same machine load:

1. Analysis + plan + rewrite (no backend) of a query keyed by a column and by an
   expression with public keys; the first analysis of an expression key enumerates its
   key set (an in-memory DuckDB over the public values), later ones hit a cache, so the
   cold time is reported apart.
2. End to end through a session (charge, backend, noise, release) against the exact
   query run directly on DuckDB.

    python benchmarks/expression_keys.py [--repeat 20] [--out DIR]

Writes benchmarks/results/expression_keys.json and expression_keys.md (quoted by the
README).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.analyze import Analysis, analyze  # noqa: E402
from dpproxy.analyze.keys import _image  # noqa: E402
from dpproxy.demo import DEFAULT_SEED, build_demo  # noqa: E402
from dpproxy.parse import parse_statements  # noqa: E402
from dpproxy.plan import QueryOptions, plan_query  # noqa: E402
from dpproxy.policy import Policy, load_policy  # noqa: E402
from dpproxy.rewrite import rewrite  # noqa: E402
from dpproxy.session import Engine  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import add_out_argument, publish  # noqa: E402

# (name, DP query, the exact query it estimates)
QUERIES = [
    ("column key (sex)", "SELECT sex, COUNT(*) FROM adult GROUP BY sex",
     "SELECT sex, COUNT(*) FROM adult GROUP BY sex"),
    ("expression key (age / 10 * 10)",
     "SELECT age / 10 * 10, COUNT(*) FROM adult GROUP BY 1",
     "SELECT age // 10 * 10, COUNT(*) FROM adult GROUP BY 1"),
    ("column key (day, 366 values)", "SELECT day, COUNT(*) FROM visits GROUP BY day",
     "SELECT day, COUNT(*) FROM visits GROUP BY day"),
    ("expression key (date_trunc month)",
     "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1",
     "SELECT date_trunc('month', day), COUNT(*) FROM visits GROUP BY 1"),
]


def write_policy(folder: Path, database: Path) -> Path:
    text = (ROOT / "policies" / "demo.toml").read_text()
    text = text.replace('path = "../data/demo.duckdb"', f'path = "{database.as_posix()}"')
    text = re.sub(r'\[ledger\]\npath = "[^"]*"', '[ledger]\npath = "ledger.sqlite"', text)
    text = re.sub(r'\[audit\]\npath = "[^"]*"', '[audit]\npath = "audit.jsonl"', text)
    text = text.replace("budget = { epsilon = 10.0, delta = 1e-5 }",
                        "budget = { epsilon = 1e9, delta = 0.5 }")
    text = text.replace('age = { type = "int", lower = 17, upper = 90, nullable = false }',
                        'age = { type = "int", lower = 17, upper = 90, nullable = false, '
                        "public_range = { step = 1 } }")
    text = text.replace('day = { type = "date", nullable = false }',
                        'day = { type = "date", nullable = false, public_range = '
                        '{ first = "2024-01-01", last = "2024-12-31" } }')
    path = folder / "policy.toml"
    path.write_text(text)
    return path


def prepare(policy: Policy, sql: str) -> None:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst("alice"))
    assert isinstance(analysis, Analysis)
    rewrite(plan_query(analysis, QueryOptions(1.0, 1e-6, "laplace")), "duckdb")


def seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    add_out_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        database = build_demo(folder / "demo.duckdb", seed=DEFAULT_SEED)
        policy_path = write_policy(folder, database)
        policy = load_policy(policy_path)
        cold = {}
        for name, sql, _ in QUERIES:
            _image.cache_clear()
            cold[name] = seconds(lambda sql=sql: prepare(policy, sql))
        planning: dict[str, list[float]] = {name: [] for name, _, _ in QUERIES}
        for _ in range(args.repeat):
            for name, sql, _ in QUERIES:
                planning[name].append(seconds(lambda sql=sql: prepare(policy, sql)))
        end_to_end: dict[str, list[float]] = {name: [] for name, _, _ in QUERIES}
        exact_time: dict[str, list[float]] = {name: [] for name, _, _ in QUERIES}
        exact_db = folder / "exact.duckdb"
        exact_db.write_bytes(database.read_bytes())
        con = duckdb.connect(str(exact_db), read_only=True)
        with Engine.from_path(policy_path) as engine:
            session = engine.session("alice", epsilon=1.0)
            for i in range(args.repeat):
                for name, sql, exact in QUERIES:
                    # a fresh literal each time: no cached answer, a real charge
                    dp = sql.replace("COUNT(*)", f"COUNT(*) + {i}")
                    end_to_end[name].append(seconds(lambda dp=dp: session.execute(dp)))
                    exact_time[name].append(
                        seconds(lambda exact=exact: con.execute(exact).fetchall()))
        con.close()
    rows = []
    for name, _, _ in QUERIES:
        rows.append({
            "query": name,
            "analyze_plan_rewrite_cold_ms": cold[name] * 1e3,
            "analyze_plan_rewrite_ms": statistics.median(planning[name]) * 1e3,
            "dp_ms": statistics.median(end_to_end[name]) * 1e3,
            "exact_ms": statistics.median(exact_time[name]) * 1e3,
            "ratio": statistics.median(end_to_end[name]) / statistics.median(exact_time[name]),
        })
    lines = ["| query | analyze+plan+rewrite, first (ms) | same, later (ms, median) | "
             "DP end to end (ms) | exact on DuckDB (ms) | DP ÷ exact |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['query']} | {r['analyze_plan_rewrite_cold_ms']:.1f} | "
                     f"{r['analyze_plan_rewrite_ms']:.1f} | {r['dp_ms']:.1f} | "
                     f"{r['exact_ms']:.1f} | {r['ratio']:.1f} |")
    table = "\n".join(lines) + "\n"
    publish("expression_keys", args.out, {"repeat": args.repeat, "rows": rows},
            f"Demo database, medians of {args.repeat} interleaved runs "
            "(`python benchmarks/expression_keys.py`).\n\n" + table, quoted=table)
    print(table)


if __name__ == "__main__":
    main()
