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
import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import TypeVar

import numpy as np
from sqlglot import exp

from .analyze import AggregateCall, Analysis, GroupKey, Output
from .analyze.aggregates import combine, interval
from .analyze.keys import normalize_key
from .clock import date_of_day
from .mechanisms import half_width, release_reaching, release_vectors
from .plan import Measurement, QueryPlan
from .postprocess import AggregateRef, Value, compare_values, evaluate, monotone_of
from .quantiles import decode_histogram, error_phrase, rank_error, release_quantile
from .selection import SelectionSpec, effective_threshold
from .windows import compute as compute_windows

Interval = tuple[float, float]
_T = TypeVar("_T")

_log = logging.getLogger(__name__)

# Private-key groups are selected column-wise where that gives exactly what the row-by-row
# path (the dict of groups) gives; tests switch this off to compare the two.
COLUMNAR = True


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
    mode: bool = False  # MODE: rank_error is of the released value's count, not its rank

    def describe(self) -> str:
        if self.rank_error is not None:
            spread = error_phrase(self.rank_error, self.mode)
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
        # + 0.0: -0.0 is 0.0 (both backends group them as one, keyed by either spelling,
        # which one row decides)
        return float(value) + 0.0  # type: ignore[arg-type]
    if key.column.type == "int" and isinstance(value, float):
        # an int column grouped as a double (`rewrite.released_key`): whole ones are ints
        return normalize_key(value, "int")
    return value


# Key values _normalize_key returns unchanged for a plain column of another type than float
_PLAIN_KEY_TYPES = frozenset({str, int, bool, type(None)})


def _key_column(values: Sequence[object], key: GroupKey,
                types: set[type] | None = None) -> Sequence[object]:
    """_normalize_key over one key column, skipped (`values` itself returned) when it would
    change nothing; `types`, when given, are those of the values."""
    if key.expression is None and key.column.type != "float" \
            and _PLAIN_KEY_TYPES.issuperset(types if types is not None else map(type, values)):
        return values
    return [_normalize_key(v, key) for v in values]


def _statistic_column(values: tuple[object, ...]) -> Sequence[object]:
    """A backend column as released: ints and floats as they are, other numbers (Decimal)
    as floats, NULL as 0.0; a quantile's (bin, rows) pairs are kept for the mechanism."""
    if _EXACT_NUMBER_TYPES.issuperset(map(type, values)):
        return values
    return [v if type(v) in _EXACT_NUMBER_TYPES or isinstance(v, list)
            else float(v) if v is not None else 0.0  # type: ignore[arg-type]
            for v in values]


# Numbers the noise and combination steps take as they are (bool is converted: it is not)
_EXACT_NUMBER_TYPES = frozenset({int, float})


def _exact_by_group(analysis: Analysis, rows: Sequence[tuple[object, ...]], key_count: int
                    ) -> dict[tuple[object, ...], tuple[float, ...]]:
    if not rows:
        return {}
    # column by column: one decision per column instead of one per value
    columns = list(zip(*rows, strict=True))
    keys = [_key_column(c, k) for c, k in zip(columns[:key_count], analysis.keys, strict=True)]
    stats = [_statistic_column(c) for c in columns[key_count:]]
    key_rows = zip(*keys, strict=True) if keys else itertools.repeat((), len(rows))
    stat_rows = zip(*stats, strict=True) if stats else itertools.repeat((), len(rows))
    # a later row with the same normalised key replaces an earlier one, as dict() does
    by_group = dict(zip(key_rows, stat_rows, strict=True))  # type: ignore[arg-type]
    if len(by_group) < len(rows):
        # the rewrite groups every key as it is released (`rewrite.released_key`): two rows
        # of one released key are a fault of it, which could let one unit replace a group;
        # logged (the query's keys, never a value) for the operator, not raised: after the
        # charge, an error here would tell the analyst something of the data
        _log.warning("two backend groups were released as one key (keys: %s); please "
                     "report this query's shape", ", ".join(k.name for k in analysis.keys))
    return by_group


