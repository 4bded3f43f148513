"""A fit that starts before the cluster has workers for it waits for them, as Dask's work does.

Up to ``daskpri.trainer.no-workers-timeout``, saying once what it waits for;
then it fails saying it waited. An adaptive cluster at zero workers starts
one for the task the waiting fit keeps pending (test_adaptive.py), and no
more than that one.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import dask
import pytest
from _fits import local_cluster, mlp_trainer
from distributed import Client, LocalCluster

import daskpri
from daskpri.cli._interrupt import _interruptible
from daskpri.models import build_model


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.fixture(scope="module")
def no_workers() -> Iterator[tuple[LocalCluster, Client]]:
    """A LocalCluster of no workers (its tests add none), and its client."""
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        yield cluster, client


def test_a_fit_started_before_any_worker_waits_for_one_and_trains_on_it(small_data, caplog):
    train, _ = small_data
    with (
        local_cluster(0, processes=False) as (cluster, client),
        mlp_trainer(client, train, batch_size=16) as trainer,
        caplog.at_level(logging.WARNING, logger="daskpri"),
    ):
        # a worker that starts half a second after the fit (a `dask worker` still starting)
        threading.Timer(0.5, cluster.scale, (1,)).start()
        t0 = time.monotonic()
        history = trainer.fit(train, max_steps=2, progress=False)
        assert time.monotonic() - t0 > 0.5
        assert trainer.step_ == 2 and history.sizes["worker"] == 1
        assert caplog.messages.count(
            f"waiting up to 30 s for a worker at {client.scheduler.address} "
            "(daskpri.trainer.no-workers-timeout)") == 1
        _wait_for(lambda: not any(k.startswith("daskpri-waiting")  # its task released
                                  for k in cluster.scheduler.tasks))


def test_a_fit_with_no_workers_fails_after_the_no_workers_timeout_saying_it_waited(
    small_data, no_workers
):
    train, _ = small_data
    cluster, client = no_workers
    with (
        dask.config.set({"daskpri.trainer.no-workers-timeout": "0.5s"}),
        daskpri.Trainer(build_model("mlp", train), client=client, resources={"GPU": 1},
                        n_workers=2) as trainer,
    ):
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=(
            rf"^the cluster at {client.scheduler.address} has no workers; start some with .*; "
            r"waited 0.5 s for 2 workers with resources \{'GPU': 1.0\} "
            r"\(daskpri.trainer.no-workers-timeout\)$"
        )):
            trainer.fit(train, max_steps=2, progress=False)
        assert time.monotonic() - t0 < 5
    _wait_for(lambda: not cluster.scheduler.tasks)  # the task it kept pending is gone


def test_an_interrupt_while_a_fit_waits_for_workers_ends_it(small_data, no_workers, capsys):
    train, _ = small_data
    cluster, client = no_workers
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: a fit does not take it")
    with daskpri.Trainer(build_model("mlp", train), client=client) as trainer:
        # Ctrl-C, to this process: the fit's handler asks it to stop
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match=r"^the fit was interrupted while it waited "
                                                    r"for workers, before its set-up: nothing "
                                                    r"was set up or trained \(step_=0\); fit"):
            trainer.fit(train, max_steps=2, progress=False)
        assert time.monotonic() - t0 < 5  # not the 30 s the wait would have taken
        # it says what it stopped: a wait, not a set-up (none was made) or a step
        assert capsys.readouterr().err == (
            "daskpri: stopping the fit: it was waiting for workers, with nothing set up\n")
        # and so does daskpri train's Ctrl-C, its handler around the fit told by it
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt), _interruptible(trainer):
            trainer.fit(train, max_steps=2, progress=False)
        assert trainer.step_ == 0
        assert capsys.readouterr().err == "daskpri: stopping: the run was waiting for workers\n"
        # stop() alike, from another thread: the fit returns, none of its steps taken
        threading.Timer(0.3, trainer.stop).start()
        assert trainer.fit(train, max_steps=2, progress=False).sizes["step"] == 0
    _wait_for(lambda: not cluster.scheduler.tasks)


def test_a_fit_of_more_workers_than_an_adaptive_clusters_minimum_fails_at_once_saying_so(
    small_data,
):
    # Adaptive starts one worker for the task a waiting fit keeps pending, and no more
    train, _ = small_data
    with (
        local_cluster(0, processes=False) as (cluster, client),
        mlp_trainer(client, train, n_workers=2, batch_size=16) as trainer,
    ):
        cluster.adapt(minimum=0, maximum=3, interval="50ms")
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=(
            rf"^the cluster at {client.scheduler.address} has no workers; .*; the cluster "
            r"adapts \(minimum=0, maximum=3\), and Dask's Adaptive starts workers for the load "
            r"of tasks, not for the 2 workers a fit needs: adapt it with minimum=2 "
            r"\(cluster.adapt\(minimum=2, maximum=3\)\)$"
        )):
            trainer.fit(train, max_steps=2, progress=False)
        assert time.monotonic() - t0 < 1  # not the 30 s of the no-workers-timeout
        assert not cluster.scheduler.tasks and not cluster.scheduler.workers
        # as it says: the floor at n_workers, the fit waits for them and trains on both
        cluster.adapt(minimum=2, maximum=3, interval="50ms")
        history = trainer.fit(train, max_steps=2, progress=False)
        assert trainer.step_ == 2 and history.sizes["worker"] == 2
