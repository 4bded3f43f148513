"""Ctrl-C in the CLI: a run interrupted closes its cluster and keeps what it did.

The command as a terminal's foreground job gets SIGINT; its workers' heartbeats
stop before the cluster closes, and interrupted waits are not reported after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from _cli_runs import SMALL, _open
from _procs import SPAWNED, _stop

import daskpri
from daskpri.cli import _exiting, _run
from daskpri.cli._arguments import _parser
from daskpri.cli._interrupt import _interruptible
from daskpri.models import build_model
from daskpri.training import checkpoint
from daskpri.training._interrupts import Interrupts, _fit_says

# Ctrl-C as a terminal's foreground job gets it. A shell starts background jobs
# (``make test &``) with SIGINT ignored, their children inherit that, and
# Python then leaves it ignored: the child is given Python's handler back.
_FOREGROUND = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'daskpri'; runpy.run_module('daskpri', run_name='__main__')"
)


def test_interrupt_closes_the_cluster_and_exits_130() -> None:
    argv = [sys.executable, "-c", _FOREGROUND, "train", *SMALL[:4], "--max-time", "60",
            "--workers", "1", "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("dashboard: ")  # the cluster is up
        time.sleep(1.0)  # into the training loop
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        err = ""
        while not err.endswith("daskpri: interrupted\n") and (line := proc.stderr.readline()):
            err += line
        # main has returned 130; the interpreter exits (a second or so, tearing torch down):
        # a Ctrl-C meanwhile changes no exit status (it killed the command, -2)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        err += proc.communicate(timeout=60)[1]
    finally:
        _stop([proc])
    assert proc.returncode == 130, err
    assert err.endswith("daskpri: interrupted\n") and "Traceback" not in err


def test_a_ctrl_c_as_the_bench_starts_a_cluster_is_raised_once_it_started_and_it_closes():
    """Raised in the middle of LocalCluster(...), it left a cluster half made, owned by none.

    (A terminal's Ctrl-C, to the process group, also killed its worker processes as they
    started, and distributed's close of it at exit failed.)
    """
    from distributed import SpecCluster
    from distributed.core import Status

    from daskpri.bench._clusters import _Clusters

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    before = set(SpecCluster._instances)
    clusters = _Clusters(None)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt), clusters:
        clusters.client(1)
        time.sleep(5)  # (the interrupt came after the start: it lands here)
    started = [c for c in list(SpecCluster._instances) if c not in before]
    assert started and all(c.status == Status.closed for c in started), started
    assert clusters._cluster is None and clusters._client is None


#: the command in the foreground (as _FOREGROUND), saying on stdout when the worker process
#: of its LocalCluster has been started (the cluster still starts then, for seconds) and when
#: the cluster has started, in each module that starts one
_STARTING = """
import multiprocessing.process, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv[0] = "daskpri"
import daskpri.bench._clusters, daskpri.cli.demo, daskpri.training._cleanup
def saying(start):
    def started(*args, **kwargs):
        cluster = start(*args, **kwargs)
        print("cluster started", flush=True)
        return cluster
    return started
for module in (daskpri.bench._clusters, daskpri.cli.demo, daskpri.training._cleanup):
    module.local_cluster = saying(module.local_cluster)
""" + SPAWNED.format("runpy.run_module('daskpri', run_name='__main__')")


@pytest.mark.parametrize("command", [
    ["train", *SMALL[:4], "--max-time", "60", "--workers", "1", "--no-progress"],
    ["demo", "--dataset", "synthetic", "--workers", "1", "--max-time", "60"],
    ["bench", "--quick", "--datasets", "synthetic", "--workers", "1", "--no-progress", "--out"],
], ids=["train", "demo", "bench"])
def test_a_ctrl_c_as_the_commands_cluster_starts_is_said_at_once_and_ends_it_once_started(
    command: list[str], tmp_path: Path
) -> None:
    """Held until the cluster has started (seconds), it was said only then: the command
    seemed deaf to it."""
    if command[0] == "bench":
        command = [*command, str(tmp_path / "bench")]
    # its own process group, as a terminal's foreground job: Ctrl-C reaches the workers too;
    # one stream, for the order of what it says
    proc = subprocess.Popen([sys.executable, "-c", _STARTING, *command], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        lines = []
        while (line := proc.stdout.readline()) and line != "worker process started\n":
            lines.append(line)
        assert line, "".join(lines)
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        _stop([proc])
        with contextlib.suppress(ProcessLookupError):  # its workers, where left running
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out
    said = ("daskpri: stopping once the cluster has started (cut short, its start would "
            "leave worker processes running)\n")
    # said as the cluster still started, once; the interrupt raised once it had
    assert out.count(said) == 1 and out.index(said) < out.index("cluster started\n"), out
    assert out.endswith("daskpri: interrupted\n") and "Traceback" not in out, out


def test_a_ctrl_c_with_traceback_shows_where_it_landed_and_exits_130(capsys) -> None:
    """Let through, it killed the command with SIGINT (-2), not the 130 of an interrupt."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here")

    def hangs(args: Any) -> int:  # a command that hangs, and is interrupted
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        pytest.fail("the interrupt did not raise")

    args = _parser().parse_args(["strategies", "--traceback"])
    args.run = hangs
    try:
        status = _run(args)
    except KeyboardInterrupt:  # (failed here, not the session's interrupt)
        pytest.fail("the interrupt was let through: the command dies of SIGINT, -2")
    assert status == 130
    err = capsys.readouterr().err
    assert "Traceback" in err and ", in hangs\n" in err, err
    assert err.endswith("KeyboardInterrupt\ndaskpri: interrupted\n"), err


