"""Built-in datasets and the MNIST/CIFAR-10 readers (opening, storing and checking data
is in test_datasets_stores.py)."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import re
import struct
import threading

import dask.config
import numpy as np
import pytest
import xarray as xr

from daskpri.data import DATASETS, load, validate_dataset
from daskpri.data._readers import CIFAR10_TEST, CIFAR10_TRAIN, MNIST_FILES


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Every test caches into its own directory, never into ~/.cache."""
    path = tmp_path_factory.mktemp("cache")
    with dask.config.set({"daskpri.cache-dir": str(path)}):
        yield path


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


def test_loads_caching_the_same_data_at_once_each_keep_one_cache_without_a_word(cache_dir):
    # two processes (or threads) making the same cache at once: the later write finds the
    # earlier's file in place, which is kept, and neither warns (warnings are errors here)
    said: list[BaseException | None] = []
    for _ in range(3):
        start = threading.Barrier(2)

        def one(start: threading.Barrier = start) -> None:
            start.wait()
            try:
                load("mnist5k")
                said.append(None)
            except BaseException as e:  # (a thread's error, for the assert below)
                said.append(e)

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert os.listdir(cache_dir) == ["mnist5k.nc"]
        cached = load("mnist5k")[0]
        (cache_dir / "mnist5k.nc").unlink()
    assert said == [None] * 6, said
    xr.testing.assert_identical(cached, load("mnist5k", cache=False)[0])


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
