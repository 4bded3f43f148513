"""The paths a user gives: checked before the work they are for, and their refusals."""

from __future__ import annotations

import os
import warnings

import xarray as xr

from daskpri.data.store import check_destination, check_writable

#: The file system's refusals of a path the user gave (for example a file
#: where a directory should be), told in one line rather than a traceback.
_PATH_ERRORS = (
    FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError
)


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
    if not os.path.lexists(path) or (os.path.isdir(path) and not os.listdir(path)):
        return
    what = "a zarr store" if os.path.isdir(path) else "a file"
    why = _not_a_history(path)
    if why is not None:
        raise ValueError(
            f"{flag} names {path!r}, {what} that is not a daskpri history ({why}): writing "
            "the history would replace it; give another path, or remove it first"
        )


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
