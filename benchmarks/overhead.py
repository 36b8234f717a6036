"""How much dpproxy adds: proxy time per query, and DP query time ÷ exact query time.

1. Proxy overhead: parse + analyze + plan + rewrite + release (noise and
   post-processing) for representative queries, without the backend (its exact
   per-group rows are computed once beforehand). Goal: median ≤ 2 ms.
2. End to end on DuckDB: a synthetic table of N rows (default 10M) and ~0.3·N
   privacy units; each query runs as a DP query through a session and as the
   equivalent exact query directly on DuckDB, interleaved, so both see the same
   machine load. Row-level (no privacy unit) and user-level (≤ 5 rows per unit).
3. End to end on PostgreSQL: the same kind of table with --pg-rows rows (default 1M) in
   a schema `dpproxy_bench` of the database --pg-dsn names (dropped afterwards); skipped
   when that server does not answer.

    python benchmarks/overhead.py [--rows 10000000] [--repeat 5] [--pg-rows 1000000]
                                  [--pg-dsn postgresql://postgres@127.0.0.1:5432/postgres]
                                  [--out DIR]

Writes benchmarks/results/overhead.json and overhead.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.analyze import analyze  # noqa: E402
from dpproxy.parse import bound, clear_parse_cache, parse_statements  # noqa: E402
from dpproxy.plan import QueryPlan, plan_query  # noqa: E402
from dpproxy.policy import load_policy  # noqa: E402
from dpproxy.release import release  # noqa: E402
from dpproxy.rewrite import rewrite  # noqa: E402
from dpproxy.session import Engine, Session  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
OCCUPATIONS = ["Adm-clerical", "Exec-managerial", "Handlers-cleaners", "Prof-specialty",
               "Other-service", "Sales", "Craft-repair", "Transport-moving", "Farming-fishing",
               "Machine-op-inspct", "Tech-support", "Protective-serv", "Armed-Forces",
               "Priv-house-serv"]

# Adult (UCI) occupation frequencies, in OCCUPATIONS' order
OCCUPATION_WEIGHTS = [3770, 4066, 1370, 4140, 3295, 3650, 4099, 1597, 994, 2002, 928, 649, 9,
                      149]


def occupation_case(uniform: str = "r") -> str:
    """A CASE giving an occupation at its Adult frequency from `uniform`, uniform on
    [0, 1) (NULL in the rare case the sum of the fractions rounds below it)."""
    cases, acc = [], 0
    for name, weight in zip(OCCUPATIONS, OCCUPATION_WEIGHTS, strict=True):
        acc += weight
        cases.append(f"WHEN {uniform} < {acc / sum(OCCUPATION_WEIGHTS)} THEN '{name}'")
    return f"CASE {' '.join(cases)} ELSE NULL END"


# (name, DP query, the exact query it estimates)
QUERIES = [
    ("count", "SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t"),
    ("sum_where", "SELECT SUM(hours) FROM t WHERE age > 40",
     "SELECT SUM(LEAST(GREATEST(hours, 1), 99)) FROM t WHERE age > 40"),
    ("group_avg",
     "SELECT occupation, COUNT(*), AVG(income) FROM t GROUP BY occupation",
     "SELECT occupation, COUNT(*), AVG(LEAST(GREATEST(income, 0), 100000)) FROM t "
     "GROUP BY occupation"),
]


def policy_text(db: Path | str, ledger: Path, user_level: bool) -> str:
    """The benchmark policy on a DuckDB file, or on a PostgreSQL DSN (a str)."""
    unit = 'privacy_unit = "uid"\nmax_rows_per_unit = 5\nmax_groups_per_unit = 1\n' \
        if user_level else ""
    occupations = ", ".join(f'"{o}"' for o in OCCUPATIONS)
    backend = f'kind = "postgres"\ndsn = "{db}"' if isinstance(db, str) \
        else f'kind = "duckdb"\npath = "{db.as_posix()}"'
    return f"""