def test_interrupt_writes_the_history_and_checkpoint_of_the_step_it_ended_on(
    tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "run.nc", tmp_path / "run.ckpt"
    argv = [sys.executable, "-c", _FOREGROUND, "train", *SMALL[:4], "--max-time", "60",
            "--workers", "1", "--output", str(out), "--checkpoint", str(ckpt),
            "--checkpoint-every", "100000"]
    # its own process group, as a terminal's foreground job: Ctrl-C reaches the workers too
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    err = bytearray()
    assert proc.stderr is not None and proc.stdout is not None
    stderr = proc.stderr.fileno()
    reader = threading.Thread(
        target=lambda: err.extend(b"".join(iter(lambda: os.read(stderr, 4096), b""))), daemon=True
    )

    def stepped() -> bool:  # the progress bar has counted a step
        chunks = bytearray()
        for chunk in iter(lambda: os.read(stderr, 4096), b""):
            chunks += chunk
            if re.search(rb"[1-9]\d*step", chunks):
                err.extend(chunks)
                return True
        err.extend(chunks)
        return False

    try:
        assert stepped(), err.decode()
        os.killpg(proc.pid, signal.SIGINT)
        reader.start()
        rest = proc.stdout.read().decode()
        proc.wait(timeout=60)
        reader.join(10)
    finally:
        _stop([proc])
    assert proc.returncode == 130
    # (a traceback may come before it: distributed's sync() cancels a future it may not have
    # made yet when the interrupt lands in it; test_interrupt_closes_the_cluster_... pins that)
    assert err.decode().endswith("daskpri: interrupted\n")
    said = re.search(rf"^interrupted at step (\d+): the history so far written to "
                     rf"{re.escape(str(out))}$", rest, re.M)
    assert said is not None, rest
    with _open(out) as ds:
        assert ds.sizes["step"] == int(said.group(1)) > 0
        assert ds.attrs["dataset"] == "synthetic" and ds.attrs["model"] == "mlp"
    # the run ended after its step in flight, and its checkpoint is of that step
    assert f"the checkpoint in {ckpt} is of step {said.group(1)}" in rest
    assert checkpoint.read(ckpt)["step"] == int(said.group(1))
    text = err.decode()
    assert "daskpri: stopping after the step in flight (Ctrl-C again to stop at once)" in text
    # the workers ignored it: none was lost, nothing was reported
    assert "Traceback" not in text and "lose scattered data" not in text, text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def _heartbeat_running(dask_worker) -> bool:
    return dask_worker.periodic_callbacks["heartbeat"].is_running()


def _start_heartbeat(dask_worker) -> None:
    dask_worker.periodic_callbacks["heartbeat"].start()
    logger = logging.getLogger("distributed.worker")
    for f in [f for f in logger.filters if type(f).__name__ == "ClosingHeartbeatFilter"]:
        logger.removeFilter(f)


def _filters(dask_worker) -> list[str]:
    return [type(f).__name__ for f in logging.getLogger("distributed.worker").filters]


@contextlib.contextmanager
def _captured(logger: logging.Logger) -> Iterator[list[logging.LogRecord]]:
    """The records ``logger`` passes on (after its filters) while the block runs."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def _logged_errors(dask_worker) -> list[str]:
    # what distributed's worker logs when a heartbeat fails, and another ERROR
    logger = logging.getLogger("distributed.worker")
    with _captured(logger) as records:
        for message in ("Failed to communicate with scheduler during heartbeat.",
                        "Failed to communicate with scheduler during heartbeat, and more",
                        "Unexpected exception during heartbeat. Closing worker."):
            try:
                raise OSError("Stream is closed")
            except OSError:
                logger.exception(message)
    return [r.getMessage() for r in records]


def test_workers_stop_their_heartbeats_before_a_cluster_daskpri_started_closes(gpu_client):
    # a heartbeat on its way while the cluster closes would end the run with a
    # worker's traceback (dask/distributed#7105)
    from daskpri.training.cluster import stop_heartbeats

    assert all(gpu_client.run(_heartbeat_running).values())
    assert all(len(logged) == 3 for logged in gpu_client.run(_logged_errors).values())
    try:
        stop_heartbeats(gpu_client)
        assert not any(gpu_client.run(_heartbeat_running).values())
        # one already on its way still fails as the scheduler closes: only its
        # ERROR goes unlogged
        for logged in gpu_client.run(_logged_errors).values():
            assert logged == ["Failed to communicate with scheduler during heartbeat, and more",
                              "Unexpected exception during heartbeat. Closing worker."]
        stop_heartbeats(gpu_client)  # twice: one filter
        assert all(names.count("ClosingHeartbeatFilter") == 1
                   for names in gpu_client.run(_filters).values())
    finally:
        gpu_client.run(_start_heartbeat)  # the fixture's workers go on


def _abandon(exc: Exception) -> None:
    """A task that fails with ``exc`` and is dropped unawaited, as an interrupted gather's."""
    loop = asyncio.new_event_loop()

    async def wait() -> None:
        raise exc

    task = loop.create_task(wait())
    loop.run_until_complete(asyncio.sleep(0))  # it runs and fails; nothing retrieves it
    loop.close()
    del task
    gc.collect()  # asyncio reports it as its task is collected


def test_an_interrupted_gathers_waits_are_not_reported_after_the_interrupt():
    # a Ctrl-C in Client.gather leaves its waits to end with AllExit as the
    # cluster closes; asyncio would print each with a traceback after
    # "daskpri: interrupted"
    from distributed.client import AllExit

    from daskpri.training.cluster import _AbandonedGatherFilter, drop_abandoned_gathers

    logger = logging.getLogger("asyncio")
    try:
        with _captured(logger) as records:
            _abandon(AllExit())
            _abandon(ValueError("a real failure"))
        assert [type(r.exc_info[1]) for r in records if r.exc_info] == [AllExit, ValueError]
        drop_abandoned_gathers()
        drop_abandoned_gathers()  # twice: one filter
        assert sum(isinstance(f, _AbandonedGatherFilter) for f in logger.filters) == 1
        with _captured(logger) as records:
            _abandon(AllExit())
            _abandon(ValueError("a real failure"))
        assert [type(r.exc_info[1]) for r in records if r.exc_info] == [ValueError]
    finally:
        for f in [f for f in logger.filters if isinstance(f, _AbandonedGatherFilter)]:
            logger.removeFilter(f)


# the finalizer's KeyboardInterrupt is the point: Python reports it as unraisable
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_lost_in_a_finalizer_still_stops_the_fit(gpu_client, small_data):
    train, _ = small_data
    outer = signal.getsignal(signal.SIGINT)
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)

    class Finalized:
        def __del__(self) -> None:
            # the handler runs, and raises, in here: Python prints and drops it
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)

    try:
        # an ignored SIGINT (a background job's) stays ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _interruptible(trainer):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        # as a foreground job
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(KeyboardInterrupt), _interruptible(trainer):
            Finalized()
            trainer.fit(train, max_steps=200, progress=False)
        assert trainer.step_ == 0  # the fit ended before its first step
        # the handler is put back
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # the first interrupt only asks the fit to stop; a second raises at once
        reached = False
        with pytest.raises(KeyboardInterrupt), _interruptible(trainer):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            reached = True
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            pytest.fail("the second interrupt did not raise")
        assert reached
    finally:
        signal.signal(signal.SIGINT, outer)
        trainer.close()


