"""Open and check the ``xarray.Dataset`` that daskpri trains on.

A training dataset has a ``sample`` dimension, features ``x`` along it (its
first dimension once opened: ``x`` is transposed so), and integer labels ``y``
along ``sample`` (whole-number floats are taken, cast to int64). It comes from
memory, a zarr store or a netCDF file; files are opened lazily, so a worker
that asks for one partition reads only that partition's chunks. Writing one
(:func:`to_store`, :func:`check_destination`, also importable from here) is
:mod:`daskpri.data.store`'s.
"""

from __future__ import annotations

import os
from operator import index
from typing import Any

import h5py
import numpy as np
import xarray as xr
import zarr.errors

from daskpri import _config
from daskpri.data._formats import format_of
from daskpri.data._layout import (
    as_training,
    hint_labels,
    hint_missing,
    hint_sample,
    hint_y_dims,
)
from daskpri.data._netcdf import _open_netcdf, _unreadable, check_self_contained
from daskpri.data.store import check_destination, to_store

__all__ = [
    "check_destination",
    "check_chunks_present",
    "check_labels",
    "check_self_contained",
    "check_values",
    "format_of",
    "open_dataset",
    "to_store",
    "validate_dataset",
]

def open_dataset(
    source: xr.Dataset | str | os.PathLike[str], *, name: str = "data", check_links: bool = True,
    check_chunks: bool = True, labels: bool = True,
) -> xr.Dataset:
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
    check_links : bool, default True
        Refuse a zarr store with symbolic links that lead out of it (see
        `check_links_inside`), unless ``daskpri.data.follow-outside-links``
        is true. A worker reading a store the driver checked passes False.
    check_chunks : bool, default True
        Refuse a zarr store that lacks chunks of ``x`` (see
        `check_chunks_present`). A worker reading a store the driver checked
        passes False.
    labels : bool, default True
        Whether ``y`` is needed; False opens data to predict on, whose ``y``,
        if any, is left as it is (see `validate_dataset`).

    Returns
    -------
    xarray.Dataset
        Backed by the file's chunks where it came from a file: nothing is read
        until a slice of it is loaded. Laid out as daskpri trains on it: ``x``
        transposed where ``sample`` is not its first dimension, labels of a
        float or bool dtype cast to int64, each float checked to be a whole
        number where it is read (a Dataset that needs neither is returned
        as is).

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
        validate_dataset(source, name=name, labels=labels)
        return as_training(source if labels else source[["x"]], name=name)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"{name} should be an xarray.Dataset or the path of a zarr store or netCDF file, "
            f"but got an object of type {type(source).__name__}{_hint_type(source)}"
        )
    path = os.fspath(source)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} names {path!r}, but there is no such file or directory")
    fmt = format_of(path, name=name)
    if fmt == "zarr":
        if check_links and not _config.get_bool("data.follow-outside-links"):
            check_links_inside(path, name=name)
        # Local stores hold a handful of arrays, so reading their metadata one
        # by one is cheap; consolidated metadata is not part of zarr format 3
        # and asking for it warns on every store that lacks it.
        try:
            ds = xr.open_zarr(path, consolidated=False)
        except zarr.errors.NodeNotFoundError:
            if os.path.isfile(os.path.join(path, ".zarray")):  # an array of zarr format 2
                raise ValueError(_not_a_dataset(name, path, array=True)) from None
            raise ValueError(
                f"{name} names {path!r}, which holds no zarr store: no zarr.json or .zgroup "
                f"at its top (write one with daskpri.data.to_store, or xarray's to_zarr)"
            ) from None
        except (zarr.errors.ContainsArrayError, KeyError) as e:
            # an array at the top, or arrays that zarr-python wrote without the dimension
            # names xarray reads (KeyError: "Zarr object is missing the `dimension_names`")
            if isinstance(e, KeyError) and "dimension" not in str(e):
                raise ValueError(_unreadable(name, path, "a zarr store", e)) from None
            array = isinstance(e, zarr.errors.ContainsArrayError)
            raise ValueError(_not_a_dataset(name, path, array=array)) from None
        except (ValueError, TypeError) as e:  # its metadata: not JSON, or not zarr's
            raise ValueError(_unreadable(name, path, "a zarr store", e)) from None
    else:
        ds = _open_netcdf(path, name=name)
    if not ds.data_vars:
        _check_not_in_groups(path, fmt, name=name)
    validate_dataset(ds, name=name, labels=labels)
    if fmt == "zarr" and check_chunks:
        check_chunks_present(path, name=name)
    return as_training(ds if labels else ds[["x"]], name=name)


