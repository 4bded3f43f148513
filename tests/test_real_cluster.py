"""daskpri on a cluster the user starts: `dask scheduler` and `dask worker` processes.

One scheduler (without ``--preload daskpri.table.plugin``: the trainer
registers it), one ``dask worker --nworkers 2 --nthreads 2`` command and a
worker with a resource, on loopback, as a user starts them; clusters of
small memory limits where a test needs them.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import dask
import numpy as np
import pytest
from _procs import _stop, dask_cluster
from distributed import Client, get_task_stream

import daskpri
from daskpri.data.io import to_store
from daskpri.models import build_model

#: how long the scheduler keeps a run whose driver's client has left
ORPHAN_TIMEOUT = "1s"


#: a model's module that the cluster's workers can import, and a worker started elsewhere cannot
MODEL_MODULE = """
import torch


class Net(torch.nn.Module):
    def __init__(self, n_features, n_classes):
        super().__init__()
        self.layer = torch.nn.Linear(n_features, n_classes)

    def forward(self, x):
        return self.layer(x.flatten(1))
"""


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A directory on the workers' ``PYTHONPATH`` holding the module ``realclustermodel``."""
    directory = tmp_path_factory.mktemp("models")
    (directory / "realclustermodel.py").write_text(MODEL_MODULE)
    return directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, models_dir: Any) -> Iterator[str]:
    """The address of a `dask scheduler` with two worker processes of two threads each
    (one ``dask worker --nworkers 2 --nthreads 2``) and one of one thread that has the
    resource ``FOO=1``.

    The workers run in a working directory of their own, not the driver's,
    and can import the module of :data:`MODEL_MODULE`.
    """
    directory = tmp_path_factory.mktemp("real-cluster")
    path = os.pathsep.join(filter(None, [str(models_dir), os.environ.get("PYTHONPATH")]))
    with dask_cluster(
        directory,
        [["--nworkers", "2", "--nthreads", "2"], ["--nthreads", "1", "--resources", "FOO=1"]],
        expect=3,
        scheduler_env={"DASK_DASKPRI__TABLE__ORPHAN_TIMEOUT": ORPHAN_TIMEOUT},
        worker_env={"PYTHONPATH": path},
        cwd=directory,  # not the driver's
    ) as address:
        yield address


def _small_memory_cluster(directory: Any, **config: str) -> Iterator[str]:
    """A `dask scheduler` and one worker of a 2 GB ``--memory-limit``, under Dask's
    ``config`` (environment variables)."""
    with dask_cluster(directory, [["--nthreads", "1", "--memory-limit", "2GB"]],
                      worker_env=config) as address:
        yield address


@pytest.fixture
def pausing_cluster(tmp_path: Any) -> Iterator[str]:
    """A worker whose memory, once it imports torch, is over Dask's pause threshold (10%
    of its limit; a worker that has not imported torch is well under it)."""
    yield from _small_memory_cluster(tmp_path, DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE="0.1")


@pytest.fixture
def terminating_cluster(tmp_path: Any) -> Iterator[str]:
    """A worker that its nanny kills and restarts once it imports torch (10% of its limit)."""
    yield from _small_memory_cluster(
        tmp_path, DASK_DISTRIBUTED__WORKER__MEMORY__TERMINATE="0.1",
        DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE="False",
    )


def _on_cluster(client: Client) -> dict[str, Any]:
    """The runs the scheduler's table plugin holds (closed or not) and the worker plugins."""

    def look(dask_scheduler: Any) -> dict[str, Any]:
        plugin = dask_scheduler.plugins.get("daskpri")
        runs = {} if plugin is None else {n: r.closed for n, r in plugin.runs.items()}
        return {"runs": runs, "worker_plugins": sorted(dask_scheduler.worker_plugins)}

    on_workers = client.run(lambda dask_worker: sorted(dask_worker.plugins))
    return {**client.run_on_scheduler(look), "on_workers": on_workers}


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the cluster never got there"
        time.sleep(0.1)


