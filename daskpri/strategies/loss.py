"""``loss``: sample proportionally to the last loss, with importance weights."""

from __future__ import annotations

import math

import numpy as np

from daskpri.strategies._checks import check_fraction, check_positive_int
from daskpri.strategies._walk import round_robin
from daskpri.strategies.base import Strategy
from daskpri.strategies.selection import SelectContext, Selection


def sampling_probabilities(priorities: np.ndarray, epsilon: float) -> np.ndarray:
    """``p = (1 - epsilon) L / sum(L) + epsilon / N`` for losses ``L >= 0``.

    Unseen samples (``+inf``) get the largest seen loss (1 when none is seen);
    if every loss is zero the distribution is uniform.

    Parameters
    ----------
    priorities : numpy.ndarray
        The last losses ``L`` of the ``N`` samples (``+inf``: unseen).
    epsilon : float
        Weight of the uniform component, in [0, 1].

    Returns
    -------
    numpy.ndarray of float64
        The probability of each sample; they sum to 1.

    Raises
    ------
    ValueError
        If a loss is negative.

    Examples
    --------
    >>> sampling_probabilities(np.array([1.0, 3.0]), 0.0).tolist()
    [0.25, 0.75]
    """
    loss = np.asarray(priorities, dtype=np.float64)
    unseen = np.isposinf(loss)
    if unseen.any():
        fill = loss[~unseen].max() if (~unseen).any() else 1.0
        loss = np.where(unseen, fill, loss)
    if (loss < 0).any():
        raise ValueError(f"loss priorities should be non-negative, but got {float(loss.min())}")
    n = loss.size
    total = loss.sum()
    if total <= 0:
        return np.full(n, 1.0 / n)
    return (1.0 - epsilon) * loss / total + epsilon / n


def importance_sample(
    p: np.ndarray, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``size`` positions with replacement from ``p``; weights ``1/(N p)``.

    ``mean(w_i * g_i)`` over the draws is an unbiased estimate of the mean of
    ``g`` over all ``N`` positions.

    Parameters
    ----------
    p : numpy.ndarray
        Probabilities of the ``N`` positions (summing to 1).
    size : int
        Number of draws.
    rng : numpy.random.Generator
        The generator to draw from.

    Returns
    -------
    positions : numpy.ndarray of int
        The positions drawn, in draw order (a position may repeat).
    weights : numpy.ndarray of float64
        Their importance weights ``1 / (N p)``.

    Examples
    --------
    >>> pos, w = importance_sample(np.array([0.5, 0.25, 0.25]), 4, np.random.default_rng(0))
    >>> pos.tolist(), [round(x, 3) for x in w.tolist()]
    ([1, 0, 0, 0], [1.333, 0.667, 0.667, 0.667])
    """
    pos = rng.choice(p.size, size=size, replace=True, p=p)
    return pos, 1.0 / (p.size * p[pos])


class Loss(Strategy):
    """Loss-proportional sampling mixed with uniform, importance-weighted.

    Samples are drawn over the whole dataset with
    ``p = (1 - epsilon) L / sum(L) + epsilon / N`` (``L``: the last computed
    loss, the largest one for unseen samples) and weighted ``1 / (N p)``, so
    the combined gradient is an unbiased estimate of the full gradient. Each
    draw is processed by the worker holding it, so a worker's share of a
    step's draws varies; in a round of local steps a worker divides its
    weighted sum by the draws it expects (``batch_size``), not by those it
    got, so that the workers' mean after a step is that same estimate.
    ``renew`` refreshes a round-robin fraction of each worker's losses with
    a forward pass.

    Parameters
    ----------
    epsilon : float
        Weight of the uniform component, in (0, 1]; it bounds the weights by
        ``1 / epsilon``.
    renew : float
        Fraction of each worker's samples whose loss is recomputed per step.
    batch_size : int, optional
        Draws per worker per step; ``None`` takes the trainer's.

    Examples
    --------
    >>> Loss(epsilon=0.5)
    Loss(epsilon=0.5, renew=0.0, batch_size=None)
    """

    name = "loss"
    unbiased = True
    draws_globally = True

    def __init__(
        self, epsilon: float = 0.2, renew: float = 0.0, batch_size: int | None = None
    ) -> None:
        self.epsilon = check_fraction("epsilon", epsilon, low_open=True)
        self.renew = check_fraction("renew", renew)
        self.batch_size = check_positive_int("batch_size", batch_size)

    def select(self, ctx: SelectContext) -> list[Selection]:
        """Importance-sampled draws over the whole table, each sent to its worker.

        ``batch_size`` draws per slot (with replacement) by
        :func:`sampling_probabilities` of the estimated priorities, each to
        the slot holding it, with its weight; plus each slot's ``renew``
        samples to score.

        Takes and returns what :meth:`Strategy.select` does.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> ctx.table.update(np.arange(8), np.arange(8.0), step=0)
        >>> ctx.step = 1
        >>> selections = Loss(epsilon=0.5).select(ctx)
        >>> [s.train.tolist() for s in selections]  # a worker's share varies
        [[0, 0, 3], [5]]
        >>> [round(w, 3) for w in selections[0].weights.tolist()]
        [2.0, 2.0, 1.077]
        """
        n_slots = len(ctx.groups)
        draws = (self.batch_size or ctx.batch_size) * n_slots
        est = ctx.table.estimate(ctx.step)
        p = sampling_probabilities(est, self.epsilon)
        idx, w = importance_sample(p, draws, ctx.rng)
        order = np.argsort(idx, kind="stable")
        idx, w = idx[order], w[order]
        slot = ctx.owner_of(idx)
        out = []
        for s, group in enumerate(ctx.groups):
            mine = slot == s
            renew = round_robin(ctx, s, math.ceil(self.renew * group.size))
            out.append(Selection(train=idx[mine], weights=w[mine], score=renew))
        return out
