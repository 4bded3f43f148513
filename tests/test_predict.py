"""``Trainer.predict``: the model's logits on other data, lazy where the data is."""

from __future__ import annotations

import copy

import dask.array as da
import numpy as np
import pytest
import torch
import xarray as xr
from _fits import fit_until_step, local_cluster, mlp_trainer

import daskpri
from daskpri.models import build_model


def _by_hand(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """``model``'s logits for ``x``, a copy of it run in evaluation mode."""
    with torch.no_grad():
        return copy.deepcopy(model).eval()(torch.as_tensor(x, dtype=torch.float32)).numpy()


def test_predict_in_memory_keeps_the_samples_coordinates_and_agrees_with_evaluate(small_data):
    train, test = small_data
    test = test.assign_coords(sample=np.arange(1000, 1000 + test.sizes["sample"]))
    model = build_model("mlp", train, seed=0)
    with daskpri.Trainer(model) as trainer:
        logits = trainer.predict(test, batch_size=7)
        scores = trainer.evaluate(test)
    assert isinstance(logits.data, np.ndarray)  # in memory, as the data is
    assert logits.name == "logits" and logits.dims == ("sample", "class")
    assert logits.shape == (test.sizes["sample"], 10) and logits.dtype == np.float32
    assert logits["sample"].values.tolist() == test["sample"].values.tolist()
    assert logits["class"].values.tolist() == list(range(10))
    assert logits.attrs["step"] == 0
    np.testing.assert_allclose(logits.values, _by_hand(model, test["x"].values), rtol=1e-5,
                               atol=1e-6)
    hits = (logits.argmax("class") == test["y"]).mean()
    assert float(hits) == scores["accuracy"]
    assert model.training  # the trainer's model left in the mode it was in


def test_predict_on_a_store_without_labels_is_lazy_and_computes_on_the_cluster(
    small_data, tmp_path
):
    train, test = small_data
    path = str(tmp_path / "unlabelled.zarr")
    test[["x"]].chunk({"sample": 150}).to_zarr(path, zarr_format=3, consolidated=False)
    with local_cluster(2) as (_, client), \
            mlp_trainer(client, train, batch_size=32) as trainer:
        before = _by_hand(trainer.model, test["x"].values)
        trainer.model.train()
        logits = trainer.predict(path)
        assert logits.chunks[0] == (150, 150, 100)  # the store's chunks of its 400 samples
        # the model as it was at the call: a fit meanwhile changes nothing of it
        trainer.fit(train, max_steps=5, progress=False)
        assert trainer.step_ == 5
        computed = logits.compute()  # on the cluster: the client is the default
        after = trainer.predict(path).compute()
        # the README's recipe for held-out data too large for the driver: the accuracy
        # of a labelled store, a task per chunk on the cluster, is evaluate()'s
        labelled = str(tmp_path / "labelled.zarr")
        test.chunk({"sample": 150}).to_zarr(labelled, zarr_format=3, consolidated=False)
        held = xr.open_zarr(labelled, consolidated=False)
        hits = (trainer.predict(held).argmax("class") == held.y).mean()
        assert isinstance(hits.data, da.Array)
        assert float(hits.compute()) == trainer.evaluate(labelled)["accuracy"]
    np.testing.assert_allclose(computed.values, before, rtol=1e-5, atol=1e-6)
    assert not np.allclose(after.values, before)  # 5 steps later, another model
    assert after.attrs["step"] == 5


def test_predict_runs_on_samples_of_many_dimensions_chunked_along_them():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 4, 5)).astype(np.float32)
    data = xr.Dataset({"x": (("sample", "row", "col"), x)}).chunk(
        {"sample": 25, "row": 2, "col": 3})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))
    with daskpri.Trainer(model) as trainer:
        logits = trainer.predict(data)
    assert logits.shape == (60, 3) and logits.chunks == ((25, 25, 10), (3,))
    np.testing.assert_allclose(logits.compute(scheduler="threads").values,
                               _by_hand(model, x), rtol=1e-5, atol=1e-6)


