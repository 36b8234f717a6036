"""The `dpproxy` command, run as a real subprocess on a copy of the demo policy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from .conftest import ROOT, PolicyFactory


def dpproxy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpproxy", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_query_prints_table_accuracy_and_budget(demo_policy: Path) -> None:
    run = dpproxy("query", "--policy", demo_policy, "--epsilon", "1",
                  "SELECT sex, COUNT(*) AS people, AVG(age) FROM adult GROUP BY sex")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split("|")[0].strip() == "sex"
    assert [line.split("|")[0].strip() for line in lines[2:4]] == ["Female", "Male"]
    assert "±" in lines[2] and "[" in lines[2]  # COUNT half-width, AVG interval
    assert "(2 rows)" in run.stdout
    assert "budget left for alice: ε=9," in run.stdout
    assert "cost: ε=1, δ=0" in run.stdout


def test_query_json_matches_exact_answer_at_high_epsilon(make_policy: PolicyFactory,
                                                        demo_database: Path) -> None:
    policy = make_policy(replace={"budget = { epsilon = 10.0, delta = 1e-5 }":
                                  "budget = { epsilon = 1e6, delta = 1e-5 }"})
    run = dpproxy("query", "--policy", policy, "--epsilon", "1000", "--json",
                  "SELECT COUNT(*) FROM adult WHERE age >= 65")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    exact = duckdb.connect(str(demo_database), read_only=True).execute(
        "SELECT COUNT(*) FROM adult WHERE age >= 65").fetchone()[0]
    # Laplace scale 1/1000: |noise| >= 1 has probability e^-1000.
    assert out["columns"] == ["count"]
    assert out["rows"] == [[exact]]
    assert out["cost"] == {"epsilon": 1000.0, "delta": 0.0}
    assert out["accuracy"][0]["mechanism"] == "laplace"


def test_rejection_exits_nonzero_with_sqlstate_and_charges_nothing(demo_policy: Path) -> None:
    run = dpproxy("query", "--policy", demo_policy, "SELECT age FROM adult")
    assert run.returncode == 1
    assert run.stderr.startswith("ERROR 42501:")
    assert "HINT:" in run.stderr
    shown = json.loads(dpproxy("budget", "show", "--policy", demo_policy, "--json").stdout)
    assert shown[0]["epsilon_spent"] == 0


def test_explain_prints_plan_and_charges_nothing(demo_policy: Path) -> None:
    run = dpproxy("explain", "--policy", demo_policy,
                  "SELECT SUM(hours_per_week * 52) FROM adult WHERE age > 40")
    assert run.returncode == 0, run.stderr
    assert "L1 sensitivity 5148" in run.stdout
    assert "Rewritten SQL" in run.stdout
    assert "SELECT" in run.stdout.split("Rewritten SQL", 1)[1]
    shown = json.loads(dpproxy("budget", "show", "alice", "--policy", demo_policy,
                               "--json").stdout)
    assert shown == [{"account": "analyst:alice", "epsilon_budget": 10.0, "epsilon_spent": 0.0,
                      "epsilon_remaining": 10.0, "delta_budget": 1e-05, "delta_spent": 0.0,
                      "delta_remaining": 1e-05}]


def test_explain_says_sum_bounds_unit_totals(demo_policy: Path) -> None:
    """SUM adds each person's total clamped to 10 × the bounds; AVG's sum does not."""
    run = dpproxy("explain", "--policy", demo_policy,
                  "SELECT SUM(amount), AVG(amount) FROM visits")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    clamped = [line for line in lines if "clamped to 10 × the bounds" in line]
    assert len(clamped) == 1 and "m0 = SUM(clamp(amount, 0, 500)) (a unit" in clamped[0]


def test_budget_show_reflects_queries(demo_policy: Path) -> None:
    for age in (20, 30, 40):  # three different queries (a repeat would be free)
        assert dpproxy("query", "--policy", demo_policy, "--epsilon", "0.5",
                       f"SELECT COUNT(*) FROM adult WHERE age > {age}").returncode == 0
    run = dpproxy("budget", "show", "--policy", demo_policy)
    assert run.returncode == 0
    row = next(line for line in run.stdout.splitlines() if line.startswith("analyst:alice"))
    assert [c.strip() for c in row.split("|")][1:4] == ["10", "1.5", "8.5"]


def test_policy_check_ok_and_broken(tmp_path: Path) -> None:
    ok = dpproxy("policy", "check", ROOT / "policies" / "demo.toml")
    assert ok.returncode == 0 and "OK" in ok.stdout
    broken = tmp_path / "broken.toml"
    broken.write_text((ROOT / "policies" / "demo.toml").read_text().replace(
        "lower = 17, upper = 90", "lower = 17, uper = 90"))
    run = dpproxy("policy", "check", broken)
    assert run.returncode == 1
    assert "broken.toml" in run.stderr and "tables.adult.columns.age.uper" in run.stderr


def test_policy_check_prints_every_error_on_a_line_of_its_own(tmp_path: Path) -> None:
    text = (ROOT / "policies" / "demo.toml").read_text()
    text = text.replace('mechanism = "laplace"', 'mechanism = "laplce"')
    text = text.replace("lower = 17, upper = 90", "lower = 17, uper = 90")
    broken = tmp_path / "broken.toml"
    broken.write_text(text)
    lines = text.splitlines()
    mechanism = lines.index('mechanism = "laplce"') + 1
    age = next(i for i, line in enumerate(lines, 1) if line.startswith("age = "))
    column = lines[age - 1].index("uper") + 1
    run = dpproxy("policy", "check", broken)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.splitlines() == [
        f"ERROR F0000: {broken}:{mechanism}:1: privacy.mechanism: must be one of 'laplace', "
        "'gaussian', got 'laplce'",
        f"ERROR F0000: {broken}:{age}:{column}: tables.adult.columns.age.uper: unknown field; "
        "allowed fields: ldp, lower, nullable, public, public_range, public_values, type, "
        "unique, upper"]


def test_demo_builds_a_database_from_its_seed(tmp_path: Path) -> None:
    run = dpproxy("demo", "--out", tmp_path / "d.duckdb", "--seed", "7")
    assert run.returncode == 0, run.stderr
    assert "adult: 32,561 people" in run.stderr
    con = duckdb.connect(str(tmp_path / "d.duckdb"), read_only=True)
    assert con.execute("SELECT COUNT(*) FROM adult").fetchone() == (32561,)


def test_query_builds_missing_demo_database(tmp_path: Path) -> None:
    policy = tmp_path / "demo.toml"
    policy.write_text((ROOT / "policies" / "demo.toml").read_text()
                      .replace("../data/", "./"))
    run = dpproxy("query", "--policy", policy, "SELECT COUNT(*) FROM visits")
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "demo.duckdb").exists()
    assert (tmp_path / "demo.ledger.sqlite").exists()
    audit = [json.loads(line) for line in (tmp_path / "demo.audit.jsonl").read_text()
             .splitlines()]
    assert audit[-1]["outcome"] == "released" and audit[-1]["analyst"] == "alice"


def test_budget_admin_commands_change_and_record(demo_policy: Path) -> None:
    def show() -> dict:
        out = dpproxy("budget", "show", "alice", "--policy", demo_policy, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)[0]

    assert dpproxy("query", "--policy", demo_policy, "--epsilon", "2",
                   "SELECT COUNT(*) FROM adult").returncode == 0
    granted = dpproxy("budget", "grant", "alice", "--epsilon", "1.5", "--delta", "1e-6",
                      "--by", "ops", "--policy", demo_policy)
    assert granted.returncode == 0, granted.stderr
    assert (show()["epsilon_budget"], show()["delta_budget"]) == (11.5, 1.1e-05)
    assert dpproxy("budget", "set", "alice", "--epsilon", "4", "--by", "ops",
                   "--policy", demo_policy).returncode == 0
    assert (show()["epsilon_budget"], show()["epsilon_remaining"]) == (4.0, 2.0)
    assert dpproxy("budget", "reset", "alice", "--by", "ops",
                   "--policy", demo_policy).returncode == 0
    assert (show()["epsilon_spent"], show()["epsilon_remaining"]) == (0.0, 4.0)
    history = json.loads(dpproxy("budget", "history", "alice", "--json",
                                 "--policy", demo_policy).stdout)
    assert [(h["who"], h["what"]) for h in history[:4]] == [
        ("ops", "reset"), ("ops", "set_budget"), ("ops", "grant"), ("alice", "charge")]
    assert history[3]["detail"] == "SELECT COUNT(*) FROM adult"
    unknown = dpproxy("budget", "grant", "mallory", "--epsilon", "1", "--policy", demo_policy)
    assert unknown.returncode == 1 and "42704" in unknown.stderr


def test_a_removed_analysts_account_is_still_administered(demo_policy: Path) -> None:
    """The ledger keeps a removed analyst's account: `budget show|history|grant` reach it
    (they refused: "no budget in the policy"), and adding the analyst again says that the
    ledger's budget, not the new one, applies."""
    assert dpproxy("analyst", "add", "bob", "--tables", "adult", "--epsilon", "2",
                   "--policy", demo_policy).returncode == 0
    assert dpproxy("query", "--policy", demo_policy, "--analyst", "bob",
                   "SELECT COUNT(*) FROM adult").returncode == 0
    assert dpproxy("analyst", "remove", "bob", "--policy", demo_policy).returncode == 0
    shown = dpproxy("budget", "show", "bob", "--json", "--policy", demo_policy)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[0]["epsilon_spent"] == 0.1
    history = dpproxy("budget", "history", "bob", "--json", "--policy", demo_policy)
    assert [h["what"] for h in json.loads(history.stdout)] == ["charge", "create"]
    assert dpproxy("budget", "grant", "bob", "--epsilon", "1",
                   "--policy", demo_policy).returncode == 0
    again = dpproxy("analyst", "add", "bob", "--tables", "adult", "--epsilon", "5",
                    "--policy", demo_policy)
    assert again.returncode == 0 and "keeps bob's earlier account" in again.stdout
    assert "ε=3" in again.stdout
    assert dpproxy("budget", "show", "nobody", "--policy", demo_policy).returncode == 1


def test_budget_window_is_changed_by_an_admin_command(demo_policy: Path) -> None:
    """A ledger keeps the budget window it was used with: a policy with another one is
    refused until `dpproxy budget window` adopts it, which the history records."""
    assert dpproxy("budget", "show", "--policy", demo_policy).returncode == 0
    text = demo_policy.read_text()
    demo_policy.write_text(text.replace("[privacy]\n", '[privacy]\nbudget_window = "daily"\n',
                                        1))
    refused = dpproxy("budget", "show", "--policy", demo_policy)
    assert refused.returncode == 1 and "budget_window = 'never'" in refused.stderr
    adopted = dpproxy("budget", "window", "--by", "ops", "--policy", demo_policy)
    assert adopted.returncode == 0 and "'daily'" in adopted.stdout
    assert dpproxy("budget", "show", "--policy", demo_policy).returncode == 0
    history = json.loads(dpproxy("budget", "history", "--json", "--policy",
                                 demo_policy).stdout)
    assert ("ops", "budget_window never -> daily") in [(h["who"], h["what"]) for h in history]