def check_chunks_present(path: str, *, name: str = "data") -> None:
    """Refuse the zarr store at ``path`` if chunks of its ``x`` are missing.

    zarr reads a chunk that is not in the store as the array's fill value,
    so a store copied in part, or written by a writer that stopped midway,
    would train on NaN (refused only where a worker loads the partition,
    as if the data held them) or on zeros, silently. Listing the chunks'
    keys is cheap (a directory listing, no chunk read).

    ``x`` alone: zarr leaves out a chunk that is all fill value as it
    writes (its ``write_empty_chunks``, off by default), and labels of one
    class in a chunk (the fill value of integers is 0) are a store's own,
    not a loss; features that are all the fill value across a whole chunk
    are not data to train on. `to_store` writes every chunk.

    Examples
    --------
    >>> import os, shutil, tempfile, numpy as np, xarray as xr
    >>> from daskpri.data.store import to_store
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.ones((4, 3), "float32")),
    ...                  "y": ("sample", np.arange(4))}).chunk({"sample": 2})
    >>> path = to_store(ds, os.path.join(tempfile.mkdtemp(), "train.zarr"))
    >>> check_chunks_present(path)
    >>> shutil.rmtree(os.path.join(path, "x", "c", "1"))
    >>> check_chunks_present(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: data should be a zarr store that holds every chunk of its arrays, but '...' \
lacks 1 of the 2 chunks of 'x' (the first: 'x/c/1/0'), which zarr would read as its fill value \
(nan): ...
    """
    array = zarr.open_group(path, mode="r").get("x")
    if not isinstance(array, zarr.Array):
        return  # (validate_dataset has said what it lacks)
    # the keys each chunk (each shard, where the array has shards) is stored under, against
    # those of the store's files: zarr's own count (nchunks_initialized) looks each up in
    # a list, 3.6 s for 20,000 chunks (zarr 3.1), where this takes 0.5 s, the listing's
    stored = _files_under(os.path.join(path, array.path))
    grid = [-(-size // step) for size, step in zip(array.shape, array.shards or array.chunks,
                                                   strict=True)]
    keys = [array.metadata.encode_chunk_key(at) for at in np.ndindex(*grid)]
    missing = [key for key in keys if key not in stored]
    if missing:
        raise ValueError(
            f"{name} should be a zarr store that holds every chunk of its arrays, but "
            f"{path!r} lacks {len(missing)} of the {len(keys)} chunks of 'x' (the first: "
            f"{'x/' + missing[0]!r}), which zarr would read as its fill value "
            f"({np.asarray(array.fill_value).item()!r}): a store copied in part, or written "
            "by a writer that stopped midway (or that left out chunks all of the fill value, "
            "as zarr does unless told write_empty_chunks=True); copy or write it again whole "
            "(daskpri.data.to_store writes every chunk)"
        )


def _files_under(top: str) -> set[str]:
    """The files under the directory ``top``, by their paths from it joined with ``/``.

    Directories that are links are followed, as zarr reads through them,
    each target once (a link back up is not followed round and round).
    """
    found: set[str] = set()
    followed: set[str] = set()  # the targets of the links to directories followed
    todo = [(top, "")]
    while todo:
        here, key = todo.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                if not entry.is_dir():
                    found.add(key + entry.name)
                    continue
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if target in followed:
                        continue
                    followed.add(target)
                todo.append((entry.path, f"{key}{entry.name}/"))
    return found


