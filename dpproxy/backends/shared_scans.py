"""Shared scans: concurrent runs of one statement text with different parameters, run
as one statement.

A client that prepares a query and runs it with new parameters (a dashboard, a BI tool,
many analysts on one template) sends the backend the same rewritten text again and
again; only its WHERE slots differ (`dpproxy.shapes`). DuckDB binds and optimizes every
statement afresh, which costs more than scanning a small table. When such runs overlap,
the first one to arrive runs alone and those that arrive meanwhile wait; the next of them
then runs all the waiting ones as one statement (as a group commit does with writes):

    SELECT k0, COUNT(*) AS m0 FROM (SELECT … FROM t WHERE public AND c > $1) GROUP BY k0

becomes, for two runs,

    SELECT k0, COUNT(*) FILTER (WHERE __run_0) AS m0, COUNT(*) FILTER (WHERE __run_0),
           COUNT(*) FILTER (WHERE __run_1) AS m0, COUNT(*) FILTER (WHERE __run_1)
    FROM (SELECT …, c > $1 AS __run_0, c > $2 AS __run_1 FROM t WHERE public) GROUP BY k0

and each run gets back exactly the rows its own statement returns: its keys and its
aggregates, and, with GROUP BY, only the groups where it has rows (the second COUNT).
Nothing crosses between runs: each run's aggregates see only the rows its own condition
keeps, and each run's rows go back to its own caller, to be noised and released there.

Only one shape is shared: an aggregate over one subquery of row expressions whose WHERE
holds every parameter, with no HAVING, ORDER BY, LIMIT, DISTINCT or window (the rewrite's
statement without bounding; the backend offers no other), or that aggregate with its
groups filtered by a condition without parameters (`SELECT * FROM (… OFFSET 0) AS grouped
WHERE k0 IN (…)`, `dpproxy.bounds`), which then filters the shared statement's groups.
Anything else runs alone, as does every run when a shared statement fails, and a statement
of more than MAX_PARAMETERS parameters.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

Rows = list[tuple[object, ...]]
Runner = Callable[[str, Sequence[object]], Rows]

MAX_RUNS = 16  # runs per shared statement: more makes the statement slower per run
# Statements with more parameters run alone: taking one apart parses it whole (5 s for an
# IN list of 8,000 literals, read in three of the backend's statements), and a shared
# statement would hold MAX_RUNS copies of its condition
MAX_PARAMETERS = 256
RUN_FLAG = "__run_{}"
_KNOWN_TEXTS = 256  # statement texts whose template (or unshareability) is kept


@dataclass(frozen=True)
class SharedTemplate:
    """One shareable statement text, taken apart: its group keys, its aggregate columns,
    and its WHERE split into the part with parameters (per run) and the rest (shared)."""

    keys: int  # the first `keys` output columns are the group keys
    parameters: int  # $1 … $parameters, all in the per-run condition
    outer: exp.Select = field(repr=False)
    inner: exp.Select = field(repr=False)
    condition: exp.Expression = field(repr=False)
    groups_filter: exp.Expression | None = field(default=None, repr=False)
    _texts: dict[int, str] = field(default_factory=dict, repr=False, compare=False)

    def sql(self, runs: int) -> str:
        """The statement running `runs` runs at once: run j's parameters are
        $(j·parameters + 1) … $((j + 1)·parameters)."""
        text = self._texts.get(runs)
        if text is None:
            text = self._texts[runs] = self._build(runs).sql(dialect="duckdb")
        return text

    def _build(self, runs: int) -> exp.Select:
        inner = self.inner.copy()
        for j in range(runs):
            condition = self.condition.copy().transform(_renumbered(j * self.parameters),
                                                        copy=False)
            inner.select(exp.alias_(condition, RUN_FLAG.format(j)), copy=False)
        outer = self.outer.copy()
        items = outer.expressions[:self.keys]
        for j in range(runs):
            flag = exp.column(RUN_FLAG.format(j))
            for item in self.outer.expressions[self.keys:]:
                items.append(item.copy().transform(_filtered(flag), copy=False))
            if self.keys:
                items.append(exp.Filter(this=exp.Count(this=exp.Star()),
                                        expression=exp.Where(this=flag.copy())))
        outer.set("expressions", items)
        outer.set("from_", exp.From(this=inner.subquery("shared", copy=False)))
        if self.groups_filter is not None:  # the same for every run: it tests keys only
            return exp.select(exp.Star(), copy=False).from_(
                outer.offset(0, copy=False).subquery("grouped", copy=False),
                copy=False).where(self.groups_filter.copy(), copy=False)
        return outer

    def split(self, rows: Rows, runs: int) -> list[Rows]:
        """Each run's rows, out of the shared statement's."""
        width = len(self.outer.expressions) - self.keys + (1 if self.keys else 0)
        out: list[Rows] = []
        for j in range(runs):
            start = self.keys + j * width
            if not self.keys:
                out.append([row[start:start + width] for row in rows])
                continue
            stop = start + width - 1
            out.append([row[:self.keys] + row[start:stop] for row in rows
                        if row[stop]])  # a group where this run has no row is not its
        return out


def _renumbered(offset: int) -> Callable[[exp.Expression], exp.Expression]:
    def renumber(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Placeholder):
            return exp.Placeholder(this=str(int(node.this) + offset))
        return node
    return renumber


def _filtered(flag: exp.Expression) -> Callable[[exp.Expression], exp.Expression]:
    def filtered(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.AggFunc):
            return exp.Filter(this=node, expression=exp.Where(this=flag.copy()))
        return node
    return filtered


def shared_template(sql: str) -> SharedTemplate | None:
    """The template of a statement that can be shared, or None."""
    try:
        outer = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    groups_filter = _groups_filter(outer)
    if groups_filter is not None:
        outer = outer.args["from_"].this.this.copy()
        outer.set("offset", None)
    if not isinstance(outer, exp.Select) or any(
            outer.args.get(a) for a in ("where", "having", "order", "limit", "offset",
                                         "distinct", "joins", "with_", "qualify", "windows")):
        return None
    source = outer.args.get("from_")
    inner = source.this if isinstance(source, exp.From) else None
    if not isinstance(inner, exp.Subquery) or not isinstance(inner.this, exp.Select):
        return None
    inner = inner.this
    if any(inner.args.get(a) for a in ("group", "having", "order", "limit", "offset",
                                        "distinct", "with_", "qualify", "windows")) \
            or inner.find(exp.AggFunc, exp.Window, exp.Subquery):
        return None
    group = outer.args.get("group")
    keys = list(group.expressions) if group else []
    items = outer.expressions
    if items[:len(keys)] != keys or not all(isinstance(k, exp.Column) for k in keys) \
            or outer.find(exp.Window, exp.Filter):
        return None
    for item in items[len(keys):]:
        if item.find(exp.Subquery) or not item.find(exp.AggFunc):
            return None
        # every column outside an aggregate would be a key's, and the keys come first
        if any(c.find_ancestor(exp.AggFunc) is None for c in item.find_all(exp.Column)):
            return None
    placeholders = list(outer.find_all(exp.Placeholder))
    numbers = sorted({_number(p) for p in placeholders})
    if not numbers or numbers != list(range(1, len(numbers) + 1)):
        return None
    where = inner.args.get("where")
    if where is None:
        return None
    conjuncts = list(where.this.flatten()) if isinstance(where.this, exp.And) \
        else [where.this]
    per_run = [c for c in conjuncts if c.find(exp.Placeholder)]
    shared = [c for c in conjuncts if not c.find(exp.Placeholder)]
    if sum(len(list(c.find_all(exp.Placeholder))) for c in per_run) != len(placeholders):
        return None  # a parameter outside the WHERE: the runs' rows would differ
    inner = inner.copy()
    inner.set("where", exp.Where(this=exp.and_(*shared)) if shared else None)
    condition = exp.and_(*(c.copy() for c in per_run))
    return SharedTemplate(len(keys), len(numbers), outer, inner, condition, groups_filter)


def _groups_filter(statement: exp.Expression) -> exp.Expression | None:
    """The condition of `SELECT * FROM (<aggregate> OFFSET 0) AS grouped WHERE condition`
    without parameters, or None for any other statement."""
    if not isinstance(statement, exp.Select) or len(statement.expressions) != 1 \
            or not isinstance(statement.expressions[0], exp.Star) or any(
            statement.args.get(a) for a in ("group", "having", "order", "limit", "offset",
                                             "distinct", "joins", "with_", "qualify",
                                             "windows")):
        return None
    source, where = statement.args.get("from_"), statement.args.get("where")
    grouped = source.this if isinstance(source, exp.From) else None
    if where is None or where.find(exp.Placeholder) or not isinstance(grouped, exp.Subquery) \
            or not isinstance(grouped.this, exp.Select):
        return None
    offset = grouped.this.args.get("offset")
    if offset is None or offset.expression != exp.Literal.number(0):
        return None
    return where.this


def _number(placeholder: exp.Placeholder) -> int:
    try:
        return int(placeholder.this)
    except (TypeError, ValueError):
        return 0  # `?` or a named parameter: never shared


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Run:
    parameters: Sequence[object]
    rows: Rows | None = None
    error: BaseException | None = None
    done: bool = False
    # held until the run is answered or asked to lead: each waiting run is woken once
    wake: threading.Lock = field(default_factory=_held_lock)


@dataclass
class SharedScanCounts:
    """Statements run for shareable texts, and the runs they answered."""

    statements: int = 0
    runs: int = 0
    largest: int = 0


class SharedScans:
    """Runs statements through `run`, sharing one statement among overlapping runs of one
    shareable text (see the module docstring). Thread-safe; each thread runs its
    statements through `run`, which must be safe to call from any thread."""

    def __init__(self, run: Runner, max_runs: int = MAX_RUNS) -> None:
        self._run = run
        self._max = max_runs
        self._templates: OrderedDict[str, SharedTemplate | None] = OrderedDict()
        self._waiting: dict[str, list[_Run]] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()
        self.counts = SharedScanCounts()

    def template(self, sql: str) -> SharedTemplate | None:
        with self._lock:
            if sql in self._templates:
                self._templates.move_to_end(sql)
                return self._templates[sql]
        template = shared_template(sql)  # parsed outside the lock; a race parses twice
        with self._lock:
            self._templates[sql] = template
            if len(self._templates) > _KNOWN_TEXTS:
                self._templates.popitem(last=False)
        return template

    def run(self, sql: str, parameters: Sequence[object]) -> Rows:
        template = self.template(sql) if 0 < len(parameters) <= MAX_PARAMETERS else None
        if template is None or len(parameters) != template.parameters:
            return self._run(sql, parameters)
        mine = _Run(parameters)
        with self._lock:
            lead = sql not in self._running
            if lead:
                self._running.add(sql)
            else:
                self._waiting.setdefault(sql, []).append(mine)
        if not lead:
            mine.wake.acquire()  # answered, or asked to lead the runs waiting by then
            if mine.done:
                return self._outcome(mine)
        with self._lock:
            waiting = self._waiting.get(sql, [])
            batch = [mine, *waiting[:self._max - 1]]
            del waiting[:self._max - 1]
        successor = None
        try:
            self._run_batch(sql, template, batch)
        finally:
            with self._lock:
                self.counts.statements += 1
                self.counts.runs += len(batch)
                self.counts.largest = max(self.counts.largest, len(batch))
                for taken in batch:
                    taken.done = True
                waiting = self._waiting.get(sql, [])
                if waiting:
                    successor = waiting.pop(0)
                else:
                    self._running.discard(sql)
                    self._waiting.pop(sql, None)
            for taken in batch[1:]:
                taken.wake.release()
            if successor is not None:
                successor.wake.release()  # it leads the runs that came meanwhile
        return self._outcome(mine)

    def _run_batch(self, sql: str, template: SharedTemplate, batch: list[_Run]) -> None:
        if len(batch) > 1:
            parameters = [p for run in batch for p in run.parameters]
            try:
                rows = self._run(template.sql(len(batch)), parameters)
                split = template.split(rows, len(batch))
            except Exception:  # each run then meets its own outcome alone
                pass
            else:
                for run, own in zip(batch, split, strict=True):
                    run.rows = own
                return
        for run in batch:
            try:
                run.rows = self._run(sql, run.parameters)
            except BaseException as exc:  # handed to the run's own caller
                run.error = exc

    @staticmethod
    def _outcome(run: _Run) -> Rows:
        if run.error is not None:
            raise run.error
        assert run.rows is not None
        return run.rows
