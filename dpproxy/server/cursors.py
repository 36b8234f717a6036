"""SQL cursors over answered queries: DECLARE, FETCH, MOVE and CLOSE.

psql with `FETCH_COUNT` set, psycopg's and psycopg2's named cursors and SQLAlchemy's
`stream_results` read a result through a cursor: `DECLARE c CURSOR FOR <query>`, then
`FETCH FORWARD n FROM c` until it runs dry, then `CLOSE c`. The query is answered, and
charged, once, at DECLARE, exactly as if it had been sent alone; the cursor then holds
the released rows, and FETCH and MOVE only walk them, so they cost nothing and never
reach the data. (A cursor is a portal, as in PostgreSQL: the connection keeps both in one
table, and the extended protocol can Describe or Execute a cursor by name.)

Positions follow PostgreSQL: 0 is before the first row, 1..n on a row, n + 1 after the
last. `fetch` gives the rows a FETCH or MOVE returns or passes over, and where it leaves
the cursor.

>>> d = parse("DECLARE _psql_cursor NO SCROLL CURSOR FOR\\nSELECT COUNT(*) FROM t")
>>> d.name, d.scroll, d.hold, d.query
('_psql_cursor', False, False, 'SELECT COUNT(*) FROM t')
>>> parse('FETCH FORWARD 100 FROM _psql_cursor')
Fetch(name='_psql_cursor', direction='forward', count=100, move=False)
>>> at = Position()
>>> fetch(parse("FETCH 4 FROM c"), at, total=5), at.row
([0, 1, 2, 3], 4)
>>> fetch(parse("FETCH BACKWARD 2 FROM c"), at, total=5), at.row
([2, 1], 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlglot.tokens import Token, TokenType

from .. import errors
from ..parse import tokenize

WORDS = frozenset({"DECLARE", "FETCH", "MOVE", "CLOSE"})
# What PostgreSQL lets a cursor run (DECLARE … FOR SELECT/VALUES/TABLE/WITH, or one in
# parentheses)
_QUERY_WORDS = frozenset({"SELECT", "VALUES", "TABLE", "WITH", "("})

Direction = Literal["forward", "backward", "absolute", "relative"]


@dataclass(frozen=True)
class Declare:
    name: str
    scroll: bool | None  # SCROLL, NO SCROLL, or neither (then backward moves are allowed)
    hold: bool  # WITH HOLD: outlives the transaction that committed it
    query: str


@dataclass(frozen=True)
class Fetch:
    """FETCH or MOVE (`move`: the rows are passed over, not returned)."""

    name: str
    direction: Direction
    count: int | None  # None: ALL
    move: bool = False


@dataclass(frozen=True)
class CloseCursor:
    name: str | None  # None: CLOSE ALL


CursorStatement = Declare | Fetch | CloseCursor


def parse(text: str) -> CursorStatement | None:
    """The cursor statement `text` is, or None when its first word is none of WORDS."""
    tokens = tokenize(text)
    first = _word(tokens, 0)
    if first not in WORDS:
        return None
    if first == "DECLARE":
        return _declare(text, tokens)
    if first == "CLOSE":
        if len(tokens) == 2 and _word(tokens, 1) == "ALL":
            return CloseCursor(None)
        if len(tokens) != 2:
            raise errors.SyntaxError("CLOSE takes one cursor name, or ALL")
        return CloseCursor(_name(tokens[1]))
    # FETCH's rest comes as one string token (whose offsets are not the rest's): read the
    # text after the first word as tokens of its own
    rest = tokenize(text[tokens[0].end + 1:]) if first == "FETCH" else tokens[1:]
    return _fetch(rest, first == "MOVE")


def deallocated(text: str) -> str | None:
    """The prepared statement `DEALLOCATE [PREPARE] name` drops, as PostgreSQL folds the
    name; None for `DEALLOCATE [PREPARE] ALL`."""
    tokens = tokenize(text)[1:]
    if tokens and _word(tokens, 0) == "PREPARE":
        tokens = tokens[1:]
    if len(tokens) == 1 and _word(tokens, 0) == "ALL":
        return None
    if len(tokens) != 1:
        raise errors.SyntaxError("DEALLOCATE takes one prepared statement name, or ALL")
    return statement_name(tokens[0])


def _word(tokens: list[Token], i: int) -> str:
    """The keyword at tokens[i], upper case; "" past the end and for a quoted name (which
    is never a keyword: CLOSE "all" closes the cursor named all)."""
    if i >= len(tokens) or tokens[i].token_type == TokenType.IDENTIFIER:
        return ""
    return tokens[i].text.upper()


def statement_name(token: Token) -> str:
    """A prepared statement's name as PostgreSQL folds it: quoted as written, else lower
    case."""
    if token.token_type == TokenType.IDENTIFIER and not token.text:
        raise errors.InvalidSqlStatementName("invalid statement name: must not be empty")
    return _name(token)


def _name(token: Token) -> str:
    """A cursor name as PostgreSQL folds it: quoted as written, else lower case."""
    if token.token_type == TokenType.IDENTIFIER:
        if not token.text:
            raise errors.InvalidCursorName("invalid cursor name: must not be empty")
        return token.text
    word = token.text[:1].isalpha() or token.text[:1] == "_"
    if token.token_type in (TokenType.STRING, TokenType.NUMBER) or not word:
        raise errors.SyntaxError(f"syntax error at or near \"{token.text}\"",
                                 hint="a cursor name is an identifier")
    return token.text.lower()


def _declare(text: str, tokens: list[Token]) -> Declare:
    # DECLARE's rest also comes as one string token
    rest = text[tokens[0].end + 1:]
    words = tokenize(rest)
    usage = "DECLARE name [NO] SCROLL CURSOR [WITH HOLD] FOR SELECT …"
    if len(words) < 3:
        raise errors.SyntaxError("DECLARE needs a cursor name, CURSOR and FOR a query",
                                 hint=usage)
    name = _name(words[0])
    scroll: bool | None = None
    hold = False
    i = 1
    while _word(words, i) in ("BINARY", "ASENSITIVE", "INSENSITIVE", "NO", "SCROLL"):
        word = _word(words, i)
        if word == "BINARY":
            raise errors.NotSupportedError(
                "binary cursors are not supported",
                hint="declare it without BINARY; a client that wants binary values asks "
                     "for them in the FETCH's result format")
        if word == "NO":
            if _word(words, i + 1) != "SCROLL":
                break
            scroll, i = False, i + 1
        elif word == "SCROLL":
            scroll = True
        i += 1
    if _word(words, i) != "CURSOR":
        near = words[i].text if i < len(words) else ""
        raise errors.SyntaxError(f"syntax error at or near \"{near}\"", hint=usage)
    i += 1
    if _word(words, i) in ("WITH", "WITHOUT") and _word(words, i + 1) == "HOLD":
        hold, i = _word(words, i) == "WITH", i + 2
    if _word(words, i) != "FOR" or i + 1 >= len(words):
        raise errors.SyntaxError("DECLARE … CURSOR needs FOR and a query", hint=usage)
    if _word(words, i + 1) not in _QUERY_WORDS:
        raise errors.SyntaxError(
            f"a cursor can only run a query: syntax error at or near \"{words[i + 1].text}\"",
            hint=usage)
    return Declare(name, scroll, hold, rest[words[i + 1].start:].strip())


def _count(tokens: list[Token], i: int) -> tuple[int | None, int]:
    """A signed integer at tokens[i] (or ALL: None), and the index after it; (1, i) when
    tokens[i] is neither, as PostgreSQL's FORWARD and BACKWARD default to one row."""
    if _word(tokens, i) == "ALL":
        return None, i + 1
    sign = 1
    j = i
    if j < len(tokens) and tokens[j].token_type in (TokenType.DASH, TokenType.PLUS):
        sign, j = (-1 if tokens[j].token_type == TokenType.DASH else 1), j + 1
    if j < len(tokens) and tokens[j].token_type == TokenType.NUMBER \
            and tokens[j].text.isdigit():
        return sign * int(tokens[j].text), j + 1
    if j != i:
        raise errors.SyntaxError(f"syntax error at or near \"{tokens[i].text}\"")
    return 1, i


