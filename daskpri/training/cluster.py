"""The LocalCluster daskpri starts when it is given no client."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import dask.config
import torch
from distributed import Client, LocalCluster
from distributed.client import AllExit
from distributed.comm.addressing import get_address_host_port, parse_address
from distributed.security import Security

from daskpri import _config
from daskpri._warnings import warn

# defined with the other errors (the command line names them without importing torch)
from daskpri.training.errors import SchedulerUnreachable as SchedulerUnreachable

# (run on the workers: a module that imports no torch, so they answer at once)
from daskpri.training.on_workers import stop_heartbeat


def local_cluster(
    n_workers: int,
    *,
    resources: dict[str, float] | None = None,
    security: Security | bool | None = None,
) -> LocalCluster:
    """A LocalCluster of ``n_workers`` one-thread worker processes on 127.0.0.1.

    Its scheduler, workers and dashboard bind to loopback (LocalCluster's own
    default is every interface for the dashboard). ``security`` (``True`` for
    temporary credentials) switches it to TLS. It starts under the Dask
    settings of ``daskpri.local-cluster`` (:func:`cluster_config`). Its
    workers ignore Ctrl-C (:mod:`daskpri.training.worker_signals`): a
    terminal's reaches the driver, which ends the run and closes them.
    More workers than this process's cores (:func:`available_cores`) start
    with a :class:`~daskpri.DaskpriWarning`: they would only share them.
    """
    cores = available_cores()
    if n_workers > cores:
        warn(
            f"{n_workers} local workers on {cores} cores: they share the cores, so they "
            f"train no faster than {cores} would, and each process holds its own torch and "
            "model; start fewer, or connect to a cluster with more machines"
        )
    tls: dict[str, Any] = {}
    if security not in (None, False):
        tls = {"security": security, "protocol": "tls://"}
    settings = cluster_config()
    _unset_environ(settings)
    with dask.config.set(settings):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            resources=resources,
            preload=["daskpri.training.worker_signals"],
            **tls,
        )


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells).

    Examples
    --------
    >>> available_cores() >= 1
    True
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block with one torch thread in this process (restored after).

    For a driver whose one-thread workers compute on the same machine's
    cores, as in a LocalCluster. Its arithmetic between rounds (the mean of
    the workers' parameters and optimizer states) is small, but over about
    32,768 elements torch runs it on its OpenMP pool, whose threads then
    spin on those cores until the next round: 7.5 ms of CPU per round of
    the MNIST-1D CNN (2 workers, 16 local steps) on this project's 2-core
    machine, a tenth of the round. ``daskpri train`` (without
    ``--scheduler``), ``demo`` and ``bench`` run their driver so.

    Examples
    --------
    >>> with one_torch_thread():
    ...     torch.get_num_threads()
    1
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _AbandonedGatherFilter(logging.Filter):
    """Drop asyncio's report of a gather's wait that ended after its caller had gone."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], AllExit))


def drop_abandoned_gathers() -> None:
    """Stop asyncio from reporting the waits of a ``Client.gather`` left by an interrupt.

    A Ctrl-C while the main thread waits in ``Client.gather`` leaves the
    gather's coroutine on the client's event loop; once the cluster closes,
    its inner waits end with distributed's ``AllExit`` (its signal to stop
    waiting, which carries nothing), no one retrieves them, and asyncio logs
    each with a traceback ("Task exception was never retrieved") after the
    interrupt's own message. This filter drops those records, and only
    those, from the ``asyncio`` logger; it is installed once, in the
    driver's process, when an interrupt arrives.
    """
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _AbandonedGatherFilter) for f in logger.filters):
        logger.addFilter(_AbandonedGatherFilter())


