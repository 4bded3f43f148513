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
keeps one real task pending (:class:`PendingTask`), with the run's
resources: it returns the address of the worker that runs it. Its result
stays in that worker's memory until the caller's block ends (the set-up
done, and the fit's workers held, see
:func:`daskpri.training._fit.hold_workers`): Dask's ``workers_to_close``
keeps the last worker that holds data, so Adaptive does not retire the
worker it started for the fit before the run has placed its data there.
The re-plan after losing the run's workers mid-fit waits for workers the
same way (:meth:`daskpri.training.deployment.Deployment.recover`), its task
held until their partitions are placed again.

That task brings one worker, not more: ``adaptive_target`` weighs the
load of the tasks waiting (their expected durations against
``target_duration``), not their number, and the first worker runs every
task any worker could. A fit that needs more workers than an
adaptive cluster's ``minimum`` (and finds fewer) fails at once saying so
(:func:`adaptive_shortfall`) rather than wait for workers that will not
come: ``cluster.adapt(minimum=n_workers, ...)`` gives it them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
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


def adaptive_bounds(client: Client) -> tuple[int, float] | None:
    """``(minimum, maximum)`` of the adaptive scaling of ``client``'s cluster object, if it adapts.

    ``None`` for a client of a scheduler address (its cluster, if adaptive,
    is another process's) or of a cluster that does not adapt.
    """
    # Cluster.adapt keeps its Adaptive as _adaptive, with no public accessor:
    # Cluster.__repr__ reads it so too; stopped, it has no periodic_callback
    adaptive = getattr(getattr(client, "cluster", None), "_adaptive", None)
    if adaptive is None or getattr(adaptive, "periodic_callback", None) is None:
        return None
    return int(adaptive.minimum), float(adaptive.maximum)


def adaptive_shortfall(need: int, minimum: int, maximum: float) -> str | None:
    """Why an adaptive cluster of these bounds will not give a fit its ``need`` workers, if so.

    The wait's pending task starts one worker (from none); Adaptive starts
    no more for a fit (it weighs the load of tasks, and the first worker
    runs them all); with ``minimum`` workers it starts them.

    Examples
    --------
    >>> print(adaptive_shortfall(2, 0, 4))  # doctest: +NORMALIZE_WHITESPACE
    the cluster adapts (minimum=0, maximum=4), and Dask's Adaptive starts workers for the load of
    tasks, not for the 2 workers a fit needs: adapt it with minimum=2
    (cluster.adapt(minimum=2, maximum=4))
    >>> print(adaptive_shortfall(3, 1, float("inf")))  # doctest: +ELLIPSIS
    the cluster adapts (minimum=1, maximum=inf), ... (cluster.adapt(minimum=3))
    >>> adaptive_shortfall(1, 0, 4) is None, adaptive_shortfall(2, 2, 2) is None
    (True, True)
    """
    if need <= max(minimum, 1):
        return None
    upper = "" if maximum == float("inf") else f", maximum={max(maximum, need):g}"
    return (f"the cluster adapts (minimum={minimum}, maximum={maximum:g}), and Dask's Adaptive "
            f"starts workers for the load of tasks, not for the {need} workers a fit needs: "
            f"adapt it with minimum={need} (cluster.adapt(minimum={need}{upper}))")


class WaitStopped(Exception):
    """:meth:`Trainer.stop` (or a fit's first interrupt) came while the fit waited for workers."""


def worker_address() -> str:
    """The address of the worker that runs this task (the task a waiting fit keeps pending)."""
    return str(distributed.get_worker().address)


class PendingTask:
    """One real task with ``resources``, kept pending while a fit waits for workers.

    An adaptive cluster at zero workers starts one for it (see the module's
    note). :meth:`keep` submits it (again where the last one failed, its
    worker lost as it ran it); once run, its result holds its worker
    against Adaptive's scale-down until :meth:`release`, which the caller
    calls on every path, as the run's data is placed there.
    """

    def __init__(self, client: Client, resources: Mapping[str, float] | None) -> None:
        self.client = client
        self.resources = resources
        self.future: Future | None = None
        self._ended = threading.Event()

    def keep(self) -> None:
        """Submit the task, unless one is pending or run (its result held)."""
        if self.future is not None and self.future.status not in ("error", "cancelled", "lost"):
            return
        self.release()
        self.future = self.client.submit(
            worker_address, pure=False, resources=self.resources,
            key=f"daskpri-waiting-for-workers-{time.time_ns()}")
        # (not distributed.wait, which waits through the default client: there may be none)
        self._ended = threading.Event()
        self.future.add_done_callback(lambda _: self._ended.set())

    def wait(self, timeout: float) -> None:
        """Wait ``timeout`` seconds, or less: until the task runs, if it is pending."""
        if self.future is None or self.future.done():  # run, yet the cluster does not suit
            time.sleep(max(0.0, timeout))
        else:  # wakes as soon as a worker that suits the task runs it
            self._ended.wait(max(0.0, timeout))

    def release(self) -> None:
        """Let the task (and its result, and so its worker) go."""
        if self.future is not None:
            self.future.release()
            self.future = None


@contextlib.contextmanager
def workers_awaited(
    client: Client,
    suited: Callable[[Mapping[str, Mapping[str, Any]]], T],
    what: str,
    *,
    resources: Mapping[str, float] | None = None,
    need: int = 1,
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
    released as the block ends. Where the client's cluster adapts with a
    ``minimum`` below ``need`` (the workers ``suited`` asks for), the first
    look that finds them wanting raises ``suited``'s error at once, saying
    so (:func:`adaptive_shortfall`).
    """
    try:
        found = suited(cluster_workers(client))
    except (RuntimeError, ValueError) as e:
        why: Exception = e
        bounds = adaptive_bounds(client)
        short = None if bounds is None else adaptive_shortfall(need, *bounds)
        if short is not None:
            raise type(e)(f"{e}; {short}") from None
    else:  # (yielded outside the try: the block's own errors are not this wait's)
        yield found
        return
    timeout = _config.get_seconds("trainer.no-workers-timeout")
    address = client.scheduler.address
    deadline = time.monotonic() + timeout
    logger.warning("waiting up to %g s for %s at %s (daskpri.trainer.no-workers-timeout)",
                   timeout, what, address)
    pending = PendingTask(client, resources)
    if interrupts is not None:
        interrupts.waiting = True
    try:
        while True:
            if stopped():
                raise WaitStopped(f"stopped while waiting for {what} at {address}")
            pending.keep()
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
            pending.wait(min(LOOK_EVERY, left))
        if interrupts is not None:  # (the block's set-up is no wait)
            interrupts.waiting = False
        yield found
    finally:
        if interrupts is not None:
            interrupts.waiting = False
        pending.release()
