"""The LocalCluster daskpri starts when it is given no client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import dask.config
import torch
from distributed import Client, LocalCluster
from distributed.security import Security


def local_cluster(
    n_workers: int,
    *,
    resources: dict[str, float] | None = None,
    security: Security | bool | None = None,
) -> LocalCluster:
    """A LocalCluster of ``n_workers`` one-thread worker processes on 127.0.0.1.

    Its scheduler, workers and dashboard bind to loopback (LocalCluster's own
    default is every interface for the dashboard). ``security`` (``True`` for
    temporary credentials) switches it to TLS.
    """
    tls: dict[str, Any] = {}
    if security not in (None, False):
        tls = {"security": security, "protocol": "tls://"}
    with dask.config.set(TORCH_FRIENDLY_ENVIRON):
        return LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            resources=resources,
            **tls,
        )


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


def _stop_heartbeat(dask_worker: Any) -> None:
    dask_worker.periodic_callbacks["heartbeat"].stop()


def stop_heartbeats(client: Client) -> None:
    """Stop the heartbeats of a cluster's workers before daskpri closes it.

    A worker whose heartbeat is on its way while the cluster closes logs an
    ERROR with a traceback ("Failed to communicate with scheduler during
    heartbeat", dask/distributed#7105), which would end a clean Ctrl-C or
    run with a worker's traceback. Best effort: a cluster already gone is
    closed as it is.
    """
    with contextlib.suppress(Exception):
        client.run(_stop_heartbeat)


#: Dask's nannies start workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which
#: also turns off glibc's adaptive mmap threshold: every tensor buffer over
#: 128 KiB is then mmap'ed and unmapped anew, page faults included. That made
#: a CNN step on MNIST-1D take 7.7 ms on a worker against 3.9 ms without it
#: (one thread, this project's 2-core machine). Workers daskpri starts go back
#: to glibc's defaults; for ``dask worker``, see the README.
TORCH_FRIENDLY_ENVIRON = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}