def stop_heartbeats(client: Client) -> None:
    """Stop the heartbeats of a cluster's workers before daskpri closes it.

    A worker whose heartbeat is on its way while the cluster closes logs an
    ERROR with a traceback ("Failed to communicate with scheduler during
    heartbeat", dask/distributed#7105), which would end a clean Ctrl-C or
    run with a worker's traceback. Stopping the periodic heartbeat leaves one
    already sent, so the workers also stop logging that one message (and
    only it) from then on: call this only for a cluster about to close.
    Best effort: a cluster already gone is closed as it is, and a worker
    that does not answer within ``daskpri.trainer.scheduler-timeout`` (one
    stuck in a step, for which a second Ctrl-C stops the run) is not waited
    for longer.
    """
    with contextlib.suppress(Exception):
        # Client.run hands callback_timeout on to Client.sync, as it does asynchronous
        client.run(stop_heartbeat,
                   callback_timeout=_config.get_seconds("trainer.scheduler-timeout"))


def cluster_config() -> dict[str, Any]:
    """The Dask settings daskpri's own LocalClusters start under, as dotted keys.

    They come from the config key ``daskpri.local-cluster`` (see
    ``daskpri.yaml``): glibc's adaptive mmap threshold back on in the
    workers (Dask's nannies start them with ``MALLOC_TRIM_THRESHOLD_=65536``,
    which turns it off: every tensor buffer over 128 KiB is then mapped anew,
    page faults included; a CNN step on MNIST-1D took 7.7 ms on a worker
    against 3.9 ms without it), and Dask's periodic work made rarer. In a
    LocalCluster the scheduler and the nannies run in the driver's process
    and compute on the workers' cores: with Dask's defaults an idle
    2-worker cluster spent 53-59 ms of CPU a second in the driver's event
    loop and 76-78 ms in its two workers, with these 11-13 ms and 13-14 ms
    (``benchmarks/idle_cluster_cpu.py``, this project's 2-core machine).
    Nested mappings are flattened, so that setting one key never replaces a
    whole section of Dask's config.

    Examples
    --------
    >>> tick = {"admin": {"tick": {"interval": "1s"}}}
    >>> with dask.config.set({"daskpri.local-cluster": {"distributed": tick}}):
    ...     cluster_config()
    {'distributed.admin.tick.interval': '1s'}
    """
    settings = dask.config.get("daskpri.local-cluster")
    if not isinstance(settings, Mapping):
        raise ValueError(
            f"daskpri.local-cluster should be a mapping of Dask settings, such as "
            f"{{'distributed.admin.tick.interval': '500ms'}}, but got {settings!r}"
        )
    return dict(_flatten(settings))


_PRE_SPAWN = "distributed.nanny.pre-spawn-environ."


def _unset_environ(settings: Mapping[str, Any]) -> None:
    """Remove from this process's environment the variables ``settings`` unset.

    Dask means ``None`` under ``distributed.nanny.pre-spawn-environ`` as "do
    not set", but a nanny sets the others in its own process's environment
    (``os.environ``), which every later worker process inherits: after any
    LocalCluster with Dask's defaults in this process, workers would start
    with ``MALLOC_TRIM_THRESHOLD_=65536`` whatever daskpri's setting says.
    """
    for key, value in settings.items():
        if key.startswith(_PRE_SPAWN) and value is None:
            os.environ.pop(key[len(_PRE_SPAWN):], None)


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


#: seconds for a scheduler to answer before it is taken as down
CONNECT_TIMEOUT = 10.0
_CONNECT_GRACE = 2.0  # seconds past it for distributed to say why itself, before it is cut off


class _ClosableClient(Client):
    """A :class:`distributed.Client` that is known before it has connected.

    It puts itself in ``made`` first, so that a connection that hangs can be
    closed from another thread (see :func:`connect`).
    """

    def __init__(self, *args: Any, made: list[Client], **kwargs: Any) -> None:
        made.append(self)
        super().__init__(*args, **kwargs)


