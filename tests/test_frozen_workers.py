"""Workers that freeze: a fit, its set-up and its close are not held up by them.

A frozen worker (its process stopped with ``SIGSTOP``: the scheduler lists it,
its port accepts connections at the kernel level, nothing answers) holds any
call that waits for it until the scheduler drops it
(``distributed.scheduler.worker-ttl``, 5 minutes by default). A
LocalCluster of two worker processes on loopback (its workers forked from the
suite's forkserver start at once, where ``dask worker`` processes would each
import torch afresh, and its scheduler in this process has daskpri imported
already); a worker process is stopped by the driver at a moment of the fit,
and always continued after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import dask
import pytest
from _fits import wait_while_fitting
from distributed import Client, LocalCluster

import daskpri
from daskpri.models import build_model
from daskpri.training import _run, deployment, transport

#: seconds within which a fit (or a close) with a frozen worker must end: well under the
#: 5 minutes of distributed.scheduler.worker-ttl that would end a wait for it otherwise
BOUND = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The address of a scheduler with two one-thread worker processes."""
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[Callable[[], None]]:
    """A function that stops process ``pid`` (``SIGSTOP``); continued after the block."""
    try:
        yield lambda: os.kill(pid, signal.SIGSTOP)
    finally:
        os.kill(pid, signal.SIGCONT)


def freeze_as_scattered_to(monkeypatch: pytest.MonkeyPatch,
                           freeze: Mapping[str, Callable[[], None]]) -> None:
    """Make each worker of ``freeze`` (address: its freezing function) freeze as the
    set-up's placement scatters partitions to it, before the scatter."""
    scatter = deployment.scatter_to

    def scatter_to(client: Client, data: list, address: str, timeout: float) -> list:
        if address in freeze:
            freeze[address]()
        return scatter(client, data, address, timeout)

    monkeypatch.setattr(deployment, "scatter_to", scatter_to)


