"""The run's workers' memory once they hold its replicas: over Dask's pause threshold, refused."""

from __future__ import annotations

from typing import Any

from distributed import Client

from daskpri.training.placement import paused_workers
from daskpri.training.transport import ask_workers


def check_memory(client: Client, addresses: list[str]) -> None:
    """Raise ``ValueError`` if a worker's memory is over Dask's pause threshold.

    Called once the run's replicas are built: torch and the model often
    take a worker with a small ``--memory-limit`` over
    ``distributed.worker.memory.pause``, and Dask then pauses it (a moment
    later, at its next memory check): the partitions' scatter would wait
    30 s for a worker that takes data and fail with "No valid workers
    found", and a task sent to it would wait for good. Measured on each
    worker, as Dask's memory monitor measures it; a worker that does not
    answer is left to the set-up (a lost worker).
    """
    # (a worker lost meanwhile, its answer an error: the set-up recovers from it)
    found = ask_workers(client, addresses, _memory)
    over = {
        addr: (memory, limit)
        for addr, answer in found.items()
        if isinstance(answer, tuple)
        for memory, limit, pause in [answer]
        if limit and pause and memory > pause * limit
    }
    if over:
        raise ValueError(paused_workers(
            over, client.scheduler.address,
            "are over Dask's pause threshold once they hold the run's replica",
        ))


def _memory(dask_worker: Any) -> tuple[int, int | None, float | bool]:
    """On a worker: its process memory, its memory limit and its pause fraction."""
    manager = dask_worker.memory_manager
    return (dask_worker.monitor.get_process_memory(), manager.memory_limit,
            manager.memory_pause_fraction)
