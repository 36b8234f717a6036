"""Parse: split a string into statements, classify each, bind parameters as AST literals.

Analysts write PostgreSQL's SQL (that is what their clients speak), whatever
the backend; the rewrite emits the backend's dialect. Parameters never touch
the SQL text: placeholders (`%s`, `%(name)s`, `$1`) are replaced in the
parsed tree by literal nodes.

>>> [s.kind for s in parse_statements("SET dpproxy.epsilon = 0.5; SELECT COUNT(*) FROM t")]
['set', 'select']
>>> parse_statements("SELECT COUNT(*) FROM t WHERE a > %s", [40])[0].ast.sql("postgres")
'SELECT COUNT(*) FROM t WHERE a > 40'

Time functions (NOW(), CURRENT_DATE…) are bound the same way, to the statement's clock,
and constant date arithmetic is evaluated with them (`dpproxy.clock`).

A string is parsed once: its statements, with their placeholders still in the tree,
are kept (by exact text) and bound afresh for every execution, so a prepared or
parameterized query pays sqlglot's parser only the first time. Binding, with all its
checks, runs every time, on a copy: the cached trees are never modified.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

import sqlglot
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from .clock import check_interval_literals, fold, folds, now, reads_clock
from .errors import (
    InvalidParameterValue,
    NotSupportedError,
    PrivacyViolation,
    ProgramLimitExceeded,
    ProgrammingError,
    SyntaxError,
)
from .postprocess import output_name


class DpPostgres(Postgres):
    """PostgreSQL as dpproxy reads it: sqlglot's, but for `$1,$2`, which sqlglot reads as
    the opening tag of a dollar-quoted string (`$1,$`) where PostgreSQL (whose tags never
    start with a digit) reads two parameters, as psycopg writes `%s,%s`. A text sqlglot
    cannot tokenize for that reason is tokenized again without dollar quotes."""

    class Tokenizer(Postgres.Tokenizer):
        def tokenize(self, sql: str) -> list[Token]:
            try:
                return super().tokenize(sql)
            except TokenError:
                if "$" not in sql:
                    raise
                return _WithoutDollarQuotes(dialect=self.dialect).tokenize(sql)


class _WithoutDollarQuotes(Postgres.Tokenizer):
    HEREDOC_STRINGS: ClassVar[list[str | tuple[str, str]]] = []
    SINGLE_TOKENS: ClassVar[dict[str, TokenType]] = {
        **Postgres.Tokenizer.SINGLE_TOKENS, "$": TokenType.PARAMETER}


DIALECT = "dppostgres"
# sqlglot warns when printing a clause the dialect lacks (IGNORE NULLS); the analyzer refuses
# such queries itself, so the warnings go only where an application routes its logging
logging.getLogger("sqlglot").addHandler(logging.NullHandler())
StatementKind = Literal["select", "explain", "set", "reset", "show", "transaction", "noop"]

# Statements answered in the session, never sent anywhere: clients and pools send them.
_TRANSACTION_WORDS = {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"}
_NOOP_WORDS = {"SAVEPOINT", "RELEASE", "CLOSE", "UNLISTEN", "DISCARD", "DEALLOCATE"}
_WRITE_KINDS = (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Alter,
                exp.Copy, exp.TruncateTable)

Parameters = Sequence[Any] | Mapping[str, Any] | None
# meta key of a literal bound from a positional parameter: (the parameter's 0-based index,
# whether binding negated it: a negative value binds as -literal)
PARAMETER = "dpproxy_parameter"
PARSE_CACHE_SIZE = 1024
# "off" parses every string afresh, for A/B benchmarks.
_PARSE_CACHE_ON = os.environ.get("DPPROXY_PARSE_CACHE", "on").lower() != "off"
_parsed: OrderedDict[str, tuple[Statement, ...]] = OrderedDict()
_parsed_lock = threading.Lock()


@dataclass(frozen=True)
class Statement:
    kind: StatementKind
    text: str
    ast: exp.Expression | None = None  # select and explain: the (bound) query
    name: str | None = None  # set/reset/show: the setting's name, lower case
    value: Any = None  # set: the literal value
    # set: a value written as a placeholder (`SET dpproxy.epsilon = %s`), which
    # `parse_statements` binds into `value`, as a DB-API driver binding on the client does
    value_template: exp.Expression | None = None
    tag: str = ""  # command tag for the wire: SET, BEGIN, COMMIT...
    # select and explain: the tree before binding (shared: never modify it) and the
    # parameters bound into `ast`; the same template and parameters give the same `ast`.
    template: exp.Expression | None = None
    params: Parameters = None
    # select and explain: whether binding evaluates time functions or constant date
    # arithmetic (`dpproxy.clock`), and the clock they read (UTC) when the query calls one:
    # part of the query, as its parameters are
    folds: bool = False
    clock: dt.datetime | None = None
    explain_format: str = "text"  # explain: FORMAT TEXT or JSON

    @property
    def is_session_statement(self) -> bool:
        return self.kind in ("set", "reset", "show", "transaction", "noop")


# The longest text and the most tokens a statement may have: parsing grows with them
# (10,000 chained conditions took 2 s and 250 MB, a 15 MB text 14 GB), while what an analyst
# or a BI tool writes is a few thousand tokens. Refused before any parse; the text's length
# before it is tokenized too (on the server's event loop: 800,000 tokens held every client
# for 3 s).
MAX_TEXT = 200_000
MAX_TOKENS = 25_000


def tokenize(sql: str) -> list[Token]:
    """sqlglot's tokens of `sql` in PostgreSQL's dialect; a SyntaxError where it cannot,
    54000 where it is too long to parse."""
    if len(sql) > MAX_TEXT:
        raise _too_long(f"{len(sql):,} characters (at most {MAX_TEXT:,})")
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(sql)
    except TokenError as exc:
        raise SyntaxError(f"syntax error: {exc}", position=_unclosed_quote(sql)) from None
    if len(tokens) > MAX_TOKENS:
        raise _too_long(f"{len(tokens):,} tokens (at most {MAX_TOKENS:,})")
    return tokens


def _too_long(what: str) -> ProgramLimitExceeded:
    return ProgramLimitExceeded(f"the statement is too long to analyse: {what}",
                                hint="split it into smaller queries, or pass long lists "
                                     "of values as fewer, wider conditions")


def _unclosed_quote(sql: str) -> int:
    """1-based position of the quote that opens an unterminated literal (else 1)."""
    quote: str | None = None
    start = 0
    for i, ch in enumerate(sql):
        if quote is None and ch in "'\"":
            quote, start = ch, i
        elif ch == quote:
            quote = None  # a doubled quote closes and reopens: same result
    return start + 1 if quote is not None else 1


def split_statements(sql: str) -> list[tuple[str, list[Token], int]]:
    """Statement texts with their tokens and offsets in `sql`, split at top-level
    semicolons."""
    tokens = tokenize(sql)
    pieces: list[tuple[str, list[Token], int]] = []
    current: list[Token] = []
    for token in [*tokens, None]:
        if token is None or token.token_type == TokenType.SEMICOLON:
            if current:
                start, end = current[0].start, current[-1].end
                text = sql[start:end + 1]
                pieces.append((text, [_shift(t, start) for t in current], start))
            current = []
        else:
            current.append(token)
    return pieces


def keyword(token: Token) -> str:
    """A token's text as a keyword, upper case; "" for non-ASCII text, which is never one
    (as in PostgreSQL: "paſſword".upper() is "PASSWORD" in Python)."""
    return token.text.upper() if token.text.isascii() else ""


def sets_password(tokens: Sequence[Token], loose: bool = False) -> bool:
    """Whether a statement's tokens are a CREATE or ALTER of a ROLE or USER naming a
    PASSWORD: a statement the audit log must not keep as written. `loose`: any word that
    case-folds to one of those counts (what a log leaves out, to be safe)."""
    def word(t: Token) -> str:
        return t.text.casefold().upper() if loose else keyword(t)
    return len(tokens) >= 3 and word(tokens[0]) in ("ALTER", "CREATE") \
        and word(tokens[1]) in ("ROLE", "USER") \
        and any(word(t) == "PASSWORD" for t in tokens[2:])


def without_passwords(sql: str) -> str:
    """`sql` as a log may keep it: a statement setting a password, or looking as if it
    might (`sets_password`, loosely), is replaced by a note, and so is text that does not
    tokenize but mentions one."""
    if "password" not in sql.casefold():  # no such statement without the word
        return sql
    try:
        pieces: list[tuple[str, list[Token], int]] | None = split_statements(sql)
    except SyntaxError:
        pieces = None
    if pieces is None or any(sets_password(tokens, loose=True) for _, tokens, _ in pieces):
        return "(statement not logged: it sets a password)"
    return sql


def _shift(token: Token, offset: int) -> Token:
    return Token(token.token_type, token.text, token.line, token.col, token.start - offset,
                 token.end - offset, token.comments)


def clear_parse_cache() -> None:
    """Forget every parsed text (benchmarks measure a first parse with it)."""
    with _parsed_lock:
        _parsed.clear()


def parse_statements(sql: str, params: Parameters = None, *, bind: bool = True
                     ) -> list[Statement]:
    """Parse every statement of a string; parameters apply to the one query among them.
    Not `bind`: a SELECT comes unbound (`ast` None, its `template` and `params` set), for
    the caller to bind with `bound` only if it needs the tree (a copy, even without
    parameters: the parsed tree is shared by every execution of the text)."""
    if params is not None and (isinstance(params, str | bytes)
                               or not isinstance(params, Sequence | Mapping)):
        raise ProgrammingError(f"parameters must be a sequence or a mapping, not "
                               f"{type(params).__name__}", hint="execute(sql, [value])")
    with _parsed_lock:
        unbound = _parsed.get(sql)
        if unbound is not None:
            _parsed.move_to_end(sql)
    if unbound is None:
        unbound = _parse_unbound(sql, params)
        if _PARSE_CACHE_ON:
            with _parsed_lock:
                _parsed[sql] = unbound
                if len(_parsed) > PARSE_CACHE_SIZE:
                    _parsed.popitem(last=False)
    # checked on every call: a string parsed before without parameters comes from the
    # cache, where none of its statements would bind these
    if params and len(unbound) > 1 and not any(map(_has_placeholders, unbound)):
        raise ProgrammingError(f"the statements have no placeholders but {len(params)} "
                               "parameters were given")
    # Each statement with a query binds the parameters in turn, as they were parsed; one
    # clock for the string, as PostgreSQL's now() is one per transaction
    clocked = [s.ast is not None and s.folds and reads_clock(s.ast) for s in unbound]
    clock = now() if any(clocked) else None
    out: list[Statement] = []
    for s, reads in zip(unbound, clocked, strict=True):
        mine = _parameters_of(s, params, len(unbound))
        if s.value_template is not None:
            bound_value = bind_parameters(s.value_template, mine, copy=True)
            out.append(replace(s, value=_literal_value(bound_value), value_template=None))
            continue
        if s.ast is None:
            out.append(s)
            continue
        s = replace(s, ast=None, template=s.ast, params=mine, clock=clock if reads else None)
        out.append(s if not bind and s.kind == "select" else replace(s, ast=bind_statement(s)))
    return out


def bound(statement: Statement) -> Statement:
    """A statement from `parse_statements(..., bind=False)` with its parameters bound."""
    if statement.ast is not None or statement.template is None:
        return statement
    return replace(statement, ast=bind_statement(statement))


def bind_statement(statement: Statement) -> exp.Expression:
    """A fresh copy of the statement's tree with its parameters bound, and its clock and
    constant date arithmetic folded in (`dpproxy.clock`)."""
    assert statement.template is not None
    tree = bind_parameters(statement.template, statement.params, copy=True)
    if not statement.folds:
        return tree
    # an output keeps the name it was written with (`SELECT CURRENT_DATE` is current_date,
    # not the constant it folds to)
    items = tree.expressions if isinstance(tree, exp.Select) else []
    names = [None if isinstance(i, exp.Alias) else output_name(i) for i in items]
    tree = fold(tree, statement.clock)
    if isinstance(tree, exp.Select) and names:
        tree.set("expressions", [
            exp.alias_(item, name, quoted=True) if name is not None and name != "?column?"
            and output_name(item) != name else item
            for item, name in zip(tree.expressions, names, strict=True)])
    return tree


def placeholder_count(template: exp.Expression) -> int:
    """How many placeholder nodes a query's tree holds."""
    return sum(1 for _ in template.find_all(exp.Placeholder, exp.Parameter))


