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
MAX_NESTED_REPEAT = 1000  # RE2's largest product of nested counted repeats
HINT = ("use literal characters, . [a-z] [^…] * + ? {m,n} ( ) (?: ) | ^ $ and \\ before "
        "punctuation; for a digit write [0-9]")


def check_pattern(pattern: str) -> None:
    """NotSupportedError unless both backends read `pattern` alike. (The backend also
    compiles every pattern before a query is charged: `Backend.check_patterns`.)"""
    i = 0
    # per open group, the largest product of nested counted repeats inside it (RE2 refuses
    # one above MAX_NESTED_REPEAT, PostgreSQL a "too complex" one)
    groups = [1]
    atom = 1  # the product inside the last item (a group's, else 1)
    repeatable = False  # the last token is an item a quantifier may follow
    quantified = 0  # 0: the last token is no quantifier; 1: it is; 2: a lazy one (`*?`)
    while i < len(pattern):
        c = pattern[i]
        if c in "*+?{":
            if c == "?" and quantified == 1:  # `*?`, `{m,n}?`: non-greedy
                quantified, i = 2, i + 1
                continue
            if quantified:
                _refuse(pattern, f"{c} follows a quantifier: write one quantifier per item")
            if not repeatable:  # PostgreSQL refuses `^*` or `(?:+)`, RE2 `(+)`
                _refuse(pattern, f"{c} follows nothing it could repeat")
            if c == "{":
                i, times = _repeat(pattern, i)
                atom *= times
                if atom > MAX_NESTED_REPEAT:
                    _refuse(pattern, f"nested repeats of more than {MAX_NESTED_REPEAT} in all")
                groups[-1] = max(groups[-1], atom)
            else:
                i += 1
            quantified, repeatable = 1, False
            continue
        quantified, repeatable, atom = 0, True, 1
        if c == "\\":
            following = pattern[i + 1:i + 2]
            if following not in _ESCAPABLE or not following:
                _refuse(pattern, f"\\{following} is read differently by the two backends")
            i += 2
        elif c == "[":
            i = _bracket(pattern, i)
        elif c == "(":
            groups.append(1)
            if pattern.startswith("(?", i) and not pattern.startswith("(?:", i):
                _refuse(pattern, f"{pattern[i:i + 3]!r} is read differently by the two "
                                 "backends")
            i += 3 if pattern.startswith("(?:", i) else 1
            repeatable = False
        elif c == ")":
            if len(groups) == 1:
                _refuse(pattern, "an unmatched )")
            atom = groups.pop()
            groups[-1] = max(groups[-1], atom)
            i += 1
        else:
            repeatable = c not in "|^$"
            i += 1
    if len(groups) > 1:
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
        if pattern[i] == "-" and i > start + 1 and pattern[i - 1] not in "[^" \
                and i + 1 < len(pattern) and pattern[i + 1] != "]" \
                and pattern[i - 1] > pattern[i + 1]:
            _refuse(pattern, f"the range {pattern[i - 1:i + 2]!r} runs backwards")
        i += 1
    if i >= len(pattern):
        _refuse(pattern, "an unclosed [")
    return i + 1


def _repeat(pattern: str, start: int) -> tuple[int, int]:
    """The index after the {m}, {m,} or {m,n} that opens at `start`, and its count (n, or
    m for {m,})."""
    end = pattern.find("}", start)
    body = pattern[start + 1:end] if end > 0 else ""
    parts = body.split(",")
    if end < 0 or len(parts) > 2 or not parts[0].isdigit() \
            or not all(p.isdigit() for p in parts[1:] if p) \
            or any(int(p) > MAX_REPEAT for p in parts if p) \
            or (len(parts) == 2 and parts[1] and int(parts[1]) < int(parts[0])):
        _refuse(pattern, f"{pattern[start:end + 1] if end > 0 else '{'!r} is not a repeat "
                         f"of 0 to {MAX_REPEAT}")
    return end + 1, max(int(p) for p in parts if p)


def _refuse(pattern: str, why: str) -> None:
    raise NotSupportedError(f"regular expression {pattern!r}: {why}", hint=HINT)
