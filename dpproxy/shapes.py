"""Query shapes: queries that differ only in WHERE's number literals share one analysis.

A dashboard or a parameterized client sends the same query again and again with a new
threshold (`… WHERE capital_gain > $1`). Analysis, planning and above all the rewrite
(its SQL generation) do not depend on such a literal, so they are done once per shape:
`lift` marks each such literal as a slot (numbered in order),
the shape's SQL (slots printed as `$slot<n>`) keys a cache of analyses, and the rewrite
prints every slot as a typed backend parameter, bound per execution to the literal of
the query at hand. A slot is an ordinary literal node marked in its `meta` (which
sqlglot copies with the node): it prints and types as the literal it is everywhere else.

Only literals whose value provably changes neither acceptance nor sensitivity are
lifted: a plain decimal number (at most 15 digits, so exact in DOUBLE and far below any
magnitude check) compared with a bare column (`=`, `<>`, `<`, `<=`, `>`, `>=`, either side,
possibly negated), a BETWEEN bound, or an IN list item, of a column the policy declares
numeric. The analyzer types such a literal as a number whatever its value, and the
comparison as a boolean: its value enters no check, no bound and no sensitivity (those
come from aggregates, keys and the table's contribution bounds, never from WHERE). A
shape whose slots the analyzer did not keep intact (`intact`) is not cached.

>>> import sqlglot
>>> tree = sqlglot.parse_one("SELECT COUNT(*) FROM t WHERE a > 40 AND b = 'x'", read="postgres")
>>> shape = lift(tree)
>>> shape.sql, shape.values
("SELECT COUNT(*) FROM t WHERE a > $slot0 AND b = 'x'", ('40',))
>>> tree.sql("postgres")  # a slot prints as its literal everywhere else
"SELECT COUNT(*) FROM t WHERE a > 40 AND b = 'x'"
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.dialects.postgres import Postgres

from .parse import PARAMETER
from .policy import TablePolicy
from .postprocess import output_name

MAX_DIGITS = 15  # every decimal of at most 15 digits converts exactly to its nearest DOUBLE
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


SLOT = "dpproxy_slot"  # meta key of a lifted literal: its index among the query's slots


def slot_index(node: exp.Expression) -> int | None:
    """The slot index of a lifted literal (None for any other node)."""
    return node.meta_get(SLOT) if isinstance(node, exp.Literal) else None


_MARK = "\x00"  # brackets a piece's number in the generator's output
# with the piece's number in a mark: no text of a query can be taken for a mark by chance
_NONCE = secrets.token_hex(8)


class _ShapeGenerator(Postgres.Generator):  # type: ignore[misc]
    """PostgreSQL's SQL, printed once for three texts: each slot and each unquoted identifier
    is printed as a numbered mark, and `pieces` holds, per mark, its text in the shape's key
    (a slot as `$slot<n>`), in the query's SQL, and in its identifier-normalized SQL."""

    def __init__(self, marks: bool = True, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.marks = marks  # False: print the key's text itself (slots as `$slot<n>`)
        self.pieces: list[tuple[str, str, str]] = []
        self.slot_pieces: dict[int, int] = {}  # slot index → its piece's number

    def _mark(self, key: str, plain: str, normalized: str) -> str:
        if not self.marks:
            return key
        self.pieces.append((key, plain, normalized))
        return f"{_MARK}{len(self.pieces) - 1}:{_NONCE}{_MARK}"

    def literal_sql(self, expression: exp.Literal) -> str:
        plain = super().literal_sql(expression)
        index = slot_index(expression)
        if index is None:
            return plain
        # an integer and a decimal are typed apart (the rewrite's parameter types differ)
        key = f"$slot{index}" if expression.this.isdigit() else f"$slot{index}_decimal"
        if self.marks:
            self.slot_pieces[index] = len(self.pieces)
        return self._mark(key, plain, plain)

    def identifier_sql(self, expression: exp.Identifier) -> str:
        plain = super().identifier_sql(expression)
        if expression.quoted or expression.name == expression.name.lower():
            return plain  # normalizing changes nothing
        # `normalize` changes nothing but an unquoted identifier's case (as in PostgreSQL)
        self.normalize = True
        try:
            normalized = super().identifier_sql(expression)
        finally:
            self.normalize = False
        return plain if normalized == plain else self._mark(plain, plain, normalized)


_POSTGRES = Dialect.get_or_raise("postgres")


@dataclass(frozen=True)
class Shape:
    """A bound query with its liftable literals as slots."""

    # the query's SQL with slots as `$slot<n>`, then its output names (which the SQL does
    # not always show: MEDIAN(x) prints as PERCENTILE_CONT(0.5) …); equal keys, equal
    # queries but for the slots' values
    key: str
    values: tuple[str, ...]  # each slot's literal text, in slot order
    sql: str  # the SQL part of the key: without slots, exactly the query's PostgreSQL SQL
    text: str = ""  # the query's PostgreSQL SQL (slots as their literals)
    normalized: str = ""  # the same, identifiers normalized (as `sql(normalize=True)`)
    # per slot: the index of the positional parameter it was bound from (None: a literal of
    # the text), and whether binding negated it (a negative value binds as -literal)
    sources: tuple[tuple[int | None, bool], ...] = ()
    # the marked print and its pieces (`_ShapeGenerator`), to print other slot values
    marked: str = ""
    pieces: tuple[tuple[str, str, str], ...] = ()
    slot_pieces: tuple[int, ...] = ()  # per slot, its piece's number


def _plain_number(node: exp.Expression) -> bool:
    if not isinstance(node, exp.Literal) or node.is_string:
        return False
    return _plain_text(node.this)


def _plain_text(text: str) -> bool:
    """A plain decimal number of at most MAX_DIGITS digits."""
    whole, _, fraction = text.partition(".")
    digits = whole + fraction
    return whole.isdigit() and (fraction == "" or fraction.isdigit()) \
        and len(digits) <= MAX_DIGITS and digits.isascii()


def _liftable(node: exp.Expression) -> bool:
    """A plain number literal in a place where only its type matters to the analyzer."""
    if not _plain_number(node):
        return False
    place: exp.Expression = node
    parent = node.parent
    if isinstance(parent, exp.Neg):
        place, parent = parent, parent.parent
    if isinstance(parent, _COMPARISONS):
        other = parent.expression if place is parent.this else parent.this
        return _bare_column(other)
    if isinstance(parent, exp.Between):
        return place.arg_key in ("low", "high") and _bare_column(parent.this)
    if isinstance(parent, exp.In):
        return place.arg_key == "expressions" and _bare_column(parent.this) \
            and parent.args.get("query") is None and parent.args.get("unnest") is None
    return False


def _bare_column(node: exp.Expression | None) -> bool:
    return isinstance(node, exp.Column) and not isinstance(node.this, exp.Star)


def lift(select: exp.Expression, *, copy: bool = True) -> Shape:
    """Mark, in place, each liftable literal of `select`'s WHERE as a slot; the shape.
    (`select` must be the caller's own tree: a bound query is a fresh copy.) Without
    `copy`, the tree is printed as it is, and the printer may rewrite it: for a caller
    done with it."""
    where = select.args.get("where") if isinstance(select, exp.Select) else None
    values: list[str] = []
    slots: list[exp.Literal] = []
    if where is not None:
        for node in list(where.find_all(exp.Literal)):
            if _liftable(node):
                node.meta[SLOT] = len(values)  # the node stays a literal: it types as one
                values.append(node.this)
                slots.append(node)
    names = [output_name(item) for item in select.expressions] \
        if isinstance(select, exp.Select) else []
    sources = tuple(_source(node) for node in slots)
    generator = _ShapeGenerator(dialect=_POSTGRES)
    marked = generator.generate(select, copy=copy)
    texts = _fill(marked, generator.pieces)
    if texts is None:  # a mark character in the query's own text, or a piece printed twice
        sql = _ShapeGenerator(dialect=_POSTGRES, marks=False).generate(select, copy=True)
        texts = (sql, select.sql("postgres"), select.sql("postgres", normalize=True))
        return Shape("\x00".join([sql, *names]), tuple(values), *texts)
    sql, text, normalized = texts
    printed = len(generator.slot_pieces) == len(values)
    return Shape("\x00".join([sql, *names]), tuple(values), sql, text, normalized, sources,
                 marked if printed else "", tuple(generator.pieces) if printed else (),
                 tuple(generator.slot_pieces[i] for i in range(len(values)))
                 if printed else ())


def _source(node: exp.Literal) -> tuple[int | None, bool]:
    source: tuple[int, bool] | None = node.meta.get(PARAMETER)
    return source if source is not None else (None, False)


@dataclass(frozen=True)
class TemplateShape:
    """A statement whose every placeholder (if any) lands in a slot of one shape: its
    shape for new parameter values, without binding or printing (`shape_for`)."""

    shape: Shape  # the shape as printed for one binding
    arity: int  # how many parameters the statement takes (binding checks it)

    @classmethod
    def of(cls, shape: Shape, placeholders: int) -> TemplateShape | None:
        """The template, if every one of `placeholders` is a slot and the print can be
        refilled (a text without placeholders: always, its shape never changes); else
        None."""
        if placeholders == 0:
            return cls(shape, 0)
        from_parameters = [source for source, _ in shape.sources if source is not None]
        if not shape.marked or len(from_parameters) != placeholders:
            return None
        return cls(shape, max(from_parameters) + 1)

    def shape_for(self, params: Sequence[object]) -> Shape | None:
        """The shape binding `params` and lifting would give: the same key, these values,
        the texts printed with them. None where binding could print otherwise (a value of
        another type, sign or kind of number, or one lift would not take as a slot)."""
        shape = self.shape
        if len(params) != self.arity:
            return None
        if self.arity == 0:
            return shape
        values = list(shape.values)
        pieces = list(shape.pieces)
        for slot, (source, negative) in enumerate(shape.sources):
            if source is None:
                continue
            value = params[source]
            if type(value) not in (int, float, Decimal) \
                    or (isinstance(value, Decimal) and not value.is_finite()) \
                    or (value < 0) != negative:  # type: ignore[operator]
                return None
            text = exp.Literal.number(abs(value)).this  # as `to_literal` binds it
            if not _plain_text(text) or text.isdigit() != values[slot].isdigit():
                return None
            values[slot] = text
            key, _, _ = pieces[shape.slot_pieces[slot]]
            pieces[shape.slot_pieces[slot]] = (key, text, text)
        texts = _fill(shape.marked, pieces)
        if texts is None:
            return None
        return replace(shape, values=tuple(values), text=texts[1], normalized=texts[2],
                       pieces=tuple(pieces))


def _fill(marked: str, pieces: list[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The three texts of a marked print (`_ShapeGenerator`): the shape's SQL, the query's
    SQL and its normalized SQL; None unless every piece is printed exactly once and the
    output holds no other mark character."""
    parts = marked.split(_MARK)
    if len(parts) != 2 * len(pieces) + 1:
        return None
    order = [mark.partition(":") for mark in parts[1::2]]
    if any(nonce != _NONCE or not number.isdigit() for number, _, nonce in order) \
            or sorted(int(n) for n, _, _ in order) != list(range(len(pieces))):
        return None
    texts = []
    for form in range(3):
        out = [parts[0]]
        for (number, _, _), between in zip(order, parts[2::2], strict=True):
            out += [pieces[int(number)][form], between]
        texts.append("".join(out))
    return texts[0], texts[1], texts[2]


def unlift(select: exp.Expression) -> None:
    """Undo `lift`: every slot of `select` is a plain literal again."""
    for node in select.find_all(exp.Literal):
        if node.meta_get(SLOT) is not None:
            del node.meta[SLOT]


def intact(where: exp.Expression | None, values: tuple[str, ...], table: TablePolicy) -> bool:
    """Whether the analyzed WHERE holds every slot once, in a liftable place, against a
    column the policy declares numeric: then the shape's analysis serves every value."""
    slots = [n for n in where.find_all(exp.Literal) if slot_index(n) is not None] \
        if where is not None else []
    if sorted(slot_index(s) for s in slots) != list(range(len(values))):  # type: ignore[type-var]
        return False
    return all(_liftable(s) and s.this == values[slot_index(s)]  # type: ignore[index]
               and _numeric_partner(s, table) for s in slots)


def _numeric_partner(literal: exp.Expression, table: TablePolicy) -> bool:
    place = literal.parent if isinstance(literal.parent, exp.Neg) else literal
    parent = place.parent
    if isinstance(parent, exp.Between | exp.In):
        column = parent.this
    else:
        assert parent is not None
        column = parent.expression if place is parent.this else parent.this
    name = column.name
    policy = table.column(name)
    return policy is not None and policy.type in ("int", "float")


def parameter_type(text: str, dialect: str) -> exp.DataType:
    """The backend type a slot's parameter is cast to: DOUBLE on DuckDB (where numeric
    columns are compared in DOUBLE); on PostgreSQL the literal's own kind, BIGINT or
    NUMERIC, so the comparison is the one PostgreSQL makes with the literal as written."""
    name = "DOUBLE" if dialect != "postgres" else "BIGINT" if text.isdigit() else "DECIMAL"
    return _PARAMETER_TYPES[name].copy()  # parsing the name for each slot cost most of it


_PARAMETER_TYPES = {name: exp.DataType.build(name) for name in ("DOUBLE", "BIGINT", "DECIMAL")}


def parameter_value(text: str) -> int | Decimal:
    """A slot's literal as a backend parameter of the literal's own type: an integer, or
    an exact decimal (never a binary float, which would move 0.1)."""
    return int(text) if text.isdigit() else Decimal(text)
