"""The ``daskpri`` command line, on real clusters (a LocalCluster and a loopback one)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import torch
import xarray as xr
from _procs import _stop, refusing_port

import daskpri
from daskpri import STRATEGIES
from daskpri.cli import main
from daskpri.cli._argtypes import _parse_value
from daskpri.cli._interrupt import _interruptible
from daskpri.models import build_model
from daskpri.training import checkpoint

SMALL = ["--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "20"]
SUMMARY = re.compile(
    r"^(?P<strategy>[\w-]+): 20 steps, final accuracy 0\.\d{4}, best accuracy 0\.\d{4}, "
    r"[\d.]+ s training, [\d,]+ samples/s$",
    re.M,
)


def _open(path: Path) -> xr.Dataset:
    if path.suffix == ".zarr":
        return xr.open_zarr(path, consolidated=False)
    return xr.open_dataset(path, engine="h5netcdf")


def _cli(
    *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daskpri", *args], capture_output=True, text=True, timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


# -- bad input, caught before any cluster starts ----------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--strategy", "los"], r"--strategy: invalid choice: '?los'? .*uniform.*selective-"),
        (["--dataset", "mnist2d"], r"--dataset: invalid choice: '?mnist2d'? .*mnist1d.*synthetic"),
        (["--resources", "GPU"], r"--resources: resources should look like 'GPU=1'.*but got 'GPU'"),
        (["--output", "run.csv"], r"--output: .*ending in \.nc \(netCDF\) or \.zarr .*'run\.csv'"),
        (["--strategy-option", "k"], r"--strategy-option: .*KEY=VALUE, e\.g\. k=32, but got 'k'"),
        (["--max-steps", "-1"], r"--max-steps: should be a positive integer, but got '-1'"),
        (["--max-steps", "0"], r"--max-steps: should be a positive integer, but got '0'"),
        (["--batch-size", "0"], r"--batch-size: should be a positive integer, but got '0'"),
        (["--local-steps", "0"], r"--local-steps: should be a positive integer, but got '0'"),
        (["--max-time", "0"], r"--max-time: should be a positive finite number .*, but got '0'"),
        (["--max-time", "inf"], r"--max-time: should be a positive finite .*, but got 'inf'"),
        (["--target-accuracy", "1.5"], r"--target-accuracy: should be a number in \(0, 1\], "
                                       r"but got '1\.5'"),
        (["--target-accuracy", "nan"], r"--target-accuracy: .*in \(0, 1\], but got 'nan'"),
        (["--max-grad-norm", "0"], r"--max-grad-norm: should be a positive finite number, "
                                   r"but got '0'"),
        (["--checkpoint", "run.ckpt", "--checkpoint-every", "0"],
         r"--checkpoint-every: should be a positive integer, but got '0'"),
    ],
)
def test_bad_argument_exits_2_naming_what_is_allowed(
    args: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", *SMALL, *args])
    assert info.value.code == 2
    assert re.search(match, capsys.readouterr().err)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy-option", "size=3"],
         "strategy 'selective-backprop' takes the options fraction, beta, batch_size,"),
        (["--root", "/data"], "root is only used by datasets 'mnist', 'cifar10'"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint PATH"),
        (["--resume", "/nonexistent/run.ckpt"], "no checkpoint at '/nonexistent/run.ckpt'"),
        (["--strategy", "projection", "--local-steps", "4"],
         "strategy 'projection' selects by the priorities of the previous"),
        (["--strategy-option", "k=3", "--strategy-option", "k=4"],
         "--strategy-option k should be given once, but got k=3 and k=4"),
        (["--strategy", "uniform", "--strategy-option", "batch_size=32"],
         "--strategy-option batch_size=32 is the trainer's batch: a strategy's batch_size is the "
         "samples per worker per step, which --batch-size sets (and the history records); "
         "give --batch-size 32"),
    ],
)
def test_library_error_is_one_line_with_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *SMALL, *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"daskpri: error: {message}")
    assert "Traceback" not in err


def test_traceback_flag_lets_the_error_through_as_python_raises_it() -> None:
    argv = ["train", *SMALL, "--strategy-option", "k=3", "--strategy-option", "k=4"]
    with pytest.raises(ValueError, match="--strategy-option k should be given once"):
        main(["--traceback", *argv])


def test_an_error_raised_inside_another_library_says_where(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from daskpri.cli import _arguments

    # a command failing inside another library, as a torch or xarray error would
    monkeypatch.setattr(_arguments, "_strategies", lambda args: json.loads("{"))
    assert main(["strategies"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("daskpri: error: Expecting property name enclosed in double quotes")
    assert re.search(r"\(raised in .*json.*decoder\.py, line \d+, in raw_decode; "
                     r"run `daskpri --traceback \.\.\.` for the full traceback\)", err)


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("not a directory")
    return path


def _directory(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (lambda d: ["train", *SMALL, "--output", str(_file(d) / "run.nc")],
         r"--output should be a path under directories, but got --output '.*notes\.txt/run\.nc',"
         r" and '.*notes\.txt' is a file"),
        (lambda d: ["train", *SMALL, "--output", str(_directory(d, "run.nc"))],
         r"--output should be a new path or a netCDF file to replace, but got "
         r"--output='.*run\.nc', which is a directory"),
        (lambda d: ["train", *SMALL, "--checkpoint", str(d), "--checkpoint-every", "2"],
         r"--checkpoint should be a file's path, but got --checkpoint '.*', which is a directory"),
        (lambda d: ["report", str(d / "run.nc"), "-o", str(d)],
         r"--output should be a file's path, but got --output '.*', which is a directory"),
        (lambda d: ["bench", "--quick", "--out", str(_file(d))],
         r"--out should be a directory, but got --out '.*notes\.txt', which is a file"),
        (lambda d: ["report", str(d / "run.nc"), "-o", str(_file(d) / "sub" / "r.html")],
         r"--output should be a path under directories, .* '.*notes\.txt' is a file"),
    ],
)
def test_a_path_where_results_cannot_go_is_refused_before_any_work(
    argv: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv(tmp_path)) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out  # no cluster was started
    assert re.match(f"daskpri: error: {message}", captured.err), captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--strategies", "uniform,loss,uniform"],
         r"--strategies: should name each item once, but got 'uniform,loss,uniform' "
         r"\(uniform more than once\)"),
        (["--workers", "1,,2"],
         r"--workers: should be a comma-separated list without empty items, but got '1,,2'"),
        (["--workers", "1,2,"], r"--workers: .*without empty items, but got '1,2,'"),
        (["--learning-rates", "0.1,0.10"], r"--learning-rates: should name each item once"),
    ],
)
def test_bench_list_with_an_empty_or_repeated_item_exits_2(
    args: list[str], match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--quick", "--out", str(tmp_path / "out"), *args])
    assert info.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--strategy-option", "selective-backprop:batch_size=32"],
         "--strategy-option selective-backprop:batch_size=32 sets batch_size, the samples per "
         "worker per step of every arm, which is the benchmark's own: give --batch-size 32 "
         "instead"),
        (["--strategy-option", "loss:epsilon=0.1", "--strategy-option", "loss:epsilon=0.3"],
         "--strategy-option loss:epsilon=0.3 gives option epsilon of loss a second time, after "
         "--strategy-option loss:epsilon=0.1: give each option of an arm (on a model) once"),
    ],
)
def test_bench_strategy_option_that_would_be_lost_exits_2(
    option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--quick", "--out", str(tmp_path / "out"), *option]) == 2
    assert capsys.readouterr().err.startswith(f"daskpri: error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--scheduler", "garbage"], "--scheduler should be a scheduler's address such as "
      "tcp://127.0.0.1:8786, but got --scheduler 'garbage'"),
     (["--scheduler", "tcp://127.0.0.1:1", "--port", "99999"],
      "--port should be in [0, 65536), but got --port 99999")],
)
def test_dashboard_arguments_are_checked_before_it_serves(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboard", *args]) == 2
    assert capsys.readouterr().err.startswith(f"daskpri: error: {message}")


def test_dashboard_on_a_port_in_use_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["dashboard", "--scheduler", "tcp://127.0.0.1:1", "--port", str(port)]
        assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: --port {port} cannot be listened on at 127.0.0.1: Address already in "
        "use; give another --port, or --port 0 for any free one\n"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [("32", 32), ("0.02", 0.02), ("true", True), ("False", False), ("none", None), ("top", "top")],
)
def test_strategy_option_value_is_int_float_bool_none_or_string(text: str, value: object) -> None:
    assert _parse_value(text) == value and type(_parse_value(text)) is type(value)


def test_strategies_lists_names_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    for name in STRATEGIES:
        assert re.search(rf"^{re.escape(name)} +\w+\(", out, re.M)
    assert "Projection(k=None, renew=0.01" in out


# -- training on a LocalCluster of its own ----------------------------------------


def test_one_torch_thread_holds_for_the_block_and_is_undone_even_on_error() -> None:
    from daskpri.training.cluster import one_torch_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(KeyError), one_torch_thread():
            assert torch.get_num_threads() == 1
            raise KeyError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)

def _worker_settings(dask_worker: Any) -> dict[str, Any]:
    import dask.config

    return {
        "malloc": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
        "tick": dask_worker._tick_interval,
        "profile": dask.config.get("distributed.worker.profile.interval"),
    }


def test_own_local_cluster_starts_under_daskpri_settings_which_a_user_can_drop(
    monkeypatch, spawned_workers
) -> None:
    import dask.config
    from distributed import Client

    from daskpri.training.cluster import local_cluster

    # as a LocalCluster with Dask's defaults leaves this process's environment
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with local_cluster(1) as cluster, Client(cluster) as client:
        [got] = client.run(_worker_settings).values()
        assert cluster.scheduler._tick_interval == 0.5
    assert got == {"malloc": None, "tick": 0.5, "profile": "100ms"}
    # {} keeps Dask's own, nannies' MALLOC_TRIM_THRESHOLD_ included
    with dask.config.set({"daskpri.local-cluster": {}}):
        with local_cluster(1) as cluster, Client(cluster) as client:
            [got] = client.run(_worker_settings).values()
            assert cluster.scheduler._tick_interval == 0.02
    assert got == {"malloc": "65536", "tick": 0.02, "profile": "10ms"}
    with dask.config.set({"daskpri.local-cluster": "fast"}):
        with pytest.raises(ValueError, match="should be a mapping of Dask settings.*'fast'"):
            local_cluster(1)



def test_more_local_workers_than_cores_warn_before_any_starts() -> None:
    from daskpri.training.cluster import available_cores, local_cluster

    cores = available_cores()
    # the suite turns daskpri's warnings into errors: raised before any process starts
    with pytest.raises(daskpri.DaskpriWarning,
                       match=rf"^{cores + 1} local workers on {cores} cores: they share the cores"):
        local_cluster(cores + 1)


def test_train_shows_daskpri_warnings_as_one_line_of_its_own(
    capsys: pytest.CaptureFixture[str]
) -> None:
    from daskpri.training.cluster import available_cores

    cores = available_cores()
    argv = ["train", *SMALL, "--workers", str(cores + 1), "--max-steps", "1", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("always", daskpri.DaskpriWarning)
        assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"daskpri: warning: {cores + 1} local workers on {cores} cores: they share the cores, so "
        f"they train no faster than {cores} would, and each process holds its own torch and "
        "model; start fewer, or connect to a cluster with more machines"
    )
    # the formatting is main's alone: Python's own is back after it
    assert warnings.showwarning is not daskpri.cli._show_warning


@pytest.mark.parametrize("name", ["run.nc", "run.zarr"])
def test_train_on_own_local_cluster_writes_history(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    options = ["--strategy", "projection", "--strategy-option", "k=32",
               "--strategy-option", "train_on_renew=false", "--staleness", "exp-linear"]
    argv = ["train", *SMALL, *options, "--workers", "2", "--no-progress", "--output", str(path)]
    torch.set_num_threads(2)
    seen = []
    fit = daskpri.Trainer.fit

    def counting_fit(self, *args, **kwargs):  # calls through: records the driver's threads
        seen.append(torch.get_num_threads())
        return fit(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(daskpri.Trainer, "fit", counting_fit)
        assert main(argv) == 0
    assert seen == [1] and torch.get_num_threads() == 2  # one while it trained, then as before
    out = capsys.readouterr().out
    assert re.search(r"^dashboard: http://127\.0\.0\.1:\d+/status$", out, re.M)
    assert SUMMARY.search(out)["strategy"] == "projection"
    with _open(path) as ds:
        assert {"step", "loss", "accuracy"} <= set(ds.variables)
        assert ds.sizes["step"] == 20
        assert ds.attrs["n_workers"] == 2
        assert ds.attrs["strategy_params"].startswith("Projection(k=32, renew=0.01, "
                                                      "train_on_renew=False")
        assert ds.attrs["dataset"] == "synthetic" and ds.attrs["model"] == "mlp"
        assert ds.attrs["staleness"] == "exp-linear"
    html = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(html)]) == 0
    assert "report written to" in capsys.readouterr().out
    assert html.read_text().lstrip().lower().startswith("<!doctype html")


def test_train_stops_at_its_target_accuracy_evaluating_as_asked(tmp_path: Path) -> None:
    path = tmp_path / "run.nc"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "400",
            "--target-accuracy", "0.6", "--eval-every", "2", "--optimizer", "adam",
            "--workers", "1", "--no-progress", "--output", str(path)]
    assert main(argv) == 0
    with _open(path) as ds:
        acc = ds["accuracy"].values
        assert ds.attrs["optimizer"] == "adam"
        assert np.isfinite(acc[1::2]).all() and np.isnan(acc[0::2]).all()  # every 2nd step
        assert acc[-1] >= 0.6 and (acc[:-1][np.isfinite(acc[:-1])] < 0.6).all()  # stopped there
        assert ds.sizes["step"] < 400


def test_train_with_tls_on_its_own_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from daskpri.training import _cleanup  # (where the trainer starts its cluster)

    argv = ["train", *SMALL, "--workers", "1", "--no-progress", "--tls", "--transport", "tasks"]
    addresses = []
    start = _cleanup.local_cluster

    def recording_cluster(*args, **kwargs):  # calls through: records where it listens
        cluster = start(*args, **kwargs)
        addresses.append(cluster.scheduler_address)
        return cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_cleanup, "local_cluster", recording_cluster)
        assert main(argv) == 0
    assert len(addresses) == 1 and addresses[0].startswith("tls://127.0.0.1:"), addresses
    assert "dashboard: http" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--tls-ca-file", "ca.pem"], "--tls-ca-file, --tls-cert and --tls-key go together"),
        (["--tls", "--scheduler", "tcp://127.0.0.1:1"], "with --scheduler, use --tls-"),
    ],
)
def test_tls_flags_are_checked(extra, match, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", *SMALL, *extra]) == 2
    assert re.search(match, capsys.readouterr().err)


def test_report_of_a_missing_history_is_a_clear_error(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "none.nc"
    assert main(["report", str(missing), "-o", str(tmp_path / "r.html")]) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: history names {str(missing)!r}, but there is no such file or "
        "directory\n"
    )


def test_demo_compares_prioritized_with_uniform(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--dataset", "synthetic", "--max-time", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/status", lines[0])
    assert lines[1] == "selective-backprop against uniform, 1 local step per round, 1 s each"
    for name, line in (("selective-backprop", lines[2]), ("uniform", lines[3])):
        assert re.match(rf"{name}: \d+ steps, final accuracy 0\.\d{{4}}, ", line), line
    assert re.fullmatch(
        r"target 0\.\d{4} \(97% of uniform's best 0\.\d{4}\): "
        r"selective-backprop accuracy 0\.\d{4}, time to target ([\d.]+ s|not reached); "
        r"uniform accuracy 0\.\d{4}, time to target [\d.]+ s; "
        r"speedup (\d+\.\d\dx|not reached by selective-backprop)",
        lines[4],
    )


def test_demo_takes_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--dataset", "synthetic", "--max-time", "0.5", "--local-steps", "16",
            "--strategy-option", "fraction=0.25", "--strategy-option", "refresh=2"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == (
        "selective-backprop (fraction=0.25, refresh=2) against uniform, "
        "16 local steps per round, 0.5 s each"
    )
    # steps counted in steps, not in rounds of 16
    for name, line in (("selective-backprop", lines[2]), ("uniform", lines[3])):
        steps = re.match(rf"{name}: (\d+) steps, ", line)
        assert steps is not None and int(steps.group(1)) % 16 == 0 and int(steps.group(1)), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy-option", "fraction=2"],
         "fraction should be a number in (0, 1], but got fraction=2"),
        (["--strategy-option", "k=3"], "strategy 'selective-backprop' takes the options"),
    ],
)
def test_demo_bad_option_fails_before_a_cluster_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--dataset", "synthetic", "--max-time", "1", *args]) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out  # no cluster was started
    assert captured.err.startswith(f"daskpri: error: {message}")


@pytest.mark.parametrize("value", ["-5", "inf", "abc"])
def test_demo_max_time_is_checked_as_trains_is(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", "--max-time", value])
    assert info.value.code == 2
    assert (f"argument --max-time: should be a positive finite number of seconds, but got "
            f"'{value}'") in capsys.readouterr().err


def test_demo_refuses_a_configured_eval_period_before_a_cluster_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the demo rounds the trainer's configured period to whole rounds: a bad one is not
    # rounded up into a good one
    with dask.config.set({"daskpri.trainer.eval-every": 0}):
        assert main(["demo", "--dataset", "synthetic", "--max-time", "1",
                     "--local-steps", "16"]) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out
    assert captured.err.startswith(
        "daskpri: error: eval_every should be a positive integer, but got eval_every=0")


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
        _, err = proc.communicate(timeout=60)
    finally:
        _stop([proc])
    assert proc.returncode == 130
    assert err.endswith("daskpri: interrupted\n") and "Traceback" not in err


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
    for f in [f for f in logger.filters if type(f).__name__ == "_ClosingHeartbeatFilter"]:
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
        assert all(names.count("_ClosingHeartbeatFilter") == 1
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


def test_train_checkpoints_then_resumes_where_it_stopped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    common = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--workers", "1",
              "--no-progress", "--checkpoint", str(ckpt), "--checkpoint-every", "5"]
    assert main([*common, "--strategy", "loss", "--lr-schedule", "linear",
                 "--max-steps", "10"]) == 0
    assert ckpt.exists() and not list(tmp_path.glob("*.tmp"))
    # the run's own settings (strategy, schedule) come back from the checkpoint; going on
    # past the schedule's end takes a longer one
    assert main([*common, "--resume", str(ckpt), "--max-steps", "16", "--schedule-steps", "16",
                 "--output", str(out)]) == 0
    assert "resumed " + str(ckpt) + " at step 10" in capsys.readouterr().out
    with _open(out) as ds:
        assert ds["step"].values.tolist() == list(range(16))
        assert ds.attrs["strategy"] == "loss" and ds.attrs["lr_schedule"] == "linear"
        assert ds.attrs["schedule_steps"] == 16
        # linear decay over 10 steps, then from step 10 on over 16: still above zero
        lr = ds["lr"].values
        assert (lr[10:] > 0).all() and (np.diff(lr[10:]) < 0).all()


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 4 steps of ``loss`` at seed 3 and lr 0.1, checkpointed every 2."""
    ckpt = tmp_path_factory.mktemp("resume") / "run.ckpt"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--workers", "1",
            "--no-progress", "--strategy", "loss", "--seed", "3", "--learning-rate", "0.1",
            "--max-steps", "4", "--checkpoint", str(ckpt), "--checkpoint-every", "2"]
    assert main(argv) == 0
    return ckpt


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "uniform", "--learning-rate", "0.5"],
         "--resume continues the run in '{ckpt}' as it was started, but got --strategy uniform "
         "(the run's: loss); --learning-rate 0.5 (the run's: 0.1). With --resume, give only "
         "--dataset, --n-samples and --root, or --data (the run's data), --eval-data, "
         "--max-steps, --max-time, "
         "--target-accuracy, --output, --no-progress, --scheduler, --workers, --resources, "
         "--transport, --tls, --tls-*, --eval-every, --checkpoint, --checkpoint-every and "
         "--schedule-steps\n"),
        (["--seed", "0", "--model", "cnn", "--batch-size", "32"],
         "--resume continues the run in '{ckpt}' as it was started, but got --model cnn "
         "(the run's: mlp); --seed 0 (the run's: 3); --batch-size 32 (the run's: 64). "),
        (["--strategy-option", "epsilon=0.5", "--strategy-option", "k=3"],
         "--resume continues the run in '{ckpt}' as it was started, but got --strategy-option "
         "epsilon=0.5 (the run's: epsilon=0.2); --strategy-option k=3 (the run's: loss takes "
         "no k). "),
        (["--max-grad-norm", "1"],
         "--resume continues the run in '{ckpt}' as it was started, but got --max-grad-norm 1.0 "
         "(the run's: None). "),
        (["--max-steps", "3"],
         "--max-steps counts the run's steps from its start, and the run in '{ckpt}' is at "
         "step 4 already, but got --max-steps 3: give more than 4 to go on\n"),
        # the data: the checkpoint knows the samples' shape and count
        (["--n-samples", "2000"],
         "--resume: the run in '{ckpt}' trained on 800 samples of shape (20,) in 10 classes, "
         "but --dataset synthetic --n-samples 2000 gives 1600 samples of shape (20,) in 10 "
         "classes; give the --dataset and --n-samples the run was started with\n"),
        (["--dataset", "digits"],
         "--resume: the run in '{ckpt}' trained on 800 samples of shape (20,) in 10 classes, "
         "but --dataset digits --n-samples 1000 gives 800 samples of shape (8, 8) in 10 "
         "classes; "),
    ],
)
def test_resume_refuses_what_its_checkpoint_fixes_before_a_cluster_starts(
    checkpointed: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    argv = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
            "--resume", str(checkpointed), *args]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no cluster, no data
    assert captured.err.startswith("daskpri: error: " + message.format(ckpt=checkpointed))


