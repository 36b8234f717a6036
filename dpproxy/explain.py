"""EXPLAIN: the DP plan in words — bounds, sensitivities, noise, cost, rewritten SQL.

It reads no data and charges nothing.
"""

from __future__ import annotations

from .accountant import Cost
from .plan import QueryPlan


def explain_lines(plan: QueryPlan, rewritten_sql: str | None, remaining: Cost) -> list[str]:
    analysis = plan.analysis
    bound = plan.contribution
    options = plan.options
    cost = plan.cost
    unit = (f"privacy unit {bound.privacy_unit}: at most {bound.max_groups} group(s) and "
            f"{bound.max_rows} row(s) per group per unit" if bound.privacy_unit
            else "no privacy unit: each row is its own unit")
    lines = [
        f"DP query on {analysis.table.name} ({unit})",
        f"Cost: ε={cost.epsilon:g}, δ={cost.delta:g} ({options.mechanism}, basic composition, "
        f"split evenly over {len(plan.measurements)} statistic(s)); "
        f"budget left before: ε={remaining.epsilon:.6g}, δ={remaining.delta:.3g}",
    ]
    if analysis.keys:
        keys = ", ".join(f"{k.name} ({len(k.values)} public values)" for k in analysis.keys)
        lines.append(f"Groups: {keys}; {analysis.group_count} group(s) released, zeros included")
    else:
        lines.append("Groups: one (no GROUP BY)")
    for m in plan.measurements:
        s, n = m.statistic, m.noise
        norm = "L1" if n.mechanism == "laplace" else "L2"
        lines.append(
            f"  {m.column} = {s.describe()}: {norm} sensitivity {m.sensitivity:g}, "
            f"{n.mechanism} scale {n.scale:.6g} on a grid of {n.granularity:g}, "
            f"ε={n.epsilon:.6g}{f', δ={n.delta:.3g}' if n.delta else ''}; "
            f"{options.confidence:.0%} ± {m.half_width:.6g}")
    for agg in analysis.aggregates:
        parts = ", ".join(plan.measurements[i].column for i in agg.statistics)
        lines.append(f"  {agg.sql} from {parts}")
    if rewritten_sql is not None:
        lines.append("Rewritten SQL (a parameter, if any, is a salt drawn afresh per query):")
        lines.append(f"  {rewritten_sql}")
    else:
        lines.append("Reads no private data (public keys only); costs nothing")
    return lines
