"""``daskpri train --data PATH``: a user's own store, laid out as an xarray user has it."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from _reads import opened_under
from distributed import LocalCluster

from daskpri.cli import main
from daskpri.cli.train import _write_history
from daskpri.data.io import to_store


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--data", "d.zarr", "--n-samples", "10", "--dataset", "digits"],
         "--data d.zarr trains on your own data, and --dataset, --n-samples choose(s) a "
         "built-in dataset: give one or the other"),
        (["--eval-data", "e.nc"],
         "--eval-data goes with --data PATH, your own training data (a built-in --dataset "
         "brings its own test split)"),
        (["--data", "d.zarr", "--target-accuracy", "0.9"],
         "--target-accuracy with --data needs --eval-data PATH, the held-out data to measure "
         "accuracy on"),
    ],
)
def test_data_flags_that_do_not_go_together_are_refused(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *args]) == 2
    assert capsys.readouterr().err == f"daskpri: error: {said}\n"


def test_train_on_a_store_of_transposed_features_and_float_labels(
    small_data: tuple[xr.Dataset, xr.Dataset], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    train, test = small_data
    # as a user's own data comes: sample last, labels as floats, no n_classes attribute
    own = train.transpose("feature", "sample").assign(y=train["y"].astype(np.float32))
    store = to_store(own.drop_attrs().chunk({"sample": 400}), tmp_path / "train.zarr")
    evals = to_store(test.chunk({"sample": 100}), tmp_path / "test.zarr")
    y = test["y"].values.astype(np.float64)
    y[3] = np.nan
    bad = to_store(test.assign(y=("sample", y)), tmp_path / "bad.nc")
    out = tmp_path / "run.nc"
    common = ["train", "--max-steps", "3", "--no-progress", "--workers", "1"]

    # a label that is missing: refused before a cluster starts
    assert main([*common, "--data", store, "--eval-data", bad]) == 2
    said = capsys.readouterr()
    assert said.err.startswith("daskpri: error: eval_data.y should hold whole-number class "
                               "labels (floats such as 3.0 are taken as the integer 3), but "
                               "got nan at sample 3 ")
    assert "dashboard:" not in said.out
    # eval data the model cannot be measured on: refused before a cluster starts too, as
    # fit refuses it before it starts its own
    y = test["y"].values.copy()
    y[4] = 12
    beyond = to_store(test.assign(y=("sample", y)), tmp_path / "beyond.zarr")
    narrow = to_store(test.isel(feature=slice(0, 5)), tmp_path / "narrow.zarr")
    for given, error in [(beyond, r"y in eval_data should be in \[0, 10\), but got 12 at "
                                  r"sample 4 \(1 bad label\)"),
                         (narrow, r"eval_data.x should have per-sample shape \(20,\) like "
                                  r"data.x, but got \(5,\)")]:
        with opened_under(given) as seen:
            assert main([*common, "--data", store, "--eval-data", given]) == 2
        _read_once(seen)
        said = capsys.readouterr()
        assert re.fullmatch(f"daskpri: error: {error}\n", said.err)
        assert "dashboard:" not in said.out
    # a batch over a worker's share: refused before a cluster starts, in --data's words
    assert main([*common, "--data", store, "--batch-size", "100000"]) == 2
    said = capsys.readouterr()
    assert said.err.startswith("daskpri: error: --batch-size 100000 is more than a worker's "
                               "share of the data")
    assert said.err.endswith("or more samples\n") and "dashboard:" not in said.out

    x = train["x"].values.copy()
    x[5, 0] = np.nan
    nan = to_store(train.assign(x=(train["x"].dims, x)).chunk({"sample": 400}),
                   tmp_path / "nan.zarr")
    logged = _Records()
    worker_log = logging.getLogger("distributed.worker")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, host="127.0.0.1",
                      protocol="tcp", dashboard_address="127.0.0.1:0") as cluster:
        # a NaN in a store's x, found by the worker that loads it: said in one line, by the
        # driver, with no "Compute Failed" and traceback logged by the worker before it
        worker_log.addHandler(logged)
        try:
            assert main([*common, "--scheduler", cluster.scheduler_address, "--data", nan]) == 2
        finally:
            worker_log.removeHandler(logged)
        assert capsys.readouterr().err == (
            f"daskpri: error: x in partition 0 (samples 0-399 of {nan}) should hold finite "
            "numbers, but got 1 NaN or infinite value, the first at sample 5\n")
        assert [r.getMessage() for r in logged.records if r.levelno >= logging.ERROR] == []
        with opened_under(evals) as seen:
            assert main([*common, "--scheduler", cluster.scheduler_address, "--data", store,
                         "--eval-data", evals, "--output", str(out)]) == 0
        _read_once(seen, chunks=2 * 4)  # x's and y's, of 400 samples in chunks of 100
    assert "selective-backprop: 3 steps, final accuracy 0." in capsys.readouterr().out
    with xr.open_dataset(out, engine="h5netcdf") as history:
        assert history.sizes["step"] == 3 and np.isfinite(history["accuracy"][-1])
        assert history.attrs["dataset"] == store


def _read_once(opened: list[str], chunks: int | None = None) -> None:
    """Each chunk of the eval data's store was read once, by the driver (``chunks`` of them)."""
    read = [path for path in opened if f"{os.sep}c{os.sep}" in path]
    assert read and len(read) == len(set(read)), sorted(read)
    assert chunks is None or len(read) == chunks, sorted(read)


class _Records(logging.Handler):
    """The records logged to the logger it is added to."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_history_whose_output_another_writer_took_meanwhile_goes_beside_it(tmp_path):
    out = tmp_path / "run.nc"
    theirs = xr.Dataset({"notes": ("line", np.arange(3))})

    def meanwhile(block: np.ndarray) -> np.ndarray:
        if not out.exists():  # another writer's file, there as the history is written
            theirs.to_netcdf(out, engine="h5netcdf")
        return block

    loss = np.linspace(1.0, 0.5, 4)
    history = xr.Dataset({"loss": ("step", da.from_array(loss, chunks=2).map_blocks(
        meanwhile, dtype=loss.dtype, meta=np.array((), loss.dtype)))})
    written, taken = _write_history(history, str(out))
    assert written == str(tmp_path / "run-1.nc")
    assert taken == "a file that is not a daskpri history (it has no 'step' dimension)"
    with xr.open_dataset(out, engine="h5netcdf") as kept:
        xr.testing.assert_identical(kept.load(), theirs)
    with xr.open_dataset(written, engine="h5netcdf") as ours:
        np.testing.assert_array_equal(ours["loss"].values, loss)

