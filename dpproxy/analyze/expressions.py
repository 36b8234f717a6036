"""Type and bound row expressions: the interval-arithmetic pass.

Every expression evaluated on private rows (WHERE predicates, aggregate
arguments, group keys) goes through `type_row_expression`. It accepts only an
allowlist of deterministic node types, so whatever reaches the backend is a
function we know how to make total (no data-dependent errors), and it derives
value bounds from the policy's column metadata.

>>> from sqlglot import parse_one
>>> from dpproxy.policy import ColumnPolicy
>>> cols = {"age": ColumnPolicy("age", "int", 17, 90, nullable=False)}
>>> t = type_row_expression(parse_one("age * 52 - 100", read="postgres"), cols)
>>> (t.kind, t.lower, t.upper, t.integer)
('num', 784.0, 4580.0, True)
>>> t = type_row_expression(parse_one("LEAST(GREATEST(age / 0.5, 0), 100)", read="postgres"), cols)
>>> (t.lower, t.upper)
(34.0, 100.0)
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

from sqlglot import exp

from ..clock import DAYS, EPOCH, constant_date, day_number, parse_date
from ..errors import (
    DatatypeMismatch,
    GroupingError,
    InvalidParameterValue,
    InvalidTextRepresentation,
    NotSupportedError,
    ProgrammingError,
    UndefinedColumn,
)
from ..policy import ColumnPolicy
from ..postprocess import written_name
from . import regex, to_char

Kind = Literal["num", "text", "date", "bool", "null", "unknown"]
INF = math.inf

# Node types whose value is a truth value; their operands only need compatible kinds.
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ,
                exp.NullSafeNEQ)
_NUMERIC_TYPES = {
    exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT, exp.DataType.Type.INT128, exp.DataType.Type.FLOAT,
    exp.DataType.Type.DOUBLE, exp.DataType.Type.DECIMAL, exp.DataType.Type.UTINYINT,
    exp.DataType.Type.USMALLINT, exp.DataType.Type.UINT, exp.DataType.Type.UBIGINT,
}
_INTEGER_TYPES = {
    exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT, exp.DataType.Type.INT128, exp.DataType.Type.UTINYINT,
    exp.DataType.Type.USMALLINT, exp.DataType.Type.UINT, exp.DataType.Type.UBIGINT,
}
_TEXT_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR,
               exp.DataType.Type.NCHAR, exp.DataType.Type.NVARCHAR}
_DATE_TYPES = {exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP,
               exp.DataType.Type.TIMESTAMPTZ}
# Bounds of EXTRACT(part FROM date); parts not listed are unbounded (e.g. year).
_EXTRACT_BOUNDS: dict[str, tuple[float, float]] = {
    "month": (1, 12), "day": (1, 31), "dow": (0, 6), "isodow": (1, 7), "doy": (1, 366),
    "quarter": (1, 4), "hour": (0, 23), "minute": (0, 59), "week": (1, 53),
}
# EXTRACT fields, and whether their values are whole numbers (seconds can be fractional).
_EXTRACT_PARTS: dict[str, bool] = {
    "year": True, "month": True, "day": True, "dow": True, "isodow": True, "doy": True,
    "quarter": True, "hour": True, "minute": True, "week": True, "decade": True,
    "century": True, "millennium": True, "isoyear": True,
    "second": False, "epoch": False, "milliseconds": False, "microseconds": False,
}
DATE_TRUNC_UNITS = ("microseconds", "milliseconds", "second", "minute", "hour", "day", "week",
                    "month", "quarter", "year", "decade", "century", "millennium")
_ROW_FUNCTIONS_HELP = (
    "+ - * / %, ABS, ROUND, FLOOR, CEIL, TRUNC, LEAST, GREATEST, CASE, COALESCE, NULLIF, CAST, "
    "comparisons, AND/OR/NOT, IN (list), BETWEEN, LIKE/ILIKE, IS NULL, LOWER, UPPER, LENGTH, "
    "TRIM, SUBSTRING, ||, ~ and ~* (regular expressions), EXTRACT, DATE_TRUNC, "
    "TO_CHAR(date, format), WIDTH_BUCKET with constant bounds, EXTRACT(YEAR FROM AGE(a, b))"
)


_BINARY = frozenset({"this", "expression"})
# The arguments each handler reads (types or checks). sqlglot parses more than the handlers
# know (ROUND's third argument, CAST … DEFAULT … ON CONVERSION ERROR, FLOOR(x TO DAY),
# BETWEEN SYMMETRIC); an argument no handler reads would reach the backend untyped, where
# whether it fails could depend on the rows, or be dropped from the rewrite unseen. So any
# other argument that holds a value is refused. Flags that change only the spelling
# (Literal.is_string, Coalesce.is_nvl …) are listed too.
_READS: dict[type[exp.Expression], frozenset[str]] = {
    exp.Column: frozenset({"this", "table", "db", "catalog"}),
    exp.Literal: frozenset({"this", "is_string"}),
    exp.Null: frozenset(),
    exp.Boolean: frozenset({"this"}),
    exp.Paren: frozenset({"this"}),
    exp.Alias: frozenset({"this", "alias"}),
    exp.Neg: frozenset({"this"}),
    exp.Abs: frozenset({"this"}),
    exp.Div: frozenset({"this", "expression", "typed"}),
    exp.Round: frozenset({"this", "decimals"}),
    exp.Floor: frozenset({"this", "decimals"}),
    exp.Ceil: frozenset({"this", "decimals"}),
    exp.Trunc: frozenset({"this", "decimals"}),
    exp.Least: frozenset({"this", "expressions", "ignore_nulls"}),
    exp.Greatest: frozenset({"this", "expressions", "ignore_nulls"}),
    exp.Case: frozenset({"this", "ifs", "default"}),
    exp.If: frozenset({"this", "true", "false"}),
    exp.Coalesce: frozenset({"this", "expressions", "is_nvl", "is_null"}),
    exp.Cast: frozenset({"this", "to"}),
    exp.TryCast: frozenset({"this", "to"}),
    exp.Not: frozenset({"this"}),
    exp.Is: frozenset({"this", "expression", "negate"}),  # IS NOT: typed alike
    exp.Like: frozenset({"this", "expression", "negate"}),
    exp.ILike: frozenset({"this", "expression", "negate"}),
    exp.In: frozenset({"this", "expressions", "query", "unnest"}),  # the last two refused
    exp.Between: frozenset({"this", "low", "high"}),
    exp.RegexpLike: frozenset({"this", "expression", "flag"}),  # a flag is refused
    exp.RegexpILike: frozenset({"this", "expression", "flag"}),
    exp.Lower: frozenset({"this"}),
    exp.Upper: frozenset({"this"}),
    exp.Trim: frozenset({"this", "expression", "position"}),
    exp.Length: frozenset({"this"}),
    exp.Substring: frozenset({"this", "start", "length"}),
    exp.DPipe: frozenset({"this", "expression", "safe"}),
    exp.Concat: frozenset({"expressions", "safe", "coalesce"}),
    exp.Extract: frozenset({"this", "expression"}),
    exp.DateTrunc: frozenset({"this", "unit", "input_type_preserved"}),
    exp.TimestampTrunc: frozenset({"this", "unit", "input_type_preserved"}),
    exp.TimeToStr: frozenset({"this", "format"}),
}  # others (+, -, *, %, AND, OR, comparisons): this and expression


def check_arguments(node: exp.Expression, reads: frozenset[str], hint: str) -> None:
    """Refuse (0A000) an argument of node holding a value that is not among `reads`."""
    for key, value in node.args.items():
        if key in reads or value is None or value is False \
                or (isinstance(value, list) and not value):
            continue
        name = written_name(node) if isinstance(node, exp.Func) else node.key.upper()
        raise NotSupportedError(
            f"{name} with {_ARGUMENT_NAMES.get(key, f'its {key} argument')} is not supported",
            hint=hint)


def _check_arguments(node: exp.Expression) -> None:
    """Refuse an argument of node that its handler does not read (see _READS)."""
    check_arguments(node, _READS.get(type(node), _BINARY), f"supported: {_ROW_FUNCTIONS_HELP}")


_ARGUMENT_NAMES = {
    "truncate": "a third argument", "fractions_supported": "a third argument",
    "expressions": "more than one argument", "accuracy": "a second argument",
    "default": "DEFAULT … ON CONVERSION ERROR", "to": "TO <unit>", "symmetric": "SYMMETRIC",
    "zone": "a time zone (dates have none)", "collation": "COLLATE",
    "encoding": "an encoding", "count": "a count",
}


@dataclass(frozen=True)
class ExprType:
    """What the analyzer knows of a row expression's values."""

    kind: Kind
    lower: float = -INF
    upper: float = INF
    integer: bool = False
    nullable: bool = True
    # of kind "unknown": the quoted literal it is (through parentheses), which the typer
    # records when a context reads it as a number, date or boolean (`_RowTyper.coercions`)
    literal: exp.Literal | None = field(default=None, compare=False, repr=False)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.lower) and math.isfinite(self.upper)