def _parse_unbound(sql: str, params: Parameters) -> tuple[Statement, ...]:
    """The statements of `sql` with their placeholders unbound. Errors are raised as they
    would be while binding `params` (after any syntax error), and are never cached."""
    pieces = split_statements(sql)
    if not pieces:
        raise SyntaxError("empty query", hint="send one SELECT statement")
    statements = []
    for text, tokens, offset in pieces:
        try:
            statements.append(_classify(text, tokens))
        except SyntaxError as exc:
            if exc.position is not None:
                exc.position += offset  # relative to the whole string, as PostgreSQL does
            raise
    holders = sum(map(_has_placeholders, statements))
    if holders > 1:
        # each would take the parameters from the first (`SET dpproxy.epsilon = %s;
        # SELECT … WHERE age > %s` with [3] set ε = 3 and filtered age > 3)
        raise NotSupportedError("parameters in more than one statement of a string are "
                                "not supported", hint="send the SET on its own, then the query")
    for statement in statements:
        for tree in (statement.ast, statement.value_template):
            if tree is not None:
                bind_parameters(tree, _parameters_of(statement, params, len(statements)),
                                copy=True)
    return tuple(statements)


def _has_placeholders(statement: Statement) -> bool:
    return any(tree is not None and placeholder_count(tree) > 0
               for tree in (statement.ast, statement.value_template))


