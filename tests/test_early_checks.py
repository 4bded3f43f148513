"""What a fit refuses before it starts a cluster, or sets a run up on one.

The trainer's own LocalCluster starts worker processes (seconds); a fit
that would fail on the workers' first step (labels out of range, a model
that cannot run on the data, a CUDA device they lack) is refused on the
driver before it starts them, and :meth:`Trainer.fit_in_background`
raises a bad argument in its caller's thread, not in its future. Data
laid out as an xarray user has it (features with ``sample`` last, labels
as floats) is taken as meant, or refused as early as the rest.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
import xarray as xr
from distributed import Client

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model


def _labels(data: xr.Dataset, y: np.ndarray) -> xr.Dataset:
    return data.assign(y=("sample", y))


def test_bad_labels_and_a_model_that_cannot_run_are_refused_before_the_cluster_starts(
    small_data, tmp_path
):
    train, _ = small_data
    y = train["y"].values
    shifted = _labels(train, y + 5)  # n_classes=10: 12, 13 and 14 are out of range
    n_out = int((y + 5 >= 10).sum())
    negative = y.copy()
    negative[[3, 9]] = -1
    store = to_store(shifted.chunk({"sample": 400}), str(tmp_path / "shifted.zarr"))
    no_classes = train.assign(y=("sample", y + 5)).drop_attrs()  # the model's width then
    first = int(np.argmax(y + 5 >= 10))
    cases = [
        (shifted, rf"^y in data should be in \[0, 10\), but got {y[first] + 5} at sample "
                  rf"{first} \({n_out} bad labels\)$"),
        (store, rf"^y in data should be in \[0, 10\), but got \d+ at sample {first} "
                rf"\({n_out} bad labels\)$"),  # read lazily, from the store
        (_labels(train, negative), r"^y in data should be in \[0, 10\), but got -1 at sample "
                                   r"3 \(2 bad labels\)$"),
        (_labels(train, negative).drop_attrs(), r"^y in data should be non-negative, but got "
                                                r"-1 at sample 3 \(2 bad labels\)$"),
        (no_classes, r"^the model outputs 10 classes, but data.y holds label 14; labels should "
                     r"lie in \[0, 10\)$"),
        (train.isel(feature=slice(0, 10)), r"^the model could not run on two samples of "
                                           r"data.x \(per-sample shape \(10,\)"),
    ]
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    try:
        for data, match in cases:
            with pytest.raises(ValueError, match=match):
                trainer.fit(data, max_steps=2, progress=False)
            assert trainer._own_cluster is None and trainer._client is None
    finally:
        trainer.close()


def test_eval_datas_bad_labels_are_refused_before_the_cluster_starts(small_data):
    train, test = small_data
    y = test["y"].values.copy()
    y[5] = 10
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    try:
        with pytest.raises(ValueError, match=r"^y in eval_data should be in \[0, 10\), but got "
                           r"10 at sample 5 \(1 bad label\)$"):
            trainer.fit(train, eval_data=_labels(test, y), max_steps=2, progress=False)
        assert trainer._own_cluster is None and trainer._client is None
    finally:
        trainer.close()


@pytest.mark.skipif(torch.cuda.device_count() > 99, reason="this machine has a cuda:99")
def test_a_cuda_device_this_machine_lacks_is_refused_before_the_cluster_starts(small_data):
    train, _ = small_data
    devices = ["cuda:99"] if torch.cuda.is_available() else ["cuda", "cuda:3", "cuda:99"]
    devices += [] if torch.xpu.device_count() else ["xpu"]  # the other accelerators too
    for device in devices:
        kind = device.split(":")[0].upper()
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1,
                                  device=device)
        try:
            with pytest.raises(ValueError, match=(
                rf"^device={re.escape(repr(device))}, but this machine, where the trainer's "
                rf"LocalCluster would run its workers, has \d+ {kind} device\(s\) .*: give device "
                r"'cpu'.*, or leave device unset .*or a client of a cluster whose workers have it$"
            )):
                trainer.fit(train, max_steps=2, progress=False)
            assert trainer._own_cluster is None and trainer._client is None
        finally:
            trainer.close()


def _daskpri_plugins(dask_scheduler) -> list[str]:
    return [name for name in dask_scheduler.worker_plugins if name.startswith("daskpri-")]


@pytest.mark.skipif(torch.cuda.device_count() > 99, reason="this machine has a cuda:99")
def test_a_cuda_device_the_workers_lack_is_refused_without_their_tracebacks(
    gpu_client: Client, small_data, caplog
):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                              client=gpu_client, device="cuda:99")
    workers = sorted(gpu_client.scheduler_info()["workers"])
    try:
        with caplog.at_level(logging.INFO, logger="distributed"):
            with pytest.raises(ValueError, match=(
                r"^device='cuda:99', but 2 of the run's 2 worker\(s\) lack it \("
                + re.escape(f"{workers[0]} has 0, {workers[1]} has ")
                + r"\d+ CUDA device\(s\)\): give device 'cpu'.*, or leave device unset to "
                r"train on each worker's GPU where its GPU resource names one, else on its CPU$"
            )):
                trainer.fit(train, max_steps=2, progress=False)
    finally:
        trainer.close()
    assert gpu_client.run_on_scheduler(_daskpri_plugins) == []  # none was registered
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    logs = [m for lines in gpu_client.get_worker_logs().values() for _, m in lines]
    assert not [m for m in logs if trainer.run_id in m or "Traceback" in m], logs


@pytest.mark.parametrize(
    ("data", "kwargs", "exc", "match"),
    [
        ("train", {"max_steps": -1}, ValueError, r"^max_steps should be .*, but got"),
        ("train", {"max_time": "x"}, ValueError,
         r"^max_time should be a positive finite number, but got max_time='x'$"),
        ("train", {"max_steps": 5, "target_accuracy": 2, "eval_data": "test"}, ValueError,
         r"^target_accuracy should be a number in \(0, 1\], but got 2$"),
        ("train", {"max_steps": 5, "eval_data": "narrow"}, ValueError,
         r"^eval_data.x should have per-sample shape \(20,\) like data.x, but got \(10,\)$"),
        (42, {"max_steps": 5}, TypeError,
         r"^data should be an xarray.Dataset or the path of a .*, but got an object of type int$"),
    ],
    ids=["max_steps", "max_time", "target_accuracy", "eval_data", "data"],
)
def test_fit_in_background_raises_a_bad_argument_in_the_callers_thread(
    small_data, data, kwargs, exc, match
):
    train, test = small_data
    named = {"train": train, "test": test, "narrow": test.isel(feature=slice(0, 10))}
    data = named.get(data, data)
    if "eval_data" in kwargs:
        kwargs = {**kwargs, "eval_data": named[kwargs["eval_data"]]}
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    try:
        with pytest.raises(exc, match=match):
            trainer.fit_in_background(data, **kwargs)
        assert trainer._background is None and not trainer._fitting.locked()
        assert trainer._own_cluster is None
    finally:
        trainer.close()


_MODULE = '''
import torch


def double(x):
    return 2 * x


class Net(torch.nn.Module):
    def __init__(self, n_features, act=None):
        super().__init__()
        self.layer = torch.nn.Linear(n_features, 10)
        self.act = act

    def forward(self, x):
        x = self.layer(x)
        return x if self.act is None else self.act(x)


from daskpri.strategies.uniform import Uniform


class MyUniform(Uniform):
    name = "my-uniform"
'''


def _module_only_here(tmp_path, monkeypatch, name):
    """A module of model classes on this process's path, not on the ``dask worker``s'."""
    import importlib

    (tmp_path / f"{name}.py").write_text(_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name), str(tmp_path / f"{name}.py")


def test_a_model_module_the_workers_cannot_import_is_refused_saying_how_to_send_it(
    gpu_cluster, small_data, tmp_path, monkeypatch
):
    train, _ = small_data
    mod, path = _module_only_here(tmp_path, monkeypatch, "daskpri_test_netmod")
    with Client(gpu_cluster) as client:
        trainer = daskpri.Trainer(mod.Net(20), client=client, batch_size=16)
        try:
            with pytest.raises(ValueError, match=re.escape(
                "classes of module(s) 'daskpri_test_netmod' (the model's layers) cannot be "
                "imported by 2 of the run's 2 worker(s) (") + r".*" + re.escape(
                f"): install it where they run, or send it with client.upload_file({path!r}), "
                "or have it sent with the model: "
                "import cloudpickle, daskpri_test_netmod; "
                "cloudpickle.register_pickle_by_value(daskpri_test_netmod)")):
                trainer.fit(train, max_steps=1, progress=False)
            # nothing was set up on the workers
            plugins = client.run_on_scheduler(lambda dask_scheduler: list(
                dask_scheduler.worker_plugins))
            assert not [p for p in plugins if p.startswith("daskpri-")], plugins
            client.upload_file(path)  # the advice, taken
            history = trainer.fit(train, max_steps=2, progress=False)
            assert history.sizes["step"] == 2
        finally:
            trainer.close()


def test_a_module_the_driver_check_misses_fails_the_setup_saying_what_to_do(
    gpu_cluster, small_data, tmp_path, monkeypatch
):
    train, _ = small_data
    # a function, not a layer, from the module: the driver's check looks at layers' classes
    mod, _ = _module_only_here(tmp_path, monkeypatch, "daskpri_test_actmod")
    with Client(gpu_cluster) as client:
        trainer = daskpri.Trainer(torch.nn.Sequential(mod.Net(20).layer, torch.nn.Identity()),
                                  client=client, batch_size=16)
        trainer.model[1].act = mod.double
        try:
            with pytest.raises(ModuleNotFoundError, match=re.escape(
                "could not rebuild the model: No module named 'daskpri_test_actmod'; install "
                "the module where the workers run, send it with client.upload_file(path), or "
                "have it sent with the model (cloudpickle.register_pickle_by_value)")):
                trainer.fit(train, max_steps=1, progress=False)
            plugins = client.run_on_scheduler(lambda dask_scheduler: list(
                dask_scheduler.worker_plugins))
            assert not [p for p in plugins if p.startswith("daskpri-")], plugins
            import cloudpickle

            cloudpickle.register_pickle_by_value(mod)  # the other advice
            try:
                history = trainer.fit(train, max_steps=2, progress=False)
            finally:
                cloudpickle.unregister_pickle_by_value(mod)
            assert history.sizes["step"] == 2
        finally:
            trainer.close()


def test_a_strategy_class_the_cluster_cannot_import_is_refused_saying_where(
    gpu_cluster, small_data, tmp_path, monkeypatch
):
    train, _ = small_data
    mod, path = _module_only_here(tmp_path, monkeypatch, "daskpri_test_stratmod")
    with Client(gpu_cluster) as client:
        trainer = daskpri.Trainer(build_model("mlp", train), strategy=mod.MyUniform(),
                                  client=client, batch_size=16)
        try:
            # the table's scheduler and the workers' steps both unpickle it
            with pytest.raises(ValueError, match=re.escape(
                "classes of module(s) 'daskpri_test_stratmod' (the strategy's class MyUniform) "
                "cannot be imported by 2 of the run's 2 worker(s) (") + r"[^)]*" + re.escape(
                ") and the scheduler: install it where they run, or send it with "
                f"client.upload_file({path!r})") + "$"):
                trainer.fit(train, max_steps=1, progress=False)
            client.upload_file(path)  # to the scheduler too
            history = trainer.fit(train, max_steps=2, progress=False)
            assert history.attrs["strategy"] == "my-uniform"
        finally:
            trainer.close()


def test_a_fit_on_a_store_of_float_labels_with_a_nan_is_refused_before_its_cluster_starts(
    small_data, tmp_path
):
    train, test = small_data
    y = train["y"].values.astype(np.float32)
    y[1234] = np.nan
    store = to_store(train.assign(y=("sample", y)).chunk({"sample": 400}),
                     tmp_path / "train.zarr")
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    try:
        with pytest.raises(ValueError, match=r"^data.y should hold whole-number class labels "
                           r".* but got nan at sample 1234 \(1 such label in samples 1200-1599\)"):
            trainer.fit(store, eval_data=test, max_steps=2, progress=False)
        assert trainer._own_cluster is None and trainer._client is None
    finally:
        trainer.close()


def test_a_fit_trains_on_a_store_of_transposed_features_and_float_labels(
    gpu_client, small_data, tmp_path
):
    train, test = small_data
    as_written = train.transpose("feature", "sample").assign(y=train["y"].astype(np.float32))
    store = to_store(as_written.chunk({"sample": 400}), tmp_path / "train.zarr")
    evals = to_store(test.transpose("feature", "sample").assign(y=test["y"].astype(float)),
                     tmp_path / "test.nc")
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="loss", client=gpu_client)
    try:
        history = trainer.fit(store, eval_data=evals, max_steps=4, progress=False)
        assert np.isfinite(history["accuracy"][-1]) and trainer.step_ == 4
        assert trainer.table_.sizes["sample"] == train.sizes["sample"]
    finally:
        trainer.close()


def test_data_of_fewer_samples_than_workers_is_refused_saying_so(gpu_client, small_data):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:  # not as "give a partition_size of at most 0"
        with pytest.raises(ValueError, match=r"^the data has 1 sample\(s\), fewer than the 2 "
                           r"workers, so a worker would hold none: give more samples, or "
                           r"fewer workers \(n_workers=\)$"):
            trainer.fit(train.isel(sample=slice(0, 1)), max_steps=1, progress=False)
    finally:
        trainer.close()


def test_eval_data_from_a_store_is_read_by_the_driver_not_a_default_clients_workers(
    gpu_client: Client, small_data, tmp_path
):
    from distributed import get_task_stream

    from daskpri.training._checks import open_data

    train, test = small_data
    store = to_store(test.chunk({"sample": 100}), tmp_path / "test.zarr")
    assert Client.current() is gpu_client  # the default client, as a user's often is
    with get_task_stream(gpu_client) as tasks:
        _, _, evalset = open_data(train, store)
    assert not tasks.data  # the workers need not see a file on the driver's disk
    np.testing.assert_array_equal(evalset.y.numpy(), test["y"].values)


def test_in_memory_dask_data_is_read_by_the_driver_not_a_default_clients_workers(
    gpu_client: Client, small_data
):
    from distributed import get_task_stream

    train, _ = small_data
    lazy = train.chunk({"sample": 400})  # as xr.open_mfdataset gives it, in the driver's hands
    assert Client.current() is gpu_client  # the default client, as a user's often is
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        with get_task_stream(gpu_client) as tasks:
            trainer.fit(lazy, max_steps=2, progress=False)
    finally:
        trainer.close()
    # the partitions are read here and scattered once, as in-memory data is: no task of
    # the user's graph runs on the workers (only daskpri's own, its loads and warm-up)
    assert {t["key"][0] if isinstance(t["key"], tuple) else t["key"] for t in tasks.data
            if not str(t["key"]).startswith(("daskpri-", "('daskpri-"))} == set()


def test_a_fit_trains_on_one_number_a_sample_in_memory_and_from_a_store(
    gpu_client, small_data, tmp_path
):
    train, test = small_data
    # x of dimension 'sample' alone, as a column of a table comes: a feature dimension added
    one = train.assign(x=train["x"].isel(feature=0))
    store = to_store(one.chunk({"sample": 400}), tmp_path / "one.zarr")
    trainer = daskpri.Trainer(build_model("mlp", one), strategy="uniform", client=gpu_client)
    try:
        for data in (one, store):
            trainer.fit(data, eval_data=test.assign(x=test["x"].isel(feature=0)),
                        max_steps=trainer.step_ + 2, progress=False)
        assert trainer.step_ == 4 and np.isfinite(trainer.history_["accuracy"][-1])
    finally:
        trainer.close()
