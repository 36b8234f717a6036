"""An ODBC application over psqlODBC, the PostgreSQL ODBC driver of Excel, Power BI and
Tableau, on both backends.

`tests/clients/odbc_script.py` runs a script of commands through pyodbc and the driver
in a process of its own. psqlODBC prepares each parameterized statement of a handle under
one name, DEALLOCATEs it and prepares the next under the same name; it reads tables and
columns with its own catalog queries (SQLColumns' FROM is a parenthesized join group).
`scripts/test` unpacks the driver and the unixODBC driver manager from the distribution's
packages into .venv where the machine lacks them.

Values are checked at ε = 1000 per query: a count of sensitivity Δ ≤ 10 gets Laplace
scale ≤ 0.01, which exceeds the tolerance of 1 with probability below 2·e^-100.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .exact import read_directly
from .test_server_support import BIG_BUDGET, ServeFactory

BACKENDS = ("duckdb", "postgres")

SCRIPT = Path(__file__).parent / "clients" / "odbc_script.py"


def _driver() -> Path | None:
    """psqlODBC's Unicode driver: the machine's, or the one scripts/test unpacked."""
    for root in (Path("/"), Path(sys.prefix) / "share" / "odbc"):
        found = sorted(root.glob("usr/lib/*/odbc/psqlodbcw.so"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="module")
def odbc_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that lets pyodbc find psqlODBC; without the driver (or pyodbc) the
    test is skipped, except in CI (CI=true), where it fails."""
    driver = _driver()
    try:
        import pyodbc  # noqa: F401  (loads the driver manager, as the script will)
        missing = None if driver is not None else "psqlODBC (psqlodbcw.so)"
    except ImportError as exc:
        missing = f"pyodbc and the unixODBC driver manager ({exc})"
        if driver is not None and (driver.parents[1] / "libodbc.so.2").exists():
            missing = None  # unpacked into .venv: loadable with LD_LIBRARY_PATH below
    if missing is not None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the ODBC client test needs {missing}")
        pytest.skip(f"the ODBC client test needs {missing}")
    assert driver is not None
    folder = tmp_path_factory.mktemp("odbc")
    (folder / "odbcinst.ini").write_text(f"[PostgreSQL Unicode]\nDriver = {driver}\n")
    libraries = driver.parents[1]  # usr/lib/<triplet>, beside the driver's odbc/ folder
    return {**os.environ, "ODBCSYSINI": str(folder), "LD_LIBRARY_PATH": os.pathsep.join(
        filter(None, [str(libraries), os.environ.get("LD_LIBRARY_PATH")]))}


def run_script(env: dict[str, str], port: int, commands: list[dict[str, Any]]
               ) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(port), "alice", "alice-demo"],
        input="".join(json.dumps(c) + "\n" for c in commands), capture_output=True,
        text=True, timeout=180, check=False, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == len(commands), done.stdout
    return lines


def test_odbc_application(odbc_env: dict[str, str], serve: ServeFactory) -> None:
    served = serve(BIG_BUDGET)
    older = "SELECT COUNT(*) AS n FROM adult WHERE age > ? AND sex = ?"
    since = "SELECT COUNT(*) AS n FROM visits WHERE day >= ?"
    (tables, columns, epsilon, men, visits, by_job, refused, manual, in_txn,
     committed) = run_script(odbc_env, served.port, [
        {"tables": True},
        {"columns": "adult"},
        {"query": "SET dpproxy.epsilon = 1000"},
        # one statement handle: each query is prepared under its name, then DEALLOCATEd
        {"query": older, "params": [40, "Male"], "times": 3},
        {"query": since, "params": [{"date": "2024-06-01"}]},
        {"query": "SELECT occupation, COUNT(*) AS n, AVG(age) AS a FROM adult "
                  "GROUP BY occupation ORDER BY occupation"},
        {"query": "SELECT * FROM adult"},
        {"autocommit": False},
        {"query": since, "params": [{"date": "2024-06-01"}]},
        {"commit": True},
    ])
    assert sorted(r[0] for r in tables["rows"]) == ["adult", "occupation_groups", "visits"]
    assert [r for r in columns["rows"]][:3] == [["person_id", "int8"], ["age", "int8"],
                                                ["sex", "text"]]
    assert epsilon == {"ok": True}

    (exact_men,), = read_directly(served.engine, older.replace("?", "{}").format(40, "'Male'"))
    assert men["columns"] == ["n"] and abs(men["rows"][0][0] - exact_men) <= 1
    # each person keeps at most 10 visits (max_rows_per_unit)
    (exact_since,), = read_directly(
        served.engine, "SELECT SUM(LEAST(n, 10)) FROM (SELECT COUNT(*) AS n FROM visits "
                       "WHERE day >= DATE '2024-06-01' GROUP BY person_id) AS per_person")
    assert abs(visits["rows"][0][0] - exact_since) <= 1
    exact_jobs = dict(read_directly(served.engine, "SELECT occupation, COUNT(*) FROM adult "
                                                   "WHERE occupation IS NOT NULL "
                                                   "GROUP BY occupation"))
    assert [r[0] for r in by_job["rows"]] == sorted(exact_jobs)
    assert all(abs(n - exact_jobs[job]) <= 1 for job, n, _ in by_job["rows"])
    assert refused["error"] == "42501" and "SELECT *" in refused["message"]
    assert manual == committed == {"ok": True}
    assert in_txn["rows"] == visits["rows"]  # the same query: its stored answer

    # charged once per distinct query: the 3 runs of one, the visits (twice), the groups
    assert served.spent() == pytest.approx(3 * 1000)
