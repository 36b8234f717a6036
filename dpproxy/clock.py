"""The statement's clock and constant date arithmetic, bound into the query like parameters.

Dashboards filter on time relative to now: Metabase's "previous 30 days" sends
`day >= CAST((NOW() + INTERVAL '-30 day') AS date)`, hand-written SQL
`day >= CURRENT_DATE - 30` or `date_trunc('month', CURRENT_DATE)`. The time functions
(NOW(), CURRENT_TIMESTAMP, LOCALTIMESTAMP, TRANSACTION_TIMESTAMP(), STATEMENT_TIMESTAMP(),
CURRENT_DATE) read nothing private: each is bound as a literal of the
statement's clock, in UTC (the only TimeZone dpproxy reports), when the statement is bound.
Then expressions over constants only are evaluated as PostgreSQL evaluates them
(`fold`): a date or timestamp plus or minus an INTERVAL, a date plus or minus days,
CAST of a constant to DATE or TIMESTAMP, DATE_TRUNC of a constant. What reaches the
analyzer is a query over literals, checked as any other.

Binding the clock, rather than passing the functions to the backend, keeps a query one
query: the answer cache keys on the bound text, so `CURRENT_DATE - 30` is the same
query all day (a repeat is free) and a new one the next day; and the backend's own
clock, time zone or transaction can change nothing.

>>> import datetime as dt
>>> from sqlglot import parse_one
>>> clock = dt.datetime(2026, 3, 31, 18, 5, 1)
>>> fold(parse_one("SELECT 1 WHERE d >= CAST((NOW() + INTERVAL '-1 month') AS date)",
...                read="postgres"), clock).sql("postgres")
"SELECT 1 WHERE d >= CAST('2026-02-28' AS DATE)"
"""

from __future__ import annotations

import calendar
import datetime as dt
import itertools
import re
from collections.abc import Sequence

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from .errors import NotSupportedError

# Nodes sqlglot parses time functions into, and PostgreSQL's other names for NOW()
_NOW_NODES = (exp.CurrentTimestamp, exp.Localtimestamp)
# (CLOCK_TIMESTAMP() moves while a statement runs, row by row: it stays refused)
_NOW_FUNCTIONS = {"transaction_timestamp", "statement_timestamp"}
_DATE_TYPES = {exp.DataType.Type.DATE}
_TIMESTAMP_TYPES = {exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ}
# PostgreSQL's interval units (singular, plural and abbreviations): (months, days, µs)
_UNITS: dict[str, tuple[int, int, int]] = {}
for _names, _value in (
        (("year", "years", "yr", "yrs", "y"), (12, 0, 0)),
        (("month", "months", "mon", "mons"), (1, 0, 0)),
        (("week", "weeks", "w"), (0, 7, 0)),
        (("day", "days", "d"), (0, 1, 0)),
        (("hour", "hours", "hr", "hrs", "h"), (0, 0, 3_600_000_000)),
        (("minute", "minutes", "min", "mins", "m"), (0, 0, 60_000_000)),
        (("second", "seconds", "sec", "secs", "s"), (0, 0, 1_000_000))):
    for _name in _names:
        _UNITS[_name] = _value
_NUMBER_UNIT = re.compile(r"\s*([+-]?\d+)\s*([a-z]+)\s*")  # one "30 days" of an interval text
_TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour", "minute", "second")


# What an INTERVAL's string may hold: number-unit pairs, or a number with the unit after it
_PLAIN_INTERVAL = re.compile(r"(?:\s*[+-]?\d+\s*[a-zA-Z]*)+\s*")


def parse_date(text: str) -> dt.date:
    """A date as PostgreSQL reads an ISO one: YYYY-MM-DD (or YYYYMMDD), optionally followed
    by a time and a zone, or by a zone alone (pgjdbc's setDate sends '2024-03-01 +00'),
    both of which a date ignores. ValueError for any other text.

    >>> [parse_date(t).isoformat() for t in ("2024-03-01", " 2024-03-01 +00",
    ...                                      "2024-03-01 23:30:00-08", "2024-03-01T10:00")]
    ['2024-03-01', '2024-03-01', '2024-03-01', '2024-03-01']
    """
    text = text.strip()
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        pass
    day, space, zone = text.partition(" ")
    zone = zone.strip()
    if space and zone.startswith(("+", "-")):
        dt.datetime.fromisoformat(f"{day}T00:00{zone}")  # (a ValueError if not a zone)
        return dt.date.fromisoformat(day)
    return dt.datetime.fromisoformat(text).date()


EPOCH = dt.date(1970, 1, 1)


def constant_date(node: exp.Expression) -> dt.date | None:
    """The date a constant expression stands for (DATE '…', CAST('…' AS DATE)), or None."""
    value = _constant(node)
    return value if isinstance(value, dt.date) and not isinstance(value, dt.datetime) \
        else None


