"""Checkpoint files: written atomically, read weights-only.

A checkpoint is a ``torch.save`` file of tensors and plain Python values
(dicts, lists, numbers, strings): numpy arrays are stored as tensors. It is
read with ``torch.load(weights_only=True)`` and never unpickled otherwise, so
a file that carries code is refused, not run. What it holds is checked where
it is read, field by field: a damaged or hand-edited checkpoint is refused in
one line naming the field, not at the resumed run's first step.
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
from daskpri.training._checkpoint_fields import (  # noqa: F401  (checkpoint's names)
    TRAINER_PARAMS,
    _Fields,
    damaged,
    from_storable,
    load_weights,
    shown,
)

#: torch's writer, by a name of this module's (a test makes it fail as on a full disk)
_save = torch.save

#: Version of the checkpoint layout.
FORMAT = 1

#: What a checkpoint of format :data:`FORMAT` holds besides ``format``: each key,
#: with the keys that its value, a dict, holds in turn where ``Trainer.resume`` or
#: ``daskpri train --resume`` reads them by name (of the trainer's parameters, those
#: that ``train --resume`` reads; ``resume`` passes them all on). ``model_spec`` is
#: None for a model of the user's own, not a built-in one. Two keys are not
#: required, older checkpoints lacking them: ``setup_time`` and ``data`` (the
#: fingerprint of the run's data, :mod:`daskpri.data._fingerprint`).
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
    if isinstance(e, OSError) or text.startswith("PytorchStreamReader"):
        # torch's zip reader, on an archive cut short: a paragraph after what it found
        cause = e.strerror if isinstance(e, OSError) and e.strerror else text.split(". ")[0]
        return f"it is cut short or damaged (torch: {cause})"
    if isinstance(e, pickle.UnpicklingError | RuntimeError | ValueError) and text:
        return text.splitlines()[0]
    return f"it is not a file torch.save wrote ({type(e).__name__} while reading it)"


def _foreign_zip(path: str) -> bool:
    """``path`` is a whole zip archive without the pickle that torch.save writes in one."""
    try:
        with zipfile.ZipFile(path) as z:
            return not any(name.endswith("/data.pkl") for name in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


#: how the files mistaken for checkpoints most often begin, and what they are
_MAGIC = ((b"\x89HDF", "an HDF5 or netCDF4 file"), (b"CDF", "a netCDF3 file"),
          (b"\x93NUMPY", "a NumPy .npy file"), (b"\x80", "a plain pickle"))


def _not_torch_save(head: bytes) -> str | None:
    """Why a file beginning with ``head`` is no file of ``torch.save`` (a zip archive).

    None for a zip archive (or one cut short), whose fault torch's error says.

    Examples
    --------
    >>> _not_torch_save(bytes([0x93]) + b"NUMPY")
    'it is a NumPy .npy file, not the zip archive that torch.save writes'
    >>> _not_torch_save(b"PK") is None
    True
    """
    if head.startswith(b"PK"):
        return None
    kind = next((what for magic, what in _MAGIC if head.startswith(magic)), None)
    if kind is None:
        return "it is not the zip archive that torch.save writes" + (
            " (it is empty)" if not head else "")
    return f"it is {kind}, not the zip archive that torch.save writes"


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
        an incompatible version of daskpri), is cut short, holds objects
        other than tensors and plain values (for example a pickle that would
        run code), or holds a field that a run cannot go on from (``'PATH' is
        a damaged daskpri checkpoint: its 'step' should be a non-negative
        integer, but got int -3``).

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
    # opened here: a file that cannot be opened (no permission) raises as it is, while
    # an OSError of torch's on the open file is its content's (an archive cut short)
    with open(path, "rb") as f:
        # daskpri's checkpoints are zip archives; another file (a pickle, whose protocol
        # torch warns of, an array, a history) is refused without torch's paragraph
        foreign = _not_torch_save(f.read(8))
        if foreign is not None:
            raise ValueError(
                f"{path!r} is not a loadable daskpri checkpoint: {foreign}"
            )
        f.seek(0)
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        # what torch's weights-only unpickler raises on a file that is not a pickle of
        # plain values: an arbitrary file (/etc/passwd) ends in an IndexError there
        except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError,
                IndexError, KeyError, TypeError, UnicodeDecodeError, OSError) as e:
            error: Exception | None = e
        else:
            error = None
    if error is not None:
        why = _why(error)
        if _foreign_zip(path):  # torch names what it lacks from its C++ reader
            why = "it is a zip archive, but not one torch.save wrote"
        raise ValueError(
            f"{path!r} is not a loadable daskpri checkpoint (it is read weights-only, "
            f"and refused if it holds anything but tensors and plain values): {why}"
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
    fmt = state["format"]
    if type(fmt) is not int or fmt != FORMAT:  # (a tensor's != is no bool)
        raise ValueError(
            f"{path!r} is not a checkpoint this version of daskpri reads: its 'format' should "
            f"be {FORMAT}, but got {fmt if type(fmt) is int else shown(fmt)} (a checkpoint of "
            "an incompatible version of daskpri, or not a daskpri checkpoint)"
        )
    _check_layout(path, state)
    return state


def _check_layout(path: str, state: dict[str, Any]) -> None:
    """Refuse ``state`` unless it holds every key of :data:`LAYOUT`."""
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
    _Fields(path).check(state)
