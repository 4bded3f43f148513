"""Built-in datasets, the MNIST/CIFAR-10 readers, and opening/storing/checking data."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import re
import struct
import sys
import time

import dask.config
import numpy as np
import pytest
import xarray as xr

from daskpri.data import DATASETS, check_values, load, open_dataset, to_store, validate_dataset
from daskpri.data._readers import CIFAR10_TEST, CIFAR10_TRAIN, MNIST_FILES


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Every test caches into its own directory, never into ~/.cache."""
    path = tmp_path_factory.mktemp("cache")
    with dask.config.set({"daskpri.cache-dir": str(path)}):
        yield path


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


# --- built-in datasets ------------------------------------------------------


def check_layout(ds: xr.Dataset, name: str, trailing: tuple[int, ...], split: str) -> None:
    assert ds["x"].dims[0] == "sample"
    assert ds["x"].shape[1:] == trailing
    assert ds["x"].dtype == np.float32
    assert ds["y"].dims == ("sample",)
    assert ds["y"].dtype == np.int64
    assert ds.attrs["name"] == name
    assert ds.attrs["n_classes"] == 10
    assert isinstance(ds.attrs["n_classes"], int)
    assert isinstance(ds.attrs["source"], str) and ds.attrs["source"]
    assert ds.attrs["split"] == split
    assert ds["x"].chunks is None  # in memory, not dask-backed
    assert validate_dataset(ds)["n_classes"] == 10
    y = ds["y"].values
    assert y.min() >= 0 and y.max() < 10


@pytest.mark.parametrize(
    ("name", "n_train", "n_test", "trailing"),
    [
        ("digits", 1437, 360, (8, 8)),
        ("mnist5k", 4000, 1000, (1, 28, 28)),
        ("synthetic", 8000, 2000, (20,)),
    ],
)
def test_builtin_dataset_has_the_documented_layout(name, n_train, n_test, trailing):
    train, test = load(name)
    check_layout(train, name, trailing, "train")
    check_layout(test, name, trailing, "test")
    assert (train.sizes["sample"], test.sizes["sample"]) == (n_train, n_test)


@pytest.mark.parametrize("name", ["digits", "mnist5k"])
def test_image_datasets_are_scaled_to_unit_interval(name):
    train, _ = load(name)
    assert float(train["x"].min()) == 0.0
    assert float(train["x"].max()) == 1.0


def test_mnist1d_is_generated_cached_and_read_back(cache_dir):
    np_state, py_state = np.random.get_state(), random.getstate()
    train, test = load("mnist1d", n_samples=2000, seed=3)
    check_layout(train, "mnist1d", (40,), "train")
    check_layout(test, "mnist1d", (40,), "test")
    assert (train.sizes["sample"], test.sizes["sample"]) == (1600, 400)

    # make_dataset seeds the global generators; load puts them back
    after = np.random.get_state()
    assert after[0] == np_state[0] and np.array_equal(after[1], np_state[1])
    assert after[2:] == np_state[2:]
    assert random.getstate() == py_state

    path = cache_dir / "mnist1d-2000-3.nc"
    assert sorted(os.listdir(cache_dir)) == [path.name]
    mtime = path.stat().st_mtime_ns
    train2, test2 = load("mnist1d", n_samples=2000, seed=3)
    assert path.stat().st_mtime_ns == mtime
    xr.testing.assert_identical(train, train2)
    xr.testing.assert_identical(test, test2)
    assert train2["x"].chunks is None


def test_mnist1d_rejects_n_samples_not_a_multiple_of_ten():
    with pytest.raises(ValueError, match=r"multiple of 10 .* but got n_samples=2005"):
        load("mnist1d", n_samples=2005)


def test_mnist5k_is_cached(cache_dir):
    first, _ = load("mnist5k", n_samples=50)
    assert (cache_dir / "mnist5k.nc").exists()
    again, _ = load("mnist5k", n_samples=50)
    xr.testing.assert_identical(first, again)


def test_cache_false_writes_nothing(cache_dir):
    load("mnist5k", n_samples=50, cache=False)
    assert os.listdir(cache_dir) == []


def test_seed_fixes_the_shuffle_and_split():
    a, _ = load("digits", seed=1)
    b, _ = load("digits", seed=1)
    c, _ = load("digits", seed=2)
    xr.testing.assert_identical(a, b)
    assert not np.array_equal(a["y"].values, c["y"].values)


def test_synthetic_is_reproducible_and_sized_by_n_samples():
    a_train, a_test = load("synthetic", n_samples=500, seed=4)
    b_train, _ = load("synthetic", n_samples=500, seed=4)
    assert (a_train.sizes["sample"], a_test.sizes["sample"]) == (400, 100)
    xr.testing.assert_identical(a_train, b_train)
    assert set(np.unique(a_train["y"].values)) == set(range(10))


def test_n_samples_keeps_a_subset():
    train, test = load("digits", n_samples=100)
    assert (train.sizes["sample"], test.sizes["sample"]) == (80, 20)


def test_n_samples_larger_than_the_dataset_is_refused():
    with pytest.raises(ValueError, match=r"n_samples for dataset 'digits' should be at most 1797"):
        load("digits", n_samples=5000)


