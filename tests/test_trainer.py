"""The trainer end to end on a real LocalCluster: strategies, steps, schedules, the table,
the data it is given.

Workers that die, join or hang are in test_trainer_workers.py, a trainer's
cluster, client, background fits and close in test_trainer_lifecycle.py.
"""

from __future__ import annotations

import re
import time
import warnings

import dask
import numpy as np
import pytest
import torch
from _fits import fit

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model
from daskpri.strategies.uniform import Uniform  # (`daskpri` loads it only once it is used)


@pytest.mark.parametrize(
    "strategy", ["uniform", "projection", "length", "loss", "selective-backprop"]
)
def test_each_strategy_trains_on_gpu_tagged_workers(gpu_client, small_data, strategy):
    trainer, h = fit(gpu_client, small_data, strategy, steps=30)
    try:
        assert trainer.resources == {"GPU": 1.0}  # asked for by default on GPU workers
        assert h.sizes["step"] == 30 and h["n_workers"].values.tolist() == [2] * 30
        assert np.isfinite(h["loss"]).all() and (np.diff(h["time"]) > 0).all()
        acc = h["accuracy"].dropna("step")
        assert acc["step"].values.tolist() == [4, 9, 14, 19, 24, 29]
        assert float(acc[-1]) > 0.3  # 10 classes: far above chance after 30 steps
        assert (np.diff(h["samples"]) > 0).all()
        assert h.attrs["strategy"] == strategy
        table = trainer.table_
        assert table.sizes["sample"] == small_data[0].sizes["sample"]
        seen = table["version"] >= 0
        assert int(seen.sum()) > 0 and np.isfinite(table.where(seen, drop=True)).all()
    finally:
        trainer.close()


def test_second_fit_continues_the_step_count(gpu_client, small_data):
    trainer, h = fit(gpu_client, small_data, "projection", steps=5)
    try:
        h2 = trainer.fit(small_data[0], max_steps=9, progress=False)
        assert trainer.step_ == 9
        assert h2["step"].values.tolist() == list(range(9))
        assert (np.diff(h2["time"]) > 0).all()
    finally:
        trainer.close()


@pytest.mark.parametrize("transport", ["direct", "tasks"])
def test_no_task_carries_the_weights_through_the_scheduler(gpu_client, small_data, transport):
    # The warm-up's tasks carried the weights, pickled: the scheduler held a copy for
    # each worker, and distributed warned of a large graph for a model over its threshold
    # (10 MB by default; 200 kB here, a model of 0.5 MB). They are scattered once now, as
    # the steps' of the tasks transport are.
    train, _ = small_data
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 10))
    trainer = daskpri.Trainer(model, strategy="uniform", client=gpu_client, seed=0,
                              transport=transport)
    try:
        with (dask.config.set({"distributed.admin.large-graph-warning-threshold": "200kB"}),
              warnings.catch_warnings(record=True) as caught):
            warnings.simplefilter("always")
            trainer.fit(train, max_steps=2, progress=False)
        assert trainer.step_ == 2
        assert not [w for w in caught if "large graph" in str(w.message)], [
            str(w.message) for w in caught]
    finally:
        trainer.close()


def test_same_seed_same_selections(gpu_client, small_data):
    runs = []
    for _ in range(2):
        trainer, h = fit(gpu_client, small_data, "projection", steps=15, seed=3)
        runs.append((h, trainer.table_))
        trainer.close()
    (h1, t1), (h2, t2) = runs
    np.testing.assert_array_equal(t1["version"], t2["version"])
    np.testing.assert_array_equal(t1.values, t2.values)
    np.testing.assert_array_equal(h1["loss"], h2["loss"])
    trainer, h3 = fit(gpu_client, small_data, "projection", steps=15, seed=4)
    t3 = trainer.table_
    trainer.close()
    assert not np.array_equal(t1["version"], t3["version"])


