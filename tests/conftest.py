"""Shared fixtures: small data, and real clusters on loopback."""

from __future__ import annotations

import pytest
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
