"""``infobatch``: prune well-learned samples each epoch, rescale the kept ones.

Qin et al. (ICLR 2024), "InfoBatch: Lossless Training Acceleration by
Unbiased Dynamic Data Pruning".
"""

from __future__ import annotations

import numpy as np

from daskpri.strategies._checks import check_fraction, check_positive_int
from daskpri.strategies.base import Strategy
from daskpri.strategies.selection import SelectContext, Selection


def prune_epoch(
    losses: np.ndarray,
    prune: float,
    rng: np.random.Generator,
    threshold: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions kept for one epoch, shuffled, and their weights.

    Each position whose loss is below ``threshold`` (by default the mean of
    the finite ``losses``) is dropped with probability ``prune`` and weighted
    ``1 / (1 - prune)`` when kept; the others (unseen samples, ``+inf``,
    among them) are kept with weight 1.

    Parameters
    ----------
    losses : numpy.ndarray
        The last loss of each position (``+inf``: unseen).
    prune : float
        Probability that a low-loss position is dropped, in [0, 1).
    rng : numpy.random.Generator
        Draws the drops and the shuffle.
    threshold : float, optional
        Losses below it are low; ``None``: the mean of the finite losses.

    Returns
    -------
    keep : numpy.ndarray of int
        The positions kept, shuffled.
    weights : numpy.ndarray of float64
        Their weights, in the same order.

    Examples
    --------
    >>> keep, w = prune_epoch(np.array([0.1, 5.0, np.inf]), 0.0, np.random.default_rng(0))
    >>> sorted(keep.tolist()), w.tolist()
    ([0, 1, 2], [1.0, 1.0, 1.0])
    """
    loss = np.asarray(losses, dtype=np.float64)
    seen = np.isfinite(loss)
    low = np.zeros(loss.size, dtype=bool)
    if prune > 0 and seen.any():
        cut = loss[seen].mean() if threshold is None else threshold
        low[seen] = loss[seen] < cut
    # Independent drops keep the weighted sum exactly unbiased; the authors'
    # code keeps int((1 - r) n) of the n low-loss samples instead.
    kept = ~low | (rng.random(loss.size) >= prune)
    keep = rng.permutation(np.flatnonzero(kept))
    weights = np.where(low[keep], 1.0 / (1.0 - prune), 1.0)
    return keep, weights


def _seen_mean(ctx: SelectContext) -> float | None:
    """The mean of every seen loss in the table; ``None`` when none is seen."""
    current = np.asarray(ctx.table.current, dtype=np.float64)
    seen = current[np.isfinite(current)]
    return float(seen.mean()) if seen.size else None


class InfoBatch(Strategy):
    """Prune low-loss samples at each epoch, upweight those kept (InfoBatch).

    At the start of each epoch of a worker's data, the samples whose last
    loss is below the mean of all the seen losses in the table (the whole
    dataset's, as the paper's sampler, which gathers every rank's scores,
    computes it) are each dropped with
    probability ``prune``; the low-loss samples kept are weighted
    ``1 / (1 - prune)``, the others 1, so the epoch's gradient stays an
    unbiased estimate of the full one. The worker then walks the kept samples
    shuffled, ``batch_size`` at a time: an epoch takes fewer steps, which is
    the saving. Unseen samples are never pruned. From epoch
    ``anneal * epochs`` on, every epoch is a full unweighted pass (the paper's
    annealing); with ``epochs=None`` pruning never stops. Epochs are counted
    per worker, over its own data. Losses come back as priorities with the
    forward pass of each step (Qin et al. 2024).

    Parameters
    ----------
    prune : float
        Probability that a low-loss sample is left out of an epoch, in [0, 1).
    anneal : float
        Fraction of ``epochs`` after which pruning stops, in [0, 1].
    epochs : int, optional
        The planned number of epochs; ``None`` never anneals.
    batch_size : int, optional
        Samples per worker per step; ``None`` takes the trainer's.

    Examples
    --------
    >>> InfoBatch(epochs=8)
    InfoBatch(prune=0.5, anneal=0.875, epochs=8, batch_size=None)
    """

    name = "infobatch"
    unbiased = True

    def __init__(
        self,
        prune: float = 0.5,
        anneal: float = 0.875,
        epochs: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.prune = check_fraction("prune", prune, high_open=True)
        self.anneal = check_fraction("anneal", anneal)
        self.epochs = check_positive_int("epochs", epochs)
        self.batch_size = check_positive_int("batch_size", batch_size)

    def pruning(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (counted from 0) is pruned.

        Parameters
        ----------
        epoch : int
            A worker's epoch, counted from 0.

        Returns
        -------
        bool
            ``True`` while ``epoch < anneal * epochs`` (always, with
            ``epochs=None``), unless ``prune`` is 0.

        Examples
        --------
        >>> strategy = InfoBatch(epochs=8)
        >>> strategy.pruning(6), strategy.pruning(7)
        (True, False)
        """
        # The authors' sampler prunes while epoch <= anneal * epochs; we stop
        # at epoch >= anneal * epochs, so ``anneal=1`` prunes every planned epoch.
        return self.prune > 0 and (self.epochs is None or epoch < self.anneal * self.epochs)

    def _start_epoch(self, ctx: SelectContext, slot: int) -> None:
        group = ctx.groups[slot]
        epoch = int(ctx.state.setdefault("epochs", {}).setdefault(slot, 0))
        if self.pruning(epoch):
            walk, weights = prune_epoch(
                ctx.table.current[group], self.prune, ctx.rng, threshold=_seen_mean(ctx)
            )
        else:
            walk, weights = ctx.rng.permutation(group.size), np.ones(group.size)
        # Positions in the group, as epoch_batches keeps them.
        ctx.state.setdefault("walk", {})[slot] = walk
        ctx.state.setdefault("walk_weights", {})[slot] = weights
        ctx.state.setdefault("walk_pos", {})[slot] = 0
        ctx.state.setdefault("walk_size", {})[slot] = int(group.size)

    def _next(self, ctx: SelectContext, slot: int, size: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``size`` samples of ``slot``'s pruned epochs, and their weights."""
        group = ctx.groups[slot]
        if group.size == 0:
            return np.empty(0, dtype=np.int64), np.empty(0)
        if ctx.state.get("walk_size", {}).get(slot) != group.size:
            self._start_epoch(ctx, slot)
        state = ctx.state
        take = min(size, group.size)
        pos_out, w_out = [], []
        while take > 0:
            walk, pos = state["walk"][slot], int(state["walk_pos"][slot])
            if pos >= walk.size:
                state["epochs"][slot] = int(state["epochs"][slot]) + 1
                self._start_epoch(ctx, slot)
                continue
            n = min(take, walk.size - pos)
            pos_out.append(walk[pos : pos + n])
            w_out.append(state["walk_weights"][slot][pos : pos + n])
            state["walk_pos"][slot] = pos + n
            take -= n
        idx = group[np.concatenate(pos_out)]
        w = np.concatenate(w_out)
        order = np.argsort(idx, kind="stable")
        return idx[order], w[order]

    def select(self, ctx: SelectContext) -> list[Selection]:
        """The next ``batch_size`` samples of each slot's pruned epoch, with their weights.

        A slot whose epoch is spent begins the next: it prunes afresh from
        the table's losses (:func:`prune_epoch`), or, once annealed, keeps
        every sample with weight 1.

        Takes and returns what :meth:`Strategy.select` does.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2, seed=1)
        >>> ctx.table.update(np.arange(8), np.array([0.1] * 4 + [5.0] * 4), step=0)
        >>> ctx.step = 1
        >>> [(s.train.tolist(), s.weights.tolist()) for s in InfoBatch(prune=0.5).select(ctx)]
        [([0, 3], [2.0, 2.0]), ([4, 5], [1.0, 1.0])]
        """
        size = self.batch_size or ctx.batch_size
        out = []
        for slot in range(len(ctx.groups)):
            idx, w = self._next(ctx, slot, size)
            out.append(Selection(train=idx, weights=w))
        return out
