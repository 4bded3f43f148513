"""Data files that point outside themselves, and a damaged or unwritable dataset cache."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import types

import dask.config
import h5py
import numpy as np
import pytest
import xarray as xr

from daskpri import DaskpriWarning
from daskpri.data import load, open_dataset

N = 6


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Every test caches into its own directory, never into ~/.cache."""
    path = tmp_path_factory.mktemp("cache")
    with dask.config.set({"daskpri.cache-dir": str(path)}):
        yield path


# --- HDF5 files whose values live in other files ------------------------------


@pytest.fixture
def secret(tmp_path):
    """A file of the machine that a crafted data file should not reach: N x 3 float32."""
    path = tmp_path / "secret.bin"
    np.arange(N * 3, dtype="<f4").tofile(path)
    return path


@pytest.fixture
def other(tmp_path):
    """Another HDF5 file, with a dataset ``/x`` of the shape daskpri would read."""
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.ones((N, 3), "f4"))
    return path


def write_netcdf(path, make_x=None, group=None):
    """A netCDF4 file built with h5py as xarray writes one: dimension scales, x and y.

    ``make_x(f)`` puts ``x`` in place (a plain dataset by default); ``group``
    moves ``x``'s link into a subgroup of that name, for walks below the root.
    """
    with h5py.File(path, "w") as f:
        for dim, size in (("sample", N), ("feature", 3)):
            f.create_dataset(dim, data=np.arange(size))
            f[dim].make_scale(dim)
        y = f.create_dataset("y", data=np.arange(N) % 2)
        y.dims[0].attach_scale(f["sample"])
        where = f if group is None else f.create_group(group)
        if make_x is None:
            x = where.create_dataset("x", data=np.zeros((N, 3), "f4"))
        else:
            x = make_x(where)
        if isinstance(x, h5py.Dataset):
            x.dims[0].attach_scale(f["sample"])
            x.dims[1].attach_scale(f["feature"])
    return path


def refusal(path, problem: str) -> str:
    return re.escape(
        "data should be a netCDF file that holds all its values itself, with no HDF5 external "
        f"storage, external links or virtual datasets, but in {str(path)!r} {problem} "
        "(where you trust those files, copy the values into a new file with xarray)"
    )


def test_a_netcdf_file_built_with_h5py_opens(tmp_path):
    # the files below differ from this one only in where x's values live
    ds = open_dataset(write_netcdf(tmp_path / "data.nc"))
    assert ds["x"].dims == ("sample", "feature")
    np.testing.assert_array_equal(ds["x"].values, np.zeros((N, 3), "f4"))


def test_a_variable_in_external_raw_files_is_refused(tmp_path, secret):
    def make_x(f):
        return f.create_dataset("x", shape=(N, 3), dtype="<f4", external=[(str(secret), 0, N * 12)])

    path = write_netcdf(tmp_path / "data.nc", make_x)
    with pytest.raises(ValueError, match="^" + refusal(
            path, f"variable 'x' keeps its values in external files {[str(secret)]}") + "$"):
        open_dataset(path)


def test_an_external_link_is_refused(tmp_path, other):
    def make_x(f):
        f["x"] = h5py.ExternalLink(str(other), "/x")

    path = write_netcdf(tmp_path / "data.nc", make_x)
    with pytest.raises(ValueError, match=refusal(
            path, f"variable 'x' is an external link to '/x' in {str(other)!r}")):
        open_dataset(path)


def test_an_external_link_in_a_subgroup_is_refused(tmp_path, other):
    def make_x(g):
        g["x"] = h5py.ExternalLink(str(other), "/x")

    path = write_netcdf(tmp_path / "data.nc", make_x, group="extra")
    with pytest.raises(ValueError, match="variable 'extra/x' is an external link"):
        open_dataset(path)


def test_an_external_link_to_a_missing_file_is_refused(tmp_path):
    def make_x(f):
        f["x"] = h5py.ExternalLink(str(tmp_path / "gone.h5"), "/x")

    path = write_netcdf(tmp_path / "data.nc", make_x)
    with pytest.raises(ValueError, match="variable 'x' is an external link to '/x' in"):
        open_dataset(path)


