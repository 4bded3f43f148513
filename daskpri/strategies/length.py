"""``length``: priority = squared norm of the per-sample gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from daskpri.strategies.projection import Projection

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch


class Length(Projection):
    """Top-k by ``||g_i||^2``, otherwise as :class:`Projection`.

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
        Taken as :class:`Projection` takes it; the squared norm does not
        use the mean gradient.

    Examples
    --------
    >>> Length(k=16).name
    'length'
    """

    name = "length"
    uses_mean_grad = False
    needs_fresh_priorities = True

    def priorities(self, grads: torch.Tensor, mean_grad: torch.Tensor) -> torch.Tensor:
        """The squared norm ``||g_i||^2`` of each row of ``grads``.

        Parameters
        ----------
        grads : torch.Tensor, shape (n, n_params)
            Per-sample gradients, flat.
        mean_grad : torch.Tensor
            Not used.

        Returns
        -------
        torch.Tensor, shape (n,)
            The priorities.

        Examples
        --------
        >>> import torch
        >>> grads = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
        >>> Length().priorities(grads, torch.zeros(2))
        tensor([ 1., 25.])
        """
        return (grads * grads).sum(1)
