"""Row-level subqueries in FROM, and the CTEs that name them, merged into their query.

BI tools wrap what an analyst wrote: Metabase's nested questions read
`FROM (SELECT … FROM adult) AS "source"`, Superset's virtual datasets
`FROM (…) AS virtual_table`, Tableau's custom SQL `FROM (…) "Custom SQL Query"`, and
dbt-style SQL names the same with `WITH t AS (…)`. Where the inner query only selects
and filters rows of one table (no aggregate, GROUP BY, DISTINCT, LIMIT or window), the
outer query over it is the very same query over the table: each of its columns is the
inner item of that name, its WHERE is both WHEREs. `inline` writes it so, and the
analyzer then checks it as if it had been sent that way. A subquery grouping one table
by one column is left in place for the analyzer (`per_unit`: values per person where that
column is the privacy unit); anything else inside FROM is refused, with a hint.

>>> import sqlglot
>>> q = sqlglot.parse_one("SELECT d, COUNT(*) FROM (SELECT age / 10 AS d FROM adult "
...                       "WHERE age > 20) AS s WHERE s.d < 5 GROUP BY d", read="postgres")
>>> inline(q).sql("postgres")
'SELECT age / 10 AS d, COUNT(*) FROM adult WHERE age > 20 AND age / 10 < 5 GROUP BY age / 10'
"""

from __future__ import annotations

import itertools

from sqlglot import exp

from ..errors import InvalidColumnReference, NotSupportedError, UndefinedColumn
from ..postprocess import output_name
from .per_unit import grouped_column

# Clauses that make an inner query more than a selection of rows
_NOT_ROW_LEVEL = {
    "group": "GROUP BY", "having": "HAVING", "distinct": "DISTINCT", "limit": "LIMIT",
    "offset": "OFFSET", "windows": "WINDOW", "qualify": "QUALIFY", "laterals": "LATERAL",
    "sample": "TABLESAMPLE", "pivots": "PIVOT", "into": "INTO", "locks": "FOR UPDATE",
}
_HINT = ("a subquery in FROM may only select and filter rows of one table: aggregate, "
         "group and limit in the outer query")
# Clauses of the outer query whose bare names are its input columns (ORDER BY's are its
# outputs first, as PostgreSQL reads them)
_INPUT_CLAUSES = ("where", "group", "having")


def inline(select: exp.Expression, ctes: dict[str, exp.Expression] | None = None
           ) -> exp.Expression:
    """`select` with its FROM subquery (or WITH query) merged in, where that only selects
    and filters rows; `select` itself, unchanged, when it reads neither. `ctes`: the WITH
    queries of the enclosing scopes, by name."""
    if not isinstance(select, exp.Select):
        return select
    scope = dict(ctes or {})
    source = _source(select)
    if select.args.get("with_") is None and not isinstance(source, exp.Subquery) \
            and _cte_named(source, scope) is None:
        return select
    select = select.copy()
    scope.update(_take_ctes(select, scope))
    source = _source(select)
    body = _cte_named(source, scope)
    what = "a subquery in FROM"
    if body is not None:
        assert isinstance(source, exp.Table)
        what = f'WITH query "{source.name}"'
        source.replace(exp.Subquery(this=body.copy(), alias=exp.TableAlias(
            this=exp.to_identifier(source.alias or source.name))))
    for join in select.args.get("joins") or ():
        if _cte_named(join.this, scope) is not None:
            raise NotSupportedError("a WITH query may be read in FROM, not joined",
                                    hint="join public tables by their own names")
    source = _source(select)
    if not isinstance(source, exp.Subquery):
        return select
    return _merge(select, source, scope, what)


def _source(select: exp.Select) -> exp.Expression | None:
    from_ = select.args.get("from_")
    return from_.this if from_ is not None else None


