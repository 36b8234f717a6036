"""`~`, `~*`, `!~`, `!~*` (`dpproxy.analyze.regex`): the patterns accepted are read alike
by PostgreSQL and by DuckDB's RE2, string for string; the rest is refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlglot

from dpproxy import errors
from dpproxy.analyze.regex import check_pattern
from dpproxy.policy import ColumnPolicy, TablePolicy
from dpproxy.session import Engine

from .rewrites import Connections, loaded, three_ways

BACKENDS = ("duckdb", "postgres")
PATTERNS = [
    "^S", "es$", "^Sales$", "a.e", "^.{5}$", "^.{2,4}$", "^.{3,}$", "[A-C]", "^[^A-M]",
    "(Sales|Tech)", "(?:ab)+", "^(a|b)*$", "x?y", "e+r", "ch.*?r", "\\.", "\\-", "[0-9]+",
    "^$", "", "a|", "(Tech-)?support", "^[a-z ]+$", "\\(x\\)", "é", "ß",
]
STRINGS = ["Sales", "Tech-support", "sales", "Exec-managerial", "", "a", "ab", "abab",
           "xy", "y", "a.e", "ace", "line\nbreak", "(x)", "1234", "Café", "straße", "STRASSE",
           "Armed-Forces", "Priv-house-serv", None]
TABLE = TablePolicy("strings", {"s": ColumnPolicy("s", "text")})


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "strings", "s", "text", STRINGS)


def _mismatches(connections: Connections) -> list[tuple[object, ...]]:
    wrong = []
    for pattern in PATTERNS:
        for operator in ("~", "~*", "!~", "!~*"):
            sql = f"s {operator} '{pattern}'"
            for text, (a, b, c) in zip(STRINGS, three_ways(*connections, TABLE, sql),
                                       strict=True):
                if not a == b == c:
                    wrong.append((sql, text, a, b, c))
    return wrong


def test_both_backends_match_alike(connections: Connections) -> None:
    """26 patterns × 4 operators × 21 strings (NULL, a newline, non-ASCII letters)."""
    for pattern in PATTERNS:
        check_pattern(pattern)
    assert _mismatches(connections) == []


def test_an_injected_difference_is_caught(connections: Connections,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: without option s, RE2's `.` does not match a newline."""
    import dpproxy.rewrite as rewrite

    real = rewrite.exp.func

    def without_s(name: str, *args: object, **kwargs: object) -> object:
        if name == "REGEXP_MATCHES":
            args = (*args[:2], sqlglot.exp.Literal.string("c"))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(rewrite.exp, "func", without_s)
    assert any(w[1] == "line\nbreak" for w in _mismatches(connections))


@pytest.mark.parametrize("pattern", ["\\d", "\\w+", "\\s", "\\y", "[[:alpha:]]", "[]a]",
                                     "(a)\\1", "(?i)a", "a{256}", "{2}", "*a", "(a",
                                     "a)", "[a", "[a\\-z]", "a{3,1}"])
def test_patterns_read_differently_are_refused(pattern: str) -> None:
    with pytest.raises(errors.NotSupportedError) as raised:
        check_pattern(pattern)
    assert "[0-9]" in (raised.value.hint or "")


def test_queries_on_both_backends(engine: Engine) -> None:
    alice = engine.session("alice", epsilon=1.0)
    rows = alice.execute("SELECT occupation ~ '^(Sales|Tech-)' AS s, COUNT(*) FROM adult "
                         "GROUP BY 1 ORDER BY 1").rows
    assert [r[0] for r in rows] == [False, True]  # a public key: both values released
    count = alice.execute("SELECT COUNT(*) FROM adult WHERE occupation ~* '^sales$'").rows
    assert 3000 < count[0][0] < 4300  # 3,650 Sales; Laplace noise of scale 1 passes 650
    # with probability e^-650
    with pytest.raises(errors.NotSupportedError):
        alice.execute("SELECT COUNT(*) FROM adult WHERE occupation ~ sex")
    with pytest.raises(errors.DatatypeMismatch):
        alice.execute("SELECT COUNT(*) FROM adult WHERE age ~ '1'")
