"""Open, check and store the ``xarray.Dataset`` that daskpri trains on.

A training dataset has a ``sample`` dimension, features ``x`` with ``sample`` as
their first dimension, and integer labels ``y`` along ``sample``. It comes from
memory, a zarr store or a netCDF file; files are opened lazily, so a worker
that asks for one partition reads only that partition's chunks.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from operator import index
from typing import Any

import dask.config
import h5py
import numpy as np
import xarray as xr
import zarr.errors

__all__ = [
    "check_destination",
    "check_values",
    "format_of",
    "open_dataset",
    "to_store",
    "validate_dataset",
]

_ZARR_SUFFIXES = (".zarr",)
# Files at the top of a zarr store: format 3, then format 2's group, attributes, array.
_ZARR_METADATA = ("zarr.json", ".zgroup", ".zattrs", ".zarray")
_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5")
# The first four bytes of a netCDF3 file: classic, 64-bit offset, 64-bit data (CDF-5).
_NETCDF3_MAGIC = (b"CDF\x01", b"CDF\x02", b"CDF\x05")
_FORMATS = (
    "a zarr store (a directory, or a path ending in .zarr) "
    "or a netCDF file (.nc, .nc4, .netcdf, .h5)"
)


def open_dataset(source: xr.Dataset | str | os.PathLike[str], *, name: str = "data") -> xr.Dataset:
    """Open ``source`` lazily as a training dataset and check its layout.

    Parameters
    ----------
    source : xarray.Dataset, str or os.PathLike
        A dataset in memory (returned as is once checked), a zarr store
        (a directory, or a path ending in ``.zarr``) or a netCDF file
        (``.nc``, ``.nc4``, ``.netcdf``, ``.h5``). netCDF4 files (HDF5 inside)
        are read with h5netcdf; netCDF3 files (classic, as
        ``Dataset.to_netcdf(path, engine="scipy")`` writes them) with scipy,
        which should then be installed on the workers too.
    name : str, default "data"
        The parameter's name, used in error messages.

    Returns
    -------
    xarray.Dataset
        Backed by the file's chunks where it came from a file: nothing is read
        until a slice of it is loaded.

    Raises
    ------
    TypeError
        If ``source`` is neither a Dataset nor a path.
    FileNotFoundError
        If the path does not exist.
    ValueError
        If the file's format is not one of those above (a netCDF3 file where
        scipy is not installed included), a netCDF4 file keeps values in
        other files (see `check_self_contained`), or the dataset's layout is
        not that of a training dataset (see `validate_dataset`).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))})
    >>> open_dataset(ds) is ds
    True
    """
    if isinstance(source, xr.Dataset):
        validate_dataset(source, name=name)
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"{name} should be an xarray.Dataset or the path of a zarr store or netCDF file, "
            f"but got an object of type {type(source).__name__}"
        )
    path = os.fspath(source)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} names {path!r}, but there is no such file or directory")
    fmt = format_of(path, name=name)
    if fmt == "zarr":
        # Local stores hold a handful of arrays, so reading their metadata one
        # by one is cheap; consolidated metadata is not part of zarr format 3
        # and asking for it warns on every store that lacks it.
        try:
            ds = xr.open_zarr(path, consolidated=False)
        except zarr.errors.NodeNotFoundError:
            raise ValueError(
                f"{name} names {path!r}, which holds no zarr store: no zarr.json or .zgroup "
                f"at its top (write one with daskpri.data.to_store, or xarray's to_zarr)"
            ) from None
    else:
        ds = _open_netcdf(path, name=name)
    validate_dataset(ds, name=name)
    return ds


def _open_netcdf(path: str, *, name: str) -> xr.Dataset:
    """Open the netCDF file at ``path`` lazily with the reader its format needs."""
    if os.path.isdir(path):
        raise ValueError(
            f"{name} should be a netCDF file, since its name ends in a netCDF suffix, but got "
            f"{name}={path!r}, which is a directory"
        )
    if h5py.is_hdf5(path):
        check_self_contained(path, name=name)
        return xr.open_dataset(path, engine="h5netcdf", chunks={})
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
    return xr.open_dataset(path, engine="scipy", chunks={})


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


#: OSErrors about a file itself (missing, forbidden, of the wrong kind): a
#: worker that raises one reading the data's store is not lost, the data is
#: out of its reach, which no retry mends
FILE_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def fingerprint(source: xr.Dataset | str | os.PathLike[str]) -> tuple[Any, ...]:
    """What tells one run's data from another's: its content, not the object.

    An in-memory Dataset by the token of its values (``dask.base.tokenize``:
    a copy of the same data has the same, a Dataset changed in place
    another); a store by its path and the latest change to its files.

    Examples
    --------
    >>> ds = xr.Dataset({"x": ("sample", np.arange(3.0))})
    >>> fingerprint(ds) == fingerprint(ds.copy(deep=True))
    True
    >>> fingerprint(ds) == fingerprint(ds + 1)
    False
    """
    from dask.base import tokenize

    if isinstance(source, xr.Dataset):
        return ("data", tokenize(source))
    path = os.fspath(source)
    stamps = [os.stat(path).st_mtime_ns]
    for root, dirs, files in os.walk(path):  # a zarr store: its arrays' files
        stamps.extend(os.stat(os.path.join(root, f)).st_mtime_ns for f in (*dirs, *files))
    return ("store", path, max(stamps))


def validate_dataset(ds: xr.Dataset, *, name: str = "data") -> dict[str, Any]:
    """Check that ``ds`` is laid out as a training dataset, from metadata only.

    Parameters
    ----------
    ds : xarray.Dataset
        Should have a ``sample`` dimension with at least one sample, a numeric
        variable ``x`` whose first dimension is ``sample``, and an integer
        variable ``y`` with dimensions ``("sample",)``.
    name : str, default "data"
        The parameter's name, used in error messages.

    Returns
    -------
    dict
        ``n_samples`` (int), ``x_shape`` (the trailing shape of ``x``, a
        tuple), ``x_dtype`` (str) and ``n_classes`` (``ds.attrs["n_classes"]``
        as an int, or None when the attribute is absent).

    Raises
    ------
    TypeError
        If ``ds`` is not a Dataset, or ``x`` or ``y`` has the wrong dtype.
        Integer labels stored with a ``_FillValue`` are among them: xarray
        decodes them as floats, and the message says so and how to read
        them as integers. Float labels are refused, not cast: a NaN or a
        fraction among them would otherwise become a wrong class.
    ValueError
        If a dimension or variable is missing or misplaced.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))}, attrs={"n_classes": 4})
    >>> validate_dataset(ds)
    {'n_samples': 4, 'x_shape': (3,), 'x_dtype': 'float32', 'n_classes': 4}
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"{name} should be an xarray.Dataset, but got {type(ds).__name__}")
    if "sample" not in ds.dims:
        raise ValueError(
            f"{name} should have a 'sample' dimension, but got dimensions {tuple(ds.dims)}"
        )
    for var in ("x", "y"):
        if var not in ds.data_vars:
            raise ValueError(
                f"{name} should have a variable {var!r}, but got variables {tuple(ds.data_vars)}"
            )
    x, y = ds["x"], ds["y"]
    n_samples = int(ds.sizes["sample"])
    if x.ndim == 0 or x.dims[0] != "sample":
        raise ValueError(
            f"{name}.x should have 'sample' as its first dimension, but got dims {x.dims}"
        )
    if x.dtype.kind not in "iuf":
        raise TypeError(f"{name}.x should have a numeric dtype, but got {x.dtype}")
    if y.dims != ("sample",):
        got = f"dims {y.dims}"
        if y.ndim == 1:
            got += f" of length {y.size}"
        raise ValueError(
            f"{name}.y should have dims ('sample',), one label for each of the {n_samples} "
            f"samples of {name}.x, but got {got}"
        )
    if y.dtype.kind not in "iu":
        raise TypeError(
            f"{name}.y should have an integer dtype, but got {y.dtype}{_why_not_int(y)}"
        )
    # Within one Dataset xarray already keeps every 'sample' axis the same
    # length; the check stays for Datasets assembled by hand from variables.
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{name}.x and {name}.y should have the same length along 'sample', "
            f"but got {x.shape[0]} and {y.shape[0]}"
        )
    if n_samples < 1:
        raise ValueError(f"{name} should have at least one sample, but got {n_samples}")
    n_classes = ds.attrs.get("n_classes")
    if n_classes is not None:
        n_classes = _positive_int(n_classes, f"{name}.attrs['n_classes']")
    return {
        "n_samples": n_samples,
        "x_shape": tuple(int(s) for s in x.shape[1:]),
        "x_dtype": str(x.dtype),
        "n_classes": n_classes,
    }


