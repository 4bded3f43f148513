"""The trainer end to end on real LocalClusters."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model


def fit(client, data, strategy="uniform", steps=12, seed=0, **kw):
    train, test = data
    trainer = daskpri.Trainer(
        build_model("mlp", train, seed=seed),
        strategy=strategy,
        client=client,
        seed=seed,
        batch_size=32,
        eval_every=5,
        **kw,
    )
    history = trainer.fit(train, eval_data=test, max_steps=steps, progress=False)
    return trainer, history


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


def test_model_class_defined_in_main_works_on_spawned_workers(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        from distributed import Client, LocalCluster
        import daskpri

        class MyNet(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = torch.nn.Sequential(
                    torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 10))
            def forward(self, x):
                return self.body(x)

        if __name__ == "__main__":
            train, test = daskpri.datasets.load("synthetic", n_samples=1000)
            with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                              dashboard_address="127.0.0.1:0") as cluster, \
                    Client(cluster) as client:
                t = daskpri.Trainer(MyNet(), strategy="length", client=client)
                h = t.fit(train, eval_data=test, max_steps=4, progress=False)
                print("OK", h.sizes["step"], int(h["n_workers"][-1]))
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 4 2" in out.stdout


@pytest.mark.parametrize("cluster", ["user", "own"])
def test_a_trainer_never_closed_exits_without_errors(tmp_path, cluster):
    # At exit distributed closes the clusters before the client: the partitions
    # an unclosed trainer still held were "lost scattered data" (logged as ERROR).
    script = tmp_path / "never_closed.py"
    script.write_text(
        textwrap.dedent(f"""
        import daskpri
        from distributed import Client, LocalCluster
        from daskpri.models import build_model

        if __name__ == "__main__":
            train, _ = daskpri.datasets.load("synthetic", n_samples=400)
            client = None
            if {cluster!r} == "user":
                cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
                client = Client(cluster)
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                      client=client, n_workers=2, batch_size=32)
            trainer.fit(train, max_steps=3, progress=False)
            print("fitted")
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and "fitted" in out.stdout, out.stderr[-3000:]
    assert "ERROR" not in out.stderr, out.stderr[-3000:]


def test_fit_survives_a_killed_worker(small_data):
    train, test = small_data
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        trainer = daskpri.Trainer(
            build_model("mlp", train),
            strategy="projection",
            client=client,
            batch_size=32,
            renew=0.05,
        )
        pids = client.run(os.getpid)
        victim = sorted(pids)[1]
        killed = threading.Event()

        def killer():
            while trainer.step_ < 8:
                time.sleep(0.05)
            os.kill(pids[victim], signal.SIGKILL)
            killed.set()

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            h = trainer.fit(train, eval_data=test, max_steps=80, progress=False)
            assert killed.is_set()
            assert h.sizes["step"] == 80
            assert int(h["n_workers"].min()) in (2, 3)
            table = trainer.table_
            assert np.isfinite(table.values).all(), "every sample has a finite priority"
            assert float(h["accuracy"].dropna("step")[-1]) > 0.5
        finally:
            trainer.close()


# selective-backprop without its warmup epoch, whose plain steps forward fewer
# samples than its selective ones: every step forwards as many a worker
@pytest.mark.parametrize("strategy, options", [("uniform", {}),
                                               ("selective-backprop", {"warmup": 0})])
