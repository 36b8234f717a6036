"""Calibration results are cached (they are pure): a cached answer must be the computed
one, and a cache must never let an invalid argument through."""

from __future__ import annotations

import pytest

from dpproxy import mechanisms as m
from dpproxy.errors import InvalidParameterValue


def test_cached_calibration_is_the_computed_one() -> None:
    first = m.calibrate("gaussian", 2.0, 0.7, 1e-6, integer_valued=True, changed_outputs=3)
    again = m.calibrate("gaussian", 2.0, 0.7, 1e-6, integer_valued=True, changed_outputs=3)
    assert again is first
    m.calibrate.cache_clear()
    m.discrete_gaussian_sigma.cache_clear()
    assert m.calibrate("gaussian", 2.0, 0.7, 1e-6, integer_valued=True,
                       changed_outputs=3) == first
    assert m.half_width(first, 0.9) == m.half_width.__wrapped__(first, 0.9)
    assert m.gaussian_sigma(1.0, 1.0, 1e-5) == m.gaussian_sigma.__wrapped__(1.0, 1.0, 1e-5)


def test_cache_keys_keep_types_apart() -> None:
    """changed_outputs=True equals 1 as a dict key; it must still be refused."""
    m.calibrate("laplace", 1.0, 1.0, integer_valued=True, changed_outputs=1)
    with pytest.raises(InvalidParameterValue):
        m.calibrate("laplace", 1.0, 1.0, integer_valued=True, changed_outputs=True)
    with pytest.raises(InvalidParameterValue):
        m.calibrate("laplace", 1.0, 1.0, 0.5, integer_valued=True)  # δ with Laplace
    with pytest.raises(InvalidParameterValue):
        m.half_width(m.calibrate("laplace", 1.0, 1.0, integer_valued=True), 1.0)