def _fetch(tokens: list[Token], move: bool) -> Fetch:
    verb = "MOVE" if move else "FETCH"
    if not tokens:
        raise errors.SyntaxError(f"{verb} needs a cursor name",
                                 hint=f"{verb} FORWARD 100 FROM name")
    word = _word(tokens, 0)
    direction: Direction = "forward"
    count: int | None = 1
    i = 0
    if word in ("NEXT", "PRIOR", "FIRST", "LAST"):
        direction, count = {"NEXT": ("forward", 1), "PRIOR": ("backward", 1),
                            "FIRST": ("absolute", 1), "LAST": ("absolute", -1)}[word]
        i = 1
    elif word in ("ABSOLUTE", "RELATIVE"):
        direction = "absolute" if word == "ABSOLUTE" else "relative"
        count, i = _count(tokens, 1)
        if i == 1 or count is None:
            raise errors.SyntaxError(f"{word} needs a row count",
                                     hint=f"{verb} {word} 1 FROM name")
    elif word in ("FORWARD", "BACKWARD"):
        direction = "forward" if word == "FORWARD" else "backward"
        count, i = _count(tokens, 1)
    elif len(tokens) > 1:  # a bare count, or ALL
        count, i = _count(tokens, 0)
    if _word(tokens, i) in ("FROM", "IN"):
        i += 1
    if i != len(tokens) - 1:
        raise errors.SyntaxError(f"syntax error in {verb}",
                                 hint=f"{verb} [NEXT | PRIOR | FIRST | LAST | ABSOLUTE n | "
                                      "RELATIVE n | n | ALL | FORWARD [n | ALL] | BACKWARD "
                                      "[n | ALL]] [FROM | IN] name")
    if count is not None and count < 0 and direction in ("forward", "backward"):
        direction = "backward" if direction == "forward" else "forward"
        count = -count
    return Fetch(_name(tokens[i]), direction, count, move)


