"""Verified contribution bounds: skip truncation where the data provably needs none.

Contribution bounding keeps at most `max_rows` rows of a privacy unit per group and at
most `max_groups` groups per unit. On data where no unit exceeds either bound, it removes
nothing: LEAST(n, max_rows) = n, a random sample of max_rows out of ≤ max_rows rows is all
of them, and every group of a unit ranks ≤ max_groups. The plain clamped aggregate then
computes the same statistics as the bounded one, so running it instead changes no output
distribution, hence no privacy guarantee; it only saves the per-unit work, which is most
of a user-level query's time.

Whether the bounds hold is read by one `BoundCheck` query over the whole table (a WHERE
only removes rows, so the whole table is the worst case), and the answer is used only for
the very data it was read from:

* DuckDB: the backend holds the file open read-only, and DuckDB's file lock stops every
  other process from opening it for writing meanwhile (and this process opens it with
  one configuration only), so one check holds for the life of the backend;
* PostgreSQL: check and query run in one REPEATABLE READ transaction, and a check is
  reused by a transaction whose snapshot (xmin, xmax, in-progress transactions, and
  the server's start time) equals the one it was read in: equal snapshots see the same
  committed rows. Any commit on the server moves the snapshot, so a check that held is
  also carried to a later snapshot: every row the new snapshot sees whose inserting
  transaction ended before the old snapshot's xmin was seen by the old one, so a unit
  with no younger row version has some of the rows checked, and no more rows or groups;
  the units with a younger version (inserts, updates) are checked again
  (`BoundCheck.young_sql`), and the maxima are the larger of theirs and the old ones
  (`PostgresBackend._carried` has the details). What the rows read as must be
  unchanged too (ALTER TABLE, a rename, an enum label: changes that make no row
  version), so the table's catalog rows are compared as well, and only plain tables
  without children or row security are carried. Only a check that held is carried: a
  count's excess rows would change with a deletion. PostgreSQL reads a statement's
  table names and columns from the latest catalog once it holds the table's lock, not
  from the snapshot, so each such transaction locks the table (ACCESS SHARE) before its
  snapshot is taken: a rename or a column's new type either committed before the
  snapshot, which shows it, or waits until the query is done. A child attached meanwhile
  (ATTACH PARTITION, INHERIT: locks that do not wait for readers) is read by neither the
  check nor the unbounded statement: both read `ONLY` the table, and bounds are verified
  only on a plain table without children. Some changes take no lock on the table at all
  (an enum label renamed, a relation of the same name created earlier on the search
  path), so after an unbounded statement the backend reads the table's catalog text
  again, from the latest catalog, and answers with the bounded statement where it
  changed.

A statement grouping by public keys filters its rows by the public lists before it
aggregates. Where the bounds hold and the check also saw few distinct groups in the whole
table (at most `LATE_FILTER_GROUPS`), the backend runs `Unbounded.late_sql` instead: the
same aggregate over every row, its groups filtered by the lists afterwards. The groups it
returns are the very same (a group's rows are those with its key), and testing a key once
per group is cheaper than testing it once per row (PostgreSQL: 99 against 125 ms on 1M
rows; DuckDB: 8.8 against 13 ms). On a table with many keys outside the lists, the row
filter is far cheaper than aggregating them all, hence the check.

Where the bounds do not hold, most units may still be within them: a few heavy users are
what `max_rows_per_unit` is usually set against. On DuckDB the backend then reads, once,
the units that exceed the bounds (`BoundCheck.heavy_sql`), keeps them in a temporary
table, and runs `Unbounded.split_sql`: the plain aggregate over the rows of every other
unit plus the bounded one over the heavy units' rows, added per group. Bounding treats
each unit alone and leaves a unit within the bounds as it is, so the two parts add up to
the bounded statement's statistics, group by group; only the heavy units' rows are
aggregated per unit (10M rows with a quarter of them heavy: 0.2 against 0.35 s). Where
heavy units hold more than half of the rows (`SPLIT_MAX_HEAVY_SHARE`) the split would
cost more than it saves, and the bounded statement runs.

A COUNT(*) of a whole table (no WHERE, no GROUP BY) needs no per-unit work beyond the
check's: bounding keeps min(n, max_rows) of a unit's n rows, so the bounded count is the
table's row count less Σ max(n − max_rows, 0) over all units, which the check of a plan
without GROUP BY reads too (`BoundCheck.excess`). Where the bounds do not hold, the
backend runs `Unbounded.excess_for`: the table's COUNT(*) less that number, bound as a
parameter, on the very data the check read (DuckDB: the file held read-only;
PostgreSQL: the check's snapshot, as above). DuckDB answers COUNT(*) from metadata:
10M rows with 363k units over the bound, 1.3 against 266 ms split, through a session.

The check's result never leaves the proxy. What can be observed is time: a query is
faster while no unit exceeds the bounds. Timing is outside the model dpproxy defends
(as for any engine whose speed depends on data size); `[privacy] verify_bounds = false`
in the policy turns the shortcut off.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from sqlglot import exp

UNIT = "__unit"
PAIR_ROWS = "__pair_rows"
UNIT_GROUPS = "__unit_groups"
UNIT_ROWS = "__unit_rows"
# Most distinct groups in a table for which the public-key filter runs after aggregation
LATE_FILTER_GROUPS = 1024
# Largest share of a table's rows its heavy units may hold for the split statement to run
SPLIT_MAX_HEAVY_SHARE = 0.5


@dataclass(frozen=True)
class BoundCheck:
    """A query over one table returning one row: the most rows any unit has in one group,
    and the most groups any unit has (NULLs on an empty table); with `counts_groups`, also
    the number of distinct groups in the table, counted up to LATE_FILTER_GROUPS + 1; with
    `counts_excess` (no group keys), Σ max(n − max_rows, 0) over the units' row counts n."""

    sql: str
    max_rows: int
    max_groups: int
    counts_groups: bool = False
    # the units exceeding either bound, with their rows (`__unit`, `__unit_rows`), and the
    # table's row count: what the split statement needs (see the module docstring)
    heavy_sql: str = ""
    rows_sql: str = ""
    counts_excess: bool = False
    table: str = ""  # the table read, as the policy names it
    # PostgreSQL: the check over only the units with a row version as young as the xmin of
    # an earlier snapshot, bound as $1 (see PostgresBackend._carried)
    young_sql: str = ""

    @cached_property
    def heavy_table(self) -> str:
        """The name of the temporary table the backend keeps this check's heavy units in:
        of `heavy_sql`, which holds the bounds (`sql` need not: with group keys it reads
        only maxima)."""
        return "__heavy_" + hashlib.sha256(self.heavy_sql.encode()).hexdigest()[:16]

    def holds(self, observed: Sequence[object] | None) -> bool:
        """Whether the observed maxima are within the plan's bounds."""
        if observed is None:
            return False
        rows, groups = (0 if v is None else int(v) for v in observed[:2])  # type: ignore[call-overload]
        return rows <= self.max_rows and groups <= self.max_groups

    def excess(self, observed: Sequence[object] | None) -> int | None:
        """The rows bounding drops from the whole table, as observed (None: not read)."""
        if not self.counts_excess or observed is None or len(observed) < 3:
            return None
        return int(observed[2] or 0)  # type: ignore[call-overload]

    def few_groups(self, observed: Sequence[object] | None) -> bool:
        """Whether the table was seen to hold at most LATE_FILTER_GROUPS groups."""
        if not self.counts_groups or observed is None or len(observed) < 3:
            return False
        return int(observed[2] or 0) <= LATE_FILTER_GROUPS  # type: ignore[call-overload]


