"""TO_CHAR(date, 'format'): PostgreSQL's date formatting, the same text on both backends.

Looker labels months `TO_CHAR(DATE_TRUNC('month', d), 'YYYY-MM')`, and analysts group by
`TO_CHAR(d, 'Mon YYYY')` or `TO_CHAR(d, 'IYYY-"W"IW')`. PostgreSQL runs its own TO_CHAR;
DuckDB (the backend, and the in-memory enumeration of public key sets) gets the same
text built from date parts (`duckdb_expression`), so a key is one group whichever engine
computed it. The formats read are PostgreSQL's template patterns below, each with the FM
prefix (no padding), text in double quotes and any other non-letter as itself; anything
else is refused with the list. Dates outside years 1000–9999 format as NULL on both
backends (PostgreSQL writes BC years and the ISO fields there in ways DuckDB does not).

>>> [p.field for p in parse_format("Mon YYYY")]
['Mon', None, 'YYYY']
>>> from sqlglot import parse_one
>>> duckdb_expression(parse_one("d"), parse_format("FMMM/YY")).sql("duckdb")
"CASE WHEN d BETWEEN CAST('1000-01-01' AS DATE) AND CAST('9999-12-31' AS DATE) THEN \
CAST(MONTH(d) AS TEXT) || '/' || LPAD(CAST(YEAR(d) % 100 AS TEXT), 2, '0') END"
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres

from ..clock import date_literal
from ..errors import NotSupportedError

FIRST_DATE = "1000-01-01"
LAST_DATE = "9999-12-31"
# Template patterns, longest first (PostgreSQL matches the longest at each position).
# Numbers are case-insensitive in PostgreSQL; names take their case from the pattern.
_NUMBERS = ["YYYY", "IYYY", "HH24", "HH12", "DDD", "YY", "MM", "DD", "HH", "MI", "SS", "IW",
            "WW", "Q", "D"]
_NAMES = ["MONTH", "Month", "month", "DAY", "Day", "day", "MON", "Mon", "mon", "DY", "Dy",
          "dy"]
HELP = ("YYYY, YY, IYYY, MM, DD, DDD, D, Q, IW, WW, HH24, HH12, MI, SS, Month, Mon, Day, Dy "
        "(and MONTH, month…), the FM prefix, \"quoted text\" and punctuation")


@dataclass(frozen=True)
class Piece:
    """A template pattern (`field`, with `fill_mode` for FM) or literal `text`."""

    field: str | None
    text: str = ""
    fill_mode: bool = False


def format_of(node: exp.TimeToStr) -> str:
    """The format as the query wrote it (sqlglot holds it translated to strftime codes,
    and PostgreSQL's generator translates it back)."""
    printed = Postgres().generator().format_time(node)
    assert printed is not None and printed.startswith("'") and printed.endswith("'")
    return printed[1:-1].replace("''", "'")


def parse_format(text: str) -> list[Piece]:
    """The pieces of a TO_CHAR format, or NotSupportedError naming what is not read."""
    pieces: list[Piece] = []
    i = 0
    fill_mode = False
    while i < len(text):
        if text.startswith(("FM", "fm"), i):
            fill_mode, i = True, i + 2
            continue
        if text[i] == '"':
            end = text.find('"', i + 1)
            if end < 0 or "\\" in text[i:end]:
                raise NotSupportedError(f"TO_CHAR format {text!r}: an unclosed quote or a "
                                        "backslash", hint=f"supported: {HELP}")
            pieces.append(Piece(None, text[i + 1:end]))
            i = end + 1
            continue
        field = next((f for f in _NAMES if text.startswith(f, i)), None) or next(
            (f for f in _NUMBERS if text[i:i + len(f)].upper() == f), None)
        if field is not None:
            pieces.append(Piece(field, fill_mode=fill_mode))
            fill_mode = False
            i += len(field)
            continue
        if text[i].isalpha():
            raise NotSupportedError(f"TO_CHAR format {text!r}: {text[i:]!r} is not read",
                                    hint=f"supported: {HELP}; put other text in double "
                                         "quotes")
        pieces.append(Piece(None, text[i]))
        i += 1
    return pieces


def duckdb_expression(value: exp.Expression, pieces: list[Piece]) -> exp.Expression:
    """The formatted text of `value` (a DATE or TIMESTAMP) in DuckDB, NULL outside the
    years read."""
    parts = [_piece(value, p) for p in pieces] or [exp.Literal.string("")]
    text = parts[0]
    for part in parts[1:]:
        text = exp.DPipe(this=text, expression=part, safe=True)
    return in_range(value, text)


def in_range(value: exp.Expression, then: exp.Expression) -> exp.Expression:
    """CASE WHEN value is within the years read THEN `then` END."""
    within = exp.Between(this=value.copy(), low=date_literal(FIRST_DATE),
                         high=date_literal(LAST_DATE))
    return exp.Case(ifs=[exp.If(this=within, true=then)])


def _piece(value: exp.Expression, piece: Piece) -> exp.Expression:
    if piece.field is None:
        return exp.Literal.string(piece.text)
    field = piece.field
    upper = field.upper()
    if upper in ("MONTH", "DAY", "MON", "DY"):
        name = exp.func("MONTHNAME" if upper.startswith("MON") else "DAYNAME", value.copy())
        if upper in ("MON", "DY"):
            name = exp.func("LEFT", name, exp.Literal.number(3))
        elif not piece.fill_mode:  # PostgreSQL pads full names to the longest, 9
            name = exp.func("RPAD", name, exp.Literal.number(9), exp.Literal.string(" "))
        if field.isupper():
            return exp.Upper(this=name)
        return exp.Lower(this=name) if field.islower() else name
    number, width = _NUMBER_PARTS[upper](value.copy())
    text = exp.cast(number, exp.DataType.build("TEXT"))
    if piece.fill_mode or width == 1:
        return text
    return exp.func("LPAD", text, exp.Literal.number(width), exp.Literal.string("0"))


_NUMBER_PARTS = {
    "YYYY": lambda v: (exp.func("YEAR", v), 4),
    "IYYY": lambda v: (exp.func("ISOYEAR", v), 4),
    "YY": lambda v: (exp.Mod(this=exp.func("YEAR", v), expression=exp.Literal.number(100)), 2),
    "MM": lambda v: (exp.func("MONTH", v), 2),
    "DD": lambda v: (exp.func("DAY", v), 2),
    "DDD": lambda v: (exp.func("DAYOFYEAR", v), 3),
    # PostgreSQL's D counts from Sunday = 1; DuckDB's DAYOFWEEK from Sunday = 0
    "D": lambda v: (exp.Add(this=exp.func("DAYOFWEEK", v), expression=exp.Literal.number(1)),
                    1),
    "Q": lambda v: (exp.func("QUARTER", v), 1),
    "IW": lambda v: (exp.func("WEEK", v), 2),
    "WW": lambda v: (exp.Add(this=exp.IntDiv(this=exp.Paren(this=exp.Sub(
        this=exp.func("DAYOFYEAR", v), expression=exp.Literal.number(1))),
        expression=exp.Literal.number(7)), expression=exp.Literal.number(1)), 2),
    "HH24": lambda v: (exp.func("HOUR", v), 2),
    "HH12": lambda v: (exp.Add(this=exp.Mod(this=exp.Paren(this=exp.Add(
        this=exp.func("HOUR", v), expression=exp.Literal.number(11))),
        expression=exp.Literal.number(12)), expression=exp.Literal.number(1)), 2),
    "HH": lambda v: _NUMBER_PARTS["HH12"](v),
    "MI": lambda v: (exp.func("MINUTE", v), 2),
    "SS": lambda v: (exp.func("SECOND", v), 2),
}
