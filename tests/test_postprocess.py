"""Post-processing of released values: `evaluate` follows PostgreSQL's semantics (NULLs,
three-valued logic, integer division, rounding), `output_name` PostgreSQL's column naming, and
`check_output_expression` refuses what the evaluator cannot compute (0A000) before anything is
charged."""

from __future__ import annotations

from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from dpproxy import errors
from dpproxy.postprocess import (
    AggregateRef,
    check_output_expression,
    evaluate,
    output_name,
    refer_to_aggregates,
)

AGGREGATES = {"COUNT(*)": 7, "SUM(x)": -7, "AVG(x)": 2.5, "SUM(y)": None}
KEYS = {"sex": "Male", "missing": None, "n": 3}


def item(sql: str) -> exp.Expression:
    return sqlglot.parse_one(f"SELECT {sql}", read="postgres").expressions[0]


def ev(sql: str) -> Any:
    return evaluate(item(sql), AGGREGATES, KEYS)


def same(value: Any, expected: Any) -> bool:
    """Equal and of the same Python type (3 and 3.0 are different answers here)."""
    return value == expected and type(value) is type(expected)


# -- evaluate ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "expected"), [
    ("NULL + 1", None), ("1 - NULL", None), ("NULL * 2", None), ("NULL / 0", None),
    ("-NULL", None), ("ABS(NULL)", None), ("ROUND(NULL)", None), ("SQRT(NULL)", None),
    ("FLOOR(NULL)", None), ("NULL % 2", None), ("POWER(NULL, 2)", None),
    ("SUM(y) + COUNT(*)", None), ("missing + 1", None),
    ("NULL = NULL", None), ("1 = NULL", None), ("NULL <> 1", None), ("NULL < 1", None),
    ("CAST(NULL AS INT)", None), ("CAST(SUM(y) AS TEXT)", None),
])
def test_null_propagates(sql: str, expected: Any) -> None:
    assert ev(sql) is expected


@pytest.mark.parametrize(("sql", "expected"), [
    ("TRUE AND TRUE", True), ("TRUE AND FALSE", False), ("TRUE AND NULL", None),
    ("NULL AND TRUE", None), ("FALSE AND NULL", False), ("NULL AND FALSE", False),
    ("NULL AND NULL", None),
    ("FALSE OR FALSE", False), ("TRUE OR NULL", True), ("NULL OR TRUE", True),
    ("FALSE OR NULL", None), ("NULL OR FALSE", None), ("NULL OR NULL", None),
    ("NOT TRUE", False), ("NOT FALSE", True), ("NOT NULL", None),
    ("NOT (COUNT(*) > 5 AND SUM(y) > 0)", None), ("COUNT(*) > 5 OR SUM(y) > 0", True),
    ("NULL IS NULL", True), ("1 IS NULL", False), ("SUM(y) IS NULL", True),
    ("missing IS NULL", True), ("sex IS NULL", False), ("NOT (1 IS NULL)", True),
])
def test_three_valued_logic(sql: str, expected: Any) -> None:
    assert ev(sql) is expected


@pytest.mark.parametrize(("sql", "expected"), [
    ("1 IS NOT NULL", True), ("NULL IS NOT NULL", False), ("SUM(y) IS NOT NULL", False),
    ("COUNT(*) IS NOT NULL", True), ("sex IS NOT NULL", True),
])
def test_is_not_null(sql: str, expected: bool) -> None:
    assert ev(sql) is expected


@pytest.mark.parametrize(("sql", "expected"), [
    ("7 / 2", 3), ("-7 / 2", -3), ("7 / -2", -3), ("-7 / -2", 3), ("1 / 3", 0), ("-1 / 3", 0),
    ("COUNT(*) / 2", 3), ("SUM(x) / 2", -3), ("SUM(x) / COUNT(*)", -1),
    ("7.0 / 2", 3.5), ("7 / 2.0", 3.5), ("AVG(x) / 2", 1.25), ("-7.0 / 2", -3.5),
    ("7 % 3", 1), ("-7 % 3", -1), ("7 % -3", 1), ("7.5 % 2", 1.5),
    ("2 + 3 * 4", 14), ("(2 + 3) * 4", 20), ("2 - 3 - 4", -5), ("-5", -5), ("1e3", 1000.0),
    ("ABS(SUM(x))", 7), ("ABS(-2.5)", 2.5), ("FLOOR(-2.5)", -3.0), ("CEIL(-2.5)", -2.0),
    ("FLOOR(3)", 3.0), ("SQRT(16)", 4.0), ("POWER(2, 10)", 1024.0), ("n * 2", 6),
])
def test_arithmetic_follows_postgresql(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected), ev(sql)