def _num(lower: float, upper: float, integer: bool, nullable: bool) -> ExprType:
    lo, hi = float(lower), float(upper)
    if math.isnan(lo) or math.isnan(hi):
        lo, hi = -INF, INF
    return ExprType("num", lo, hi, integer, nullable)


def _mul(a: float, b: float) -> float:
    # 0 × ∞ = 0 here: a factor that is exactly 0 makes the product 0 whatever the other is
    if a == 0 or b == 0:
        return 0.0
    return a * b


def _quotient(x: float, y: float) -> float:
    if math.isinf(y):
        return 0.0 if math.isfinite(x) else (INF if (x > 0) == (y > 0) else -INF) * 1.0
    return x / y


def _compatible(a: ExprType, b: ExprType) -> bool:
    if "null" in (a.kind, b.kind) or "unknown" in (a.kind, b.kind):
        return True  # NULL and quoted literals coerce (PostgreSQL's "unknown" type)
    return a.kind == b.kind


def constant_digits(node: exp.Expression) -> int | None:
    """The number of digits of ROUND(x, n) or TRUNC(x, n) when n is a whole constant,
    possibly negative (tens, hundreds…); else None.

    >>> from sqlglot import parse_one
    >>> [constant_digits(parse_one(t, read="postgres")) for t in ("2", "-1", "(-3)", "a")]
    [2, -1, -3, None]
    """
    sign = 1
    while isinstance(node, exp.Paren | exp.Neg | exp.Cast):  # (the total form casts it)
        sign = -sign if isinstance(node, exp.Neg) else sign
        node = node.this
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    try:
        value = float(node.this)
    except ValueError:
        return None
    return sign * int(value) if value.is_integer() and abs(value) < 10_000 else None


def written_sql(node: exp.Expression) -> str:
    """A row expression's SQL for EXPLAIN and messages: where the analyzer folded a call into
    another form (WIDTH_BUCKET into a CASE, a MODE's public values into their positions),
    the call as written (the form keeps it in `meta["written"]`), else the canonical SQL.

    >>> from sqlglot import parse_one
    >>> case = parse_one("CASE WHEN a < 0 THEN 0 END", read="postgres")
    >>> case.meta["written"] = "WIDTH_BUCKET(a, 0, 1, 1)"
    >>> written_sql(exp.Add(this=case, expression=exp.Literal.number(1)))
    'WIDTH_BUCKET(a, 0, 1, 1) + 1'

    A constant date, which the parser reads as a cast, reads as a date literal again:

    >>> written_sql(parse_one("day - DATE '2024-01-01'", read="postgres"))
    "day - DATE '2024-01-01'"
    """
    def as_written(n: exp.Expression) -> exp.Expression:
        if "written" in n.meta:
            return exp.Var(this=n.meta["written"])
        if isinstance(n, exp.Cast) and n.to.is_type(exp.DataType.Type.DATE) \
                and isinstance(n.this, exp.Literal) and n.this.is_string:
            return exp.Var(this=f"DATE {n.this.sql('postgres')}")
        return n

    if not any("written" in n.meta or isinstance(n, exp.Cast) for n in node.walk()):
        return node.sql("postgres")
    return node.transform(as_written).sql("postgres")


def column_name(node: exp.Column) -> str:
    return node.name


Resolver = Callable[[exp.Column], ColumnPolicy]


def make_resolver(table_name: str, alias: str | None, columns: Mapping[str, ColumnPolicy]
                  ) -> Resolver:
    """A function mapping a column reference to its policy, or raising 42703."""
    qualifiers = {table_name.lower()} | ({alias.lower()} if alias else set())

    def resolve(node: exp.Column) -> ColumnPolicy:
        if node.table and node.table.lower() not in qualifiers:
            raise UndefinedColumn(
                f"missing FROM-clause entry for table {node.table!r}",
                hint=f"columns of {table_name} can be written as {table_name}.column")
        policy = by_name(columns, node.name, quoted(node))
        if policy is None:
            raise UndefinedColumn(
                f"column {node.name!r} does not exist in table {table_name}",
                hint=f"columns of {table_name}: {', '.join(columns)}")
        if policy.storage == "":
            # refused before anything is charged: running it could only fail
            raise UndefinedColumn(
                f"column {node.name!r} of table {table_name} is in the policy but not in "
                "the database", hint="ask the data owner to fix the policy")
        if not readable_as_declared(policy):
            # each value would be converted per row, and a row the conversion fails on
            # would fail the query: whether it did would tell that such a row exists
            raise DatatypeMismatch(
                f"column {node.name!r} of table {table_name} is declared {policy.type} in "
                f"the policy but stored as {policy.storage}",
                hint="ask the data owner to declare it text, or to store it as "
                     + {"date": "a date or timestamp", "bool": "a boolean or a number"}.get(
                         policy.type, "a number"))
        return policy

    return resolve


