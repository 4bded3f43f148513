"""TLS credentials checked before connecting, a dashboard that says its scheduler is away,
and a damaged CIFAR-10 batch named in one line."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pytest
from _procs import _stop, refusing_port, start_scheduler
from _servers import page_server
from distributed import Client, LocalCluster
from distributed.security import Security
from test_datasets import write_cifar

from daskpri.cli import main
from daskpri.dashboard.components import RunStatus
from daskpri.dashboard.remote import unreachable
from daskpri.dashboard.snapshot import snapshot_from_run
from daskpri.data import load
from daskpri.training.cluster import lacks_tls_credentials

NO_TLS_CONFIG = {
    "distributed.comm.tls.ca-file": None,
    "distributed.comm.tls.client.cert": None,
    "distributed.comm.tls.client.key": None,
}
TRAIN = ["train", "--no-progress", "--n-samples", "1000", "--max-steps", "3"]


def _tls_config(files: dict[str, str]) -> dict[str, str]:
    return {
        "distributed.comm.tls.ca-file": files["--tls-ca-file"],
        "distributed.comm.tls.client.cert": files["--tls-cert"],
        "distributed.comm.tls.client.key": files["--tls-key"],
    }


@pytest.fixture(scope="module")
def tls_credentials(tmp_path_factory) -> tuple[Security, dict[str, str]]:
    """Temporary TLS credentials, and the client's as PEM files by the ``--tls-*`` flag."""
    security = Security.temporary()
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for flag, text in (("--tls-ca-file", security.tls_ca_file),
                       ("--tls-cert", security.tls_client_cert),
                       ("--tls-key", security.tls_client_key)):
        path = folder / f"{flag.strip('-')}.pem"
        path.write_text(text)
        files[flag] = str(path)
    return security, files


@pytest.fixture(scope="module")
def tls_cluster(tls_credentials) -> Iterator[tuple[str, dict[str, str]]]:
    """A loopback TLS LocalCluster of one worker, and its client's credentials as PEM files."""
    security, files = tls_credentials
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", protocol="tls://",
                      security=security, dashboard_address="127.0.0.1:0") as cluster:
        yield cluster.scheduler_address, files


@pytest.fixture(scope="module")
def tls_scheduler(tls_credentials, tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """A ``dask scheduler`` with TLS on loopback and no workers, and a client's PEM files."""
    _, files = tls_credentials
    # the scheduler's certificate is the client's: Security.temporary() makes one for all
    address, proc = start_scheduler(
        tmp_path_factory.mktemp("scheduler"), "--no-dashboard", "--protocol", "tls",
        *(arg for item in files.items() for arg in item),
    )
    try:
        assert address.startswith("tls://127.0.0.1:")
        yield address, files
    finally:
        _stop([proc])


def _flags(files: dict[str, str]) -> list[str]:
    return [arg for item in files.items() for arg in item]


# -- train: a tls:// scheduler's credentials ------------------------------------------


def test_a_tls_scheduler_without_credentials_is_refused_before_connecting(capsys):
    with refusing_port() as port, dask.config.set(NO_TLS_CONFIG):
        assert main([*TRAIN, "--scheduler", f"tls://127.0.0.1:{port}"]) == 2
    assert capsys.readouterr().err == (
        "daskpri: error: a tls:// scheduler needs --tls-ca-file, --tls-cert and --tls-key (or "
        "Dask's config distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
        f"distributed.comm.tls.client.key), but got --scheduler tls://127.0.0.1:{port} "
        "without them\n"
    )


@pytest.mark.parametrize("flag", ["--tls-ca-file", "--tls-cert", "--tls-key"])
def test_a_missing_tls_file_is_named_before_connecting(flag, tls_cluster, tmp_path, capsys):
    address, files = tls_cluster
    missing = str(tmp_path / "missing.pem")
    given = [arg for f, path in {**files, flag: missing}.items() for arg in (f, path)]
    assert main([*TRAIN, "--scheduler", address, *given]) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: {flag} should be a readable PEM file, but got {flag} {missing!r}, "
        "which does not exist\n"
    )