def test_a_ctrl_c_during_the_set_up_says_the_fit_ends_before_its_first_step(
    gpu_client, small_data, capfd
) -> None:
    train, _ = small_data
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    trainer = daskpri.Trainer(build_model("mlp", train), strategy="uniform", client=gpu_client)
    try:
        with (pytest.raises(KeyboardInterrupt, match=r"^the fit was interrupted during its "
                            r"set-up, before its first step: nothing was trained \(step_=0\)"),
              _interruptible(trainer)):
            os.kill(os.getpid(), signal.SIGINT)  # as the fit starts: before its set-up ends
            trainer.fit(train, max_steps=200, progress=False)
    finally:
        trainer.close()
    assert trainer.step_ == 0
    err = capfd.readouterr().err
    assert ("daskpri: stopping as the run's set-up ends, before its first step: nothing is "
            "trained (Ctrl-C again to stop at once)\n") in err, err
    assert "step in flight" not in err, err
    # the library's words (Jupyter's stop button), by the same phases
    assert _fit_says(Interrupts()) == (
        "daskpri: stopping the fit as its set-up ends, before its first step: nothing is "
        "trained (interrupt again to stop at once)")
    assert "after the step in flight" in _fit_says(Interrupts(stepping=True))
    assert "waiting for workers" in _fit_says(Interrupts(waiting=True))


