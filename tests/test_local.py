"""The local-DP client library (dpproxy.local) and the `dpproxy ldp` commands.

Statistical checks and their false-failure rates (each ≤ 1e-7, under 1e-6 per run):

* flip rates: Hoeffding, P(|rate − P| ≥ t) ≤ 2·exp(−2·n·t²); t is set so that this is
  1e-7 for each rate checked (eight rates);
* unbiasedness: the mean of K independent estimates is within 5.5 standard errors of
  the truth (two-sided normal tail 3.8e-8; the issue's 4 standard errors would fail a
  correct estimator with probability 6e-5, above this suite's budget).
"""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpproxy.local import Estimate, RandomizedResponse, UnaryEncoding, bernoulli, debias

ROOT = Path(__file__).resolve().parent.parent
PER_CHECK_FAILURE = 1e-7
Z_MEAN = 5.5


def hoeffding(n: int) -> float:
    """Half-width t with P(|empirical rate − p| ≥ t) ≤ PER_CHECK_FAILURE over n draws."""
    return math.sqrt(math.log(2 / PER_CHECK_FAILURE) / (2 * n))


# encoders ------------------------------------------------------------------------------------
@pytest.mark.parametrize("rr", [RandomizedResponse.from_coins(0.5, 0.5),
                                RandomizedResponse.from_coins(0.6, 0.3)])
def test_randomized_response_flip_rates(rr: RandomizedResponse) -> None:
    n = 400_000
    truth = np.repeat([True, False], n)
    reports = rr.encode(truth)
    t = hoeffding(n)
    assert abs(reports[:n].mean() - rr.p_one) < t  # P(yes | yes)
    assert abs(reports[n:].mean() - rr.p_zero) < t  # P(yes | no)


@pytest.mark.parametrize("build", [UnaryEncoding.optimized, UnaryEncoding.symmetric])
def test_unary_encoding_flip_rates(build) -> None:  # type: ignore[no-untyped-def]
    ue = build(["a", "b", "c", "d"], 1.5)
    n = 100_000
    reports = ue.encode_codes(np.zeros(n, dtype=np.int64))  # every true answer is "a"
    t = hoeffding(n)
    assert abs(reports[:, 0].mean() - ue.p) < t  # a 1 kept as 1
    # each 0 raised to 1: three columns of n draws each, pooled (3n draws)
    assert abs(reports[:, 1:].mean() - ue.q) < hoeffding(3 * n)


def test_outside_domain_is_all_zeros_randomized() -> None:
    ue = UnaryEncoding(("x", "y"), 1.0, 0.0)  # p = 1, q = 0: deterministic, to see the code
    assert ue.encode(["y", None, "zzz", "x"]).astype(int).tolist() == [[0, 1], [0, 0], [0, 0],
                                                                       [1, 0]]


def test_bernoulli_extremes_and_shape() -> None:
    assert not bernoulli(0.0, (3, 5)).any()
    assert bernoulli(1.0, 1000).all()
    assert bernoulli(np.array([0.0, 1.0]), 2).tolist() == [False, True]


# estimators ------------------------------------------------------------------------------------
def test_randomized_response_unbiased_across_runs() -> None:
    rr = RandomizedResponse.from_epsilon(1.0)
    n, k, p = 2000, 400, 0.2
    truth = np.arange(n) < p * n
    estimates = np.array([rr.estimate(rr.encode(truth)).value for _ in range(k)])
    f = rr.f
    exact_se = math.sqrt(f * (1 - f) / n) / (2 * f - 1)  # Var(r) = f(1 − f)/n at any p
    assert abs(estimates.mean() - p) < Z_MEAN * exact_se / math.sqrt(k)