def test_workers_that_join_take_partitions_up_to_n_workers(small_data, caplog, strategy,
                                                           options):
    train, _ = small_data
    with (
        dask.config.set({"daskpri.trainer.rescan-interval": "0s"}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        # 8 partitions: enough for every worker
        grows = daskpri.Trainer(build_model("mlp", train), strategy=strategy, client=client,
                                batch_size=16, partition_size=200, **options)
        capped = daskpri.Trainer(build_model("mlp", train), strategy=strategy, client=client,
                                 batch_size=16, partition_size=200, n_workers=1, **options)
        try:
            capped.fit(train, max_steps=4, progress=False)
            with caplog.at_level(logging.WARNING, logger="daskpri"):
                running = grows.fit_in_background(train, max_steps=100_000, progress=False)
                deadline = time.monotonic() + 60
                while grows.step_ < 4:
                    assert not running.done(), running.result()  # it failed before step 4
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                cluster.scale(3)  # while it trains
                deadline = time.monotonic() + 60
                while grows.history_["n_workers"].values[-1] < 3:
                    assert time.monotonic() < deadline, "the workers that joined were not used"
                    time.sleep(0.05)
                grows.stop()
                h = running.result(timeout=60)
            n = h["n_workers"].values
            assert n[0] == 1 and n[-1] == 3 and (np.diff(n) >= 0).all()
            grew = int(np.argmax(n == 3))
            # every worker processes its share on its own partitions from then on
            per_step = np.diff(h["samples"].values)
            assert set(per_step[grew:].tolist()) == {3 * per_step[0]}
            assert set(grows._deployment.owner_addr) == set(
                client.scheduler_info(n_workers=-1)["workers"])
            assert re.search(r"step \d+: [12] worker\(s\) joined the run .* it goes on with 3",
                             caplog.text)
            assert np.isfinite(h["loss"]).all()
            h = capped.fit(train, max_steps=8, progress=False)  # on the grown cluster
            assert h["n_workers"].values.tolist() == [1] * 8  # n_workers=1 asked for one
        finally:
            grows.close()
            capped.close()


def test_a_killed_worker_that_its_nanny_restarts_is_taken_back(small_data, caplog):
    train, _ = small_data
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        # the next fit looks at the cluster before its first round, whatever the interval
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  batch_size=16)
        try:
            trainer.fit(train, max_steps=4, progress=False)
            before = set(client.scheduler_info()["workers"])
            pids = client.run(os.getpid)
            os.kill(pids[sorted(pids)[1]], signal.SIGKILL)
            deadline = time.monotonic() + 60
            while True:  # the nanny starts a new worker process, under a new address
                now = set(client.scheduler_info(n_workers=-1)["workers"])
                if len(now) == 2 and now != before:
                    break
                assert time.monotonic() < deadline, "the nanny did not restart the worker"
                time.sleep(0.1)
            with caplog.at_level(logging.WARNING, logger="daskpri"):
                h = trainer.fit(train, max_steps=8, progress=False)
            assert h.sizes["step"] == 8
            assert h["n_workers"].values.tolist()[-1] == 2
            assert set(trainer._deployment.owner_addr) == now
            # the scheduler said the worker had gone before the run called it
            # (a call would wait for the 30 s connect timeout, then fail)
            [dead] = before - now
            assert f"step 4: worker(s) {dead} left the cluster; their partitions moved" in (
                caplog.text)
            assert "a worker was lost" not in caplog.text
        finally:
            trainer.close()


@pytest.mark.timeout(120)
def test_a_call_to_a_worker_that_died_between_steps_fails_once_the_scheduler_drops_it():
    """Not after the connect timeout, which distributed spends retrying a refused connection."""
    from daskpri.training.placement import cluster_workers
    from daskpri.training.recovery import LOST
    from daskpri.training.transport import WorkersGone, run_direct

    with (
        dask.config.set({"distributed.comm.timeouts.connect": "600s"}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
    ):
        [(dead, pid)] = client.run(os.getpid).items()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while dead in cluster_workers(client):
            assert time.monotonic() < deadline, "the scheduler kept the dead worker"
            time.sleep(0.1)
        with pytest.raises(WorkersGone) as info:
            run_direct(client, [(dead, ())], "daskpri-no-such-plugin", timeout=300)
        assert info.value.addresses == [dead]
        assert str(info.value) == f"worker(s) {dead} left the cluster during the step"
        assert isinstance(info.value, LOST)  # a step re-planned on the workers left


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


def test_trainer_uses_its_own_client_not_the_default(small_data):
    train, test = small_data
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
            h = trainer.fit(train, max_steps=3, max_time=60, progress=False)
            assert h.sizes["step"] == 3 and trainer.client is client
            trainer.close()
        finally:
            client.close()


def test_max_time_counts_training_time(gpu_client, small_data):
    trainer, _ = fit(gpu_client, small_data, "uniform", steps=1)
    try:
        h = trainer.fit(small_data[0], eval_data=small_data[1], max_time=1.0, progress=False)
        t = h["time"].values - h["time"].values[0]  # training time of the second fit
        assert t[-2] < 1.0 <= t[-1], "stops at the first step past max_time, eval excluded"
    finally:
        trainer.close()


def test_fit_on_new_data_rebuilds_the_table_on_the_same_cluster(small_data):
    train, test = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="loss", n_workers=1)
    try:
        trainer.fit(train, max_steps=2, progress=False)
        client = trainer.client
        # the trainer's own client is not made the process's default: a user's later
        # dask.compute() does not go to the training workers
        from distributed.client import _get_global_client

        assert _get_global_client() is not client
        smaller = train.isel(sample=slice(0, 500))
        trainer.fit(smaller, max_steps=4, progress=False)
        assert trainer.client is client and client.status == "running"
        assert trainer.table_.sizes["sample"] == 500
        addr = client.scheduler.address
        assert addr.startswith("tcp://127.0.0.1:")
    finally:
        trainer.close()
    assert client.status == "closed"


def test_a_fit_that_fails_leaves_the_trainer_able_to_fit_and_its_last_run_kept(
    gpu_client, small_data
):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                              batch_size=32)
    try:
        # x's values are checked by the workers, as they load the partitions
        x = train["x"].values.copy()
        x[5, 0] = np.nan
        with pytest.raises(ValueError, match=r"^x in partition 0 \(samples 0-799\) should hold "
                           r"finite numbers, but got 1 NaN or infinite value, the first at "
                           r"sample 5$"):
            trainer.fit(train.assign(x=(train["x"].dims, x)), max_steps=5, progress=False)
        gc.collect()
        # the erred load of partition 0 is not handed to this fit, under its key
        trainer.fit(train, max_steps=5, progress=False)
        assert trainer.step_ == 5
        # labels out of range, and data the model cannot run on, are refused on the
        # driver before the last run is let go
        for bad, match in [
            (train.assign(y=train["y"] + 5), r"^y in data should be in \[0, 10\), but got 1[0-4]"),
            (train.isel(feature=slice(0, 10)), "^the model could not run on two samples"),
        ]:
            with pytest.raises(ValueError, match=match):
                trainer.fit(bad, max_steps=30, progress=False)
            assert trainer.step_ == 5 and trainer.table_.sizes["sample"] == train.sizes["sample"]
    finally:
        trainer.close()
    loads = f"daskpri-load-{trainer.run_id}"
    left = gpu_client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if str(k).startswith(loads)])
    assert left == []