def test_a_command_exiting_with_a_cluster_still_open_leaves_ctrl_c_to_stop_it(gpu_client):
    """Its close at exit could wait on the cluster's workers: a Ctrl-C may still be needed."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    try:
        _exiting()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stepping(others: set[Any]) -> Any:
    """The LocalCluster started since ``others`` whose run has taken 10 steps, if one has."""
    from distributed.deploy.spec import SpecCluster

    for c in [c for c in list(SpecCluster._instances) if c not in others]:
        runs = getattr(c.scheduler, "plugins", {}).get("daskpri")
        if runs is not None and any(r.last_step >= 10 for r in list(runs.runs.values())):
            return c
    return None


def test_a_second_ctrl_c_as_the_close_waits_on_a_stuck_worker_kills_it(
    capfd, monkeypatch
) -> None:
    # the first Ctrl-C ends the fit; its worker stuck since, the close after it waits for
    # it (the run's release 10 s, the cluster's close 14 s more): a second Ctrl-C then
    # kills the workers of the trainer's own LocalCluster, as elsewhere, and the command
    # ends with its cluster closed, not at exit
    from distributed.deploy.spec import SpecCluster

    from daskpri.cli import main
    from daskpri.training._cleanup import TRAINERS
    from daskpri.training.trainer import Trainer

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    others = set(SpecCluster._instances)
    stuck: list[psutil.Process] = []
    second: list[float] = []
    close = Trainer._close

    def stuck_close(self: Trainer, *, kill_workers: bool) -> None:
        # (the first Ctrl-C's close: the fit has ended, its step whole)
        if self._own_cluster is not None and not stuck:
            assert self.step_ >= 10  # (the fit stepped, and the first Ctrl-C ended it)
            [nanny] = self._own_cluster.workers.values()
            stuck.append(psutil.Process(nanny.process.pid))
            stuck[0].suspend()

            def interrupt() -> None:
                time.sleep(0.5)  # (the close waits for the worker)
                second.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=interrupt, daemon=True).start()
        close(self, kill_workers=kill_workers)

    monkeypatch.setattr(Trainer, "_close", stuck_close)

    def interrupt_once() -> None:  # once the command's trainer steps
        deadline = time.monotonic() + 30
        while not any(t._own_cluster is not None and t.step_ >= 10 for t in list(TRAINERS)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once, daemon=True).start()
    try:
        code = main(["train", "--workers", "1", "--dataset", "synthetic", "--n-samples",
                     "2000", "--max-time", "60", "--no-progress"])
        ended = time.monotonic()
    finally:
        left = [c for c in list(SpecCluster._instances) if c not in others
                and c.status.name not in ("closing", "closed")]
        for p in stuck:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        for c in left:  # (without the mend: its worker stuck, it is closed at exit)
            c.close()
    err = capfd.readouterr().err
    assert code == 130 and stuck and second, err
    assert err.endswith("daskpri: interrupted\n") and "Traceback" not in err, err
    assert " - ERROR - " not in err, err
    # the command's LocalCluster is closed, its stuck worker killed
    assert not left, err
    with contextlib.suppress(psutil.NoSuchProcess):  # killed, and reaped by its nanny
        assert stuck[0].status() == psutil.STATUS_ZOMBIE
    assert ended - second[0] < 8.0, (ended - second[0], err)  # (a backstop)


def test_a_second_ctrl_c_kills_the_stuck_worker_of_the_demos_cluster(capfd) -> None:
    # daskpri demo's LocalCluster is the command's, not its trainers': a worker stuck in a step
    # is killed all the same, not waited for (Nanny.close's 4 s, and 10 s for the heartbeats)
    from distributed.deploy.spec import SpecCluster

    from daskpri.cli import main

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("SIGINT is not Python's own here: daskpri does not take it")
    others = set(SpecCluster._instances)
    stuck: list[psutil.Process] = []
    second: list[float] = []
    returned = threading.Event()

    def interrupt_twice() -> None:
        try:
            deadline = time.monotonic() + 30
            while (demo := _stepping(others)) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert demo is not None
            [nanny] = demo.workers.values()
            stuck.append(psutil.Process(nanny.process.pid))
            stuck[0].suspend()  # its step in flight now never ends
            time.sleep(0.5)  # (the driver waits for it)
        finally:  # (the demo ends, whatever happened here)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            if not returned.is_set():  # (not to interrupt pytest)
                second.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt_twice, daemon=True)
    thread.start()
    try:
        try:
            code = main(["demo", "--workers", "1", "--dataset", "synthetic", "--max-time", "60"])
            returned.set()
            ended = time.monotonic()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C come too late
        except KeyboardInterrupt:  # come as the demo returned
            code, ended = None, time.monotonic()
        thread.join(10)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for p in stuck:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    err = capfd.readouterr().err  # (distributed's log too)
    assert code == 130 and stuck and second, err  # the first Ctrl-C waited for the step
    assert ended - second[0] < 8.0, (ended - second[0], err)  # (0.02 s here; 15 s before)
    assert " - ERROR - " not in err and "WARNING" not in err, err
    with contextlib.suppress(psutil.NoSuchProcess):  # killed, and reaped by its nanny
        assert stuck[0].status() == psutil.STATUS_ZOMBIE
