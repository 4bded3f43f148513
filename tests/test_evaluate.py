"""``Trainer.evaluate``: the model scored on held-out data as a fit scores its ``eval_data``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from _fits import fit_until_step, local_cluster, mlp_trainer

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model


def test_evaluate_gives_the_fits_last_evaluation_from_memory_and_from_a_store(
    small_data, tmp_path
):
    train, test = small_data
    with local_cluster(2, processes=False) as (_, client), \
            mlp_trainer(client, train, batch_size=32, eval_every=5) as trainer:
        history = trainer.fit(train, eval_data=test, max_steps=12, progress=False)
        scores = trainer.evaluate(test)
        # the same model, data, batches and device as the fit's last evaluation
        assert scores == {"accuracy": float(history["accuracy"][-1]),
                          "loss": float(history["eval_loss"][-1]),
                          "samples": test.sizes["sample"]}
        assert scores["accuracy"] > 0.3  # 12 steps learned something over 10 classes
        # the same data from a zarr store, and in batches of another size
        path = to_store(test.chunk({"sample": 64}), str(tmp_path / "test.zarr"))
        from_store = trainer.evaluate(path, batch_size=7)
        assert from_store["accuracy"] == scores["accuracy"]
        assert from_store["loss"] == pytest.approx(scores["loss"], rel=1e-5)
        # chunked: a task per chunk of the store, on the cluster (the client is the default)
        chunked = trainer.evaluate(path, batch_size=7, chunked=True)
        assert chunked["accuracy"] == scores["accuracy"] and chunked["samples"] == 400
        assert chunked["loss"] == pytest.approx(scores["loss"], rel=1e-5)
        prefixes = client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.task_prefixes))
        # the store's chunks read, and scored (the task fused with the sum), there
        assert "open_dataset-x" in prefixes and any(p.startswith("scored") for p in prefixes), \
            prefixes
        # the model is left in the mode it was in
        assert trainer.model.training


def test_evaluate_needs_no_cluster_and_scores_the_model_as_given(small_data):
    train, test = small_data
    model = build_model("mlp", train, seed=0)
    with daskpri.Trainer(model) as trainer:
        scores = trainer.evaluate(test)
        assert trainer._client is None  # no cluster started for it
    with torch.no_grad():
        logits = model(torch.as_tensor(test["x"].values))
    y = torch.as_tensor(test["y"].values)
    assert scores["accuracy"] == float((logits.argmax(1) == y).double().mean())
    assert scores["loss"] == pytest.approx(
        float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-6)


def test_evaluate_refuses_data_and_batch_sizes_it_cannot_score(small_data):
    train, test = small_data
    with daskpri.Trainer(build_model("mlp", train, seed=0)) as trainer:
        bad = test.assign(y=test["y"].where(test["y"] != 3, 10))
        with pytest.raises(ValueError, match=r"y in data should be in \[0, 10\), but got 10 at "
                                             r"sample \d+ \(\d+ bad labels\)"):
            trainer.evaluate(bad)
        nan = test.copy(deep=True)
        nan["x"].values[5, 2] = np.nan
        with pytest.raises(ValueError, match="x in data should hold finite numbers, but got 1 NaN "
                                             "or infinite value, the first at sample 5"):
            trainer.evaluate(nan)
        # chunked, each chunk's values are checked by its task, which names the sample
        nan["x"].values[5, 2] = 0.0
        nan["x"].values[123, 2] = np.inf
        with pytest.raises(ValueError, match="x in data should hold finite numbers, but got 1 NaN "
                                             "or infinite value, the first at sample 123"):
            trainer.evaluate(nan.chunk({"sample": 50}), chunked=True)
        with pytest.raises(ValueError, match=r"y in data should be in \[0, 10\), but got 10"):
            trainer.evaluate(bad.chunk({"sample": 50}), chunked=True)
        with pytest.raises(TypeError, match="chunked should be True or False, but got "
                                            "chunked='yes'"):
            trainer.evaluate(test, chunked="yes")
        wide = test[["y"]].assign(x=test["x"].pad(feature=(0, 3), constant_values=0.0))
        with pytest.raises(ValueError, match="the model could not run on two samples of data.x"):
            trainer.evaluate(wide)
        for size in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match=rf"batch_size should be a positive integer, "
                                                 rf"but got batch_size={size!r}"):
                trainer.evaluate(test, batch_size=size)
        with pytest.raises(FileNotFoundError, match="data names 'missing-dir/test.zarr', but "
                                                    "there is no such file or directory"):
            trainer.evaluate("missing-dir/test.zarr")


def test_evaluate_chunked_scores_data_in_memory_in_chunks_alike(small_data):
    """Data in memory, not chunked, is cut into chunks of 10,000; chunked data keeps its own."""
    train, test = small_data
    big = xr.concat([test] * 30, "sample")  # 12,000 samples: two chunks
    with daskpri.Trainer(build_model("mlp", train, seed=0)) as trainer:
        whole = trainer.evaluate(big)
        for data in (big, big.chunk({"sample": 999})):
            scores = trainer.evaluate(data, chunked=True)
            assert scores["accuracy"] == whole["accuracy"] and scores["samples"] == 12_000
            assert scores["loss"] == pytest.approx(whole["loss"], rel=1e-5)
        assert trainer._client is None  # threads: no cluster started for it


def test_evaluate_is_refused_while_a_fit_runs(small_data):
    train, test = small_data
    with local_cluster(1, processes=False) as (_, client), \
            mlp_trainer(client, train, batch_size=32) as trainer:
        running = fit_until_step(trainer, train)
        try:
            with pytest.raises(RuntimeError, match="a fit is already running .* before "
                                                   "evaluating"):
                trainer.evaluate(test)
        finally:
            trainer.stop()
            running.result(timeout=60)
        assert trainer.evaluate(test)["samples"] == test.sizes["sample"]