@pytest.mark.parametrize("sql", ["7 / 0", "7.5 / 0", "0 / 0", "COUNT(*) / (COUNT(*) - 7)",
                                 "7 % 0", "7.5 % 0.0", "SQRT(-1)", "POWER(0, -1)",
                                 "POWER(-8, 0.5)",
                                 # these raised Python exceptions after the charge (a review)
                                 "(COUNT(*) * 1e308 * 10) % 2", "COUNT(*) * 1" + "0" * 400
                                 + " * 1.5", "ROUND(COUNT(*), -1000000000)",
                                 "ROUND(AVG(x), -1000000)", "sex * 2", "sex + 1",
                                 "ROUND(COUNT(*) > 5)", "sex > 1"])
def test_undefined_arithmetic_gives_null_not_an_error(sql: str) -> None:
    assert ev(sql) is None


@pytest.mark.parametrize(("sql", "expected"), [
    ("ROUND(2.5)", 3.0), ("ROUND(-2.5)", -3.0), ("ROUND(0.5)", 1.0), ("ROUND(1.5)", 2.0),
    ("ROUND(-0.5)", -1.0), ("ROUND(2.4)", 2.0), ("ROUND(2.675, 2)", 2.68),
    ("ROUND(-0.125, 2)", -0.13), ("ROUND(1.23456, 3)", 1.235), ("ROUND(1234.5, -2)", 1200.0),
    ("ROUND(1250, -2)", 1300.0), ("ROUND(-1250, -2)", -1300.0), ("ROUND(7)", 7.0),
    ("ROUND(AVG(x))", 3.0), ("ROUND(-AVG(x))", -3.0),
])
def test_round_halves_away_from_zero(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected), ev(sql)


@pytest.mark.parametrize(("sql", "expected"), [
    ("TRUNC(2.789)", 2.0), ("TRUNC(-2.789)", -2.0), ("TRUNC(2.789, 1)", 2.7),
    ("TRUNC(-2.789, 2)", -2.78), ("TRUNC(0.29, 2)", 0.29), ("TRUNC(1299, -2)", 1200.0),
    ("TRUNC(-1299, -2)", -1200.0), ("TRUNC(7)", 7.0), ("TRUNC(AVG(x))", 2.0),
    ("TRUNC(NULL)", None), ("TRUNC(2.5, NULL)", None),
])
def test_trunc_goes_toward_zero(sql: str, expected: Any) -> None:
    """As PostgreSQL's NUMERIC trunc: toward zero, at the digit asked (0.29 stays 0.29,
    which a DOUBLE 0.29 · 100 would not)."""
    assert same(ev(sql), expected), ev(sql)


@pytest.mark.parametrize(("sql", "expected"), [
    ("ROUND(AVG(x) * 1e20, 10)", 2.5e20), ("TRUNC(AVG(x) * 1e20, 10)", 2.5e20),
    ("ROUND(AVG(x), 100000)", 2.5), ("TRUNC(-AVG(x), 400)", -2.5),
    ("ROUND(AVG(x) * 1e30, -30)", 3e30), ("TRUNC(AVG(x) * 1e30, -30)", 2e30),
    ("ROUND(AVG(x), -400)", 0.0), ("ROUND(99.99, 1)", 100.0),
])
def test_rounding_far_from_a_values_digits(sql: str, expected: Any) -> None:
    """Digits beyond a value's own leave it as it is, and a value of more digits than
    decimal's default precision is rounded all the same: both raised decimal's
    InvalidOperation, after the charge, before."""
    assert same(ev(sql), expected), ev(sql)


def test_round_with_null_digits_is_null() -> None:
    assert ev("ROUND(2.5, NULL)") is None