def test_fit_from_zarr_and_netcdf_paths(gpu_client, small_data, tmp_path):
    train, test = small_data
    zpath = to_store(train.chunk({"sample": 250}), str(tmp_path / "train.zarr"))
    npath = to_store(test, str(tmp_path / "test.nc"))
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="loss", client=gpu_client)
    try:
        h = trainer.fit(zpath, eval_data=npath, max_steps=6, progress=False)
        assert int(trainer.table_["partition"].max()) == 6  # 7 zarr chunks of 1600 samples
        assert np.isfinite(h["accuracy"][-1])
    finally:
        trainer.close()


def test_a_store_of_one_sample_chunks_trains_in_partitions_of_many(
    gpu_client, small_data, tmp_path
):
    train, _ = small_data
    path = to_store(train.isel(sample=slice(400)).chunk({"sample": 1}),
                    str(tmp_path / "train.zarr"))
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="loss", client=gpu_client,
                              batch_size=16)
    try:
        trainer.fit(path, max_steps=3, progress=False)
        table = trainer.table_
    finally:
        trainer.close()
    # one partition a worker, whole chunks, not one a sample; every sample in the table
    assert np.unique(table["partition"]).tolist() == [0, 1]
    assert np.bincount(table["partition"]).tolist() == [200, 200]


def test_a_relative_path_and_a_file_of_one_chunk_reach_every_worker(
    gpu_client, small_data, tmp_path, monkeypatch
):
    train, _ = small_data
    to_store(train, str(tmp_path / "train.nc"))  # contiguous: opened as one chunk
    monkeypatch.chdir(tmp_path)  # the driver's directory, not the workers'
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        h = trainer.fit("train.nc", max_steps=3, progress=False)
    finally:
        trainer.close()
    # both workers hold partitions and train: not one chunk on one of them
    assert h["n_workers"].values.tolist() == [2, 2, 2]
    assert int(h["samples"][-1]) == 3 * 2 * trainer.batch_size  # so far, 3 steps


def test_bad_input_gives_clear_errors(gpu_client, small_data):
    train, test = small_data
    model = build_model("mlp", train)
    with pytest.raises(ValueError, match="strategy should be one of 'uniform'.*but got 'los'"):
        daskpri.Trainer(model, strategy="los", client=gpu_client)
    with pytest.raises(
        ValueError, match="batch_size should be a positive integer, but got batch_size=0"
    ):
        daskpri.Trainer(model, client=gpu_client, batch_size=0)
    with pytest.raises(TypeError, match="model should be a torch.nn.Module"):
        daskpri.Trainer("mlp", client=gpu_client)  # type: ignore[arg-type]
    # a fit argument given to the Trainer lands among the strategy's options
    with pytest.raises(ValueError, match=r"Trainer got progress: neither a Trainer argument nor "
                       r"an option of strategy 'loss' \(epsilon, renew, "):
        daskpri.Trainer(model, strategy="loss", client=gpu_client, progress=False)

    def attempt(data, match, exc=ValueError, **kw):
        t = daskpri.Trainer(kw.pop("model", model), client=gpu_client, **kw)
        try:
            with pytest.raises(exc, match=match):
                t.fit(data, max_steps=3, progress=False)
        finally:
            t.close()

    attempt(train, r"^batch_size=801 is more than a worker's share of the data \(800 "
                   r"samples, of 1600 on 2 workers\): .*give a batch_size of at most 800",
            batch_size=801)
    attempt(train, r"^batch_size=5000 is more than a worker's share",
            strategy=daskpri.get_strategy("loss", batch_size=5000))  # the strategy's own
    big = train.assign(x=train["x"].astype(np.float64))
    big["x"].values[1500, 2] = 1e39  # finite in float64, infinite in the float32 trained
    attempt(big, r"^x in data should hold numbers float32 can hold "
                 r"\(daskpri trains in float32\), but got 1e\+39 at sample 1500$")

    x = train["x"].values.copy()
    x[1234, 3] = np.nan
    nan = train.assign(x=(train["x"].dims, x))
    # in memory here: checked before the run is set up; a Dask array's by the workers
    attempt(nan, r"^x in data should hold finite numbers, but got 1 NaN or infinite value, "
                 r"the first at sample 1234$")
    attempt(nan.chunk({"sample": 400}),
            r"x in partition 3 \(samples 1200-1599\) should hold finite numbers.*at sample 1234")
    y = train["y"].values.copy()
    y[7] = 12
    attempt(
        train.assign(y=("sample", y)),
        r"^y in data should be in \[0, 10\), but got 12 at sample 7 \(1 bad label\)$",
    )
    attempt(
        train,
        "model outputs 4 classes, but data has n_classes=10",
        model=build_model("mlp", train.assign_attrs(n_classes=4)),
    )
    attempt(train.isel(sample=slice(0, 0)), r"^data should have at least one sample, but got 0$")
    attempt(train, r"the model's parameters should be float32, as the data daskpri feeds it "
            r"is, but some are float64; call model.float\(\)",
            model=build_model("mlp", train).double())
    with dask.config.set({"daskpri.trainer.no-workers-timeout": "0.2s"}):  # waited for
        attempt(train, "resources=.*TPU.*dask worker .* --resources TPU=1.*; waited 0.2 s",
                resources={"TPU": 1})
    with pytest.raises(ValueError, match="max_steps= or max_time="):
        daskpri.Trainer(model, client=gpu_client).fit(train)