def test_save_and_table_after_close_say_close_let_the_run_go(gpu_client, small_data, tmp_path):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    with pytest.raises(RuntimeError, match=r"^nothing to save yet: call fit first$"):
        trainer.save(tmp_path / "none.ckpt")
    trainer.fit(train, max_steps=3, progress=False)
    path = trainer.save(tmp_path / "run.ckpt")
    trainer.close()
    with pytest.raises(RuntimeError, match=r"^nothing to save: close\(\) released the run's "
                       r"table at step 3; save before closing"):
        trainer.save(tmp_path / "late.ckpt")
    with pytest.raises(RuntimeError, match=r"^no table_: close\(\) released the run's table at "
                       r"step 3"):
        _ = trainer.table_
    with pytest.raises(TypeError, match=r"^model should be a torch.nn.Module of the checkpoint's "
                       r"architecture, but got str 'mlp'$"):
        daskpri.Trainer.resume(path, model="mlp", client=gpu_client)  # type: ignore[arg-type]


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


def test_fit_in_background_returns_a_future_of_the_history(gpu_client, small_data):
    train, test = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        future = trainer.fit_in_background(train, eval_data=test, max_steps=150)
        with pytest.raises(RuntimeError, match=r"a fit is already running \(fit_in_background"):
            trainer.fit_in_background(train, max_steps=30)
        # nor a fit of this thread: two loops would step one model
        with pytest.raises(RuntimeError, match="a fit is already running"):
            trainer.fit(train, max_steps=300, progress=False)
        with pytest.raises(TypeError, match="unexpected keyword argument 'max_step'"):
            trainer.fit_in_background(train, max_step=3)
        history = future.result(timeout=120)
        assert history.sizes["step"] == 150 and trainer.step_ == 150
        again = trainer.fit_in_background(train, max_steps=152).result(timeout=120)
        assert again.sizes["step"] == 152
    finally:
        trainer.close()