def test_a_run_whose_client_left_without_closing_it_is_dropped_from_the_cluster(
    cluster, small_data
):
    train, _ = small_data
    left = Client(cluster, timeout=60)
    # not the default: closed after left, a default client would put back the dask
    # config it found (left's "dask.distributed" scheduler) with no client behind it
    stays = Client(cluster, timeout=60, set_as_default=False)
    try:
        gone = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=left)
        kept = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=stays)
        gone.fit(train, max_steps=3, progress=False)
        kept.fit(train, max_steps=3, progress=False)
        replicas = {n: f"daskpri-{t.run_id}" for n, t in (("gone", gone), ("kept", kept))}
        assert set(replicas.values()) <= set(_on_cluster(stays)["worker_plugins"])
        left.close()  # before gone.close(): the trainer can no longer reach the cluster

        def dropped() -> bool:
            return _on_cluster(stays)["runs"].get(gone.run_id) is True

        _wait_for(dropped)
        state = _on_cluster(stays)
        assert replicas["gone"] not in state["worker_plugins"]
        for plugins in state["on_workers"].values():
            assert replicas["gone"] not in plugins and replicas["kept"] in plugins
        assert state["runs"][kept.run_id] is False  # another client's run stays
        gone.close()  # nothing left to do, and no error
        kept.fit(train, max_steps=6, progress=False)
        kept.close()
        assert replicas["kept"] not in _on_cluster(stays)["worker_plugins"]
    finally:
        left.close()
        stays.close()


def test_a_worker_that_lost_its_partitions_as_it_closes_counts_as_lost(cluster, small_data):
    train, _ = small_data

    def _close_like_a_restart(replicas: str, keys: list[str], dask_worker: Any) -> None:
        """What a worker closing in ``client.restart()`` does before its comms close.

        The scheduler frees every key (the partitions' scattered data goes), and
        the worker's close tears its plugins down (the replica's loaded
        partitions go): a step's call can still arrive in between.
        """
        from distributed.worker_state_machine import FreeKeysEvent

        dask_worker.plugins[replicas].teardown(dask_worker)
        dask_worker.handle_stimulus(FreeKeysEvent(keys=keys, stimulus_id="daskpri-test-closing"))

    with Client(cluster, timeout=60) as client:
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  transport="direct")
        trainer.fit(train, max_steps=3, progress=False)
        deployment = trainer._deployment
        worker = deployment.owner_addr[0]
        keys = [f.key for p, f in deployment.parts.items() if deployment.owner_addr[p] == worker]
        assert keys
        client.run(_close_like_a_restart, f"daskpri-{trainer.run_id}", keys, workers=[worker])
        history = trainer.fit(train, max_steps=8, progress=False)
        assert trainer.step_ == 8 and history.sizes["step"] == 8
        trainer.close()


def test_workers_over_the_memory_pause_threshold_are_refused_naming_their_memory(
    pausing_cluster, small_data
):
    train, _ = small_data
    with Client(pausing_cluster, timeout=60) as client:
        [worker] = client.scheduler_info(n_workers=-1)["workers"]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        # the replica (torch, the model) takes it over: refused before the data is placed,
        # where a scatter to the paused worker waited 30 s, then failed
        with pytest.raises(ValueError, match=(
            rf"cluster at {pausing_cluster} .* over Dask's pause threshold once they hold "
            rf"the run's replica: {worker} uses .* of its 1.86 GiB memory limit; .*"
            r"distributed.worker.memory.pause .* --memory-limit"
        )):
            trainer.fit(train, max_steps=3, progress=False)
        _wait_for(lambda: client.scheduler_info(n_workers=-1)["workers"][worker]["status"]
                  == "paused")
        # paused by now (Dask measures its memory every 100 ms): refused before set-up, once
        # the fit has waited for a worker that is not (one joining, or this one unpaused)
        with (
            dask.config.set({"daskpri.trainer.no-workers-timeout": "0.2s"}),
            pytest.raises(ValueError, match=(
                rf"are paused by Dask: {worker} uses [\d.]+ [MG]iB of its 1.86 GiB memory limit; "
                r".*--memory-limit.*; waited 0.2 s for a worker"
            )),
        ):
            trainer.fit(train, max_steps=3, progress=False)
        state = _on_cluster(client)
        assert state["worker_plugins"] == ["shuffle"] and all(state["runs"].values())
        trainer.close()


def _only_the_driver_reads(ds: Any, name: str, tmp_path: Any, monkeypatch: Any) -> str:
    """A store of ``ds`` at a path that the driver reads and the workers do not.

    The path goes through the driver's working directory here, each
    worker's own there, as a path on a driver's own disk does.
    """
    monkeypatch.chdir(tmp_path)
    ds.to_zarr(name, consolidated=False)
    return f"/proc/self/cwd/{name}"


