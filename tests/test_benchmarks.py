"""Smoke tests: the benchmark scripts run end to end on tiny data, so they never rot.

Each script writes into a temporary --out folder (the published results in
benchmarks/results/ and the README are left alone), and the test checks what it wrote.
No timing is asserted: the numbers of a tiny run mean nothing. SmartNoise SQL is left
out (`--skip-smartnoise`): CI must not need its virtual environment.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def scratch_pg(pg_dsn: str) -> Iterator[str]:
    """A throwaway database, so the smoke run never touches a real run's schema."""
    from tests.pg import scratch_database

    with scratch_database(pg_dsn) as dsn:
        yield dsn


def test_peers_runs_on_tiny_data(tmp_path: Path, scratch_pg: str) -> None:
    readme = (ROOT / "README.md").read_text()
    out = tmp_path / "results"
    stdout = run("peers.py", "--rows", "2000", "--runs", "2", "--error-runs", "3",
                 "--sweep", "0.5,2", "--sweep-runs", "2", "--bound-rows", "20000",
                 "--overhead-runs", "3", "--skip-smartnoise", "--pg-dsn", scratch_pg,
                 "--out", str(out))
    results = json.loads((out / "peers.json").read_text())
    names = list(results["queries"])
    assert len(names) == 5
    systems = results["systems"]
    assert {"exact_duckdb", "dpproxy_duckdb", "exact_postgres", "dpproxy_postgres"} \
        <= set(systems)
    assert "smartnoise_postgres" not in systems and results["smartnoise_version"] is None
    for system in ("exact_duckdb", "dpproxy_duckdb", "exact_postgres", "dpproxy_postgres"):
        assert all(systems[system][n]["median_ms"] > 0 for n in names)
    dp = systems["dpproxy_duckdb"]
    assert all(dp[n]["runs"] == 3 for n in names)
    # COUNT(*) over ~2000 rows at ε = 1: released every time, with a finite error
    (count,) = dp["a_count"]["per_statistic"]
    assert count["suppressed_share"] == 0 and math.isfinite(count["median_rel"])
    # public keys are never suppressed: every occupation, COUNT and AVG, every run
    assert all(s["suppressed_share"] == 0 for s in dp["b_group_avg"]["per_statistic"])
    # COUNT and AVG of each occupation present in 2000 rows (the rarest may be absent)
    assert 2 * 12 <= len(dp["b_group_avg"]["per_output"]) <= 2 * 14
    assert set(results["proxy_overhead_ms"]) == set(names)
    assert [p for p in results["sweep"]["dpproxy"] if p] and results["sweep"]["smartnoise"] == []
    bounding = results["bounding"]
    assert bounding["rows"] == 20000
    assert all(bounding[q]["dp_ms"] > 0 for q in ("count", "sum_where", "group_avg"))
    table = (out / "peers.md").read_text()
    assert "(a) COUNT(*)" in table and "User-level bounding on DuckDB" in table
    assert "(not run)" in table  # SmartNoise left out, and the table says so
    assert table in stdout
    assert (out / "peers.png").read_bytes().startswith(PNG)
    assert (ROOT / "README.md").read_text() == readme  # only the default --out publishes


def test_ldp_accuracy_runs_quick(tmp_path: Path) -> None:
    run("ldp_accuracy.py", "--quick", "--out", str(tmp_path))
    assert (tmp_path / "ldp_accuracy.json").exists()
    assert (tmp_path / "ldp_proportion.png").read_bytes().startswith(PNG)


def test_throughput_runs_briefly(tmp_path: Path) -> None:
    run("throughput.py", "--seconds", "0.3", "--clients", "1", "--out", str(tmp_path))
    results = json.loads((tmp_path / "throughput.json").read_text())
    assert results
    assert (tmp_path / "throughput.md").read_text().count("|") > 4
    assert [r["variant"] for r in results["ab_one_shape"]] == ["shared scans off",
                                                                "shared scans on"]
    rows = results["wire"] + results["in_process"] + results["ab"] + results["ab_one_shape"]
    assert all(r["queries"] > 0 and r["failures"] == 0 for r in rows)


# The other scripts, each at the smallest size that runs every part of it (PostgreSQL in a
# scratch database): (script, arguments, what its JSON must hold, a line of its table)
SMALL_RUNS = [
    ("overhead.py", ["--rows", "3000", "--repeat", "1", "--pg-rows", "3000"],
     {"row_level", "user_level", "proxy_overhead_ms", "selection_noise", "postgres"},
     "| group_avg |"),
    ("quantiles.py", ["--rows", "3000", "--repeat", "1", "--draws", "20", "--pg-rows", "3000"],
     {"row_level", "user_level", "accuracy", "sampler_us", "postgres"}, "| median |"),
    ("variance.py", ["--rows", "3000", "--repeat", "1", "--pg-rows", "3000",
                     "--releases", "5"], {"duckdb_time", "split_accuracy", "postgres_time"},
     "|"),
    ("joins.py", ["--rows", "3000", "--repeat", "1"], {"meta", "results"}, "| query |"),
    ("expression_keys.py", ["--repeat", "1"], {"repeat", "rows"}, "| query |"),
    ("accounting.py", [], {"queries_bought", "zcdp_sigma"}, "| σ per query |"),
]


@pytest.mark.parametrize(("script", "args", "keys", "line"),
                         [pytest.param(*run_, id=run_[0]) for run_ in SMALL_RUNS])
def test_benchmark_runs_on_tiny_data(tmp_path: Path, scratch_pg: str, script: str,
                                     args: list[str], keys: set[str], line: str) -> None:
    """Every part runs (PostgreSQL too, where the script has it) and writes its JSON and
    Markdown into --out; the README, which quotes the published results, is left alone."""
    readme = (ROOT / "README.md").read_text()
    name = script.removesuffix(".py")
    pg = ["--pg-dsn", scratch_pg] if "--pg-rows" in args else []
    stdout = run(script, *args, *pg, "--out", str(tmp_path))
    results = json.loads((tmp_path / f"{name}.json").read_text())
    assert keys <= set(results), sorted(results)
    table = (tmp_path / f"{name}.md").read_text()
    assert line in table and line in stdout
    assert (ROOT / "README.md").read_text() == readme


def test_busy_server_runs_on_tiny_data(tmp_path: Path, scratch_pg: str) -> None:
    """Its sessions ran as it says: after each commit elsewhere and each insert into the
    table the carrying one ran unbounded on a carried check, the other bounded; with no
    commit since, the check was reused. The README is left alone."""
    readme = (ROOT / "README.md").read_text()
    stdout = run("busy_server.py", "--pg-rows", "3000", "--repeat", "2",
                 "--pg-dsn", scratch_pg, "--out", str(tmp_path))
    results = json.loads((tmp_path / "busy_server.json").read_text())
    assert len(results["queries"]) == 3
    for r in results["queries"].values():
        assert r["bounding"]["carry"] == {"checks": 0, "carried": 4, "unbounded": 6,
                                          "bounded": 0}
        assert r["bounding"]["bound"] == {"checks": 0, "carried": 0, "unbounded": 0,
                                          "bounded": 2}
        assert all(v > 0 for v in r["ms"].values())
    assert "| (b) occupation" in (tmp_path / "busy_server.md").read_text()
    assert "| (b) occupation" in stdout
    assert (ROOT / "README.md").read_text() == readme
