"""Analyze a SELECT against the policy: a typed `Analysis`, or a rejection saying how to fix it.

The passes run in this order, each small and named after what it checks:

0. `inline.inline`     a subquery or WITH query in FROM that only selects and filters rows
                       is merged into the query (anything else is refused); then
                       `_fold_filters` reads AGG(x) FILTER (WHERE c) as AGG(CASE …)
1. `_check_shape`      only SELECT … FROM one table [JOIN public tables] [WHERE] [GROUP BY]
                       [HAVING] [ORDER BY] [LIMIT]
2. `_resolve_table`    the table exists, is granted, and is private; `joins.resolve_joins`
                       checks joined public tables and names their columns "<alias>.<column>"
                       in one combined table, so the passes below see one table
3. `_check_where`      the row predicate is an allowlisted, deterministic boolean expression
4. `_resolve_keys`     GROUP BY keys are columns or allowlisted row expressions, never over the
                       privacy unit; keys without public values (a column's `public_values`
                       or `public_range`, or an expression's image of them) go through
                       partition selection
5. `_collect_aggregates` every aggregate is in the rule table and its argument is bounded;
                       local-DP columns are read only through their rules (`ldp.py`)
6. `_resolve_outputs`  outputs, HAVING and ORDER BY only post-process aggregates and keys;
                       window functions (`dpproxy.windows`, taken out of the select list
                       and ORDER BY before step 2) only read them too

Nothing here touches data; the result says exactly what will be measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from sqlglot import exp

from ..clock import EPOCH, date_literal
from ..errors import (
    DatatypeMismatch,
    Error,
    GroupingError,
    InvalidParameterValue,
    NotSupportedError,
    PrivacyViolation,
    ProgrammingError,
    WindowingError,
)
from ..parse import is_all_call
from ..policy import AnalystPolicy, ColumnPolicy, Policy, TablePolicy
from ..postprocess import (
    OUTPUT_FUNCTIONS_HELP,
    AggregateRef,
    OrderItem,
    WindowRef,
    check_output_expression,
    infer_type,
    output_name,
    refer_to_aggregates,
    written_name,
)
from ..quantiles import MAX_BINS
from ..windows import WindowCall, describe, extract, parts, result_type
from .ages import fold_ages
from .aggregates import (
    RULES,
    SUPPORTED_HELP,
    VARIANCE_RULES,
    AggregateRule,
    Statistic,
    mode_rule,
    quantile_rule,
)
from .buckets import fold_width_buckets
from .expressions import (
    ExprType,
    Resolver,
    by_name,
    check_arguments,
    coerce_literals,
    date_bounds,
    make_resolver,
    quoted,
    type_row_expression,
    written_sql,
)
from .inline import inline
from .joins import Join, resolve_joins
from .keys import enumerable, key_type, key_values
from .ldp import local_aggregate, raw_read_error, reject_raw_local, rows_are_public
from .per_unit import PerUnit, derive, grouped_column
from .tables import private_table

__all__ = ["AggregateCall", "Analysis", "ConstantQuery", "GroupKey", "Join", "OrderItem",
           "Output", "analyze"]


@dataclass(frozen=True)
class GroupKey:
    name: str  # the column's name, or the expression's canonical SQL
    # The column; for an expression key, a column describing its values (type, bounds)
    column: ColumnPolicy
    # The public values: every one is released, zeros included. None: the key's values are
    # private, and groups pass partition selection.
    values: tuple[object, ...] | None
    # A row expression key (`age / 10 * 10`), literals typed; None for a plain column
    expression: exp.Expression | None = None
    # For an expression key with public values: the column they were enumerated from
    source: str | None = None


@dataclass(frozen=True)
class AggregateCall:
    sql: str  # canonical SQL of the aggregate as written; outputs refer to it by this text
    rule: AggregateRule
    statistics: tuple[int, ...]  # indexes into Analysis.statistics
    # The bounds derived for the row-expression argument (EXPLAIN shows them), if bounded
    argument_bounds: tuple[float, float] | None = None
    # As written, where a fold rewrote part of it (`written_sql`): EXPLAIN shows this
    written: str | None = None


@dataclass(frozen=True)
class Output:
    name: str
    expression: exp.Expression  # over aggregates (leaves) and group-key columns
    aggregate: int | None  # index into Analysis.aggregates when the output is one aggregate
    key: int | None  # index into Analysis.keys when the output is one group key


@dataclass(frozen=True)
class Analysis:
    table: TablePolicy
    where: exp.Expression | None
    keys: tuple[GroupKey, ...]
    statistics: tuple[Statistic, ...]
    aggregates: tuple[AggregateCall, ...]
    outputs: tuple[Output, ...]
    having: exp.Expression | None
    order: tuple[OrderItem, ...]
    limit: int | None
    offset: int
    statement: str  # the normalized query, for the ledger, audit log and cache
    # public tables joined to `table`, whose columns `table` holds as "<prefix>.<column>"
    joins: tuple[Join, ...] = ()
    # window function calls over the released groups, which outputs and ORDER BY read
    windows: tuple[WindowCall, ...] = ()
    # FROM a subquery of values per unit: `table` is its table of one row per unit
    per_unit: PerUnit | None = None

    @property
    def regular_expressions(self) -> frozenset[tuple[str, bool]]:
        """Every (pattern, case-insensitive) the backend statement matches rows with: in
        WHERE, group keys, aggregate arguments and a subquery of values per unit."""
        nodes = [self.where, *(k.expression for k in self.keys),
                 *(s.argument for s in self.statistics)]
        if self.per_unit is not None:
            nodes += [self.per_unit.where, *(v.argument for v in self.per_unit.values)]
        return frozenset(
            (match.expression.this, isinstance(match, exp.RegexpILike))
            for node in nodes if node is not None
            for match in node.find_all(exp.RegexpLike, exp.RegexpILike)
            if isinstance(match.expression, exp.Literal))

    @property
    def fans_out(self) -> bool:
        """True when a joined public table may match a row several times (no unique key)."""
        return any(j.unique_key is None for j in self.joins)

    @property
    def output_types(self) -> tuple[str, ...]:
        """PostgreSQL type names of the outputs (int8, float8, text, date, bool)."""
        value_types, key_types = self.value_types()
        return tuple(infer_type(o.expression, value_types, key_types) for o in self.outputs)

    def value_types(self) -> tuple[dict[str, str], dict[str, str]]:
        """PostgreSQL type names of the aggregates and window calls (by the names outputs
        read them by), and of the keys."""
        value_types = {}
        for agg in self.aggregates:
            stats = [self.statistics[i] for i in agg.statistics]
            value_types[agg.sql] = agg.rule.value_type or (
                "int8" if agg.rule.integer_result(stats) else "float8")
        key_types = {k.name: _PG_TYPES[k.column.type] for k in self.keys}
        for call in self.windows:
            argument_types = [infer_type(a, value_types, key_types) for a in call.arguments]
            if call.function in ("lag", "lead") and len(call.arguments) > 1:
                # the default stands for the value: one type for both, as COALESCE's
                argument_types[0] = infer_type(exp.Coalesce(
                    this=call.arguments[0].copy(), expressions=[call.arguments[1].copy()]),
                    value_types, key_types)
            value_types[call.name] = result_type(call, argument_types)
        return value_types, key_types

    @property
    def public_groups(self) -> bool:
        """True when every group key has public values: no partition selection needed."""
        return all(k.values is not None for k in self.keys)

    @property
    def group_count(self) -> int | None:
        """How many groups are released, when the keys are public (else None)."""
        count = 1
        for key in self.keys:
            if key.values is None:
                return None
            count *= len(key.values)
        return count


@dataclass(frozen=True)
class ConstantQuery:
    """A SELECT without FROM (`SELECT 1`): no data, nothing to protect."""

    outputs: tuple[Output, ...]
    statement: str

    @property
    def output_types(self) -> tuple[str, ...]:
        return tuple(infer_type(o.expression, {}, {}) for o in self.outputs)


_PG_TYPES = {"int": "int8", "float": "float8", "text": "text", "date": "date", "bool": "bool"}


_UNSUPPORTED_CLAUSES = {
    "with_": ("WITH (common table expressions)", "query the table directly"),
    "laterals": ("LATERAL", "query one table"),
    "distinct": ("SELECT DISTINCT", "use GROUP BY with an aggregate such as COUNT(*)"),
    "qualify": ("QUALIFY", "filter outputs with HAVING"),
    "windows": ("WINDOW (named windows)", "write the window in place: OVER (ORDER BY …)"),
    "into": ("SELECT INTO", "dpproxy is read-only"),
    "locks": ("FOR UPDATE/SHARE", "dpproxy is read-only"),
    "sample": ("TABLESAMPLE", "sampling is not supported"),
    "pivots": ("PIVOT", "use GROUP BY"),
    "connect": ("CONNECT BY", "not supported"),
    "prewhere": ("PREWHERE", "use WHERE"),
}
_MAX_GROUPS = 100_000
# Largest |bound| of a summed value. Below it each clamped value is exact in DOUBLE (whole
# numbers up to 2^53 ≈ 9e15: the whole-number noise grid relies on it) and no sum can come
# near DOUBLE's overflow, which would change a sum by more than any sensitivity depending
# on the data. The noise at such bounds drowns any answer anyway: the analyst is asked to
# clamp explicitly.
MAX_VALUE_BOUND = 1e15


def analyze(select: exp.Expression, policy: Policy, analyst: AnalystPolicy
            ) -> Analysis | ConstantQuery:
    """Check a parsed (parameter-bound) query and describe what it measures."""
    if select.find(exp.IgnoreNulls, exp.RespectNulls) is not None:
        # before anything prints the tree: PostgreSQL's dialect has no such clause
        raise NotSupportedError("IGNORE NULLS and RESPECT NULLS are not supported",
                                hint="aggregates skip NULL values already: write SUM(x)")
    statement = select.sql("postgres")  # as written: the audit log and the ledger keep it
    select = inline(select)  # a row-level subquery or WITH query in FROM, merged in
    select, per_unit_source = _detach_per_unit(select)
    _check_shape(select)
    assert isinstance(select, exp.Select)
    select = fold_ages(fold_width_buckets(select))
    if select.args.get("from_") is None:
        return _constant_query(select, statement)
    select = _fold_any(_fold_filters(_fold_within_group(select)))
    select, window_nodes = extract(select)
    table, alias, per_unit = _resolve_table(select, policy, analyst, per_unit_source)
    joins: tuple[Join, ...] = ()
    if select.args.get("joins"):
        select, table, joins = resolve_joins(select, table, alias, policy, analyst)
        alias = None
    resolve = make_resolver(table.name, alias, table.columns)
    where = _check_where(select, resolve)
    keys = _resolve_keys(select, table, resolve)
    read = [resolve(c) for node in (where, *(k.expression for k in keys)) if node is not None
            for c in node.find_all(exp.Column)]
    # a join filters (INNER), multiplies (fan-out) and labels rows by its keys: the private
    # table's key columns are read as WHERE's are
    join_keys = [table.columns[left] for j in joins for left, _ in j.keys]
    public_rows = rows_are_public(
        [*read, *join_keys, *(k.column for k in keys if k.expression is None)], table,
        {f"{j.prefix}.{name}" for j in joins for name in j.table.columns})
    statistics, aggregates = _collect_aggregates(
        select, table, resolve, public_rows,
        [part for node in window_nodes for part in parts(node)])
    if window_nodes and not keys and not aggregates:
        raise NotSupportedError(
            "window functions read the groups of an aggregate query; over the table's rows "
            "they would release one row per row",
            hint="aggregate first, e.g. SUM(COUNT(*)) OVER () with GROUP BY")
    outputs, having, order, calls = _resolve_outputs(select, keys, aggregates, resolve,
                                                     window_nodes)
    _check_date_values(aggregates, outputs, having, order, calls)
    limit, offset = _limit_offset(select)
    analysis = Analysis(table, where, keys, statistics, aggregates, outputs, having, order,
                        limit, offset, statement, joins, calls, per_unit)
    _check_types(analysis)
    return analysis


def _check_types(analysis: Analysis) -> None:
    """Type every post-processing place before anything is charged, as PostgreSQL does
    when it plans: `infer_type` refuses `sex * 2`, `-sex`, CASE branches of two types, and
    `value_types` SUM or AVG of a window over text (42804)."""
    value_types, key_types = analysis.value_types()
    places = [o.expression for o in analysis.outputs]
    places += [i.expression for i in analysis.order]
    places += [part for call in analysis.windows
               for part in (*call.partition, *(i.expression for i in call.order))]
    for place in places:
        infer_type(place, value_types, key_types)
    if analysis.having is not None:
        found = infer_type(analysis.having, value_types, key_types)
        if found != "bool" and not isinstance(analysis.having, exp.Null):
            raise DatatypeMismatch(f"argument of HAVING must be type boolean, not type {found}",
                                   hint="compare the aggregate, e.g. HAVING COUNT(*) > 100")


# 1 -------------------------------------------------------------------------------------------
def _check_shape(select: exp.Expression) -> None:
    if isinstance(select, exp.SetOperation):
        raise NotSupportedError(
            f"set operations ({select.key.upper()}) are not supported",
            hint="run each SELECT on its own; every query is charged separately")
    if not isinstance(select, exp.Select):
        raise NotSupportedError(f"{select.key.upper()} statements are not supported")
    for arg, (what, fix) in _UNSUPPORTED_CLAUSES.items():
        if select.args.get(arg):
            raise NotSupportedError(f"{what} is not supported", hint=fix)
    for sub in select.find_all(exp.Select, exp.Subquery):
        if sub is not select:
            raise NotSupportedError(
                "subqueries are not supported",
                hint="write one SELECT over one table; filter with WHERE on its columns")


def _constant_query(select: exp.Select, statement: str) -> ConstantQuery:
    for clause in ("where", "group", "having"):
        if select.args.get(clause):
            raise NotSupportedError(f"{clause.upper()} needs a FROM clause")
    outputs = []
    for item in select.expressions:
        body = item.this if isinstance(item, exp.Alias) else item
        if body.find(exp.Column, exp.AggFunc):
            raise ProgrammingError(f"{body.sql('postgres')} needs a FROM clause")
        check_output_expression(body, lambda node: None, whole_output=True)
        outputs.append(Output(output_name(item), body, None, None))
    return ConstantQuery(tuple(outputs), statement)


def _fold_within_group(select: exp.Select) -> exp.Select:
    """PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY x) becomes one aggregate node holding both
    x and p (the form sqlglot prints back as written); ORDER BY x DESC is quantile 1 − p.

    >>> from sqlglot import parse_one
    >>> q = parse_one("SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) FROM t",
    ...               read="postgres")
    >>> _fold_within_group(q).sql("postgres")
    'SELECT PERCENTILE_CONT(0.1) WITHIN GROUP (ORDER BY age) FROM t'
    """
    def fold(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.WithinGroup):
            return node
        function, order = node.this, node.expression
        if isinstance(function, exp.Mode) and function.this is None:
            items = order.expressions if isinstance(order, exp.Order) else []
            if len(items) != 1:
                raise NotSupportedError("WITHIN GROUP takes exactly one ORDER BY expression")
            return exp.Mode(this=items[0].this.copy())  # ties are no matter: one is drawn
        if not isinstance(function, exp.PercentileCont | exp.PercentileDisc) \
                or function.args.get("expression") is not None:
            raise NotSupportedError(f"{written_sql(node)} is not supported",
                                    hint=f"supported aggregates: {SUPPORTED_HELP}")
        items = order.expressions if isinstance(order, exp.Order) else []
        if len(items) != 1:
            raise NotSupportedError("WITHIN GROUP takes exactly one ORDER BY expression")
        p = _quantile_literal(function.this, function.sql_name())
        if items[0].args.get("desc"):
            p = 1 - p
        text = str(p.numerator) if p.denominator == 1 else format(
            Decimal(p.numerator) / Decimal(p.denominator), "f")
        return type(function)(this=items[0].this.copy(), expression=exp.Literal.number(text))
    return select.transform(fold)  # a copy: the caller's tree is left as written


def _fold_filters(select: exp.Select) -> exp.Select:
    """AGG(x) FILTER (WHERE c) becomes AGG(CASE WHEN c THEN x END), and COUNT(*) FILTER
    (WHERE c) COUNT(CASE WHEN c THEN 1 END), COUNT(DISTINCT x) FILTER (WHERE c)
    COUNT(DISTINCT CASE WHEN c THEN x END): the same rows reach the aggregate (a NULL is
    skipped as a filtered row is), so the same statistic, analysed as any CASE is.

    >>> from sqlglot import parse_one
    >>> q = parse_one("SELECT COUNT(*) FILTER (WHERE age > 40), AVG(hours) FILTER (WHERE sex "
    ...               "= 'F') FROM t", read="postgres")
    >>> _fold_filters(q).sql("postgres")
    "SELECT COUNT(CASE WHEN age > 40 THEN 1 END), AVG(CASE WHEN sex = 'F' THEN hours END) FROM t"
    """
    def fold(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Filter) or not isinstance(node.this, exp.AggFunc):
            return node
        function = node.this
        condition = node.expression.this if isinstance(node.expression, exp.Where) else None
        argument = function.this
        distinct = isinstance(argument, exp.Distinct)
        several = distinct and (not isinstance(function, exp.Count)
                                or len(argument.expressions) != 1)
        if condition is None or function.args.get("expression") is not None or several:
            return node  # refused below, with a hint
        value = exp.Literal.number(1) if isinstance(argument, exp.Star) \
            else argument.expressions[0] if distinct else argument
        case = exp.Case(ifs=[exp.If(this=condition.copy(), true=value.copy())])
        folded = function.copy()
        folded.set("this", exp.Distinct(expressions=[case]) if distinct else case)
        return folded
    if select.find(exp.Filter) is None:
        return select
    return select.transform(fold)


def _fold_any(select: exp.Select) -> exp.Select:
    """x = ANY(ARRAY[a, b]) becomes x IN (a, b), and x <> ALL(ARRAY[a, b]) NOT x IN (a, b)
    (an empty array: FALSE and TRUE), as PostgreSQL defines them; a list bound to
    `= ANY($1)` arrives as such an array.

    >>> from sqlglot import parse_one
    >>> q = parse_one("SELECT COUNT(*) FROM t WHERE a = ANY(ARRAY[1, 2]) AND b <> ALL(ARRAY['x'])",
    ...               read="postgres")
    >>> _fold_any(q).sql("postgres")
    "SELECT COUNT(*) FROM t WHERE a IN (1, 2) AND NOT b IN ('x')"
    """
    def items(node: exp.Expression | None) -> list[exp.Expression] | None:
        while isinstance(node, exp.Paren):
            node = node.this
        return list(node.expressions) if isinstance(node, exp.Array) else None

    def fold(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.EQ) and isinstance(node.expression, exp.Any):
            values = items(node.expression.this)
            if values is not None:
                return exp.In(this=node.this.copy(), expressions=[v.copy() for v in values]) \
                    if values else exp.false()
        if isinstance(node, exp.NEQ) and is_all_call(node.expression):
            values = items(node.expression.expressions[0])
            if values is not None:
                return exp.Not(this=exp.In(this=node.this.copy(),
                                           expressions=[v.copy() for v in values])) \
                    if values else exp.true()
        return node
    if select.find(exp.Any, exp.Anonymous) is None:
        return select
    return select.transform(fold)


def _quantile_literal(node: exp.Expression, function: str) -> Fraction:
    """The constant p of a percentile, exactly (0.9 is 9/10, not the nearest double)."""
    text = None
    if isinstance(node, exp.Literal) and not node.is_string:
        text = node.this
    elif isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        text = "-" + node.this.this
    try:
        p = Fraction(Decimal(text)) if text is not None else None
    except (InvalidOperation, ValueError):
        p = None
    if p is None:
        raise NotSupportedError(f"{function} needs a constant fraction, got "
                                f"{written_sql(node)}", hint=f"e.g. {function}(0.9)")
    if not 0 <= p <= 1:
        raise InvalidParameterValue(f"percentile value {text} is not between 0 and 1",
                                    hint="0.5 is the median, 0.9 the 90th percentile")
    return p


# 2 -------------------------------------------------------------------------------------------
def _detach_per_unit(select: exp.Expression) -> tuple[exp.Expression, exp.Subquery | None]:
    """A FROM subquery of values per group of one column (`per_unit`) taken out of the
    query, a table of its alias standing in its place, so that nothing of the outer
    query's analysis reads inside it; the query as it is otherwise."""
    source = _from_source(select)
    if not (isinstance(source, exp.Subquery) and grouped_column(source.this) is not None):
        return select, None
    select = select.copy()
    source = _from_source(select)
    assert isinstance(source, exp.Subquery)
    source.replace(exp.to_table(exp.to_identifier(source.alias or "subquery", quoted=True)))
    return select, source


