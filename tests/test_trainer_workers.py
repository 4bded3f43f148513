"""The trainer on workers that die, join, restart or hang during a fit.

Each test starts a LocalCluster of its own (its workers are killed, added or
stopped), apart from the session's shared one.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time

import dask
import numpy as np
import pytest
from _fits import fit_until_step, local_cluster, mlp_trainer, wait_while_fitting

import daskpri
from daskpri.strategies import Uniform  # (`daskpri` loads it only once it is used)


def test_fit_survives_a_killed_worker(small_data):
    train, test = small_data
    with (
        local_cluster(3) as (_, client),
        mlp_trainer(client, train, strategy="projection", batch_size=32, renew=0.05) as trainer,
    ):
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
        h = trainer.fit(train, eval_data=test, max_steps=80, progress=False)
        assert killed.is_set()
        assert h.sizes["step"] == 80
        assert int(h["n_workers"].min()) in (2, 3)
        table = trainer.table_
        assert np.isfinite(table.values).all(), "every sample has a finite priority"
        assert float(h["accuracy"].dropna("step")[-1]) > 0.5


# selective-backprop without its warmup epoch, whose plain steps forward fewer
# samples than its selective ones: every step forwards as many a worker
@pytest.mark.parametrize("strategy, options", [("uniform", {}),
                                               ("selective-backprop", {"warmup": 0})])
def test_workers_that_join_take_partitions_up_to_n_workers(small_data, caplog, strategy,
                                                           options):
    train, _ = small_data
    # 8 partitions: enough for every worker
    kwargs = dict(strategy=strategy, batch_size=16, partition_size=200, **options)
    with (
        dask.config.set({"daskpri.trainer.rescan-interval": "0s"}),
        local_cluster(1) as (cluster, client),
        mlp_trainer(client, train, **kwargs) as grows,
        mlp_trainer(client, train, n_workers=1, **kwargs) as capped,
    ):
        capped.fit(train, max_steps=4, progress=False)
        with caplog.at_level(logging.WARNING, logger="daskpri"):
            running = fit_until_step(grows, train, step=4)  # (failing before step 4 fails)
            cluster.scale(3)  # while it trains
            wait_while_fitting(lambda: grows.history_["n_workers"].values[-1] >= 3,
                               "the workers that joined were not used", running, 60)
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


def test_a_killed_worker_that_its_nanny_restarts_is_taken_back(small_data, caplog):
    train, _ = small_data
    # the next fit looks at the cluster before its first round, whatever the interval
    with local_cluster(2) as (_, client), mlp_trainer(client, train, batch_size=16) as trainer:
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


@pytest.mark.timeout(120)
def test_a_call_to_a_worker_that_died_between_steps_fails_once_the_scheduler_drops_it():
    """Not after the connect timeout, which distributed spends retrying a refused connection."""
    from daskpri.training.placement import cluster_workers
    from daskpri.training.recovery import LOST
    from daskpri.training.transport import WorkersGone, run_direct

    with (
        dask.config.set({"distributed.comm.timeouts.connect": "600s"}),
        local_cluster(1) as (_, client),
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


class _HangsOnce(Uniform):
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
    train, test = small_data
    strategy = _HangsOnce(str(tmp_path / "hung"), hang=8.0)
    with (
        local_cluster(2) as (_, client),
        dask.config.set({"daskpri.trainer.step-timeout": "1s"}),
        mlp_trainer(client, train, strategy=strategy, batch_size=32,
                    transport=transport) as trainer,
    ):
        with pytest.warns(daskpri.DaskpriWarning, match=r"step 3: worker\(s\) tcp://127\.0\.0\.1:"
                          r"\d+ did not finish .* within 1 s .*training goes on without them"):
            h = trainer.fit(train, eval_data=test, max_steps=12, progress=False)
    assert (tmp_path / "hung").exists()
    assert h.sizes["step"] == 12
    assert h["n_workers"].values[:3].tolist() == [2, 2, 2]
    assert set(h["n_workers"].values[3:].tolist()) == {1}
    assert np.isfinite(h["loss"]).all()


def test_workers_of_a_cluster_preloading_worker_signals_outlive_an_interrupt():
    """As the README and notebooks start theirs: Jupyter's interrupt reaches the workers."""
    with local_cluster(1, preload=["daskpri.training.worker_signals"]) as (_, client):
        [pid] = client.run(os.getpid).values()
        os.kill(pid, signal.SIGINT)
        time.sleep(1.0)
        assert list(client.run(os.getpid).values()) == [pid]