def test_unknown_dataset_name_lists_the_choices():
    assert DATASETS == ("mnist1d", "digits", "mnist5k", "mnist", "cifar10", "synthetic")
    with pytest.raises(
        ValueError, match=r"dataset should be one of 'mnist1d', 'digits', .* but got 'mnsit'"
    ):
        load("mnsit")


def test_root_is_required_for_mnist():
    with pytest.raises(ValueError, match=r"dataset 'mnist' needs root=.*train-images-idx3-ubyte"):
        load("mnist")


def test_root_is_refused_where_unused(tmp_path):
    with pytest.raises(ValueError, match=r"root is only used by .* for dataset 'digits'"):
        load("digits", root=tmp_path)


@pytest.mark.parametrize(("value", "error"), [(-1, ValueError), (1.5, TypeError)])
def test_bad_n_samples_is_refused(value, error):
    with pytest.raises(error, match=r"n_samples should be an integer >= 1"):
        load("synthetic", n_samples=value)


# --- MNIST from IDX files ---------------------------------------------------


def write_idx(path, array: np.ndarray, *, gz: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_dir(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, 20, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (8, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, 8, dtype=np.uint8),
    }
    for key, name in MNIST_FILES.items():
        gz = key == "train_images"  # one file gzipped, as some mirrors ship them
        write_idx(tmp_path / (name + (".gz" if gz else "")), arrays[key], gz=gz)
    return tmp_path, arrays


def test_mnist_is_read_from_idx_files(mnist_dir):
    root, arrays = mnist_dir
    train, test = load("mnist", root=root)
    check_layout(train, "mnist", (1, 28, 28), "train")
    check_layout(test, "mnist", (1, 28, 28), "test")
    np.testing.assert_array_equal(train["x"].values[:, 0], arrays["train_images"] / np.float32(255))
    np.testing.assert_array_equal(train["y"].values, arrays["train_labels"])
    np.testing.assert_array_equal(test["y"].values, arrays["test_labels"])


def test_mnist_n_samples_keeps_the_split_proportion(mnist_dir):
    root, _ = mnist_dir
    train, test = load("mnist", root=root, n_samples=14)
    assert (train.sizes["sample"], test.sizes["sample"]) == (10, 4)


def test_mnist_missing_files_are_listed(mnist_dir):
    root, _ = mnist_dir
    os.remove(root / "t10k-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError, match=r"t10k-labels-idx1-ubyte is not there") as info:
        load("mnist", root=root)
    assert str(root) in str(info.value)


def test_mnist_bad_magic_number_is_refused(mnist_dir):
    root, _ = mnist_dir
    (root / "t10k-labels-idx1-ubyte").write_bytes(b"\x1f\x8b\x08\x00" + bytes(20))
    with pytest.raises(ValueError, match=r"should be an IDX file.*starts with 1f 8b 08 00"):
        load("mnist", root=root)


def test_mnist_truncated_file_is_refused(mnist_dir):
    root, _ = mnist_dir
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match=r"should be \d+ bytes long .* shape \(8, 28, 28\)"):
        load("mnist", root=root)


def test_mnist_labels_out_of_range_are_refused(mnist_dir):
    root, _ = mnist_dir
    write_idx(root / "t10k-labels-idx1-ubyte", np.full(8, 12, np.uint8))
    with pytest.raises(ValueError, match=r"should be in \[0, 10\), but got 12 at sample 0"):
        load("mnist", root=root)


# --- CIFAR-10 from python batches -------------------------------------------


def _py2_str(b: bytes) -> bytes:
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b


def _py2_int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A batch pickled as CIFAR-10's own files are: protocol 2, Python 2, numpy 1.

    Written opcode by opcode: ``pickle.dumps`` on Python 3 cannot produce
    Python 2 byte strings nor ``numpy.core`` global names.
    """
    array = (
        b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
        + _py2_int(0) + b"\x85" + _py2_str(b"b") + b"\x87R"
        + b"(" + _py2_int(1) + _py2_int(data.shape[0]) + _py2_int(data.shape[1]) + b"\x86"
        + b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R"
        + b"(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1) + _py2_int(-1)
        + _py2_int(0) + b"tb"
        + b"\x89" + _py2_str(data.tobytes()) + b"tb"
    )  # fmt: skip
    return (
        b"\x80\x02}("
        + _py2_str(b"batch_label") + _py2_str(b"a batch")
        + _py2_str(b"data") + array
        + _py2_str(b"labels") + b"](" + b"".join(_py2_int(int(v)) for v in labels) + b"e"
        + b"u."
    )  # fmt: skip


def write_cifar(folder, *, protocol: int | None = None, n: int = 3):
    """Write six small batches (n images each) and return their images and labels."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(1)
    batches = {}
    for name in (*CIFAR10_TRAIN, CIFAR10_TEST):
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        if protocol is None:
            raw = py2_batch(data, labels)
        else:
            raw = pickle.dumps({b"data": data, b"labels": labels}, protocol=protocol)
        (folder / name).write_bytes(raw)
        batches[name] = (data, labels)
    return batches


@pytest.mark.parametrize("protocol", [None, 3, pickle.HIGHEST_PROTOCOL])
def test_cifar10_is_read_from_python_batches(tmp_path, protocol):
    batches = write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol)
    train, test = load("cifar10", root=tmp_path)
    check_layout(train, "cifar10", (3, 32, 32), "train")
    check_layout(test, "cifar10", (3, 32, 32), "test")
    assert (train.sizes["sample"], test.sizes["sample"]) == (15, 3)
    data, labels = batches["data_batch_2"]
    expected = data.reshape(-1, 3, 32, 32) / np.float32(255)
    np.testing.assert_array_equal(train["x"].values[3:6], expected)
    np.testing.assert_array_equal(train["y"].values[3:6], labels)
    np.testing.assert_array_equal(test["y"].values, batches[CIFAR10_TEST][1])


