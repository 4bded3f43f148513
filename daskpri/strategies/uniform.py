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
        size = self.batch_size or ctx.batch_size
        return [Selection(train=epoch_batches(ctx, s, size)) for s in range(len(ctx.groups))]

    def select_round(self, ctx: SelectContext, count: int) -> TrainRound | None:
        batches = epoch_rounds(ctx, self.batch_size or ctx.batch_size, count)
        return None if batches is None else TrainRound(batches)
