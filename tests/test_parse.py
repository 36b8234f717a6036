"""Parse: splitting a string into statements, classifying each, binding parameters as AST
literals (never by editing SQL text), and syntax errors with SQLSTATE 42601 and a position."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from dpproxy import errors
from dpproxy.parse import parse_statements, split_statements, to_literal, tokenize

QUERY = "SELECT COUNT(*) FROM adult WHERE occupation = %s"


def one(sql: str, params: Any = None) -> Any:
    statements = parse_statements(sql, params)
    assert len(statements) == 1
    return statements[0]


def bound_sql(sql: str, params: Any) -> str:
    statement = one(sql, params)
    assert statement.ast is not None
    return statement.ast.sql("postgres")


# -- classification of session statements -------------------------------------------------------

@pytest.mark.parametrize(("sql", "kind", "tag"), [
    ("SET dpproxy.epsilon = 0.5", "set", "SET"),
    ("SET search_path TO public", "set", "SET"),
    ("RESET ALL", "reset", "RESET"),
    ("RESET dpproxy.epsilon", "reset", "RESET"),
    ("SHOW dpproxy.budget", "show", "SHOW"),
    ("BEGIN", "transaction", "BEGIN"),
    ("begin", "transaction", "BEGIN"),
    ("START TRANSACTION", "transaction", "START TRANSACTION"),
    ("START TRANSACTION ISOLATION LEVEL READ ONLY", "transaction", "START TRANSACTION"),
    ("COMMIT", "transaction", "COMMIT"),
    ("END", "transaction", "COMMIT"),
    ("ROLLBACK", "transaction", "ROLLBACK"),
    ("ABORT", "transaction", "ROLLBACK"),
    ("SAVEPOINT sp1", "noop", None),
    ("RELEASE SAVEPOINT sp1", "noop", None),
    ("CLOSE ALL", "noop", None),
    ("UNLISTEN *", "noop", None),
    ("DISCARD ALL", "noop", "DISCARD ALL"),
    ("DEALLOCATE ALL", "noop", "DEALLOCATE ALL"),
    ("SELECT pg_advisory_unlock_all()", "noop", "SELECT 1"),
    ("select PG_ADVISORY_UNLOCK_ALL()", "noop", "SELECT 1"),
])
def test_session_statements_are_classified(sql: str, kind: str, tag: str | None) -> None:
    statement = one(sql)
    assert statement.kind == kind
    assert statement.is_session_statement
    assert statement.text == sql
    if tag is not None:
        assert statement.tag == tag


@pytest.mark.parametrize(("sql", "tag"), [
    ("SAVEPOINT sp1", "SAVEPOINT"),
    ('SAVEPOINT "_pg3_1"', "SAVEPOINT"),
    ("RELEASE sp1", "RELEASE"),
    ("RELEASE SAVEPOINT sp1", "RELEASE"),
    ("UNLISTEN *", "UNLISTEN"),
    ("CLOSE ALL", "CLOSE CURSOR ALL"),
])
def test_noop_statement_tags_are_postgresql_command_tags(sql: str, tag: str) -> None:
    assert one(sql).tag == tag


def test_set_statement_name_and_value() -> None:
    statement = one("SET dpproxy.epsilon = 0.5")
    assert (statement.name, statement.value) == ("dpproxy.epsilon", 0.5)
    statement = one("SET dpproxy.delta TO 1e-6")
    assert (statement.name, statement.value) == ("dpproxy.delta", 1e-6)
    statement = one("SET dpproxy.mechanism = 'gaussian'")
    assert (statement.name, statement.value) == ("dpproxy.mechanism", "gaussian")
    statement = one("SET dpproxy.epsilon = -1")
    assert statement.value == -1
    assert one('SHOW "DpProxy.Epsilon"').name == "dpproxy.epsilon"
    assert one("RESET ALL").name == "all"


def test_query_and_explain_are_not_session_statements() -> None:
    query = one("SELECT COUNT(*) FROM adult")
    assert query.kind == "select" and not query.is_session_statement
    assert isinstance(query.ast, exp.Select)
    explain = one("EXPLAIN SELECT COUNT(*) FROM adult")
    assert explain.kind == "explain" and not explain.is_session_statement
    assert explain.ast is not None
    assert explain.ast.sql("postgres") == "SELECT COUNT(*) FROM adult"
    verbose = one("EXPLAIN VERBOSE SELECT COUNT(*) FROM adult")
    assert verbose.kind == "explain"
    assert verbose.ast is not None and verbose.ast.sql("postgres") == "SELECT COUNT(*) FROM adult"


@pytest.mark.parametrize(("sql", "explain_format"), [
    ("EXPLAIN (FORMAT JSON) SELECT COUNT(*) FROM adult", "json"),
    # pgAdmin's options
    ("EXPLAIN (FORMAT JSON, ANALYZE false, VERBOSE false, COSTS true, BUFFERS false, "
     "TIMING false, SUMMARY false) SELECT COUNT(*) FROM adult", "json"),
    ("EXPLAIN (costs off, verbose) SELECT COUNT(*) FROM adult", "text"),
    ("EXPLAIN (FORMAT TEXT) VERBOSE SELECT COUNT(*) FROM adult", "text"),
])
def test_explain_options(sql: str, explain_format: str) -> None:
    explain = one(sql)
    assert explain.kind == "explain" and explain.explain_format == explain_format
    assert explain.ast is not None and explain.ast.sql("postgres") == "SELECT COUNT(*) FROM adult"


@pytest.mark.parametrize(("sql", "sqlstate"), [
    ("EXPLAIN (ANALYZE) SELECT 1", "0A000"), ("EXPLAIN (ANALYZE on) SELECT 1", "0A000"),
    ("EXPLAIN (FORMAT XML) SELECT 1", "0A000"), ("EXPLAIN (FORMAT) SELECT 1", "0A000"),
    ("EXPLAIN (FOO) SELECT 1", "42601"), ("EXPLAIN (COSTS maybe) SELECT 1", "42601"),
    ("EXPLAIN (COSTS", "42601"), ("EXPLAIN (COSTS) ", "42601"),
])
def test_explain_options_refused(sql: str, sqlstate: str) -> None:
    with pytest.raises(errors.Error) as info:
        parse_statements(sql)
    assert info.value.sqlstate == sqlstate


def test_explain_analyze_is_not_supported() -> None:
    with pytest.raises(errors.NotSupportedError) as info:
        parse_statements("EXPLAIN ANALYZE SELECT COUNT(*) FROM adult")
    assert info.value.sqlstate == "0A000"


@pytest.mark.parametrize("sql", ["INSERT INTO adult VALUES (1)", "UPDATE adult SET age = 1",
                                 "DELETE FROM adult", "DROP TABLE adult",
                                 "CREATE TABLE t (a INT)", "COPY adult TO STDOUT"])
def test_writes_are_refused_as_privacy_violations(sql: str) -> None:
    with pytest.raises(errors.PrivacyViolation) as info:
        parse_statements(sql)
    assert info.value.sqlstate == "42501"


# -- splitting -----------------------------------------------------------------------------------

def test_semicolons_inside_literals_and_comments_do_not_split() -> None:
    sql = ("SET application_name = 'a;b'; SELECT COUNT(*) FROM adult WHERE sex = 'x;y' "
           "/* ; */ -- ;\n; SHOW x")
    statements = parse_statements(sql)
    assert [s.kind for s in statements] == ["set", "select", "show"]
    assert statements[0].value == "a;b"
    assert statements[1].text == "SELECT COUNT(*) FROM adult WHERE sex = 'x;y'"
    assert statements[2].name == "x"
    assert [s.kind for s in parse_statements("SELECT $$a;b$$; BEGIN")] == ["select",
                                                                             "transaction"]


def test_split_offsets_point_into_the_string() -> None:
    sql = "  BEGIN ;SELECT 'a;b'  ;\n COMMIT;"
    pieces = split_statements(sql)
    assert [text for text, _, _ in pieces] == ["BEGIN", "SELECT 'a;b'", "COMMIT"]
    for text, tokens, offset in pieces:
        assert sql[offset:offset + len(text)] == text
        assert tokens[0].start == 0  # tokens are relative to their own statement


def test_pool_reset_string_is_all_session_statements() -> None:
    sql = "SELECT pg_advisory_unlock_all();\nCLOSE ALL;\nUNLISTEN *;\nRESET ALL;"
    statements = parse_statements(sql)
    assert [s.kind for s in statements] == ["noop", "noop", "noop", "reset"]
    assert all(s.is_session_statement for s in statements)


def test_trailing_semicolon_is_fine() -> None:
    assert [s.kind for s in parse_statements("SELECT COUNT(*) FROM adult;")] == ["select"]
    assert [s.kind for s in parse_statements("BEGIN;;  ;")] == ["transaction"]


@pytest.mark.parametrize("sql", ["", "   ", ";", " ; ;\n", "-- only a comment"])
def test_empty_string_is_a_syntax_error(sql: str) -> None:
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements(sql)
    assert info.value.sqlstate == "42601"


# -- parameters ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "literal"), [
    ("Sales", "'Sales'"),
    ("O'Brien", "'O''Brien'"),
    ("x' OR 1=1 --", "'x'' OR 1=1 --'"),
    (None, "NULL"),
    (True, "TRUE"),
    (False, "FALSE"),
    (42, "42"),
    (-5, "-5"),
    (-2.5, "-2.5"),
    (decimal.Decimal("-1.25"), "-1.25"),
    (dt.date(2024, 1, 2), "CAST('2024-01-02' AS DATE)"),
    (dt.datetime(2024, 1, 2, 3, 4, 5), "CAST('2024-01-02 03:04:05' AS TIMESTAMP)"),
])
def test_positional_parameter_becomes_a_literal(value: Any, literal: str) -> None:
    assert bound_sql(QUERY, [value]) == (
        f"SELECT COUNT(*) FROM adult WHERE occupation = {literal}")
    assert bound_sql(QUERY, (value,)) == bound_sql(QUERY, [value])


def test_named_and_numbered_parameters() -> None:
    assert bound_sql("SELECT COUNT(*) FROM adult WHERE occupation = %(occ)s AND age > %(age)s "
                     "AND sex <> %(occ)s", {"occ": "Sales", "age": 40}) == (
        "SELECT COUNT(*) FROM adult WHERE occupation = 'Sales' AND age > 40 AND sex <> 'Sales'")
    assert bound_sql("SELECT COUNT(*) FROM adult WHERE age > $2 AND occupation = $1",
                     ["Sales", 40]) == (
        "SELECT COUNT(*) FROM adult WHERE age > 40 AND occupation = 'Sales'")


def test_parameters_bind_inside_explain_and_after_session_statements() -> None:
    statements = parse_statements("SET dpproxy.epsilon = 1; EXPLAIN SELECT COUNT(*) FROM adult "
                                  "WHERE age > %s", [30])
    assert [s.kind for s in statements] == ["set", "explain"]
    assert statements[1].ast is not None
    assert statements[1].ast.sql("postgres") == "SELECT COUNT(*) FROM adult WHERE age > 30"


@pytest.mark.parametrize("value", [
    "x' OR 1=1 --", "a\\'; DROP TABLE adult; --", "'); SELECT * FROM adult; --", "%s", "$1",
    "é\n\t\"", "", -7, 1e300, -1e-300, 10**30, True, None, dt.date(2020, 2, 29),
    pytest.param(float("inf")),
    pytest.param(float("-inf")),
])
def test_a_parameter_is_never_parsed_as_sql(value: Any) -> None:
    """Whatever the value, the bound tree has exactly the query's own structure: one WHERE
    comparison whose right side is the value, and its SQL reads back as the same tree."""
    if isinstance(value, float) and math.isinf(value):
        try:
            statement = one("SELECT COUNT(*) FROM adult WHERE age = %s", [value])
        except errors.ProgrammingError:
            return  # refusing an infinity is fine; reading it as SQL is not
    else:
        statement = one("SELECT COUNT(*) FROM adult WHERE age = %s", [value])
    bound = statement.ast
    assert bound is not None
    assert [c.name for c in bound.find_all(exp.Column)] == ["age"]
    assert bound.find(exp.Or, exp.Command, exp.Drop, exp.Union) is None
    assert len(list(bound.find_all(exp.Select))) == 1
    where = bound.args["where"].this
    assert isinstance(where, exp.EQ)
    assert sqlglot.parse_one(bound.sql("postgres"), read="postgres") == bound
    if isinstance(value, str):
        assert isinstance(where.expression, exp.Literal) and where.expression.is_string
        assert where.expression.this == value


def test_placeholder_text_inside_a_value_or_a_literal_is_not_a_placeholder() -> None:
    assert bound_sql("SELECT COUNT(*) FROM adult WHERE occupation = %s AND sex = %s",
                     ["%s", "x"]) == (
        "SELECT COUNT(*) FROM adult WHERE occupation = '%s' AND sex = 'x'")
    assert bound_sql("SELECT COUNT(*) FROM adult WHERE occupation = '%s'", None) == (
        "SELECT COUNT(*) FROM adult WHERE occupation = '%s'")


@pytest.mark.parametrize(("sql", "params"), [
    (QUERY, []),
    (QUERY, ["a", "b"]),
    (QUERY, None),
    (QUERY, {"occ": "Sales"}),
    ("SELECT COUNT(*) FROM adult", ["a"]),
    ("SELECT COUNT(*) FROM adult", {"a": 1}),
    ("SELECT COUNT(*) FROM adult WHERE occupation = %(occ)s", {"job": "Sales"}),
    ("SELECT COUNT(*) FROM adult WHERE occupation = %(occ)s", ["Sales"]),
    ("SELECT COUNT(*) FROM adult WHERE occupation = $3", ["a", "b"]),
    ("SELECT COUNT(*) FROM adult WHERE occupation = $1", {"1": "a"}),
])
def test_wrong_parameters_are_programming_errors(sql: str, params: Any) -> None:
    with pytest.raises(errors.ProgrammingError):
        parse_statements(sql, params)


@pytest.mark.parametrize("value", [b"bytes", [[1]], {"a": 1}, object(), float("nan"),
                                   dt.time(12, 0), "lone \ud800 surrogate"])
def test_unsupported_parameter_types_are_programming_errors(value: Any) -> None:
    with pytest.raises(errors.ProgrammingError):
        parse_statements(QUERY, [value])
    with pytest.raises(errors.ProgrammingError):
        to_literal(value)


def test_to_literal_nodes() -> None:
    assert isinstance(to_literal(None), exp.Null)
    assert to_literal(10**400) == exp.Literal.number(10**400)  # an int is finite
    assert isinstance(to_literal(True), exp.Boolean) and to_literal(True).this is True
    negative = to_literal(-3)
    assert isinstance(negative, exp.Neg) and negative.this == exp.Literal.number(3)
    date = to_literal(dt.date(2024, 5, 6))
    assert isinstance(date, exp.Cast) and date.to.this == exp.DataType.Type.DATE
    assert date.this == exp.Literal.string("2024-05-06")
    text = to_literal("a'b")
    assert isinstance(text, exp.Literal) and text.is_string and text.this == "a'b"


def test_double_percent_is_a_literal_percent_with_pyformat_parameters() -> None:
    """pyformat is the DB-API's paramstyle, so its %% escape is undone there (on the wire,
    % has no special meaning)."""
    from dpproxy.dbapi import unescape_percent

    sql = unescape_percent("SELECT COUNT(*) FROM adult WHERE age %% 2 = %s")
    assert bound_sql(sql, [0]) == "SELECT COUNT(*) FROM adult WHERE age % 2 = 0"


# -- syntax errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(* FROM adult",
    "SELECT COUNT(*) FROM adult WHERE",
    "SELECT COUNT(*)\n  FROM adult GROUP BY sex HAVING",
    "SELECT )",
    "SELECT COUNT(*) FROM adult WHERE age IN (1, 2",
    "SELECT 1 FROM adult WHERE x = 1 2",
    "SET x = 1; SELECT COUNT(* FROM adult",
    "SELECT 1;\n\nSELECT COUNT(* FROM x",
])
def test_syntax_error_has_sqlstate_and_position_of_the_token(sql: str) -> None:
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements(sql)
    error = info.value
    assert error.sqlstate == "42601"
    assert isinstance(error, errors.ProgrammingError)
    match = re.search(r"at or near '(.+)'", error.message)
    assert match, error.message
    assert error.position is not None and 1 <= error.position <= len(sql)
    assert sql[error.position - 1:].startswith(match.group(1))


def test_syntax_error_position_counts_from_the_whole_string() -> None:
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements("BEGIN; SELECT COUNT(* FROM adult")
    assert info.value.position == len("BEGIN; SELECT COUNT(* ") + 1


def test_syntax_error_position_inside_explain() -> None:
    sql = "EXPLAIN SELECT COUNT(* FROM adult"
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements(sql)
    assert info.value.position == sql.index("FROM") + 1


def test_unterminated_string_has_a_position() -> None:
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements("SELECT COUNT(*) FROM adult WHERE sex = 'Male")
    assert info.value.sqlstate == "42601"
    assert info.value.position is not None


@pytest.mark.parametrize("sql", ["garbage", "garbage here", "FOO BAR"])
def test_garbage_is_a_syntax_error(sql: str) -> None:
    with pytest.raises(errors.SyntaxError) as info:
        parse_statements(sql)
    assert info.value.sqlstate == "42601"
    assert info.value.position == 1


def test_empty_show_and_explain_are_syntax_errors() -> None:
    for sql in ("SHOW", "EXPLAIN"):
        with pytest.raises(errors.SyntaxError):
            parse_statements(sql)


@pytest.mark.parametrize("params", [5, "ab", b"ab"])
def test_parameters_are_a_sequence_or_a_mapping(params: Any) -> None:
    """As psycopg: not a bare value, nor text (a TypeError escaped before)."""
    with pytest.raises(errors.ProgrammingError, match="sequence or a mapping"):
        parse_statements(QUERY, params)


@pytest.mark.parametrize(("sql", "words"), [
    ("SELECT COUNT(*) FROM adult WHERE age > 30 " + "AND age > 1 " * 6500, "tokens"),
    ("SELECT COUNT(*) FROM adult WHERE sex = '" + "x" * 200_001 + "'", "characters"),
])
def test_a_statement_too_long_to_parse_is_refused_before_parsing(sql: str, words: str
                                                                  ) -> None:
    """10,000 chained conditions took 2 s and 250 MB to parse before they were refused as
    nested too deeply, a 15 MB text 14 GB: the length is checked first (54000)."""
    with pytest.raises(errors.ProgramLimitExceeded, match=words):
        parse_statements(sql)
    # a long but ordinary statement (a BI tool's IN list of 3,000 values) still parses
    listed = ", ".join(str(i) for i in range(3000))
    assert parse_statements(f"SELECT COUNT(*) FROM adult WHERE age IN ({listed})")


def test_parameters_without_spaces_are_parameters_and_dollar_quotes_stay() -> None:
    """`$1,$2` was read as a dollar-quoted string's tag (`$1,$`) and failed to tokenize;
    `$$a,b$$` is still one string."""
    assert [t.text for t in tokenize("select $1,$2")] == ["select", "$", "1", ",", "$", "2"]
    assert [t.text for t in tokenize("select $$a,b$$")] == ["select", "a,b"]
    bound = parse_statements("SELECT COUNT(*) FROM adult WHERE age IN ($1,$2)", [30, 40])
    assert bound[0].ast is not None and bound[0].ast.sql() == \
        "SELECT COUNT(*) FROM adult WHERE age IN (30, 40)"