def _check_not_in_groups(path: str, fmt: str, *, name: str) -> None:
    """Refuse a file whose top holds no variable but which has groups (of a split each, say).

    daskpri reads the variables at a file's top; without this, such a file
    would be refused for lacking a 'sample' dimension, with advice to rename
    one it does not have.
    """
    if fmt == "zarr":
        groups = sorted(zarr.open_group(path, mode="r").group_keys())
        opened = "xr.open_zarr({!r}, group={!r})"
    elif h5py.is_hdf5(path):
        with h5py.File(path, "r") as f:
            groups = sorted(k for k in f if f.get(k, getclass=True) is h5py.Group)
        opened = "xr.open_dataset({!r}, group={!r}, chunks={{}})"
    else:  # netCDF3 has no groups
        return
    if groups:
        pick = next((g for g in groups if "train" in g.lower()), groups[0])
        raise ValueError(
            f"{name} should hold its variables at the top of {path!r}, where daskpri reads "
            f"them, but its top holds none, and it has the groups {groups}: write the one "
            f"to train on to a store of its own (daskpri.data.to_store("
            f"{opened.format(path, pick)}, 'train.zarr')), or pass it opened as a Dataset"
        )


def _not_a_dataset(name: str, path: str, *, array: bool) -> str:
    """Why the zarr store at ``path``, of a single array or of arrays without dimension
    names (as zarr-python writes them), is refused, and how to write it so."""
    what = ("a single array, not a group of arrays 'x' and 'y'" if array else
            "arrays without the dimension names xarray reads (as zarr-python writes them)")
    return (
        f"{name} should be a zarr store of an xarray.Dataset, with the arrays 'x' and 'y' "
        f"along a dimension 'sample', but {path!r} holds {what}: build the Dataset and write "
        "it with xarray, daskpri.data.to_store(xr.Dataset({'x': (('sample', 'feature'), x), "
        "'y': ('sample', y)}), 'train.zarr')"
    )


def _hint_type(source: Any) -> str:
    if isinstance(source, xr.DataArray):
        return (
            ": a DataArray holds the features alone; put them and the labels in one Dataset, "
            "as 'x' and 'y' along 'sample': xr.Dataset({'x': features, 'y': labels})"
        )
    arrays = isinstance(source, np.ndarray) or (
        isinstance(source, (tuple, list)) and len(source) == 2
        and all(isinstance(a, np.ndarray) for a in source))
    if arrays or type(source).__name__ == "DataFrame":  # (x, y), as scikit-learn takes them
        return (
            ": put the features and the labels in one Dataset, as 'x' and 'y' along "
            "'sample': xr.Dataset({'x': (('sample', 'feature'), x), 'y': ('sample', y)})"
            + (" (from a DataFrame, x = df[features].to_numpy(), y = df[label].to_numpy())"
               if not arrays else "")
        )
    return ""