[backend]
{backend}
[ledger]
path = "{ledger.as_posix()}"
[audit]
path = "{ledger.with_suffix('.jsonl').as_posix()}"
[privacy]
default_epsilon = 1.0
[tables.t]
{unit}
[tables.t.columns]
uid = {{ type = "int" }}
age = {{ type = "int", lower = 17, upper = 90 }}
hours = {{ type = "int", lower = 1, upper = 99 }}
income = {{ type = "float", lower = 0, upper = 100000 }}
occupation = {{ type = "text", public_values = [{occupations}] }}
[analysts.bench]
budget = {{ epsilon = 1e12, delta = 0.5 }}
tables = ["t"]
"""


def build_table(path: Path, rows: int) -> None:
    units = max(1, int(rows * 0.3))
    con = duckdb.connect(str(path))
    con.execute("SELECT setseed(0.42)")
    con.execute(f"""
        CREATE TABLE t AS
        SELECT CAST(floor(random() * {units}) AS INTEGER) AS uid,
               CAST(17 + floor(random() * 74) AS INTEGER) AS age,
               CAST(1 + floor(random() * 99) AS INTEGER) AS hours,
               round(random() * 100000, 2) AS income,
               {occupation_case()} AS occupation
        FROM (SELECT random() AS r FROM range({rows}))
    """)
    con.close()


PG_SCHEMA = "dpproxy_bench"


def build_pg_table(dsn: str, rows: int) -> str:
    """Build the table in schema dpproxy_bench of dsn's database; the DSN that reads it."""
    units = max(1, int(rows * 0.3))
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        con.execute(f"CREATE SCHEMA {PG_SCHEMA}")
        con.execute("SELECT setseed(0.42)")
        con.execute(f"""
            CREATE TABLE {PG_SCHEMA}.t AS
            SELECT CAST(floor(random() * {units}) AS INTEGER) AS uid,
                   CAST(17 + floor(random() * 74) AS INTEGER) AS age,
                   CAST(1 + floor(random() * 99) AS INTEGER) AS hours,
                   CAST(round(CAST(random() * 100000 AS NUMERIC), 2) AS DOUBLE PRECISION)
                       AS income,
                   {occupation_case()} AS occupation
            FROM (SELECT random() AS r FROM generate_series(1, {rows})) s
        """)
        con.execute(f"ANALYZE {PG_SCHEMA}.t")
    return psycopg.conninfo.make_conninfo(dsn, options=f"-csearch_path={PG_SCHEMA}")


def drop_pg_schema(dsn: str, schema: str = PG_SCHEMA) -> None:
    with psycopg.connect(dsn, autocommit=True) as con:
        con.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def selection_noise(repeat: int, sizes: Sequence[int] = (3_000, 30_000, 300_000)
                    ) -> dict[str, dict[str, float]]:
    """Partition selection's noise alone: N candidate groups with Zipf-like row counts
    (seeded) against the threshold of peers.py's query (d) (COUNT(*) released, ε = 1,
    δ = 1e-6, ≤ 5 rows per unit: T = 72), every candidate drawn whole and compared
    (`release_array`) next to `release_reaching`, interleaved."""
    import numpy as np

    from dpproxy.mechanisms import calibrate, release_array, release_reaching
    from dpproxy.selection import count_selection

    noise = calibrate("laplace", 5.0, 1.0, integer_valued=True)
    threshold = count_selection(noise, 1e-6, 1, 5, 0).threshold
    out: dict[str, dict[str, float]] = {}
    for size in sizes:
        counts = np.minimum(np.random.default_rng(size).zipf(1.5, size), 10**7)
        runs = max(repeat, 3_000_000 // size)
        whole: list[float] = []
        reaching: list[float] = []

        def whole_draws(counts: np.ndarray = counts) -> object:
            return release_array(counts, noise) >= threshold

        def reaching_draws(counts: np.ndarray = counts) -> object:
            return release_reaching(counts, noise, threshold)

        pair = [(whole, whole_draws), (reaching, reaching_draws)]
        for i in range(runs):
            for sink, fn in pair if i % 2 else pair[::-1]:
                start = time.perf_counter()
                fn()
                sink.append((time.perf_counter() - start) * 1000)
        w, r = statistics.median(whole), statistics.median(reaching)
        out[str(size)] = {"below_threshold": float((counts < threshold).mean()),
                          "whole_ms": w, "reaching_ms": r, "ratio": w / r}
    return out


def proxy_overhead(policy_path: Path, repeat: int) -> dict[str, dict[str, float]]:
    """parse → analyze → plan → rewrite → release, with exact rows precomputed.

    "cold" rewrites every time, generating the bounded statement's SQL; "cached" takes
    the rewrite from the engine's cache of normalized queries, as a repeated query shape
    does in a running proxy.
    """
    policy = load_policy(policy_path)
    analyst = policy.analysts["bench"]
    engine = Engine(policy)
    session = engine.session("bench")
    out: dict[str, dict[str, float]] = {}
    for name, sql, _ in QUERIES:
        statement = parse_statements(sql)[0]
        plan = plan_query(analyze(statement.ast, policy, analyst), session.options)
        rewritten = engine.rewritten(plan)
        rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters())

        def pipeline(sql: str = sql, rows: list = rows, cached: bool = False) -> None:  # type: ignore[type-arg]
            proxy_pipeline(session, sql, rows, cached)

        for _ in range(20):  # warm-up
            pipeline()
        out[name] = {
            "cold_ms": median_ms(pipeline, max(repeat, 200)),
            "cached_ms": median_ms(lambda: pipeline(cached=True), max(repeat, 200)),
        }
    engine.close()
    return out