def _parameters_of(statement: Statement, params: Parameters, statements: int) -> Parameters:
    """The parameters a statement of a string of `statements` binds: all of them for a
    statement alone or the one with placeholders (at most one has any), none for the
    others."""
    return params if statements == 1 or _has_placeholders(statement) else None


def _word(tokens: Sequence[Token], i: int) -> str:
    return keyword(tokens[i]) if i < len(tokens) else ""


def _classify(text: str, tokens: list[Token]) -> Statement:
    first = _word(tokens, 0)
    if first in _TRANSACTION_WORDS:
        return Statement("transaction", text, tag=_transaction_tag(first))
    if first in _NOOP_WORDS:
        return Statement("noop", text, tag=_noop_tag(first, _word(tokens, 1)))
    # The tokenizer hands what follows a command word over as one string token, so the
    # rest of a SHOW, RESET or EXPLAIN is read off the text after the first token.
    rest = text[tokens[0].end + 1:].strip()
    if first == "SHOW":
        if not rest:
            raise SyntaxError("SHOW needs a setting name", hint="SHOW dpproxy.epsilon")
        return Statement("show", text, name=rest.lower().replace('"', ""), tag="SHOW")
    if first == "RESET":
        return Statement("reset", text, name=rest.lower().replace('"', "") or "all",
                         tag="RESET")
    if first == "SET":
        return _set_statement(text)
    if first == "EXPLAIN":
        inner_tokens = tokenize(rest)
        skip, explain_format = _explain_options(inner_tokens)
        while _word(inner_tokens, skip) == "VERBOSE":
            skip += 1
        if _word(inner_tokens, skip) == "ANALYZE":
            raise NotSupportedError("EXPLAIN ANALYZE is not supported",
                                    hint="EXPLAIN shows the DP plan without running it")
        if skip >= len(inner_tokens):
            raise SyntaxError("EXPLAIN needs a query")
        inner = rest[inner_tokens[skip].start:]
        try:
            ast = _parse_query(inner)
        except SyntaxError as exc:
            if exc.position is not None:  # relative to the statement, not the inner query
                exc.position += len(text) - len(inner)
            raise
        return Statement("explain", text, ast=ast, tag="EXPLAIN",
                         folds=_folds(ast, inner_tokens), explain_format=explain_format)
    ast = _parse_query(text)
    if _is_advisory_unlock(ast):
        return Statement("noop", text, ast=ast, tag="SELECT 1")
    return Statement("select", text, ast=ast, tag="SELECT", folds=_folds(ast, tokens))


