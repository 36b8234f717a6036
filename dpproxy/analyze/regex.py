r"""`text ~ 'pattern'` (and `~*`, `!~`, `!~*`): the regular expressions PostgreSQL and
DuckDB read alike.

PostgreSQL runs its own (ARE) engine, DuckDB RE2. They agree on literal characters, `.`,
bracket expressions with ranges, `* + ?` and `{m,n}` (also non-greedy), groups `( )` and
`(?: )`, `|`, the anchors `^ $`, and a backslash before punctuation. They differ on the
class escapes (`\d \w \s`: Unicode in PostgreSQL, ASCII in RE2), word boundaries, POSIX
classes (`[[:alpha:]]`) and back-references, which are refused with a hint. DuckDB
matches with option `s` (`.` matches a newline, as in PostgreSQL). A pattern must be a
constant, so that it is checked here, before anything runs.

>>> check_pattern("^(Sales|Tech-.+)$")
>>> try:
...     check_pattern(r"\d+")
... except NotSupportedError as refused:
...     print(refused.message)
regular expression '\\d+': \d is read differently by the two backends
"""

from __future__ import annotations

from ..errors import NotSupportedError

_ESCAPABLE = set(".[](){}*+?|^$\\-/")
MAX_REPEAT = 255  # PostgreSQL's largest {m,n} bound
HINT = ("use literal characters, . [a-z] [^…] * + ? {m,n} ( ) (?: ) | ^ $ and \\ before "
        "punctuation; for a digit write [0-9]")


def check_pattern(pattern: str) -> None:
    """NotSupportedError unless both backends read `pattern` alike."""
    i, depth = 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            following = pattern[i + 1:i + 2]
            if following not in _ESCAPABLE or not following:
                _refuse(pattern, f"\\{following} is read differently by the two backends")
            i += 2
        elif c == "[":
            i = _bracket(pattern, i)
        elif c == "(":
            depth += 1
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                _refuse(pattern, f"{pattern[i:i + 3]!r} is read differently by the two "
                                 "backends")
            i += 3 if pattern.startswith("(?:", i) else 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                _refuse(pattern, "an unmatched )")
            i += 1
        elif c == "{":
            i = _repeat(pattern, i)
        elif c in "*+?" and (i == 0 or pattern[i - 1] in "(|"):
            _refuse(pattern, f"{c} follows nothing it could repeat")
        else:
            i += 1
    if depth:
        _refuse(pattern, "an unclosed (")


def _bracket(pattern: str, start: int) -> int:
    """The index after the bracket expression that opens at `start`."""
    i = start + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        _refuse(pattern, "a ] first in brackets is read differently by the two backends")
    while i < len(pattern) and pattern[i] != "]":
        if pattern[i] == "\\" or pattern.startswith(("[:", "[.", "[="), i):
            _refuse(pattern, f"{pattern[i:i + 2]!r} in brackets is read differently by the "
                             "two backends")
        i += 1
    if i >= len(pattern):
        _refuse(pattern, "an unclosed [")
    return i + 1


def _repeat(pattern: str, start: int) -> int:
    """The index after the {m}, {m,} or {m,n} that opens at `start`."""
    end = pattern.find("}", start)
    body = pattern[start + 1:end] if end > 0 else ""
    parts = body.split(",")
    if end < 0 or len(parts) > 2 or not parts[0].isdigit() \
            or not all(p.isdigit() for p in parts[1:] if p) \
            or any(int(p) > MAX_REPEAT for p in parts if p) \
            or (len(parts) == 2 and parts[1] and int(parts[1]) < int(parts[0])):
        _refuse(pattern, f"{pattern[start:end + 1] if end > 0 else '{'!r} is not a repeat "
                         f"of 0 to {MAX_REPEAT}")
    if start == 0 or pattern[start - 1] in "(|":
        _refuse(pattern, "{ follows nothing it could repeat")
    return end + 1


def _refuse(pattern: str, why: str) -> None:
    raise NotSupportedError(f"regular expression {pattern!r}: {why}", hint=HINT)
