"""Columns collected under local DP, answered through the proxy (policies/survey.toml).

The survey is the demo's people answering under local DP (`dpproxy.ldp.build_survey`);
`survey_reps` adds 200 independently randomized copies of the income answer, so that
200 repetitions are 200 different queries on one engine.

Coverage threshold: the test asks for 99% intervals and requires ≥ 90% of 200 to hold
the truth. A correct implementation misses a 99% interval with probability ≤ 1% (the
binomial standard error it reports is conservative), so it fails the test with
probability P(Binomial(200, 0.01) ≥ 21) = 2.5e-15. At the default 95% level the same
threshold would fail with probability 1.2e-3, above this suite's 1e-6 budget; an
interval half as wide as it should be (true coverage ≈ 80%) fails it almost surely.
Other single-shot interval checks use confidence 1 − 1e-8.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpproxy import errors
from dpproxy.demo import OCCUPATION_COUNTS
from dpproxy.ldp import build_survey
from dpproxy.local import RandomizedResponse
from dpproxy.policy import load_policy, parse_policy
from dpproxy.session import Engine, Session

ROOT = Path(__file__).resolve().parent.parent
SURVEY_POLICY = ROOT / "policies" / "survey.toml"
REPS = 200
REPS_TABLE = f"""
[tables.survey_reps]
privacy_unit = "person_id"
membership = "public"

[tables.survey_reps.columns]
person_id = {{ type = "int", nullable = false }}
{chr(10).join(f'r{k} = {{ type = "bool", nullable = false, '
              f'ldp = {{ mechanism = "randomized_response", '
              f'epsilon = 1.0 }} }}' for k in range(REPS))}
