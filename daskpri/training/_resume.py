"""A run's checkpoint: what :meth:`Trainer.save` writes and :meth:`Trainer.resume` reads.

The state written (model, optimizer, table, strategy, the trainer's
parameters, the history), the trainer rebuilt from it, and the optimizer
state reshaped to the parameters it is loaded into.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import torch
from distributed import Client
from torch import nn

from daskpri.models import from_spec
from daskpri.strategies import STRATEGIES, get_strategy
from daskpri.training import checkpoint

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

#: The constructor's parameters besides the model and strategy, as a
#: checkpoint keeps them for :meth:`Trainer.resume`.
INIT_PARAMS = (
    "seed", "n_workers", "resources", "batch_size", "learning_rate", "momentum",
    "weight_decay", "max_grad_norm", "optimizer", "lr_schedule", "schedule_steps", "local_steps",
    "eval_every", "partition_size", "staleness", "device", "checkpoint_path", "checkpoint_every",
    "transport", "on_nonfinite",
)


def init_params(trainer: Trainer) -> dict[str, Any]:
    """``trainer``'s :data:`INIT_PARAMS` by name, as its checkpoint keeps them."""
    return {name: getattr(trainer, name) for name in INIT_PARAMS}


def checkpoint_state(trainer: Trainer) -> dict[str, Any]:
    """The whole run, as :meth:`Trainer.save` writes it (the table read from the scheduler)."""
    assert trainer._opt is not None
    return {
        "step": trainer.step_,
        "elapsed": trainer._elapsed,
        # placing data, building replicas, warm-ups so far (not in elapsed)
        "setup_time": trainer._setup_time,
        "model": trainer.model.state_dict(),
        "model_spec": getattr(trainer.model, "spec", None),
        "optimizer": trainer._opt.state_dict(),
        "mean_grad": trainer._mean_grad,
        "strategy": {"name": trainer.strategy.name,
                     # numpy scalars as Python numbers: the file is read weights-only
                     "params": {k: v.item() if isinstance(v, np.generic) else v
                                for k, v in trainer.strategy.get_params().items()}},
        "trainer": init_params(trainer),
        "table": checkpoint.to_storable(trainer._remote.state_dict()),
        "history": trainer._recorder.records,
    }


def resume_trainer(
    cls: type[Trainer],
    path: str | os.PathLike[str],
    model: nn.Module | None,
    client: Client | None,
    overrides: dict[str, Any],
) -> Trainer:
    """The body of :meth:`Trainer.resume`: a ``cls`` going on from the checkpoint at ``path``."""
    # the rest of the constructor's arguments shape the run itself: changed,
    # the resumed run would not be the checkpointed one going on
    may_change = ("n_workers", "resources", "device", "transport", "eval_every",
                  "on_nonfinite", "security", "checkpoint_path", "checkpoint_every",
                  "schedule_steps")
    fixed = sorted(set(overrides) - set(may_change))
    if fixed:
        raise ValueError(
            f"resume takes overrides of {', '.join(may_change)}, but got "
            f"{', '.join(fixed)}: the checkpoint fixes the run's strategy and its options, "
            "seed and optimization; start a new Trainer to change them"
        )
    state = checkpoint.read(path)
    if model is None:
        if state["model_spec"] is None:
            raise ValueError(
                "the checkpoint's model is not a built-in one: pass model=, a module of "
                "the same architecture"
            )
        model = from_spec(state["model_spec"])
    elif not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model should be a torch.nn.Module of the checkpoint's architecture, but got "
            f"{type(model).__name__} {model!r}"
        )
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise ValueError(f"model does not match the checkpoint's architecture: {e}") from None
    params = dict(state["trainer"], **overrides)
    if "checkpoint_path" not in overrides and params.get("checkpoint_path") is not None:
        # A run that checkpointed goes on checkpointing, to the file the user named
        # here: never to a path the file itself names (a copied or downloaded
        # checkpoint would otherwise write over whatever that path holds).
        params["checkpoint_path"] = os.fspath(path)
    name = state["strategy"]["name"]
    if name not in STRATEGIES:
        raise ValueError(
            f"the checkpoint's strategy {name!r} is not registered in this process: "
            f"define its class and decorate it with daskpri.register_strategy (with "
            f"name = {name!r}) before resuming"
        )
    strategy = get_strategy(name, **state["strategy"]["params"])
    # the run's own clipping: None there is none, whatever the config says now
    # (a checkpoint from before the option has none)
    with dask.config.set({"daskpri.trainer.max-grad-norm": None}):
        trainer = cls(model, strategy=strategy, client=client, **params)
    trainer.step_ = int(state["step"])
    trainer._elapsed = float(state["elapsed"])
    trainer._setup_time = float(state.get("setup_time", 0.0))  # (not in older ones)
    trainer._recorder.records = list(state["history"])
    trainer._metrics_sent = len(trainer._recorder.records)  # not sent again
    trainer._resume_state = {
        "optimizer": state["optimizer"],
        "mean_grad": state["mean_grad"],
        "table": checkpoint.from_storable(state["table"]),
    }
    return trainer


def state_shaped_like_params(opt: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an optimizer's state dict) with each buffer shaped as its parameter.

    A buffer of the parameter's size in another shape (a 1-D `CNN`'s
    momentum, ``(out, in, k)``, saved before its convolutions ran as 2-D
    ones, ``(out, in, 1, k)``) takes the parameter's shape, its values in
    the same order; ``load_state_dict`` would keep the saved shape, and the
    first step would fail.
    """
    params = [p for group in opt.param_groups for p in group["params"]]
    ids = [i for group in state["param_groups"] for i in group["params"]]
    if len(ids) != len(params):
        return state  # load_state_dict says what is wrong
    shape = {i: p.shape for i, p in zip(ids, params, strict=True)}

    def shaped(i: Any, value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and i in shape
            and value.dim() > 0
            and value.shape != shape[i]
            and value.numel() == math.prod(shape[i])
        ):
            return value.reshape(shape[i])
        return value

    return {
        **state,
        "state": {i: {k: shaped(i, v) for k, v in s.items()} for i, s in state["state"].items()},
    }
