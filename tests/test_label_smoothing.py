"""Label smoothing of the training loss (``label_smoothing``): gradients smoothed, scores plain."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import daskpri
from daskpri.models import MLP, build_model
from daskpri.replicas.replica import Replica


def _module(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return MLP((6,), 4, hidden=8)


def _grad(module: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    grads = torch.autograd.grad(loss, list(module.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("keep", [False, True])
def test_a_replicas_gradient_is_the_smoothed_losss_and_its_losses_the_plain_ones(weighted, keep):
    x, y = torch.randn(130, 6), torch.randint(0, 4, (130,))  # past sample_losses' CPU cut
    w = torch.rand(130) if weighted else None
    replica = Replica(_module(), "cpu", label_smoothing=0.2)
    replica.keep_grads = keep
    grad, losses, logits = replica.weighted_grad(x, y, w)
    if keep:  # the mean, left in the parameters' .grad
        grad = torch.cat([p.grad.reshape(-1) for p in replica.params]) * len(x)
    reference = _module()
    per_row = F.cross_entropy(reference(x), y, reduction="none", label_smoothing=0.2)
    expected = _grad(reference, (per_row if w is None else per_row * w).sum())
    torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)
    # the scores a strategy ranks stay the plain cross-entropy
    plain = F.cross_entropy(logits, y, reduction="none")
    torch.testing.assert_close(losses, plain, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(losses, per_row.detach(), atol=1e-3)


def test_per_sample_gradients_are_the_smoothed_losses_and_their_losses_the_plain_ones():
    x, y = torch.randn(5, 6), torch.randint(0, 4, (5,))
    grads, losses, logits = Replica(_module(), "cpu", label_smoothing=0.3).per_sample_grads(x, y)
    reference = _module()
    for i in range(len(x)):
        loss = F.cross_entropy(reference(x[i:i + 1]), y[i:i + 1], label_smoothing=0.3)
        torch.testing.assert_close(grads[i], _grad(reference, loss), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(losses, F.cross_entropy(logits, y, reduction="none"))


@pytest.mark.parametrize("value", [1.0, -0.1, float("nan"), "0.1", True])
def test_a_label_smoothing_outside_0_to_1_is_refused(small_data, value):
    train, _ = small_data
    with pytest.raises(ValueError, match=r"label_smoothing should be a number in \[0, 1\), "
                                         r"but got label_smoothing="):
        daskpri.Trainer(build_model("mlp", train, seed=1), label_smoothing=value)