@dataclass
class BoundingCounts:
    """How a backend ran the statements offered an unbounded form: checks read, and
    statements run unbounded (`skipped`), bounded (`enforced`), or bounded for the heavy
    units only (`split`)."""

    checks: int = 0
    skipped: int = 0
    enforced: int = 0
    split: int = 0
    excess: int = 0  # bounded counts run as the rows less the check's excess rows
    carried: int = 0  # checks that held carried to a later snapshot (PostgreSQL)
    # unbounded answers dropped for the bounded statement's: the catalog changed while
    # they ran (PostgreSQL; counted in `enforced` too)
    recomputed: int = 0


@dataclass(frozen=True, eq=False)
class Unbounded:
    """The plan's statistics without contribution bounding, which the backend may run
    instead of the bounded statement on data where `check` holds. Its parameters are its
    WHERE slots' values (`dpproxy.shapes`), if any, which the bounded statement takes last;
    the statement is generated on first use of `sql`."""

    generate: Callable[[], str] = field(repr=False)
    check: BoundCheck
    slots: int = 0
    # the same statement filtering its groups, not its rows, by the public key lists
    generate_late: Callable[[], str] | None = field(default=None, repr=False)
    # the plain aggregate over units within the bounds plus the bounded one over the units
    # in the named table (`BoundCheck.heavy_table`); parameters as the bounded statement's
    generate_split: Callable[[str], str] | None = field(default=None, repr=False)
    # a whole table's COUNT(*)s as its rows less the check's excess rows (its parameter)
    generate_excess: Callable[[], str] | None = field(default=None, repr=False)

    @cached_property
    def sql(self) -> str:
        return self.generate()

    @cached_property
    def split_sql(self) -> str | None:
        if self.generate_split is None:
            return None
        return self.generate_split(self.check.heavy_table)

    @cached_property
    def excess_sql(self) -> str | None:
        return self.generate_excess() if self.generate_excess is not None else None

    def excess_for(self, observed: Sequence[object] | None
                   ) -> tuple[str, tuple[int]] | None:
        """The bounded count as the table's rows less the excess `observed` by the check,
        with its parameter, where this plan has that form (`generate_excess`)."""
        excess = self.check.excess(observed)
        if excess is None or self.excess_sql is None:
            return None
        return self.excess_sql, (excess,)

    @cached_property
    def late_sql(self) -> str | None:
        return self.generate_late() if self.generate_late is not None else None

    def sql_for(self, observed: Sequence[object] | None) -> str | None:
        """The statement to run where the check read `observed`: None where the bounds
        may not hold (run the bounded one), the late-filtered form where the table has
        few groups, else `sql`."""
        if not self.check.holds(observed):
            return None
        if self.generate_late is not None and self.check.few_groups(observed):
            return self.late_sql
        return self.sql

    def parameters(self, bounded: Sequence[object]) -> tuple[object, ...]:
        """This statement's parameters, from the bounded statement's (salt first, if any,
        then the slots' values)."""
        return tuple(bounded[len(bounded) - self.slots:]) if self.slots else ()


