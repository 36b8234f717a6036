"""EXPLAIN: the DP plan in words — bounds, sensitivities, noise, cost, rewritten SQL.

It reads no data and charges nothing.
"""

from __future__ import annotations

from .accountant import Cost
from .analyze import AggregateCall, GroupKey
from .analyze.expressions import written_sql
from .clock import date_of_day
from .mechanisms import half_width
from .plan import QueryPlan, aggregate_epsilons, format_split
from .quantiles import error_phrase, rank_error
from .selection import effective_threshold

# Group sizes at which EXPLAIN quotes the expected error of AVG, VAR and STDDEV, whose
# error shrinks with the group's (unknown, private) count.
EXAMPLE_COUNTS = (1_000, 100_000)


def explain_lines(plan: QueryPlan, rewritten_sql: str | None, remaining: Cost) -> list[str]:
    analysis = plan.analysis
    bound = plan.contribution
    options = plan.options
    cost = plan.cost
    unit = (f"privacy unit {bound.privacy_unit}: at most {bound.max_groups} group(s) and "
            f"{bound.max_rows} row(s) per group per unit" if bound.privacy_unit
            else "no privacy unit: each row is its own unit")
    if analysis.per_unit is not None:
        per_unit = analysis.per_unit
        unit = (f"values per {per_unit.unit}, one row per unit: {per_unit.describe()}; "
                "each row is its own unit")
    noisy = sum(m.private for m in plan.measurements)
    split = (f"split evenly over {noisy} noisy statistic(s)" if options.split is None
             else f"split by aggregate weights {format_split(options.split)} (SET "
                  f"dpproxy.split) over {noisy} noisy statistic(s)")
    lines = [
        f"DP query on {analysis.table.name} ({unit})",
        f"Cost: ε={cost.epsilon:g}, δ={cost.delta:g} ({options.mechanism}, basic composition, "
        f"{split}{' and partition selection' if plan.counts_units else ''}); "
        f"budget left before: ε={remaining.epsilon:.6g}, δ={remaining.delta:.3g}",
    ]
    for join in analysis.joins:
        if join.unique_key is not None:
            effect = (f"{join.prefix}.{join.unique_key} is declared unique: one row per value "
                      "is joined, no fan-out")
        elif bound.privacy_unit:
            effect = ("may match several rows: each match counts as a row of its unit, "
                      "bounded after the join")
        else:
            effect = ("may match several rows: rows are numbered before the join and each "
                      "keeps at most one joined row")
        lines.append(f"Join: {join.describe()} ({effect})")
    if analysis.keys and plan.selection is None:
        keys = ", ".join(f"{_key_text(k)} ({len(k.values or ())} public values"
                         f"{f', the image of the public values of {k.source}' if k.source else ''})"
                         for k in analysis.keys)
        lines.append(f"Groups: {keys}; {analysis.group_count} group(s) released, zeros included")
    elif analysis.keys:
        sel = plan.selection
        keys = ", ".join(_key_text(k) if k.values is None else f"{_key_text(k)} (public)"
                         for k in analysis.keys)
        if sel.measurement is not None:
            count = plan.measurements[sel.measurement]
            lines.append(
                f"Groups: {keys}; partition selection releases a group when its released "
                f"{count.statistic.describe()} reaches {sel.threshold} (thresholding the "
                f"count's own noise, so selection takes no ε; δ={sel.delta:.3g}, a unit adds "
                f"≤ {sel.unit_rows} row(s) to each of ≤ {sel.max_groups} group(s); textbook "
                f"threshold {sel.textbook_threshold:.4g} for continuous noise; SET "
                "dpproxy.selection = 'units' thresholds a count of units instead)")
        else:
            lines.append(
                f"Groups: {keys}; partition selection releases a group when its noisy count of "
                f"distinct units reaches {effective_threshold(sel)} ({sel.mechanism} thresholding, "
                f"scale {sel.noise.scale:.6g}, ε={sel.epsilon:.6g}, δ={sel.delta:.3g}, "
                f"≤ {sel.max_groups} group(s) per unit; textbook threshold "
                f"{sel.textbook_threshold:.4g} for continuous noise"
                f"{f'; floor min_units_per_group={sel.min_units}' if sel.min_units else ''})")
    else:
        lines.append("Groups: one (no GROUP BY)")
    for m in plan.measurements:
        s, n, q = m.statistic, m.noise, m.quantile
        if q is not None:
            b = q.binning
            bins = (f"{b.bins} one-integer bins" if b.integer_points
                    else f"{b.bins} bins of width {b.width:.6g}, released at their midpoints")
            lines.append(
                f"  {m.column} = {s.describe()}: exponential mechanism over {bins}; "
                f"{'count' if q.mode else 'rank'} utility sensitivity {m.sensitivity:g} per "
                f"group, ε={q.epsilon:.6g} (ε={q.epsilon_per_group:.6g} per group, ≤ "
                f"{q.max_groups} group(s) per unit); {options.confidence:.0%} "
                f"{error_phrase(rank_error(q, options.confidence), q.mode, 6)}")
            continue
        if n is None:
            lines.append(f"  {m.column} = {s.describe()}: exact, no central noise (local-DP "
                         "reports in a table with public membership)")
            continue
        norm = "L1" if n.mechanism == "laplace" else "L2"
        # SUM bounds a unit's total, not its rows (AVG's sums scale the kept rows' mean)
        total = (f" (a unit adds its total per group, clamped to {bound.max_rows} × the "
                 "bounds)" if s.unit_total and bound.max_rows > 1 else "")
        lines.append(
            f"  {m.column} = {s.describe()}{total}: {norm} sensitivity {m.sensitivity:g}, "
            f"{n.mechanism} scale {n.scale:.6g} on a grid of {n.granularity:g}, "
            f"ε={n.epsilon:.6g}{f', δ={n.delta:.3g}' if n.delta else ''}; "
            f"{options.confidence:.0%} ± {m.half_width:.6g}")
    for agg, epsilon in zip(analysis.aggregates, aggregate_epsilons(plan), strict=True):
        parts = ", ".join(plan.measurements[i].column for i in agg.statistics)
        lines.append(f"  {agg.written or agg.sql} from {parts}"
                     + (f", debiased: {agg.rule.mechanism}" if agg.rule.mechanism else "")
                     + aggregate_error(plan, agg, epsilon)
                     + (f"; candidates: {len(agg.rule.labels)} public values"
                        if agg.rule.labels is not None
                        else f"; argument bounds [{_bound(agg, 0)}, {_bound(agg, 1)}]"
                        if agg.argument_bounds else ""))
    for call in analysis.windows:
        lines.append(f"  {call.text}: over the released groups, after HAVING "
                     "(post-processing: costs nothing)")
    if rewritten_sql is not None:
        lines.append("Rewritten SQL (a parameter, if any, is a salt drawn afresh per query):")
        lines.append(f"  {rewritten_sql}")
    else:
        lines.append("Reads no private data (public keys only); costs nothing")
    return lines


