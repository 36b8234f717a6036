"""Policy files: which tables an analyst may query, how each is protected, and budgets.

A policy is TOML (SPEC §3). `load_policy` validates everything up front; every
error names the file, the line and column of the key (dpproxy.policy_lines), the
dotted field (``tables.adult.columns.age.lower``) and what is allowed, so a typo
fails at load time rather than at query time. `check_policy` lists all the errors.
Relative paths in the file are relative to the file's own folder.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import hashlib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

from .clock import day_number
from .errors import InvalidAuthorization, InvalidPolicy
from .local import RandomizedResponse, UnaryEncoding
from .policy_lines import KeyPath, Position, key_positions

ColumnType = Literal["int", "float", "text", "date", "bool"]
MechanismName = Literal["laplace", "gaussian"]
COLUMN_TYPES: tuple[str, ...] = ("int", "float", "text", "date", "bool")
MECHANISMS: tuple[str, ...] = ("laplace", "gaussian")
ACCOUNTING: tuple[str, ...] = ("basic", "zcdp")
BUDGET_WINDOWS: tuple[str, ...] = ("never", "daily", "weekly", "monthly")
BACKENDS: tuple[str, ...] = ("duckdb", "postgres")
ROLES: tuple[str, ...] = ("analyst", "admin")
LDP_MECHANISMS: tuple[str, ...] = ("randomized_response", "unary")
MEMBERSHIP: tuple[str, ...] = ("private", "public")
LocalDP = RandomizedResponse | UnaryEncoding
T = TypeVar("T")


@dataclass(frozen=True)
class Budget:
    epsilon: float
    delta: float = 0.0


@dataclass(frozen=True)
class ColumnPolicy:
    name: str
    type: ColumnType
    # bounds of the values; of a date column, as day numbers (`clock.day_number`)
    lower: float | None = None
    upper: float | None = None
    public_values: tuple[Any, ...] | None = None  # keys that may be released as GROUP BY keys
    nullable: bool = True
    # Collected under local DP: the column holds randomized reports (randomized response: a
    # boolean; unary encoding: a boolean array in domain order). Never read raw.
    ldp: LocalDP | None = None
    # A public grid of values (`public_range`): GROUP BY the column, or an expression over
    # it, releases every value the grid yields, zeros included.
    public_range: PublicRange | None = None
    # Public tables only: a claim that no two rows share a value of this column, so a join on
    # it matches at most one row. The rewrite enforces it (one row per value is joined).
    unique: bool = False
    # The database's type of the column, lowercase, as the engine read it on opening its
    # backend (`with_storage`); "" where the table has no such column; None: not read.
    storage: str | None = None
    # The database holds no NULL in it (NOT NULL), as the engine read it (`with_storage`)
    database_not_null: bool = False
    # Each row's value is public knowledge, as a survey roster's columns are (`public =
    # true`): read only where membership = "public" (`analyze.ldp.rows_are_public`). Not
    # implied by public_values or public_range, which publish the values, not who has which.
    public: bool = False

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def public_domain(self) -> tuple[Any, ...] | None:
        """The column's public values: `public_values`, else the grid of `public_range`,
        else None (its values are private)."""
        if self.public_values is not None:
            return self.public_values
        if self.public_range is not None:
            return self.public_range.values()
        return None


MAX_PUBLIC_RANGE_VALUES = 100_000


@dataclass(frozen=True)
class PublicRange:
    """`public_range`: the values first, first + step, … up to last are public (numbers;
    for dates ISO text and a step in days).

    >>> PublicRange(10, 30, 10).values()
    (10, 20, 30)
    >>> PublicRange("2024-02-27", "2024-03-01", 1).values()
    ('2024-02-27', '2024-02-28', '2024-02-29', '2024-03-01')
    """

    first: float | int | str
    last: float | int | str
    step: float | int

    def count(self) -> int:
        if isinstance(self.first, str):
            days = (dt.date.fromisoformat(str(self.last))
                    - dt.date.fromisoformat(self.first)).days
            return days // int(self.step) + 1
        # Decimal: 0.1-steps must not drift (0.30000000000000004)
        span = Decimal(str(self.last)) - Decimal(str(self.first))
        return int(span // Decimal(str(self.step))) + 1

    def values(self) -> tuple[Any, ...]:
        return _grid(self)


@functools.lru_cache(maxsize=64)
def _grid(grid: PublicRange) -> tuple[Any, ...]:
    """PublicRange.values, computed once per range (GROUP BY reads it on every query)."""
    if isinstance(grid.first, str):
        start = dt.date.fromisoformat(grid.first)
        return tuple((start + dt.timedelta(days=i * int(grid.step))).isoformat()
                     for i in range(grid.count()))
    if isinstance(grid.first, int) and float(grid.step).is_integer():
        return tuple(grid.first + i * int(grid.step) for i in range(grid.count()))
    # Decimal: 0.1-steps must not drift (0.30000000000000004)
    first, step = Decimal(str(grid.first)), Decimal(str(grid.step))
    return tuple(float(first + i * step) for i in range(grid.count()))


@dataclass(frozen=True)
class TablePolicy:
    name: str
    columns: Mapping[str, ColumnPolicy]
    public: bool = False
    privacy_unit: str | None = None  # None: each row is its own unit
    max_groups_per_unit: int = 1
    max_rows_per_unit: int = 1
    total_budget: Budget | None = None
    # "public": who is in the table is public (a survey's roster), so local-DP aggregates
    # whose WHERE and GROUP BY read only public columns are released without central noise
    # or charge. "private" (the default): their row counts and report sums are noised and
    # charged.
    membership: str = "private"

    def column(self, name: str) -> ColumnPolicy | None:
        """The column of that name, matched as the analyzer matches it (exactly, else
        case-insensitively); None if there is none."""
        return self.columns.get(name) or next(
            (c for n, c in self.columns.items() if n.lower() == name.lower()), None)


@dataclass(frozen=True)
class AnalystPolicy:
    name: str
    role: Literal["analyst", "admin"] = "analyst"
    tables: tuple[str, ...] = ()
    budget: Budget | None = None
    password_scram: str | None = None


DEFAULT_WORK_MEM = "32MB"
# What PostgreSQL's work_mem accepts, written as dpproxy passes it on (no quoting needed).
_MEMORY = re.compile(r"[1-9][0-9]{0,9}(kB|MB|GB)")


@dataclass(frozen=True)
class BackendConfig:
    kind: Literal["duckdb", "postgres"]
    path: Path | None = None
    dsn: str | None = None
    demo_seed: int | None = None  # set: build the demo database at `path` when it is missing
    # PostgreSQL's password, never in the policy: the environment variable holding it, or
    # a .pgpass-style file (libpq's PGPASSWORD / ~/.pgpass also apply when neither is set)
    password_env: str | None = None
    passfile: Path | None = None
    # PostgreSQL's work_mem for dpproxy's sessions (None: the server's or role's setting).
    # Bounding aggregates per privacy unit; at the server default of 4MB a hash table of a
    # few 100k units spills to disk (bounded COUNT(*) over 333k units: 404 against 297 ms).
    work_mem: str | None = DEFAULT_WORK_MEM


@dataclass(frozen=True)
class SharedLedger:
    """`[ledger] dsn = …`: the ledger in a PostgreSQL schema that several proxies share.
    The password comes from `password_env` or `passfile`, as for the backend."""

    dsn: str
    schema: str = "dpproxy"
    password_env: str | None = None
    passfile: Path | None = None


def env_password(password_env: str | None, where: str) -> str | None:
    """The password held by the environment variable `password_env` names (None: unset
    in the policy); `where` names the policy field for the error."""
    if password_env is None:
        return None
    password = os.environ.get(password_env)
    if password is None:
        raise InvalidPolicy(f"{where} names {password_env}, which is not set in the environment")
    return password


@dataclass(frozen=True)
class PrivacyDefaults:
    default_epsilon: float = 1.0
    default_delta: float = 1e-7
    mechanism: MechanismName = "laplace"
    accounting: str = "basic"
    confidence: float = 0.95
    min_units_per_group: int = 0  # extra floor for partition selection
    budget_window: str = "never"  # budgets renew daily, weekly or monthly (UTC)
    verify_bounds: bool = True  # skip bounding where a check proves it removes nothing
    selection: str = "auto"  # partition selection by units, by released counts ("rows"), auto


@dataclass(frozen=True)
class ServerSettings:
    """The `[server]` section: how `dpproxy serve` listens and its limits (0: no limit)."""

    host: str = "127.0.0.1"
    port: int = 6432
    tls_cert: Path | None = None
    tls_key: Path | None = None
    require_tls: bool = False
    trust_loopback: bool = False  # connections from 127.0.0.1/::1 skip the password
    max_connections: int = 100
    statement_timeout_s: float = 300.0
    idle_timeout_s: float = 3600.0
    max_result_rows: int = 100_000


@dataclass(frozen=True)
class Policy:
    path: Path
    database: str
    backend: BackendConfig
    privacy: PrivacyDefaults
    tables: Mapping[str, TablePolicy]
    analysts: Mapping[str, AnalystPolicy]
    ledger_path: Path
    audit_log_path: Path
    server: ServerSettings = ServerSettings()
    version: str = ""  # digest of the policy's content: cached answers belong to one version
    shared_ledger: SharedLedger | None = None  # set: the ledger is in PostgreSQL, not ledger_path

    def analyst(self, name: str) -> AnalystPolicy:
        try:
            return self.analysts[name]
        except KeyError:
            known = ", ".join(sorted(self.analysts)) or "none"
            # who is asking is wrong, not the policy: 28000, as a server refuses a login
            raise InvalidAuthorization(
                f"analyst {name!r} is not in policy {self.path.name}", detail=f"analysts: {known}"
            ) from None


def with_storage(policy: Policy, types: Mapping[tuple[str, str], str],
                 not_null: Collection[tuple[str, str]] = frozenset()) -> Policy:
    """The policy with each column's database type (`ColumnPolicy.storage`) from `types`,
    keyed by lowercase (table, column); a column absent from it gets "" (not in the
    database); those in `not_null` are NOT NULL there (`ColumnPolicy.database_not_null`)."""
    tables = {
        name: replace(table, columns={
            c: replace(column, storage=types.get((name.lower(), c.lower()), ""),
                       database_not_null=(name.lower(), c.lower()) in not_null)
            for c, column in table.columns.items()})
        for name, table in policy.tables.items()}
    return replace(policy, tables=tables)


class _Skipped(Exception):
    """A check that depends on a part of the policy whose error is already recorded."""


@dataclass
class _Source:
    """The policy being checked: its file and text, and the errors found."""

    file: Path
    text: str | None  # None: decoded elsewhere, so errors name no line
    problems: list[InvalidPolicy] = field(default_factory=list)
    # where each error raised by _Checker.fail points, to list them in file order
    lines: dict[InvalidPolicy, Position] = field(default_factory=dict)

    @functools.cached_property
    def positions(self) -> Mapping[KeyPath, Position]:
        """Where each key is written; scanned at the first error, as valid files need none."""
        return key_positions(self.text) if self.text is not None else {}

    def part(self, check: Callable[[], T]) -> T | None:
        """check()'s result, or None when it failed: its error is recorded (or it depends on
        a part whose error is). Parts that do not depend on each other are all checked, so
        one pass over a file finds the errors of each."""
        try:
            return check()
        except InvalidPolicy as exc:
            self.problems.append(exc)
        except _Skipped:
            pass
        return None

    def each(self, names: Iterable[str], check: Callable[[str], T]) -> dict[str, T]:
        """check(name) for each name, each a part; the results of those that passed."""
        results = {}
        for name in names:
            result = self.part(functools.partial(check, name))
            if result is not None:
                results[name] = result
        return results

    def in_file_order(self) -> list[InvalidPolicy]:
        """The errors by line; those without one first (they concern the whole file)."""
        return sorted(self.problems, key=lambda exc: self.lines.get(exc, (0, 0)))


class _Checker:
    """Reads one TOML table with type checks; errors carry file, line and dotted path."""

    def __init__(self, source: _Source, path: tuple[str, ...], data: Mapping[str, Any],
                 allowed: set[str] | None) -> None:
        self.source, self.path, self.data = source, path, data
        if allowed is not None:
            self.allow(allowed)

    def allow(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.data) - allowed)
        if unknown:
            self.fail(unknown[0], f"unknown field; allowed fields: {', '.join(sorted(allowed))}")

    def child(self, key: str, data: Mapping[str, Any], allowed: set[str] | None) -> _Checker:
        return _Checker(self.source, (*self.path, key), data, allowed)

    def fail(self, key: str | None, problem: str, *, item: int | None = None) -> NoReturn:
        """Raise the error about `key` (None: this table), or about one item of its array."""
        dotted = ".".join((*self.path, key) if key else self.path) or "top level"
        position = self._position(key, item)
        line = f":{position[0]}:{position[1]}" if position else ""
        error = InvalidPolicy(f"{self.source.file}{line}: {dotted}: {problem}")
        if position:
            self.source.lines[error] = position
        raise error

    def _position(self, key: str | None, item: int | None) -> Position | None:
        """Where the item or key is written; a key that is absent belongs in this table."""
        positions = self.source.positions
        if key is None or key not in self.data:
            return positions.get(self.path)
        if item is not None and (*self.path, key, item) in positions:
            return positions[(*self.path, key, item)]
        return positions.get((*self.path, key))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None,
            required: bool = False) -> Any:
        if key not in self.data:
            if required:
                self.fail(key, "required field is missing")
            return default
        value = self.data[key]
        # bool is an int subclass in Python; TOML keeps them apart, so must we
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            self.fail(key, f"expected {_kind_name(kind)}, got a boolean")
        if not isinstance(value, kind):
            self.fail(key, f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}")
        return value

    def number(self, key: str, default: float | None = None, *, required: bool = False,
               low: float | None = None, high: float | None = None, low_open: bool = False,
               high_open: bool = False) -> float | None:
        value = self.get(key, (int, float), default, required)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value):
            self.fail(key, "must be a finite number")
        if low is not None and (value <= low if low_open else value < low):
            self.fail(key, f"must be {'>' if low_open else '>='} {low:g}, got {value:g}")
        if high is not None and (value >= high if high_open else value > high):
            self.fail(key, f"must be {'<' if high_open else '<='} {high:g}, got {value:g}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.get(key, str, default)
        if value not in options:
            self.fail(key, f"must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value

    def sub(self, key: str, allowed: set[str] | None, required: bool = False
            ) -> _Checker | None:
        value = self.get(key, dict, None, required)
        if value is None:
            return None
        return self.child(key, value, allowed)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "a table",
             list: "an array", bool: "a boolean"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if set(kinds) == {int, float}:
        return "a number"
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _budget(parent: _Checker, key: str) -> Budget | None:
    sub = parent.sub(key, {"epsilon", "delta"})
    if sub is None:
        return None
    epsilon = sub.number("epsilon", required=True, low=0.0)
    delta = sub.number("delta", 0.0, low=0.0, high=1.0, high_open=True)
    assert epsilon is not None and delta is not None
    return Budget(epsilon, delta)


_VALUE_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "text": (str,), "bool": (bool,), "date": (str,),
}


def _date_value(col: _Checker, index: int, value: Any) -> str:
    """A date public value as its ISO text (keys are matched as ISO text)."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value).isoformat()
        except ValueError:
            pass
    col.fail("public_values", f"item {index} ({value!r}) is not a date (YYYY-MM-DD)",
             item=index)
    raise AssertionError  # fail() raised