def test_a_virtual_dataset_is_refused(tmp_path, other):
    def make_x(f):
        layout = h5py.VirtualLayout(shape=(N, 3), dtype="f4")
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(N, 3))
        return f.create_virtual_dataset("x", layout)

    path = write_netcdf(tmp_path / "data.nc", make_x)
    with pytest.raises(ValueError, match=refusal(
            path, f"variable 'x' is a virtual dataset mapped from the files {[str(other)]}")):
        open_dataset(path)


def test_a_soft_link_within_the_file_is_read(tmp_path):
    def make_x(f):
        f.create_dataset("values", data=np.full((N, 3), 2, "f4"))
        f["x"] = h5py.SoftLink("/values")
        return f["x"]

    ds = open_dataset(write_netcdf(tmp_path / "data.nc", make_x))
    np.testing.assert_array_equal(ds["x"].values, np.full((N, 3), 2, "f4"))


def test_a_netcdf_file_another_process_is_writing_is_refused_saying_so(tmp_path):
    import fcntl

    path = str(write_netcdf(tmp_path / "data.nc"))
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as HDF5 locks a file it opens to write
        with pytest.raises(ValueError, match=re.escape(
                f"data names {path!r}, which another process holds open for writing (HDF5 "
                "locks a file while it is open to write), so it may be half-written: train on "
                "it once that process has closed it")):
            open_dataset(path)
    finally:
        os.close(fd)
    assert open_dataset(path).sizes["sample"] == N  # once closed


def test_a_netcdf_file_cut_short_is_refused_as_such_naming_it(tmp_path):
    path = write_netcdf(tmp_path / "data.nc")
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a copy that did not finish
    with pytest.raises(ValueError, match="^" + re.escape(
            f"data names {str(path)!r}, an HDF5 (netCDF4) file that cannot be read, cut short "
            "or damaged (a copy or a write that did not finish?): Unable to synchronously open "
            "file (truncated file: ")):
        open_dataset(str(path))


# --- zarr stores with links that lead out of them ---------------------------------


def zarr_store(path):
    """A zarr store of N samples, its ``x`` in one uncompressed chunk file: that file's path."""
    ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((N, 3), "<f4")),
                     "y": ("sample", np.arange(N))})
    ds.to_zarr(path, encoding={"x": {"compressors": None}}, consolidated=False)
    [chunk] = [os.path.join(root, f) for root, _, files in os.walk(path / "x")
               for f in files if f != "zarr.json"]
    return chunk


def test_a_zarr_chunk_linked_out_of_the_store_is_refused(tmp_path, secret):
    from daskpri.training._checks import open_data

    store = tmp_path / "data.zarr"
    chunk = zarr_store(store)
    os.remove(chunk)
    os.symlink(secret, chunk)
    message = re.escape(
        f"data should be a zarr store whose files are its own, but in {str(store)!r} the link "
        f"{os.path.relpath(chunk, store)!r} leads out of it, to {str(secret)!r} (a store you "
        "trust: dask.config.set({'daskpri.data.follow-outside-links': True}))")
    with pytest.raises(ValueError, match=f"^{message}$"):
        open_dataset(store)
    with pytest.raises(ValueError, match=message):  # a fit's data, on the driver
        open_data(str(store), None)
    # trusted: followed, and the other file's bytes are what is read
    with dask.config.set({"daskpri.data.follow-outside-links": True}):
        x = open_dataset(store)["x"].values
    np.testing.assert_array_equal(x, np.fromfile(secret, "<f4").reshape(N, 3))
    # a worker reading a store the driver checked does not look again
    np.testing.assert_array_equal(open_dataset(store, check_links=False)["x"].values, x)


def test_links_within_a_zarr_store_and_a_linked_store_are_read(tmp_path):
    store = tmp_path / "data.zarr"
    chunk = zarr_store(store)
    os.rename(chunk, store / "x" / "spare")
    os.symlink(store / "x" / "spare", chunk)  # within the store
    linked = tmp_path / "linked.zarr"
    os.symlink(store, linked)  # the store itself a link
    for path in (store, linked):
        assert open_dataset(path)["x"].values.shape == (N, 3)


# --- the dataset cache ------------------------------------------------------


def fresh() -> tuple[xr.Dataset, xr.Dataset]:
    return load("mnist5k", n_samples=50, cache=False)


