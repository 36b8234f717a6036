"""The session: parse → analyze → plan → rewrite → charge → execute → release → respond.

An `Engine` holds what one policy's sessions share (backend, ledger, audit
log); a `Session` is one analyst's connection with its options. Neither knows
about the wire or the DB-API: both are thin shells over `Session.execute`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any

from sqlglot import exp

from . import errors
from .accountant import (
    AccountStatus,
    AnswerAvailable,
    CachedAnswer,
    Cost,
    Ledger,
    Loss,
    PostgresStorage,
    Storage,
)
from .analyze import Analysis, ConstantQuery, analyze
from .audit import AuditLog, AuditRecord
from .backends import Backend, open_backend
from .parse import (
    Parameters,
    Statement,
    bind_statement,
    bound,
    parse_statements,
    placeholder_count,
)
from .plan import (
    SELECTION_MODES,
    QueryOptions,
    QueryPlan,
    format_split,
    parse_split,
    plan_query,
)
from .policy import AnalystPolicy, Policy, env_password, load_policy, with_storage
from .postprocess import evaluate
from .release import ColumnAccuracy, Interval, Released, release
from .rewrite import Rewritten, rewrite
from .shapes import Shape, TemplateShape, intact, lift, parameter_value, unlift

_log = logging.getLogger("dpproxy")

OPTION_PREFIX = "dpproxy."
OPTIONS = ("epsilon", "delta", "mechanism", "confidence", "min_units_per_group", "split",
           "selection")
REWRITE_CACHE_SIZE = 1024
TEMPLATES_PER_TEXT = 4  # templates kept per query text: kinds of parameters seen
# "off": analyse a query before looking up its stored answer, for A/B benchmarks.
FAST_REPEATS = os.environ.get("DPPROXY_FAST_REPEATS", "on").lower() != "off"
# "off": analyse and rewrite every query, even one whose shape (`dpproxy.shapes`) was seen.
SHAPE_CACHE = os.environ.get("DPPROXY_SHAPE_CACHE", "on").lower() != "off"
CACHE_WAIT_S = 30.0  # how long a repeat waits for the first answer still being computed
# queries_left_like_last: how many more queries shaped like the session's last charged one
# the remaining budget buys (NULL before the first).
BUDGET_COLUMNS = ("account", "epsilon_budget", "epsilon_spent", "epsilon_remaining",
                  "delta_budget", "delta_spent", "delta_remaining", "queries_left_like_last")
BUDGET_TYPES = ("text",) + ("float8",) * 6 + ("int8",)


@dataclass(frozen=True)
class Description:
    """The shape of a statement's result, known without running it."""

    columns: tuple[str, ...]
    types: tuple[str, ...]


@dataclass
class Result:
    """What a statement returns: rows with their accuracy, and what it cost."""

    columns: tuple[str, ...] = ()
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    tag: str = "SELECT 0"  # PostgreSQL command tag
    types: tuple[str, ...] = ()  # PostgreSQL type name per column: int8 float8 text date bool
    accuracy: tuple[ColumnAccuracy | None, ...] = ()
    intervals: list[tuple[Interval | None, ...]] = field(default_factory=list)
    cost: Cost | None = None  # charged by this statement (None: nothing charged)
    remaining: Cost | None = None  # the analyst's budget left afterwards
    notices: list[str] = field(default_factory=list)


def _answer_json(result: Result) -> str:
    # each accuracy's fields as they are (asdict's deep copy is slow); a nested dataclass,
    # should one appear, is converted when met
    return json.dumps({
        "columns": result.columns, "rows": result.rows, "tag": result.tag,
        "types": result.types, "intervals": result.intervals,
        "accuracy": [vars(a) if a is not None else None for a in result.accuracy],
    }, default=_dataclass_json)


def _dataclass_json(value: object) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _result_from_json(text: str) -> Result:
    data = json.loads(text)
    return Result(
        tuple(data["columns"]), [tuple(r) for r in data["rows"]], data["tag"],
        tuple(data["types"]),
        tuple(ColumnAccuracy(**{**a, "noise_scales": tuple(a["noise_scales"])})
              if a is not None else None for a in data["accuracy"]),
        [tuple(tuple(i) if i is not None else None for i in row) for row in data["intervals"]])


def _memo_key(statement: Statement) -> tuple[str, str]:
    last = getattr(_last_memo, "key", None)  # a statement is looked up several times in turn
    if last is not None and last[0] is statement:
        return last[1]  # type: ignore[no-any-return]
    params = json.dumps(_typed_parameters(statement.params))
    # a query reading the clock is a new query at every execution (until bound and folded)
    key = (statement.text, params if statement.clock is None
           else f"{params} at {statement.clock.isoformat()}")
    _last_memo.key = (statement, key)
    return key


_last_memo = threading.local()


def _typed_parameters(params: Parameters) -> list[Any]:
    """Parameters as JSON that keeps their types apart (1, 1.0, '1' and True differ).

    >>> _typed_parameters([1, 1.0, "1", True, None])
    [['int', '1'], ['float', '1.0'], ['str', "'1'"], ['bool', 'True'], ['NoneType', 'None']]
    """
    if params is None:
        return []
    items = sorted(params.items()) if isinstance(params, Mapping) else enumerate(params)
    return [[type(v).__name__, repr(v)] if isinstance(k, int) else [k, type(v).__name__,
                                                                    repr(v)]
            for k, v in items]