def _column(table: _Checker, name: str, public_table: bool) -> ColumnPolicy:
    spec = table.data[name]
    if not isinstance(spec, dict):
        table.fail(name, "expected a table such as { type = \"int\", lower = 0, upper = 100 }")
    col = table.child(name, spec, {"type", "lower", "upper", "public_values", "public_range",
                                   "nullable", "ldp", "unique", "public"})
    ctype = col.choice("type", COLUMN_TYPES, "")
    if ctype == "date":
        lower, upper = _date_bound(col, "lower"), _date_bound(col, "upper")
    else:
        lower, upper = col.number("lower"), col.number("upper")
    if (lower is None) != (upper is None):
        col.fail("upper" if upper is None else "lower", "give both lower and upper, or neither")
    if lower is not None and ctype not in ("int", "float", "date"):
        col.fail("lower", f"bounds apply to int, float and date columns, not {ctype}")
    if lower is not None and upper is not None and lower > upper:
        col.fail("lower", f"lower ({spec['lower']}) must not exceed upper ({spec['upper']})")
    values = col.get("public_values", list)
    public: tuple[Any, ...] | None = None
    if values is not None and ctype == "date":
        values = [_date_value(col, i, v) for i, v in enumerate(values)]
    if values is not None:
        allowed = _VALUE_TYPES[ctype]
        for i, value in enumerate(values):
            if not isinstance(value, allowed) or (isinstance(value, bool) and ctype != "bool"):
                col.fail("public_values", f"item {i} ({value!r}) is not a {ctype} value",
                         item=i)
        if len(set(values)) != len(values):
            col.fail("public_values", "values must be distinct")
        if not values:
            col.fail("public_values", "must list at least one value")
        public = tuple(values)
    public_range = _public_range(col, ctype, lower, upper) if "public_range" in spec else None
    if public_range is not None and public is not None:
        col.fail("public_range", "give public_values or public_range, not both")
    nullable = col.get("nullable", bool, True)
    ldp = _local_dp(col, ctype) if "ldp" in spec else None
    if ldp is not None and (lower is not None or public is not None
                             or public_range is not None):
        col.fail("ldp", "a local-DP column holds randomized reports: it has no bounds and no "
                 "public_values or public_range")
    unique = col.get("unique", bool, False)
    if unique and not public_table:
        col.fail("unique", "unique applies to columns of public lookup tables (join keys); a "
                 "private table's values are not claimed in the policy")
    per_row = col.get("public", bool, False)
    if per_row and ldp is not None:
        col.fail("public", "a local-DP column holds randomized reports: its values are not public")
    return ColumnPolicy(name, ctype, lower, upper, public, nullable,  # type: ignore[arg-type]
                        ldp, public_range, unique, public=per_row)


