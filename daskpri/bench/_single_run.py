"""One run of the benchmark: a daskpri trainer on a cluster, or a baseline.

The record of a run that failed (a learning rate that diverged, a baseline's
processes that died) says why, and the benchmark goes on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import dask
import numpy as np
import xarray as xr

from daskpri.bench._clusters import _Clusters
from daskpri.bench.baselines import train_ddp, train_plain, train_plain_loops
from daskpri.bench.config import BenchConfig
from daskpri.bench.records import RunRecord, RunSpec, record_from_history
from daskpri.training.cluster import one_torch_thread


def _arrays(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(ds["x"].values, dtype=np.float32), np.asarray(ds["y"].values)


def _execute(
    spec: RunSpec,
    config: BenchConfig,
    data: Mapping[str, tuple[xr.Dataset, xr.Dataset]],
    clusters: _Clusters,
) -> RunRecord:
    """Make one run."""
    from daskpri.models import build_model
    from daskpri.training.trainer import Trainer

    train, test = data[spec.dataset]
    # The same seed gives every arm the same initial weights: only the sampling differs.
    model = build_model(spec.model, train, seed=spec.seed)
    t0 = time.perf_counter()
    if spec.kind == "daskpri":
        from daskpri.strategies import STRATEGIES

        client = clusters.client(spec.n_workers)
        fresh = STRATEGIES[spec.arm.strategy].needs_fresh_priorities
        try:
            # partitions cut as the trainer cuts them by default, as many for every
            # worker (the largest from the config, as the benchmark was given it)
            with one_torch_thread(), dask.config.set(
                {"daskpri.trainer.partition-size": config.partition_size}
            ), Trainer(
                model, strategy=spec.arm.strategy, client=client, seed=spec.seed,
                n_workers=spec.n_workers, batch_size=spec.arm.batch_size,
                learning_rate=spec.learning_rate, momentum=config.momentum,
                max_grad_norm=config.max_grad_norm, label_smoothing=config.label_smoothing,
                precision=config.precision,
                eval_every=config.eval_every,
                local_steps=1 if fresh else config.local_steps,
                staleness=config.staleness, **dict(spec.arm.options),
            ) as trainer:
                history = trainer.fit(train, eval_data=test, max_time=spec.budget,
                                      progress=False)
        except FloatingPointError as e:
            # a learning rate of the sweep too high for the model: the run counts as one that
            # never reaches a target and has no final accuracy, and the benchmark goes on
            return _failed(spec, f"diverged: {e}", time.perf_counter() - t0)
        return record_from_history(spec, history, time.perf_counter() - t0)
    clusters.close()  # the baselines have the machine to themselves
    options: dict[str, Any] = {
        "batch_size": spec.arm.batch_size,
        "learning_rate": spec.learning_rate,
        "momentum": config.momentum,
        "max_grad_norm": config.max_grad_norm,
        "label_smoothing": config.label_smoothing,
        "precision": config.precision,
        "budget": spec.budget,
        "eval_seconds": config.baseline_eval_seconds,
        "seed": spec.seed,
    }
    info: dict[str, Any] = {}
    if spec.kind == "torch":
        info["device"] = clusters.device()
        result = train_plain(model, _arrays(train), _arrays(test), device=info["device"],
                             **options)
    else:
        spawn = train_ddp if spec.kind == "ddp" else train_plain_loops
        try:
            result = spawn(model, _arrays(train), _arrays(test), processes=spec.n_workers,
                           **options)
        except RuntimeError as e:  # reported, not fatal: the rest of the benchmark stands
            return _failed(spec, str(e), time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    return RunRecord(spec, result.curve, result.samples, result.samples, wall, info=info)


def _failed(spec: RunSpec, error: str, wall: float) -> RunRecord:
    from daskpri.bench.records import Curve

    return RunRecord(spec, Curve([], [], [], []), 0, 0, wall, info={"error": error})
