"""A user's dataset brought to the layout daskpri trains on, or told how to get there.

xarray users name their dimensions and lay them out as their data comes:
features ``(feature, sample)`` from a table written column-wise, labels as
floats from a netCDF file or a pandas frame that held a NaN once. What
daskpri can take as it is meant, it takes: ``x`` is transposed so that
``sample`` comes first (lazily: a store is still read a partition at a
time), ``x`` of one number a sample gets a feature dimension of length
one, and labels of a float or bool dtype are cast to int64, each value
checked to be a whole number where it is read. What it cannot, it refuses
with what to write instead (:func:`hint_missing`, :func:`hint_labels`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

#: float labels at or beyond this are refused: int64 cannot hold them all,
#: and no classifier has that many classes
_LARGEST_LABEL = 2.0**62


def as_training(ds: xr.Dataset, *, name: str = "data") -> xr.Dataset:
    """``ds`` with ``x``'s ``sample`` dimension first and its labels as integers.

    ``x`` of dimension ``sample`` alone (one number a sample) gets a
    trailing ``feature`` dimension of length one, as a model's layers take it.

    Returned as is where nothing needs changing. Float labels are cast to
    int64 with every value checked to be a whole number (a NaN, an infinity
    or a fraction raises ``ValueError`` naming the sample): at once for
    labels in memory, where they are read for labels backed by dask (a
    store's chunks, ``xr.open_mfdataset``), which the driver does for every
    label before a fit starts its run.

    Examples
    --------
    >>> ds = xr.Dataset({"x": (("feature", "sample"), np.zeros((3, 4), "float32")),
    ...                  "y": ("sample", np.array([0.0, 1.0, 2.0, 1.0]))})
    >>> out = as_training(ds)
    >>> out["x"].dims, out["y"].dtype
    (('sample', 'feature'), dtype('int64'))
    >>> as_training(ds.assign(y=ds["y"] + 0.5))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: data.y should hold whole-number class labels ... but got 0.5 at sample 0 ...
    >>> as_training(ds.assign(x=("sample", np.zeros(4, "float32"))))["x"].dims
    ('sample', 'feature')
    """
    changed: dict[str, xr.DataArray] = {}
    x = ds.data_vars.get("x")
    if x is not None and "sample" in x.dims and x.dims[0] != "sample":
        changed["x"] = x.transpose("sample", ...)
    elif x is not None and x.dims == ("sample",):
        feature = "feature" if "feature" not in ds.dims else "feature_"
        changed["x"] = x.expand_dims(feature, axis=1)
    y = ds.data_vars.get("y")
    if y is not None and y.dims == ("sample",) and y.dtype.kind in "fb":
        changed["y"] = _whole_labels(y, name)
    return ds.assign(changed) if changed else ds


def _whole_labels(y: xr.DataArray, name: str) -> xr.DataArray:
    """``y`` cast to int64, each float checked to be a whole number where it is read."""
    if y.dtype.kind == "b":
        out = y.astype(np.int64)
    else:
        why = _why_floats(y)
        if y.chunks is None:
            out = y.copy(data=_checked(np.asarray(y.values), 0, name, why))
        else:
            data = y.data.map_blocks(
                _checked_block, token="daskpri-whole-labels", dtype=np.int64,
                meta=np.array((), np.int64), where=name, why=why,
            )
            out = y.copy(data=data)
    out.encoding = {}  # the float encoding (a _FillValue) is not that of the cast labels
    return out


def _checked_block(
    block: np.ndarray, *, where: str, why: str, block_info: dict[Any, Any] | None = None
) -> np.ndarray:
    start = 0 if block_info is None else int(block_info[0]["array-location"][0][0])
    return _checked(block, start, where, why)


def _checked(y: np.ndarray, offset: int, where: str, why: str) -> np.ndarray:
    """``y`` as int64, if every value is a whole number; else ``ValueError`` naming one."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(y) & (np.floor(y) == y) & (np.abs(y) < _LARGEST_LABEL)
    if not ok.all():
        first = int(np.argmin(ok))
        n_bad = int(y.size - ok.sum())
        raise ValueError(
            f"{where}.y should hold whole-number class labels (floats such as 3.0 are taken "
            f"as the integer 3), but got {float(y[first])!r} at sample {offset + first} ({n_bad} "
            f"such label{'s' if n_bad != 1 else ''} in samples {offset}-{offset + len(y) - 1})"
            f"{why or '; give each sample its class as an integer, or drop the unlabelled'}"
        )
    return y.astype(np.int64)


def _why_floats(y: xr.DataArray) -> str:
    """Why a file's integer labels came back as floats, and what to do, or ''."""
    stored = y.encoding.get("dtype")
    fill = y.encoding.get("_FillValue", y.attrs.get("_FillValue"))
    if fill is None or stored is None or np.dtype(stored).kind not in "iu":
        return ""
    return (
        f": the file stores y as {np.dtype(stored)} with _FillValue={fill}, and xarray "
        "decodes an integer variable that has a _FillValue as floats, NaN where a value is "
        f"the fill value. Labels should not be missing: drop the samples whose label is "
        f"{fill}, or, where {fill} is a class, write y without a fill value "
        "(encoding={'y': {'_FillValue': None}}), or open the file with mask_and_scale=False "
        "(xarray.open_dataset or xarray.open_zarr) and pass the Dataset"
    )


def hint_labels(y: xr.DataArray) -> str:
    """What to do with labels of a dtype daskpri does not take (names, categories), or ''.

    Examples
    --------
    >>> hint_labels(xr.DataArray(np.array(["cat", "dog"]), dims="sample"))  # doctest: +ELLIPSIS
    "; labels that are names should be numbered: codes, classes = pandas.factorize(...)..."
    """
    if y.dtype.kind in "USO" or str(y.dtype) == "category":
        return (
            "; labels that are names should be numbered: codes, classes = "
            "pandas.factorize(ds['y'].values); ds['y'] = ('sample', codes) (classes[i] is "
            "class i's name; numbers stored as objects: ds['y'] = ds['y'].astype('int64'))"
        )
    return ""


def hint_missing(ds: xr.Dataset, var: str) -> str:
    """How to give ``ds`` the variable ``var`` (``"x"`` or ``"y"``) it lacks.

    A variable along ``sample`` of more dimensions is taken for the
    features, one of ``sample`` alone for the labels, where one is alone
    in being so.

    Examples
    --------
    >>> ds = xr.Dataset({"image": (("sample", "h"), np.zeros((2, 3))),
    ...                  "label": ("sample", np.arange(2))})
    >>> hint_missing(ds, "x")
    "; daskpri reads the features from 'x' and the labels from 'y': \
ds.rename({'image': 'x', 'label': 'y'})"
    """
    if var in ds.coords:
        return f"; {var!r} is a coordinate of it, not a variable: ds.reset_coords({var!r})"
    along = {str(k): v for k, v in ds.data_vars.items() if "sample" in v.dims}
    found = {
        "x": [k for k, v in along.items() if v.ndim > 1 and v.dtype.kind in "iuf"],
        "y": [k for k, v in along.items() if v.ndim == 1],
    }
    names = {}
    for want in ("x", "y"):
        if want not in ds.data_vars and len(found[want]) == 1:
            names[found[want][0]] = want
    if var not in names.values():
        names["<yours>"] = var
    return f"; daskpri reads the features from 'x' and the labels from 'y': ds.rename({names!r})"


def hint_sample(ds: xr.Dataset) -> str:
    """How to name ``ds``'s sample dimension ``sample``."""
    y = ds.data_vars.get("y")
    dim = str(y.dims[0]) if y is not None and y.ndim == 1 else "<yours>"
    return f"; name the dimension samples lie along 'sample': ds.rename({{{dim!r}: 'sample'}})"


def hint_y_dims(y: xr.DataArray) -> str:
    """How to drop ``y``'s dimensions of size 1 besides ``sample``, or ''."""
    extra = [str(d) for d in y.dims if d != "sample"]
    if "sample" in y.dims and extra and all(y.sizes[d] == 1 for d in extra):
        return f"; drop the others: ds['y'] = ds['y'].squeeze({extra!r}, drop=True)"
    return ""
