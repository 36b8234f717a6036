"""Outputs, HAVING, ORDER BY and window parts are typed before anything is charged, as
PostgreSQL types them when it plans: arithmetic over a text key, values of two types
compared or in one CASE, a non-boolean HAVING are refused (42804), where the evaluator
could only have answered NULL after the charge, or failed (`-sex` was charged and then
raised a fault)."""

from __future__ import annotations

import pytest
import sqlglot

from dpproxy import errors
from dpproxy.postprocess import infer_type, refer_to_aggregates
from dpproxy.session import Engine

from .refusals import assert_refused

MISMATCH = "42804"


@pytest.mark.parametrize(("sql", "sqlstate", "words"), [
    ("SELECT sex * 2, COUNT(*) FROM adult GROUP BY sex", MISMATCH, "text * int8"),
    ("SELECT sex, COUNT(*) + sex FROM adult GROUP BY sex", MISMATCH, "int8 + text"),
    ("SELECT -sex, COUNT(*) FROM adult GROUP BY sex", MISMATCH, "-(text)"),
    ("SELECT ROUND(sex), COUNT(*) FROM adult GROUP BY sex", MISMATCH, "ROUND(text)"),
    ("SELECT ABS(sex), COUNT(*) FROM adult GROUP BY sex", MISMATCH, "ABS(text)"),
    ("SELECT sex = 1, COUNT(*) FROM adult GROUP BY sex", MISMATCH, "text = int8"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY sex HAVING sex > COUNT(*)", MISMATCH,
     "text > int8"),
    ("SELECT sex, COUNT(*) FROM adult GROUP BY sex ORDER BY sex + 1", MISMATCH, "text + int8"),
    ("SELECT CASE WHEN COUNT(*) > 1 THEN sex ELSE 1 END FROM adult GROUP BY sex", MISMATCH,
     "CASE types text and int8"),
    ("SELECT COALESCE(sex, COUNT(*)) FROM adult GROUP BY sex", MISMATCH, "COALESCE types"),
    ("SELECT LEAST(sex, COUNT(*)) FROM adult GROUP BY sex", MISMATCH, "LEAST types"),
    ("SELECT NULLIF(sex, COUNT(*)) FROM adult GROUP BY sex", MISMATCH, "text = int8"),
    ("SELECT CASE sex WHEN 1 THEN 2 END, COUNT(*) FROM adult GROUP BY sex", MISMATCH,
     "text = int8"),
    ("SELECT NOT COUNT(*) FROM adult", MISMATCH, "argument of NOT"),
    ("SELECT COUNT(*) > 1 AND SUM(age) FROM adult", MISMATCH, "argument of AND"),
    ("SELECT COUNT(*) IS TRUE FROM adult", MISMATCH, "argument of IS TRUE"),
    ("SELECT COUNT(*) FROM adult HAVING COUNT(*)", MISMATCH, "HAVING must be type boolean"),
    ("SELECT COALESCE(COUNT(*), '2') FROM adult", MISMATCH, "write the number without quotes"),
    ("SELECT '2' + '3', COUNT(*) FROM adult", MISMATCH, "without quotes"),
    ("SELECT COUNT(*) * 'two' FROM adult", "22P02", "'two'"),
    ("SELECT day + 1, COUNT(*) FROM visits GROUP BY day", MISMATCH, "GROUP BY day + 7"),
    ("SELECT CAST(day AS BIGINT), COUNT(*) FROM visits GROUP BY day", MISMATCH,
     "cannot cast type date to int8"),
    ("SELECT day, COUNT(*) FROM visits GROUP BY day HAVING day > '2024-7-1'", "22P02",
     "YYYY-MM-DD"),
    ("SELECT sex, SUM(COUNT(*)) OVER (PARTITION BY sex * 2) FROM adult GROUP BY sex",
     MISMATCH, "text * int8"),
    ("SELECT sex, SUM(sex) OVER () FROM adult GROUP BY sex", MISMATCH, "sum(text)"),
])
def test_type_errors_are_refused_before_the_charge(engine: Engine, sql: str, sqlstate: str,
                                                    words: str) -> None:
    assert_refused(engine, sql, sqlstate, words)


def test_a_quoted_number_is_read_as_a_number_as_postgresql_reads_it(engine: Engine) -> None:
    """`COUNT(*) * '2'` is twice the released count (it was NULL: the evaluator multiplied
    a number by text), in one release, so exactly twice."""
    result = engine.session("alice", epsilon=1.0).execute(
        "SELECT COUNT(*), COUNT(*) * '2', COUNT(*) + '0.5' FROM adult")
    (count, doubled, plus_half), = result.rows
    assert isinstance(count, int) and doubled == 2 * count and plus_half == count + 0.5