def _why_not_int(y: xr.DataArray) -> str:
    """Why a file's integer labels came back as floats, and what to do, or ''."""
    stored = y.encoding.get("dtype")
    fill = y.encoding.get("_FillValue", y.attrs.get("_FillValue"))
    if y.dtype.kind != "f" or fill is None or stored is None or np.dtype(stored).kind not in "iu":
        return ""
    return (
        f": the file stores y as {np.dtype(stored)} with _FillValue={fill}, and xarray "
        "decodes an integer variable that has a _FillValue as floats, so that missing values "
        "can be NaN. Labels should not be missing: write y without a fill value "
        "(encoding={'y': {'_FillValue': None}}), or open the file with "
        "mask_and_scale=False (xarray.open_dataset or xarray.open_zarr) and pass the Dataset"
    )


def check_values(
    x: np.ndarray, y: np.ndarray, *, n_classes: int | None, where: str, offset: int = 0
) -> None:
    """Check loaded features for NaN/inf and labels for the allowed range.

    Meant for one partition once it is in memory: `validate_dataset` checks
    only metadata, so values are checked where they are read.

    Parameters
    ----------
    x : numpy.ndarray
        Features, samples along the first axis.
    y : numpy.ndarray
        Labels, one per sample.
    n_classes : int or None
        Labels should lie in ``[0, n_classes)``; None checks only that none is
        negative.
    where : str
        Where the values come from, for the message, e.g.
        ``"partition 3 (samples 3000-3999)"``.
    offset : int
        Index of the first row in the whole dataset, so messages name the
        sample as the user numbers it.

    Raises
    ------
    ValueError
        If ``x`` holds NaN or infinite values, or values beyond float32's
        range (daskpri trains in float32), or a label is out of range. The
        message gives how many values are bad and the first bad sample's index
        within ``x`` and ``y``.

    Examples
    --------
    >>> import numpy as np
    >>> check_values(np.zeros((2, 3)), np.array([0, 1]), n_classes=2, where="partition 0")
    >>> check_values(np.zeros((2, 3)), np.array([0, 2]), n_classes=2, where="partition 0")
    Traceback (most recent call last):
    ...
    ValueError: y in partition 0 should be in [0, 2), but got 2 at sample 1 (1 bad label)
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype.kind in "fc":
        bad = ~np.isfinite(x)
        n_bad = int(bad.sum())
        if n_bad:
            first = offset + int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
            raise ValueError(
                f"x in {where} should hold finite numbers, but got {n_bad} NaN or infinite "
                f"value{'s' if n_bad != 1 else ''}, the first at sample {first}"
            )
        if x.dtype.itemsize > 4 and x.dtype.kind == "f" and x.size:
            # trained in float32: a larger value becomes infinite there
            big = np.abs(x) > np.finfo(np.float32).max
            if big.any():
                row = int(np.argmax(big.reshape(len(x), -1).any(axis=1)))
                raise ValueError(
                    f"x in {where} should hold numbers float32 can hold (daskpri trains in "
                    f"float32), but got {float(x[big].flat[0]):g} at sample {offset + row}"
                )
    upper = np.inf if n_classes is None else n_classes
    bad = (y < 0) | (y >= upper)
    n_bad = int(bad.sum())
    if n_bad:
        first = int(np.argmax(bad))
        label, first = y[first], first + offset
        allowed = "non-negative" if n_classes is None else f"in [0, {n_classes})"
        raise ValueError(
            f"y in {where} should be {allowed}, but got {label} at sample {first} "
            f"({n_bad} bad label{'s' if n_bad != 1 else ''})"
        )


def to_store(ds: xr.Dataset, path: str | os.PathLike[str]) -> str:
    """Write ``ds`` to a zarr store or a netCDF file, atomically.

    The data is written to a temporary sibling of ``path`` first and then
    renamed into place, so readers see either the old store or the complete
    new one, never a half-written file.

    Only what ``to_store`` could have written is replaced: at a zarr path, an
    existing zarr store (a directory with ``zarr.json``, ``.zgroup``,
    ``.zattrs`` or ``.zarray`` at its top) or an empty directory; at a netCDF
    path, an existing file. Anything else there (a directory of other files,
    a file where a zarr store would go, a directory where a netCDF file would
    go) is left as it is and refused before anything is written.

    Parameters
    ----------
    ds : xarray.Dataset
        What to write. Its chunks, where it has dask chunks, become the zarr
        store's chunks.
    path : str or os.PathLike
        A path ending in ``.zarr`` or an existing directory (zarr), or a path
        ending in ``.nc``, ``.nc4``, ``.netcdf`` or ``.h5`` (netCDF, h5netcdf).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    TypeError
        If ``ds`` is not a Dataset.
    ValueError
        If ``path`` has none of the suffixes above, or something that is not a
        store of that format is in its place.
    OSError
        If the disk cannot take the data (full, over quota, read-only,
        failing): ``could not write 'PATH': No space left on device``, in one
        line, with the error's ``errno`` (``errno.ENOSPC`` there). The
        temporary sibling is removed and what was at ``path`` is left as it
        was.

    Examples
    --------
    >>> import os, tempfile, numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))})
    >>> root = tempfile.mkdtemp()
    >>> path = to_store(ds, os.path.join(root, "train.zarr"))
    >>> open_dataset(path).sizes["sample"]
    4

    A directory that holds something else is not replaced:

    >>> os.mkdir(os.path.join(root, "notes"))
    >>> with open(os.path.join(root, "notes", "todo.txt"), "w") as f:
    ...     _ = f.write("keep me")
    >>> to_store(ds, os.path.join(root, "notes"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: path should be a new path, an empty directory or a zarr store to replace, ...
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"ds should be an xarray.Dataset, but got {type(ds).__name__}")
    target = os.path.abspath(os.fspath(path))
    fmt = check_destination(target, name="path")
    parent, base = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    out = ds.copy()
    # Encodings carried over from another format (zarr compressors, netCDF
    # chunksizes) do not apply to the new one; let the writer choose.
    for var in out.variables.values():
        var.encoding = {}
    try:
        # written by this process: with a Client as Dask's default scheduler,
        # xarray would take a lock of the cluster's for each variable (a round trip
        # to the scheduler), and fail where the scheduler is gone, as the
        # history of a run that lost it is written
        with dask.config.set(scheduler="synchronous"):
            if fmt == "zarr":
                _to_zarr(out, tmp)
            else:
                _to_netcdf(out, tmp)
        # again: something may have taken the path while the data was written
        _check_target(target, fmt, name="path")
        if fmt == "zarr":
            _replace_dir(tmp, target)
        else:
            os.replace(tmp, target)
    except OSError as e:
        _remove(tmp)
        if e.errno not in _DISK_FULL:  # not the disk's (a lazy dataset's source, unread)
            raise
        # the writers' own words name the temporary file, and HDF5's run to
        # several lines with the time and a buffer's address in them
        raise write_error(e, f"could not write {os.fspath(path)!r}") from e
    except BaseException:
        _remove(tmp)
        raise
    remove_stale(parent, lambda name: name.startswith((f".{base}.tmp-", f".{base}.old-")))
    return os.fspath(path)


def remove_stale(directory: str, ours: Callable[[str], bool], age: float = 60.0) -> None:
    """Remove the temporary files (or stores) in ``directory`` left by writes killed midway.

    A write killed (``kill -9``, a power cut) leaves its temporary sibling,
    as large as what it wrote, which no later write reuses. Those whose
    names ``ours`` recognises and which are older than ``age`` seconds go
    once a write has succeeded; a younger one may be another writer's.
    """
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            if not ours(entry.name):
                continue
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                if now - entry.stat(follow_symlinks=False).st_mtime > age:
                    _remove(entry.path)


def _to_zarr(ds: xr.Dataset, path: str) -> None:
    """Write ``ds`` as a zarr store with consolidated metadata.

    Consolidated, so that ``xarray.open_zarr(path)`` with its defaults reads
    it without warning that it fell back to reading each array's metadata.
    zarr 3 warns at writing them in format 3, where they are its extension to
    the specification (xarray and zarr-python read them; a reader that does
    not ignores them): that warning, and only it, is left out here.
    """
    # zarr warns from its own thread: this relies on warning filters being
    # process-wide, as they are unless Python runs with context-aware warnings
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Consolidated metadata is currently not part", category=UserWarning
        )
        ds.to_zarr(path, mode="w", consolidated=True)


