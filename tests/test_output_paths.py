"""Where a command writes its results: refused before the work if it would lose something.

``train --output`` replaces only a daskpri history; a directory that takes
no file is found before any training; a write that fails (a full disk, on a
64 KiB tmpfs mounted for the test: Linux, as root) names the path written
and leaves no temporary file.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from _bench_records import MACHINE, SIZES, _config, _simulate
from _disks import small_disk
from test_history import _record

import daskpri
from daskpri.bench.analysis import summarize
from daskpri.bench.bokeh_page import write_html
from daskpri.bench.png import write_pngs
from daskpri.bench.report import report_files, write_json
from daskpri.bench.report import write_report as write_bench_report
from daskpri.cli import main
from daskpri.cli._paths import _check_destination
from daskpri.data.io import to_store
from daskpri.data.store import check_destination, write_atomic
from daskpri.models import build_model
from daskpri.training.history import HistoryRecorder

SMALL = ["train", "--dataset", "synthetic", "--n-samples", "1000", "--max-steps", "4",
         "--no-progress"]
NO_SPACE = os.strerror(errno.ENOSPC)


def _history(steps: int = 3) -> xr.Dataset:
    """A history as ``train --output`` writes it: its run's settings among the attributes."""
    recorder = HistoryRecorder()
    for step in range(steps):
        recorder.append(_record(step, 2))
    return recorder.to_dataset({"strategy": "uniform", "seed": 0, "dataset": "synthetic",
                                "model": "mlp"})


