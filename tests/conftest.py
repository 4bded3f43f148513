"""Shared fixtures: small data, and real clusters on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import dask
import pytest
from _procs import dask_cluster
from distributed import Client, LocalCluster
from distributed.utils import get_mp_context

from daskpri.data.datasets import load

#: what the forkserver imports once, so that no worker it starts imports it again
_PRELOAD = ["distributed", "numpy", "torch", "xarray", "daskpri"]


def pytest_configure(config: pytest.Config) -> None:
    """Start the suite's LocalCluster workers from a forkserver that has torch imported.

    Spawned (Dask's default, and what daskpri's users get), each worker
    process imports torch and daskpri afresh when its first task arrives:
    3-4 s of CPU on a slow 2-core machine, for each worker the suite
    starts, restarts after a kill included. Forked from
    a forkserver that imported them once (Dask's
    ``distributed.worker.multiprocessing-method``), they start at once: the
    suite took 631 s instead of 887 on such a machine. The workers are
    still real processes; what spawning alone does (a model class defined
    in ``__main__``, the nannies' environment) is tested where a test asks
    for :func:`spawned_workers`, and in every subprocess the suite starts.
    """
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
    # the DDP and plain-loop baselines' processes too (test_bench_runs.py spawns one run's)
    dask.config.set({"daskpri.bench.start-method": "forkserver"})
    # distributed sets its own preload on its first call, and never again
    get_mp_context().set_forkserver_preload(_PRELOAD)


@pytest.fixture
def spawned_workers() -> Iterator[None]:
    """LocalClusters in the test spawn their workers, as daskpri's users' do."""
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}):
        yield


@pytest.fixture(scope="session")
def small_data():
    """A small synthetic classification problem (train, test)."""
    return load("synthetic", n_samples=2000, seed=0)


@pytest.fixture(scope="module")
def gpu_client():
    """A LocalCluster of 2 worker processes tagged GPU=1, bound to loopback."""
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            resources={"GPU": 1},
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a scheduler with two one-thread workers that have ``GPU=1``."""
    directory = tmp_path_factory.mktemp("cluster")
    worker = ["--nthreads", "1", "--resources", "GPU=1", "--no-dashboard"]
    with dask_cluster(directory, [worker, worker]) as address:
        yield address


@pytest.fixture(autouse=True)
def _no_dask_scheduler_left_on_a_closed_client() -> Iterator[None]:
    """Fail a test that leaves Dask's config on the distributed scheduler with no client.

    A default client closed inside its own ``with Client(...)`` block leaves
    ``scheduler: dask.distributed`` set: every later ``.compute()`` of the
    process fails ("Requested dask.distributed scheduler but no Client
    active"), daskpri's own stores' reads included, far from the cause.
    """
    yield
    from distributed.client import _get_global_client

    if dask.config.get("scheduler", None) == "dask.distributed" and _get_global_client() is None:
        dask.config.config.pop("scheduler", None)  # the next tests start clean
        pytest.fail("the test left Dask's config on the distributed scheduler with no client "
                    "alive (a default client closed inside its own `with` block?)")
