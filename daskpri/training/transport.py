"""How a step's work reaches the workers: direct RPCs or Dask tasks; asking them directly.

Both return one :class:`~daskpri.replicas.worker.StepResult` per worker slot,
in slot order, and give up on a step that a worker has not finished within
``timeout`` seconds with :class:`StepTimeout`: a worker that is alive but
stuck (a hung device, a deadlock) never hangs the run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from distributed import Client, Future
from distributed.comm import CommClosedError
from distributed.protocol import pickle
from distributed.protocol.serialize import Serialize, to_serialize

from daskpri import _config
from daskpri.replicas.arrival import settled
from daskpri.replicas.tasks import import_worker_side
from daskpri.replicas.worker import StepResult, raise_state_lost
from daskpri.training.errors import WorkersLostError
from daskpri.training.placement import cluster_workers, eligible_workers, listed_workers

logger = logging.getLogger(__name__)

#: seconds a step's calls run before the driver asks the scheduler whether their workers are there
WATCH_INTERVAL = 2.0


class WorkersGone(ConnectionError):
    """Workers the scheduler no longer lists, while a step's calls to them were outstanding.

    A worker that died between steps refuses the next call's connection,
    which distributed retries until its connect timeout
    (``distributed.comm.timeouts.connect``, 30 s). A lost worker (see
    ``daskpri.training.recovery.LOST``).
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        super().__init__(
            f"worker(s) {', '.join(self.addresses)} left the cluster during the step"
        )


class StepTimeout(TimeoutError):
    """Workers that did not finish their share of a step (or ``doing``, a placement's) in time."""

    def __init__(self, addresses: Sequence[str], timeout: float,
                 doing: str = "finish their share of the step") -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        super().__init__(
            f"worker(s) {', '.join(self.addresses)} did not {doing} "
            f"within {timeout:g} s (daskpri.trainer.step-timeout)"
        )


def scatter_to(client: Client, data: list[Any], address: str, timeout: float) -> list[Future]:
    """``client.scatter(data, workers=[address], hash=False)``, ``timeout`` seconds at most.

    The scheduler sends the data on to the worker and waits for its
    answer: one that froze since it last answered (its process stopped, its
    host gone) holds the send, and the scatter, until the scheduler drops
    it (``distributed.scheduler.worker-ttl``, 5 minutes by default), if
    ever. Past ``timeout``, :class:`StepTimeout` names it (a lost worker:
    the caller re-plans without it).
    """

    async def scattered() -> list[Future]:
        send = asyncio.ensure_future(
            client.scatter(data, workers=[address], hash=False, asynchronous=True))
        done, _ = await asyncio.wait({send}, timeout=timeout)
        if not done:
            send.cancel()
            raise StepTimeout([address], timeout, "take its partitions' data")
        return list(send.result())

    return client.sync(scattered)


def gather_within(client: Client, futures: Sequence[Future], workers: Sequence[str],
                  timeout: float, doing: str) -> list[Any]:
    """``client.gather(futures)`` (tasks meant for ``workers``), ``timeout`` seconds at most.

    A task sent to a worker that froze since it last answered waits for it
    as long as the scheduler lists it (``distributed.scheduler.worker-ttl``).
    Past ``timeout``, :class:`StepTimeout` names the workers of the tasks
    not done (``doing``: what they did not do); the caller cancels them.
    """

    async def gathered() -> list[Any]:
        # (not distributed.wait, which waits through the default client: there may be none)
        return list(await asyncio.wait_for(
            client.gather(list(futures), asynchronous=True), timeout))

    try:
        return client.sync(gathered)
    except TimeoutError:
        late = sorted({w for w, f in zip(workers, futures, strict=True) if not f.done()})
        raise StepTimeout(late, timeout, doing) from None