@pytest.mark.parametrize(("sql", "expected"), [
    ("CASE WHEN NULL THEN 1 ELSE 2 END", 2),
    ("CASE WHEN SUM(y) > 0 THEN 1 WHEN COUNT(*) > 5 THEN 2 END", 2),
    ("CASE WHEN 1 < 0 THEN 'a' END", None),
    ("CASE 2 WHEN 1 THEN 'one' WHEN 2 THEN 'two' END", "two"),
    ("CASE NULL WHEN NULL THEN 'n' ELSE 'x' END", "x"),
    ("CASE sex WHEN 'Male' THEN COUNT(*) ELSE 0 END", 7),
    ("CASE missing WHEN NULL THEN 1 ELSE 0 END", 0),
    ("COALESCE(NULL, SUM(y), 3, 4)", 3), ("COALESCE(NULL, NULL)", None),
    ("COALESCE(missing, sex)", "Male"),
    ("NULLIF(1, 1)", None), ("NULLIF(1, 2)", 1), ("NULLIF(NULL, 1)", None), ("NULLIF(1, NULL)", 1),
    ("NULLIF(COUNT(*), 0)", 7),
    ("LEAST(3, NULL, 1)", 1), ("GREATEST(3, NULL, 1)", 3), ("LEAST(NULL, NULL)", None),
    ("GREATEST(SUM(y), COUNT(*))", 7), ("LEAST(SUM(x), SUM(y))", -7),
])
def test_conditionals_skip_null(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected), ev(sql)


@pytest.mark.parametrize(("sql", "expected"), [
    ("CAST(2.5 AS INT)", 3), ("CAST(-2.5 AS INT)", -3), ("CAST(3.49 AS BIGINT)", 3),
    ("CAST(COUNT(*) AS FLOAT)", 7.0), ("COUNT(*)::DOUBLE PRECISION", 7.0),
    ("CAST(3 AS TEXT)", "3"), ("CAST(AVG(x) AS VARCHAR)", "2.5"), ("CAST(1 AS BOOLEAN)", True),
    ("CAST(0 AS BOOLEAN)", False), ("CAST('abc' AS INT)", None),
    # NUMERIC(p, s) rounds to s places, halves away from zero (it was ignored: full float)
    ("CAST(38.70128612480838 AS NUMERIC(10, 2))", 38.7), ("CAST(2.25 AS NUMERIC(3, 1))", 2.3),
    ("CAST(-2.25 AS DECIMAL(3, 1))", -2.3), ("CAST(123.456 AS NUMERIC(10, 2))", 123.46),
    ("CAST(2.5 AS NUMERIC(5))", 3.0), ("CAST(123.456 AS NUMERIC(3, 1))", None),
    ("CAST(AVG(x) AS NUMERIC)", 2.5),
    # beyond decimal's default 28 digits; a float read at 15 digits, as PostgreSQL reads
    # float8 into numeric; no negative zero
    ("CAST(2.5 AS NUMERIC(40, 30))", 2.5), ("CAST(2.4999999999999996 AS NUMERIC(2, 0))", 3.0),
    ("CAST(0.30000000000000004 AS NUMERIC(20, 17))", 0.3), ("CAST(-0.004 AS NUMERIC(3, 2))", 0.0),
    # truth values: true::int is 1, written true/false, read from PostgreSQL's spellings
    ("CAST(COUNT(*) > 5 AS INT)", 1), ("CAST(COUNT(*) > 50 AS BIGINT)", 0),
    ("CAST(COUNT(*) > 5 AS TEXT)", "true"), ("CAST('false' AS BOOLEAN)", False),
    ("CAST('off' AS BOOLEAN)", False), ("CAST('yes' AS BOOLEAN)", True),
    ("CAST('maybe' AS BOOLEAN)", None),
    # lengths: VARCHAR(n) cut, CHAR(n) cut or padded
    ("CAST(COUNT(*) * 1000 AS VARCHAR(2))", "70"), ("CAST(sex AS CHAR(2))", "Ma"),
    ("CAST(sex AS CHAR(6))", "Male  "),
    # beyond the integer type it names: NULL, where PostgreSQL raises 22003 (it was the
    # number itself, 70000 as a "smallint")
    ("CAST(COUNT(*) * 10000 AS SMALLINT)", None), ("CAST(32767 AS SMALLINT)", 32767),
    ("CAST(-32768.4 AS SMALLINT)", -32768), ("CAST(32767.5 AS SMALLINT)", None),
    ("CAST(COUNT(*) * 1e9 AS INT)", None), ("CAST(2147483647 AS INT)", 2147483647),
    ("CAST(COUNT(*) * 1e19 AS BIGINT)", None), ("CAST(COUNT(*) * 1e17 AS BIGINT)", 7 * 10**17),
])
def test_cast(sql: str, expected: Any) -> None:
    assert same(ev(sql), expected), ev(sql)


