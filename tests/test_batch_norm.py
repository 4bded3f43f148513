"""Modules with buffers: batch norm's running statistics follow the workers' training."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import daskpri


def _bn_model(train, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    d = int(train["x"].shape[1])
    return nn.Sequential(nn.Linear(d, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))


def _trainer(model: nn.Module, client, strategy: str, **kw) -> daskpri.Trainer:
    return daskpri.Trainer(model, strategy=strategy, client=client, batch_size=32, seed=3, **kw)


def _state(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return params, {k: v.clone() for k, v in model.named_buffers()}


def test_running_statistics_reach_the_master_alike_in_steps_and_rounds(gpu_client, small_data):
    train, test = small_data
    runs = {}
    for k in (1, 4):
        model = _bn_model(train)
        with _trainer(model, gpu_client, "uniform", n_workers=1, local_steps=k) as t:
            t.fit(train, max_steps=24, progress=False)
        runs[k] = _state(model)
    (p1, b1), (p4, b4) = runs[1], runs[4]
    assert int(b1["1.num_batches_tracked"]) == int(b4["1.num_batches_tracked"]) == 24
    # the statistics moved from their initial zeros and ones
    assert b1["1.running_mean"].abs().max() > 1e-3
    assert (b1["1.running_var"] - 1).abs().max() > 1e-3
    # one worker: a round of 4 is 4 plain steps, running statistics included
    torch.testing.assert_close(p4, p1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b4["1.running_mean"], b1["1.running_mean"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b4["1.running_var"], b1["1.running_var"], rtol=1e-5, atol=1e-6)


def test_two_workers_average_their_statistics_and_evaluation_uses_them(gpu_client, small_data):
    train, test = small_data
    model = _bn_model(train)
    with _trainer(model, gpu_client, "selective-backprop", local_steps=2, eval_every=10) as t:
        h = t.fit(train, eval_data=test, max_steps=20, progress=False)
    buffers = dict(model.named_buffers())
    assert int(buffers["1.num_batches_tracked"]) > 0
    assert torch.isfinite(buffers["1.running_var"]).all()
    assert (buffers["1.running_var"] - 1).abs().max() > 1e-3
    # the history's accuracy is the master's, in evaluation mode with those statistics
    model.eval()
    with torch.no_grad():
        x = torch.as_tensor(test["x"].values, dtype=torch.float32)
        acc = float((model(x).argmax(1) == torch.as_tensor(test["y"].values)).float().mean())
    assert h["accuracy"].values[-1] == pytest.approx(acc)


def test_no_steps_leave_the_statistics_as_they_were(gpu_client, small_data):
    train, _ = small_data
    model = _bn_model(train)
    with daskpri.Trainer(model, strategy="uniform", client=gpu_client, batch_size=32) as t:
        t.fit(train, max_steps=2, progress=False)
        _, before = _state(model)
        # max_steps=0 is refused: a fit whose max_steps is reached already takes no step
        with pytest.warns(daskpri.DaskpriWarning, match="max_steps=2 is reached already"):
            t.fit(train, max_steps=2, progress=False)
    for name, value in model.named_buffers():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["projection", "length"])
def test_per_sample_gradients_with_batch_norm_are_refused_early(strategy, small_data):
    train, _ = small_data
    with pytest.raises(ValueError, match=r"per-sample gradients.*layer 1 \(BatchNorm1d\)"):
        daskpri.Trainer(_bn_model(train), strategy=strategy)


@pytest.mark.parametrize("local_steps", [1, 4])
def test_a_steps_combined_buffers_are_the_workers_mean(local_steps: int) -> None:
    import numpy as np

    from daskpri.replicas.step import StepResult
    from daskpri.training.rounds import combine

    def result(mean: float, var: float, n: int) -> StepResult:
        buffers = {"1.running_mean": torch.tensor([mean, 2 * mean]),
                   "1.running_var": torch.tensor([var]), "1.num_batches_tracked": torch.tensor(n)}
        return StepResult(torch.zeros(3), 8, np.arange(8), np.ones(8), 1.0, 8, 4, 0.0, "w", "cpu",
                          0, params=torch.zeros(3) if local_steps > 1 else None, buffers=buffers)

    combined = combine([result(1.0, 4.0, 10), result(3.0, 2.0, 12)], local_steps)
    assert combined.buffers is not None
    torch.testing.assert_close(combined.buffers["1.running_mean"], torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(combined.buffers["1.running_var"], torch.tensor([3.0]))
    assert int(combined.buffers["1.num_batches_tracked"]) == 12
