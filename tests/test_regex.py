"""`~`, `~*`, `!~`, `!~*` (`dpproxy.analyze.regex`): the patterns accepted are read alike
by PostgreSQL and by DuckDB's RE2, string for string; the rest is refused."""

from __future__ import annotations

import random
from collections.abc import Iterator

import duckdb
import psycopg
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
                                     "a)", "[a", "[a\\-z]", "a{3,1}",
                                     # neither engine compiles these (`[z-a]`, a quantified
                                     # quantifier, a quantified anchor or group opening), or
                                     # only one does (nested repeats of more than 1000)
                                     "[z-a]", "a**", "x{2}{3}", "a*{2}", "(ab)*+", "a?*",
                                     "a*??", "^+", "$*", "(?:+)", "(+)", "(a{255}){255}",
                                     "((a{16}){16}){16}"])
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


# pieces of patterns, valid or not, for `test_accepted_patterns_compile_on_both_engines`
_PIECES = ["a", "b", ".", "[a-c]", "[^x]", "[b-a]", "\\.", "(", ")", "(?:", "|", "*", "+",
           "?", "{2}", "{0,3}", "{1,}", "{255}", "{0}", "^", "$", "-", "{,2}"]


def test_accepted_patterns_compile_on_both_engines(connections: Connections) -> None:
    """Every pattern check_pattern accepts, of 20,000 random strings of pieces (seeded),
    compiles in RE2 (DuckDB) and in PostgreSQL's engine: a pattern one of them cannot
    compile would make a query fail only when a row reaches it (the backend check before
    the charge, `Backend.check_patterns`, stops that too). The draw holds thousands of
    accepted patterns and thousands of refused ones."""
    duck, postgres = connections
    rng = random.Random(20261125)
    accepted = refused = 0
    failures = []
    for _ in range(20_000):
        pattern = "".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 8)))
        try:
            check_pattern(pattern)
        except errors.NotSupportedError:
            refused += 1
            continue
        accepted += 1
        for engine, sql in ((duck, "SELECT regexp_matches('', $1, 's')"),
                            (postgres, "SELECT '' ~ %s")):
            try:
                engine.execute(sql, [pattern]).fetchall()
            except (duckdb.Error, psycopg.Error) as exc:
                failures.append((pattern, type(exc).__name__))
    assert accepted > 2000 and refused > 2000
    assert failures == []


@pytest.mark.parametrize("pattern", ["[z-a]", "a**", "x{2}{3}"])
def test_a_pattern_the_backend_cannot_compile_is_refused_before_the_charge(
        engine: Engine, pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the analyzer's check out of the way, the backend's compilation refuses the
    pattern (2201B) before anything is charged, whether or not a row reaches it: the
    first condition matches one person (aged 90), the second nobody."""
    monkeypatch.setattr("dpproxy.analyze.regex.check_pattern", lambda pattern: None)
    alice = engine.session("alice", epsilon=1.0)
    for condition in ("age = 90", "age = 91"):
        with pytest.raises(errors.InvalidRegularExpression):
            alice.execute(f"SELECT COUNT(*) FROM adult WHERE {condition} AND "
                          f"education ~ '{pattern}'")
    assert alice.remaining().epsilon == pytest.approx(10.0)