def _none_reads(argument: str, path: str, workers: list[str]) -> str:
    """The start of the refusal of ``path`` that none of the cluster's 3 ``workers`` reads."""
    return (rf"{argument} names '{path}', which 3 of the 3 workers cannot read \({workers[0]}: "
            rf"no such file or directory; {workers[1]}: .*; {workers[2]}: .*\); "
            r".*a shared file system")


@pytest.mark.skipif(not os.path.isdir("/proc/self/cwd"), reason="needs Linux's /proc")
def test_a_store_the_workers_cannot_see_is_refused_once_naming_them(
    cluster, small_data, tmp_path, monkeypatch
):
    train, _ = small_data
    path = _only_the_driver_reads(train, "data.zarr", tmp_path, monkeypatch)
    with Client(cluster, timeout=60) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        with pytest.raises(FileNotFoundError, match=_none_reads("data", path, workers)
                           + r".*in memory"):
            trainer.fit(path, max_steps=3, progress=False)
        state = _on_cluster(client)
        assert not any(trainer.run_id in p for p in state["worker_plugins"])
        trainer.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/cwd"), reason="needs Linux's /proc")
def test_an_eval_store_the_workers_cannot_see_is_refused_before_the_first_step_naming_them(
    cluster, small_data, tmp_path, monkeypatch
):
    # eval_chunked: the workers read the eval store's chunks, by its path
    train, test = small_data
    path = _only_the_driver_reads(test, "test.zarr", tmp_path, monkeypatch)
    with Client(cluster, timeout=60) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        with pytest.raises(FileNotFoundError, match=_none_reads("eval_data", path, workers)
                           + r"\), or have the driver score it \(fit without "
                             r"eval_chunked=True\)$"):
            trainer.fit(train, eval_data=path, eval_chunked=True, max_steps=3, progress=False)
        assert trainer.step_ == 0
        # scored on the driver, which reads it, the same fit goes on
        history = trainer.fit(train, eval_data=path, max_steps=2, progress=False)
        assert np.isfinite(history["accuracy"].values[-1])
        trainer.close()


def test_eval_data_scored_on_the_cluster_runs_on_the_workers_with_the_runs_resources(
    cluster, small_data, tmp_path
):
    # as the run's steps: a GPU run's evaluation on its GPU workers, not on any worker
    train, test = small_data
    store = to_store(test.chunk({"sample": 25}), tmp_path / "test.zarr")  # 16 chunks
    with Client(cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [foo] = [a for a, w in workers.items() if w["resources"]]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  resources={"FOO": 1}, eval_every=2)
        with get_task_stream(client) as stream:
            history = trainer.fit(train, eval_data=store, eval_chunked=True, max_steps=2,
                                  progress=False)
        assert np.isfinite(history["accuracy"].values[-1])
        assert {t["worker"] for t in stream.data} == {foo}, stream.data
        trainer.close()


def test_workers_their_nanny_restarts_for_memory_as_the_replica_is_built_are_named(
    terminating_cluster, small_data
):
    train, _ = small_data
    with Client(terminating_cluster, timeout=60) as client:
        [worker] = client.scheduler_info(n_workers=-1)["workers"]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        with pytest.raises(daskpri.WorkersLostError, match=(
            rf"worker\(s\) {worker} \(at .*\) were killed and restarted by their nanny as they "
            r"built the run's replica .*distributed.worker.memory.terminate .*--memory-limit"
        )):
            trainer.fit(train, max_steps=3, progress=False)
        # the replicas are gone from the scheduler, so the worker back is left alone
        client.wait_for_workers(1, timeout=60)
        assert _on_cluster(client)["worker_plugins"] == ["shuffle"]
        trainer.close()


def test_resources_that_some_workers_lack_build_replicas_only_on_those_that_have_them(
    cluster, small_data
):
    train, _ = small_data
    with Client(cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [foo] = [a for a, w in workers.items() if w["resources"].get("FOO")]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  resources={"FOO": 1}, transport="tasks")
        trainer.fit(train, max_steps=5, progress=False)
        assert trainer._deployment.slots == [foo]
        name = f"daskpri-{trainer.run_id}"

        def replica(dask_worker: Any) -> bool:
            return hasattr(dask_worker.plugins[name], "replica")

        # the other never trains the run: no model there (memory, a device it may lack)
        assert client.run(replica) == {a: a == foo for a in workers}
        trainer.close()