def test_well_typed_post_processing_is_released(engine: Engine) -> None:
    """Text keys compared with text, dates with ISO dates, CASE branches of numbers mixed:
    answered."""
    session = engine.session("alice", epsilon=1.0)
    result = session.execute(
        "SELECT sex, sex = 'Male' AS male, CASE WHEN COUNT(*) > 0 THEN 1 ELSE 0.5 END AS c "
        "FROM adult GROUP BY sex HAVING sex <> 'x' ORDER BY sex")
    assert [r[:2] for r in result.rows] == [("Female", False), ("Male", True)]
    assert [r[2] for r in result.rows] == [1, 1]
    dated = session.execute("SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-01-01' "
                            "HAVING COUNT(*) > 0 OR COUNT(*) <= 0")
    assert len(dated.rows) == 1


def test_medians_and_roundings_are_double_precision_as_in_postgresql(engine: Engine) -> None:
    """PostgreSQL's percentile_cont is double precision, so `MEDIAN(age) / 2` divides
    without truncating (it was an integer division: 37 / 2 gave 18); MIN and MAX keep the
    column's type. ROUND of a count is double precision too (half of an odd count was
    truncated)."""
    result = engine.session("alice", epsilon=1.0).execute(
        "SELECT MEDIAN(age) AS m, MEDIAN(age) / 2 AS half, "
        "PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) AS p, MIN(age) AS lo FROM adult")
    assert result.types == ("float8", "float8", "float8", "int8")
    (median, half, p, lo), = result.rows
    assert isinstance(median, float) and isinstance(p, float) and isinstance(lo, int)
    assert half == median / 2
    rounded = engine.session("alice", epsilon=1.0).execute(
        "SELECT COUNT(*) AS n, ROUND(COUNT(*)) / 2 AS half FROM adult")
    assert rounded.types == ("int8", "float8")
    (n, half), = rounded.rows
    assert half == n / 2


@pytest.mark.parametrize(("sql", "expected"), [
    ("COUNT(*) * 2", "int8"), ("COUNT(*) / 2.0", "float8"), ("COUNT(*) * '2'", "int8"),
    ("COUNT(*) * '2.5'", "float8"), ("AVG(x) + COUNT(*)", "float8"), ("-COUNT(*)", "int8"),
    ("SQRT(COUNT(*))", "float8"), ("ROUND(AVG(x), 1)", "float8"), ("ROUND(AVG(x))", "float8"),
    ("COUNT(*) > 3", "bool"), ("sex = 'Male'", "bool"), ("sex", "text"), ("'a'", "text"),
    ("NULL", "text"), ("COALESCE(NULL, COUNT(*))", "int8"),
    ("CASE WHEN COUNT(*) > 1 THEN 1 ELSE 2.5 END", "float8"),
    ("CASE WHEN COUNT(*) > 1 THEN sex ELSE 'none' END", "text"),
    ("CAST(COUNT(*) AS TEXT)", "text"), ("CAST(AVG(x) AS INT)", "int8"),
    ("NULL + COUNT(*)", "int8"), ("day", "date"), ("day = '2024-01-05'", "bool"),
    # PostgreSQL rounds a bigint in double precision: ROUND(COUNT(*)) / 2 does not truncate
    ("ROUND(COUNT(*))", "float8"), ("FLOOR(COUNT(*)) / 2", "float8"),
    ("TRUNC(COUNT(*), -1)", "float8"), ("ABS(COUNT(*))", "int8"),
])
def test_types_as_row_descriptions_read_them(sql: str, expected: str) -> None:
    node = sqlglot.parse_one(sql, read="postgres")
    node = refer_to_aggregates(node, {"COUNT(*)": "COUNT(*)", "AVG(x)": "AVG(x)"})
    types = {"COUNT(*)": "int8", "AVG(x)": "float8"}
    assert infer_type(node, types, {"sex": "text", "day": "date"}) == expected


def test_the_typer_can_refuse() -> None:
    """The refusals above come from the typer, not from elsewhere in analysis."""
    with pytest.raises(errors.DatatypeMismatch):
        infer_type(sqlglot.parse_one("sex * 2"), {}, {"sex": "text"})