def test_unary_encoding_unbiased_across_runs() -> None:
    ue = UnaryEncoding.optimized(list(range(5)), 1.0)
    counts = np.array([500, 300, 150, 50, 0])
    codes = np.repeat(np.arange(5), counts)
    k = 300
    estimates = np.array([[e.value for e in ue.estimate(ue.encode_codes(codes))]
                          for _ in range(k)])
    n, p, q = codes.size, ue.p, ue.q
    # exact per-bin variance: c·p(1 − p) + (n − c)·q(1 − q), over (p − q)²
    exact_se = np.sqrt(counts * p * (1 - p) + (n - counts) * q * (1 - q)) / (p - q)
    assert np.all(np.abs(estimates.mean(axis=0) - counts) < Z_MEAN * exact_se / math.sqrt(k))


def test_estimators_match_the_textbook_formulas() -> None:
    f = 0.8
    rr = RandomizedResponse.from_f(f)
    est = rr.estimate_counts(ones=300, n=1000)
    r = 0.3
    assert est.value == pytest.approx((r + f - 1) / (2 * f - 1))
    # the binomial error at the report probability nearest 1/2 (f and 1 − f straddle it)
    assert est.delta == pytest.approx(2 / (2 * f - 1) * math.sqrt(0.25 / 1000))
    ue = UnaryEncoding(("a", "b"), 0.5, 0.25)
    (a, b) = ue.estimate_counts([400, 200], 1000)
    assert a.value == pytest.approx((400 - 1000 * 0.25) / 0.25)
    assert b.standard_error == pytest.approx(math.sqrt(1000 * 0.5 * 0.5) / 0.25)
    lopsided = UnaryEncoding(("a", "b"), 0.2, 0.1)  # π in [0.1, 0.2]: 0.2 is nearest 1/2
    assert lopsided.estimate_counts([30, 20], 100)[0].standard_error == pytest.approx(
        math.sqrt(100 * 0.2 * 0.8) / 0.1)
    assert math.isnan(debias(0, 0, 0.75, 0.25).value)
    assert Estimate(1.0, 0.5, 10).interval(0.95) == pytest.approx((0.02, 1.98), abs=1e-3)


# parametrizations --------------------------------------------------------------------------------
def _within(realized: float, asked: float) -> bool:
    """Never above the ε asked for; below it by the 2^-32 grid alone (a probability moves
    by < 2^-32, so ln of a ratio by < 2^-32 / the smaller probability, twice)."""
    return asked * (1 - 1e-8) - 1e-5 * (asked >= 10) <= realized <= asked


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, math.log(3), 2.0, 5.0, 10.0])
def test_epsilon_round_trips(epsilon: float) -> None:
    rr = RandomizedResponse.from_epsilon(epsilon)
    assert _within(rr.epsilon, epsilon)
    assert _within(RandomizedResponse.from_f(rr.f).epsilon, epsilon)
    oue = UnaryEncoding.optimized(["a", "b"], epsilon)
    assert (oue.p, oue.q) == (0.5, pytest.approx(1 / (math.exp(epsilon) + 1), abs=2**-32))
    assert _within(oue.epsilon, epsilon)
    sue = UnaryEncoding.symmetric(["a", "b"], epsilon)
    assert sue.p == pytest.approx(math.exp(epsilon / 2) / (1 + math.exp(epsilon / 2)),
                                  abs=2**-32)
    assert sue.q == 1 - sue.p
    assert _within(sue.epsilon, epsilon)