def test_a_worker_that_joins_unable_to_build_the_model_is_left_out_of_the_run(
    cluster, models_dir, small_data, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(models_dir))
    import realclustermodel

    train, _ = small_data
    model = realclustermodel.Net(int(train["x"].shape[1]), int(train["y"].max()) + 1)
    joiner = None
    with Client(cluster, timeout=60) as client:
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, partition_size=100)
        trainer.fit(train, max_steps=3, progress=False)
        before = set(client.scheduler_info(n_workers=-1)["workers"])
        # a worker of another environment: the model's module is not on its path
        joiner = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster, "--nthreads", "1",
             "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        )
        try:
            client.wait_for_workers(len(before) + 1, timeout=60)
            [new] = set(client.scheduler_info(n_workers=-1)["workers"]) - before
            # the next fit looks at the cluster before its first round: the worker joined
            history = trainer.fit(train, max_steps=8, progress=False)
            assert history.sizes["step"] == 8 and new not in trainer._deployment.slots
            assert "No module named 'realclustermodel'" in trainer._deployment.unfit[new]
            trainer.close()
        finally:
            _stop([joiner])


#: a model's module whose import on a worker waits (while the file ``hold`` is there), as a
#: module that imports a large library does; each worker's import says it has begun
SLOW_MODULE = """
import os
import pathlib
import time

import torch

HERE = pathlib.Path(__file__).parent
if (HERE / "hold").exists():  # (a worker's import: the driver's came before the hold)
    (HERE / f"importing-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while (HERE / "hold").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


class Net(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x.flatten(1))
"""


def test_the_workers_import_the_models_module_off_their_event_loops(
    cluster, models_dir, small_data, monkeypatch
):
    # A worker imports torch and the model's modules as a run's replicas are set up:
    # done on its event loop, where the replica plugin arrives, it answered nothing
    # meanwhile (heartbeats, another run's probe; "Event loop was unresponsive in
    # Worker for 3.3s" where it only imported torch). Here the import waits for the test.
    (models_dir / "slowclustermodel.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(models_dir))
    import slowclustermodel

    train, _ = small_data
    hold = models_dir / "hold"
    model = slowclustermodel.Net(int(train["x"].shape[1]), int(train["y"].max()) + 1)
    with Client(cluster, timeout=60) as client:
        client.run(importlib.invalidate_caches)  # (the module was written after their start)
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        assert not any(client.run(lambda: "slowclustermodel" in sys.modules).values())
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, partition_size=100)
        errors: list[BaseException] = []

        def fit() -> None:
            try:
                trainer.fit(train, max_steps=3, progress=False)
            except BaseException as e:  # re-raised in the test's thread
                errors.append(e)

        hold.touch()
        fitting = threading.Thread(target=fit)
        fitting.start()
        answered: dict[str, Any] = {}
        asking = threading.Thread(target=lambda: answered.update(client.run(os.getpid)))
        try:
            _wait_for(lambda: len(list(models_dir.glob("importing-*"))) == len(workers),
                      timeout=120)
            # every worker is importing the module, and answers: its event loop is free
            asking.start()
            asking.join(30)
            answered_while_importing = sorted(answered)
            assert fitting.is_alive()  # (still held by the imports)
        finally:
            hold.unlink(missing_ok=True)
            fitting.join(120)
            if asking.ident is not None:
                asking.join(30)
        assert answered_while_importing == workers
        assert not fitting.is_alive() and not errors, errors
        assert trainer.step_ == 3
        trainer.close()


