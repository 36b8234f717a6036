"""Policy files: the bundled demo policy, and validation that names file, field and what is
allowed (SPEC §3). Broken policies are the demo policy with one snippet changed, written to
tmp_path; nothing here opens a database or a ledger."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from dpproxy.errors import Error, InvalidPolicy
from dpproxy.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent
DEMO_POLICY = ROOT / "policies" / "demo.toml"
DEMO_TEXT = DEMO_POLICY.read_text(encoding="utf-8")

OCCUPATIONS = (
    "Adm-clerical", "Exec-managerial", "Handlers-cleaners", "Prof-specialty", "Other-service",
    "Sales", "Craft-repair", "Transport-moving", "Farming-fishing", "Machine-op-inspct",
    "Tech-support", "Protective-serv", "Armed-Forces", "Priv-house-serv",
)
AGE = 'age = { type = "int", lower = 17, upper = 90, nullable = false }'
SEX_VALUES = 'public_values = ["Female", "Male"]'
ALICE_BUDGET = "budget = { epsilon = 10.0, delta = 1e-5 }"
ALICE_TABLES = 'tables = ["adult", "visits", "occupation_groups"]'
ADULT_UNIT = 'privacy_unit = "person_id"\nmax_groups_per_unit = 1\nmax_rows_per_unit = 1\n'
BACKEND = 'kind = "duckdb"\npath = "../data/demo.duckdb"\n'
PUBLIC_TABLE = "[tables.occupation_groups]\npublic = true\n"


def write_variant(tmp_path: Path, old: str, new: str, name: str = "broken.toml") -> Path:
    """The demo policy with its first `old` replaced by `new`, written into tmp_path."""
    assert old in DEMO_TEXT, f"snippet not in the demo policy: {old!r}"
    path = tmp_path / name
    path.write_text(DEMO_TEXT.replace(old, new, 1), encoding="utf-8")
    return path


# -- the bundled demo policy --------------------------------------------------------------------

def test_demo_policy_loads_as_the_issue_describes() -> None:
    policy = load_policy(DEMO_POLICY)

    alice = policy.analyst("alice")
    assert alice.role == "analyst"
    assert alice.budget is not None
    assert (alice.budget.epsilon, alice.budget.delta) == (10.0, 1e-5)
    assert {"adult", "visits"} <= set(alice.tables)
    assert alice.password_scram is not None and alice.password_scram.startswith("SCRAM-SHA-256$")

    admin = policy.analyst("admin")
    assert admin.role == "admin"

    adult = policy.tables["adult"]
    assert not adult.public
    assert adult.privacy_unit == "person_id"
    assert (adult.max_groups_per_unit, adult.max_rows_per_unit) == (1, 1)
    assert adult.columns["occupation"].type == "text"
    assert adult.columns["occupation"].public_values == OCCUPATIONS
    assert adult.columns["sex"].public_values == ("Female", "Male")
    age = adult.columns["age"]
    assert (age.type, age.lower, age.upper, age.nullable, age.bounded) == (
        "int", 17, 90, False, True)
    assert not adult.columns["person_id"].bounded

    visits = policy.tables["visits"]
    assert (visits.privacy_unit, visits.max_groups_per_unit, visits.max_rows_per_unit) == (
        "person_id", 4, 10)
    assert policy.tables["occupation_groups"].public
    assert policy.tables["occupation_groups"].privacy_unit is None

    assert policy.backend.kind == "duckdb"
    assert policy.backend.path == (ROOT / "data" / "demo.duckdb").resolve()
    assert policy.ledger_path == (ROOT / "data" / "demo.ledger.sqlite").resolve()
    assert policy.privacy.default_epsilon == 0.1
    assert policy.privacy.mechanism == "laplace"
    assert policy.database == "demo"
    assert len(policy.version) == 16


def test_demo_password_verifier_matches_the_documented_password() -> None:
    from dpproxy.server.scram import verify_password

    verifier = load_policy(DEMO_POLICY).analyst("alice").password_scram
    assert verifier is not None
    assert verify_password("alice-demo", verifier)
    assert not verify_password("alice-demo ", verifier)


def test_unknown_analyst_names_the_known_ones() -> None:
    policy = load_policy(DEMO_POLICY)
    with pytest.raises(InvalidPolicy) as info:
        policy.analyst("mallory")
    text = str(info.value)
    assert "mallory" in text and "admin, alice" in text


# -- validation: one broken policy per rule -----------------------------------------------------

# (id, snippet of the demo policy, its replacement, dotted field(s) named, words of the fix)
BROKEN: list[tuple[str, str, str, str | tuple[str, ...], tuple[str, ...]]] = [
    ("unknown top-level key", 'database = "demo"', 'database = "demo"\ncolour = "blue"',
     "colour", ("unknown field", "analysts, audit, backend, database")),
    ("column field typo", AGE, AGE.replace("upper", "uper"), "tables.adult.columns.age.uper",
     ("unknown field", "lower, nullable, public_range, public_values, type, unique, upper")),
    ("lower without upper", AGE, 'age = { type = "int", lower = 17, nullable = false }',
     "tables.adult.columns.age.upper", ("give both lower and upper",)),
    ("upper without lower", AGE, 'age = { type = "int", upper = 90, nullable = false }',
     "tables.adult.columns.age.lower", ("give both lower and upper",)),
    ("lower above upper", AGE, AGE.replace("lower = 17, upper = 90", "lower = 90, upper = 17"),
     "tables.adult.columns.age.lower", ("must not exceed upper",)),
    ("bounds on text", 'sex = { type = "text", ',
     'sex = { type = "text", lower = 0, upper = 1, ', "tables.adult.columns.sex.lower",
     ("int and float columns",)),
    ("bad type name", AGE, AGE.replace('"int"', '"integer"'), "tables.adult.columns.age.type",
     ("'int', 'float', 'text', 'date', 'bool'", "'integer'")),
    ("public value of the wrong type", SEX_VALUES, 'public_values = ["Female", 3]',
     "tables.adult.columns.sex.public_values", ("item 1", "text value")),
    ("bool public value of a float column",
     'amount = { type = "float", lower = 0, upper = 500, nullable = false }',
     'amount = { type = "float", public_values = [1.5, true] }',
     "tables.visits.columns.amount.public_values", ("item 1", "float value")),
    ("duplicate public values", SEX_VALUES, 'public_values = ["Female", "Female"]',
     "tables.adult.columns.sex.public_values", ("distinct",)),
    ("empty public values", SEX_VALUES, "public_values = []",
     "tables.adult.columns.sex.public_values", ("at least one value",)),
    ("public values not an array", SEX_VALUES, 'public_values = "Female"',
     "tables.adult.columns.sex.public_values", ("expected an array",)),
    ("privacy unit not a column", ADULT_UNIT, ADULT_UNIT.replace('"person_id"', '"pid"'),
     "tables.adult.privacy_unit", ("'pid'", "not a declared column", "person_id, age")),
    ("max_rows_per_unit = 0", ADULT_UNIT,
     ADULT_UNIT.replace("rows_per_unit = 1", "rows_per_unit = 0"),
     "tables.adult.max_rows_per_unit", ("positive integer",)),
    ("max_groups_per_unit a float", ADULT_UNIT,
     ADULT_UNIT.replace("groups_per_unit = 1", "groups_per_unit = 1.5"),
     "tables.adult.max_groups_per_unit", ("expected an integer",)),
    ("unknown table field", "max_groups_per_unit = 4",
     "max_group_per_unit = 4", "tables.visits.max_group_per_unit",
     ("unknown field", "max_groups_per_unit")),
    ("column spec not a table", 'person_id = { type = "int", nullable = false }\nage',
     'person_id = "int"\nage', "tables.adult.columns.person_id", ("expected a table",)),
    ("public table with a privacy unit", PUBLIC_TABLE,
     PUBLIC_TABLE + 'privacy_unit = "occupation"\n',
     ("tables.occupation_groups.public", "tables.occupation_groups.privacy_unit"),
     ("privacy_unit",)),
    ("negative epsilon budget", ALICE_BUDGET, "budget = { epsilon = -1.0, delta = 1e-5 }",
     "analysts.alice.budget.epsilon", (">= 0",)),
    ("infinite epsilon budget", ALICE_BUDGET, "budget = { epsilon = inf, delta = 1e-5 }",
     "analysts.alice.budget.epsilon", ("finite",)),
    ("delta of 1", ALICE_BUDGET, "budget = { epsilon = 10.0, delta = 1.0 }",
     "analysts.alice.budget.delta", ("< 1",)),
    ("budget field typo", ALICE_BUDGET, "budget = { epsilon = 10.0, delta = 1e-5, epsilom = 1 }",
     "analysts.alice.budget.epsilom", ("unknown field", "delta, epsilon")),
    ("granted an unknown table", ALICE_TABLES, 'tables = ["adult", "visitz"]',
     "analysts.alice.tables", ("'visitz'", "adult, visits, occupation_groups")),
    ("private tables but no budget", ALICE_BUDGET + "\n", "", "analysts.alice.budget",
     ("budget = { epsilon",)),
    ("plain password", 'password_scram = "SCRAM', 'password_scram = "hunter2" # "SCRAM',
     "analysts.alice.password_scram", ("SCRAM-SHA-256 verifier",)),
    ("bad role", 'role = "admin"', 'role = "root"', "analysts.admin.role",
     ("'analyst', 'admin'", "'root'")),
    ("bad mechanism", 'mechanism = "laplace"', 'mechanism = "exponential"',
     "privacy.mechanism", ("'laplace', 'gaussian'", "'exponential'")),
    ("bad accounting", 'accounting = "basic"', 'accounting = "rdp"', "privacy.accounting",
     ("'basic', 'zcdp'", "'rdp'")),
    ("boolean for a number", "default_epsilon = 0.1", "default_epsilon = true",
     "privacy.default_epsilon", ("expected a number", "boolean")),
    ("boolean for an integer", ADULT_UNIT,
     ADULT_UNIT.replace("rows_per_unit = 1", "rows_per_unit = true"),
     "tables.adult.max_rows_per_unit", ("expected an integer", "boolean")),
    ("string for a bound", AGE, AGE.replace("lower = 17", 'lower = "17"'),
     "tables.adult.columns.age.lower", ("expected a number",)),
    ("NaN bound", AGE, AGE.replace("lower = 17", "lower = nan"),
     "tables.adult.columns.age.lower", ("finite",)),
    ("confidence of 1", "confidence = 0.95", "confidence = 1.0", "privacy.confidence", ("< 1",)),
    ("default epsilon of 0", "default_epsilon = 0.1", "default_epsilon = 0",
     "privacy.default_epsilon", ("> 0",)),
    ("bad backend kind", 'kind = "duckdb"', 'kind = "sqlite"', "backend.kind",
     ("'duckdb', 'postgres'", "'sqlite'")),
    ("duckdb without path", BACKEND, 'kind = "duckdb"\n', "backend.path",
     ('path = "file.duckdb"',)),
    ("postgres without dsn", BACKEND, 'kind = "postgres"\n', "backend.dsn", ("dsn = ",)),
    ("work_mem without a unit", 'kind = "duckdb"', 'kind = "duckdb"\nwork_mem = "64"',
     "backend.work_mem", ('"32MB"', "kB, MB or GB", "'64'")),
    ("work_mem with an option smuggled in", 'kind = "duckdb"',
     'kind = "duckdb"\nwork_mem = "64MB -c default_transaction_read_only=off"',
     "backend.work_mem", ("expected PostgreSQL memory",)),
    ("port out of range", "port = 6432", "port = 70000", "server.port", ("65535",)),
    ("tls cert without key", "port = 6432", 'port = 6432\ntls_cert = "c.pem"',
     "server.tls_key", ("give both tls_cert and tls_key",)),
]


@pytest.mark.parametrize(("old", "new", "field", "allowed"),
                         [pytest.param(*case[1:], id=case[0]) for case in BROKEN])
def test_broken_policy_names_file_field_and_what_is_allowed(
        tmp_path: Path, old: str, new: str, field: str | tuple[str, ...],
        allowed: tuple[str, ...]) -> None:
    path = write_variant(tmp_path, old, new)
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    fields = (field,) if isinstance(field, str) else field
    assert any(f": {f}: " in message for f in fields), message
    for words in allowed:
        assert words in message, message
    assert info.value.sqlstate == "F0000"


def test_there_are_at_least_twenty_broken_policies() -> None:
    assert len(BROKEN) >= 20
    assert len({case[0] for case in BROKEN}) == len(BROKEN)


def test_invalid_toml_says_so_with_the_line(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "[tables.visits]\n", "[tables.visits\n")
    line = DEMO_TEXT.splitlines().index("[tables.visits]") + 1
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML")
    assert f"line {line}" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.toml"
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert str(path) in str(info.value)
    assert "no such policy file" in str(info.value)


def test_valid_variants_load(tmp_path: Path) -> None:
    """The rules do not reject what is allowed: postgres with a dsn, equal bounds, no budget
    for an analyst granted only a public table, a private table's total budget."""
    text = DEMO_TEXT.replace(BACKEND, 'kind = "postgres"\ndsn = "postgresql://db/demo"\n')
    text = text.replace(AGE, 'age = { type = "int", lower = 40, upper = 40 }')
    text = text.replace("max_rows_per_unit = 10\n",
                        "max_rows_per_unit = 10\ntotal_budget = { epsilon = 20.0 }\n")
    text += '\n[analysts.bob]\ntables = ["occupation_groups"]\n'
    path = tmp_path / "ok.toml"
    path.write_text(text)
    policy = load_policy(path)
    assert policy.backend.kind == "postgres"
    assert policy.backend.dsn == "postgresql://db/demo"
    assert policy.backend.path is None
    assert (policy.tables["adult"].columns["age"].lower,
            policy.tables["adult"].columns["age"].upper) == (40, 40)
    visits_total = policy.tables["visits"].total_budget
    assert visits_total is not None and (visits_total.epsilon, visits_total.delta) == (20.0, 0.0)
    bob = policy.analyst("bob")
    assert bob.budget is None and bob.tables == ("occupation_groups",)


