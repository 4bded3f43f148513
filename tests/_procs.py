"""Helpers for tests that start processes: schedulers on free ports, stopping."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def start_scheduler(
    directory: Path, *args: str, output: Any = subprocess.DEVNULL
) -> tuple[str, subprocess.Popen[Any]]:
    """A ``dask scheduler`` on a loopback port of its own choosing: its address and process.

    It listens on port 0 and writes the port it got to a scheduler file, so
    no other process can take the port between a choice and the listening
    (as with a port found free beforehand). ``args`` are more of its options.
    """
    file = directory / "scheduler.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", "0", "--scheduler-file", str(file), *args],
        stdout=output, stderr=subprocess.STDOUT if output is not subprocess.DEVNULL else output,
    )
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):  # not there, or half-written
            return json.loads(file.read_text())["address"], proc
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop([proc])
            raise RuntimeError(f"dask scheduler did not start (exit status {proc.returncode})")
        time.sleep(0.1)


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs.

    Bound, not listening: no other process can listen on it meanwhile, as
    it could on a port found free and let go.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    """Terminate ``procs``, then kill those still running after 10 s."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def dask_cluster(
    directory: Path,
    workers: list[list[str]],
    *,
    expect: int | None = None,
    scheduler_args: tuple[str, ...] = ("--no-dashboard",),
    scheduler_env: dict[str, str] | None = None,
    worker_env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[str]:
    """A ``dask scheduler`` and a ``dask worker`` process for each option list of ``workers``.

    Each worker binds to loopback, its dashboard to a free port; their output
    goes to ``directory/cluster.log``. The block runs once ``expect`` workers
    (one a list where not given) have joined, and gets the scheduler's
    address; the workers are stopped first after it, so that they do not
    wait for the scheduler.
    """
    import os
    from unittest import mock

    from distributed import Client

    log = (directory / "cluster.log").open("wb")
    procs: list[subprocess.Popen[Any]] = []
    try:
        # read in the scheduler's process, which inherits this environment
        with mock.patch.dict(os.environ, scheduler_env or {}):
            address, scheduler = start_scheduler(directory, *scheduler_args, output=log)
        procs.append(scheduler)
        for options in workers:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", address, *options,
                 "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                env=dict(os.environ, **(worker_env or {})),
            ))
        with Client(address, timeout=60) as client:
            client.wait_for_workers(len(workers) if expect is None else expect, timeout=60)
        yield address
    finally:
        _stop(procs[1:])
        _stop(procs[:1])
        log.close()


#: Python code that runs its line (a trainer's fit, say) saying when a Dask worker process
#: has been started: it imports its modules then, before the preload that makes it ignore
#: an interrupt, and its LocalCluster is still starting
SPAWNED = """
start = multiprocessing.process.BaseProcess.start
def say_started(process):
    start(process)
    if "Dask Worker" in process.name:
        print("worker process started", flush=True)
multiprocessing.process.BaseProcess.start = say_started
try:
    {}
finally:
    multiprocessing.process.BaseProcess.start = start
"""
