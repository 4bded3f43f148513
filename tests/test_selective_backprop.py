"""Selective backprop's selection, as pure functions of arrays, without a cluster.

Its top-fraction and CDF (beta) rules, stale steps and the staleness model,
warm-up, refresh, anneal and prefilter; its compute and scores are in
test_strategies.py with the other strategies'.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _selection import _batch, make_ctx

from daskpri.replicas.replica import Replica
from daskpri.strategies import get_strategy
from daskpri.strategies._selective import keep_by_cdf, keep_top_fraction, top_rows
from daskpri.strategies.base import walk_epoch
from daskpri.table.table import PriorityTable


def test_selective_backprop_keeps_the_high_loss_fraction():
    assert keep_top_fraction(np.array([0.1, 0.9, 0.5, 0.2]), 0.5).tolist() == [1, 2]
    assert keep_top_fraction(np.array([0.3, 0.1, 0.2]), 0.01).tolist() == [0]
    reference = np.sort(np.arange(1.0, 101.0))
    kept = keep_by_cdf(np.array([0.5, 1000.0]), reference, 2.0, np.random.default_rng(0))
    assert kept.tolist() == [1]  # CDF 0 is never kept, CDF 1 always
    s = get_strategy("selective-backprop", fraction=0.25, warmup=0)
    sels = s.select(make_ctx([40, 40], [0, 1], batch_size=4))
    assert [sel.train.size for sel in sels] == [16, 16]


@pytest.mark.parametrize("beta", [0.5, 1.0, 5.0])
def test_the_cdf_rule_keeps_the_rows_a_search_of_the_reference_would(beta):
    # keep_by_cdf reads the reference at floor(u^(1/beta) * n) instead of
    # searching it; the same draws must keep the same rows, ties with the
    # reference's losses, repeated losses and unseen (inf) samples included
    for seed in range(200):
        rng = np.random.default_rng(seed)
        reference = np.sort(rng.choice(rng.exponential(1.0, 300), rng.integers(1, 1500)))
        losses = rng.exponential(1.0, rng.integers(0, 600))
        losses[: losses.size // 3] = rng.choice(reference, losses.size // 3)
        losses[rng.random(losses.size) < 0.05] = np.inf
        u = np.random.default_rng([seed, 1]).random(losses.size)
        searched = np.searchsorted(reference, losses, side="right") / reference.size
        want = np.flatnonzero(u < searched**beta)
        got = keep_by_cdf(losses, reference, beta, np.random.default_rng([seed, 1]))
        np.testing.assert_array_equal(got, want)
    # an empty reference keeps all
    assert keep_by_cdf(np.ones(3), np.empty(0), beta, np.random.default_rng(0)).tolist() == [
        0, 1, 2]


def test_the_cdf_reference_is_drawn_once_for_each_state_of_the_table():
    table = PriorityTable([1000, 1000])
    table.update(np.arange(2000), np.random.default_rng(0).exponential(1.0, 2000), step=0)
    ctx = make_ctx([1000, 1000], [0, 1], table=table, batch_size=8)
    s = get_strategy("selective-backprop", beta=1.0, warmup=0)
    first = s.select(ctx)[0].extra["reference"]
    ctx.step = 1  # the next step of a round: the table has not changed
    assert s.select(ctx)[0].extra["reference"] is first
    table.update(np.arange(10), np.full(10, 9.0), step=1)  # a round's priorities arrive
    ctx.step = 2
    second = s.select(ctx)[0].extra["reference"]
    assert second is not first and second.size == 1024 and np.all(np.diff(second) >= 0)
    # where losses are extrapolated to each step, each step draws its own
    moving = PriorityTable([500, 500], staleness="exp-linear")
    moving.update(np.arange(1000), np.ones(1000), step=0)
    ctx = make_ctx([500, 500], [0, 1], table=moving, batch_size=8)
    a = s.select(ctx)[0].extra["reference"]
    ctx.step = 1
    assert s.select(ctx)[0].extra["reference"] is not a


def test_a_stale_step_reads_only_the_candidates_it_consumes():
    # one worker of 400 samples, the table's losses all above the reference's:
    # every candidate is kept, so a stale step of 8 consumes the walk's next 8
    # of the 24 it draws (half again the 16 it expects to need at beta=1); a
    # priority in flight among those it returns to the walk is not read, one
    # among the 8 is
    from daskpri.strategies.base import NotAhead

    def stale_ctx():
        table = PriorityTable([400])
        table.update(np.arange(400), np.full(400, 5.0), step=0)
        ctx = make_ctx([400], [0], table=table, batch_size=8)
        s = get_strategy("selective-backprop", beta=1.0, refresh=2, warmup=1)
        while walk_epoch(ctx, 0) == 0:  # the warmup epoch, then the first stale one
            s.select(ctx)
            ctx.step += 1
        return s, ctx

    s, ctx = stale_ctx()
    pos, perm = ctx.state["pos"][0], ctx.state["perm"][0]
    reference = np.linspace(0.0, 1.0, 64)
    ctx.inflight = np.zeros(400, dtype=bool)
    ctx.inflight[perm[pos + 9]] = True  # drawn, then returned to the walk
    kept = s._draw_stale(ctx, 0, 8, reference)
    assert kept.tolist() == sorted(perm[pos:pos + 8].tolist()) and ctx.state["pos"][0] == pos + 8
    s, ctx = stale_ctx()
    pos, perm = ctx.state["pos"][0], ctx.state["perm"][0]
    ctx.inflight = np.zeros(400, dtype=bool)
    ctx.inflight[perm[pos + 7]] = True  # consumed: the step must wait for it
    with pytest.raises(NotAhead):
        s._draw_stale(ctx, 0, 8, reference)


def test_selective_backprop_without_waiting_reads_the_table_as_it_holds_it():
    # one worker of 400 samples, all of them in flight: waiting for them, the
    # first step that reads a priority declines (the stale epoch after the warmup
    # and the fresh one; the prefiltered fresh steps at once); without waiting,
    # each step selects what it selects with nothing in flight
    from daskpri.strategies.base import NotAhead

    table = PriorityTable([400])
    table.update(np.arange(400), np.random.default_rng(1).random(400) * 3.0, step=0)
    everything = np.ones(400, dtype=bool)

    def run(options, inflight):
        ctx = make_ctx([400], [0], table=table, batch_size=8)
        s = get_strategy("selective-backprop", beta=1.0, **options)
        picks = []
        for _ in range(120):  # warmup 50 steps, fresh 25 (16 candidates), then stale
            ctx.inflight = inflight
            picks.append(s.select(ctx)[0].train.tolist())
            ctx.step += 1
        return picks

    for options in ({"refresh": 2, "warmup": 1}, {"prefilter": 0.5, "warmup": 0}):
        alone = run(options, None)
        assert run({**options, "wait_for_inflight": False}, everything) == alone
        with pytest.raises(NotAhead):
            run(options, everything)
    assert len({tuple(p) for p in alone}) > 100  # the steps do differ
    assert get_strategy("selective-backprop", wait_for_inflight=False).get_params()[
        "wait_for_inflight"] is False
    with pytest.raises(ValueError, match=r"wait_for_inflight should be True or False, but got "
                       r"wait_for_inflight='no'"):
        get_strategy("selective-backprop", wait_for_inflight="no")


def test_the_workers_top_rows_are_the_drivers_top_fraction():
    # the worker chooses in torch (top_rows), the driver's stale steps in numpy
    rng = np.random.default_rng(0)
    for n, fraction in [(256, 0.25), (128, 0.5), (7, 0.3), (5, 0.01), (1, 1.0)]:
        losses = rng.random(n).astype(np.float32)
        got = top_rows(torch.as_tensor(losses), fraction)
        assert got.tolist() == keep_top_fraction(losses.astype(np.float64), fraction).tolist()


def test_selective_backprop_breaks_ties_at_the_cut_at_random_not_by_position():
    # every candidate of a stale step ties (all unseen): which half is kept is
    # drawn, where it was always the lowest sample indices
    kept = set()
    for seed in range(8):
        ctx = make_ctx([8], [0], batch_size=4, seed=seed)
        s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0)
        s.select(ctx)  # epoch 0: afresh
        ctx.step = 1
        stale = s.select(ctx)[0]
        assert stale.train.size == 4 and "stale" in stale.extra
        kept.add(tuple(stale.train.tolist()))
    assert len(kept) > 4


def test_selective_backprop_refresh_ranks_stale_epochs_by_the_table():
    # one worker of 8 samples; candidates of 8 per step (batch 4, fraction 0.5)
    table = PriorityTable([8])
    table.update(np.arange(8), np.array([0.1, 0.9, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4]), step=0)
    ctx = make_ctx([8], [0], batch_size=4, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0)
    fresh = s.select(ctx)[0]  # epoch 0 scores all 8 candidates on the worker
    assert fresh.train.tolist() == list(range(8)) and "stale" not in fresh.extra
    ctx.step = 1
    stale = s.select(ctx)[0]  # epoch 1 ranks them by the table: the 4 highest
    assert stale.train.tolist() == [1, 2, 4, 6] and "stale" in stale.extra
    ctx.step = 2
    assert "stale" not in s.select(ctx)[0].extra  # epoch 2: afresh again
    # unseen samples rank first
    table.forget(np.array([0, 3]))
    ctx.step = 3
    assert s.select(ctx)[0].train.tolist() == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="refresh should be a positive integer, but got refresh=0"):
        get_strategy("selective-backprop", refresh=0)
    # a slot whose samples change (a worker lost) starts a new pass: epoch 4, fresh
    ctx.groups = [np.arange(6)]
    assert walk_epoch(ctx, 0) == 4 and "stale" not in s.select(ctx)[0].extra
    assert ctx.state["epochs"][0] == 4


def test_selective_backprop_warmup_trains_plain_batches_then_selects():
    # one worker of 8 samples, batch 2, fraction 0.5: the warmup epoch trains
    # 2 samples a step, each once, unscored; then epoch 1 scores 4 candidates
    # a step afresh and epoch 2 ranks by the table (refresh=2)
    table = PriorityTable([8])
    ctx = make_ctx([8], [0], batch_size=2, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=1)
    warm = []
    while walk_epoch(ctx, 0) == 0:
        [sel] = s.select(ctx)
        assert "stale" in sel.extra and sel.train.size == 2  # a plain step
        warm.append(sel.train)
        table.update(sel.train, np.array([0.1, 0.9]) + ctx.step, step=ctx.step)
        ctx.step += 1
    assert sorted(np.concatenate(warm).tolist()) == list(range(8)) and len(warm) == 4
    while walk_epoch(ctx, 0) == 1:
        [sel] = s.select(ctx)
        assert "stale" not in sel.extra and sel.train.size == 4  # scored afresh
    [sel] = s.select(ctx)  # epoch 2: the 2 of its 4 candidates the table ranks highest
    cand = ctx.state["perm"][0][:4]  # slot 0 holds samples 0..7: positions are samples
    top = cand[np.argsort(-table.estimate(ctx.step, cand))[:2]]
    assert "stale" in sel.extra and sel.train.tolist() == sorted(top.tolist())
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(ValueError, match=r"warmup should be a finite number >= 0, but got "
                           rf"warmup={re.escape(repr(bad))}"):
            get_strategy("selective-backprop", warmup=bad)
    assert get_strategy("selective-backprop", warmup=2).reads_table is False
    assert repr(get_strategy("selective-backprop", warmup=1.0)).count("warmup=1,") == 1


def test_selective_backprop_warmup_of_part_of_an_epoch_selects_from_where_it_ends():
    # one worker of 8 samples, batch 2, fraction 0.5, warmup=0.5: the first
    # half of epoch 0 is plain steps; the rest of the epoch scores 4
    # candidates a step afresh (epoch 0 is the first selective one); with
    # refresh=2, epoch 1 ranks by the table and epoch 2 scores afresh again
    table = PriorityTable([8])
    ctx = make_ctx([8], [0], batch_size=2, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0.5)
    kinds = []
    while walk_epoch(ctx, 0) < 3:
        epoch, warm = walk_epoch(ctx, 0), s.warming(ctx, 0)
        [sel] = s.select(ctx)
        kinds.append((epoch, "plain" if warm else "stale" if "stale" in sel.extra else "fresh",
                      sel.train.size))
        table.update(sel.train, np.linspace(0.1, 0.9, sel.train.size), step=ctx.step)
        ctx.step += 1
    # stale steps rank 4 candidates of the walk and keep 2; fresh ones send all 4
    assert kinds == [(0, "plain", 2), (0, "plain", 2), (0, "fresh", 4),
                     (1, "stale", 2), (1, "stale", 2), (2, "fresh", 4), (2, "fresh", 4)]
    # a whole number of epochs is the epoch count it was
    assert get_strategy("selective-backprop", warmup=1.0).warmup == 1


def test_selective_backprop_defaults_warm_up_one_epoch_then_keep_a_quarter():
    # with no options (fraction=0.25, warmup=1), one worker of 16 samples, batch
    # 2: epoch 0 is 8 plain steps of 2 samples, each sample trained once and
    # none scored; the first step after it forwards 2 / 0.25 = 8 candidates
    # afresh and backpropagates the 2 of the highest loss
    s = get_strategy("selective-backprop")
    assert (s.fraction, s.warmup, s.refresh) == (0.25, 1, None)
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    x, y = torch.randn(16, 3), torch.randint(0, 2, (16,))
    table = PriorityTable([16])
    ctx = make_ctx([16], [0], batch_size=2, table=table)
    warm = []
    while walk_epoch(ctx, 0) == 0:
        assert s.warming(ctx, 0)
        [sel] = s.select(ctx)
        assert "stale" in sel.extra and sel.train.size == 2 and sel.score.size == 0
        batch = _batch(x[sel.train], y[sel.train], 2)
        batch.extra = sel.extra
        c = s.compute(replica, batch)
        assert c.n_grad == 2 and c.n_loss == 2 and len(c.priorities) == 2  # no scoring pass
        warm.append(sel.train)
        table.update(sel.train, np.asarray(c.priorities, dtype=np.float64), step=ctx.step)
        ctx.step += 1
    assert len(warm) == 8 and sorted(np.concatenate(warm).tolist()) == list(range(16))
    assert not s.warming(ctx, 0)
    [sel] = s.select(ctx)  # epoch 1: the first selective step, scored afresh
    assert "stale" not in sel.extra and sel.train.size == 8 == 4 * ctx.batch_size
    batch = _batch(x[sel.train], y[sel.train], 8)
    batch.extra = sel.extra
    c = s.compute(replica, batch)
    losses, _ = replica.losses(x[sel.train], y[sel.train])
    top = torch.topk(losses, 2).indices
    grads, _, _ = replica.per_sample_grads(x[sel.train], y[sel.train])
    assert c.n_grad == 2 and c.n_loss == 8
    torch.testing.assert_close(c.grad, grads[top].sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c.priorities, losses.numpy(), rtol=1e-6)  # all 8 scored


def test_selective_backprop_anneal_step_trains_plain_batches_from_that_step_on():
    # one worker of 8 samples, batch 2, fraction 0.5, refresh=2: steps 0-1
    # score 4 candidates afresh (epoch 0), 2-3 rank by the table (epoch 1);
    # from step 4 on (anneal_step) every step is 2 samples of the walk in
    # order, unranked, and each sample is trained once an epoch again
    table = PriorityTable([8])
    ctx = make_ctx([8], [0], batch_size=2, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0, anneal_step=4)
    kinds, plain = [], []
    for step in range(12):
        ctx.step = step
        epoch = walk_epoch(ctx, 0)
        [sel] = s.select(ctx)
        kinds.append("fresh" if "stale" not in sel.extra else "ranked" if step < 4 else "plain")
        table.update(sel.train, np.linspace(0.9, 0.1, sel.train.size), step=step)
        if step >= 4:
            # the walk's next 2, whatever the table says of them
            pos = ctx.state["pos"][0]
            assert sel.train.tolist() == sorted(ctx.state["perm"][0][pos - 2 : pos].tolist())
            plain.append((epoch, sel.train))
    assert kinds == ["fresh", "fresh", "ranked", "ranked"] + ["plain"] * 8
    # epochs 2 and 3 (steps 4-11) each train all 8 samples once
    for e in (2, 3):
        trained = np.concatenate([t for epoch, t in plain if epoch == e])
        assert sorted(trained.tolist()) == list(range(8))
    # with the probabilistic rule too: an annealed step reads no CDF of the table
    ctx = make_ctx([8], [0], batch_size=2)
    [sel] = get_strategy("selective-backprop", beta=1.0, anneal_step=0).select(ctx)
    assert sel.train.size == 2 and set(sel.extra) == {"stale"}
    assert "reference" not in ctx.state  # the CDF's sample of the table was not drawn
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ValueError, match=r"anneal_step should be a non-negative integer, "
                           rf"but got anneal_step={re.escape(repr(bad))}"):
            get_strategy("selective-backprop", anneal_step=bad)


@pytest.mark.parametrize("staleness", ["keep", "exp-linear"])
def test_selective_backprop_stale_epochs_rank_by_the_tables_staleness_model(staleness):
    # samples 0-3 scored 2.0 at step 0 and 1.0 at step 1 (falling); 4-7 scored
    # 0.9 at step 1 only. Kept as recorded, the falling ones rank first; under
    # exp-linear, by step 2 they are estimated at 0.5, below 0.9.
    table = PriorityTable([8], staleness=staleness)
    table.update(np.arange(4), np.full(4, 2.0), step=0)
    table.update(np.arange(8), np.array([1.0] * 4 + [0.9] * 4), step=1)
    ctx = make_ctx([8], [0], batch_size=4, table=table, step=2)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0)
    ctx.state = {"perm": {0: np.arange(8)}, "pos": {0: 8}, "epochs": {0: 0}}  # epoch 1 next
    stale = s.select(ctx)[0]
    assert "stale" in stale.extra
    assert stale.train.tolist() == ([0, 1, 2, 3] if staleness == "keep" else [4, 5, 6, 7])


def test_selective_backprop_beta_fills_each_stale_step_to_the_batch_size():
    # one worker of 600 samples, batch 16, beta=2: a stale step draws candidates
    # until 16 are kept, though the walk's next candidates rank high against the
    # table's losses (those trained this epoch had theirs lowered)
    rng = np.random.default_rng(0)
    table = PriorityTable([600])
    table.update(np.arange(600), rng.uniform(1.0, 2.0, 600), step=0)
    ctx = make_ctx([600], [0], batch_size=16, table=table)
    s = get_strategy("selective-backprop", beta=2, refresh=2, warmup=0)
    while walk_epoch(ctx, 0) == 0:  # the fresh epoch: 48 candidates a step
        assert s.select(ctx)[0].train.size == 48
    sizes, trained = [], []
    while walk_epoch(ctx, 0) == 1:
        [sel] = s.select(ctx)
        assert "stale" in sel.extra and np.unique(sel.train).size == sel.train.size
        table.update(sel.train, np.full(sel.train.size, 0.1), step=ctx.step)  # trained
        sizes.append(sel.train.size)
        trained.append(sel.train)
        ctx.step += 1
    assert sizes == [16] * len(sizes)
    # none twice in the epoch (the last step may reach into the next one), and
    # none dropped: the candidates after a full batch's last kept one stay in
    # the walk, so more than a third of the epoch is trained
    within = np.concatenate(trained[:-1])
    assert np.unique(within).size == within.size
    assert 200 <= within.size + 16 <= 320


def test_selective_backprop_stale_beta_is_more_selective_in_stale_steps_only():
    # one worker of 600 samples, batch 16, beta=1, refresh=2, the table's
    # losses uniform in [1, 2]: the fresh epoch forwards beta's 32 candidates
    # a step either way; the stale epoch keeps about 1/(beta+1) of the walk,
    # so with stale_beta=3 it keeps about half as many, of higher losses
    def stale_epoch(**options):
        rng = np.random.default_rng(0)
        table = PriorityTable([600])
        table.update(np.arange(600), rng.uniform(1.0, 2.0, 600), step=0)
        ctx = make_ctx([600], [0], batch_size=16, table=table)
        s = get_strategy("selective-backprop", beta=1, refresh=2, warmup=0, **options)
        while walk_epoch(ctx, 0) == 0:
            assert s.select(ctx)[0].train.size == 32
        losses = table.estimate(ctx.step, np.arange(600))
        kept = []
        while walk_epoch(ctx, 0) == 1:
            [sel] = s.select(ctx)
            assert "stale" in sel.extra and sel.train.size == 16
            kept.append(sel.train)
            ctx.step += 1
        within = np.concatenate(kept[:-1])  # the last step may reach into the next epoch
        return within.size, float(losses[within].mean())

    n_beta, mean_beta = stale_epoch()
    n_stale, mean_stale = stale_epoch(stale_beta=3)
    assert 240 <= n_beta <= 330 and 110 <= n_stale <= 190
    assert mean_stale > mean_beta + 0.05
    assert stale_epoch(stale_beta=1) == (n_beta, mean_beta)  # None takes beta


def test_selective_backprop_stale_beta_needs_beta_and_stale_steps():
    with pytest.raises(ValueError, match="stale_beta sets the probabilistic rule's selectivity "
                       "in stale steps, so it needs beta and a refresh of 2 or more, but got "
                       "beta=None, refresh=2"):
        get_strategy("selective-backprop", refresh=2, stale_beta=3)
    with pytest.raises(ValueError, match="but got beta=1, refresh=None"):
        get_strategy("selective-backprop", beta=1, stale_beta=3)
    with pytest.raises(ValueError, match="stale_beta should be"):
        get_strategy("selective-backprop", beta=1, refresh=2, stale_beta=0)
    s = get_strategy("selective-backprop", beta=1, refresh=2, stale_beta=3)
    assert s.get_params()["stale_beta"] == 3


def test_selective_backprop_cdf_recent_takes_the_losses_computed_last():
    # 2,000 losses of 2.0 from step 0, then 1,000 of 1.0 from step 9: Jiang et
    # al.'s rolling history holds the 1,000 recent ones (and 24 of the older)
    table = PriorityTable([3000])
    table.update(np.arange(2000), np.full(2000, 2.0), step=0)
    table.update(np.arange(2000, 3000), np.full(1000, 1.0), step=9)

    def reference(**options):
        ctx = make_ctx([3000], [0], batch_size=8, step=10, table=table)
        s = get_strategy("selective-backprop", beta=1.0, warmup=0, **options)
        return s.select(ctx)[0].extra["reference"]

    recent = reference(cdf="recent")
    assert recent.size == 1024 and (recent == 1.0).sum() == 1000
    sampled = reference()  # the default: a draw over every sample, one a sample
    assert sampled.size == 1024 and 250 < (sampled == 1.0).sum() < 440
    strategy = get_strategy("selective-backprop", beta=1.0, cdf="recent")
    assert strategy.get_params()["cdf"] == "recent"


def test_selective_backprop_cdf_needs_beta_and_names_its_choices():
    with pytest.raises(ValueError, match="cdf should be one of 'table', 'recent', but got "
                                         "cdf='last'"):
        get_strategy("selective-backprop", beta=1.0, cdf="last")
    with pytest.raises(ValueError, match="cdf chooses what the probabilistic rule's CDF is over, "
                                         "so it needs beta, but got cdf='recent', beta=None"):
        get_strategy("selective-backprop", cdf="recent")


def test_selective_backprop_prefilter_scores_the_tables_top_share_of_a_larger_draw():
    # one worker of 16 samples; batch 4, fraction 0.5: 8 candidates scored a step,
    # drawn as the top half (prefilter 0.5) of 16 by the table's losses
    table = PriorityTable([16])
    losses = np.array([0.1, 0.9, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4] * 2) + np.repeat([0, 0.01], 8)
    table.update(np.arange(16), losses, step=0)
    table.forget(np.array([0]))  # unseen: ranks first
    ctx = make_ctx([16], [0], batch_size=4, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, warmup=0, prefilter=0.5)
    first = s.select(ctx)[0]
    assert first.train.tolist() == [0, 1, 4, 6, 9, 10, 12, 14]  # scored afresh on the worker
    assert "stale" not in first.extra
    assert walk_epoch(ctx, 0) == 1  # the 16 drawn are spent: the next step is a new epoch
    # without it, the step scores the walk's next 8 candidates whatever the table says
    ctx = make_ctx([16], [0], batch_size=4, table=table)
    assert get_strategy("selective-backprop", fraction=0.5, warmup=0).select(ctx)[0].train.size == 8
    assert walk_epoch(ctx, 0) == 0
    # stale steps (refresh) are not prefiltered: they rank by the table already
    ctx = make_ctx([16], [0], batch_size=4, table=table)
    s = get_strategy("selective-backprop", fraction=0.5, refresh=2, warmup=0, prefilter=0.5)
    s.select(ctx)
    ctx.step = 1
    stale = s.select(ctx)[0]
    assert "stale" in stale.extra and stale.train.size == 4
    with pytest.raises(ValueError, match=r"prefilter should be a number in \(0, 1\], but got "
                       r"prefilter=0"):
        get_strategy("selective-backprop", prefilter=0)
    assert get_strategy("selective-backprop", prefilter=0.75).get_params()["prefilter"] == 0.75
    # it reads the table, so a round selected ahead is checked against the one in flight
    assert get_strategy("selective-backprop", prefilter=0.75).reads_table
    assert not get_strategy("selective-backprop").reads_table


def test_selective_backprop_stale_step_backpropagates_every_row():
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    x, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    batch = _batch(x, y, 4)
    batch.extra = {"stale": np.ones(0, dtype=bool)}
    c = get_strategy("selective-backprop", refresh=3).compute(replica, batch)
    grads, _, _ = replica.per_sample_grads(x, y)
    torch.testing.assert_close(c.grad, grads.sum(0), rtol=1e-5, atol=1e-6)
    assert c.n_grad == 4 and len(c.priorities) == 4


def test_selective_backprop_fresh_step_with_beta_keeps_at_most_the_batch():
    # a reference below every loss: the CDF rule keeps all 8 candidates, and the
    # driver's batch of 3 caps the step at the 3 highest losses
    torch.manual_seed(0)
    replica = Replica(torch.nn.Linear(3, 2), "cpu")
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    losses = torch.nn.functional.cross_entropy(replica.module(x), y, reduction="none").detach()
    grads, _, _ = replica.per_sample_grads(x, y)
    s = get_strategy("selective-backprop", beta=1, warmup=0)
    batch = _batch(x, y, 8)
    batch.extra = {"reference": np.zeros(4), "batch_size": np.asarray(3)}
    c = s.compute(replica, batch)
    assert c.n_grad == 3
    torch.testing.assert_close(c.grad, grads[torch.topk(losses, 3).indices].sum(0),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c.priorities, losses)  # every candidate's loss
    batch = _batch(x, y, 8)
    batch.extra = {"reference": np.zeros(4), "batch_size": np.asarray(8)}
    assert s.compute(replica, batch).n_grad == 8
    # the driver sends the cap with the CDF's reference
    ctx = make_ctx([600], [0], batch_size=16)
    assert int(s.select(ctx)[0].extra["batch_size"]) == 16