"""


@pytest.fixture(scope="module")
def survey_database(demo_database: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("survey")
    table = load_policy(SURVEY_POLICY).tables["survey"]
    path = build_survey(demo_database, folder / "survey.duckdb", table)
    con = duckdb.connect(str(demo_database), read_only=True)
    rich = np.array([r for (r,) in con.execute(
        "SELECT income = '>50K' FROM adult ORDER BY person_id").fetchall()], dtype=bool)
    con.close()
    channel = RandomizedResponse.from_epsilon(1.0)
    columns = {"person_id": np.arange(1, rich.size + 1, dtype=np.int32)}
    columns |= {f"r{k}": channel.encode(rich) for k in range(REPS)}
    out = duckdb.connect(str(path))
    out.register("reps", columns)
    out.execute("CREATE TABLE survey_reps AS SELECT * FROM reps")
    for k in range(REPS):  # a report in every row: released exactly (public membership)
        out.execute(f"ALTER TABLE survey_reps ALTER COLUMN r{k} SET NOT NULL")
    out.close()
    return path


@pytest.fixture(scope="module")
def truth(demo_database: Path) -> dict[str, float]:
    con = duckdb.connect(str(demo_database), read_only=True)
    share, female = con.execute(
        "SELECT AVG((income = '>50K')::INT), AVG((income = '>50K')::INT) FILTER "
        "(sex = 'Female') FROM adult").fetchone()  # type: ignore[misc]
    con.close()
    return {"share": share, "female": female}


def survey_policy(folder: Path, database: Path, membership: str = "public") -> Path:
    text = SURVEY_POLICY.read_text()
    text = text.replace('path = "../data/survey.duckdb"', f'path = "{database.as_posix()}"')
    text = re.sub(r'\[ledger\]\npath = "[^"]*"', '[ledger]\npath = "ledger.sqlite"', text)
    text = re.sub(r'\[audit\]\npath = "[^"]*"', '[audit]\npath = "audit.jsonl"', text)
    text = text.replace('membership = "public"', f'membership = "{membership}"')
    text = text.replace('tables = ["survey"]', 'tables = ["survey", "survey_reps"]')
    path = folder / f"survey-{membership}.toml"
    path.write_text(text + REPS_TABLE)
    return path


@pytest.fixture
def engine(tmp_path: Path, survey_database: Path) -> Iterator[Engine]:
    with Engine.from_path(survey_policy(tmp_path, survey_database)) as eng:
        yield eng


@pytest.fixture
def alice(engine: Engine) -> Session:
    return engine.session("alice")


def test_debiased_answer_within_its_interval_in_most_repetitions(
        alice: Session, truth: dict[str, float]) -> None:
    alice.execute("SET dpproxy.confidence = 0.99")
    before = alice.remaining()
    hits = 0
    for k in range(REPS):
        result = alice.execute(f"SELECT AVG(r{k}) AS share FROM survey_reps")
        (low, high), = result.intervals[0]
        assert low < result.rows[0][0] < high
        hits += low <= truth["share"] <= high
    assert hits >= 0.9 * REPS
    assert alice.remaining() == before  # nothing charged: the reports are already private


def test_unary_histogram_within_intervals(alice: Session) -> None:
    alice.execute("SET dpproxy.confidence = 0.99999999")
    outputs = ", ".join(f"COUNT(occupation = '{v}')" for v in OCCUPATION_COUNTS)
    result = alice.execute(f"SELECT {outputs} FROM survey")
    assert result.cost is not None and result.cost.epsilon == 0
    for value, estimate, (low, high) in zip(OCCUPATION_COUNTS.values(), result.rows[0],
                                            result.intervals[0], strict=True):
        assert low <= value <= high
        assert low <= estimate <= high
    accuracy = result.accuracy[0]
    assert accuracy is not None and "unary encoding" in accuracy.mechanism
    assert accuracy.epsilon == 0


def test_group_by_public_key_and_count_is_n_times_share(alice: Session,
                                                        truth: dict[str, float]) -> None:
    alice.execute("SET dpproxy.confidence = 0.99999999")
    result = alice.execute("SELECT sex, AVG(high_income) AS share, COUNT(high_income) AS rich, "
                           "COUNT(*) AS people FROM survey GROUP BY sex")
    rows = {r[0]: r for r in result.rows}
    intervals = dict(zip((r[0] for r in result.rows), result.intervals, strict=True))
    low, high = intervals["Female"][1]
    assert low <= truth["female"] <= high
    assert result.types[1:3] == ("float8", "float8")
    _, share, rich, people = rows["Female"]
    # COUNT is the share times the (exact) number of reports, which COUNT(*) measures noisily
    assert rich / share == pytest.approx(round(rich / share))
    assert abs(rich / share - people) < 1000


@pytest.mark.parametrize("sql", [
    "SELECT high_income FROM survey",
    "SELECT * FROM survey",
    "SELECT COUNT(*) FROM survey WHERE high_income",
    "SELECT COUNT(*) FROM survey WHERE occupation[1]",
    "SELECT high_income, COUNT(*) FROM survey GROUP BY high_income",
    "SELECT occupation, COUNT(*) FROM survey GROUP BY 1",
    "SELECT SUM(high_income) FROM survey",
    "SELECT AVG(CASE WHEN high_income THEN age END) FROM survey",
    "SELECT COUNT(DISTINCT high_income) FROM survey",
    "SELECT AVG(high_income AND sex = 'Male') FROM survey",
    "SELECT COUNT(occupation) FROM survey",
    "SELECT COUNT(*) FROM survey HAVING COUNT(*) > 0 OR high_income",
    "SELECT COUNT(*) FROM survey ORDER BY high_income",
    "EXPLAIN SELECT high_income FROM survey",
])
def test_local_columns_are_never_read_raw(alice: Session, sql: str) -> None:
    before = alice.remaining()
    with pytest.raises(errors.PrivacyViolation) as info:
        alice.execute(sql)
    assert info.value.sqlstate == "42501"
    assert "local differential privacy" in str(info.value) or "raw rows" in str(info.value)
    assert alice.remaining() == before


def test_value_outside_the_domain_is_refused(alice: Session) -> None:
    with pytest.raises(errors.InvalidParameterValue, match="not in the declared domain"):
        alice.execute("SELECT COUNT(occupation = 'Astronaut') FROM survey")


def test_mixing_charges_only_the_central_part(alice: Session, engine: Engine) -> None:
    central = alice.execute("SELECT AVG(age) FROM survey")
    mixed = engine.session("alice").execute(
        "SELECT AVG(high_income), AVG(age), COUNT(occupation = 'Sales') FROM survey")
    assert mixed.cost == central.cost and central.cost is not None
    assert central.cost.epsilon == pytest.approx(0.1)
    age_mixed, age_alone = mixed.accuracy[1], central.accuracy[0]
    assert age_mixed is not None and age_alone is not None
    assert age_mixed.noise_scales == age_alone.noise_scales  # the same ε split as alone
    assert mixed.accuracy[0] is not None and mixed.accuracy[0].epsilon == 0
    explain = "\n".join(r[0] for r in alice.execute(
        "EXPLAIN SELECT AVG(high_income), AVG(age) FROM survey").rows)
    assert "exact, no central noise" in explain and "2 noisy statistic(s)" in explain


@pytest.mark.parametrize("sql", [
    "SELECT AVG(high_income) FROM survey WHERE age > 40",
    "SELECT age, COUNT(occupation = 'Sales') FROM survey GROUP BY age",
    "SELECT AVG(high_income) FROM survey WHERE person_id = 8 AND age > 40",
])
def test_public_membership_is_exact_only_over_public_columns(
        tmp_path: Path, survey_database: Path, sql: str) -> None:
    """With age not declared public (its public_range kept: that publishes the ages there
    are, not who has which), which rows pass `age > 40`, or hold an age, is private: the
    report count and sum are noised and charged, else COUNT(x)/AVG(x) would give the exact
    number of rows matching a private predicate, a private value by bisection. With age
    public (the demo's policy) the same query is exact and free."""
    private_age = survey_policy(tmp_path, survey_database)
    text = private_age.read_text()
    private_age.write_text(text.replace("step = 1 }, nullable = false, public = true }",
                                        "step = 1 }, nullable = false }"))
    age_line = next(line for line in private_age.read_text().splitlines()
                    if line.startswith("age = "))
    assert "public_range" in age_line and "public = true" not in age_line
    with Engine.from_path(private_age) as engine:
        result = engine.session("alice").execute(sql)
        assert result.cost is not None and result.cost.epsilon > 0
        accuracy = next(a for a in result.accuracy if a is not None)
        assert accuracy.epsilon > 0 and all(scale > 0 for scale in accuracy.noise_scales)
    with Engine.from_path(survey_policy(tmp_path, survey_database)) as engine:
        result = engine.session("alice").execute(sql)
        assert result.cost is not None and result.cost.epsilon == 0


def test_public_values_do_not_make_a_person_s_value_public(tmp_path: Path,
                                                           survey_database: Path) -> None:
    """A column with public_values but not `public = true` (sex here) is private row by
    row. Exact and free, `COUNT(x) WHERE person_id = k AND sex = v` would be 0 or the
    debiased value of one report: whether person k has value v, exactly."""
    policy = survey_policy(tmp_path, survey_database)
    text = policy.read_text()
    policy.write_text(text.replace("nullable = false, public = true }", "nullable = false }"))
    sex_line = next(line for line in policy.read_text().splitlines()
                    if line.startswith("sex = "))
    assert "public_values" in sex_line and "public = true" not in sex_line
    with Engine.from_path(policy) as engine:
        alice = engine.session("alice", epsilon=0.5)
        for sql in ("SELECT COUNT(high_income) FROM survey WHERE person_id = 3 AND sex = "
                    "'Female'", "SELECT sex, AVG(high_income) FROM survey GROUP BY sex"):
            result = alice.execute(sql)
            assert result.cost is not None and result.cost.epsilon == pytest.approx(0.5)
            accuracy = result.accuracy[-1]
            assert accuracy is not None and all(s > 0 for s in accuracy.noise_scales)
        # the person alone stays exact: who answered is the public roster
        result = alice.execute("SELECT COUNT(high_income) FROM survey WHERE person_id = 3")
        assert result.cost is not None and result.cost.epsilon == 0


def test_private_membership_noises_and_charges(tmp_path: Path, survey_database: Path,
                                               truth: dict[str, float]) -> None:
    """Without `membership = "public"`, who is in a group is private: the row count and the
    report sum get central noise and are charged, and the interval covers both errors."""
    with Engine.from_path(survey_policy(tmp_path, survey_database, "private")) as engine:
        alice = engine.session("alice", epsilon=0.5, confidence=0.99999999)
        result = alice.execute("SELECT AVG(high_income) FROM survey WHERE sex = 'Female'")
        assert result.cost is not None and result.cost.epsilon == pytest.approx(0.5)
        accuracy = result.accuracy[0]
        assert accuracy is not None and accuracy.epsilon == pytest.approx(0.5)
        assert all(scale > 0 for scale in accuracy.noise_scales)
        assert "laplace" in accuracy.mechanism
        (low, high), = result.intervals[0]
        assert low <= truth["female"] <= high
        plan_lines = "\n".join(r[0] for r in alice.execute(
            "EXPLAIN SELECT COUNT(high_income) FROM survey").rows)
        assert "exact" not in plan_lines and "2 noisy statistic(s)" in plan_lines


JOINED = """
[backend]
kind = "duckdb"
path = "DB"

[tables.survey]
privacy_unit = "pid"
membership = "public"

[tables.survey.columns]
pid = { type = "int", nullable = false }
band = { type = "int", lower = 0, upper = 9, public = true }
salary = { type = "int", lower = 0, upper = 1000000, nullable = false }
hi = { type = "bool", nullable = false, ldp = { mechanism = "randomized_response", epsilon = 1.0 } }

[tables.cut]
public = true

[tables.cut.columns]
salary = { type = "int" }
band = { type = "int" }
label = { type = "text" }

[analysts.alice]
budget = { epsilon = 10.0 }
tables = ["survey", "cut"]
"""


@pytest.mark.parametrize(("sql", "exact"), [
    # a join on a private column filters, multiplies and labels rows by it: charged
    ("SELECT COUNT(hi), AVG(hi) FROM survey JOIN cut USING (salary)", False),
    ("SELECT COUNT(hi) FROM survey LEFT JOIN cut USING (salary) WHERE cut.salary IS NULL",
     False),
    ("SELECT COUNT(hi) FROM survey LEFT JOIN cut ON survey.salary = cut.salary "
     "WHERE cut.label = 'b'", False),
    # on a column public row by row: exact and free
    ("SELECT AVG(hi) FROM survey JOIN cut ON survey.band = cut.band WHERE cut.label = 'b'",
     True),
])
def test_a_join_on_a_private_column_makes_rows_private(tmp_path: Path, sql: str,
                                                       exact: bool) -> None:
    """Joined on a private column, COUNT(report) over the matches would be 0 or one
    debiased report, exactly and free: whether a person's salary is in the joined table
    (a red-team review found this released at ε = 0)."""
    database = tmp_path / "joined.duckdb"
    con = duckdb.connect(str(database))
    con.execute("CREATE TABLE survey AS SELECT range::INT AS pid, (range % 10)::INT AS band, "
                "(30000 + 1000 * (range % 50))::INT AS salary, range % 3 = 0 AS hi "
                "FROM range(1000)")
    con.execute("ALTER TABLE survey ALTER COLUMN hi SET NOT NULL")
    con.execute("CREATE TABLE cut AS SELECT * FROM (VALUES (38000, 1, 'a'), (123456, 2, 'b'))"
                " AS c(salary, band, label)")
    con.close()
    policy = tmp_path / "joined.toml"
    policy.write_text(JOINED.replace("DB", database.as_posix()))
    with Engine.from_path(policy) as engine:
        result = engine.session("alice", epsilon=0.5).execute(sql)
        assert result.cost is not None
        assert (result.cost.epsilon == 0) is exact, result.cost



def test_whether_a_person_reported_is_released_exactly_only_if_every_row_reports(
        tmp_path: Path) -> None:
    """A NULL report is no randomized answer: under public membership a per-person
    `COUNT(hi)` was 0 with the interval [0, 0] for a person who did not answer, and wider
    for one who did, exactly and free. Exact release needs the database to hold a report
    in every row (the column NOT NULL); a policy's `nullable = false` alone is not
    checked against the data, so a NULL there was still released exactly."""
    for null_report, exact in ((True, False), (False, False), (False, True)):
        database = tmp_path / f"nulls{null_report}{exact}.duckdb"
        con = duckdb.connect(str(database))
        con.execute("CREATE TABLE survey AS SELECT range::INT AS pid, (range % 10)::INT AS "
                    "band, 1000::INT AS salary, CASE WHEN range = 7 AND " + str(null_report)
                    + " THEN NULL ELSE range % 3 = 0 END AS hi FROM range(1000)")
        if exact:
            con.execute("ALTER TABLE survey ALTER COLUMN hi SET NOT NULL")
        con.close()
        policy = tmp_path / "nulls.toml"
        policy.write_text(JOINED.replace("DB", database.as_posix()))  # nullable = false
        with Engine.from_path(policy) as engine:
            result = engine.session("alice", epsilon=0.5).execute(
                "SELECT COUNT(hi) FROM survey WHERE pid = 7")
            assert result.cost is not None and (result.cost.epsilon == 0) is exact


# policy validation ---------------------------------------------------------------------------
BASE = {
    "backend": {"kind": "duckdb", "path": "x.duckdb"},
    "analysts": {"a": {"tables": ["t"], "budget": {"epsilon": 1.0}}},
}


def table_with(column: dict[str, object], **table: object) -> dict[str, object]:
    return {**BASE, "tables": {"t": {**table, "columns": {"id": {"type": "int"}, "c": column}}}}


@pytest.mark.parametrize("column, message", [
    ({"type": "text", "ldp": {"mechanism": "randomized_response", "epsilon": 1.0}},
     'tables.t.columns.c.ldp: randomized_response answers yes/no'),
    ({"type": "bool", "ldp": {"mechanism": "randomized_response"}},
     "tables.t.columns.c.ldp: give exactly one of epsilon"),
    ({"type": "bool", "ldp": {"mechanism": "randomized_response", "epsilon": 1, "f": 0.7}},
     "give exactly one of"),
    ({"type": "bool", "ldp": {"mechanism": "randomized_response", "f": 0.4}},
     "f must exceed 1/2"),
    ({"type": "bool", "ldp": {"mechanism": "randomized_response", "epsilon": -1}},
     "tables.t.columns.c.ldp.epsilon: must be > 0"),
    ({"type": "text", "ldp": {"mechanism": "unary", "epsilon": 1}},
     "tables.t.columns.c.ldp.domain: required field is missing"),
    ({"type": "text", "ldp": {"mechanism": "unary", "domain": ["a", 1], "epsilon": 1}},
     "item 1 (1) is not a text value"),
    ({"type": "text", "ldp": {"mechanism": "unary", "domain": ["a"], "p": 0.2, "q": 0.5}},
     "p must exceed q"),
    ({"type": "text", "ldp": {"mechanism": "unary", "domain": ["a"], "p": 0.5}},
     "give domain = [...] with either p"),
    ({"type": "text", "ldp": {"mechanism": "shuffle"}}, "must be one of"),
    ({"type": "int", "lower": 0, "upper": 1,
      "ldp": {"mechanism": "unary", "domain": [0, 1], "epsilon": 1}}, "has no bounds"),
])
def test_policy_rejects_bad_ldp_declarations(column: dict[str, object], message: str) -> None:
    with pytest.raises(errors.InvalidPolicy) as info:
        parse_policy(table_with(column), Path("p.toml"))
    assert message in str(info.value)


def test_policy_reads_ldp_declarations() -> None:
    policy = parse_policy(table_with(
        {"type": "int", "ldp": {"mechanism": "unary", "domain": [3, 5], "epsilon": 2.0,
                                "variant": "symmetric"}}, membership="public"), Path("p.toml"))
    table = policy.tables["t"]
    assert table.membership == "public"
    channel = table.columns["c"].ldp
    assert channel is not None and channel.epsilon == pytest.approx(2.0)
    with pytest.raises(errors.InvalidPolicy, match="membership: must be one of"):
        parse_policy(table_with({"type": "int"}, membership="secret"), Path("p.toml"))
    roster = parse_policy(table_with({"type": "int", "public": True}, membership="public"),
                          Path("p.toml")).tables["t"].columns["c"]
    assert roster.public and not load_policy(SURVEY_POLICY).tables["survey"] \
        .columns["high_income"].public
    with pytest.raises(errors.InvalidPolicy, match="its values are not public"):
        parse_policy(table_with({"type": "bool", "public": True, "ldp": {
            "mechanism": "randomized_response", "epsilon": 1.0}}, membership="public"),
            Path("p.toml"))
    assert load_policy(SURVEY_POLICY).tables["survey"].columns["high_income"].ldp == \
        RandomizedResponse(0.75, 0.25)


def test_cli_builds_the_demo_survey(tmp_path: Path, demo_database: Path) -> None:
    import subprocess
    import sys

    target = tmp_path / "cli-survey.duckdb"
    policy = survey_policy(tmp_path, target)
    done = subprocess.run([sys.executable, "-m", "dpproxy", "ldp", "demo", "--policy",
                           str(policy), "--source", str(demo_database)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    con = duckdb.connect(str(target), read_only=True)
    (rows, width), = con.execute("SELECT COUNT(*), MAX(len(occupation)) FROM survey").fetchall()
    con.close()
    assert (rows, width) == (32_561, len(OCCUPATION_COUNTS))