def test_a_worker_that_joins_a_run_imports_torch_and_the_models_module_off_its_event_loop(
    cluster, models_dir, small_data, tmp_path, monkeypatch
):
    # The scheduler hands a run's replica plugin to each worker that joins (a new one, one
    # its nanny restarted) as it registers, on its event loop: the plugin's class lived
    # with torch, and building it imported the model's modules, so the worker answered
    # nothing for seconds (a run's rescan then left it out for 30 s). The run now
    # registers a plugin that imports them in a thread. Here the import waits for the test.
    (models_dir / "slowclustermodel.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(models_dir))
    import slowclustermodel

    train, _ = small_data
    hold = models_dir / "hold"
    model = slowclustermodel.Net(int(train["x"].shape[1]), int(train["y"].max()) + 1)
    path = os.pathsep.join(filter(None, [str(models_dir), os.environ.get("PYTHONPATH")]))
    joiner = None
    with Client(cluster, timeout=60) as client:
        client.run(importlib.invalidate_caches)  # (the module may be newer than the workers)
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, partition_size=100)
        trainer.fit(train, max_steps=2, progress=False)
        before = set(client.scheduler_info(n_workers=-1)["workers"])
        hold.touch()
        try:
            # a fresh interpreter, without torch: the worker itself (no nanny)
            joiner = subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", cluster, "--nthreads",
                 "1", "--no-nanny", "--host", "127.0.0.1", "--dashboard-address",
                 "127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": path},
            )
            _wait_for(lambda: (models_dir / f"importing-{joiner.pid}").exists(), timeout=120)
            [new] = set(client.scheduler_info(n_workers=-1)["workers"]) - before
            # it has imported torch, and imports the model's module: its event loop answers
            answered: dict[str, Any] = {}
            asking = threading.Thread(
                target=lambda: answered.update(client.run(os.getpid, workers=[new])))
            asking.start()
            asking.join(15)
            answered_while_importing = dict(answered)
            hold.unlink()
            asking.join(30)
            assert answered_while_importing == {new: joiner.pid}
            # its replica built once the import ends, the next fit trains on it too
            history = trainer.fit(train, max_steps=4, progress=False)
            assert trainer._deployment is not None and new in trainer._deployment.slots
            assert int(history["n_workers"].values[-1]) == len(before) + 1
            trainer.close()
        finally:
            hold.unlink(missing_ok=True)
            if joiner is not None:
                _stop([joiner])