def bounded(call: Callable[[], Any], what: str) -> Any:
    """``call()``, in a thread, failing the test where it has not ended within :data:`BOUND`."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as e:
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    if thread.is_alive():  # where it waits, for the failure to say
        frame = sys._current_frames().get(thread.ident or 0)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)"
        raise AssertionError(f"{what} did not end within {BOUND:g} s of a frozen worker; "
                             f"its thread waits in:\n{stack}")
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_worker_that_freezes_after_the_probe_is_left_out_of_the_fit_and_its_close(
    cluster, small_data, monkeypatch, caplog
):
    # a worker that freezes between the probe and the set-up: the registration's
    # broadcast, the partitions' scatter and its load task would wait for it
    train, _ = small_data
    monkeypatch.setattr(transport, "REGISTER_ANSWER_TIMEOUT", 1.0)
    with Client(cluster, timeout=60, set_as_default=False) as client:
        pids = client.run(os.getpid)
        stays, stops = sorted(pids)
        probe = _run.check_cluster
        with frozen(pids[stops]) as freeze:
            def probed(*args: Any, **kwargs: Any) -> list[str]:
                silent = probe(*args, **kwargs)
                freeze()  # both answered the probe; one is frozen before the set-up
                return silent

            monkeypatch.setattr(_run, "check_cluster", probed)
            asked: list[str] = []  # the workers asked to join the run as it goes

            def responsive(client: Client, addresses: list[str], **kwargs: Any) -> list[str]:
                asked.extend(addresses)
                return answering(client, addresses, **kwargs)

            answering = deployment.responsive
            monkeypatch.setattr(deployment, "responsive", responsive)
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                      client=client, n_workers=2, transport="tasks")
            caplog.set_level(logging.WARNING, logger="daskpri")
            with dask.config.set({"daskpri.trainer.scheduler-timeout": "5s",
                                  "daskpri.trainer.rescan-interval": "10ms"}):
                history = bounded(lambda: trainer.fit(train, max_steps=3, progress=False),
                                  "the fit")
                # looked for at each step, it is not asked again, and again (2 s each)
                assert stops not in asked
                assert (f"worker(s) {stops} did not answer within 1 s as the run's replicas "
                        "were set up: the run goes on without them") in caplog.text
                assert list(history["n_workers"].values) == [1, 1, 1]
                assert trainer._deployment is not None
                assert trainer._deployment.slots == [stays]
                start = time.monotonic()
                bounded(trainer.close, "the trainer's close")
                assert time.monotonic() - start < 5  # not the scheduler-timeout's wait
            assert (f"worker(s) {stops} did not answer as the run's replicas were dropped "
                    "(within 1 s; 1 s for those the run had left out): each keeps its "
                    "replica") in caplog.text
        # continued, it gets the scheduler's messages that waited for it, in either order
        # (the remove read before the add): no replica left, once they are handled
        gone_after_thaw(client, trainer.run_id)


def gone_after_thaw(client: Client, part: str) -> None:
    """Wait (10 s at most) until no worker holds a plugin whose name has ``part``."""
    def held() -> list[str]:
        plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
        return [p for ps in plugins.values() for p in ps if part in p]

    wait_while_fitting(lambda: not held(), f"a worker still holds a plugin of {part} after 10 s",
                       None, timeout=10.0)


def test_a_worker_whose_set_up_outlasts_the_setup_timeout_is_left_out_naming_the_setting(
    cluster, small_data, tmp_path, caplog
):
    # torch or the model's module imported from a slow shared file system, a large model:
    # one worker's set-up takes longer than daskpri.trainer.setup-timeout allows
    train, _ = small_data
    module = "daskpri_test_slow_to_import"
    with Client(cluster, timeout=60, set_as_default=False) as client:
        pids = client.run(os.getpid)
        fast, slow = sorted(pids)
        (tmp_path / f"{module}.py").write_text(
            "import os\nimport time\n\nfrom torch import nn\n\n"
            f"if os.getpid() == {pids[slow]}:\n    time.sleep(4)\n\n\n"
            "class Wrapped(nn.Module):\n"
            "    def __init__(self, inner):\n"
            "        super().__init__()\n"
            "        self.inner = inner\n\n"
            "    def forward(self, x):\n"
            "        return self.inner(x)\n")

        def on_path(path: str, add: bool) -> None:
            if add:
                sys.path.insert(0, path)
            else:
                sys.path.remove(path)
                sys.modules.pop(module, None)

        client.run(on_path, str(tmp_path), True)
        on_path(str(tmp_path), True)
        try:
            model = __import__(module).Wrapped(build_model("mlp", train))
            trainer = daskpri.Trainer(model, strategy="uniform", client=client, n_workers=2)
            caplog.set_level(logging.WARNING, logger="daskpri")
            with dask.config.set({"daskpri.trainer.setup-timeout": "1s"}):
                history = bounded(lambda: trainer.fit(train, max_steps=3, progress=False),
                                  "the fit")
            assert (f"worker(s) {slow} did not set the run's replica up within 1 s "
                    "(daskpri.trainer.setup-timeout: ") in caplog.text
            assert "did not answer within" not in caplog.text  # (not taken for frozen)
            assert list(history["n_workers"].values) == [1, 1, 1]
            assert trainer._deployment is not None
            assert trainer._deployment.slots == [fast]
            # its import ends (the sleep), and it answers again
            assert client.run(lambda: module in sys.modules, workers=[slow]) == {slow: True}
            bounded(trainer.close, "the trainer's close")
        finally:
            client.run(on_path, str(tmp_path), False)
            on_path(str(tmp_path), False)


def test_a_replica_set_up_after_its_run_dropped_it_is_dropped_again(cluster, small_data):
    # what a frozen worker does when it thaws and reads the plugin's remove before its add
    from distributed.protocol import pickle

    from daskpri.replicas.worker import ReplicaPlugin
    from daskpri.table.plugin import PLUGIN_NAME, TablePlugin

    train, _ = small_data
    module = pickle.dumps(build_model("mlp", train))
    gone, kept = ReplicaPlugin("gone-1", module, 10), ReplicaPlugin("kept-1", module, 10)
    with Client(cluster, timeout=60, set_as_default=False) as client:
        if not client.run_on_scheduler(lambda dask_scheduler: PLUGIN_NAME in
                                       dask_scheduler.plugins):
            client.register_plugin(TablePlugin())
        client.register_plugin(kept)  # the scheduler holds it: each worker keeps its replica

        async def add(plugin: bytes, dask_worker: Any = None) -> Any:
            return await dask_worker.plugin_add(plugin=plugin, name=gone.name)

        try:
            assert all(r == {"status": "OK"} for r in client.run(add, pickle.dumps(gone))
                       .values())  # set up: its replica built
            gone_after_thaw(client, gone.name)
            plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
            assert all(kept.name in ps for ps in plugins.values()), plugins
        finally:
            client.unregister_worker_plugin(kept.name)


def test_a_replica_its_run_dropped_waits_for_the_schedulers_remove_on_its_way(
    cluster, small_data
):
    """The scheduler dropped the plugin after this set-up's add, its remove still on its way:
    the remove finds the plugin, rather than a replica that removed itself (distributed's
    'failed to teardown' and a KeyError in the worker's log)."""
    from distributed.protocol import pickle

    from daskpri.replicas.worker import DROP_GRACE, ReplicaPlugin
    from daskpri.table.plugin import PLUGIN_NAME, TablePlugin

    train, _ = small_data
    gone = ReplicaPlugin("late-1", pickle.dumps(build_model("mlp", train)), 10)
    with Client(cluster, timeout=60, set_as_default=False) as client:
        if not client.run_on_scheduler(lambda dask_scheduler: PLUGIN_NAME in
                                       dask_scheduler.plugins):
            client.register_plugin(TablePlugin())

        async def add_then_remove(plugin: bytes, dask_worker: Any = None) -> Any:
            added = await dask_worker.plugin_add(plugin=plugin, name=gone.name)
            await asyncio.sleep(DROP_GRACE / 4)  # the scheduler's answer is in by now
            return added, await dask_worker.plugin_remove(name=gone.name)

        answers = client.run(add_then_remove, pickle.dumps(gone))
        assert all(a == ({"status": "OK"}, {"status": "OK"}) for a in answers.values()), answers
        time.sleep(DROP_GRACE + 0.5)  # its check over: nothing else removed, nothing logged
        logs = client.get_worker_logs()
        assert not [line for ls in logs.values() for _, line in ls
                    if gone.name in line and "teardown" in line], logs
        plugins = client.run(lambda dask_worker: sorted(dask_worker.plugins))
        assert not [p for ps in plugins.values() for p in ps if gone.name in p], plugins


def _removed_first(client: Client, address: str, name: str) -> bool:
    """Whether the worker at ``address`` read plugin ``name``'s remove before its add."""
    logs = client.get_worker_logs(workers=[address])[address]
    return any(f"Worker plugin {name} failed to teardown" in line for _, line in logs)


def test_a_registration_goes_on_without_a_worker_that_freezes_under_it_and_names_all_frozen(
    cluster, monkeypatch
):
    from distributed import WorkerPlugin

    monkeypatch.setattr(transport, "REGISTER_ANSWER_TIMEOUT", 1.0)  # (a live worker's)
    plugins = [WorkerPlugin(), WorkerPlugin()]
    for i, plugin in enumerate(plugins):
        plugin.name = f"daskpri-test-frozen-{i}"
    with (dask.config.set({"daskpri.trainer.setup-timeout": "200ms"}),
          Client(cluster, timeout=60, set_as_default=False) as client):
        pids = client.run(os.getpid)
        stays, stops = addresses = sorted(pids)
        with contextlib.ExitStack() as stack:
            freeze = [stack.enter_context(frozen(pids[a])) for a in addresses]
            asked = transport._silent

            async def silent(*args: Any) -> list[str]:
                found = await asked(*args)
                freeze[1]()  # both answered; one freezes before the broadcast reaches it
                return found

            monkeypatch.setattr(transport, "_silent", silent)
            left_out = bounded(lambda: transport.register(client, plugins[0]), "the registration")
            assert left_out == [stops]
            monkeypatch.setattr(transport, "_silent", asked)
            freeze[0]()  # none answers
            monkeypatch.setattr(transport, "REGISTER_ANSWER_TIMEOUT", 0.3)
            with (dask.config.set({"daskpri.trainer.no-workers-timeout": "500ms"}),
                  pytest.raises(daskpri.WorkersLostError,
                                match=r"no worker of the cluster answered within 0.5 s "
                                      r"\(daskpri.trainer.no-workers-timeout\) as the run's "
                                      rf"replicas were set up: {stays}, {stops}; "
                                      r".*restart \(or stop\) those workers")):
                bounded(lambda: transport.register(client, plugins[1]), "the registration")
            bounded(partial(transport.unregister, client, plugins[0].name, 5.0), "the drop")
        transport.unregister(client, plugins[1].name, 5.0)
        # continued, each gets the scheduler's messages that waited for it. A plugin's add
        # and remove come on two connections, read in either order: a remove read first
        # finds nothing (distributed logs its KeyError), and the add read after it stays.
        # (daskpri's own replicas drop themselves then: the test of DROP_GRACE above.)
        def held() -> dict[str, list[str]]:
            return client.run(lambda dask_worker: [
                p for p in dask_worker.plugins if p.startswith("daskpri-test-frozen")])

        def settled() -> bool:
            return all(_removed_first(client, a, n) for a, names in held().items()
                       for n in names)

        wait_while_fitting(settled, "a worker holds a test plugin after 20 s whose remove it "
                                    "did not read before its add", None)


def test_an_owner_that_freezes_as_its_partitions_are_scattered_is_left_out_after_step_timeout(
    cluster, small_data, monkeypatch
):
    # it answered the probe and the registration; the scheduler's send of its data (and
    # a load task sent to it) would wait for it until worker-ttl drops it, if ever
    train, _ = small_data
    with Client(cluster, timeout=60, set_as_default=False) as client:
        pids = client.run(os.getpid)
        stays, stops = sorted(pids)
        with frozen(pids[stops]) as freeze:
            freeze_as_scattered_to(monkeypatch, {stops: freeze})
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                      client=client, n_workers=2)
            with dask.config.set({"daskpri.trainer.step-timeout": "2s"}):
                history = bounded(lambda: trainer.fit(train, max_steps=2, progress=False),
                                  "the fit")
            assert list(history["n_workers"].values) == [1, 1]
            assert trainer._deployment is not None
            assert trainer._deployment.slots == [stays]
            assert trainer._excluded == {stops}  # as a worker stuck in a step is
        trainer.close()


