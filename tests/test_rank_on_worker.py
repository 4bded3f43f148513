"""``selective-backprop``'s ``rank_on_worker``: stale steps ranked on the worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import daskpri
from daskpri.models import build_model
from daskpri.replicas.replica import Replica
from daskpri.strategies import get_strategy
from daskpri.strategies.base import Batch, RecentLosses


def _ahead_counts(client, run: str) -> tuple[int, int]:
    """Rounds of ``run`` selected ahead by a strategy that reads the table: taken, declined."""

    def counts(dask_scheduler) -> tuple[int, int]:
        tr = dask_scheduler.plugins["daskpri"].runs[run]
        return tr.ahead_taken, tr.ahead_declined

    return tuple(client.run_on_scheduler(counts))


def _fit(client, train, *, local_steps, max_steps=120, **options):
    """One worker's run of selective-backprop over the 1,600 training samples."""
    model = build_model("mlp", train, seed=1)
    with daskpri.Trainer(model, client=client, seed=3, batch_size=32, n_workers=1,
                         strategy="selective-backprop", local_steps=local_steps,
                         fraction=0.5, refresh=2, warmup=1, **options) as t:
        h = t.fit(train, max_steps=max_steps, progress=False)
        params = torch.nn.utils.parameters_to_vector(t.model.parameters()).detach().clone()
        return h, params, _ahead_counts(client, t._remote.run)


def test_rounds_ranked_on_the_worker_select_what_synchronous_steps_select(gpu_client, small_data):
    # One worker walks 1,600 samples: the warmup is steps 0-49, the fresh
    # epoch 50-74 (64 candidates a step), the stale one 75-99 (ranked by the
    # losses, 32 forwarded), then fresh from 100. Rounds of 4 steps: the
    # round of steps 72-75 selects step 75 before steps 72-74's losses exist.
    # Ranked by the table it therefore keeps other samples than a synchronous
    # step 75 and the runs part; ranked on the worker, which holds those
    # losses, it keeps the same.
    train, _ = small_data
    runs = {(k, on): _fit(gpu_client, train, local_steps=k, rank_on_worker=on)
            for k in (1, 4) for on in (False, True)}
    p = {key: run[1] for key, run in runs.items()}
    torch.testing.assert_close(p[4, True], p[1, True], rtol=1e-4, atol=1e-5)
    # ranking on the worker changes nothing in synchronous steps
    torch.testing.assert_close(p[1, True], p[1, False], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(p[4, False], p[1, False], rtol=1e-2, atol=1e-3)
    # the same samples: forwarded and backpropagated, and their losses along the way
    h1, h4 = runs[1, True][0], runs[4, True][0]
    assert h4["samples"].values[-1] == h1["samples"].values[-1] == (50 + 25) * 32 + (25 + 20) * 64
    assert h4["grad_samples"].values[-1] == 120 * 32
    # a round's loss is over all its losses: its steps' weighted by their sizes
    n = np.diff(h1["samples"].values, prepend=0).reshape(30, 4)
    pooled = (h1["loss"].values.reshape(30, 4) * n).sum(1) / n.sum(1)
    np.testing.assert_allclose(h4["loss"].values, pooled, rtol=1e-3)


def test_ranked_on_the_worker_no_round_waits_for_the_one_in_flight(gpu_client, small_data):
    # Ranked by the table, the rounds whose candidates hold samples of the round
    # in flight (a new pass of the walk) are declined and selected after it
    train, _ = small_data
    _, _, (taken, declined) = _fit(gpu_client, train, local_steps=4, rank_on_worker=False)
    assert declined > 0
    _, _, (taken, declined) = _fit(gpu_client, train, local_steps=4, rank_on_worker=True)
    assert declined == 0 and taken == 29  # every round but the first


def test_a_stale_step_ranked_on_the_worker_keeps_the_top_losses_newest_first():
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    sb = get_strategy("selective-backprop", fraction=0.5, refresh=2, rank_on_worker=True)
    recent = RecentLosses(10, "cpu")
    recent.begin(0)
    recent.record(torch.tensor([2, 7]), torch.tensor([5.0, 0.1]), step=6)
    recent.record(torch.tensor([4]), torch.tensor([9.0]), step=3)  # the table has step 3
    indices = np.array([1, 2, 4, 7, 8, 9])
    table = np.array([1.0, 0.2, 0.3, 4.0, np.inf, 0.5])  # 8 never seen: first
    batch = Batch(x=torch.randn(6, 3), y=torch.tensor([0, 1, 0, 1, 0, 1]), indices=indices,
                  n_train=6, weights=None, mean_grad=None, seed=(0, 7, 0), recent=recent,
                  extra={"stale": np.ones(0, bool), "rank": table, "horizon": np.asarray(4)})
    c = sb.compute(replica, batch)
    # merged: 1.0, 5.0 (the worker's), 0.3, 0.1 (the worker's), inf, 0.5: rows 4, 1, 0
    assert c.rows.tolist() == [0, 1, 4] and c.n_grad == c.n_loss == 3
    grad, losses, _ = replica.weighted_grad(batch.x[[0, 1, 4]], batch.y[[0, 1, 4]], None)
    torch.testing.assert_close(c.grad, grad)
    torch.testing.assert_close(c.priorities, losses)


@pytest.mark.parametrize("options, match", [
    ({"beta": 1.0, "refresh": 2}, "no beta"),
    ({}, "refresh of 2 or more"),
    ({"refresh": 1}, "refresh of 2 or more"),
    ({"refresh": 2, "rank_on_worker": "yes"}, "rank_on_worker should be True or False"),
])
def test_rank_on_worker_refuses_settings_without_stale_top_fraction_steps(options, match):
    options = {"rank_on_worker": True, **options}
    with pytest.raises(ValueError, match=match):
        get_strategy("selective-backprop", **options)
