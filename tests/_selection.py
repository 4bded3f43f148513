"""Selection contexts on hand-made priority tables, and batches, for the strategies' tests."""

from __future__ import annotations

import numpy as np

from daskpri.strategies import SelectContext
from daskpri.strategies.base import Batch
from daskpri.table.table import PriorityTable


def make_ctx(sizes, owner, *, step=0, batch_size=4, seed=0, table=None, state=None):
    table = table or PriorityTable(sizes)
    ctx = SelectContext.local(table, batch_size, owner=owner, step=step, seed=seed)
    if state is not None:
        ctx.state = state
    return ctx


def _batch(x, y, n_train, weights=None, mean_grad=None):
    return Batch(
        x=x,
        y=y,
        indices=np.arange(x.shape[0]),
        n_train=n_train,
        weights=weights,
        mean_grad=mean_grad,
        extra={},
        seed=np.random.default_rng(0),
    )