@pytest.mark.parametrize("epsilon", [0.3, 6.0, 18.0, 22.0, 23.0, 25.0, 40.0, 700.0])
def test_the_stated_epsilon_is_the_realized_one(epsilon: float) -> None:
    """`bernoulli` realizes P as ⌊P·2^32⌉/2^32; an encoder's probabilities are on that grid
    already, rounded toward less information, so the ε its reports realize is the one it
    states, and at most the one asked for. Rounded to nearest, P(yes | no) = 1e-10 (ε = 23)
    became 0: every report the truth (a review found ε = ∞ from about 22.2)."""
    grid = 2.0 ** 32
    channels = [RandomizedResponse.from_epsilon(epsilon),
                RandomizedResponse.from_coins(h=2 / (1 + math.exp(epsilon))),
                UnaryEncoding.optimized(["a", "b", "c"], epsilon),
                UnaryEncoding.symmetric(["a", "b"], epsilon)]
    for channel in channels:
        probabilities = (channel.p_one, channel.p_zero) if isinstance(
            channel, RandomizedResponse) else (channel.p, channel.q)
        assert all((p * grid).is_integer() for p in probabilities)
        assert min(probabilities) > 0 and max(probabilities) < 1
        assert math.isfinite(channel.epsilon) and channel.epsilon <= epsilon * (
            1 + 1e-12), channel
    # explicit probabilities off the grid: rounded the safe way
    lopsided = RandomizedResponse(1 - 1e-12, 1e-12)
    assert (lopsided.p_one, lopsided.p_zero) == (1 - 1 / grid, 1 / grid)


def test_coin_parametrization() -> None:
    classic = RandomizedResponse.from_coins(h=0.5, s=0.5)
    assert (classic.p_one, classic.p_zero, classic.f) == (0.75, 0.25, 0.75)
    assert classic.epsilon == pytest.approx(math.log(3))
    lopsided = RandomizedResponse.from_coins(h=0.6, s=0.3)  # P(yes|yes)=.58, P(yes|no)=.18
    assert (lopsided.p_one, lopsided.p_zero) == pytest.approx((0.58, 0.18))
    assert lopsided.epsilon == pytest.approx(max(math.log(0.58 / 0.18), math.log(0.82 / 0.42)))
    assert not lopsided.symmetric
    for bad in (lambda: RandomizedResponse.from_coins(0.0), lambda: RandomizedResponse.from_f(0.5),
                lambda: RandomizedResponse.from_epsilon(0), lambda: UnaryEncoding(("a",), .2, .3),
                lambda: UnaryEncoding((), .5, .2), lambda: UnaryEncoding(("a", "a"), .5, .2)):
        with pytest.raises(ValueError):
            bad()