@dataclass
class Position:
    """Where a cursor stands, as PostgreSQL's portal keeps it: `row` rows fetched so far
    (the current row's number), and whether it is before the first row or past the last
    (both, once a FETCH found no rows at all)."""

    row: int = 0
    at_start: bool = True
    at_end: bool = False


def fetch(statement: Fetch, position: Position, total: int, scroll: bool | None = None
          ) -> list[int]:
    """The rows (0-based indices, in the order returned) a FETCH or MOVE reaches over a
    result of `total` rows; `position` is moved. PostgreSQL's own steps
    (DoPortalRunFetch, PortalRunSelect, DoPortalRewind in its pquery.c), so a NO SCROLL
    cursor (`scroll` False) refuses what PostgreSQL refuses: any step back."""
    walk = _Walk(position, total, scroll is False)
    count = statement.count
    if statement.direction == "absolute":
        assert count is not None
        if count > 0:
            here = position.row + (1 if position.at_end else 0)
            if count - 1 <= position.row // 2:
                walk.rewind()
                if count > 1:
                    walk.select(True, count - 1)
            elif count <= here:
                walk.select(False, here - count + 1)
            elif count > here + 1:
                walk.select(True, count - here - 1)
            return walk.select(True, 1, keep=True)
        if count < 0:
            walk.select(True, None)
            if count < -1:
                walk.select(False, -count - 1)
            return walk.select(False, 1, keep=True)
        walk.rewind()
        return []
    if statement.direction == "relative":
        assert count is not None
        if count > 0:
            if count > 1:
                walk.select(True, count - 1)
            return walk.select(True, 1, keep=True)
        if count < 0:
            if count < -1:
                walk.select(False, -count - 1)
            return walk.select(False, 1, keep=True)
        forward = True  # RELATIVE 0 is FORWARD 0
    else:
        forward = statement.direction == "forward"
    if count == 0:  # the current row again, if the cursor is on one
        on_row = not position.at_start and not position.at_end
        if statement.move:
            return [position.row - 1] if on_row else []
        if on_row:  # back up one, to read it forward (off a row, no row moves)
            walk.select(False, 1)
            count, forward = 1, True
    if not forward and count is None and statement.move:  # MOVE BACKWARD ALL: a rewind
        passed = position.row - (1 if position.row > 0 and not position.at_end else 0)
        walk.rewind()
        return list(range(passed))
    return walk.select(forward, count, keep=True)


@dataclass
class _Walk:
    position: Position
    total: int
    no_scroll: bool

    def rewind(self) -> None:
        p = self.position
        if p.at_start and not p.at_end:
            return  # never moved: nothing to undo, and no NO SCROLL error
        if self.no_scroll:
            _no_scroll()
        p.row, p.at_start, p.at_end = 0, True, False

    def select(self, forward: bool, count: int | None, keep: bool = False) -> list[int]:
        """PortalRunSelect: up to `count` rows (None: all) one way; their indices when
        `keep`, else none (the rows are skipped)."""
        p = self.position
        if forward:
            if p.at_end or count == 0:
                return []
            last = self.total if count is None else min(self.total, p.row + count)
            rows = list(range(p.row, last))
            if rows:
                p.at_start = False
            if count is None or len(rows) < count:
                p.at_end = True
            p.row += len(rows)
            return rows if keep else []
        if self.no_scroll:
            _no_scroll()
        if p.at_start or count == 0:
            return []
        first = p.row if p.at_end else p.row - 1  # the row before the cursor
        last = 1 if count is None else max(1, first - count + 1)
        rows = [r - 1 for r in range(first, last - 1, -1)]
        if rows and p.at_end:
            p.at_end = False
            p.row += 1
        if count is None or len(rows) < count:
            p.row, p.at_start = 0, True
        else:
            p.row -= len(rows)
        return rows if keep else []


def _no_scroll() -> None:
    raise errors.ObjectNotInPrerequisiteState(
        "cursor can only scan forward",
        hint="Declare it with SCROLL option to enable backward scan.")


def tag(statement: Fetch, rows: int) -> str:
    return f"{'MOVE' if statement.move else 'FETCH'} {rows}"
