"""The CUDA path: workers tagged ``GPU=1`` train on their GPU where CUDA is available.

Without CUDA (CI, this project's machines) the same workers fall back to the
CPU, and the first test checks that; with CUDA (the device runs recorded in
docs/bench/LOG.md) every test here runs on the GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import daskpri
from daskpri.bench.baselines import train_plain
from daskpri.models import build_model
from daskpri.strategies import STRATEGIES, get_strategy

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


def _spread(n_workers: int) -> list[str]:
    """The devices of ``n_workers`` GPU-tagged worker processes of this host, sorted.

    The processes take one GPU each, round the host's GPUs (one: all share
    it); without CUDA, each trains on its CPU.
    """
    return sorted(f"cuda:{i % GPUS}" if CUDA else "cpu" for i in range(n_workers))


def _all(devices: dict[str, list[str]]) -> list[str]:
    return sorted(d for found in devices.values() for d in found)


def _replica_devices(dask_worker) -> list[str]:
    """The devices of the daskpri replicas this worker holds."""
    return sorted(str(p.replica.device) for name, p in dask_worker.plugins.items()
                  if name.startswith("daskpri-") and hasattr(p, "replica"))


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def _fit(client, data, strategy, path=None, steps=12, model="cnn", **options):
    train, test = data
    trainer = daskpri.Trainer(
        build_model(model, train, seed=1), strategy=get_strategy(strategy, **options),
        client=client, seed=0, batch_size=32, eval_every=6, checkpoint_path=path,
    )
    try:
        history = trainer.fit(train, eval_data=test, max_steps=steps, progress=False)
        devices = client.run(_replica_devices)
    finally:
        trainer.close()
    return history, devices


def test_gpu_tagged_workers_train_on_their_gpu_or_else_on_the_cpu(gpu_client, small_data,
                                                                 tmp_path):
    path = tmp_path / "run.ckpt"
    history, devices = _fit(gpu_client, small_data, "selective-backprop", path)
    assert len(devices) == 2
    assert _all(devices) == _spread(2), devices
    assert np.isfinite(history["loss"]).all()
    assert float(history["accuracy"].dropna("step")[-1]) > 0.3
    # the checkpoint holds CPU tensors: it loads weights-only on a machine with no GPU
    state = torch.load(path, weights_only=True)
    tensors = list(_tensors(state))
    assert tensors and {t.device.type for t in tensors} == {"cpu"}


def test_predict_and_chunked_evaluate_run_on_the_gpu_of_gpu_tagged_workers(
    gpu_client, small_data, tmp_path
):
    # (defined here: pickled by value, as a user's model of a notebook is)
    class Where(torch.nn.Module):
        """Logits that say where the model ran: class 1 on a GPU, else class 0 (a tie)."""

        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            cuda = torch.full((x.shape[0],), float(x.is_cuda), device=x.device)
            return self.bias + torch.stack([torch.zeros_like(cuda), cuda], 1)

    _, test = small_data
    ones = test.assign(y=test["y"] * 0 + 1)  # labelled as the model says on a GPU
    ones.attrs["n_classes"] = 2
    path = str(tmp_path / "held.zarr")
    ones.chunk({"sample": 150}).to_zarr(path, zarr_format=3, consolidated=False)
    expected = 1 if CUDA else 0
    with daskpri.Trainer(Where(), client=gpu_client) as trainer:
        on_workers = gpu_client.compute(trainer.predict(path)).result()
        on_cpu = gpu_client.compute(trainer.predict(path, device="cpu")).result()
        here = trainer.predict(ones)  # in memory: on the driver's GPU (eval-device null)
        chunked = trainer.evaluate(path, chunked=True)
        chunked_on_cpu = trainer.evaluate(path, chunked=True, device="cpu")
    assert (on_workers.argmax("class") == expected).all()
    assert (here.argmax("class") == expected).all()
    assert (on_cpu.argmax("class") == 0).all()
    assert chunked["accuracy"] == float(expected) and chunked_on_cpu["accuracy"] == 0.0
    assert next(trainer.model.parameters()).device.type == "cpu"  # the trainer's stays


@needs_cuda
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_every_strategy_trains_on_the_gpu(gpu_client, small_data, strategy, model):
    history, devices = _fit(gpu_client, small_data, strategy, model=model, steps=16)
    assert _all(devices) == _spread(2), devices
    assert np.isfinite(history["loss"]).all()
    assert int(history["grad_samples"][-1]) > 0
    assert float(history["accuracy"].dropna("step")[-1]) > 0.25


@needs_cuda
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_a_bfloat16_run_trains_on_the_gpu_or_is_refused_on_one_before_ampere(
    gpu_client, small_data, model
):
    train, test = small_data
    trainer = daskpri.Trainer(build_model(model, train, seed=1), strategy="selective-backprop",
                              client=gpu_client, seed=0, batch_size=32, eval_every=8,
                              precision="bfloat16")
    try:
        if torch.cuda.get_device_capability(0)[0] < 8:
            with pytest.raises(Exception, match="precision='bfloat16' needs a GPU of compute "
                                                "capability 8.0 or more"):
                trainer.fit(train, eval_data=test, max_steps=16, progress=False)
            return
        history = trainer.fit(train, eval_data=test, max_steps=16, progress=False)
        assert _all(gpu_client.run(_replica_devices)) == _spread(2)
        assert history.attrs["precision"] == "bfloat16"
        assert np.isfinite(history["loss"]).all()
        assert float(history["accuracy"].dropna("step")[-1]) > 0.25
    finally:
        trainer.close()


@needs_cuda
def test_a_forced_cuda_device_and_a_bfloat16_score_run_on_the_gpu(gpu_client, small_data):
    history, devices = _fit(gpu_client, small_data, "upper-bound", tau_threshold=1.0,
                            smoothing=0.0, score_dtype="bfloat16")
    assert _all(devices) == _spread(2), devices
    assert np.isfinite(history["loss"]).all()
    train, test = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                              device="cuda:0")
    try:
        trainer.fit(train, max_steps=4, progress=False)
        assert all(found == ["cuda:0"] for found in gpu_client.run(_replica_devices).values())
    finally:
        trainer.close()


@needs_cuda
def test_the_plain_loop_baseline_trains_on_the_gpu(small_data):
    train, test = small_data
    arrays = [(np.asarray(d["x"].values, np.float32), np.asarray(d["y"].values))
              for d in (train, test)]
    model = build_model("cnn", train, seed=0)
    result = train_plain(model, *arrays, batch_size=64, learning_rate=0.05, momentum=0.9,
                         budget=1.0, eval_seconds=0.5, seed=0, device="cuda")
    assert next(model.parameters()).device.type == "cuda"
    assert result.samples == 64 * int(result.curve.step[-1]) > 0
    assert np.nanmax(result.curve.accuracy) > 0.3


@needs_cuda
def test_the_driver_evaluates_on_its_gpu_a_copy_of_the_cpu_model(small_data):
    from daskpri.training.evaluation import EvalSet

    train, test = small_data
    model = build_model("cnn", train, seed=0)
    on_gpu, on_cpu = EvalSet(test), EvalSet(test, device="cpu")
    assert on_gpu.device == torch.device("cuda", 0) and on_gpu.x.is_cuda
    first = on_gpu.evaluate(model)
    assert first[0] == pytest.approx(on_cpu.evaluate(model)[0], abs=2e-3)
    assert first[1] == pytest.approx(on_cpu.evaluate(model)[1], rel=1e-4)
    assert next(model.parameters()).device.type == "cpu"  # the caller's model stays
    with torch.no_grad():  # the next evaluation scores the weights as they are then
        for p in model.parameters():
            p.mul_(0.5)
    second = on_gpu.evaluate(model)
    assert second[1] != first[1]
    assert second[1] == pytest.approx(on_cpu.evaluate(model)[1], rel=1e-4)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("device", [None, "cuda"])
def test_two_worker_processes_of_a_host_of_several_gpus_train_on_different_ones(
    small_data, tmp_path, device
):
    from _procs import dask_cluster
    from distributed import Client

    train, _ = small_data
    # as a user starts them: one command, two processes, each seeing every GPU
    workers = [["--nworkers", "2", "--nthreads", "1", "--resources", "GPU=1"]]
    # this module on the workers' path, for client.run(_replica_devices)
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    with (dask_cluster(tmp_path, workers, expect=2, worker_env={"PYTHONPATH": path}) as address,
          Client(address) as client):
        trainer = daskpri.Trainer(build_model("mlp", train, seed=0), strategy="uniform",
                                  client=client, device=device, resources={"GPU": 1})
        try:
            trainer.fit(train, max_steps=4, progress=False)
            devices = client.run(_replica_devices)
            # a worker its nanny restarts sets the replica up as it joins: on its own GPU
            client.restart_workers([sorted(devices)[0]])
            trainer.fit(train, max_steps=8, progress=False)
            again = client.run(_replica_devices)
        finally:
            trainer.close()
    assert _all(devices) == _all(again) == ["cuda:0", "cuda:1"], (devices, again)
