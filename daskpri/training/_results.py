"""The trainer's results as xarray objects: the history's attributes and the priority table.

What :attr:`Trainer.history_` and :attr:`Trainer.table_` return, built from
the trainer's settings and from the table in the cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer


def history_attrs(trainer: Trainer) -> dict[str, Any]:
    """The attributes of :attr:`Trainer.history_`: the run's settings (netCDF-storable)."""
    watched = trainer._watched  # the last fit's early stopping, where it had one
    return {
        "strategy": trainer.strategy.name,
        "strategy_params": repr(trainer.strategy),
        "seed": trainer.seed,
        "batch_size": trainer.batch_size,
        "learning_rate": trainer.learning_rate,
        "weight_decay": trainer.weight_decay,
        "momentum": trainer.momentum,
        # 0: no clipping (netCDF attributes have no null)
        "max_grad_norm": trainer.max_grad_norm or 0.0,
        "label_smoothing": trainer.label_smoothing,
        "precision": trainer.precision,
        "optimizer": trainer.optimizer,
        "lr_schedule": trainer.lr_schedule,
        "schedule_steps": trainer.schedule_steps if trainer.schedule_steps else 0,
        "warmup_steps": trainer.warmup_steps,
        "local_steps": trainer.local_steps,
        "staleness": trainer.staleness,
        "n_workers": len(trainer._deployment.slots) if trainer._deployment is not None else 0,
        "resources": repr(trainer.resources),
        # placing data, building replicas, warm-up: not in ``time``
        "setup_time": trainer._setup_time,
    } | ({} if watched is None else watched.attrs())


def priority_table(trainer: Trainer) -> xr.DataArray:
    """:attr:`Trainer.table_`: the priorities the table in the cluster holds now."""
    p = trainer._remote.priorities()
    assert trainer._deployment is not None
    bounds = trainer._deployment.bounds
    pid = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return xr.DataArray(
        p["priority"],
        dims="sample",
        coords={"version": ("sample", p["version"]), "partition": ("sample", pid)}
        | ({} if trainer._sample_coord is None else {"sample": trainer._sample_coord}),
        name="priority",
        attrs={"strategy": trainer.strategy.name, "staleness": trainer.staleness},
    )
