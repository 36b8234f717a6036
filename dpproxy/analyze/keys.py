"""Group keys over row expressions: their type, and their public values when known.

`GROUP BY age / 10 * 10` groups by a value computed from each row. Which groups exist
is public when the expression reads one column whose values the policy declares
(`public_values`, or the grid of a `public_range`): the key set is the expression's
image of those values, computed here on the literal list alone, in an in-memory
DuckDB, through the same total expression the backend runs. Nothing private is read.
Otherwise the key's values are private and its groups pass partition selection.

>>> from sqlglot import parse_one
>>> from dpproxy.policy import ColumnPolicy, PublicRange, TablePolicy
>>> age = ColumnPolicy("age", "int", 17, 90, public_range=PublicRange(17, 90, 1))
>>> sex = ColumnPolicy("sex", "text", public_values=("Female", "Male"))
>>> t = TablePolicy("t", {"age": age, "sex": sex})
>>> key_values(parse_one("age / 10 * 10", read="postgres"), age, "int", t)
(10, 20, 30, 40, 50, 60, 70, 80, 90)
>>> key_values(parse_one("LOWER(sex)", read="postgres"), sex, "text", t)
('female', 'male')
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

import duckdb
from sqlglot import exp

from ..policy import ColumnPolicy, ColumnType, TablePolicy
from .expressions import ExprType

# DuckDB starts centuries and millennia at year 2000, PostgreSQL at 2001.
_TRUNC_UNITS_THAT_DIFFER = ("century", "millennium")
_DUCKDB_TYPES = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "date": "DATE",
                 "bool": "BOOLEAN"}


def key_type(t: ExprType) -> ColumnType:
    """The column type a key expression's values have (PostgreSQL names them int8,
    float8, text, date, bool); quoted literals and NULL group as text."""
    if t.kind == "num":
        return "int" if t.integer else "float"
    if t.kind in ("date", "bool"):
        return t.kind  # type: ignore[return-value]
    return "text"


def normalize_key(value: Any, column_type: str) -> Any:
    """A key value from either backend or the enumeration, as released: ints for whole
    numbers (DuckDB computes them in DOUBLE, PostgreSQL in NUMERIC), floats, ISO dates
    (DATE_TRUNC gives a midnight TIMESTAMP), text.

    >>> normalize_key(Decimal("40"), "int"), normalize_key(40.0, "int")
    (40, 40)
    >>> normalize_key(dt.datetime(2024, 3, 1), "date")
    '2024-03-01'
    """
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.date().isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if column_type == "int" and isinstance(value, float | Decimal):
        number = float(value)
        return int(number) if math.isfinite(number) and number.is_integer() else number
    if column_type == "float" and isinstance(value, int | float | Decimal):
        # + 0.0: -0.0 is 0.0 (both backends group them as one, keyed by either spelling)
        return float(value) + 0.0
    return value


def enumerable(expression: exp.Expression, typer: Callable[[exp.Expression], ExprType]
               ) -> bool:
    """Whether both backends compute exactly the key values the enumeration does.

    DuckDB computes numbers in DOUBLE, PostgreSQL in NUMERIC: they agree on whole numbers
    built from whole-number constants, not on `age / 4.0` (or its text, 4.25 vs
    4.2500000000000000), so such keys go through partition selection instead.

    >>> from sqlglot import parse_one
    >>> from dpproxy.policy import ColumnPolicy
    >>> cols = {"age": ColumnPolicy("age", "int", 17, 90)}
    >>> from dpproxy.analyze.expressions import type_row_expression as typed
    >>> [enumerable(parse_one(q, read="postgres"), lambda n: typed(n, cols))
    ...  for q in ("age / 10 * 10", "age / 4.0", "CAST(age * 1.5 AS TEXT)", "age > 40.5")]
    [True, False, False, False]

    DATE_TRUNC to a century or millennium differs between the two (DuckDB starts them at
    2000, PostgreSQL at 2001): also not enumerated.
    """
    t = typer(expression)
    if t.kind == "num" and not t.integer:
        return False
    for literal in expression.find_all(exp.Literal):
        if not literal.is_string and not _whole(literal.this):
            return False
    for cast in expression.find_all(exp.Cast, exp.TryCast):
        source = typer(cast.this)
        if source.kind == "num" and not source.integer:
            return False
    for trunc in expression.find_all(exp.DateTrunc, exp.TimestampTrunc):
        unit = trunc.args.get("unit")
        if unit is not None and unit.name.lower() in _TRUNC_UNITS_THAT_DIFFER:
            return False
    return True


def _whole(text: str) -> bool:
    try:
        return Decimal(text) == Decimal(text).to_integral_value()
    except ArithmeticError:
        return False


def key_values(expression: exp.Expression, column: ColumnPolicy, column_type: str,
               table: TablePolicy) -> tuple[Any, ...] | None:
    """The distinct non-NULL values of `expression` over the column's public values, in
    the order of the first public value yielding each (data-independent); None when DuckDB
    cannot evaluate it on them (the key is then treated as private)."""
    # imported here: the rewrite imports the analyzer
    from ..rewrite import make_total

    domain = column.public_domain
    assert domain is not None
    single = TablePolicy(table.name, {column.name: column})
    total = make_total(expression, single, "duckdb").sql("duckdb")
    try:
        return _image(total, column.name, column.type, domain, column_type)
    except duckdb.Error:
        # depends on public values only, so nothing leaks; partition selection still works
        return None


@lru_cache(maxsize=256)
def _image(total: str, name: str, source_type: str, domain: tuple[Any, ...],
           column_type: str) -> tuple[Any, ...]:
    # the same query repeats (dashboards): a repeated enumeration costs a dict lookup
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            f"SELECT {total} FROM (SELECT CAST(UNNEST($1) AS {_DUCKDB_TYPES[source_type]}) "
            f"AS {exp.to_identifier(name, quoted=True).sql('duckdb')}, "
            "generate_subscripts($1, 1) AS __i) ORDER BY __i",
            [list(domain)]).fetchall()
    finally:
        con.close()
    seen: dict[Any, None] = {}
    for (value,) in rows:
        normal = normalize_key(value, column_type)
        if normal is not None:
            seen.setdefault(normal, None)
    return tuple(seen)