def _from_source(select: exp.Expression) -> exp.Expression | None:
    from_ = select.args.get("from_") if isinstance(select, exp.Select) else None
    return from_.this if from_ is not None else None


def _resolve_table(select: exp.Select, policy: Policy, analyst: AnalystPolicy,
                   per_unit_source: exp.Subquery | None = None
                   ) -> tuple[TablePolicy, str | None, PerUnit | None]:
    if per_unit_source is not None:
        per_unit = derive(select, per_unit_source, policy, analyst)
        return per_unit.derived(), per_unit_source.alias or None, per_unit
    source = select.args["from_"].this
    if isinstance(source, exp.Subquery):
        raise NotSupportedError("subqueries in FROM are not supported",
                                hint="query the table directly")
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise NotSupportedError(f"FROM {source.sql('postgres')} is not supported",
                                hint="name one table of the policy")
    if source.args.get("sample") is not None:
        raise NotSupportedError("TABLESAMPLE is not supported",
                                hint="contribution bounding already samples per unit")
    table = private_table(source, policy, analyst, joined=bool(select.args.get("joins")))
    return table, source.alias or None, None


# 3 -------------------------------------------------------------------------------------------
def _check_where(select: exp.Select, resolve: Resolver) -> exp.Expression | None:
    where = select.args.get("where")
    if where is None:
        return None
    reject_raw_local(where.this, resolve, "WHERE")
    predicate = coerce_literals(where.this, resolve)
    kind = type_row_expression(predicate, resolve).kind
    if kind not in ("bool", "null"):
        raise DatatypeMismatch(f"argument of WHERE must be a boolean, got {kind}")
    return predicate


