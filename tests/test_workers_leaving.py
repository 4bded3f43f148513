"""Workers that leave a run mid-fit, or stop taking its work, each named for why.

A worker the scheduler retires (``client.retire_workers``, a cluster scaling
down) is no failure: its partitions move and the step runs again at no cost
to ``daskpri.trainer.max-retries``. A worker its nanny kills for memory is
named with its memory and limit, and a step whose retry is killed again
stops the fit, saying what to do. Workers that Dask pauses for memory are
named with their memory. The clusters are LocalClusters whose workers are
processes with nannies (the nanny's memory monitor is what kills a worker),
forked with torch imported (see conftest): a restarted ``dask worker``
imports torch afresh, which took the memory test from 4 s to 12-24 s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time

import dask
import pytest
import torch
import xarray as xr
from _fits import fit_until_step, local_cluster, mlp_trainer, wait_while_fitting

import daskpri


class Hog(torch.nn.Module):
    """A linear model whose forward, once the file ``flag`` exists, keeps ``size`` bytes."""

    def __init__(self, n_features: int, n_classes: int, flag: str, size: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(n_features, n_classes)
        self.flag = flag
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.path.exists(self.flag):
            self.hog = torch.ones(self.size // 4)  # written: resident, not only reserved
        return self.layer(x.flatten(1))


# 0s: the run looks at the cluster before each step, and finds the worker gone there, as
# often as a step's call to it fails
@pytest.mark.parametrize("rescan", ["5s", "0s"])
def test_a_worker_retired_mid_fit_is_said_retired_and_costs_no_retry(small_data, caplog,
                                                                     rescan):
    train, _ = small_data
    with (
        # a retry would fail the fit: the retirement must cost none
        dask.config.set({"daskpri.trainer.max-retries": 0,
                         "daskpri.trainer.rescan-interval": rescan}),
        local_cluster(3, processes=False) as (_, client),
        mlp_trainer(client, train, batch_size=16, partition_size=100) as trainer,
    ):
        with caplog.at_level(logging.WARNING, logger="daskpri"):
            running = fit_until_step(trainer, train)
            [retired] = trainer._deployment.slots[:1]
            client.retire_workers([retired])  # mid-fit: steps run meanwhile
            wait_while_fitting(lambda: trainer.history_["n_workers"].values[-1] != 3,
                               "the run went on with the worker retired", running, 60)
            trainer.stop()
            history = running.result(timeout=60)
        assert history["n_workers"].values[-1] == 2
        others = ", ".join(sorted(set(client.scheduler_info()["workers"])))
        assert re.search(
            rf"step \d+: worker\(s\) {retired} retired; their partitions moved to "
            rf"{re.escape(others)}, the run goes on with 2", caplog.text)
        assert "a worker was lost" not in caplog.text and "left the cluster" not in caplog.text


def test_a_step_whose_retry_its_nanny_kills_for_memory_stops_the_fit_saying_why(
    small_data, tmp_path, caplog
):
    train, _ = small_data
    flag = tmp_path / "flag"
    model = Hog(int(train["x"].shape[1]), int(train["y"].max()) + 1, str(flag), 2**30)
    with (
        # a worker's process with torch and the replica is well under 95% of 1 GB
        local_cluster(1, memory_limit="1GB") as (_, client),
        daskpri.Trainer(model, strategy="uniform", client=client, batch_size=16) as trainer,
    ):
        [worker] = client.scheduler_info(n_workers=-1)["workers"]
        trainer.fit(train, max_steps=2, progress=False)
        flag.touch()  # from now on each step takes the worker past its limit
        killed = (r"worker\(s\) {} \(at [\d.]+ [MG]iB of its 0.93 GiB memory limit\) were "
                  r"killed by their nanny for memory as they trained: a worker's memory "
                  r"passed distributed.worker.memory.terminate \(95% of its limit by default\)")
        advice = r"train with a smaller batch_size .*more workers .*--memory-limit"
        with (
            caplog.at_level(logging.WARNING, logger="daskpri"),
            pytest.raises(daskpri.WorkersLostError, match=(
                "^step 2 failed again at its retry: " + killed.format(r"tcp://[\d.:]+")
                + "; " + advice
            )),
        ):
            trainer.fit(train, max_steps=6, progress=False)
        # the restarted worker took the partitions, then was killed too: the fit stopped
        # there, not after daskpri.trainer.max-retries (10) more
        assert len(client.get_events("worker-restart-memory")) == 2
        assert re.search(
            rf"step 2: {killed.format(re.escape(worker))}; their partitions moved, the run "
            r"goes on with 1 \(a retry of the step killed for memory again stops the fit\): "
            + advice, caplog.text)
        assert "a worker was lost" not in caplog.text
        assert trainer.step_ == 2


def _take_a_gibibyte() -> None:
    """Fill a GiB of this worker's memory a moment after the call has returned (in a thread)."""

    def take() -> None:
        time.sleep(0.2)
        _TAKEN.append(b"x" * 2**30)

    threading.Thread(target=take, daemon=True).start()