def damage_garbage(path):
    path.write_bytes(b"not a netCDF file at all\n" * 10)


def damage_truncated(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damage_empty(path):
    path.write_bytes(b"")


def damage_values(path):
    # the file's structure intact, some of its values not: what a crash can
    # leave where the data had not reached the disk
    with h5py.File(path, "r+") as f:
        f["x"][:10] = 0


@pytest.mark.parametrize(
    "damage", [damage_garbage, damage_truncated, damage_empty, damage_values],
    ids=["garbage", "truncated", "empty", "values"],
)
def test_a_damaged_cache_is_rebuilt_with_a_warning(cache_dir, damage):
    load("mnist5k", n_samples=50)
    path = cache_dir / "mnist5k.nc"
    damage(path)
    with pytest.warns(DaskpriWarning, match=re.escape(
            f"the dataset cache at {path} was damaged (") + r".+\) and was rebuilt$"):
        train, test = load("mnist5k", n_samples=50)
    expected = fresh()
    xr.testing.assert_identical(train, expected[0])
    xr.testing.assert_identical(test, expected[1])
    again, _ = load("mnist5k", n_samples=50)  # the rebuilt cache is read without a warning
    xr.testing.assert_identical(again, expected[0])


def test_a_cache_without_a_checksum_is_rebuilt_silently(cache_dir):
    path = cache_dir / "mnist5k.nc"
    load("mnist5k", n_samples=50)
    with h5py.File(path, "r+") as f:  # as an earlier daskpri wrote it
        del f.attrs["daskpri_sha256"]
    train, _ = load("mnist5k", n_samples=50)
    xr.testing.assert_identical(train, fresh()[0])
    with h5py.File(path, "r") as f:
        assert "daskpri_sha256" in f.attrs


def test_an_unwritable_cache_directory_loads_without_caching(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    where = blocker / "cache"  # cannot be made, even by root
    with (
        dask.config.set({"daskpri.cache-dir": str(where)}),
        pytest.warns(DaskpriWarning, match=re.escape(
            f"the dataset could not be cached at {where / 'mnist5k.nc'} (") + r".*Not a directory\)"
            r", so it is made again at each load: set daskpri.cache-dir to a writable directory, "
            r"or pass cache=False$"),
    ):
        train, _ = load("mnist5k", n_samples=50)
    xr.testing.assert_identical(train, fresh()[0])
    assert sorted(os.listdir(tmp_path)) == ["a-file"]


def test_a_disk_without_room_for_the_cache_is_not_written_to(cache_dir, monkeypatch):
    # A real full disk cannot be had in a test: its free space is what is faked.
    # A write that ran out of room midway could crash the process (h5py/h5py#914).
    full = types.SimpleNamespace(total=10**9, used=10**9 - 4096, free=4096)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: full)
    with pytest.warns(DaskpriWarning, match=re.escape(
            f"the dataset could not be cached at {cache_dir / 'mnist5k.nc'} (the disk has "
            "0.0 MiB free and the cache needs about 4.8), so it is made again at each load")):
        train, _ = load("mnist5k", n_samples=50)
    monkeypatch.undo()
    xr.testing.assert_identical(train, fresh()[0])
    assert os.listdir(cache_dir) == []


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_cache_write_killed_midway_leaves_no_file_under_the_cache_name(cache_dir):
    # The child may write 100 kB per file: the cache (3.9 MB) passes it and the
    # kernel kills the child with SIGXFSZ (which Python ignores unless told
    # otherwise), midway through writing.
    script = textwrap.dedent(f"""
        import resource, signal
        import dask.config
        from daskpri.data import load
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        with dask.config.set({{"daskpri.cache-dir": {str(cache_dir)!r}}}):
            load("mnist5k", n_samples=50)
    """)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGXFSZ, proc.stderr.decode()[-2000:]
    assert not (cache_dir / "mnist5k.nc").exists()
    assert [p.name for p in cache_dir.iterdir()] != []  # the temporary file it was writing
    train, _ = load("mnist5k", n_samples=50)  # no warning: there is no damaged cache to find
    xr.testing.assert_identical(train, fresh()[0])
    assert (cache_dir / "mnist5k.nc").exists()
