"""Types of `$n` parameters a client did not declare, for ParameterDescription.

asyncpg sends Parse without parameter types and encodes its arguments by the
types the server answers, so they must be concrete: a `$n::type` cast gives
that type; `$n` compared with (or BETWEEN, IN, LIKE) a column of a granted
table gets the column's type from the policy, and in `col = ANY($n)` an array
of it; LIMIT/OFFSET take int8; anything else is text.

>>> from pathlib import Path
>>> from dpproxy.policy import load_policy
>>> policy = load_policy(Path(__file__).parents[2] / "policies" / "demo.toml")
>>> infer("SELECT COUNT(*) FROM adult WHERE age > $1 AND sex = $2 LIMIT $4",
...       4, policy, policy.analyst("alice"))
[20, 25, 25, 20]
>>> infer("SELECT $1::float8 AS x", 1, policy, policy.analyst("alice"))
[701]
>>> infer("SELECT COUNT(*) FROM adult WHERE age = ANY($1)", 1, policy, policy.analyst("alice"))
[1016]
"""

from __future__ import annotations

import itertools
import logging

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from ..parse import DIALECT, is_all_call
from ..policy import AnalystPolicy, Policy
from . import codec

log = logging.getLogger("dpproxy.server")

COLUMN_OIDS = {"int": codec.INT8, "float": codec.FLOAT8, "text": codec.TEXT_OID,
               "date": codec.DATE, "bool": codec.BOOL}
_CAST_OIDS = {
    exp.DataType.Type.BIGINT: codec.INT8, exp.DataType.Type.INT: codec.INT4,
    exp.DataType.Type.SMALLINT: codec.INT2, exp.DataType.Type.DOUBLE: codec.FLOAT8,
    exp.DataType.Type.FLOAT: codec.FLOAT4, exp.DataType.Type.DECIMAL: codec.NUMERIC,
    exp.DataType.Type.TEXT: codec.TEXT_OID, exp.DataType.Type.VARCHAR: codec.VARCHAR,
    exp.DataType.Type.CHAR: 1042, exp.DataType.Type.DATE: codec.DATE,
    exp.DataType.Type.BOOLEAN: codec.BOOL, exp.DataType.Type.TIMESTAMP: codec.TIMESTAMP,
    exp.DataType.Type.TIMESTAMPTZ: 1184,
}
# the array type of each column type, for `col = ANY($1)`
_ARRAY_OIDS = {t.element: t.oid for t in codec.TYPES_BY_OID.values() if t.element}
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike,
                exp.Between, exp.In)


def count_parameters(sql: str) -> int:
    """The highest `$n` in the statement, from its tokens (works for SQL sqlglot cannot
    parse into a tree)."""
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
    except TokenError:
        return 0
    highest = 0
    for token, following in itertools.pairwise(tokens):
        if token.token_type == TokenType.PARAMETER and following.token_type == TokenType.NUMBER \
                and following.start == token.end + 1 and following.text.isdigit():
            highest = max(highest, int(following.text))
    return highest


def _cast_oid(node: exp.Cast) -> int:
    to = node.to
    oid = _CAST_OIDS.get(to.this) if isinstance(to, exp.DataType) else None
    if oid is None:
        oid = codec.pg_type(to.sql(DIALECT)).oid
    return oid


def _column_oid(column: exp.Column, scope_tables: dict[str, str], policy: Policy,
                analyst: AnalystPolicy) -> int | None:
    qualifier = column.table
    candidates = [scope_tables[qualifier]] if qualifier in scope_tables else \
        list(scope_tables.values())
    for table in candidates:
        if table in analyst.tables and table in policy.tables:
            spec = policy.tables[table].columns.get(column.name)
            if spec is not None:
                return COLUMN_OIDS[spec.type]
    return None


def _other_side(node: exp.Expression, parameter: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Between):
        return [node.this] if parameter is not node.this else []
    if isinstance(node, exp.In):
        return [node.this] if parameter is not node.this else []
    left, right = node.this, node.expression
    return [right] if parameter is left else [left]


def infer(sql: str, count: int, policy: Policy, analyst: AnalystPolicy) -> list[int]:
    """Type oids for $1..$count."""
    oids = [codec.TEXT_OID] * count
    if count == 0:
        return oids
    try:
        tree = sqlglot.parse_one(sql, read=DIALECT)
    except (ParseError, TokenError, ValueError):
        log.debug("parameter types: cannot parse statement; parameters are text")
        return oids
    if tree is None:
        return oids
    scope_tables = {(t.alias_or_name): t.name for t in tree.find_all(exp.Table)}
    for parameter in tree.find_all(exp.Parameter):
        try:
            index = int(parameter.name) - 1
        except ValueError:
            continue
        if not 0 <= index < count:
            continue
        node: exp.Expression = parameter
        parent = node.parent
        if isinstance(parent, exp.Cast):
            oids[index] = _cast_oid(parent)
            continue
        if isinstance(parent, exp.Limit | exp.Offset):
            oids[index] = codec.INT8
            continue
        while isinstance(parent, exp.Paren | exp.Tuple):
            node, parent = parent, parent.parent
        array = isinstance(parent, exp.Any) or is_all_call(parent)
        if array:  # `col = ANY($1)`: an array of the column's type
            node, parent = parent, parent.parent
        if isinstance(parent, _COMPARISONS):
            for other in _other_side(parent, node):
                if isinstance(other, exp.Cast):
                    oids[index] = _cast_oid(other)
                elif isinstance(other, exp.Column):
                    oid = _column_oid(other, scope_tables, policy, analyst)
                    if oid is not None:
                        oids[index] = _ARRAY_OIDS[oid] if array else oid
    return oids
