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
from _fits import fit_until_step, local_cluster, mlp_trainer
from _fits import wait_while_fitting as _wait


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
            trainer.stop()
            running.result(timeout=60)
        assert re.search(r"step \d+: worker\(s\) .* retired; their partitions moved",
                         caplog.text)


def test_a_fits_steps_keep_a_scheduler_with_an_idle_timeout_open(small_data):
    train, _ = small_data
    with (
        # Dask's distributed.scheduler.idle-timeout (dask-gateway and Coiled have theirs):
        # the steps' RPCs are no tasks, and it would close itself 0.5 s into the fit
        local_cluster(1, processes=False,
                      scheduler_kwargs={"idle_timeout": "0.5s"}) as (cluster, client),
        mlp_trainer(client, train, batch_size=16, partition_size=100) as trainer,
    ):
        history = trainer.fit(train, max_time=1.5, progress=False)
        assert cluster.scheduler.status.name == "running"
        assert history.sizes["step"] > 10
