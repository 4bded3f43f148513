"""``selective-backprop``: backpropagate the high-loss part of a larger batch."""

from __future__ import annotations

import math

import numpy as np
import torch

from daskpri.replicas.replica import Replica
from daskpri.strategies.base import (
    Batch,
    Computed,
    SelectContext,
    Selection,
    Strategy,
    check_fraction,
    check_number,
    check_positive_int,
    epoch_batches,
)


def keep_top_fraction(losses: np.ndarray, fraction: float) -> np.ndarray:
    """Rows of the ``ceil(fraction * n)`` highest losses, in row order.

    Examples
    --------
    >>> keep_top_fraction(np.array([0.1, 0.9, 0.5, 0.2]), 0.5).tolist()
    [1, 2]
    """
    n = losses.size
    keep = min(n, max(1, math.ceil(fraction * n)))
    return np.sort(np.argsort(-losses, kind="stable")[:keep])


def keep_by_cdf(
    losses: np.ndarray, reference: np.ndarray, beta: float, rng: np.random.Generator
) -> np.ndarray:
    """Rows kept with probability ``CDF(L)^beta`` (Jiang et al. 2019).

    ``reference`` is a sorted sample of recent losses that defines the CDF.
    """
    if reference.size == 0:
        cdf = np.ones_like(losses)
    else:
        cdf = np.searchsorted(reference, losses, side="right") / reference.size
    return np.flatnonzero(rng.random(losses.size) < cdf**beta)


class SelectiveBackprop(Strategy):
    """Forward a larger candidate batch, backpropagate its high-loss samples.

    Each worker draws ``batch_size / fraction`` candidates in a shuffled pass
    over its data, computes their losses (forward only; they all become
    priorities) and backpropagates either the top ``fraction`` by loss
    (``beta=None``), or each candidate with probability ``CDF(L)^beta``, the
    CDF taken over the table's recent losses (Jiang et al. 2019).

    Parameters
    ----------
    fraction : float
        Fraction of the candidates backpropagated, in (0, 1].
    beta : float, optional
        Selectivity of the probabilistic rule; ``None`` keeps the top fraction.
    batch_size : int, optional
        Samples backpropagated per worker per step (in expectation with
        ``beta``); ``None`` takes the trainer's.

    Examples
    --------
    >>> SelectiveBackprop(fraction=0.5).name
    'selective-backprop'
    """

    name = "selective-backprop"

    def __init__(
        self, fraction: float = 0.5, beta: float | None = None, batch_size: int | None = None
    ) -> None:
        self.fraction = check_fraction("fraction", fraction, low_open=True)
        self.beta = None if beta is None else check_number("beta", beta, 0.0, low_open=True)
        self.batch_size = check_positive_int("batch_size", batch_size)

    def select(self, ctx: SelectContext) -> list[Selection]:
        size = self.batch_size or ctx.batch_size
        keep = self.fraction if self.beta is None else 1.0 / (self.beta + 1.0)
        n_cand = math.ceil(size / keep)
        extra: dict[str, np.ndarray] = {}
        if self.beta is not None:
            seen = ctx.table.version >= 0
            losses = ctx.table.current[seen]
            if losses.size > 1024:
                losses = ctx.rng.choice(losses, 1024, replace=False)
            extra["reference"] = np.sort(losses)
        return [
            Selection(train=epoch_batches(ctx, s, n_cand), extra=extra)
            for s in range(len(ctx.groups))
        ]

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        losses, logits = replica.losses(batch.x, batch.y)
        loss_np = losses.cpu().numpy().astype(np.float64)
        if self.beta is None:
            rows = keep_top_fraction(loss_np, self.fraction)
        else:
            rows = keep_by_cdf(loss_np, batch.extra["reference"], self.beta, batch.rng)
        if rows.size:
            sel = torch.as_tensor(rows, device=batch.x.device)
            grad, _, _ = replica.weighted_grad(batch.x[sel], batch.y[sel], None)
        else:
            grad = torch.zeros(replica.n_params, device=batch.x.device)
        return Computed(
            grad=grad,
            n_grad=int(rows.size),
            rows=np.arange(batch.x.shape[0]),
            priorities=loss_np,
            loss_sum=float(loss_np.sum()),
            n_loss=int(loss_np.size),
            correct=int((logits.argmax(1) == batch.y).sum()),
        )
