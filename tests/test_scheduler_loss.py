"""Scheduler loss: the driver stops within the configured time, naming its checkpoint."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import dask.config
import pytest
from _procs import _free_port, _stop
from distributed import Client

import daskpri
from daskpri.models import build_model


def test_losing_the_scheduler_fails_fast_naming_the_last_checkpoint(small_data, tmp_path):
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", str(port), "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
         "--host", "127.0.0.1", "--no-dashboard"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    ckpt = tmp_path / "run.ckpt"
    killed_at: list[float] = []
    try:
        client = Client(address, timeout=60)
        client.wait_for_workers(1, timeout=60)
        train, _ = small_data
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  checkpoint_path=ckpt, checkpoint_every=5)

        def kill_scheduler() -> None:
            # steps take a few ms: look often, or the run reaches the checkpoint at 15
            while trainer.step_ < 12:
                time.sleep(0.001)
            scheduler.kill()
            killed_at.append(time.monotonic())

        threading.Thread(target=kill_scheduler, daemon=True).start()
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
