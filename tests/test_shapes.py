"""The shape cache (`dpproxy.shapes`): a query that differs from an accepted one only in WHERE
number literals reuses its analysis and rewrite, with the literals as backend parameters.

Checked against the uncached path on both backends: the same plan (statistics,
sensitivities, cost), the same output names and types, the same exact pre-noise rows,
the same charge; and queries that must not share a shape (other tables, columns,
functions, operators, literals in places where their value matters) do not.
"""

from __future__ import annotations

import contextlib
import decimal
import doctest
from typing import Any

import pytest
import sqlglot

from dpproxy import errors, shapes
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryPlan
from dpproxy.session import Engine, Session

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


# (SQL, parameter lists): each list gives the same shape a new value
SHAPED = [
    ("SELECT COUNT(*) FROM adult WHERE capital_gain > %s", [[0], [5000], [99999], [0]]),
    ("SELECT AVG(hours_per_week) AS h FROM adult WHERE age BETWEEN %s AND %s",
     [[30, 40], [17, 90], [50, 20]]),
    ("SELECT occupation, SUM(capital_gain), COUNT(*) FROM adult WHERE age IN (%s, %s, 40) "
     "AND %s <= hours_per_week GROUP BY occupation", [[25, 35, 40], [60, 61, 1]]),
    ("SELECT sex, COUNT(*) FROM adult WHERE age > %s OR capital_gain = %s GROUP BY sex",
     [[-5, 0], [-70, 7], [-44, 114]]),  # a sign is part of the shape
    ("SELECT COUNT(*), SUM(amount) FROM visits WHERE amount < %s AND amount >= %s",
     [[12.5, 0.1], [250.0, 0.0], [499.99, 3.25]]),
    ("SELECT education, VAR_POP(age) FROM adult WHERE capital_gain > %s GROUP BY education",
     [[-100], [-3]]),
]


def _exact(engine: Engine, plan: QueryPlan, values: tuple[object, ...] = (),
           shaped: Any = None) -> dict[tuple[Any, ...], tuple[float, ...]]:
    from dpproxy.rewrite import rewrite

    rewritten = shaped if shaped is not None else rewrite(plan, engine.backend.dialect)
    rows = engine.backend.run_aggregate(rewritten.sql, rewritten.parameters(values))
    k = len(rewritten.key_columns)
    return {tuple(r[:k]): tuple(float(v) for v in r[k:k + len(rewritten.measurement_columns)])
            for r in rows}


def _same_plan(shaped: QueryPlan, fresh: QueryPlan) -> None:
    a, b = shaped.analysis, fresh.analysis
    assert a.statement == b.statement
    assert [o.name for o in a.outputs] == [o.name for o in b.outputs]
    assert a.output_types == b.output_types
    assert a.keys == b.keys and a.statistics == b.statistics and a.aggregates == b.aggregates
    assert (a.limit, a.offset, a.table) == (b.limit, b.offset, b.table)
    assert shaped.measurements == fresh.measurements
    assert shaped.selection == fresh.selection
    assert shaped.cost == fresh.cost and shaped.loss == fresh.loss


@pytest.mark.parametrize(("sql", "values"), SHAPED)
def test_a_shaped_query_plans_and_measures_as_the_uncached_path(
        engine: Engine, sql: str, values: list[list[Any]]) -> None:
    alice = engine.session("alice")
    for number, params in enumerate(values):
        planned, shaped = alice._shaped_plan(parse_statements(sql, params)[0])
        assert isinstance(planned, QueryPlan) and shaped is not None
        rewritten, slot_values = shaped
        assert rewritten.slots == len(slot_values) > 0
        fresh = alice._plan(parse_statements(sql, params)[0])
        assert isinstance(fresh, QueryPlan)
        _same_plan(planned, fresh)
        # the first value filled the cache; every later one is served from it
        cached = engine.shape("alice", shapes.lift(parse_statements(sql, params)[0].ast).key)
        assert cached is not None and cached[1] is rewritten
        if number == 0:
            first = rewritten
        assert rewritten is first
        # the same exact statistics, before any noise (adult: one row and group per person,
        # so bounding keeps every row whatever the salt)
        if planned.analysis.table.name == "adult":
            assert _exact(engine, planned, slot_values, rewritten) == _exact(engine, fresh)
            if rewritten.unbounded is not None:  # no person exceeds adult's bounds
                unbounded = rewritten.unbounded
                rows = engine.backend.run_aggregate(
                    unbounded.sql, unbounded.parameters(rewritten.parameters(slot_values)))
                k = len(rewritten.key_columns)
                assert {tuple(r[:k]): tuple(float(v) for v in r[k:]) for r in rows} \
                    == _exact(engine, fresh)
        else:
            assert _exact(engine, planned, slot_values, rewritten).keys() \
                == _exact(engine, fresh).keys()