def test_relative_paths_resolve_against_the_policy_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    text = DEMO_TEXT.replace('path = "../data/demo.ledger.sqlite"', 'path = "state/l.sqlite"')
    text = text.replace('path = "../data/demo.audit.jsonl"', 'path = "audit.jsonl"')
    text = text.replace("port = 6432", 'port = 6432\ntls_cert = "tls/c.pem"\ntls_key = "k.pem"')
    (folder / "p.toml").write_text(text)
    monkeypatch.chdir(elsewhere)
    policy = load_policy(Path("..") / "conf" / "p.toml")
    assert policy.backend.path == (tmp_path / "data" / "demo.duckdb").resolve()
    assert policy.ledger_path == (folder / "state" / "l.sqlite").resolve()
    assert policy.audit_log_path == (folder / "audit.jsonl").resolve()
    assert policy.server.tls_cert == (folder / "tls" / "c.pem").resolve()
    assert policy.server.tls_key == (folder / "k.pem").resolve()


def test_default_ledger_and_audit_paths_sit_next_to_the_policy(tmp_path: Path) -> None:
    text = DEMO_TEXT.replace('[ledger]\npath = "../data/demo.ledger.sqlite"\n', "")
    text = text.replace('[audit]\npath = "../data/demo.audit.jsonl"\n', "")
    path = tmp_path / "mine.toml"
    path.write_text(text)
    policy = load_policy(path)
    assert policy.ledger_path == (tmp_path / "mine.ledger.sqlite").resolve()
    assert policy.audit_log_path == (tmp_path / "mine.audit.jsonl").resolve()


