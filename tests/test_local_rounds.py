"""Local rounds without a trainer: how a round is packed, selected ahead and computed.

Packing and digests of a round's selections, the table's selection of the
next round ahead (and taking it back), and a round on a real in-process
worker whose replica's plugin is set up by hand. The rounds of whole fits
are in test_local_steps.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from distributed import LocalCluster
from distributed.protocol import pickle

import daskpri
from daskpri._wire import pack
from daskpri.replicas.optim import LocalSteps, make_optimizer
from daskpri.replicas.replica import Replica, Weights
from daskpri.replicas.step import _train
from daskpri.replicas.worker import ArrayPart, ReplicaPlugin, Shares
from daskpri.strategies import get_strategy
from daskpri.strategies.base import Batch, Selection
from daskpri.table._packing import _unpack_round


@pytest.fixture(scope="module")
def inproc_worker():
    """A real Dask worker in this process, for a replica's plugin set up by hand."""
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster:
        yield next(iter(cluster.workers.values()))


def test_strategies_that_need_last_steps_priorities_refuse_local_rounds():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"strategy 'projection' selects by the priorities of "
                       r"the previous step.*local_steps=4"):
        daskpri.Trainer(model, strategy="projection", local_steps=4)
    with pytest.raises(ValueError, match="local_steps should be a positive integer"):
        daskpri.Trainer(model, local_steps=0)


def test_a_round_packs_weighted_and_unweighted_steps_and_unpacks_each_as_it_was():
    sels = [
        Selection(train=np.array([0, 5])),
        Selection(train=np.array([7, 12, 13]), weights=np.array([0.5, 2.0, 1.5]),
                  score=np.array([3])),
        Selection(train=np.array([], dtype=np.int64)),
        Selection(train=np.array([19]), weights=np.array([4.0])),
    ]
    shares = Shares.pack(sels, (9, 100, 1), np.array([0, 10, 20]))
    assert len(shares) == 4 and shares.weights.size == 4  # only weighted steps carry weights
    for i, sel in enumerate(sels):
        share = shares.share(i)
        assert share.indices.tolist() == np.concatenate([sel.train, sel.score]).tolist()
        assert share.n_train == sel.train.size
        assert (share.pids * 10 + share.local).tolist() == share.indices.tolist()
        assert share.seed == (9, 100 + i, 1)
        if sel.weights is None:
            assert share.weights is None
        else:
            assert share.weights.tolist() == sel.weights.tolist()
    assert shares.partitions().tolist() == [0, 1]


def test_a_round_of_train_rows_only_packs_each_step_as_it_was():
    sels = [Selection(train=np.array([4, 1])), Selection(train=np.array([], dtype=np.int64)),
            Selection(train=np.array([19, 2, 11]))]
    shares = Shares.pack(sels, (0, 5, 0), np.array([0, 10, 20]))
    assert shares.indices.dtype == np.int64 and shares.splits.tolist() == [0, 2, 2, 5]
    assert [shares.share(i).indices.tolist() for i in range(3)] == [[4, 1], [], [19, 2, 11]]
    assert all(shares.share(i).weights is None for i in range(3))