def test_shaped_and_unshaped_sessions_charge_and_answer_alike(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpproxy import session as session_module

    sql, values = SHAPED[2]
    alice = engine.session("alice")
    shaped = [alice.execute(sql, v) for v in values]
    assert shapes.lift(parse_statements(sql, values[0])[0].ast).key in {
        k for _, k in engine._shapes}
    monkeypatch.setattr(session_module, "SHAPE_CACHE", False)
    plain = [alice.execute(sql, [v[0] + 1, *v[1:]]) for v in values]
    for a, b in zip(shaped, plain, strict=True):
        assert a.columns == b.columns and a.types == b.types and a.tag == b.tag
        assert a.cost == b.cost and a.cost is not None
        assert [r[0] for r in a.rows] == [r[0] for r in b.rows]  # the public groups
        assert a.accuracy == b.accuracy
    # each charge records the query as written, not its shape
    history = engine.ledger.history("analyst:alice")
    assert history[len(plain)].statement == parse_statements(sql, values[-1])[0].ast.sql(
        "postgres")
    assert "$slot" not in history[len(plain)].statement


def test_a_repeat_of_a_shaped_query_is_answered_from_the_cache(alice: Session) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE capital_gain > %s"
    first = alice.execute(sql, [100])
    second = alice.execute(sql, [200])
    spent = alice.remaining()
    assert second.cost == first.cost
    again = alice.execute("SELECT COUNT(*) FROM adult WHERE capital_gain > 200")
    assert again.cost is None and again.rows == second.rows
    assert alice.remaining() == spent
    # another value is another query: charged again, not the other value's answer
    assert alice.execute(sql, [300]).cost == first.cost


@pytest.mark.parametrize(("a", "b"), [
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT COUNT(*) FROM visits WHERE age > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5",
     "SELECT COUNT(*) FROM adult WHERE hours_per_week > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT SUM(age) FROM adult WHERE age > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT COUNT(*) FROM adult WHERE age >= 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT COUNT(*) FROM adult WHERE age > -5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT COUNT(*) FROM adult WHERE age > 5.0"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5", "SELECT COUNT(*) AS n FROM adult WHERE age > 5"),
    ("SELECT COUNT(*) FROM adult WHERE sex = 'Male'",
     "SELECT COUNT(*) FROM adult WHERE sex = 'Female'"),
    ("SELECT SUM(LEAST(capital_gain, 10)) FROM adult WHERE age > 5",
     "SELECT SUM(LEAST(capital_gain, 20)) FROM adult WHERE age > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age + 1 > 5",
     "SELECT COUNT(*) FROM adult WHERE age + 1 > 6"),
    ("SELECT COUNT(*) FROM adult WHERE age / 2 > 5",
     "SELECT COUNT(*) FROM adult WHERE age / 3 > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 1e1", "SELECT COUNT(*) FROM adult WHERE age > 1e2"),
    ("SELECT COUNT(*) FROM adult WHERE age > 1234567890123456",
     "SELECT COUNT(*) FROM adult WHERE age > 1234567890123457"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5 LIMIT 1",
     "SELECT COUNT(*) FROM adult WHERE age > 5 LIMIT 2"),
    ("SELECT sex, COUNT(*) FROM adult WHERE age > 5 GROUP BY sex HAVING COUNT(*) > 1",
     "SELECT sex, COUNT(*) FROM adult WHERE age > 5 GROUP BY sex HAVING COUNT(*) > 2"),
    ("SELECT age / 10 * 10, COUNT(*) FROM adult WHERE age > 5 GROUP BY 1",
     "SELECT age / 20 * 10, COUNT(*) FROM adult WHERE age > 5 GROUP BY 1"),
    ("SELECT MEDIAN(age) FROM adult WHERE age > 5",
     "SELECT PERCENTILE_CONT(0.4) WITHIN GROUP (ORDER BY age) FROM adult WHERE age > 5"),
    # the same SQL once printed, but other output names
    ("SELECT MEDIAN(age) FROM adult WHERE age > 5",
     "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY age) FROM adult WHERE age > 5"),
    ("SELECT COUNT(*) FROM adult WHERE age > 5",
     "SELECT COUNT(*) FROM adult WHERE age > 5 AND age < 90"),
])
def test_queries_that_differ_elsewhere_do_not_share_a_shape(a: str, b: str) -> None:
    key_a = shapes.lift(sqlglot.parse_one(a, read="postgres")).key
    key_b = shapes.lift(sqlglot.parse_one(b, read="postgres")).key
    assert key_a != key_b


@pytest.mark.parametrize(("sql", "lifted"), [
    ("SELECT COUNT(*) FROM adult WHERE age > 5 AND 7 < capital_gain", ("5", "7")),
    ("SELECT COUNT(*) FROM adult WHERE age BETWEEN 1 AND 2.5 OR age IN (3, -4)",
     ("1", "2.5", "3", "4")),
    ("SELECT SUM(LEAST(capital_gain, 10)) FROM adult WHERE age + 1 > 5", ()),
    ("SELECT COUNT(*) FROM adult WHERE sex = 'Male' AND age > 1e3", ()),
    ("SELECT COUNT(*) FROM adult WHERE age > 5 LIMIT 1", ("5",)),
    ("SELECT COUNT(*) FROM adult WHERE age > 1234567890123456", ()),
    ("SELECT COUNT(*) FROM adult WHERE 5 > 3", ()),
])
def test_only_literals_compared_with_a_bare_column_are_lifted(sql: str,
                                                             lifted: tuple[str, ...]) -> None:
    assert shapes.lift(sqlglot.parse_one(sql, read="postgres")).values == lifted


def test_literals_that_decide_acceptance_are_checked_every_time(alice: Session) -> None:
    spent = alice.remaining()
    # a quoted literal is typed by the column (and can fail): never lifted
    assert alice.execute("SELECT COUNT(*) FROM adult WHERE age > '40'").cost is not None
    with pytest.raises(errors.InvalidTextRepresentation):
        alice.execute("SELECT COUNT(*) FROM adult WHERE age > 'forty'")
    # a number compared with a text column is refused, whatever the number: not cached
    for value in (5, 6):
        with pytest.raises(errors.DatatypeMismatch):
            alice.execute("SELECT COUNT(*) FROM adult WHERE sex = %s", [value])
    assert not any("sex" in key for _, key in alice.engine._shapes)
    # a divisor is not lifted: its value is part of the shape
    for divisor in (2, 0):
        assert alice.execute("SELECT COUNT(*) FROM adult WHERE capital_gain / %s > 10",
                             [divisor]).cost is not None
    assert alice.remaining().epsilon == pytest.approx(spent.epsilon - 0.3)


def test_shapes_are_per_analyst(make_policy: Any) -> None:
    policy = make_policy(replace={'tables = ["adult", "visits", "occupation_groups"]':
                                  'tables = ["adult", "visits", "occupation_groups"]\n'
                                  '[analysts.bob]\nbudget = { epsilon = 1.0, delta = 0 }\n'
                                  'tables = ["visits"]'})
    with Engine.from_path(policy) as engine:
        sql = "SELECT COUNT(*) FROM adult WHERE age > %s"
        engine.session("alice").execute(sql, [30])
        with pytest.raises(errors.PrivacyViolation, match="permission denied"):
            engine.session("bob").execute(sql, [31])


def test_explain_shows_the_literals(alice: Session) -> None:
    sql = "SELECT COUNT(*) FROM adult WHERE capital_gain > %s"
    alice.execute(sql, [1234])
    lines = [row[0] for row in alice.execute("EXPLAIN " + sql, [4321]).rows]
    assert any("4321" in line for line in lines)
    assert not any("$" in line for line in lines if "4321" in line)


def test_the_rewrite_binds_each_slot_after_the_salt(engine: Engine) -> None:
    alice = engine.session("alice")
    sql = "SELECT sex, COUNT(*) FROM adult WHERE capital_gain > %s AND age < %s GROUP BY sex"
    _, shaped = alice._shaped_plan(parse_statements(sql, [777, 55])[0])
    assert shaped is not None
    rewritten, values = shaped
    assert values == (777, 55) and rewritten.salted and rewritten.slots == 2
    assert "777" not in rewritten.sql and "55" not in rewritten.sql
    number = "DOUBLE" if engine.backend.dialect == "duckdb" else "BIGINT"
    assert f"CAST($2 AS {number})" in rewritten.sql and f"CAST($3 AS {number})" in rewritten.sql
    assert "?" not in rewritten.sql  # the salt is $1, not a mixed-in `?`
    with pytest.raises(ValueError, match="2 slots"):
        rewritten.parameters(())
    parameters = rewritten.parameters(values)
    assert len(parameters) == 3 and parameters[1:] == (777, 55)
    # the unbounded form (dpproxy.bounds) has no salt: its slots are $1 and $2
    assert rewritten.unbounded is not None and rewritten.unbounded.slots == 2
    assert f"CAST($1 AS {number})" in rewritten.unbounded.sql
    assert "$3" not in rewritten.unbounded.sql
    assert rewritten.unbounded.parameters(parameters) == (777, 55)


def test_doctests() -> None:
    result = doctest.testmod(shapes)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("sql", [
    'SELECT "Sex", COUNT(*) AS "N" FROM Adult AS A WHERE A.Age > 5 GROUP BY "Sex"',
    "SELECT occupation, AVG(hours_per_week) FROM ADULT WHERE Capital_Gain BETWEEN 1 AND 2 "
    "GROUP BY Occupation ORDER BY 2 DESC LIMIT 3",
    "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY Age) FROM adult",
])
def test_the_answer_key_is_the_query_with_identifiers_normalized(engine: Engine,
                                                                 sql: str) -> None:
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    statement = parse_statements(sql)[0]
    assert statement.ast is not None
    expected = normalize_identifiers(statement.ast.copy(), dialect="postgres").sql("postgres")
    assert engine.normalized_query(statement) == expected


def test_the_answer_key_hashes_the_query_options_versions_and_accounting(
        engine: Engine) -> None:
    """The key is the hash of one JSON list (so answers stored before stay found); all but
    the query are printed once per options."""
    import hashlib
    import json
    from dataclasses import asdict

    alice = engine.session("alice")
    statement = parse_statements("SELECT COUNT(*) FROM Adult WHERE age > 30")[0]
    keys = []
    for setting in [None, ("epsilon", 0.5), ("split", "1, 3"), ("mechanism", "gaussian")]:
        if setting is not None:
            alice.set_option(*setting)
        parts = [engine.normalized_query(statement), asdict(alice.options),
                 engine.policy.version, engine.backend.data_version(),
                 engine.ledger.accounting]
        expected = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
        assert alice._cache_key(statement) == alice._cache_key(statement) == expected
        keys.append(expected)
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize("sql", [
    "SELECT occupation, COUNT(*), AVG(age) FROM adult GROUP BY occupation",
    "SELECT sex, SUM(hours_per_week * 52) AS h FROM adult WHERE sex = 'Male' GROUP BY sex",
    "SELECT MEDIAN(age), COUNT(*) FROM adult",
])
def test_a_query_without_slots_reuses_its_analysis_under_other_options(
        engine: Engine, sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpproxy import session as session_module

    alice = engine.session("alice")
    first = alice.execute(sql)
    fresh = alice._plan(parse_statements(sql)[0])

    def no_analysis(*args: object) -> None:
        raise AssertionError("the shape's analysis should have been reused")

    monkeypatch.setattr(session_module, "analyze", no_analysis)
    alice.set_option("epsilon", 0.25)  # another answer-cache key: planned and charged again
    again = alice.execute(sql)
    assert again.columns == first.columns and again.types == first.types
    assert again.cost is not None and again.cost.epsilon == pytest.approx(0.25)
    planned, shaped = alice._shaped_plan(parse_statements(sql)[0])
    assert isinstance(planned, QueryPlan) and isinstance(fresh, QueryPlan)
    assert shaped is not None and shaped[1] == ()
    assert planned.analysis.statement == fresh.analysis.statement
    alice.set_option("epsilon", 0.1)
    _same_plan(alice._shaped_plan(parse_statements(sql)[0])[0], fresh)  # type: ignore[arg-type]


@pytest.mark.parametrize("sql", [
    'SELECT "Sex", COUNT(*) AS "N" FROM Adult AS A WHERE A.Age > 5 AND "Age" < 7.5 GROUP BY "Sex"',
    "SELECT occupation, AVG(hours_per_week) FROM ADULT WHERE Capital_Gain BETWEEN 1 AND 2 "
    "GROUP BY Occupation ORDER BY 2 DESC LIMIT 3",
    'SELECT COUNT(*) FROM adult WHERE sex = \'a\x00b\' AND age IN (1, -2, 3) AND "ÄgE" > 4',
    "SELECT COUNT(*) AS \"0:x\" FROM adult WHERE age > 5 AND sex <> '\x000:0\x00'",
    'SELECT "select", MAX(Äge) FROM "Adult" WHERE "select" > 1 GROUP BY 1',
    "SELECT MEDIAN(Age) FROM adult",
])
def test_one_print_gives_the_shape_the_text_and_the_normalized_text(engine: Engine,
                                                                    sql: str) -> None:
    """`lift` prints once, with marks, what three prints gave: the shape's SQL, the query's
    SQL (for the ledger and audit log) and its normalized SQL (the answer cache's key),
    even for a query whose own text holds the mark character."""
    statement = parse_statements(sql)[0]
    assert statement.ast is not None
    tree = statement.ast.copy()
    shape = shapes.lift(tree)
    assert shape.text == tree.sql("postgres")
    assert shape.normalized == tree.sql("postgres", normalize=True)
    assert shape.sql == shapes._ShapeGenerator(dialect=shapes._POSTGRES, marks=False
                                               ).generate(tree, copy=True)
    assert shape.key.startswith(shape.sql + "\x00")
    assert shapes.lift(statement.ast.copy(), copy=False) == shape  # printed without a copy
    assert "$slot" not in shape.text and (("$slot" in shape.sql) == bool(shape.values))
    # the session keys the answer cache on the normalized text printed with the shape
    with contextlib.suppress(errors.Error):  # refused or not: the key is remembered first
        engine.session("alice")._shaped_plan(statement)
    assert engine.normalized_query(statement) == shape.normalized


def test_a_stored_answer_is_the_json_it_always_was(alice: Session) -> None:
    """The answer cache stores accuracies field by field (not through asdict's deep copy):
    the same JSON, read back to the same result."""
    import json
    from dataclasses import asdict

    from dpproxy.session import _answer_json, _result_from_json

    result = alice.execute("SELECT sex, COUNT(*), AVG(age) FROM adult GROUP BY sex")
    assert result.accuracy[0] is None and None not in result.accuracy[1:]  # the key has none
    expected = json.dumps({
        "columns": result.columns, "rows": result.rows, "tag": result.tag,
        "types": result.types, "intervals": result.intervals,
        "accuracy": [asdict(a) if a is not None else None for a in result.accuracy]})
    assert _answer_json(result) == expected
    again = _result_from_json(_answer_json(result))
    assert (again.rows, again.accuracy, again.intervals) == (
        [tuple(r) for r in json.loads(json.dumps(result.rows))], result.accuracy,
        result.intervals)


# -- templates: parameters straight into a known shape's slots, without binding -------------

TEMPLATE_VALUES = [7, 0, 123456789012345, -3, 2.5, 0.0, -0.0, -7.25, decimal.Decimal("40.50"),
                   decimal.Decimal("-1"), 1e20, 1.5e-7, 1234567890123456,
                   decimal.Decimal("NaN"), float("inf"), True, "12", None]


@pytest.mark.parametrize(("sql", "first"), [
    ("SELECT COUNT(*) FROM adult WHERE capital_gain > %s", [5]),
    ("SELECT COUNT(*) FROM adult WHERE capital_gain > $1 AND age < $1", [5]),
    ("SELECT sex, COUNT(*) FROM adult WHERE $2 >= age AND capital_gain > -$1 GROUP BY sex",
     [5, 30.5]),
    ("SELECT AVG(hours_per_week) AS h FROM adult WHERE age BETWEEN %s AND 40 AND %s <> age",
     [17, -3]),
])
def test_a_template_gives_the_shape_binding_and_lifting_give(sql: str,
                                                             first: list[Any]) -> None:
    """For every parameter list: the template's shape is exactly the one binding and
    lifting print (key, values, texts), or None where binding could print otherwise."""
    statement = parse_statements(sql, first)[0]
    template = shapes.TemplateShape.of(shapes.lift(statement.ast),
                                       parse_placeholders(statement.template))
    assert template is not None
    matched = 0
    for value in TEMPLATE_VALUES:
        params = [value, *first[1:]] if len(first) > 1 else [value]
        from_template = template.shape_for(params)
        try:
            bound = shapes.lift(parse_statements(sql, params)[0].ast)
        except errors.Error:  # binding refuses it: so must the template
            assert from_template is None
            continue
        if from_template is None:  # binding gives another shape (or none)
            assert bound.key != template.shape.key
            continue
        matched += 1
        assert (from_template.key, from_template.values, from_template.sql,
                from_template.text, from_template.normalized) == (
            bound.key, bound.values, bound.sql, bound.text, bound.normalized)
    assert matched >= 3  # each template takes at least three of the values


def parse_placeholders(template: Any) -> int:
    from dpproxy.parse import placeholder_count

    return placeholder_count(template)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE capital_gain > %s LIMIT %s",  # a count: no slot
    "SELECT COUNT(*) FROM adult WHERE sex = %s",  # a string: no slot
    "SELECT COUNT(*) FROM adult WHERE capital_gain + %s > 3",  # not a bare column
])
def test_a_parameter_outside_a_slot_gives_no_template(sql: str) -> None:
    params = [5, 1] if "LIMIT" in sql else ["x"] if "sex" in sql else [5]
    statement = parse_statements(sql, params)[0]
    assert shapes.TemplateShape.of(shapes.lift(statement.ast),
                                   parse_placeholders(statement.template)) is None