# CLI ---------------------------------------------------------------------------------------------
def run(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dpproxy", "ldp", *args], input=stdin,
                          capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_cli_randomized_response_round_trip() -> None:
    n, yes = 20_000, 4_000
    rows = ["id,answer"] + [f"{i},{'yes' if i < yes else 'no'}" for i in range(n)] + [f"{n},"]
    encoded = run(["encode", "--mechanism", "randomized_response", "--epsilon", "2",
                   "--column", "answer"], "\n".join(rows) + "\n")
    assert encoded.returncode == 0, encoded.stderr
    out = list(csv.DictReader(io.StringIO(encoded.stdout)))
    assert len(out) == n + 1 and out[0]["id"] == "0"
    assert {r["answer"] for r in out[:n]} == {"0", "1"} and out[n]["answer"] == ""
    # the reports are randomized: many of the first `yes` answers were reported as 0
    assert sum(r["answer"] == "0" for r in out[:yes]) > 0
    estimated = run(["estimate", "--mechanism", "rr", "--epsilon", "2", "--column", "answer",
                     "--json"], encoded.stdout)
    assert estimated.returncode == 0, estimated.stderr
    result = json.loads(estimated.stdout)["estimates"][0]
    assert result["n"] == n
    f = 1 / (1 + math.exp(-2))
    exact_se = math.sqrt(f * (1 - f) / n) / (2 * f - 1)
    assert abs(result["proportion"] - yes / n) < Z_MEAN * exact_se
    assert result["proportion_standard_error"] == pytest.approx(
        math.sqrt(1 / (4 * n)) / (2 * f - 1))  # the Δp / 2 at r = 1/2, conservative
    text = run(["estimate", "--mechanism", "rr", "--epsilon", "2", "--column", "answer"],
               encoded.stdout)
    assert text.returncode == 0 and "reports: 20000" in text.stdout


def test_cli_unary_round_trip_and_errors() -> None:
    answers = "job\n" + "a\n" * 3000 + "b\n" * 1000 + "c\n" * 1000
    encoded = run(["encode", "--mechanism", "unary", "--epsilon", "2", "--domain", "a,b,c"],
                  answers)
    assert encoded.returncode == 0, encoded.stderr
    assert encoded.stdout.splitlines()[0] == "job=a,job=b,job=c"
    estimated = run(["estimate", "--mechanism", "oue", "--epsilon", "2", "--domain", "a,b,c",
                     "--json"], encoded.stdout)
    assert estimated.returncode == 0, estimated.stderr
    counts = [e["count"] for e in json.loads(estimated.stdout)["estimates"]]
    q = 1 / (math.exp(2) + 1)
    worst_se = math.sqrt(5000 * 0.25) / (0.5 - q)  # p(1 − p) and q(1 − q) are ≤ 1/4
    assert all(abs(c - t) < Z_MEAN * worst_se for c, t in zip(counts, (3000, 1000, 1000),
                                                              strict=True))
    bad = run(["encode", "--mechanism", "unary", "--epsilon", "1", "--domain", "a,b"], answers)
    assert bad.returncode == 1 and "'c' is not in the domain" in bad.stderr
    missing = run(["encode", "--mechanism", "rr"], "x\nyes\n")
    assert missing.returncode == 1 and "--epsilon" in missing.stderr


def test_doctests() -> None:
    import doctest

    import dpproxy.analyze.ldp
    import dpproxy.local

    for module in (dpproxy.local, dpproxy.analyze.ldp):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


SURVEY = Path(__file__).resolve().parent.parent / "policies" / "survey.toml"
SURVEY_RR = 'ldp = { mechanism = "randomized_response", h = 0.5, s = 0.5 }'


@pytest.mark.parametrize("channel", [
    'mechanism = "randomized_response", f = 1.0',
    'mechanism = "randomized_response", h = 0.5, s = 1.0',
    'mechanism = "randomized_response", h = 0.5, s = 0.0',
])
def test_a_policy_refuses_a_channel_of_infinite_epsilon(tmp_path: Path, channel: str) -> None:
    """f = 1 (or a second coin of 0 or 1) lets every report of one answer be the truth:
    under public membership such reports were released exactly, at no cost, while the
    policy loaded as local DP."""
    from dpproxy.errors import InvalidPolicy
    from dpproxy.policy import load_policy

    text = SURVEY.read_text()
    assert SURVEY_RR in text
    path = tmp_path / "survey.toml"
    path.write_text(text.replace(SURVEY_RR, f"ldp = {{ {channel} }}"))
    with pytest.raises(InvalidPolicy, match="ε = ∞"):
        load_policy(path)


@pytest.mark.parametrize("epsilon", [23.0, 700.0, 1000.0, 1e300])
def test_a_huge_epsilon_stops_at_the_grid(epsilon: float) -> None:
    """ε = 1000 raised an OverflowError while the policy loaded, and 1/(e^ε + 1)
    underflowed to 0 (ε = ∞) from ~745: every channel now keeps at least one grid step."""
    assert RandomizedResponse.from_epsilon(epsilon).epsilon == pytest.approx(22.1807, abs=1e-4)
    assert UnaryEncoding.optimized(("a", "b"), epsilon).epsilon == pytest.approx(22.1807,
                                                                                 abs=1e-4)
    assert math.isfinite(UnaryEncoding.symmetric(("a", "b"), epsilon).epsilon)


@pytest.mark.parametrize("ones", [0, 1])
def test_one_report_has_an_interval_that_covers_either_answer(ones: int) -> None:
    """All reports agreeing gave r(1 − r) = 0: a "95%" interval of width 0 around 1.5 or
    −0.5, covering the truth for 73% of single reports. With the channel's own largest
    variance, one report's interval holds both possible truths, 0 and 1."""
    est = RandomizedResponse.from_coins(0.5, 0.5).estimate_counts(ones=ones, n=1)
    low, high = est.interval(0.95)
    assert low <= 0.0 and high >= 1.0