def lacks_tls_credentials(address: str, security: Security | None = None) -> bool:
    """Whether ``address`` is a ``tls://`` scheduler that ``security`` gives no credentials for.

    ``security=None`` means Dask's config (``distributed.comm.tls.ca-file``,
    ``distributed.comm.tls.client.cert`` and ``.key``), as for
    :class:`distributed.Client`. Without a CA file and a client certificate
    Dask has no TLS context and fails deep in its TCP connector.

    Examples
    --------
    >>> lacks_tls_credentials("tcp://127.0.0.1:8786")
    False
    >>> with dask.config.set({"distributed.comm.tls.ca-file": None}):
    ...     lacks_tls_credentials("tls://127.0.0.1:8786")
    True
    """
    if parse_address(address, strict=False)[0] != "tls":
        return False
    if security is None:
        security = Security()
    # Security's fields are slots its stubs do not declare
    return not (getattr(security, "tls_ca_file", None)
                and getattr(security, "tls_client_cert", None))


def connect(address: str, security: Any = None, timeout: float = CONNECT_TIMEOUT) -> Client:
    """A client of the scheduler at ``address``, connected within about ``timeout`` seconds.

    ``Client(address, timeout=...)`` waits for the scheduler's handshake
    without that timeout: a server that accepts the connection and never
    answers (an HTTP server, such as a dashboard's port) would hold it for
    good. The client is made in a thread, given ``timeout`` and a little
    more; one that has not connected by then is closed, which ends its wait.
    A ``tls://`` address without TLS credentials (``security``, or Dask's
    config when it is ``None``), or one that is no address at all (an
    unknown protocol, no port), is refused with a ``ValueError`` first.

    Examples
    --------
    >>> connect("foo://127.0.0.1:8786")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the scheduler's address should be one such as tcp://127.0.0.1:8786, but got \
'foo://127.0.0.1:8786' (unknown address scheme 'foo'...)
    """
    try:
        if parse_address(address)[0] != "inproc":  # an in-process scheduler's has no port
            get_address_host_port(address)
    except ValueError as e:
        raise ValueError(
            f"the scheduler's address should be one such as tcp://127.0.0.1:8786, but got "
            f"{address!r} ({e})"
        ) from None
    if (security is None or isinstance(security, Security)) and lacks_tls_credentials(
        address, security
    ):
        raise ValueError(
            f"the scheduler at {address} speaks TLS, but no TLS credentials were given: "
            "pass security=Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...) "
            "or set Dask's config distributed.comm.tls.ca-file, "
            "distributed.comm.tls.client.cert and distributed.comm.tls.client.key"
        )
    made: list[Client] = []
    outcome: dict[str, Any] = {}

    def make() -> None:
        try:
            outcome["client"] = _ClosableClient(
                address, timeout=timeout, security=security, made=made
            )
        except BaseException as e:  # told in the calling thread
            outcome["error"] = e

    thread = threading.Thread(target=make, name="daskpri-connect", daemon=True)
    thread.start()
    try:
        thread.join(timeout + _CONNECT_GRACE)
    finally:
        hung = thread.is_alive()  # or interrupted while it connects
        if hung:
            for half_made in made:
                with contextlib.suppress(Exception):
                    half_made.close(timeout=_CONNECT_GRACE)
            thread.join(_CONNECT_GRACE)
    if hung:
        raise SchedulerUnreachable(
            f"could not connect to the scheduler at {address}: no answer within "
            f"{timeout:g} s (a Dask scheduler's address is wanted, not its dashboard's)"
        )
    error = outcome.get("error")
    if isinstance(error, (OSError, TimeoutError, ValueError)):
        raise SchedulerUnreachable(
            f"could not connect to the scheduler at {address}: {error}"
        ) from error
    if isinstance(error, MemoryError):
        # what answered is not a Dask scheduler (an HTTP server, a proxy): its
        # first bytes, read as a frame's length, asked for exabytes; the client
        # that failed so leaves its event loop running unless closed
        for half_made in made:
            with contextlib.suppress(Exception):
                half_made.close(timeout=_CONNECT_GRACE)
        raise SchedulerUnreachable(
            f"could not connect to the scheduler at {address}: what answered there does "
            f"not speak Dask's protocol (a Dask scheduler's address is wanted, not a web "
            f"server's or a proxy's)"
        ) from error
    if error is not None:
        raise error
    client: Client = outcome["client"]
    return client
