"""Write a dataset (zarr or netCDF) or a file's bytes: atomically, and an error in one line.

The errors of a write name the path written, never its temporary sibling;
:func:`check_destination` and :func:`check_writable` find a path that cannot
be written before the work whose results go there.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable

import dask.config
import xarray as xr

from daskpri.data._formats import _is_zarr_store, format_of
from daskpri.data._persisted import driver_scheduler

__all__ = [
    "PathTakenError", "check_destination", "check_writable", "remove_stale", "to_store",
    "write_atomic", "write_error",
]


def to_store(ds: xr.Dataset, path: str | os.PathLike[str]) -> str:
    """Write ``ds`` to a zarr store or a netCDF file, atomically.

    The data is written to a temporary sibling of ``path`` first and then
    renamed into place, so readers see either the old store or the complete
    new one, never a half-written file. A zarr store replaced is swapped
    with the new one in one step on Linux; elsewhere (or on a file system
    without ``renameat2``'s ``RENAME_EXCHANGE``) it is moved aside first,
    and for the instant between the two renames there is none.

    What stood at ``path`` as the write began is all it replaces: where
    another writer (another ``to_store`` on the same path) put a store or
    file there meanwhile, that one is left as it is and this write raises
    :class:`PathTakenError`, a ``FileExistsError``; two writes racing on a
    path never leave a store of both, nor replace the other's without a
    word.

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
        failing), or the file cannot be made there (a directory that takes
        no file): ``could not write 'PATH': No space left on device``, in
        one line, with the error's ``errno`` (``errno.ENOSPC`` there). The
        temporary sibling is removed and what was at ``path`` is left as it
        was. An error reading ``ds``'s own source is raised as it is.
    PathTakenError
        A ``FileExistsError``: if another writer put a store or file at
        ``path`` while this one wrote (``could not write 'PATH': another writer put a zarr store
        there while this write ran ...``): it is left as that writer made
        it, and this write's temporary sibling is removed.

    Examples
    --------
    >>> import os, tempfile, numpy as np, xarray as xr
    >>> from daskpri.data.io import open_dataset
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
    fmt = format_of(target, name="path")
    _check_target(target, fmt, name="path")
    seen = _identity(target)  # what the write replaces: nothing else is
    parent, base = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    out = _fetched(ds.copy())
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
        _put_in_place(tmp, target, seen, os.fspath(path))
    except PathTakenError:
        _remove(tmp)
        raise
    except OSError as e:
        _remove(tmp)
        # neither the disk's nor our files' (a lazy dataset's source, unread): its own words
        if e.errno not in _DISK_FULL and not _names(e, tmp, target):
            raise
        # the writers' own words name the temporary file, and HDF5's run to
        # several lines with the time and a buffer's address in them
        raise write_error(e, f"could not write {os.fspath(path)!r}") from e
    except BaseException:
        _remove(tmp)
        raise
    remove_stale(parent, lambda name: name.startswith((f".{base}.tmp-", f".{base}.old-")))
    return os.fspath(path)