def readable_as_declared(column: ColumnPolicy) -> bool:
    """Whether every value of the column's database type reads as its declared type
    (`read_as_declared`): any type as text; numbers and booleans as int or float;
    booleans and numbers as bool; dates and timestamps as date. An unknown type (None)
    is taken as declared. Any other pair converts per row, and a row it fails on failed
    the query after the charge (on DuckDB, a DATE declared int: only where a row
    reached it).

    >>> from dpproxy.policy import ColumnPolicy as C
    >>> [readable_as_declared(C("c", t, storage=s)) for t, s in [("int", "decimal(18,3)"),
    ...  ("bool", "smallint"), ("date", "timestamp with time zone"), ("text", "uuid")]]
    [True, True, True, True]
    >>> [readable_as_declared(C("c", t, storage=s)) for t, s in [("int", "date"),
    ...  ("bool", "timestamp"), ("date", "integer"), ("float", "varchar"), ("bool", "bit")]]
    [False, False, False, False, False]
    """
    storage = (column.storage or "").lower()
    if column.storage is None or column.type == "text" or column.ldp is not None:
        return True  # a local-DP column's reports are read by dpproxy.ldp, as stored
    if column.type in ("int", "float"):
        return storage == "boolean" or stores_number(storage)
    if column.type == "bool":
        return storage == "boolean" or (stores_number(storage) and storage != "money")
    return column.type != "date" or storage == "date" or storage.startswith("timestamp")


# Number types as either backend names them (`ColumnPolicy.storage`; DECIMAL and NUMERIC
# with or without their precision)
_NUMBER_STORAGE = frozenset({
    "tinyint", "smallint", "integer", "bigint", "hugeint", "utinyint", "usmallint",
    "uinteger", "ubigint", "uhugeint", "float", "double", "real", "double precision",
    "numeric", "decimal", "money"})


def stores_number(storage: str | None) -> bool:
    """Whether a column's database type holds numbers.

    >>> stores_number("decimal(10,2)"), stores_number("double precision"), stores_number("date")
    (True, True, False)
    """
    name = (storage or "").lower()
    return name in _NUMBER_STORAGE or name.startswith(("decimal(", "numeric("))


# Text types as either backend names them (`ColumnPolicy.storage`): the backend reads such
# a column as text itself
_TEXT_STORAGE = frozenset({"varchar", "text", "character varying", "character", "bpchar",
                           "citext", "name"})


def reads_as_text(storage: str | None) -> bool:
    """Whether a column of this database type compares, matches and concatenates as text
    by itself: a text type, or a type not read (None). Any other column declared text
    (uuid, json, an enum, a timestamp, a list) is read as its text (`read_as_declared`).

    >>> reads_as_text("character varying"), reads_as_text("varchar"), reads_as_text(None)
    (True, True, True)
    >>> reads_as_text("uuid"), reads_as_text("enum('a', 'b')"), reads_as_text("jsonb")
    (False, False, False)
    """
    return storage is None or storage.lower() in _TEXT_STORAGE


def read_as_declared(bare: exp.Column, column: ColumnPolicy) -> exp.Expression:
    """A column read as the type the policy declares, where the database stores another
    that converts to it on every value: any type declared text as its text, a timestamp
    declared date as its day, a boolean declared a number as 1 or 0, a number declared
    bool as whether it is not 0. Read as stored, `u = 'x'` converted 'x' to a uuid, and
    MIN of a timestamp declared date failed, after the charge (where a row reached it);
    PostgreSQL could not plan `WHERE flag` over a smallint or SUM of a boolean."""
    storage = (column.storage or "").lower()
    if column.ldp is not None:
        # randomized reports (a BOOLEAN[] of unary encoding, a BOOLEAN of randomized
        # response), read by the local-DP rewrite as stored: as text, report[k] was the
        # k-th character of '[true, false, false]'
        return bare
    if column.type == "text" and not reads_as_text(column.storage):
        return exp.cast(bare, exp.DataType.build("TEXT"))
    if column.type == "date" and storage.startswith("timestamp"):
        return exp.cast(bare, exp.DataType.build("DATE"))
    if column.type in ("int", "float") and storage == "boolean":
        return exp.cast(bare, exp.DataType.build("INT"))
    if column.type in ("int", "float") and storage == "money":  # PostgreSQL's: exact
        return exp.cast(bare, exp.DataType.build("DECIMAL"))
    if column.type == "bool" and stores_number(storage):
        return exp.paren(exp.NEQ(this=bare, expression=exp.Literal.number(0)), copy=False)
    return bare


def rebuilt(node: exp.Expression,
            rebuild: Callable[[exp.Expression, exp.Expression], exp.Expression]
            ) -> exp.Expression:
    """A copy of `node` in which each node is replaced by `rebuild(old, new)`, children
    first: `new` is the copy of the original `old` over its children rebuilt already (it
    may be returned, changed or not, or adopted by the replacement). The children a node
    holds in a list are set once per list: sqlglot's set() of one list item walks the
    whole list, so an IN list of 8,000 literals, replaced one by one, took seconds."""
    root = node.copy()
    original = list(node.dfs())
    copied = list(root.dfs())
    pending: dict[int, dict[str, dict[int, exp.Expression]]] = {}  # id(parent) → list items
    for old, new in zip(reversed(original), reversed(copied), strict=True):
        for key, items in pending.pop(id(new), {}).items():
            children = list(new.args[key])
            for index, child in items.items():
                children[index] = child
            new.set(key, children)
        # where `new` sits, read before a replacement may adopt it as a child
        parent, key, index = new.parent, new.arg_key, new.index
        replacement = rebuild(old, new)
        if replacement is new:
            continue
        if new is root:
            root = replacement
        elif index is None:
            assert parent is not None
            parent.set(key, replacement)
        else:
            pending.setdefault(id(parent), {}).setdefault(key, {})[index] = replacement
    return root


_V = TypeVar("_V")


def by_name(named: Mapping[str, _V], name: str, exactly: bool) -> _V | None:
    """What `name` names in `named`: exactly where it was quoted ("Age" names Age alone,
    as in PostgreSQL), else itself or the one name equal to it in any case."""
    found = named.get(name)
    if found is not None or exactly:
        return found
    return next((v for k, v in named.items() if k.lower() == name.lower()), None)


def quoted(node: exp.Expression) -> bool:
    """Whether a column's, table's or bare identifier's name was quoted: then it names
    exactly, as in PostgreSQL, where an unquoted one is folded."""
    identifier = node if isinstance(node, exp.Identifier) else node.this
    return isinstance(identifier, exp.Identifier) and bool(identifier.quoted)


def type_row_expression(node: exp.Expression, columns: Mapping[str, ColumnPolicy] | Resolver
                        ) -> ExprType:
    """Type and bound a deterministic row expression; reject anything off the allowlist."""
    resolve = columns if callable(columns) else make_resolver("", None, columns)
    return _RowTyper(resolve).visit(node)