def _cte_named(source: exp.Expression | None, ctes: dict[str, exp.Expression]
               ) -> exp.Expression | None:
    """The WITH query a FROM or JOIN item names (a bare name, not schema-qualified)."""
    if isinstance(source, exp.Table) and not source.db and not source.catalog:
        return ctes.get(source.name)
    return None


def _take_ctes(select: exp.Select, outer: dict[str, exp.Expression]
               ) -> dict[str, exp.Expression]:
    """The WITH queries of `select` by name, removed from it; each may read the ones
    before it (and the enclosing scopes')."""
    with_ = select.args.get("with_")
    if with_ is None:
        return {}
    if with_.args.get("recursive"):
        raise NotSupportedError("WITH RECURSIVE is not supported", hint=_HINT)
    ctes: dict[str, exp.Expression] = {}
    for cte in with_.expressions:
        alias = cte.args.get("alias")
        body = inline(cte.this, {**outer, **ctes})
        if alias is not None and alias.columns:
            body = _renamed(body, alias.columns, f'WITH query "{cte.alias_or_name}"')
        ctes[cte.alias_or_name] = body
    select.set("with_", None)
    return ctes


def _merge(select: exp.Select, source: exp.Subquery, ctes: dict[str, exp.Expression],
           what: str) -> exp.Select:
    inner = source.this
    while isinstance(inner, exp.Subquery):  # FROM ((SELECT …)) AS s
        inner = inner.this
    if not isinstance(inner, exp.Select):
        raise NotSupportedError(f"{what} that is a {inner.key.upper()} is not supported",
                                hint=_HINT)
    inner = inline(inner, ctes)  # a subquery or WITH query of its own, first
    assert isinstance(inner, exp.Select)
    if grouped_column(inner) is not None:
        # values per group of one column: the analyzer reads them as a table of one row
        # per unit where that column is the privacy unit (`per_unit`), else refuses them
        alias = source.args.get("alias")
        if alias is not None and alias.columns:  # AS t(a, b): its columns, renamed
            inner = _renamed(inner, alias.columns, what)
            alias.set("columns", None)
        source.set("this", inner)
        return select
    for arg, clause in _NOT_ROW_LEVEL.items():
        if inner.args.get(arg):
            raise NotSupportedError(f"{what} with {clause} is not supported", hint=_HINT)
    if inner.find(exp.AggFunc) is not None or inner.find(exp.Window) is not None:
        raise NotSupportedError(f"{what} that aggregates is not supported", hint=_HINT)
    if inner.args.get("from_") is None:
        raise NotSupportedError(f"{what} without a table is not supported", hint=_HINT)
    if select.args.get("joins") and inner.args.get("joins"):
        raise NotSupportedError("joins both inside and outside a subquery in FROM are not "
                                "supported", hint="write the joins in one place")
    if select.args.get("joins"):
        inner = _qualified(inner)  # its names must stay its own table's beside the joins
    alias = source.alias
    if source.args.get("alias") is not None and source.args["alias"].columns:
        inner = _renamed(inner, source.args["alias"].columns, what)
    items: dict[str, exp.Expression] = {}
    star = False
    for item in inner.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            star = True
        else:
            body = item.this if isinstance(item, exp.Alias) else item
            items.setdefault(output_name(item), body)
    outputs = {output_name(item) for item in select.expressions}

    def column(node: exp.Column) -> exp.Expression | None:
        """The inner expression an outer column names (None: not the subquery's)."""
        if (node.table and node.table != alias) or isinstance(node.this, exp.Star):
            return None
        body = items.get(node.name)
        if body is not None:
            return body.copy()
        if star and node.table:  # the inner table's own column
            return exp.column(node.this.copy(), table=_qualifier(inner))
        if select.args.get("joins") or (not node.table and node.name in outputs):
            return None  # a joined table's, or GROUP BY an output: the analyzer resolves it
        if star:
            return exp.column(node.this.copy())
        raise UndefinedColumn(f"column {node.sql('postgres')} does not exist",
                              hint=f"the subquery in FROM has: {', '.join(items) or 'no columns'}")

    def replace_columns(tree: exp.Expression, outputs_first: bool = False) -> exp.Expression:
        def swap(node: exp.Expression) -> exp.Expression:
            if not isinstance(node, exp.Column):
                return node
            if outputs_first and not node.table and node.name in outputs:
                return node  # ORDER BY an output's name
            return column(node) or node
        return tree.transform(swap, copy=False)

    merged = select
    new_items = []
    for item in merged.expressions:
        if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star):
            body = column(item)
            if body is not None and not (isinstance(body, exp.Column)
                                         and body.name == item.name):
                new_items.append(exp.alias_(body, item.name, quoted=item.this.quoted))
                continue
            new_items.append(body if body is not None else item)
        else:
            new_items.append(replace_columns(item))
    merged.set("expressions", new_items)
    for clause in _INPUT_CLAUSES:
        if merged.args.get(clause) is not None:
            merged.set(clause, replace_columns(merged.args[clause]))
    if merged.args.get("order") is not None:
        merged.set("order", replace_columns(merged.args["order"], outputs_first=True))
    for join in merged.args.get("joins") or ():
        on = join.args.get("on")
        if on is not None:
            join.set("on", replace_columns(on))
        for name in join.args.get("using") or ():
            body = items.get(name.name)
            if body is not None and not (isinstance(body, exp.Column)
                                         and body.name == name.name):
                raise NotSupportedError(
                    f"JOIN … USING ({name.name}) over a column the subquery computes is not "
                    "supported", hint="join with ON, naming the expression")
    # the inner FROM and joins become the query's; both WHEREs must hold
    merged.set("from_", inner.args["from_"])
    if inner.args.get("joins"):
        merged.set("joins", inner.args["joins"])
    inner_where = inner.args.get("where")
    outer_where = merged.args.get("where")
    if inner_where is not None:
        condition = inner_where.this if outer_where is None \
            else exp.And(this=_operand(inner_where.this), expression=_operand(outer_where.this))
        merged.set("where", exp.Where(this=condition))
    return merged