def test_predict_refuses_what_it_cannot_run_on(small_data):
    train, test = small_data
    with daskpri.Trainer(build_model("mlp", train, seed=0)) as trainer:
        with pytest.raises(ValueError, match=r"data should have a variable 'x', but got "
                                             r"variables \('y',\)"):
            trainer.predict(test[["y"]])
        wide = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 23), np.float32))})
        with pytest.raises(ValueError, match="the model could not run on two samples of data.x"):
            trainer.predict(wide)
        for size in (0, 1.5, False):
            with pytest.raises(ValueError, match=rf"batch_size should be a positive integer, "
                                                 rf"but got batch_size={size!r}"):
                trainer.predict(test, batch_size=size)


def test_predict_is_refused_while_a_fit_runs(small_data):
    train, test = small_data
    with local_cluster(1, processes=False) as (_, client), \
            mlp_trainer(client, train, batch_size=32) as trainer:
        running = fit_until_step(trainer, train)
        try:
            with pytest.raises(RuntimeError, match="before predicting"):
                trainer.predict(test)
        finally:
            trainer.stop()
            running.result(timeout=60)


def test_predict_and_evaluate_run_on_the_device_asked_and_refuse_one_they_lack(
    small_data, tmp_path
):
    train, test = small_data
    path = str(tmp_path / "held.zarr")
    test.chunk({"sample": 150}).to_zarr(path, zarr_format=3, consolidated=False)
    missing = f"cuda:{torch.cuda.device_count()}"  # one past this machine's GPUs
    lacks = (rf"^device='{missing}', but {{}} has \d+ CUDA device\(s\) \(torch .*\); "
             "leave device unset")
    with daskpri.Trainer(build_model("mlp", train, seed=0)) as trainer:
        # no device's name: refused at the call, before anything is read or computed
        for bad in ("abacus", "cuda:x", 3, "meta"):
            said = rf"^device should name a torch device like 'cpu', .* but got {bad!r}$"
            with pytest.raises(ValueError, match=said):
                trainer.predict(path, device=bad)
            with pytest.raises(ValueError, match=said):
                trainer.evaluate(path, device=bad)
            with pytest.raises(ValueError, match=said):
                trainer.evaluate(path, chunked=True, device=bad)
        # a GPU this process lacks: data in memory is run here, at the call
        with pytest.raises(ValueError, match=lacks.format("this process")):
            trainer.predict(test, device=missing)
        with pytest.raises(ValueError, match=lacks.format("this process")):
            trainer.evaluate(test, device=missing)
        # lazy data: where each chunk computes, Dask's threads here
        lazy = trainer.predict(path, device=missing)
        with pytest.raises(ValueError, match=lacks.format("this process")):
            lazy.compute(scheduler="threads")
        threads = trainer.predict(path).compute(scheduler="threads")
        with local_cluster(1) as (_, client):
            (address,) = client.scheduler_info()["workers"]
            worker = f"worker {address}"
            with pytest.raises(ValueError, match=lacks.format(worker)):
                trainer.predict(path, device=missing).compute()
            with pytest.raises(ValueError, match=lacks.format(worker)):
                trainer.evaluate(path, chunked=True, device=missing)
            # the CPU asked for: the figures of the default here (a worker of no GPU)
            on_cpu = trainer.predict(path, device=torch.device("cpu")).compute()
            chunked = trainer.evaluate(path, chunked=True, device="cpu")
        whole = trainer.evaluate(path, device="cpu")
    np.testing.assert_array_equal(on_cpu.values, threads.values)
    assert chunked["accuracy"] == whole["accuracy"] == trainer.evaluate(path)["accuracy"]
    assert chunked["loss"] == pytest.approx(whole["loss"], rel=1e-5)
