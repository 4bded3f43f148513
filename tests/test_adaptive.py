"""A fit on an adaptive cluster (``cluster.adapt()``) is work: its workers stay until it ends.

Its steps are RPCs from the driver (or brief tasks), so the scheduler finds
its workers idle between steps: Dask's ``Adaptive`` would retire them
mid-fit. The table's scheduler plugin holds them through
``SchedulerPlugin.valid_workers_downscaling`` while the fit runs
(``daskpri.trainer.hold-workers``), and lets them go when it ends; the
fit's steps count as the scheduler's activity, against its idle timeout.
"""

from __future__ import annotations

import logging
import re
import time

import dask
import torch
from _fits import fit_until_step, local_cluster, mlp_trainer
from _fits import wait_while_fitting as _wait
from distributed import metrics

import daskpri


def shown_workers(client, run: str) -> int:
    """The workers the /daskpri page's status gives run ``run`` now."""

    def snapshot(dask_scheduler) -> int:
        from daskpri.dashboard.snapshot import snapshot_from_run

        return snapshot_from_run(dask_scheduler.plugins["daskpri"].runs[run])["n_workers"]

    return client.run_on_scheduler(snapshot)


def test_an_adaptive_cluster_keeps_a_fits_workers_until_the_fit_ends(small_data, caplog):
    train, _ = small_data
    with (
        # the run looks for workers that joined before each step
        dask.config.set({"daskpri.trainer.rescan-interval": "0s"}),
        local_cluster(2, processes=False) as (cluster, client),
        mlp_trainer(client, train, batch_size=16, partition_size=100) as trainer,
    ):
        running = fit_until_step(trainer, train)
        # workers that join the run mid-fit are held too (two: Dask keeps the last
        # idle worker that holds data, which a lone one would be)
        cluster.scale(4)
        _wait(lambda: trainer.history_["n_workers"].values[-1] == 4,
              "the run did not take the workers that joined", running)
        assert shown_workers(client, trainer.run_id) == 4  # the dashboard's, not the first 2
        # as Adaptive checks every 50 ms, it would retire 3 workers within 0.2 s
        adaptive = cluster.adapt(minimum=1, maximum=4, interval="50ms", wait_count=2)
        before, t_end = trainer.step_, time.monotonic() + 1.0
        while time.monotonic() < t_end:
            assert not running.done(), running.result()
            assert len(cluster.scheduler.workers) == 4, adaptive.log
            time.sleep(0.02)
        assert trainer.step_ > before  # it trained meanwhile
        assert not [r for _, r in adaptive.log if r["status"] == "down"], adaptive.log
        trainer.stop()
        assert running.result(timeout=60)["n_workers"].values[-1] == 4
        # the fit over (the trainer still open), they are idle workers to retire
        # (the cluster's own count: it drops a worker after the scheduler does)
        _wait(lambda: len(cluster.scheduler.workers) == len(cluster.worker_spec) == 1,
              "the cluster kept its workers after the fit", None, timeout=10)

        # not held: the cluster scales down under a running fit, which goes on
        cluster.adapt(minimum=3, maximum=3, interval="50ms")  # this adaptive in its place
        client.wait_for_workers(3, timeout=30)
        caplog.clear()
        with (
            dask.config.set({"daskpri.trainer.hold-workers": False}),
            caplog.at_level(logging.WARNING, logger="daskpri"),
        ):
            n = trainer.history_.sizes["step"]
            running = trainer.fit_in_background(train, max_steps=100_000, progress=False)
            # the fit's first round takes the workers that joined
            _wait(lambda: trainer.history_["n_workers"].values[n:].tolist()[-1:] == [3],
                  "the fit did not take the workers that joined", running)
            adaptive = cluster.adapt(minimum=1, maximum=3, interval="50ms", wait_count=2)
            _wait(lambda: trainer.history_["n_workers"].values[-1] == 1,
                  "the workers were not retired", running)
            assert shown_workers(client, trainer.run_id) == 1
            trainer.stop()
            running.result(timeout=60)
        assert re.search(r"step \d+: worker\(s\) .* retired; their partitions moved",
                         caplog.text)


