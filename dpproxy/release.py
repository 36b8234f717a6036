"""Release: noise every measurement, combine into the analyst's values, post-process.

Input is the backend's exact per-group statistics; output is only noisy
values, public keys and what follows from them. Every public key is released,
zeros included, in the policy's order (so the row order says nothing about
the data); HAVING, ORDER BY and LIMIT then run on the noisy values only.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from .analyze import AggregateCall, Analysis, GroupKey, Output
from .analyze.aggregates import combine, interval
from .analyze.keys import normalize_key
from .mechanisms import NoiseSpec, half_width, release_many
from .plan import Measurement, QueryPlan
from .postprocess import Value, evaluate
from .quantiles import decode_histogram, rank_error, release_quantile
from .selection import SelectionSpec, effective_threshold

Interval = tuple[float, float]


@dataclass(frozen=True)
class ColumnAccuracy:
    """How one output column was made private, and how far off it may be."""

    name: str
    aggregate: str  # the aggregate as written, e.g. "AVG(age)"
    mechanism: str
    # Laplace b or Gaussian σ of each underlying statistic; for a quantile, 1/a in rows of
    # rank (P(bin) ∝ exp(−distance/scale), see dpproxy.quantiles)
    noise_scales: tuple[float, ...]
    epsilon: float
    delta: float
    confidence: float
    half_width: float | None  # None when the interval depends on the row (AVG)
    # Quantiles (exponential mechanism): the released value's rank is within this many rows
    # of p·n at the confidence level; they have no value interval (see dpproxy.quantiles)
    rank_error: float | None = None

    def describe(self) -> str:
        if self.rank_error is not None:
            spread = f"rank within ± {self.rank_error:.4g} rows of p·n"
        else:
            spread = (f"± {self.half_width:.4g}" if self.half_width is not None
                      else "interval per row")
        return (f"{self.name}: {self.mechanism}, scale "
                f"{', '.join(f'{s:.4g}' for s in self.noise_scales)}, ε={self.epsilon:.4g}"
                f"{f', δ={self.delta:.3g}' if self.delta else ''}; "
                f"{self.confidence:.0%} {spread}")


@dataclass(frozen=True)
class Released:
    columns: tuple[str, ...]
    rows: list[tuple[Value, ...]]
    accuracy: tuple[ColumnAccuracy | None, ...]  # per column; None for keys and derived values
    intervals: list[tuple[Interval | None, ...]]  # per row and column, at plan confidence


def _normalize_key(value: object, key: GroupKey) -> object:
    if key.expression is not None:  # DOUBLE or NUMERIC whole numbers, midnight TIMESTAMPs
        return normalize_key(value, key.column.type)
    if isinstance(value, dt.date):
        return value.isoformat()
    if key.column.type == "float" and value is not None:
        return float(value)  # type: ignore[arg-type]
    return value


def _exact_by_group(analysis: Analysis, rows: Sequence[tuple[object, ...]], key_count: int
                    ) -> dict[tuple[object, ...], tuple[float, ...]]:
    by_group: dict[tuple[object, ...], tuple[float, ...]] = {}
    for row in rows:
        key = tuple(_normalize_key(v, k) for v, k in zip(row[:key_count], analysis.keys,
                                                          strict=True))
        # a quantile's column holds its (bin, rows) pairs: kept as they are for the mechanism
        by_group[key] = tuple(v if isinstance(v, list) else float(v) if v is not None else 0.0
                              for v in row[key_count:])  # type: ignore[misc]
    return by_group


def release(plan: QueryPlan, rows: Sequence[tuple[object, ...]]) -> Released:
    """Noisy rows for the plan's outputs from the backend's exact per-group rows."""
    analysis = plan.analysis
    exact = _exact_by_group(analysis, rows, len(analysis.keys))
    selection = plan.selection
    drawn: dict[int, Sequence[float]] = {}  # measurements noised already, to select groups
    if selection is None:
        groups = [tuple(g) for g in itertools.product(*(k.values or () for k in analysis.keys))]
    elif selection.measurement is None:
        groups = _select_groups(selection, exact)
    else:
        groups, drawn[selection.measurement] = _select_by_count(selection, exact)
    zeros = tuple(0.0 for _ in plan.measurements)

    # One vector per measurement over all groups: the noise spec covers the whole vector.
    noisy_by_measurement = [
        drawn[i] if i in drawn
        else _quantiles([exact.get(g, zeros)[i] for g in groups], m) if m.quantile is not None
        else _noised([_finite(exact.get(g, zeros)[i]) for g in groups], m.noise)
        for i, m in enumerate(plan.measurements)
    ]
    level_half = [_half_widths(agg, plan) for agg in analysis.aggregates]

    table_rows: list[dict[str, Value]] = []
    table_intervals: list[dict[str, Interval]] = []
    keys_of_rows: list[dict[str, Value]] = []
    for gi, group in enumerate(groups):
        values: dict[str, Value] = {}
        intervals: dict[str, Interval] = {}
        for agg, halves in zip(analysis.aggregates, level_half, strict=True):
            stats = [analysis.statistics[i] for i in agg.statistics]
            released = [float(noisy_by_measurement[i][gi]) for i in agg.statistics]
            value = combine(agg.rule, released, stats)
            if agg.rule.integer_result(stats):
                value = round(value)
            values[agg.sql] = value
            if not agg.rule.exponential:  # quantiles have none (see dpproxy.quantiles)
                intervals[agg.sql] = interval(agg.rule, released, halves, stats)
        table_rows.append(values)
        table_intervals.append(intervals)
        keys_of_rows.append({k.name: v for k, v in zip(analysis.keys, group, strict=True)})

    selected = [i for i, (values, keys) in enumerate(zip(table_rows, keys_of_rows, strict=True))
                if analysis.having is None
                or evaluate(analysis.having, values, keys) is True]
    if analysis.order:
        selected.sort(key=functools.cmp_to_key(
            lambda a, b: _compare_rows(analysis, table_rows, keys_of_rows, a, b)))
    end = None if analysis.limit is None else analysis.offset + analysis.limit
    selected = selected[analysis.offset:end]

    out_rows = [tuple(evaluate(o.expression, table_rows[i], keys_of_rows[i])
                      for o in analysis.outputs) for i in selected]
    out_intervals = [tuple(_output_interval(o, analysis, table_intervals[i])
                           for o in analysis.outputs) for i in selected]
    return Released(tuple(o.name for o in analysis.outputs), out_rows,
                    tuple(_accuracy(o, plan) for o in analysis.outputs), out_intervals)


def _quantiles(histograms: list[object], measurement: Measurement) -> list[float]:
    """One exponential-mechanism draw per group, each from its own histogram (a group
    absent from the backend's answer has none: every bin is then equally likely)."""
    spec = measurement.quantile
    assert spec is not None
    return [release_quantile(spec, decode_histogram(
        h if isinstance(h, list) else None, spec.binning.bins)) for h in histograms]


def _noised(values: list[float], noise: NoiseSpec | None) -> Sequence[float]:
    # an exact statistic (local-DP reports, public membership) is released as computed
    return values if noise is None else release_many(values, noise)


def _half_widths(agg: AggregateCall, plan: QueryPlan) -> list[float]:
    """Half-widths of an aggregate's statistics at a level such that its interval holds
    jointly over every source of error (Bonferroni): each noised statistic and, for a
    local-DP rule, the sampling error of the randomized reports, whose entry (appended) is
    the standard normal quantile at that level."""
    noises = [plan.measurements[i].noise for i in agg.statistics]
    sources = sum(n is not None for n in noises) + (1 if agg.rule.local_sampling else 0)
    level = 1 - (1 - plan.options.confidence) / max(sources, 1)
    halves = [half_width(n, level) if n is not None else 0.0 for n in noises]
    if agg.rule.local_sampling:
        halves.append(NormalDist().inv_cdf(0.5 + level / 2))
    return halves


def _select_groups(selection: SelectionSpec, exact: dict[tuple[object, ...], tuple[float, ...]]
                   ) -> list[tuple[object, ...]]:
    """Groups whose noisy count of distinct units reaches the threshold, in key order.

    The unit count is the last column of the backend's row. Sorting by key keeps the
    backend's (data-dependent) row order out of the answer.
    """
    candidates = list(exact)
    counts = [_finite(exact[g][-1]) for g in candidates]
    noisy = release_many(counts, selection.noise)
    threshold = effective_threshold(selection)
    kept = [g for g, n in zip(candidates, noisy, strict=True) if n >= threshold]
    return sorted(kept, key=_key_order)


def _select_by_count(selection: SelectionSpec,
                     exact: dict[tuple[object, ...], tuple[float, ...]]
                     ) -> tuple[list[tuple[object, ...]], list[float]]:
    """Groups whose released noisy COUNT(*) reaches the threshold, in key order, with those
    noisy counts: the very draws that are released, so the count costs its share once."""
    index = selection.measurement
    assert index is not None
    candidates = list(exact)
    noisy = release_many([_finite(exact[g][index]) for g in candidates], selection.noise)
    threshold = effective_threshold(selection)
    kept = sorted(((g, n) for g, n in zip(candidates, noisy, strict=True) if n >= threshold),
                  key=lambda pair: _key_order(pair[0]))
    return [g for g, _ in kept], [n for _, n in kept]


def _key_order(group: tuple[object, ...]) -> tuple[tuple[bool, str, object], ...]:
    # NULL keys last; values of one column share a type, so they compare among themselves
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in group)


