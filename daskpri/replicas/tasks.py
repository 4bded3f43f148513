"""What a run has the scheduler unpickle: its tasks, and a function run there.

distributed's scheduler unpickles each task it is given, the function and its
arguments, and each function of ``client.run_on_scheduler``: a function of
:mod:`daskpri.replicas.worker` or :mod:`daskpri.training.deployment`, which
import torch, would have the scheduler import torch (seconds of its event
loop, and a few hundred MiB of its memory) for tasks that only its workers
run. These functions and the partitions' references live here, and import
the worker's side as they run, on a worker. The weights a task needs are
scattered to the workers, and the task names their key: the scheduler
never holds them (torch's tensors, unpickled, need torch).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from daskpri.replicas.step import StepResult


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


def warmup_task(name: str, *args: Any) -> None:
    """Warm the replica up (:func:`.worker.warm_up`, which takes ``args``); its weights
    are the driver's, scattered once for every worker's warm-up."""
    from daskpri.replicas import worker

    worker.warm_up(name, *args)


def train_task(name: str, *args: Any) -> StepResult | dict[str, Any]:
    """One worker's share of a step (:func:`.worker.train`: the ``tasks`` transport)."""
    from daskpri.replicas import worker

    return worker.train(name, *args)


#: the module a run's replica plugin is unpickled from, with torch and the model's code
WORKER_SIDE = "daskpri.replicas.worker"


async def import_worker_side(
    modules: list[str] | tuple[str, ...] = (),
    resources: dict[str, float] | None = None,
    dask_worker: Any = None,
) -> bool:
    """Import the worker's side of daskpri (torch with it) and ``modules`` in a thread;
    whether any was not imported yet.

    Run on a worker's event loop (``Worker.run`` awaits a coroutine function)
    before a run's replica plugin reaches it: the plugin, unpickled on the
    event loop, imports :mod:`daskpri.replicas.worker` and torch there, and
    its set-up the modules of the model's classes (``modules``), which held
    a fresh worker's event loop for 3-4 s (12 s on a loaded machine). It
    answered nothing meanwhile: heartbeats, another run's probe, the
    dashboard. In a thread the loop goes on (its longest pause, 0.3 s,
    while the thread loads torch's libraries). A module that fails to
    import raises here; the set-up, importing it again, says so. A worker
    that lacks the run's ``resources`` builds no replica, and imports the
    model's modules not at all (``Worker.run`` gives ``dask_worker``).

    Examples
    --------
    >>> import asyncio
    >>> asyncio.run(import_worker_side()) in (True, False)
    True
    >>> asyncio.run(import_worker_side())  # imported now
    False
    """
    have = getattr(getattr(dask_worker, "state", None), "total_resources", {}) or {}
    if not all(have.get(k, 0) >= v for k, v in (resources or {}).items()):
        modules = ()  # (as the replica plugin's set-up finds: it serves not)
    needed = [m for m in (WORKER_SIDE, *modules) if m not in sys.modules]
    for module in needed:
        await asyncio.to_thread(importlib.import_module, module)
    return bool(needed)


def release_keys(keys: list[Any], client: str, dask_scheduler: Any) -> None:
    """On the scheduler (``client.run_on_scheduler``): ``client`` no longer wants ``keys``
    (forgotten if none does)."""
    dask_scheduler.client_releases_keys(keys=keys, client=client)