def test_keys_written_in_capitals_are_released(engine: Engine) -> None:
    """`select SEX … group by SEX` was charged and then failed as a fault (evaluation read
    the key by the name as written): keys are read by their own names."""
    result = engine.session("alice", epsilon=1.0).execute(
        "select SEX, count(*) from ADULT group by SEX having SEX <> 'x' order by SEX desc")
    assert [r[0] for r in result.rows] == ["Male", "Female"]
    assert result.columns[0] == "sex"


def test_aliases_are_folded_as_postgresql_folds_them(engine: Engine) -> None:
    """`AS Total` names the column `total`, and ORDER BY Total, total or TOTAL reads it; a
    quoted "Total" keeps its case."""
    session = engine.session("alice", epsilon=1.0)
    result = session.execute(
        "SELECT sex, COUNT(*) AS Total FROM adult GROUP BY sex ORDER BY TOTAL DESC")
    assert result.columns == ("sex", "total")
    assert [r[0] for r in result.rows] == ["Male", "Female"]  # 21,790 men, 10,771 women
    quoted = session.execute(
        'SELECT sex, COUNT(*) AS "Total" FROM adult GROUP BY sex ORDER BY "Total"')
    assert quoted.columns == ("sex", "Total")


def test_a_quoted_name_names_one_column_exactly(engine: Engine) -> None:
    """"Age" is not age in PostgreSQL (quoted names keep their case); it was answered as
    age. Unquoted AGE still folds to age."""
    assert_refused(engine, 'SELECT COUNT(*) FROM adult WHERE "Age" > 40', "42703", "'Age'")
    # tables and joined columns alike ("Adult" was adult, g."Occupation" occupation)
    assert_refused(engine, 'SELECT COUNT(*) FROM "Adult"', "42P01", '"Adult"')
    assert_refused(engine, 'SELECT g.collar, COUNT(*) FROM adult a JOIN occupation_groups g '
                           'ON a.occupation = g."Occupation" GROUP BY g.collar', "42703",
                   "Occupation")
    session = engine.session("alice", epsilon=1.0)
    assert len(session.execute('SELECT COUNT(*) FROM adult WHERE "age" > AGE - 1').rows) == 1


def test_window_calls_over_any_value_are_released(engine: Engine) -> None:
    """COUNT(sex) OVER () added the text values up (charged, then a fault), and SUM over
    an integer beyond a float's range overflowed; both are answered now."""
    session = engine.session("alice", epsilon=1.0)
    counted = session.execute("SELECT sex, COUNT(sex) OVER () AS n, COUNT(*) FROM adult "
                              "GROUP BY sex")
    assert [r[1] for r in counted.rows] == [2, 2]
    huge = session.execute("SELECT sex, SUM(COUNT(*) * 1" + "0" * 400 + ") OVER () AS s "
                           "FROM adult GROUP BY sex")
    assert [r[1] for r in huge.rows] == [None, None]
    assert engine.ledger.status("analyst:alice").spent.epsilon == pytest.approx(2.0)


def test_an_unsupported_operator_over_a_window_is_refused_plainly(engine: Engine) -> None:
    """The message naming it could not be written (a ValueError, outside dpproxy.Error)."""
    assert_refused(engine, "SELECT sex, MAX(COUNT(*)) OVER () || 'x' FROM adult GROUP BY sex",
                   "0A000", "max(…) OVER (…) || 'x'")


def test_lag_default_is_typed_with_its_value(engine: Engine) -> None:
    """LAG's default stands for a value: of its type (a text default for a count was
    released in an int8 column)."""
    assert_refused(engine, "SELECT sex, LAG(sex, 1, 0) OVER (ORDER BY sex) FROM adult "
                           "GROUP BY sex", MISMATCH, "text and int8")
    result = engine.session("alice", epsilon=1.0).execute(
        "SELECT sex, LAG(sex, 1, 'none') OVER (ORDER BY sex) FROM adult GROUP BY sex")
    assert [r[1] for r in result.rows] == ["none", "Female"]


@pytest.mark.parametrize("sql", [
    "SELECT sex AS S, COUNT(*) FROM adult GROUP BY s",
    "SELECT sex AS Gender, COUNT(*) FROM adult GROUP BY GENDER",
    'SELECT sex AS "gender", COUNT(*) FROM adult GROUP BY Gender',
    'SELECT sex AS "SEX", COUNT(*) FROM adult GROUP BY "SEX"',
])
def test_group_by_an_alias_folds_as_postgresql_folds(engine: Engine, sql: str) -> None:
    """GROUP BY an alias compared names as written: `AS S … GROUP BY s` was 42703."""
    result = engine.session("alice", epsilon=1.0).execute(sql)
    assert [r[0] for r in result.rows] == ["Female", "Male"]