# 4 -------------------------------------------------------------------------------------------
def _resolve_keys(select: exp.Select, table: TablePolicy, resolve: Resolver
                  ) -> tuple[GroupKey, ...]:
    group = select.args.get("group")
    if group is None:
        return ()
    # (sqlglot puts them among the keys, or in args of their own in older releases)
    if any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup")) or any(
            isinstance(e, exp.Rollup | exp.Cube | exp.GroupingSets)
            for e in group.expressions):
        raise NotSupportedError("GROUPING SETS, CUBE and ROLLUP are not supported",
                                hint="run one GROUP BY per grouping (each is charged; a "
                                     "total is GROUP BY nothing)")
    keys: list[GroupKey] = []
    for item in group.expressions:
        node = _dereference(item, select.expressions, table)
        if node.find(WindowRef) is not None:  # GROUP BY 2 or an alias naming a window
            raise WindowingError("window functions are not allowed in GROUP BY")
        while isinstance(node, exp.Paren):
            node = node.this
        if not isinstance(node, exp.Column):
            key = _expression_key(node, table, resolve)
            if all(k.name != key.name for k in keys):
                keys.append(key)
            continue
        column = resolve(node)
        if column.ldp is not None:
            raise raw_read_error(column, "GROUP BY")
        if column.name == table.privacy_unit:
            raise PrivacyViolation(
                f"GROUP BY the privacy unit {column.name} would release one group per unit",
                hint=f"count units instead: COUNT(DISTINCT {column.name})")
        if any(k.name == column.name for k in keys):
            continue
        keys.append(GroupKey(column.name, column, column.public_domain))
    count = 1
    for key in keys:
        count *= len(key.values) if key.values is not None else 1
    if all(k.values is not None for k in keys) and count > _MAX_GROUPS:
        raise NotSupportedError(f"GROUP BY would release {count:,} groups (at most "
                                f"{_MAX_GROUPS:,})", hint="group by fewer columns")
    return tuple(keys)