def _renamed(inner: exp.Expression, names: list[exp.Identifier], what: str) -> exp.Select:
    """The inner query with its first columns named as `AS t(a, b)` names them."""
    if not isinstance(inner, exp.Select):
        raise NotSupportedError(f"{what} that is a {inner.key.upper()} is not supported",
                                hint=_HINT)
    items = inner.expressions
    if any(isinstance(i, exp.Star) or (isinstance(i, exp.Column) and isinstance(i.this, exp.Star))
           for i in items):
        raise NotSupportedError(f"column names for {what} over SELECT * are not supported",
                                hint="list its columns inside it")
    if len(names) > len(items):
        raise InvalidColumnReference(f"{what} has {len(items)} columns available but "
                                     f"{len(names)} columns specified")
    inner = inner.copy()
    inner.set("expressions", [
        exp.alias_(item.this if isinstance(item, exp.Alias) else item, name.copy())
        if i < len(names) else item for i, (item, name) in enumerate(
            itertools.zip_longest(inner.expressions, names[:len(items)]))])
    return inner


def _qualifier(inner: exp.Select) -> str | None:
    """The name the inner query's one table goes by (its alias, else its name)."""
    table = _source(inner)
    return table.alias_or_name if isinstance(table, exp.Table) else None


def _qualified(inner: exp.Select) -> exp.Select:
    """The inner query with its unqualified columns qualified by its one table's name."""
    name = _qualifier(inner)
    if name is None or inner.args.get("joins"):
        return inner

    def qualify(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table \
                and not isinstance(node.this, exp.Star):
            node.set("table", exp.to_identifier(name))
        return node
    return inner.transform(qualify)


def _operand(condition: exp.Expression) -> exp.Expression:
    """A condition as an operand of AND: an OR (binding looser) in parentheses."""
    return exp.Paren(this=condition) if isinstance(condition, exp.Connector) \
        and not isinstance(condition, exp.And) else condition