def test_a_fits_steps_keep_a_scheduler_with_an_idle_timeout_open(small_data):
    train, _ = small_data
    with (
        # Dask's distributed.scheduler.idle-timeout (dask-gateway and Coiled have theirs):
        # the steps' RPCs are no tasks, and it would close itself 2 s into the fit (0.5 s
        # closed it on a loaded machine before the client had connected)
        local_cluster(1, processes=False,
                      scheduler_kwargs={"idle_timeout": "2s"}) as (cluster, client),
        mlp_trainer(client, train, batch_size=16, partition_size=100) as trainer,
    ):
        history = trainer.fit(train, max_time=3.5, progress=False)
        assert cluster.scheduler.status.name == "running"
        assert history.sizes["step"] > 10


class _SlowToLoad(torch.nn.Module):
    """A linear model whose copy takes ``delay`` seconds to unpickle, as large weights do."""

    def __init__(self, n_features: int, n_classes: int, delay: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(n_features, n_classes)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))

    def __setstate__(self, state: dict) -> None:
        time.sleep(state["delay"])
        super().__setstate__(state)


def test_an_adaptive_cluster_at_zero_keeps_the_worker_it_started_through_a_slow_set_up(
    small_data
):
    """The task a waiting fit kept pending holds its result, and so its worker, until the
    run is set up: a replica that loads slowly leaves the worker idle, with no data. Once
    the fit is over, the cluster goes back to zero."""
    train, _ = small_data
    model = _SlowToLoad(int(train["x"].shape[1]), int(train["y"].max()) + 1, delay=0.3)
    with (
        dask.config.set({"daskpri.trainer.no-workers-timeout": "20s"}),
        local_cluster(0) as (cluster, client),
    ):
        # it would retire an idle worker holding no data within 0.1 s
        adaptive = cluster.adapt(minimum=0, maximum=1, interval="100ms", wait_count=1)
        with daskpri.Trainer(model, strategy="uniform", client=client,
                             batch_size=16) as trainer:
            history = trainer.fit(train, max_steps=2, progress=False)
            ended = metrics.time()  # the clock of Adaptive's log
            assert trainer.step_ == 2 and history.sizes["worker"] == 1
        # one worker started and kept through the set-up; once the fit is over, nothing
        # holds it, and Adaptive may retire it before these lines run
        log = list(adaptive.log)
        assert [r["status"] for _, r in log if r["status"] == "up"] == ["up"], log
        assert all(t >= ended for t, r in log if r["status"] == "down"), (ended, log)
        # the fit over, nothing of it is left: an idle cluster goes back to zero
        _wait(lambda: not cluster.scheduler.workers and not cluster.scheduler.tasks,
              "the idle cluster did not go back to zero workers", None)


def test_a_fit_goes_on_on_the_worker_an_adaptive_cluster_at_zero_starts_after_its_own_left(
    small_data, caplog
):
    """The re-plan after the run's workers left keeps a task pending as it waits for one, as
    the fit's start does: Dask's Adaptive starts workers for tasks (none for the steps' RPCs),
    and the fit would fail after daskpri.trainer.no-workers-timeout."""
    train, _ = small_data
    with (
        dask.config.set({"daskpri.trainer.no-workers-timeout": "10s",
                         "daskpri.trainer.rescan-interval": "0s"}),
        local_cluster(0, processes=False) as (cluster, client),
    ):
        adaptive = cluster.adapt(minimum=0, maximum=1, interval="100ms", wait_count=1)
        with mlp_trainer(client, train, batch_size=16, partition_size=100) as trainer:
            running = fit_until_step(trainer, train)
            first, step = set(cluster.scheduler.workers), trainer.step_
            with caplog.at_level(logging.WARNING, logger="daskpri"):
                # its worker retired despite the fit's hold, its data lost (Adaptive stopped
                # meanwhile: it would start another for the held worker as it retires)
                adaptive.stop()
                cluster.scale(0)
                # (a minute: the retirement took over 20 s once, in a suite on a loaded
                # machine, the fit still running)
                _wait(lambda: not cluster.scheduler.workers, "the worker was not retired",
                      running, timeout=60)
                adaptive = cluster.adapt(minimum=0, maximum=1, interval="100ms", wait_count=1)

                def on_another() -> bool:
                    now = set(cluster.scheduler.workers)
                    return bool(now) and not now & first and trainer.step_ >= step + 3

                _wait(on_another, "the fit did not go on on a new worker", running)
            trainer.stop()
            assert running.result(timeout=60)["n_workers"].values[-1] == 1
        assert "partitions moved, the run goes on with 1" in caplog.text
        assert [r["status"] for _, r in adaptive.log] == ["up"], adaptive.log
        # the task kept pending is released once the data is placed again
        assert not [k for k in cluster.scheduler.tasks if "waiting-for-workers" in str(k)]
