"""A cluster of another daskpri is refused before set-up; another torch is warned of.

One ``dask scheduler`` and two ``dask worker`` processes on loopback, each
worker started with a ``--preload`` script that changes what it runs as it
starts: one an older daskpri (another version, and without the module of
the probe that the fit sends it), the other another torch, which alone has
the resource ``FOO=1``; a worker of another daskpri that joins mid-run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest
import torch
from _procs import _stop, dask_cluster
from distributed import Client

import daskpri
from daskpri.models import build_model

#: a worker of an older daskpri, which has no module daskpri.training._probe
OLD_DASKPRI = """
import sys

import daskpri

daskpri.__version__ = "0.0.1"
sys.modules["daskpri.training._probe"] = None  # its import fails
"""

#: a worker of another daskpri version, its code this one's
OTHER_DASKPRI = """
import daskpri

daskpri.__version__ = "0.0.2"
"""

#: a worker of another torch
OTHER_TORCH = """
import torch
from torch.torch_version import TorchVersion

torch.__version__ = TorchVersion("2.0.1")
"""


@pytest.fixture(scope="module")
def preloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of the workers' preload scripts: ``old_daskpri.py``, ``other_torch.py``
    and ``other_daskpri.py``."""
    directory = tmp_path_factory.mktemp("versions")
    (directory / "old_daskpri.py").write_text(OLD_DASKPRI)
    (directory / "other_torch.py").write_text(OTHER_TORCH)
    (directory / "other_daskpri.py").write_text(OTHER_DASKPRI)
    return directory


@pytest.fixture(scope="module")
def mixed_cluster(preloads: Path) -> Iterator[str]:
    """The address of a scheduler with a worker of daskpri 0.0.1 and one of torch 2.0.1
    (the one with ``FOO=1``)."""
    directory = preloads
    common = ["--nthreads", "1", "--no-nanny"]
    with dask_cluster(directory, [
        [*common, "--preload", str(directory / "old_daskpri.py")],
        [*common, "--resources", "FOO=1", "--preload", str(directory / "other_torch.py")],
    ]) as address:
        yield address


def test_a_cluster_of_another_daskpri_is_refused_before_set_up_naming_where(
    mixed_cluster, small_data
):
    train, _ = small_data
    here = daskpri.__version__

    def set_version(version: str) -> str:  # on the scheduler: its daskpri's version is
        was, daskpri.__version__ = daskpri.__version__, version
        return was

    with Client(mixed_cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [old] = [a for a, w in workers.items() if not w["resources"]]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        try:
            with pytest.raises(ValueError, match="^" + re.escape(
                f"the cluster runs another daskpri than this driver's {here}: daskpri 0.0.1 "
                f"on 1 of the run's 2 worker(s) ({old}); the driver, the scheduler and the "
                f"workers exchange daskpri's objects, which differ between versions: install "
                f"daskpri {here} where each of them runs (the release or checkout that this "
                "driver runs), and restart them") + "$"):
                trainer.fit(train, max_steps=1, progress=False)
            # a scheduler of another daskpri, with the worker that has this one
            was = client.run_on_scheduler(set_version, "0.0.2")
            try:
                with pytest.raises(ValueError, match=re.escape(
                    f"another daskpri than this driver's {here}: daskpri 0.0.2 on the "
                    "scheduler; ")):
                    daskpri.Trainer(build_model("mlp", train), client=client,
                                    resources={"FOO": 1}).fit(train, max_steps=1, progress=False)
            finally:
                client.run_on_scheduler(set_version, was)
            # refused before set-up: nothing of the run in the cluster
            plugins = client.run_on_scheduler(lambda dask_scheduler: list(
                dask_scheduler.worker_plugins))
            assert not [p for p in plugins if p.startswith("daskpri-")], plugins
        finally:
            trainer.close()


def test_workers_of_another_torch_are_warned_of_and_the_run_goes_on(mixed_cluster, small_data):
    train, _ = small_data
    ours = ".".join(torch.__version__.split(".")[:2])
    with Client(mixed_cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [other] = [a for a, w in workers.items() if w["resources"]]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  resources={"FOO": 1})
        try:
            with pytest.warns(daskpri.DaskpriWarning, match="^" + re.escape(
                f"the workers run another torch than this driver's {torch.__version__}: "
                f"torch 2.0.1 on 1 of the run's 1 worker(s) ({other}); a model's state dict "
                "and the pickled model the workers rebuild may not load across torch "
                f"versions: install torch {ours}, as here, on the workers if the run fails to "
                "set up or a checkpoint fails to load") + "$"):
                history = trainer.fit(train, max_steps=2, progress=False)
            assert history.sizes["step"] == 2
        finally:
            trainer.close()



def test_a_worker_of_another_daskpri_that_joins_mid_run_is_left_out_naming_both_versions(
    mixed_cluster, preloads, small_data, caplog
):
    train, _ = small_data
    here = daskpri.__version__
    with Client(mixed_cluster, timeout=60) as client:
        before = set(client.scheduler_info(n_workers=-1)["workers"])
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  resources={"FOO": 1}, partition_size=100)
        joiner = None
        try:
            with pytest.warns(daskpri.DaskpriWarning, match="another torch"):
                trainer.fit(train, max_steps=2, progress=False)
            # the probe checked the run's workers at the set-up; this one comes after it
            joiner = subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", mixed_cluster,
                 "--nthreads", "1", "--no-nanny", "--resources", "FOO=1", "--host", "127.0.0.1",
                 "--dashboard-address", "127.0.0.1:0", "--preload",
                 str(preloads / "other_daskpri.py")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            client.wait_for_workers(len(before) + 1, timeout=60)
            [new] = set(client.scheduler_info(n_workers=-1)["workers"]) - before
            # the next fit looks at the cluster before its first round: the worker joined
            history = trainer.fit(train, max_steps=4, progress=False)
            assert history.sizes["step"] == 4 and new not in trainer._deployment.slots
            why = (f"it runs daskpri 0.0.2, the driver daskpri {here}: install daskpri {here} "
                   "where the worker runs, and restart it")
            assert trainer._deployment.unfit[new] == why
            assert f"worker {new} holds no replica of run {trainer.run_id} ({why})" in caplog.text
        finally:
            trainer.close()
            if joiner is not None:
                _stop([joiner])


