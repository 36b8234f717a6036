"""What a join with a public lookup table costs in the rewritten statement, on DuckDB.

A synthetic private table of N rows (default 2M) with an occupation column is joined with
two public tables of 14 occupations: `lut` (occupation declared unique: joined through
DISTINCT ON) and `fan` (each occupation 3 times: the join fans every row out to 3).
For a row-level table (no privacy unit; the fan-out join then numbers rows first) and a
user-level one (≤ 5 rows per unit), each query's rewritten statement is run through the
backend's exact-aggregate path (no noise, no cache), interleaved with the other queries of
its group so all see the same machine load; the median over --repeat runs is reported and
divided by the time of the same statement without a join (GROUP BY occupation).

    python benchmarks/joins.py [--rows 2000000] [--repeat 5] [--out DIR]

Writes benchmarks/results/joins.json and joins.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.analyze import Analysis, analyze  # noqa: E402
from dpproxy.backends.duckdb import DuckDBBackend  # noqa: E402
from dpproxy.parse import parse_statements  # noqa: E402
from dpproxy.plan import QueryOptions, plan_query  # noqa: E402
from dpproxy.policy import Policy, load_policy  # noqa: E402
from dpproxy.rewrite import Rewritten, rewrite  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import OCCUPATIONS, add_out_argument, publish  # noqa: E402

COLLARS = ["white", "white", "blue", "white", "service", "white", "blue", "blue", "blue",
           "blue", "white", "service", "military", "service"]

# (name, query over {t}); the first of the list is the baseline
QUERIES = [
    ("no join: GROUP BY occupation",
     "SELECT occupation, COUNT(*), AVG(income) FROM {t} GROUP BY occupation"),
    ("unique key: GROUP BY collar",
     "SELECT collar, COUNT(*), AVG(income) FROM {t} JOIN lut USING (occupation) "
     "GROUP BY collar"),
    ("fan-out ×3: GROUP BY variant",
     "SELECT variant, COUNT(*), AVG(income) FROM {t} JOIN fan USING (occupation) "
     "GROUP BY variant"),
]


def policy_text(db: Path, ledger: Path) -> str:
    return f"""
[backend]
kind = "duckdb"
path = "{db.as_posix()}"
[ledger]
path = "{ledger.as_posix()}"
[audit]
path = "{ledger.with_suffix('.jsonl').as_posix()}"

[tables.rows]
columns.occupation = {{ type = "text" }}
columns.income = {{ type = "float", lower = 0, upper = 100000 }}

[tables.users]
privacy_unit = "uid"
max_rows_per_unit = 5
max_groups_per_unit = 1
columns.uid = {{ type = "int" }}
columns.occupation = {{ type = "text" }}
columns.income = {{ type = "float", lower = 0, upper = 100000 }}

[tables.lut]
public = true
columns.occupation = {{ type = "text", unique = true }}
columns.collar = {{ type = "text", public_values = ["white", "blue", "service", "military"] }}

[tables.fan]
public = true
columns.occupation = {{ type = "text" }}
columns.variant = {{ type = "int", public_values = [0, 1, 2] }}

[analysts.bench]
budget = {{ epsilon = 1e9, delta = 0.5 }}
tables = ["rows", "users"]
"""


def build(db: Path, rows: int) -> None:
    con = duckdb.connect(str(db))
    occupations = "[" + ", ".join(f"'{o}'" for o in OCCUPATIONS) + "]"
    con.execute(f"""CREATE TABLE users AS SELECT
        (i * 0.3)::BIGINT AS uid,
        {occupations}[1 + (hash(i) % 14)::INTEGER] AS occupation,
        (hash(i * 7) % 100000)::DOUBLE AS income
        FROM range({rows}) r(i)""")
    con.execute("CREATE TABLE rows AS SELECT occupation, income FROM users")
    pairs = ", ".join(f"('{o}', '{c}')" for o, c in zip(OCCUPATIONS, COLLARS, strict=True))
    con.execute(f"CREATE TABLE lut AS SELECT * FROM (VALUES {pairs}) v(occupation, collar)")
    con.execute("CREATE TABLE fan AS SELECT occupation, v AS variant FROM lut, range(3) r(v)")
    con.close()


def statement(policy: Policy, sql: str) -> Rewritten:
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst("bench"))
    assert isinstance(analysis, Analysis)
    return rewrite(plan_query(analysis, QueryOptions(1.0, 1e-6, "laplace")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    add_out_argument(parser)
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "joins.duckdb"
        build(db, args.rows)
        policy_path = Path(tmp) / "policy.toml"
        policy_path.write_text(policy_text(db, Path(tmp) / "ledger.sqlite"))
        policy = load_policy(policy_path)
        backend = DuckDBBackend(db)
        try:
            for level, table in (("row-level", "rows"), ("user-level", "users")):
                sqls = [(name, statement(policy, q.format(t=table))) for name, q in QUERIES]
                times: dict[str, list[float]] = {name: [] for name, _ in sqls}
                for _name, rewritten in sqls:  # warm-up
                    backend.run_aggregate(rewritten.sql, rewritten.parameters())
                for _ in range(args.repeat):
                    for name, rewritten in sqls:
                        start = time.perf_counter()
                        backend.run_aggregate(rewritten.sql, rewritten.parameters())
                        times[name].append((time.perf_counter() - start) * 1000)
                results[level] = {name: statistics.median(t) for name, t in times.items()}
        finally:
            backend.close()
    write(results, args)


def write(results: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    meta = {"rows": args.rows, "repeat": args.repeat, "duckdb": duckdb.__version__,
            "python": platform.python_version()}
    baseline = QUERIES[0][0]
    lines = [f"Synthetic table: {args.rows:,} rows (user-level: ~{int(args.rows * 0.3):,} "
             f"units, ≤ 5 rows each); exact aggregates of the rewritten statement on DuckDB "
             f"{duckdb.__version__}, median of {args.repeat} interleaved runs.", "",
             "| query | row-level (ms) | ratio | user-level (ms) | ratio |",
             "|---|---|---|---|---|"]
    for name, _ in QUERIES:
        row, user = results["row-level"], results["user-level"]
        lines.append(f"| {name} | {row[name]:.1f} | {row[name] / row[baseline]:.2f}× | "
                     f"{user[name]:.1f} | {user[name] / user[baseline]:.2f}× |")
    text = "\n".join(lines) + "\n"
    publish("joins", args.out, {"meta": meta, "results": results}, text)
    print(text)


if __name__ == "__main__":
    main()
