"""``projection``: the paper's default, priority = g_i . g_bar."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from daskpri.strategies._checks import check_bool, check_fraction, check_positive_int
from daskpri.strategies._walk import round_robin
from daskpri.strategies.base import Batch, Computed, Strategy
from daskpri.strategies.selection import SelectContext, Selection

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch

    from daskpri.replicas.replica import Replica


class Projection(Strategy):
    """Top-k by the projection of each sample's gradient on the mean gradient.

    Each step, each worker takes its ``k`` samples of highest (estimated)
    priority plus a round-robin ``renew`` fraction of its samples, whose
    priorities are recomputed exactly. Per-sample gradients come from
    :func:`torch.func.vmap`; the priority of sample ``i`` is ``g_i . g_bar``,
    with ``g_bar`` the driver's running mean of recent gradients (the batch's
    own mean gradient before there is one). No importance weights.

    Parameters
    ----------
    k : int, optional
        Top-k samples per worker per step; ``None`` takes the trainer's
        ``batch_size``.
    renew : float
        Fraction of each worker's samples renewed per step, in [0, 1].
    train_on_renew : bool
        Whether the renewed samples' gradients (computed anyway) also enter
        the update.
    mean_grad_decay : float
        Decay of the running mean gradient, in [0, 1).

    Examples
    --------
    >>> Projection(k=32, renew=0.01)
    Projection(k=32, renew=0.01, train_on_renew=True, mean_grad_decay=0.9)
    """

    name = "projection"
    uses_mean_grad = True
    needs_fresh_priorities = True
    per_sample_grads = True

    def __init__(
        self,
        k: int | None = None,
        renew: float = 0.01,
        train_on_renew: bool = True,
        mean_grad_decay: float = 0.9,
    ) -> None:
        self.k = check_positive_int("k", k)
        self.renew = check_fraction("renew", renew)
        self.train_on_renew = check_bool("train_on_renew", train_on_renew)
        self.mean_grad_decay = check_fraction("mean_grad_decay", mean_grad_decay, high_open=True)

    def select(self, ctx: SelectContext) -> list[Selection]:
        """Each slot's ``k`` samples of highest estimated priority and its ``renew`` samples.

        The renewed samples (round-robin, in index order) are left out of the
        top-k; with ``train_on_renew`` they train too, else they are only
        scored.

        Takes and returns what :meth:`Strategy.select` does.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> ctx.table.update(np.arange(8), np.arange(8.0), step=0)
        >>> ctx.step = 1
        >>> [s.train.tolist() for s in Projection(k=1, renew=0.25).select(ctx)]
        [[0, 3], [4, 7]]
        >>> s = Projection(k=1, renew=0.25, train_on_renew=False).select(ctx)[0]
        >>> s.train.tolist(), s.score.tolist()
        ([3], [1])
        """
        k = self.k or ctx.batch_size
        out = []
        for slot, group in enumerate(ctx.groups):
            renew = round_robin(ctx, slot, math.ceil(self.renew * group.size))
            top = ctx.table.topk(k, ctx.candidates(slot), ctx.step, ctx.rng, exclude=renew)
            if self.train_on_renew:
                out.append(Selection(train=np.sort(np.concatenate([top, renew]))))
            else:
                out.append(Selection(train=top, score=renew))
        return out

    def gradients_per_step(self, batch_size: int, samples: int) -> int:
        """``k``, plus the renewed samples where they train (``train_on_renew``).

        Parameters
        ----------
        batch_size : int
            The trainer's batch size (``k`` where it is ``None``).
        samples : int
            The samples the worker holds.

        Returns
        -------
        int
            Samples the worker backpropagates per step.

        Examples
        --------
        >>> Projection(renew=0.01).gradients_per_step(64, 8000)
        144
        >>> Projection(renew=0.01, train_on_renew=False).gradients_per_step(64, 8000)
        64
        """
        k = self.k or batch_size
        return k + math.ceil(self.renew * samples) if self.train_on_renew else k

    def priorities(self, grads: torch.Tensor, mean_grad: torch.Tensor) -> torch.Tensor:
        """Priority of each row of the per-sample gradients ``grads``.

        Here ``g_i . g_bar``; subclasses (:class:`Length`) score otherwise.

        Parameters
        ----------
        grads : torch.Tensor, shape (n, n_params)
            Per-sample gradients, flat.
        mean_grad : torch.Tensor, shape (n_params,)
            The mean gradient ``g_bar``.

        Returns
        -------
        torch.Tensor, shape (n,)
            The priorities.

        Examples
        --------
        >>> import torch
        >>> grads = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
        >>> Projection().priorities(grads, torch.tensor([1.0, 1.0]))
        tensor([1., 7.])
        """
        return grads @ mean_grad

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        """Per-sample gradients of every row; the train rows' sum, every row's priority.

        The priorities are :meth:`priorities` against the batch's
        ``mean_grad``, or the train rows' mean gradient where there is none
        yet (all rows' where none trains).

        Parameters
        ----------
        replica : Replica
            The worker's copy of the model.
        batch : Batch
            The selected samples.

        Returns
        -------
        Computed
            The gradient sum of the train rows and the priorities of all rows.

        Examples
        --------
        >>> import numpy as np, torch
        >>> from daskpri.models import MLP
        >>> from daskpri.replicas.replica import Replica
        >>> from daskpri.strategies import Batch
        >>> replica = Replica(MLP((4,), 3, hidden=8), "cpu")
        >>> batch = Batch(x=torch.linspace(-1, 1, 20).reshape(5, 4),
        ...               y=torch.tensor([0, 1, 2, 0, 1]), indices=np.arange(5), n_train=3,
        ...               weights=None, mean_grad=None, extra={}, seed=[0])
        >>> out = Projection().compute(replica, batch)
        >>> out.grad.shape, out.n_grad, out.rows.tolist(), out.priorities.shape
        (torch.Size([67]), 3, [0, 1, 2, 3, 4], (5,))
        """
        grads, losses, logits = replica.per_sample_grads(batch.x, batch.y)
        n = batch.n_train
        mean_grad = batch.mean_grad
        if mean_grad is None or not bool(mean_grad.any()):
            mean_grad = grads[:n].mean(0) if n else grads.mean(0)
        prio = self.priorities(grads, mean_grad.to(grads.device))
        return Computed(
            grad=grads[:n].sum(0),
            n_grad=n,
            rows=np.arange(batch.x.shape[0]),
            priorities=prio.cpu().numpy().astype(np.float64),
            loss_sum=float(losses[:n].sum()),
            n_loss=n,
            correct=int((logits[:n].argmax(1) == batch.y[:n]).sum()),
        )
