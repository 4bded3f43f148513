"""Failures of the cluster: lost workers, the timeouts, a lost scheduler.

What counts as a lost worker (after which a step is re-planned on the
workers left), why workers left (retired by the scheduler, killed by their
nanny for memory: :func:`how_workers_left`) and how that is said, how long
the trainer waits for workers and steps, and how a scheduler that stopped
answering is told apart from any other error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import CancelledError
from typing import TYPE_CHECKING, Any

from distributed import Client, Future
from distributed.comm import CommClosedError
from distributed.scheduler import KilledWorker

from daskpri import _config
from daskpri.data.io import FILE_ERRORS as FILE_ERRORS
from daskpri.replicas.tasks import StoreRef
from daskpri.training import checkpoint

# defined with the other errors (the command line names them without importing torch)
from daskpri.training.errors import SchedulerLostError as SchedulerLostError
from daskpri.training.transport import ask_workers

if TYPE_CHECKING:
    from daskpri.training.deployment import Deployment

logger = logging.getLogger(__name__)

# Failures that mean "a worker (and what it held) is gone", after which a step
# is re-planned on the workers left; anything else is the user's error.
LOST = (CancelledError, KilledWorker, CommClosedError, OSError)

# A live worker's OSErrors about the data's files (FILE_ERRORS) are the user's
# to mend, not a worker lost: every handler of LOST lets them through first;
# retried, they failed only after the no-workers timeout or eleven attempts.


def step_timeout() -> float:
    """The step timeout of the ``daskpri.trainer`` config, in seconds."""
    return _config.get_seconds("trainer.step-timeout")


def dask_timeout() -> float:
    """The no-workers timeout of the ``daskpri.trainer`` config, in seconds."""
    return _config.get_seconds("trainer.no-workers-timeout")


def rescan_interval() -> float:
    """How often a run looks for workers that joined, from the ``daskpri.trainer`` config, in s."""
    return _config.get_seconds("trainer.rescan-interval")


def check_config() -> None:
    """Read the durations and counts of the ``daskpri.trainer`` config, raising on a bad one.

    A fit calls it before sending any work, rather than finding a bad value
    where it is first needed: after a failure.
    """
    for key in ("step-timeout", "no-workers-timeout", "rescan-interval", "scheduler-timeout",
                "probe-timeout", "setup-timeout"):
        _config.get_seconds(f"trainer.{key}")
    _config.get_int("trainer.max-retries", 0)
    _config.get_int("trainer.partition-size", 1)
    _config.get_int("table.histogram-bins", 1)


def is_lost(ref: StoreRef | Future | None) -> bool:
    """Whether a partition's scattered data is gone (a store is never lost)."""
    return isinstance(ref, Future) and ref.status != "finished"


def responsive(client: Client, addresses: list[str], timeout: float = 2.0) -> list[str]:
    """Those of ``addresses`` whose worker answers within ``timeout`` seconds, each asked
    directly (:func:`~daskpri.training.transport.ask_workers`)."""
    found = ask_workers(client, addresses, os.getpid, timeout=timeout)
    return [a for a in addresses if isinstance(found[a], int)]


#: the topic of the event a nanny logs on the scheduler when it restarts its worker for memory
MEMORY_RESTART = "worker-restart-memory"


def memory_restarts(client: Client) -> int:
    """How many workers' restarts for memory the scheduler has logged so far (see
    :func:`restarted_for_memory`); 0 if it does not say."""
    try:
        return len(client.get_events(MEMORY_RESTART))
    except Exception:
        return 0


def restarted_for_memory(client: Client, since: int, wait: float = 2.0) -> str | None:
    """Why workers were lost since ``since``: their nanny restarted them for memory (or ``None``).

    ``since`` is :func:`memory_restarts` from before. Any worker of the
    cluster counts: the replicas are built on every one, those that the run
    does not use included. A nanny whose worker's
    memory passes ``distributed.worker.memory.terminate`` (95% of its
    ``--memory-limit``) kills it, then starts it again, under a new address,
    and logs an event on the scheduler, which may arrive after the call that
    lost the worker failed: it is waited for ``wait`` seconds at most.
    """
    from dask.utils import format_bytes

    deadline = time.monotonic() + wait
    while True:
        try:
            events = list(client.get_events(MEMORY_RESTART))[since:]
        except Exception:
            return None
        hits = [e for _, e in events if isinstance(e, dict) and e.get("worker")]
        if hits or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not hits:
        return None
    each = ", ".join(
        f"{e['worker']} (at {format_bytes(e['rss'])})" if e.get("rss") else str(e["worker"])
        for e in hits
    )
    return (
        f"worker(s) {each} were killed and restarted by their nanny as they built the run's "
        "replica (torch and the model): their memory passed distributed.worker.memory.terminate "
        "(95% of a worker's memory limit by default); start the workers with a larger limit "
        "(dask worker --memory-limit 4GB, or 0 for none)"
    )