# EXPLAIN's options in PostgreSQL 15, each taking a boolean but FORMAT
_EXPLAIN_OPTIONS = frozenset({"ANALYZE", "VERBOSE", "COSTS", "SETTINGS", "BUFFERS", "WAL",
                              "TIMING", "SUMMARY", "FORMAT"})
_TRUE_WORDS, _FALSE_WORDS = frozenset({"TRUE", "ON", "1"}), frozenset({"FALSE", "OFF", "0"})


def _explain_options(tokens: list[Token]) -> tuple[int, str]:
    """EXPLAIN's parenthesized options, as pgAdmin and DBeaver send them (`EXPLAIN (FORMAT
    JSON, ANALYZE false) …`): where the query starts, and the format, TEXT or JSON. ANALYZE
    (which would run the query) and the XML and YAML formats are refused."""
    if not tokens or tokens[0].token_type != TokenType.L_PAREN:
        return 0, "text"
    explain_format, i = "text", 1
    while i < len(tokens) and tokens[i].token_type != TokenType.R_PAREN:
        option = tokens[i].text.upper()
        if option not in _EXPLAIN_OPTIONS:
            raise SyntaxError(f"unrecognized EXPLAIN option \"{tokens[i].text.lower()}\"")
        i += 1
        value = ""
        if i < len(tokens) and tokens[i].token_type not in (TokenType.COMMA, TokenType.R_PAREN):
            value = tokens[i].text.upper()
            i += 1
        if option == "FORMAT":
            if value not in ("TEXT", "JSON"):
                raise NotSupportedError(f"EXPLAIN FORMAT {value or '(none)'} is not supported",
                                        hint="use FORMAT TEXT or FORMAT JSON")
            explain_format = value.lower()
        elif value and value not in _TRUE_WORDS | _FALSE_WORDS:
            raise SyntaxError(f"EXPLAIN option {option} requires a Boolean value")
        elif option == "ANALYZE" and value not in _FALSE_WORDS:
            raise NotSupportedError("EXPLAIN ANALYZE is not supported",
                                    hint="EXPLAIN shows the DP plan without running it")
        if i < len(tokens) and tokens[i].token_type == TokenType.COMMA:
            i += 1
    if i >= len(tokens):
        raise SyntaxError("EXPLAIN's option list is not closed")
    return i + 1, explain_format