def day_number(day: dt.date) -> int:
    """Days since 1970-01-01, as `date - DATE '1970-01-01'` reads in both backends."""
    return (day - EPOCH).days


def date_of_day(number: float) -> str:
    """The ISO date of a day number (rounded to a whole day), as date keys are released;
    outside Python's years 1–9999 as PostgreSQL writes it (`10000-01-01`, `0044-03-15 BC`).

    >>> date_of_day(0), date_of_day(2932897), date_of_day(-721000)
    ('1970-01-01', '10000-01-01', '0006-12-21 BC')
    """
    days = round(number)
    if _FIRST_DAY <= days <= _LAST_DAY:
        return (EPOCH + dt.timedelta(days=days)).isoformat()
    # the proleptic Gregorian calendar for any day (H. Hinnant's civil_from_days)
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    if year <= 0:  # 1 BC is year 0
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


_FIRST_DAY = (dt.date.min - EPOCH).days
_LAST_DAY = (dt.date.max - EPOCH).days


def check_interval_literals(tokens: Sequence[Token]) -> None:
    """Refuse an `INTERVAL '…'` whose string holds more than number-unit pairs ('1 day
    02:00:00', '1 day ago'): sqlglot's parser keeps only its first pair, which would
    change its value, so the statement is refused before it is read."""
    for token, following in itertools.pairwise(tokens):
        if token.token_type == TokenType.INTERVAL and following.token_type == TokenType.STRING \
                and _PLAIN_INTERVAL.fullmatch(following.text) is None:
            raise NotSupportedError(f"INTERVAL '{following.text}' is not supported",
                                    hint="write it as number-unit pairs: INTERVAL '1 day 2 "
                                         "hours', INTERVAL '-30 days'")


def reads_clock(tree: exp.Expression) -> bool:
    """Whether a query calls a time function (its answer depends on when it runs)."""
    return any(_is_now(node) or isinstance(node, exp.CurrentDate)
               for node in tree.find_all(*_NOW_NODES, exp.CurrentDate, exp.Anonymous))


def folds(tree: exp.Expression) -> bool:
    """Whether `fold` may change a query: it calls a time function or holds an interval."""
    return reads_clock(tree) or tree.find(exp.Interval) is not None or any(
        n.to.is_type(exp.DataType.Type.INTERVAL) for n in tree.find_all(exp.Cast))


def now() -> dt.datetime:
    """The clock a statement binds: UTC, to the microsecond, without a zone."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def fold(tree: exp.Expression, clock: dt.datetime | None) -> exp.Expression:
    """`tree` (modified in place: a bound copy) with the time functions read off `clock`
    and every expression over constant dates, timestamps and intervals evaluated; what
    cannot be evaluated exactly is left as written, for the analyzer to judge."""
    def visit(node: exp.Expression) -> exp.Expression:
        for key, value in list(node.args.items()):
            if isinstance(value, exp.Expression):
                node.set(key, visit(value))
            elif isinstance(value, list):
                node.set(key, [visit(v) if isinstance(v, exp.Expression) else v for v in value])
        return _fold_node(node, clock)
    return visit(tree)


def _is_now(node: exp.Expression) -> bool:
    return isinstance(node, _NOW_NODES) or (
        isinstance(node, exp.Anonymous) and node.name.lower() in _NOW_FUNCTIONS
        and not node.expressions)


def _fold_node(node: exp.Expression, clock: dt.datetime | None) -> exp.Expression:
    if clock is not None and _is_now(node):
        return _timestamp(clock)
    if clock is not None and isinstance(node, exp.CurrentDate):
        return date_literal(clock.date())
    if isinstance(node, exp.Paren) and _constant(node.this) is not None:
        return node.this
    if isinstance(node, exp.Cast):
        value = _constant(node.this)
        if isinstance(value, dt.datetime | dt.date):
            if node.to.this in _DATE_TYPES:
                return date_literal(value.date() if isinstance(value, dt.datetime) else value)
            if node.to.this in _TIMESTAMP_TYPES:
                return _timestamp(value if isinstance(value, dt.datetime)
                                  else dt.datetime.combine(value, dt.time()))
        return node
    if isinstance(node, exp.Add | exp.Sub):
        return _arithmetic(node)
    if isinstance(node, exp.TimestampTrunc | exp.DateTrunc):
        value = _constant(node.this)
        unit = node.text("unit").lower()
        if isinstance(value, dt.date) and unit in _TRUNC_UNITS:
            return _timestamp(_truncate(value, unit))
    return node


def _arithmetic(node: exp.Add | exp.Sub) -> exp.Expression:
    """date/timestamp ± interval (a timestamp), interval + date/timestamp, date ± days."""
    left, right = _constant(node.this), _constant(node.expression)
    if isinstance(node, exp.Add) and isinstance(left, tuple) \
            and not isinstance(right, tuple):
        left, right = right, left
        node = exp.Add(this=node.expression, expression=node.this)
    if not isinstance(left, dt.date):
        if isinstance(right, tuple) and right[0] == right[2] == 0 and left is None:
            # a row expression ± whole days: the analyzer reads it as date ± n (the same
            # day as PostgreSQL's date + interval, a midnight timestamp), and refuses it
            # on anything but a date
            node.set("expression", whole_days(right[1]))
        return node
    sign = -1 if isinstance(node, exp.Sub) else 1
    try:
        if isinstance(right, tuple):
            months, days, micros = right
            start = left if isinstance(left, dt.datetime) \
                else dt.datetime.combine(left, dt.time())
            return _timestamp(_plus(start, sign * months, sign * days, sign * micros))
        if isinstance(right, int) and not isinstance(left, dt.datetime):
            return date_literal(left + dt.timedelta(days=sign * right))
    except (OverflowError, ValueError):  # beyond the years Python holds: left as written
        return node
    return node


DAYS = "dpproxy_interval_days"  # meta of a literal that was an INTERVAL of whole days


def whole_days(n: int) -> exp.Expression:
    """n days as the literal date ± n takes (negated where negative), marked as an
    interval's."""
    literal = exp.Literal.number(abs(n))
    literal.meta[DAYS] = True
    return exp.Neg(this=literal) if n < 0 else literal