def test_a_tls_file_ssl_cannot_read_is_named(tls_cluster, tmp_path, capsys):
    address, files = tls_cluster
    junk = tmp_path / "junk.pem"
    junk.write_text("Page not found\n")
    assert main([*TRAIN, "--scheduler", address, "--tls-ca-file", str(junk),
                 "--tls-cert", files["--tls-cert"], "--tls-key", files["--tls-key"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"daskpri: error: --tls-ca-file {str(junk)!r} holds no CA certificate")
    assert err.count("\n") == 1


def test_connect_refuses_a_tls_address_without_credentials():
    from daskpri.training.cluster import connect

    with dask.config.set(NO_TLS_CONFIG), pytest.raises(
        ValueError, match=r"^the scheduler at tls://127\.0\.0\.1:1 speaks TLS, but no TLS "
                          r"credentials were given"
    ):
        connect("tls://127.0.0.1:1")


def test_a_tls_scheduler_trains_with_the_tls_flags_or_dasks_config(tls_cluster, capsys):
    address, files = tls_cluster
    flags = [arg for item in files.items() for arg in item]
    assert main([*TRAIN, "--scheduler", address, *flags]) == 0
    with dask.config.set(_tls_config(files)):
        assert not lacks_tls_credentials(address)
        assert main([*TRAIN, "--scheduler", address]) == 0  # not refused: Dask's config
    out = capsys.readouterr().out
    assert len(re.findall(r"^[\w-]+: 3 steps,", out, flags=re.M)) == 2, out


# -- dashboard ----------------------------------------------------------------------


# -- dashboard and bench: train's --tls-* options ----------------------------------------


def _command(name: str, tmp_path: Any) -> list[str]:
    """``dashboard`` or ``bench`` as far as their TLS options, which they check first."""
    if name == "dashboard":
        return ["dashboard", "--port", "0"]
    return ["bench", "--quick", "--no-ddp", "--workers", "1", "--no-progress",
            "--out", str(tmp_path / "bench")]


@contextlib.contextmanager
def _never_serving() -> Iterator[None]:
    """The dashboard's server made an error: started, it would serve for good."""
    from daskpri.dashboard import remote

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dashboard started serving")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(remote, "make_server", never)
        yield


@pytest.mark.parametrize("command", ["dashboard", "bench"])
def test_dashboard_and_bench_refuse_a_tls_scheduler_without_credentials(
    command, tmp_path, capsys
):
    with refusing_port() as port, dask.config.set(NO_TLS_CONFIG), _never_serving():
        argv = [*_command(command, tmp_path), "--scheduler", f"tls://127.0.0.1:{port}"]
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        "daskpri: error: a tls:// scheduler needs --tls-ca-file, --tls-cert and --tls-key (or "
        "Dask's config distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
        f"distributed.comm.tls.client.key), but got --scheduler tls://127.0.0.1:{port} "
        "without them\n"
    )
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("command", ["dashboard", "bench"])
@pytest.mark.parametrize("flag", ["--tls-ca-file", "--tls-cert", "--tls-key"])
def test_dashboard_and_bench_name_a_missing_tls_file(
    command, flag, tls_scheduler, tmp_path, capsys
):
    address, files = tls_scheduler
    missing = str(tmp_path / "missing.pem")
    with _never_serving():
        argv = [*_command(command, tmp_path), "--scheduler", address,
                *_flags({**files, flag: missing})]
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: {flag} should be a readable PEM file, but got {flag} {missing!r}, "
        "which does not exist\n"
    )


def test_bench_takes_the_tls_files_only_with_a_scheduler(tls_credentials, tmp_path, capsys):
    _, files = tls_credentials
    assert main([*_command("bench", tmp_path), *_flags(files)]) == 2
    assert capsys.readouterr().err == (
        "daskpri: error: --tls-ca-file, --tls-cert and --tls-key go together, with "
        "--scheduler\n"
    )


def test_bench_connects_to_a_tls_scheduler_with_the_tls_flags(tls_scheduler, tmp_path, capsys):
    """Its check before the first run, that the scheduler has the workers, asks it over TLS."""
    address, files = tls_scheduler
    with dask.config.set({**NO_TLS_CONFIG, "daskpri.trainer.no-workers-timeout": "0.2s"}):
        argv = [*_command("bench", tmp_path), "--n-samples", "600", "--scheduler", address,
                *_flags(files)]
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: the benchmark needs 1 workers, but the scheduler at {address} has "
        "0; start more or pass --workers up to 0; waited 0.2 s for 1 worker(s) "
        "(daskpri.trainer.no-workers-timeout)\n"
    )
    assert not (tmp_path / "bench").exists()


