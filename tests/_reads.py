"""Count the files this process opens under a directory: what a check reads of a store.

An audit hook (``sys.addaudithook``) sees each ``open`` of Python's, which
zarr's local store makes for each chunk it reads. A hook cannot be removed,
so one is added, once, and records only inside :func:`opened_under`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_watching: list[tuple[str, list[str]]] = []
_added = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _watching or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    with _lock:
        for top, seen in _watching:
            if path.startswith(top):
                seen.append(os.path.relpath(path, top))


@contextlib.contextmanager
def opened_under(directory: str | os.PathLike[str]) -> Iterator[list[str]]:
    """The files opened under ``directory`` in this process (its threads too), as they are."""
    global _added
    if not _added:
        sys.addaudithook(_hook)
        _added = True
    entry: tuple[str, list[str]] = (os.path.abspath(directory) + os.sep, [])
    with _lock:
        _watching.append(entry)
    try:
        yield entry[1]
    finally:
        with _lock:
            _watching.remove(entry)
