"""Quantiles: what the histogram rewrite costs, and how accurate the exponential mechanism is.

1. Speed, side by side in one run on the synthetic table of `overhead.py` (N rows, default
   1M; ~0.3·N units): DP MEDIAN, DP AVG of the same column (the existing one-level
   rewrite) and the exact quantile on the backend itself, interleaved; row-level and
   user-level (≤ 5 rows per unit). The same on PostgreSQL with --pg-rows (default 200k),
   skipped when the server does not answer.
2. Accuracy of MEDIAN(income) (1,024 bins over [0, 100000]) and MEDIAN(age) (74
   one-integer bins) on that table at several ε: the exact histogram is read once through
   the rewritten statement, then the mechanism is drawn --draws times; reported are the
   median and 95th percentile of |released − exact| and of the rank error in rows, next
   to the reported 95% rank bound.
3. The sampler alone: µs per draw on 1,024 bins.

    python benchmarks/quantiles.py [--rows 1000000] [--repeat 5] [--draws 2000]
                                   [--pg-rows 200000] [--pg-dsn postgresql://…] [--out DIR]

Writes benchmarks/results/quantiles.json and quantiles.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from overhead import (  # noqa: E402
    add_out_argument,
    build_table,
    policy_text,
    postgres_end_to_end,
    publish,
)

from dpproxy.analyze import analyze  # noqa: E402
from dpproxy.parse import parse_statements  # noqa: E402
from dpproxy.plan import QueryOptions, plan_query  # noqa: E402
from dpproxy.policy import load_policy  # noqa: E402
from dpproxy.quantiles import (  # noqa: E402
    decode_histogram,
    rank_error,
    release_quantile,
    sample_bin,
    utilities,
)
from dpproxy.rewrite import rewrite  # noqa: E402
from dpproxy.session import Engine  # noqa: E402

# (name, DP query, the same column's AVG through dpproxy, the exact query)
QUERIES = [
    ("median", "SELECT MEDIAN(income) FROM t", "SELECT AVG(income) FROM t",
     "SELECT QUANTILE_CONT(LEAST(GREATEST(income, 0), 100000), 0.5) FROM t"),
    ("group_median", "SELECT occupation, MEDIAN(age) FROM t GROUP BY occupation",
     "SELECT occupation, AVG(age) FROM t GROUP BY occupation",
     "SELECT occupation, QUANTILE_CONT(age, 0.5) FROM t GROUP BY occupation"),
]
PG_EXACT = {
    "median": "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY LEAST(GREATEST(income, 0), "
              "100000)) FROM t",
    "group_median": "SELECT occupation, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) "
                    "FROM t GROUP BY occupation",
}
EPSILONS = [0.01, 0.1, 1.0]


def timed_ms(run: Any, sql: str) -> float:
    start = time.perf_counter()
    run(sql)
    return (time.perf_counter() - start) * 1000


def speed(policy_path: Path, db: Path | str, repeat: int) -> dict[str, dict[str, float]]:
    """DP MEDIAN, DP AVG and the exact quantile, interleaved, medians of `repeat` runs."""
    engine = Engine.from_path(policy_path)
    session = engine.session("bench")
    pg = isinstance(db, str)
    raw: Any = psycopg.connect(db, autocommit=True) if pg \
        else duckdb.connect(str(db), read_only=True)
    out: dict[str, dict[str, float]] = {}
    for name, median_sql, avg_sql, exact_sql in QUERIES:
        exact_sql = PG_EXACT[name] if pg else exact_sql
        session.execute(median_sql)  # warm-up
        session.execute(avg_sql)
        raw.execute(exact_sql).fetchall()
        times: dict[str, list[float]] = {"median": [], "avg": [], "exact": []}
        for i in range(repeat):
            # a fresh ε each time, or the answer cache would serve the repeat
            session.set_option("epsilon", 1.0 + (i + 1) * 1e-9)
            times["median"].append(timed_ms(session.execute, median_sql))
            times["avg"].append(timed_ms(session.execute, avg_sql))
            times["exact"].append(timed_ms(lambda q: raw.execute(q).fetchall(), exact_sql))
        row = {k: statistics.median(v) for k, v in times.items()}
        row["median_vs_avg"] = row["median"] / row["avg"]
        row["median_vs_exact"] = row["median"] / row["exact"]
        out[name] = row
    raw.close()
    engine.close()
    return out


def accuracy(policy_path: Path, draws: int) -> list[dict[str, Any]]:
    """Errors of the mechanism on the table's exact histograms (read once)."""
    policy = load_policy(policy_path)
    engine = Engine.from_path(policy_path)
    out = []
    for column in ("income", "age"):
        statement = parse_statements(f"SELECT MEDIAN({column}) FROM t")[0]
        analysis = analyze(statement.ast, policy, policy.analysts["bench"])
        for epsilon in EPSILONS:
            plan = plan_query(analysis, QueryOptions(epsilon, 1e-7, "laplace"))  # type: ignore[arg-type]
            spec = plan.measurements[0].quantile
            assert spec is not None
            rewritten = rewrite(plan, "duckdb")
            (row,) = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())
            histogram = decode_histogram(row[0], spec.binning.bins)  # type: ignore[arg-type]
            scores = utilities(histogram, spec.quantile)
            best = [spec.binning.point(j) for j, u in enumerate(scores) if u == 0]
            exact_value = statistics.median(best)
            value_errors, rank_errors = [], []
            for _ in range(draws):
                j = sample_bin(spec, histogram)
                value_errors.append(abs(spec.binning.point(j) - exact_value))
                rank_errors.append(-scores[j])
            value_errors.sort()
            rank_errors.sort()
            out.append({
                "column": column, "epsilon": epsilon, "bins": spec.binning.bins,
                "rows": sum(histogram),
                "abs_error_median": value_errors[len(value_errors) // 2],
                "abs_error_p95": value_errors[int(len(value_errors) * 0.95)],
                "rank_error_median": rank_errors[len(rank_errors) // 2],
                "rank_error_p95": rank_errors[int(len(rank_errors) * 0.95)],
                "rank_bound_95": rank_error(spec, 0.95),
            })
    engine.close()
    return out


def sampler_us(policy_path: Path) -> dict[str, float]:
    """µs per draw on 1,024 bins with a spread-out histogram, by ε."""
    policy = load_policy(policy_path)
    statement = parse_statements("SELECT MEDIAN(income) FROM t")[0]
    analysis = analyze(statement.ast, policy, policy.analysts["bench"])
    histogram = tuple(1000 + (j * 37) % 100 for j in range(1024))
    out = {}
    for epsilon in EPSILONS:
        spec = plan_query(analysis, QueryOptions(epsilon, 1e-7, "laplace")
                          ).measurements[0].quantile
        assert spec is not None
        n = 500
        start = time.perf_counter()
        for _ in range(n):
            release_quantile(spec, histogram)
        out[str(epsilon)] = (time.perf_counter() - start) / n * 1e6
    return out


def speed_table(results: dict[str, Any]) -> list[str]:
    lines = ["| query | level | DP MEDIAN (ms) | DP AVG (ms) | exact quantile (ms) | "
             "MEDIAN ÷ AVG | MEDIAN ÷ exact |", "|---|---|---|---|---|---|---|"]
    for level in ("row_level", "user_level"):
        for name, r in results[level].items():
            lines.append(f"| {name} | {level.split('_')[0]} | {r['median']:.1f} | "
                         f"{r['avg']:.1f} | {r['exact']:.1f} | {r['median_vs_avg']:.2f}× | "
                         f"{r['median_vs_exact']:.2f}× |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--pg-rows", type=int, default=200_000)
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    add_out_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        db = tmp / "bench.duckdb"
        print(f"building {args.rows:,} rows in DuckDB …", file=sys.stderr)
        build_table(db, args.rows)
        results: dict[str, Any] = {
            "rows": args.rows, "repeat": args.repeat, "draws": args.draws,
            "duckdb": duckdb.__version__, "python": platform.python_version()}
        for level in ("row", "user"):
            path = tmp / f"{level}.toml"
            path.write_text(policy_text(db, tmp / f"{level}.sqlite", level == "user"))
            print(f"DuckDB {level}-level …", file=sys.stderr)
            results[f"{level}_level"] = speed(path, db, args.repeat)
            if level == "row":
                results["accuracy"] = accuracy(path, args.draws)
                results["sampler_us"] = sampler_us(path)
        results["postgres"] = postgres_end_to_end(args.pg_dsn, args.pg_rows, args.repeat, tmp,
                                                  speed)
    lines = [f"Synthetic table of `overhead.py`: {args.rows:,} rows, ~{int(args.rows * 0.3):,} "
             f"privacy units; median of {args.repeat} interleaved runs; DuckDB "
             f"{results['duckdb']}, Python {results['python']}.", "",
             *speed_table(results), ""]
    pg = results["postgres"]
    if pg is not None:
        lines += [f"PostgreSQL {pg['server']}: the same kind of table with {pg['rows']:,} rows.",
                  "", *speed_table(pg), ""]
    lines += [f"Accuracy of MEDIAN (row level), {args.draws} draws of the mechanism on the "
              "exact histogram per ε; errors against the point of the bin holding the exact "
              "median (the binning's own error, at most half a bin, comes on top):", "",
              "| column | bins | ε | median abs. error | p95 abs. error | median rank error "
              "(rows) | p95 rank error | 95% rank bound |", "|---|---|---|---|---|---|---|---|"]
    for a in results["accuracy"]:
        lines.append(f"| {a['column']} | {a['bins']} | {a['epsilon']:g} | "
                     f"{a['abs_error_median']:.4g} | {a['abs_error_p95']:.4g} | "
                     f"{a['rank_error_median']} | {a['rank_error_p95']} | "
                     f"{a['rank_bound_95']:.4g} |")
    sampler = ", ".join(f"ε={e}: {us:.0f} µs" for e, us in results["sampler_us"].items())
    lines += ["", f"Sampler alone, 1,024 bins: {sampler} per draw.", ""]
    text = "\n".join(lines)
    publish("quantiles", args.out, results, text)
    print(text)


if __name__ == "__main__":
    main()