def test_table_lives_in_the_scheduler_and_round_trips_its_state(gpu_client, small_data):
    from daskpri.table.table import PriorityTable

    a, _ = fit(gpu_client, small_data, "loss", steps=4)
    b, _ = fit(gpu_client, small_data, "uniform", steps=4)
    try:
        runs = gpu_client.sync(gpu_client.scheduler.daskpri_runs)
        assert {a.run_id, b.run_id} <= set(runs)
        state = a._table.state_dict()
        table = PriorityTable.from_state_dict(state["table"])
        np.testing.assert_array_equal(table.priority, a.table_.values)
        assert state["last_step"] == 3
        a._table.load_state_dict(state)  # accepted back as it is
        summary = a._table.summary()
        assert summary["count"].sum() == small_data[0].sizes["sample"]
        assert summary["info"]["strategy"] == "loss"
    finally:
        a.close()
        b.close()
    # closed runs stay, read-only, for the dashboard (daskpri.table.keep-closed)
    assert {a.run_id, b.run_id} <= set(gpu_client.sync(gpu_client.scheduler.daskpri_runs))
    from daskpri.table.plugin import RemoteTable

    with pytest.raises(KeyError, match="is closed"):
        RemoteTable(gpu_client, a.run_id).update([])


def test_step_metrics_reach_the_scheduler(gpu_client, small_data):
    trainer, h = fit(gpu_client, small_data, "uniform", steps=6)
    try:
        metrics = trainer._table.metrics()
        assert [m["step"] for m in metrics] == list(range(6))
        assert metrics[-1]["loss"] == pytest.approx(float(h["loss"][-1]))
        assert metrics[4]["accuracy"] == pytest.approx(float(h["accuracy"][4]))
    finally:
        trainer.close()


def test_max_time_counts_training_time(gpu_client, small_data):
    trainer, _ = fit(gpu_client, small_data, "uniform", steps=1)
    try:
        h = trainer.fit(small_data[0], eval_data=small_data[1], max_time=1.0, progress=False)
        t = h["time"].values - h["time"].values[0]  # training time of the second fit
        assert t[-2] < 1.0 <= t[-1], "stops at the first step past max_time, eval excluded"
    finally:
        trainer.close()


