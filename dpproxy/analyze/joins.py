"""Joins of the private table with public lookup tables (`[tables.x] public = true`).

`resolve_joins` checks `FROM private [AS p] [INNER|LEFT] JOIN public [AS q] ON p.a = q.b
[AND …] | USING (…)`, then hands the other passes a query over one *combined* table: the
private table's columns under their own names and each public column as "<q>.<column>",
where q is the public table's alias (else its name). Every column reference of the query
is rewritten to that one name, so the passes after it (WHERE, keys, aggregates, outputs)
and the rewrite's totality and clamping see one table, as without a join.

>>> from dpproxy.policy import AnalystPolicy, ColumnPolicy, Policy, TablePolicy
>>> from pathlib import Path
>>> from sqlglot import parse_one
>>> p = TablePolicy("p", {"uid": ColumnPolicy("uid", "int"), "k": ColumnPolicy("k", "text")},
...                 privacy_unit="uid")
>>> q = TablePolicy("q", {"k": ColumnPolicy("k", "text", unique=True),
...                       "w": ColumnPolicy("w", "int", 0, 9)}, public=True)
>>> policy = Policy(Path("x.toml"), "db", None, None, {"p": p, "q": q}, {}, Path(), Path())
>>> select = parse_one("SELECT w, SUM(q.w) FROM p JOIN q USING (k) GROUP BY w")
>>> query, table, joins = resolve_joins(select, p, None, policy, AnalystPolicy("a"))
>>> query.sql("postgres")
'SELECT "q.w" AS "w", SUM("q.w") FROM p GROUP BY "q.w"'
>>> sorted(table.columns), joins[0].keys, joins[0].unique_key
(['k', 'q.k', 'q.w', 'uid'], (('k', 'k'),), 'k')
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from ..errors import (
    AmbiguousColumn,
    DatatypeMismatch,
    DuplicateAlias,
    NotSupportedError,
    PrivacyViolation,
    UndefinedColumn,
    UndefinedTable,
)
from ..policy import AnalystPolicy, ColumnPolicy, Policy, TablePolicy
from ..postprocess import output_name
from .expressions import by_name, quoted
from .ldp import raw_read_error
from .tables import named_table

__all__ = ["Join", "resolve_joins"]


@dataclass(frozen=True)
class Join:
    """One public table joined to the private table (or to a public table joined before)."""

    table: TablePolicy  # the public table, as in the policy
    prefix: str  # its columns are "<prefix>.<column>" in the analysis: its alias, else its name
    left: bool  # LEFT JOIN: private rows without a match are kept, with NULLs; else INNER
    # equalities (column of an earlier table as named in the analysis, column of this table)
    keys: tuple[tuple[str, str], ...]
    # a join column the policy declares unique, or None: then a row may match several rows
    # (fan-out), each one counted as a row of its unit by contribution bounding
    unique_key: str | None

    def describe(self) -> str:
        on = " AND ".join(f"{left} = {self.prefix}.{right}" for left, right in self.keys)
        alias = f" AS {self.prefix}" if self.prefix != self.table.name else ""
        return f"{'LEFT' if self.left else 'INNER'} JOIN {self.table.name}{alias} ON {on}"


@dataclass(frozen=True)
class _Source:
    table: TablePolicy
    alias: str | None
    prefix: str | None  # None: the private table, whose columns keep their names

    @property
    def exposed(self) -> str:
        """The name PostgreSQL exposes: the alias, else the table name."""
        return self.alias or self.table.name

    def column(self, name: str, exactly: bool = False) -> ColumnPolicy | None:
        """The column `name` names: exactly where it was quoted, else in any case."""
        return by_name(self.table.columns, name, exactly)

    def name_of(self, column: ColumnPolicy) -> str:
        return column.name if self.prefix is None else f"{self.prefix}.{column.name}"


def resolve_joins(select: exp.Select, private: TablePolicy, alias: str | None, policy: Policy,
                  analyst: AnalystPolicy
                  ) -> tuple[exp.Select, TablePolicy, tuple[Join, ...]]:
    """The query with every column named as in the combined table, without its JOINs; the
    combined table (the private table's policy with the public columns added); the joins."""
    sources = [_Source(private, alias, None)]
    joins: list[Join] = []
    using: dict[str, tuple[_Source, ColumnPolicy]] = {}  # merged USING columns, by lower name
    for node in select.args["joins"]:
        source, left = _join_source(node, private, sources, policy, analyst)
        keys = _join_keys(node, source, sources, using, private)
        unique = next((right for _, right in keys if source.table.columns[right].unique), None)
        sources.append(source)
        assert source.prefix is not None
        joins.append(Join(source.table, source.prefix, left, keys, unique))

    columns = dict(private.columns)
    lowered = {name.lower() for name in columns}
    for source, join in zip(sources[1:], joins, strict=True):
        for column in source.table.columns.values():
            name = source.name_of(column)
            if name.lower() in lowered:
                raise NotSupportedError(f"column {name} of {private.name} clashes with column "
                                        f"{column.name} of {join.prefix}",
                                        hint=f"give {source.table.name} another alias")
            lowered.add(name.lower())
            # after a LEFT JOIN, an unmatched row reads NULL in every column of the table
            columns[name] = replace(column, name=name, nullable=column.nullable and not join.left,
                                    unique=False)
    combined = replace(private, columns=columns)

    def rename(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        found = _lookup(node, sources, using)
        if found is None:  # not a column: a select-list alias, left to the later passes
            return node
        source, column = found
        # quoted: the name is exact, and "q.w" is one identifier, not a qualified name
        return exp.column(source.name_of(column), quoted=True)

    query = select.copy()
    query.set("joins", None)
    query.set("from_", exp.From(this=exp.to_table(private.name)))
    items = []
    for item in query.expressions:
        renamed = item.transform(rename)
        if not isinstance(renamed, exp.Alias) and output_name(renamed) != output_name(item):
            # the output keeps the name PostgreSQL gives it (`q.w` is named w)
            renamed = exp.alias_(renamed, output_name(item), quoted=True)
        items.append(renamed)
    query.set("expressions", items)
    for clause in ("where", "group", "having"):
        if query.args.get(clause) is not None:
            query.set(clause, query.args[clause].transform(rename))
    if query.args.get("order") is not None:
        # ORDER BY name: an output column of that name comes first, as in PostgreSQL; the
        # outputs pass resolves it
        outputs = {output_name(item) for item in select.expressions}
        for ordered in query.args["order"].expressions:
            target = ordered.this
            if not (isinstance(target, exp.Column) and not target.table
                    and target.name in outputs):
                ordered.set("this", target.transform(rename))
    return query, combined, tuple(joins)


def _table_of(node: exp.Table, policy: Policy) -> TablePolicy:
    table = named_table(node, policy)
    if table is None:
        public = [t.name for t in policy.tables.values() if t.public]
        raise UndefinedTable(f'relation "{node.name}" does not exist',
                             hint=f"public tables you may join: {', '.join(public) or 'none'}")
    return table


def _join_source(node: exp.Join, private: TablePolicy, sources: list[_Source], policy: Policy,
                 analyst: AnalystPolicy) -> tuple[_Source, bool]:
    """The joined table, checked: public, an INNER or LEFT equi-join, a unique name."""
    side, kind = node.side.upper(), node.kind.upper()
    if node.args.get("method"):
        raise NotSupportedError(f"{node.args['method'].upper()} JOIN is not supported",
                                hint="name the key columns: JOIN t USING (col)")
    if side in ("RIGHT", "FULL") or kind not in ("", "INNER", "OUTER"):
        what = side or kind
        raise NotSupportedError(
            f"{what} JOIN is not supported",
            hint="join public tables to the private table with [INNER] JOIN or LEFT JOIN on "
                 "equal keys; every row measured must be a row of the private table")
    if node.args.get("on") is None and not node.args.get("using"):
        raise NotSupportedError("a join without a condition (a cross product) is not supported",
                                hint="join on equal keys: JOIN t ON p.col = t.col, or "
                                     "JOIN t USING (col)")
    target = node.this
    if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
        raise NotSupportedError(f"JOIN {target.sql('postgres')} is not supported",
                                hint="join a public table of the policy by name")
    if target.args.get("sample") is not None:
        raise NotSupportedError("TABLESAMPLE is not supported")
    table_alias = target.args.get("alias")
    if table_alias is not None and table_alias.args.get("columns"):
        raise NotSupportedError("column aliases on a joined table are not supported",
                                hint="refer to its columns by their names")
    table = _table_of(target, policy)
    if not table.public:
        if table.name == private.name:
            raise PrivacyViolation(
                f"a self-join of the private table {table.name} is not allowed: one unit's "
                "rows would pair with other units' rows, which contribution bounding cannot "
                "limit", hint="join only public lookup tables; compare rows of one unit with "
                "CASE inside an aggregate")
        if table.name not in analyst.tables:
            raise PrivacyViolation(f"permission denied for table {table.name}",
                                   hint=f"tables granted to {analyst.name}: "
                                        f"{', '.join(analyst.tables) or 'none'}")
        raise PrivacyViolation(
            f"joining two private tables ({private.name} and {table.name}) is not allowed: "
            "a unit of one would change rows of the other without bound",
            hint="query each private table on its own; only tables the policy marks "
                 "public = true may be joined")
    # Public tables need no grant: SPEC §3 says they may be joined and read freely.
    source = _Source(table, target.alias or None, target.alias or table.name)
    taken = {s.exposed.lower() for s in sources}
    if source.exposed.lower() in taken:
        raise DuplicateAlias(f'table name "{source.exposed}" specified more than once',
                             hint=f"give {table.name} an alias: JOIN {table.name} AS x")
    return source, side == "LEFT"


def _lookup(node: exp.Column, sources: list[_Source],
            using: dict[str, tuple[_Source, ColumnPolicy]]
            ) -> tuple[_Source, ColumnPolicy] | None:
    """The table and column a reference names; None for an unknown unqualified name."""
    if node.table:
        if node.args.get("db") is not None or node.args.get("catalog") is not None:
            raise NotSupportedError(f"{node.sql('postgres')}: qualify columns by table only")
        qualifier = node.table.lower()
        # the exposed name (alias, else table name); the table name of an aliased table too,
        # as dpproxy has always accepted for the private table
        matches = [s for s in sources if s.exposed.lower() == qualifier] or \
            [s for s in sources if s.table.name.lower() == qualifier]
        if not matches:
            raise UndefinedColumn(f"missing FROM-clause entry for table {node.table!r}",
                                  hint="qualify columns by the tables of FROM and JOIN, or "
                                       "their aliases: " + ", ".join(s.exposed for s in sources))
        if len(matches) > 1:
            raise AmbiguousColumn(f"table reference {node.table!r} is ambiguous",
                                  hint="use the aliases of the joined tables")
        column = matches[0].column(node.name, quoted(node))
        if column is None:
            table = matches[0].table
            raise UndefinedColumn(f"column {node.table}.{node.name} does not exist",
                                  hint=f"columns of {table.name}: {', '.join(table.columns)}")
        return matches[0], column
    if node.name.lower() in using:
        return using[node.name.lower()]
    found = [(s, c) for s in sources if (c := s.column(node.name, quoted(node))) is not None]
    if len(found) > 1:
        raise AmbiguousColumn(
            f'column reference "{node.name}" is ambiguous',
            hint="qualify it: " + " or ".join(f"{s.exposed}.{c.name}" for s, c in found))
    return found[0] if found else None


def _join_keys(node: exp.Join, source: _Source, earlier: list[_Source],
               using: dict[str, tuple[_Source, ColumnPolicy]], private: TablePolicy
               ) -> tuple[tuple[str, str], ...]:
    """The (earlier column, joined column) equalities of ON … or USING (…), checked."""
    pairs: list[tuple[tuple[_Source, ColumnPolicy], tuple[_Source, ColumnPolicy]]] = []
    if node.args.get("using"):
        for ident in node.args["using"]:
            name = ident.name
            right = source.column(name, quoted(ident))
            lefts = [(s, c) for s in earlier if (c := s.column(name, quoted(ident))) is not None]
            if name.lower() in using:
                lefts = [using[name.lower()]]
            if right is None or not lefts:
                missing = source.table.name if right is None else "the tables before it"
                raise UndefinedColumn(f'column "{name}" specified in USING clause does not '
                                      f"exist in {missing}",
                                      hint="USING (col) needs col on both sides; else join "
                                           "with ON p.a = q.b")
            if len(lefts) > 1:
                raise AmbiguousColumn(f'common column name "{name}" appears more than once '
                                      "in the left table", hint="join with ON and qualified "
                                      "columns instead")
            pairs.append((lefts[0], (source, right)))
            # the merged column: equal to the left one wherever a row is measured
            using.setdefault(name.lower(), lefts[0])
    else:
        scope = [*earlier, source]
        for condition in _conjuncts(node.args["on"]):
            if not isinstance(condition, exp.EQ) or not all(
                    isinstance(_unparen(side), exp.Column)
                    for side in (condition.this, condition.expression)):
                raise NotSupportedError(
                    f"join condition {condition.sql('postgres')} is not supported",
                    hint="join on equalities of columns, combined with AND "
                         "(ON p.a = q.a AND p.b = q.b); put other conditions in WHERE")
            sides = []
            for side in (condition.this, condition.expression):
                found = _lookup(_unparen(side), scope, using)
                if found is None:
                    raise UndefinedColumn(f'column "{_unparen(side).name}" does not exist',
                                          hint="join on columns of the joined tables")
                sides.append(found)
            mine = [s for s in sides if s[0] is source]
            if len(mine) != 1:
                raise NotSupportedError(
                    f"join condition {condition.sql('postgres')} must compare a column of "
                    f"{source.exposed} with a column of a table before it",
                    hint="move conditions on one table's columns to WHERE")
            other = sides[1] if sides[0][0] is source else sides[0]
            pairs.append((other, mine[0]))
    keys: list[tuple[str, str]] = []
    for (left_source, left), (_, right) in pairs:
        if left.ldp is not None:
            raise raw_read_error(left, "a join key")
        if left_source.prefix is None and left.name == private.privacy_unit:
            raise PrivacyViolation(
                f"joining on the privacy unit {left.name}: a table keyed by the unit describes "
                "units, it is not a public lookup table",
                hint="join public tables on public attributes (codes, categories); data about "
                     "units belongs in a private table")
        if _kind(left) != _kind(right):
            raise DatatypeMismatch(f"operator does not exist: {left.type} = {right.type} in "
                                   f"the join of {source.exposed}",
                                   hint="join on columns of the same type")
        keys.append((left_source.name_of(left), right.name))
    return tuple(keys)


def _kind(column: ColumnPolicy) -> str:
    return "num" if column.type in ("int", "float") else column.type


def _unparen(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    node = _unparen(node)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]
