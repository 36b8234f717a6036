"""TO_CHAR(date, 'format') (`dpproxy.analyze.to_char`): DuckDB's rewrite writes the very
text PostgreSQL's TO_CHAR writes, date by date and pattern by pattern, so a key is one
group on either backend and in the enumeration of public keys."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlglot

from dpproxy import errors
from dpproxy.analyze.to_char import parse_format
from dpproxy.policy import ColumnPolicy, PublicRange, TablePolicy
from dpproxy.session import Engine

from .rewrites import Connections, loaded, three_ways

# the engine-backed tests run on both backends, loaded with the same demo rows
BACKENDS = ("duckdb", "postgres")


FORMATS = [
    "YYYY-MM", "YYYY-MM-DD", "Mon YYYY", "MON-YY", "mon yy", "Month YYYY", "FMMonth YYYY",
    "MONTH", "month", "FMmonth", "Day", "FMDay", "DAY", "day", "Dy", "DY", "dy",
    "IYYY-\"W\"IW", "YYYY\"Q\"Q", "DDD", "FMDDD", "D", "WW", "FMWW", "IW", "FMIW",
    "DD/MM/YYYY", "FMDD/FMMM/YY", "FMYY", "yyyy-mm-dd", "HH24:MI:SS", "HH12", "FMHH12",
    "YYYY.MM.DD \"at\" HH24", "Q", "FMMM", "Dy, DD Mon YYYY",
]
# Every date of 2023-2025 (leap day, ISO weeks across year ends), the ends of the years
# read, and the dates beyond them (NULL on both backends)
DATES = [dt.date(2023, 1, 1) + dt.timedelta(days=i) for i in range(3 * 366)] + [
    dt.date(1000, 1, 1), dt.date(1000, 12, 31), dt.date(1004, 2, 29), dt.date(9999, 12, 31),
    dt.date(9999, 1, 1), dt.date(999, 12, 31), dt.date(1, 1, 1), dt.date(1970, 1, 1)]
TABLE = TablePolicy("dates", {"d": ColumnPolicy("d", "date")})


@pytest.fixture(scope="module")
def connections(pg_dsn: str) -> Iterator[Connections]:
    yield from loaded(pg_dsn, "dates", "d", "date", DATES)


def _mismatches(connections: Connections, formats: list[str]) -> tuple[int, int]:
    """(texts compared, texts that differ): each format on each date, DuckDB running the
    rewritten TO_CHAR, PostgreSQL both its rewrite and its own TO_CHAR (NULL outside years
    1000-9999)."""
    compared = differ = 0
    for fmt in formats:
        rows = three_ways(*connections, TABLE, f"TO_CHAR(d, '{fmt}')")
        for day, (a, b, c) in zip(DATES, rows, strict=True):
            within = dt.date(1000, 1, 1) <= day <= dt.date(9999, 12, 31)
            compared += 1
            differ += not a == b == (c if within else None)
    return compared, differ


def test_duckdb_writes_what_postgresql_writes(connections: Connections) -> None:
    """37 formats on 1,106 dates: the rewritten TO_CHAR gives PostgreSQL's text on
    DuckDB, and NULL on both outside years 1000-9999."""
    assert _mismatches(connections, FORMATS) == (len(FORMATS) * len(DATES), 0)


def test_a_wrong_pattern_is_caught(connections: Connections,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: D read as ISO's day of the week (Monday = 1) instead of
    PostgreSQL's (Sunday = 1) differs on every date."""
    from dpproxy.analyze import to_char

    monkeypatch.setitem(to_char._NUMBER_PARTS, "D",
                        lambda v: (sqlglot.exp.func("ISODOW", v), 1))
    compared, differ = _mismatches(connections, ["D"])
    beyond = sum(not dt.date(1000, 1, 1) <= d <= dt.date(9999, 12, 31) for d in DATES)
    assert differ == compared - beyond > 1000  # all but the dates beyond the years read


@pytest.mark.parametrize("fmt", ["YYYY-MM-DDTHH", "TZ", "CC", "J", "YYYYth", "\"open",
                                 "RM"])
def test_formats_not_read_are_refused(fmt: str) -> None:
    with pytest.raises(errors.NotSupportedError) as raised:
        parse_format(fmt)
    assert "supported" in (raised.value.hint or "")


def test_to_char_keys_on_both_backends(engine: Engine) -> None:
    """GROUP BY TO_CHAR(day, 'YYYY-MM') (a private key: partition selection) and
    TO_CHAR(…, 'Mon YYYY') release the month labels PostgreSQL writes, on either backend."""
    alice = engine.session("alice", epsilon=1.0)
    result = alice.execute("SELECT TO_CHAR(day, 'YYYY-MM') AS m, "
                           "TO_CHAR(DATE_TRUNC('month', day), 'Mon YYYY') AS label, "
                           "COUNT(*) FROM visits GROUP BY 1, 2 ORDER BY 1")
    assert result.columns[:2] == ("m", "label")
    assert [tuple(r[:2]) for r in result.rows] == [
        (f"2024-{m:02d}", dt.date(2024, m, 1).strftime("%b 2024")) for m in range(1, 13)]


def test_to_char_of_a_public_range_is_enumerated(make_policy: Callable[..., Path]) -> None:
    """A date column with a public range: TO_CHAR's months are its public keys, every one
    released (zeros included), none through partition selection."""
    policy = make_policy({'day = { type = "date", lower = 2024-01-01, upper = 2024-12-31, '
                          'nullable = false }':
                          'day = { type = "date", nullable = false, public_range = '
                          '{ first = "2024-01-01", last = "2024-12-31" } }'})
    with Engine.from_path(policy) as engine:
        alice = engine.session("alice", epsilon=1.0)
        explain = "\n".join(r[0] for r in alice.execute(
            "EXPLAIN SELECT TO_CHAR(day, 'YYYY-MM'), COUNT(*) FROM visits GROUP BY 1").rows)
        assert "12 public values" in explain, explain
        rows = alice.execute("SELECT TO_CHAR(day, 'YYYY-MM'), COUNT(*) FROM visits "
                             "GROUP BY 1").rows
    assert [r[0] for r in rows] == [f"2024-{m:02d}" for m in range(1, 13)]


def test_public_range_key_values() -> None:
    from dpproxy.analyze.keys import key_values

    day = ColumnPolicy("day", "date", public_range=PublicRange("2024-12-30", "2025-01-02", 1))
    table = TablePolicy("t", {"day": day})
    node = sqlglot.parse_one("TO_CHAR(day, 'IYYY-\"W\"IW Dy')", read="postgres")
    assert key_values(node, day, "text", table) == (
        "2025-W01 Mon", "2025-W01 Tue", "2025-W01 Wed", "2025-W01 Thu")  # ISO: 2024-12-30 on