def test_fewer_partitions_than_workers_are_refused_saying_why(gpu_client, small_data):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                              partition_size=1600, batch_size=32)
    try:
        with pytest.raises(ValueError, match=re.escape(
                "the data (1600 samples) is cut into 1 partition(s) by partition_size=1600, "
                "fewer than the 2 workers, so a worker would hold none: give a partition_size "
                "of at most 800, or fewer workers")):
            trainer.fit(train, max_steps=3, progress=False)
    finally:
        trainer.close()


def test_a_loss_that_overflows_stops_with_the_step_named(gpu_client, small_data):
    train, _ = small_data
    model = build_model("mlp", train)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1e30)  # finite weights and data, overflowing logits
    trainer = daskpri.Trainer(model, strategy="uniform", client=gpu_client)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    try:
        with pytest.raises(FloatingPointError, match="at step 0"):
            trainer.fit(train, max_steps=3, progress=False)
        after = list(trainer.model.parameters())
        assert all(bool((a == b).all()) for a, b in zip(after, before, strict=True))
    finally:
        trainer.close()


@pytest.mark.parametrize("strategy", ["uniform", "projection"])
def test_frozen_parameters_stay_as_they_are(gpu_client, small_data, strategy):
    train, _ = small_data
    model = build_model("mlp", train, seed=0)
    first = next(model.parameters())
    first.requires_grad_(False)
    frozen = first.detach().clone()
    others = [p.detach().clone() for p in list(model.parameters())[1:]]
    trainer = daskpri.Trainer(model, strategy=strategy, client=gpu_client, weight_decay=0.1,
                              max_grad_norm=1.0)
    try:
        trainer.fit(train, max_steps=5, progress=False)
    finally:
        trainer.close()
    # no gradient, no weight decay, no momentum for it; the rest trained
    assert torch.equal(first, frozen)
    assert all(not torch.equal(p, q) for p, q in
               zip(list(model.parameters())[1:], others, strict=True))


def test_both_transports_compute_the_same_run(gpu_client, small_data):
    histories = {}
    for transport in ("tasks", "direct"):
        trainer, h = fit(gpu_client, small_data, "projection", steps=12, seed=2,
                         transport=transport)
        histories[transport] = h
        trainer.close()
    a, b = histories["tasks"], histories["direct"]
    np.testing.assert_array_equal(a["selection_digest"], b["selection_digest"])
    np.testing.assert_array_equal(a["loss"], b["loss"])
    with pytest.raises(ValueError, match="transport should be one of 'tasks', 'direct'"):
        daskpri.Trainer(build_model("mlp", small_data[0]), transport="udp")


def test_nonfinite_steps_checkpoint_the_last_good_state_or_are_skipped(
    gpu_client, small_data, tmp_path
):
    from daskpri.training import checkpoint

    train, _ = small_data
    x = train["x"].values.copy()
    x[::40] = 3e37  # finite features whose logits overflow: 1 sample in 40
    poisoned = train.assign(x=(train["x"].dims, x))
    path = tmp_path / "last_good.ckpt"
    t = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                        checkpoint_path=path)
    try:
        with pytest.raises(FloatingPointError, match=r"at step (\d+);.*last good state") as e:
            t.fit(poisoned, max_steps=5, progress=False)
        failed = int(re.search(r"at step (\d+);", str(e.value)).group(1))
        assert f"last good state (step {failed})" in str(e.value)
        assert checkpoint.read(path)["step"] == failed == t.step_
    finally:
        t.close()
    t = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                        batch_size=8, on_nonfinite="skip")
    try:
        h = t.fit(poisoned, max_steps=20, progress=False)
        assert 0 < t.skipped_steps_ < 20 and int(h["skipped"].sum()) == t.skipped_steps_
        assert all(bool(torch.isfinite(p).all()) for p in t.model.parameters())
    finally:
        t.close()