#: what to do about workers killed for memory as they train
MEMORY_ADVICE = (
    "train with a smaller batch_size (--batch-size), on more workers (each then holds fewer "
    "partitions of the data), or start the workers with a larger memory limit (dask worker "
    "--memory-limit 8GB, or 0 for none)"
)


def how_workers_left(
    client: Client, addresses: Sequence[str], wait: float = 0.0
) -> tuple[set[str], dict[str, int | None]]:
    """``(retired, killed)``: which of ``addresses`` the scheduler retired, and which their
    nanny killed for memory (by address: its memory then, if said).

    A worker retired (``client.retire_workers``, a cluster scaling down) is
    removed by the scheduler as *expected*, once its data is copied to other
    workers, and the scheduler logs that in the worker's own topic before it
    tells it to close; a nanny logs a worker's restart for memory
    (:data:`MEMORY_RESTART`) before it kills it. Only events since the
    worker last joined count (a worker started again at a fixed port has
    the address of the one before). One call
    to the scheduler (a request per address, at once), made again for
    ``wait`` seconds at most while it finds neither (a nanny's event may
    arrive after the call that lost its worker failed); nothing is found
    where the scheduler does not answer.
    """

    async def look() -> tuple[Any, list[Any]]:
        kills = await client.scheduler.events(topic=MEMORY_RESTART)
        own = await asyncio.gather(*(client.scheduler.events(topic=a) for a in addresses))
        return kills, list(own)

    deadline = time.monotonic() + wait
    while True:
        try:
            kills, own = client.sync(
                look, callback_timeout=_config.get_seconds("trainer.scheduler-timeout")
            )
        except Exception:
            return set(), {}
        # when each joined last: a worker started again at a fixed port has the address
        # (and topic) of the one before, whose retirement or kill is not its own
        joined = {
            a: max((t for t, e in events if isinstance(e, dict)
                    and e.get("action") == "add-worker"), default=0.0)
            for a, events in zip(addresses, own, strict=True)
        }
        killed = {
            str(e["worker"]): e.get("rss")
            for t, e in kills
            if isinstance(e, dict) and e.get("worker") in joined and t >= joined[e["worker"]]
        }
        retired = {
            a
            for a, events in zip(addresses, own, strict=True)
            if a not in killed
            and any(
                isinstance(e, dict) and e.get("action") == "remove-worker" and e.get("expected")
                and t >= joined[a]
                for t, e in events
            )
        }
        if killed or retired or time.monotonic() >= deadline:
            return retired, killed
        time.sleep(0.1)


def killed_for_memory(killed: Mapping[str, int | None], limits: Mapping[str, int]) -> str:
    """Which workers their nanny killed for memory, at what memory, of what limit.

    ``killed`` is :func:`how_workers_left`'s; ``limits`` the workers' memory
    limits (those not there go unsaid).

    Examples
    --------
    >>> print(killed_for_memory({"tcp://a:1": 2 * 10**9}, {"tcp://a:1": 2**31}))
    ... # doctest: +NORMALIZE_WHITESPACE
    worker(s) tcp://a:1 (at 1.86 GiB of its 2.00 GiB memory limit) were killed by their nanny
    for memory as they trained: a worker's memory passed distributed.worker.memory.terminate
    (95% of its limit by default)
    """
    from dask.utils import format_bytes

    def at(address: str) -> str:
        rss, limit = killed[address], limits.get(address)
        if rss and limit:
            return f"{address} (at {format_bytes(rss)} of its {format_bytes(limit)} memory limit)"
        if limit:
            return f"{address} (of a {format_bytes(limit)} memory limit)"
        return f"{address} (at {format_bytes(rss)})" if rss else address

    return (
        f"worker(s) {', '.join(at(a) for a in sorted(killed))} were killed by their nanny for "
        "memory as they trained: a worker's memory passed distributed.worker.memory.terminate "
        "(95% of its limit by default)"
    )