@pytest.mark.parametrize("frozen_owners", ["one", "each"])
def test_a_set_up_that_gives_up_on_frozen_owners_says_they_did_not_answer_not_that_they_died(
    cluster, small_data, monkeypatch, frozen_owners
):
    # one: it freezes as its partitions come, and the set-up may not retry; each: the
    # first at the set-up's placement, the other at the re-plan's, none left to place on
    train, _ = small_data
    drops: list[float] = []  # how long the failed set-up's drop of its replicas took

    def unregister(*args: Any, **kwargs: Any) -> None:
        start = time.monotonic()
        try:
            transport.unregister(*args, **kwargs)
        finally:
            drops.append(time.monotonic() - start)

    monkeypatch.setattr(_run, "unregister", unregister)
    with Client(cluster, timeout=60, set_as_default=False) as client:
        pids = client.run(os.getpid)
        stays, stops = sorted(pids)
        if frozen_owners == "one":
            freezing = {stops: pids[stops]}
            config = {"daskpri.trainer.max-retries": 0}
            how = (r"the set-up failed 1 time \(daskpri.trainer.max-retries=0; last: "
                   r"StepTimeout: .*\); see why those workers do not answer")
        else:
            freezing = pids
            config = {"daskpri.trainer.no-workers-timeout": "500ms"}
            how = (r"after waiting the step timeout for those that did not answer, no suitable "
                   r"worker was left for daskpri.trainer.no-workers-timeout \(0.5 s: ")
        with contextlib.ExitStack() as stack:
            freeze_as_scattered_to(monkeypatch, {
                a: stack.enter_context(frozen(pid)) for a, pid in freezing.items()})
            trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform",
                                      client=client, n_workers=2)
            with (dask.config.set({"daskpri.trainer.step-timeout": "2s", **config}),
                  pytest.raises(daskpri.WorkersLostError, match=(
                      rf"^workers stopped answering as the run was set up: worker\(s\) "
                      rf"{', '.join(sorted(freezing))} did not answer within "
                      rf"daskpri.trainer.step-timeout \(2 s\) and were left out, and {how}"))):
                bounded(lambda: trainer.fit(train, max_steps=2, progress=False), "the fit")
            # the owners left out were given a second again, not 5 s twice (the scheduler's
            # call, which waits for them, then the workers asked)
            assert len(drops) == 1
            assert drops[0] < transport.REGISTER_ANSWER_TIMEOUT
        trainer.close()


def test_the_jupyter_interrupt_check_names_the_workers_it_kills_but_a_frozen_one(
    cluster, small_data, monkeypatch
):
    # the others' answers kept: the whole check, capped at the scheduler timeout, was skipped
    from daskpri.dashboard import notebook
    from daskpri.training._interrupts import warn_workers_unshielded

    train, _ = small_data
    monkeypatch.setattr(notebook, "in_jupyter", lambda: True)
    with Client(cluster, timeout=60, set_as_default=False) as client:
        pids = client.run(os.getpid)
        stays, stops = sorted(pids)
        trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=client)
        with (
            frozen(pids[stops]) as freeze,
            dask.config.set({"daskpri.trainer.scheduler-timeout": "500ms"}),
            pytest.warns(daskpri.DaskpriWarning,
                         match=rf"^1 worker\(s\) of the cluster \({stays}\) are in this "
                               r"kernel's process group and do not ignore its interrupt"),
        ):
            freeze()  # (in the pytest process's group, as a notebook's LocalCluster's are)
            warn_workers_unshielded(trainer)
        trainer.close()
