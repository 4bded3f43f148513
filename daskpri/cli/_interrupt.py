"""Ctrl-C during a fit: the run ends after its step in flight; as a cluster starts: said at once."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import dask.config

import daskpri
from daskpri.cli._prog import _PROG
from daskpri.training._interrupts import Interrupts, stop_on_interrupt


class StopAtOnce(KeyboardInterrupt):
    """The second Ctrl-C: the run stops without waiting for its step, or for its workers."""


@contextlib.contextmanager
def _interruptible(trainer: daskpri.Trainer) -> Iterator[None]:
    """Ctrl-C ends ``trainer``'s fit after its step in flight; a second Ctrl-C at once.

    The first interrupt asks the trainer to stop: the fit ends as at the
    end of its budget (it evaluates, writes its checkpoint at the step it
    ended on, and returns), and ``KeyboardInterrupt`` is raised then. Raised
    at once instead, it would land in whatever the main thread runs: in the
    middle of a step, whose checkpoint could not be written, or in a
    finalizer or a callback, where Python prints and drops it. The second
    interrupt, for a step that does not end, raises :class:`StopAtOnce` at
    once (a ``KeyboardInterrupt``). The library's handler
    (:func:`~daskpri.training._interrupts.stop_on_interrupt`), in the CLI's
    words; the fit inside leaves it in place.
    """
    with stop_on_interrupt(trainer, at_once=StopAtOnce, says=_says) as taken:
        yield
    if taken.count:  # fit returned: the interrupt was lost on the way
        raise KeyboardInterrupt


def _says(taken: Interrupts) -> str:
    """What the first Ctrl-C of a fit says on stderr, by what the fit was doing."""
    if taken.waiting:
        return f"{_PROG}: stopping: the run was waiting for workers"
    if taken.setting_up:
        return (f"{_PROG}: stopping as the run's set-up ends, before its first step: nothing "
                "is trained (Ctrl-C again to stop at once)")
    return f"{_PROG}: stopping after the step in flight (Ctrl-C again to stop at once)"


def _heard_as_cluster_starts() -> None:
    """Say on stderr, at once, that a Ctrl-C as the command's LocalCluster starts was heard.

    The ``on_interrupt`` of the start's
    :func:`~daskpri.training._interrupts.interrupts_held`, called in a
    thread of its own at the first: the interrupt itself is held until the
    cluster has started (seconds), as one raised in the middle of its start
    would leave its worker processes running, owned by no one, and the
    command would seem deaf meanwhile.
    """
    print(f"{_PROG}: stopping once the cluster has started (cut short, its start would leave "
          "worker processes running)", file=sys.stderr, flush=True)


def _close(trainer: daskpri.Trainer, *, at_once: bool, ours: bool = False) -> None:
    """Close ``trainer``; after a second Ctrl-C (``at_once``) without waiting on its workers.

    A worker stuck in the step that the second Ctrl-C left answers nothing:
    those of a LocalCluster of daskpri's own (the trainer's, or the
    command's: ``ours``) are killed, the run's state in them with them,
    and each of the close's calls to the workers of a cluster elsewhere
    would wait the scheduler timeout (``daskpri.trainer.scheduler-timeout``)
    for it; they wait a second then.

    A Ctrl-C during a close that waits (the first ended the fit, and the
    close waits on a worker stuck since) is a second: the close goes on at
    once so, and :class:`StopAtOnce` is raised (the trainer's own
    LocalCluster's workers are killed by the close itself, which then
    raises).
    """
    if not at_once:
        try:
            trainer._close(kill_workers=False)
        except KeyboardInterrupt:
            _close(trainer, at_once=True, ours=ours)
            raise StopAtOnce from None
        return
    with dask.config.set({"daskpri.trainer.scheduler-timeout": "1s"}):
        trainer._close(kill_workers=ours or trainer._own_cluster is not None)