def _expression_key(node: exp.Expression, table: TablePolicy, resolve: Resolver) -> GroupKey:
    """A GROUP BY row expression: allowlisted, typed, never over the privacy unit or a
    local-DP column; public values when it reads one column with public values."""
    if isinstance(node, exp.Literal | exp.Null | exp.Boolean):
        raise NotSupportedError(f"GROUP BY {written_sql(node)} is not supported",
                                hint="group by a column, a select-list position, or an "
                                     "expression over columns")
    if node.find(exp.AggFunc) is not None:
        raise GroupingError(f"aggregate functions are not allowed in GROUP BY: "
                            f"{written_sql(node)}")
    columns: dict[str, ColumnPolicy] = {}
    for ref in node.find_all(exp.Column):
        column = resolve(ref)
        if column.ldp is not None:
            raise raw_read_error(column, "GROUP BY")
        if column.name == table.privacy_unit:
            raise PrivacyViolation(
                f"GROUP BY {written_sql(node)} reads the privacy unit {column.name}, so "
                "it could release one group per unit",
                hint=f"count units instead: COUNT(DISTINCT {column.name})")
        columns[column.name] = column
    expression = coerce_literals(_unqualified(node, resolve), resolve)
    typed = type_row_expression(expression, resolve)
    if not columns:
        raise NotSupportedError(f"GROUP BY {written_sql(node)}: a constant groups nothing",
                                hint="remove it, or group by an expression over columns")
    column_type = key_type(typed)
    name = expression.sql("postgres")
    values = None
    source = None
    if len(columns) == 1 and enumerable(expression,
                                        lambda n: type_row_expression(n, resolve)):
        (column,) = columns.values()
        if column.public_domain is not None:
            # an empty image (NULL for every public value) would release no group at all:
            # leave such a key to partition selection, as a private one
            values = key_values(expression, column, column_type, table) or None
            source = column.name if values is not None else None
    described = ColumnPolicy(
        name, column_type,
        typed.lower if typed.kind == "num" and typed.bounded else None,
        typed.upper if typed.kind == "num" and typed.bounded else None,
        values, typed.nullable)
    return GroupKey(name, described, values, expression, source)