def analyst_account(name: str) -> str:
    return f"analyst:{name}"


def table_account(name: str) -> str:
    return f"table:{name}"


def initial_budgets(policy: Policy) -> dict[str, Cost]:
    """Every account the policy defines, with its budget: analysts' and tables' totals."""
    budgets = {analyst_account(a.name): Cost(a.budget.epsilon, a.budget.delta)
               for a in policy.analysts.values() if a.budget is not None}
    budgets |= {table_account(t.name): Cost(t.total_budget.epsilon, t.total_budget.delta)
                for t in policy.tables.values() if t.total_budget is not None}
    return budgets


def open_ledger(policy: Policy, adopt_window_by: str | None = None) -> Ledger:
    """The policy's ledger, created with its budgets if new, in its accounting mode: the
    SQLite file `[ledger] path`, or the PostgreSQL schema of `[ledger] dsn`.
    `adopt_window_by`: the policy's budget window replaces the ledger's (see `Ledger`)."""
    shared = policy.shared_ledger
    storage: Storage | Path = policy.ledger_path
    if shared is not None:
        storage = PostgresStorage(
            shared.dsn, shared.schema,
            password=env_password(shared.password_env, "ledger.password_env"),
            passfile=str(shared.passfile) if shared.passfile is not None else None)
    return Ledger(storage, initial_budgets(policy),
                  accounting=policy.privacy.accounting, window=policy.privacy.budget_window,
                  adopt_window_by=adopt_window_by)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells a file's content changed without reading it: inode, size, mtime."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _too_deep() -> errors.ProgramLimitExceeded:
    return errors.ProgramLimitExceeded(
        "the query is nested too deeply to analyse",
        hint="write long lists of conditions as IN (…), or split the expression")