def _date_bound(col: _Checker, key: str) -> float | None:
    """A date column's `lower`/`upper` (a TOML date or ISO text) as its day number
    (`clock.day_number`), as the analyzer bounds dates; None when absent."""
    value = col.get(key, (str, dt.date), None)
    if value is None:
        return None
    try:
        day = value if isinstance(value, dt.date) else dt.date.fromisoformat(value)
    except ValueError:
        col.fail(key, f"{value!r} is not a date (YYYY-MM-DD)")
        raise AssertionError from None  # fail() raised
    return float(day_number(day))


def _public_range(col: _Checker, ctype: str, lower: float | None, upper: float | None
                  ) -> PublicRange:
    """`public_range = { step = 1 }` on a number column with lower/upper; `{ first =
    "2024-01-01", last = "2024-12-31", step = 1 }` (step in days, default 1) on a date."""
    if ctype in ("int", "float"):
        sub = col.sub("public_range", {"step"})
        assert sub is not None
        if lower is None or upper is None:
            col.fail("public_range", "a number column's public range runs from its lower to "
                     "its upper bound: declare lower and upper")
        step = sub.number("step", required=True, low=0.0, low_open=True)
        assert step is not None and lower is not None and upper is not None
        if ctype == "int" and not (step.is_integer() and lower.is_integer()):
            sub.fail("step", "an int column's range needs a whole step and a whole lower bound")
        first: float | int | str = int(lower) if ctype == "int" else lower
        grid = PublicRange(first, upper, int(step) if ctype == "int" else step)
    elif ctype == "date":
        sub = col.sub("public_range", {"first", "last", "step"})
        assert sub is not None
        ends = []
        for key in ("first", "last"):
            value = sub.get(key, (str, dt.date), required=True)
            try:
                ends.append(value.isoformat() if isinstance(value, dt.date)
                            else dt.date.fromisoformat(value).isoformat())
            except ValueError:
                sub.fail(key, f"{value!r} is not a date (YYYY-MM-DD)")
        days = sub.get("step", int, 1)
        if days < 1:
            sub.fail("step", f"must be a whole number of days >= 1, got {days}")
        if ends[1] < ends[0]:
            sub.fail("first", f"first ({ends[0]}) must not be after last ({ends[1]})")
        grid = PublicRange(ends[0], ends[1], days)
    else:
        col.fail("public_range", f"applies to int, float and date columns, not {ctype}; list "
                 "the values in public_values")
        raise AssertionError  # fail() raised
    if grid.count() > MAX_PUBLIC_RANGE_VALUES:
        col.fail("public_range", f"declares {grid.count():,} values (at most "
                 f"{MAX_PUBLIC_RANGE_VALUES:,}): use a larger step")
    return grid


