"""The errors of a run that cannot go on: no workers, no scheduler, none reached.

They import nothing, so that the command line can name them without
importing torch.
"""

from __future__ import annotations

__all__ = ["SchedulerLostError", "SchedulerUnreachable", "WorkersLostError"]

#: Why a second fit is refused while one runs (a ``RuntimeError``).
FIT_RUNNING = (
    "a fit is already running (fit_in_background's, or another thread's): stop() it and wait "
    "for its future, or wait for it to end, before fitting again"
)


class WorkersLostError(RuntimeError):
    """The run's workers kept dying, were killed for memory, or none suitable is left.

    Raised by a :class:`~daskpri.Trainer`'s :meth:`~daskpri.Trainer.fit`
    (its set-up or a step) once ``daskpri.trainer.max-retries`` tries failed
    as workers left, where a retry was killed for memory again, or where no
    suitable worker answered within ``daskpri.trainer.no-workers-timeout``.
    The message names the workers and what to do; the trainer's history and
    table keep the steps taken, and a checkpoint, where one was written,
    resumes the run on a mended cluster.

    Examples
    --------
    >>> import daskpri
    >>> issubclass(daskpri.WorkersLostError, RuntimeError)
    True
    """


class SchedulerLostError(RuntimeError):
    """The scheduler stopped answering: the run cannot go on in this cluster.

    Raised by a :class:`~daskpri.Trainer`'s :meth:`~daskpri.Trainer.fit`
    where a failure of the cluster turns out to be the scheduler's loss. The
    message names the last checkpoint, if one was written: resume from it
    on a new cluster.

    Examples
    --------
    >>> import daskpri
    >>> issubclass(daskpri.SchedulerLostError, RuntimeError)
    True
    >>> try:  # doctest: +SKIP
    ...     history = trainer.fit(train, max_steps=5000)
    ... except daskpri.SchedulerLostError:
    ...     trainer = daskpri.Trainer.resume("run.ckpt", client=new_client)
    ...     history = trainer.fit(train, max_steps=5000)
    """


class SchedulerUnreachable(ConnectionError):
    """The scheduler at an address could not be reached.

    Raised by :func:`daskpri.training.cluster.connect`; the message names the
    address and why (no answer in time, or the connection's error).
    """