def report_left(
    deployment: Deployment,
    step: int,
    before: list[str],
    retired: set[str],
    kills: dict[str, int | None],
    lost: str | None,
    then: str = "",
) -> None:
    """Log, once ``deployment`` is re-planned, why workers left: retired, killed for memory,
    or ``lost``.

    ``before`` is the partitions' owners before the re-plan; ``retired``
    and ``kills`` are :func:`how_workers_left`'s; ``lost`` says what else
    was lost (``None``: nothing); ``then`` what another memory kill does. A
    retirement is the cluster's choice, not a failure, and is said so; it
    is logged at WARNING all the same, as workers joining are, where a user
    of the CLI sees it.
    """
    after = deployment.owner_addr
    n = len(deployment.slots)
    if retired:
        moved_to = sorted({b for a, b in zip(before, after, strict=True) if a in retired})
        logger.warning(
            "step %d: worker(s) %s retired; their partitions moved to %s, the run goes on "
            "with %d", step, ", ".join(sorted(retired)), ", ".join(moved_to), n,
        )
    if kills:
        logger.warning(
            "step %d: %s; their partitions moved, the run goes on with %d%s: %s",
            step, killed_for_memory(kills, deployment.memory_limits), n, then, MEMORY_ADVICE,
        )
    if lost is not None:
        logger.warning("step %d: %s, the run goes on with %d", step, lost, n)


def scheduler_id(client: Client) -> str | None:
    """The id of the scheduler ``client`` is connected to (``None`` if it does not say).

    A scheduler started again at the same address (by a supervisor) has
    another: the client and the workers reconnect to it, but the runs'
    tables, replicas and partitions went with the first.
    """
    try:
        return str(client.sync(client.scheduler.identity)["id"])
    except Exception:
        return None


#: seconds between a fit's looks at whether its scheduler is gone (:func:`watch_scheduler`)
GONE_INTERVAL = 0.5


async def refuses(address: str, timeout: float = 1.0) -> bool:
    """Whether a scheduler's ``address`` refuses a connection: nothing listens there.

    One attempt, not distributed's retries (which go on for
    ``distributed.comm.timeouts.connect``, 30 s by default): a refusal is
    the host's own word that no process listens at the port, where a
    scheduler that is only slow still accepts the connection (its backlog
    does), and one on a host that does not answer is timed out, ``False``
    either way. Only ``tcp://`` and ``tls://`` addresses are tried.
    """
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(address)
        if scheme not in ("tcp", "tls"):
            return False
        host, port = parse_host_port(loc)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except ConnectionRefusedError:
        return True
    except (TimeoutError, OSError, ValueError):
        return False
    writer.close()
    return False


def _comm_closed(client: Client) -> bool:
    """Whether ``client`` lost (or closed) its connection to the scheduler."""
    comm = getattr(client, "scheduler_comm", None)
    return client.status != "running" or comm is None or comm.closed()


class _Watch:
    """A client's :func:`watch_scheduler`: the blocks it watches for, and its run."""

    def __init__(self) -> None:
        self.blocks = 0  # blame_scheduler blocks running (a fit's thread's)
        self.future: concurrent.futures.Future[None] | None = None


# one watch a client, that ends a moment after its last block: a block costs no
# message to the client's event loop (a step's block, 0.1 ms, at each step)
_watches: weakref.WeakKeyDictionary[Client, _Watch] = weakref.WeakKeyDictionary()


async def watch_scheduler(
    client: Client, address: str, watch: _Watch, interval: float = GONE_INTERVAL
) -> None:
    """Cut the calls waiting to connect to a scheduler that is gone, while blocks run.

    Every ``interval`` seconds while ``watch`` has blocks: where
    ``client``'s connection to the scheduler closed and ``address``
    :func:`refuses` a new one, the connections that ``client``'s calls are
    trying to open to it fail at once (``CommClosedError``), rather than
    after ``distributed.comm.timeouts.connect`` (a scheduler shut down,
    closed for idleness or killed). A scheduler that is only slow keeps
    its connection, and its calls wait as they did. Ends after four looks
    without a block, or once the client closes.
    """
    idle = 0
    while client.status not in ("closing", "closed") and idle < 4:
        await asyncio.sleep(interval)
        idle = 0 if watch.blocks else idle + 1
        if watch.blocks and _comm_closed(client) and await refuses(address):
            client.rpc.remove(address, reason=f"the scheduler at {address} refuses connections")