def test_a_worker_that_does_not_answer_the_probe_in_time_leaves_the_others_answers(
    mixed_cluster,
):
    from daskpri.training import _cluster_checks

    with Client(mixed_cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [old] = [a for a, w in workers.items() if not w["resources"]]
        [other] = set(workers) - {old}
        async def busy() -> None:  # holds the worker's event loop: it answers nothing
            time.sleep(2.5)

        client.run(busy, workers=[old], wait=False)
        try:
            with dask.config.set({"daskpri.trainer.no-workers-timeout": "1s",
                                  "daskpri.trainer.probe-timeout": "1s"}):
                answers = _cluster_checks.ask_cluster(client, [old, other], modules=["json"])
            assert list(answers.workers) == [other]
            assert answers.workers[other]["torch"] == "2.0.1"
            assert answers.scheduler is not None and answers.scheduler["daskpri"] == (
                daskpri.__version__)
        finally:
            client.run(lambda: 0, workers=[old])  # answers once its loop is free again


def test_a_worker_that_does_not_answer_does_not_hold_up_the_replicas_registration(
    mixed_cluster, monkeypatch, caplog, tmp_path
):
    # the scheduler's broadcast of a plugin waits for a listed worker that does not
    # answer (host gone or frozen) until it drops it: worker-ttl, 5 minutes by default
    from distributed import WorkerPlugin

    from daskpri.training import transport

    monkeypatch.setattr(transport, "REGISTER_ANSWER_TIMEOUT", 1.0)
    plugin = WorkerPlugin()
    plugin.name = "daskpri-test-registration"
    with Client(mixed_cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [old] = [a for a, w in workers.items() if not w["resources"]]
        [other] = set(workers) - {old}

        held, freed = tmp_path / "held", tmp_path / "freed"

        async def busy() -> None:  # holds the worker's event loop: it answers nothing
            held.touch()
            time.sleep(3)
            freed.touch()

        client.run(busy, workers=[old], wait=False)
        try:
            while not held.exists():  # (the run's message may come after the plugin's)
                time.sleep(0.01)
            transport.register(client, plugin)
            assert not freed.exists()  # returned while the worker still answered nothing
            assert client.run(lambda dask_worker: plugin.name in dask_worker.plugins,
                              workers=[other]) == {other: True}
            assert (f"worker(s) {old} did not answer within 1 s as the run's replicas were set "
                    "up: the run goes on without them") in caplog.text
        finally:
            # the broadcast reaches it once its loop is free again
            assert client.run(lambda dask_worker: plugin.name in dask_worker.plugins,
                              workers=[old]) == {old: True}
            client.unregister_worker_plugin(plugin.name)