def test_dask_worker_nworkers_processes_are_given_distinct_devices_by_the_scheduler(cluster):
    from daskpri.replicas.devices import _address_order, choose_device

    async def chosen(count: int, resources: Any, dask_worker: Any) -> str:
        # what ReplicaPlugin runs on a worker whose process sees `count` GPUs
        return str(await choose_device(dask_worker, "cuda", count, resources))

    with Client(cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        # `dask worker --nworkers 2` starts a nanny for each process, as a worker alone has
        assert len({w["nanny"] for w in workers.values()}) == len(workers) == 3
        [host] = {w["host"] for w in workers.values()}
        # records of processes gone: one of this host, and one of a host with none left
        client.set_metadata(["daskpri", "devices", host, f"tcp://{host}:1"], "cuda:1")
        client.set_metadata(["daskpri", "devices", "10.9.9.9", "tcp://10.9.9.9:1"], "cuda:0")
        # the three processes of the host, three GPUs: one each
        assert sorted(client.run(chosen, 3, None).values()) == ["cuda:0", "cuda:1", "cuda:2"]
        # kept on the scheduler, the three choosing at once each keep theirs, and the
        # departed ones' records are dropped
        held = client.get_metadata(["daskpri", "devices"])
        assert list(held) == [host]
        held = held[host]
        assert sorted(held) == sorted(w["nanny"] for w in workers.values())
        # one that chooses later takes a GPU its live peers do not hold, not its
        # place's where a peer holds that (one that chose at another place)
        last = max(workers, key=lambda a: _address_order(workers[a]["nanny"]))
        client.set_metadata(["daskpri", "devices", host, min(held, key=_address_order)],
                            "cuda:2")
        assert client.run(chosen, 3, None, workers=[last]) == {last: "cuda:0"}
        # with the run's resources, only those that have them count: the FOO worker alone
        [foo] = [a for a, w in workers.items() if w["resources"].get("FOO")]
        assert client.run(chosen, 3, {"FOO": 1}, workers=[foo]) == {foo: "cuda:0"}


def _out_of_band(client: Client) -> dict[str, list[str]]:
    """The functions that each worker was sent with ``client.run``, as its log names them,
    oldest first."""
    return {a: [m.split("'")[1] for _, m in reversed(lines) if "Run out-of-band function" in m]
            for a, lines in client.get_worker_logs().items()}


def test_the_workers_are_asked_once_before_the_set_up(
    cluster, models_dir, small_data, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(models_dir))
    import realclustermodel

    train, _ = small_data
    path = str(tmp_path / "data.zarr")
    train.to_zarr(path, consolidated=False)
    # a model of a module that is not daskpri's, and a store: each a question to the workers
    model = realclustermodel.Net(int(train["x"].shape[1]), int(train["y"].max()) + 1)
    with Client(cluster, timeout=60) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        [foo] = [a for a, w in workers.items() if w["resources"].get("FOO")]
        before = _out_of_band(client)
        trainer = daskpri.Trainer(model, strategy="uniform", client=client, resources={"FOO": 1})
        trainer.fit(path, max_steps=1, progress=False)
        trainer.close()
        asked = {a: names[len(before[a]):] for a, names in _out_of_band(client).items()}
    # one probe of the run's worker before its set-up (and _memory once its replica is built);
    # every worker, which the replicas' plugin goes to, is asked whether it answers (getpid),
    # then to import what the plugin's set-up would import on its event loop
    assert asked == {a: ["probe", "getpid", "import_worker_side", "_memory"] if a == foo
                     else ["getpid", "import_worker_side"] for a in workers}


def test_the_checks_asked_of_workers_before_a_fit_import_no_torch_there(
    tmp_path, small_data, monkeypatch
):
    # A trainer's Jupyter check asks each worker whether the stop button kills it, and
    # the close of a cluster stops their heartbeats: both ran in modules that import
    # torch, which each worker imported on its event loop to answer (2-5 s), past the
    # check's time limit on a loaded machine, so that no warning came
    from daskpri.dashboard import notebook
    from daskpri.training._interrupts import warn_workers_unshielded
    from daskpri.training.cluster import stop_heartbeats

    monkeypatch.setattr(notebook, "in_jupyter", lambda: True)
    train, _ = small_data
    with (
        dask_cluster(tmp_path, [["--nthreads", "1"]]) as address,
        Client(address, timeout=60, set_as_default=False) as client,
    ):
        (worker,) = client.scheduler_info()["workers"]
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        # (the worker, started from this process, is in its process group); the fit's
        # first check, made here alone, so that no replica makes the worker import torch
        with pytest.warns(daskpri.DaskpriWarning,
                          match=rf"^1 worker\(s\) of the cluster \({worker}\) are in this "
                                r"kernel's process group"):
            warn_workers_unshielded(trainer)
        trainer.close()
        stop_heartbeats(client)
        assert client.run(lambda: "torch" in sys.modules) == {worker: False}


def test_the_scheduler_holds_every_strategys_table_without_importing_torch(cluster, small_data):
    # torch is the workers' and the driver's: imported by the scheduler, it held the
    # scheduler's event loop for seconds as the first run's plugin arrived (4.6 s here,
    # 9.5 s on a loaded machine) and took 200 MiB more of its memory
    train, test = small_data

    def torch_modules() -> list[str]:  # (by value: the scheduler cannot import this file)
        return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))

    with Client(cluster, timeout=60) as client:
        # each strategy's rounds through the default transport, and one's as Dask tasks
        runs = [(name, "direct") for name in sorted(daskpri.STRATEGIES)] + [("loss", "tasks")]
        for name, transport in runs:
            trainer = daskpri.Trainer(build_model("mlp", train), strategy=name, client=client,
                                      batch_size=16, eval_every=2, transport=transport)
            try:
                # rounds selected on the scheduler, and the metrics the dashboard reads
                history = trainer.fit(train, eval_data=test, max_steps=4, progress=False)
                assert history.sizes["step"] == 4
                assert client.run_on_scheduler(torch_modules) == [], (name, transport)
            finally:
                trainer.close()
        # the model sent to the tasks that score or predict on the cluster: not in their graph,
        # which the scheduler unpickles
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client,
                                  eval_every=2)
        try:
            trainer.fit(train, eval_data=test, eval_chunked=True, max_steps=2, progress=False)
            chunked = test.chunk({"sample": 100})
            assert trainer.evaluate(chunked, chunked=True)["samples"] == 400
            assert trainer.predict(chunked).compute().shape == (400, 10)
            assert client.run_on_scheduler(torch_modules) == []
        finally:
            trainer.close()