def release(plan: QueryPlan, rows: Sequence[tuple[object, ...]]) -> Released:
    """Noisy rows for the plan's outputs from the backend's exact per-group rows."""
    analysis = plan.analysis
    selection = plan.selection
    drawn: dict[int, Sequence[float]] = {}  # measurements noised already, to select groups
    picked = _selected_columns(analysis, selection, rows) \
        if selection is not None and COLUMNAR else None
    if picked is not None:
        key_columns, counts, exact_column = picked
        group_count = len(counts)
    else:
        by_group = _exact_by_group(analysis, rows, len(analysis.keys))
        if selection is None:
            groups = [tuple(g)
                      for g in itertools.product(*(k.values or () for k in analysis.keys))]
        else:
            groups, counts = _selected(selection, by_group)
        zeros = tuple(0.0 for _ in plan.measurements)
        exact_rows = [by_group.get(g, zeros) for g in groups]
        group_count = len(groups)
        key_columns = [[g[j] for g in groups] for j in range(len(analysis.keys))]

        def exact_column(i: int) -> Sequence[object]:
            return [r[i] for r in exact_rows]
    if selection is not None and selection.measurement is not None:
        drawn[selection.measurement] = counts  # the released count itself

    # One vector per measurement over all groups: the noise spec covers the whole vector.
    # (The vectors are noised together: one batched draw is cheaper than one per vector.)
    noisy_by_measurement: list[Sequence[float]] = [
        drawn[i] if i in drawn
        else _quantiles(exact_column(i), m) if m.quantile is not None  # type: ignore[arg-type]
        else _finite_column(_from_fixed_point(exact_column(i),  # type: ignore[arg-type]
                                              m.statistic.fixed_point_bits))
        for i, m in enumerate(plan.measurements)
    ]
    # an exact statistic (local-DP reports, public membership) is released as computed
    noised = [(i, m.noise) for i, m in enumerate(plan.measurements)
              if i not in drawn and m.quantile is None and m.noise is not None]
    fresh = release_vectors([(noisy_by_measurement[i], noise) for i, noise in noised])
    for (i, _), noisy in zip(noised, fresh, strict=True):
        noisy_by_measurement[i] = noisy

    # Each aggregate's values and intervals, as columns over the groups.
    values_of: dict[str, list[Value]] = {}
    intervals_of: dict[str, list[Interval]] = {}
    for agg in analysis.aggregates:
        stats = [analysis.statistics[i] for i in agg.statistics]
        halves = _half_widths(agg, plan)
        integer = agg.rule.integer_result(stats)
        if agg.rule.releases_its_statistic:
            values, intervals_of[agg.sql] = _single_columns(
                noisy_by_measurement[agg.statistics[0]], halves[0],
                agg.rule.value_range(stats), integer)
        else:
            columns = [list(map(float, noisy_by_measurement[i])) for i in agg.statistics]
            released_rows = list(zip(*columns, strict=True))
            values = [combine(agg.rule, r, stats) for r in released_rows]
            if not agg.rule.exponential:  # quantiles have none (see dpproxy.quantiles)
                intervals_of[agg.sql] = [interval(agg.rule, r, halves, stats)
                                         for r in released_rows]
            if integer:
                values = _rounded(values)
        values_of[agg.sql] = values
        if agg.rule.labels is not None:  # MODE of public values: drawn as their positions
            labels = agg.rule.labels
            values_of[agg.sql] = [labels[int(v)] for v in values_of[agg.sql]]
        elif agg.rule.value_type == "date":  # day numbers; ISO text, as date keys
            values_of[agg.sql] = list(map(date_of_day, values_of[agg.sql]))
    key_names = [k.name for k in analysis.keys]
    keys_of = dict(zip(key_names, key_columns, strict=True))

    needs_rows = analysis.having is not None or bool(analysis.order) \
        or bool(analysis.windows) or not all(
        isinstance(o.expression, AggregateRef | exp.Column) for o in analysis.outputs)
    table_rows: list[dict[str, Value]] = []
    keys_of_rows: list[dict[str, Value]] = []
    if needs_rows:  # the evaluator reads rows as dicts
        table_rows = [dict(zip(values_of, r, strict=True))
                      for r in zip(*values_of.values(), strict=True)] \
            if values_of else [{} for _ in range(group_count)]
        keys_of_rows = [dict(zip(key_names, g, strict=True))
                        for g in zip(*key_columns, strict=True)] \
            if key_columns else [{} for _ in range(group_count)]

    selected = list(range(group_count))
    if analysis.having is not None:
        selected = [i for i in selected
                    if evaluate(analysis.having, table_rows[i], keys_of_rows[i]) is True]
    if analysis.windows:  # over the groups HAVING keeps, before ORDER BY and LIMIT
        compute_windows(analysis.windows, selected, table_rows, keys_of_rows)
    if analysis.order:
        selected.sort(key=functools.cmp_to_key(
            lambda a, b: _compare_rows(analysis, table_rows, keys_of_rows, a, b)))
    end = None if analysis.limit is None else analysis.offset + analysis.limit
    selected = selected[analysis.offset:end]

    # every group, in order (the usual case without HAVING, ORDER BY or LIMIT): the columns
    # are read whole
    every = not analysis.order and len(selected) == group_count
    out_columns = [_output_column(o, selected, values_of, keys_of, table_rows, keys_of_rows,
                                  every) for o in analysis.outputs]
    out_rows = list(zip(*out_columns, strict=True)) if out_columns else [() for _ in selected]
    interval_columns = [_output_intervals(o, analysis, intervals_of, selected, every,
                                          table_rows, keys_of_rows)
                        for o in analysis.outputs]
    out_intervals = list(zip(*interval_columns, strict=True)) if interval_columns \
        else [() for _ in selected]
    return Released(tuple(o.name for o in analysis.outputs), out_rows,
                    tuple(_accuracy(o, plan) for o in analysis.outputs), out_intervals)