def test_cosine_schedule_decays_the_learning_rate_to_zero(gpu_client, small_data):
    trainer, h = fit(gpu_client, small_data, steps=10, lr_schedule="cosine", schedule_steps=10,
                     learning_rate=0.1)
    expected = [0.05 * (1 + np.cos(np.pi * s / 10)) for s in range(10)]
    np.testing.assert_allclose(h["lr"].values, expected, rtol=1e-12)
    assert h.attrs["lr_schedule"] == "cosine" and h.attrs["setup_time"] > 0
    trainer.close()


def test_a_warmup_rises_to_the_rate_then_the_schedule_decays_over_the_rest(
    gpu_client, small_data
):
    trainer, h = fit(gpu_client, small_data, steps=12, lr_schedule="cosine", schedule_steps=12,
                     warmup_steps=4, learning_rate=0.1)
    rise = [0.1 * (s + 1) / 4 for s in range(4)]
    decay = [0.05 * (1 + np.cos(np.pi * (s - 4) / 8)) for s in range(4, 12)]
    np.testing.assert_allclose(h["lr"].values, rise + decay, rtol=1e-12)
    assert h.attrs["warmup_steps"] == 4
    trainer.close()


def test_a_fit_past_the_end_of_its_schedule_warns(gpu_client, small_data):
    train, _ = small_data
    with daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                         lr_schedule="linear", schedule_steps=6) as trainer:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            trainer.fit(train, max_steps=6, progress=False)  # to the schedule's end: silent
        with pytest.warns(daskpri.DaskpriWarning, match=r"lr_schedule='linear' decays to 0 at "
                          r"step 6 \(schedule_steps\), but this fit runs to step 8: every "
                          r"step past 6 trains at learning rate 0") as record:
            h = trainer.fit(train, max_steps=8, progress=False)
        assert record[0].filename == __file__  # the caller's line, not daskpri's
        assert h["lr"].values[6:].tolist() == [0.0, 0.0]
        with pytest.warns(daskpri.DaskpriWarning, match="but this fit has no max_steps"):
            trainer.fit(train, max_time=0.01, progress=False)


def test_the_default_learning_rate_is_the_optimizers_own(gpu_client, small_data):
    # SGD's from the benchmark, Adam's torch's: one shared 0.05 was Adam's 50 times over
    trainer, h = fit(gpu_client, small_data, steps=2, optimizer="adam")
    trainer.close()
    assert h.attrs["learning_rate"] == 0.001 and h["lr"].values.tolist() == [0.001, 0.001]
    model = torch.nn.Linear(2, 2)
    assert daskpri.Trainer(model).learning_rate == 0.1
    with dask.config.set({"daskpri.trainer.learning-rate": 0.02}):
        assert daskpri.Trainer(model, optimizer="adam").learning_rate == 0.02
        assert daskpri.Trainer(model, learning_rate=0.3).learning_rate == 0.3
    # AdamW: torch's rate and weight decay, unless given
    adamw = daskpri.Trainer(model, optimizer="adamw")
    assert (adamw.learning_rate, adamw.weight_decay) == (0.001, 0.01)
    assert daskpri.Trainer(model, optimizer="adamw", weight_decay=0.0).weight_decay == 0.0
    assert daskpri.Trainer(model, optimizer="adam").weight_decay == 0.0
    with (dask.config.set({"daskpri.trainer.learning-rate": "fast"}),
          pytest.raises(ValueError, match="learning_rate should be a positive finite number, "
                        "but got learning_rate='fast'")):
        daskpri.Trainer(model)


class _Misbehaving(Uniform):
    """A strategy of one's own whose ``select`` breaks the contract as told."""

    name = "misbehaving"

    def __init__(self, how: str = "short", batch_size: int = 8) -> None:
        super().__init__(batch_size=batch_size)
        self.how = how

    def select(self, ctx):
        from daskpri.strategies.base import Selection

        good = super().select(ctx)
        if self.how == "short":
            return good[:1]
        if self.how == "range":
            return [Selection(train=np.array([10**9]))] + good[1:]
        if self.how == "other":
            return [good[1], good[0]]
        return [list(sel.train) for sel in good]