def check_links_inside(path: str, *, name: str = "data") -> None:
    """Refuse the zarr store at ``path`` if a symbolic link in it leads out of it.

    zarr reads a chunk through a link like any file, so a crafted store
    could hand training (and the model's weights) the bytes of any file of
    the machine, as HDF5's external storage could (`check_self_contained`).
    Links within the store, and a store that is itself a link, are read.

    Examples
    --------
    >>> import os, tempfile
    >>> store = os.path.join(tempfile.mkdtemp(), "data.zarr")
    >>> os.makedirs(os.path.join(store, "x", "c"))
    >>> secret = os.path.join(tempfile.mkdtemp(), "secret.txt")
    >>> os.symlink(secret, os.path.join(store, "x", "c", "0"))
    >>> check_links_inside(store)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: data should be a zarr store whose files are its own, but in '...data.zarr' \
the link 'x/c/0' leads out of it, to '...secret.txt' (a store you trust: ...)
    """
    top = os.path.realpath(path)
    for root, dirs, files in os.walk(path):  # links to directories are not walked into
        for entry in (*dirs, *files):
            link = os.path.join(root, entry)
            if not os.path.islink(link):
                continue
            target = os.path.realpath(link)
            if os.path.commonpath([top, target]) != top:
                raise ValueError(
                    f"{name} should be a zarr store whose files are its own, but in {path!r} "
                    f"the link {os.path.relpath(link, path)!r} leads out of it, to {target!r} "
                    "(a store you trust: dask.config.set({'daskpri.data.follow-outside-links': "
                    "True}))"
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


def validate_dataset(
    ds: xr.Dataset, *, name: str = "data", labels: bool = True
) -> dict[str, Any]:
    """Check that ``ds`` is laid out as a training dataset, from metadata only.

    Parameters
    ----------
    ds : xarray.Dataset
        Should have a ``sample`` dimension with at least one sample, a
        variable ``x`` of integers or floats along ``sample`` (in any place:
        `open_dataset` transposes it to come first), and a variable ``y``
        with dimensions ``("sample",)`` of integers, or of floats or bools
        that `open_dataset` casts to int64 (each float checked to be a whole
        number where it is read).
    name : str, default "data"
        The parameter's name, used in error messages.
    labels : bool, default True
        Whether ``y`` is checked; False checks ``x`` alone (data to
        predict on).

    Returns
    -------
    dict
        ``n_samples`` (int), ``x_shape`` (the shape of one sample of ``x``,
        its dimensions other than ``sample`` in their order, a tuple),
        ``x_dtype`` (str) and ``n_classes`` (``ds.attrs["n_classes"]`` as an
        int, or None when the attribute is absent).

    Raises
    ------
    TypeError
        If ``ds`` is not a Dataset, or ``x`` or ``y`` has the wrong dtype
        (labels that are names or categories: the message says how to
        number them).
    ValueError
        If a dimension or variable is missing or misplaced; the message says
        how to rename or reshape it.

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
            + hint_sample(ds)
        )
    for var in ("x", "y") if labels else ("x",):
        if var not in ds.data_vars:
            raise ValueError(
                f"{name} should have a variable {var!r}, but got variables {tuple(ds.data_vars)}"
                + hint_missing(ds, var)
            )
    x = ds["x"]
    n_samples = int(ds.sizes["sample"])
    if "sample" not in x.dims:
        raise ValueError(f"{name}.x should have a 'sample' dimension, but got dims {x.dims}")
    if x.dims[0] != "sample":  # open_dataset transposes it so, lazily
        x = x.transpose("sample", ...)
    if x.dtype.kind not in "iuf":
        raise TypeError(
            f"{name}.x should have an integer or float dtype, but got {x.dtype}"
            + ("; ds['x'] = ds['x'].astype('float32')" if x.dtype.kind == "b" else "")
        )
    if labels:
        _validate_labels(ds["y"], x, n_samples, name)
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


def _validate_labels(y: xr.DataArray, x: xr.DataArray, n_samples: int, name: str) -> None:
    """`validate_dataset`'s checks of ``y`` (``x`` with ``sample`` first)."""
    if y.dims != ("sample",):
        got = f"dims {y.dims}"
        if y.ndim == 1:
            got += f" of length {y.size}"
        raise ValueError(
            f"{name}.y should have dims ('sample',), one label for each of the {n_samples} "
            f"samples of {name}.x, but got {got}{hint_y_dims(y)}"
        )
    if y.dtype.kind not in "iufb":
        raise TypeError(
            f"{name}.y should have an integer dtype (or floats that are whole numbers), but "
            f"got {y.dtype}{hint_labels(y)}"
        )
    # Within one Dataset xarray already keeps every 'sample' axis the same
    # length; the check stays for Datasets assembled by hand from variables.
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{name}.x and {name}.y should have the same length along 'sample', "
            f"but got {x.shape[0]} and {y.shape[0]}"
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
    check_labels(y, n_classes=n_classes, where=where, offset=offset)


def check_labels(y: np.ndarray, *, n_classes: int | None, where: str, offset: int = 0) -> None:
    """Check labels for the allowed range, as :func:`check_values` does.

    Examples
    --------
    >>> import numpy as np
    >>> check_labels(np.array([0, -1, -2]), n_classes=None, where="data")
    Traceback (most recent call last):
    ...
    ValueError: y in data should be non-negative, but got -1 at sample 1 (2 bad labels)
    """
    upper = np.inf if n_classes is None else n_classes
    y = np.asarray(y)
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


def _positive_int(value: Any, what: str) -> int:
    try:
        result = index(value)
    except TypeError:
        raise TypeError(f"{what} should be a positive integer, but got {value!r}") from None
    if isinstance(value, bool) or result < 1:
        raise ValueError(f"{what} should be a positive integer, but got {value!r}")
    return int(result)
