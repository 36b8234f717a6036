"""The parse cache and the answer-cache key built from the normalized bound query:
cached parses bind exactly like fresh ones, every binding error is raised every time,
before any charge, and the answer cache tells parameter values apart."""

from __future__ import annotations

from typing import Any

import pytest

from dpproxy import errors, parse
from dpproxy.parse import parse_statements
from dpproxy.session import Session

SQL = "SELECT COUNT(*) FROM adult WHERE capital_gain > %s AND sex = %s"


def _fresh(sql: str, params: Any) -> list[str]:
    parse._parsed.clear()
    return [s.ast.sql("postgres") if s.ast is not None else s.kind
            for s in parse_statements(sql, params)]


def test_cached_parses_bind_like_fresh_ones_and_leave_the_template_alone() -> None:
    fresh = _fresh(SQL, [5, "Male"])
    first = parse_statements(SQL, [5, "Male"])  # the cached template, bound again
    second = parse_statements(SQL, [-7, "O'Brien"])
    assert [s.ast.sql("postgres") for s in first if s.ast is not None] == fresh
    assert second[0].ast is not None
    assert second[0].ast.sql("postgres") == ("SELECT COUNT(*) FROM adult WHERE capital_gain > -7"
                                             " AND sex = 'O''Brien'")
    assert first[0].template is second[0].template  # one parse for both
    assert first[0].ast is not second[0].ast
    assert first[0].ast.sql("postgres") == fresh[0]  # binding the second left the first alone
    assert first[0].template is not None and "%s" in first[0].template.sql("postgres")
    many = "SET dpproxy.epsilon = 0.5; " + SQL
    assert _fresh(many, [1, "x"]) == [s.ast.sql("postgres") if s.ast is not None else s.kind
                                      for s in parse_statements(many, [1, "x"])]


@pytest.mark.parametrize(("params", "message"), [
    ([1], "fewer parameters"),
    ([1, "x", 3], "3 parameters were given but the query uses 2"),
    (None, "no parameters were given"),
    ([[[1], [2]], "x"], "parameters of type list"),  # a flat list is an array
    ([float("nan"), "x"], "not a valid parameter"),
])
def test_binding_errors_come_from_cached_parses_too(params: Any, message: str) -> None:
    parse._parsed.clear()
    with pytest.raises(errors.ProgrammingError, match=message):
        parse_statements(SQL, params)  # a fresh parse
    assert SQL not in parse._parsed  # errors are not cached
    parse_statements(SQL, [1, "x"])
    assert SQL in parse._parsed
    for _ in range(2):
        with pytest.raises(errors.ProgrammingError, match=message):
            parse_statements(SQL, params)  # the cached template


def test_answer_cache_tells_parameter_values_apart(alice: Session) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE age > %s"
    first = alice.execute(sql, [30])
    other = alice.execute(sql, [40])
    again = alice.execute(sql, [30])
    assert first.cost is not None and other.cost is not None  # two queries, both charged
    assert again.cost is None and again.rows == first.rows  # the repeat: its first answer
    as_float = alice.execute(sql, [30.5])
    assert as_float.cost is not None  # another value, another query
    same_by_name = alice.execute("SELECT COUNT(*) FROM adult WHERE age > %(a)s", {"a": 30})
    assert same_by_name.cost is None and same_by_name.rows == first.rows  # same bound query
    by_name = alice.execute("SELECT COUNT(*) FROM adult WHERE age > %(a)s", {"a": 31})
    again_by_name = alice.execute("SELECT COUNT(*) FROM adult WHERE age > %(a)s", {"a": 31})
    assert by_name.cost is not None and again_by_name.cost is None
    assert again_by_name.rows == by_name.rows
    mixed_case = alice.execute("select count(*) from ADULT where AGE > %s", [30])
    assert mixed_case.cost is None and mixed_case.rows == first.rows  # normalized query
    # the same query with its value written in: the same bound query, the same answer
    literal = alice.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
    assert literal.cost is None and literal.rows == first.rows


def test_bad_parameters_are_refused_free_every_time(alice: Session) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE age > %s"
    alice.execute(sql, [18])  # the template is cached now
    spent = alice.remaining()
    for _ in range(2):
        with pytest.raises(errors.ProgrammingError, match="parameters of type dict"):
            alice.execute(sql, [{"age": 1}])
    with pytest.raises(errors.Error) as caught:  # a type the analyzer refuses, as uncached
        alice.execute(sql, ["not a number"])
    parse._parsed.clear()
    with pytest.raises(errors.Error) as uncached:
        alice.execute(sql, ["not a number"])
    assert caught.value.sqlstate == uncached.value.sqlstate
    assert str(caught.value) == str(uncached.value)
    assert alice.remaining() == spent  # nothing was charged for any of them


def test_a_repeat_is_answered_before_analysis(alice: Session,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from dpproxy import session as session_module

    sql = "SELECT COUNT(*) FROM adult WHERE age > %s"
    first = alice.execute(sql, [50])
    spent = alice.remaining()

    def no_analysis(*args: object) -> None:
        raise AssertionError("a repeat must not be analysed again")

    monkeypatch.setattr(session_module, "analyze", no_analysis)
    again = alice.execute(sql, [50])
    assert again.cost is None and again.rows == first.rows
    assert again.intervals == first.intervals and again.types == first.types
    assert any("repeated query" in n for n in again.notices)
    assert alice.remaining() == spent
    # a new value is a new query, charged; its shape's analysis serves it (dpproxy.shapes)
    assert alice.execute(sql, [51]).cost is not None
    monkeypatch.setattr(session_module, "SHAPE_CACHE", False)
    with pytest.raises(AssertionError, match="must not be analysed"):
        alice.execute(sql, [52])  # without the shape cache: analysed
    monkeypatch.setattr(session_module, "FAST_REPEATS", False)
    with pytest.raises(AssertionError, match="must not be analysed"):
        alice.execute(sql, [50])  # switched off: analysed first, as before


def test_a_stored_answer_is_found_by_the_charge_itself(demo_policy: Any) -> None:
    """A process that has not seen a query looks its answer up only through the charge,
    which checks the claim first: the stored answer, nothing charged, even with no budget
    left for a new query."""
    from dpproxy.session import Engine

    sql = "SELECT COUNT(*) FROM adult WHERE age > %s"
    with Engine.from_path(demo_policy) as first:
        answered = first.session("alice").execute(sql, [33])
    with Engine.from_path(demo_policy) as second:  # the same ledger, an empty memo
        alice = second.session("alice")
        alice.set_option("epsilon", alice.remaining().epsilon)
        alice.execute(sql, [34])  # spends everything that is left
        assert alice.remaining().epsilon == 0
        alice.set_option("epsilon", 0.1)
        again = alice.execute(sql, [33])
        assert again.cost is None and again.rows == answered.rows
        assert any("repeated query" in n for n in again.notices)
        with pytest.raises(errors.BudgetExceeded):
            alice.execute(sql, [35])
