"""Open a netCDF file lazily with the reader its format needs, and refuse what it should not read.

netCDF4 files (HDF5 inside) are read with h5netcdf, once checked to hold
all their values themselves (:func:`check_self_contained`); netCDF3 files
with scipy. A file another process is writing, or one cut short, is refused
in a ``ValueError`` that names it. :func:`daskpri.data.io.open_dataset`
calls these.
"""

from __future__ import annotations

import importlib
import os

import h5py
import xarray as xr

# The first four bytes of a netCDF3 file: classic, 64-bit offset, 64-bit data (CDF-5).
_NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")


def _unreadable(name: str, path: str, kind: str, error: Exception) -> str:
    """Why ``path``, ``kind`` (``"a zarr store"``) whose reader failed on it, is refused."""
    why = " ".join(str(error).split()) or "no reason given"
    return (f"{name} names {path!r}, {kind} that cannot be read, damaged or cut short (a copy "
            f"or a write that did not finish?): {type(error).__name__}: {why}")


def _open_netcdf(path: str, *, name: str) -> xr.Dataset:
    """Open the netCDF file at ``path`` lazily with the reader its format needs."""
    if os.path.isdir(path):
        raise ValueError(
            f"{name} should be a netCDF file, since its name ends in a netCDF suffix, but got "
            f"{name}={path!r}, which is a directory"
        )
    if h5py.is_hdf5(path):
        try:
            check_self_contained(path, name=name)
            # phony_dims: the dimensions h5netcdf names for an HDF5 file that is not netCDF
            # (h5py's); given, as its default, so that it does not warn that it changed
            return xr.open_dataset(path, engine="h5netcdf", chunks={}, phony_dims="access")
        except OSError as e:
            if _held_for_writing(e):
                raise ValueError(_being_written(name, path)) from None
            if e.errno is not None:  # the file system's (a permission): as it is
                raise
            # h5py's, on a file it cannot make sense of: a file cut short, or damaged
            raise ValueError(
                f"{name} names {path!r}, an HDF5 (netCDF4) file that cannot be read, cut "
                f"short or damaged (a copy or a write that did not finish?): "
                f"{str(e).splitlines()[0]}"
            ) from None
    with open(path, "rb") as f:
        head = f.read(4)
    if head not in _NETCDF3_MAGIC:
        raise ValueError(
            f"{name} should be a netCDF4 file (HDF5 inside) or a netCDF3 file, but {path!r} "
            f"is neither: it starts with the bytes {head.hex(' ') or 'nothing'}"
        )
    try:
        # scipy is not a dependency of daskpri: only netCDF3 files need it
        importlib.import_module("scipy.io")
    except ImportError:
        raise ValueError(
            f"{name} names {path!r}, a netCDF3 file, which daskpri reads with scipy, but scipy "
            "is not installed; install scipy, or write the data as netCDF4 "
            "(Dataset.to_netcdf(path, engine='h5netcdf')) or as a zarr store"
        ) from None
    try:
        return xr.open_dataset(path, engine="scipy", chunks={})
    except (ValueError, TypeError, KeyError, IndexError) as e:  # scipy's, on a damaged file
        raise ValueError(_unreadable(name, path, "a netCDF3 file", e)) from None


def _held_for_writing(error: OSError) -> bool:
    """Whether ``error`` is HDF5's refusal of a file that another process holds open to write.

    HDF5 locks a file as it opens it (shared to read, exclusive to write),
    and h5py raises ``BlockingIOError`` where the lock is taken.
    """
    return isinstance(error, BlockingIOError) or "unable to lock file" in str(error)


def _being_written(name: str, path: str) -> str:
    """Why the netCDF file ``path`` that another process holds open to write is refused."""
    return (
        f"{name} names {path!r}, which another process holds open for writing (HDF5 locks a "
        "file while it is open to write), so it may be half-written: train on it once that "
        "process has closed it (a to_netcdf under way, or an h5py.File or netCDF4.Dataset "
        "opened with mode 'a' or 'w')"
    )


def check_self_contained(path: str, *, name: str = "data") -> None:
    """Refuse the HDF5 (netCDF4) file at ``path`` if reading it would read other files.

    HDF5 lets a dataset keep its values in raw files the file names
    (external storage), a link point into another file (an external link),
    and a dataset be assembled from datasets of other files (a virtual
    dataset). None of these is netCDF, and a crafted file could use them to
    make daskpri, on the driver or on a worker, read any file of the machine
    and hand its bytes to training. Every link below the root is looked at,
    from the file's metadata alone; no values are read.

    Parameters
    ----------
    path : str
        An HDF5 file.
    name : str, default "data"
        The parameter's name, used in error messages.

    Raises
    ------
    ValueError
        If a link is an external or user-defined one, or a dataset has
        external storage or is virtual.

    Examples
    --------
    >>> import os, tempfile, numpy as np, xarray as xr
    >>> from daskpri.data import to_store
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))})
    >>> path = to_store(ds, os.path.join(tempfile.mkdtemp(), "train.nc"))
    >>> check_self_contained(path)
    """
    with h5py.File(path, "r") as f:

        def why_not(raw: bytes) -> str | None:
            # H5Lvisit reaches groups through hard links only, each once, so
            # neither a cycle nor a link into another file is followed here.
            var = raw.decode("utf-8", "replace")
            kind = f.id.links.get_info(raw).type
            if kind == h5py.h5l.TYPE_SOFT:  # a path within this file, walked in its own place
                return None
            if kind == h5py.h5l.TYPE_EXTERNAL:
                file, target = (b.decode("utf-8", "replace") for b in f.id.links.get_val(raw))
                return f"variable {var!r} is an external link to {target!r} in {file!r}"
            if kind != h5py.h5l.TYPE_HARD:
                return f"entry {var!r} is a user-defined HDF5 link (link type {kind})"
            obj = f[raw]
            if not isinstance(obj, h5py.Dataset):
                return None
            if obj.external:
                files = sorted({entry[0] for entry in obj.external})
                return f"variable {var!r} keeps its values in external files {files}"
            if obj.is_virtual:
                files = sorted({source.file_name for source in obj.virtual_sources()})
                return f"variable {var!r} is a virtual dataset mapped from the files {files}"
            return None

        problem = f.id.links.visit(why_not)
    if problem is not None:
        raise ValueError(
            f"{name} should be a netCDF file that holds all its values itself, with no HDF5 "
            f"external storage, external links or virtual datasets, but in {path!r} {problem} "
            "(where you trust those files, copy the values into a new file with xarray)"
        )
