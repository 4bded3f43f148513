"""daskpri as a Jupyter user meets it: a real kernel runs the cells, and is interrupted.

The kernel is this interpreter, found through a ``python3`` kernelspec in a
temporary ``JUPYTER_PATH`` (as in ``test_notebooks.py``); it is started in a
process group of its own, as Jupyter starts kernels, so that its interrupt
(``KernelManager.interrupt_kernel``, the stop button) reaches it and the
worker processes it starts, and nothing else. One kernel serves the module:
its tests run in order, each on trainers of its own.
"""

from __future__ import annotations

import os
import queue
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from _procs import SPAWNED as _SPAWNED

kernelspec = pytest.importorskip("ipykernel.kernelspec")
manager = pytest.importorskip("jupyter_client.manager")

#: the cells' shared set-up: small data, a model, and a LocalCluster as the README
#: starts one, for the tests that are not about the trainer's own
_SETUP = """
import gc, os, signal, time
import multiprocessing.process
import daskpri
from daskpri.models import MLP
from distributed import Client, LocalCluster
train, test = daskpri.datasets.load("synthetic", n_samples=2000, seed=0)
shared = Client(LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                             dashboard_address="127.0.0.1:0",
                             preload=["daskpri.training.worker_signals"]))
def new_trainer(model=None, **kw):
    if model is None:
        model = MLP(train["x"].shape[1:], int(train.attrs["n_classes"]), hidden=32)
    return daskpri.Trainer(model, strategy="uniform", seed=0, n_workers=1, **kw)
"""


@dataclass
class Cell:
    """What running one cell gave: its status, error and outputs."""

    status: str
    ename: str = ""
    evalue: str = ""
    stdout: str = ""
    stderr: str = ""
    data: list[dict[str, Any]] = field(default_factory=list)
    #: the styles its widgets were given (tqdm's bar: "success", "danger")
    bar_styles: list[str] = field(default_factory=list)


class Kernel:
    """A running kernel, its cells run one at a time."""

    def __init__(self, km: Any) -> None:
        self.km = km
        self.kc = km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(
        self, code: str, *, interrupt_on: str | None = None, twice: bool = False,
        timeout: float = 120,
    ) -> Cell:
        """Run ``code``; interrupt the kernel once an output holds ``interrupt_on``.

        ``"*"`` interrupts at the cell's first output; ``twice`` sends a
        second interrupt a moment after the first.
        """
        msg_id = self.kc.execute(code)
        cell = Cell("")
        interrupted = False
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the cell did not end in {timeout} s: {code}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content["execution_state"] == "idle":
                break
            text = ""
            if kind == "stream":
                text = content["text"]
                if content["name"] == "stdout":
                    cell.stdout += text
                else:
                    cell.stderr += text
            elif kind in ("display_data", "execute_result"):
                cell.data.append(content["data"])
                text = str(content["data"])
            elif kind == "error":
                cell.ename, cell.evalue = content["ename"], content["evalue"]
            elif kind == "comm_msg" and "bar_style" in content["data"].get("state", {}):
                cell.bar_styles.append(content["data"]["state"]["bar_style"])
            if (interrupt_on is not None and not interrupted and text
                    and (interrupt_on == "*" or interrupt_on in text)):
                self.km.interrupt_kernel()
                if twice:
                    time.sleep(0.3)  # the first one handled: a second interrupt, not a lost one
                    self.km.interrupt_kernel()
                interrupted = True
        cell.status = self.reply(msg_id)["content"]["status"]
        if interrupt_on is not None:
            assert interrupted, f"no output to interrupt on: {cell}"
        return cell

    def reply(self, msg_id: str) -> dict[str, Any]:
        """The shell's reply to request ``msg_id``, the replies to others before it skipped.

        ``wait_for_ready`` sends ``kernel_info_request`` again each second a reply
        is late (a kernel slow to start, on a loaded machine): the replies to the
        repeats stay queued, and read in order each cell would take the reply of
        the cell before it.
        """
        deadline = time.monotonic() + 30
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg  # type: ignore[no-any-return]

    def ok(self, code: str, **kwargs: Any) -> Cell:
        """Run ``code``, which should end without an error."""
        cell = self.run(code, **kwargs)
        assert cell.status == "ok", f"{cell.ename}: {cell.evalue}\n{cell.stderr}"
        return cell


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    """A kernel of this interpreter, with daskpri's set-up run."""
    tmp = tmp_path_factory.mktemp("jupyter")
    kernelspec.write_kernel_spec(tmp / "kernels" / "python3")
    scratch = tmp / "scratch"
    scratch.mkdir()
    env = {**os.environ, "JUPYTER_PATH": str(tmp), "TMPDIR": str(scratch),
           "DASK_DASKPRI__CACHE_DIR": str(tmp / "cache")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(tmp))
        km = manager.KernelManager(kernel_name="python3")
        km.start_kernel(cwd=str(scratch), env=env)
    try:
        k = Kernel(km)
        # as wait_for_ready leaves where the kernel starts slowly: a reply no cell asked for
        k.kc.kernel_info()
        k.ok(_SETUP)
        yield k
        k.kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