@pytest.mark.parametrize(("sql", "expected"), [
    ("COUNT(*) > 5", True), ("COUNT(*) >= 7", True), ("COUNT(*) < 7", False),
    ("COUNT(*) <= 6", False), ("COUNT(*) = 7", True), ("COUNT(*) <> 7", False),
    ("sex = 'Male'", True), ("sex <> 'Male'", False), ("AVG(x) > 2", True),
])
def test_comparisons(sql: str, expected: bool) -> None:
    assert ev(sql) is expected


@pytest.mark.parametrize(("sql", "expected"), [
    ("CASE n WHEN '3' THEN 'three' ELSE 'other' END", "three"),
    ("CASE n WHEN '4' THEN 'four' ELSE 'other' END", "other"),
    ("NULLIF(n, '3')", None), ("NULLIF(n, '4')", 3),
])
def test_case_and_nullif_read_a_quoted_number_as_a_comparison_does(sql: str, expected: Any
                                                                    ) -> None:
    """CASE x WHEN '30' and NULLIF(x, '30') compared 30 with '30' as unequal (PostgreSQL
    reads the literal as a number, as a comparison here does)."""
    assert ev(sql) == expected


def test_number_compared_with_a_numeric_string_literal() -> None:
    assert evaluate(item("COUNT(*) > '9'"), {"COUNT(*)": 10}, {}) is True


def test_aggregate_refs_look_values_up_by_name() -> None:
    node = item("ROUND(SUM(x) / COUNT(*), 1)")
    names = {"SUM(x)": "s", "COUNT(*)": "c"}
    referred = refer_to_aggregates(node, names)
    assert not list(referred.find_all(exp.AggFunc))
    assert {ref.this for ref in referred.find_all(AggregateRef)} == {"s", "c"}
    assert evaluate(referred, {"s": 10.0, "c": 3}, {}) == 3.3
    assert evaluate(node, {"SUM(x)": 10.0, "COUNT(*)": 3}, {}) == 3.3  # original unchanged


# -- output_name ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("sql", "name"), [
    ("COUNT(*)", "count"), ("COUNT(DISTINCT person_id)", "count"), ("COUNT(age)", "count"),
    ("SUM(age)", "sum"), ("AVG(age)", "avg"), ("MIN(age)", "min"), ("MAX(age)", "max"),
    ("COUNT(*) AS n", "n"), ("COUNT(*) n", "n"), ('COUNT(*) AS "N"', "N"), ("sex AS key", "key"),
    ("sex", "sex"), ("adult.sex", "sex"), ("ROUND(AVG(age), 1)", "round"),
    ("ABS(SUM(age))", "abs"), ("FLOOR(AVG(age))", "floor"), ("SQRT(COUNT(*))", "sqrt"),
    ("COALESCE(SUM(age), 0)", "coalesce"), ("NULLIF(COUNT(*), 0)", "nullif"),
    ("GREATEST(COUNT(*), 1)", "greatest"), ("LEAST(COUNT(*), 1)", "least"),
    ("CASE WHEN COUNT(*) > 1 THEN 1 ELSE 0 END", "case"),
    ("CAST(COUNT(*) AS FLOAT)", "count"), ("COUNT(*)::FLOAT", "count"), ("sex::TEXT", "sex"),
    ("COUNT(*) + 1", "?column?"), ("-COUNT(*)", "?column?"), ("COUNT(*) > 1", "?column?"),
    ("1", "?column?"), ("'a'", "?column?"), ("COUNT(*) % 2", "?column?"),
    ("COUNT(*) AS Total", "total"), ("SEX", "sex"), ('"SEX"', "SEX"), ("adult.SEX", "sex"),
])
def test_output_name_as_postgresql_names_it(sql: str, name: str) -> None:
    assert output_name(item(sql)) == name