def scheduler_gone(client: Client) -> bool:
    """Whether ``client``'s scheduler is gone: its connection closed, its address refusing
    new ones (:func:`refuses`), or the client closed.

    What is left of a run there then goes with it, and a call to release it
    would wait for the client's reconnection (its ``timeout``) in vain.
    """
    if client.status in ("closing", "closed") or client.scheduler is None:
        return True
    if not _comm_closed(client):
        return False
    address = str(getattr(client.scheduler, "address", ""))
    try:
        return bool(client.sync(refuses, address))
    except Exception:  # the client's loop closed meanwhile
        return True


def close_client(client: Client) -> None:
    """Close ``client``; where its scheduler is gone (:func:`scheduler_gone`), without
    distributed's log of the reconnection that the close cuts short.

    A client that lost its scheduler tries to reconnect for its ``timeout``;
    its close cancels that, and distributed logs the cancelled attempt as an
    error with its traceback: noise after the run has said the scheduler is lost.
    """
    quiet = scheduler_gone(client)
    log = logging.getLogger("distributed.client")
    level = log.level
    if quiet:
        log.setLevel(logging.CRITICAL)
    try:
        client.close()
    finally:
        if quiet:
            log.setLevel(level)


def check_scheduler(
    client: Client,
    checkpoint_path: str | None,
    address: str | None = None,
    expected_id: str | None = None,
) -> None:
    """Raise :class:`SchedulerLostError` if the scheduler does not answer, or is another.

    Waits ``daskpri.trainer.scheduler-timeout`` for an answer; the message
    names the checkpoint to resume from (``checkpoint_path``, if written).
    A client that has closed (distributed gives up reconnecting to a lost
    scheduler after ``distributed.comm.timeouts.connect``, and closes it)
    lost its scheduler too; ``address`` is the scheduler's, for the message,
    where the client no longer knows it. A scheduler whose id is not
    ``expected_id`` (that of the scheduler the run was set up on, from
    :func:`scheduler_id`) was started again at its address: the run is lost
    with the first.
    """
    timeout = _config.get_seconds("trainer.scheduler-timeout")
    address = getattr(client.scheduler, "address", None) or address or "?"
    cause: BaseException | None = None
    # gone, not slow: nothing listens at its address (see refuses)
    gone = ("its connection closed, and its address refuses new ones (it was shut down, "
            "closed itself when idle, or died)")
    if client.status in ("closing", "closed") or client.scheduler is None:
        why = f"the client has {client.status} (it lost its connection, or was closed)"
    elif scheduler_gone(client):  # (not closed: the branch above)
        why = gone
    else:
        try:
            identity = client.sync(client.scheduler.identity, callback_timeout=timeout)
        except Exception as e:
            cause = e
            # a connection that broke as the scheduler died fails the call at once; a call
            # timed out while the client's connection is up is not asked whether the address
            # refuses (a raw connection to a live scheduler logs a dropped handshake)
            look = not isinstance(e, TimeoutError) or _comm_closed(client)
            why = (gone if look and client.sync(refuses, address) else
                   f"no answer within {timeout:g} s (daskpri.trainer.scheduler-timeout)")
        else:
            if expected_id is None or identity.get("id") == expected_id:
                return
            why = (
                f"it was restarted (the scheduler there now is {identity.get('id')}, not "
                f"{expected_id}), and the run's table, replicas and partitions went with the "
                "one before"
            )
    where = checkpoint_path
    if where is not None and os.path.exists(where):
        step = checkpoint.read(where)["step"]
        hint = (
            f"the last checkpoint is {where!r} (step {step}): resume from it on a new "
            f"cluster (daskpri.Trainer.resume({where!r}, client=...), or "
            f"`daskpri train --resume {where}`)"
        )
    else:
        hint = (
            "no checkpoint was written: pass checkpoint_path= and checkpoint_every= "
            "(--checkpoint and --checkpoint-every) to be able to resume"
        )
    raise SchedulerLostError(f"lost the scheduler at {address}: {why}; {hint}") from cause


