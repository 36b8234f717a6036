"""How accurate answers collected under local DP are, against ε, next to central DP.

1. Randomized response, true proportion p = 0.2, N = 100, 500, 2000 respondents: the
   estimated proportion (mean and spread over repeated collections) and its reported
   uncertainty Δp = 2 standard errors, against ε; beside it the 95% half-width of the
   central Laplace mechanism at the same ε on the same count.
2. Unary encoding (OUE and symmetric) of the demo's occupation counts (32,561 people,
   14 occupations, 1,843 with none): mean absolute error per bin against ε, next to the
   central Laplace mechanism at the same ε on the same counts (neighbours add or remove
   one person, sensitivity 1, as dpproxy's COUNT … GROUP BY).

Every report is drawn by the real encoders (`dpproxy.local`, OS randomness). Also times
encoding a million answers.

    python benchmarks/ldp_accuracy.py [--quick]

Writes benchmarks/results/ldp_proportion.png, ldp_histogram.png, ldp_accuracy.json and
ldp_accuracy.md (the README shows the figures).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpproxy.demo import ADULT_ROWS, OCCUPATION_COUNTS  # noqa: E402
from dpproxy.local import RandomizedResponse, UnaryEncoding  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRUE_P = 0.2
SIZES = (100, 500, 2000)
Z95 = 1.959964


def laplace_half_width(epsilon: float, confidence: float = 0.95) -> float:
    """Half-width of a central Laplace(1/ε) count at `confidence`: ln(1/(1 − c))/ε."""
    return math.log(1 / (1 - confidence)) / epsilon


def proportion_curves(epsilons: np.ndarray, repetitions: int) -> dict[str, object]:
    out: dict[str, object] = {"epsilon": epsilons.tolist()}
    for n in SIZES:
        truth = np.arange(n) < round(TRUE_P * n)
        means, spreads, deltas = [], [], []
        for epsilon in epsilons:
            rr = RandomizedResponse.from_epsilon(float(epsilon))
            estimates = [rr.estimate(rr.encode(truth)) for _ in range(repetitions)]
            values = np.array([e.value for e in estimates])
            means.append(float(values.mean()))
            spreads.append(float(values.std(ddof=1)))
            deltas.append(float(np.mean([e.delta for e in estimates])))
        out[str(n)] = {"mean": means, "sd": spreads, "delta_p": deltas,
                       "central_laplace_half_width": [laplace_half_width(e) / n
                                                      for e in epsilons]}
    return out


def histogram_curves(epsilons: np.ndarray, repetitions: int) -> dict[str, object]:
    domain = tuple(OCCUPATION_COUNTS)
    counts = np.array(list(OCCUPATION_COUNTS.values()))
    codes = np.concatenate([np.repeat(np.arange(len(domain)), counts),
                            np.full(ADULT_ROWS - counts.sum(), -1)])  # no occupation
    out: dict[str, object] = {"epsilon": epsilons.tolist()}
    for name, build in (("oue", UnaryEncoding.optimized), ("sue", UnaryEncoding.symmetric)):
        errors = []
        for epsilon in epsilons:
            ue = build(domain, float(epsilon))
            per_run = [np.abs(np.array([e.value for e in ue.estimate(ue.encode_codes(codes))])
                              - counts).mean() for _ in range(repetitions)]
            errors.append(float(np.mean(per_run)))
        out[name] = errors
    # central Laplace(1/ε) per bin: mean absolute error 1/ε
    out["central_laplace"] = [1 / e for e in epsilons]
    return out


def encode_speed() -> dict[str, float]:
    answers = np.random.default_rng(0).random(1_000_000) < TRUE_P  # the truth, not privacy
    rr = RandomizedResponse.from_epsilon(1.0)
    start = time.perf_counter()
    rr.encode(answers)
    rr_s = time.perf_counter() - start
    ue = UnaryEncoding.optimized(tuple(OCCUPATION_COUNTS), 1.0)
    codes = np.random.default_rng(0).integers(0, len(OCCUPATION_COUNTS), 1_000_000)
    start = time.perf_counter()
    ue.encode_codes(codes)
    return {"randomized_response_1M_s": rr_s, "oue_14_values_1M_s": time.perf_counter() - start}


def plot_proportion(data: dict[str, object], path: Path) -> None:
    eps = np.array(data["epsilon"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = dict(zip(map(str, SIZES), ("tab:red", "tab:orange", "tab:blue"), strict=True))
    for n in map(str, SIZES):
        curve = data[n]
        assert isinstance(curve, dict)
        mean, delta = np.array(curve["mean"]), np.array(curve["delta_p"])
        left.plot(eps, mean, color=colors[n], label=f"N = {n}")
        left.fill_between(eps, mean - delta, mean + delta, color=colors[n], alpha=0.15)
        right.plot(eps, delta, color=colors[n], label=f"randomized response, N = {n}")
        right.plot(eps, curve["central_laplace_half_width"], color=colors[n], ls="--",
                   label=f"central Laplace, N = {n}")
    left.axhline(TRUE_P, color="black", lw=0.8, ls=":", label="true p = 0.2")
    left.set(xscale="log", xlabel="ε", ylabel="estimated proportion",
             title="Randomized response: mean estimate ± mean Δp", ylim=(-0.6, 1.0))
    right.set(xscale="log", yscale="log", xlabel="ε", ylabel="Δp (≈ 95% half-width)",
              title="Uncertainty: local vs central at the same ε")
    left.legend(fontsize=8)
    right.legend(fontsize=7, ncol=2)
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_histogram(data: dict[str, object], path: Path) -> None:
    eps = np.array(data["epsilon"])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(eps, data["oue"], marker="o", ms=3, label="local: optimized unary encoding (OUE)")
    ax.plot(eps, data["sue"], marker="s", ms=3, label="local: symmetric unary encoding")
    ax.plot(eps, data["central_laplace"], ls="--", color="black",
            label="central Laplace (dpproxy COUNT)")
    ax.set(xscale="log", yscale="log", xlabel="ε", ylabel="mean absolute error per bin",
           title=f"Occupation histogram of {ADULT_ROWS:,} people (14 bins)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(prop: dict[str, object], hist: dict[str, object], speed: dict[str, float],
             repetitions: int) -> str:
    lines = [f"Randomized response, true p = {TRUE_P}; {repetitions} collections per point. "
             "Δp = 2 standard errors (mean reported); central = 95% half-width of "
             "Laplace(1/ε) on the count, divided by N.", "",
             "| ε | " + " | ".join(f"Δp N={n} | central N={n}" for n in SIZES) + " |",
             "|---|" + "---|---|" * len(SIZES)]
    eps = prop["epsilon"]
    assert isinstance(eps, list)
    for i, e in enumerate(eps):
        cells = []
        for n in SIZES:
            curve = prop[str(n)]
            assert isinstance(curve, dict)
            cells += [f"{curve['delta_p'][i]:.3f}", f"{curve['central_laplace_half_width'][i]:.4f}"]
        lines.append(f"| {e:.3g} | " + " | ".join(cells) + " |")
    lines += ["", f"Occupation histogram ({ADULT_ROWS:,} people): mean absolute error per bin.",
              "", "| ε | OUE | symmetric UE | central Laplace |", "|---|---|---|---|"]
    for i, e in enumerate(hist["epsilon"]):  # type: ignore[arg-type]
        lines.append(f"| {e:.3g} | {hist['oue'][i]:.1f} | {hist['sue'][i]:.1f} | "  # type: ignore[index]
                     f"{hist['central_laplace'][i]:.2f} |")  # type: ignore[index]
    lines += ["", f"Encoding 1,000,000 answers: randomized response "
              f"{speed['randomized_response_1M_s'] * 1000:.0f} ms, OUE over 14 values "
              f"{speed['oue_14_values_1M_s'] * 1000:.0f} ms (OS randomness, numpy)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few points, few repetitions")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    repetitions = 5 if args.quick else 200
    eps = np.geomspace(0.1, 5, 5 if args.quick else 16)
    prop = proportion_curves(eps, repetitions)
    hist = histogram_curves(eps, 2 if args.quick else 20)
    speed = encode_speed()
    args.out.mkdir(parents=True, exist_ok=True)
    plot_proportion(prop, args.out / "ldp_proportion.png")
    plot_histogram(hist, args.out / "ldp_histogram.png")
    (args.out / "ldp_accuracy.json").write_text(json.dumps(
        {"proportion": prop, "histogram": hist, "encode_speed": speed,
         "repetitions": repetitions}, indent=2))
    text = markdown(prop, hist, speed, repetitions)
    (args.out / "ldp_accuracy.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