def _folds(ast: exp.Expression, tokens: list[Token]) -> bool:
    """`clock.folds`, once the query's INTERVAL strings are known to be read whole."""
    if not folds(ast):
        return False
    check_interval_literals(tokens)
    return True


def _noop_tag(first: str, second: str) -> str:
    """PostgreSQL's command tag for a statement answered as a no-op."""
    if first == "CLOSE":
        return "CLOSE CURSOR ALL" if second == "ALL" else "CLOSE CURSOR"
    if first in ("DISCARD", "DEALLOCATE") and second == "ALL":
        return f"{first} ALL"
    return first


def _transaction_tag(word: str) -> str:
    return {"START": "START TRANSACTION", "END": "COMMIT", "ABORT": "ROLLBACK"}.get(word, word)


def _is_advisory_unlock(ast: exp.Expression) -> bool:
    if not isinstance(ast, exp.Select) or ast.args.get("from_") is not None:
        return False
    items = ast.expressions
    return len(items) == 1 and isinstance(items[0], exp.Anonymous) \
        and items[0].name.lower() == "pg_advisory_unlock_all"


def _set_statement(text: str) -> Statement:
    try:
        ast = sqlglot.parse_one(text, read=DIALECT)
    except (ParseError, TokenError):
        return Statement("set", text, tag="SET")  # client settings we do not model: a no-op
    item = ast.expressions[0] if isinstance(ast, exp.Set) and ast.expressions else None
    eq = item.this if item is not None else None
    if not isinstance(eq, exp.EQ):
        return _list_setting(text) or Statement("set", text, tag="SET")
    target, value = eq.this, eq.expression
    name = target.sql(DIALECT).lower().replace('"', "") if isinstance(target, exp.Column | exp.Var
                                                                      | exp.Identifier) else None
    if name is not None and value.find(exp.Placeholder, exp.Parameter) is not None:
        return Statement("set", text, name=name, tag="SET", value_template=value)
    return Statement("set", text, name=name, value=_literal_value(value), tag="SET")


