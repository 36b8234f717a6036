"""The SmartNoise SQL side of benchmarks/peers.py, run in its own virtual environment.

SmartNoise SQL pins versions of its dependencies that differ from dpproxy's, so
peers.py runs this script with the interpreter of `benchmarks/.venv-smartnoise/`
and talks to it through JSON files: a job file in, a result file out.

    python peers_smartnoise.py JOB.json OUT.json

The job names the engine ("postgres": a DSN; "pandas": a Parquet file per table), the
metadata YAML, and the queries, each with the whole-query budget to match. SmartNoise charges
its ε per released statistic (an AVG is a SUM and a COUNT, rare-group censoring one
more), so the per-statistic ε is chosen such that `get_privacy_cost` of the whole
query equals the budget. Every execution is timed; its rows are returned for the error
figures.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from snsql import Privacy  # type: ignore[import-not-found]
from snsql.sql.private_reader import PrivateReader  # type: ignore[import-not-found]
from snsql.sql.reader.base import SqlReader  # type: ignore[import-not-found]


def open_reader(job: dict[str, Any], epsilon: float, delta: float) -> Any:
    """A PrivateReader over the job's one underlying reader (loading a DataFrame into
    SmartNoise's SQLite copy happens once, not once per privacy setting)."""
    if "reader" not in job:
        job["reader"] = SqlReader.from_connection(job["connection"], engine=job["engine"],
                                                  metadata=job["metadata"])
    return PrivateReader(job["reader"], job["metadata"],
                         privacy=Privacy(epsilon=epsilon, delta=delta))


def matched_budget(job: dict[str, Any], sql: str, epsilon: float, delta: float
                   ) -> tuple[float, float, float, float]:
    """The per-statistic ε and the δ parameter at which the whole query costs (`epsilon`,
    `delta`) by SmartNoise's own odometer; then that cost (ε, δ)."""
    per_statistic, delta_parameter = epsilon, delta
    for _ in range(6):  # the cost is (nearly) linear in both: converges in a few steps
        cost, cost_delta = open_reader(job, per_statistic, delta_parameter) \
            .get_privacy_cost(sql)
        per_statistic *= epsilon / float(cost)
        if cost_delta:
            delta_parameter *= delta / float(cost_delta)
    cost, cost_delta = open_reader(job, per_statistic, delta_parameter).get_privacy_cost(sql)
    return per_statistic, delta_parameter, float(cost), float(cost_delta)


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    if job["engine"] == "pandas":
        import pandas as pd

        # one DataFrame per table, named as in the metadata and the queries
        job["connection"] = {name: pd.read_parquet(path) for name, path in job["data"].items()}
    else:
        import psycopg2  # type: ignore[import-untyped]

        job["connection"] = psycopg2.connect(job["data"])
    results = []
    for query in job["queries"]:
        try:
            results.append(run_query(job, query))
        except Exception as exc:  # SmartNoise refuses some settings (e.g. a tiny ε)
            results.append({"name": query["name"], "error": f"{type(exc).__name__}: {exc}"})
    with open(out_path, "w") as f:
        json.dump({"version": snsql_version(), "results": results}, f, default=float)


def run_query(job: dict[str, Any], query: dict[str, Any]) -> dict[str, Any]:
    per_statistic, delta_parameter, cost, cost_delta = matched_budget(
        job, query["sql"], query["epsilon"], query["delta"])
    reader = open_reader(job, per_statistic, delta_parameter)
    for _ in range(query["warmup"]):
        reader.execute(query["sql"])
    times, answers = [], []
    for _ in range(query["runs"]):
        start = time.perf_counter()
        rows = reader.execute(query["sql"])
        times.append((time.perf_counter() - start) * 1000)
        answers.append([list(r) for r in rows[1:]])  # rows[0] is the header
    return {"name": query["name"], "epsilon_per_statistic": per_statistic,
            "delta_parameter": delta_parameter, "query_epsilon": cost,
            "query_delta": cost_delta, "times_ms": times, "answers": answers}


def snsql_version() -> str:
    from importlib.metadata import version

    return version("smartnoise-sql")


if __name__ == "__main__":
    main()
