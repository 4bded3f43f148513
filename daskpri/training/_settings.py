"""The trainer's settings: its constructor's arguments, checked, with the config's defaults.

:func:`set_arguments` is the checking half of :meth:`Trainer.__init__`: it
reads the ``daskpri`` config where an argument is ``None``, checks each value
at the boundary (:mod:`~daskpri.training._checks`) and sets it on the
trainer, in the order the arguments are checked.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distributed import Client
from distributed.security import Security
from torch import nn

from daskpri import _config

# each optimizer's default learning rate
from daskpri._choices import LEARNING_RATES as LEARNING_RATES
from daskpri._choices import PRECISIONS
from daskpri.strategies import STRATEGIES, Strategy, get_strategy, unknown_options
from daskpri.table.staleness import validate_staleness
from daskpri.training._checks import (
    check_checkpoint,
    check_choice,
    check_device,
    check_eval_every,
    check_float,
    check_int,
    check_local_steps,
    check_real,
    check_security,
    check_strategy_model,
    check_types,
)
from daskpri.training.placement import parse_resources
from daskpri.training.schedule import validate_schedule, validate_warmup

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

#: the largest seed: it travels to the scheduler and workers in msgpack
#: messages, and the command line and the datasets take no larger one
MAX_SEED = 2**32 - 1


def set_arguments(
    trainer: Trainer,
    model: nn.Module,
    strategy: str | Strategy,
    client: Client | None,
    seed: int,
    n_workers: int | None,
    resources: Mapping[str, float] | str | None,
    *,
    batch_size: int | None,
    learning_rate: float | None,
    momentum: float | None,
    weight_decay: float | None,
    max_grad_norm: float | None,
    label_smoothing: float | None,
    precision: str | None,
    optimizer: str | None,
    lr_schedule: str,
    schedule_steps: int | None,
    warmup_steps: int,
    local_steps: int,
    eval_every: int | None,
    partition_size: int | None,
    staleness: str | None,
    device: str | None,
    checkpoint_path: str | os.PathLike[str] | None,
    checkpoint_every: int | None,
    security: Security | bool | None,
    transport: str | None,
    on_nonfinite: str,
    strategy_options: dict[str, Any],
) -> None:
    """Check :class:`Trainer`'s arguments (see its docstring) and set them on ``trainer``."""
    check_types(model, client)
    trainer.model = model
    if isinstance(strategy, str) and strategy in STRATEGIES:
        # a misspelled Trainer argument lands among the strategy's options
        allowed, unknown = unknown_options(strategy, strategy_options)
        if unknown:
            raise ValueError(
                f"Trainer got {', '.join(unknown)}: neither a Trainer argument nor an "
                f"option of strategy {strategy!r} ({', '.join(allowed) or 'none'})"
            )
    trainer.strategy = get_strategy(strategy, **strategy_options)
    trainer.seed = check_int("seed", seed, minimum=0)
    if trainer.seed > MAX_SEED:  # as the command line's and the datasets' seeds
        raise ValueError(f"seed should be an integer in [0, {MAX_SEED}], but got seed={seed!r}")
    trainer.n_workers = (
        None if n_workers is None else check_int("n_workers", n_workers, minimum=1)
    )
    trainer.resources = parse_resources(resources)
    trainer.batch_size = check_int("batch_size", _config.get("trainer.batch-size", batch_size), 1)
    trainer.momentum = check_real("momentum", _config.get("trainer.momentum", momentum), 0.0, 1.0)
    norm = _config.get("trainer.max-grad-norm", max_grad_norm)
    trainer.max_grad_norm = None if norm is None else check_float("max_grad_norm", norm)
    trainer.label_smoothing = check_real(
        "label_smoothing", _config.get("trainer.label-smoothing", label_smoothing), 0.0, 1.0
    )
    trainer.precision = check_choice(
        "precision", _config.get("trainer.precision", precision), PRECISIONS
    )
    trainer.optimizer = check_choice(
        "optimizer", _config.get("trainer.optimizer", optimizer), tuple(LEARNING_RATES)
    )
    if weight_decay is None:  # torch's own: AdamW's 0.01, none for the others
        weight_decay = 0.01 if trainer.optimizer == "adamw" else 0.0
    trainer.weight_decay = check_real("weight_decay", weight_decay, 0.0, math.inf)
    # null in the config (the default): the optimizer's own rate
    rate = _config.get("trainer.learning-rate", learning_rate)
    trainer.learning_rate = check_float(
        "learning_rate", LEARNING_RATES[trainer.optimizer] if rate is None else rate
    )
    trainer.lr_schedule, trainer.schedule_steps = validate_schedule(lr_schedule, schedule_steps)
    trainer.warmup_steps = validate_warmup(warmup_steps, lr_schedule, trainer.schedule_steps)
    trainer.local_steps = check_local_steps(local_steps, trainer.strategy)
    check_strategy_model(trainer.strategy, model)
    trainer.eval_every = check_eval_every(
        eval_every, _config.get("trainer.eval-every"), trainer.local_steps
    )
    trainer.partition_size = (
        None if partition_size is None else check_int("partition_size", partition_size, 1)
    )
    trainer.staleness = validate_staleness(_config.get("table.staleness", staleness))
    trainer.device = check_device(device)
    trainer.checkpoint_path = check_checkpoint(checkpoint_path, checkpoint_every)
    trainer.checkpoint_every = checkpoint_every
    trainer.security = check_security(security, client)
    trainer.on_nonfinite = check_choice("on_nonfinite", on_nonfinite, ("raise", "skip"))
    trainer.transport = check_choice(
        "transport", _config.get("trainer.transport", transport), ("tasks", "direct")
    )
