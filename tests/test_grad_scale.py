"""``selective-backprop``'s ``grad_scale``: selected steps' gradients scaled, plain ones not."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from _selection import make_ctx

import daskpri
from daskpri.models import build_model
from daskpri.replicas.replica import Replica
from daskpri.strategies import get_strategy
from daskpri.strategies.base import Batch, walk_epoch
from daskpri.strategies.selective_backprop import SelectiveBackprop
from daskpri.table.table import PriorityTable


def _batch(x, y, extra):
    return Batch(x=x, y=y, indices=np.arange(x.shape[0]), n_train=x.shape[0], weights=None,
                 mean_grad=None, extra=extra, seed=np.random.default_rng(0))


def _grad(strategy, x, y, extra, keep_grads=False):
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 4), "cpu")
    replica.keep_grads = keep_grads
    c = strategy.compute(replica, _batch(x, y, extra))
    if keep_grads:
        assert c.grad is None  # left in the module, as local steps leave it
        return torch.cat([p.grad.reshape(-1) for p in replica.params])
    return c.grad


def test_selection_marks_the_stale_selected_steps_and_not_the_plain_ones():
    # one worker of 8 samples, batch 2, fraction 0.5, refresh=2: epoch 0 plain (warmup),
    # epoch 1 scored afresh, epoch 2 ranked by the table
    table = PriorityTable([8])
    ctx = make_ctx([8], [0], batch_size=2, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=1, grad_scale=0.5)
    seen = {}
    while walk_epoch(ctx, 0) < 3:
        epoch = walk_epoch(ctx, 0)
        [sel] = s.select(ctx)
        seen.setdefault(epoch, []).append(set(sel.extra))
        table.update(sel.train, np.linspace(0.1, 1.0, sel.train.size), step=ctx.step)
        ctx.step += 1
    assert all(keys == {"stale"} for keys in seen[0])  # plain: not scaled
    assert all("stale" not in keys for keys in seen[1])  # fresh: the worker scales
    assert all(keys == {"stale", "scaled"} for keys in seen[2])  # stale, selected: scaled
    # the default scales nothing and sends no mark
    ctx = make_ctx([8], [0], batch_size=2, table=table, step=ctx.step, state=ctx.state)
    plain = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=1)
    assert plain.grad_scale == 1.0 and "scaled" not in plain._stale_extra


@pytest.mark.parametrize("keep_grads", [False, True])
def test_compute_scales_the_gradient_of_selected_steps_only(keep_grads):
    torch.manual_seed(1)
    x, y = torch.randn(12, 3), torch.randint(0, 4, (12,))
    half = SelectiveBackprop(fraction=0.5, grad_scale=0.5)
    full = SelectiveBackprop(fraction=0.5)
    # a stale selected step
    scaled = _grad(half, x, y, {"stale": np.ones(0, bool), "scaled": np.ones(0, bool)},
                   keep_grads)
    unscaled = _grad(full, x, y, {"stale": np.ones(0, bool)}, keep_grads)
    torch.testing.assert_close(scaled, 0.5 * unscaled, rtol=1e-6, atol=0)
    # a plain step (warmup, annealed) of the scaling strategy is left as it is
    plain = _grad(half, x, y, {"stale": np.ones(0, bool)}, keep_grads)
    torch.testing.assert_close(plain, unscaled, rtol=0, atol=0)
    # a fresh step: the same rows kept, their gradient scaled
    torch.testing.assert_close(_grad(half, x, y, {}, keep_grads),
                               0.5 * _grad(full, x, y, {}, keep_grads), rtol=1e-6, atol=0)


def _vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _trainer(client, train, scale, **kw):
    strategy = SelectiveBackprop(fraction=0.5, warmup=0, grad_scale=scale)
    kw = {"client": client, "seed": 3, "batch_size": 32, "strategy": strategy, **kw}
    return daskpri.Trainer(build_model("mlp", train, seed=1), **kw)


@pytest.mark.parametrize("n_workers", [1, 2])
def test_a_selected_step_moves_the_weights_by_the_scale(gpu_client, small_data, n_workers):
    train, _ = small_data
    moved = {}
    for scale in (1.0, 0.25):
        # no momentum: one step moves the parameters by lr x the (scaled) mean gradient
        with _trainer(gpu_client, train, scale, n_workers=n_workers, momentum=0.0,
                      learning_rate=0.5) as t:
            before = _vector(t.model)
            t.fit(train, max_steps=1, progress=False)
            moved[scale] = _vector(t.model) - before
    assert float(moved[1.0].norm()) > 0
    torch.testing.assert_close(moved[0.25], 0.25 * moved[1.0], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("local_steps", [1, 4])
def test_scaled_steps_follow_the_run_at_the_scaled_rate(gpu_client, small_data, local_steps):
    train, _ = small_data
    # without momentum a selected step at lr x scale is a step at lr of the scaled gradient:
    # 2,000 samples on one worker, 250 a step from 500 candidates, no warmup: epoch 0
    # scored afresh (4 steps), epoch 1 ranked by the table (refresh=2), on the driver's
    # optimizer (1) and the worker's (4 local steps)
    runs = {}
    for lr, scale in [(0.5, 0.5), (0.25, 1.0), (0.5, 1.0)]:
        s = SelectiveBackprop(fraction=0.5, warmup=0, refresh=2, grad_scale=scale)
        with daskpri.Trainer(build_model("mlp", train, seed=1), client=gpu_client, seed=3,
                             batch_size=250, strategy=s, n_workers=1, momentum=0.0,
                             learning_rate=lr, local_steps=local_steps) as t:
            t.fit(train, max_steps=8, progress=False)
            runs[lr, scale] = _vector(t.model)
    torch.testing.assert_close(runs[0.5, 0.5], runs[0.25, 1.0], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(runs[0.5, 0.5], runs[0.5, 1.0], atol=1e-3)


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, "1", True])
def test_a_scale_that_is_not_a_positive_finite_number_is_refused(value):
    with pytest.raises(ValueError, match=r"grad_scale should be a finite number > 0, but got "
                                         rf"grad_scale={re.escape(repr(value))}"):
        get_strategy("selective-backprop", grad_scale=value)