def _local_dp(col: _Checker, ctype: str) -> LocalDP:
    """`ldp = {…}`: the column was randomized on each respondent's device (dpproxy.local),
    by a channel of finite ε (one that sometimes tells the truth for certain has none,
    and its reports would be released exactly under public membership)."""
    channel = _local_channel(col, ctype)
    if not math.isfinite(channel.epsilon):
        col.fail("ldp", "these probabilities let some reports tell the true answer for "
                 "certain (ε = ∞), which is no local privacy: keep every probability "
                 "strictly between 0 and 1, or give epsilon = …")
    return channel


def _local_channel(col: _Checker, ctype: str) -> LocalDP:
    sub = col.sub("ldp", {"mechanism", "epsilon", "f", "h", "s", "domain", "p", "q",
                          "variant"})
    assert sub is not None
    mechanism = sub.choice("mechanism", LDP_MECHANISMS, "")
    given = [k for k in sub.data if k != "mechanism"]
    try:
        if mechanism == "randomized_response":
            if ctype != "bool":
                col.fail("ldp", f"randomized_response answers yes/no: the column needs "
                         f"type = \"bool\", not {ctype}")
            forms = {("epsilon",), ("f",), ("h",), ("h", "s")}
            if tuple(sorted(given)) not in forms:
                sub.fail(None, "give exactly one of epsilon = …, f = … (P(yes | yes)), or "
                         "h = … with optional s = … (the two coins)")
            if "epsilon" in sub.data:
                return RandomizedResponse.from_epsilon(
                    sub.number("epsilon", low=0.0, low_open=True) or 0.0)
            if "f" in sub.data:
                return RandomizedResponse.from_f(sub.number("f") or 0.0)
            return RandomizedResponse.from_coins(sub.number("h") or 0.0,
                                                 sub.number("s", 0.5) or 0.0)
        if ctype not in ("text", "int"):
            col.fail("ldp", f"unary encoding needs a text or int column, not {ctype}")
        domain = sub.get("domain", list, required=True)
        for i, value in enumerate(domain):
            if not isinstance(value, _VALUE_TYPES[ctype]) or isinstance(value, bool):
                sub.fail("domain", f"item {i} ({value!r}) is not a {ctype} value", item=i)
        rest = sorted(set(given) - {"domain"})
        if rest == ["p", "q"]:
            return UnaryEncoding(tuple(domain), sub.number("p") or 0.0, sub.number("q") or 0.0)
        if rest in (["epsilon"], ["epsilon", "variant"]):
            variant = sub.choice("variant", ("optimized", "symmetric"), "optimized")
            epsilon = sub.number("epsilon", low=0.0, low_open=True) or 0.0
            build = UnaryEncoding.optimized if variant == "optimized" else \
                UnaryEncoding.symmetric
            return build(tuple(domain), epsilon)
        sub.fail(None, "give domain = [...] with either p = … and q = …, or epsilon = … "
                 "(variant = \"optimized\" (default) or \"symmetric\")")
    except ValueError as exc:
        sub.fail(None, str(exc))
    raise AssertionError("unreachable")


