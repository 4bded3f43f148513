"""Driver loss: SIGKILL the driver mid-run, resume from its last checkpoint.

Runs against real ``dask scheduler`` / ``dask worker`` processes on loopback,
which outlive the driver as a shared cluster does.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from distributed import Client

from daskpri.training import checkpoint

DRIVER = textwrap.dedent("""
    import sys, torch, daskpri
    from distributed import Client
    from daskpri.models import build_model

    address, ckpt, out, steps, resume = sys.argv[1:6]
    train, _ = daskpri.datasets.load("synthetic", n_samples=2000, seed=0)
    with Client(address) as client:
        if resume == "1":
            trainer = daskpri.Trainer.resume(ckpt, client=client)
        else:
            trainer = daskpri.Trainer(
                build_model("mlp", train, seed=0), strategy="projection", client=client,
                seed=0, batch_size=32, checkpoint_path=ckpt, checkpoint_every=10)
        history = trainer.fit(train, max_steps=int(steps), progress=False)
        history.to_netcdf(out + ".nc", engine="h5netcdf")
        torch.save(trainer.model.state_dict(), out + ".pt")
        trainer.close()
""")


def _driver(tmp_path, address, name, steps, resume=False):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    args = [sys.executable, str(script), address, str(tmp_path / f"{name}.ckpt"),
            str(tmp_path / name), str(steps), "1" if resume else "0"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=240):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def test_resume_after_sigkill_of_the_driver_continues_the_same_run(gpu_cluster, tmp_path):
    steps = 70
    # The workers import torch and daskpri first. The first driver's replicas would
    # make them import both on their event loops (12 s on a loaded 2-core machine),
    # and the second driver's probe (10 s) would leave one out: that run would go on
    # with 1 worker, cut into other partitions, and select other samples than its twin.
    with Client(gpu_cluster) as client:
        client.run(importlib.import_module, "daskpri.replicas.worker")
    # the run not stopped, beside the one killed: the same seed selects the same samples
    # and reaches the same weights whatever else the workers compute meanwhile
    ref = _driver(tmp_path, gpu_cluster, "ref", steps)
    victim = _driver(tmp_path, gpu_cluster, "run", steps)
    ckpt = tmp_path / "run.ckpt"
    deadline = time.monotonic() + 180
    try:
        while True:
            assert time.monotonic() < deadline, "the driver never wrote a checkpoint"
            assert victim.poll() is None, "the driver ended before it was killed"
            # polled with torch alone: a process's first checkpoint.read builds the
            # model's spec (1-2 s of imports), while the driver takes 20-40 steps
            if ckpt.exists() and torch.load(ckpt, weights_only=True)["step"] >= 20:
                break
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    _finish(ref)
    start = checkpoint.read(ckpt)["step"]
    assert 20 <= start <= steps - 30, "at least 30 steps are left to compare"
    _finish(_driver(tmp_path, gpu_cluster, "run", steps, resume=True))

    h_ref = xr.open_dataset(tmp_path / "ref.nc", engine="h5netcdf").load()
    h_run = xr.open_dataset(tmp_path / "run.nc", engine="h5netcdf").load()
    assert h_run["step"].values.tolist() == list(range(steps))
    # both runs on both workers: the resumed one keeps the killed one's partitions
    assert h_ref["n_workers"].values.tolist() == h_run["n_workers"].values.tolist() == [2] * steps
    # the same samples in every step: before the kill (the killed run's records, kept in
    # its checkpoint) and after the resume
    np.testing.assert_array_equal(h_ref["selection_digest"], h_run["selection_digest"])
    ref_params = torch.load(tmp_path / "ref.pt", weights_only=True)
    run_params = torch.load(tmp_path / "run.pt", weights_only=True)
    for name, value in ref_params.items():
        assert torch.equal(value, run_params[name]), f"{name} differs after resume"


def _write_forever(path: str, written: Any) -> None:
    """Rewrite an 8 MB checkpoint at ``path`` in a loop; ``written`` is set after the first."""
    step = 0
    while True:
        step += 1
        checkpoint.write({"step": step, "w": torch.full((2_000_000,), float(step))}, path)
        written.set()


@pytest.mark.parametrize("kills", [6, pytest.param(50, marks=pytest.mark.slow)])
def test_killing_the_writer_never_leaves_a_partial_checkpoint(tmp_path, kills):
    """A process rewriting a 8 MB checkpoint in a loop, SIGKILLed at random times.

    The writers come from the forkserver that starts the suite's workers
    (conftest.py), which has torch imported: each starts at once.
    """
    path = tmp_path / "big.ckpt"
    ctx = multiprocessing.get_context("forkserver")
    rng = np.random.default_rng(0)
    last = 0
    for _ in range(kills):
        written = ctx.Event()
        proc = ctx.Process(target=_write_forever, args=(str(path), written), daemon=True)
        proc.start()
        assert written.wait(timeout=60), "the writer never wrote a complete checkpoint"
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        # the latest complete file always loads (a partial state, which
        # checkpoint.read refuses as no daskpri checkpoint: torch.load reads it)
        state = torch.load(path, weights_only=True)
        assert state["step"] >= 1 and bool((state["w"] == float(state["step"])).all())
        last = state["step"]
    assert last >= 1
    # temporary files of killed writes may stay behind; never under the final name
    assert all(f == "big.ckpt" or f.endswith(".tmp") for f in os.listdir(tmp_path))
