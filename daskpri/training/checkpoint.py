"""Checkpoint files: written atomically, read weights-only.

A checkpoint is a ``torch.save`` file of tensors and plain Python values
(dicts, lists, numbers, strings): numpy arrays are stored as tensors. It is
read with ``torch.load(weights_only=True)`` and never unpickled otherwise, so
a file that carries code is refused, not run.
"""

from __future__ import annotations

import os
import pickle
import re
import uuid
import zipfile
from typing import Any

import numpy as np
import torch

from daskpri.data.store import check_writable, remove_stale, write_error

#: torch's writer, by a name of this module's (a test makes it fail as on a full disk)
_save = torch.save

#: Version of the checkpoint layout.
FORMAT = 1

#: What a checkpoint of format :data:`FORMAT` holds besides ``format``: each key,
#: with the keys that its value, a dict, holds in turn where ``Trainer.resume`` or
#: ``daskpri train --resume`` reads them by name (of the trainer's parameters, those
#: that ``train --resume`` reads; ``resume`` passes them all on). ``model_spec`` is
#: None for a model of the user's own, not a built-in one.
LAYOUT: dict[str, tuple[str, ...]] = {
    "step": (),
    "elapsed": (),
    "model": (),
    "model_spec": ("name",),
    "optimizer": (),
    "mean_grad": (),
    "strategy": ("name", "params"),
    "trainer": ("seed", "batch_size", "learning_rate", "optimizer", "lr_schedule",
                "local_steps", "staleness", "checkpoint_path", "checkpoint_every"),
    "table": (),
    "history": (),
}


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


def check_replaceable(
    path: str | os.PathLike[str], name: str = "checkpoint_path", *, writable: bool = True
) -> None:
    """Refuse ``path`` if it holds a file that is not a checkpoint, which a write would replace.

    Checkpoints are zip archives (torch's format); anything else there (a
    notes file, a history, a typo'd path) is the user's and is kept. With
    ``writable``, the directory should also take a file
    (:func:`daskpri.data.store.check_writable`): a trainer, or ``daskpri
    train``, checks before the run, not at its first checkpoint.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> notes = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"
    >>> _ = notes.write_text("mine")
    >>> check_replaceable(notes)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: checkpoint_path names ..., a file that is not a daskpri checkpoint: ...
    """
    path = os.fspath(path)
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise ValueError(
            f"{name} names {path!r}, a file that is not a daskpri checkpoint: writing the "
            f"checkpoint would replace it; give another path, or remove the file first"
        )
    if writable:
        check_writable(path, name=name)


def write(state: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """Write ``state`` to ``path`` atomically.

    The file is written beside ``path`` under a temporary name, flushed and
    fsynced, then renamed over ``path``: a reader sees the previous complete
    checkpoint or the new one, never a part of one. A file at ``path`` that
    is not a checkpoint is refused (:func:`check_replaceable`).
    """
    path = os.fspath(path)
    # no probe: the write itself is one, and its error names the checkpoint
    check_replaceable(path, "the checkpoint's path", writable=False)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            try:
                _save(dict(state, format=FORMAT), f)
            except RuntimeError as e:
                # torch's writer, on a file that takes no more (a full disk), says
                # 'failed writing', or lets the file's OSError through, which the
                # end of its archive, written on the way out, hides behind
                # 'unexpected pos 31232 vs 31168' (torch 2.13, a full tmpfs)
                if isinstance(e.__context__, OSError):
                    raise OSError(e.__context__.errno, e.__context__.strerror) from e
                if "failed writing" not in str(e):  # not the file's: let it be
                    raise
                raise OSError(str(e).splitlines()[0]) from e
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:  # in a line, naming the checkpoint rather than its temporary
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise write_error(e, f"could not write the checkpoint {path!r}") from e
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)
    prefix = f".{os.path.basename(path)}."
    remove_stale(directory, lambda name: name.startswith(prefix) and name.endswith(".tmp"))
    return path


