"""The LocalCluster a trainer starts, and closing the runs of trainers never closed.

:func:`start_own_cluster` starts a trainer's LocalCluster whole, an
interrupt held meanwhile. A trainer left without ``close()`` or ``with`` is
closed at exit while its cluster still runs (:func:`_close_at_exit`), and
one garbage-collected before then has its run dropped from the user's
cluster (:func:`drop_run`, a ``weakref.finalize`` callback), or the
LocalCluster it started closed (:func:`close_dropped_cluster`, another).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import weakref
from typing import TYPE_CHECKING

# (distributed is imported before the hook below is registered, so that its own
# atexit hook runs after it: see _close_at_exit)
from distributed import Client, LocalCluster, SpecCluster
from distributed.core import Status

from daskpri import _config
from daskpri.training._interrupts import interrupts_held
from daskpri.training.cluster import local_cluster, stop_heartbeats

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

logger = logging.getLogger(__name__)

#: The trainers not garbage-collected yet, for :func:`_close_at_exit`.
TRAINERS: weakref.WeakSet[Trainer] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Close the trainers never closed (no ``close()``, no ``with``) while their clusters run.

    At exit distributed closes the clusters still open, from an ``atexit`` hook
    registered when it was imported, before this one, so after this runs; a
    worker removed while a client holds data scattered to it (a trainer's
    partitions) makes the scheduler log an ERROR that the data is lost.
    """
    for trainer in list(TRAINERS):
        client = trainer._client
        if client is not None and client.status == "running":
            with contextlib.suppress(Exception):  # the cluster may be going already
                trainer.close()


def start_own_cluster(trainer: Trainer) -> None:
    """Start ``trainer``'s own LocalCluster, and its client, whole: interrupts are held.

    An interrupt meanwhile is handed on once it has started (to a fit's
    handler, which ends the fit after its set-up, or Python's, which raises
    ``KeyboardInterrupt``), the cluster the trainer's. Two or more are a
    "stop at once": the start is given up, the cluster closed, and
    ``KeyboardInterrupt`` raised once.
    """
    with interrupts_held() as held:
        closed = trainer._closed
        cluster = local_cluster(trainer.n_workers or 2, resources=trainer.resources,
                                security=trainer.security)
        trainer._own_cluster = cluster
        trainer._client = client = Client(cluster, set_as_default=False)
        trainer._closed = False
        # a trainer dropped without close() (a notebook's cell that made it run again)
        # closes its cluster; at exit, _close_at_exit does. Made before an interrupt
        # held meanwhile is raised.
        trainer._dropped = weakref.finalize(trainer, close_dropped_cluster, client, cluster)
        trainer._dropped.atexit = False
        if held.count > 1:
            trainer._dropped.detach()
            close_cluster(client, cluster)  # (held too, as close() does)
            trainer._own_cluster = trainer._client = trainer._dropped = None
            trainer._closed = closed
    if trainer._client is None:  # (the handler raised it, where it is Python's or a fit's)
        raise KeyboardInterrupt


def drop_run(client: Client, run: str, plugin: str) -> None:
    """Close a garbage-collected trainer's run in the cluster, without waiting.

    Called by the collector, on whatever thread it runs: the calls are
    handed to the client's event loop, and their failures (the cluster
    gone) are only logged at debug level.
    """
    if client.status != "running" or client.loop is None:
        return

    async def drop() -> None:
        for call in (client.scheduler.daskpri_close(run=run),
                     client.scheduler.unregister_worker_plugin(name=plugin)):
            try:
                await call
            except Exception as e:
                logger.debug("dropping run %s of a trainer never closed: %r", run, e)

    client.loop.add_callback(drop)


def close_dropped_cluster(client: Client, cluster: LocalCluster) -> None:
    """Close the LocalCluster of a garbage-collected trainer, in a thread of its own.

    A notebook's cell that makes a trainer, run again, drops the last one:
    its cluster's worker processes would run (and hold memory and a share
    of the cores) until the kernel ends. The collector may run on any
    thread, the cluster's own event loop's among them, where a close that
    waits for that loop would never end: the close runs in a new thread.
    """

    def close() -> None:
        try:
            close_cluster(client, cluster)
        except Exception as e:  # the cluster gone already, the interpreter ending
            logger.debug("closing the LocalCluster of a trainer never closed: %r", e)

    threading.Thread(target=close, name="daskpri-close-dropped", daemon=True).start()


def close_cluster(
    client: Client, cluster: LocalCluster, *, kill_workers: bool = False
) -> None:
    """Close a LocalCluster that daskpri started (a trainer, ``daskpri demo``), and its client.

    A LocalCluster silences distributed's and bokeh's stream handlers to
    warnings while it runs and, closing, puts back the levels it found: the
    INFO level where another cluster started meanwhile found them silenced
    already, which then logs each worker's registration and each call into
    the notebook. The levels are kept as they were while another cluster runs.

    ``kill_workers`` (after a second Ctrl-C) kills the worker processes first
    (:func:`_kill_workers`): one stuck in the step the interrupt left
    answers nothing, and the close would wait for it.
    """
    if kill_workers:
        # (killed, they send no heartbeat that could fail as the scheduler closes)
        cluster.sync(_kill_workers, cluster, _config.get_seconds("trainer.scheduler-timeout"))
    else:
        stop_heartbeats(client)
    handlers = [h for root in ("distributed", "bokeh") for h in logging.getLogger(root).handlers
                if isinstance(h, logging.StreamHandler)]
    levels = [h.level for h in handlers]
    client.close()
    cluster.close()
    if any(other is not cluster and other.status not in (Status.closing, Status.closed)
           for other in list(SpecCluster._instances)):
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)


async def _kill_workers(cluster: LocalCluster, timeout: float) -> None:
    """Kill the worker processes of ``cluster``'s nannies; wait ``timeout`` for them to end.

    A nanny's close asks its worker to close, and kills it only 4 s later
    (``Nanny.close(timeout=5)``, which ``LocalCluster.close`` gives no
    other): a worker stuck in a step would hold a second Ctrl-C that long.
    The nannies are told first that their workers end for good (not to
    restart them), and close as they see them go.
    """
    processes = []
    for nanny in list(cluster.workers.values()):
        process = getattr(nanny, "process", None)  # a Nanny's WorkerProcess; none for threads
        if process is None or process.process is None or process.status != Status.running:
            continue
        nanny.close_gracefully(reason="daskpri: stopped at once")
        await process.process.kill()  # SIGKILL: a stopped process too
        processes.append(process)
    with contextlib.suppress(asyncio.TimeoutError):  # LocalCluster.close kills what is left
        await asyncio.wait_for(asyncio.gather(*(p.stopped.wait() for p in processes)), timeout)
