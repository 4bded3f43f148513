"""Checkpoint files: written atomically, read weights-only.

A checkpoint is a ``torch.save`` file of tensors and plain Python values
(dicts, lists, numbers, strings): numpy arrays are stored as tensors. It is
read with ``torch.load(weights_only=True)`` and never unpickled otherwise, so
a file that carries code is refused, not run. What it holds is checked where
it is read, field by field: a damaged or hand-edited checkpoint is refused in
one line naming the field, not at the resumed run's first step.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import uuid
import zipfile
from typing import Any, NoReturn

import numpy as np
import torch

from daskpri.data.store import check_writable, remove_stale, write_error
from daskpri.models import from_spec
from daskpri.strategies import STRATEGIES, get_strategy
from daskpri.table.table import PriorityTable
from daskpri.training.history import STEP_VARIABLES, WORKER_VARIABLES

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


#: The trainer's parameters that a checkpoint keeps (those of ``Trainer.__init__``
#: but the model, strategy, client and security), each with the kind of value it
#: holds and whether it may be None. ``read`` checks the kinds; ``Trainer.resume``
#: passes the values to the constructor, whose checks refuse what is out of range.
TRAINER_PARAMS: dict[str, tuple[str, bool]] = {
    "seed": ("int", False), "n_workers": ("int", True), "resources": ("dict", True),
    "batch_size": ("int", False), "learning_rate": ("real", False),
    "momentum": ("real", False), "weight_decay": ("real", False),
    "max_grad_norm": ("real", True), "optimizer": ("str", False),
    "lr_schedule": ("str", False), "schedule_steps": ("int", True),
    "local_steps": ("int", False), "eval_every": ("int", False),
    "partition_size": ("int", True), "staleness": ("str", False), "device": ("str", True),
    "checkpoint_path": ("str", True), "checkpoint_every": ("int", True),
    "transport": ("str", False), "on_nonfinite": ("str", False),
}

#: each kind of :data:`TRAINER_PARAMS`: its types, and how a message names it
_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "real": ((int, float), "a number"),
    "str": ((str,), "a str"),
    "dict": ((dict,), "a dict"),
}

#: what the priority table's state holds, and the table's own within it
_TABLE_KEYS = ("table", "rng", "strategy_state", "owner", "last_step")
_PRIORITY_KEYS = ("offsets", "current", "version", "older_p", "older_t", "staleness",
                  "n_bins", "n_updates")

#: the largest seed, as the trainer's (``_settings.MAX_SEED``, which imports this module)
_MAX_SEED = 2**32 - 1


def damaged(path: str | os.PathLike[str]) -> str:
    """How a refusal of a field of the checkpoint at ``path`` begins."""
    return f"{os.fspath(path)!r} is a damaged daskpri checkpoint"


def shown(value: Any) -> str:
    """``value`` as a message shows it: its type, and its repr cut short.

    Examples
    --------
    >>> shown("x"), shown(-3), shown(torch.zeros(2, 3)), shown([1, 2])
    ("str 'x'", 'int -3', 'a tensor of shape (2, 3)', 'a list of length 2')
    """
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of length {len(value)}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def load_weights(module: torch.nn.Module, weights: dict[str, Any]) -> str | None:
    """Load ``weights`` into ``module``; what does not match, in a line, or None.

    torch says what is missing, unexpected or of another shape in a paragraph
    of one line each; this joins them.

    Examples
    --------
    >>> load_weights(torch.nn.Linear(2, 1), {"weight": torch.zeros(1, 3)})
    'Missing key(s) in state_dict: "bias"; size mismatch for weight: copying a param with shape torch.Size([1, 3]) from checkpoint, the shape in current model is torch.Size([1, 2])'
    """  # noqa: E501
    try:
        module.load_state_dict(weights)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines()]
        said = [line.rstrip(". ") for line in lines[1:] if line] or lines[:1]
        return "; ".join(said)
    return None


class _Fields:
    """The checks of a checkpoint's values, each refusing with one line naming its field.

    Everything is checked that needs no model of the user's: the values'
    types and ranges, each table and list of the length that the others
    give, the random state, the strategy and its options, and a built-in
    model's weights against its spec. ``Trainer.resume`` checks the rest
    (the weights, optimizer state and mean gradient against the model, the
    trainer's options by its constructor, the strategy's state by selecting
    the next round from a copy of the table).
    """

    def __init__(self, path: str) -> None:
        self.damaged = damaged(path)

    def refuse(self, field: str, allowed: str, value: Any) -> NoReturn:
        raise ValueError(f"{self.damaged}: its {field} should be {allowed}, but got {shown(value)}")

    def wrong(self, what: str) -> NoReturn:
        raise ValueError(f"{self.damaged}: {what}")

    def integer(self, field: str, value: Any, least: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            self.refuse(field, "a non-negative integer" if least == 0 else
                        f"an integer of at least {least}", value)
        return value

    def check(self, state: dict[str, Any]) -> None:
        for key in ("strategy", "trainer"):  # what is read by name
            if not isinstance(state[key], dict):
                self.refuse(repr(key), "a dict", state[key])
        step = self.integer("'step'", state["step"], 0)
        for key in ("elapsed", "setup_time"):  # (setup_time: not in older checkpoints)
            value = state.get(key, 0.0)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value < 0):
                self.refuse(repr(key), "a number of seconds, at least 0", value)
        self.model(state["model"], state["model_spec"])
        self.optimizer(state["optimizer"])
        mean_grad = state["mean_grad"]
        if mean_grad is not None and not (
            isinstance(mean_grad, torch.Tensor) and mean_grad.dim() == 1
            and mean_grad.is_floating_point()
        ):
            self.refuse("'mean_grad'", "None or a 1-D tensor of floats (the running mean "
                        "gradient)", mean_grad)
        self.tensors_finite("'mean_grad'", {"mean_grad": mean_grad})
        self.strategy(state["strategy"])
        self.trainer(state["trainer"])
        self.table(state["table"])
        self.history(state["history"], step)

    def tensors_finite(self, field: str, values: dict[Any, Any]) -> None:
        for name, value in values.items():
            if (isinstance(value, torch.Tensor) and value.is_floating_point()
                    and not bool(torch.isfinite(value).all())):
                self.wrong(f"its {field} holds values that are not finite (NaN or infinity) "
                           f"in {name!r}: a run does not go on from them")

    def model(self, model: Any, spec: Any) -> None:
        weights = "a dict of tensors by name (a module's state_dict)"
        if not isinstance(model, dict):
            self.refuse("'model'", weights, model)
        for name, value in model.items():
            if not isinstance(name, str) or not isinstance(value, torch.Tensor):
                self.refuse(f"'model' entry {name!r}", "a tensor", value)
        self.tensors_finite("'model'", model)
        if spec is None:
            return  # a model of the user's: Trainer.resume loads it
        built = "None or a built-in model's spec"
        if not isinstance(spec, dict):
            self.refuse("'model_spec'", built, spec)
        if spec["name"] not in ("mlp", "cnn"):
            self.refuse("'model_spec' name", "'mlp' or 'cnn' (None: a model of the user's)",
                        spec["name"])
        sizes = {"in_shape": spec.get("in_shape"), "n_classes": spec.get("n_classes")}
        if spec["name"] == "mlp":
            sizes["hidden"] = spec.get("hidden")
        for key, value in sizes.items():
            ok = value if isinstance(value, (list, tuple)) else [value]
            if not ok or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                 for v in ok):
                many = " (a list of them)" if key == "in_shape" else ""
                self.refuse(f"'model_spec' {key!r}", f"a positive integer{many}", value)
        try:
            module = from_spec(spec)
        except (TypeError, ValueError, RuntimeError) as e:
            self.wrong(f"its 'model_spec' {spec!r} builds no model: {e}")
        mismatch = load_weights(module, model)
        if mismatch:
            self.wrong(f"its 'model' does not hold the weights of its 'model_spec' "
                       f"({spec['name']!r}): {mismatch}")

    def optimizer(self, opt: Any) -> None:
        if not isinstance(opt, dict) or not isinstance(opt.get("state"), dict) \
                or not isinstance(opt.get("param_groups"), list):
            self.refuse("'optimizer'", "an optimizer's state_dict (a dict of 'state' and "
                        "'param_groups')", opt)
        ids: list[Any] = []
        for group in opt["param_groups"]:
            if not isinstance(group, dict) or not isinstance(group.get("params"), list):
                self.refuse("'optimizer' param_groups entry", "a dict with 'params', a list",
                            group)
            ids += group["params"]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) \
                or len(set(ids)) != len(ids):
            self.refuse("'optimizer' parameters", "distinct integers", ids)
        for i, buffers in opt["state"].items():
            if i not in ids:
                self.wrong(f"its 'optimizer' holds the state of parameter {i!r}, which none "
                           f"of its param_groups lists (they list {len(ids)})")
            if not isinstance(buffers, dict):
                self.refuse(f"'optimizer' state of parameter {i}", "a dict of buffers by name",
                            buffers)
            self.tensors_finite(f"'optimizer' state of parameter {i}", buffers)

    def strategy(self, strategy: dict[str, Any]) -> None:
        name, params = strategy["name"], strategy["params"]
        if not isinstance(name, str):
            self.refuse("strategy's name", "a str", name)
        if name not in STRATEGIES:
            raise ValueError(
                f"the checkpoint's strategy {name!r} is not registered in this process: "
                f"define its class and decorate it with daskpri.register_strategy (with "
                f"name = {name!r}) before resuming"
            )
        if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
            self.refuse("strategy's 'params'", "a dict of options by name", params)
        try:
            get_strategy(name, **params)
        except (TypeError, ValueError) as e:
            self.wrong(f"its strategy's options are refused: {e}")

    def trainer(self, params: dict[str, Any]) -> None:
        unknown = [repr(k) for k in params if k not in TRAINER_PARAMS]
        if unknown:
            self.wrong(f"its 'trainer' holds {', '.join(unknown)}, which the trainer does not "
                       f"take; it takes {', '.join(TRAINER_PARAMS)}")
        for key, value in params.items():
            kind, nullable = TRAINER_PARAMS[key]
            types, allowed = _KINDS[kind]
            if value is None and nullable:
                continue
            if not isinstance(value, types) or isinstance(value, bool):
                self.refuse(f"trainer's {key!r}", allowed + (" or None" if nullable else ""),
                            value)
        # the data of a resumed `daskpri train` is drawn with it, before the trainer is made
        if not 0 <= params["seed"] <= _MAX_SEED:
            self.refuse("trainer's 'seed'", f"an integer in [0, {_MAX_SEED}]", params["seed"])

    def table(self, table: Any) -> None:
        if not isinstance(table, dict) or not isinstance(table.get("table"), dict):
            self.refuse("'table'", "the priority table's state (a dict whose 'table' is "
                        "a dict)", table)
        for key, inner in ((None, table), ("table", table["table"])):
            missing = [repr(k) for k in (_TABLE_KEYS if key is None else _PRIORITY_KEYS)
                       if k not in inner]
            if missing:
                self.wrong(f"its 'table'{'' if key is None else ' table'} has no "
                           f"{', '.join(missing)}")
        offsets = table["table"]["offsets"]
        if not (isinstance(offsets, torch.Tensor) and offsets.dim() == 1 and len(offsets) > 1
                and not offsets.is_floating_point() and int(offsets[0]) == 0
                and bool((offsets[1:] > offsets[:-1]).all())):
            self.refuse("table's 'offsets'", "a 1-D tensor of integers rising from 0 (the "
                        "partitions' bounds)", offsets)
        try:
            PriorityTable.from_state_dict(from_storable(table["table"]))
        except (ValueError, TypeError, IndexError) as e:
            self.wrong(f"in its 'table', {e}")
        try:
            np.random.default_rng().bit_generator.state = table["rng"]
        except (TypeError, ValueError, KeyError):
            self.refuse("table's 'rng'", "the state of a numpy PCG64 generator", table["rng"])
        if not isinstance(table["strategy_state"], dict):
            self.refuse("table's 'strategy_state'", "a dict", table["strategy_state"])
        owner = table["owner"]
        n = len(offsets) - 1
        if not (isinstance(owner, torch.Tensor) and tuple(owner.shape) == (n,)
                and not owner.is_floating_point() and int(owner.min()) >= 0):
            self.refuse("table's 'owner'", f"a tensor of {n} worker slots, one a partition",
                        owner)
        self.integer("table's 'last_step'", table["last_step"], -1)

    def history(self, history: Any, step: int) -> None:
        """One record a step, or a round of local steps, at its last step: rising to step - 1."""
        if not isinstance(history, list):
            self.refuse("'history'", "a list of the steps' records", history)
        steps = []
        for i, record in enumerate(history):
            at = record.get("step") if isinstance(record, dict) else None
            if not isinstance(at, int) or isinstance(at, bool):
                self.refuse(f"'history' record {i}", "a dict of a step's metrics, with its "
                            "'step'", record)
            steps.append(at)
            self.metrics(i, record)
        rising = all(a < b for a, b in zip(steps, steps[1:], strict=False))
        if not rising or (steps[-1] if steps else -1) != step - 1 or (steps and steps[0] < 0):
            held = (f"records of steps {steps[0]} to {steps[-1]}" if steps else "no records")
            self.wrong(f"its 'history' holds {held}, where its 'step' is {step}: they should "
                       f"rise to step {step - 1}, the last it took, one a step (or a round)")

    def metrics(self, i: int, record: dict[str, Any]) -> None:
        """The numbers that the history's Dataset is built of (a fit builds it at its end)."""
        def real(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for name in STEP_VARIABLES:
            value = record.get(name)
            if value is not None and not real(value):
                self.refuse(f"'history' record {i}'s {name!r}", "a number", value)
        for name in WORKER_VARIABLES:
            value = record.get(name, [])
            if not isinstance(value, (list, tuple)) or not all(real(v) for v in value):
                self.refuse(f"'history' record {i}'s {name!r}", "a list of numbers, one a "
                            "worker", value)