# -- known bugs ---------------------------------------------------------------------------------

def test_non_string_granted_table_is_invalid_policy(tmp_path: Path) -> None:
    path = write_variant(tmp_path, ALICE_TABLES, 'tables = ["adult", ["visits"]]')
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert ": analysts.alice.tables: " in str(info.value)


def test_date_public_value_must_be_a_date(tmp_path: Path) -> None:
    path = write_variant(tmp_path, 'day = { type = "date", nullable = false }',
                         'day = { type = "date", public_values = ["2024-13-45"] }')
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert ": tables.visits.columns.day.public_values: " in str(info.value)


def test_native_toml_date_is_a_date_public_value(tmp_path: Path) -> None:
    path = write_variant(tmp_path, 'day = { type = "date", nullable = false }',
                         'day = { type = "date", public_values = [2024-01-01, 2024-01-02] }')
    values = load_policy(path).tables["visits"].columns["day"].public_values
    assert values is not None
    assert [str(v) for v in values] == ["2024-01-01", "2024-01-02"]
    assert all(isinstance(v, str | dt.date) for v in values)


def test_malformed_scram_verifier_is_rejected_at_load(tmp_path: Path) -> None:
    path = write_variant(tmp_path, 'password_scram = "SCRAM',
                         'password_scram = "SCRAM-SHA-256$4096:notbase64" # "SCRAM')
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert ": analysts.alice.password_scram: " in str(info.value)


def test_non_utf8_file_is_invalid_policy(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(DEMO_TEXT.replace('database = "demo"', 'database = "d\xe9mo"')
                     .encode("latin-1"))
    with pytest.raises(Error) as info:
        load_policy(path)
    assert isinstance(info.value, InvalidPolicy)
    assert str(path) in str(info.value)
