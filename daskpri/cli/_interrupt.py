"""Ctrl-C during a fit: the run ends after its step in flight."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import dask.config

import daskpri
from daskpri.cli._prog import _PROG
from daskpri.training.cluster import drop_abandoned_gathers


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
    once (a ``KeyboardInterrupt``).
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield  # signals go to the main thread; an ignored SIGINT stays ignored
        return
    interrupted = False  # no lock: the handler may run inside anything, itself included

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            trainer.stop()
            print(f"{_PROG}: stopping after the step in flight (Ctrl-C again to stop at once)",
                  file=sys.stderr, flush=True)
            return
        drop_abandoned_gathers()  # a gather the interrupt leaves behind ends with the cluster
        raise StopAtOnce

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        # None: a handler not set from Python, which cannot be put back; the default then
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
    if interrupted:  # fit returned: the interrupt was lost on the way
        raise KeyboardInterrupt


def _close(trainer: daskpri.Trainer, *, at_once: bool) -> None:
    """Close ``trainer``; after a second Ctrl-C (``at_once``) without waiting on its workers.

    A worker stuck in the step that the second Ctrl-C left answers nothing:
    each of the close's calls to the workers would wait the scheduler
    timeout (``daskpri.trainer.scheduler-timeout``) for it; they wait a
    second then.
    """
    # dask.config.set takes effect as it is made: only made where it applies
    with (dask.config.set({"daskpri.trainer.scheduler-timeout": "1s"}) if at_once
          else contextlib.nullcontext()):
        trainer.close()