def test_an_interrupt_during_fit_stops_it_after_the_step_in_flight(
    kernel: Kernel, tmp_path: Path
) -> None:
    kernel.ok(f"trainer = new_trainer(client=shared, "
              f"checkpoint_path={str(tmp_path / 'run.ckpt')!r})")
    # the progress bar appears once the run is set up: the interrupt comes as it steps
    cell = kernel.run("h = trainer.fit(train, eval_data=test, max_steps=10**6)",
                      interrupt_on="*")
    assert cell.status == "error" and cell.ename == "KeyboardInterrupt"
    assert cell.evalue.startswith("the fit was interrupted and stopped at step_=")
    assert "its history is trainer.history_; fit again to go on" in cell.evalue
    assert cell.stderr.startswith("daskpri: stopping the fit after the step in flight")
    assert "Traceback" not in cell.stderr
    # the trainer is whole: its history has a record a step, its checkpoint the last
    # step, and it fits on
    cell = kernel.ok(
        "steps = trainer.step_\n"
        "print(trainer.history_.sizes['step'] == steps, trainer.checkpointed_step_ == steps)\n"
        "h = trainer.fit(train, max_steps=steps + 3, progress=False)\n"
        "print(h.sizes['step'] - steps, trainer.table_.sizes['sample'])\n"
        f"print(trainer.save({str(tmp_path / 'again.ckpt')!r}) is not None)\n"
        "trainer.close()"
    )
    assert cell.stdout.split() == ["True", "True", "3", "1600", "True"]
    assert cell.stderr == ""


def test_an_interrupt_as_the_trainer_starts_its_cluster_leaves_its_workers_running(
    kernel: Kernel,
) -> None:
    """Jupyter's interrupt reaches a worker process that is still starting."""
    kernel.ok("trainer = new_trainer()")
    cell = kernel.run(_SPAWNED.format("trainer.fit(train, max_steps=10**6)"),
                      interrupt_on="worker process started")
    assert (cell.ename, cell.evalue) == (
        "KeyboardInterrupt",
        "the fit was interrupted during its set-up, before its first step: nothing was "
        "trained (step_=0); fit again to train",
    )
    assert cell.stderr == ("daskpri: stopping the fit as its set-up ends, before its first "
                           "step: nothing is trained (interrupt again to stop at once)\n")
    cell = kernel.ok(
        "print(len(trainer.client.scheduler_info()['workers']))\n"
        "print(trainer.fit(train, max_steps=2, progress=False).sizes['step'])\n"
        "trainer.close()"
    )
    assert cell.stdout.split() == ["1", "2"]
    assert "Traceback" not in cell.stderr


