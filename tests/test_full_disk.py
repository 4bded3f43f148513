"""A disk that fills as daskpri writes: one line, nothing half-written, the history kept.

On a real filesystem that fills: a 200 KiB tmpfs mounted for each test (Linux,
as root; skipped where it cannot be mounted).
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from _disks import small_disk
from test_history import _record

from daskpri.cli import main
from daskpri.data import store
from daskpri.data.io import to_store
from daskpri.training import checkpoint
from daskpri.training.history import HistoryRecorder

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a 200 KiB tmpfs of its own, unmounted after the test."""
    with small_disk(tmp_path, "200k") as path:
        yield path


def _history(steps: int) -> xr.Dataset:
    recorder = HistoryRecorder()
    for step in range(steps):
        recorder.append(_record(step, 2))
    return recorder.to_dataset({"strategy": "uniform", "seed": 0})


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_history_the_disk_cannot_take_is_one_oserror_and_the_old_one_stays(
    disk: Path, suffix: str
) -> None:
    path = disk / f"run{suffix}"
    to_store(xr.Dataset({"loss": ("step", [2.0, 1.5])}), path)  # an earlier run's, small
    history = _history(2000)
    assert history.nbytes > 200 * 1024
    with pytest.raises(OSError, match=r"\A\[Errno 28\] could not write .*\Z") as info:
        to_store(history, path)
    assert info.value.errno == errno.ENOSPC
    assert info.value.strerror == f"could not write {str(path)!r}: {NO_SPACE}"
    assert os.listdir(disk) == [path.name]  # its temporary sibling removed
    opened = xr.open_zarr(path) if suffix == ".zarr" else xr.open_dataset(path, engine="h5netcdf")
    with opened as old:
        assert old["loss"].values.tolist() == [2.0, 1.5]


# HDF5 writes a file's metadata as it closes it; where the disk cannot take
# that, h5py 3.16 printed an "Exception ignored" for each object and crashed
# the process (a segmentation fault), at each 4 KiB step from 4 KiB left to
# the file's size. Swept so, in a process of its own, so that a crash is a
# failure of this test, not the end of the suite.
_SWEEP = """
import os, sys
sys.path.insert(0, {tests!r})
from test_full_disk import _history
from daskpri.data.io import to_store

disk, history = {disk!r}, _history(40)
size = os.path.getsize(to_store(history, {probe!r}))
for free in range(0, size + 8192, 4096):
    for name in os.listdir(disk):
        os.remove(os.path.join(disk, name))
    with open(os.path.join(disk, "filler"), "wb") as f:
        f.write(bytes(max(0, os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - free)))
    try:
        to_store(history, os.path.join(disk, "run.nc"))
        outcome = "written"
    except OSError as e:
        outcome = e.strerror
    print(free, outcome, sorted(os.listdir(disk)), sep="|")
"""


def test_a_netcdf_file_the_disk_fills_at_any_point_is_an_oserror_not_a_crash(
    disk: Path, tmp_path: Path
) -> None:
    script = _SWEEP.format(tests=str(Path(__file__).parent), disk=str(disk),
                           probe=str(tmp_path / "probe.nc"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-2000:]
    outcomes = [line.split("|") for line in done.stdout.splitlines()]
    assert len(outcomes) > 3
    refused = f"could not write {str(disk / 'run.nc')!r}: {NO_SPACE}"
    for free, outcome, left in outcomes:
        assert (outcome, left) in {(refused, "['filler']"), ("written", "['filler', 'run.nc']")}, (
            free, outcome, left)
    assert outcomes[0][1] == refused and outcomes[-1][1] == "written"


def test_a_netcdf_file_too_large_to_make_in_memory_is_refused_before_it_is_written(
    disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # written by HDF5 itself then, it is not begun on a disk that lacks room for its values
    monkeypatch.setattr(store, "_NETCDF_IN_MEMORY", 0)
    path = disk / "run.nc"
    with pytest.raises(OSError, match=re.escape(f"could not write {str(path)!r}: {NO_SPACE}")):
        to_store(_history(2000), path)
    assert os.listdir(disk) == []
    small = xr.Dataset({"loss": ("step", np.arange(3.0))})
    monkeypatch.setattr(store, "_HDF5_OVERHEAD", 0)
    with xr.open_dataset(to_store(small, path), engine="h5netcdf") as back:
        assert back["loss"].values.tolist() == [0.0, 1.0, 2.0]


def test_a_checkpoint_the_disk_cannot_take_ends_the_run_with_its_history_written(
    disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = disk / "run.ckpt", tmp_path / "run.nc"
    argv = ["train", "--dataset", "synthetic", "--n-samples", "2000", "--max-steps", "20",
            "--workers", "1", "--no-progress", "--checkpoint", str(ckpt),
            "--checkpoint-every", "5", "--output", str(out)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"daskpri: error: could not write the checkpoint {str(ckpt)!r}: {NO_SPACE}\n")
    said = re.search(rf"^stopped by an error at step (\d+): the history so far written to "
                     rf"{re.escape(str(out))}$", captured.out, re.M)
    assert said is not None, captured.out
    step = int(said.group(1))
    with xr.open_dataset(out, engine="h5netcdf") as history:
        assert history.sizes["step"] == step > 0
        assert history.attrs["dataset"] == "synthetic"
    # what the disk took before is the last checkpoint, whole; no temporary is left
    if os.listdir(disk):
        assert os.listdir(disk) == [ckpt.name]
        kept = checkpoint.read(ckpt)["step"]
        assert 0 < kept < step
        assert f"the checkpoint in {ckpt} is of step {kept}" in captured.out
    else:
        assert f"no checkpoint written to {ckpt}" in captured.out
