"""The fingerprint of a training dataset: of its data whatever its format, and cheap."""

from __future__ import annotations

import numpy as np
import xarray as xr
from _reads import opened_under

from daskpri.data import open_dataset, to_store
from daskpri.data._fingerprint import N_ROWS, UNREAD, data_fingerprint


def test_the_same_data_in_any_format_has_the_same_fingerprint(small_data, tmp_path):
    train, _ = small_data
    fp = data_fingerprint(train)
    stored = to_store(train.chunk({"sample": 100}), tmp_path / "train.zarr")
    nc = to_store(train, tmp_path / "train.nc")
    # as a user's own data comes: sample last, labels as floats
    own = train.transpose("feature", "sample").assign(y=train["y"].astype("float32"))
    for other in (open_dataset(stored), open_dataset(nc), open_dataset(own)):
        assert data_fingerprint(other) == fp
    assert data_fingerprint(train.assign(x=train["x"].astype("float64")))["x"] != fp["x"]
    changed = train.copy(deep=True)
    changed["x"].values[-1, 0] += 1  # the last sample is always among those digested
    assert data_fingerprint(changed)["x_rows"] != fp["x_rows"]


def test_a_store_is_read_at_a_few_chunks_only(tmp_path):
    n = 1000
    ds = xr.Dataset({"x": (("sample", "feature"), np.random.default_rng(0).random((n, 4))),
                     "y": ("sample", np.arange(n) % 7)}).chunk({"sample": 10})
    store = to_store(ds, tmp_path / "big.zarr")
    opened = open_dataset(store)
    with opened_under(store) as seen:
        fp = data_fingerprint(opened)
    chunks = [p for p in seen if "/c/" in p]
    # one chunk of x and one of y a sampled sample, of the 100 each holds
    assert 0 < len(chunks) <= 2 * N_ROWS, seen
    assert fp == data_fingerprint(ds.compute())


def test_values_the_driver_cannot_read_are_left_to_the_workers_to_refuse(small_data, tmp_path):
    train, _ = small_data
    store = to_store(train.chunk({"sample": 400}), tmp_path / "train.zarr")
    fp = data_fingerprint(open_dataset(store))
    chunk = sorted(p for p in (tmp_path / "train.zarr" / "x").rglob("*") if p.is_file()
                   and not p.name.startswith((".", "zarr")))[1]
    chunk.write_bytes(chunk.read_bytes()[:20])  # cut short: the codec cannot decode it
    damaged = data_fingerprint(open_dataset(store))
    # no error here: the fit's workers refuse the store, naming its partition
    assert damaged == dict(fp, x_rows=UNREAD, y_rows=UNREAD)