def _fetched(ds: xr.Dataset) -> xr.Dataset:
    """``ds``, its values fetched here, in its chunks, where a cluster holds them persisted.

    The write below computes with this process's threads, which cannot
    compute chunks persisted on a cluster (``client.persist(ds)``), and the
    cluster's workers need not see the path.
    """
    scheduler = driver_scheduler(ds)
    if scheduler == "threads":
        return ds
    loaded = ds.compute(scheduler=scheduler)
    for name, var in ds.variables.items():
        if var.chunks is not None:
            loaded[name] = loaded[name].chunk(dict(zip(var.dims, var.chunks, strict=True)))
    return loaded


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> str:
    """Write ``data`` (text as UTF-8) to the file ``path``, atomically.

    As :func:`to_store` does: to a temporary sibling, flushed to the disk,
    then renamed over ``path``, so a reader sees the old file or the whole
    new one. An error of the write is one line naming ``path`` (``could
    not write 'PATH': No space left on device``), and leaves no temporary
    file behind and ``path`` as it was. Missing directories are made.

    Examples
    --------
    >>> import os, tempfile
    >>> path = write_atomic(os.path.join(tempfile.mkdtemp(), "out", "notes.md"), "# notes")
    >>> open(path).read(), os.listdir(os.path.dirname(path))
    ('# notes', ['notes.md'])
    """
    target = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(target)
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        os.makedirs(parent, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        _remove(tmp)
        raise write_error(e, f"could not write {os.fspath(path)!r}") from e
    except BaseException:
        _remove(tmp)
        raise
    remove_stale(parent, lambda name: name.startswith(f".{base}.tmp-"))
    return os.fspath(path)


def _names(error: OSError, *paths: str) -> bool:
    """Whether ``error`` is about one of ``paths`` or a file inside one (a zarr store's)."""
    return any(
        isinstance(name, str)
        and any(name == p or name.startswith(p + os.sep) for p in paths)
        for name in (error.filename, error.filename2)
    )


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
        # every chunk, those all of the fill value too (zarr leaves them out by
        # default): a chunk missing from a store of ours is then one lost
        ds.to_zarr(path, mode="w", consolidated=True, write_empty_chunks=True)


#: The errors of a disk that takes no more: full, over quota, a file too large for
#: it, read-only, failing
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
#: netCDF files up to this size are made in memory, then written (see `_to_netcdf`)
_NETCDF_IN_MEMORY = 256 * 2**20
#: room left for what HDF5 adds to a netCDF file's values (its metadata), for `_to_netcdf`
_HDF5_OVERHEAD = 2**20


def _to_netcdf(ds: xr.Dataset, path: str) -> None:
    """Write ``ds`` as a netCDF4 file (h5netcdf) at ``path``.

    HDF5 takes a full disk badly: where its metadata cannot be written as
    the file closes, h5py raises "Can't close file", prints an "Exception
    ignored" for each object it frees, and crashes the process (a
    segmentation fault, then or at exit: h5py 3.16, a 67 KiB file on a
    tmpfs with 4 to 64 KiB left, at each 4 KiB step). So the file is made
    in memory and written with Python's own writes, whose full disk is an
    ``OSError`` like any other.
    A dataset larger than ``_NETCDF_IN_MEMORY`` is written by HDF5 itself,
    once the disk is seen to have room for its values: a disk that another
    writer fills meanwhile can still crash it.
    """
    if ds.nbytes <= _NETCDF_IN_MEMORY:
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


def check_destination(path: str | os.PathLike[str], *, name: str = "path") -> str:
    """The format :func:`to_store` would write ``path`` in, once sure it may write there.

    For a caller that checks where its results go before the work that
    makes them (``daskpri train --output``): the suffix should name a
    format, what is at ``path`` should be something ``to_store`` replaces
    (see there), and its directory should take a file
    (:func:`check_writable`). ``name`` names the parameter in errors.

    Examples
    --------
    >>> import os, tempfile
    >>> check_destination(os.path.join(tempfile.mkdtemp(), "run.zarr"))
    'zarr'
    """
    target = os.path.abspath(os.fspath(path))
    fmt = format_of(target, name=name)
    _check_target(target, fmt, name=name)
    check_writable(path, name=name)
    return fmt


def check_writable(
    path: str | os.PathLike[str], *, name: str = "path", directory: bool = False
) -> None:
    """Refuse ``path`` unless this process can make a file where ``path`` goes.

    The nearest existing directory above ``path`` (``path`` itself with
    ``directory=True``, where the files go into it) should take a file: one
    is made there and removed again. ``os.access`` would not do: it says
    yes to root on a read-only file system, and on ``/proc``, where no file
    can be made. Missing directories on the way are fine (writers make them).

    Raises
    ------
    ValueError
        If a file stands where a directory of the path should, or no file
        can be made there (the message names ``name``, ``path`` and why).

    Examples
    --------
    >>> check_writable("/proc/run.nc", name="--output")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --output should be a path this process may write, but got --output '/proc/...
    >>> check_writable("run\\x00.nc", name="path")
    Traceback (most recent call last):
    ...
    ValueError: path should be a path without NUL characters, but got path 'run\\x00.nc'
    """
    given = os.fspath(path)
    if "\x00" in given:  # which os.open refuses without naming the path ("embedded null byte")
        raise ValueError(
            f"{name} should be a path without NUL characters, but got {name} {given!r}"
        )
    target = os.path.abspath(given)
    parent = target if directory else os.path.dirname(target)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(
            f"{name} should be a path under directories, but got {name} {given!r}, "
            f"and {parent!r} is a file"
        )
    probe = os.path.join(parent, f".{os.path.basename(target)}.probe-{uuid.uuid4().hex}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        raise ValueError(
            f"{name} should be a path this process may write, but got {name} {given!r}, "
            f"and {parent!r} takes no new file: "
            f"{os.strerror(e.errno) if e.errno else e}"
        ) from None
    os.remove(probe)


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


class PathTakenError(FileExistsError):
    """Raised by :func:`to_store` where another writer put a store or file at its path meanwhile.

    A ``FileExistsError``: what the other writer put there is left as it
    is, and nothing of this write is kept.
    """


def _identity(path: str) -> tuple[int, int] | None:
    """The file or directory at ``path`` (its device and inode), None where there is none."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def _taken(path: str, given: str) -> PathTakenError:
    """The error of a write whose ``path`` another writer took while it wrote."""
    what = ("a zarr store" if os.path.isdir(path) else "a file") if os.path.lexists(path) \
        else "something"
    return PathTakenError(
        errno.EEXIST,
        f"could not write {given!r}: another writer put {what} there while this write ran "
        "(another to_store, say); it is left as that writer made it, and what this write "
        "wrote is not kept: write again to replace it",
    )


#: a rename's errors where its target is a directory that is not empty, or of the other
#: kind (a file where a directory goes): another writer's, put there meanwhile
_OCCUPIED = frozenset({errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


#: ``os.link``'s errors on a file system without hard links (some network and FUSE ones)
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS})


def _link_or_rename(tmp: str, target: str) -> None:
    """Move the file ``tmp`` to ``target``, where nothing is, never over a file put there since.

    A hard link fails where ``target`` exists, in the one call; where the
    file system has none, ``target`` is looked at just before the rename.
    """
    try:
        os.link(tmp, target)
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _put_in_place(tmp: str, target: str, seen: tuple[int, int] | None, given: str) -> None:
    """Move the complete store or file ``tmp`` to ``target``, where ``seen`` still stands.

    ``seen`` is what stood at ``target`` when the write began (None:
    nothing). Only it is replaced: a store or file that another writer put
    there since is left as it is, and :class:`PathTakenError` raised, so that two
    writes racing on one path never leave a store of both, nor one's
    complete store silently replaced by the other's. A path that is empty
    again (another writer moving its old store aside) is taken only where
    nothing stands there at the rename itself: a directory is renamed onto
    no directory but an empty one, a file is linked (``os.link`` makes no
    file over another). Between the look at ``target`` and the rename over
    it a writer may still slip in: that window is a system call wide.
    """
    now = _identity(target)
    if now is None:
        try:
            if os.path.isdir(tmp):
                os.rename(tmp, target)  # onto nothing or an empty directory, else it fails
            else:
                _link_or_rename(tmp, target)
        except OSError as e:
            if e.errno in _OCCUPIED:
                raise _taken(target, given) from None
            raise
        return
    if now != seen:
        raise _taken(target, given)
    if not os.path.isdir(tmp):
        os.replace(tmp, target)
        return
    if _exchange(tmp, target):  # the new store and the old swapped in one step
        if _identity(tmp) != seen:  # another writer's, moved in between the look and here
            _exchange(tmp, target)  # (back: the swap is its own inverse)
            raise _taken(target, given)
        _remove(tmp)  # the old store, now at the temporary path
        return
    # os.replace cannot put a directory over a non-empty one: the old store is moved
    # aside, the new one moved in, and the old one deleted once the new one is there
    parent, base = os.path.split(target)
    backup = os.path.join(parent, f".{base}.old-{uuid.uuid4().hex}")
    os.rename(target, backup)
    if _identity(backup) != seen:  # another writer's, moved in between the look and here
        with contextlib.suppress(OSError):
            os.rename(backup, target)
        raise _taken(target, given)
    try:
        os.rename(tmp, target)
    except OSError as e:
        if e.errno in _OCCUPIED:  # another's there now: the old store, superseded, goes
            _remove(backup)
            raise _taken(target, given) from None
        os.rename(backup, target)
        raise
    except BaseException:
        os.rename(backup, target)
        raise
    _remove(backup)


#: renameat2's flag that swaps two paths, and the directory file descriptor of the cwd
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: str, b: str) -> bool:
    """Swap paths ``a`` and ``b`` in one step (Linux's ``renameat2``, ``RENAME_EXCHANGE``).

    False, having changed nothing, where the system or the file system has
    no such swap (not Linux, a libc without ``renameat2``, a file system
    that refuses the flag): the caller moves one aside instead.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
