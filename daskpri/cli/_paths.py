"""The paths a user gives: checked before the work they are for, and their refusals."""

from __future__ import annotations

import os
import warnings

import xarray as xr

from daskpri.data.io import format_of
from daskpri.data.store import check_destination, check_writable


def _check_destination(flag: str, path: str, *, kind: str = "file") -> None:
    """Refuse ``path`` (a ``"file"``, ``"store"`` or ``"directory"``) before the work it is for.

    Its directories may be missing (they are made), but those that exist
    should be directories, and the nearest should take a file (one is made
    there and removed). A ``"store"`` is a run's history (``train
    --output``): what is there already is replaced only if it is one.
    """
    target = os.path.abspath(path)
    if kind == "store":  # check_destination makes the probe below too
        check_destination(path, name=flag)
        _check_history(flag, path)
        return
    if kind == "file" and os.path.isdir(target):
        raise ValueError(
            f"{flag} should be a file's path, but got {flag} {path!r}, which is a directory"
        )
    elif kind == "directory" and os.path.lexists(target) and not os.path.isdir(target):
        raise ValueError(
            f"{flag} should be a directory, but got {flag} {path!r}, which is a file"
        )
    check_writable(path, name=flag, directory=kind == "directory")


def _check_history(flag: str, path: str) -> None:
    """Refuse ``path`` if it holds something other than a daskpri history, which a write replaces.

    ``to_store`` replaces any netCDF file or zarr store: a user's dataset
    (``ds.to_zarr('data.zarr')``), a checkpoint or notes given a ``.nc``
    name. A history is what ``train --output`` or ``to_store(trainer.history_,
    ...)`` wrote: a ``step`` dimension, ``time`` and ``loss`` along it, and the
    run's ``strategy`` among its attributes.
    """
    what = _unreplaceable(path)
    if what is not None:
        raise ValueError(
            f"{flag} names {path!r}, {what}: writing the history would replace it; give "
            "another path, or remove it first"
        )


def _unreplaceable(path: str) -> str | None:
    """What is at ``path`` that a history written there should not replace; None if nothing.

    ``None`` for a new path, an empty directory where a zarr store goes, or
    a daskpri history of the path's format. Otherwise what is there, as
    "a zarr store that is not a daskpri history (it has no 'step'
    dimension)"; a file where a zarr store goes, or a directory where a
    netCDF file goes (which :func:`~daskpri.data.io.to_store` refuses), is
    said so.
    """
    if not os.path.lexists(path):
        return None
    zarr = format_of(path, name="--output") == "zarr"
    if os.path.isdir(path) != zarr:
        return "a file, where a zarr store goes" if zarr else (
            "a directory, where a netCDF file goes")
    if os.path.isdir(path) and not os.listdir(path):
        return None
    why = _not_a_history(path)
    if why is None:
        return None
    return f"{'a zarr store' if zarr else 'a file'} that is not a daskpri history ({why})"


def _free_sibling(path: str) -> str:
    """A path beside ``path`` that does not exist: ``run-1.nc`` for ``run.nc``, or ``run-2.nc``...

    Examples
    --------
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _free_sibling(os.path.join(folder, "run.zarr/")) == os.path.join(folder, "run-1.zarr")
    True
    """
    root, ext = os.path.splitext(path.rstrip("/" + os.sep))
    n = 1
    while os.path.lexists(f"{root}-{n}{ext}"):
        n += 1
    return f"{root}-{n}{ext}"


def _not_a_history(path: str) -> str | None:
    """Why the netCDF file or zarr store at ``path`` is no daskpri history; None if it is one."""
    try:
        # metadata only: no variable's values are read
        with warnings.catch_warnings():  # a store's own (unconsolidated metadata): not ours
            warnings.simplefilter("ignore")
            if os.path.isdir(path):
                ds = xr.open_zarr(path, consolidated=None, chunks=None)
            else:
                ds = xr.open_dataset(path, engine="h5netcdf", chunks=None)
    except Exception:  # what is not netCDF or zarr fails anywhere in their readers
        # (histories are netCDF4, which h5netcdf reads: a netCDF3 file is a user's too)
        return "it is not a readable zarr store" if os.path.isdir(path) else (
            "it is not a netCDF4 file")
    with ds:
        if "step" not in ds.dims:
            return "it has no 'step' dimension"
        lacking = [v for v in ("time", "loss")
                   if v not in ds.variables or ds[v].dims != ("step",)]
        if lacking:
            return f"it has no per-step {' or '.join(map(repr, lacking))}"
        if "strategy" not in ds.attrs:
            return "it has no 'strategy' attribute"
    return None
