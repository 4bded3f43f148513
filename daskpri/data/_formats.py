"""The two formats daskpri reads and writes datasets and histories in: zarr and netCDF."""

from __future__ import annotations

import os

_ZARR_SUFFIXES = (".zarr",)
# Files at the top of a zarr store: format 3, then format 2's group, attributes, array.
_ZARR_METADATA = ("zarr.json", ".zgroup", ".zattrs", ".zarray")
_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5")
_FORMATS = (
    "a zarr store (a directory, or a path ending in .zarr) "
    "or a netCDF file (.nc, .nc4, .netcdf, .h5)"
)


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


def _is_zarr_store(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, meta)) for meta in _ZARR_METADATA)
