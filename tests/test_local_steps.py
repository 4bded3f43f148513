"""Local steps: several optimizer steps per worker per round trip (local SGD)."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model
from daskpri.replicas.replica import sample_entropies
from daskpri.table.plugin import RemoteTable, _in_process


def _trainer(client, train, **kw):
    kw = {"client": client, "seed": 3, "batch_size": 32, **kw}
    return daskpri.Trainer(build_model("mlp", train, seed=1), **kw)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_on_one_worker_a_round_is_exactly_that_many_plain_steps(gpu_client, small_data,
                                                                 optimizer):
    train, _ = small_data
    runs = {}
    for k in (1, 8):
        # (a warm-up of 5 steps: the first round's rates rise within it)
        with _trainer(gpu_client, train, strategy="uniform", n_workers=1, local_steps=k,
                      lr_schedule="cosine", schedule_steps=24, warmup_steps=5,
                      optimizer=optimizer) as t:
            h = t.fit(train, max_steps=24, progress=False)
            runs[k] = (h, torch.nn.utils.parameters_to_vector(t.model.parameters()).detach())
    (h1, p1), (h8, p8) = runs[1], runs[8]
    assert h8["step"].values.tolist() == [7, 15, 23]
    # the same samples in the same order, the same optimizer (momentum, schedule) on the worker
    torch.testing.assert_close(p8, p1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        h8["loss"].values, h1["loss"].values.reshape(3, 8).mean(1), rtol=1e-4
    )
    assert h8["samples"].values[-1] == h1["samples"].values[-1] == 24 * 32


def test_rounds_on_two_workers_train_evaluate_and_end_at_max_steps(gpu_client, small_data):
    train, test = small_data
    with _trainer(gpu_client, train, strategy="selective-backprop", local_steps=4,
                  eval_every=8, fraction=0.5, warmup=0) as t:
        h = t.fit(train, eval_data=test, max_steps=30, progress=False)
        # 30 x 64 candidates per worker cover its 800 samples: every one is scored
        assert np.isfinite(t.table_.values).all()
    # rounds of 4 steps, the last one cut to the 2 steps left
    assert h["step"].values.tolist() == [3, 7, 11, 15, 19, 23, 27, 29]
    assert t.step_ == 30
    evaluated = h["step"].values[np.isfinite(h["accuracy"].values)].tolist()
    assert evaluated == [7, 15, 23, 29]
    assert (h["n_workers"] == 2).all()
    # selective-backprop forwards 64 candidates and backpropagates 32 per worker and step
    assert h["samples"].values[-1] == 30 * 2 * 64
    assert h["grad_samples"].values[-1] == 30 * 2 * 32
    assert h["loss"].values[-2:].mean() < h["loss"].values[:2].mean()


def test_the_configured_evaluation_period_is_rounded_to_whole_rounds(gpu_client, small_data):
    train, test = small_data
    # 10 steps in rounds of 4 would evaluate at 11, 23 and 31 (gaps of 12 and 8); 8 is even
    with dask.config.set({"daskpri.trainer.eval-every": 10}):
        with _trainer(gpu_client, train, strategy="uniform", local_steps=4) as t:
            assert t.eval_every == 8
            h = t.fit(train, eval_data=test, max_steps=32, progress=False)
    evaluated = h["step"].values[np.isfinite(h["accuracy"].values)].tolist()
    assert evaluated == [7, 15, 23, 31]


def test_an_evaluation_period_passed_in_part_rounds_warns_and_is_kept(
    gpu_client, small_data, tmp_path
):
    train, _ = small_data
    with pytest.warns(daskpri.DaskpriWarning,
                      match=r"eval_every=10 is not a whole number of rounds of local_steps=4.*"
                            r"pass a multiple of 4 such as 8, or 4 to evaluate every round",
                      ) as record:
        t = _trainer(gpu_client, train, strategy="uniform", local_steps=4, eval_every=10)
    assert record[0].filename == __file__  # the caller's line, not daskpri's
    with t:
        assert t.eval_every == 10
        t.fit(train, max_steps=4, progress=False)
        t.save(tmp_path / "t.ckpt")
    with pytest.warns(daskpri.DaskpriWarning, match=r"eval_every=6 is not a whole") as record:
        r = daskpri.Trainer.resume(tmp_path / "t.ckpt", client=gpu_client, eval_every=6)
    assert record[0].filename == __file__  # through resume as well
    r.close()
    for every in (3, 4, 12):  # within a round, or whole rounds: no warning (errors here)
        with _trainer(gpu_client, train, strategy="uniform", local_steps=4,
                      eval_every=every) as t:
            assert t.eval_every == every
    with pytest.raises(ValueError, match=r"eval_every should be a positive integer, but got "
                                         r"eval_every=0"):
        _trainer(gpu_client, train, strategy="uniform", local_steps=4, eval_every=0)


def test_selective_backprop_refresh_scores_afresh_every_other_epoch(gpu_client, small_data):
    train, _ = small_data
    with _trainer(gpu_client, train, strategy="selective-backprop", local_steps=4,
                  fraction=0.5, refresh=2, warmup=0) as t:
        h = t.fit(train, max_steps=40, progress=False)
    # Each worker walks its 800 samples 64 candidates a step: epoch 0 is steps
    # 0-12 (fresh, 64 forwarded), epoch 1 steps 13-24 (stale: only the 32 kept,
    # ranked by the table), epoch 2 steps 25-37 (fresh), epoch 3 from step 38.
    assert h["grad_samples"].values[-1] == 40 * 2 * 32
    assert h["samples"].values[-1] == 2 * (26 * 64 + 14 * 32)
    assert np.isfinite(h["loss"].values).all()


def test_selective_backprop_warmup_trains_a_plain_epoch_before_selecting(gpu_client, small_data):
    train, _ = small_data
    with _trainer(gpu_client, train, strategy="selective-backprop", local_steps=4,
                  fraction=0.5, refresh=2, warmup=1) as t:
        t.fit(train, max_steps=25, progress=False)
        warm = t.table_  # after the warmup epoch alone
        h = t.fit(train, max_steps=48, progress=False)
    # Each worker's 800 samples: the warmup epoch is steps 0-24, 32 samples a
    # step (forwarded once, backpropagated); epoch 1 scores 64 candidates a
    # step afresh (steps 25-37, the last one reaching into epoch 2); epoch 2
    # ranks them by the table and forwards the 32 kept (steps 38-49).
    assert h["grad_samples"].values[-1] == 48 * 2 * 32
    assert h["samples"].values[-1] == 2 * (25 * 32 + 13 * 64 + 10 * 32)
    # the warmup's training losses reached the table: every sample has one
    assert np.isfinite(warm.values).all() and (warm["version"].values >= 0).all()


@pytest.mark.parametrize("score", ["loss", "entropy"])
def test_selective_backprop_warmup_steps_give_the_table_its_score(gpu_client, small_data, score):
    # the warmup's plain steps compute their priorities at the round's end, from the
    # logits of their training forward pass: the strategy's score, not the loss, is kept
    train, _ = small_data
    start = build_model("mlp", train, seed=1)
    with _trainer(gpu_client, train, strategy="selective-backprop", n_workers=1,
                  local_steps=4, warmup=1, score=score) as t:
        t.fit(train, max_steps=1, progress=False)
        table = t.table_
    seen = np.flatnonzero(table["version"].values >= 0)
    assert seen.size == 32  # the first step's batch, forwarded before its update
    with torch.no_grad():
        logits = start(torch.as_tensor(train.x.values[seen]))
    labels = torch.as_tensor(train.y.values[seen])
    losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    expected = sample_entropies(logits) if score == "entropy" else losses
    assert not torch.allclose(sample_entropies(logits), losses, rtol=1e-2)
    np.testing.assert_allclose(table.values[seen], expected.numpy(), rtol=1e-4, atol=1e-5)


# uniform selects rounds ahead; selective-backprop with refresh, beta and prefilter too,
# checking what it reads, and draws its CDF reference from the table then (and sends
# its 0-d batch cap through the wire)
@pytest.mark.parametrize("strategy, options", [
    ("loss", {}), ("uniform", {}),
    ("selective-backprop", {"refresh": 2, "beta": 1.0, "prefilter": 0.5, "warmup": 0}),
    ("selective-backprop", {"refresh": 2, "beta": 1.0, "prefilter": 0.5, "warmup": 0,
                            "wait_for_inflight": False})])
def test_a_resumed_run_of_local_rounds_continues_exactly(
    gpu_client, small_data, tmp_path, strategy, options
):
    train, test = small_data
    path = tmp_path / "local.ckpt"
    a = _trainer(gpu_client, train, strategy=strategy, local_steps=4, **options)
    try:
        a.fit(train, max_steps=12, progress=False)
        a.save(path)
        ha = a.fit(train, max_steps=28, progress=False)
        pa = torch.nn.utils.parameters_to_vector(a.model.parameters()).detach().clone()
    finally:
        a.close()
    b = daskpri.Trainer.resume(path, client=gpu_client)
    try:
        assert b.local_steps == 4 and b.step_ == 12
        hb = b.fit(train, max_steps=28, progress=False)
        np.testing.assert_array_equal(ha["selection_digest"], hb["selection_digest"])
        pb = torch.nn.utils.parameters_to_vector(b.model.parameters()).detach()
        assert torch.equal(pa, pb), "bitwise equal parameters on CPU"
    finally:
        b.close()


def _ahead_counts(client, run: str) -> tuple[int, int]:
    """Rounds of ``run`` selected ahead by a strategy that reads the table: taken, declined."""

    def counts(dask_scheduler) -> tuple[int, int]:
        tr = dask_scheduler.plugins["daskpri"].runs[run]
        return tr.ahead_taken, tr.ahead_declined

    return tuple(client.run_on_scheduler(counts))


# selective-backprop with refresh reads the table, and checks what it reads
@pytest.mark.parametrize("strategy, options", [
    ("uniform", {}), ("selective-backprop", {}),
    ("selective-backprop", {"fraction": 0.5, "refresh": 2, "warmup": 0})])
def test_selecting_the_next_round_ahead_changes_no_selection(
    gpu_client, small_data, tmp_path, monkeypatch, strategy, options
):
    train, test = small_data
    ahead: list[int] = []  # the first step of each round selected ahead
    step_ahead = RemoteTable.step_ahead

    def counted(self, step, *args, **kwargs):
        ahead.append(step)
        return step_ahead(self, step, *args, **kwargs)

    monkeypatch.setattr(RemoteTable, "step_ahead", counted)
    runs = {}
    for prefetch in (False, True):
        ahead.clear()
        with dask.config.set({"daskpri.trainer.prefetch": prefetch}):
            with _trainer(gpu_client, train, strategy=strategy, local_steps=4, eval_every=4,
                          checkpoint_path=str(tmp_path / f"{prefetch}.ckpt"),
                          checkpoint_every=12, **options) as t:
                t.fit(train, max_steps=14, progress=False)  # its last round is cut to 2 steps
                # one round (14-18), ended by the target at its evaluation
                t.fit(train, eval_data=test, max_steps=40, target_accuracy=0.01, progress=False)
                assert t.step_ == 18
                h = t.fit(train, max_steps=30, progress=False)
                assert t._prefetched is None
                params = torch.nn.utils.parameters_to_vector(t.model.parameters()).detach()
                runs[prefetch] = (h, params.clone(), list(ahead))
                taken = _ahead_counts(gpu_client, t._remote.run)
        if options:  # each worker's 800 samples, 64 candidates a step: epoch 0 is
            # steps 0-12 (fresh), 1 steps 13-24 (stale), 2 from 25 (fresh); no
            # round selected ahead reads a priority of the round in flight
            assert taken == ((4, 0) if prefetch else (0, 0))
    (h0, p0, none), (h1, p1, some) = runs[False], runs[True]
    assert (h1["step"].values + 1).tolist() == [4, 8, 12, 14, 18, 22, 26, 30]
    # Selected ahead: not the round after a checkpoint (rounds ending past 12
    # and 24), nor one past a fit's max_steps (14, 30). The round from 18,
    # selected while the second fit's last round ran, was taken back when the
    # target ended it, and selected again by the third fit.
    assert none == [] and some == [4, 8, 18, 22]
    # the history marks the rounds whose selection was made ahead and used: the
    # rounds from 4, 8 and 22 (the one from 18 was selected again, after)
    assert h1["selected_ahead"].values.tolist() == [0, 1, 1, 0, 0, 0, 1, 0]
    assert h0["selected_ahead"].values.tolist() == [0] * 8
    np.testing.assert_array_equal(h0["step"], h1["step"])
    np.testing.assert_array_equal(h0["selection_digest"], h1["selection_digest"])
    assert torch.equal(p0, p1), "bitwise equal parameters on CPU"


def test_selective_backprop_without_waiting_selects_every_round_ahead_and_the_same_each_run(
    gpu_client, small_data
):
    # refresh: a new pass of the walk puts the round in flight's samples among the
    # next round's candidates, and waiting for their priorities declines rounds;
    # without waiting, none is declined, and a run still selects the same
    train, _ = small_data
    options = {"refresh": 2, "beta": 1.0, "warmup": 1, "prefilter": 0.5}
    runs = {}
    for wait, repeat in ((True, 0), (False, 0), (False, 1)):
        with _trainer(gpu_client, train, strategy="selective-backprop", local_steps=4,
                      wait_for_inflight=wait, **options) as t:
            h = t.fit(train, max_steps=80, progress=False)
            runs[wait, repeat] = (h, _ahead_counts(gpu_client, t._remote.run))
    (h_wait, (taken, declined)) = runs[True, 0]
    assert declined > 0 and taken + declined == 19  # every round but the first
    assert h_wait["selected_ahead"].values.sum() == taken
    (h0, counts0), (h1, counts1) = runs[False, 0], runs[False, 1]
    assert counts0 == counts1 == (19, 0)
    assert h0["selected_ahead"].values.tolist() == [0] + [1] * 19
    np.testing.assert_array_equal(h0["selection_digest"], h1["selection_digest"])
    assert not np.array_equal(h0["selection_digest"], h_wait["selection_digest"])


def _record_sends(monkeypatch, corrupt_call: int | None = None) -> list[str]:
    """Record how each round reaches the workers: "full", or "resume" from kept state.

    ``corrupt_call``: that call's resume names a state no worker holds.
    """
    from daskpri.training.deployment import Deployment

    sends: list[str] = []
    run = Deployment.run

    def recorded(self, weights, rounds, *, local=None, **kwargs):
        if local is not None and local.resume is not None:
            assert weights.params.numel() == 0 and not local.state
            if len(sends) == corrupt_call:
                local.resume = "not-kept"
                sends.append("lost")
                return run(self, weights, rounds, local=local, **kwargs)
            sends.append("resume")
        else:
            assert weights.params.numel() > 0
            sends.append("full")
        return run(self, weights, rounds, local=local, **kwargs)

    monkeypatch.setattr(Deployment, "run", recorded)
    return sends


def _fit_one_worker(client, train, keep: bool, steps=(20, 8), transport="direct"):
    with dask.config.set({"daskpri.trainer.keep-state": keep}):
        with _trainer(client, train, strategy="uniform", n_workers=1, local_steps=4,
                      momentum=0.9, transport=transport) as t:
            for n in steps:
                t.fit(train, max_steps=t.step_ + n, progress=False)
            params = torch.nn.utils.parameters_to_vector(t.model.parameters()).detach()
            return params, t._opt.state_dict()["state"]


def test_one_worker_keeps_its_state_and_rounds_resume_from_it(gpu_client, small_data,
                                                              monkeypatch):
    train, _ = small_data
    sends = _record_sends(monkeypatch)
    p_off, s_off = _fit_one_worker(gpu_client, train, keep=False)
    assert sends == ["full"] * 7
    sends.clear()
    p_on, s_on = _fit_one_worker(gpu_client, train, keep=True)
    # each fit sends the first round in full (the model may have changed between fits)
    assert sends == ["full"] + ["resume"] * 4 + ["full", "resume"]
    assert torch.equal(p_on, p_off)
    for key in s_off:
        assert torch.equal(s_on[key]["momentum_buffer"], s_off[key]["momentum_buffer"])


def _install_log_recorder(dask_worker):
    """Keep every warning or error any ``distributed`` logger of this worker writes."""
    import logging

    class Recorder(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record):
            self.lines.append(self.format(record))  # with the traceback, if any

    dask_worker._daskpri_test_log = Recorder()
    logging.getLogger("distributed").addHandler(dask_worker._daskpri_test_log)


def _take_log_recorder(dask_worker):
    import logging

    recorder = dask_worker._daskpri_test_log
    logging.getLogger("distributed").removeHandler(recorder)
    return recorder.lines


@pytest.mark.parametrize("transport", ["direct", "tasks"])
def test_a_worker_that_lost_its_kept_state_gets_the_round_in_full(gpu_client, small_data,
                                                                  monkeypatch, transport):
    train, _ = small_data
    p_off, _ = _fit_one_worker(gpu_client, train, keep=False, steps=(20,), transport=transport)
    sends = _record_sends(monkeypatch, corrupt_call=2)
    gpu_client.run(_install_log_recorder)
    try:
        p_on, _ = _fit_one_worker(gpu_client, train, keep=True, steps=(20,),
                                  transport=transport)
    finally:
        logs = [line for lines in gpu_client.run(_take_log_recorder).values()
                for line in lines]
    assert sends == ["full", "resume", "lost", "full", "resume", "resume"]
    assert torch.equal(p_on, p_off)
    # an expected answer, not a failure: the worker logs no error or traceback for it
    assert not [line for line in logs if "not-kept" in line or "ReplicaStateLost" in line]


def test_two_workers_always_get_the_averaged_state(gpu_client, small_data, monkeypatch):
    train, _ = small_data
    sends = _record_sends(monkeypatch)
    with _trainer(gpu_client, train, strategy="uniform", local_steps=2) as t:
        t.fit(train, max_steps=8, progress=False)
    assert sends == ["full"] * 4


def test_a_cluster_of_threads_trains_as_one_of_processes(gpu_client, small_data):
    """In one process no message is copied: each replica must still own its tensors.

    Before, every replica's parameters were views of the driver's one weight
    vector and the workers' optimizers shared the driver's momentum, so two
    threads trained one tensor (parameters 0.1 apart after 24 steps).
    """
    train, _ = small_data

    def run(client):
        with _trainer(client, train, strategy="uniform", local_steps=4, momentum=0.9) as t:
            t.fit(train, max_steps=24, progress=False)
            return torch.nn.utils.parameters_to_vector(t.model.parameters()).detach()

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                     resources={"GPU": 1}, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as threads,
    ):
        in_threads = run(threads)
    torch.testing.assert_close(in_threads, run(gpu_client), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("key", ["keep-state", "prefetch", "hold-workers"])
def test_a_switch_that_is_not_a_boolean_stops_the_fit_before_it_starts(gpu_client, small_data,
                                                                       key):
    train, _ = small_data
    with _trainer(gpu_client, train, strategy="uniform", local_steps=4) as t:
        with dask.config.set({f"daskpri.trainer.{key}": "no"}):
            with pytest.raises(ValueError, match=rf"daskpri.trainer.{key} should be true or "
                                                 r"false, but got 'no'"):
                t.fit(train, max_steps=8, progress=False)
        assert t.step_ == 0
        assert t.fit(train, max_steps=8, progress=False).sizes["step"] == 2


@pytest.fixture
def table_in_process():
    with dask.config.set({"daskpri.table.in-process": True}):
        yield


def test_the_table_is_called_over_a_comm_unless_set(gpu_client, small_data):
    train, _ = small_data
    with _trainer(gpu_client, train, strategy="uniform", local_steps=4) as t:
        t.fit(train, max_steps=8, progress=False)
        assert _in_process(gpu_client) is None


def test_the_table_of_a_scheduler_in_this_process_is_called_without_a_comm_sharing_nothing(
    gpu_client, small_data, table_in_process
):
    train, _ = small_data
    with _trainer(gpu_client, train, strategy="uniform", local_steps=4) as t:
        t.fit(train, max_steps=8, progress=False)
        # a LocalCluster's scheduler runs in this process: its table is called on its loop
        assert _in_process(gpu_client) is gpu_client.cluster.scheduler
        remote = t._remote
        record = {"step": 99, "loss": [1.0]}
        remote.update([(np.array([0, 1]), np.array([0.5, 0.25]), 99)], record)
        record["loss"].append(2.0)  # the driver's record changes after it was sent
        assert remote.metrics()[-1] == {"step": 99, "loss": [1.0]}
        remote.metrics()[-1]["loss"].append(3.0)  # and what it reads is its own
        assert remote.metrics()[-1] == {"step": 99, "loss": [1.0]}
        assert remote.priorities()["priority"][:2].tolist() == [0.5, 0.25]
        with pytest.raises(KeyError, match="no daskpri run 'nope'"):
            RemoteTable(gpu_client, "nope").summary()
    # a client that only has the address (as to a scheduler in another process, which
    # the trainer tests on `dask scheduler` train with) calls over a comm
    with Client(gpu_client.scheduler.address) as client:
        assert _in_process(client) is None
    # and a closed one too, where calls then fail as for a scheduler lost
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as client:
        RemoteTable.ensure_plugin(client)
        assert _in_process(client) is cluster.scheduler
    assert _in_process(client) is None


def test_a_channels_last_model_trains_in_rounds_as_in_plain_steps_and_keeps_its_layout(
    gpu_client,
):
    """Channels-last weights cannot be viewed as one vector (parameters_to_vector fails).

    On one worker, a round of 4 steps is 4 plain steps; on two, rounds
    average the workers' weights into the master's, which stays channels-last.
    """
    train, _ = daskpri.datasets.load("digits")

    def fit(local_steps, n_workers):
        model = build_model("cnn", train, seed=2).to(memory_format=torch.channels_last)
        with daskpri.Trainer(model, strategy="uniform", client=gpu_client, seed=3,
                             batch_size=16, momentum=0.9, local_steps=local_steps,
                             n_workers=n_workers) as t:
            h = t.fit(train, max_steps=8, progress=False)
        conv = [m for m in t.model if isinstance(m, torch.nn.Conv2d)][1].weight
        assert conv.is_contiguous(memory_format=torch.channels_last)
        assert not conv.is_contiguous()
        return h, torch.cat([p.detach().reshape(-1) for p in t.model.parameters()])

    (_, plain), (_, rounds) = fit(1, 1), fit(4, 1)
    torch.testing.assert_close(rounds, plain, rtol=1e-5, atol=1e-6)
    h2, two = fit(4, 2)
    assert np.isfinite(h2["loss"].values).all() and (h2["n_workers"] == 2).all()
    assert not torch.equal(two, plain)