def aggregate_error(plan: QueryPlan, agg: AggregateCall, epsilon: float) -> str:
    """An aggregate's part of the query's ε (`plan.aggregate_epsilons`) and its expected
    error, as EXPLAIN prints it.

    The error is the half-width at the plan's confidence for one statistic; for AVG, VAR
    and STDDEV it depends on the group's count, so it is quoted, to first order, at
    `EXAMPLE_COUNTS` rows (with the statistics' half-widths at the joint level release
    uses). The error of a shared statistic follows from its whole ε.
    """
    measurements = [plan.measurements[i] for i in agg.statistics]
    if not any(m.private for m in measurements):
        return ""
    noises = [m.noise for m in measurements]
    share = epsilon / plan.options.epsilon
    text = f": ε={epsilon:.6g} ({share:.0%} of the query's)"
    confidence = plan.options.confidence
    quantile = measurements[0].quantile
    if len(measurements) == 1 and quantile is not None:
        return text + (f", {confidence:.0%} "
                       f"{error_phrase(rank_error(quantile, confidence), quantile.mode, 6)}")
    if len(noises) == 1 and noises[0] is not None:
        return text + f", {confidence:.0%} ± {plan.measurements[agg.statistics[0]].half_width:.6g}"
    if agg.rule.error_at is None or any(n is None for n in noises):
        return text + f", {confidence:.0%} interval per row"
    # the level at which release covers every statistic of the aggregate jointly
    level = 1 - (1 - confidence) / len(noises)
    halves = [half_width(n, level) for n in noises if n is not None]
    stats = [plan.analysis.statistics[i] for i in agg.statistics]
    errors = ", ".join(f"± {agg.rule.error_at(halves, stats, n):.4g} at {n:,} rows"
                       for n in EXAMPLE_COUNTS)
    return text + f", {confidence:.0%} about {errors} (interval per row)"


def _key_text(key: GroupKey) -> str:
    """A group key as written (`WIDTH_BUCKET(age, 0, 100, 10)`, not the CASE it folds to)."""
    return written_sql(key.expression) if key.expression is not None else key.name


def _bound(agg: AggregateCall, side: int) -> str:
    """One end of an aggregate's argument bounds: a number, or the date of a day number."""
    assert agg.argument_bounds is not None
    value = agg.argument_bounds[side]
    if agg.rule.value_type == "date":
        return date_of_day(value)
    return f"{value:g}"
