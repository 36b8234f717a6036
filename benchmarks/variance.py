"""VAR/STDDEV: what a variance costs next to AVG, and what a budget split buys.

1. Time, DuckDB and PostgreSQL: per query, the DP query through a session and the exact
   query run directly on the backend, interleaved (median of --repeat runs), for
   `AVG(income)` and `STDDEV_POP(income)` per occupation at user level (≤ 5 rows per
   unit). A variance adds the centred sum of squares: one more clamped column
   (DOUBLE on DuckDB, NUMERIC on PostgreSQL, where the square is not a bare column).
2. Accuracy of the split, no backend time: the exact per-group rows of
   `SELECT occupation, COUNT(*), STDDEV_POP(income)` are computed once, then released
   --releases times at ε = 0.1 under the even split and under `SET dpproxy.split`
   weights; the table gives the median absolute error of each column over all groups and
   releases. The cost is ε = 0.1 in every case.

    python benchmarks/variance.py [--rows 2000000] [--repeat 5] [--pg-rows 300000]
                                  [--releases 200]
                                  [--pg-dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                  [--out DIR]

Writes benchmarks/results/variance.json and variance.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import overhead  # noqa: E402

from dpproxy.analyze import analyze  # noqa: E402
from dpproxy.parse import parse_statements  # noqa: E402
from dpproxy.plan import QueryOptions, plan_query  # noqa: E402
from dpproxy.policy import load_policy  # noqa: E402
from dpproxy.release import release  # noqa: E402
from dpproxy.session import Engine  # noqa: E402

# its own schema, so this never drops the tables of a concurrent overhead.py run
overhead.PG_SCHEMA = "dpproxy_bench_variance"
CLAMPED = "LEAST(GREATEST(income, 0), 100000)"
TIMED = [
    ("avg", "SELECT occupation, AVG(income) FROM t GROUP BY occupation",
     f"SELECT occupation, AVG({CLAMPED}) FROM t GROUP BY occupation"),
    ("stddev_pop", "SELECT occupation, STDDEV_POP(income) FROM t GROUP BY occupation",
     f"SELECT occupation, STDDEV_POP({CLAMPED}) FROM t GROUP BY occupation"),
]
SPLIT_QUERY = "SELECT occupation, COUNT(*), STDDEV_POP(income) FROM t GROUP BY occupation"
# The query has 4 noisy statistics (COUNT(*); S1, n, S2): '1,3' would be the even split.
SPLITS: list[tuple[float, ...] | None] = [None, (3.0, 1.0), (1.0, 9.0)]


def timed(policy_path: Path, db: Path | str, repeat: int) -> dict[str, dict[str, float]]:
    engine = Engine.from_path(policy_path)
    session = engine.session("bench")
    raw: Any = psycopg.connect(db, autocommit=True) if isinstance(db, str) \
        else duckdb.connect(str(db), read_only=True)
    out: dict[str, dict[str, float]] = {}
    for name, dp_sql, exact_sql in TIMED:
        session.execute(dp_sql)  # warm-up both
        raw.execute(exact_sql).fetchall()
        dp_times, exact_times = [], []
        for i in range(repeat):
            # a fresh ε each time, or the answer cache would answer without the backend
            session.set_option("epsilon", 1.0 + (i + 1) * 1e-9)
            dp_times.append(overhead.median_ms(lambda s=dp_sql: session.execute(s), 1))
            exact_times.append(overhead.median_ms(
                lambda s=exact_sql: raw.execute(s).fetchall(), 1))
        dp, exact = statistics.median(dp_times), statistics.median(exact_times)
        out[name] = {"dp_ms": dp, "exact_ms": exact, "ratio": dp / exact}
    out["stddev_over_avg"] = {"dp": out["stddev_pop"]["dp_ms"] / out["avg"]["dp_ms"]}
    raw.close()
    engine.close()
    return out


def split_accuracy(policy_path: Path, releases: int) -> dict[str, dict[str, float]]:
    """Median |released − exact| of COUNT and STDDEV_POP per split, at ε = 0.1."""
    policy = load_policy(policy_path)
    analyst = policy.analysts["bench"]
    engine = Engine(policy)
    statement = parse_statements(SPLIT_QUERY)[0]
    analysis = analyze(statement.ast, policy, analyst)
    base = plan_query(analysis, QueryOptions(0.1, 0.0, "laplace"))
    rewritten = engine.rewritten(base)
    rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
    engine.close()
    # the exact values from the same bounded rows: COUNT(*) = m0, then S1 (centred at
    # 50,000), n and S2 of the standard deviation
    truth = {}
    for key, rows_count, s1, n, s2 in rows:
        s1, n, s2 = float(s1), float(n), float(s2)
        truth[key] = (float(rows_count), (max(s2 / n - (s1 / n) ** 2, 0.0)) ** 0.5)
    out: dict[str, dict[str, float]] = {}
    for split in SPLITS:
        plan = plan_query(analysis, QueryOptions(0.1, 0.0, "laplace", split=split))
        count_errors, sd_errors = [], []
        for _ in range(releases):
            for key, count, sd in release(plan, rows).rows:
                exact_count, exact_sd = truth.get(key, (0.0, 0.0))
                count_errors.append(abs(count - exact_count))
                sd_errors.append(abs(sd - exact_sd))
        name = "even" if split is None else ",".join(f"{w:g}" for w in split)
        out[name] = {"count_error": statistics.median(count_errors),
                     "stddev_error": statistics.median(sd_errors)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pg-rows", type=int, default=300_000)
    parser.add_argument("--releases", type=int, default=200)
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    overhead.add_out_argument(parser)
    args = parser.parse_args()
    results: dict[str, Any] = {"rows": args.rows, "pg_rows": args.pg_rows,
                               "repeat": args.repeat, "releases": args.releases,
                               "python": platform.python_version(),
                               "duckdb": duckdb.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        print(f"building {args.rows:,} rows …", file=sys.stderr)
        overhead.build_table(db, args.rows)
        policy = Path(tmp) / "user.toml"
        policy.write_text(overhead.policy_text(db, Path(tmp) / "user.sqlite", True))
        print("DuckDB timing …", file=sys.stderr)
        results["duckdb_time"] = timed(policy, db, args.repeat)
        print("split accuracy …", file=sys.stderr)
        results["split_accuracy"] = split_accuracy(policy, args.releases)
        try:
            with psycopg.connect(args.pg_dsn, connect_timeout=5) as con:
                (server,) = con.execute("SHOW server_version").fetchone()  # type: ignore[misc]
        except psycopg.Error as exc:
            print(f"PostgreSQL does not answer ({type(exc).__name__}): skipped",
                  file=sys.stderr)
        else:
            print(f"building {args.pg_rows:,} rows in PostgreSQL …", file=sys.stderr)
            table_dsn = overhead.build_pg_table(args.pg_dsn, args.pg_rows)
            try:
                pg_policy = Path(tmp) / "pg-user.toml"
                pg_policy.write_text(overhead.policy_text(table_dsn, Path(tmp) / "pg.sqlite",
                                                          True))
                print("PostgreSQL timing …", file=sys.stderr)
                results["postgres_time"] = timed(pg_policy, table_dsn, args.repeat)
                results["postgres"] = str(server).split()[0]
            finally:
                overhead.drop_pg_schema(args.pg_dsn)
    table = render(results, args)
    overhead.publish("variance", args.out, results, table)
    print(table)


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"Per occupation (14 public groups), user level (≤ 5 rows per unit), median of "
        f"{args.repeat} interleaved runs; DuckDB {results['duckdb']} on {args.rows:,} rows"
        + (f", PostgreSQL {results['postgres']} on {args.pg_rows:,} rows"
           if "postgres" in results else "") + "; 2 cores.",
        "",
        "| query | backend | DP (ms) | exact (ms) | DP ÷ exact |",
        "|---|---|---|---|---|",
    ]
    for backend in ("duckdb", "postgres"):
        timing = results.get(f"{backend}_time")
        if timing is None:
            continue
        for name, _, _ in TIMED:
            t = timing[name]
            lines.append(f"| {name} | {backend} | {t['dp_ms']:.1f} | {t['exact_ms']:.1f} "
                         f"| {t['ratio']:.2f}× |")
        lines.append(f"| stddev_pop ÷ avg (DP) | {backend} | "
                     f"{timing['stddev_over_avg']['dp']:.2f}× | | |")
    lines += [
        "",
        f"`{SPLIT_QUERY}` at ε = 0.1 (the same cost in every row), median absolute error "
        f"over 14 groups × {args.releases} releases (4 noisy statistics: the even split "
        f"gives COUNT(*) ¼ of ε, '3,1' gives it ¾, '1,9' a tenth):",
        "",
        "| dpproxy.split | COUNT(*) error | STDDEV_POP(income) error |",
        "|---|---|---|",
    ]
    for name, acc in results["split_accuracy"].items():
        lines.append(f"| {name} | {acc['count_error']:.1f} | {acc['stddev_error']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
