"""The training history: its variables' dtypes, and writing it to netCDF and zarr."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import xarray as xr

from daskpri.data.io import to_store
from daskpri.training.history import COUNT_VARIABLES, STEP_VARIABLES, HistoryRecorder


def _record(step: int, n_workers: int) -> dict:
    """A step's record as ``rounds.step_record`` makes it (flags as floats)."""
    return {
        "step": step,
        "selection_digest": 123456789.0,
        "skipped": 0.0,
        "time": 0.1 * (step + 1),
        "loss": 2.0 - 0.1 * step,
        "lr": 0.1,
        "train_accuracy": 0.5,
        "samples": 64 * (step + 1),
        "grad_samples": 32 * (step + 1),
        "samples_per_second": 640.0,
        "step_time": 0.1,
        "compute_time": 0.05,
        "selection_time": 0.01,
        "selected_ahead": float(step % 2),
        "optimizer_time": 0.01,
        "communication_time": 0.03,
        "n_workers": n_workers,
        "priority_mean": math.nan,
        "priority_max": math.nan,
        "worker_samples": [64 // n_workers] * n_workers,
        "worker_compute_time": [0.05] * n_workers,
    }


def _history(n_workers=(2, 2, 1, 2)) -> xr.Dataset:
    recorder = HistoryRecorder()
    for step, n in enumerate(n_workers):
        recorder.append(_record(step, n))
    return recorder.to_dataset({"strategy": "uniform", "seed": 0})


def test_history_counts_are_integers():
    h = _history()
    counts = {"skipped", "selected_ahead", "samples", "grad_samples", "n_workers"}
    assert COUNT_VARIABLES == counts and counts <= set(STEP_VARIABLES)
    for name in counts:
        assert h[name].dtype == np.int64, name
    assert h["n_workers"].values.tolist() == [2, 2, 1, 2]
    assert h["samples"].values.tolist() == [64, 128, 192, 256]
    assert h["selected_ahead"].values.tolist() == [0, 1, 0, 1]
    assert h["loss"].dtype == np.float64 and h["selection_digest"].dtype == np.float64


def test_history_worker_samples_is_nan_in_slots_a_step_lacked():
    ws = _history()["worker_samples"]
    assert ws.dtype == np.float64
    np.testing.assert_array_equal(ws.values[2], [64.0, np.nan])


def test_history_count_missing_from_an_old_record_stays_float():
    recorder = HistoryRecorder()
    old = _record(0, 2)
    del old["selected_ahead"]  # a checkpoint written before selected_ahead existed
    recorder.append(old)
    recorder.append(_record(1, 2))
    h = recorder.to_dataset()
    assert h["selected_ahead"].dtype == np.float64
    np.testing.assert_array_equal(h["selected_ahead"].values, [np.nan, 1.0])
    assert h["samples"].dtype == np.int64


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_history_keeps_its_dtypes_through_a_store(tmp_path, suffix):
    h = _history()
    path = to_store(h, tmp_path / f"run{suffix}")
    opened = (
        xr.open_zarr(path) if suffix == ".zarr" else xr.open_dataset(path, engine="h5netcdf")
    )
    with opened as back:
        back = back.load()
    for name in h.data_vars:
        assert back[name].dtype == h[name].dtype, name
    xr.testing.assert_identical(back, h)


def test_history_zarr_store_opens_without_warning(tmp_path):
    path = to_store(_history(), tmp_path / "run.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "Failed to open Zarr store with consolidated ..."
        with xr.open_zarr(path) as back:
            assert back["n_workers"].values.tolist() == [2, 2, 1, 2]


def test_a_step_that_trained_on_no_samples_records_no_loss_rather_than_zero():
    import torch

    from daskpri.replicas.worker import StepResult
    from daskpri.training.rounds import combine, nonfinite, step_record

    empty = StepResult(torch.zeros(3), 0, np.empty(0, np.int64), np.empty(0), 0.0, 0, 0, 0.01,
                       "tcp://w", "cpu", 1)
    total = combine([empty, empty], local_steps=1)
    assert nonfinite(total, 5, 1, 1) is None  # nothing went wrong: nothing to train on
    record = step_record(total, 0.0, step=5, skipped=False, elapsed=1.0, rate=0.1, prev={},
                         step_time=0.02, selection_time=0.0, optimizer_time=0.0,
                         selected_ahead=False)
    assert math.isnan(record["loss"]) and math.isnan(record["train_accuracy"])
    assert record["samples"] == record["grad_samples"] == 0


def test_time_to_accuracy_is_the_first_evaluation_that_reaches_the_target():
    from daskpri import time_to_accuracy

    h = xr.Dataset({"time": ("step", [1.0, 2.0, 3.0, 4.0]),
                    "accuracy": ("step", [0.5, 0.8, np.nan, 0.9])})
    assert time_to_accuracy(h, 0.8) == 2.0  # the first, not the last
    assert time_to_accuracy(h, 0.9) == 4.0
    assert math.isnan(time_to_accuracy(h, 0.95))  # never reached: NaN, not 0