def read_table(name: str, dialect: str) -> exp.Table:
    """The table as the check and the unbounded statements read it: on PostgreSQL
    `ONLY` the table, so that a child attached meanwhile (ATTACH PARTITION, INHERIT: locks
    that do not wait for readers) is read by neither; the backend verifies bounds only on
    a table without children (`PostgresBackend._observed`)."""
    return exp.Table(this=exp.to_identifier(name, quoted=True),
                     only=dialect == "postgres" or None)


def bound_check(table: str, unit: exp.Expression, keys: Sequence[exp.Expression],
                dialect: str, max_rows: int, max_groups: int, counts_groups: bool = False
                ) -> BoundCheck:
    """The check for a table, its privacy unit column and the plan's group keys (total row
    expressions, as the rewrite computes them); `counts_groups`: with the count of distinct
    groups (keys required).

    >>> from sqlglot import exp
    >>> print(bound_check("t", exp.column("uid", quoted=True), [], "duckdb", 5, 1).sql)
    ... # doctest: +NORMALIZE_WHITESPACE
    SELECT MAX(__pair_rows), MAX(__unit_groups), COALESCE(SUM(GREATEST(__pair_rows - 5,
    0)), 0) FROM (SELECT __unit, COUNT(*) AS __unit_groups, MAX(__pair_rows) AS
    __pair_rows FROM (SELECT __unit, COUNT(*) AS __pair_rows FROM (SELECT "uid" AS __unit
    FROM "t") AS rows GROUP BY __unit) AS pairs GROUP BY __unit) AS units
    """
    key_names = [f"k{i}" for i in range(len(keys))]

    def units_of(*wheres: exp.Expression) -> exp.Select:
        """Per unit (of the rows each of `wheres` keeps, all of them together; without any,
        every row): its groups and its most rows in one."""
        items = [exp.alias_(unit.copy(), UNIT),
                 *(exp.alias_(k.copy(), n) for k, n in zip(keys, key_names, strict=True))]
        rows: exp.Query = exp.select(*items, copy=False).from_(
            read_table(table, dialect), copy=False)
        if wheres:
            rows = functools.reduce(
                lambda a, b: exp.union(a, b, distinct=False, copy=False),
                [rows.copy().where(w, copy=False) for w in wheres])  # type: ignore[attr-defined]
        pairs = exp.select(exp.column(UNIT), exp.alias_(exp.Count(this=exp.Star()), PAIR_ROWS),
                           copy=False).from_(rows.subquery("rows", copy=False),
                                             copy=False).group_by(
            exp.column(UNIT), *(exp.column(n) for n in key_names), copy=False)
        return exp.select(
            exp.column(UNIT), exp.alias_(exp.Count(this=exp.Star()), UNIT_GROUPS),
            exp.alias_(exp.Max(this=exp.column(PAIR_ROWS)), PAIR_ROWS), copy=False).from_(
            pairs.subquery("pairs", copy=False), copy=False).group_by(exp.column(UNIT),
                                                                      copy=False)

    def maxima(units: exp.Select) -> exp.Select:
        return exp.select(exp.Max(this=exp.column(PAIR_ROWS)),
                          exp.Max(this=exp.column(UNIT_GROUPS)), copy=False).from_(
            units.subquery("units", copy=False), copy=False)

    units = units_of()
    # the units over either bound, each with its rows
    heavy = exp.select(exp.column(UNIT), exp.column(UNIT_ROWS), copy=False).from_(
        units.copy().select(exp.alias_(exp.Sum(this=exp.column(PAIR_ROWS)), UNIT_ROWS),
                            copy=False).subquery("units", copy=False), copy=False).where(
        exp.or_(exp.GT(this=exp.column(PAIR_ROWS), expression=exp.Literal.number(max_rows)),
                exp.GT(this=exp.column(UNIT_GROUPS),
                       expression=exp.Literal.number(max_groups))), copy=False)
    table_rows = exp.select(exp.Count(this=exp.Star()), copy=False).from_(
        read_table(table, dialect), copy=False)
    check = maxima(units.copy())
    if not keys:  # one group per unit: its most rows in a group are its rows
        over = exp.func("GREATEST", exp.Sub(this=exp.column(PAIR_ROWS),
                                            expression=exp.Literal.number(max_rows)),
                        exp.Literal.number(0))
        check.select(exp.func("COALESCE", exp.Sum(this=over), exp.Literal.number(0)),
                     copy=False)
    if counts_groups:
        assert keys, "only a GROUP BY has groups to count"
        key_rows = exp.select(*(exp.alias_(k.copy(), n) for k, n in
                                zip(keys, key_names, strict=True)), copy=False).from_(
            read_table(table, dialect), copy=False)
        # LIMIT: a table with many groups is not counted to the end
        groups = exp.select(exp.Literal.number(1), copy=False).from_(
            key_rows.subquery("key_rows", copy=False), copy=False).group_by(
            *(exp.column(n) for n in key_names), copy=False).limit(LATE_FILTER_GROUPS + 1,
                                                                   copy=False)
        check.select(exp.Subquery(this=exp.select(exp.Count(this=exp.Star()), copy=False)
                                  .from_(groups.subquery("groups", copy=False), copy=False)),
                     copy=False)
    young = ""
    if dialect == "postgres":
        young = _young_units_check(table, unit, units_of, maxima)
    return BoundCheck(check.sql(dialect=dialect, copy=False), max_rows, max_groups,
                      counts_groups, heavy.sql(dialect=dialect, copy=False),
                      table_rows.sql(dialect=dialect, copy=False), counts_excess=not keys,
                      table=table, young_sql=young)


