"""Interrupts (Jupyter's stop button, Ctrl-C) while a trainer works in the main thread.

Jupyter's interrupt and a terminal's Ctrl-C are ``SIGINT`` sent to the whole
process group: the kernel or driver, and the worker processes of the
LocalClusters it started. Python raises ``KeyboardInterrupt`` wherever the
main thread is when it arrives. Here: a fit's first interrupt ends it after
what is in flight (:func:`stop_on_interrupt`, the library's and the CLI's
one handler), and its ``KeyboardInterrupt`` keeps no trainer alive
(:func:`without_locals`); a trainer's LocalCluster starts and closes whole,
its workers born deaf to it, the interrupts meanwhile counted
(:func:`interrupts_held`); and a Jupyter user is warned where the stop
button would kill the workers of a cluster of their own
(:func:`warn_workers_unshielded`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from daskpri import _config
from daskpri._warnings import warn
from daskpri.training.cluster import drop_abandoned_gathers

# (run on the workers: a module that imports no torch, so they answer at once)
from daskpri.training.on_workers import killed_by_interrupts_of

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Interrupts:
    """The interrupts that :func:`stop_on_interrupt` took while its block ran."""

    count: int = 0
    #: whether the fit has set its run up and steps (what an interrupt waits for)
    stepping: bool = False
    #: whether the fit waits for workers, before its set-up (an interrupt ends it at once)
    waiting: bool = False
    #: what the fit was doing at the first interrupt (:attr:`phase`), for its words after
    first: str | None = None

    @property
    def phase(self) -> str:
        """What the fit does now: ``"waiting"``, ``"setting up"`` or ``"stepping"``."""
        return "stepping" if self.stepping else "waiting" if self.waiting else "setting up"

    @property
    def setting_up(self) -> bool:
        """Whether the fit sets its run up (its cluster's start, its data's checks and
        partitions, its replicas): an interrupt lets the set-up end whole, as cut it
        would leave the cluster half-made, and ends the fit before its first step."""
        return not (self.stepping or self.waiting)


def _fit_says(taken: Interrupts) -> str:
    """What a fit's first interrupt says on stderr (the library's, Jupyter's stop button)."""
    if taken.waiting:
        return "daskpri: stopping the fit: it was waiting for workers, with nothing set up"
    if taken.setting_up:
        return ("daskpri: stopping the fit as its set-up ends, before its first step: "
                "nothing is trained (interrupt again to stop at once)")
    return ("daskpri: stopping the fit after the step in flight "
            "(interrupt again to stop at once)")


class _Stopper:
    """The ``SIGINT`` handler of :func:`stop_on_interrupt`: stop, then raise at once."""

    def __init__(
        self, trainer: Trainer, says: Callable[[Interrupts], str],
        at_once: type[KeyboardInterrupt],
    ) -> None:
        self.trainer, self.says, self.at_once = trainer, says, at_once
        # no lock: the handler may run inside anything, itself included
        self.taken = Interrupts()

    def __call__(self, signum: int, frame: Any) -> None:
        self.taken.count += 1
        if self.taken.count == 1:
            self.taken.first = self.taken.phase
            self.trainer.stop()
            print(self.says(self.taken), file=sys.stderr, flush=True)
            return
        drop_abandoned_gathers()  # a gather the interrupt leaves behind ends with the cluster
        raise self.at_once


@contextlib.contextmanager
def stop_on_interrupt(
    trainer: Trainer,
    *,
    says: Callable[[Interrupts], str] = _fit_says,
    at_once: type[KeyboardInterrupt] = KeyboardInterrupt,
) -> Iterator[Interrupts]:
    """Make the block's first interrupt end ``trainer``'s fit after what is in flight.

    Python raises ``KeyboardInterrupt`` wherever the main thread is when
    ``SIGINT`` arrives (Jupyter's stop button sends it): in the middle of a
    step, whose optimizer step or history record it would leave half made;
    in a LocalCluster's start, whose worker processes it would leave running
    unowned; or in a finalizer or callback (distributed's garbage-collection
    diagnostics, say), where it is printed and dropped while the fit runs
    on. Inside this block the first interrupt asks :meth:`Trainer.stop`
    instead and says so on stderr (``says``): the fit ends after the step,
    or the start and set-up, in flight, as at the end of its budget (its
    history and checkpoint whole), and the caller raises
    ``KeyboardInterrupt`` once it has (``count`` tells). A second interrupt
    raises ``at_once`` (a ``KeyboardInterrupt``) at once, for a step that
    does not end.

    The one implementation for the library's fit and ``daskpri train`` /
    ``demo`` (:mod:`daskpri.cli._interrupt`, with its own words). It takes
    ``SIGINT`` only where Python's own handler has it (a kernel running a
    cell, a script, the CLI as a foreground job) in the main thread: an
    ignored one (a background job's) stays ignored, and a handler of the
    caller's (the CLI's around :meth:`Trainer.fit`) is left as it is: one of
    this trainer's shares its :class:`Interrupts`, which the fit tells what
    it does (``stepping``, ``waiting``), for the caller's words.
    """
    previous = signal.getsignal(signal.SIGINT)
    if (threading.current_thread() is not threading.main_thread()
            or previous is not signal.default_int_handler):
        yield (previous.taken if isinstance(previous, _Stopper) and previous.trainer is trainer
               else Interrupts())
        return
    stopper = _Stopper(trainer, says, at_once)
    signal.signal(signal.SIGINT, stopper)
    try:
        yield stopper.taken
    finally:
        signal.signal(signal.SIGINT, previous)