@contextlib.contextmanager
def blame_scheduler(check: Callable[[], None], client: Client | None = None) -> Iterator[None]:
    """Turn a failure of the cluster into :class:`SchedulerLostError` if the scheduler is gone.

    ``check`` raises it (see :func:`check_scheduler`). The user's errors
    (``ValueError``, ``TypeError``, ``FloatingPointError``) pass as they are.
    While the block runs, ``client``'s calls waiting to connect to a
    scheduler that is gone fail at once (:func:`watch_scheduler`).
    """
    watch = None
    address = str(getattr(getattr(client, "scheduler", None), "address", None))
    # a client reconnecting ("connecting") still has calls to cut
    if (client is not None and client.loop is not None
            and client.status in ("running", "connecting")
            and address.startswith(("tcp://", "tls://"))):
        watch = _watches.setdefault(client, _Watch())
        watch.blocks += 1
        if watch.future is None or watch.future.done():
            loop = client.loop.asyncio_loop  # type: ignore[attr-defined]  # tornado's AsyncIOLoop
            watch.future = asyncio.run_coroutine_threadsafe(
                watch_scheduler(client, address, watch), loop)
    try:
        yield
    except (ValueError, TypeError, FloatingPointError):
        raise  # the user's input: the scheduler is not to blame
    except Exception:
        check()
        raise
    finally:
        if watch is not None:
            watch.blocks -= 1


def kept_dying(
    lost: set[str],
    tries: int,
    retries: int,
    error: BaseException,
    none_left: str | None = None,
    silent: set[str] | frozenset[str] = frozenset(),
) -> str:
    """Why a run's set-up stopped after ``tries``: workers kept dying under it (``lost``:
    those known), or did not answer (``silent``: alive, left out after the step timeout),
    and where ``none_left`` says why, no suitable worker was left.

    A silent worker (its process stopped, its host overloaded) is named as
    such, not as one that died: its nanny's log says nothing of it.

    Examples
    --------
    >>> print(kept_dying({"tcp://a:1"}, 11, 10, KeyError("tcp://a:1")))
    ... # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    workers kept dying as the run was set up: worker(s) tcp://a:1 died, and the set-up
    failed 11 times (daskpri.trainer.max-retries=10; last: KeyError: 'tcp://a:1'); ...

    >>> import dask
    >>> with dask.config.set({"daskpri.trainer.step-timeout": "2s"}):
    ...     print(kept_dying(set(), 1, 0, TimeoutError("..."), silent={"tcp://b:2"}))
    ... # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    workers stopped answering as the run was set up: worker(s) tcp://b:2 did not answer
    within daskpri.trainer.step-timeout (2 s) and were left out, and the set-up failed
    1 time (daskpri.trainer.max-retries=0; last: TimeoutError: ...); see why those
    workers do not answer (a stopped process, a host overloaded or unreachable), ...
    """
    died = sorted(set(lost) - set(silent))
    whom = []
    if died or not silent:
        whom.append(f"worker(s) {', '.join(died)} died" if died else "workers died")
    if silent:
        whom.append(f"worker(s) {', '.join(sorted(silent))} did not answer within "
                    f"daskpri.trainer.step-timeout ({step_timeout():g} s) and were left out")
    if none_left is not None:
        # each silent owner cost the re-plan a wait of step-timeout's before it was left out
        after = "after waiting the step timeout for those that did not answer, " if silent else ""
        how = (f"{after}no suitable worker was left for daskpri.trainer.no-workers-timeout "
               f"({dask_timeout():g} s: {none_left})")
    else:
        how = (f"the set-up failed {tries} time{'s' if tries > 1 else ''} "
               f"(daskpri.trainer.max-retries={retries}; last: {type(error).__name__}: {error})")
    logs = "see the workers' logs (and their nannies') for why they"
    if not silent:
        what, hint = "kept dying", f"{logs} die"
    elif died:
        what, hint = "kept dying or stopped answering", f"{logs} die or do not answer"
    else:
        what, hint = "stopped answering", ("see why those workers do not answer (a stopped "
                                           "process, a host overloaded or unreachable)")
    return (
        f"workers {what} as the run was set up: {', '.join(whom)}, and {how}; {hint}, and "
        "fit again once the cluster is steady"
    )
