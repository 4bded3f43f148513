"""A training dataset's fingerprint: what tells its data from other data of the same shape.

A checkpoint keeps the fingerprint of the data its run trained on, and a
resumed run compares it with the data it is given: a run resumed on other
data (another split, another seed's synthetic set, a store rewritten since)
of the same shape and sample count would otherwise go on as if nothing had
changed, its priorities and selections those of samples it no longer has.

The fingerprint is cheap for a store of any size: the dtypes and shapes of
``x`` and ``y`` (metadata) and a digest of their values at a few samples
spread over the data, :data:`N_ROWS` at most, so that a store is read at as
many chunks, never whole. It is of the data as daskpri trains on it (after
:func:`~daskpri.data._layout.as_training`), not of its files: the same data
in a zarr store, a netCDF file or memory has the same fingerprint. It is a
dict of strings, as a checkpoint read weights-only holds it. (Not
:func:`daskpri.data.io.fingerprint`, which tells a trainer's next fit whether
its data is the last fit's, a store by its path and files' times.)
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import xarray as xr

from daskpri.data._persisted import driver_scheduler

#: the samples whose values a fingerprint digests: enough that other data is
#: all but sure to differ at one of them, few enough that a store is read at
#: as many chunks
N_ROWS = 8

#: the keys of a fingerprint, each a str
KEYS = ("x", "y", "x_rows", "y_rows")

#: the digest of values the driver could not read (a damaged chunk): the
#: workers that read them refuse the store, naming the partition and the
#: store, and a comparison leaves them out
UNREAD = "unread"


def sampled_rows(n: int) -> np.ndarray:
    """The samples, of ``n``, whose values a fingerprint digests: the first, the last, between.

    Examples
    --------
    >>> sampled_rows(800).tolist()
    [0, 114, 228, 342, 457, 571, 685, 799]
    >>> sampled_rows(3).tolist()
    [0, 1, 2]
    """
    return np.unique(np.linspace(0, n - 1, min(n, N_ROWS)).round().astype(np.int64))


def _digest(values: np.ndarray) -> str:
    """A digest of ``values``' dtype, shape and bytes (little-endian, whatever the machine)."""
    values = np.ascontiguousarray(values)
    values = values.astype(values.dtype.newbyteorder("<"), copy=False)
    h = hashlib.sha256(f"{values.dtype.str} {values.shape}".encode())
    h.update(values.tobytes())
    return h.hexdigest()[:32]


def data_fingerprint(ds: xr.Dataset) -> dict[str, str]:
    """The fingerprint of ``ds``, a training dataset as :func:`~daskpri.data.io.open_dataset` gives.

    Only ``x`` and ``y`` count, the variables a run trains on: another
    variable of the store (an id, a note) may change without the data
    becoming other data.

    Parameters
    ----------
    ds : xarray.Dataset
        Opened and laid out as daskpri trains on it (``x`` with ``sample``
        first, labels of an integer dtype); lazily, where it comes from a
        store: its values are read at :func:`sampled_rows` only.

    Returns
    -------
    dict of str
        ``x`` and ``y`` (each variable's dtype and shape, as in
        ``'float32 (800, 20)'``), ``x_rows`` and ``y_rows`` (digests of
        their values at the sampled samples).

    Examples
    --------
    >>> ds = xr.Dataset({"x": (("sample", "feature"), np.zeros((800, 20), "float32")),
    ...                  "y": ("sample", np.arange(800) % 10)})
    >>> fp = data_fingerprint(ds)
    >>> fp["x"], fp["y"]
    ('float32 (800, 20)', 'int64 (800,)')
    >>> fp == data_fingerprint(ds.copy(deep=True))
    True
    >>> data_fingerprint(ds.assign(y=(ds["y"] + 1) % 10)) == fp
    False
    """
    rows = sampled_rows(int(ds.sizes["sample"]))
    picked = ds[["x", "y"]].isel(sample=rows)
    # read by the driver's threads (or the client of a cluster it is persisted on),
    # as the other checks of the data are
    try:
        values = picked.compute(scheduler=driver_scheduler(picked))
    except Exception:
        # a chunk the driver cannot read (damaged, cut short): not the fingerprint's to
        # say, for the worker that reads its partition refuses the store at the fit's
        # start, naming the partition, the samples and the store (UnreadableDataError)
        values = None
    out: dict[str, str] = {}
    for name in ("x", "y"):
        var = ds[name]
        out[name] = f"{var.dtype} {tuple(int(s) for s in var.shape)}"
    for name in ("x", "y"):
        out[f"{name}_rows"] = (
            UNREAD if values is None else _digest(np.asarray(values[name].values))
        )
    return out


def fingerprint_differs(theirs: dict[str, Any], ours: dict[str, str]) -> str | None:
    """What differs between the fingerprints ``theirs`` (a checkpoint's) and ``ours``, or None.

    Examples
    --------
    >>> a = {"x": "float32 (8, 2)", "y": "int64 (8,)", "x_rows": "1", "y_rows": "2"}
    >>> fingerprint_differs(a, dict(a)) is None
    True
    >>> fingerprint_differs(a, dict(a, x_rows=UNREAD)) is None  # values not read: left out
    True
    >>> fingerprint_differs(a, dict(a, x="float64 (8, 2)", y_rows="3"))
    "x is float64 (8, 2), where the run's was float32 (8, 2); the labels differ at the \
sampled samples"
    """
    said = []
    for name in ("x", "y"):
        if theirs[name] != ours[name]:
            said.append(f"{name} is {ours[name]}, where the run's was {theirs[name]}")
    for name, what in (("x_rows", "the features"), ("y_rows", "the labels")):
        if UNREAD not in (theirs[name], ours[name]) and theirs[name] != ours[name]:
            said.append(f"{what} differ at the sampled samples")
    return "; ".join(said) or None