@pytest.mark.parametrize(("how", "message"), [
    ("short", "should return a list of 2 Selections, one for each worker slot, but returned "
              "list of 1"),
    ("range", r"should give sample indices in \[0, 1600\), but slot 0's train holds 1000000000"),
    ("other", "should give each worker slot samples of its own partitions"),
    ("lists", "should return Selections, but slot 0's is a list"),
])
def test_a_strategy_of_ones_own_is_held_to_the_selection_contract(
    gpu_client, small_data, how, message
):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy=_Misbehaving(how),
                              client=gpu_client)
    try:
        with pytest.raises(ValueError, match=f"strategy 'misbehaving': select {message}"):
            trainer.fit(train, max_steps=2, progress=False)
    finally:
        trainer.close()


def test_unequal_shares_of_the_data_are_warned_of_and_the_default_cut_has_none(
    gpu_client, small_data
):
    train, _ = small_data  # 1600 samples
    trainer = daskpri.Trainer(build_model("mlp", train), client=gpu_client, partition_size=500)
    try:
        with pytest.warns(daskpri.DaskpriWarning, match=re.escape(
            "the workers hold unequal shares of the data (1000, 600 samples, cut by "
            "partition_size): each trains a batch a step from its own"
        )) as record:
            trainer.fit(train, max_steps=1, progress=False)
        assert record[0].filename == __file__  # the caller's line, not daskpri's
    finally:
        trainer.close()
    trainer = daskpri.Trainer(build_model("mlp", train), client=gpu_client)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            trainer.fit(train, max_steps=1, progress=False)
    finally:
        trainer.close()


def test_a_copy_of_the_data_goes_on_with_the_run_and_data_changed_in_place_does_not(
    gpu_client, small_data
):
    train, _ = small_data
    mine = train.copy(deep=True)  # the fixture's data is shared: change a copy
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                              seed=3)
    try:
        trainer.fit(mine, max_steps=5, progress=False)
        # a notebook's load cell run again: the same data, another object
        h = trainer.fit(mine.copy(deep=True), max_steps=10, progress=False)
        digests = h["selection_digest"].values
        assert len(set(digests.tolist())) == 10  # steps 5-9 did not replay steps 0-4
        assert int(trainer.table_["version"].max()) == 9
        assert (trainer.table_["version"] <= 4).sum() > 0  # the table of steps 0-4 kept
        mine["x"] = mine["x"] * 0.0  # the same object, other values
        trainer.fit(mine, max_steps=12, progress=False)
        table = trainer.table_
        seen = table.where(table["version"] >= 0, drop=True)
        assert int(seen["version"].min()) >= 10  # a new run's table
        # trained on the zeroed inputs: at each step a loss for each class, nothing else
        n_classes = int(train["y"].max()) + 1
        for version in np.unique(seen["version"]):
            losses = seen.values[seen["version"].values == version]
            assert np.unique(np.round(losses, 4)).size <= n_classes
    finally:
        trainer.close()


def test_the_table_keeps_the_datas_sample_labels(gpu_client, small_data):
    train, _ = small_data
    labelled = train.assign_coords(sample=[f"img-{i}" for i in range(train.sizes["sample"])])
    with daskpri.Trainer(build_model("mlp", train), client=gpu_client) as trainer:
        trainer.fit(labelled, max_steps=2, progress=False)
        table = trainer.table_
        assert table["sample"].values[:2].tolist() == ["img-0", "img-1"]
        hardest = table.idxmax("sample").item()
        assert labelled.sel(sample=hardest)["y"].size == 1  # selects by the data's own labels