def test_a_trainer_made_again_by_its_cell_closes_the_cluster_of_the_one_it_replaces(
    kernel: Kernel,
) -> None:
    cell = "trainer = new_trainer()\nh = trainer.fit(train, max_steps=2, progress=False)"
    kernel.ok(cell)
    kernel.ok("first = trainer._own_cluster")
    kernel.ok(cell)  # run again: the first trainer is dropped, never closed
    cell = kernel.ok(
        "import threading\n"
        "gc.collect()\n"
        "for thread in threading.enumerate():\n"
        "    if thread.name == 'daskpri-close-dropped':\n"
        "        thread.join()\n"
        "print(first.status.name, trainer._own_cluster.status.name)\n"
        "trainer.close()"
    )
    assert cell.stdout.split() == ["closed", "running"]


def test_a_trainer_dropped_after_an_interrupted_fit_closes_its_cluster(kernel: Kernel) -> None:
    """IPython keeps the interrupt's traceback until the next error: not the trainer."""
    kernel.ok("trainer = new_trainer()")
    cell = kernel.run("trainer.fit(train, max_steps=10**6)", interrupt_on="*")
    assert cell.ename == "KeyboardInterrupt"
    cell = kernel.ok(
        "import threading, weakref, psutil\n"
        "cluster = trainer._own_cluster\n"
        "pids = [nanny.pid for nanny in cluster.workers.values()]\n"
        "dropped = weakref.ref(trainer)\n"
        "del trainer\n"
        "gc.collect()\n"
        "for thread in threading.enumerate():\n"
        "    if thread.name == 'daskpri-close-dropped':\n"
        "        thread.join()\n"
        "print(len(pids), dropped() is None, cluster.status.name,\n"
        "      any(psutil.pid_exists(pid) for pid in pids))"
    )
    # the worker processes ran on, held by sys.last_traceback's frames, until the next error
    assert cell.stdout.split() == ["1", "True", "closed", "False"]


def test_a_trainer_interrupted_as_it_starts_its_cluster_outside_a_fit_owns_it(
    kernel: Kernel,
) -> None:
    """The interrupt is raised once the cluster has started, which the trainer owns."""
    kernel.ok("trainer = new_trainer()")
    cell = kernel.run(_SPAWNED.format("trainer.client"), interrupt_on="worker process started")
    assert (cell.ename, cell.evalue) == ("KeyboardInterrupt", "")
    # its finalizer, which closes the cluster of a trainer dropped without close(), is made
    # (a trainer whose call raised is kept until another error, by IPython's %debug)
    cell = kernel.ok(
        "print(len(trainer.client.scheduler_info()['workers']), trainer._dropped.alive)\n"
        "cluster = trainer._own_cluster\n"
        "trainer.close()\n"
        "print(cluster.status.name)"
    )
    assert cell.stdout.split() == ["1", "True", "closed"]


def test_closing_a_trainer_leaves_the_cluster_of_another_as_quiet_as_it_was(
    kernel: Kernel,
) -> None:
    """A LocalCluster puts back distributed's INFO logs as it closes, over another's."""
    kernel.ok(
        # distributed's handlers as a kernel has them before any cluster (the shared one
        # silenced them): the trainer's cluster finds them so
        "import logging\n"
        "for handler in logging.getLogger('distributed').handlers:\n"
        "    handler.setLevel(logging.NOTSET)\n"
        "first = new_trainer()\n"
        "first.fit(train, max_steps=1, progress=False)\n"
        "first.close()"
    )
    # the shared cluster's scheduler registers the new run's replicas, logging it at INFO
    cell = kernel.ok("second = new_trainer(client=shared)\n"
                     "second.fit(train, max_steps=1, progress=False)\nsecond.close()")
    assert " - INFO - " not in cell.stderr


