"""The training loss's options: gradient clipping (``max_grad_norm``), at synchronous steps
and at local steps, and label smoothing (``label_smoothing``), whose unit tests are in
``test_label_smoothing.py``."""

from __future__ import annotations

import math

import dask
import pytest
import torch

import daskpri
from daskpri.models import build_model


def _trainer(client, train, **kw):
    kw = {"client": client, "seed": 3, "batch_size": 32, "strategy": "uniform", **kw}
    return daskpri.Trainer(build_model("mlp", train, seed=1), **kw)


def _vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


@pytest.mark.parametrize("n_workers", [1, 2])
def test_a_clipped_step_moves_the_weights_by_the_rate_times_the_norm(
    gpu_client, small_data, n_workers
):
    train, _ = small_data
    # no momentum, no decay: one step moves the parameters by lr x the (clipped) gradient,
    # and a mean gradient far above 1e-3 is clipped to exactly that norm
    with _trainer(gpu_client, train, n_workers=n_workers, momentum=0.0, learning_rate=0.5,
                  max_grad_norm=1e-3) as t:
        before = _vector(t.model)
        t.fit(train, max_steps=1, progress=False)
        moved = float(torch.linalg.vector_norm(_vector(t.model) - before))
        assert t.history_.attrs["max_grad_norm"] == 1e-3
    assert moved == pytest.approx(0.5 * 1e-3, rel=1e-4)
    with _trainer(gpu_client, train, n_workers=n_workers, momentum=0.0,
                  learning_rate=0.5) as t:
        before = _vector(t.model)
        t.fit(train, max_steps=1, progress=False)
        unclipped = float(torch.linalg.vector_norm(_vector(t.model) - before))
        assert t.history_.attrs["max_grad_norm"] == 0.0  # none
    assert unclipped > 100 * moved


def test_local_steps_clip_each_step_on_the_worker_as_the_driver_does(gpu_client, small_data):
    train, _ = small_data
    runs = {}
    for k in (1, 4):
        with _trainer(gpu_client, train, n_workers=1, local_steps=k, max_grad_norm=0.05) as t:
            t.fit(train, max_steps=12, progress=False)
            runs[k] = _vector(t.model)
    # one worker: a round of 4 local steps is 4 steps of the driver's optimizer, clipped alike
    torch.testing.assert_close(runs[4], runs[1], rtol=1e-5, atol=1e-6)
    with _trainer(gpu_client, train, n_workers=1, local_steps=4) as t:
        t.fit(train, max_steps=12, progress=False)
        assert not torch.allclose(_vector(t.model), runs[4], atol=1e-4)  # it did clip
    # a norm no gradient reaches changes nothing
    with _trainer(gpu_client, train, n_workers=1, local_steps=4, max_grad_norm=1e9) as t:
        t.fit(train, max_steps=12, progress=False)
        unclipped = _vector(t.model)
    with _trainer(gpu_client, train, n_workers=1, local_steps=4) as t:
        t.fit(train, max_steps=12, progress=False)
        torch.testing.assert_close(_vector(t.model), unclipped, rtol=0, atol=0)


def test_the_config_sets_it_and_a_checkpoint_keeps_the_runs_own(gpu_client, small_data, tmp_path):
    train, _ = small_data
    path = tmp_path / "run.ckpt"
    with dask.config.set({"daskpri.trainer.max-grad-norm": 2.5}):
        with _trainer(gpu_client, train, n_workers=1) as t:
            assert t.max_grad_norm == 2.5
            t.fit(train, max_steps=2, progress=False)
            t.save(path)
        # a run without clipping resumes without it, whatever the config says now
        with _trainer(gpu_client, train, n_workers=1, max_grad_norm=None) as t:
            assert t.max_grad_norm == 2.5  # None reads the config, as every argument does
    with daskpri.Trainer.resume(path, client=gpu_client) as t:
        assert t.max_grad_norm == 2.5
    unclipped = tmp_path / "none.ckpt"
    with _trainer(gpu_client, train, n_workers=1) as t:
        assert t.max_grad_norm is None
        t.fit(train, max_steps=2, progress=False)
        t.save(unclipped)
    with dask.config.set({"daskpri.trainer.max-grad-norm": 2.5}):
        with daskpri.Trainer.resume(unclipped, client=gpu_client) as t:
            assert t.max_grad_norm is None


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "1", True])
def test_a_norm_that_is_not_a_positive_finite_number_is_refused(small_data, value):
    train, _ = small_data
    with pytest.raises(ValueError, match=r"max_grad_norm should be a positive finite number, "
                                         r"but got max_grad_norm="):
        daskpri.Trainer(build_model("mlp", train), max_grad_norm=value)


def test_a_smoothed_run_steps_otherwise_records_the_plain_loss_and_resumes_smoothed(
    gpu_client, small_data, tmp_path
):
    train, _ = small_data
    path = tmp_path / "run.ckpt"
    runs = {}
    for eps in (0.0, 0.5):
        with daskpri.Trainer(build_model("mlp", train, seed=1), client=gpu_client, seed=3,
                             strategy="uniform", batch_size=32, n_workers=2,
                             label_smoothing=eps) as t:
            t.fit(train, max_steps=2, progress=False)
            runs[eps] = (t.history_, torch.nn.utils.parameters_to_vector(t.model.parameters()))
            if eps:
                t.save(path)
    (plain, plain_w), (smoothed, smoothed_w) = runs[0.0], runs[0.5]
    assert plain.attrs["label_smoothing"] == 0.0 and smoothed.attrs["label_smoothing"] == 0.5
    # the first step's batch and weights are the same: its recorded loss is the plain one
    assert float(smoothed["loss"][0]) == pytest.approx(float(plain["loss"][0]), rel=1e-6)
    assert float(smoothed["loss"][1]) != pytest.approx(float(plain["loss"][1]), rel=1e-3)
    assert not torch.allclose(smoothed_w, plain_w, atol=1e-4)  # the gradients were not
    with dask.config.set({"daskpri.trainer.label-smoothing": 0.1}):
        with daskpri.Trainer.resume(path, client=gpu_client) as t:
            assert t.label_smoothing == 0.5  # the run's own, whatever the config says now
        with daskpri.Trainer(build_model("mlp", train, seed=1), client=gpu_client) as t:
            assert t.label_smoothing == 0.1