def _table(top: _Checker, name: str, spec: Any) -> TablePolicy:
    if not isinstance(spec, dict):
        top.fail(name, "expected a table")
    t = top.child(name, spec, {"public", "privacy_unit", "max_groups_per_unit",
                               "max_rows_per_unit", "total_budget", "columns", "membership"})
    public = t.get("public", bool, False)
    cols = t.sub("columns", None, required=True)
    assert cols is not None
    if not cols.data:
        t.fail("columns", "list at least one column")
    columns = t.source.each(cols.data, lambda cname: _column(cols, cname, public))
    if len(columns) < len(cols.data):
        raise _Skipped  # the checks below read the columns
    unit = t.get("privacy_unit", str)
    if unit is not None and unit not in columns:
        t.fail("privacy_unit", f"{unit!r} is not a declared column; columns: {', '.join(columns)}")
    if public and (unit is not None or "total_budget" in spec):
        t.fail("public", "a public table has no privacy_unit and no total_budget")
    groups = t.get("max_groups_per_unit", int, 1)
    rows = t.get("max_rows_per_unit", int, 1)
    for key, value in (("max_groups_per_unit", groups), ("max_rows_per_unit", rows)):
        if value < 1:
            t.fail(key, f"must be a positive integer, got {value}")
    membership = t.choice("membership", MEMBERSHIP, "private")
    if unit is not None and columns[unit].ldp is not None:
        t.fail("privacy_unit", f"{unit!r} is a local-DP column")
    if public and any(c.ldp is not None for c in columns.values()):
        t.fail("public", "a public table cannot hold local-DP columns")
    return TablePolicy(name, columns, public, unit, groups, rows, _budget(t, "total_budget"),
                       membership)