def _why(e: Exception) -> str:
    """What ``torch.load`` found wrong with a file, in a line.

    Its weights-only refusal is a paragraph that suggests loading the file
    unsafely (which daskpri never does) and then says what it refused; a
    file that is no pickle at all fails somewhere in the unpickler, with an
    error that names nothing useful (``KeyError: 101``).

    Examples
    --------
    >>> _why(KeyError(101))
    'it is not a file torch.save wrote (KeyError while reading it)'
    >>> _why(pickle.UnpicklingError(
    ...     "Weights only load failed. Re-running `torch.load` with `weights_only` set to "
    ...     "`False` will likely succeed.\\n\\nPlease file an issue: WeightsUnpickler error: "
    ...     "\\n\\nUnsupported operand 192\\n\\nCheck the documentation of torch.load."))
    'Unsupported operand 192'
    """
    text = str(e).strip()
    found = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    if found:  # what it refused, where torch says it: its first sentence
        return re.split(r"(?<=\.)\s", found.group(1).strip())[0]
    if text.startswith("Weights only load failed"):
        said = [p.strip() for p in re.split(r"\n\s*\n", text)[1:]]
        detail = " ".join(p for p in said if p and not p.startswith("Check the documentation"))
        detail = re.sub(r"^Please file an issue.*?WeightsUnpickler error:\s*", "", detail,
                        flags=re.S)
        return detail or "refused by torch's weights-only loader"
    if isinstance(e, pickle.UnpicklingError | RuntimeError | ValueError) and text:
        return text.splitlines()[0]
    return f"it is not a file torch.save wrote ({type(e).__name__} while reading it)"


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint weights-only; refuse anything else.

    Parameters
    ----------
    path : str or os.PathLike
        A checkpoint written by ``Trainer.save`` or by ``checkpoint_path=``.

    Returns
    -------
    dict
        The checkpoint's state: every key of :data:`LAYOUT`, and ``format``.

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    ValueError
        If the file is not a daskpri checkpoint of format :data:`FORMAT`
        holding every key of :data:`LAYOUT` (a file of another kind, or of
        an incompatible version of daskpri), or holds objects other than
        tensors and plain values (for example a pickle that would run code).

    Examples
    --------
    >>> import tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "other.ckpt")
    >>> torch.save({"format": 1, "step": 3}, path)
    >>> read(path)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: '...other.ckpt' is not a daskpri checkpoint, ...: it has no 'elapsed', ...
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
            f"and refused if it holds anything but tensors and plain values): {_why(e)}"
        ) from None
    if not isinstance(state, dict):
        raise ValueError(
            f"{path!r} is not a daskpri checkpoint: it holds a {type(state).__name__}, "
            f"where a checkpoint holds a dict of format {FORMAT}"
        )
    if "format" not in state:
        raise ValueError(
            f"{path!r} is not a daskpri checkpoint: it has no 'format' key, which every "
            "checkpoint holds"
        )
    if state["format"] != FORMAT:
        raise ValueError(
            f"{path!r} is not a checkpoint this version of daskpri reads: its 'format' should "
            f"be {FORMAT}, but got {state['format']!r} (a checkpoint of an incompatible "
            "version of daskpri, or not a daskpri checkpoint)"
        )
    _check_layout(path, state)
    return state


def _check_layout(path: str, state: dict[str, Any]) -> None:
    """Refuse ``state`` unless it holds every key of :data:`LAYOUT`, typed as read."""
    refused = (f"{path!r} is not a daskpri checkpoint, or is one from an incompatible "
               "version of daskpri")
    missing = [repr(key) for key in LAYOUT if key not in state]
    for key, inner in LAYOUT.items():
        if inner and isinstance(state.get(key), dict):
            missing += [f"{name!r} in {key!r}" for name in inner if name not in state[key]]
    if missing:
        raise ValueError(
            f"{refused}: it has no {', '.join(missing)}, which every checkpoint of "
            f"format {FORMAT} holds"
        )
    # what is read by name should be a dict, and the step count an integer, as written
    expected: dict[str, tuple[tuple[type, ...], str]] = {
        key: ((dict,), "a dict") for key, inner in LAYOUT.items() if inner
    }
    expected.update(step=((int,), "an integer"), model_spec=((dict, type(None)), "a dict or None"))
    for key, (types, allowed) in expected.items():
        value = state[key]
        if not isinstance(value, types) or isinstance(value, bool):
            raise ValueError(
                f"{refused}: {key!r} should be {allowed}, but got {type(value).__name__}"
            )
