"""A trainer's life: its cluster and client, fits in the background, stop and close.

Trainers never closed, dropped or closed under a fit; their own cluster or
client; spawned workers and a model class from ``__main__``; settings refused
before a fit's cluster starts.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap
import threading
import time

import dask
import numpy as np
import pytest
import torch
from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model


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
        # a Dask array's values are checked by the workers, as they load the partitions
        x = train["x"].values.copy()
        x[5, 0] = np.nan
        with pytest.raises(ValueError, match=r"^x in partition 0 \(samples 0-799\) should hold "
                           r"finite numbers, but got 1 NaN or infinite value, the first at "
                           r"sample 5$"):
            trainer.fit(train.assign(x=(train["x"].dims, x)).chunk({"sample": 800}),
                        max_steps=5, progress=False)
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
    with pytest.raises(ValueError, match="warmup_steps should be a non-negative integer, but "
                                         "got warmup_steps=-1"):
        daskpri.Trainer(model, warmup_steps=-1)
    with pytest.raises(ValueError, match=r"warmup_steps=10 leaves no step for "
                       r"lr_schedule='cosine' to decay over: it should be less than "
                       r"schedule_steps=10"):
        daskpri.Trainer(model, lr_schedule="cosine", schedule_steps=10, warmup_steps=10)


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


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("trainer.max-retries", -1, "an integer of at least 0"),
    ("trainer.partition-size", "abc", "an integer of at least 1"),
    ("table.histogram-bins", 0, "an integer of at least 1"),
    ("trainer.step-timeout", "abc", "a duration, a number of seconds or a string like '30s'"),
    ("trainer.no-workers-timeout", None, "a duration, a number of seconds or a string like '30s'"),
    ("trainer.probe-timeout", "-1s", "a duration, a number of seconds or a string like '30s'"),
    ("trainer.setup-timeout", "soon", "a duration, a number of seconds or a string like '30s'"),
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


def test_a_trainer_interrupted_as_its_client_starts_is_not_kept_by_the_traceback(
    small_data, monkeypatch
):
    """IPython keeps the last error's traceback: a trainer dropped after it closes its cluster."""
    import multiprocessing.process
    import os
    import signal
    import weakref

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    train, _ = small_data
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", n_workers=1)
    start = multiprocessing.process.BaseProcess.start

    def interrupting(process: multiprocessing.process.BaseProcess) -> None:
        start(process)
        if "Dask Worker" in (process.name or ""):  # Jupyter's stop button, as it starts
            os.kill(os.getpid(), signal.SIGINT)  # (held until the cluster has started)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", interrupting)
    try:
        trainer.client  # noqa: B018
    except KeyboardInterrupt as e:
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
    monkeypatch.undo()
    cluster = trainer._own_cluster
    try:
        assert hasattr(sys, "last_value"), "not interrupted"
        assert cluster is not None and cluster.status.name == "running"  # the trainer's
        dropped = weakref.ref(trainer)
        del trainer  # a notebook's cell made again
        gc.collect()
        assert dropped() is None  # not kept by sys.last_traceback's frames
        deadline = time.monotonic() + 20  # (its cluster closes in a thread)
        while cluster.status.name != "closed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cluster.status.name == "closed"
    finally:
        for name in ("last_type", "last_value", "last_traceback"):
            if hasattr(sys, name):
                delattr(sys, name)
        if cluster is not None:
            cluster.close()
