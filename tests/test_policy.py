"""Policy files: the bundled demo policy, and validation that names file, field and what is
allowed (SPEC §3). Broken policies are the demo policy with one snippet changed, written to
tmp_path; nothing here opens a database or a ledger."""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path

import pytest

from dpproxy.errors import Error, InvalidAuthorization, InvalidPolicy
from dpproxy.policy import check_policy, load_policy
from dpproxy.policy_lines import key_positions

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
DAY = 'day = { type = "date", lower = 2024-01-01, upper = 2024-12-31, nullable = false }'
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
    with pytest.raises(InvalidAuthorization) as info:
        policy.analyst("mallory")
    text = str(info.value)
    assert "mallory" in text and "admin, alice" in text and info.value.sqlstate == "28000"


# -- validation: one broken policy per rule -----------------------------------------------------

# (id, snippet of the demo policy, its replacement, dotted field(s) named, words of the fix)
BROKEN: list[tuple[str, str, str, str | tuple[str, ...], tuple[str, ...]]] = [
    ("unknown top-level key", 'database = "demo"', 'database = "demo"\ncolour = "blue"',
     "colour", ("unknown field", "analysts, audit, backend, database")),
    ("column field typo", AGE, AGE.replace("upper", "uper"), "tables.adult.columns.age.uper",
     ("unknown field",
      "lower, nullable, public, public_range, public_values, type, unique, upper")),
    ("lower without upper", AGE, 'age = { type = "int", lower = 17, nullable = false }',
     "tables.adult.columns.age.upper", ("give both lower and upper",)),
    ("upper without lower", AGE, 'age = { type = "int", upper = 90, nullable = false }',
     "tables.adult.columns.age.lower", ("give both lower and upper",)),
    ("lower above upper", AGE, AGE.replace("lower = 17, upper = 90", "lower = 90, upper = 17"),
     "tables.adult.columns.age.lower", ("must not exceed upper",)),
    ("bounds on text", 'sex = { type = "text", ',
     'sex = { type = "text", lower = 0, upper = 1, ', "tables.adult.columns.sex.lower",
     ("int, float and date columns",)),
    ("date bound not a date", DAY, DAY.replace("lower = 2024-01-01", 'lower = "June"'),
     "tables.visits.columns.day.lower", ("'June' is not a date",)),
    ("date bounds reversed", DAY, DAY.replace("lower = 2024-01-01, upper = 2024-12-31",
                                              'lower = 2024-12-31, upper = "2024-01-01"'),
     "tables.visits.columns.day.lower", ("lower (2024-12-31) must not exceed upper "
                                         "(2024-01-01)",)),
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
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", message), message  # file:line:col:
    fields = (field,) if isinstance(field, str) else field
    assert any(f": {f}: " in message for f in fields), message
    for words in allowed:
        assert words in message, message
    assert info.value.sqlstate == "F0000"


def test_there_are_at_least_twenty_broken_policies() -> None:
    assert len(BROKEN) >= 20
    assert len({case[0] for case in BROKEN}) == len(BROKEN)


def position_of(text: str, marker: str) -> str:
    """'line:column' (1-based) of the one occurrence of `marker` in `text`."""
    assert text.count(marker) == 1, f"marker not unique: {marker!r}"
    at = text.index(marker)
    line_start = text.rfind("\n", 0, at) + 1
    return f"{text.count(chr(10), 0, at) + 1}:{at - line_start + 1}"


# (id, snippet of the demo policy, its replacement, where the error points, dotted field)
LOCATED: list[tuple[str, str, str, str, str]] = [
    ("top-level key", 'database = "demo"', 'database = "demo"\ncolour = "blue"', "colour",
     "colour"),
    ("key of a section", 'mechanism = "laplace"', 'mechanism = "laplce"',
     'mechanism = "laplce"', "privacy.mechanism"),
    ("key inside an inline table", AGE, AGE.replace("upper", "uper"), "uper = 90",
     "tables.adult.columns.age.uper"),
    ("later key of an inline table", AGE,
     AGE.replace("lower = 17, upper = 90", "lower = 90, upper = 17"), "lower = 90",
     "tables.adult.columns.age.lower"),
    ("absent key: the inline table it belongs in", AGE,
     'age = { type = "int", lower = 17, nullable = false }', 'age = { type = "int", lower = 17,',
     "tables.adult.columns.age.upper"),
    ("absent key: the section it belongs in", BACKEND, 'kind = "duckdb"\n', "backend]",
     "backend.path"),
    ("item of an array", ALICE_TABLES, 'tables = ["adult", "visitz"]', '"visitz"',
     "analysts.alice.tables"),
    ("item of a multi-line array", '"Sales", "Craft-repair"', '"Sales", 42, "Craft-repair"',
     "42,", "tables.adult.columns.occupation.public_values"),
    ("dotted key", ALICE_BUDGET, "budget.epsilon = -1.0\nbudget.delta = 1e-5", "epsilon = -1.0",
     "analysts.alice.budget.epsilon"),
    ("table header with a quoted name", "[tables.visits]\n",
     '[tables."visits"]\nmembership = "secret"\n', 'membership = "secret"',
     "tables.visits.membership"),
    ("check across a table's columns", 'person_id = { type = "int", nullable = false }\nage',
     'person_id = { type = "int", unique = true }\nage', "unique = true }\nage",
     "tables.adult.columns.person_id.unique"),
    ("key of the server section", "port = 6432", "port = 70000", "port = 70000", "server.port"),
]


@pytest.mark.parametrize(("old", "new", "marker", "field"),
                         [pytest.param(*case[1:], id=case[0]) for case in LOCATED])
def test_error_names_the_line_and_column_of_the_key(tmp_path: Path, old: str, new: str,
                                                    marker: str, field: str) -> None:
    path = write_variant(tmp_path, old, new)
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    where = position_of(path.read_text(encoding="utf-8"), marker)
    assert info.value.message.startswith(f"{path}:{where}: {field}: "), info.value.message
    assert info.value.sqlstate == "F0000"


def test_check_policy_lists_independent_errors_in_file_order(tmp_path: Path) -> None:
    text = DEMO_TEXT
    for old, new in [('mechanism = "laplace"', 'mechanism = "laplce"'),
                     (AGE, AGE.replace("upper", "uper")),
                     ('sex = { type = "text", ', 'sex = { type = "txt", '),
                     (ALICE_TABLES, 'tables = ["adult", "visitz"]'),
                     ("port = 6432", "port = 70000")]:
        text = text.replace(old, new, 1)
    path = tmp_path / "broken.toml"
    path.write_text(text, encoding="utf-8")
    policy, problems = check_policy(path)
    assert policy is None
    # two columns of one table each report their error; alice, granted that table, hers
    assert [p.message.split(": ")[1] for p in problems] == [
        "server.port", "privacy.mechanism", "tables.adult.columns.age.uper",
        "tables.adult.columns.sex.type", "analysts.alice.tables"]
    lines = [int(p.message.split(":")[1]) for p in problems]
    assert lines == sorted(lines)
    assert all(type(p) is InvalidPolicy and p.sqlstate == "F0000" for p in problems)
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert info.value.message == problems[0].message


def test_check_policy_leaves_out_errors_that_follow_from_another(tmp_path: Path) -> None:
    """A column that does not validate: its table's privacy_unit names it, and alice is
    granted the table, but neither is reported as a second error."""
    path = write_variant(tmp_path, 'person_id = { type = "int", nullable = false }\nage',
                         'person_id = "int"\nage')
    policy, problems = check_policy(path)
    assert policy is None
    assert [p.message.split(": ", 1)[1] for p in problems] == [
        "tables.adult.columns.person_id: expected a table such as "
        '{ type = "int", lower = 0, upper = 100 }']


def test_check_policy_of_a_valid_file() -> None:
    policy, problems = check_policy(DEMO_POLICY)
    assert problems == []
    assert policy is not None and policy == load_policy(DEMO_POLICY)


# -- where keys are written (dpproxy.policy_lines) ----------------------------------------------

def test_key_positions_of_headers_and_dotted_quoted_and_inline_keys() -> None:
    text = ('# a comment with [brackets] and key = "value"\n'
            'title = "a # not a comment" # a comment\n'
            '[tables."my.table"]   # a quoted name with a dot\n'
            "a . b = 1\n"
            "[ tables . 'my.table' . columns ]\n"
            'age = { type = "int", bounds = { lower = 0 }, "odd\\u0020key" = 1 }\n')
    positions = key_positions(text)
    assert positions[("title",)] == (2, 1)
    assert positions[("tables",)] == (3, 2)
    assert positions[("tables", "my.table")] == (3, 9)
    assert positions[("tables", "my.table", "a")] == (4, 1)
    assert positions[("tables", "my.table", "a", "b")] == (4, 5)
    assert positions[("tables", "my.table", "columns")] == (5, 25)
    age = ("tables", "my.table", "columns", "age")
    assert positions[age] == (6, 1)
    assert positions[(*age, "type")] == (6, 9)
    assert positions[(*age, "bounds", "lower")] == (6, 34)
    assert positions[(*age, "odd key")] == (6, 47)


def test_key_positions_of_array_items_and_arrays_of_tables() -> None:
    text = ("values = [\n"
            '    "a", # the first\n'
            "    [1, 2],\n"
            '    { k = "}" },\n'
            "]\n"
            "[[server]]\n"
            'name = "one"\n'
            "[[server]]\n"
            'name = "two"\n'
            "[server.tls]\n"
            'cert = "c.pem"\n')
    positions = key_positions(text)
    assert positions[("values", 0)] == (2, 5)
    assert positions[("values", 1, 1)] == (3, 9)
    assert positions[("values", 2, "k")] == (4, 7)
    assert positions[("server",)] == (6, 3)
    assert positions[("server", 0, "name")] == (7, 1)
    assert positions[("server", 1)] == (8, 3)
    assert positions[("server", 1, "name")] == (9, 1)
    assert positions[("server", 1, "tls")] == (10, 9)
    assert positions[("server", 1, "tls", "cert")] == (11, 1)


def test_key_positions_skip_strings_that_look_like_keys() -> None:
    text = ('a = """\nb = 1\n[c]\n""""\r\n'  # a multi-line string, then CRLF line ends
            "d = '''x = ['''\r\n"
            'e = "say \\"f = 1\\" [g]"\r\n'
            "h = 1979-05-27 07:32:00Z # a date with a space\r\n"
            "[i]\r\n")
    assert key_positions(text) == {("a",): (1, 1), ("d",): (5, 1), ("e",): (6, 1),
                                   ("h",): (7, 1), ("i",): (8, 2)}


def test_key_positions_a_table_is_where_its_header_is() -> None:
    """`[t.c]` passes through t; `[t]` below is where t's keys are written."""
    positions = key_positions("[t.c]\nx = 1\n[t]\ny = 2\n")
    assert positions[("t",)] == (3, 2)
    assert positions[("t", "c")] == (1, 4)


def test_key_positions_every_demo_key_is_where_the_text_has_it() -> None:
    positions = key_positions(DEMO_TEXT)
    document = tomllib.loads(DEMO_TEXT)
    lines = DEMO_TEXT.splitlines()
    assert positions[("tables", "adult", "columns", "age", "upper")] == (39, 35)
    for path, (line, column) in positions.items():
        written = lines[line - 1][column - 1:]
        if isinstance(path[-1], str):
            assert written.startswith(path[-1]), (path, written)
        else:  # an item of an array: all the demo's arrays hold strings
            value: object = document
            for key in path:
                value = value[key]  # type: ignore[index]
            assert written.startswith(f'"{value}"'), (path, written)


def test_key_positions_give_nothing_for_text_tomllib_rejects() -> None:
    assert key_positions("[a]\nb = 1\n") == {("a",): (1, 2), ("a", "b"): (2, 1)}
    assert key_positions("[a\nb = 1\n") == {}


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
    path = write_variant(tmp_path, DAY,
                         'day = { type = "date", public_values = ["2024-13-45"] }')
    with pytest.raises(InvalidPolicy) as info:
        load_policy(path)
    assert ": tables.visits.columns.day.public_values: " in str(info.value)


def test_native_toml_date_is_a_date_public_value(tmp_path: Path) -> None:
    path = write_variant(tmp_path, DAY,
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