def _list_setting(text: str) -> Statement | None:
    """`SET dpproxy.split = 1, 3` (a list value, as PostgreSQL allows for settings), which
    sqlglot does not parse: the dpproxy setting with a tuple of its items, so it is applied
    or refused, never dropped as a client setting.

    >>> _list_setting("SET dpproxy.split TO 1, 2.5").value
    ('1', '2.5')
    """
    try:
        tokens = sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError:
        return None
    words = [t.text.lower() for t in tokens[:5]]
    if len(tokens) < 6 or words[0] != "set" or words[1:3] != ["dpproxy", "."] \
            or tokens[3].token_type != TokenType.VAR or words[4] not in ("=", "to"):
        return None
    name = f"dpproxy.{words[3]}"
    items: list[str] = []
    sign, expect_item = "", True
    for token in tokens[5:]:
        if expect_item and not sign and token.token_type == TokenType.DASH:
            sign = "-"
            continue
        if expect_item and token.token_type in (TokenType.NUMBER, TokenType.STRING):
            items.append(sign + token.text)
        elif expect_item or token.token_type != TokenType.COMMA:
            break
        sign, expect_item = "", not expect_item
    else:
        if not expect_item:
            return Statement("set", text, name=name, value=tuple(items), tag="SET")
    # a dpproxy setting is applied or refused, never mistaken for a client one
    raise InvalidParameterValue(f"invalid value for {name}",
                                hint="a number, a quoted string, or a list of them")


def _literal_value(node: exp.Expression) -> Any:
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        return float(node.this) if any(c in node.this for c in ".eE") else int(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        value = _literal_value(node.this)
        return -value if isinstance(value, int | float) else value
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Column | exp.Identifier | exp.Var):
        return node.name
    return node.sql(DIALECT)


def _parse_query(text: str) -> exp.Expression:
    """The query's tree, placeholders unbound."""
    try:
        ast = sqlglot.parse_one(text, read=DIALECT)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        near = first.get("highlight") or ""
        # sqlglot's column is the token's last character; PostgreSQL points at its first
        position = _position(text, first.get("line"), first.get("col"), len(near))
        raise SyntaxError(f"syntax error at or near {near!r}" if near else "syntax error",
                          detail=first.get("description"), position=position) from None
    except TokenError as exc:
        raise SyntaxError(f"syntax error: {exc}") from None
    if isinstance(ast, exp.Command):
        word = ast.name.upper()
        raise NotSupportedError(f"{word} is not supported", hint=_CURSOR_HINT if word in (
            "DECLARE", "FETCH", "MOVE") else "dpproxy answers SELECT queries with aggregates")
    if isinstance(ast, exp.Condition | exp.Alias | exp.Identifier):
        # a bare expression ("garbage here" parses as a column with an alias): not SQL
        first = text.split()[0] if text.split() else text
        raise SyntaxError(f"syntax error at or near {first!r}", position=1)
    if isinstance(ast, _WRITE_KINDS):
        raise PrivacyViolation(f"{ast.key.upper()} is not allowed: dpproxy is read-only",
                               hint="dpproxy answers SELECT queries with aggregates")
    if not isinstance(ast, exp.Query):
        raise NotSupportedError(f"{ast.key.upper()} statements are not supported",
                                hint="dpproxy answers SELECT queries with aggregates")
    return ast


# Cursors are connection state of the wire server (dpproxy.server.cursors); a DB-API
# cursor already reads a result in chunks
_CURSOR_HINT = "SQL cursors are served over the wire by `dpproxy serve`; here, read the " \
    "query's rows with cursor.fetchmany()"