def test_close_stops_a_background_fit_and_its_future_keeps_the_history(small_data):
    train, test = small_data
    with daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1) as trainer:
        future = trainer.fit_in_background(train, eval_data=test, max_time=600)
        deadline = time.monotonic() + 60
        while trainer.step_ < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer.step_ >= 3, "the background fit made no steps"
    # leaving the block closed the trainer (and its cluster) after the fit had ended
    history = future.result(timeout=0)
    assert history.sizes["step"] == trainer.step_ >= 3


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


def test_stop_ends_a_background_fit_with_its_history_and_allows_another(
    gpu_client, small_data
):
    train, test = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        future = trainer.fit_in_background(train, eval_data=test, max_time=600)
        deadline = time.monotonic() + 60
        while trainer.step_ < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer.step_ >= 5, "the background fit made no steps"
        trainer.stop()
        history = future.result(timeout=60)  # within a step, not the 600 s budget
        assert history.sizes["step"] == trainer.step_ >= 5
        assert float(history["time"][-1]) < 600
        # the last step is evaluated, as at the end of any fit
        assert np.isfinite(float(history["accuracy"][-1]))
        # a stop is spent by the fit it ended: the next fit runs to its end
        again = trainer.fit(train, max_steps=trainer.step_ + 3, progress=False)
        assert again.sizes["step"] == history.sizes["step"] + 3
        # a stop asked between fits ends the next one before its first step
        trainer.stop()
        assert trainer.fit(train, max_steps=trainer.step_ + 3, progress=False).sizes[
            "step"] == again.sizes["step"]
    finally:
        trainer.close()


def test_a_background_fit_is_read_but_not_saved_from_another_thread(
    gpu_client, small_data, tmp_path
):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        future = trainer.fit_in_background(train, max_time=600)
        deadline = time.monotonic() + 60
        while trainer.step_ < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trainer.step_ >= 3, "the background fit made no steps"
        assert trainer.table_.sizes["sample"] == train.sizes["sample"]
        with pytest.raises(RuntimeError, match=r"save\(\) while a fit runs in another thread"):
            trainer.save(tmp_path / "run.ckpt")
        trainer.stop()
        history = future.result(timeout=60)
        assert trainer.save(tmp_path / "run.ckpt") == str(tmp_path / "run.ckpt")
        # every step's record reached the table once, reads from this thread or not
        steps = [m["step"] for m in trainer._table.metrics()]
        assert steps == history["step"].values.tolist()
    finally:
        trainer.close()


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


class _HangsOnce(daskpri.strategies.Uniform):
    """``uniform``, except that one worker hangs once, on its 4th step.

    The first worker there creates ``marker`` (atomically) and sleeps; every
    other computation runs as usual.
    """

    name = "hangs-once"

    def __init__(self, marker: str, hang: float) -> None:
        super().__init__()
        self.marker, self.hang = marker, hang

    def compute(self, replica, batch):
        _CALLS[0] += 1
        if _CALLS[0] == 5:  # the warm-up is the first
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
                time.sleep(self.hang)
            except FileExistsError:
                pass
        return super().compute(replica, batch)


_CALLS = [0]


