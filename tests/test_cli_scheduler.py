"""The CLI and a scheduler elsewhere: one reached, one unreachable, one that is no scheduler.

A scheduler with two GPU=1 workers on loopback (the session's ``gpu_cluster``),
a refused port, and servers that never answer or answer HTTP.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import SMALL, SUMMARY, _cli, _open
from _procs import _stop, refusing_port

from daskpri.cli import main


def _connect_within(monkeypatch: pytest.MonkeyPatch, module: str, timeout: float) -> None:
    """``connect`` in daskpri's ``module`` gives up after ``timeout`` s, not its 10: a refused
    or unanswered connection is told the same, sooner."""
    import functools
    import importlib

    from daskpri.training.cluster import connect

    monkeypatch.setattr(importlib.import_module(module), "connect",
                        functools.partial(connect, timeout=timeout))


def test_unreachable_scheduler_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _connect_within(monkeypatch, "daskpri.cli.train", 1.0)
    with refusing_port() as port:
        address = f"tcp://127.0.0.1:{port}"
        assert main(["train", *SMALL, "--scheduler", address]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"daskpri: error: could not connect to the scheduler at {address}: ")


# -- a scheduler and two workers with GPU=1, on loopback --------------------------


def test_train_on_scheduler_uses_its_gpu_workers(gpu_cluster: str, tmp_path: Path) -> None:
    path = tmp_path / "run.nc"
    result = _cli(
        "train", "--scheduler", gpu_cluster, "--resources", "GPU=1", *SMALL, "--no-progress",
        "--output", str(path), timeout=180,
    )
    assert result.returncode == 0, result.stderr
    summary = SUMMARY.search(result.stdout)
    assert summary and summary["strategy"] == "selective-backprop"  # the default
    # started with --no-dashboard: its HTTP server lists a dashboard port, with no page there
    assert (f"dashboard: none (the scheduler serves no dashboard; watch the run with "
            f"`daskpri dashboard --scheduler {gpu_cluster}`)\n") in result.stdout
    with _open(path) as ds:
        assert ds.attrs["n_workers"] == 2
        assert ds.attrs["resources"] == "{'GPU': 1.0}"


def test_resource_no_worker_has_fails_after_the_no_workers_timeout(gpu_cluster: str) -> None:
    # such a worker may be starting: the fit waits daskpri.trainer.no-workers-timeout for one,
    # saying so, then fails saying what to do
    result = _cli(
        "train", "--scheduler", gpu_cluster, "--resources", "TPU=1", *SMALL, "--no-progress",
        timeout=240, env={"DASK_DASKPRI__TRAINER__NO_WORKERS_TIMEOUT": "0.5s"},
    )
    assert result.returncode == 2
    waiting, error = result.stderr.splitlines()
    assert waiting == (f"waiting up to 0.5 s for a worker with resources {{'TPU': 1.0}} at "
                       f"{gpu_cluster} (daskpri.trainer.no-workers-timeout)")
    assert error.startswith("daskpri: error: resources={'TPU': 1.0} were asked for")
    assert f"`dask worker {gpu_cluster} --resources TPU=1`" in error
    assert error.endswith("; waited 0.5 s for a worker with resources {'TPU': 1.0} "
                          "(daskpri.trainer.no-workers-timeout)")


def test_dashboard_command_serves_the_page_on_loopback(gpu_cluster: str, tmp_path: Path) -> None:
    import urllib.request

    proc = subprocess.Popen(  # --port 0: a free port, which it prints
        [sys.executable, "-m", "daskpri", "dashboard", "--scheduler", gpu_cluster,
         "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        said = re.fullmatch(r"daskpri dashboard: http://127\.0\.0\.1:(\d+)/daskpri", line.strip())
        assert said is not None, line
        port = int(said.group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/daskpri", timeout=30) as r:
            assert r.status == 200 and b"bokeh" in r.read().lower()
    finally:
        _stop([proc])


# -- a scheduler that does not answer ----------------------------------------------



@contextlib.contextmanager
def _silent_server(greeting: bytes = b"") -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never answers (but ``greeting``)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)  # a blocked accept() would not see the server closed
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                conn = server.accept()[0]
                accepted.append(conn)
                if greeting:
                    conn.sendall(greeting)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        server.close()
        for conn in accepted:
            conn.close()


@contextlib.contextmanager
def _http_server() -> Iterator[str]:
    """``python -m http.server`` on loopback, as a dashboard's port answers HTTP."""
    # port 0: the server takes a free one, and says which once it listens
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1",
                             "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        said = re.search(r"port (\d+)", proc.stdout.readline())
        assert said is not None, "http.server did not start"
        yield f"tcp://127.0.0.1:{said.group(1)}"
    finally:
        _stop([proc])


def _http_400_server() -> contextlib.AbstractContextManager[str]:
    """A server that answers any connection with HTTP 400, as a proxy in the way would."""
    return _silent_server(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                          b"Connection: close\r\n\r\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("server", [_silent_server, _http_server, _http_400_server])
def test_a_server_that_is_no_scheduler_fails_within_the_connect_timeout(server: Any) -> None:
    from daskpri.training.cluster import SchedulerUnreachable, connect

    with server() as address:
        before = set(threading.enumerate())
        start = time.monotonic()
        with pytest.raises(SchedulerUnreachable, match=f"could not connect to the scheduler at "
                           f"{address}: "):
            connect(address, timeout=1.0)
        assert time.monotonic() - start < 1.0 + 4
        # the half-made client is closed: its event loop's thread and the connecting one end
        deadline = time.monotonic() + 10
        while set(threading.enumerate()) - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(threading.enumerate()) - before


@pytest.mark.timeout(90)
def test_bench_on_a_server_that_is_no_scheduler_fails_rather_than_waits(tmp_path, capsys,
                                                                        monkeypatch):
    _connect_within(monkeypatch, "daskpri.bench._clusters", 1.0)
    with _silent_server() as address:
        start = time.monotonic()
        code = main(["bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
                     "--strategies", "uniform", "--no-ddp", "--no-progress", "--workers", "1",
                     "--scheduler", address, "--out", str(tmp_path / "out")])
        assert code == 1 and time.monotonic() - start < 40
    assert f"could not connect to the scheduler at {address}: no answer within" in (
        capsys.readouterr().err)
