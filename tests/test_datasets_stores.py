"""Opening, storing and checking data: open_dataset, to_store, validate_dataset, check_values.

Zarr and netCDF stores written, replaced and refused; the built-in datasets
and the MNIST/CIFAR-10 readers are in test_datasets.py.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from daskpri.data import check_values, open_dataset, to_store, validate_dataset


def small(n: int = 20, n_features: int = 3, chunk: int | None = None) -> xr.Dataset:
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "x": (("sample", "feature"), rng.normal(size=(n, n_features)).astype(np.float32)),
            "y": ("sample", rng.integers(0, 4, size=n)),
        },
        attrs={"n_classes": 4, "name": "small"},
    )
    return ds.chunk(sample=chunk) if chunk else ds


# --- open_dataset / to_store ------------------------------------------------


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_store_round_trip_opens_lazily_and_reads_a_slice(tmp_path, suffix):
    ds = small(n=40, chunk=10)
    path = to_store(ds, tmp_path / f"data{suffix}")
    assert os.fspath(path) == os.fspath(tmp_path / f"data{suffix}")
    opened = open_dataset(path)
    assert opened["x"].chunks is not None  # dask-backed: nothing read yet
    part = opened.isel(sample=slice(10, 20)).load()
    xr.testing.assert_identical(part, ds.isel(sample=slice(10, 20)).compute())
    assert opened.attrs["n_classes"] == 4


def test_zarr_chunks_follow_the_datasets_chunks(tmp_path):
    opened = open_dataset(to_store(small(n=40, chunk=10), tmp_path / "data.zarr"))
    assert opened["x"].chunks[0] == (10, 10, 10, 10)


def test_to_store_writes_every_chunk_even_one_all_of_the_fill_value(tmp_path):
    # labels of one class in a chunk are all 0, the fill value of integers, which zarr
    # leaves out of a store unless told; features all NaN, the fill value of floats
    ds = small(n=40, chunk=10)
    ds["y"][:10] = 0
    ds["x"][10:20] = np.nan
    path = to_store(ds, tmp_path / "data.zarr")
    group = zarr.open_group(path, mode="r")
    for name in ("x", "y"):
        assert group[name].nchunks_initialized == group[name].nchunks == 4, name
    xr.testing.assert_identical(open_dataset(path).load(), ds.compute())


def test_a_store_that_lacks_chunks_of_x_is_refused_before_it_is_read(tmp_path):
    path = to_store(small(n=40, chunk=10), tmp_path / "data.zarr")
    shutil.rmtree(os.path.join(path, "x", "c", "2"))  # (a copy cut short, say)
    with pytest.raises(ValueError, match="^" + re.escape(
        f"data should be a zarr store that holds every chunk of its arrays, but {path!r} "
        "lacks 1 of the 4 chunks of 'x' (the first: 'x/c/2/0'), which zarr would read as its "
        "fill value (nan): a store copied in part, or written by a writer that stopped midway "
        "(or that left out chunks all of the fill value, as zarr does unless told "
        "write_empty_chunks=True); copy or write it again whole (daskpri.data.to_store writes "
        "every chunk)") + "$"):
        open_dataset(path)
    # labels left out as zarr leaves out a chunk all of its fill value: a store's own
    ds = small(n=40, chunk=10)
    ds["y"][:] = 0
    ds.to_zarr(tmp_path / "xarrays.zarr", consolidated=False)
    assert zarr.open_group(tmp_path / "xarrays.zarr", mode="r")["y"].nchunks_initialized == 0
    assert (open_dataset(os.fspath(tmp_path / "xarrays.zarr"))["y"].values == 0).all()


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_to_store_replaces_an_existing_store(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    to_store(small(n=20), path)
    new = small(n=30)
    to_store(new, path)
    with open_dataset(path) as opened:
        xr.testing.assert_identical(opened.load(), new)
    assert os.listdir(tmp_path) == [path.name]  # no temporary siblings left


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
@pytest.mark.parametrize("existed", [False, True], ids=["new", "replacing"])
def test_a_store_another_writer_put_there_meanwhile_is_kept_whole(tmp_path, suffix, existed):
    path = tmp_path / f"data{suffix}"
    if existed:
        to_store(small(n=10), path)
    theirs = small(n=30)
    put: list[str] = []

    def meanwhile(block: np.ndarray) -> np.ndarray:
        if not put:  # another writer, done while this one reads its data
            put.append(to_store(theirs, path))
        return block

    ours = small(n=20, chunk=10)
    ours["x"] = ours["x"].copy(data=ours["x"].data.map_blocks(
        meanwhile, dtype=np.float32, meta=np.array((), np.float32)))
    kind = "a zarr store" if suffix == ".zarr" else "a file"
    with pytest.raises(FileExistsError, match="^" + re.escape(
        f"[Errno 17] could not write {str(path)!r}: another writer put {kind} there while "
        "this write ran (another to_store, say); it is left as that writer made it, and what "
        "this write wrote is not kept: write again to replace it") + "$"):
        to_store(ours, path)
    assert put
    with open_dataset(path) as opened:
        xr.testing.assert_identical(opened.load(), theirs)
    assert os.listdir(tmp_path) == [path.name]  # nothing of ours left beside it


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "data.nc"
    to_store(small(n=20), path)
    before = path.read_bytes()
    bad = small(n=2).assign(z=("sample", np.array([object(), object()], dtype=object)))
    with pytest.raises(ValueError, match="unable to infer dtype on variable 'z'"):
        to_store(bad, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["data.nc"]


def _refuses_a_directory_of_other_files(path, match: str) -> None:
    """``to_store`` refuses ``path``, made a directory holding another file, with an error
    that matches ``match``, and writes nothing in it or beside it."""
    path.mkdir()
    (path / "important.txt").write_text("keep")
    with pytest.raises(ValueError, match=match):
        to_store(small(), path)
    assert (path / "important.txt").read_text() == "keep"
    assert os.listdir(path) == ["important.txt"]
    assert os.listdir(path.parent) == [path.name]  # nothing written beside it either


@pytest.mark.parametrize("name", ["victim", "victim.zarr"])
def test_to_store_refuses_a_directory_that_is_not_a_zarr_store(tmp_path, name):
    _refuses_a_directory_of_other_files(
        tmp_path / name,
        rf"path should be a new path, an empty directory or a zarr store to replace, "
        rf"but got path='[^']*{name}', a directory that holds other files")


def test_to_store_refuses_a_file_where_a_zarr_store_would_go(tmp_path):
    path = tmp_path / "data.zarr"
    path.write_text("keep")
    with pytest.raises(ValueError, match=r"but got path='[^']*data\.zarr', which is a file"):
        to_store(small(), path)
    assert path.read_text() == "keep"
    assert os.listdir(tmp_path) == ["data.zarr"]


def test_to_store_refuses_a_directory_where_a_netcdf_file_would_go(tmp_path):
    _refuses_a_directory_of_other_files(
        tmp_path / "data.nc",
        r"path should be a new path or a netCDF file to replace, "
        r"but got path='[^']*data\.nc', which is a directory")


@pytest.mark.parametrize("old", ["zarr format 2", "zarr format 3", "empty directory"])
def test_to_store_replaces_a_zarr_store_of_either_format_or_an_empty_directory(tmp_path, old):
    path = tmp_path / "store"
    if old == "empty directory":
        path.mkdir()
    else:
        small(n=20).to_zarr(path, zarr_format=int(old[-1]), consolidated=False)
    new = small(n=30)
    to_store(new, path)
    xr.testing.assert_identical(open_dataset(path).load(), new)
    assert os.listdir(tmp_path) == ["store"]


def test_a_directory_without_suffix_is_opened_as_zarr(tmp_path):
    ds = small()
    to_store(ds, tmp_path / "data.zarr")
    os.rename(tmp_path / "data.zarr", tmp_path / "store")
    xr.testing.assert_identical(open_dataset(tmp_path / "store").load(), ds)


def test_open_dataset_returns_a_dataset_as_is():
    ds = small()
    assert open_dataset(ds) is ds


def test_open_dataset_refuses_other_types():
    with pytest.raises(TypeError, match=r"train should be an xarray.Dataset or the path .* int"):
        open_dataset(3, name="train")
    x, y = small()["x"].values, small()["y"].values
    for arrays in (x, (x, y), pd.DataFrame(x).assign(label=y)):  # as scikit-learn takes them
        with pytest.raises(TypeError, match=re.escape(
                ": put the features and the labels in one Dataset, as 'x' and 'y' along "
                "'sample': xr.Dataset({'x': (('sample', 'feature'), x), 'y': ('sample', y)})")):
            open_dataset(arrays)


def test_open_dataset_names_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.zarr"):
        open_dataset(tmp_path / "nope.zarr")


def test_open_dataset_refuses_unknown_formats(tmp_path):
    (tmp_path / "data.csv").write_text("1,2\n")
    with pytest.raises(ValueError, match=r"should be a zarr store .* netCDF file .*data\.csv"):
        open_dataset(tmp_path / "data.csv")


def test_open_dataset_reads_a_netcdf3_file_with_scipy(tmp_path):
    pytest.importorskip("scipy")
    ds = small(n=30)
    ds.to_netcdf(tmp_path / "data.nc", engine="scipy")
    opened = open_dataset(tmp_path / "data.nc")
    assert opened["x"].chunks is not None  # dask-backed: nothing read yet
    # netCDF3 has no 64-bit integers: xarray stores the labels as int32
    assert opened["y"].dtype == np.int32
    xr.testing.assert_identical(opened.load(), ds.assign(y=ds["y"].astype(np.int32)))


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_a_damaged_store_is_refused_naming_it_and_what_its_reader_said(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    if suffix == ".zarr":
        to_store(small(), path)
        (path / "zarr.json").write_text("{not json")  # a write that did not finish
        said = "a zarr store that cannot be read, damaged or cut short (a copy or a write " \
               "that did not finish?): JSONDecodeError: Expecting property name"
    else:
        pytest.importorskip("scipy")
        small(n=30).to_netcdf(path, engine="scipy")
        path.write_bytes(path.read_bytes()[:-200])  # a netCDF3 file cut short
        said = "a netCDF3 file that cannot be read, damaged or cut short (a copy or a write " \
               "that did not finish?): ValueError: "
    with pytest.raises(ValueError, match="^" + re.escape(
            f"eval_data names {str(path)!r}, {said}")):
        open_dataset(path, name="eval_data")


def test_open_dataset_without_scipy_names_a_netcdf3_file_and_what_to_do(tmp_path, monkeypatch):
    pytest.importorskip("scipy")
    small().to_netcdf(tmp_path / "data.nc", engine="scipy")
    # a Python without scipy: importing it fails
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.io", None)
    with pytest.raises(
        ValueError,
        match=r"train names '[^']*data\.nc', a netCDF3 file, which daskpri reads with scipy, "
        r"but scipy is not installed; install scipy, or write the data as netCDF4",
    ):
        open_dataset(tmp_path / "data.nc", name="train")


def test_open_dataset_refuses_a_netcdf_name_on_a_file_of_another_format(tmp_path):
    (tmp_path / "data.nc").write_text("x,y\n1,2\n")
    with pytest.raises(
        ValueError,
        match=r"data should be a netCDF4 file \(HDF5 inside\) or a netCDF3 file, "
        r"but '[^']*data\.nc' is neither: it starts with the bytes 78 2c 79 0a",
    ):
        open_dataset(tmp_path / "data.nc")


def test_open_dataset_refuses_a_directory_with_a_netcdf_suffix(tmp_path):
    (tmp_path / "data.nc").mkdir()
    with pytest.raises(ValueError, match=r"data should be a netCDF file.*which is a directory"):
        open_dataset(tmp_path / "data.nc")


# --- validate_dataset / check_values ----------------------------------------


def test_validate_dataset_reports_metadata():
    assert validate_dataset(small(chunk=5)) == {
        "n_samples": 20,
        "x_shape": (3,),
        "x_dtype": "float32",
        "n_classes": 4,
    }


def test_validate_dataset_refuses_labels_of_another_length():
    ds = small(n=10).drop_vars("y").assign(y=("label", np.zeros(8, np.int64)))
    with pytest.raises(
        ValueError,
        match=r"data.y should have dims \('sample',\), one label for each of the 10 samples "
        r"of data.x, but got dims \('label',\) of length 8",
    ):
        validate_dataset(ds)


@pytest.mark.parametrize("missing", ["x", "y"])
def test_validate_dataset_refuses_missing_variables(missing):
    with pytest.raises(ValueError, match=rf"train should have a variable '{missing}', but got"):
        validate_dataset(small().drop_vars(missing), name="train")


def test_validate_dataset_needs_a_sample_dimension():
    ds = small().rename(sample="row")
    with pytest.raises(ValueError, match=r"data should have a 'sample' dimension, but got .*row"):
        validate_dataset(ds)


def test_validate_dataset_needs_a_sample():
    with pytest.raises(ValueError, match=r"data should have at least one sample, but got 0"):
        validate_dataset(small().isel(sample=slice(0, 0)))


def test_check_values_reports_nan_count_and_first_sample():
    x = np.zeros((5, 3), np.float32)
    x[2, 1] = np.nan
    x[4, 0] = np.inf
    where = "partition 3 (samples 3000-3004)"
    with pytest.raises(
        ValueError,
        match=r"x in partition 3 \(samples 3000-3004\) should hold finite numbers, "
        r"but got 2 NaN or infinite values, the first at sample 2",
    ):
        check_values(x, np.zeros(5, np.int64), n_classes=10, where=where)


def test_check_values_reports_labels_out_of_range():
    y = np.array([0, 3, 10, 11])
    with pytest.raises(
        ValueError,
        match=r"y in partition 0 should be in \[0, 10\), but got 10 at sample 2 \(2 bad labels\)",
    ):
        check_values(np.zeros((4, 2)), y, n_classes=10, where="partition 0")


def test_check_values_refuses_negative_labels_without_n_classes():
    with pytest.raises(ValueError, match=r"should be non-negative, but got -1 at sample 1"):
        check_values(np.zeros((2, 2)), np.array([0, -1]), n_classes=None, where="partition 0")


def test_check_values_accepts_good_values():
    check_values(np.ones((3, 2)), np.array([0, 1, 2]), n_classes=3, where="partition 0")


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_a_store_written_again_has_another_fingerprint(tmp_path, suffix):
    import time

    from daskpri.data.io import fingerprint

    ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((8, 3), np.float32)),
                     "y": ("sample", np.arange(8) % 2)})
    path = to_store(ds, str(tmp_path / f"data{suffix}"))
    first = fingerprint(path)
    assert fingerprint(path) == first  # read, not changed
    time.sleep(0.01)
    to_store(ds.assign(x=ds["x"] + 1), path)  # new values, same path
    assert fingerprint(path) != first


def test_opening_a_directory_that_holds_no_zarr_store_says_so(tmp_path):
    from daskpri.data.io import open_dataset

    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    with pytest.raises(ValueError, match=re.escape(
        f"data names {str(empty)!r}, which holds no zarr store: no zarr.json or .zgroup at its "
        "top")):
        open_dataset(str(empty))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_zarr_store_zarr_python_wrote_is_refused_saying_to_write_it_with_xarray(
    tmp_path, zarr_format
):
    import zarr

    raw = zarr.open_group(tmp_path / "raw.zarr", mode="w", zarr_format=zarr_format)
    raw.create_array("x", data=np.zeros((4, 3), "f4"))  # no dimension names
    raw.create_array("y", data=np.arange(4))
    zarr.save_array(tmp_path / "one.zarr", np.zeros((4, 3)), zarr_format=zarr_format)
    for path, what in [("raw.zarr", "arrays without the dimension names xarray reads (as "
                                    "zarr-python writes them)"),
                       ("one.zarr", "a single array, not a group of arrays 'x' and 'y'")]:
        with pytest.raises(ValueError, match="^" + re.escape(
                "data should be a zarr store of an xarray.Dataset, with the arrays 'x' and 'y' "
                f"along a dimension 'sample', but {str(tmp_path / path)!r} holds {what}: build "
                "the Dataset and write it with xarray, daskpri.data.to_store(xr.Dataset({'x': "
                "(('sample', 'feature'), x), 'y': ('sample', y)}), 'train.zarr')") + "$"):
            open_dataset(str(tmp_path / path))


@pytest.mark.parametrize("suffix", [".nc", ".zarr"])
def test_a_write_removes_what_killed_writes_left_but_not_a_fresh_one(tmp_path, suffix):
    name = f"data{suffix}"
    stale_file = tmp_path / f".{name}.tmp-0000"  # a netCDF write killed midway
    stale_file.write_bytes(b"x" * 1000)
    stale_store = tmp_path / f".{name}.tmp-1111"  # a zarr write killed midway
    stale_store.mkdir()
    (stale_store / "zarr.json").write_text("{}")
    fresh = tmp_path / f".{name}.tmp-2222"  # another writer's, still writing
    fresh.write_bytes(b"y")
    other = tmp_path / ".other.nc.tmp-3333"  # not this path's
    other.write_bytes(b"z")
    old = time.time() - 120
    for p in (stale_file, stale_store, other):
        os.utime(p, (old, old))
    to_store(small(n=10), tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [name, fresh.name, other.name])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_a_zarr_store_replaced_is_swapped_in_one_step_never_absent(tmp_path, monkeypatch):
    from daskpri.data import store

    path = tmp_path / "data.zarr"
    to_store(small(n=20), path)
    there: list[bool] = []  # whether a store stood at the path after each rename

    def watching(real):
        def watched(a, b, *args, **kwargs):
            real(a, b, *args, **kwargs)
            there.append((path / "zarr.json").exists() or (path / ".zgroup").exists())
        return watched

    monkeypatch.setattr(os, "rename", watching(os.rename))
    monkeypatch.setattr(os, "replace", watching(os.replace))
    new = small(n=30)
    to_store(new, path)
    assert all(there)
    with open_dataset(path) as opened:
        xr.testing.assert_identical(opened.load(), new)
    assert os.listdir(tmp_path) == [path.name]  # the old store, swapped out, is deleted
    # where the file system cannot swap, the old store is moved aside: an instant without
    monkeypatch.setattr(store, "_exchange", lambda a, b: False)
    there.clear()
    to_store(small(n=40), path)
    assert not all(there) and there[-1]
    with open_dataset(path) as opened:
        assert opened.sizes["sample"] == 40
