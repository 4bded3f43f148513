"""Worker loss under load: random SIGKILLs and segfaults during a run, and its set-up.

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

import dask
import numpy as np
import pytest
import torch
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


class KillsOnArrival(torch.nn.Module):
    """A linear model whose unpickling in process ``victim`` (0: in any but this one)
    SIGKILLs it: that worker dies as the run's
    :class:`~daskpri.replicas.worker.ReplicaPlugin` builds its replica."""

    def __init__(self, n_features: int, n_classes: int, victim: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(n_features, n_classes)
        self.victim = victim
        self.driver = os.getpid()

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if os.getpid() == self.victim or (self.victim == 0 and os.getpid() != self.driver):
            os.kill(os.getpid(), signal.SIGKILL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.flatten(1))


def test_a_worker_killed_as_the_replicas_are_set_up_leaves_its_partitions_to_the_others(
    small_data,
):
    train, _ = small_data
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                     dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        model = KillsOnArrival(int(train["x"].shape[1]), int(train["y"].max()) + 1, pids[victim])
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, batch_size=16,
                                  partition_size=100)
        try:
            history = trainer.fit(train, max_steps=3, progress=False)
            assert history.sizes["step"] == 3
            owners = trainer._deployment.owner_addr
            assert victim not in client.scheduler_info()["workers"], "it was killed"
            assert victim not in owners and set(owners) <= set(client.scheduler_info()["workers"])
            name = trainer._plugin.name

            def loaded(dask_worker) -> list[int]:
                plugin = dask_worker.plugins.get(name)
                return sorted(getattr(plugin, "partitions", {}))

            # every partition is loaded on its owner
            held = client.run(loaded)
            assert all(pid in held[a] for pid, a in enumerate(owners))
        finally:
            trainer.close()
        # every worker dies as it builds the replica (again once its nanny restarts it)
        model.victim = 0
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, batch_size=16,
                                  partition_size=100)
        try:
            with (
                dask.config.set({"daskpri.trainer.max-retries": 0}),
                pytest.raises(daskpri.WorkersLostError, match=(
                    r"^workers kept dying as the run was set up: worker\(s\) (tcp://\S+, )*"
                    r"tcp://\S+ died, and the set-up failed 1 time \(daskpri.trainer.max-retries"
                    r"=0; last: CommClosedError: .*\); see the workers' logs \(and their "
                    r"nannies'\) for why they die, and fit again once the cluster is steady$"
                )),
            ):
                trainer.fit(train, max_steps=3, progress=False)
        finally:
            trainer.close()