_TAKEN: list[bytes] = []


def test_a_worker_started_again_at_its_address_is_not_said_gone_for_the_one_before():
    """A worker at a fixed port has the address (and the event topic) of the one before it."""
    from daskpri.training.recovery import MEMORY_RESTART, how_workers_left

    with socket.socket() as s:  # (a port free now: the workers listen on it, one at a time)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with local_cluster(1, memory_limit="1GB", worker_port=port) as (cluster, client):
        [address] = cluster.scheduler.workers
        killed = cluster.scheduler.workers[address].pid
        client.run(_take_a_gibibyte)
        # its nanny kills it for memory, and starts a worker again, at the same port
        wait_while_fitting(lambda: getattr(cluster.scheduler.workers.get(address), "pid",
                                           killed) != killed,
                           "the nanny did not start the worker killed for memory again", None)
        [(_, event)] = client.get_events(MEMORY_RESTART)
        assert event["worker"] == address and event["pid"] == killed
        assert how_workers_left(client, [address]) == (set(), {})  # that was the one before
        retired = cluster.scheduler.workers[address].pid
        client.retire_workers([address])
        assert how_workers_left(client, [address]) == ({address}, {})  # this one retired
        # (its process lingers, which its nanny's close would wait 4 s for)
        with contextlib.suppress(ProcessLookupError):
            os.kill(retired, signal.SIGKILL)
        cluster.scale(0)  # its nanny, which stays after the retirement, closed too
        wait_while_fitting(lambda: not cluster.workers, "the cluster kept its worker", None)
        cluster.scale(1)  # a worker of the cluster's again, at the same port
        client.wait_for_workers(1, timeout=30)
        assert list(cluster.scheduler.workers) == [address]
        assert how_workers_left(client, [address]) == (set(), {})  # the one before retired


def test_workers_paused_mid_fit_are_named_with_their_memory(small_data, tmp_path):
    train, _ = small_data
    flag = tmp_path / "flag"
    model = Hog(int(train["x"].shape[1]), int(train["y"].max()) + 1, str(flag), 500 * 2**20)
    with (
        dask.config.set({
            # paused past half its limit, and never killed for it
            "distributed.worker.memory.pause": 0.5,
            "distributed.worker.memory.terminate": False,
            "daskpri.trainer.no-workers-timeout": "1s",
        }),
        # (a step's scatter of the weights waited distributed's connect timeout, 30 s, for a
        # worker that takes data: now it asks why at once)
        local_cluster(1, memory_limit="1GB") as (_, client),
        # a paused worker runs no task: the tasks transport's steps wait for it
        daskpri.Trainer(model, strategy="uniform", client=client, batch_size=16,
                        transport="tasks") as trainer,
    ):
        [worker] = client.scheduler_info(n_workers=-1)["workers"]
        trainer.fit(train, max_steps=2, progress=False)
        flag.touch()  # the next step leaves the worker past its pause threshold
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=(
            rf"that could train this run are paused by Dask: {worker} uses [\d.]+ [MG]iB of "
            r"its 0.93 GiB memory limit; .*distributed.worker.memory.pause .*--memory-limit"
        )):
            trainer.fit(train, max_steps=100, progress=False)
        assert time.monotonic() - t0 < 20  # not the scatter's (30 s) or the step's (300 s)


def test_train_whose_workers_are_lost_past_its_retries_ends_in_one_line_keeping_the_history(
    tmp_path, monkeypatch, capsys
):
    from distributed.comm import CommClosedError

    from daskpri.cli import main
    from daskpri.training._step import StepMixin

    run_tasks = StepMixin._run_tasks

    def lost_at_step_4(self, step, *args, **kwargs):  # the network's part: a comm closed
        if step >= 4:
            raise CommClosedError("in <TCP (closed) ConnectionPool.daskpri_train>: Stream is "
                                  "closed")
        return run_tasks(self, step, *args, **kwargs)

    monkeypatch.setattr(StepMixin, "_run_tasks", lost_at_step_4)
    out = tmp_path / "run.nc"
    with dask.config.set({"daskpri.trainer.max-retries": 0}):
        assert main(["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps",
                     "20", "--workers", "1", "--no-progress", "--output", str(out)]) == 1
    said = capsys.readouterr()
    # daskpri.WorkersLostError: one line and exit 1, as a lost scheduler, not a traceback
    assert said.err == ("daskpri: error: step 4 failed 1 times after losing workers: in <TCP "
                        "(closed) ConnectionPool.daskpri_train>: Stream is closed\n")
    assert f"its workers lost at step 4: the history so far written to {out}" in said.out
    with xr.open_dataset(out, engine="h5netcdf") as history:
        assert history.sizes["step"] == 4
