"""Checkpoint files: written atomically, read weights-only.

A checkpoint is a ``torch.save`` file of tensors and plain Python values
(dicts, lists, numbers, strings): numpy arrays are stored as tensors. It is
read with ``torch.load(weights_only=True)`` and never unpickled otherwise, so
a file that carries code is refused, not run.
"""

from __future__ import annotations

import os
import pickle
import uuid
from typing import Any

import numpy as np
import torch

#: Version of the checkpoint layout.
FORMAT = 1


def to_storable(obj: Any) -> Any:
    """``obj`` with numpy arrays and scalars turned into tensors and Python numbers."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj).copy())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_storable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_storable(v) for v in obj)
    return obj


def from_storable(obj: Any) -> Any:
    """Invert :func:`to_storable` for the table's state (tensors back to numpy)."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: from_storable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_storable(v) for v in obj]
    return obj


def write(state: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """Write ``state`` to ``path`` atomically.

    The file is written beside ``path`` under a temporary name, flushed and
    fsynced, then renamed over ``path``: a reader sees the previous complete
    checkpoint or the new one, never a part of one.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(dict(state, format=FORMAT), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    return path


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint weights-only; refuse anything else.

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    ValueError
        If the file is not a daskpri checkpoint, or holds objects other than
        tensors and plain values (for example a pickle that would run code).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    # what torch's weights-only unpickler raises on a file that is not a pickle of
    # plain values: an arbitrary file (/etc/passwd) ends in an IndexError there
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError,
            IndexError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(
            f"{path!r} is not a loadable daskpri checkpoint (it is read weights-only, "
            f"and refused if it holds anything but tensors and plain values): {e}"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(
            f"{path!r} is not a daskpri checkpoint of format {FORMAT} "
            f"(got format {state.get('format') if isinstance(state, dict) else type(state)})"
        )
    return state
