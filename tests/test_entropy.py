"""The scalar samplers' byte source (mechanisms._Entropy): uniform, and the samplers keep
their laws on it.

Statistical tests use fixed sample sizes and DKW bounds (see tests/test_mechanisms.py),
each with a false-failure probability <= 1e-7; there are 2 of them, so a correct
implementation fails this file with probability <= 2e-7 per run.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from dpproxy import mechanisms as m

from .test_mechanisms import dkw_margin, gaussian_pmf, ks_statistic, laplace_cdf, table_cdf

FAILURE = 1e-7  # per statistical test


def test_randbelow_is_uniform() -> None:
    """DKW against the uniform CDF (k + 1)/n for n = 2, 3, 200, 257 and 2^47 + 1, all drawn
    from one source (so across its block refills). n = 30000 each, failure 2e-8 each.
    False-failure rate <= 1e-7."""
    source = m._Entropy()
    draws = 30000
    eta = dkw_margin(draws, FAILURE / 5)
    for n in (2, 3, 200, 257, 2**47 + 1):
        values = [source.randbelow(n) for _ in range(draws)]
        assert min(values) >= 0 and max(values) < n
        if n < 2**40:
            stat = ks_statistic(values, lambda k, n=n: np.clip((k + 1) / n, 0.0, 1.0))
        else:  # scaled to [0, 1): within 1/n of the continuous uniform CDF, at the jumps
            scaled = np.sort(np.asarray(values, dtype=np.float64) / n)
            stat = float(np.max(np.abs(np.arange(1, draws + 1) / draws - scaled))) - 1 / n
        assert stat <= eta, (n, stat, eta)


def test_randbelow_edges() -> None:
    source = m._Entropy()
    assert [source.randbelow(1) for _ in range(10)] == [0] * 10
    huge = 2**2100 + 12345  # more bytes than one block
    assert all(0 <= source.randbelow(huge) < huge for _ in range(20))
    assert len({source.randbelow(2**64) for _ in range(100)}) == 100  # fresh bytes each


def test_samplers_keep_their_laws_on_the_source() -> None:
    """DKW for discrete Laplace (scale 7/3) and Gaussian (σ² = 10) drawn through
    _grid_sampler, the release path's scalar sampler. n = 30000 each, failure 5e-8 each.
    False-failure rate <= 1e-7."""
    draws = 30000
    eta = dkw_margin(draws, FAILURE / 2)
    laplace = m._grid_sampler("laplace", 7, 3)
    values = [laplace() for _ in range(draws)]
    assert ks_statistic(values, laplace_cdf(float(Fraction(7, 3)))) <= eta
    gaussian = m._grid_sampler("gaussian", 10, 1)
    values = [gaussian() for _ in range(draws)]
    assert ks_statistic(values, table_cdf(*gaussian_pmf(10.0))) <= eta
