"""What a run has the scheduler unpickle: its tasks, and a function run there.

distributed's scheduler unpickles each task it is given, the function and its
arguments, and each function of ``client.run_on_scheduler``: a function of
:mod:`daskpri.replicas.worker` or :mod:`daskpri.training.deployment`, which
import torch, would have the scheduler import torch (seconds of its event
loop, and a few hundred MiB of its memory) for tasks that only its workers
run. These functions and the partitions' references live here, and import
the worker's side as they run, on a worker. The weights of a warm-up go
pickled, as bytes (torch's tensors, unpickled, need torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from distributed.protocol import pickle

if TYPE_CHECKING:
    from daskpri.replicas.step import StepResult
    from daskpri.strategies.base import Strategy


@dataclass(frozen=True)
class StoreRef:
    """A partition read from a zarr store or netCDF file by the worker."""

    path: str
    start: int
    stop: int


@dataclass
class ArrayPart:
    """A partition scattered from the driver's memory once."""

    x: np.ndarray
    y: np.ndarray
    start: int


PartitionRef = StoreRef | ArrayPart


def load_task(name: str, pid: int, ref: PartitionRef) -> dict[str, Any]:
    """Load and check partition ``pid`` on this worker (:func:`.worker.load`)."""
    from daskpri.replicas import worker

    return worker.load(name, pid, ref)


def warmup_task(
    name: str,
    weights: bytes,
    strategy: Strategy,
    pid: int,
    ref: PartitionRef,
    optimizer: str | None = None,
) -> None:
    """Warm the replica up on partition ``pid`` (:func:`.worker.warm_up`); ``weights``
    are the driver's :class:`~daskpri.replicas.replica.Weights`, pickled."""
    from daskpri.replicas import worker

    worker.warm_up(name, pickle.loads(weights), strategy, pid, ref, optimizer)


def train_task(name: str, *args: Any) -> StepResult | dict[str, Any]:
    """One worker's share of a step (:func:`.worker.train`: the ``tasks`` transport)."""
    from daskpri.replicas import worker

    return worker.train(name, *args)


def release_keys(keys: list[Any], client: str, dask_scheduler: Any) -> None:
    """On the scheduler (``client.run_on_scheduler``): ``client`` no longer wants ``keys``
    (forgotten if none does)."""
    dask_scheduler.client_releases_keys(keys=keys, client=client)