class _RowTyper:
    def __init__(self, resolve: Resolver) -> None:
        self.resolve = resolve
        # id(literal) → (quoted literal, the kind a context reads it as): `coerce_literals`
        # types each one, as PostgreSQL does when it parses (DuckDB would convert it only
        # when a row reaches it, so whether a query failed would depend on the data)
        self.coercions: dict[int, tuple[exp.Literal, Kind]] = {}

    def _read_as(self, t: ExprType, kind: Kind) -> None:
        if t.kind == "unknown" and t.literal is not None and kind in ("num", "date", "bool"):
            self.coercions[id(t.literal)] = (t.literal, kind)

    def _unify(self, a: ExprType, b: ExprType) -> None:
        """Two operands compared or combined: a quoted literal is read as the other's kind."""
        self._read_as(a, b.kind)
        self._read_as(b, a.kind)

    def _read_all(self, types: list[ExprType]) -> Kind | None:
        """Operands compared with one another (IN's subject and items, BETWEEN's, CASE x
        WHEN's): every quoted literal among them is read as the first typed one's kind,
        which it returns (None: no operand is typed)."""
        kinds = {t.kind for t in types} - {"unknown", "null"}
        if len(kinds) > 1:  # '%' IN (occupation, 3): PostgreSQL finds no common type
            raise DatatypeMismatch(f"values of different types compared: "
                                   f"{', '.join(sorted(kinds))}",
                                   hint="compare values of one type, or CAST one side")
        kind = next(iter(kinds), None)
        if kind is not None:
            for t in types:
                self._read_as(t, kind)
        return kind

    def visit(self, node: exp.Expression) -> ExprType:
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is not None:
            _check_arguments(node)
            return handler(node)
        if isinstance(node, _COMPARISONS):
            _check_arguments(node)
            return self._comparison(node)
        if isinstance(node, exp.AggFunc):
            raise GroupingError(
                f"aggregate {node.sql('postgres')} is not allowed inside a row expression",
                hint="aggregates may appear in the SELECT list, HAVING and ORDER BY only, "
                     "and never nested")
        if isinstance(node, exp.Window):
            raise NotSupportedError("window functions are not supported",
                                    hint="use GROUP BY with COUNT, SUM or AVG")
        if isinstance(node, exp.Subquery | exp.Select | exp.Exists):
            raise NotSupportedError("subqueries are not supported in row expressions",
                                    hint="filter with a predicate on the table's own columns")
        if isinstance(node, exp.Placeholder | exp.Parameter):
            raise ProgrammingError("a query parameter was not bound to a value",
                                   hint="pass one parameter per placeholder")
        name = node.sql("postgres") if not isinstance(node, exp.Func) else written_name(node)
        raise NotSupportedError(
            f"{name} is not supported in a row expression",
            hint=f"supported: {_ROW_FUNCTIONS_HELP}")

    # leaves -------------------------------------------------------------------------------
    def _Column(self, node: exp.Column) -> ExprType:
        if isinstance(node.this, exp.Star):
            raise NotSupportedError("* is only allowed as COUNT(*)")
        col = self.resolve(node)
        if col.type in ("int", "float"):
            lo = col.lower if col.lower is not None else -INF
            hi = col.upper if col.upper is not None else INF
            return _num(lo, hi, col.type == "int", col.nullable)
        return ExprType(col.type, nullable=col.nullable)  # type: ignore[arg-type]

    def _Literal(self, node: exp.Literal) -> ExprType:
        if node.is_string:
            return ExprType("unknown", nullable=False, literal=node)
        value = float(node.this)
        return _num(value, value, float(value).is_integer() and "." not in node.this
                    and "e" not in node.this.lower(), False)

    def _Null(self, node: exp.Null) -> ExprType:
        return ExprType("null")

    def _Boolean(self, node: exp.Boolean) -> ExprType:
        return ExprType("bool", nullable=False)

    def _Paren(self, node: exp.Paren) -> ExprType:
        return self.visit(node.this)

    def _Alias(self, node: exp.Alias) -> ExprType:
        return self.visit(node.this)

    # arithmetic ----------------------------------------------------------------------------
    def _numeric(self, node: exp.Expression, what: str) -> ExprType:
        inner = node.this if isinstance(node, exp.Neg) else node
        if isinstance(inner, exp.Literal) and inner.meta.get(DAYS):
            raise DatatypeMismatch(f"{what} of an INTERVAL needs a date",
                                   hint="add days to a date: day + INTERVAL '7 days'")
        t = self.visit(node)
        if t.kind == "null":
            return ExprType("num")
        if t.kind == "unknown":
            self._read_as(t, "num")
            return ExprType("num", nullable=False)  # '3' + 1 is 4 in PostgreSQL
        if t.kind != "num":
            raise DatatypeMismatch(f"{what} needs a number, got {t.kind}: {node.sql('postgres')}")
        return t

    def _Neg(self, node: exp.Neg) -> ExprType:
        # a negative interval of days is Neg(days): judged by the + or - it stands in
        t = self.visit(node.this) if node.this.meta.get(DAYS) else self._numeric(node.this,
                                                                               "minus")
        return replace(t, lower=-t.upper, upper=-t.lower)

    def _date_offset(self, offset: exp.Expression) -> None:
        # A computed offset could push any date out of range on some rows only: an error
        # that would depend on the data. A constant below 10^6 days can overflow only the
        # dates near the ends of the range, which the rewrite shifts to NULL instead.
        inner = offset.this if isinstance(offset, exp.Neg) else offset
        if not (isinstance(inner, exp.Literal) and not inner.is_string
                and inner.this.isdigit() and len(inner.this) <= 6):
            raise NotSupportedError("date arithmetic takes a constant whole number of days",
                                    hint="write day + 7, not day + <column>")

    def _Add(self, node: exp.Add) -> ExprType:
        a, b = self.visit(node.this), self.visit(node.expression)
        if "date" in (a.kind, b.kind):
            self._date_offset(node.expression if a.kind == "date" else node.this)
            _check_shifts(node)
            return ExprType("date", nullable=a.nullable or b.nullable)
        a, b = self._numeric(node.this, "+"), self._numeric(node.expression, "+")
        return _num(a.lower + b.lower, a.upper + b.upper, a.integer and b.integer,
                    a.nullable or b.nullable)

    def _Sub(self, node: exp.Sub) -> ExprType:
        a, b = self.visit(node.this), self.visit(node.expression)
        if a.kind == "date" and b.kind == "date":
            # days between: bounded by the dates' bounds (a policy's, a constant, a clamp)
            (a_lo, a_hi), (b_lo, b_hi) = (date_bounds(node.this, self.resolve),
                                          date_bounds(node.expression, self.resolve))
            return _num(a_lo - b_hi, a_hi - b_lo, True, a.nullable or b.nullable)
        if a.kind == "date":
            self._date_offset(node.expression)
            _check_shifts(node)
            return ExprType("date", nullable=a.nullable or b.nullable)
        a, b = self._numeric(node.this, "-"), self._numeric(node.expression, "-")
        return _num(a.lower - b.upper, a.upper - b.lower, a.integer and b.integer,
                    a.nullable or b.nullable)

    def _Mul(self, node: exp.Mul) -> ExprType:
        a, b = self._numeric(node.this, "*"), self._numeric(node.expression, "*")
        products = [_mul(x, y) for x in (a.lower, a.upper) for y in (b.lower, b.upper)]
        return _num(min(products), max(products), a.integer and b.integer,
                    a.nullable or b.nullable)

    def _Div(self, node: exp.Div) -> ExprType:
        a, b = self._numeric(node.this, "/"), self._numeric(node.expression, "/")
        integer = a.integer and b.integer and bool(node.args.get("typed"))
        # A divisor that can be 0 is rewritten to NULLIF(divisor, 0): the result may be NULL
        # and, unless the divisor is bounded away from 0, it is unbounded.
        if b.lower > 0 or b.upper < 0:
            # The divisor stays on one side of 0; a/b is monotone in each argument there, so
            # the extremes are at the corners. An infinite divisor end contributes a/±∞ = 0.
            quotients = [_quotient(x, y) for x in (a.lower, a.upper) for y in (b.lower, b.upper)]
            lo, hi = min(quotients), max(quotients)
            if integer:
                lo = float(math.trunc(lo)) if math.isfinite(lo) else lo
                hi = float(math.trunc(hi)) if math.isfinite(hi) else hi
            return _num(lo, hi, integer, a.nullable or b.nullable)
        return _num(-INF, INF, integer, True)

    def _Mod(self, node: exp.Mod) -> ExprType:
        a, b = self._numeric(node.this, "%"), self._numeric(node.expression, "%")
        m = max(abs(b.lower), abs(b.upper))
        reach = min(max(abs(a.lower), abs(a.upper)), m)
        lo = 0.0 if a.lower >= 0 else -reach
        hi = 0.0 if a.upper <= 0 else reach
        return _num(lo, hi, a.integer and b.integer, True)

    def _Abs(self, node: exp.Abs) -> ExprType:
        t = self._numeric(node.this, "ABS")
        lo = 0.0 if t.lower <= 0 <= t.upper else min(abs(t.lower), abs(t.upper))
        return replace(t, lower=lo, upper=max(abs(t.lower), abs(t.upper)))

    def _rounding(self, node: exp.Expression, name: str, digits: exp.Expression | None
                  ) -> ExprType:
        t = self._numeric(node.this, name)
        d = 0
        if digits is not None:
            d_or_none = constant_digits(digits)
            if d_or_none is None:
                raise NotSupportedError(f"{name} takes a constant number of digits")
            if d_or_none < -300:
                raise NotSupportedError(f"{name} takes at least -300 digits",
                                        hint="to 10^300 and beyond every double rounds to 0")
            d = d_or_none
        step = 10.0 ** min(-d, 300)
        return replace(t, lower=t.lower - step, upper=t.upper + step, integer=d <= 0)

    def _Round(self, node: exp.Round) -> ExprType:
        return self._rounding(node, "ROUND", node.args.get("decimals"))

    def _Floor(self, node: exp.Floor) -> ExprType:
        return self._rounding(node, "FLOOR", node.args.get("decimals"))

    def _Ceil(self, node: exp.Ceil) -> ExprType:
        return self._rounding(node, "CEIL", node.args.get("decimals"))

    def _Trunc(self, node: exp.Trunc) -> ExprType:
        t = self._rounding(node, "TRUNC", node.args.get("decimals"))
        if not t.integer:
            # DuckDB would truncate the DOUBLE (0.29 · 100 is 28.999…: 0.28), PostgreSQL the
            # NUMERIC (0.29): whole tens, hundreds… only
            raise NotSupportedError(
                "TRUNC to decimal places is not supported: the two backends' arithmetic "
                "differs there", hint="TRUNC(x), TRUNC(x, -1) (tens) or ROUND(x, digits)")
        return t

    def _extremum(self, node: exp.Expression, smallest: bool) -> ExprType:
        args = [node.this, *node.expressions]
        types = [self.visit(a) for a in args]
        kinds = {t.kind for t in types} - {"null", "unknown"}
        if len(kinds) > 1:
            raise DatatypeMismatch(f"{node.sql_name()} arguments have different types: "
                                   f"{', '.join(sorted(kinds))}")
        for t in types:
            self._read_as(t, next(iter(kinds)) if kinds else "text")
        if kinds and kinds != {"num"}:
            return ExprType(kinds.pop(), nullable=all(t.nullable for t in types))
        if not kinds and any(t.kind == "unknown" for t in types):
            return ExprType("text", nullable=all(t.nullable for t in types))  # as _union's
        nums = [t if t.kind == "num" else ExprType("num", nullable=t.kind == "null")
                for t in types]
        # NULL arguments are skipped, so a nullable argument may be absent: only arguments
        # that are never NULL constrain the result from the other side.
        present = [t for t in nums if not t.nullable]
        if smallest:
            lo = min(t.lower for t in nums)
            hi = min(t.upper for t in present) if present else max(t.upper for t in nums)
        else:
            hi = max(t.upper for t in nums)
            lo = max(t.lower for t in present) if present else min(t.lower for t in nums)
        return _num(lo, hi, all(t.integer for t in nums), not present)

    def _Least(self, node: exp.Least) -> ExprType:
        return self._extremum(node, smallest=True)

    def _Greatest(self, node: exp.Greatest) -> ExprType:
        return self._extremum(node, smallest=False)

    def _union(self, types: list[ExprType], nullable: bool, what: str) -> ExprType:
        kinds = {t.kind for t in types} - {"null", "unknown"}
        if len(kinds) > 1:
            raise DatatypeMismatch(f"{what} branches have different types: "
                                   f"{', '.join(sorted(kinds))}")
        for t in types:
            self._read_as(t, next(iter(kinds)) if kinds else "text")
        # quoted literals alone make text, as in PostgreSQL: never a value of no type that
        # DuckDB would convert to a number, date or boolean only when a row reaches it
        kind = kinds.pop() if kinds else ("text" if any(t.kind == "unknown" for t in types)
                                          else "null")
        if kind != "num":
            return ExprType(kind, nullable=nullable)  # type: ignore[arg-type]
        nums = [t for t in types if t.kind == "num"]
        if any(t.kind == "unknown" for t in types):
            return ExprType("num", nullable=nullable)
        return _num(min(t.lower for t in nums), max(t.upper for t in nums),
                    all(t.integer for t in nums), nullable)

    def _Case(self, node: exp.Case) -> ExprType:
        if node.this is not None:  # CASE x WHEN v THEN ...: compare x with each v
            subject = self.visit(node.this)
            values = [self.visit(branch.this) for branch in node.args.get("ifs", [])]
            self._read_all([subject, *values])
            for branch, value in zip(node.args.get("ifs", []), values, strict=True):
                if not _compatible(subject, value):
                    raise DatatypeMismatch(f"CASE compares {subject.kind} with "
                                           f"{branch.this.sql('postgres')}")
        else:
            for branch in node.args.get("ifs", []):
                self._predicate(branch.this, "CASE WHEN")
        results = [self.visit(b.args["true"]) for b in node.args.get("ifs", [])]
        default = node.args.get("default")
        if default is not None:
            results.append(self.visit(default))
        nullable = default is None or any(t.nullable for t in results)
        return self._union(results, nullable, "CASE")

    def _If(self, node: exp.If) -> ExprType:
        self._predicate(node.this, "IF")
        branches = [self.visit(node.args["true"])]
        false = node.args.get("false")
        if false is not None:
            branches.append(self.visit(false))
        return self._union(branches, false is None or any(t.nullable for t in branches), "IF")

    def _Coalesce(self, node: exp.Coalesce) -> ExprType:
        types = [self.visit(a) for a in (node.this, *node.expressions)]
        return self._union(types, all(t.nullable for t in types), "COALESCE")

    def _Nullif(self, node: exp.Nullif) -> ExprType:
        a, b = self.visit(node.this), self.visit(node.expression)
        kind = self._read_all([a, b])
        if not _compatible(a, b):
            raise DatatypeMismatch(f"NULLIF compares {a.kind} with {b.kind}")
        if a.kind == "unknown":  # a literal read as b's kind, or text as _union's
            return ExprType(kind or "text")
        return replace(a, nullable=True)

    def _cast(self, node: exp.Cast | exp.TryCast) -> ExprType:
        source = self.visit(node.this)
        target = node.to.this
        if target in _NUMERIC_TYPES:
            integer = target in _INTEGER_TYPES
            if source.kind == "num":
                lo, hi = source.lower, source.upper
                if integer:  # rounding to the nearest integer moves a value by at most 1/2
                    lo = math.floor(lo - 0.5) if math.isfinite(lo) else lo
                    hi = math.ceil(hi + 0.5) if math.isfinite(hi) else hi
                return _num(lo, hi, integer, source.nullable or isinstance(node, exp.TryCast))
            return _num(-INF, INF, integer, True)  # a failed cast becomes NULL (TRY_CAST)
        if target in _TEXT_TYPES:
            if node.to.expressions:
                # PostgreSQL pads CHAR(n) to n characters and cuts VARCHAR(n) to n, DuckDB
                # does neither: the backends would disagree (and CHAR(10485760) makes every
                # row 10 MB)
                raise NotSupportedError(
                    f"CAST to {node.to.sql('postgres')} is not supported: text casts take no "
                    "length", hint="CAST(x AS TEXT), and SUBSTRING(x FROM 1 FOR n) to cut it")
            return ExprType("text", nullable=source.nullable)
        if target in _DATE_TYPES:
            return ExprType("date", nullable=True)
        if target == exp.DataType.Type.BOOLEAN:
            return ExprType("bool", nullable=True)
        raise NotSupportedError(f"CAST to {node.to.sql('postgres')} is not supported",
                                hint="cast to a number, text, date or boolean type")

    def _Cast(self, node: exp.Cast) -> ExprType:
        return self._cast(node)

    def _TryCast(self, node: exp.TryCast) -> ExprType:
        return self._cast(node)

    # predicates ---------------------------------------------------------------------------
    def _predicate(self, node: exp.Expression, where: str) -> ExprType:
        t = self.visit(node)
        if t.kind not in ("bool", "null"):
            raise DatatypeMismatch(f"argument of {where} must be a boolean, got {t.kind}: "
                                   f"{node.sql('postgres')}")
        return t

    def _comparison(self, node: exp.Expression) -> ExprType:
        a, b = self.visit(node.this), self.visit(node.expression)
        self._unify(a, b)
        if not _compatible(a, b):
            raise DatatypeMismatch(
                f"cannot compare {a.kind} with {b.kind}: {node.sql('postgres')}",
                hint="compare values of the same type, or CAST one side")
        return ExprType("bool", nullable=a.nullable or b.nullable)

    def _logical(self, node: exp.Expression) -> ExprType:
        a = self._predicate(node.this, node.key.upper())
        b = self._predicate(node.expression, node.key.upper())
        return ExprType("bool", nullable=a.nullable or b.nullable)

    def _And(self, node: exp.And) -> ExprType:
        return self._logical(node)

    def _Or(self, node: exp.Or) -> ExprType:
        return self._logical(node)

    def _Not(self, node: exp.Not) -> ExprType:
        return self._predicate(node.this, "NOT")

    def _Is(self, node: exp.Is) -> ExprType:
        subject = self.visit(node.this)
        if not isinstance(node.expression, exp.Null | exp.Boolean):
            raise NotSupportedError("IS is supported with NULL, TRUE and FALSE")
        if isinstance(node.expression, exp.Boolean) and subject.kind not in ("bool", "null"):
            # DuckDB would convert text to a boolean only when a row reaches it
            raise DatatypeMismatch(f"IS {node.expression.sql('postgres')} needs a boolean, got "
                                   f"{'text' if subject.kind == 'unknown' else subject.kind}")
        return ExprType("bool", nullable=False)

    def _In(self, node: exp.In) -> ExprType:
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise NotSupportedError("IN (subquery) is not supported",
                                    hint="list the values: x IN ('a', 'b')")
        subject = self.visit(node.this)
        items = [self.visit(item) for item in node.expressions]
        self._read_all([subject, *items])  # '5' IN (age, 'x'): all read as numbers
        for item, t in zip(node.expressions, items, strict=True):
            if not _compatible(subject, t):
                raise DatatypeMismatch(f"IN list item {item.sql('postgres')} does not match "
                                       f"{subject.kind}")
        return ExprType("bool")

    def _Between(self, node: exp.Between) -> ExprType:
        subject = self.visit(node.this)
        bounds = [self.visit(node.args["low"]), self.visit(node.args["high"])]
        self._read_all([subject, *bounds])
        for bound, t in zip((node.args["low"], node.args["high"]), bounds, strict=True):
            if not _compatible(subject, t):
                raise DatatypeMismatch(f"BETWEEN bound {bound.sql('postgres')} does not match "
                                       f"{subject.kind}")
        return ExprType("bool")

    def _text_predicate(self, node: exp.Expression) -> ExprType:
        for side in (node.this, node.expression):
            t = self.visit(side)
            if t.kind not in ("text", "unknown", "null"):
                raise DatatypeMismatch(f"{node.key.upper()} needs text, got {t.kind}")
        return ExprType("bool")

    def _Like(self, node: exp.Like) -> ExprType:
        return self._text_predicate(node)

    def _ILike(self, node: exp.ILike) -> ExprType:
        return self._text_predicate(node)

    def _RegexpLike(self, node: exp.RegexpLike) -> ExprType:
        """text ~ 'pattern' (~* too): a constant pattern both backends read alike."""
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string) \
                or node.args.get("flag") is not None:
            raise NotSupportedError("a regular expression must be a constant string",
                                    hint="write text ~ 'pattern'")
        regex.check_pattern(pattern.this)
        return self._text_predicate(node)

    def _RegexpILike(self, node: exp.RegexpILike) -> ExprType:
        return self._RegexpLike(node)  # type: ignore[arg-type]

    # text and dates -----------------------------------------------------------------------
    def _text_of(self, node: exp.Expression, name: str) -> ExprType:
        t = self.visit(node)
        if t.kind not in ("text", "unknown", "null"):
            raise DatatypeMismatch(f"{name} needs text, got {t.kind}")
        return ExprType("text", nullable=t.nullable)

    def _Lower(self, node: exp.Lower) -> ExprType:
        return self._text_of(node.this, "LOWER")

    def _Upper(self, node: exp.Upper) -> ExprType:
        return self._text_of(node.this, "UPPER")

    def _Trim(self, node: exp.Trim) -> ExprType:
        characters = node.args.get("expression")
        if characters is not None:  # TRIM(BOTH chars FROM text): chars is text too
            self._text_of(characters, "TRIM")
        return self._text_of(node.this, "TRIM")

    def _Length(self, node: exp.Length) -> ExprType:
        t = self._text_of(node.this, "LENGTH")
        return _num(0, INF, True, t.nullable)

    def _Substring(self, node: exp.Substring) -> ExprType:
        for arg in ("start", "length"):
            if node.args.get(arg) is not None:
                self._numeric(node.args[arg], "SUBSTRING")
        return self._text_of(node.this, "SUBSTRING")

    def _DPipe(self, node: exp.DPipe) -> ExprType:
        a, b = self.visit(node.this), self.visit(node.expression)
        return ExprType("text", nullable=a.nullable or b.nullable)

    def _Concat(self, node: exp.Concat) -> ExprType:
        for arg in node.expressions:
            self.visit(arg)
        return ExprType("text", nullable=False)

    def _Extract(self, node: exp.Extract) -> ExprType:
        source = self.visit(node.expression)
        self._read_as(source, "date")
        if source.kind not in ("date", "unknown"):
            raise DatatypeMismatch(f"EXTRACT needs a date, got {source.kind}")
        part = node.this.name.lower()
        if part not in _EXTRACT_PARTS:
            raise InvalidParameterValue(f"EXTRACT field {part!r} is not supported",
                                        hint=f"fields: {', '.join(sorted(_EXTRACT_PARTS))}")
        lo, hi = _EXTRACT_BOUNDS.get(part, (-INF, INF))
        if part == "year":  # a date with bounds (the policy's, a constant, a clamp) has years
            lo, hi = _years(*date_bounds(node.expression, self.resolve))
        return _num(lo, hi, _EXTRACT_PARTS[part], source.nullable)

    def _date_trunc(self, unit: exp.Expression | None, value: exp.Expression) -> ExprType:
        if unit is not None and not isinstance(unit, exp.Literal | exp.Var):
            raise NotSupportedError("DATE_TRUNC takes a constant unit such as 'month'")
        if unit is not None and unit.name.lower() not in DATE_TRUNC_UNITS:
            raise InvalidParameterValue(f"DATE_TRUNC unit {unit.name!r} is not recognized",
                                        hint=f"units: {', '.join(DATE_TRUNC_UNITS)}")
        source = self.visit(value)
        self._read_as(source, "date")
        if source.kind not in ("date", "unknown"):
            raise DatatypeMismatch(f"DATE_TRUNC needs a date, got {source.kind}")
        return ExprType("date", nullable=source.nullable)

    def _DateTrunc(self, node: exp.DateTrunc) -> ExprType:
        return self._date_trunc(node.args.get("unit"), node.this)

    def _TimestampTrunc(self, node: exp.TimestampTrunc) -> ExprType:
        return self._date_trunc(node.args.get("unit"), node.this)

    def _TimeToStr(self, node: exp.TimeToStr) -> ExprType:
        """TO_CHAR(date, 'format'): text, NULL outside the years `to_char` reads."""
        source = self.visit(node.this)
        self._read_as(source, "date")
        if source.kind not in ("date", "unknown", "null"):
            raise DatatypeMismatch(f"TO_CHAR needs a date here, got {source.kind}",
                                   hint="format numbers with CAST(… AS TEXT)")
        if not isinstance(node.args.get("format"), exp.Literal):
            raise NotSupportedError("TO_CHAR takes a constant format such as 'YYYY-MM'")
        to_char.parse_format(to_char.format_of(node))
        return ExprType("text", nullable=True)