def _finite(value: float) -> float:
    # Clamped sums are finite; this guards the sampler against a backend oddity.
    return value if math.isfinite(value) else 0.0


def _output_interval(output: Output, analysis: Analysis, intervals: dict[str, Interval]
                     ) -> Interval | None:
    if output.aggregate is None:
        return None
    return intervals.get(analysis.aggregates[output.aggregate].sql)


def _accuracy(output: Output, plan: QueryPlan) -> ColumnAccuracy | None:
    if output.aggregate is None:
        return None
    agg = plan.analysis.aggregates[output.aggregate]
    measurements = [plan.measurements[i] for i in agg.statistics]
    quantile = measurements[0].quantile
    if quantile is not None:
        return ColumnAccuracy(
            name=output.name, aggregate=agg.sql, mechanism="exponential",
            noise_scales=(1 / float(quantile.rate),), epsilon=quantile.epsilon, delta=0.0,
            confidence=plan.options.confidence, half_width=None,
            rank_error=rank_error(quantile, plan.options.confidence))
    noises = [m.noise for m in measurements if m.noise is not None]
    # local-DP aggregates name their randomization, and the central noise if there is any
    mechanism = " + ".join([*([agg.rule.mechanism] if agg.rule.mechanism else []),
                            *sorted({n.mechanism for n in noises})])
    return ColumnAccuracy(
        name=output.name, aggregate=agg.sql, mechanism=mechanism,
        noise_scales=tuple(m.noise.scale if m.noise is not None else 0.0
                           for m in measurements),
        epsilon=sum(n.epsilon for n in noises),
        delta=sum(n.delta for n in noises),
        confidence=plan.options.confidence,
        half_width=measurements[0].half_width if len(measurements) == 1 else None)


def _compare_rows(analysis: Analysis, rows: list[dict[str, Value]],
                  keys: list[dict[str, Value]], a: int, b: int) -> int:
    for item in analysis.order:
        va = evaluate(item.expression, rows[a], keys[a])
        vb = evaluate(item.expression, rows[b], keys[b])
        if va == vb:
            continue
        if va is None or vb is None:
            return (-1 if va is None else 1) * (1 if item.nulls_first else -1)
        less = va < vb if type(va) is type(vb) or not isinstance(va, str) else str(va) < str(vb)
        result = -1 if less else 1
        return -result if item.descending else result
    return a - b  # stable: the policy's key order
