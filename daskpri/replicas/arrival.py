"""A run's replica plugin as the workers receive it: torch is imported off their event loops.

The scheduler keeps a run's plugin as bytes and hands it to every worker
that joins mid-run (a new one, one its nanny restarted), which unpickles it
on its event loop as it registers. :class:`~daskpri.replicas.worker.ReplicaPlugin`
lives with torch, so unpickling it imported torch there, and building the
replica the model's modules: seconds in which the worker answered nothing
(heartbeats, a run's rescan, which leaves it out for 30 s, another run's
probe). What the run registers is a :class:`ReplicaArrival` instead, which
imports nothing heavy: its set-up imports the worker's side of daskpri and
the model's modules in a thread, as
:func:`~daskpri.replicas.tasks.import_worker_side` does before a run's
first set-up, then puts the :class:`ReplicaPlugin` in its place among the
worker's plugins and sets that up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from functools import partial
from typing import Any

from distributed import WorkerPlugin

import daskpri
from daskpri.replicas.tasks import import_worker_side
from daskpri.table.plugin import replicas_name

logger = logging.getLogger(__name__)


class ReplicaArrival(WorkerPlugin):
    """The run's :class:`~daskpri.replicas.worker.ReplicaPlugin`, to be built on arrival.

    Takes :class:`~daskpri.replicas.worker.ReplicaPlugin`'s parameters
    (its options by keyword; ``version`` defaults to this process's
    daskpri: the driver's), and ``modules``, the model's modules that each
    worker imports in a thread first.

    Attributes
    ----------
    serves : bool
        False until the replica plugin takes its place (a task that finds
        it meanwhile is told the replica is being set up).
    ready : asyncio.Event
        Set once the set-up has ended, whichever way; the worker's plugin
        under :attr:`name` is then the replica plugin (or none, where the run
        was dropped meanwhile).

    Examples
    --------
    >>> arrival = ReplicaArrival("uniform-1a2b", b"", 10, modules=["mymodels"])
    >>> arrival.name, arrival.modules, arrival.serves
    ('daskpri-uniform-1a2b', ['mymodels'], False)
    """

    idempotent = False

    def __init__(self, run: str, module: bytes, n_classes: int, *,
                 modules: Collection[str] = (), **options: Any) -> None:
        # options: the replica plugin's own (device, resources, version, label_smoothing)
        self.name = replicas_name(run)
        self.resources: dict[str, float] | None = options.get("resources")
        self.modules = sorted(modules)
        options.setdefault("version", daskpri.__version__)  # the driver's
        self.kwargs: dict[str, Any] = {"run": run, "module": module, "n_classes": n_classes,
                                       **options}
        self.serves = False
        self.unfit = "its replica is being set up"

    def setup(self, worker: Any) -> Any:
        """Import in a thread, then build the replica plugin in this one's place.

        The run's registration waits for it (its failure is the
        registration's). A worker that joins sets its plugins up as it
        starts, and distributed's server reads no message before its start
        has ended: there it is left to run, so that the worker answers (and
        sends heartbeats) meanwhile; the run asks whether it holds a replica
        (:func:`why_no_replica`, which waits for :attr:`ready`) before it
        gives it partitions.
        """
        self.ready = asyncio.Event()  # (made here: set up in place, before any await)
        arriving = self._arrive(worker)
        if not _starting(worker):
            return arriving
        #: the set-up under way, held so that it is not collected before it ends
        self.arriving = asyncio.ensure_future(arriving)
        self.arriving.add_done_callback(partial(_log_failure, self.name, worker))
        return None

    async def _arrive(self, worker: Any) -> None:
        try:
            # a module that fails to import is the replica plugin's to say, as it does
            with contextlib.suppress(ImportError):
                await import_worker_side(self.modules, self.resources, worker)
            if worker.plugins.get(self.name) is not self:
                return  # the run dropped it meanwhile (its remove found this one)
            from daskpri.replicas.worker import ReplicaPlugin

            replica = ReplicaPlugin(**self.kwargs)
            worker.plugins[self.name] = replica
            started = replica.setup(worker)
            if started is not None:  # one of several GPUs, chosen with the scheduler
                await started
        finally:
            self.ready.set()


def _starting(worker: Any) -> bool:
    """Whether ``worker`` is still starting (as it registers, the plugins the scheduler keeps
    set up): distributed's ``Server.start`` holds its start-up lock meanwhile."""
    lock = getattr(worker, "_startup_lock", None)
    return bool(lock is not None and lock.locked())


def _log_failure(name: str, worker: Any, arriving: asyncio.Future[None]) -> None:
    """Log a failed set-up left to run, as distributed logs one it waits for."""
    if arriving.cancelled() or arriving.exception() is None:
        return
    error = arriving.exception()
    logger.error("Worker plugin %s failed to setup on worker %s", name,
                 getattr(worker, "address", "?"), exc_info=error)


async def settled(name: str, dask_worker: Any) -> Any:
    """The worker's plugin ``name`` once a set-up under way has ended (None: it has none)."""
    plugin = dask_worker.plugins.get(name)
    ready = getattr(plugin, "ready", None)
    if ready is not None:  # arriving, or one of several GPUs being chosen
        await ready.wait()
        plugin = dask_worker.plugins.get(name)
        ready = getattr(plugin, "ready", None)
        if ready is not None:  # (the replica plugin that took an arrival's place)
            await ready.wait()
    return plugin


async def why_no_replica(name: str, dask_worker: Any) -> str | None:
    """On a worker (``client.run``): why it holds no replica of run plugin ``name``
    (``None``: it holds one), once a set-up under way has ended.

    Here, not with the replica plugin: a worker still importing torch for an
    arrival answers it at once, rather than import torch on its event loop
    to unpickle it.
    """
    plugin = await settled(name, dask_worker)
    if plugin is None:
        return "it has no replica of the run (it joined as the run was set up or closed)"
    if not getattr(plugin, "serves", False):
        return str(getattr(plugin, "unfit", "")) or "its replica was not built"
    return None