# -- date bounds ---------------------------------------------------------------------------------
def _years(first_day: float, last_day: float) -> tuple[float, float]:
    """The years of the first and last of a range of day numbers; ±inf where the range is
    open or beyond Python's dates (years 1 to 9999)."""
    def year(day: float) -> float | None:
        if not math.isfinite(day):
            return None
        try:
            return float((EPOCH + dt.timedelta(days=day)).year)
        except OverflowError:
            return None
    lo, hi = year(first_day), year(last_day)
    return (lo if lo is not None else -INF, hi if hi is not None else INF)


def date_bounds(node: exp.Expression, resolve: Resolver) -> tuple[float, float]:
    """Bounds of a date row expression's values as day numbers (`clock.day_number`), ±inf
    where none is known: a date column's policy bounds (`lower`/`upper`, or the ends of
    its `public_range`), a constant date, and LEAST/GREATEST of those (a clamp). NULLs are
    skipped by LEAST and GREATEST, so a clamp bounds whatever it does not leave NULL."""
    if isinstance(node, exp.Paren):
        return date_bounds(node.this, resolve)
    if isinstance(node, exp.Column):
        column = resolve(node)
        if column.type == "date" and column.lower is not None and column.upper is not None:
            return column.lower, column.upper
        if column.type == "date" and column.public_range is not None:
            grid = column.public_range
            return (float(day_number(dt.date.fromisoformat(str(grid.first)))),
                    float(day_number(dt.date.fromisoformat(str(grid.last)))))
        return -INF, INF
    constant = constant_date(node)
    if constant is not None:
        return float(day_number(constant)), float(day_number(constant))
    shifted = _shifted_date(node)
    if shifted is not None:  # date ± n days (NULL where it would leave the calendar)
        lo, hi = date_bounds(shifted[0], resolve)
        return lo + shifted[1], hi + shifted[1]
    if isinstance(node, exp.DateTrunc | exp.TimestampTrunc):  # monotone: its ends truncated
        unit = node.args.get("unit")
        name = unit.name.lower() if unit is not None else "day"
        lo, hi = date_bounds(node.this, resolve)
        if name not in _TRUNCATED:
            return -INF, INF
        return _truncated(lo, name), _truncated(hi, name)
    if isinstance(node, exp.Least | exp.Greatest):
        parts = [date_bounds(a, resolve) for a in (node.this, *node.expressions)]
        pick = min if isinstance(node, exp.Least) else max
        return pick(lo for lo, _ in parts), pick(hi for _, hi in parts)
    return -INF, INF