def _is_scram_verifier(text: str) -> bool:
    """PostgreSQL's verifier format, with 32-byte keys."""
    try:
        method, rest = text.split("$", 1)
        params, keys = rest.split("$", 1)
        iterations, salt = params.split(":", 1)
        stored, server = keys.split(":", 1)
        return (method == "SCRAM-SHA-256" and int(iterations) > 0
                and len(base64.b64decode(salt, validate=True)) > 0
                and len(base64.b64decode(stored, validate=True)) == 32
                and len(base64.b64decode(server, validate=True)) == 32)
    except (ValueError, binascii.Error):
        return False


def _analysts(top: _Checker, declared: Collection[str], tables: Mapping[str, TablePolicy]
              ) -> dict[str, AnalystPolicy]:
    """The `[analysts.<name>]` sections; `declared` names the tables, valid (`tables`) or not."""
    analysts_raw = top.get("analysts", dict, {})
    if not analysts_raw:
        top.fail("analysts", "declare at least one analyst")
    listed = top.child("analysts", analysts_raw, None)
    return top.source.each(analysts_raw, lambda name: _analyst(
        listed, name, analysts_raw[name], declared, tables))


def _analyst(top: _Checker, name: str, spec: Any, declared: Collection[str],
             tables: Mapping[str, TablePolicy]) -> AnalystPolicy:
    if not isinstance(spec, dict):
        top.fail(name, "expected a table")
    a = top.child(name, spec, {"role", "tables", "budget", "password_scram"})
    role = a.choice("role", ROLES, "analyst")
    granted = a.get("tables", list, [])
    for i, table in enumerate(granted):
        if not isinstance(table, str):
            a.fail("tables", f"must list table names (strings), got {table!r}", item=i)
        if table not in declared:
            a.fail("tables", f"{table!r} is not a table of this policy; tables: "
                   f"{', '.join(declared) or 'none'}", item=i)
    budget = _budget(a, "budget")
    # a granted table with errors of its own is left out: whether it is public is unknown
    if budget is None and any(t in tables and not tables[t].public for t in granted):
        a.fail("budget", "an analyst granted private tables needs a budget = { epsilon = …, "
               "delta = … }")
    scram = a.get("password_scram", str)
    if scram is not None and not _is_scram_verifier(scram):
        a.fail("password_scram", "must be a SCRAM-SHA-256 verifier "
               "(SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, base64; "
               "`dpproxy analyst passwd` makes one) — never a plain password")
    return AnalystPolicy(name, role, tuple(granted), budget, scram)  # type: ignore[arg-type]