@pytest.mark.parametrize(("sql", "name"), [
    ("(sex)", "sex"),
    ("(COUNT(*))", "count"),
    # sqlglot parses POWER(a, b) and a ^ b into one node, MOD(a, b) and a % b too, and
    # now() and CURRENT_TIMESTAMP: PostgreSQL names only the function forms
    ("POWER(COUNT(*), 2)", "power"),
    ("pow(COUNT(*), 2)", "pow"),
    ("COUNT(*) ^ 2", "?column?"),
    ("MOD(COUNT(*), 2)", "mod"),
    ("COUNT(*) % 2", "?column?"),
    ("now()", "now"),
    ("CURRENT_TIMESTAMP", "current_timestamp"),
    ("CAST(COUNT(*) * 2 AS FLOAT)", "float8"),
])
def test_output_name_corner_cases(sql: str, name: str) -> None:
    assert output_name(item(sql)) == name


# -- check_output_expression ---------------------------------------------------------------------

@pytest.mark.parametrize("sql", [
    "ROUND(AVG(age), 1) + COUNT(*) * 2 - ABS(SUM(age)) / NULLIF(COUNT(*), 0)",
    "CASE WHEN sex = 'M' THEN COUNT(*) ELSE 0 END",
    "COALESCE(GREATEST(COUNT(*), 1), LEAST(2, 3))", "CAST(COUNT(*) AS FLOAT)",
    "SQRT(POWER(COUNT(*), 2))", "FLOOR(AVG(age)) % 2", "CEIL(AVG(age))",
    "COUNT(*) IS NULL AND NOT (sex = 'x' OR TRUE)",
])
def test_supported_output_expressions_pass_and_columns_are_checked(sql: str) -> None:
    seen: list[str] = []
    check_output_expression(item(sql), lambda column: seen.append(column.name))
    assert seen == [c.name for c in item(sql).find_all(exp.Column)
                    if not c.find_ancestor(exp.AggFunc)]


def test_check_key_rejection_propagates() -> None:
    def refuse(column: exp.Column) -> None:
        raise errors.GroupingError(f"{column.name} is not a group key")

    with pytest.raises(errors.GroupingError):
        check_output_expression(item("CASE WHEN age > 1 THEN COUNT(*) END"), refuse)
    check_output_expression(item("SUM(age) + 1"), refuse)  # inside an aggregate: not a key


@pytest.mark.parametrize("sql", [
    "LN(COUNT(*))", "EXP(SUM(age))", "LOG(10, COUNT(*))", "RANDOM()", "NOW()", "UPPER(sex)",
    "CONCAT(sex, 'x')", "sex || 'x'", "SUBSTRING(sex, 1, 2)", "COUNT(*) OVER ()", "(SELECT 1)",
    "MD5(sex)", "my_udf(COUNT(*))", "pg_sleep(1)", "COUNT(*) IN (1, 2)",
    "COUNT(*) BETWEEN 1 AND 2", "sex LIKE 'a%'", "COUNT(*) IS DISTINCT FROM 1",
])
def test_unsupported_output_expressions_are_0a000(sql: str) -> None:
    with pytest.raises(errors.NotSupportedError) as info:
        check_output_expression(item(sql), lambda column: None)
    assert info.value.sqlstate == "0A000"
    assert "not supported on query outputs" in info.value.message
    assert "ROUND" in (info.value.hint or "")


def test_unsupported_function_message_names_the_function() -> None:
    with pytest.raises(errors.NotSupportedError) as info:
        check_output_expression(item("my_udf(COUNT(*))"), lambda column: None)
    assert "my_udf" in info.value.message.lower()


@pytest.mark.parametrize("sql", ["CAST(COUNT(*) AS DATE)", "CAST(COUNT(*) AS JSON)",
                                 "CAST(COUNT(*) AS TIMESTAMP)"])
def test_cast_to_an_unsupported_type_is_refused_at_check(sql: str) -> None:
    with pytest.raises(errors.NotSupportedError):
        check_output_expression(item(sql), lambda column: None)


def test_cast_to_an_unsupported_type_never_evaluates() -> None:
    with pytest.raises(errors.NotSupportedError):
        evaluate(item("CAST(COUNT(*) AS DATE)"), {"COUNT(*)": 3}, {})


def test_ntile_of_more_buckets_than_rows_puts_each_row_in_its_own() -> None:
    """As PostgreSQL: buckets beyond the rows stay empty (NTILE(10^12) looped over every
    bucket, after the charge, a review found)."""
    from dpproxy.windows import _ntile

    assert _ntile(3, 10**12) == [1, 2, 3]
    assert _ntile(5, 2) == [1, 1, 1, 2, 2]