def proxy_pipeline(session: Session, sql: str, rows: Sequence[tuple[Any, ...]],
                   cached: bool) -> None:
    """What the proxy does for one query besides the backend's work and the ledger.

    Not `cached`: a new text, parsed (not from the parse cache), analysed, planned, its
    statement generated, released. `cached`: a repeat of an accepted query shape, as a
    running session serves it: the parse cache, the text's template (`TemplateShape`) or
    else the bound tree's shape, the shape cache (`dpproxy.shapes`) for the analysis and
    statement, a plan for the session's options, release.
    """
    engine = session.engine
    if not cached:
        clear_parse_cache()
        ast = parse_statements(sql)[0].ast
        p = plan_query(analyze(ast, engine.policy, session.analyst), session.options)
        assert rewrite(p).sql  # generated on use
        release(p, rows)
        return
    statement = parse_statements(sql, bind=False)[0]
    planned, shaped = session._templated(statement) \
        or session._shaped_plan(bound(statement))  # which learns the text's template
    assert isinstance(planned, QueryPlan)
    rewritten = shaped[0] if shaped is not None else engine.rewritten(planned)
    assert rewritten.sql
    release(planned, rows)


def end_to_end(policy_path: Path, db: Path | str, repeat: int
               ) -> dict[str, dict[str, float]]:
    """DP through a session against the exact query on the backend itself: a DuckDB
    file, or a PostgreSQL DSN (a str)."""
    engine = Engine.from_path(policy_path)
    session = engine.session("bench")
    raw: Any = psycopg.connect(db, autocommit=True) if isinstance(db, str) \
        else duckdb.connect(str(db), read_only=True)
    out: dict[str, dict[str, float]] = {}
    for name, dp_sql, exact_sql in QUERIES:
        session.execute(dp_sql)  # warm-up both
        raw.execute(exact_sql).fetchall()
        dp_times, exact_times = [], []
        for i in range(repeat):  # interleaved: both see the same machine state
            # a fresh ε each time: a repeat of the same query would be answered from the
            # cache of released answers without reaching the backend
            session.set_option("epsilon", 1.0 + (i + 1) * 1e-9)
            start = time.perf_counter()
            session.execute(dp_sql)
            dp_times.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            raw.execute(exact_sql).fetchall()
            exact_times.append((time.perf_counter() - start) * 1000)
        dp, exact = statistics.median(dp_times), statistics.median(exact_times)
        out[name] = {"dp_ms": dp, "exact_ms": exact, "ratio": dp / exact}
    raw.close()
    engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pg-rows", type=int, default=1_000_000)
    parser.add_argument("--pg-dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    add_out_argument(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        print(f"building {args.rows:,} rows …", file=sys.stderr)
        build_table(db, args.rows)
        policies = {}
        for level in ("row", "user"):
            path = Path(tmp) / f"{level}.toml"
            path.write_text(policy_text(db, Path(tmp) / f"{level}.sqlite", level == "user"))
            policies[level] = path
        print("proxy overhead …", file=sys.stderr)
        overhead = proxy_overhead(policies["user"], args.repeat)
        print("partition selection's noise …", file=sys.stderr)
        selection = selection_noise(args.repeat)
        results: dict[str, object] = {
            "rows": args.rows, "units": int(args.rows * 0.3), "repeat": args.repeat,
            "python": platform.python_version(), "duckdb": duckdb.__version__,
            "proxy_overhead_ms": overhead, "selection_noise": selection,
        }
        for level, path in policies.items():
            print(f"{level}-level end to end …", file=sys.stderr)
            results[f"{level}_level"] = end_to_end(path, db, args.repeat)
        postgres = postgres_end_to_end(args.pg_dsn, args.pg_rows, args.repeat, Path(tmp))
        if postgres is not None:
            results["postgres"] = postgres
    lines = [
        f"Synthetic table: {args.rows:,} rows, ~{int(args.rows * 0.3):,} privacy units; "
        f"median of {args.repeat} interleaved runs; DuckDB {duckdb.__version__}, "
        f"Python {platform.python_version()}, 2 cores.",
        "",
        "| query | proxy only, cold (ms) | proxy only, cached rewrite (ms) | row-level DP (ms) "
        "| exact (ms) | ratio | user-level DP (ms) | exact (ms) | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, _, _ in QUERIES:
        r, u = results["row_level"][name], results["user_level"][name]  # type: ignore[index]
        o = overhead[name]
        lines.append(f"| {name} | {o['cold_ms']:.2f} | {o['cached_ms']:.2f} "
                     f"| {r['dp_ms']:.1f} | {r['exact_ms']:.1f} "
                     f"| {r['ratio']:.2f}× | {u['dp_ms']:.1f} | {u['exact_ms']:.1f} "
                     f"| {u['ratio']:.2f}× |")
    if postgres is not None:
        lines += [
            "",
            f"PostgreSQL {postgres['server']}: the same kind of table with "
            f"{args.pg_rows:,} rows, ~{int(args.pg_rows * 0.3):,} privacy units; median of "
            f"{args.repeat} interleaved runs.",
            "",
            "| query | row-level DP (ms) | exact (ms) | ratio | user-level DP (ms) "
            "| exact (ms) | ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, _, _ in QUERIES:
            r, u = postgres["row_level"][name], postgres["user_level"][name]
            lines.append(f"| {name} | {r['dp_ms']:.1f} | {r['exact_ms']:.1f} "
                         f"| {r['ratio']:.2f}× | {u['dp_ms']:.1f} | {u['exact_ms']:.1f} "
                         f"| {u['ratio']:.2f}× |")
    lines += [
        "",
        "Partition selection's noise alone (T = 72, the threshold of peers.py's (d); "
        "Zipf-like counts): every candidate drawn whole, next to drawing whole only where "
        "a draw may reach T (`release_reaching`); interleaved medians.",
        "",
        "| candidates | below T | whole draws (ms) | reaching (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    for size, row in selection.items():
        lines.append(f"| {int(size):,} | {row['below_threshold']:.0%} | {row['whole_ms']:.2f} "
                     f"| {row['reaching_ms']:.2f} | {row['ratio']:.2f}× |")
    table = "\n".join(lines) + "\n"
    publish("overhead", args.out, results, table)
    print(table)


def postgres_end_to_end(dsn: str, rows: int, repeat: int, tmp: Path,
                        measure: Callable[[Path, str, int], Any] | None = None
                        ) -> dict[str, Any] | None:
    """Row- and user-level DP ÷ exact on PostgreSQL (or what `measure(policy, dsn, repeat)`
    measures, for other benchmarks on the same table); None when the server does not
    answer."""
    measure = measure or end_to_end
    try:
        with psycopg.connect(dsn, connect_timeout=5) as con:
            (server,) = con.execute("SHOW server_version").fetchone()  # type: ignore[misc]
    except psycopg.Error as exc:
        print(f"PostgreSQL at {dsn} does not answer ({type(exc).__name__}): skipped",
              file=sys.stderr)
        return None
    print(f"building {rows:,} rows in PostgreSQL …", file=sys.stderr)
    table_dsn = build_pg_table(dsn, rows)
    out: dict[str, Any] = {"server": str(server).split()[0], "rows": rows}
    try:
        for level in ("row", "user"):
            path = tmp / f"pg-{level}.toml"
            path.write_text(policy_text(table_dsn, tmp / f"pg-{level}.sqlite",
                                        level == "user"))
            print(f"PostgreSQL {level}-level …", file=sys.stderr)
            out[f"{level}_level"] = measure(path, table_dsn, repeat)
    finally:
        drop_pg_schema(dsn)
    return out


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for the JSON and Markdown results (default "
                             "benchmarks/results, whose Markdown the README quotes)")


def publish(name: str, out: Path, data: object, markdown: str,
            quoted: str | None = None) -> None:
    """<name>.json and <name>.md into `out`; the README quotes `quoted` (by default the
    Markdown) only when `out` is benchmarks/results, so a smoke run leaves it alone."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
    if out.resolve() == RESULTS.resolve():
        quote_in_readme(name, markdown if quoted is None else quoted)


def quote_in_readme(name: str, text: str) -> None:
    """Replace the README's block between <!-- name:start --> and <!-- name:end -->."""
    readme = ROOT / "README.md"
    content = readme.read_text()
    start, end = f"<!-- {name}:start -->\n", f"<!-- {name}:end -->"
    if start in content and end in content:
        head, rest = content.split(start, 1)
        readme.write_text(head + start + text + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    main()