def _young_units_check(table: str, unit: exp.Expression,
                       units_of: Callable[..., exp.Select],
                       maxima: Callable[[exp.Select], exp.Select]) -> str:
    """The check over only the units with a young row version (`_YOUNG`), NULL as one unit.
    Their list is read once (a materialized CTE, one scan of the table); where it is
    empty, the tests on it stop PostgreSQL before it reads the table again, and the
    listed units' rows are found by a semi-join, not a test per row."""
    listed = exp.select(exp.column(UNIT), copy=False).from_(YOUNG_UNITS, copy=False)
    rows_of_listed = exp.and_(exp.Exists(this=listed.copy()),
                              exp.In(this=unit.copy(), query=exp.Subquery(this=listed.copy())),
                              copy=False)
    is_null = exp.Is(this=unit.copy(), expression=exp.Null())
    rows_of_null = exp.and_(exp.Exists(this=listed.where(
        exp.Is(this=exp.column(UNIT), expression=exp.Null()), copy=False)), is_null,
        copy=False)
    check = maxima(units_of(rows_of_listed, rows_of_null))
    young_rows = exp.select(exp.alias_(unit.copy(), UNIT), copy=False).from_(
        read_table(table, "postgres"), copy=False).where(
        exp.condition(_YOUNG, dialect="postgres"), copy=False)
    return check.with_(YOUNG_UNITS, as_=young_rows, materialized=True,
                       copy=False).sql(dialect="postgres")


YOUNG_UNITS = "__young_units"
# A row version whose inserting transaction (xmin) is as young as a snapshot's xmin, given
# as $1 (an xid: its 32 low bits). age(x) is (int32)(N − x) for one N per transaction, the
# next xid read at its first call (after the snapshot: N exceeds every xid it sees), so
# this is xmin >= $1 for every version within 2^31 xids of N (the caller keeps $1 so; an
# older raw xmin, frozen long ago, wraps and counts as young: checked again, never missed),
# and xids 0–2 (frozen, bootstrap) have age INT_MAX: old.
_YOUNG = "age(xmin) <= (SELECT age(CAST($1 AS xid)))"