def _server(top: _Checker, base: Path) -> ServerSettings:
    s = top.sub("server", {"host", "port", "tls_cert", "tls_key", "require_tls",
                           "trust_loopback", "max_connections", "statement_timeout_s",
                           "idle_timeout_s", "max_result_rows"})
    if s is None:
        return ServerSettings()
    port = s.get("port", int, 6432)
    if not 0 <= port <= 65535:
        s.fail("port", f"must be between 0 and 65535, got {port}")
    cert, key = s.get("tls_cert", str), s.get("tls_key", str)
    if (cert is None) != (key is None):
        s.fail("tls_key" if key is None else "tls_cert", "give both tls_cert and tls_key, "
               "or neither")
    limits = {}
    for name, default in (("max_connections", 100), ("max_result_rows", 100_000)):
        limits[name] = s.get(name, int, default)
        if limits[name] < 1:
            s.fail(name, f"must be a positive integer, got {limits[name]}")
    return ServerSettings(
        host=s.get("host", str, "127.0.0.1"), port=port,
        tls_cert=(base / cert).resolve() if cert else None,
        tls_key=(base / key).resolve() if key else None,
        require_tls=s.get("require_tls", bool, False),
        trust_loopback=s.get("trust_loopback", bool, False),
        max_connections=limits["max_connections"],
        statement_timeout_s=s.number("statement_timeout_s", 300.0, low=0.0) or 0.0,
        idle_timeout_s=s.number("idle_timeout_s", 3600.0, low=0.0) or 0.0,
        max_result_rows=limits["max_result_rows"])


TOP_LEVEL: set[str] = {"database", "backend", "privacy", "tables", "analysts", "ledger",
                       "audit", "server"}


def load_policy(path: str | Path) -> Policy:
    """Load and validate a policy file; raises the first of the errors `check_policy` lists."""
    policy, problems = check_policy(path)
    if policy is None:
        raise problems[0]
    return policy


def check_policy(path: str | Path) -> tuple[Policy | None, list[InvalidPolicy]]:
    """Validate a policy file: the policy (None if invalid) and its errors in file order.
    Each section, table, column and analyst is checked and reports its first error."""
    file = Path(path)
    try:
        text = _read(file)
        raw = tomllib.loads(text)
    except InvalidPolicy as exc:
        return None, [exc]
    except tomllib.TOMLDecodeError as exc:
        return None, [InvalidPolicy(f"{file}: not valid TOML: {exc}")]
    return _validate(raw, file, text)


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidPolicy(f"{file}: no such policy file") from None
    except UnicodeDecodeError as exc:
        raise InvalidPolicy(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                            ) from None
    except OSError as exc:
        raise InvalidPolicy(f"{file}: cannot read the policy file: {exc.strerror}") from None


def parse_policy(raw: Mapping[str, Any], file: Path, text: str | None = None) -> Policy:
    """Validate an already-decoded policy; `file` anchors relative paths and messages, and
    `text`, the TOML `raw` was read from, gives the messages their lines."""
    policy, problems = _validate(raw, file, text)
    if policy is None:
        raise problems[0]
    return policy


def _validate(raw: Mapping[str, Any], file: Path, text: str | None
              ) -> tuple[Policy | None, list[InvalidPolicy]]:
    source = _Source(file, text)
    part = source.part
    base = file.resolve().parent
    top = _Checker(source, (), raw, None)
    part(lambda: top.allow(TOP_LEVEL))
    database = part(lambda: top.get("database", str, file.stem))
    backend = part(lambda: _backend(top, base))
    privacy = part(lambda: _privacy(top))
    tables_raw = part(lambda: top.get("tables", dict, {}))
    tables: dict[str, TablePolicy] = {}
    analysts = None
    if tables_raw is not None:  # else every grant of a table would be an error too
        listed = top.child("tables", tables_raw, None)
        tables = source.each(tables_raw, lambda name: _table(listed, name, tables_raw[name]))
        analysts = part(lambda: _analysts(top, tables_raw, tables))
    ledger = part(lambda: _ledger(top, base, file.stem))
    audit = part(lambda: _audit_path(top, base, file.stem))
    server = part(lambda: _server(top, base))
    if source.problems:
        return None, source.in_file_order()
    # no problems: every part passed
    assert database is not None and backend is not None and privacy is not None
    assert analysts is not None and ledger is not None and audit is not None
    assert server is not None
    version = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode())
    return Policy(file, database, backend, privacy, tables, analysts, ledger[0], audit, server,
                  version.hexdigest()[:16], ledger[1]), []


