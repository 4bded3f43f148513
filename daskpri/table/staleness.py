"""Staleness models: estimates of priorities that were not recomputed lately.

A priority computed at step ``t0`` drifts as the model trains. The paper
estimates the current value from the last observations of each sample with an
exponential fit ("ExpLinear", "ExpQuadratic"); ``keep`` uses the last value.
Each model is a pure function of the observation arrays, vectorised over
samples.
"""

from __future__ import annotations

import numpy as np

STALENESS_MODELS = ("keep", "exp-linear", "exp-quadratic")

# Bound on the extrapolated log-change, so a steep fit cannot overflow to inf.
# This is numerical safety of the estimate, not a change to any argument.
_MAX_LOG_CHANGE = 30.0


def validate_staleness(staleness: str) -> str:
    """Return ``staleness`` if it names a model, else raise ``ValueError``."""
    if staleness not in STALENESS_MODELS:
        allowed = ", ".join(repr(s) for s in STALENESS_MODELS)
        raise ValueError(f"staleness should be one of {allowed}, but got {staleness!r}")
    return staleness


def estimate(obs_p: np.ndarray, obs_t: np.ndarray, step: int, model: str) -> np.ndarray:
    """Estimate priorities at ``step`` from the last observations.

    Parameters
    ----------
    obs_p, obs_t : ndarray, shape (n, h)
        The last ``h`` observed priorities of each sample and the steps at
        which they were computed, newest first. Missing observations have
        ``obs_t == -1``.
    step : int
        The step to extrapolate to.
    model : {"keep", "exp-linear", "exp-quadratic"}
        ``exp-linear`` fits ``p(t) = p(t0) * exp(a (t - t0))`` on the last two
        observations, ``exp-quadratic`` fits ``log|p|`` as a quadratic of ``t``
        on the last three. Samples with too few observations, or whose
        observations change sign, fall back to the simpler model.

    Returns
    -------
    ndarray, shape (n,)
        The estimates; ``+inf`` for samples never observed.

    Examples
    --------
    >>> import numpy as np
    >>> p = np.array([[0.5, 1.0]]); t = np.array([[1, 0]])
    >>> float(estimate(p, t, 2, "exp-linear")[0])
    0.25
    """
    validate_staleness(model)
    p0 = obs_p[:, 0]
    out = np.where(obs_t[:, 0] >= 0, p0, np.inf)
    if model == "keep" or obs_p.shape[1] < 2:
        return out

    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(np.abs(obs_p))
        sign = np.sign(p0)
        dt = (step - obs_t[:, 0]).astype(np.float64)
        same_sign01 = (np.sign(obs_p[:, 1]) == sign) & (sign != 0)
        ok2 = (obs_t[:, 1] >= 0) & (obs_t[:, 0] > obs_t[:, 1]) & same_sign01
        slope = (logp[:, 0] - logp[:, 1]) / (obs_t[:, 0] - obs_t[:, 1])
        change = np.where(ok2, slope * dt, 0.0)

        if model == "exp-quadratic" and obs_p.shape[1] >= 3:
            ok3 = (
                ok2
                & (obs_t[:, 2] >= 0)
                & (obs_t[:, 1] > obs_t[:, 2])
                & (np.sign(obs_p[:, 2]) == sign)
            )
            # Newton's divided differences on (t0, t1, t2); evaluated at step.
            t0, t1, t2 = (obs_t[:, j].astype(np.float64) for j in range(3))
            d01 = slope
            d12 = (logp[:, 1] - logp[:, 2]) / (t1 - t2)
            d012 = (d01 - d12) / (t0 - t2)
            quad = d01 * dt + d012 * dt * (step - t1)
            change = np.where(ok3, quad, change)

        change = np.clip(np.nan_to_num(change, nan=0.0), -_MAX_LOG_CHANGE, _MAX_LOG_CHANGE)
        fitted = sign * np.exp(logp[:, 0] + change)
    seen = obs_t[:, 0] >= 0
    return np.where(seen & np.isfinite(fitted), fitted, out)
