"""``uniform``: the mini-batch SGD baseline."""

from __future__ import annotations

from daskpri.strategies._checks import check_positive_int
from daskpri.strategies._walk import epoch_batches, epoch_rounds
from daskpri.strategies.base import Strategy
from daskpri.strategies.selection import SelectContext, Selection, TrainRound


class Uniform(Strategy):
    """Mini-batch SGD: each worker walks a shuffled pass over its samples.

    The losses of the processed samples are recorded as priorities (they come
    free with the forward pass), so the table shows the loss distribution.

    Parameters
    ----------
    batch_size : int, optional
        Samples per worker per step; ``None`` takes the trainer's.

    Examples
    --------
    >>> Uniform()
    Uniform(batch_size=None)
    """

    name = "uniform"
    unbiased = True
    reads_table = False

    def __init__(self, batch_size: int | None = None) -> None:
        self.batch_size = check_positive_int("batch_size", batch_size)

    def select(self, ctx: SelectContext) -> list[Selection]:
        """The next ``batch_size`` samples of each slot's shuffled pass, unweighted.

        Takes and returns what :meth:`Strategy.select` does.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> [s.train.tolist() for s in Uniform().select(ctx)]
        [[0, 2], [6, 7]]
        """
        size = self.batch_size or ctx.batch_size
        return [Selection(train=epoch_batches(ctx, s, size)) for s in range(len(ctx.groups))]

    def select_round(self, ctx: SelectContext, count: int) -> TrainRound | None:
        """The next ``count`` steps of :meth:`select` at once, as a :class:`TrainRound`.

        ``None`` (step by step) until every slot's walk is under way, or
        where a slot holds fewer samples than a batch.

        Parameters
        ----------
        ctx : SelectContext
            As for :meth:`select`, at the round's first step.
        count : int
            Steps in the round.

        Returns
        -------
        TrainRound or None
            ``count`` steps of one :class:`Selection` per slot, or ``None``.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> strategy = Uniform()
        >>> strategy.select_round(ctx, 4) is None
        True
        >>> _ = strategy.select(ctx)
        >>> steps = strategy.select_round(ctx, 4)
        >>> len(steps), steps.n_slots, [s.train.tolist() for s in steps[0]]
        (4, 2, [[1, 3], [4, 5]])
        """
        batches = epoch_rounds(ctx, self.batch_size or ctx.batch_size, count)
        return None if batches is None else TrainRound(batches)
