"""``length``: priority = squared norm of the per-sample gradient."""

from __future__ import annotations

import torch

from daskpri.strategies.projection import Projection


class Length(Projection):
    """Top-k by ``||g_i||^2``, otherwise as :class:`Projection`.

    Examples
    --------
    >>> Length(k=16).name
    'length'
    """

    name = "length"
    uses_mean_grad = False
    needs_fresh_priorities = True

    def priorities(self, grads: torch.Tensor, mean_grad: torch.Tensor) -> torch.Tensor:
        return (grads * grads).sum(1)
