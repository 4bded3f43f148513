"""The error of a run that cannot go on for want of workers."""

from __future__ import annotations

__all__ = ["WorkersLostError"]


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