def run_direct(
    client: Client,
    calls: Sequence[tuple[str, tuple[Any, ...]]],
    name: str,
    timeout: float,
    then: Callable[[], None] | None = None,
) -> list[StepResult]:
    """One ``daskpri_train`` RPC per ``(address, payload)``, concurrently.

    The first failure (a worker that died closes its connection) is raised
    at once; workers still busy after ``timeout`` raise :class:`StepTimeout`.
    While calls are outstanding, the scheduler is asked every
    :data:`WATCH_INTERVAL` seconds whether their workers are still there
    (a step shorter than that never asks); a call to a worker it has
    dropped raises :class:`WorkersGone`. ``then`` is called on the event
    loop once the calls have started.
    """

    def outstanding(tasks: Sequence[asyncio.Future[Any]], done: set[Any]) -> list[str]:
        return [addr for (addr, _), task in zip(calls, tasks, strict=True) if task not in done]

    async def dispatch() -> list[StepResult]:
        tasks = [
            asyncio.ensure_future(
                client.rpc(addr).daskpri_train(name=name, payload=to_serialize(payload))
            )
            for addr, payload in calls
        ]
        if then is not None:
            await asyncio.sleep(0)  # the calls start (and send) first
            then()
        deadline = time.monotonic() + timeout
        try:
            while True:
                wait = max(0.0, min(WATCH_INTERVAL, deadline - time.monotonic()))
                done, pending = await asyncio.wait(
                    tasks, timeout=wait, return_when=asyncio.FIRST_EXCEPTION
                )
                failed = any(t.exception() is not None for t in done)
                if not pending or failed or time.monotonic() >= deadline:
                    break
                listed = await listed_workers(client)
                gone = [a for a in outstanding(tasks, done) if a not in listed]
                if gone:
                    for task in pending:
                        task.cancel()
                    raise WorkersGone(gone)
        except asyncio.CancelledError:
            # the caller gave up (a second Ctrl-C in client.sync): the calls go with
            # it, rather than fail unretrieved when the client's connections close,
            # which asyncio would report with a traceback after the interrupt's line
            for task in tasks:
                task.cancel()
            raise
        for task in pending:
            task.cancel()
        for task in tasks:
            if task in done and task.exception() is not None:
                raise task.exception()
        if pending:
            raise StepTimeout(outstanding(tasks, done), timeout)
        # in-process (inproc://) comms hand the wrapper over as it is
        out = [task.result() for task in tasks]
        out = [r.data if isinstance(r, Serialize) else r for r in out]
        for r in out:
            raise_state_lost(r)
        return out

    return client.sync(dispatch)


def wait_tasks(
    client: Client,
    futures: Sequence[Future],
    workers: Sequence[str],
    resources: dict[str, float] | None,
    no_workers_timeout: float,
    timeout: float,
) -> list[StepResult]:
    """Results of ``futures`` (the step's tasks, meant for ``workers``).

    Raises ``RuntimeError`` if no suitable worker is left for
    ``no_workers_timeout`` seconds, and :class:`StepTimeout` (cancelling the
    step's tasks) if they are not all done after ``timeout`` seconds.
    """
    start = time.monotonic()
    deadline: float | None = None
    results = []
    for future in futures:
        while True:
            try:
                results.append(future.result(timeout=1.0))
                raise_state_lost(results[-1])
                break
            except TimeoutError:
                if time.monotonic() - start > timeout:
                    late = [w for w, f in zip(workers, futures, strict=True) if not f.done()]
                    client.cancel(list(futures))
                    raise StepTimeout(late, timeout) from None
                info = cluster_workers(client)
                try:
                    eligible_workers(info, resources, client.scheduler.address)
                    deadline = None
                except (RuntimeError, ValueError) as e:
                    deadline = deadline or time.monotonic() + no_workers_timeout
                    if time.monotonic() > deadline:
                        raise WorkersLostError(
                            f"no suitable worker for {no_workers_timeout:g} s "
                            "(daskpri.trainer.no-workers-timeout): " + str(e)
                        ) from e
    return results


#: seconds a step's scatter waits for a worker that takes data before the driver asks why
SCATTER_WAIT = 1.0


