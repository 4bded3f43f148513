"""Open, check and store the ``xarray.Dataset`` that daskpri trains on.

A training dataset has a ``sample`` dimension, features ``x`` with ``sample`` as
their first dimension, and integer labels ``y`` along ``sample``. It comes from
memory, a zarr store or a netCDF file; files are opened lazily, so a worker
that asks for one partition reads only that partition's chunks.
"""

from __future__ import annotations

import os
import shutil
import uuid
from operator import index
from typing import Any

import numpy as np
import xarray as xr

__all__ = ["check_values", "open_dataset", "to_store", "validate_dataset"]

_ZARR_SUFFIXES = (".zarr",)
_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5")
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
        (``.nc``, ``.nc4``, ``.netcdf``, ``.h5``, read with h5netcdf).
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
        If the file's format is not one of those above, or the dataset's
        layout is not that of a training dataset (see `validate_dataset`).

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
    fmt = _format_of(path, name=name)
    if fmt == "zarr":
        # Local stores hold a handful of arrays, so reading their metadata one
        # by one is cheap; consolidated metadata is not part of zarr format 3
        # and asking for it warns on every store that lacks it.
        ds = xr.open_zarr(path, consolidated=False)
    else:
        ds = xr.open_dataset(path, engine="h5netcdf", chunks={})
    validate_dataset(ds, name=name)
    return ds


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
        raise TypeError(f"{name}.y should have an integer dtype, but got {y.dtype}")
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
        If ``x`` holds NaN or infinite values, or a label is out of range. The
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
    new one, never a half-written file. An existing store at ``path`` is
    replaced.

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

    Examples
    --------
    >>> import os, tempfile, numpy as np, xarray as xr
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))})
    >>> path = to_store(ds, os.path.join(tempfile.mkdtemp(), "train.zarr"))
    >>> open_dataset(path).sizes["sample"]
    4
    """
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"ds should be an xarray.Dataset, but got {type(ds).__name__}")
    target = os.path.abspath(os.fspath(path))
    fmt = _format_of(target, name="path")
    parent, base = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    out = ds.copy()
    # Encodings carried over from another format (zarr compressors, netCDF
    # chunksizes) do not apply to the new one; let the writer choose.
    for var in out.variables.values():
        var.encoding = {}
    try:
        if fmt == "zarr":
            out.to_zarr(tmp, mode="w", consolidated=False)
            _replace_dir(tmp, target)
        else:
            out.to_netcdf(tmp, engine="h5netcdf")
            os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    return os.fspath(path)


def _format_of(path: str, *, name: str) -> str:
    lower = path.lower().rstrip("/" + os.sep)
    if lower.endswith(_ZARR_SUFFIXES):
        return "zarr"
    if lower.endswith(_NETCDF_SUFFIXES):
        return "netcdf"
    if os.path.isdir(path):
        return "zarr"
    raise ValueError(f"{name} should be {_FORMATS}, but got {path!r}")


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