def _backend(top: _Checker, base: Path) -> BackendConfig:
    be = top.sub("backend", {"kind", "path", "dsn", "demo_seed", "password_env", "passfile",
                             "work_mem"}, required=True)
    assert be is not None
    kind = be.choice("kind", BACKENDS, "duckdb")
    bpath = be.get("path", str)
    dsn = be.get("dsn", str)
    if kind == "duckdb" and bpath is None:
        be.fail("path", "a duckdb backend needs path = \"file.duckdb\"")
    if kind == "postgres" and dsn is None:
        be.fail("dsn", "a postgres backend needs dsn = \"postgresql://…\"")
    if dsn is not None and _dsn_has_password(dsn):
        be.fail("dsn", "must not contain a password: set password_env = \"VARIABLE\" or "
                "passfile = \"file\" (.pgpass format)")
    passfile = be.get("passfile", str)
    work_mem = be.get("work_mem", str, DEFAULT_WORK_MEM)
    if work_mem and not _MEMORY.fullmatch(work_mem):
        be.fail("work_mem", f"expected PostgreSQL memory such as \"32MB\" (kB, MB or GB), "
                f"or \"\" for the server's setting, got {work_mem!r}")
    return BackendConfig(kind, (base / bpath).resolve() if bpath else None, dsn,  # type: ignore[arg-type]
                         be.get("demo_seed", int), be.get("password_env", str),
                         (base / passfile).resolve() if passfile else None,
                         work_mem or None)


def _privacy(top: _Checker) -> PrivacyDefaults:
    pr = top.sub("privacy", {"default_epsilon", "default_delta", "mechanism", "accounting",
                             "confidence", "min_units_per_group", "budget_window",
                             "verify_bounds", "selection"})
    if pr is None:
        return PrivacyDefaults()
    privacy = PrivacyDefaults(
        default_epsilon=pr.number("default_epsilon", 1.0, low=0.0, low_open=True) or 1.0,
        default_delta=pr.number("default_delta", 1e-7, low=0.0, high=1.0,
                                high_open=True) or 0.0,
        mechanism=pr.choice("mechanism", MECHANISMS, "laplace"),  # type: ignore[arg-type]
        accounting=pr.choice("accounting", ACCOUNTING, "basic"),
        confidence=pr.number("confidence", 0.95, low=0.0, high=1.0, low_open=True,
                             high_open=True) or 0.95,
        min_units_per_group=pr.get("min_units_per_group", int, 0),
        budget_window=pr.choice("budget_window", BUDGET_WINDOWS, "never"),
        verify_bounds=pr.get("verify_bounds", bool, True),
        selection=pr.choice("selection", ("auto", "units", "rows"), "auto"),
    )
    if privacy.min_units_per_group < 0:
        pr.fail("min_units_per_group", "must be a non-negative integer")
    return privacy


def _ledger(top: _Checker, base: Path, stem: str) -> tuple[Path, SharedLedger | None]:
    """The SQLite ledger's path (beside the policy by default) and a shared ledger, if any."""
    ledger = top.sub("ledger", {"path", "dsn", "schema", "password_env", "passfile"})
    if ledger is None:
        return (base / f"{stem}.ledger.sqlite").resolve(), None
    path = (base / ledger.get("path", str, f"{stem}.ledger.sqlite")).resolve()
    return path, _shared_ledger(ledger, base)


def _audit_path(top: _Checker, base: Path, stem: str) -> Path:
    audit = top.sub("audit", {"path"})
    return (base / (audit.get("path", str, f"{stem}.audit.jsonl") if audit
                    else f"{stem}.audit.jsonl")).resolve()


def _shared_ledger(ledger: _Checker, base: Path) -> SharedLedger | None:
    """The `[ledger]` section's PostgreSQL settings; None for a SQLite ledger (`path`)."""
    dsn = ledger.get("dsn", str)
    if dsn is None:
        for key in ("schema", "password_env", "passfile"):
            if key in ledger.data:
                ledger.fail(key, "only applies to a PostgreSQL ledger (dsn = \"postgresql://…\")")
        return None
    if "path" in ledger.data:
        ledger.fail("path", "set either path (a SQLite ledger) or dsn (PostgreSQL), not both")
    if _dsn_has_password(dsn):
        ledger.fail("dsn", "must not contain a password: set password_env = \"VARIABLE\" or "
                    "passfile = \"file\" (.pgpass format)")
    schema = ledger.get("schema", str, "dpproxy")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]{0,62}", schema):
        ledger.fail("schema", f"must be a plain identifier (letters, digits, _), got {schema!r}")
    passfile = ledger.get("passfile", str)
    return SharedLedger(dsn, schema, ledger.get("password_env", str),
                        (base / passfile).resolve() if passfile else None)


def _dsn_has_password(dsn: str) -> bool:
    """Whether a libpq connection string or URI carries a password."""
    import psycopg

    try:
        return bool(psycopg.conninfo.conninfo_to_dict(dsn).get("password"))
    except psycopg.ProgrammingError:
        return False  # not a valid DSN: connecting will say so