def without_locals(interrupt: KeyboardInterrupt) -> KeyboardInterrupt:
    """``interrupt``, the variables of the frames it left (and its context's) cleared.

    IPython keeps the last error's traceback (``sys.last_traceback``, for
    ``%debug``) until the next error: the frames it passed would keep the
    trainer alive, and the LocalCluster it closes as it is dropped running.
    The lines stay, for the traceback shown.
    """
    seen: set[int] = set()
    exc: BaseException | None = interrupt
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # (the one still running is left)
        exc = exc.__cause__ or exc.__context__
    return interrupt


def dropped_by_interrupts(method: Callable[P, R]) -> Callable[P, R]:
    """``method`` of a trainer, its ``KeyboardInterrupt`` keeping no trainer alive.

    An interrupt in a public method (:attr:`Trainer.client` starting the
    trainer's LocalCluster, :meth:`Trainer.save` waiting on the cluster,
    ...) leaves a traceback through frames that hold the trainer; IPython
    keeps it (``sys.last_traceback``) until the next error, and with it the
    trainer that a notebook drops, and the LocalCluster its collection
    would close. The frames' variables are cleared (:func:`without_locals`),
    the wrapper's own included; the lines stay.
    """

    @functools.wraps(method)
    def dropping(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except KeyboardInterrupt as e:
            interrupt = e
        del args, kwargs  # (this frame is the traceback's first)
        raise without_locals(interrupt)

    return dropping


def warn_workers_unshielded(trainer: Trainer) -> None:
    """Warn, in a Jupyter kernel, where its interrupt would kill the workers of the user's cluster.

    Jupyter interrupts a kernel's whole process group: the workers of a
    LocalCluster the notebook started are in it, and die of the stop button
    (with the run's partitions, for good) unless they ignore ``SIGINT``, as
    :mod:`~daskpri.training.worker_signals` preloaded makes them (and makes
    those of the trainer's own LocalCluster). Asked once a trainer, best
    effort: a scheduler that does not answer is not warned of, and a worker
    that does not answer (frozen) is left out, each waited for the scheduler
    timeout at most (:func:`.transport.ask_workers`), the others' answers kept.
    """
    from daskpri.dashboard.notebook import in_jupyter
    from daskpri.training.placement import listed_workers
    from daskpri.training.transport import asked

    client = trainer._client
    if (trainer._own_cluster is not None or client is None or trainer._interrupts_checked
            or not hasattr(os, "getpgrp") or not in_jupyter()):
        return
    trainer._interrupts_checked = True
    timeout = _config.get_seconds("trainer.scheduler-timeout")

    async def answers() -> dict[str, Any]:
        listed = sorted(await listed_workers(client))
        return await asked(client, listed, killed_by_interrupts_of, os.getpgrp(), os.getpid(),
                           timeout=timeout)

    try:  # (a scheduler that stops answering between its two calls: bounded too)
        exposed = client.sync(answers, callback_timeout=3 * timeout)
    except Exception:
        return
    killed = sorted(address for address, yes in exposed.items() if yes is True)
    if killed:
        warn(
            f"{len(killed)} worker(s) of the cluster ({', '.join(killed)}) are in this "
            "kernel's process group and do not ignore its interrupt: the stop button kills "
            "them, with the run's data on them, for good; start the LocalCluster with "
            "preload=['daskpri.training.worker_signals'] to keep them"
        )


class Held:
    """The interrupts that :func:`interrupts_held` holds off, counted one by one."""

    def __init__(self, wakeup: socket.socket | None) -> None:
        #: the frames the held handler was called in (the first is handed on)
        self.frames: list[Any] = []
        self._wakeup = wakeup
        self._bytes = b""

    @property
    def count(self) -> int:
        """The interrupts so far, for a handler that takes them (none where ``SIGINT`` is ignored).

        Python runs a handler once for all the signals that came since it
        last ran, and the main thread runs it only when it wakes: two
        interrupts while it waits on a starting cluster would be one. Each
        signal writes its number to the wakeup socket, where they are counted.
        """
        if self._wakeup is None:
            return 0
        with contextlib.suppress(BlockingIOError, InterruptedError):  # read all there is
            while data := self._wakeup.recv(256):
                self._bytes += data
        return max(self._bytes.count(signal.SIGINT), len(self.frames))


def _listen(reader: socket.socket, done: socket.socket,
            on_interrupt: Callable[[], None] | None) -> None:
    """The thread of :func:`interrupts_held`: it takes the interrupts, and calls ``on_interrupt``.

    Where every other thread blocks ``SIGINT`` the system delivers it to this
    one, whose C handler writes it to the wakeup socket (``reader``'s pair);
    ``on_interrupt`` is called once, at the first, while the block still runs.
    The data is left to :attr:`Held.count`. ``done`` is readable once the block ends.
    """
    waiting = [reader, done] if on_interrupt is not None else [done]
    with contextlib.suppress(OSError, ValueError):  # (closed under it as the block ends)
        ready, _, _ = select.select(waiting, [], [])
        if reader in ready and on_interrupt is not None:
            on_interrupt()
            select.select([done], [], [])


@contextlib.contextmanager
def interrupts_held(on_interrupt: Callable[[], None] | None = None) -> Iterator[Held]:
    """Hold ``SIGINT`` (an interrupt, Ctrl-C) off a LocalCluster's start or close until done.

    Jupyter's interrupt and a terminal's Ctrl-C go to the whole process
    group: a worker process still starting, before the preload of
    :mod:`~daskpri.training.worker_signals` makes it ignore them, dies of
    one ("Nanny failed to start", tracebacks in later cells), and an
    interrupt raised in the middle of ``LocalCluster(...)`` leaves what had
    started running, owned by no one; one raised in its ``close()`` leaves
    it closing for ever. This thread blocks ``SIGINT`` while the block
    runs, so that the threads and processes a starting cluster starts are
    born with it blocked (a signal mask is inherited), and, in the main
    thread, an interrupt meanwhile is held and handed to the handler that
    was in place once the block is done, and the trainer's state says what
    it did: Python's handler raises ``KeyboardInterrupt`` then, a fit's
    ends the fit (:func:`stop_on_interrupt`). Two or more are handed on as
    two, a fit's "stop at once"; the block sees them counted in
    :attr:`Held.count` as they come (:meth:`Trainer.client` gives its
    start up on a second).

    ``on_interrupt`` is called at the first interrupt while the block runs,
    in a thread of its own, where the interrupt is counted (``SIGINT`` not
    ignored; not on Windows): a close that waits on a stuck worker kills it
    so (:func:`~daskpri.training._cleanup.close_cluster`). A block that
    reads :attr:`Held.count` itself may take the interrupt before it is seen.
    """
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    # counted for a Python handler; an ignored SIGINT is held, and dropped, uncounted
    counted = callable(previous)
    reader = writer = listener = None
    ended, end = socket.socketpair()  # readable by _listen once the block is done
    if counted:
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
    held = Held(reader)
    wakeup = -1 if writer is None else signal.set_wakeup_fd(writer.fileno())
    if main:
        signal.signal(signal.SIGINT, lambda signum, frame: held.frames.append(frame))
    blocking = hasattr(signal, "pthread_sigmask")  # not on Windows
    if blocking:
        # started now if not yet: starting it unblocks SIGINT in the thread that
        # does (the cluster's event loop, by whose threads its workers start)
        resource_tracker.ensure_running()
        if counted:
            # a thread that takes each interrupt as it comes: where every thread blocks
            # it (a script's), the system keeps one pending, however many came
            assert reader is not None
            listener = threading.Thread(target=_listen, args=(reader, ended, on_interrupt),
                                        name="daskpri-interrupts", daemon=True)
            listener.start()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield held
    finally:
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        end.close()
        if listener is not None:  # (it ends as it reads ``ended``'s end)
            listener.join()
        if writer is not None:
            signal.set_wakeup_fd(wakeup)
        if main:  # (None: a handler not set from Python, which cannot be put back)
            # (signal.signal runs the held handler for signals not handled yet first)
            signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        count = held.count
        if reader is not None and writer is not None:
            if wakeup != -1:  # the signals' numbers are the wakeup fd's owner's too
                with contextlib.suppress(OSError):
                    os.write(wakeup, held._bytes)
            reader.close()
            writer.close()
        ended.close()
    if count and callable(previous):
        for _ in range(min(count, 2)):
            previous(signal.SIGINT, held.frames[0] if held.frames else None)
