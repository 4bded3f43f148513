"""Paths of the command line that the rest of the suite leaves aside.

``report --baseline`` and ``--title``, ``dashboard --address``, ``bench
--pick final``, a second Ctrl-C during ``train``, and a resumed run's
``transport`` and ``device``; on real clusters and real subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import xarray as xr
from _procs import _stop
from _servers import page_server
from distributed import Client, LocalCluster

import daskpri
from daskpri.cli import main
from daskpri.data.io import to_store
from daskpri.models import build_model
from daskpri.training import checkpoint


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A scheduler on loopback with one worker process of one thread."""
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as c:
        yield c


# -- report --baseline, --title ---------------------------------------------------------


def _history(path: Path, strategy: str, accuracy: list[float]) -> Path:
    """A run's history of ``len(accuracy)`` steps, as ``daskpri train --output`` writes it."""
    n = len(accuracy)
    ds = xr.Dataset(
        {k: ("step", np.asarray(v, dtype=float)) for k, v in {
            "time": np.arange(1, n + 1) * 0.5, "loss": np.linspace(2.0, 1.0, n),
            "accuracy": accuracy, "samples_per_second": [1000.0] * n,
            "compute_time": [0.01] * n, "communication_time": [0.02] * n,
            "selection_time": [0.001] * n, "optimizer_time": [0.002] * n}.items()},
        coords={"step": np.arange(n)},
        attrs={"strategy": strategy, "dataset": "synthetic", "model": "mlp"},
    )
    to_store(ds, path)
    return path


def test_report_names_its_baseline_and_shows_the_title(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _history(tmp_path / "sb.nc", "selective-backprop", [0.5, 0.7, 0.8, 0.9])
    base = _history(tmp_path / "uniform-lr0.1.nc", "uniform", [0.4, 0.5, 0.7, 0.8])
    out = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(out), "--baseline", str(base),
                 "--title", "SB <against> uniform"]) == 0
    assert capsys.readouterr().out == f"report written to {out}\n"
    page = out.read_text()
    header = _header(page)
    # the title, escaped, is the page's and its heading
    assert "<title>SB &lt;against&gt; uniform</title>" in page
    assert header.startswith("<h1 style='margin: 0 0 8px 0'>SB &lt;against&gt; uniform</h1>")
    # the baseline is named by its file, beside the run, with the speedup against it
    assert re.search(r">run</th><td[^>]*>sb\.nc</td><td[^>]*>uniform-lr0\.1\.nc</td>", header)
    assert "Time to accuracy against uniform-lr0.1.nc" in header
    assert '"baseline: uniform-lr0.1.nc"' in page  # the curves' legend

    # without them: the strategy's title, and no baseline anywhere
    plain = tmp_path / "plain.html"
    assert main(["report", str(run), "-o", str(plain)]) == 0
    page = plain.read_text()
    assert "<title>daskpri report: selective-backprop</title>" in page
    assert _header(page).startswith("<h1 style='margin: 0 0 8px 0'>daskpri report: "
                                    "selective-backprop</h1>")
    assert "uniform-lr0.1.nc" not in page and "Time to accuracy against" not in page


