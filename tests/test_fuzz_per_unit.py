"""The differential fuzz of `test_fuzz_errors` over subqueries of values per person
(`dpproxy.analyze.per_unit`): `SELECT … FROM (SELECT person_id, <aggregates of random row
expressions> FROM t [WHERE …] GROUP BY person_id) AS t [WHERE …] [GROUP BY …]`, each sent
twice, with a condition some rows (or people) meet and one nobody meets, placed (a) in
the subquery's WHERE, (b) inside one of its aggregates' arguments (`SUM(CASE WHEN @ THEN
e END)`), or (c) in the outer query over values per person (`WHERE n > 0 AND m = 90`, m =
MAX(age): 43 people, against m = 91: nobody), in its WHERE or under CASE in its aggregate.
Random row expressions, full of quoted literals, sit inside the aggregates, in the inner
WHERE, and outside over the values (clamped by LEAST/GREATEST where summed). Both queries
of a pair must end alike: the same error class, SQLSTATE and charge, or both answered;
nothing but a dpproxy.errors.Error may escape.

Deterministic (fixed seed, fixed demo data). 600 pairs per backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dpproxy.session import Engine

from .test_fuzz_errors import (
    CAST_TYPES,
    CONDITIONS,
    DATE_COLUMNS,
    DAYS,
    DIGITS,
    LENGTHS,
    LIKE_PATTERNS,
    NUMBER_COLUMNS,
    TEXT_COLUMNS,
    Grammar,
    mismatches,
)
from .test_server_support import BIG_BUDGET

BACKENDS = ("duckdb", "postgres")

# A value per person, and a condition on it some people meet and one nobody meets.
PER_PERSON = {
    "adult": [("MAX(age)", "= 90", "= 91"), ("MIN(education_num)", "= 16", "> 16")],
    "visits": [("COUNT(*)", "= 50", "= 51"), ("MAX(amount)", "= 500", "> 500"),
               ("MIN(day)", "= DATE '2024-01-01'", "< DATE '2024-01-01'")],
}
FUNCTIONS = ["COUNT(*)", "COUNT", "COUNT DISTINCT", "SUM", "AVG", "MIN", "MAX"]
CLAMP = "LEAST(GREATEST({}, -100), 100)"


class PerUnitGrammar(Grammar):
    """The Grammar's row expressions inside the subquery (over its table's columns) and
    outside it (over the values per person, by kind, while `outer` is set). One place
    of each query (`hot`) always gets one; the others mostly a plain, valid expression,
    so that enough queries reach the backend."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.outer: dict[str, list[str]] | None = None
        self.hot = ""

    def column(self, kind: str) -> Callable[[], str]:
        if self.outer is None:
            return super().column(kind)
        names = self.outer[kind]
        return (lambda: self.rng.choice(names)) if names else self.literal

    def plain(self, kind: str) -> str:
        """A column of the kind (or a constant), maybe in a simple valid expression."""
        r = self.rng
        names = self.outer if self.outer is not None else {
            "num": NUMBER_COLUMNS[self.table], "text": TEXT_COLUMNS[self.table],
            "date": DATE_COLUMNS[self.table]}
        if kind == "bool":
            return r.choice(["TRUE", f"{self.plain('num')} > 3",
                             f"{self.plain('text')} <> 'x'"])
        column = r.choice(names[kind]) if names[kind] else \
            {"num": "1", "text": "'x'", "date": "DATE '2024-03-01'"}[kind]
        return r.choice([column, column, {
            "num": f"({column} + 1)", "text": f"LOWER({column})",
            "date": f"({column} + 1)"}[kind]])

    def expr(self, kind: str, place: str) -> str:
        """A random row expression of the kind at the hot place (and sometimes
        elsewhere), else a plain one."""
        if place == self.hot and self.rng.random() < 0.4:
            return self.risky(kind)
        if place == self.hot or self.rng.random() < 0.2:
            return self.of_kind(kind, 1)
        return self.plain(kind)

    def risky(self, kind: str) -> str:
        """One of the Grammar's nodes that can fail on a row (a conversion, a division,
        date arithmetic, a pattern built from the row) over random operands."""
        r = self.rng
        text, number = self.column("text"), self.column("num")  # not folded as constants
        return r.choice({
            "num": [lambda: f"CAST({self.text(2)} AS {r.choice(CAST_TYPES[:5])})",
                    lambda: f"CAST({text()} AS {r.choice(CAST_TYPES[:5])})",
                    lambda: f"CAST((CAST({number()} AS TEXT) || {self.literal()}) AS "
                            f"{r.choice(CAST_TYPES[:5])})",
                    lambda: f"({self.number(2)} / ({number()} - {r.choice(['90', '5'])}))",
                    lambda: f"CAST({self.literal()} AS {r.choice(CAST_TYPES[:5])})",
                    lambda: f"({self.number(2)} {r.choice(['/', '%'])} {self.number(2)})",
                    lambda: f"ROUND({self.number(2)}, {r.choice(DIGITS)})",
                    lambda: f"({self.date(2)} - {self.date(2)})"],
            "text": [lambda: f"SUBSTRING({self.text(2)}, {self.number(2)}, "
                             f"{r.choice(LENGTHS)})",
                     lambda: f"CAST({self.any(2)} AS TEXT)"],
            "date": [lambda: f"CAST({self.text(2)} AS DATE)",
                     lambda: f"CAST({text()} AS DATE)",
                     lambda: f"CAST((CAST({number()} AS TEXT) || {self.literal()}) AS DATE)",
                     lambda: f"({self.date(2)} {r.choice('+-')} {r.choice(DAYS)})",
                     lambda: f"({self.date(2)} + {self.number(2)})"],
            "bool": [lambda: f"CAST({self.text(2)} AS BOOLEAN)",
                     lambda: f"CAST({text()} AS BOOLEAN)",
                     lambda: f"{self.text(2)} LIKE ({self.text(2)} || "
                             f"{r.choice(LIKE_PATTERNS)})",
                     lambda: f"{self.number(2)} > {self.literal()}"],
        }[kind])()

    def value(self, i: int, condition: str | None) -> tuple[str, str]:
        """One aggregate per person, with `condition` (if any) under CASE WHEN in its
        argument; and the kind of value it is outside."""
        r = self.rng
        function = r.choice(FUNCTIONS)
        if function == "COUNT(*)":
            if condition is None:
                return "COUNT(*)", "num"
            function = "COUNT"
        if function.startswith("COUNT"):
            kind, argument_kind = "num", r.choice(["num", "text", "date", "bool"])
        elif function in ("SUM", "AVG"):
            kind = argument_kind = "num"
        else:
            kind = argument_kind = r.choice(["num", "num", "text", "date"])
        argument = self.expr(argument_kind, f"v{i}")
        if condition is not None:
            otherwise = f" ELSE {self.literal()}" if r.random() < 0.25 else ""
            argument = f"CASE WHEN {condition} THEN {argument}{otherwise} END"
        if function == "COUNT DISTINCT":
            return f"COUNT(DISTINCT {argument})", kind
        return f"{function}({argument})", kind

    def inner_where(self, condition: str | None) -> str:
        r = self.rng
        if condition is None:
            return f" WHERE {self.expr('bool', 'where')}" if r.random() < 0.3 else ""
        return r.choice([
            lambda: f" WHERE {condition}",
            lambda: f" WHERE {condition} AND {self.expr('bool', 'where')}",
            lambda: f" WHERE CASE WHEN {condition} THEN {self.expr('bool', 'where')} "
                    "ELSE FALSE END",
        ])()

    def query_pair(self) -> tuple[str, str]:
        """One query over values per person, with each condition in place of @."""
        r = self.rng
        self.table, self.outer = r.choice(["adult", "adult", "visits"]), None
        place = r.choice(["inner where", "argument", "outer"])
        met, unmet = r.choice(CONDITIONS[self.table])
        size = r.randint(1, 3)
        # the place a row reaches or not (the inner WHERE's rows, v0's CASE) is hot
        # more often: whatever is evaluated there only for some rows must not tell
        inner = [f"v{i}" for i in range(size)]
        self.hot = r.choice({"inner where": [*inner, *inner, "where", "outer"],
                             "argument": ["v0", "v0", "v0", *inner, "where", "outer"],
                             "outer": [*inner, "where", "outer", "outer", "outer"]}[place])
        values: list[tuple[str, str, str]] = []  # (aggregate, name, kind)
        for i in range(size):
            aggregate, kind = self.value(i, "@" if place == "argument" and i == 0 else None)
            values.append((aggregate, f"v{i}", kind))
        condition = "@"
        if place == "outer":
            aggregate, met, unmet = r.choice(PER_PERSON[self.table])
            kind = "date" if "day" in aggregate else "num"
            values.insert(r.randint(0, len(values)), (aggregate, "pv", kind))
            condition = "pv @"
        where = self.inner_where("@" if place == "inner where" else None)
        unit = "person_id, " if r.random() < 0.8 else ""
        items = ", ".join(f"{aggregate} AS {name}" for aggregate, name, _ in values)
        inner = f"SELECT {unit}{items} FROM {self.table}{where} GROUP BY person_id"
        self.outer = {kind: [n for _, n, k in values if k == kind]
                      for kind in ("num", "text", "date")}
        numbers = [n for n in self.outer["num"] if n != "pv"]
        if place != "outer":
            test = self.expr("bool", "outer") if r.random() < 0.5 else "TRUE"
        elif numbers and r.random() < 0.5:
            test = f"{r.choice(numbers)} >= 0 AND {condition}"
        else:
            test = condition
        outer = r.choice([
            lambda: f"SELECT COUNT(*) FROM # WHERE {test} AND {self.expr('bool', 'outer')}",
            lambda: f"SELECT COUNT(*) FROM # WHERE CASE WHEN {test} THEN "
                    f"{self.expr('bool', 'outer')} ELSE FALSE END",
            lambda: f"SELECT SUM({CLAMP.format(self.expr('num', 'outer'))}) FROM # "
                    f"WHERE {test}",
            lambda: f"SELECT AVG({CLAMP.format(self.expr('num', 'outer'))}), COUNT(*) "
                    f"FROM # WHERE {test}",
            lambda: f"SELECT SUM(CASE WHEN {test} THEN "
                    f"{CLAMP.format(self.expr('num', 'outer'))} ELSE 0 END) FROM #",
            lambda: f"SELECT COUNT(*) FILTER (WHERE {test}) FROM # "
                    f"WHERE {self.expr('bool', 'outer')}",
            lambda: f"SELECT {self.expr(r.choice(['num', 'text', 'date', 'bool']), 'outer')}"
                    f" AS k, COUNT(*) FROM # WHERE {test} GROUP BY 1",
        ])()
        if r.random() < 0.2:
            sql = f"WITH t AS ({inner}) {outer.replace('#', 't')}"
        else:
            sql = outer.replace("#", f"({inner}) AS t")
        return sql.replace("@", met), sql.replace("@", unmet)


@pytest.mark.parametrize(("seed", "count"), [(20261215, 600)])
def test_per_person_outcome_does_not_depend_on_whether_a_row_is_reached(
        make_policy: Callable[..., Path], seed: int, count: int) -> None:
    with Engine.from_path(make_policy(BIG_BUDGET)) as engine:
        session = engine.session("alice", epsilon=1.0)
        found, answered = mismatches(session, seed, count, PerUnitGrammar)
    assert not found, f"{len(found)} data-dependent outcomes:\n\n" + "\n\n".join(found)
    assert answered >= count // 10, answered  # enough pairs run on the backend