@pytest.mark.parametrize("transport", ["direct", "tasks"])
def test_a_stuck_worker_is_left_behind_after_the_step_timeout(small_data, tmp_path, transport):
    import dask

    train, test = small_data
    strategy = _HangsOnce(str(tmp_path / "hung"), hang=8.0)
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({"daskpri.trainer.step-timeout": "1s"}),
    ):
        trainer = daskpri.Trainer(
            build_model("mlp", train), strategy=strategy, client=client, batch_size=32,
            transport=transport,
        )
        with pytest.warns(daskpri.DaskpriWarning, match=r"step 3: worker\(s\) tcp://127\.0\.0\.1:"
                          r"\d+ did not finish .* within 1 s .*training goes on without them"):
            h = trainer.fit(train, eval_data=test, max_steps=12, progress=False)
        trainer.close()
    assert (tmp_path / "hung").exists()
    assert h.sizes["step"] == 12
    assert h["n_workers"].values[:3].tolist() == [2, 2, 2]
    assert set(h["n_workers"].values[3:].tolist()) == {1}
    assert np.isfinite(h["loss"]).all()


def test_cosine_schedule_decays_the_learning_rate_to_zero(gpu_client, small_data):
    trainer, h = fit(gpu_client, small_data, steps=10, lr_schedule="cosine", schedule_steps=10,
                     learning_rate=0.1)
    expected = [0.05 * (1 + np.cos(np.pi * s / 10)) for s in range(10)]
    np.testing.assert_allclose(h["lr"].values, expected, rtol=1e-12)
    assert h.attrs["lr_schedule"] == "cosine" and h.attrs["setup_time"] > 0
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


def test_schedule_parameters_are_checked():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="lr_schedule should be one of 'constant', 'cosine', "
                       "'linear', but got 'step'"):
        daskpri.Trainer(model, lr_schedule="step")
    with pytest.raises(ValueError, match=r"schedule_steps steps, which should be a positive "
                       r"integer, but got schedule_steps=None"):
        daskpri.Trainer(model, lr_schedule="cosine")
    with pytest.raises(ValueError, match="but lr_schedule='constant'"):
        daskpri.Trainer(model, schedule_steps=10)


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
    with (dask.config.set({"daskpri.trainer.learning-rate": "fast"}),
          pytest.raises(ValueError, match="learning_rate should be a positive finite number, "
                        "but got learning_rate='fast'")):
        daskpri.Trainer(model)


def test_numbers_of_numpy_types_are_taken_and_other_bad_budgets_refused_early(small_data):
    from distributed import Client as _Client

    model = torch.nn.Linear(20, 10)
    trainer = daskpri.Trainer(model, learning_rate=np.float32(0.05), max_grad_norm=np.float64(1))
    assert trainer.learning_rate == pytest.approx(0.05) and trainer.max_grad_norm == 1.0
    train, test = small_data
    for bad in ("0.9", True, 2):  # before any cluster starts
        with pytest.raises(ValueError, match=r"target_accuracy should be a number in \(0, 1\]"):
            trainer.fit(train, eval_data=test, max_steps=3, target_accuracy=bad)
    assert trainer._client is None
    with LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster:
        client = _Client(cluster)
        client.close()
        with pytest.raises(ValueError, match="client is closed: give a running"):
            daskpri.Trainer(model, client=client)


class _Misbehaving(daskpri.strategies.uniform.Uniform):
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


