"""The paths a user gives: checked before the work they are for, and their refusals."""

from __future__ import annotations

import os

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
    there and removed).
    """
    target = os.path.abspath(path)
    if kind == "store":  # check_destination makes the probe below too
        check_destination(path, name=flag)
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