def _templated_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each `Session._templated` call (from now on) found a template."""
    from dpproxy import session as session_module

    calls: list[bool] = []
    templated = session_module.Session._templated

    def spy(self: Session, statement: Any) -> Any:
        found = templated(self, statement)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(session_module.Session, "_templated", spy)
    return calls


def test_templated_queries_answer_as_bound_ones(engine: Engine,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Executions of a parameterized text after its first skip binding: each is charged
    and planned as the bound query, and its answer is the one the same query sent with
    literals gets (one answer key)."""
    alice = engine.session("alice")
    sql = "SELECT occupation, COUNT(*) FROM adult WHERE capital_gain > %s GROUP BY occupation"
    calls = _templated_calls(monkeypatch)
    values = (1000, 2000, 3000, -5, 2.5, -7, 3.5, 4000, -9.5, "7", "8")
    results = [alice.execute(sql, [v]) for v in values]
    # the first binds and learns the template; later ones of the same kind of number use
    # it; -5 (a sign) and 2.5 (a decimal) are other kinds, bound the first time and then
    # templates of their own (-7, 3.5); 4000 still finds the first. -9.5 is a fourth kind;
    # a string never lands in a slot, so it is always bound
    assert calls == [False, True, True, False, False, True, True, True, False, False, False]
    assert len(engine.templates(sql)) == 4
    history = engine.ledger.history("analyst:alice")
    assert [h.statement for h in history[::-1]] == [
        parse_statements(sql, [v])[0].ast.sql("postgres") for v in values]
    spent = alice.remaining()
    literal = alice.execute(sql.replace("%s", "3000"))
    assert alice.remaining() == spent  # the same answer key: answered, not charged
    assert literal.rows == results[2].rows
    # options apply to a templated query as to any: it is planned afresh
    alice.set_option("epsilon", 0.25)
    again = alice.execute(sql, [4000])
    assert calls[-1] is True and again.cost is not None and again.cost.epsilon == 0.25


