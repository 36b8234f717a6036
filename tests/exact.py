"""The test hook for exact, pre-noise aggregates: plan a query as an analyst and run its
rewritten statement on a backend, as `session` does before release. Tests only: neither the
DB-API nor the wire server can reach the exact statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import duckdb
import psycopg

from dpproxy.analyze import Analysis, analyze
from dpproxy.parse import parse_statements
from dpproxy.plan import QueryOptions, QueryPlan, plan_query
from dpproxy.policy import Policy
from dpproxy.rewrite import rewrite
from dpproxy.session import Engine


def plan_for(policy: Policy, sql: str, analyst: str = "alice") -> QueryPlan:
    """The plan of one SELECT at ε = 1, δ = 1e-6 under Laplace noise."""
    ast = parse_statements(sql)[0].ast
    assert ast is not None
    analysis = analyze(ast, policy, policy.analyst(analyst))
    assert isinstance(analysis, Analysis)
    return plan_query(analysis, QueryOptions(1.0, 1e-6, "laplace"))


def exact_rows(backend: Any, plan: QueryPlan, verify_bounds: bool = False
               ) -> dict[tuple[Any, ...], tuple[float, ...]]:
    """Per-group exact statistics of the rewritten statement (one fresh salt per call):
    keys → the plan's measurements, in order. `verify_bounds`: offer the backend the
    unbounded form, as the session does (`dpproxy.bounds`)."""
    rewritten = rewrite(plan, backend.dialect)
    rows = backend.run_aggregate(rewritten.sql, rewritten.parameters(),
                                 unbounded=rewritten.unbounded if verify_bounds else None)
    k = len(rewritten.key_columns)
    width = k + len(rewritten.measurement_columns)
    return {tuple(r[:k]): tuple(float(v) for v in as_released(plan, r)[k:width]) for r in rows}


def as_released(plan: QueryPlan, row: Sequence[Any]) -> tuple[Any, ...]:
    """A backend row (keys, then the plan's measurements, …) with each measurement as the
    number it stands for: a real-valued sum comes in fixed point, scaled by 2^-bits here
    as `release` does (`Statistic.fixed_point_bits`)."""
    keys = len(plan.analysis.keys)
    out = list(row)
    for i, measurement in enumerate(plan.measurements):
        bits = measurement.statistic.fixed_point_bits
        if bits is not None and out[keys + i] is not None:
            out[keys + i] = math.ldexp(float(out[keys + i]), -bits)
    return tuple(out)


def assert_within_bounds(plan: QueryPlan, got: dict[tuple[Any, ...], tuple[float, ...]],
                         without: dict[tuple[Any, ...], tuple[float, ...]], max_rows: int,
                         max_groups: int) -> list[dict[tuple[Any, ...], float]]:
    """`got` − `without` is one unit's bounded contribution: per measurement, its absolute
    sum over groups is at most the plan's L1 sensitivity, it touches at most `max_groups`
    groups, and a count moves each by 0 to `max_rows`. Returns the changes, per
    measurement, for further checks."""
    assert set(without) <= set(got)
    changes = []
    for index, measurement in enumerate(plan.measurements):
        change = {key: got[key][index] - without.get(key, (0.0,) * len(got[key]))[index]
                  for key in got}
        assert sum(abs(c) for c in change.values()) <= measurement.sensitivity + 1e-6
        assert sum(1 for c in change.values() if c) <= max_groups
        if measurement.statistic.kind in ("count", "count_distinct"):
            assert all(0 <= c <= max_rows for c in change.values())
        changes.append(change)
    return changes


def read_directly(engine: Engine, sql: str) -> list[tuple[Any, ...]]:
    """The noiseless answer of `sql` on the engine's own data, read from its backend
    directly (never through dpproxy), for checking released values against."""
    backend = engine.policy.backend
    if backend.kind == "postgres":
        assert backend.dsn is not None
        with psycopg.connect(backend.dsn) as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]
    with duckdb.connect(str(backend.path), read_only=True) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]