def test_the_repr_says_strategy_step_and_cluster(gpu_client, small_data):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", batch_size=32)
    assert repr(trainer) == "<Trainer Uniform(batch_size=None), step 0, no cluster yet>"
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    with trainer:
        trainer.fit(train, max_steps=3, progress=False)
        assert repr(trainer) == (f"<Trainer Uniform(batch_size=None), step 3, 2 worker(s) of "
                                 f"{gpu_client.scheduler.address}>")


def test_a_damaged_chunk_fails_the_fit_at_once_naming_worker_partition_and_store(
    gpu_client, small_data, tmp_path
):
    from daskpri.replicas.worker import UnreadableDataError

    train, _ = small_data
    path = to_store(train.chunk({"sample": 400}), str(tmp_path / "train.zarr"))
    chunks = sorted(p for p in (tmp_path / "train.zarr" / "x").rglob("*") if p.is_file()
                    and not p.name.startswith((".", "zarr")))
    chunks[1].write_bytes(chunks[1].read_bytes()[:20])  # the second chunk, truncated
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no worker taken for lost
            with pytest.raises(UnreadableDataError, match=re.escape(
                "cannot read partition 1 (samples 400-799 of " + path + "): ")):
                trainer.fit(path, max_steps=3, progress=False)
    finally:
        trainer.close()


def test_data_persisted_on_the_cluster_trains_and_writes_as_data_in_memory(
    gpu_client, small_data, tmp_path
):
    # client.persist(ds): its chunks live on the cluster only, where the driver's own
    # threads cannot compute them (they raised "Missing dependency ('xarray-x-...', 0, 0)")
    train, test = small_data
    persisted = gpu_client.persist(train.chunk({"sample": 400}))
    held = gpu_client.persist(test.chunk({"sample": 100}))
    model = build_model("mlp", persisted.drop_attrs())  # its classes read from its labels
    with daskpri.Trainer(model, strategy="loss", client=gpu_client, seed=0) as trainer:
        history = trainer.fit(persisted, eval_data=held, max_steps=1, progress=False)
    assert np.isfinite(history["accuracy"][-1])
    path = to_store(held, str(tmp_path / "test.zarr"))
    written = daskpri.data.open_dataset(path)
    assert written["x"].chunks == held["x"].chunks
    np.testing.assert_array_equal(written["x"].values, test["x"].values)


class _StoreGoesAway(daskpri.Trainer):
    """Deletes the store after the driver opened it, before the workers read it."""

    def _warn_unequal_shares(self, *args):  # in _prepare, before the workers load
        import shutil

        shutil.rmtree(self._store)
        return super()._warn_unequal_shares(*args)


def test_a_store_the_workers_cannot_find_fails_the_fit_at_once(gpu_client, small_data, tmp_path):
    train, _ = small_data
    path = to_store(train.chunk({"sample": 400}), str(tmp_path / "train.zarr"))
    trainer = _StoreGoesAway(build_model("mlp", train), strategy="uniform", client=gpu_client)
    trainer._store = path
    t0 = time.monotonic()
    try:
        with (
            # retried as a lost worker's, it would fail only after this timeout
            dask.config.set({"daskpri.trainer.no-workers-timeout": "600s"}),
            pytest.raises(FileNotFoundError, match=r"^worker \S+ cannot read partition \d+ "
                          r"\(samples .* of " + re.escape(path) + r"\): data names "),
        ):
            trainer.fit(path, max_steps=3, progress=False)
    finally:
        trainer.close()
    assert time.monotonic() - t0 < 120


def test_a_model_that_cannot_run_on_the_data_says_what_it_was_given_and_what_failed(
    small_data
):
    train, _ = small_data
    trainer = daskpri.Trainer(torch.nn.Linear(7, 10), n_workers=1)  # the data has 20 features
    with pytest.raises(ValueError, match=re.escape(
        "the model could not run on two samples of data.x (per-sample shape (20,), float32, on "
        "the CPU): RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )):
        trainer.fit(train, max_steps=1, progress=False)
    trainer.close()