def test_a_rounds_digest_is_the_crc_of_its_selections_in_order():
    import zlib

    from daskpri.training.rounds import digest

    sels = [Selection(train=np.array([3, 1])), Selection(train=np.array([], dtype=np.int64)),
            Selection(train=np.array([7], dtype=np.int32))]
    crc = 0
    for s in sels:  # as the history's digests have always been taken
        crc = zlib.crc32(np.asarray(s.train, dtype=np.int64).tobytes(), crc)
    assert digest(sels) == float(crc) != digest(sels[::-1])
    assert digest([]) == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_a_round_read_packed_gives_the_shares_and_digest_of_its_selections(seed):
    """The driver's packed path (Round.slot_arrays, Shares.concat, Round.digest)
    against building a Selection per step and packing those."""
    import msgpack

    from daskpri.table._packing import _pack_round
    from daskpri.table.plugin import Round
    from daskpri.training.rounds import digest

    rng = np.random.default_rng(seed)
    n_steps, n_slots = int(rng.integers(1, 9)), int(rng.integers(1, 4))
    scored, weighted, extras = rng.random(3) < 0.5  # some rounds have none of each

    def selection() -> Selection:
        n = int(rng.integers(0, 5))
        return Selection(
            train=rng.integers(0, 30, n),
            score=rng.integers(0, 30, int(rng.integers(0, 3))) if scored else np.empty(0, int),
            weights=rng.random(n) if weighted and rng.random() < 0.7 else None,
            extra={"x": rng.random(2)} if extras else {},
        )

    steps = [[selection() for _ in range(n_slots)] for _ in range(n_steps)]
    wire = [msgpack.unpackb(msgpack.packb(_pack_round([step[s] for step in steps]),
                                          use_bin_type=True)) for s in range(n_slots)]
    rnd = Round(wire)
    assert (len(rnd), rnd.n_slots) == (n_steps, n_slots)
    assert rnd.digest() == digest([sel for step in steps for sel in step])
    bounds = np.array([0, 10, 20, 30])
    for s in range(n_slots):
        packed = Shares.concat(**rnd.slot_arrays(s), seed=(1, 2, s), bounds=bounds)
        built = Shares.pack([step[s] for step in steps], (1, 2, s), bounds)
        for name in ("indices", "splits", "n_train", "weights", "weighted"):
            assert np.array_equal(getattr(packed, name), getattr(built, name)), name
        assert packed.partitions().tolist() == np.unique(packed.indices // 10).tolist()
        for i, step in enumerate(steps):
            share, sel = packed.share(i), step[s]
            assert share.indices.tolist() == [*sel.train.tolist(), *sel.score.tolist()]
            assert (share.weights is None) == (sel.weights is None)
            assert share.extra.keys() == sel.extra.keys()
            assert [x.train.tolist() for x in rnd[i]] == [x.train.tolist() for x in step]


def test_the_table_takes_back_a_selection_made_ahead():
    from daskpri.table.plugin import TablePlugin, TableRun
    from daskpri.table.table import PriorityTable

    tr = TableRun(table=PriorityTable([50, 50]), strategy=get_strategy("uniform"),
                  rng=np.random.default_rng(0), owner=np.zeros(0, np.int64), batch_size=16,
                  info={})
    tr.set_owner(np.array([0, 1]))
    plugin = TablePlugin()
    plugin.runs["r"] = tr
    first = plugin._step("r", 0, count=3, undo=True)
    plugin._unselect("r")
    assert plugin._step("r", 0, count=3) == first  # as if never selected
    second = plugin._step("r", 3, count=3)
    assert second != first
    plugin._unselect("r")  # nothing kept to take back: no change
    assert plugin._step("r", 6, count=2) != second


def test_a_selective_backprop_round_taken_back_is_selected_again_the_same():
    # the beta rule's CDF reference is drawn once for each state of the table
    # and kept in the strategy's state: a round selected ahead and taken back
    # leaves no trace, and the round selected then is the one taken back
    from daskpri.table.plugin import TablePlugin, TableRun
    from daskpri.table.table import PriorityTable

    strategy = get_strategy("selective-backprop", beta=1.0, refresh=2, stale_beta=3, warmup=0)
    tr = TableRun(table=PriorityTable([800, 800]), strategy=strategy,
                  rng=np.random.default_rng(0), owner=np.zeros(0, np.int64), batch_size=8,
                  info={})
    tr.set_owner(np.array([0, 1]))
    plugin = TablePlugin()
    plugin.runs["r"] = tr
    seen = np.arange(1600)
    losses = np.random.default_rng(1).exponential(1.0, 1600)
    update = [{"indices": pack(seen), "priorities": pack(losses), "step": 0}]
    plugin._step("r", 0, updates=update, count=4)
    before = tr.state["reference"]["losses"]
    ahead = plugin._step("r", 4, count=4, undo=True)
    assert ahead is not None
    plugin._unselect("r")
    np.testing.assert_array_equal(tr.state["reference"]["losses"], before)
    again = plugin._step("r", 4, count=4)

    def steps(packed):
        return [[(sel.train.tolist(), sel.extra["reference"].tolist() if "reference" in sel.extra
                  else None) for sel in _unpack_round(slot)] for slot in packed]

    assert steps(again) == steps(ahead)
    # the round's fresh steps share one reference, the table's as it stands
    refs = [sel.extra["reference"] for sel in _unpack_round(again[0]) if "reference" in sel.extra]
    assert refs and all(np.array_equal(r, refs[0]) for r in refs)


def test_a_round_selected_ahead_that_reads_a_priority_in_flight_is_declined():
    from daskpri.table.plugin import TablePlugin, TableRun
    from daskpri.table.table import PriorityTable

    # one worker of 16 samples, batch 4: 8 candidates a step, an epoch in 2
    # steps; refresh=2: epoch 0 fresh, epoch 1 ranks by the table
    # (recent_last=False: a plain shuffle each pass, which draws samples in flight)
    tr = TableRun(table=PriorityTable([16]), strategy=get_strategy(
                  "selective-backprop", fraction=0.5, refresh=2, warmup=0, recent_last=False),
                  rng=np.random.default_rng(0),
                  owner=np.zeros(0, np.int64), batch_size=4, info={})
    tr.set_owner(np.array([0]))
    plugin = TablePlugin()
    plugin.runs["r"] = tr
    first = plugin._step("r", 0, count=1)  # epoch 0, first half: in flight
    # the next round (epoch 0's second half, fresh) reads no priority: taken
    assert plugin._step("r", 1, count=1, undo=True) is not None
    assert (tr.ahead_taken, tr.ahead_declined) == (1, 0)
    # the round after (epoch 1, stale) ranks all 16 samples, half of them in
    # flight: declined, and the table's selection state is as before
    state = copy.deepcopy(tr.state), copy.deepcopy(tr.rng.bit_generator.state)
    assert plugin._step("r", 2, count=1, undo=True) is None
    assert (tr.ahead_taken, tr.ahead_declined) == (1, 1)
    assert tr.state["pos"] == state[0]["pos"] and tr.rng.bit_generator.state == state[1]
    assert tr.last_step == 1
    # once the priorities arrive, the round is selected as usual
    seen = np.arange(16)
    after = plugin._step("r", 2, updates=[{"indices": pack(seen), "priorities": pack(
        seen / 16.0), "step": 1}], count=1)
    assert after is not None and first is not None
    train = _unpack_round(after[0])[0].train
    cand = tr.state["perm"][0][:8]  # the stale step's candidates (samples 0..15 are positions)
    assert train.tolist() == sorted(np.sort(cand)[-4:].tolist())  # the table's 4 highest
    # a strategy that reads the table without checking what is in flight never
    # selects ahead, whoever asks
    tr.strategy = get_strategy("loss")
    assert plugin._step("r", 3, count=1, undo=True) is None and tr.ahead_declined == 2


@pytest.mark.parametrize("options", [{"fraction": 0.5, "refresh": 2},
                                     {"beta": 1.0, "refresh": 3}])
def test_selective_backprop_rounds_across_passes_are_selected_ahead_and_select_the_same(options):
    # two workers of 120 samples, 4 steps a round drawing about 8 candidates
    # each (a quarter of a pass); the losses of a round reach the table with
    # the next round's selection. Selected ahead, with each pass drawing the
    # last two rounds' samples last, no round is declined, and by the
    # fraction rule the rounds are those selected after their priorities
    # arrived (no prefetch; the beta rule's CDF is drawn from the table as a
    # whole, which differs); with plain shuffles, rounds across a pass are
    # declined
    from daskpri.table.plugin import TablePlugin, TableRun
    from daskpri.table.table import PriorityTable

    def run(ahead, recent_last):
        strategy = get_strategy("selective-backprop", warmup=1, recent_last=recent_last, **options)
        tr = TableRun(table=PriorityTable([60, 60, 60, 60]), strategy=strategy,
                      rng=np.random.default_rng(0), owner=np.zeros(0, np.int64), batch_size=4,
                      info={})
        tr.set_owner(np.array([0, 0, 1, 1]))
        plugin = TablePlugin()
        plugin.runs["r"] = tr
        losses = np.random.default_rng(1).exponential(1.0, 240)
        rounds, update, declined = [], None, []
        for r in range(30):
            packed = plugin._step("r", 4 * r, count=4, undo=True) if ahead else None
            if packed is None:  # selected once the round in flight's losses are in
                declined += [r] if ahead else []
                packed = plugin._step("r", 4 * r, updates=update, count=4)
                update = None
            steps = [_unpack_round(slot) for slot in packed]
            rounds.append([[sel.train.tolist() for sel in slot] for slot in steps])
            seen = np.unique(np.concatenate([sel.train for slot in steps for sel in slot]))
            losses[seen] *= 0.9  # trained: the losses fall
            if update is not None:  # the round before's, reaching the table now
                plugin._update("r", update)
            update = [{"indices": pack(seen), "priorities": pack(losses[seen]), "step": 4 * r}]
        return rounds, declined, tr.state["epochs"]

    ahead, declined, epochs = run(True, True)
    assert declined == [0] and min(epochs.values()) >= 4  # the first: nothing in flight yet
    if "fraction" in options:
        assert run(False, True)[0] == ahead
    assert len(run(True, False)[1]) > 1  # plain shuffles: declined at new passes


def test_a_walk_with_recent_last_resumes_from_the_tables_state_at_any_round():
    # the rounds' marks are strategy state: saved (packed, as the plugin
    # ships it) after any round and loaded into a new table, the run selects
    # what it selects uninterrupted, also where the next round begins a pass
    from daskpri._wire import pack_tree, unpack_tree
    from daskpri.table.plugin import TableRun
    from daskpri.table.table import PriorityTable

    def new_run():
        strategy = get_strategy("selective-backprop", fraction=0.5, refresh=2, recent_last=True)
        tr = TableRun(table=PriorityTable([60, 60]), strategy=strategy,
                      rng=np.random.default_rng(0), owner=np.zeros(0, np.int64), batch_size=4,
                      info={})
        tr.set_owner(np.array([0, 1]))
        return tr

    def go(tr, first, last):
        out = []
        for r in range(first, last):
            arrays = tr.select_round_arrays(4 * r, 4)
            out.append([a["train"].tolist() for a in arrays])
            seen = np.unique(np.concatenate([a["train"] for a in arrays]))
            tr.table.update(seen, np.cos(seen * (r + 1.0)) + 2.0, step=4 * r)
        return out

    whole = go(new_run(), 0, 24)
    for split in range(1, 24):
        before = new_run()
        head = go(before, 0, split)
        after = new_run()
        after.load_state_dict(unpack_tree(pack_tree(before.state_dict())))
        assert head + go(after, split, 24) == whole, split
    # and the marks matter: dropped, some resumed run walks otherwise
    differs = []
    for split in range(1, 24):
        before = new_run()
        go(before, 0, split)
        state = unpack_tree(pack_tree(before.state_dict()))
        state["strategy_state"].pop("round_marks")
        after = new_run()
        after.load_state_dict(state)
        differs.append(go(after, split, 24) != whole[split:])
    assert any(differs)


def test_a_rounds_losses_taken_at_its_end_are_each_steps_own(inproc_worker):
    """The worker derives a round's losses, loss sum and hits from its logits at the end.

    Against each step computed on its own (the strategy's full result):
    plain steps, a weighted one, one with scored-only rows and an empty one,
    on the same weights and on weights that move with local steps.
    """
    torch.manual_seed(0)
    x = torch.randn(30, 5)
    y = torch.randint(0, 3, (30,))
    module = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    sels = [
        Selection(train=np.array([0, 5, 11])),
        Selection(train=np.array([7, 12, 13]), weights=np.array([0.5, 2.0, 1.5])),
        Selection(train=np.array([2, 21]), score=np.array([3, 25, 29])),
        Selection(train=np.array([], dtype=np.int64)),
        Selection(train=np.array([1, 4, 8, 9, 28])),
    ]
    bounds = np.array([0, 10, 20, 30])
    parts = {p: ArrayPart(x[a:b].numpy(), y[a:b].numpy(), int(a))
             for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))}
    strategy = get_strategy("uniform")
    params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()


    for local in (None, LocalSteps("sgd", {"lr": 0.1, "momentum": 0.9}, {}, [0.1] * 5)):
        plugin = ReplicaPlugin("t", pickle.dumps(module), 3)
        plugin.setup(inproc_worker)
        if local is not None:
            opt = make_optimizer("sgd", list(module.parameters()), {"lr": 0.1, "momentum": 0.9})
            local.state = opt.state_dict()
        # (a copy: in one process the replica's parameters become views of it)
        shares = Shares.pack(sels, (0, 0, 0), bounds)
        result = _train(plugin, Weights(0, params.clone()), strategy, shares, parts, local)
        # the same steps, one at a time, each computing its own losses
        replica = Replica(copy.deepcopy(module), "cpu")
        replica.load(Weights(0, params))
        opt = make_optimizer("sgd", replica.params, {"lr": 0.1, "momentum": 0.9})
        replica.keep_grads = local is not None
        prios, loss_sum, correct = [], 0.0, 0
        for sel in sels:
            rows = np.concatenate([sel.train, sel.score]).astype(np.int64)
            if not rows.size:
                continue
            w = None if sel.weights is None else torch.as_tensor(sel.weights, dtype=torch.float32)
            c = strategy.compute(replica, Batch(x[rows], y[rows], rows, sel.train.size, w, None,
                                                {}, (0,)))
            prios.append(c.priorities.numpy())
            loss_sum += float(c.loss_sum)
            correct += int(c.correct)
            if local is not None:
                opt.step()
        np.testing.assert_allclose(result.priorities, np.concatenate(prios), rtol=1e-6)
        assert result.indices.tolist() == np.concatenate(
            [np.concatenate([s.train, s.score]) for s in sels]).tolist()
        assert result.loss_sum == pytest.approx(loss_sum, rel=1e-6)
        assert result.correct == correct
        assert result.n_loss == 13 and result.n_grad == 13