def _contents(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (or ``path`` itself), by its relative name, with its bytes."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


# -- train --output replaces a history only ----------------------------------------------


def _dataset_store(d: Path) -> Path:
    path = d / "mydata.zarr"
    xr.Dataset({"x": (("sample", "feature"), np.zeros((8, 3), "float32")),
                "y": ("sample", np.arange(8))}).to_zarr(path, consolidated=False)
    return path


def _text(d: Path) -> Path:
    path = d / "bad_copy.nc"
    path.write_text("a user's notes\n")
    return path


def _netcdf(d: Path) -> Path:
    path = d / "data.nc"
    xr.Dataset({"x": ("sample", np.arange(5.0))}).to_netcdf(path, engine="h5netcdf")
    return path


def _checkpoint(d: Path) -> Path:
    path = d / "run.nc"
    torch.save({"format": 1, "step": 3}, path)
    return path


def _unattributed(d: Path) -> Path:
    """A training log of another tool's: steps, time and loss, but no run of daskpri's."""
    path = d / "log.nc"
    log = _history()
    log.attrs = {}
    to_store(log, path)
    return path


@pytest.mark.parametrize(
    ("make", "what", "why"),
    [
        (_dataset_store, "a zarr store", "it has no 'step' dimension"),
        (_text, "a file", "it is not a netCDF4 file"),
        (_netcdf, "a file", "it has no 'step' dimension"),
        (_checkpoint, "a file", "it is not a netCDF4 file"),
        (_unattributed, "a file", "it has no 'strategy' attribute"),
    ],
)
def test_train_output_refuses_what_is_not_a_history_before_a_cluster_starts(
    make, what: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path)
    before = _contents(path)
    assert main([*SMALL, "--output", str(path)]) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out  # no cluster was started
    assert captured.err == (
        f"daskpri: error: --output names {str(path)!r}, {what} that is not a daskpri history "
        f"({why}): writing the history would replace it; give another path, or remove it "
        "first\n"
    )
    assert _contents(path) == before


@pytest.mark.parametrize("name", ["run.nc", "run.zarr", "empty.zarr", "new.nc", "sub/new.zarr"])
def test_train_output_may_replace_a_history_an_empty_directory_or_a_new_path(
    name: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    if name.startswith("run"):
        to_store(_history(), path)
    elif name.startswith("empty"):
        path.mkdir()
    _check_destination("--output", str(path), kind="store")  # no error
    assert not [p for p in tmp_path.rglob("*") if ".probe-" in p.name]  # the probe removed


def _users_store(path: Path) -> None:
    xr.Dataset({"x": ("sample", np.arange(5.0))}).to_zarr(path, consolidated=False)


def _users_netcdf(path: Path) -> None:
    xr.Dataset({"x": ("sample", np.arange(5.0))}).to_netcdf(path, engine="h5netcdf")


@pytest.mark.parametrize(
    ("name", "make", "what", "kept"),
    [
        ("run.zarr", _users_store, "a zarr store", "run-1.zarr"),
        # run-1.nc is a user's file too: the history takes the next free name
        ("run.nc", _users_netcdf, "a file", "run-2.nc"),
    ],
)
def test_train_output_taken_during_the_run_is_kept_and_the_history_written_beside_it(
    name: str, make: Any, what: str, kept: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / name
    if kept == "run-2.nc":
        (tmp_path / "run-1.nc").write_text("a user's notes\n")
    placed: dict[str, bytes] = {}
    fit = daskpri.Trainer.fit

    def fit_then_place(self: daskpri.Trainer, *args: Any, **kwargs: Any) -> xr.Dataset:
        """The run, with the user's store put at --output as it ends, before its write."""
        history = fit(self, *args, **kwargs)
        make(path)
        placed.update(_contents(path))
        return history

    monkeypatch.setattr(daskpri.Trainer, "fit", fit_then_place)
    assert main([*SMALL, "--workers", "1", "--output", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"daskpri: error: --output {str(path)!r} now holds {what} that is not a daskpri history "
        "(it has no 'step' dimension), put there during the run: it is left as it is, and the "
        f"history is written to {str(tmp_path / kept)!r} instead\n"
    )
    assert "history written" not in captured.out
    assert _contents(path) == placed
    if kept == "run-2.nc":
        assert (tmp_path / "run-1.nc").read_text() == "a user's notes\n"
    written = tmp_path / kept
    with (xr.open_zarr(written, consolidated=None) if written.is_dir()
          else xr.open_dataset(written, engine="h5netcdf")) as history:
        assert history.sizes["step"] == 4 and history.attrs["dataset"] == "synthetic"


def test_an_interrupted_runs_output_taken_meanwhile_is_kept_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.zarr"
    fit = daskpri.Trainer.fit

    def fit_place_and_interrupt(self: daskpri.Trainer, *args: Any, **kwargs: Any) -> None:
        """The run, the user's store put at --output, then a Ctrl-C."""
        fit(self, *args, **kwargs)
        _users_store(path)
        raise KeyboardInterrupt

    monkeypatch.setattr(daskpri.Trainer, "fit", fit_place_and_interrupt)
    assert main([*SMALL, "--workers", "1", "--output", str(path)]) == 130
    out = capsys.readouterr().out
    assert (
        f"interrupted at step 4: the history so far written to {tmp_path / 'run-1.zarr'} "
        f"({str(path)!r} now holds a zarr store that is not a daskpri history (it has no "
        "'step' dimension), put there during the run: it is left as it is)\n"
    ) in out
    with xr.open_zarr(path, consolidated=False) as users:
        assert list(users.data_vars) == ["x"]
    with xr.open_zarr(tmp_path / "run-1.zarr", consolidated=None) as history:
        assert history.sizes["step"] == 4


# -- bench --out: the report's files replace only a benchmark's ---------------------------


@pytest.mark.parametrize("name", ["speedup.png", "accuracy_mnist1d_mlp.png"])
def test_bench_refuses_a_directory_with_a_file_its_report_would_replace(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_bytes(b"a user's plot")
    (tmp_path / "notes.txt").write_text("other files are left alone, and no reason to refuse")
    argv = ["bench", "--quick", "--datasets", "mnist1d", "--models", "mlp", "--out",
            str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"daskpri: error: --out {str(tmp_path)!r} holds files the benchmark's report would "
        f"replace ({name}), without a results.json beside them; give another --out (or "
        "remove those files)\n")
    assert (tmp_path / name).read_bytes() == b"a user's plot"
    assert sorted(os.listdir(tmp_path)) == sorted([name, "notes.txt"])


def test_bench_merge_refuses_a_directory_with_a_file_its_report_would_replace(
    tmp_path: Path
) -> None:
    from test_bench_merge import _config as _merge_config
    from test_bench_merge import _part

    from daskpri.bench.runner import merge_results

    a = _part(tmp_path / "a", _merge_config(first_seed=0))
    b = _part(tmp_path / "b", _merge_config(first_seed=2))
    out = tmp_path / "merged"
    out.mkdir()
    (out / "speedup.png").write_bytes(b"a user's plot")
    with pytest.raises(ValueError, match=r"holds files the benchmark's report would replace "
                       r"\(speedup\.png\)"):
        merge_results([a, b], out, command="daskpri bench --merge a,b")
    assert os.listdir(out) == ["speedup.png"]


def test_report_files_are_the_files_the_bench_report_writes(tmp_path: Path) -> None:
    cfg = _config(seeds=1, workers=(1, 2))
    write_bench_report(tmp_path, cfg, MACHINE, SIZES, _simulate(cfg))
    assert sorted(report_files(cfg)) == sorted(os.listdir(tmp_path))


# -- a directory that takes no file: found before the work -------------------------------


def _takes_no_file(directory: str) -> None:
    try:
        with open(os.path.join(directory, "daskpri-probe"), "w"):
            pass
    except OSError:
        return
    os.remove(os.path.join(directory, "daskpri-probe"))
    pytest.skip(f"{directory} takes files here")


@pytest.mark.parametrize(
    ("argv", "flag", "path"),
    [
        ([*SMALL, "--output", "/proc/x.nc"], "--output", "/proc/x.nc"),
        ([*SMALL, "--output", "/proc/runs/x.zarr"], "--output", "/proc/runs/x.zarr"),
        ([*SMALL, "--checkpoint", "/proc/run.ckpt"], "--checkpoint", "/proc/run.ckpt"),
        (["report", "run.nc", "-o", "/proc/r.html"], "--output", "/proc/r.html"),
        (["bench", "--quick", "--out", "/proc/bb"], "--out", "/proc/bb"),
    ],
)
def test_a_directory_that_takes_no_file_is_refused_before_any_work(
    argv: list[str], flag: str, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _takes_no_file("/proc")  # root may write anywhere os.access looks at: not in /proc
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "dashboard:" not in captured.out
    assert captured.err == (
        f"daskpri: error: {flag} should be a path this process may write, but got {flag} "
        f"{path!r}, and '/proc' takes no new file: No such file or directory\n"
    )


def test_check_destination_refuses_a_directory_that_takes_no_file() -> None:
    _takes_no_file("/proc")
    with pytest.raises(ValueError, match=r"\Aoutput should be a path this process may write, "
                       r"but got output '/proc/x\.zarr', and '/proc' takes no new file: "):
        check_destination("/proc/x.zarr", name="output")


def test_a_trainer_refuses_a_checkpoint_path_where_no_file_can_be_made(small_data) -> None:
    _takes_no_file("/proc")
    model = build_model("mlp", small_data[0], seed=0)
    with pytest.raises(ValueError, match=r"\Acheckpoint_path should be a path this process may "
                       r"write, but got checkpoint_path '/proc/run\.ckpt', and '/proc' takes "
                       r"no new file: No such file or directory\Z"):
        daskpri.Trainer(model, checkpoint_path="/proc/run.ckpt")


@pytest.mark.parametrize("name", ["x.nc", "x.zarr"])
def test_a_write_that_fails_names_its_path_not_its_temporary(name: str) -> None:
    _takes_no_file("/proc")
    for write in (lambda p: to_store(_history(), p), lambda p: write_atomic(p, "text")):
        with pytest.raises(FileNotFoundError) as info:
            write(f"/proc/{name}")
        assert str(info.value) == (
            f"[Errno 2] could not write '/proc/{name}': No such file or directory")


# -- a full disk: the path named, no temporary left --------------------------------------


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 64 KiB tmpfs of its own, unmounted after the test."""
    with small_disk(tmp_path, "64k") as path:
        yield path


def test_a_bench_report_the_disk_cannot_take_names_its_file_and_leaves_no_temporary(
    disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(seeds=1)
    write_bench_report(tmp_path / "made", cfg, MACHINE, SIZES, _simulate(cfg))
    out = disk / "bb"
    out.mkdir()
    shutil.copy(tmp_path / "made" / "results.json", out / "results.json")
    results = (out / "results.json").read_bytes()
    assert main(["bench", "--out", str(out), "--report-only"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(rf"daskpri: error: could not write '{out}/[^'/]+': {NO_SPACE}\n", err)
    assert not [p for p in os.listdir(out) if ".tmp" in p]
    # what was written is whole: results.json the earlier one, or the new one with its tables
    doc = json.loads((out / "results.json").read_text())
    assert (out / "results.json").read_bytes() == results or doc["summary"]


def _fill(disk: Path) -> None:
    """Take every byte the disk has left."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError) as info:
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    assert info.value.errno == errno.ENOSPC


@pytest.mark.parametrize("writer", ["results.json", "png", "results.html"])
def test_each_bench_writer_on_a_full_disk_names_its_file_and_leaves_nothing(
    writer: str, disk: Path
) -> None:
    cfg = _config(seeds=1)
    records = _simulate(cfg)
    summary = summarize(cfg, records, dict(SIZES))
    _fill(disk)
    with pytest.raises(OSError) as info:
        if writer == "results.json":
            write_json(disk / "results.json", cfg, MACHINE, SIZES, records, summary)
        elif writer == "png":
            write_pngs(disk, cfg, records, summary)
        else:
            write_html(disk / "results.html", cfg, records, summary)
    name = "accuracy_mnist1d_mlp.png" if writer == "png" else writer
    assert str(info.value) == f"[Errno 28] could not write {str(disk / name)!r}: {NO_SPACE}"
    assert os.listdir(disk) == ["filler"]


def test_a_report_the_disk_cannot_take_names_its_file_and_leaves_no_temporary(
    disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = to_store(_history(), tmp_path / "run.nc")
    page = disk / "r.html"
    assert main(["report", run, "-o", str(page)]) == 1
    assert capsys.readouterr().err == (
        f"daskpri: error: could not write {str(page)!r}: {NO_SPACE}\n")
    assert os.listdir(disk) == []