def scatter_running(
    client: Client, data: Any, resources: dict[str, float] | None, no_workers_timeout: float,
    workers: list[str] | None = None, timeout: float | None = None,
) -> Future:
    """``data`` scattered (its future) once a worker takes data: a step's weights.

    A paused worker (its memory over ``distributed.worker.memory.pause``)
    takes no data, and distributed's scatter waits for one that does for its
    connect timeout (``distributed.comm.timeouts.connect``, 30 s) before it
    fails with "No valid workers found". After :data:`SCATTER_WAIT` seconds
    the scheduler is asked why: where every suitable worker is paused, this
    waits ``no_workers_timeout`` seconds for one to resume, then raises the
    ``ValueError`` of
    :func:`~daskpri.training.placement.eligible_workers`, naming them with
    their memory, as a re-plan does. Any other want (no worker at all) is
    the scatter's ``TimeoutError``, a lost worker, at once.

    Only ``workers`` (the run's) are sent it: the scheduler sends each
    scatter to the next of the workers it may use, a frozen one included
    (one the run left out), and its send waits for an answer until the
    scheduler drops that worker (``distributed.scheduler.worker-ttl``, 5
    minutes by default). A scatter not done after ``timeout`` seconds
    raises :class:`StepTimeout`, naming those of ``workers`` that do not
    answer (:func:`asked`, 2 s); one the scheduler dropped, :class:`WorkersGone`.
    """
    deadline = None

    async def scattered() -> Future:
        send = asyncio.ensure_future(client.scatter(
            [data], workers=workers, hash=False, timeout=SCATTER_WAIT, asynchronous=True))
        done, _ = await asyncio.wait({send}, timeout=timeout)
        if not done:
            send.cancel()
            found = await asked(client, workers or [], os.getpid, timeout=2.0)
            silent = [a for a, r in found.items() if not isinstance(r, int)]
            raise StepTimeout(silent or workers or [], timeout or 0.0)
        try:
            [future] = send.result()
        except KeyError:  # (the scheduler's, for a worker of ``workers`` it dropped)
            listed = await listed_workers(client)
            raise WorkersGone([a for a in workers or [] if a not in listed]) from None
        return future

    while True:
        try:
            return client.sync(scattered)
        except StepTimeout:
            raise
        except TimeoutError as e:
            deadline = deadline or time.monotonic() + no_workers_timeout
            try:
                eligible_workers(cluster_workers(client), resources, client.scheduler.address)
            except ValueError:  # every suitable worker is paused
                if time.monotonic() > deadline:
                    raise
            except RuntimeError:
                raise e from None  # no worker at all: lost, as the step's retry finds
            else:
                if time.monotonic() > deadline:  # one runs, but takes no data
                    raise e from None