def test_a_round_resuming_from_state_the_worker_does_not_hold_is_refused(inproc_worker):
    from daskpri.replicas.worker import ReplicaStateLost


    module = torch.nn.Linear(3, 2)
    plugin = ReplicaPlugin("t", pickle.dumps(module), 2)
    plugin.setup(inproc_worker)
    bounds = np.array([0, 4])
    parts = {0: ArrayPart(np.zeros((4, 3), np.float32), np.zeros(4, np.int64), 0)}
    shares = Shares.pack([Selection(train=np.array([0, 1]))], (0, 0, 0), bounds)
    local = LocalSteps("sgd", {"lr": 0.1}, {}, [0.1], resume="abc")
    with pytest.raises(ReplicaStateLost, match=r"does not hold the state .*\(abc\); it holds none"):
        _train(plugin, Weights(-1, torch.empty(0)), get_strategy("uniform"), shares, parts, local)


def test_a_local_step_of_loss_draws_makes_the_drivers_unbiased_step_on_average(inproc_worker):
    """``loss`` draws over all workers, so each gets a varying share of the draws.

    A local step divides its weighted sum by the draws a worker expects
    (``rows_per_step``): the workers' mean after it is then the driver's
    step ``sum(w g) / draws``. Divided by its own count, a worker with few,
    heavily weighted draws took an outsized step, and the mean was biased.
    """
    from daskpri.strategies import SelectContext
    from daskpri.table.table import PriorityTable

    torch.manual_seed(0)
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    module = torch.nn.Linear(5, 3)
    params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    bounds = np.array([0, 20, 40])
    parts = {p: ArrayPart(x[a:b].numpy(), y[a:b].numpy(), int(a))
             for p, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))}
    table = PriorityTable([20, 20])  # the first worker's samples have the high losses
    table.update(np.arange(40), np.concatenate([np.full(20, 3.0), np.full(20, 0.2)]), 0)
    strategy = get_strategy("loss", epsilon=0.2)
    assert strategy.draws_globally
    ctx = SelectContext(table=table, groups=[np.arange(20), np.arange(20, 40)],
                        owner=np.array([0, 1]), step=1, batch_size=8,
                        rng=np.random.default_rng(4), state={})
    sels = strategy.select(ctx)
    counts = [s.train.size for s in sels]
    assert sum(counts) == 16 and counts[0] > counts[1]  # shares of the draws differ


    after = []
    for slot, sel in enumerate(sels):
        plugin = ReplicaPlugin("t", pickle.dumps(module), 3)
        plugin.setup(inproc_worker)
        opt = make_optimizer("sgd", list(torch.nn.Linear(5, 3).parameters()), {"lr": 0.1})
        local = LocalSteps("sgd", {"lr": 0.1, "momentum": 0.0}, opt.state_dict(), [0.1],
                           rows_per_step=8)
        shares = Shares.pack([sel], (0, 1, slot), bounds)
        after.append(_train(plugin, Weights(0, params.clone()), strategy, shares, parts,
                            local).params)
    replica = Replica(torch.nn.Linear(5, 3), "cpu")
    replica.load(Weights(0, params.clone()))
    total = sum(replica.weighted_grad(x[s.train], y[s.train],
                                      torch.as_tensor(s.weights, dtype=torch.float32))[0]
                for s in sels)
    torch.testing.assert_close(torch.stack(after).mean(0), params - 0.1 * total / 16)


def test_two_steps_sent_to_one_replica_run_one_after_the_other(inproc_worker):
    """A step the driver gave up on may still compute when its retry arrives."""
    import threading
    import time

    from daskpri.replicas.worker import _train_or_lost
    from daskpri.strategies.uniform import Uniform

    spans = []

    class Slow(Uniform):
        def compute(self, replica, batch):
            start = time.monotonic()
            time.sleep(0.3)
            out = super().compute(replica, batch)
            spans.append((start, time.monotonic()))
            return out

    torch.manual_seed(0)
    x, y = torch.randn(20, 5), torch.randint(0, 3, (20,))
    module = torch.nn.Linear(5, 3)
    params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    bounds = np.array([0, 20])
    parts = {0: ArrayPart(x.numpy(), y.numpy(), 0)}


    plugin = ReplicaPlugin("t", pickle.dumps(module), 3)
    plugin.setup(inproc_worker)
    shares = Shares.pack([Selection(train=np.arange(8))], (0, 0, 0), bounds)
    threads = [threading.Thread(target=_train_or_lost, args=(
        plugin, Weights(step, params.clone()), Slow(), shares, parts, None)) for step in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, "the second step computed while the first did"