def test_dashboard_connects_to_a_tls_scheduler_with_the_tls_flags(tls_scheduler):
    """The page's Client, made with the --tls-* files, is one of the scheduler's clients."""
    address, files = tls_scheduler
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM__TLS")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "daskpri", "dashboard", "--scheduler", address, "--port", "0",
         *_flags(files)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "PYTHONPATH": os.getcwd()},
    )
    security = Security(tls_ca_file=files["--tls-ca-file"], tls_client_cert=files["--tls-cert"],
                        tls_client_key=files["--tls-key"], require_encryption=True)
    try:
        out, err = _lines(proc.stdout), _lines(proc.stderr)
        url = out.get(timeout=60).strip()
        assert re.fullmatch(r"daskpri dashboard: http://127\.0\.0\.1:\d+/daskpri", url), url
        with Client(address, security=security, set_as_default=False) as client:

            def clients() -> int:
                return len(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.clients))

            before = clients()
            with urllib.request.urlopen(url.split(": ", 1)[1], timeout=30) as response:
                assert response.status == 200  # a session, whose first refresh connects
            deadline = time.monotonic() + 30
            while clients() == before and time.monotonic() < deadline:
                time.sleep(0.1)
            assert clients() == before + 1
        # the probe at start reached it too: no warning that it could not
        assert err.empty(), err.get()
        assert proc.poll() is None
    finally:
        _stop([proc])


def test_dashboards_probe_reaches_a_tls_scheduler_through_dasks_config(tls_cluster):
    address, files = tls_cluster
    with dask.config.set(_tls_config(files)):
        assert asyncio.run(unreachable(address, timeout=5)) is None


def _lines(stream: Any) -> queue.Queue[str]:
    """The lines ``stream`` gives, read in a thread (a pipe's read would block the test)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_dashboard_warns_at_start_that_its_scheduler_is_unreachable_and_keeps_serving():
    with refusing_port() as port:
        scheduler = f"tcp://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "daskpri", "dashboard", "--scheduler", scheduler,
             "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            out, err = _lines(proc.stdout), _lines(proc.stderr)
            url = out.get(timeout=60).strip()
            assert re.fullmatch(r"daskpri dashboard: http://127\.0\.0\.1:\d+/daskpri", url)
            warning = err.get(timeout=30).strip()
            # the cause is Dask's last attempt's: refused, or cut short by the timeout
            assert re.fullmatch(
                rf"daskpri: warning: could not reach the scheduler at {scheduler} now \(Timed "
                rf"out trying to connect to {scheduler} after 3 s: (ConnectionRefusedError: "
                r"\[Errno 111\] Connection refused|TimeoutError)\); the page will keep trying",
                warning,
            ), warning
            assert proc.poll() is None  # warned, not stopped: the page keeps trying
            page = url.split(": ", 1)[1]
            with urllib.request.urlopen(page, timeout=30) as response:
                assert response.status == 200
        finally:
            _stop([proc])


def _page_server(scheduler: str, connect_timeout: float) -> contextlib.AbstractContextManager[Any]:
    """The page's Bokeh server for ``scheduler``, serving in a thread."""
    return page_server(scheduler, port=0, connect_timeout=connect_timeout)


def test_the_page_says_its_scheduler_is_unreachable_rather_than_no_run_yet():
    with refusing_port() as port, _page_server(f"tcp://127.0.0.1:{port}", 1.0) as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/daskpri", timeout=30):
            pass  # opens a session, whose first refresh connects
        [session] = server.get_sessions("/daskpri")
        table = session.document.get_model_by_name("daskpri-status-table")
        deadline = time.monotonic() + 20
        while "cannot be reached" not in table.text and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (
            f"the scheduler cannot be reached: Timed out trying to connect to "
            f"tcp://127.0.0.1:{port} after 1 s: "
        ) in table.text
        assert "no daskpri run yet" not in table.text