def test_two_threads_asking_for_the_client_start_one_cluster(small_data, monkeypatch):
    """A background fit and the caller's dashboard() both reach for it at once."""
    import daskpri.training._cleanup as cleanup  # (where the trainer starts its cluster)

    started = []

    def slow_local_cluster(*args, **kwargs):
        started.append(threading.get_ident())
        time.sleep(0.5)  # the other thread comes in meanwhile
        return local_cluster(*args, **kwargs)

    local_cluster = cleanup.local_cluster
    monkeypatch.setattr(cleanup, "local_cluster", slow_local_cluster)
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), n_workers=1)
    clients = []
    threads = [threading.Thread(target=lambda: clients.append(trainer.client)) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert len(started) == 1 and len(clients) == 2 and clients[0] is clients[1]
    finally:
        trainer.close()


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("trainer.max-retries", -1, "an integer of at least 0"),
    ("trainer.partition-size", "abc", "an integer of at least 1"),
    ("table.histogram-bins", 0, "an integer of at least 1"),
    ("trainer.step-timeout", "abc", "a duration, a number of seconds or a string like '30s'"),
    ("trainer.no-workers-timeout", None, "a duration, a number of seconds or a string like '30s'"),
])
def test_a_bad_config_value_stops_a_fit_before_its_cluster_starts(small_data, key, value,
                                                                   allowed):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), n_workers=1)
    with (dask.config.set({f"daskpri.{key}": value}),
          pytest.raises(ValueError, match=re.escape(
              f"daskpri.{key} should be {allowed}, but got {value!r} (set it with "
              f"dask.config.set("))):
        trainer.fit(train, max_steps=1, progress=False)
    assert trainer._own_cluster is None
    trainer.close()


def test_close_drops_the_replicas_from_the_workers_even_when_closing_the_table_fails(
    gpu_client, small_data
):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), client=gpu_client)
    trainer.fit(train, max_steps=2, progress=False)
    name = trainer._plugin.name

    def plugins(dask_worker):
        return list(dask_worker.plugins)

    assert all(name in p for p in gpu_client.run(plugins).values())
    # closing the table fails (the scheduler runs in this process, and reads this)
    with dask.config.set({"daskpri.table.keep-closed": -1}):
        trainer.close()
    assert not any(name in p for p in gpu_client.run(plugins).values())


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


def test_workers_of_a_cluster_preloading_worker_signals_outlive_an_interrupt():
    """As the README and notebooks start theirs: Jupyter's interrupt reaches the workers."""
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0", preload=["daskpri.training.worker_signals"])
        as cluster,
        Client(cluster) as client,
    ):
        [pid] = client.run(os.getpid).values()
        os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert list(client.run(os.getpid).values()) == [pid]


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


def test_a_trainer_dropped_without_close_leaves_nothing_in_the_cluster(gpu_client, small_data):
    """A notebook's fit cell run again drops the last trainer: its run is closed."""
    import gc

    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), client=gpu_client)
    trainer.fit(train, max_steps=2, progress=False)
    run, name = trainer.run_id, trainer._plugin.name

    def runs(dask_scheduler):
        return {r: t.closed for r, t in dask_scheduler.plugins["daskpri"].runs.items()}

    def plugins(dask_worker):
        return list(dask_worker.plugins)

    assert gpu_client.run_on_scheduler(runs)[run] is False
    del trainer
    gc.collect()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        closed = gpu_client.run_on_scheduler(runs).get(run, True)
        left = [p for p in gpu_client.run(plugins).values() if name in p]
        if closed and not left:
            break
        time.sleep(0.1)
    assert closed and not left


def test_a_closed_client_stops_fit_and_table_with_a_message_saying_so(small_data):
    train, _ = small_data
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster:
        client = Client(cluster)
        trainer = daskpri.Trainer(build_model("mlp", train), client=client)
        trainer.fit(train, max_steps=1, progress=False)
        client.close()
        for call in (lambda: trainer.fit(train, max_steps=2, progress=False),
                     lambda: trainer.table_):
            with pytest.raises(RuntimeError, match=r"^the trainer's client is closed: the "
                               r"run's cluster is out of reach"):
                call()
        trainer.close()  # nothing left to release, no error


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


def test_a_fit_after_close_says_it_starts_a_new_run_from_the_weights(gpu_client, small_data):
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client,
                              batch_size=16)
    try:
        trainer.fit(train, max_steps=2, progress=False)
        trainer.close()
        with pytest.warns(daskpri.DaskpriWarning, match=re.escape(
                "this trainer was closed at step 2: this fit sets up a new run from the model's "
                "weights, its optimizer state and priorities afresh")):
            history = trainer.fit(train, max_steps=4, progress=False)
        assert history.sizes["step"] == 4 and trainer.step_ == 4
    finally:
        trainer.close()