def _single_columns(released: Sequence[float] | np.ndarray, half: float, bounds: Interval,
                    integer: bool = False) -> tuple[list[Value], list[Interval]]:
    """combine() and interval() of a one-statistic rule (COUNT, SUM: `releases_its_statistic`,
    the value is the released statistic, its interval that ± its half-width) for a whole
    column at once, the values `_rounded` where `integer`. The released numbers are read
    as float() reads them (numpy's conversion of an int is the same nearest double).
    _clip's min(max(v, low), high) is, for low <= high, "low if v < low, else high if
    v > high, else v" (NaN and signed zeros included), which is what the np.where below
    computes; v ± half is the same IEEE operation in numpy as in Python."""
    low, high = bounds
    if len(released) < _NUMPY_MIN:
        floats = list(map(float, released))
        clipped = [low if v < low else high if v > high else v for v in floats]
        return (_rounded(clipped) if integer else clipped,  # type: ignore[return-value]
                [(low if v - half < low else high if v - half > high else v - half,
                  low if v + half < low else high if v + half > high else v + half)
                 for v in floats])
    column = np.asarray(released, dtype=np.float64)

    def clip(a: np.ndarray) -> np.ndarray:
        return np.where(a < low, low, np.where(a > high, high, a))

    values = clip(column)
    return (_rounded(values) if integer else values.tolist(),
            list(zip(clip(column - half).tolist(), clip(column + half).tolist(), strict=True)))


# Below this many groups, numpy's per-call cost exceeds what it saves
_NUMPY_MIN = 32


def _rounded(values: Sequence[float] | np.ndarray) -> list[int]:
    """[round(v) for v in values]: half to even, as np.rint, while the ints fit in int64."""
    if len(values) < _NUMPY_MIN:
        return [round(v) for v in values]
    column = np.asarray(values, dtype=np.float64)
    if not (np.abs(column) < 2.0**62).all():  # infinities and NaN too: round() decides
        return [round(v) for v in column.tolist()]
    return np.rint(column).astype(np.int64).tolist()  # type: ignore[no-any-return]


def _output_column(output: Output, selected: list[int], values_of: dict[str, list[Value]],
                   keys_of: dict[str, list[Value]], rows: list[dict[str, Value]],
                   keys: list[dict[str, Value]], every: bool = False) -> list[Value]:
    """One output's values on the selected groups (`every`: they are all the groups, in
    order): what `evaluate` gives, read straight from the columns when the output is an
    aggregate or a key."""
    node = output.expression
    if isinstance(node, AggregateRef):
        return _at(values_of[node.this], selected, every)
    if isinstance(node, exp.Column):
        return _at(keys_of[node.name], selected, every)
    return [evaluate(node, rows[i], keys[i]) for i in selected]


def _output_intervals(output: Output, analysis: Analysis,
                      intervals_of: dict[str, list[Interval]], selected: list[int],
                      every: bool = False, rows: list[dict[str, Value]] | None = None,
                      keys: list[dict[str, Value]] | None = None) -> list[Interval | None]:
    if output.aggregate is not None:
        column = intervals_of.get(analysis.aggregates[output.aggregate].sql)
        if column is None:
            return [None] * len(selected)
        return _at(column, selected, every)  # type: ignore[arg-type]
    monotone = monotone_of(output.expression)
    column = intervals_of.get(monotone[0]) if monotone is not None else None
    if monotone is None or column is None or not rows or not keys:
        return [None] * len(selected)
    # a monotone function of one aggregate: its interval's ends mapped through it
    name, direction = monotone
    out: list[Interval | None] = []
    for i in selected:
        ends = [evaluate(output.expression, {**rows[i], name: end}, keys[i])
                for end in column[i][::direction]]
        out.append(None if None in ends else (ends[0], ends[1]))
    return out


