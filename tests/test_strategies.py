"""Selection rules as pure functions of arrays, without a cluster."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _selection import _batch, make_ctx

from daskpri.models import CNN
from daskpri.replicas.replica import Replica, sample_entropies
from daskpri.strategies import STRATEGIES, SelectContext, get_strategy, register_strategy
from daskpri.strategies._selective import keep_top_fraction
from daskpri.strategies.base import concat_selections, score_dtype_of
from daskpri.strategies.loss import importance_sample, sampling_probabilities
from daskpri.table.table import PriorityTable


def test_a_local_context_needs_a_slot_for_every_partition():
    with pytest.raises(ValueError, match=r"owner should give a worker slot for each of the "
                                         r"table's 3 partitions, but got owner=\[0, 1\]"):
        SelectContext.local(PriorityTable([2, 2, 2]), 4, owner=[0, 1])


def test_registry_and_errors():
    assert {"uniform", "projection", "length", "loss", "selective-backprop"} <= set(STRATEGIES)
    with pytest.raises(ValueError, match="strategy should be one of 'uniform'.*but got 'los'"):
        get_strategy("los")
    # a class where an instance is wanted, and objects of no strategy
    with pytest.raises(TypeError, match=r"^strategy should be a Strategy object or a registered "
                       r"name, but got the class Uniform: pass Uniform\(\.\.\.\), an instance$"):
        get_strategy(type(get_strategy("uniform")))
    for wrong in (3, torch.nn.Linear(2, 2)):
        with pytest.raises(TypeError, match=r"^strategy should be a registered name \('uniform', "):
            get_strategy(wrong)
    with pytest.raises(ValueError, match=r"renew should be a number in \[0, 1\], but got renew=2"):
        get_strategy("projection", renew=2)
    with pytest.raises(ValueError, match="epsilon should be a number in"):
        get_strategy("loss", epsilon=0)
    with pytest.raises(ValueError, match="k should be a positive integer"):
        get_strategy("projection", k=0)
    with pytest.raises(
        ValueError, match="strategy 'uniform' takes the options batch_size, but got the option k$"
    ):
        get_strategy("uniform", k=3)
    with pytest.raises(TypeError, match="Strategy subclass"):
        register_strategy(object)  # type: ignore[arg-type]
    # a built-in's name is not taken over; a name of one's own may be registered again
    uniform = STRATEGIES["uniform"]
    with pytest.raises(ValueError, match="'uniform' is a built-in strategy's name"):
        register_strategy(type("Mine", (uniform,), {"name": "uniform"}))
    assert STRATEGIES["uniform"] is uniform and register_strategy(uniform) is uniform
    try:
        for _ in range(2):  # a notebook cell run twice
            mine = register_strategy(type("Mine", (uniform,), {"name": "mine-twice"}))
        assert STRATEGIES["mine-twice"] is mine
    finally:
        STRATEGIES.pop("mine-twice", None)


def test_params_are_the_init_arguments_kept_not_other_attributes():
    uniform = STRATEGIES["uniform"]

    class Counting(uniform):
        name = "counting"

        def __init__(self, k: int = 3, batch_size: int = 64) -> None:
            super().__init__(batch_size=batch_size)
            self.k = k
            self.seen = 0  # state, not a parameter: a resumed run could not pass it back

    s = Counting(k=5)
    assert s.get_params() == {"k": 5, "batch_size": 64}
    assert type(s)(**s.get_params()).get_params() == s.get_params()
    assert repr(s) == "Counting(k=5, batch_size=64)"


def test_uniform_walks_a_shuffled_epoch_per_worker():
    s = get_strategy("uniform")
    ctx = make_ctx([6, 6], [0, 1], batch_size=4)
    seen = {0: [], 1: []}
    for step in range(3):
        ctx.step = step
        for slot, sel in enumerate(s.select(ctx)):
            assert sel.weights is None and sel.train.size == 4
            seen[slot].extend(sel.train.tolist())
    # 12 draws over 6 samples each: two full epochs, each sample twice
    assert sorted(seen[0]) == sorted(list(range(6)) * 2)
    assert sorted(seen[1]) == sorted(list(range(6, 12)) * 2)


def test_projection_takes_topk_plus_round_robin_renew():
    table = PriorityTable([5, 5])
    table.update(np.arange(10), np.array([9, 1, 2, 8, 3, 0, 7, 6, 5, 4], float), step=0)
    s = get_strategy("projection", k=2, renew=0.2)  # renew 20% of 5 = 1 per worker
    ctx = make_ctx(None, [0, 1], table=table, step=1)
    sels = s.select(ctx)
    # worker 0: renew sample 0 (round robin), top-2 of the rest = 3 (8), 4 (3)
    assert sels[0].train.tolist() == [0, 3, 4]
    # worker 1: renew sample 5, top-2 of the rest = 6 (7), 7 (6)
    assert sels[1].train.tolist() == [5, 6, 7]
    sels = s.select(ctx)
    # the renew pointer moved on: 1 and 6; top-2 excluding them
    assert sels[0].train.tolist() == [0, 1, 3]
    assert sels[1].train.tolist() == [6, 7, 8]


def test_projection_can_score_renewed_samples_without_training_on_them():
    table = PriorityTable([4])
    table.update(np.arange(4), np.array([4.0, 3.0, 2.0, 1.0]), step=0)
    s = get_strategy("projection", k=1, renew=0.25, train_on_renew=False)
    [sel] = s.select(make_ctx(None, [0], table=table, step=1))
    assert sel.train.tolist() == [1] and sel.score.tolist() == [0]


def test_loss_probabilities_mix_with_uniform_and_fill_unseen():
    p = sampling_probabilities(np.array([1.0, 3.0, np.inf, 0.0]), epsilon=0.2)
    assert p.sum() == pytest.approx(1.0)
    # unseen gets the max seen loss (3)
    np.testing.assert_allclose(p, 0.8 * np.array([1, 3, 3, 0]) / 7 + 0.05)
    with pytest.raises(ValueError, match="non-negative"):
        sampling_probabilities(np.array([-1.0, 1.0]), 0.1)


def test_loss_strategy_gradient_estimate_is_unbiased():
    """Monte-Carlo: the weighted mean of g_i matches the full mean; unweighted does not."""
    rng = np.random.default_rng(0)
    n = 200
    losses = rng.gamma(0.5, 2.0, size=n)
    g = np.column_stack([losses, losses**2 / 4, rng.normal(size=n)])  # correlated with loss
    full = g.mean(0)
    table = PriorityTable([100, 100])
    table.update(np.arange(n), losses, step=0)
    strategy = get_strategy("loss", epsilon=0.3, batch_size=16)
    ctx = make_ctx(None, [0, 1], table=table, step=1, seed=1)
    weighted, unweighted = [], []
    for _ in range(3000):
        sels = strategy.select(ctx)
        idx = np.concatenate([s.train for s in sels])
        w = np.concatenate([s.weights for s in sels])
        assert idx.size == 32 and (ctx.owner_of(sels[1].train) == 1).all()
        weighted.append((w[:, None] * g[idx]).sum(0) / idx.size)
        unweighted.append(g[idx].mean(0))
    weighted, unweighted = np.array(weighted), np.array(unweighted)
    se = weighted.std(0) / np.sqrt(len(weighted))
    assert (np.abs(weighted.mean(0) - full) < 4 * se).all()
    assert (np.abs(unweighted.mean(0) - full) > 4 * se).any()


def test_importance_sample_weights():
    p = np.array([0.5, 0.25, 0.25])
    pos, w = importance_sample(p, 1000, np.random.default_rng(0))
    np.testing.assert_allclose(w, 1 / (3 * p[pos]))


@pytest.mark.parametrize("seed", range(6))
def test_a_marked_walk_draws_the_last_two_rounds_last_in_its_next_pass(seed):
    # one slot of 30 samples, rounds drawing 2 to 15 samples (at most half a
    # pass) in draws of 1 to 5: every pass draws each sample once, and no
    # round draws one that the round before drew, across passes too
    from daskpri.strategies.base import mark_round, walk_next

    rng = np.random.default_rng(seed)
    ctx = make_ctx([30], [0], seed=seed)
    drawn, rounds = [], []
    for _ in range(40):
        mark_round(ctx)
        this, want = [], int(rng.integers(2, 16))
        while want:
            got = walk_next(ctx, 0, min(want, int(rng.integers(1, 6)))).tolist()
            this += got
            want -= len(got)
        rounds.append(this)
        drawn += this
    for p in range(len(drawn) // 30):
        assert sorted(drawn[30 * p : 30 * (p + 1)]) == list(range(30))
    assert all(not set(a) & set(b) for a, b in zip(rounds, rounds[1:], strict=False))
    # unmarked, the passes are plain shuffles: the next pass draws the round before's
    ctx, plain = make_ctx([30], [0], seed=seed), []
    for _ in range(40):
        plain.append(walk_next(ctx, 0, 10).tolist() + walk_next(ctx, 0, 5).tolist())
    assert any(set(a) & set(b) for a, b in zip(plain, plain[1:], strict=False))


def test_projection_and_length_priorities_on_a_known_model():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 0, 1, 1, 0])
    grads, _, _ = replica.per_sample_grads(x, y)
    mean_grad = torch.randn(grads.shape[1])
    c = get_strategy("projection").compute(replica, _batch(x, y, 4, mean_grad=mean_grad))
    np.testing.assert_allclose(c.priorities, (grads @ mean_grad).numpy(), rtol=1e-5)
    torch.testing.assert_close(c.grad, grads[:4].sum(0))
    assert c.n_grad == 4
    c = get_strategy("length").compute(replica, _batch(x, y, 6))
    np.testing.assert_allclose(c.priorities, (grads**2).sum(1).numpy(), rtol=1e-5)


def test_selective_backprop_compute_backpropagates_the_top_losses():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    losses, _ = replica.losses(x, y)
    c = get_strategy("selective-backprop", fraction=0.25).compute(replica, _batch(x, y, 8))
    top = torch.argsort(losses, descending=True)[:2]
    grads, _, _ = replica.per_sample_grads(x, y)
    torch.testing.assert_close(c.grad, grads[top].sum(0), rtol=1e-5, atol=1e-6)
    assert c.n_grad == 2
    np.testing.assert_allclose(c.priorities, losses.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_selective_backprop_scores_in_a_lower_precision_and_trains_in_float32(dtype):
    torch.manual_seed(0)
    replica = Replica(CNN((40,), 10, seed=0), "cpu")
    x, y = torch.randn(64, 40), torch.randint(0, 10, (64,))
    full, _ = replica.losses(x, y)
    low, logits = replica.losses(x, y, score_dtype_of(dtype))
    assert logits.dtype == torch.float32
    assert not torch.equal(low, full)  # the layers ran in the lower precision
    torch.testing.assert_close(low, full, rtol=0.05, atol=0.02)
    strategy = get_strategy("selective-backprop", fraction=0.25, score_dtype=dtype)
    c = strategy.compute(replica, _batch(x, y, 64))
    np.testing.assert_allclose(c.priorities, low.numpy(), rtol=1e-6)
    # the 16 highest of the lower-precision losses, trained on in float32
    rows = torch.as_tensor(keep_top_fraction(low.numpy().astype(np.float64), 0.25))
    grad, _ = replica.grad_and_logits(x[rows], y[rows])
    assert c.n_grad == 16 and c.grad.dtype == torch.float32
    torch.testing.assert_close(c.grad, grad)


def test_selective_backprop_entropy_score_ranks_and_keeps_the_predictions_entropies():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 5), "cpu")
    x, y = torch.randn(12, 3) * 3, torch.randint(0, 5, (12,))
    losses, logits = replica.losses(x, y)
    entropies = sample_entropies(logits)
    by_entropy = torch.topk(entropies, 3).indices
    # the case tells the two apart: the highest entropies are not the highest losses
    assert set(by_entropy.tolist()) != set(torch.topk(losses, 3).indices.tolist())
    grads, _, _ = replica.per_sample_grads(x, y)
    s = get_strategy("selective-backprop", fraction=0.25, warmup=0, score="entropy")
    c = s.compute(replica, _batch(x, y, 12))  # a fresh step: 3 of 12 trained
    assert c.n_grad == 3
    torch.testing.assert_close(c.grad, grads[by_entropy].sum(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.priorities, entropies)
    torch.testing.assert_close(c.loss_sum, losses.double().sum())  # the loss, still reported
    # a stale (or warmup) step, trained whole: the table gets entropies from it too,
    # for the rows it trains and those it only scores
    batch = _batch(x, y, 8)
    batch.extra = {"stale": np.ones(0, dtype=bool)}
    c = s.compute(replica, batch)
    torch.testing.assert_close(c.priorities, entropies, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.loss_sum, losses[:8].sum(), rtol=1e-5, atol=1e-6)
    assert c.n_grad == 8
    # with the rule of Jiang et al., the CDF is the table's entropies'
    s = get_strategy("selective-backprop", beta=1, warmup=0, score="entropy")
    batch = _batch(x, y, 12)
    batch.extra = {"reference": np.full(4, np.inf), "batch_size": np.asarray(12)}
    assert s.compute(replica, batch).n_grad == 0  # no entropy reaches an infinite one
    batch.extra = {"reference": np.zeros(4), "batch_size": np.asarray(2)}
    c = s.compute(replica, batch)
    torch.testing.assert_close(c.grad, grads[torch.topk(entropies, 2).indices].sum(0),
                               rtol=1e-5, atol=1e-6)


def test_selective_backprop_score_is_checked_and_kept_in_the_params():
    with pytest.raises(ValueError, match="score should be one of 'loss', 'entropy', but got "
                                         "score='margin'"):
        get_strategy("selective-backprop", score="margin")
    assert get_strategy("selective-backprop").score == "loss"
    assert get_strategy("selective-backprop", score="entropy").get_params()["score"] == "entropy"


def test_score_dtype_is_checked_and_kept_in_the_params():
    for name in ("selective-backprop", "upper-bound"):
        with pytest.raises(ValueError, match="score_dtype should be one of 'float32', "
                           "'bfloat16', 'float16', but got score_dtype='float64'"):
            get_strategy(name, score_dtype="float64")
        with pytest.raises(ValueError, match="but got score_dtype=torch.bfloat16"):
            get_strategy(name, score_dtype=torch.bfloat16)
        assert get_strategy(name, score_dtype="bfloat16").get_params()["score_dtype"] == "bfloat16"
        assert get_strategy(name).score_dtype == "float32"


def test_gradients_per_step_counts_what_each_strategy_backpropagates():
    assert get_strategy("projection", renew=0.01).gradients_per_step(64, 8000) == 144
    assert get_strategy("projection", k=10, train_on_renew=False).gradients_per_step(64, 8000) == 10
    assert get_strategy("uniform").gradients_per_step(64, 8000) == 64
    assert get_strategy("loss", batch_size=16).gradients_per_step(64, 8000) == 16
    assert get_strategy("selective-backprop").gradients_per_step(32, 100) == 32


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_strategy_is_rebuilt_from_its_params(name):
    # a checkpoint keeps get_params() and resume builds the strategy from it
    options = {"selective-backprop": {"refresh": 2, "beta": 1.0, "warmup": 1}}.get(name, {})
    s = get_strategy(name, **options)
    rebuilt = type(s)(**s.get_params())
    assert rebuilt.get_params() == s.get_params() and repr(rebuilt) == repr(s)
    assert rebuilt.reads_table == s.reads_table


def _table_run(sizes, owner, batch_size, seed):
    from daskpri.table.plugin import TableRun

    tr = TableRun(table=PriorityTable(sizes), strategy=get_strategy("uniform"),
                  rng=np.random.default_rng(seed), owner=np.zeros(0, dtype=np.int64),
                  batch_size=batch_size, info={})
    tr.set_owner(np.asarray(owner))
    return tr


@pytest.mark.parametrize(
    ("sizes", "owner", "batch_size"),
    [([7, 9, 20, 4], [0, 1, 0, 1], 5),  # slots of 27 and 13 samples
     ([8, 8], [0, 1], 8),  # a batch is a whole pass
     ([30, 3, 11], [0, 1, 2], 3),
     ([16, 16, 16], [0, 0, 1], 4)],
)
def test_a_uniform_round_selected_at_once_is_the_round_selected_step_by_step(
    sizes, owner, batch_size
):
    for seed in range(4):
        counts = np.random.default_rng(seed).integers(1, 40, size=12)
        by_step, at_once = (_table_run(sizes, owner, batch_size, seed) for _ in range(2))
        step, taken = 0, 0
        for count in counts.tolist():
            expected = [by_step.select(step + i) for i in range(count)]
            ctx = at_once._context(step, None)
            direct = at_once.strategy.select_round(ctx, count)
            taken += direct is not None
            got = direct if direct is not None else at_once.select_round(step, count)
            assert [[s.train.tolist() for s in sel] for sel in got] == [
                [s.train.tolist() for s in sel] for sel in expected
            ]
            assert all(s.weights is None and s.score.size == 0 for sel in got for s in sel)
            if direct is not None:  # the table packs the round's rows without the Selections
                assert direct.n_slots == len(expected[0])
                for slot in range(direct.n_slots):
                    want = concat_selections([sel[slot] for sel in expected])
                    arrays = direct.slot_arrays(slot)
                    assert arrays.keys() == want.keys() and arrays["extra"] == want["extra"] == []
                    for key in want.keys() - {"extra"}:
                        assert arrays[key].dtype == want[key].dtype
                        np.testing.assert_array_equal(arrays[key], want[key])
            step += count
            assert at_once.rng.bit_generator.state == by_step.rng.bit_generator.state
            for key in ("pos", "epochs"):
                assert at_once.state.get(key) == by_step.state.get(key)
            assert at_once.state["perm"].keys() == by_step.state["perm"].keys()
            for slot, perm in by_step.state["perm"].items():
                np.testing.assert_array_equal(at_once.state["perm"][slot], perm)
        assert taken >= len(counts) - 1  # all rounds but the first (no walk under way yet)


def test_a_round_of_slots_smaller_than_a_batch_is_selected_step_by_step():
    tr = _table_run([3, 10], [0, 1], 4, 0)
    tr.select(0)  # the walks are under way
    assert tr.strategy.select_round(tr._context(1, None), 5) is None
    assert len(tr.select_round(1, 5)) == 5
