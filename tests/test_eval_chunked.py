"""A fit's ``eval_data`` scored on its cluster, a task per chunk (``eval_chunked=True``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from _reads import opened_under
from distributed import Client, LocalCluster, get_task_stream

import daskpri
from daskpri.cli import main
from daskpri.data.io import to_store
from daskpri.models import build_model


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A LocalCluster of two one-thread worker processes, on loopback."""
    with (LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                       dashboard_address="127.0.0.1:0") as cluster,
          Client(cluster, set_as_default=False) as client):
        yield client


def _read(seen: list[str], variable: str) -> list[str]:
    """The chunks of ``variable`` among the files a store had opened (zarr's ``x/c/0/0``)."""
    return sorted(p for p in seen if p.startswith(f"{variable}/c/"))


def test_a_fit_scores_eval_data_on_the_cluster_as_the_driver_scores_it(
    client: Client, small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path
) -> None:
    train, test = small_data
    store = to_store(test.chunk({"sample": 150}), tmp_path / "test.zarr")
    for eval_data in (store, test):  # a store the workers read, data in the driver's memory
        trainer = daskpri.Trainer(build_model("mlp", train, seed=0), strategy="uniform",
                                  client=client, eval_every=2)
        with opened_under(store) as seen:
            history = trainer.fit(train, eval_data=eval_data, eval_chunked=True, max_steps=4,
                                  progress=False)
        if eval_data is store:
            # the driver read the labels, once; the workers (other processes) read x
            assert _read(seen, "x") == []
            assert len(_read(seen, "y")) == len(set(_read(seen, "y"))) == 3
        accuracy = history["accuracy"].values
        assert np.isnan(accuracy[[0, 2]]).all() and np.isfinite(accuracy[[1, 3]]).all()
        # the figures of the driver's scoring of the same model: the accuracy exactly
        on_driver = trainer.evaluate(test)
        assert accuracy[-1] == on_driver["accuracy"]
        assert history["eval_loss"].values[-1] == pytest.approx(on_driver["loss"], rel=1e-5)
        trainer.close()


def test_a_model_with_hooks_reaches_each_worker_that_scores_a_chunk(
    client: Client, small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path
) -> None:
    # the built-in CNN of 1-D data has a load_state_dict pre-hook, which distributed's own
    # serializer of torch modules could not send on from the worker it was scattered to
    train, test = small_data
    store = to_store(test.chunk({"sample": 25}), tmp_path / "test.zarr")  # 16 chunks
    trainer = daskpri.Trainer(build_model("cnn", train, seed=0), strategy="uniform",
                              client=client, eval_every=2)
    with get_task_stream(client) as stream:
        history = trainer.fit(train, eval_data=store, eval_chunked=True, max_steps=2,
                              progress=False)
    assert len({t["worker"] for t in stream.data}) == 2  # both workers scored chunks
    assert history["accuracy"].values[-1] == trainer.evaluate(test)["accuracy"]
    trainer.close()


def test_eval_data_the_chunked_scoring_refuses_is_said_before_or_at_its_first_evaluation(
    client: Client, small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path
) -> None:
    train, test = small_data
    trainer = daskpri.Trainer(build_model("mlp", train, seed=0), strategy="uniform",
                              client=client, eval_every=2)
    with pytest.raises(ValueError, match="eval_chunked=True needs eval_data= to score on"):
        trainer.fit(train, eval_chunked=True, max_steps=2, progress=False)
    with pytest.raises(TypeError, match="eval_chunked should be True or False, but got 'yes'"):
        trainer.fit(train, eval_data=test, eval_chunked="yes", max_steps=2, progress=False)
    # a label out of range: read on the driver, before any work in the cluster
    y = test["y"].values.copy()
    y[7] = 12
    beyond = to_store(test.assign(y=("sample", y)), tmp_path / "beyond.zarr")
    with pytest.raises(ValueError, match=r"y in eval_data should be in \[0, 10\), but got 12 "
                                         r"at sample 7"):
        trainer.fit(train, eval_data=beyond, eval_chunked=True, max_steps=2, progress=False)
    assert trainer.step_ == 0
    # a NaN in x: found by the task that scores its chunk, at the first evaluation
    x = test["x"].values.copy()
    x[160, 3] = np.nan
    nan = to_store(test.assign(x=(test["x"].dims, x)).chunk({"sample": 150}),
                   tmp_path / "nan.zarr")
    with pytest.raises(ValueError, match=r"x in eval_data should hold finite numbers, but got "
                                         r"1 NaN or infinite value, the first at sample 160"):
        trainer.fit(train, eval_data=nan, eval_chunked=True, max_steps=4, progress=False)
    assert trainer.step_ == 2
    trainer.close()


def test_train_eval_chunked_scores_the_eval_store_on_the_cluster(
    client: Client, small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    train, test = small_data
    store = to_store(train.chunk({"sample": 400}), tmp_path / "train.zarr")
    evals = to_store(test.chunk({"sample": 100}), tmp_path / "test.zarr")
    common = ["train", "--max-steps", "4", "--eval-every", "2", "--no-progress",
              "--scheduler", client.scheduler.address, "--data", store, "--eval-data", evals]
    histories = []
    for chunked in ([], ["--eval-chunked"]):
        out = tmp_path / f"run{len(histories)}.nc"
        with opened_under(evals) as seen:
            assert main([*common, *chunked, "--output", str(out)]) == 0
        histories.append(xr.load_dataset(out, engine="h5netcdf"))
        # the driver read x only where it scored the data itself
        assert bool(_read(seen, "x")) == (not chunked)
    on_driver, on_cluster = histories
    assert "selective-backprop: 4 steps, final accuracy 0." in capsys.readouterr().out
    # the same run (seeded, deterministic on CPUs), scored either way: the same figures
    np.testing.assert_array_equal(on_cluster["accuracy"].values, on_driver["accuracy"].values)
    np.testing.assert_allclose(on_cluster["eval_loss"].values, on_driver["eval_loss"].values,
                               rtol=1e-5)
    assert main(["train", "--data", store, "--eval-chunked"]) == 2
    assert capsys.readouterr().err == ("daskpri: error: --eval-chunked with --data needs "
                                       "--eval-data PATH, the held-out data to score on the "
                                       "cluster\n")
