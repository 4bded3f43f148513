"""Staleness models recover known decays."""

from __future__ import annotations

import numpy as np
import pytest

from daskpri.table.staleness import estimate
from daskpri.table.table import PriorityTable


def _observe(table, idx, f, steps):
    for s in steps:
        table.update(idx, f(s), step=s)


def test_keep_returns_the_last_value():
    t = PriorityTable([2], staleness="keep")
    _observe(t, np.array([0, 1]), lambda s: np.array([1.0, 2.0]) * 0.5**s, [0, 1])
    assert t.estimate(10).tolist() == [0.5, 1.0]


def test_exp_linear_recovers_an_exponential_decay():
    rate = -0.07
    t = PriorityTable([3], staleness="exp-linear")
    p0 = np.array([2.0, 5.0, -3.0])
    _observe(t, np.arange(3), lambda s: p0 * np.exp(rate * s), [4, 10])
    np.testing.assert_allclose(t.estimate(40), p0 * np.exp(rate * 40), rtol=1e-10)


def test_exp_quadratic_recovers_a_quadratic_log_decay():
    def f(s):
        return np.array([3.0, 0.5]) * np.exp(-0.02 * s - 0.001 * s**2)

    t = PriorityTable([2], staleness="exp-quadratic")
    _observe(t, np.arange(2), f, [0, 5, 12])
    np.testing.assert_allclose(t.estimate(30), f(30), rtol=1e-9)
    # the linear fit of the same observations does not
    lin = PriorityTable.from_state_dict(dict(t.state_dict(), staleness="exp-linear"))
    assert not np.allclose(lin.estimate(30), f(30), rtol=1e-3)


def test_fits_fall_back_with_too_few_observations_or_a_sign_change():
    t = PriorityTable([3], staleness="exp-quadratic")
    t.update(np.arange(3), np.array([1.0, 1.0, 1.0]), step=0)
    t.update(np.array([1, 2]), np.array([0.5, -0.5]), step=1)
    est = t.estimate(3)
    assert est[0] == 1.0  # one observation: kept
    assert est[1] == pytest.approx(0.5 * 0.5**2)  # two: exponential
    assert est[2] == -0.5  # sign changed: kept


def test_extrapolation_stays_finite():
    p = np.array([[1e-300, 1.0]])
    t = np.array([[1, 0]])
    assert np.isfinite(estimate(p, t, 10**6, "exp-linear")).all()


def test_unknown_model_is_refused():
    with pytest.raises(ValueError, match="staleness should be one of 'keep', 'exp-linear'"):
        PriorityTable([2], staleness="linear")
