"""Subqueries in FROM that compute values per privacy unit: a table of one row per unit.

`SELECT n, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id)
AS t GROUP BY n` is the histogram of people by visits. The subquery groups by the table's
privacy unit, so each unit is exactly one of its rows, whatever its rows in `visits`:
adding or removing a unit adds or removes one row of the subquery. The outer query is then
an ordinary DP query over a table without a privacy unit (each row its own unit), at most
one row and one group per unit. The subquery's values are computed exactly from all of a
unit's rows and never released as they are: the outer query clamps each one to the bounds
derived here (`derive`) wherever it sums or ranks it, as it clamps a table's columns.

What the subquery may compute, per unit, over a row expression `e` of its table:
COUNT(*) (at least 1, no upper bound), COUNT(e) and COUNT(DISTINCT e) (at least 0),
SUM(e) (e's sign bounds it on one side), AVG(e), MIN(e) and MAX(e) (within e's bounds).
Unbounded values can still be counted, grouped and filtered; to sum or average them the
outer query clamps them, e.g. `AVG(LEAST(n, 50))`.

>>> from sqlglot import parse_one
>>> inner = parse_one("SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id")
>>> grouped_column(inner)
'person_id'
>>> grouped_column(parse_one("SELECT person_id FROM visits")) is None
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from ..errors import NotSupportedError, UndefinedColumn
from ..policy import AnalystPolicy, ColumnPolicy, Policy, TablePolicy
from ..postprocess import output_name
from .expressions import (
    Resolver,
    coerce_literals,
    date_bounds,
    make_resolver,
    type_row_expression,
)
from .ldp import reject_raw_local
from .tables import private_table

Function = Literal["count", "count_distinct", "sum", "avg", "min", "max"]

# Clauses the subquery may not have: each would make its rows other than one per unit
_NOT_PER_UNIT = {
    "having": "HAVING", "distinct": "DISTINCT", "limit": "LIMIT", "offset": "OFFSET",
    "order": "ORDER BY", "windows": "WINDOW", "qualify": "QUALIFY", "laterals": "LATERAL",
    "sample": "TABLESAMPLE", "pivots": "PIVOT", "joins": "JOIN", "with_": "WITH",
}
_WHAT = "a subquery computing values per person"
_FUNCTIONS: dict[type[exp.Expression], Function] = {
    exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}
_ALLOWED = "COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM(x), AVG(x), MIN(x) and MAX(x)"
# What a count is on both engines (as `ColumnPolicy.storage` names types): a key of it is
# read as it is. The type of any other value depends on its argument's: left unknown.
_COUNT_TYPE = "bigint"


@dataclass(frozen=True)
class PerUnitValue:
    """One value the subquery computes per unit: `function` of a row expression of the
    table (`argument`; None for COUNT(*)), named `name` outside."""

    name: str
    function: Function
    argument: exp.Expression | None


@dataclass(frozen=True)
class PerUnit:
    """The subquery: `values` per unit of `table` over its rows passing `where`. Its rows
    are read by the outer query as the table `derived()` describes."""

    table: TablePolicy  # the table the subquery reads
    where: exp.Expression | None
    values: tuple[PerUnitValue, ...]
    columns: tuple[ColumnPolicy, ...]  # the values' columns, as the outer query reads them

    @property
    def unit(self) -> str:
        assert self.table.privacy_unit is not None
        return self.table.privacy_unit

    def derived(self) -> TablePolicy:
        """The subquery as a table: one row per unit, so no privacy unit of its own (each
        row is one), the table's name (its grants and total budget are the table's). Its
        membership is private whatever the table's: its values are computed from the
        rows, never a public roster."""
        return TablePolicy(self.table.name, {c.name: c for c in self.columns},
                           privacy_unit=None, max_groups_per_unit=1, max_rows_per_unit=1,
                           total_budget=self.table.total_budget, membership="private")

    def describe(self) -> str:
        """The values as EXPLAIN lists them."""
        return ", ".join(f"{v.name} = {_written(v)}" for v in self.values)


def _written(value: PerUnitValue) -> str:
    if value.argument is None:
        return "COUNT(*)"
    argument = value.argument.sql("postgres")
    if value.function == "count_distinct":
        return f"COUNT(DISTINCT {argument})"
    return f"{value.function.upper()}({argument})"


def grouped_column(inner: exp.Expression) -> str | None:
    """The one column a subquery groups by, when it groups by one bare column and
    aggregates (the shape of values per unit); None otherwise."""
    if not isinstance(inner, exp.Select):
        return None
    group = inner.args.get("group")
    keys = group.expressions if group is not None else []
    if len(keys) != 1 or not isinstance(keys[0], exp.Column) \
            or isinstance(keys[0].this, exp.Star) or inner.find(exp.AggFunc) is None:
        return None
    return keys[0].name


def derive(select: exp.Select, source: exp.Subquery, policy: Policy, analyst: AnalystPolicy
           ) -> PerUnit:
    """The subquery in `select`'s FROM as values per unit, or the refusal saying why it is
    not one (raised before anything is charged)."""
    inner = source.this
    assert isinstance(inner, exp.Select)
    key = grouped_column(inner)
    table_node = inner.args["from_"].this if inner.args.get("from_") is not None else None
    if key is None or not isinstance(table_node, exp.Table):
        raise NotSupportedError("subqueries in FROM are not supported here",
                                hint="query the table directly")
    table = private_table(table_node, policy, analyst)
    group_column = inner.args["group"].expressions[0]
    if group_column.table and group_column.table.lower() not in (
            table_node.name.lower(), table_node.alias_or_name.lower()):
        raise UndefinedColumn(f"missing FROM-clause entry for table {group_column.table!r}",
                              hint=f"the subquery reads {table_node.alias_or_name}")
    if table.privacy_unit is None or key.lower() != table.privacy_unit.lower():
        _refuse_values_per_group(key, table_node)
    for arg, clause in _NOT_PER_UNIT.items():
        if inner.args.get(arg):
            raise NotSupportedError(f"{_WHAT} with {clause} is not supported",
                                    hint="filter with WHERE inside, the rest outside")
    if select.args.get("joins"):
        raise NotSupportedError(f"joins over {_WHAT} are not supported",
                                hint="read the subquery alone; join in a query of its own")
    resolve = make_resolver(table.name, table_node.alias or None, table.columns)
    where = inner.args.get("where")
    predicate = None
    if where is not None:
        reject_raw_local(where.this, resolve, "WHERE")
        predicate = coerce_literals(where.this, resolve)
        if type_row_expression(predicate, resolve).kind not in ("bool", "null"):
            raise NotSupportedError("the subquery's WHERE must be a condition",
                                    hint="compare the value, e.g. WHERE x > 0")
    values: list[PerUnitValue] = []
    columns: list[ColumnPolicy] = []
    unit_names: list[str] = []
    for item in inner.expressions:
        body = item.this if isinstance(item, exp.Alias) else item
        name = output_name(item)
        if isinstance(body, exp.Column) and not isinstance(body.this, exp.Star) \
                and body.name.lower() == key.lower():
            unit_names.append(name)
            continue
        value, column = _value(body, name, resolve)
        if any(c.name.lower() == name.lower() for c in columns) or name.lower() in (
                n.lower() for n in unit_names):
            raise NotSupportedError(f"{_WHAT} names two columns {name!r}",
                                    hint="give each value its own name: COUNT(*) AS n")
        values.append(value)
        columns.append(column)
    if not values:
        raise NotSupportedError(f"{_WHAT} computes no value",
                                hint=f"compute one, e.g. SELECT {key}, COUNT(*) AS n …")
    _refuse_unit_outside(select, unit_names, key)
    return PerUnit(table, predicate, tuple(values), tuple(columns))


def _refuse_values_per_group(key: str, table: exp.Table) -> None:
    """Values per group of a column other than the privacy unit: a unit may be in many
    such groups, so its rows there are not one row of its own. The hint is the one query
    that gives a mean per value of that column.

    >>> from sqlglot import parse_one
    >>> try:
    ...     _refuse_values_per_group("city", parse_one("SELECT 1 FROM visits").find(exp.Table))
    ... except NotSupportedError as refused:
    ...     print(refused.message)
    a subquery computing a value per city (GROUP BY city) is not supported
    """
    name = table.sql("postgres")
    raise NotSupportedError(
        f"a subquery computing a value per {key} (GROUP BY {key}) is not supported",
        hint=f"only values per privacy unit (GROUP BY the table's privacy unit); for a mean "
             f"per {key}, divide in one query: SELECT COUNT(*) * 1.0 / COUNT(DISTINCT {key}) "
             f"FROM {name} (SUM(x) / COUNT(DISTINCT {key}) for a sum per {key})")


def _value(node: exp.Expression, name: str, resolve: Resolver
           ) -> tuple[PerUnitValue, ColumnPolicy]:
    """One value per unit and the column the outer query reads it as."""
    function = _FUNCTIONS.get(type(node))
    if function is None or node.args.get("expressions"):
        raise NotSupportedError(
            f"{_WHAT} may compute {_ALLOWED}, not {node.sql('postgres')}",
            hint="compute the rest in the outer query")
    argument = node.this
    if isinstance(argument, exp.Star):
        if function != "count":
            raise NotSupportedError(f"{node.sql('postgres')} is not supported",
                                    hint="COUNT(*) counts a unit's rows")
        return (PerUnitValue(name, "count", None), ColumnPolicy(
            name, "int", lower=1, upper=None, nullable=False, storage=_COUNT_TYPE))
    if isinstance(argument, exp.Distinct):
        if function != "count" or len(argument.expressions) != 1:
            raise NotSupportedError(f"{node.sql('postgres')} is not supported",
                                    hint="COUNT(DISTINCT x) of one expression")
        function, argument = "count_distinct", argument.expressions[0]
    reject_raw_local(argument, resolve, "a value per person")
    argument = coerce_literals(argument, resolve)
    typed = type_row_expression(argument, resolve)
    value = PerUnitValue(name, function, argument)
    if function in ("count", "count_distinct"):
        return value, ColumnPolicy(name, "int", lower=0, upper=None, nullable=False,
                                   storage=_COUNT_TYPE)
    if function in ("sum", "avg") and typed.kind != "num":
        raise NotSupportedError(f"{node.sql('postgres')} needs a number, got {typed.kind}",
                                hint="sum or average a numeric expression")
    if typed.kind not in ("num", "date", "text"):
        raise NotSupportedError(f"{node.sql('postgres')} of a {typed.kind} is not supported",
                                hint="MIN and MAX of numbers, dates or text")
    kind = "date" if typed.kind == "date" else "text" if typed.kind == "text" \
        else "int" if typed.integer and function != "avg" else "float"
    lower, upper = _finite(typed.lower), _finite(typed.upper)
    if kind == "date":
        lower, upper = (_finite(b) for b in date_bounds(argument, resolve))
    if function == "sum":
        # n ≥ 1 values of one sign: their sum keeps that sign and is at least the smallest
        # (at most the largest) bound, with no other bound however many rows there are
        lower = lower if lower is not None and lower >= 0 else None
        upper = upper if upper is not None and upper <= 0 else None
    public = None
    if function in ("min", "max") and isinstance(argument, exp.Column):
        # the least or greatest of a column's values is one of them: its public values
        # stay public (a value outside them is dropped as a key, as the column's would be)
        column = resolve(argument)
        public = column.public_values
    return value, ColumnPolicy(name, kind, lower=lower if kind != "text" else None,
                               upper=upper if kind != "text" else None,
                               public_values=public, nullable=typed.nullable)


def _finite(bound: float) -> float | None:
    return bound if math.isfinite(bound) else None


def _refuse_unit_outside(select: exp.Select, unit_names: list[str], key: str) -> None:
    """The unit's column identifies a person: outside the subquery it is refused by name
    (a raw identifier), with how to count people instead."""
    names = {n.lower() for n in unit_names} | {key.lower()}
    for column in select.find_all(exp.Column):
        if isinstance(column.this, exp.Star) or column.name.lower() not in names:
            continue
        if any(isinstance(a, exp.Subquery) for a in _ancestors(column)):
            continue  # the subquery's own use
        raise NotSupportedError(
            f"{column.sql('postgres')} identifies a person: outside {_WHAT} it may not be "
            "read", hint="each row of the subquery is one person: COUNT(*) counts them")


def _ancestors(node: exp.Expression) -> list[exp.Expression]:
    out = []
    parent = node.parent
    while parent is not None:
        out.append(parent)
        parent = parent.parent
    return out
