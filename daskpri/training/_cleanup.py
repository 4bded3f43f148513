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
from collections.abc import Callable
from typing import TYPE_CHECKING

# (distributed is imported before the hook below is registered, so that its own
# atexit hook runs after it: see _close_at_exit)
from distributed import Client, LocalCluster, SpecCluster
from distributed.core import Status

from daskpri import _config
from daskpri.training._interrupts import Held, interrupts_held
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


def start_own_cluster(
    trainer: Trainer, on_interrupt: Callable[[], None] | None = None
) -> None:
    """Start ``trainer``'s own LocalCluster, and its client, whole: interrupts are held.

    An interrupt meanwhile is handed on once it has started (to a fit's
    handler, which ends the fit after its set-up, or Python's, which raises
    ``KeyboardInterrupt``), the cluster the trainer's. Two or more are a
    "stop at once": the start is given up, the cluster closed, and
    ``KeyboardInterrupt`` raised once. ``on_interrupt`` is called at the
    first, at once, while the cluster still starts (in a thread of its own:
    see :func:`~daskpri.training._interrupts.interrupts_held`): the CLI says
    there that it heard it; the library says nothing until the start ends.
    """
    with interrupts_held(on_interrupt) as held:
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
    answers nothing, and the close would wait for it. An interrupt during
    the close (a second Ctrl-C, the first having ended the fit whose close
    this is) kills them then (:func:`killing_on_interrupt`), and is raised
    once the cluster has closed.
    """
    with killing_on_interrupt(cluster):
        if kill_workers:
            # (killed, they send no heartbeat that could fail as the scheduler closes)
            cluster.sync(_kill_workers, cluster,
                         _config.get_seconds("trainer.scheduler-timeout"))
        else:
            stop_heartbeats(client)
        handlers = [h for root in ("distributed", "bokeh")
                    for h in logging.getLogger(root).handlers
                    if isinstance(h, logging.StreamHandler)]
        levels = [h.level for h in handlers]
        client.close()
        cluster.close()
        _killed.forget(cluster)
    if any(other is not cluster and other.status not in (Status.closing, Status.closed)
           for other in list(SpecCluster._instances)):
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)


class _KilledWorkersFilter(logging.Filter):
    """Drop the scheduler's ERRORs about the workers :func:`_kill_workers` killed on purpose.

    A call on its way to a worker as it is killed (the run's release, the
    heartbeats' stop, that a second Ctrl-C cut) fails ("broadcast to ...
    failed"), and the run's partitions on it are lost ("Removing worker ...
    caused the cluster to lose scattered data"): what the kill was for, in
    a cluster that is closing. The addresses are those of the clusters
    being closed so; the filter is installed once, on the scheduler's logger.
    """

    def __init__(self) -> None:
        super().__init__()
        self.addresses: dict[str, LocalCluster] = {}

    def watch(self, cluster: LocalCluster) -> None:
        for nanny in list(cluster.workers.values()):
            address = getattr(nanny, "worker_address", None)
            if address is not None:
                self.addresses[address] = cluster
        logger = logging.getLogger("distributed.scheduler")
        if self not in logger.filters:
            logger.addFilter(self)

    def forget(self, cluster: LocalCluster) -> None:
        for address in [a for a, c in self.addresses.items() if c is cluster]:
            del self.addresses[address]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR or not self.addresses:
            return True
        message = record.getMessage()
        return not any(message.startswith((f"broadcast to {address} failed",
                                           f"Removing worker {address!r} caused"))
                       for address in list(self.addresses))


_killed = _KilledWorkersFilter()


def killing_on_interrupt(cluster: LocalCluster) -> contextlib.AbstractContextManager[Held]:
    """:func:`interrupts_held`, where an interrupt meanwhile kills ``cluster``'s workers at once.

    For a close of a LocalCluster daskpri started (and of the run in it):
    an interrupt raised in the middle would leave the cluster closing for
    ever, and, held, it would wait for what the close waits for: a worker
    stuck in a step answers nothing, and the close waits the scheduler
    timeout for each call to it, and 4 s more for the nanny to kill it. The
    interrupt is a second Ctrl-C (the first ended the fit): the user wants
    out at once, and the workers of a cluster of daskpri's own hold nothing
    that the close would keep.
    """
    timeout = _config.get_seconds("trainer.scheduler-timeout")
    loop = cluster.loop

    def kill() -> None:  # (called in the thread that took the interrupt)
        if loop is not None:  # (None: the cluster closed already)
            loop.add_callback(_kill_workers, cluster, timeout)

    return interrupts_held(on_interrupt=kill)


async def _kill_workers(cluster: LocalCluster, timeout: float) -> None:
    """Kill the worker processes of ``cluster``'s nannies; wait ``timeout`` for them to end.

    A nanny's close asks its worker to close, and kills it only 4 s later
    (``Nanny.close(timeout=5)``, which ``LocalCluster.close`` gives no
    other): a worker stuck in a step would hold a second Ctrl-C that long.
    The nannies are told first that their workers end for good (not to
    restart them), and close as they see them go.
    """
    processes = []
    _killed.watch(cluster)
    for nanny in list(cluster.workers.values()):
        process = getattr(nanny, "process", None)  # a Nanny's WorkerProcess; none for threads
        if process is None or process.process is None or not process.process.is_alive():
            continue
        if nanny.status == Status.running:  # (one closing already waits for its worker)
            nanny.close_gracefully(reason="daskpri: stopped at once")
        with contextlib.suppress(ValueError):  # (its process object closed meanwhile)
            await process.process.kill()  # SIGKILL: a stopped process too
        processes.append(process)
    with contextlib.suppress(asyncio.TimeoutError):  # LocalCluster.close kills what is left
        await asyncio.wait_for(asyncio.gather(*(p.stopped.wait() for p in processes)), timeout)