def test_resume_takes_the_runs_own_settings_repeated_and_keeps_its_checkpoint_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "run.ckpt", tmp_path / "run.nc"
    first = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
             "--strategy", "loss", "--seed", "3", "--learning-rate", "0.1", "--workers", "1"]
    assert main([*first, "--max-steps", "4", "--checkpoint", str(ckpt)]) == 0
    # the same command with --resume: the settings it repeats are the run's own
    assert main([*first, "--resume", str(ckpt), "--checkpoint-every", "3", "--max-steps", "7",
                 "--output", str(out)]) == 0
    assert f"resumed {ckpt} at step 4" in capsys.readouterr().out

    # --checkpoint-every alone: the run's own file, at step 6 and where the fit ended
    state = checkpoint.read(ckpt)
    assert state["step"] == 7 and state["trainer"]["checkpoint_every"] == 3
    assert not list(tmp_path.glob("*.tmp"))
    with _open(out) as ds:
        assert ds["step"].values.tolist() == list(range(7))
        assert ds.attrs["seed"] == 3 and ds.attrs["learning_rate"] == 0.1


def test_resume_goes_past_a_decaying_schedule_only_when_told_how_long_it_now_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "run.ckpt"
    first = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--no-progress",
             "--workers", "1", "--lr-schedule", "cosine"]
    assert main([*first[:-2], "--schedule-steps", "9", "--max-steps", "4",
                 "--checkpoint", str(ckpt)]) == 2
    assert ("--schedule-steps is the length of a decaying --lr-schedule (cosine, linear); "
            "give one") in capsys.readouterr().err
    assert main([*first, "--max-steps", "4", "--checkpoint", str(ckpt)]) == 0
    assert checkpoint.read(ckpt)["trainer"]["schedule_steps"] == 4
    capsys.readouterr()
    # past its end the run would train at learning rate 0: refused, before a cluster starts
    assert main([*first[:-2], "--resume", str(ckpt), "--max-steps", "6"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "daskpri: error: --max-steps 6 goes past the end of the run's cosine learning-rate "
        "schedule at step 4, after which it would train at learning rate 0: give --max-steps 4 "
        "or less, or --schedule-steps 6 to stretch the schedule to the new end")
    # (and going on with --schedule-steps: test_train_checkpoints_then_resumes_where_it_stopped)
    assert main([*first[:-2], "--schedule-steps", "9", "--resume", str(ckpt),
                 "--max-steps", "12"]) == 2
    assert "--max-steps 12 goes past the end of the run's cosine learning-rate schedule at " \
        "step 9" in capsys.readouterr().err


def test_resume_of_a_file_that_is_no_checkpoint_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "passwd"
    text.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other = tmp_path / "other.ckpt"
    torch.save({"format": 1, "weights": torch.zeros(2)}, other)
    for path, message in ((text, "is not a loadable daskpri checkpoint"),
                          (other, "is not a daskpri checkpoint, or is one from an incompatible "
                           "version of daskpri: it has no 'step', 'elapsed', 'model', ")):
        assert main(["train", "--dataset", "synthetic", "--resume", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"daskpri: error: {str(path)!r} {message}"), err
        assert "Traceback" not in err


def test_trainer_resume_refuses_overrides_its_checkpoint_fixes(checkpointed: Path) -> None:
    with pytest.raises(ValueError, match=r"^resume takes overrides of n_workers, resources, "
                       r".*checkpoint_every, schedule_steps, but got learning_rate, strategy: "
                       r"the checkpoint fixes the run's strategy and its options, seed and "
                       r"optimization; start a new Trainer to change them$"):
        daskpri.Trainer.resume(checkpointed, strategy="uniform", learning_rate=0.5)
    with pytest.raises(ValueError, match=r"but got epsilon: "):
        daskpri.Trainer.resume(checkpointed, epsilon=0.5)  # the strategy's own option
    trainer = daskpri.Trainer.resume(checkpointed, checkpoint_every=3, n_workers=1)
    assert trainer.checkpoint_every == 3 and trainer.checkpoint_path == str(checkpointed)
    assert trainer.strategy.name == "loss" and trainer.learning_rate == 0.1
    trainer.close()  # no cluster was started


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


def test_train_refuses_to_write_over_a_file_that_is_not_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# mine")
    assert main(["train", *SMALL, "--checkpoint", str(notes)]) == 2
    assert capsys.readouterr().err.startswith(
        f"daskpri: error: --checkpoint names {str(notes)!r}, a file that is not a daskpri "
        "checkpoint: writing the checkpoint would replace it")
    same = str(tmp_path / "run.nc")
    assert main(["train", *SMALL, "--checkpoint", same, "--output", same]) == 2
    assert capsys.readouterr().err.startswith(
        f"daskpri: error: --output and --checkpoint name the same file, {same!r}")
    assert notes.read_text() == "# mine" and sorted(os.listdir(tmp_path)) == ["notes.md"]


def test_a_checkpoint_the_disk_cannot_take_ends_the_run_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full_disk(*args: Any, **kwargs: Any) -> None:  # torch's writer on a full disk
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                           "failed writing file data/0: file write failed\nmore lines")

    monkeypatch.setattr(checkpoint, "_save", full_disk)
    path = tmp_path / "run.ckpt"
    argv = ["train", *SMALL, "--workers", "1", "--no-progress", "--checkpoint", str(path),
            "--checkpoint-every", "5"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (f"daskpri: error: could not write the checkpoint {str(path)!r}: [enforce "
                   "fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                   "data/0: file write failed\n")
    assert os.listdir(tmp_path) == []  # its temporary file removed