def _truncated(day: float, unit: str) -> float:
    """DATE_TRUNC(unit, the date of day number `day`) as a day number, as both backends
    truncate (weeks start on Monday); ±inf stays, and so does a day beyond Python's
    dates (an open end there is no tighter)."""
    if not math.isfinite(day):
        return day
    try:
        date = EPOCH + dt.timedelta(days=day)
    except OverflowError:
        return -INF if day < 0 else INF
    return float(day_number(_TRUNCATED[unit](date)))


# Truncation of a date to each unit whose start both backends read alike (below a day:
# the date itself); decades and longer are left unbounded
_TRUNCATED: dict[str, Callable[[dt.date], dt.date]] = {
    **dict.fromkeys(("microseconds", "milliseconds", "second", "minute", "hour", "day"),
                    lambda d: d),
    "week": lambda d: d - dt.timedelta(days=d.weekday()),
    "month": lambda d: d.replace(day=1),
    "quarter": lambda d: d.replace(month=(d.month - 1) // 3 * 3 + 1, day=1),
    "year": lambda d: d.replace(month=1, day=1),
}


MAX_DATE_SHIFTS = 4


def _check_shifts(node: exp.Expression) -> None:
    """Refuse a chain of more than MAX_DATE_SHIFTS date ± n: the rewrite guards each shift
    against the ends of the date range, copying the date it shifts three times, so the
    statement grows as 3^shifts (ten made a query of 100 characters run for a minute)."""
    shifts = 0
    while (shifted := _shifted_date(node)) is not None:
        shifts += 1
        node = shifted[0]
        while isinstance(node, exp.Paren):
            node = node.this
    if shifts > MAX_DATE_SHIFTS:
        raise NotSupportedError(f"more than {MAX_DATE_SHIFTS} date shifts in a row",
                                hint="add the days together: day + 3, not day + 1 + 1 + 1")


def _shifted_date(node: exp.Expression) -> tuple[exp.Expression, int] | None:
    """(date, n) where the node is date + n, n + date or date − n for a constant whole
    number of days n (an interval of days reads as one: `clock.DAYS`), as the typer
    accepts date arithmetic; else None."""
    def days(offset: exp.Expression) -> int | None:
        sign = 1
        while isinstance(offset, exp.Paren | exp.Neg):
            sign = -sign if isinstance(offset, exp.Neg) else sign
            offset = offset.this
        if isinstance(offset, exp.Literal) and not offset.is_string and offset.this.isdigit():
            return sign * int(offset.this)
        return None

    if isinstance(node, exp.Add):
        for date, offset in ((node.this, node.expression), (node.expression, node.this)):
            n = days(offset)
            if n is not None:
                return date, n
    if isinstance(node, exp.Sub):
        n = days(node.expression)
        if n is not None:
            return node.this, -n
    return None


# -- literal coercion ----------------------------------------------------------------------------


def _is_text_literal(node: exp.Expression) -> bool:
    return isinstance(node, exp.Literal) and node.is_string


_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _typed_literal(node: exp.Literal, kind: Kind) -> exp.Expression:
    """The literal read as `kind`, or a 22P02 rejection naming it."""
    text = node.this.strip()
    try:
        if kind == "num":
            # as PostgreSQL 15 reads a number (Python's float() would take 1_000 or inf,
            # which the backend statement could then not parse)
            if not _NUMBER_TEXT.fullmatch(text):
                raise ValueError(text)
            return exp.Literal.number(text)
        if kind == "date":
            return exp.cast(exp.Literal.string(parse_date(text).isoformat()), "DATE")
        if kind == "bool":
            value = {"true": True, "t": True, "yes": True, "on": True, "1": True,
                     "false": False, "f": False, "no": False, "off": False, "0": False}[
                text.lower()]
            return exp.Boolean(this=value)
    except (ValueError, KeyError):
        names = {"num": "a number", "date": "a date (YYYY-MM-DD)", "bool": "a boolean"}
        raise InvalidTextRepresentation(
            f"invalid input syntax for {names[kind]}: {node.this!r}",
            hint="compare with a literal of the column's type") from None
    return node


def coerce_literals(node: exp.Expression, columns: Mapping[str, ColumnPolicy] | Resolver
                    ) -> exp.Expression:
    """A copy where quoted literals compared or combined with numbers, dates or booleans
    are typed literals (validated here, before any charge).

    The backend would otherwise convert such a literal only when a row reaches it, so
    whether the query fails would tell whether a matching row exists.

    >>> from sqlglot import parse_one
    >>> from dpproxy.policy import ColumnPolicy
    >>> cols = {"age": ColumnPolicy("age", "int", 17, 90)}
    >>> coerce_literals(parse_one("age > '40' AND age IN ('1', 2)", read="postgres"), cols).sql()
    'age > 40 AND age IN (1, 2)'
    """
    typer = _RowTyper(columns if callable(columns) else make_resolver("", None, columns))

    def kind_of(n: exp.Expression) -> Kind:
        return typer.visit(n).kind

    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast) \
                and _is_text_literal(n.this) and n.to.this in _DATE_TYPES:
            # DATE '…' as PostgreSQL reads it, in the one form both backends read alike
            # (DuckDB's TRY_CAST would make '20240601' or '2024-06-01 +00' NULL)
            return _typed_literal(n.this, "date")
        if isinstance(n, exp.Add | exp.Sub) and _is_text_literal(n.expression) \
                and kind_of(n.this) == "date":
            # day + '7': the days, a number (the typer takes only a constant number there)
            n.set("expression", _retyped(n.expression, "num"))
        return n

    swapped = node.transform(swap)
    # Everywhere else (comparisons, IN, BETWEEN, arithmetic, LEAST, COALESCE, NULLIF, CASE,
    # a literal in parentheses or under a minus sign, a date function's argument): every
    # quoted literal the typer read as a number, date or boolean is typed, or refused.
    reader = _RowTyper(typer.resolve)
    reader.visit(swapped)
    if not reader.coercions:
        return swapped
    if id(swapped) in reader.coercions:
        literal, kind = reader.coercions[id(swapped)]
        return _typed_literal(literal, kind)  # type: ignore[arg-type]

    def typed(n: exp.Expression) -> exp.Expression:
        coercion = reader.coercions.get(id(n))
        return n if coercion is None else _typed_literal(n, coercion[1])  # type: ignore[arg-type]

    return swapped.transform(typed, copy=False)


def _retyped(node: exp.Expression, kind: Kind) -> exp.Expression:
    if _is_text_literal(node) and kind in ("num", "date", "bool"):
        return _typed_literal(node, kind)  # type: ignore[arg-type]
    return node
