"""SQL's PREPARE and EXECUTE: the protocol's prepared statements, typed in by hand.

`PREPARE name [(type, …)] AS query` keeps a statement under a name, exactly as a Parse
message does (one table: DEALLOCATE and the protocol's Close drop either kind), and
`EXECUTE name [(constant, …)]` runs it with those constants as its parameters, as a Bind
of their text forms would: the statement is analysed and charged when it runs, each
execution like the same query sent alone (a repeat with the same values is its first
answer). Parameters are constants only (numbers, strings, NULL, TRUE/FALSE, a cast of
one), as a client's bound values are.

>>> parse("PREPARE adults (int) AS SELECT COUNT(*) FROM adult WHERE age > $1")
Prepare(name='adults', types=('int',), query='SELECT COUNT(*) FROM adult WHERE age > $1')
>>> parse("PREPARE p (numeric(10, 2), double precision) AS SELECT 1").types
('numeric(10, 2)', 'double precision')
>>> parse("EXECUTE adults(40)")
ExecutePrepared(name='adults', params=('40',))
>>> parse("execute Q ('it''s', -1.5, NULL, TRUE, '2024-01-01'::date)").params
("it's", '-1.5', None, 't', '2024-01-01')
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from .. import errors
from ..parse import DIALECT, tokenize
from .cursors import statement_name

WORDS = frozenset({"PREPARE", "EXECUTE"})
# What PostgreSQL lets PREPARE keep that dpproxy answers (it also keeps DML, refused anyway)
_QUERY_WORDS = frozenset({"SELECT", "VALUES", "TABLE", "WITH", "("})
_PREPARE_USAGE = "PREPARE name [(type, …)] AS SELECT …"


@dataclass(frozen=True)
class Prepare:
    name: str
    types: tuple[str, ...]  # parameter types as written; fewer than used: the rest inferred
    query: str


@dataclass(frozen=True)
class ExecutePrepared:
    name: str
    params: tuple[str | None, ...]  # each parameter's text form; None: NULL


def parse(text: str) -> Prepare | ExecutePrepared | None:
    """The PREPARE or EXECUTE statement `text` is; None for any other."""
    tokens = tokenize(text)
    if not tokens or tokens[0].text.upper() not in WORDS:
        return None
    # the rest comes as one string token (its offsets are not the rest's): read it apart
    rest = text[tokens[0].end + 1:]
    words = tokenize(rest)
    if not words:
        raise errors.SyntaxError(f"{tokens[0].text.upper()} needs a statement name")
    name = statement_name(words[0])
    if tokens[0].text.upper() == "PREPARE":
        return _prepare(name, rest, words)
    return ExecutePrepared(name, _constants(rest, words))


def _prepare(name: str, rest: str, words: list[Token]) -> Prepare:
    i, types = 1, []
    if i < len(words) and words[i].token_type == TokenType.L_PAREN:
        close = _closing(words, i)
        current: list[Token] = []
        depth = 0  # numeric(10, 2): a comma inside a type's own parentheses is its own
        for token in words[i + 1:close + 1]:
            if depth == 0 and token.token_type in (TokenType.COMMA, TokenType.R_PAREN):
                if current:
                    types.append(rest[current[0].start:current[-1].end + 1])
                current = []
                continue
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(token.token_type, 0)
            current.append(token)
        i = close + 1
    if i >= len(words) or words[i].text.upper() != "AS" or i + 1 >= len(words):
        raise errors.SyntaxError("PREPARE needs AS and a query", hint=_PREPARE_USAGE)
    if words[i + 1].text.upper() not in _QUERY_WORDS:
        raise errors.SyntaxError(
            f"a prepared statement here is a query: syntax error at or near "
            f"\"{words[i + 1].text}\"", hint=_PREPARE_USAGE)
    return Prepare(name, tuple(types), rest[words[i + 1].start:].strip().rstrip(";").strip())


def _closing(words: list[Token], opening: int) -> int:
    """The index of the parenthesis closing the one at `opening`."""
    depth = 0
    for j in range(opening, len(words)):
        if words[j].token_type == TokenType.L_PAREN:
            depth += 1
        elif words[j].token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                return j
    raise errors.SyntaxError("a parenthesis is not closed")


def _constants(rest: str, words: list[Token]) -> tuple[str | None, ...]:
    """EXECUTE's parameters: the text forms of the constants in parentheses after the
    name, read by sqlglot as a select list."""
    if len(words) == 1 or (len(words) == 2 and words[1].token_type == TokenType.SEMICOLON):
        return ()
    if words[1].token_type != TokenType.L_PAREN:
        raise errors.SyntaxError(f"syntax error at or near \"{words[1].text}\"",
                                 hint="EXECUTE name [(constant, …)]")
    close = _closing(words, 1)
    if any(w.token_type != TokenType.SEMICOLON for w in words[close + 1:]):
        raise errors.SyntaxError(f"syntax error at or near \"{words[close + 1].text}\"")
    inside = rest[words[1].end + 1:words[close].start]
    if not inside.strip():
        return ()
    try:
        select = sqlglot.parse_one(f"SELECT {inside}", read=DIALECT)
    except sqlglot.errors.ParseError:
        raise errors.SyntaxError("EXECUTE's parameters must be constants") from None
    return tuple(_text_of(item) for item in select.expressions)


def _text_of(node: exp.Expression) -> str | None:
    """A constant's text form, as a client would bind it."""
    while isinstance(node, exp.Paren | exp.Cast):
        node = node.this  # the prepared statement's parameter type reads the text
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return "t" if node.this else "f"
    if isinstance(node, exp.Literal):
        return node.this
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) \
            and not node.this.is_string:
        return f"-{node.this.this}"
    raise errors.NotSupportedError(
        f"EXECUTE's parameters must be constants, got {node.sql('postgres')}",
        hint="pass each value as a number, a 'string', NULL, TRUE or FALSE")
