"""DP queries per second through the wire, against the same queries in-process.

`dpproxy serve` runs in its own process on a copy of the demo policy (a budget
large enough never to run out, its own ledger); 1, 4 and 16 psycopg clients,
each on its own connection and thread, send DP queries on the demo table
`adult` for a fixed time, in two mixes:

- distinct: every query differs (its WHERE threshold), so each is analyzed,
  charged durably and run on DuckDB;
- repeated: 90 queries asked over and over, answered from the answer cache
  after their first (charged) run, as a refreshing dashboard would be.

The same queries then run through `dpproxy.connect` in-process, for the
ratio. Latency percentiles are per query, as the client sees them.

Then an A/B table, measured side by side in the same run (the machine may be shared,
so only ratios within one run mean much): the distinct mix at the largest client count
through servers with the throughput work switched off step by step (one worker, no
group commit / fsync-free answers, no parse cache, no shape cache, no prepared DuckDB
statements) and fully on.

    python benchmarks/throughput.py [--seconds 10] [--clients 1,4,16] [--workers auto|N]

Writes benchmarks/results/throughput.json and throughput.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

import dpproxy  # noqa: E402
from dpproxy.demo import DEFAULT_SEED, ensure_demo  # noqa: E402
from dpproxy.policy import load_policy  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import quote_in_readme  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PASSWORD = "alice-demo"  # the demo policy's verifier is for this password
QUERIES = [  # (name, SQL with one integer parameter that makes each query distinct)
    ("count_where", "SELECT COUNT(*) FROM adult WHERE capital_gain > %s"),
    ("group_count", "SELECT occupation, COUNT(*) FROM adult WHERE capital_gain > %s "
                    "GROUP BY occupation"),
    ("avg_where", "SELECT AVG(hours_per_week) FROM adult WHERE capital_gain > %s"),
]


def benchmark_policy(folder: Path, name: str) -> Path:
    """The demo policy on the shared demo data, with its own ledger and a huge budget."""
    policy = load_policy(ROOT / "policies" / "demo.toml")
    assert policy.backend.path is not None
    ensure_demo(policy.backend.path, seed=policy.backend.demo_seed or DEFAULT_SEED)
    text = (ROOT / "policies" / "demo.toml").read_text()
    text = text.replace('path = "../data/demo.duckdb"',
                        f'path = "{policy.backend.path.as_posix()}"')
    text = re.sub(r'\[ledger\]\npath = "[^"]*"', f'[ledger]\npath = "{name}.ledger.sqlite"', text)
    text = re.sub(r'\[audit\]\npath = "[^"]*"', f'[audit]\npath = "{name}.audit.jsonl"', text)
    text = text.replace("budget = { epsilon = 10.0, delta = 1e-5 }",
                        "budget = { epsilon = 1e9, delta = 0.5 }")
    text = text.replace("port = 6432", "port = 0")
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


# A/B variants: (name, --workers, environment switches)
VARIANTS: list[tuple[str, str, dict[str, str]]] = [
    ("before: 1 worker, fsync'd answers, no group commit, no parse cache", "1",
     {"DPPROXY_LEDGER_FAST_COMMITS": "off", "DPPROXY_PARSE_CACHE": "off",
      "DPPROXY_FAST_REPEATS": "off", "DPPROXY_SHAPE_CACHE": "off", "DPPROXY_PREPARED": "off",
      "DPPROXY_SHARED_SCANS": "off"}),
    ("+ parse cache", "1", {"DPPROXY_LEDGER_FAST_COMMITS": "off",
                            "DPPROXY_FAST_REPEATS": "off", "DPPROXY_SHAPE_CACHE": "off",
                            "DPPROXY_PREPARED": "off", "DPPROXY_SHARED_SCANS": "off"}),
    ("+ group commit, fsync-free answers, repeats looked up first (1 worker)", "1",
     {"DPPROXY_SHAPE_CACHE": "off", "DPPROXY_PREPARED": "off", "DPPROXY_SHARED_SCANS": "off"}),
    ("+ shape cache: one analysis and rewrite per query shape (1 worker)", "1",
     {"DPPROXY_PREPARED": "off", "DPPROXY_SHARED_SCANS": "off"}),
    ("+ prepared DuckDB statements (1 worker)", "1", {"DPPROXY_SHARED_SCANS": "off"}),
    ("+ worker processes, one per core", "auto", {"DPPROXY_SHARED_SCANS": "off"}),
    ("+ shared scans: overlapping runs of one text as one statement (all on)", "auto", {}),
]
# every client on one query shape (a dashboard): what shared scans are for
ONE_SHAPE = [QUERIES[1]]
SHARED_VARIANTS: list[tuple[str, str, dict[str, str]]] = [
    ("shared scans off", "auto", {"DPPROXY_SHARED_SCANS": "off"}),
    ("shared scans on", "auto", {}),
]


def start_server(policy: Path, workers: str | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "dpproxy", "serve", "--policy", str(policy),
               "--log-level", "WARNING"]
    if workers is not None:
        command += ["--workers", workers]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
    assert process.stdout is not None
    for _ in range(100):
        line = process.stdout.readline()
        found = re.search(r"postgresql://alice@[\d.]+:(\d+)/", line)
        if found:
            return process, int(found.group(1))
        if not line:
            break
    process.kill()
    raise RuntimeError("the server did not start")


REPEATED = 30  # thresholds per query shape in the repeated mix


def thresholds(mix: str) -> Callable[[], int]:
    """Query parameters: fresh for `distinct`, from a small fixed set for `repeated`.
    Thresholds sit above every capital gain, so the scans stay cheap."""
    counter = itertools.count()
    lock = threading.Lock()

    def next_threshold() -> int:
        with lock:
            n = next(counter)
        return 1_000_000 + (n % REPEATED if mix == "repeated" else REPEATED + n)

    return next_threshold


def warm_up(connect: Callable[[], Any]) -> None:
    """Answer each repeated query once, so the measured runs see the cache."""
    conn = connect()
    try:
        for _, sql in QUERIES:
            for n in range(REPEATED):
                conn.execute(sql, [1_000_000 + n]).fetchall()
    finally:
        conn.close()


def run_clients(clients: int, seconds: float, connect: Callable[[], Any],
                threshold: Callable[[], int],
                queries: Sequence[tuple[str, str]] = QUERIES) -> dict[str, Any]:
    """`clients` threads, each with its own connection, querying for `seconds`, each
    taking `queries` in turn."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    stop = threading.Event()

    def client(number: int) -> None:
        conn = connect()
        mine: list[float] = []
        try:
            ready.wait()
            for i in itertools.count():
                if stop.is_set():
                    break
                _, sql = queries[(number + i) % len(queries)]
                began = time.perf_counter()
                try:
                    conn.execute(sql, [threshold()]).fetchall()
                except Exception as exc:  # counted, shown in the report
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}"[:200])
                    continue
                mine.append(time.perf_counter() - began)
        finally:
            conn.close()
            with lock:
                latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "queries": len(ordered),
        "seconds": round(elapsed, 3),
        "queries_per_s": round(len(ordered) / elapsed, 1),
        "p50_ms": round(1000 * statistics.median(ordered), 2) if ordered else None,
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2)
        if ordered else None,
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per configuration")
    parser.add_argument("--clients", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--workers", default="auto",
                        help="server processes: a number or auto (one per core)")
    parser.add_argument("--no-ab", action="store_true", help="skip the A/B table")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="dpproxy-throughput-"))
    results: dict[str, Any] = {"wire": [], "in_process": [], "ab": [], "ab_one_shape": []}
    try:
        process, port = start_server(benchmark_policy(folder, "wire"), args.workers)
        dsn = f"host=127.0.0.1 port={port} user=alice dbname=demo password={PASSWORD}"
        try:
            measure("wire", lambda: psycopg.connect(dsn, autocommit=True), counts,
                    args.seconds, results["wire"])
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        local_policy = benchmark_policy(folder, "local")
        measure("in-process",
                lambda: _LocalConnection(dpproxy.connect(local_policy, analyst="alice")),
                counts, args.seconds, results["in_process"])
        if not args.no_ab:
            measure_ab(folder, max(counts), args.seconds, results["ab"])
            measure_ab(folder, max(counts), args.seconds, results["ab_one_shape"],
                       SHARED_VARIANTS, ONE_SHAPE)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    from dpproxy.server.workers import parse_workers

    results["machine"] = {"python": platform.python_version(), "cores": os.cpu_count(),
                          "platform": platform.platform(), "psycopg": psycopg.__version__,
                          "seconds_per_configuration": args.seconds,
                          "server_workers": parse_workers(args.workers),
                          "load_average_at_end": os.getloadavg()[0]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "throughput.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "throughput.md").write_text(markdown(results))
    if args.out.resolve() == RESULTS.resolve():
        quote_in_readme("throughput", markdown(results))
    print(markdown(results))
    return 0


def measure(path: str, connect: Callable[[], Any], counts: list[int], seconds: float,
            into: list[dict[str, Any]]) -> None:
    for mix in ("distinct", "repeated"):
        if mix == "repeated":
            warm_up(connect)
        for clients in counts:
            into.append({"mix": mix, **run_clients(clients, seconds, connect,
                                                   thresholds(mix))})
            print(path, into[-1], flush=True)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by a process and its live descendants, from
    /proc (Linux; 0 elsewhere): the server's cost per query, whatever else runs."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, IndexError, ValueError):
            continue
    return total


def measure_ab(folder: Path, clients: int, seconds: float, into: list[dict[str, Any]],
               variants: Sequence[tuple[str, str, dict[str, str]]] = VARIANTS,
               queries: Sequence[tuple[str, str]] = QUERIES) -> None:
    """The distinct mix (of `queries`) at `clients` through each variant's server, twice
    in alternation (ABCD ABCD) so a change in the machine's load hits every variant alike."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    tag = "ab" if queries is QUERIES else "ab1"
    for round_ in range(2):
        for number, (name, workers, env) in enumerate(variants):
            process, port = start_server(benchmark_policy(folder, f"{tag}{round_}{number}"),
                                         workers, env)
            dsn = f"host=127.0.0.1 port={port} user=alice dbname=demo password={PASSWORD}"
            try:
                before = cpu_seconds(process.pid)
                run = run_clients(clients, seconds,
                                  lambda dsn=dsn: psycopg.connect(dsn, autocommit=True),
                                  thresholds("distinct"), queries)
                used = cpu_seconds(process.pid) - before
                run["server_cpu_ms_per_query"] = round(1000 * used / max(run["queries"], 1),
                                                       2)
                runs[name].append(run)
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
            print(tag, name, runs[name][-1], flush=True)
    for name, _, _ in variants:
        both = runs[name]
        queries = sum(r["queries"] for r in both)
        elapsed = sum(r["seconds"] for r in both)
        into.append({"variant": name, "clients": clients, "queries": queries,
                     "queries_per_s": round(queries / elapsed, 1),
                     "rounds_queries_per_s": [r["queries_per_s"] for r in both],
                     "p50_ms_rounds": [r["p50_ms"] for r in both],
                     "p99_ms_rounds": [r["p99_ms"] for r in both],
                     "server_cpu_ms_per_query": round(
                         statistics.mean(r["server_cpu_ms_per_query"] for r in both), 2),
                     "failures": sum(r["failures"] for r in both),
                     "first_failure": next((r["first_failure"] for r in both
                                            if r["first_failure"]), None)})


class _LocalConnection:
    """dpproxy's DB-API connection with psycopg's `execute(...).fetchall()` shape."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection

    def execute(self, sql: str, params: list[object]) -> Any:
        return self._connection.cursor().execute(sql, params)

    def close(self) -> None:
        self._connection.close()


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [f"DP queries on the demo table `adult` (32,561 people, user-level) through "
             f"`dpproxy serve` with psycopg clients, and in-process through `dpproxy.connect`. "
             f"distinct: every query new, charged and run; repeated: answered from the answer "
             f"cache. {machine['seconds_per_configuration']:g} s per configuration; "
             f"{machine.get('server_workers', 1)} server worker process(es); "
             f"Python {machine['python']}, {machine['cores']} cores (shared: load average "
             f"{machine.get('load_average_at_end', 0):.1f} at the end).", "",
             "| mix | clients | wire queries/s | wire p50 (ms) | wire p99 (ms) "
             "| in-process queries/s | in-process p50 (ms) | in-process p99 (ms) "
             "| wire ÷ in-process |",
             "|---|---|---|---|---|---|---|---|---|"]
    for wire, local in zip(results["wire"], results["in_process"], strict=True):
        ratio = wire["queries_per_s"] / local["queries_per_s"] if local["queries_per_s"] else 0
        lines.append(f"| {wire['mix']} | {wire['clients']} | {wire['queries_per_s']:,.0f} | "
                     f"{wire['p50_ms']} | {wire['p99_ms']} | {local['queries_per_s']:,.0f} | "
                     f"{local['p50_ms']} | {local['p99_ms']} | {ratio:.2f} |")
    for key, what in (("ab", "distinct mix"),
                      ("ab_one_shape", f"distinct queries of one shape ({ONE_SHAPE[0][0]}: "
                                       "every client sends it with fresh thresholds)")):
        if not results.get(key):
            continue
        base = results[key][0]["queries_per_s"] or 1
        lines += ["", f"A/B, {what}, {results[key][0]['clients']} clients, measured "
                      "side by side in this run (two alternating rounds each):", "",
                  "| server | queries/s | rounds | p50 (ms) per round | p99 (ms) per round "
                  "| server CPU ms/query | × first row |", "|---|---|---|---|---|---|---|"]
        for row in results[key]:
            lines.append(f"| {row['variant']} | {row['queries_per_s']:,.0f} | "
                         f"{', '.join(f'{q:,.0f}' for q in row['rounds_queries_per_s'])} | "
                         f"{', '.join(str(v) for v in row['p50_ms_rounds'])} | "
                         f"{', '.join(str(v) for v in row['p99_ms_rounds'])} | "
                         f"{row['server_cpu_ms_per_query']} | "
                         f"{row['queries_per_s'] / base:.2f} |")
    failed = [r for r in results["wire"] + results["in_process"] + results.get("ab", [])
              + results.get("ab_one_shape", []) if r["failures"]]
    if failed:
        lines += ["", f"{sum(r['failures'] for r in failed)} queries failed; first: "
                      f"{failed[0]['first_failure']}"]
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    sys.exit(main())