def _unqualified(node: exp.Expression, resolve: Resolver) -> exp.Expression:
    """A copy with every column named as in the policy, without its table qualifier:
    `a.AGE / 10` and `age / 10` are the same key."""
    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not isinstance(n.this, exp.Star):
            return exp.column(resolve(n).name)
        return n
    return node.copy().transform(swap)


def _key_expressions(node: exp.Expression, keys: Sequence[GroupKey], resolve: Resolver
                     ) -> exp.Expression:
    """A copy where each occurrence of an expression key (outside aggregates) is a column
    reference to the key, as PostgreSQL matches select-list expressions to GROUP BY, and
    each column naming a column key is that key by its name (`SEX` is `sex`: evaluation
    reads keys by name)."""
    names = {k.name for k in keys if k.expression is not None}
    columns = {k.name for k in keys if k.expression is None}

    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.find_ancestor(exp.AggFunc) is None \
                and not (n.name in names and not n.table):
            try:
                column = resolve(n)
            except Error:
                return n  # refused where it is checked
            return exp.column(column.name) if column.name in columns else n
        if isinstance(n, exp.Column | exp.Literal | exp.AggFunc | WindowRef) \
                or n.find_ancestor(exp.AggFunc) is not None or not names:
            return n
        inner = n
        while isinstance(inner, exp.Paren):
            inner = inner.this
        try:
            text = coerce_literals(_unqualified(inner, resolve), resolve).sql("postgres")
        except Error:  # not a row expression (e.g. over aggregates): not a key
            return n
        return exp.column(text, quoted=True) if text in names else n

    return node.transform(swap)


def _dereference(item: exp.Expression, select_items: Sequence[exp.Expression],
                 table: TablePolicy) -> exp.Expression:
    """GROUP BY 1 and GROUP BY alias refer to select-list items, as in PostgreSQL (where a
    table column of the same name wins over an alias)."""
    if isinstance(item, exp.Literal) and not item.is_string:
        index = int(item.this)
        if not 1 <= index <= len(select_items):
            raise ProgrammingError(f"GROUP BY position {index} is not in select list")
        target = select_items[index - 1]
        return target.this if isinstance(target, exp.Alias) else target
    if isinstance(item, exp.Column) and not item.table and not _names_column(item, table):
        for target in select_items:  # names folded as PostgreSQL folds them
            if isinstance(target, exp.Alias) and output_name(target) == output_name(item):
                return target.this
    return item


def _names_column(item: exp.Column, table: TablePolicy) -> bool:
    """Whether `item` names a column of `table`, as the resolver reads names."""
    return by_name(table.columns, item.name, quoted(item)) is not None


# 5 -------------------------------------------------------------------------------------------
def _clamp_hint(function: str, arg: exp.Expression, t: ExprType) -> str:
    lo = f"{t.lower:g}" if t.lower != float("-inf") else "<lower>"
    hi = f"{t.upper:g}" if t.upper != float("inf") else "<upper>"
    text = written_sql(arg)
    return (f"clamp the argument to bounds you choose, e.g. "
            f"{function}(LEAST(GREATEST({text}, {lo}), {hi})), or declare lower/upper for the "
            "column in the policy")


# PostgreSQL's VARIANCE and STDDEV are the sample forms (sqlglot parses VARIANCE as
# VAR_SAMP).
_VARIANCE_FUNCTIONS: dict[type[exp.Expression], str] = {
    exp.VariancePop: "var_pop", exp.Variance: "var_samp", exp.StddevPop: "stddev_pop",
    exp.StddevSamp: "stddev_samp", exp.Stddev: "stddev_samp",
}


_ONE_ARGUMENT = frozenset({"this"})
# The arguments each supported aggregate's rule reads (see _aggregate_parts)
_AGGREGATE_READS: dict[type[exp.Expression], frozenset[str]] = {
    exp.Count: frozenset({"this", "big_int"}),  # big_int: a spelling (COUNT_BIG)
    exp.PercentileCont: frozenset({"this", "expression"}),
    exp.Mode: frozenset({"this", "deterministic"}),
    **{t: _ONE_ARGUMENT for t in (exp.ApproxDistinct, exp.CountIf, exp.Sum, exp.Avg,
                                  exp.Median, exp.Min, exp.Max, *_VARIANCE_FUNCTIONS)},
}


def _aggregate_parts(node: exp.AggFunc, table: TablePolicy
                     ) -> tuple[str, exp.Expression | None]:
    """The rule name and the row-expression argument of an aggregate call."""
    # an argument sqlglot parses that no rule reads (COUNT(a, b)'s second) is refused, not
    # dropped from the rewrite unseen
    if type(node) in _AGGREGATE_READS:
        check_arguments(node, _AGGREGATE_READS[type(node)],
                        f"supported aggregates: {SUPPORTED_HELP}")
    arg = node.this
    if isinstance(node, exp.Count):
        if isinstance(arg, exp.Star):
            return "count", None
        if isinstance(arg, exp.Distinct):
            cols = arg.expressions
            if len(cols) != 1:
                raise NotSupportedError(
                    f"{written_sql(node)}: COUNT(DISTINCT …) takes one expression",
                    hint="count the distinct values of one column or row expression")
            if isinstance(cols[0], exp.Column) and cols[0].name == table.privacy_unit:
                return "count_units", None
            return "count_distinct", cols[0]
        return "count", arg
    if isinstance(node, exp.ApproxDistinct):  # a DP distinct count is an estimate anyway
        return _aggregate_parts(exp.Count(this=exp.Distinct(expressions=[arg])), table)
    if isinstance(node, exp.CountIf):  # DuckDB's COUNT_IF(c): COUNT(CASE WHEN c THEN 1 END)
        return "count", exp.Case(ifs=[exp.If(this=arg, true=exp.Literal.number(1))])
    if isinstance(node, exp.Sum | exp.Avg):
        if isinstance(arg, exp.Distinct):
            raise NotSupportedError(f"{node.key.upper()}(DISTINCT …) is not supported")
        return node.key.lower(), arg
    if isinstance(node, exp.Median | exp.Min | exp.Max | exp.PercentileCont):
        return _quantile_parts(node)
    if isinstance(node, exp.Mode):
        if arg is None or isinstance(arg, exp.Distinct):
            raise NotSupportedError("MODE needs WITHIN GROUP (ORDER BY …)",
                                    hint="write MODE() WITHIN GROUP (ORDER BY expr)")
        return "mode", arg
    if isinstance(node, exp.PercentileDisc):
        raise NotSupportedError(
            f"{written_sql(node)}: PERCENTILE_DISC returns a value of some row, which no "
            "noise can protect", hint="use PERCENTILE_CONT(p) WITHIN GROUP (ORDER BY …), a "
                                      "differentially private estimate of the same quantile")
    variance = _VARIANCE_FUNCTIONS.get(type(node))
    if variance is not None:
        if isinstance(arg, exp.Distinct):
            raise NotSupportedError(
                f"{variance.upper()}(DISTINCT …) is not supported",
                hint=f"{variance.upper()} over all rows is; duplicates are part of the spread")
        return variance, arg
    if isinstance(node, exp.GroupConcat | exp.ArrayAgg | exp.JSONArrayAgg | exp.AnyValue):
        raise PrivacyViolation(
            f"{written_name(node)} returns values of the rows themselves, which no noise can "
            "protect", hint="GROUP BY the column, if its values are public, and COUNT(*)")
    if isinstance(node, exp.LogicalOr | exp.LogicalAnd):
        raise NotSupportedError(
            f"aggregate {written_name(node)} is not supported: whether any row (or every row) "
            "matches can turn on one person", hint="count the rows that match instead, "
                                                   "COUNT(*) FILTER (WHERE …), and compare")
    raise NotSupportedError(f"aggregate {written_name(node)} is not supported",
                            hint=f"supported aggregates: {SUPPORTED_HELP}")


