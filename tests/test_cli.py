"""The ``daskpri`` command line: bad input caught before any cluster starts, one-line errors.

Training on a cluster of its own is in test_cli_train.py, Ctrl-C in
test_cli_interrupt.py, schedulers elsewhere in test_cli_scheduler.py, checkpoints
and --resume in test_cli_resume.py.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _cli_runs import SMALL

from daskpri import STRATEGIES
from daskpri.cli import main
from daskpri.cli._argtypes import _parse_value
from daskpri.training import checkpoint

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
        (["--label-smoothing", "1"], r"--label-smoothing: should be a number in \[0, 1\), "
                                     r"but got '1'"),
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

    from daskpri.cli import strategies

    # a command failing inside another library, as a torch or xarray error would (the
    # parser imports the command's module as it runs, and finds it there)
    monkeypatch.setattr(strategies, "_strategies", lambda args: json.loads("{"))
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
     (["--scheduler", "tcp://127.0.0.1:87860"], "--scheduler should be a scheduler's address "
      "such as tcp://127.0.0.1:8786, but got --scheduler 'tcp://127.0.0.1:87860' (its port "
      "87860 is not in [1, 65536))"),
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


# -- help, a refused argument and `strategies`: answered without torch ----------------

#: what a command's own work imports, and its help and a refused argument need not
#: (torch alone took 3-6 s, most of what `daskpri --help` took)
_HEAVY = ("torch", "xarray", "distributed", "bokeh")
#: the command line as the `daskpri` script runs it, and the heavy modules imported
_AS_THE_SCRIPT = f"""
import runpy, sys
sys.argv = ["daskpri", *sys.argv[1:]]
try:
    runpy.run_module("daskpri", run_name="__main__")
except SystemExit as e:
    print("exit", e.code)
print("imported", sorted(m for m in {_HEAVY!r} if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        (["--help"], 0),
        *[([command, "--help"], 0) for command in ("train", "demo", "dashboard", "report",
                                                   "evaluate", "predict", "strategies", "bench")],
        (["train", "--workers", "0"], 2),
        (["train", "--resources", "GPU"], 2),  # (parsed by the trainer's own parser)
        (["bench", "--out", "o", "--workers", "1,,2"], 2),
        (["evaluate"], 2),
        (["strategies"], 0),
    ],
)
def test_help_a_refused_argument_and_strategies_import_no_torch(
    argv: list[str], status: int
) -> None:
    done = subprocess.run([sys.executable, "-c", _AS_THE_SCRIPT, *argv], capture_output=True,
                          text=True, timeout=120)
    *printed, exit_line, imported = done.stdout.splitlines()
    assert exit_line == f"exit {status}", done.stderr
    assert imported == "imported []", done.stderr
    if status == 0:
        assert printed and done.stderr == ""
    else:
        assert "daskpri" in done.stderr and "error:" in done.stderr


def test_strategies_lists_names_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    for name in STRATEGIES:
        assert re.search(rf"^{re.escape(name)} +\w+\(", out, re.M)
    assert "Projection(k=None, renew=0.01" in out


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
