"""The optimizer on both sides: the driver's, and the workers' during local steps.

With ``local_steps > 1`` each worker takes several optimizer steps on its
own samples per round (local SGD, Lin et al. 2020, "Don't use large
mini-batches, use local SGD"); the driver then takes the mean of the
workers' parameters and of their optimizer states (momentum buffers, Adam's
moments), so all the state lives on the driver between rounds and is
checkpointed with it. With one worker a round is exactly that many steps of
the plain optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from daskpri.replicas._numpy_tensors import TensorsAsNumpy
from daskpri.replicas.replica import flat_views


@dataclass
class LocalSteps(TensorsAsNumpy):
    """Several optimizer steps on the worker in one round (local SGD).

    The worker builds the driver's optimizer over its replica, loads
    ``state`` (the driver's, averaged over the workers after each round) and
    takes one step per share, at ``rates[i]``, its gradient clipped to
    ``max_grad_norm`` where that is set. With one worker the driver's
    state after a round is the worker's own: the worker keeps it (``keep``)
    and the next round starts from it (``resume``), so the parameters and
    optimizer state travel one way per round, not both.
    """

    optimizer: str
    options: dict[str, Any]
    state: dict[str, Any]
    rates: list[float]
    #: keep the replica's state after the round under this name (one worker:
    #: the driver's state is then the worker's, and need not travel back)
    keep: str | None = None
    #: start from the state kept under this name instead: ``state`` is empty
    #: and the weights carry no parameters
    resume: str | None = None
    #: clip each step's gradient to this L2 norm (``None``: no clipping)
    max_grad_norm: float | None = None
    #: divide a step's weighted gradient sum by this many rows, the draws a
    #: worker expects per step, where the strategy draws over the whole dataset
    #: (``Strategy.draws_globally``); ``None``: by the rows trained
    rows_per_step: int | None = None


def make_optimizer(
    kind: str, params: list[torch.nn.Parameter], options: Mapping[str, Any]
) -> torch.optim.Optimizer:
    """The trainer's optimizer (``"sgd"``, ``"adam"`` or ``"adamw"``) over ``params``."""
    if kind == "adam":
        return torch.optim.Adam(params, **options)
    if kind == "adamw":  # weight decay decoupled from the moments (Loshchilov & Hutter)
        return torch.optim.AdamW(params, **options)
    return torch.optim.SGD(params, **options)


def set_flat_grad(params: list[torch.nn.Parameter], grad: torch.Tensor) -> None:
    """Give ``params`` the gradient ``grad`` (flat, in their order).

    A frozen parameter (``requires_grad=False``) gets none, whatever
    ``grad`` holds for it: the optimizer then leaves it as it is (no weight
    decay, no momentum), and clipping does not count it, as in PyTorch.

    Examples
    --------
    >>> frozen, trained = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))
    >>> _ = frozen.requires_grad_(False)
    >>> set_flat_grad([frozen, trained], torch.tensor([1.0, 2.0, 3.0]))
    >>> frozen.grad, trained.grad
    (None, tensor([3.]))
    """
    # views: ``grad`` is the step's own tensor, not used after this
    for p, view in zip(params, flat_views(grad, params), strict=True):
        p.grad = view.to(p.dtype) if p.requires_grad else None


def average_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of optimizer ``state_dict()``s of the same optimizer.

    Floating tensors are averaged; anything else (step counts, the param
    groups) is taken from the first.

    Examples
    --------
    >>> p = [torch.nn.Parameter(torch.zeros(2))]
    >>> states = []
    >>> for g in (1.0, 3.0):
    ...     opt = torch.optim.SGD(p, lr=0.1, momentum=0.9)
    ...     p[0].grad = torch.full((2,), g)
    ...     opt.step()
    ...     states.append(opt.state_dict())
    >>> average_states(states)["state"][0]["momentum_buffer"].tolist()
    [2.0, 2.0]
    """
    first = states[0]
    out = {"state": {}, "param_groups": first["param_groups"]}
    for key, entry in first["state"].items():
        avg = {}
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim:
                avg[name] = torch.stack([s["state"][key][name] for s in states]).mean(0)
            else:
                avg[name] = value
        out["state"][key] = avg
    return out
