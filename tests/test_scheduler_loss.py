"""Scheduler loss: the driver stops within the configured time, naming its checkpoint."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask.config
import pytest
from _procs import _stop, start_scheduler
from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model


def _scheduler_and_worker(directory: Path) -> tuple[str, subprocess.Popen, subprocess.Popen]:
    """A `dask scheduler` and one `dask worker` process on loopback: its address and both."""
    address, scheduler = start_scheduler(directory, "--no-dashboard")
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    return address, scheduler, worker


def _then_after_checkpoint(client: Any, train: Any, ckpt: Path, step: int,
                           then: Callable[[], None]) -> daskpri.Trainer:
    """A uniform MLP trainer checkpointing to ``ckpt`` every 5 steps; ``then()`` right after
    its checkpoint at ``step``: the real save first, so no race with the checkpoint."""

    class ThenAfterACheckpoint(daskpri.Trainer):
        def save(self, path):
            written = super().save(path)
            if self.step_ == step:
                then()
            return written

    return ThenAfterACheckpoint(build_model("mlp", train), strategy="uniform", client=client,
                                checkpoint_path=ckpt, checkpoint_every=5)


def test_losing_the_scheduler_fails_fast_naming_the_last_checkpoint(small_data, tmp_path):
    address, scheduler, worker = _scheduler_and_worker(tmp_path)
    ckpt = tmp_path / "run.ckpt"
    killed_at: list[float] = []
    try:
        client = Client(address, timeout=60)
        client.wait_for_workers(1, timeout=60)
        train, _ = small_data

        def kill() -> None:  # the scheduler dies after the second checkpoint
            scheduler.kill()
            killed_at.append(time.monotonic())

        trainer = _then_after_checkpoint(client, train, ckpt, 10, kill)
        with dask.config.set({"daskpri.trainer.scheduler-timeout": "3s"}):
            with pytest.raises(daskpri.SchedulerLostError) as info:
                trainer.fit(train, max_steps=100_000, progress=False)
        waited = time.monotonic() - killed_at[0]
        message = str(info.value)
        assert f"lost the scheduler at {address}" in message
        assert f"the last checkpoint is {str(ckpt)!r} (step 10)" in message
        assert "daskpri.Trainer.resume(" in message
        assert waited < 20, f"took {waited:.1f} s to give up"
        client.close(timeout=5)
    finally:
        _stop([worker, scheduler])


def test_a_scheduler_restarted_at_its_address_is_a_lost_scheduler_naming_the_checkpoint(
    small_data, tmp_path
):
    address, scheduler, worker = _scheduler_and_worker(tmp_path)
    port = address.rsplit(":", 1)[1]
    ckpt = tmp_path / "run.ckpt"
    again: list[subprocess.Popen] = []
    try:
        client = Client(address, timeout=60)
        client.wait_for_workers(1, timeout=60)
        train, _ = small_data

        def restart() -> None:  # a supervisor's restart after the second checkpoint
            scheduler.kill()
            scheduler.wait()
            (tmp_path / "again").mkdir()
            again.append(start_scheduler(tmp_path / "again", "--no-dashboard", "--port", port)[1])

        trainer = _then_after_checkpoint(client, train, ckpt, 10, restart)
        with dask.config.set({"daskpri.trainer.scheduler-timeout": "3s"}):
            # the client and the worker reconnect to the new scheduler, which answers,
            # but knows nothing of the run: not the user's error, a lost scheduler
            with pytest.raises(daskpri.SchedulerLostError, match=(
                rf"lost the scheduler at {address}: it was restarted .*the run's table, "
                rf"replicas and partitions went with the one before; the last checkpoint is "
                rf"'{ckpt}' \(step 10\)"
            )):
                trainer.fit(train, max_steps=100_000, progress=False)
        client.close(timeout=5)
    finally:
        _stop([worker, scheduler, *again])


def test_a_client_closed_during_a_fit_is_a_lost_scheduler_naming_the_checkpoint(
    small_data, tmp_path
):
    train, _ = small_data
    ckpt = tmp_path / "run.ckpt"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address="127.0.0.1:0") as cluster:
        client = Client(cluster)
        address = client.scheduler.address
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  checkpoint_path=ckpt, checkpoint_every=5)

        def close_client() -> None:
            while trainer.step_ < 12:
                time.sleep(0.001)
            client.close()

        threading.Thread(target=close_client, daemon=True).start()
        with pytest.raises(daskpri.SchedulerLostError) as info:
            trainer.fit(train, max_steps=100_000, progress=False)
        message = str(info.value)
        assert message.startswith(f"lost the scheduler at {address}: the client has closed")
        assert f"`daskpri train --resume {ckpt}`" in message
        trainer.close()


def test_train_that_loses_its_scheduler_writes_the_history_so_far(tmp_path):
    import os

    import xarray as xr

    address, scheduler, worker = _scheduler_and_worker(tmp_path)
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    env = dict(os.environ, DASK_DASKPRI__TRAINER__SCHEDULER_TIMEOUT="3s")
    train = subprocess.Popen(
        [sys.executable, "-m", "daskpri", "train", "--dataset", "synthetic", "--n-samples", "2000",
         "--scheduler", address, "--workers", "1", "--max-steps", "1000000", "--no-progress",
         "--checkpoint", str(ckpt), "--checkpoint-every", "20", "--output", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists() and time.monotonic() < deadline and train.poll() is None:
            time.sleep(0.05)
        assert ckpt.exists(), train.communicate(timeout=30)
        scheduler.kill()
        stdout, stderr = train.communicate(timeout=120)
    finally:
        train.kill()
        _stop([worker, scheduler])
    assert train.returncode == 1, stderr
    assert f"lost the scheduler at {address}" in stderr and "--resume" in stderr
    # the close neither called the scheduler gone, waiting for the client's reconnection
    # (10 s: "Failed to reconnect to scheduler ..."), nor logged the reconnection it cut
    assert "distributed.client - ERROR" not in stderr, stderr
    assert "the scheduler lost at step " in stdout and f"written to {out}" in stdout, stderr
    history = xr.open_dataset(out)
    assert history.sizes["step"] >= 20 and history.attrs["dataset"] == "synthetic"


def test_a_scheduler_shut_down_during_a_fit_is_said_at_once_naming_the_checkpoint(
    small_data, tmp_path
):
    # a scheduler that closes (shut down by another client, closed when idle) refuses the
    # next call's connection, which distributed retries for its connect timeout (30 s)
    train, _ = small_data
    ckpt = tmp_path / "run.ckpt"
    closed_at: list[float] = []
    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                           dashboard_address="127.0.0.1:0")
    client = Client(cluster)
    address = client.scheduler.address
    try:

        def shut_down() -> None:  # the scheduler is shut down after the first checkpoint
            with Client(address) as other:
                other.shutdown()
            closed_at.append(time.monotonic())

        trainer = _then_after_checkpoint(client, train, ckpt, 5, shut_down)
        with pytest.raises(daskpri.SchedulerLostError) as info:
            trainer.fit(train, max_steps=100_000, progress=False)
        waited = time.monotonic() - closed_at[0]
        assert str(info.value).startswith(
            f"lost the scheduler at {address}: its connection closed, and its address refuses "
            f"new ones (it was shut down, closed itself when idle, or died); the last "
            f"checkpoint is {str(ckpt)!r} (step 5)"
        )
        assert waited < 15, f"took {waited:.1f} s to give up"  # distributed retried 30 s
    finally:
        # the cluster's own calls to its scheduler, gone, would retry for the connect timeout
        with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
            client.close(timeout=5)
            cluster.close()