def _position(text: str, line: int | None, col: int | None, width: int) -> int | None:
    """1-based offset of the first character of the token that ends at (line, col)."""
    if not line or not col:
        return None
    lines = text.split("\n")
    return sum(len(x) + 1 for x in lines[:line - 1]) + max(col - max(width, 1) + 1, 1)


def bind_parameters(ast: exp.Expression, params: Parameters, *, copy: bool = False
                    ) -> exp.Expression:
    """Replace each placeholder node by a literal node; the SQL text is never edited.
    With `copy`, `ast` itself is left as it was."""
    placeholders = [n for n in ast.find_all(exp.Placeholder, exp.Parameter)]
    if not placeholders:
        if params:
            raise ProgrammingError(f"the query has no placeholders but {len(params)} "
                                   "parameters were given")
        return ast.copy() if copy else ast
    if params is None:
        raise ProgrammingError("the query has placeholders but no parameters were given")
    positional = iter(params) if not isinstance(params, Mapping) else None
    used = 0

    def value_for(node: exp.Expression) -> Any:
        nonlocal used
        if isinstance(node, exp.Parameter):  # $1, $2: 1-based positions
            index = int(node.name) - 1
            if isinstance(params, Mapping) or not 0 <= index < len(params):
                raise ProgrammingError(f"there is no parameter ${index + 1}")
            used = max(used, index + 1)
            return params[index]
        name = node.args.get("this")
        if name is not None:  # %(name)s
            key = name.name if isinstance(name, exp.Expression) else str(name)
            if not isinstance(params, Mapping) or key not in params:
                raise ProgrammingError(f"no value was given for parameter {key!r}")
            return params[key]
        if positional is None:
            raise ProgrammingError("positional placeholders need a sequence of parameters")
        try:
            used += 1
            return next(positional)
        except StopIteration:
            raise ProgrammingError("fewer parameters were given than placeholders") from None

    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder | exp.Parameter):
            literal = to_literal(value_for(node))
            if not isinstance(params, Mapping):  # which parameter it came from
                negated = isinstance(literal, exp.Neg)
                number = literal.this if negated else literal
                number.meta[PARAMETER] = (used - 1 if not isinstance(node, exp.Parameter)
                                          else int(node.name) - 1, negated)
            return literal
        return node

    bound = ast.transform(swap)
    if positional is not None and not isinstance(params, Mapping) and used < len(params):
        raise ProgrammingError(f"{len(params)} parameters were given but the query uses {used}")
    return bound


def is_all_call(node: exp.Expression) -> bool:
    """ALL(…) of `x <> ALL(ARRAY[…])`, which sqlglot reads as a function call."""
    return isinstance(node, exp.Anonymous) and node.name.upper() == "ALL" \
        and len(node.expressions) == 1


def to_literal(value: Any) -> exp.Expression:
    """A literal node for a Python value."""
    if value is None:
        return exp.Null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float | decimal.Decimal):
        # an int is finite (math.isfinite would overflow on 10**400)
        if not isinstance(value, int) and not (
                value.is_finite() if isinstance(value, decimal.Decimal) else math.isfinite(value)):
            raise ProgrammingError(f"{value} is not a valid parameter: use a finite number")
        node = exp.Literal.number(abs(value))
        return exp.Neg(this=node) if value < 0 else node
    if isinstance(value, dt.datetime):
        return exp.cast(exp.Literal.string(value.isoformat(sep=" ")), "TIMESTAMP")
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(value.isoformat()), "DATE")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no backend could read it
            raise ProgrammingError("a text parameter is not valid Unicode",
                                   hint="pass text without lone surrogates") from None
        return exp.Literal.string(value)
    if isinstance(value, list | tuple) and not any(isinstance(v, list | tuple) for v in value):
        # an array, as `col = ANY(%s)` takes a list (the analyzer reads it as IN)
        return exp.Array(expressions=[to_literal(v) for v in value])
    raise ProgrammingError(f"parameters of type {type(value).__name__} are not supported",
                           hint="use numbers, strings, booleans, dates, None, or a flat list "
                                "for `= ANY(...)`")