def test_the_status_shows_the_run_again_once_the_scheduler_answers():
    from test_dashboard import add_step, make_run

    status = RunStatus()
    status.unreachable("refused")
    assert status.source.data["value"][0] == "the scheduler cannot be reached: refused"
    status.unreachable(None)
    assert status.source.data["value"][0] == "no daskpri run yet"
    run = make_run("loss")
    add_step(run, 0, [0, 1], [1.0, 2.0])
    status.update(snapshot_from_run(run, name="r1"))
    status.unreachable("refused")
    assert "cannot be reached: refused" in status.root.text
    status.unreachable(None)
    assert status.source.data["value"][0] == "r1" and "cannot be reached" not in status.root.text



# -- a damaged CIFAR-10 batch -------------------------------------------------------


class _Calls:
    """A pickle that calls ``func(*args)``, with a global the loader allows."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b"I am not a pickle\n", "ValueError: could not convert string to int",
                     id="text"),
        pytest.param(b"garbage\n", r"ValueError: invalid literal for int() with base 10: "
                     r"'arbage\n'", id="garbage"),
        pytest.param(b"Page not found\n", "UnpicklingError: A load persistent id instruction "
                     "was encountered, but no persistent_load function was specified.",
                     id="web-page"),
        pytest.param(b"", "EOFError: Ran out of input", id="empty"),
        # well-formed pickles of other things: the allowed globals called wrongly
        pytest.param(pickle.dumps(_Calls(dict, 5), protocol=2),
                     "TypeError: 'int' object is not iterable", id="dict-of-an-int"),
        pytest.param(b"K\x01K\x02a.", "AttributeError: 'int' object has no attribute 'append'",
                     id="append-to-an-int"),
    ],
)
def test_a_damaged_cifar_batch_is_one_line_naming_the_file(tmp_path, content, why):
    write_cifar(tmp_path)
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(content)
    expected = (
        f"the CIFAR-10 files in {str(tmp_path)!r} could not be read: {batch} is not a pickle "
        f"of data ({why}) (a truncated download or a file of another kind: fetch them again)"
    )
    with pytest.raises(ValueError) as info:
        load("cifar10", root=str(tmp_path))
    assert str(info.value) == expected
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)


def test_the_cli_tells_a_damaged_cifar_batch_in_one_line(tmp_path, capsys):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_1").write_bytes(b"Page not found\n")
    assert main(["train", "--dataset", "cifar10", "--root", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskpri: error: the CIFAR-10 files in ") and err.count("\n") == 1
    assert str(tmp_path / "data_batch_1") in err


def test_cifar_labels_that_are_not_integers_name_the_file(tmp_path):
    write_cifar(tmp_path)
    batch = tmp_path / "test_batch"
    data = np.zeros((3, 3072), dtype=np.uint8)
    batch.write_bytes(pickle.dumps({b"data": data, b"labels": ["cat", "dog", "cat"]}, protocol=4))
    with pytest.raises(ValueError, match=re.escape(
        f"{batch} should hold b'data' as an array and b'labels' as a list of integers, but "
        "they could not be read so (ValueError: invalid literal for int() with base 10: 'cat')"
    )):
        load("cifar10", root=str(tmp_path))


def test_the_standalone_app_checks_and_warns_as_daskpri_dashboard() -> None:
    """``python dashboards/daskpri_app.py``: the page served, an unreachable scheduler told."""
    app = [sys.executable, os.path.join(os.path.dirname(__file__), "..", "dashboards",
                                        "daskpri_app.py")]
    bad = subprocess.run([*app, "--scheduler", "tcp://127.0.0.1:port"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr.startswith("daskpri: error: --scheduler should be a scheduler's address "
                                 "such as tcp://127.0.0.1:8786, but got --scheduler "
                                 "'tcp://127.0.0.1:port'"), bad.stderr
    with refusing_port() as port:
        proc = subprocess.Popen([*app, "--scheduler", f"tcp://127.0.0.1:{port}", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stderr is not None
            said = re.fullmatch(r"daskpri dashboard: (http://127\.0\.0\.1:\d+/daskpri)\n",
                                proc.stdout.readline())
            assert said is not None
            with urllib.request.urlopen(said.group(1), timeout=30) as r:
                assert r.status == 200
            warning = proc.stderr.readline()
            assert warning.startswith(f"daskpri: warning: could not reach the scheduler at "
                                      f"tcp://127.0.0.1:{port} now ("), warning
            assert warning.endswith("); the page will keep trying\n"), warning
        finally:
            _stop([proc])
