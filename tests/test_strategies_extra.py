"""The ``upper-bound`` and ``infobatch`` strategies: pure selection, then end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _selection import make_ctx as _make_ctx

import daskpri
from daskpri.models import build_model
from daskpri.replicas.replica import Replica
from daskpri.strategies import STRATEGIES, get_strategy
from daskpri.strategies.base import Batch
from daskpri.strategies.infobatch import prune_epoch
from daskpri.strategies.upper_bound import (
    draw_by_scores,
    logit_gradient_norms,
    variance_reduction,
)
from daskpri.table.table import PriorityTable
from daskpri.training import checkpoint


def make_ctx(table, owner, **kw):
    """``test_strategies.make_ctx`` on an existing table."""
    return _make_ctx(None, owner, table=table, **kw)


def _batch(x, y, extra=None, seed=0):
    return Batch(
        x=x,
        y=y,
        indices=np.arange(x.shape[0]),
        n_train=x.shape[0],
        weights=None,
        mean_grad=None,
        extra={} if extra is None else extra,
        seed=np.random.default_rng(seed),
    )


def test_registry_lists_both_with_their_defaults():
    assert {"upper-bound", "infobatch"} <= set(STRATEGIES)
    assert repr(get_strategy("upper-bound")) == (
        "UpperBound(presample=3.0, tau_threshold=None, smoothing=0.9, batch_size=None, "
        "score_dtype='float32')"
    )
    assert repr(get_strategy("infobatch")) == (
        "InfoBatch(prune=0.5, anneal=0.875, epochs=None, batch_size=None)"
    )


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("upper-bound", {"presample": 0.5}, r"presample should be a finite number >= 1, but got"),
        ("upper-bound", {"presample": float("inf")}, "presample should be a finite number"),
        ("upper-bound", {"presample": True}, "presample should be a finite number"),
        ("upper-bound", {"tau_threshold": 0.9}, "tau_threshold should be a finite number >= 1"),
        ("upper-bound", {"tau_threshold": float("nan")}, "tau_threshold should be a finite"),
        ("upper-bound", {"smoothing": 1.0}, r"smoothing should be a number in \[0, 1\), but"),
        ("upper-bound", {"smoothing": -0.1}, r"smoothing should be a number in \[0, 1\), but"),
        ("upper-bound", {"batch_size": 0}, "batch_size should be a positive integer"),
        ("infobatch", {"prune": 1.0}, r"prune should be a number in \[0, 1\), but got prune=1"),
        ("infobatch", {"prune": "0.5"}, r"prune should be a number in \[0, 1\), but got "
                                        r"prune='0\.5'"),
        ("projection", {"mean_grad_decay": -0.1}, r"mean_grad_decay should be a number in "
                                                  r"\[0, 1\), but got mean_grad_decay=-0\.1$"),
        ("projection", {"mean_grad_decay": 1.0}, r"mean_grad_decay should be a number in "
                                                 r"\[0, 1\), but got mean_grad_decay=1\.0$"),
        ("projection", {"train_on_renew": "no"}, r"train_on_renew should be True or False, but got "
                                                 r"train_on_renew='no'"),
        ("infobatch", {"anneal": 1.5}, r"anneal should be a number in \[0, 1\], but got"),
        ("infobatch", {"epochs": 0}, "epochs should be a positive integer, but got epochs=0"),
        ("infobatch", {"epochs": 2.5}, "epochs should be a positive integer"),
        ("infobatch", {"batch_size": -1}, "batch_size should be a positive integer"),
        ("selective-backprop", {"beta": 0}, r"beta should be a finite number > 0, but got beta=0"),
        ("selective-backprop", {"beta": float("nan")}, "beta should be a finite number > 0"),
        ("selective-backprop", {"beta": True}, "beta should be a finite number > 0"),
    ],
)
def test_parameter_errors_name_the_field(name, options, message):
    with pytest.raises(ValueError, match=message):
        get_strategy(name, **options)


# -- upper-bound -------------------------------------------------------------------


def test_upper_bound_score_is_the_norm_of_the_loss_gradient_wrt_the_logits():
    torch.manual_seed(0)
    logits = (3 * torch.randn(16, 5)).requires_grad_()
    y = torch.randint(0, 5, (16,))
    # Summed, each row's gradient is that sample's own.
    (grad,) = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), logits)
    torch.testing.assert_close(logit_gradient_norms(logits, y), grad.norm(dim=1))


def test_variance_reduction_is_one_for_equal_scores_and_sqrt_b_for_one_hot():
    assert variance_reduction(np.full(10, 0.3)) == pytest.approx(1.0)
    assert variance_reduction(np.eye(1, 16)[0]) == pytest.approx(4.0)
    assert variance_reduction(np.zeros(5)) == pytest.approx(1.0)
    s = np.random.default_rng(0).gamma(0.5, size=64)
    g = s / s.sum()
    # 1 - ||g - u||^2 / ||g||^2 = 1 / (B ||g||^2)
    assert variance_reduction(s) == pytest.approx(np.sqrt(64 * (g**2).sum()))


def test_upper_bound_threshold_is_the_cost_of_presampling():
    assert get_strategy("upper-bound").threshold(32) == pytest.approx(2.0)
    # B = 50 forwards + b = 10 backwards (2 forwards each), against 10 plain steps
    assert get_strategy("upper-bound", presample=5).threshold(10) == pytest.approx(80 / 30)
    assert get_strategy("upper-bound", tau_threshold=1.5).threshold(10) == 1.5
    assert get_strategy("upper-bound", batch_size=8).gradients_per_step(64, 1000) == 8
    assert get_strategy("upper-bound").gradients_per_step(64, 1000) == 64


def _run_upper_bound(strategy, table, ctx, scores_of, steps):
    """Select ``steps`` times, writing ``scores_of(idx)`` of each selection back."""
    history = []
    for step in range(steps):
        ctx.step = step
        sels = strategy.select(ctx)
        history.append((sels, ctx.state["tau"]))
        for sel in sels:
            table.update(sel.train, scores_of(sel.train), step=step)
    return history


def test_upper_bound_stays_off_for_uniform_scores():
    table = PriorityTable([100, 100])
    ctx = make_ctx(table, [0, 1], batch_size=16)
    history = _run_upper_bound(
        get_strategy("upper-bound"), table, ctx, lambda idx: np.full(idx.size, 0.7), 40
    )
    for sels, tau in history:
        assert tau <= 1.0 + 1e-9
        for sel in sels:
            assert sel.train.size == 16 and sel.weights is None and sel.extra == {}
    assert ctx.state["importance"] == 0


def test_upper_bound_switches_on_for_skewed_scores():
    table = PriorityTable([100, 100])
    ctx = make_ctx(table, [0, 1], batch_size=16)

    def one_hot(idx):  # one sample of each batch holds all the mass: tau = sqrt(batch)
        return np.eye(1, idx.size)[0]

    history = _run_upper_bound(get_strategy("upper-bound"), table, ctx, one_hot, 12)
    on = [bool(sels[0].extra) for sels, _ in history]
    # tau = 4 from b = 16 scores; the average starts at 0 with momentum 0.9 and
    # passes the threshold 2 after 7 updates: 4 (1 - 0.9^7) = 2.09
    assert on == [False] * 7 + [True] * 5
    sels, tau = history[7]
    assert tau == pytest.approx(4 * (1 - 0.9**7))
    for sel in sels:
        assert sel.train.size == 48 and sel.weights is None
        assert sel.extra["draws"].tolist() == [16]
        assert np.unique(sel.train).size == 48  # candidates of a shuffled pass
    assert ctx.state["importance"] == 1


def test_upper_bound_pools_the_workers_batches_so_one_sample_each_still_switches_it_on():
    table = PriorityTable([100] * 6)
    ctx = make_ctx(table, list(range(6)), batch_size=1)
    # each worker trains one sample a step; one of the six holds all the mass,
    # so the step's batch of six has tau = sqrt(6) > the threshold, (3 + 3) / 3
    history = _run_upper_bound(
        get_strategy("upper-bound", smoothing=0.0),
        table,
        ctx,
        lambda idx: np.full(idx.size, float(idx[0] < 100)),
        3,
    )
    assert [tau for _, tau in history] == [0.0, pytest.approx(6**0.5), pytest.approx(6**0.5)]
    assert [bool(sels[0].extra) for sels, _ in history] == [False, True, True]


def test_upper_bound_folds_each_steps_scores_in_once_they_are_back():
    table = PriorityTable([100])
    strategy = get_strategy("upper-bound", smoothing=0.5, batch_size=16)
    ctx = make_ctx(table, [0])
    batches = []
    for step in range(3):  # three steps selected before any score is back
        ctx.step = step
        [sel] = strategy.select(ctx)
        batches.append(sel.train)
        assert ctx.state["tau"] == 0.0
    for step, idx in enumerate(batches):
        table.update(idx, np.eye(1, idx.size)[0], step=step)  # tau = sqrt(16) each
    ctx.step = 3
    [sel] = strategy.select(ctx)
    assert ctx.state["tau"] == pytest.approx(4 * (1 - 0.5**3))
    [sel] = strategy.select(ctx)  # step 3 selected again, as a retried step is
    assert ctx.state["tau"] == pytest.approx(3.5)
    table.update(sel.train, np.full(sel.train.size, 0.2), step=3)  # only the retry's come
    ctx.step = 4
    strategy.select(ctx)
    assert ctx.state["tau"] == pytest.approx(0.5 * 3.5 + 0.5 * 1.0)


def test_upper_bound_folds_in_every_step_of_a_round_whose_scores_come_back_at_its_end():
    table = PriorityTable([100])
    strategy = get_strategy("upper-bound", smoothing=0.5, batch_size=16)
    ctx = make_ctx(table, [0])
    batches = []
    for step in range(4):  # a round of 4 local steps, selected at once
        ctx.step = step
        [sel] = strategy.select(ctx)
        batches.append(sel.train)
    for idx in batches:  # the round's scores, as of its last step
        table.update(idx, np.eye(1, idx.size)[0], step=3)
    ctx.step = 4
    strategy.select(ctx)
    # four updates of tau = sqrt(16), one a step (only the last step's were folded in)
    assert ctx.state["tau"] == pytest.approx(4 * (1 - 0.5**4))


def test_upper_bound_ignores_scores_that_never_come_back():
    table = PriorityTable([50])
    table.update(np.arange(50), np.eye(1, 50)[0], step=0)
    ctx = make_ctx(table, [0], batch_size=8, state={"tau": 0.5})
    strategy = get_strategy("upper-bound")
    for step in range(1, 200):
        ctx.step = step
        strategy.select(ctx)
        assert ctx.state["tau"] == 0.5
    assert len(ctx.state["scored"]) <= 66  # bounded: 64 steps of patience


def test_upper_bound_gradient_estimate_is_unbiased():
    """Monte-Carlo: presample, draw by score, weight 1/(B p): the mean of g_i."""
    rng = np.random.default_rng(0)
    n = 200
    scores = rng.gamma(0.5, 2.0, size=n) + 0.01
    g = np.column_stack([scores, scores**2 / 4, rng.normal(size=n)])  # correlated with score
    full = g.mean(0)
    table = PriorityTable([100, 100])
    table.update(np.arange(n), scores, step=0)
    strategy = get_strategy("upper-bound", tau_threshold=1.0, batch_size=8)
    # Importance sampling on; no fresh scores come back, so it stays on.
    ctx = make_ctx(table, [0, 1], step=1, seed=1, state={"tau": 5.0})
    draw_rng = np.random.default_rng(2)
    weighted, unweighted = [], []
    for _ in range(3000):
        sels = strategy.select(ctx)
        est, plain = [], []
        for sel in sels:
            assert sel.train.size == 24 and sel.extra["draws"].tolist() == [8]
            pos, w = draw_by_scores(scores[sel.train], 8, draw_rng)
            rows = sel.train[pos]
            est.append((w[:, None] * g[rows]).sum(0))
            plain.append(g[rows].sum(0))
        weighted.append(np.sum(est, 0) / 16)
        unweighted.append(np.sum(plain, 0) / 16)
    weighted, unweighted = np.array(weighted), np.array(unweighted)
    se = weighted.std(0) / np.sqrt(len(weighted))
    assert (np.abs(weighted.mean(0) - full) < 4 * se).all()
    assert (np.abs(unweighted.mean(0) - full) > 4 * se).any()


def test_upper_bound_compute_backpropagates_the_draws_with_their_weights():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 4), "cpu")
    x, y = 2 * torch.randn(12, 3), torch.randint(0, 4, (12,))
    c = get_strategy("upper-bound").compute(replica, _batch(x, y, {"draws": np.array([5])}, seed=3))
    grads, losses, logits = replica.per_sample_grads(x, y)
    scores = logit_gradient_norms(logits, y).numpy()
    pos, w = draw_by_scores(scores, 5, np.random.default_rng(3))
    expected = (torch.as_tensor(w, dtype=torch.float32)[:, None] * grads[pos]).sum(0)
    torch.testing.assert_close(c.grad, expected, rtol=1e-5, atol=1e-6)
    assert c.n_grad == 5 and c.rows.tolist() == list(range(12)) and c.n_loss == 12
    np.testing.assert_allclose(c.priorities, scores, rtol=1e-5)
    assert c.loss_sum == pytest.approx(float(losses.sum()), rel=1e-5)


def test_upper_bound_while_off_trains_the_batch_with_weight_one():
    torch.manual_seed(0)
    table = PriorityTable([40])
    [sel] = get_strategy("upper-bound").select(make_ctx(table, [0], batch_size=6))
    assert sel.train.size == 6 and sel.weights is None and "draws" not in sel.extra
    replica = Replica(torch.nn.Linear(3, 4), "cpu")
    x, y = torch.randn(6, 3), torch.randint(0, 4, (6,))
    c = get_strategy("upper-bound").compute(replica, _batch(x, y))
    grads, _, logits = replica.per_sample_grads(x, y)
    torch.testing.assert_close(c.grad, grads.sum(0), rtol=1e-5, atol=1e-6)
    assert c.n_grad == 6
    np.testing.assert_allclose(c.priorities, logit_gradient_norms(logits, y).numpy(), rtol=1e-5)


# -- infobatch ---------------------------------------------------------------------


def test_infobatch_prunes_about_r_of_the_low_loss_samples():
    rng = np.random.default_rng(0)
    losses = np.where(np.arange(2000) < 800, 0.1, 1.0)  # 40% below the mean 0.64
    losses[-10:] = np.inf  # unseen: never pruned, not in the mean
    keep, w = prune_epoch(losses, 0.5, rng)
    assert np.unique(keep).size == keep.size
    low = np.arange(800)
    kept_low = np.isin(low, keep).sum()
    assert abs(kept_low - 400) < 4 * np.sqrt(800 * 0.25)  # binomial(800, 0.5)
    assert np.isin(np.arange(800, 2000), keep).all()
    np.testing.assert_array_equal(w, np.where(keep < 800, 2.0, 1.0))
    assert keep.size == 1200 + kept_low
    keep, w = prune_epoch(np.full(5, np.inf), 0.5, rng)  # nothing seen: a full pass
    assert sorted(keep.tolist()) == list(range(5)) and (w == 1).all()


def test_infobatch_weighted_epoch_sum_is_unbiased():
    rng = np.random.default_rng(0)
    losses = rng.gamma(0.5, 2.0, size=300)
    g = np.column_stack([losses, rng.normal(size=300)])
    sums = []
    for _ in range(3000):
        keep, w = prune_epoch(losses, 0.7, rng)
        sums.append((w[:, None] * g[keep]).sum(0))
    sums = np.array(sums)
    se = sums.std(0) / np.sqrt(len(sums))
    assert (np.abs(sums.mean(0) - g.sum(0)) < 4 * se).all()


def _walk(strategy, ctx, steps):
    """(epoch, index, weight) of each sample drawn over ``steps`` one-sample steps."""
    out = []
    for step in range(steps):
        ctx.step = step
        [sel] = strategy.select(ctx)
        out.append((ctx.state["epochs"][0], int(sel.train[0]), float(sel.weights[0])))
    return out


def test_infobatch_epoch_visits_exactly_the_kept_samples_once():
    table = PriorityTable([100])
    losses = np.where(np.arange(100) < 30, 0.1, 1.0)  # 30 below the mean 0.73
    table.update(np.arange(100), losses, step=0)
    strategy = get_strategy("infobatch", prune=0.5, batch_size=1)
    drawn = _walk(strategy, make_ctx(table, [0], seed=4), 100)
    # the first pruned epoch is the strategy's first draw from the same seed
    keep, weights = prune_epoch(losses, 0.5, np.random.default_rng(4))
    epoch0 = [(i, w) for e, i, w in drawn if e == 0]
    assert [i for i, _ in epoch0] == keep.tolist()
    assert len(epoch0) == 70 + np.isin(np.arange(30), keep).sum() < 100
    assert [w for _, w in epoch0] == weights.tolist()
    assert {w for i, w in epoch0 if i < 30} == {2.0} and {w for i, w in epoch0 if i >= 30} == {1.0}
    assert drawn[len(epoch0)][0] == 1  # the next epoch starts right after


def test_infobatch_prunes_below_the_whole_tables_mean_not_a_workers():
    # worker 0 holds the easy samples (loss 0.1), worker 1 the hard ones
    # (1.0): against the table's mean, 0.55, only worker 0's are low, as the
    # paper's one sampler over the whole dataset judges them
    table = PriorityTable([100, 100])
    table.update(np.arange(200), np.where(np.arange(200) < 100, 0.1, 1.0), step=0)
    strategy = get_strategy("infobatch", prune=0.5, batch_size=100)
    ctx = make_ctx(table, [0, 1], batch_size=100)
    easy, hard = strategy.select(ctx)
    assert (easy.weights == 2.0).all()
    assert (hard.weights == 1.0).all()
    np.testing.assert_array_equal(hard.train, np.arange(100, 200))


def test_infobatch_batches_come_sorted_with_their_weights():
    table = PriorityTable([60, 60])
    table.update(np.arange(120), np.tile(np.linspace(0, 1, 60), 2), step=0)
    strategy = get_strategy("infobatch", prune=0.8)
    ctx = make_ctx(table, [0, 1], batch_size=10)
    for sel, group in zip(strategy.select(ctx), ctx.groups, strict=True):
        assert sel.train.size == 10 and np.isin(sel.train, group).all()
        assert (np.diff(sel.train) >= 0).all()
        np.testing.assert_allclose(sel.weights, np.where(sel.train % 60 < 30, 5.0, 1.0))
    assert strategy.gradients_per_step(10, 60) == 10


def test_infobatch_stops_pruning_from_anneal_times_epochs():
    table = PriorityTable([100])
    table.update(np.arange(100), np.where(np.arange(100) < 30, 0.1, 1.0), step=0)
    strategy = get_strategy("infobatch", prune=0.5, anneal=0.5, epochs=4, batch_size=1)
    drawn = _walk(strategy, make_ctx(table, [0]), 500)
    per_epoch = {e: [(i, w) for f, i, w in drawn if f == e] for e in range(4)}
    assert len(per_epoch[0]) < 100 and len(per_epoch[1]) < 100  # epochs 0, 1 < 0.5 * 4
    for e in (2, 3):
        assert sorted(i for i, _ in per_epoch[e]) == list(range(100))
        assert {w for _, w in per_epoch[e]} == {1.0}
    never = get_strategy("infobatch", epochs=None)
    assert never.pruning(10**6) and not get_strategy("infobatch", prune=0.0).pruning(0)


def test_infobatch_restarts_its_walk_when_the_groups_change():
    table = PriorityTable([10, 10, 10])
    strategy = get_strategy("infobatch", batch_size=4)
    ctx = make_ctx(table, [0, 0, 1])
    strategy.select(ctx)
    moved = make_ctx(table, [0, 1, 1], state=ctx.state)  # a worker lost, data re-placed
    sels = strategy.select(moved)
    for sel, group in zip(sels, moved.groups, strict=True):
        assert sel.train.size == 4 and np.isin(sel.train, group).all()


# -- end to end on a LocalCluster ------------------------------------------------------


def _fit_and_resume(client, data, tmp_path, strategy, first=12, steps=24, **options):
    """Fit ``steps`` straight, and ``first`` + resume + the rest; histories and checkpoint."""
    train, test = data
    path = tmp_path / "run.ckpt"
    kw = {"client": client, "seed": 3, "batch_size": 32, "eval_every": 8}
    a = daskpri.Trainer(
        build_model("mlp", train, seed=1), strategy=get_strategy(strategy, **options), **kw
    )
    try:
        a.fit(train, eval_data=test, max_steps=first, progress=False)
        a.save(path)
        ha = a.fit(train, eval_data=test, max_steps=steps, progress=False)
    finally:
        a.close()
    b = daskpri.Trainer.resume(path, client=client)
    try:
        hb = b.fit(train, eval_data=test, max_steps=steps, progress=False)
        b.save(path)
    finally:
        b.close()
    return ha, hb, checkpoint.read(path)


def test_upper_bound_trains_end_to_end_and_resumes_exactly(gpu_client, small_data, tmp_path):
    ha, hb, state = _fit_and_resume(
        gpu_client, small_data, tmp_path, "upper-bound", tau_threshold=1.0, smoothing=0.0
    )
    np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
    np.testing.assert_array_equal(ha["loss"], hb["loss"])
    assert np.isfinite(ha["loss"]).all() and float(ha["accuracy"].dropna("step")[-1]) > 0.3
    # step 0 is plain (no scores yet); from then on 2 workers score 96 and backpropagate 32
    np.testing.assert_array_equal(np.diff(ha["samples"]), [192] * 23)
    np.testing.assert_array_equal(np.diff(ha["grad_samples"]), [64] * 23)
    strategy_state = state["table"]["strategy_state"]
    assert strategy_state["importance"] == 1 and strategy_state["tau"] > 1.0


def test_upper_bound_scoring_in_bfloat16_trains_and_resumes_with_it(
    gpu_client, small_data, tmp_path
):
    ha, hb, state = _fit_and_resume(
        gpu_client, small_data, tmp_path, "upper-bound", tau_threshold=1.0, smoothing=0.0,
        score_dtype="bfloat16",
    )
    np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
    np.testing.assert_array_equal(ha["loss"], hb["loss"])
    assert np.isfinite(ha["loss"]).all() and float(ha["accuracy"].dropna("step")[-1]) > 0.3
    np.testing.assert_array_equal(np.diff(ha["samples"]), [192] * 23)
    assert state["strategy"]["params"]["score_dtype"] == "bfloat16"


def test_upper_bound_scores_in_a_lower_precision():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                          torch.nn.Linear(32, 4)), "cpu")
    x, y = torch.randn(24, 8), torch.randint(0, 4, (24,))
    extra = {"draws": np.array([8], dtype=np.int64)}
    full = get_strategy("upper-bound").compute(replica, _batch(x, y, extra)).priorities
    low = get_strategy("upper-bound", score_dtype="bfloat16").compute(
        replica, _batch(x, y, extra)).priorities
    _, logits = replica.losses(x, y, torch.bfloat16)
    np.testing.assert_allclose(low, logit_gradient_norms(logits, y).numpy(), rtol=1e-6)
    assert not np.array_equal(low, full)
    np.testing.assert_allclose(low, full, rtol=0.05, atol=0.01)


def test_infobatch_trains_end_to_end_and_resumes_exactly(gpu_client, small_data, tmp_path):
    ha, hb, state = _fit_and_resume(
        gpu_client, small_data, tmp_path, "infobatch", first=30, steps=40, prune=0.5
    )
    np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
    np.testing.assert_array_equal(ha["loss"], hb["loss"])
    assert np.isfinite(ha["loss"]).all() and float(ha["accuracy"].dropna("step")[-1]) > 0.3
    np.testing.assert_array_equal(np.diff(ha["grad_samples"]), [64] * 39)
    # 800 samples a worker, 32 a step: epoch 0 ends in step 25, epoch 1 is pruned
    s = state["table"]["strategy_state"]
    assert s["epochs"] == {0: 1, 1: 1}
    for slot in (0, 1):
        walk, weights = s["walk"][slot], s["walk_weights"][slot]
        assert 400 < walk.numel() < 800 and set(weights.tolist()) == {1.0, 2.0}