def _quantile_parts(node: exp.AggFunc) -> tuple[str, exp.Expression | None]:
    """MEDIAN / MIN / MAX (rules "median", "min", "max") and PERCENTILE_CONT after
    `_fold_within_group` ("percentile_cont"; its p is read by `_quantile_of`)."""
    arg = node.this
    if isinstance(arg, exp.Distinct):
        raise NotSupportedError(f"{node.sql_name()}(DISTINCT …) is not supported")
    if isinstance(node, exp.PercentileCont):
        if node.args.get("expression") is None:
            raise NotSupportedError(
                "PERCENTILE_CONT needs WITHIN GROUP (ORDER BY …)",
                hint="write PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY expr)")
        return "percentile_cont", arg
    return node.key.lower(), arg


def _check_date_values(aggregates: Sequence[AggregateCall], outputs: Sequence[Output],
                       having: exp.Expression | None, order: Sequence[OrderItem],
                       calls: Sequence[WindowCall]) -> None:
    """A date's quantile (MIN(day), …) or a MODE of text or truth values is an output or
    ORDER BY item of its own: the post-processing of outputs computes with numbers."""
    typed = {a.sql: str(a.rule.value_type) for a in aggregates
             if a.rule.value_type in _NOT_NUMBERS}
    if not typed:
        return
    places = [o.expression for o in outputs if o.aggregate is None]
    places += [having] if having is not None else []
    places += [i.expression for i in order if not isinstance(i.expression, AggregateRef)]
    places += [part for call in calls for part in (*call.arguments, *call.partition,
                                                  *(i.expression for i in call.order))]
    for place in places:
        used = next((r.this for r in place.find_all(AggregateRef) if r.this in typed), None)
        if used is not None:
            raise _not_a_number(str(used), typed[str(used)])


_NOT_NUMBERS = {"date": "a date", "text": "text", "bool": "a truth value"}


def _not_a_number(aggregate: str, value_type: str) -> NotSupportedError:
    return NotSupportedError(
        f"{aggregate} is {_NOT_NUMBERS[value_type]}: it can be an output or an ORDER BY item "
        "on its own, not part of an expression, HAVING or a window",
        hint="select the value itself and compute with it in the client")


def _refuse_values_inside(node: exp.Expression, aggregates: Sequence[AggregateCall]) -> None:
    """`_check_date_values` before the output checks, which read a quoted literal beside
    an aggregate as a number (MODE(…) = 'HS-grad' would be 22P02 otherwise)."""
    if isinstance(node, exp.AggFunc):
        return  # the whole output or ORDER BY item
    typed = {a.sql: a.rule.value_type for a in aggregates if a.rule.value_type in _NOT_NUMBERS}
    for found in node.find_all(exp.AggFunc) if typed else ():
        key = found.sql("postgres")
        if key in typed:
            raise _not_a_number(key, str(typed[key]))


def _date_as_days(key: str, node: exp.AggFunc, arg: exp.Expression, resolve: Resolver
                  ) -> tuple[exp.Expression, ExprType]:
    """A quantile's date argument as its day number, `arg - DATE '1970-01-01'`, typed
    with the date's bounds (`date_bounds`); refused where it has none."""
    lower, upper = date_bounds(arg, resolve)
    if not (math.isfinite(lower) and math.isfinite(upper)):
        text = arg.sql("postgres")
        clamped = f"LEAST(GREATEST({text}, DATE '2024-01-01'), DATE '2024-12-31')"
        example = (f"PERCENTILE_CONT({node.expression.sql('postgres')}) WITHIN GROUP "
                   f"(ORDER BY {clamped})" if isinstance(node, exp.PercentileCont)
                   else f"{node.sql_name()}({clamped})")
        raise PrivacyViolation(
            f"{key}: no bound is known for the dates of {text}, so the answer could be any "
            "date", hint=f"clamp them to a range you choose, e.g. {example}, or declare "
                         "lower and upper dates (or a public_range) for the column in the "
                         "policy")
    days = exp.Sub(this=arg.copy(), expression=date_literal(EPOCH))
    return days, ExprType("num", lower, upper, integer=True)


def _mode_of_public_values(key: str, arg: exp.Expression, resolve: Resolver
                           ) -> tuple[exp.Expression, ExprType, AggregateRule]:
    """MODE of a text column with public values: the position of its value in the list
    (CASE col WHEN v0 THEN 0 …, NULL for a value outside it), drawn over the positions and
    released as the value. Refused for other text: the candidates would be the rows' own
    values. (Numbers and dates are drawn over their bounded range, truth values over
    false and true.)"""
    column_node = arg
    while isinstance(column_node, exp.Paren):
        column_node = column_node.this
    column = resolve(column_node) if isinstance(column_node, exp.Column) else None
    values = column.public_values if column is not None else None
    if column is None or values is None:
        raise PrivacyViolation(
            f"{key}: the values of {written_sql(arg)} are not public, so the most frequent "
            "one could be a value of a single row",
            hint="declare public_values for the column in the policy (the candidates), or "
                 "take the MODE of a whole number with bounds")
    if len(values) > MAX_BINS:
        raise NotSupportedError(f"{key}: MODE draws among at most {MAX_BINS} values; "
                                f"{column.name} has {len(values)} public values")
    case = exp.Case(this=column_node.copy(), ifs=[
        exp.If(this=exp.Literal.string(str(v)), true=exp.Literal.number(i))
        for i, v in enumerate(values)])
    case.meta.update(written=column_node.sql("postgres"), candidates=len(values))
    return case, ExprType("num", 0, len(values) - 1, integer=True), \
        mode_rule(tuple(values), "text")