#: The errors of a disk that takes no more: full, over quota, a file too large for
#: it, read-only, failing
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
#: netCDF files up to this size are made in memory, then written (see `_to_netcdf`)
_NETCDF_IN_MEMORY = 256 * 2**20
#: room left for what HDF5 adds to a netCDF file's values (its metadata), for `_to_netcdf`
_HDF5_OVERHEAD = 2**20
#: xarray makes netCDF4 files in memory (with h5netcdf) from 2025.8 on
_XARRAY_NETCDF4_BYTES = tuple(int(n) for n in re.findall(r"\d+", xr.__version__)[:2]) >= (2025, 8)


def _to_netcdf(ds: xr.Dataset, path: str) -> None:
    """Write ``ds`` as a netCDF4 file (h5netcdf) at ``path``.

    HDF5 takes a full disk badly: where its metadata cannot be written as
    the file closes, h5py raises "Can't close file", prints an "Exception
    ignored" for each object it frees, and crashes the process (a
    segmentation fault, then or at exit: h5py 3.16, a 67 KiB file on a
    tmpfs with 4 to 64 KiB left, at each 4 KiB step). So the file is made
    in memory and written with Python's own writes, whose full disk is an
    ``OSError`` like any other.
    A dataset larger than ``_NETCDF_IN_MEMORY`` (or an xarray older than
    2025.8, which makes netCDF4 files in memory only with scipy) is written
    by HDF5 itself, once the disk is seen to have room for its values: a
    disk that another writer fills meanwhile can still crash it.
    """
    if _XARRAY_NETCDF4_BYTES and ds.nbytes <= _NETCDF_IN_MEMORY:
        data = ds.to_netcdf(engine="h5netcdf")
        with open(path, "wb") as f:
            f.write(data)
        return
    need = ds.nbytes + _HDF5_OVERHEAD
    if shutil.disk_usage(os.path.dirname(path)).free < need:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    ds.to_netcdf(path, engine="h5netcdf")


