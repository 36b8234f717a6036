"""A Java application over the PostgreSQL JDBC driver (pgjdbc), on both backends.

`tests/clients/JdbcScript.java` runs a script of statements through pgjdbc with the
machine's Java and prints one JSON line per command. pgjdbc differs from the Python
clients: it always uses the extended protocol, switches a PreparedStatement to a named
server-side statement (and binary results) from its fifth run, reads metadata with its
own catalog queries, binds a java.sql.Date as '2024-06-01 +00', and pages results with
a portal when a fetch size is set. `scripts/test` fetches the driver from the
distribution's packages when Java is there but the driver is not.

Values are checked at ε = 1000 per query: a count of sensitivity Δ ≤ 10 gets Laplace
scale ≤ 0.01, which exceeds the tolerance of 1 with probability below 2·e^-100.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .exact import read_directly
from .test_server_support import BIG_BUDGET, ServeFactory

BACKENDS = ("duckdb", "postgres")

SCRIPT = Path(__file__).parent / "clients" / "JdbcScript.java"


def _driver() -> Path | None:
    candidates = [os.environ.get("PGJDBC_JAR"), "/usr/share/java/postgresql.jar",
                  Path(sys.prefix) / "share/pgjdbc/usr/share/java/postgresql.jar"]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def jdbc() -> tuple[str, Path]:
    """Java and the pgjdbc jar; without them the test is skipped, except in CI (CI=true),
    where it fails."""
    java, jar = shutil.which("java"), _driver()
    if java is None or jar is None:
        missing = "java" if java is None else "the pgjdbc jar (PGJDBC_JAR)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"the JDBC client test needs {missing}")
        pytest.skip(f"the JDBC client test needs {missing}")
    return java, jar


def run_script(jdbc: tuple[str, Path], port: int, commands: list[list[str]]
               ) -> list[dict[str, Any]]:
    java, jar = jdbc
    script = "".join("\t".join(c) + "\n" for c in commands)
    done = subprocess.run(
        [java, "-cp", str(jar), str(SCRIPT), f"jdbc:postgresql://127.0.0.1:{port}/demo",
         "alice", "alice-demo"], input=script, capture_output=True, text=True, timeout=180,
        check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == len(commands), done.stdout
    return lines


def values(result: dict[str, Any]) -> list[list[Any]]:
    assert "rows" in result, result
    return result["rows"]


def test_java_application(jdbc: tuple[str, Path], serve: ServeFactory) -> None:
    served = serve(BIG_BUDGET)
    count_men = "SELECT COUNT(*) AS n FROM adult WHERE age > ? AND sex = ?"
    since = "SELECT COUNT(*) FROM visits WHERE day >= ?"
    (tables, columns, keywords, epsilon, men, since_date, since_local, since_time,
     by_education, averages, refused, after) = run_script(jdbc, served.port, [
        ["tables"],
        ["columns", "adult"],
        ["keywords"],
        ["execute", "SET dpproxy.epsilon = 1000"],
        # 7 runs: pgjdbc's fifth and later use a named statement and binary results
        ["query", "7", count_men, "int:40", "string:Male"],
        ["query", "1", since, "date:2024-06-01"],
        ["query", "1", since, "localdate:2024-06-01"],
        ["query", "1", since, "timestamp:2024-06-01 00:00:00"],
        ["fetch", "3", "SELECT education, COUNT(*) FROM adult GROUP BY education"],
        ["query", "1", "SELECT sex, AVG(age) AS mean_age FROM adult GROUP BY sex "
                       "ORDER BY sex"],
        ["query", "1", "SELECT * FROM adult"],
        ["query", "1", "SELECT COUNT(*) FROM adult"],
    ])
    assert {r[2] for r in values(tables)} == {"adult", "visits", "occupation_groups"}
    assert [(r[3], r[5]) for r in values(columns)][:3] == [
        ("person_id", "int8"), ("age", "int8"), ("sex", "text")]
    # pgjdbc reads pg_get_keywords() and leaves out SQL:2003's own words
    assert {"analyze", "concurrently", "verbose"} <= set(keywords["keywords"].split(","))
    assert epsilon == {"ok": True}

    assert men["columns"] == [["n", "int8"]]
    (exact_men,), = read_directly(served.engine, count_men.replace("?", "{}").format(
        40, "'Male'"))
    assert abs(int(values(men)[0][0]) - exact_men) <= 1
    # java.sql.Date ('2024-06-01 +00'), LocalDate and a Timestamp at midnight bind the
    # same day: the same query, so the second and third are the first's stored answer
    assert values(since_date) == values(since_local) == values(since_time)
    # each person keeps at most 10 visits (max_rows_per_unit)
    (exact_since,), = read_directly(
        served.engine, "SELECT SUM(LEAST(n, 10)) FROM (SELECT COUNT(*) AS n FROM visits "
                       "WHERE day >= DATE '2024-06-01' GROUP BY person_id) AS per_person")
    assert abs(int(values(since_date)[0][0]) - exact_since) <= 1

    assert len(values(by_education)) == 16  # public keys, paged by 3 through a portal
    exact_education = dict(read_directly(
        served.engine, "SELECT education, COUNT(*) FROM adult GROUP BY education"))
    for education, count in values(by_education):
        assert abs(int(count) - exact_education[education]) <= 1

    assert averages["columns"] == [["sex", "text"], ["mean_age", "float8"]]
    assert [r[0] for r in values(averages)] == ["Female", "Male"]
    assert refused["error"] == "42501" and "SELECT *" in refused["message"]
    assert len(values(after)) == 1  # the connection goes on after a refusal

    # charged once per distinct query: the 7 runs of one, the three bindings of a day,
    # the grouped counts, the averages (two statistics, one ε), the last
    assert served.spent() == pytest.approx(5 * 1000)