def _at(column: list[_T], selected: list[int], every: bool) -> list[_T]:
    """column[i] for i in selected; `every`: that is the whole column."""
    return list(column) if every else [column[i] for i in selected]


def _quantiles(histograms: list[object], measurement: Measurement) -> list[float]:
    """One exponential-mechanism draw per group, each from its own histogram (a group
    absent from the backend's answer has none: every bin is then equally likely)."""
    spec = measurement.quantile
    assert spec is not None
    return [release_quantile(spec, decode_histogram(
        h if isinstance(h, list) else None, spec.binning.bins)) for h in histograms]


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


def _selected(selection: SelectionSpec, exact: dict[tuple[object, ...], tuple[float, ...]]
              ) -> tuple[list[tuple[object, ...]], list[float]]:
    """Groups whose noisy count reaches the threshold, in key order, with those noisy
    counts. The count is the backend row's last column (each group's units) when the
    selection counts units, else the measurement it names (the released COUNT(*), whose
    very draws are then released, so it costs its share once). Sorting by key keeps the
    backend's (data-dependent) row order out of the answer."""
    column = -1 if selection.measurement is None else selection.measurement
    candidates = list(exact)
    counts = _finite_column(list(map(operator.itemgetter(column), exact.values())))
    lanes, noisy = release_reaching(counts, selection.noise, effective_threshold(selection))
    kept = _key_sorted([(candidates[i], n)
                        for i, n in zip(lanes.tolist(), noisy.tolist(), strict=True)])
    return [g for g, _ in kept], [n for _, n in kept]


def _key_sorted(kept: list[tuple[tuple[object, ...], _T]]) -> list[tuple[tuple[object, ...], _T]]:
    """(group, anything) pairs of distinct groups sorted by group in _key_order (sorted in
    place and returned); the anything is never compared."""
    if not _plain_keys([g for g, _ in kept]):
        kept.sort(key=lambda pair: _key_order(pair[0]))
    elif kept and len(kept[0][0]) == 1:  # one key column: its values sort as the 1-tuples do
        kept.sort(key=lambda pair: pair[0][0])
    else:  # groups are distinct: the rest of the pair is never compared
        kept.sort(key=operator.itemgetter(0))
    return kept


def _selected_columns(analysis: Analysis, selection: SelectionSpec,
                      rows: Sequence[tuple[object, ...]]
                      ) -> tuple[list[list[object]], np.ndarray,
                                 Callable[[int], list[object]]] | None:
    """_selected and the exact statistics of the groups it keeps, as `release` reads them
    from _exact_by_group, computed column-wise: the kept groups' key columns, their noisy
    counts, and a function giving measurement i's exact values over them (read only for
    the measurements not drawn already). `release_reaching` picks the candidates and only
    the kept ones are read further. None where that would not be the very same (the
    caller then reads the rows): a few rows (not worth it), or two rows whose keys
    normalize to one group (the dict keeps the first one's place and the last one's
    statistics)."""
    key_count = len(analysis.keys)
    n = len(rows)
    if n < _NUMPY_MIN or key_count == 0:
        return None
    width = len(rows[0])
    raw = [list(map(operator.itemgetter(j), rows)) for j in range(key_count)]
    types = [set(map(type, c)) for c in raw]
    keys = [_key_column(c, k, t) for c, k, t in zip(raw, analysis.keys, types, strict=True)]
    distinct = len(set(keys[0])) if key_count == 1 else len(set(zip(*keys, strict=True)))
    if distinct != n:
        return None
    # the count each candidate is selected by: the last column (its units) or a measurement
    column = width - 1 if selection.measurement is None else key_count + selection.measurement
    counts = _count_values(list(map(operator.itemgetter(column), rows)))
    lanes, noisy = release_reaching(counts, selection.noise,  # type: ignore[arg-type]
                                    effective_threshold(selection))
    picked: list[int] = lanes.tolist()
    # the kept candidates in key order (as _selected sorts them: the same sort, on the same
    # groups in the same order, so ties, e.g. of NaN, fall alike); `order` places each
    kept = _take(keys[0], picked) if key_count == 1 else []
    if key_count == 1 and ((keys[0] is raw[0] and _one_type(types[0]))
                           or _plain_column(kept)):
        order = sorted(range(len(picked)), key=kept.__getitem__)
        key_columns = [_take(kept, order)]
    else:
        pairs = _key_sorted([(tuple(c[i] for c in keys), j) for j, i in enumerate(picked)])
        order = [j for _, j in pairs]
        key_columns = [list(c) for c in zip(*(g for g, _ in pairs), strict=True)] \
            if pairs else [[] for _ in keys]
    picked = _take(picked, order)

    def exact_column(i: int) -> list[object]:
        return _statistic_column(_take(rows, picked, key_count + i))  # type: ignore[return-value]

    return key_columns, noisy[np.array(order, dtype=np.intp)], exact_column