def test_a_text_without_parameters_is_planned_from_its_template_after_its_first_run(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repeated literal text (with new options, so not from the answer cache) skips
    copying, lifting and printing its tree, and plans, charges and answers as the first."""
    alice = engine.session("alice")
    sql = "SELECT occupation, COUNT(*) FROM adult WHERE capital_gain > 5000 GROUP BY occupation"
    calls = _templated_calls(monkeypatch)
    results = []
    for epsilon in (0.1, 0.2, 0.3):
        alice.set_option("epsilon", epsilon)
        results.append(alice.execute(sql))
    assert calls == [False, True, True]
    assert [r.cost.epsilon for r in results if r.cost is not None] == [0.1, 0.2, 0.3]
    assert [len(r.rows) for r in results] == [14] * 3
    history = engine.ledger.history("analyst:alice")
    assert [h.statement for h in history[::-1]] == [
        parse_statements(sql)[0].ast.sql("postgres")] * 3
    # a plain repeat is answered from the stored answer before any template is looked at
    assert alice.execute(sql).rows == results[-1].rows
    assert calls == [False, True, True] and len(engine.ledger.history("analyst:alice")) == 3
    with pytest.raises(errors.ProgrammingError, match="no placeholders"):
        alice.execute(sql, [5])  # parameters for a text without placeholders: refused
    assert len(engine.ledger.history("analyst:alice")) == 3