def test_a_fit_on_workers_that_the_stop_button_would_kill_warns_once(kernel: Kernel) -> None:
    cell = kernel.ok(
        "cluster = LocalCluster(n_workers=1, threads_per_worker=1, host='127.0.0.1', "
        "dashboard_address='127.0.0.1:0')\n"
        "client = Client(cluster)\n"
        "trainer = new_trainer(client=client)\n"
        "trainer.fit(train, max_steps=1, progress=False)\n"
        "trainer.fit(train, max_steps=2, progress=False)\n"
        "trainer.close(); client.close(); cluster.close()"
    )
    assert cell.stderr.count("DaskpriWarning") == 1
    assert ("1 worker(s) of the cluster (tcp://127.0.0.1:" in cell.stderr
            and "start the LocalCluster with preload=['daskpri.training.worker_signals'] to "
                "keep them" in cell.stderr)
    # the shared cluster's workers have it preloaded
    cell = kernel.ok("trainer = new_trainer(client=shared)\n"
                     "trainer.fit(train, max_steps=1, progress=False)\ntrainer.close()")
    assert "DaskpriWarning" not in cell.stderr


def test_an_interrupt_as_a_trainer_closes_its_cluster_leaves_it_closed(kernel: Kernel) -> None:
    kernel.ok(
        "trainer = new_trainer()\ntrainer.fit(train, max_steps=1, progress=False)\n"
        "cluster = trainer._own_cluster\n"
        "def close(close=cluster.close, **kwargs):\n"  # says when the cluster's close begins
        "    print('closing the cluster', flush=True)\n"
        "    return close(**kwargs)\n"
        "cluster.close = close"
    )
    cell = kernel.run("trainer.close()", interrupt_on="closing the cluster")
    assert cell.ename == "KeyboardInterrupt"
    # cut short, the cluster stayed "closing", and a second close() waited for it for ever
    cell = kernel.ok("trainer.close()\nprint(cluster.status.name, repr(trainer))", timeout=60)
    assert cell.stdout.split() == ["closed", "<Trainer", "Uniform(batch_size=None),", "step",
                                   "1,", "closed>"]


@pytest.mark.skipif(not find_spec("ipywidgets"), reason="tqdm draws a widget with ipywidgets")
def test_a_fit_ended_by_max_time_before_max_steps_draws_its_bar_as_done(kernel: Kernel) -> None:
    kernel.ok("trainer = new_trainer(client=shared)")
    cell = kernel.ok("trainer.fit(train, max_steps=10**6, max_time=0.5)\ntrainer.close()")
    assert cell.bar_styles == ["success"]  # a bar closed short of its total was "danger"


def test_a_second_interrupt_in_an_evaluation_keeps_the_steps_record(kernel: Kernel) -> None:
    """The second interrupt raises at once: here in the evaluation after a step."""
    kernel.ok(
        "class Slow(MLP):\n"  # says when it is evaluated on the driver, and takes its time
        "    announce = False\n"
        "    def forward(self, x):\n"
        "        if self.announce and not self.training:\n"
        "            print('evaluating', flush=True)\n"
        "            time.sleep(5)\n"
        "        return super().forward(x)\n"
        "model = Slow(train['x'].shape[1:], int(train.attrs['n_classes']), hidden=32)\n"
        "trainer = new_trainer(model, client=shared, eval_every=1)\n"
        "trainer.fit(train, eval_data=test, max_steps=1, progress=False)\n"
        "model.announce = True"
    )
    cell = kernel.run("trainer.fit(train, eval_data=test, max_steps=10, progress=False)",
                      interrupt_on="evaluating", twice=True)
    assert (cell.ename, cell.evalue) == ("KeyboardInterrupt", "")
    cell = kernel.ok("print(trainer.step_, trainer.history_.sizes['step'])\ntrainer.close()")
    assert cell.stdout.split() == ["2", "2"]



def test_a_background_fits_warning_points_at_the_cell_that_started_it(kernel: Kernel) -> None:
    cell = kernel.ok(
        "trainer = new_trainer(client=shared, lr_schedule='cosine', schedule_steps=2)\n"
        "future = trainer.fit_in_background(train, max_steps=3)\n"
        "future.result()\n"
        "trainer.close()"
    )
    [line, source, _] = cell.stderr.split("\n")
    assert re.fullmatch(r".*/ipykernel_\d+/\d+\.py:2: DaskpriWarning: lr_schedule='cosine' "
                        r"decays to 0 at step 2 .*", line)  # not the thread pool's line
    assert source == "  future = trainer.fit_in_background(train, max_steps=3)"