def write_error(error: OSError, what: str) -> OSError:
    """``error`` in one line that says what could not be written: ``"{what}: {reason}"``.

    The reason is the error code's standard text where it has one
    ("No space left on device"); the ``errno`` is kept, so the error is of
    the same class (a ``PermissionError`` stays one).

    Examples
    --------
    >>> e = OSError(28, "Can't synchronously write data (file write failed: ...)")
    >>> write_error(e, "could not write 'run.nc'")
    OSError(28, "could not write 'run.nc': No space left on device")
    """
    if error.errno is None:
        return OSError(f"{what}: {(str(error) or type(error).__name__).splitlines()[0]}")
    return OSError(error.errno, f"{what}: {os.strerror(error.errno)}")


def format_of(path: str | os.PathLike[str], *, name: str = "path") -> str:
    """The format of the store at (or to write at) ``path``: ``"zarr"`` or ``"netcdf"``.

    The suffix decides (``.zarr``; ``.nc``, ``.nc4``, ``.netcdf``, ``.h5``);
    a path without one of those is a zarr store if it is a directory. The
    path need not exist, so a caller can check where it will write first.

    Parameters
    ----------
    path : str or os.PathLike
        A zarr store (a directory, or a path ending in ``.zarr``) or a netCDF
        file.
    name : str, default "path"
        The parameter's name, used in error messages.

    Returns
    -------
    str
        ``"zarr"`` or ``"netcdf"``.

    Raises
    ------
    ValueError
        If ``path`` has no known suffix and is not a directory.

    Examples
    --------
    >>> format_of("runs/baseline.zarr"), format_of("runs/baseline.nc")
    ('zarr', 'netcdf')
    >>> format_of("runs/b.csv", name="output")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: output should be a zarr store (...) or a netCDF file (...), but got 'runs/b.csv'
    """
    path = os.fspath(path)
    lower = path.lower().rstrip("/" + os.sep)
    if lower.endswith(_ZARR_SUFFIXES):
        return "zarr"
    if lower.endswith(_NETCDF_SUFFIXES):
        return "netcdf"
    if os.path.isdir(path):
        return "zarr"
    raise ValueError(f"{name} should be {_FORMATS}, but got {path!r}")