def _take(values: Sequence[_T], indices: list[int], field: int | None = None) -> list[_T]:
    """[values[i] for i in indices], or [values[i][field] …], by C-level itemgetters."""
    if len(indices) < 2:
        out = [values[i] for i in indices]
    else:
        out = list(operator.itemgetter(*indices)(values))
    return out if field is None else list(map(operator.itemgetter(field), out))


def _one_type(types: set[type]) -> bool:
    """_plain_column of every value whose types these are (so of any part of them)."""
    return len(types) == 1 and type(None) not in types


def _count_values(values: list[object]) -> Sequence[float]:
    """A backend column as _finite_column(_statistic_column(...)) reads it: the same
    numbers, as an array where numpy holds them exactly (ints within int64; floats, and
    ints mixed with them, below 2^53), else as that list."""
    try:
        array = np.array(values)
    except (OverflowError, ValueError):
        array = None
    if array is not None and array.ndim == 1:
        if array.dtype.kind == "i":
            return array  # type: ignore[no-any-return]
        if array.dtype.kind == "f" and (np.abs(array) < 2.0**53).all():  # all finite too
            return array  # type: ignore[no-any-return]
    return _finite_column(_statistic_column(values))  # type: ignore[arg-type]


def _plain_keys(groups: list[tuple[object, ...]]) -> bool:
    """Whether _key_order sorts these groups as their key tuples sort by themselves: so it
    does without NULLs and with one type per key column, as _key_order then only puts the
    same (False, type name) before each value of a column."""
    return all(map(_plain_column, zip(*groups, strict=True)))


def _plain_column(values: Sequence[object]) -> bool:
    """One type throughout, not NULL's (vacuously so without values)."""
    return not values or (len(set(map(type, values))) == 1
                          and type(values[0]) is not type(None))


def _key_order(group: tuple[object, ...]) -> tuple[tuple[bool, str, object], ...]:
    # NULL keys last; values of one column share a type, so they compare among themselves
    return tuple((v is None, type(v).__name__, v if v is not None else 0) for v in group)


def _finite(value: float) -> float:
    # Clamped sums are finite; this guards the sampler against a backend oddity.
    return value if math.isfinite(value) else 0.0


def _from_fixed_point(values: list[float], bits: int | None) -> list[float]:
    """A real-valued sum the backend computed in fixed point (`Statistic.fixed_point_bits`)
    as the number it stands for: the exact integer rounded once to a double, then scaled
    by 2^-bits (exactly: a power of two)."""
    if bits is None:
        return values
    return [math.ldexp(float(v), -bits) for v in values]


def _finite_column(values: list[float]) -> list[float]:
    return values if all(map(math.isfinite, values)) else [_finite(v) for v in values]


def _accuracy(output: Output, plan: QueryPlan) -> ColumnAccuracy | None:
    index = output.aggregate
    if index is None:  # a monotone function of one aggregate has that aggregate's noise
        monotone = monotone_of(output.expression)
        index = next((i for i, a in enumerate(plan.analysis.aggregates)
                      if monotone is not None and a.sql == monotone[0]), None)
        if index is None:
            return None
        accuracy = _accuracy(replace(output, aggregate=index), plan)
        # its interval is the aggregate's mapped per row (`_output_intervals`)
        return replace(accuracy, half_width=None) if accuracy is not None else None
    agg = plan.analysis.aggregates[index]
    measurements = [plan.measurements[i] for i in agg.statistics]
    quantile = measurements[0].quantile
    if quantile is not None:
        return ColumnAccuracy(
            name=output.name, aggregate=agg.sql, mechanism="exponential",
            noise_scales=(1 / float(quantile.rate),), epsilon=quantile.epsilon, delta=0.0,
            confidence=plan.options.confidence, half_width=None,
            rank_error=rank_error(quantile, plan.options.confidence), mode=quantile.mode)
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
        result = compare_values(evaluate(item.expression, rows[a], keys[a]),
                                evaluate(item.expression, rows[b], keys[b]),
                                item.descending, item.nulls_first)
        if result:
            return result
    return a - b  # stable: the policy's key order