def _header(page: str) -> str:
    """The HTML of the report's header, the first Div of its Bokeh document."""
    [doc] = re.findall(r'<script type="application/json" id="[^"]*">\s*(.*?)\s*</script>',
                       page, re.S)
    texts: list[str] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            if obj.get("name") == "Div":
                texts.append(html.unescape(obj["attributes"]["text"]))  # as file_html wrote it
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(json.loads(doc))
    return texts[0]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "none.nc",
         "baseline names {base!r}, but there is no such file or directory"),
        (lambda p: _write(p / "notes.nc", "not a history\n"),
         "baseline {base!r} is not a readable netcdf history"),
        (lambda p: _stripped(p / "base.nc"),
         "baseline should have the per-step variable 'samples_per_second' (along 'step'), as "
         "trainer.history_ and `daskpri train --output` have it, but it is missing; variables: "
         "accuracy, communication_time, compute_time, loss, optimizer_time, selection_time, "
         "time"),
    ],
    ids=["missing", "not-a-history", "lacks-a-variable"],
)
def test_a_baseline_that_is_no_history_is_a_one_line_error_naming_what_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, message: str
) -> None:
    run = _history(tmp_path / "run.nc", "loss", [0.5, 0.6])
    base = make(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(out), "--baseline", str(base)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskpri: error: " + message.format(base=str(base)))
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _stripped(path: Path) -> Path:
    """A history without its ``samples_per_second``."""
    full = _history(path.with_name("full.nc"), "uniform", [0.4, 0.5])
    with xr.open_dataset(full, engine="h5netcdf") as ds:
        to_store(ds.load().drop_vars("samples_per_second"), path)
    return path


# -- dashboard --address ----------------------------------------------------------------


def _can_bind(host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError:
            return False
    return True


def _dashboard(scheduler: str, *args: str) -> subprocess.Popen[str]:
    """``daskpri dashboard`` on a free port (``--port 0``), which it prints."""
    return subprocess.Popen(
        [sys.executable, "-m", "daskpri", "dashboard", "--scheduler", scheduler,
         "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _answers(host: str, port: int) -> bool:
    """Whether ``host:port`` serves the /daskpri page (False: the connection is refused)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/daskpri", timeout=30) as r:
            return r.status == 200 and b"bokeh" in r.read().lower()
    except urllib.error.URLError as e:
        if isinstance(e.reason, ConnectionRefusedError):
            return False
        raise


@pytest.mark.skipif(not _can_bind("127.0.0.2"), reason="127.0.0.2 is no loopback address here")
def test_dashboard_listens_on_the_address_asked_for_and_on_loopback_by_default() -> None:
    with LocalCluster(n_workers=0, processes=False, host="127.0.0.1", protocol="tcp",
                      dashboard_address="127.0.0.1:0") as c:
        # both at once: each is a Python starting up
        started = [_dashboard(c.scheduler_address, "--address", "127.0.0.2"),
                   _dashboard(c.scheduler_address)]
        try:
            for proc, host, other in zip(
                started, ("127.0.0.2", "127.0.0.1"), ("127.0.0.1", "127.0.0.2"), strict=True
            ):
                assert proc.stdout is not None and proc.stderr is not None
                line = proc.stdout.readline()
                said = re.fullmatch(rf"daskpri dashboard: http://{re.escape(host)}:(\d+)/daskpri\n",
                                    line)
                assert said is not None, (
                    line + proc.stderr.read() if proc.poll() is not None else line)
                port = int(said.group(1))
                assert _answers(host, port)
                assert not _answers(other, port)  # bound to that address alone
        finally:
            _stop(started)


def test_dashboard_open_to_the_network_takes_the_websocket_of_a_page_opened_by_name() -> None:
    """A browser elsewhere opens the page by this machine's name: its websocket is taken."""
    # no scheduler needed: the page says it has none
    with page_server("tcp://127.0.0.1:1", address="0.0.0.0", port=0) as server:
        _check_origins(server)


def _check_origins(server: Any) -> None:
    """Pages of this machine's names have their websocket taken by ``server``, others not."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"http://127.0.0.1:{server.port}/daskpri"

    async def websocket(origin: str) -> int:
        """The status of the websocket handshake of a page from ``origin``, as a browser's."""
        with urllib.request.urlopen(url, timeout=30) as r:  # a session, and its token
            token = re.search(r'"token":\s*"([^"]+)"', r.read().decode())
        assert token is not None
        request = HTTPRequest(url.replace("http", "ws") + "/ws", headers={"Origin": origin})
        try:
            conn = await websocket_connect(request, subprotocols=["bokeh", token.group(1)])
        except HTTPClientError as e:
            return e.code
        conn.close()
        return 101

    for host in (socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"):
        assert asyncio.run(websocket(f"http://{host}:{server.port}")) == 101, host
    # a page of another site is still refused
    assert asyncio.run(websocket("http://example.com")) == 403


# -- bench --pick final ------------------------------------------------------------------


def _sweep(doc: dict[str, Any]) -> dict[float, bool]:
    return {r["learning_rate"]: r["picked"] for r in doc["summary"]["lr_sweep"]}


def test_bench_pick_final_keeps_the_learning_rate_of_best_median_final_accuracy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--datasets", "synthetic", "--n-samples", "2000",
                 "--strategies", "uniform", "--workers", "1", "--learning-rates", "0.01,0.3",
                 "--budget", "0.5", "--baseline-budget", "0.3", "--no-ddp", "--no-progress",
                 "--pick", "final", "--out", str(out)]) == 0
    path = out / "results.json"
    doc = json.loads(path.read_text())
    assert doc["config"]["pick"] == "final"
    md = (out / "results.md").read_text()
    assert "each keeps the one of best median final accuracy" in md
    assert "--pick final" in md  # the command, as given
    finals = {r["spec"]["learning_rate"]: r["curve"]["accuracy"][-1]
              for r in doc["runs"] if r["spec"]["phase"] == "sweep"}
    assert set(finals) == {0.01, 0.3}
    kept = max(finals, key=lambda lr: (finals[lr], -lr))  # one seed: its final is the median
    assert _sweep(doc) == {lr: lr == kept for lr in finals}
    # the runs after the sweep train at the rate kept
    later = [r for r in doc["runs"] if r["spec"]["phase"] != "sweep"]
    assert later and {r["spec"]["learning_rate"] for r in later} == {kept}

    # Curves where the two picks part: the other rate now ends best, but reaches the
    # target only at its end, where the kept one reaches it at once. The report of
    # the file (under its own --pick) keeps the better final accuracy.
    other = next(lr for lr in finals if lr != kept)
    for r in doc["runs"]:
        if r["spec"]["phase"] == "sweep":
            curve = r["curve"]
            accuracy = [0.5, 0.96] if r["spec"]["learning_rate"] == other else [0.955, 0.9]
            curve.update(time=[0.1, 0.4], step=[1, 4], accuracy=accuracy,
                         loss=[1.0, 0.5])
    path.write_text(json.dumps(doc))
    assert main(["bench", "--out", str(out), "--report-only"]) == 0
    assert _sweep(json.loads(path.read_text())) == {kept: False, other: True}


# -- a second Ctrl-C -----------------------------------------------------------------

# Python's own SIGINT handler, which a background job's children do not get (see
# test_cli's _FOREGROUND)
_FOREGROUND = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'daskpri'; runpy.run_module('daskpri', run_name='__main__')"
)


class _Pipe:
    """A process's output, read in a thread as it comes; ``seen(pattern)`` waits for it."""

    def __init__(self, pipe: Any) -> None:
        self.text = ""
        self._changed = threading.Condition()
        self._fd = pipe.fileno()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for chunk in iter(lambda: os.read(self._fd, 4096), b""):
            with self._changed:
                self.text += chunk.decode(errors="replace")
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def seen(self, pattern: str, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(
                lambda: re.search(pattern, self.text) is not None or not self._thread.is_alive(),
                timeout,
            ) and re.search(pattern, self.text) is not None

    def close(self, timeout: float) -> str:
        self._thread.join(timeout)
        return self.text


def test_a_second_ctrl_c_stops_a_run_whose_step_does_not_end(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "run.nc", tmp_path / "run.ckpt"
    argv = [sys.executable, "-c", _FOREGROUND, "train", "--workers", "1", "--dataset",
            "synthetic", "--n-samples", "2000", "--max-time", "60", "--output", str(out),
            "--checkpoint", str(ckpt), "--checkpoint-every", "5"]
    # a stuck worker answers nothing: a close after the second Ctrl-C does not wait the
    # scheduler timeout for it (here longer than the wait below)
    env = {**os.environ, "DASK_DASKPRI__TRAINER__SCHEDULER_TIMEOUT": "300s"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    said, err = _Pipe(proc.stdout), _Pipe(proc.stderr)
    worker = None
    try:
        assert err.seen(r"[1-9]\d*step", 60), err.text  # the progress bar counted a step
        # and the first checkpoint (step 5) is written: a worker stopped before it would
        # leave none to keep
        deadline = time.monotonic() + 60
        while not ckpt.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt.exists(), err.text
        # the LocalCluster's one worker process (its nanny runs in the command's)
        [worker] = [p for p in psutil.Process(proc.pid).children()
                    if "spawn_main" in " ".join(p.cmdline())]
        worker.suspend()  # its step in flight now never ends
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert err.seen("daskpri: stopping after the step in flight \\(Ctrl-C again to stop "
                        "at once\\)", 30), err.text
        time.sleep(1.0)
        assert proc.poll() is None  # the first waits for the step, which does not end
        proc.send_signal(signal.SIGINT)
        second = time.monotonic()
        assert proc.wait(timeout=60) == 130
        # at once: the stuck worker is killed, not waited for (its nanny's close waited 4 s
        # for it to end, and two calls to the workers a second each: 7.5 s in all)
        waited = time.monotonic() - second
        text, printed = err.close(10), said.close(10)
        assert waited < 6.0, (waited, text)  # (about 1.5 s here; under load, more)
        assert " - ERROR - " not in text, text  # (no call to it left to fail as it dies)
        # and no worker process is left running (a zombie waits for its reaper only)
        with contextlib.suppress(psutil.NoSuchProcess):
            assert worker.status() == psutil.STATUS_ZOMBIE
    finally:
        _stop([proc])
        if worker is not None:
            with contextlib.suppress(psutil.NoSuchProcess):  # (the nanny killed it)
                worker.kill()
    assert text.endswith("daskpri: interrupted\n") and "Traceback" not in text, text
    # what the run had done before is kept: its history, and the checkpoint of the last
    # step that ended
    step = re.search(rf"^interrupted at step (\d+): the history so far written to "
                     rf"{re.escape(str(out))}$", printed, re.M)
    assert step is not None, printed
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds.sizes["step"] == int(step.group(1)) > 0
    written = checkpoint.read(ckpt)["step"]
    assert f"the checkpoint in {ckpt} is of step {written}\n" in printed
    assert 0 < written <= int(step.group(1))


# -- resume: transport and device ----------------------------------------------------


def _step_prefixes(c: LocalCluster) -> set[str]:
    """The prefixes of the step tasks the scheduler has seen (the tasks transport's)."""
    return {p for p in c.scheduler.task_prefixes if p.startswith("daskpri-step")}


def test_resume_goes_on_with_the_transport_it_is_given(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    common = ["train", "--scheduler", cluster.scheduler_address, "--dataset", "synthetic",
              "--n-samples", "1000", "--no-progress"]
    assert main([*common, "--strategy", "loss", "--transport", "direct", "--max-steps", "4",
                 "--checkpoint", str(ckpt)]) == 0
    assert checkpoint.read(ckpt)["trainer"]["transport"] == "direct"
    assert not _step_prefixes(cluster)  # direct: the steps were RPCs, no tasks
    assert main([*common, "--resume", str(ckpt), "--transport", "tasks", "--max-steps", "8",
                 "--output", str(out)]) == 0
    assert f"resumed {ckpt} at step 4" in capsys.readouterr().out
    assert _step_prefixes(cluster) == {"daskpri-step-loss"}  # as tasks through the scheduler
    state = checkpoint.read(ckpt)
    assert state["step"] == 8 and state["trainer"]["transport"] == "tasks"
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["step"].values.tolist() == list(range(8))

    # and from Python, back to direct
    trainer = daskpri.Trainer.resume(ckpt, transport="direct")
    assert trainer.transport == "direct" and trainer.step_ == 8
    trainer.close()


@pytest.mark.skipif(torch.cuda.device_count() > 99, reason="this machine has a cuda:99")
def test_resume_refuses_a_device_it_cannot_train_on(
    cluster: LocalCluster, tmp_path: Path, small_data: tuple[xr.Dataset, xr.Dataset]
) -> None:
    train, test = small_data
    ckpt = tmp_path / "run.ckpt"
    with Client(cluster) as client:
        with daskpri.Trainer(build_model("mlp", train, seed=0), client=client,
                             checkpoint_path=ckpt) as trainer:
            trainer.fit(train, eval_data=test, max_steps=2, progress=False)
        # one torch does not know: refused as the trainer is made
        for device in ("gpu", "cuda:x", "", "meta"):  # meta: torch's, but no place to train
            with pytest.raises(ValueError, match=(
                r"^device should name a torch device to train on, 'cpu', 'cuda', 'cuda:N', "
                rf"'mps', 'xpu' or 'xpu:N', but got device={re.escape(repr(device))}$"
            )):
                daskpri.Trainer.resume(ckpt, client=client, device=device)
        # one the workers lack: refused as the run starts, the workers asked first
        with daskpri.Trainer.resume(ckpt, client=client, device="cuda:99") as trainer:
            assert trainer.device == "cuda:99"
            with pytest.raises(ValueError, match=r"^device='cuda:99', but 1 of the run's 1 "
                               r"worker\(s\) lack it \(tcp://\S+ has \d+ CUDA device\(s\)\): "
                               r".*leave device unset"):
                trainer.fit(train, eval_data=test, max_steps=4, progress=False)
        # no replica was set up, nor left to fail on a worker
        assert not [p for p in cluster.scheduler.worker_plugins if p.startswith("daskpri-")]
        [logs] = client.get_worker_logs().values()
    assert not [m for _, m in logs if "failed to teardown" in m], logs
