"""Shared fixtures: small data, and real clusters on loopback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _procs import _free_port, _stop
from distributed import Client, LocalCluster

from daskpri.data.datasets import load


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
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    log = (tmp_path_factory.mktemp("cluster") / "cluster.log").open("wb")
    commands = [
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard", "--dashboard-address", "127.0.0.1:0"],
    ] + [
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--resources", "GPU=1", "--host", "127.0.0.1", "--no-dashboard",
         "--dashboard-address", "127.0.0.1:0"],
    ] * 2
    procs: list[subprocess.Popen[Any]] = []
    try:
        for command in commands:
            procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        _stop(procs[1:])  # the workers first, so that they do not wait for the scheduler
        _stop(procs[:1])
        log.close()