class Engine:
    """Everything sessions on one policy share. Thread-safe."""

    def __init__(self, policy: Policy, backend: Backend | None = None) -> None:
        self.backend = backend if backend is not None else open_backend(policy)
        # each column's type in the database: the rewrite groups keys by what is released
        # (`rewrite.released_key`), and a query naming what the database lacks is refused
        # before it is charged
        tables = list(policy.tables)
        self.policy = with_storage(policy, self.backend.column_types(tables),
                                   self.backend.not_null_columns(tables))
        self.ledger = open_ledger(policy)
        self.audit = AuditLog(policy.audit_log_path)
        self._closed = False
        self._lock = threading.Lock()
        # the policy as read, and its file's stamp then: `refresh_analysts` compares them
        self._read = policy
        self._stamp = _stamp(policy.path)
        self._refresh_lock = threading.Lock()
        self._rewrites: OrderedDict[tuple[str, bool], Rewritten] = OrderedDict()
        # backend statements the backend has planned once (`check_plans`)
        self._planned: weakref.WeakSet[Rewritten] = weakref.WeakSet()
        # regular expressions the backend has compiled once (`check_patterns`)
        self._compiled: set[tuple[str, bool]] = set()
        # (statement text, typed parameters) → the normalized bound query
        self._normalized: OrderedDict[tuple[str, str], str] = OrderedDict()
        # (statement text, typed parameters) → its output names and the tables it reads, for
        # texts analysed and accepted: a repeat is answered before analysis
        self._output_names: OrderedDict[tuple[str, str], tuple[tuple[str, ...], frozenset[str]]] \
            = OrderedDict()
        # (analyst, shape key) → the accepted analysis of a query of that shape (its WHERE
        # holding the shape's slots), and the backend statement of that analysis
        self._shapes: OrderedDict[tuple[str, str], tuple[Analysis, Rewritten]] = OrderedDict()
        # query texts whose parameters (if any) all land in slots: text → its templates, one
        # per kind of parameters seen (signs, integers or decimals: `TemplateShape`)
        self._templates: OrderedDict[str, tuple[TemplateShape, ...]] = OrderedDict()

    def shape(self, analyst: str, key: str) -> tuple[Analysis, Rewritten] | None:
        """The analysis and backend statement of an accepted query of this shape."""
        with self._lock:
            cached = self._shapes.get((analyst, key))
            if cached is not None:
                self._shapes.move_to_end((analyst, key))
            return cached

    def remember_shape(self, analyst: str, key: str, analysis: Analysis,
                       rewritten: Rewritten) -> None:
        with self._lock:
            self._shapes[(analyst, key)] = (analysis, rewritten)
            if len(self._shapes) > REWRITE_CACHE_SIZE:
                self._shapes.popitem(last=False)

    def templates(self, text: str) -> tuple[TemplateShape, ...]:
        """How this query text's shape prints for new parameter values (or none): a
        template per kind of parameters seen with it."""
        with self._lock:
            return self._templates.get(text, ())

    def remember_template(self, text: str, template: TemplateShape) -> None:
        """Add a template of a text (at most TEMPLATES_PER_TEXT; the first ones stay)."""
        with self._lock:
            known = self._templates.get(text, ())
            if len(known) < TEMPLATES_PER_TEXT:
                self._templates[text] = (*known, template)
            if len(self._templates) > REWRITE_CACHE_SIZE:
                self._templates.popitem(last=False)

    def output_names(self, statement: Statement, granted: Collection[str]
                     ) -> tuple[str, ...] | None:
        """The output names of this text with these parameters, if it was accepted before
        and reads only `granted` tables (a grant revoked since is analysed again)."""
        with self._lock:
            known = self._output_names.get(_memo_key(statement))
        if known is None or not known[1] <= set(granted):
            return None
        return known[0]

    def remember_output_names(self, statement: Statement, names: tuple[str, ...],
                              tables: frozenset[str]) -> None:
        with self._lock:
            self._output_names[_memo_key(statement)] = (names, tables)
            if len(self._output_names) > REWRITE_CACHE_SIZE:
                self._output_names.popitem(last=False)

    def normalized_query(self, statement: Statement) -> str:
        """The bound query, identifiers normalized, as SQL text: what the answer cache keys
        on, so a query sent with literals and the same one sent with parameters share one
        answer. Remembered per (text, typed parameters): a repeat does not generate it (nor
        bind an unbound statement to print it)."""
        memo = _memo_key(statement)
        with self._lock:
            cached = self._normalized.get(memo)
            if cached is not None:
                self._normalized.move_to_end(memo)
                return cached
        ast = bound(statement).ast
        assert ast is not None
        # The generator lower-cases unquoted identifiers as it prints, as
        # normalize_identifiers does for PostgreSQL, without copying and walking the tree.
        normalized = ast.sql("postgres", normalize=True)
        self.remember_normalized(statement, normalized)
        return normalized

    def remember_normalized(self, statement: Statement, normalized: str) -> None:
        """Remember the normalized query of a statement (printed along with its shape)."""
        memo = _memo_key(statement)
        with self._lock:
            self._normalized[memo] = normalized
            self._normalized.move_to_end(memo)
            if len(self._normalized) > REWRITE_CACHE_SIZE:
                self._normalized.popitem(last=False)

    def rewritten(self, plan: QueryPlan) -> Rewritten:
        """The backend statement for a plan, cached by normalized query: it depends only on
        the analysis, this engine's policy and how the plan selects groups (the salt is
        bound per execution)."""
        key = (plan.analysis.statement, plan.counts_units)
        with self._lock:
            cached = self._rewrites.get(key)
            if cached is not None:
                self._rewrites.move_to_end(key)
                return cached
        fresh = rewrite(plan, self.backend.dialect)
        with self._lock:
            self._rewrites[key] = fresh
            if len(self._rewrites) > REWRITE_CACHE_SIZE:
                self._rewrites.popitem(last=False)
        return fresh

    def check_patterns(self, analysis: Analysis) -> None:
        """Have the backend compile the query's regular expressions, each the first time it
        is used: one it cannot compile is refused before the charge, as a query that fails
        only where a row reaches the pattern would tell that such a row exists."""
        patterns = analysis.regular_expressions
        with self._lock:
            fresh = sorted(patterns - self._compiled)
        if fresh:
            self.backend.check_patterns(fresh)
            with self._lock:
                self._compiled.update(fresh)

    def check_plans(self, rewritten: Rewritten, values: Sequence[object] = ()) -> None:
        """Have the backend plan a backend statement without running it, the first time it
        is to run: one it cannot plan is refused before the charge (BackendError), not
        failed after it. The form without bounding is planned where there is one: it holds
        the same row expressions (what a rewrite can get wrong for a backend) and plans in
        a fraction of the bounded one's time."""
        with self._lock:
            if rewritten in self._planned:
                return
        bounded = rewritten.parameters(values)
        unbounded = rewritten.unbounded if self.policy.privacy.verify_bounds else None
        self.backend.check_plans([(unbounded.sql, unbounded.parameters(bounded))]
                                 if unbounded is not None else [(rewritten.sql, bounded)])
        with self._lock:
            self._planned.add(rewritten)

    @classmethod
    def from_path(cls, path: str | Path) -> Engine:
        return cls(load_policy(path))

    def analysts_stale(self) -> bool:
        """Whether the policy file changed since it was read (one stat): then call
        `refresh_analysts`."""
        return _stamp(self._read.path) != self._stamp

    def refresh_analysts(self, force: bool = False) -> None:
        """Take the analysts of the policy file as it is now, if only its analysts changed:
        those added (`dpproxy analyst add`, or its SQL over the wire) with their new ledger
        accounts, those removed, new `password_scram` verifiers (the only way to change a
        password with a PostgreSQL ledger), and an analyst's `tables` and `role`, which
        apply from their next statement (a revoked table is refused from then on, repeats
        included). A budget edited for an existing analyst is logged and left: the ledger
        holds the live budget (`dpproxy budget set`). Any other change to the file waits
        for a restart and is logged, its analysts taken all the same; a file that no
        longer loads is logged and changes nothing. One stat of the file when nothing
        changed; `force`: read it all the same (an engine built on a policy loaded
        earlier, as a restarted server worker's is)."""
        stamp = _stamp(self._read.path)
        if stamp == self._stamp and not force:
            return
        with self._refresh_lock:
            if stamp == self._stamp and not force:
                return
            read = self._read
            try:
                fresh = load_policy(read.path)
            except errors.Error as exc:
                _log.warning("policy %s changed but does not load (%s); serving the policy "
                             "as it was", read.path.name, exc.message)
                self._stamp = stamp
                return
            if replace(fresh, analysts={}, version="") != replace(read, analysts={}, version=""):
                # the analysts still apply: a revocation must not wait for the restart
                _log.warning("policy %s changed beyond its analysts: restart to apply the "
                             "rest; its analysts apply now", read.path.name)
            analysts = dict(fresh.analysts)
            kept = set(read.analysts) & set(analysts)
            for name in sorted(a for a in kept if analysts[a].budget != read.analysts[a].budget):
                _log.warning("policy %s: the budget of analyst %s changed in the file; the "
                             "ledger keeps the budget it holds (`dpproxy budget set` changes "
                             "it)", read.path.name, name)
                analysts[name] = replace(analysts[name], budget=read.analysts[name].budget)
            regranted = [a for a in kept if (analysts[a].tables, analysts[a].role)
                         != (read.analysts[a].tables, read.analysts[a].role)]
            added = [analysts[a] for a in analysts if a not in kept]
            self.ledger.add_accounts({analyst_account(a.name): Cost(a.budget.epsilon,
                                                                    a.budget.delta)
                                      for a in added if a.budget is not None})
            # the version (the key of stored answers) stays: no query reads the analysts
            # list, nor a verifier; whatever lets a query skip analysis (a stored shape, a
            # text's output names) is used only while the analyst is granted its tables
            self._read = replace(read, analysts=analysts)
            self.policy = replace(self.policy, analysts=analysts)
            self._stamp = stamp
            _log.info("policy %s: analysts now %s%s", read.path.name,
                      ", ".join(sorted(analysts)),
                      f"; new grants for {', '.join(sorted(regranted))}" if regranted else "")

    def session(self, analyst: str, **options: Any) -> Session:
        return Session(self, self.policy.analyst(analyst), options)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.ledger.close()
        self.backend.close()
        self.audit.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    def __init__(self, engine: Engine, analyst: AnalystPolicy, options: dict[str, Any]) -> None:
        self.engine = engine
        self.analyst = analyst
        defaults = engine.policy.privacy
        self._defaults = QueryOptions(defaults.default_epsilon, defaults.default_delta,
                                      defaults.mechanism, defaults.confidence,
                                      defaults.min_units_per_group,
                                      selection=defaults.selection)  # type: ignore[arg-type]
        self.options = self._defaults
        for name, value in options.items():
            self.set_option(name, value)
        self.client_settings: dict[str, str] = {}
        # most rows a result may have (the wire server's max_result_rows), None: no limit;
        # a query sure to exceed it is refused before it is charged
        self.max_result_rows: int | None = None
        self._last_loss: Loss | None = None
        # (options, data version, the answer key's JSON after its query: see _cache_key)
        self._key_parts: tuple[QueryOptions, str, str] | None = None
        # the statement being run and its normalized query, printed with its shape
        self._printed: tuple[Statement, str] | None = None

    # options --------------------------------------------------------------------------------
    def set_option(self, name: str, value: Any) -> None:
        """Set dpproxy.<name> (see OPTIONS) for later queries."""
        key = name.lower().removeprefix(OPTION_PREFIX)
        if key not in OPTIONS:
            raise errors.UndefinedObject(f"unrecognized configuration parameter "
                                         f"\"{OPTION_PREFIX}{key}\"",
                                         hint=f"dpproxy options: {', '.join(OPTIONS)}")
        if key == "split":  # per-aggregate weights of the ε/δ split (plan.budget_fractions)
            self.options = replace(self.options, split=parse_split(value))
            return
        try:
            typed: Any = str(value).lower() if key in ("mechanism", "selection") \
                else float(value)
        except (TypeError, ValueError):
            raise errors.InvalidParameterValue(
                f"invalid value for {OPTION_PREFIX}{key}: {value!r}") from None
        if key == "mechanism" and typed not in ("laplace", "gaussian"):
            raise errors.InvalidParameterValue(
                f"invalid value for {OPTION_PREFIX}mechanism: {value!r}",
                hint="use 'laplace' or 'gaussian'")
        if key == "selection" and typed not in SELECTION_MODES:
            raise errors.InvalidParameterValue(
                f"invalid value for {OPTION_PREFIX}selection: {value!r}",
                hint="use 'auto', 'units' (a noisy count of each group's units) or 'rows' "
                     "(the query's released COUNT(*))")
        if key == "min_units_per_group":
            if typed != int(typed):
                raise errors.InvalidParameterValue(
                    f"{OPTION_PREFIX}min_units_per_group must be a whole number, got {value!r}")
            typed = int(typed)
        self.options = replace(self.options, **{key: typed})

    def show_option(self, key: str) -> str:
        if key == "split":
            return format_split(self.options.split)
        return str(getattr(self.options, key))

    # execution ------------------------------------------------------------------------------
    def execute(self, sql: str, params: Parameters = None) -> Result:
        """Run one statement string; with several (session statements around at most one
        query), return the last statement's result."""
        try:
            return self._execute(sql, params)
        except RecursionError:
            # the shape of the query, never its data, decides this (PostgreSQL: 54001)
            exc = _too_deep()
            self._audit(sql, "rejected", exc)
            raise exc from None

    def _execute(self, sql: str, params: Parameters) -> Result:
        # the analyst's grants and role as the engine holds them now (`refresh_analysts`);
        # one removed from the policy runs nothing more (the server ends its connections)
        current = self.engine.policy.analysts.get(self.analyst.name)
        if current is None:
            raise errors.InvalidAuthorization(
                f"analyst \"{self.analyst.name}\" was removed from the policy",
                hint="ask an admin to add the analyst again")
        if current is not self.analyst:
            self.analyst = current
        try:
            # a query is bound only if its parameters do not fill a known shape's slots
            statements = parse_statements(sql, params, bind=not SHAPE_CACHE)
            queries = [s for s in statements if not s.is_session_statement]
            if len(statements) > 1 and len(queries) > 1:
                raise errors.NotSupportedError(
                    "several queries in one string are not supported",
                    hint="send one query at a time; each is charged separately")
        except errors.Error as exc:
            self._audit(sql, "rejected", exc)
            raise
        result = Result()
        for statement in statements:
            result = self._execute_one(statement)
        return result

    def describe(self, sql: str, params: Parameters = None) -> Description:
        """Columns and types the last statement of `sql` would return; runs and charges
        nothing. Raises the same rejection `execute` would for a query."""
        try:
            return self._describe(sql, params)
        except RecursionError:
            raise _too_deep() from None

    def _describe(self, sql: str, params: Parameters) -> Description:
        statement = parse_statements(sql, params)[-1]
        if statement.kind == "explain":
            return Description(("QUERY PLAN",), (statement.explain_format,))
        if statement.kind == "select":
            planned = self._plan(statement)
            analysis = planned if isinstance(planned, ConstantQuery) else planned.analysis
            return Description(tuple(o.name for o in analysis.outputs), analysis.output_types)
        if statement.kind == "show":
            name = statement.name or ""
            if name == f"{OPTION_PREFIX}budget":
                return Description(BUDGET_COLUMNS, BUDGET_TYPES)
            if name == "all":
                return Description(("name", "setting"), ("text", "text"))
            return Description((name,), ("text",))
        if statement.kind == "noop" and statement.ast is not None:
            return Description(("pg_advisory_unlock_all",), ("text",))
        return Description((), ())

    def _execute_one(self, statement: Statement) -> Result:
        try:
            if statement.kind == "select":
                return self._query(statement)
            statement = bound(statement)
            if statement.kind == "explain":
                return self._explain(statement)
            result = self._session_statement(statement)
            self._audit(statement.text, "answered", rows=len(result.rows))
            return result
        except errors.Error as exc:
            if not exc.audited:  # a charged failure was recorded with its charge
                outcome = "failed" if isinstance(exc, errors.BackendError) else "rejected"
                self._audit(statement.text, outcome, exc)
            raise

    def _audit(self, text: str, outcome: str, exc: errors.Error | None = None, **extra: Any
               ) -> None:
        self.engine.audit.write(AuditRecord(
            analyst=self.analyst.name, statement=text, outcome=outcome,
            sqlstate=exc.sqlstate if exc else None, **extra))

    def _accounts(self, analysis: Analysis) -> list[str]:
        accounts = [analyst_account(self.analyst.name)]
        if analysis.table.total_budget is not None:
            accounts.append(table_account(analysis.table.name))
        return accounts

    def _plan(self, statement: Statement) -> QueryPlan | ConstantQuery:
        assert statement.ast is not None
        analysis = analyze(statement.ast, self.engine.policy, self.analyst)
        if isinstance(analysis, ConstantQuery):
            return analysis
        if self.analyst.budget is None:
            raise errors.PrivacyViolation(f"analyst {self.analyst.name} has no privacy budget")
        return plan_query(analysis, self.options)

    def _shaped_plan(self, statement: Statement
                     ) -> tuple[QueryPlan | ConstantQuery, tuple[Rewritten, tuple[object, ...]]
                                | None]:
        """The plan, and for a query of a cached shape (`dpproxy.shapes`) its backend
        statement with the slots' values: a query differing from an accepted one only in
        WHERE literals whose value changes neither acceptance nor sensitivity reuses its
        analysis and rewrite. Anything else is planned as by `_plan`."""
        ast = statement.ast
        if not SHAPE_CACHE or not isinstance(ast, exp.Select) or self.analyst.budget is None:
            return self._plan(statement), None
        # Marked in place (the statement's bound tree is its own copy) and, when the tree
        # can be bound afresh from its template, printed without a copy: the print may
        # rewrite it, but a query of a cached shape is done with its tree, and any other
        # is analysed on a new binding.
        rebind = statement.template is not None
        shape = lift(ast, copy=not rebind)
        hit = self._of_shape(statement, shape)
        if hit is not None:
            self._remember_template(statement, shape)
            return hit
        values = tuple(parameter_value(v) for v in shape.values)
        if rebind:
            assert statement.template is not None
            statement = replace(statement, ast=bind_statement(statement))
            ast = statement.ast
            assert isinstance(ast, exp.Select)
            shape = lift(ast)
        planned = self._plan(statement)  # the slots are literals to the analyzer
        if isinstance(planned, QueryPlan) and planned.reads_data \
                and intact(planned.analysis.where, shape.values, planned.analysis.table):
            rewritten = rewrite(planned, self.engine.backend.dialect)
            try:  # generated now, before any charge: each statement holds every slot
                for form in (rewritten, rewritten.unbounded):
                    if form is not None:
                        form.sql  # noqa: B018 (generated on first use)
                if rewritten.unbounded is not None:
                    rewritten.unbounded.late_sql  # noqa: B018
            except ValueError:
                pass
            else:
                if rewritten.slots == len(values):
                    self.engine.remember_shape(self.analyst.name, shape.key,
                                               planned.analysis, rewritten)
                    self._remember_template(statement, shape)
                    return planned, (rewritten, values)
        unlift(ast)  # not a cacheable shape: planned with its literals as they are
        return self._plan(statement), None

    def _of_shape(self, statement: Statement, shape: Shape
                  ) -> tuple[QueryPlan, tuple[Rewritten, tuple[object, ...]]] | None:
        """The plan and backend statement of a query of an accepted shape; None if the shape
        is not cached (or the options now select groups otherwise)."""
        # printed with the shape, so the answer cache's key needs no printing of its own
        self._printed = (statement, shape.normalized)
        self.engine.remember_normalized(statement, shape.normalized)
        cached = self.engine.shape(self.analyst.name, shape.key)
        if cached is None:
            return None
        analysis, rewritten = cached
        granted = self.analyst.tables
        if analysis.table.name not in granted or any(j.table.name not in granted
                                                     for j in analysis.joins):
            # a shape accepted before a grant was revoked (refresh_analysts drops them, but
            # a query analysed meanwhile may store one after): analysed again, and refused
            return None
        # Everything but the WHERE literals (which the statement carries as parameters)
        # and the text is the shape's, accepted for every value of them.
        plan = plan_query(replace(analysis, statement=shape.text), self.options)
        # (the options may since select groups otherwise, needing another statement: then
        # planned as a miss)
        if rewritten.unit_counts != plan.counts_units:
            return None
        return plan, (rewritten, tuple(parameter_value(v) for v in shape.values))

    def _remember_template(self, statement: Statement, shape: Shape) -> None:
        """For a text bound because no template of it took its parameters: whether they
        all land in the slots of `shape` (a text without parameters: always), so that
        later executions with parameters of the same kind need no binding or printing."""
        params = statement.params or ()
        if statement.template is None or isinstance(params, Mapping) \
                or statement.clock is not None:
            return
        known = self.engine.templates(statement.text)
        if len(known) >= TEMPLATES_PER_TEXT \
                or any(t.shape_for(params) is not None for t in known):
            return
        template = TemplateShape.of(shape, placeholder_count(statement.template))
        if template is not None:
            self.engine.remember_template(statement.text, template)

    def _templated(self, statement: Statement
                   ) -> tuple[QueryPlan, tuple[Rewritten, tuple[object, ...]]] | None:
        """An unbound query (`parse_statements(..., bind=False)`) whose text's parameters
        (if any) all land in slots of an accepted shape: its plan and backend statement,
        from the parameters alone. The shape's key and texts are those binding and `lift` would
        give (`TemplateShape.shape_for`), so this is `_shaped_plan`'s hit, without the
        tree."""
        params = statement.params or ()
        if self.analyst.budget is None or isinstance(params, Mapping) \
                or statement.clock is not None:  # its shape's literals come from the clock
            return None
        for template in self.engine.templates(statement.text):
            shape = template.shape_for(params)
            if shape is not None:
                return self._of_shape(statement, shape)
        return None

    def _query(self, statement: Statement) -> Result:
        # A repeat of a text accepted before is answered before analysis: only an accepted,
        # charged query has a stored answer, and its key fixes everything the answer depends
        # on (query, options, policy version, data, accounting), so analysing it again could
        # change nothing. (An equivalent text never seen, e.g. MEDIAN(x) after
        # PERCENTILE_CONT(0.5) …, is analysed first: its columns need its own names.)
        names = self.engine.output_names(statement, self.analyst.tables) \
            if FAST_REPEATS else None
        key = None
        if names is not None:  # unbound or not: the key needs no tree for a text seen before
            key = self._cache_key(statement)
            cached = self._wait_for_answer(key)
            if cached is not None:
                return self._cached_result(statement.text, cached, names)
        templated = None
        if statement.ast is None:  # unbound: parameters that fill a known shape need no tree
            templated = self._templated(statement)
            if templated is None:
                statement = bound(statement)
        planned, shaped = templated or self._shaped_plan(statement)
        if isinstance(planned, ConstantQuery):
            row = tuple(evaluate(o.expression, {}, {}) for o in planned.outputs)
            self._audit(planned.statement, "answered", rows=1)
            return Result(tuple(o.name for o in planned.outputs), [row], "SELECT 1",
                          planned.output_types, accuracy=tuple(None for _ in row),
                          intervals=[tuple(None for _ in row)])
        plan = planned
        self._check_result_rows(plan.analysis)
        names = tuple(o.name for o in plan.analysis.outputs)
        self.engine.remember_output_names(statement, names, frozenset(
            [plan.analysis.table.name, *(j.table.name for j in plan.analysis.joins)]))
        if not plan.reads_data:  # public keys only: nothing private is read, nothing charged
            released = release(plan, [])
            self._audit(plan.analysis.statement, "released", rows=len(released.rows))
            return self._result(released, plan, self.remaining())
        key = key or self._cache_key(statement)
        for round_ in range(2):  # a second round only when a claim was abandoned under us
            # No lookup first: the charge checks the claim before anything else, in its own
            # transaction, and raises AnswerAvailable (charging nothing) for a stored or
            # pending answer, so a new query pays for one ledger transaction, not two.
            cached = self._wait_for_answer(key) if round_ else None
            if cached is not None:
                return self._cached_result(plan.analysis.statement, cached, names)
            try:
                return self._charge_and_release(plan, key, shaped)
            except AnswerAvailable as hit:
                if hit.answer is not None:
                    return self._cached_result(plan.analysis.statement, hit.answer, names)
        raise errors.OperationalError(
            "an identical query by the same analyst is still being answered",
            hint="retry in a moment: repeats of a query return its first answer")

    def _check_result_rows(self, analysis: Analysis) -> None:
        """Refuse, for free, a query whose groups are all public and more than the result
        may have rows (HAVING can only remove some, LIMIT caps them)."""
        if self.max_result_rows is None or any(k.values is None for k in analysis.keys):
            return
        rows = math.prod(len(k.values or ()) for k in analysis.keys)
        rows = max(0, rows - analysis.offset)
        if analysis.limit is not None:
            rows = min(rows, analysis.limit)
        if rows > self.max_result_rows:
            raise errors.ProgramLimitExceeded(
                f"the result would have up to {rows} rows, more than this server allows "
                f"({self.max_result_rows}); nothing was charged",
                hint="add LIMIT, or raise server.max_result_rows in the policy")

    def _charge_and_release(self, plan: QueryPlan, key: str,
                            shaped: tuple[Rewritten, tuple[object, ...]] | None = None
                            ) -> Result:
        analysis = plan.analysis
        rewritten, values = shaped if shaped is not None else (self.engine.rewritten(plan), ())
        self.engine.check_patterns(analysis)
        self.engine.check_plans(rewritten, values)
        # Charge first, durably, claiming the cache key in the same transaction: a failure
        # after this point may depend on the data, so it is paid for like a release.
        charge = self.engine.ledger.charge(self._accounts(analysis), plan.loss,
                                           analyst=self.analyst.name,
                                           statement=analysis.statement, claim=key)
        try:
            unbounded = rewritten.unbounded if self.engine.policy.privacy.verify_bounds \
                else None
            exact_rows = self.engine.backend.run_aggregate(
                rewritten.sql, rewritten.parameters(values), unbounded=unbounded)
        except errors.Error as exc:
            self.engine.ledger.drop_claim(self.analyst.name, key, charge.charge_id)
            self._audit(analysis.statement, "failed", exc, epsilon=plan.cost.epsilon,
                        delta=plan.cost.delta, charge_id=charge.charge_id)
            exc.audited = True
            raise
        try:
            released = release(plan, exact_rows)
            del exact_rows
            # the analyst's budget as this charge left it, read in the charge's transaction
            after = charge.status(analyst_account(self.analyst.name))
            result = self._result(released, plan,
                                  after.remaining if after is not None else self.remaining())
        except Exception as exc:  # a fault of ours: charged, and a repeat is charged again
            self.engine.ledger.drop_claim(self.analyst.name, key, charge.charge_id)
            _log.exception("releasing a charged query failed")
            failure = errors.InternalError(
                "the query was charged but its answer could not be released",
                hint="this is a fault of dpproxy: please report the query")
            self._audit(analysis.statement, "failed", failure, epsilon=plan.cost.epsilon,
                        delta=plan.cost.delta, charge_id=charge.charge_id)
            failure.audited = True
            raise failure from exc
        # Stored before it is returned: a repeat can only ever see this answer.
        self.engine.ledger.store_answer(self.analyst.name, key, charge.charge_id,
                                        _answer_json(result))
        self._last_loss = plan.loss
        self._audit(analysis.statement, "released", epsilon=plan.cost.epsilon,
                    delta=plan.cost.delta, rows=len(released.rows), charge_id=charge.charge_id)
        return result

    def _cache_key(self, statement: Statement) -> str:
        """Same normalized query, options, policy version and data: same key."""
        # The key hashes json.dumps([query, options, version, data, accounting],
        # sort_keys=True); all but the query are printed once per options and data version.
        data = self.engine.backend.data_version()
        printed = self._key_parts
        if printed is None or printed[0] is not self.options or printed[1] != data:
            rest = [asdict(self.options), self.engine.policy.version, data,
                    self.engine.ledger.accounting]
            printed = self._key_parts = (self.options, data,
                                         json.dumps(rest, sort_keys=True)[1:])
        shaped = self._printed
        query = shaped[1] if shaped is not None and shaped[0] is statement \
            else self.engine.normalized_query(statement)
        text = f"[{json.dumps(query)}, {printed[2]}"
        return hashlib.sha256(text.encode()).hexdigest()

    def _wait_for_answer(self, key: str) -> CachedAnswer | None:
        """The stored answer, with the analyst's budget status read along; waits while
        another session is computing it."""
        deadline = time.monotonic() + CACHE_WAIT_S
        while True:
            cached = self.engine.ledger.lookup_answer(
                self.analyst.name, key, status_of=analyst_account(self.analyst.name))
            if cached is None:
                return None
            if cached.answer is not None:
                return cached
            if time.monotonic() > deadline:
                raise errors.OperationalError(
                    "an identical query by the same analyst is still being answered",
                    hint="retry in a moment: repeats of a query return its first answer")
            time.sleep(0.02)

    def _cached_result(self, statement: str, answer: str | CachedAnswer,
                       names: tuple[str, ...]) -> Result:
        stored = answer if isinstance(answer, CachedAnswer) else None
        text = answer if isinstance(answer, str) else answer.answer
        assert text is not None
        result = _result_from_json(text)
        # Output names are not part of what an answer measures: name the columns as this
        # query does (the stored answer carries the names of the query that paid for it).
        result.columns = names
        result.cost = None
        result.remaining = stored.status.remaining \
            if stored is not None and stored.status is not None else self.remaining()
        result.notices = [*(a.describe() for a in result.accuracy if a is not None),
                          "repeated query: its first answer, at no further cost",
                          f"budget left: ε={result.remaining.epsilon:.6g}, "
                          f"δ={result.remaining.delta:.3g}"]
        self._audit(statement, "cached", rows=len(result.rows))
        return result

    def _result(self, released: Released, plan: QueryPlan, remaining: Cost) -> Result:
        notices = [a.describe() for a in released.accuracy if a is not None]
        notices.append(f"budget left: ε={remaining.epsilon:.6g}, δ={remaining.delta:.3g}")
        return Result(released.columns, released.rows, f"SELECT {len(released.rows)}",
                      plan.analysis.output_types, released.accuracy, released.intervals,
                      plan.cost if plan.reads_data else None, remaining, notices)

    def remaining(self) -> Cost:
        return self.budget_status().remaining

    def budget_status(self) -> AccountStatus:
        return self.engine.ledger.status(analyst_account(self.analyst.name))

    def _explain(self, statement: Statement) -> Result:
        planned = self._plan(statement)
        if isinstance(planned, ConstantQuery):
            lines = ["Constant query: reads no data, costs nothing"]
        else:
            from .explain import explain_lines

            sql = self.engine.rewritten(planned).sql if planned.reads_data else None
            lines = explain_lines(planned, sql, self.remaining())
        self._audit(statement.text, "answered", rows=len(lines))
        if statement.explain_format == "json":
            # PostgreSQL's shape (a list of one object holding "Plan") so that plan viewers
            # read it; the DP plan's lines as they are, under a key of their own
            table = None if isinstance(planned, ConstantQuery) else planned.analysis.table.name
            document = [{"Plan": {"Node Type": "DP Query", "Relation Name": table},
                         "DP Plan": lines}]
            return Result(("QUERY PLAN",), [(json.dumps(document, ensure_ascii=False),)],
                          "EXPLAIN", ("json",))
        return Result(("QUERY PLAN",), [(line,) for line in lines], "EXPLAIN", ("text",))

    def _session_statement(self, statement: Statement) -> Result:
        if statement.kind == "set":
            if statement.name and statement.name.startswith(OPTION_PREFIX):
                self.set_option(statement.name, statement.value)
            elif statement.name:
                self.client_settings[statement.name] = str(statement.value)
            return Result(tag="SET")
        if statement.kind == "reset":
            name = statement.name or "all"
            if name == "all":
                self.options = self._defaults
                self.client_settings.clear()
            elif name.startswith(OPTION_PREFIX):
                key = name.removeprefix(OPTION_PREFIX)
                self.set_option(key, getattr(self._defaults, key))
            else:
                self.client_settings.pop(name, None)
            return Result(tag="RESET")
        if statement.kind == "show":
            return self._show(statement.name or "")
        if statement.kind == "noop" and statement.ast is not None:
            # SELECT pg_advisory_unlock_all(), sent by connection pools
            return Result(("pg_advisory_unlock_all",), [(None,)], "SELECT 1", ("text",))
        return Result(tag=statement.tag)

    def _show(self, name: str) -> Result:
        if name == f"{OPTION_PREFIX}budget":
            rows = []
            for account in [analyst_account(self.analyst.name)] + [
                    table_account(t) for t in self.analyst.tables
                    if self.engine.policy.tables[t].total_budget is not None]:
                s = self.engine.ledger.status(account)
                left = (self.engine.ledger.affordable(account, self._last_loss)
                        if self._last_loss is not None else None)
                rows.append((account, s.budget.epsilon, s.spent.epsilon, s.remaining.epsilon,
                             s.budget.delta, s.spent.delta, s.remaining.delta, left))
            return Result(BUDGET_COLUMNS, rows, f"SELECT {len(rows)}", BUDGET_TYPES)
        if name.startswith(OPTION_PREFIX) and name.removeprefix(OPTION_PREFIX) in OPTIONS:
            return Result((name,), [(self.show_option(name.removeprefix(OPTION_PREFIX)),)],
                          "SHOW", ("text",))
        if name == "all":
            rows = [(f"{OPTION_PREFIX}{k}", self.show_option(k)) for k in OPTIONS]
            rows += sorted(self.client_settings.items())
            return Result(("name", "setting"), rows, "SHOW", ("text", "text"))
        if name in self.client_settings:
            return Result((name,), [(self.client_settings[name],)], "SHOW", ("text",))
        raise errors.UndefinedObject(f"unrecognized configuration parameter \"{name}\"",
                                     hint=f"dpproxy options: "
                                          f"{', '.join(OPTION_PREFIX + k for k in OPTIONS)}, "
                                          f"{OPTION_PREFIX}budget")