def check_destination(path: str | os.PathLike[str], *, name: str = "path") -> str:
    """The format :func:`to_store` would write ``path`` in, once sure it may write there.

    For a caller that checks where its results go before the work that
    makes them (``daskpri train --output``): the suffix should name a
    format, and what is at ``path`` should be something ``to_store``
    replaces (see there). ``name`` names the parameter in errors.

    Examples
    --------
    >>> import os, tempfile
    >>> check_destination(os.path.join(tempfile.mkdtemp(), "run.zarr"))
    'zarr'
    """
    target = os.path.abspath(os.fspath(path))
    fmt = format_of(target, name=name)
    _check_target(target, fmt, name=name)
    return fmt


def _check_target(target: str, fmt: str, *, name: str) -> None:
    """Refuse ``target`` unless a ``fmt`` store written there loses nothing.

    ``fmt`` is ``"zarr"`` or ``"netcdf"`` (see `format_of`). `to_store`
    calls it before it writes anything; a caller that writes only at the end
    of a long computation can call it first too, so that a bad path fails
    before the work rather than after it.
    """
    if fmt == "zarr":
        if os.path.isdir(target):
            if os.listdir(target) and not _is_zarr_store(target):
                raise ValueError(
                    f"{name} should be a new path, an empty directory or a zarr store to "
                    f"replace, but got {name}={target!r}, a directory that holds other files "
                    "(no zarr.json, .zgroup, .zattrs or .zarray at its top); "
                    "choose another path or move its contents away"
                )
        elif os.path.lexists(target):
            raise ValueError(
                f"{name} should be a new path, an empty directory or a zarr store to replace, "
                f"but got {name}={target!r}, which is a file; choose another path or move the "
                "file away"
            )
    elif os.path.isdir(target):
        raise ValueError(
            f"{name} should be a new path or a netCDF file to replace, but got "
            f"{name}={target!r}, which is a directory; choose another path or move the "
            "directory away"
        )


def _is_zarr_store(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, meta)) for meta in _ZARR_METADATA)


def _replace_dir(tmp: str, target: str) -> None:
    """Rename ``tmp`` to ``target``, moving an existing ``target`` aside first.

    ``os.replace`` cannot put a directory over a non-empty one, so the old
    store is renamed to a backup, the new one moved in, and the backup deleted
    only once the new one is in place (or moved back if that fails).
    """
    if not os.path.lexists(target):
        os.replace(tmp, target)
        return
    parent, base = os.path.split(target)
    backup = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex}")
    os.replace(target, backup)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(backup, target)
        raise
    _remove(backup)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _positive_int(value: Any, what: str) -> int:
    try:
        result = index(value)
    except TypeError:
        raise TypeError(f"{what} should be a positive integer, but got {value!r}") from None
    if isinstance(value, bool) or result < 1:
        raise ValueError(f"{what} should be a positive integer, but got {value!r}")
    return int(result)
