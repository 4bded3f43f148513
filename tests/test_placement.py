"""Placement rules, without a cluster; and listing a cluster's workers."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import torch
import xarray as xr
from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model
from daskpri.replicas.worker import worker_device
from daskpri.training.placement import (
    assign_owners,
    cluster_workers,
    eligible_workers,
    parse_resources,
    partition_bounds,
    reassign_owners,
)


def test_parse_resources():
    assert parse_resources(None) is None
    assert parse_resources("GPU=1, MEM=2.5") == {"GPU": 1.0, "MEM": 2.5}
    assert parse_resources({"GPU": 1}) == {"GPU": 1.0}
    for bad in ("GPU", "GPU=x", "=1"):
        with pytest.raises(ValueError, match="resources should look like 'GPU=1'"):
            parse_resources(bad)
    with pytest.raises(ValueError, match="positive amounts"):
        parse_resources({"GPU": 0})
    with pytest.raises(TypeError, match="resources should be a dict"):
        parse_resources(3)  # type: ignore[arg-type]


def test_eligible_workers_filter_and_explain():
    workers = {
        "tcp://b": {"resources": {"GPU": 1}},
        "tcp://a": {"resources": {"GPU": 1}},
        "tcp://c": {"resources": {}},
    }
    assert eligible_workers(workers, None, "tcp://s") == ["tcp://a", "tcp://b", "tcp://c"]
    assert eligible_workers(workers, {"GPU": 1.0}, "tcp://s") == ["tcp://a", "tcp://b"]
    with pytest.raises(ValueError, match=r"none of the 3 workers.*--resources TPU=1"):
        eligible_workers(workers, {"TPU": 1.0}, "tcp://s")
    with pytest.raises(RuntimeError, match=r"has no workers.*an adaptive cluster starts one "
                                           r"for the task that a fit keeps pending .* adapt it "
                                           r"with maximum=1 or more"):
        eligible_workers({}, None, "tcp://s")


def _ds(n, chunk=None):
    ds = xr.Dataset({"x": (("sample", "f"), np.zeros((n, 2))), "y": ("sample", np.zeros(n, int))})
    return ds.chunk({"sample": chunk}) if chunk else ds


def test_partition_bounds():
    assert partition_bounds(_ds(10), 4, 2).tolist() == [0, 4, 8, 10]
    # as many partitions for every worker, a sample apart in size
    assert partition_bounds(_ds(10), None, 4).tolist() == [0, 2, 5, 7, 10]
    with dask.config.set({"daskpri.trainer.partition-size": 1000}):
        bounds = partition_bounds(_ds(2500), None, 2)  # was 1000, 1000, 500: 2000 and 500
        assert bounds.tolist() == [0, 625, 1250, 1875, 2500]
        assert np.bincount(assign_owners(np.diff(bounds), 2), np.diff(bounds)).tolist() == [
            1250, 1250]
        assert partition_bounds(_ds(16000), None, 2).tolist() == list(range(0, 16001, 1000))
        sizes = np.diff(partition_bounds(_ds(16000), None, 3))  # 6 each, not 6, 5 and 5
        assert sizes.size == 18 and set(sizes.tolist()) == {888, 889}
        assert np.bincount(assign_owners(sizes, 3), sizes).tolist() == [5333, 5333, 5334]
    assert partition_bounds(_ds(3), None, 4).tolist() == [0, 1, 2, 3]  # fewer samples
    assert partition_bounds(_ds(10, chunk=6), None, 2).tolist() == [0, 6, 10]  # zarr/dask chunks


def test_small_chunks_are_grouped_into_runs_of_whole_chunks():
    with dask.config.set({"daskpri.trainer.partition-size": 1000}):
        # a store written a sample at a time: 2,400 partitions before, now four
        bounds = partition_bounds(_ds(2400, chunk=1), None, 2)
        assert bounds.tolist() == [0, 600, 1200, 1800, 2400]
        # cuts fall on chunk boundaries, the nearest to an even cut's
        bounds = partition_bounds(_ds(2400, chunk=7), None, 2)
        assert (bounds % 7 == 0)[:-1].all() and bounds[-1] == 2400
        assert len(bounds) == 5 and np.abs(np.diff(bounds) - 600).max() <= 7
        # chunks no finer than the even cut stay one partition each
        bounds = partition_bounds(_ds(16000, chunk=1000), None, 2)
        assert bounds.tolist() == list(range(0, 16001, 1000))
        # unequal chunks: a chunk larger than a piece stays whole
        # chunks of 100 samples or more, on average, stay one partition each
        bounds = partition_bounds(_ds(2400, chunk=100), None, 2)
        assert bounds.tolist() == list(range(0, 2401, 100))
        # unequal chunks: a chunk larger than a piece stays whole
        ds = _ds(2000).chunk({"sample": (1700,) + (1,) * 300})
        assert partition_bounds(ds, None, 2).tolist() == [0, 1700, 2000]
        ds = _ds(2000).chunk({"sample": (1,) * 300 + (1700,)})
        assert partition_bounds(ds, None, 2).tolist() == [0, 300, 2000]
    with pytest.raises(ValueError, match="partition_size should be a positive integer"):
        partition_bounds(_ds(10), 0, 2)


def test_owners_are_balanced_and_moved_only_when_lost():
    assert assign_owners(4, 4).tolist() == [0, 1, 2, 3]
    assert np.bincount(assign_owners(10, 3)).tolist() == [4, 3, 3]
    # partitions of unequal sizes (a store's chunks) are balanced by their samples
    sizes = np.array([1000, 1000, 500])
    assert assign_owners(sizes, 2).tolist() == [0, 1, 1]
    assert assign_owners(np.array([1000, 1, 1]), 3).tolist() == [0, 1, 2]  # one each
    assert reassign_owners(["a", "b", "b", "a"], ["a", "b"]) == ["a", "b", "b", "a"]
    assert reassign_owners(["a", "b", "b", "c"], ["a", "c"]) == ["a", "a", "c", "c"]


def test_cluster_workers_lists_every_worker_while_the_client_polls():
    # the client's periodic poll asks for no workers, and overwrites the cache that
    # client.scheduler_info(n_workers=-1) returns (5 of 500 calls came back empty
    # with this 5 ms poll); cluster_workers asks the scheduler directly
    with dask.config.set({"distributed.client.scheduler-info-interval": "5ms"}):
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                         dashboard_address="127.0.0.1:0") as cluster,
            Client(cluster) as client,
        ):
            expected = set(cluster.scheduler.workers)
            assert len(expected) == 2
            for _ in range(500):
                assert set(cluster_workers(client)) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_device_forced_where_a_worker_has_none_is_refused_on_the_cluster(small_data):
    train, _ = small_data
    # the driver may have no GPU where its workers do: each worker checks its own
    assert worker_device(None, "cpu") == torch.device("cpu")
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                  client=client, device="cuda:0")
        try:
            with pytest.raises(ValueError, match=r"device='cuda:0', but 1 of the run's 1 "
                               r"worker\(s\) lack it \(tcp://127\.0\.0\.1:\d+ has 0 CUDA "
                               r"device\(s\)\): .*leave device unset"):
                trainer.fit(train, max_steps=2, progress=False)
        finally:
            trainer.close()