def test_cifar10_batches_may_lie_directly_in_root(tmp_path):
    write_cifar(tmp_path)
    train, _ = load("cifar10", root=tmp_path)
    assert train.sizes["sample"] == 15


def test_cifar10_missing_batches_are_listed(tmp_path):
    write_cifar(tmp_path)
    os.remove(tmp_path / "data_batch_4")
    with pytest.raises(FileNotFoundError, match=r"data_batch_4 is missing from") as info:
        load("cifar10", root=tmp_path)
    assert "test_batch" in str(info.value) and str(tmp_path) in str(info.value)


class RunsCode:
    """What a malicious batch holds: unpickling it calls ``func(*args)``."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    ("func", "refused"),
    [(os.system, r"'(posix|nt)\.system'"), (eval, r"'builtins\.eval'")],
)
def test_cifar10_pickle_that_runs_code_is_refused(tmp_path, func, refused):
    write_cifar(tmp_path)
    marker = tmp_path / "code-ran"
    if func is os.system:
        payload = RunsCode(os.system, f"touch {marker}")
    else:
        payload = RunsCode(eval, f"open({str(marker)!r}, 'w').close()")
    evil = {b"data": payload, b"labels": [0]}
    (tmp_path / "data_batch_3").write_bytes(pickle.dumps(evil, protocol=4))
    with pytest.raises(ValueError, match=r"^the CIFAR-10 files in .* could not be read: .*"
                       + refused + r", which daskpri refuses") as info:
        load("cifar10", root=tmp_path)
    assert isinstance(info.value.__cause__, pickle.UnpicklingError)
    assert not marker.exists()


def test_a_truncated_mnist_download_is_a_clear_error(mnist_dir):
    root, _ = mnist_dir
    gz = root / (MNIST_FILES["train_images"] + ".gz")
    gz.write_bytes(gz.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"^the MNIST files in {re.escape(repr(str(root)))} "
                       rf"could not be read: {re.escape(str(gz))}: .*fetch them again\)$"):
        load("mnist", root=root)


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


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_to_store_replaces_an_existing_store(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    to_store(small(n=20), path)
    new = small(n=30)
    to_store(new, path)
    with open_dataset(path) as opened:
        xr.testing.assert_identical(opened.load(), new)
    assert os.listdir(tmp_path) == [path.name]  # no temporary siblings left


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "data.nc"
    to_store(small(n=20), path)
    before = path.read_bytes()
    bad = small(n=2).assign(z=("sample", np.array([object(), object()], dtype=object)))
    with pytest.raises(ValueError, match="unable to infer dtype on variable 'z'"):
        to_store(bad, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["data.nc"]


@pytest.mark.parametrize("name", ["victim", "victim.zarr"])
def test_to_store_refuses_a_directory_that_is_not_a_zarr_store(tmp_path, name):
    victim = tmp_path / name
    victim.mkdir()
    (victim / "important.txt").write_text("keep")
    with pytest.raises(
        ValueError,
        match=rf"path should be a new path, an empty directory or a zarr store to replace, "
        rf"but got path='[^']*{name}', a directory that holds other files",
    ):
        to_store(small(), victim)
    assert (victim / "important.txt").read_text() == "keep"
    assert os.listdir(victim) == ["important.txt"]
    assert os.listdir(tmp_path) == [name]  # nothing written beside it either


def test_to_store_refuses_a_file_where_a_zarr_store_would_go(tmp_path):
    path = tmp_path / "data.zarr"
    path.write_text("keep")
    with pytest.raises(ValueError, match=r"but got path='[^']*data\.zarr', which is a file"):
        to_store(small(), path)
    assert path.read_text() == "keep"
    assert os.listdir(tmp_path) == ["data.zarr"]


def test_to_store_refuses_a_directory_where_a_netcdf_file_would_go(tmp_path):
    path = tmp_path / "data.nc"
    path.mkdir()
    (path / "important.txt").write_text("keep")
    with pytest.raises(
        ValueError,
        match=r"path should be a new path or a netCDF file to replace, "
        r"but got path='[^']*data\.nc', which is a directory",
    ):
        to_store(small(), path)
    assert (path / "important.txt").read_text() == "keep"
    assert os.listdir(tmp_path) == ["data.nc"]


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
