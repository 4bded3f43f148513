"""A fit that starts before its cluster has the workers it needs waits for them.

A Dask computation submitted to a scheduler whose workers are still
starting (``dask scheduler``, then ``dask worker`` a few seconds later), or
to an adaptive cluster at zero workers, waits for them; a fit does the
same: :func:`workers_awaited` waits up to ``daskpri.trainer.no-workers-timeout``
for the workers that suit the run (with its ``resources``, not paused by
Dask, as many as ``n_workers``), saying once what it waits for, then goes
on with those there are. When the time is up it raises the error that the
cluster as it is then calls for, saying that it waited.

Dask's ``Adaptive`` starts workers for tasks, not for a fit's RPCs: it asks
``Scheduler.adaptive_target()``, which is at least one for a cluster of no
workers only where a task is queued or unrunnable. While it waits, the fit
keeps one real task pending, with the run's resources: it returns the
address of the worker that runs it. Its result stays in that worker's
memory until the caller's block ends (the set-up done, and the fit's
workers held, see :func:`daskpri.training._fit.hold_workers`): Dask's
``workers_to_close`` keeps the last worker that holds data, so Adaptive
does not retire the worker it started for the fit before the run has
placed its data there.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import distributed

from daskpri import _config
from daskpri.training.placement import cluster_workers

if TYPE_CHECKING:
    from distributed import Client, Future

    from daskpri.training._interrupts import Interrupts

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: how often the wait looks at the cluster again, in seconds (it wakes at once
#: where the pending task runs, and on a stop)
LOOK_EVERY = 0.25


class WaitStopped(Exception):
    """:meth:`Trainer.stop` (or a fit's first interrupt) came while the fit waited for workers."""


def worker_address() -> str:
    """The address of the worker that runs this task (the task a waiting fit keeps pending)."""
    return str(distributed.get_worker().address)


@contextlib.contextmanager
def workers_awaited(
    client: Client,
    suited: Callable[[Mapping[str, Mapping[str, Any]]], T],
    what: str,
    *,
    resources: Mapping[str, float] | None = None,
    stopped: Callable[[], bool] = lambda: False,
    interrupts: Interrupts | None = None,
) -> Iterator[T]:
    """``suited(workers)`` once the cluster's workers suit it, waiting up to the timeout for them.

    ``suited`` takes :func:`~daskpri.training.placement.cluster_workers`'s
    workers and returns what the caller needs of them, or raises
    ``RuntimeError`` or ``ValueError`` saying why they do not suit (no
    workers, none with the resources, all paused, too few). Where the
    first look finds them wanting, this logs once that it waits for
    ``what`` (``"a worker with resources {'GPU': 1.0}"``), keeps a task
    with ``resources`` pending for an adaptive cluster, and looks again
    every :data:`LOOK_EVERY` seconds, or as soon as that task runs, up to
    ``daskpri.trainer.no-workers-timeout``: then ``suited``'s last error is
    raised, saying how long it waited. ``stopped()`` true ends the wait
    with :class:`WaitStopped` (a flag, which a signal handler sets: the
    wait looks at it each time it wakes). ``interrupts`` is told that the
    fit waits (``waiting``) meanwhile, for an interrupt's words. The task is
    released as the block ends.
    """
    try:
        found = suited(cluster_workers(client))
    except (RuntimeError, ValueError) as e:
        why: Exception = e
    else:  # (yielded outside the try: the block's own errors are not this wait's)
        yield found
        return
    timeout = _config.get_seconds("trainer.no-workers-timeout")
    address = client.scheduler.address
    deadline = time.monotonic() + timeout
    logger.warning("waiting up to %g s for %s at %s (daskpri.trainer.no-workers-timeout)",
                   timeout, what, address)
    pending: Future | None = None
    if interrupts is not None:
        interrupts.waiting = True
    try:
        while True:
            if stopped():
                raise WaitStopped(f"stopped while waiting for {what} at {address}")
            if pending is None or pending.status in ("error", "cancelled", "lost"):
                # (one that failed, its worker lost as it ran it: another in its place)
                if pending is not None:
                    pending.release()
                pending = client.submit(worker_address, pure=False, resources=resources,
                                        key=f"daskpri-waiting-for-workers-{time.time_ns()}")
            try:
                found = suited(cluster_workers(client))
                break
            except (RuntimeError, ValueError) as e:
                why = e
            left = deadline - time.monotonic()
            if left <= 0:
                raise type(why)(
                    f"{why}; waited {timeout:g} s for {what} "
                    "(daskpri.trainer.no-workers-timeout)"
                ) from None
            if pending.done():  # run, yet the cluster does not suit (too few workers)
                time.sleep(min(LOOK_EVERY, left))
            else:  # wakes as soon as a worker that suits the task runs it
                with contextlib.suppress(distributed.TimeoutError):
                    distributed.wait(pending, timeout=min(LOOK_EVERY, left))
        if interrupts is not None:  # (the block's set-up is no wait)
            interrupts.waiting = False
        yield found
    finally:
        if interrupts is not None:
            interrupts.waiting = False
        if pending is not None:
            pending.release()