def _mode_of_truth(arg: exp.Expression) -> tuple[exp.Expression, ExprType, AggregateRule]:
    """MODE of a truth value: false and true are the candidates, whatever the data."""
    case = exp.Case(ifs=[exp.If(this=exp.paren(arg.copy()), true=exp.Literal.number(1)),
                         exp.If(this=exp.Not(this=exp.paren(arg.copy())),
                                true=exp.Literal.number(0))])
    case.meta.update(written=arg.sql("postgres"), candidates=2)
    return case, ExprType("num", 0, 1, integer=True), mode_rule((False, True), "bool")


def _check_mode_candidates(key: str, arg: exp.Expression, t: ExprType) -> None:
    """MODE over numbers draws among the whole numbers of the argument's bounds: one bin
    per candidate, at most MAX_BINS of them."""
    if t.kind == "null":
        return
    if not t.integer:
        raise NotSupportedError(
            f"{key}: MODE of {written_sql(arg)} needs whole numbers (a real number "
            "rarely repeats)", hint="round it first, e.g. MODE() WITHIN GROUP (ORDER BY "
                                    f"ROUND({written_sql(arg)}))")
    if t.bounded and t.upper - t.lower + 1 > MAX_BINS:
        raise NotSupportedError(
            f"{key}: MODE draws among at most {MAX_BINS} values; {written_sql(arg)} "
            f"ranges over {t.upper - t.lower + 1:,.0f}",
            hint="clamp it to a narrower range with LEAST(GREATEST(…)), or bin it, e.g. "
                 "with WIDTH_BUCKET")


def _quantile_of(node: exp.Expression) -> Fraction:
    return _quantile_literal(node.args["expression"], "PERCENTILE_CONT")


def _quantile_clamp_hint(node: exp.Expression, arg: exp.Expression, t: ExprType) -> str:
    lo = f"{t.lower:g}" if t.lower != float("-inf") else "<lower>"
    hi = f"{t.upper:g}" if t.upper != float("inf") else "<upper>"
    clamped = f"LEAST(GREATEST({written_sql(arg)}, {lo}), {hi})"
    if isinstance(node, exp.PercentileCont):
        p = node.expression.sql("postgres")
        example = f"PERCENTILE_CONT({p}) WITHIN GROUP (ORDER BY {clamped})"
    elif isinstance(node, exp.Mode):
        example = f"MODE() WITHIN GROUP (ORDER BY {clamped})"
    else:
        example = f"{node.sql_name()}({clamped})"
    return (f"clamp the argument to bounds you choose, e.g. {example}, or declare lower/upper "
            "for the column in the policy")


def _collect_aggregates(select: exp.Select, table: TablePolicy, resolve: Resolver,
                        public_rows: bool, more: Sequence[exp.Expression] = ()
                        ) -> tuple[tuple[Statistic, ...], tuple[AggregateCall, ...]]:
    """The aggregates of the select list, HAVING, ORDER BY and `more` (what window calls
    read), their statistics shared."""
    statistics: list[Statistic] = []
    aggregates: dict[str, AggregateCall] = {}
    places: list[exp.Expression] = [*select.expressions, *more]
    for clause in ("having", "order"):
        if select.args.get(clause) is not None:
            places.append(select.args[clause])
    for place in places:
        for node in place.find_all(exp.AggFunc):
            if node.find_ancestor(exp.AggFunc) is not None:
                raise GroupingError(f"aggregate calls cannot be nested: {written_sql(node)}")
            key = node.sql("postgres")
            if key in aggregates:
                continue
            shown = written_sql(node)  # for messages: WIDTH_BUCKET, AGE as written
            if node.parent is not None and isinstance(node.parent, exp.Filter):
                raise NotSupportedError("aggregate FILTER (WHERE …) is not supported",
                                        hint="use CASE WHEN … THEN … END inside the aggregate")
            local = local_aggregate(node, table, resolve, public_rows)
            rule_name, arg = ("local", None) if local else _aggregate_parts(node, table)
            if arg is not None:
                arg = coerce_literals(arg, resolve)
            if local:
                rule = local[0]
            elif rule_name == "percentile_cont":
                rule = quantile_rule(_quantile_of(node))
            elif rule_name == "mode":
                rule = mode_rule()
            else:
                rule = RULES[rule_name]
            arg_type = None
            bounds = None
            if arg is not None:
                arg_type = type_row_expression(arg, resolve)
                if rule_name == "mode" and arg_type.kind == "bool":
                    arg, arg_type, rule = _mode_of_truth(arg)
                elif rule_name == "mode" and arg_type.kind not in ("num", "date", "null"):
                    arg, arg_type, rule = _mode_of_public_values(shown, arg, resolve)
                if rule.exponential and arg_type.kind == "date":
                    arg, arg_type = _date_as_days(shown, node, arg, resolve)
                    rule = replace(rule, value_type="date")
                if rule_name == "mode":
                    _check_mode_candidates(shown, arg, arg_type)
                if rule_name in ("sum", "avg") or rule_name in VARIANCE_RULES \
                        or rule.exponential:
                    name = node.sql_name() if rule.exponential else rule_name.upper()
                    if arg_type.kind not in ("num", "null"):
                        raise DatatypeMismatch(f"{name} needs a number, got "
                                               f"{arg_type.kind}: {written_sql(arg)}")
                    if not arg_type.bounded:
                        raise PrivacyViolation(
                            f"{shown}: no bound is known for {written_sql(arg)}, so one "
                            "person could change the result without limit",
                            hint=_quantile_clamp_hint(node, arg, arg_type) if rule.exponential
                            else _clamp_hint(rule_name.upper(), arg, arg_type))
                    if max(abs(arg_type.lower), abs(arg_type.upper)) > MAX_VALUE_BOUND:
                        raise NotSupportedError(
                            f"{shown}: the bounds of {written_sql(arg)}, [{arg_type.lower:g}, "
                            f"{arg_type.upper:g}], exceed ±{MAX_VALUE_BOUND:g}; the noise "
                            "would be as large and sums would lose exactness",
                            hint=_clamp_hint(name, arg, ExprType("num")))
                    half_range = (arg_type.upper - arg_type.lower) / 2
                    if rule_name in VARIANCE_RULES and half_range ** 2 > MAX_VALUE_BOUND:
                        # the centred sum of squares is a statistic of its own, with bounds
                        # [0, half_range²]: the same limit holds for it
                        raise NotSupportedError(
                            f"{shown}: the squared deviations of {written_sql(arg)} reach "
                            f"{half_range ** 2:g}, beyond ±{MAX_VALUE_BOUND:g}; the noise "
                            "would be as large and sums would lose exactness",
                            hint=f"clamp {written_sql(arg)} to a range at most "
                                 f"{2 * MAX_VALUE_BOUND ** 0.5:.4g} wide")
                    bounds = (arg_type.lower, arg_type.upper)
            indexes = []
            for statistic in (local[1] if local else rule.statistics(arg, arg_type)):
                same = next((i for i, s in enumerate(statistics)
                             if s.identity == statistic.identity), None)
                if same is None:
                    statistics.append(statistic)
                    same = len(statistics) - 1
                indexes.append(same)
            aggregates[key] = AggregateCall(key, rule, tuple(indexes), bounds,
                                            shown if shown != key else None)
    kinds = {s.kind for s in statistics}
    if {"count_distinct", "quantile"} <= kinds:
        # a quantile's statement counts per group and histogram bin, and distinct values
        # do not add up over bins
        raise NotSupportedError(
            "COUNT(DISTINCT …) and a quantile (MEDIAN, PERCENTILE_CONT, MIN, MAX, MODE) in one "
            "query are not supported", hint="ask for them in two queries")
    return tuple(statistics), tuple(aggregates.values())