def ask_workers(
    client: Client, addresses: list[str], function: Callable[..., Any], *args: Any,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """``function(*args, dask_worker=...)`` on each of ``addresses``: their answers, or errors.

    As ``client.run(..., on_error="return")``, but each worker is asked by
    the driver itself, if the scheduler still lists it (else the answer is
    :class:`WorkersGone`), and waited for ``timeout`` seconds at most (the
    error then a ``TimeoutError``): the scheduler's broadcast, which
    ``client.run`` is, retries a connection that a worker that has just
    died refuses for ``distributed.comm.timeouts.connect`` (30 s by
    default) before it gives up, and workers die during a set-up, or a
    recovery, as they do in a step. :func:`asked` is its coroutine, to
    await with others on the client's loop.
    """
    return client.sync(asked, client, addresses, function, *args, timeout=timeout)


async def asked(
    client: Client, addresses: list[str], function: Callable[..., Any], *args: Any,
    timeout: float = 5.0,
) -> dict[str, Any]:
    """:func:`ask_workers`, awaited on the client's event loop."""
    payload = {"function": pickle.dumps(function), "args": pickle.dumps(args)}
    listed = await listed_workers(client)

    async def ask(address: str) -> Any:
        if address not in listed:
            return WorkersGone([address])
        try:
            answer = await asyncio.wait_for(client.rpc(address).run(**payload), timeout)
        except Exception as e:
            return e
        if answer.get("status") != "OK":
            return RuntimeError(f"{answer.get('exception')!r}")
        return answer["result"]

    answers = await asyncio.gather(*(ask(a) for a in addresses))
    return dict(zip(addresses, answers, strict=True))


#: seconds each worker has to answer as a run's replicas are registered or dropped
#: (:func:`register`, :func:`unregister`)
REGISTER_ANSWER_TIMEOUT = 5.0

#: seconds a worker that the run left out, as one that did not answer, is given again as
#: the run's replicas are dropped (:func:`unregister`)
SILENT_AGAIN_TIMEOUT = 1.0


def register(
    client: Client, plugin: Any, silent: Collection[str] = (), modules: Collection[str] = ()
) -> list[str]:
    """``client.register_plugin(plugin)`` (a worker plugin), not held up by a worker that
    does not answer: the workers left out, that do not answer.

    The scheduler keeps the plugin for the workers that join, and broadcasts
    it to those there, waiting for each: a worker that the scheduler lists
    but that does not answer (its host gone or frozen, its event loop held)
    holds the broadcast until the scheduler drops it
    (``distributed.scheduler.worker-ttl``, 5 minutes by default). Each
    worker is asked first whether it answers, for
    :data:`REGISTER_ANSWER_TIMEOUT` seconds, but for those of ``silent``
    (which the cluster's probe found silent moments ago: not waited for
    again). Asked once the broadcast has started, a worker cannot tell a
    freeze from a set-up, which holds its event loop: this one round trip
    is the last look at which a worker that froze since the probe is told
    apart. A worker that died is dropped by the scheduler at once, failing
    the broadcast as before. Those that answer then import the worker's side
    of daskpri, torch and ``modules`` (the model's) in a thread
    (:func:`~daskpri.replicas.tasks.import_worker_side`), for
    ``daskpri.trainer.setup-timeout`` at most, so that the plugin's
    set-up, on their event loops, does not.

    The others' set-ups are waited for (each answers once its own ended),
    ``daskpri.trainer.setup-timeout`` each at most (one that has not
    answered by then is left out too, and said so apart: a slow set-up,
    not a frozen worker), and the broadcast is left to reach
    the silent ones if they come back; they hold no replica meanwhile, and
    take no part in the run (the caller plans without them). Where none
    answers, the broadcast is waited for
    ``daskpri.trainer.no-workers-timeout`` (the scheduler drops a dead
    worker, which fails it: the caller retries on the workers left), then
    :class:`~daskpri.training.errors.WorkersLostError` names them. A set-up
    that fails on a worker raises, as ``client.register_plugin`` does,
    where the broadcast ends in time.
    """
    name = plugin.name
    setup_timeout = _config.get_seconds("trainer.setup-timeout")
    slow: list[str] = []  # left out as their set-up outlasted setup_timeout

    async def registered() -> list[str]:
        listed = sorted(await listed_workers(client))
        # asked before the broadcast (a worker's set-up holds its event loop), a builtin:
        # daskpri's modules, unpickled there, would import torch before the replica does
        quiet = await _silent(client, listed, silent)
        # then torch, in a thread of each (an import's failure is the set-up's to raise)
        imported = await asked(client, [a for a in listed if a not in quiet],
                               import_worker_side, sorted(modules),
                               getattr(plugin, "resources", None),  # (a ReplicaPlugin's)
                               timeout=setup_timeout)
        await _raise_died(client, imported)
        # one that froze since, or imports for longer than a set-up may take: left out, as a
        # set-up's that did not end in that time is (not waited for a second time)
        slow.extend(a for a, r in imported.items() if isinstance(r, TimeoutError))
        quiet += slow
        broadcast = asyncio.ensure_future(
            client.scheduler.register_worker_plugin(
                plugin=pickle.dumps(plugin), name=name, idempotent=False)
        )
        # (its end, an error included, is retrieved: the silent workers' answer, or drop)
        broadcast.add_done_callback(lambda f: f.cancelled() or f.exception())
        if len(quiet) == len(listed):  # none to go on with: it is waited for, as long
            wait = _config.get_seconds("trainer.no-workers-timeout")
            await asyncio.wait({broadcast}, timeout=wait)
            if not broadcast.done():
                raise WorkersLostError(
                    f"no worker of the cluster answered within {wait:g} s "
                    f"(daskpri.trainer.no-workers-timeout) as the run's replicas were set "
                    f"up: {', '.join(listed) or 'none listed'}; a worker whose host is frozen "
                    "or gone, or whose event loop is held, answers nothing: restart (or stop) "
                    "those workers, or wait for them, and fit again"
                )
            _raise_errors(broadcast.result())
            return []
        limit = setup_timeout
        if not quiet:  # it ends once each set-up has: waited for, as before, but bounded
            await asyncio.wait({broadcast}, timeout=limit)
            if broadcast.done():
                _raise_errors(broadcast.result())
                return []
            limit = REGISTER_ANSWER_TIMEOUT  # (the set-ups had their time)
        pending = [a for a in listed if a not in quiet]
        while pending and not broadcast.done():
            # each answers once the plugin reached it and its set-up (on its event loop) ended
            found = await asked(client, pending, _holds, name, timeout=limit)
            # one that stopped answering since it was asked (frozen, or its set-up on its
            # event loop outlasting the limit) is left out
            late = [a for a, r in found.items() if isinstance(r, TimeoutError)]
            quiet += late
            if limit == setup_timeout:
                slow.extend(late)
            pending = [a for a, r in found.items() if r is False]
            if pending:
                await asyncio.wait({broadcast}, timeout=0.1)
        if broadcast.done():
            _raise_errors(broadcast.result())
        return quiet

    left_out = client.sync(registered)
    frozen = [a for a in left_out if a not in slow]
    if frozen:
        logger.warning(
            "worker(s) %s did not answer within %g s as the run's replicas were set up: the "
            "run goes on without them (each joins it once it answers again: restart, or stop, "
            "a worker that stays frozen)", ", ".join(frozen), REGISTER_ANSWER_TIMEOUT,
        )
    if slow:
        logger.warning(
            "worker(s) %s did not set the run's replica up within %g s "
            "(daskpri.trainer.setup-timeout: importing torch and the model's modules, building "
            "the model on its device): the run goes on without them (each joins it once it "
            "answers again; raise the timeout where torch's import or the model is slow)",
            ", ".join(slow), setup_timeout,
        )
    return left_out


def unregister(
    client: Client, name: str, timeout: float, silent: Collection[str] = ()
) -> None:
    """``client.unregister_worker_plugin(name)``, not held up by a worker that does not answer.

    The scheduler forgets the plugin at once, then tells each worker,
    waiting for each (as :func:`register`'s broadcast does). Where it has
    not answered after :data:`REGISTER_ANSWER_TIMEOUT` seconds, each worker
    is asked whether it still holds the plugin: those that do not answer
    within that time are named in a warning (each keeps its replica until
    it answers again, when the scheduler's message reaches it), the others
    are waited for, ``timeout`` seconds in all (a worker stuck in a step
    answers nothing either). Raises ``TimeoutError`` where those that
    answered did not drop it in time.

    Workers of ``silent`` (the run left them out: they did not answer, in
    a step or as it was set up) hold the scheduler's call, as like as not:
    where one is listed, the workers are asked after
    :data:`SILENT_AGAIN_TIMEOUT` seconds rather than
    :data:`REGISTER_ANSWER_TIMEOUT`, and the silent ones are given that
    long to answer, not more.
    """

    async def dropped() -> list[str]:
        listed = sorted(await listed_workers(client))
        known = {a for a in listed if a in silent}
        call = asyncio.ensure_future(client.scheduler.unregister_worker_plugin(name=name))
        call.add_done_callback(lambda f: f.cancelled() or f.exception())
        deadline = time.monotonic() + timeout
        first = SILENT_AGAIN_TIMEOUT if known else REGISTER_ANSWER_TIMEOUT
        await asyncio.wait({call}, timeout=min(timeout, first))
        quiet: list[str] = []
        pending = listed
        while not call.done() and time.monotonic() < deadline:
            # the call waits for a worker: each is asked instead
            left = min(REGISTER_ANSWER_TIMEOUT, max(0.0, deadline - time.monotonic()))
            others, again = await asyncio.gather(
                asked(client, [a for a in pending if a not in known], _holds, name,
                      timeout=left),
                asked(client, [a for a in pending if a in known], _holds, name,
                      timeout=min(left, SILENT_AGAIN_TIMEOUT)),
            )
            found = {**others, **again}
            quiet += [a for a in pending if isinstance(found[a], TimeoutError)]
            pending = [a for a in pending if found[a] is True]
            if not pending:
                return quiet
            await asyncio.wait({call}, timeout=0.1)
        if not call.done():
            call.cancel()
            raise TimeoutError(
                f"worker(s) {', '.join(pending)} did not drop plugin {name} within {timeout:g} s")
        call.result()  # (an unknown plugin's ValueError)
        return []

    quiet = client.sync(dropped)
    if quiet:
        logger.warning(
            "worker(s) %s did not answer as the run's replicas were dropped (within %g s; "
            "%g s for those the run had left out): each keeps its replica (and its memory) "
            "until it answers again; restart (or stop) a worker that stays frozen",
            ", ".join(quiet), REGISTER_ANSWER_TIMEOUT, SILENT_AGAIN_TIMEOUT,
        )


async def _raise_died(client: Client, answers: dict[str, Any]) -> None:
    """Raise ``CommClosedError`` where workers died as they answered (killed for memory
    as they imported torch, say), once the scheduler has dropped them.

    As the plugin's broadcast failed where they died in its set-up: the
    caller tells a restart for memory, or sets up again on the workers left.
    Workers that the scheduler still lists after
    :data:`REGISTER_ANSWER_TIMEOUT` seconds (a connection broken, the worker
    alive) are left to the broadcast.
    """
    died = [a for a, r in answers.items()
            if isinstance(r, OSError) and not isinstance(r, TimeoutError)]
    deadline = time.monotonic() + REGISTER_ANSWER_TIMEOUT
    while died and time.monotonic() < deadline:
        listed = await listed_workers(client)
        if not set(died) & set(listed):
            raise CommClosedError(f"worker(s) {', '.join(died)} died as they imported torch "
                                  "and the model's modules for the run's replicas")
        await asyncio.sleep(0.1)


async def _silent(client: Client, listed: list[str], known: Collection[str] = ()) -> list[str]:
    """Those of ``listed`` that do not answer within :data:`REGISTER_ANSWER_TIMEOUT`
    (``known`` ones not asked)."""
    ask = [a for a in listed if a not in known]
    answers = await asked(client, ask, os.getpid, timeout=REGISTER_ANSWER_TIMEOUT)
    return [a for a in listed if a in known or not isinstance(answers[a], int)]


def _raise_errors(responses: dict[str, Any]) -> None:
    """Raise a worker's error of a plugin's broadcast, as ``client.register_plugin`` does."""
    from distributed.core import clean_exception

    for response in responses.values():
        if response.get("status") == "error":
            _, exc, tb = clean_exception(response["exception"], response["traceback"])
            assert exc is not None
            raise exc.with_traceback(tb)


async def _holds(name: str, dask_worker: Any) -> bool:
    """On a worker: whether it holds plugin ``name``, its set-up ended."""
    return await settled(name, dask_worker) is not None