def _constant(node: exp.Expression) -> dt.datetime | dt.date | tuple[int, int, int] | int | None:
    """The value of a constant the folding reads: a DATE or TIMESTAMP literal, an interval
    (months, days, microseconds), a whole number; else None."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) \
            and not node.this.is_string and node.this.this.isdigit():
        return -int(node.this.this)
    if isinstance(node, exp.Interval):
        text = node.this.name if isinstance(node.this, exp.Literal) else None
        unit = node.text("unit")
        return _interval(f"{text} {unit}" if text is not None and unit else text)
    if not isinstance(node, exp.Cast) or not isinstance(node.this, exp.Literal) \
            or not node.this.is_string:
        return None
    text = node.this.this.strip()
    try:
        if node.to.this in _DATE_TYPES:
            return parse_date(text)
        if node.to.this == exp.DataType.Type.TIMESTAMP:
            value = dt.datetime.fromisoformat(text)
            return value if value.tzinfo is None else None
    except ValueError:
        return None
    if node.to.is_type(exp.DataType.Type.INTERVAL):
        return _interval(text)
    return None


def _interval(text: str | None) -> tuple[int, int, int] | None:
    """An interval text of number-unit pairs ('30 days', '-1 month 2 days', '2 weeks') as
    (months, days, microseconds); None for any other form."""
    if not text:
        return None
    months = days = micros = 0
    position = 0
    lowered = text.lower()
    while position < len(lowered):
        match = _NUMBER_UNIT.match(lowered, position)
        if match is None or match.group(2) not in _UNITS:
            return None
        n = int(match.group(1))
        m, d, u = _UNITS[match.group(2)]
        months, days, micros = months + n * m, days + n * d, micros + n * u
        position = match.end()
    return months, days, micros


def _plus(start: dt.datetime, months: int, days: int, micros: int) -> dt.datetime:
    """PostgreSQL's timestamp + interval: months first (the day clamped to the month's
    last), then days, then the time."""
    total = start.year * 12 + start.month - 1 + months
    year, month = divmod(total, 12)
    day = min(start.day, calendar.monthrange(year, month + 1)[1])
    moved = start.replace(year=year, month=month + 1, day=day)
    return moved + dt.timedelta(days=days, microseconds=micros)


def _truncate(value: dt.date, unit: str) -> dt.datetime:
    """PostgreSQL's date_trunc of a date or timestamp (weeks start on Monday)."""
    moment = value if isinstance(value, dt.datetime) else dt.datetime.combine(value, dt.time())
    if unit == "year":
        return moment.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    if unit == "quarter":
        return moment.replace(month=(moment.month - 1) // 3 * 3 + 1, day=1, hour=0, minute=0,
                              second=0, microsecond=0)
    if unit == "month":
        return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if unit == "week":
        monday = moment - dt.timedelta(days=moment.weekday())
        return monday.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    if unit == "minute":
        return moment.replace(second=0, microsecond=0)
    return moment.replace(microsecond=0)


def date_literal(value: dt.date | str) -> exp.Expression:
    """CAST('<ISO date>' AS DATE): a constant date, in the form both backends read alike."""
    text = value if isinstance(value, str) else value.isoformat()
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build("DATE"))


def _timestamp(value: dt.datetime) -> exp.Expression:
    return exp.Cast(this=exp.Literal.string(value.isoformat(sep=" ")),
                    to=exp.DataType.build("TIMESTAMP"))