# 6 -------------------------------------------------------------------------------------------
def _resolve_outputs(select: exp.Select, keys: tuple[GroupKey, ...],
                     aggregates: tuple[AggregateCall, ...], resolve: Resolver,
                     window_nodes: Sequence[exp.Window] = ()
                     ) -> tuple[tuple[Output, ...], exp.Expression | None, tuple[OrderItem, ...],
                                tuple[WindowCall, ...]]:
    key_names = [k.name for k in keys]
    expression_keys = {k.name for k in keys if k.expression is not None}
    aggregate_index = {a.sql: i for i, a in enumerate(aggregates)}

    def check_key(node: exp.Column) -> None:
        if node.name in expression_keys and not node.table:
            return  # an expression key, matched by `_key_expressions`
        column = resolve(node)
        if column.ldp is not None:
            raise raw_read_error(column, "reading it outside COUNT or AVG")
        if column.name not in key_names:
            raise PrivacyViolation(
                f"column {column.name} is neither aggregated nor a GROUP BY key: its raw "
                "values would be released",
                hint=f"aggregate it (COUNT, SUM, AVG) or GROUP BY {column.name} if its values "
                     "are public")

    outputs: list[Output] = []
    for item in select.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            raise PrivacyViolation("SELECT * would release raw rows",
                                   hint="select aggregates, e.g. SELECT COUNT(*) FROM …")
        body = item.this if isinstance(item, exp.Alias) else item
        body = _key_expressions(body, keys, resolve)
        _refuse_values_inside(body, aggregates)
        check_output_expression(body, check_key, whole_output=True)
        key_index = None
        if isinstance(body, exp.Column):
            key_index = key_names.index(body.name if body.name in expression_keys
                                        else resolve(body).name)
        aggregate = aggregate_index.get(body.sql("postgres")) \
            if isinstance(body, exp.AggFunc) else None
        outputs.append(Output(output_name(item), body, aggregate, key_index))

    aliases = {o.name: o.expression for o in outputs}

    def substitute_aliases(node: exp.Expression, keys_first: bool) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.Column) and not n.table and output_name(n) in aliases \
                    and not (keys_first and n.name in key_names) \
                    and n.find_ancestor(exp.AggFunc) is None:
                return aliases[output_name(n)].copy()  # names folded as the outputs' are
            return n
        return node.transform(swap)

    having = None
    if select.args.get("having") is not None:
        having = _key_expressions(substitute_aliases(select.args["having"].this,
                                                     keys_first=True), keys, resolve)
        if having.find(WindowRef) is not None:  # an alias naming a window
            raise WindowingError("window functions are not allowed in HAVING",
                                 hint="filter on the aggregates themselves")
        _refuse_values_inside(exp.paren(having), aggregates)
        check_output_expression(having, check_key)

    order: list[OrderItem] = []
    if select.args.get("order") is not None:
        for ordered in select.args["order"].expressions:
            target = ordered.this
            if isinstance(target, exp.Literal) and not target.is_string:
                index = int(target.this)
                if not 1 <= index <= len(outputs):
                    raise ProgrammingError(f"ORDER BY position {index} is not in select list")
                target = outputs[index - 1].expression
            else:
                target = _key_expressions(substitute_aliases(target, keys_first=False), keys,
                                          resolve)
            _refuse_values_inside(target, aggregates)
            check_output_expression(target, check_key)
            descending = bool(ordered.args.get("desc"))
            nulls_first = ordered.args.get("nulls_first")
            # PostgreSQL's default: NULLS LAST when ascending, NULLS FIRST when descending
            order.append(OrderItem(target, descending,
                                   bool(nulls_first) if nulls_first is not None else descending))
    names = {a.sql: a.sql for a in aggregates}
    outputs = [replace(o, expression=refer_to_aggregates(o.expression, names)) for o in outputs]
    order = [replace(o, expression=refer_to_aggregates(o.expression, names)) for o in order]
    if having is not None:
        having = refer_to_aggregates(having, names)

    def prepare(node: exp.Expression) -> exp.Expression:
        # what a window reads: keys and aggregates, as outputs read them (no output alias,
        # as in PostgreSQL, where OVER (…) sees the query's columns only)
        node = _key_expressions(node, keys, resolve)
        check_output_expression(node, check_key)
        return refer_to_aggregates(node, names)
    calls = tuple(describe(node, f"__window{i}", prepare)
                  for i, node in enumerate(window_nodes))
    return tuple(outputs), having, tuple(order), calls


def _limit_offset(select: exp.Select) -> tuple[int | None, int]:
    """LIMIT n, LIMIT ALL (none), FETCH FIRST [n] ROWS ONLY (n defaults to 1), OFFSET m."""
    def constant(clause: str) -> int | None:
        node = select.args.get(clause)
        if node is None:
            return None
        if isinstance(node, exp.Fetch):
            options = node.args.get("limit_options")
            if options is not None and (options.args.get("percent")
                                        or options.args.get("with_ties")):
                raise NotSupportedError("FETCH FIRST … PERCENT or WITH TIES is not supported",
                                        hint="FETCH FIRST n ROWS ONLY, or LIMIT n")
            value = node.args.get("count") or exp.Literal.number(1)
        else:
            value = node.expression
        if isinstance(value, exp.Null) or (isinstance(value, exp.Var)
                                           and value.name.upper() == "ALL"):
            return None
        if not isinstance(value, exp.Literal) or value.is_string or not value.this.isdigit():
            raise NotSupportedError(f"{clause.upper()} must be a non-negative integer constant")
        return int(value.this)

    return constant("limit"), constant("offset") or 0


__all__ += ["OUTPUT_FUNCTIONS_HELP"]
