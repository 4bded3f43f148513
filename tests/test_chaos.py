"""Worker loss under load: random SIGKILLs and segfaults during a run.

Modeled on how Dask tests its own resilience (``distributed.chaos.KillWorker``):
4 worker processes under nannies, killed during a fit. The run must finish,
keep a finite priority for every sample, and end within 0.5 accuracy points
of the fault-free run with the same seed. The long version is marked slow
(``make test-slow``); a short one runs in CI.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster
from distributed.chaos import KillWorker

import daskpri
from daskpri.data.datasets import load
from daskpri.models import build_model


@pytest.fixture(scope="module")
def chaos_data():
    # 3,000 test samples: one sample is 0.03 accuracy points
    return load("synthetic", n_samples=15000, seed=1)


def _run(data, steps, kill_every=None, segfault_for=None, seed=0):
    train, test = data
    with LocalCluster(n_workers=4, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        trainer = daskpri.Trainer(build_model("mlp", train, seed=seed), strategy="uniform",
                                  client=client, seed=seed, batch_size=32, eval_every=50,
                                  # the rate decays to zero, so both runs end settled
                                  lr_schedule="cosine", schedule_steps=steps)
        kills = []
        stop = threading.Event()

        def killer():
            rng = np.random.default_rng(seed)
            next_kill = kill_every
            while not stop.is_set():
                # look the workers up before the kill point: a step takes milliseconds
                try:
                    pids = client.run(os.getpid, on_error="ignore")
                except Exception:  # a worker died under the broadcast: ask again
                    time.sleep(0.05)
                    continue
                while not stop.is_set() and trainer.step_ < next_kill:
                    time.sleep(0.001)
                if stop.is_set():
                    return
                victim = sorted(pids)[int(rng.integers(len(pids)))]
                os.kill(pids[victim], signal.SIGKILL)
                kills.append(trainer.step_)
                next_kill += kill_every

        thread = threading.Thread(target=killer, daemon=True)
        if kill_every:
            thread.start()
        if segfault_for:
            client.register_plugin(KillWorker(delay="2 s", mode="segfault"), name="chaos")
            threading.Timer(segfault_for, _stop_chaos, (client,)).start()
        try:
            history = trainer.fit(train, eval_data=test, max_steps=steps, progress=False)
            table = trainer.table_
        finally:
            stop.set()
            trainer.close()
    return history, table, kills


def _stop_chaos(client: Client) -> None:
    """Unregister the KillWorker plugin; a worker dying meanwhile fails a try."""
    for _ in range(20):
        try:
            client.unregister_worker_plugin("chaos")
            return
        except ValueError:  # gone already: an earlier try got through
            return
        except Exception:
            time.sleep(0.5)


@pytest.mark.parametrize(
    "steps, kill_every",
    [(600, 150), pytest.param(3000, 100, marks=[pytest.mark.slow, pytest.mark.timeout(1500)])],
)
def test_random_sigkills_leave_the_run_on_course(chaos_data, steps, kill_every):
    ref, _, _ = _run(chaos_data, steps)
    h, table, kills = _run(chaos_data, steps, kill_every=kill_every)
    assert len(kills) >= steps // kill_every - 1, kills
    assert h.sizes["step"] == steps
    assert np.isfinite(table.values).all(), "every sample keeps a finite priority"
    final_ref, final = float(ref["accuracy"][-1]), float(h["accuracy"][-1])
    print(f"chaos: {len(kills)} SIGKILLs over {steps} steps; final accuracy {final:.4f}, "
          f"fault-free {final_ref:.4f}: {100 * abs(final - final_ref):.2f} points apart")
    assert abs(final - final_ref) <= 0.005, (final, final_ref, kills)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_segfaulting_workers_leave_the_run_on_course(chaos_data):
    ref, _, _ = _run(chaos_data, 600)
    h, table, _ = _run(chaos_data, 600, segfault_for=8.0)
    assert np.isfinite(table.values).all()
    final_ref, final = float(ref["accuracy"][-1]), float(h["accuracy"][-1])
    print(f"segfaults: final accuracy {final:.4f}, fault-free {final_ref:.4f}")
    assert abs(final - final_ref) <= 0.005
