"""What a budget buys under basic composition and under zCDP, for Gaussian COUNT queries.

Budget (ε = 1, δ = 1e-6), 100 Gaussian COUNT queries (L2 sensitivity 1):

* basic composition splits the budget into 100 × (ε = 0.01, δ = 1e-8); the σ each
  query then needs is printed for the analytic Gaussian (Balle & Wang), for the
  discrete Gaussian dpproxy draws, and for the classic formula;
* zCDP adds up ρ = 1/(2σ²) and converts once (CKS20): the smallest σ such that 100
  queries fit is printed.

Then, for several per-query σ, how many queries the budget buys under each, counted
by charging a real ledger until it refuses.

    python benchmarks/accounting.py [--out DIR]

Writes benchmarks/results/accounting.json and accounting.md (quoted by the README).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.accountant import Cost, Ledger, Loss  # noqa: E402
from dpproxy.errors import BudgetExceeded  # noqa: E402
from dpproxy.mechanisms import (  # noqa: E402
    classic_gaussian_sigma,
    discrete_gaussian_sigma,
    gaussian_sigma,
    zcdp_epsilon,
    zcdp_rho,
)

sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead import add_out_argument, publish  # noqa: E402

EPSILON, DELTA, QUERIES = 1.0, 1e-6, 100
PER_QUERY_DELTA = DELTA / QUERIES  # what basic composition gives each query


def smallest_zcdp_sigma(queries: int) -> float:
    """Smallest σ with zcdp_epsilon(queries · 1/(2σ²), δ) <= ε, by bisection."""
    low, high = 1e-3, 1e6
    for _ in range(200):
        mid = math.sqrt(low * high)
        if zcdp_epsilon(queries * zcdp_rho(1.0, mid), DELTA) <= EPSILON:
            high = mid
        else:
            low = mid
    return high


def basic_epsilon_for_sigma(sigma: float) -> float:
    """The per-query ε whose discrete-Gaussian σ (at δ = 1e-8) is `sigma`, by bisection."""
    low, high = 1e-6, 50.0
    for _ in range(200):
        mid = math.sqrt(low * high)
        if discrete_gaussian_sigma(1.0, mid, PER_QUERY_DELTA) > sigma:
            low = mid
        else:
            high = mid
    return high


def count_charges(ledger_path: Path, accounting: str, loss: Loss, cap: int = 100_000) -> int:
    """Charge a real ledger until it refuses."""
    with Ledger(ledger_path, {"analyst:a": Cost(EPSILON, DELTA)},
                accounting=accounting) as ledger:
        for n in range(cap):
            try:
                ledger.charge(["analyst:a"], loss, analyst="a", statement="SELECT COUNT(*)")
            except BudgetExceeded:
                return n
    return cap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_out_argument(parser)
    args = parser.parse_args()
    per_query_epsilon = EPSILON / QUERIES
    basic = {
        "analytic": gaussian_sigma(1.0, per_query_epsilon, PER_QUERY_DELTA),
        "discrete (used)": discrete_gaussian_sigma(1.0, per_query_epsilon, PER_QUERY_DELTA),
        "classic": classic_gaussian_sigma(1.0, per_query_epsilon, PER_QUERY_DELTA),
    }
    zcdp_sigma = smallest_zcdp_sigma(QUERIES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, sigma in enumerate((10.0, 20.0, zcdp_sigma, 100.0, basic["discrete (used)"])):
            eps = basic_epsilon_for_sigma(sigma)
            loss = Loss(eps, PER_QUERY_DELTA, rho=zcdp_rho(1.0, sigma), zcdp_delta=0.0)
            rows.append({
                "sigma": sigma, "per_query_epsilon": eps,
                "basic": count_charges(Path(tmp) / f"b{i}.db", "basic", loss),
                "zcdp": count_charges(Path(tmp) / f"z{i}.db", "zcdp", loss),
            })
    results = {"budget": {"epsilon": EPSILON, "delta": DELTA}, "queries": QUERIES,
               "basic_sigma": basic, "zcdp_sigma": zcdp_sigma, "queries_bought": rows}
    lines = [
        f"Budget ε = {EPSILON:g}, δ = {DELTA:g}; Gaussian COUNT queries (L2 sensitivity 1).",
        "",
        f"σ each of {QUERIES} queries gets — zCDP: **{zcdp_sigma:.2f}**; basic composition "
        f"(each query ε = {per_query_epsilon:g}, δ = {PER_QUERY_DELTA:g}): "
        + ", ".join(f"{name} {s:.1f}" for name, s in basic.items()) + ".",
        "",
        "| σ per query | per-query ε at δ = 1e-8 | queries bought, basic | queries bought, zCDP |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['sigma']:.2f} | {r['per_query_epsilon']:.4f} | {r['basic']} | {r['zcdp']} |"
              for r in rows]
    table = "\n".join(lines) + "\n"
    publish("accounting", args.out, results, table)
    print(table)


if __name__ == "__main__":
    main()
