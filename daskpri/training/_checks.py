"""Validation of the trainer's arguments and data, at the boundary.

Each check raises ``ValueError`` or ``TypeError`` naming the parameter, the
value received and what is allowed, and returns the value to keep.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import torch
import xarray as xr
from distributed import Client
from distributed.security import Security
from torch import nn

from daskpri._warnings import warn
from daskpri.data._persisted import driver_scheduler
from daskpri.data.io import check_labels, check_values, open_dataset, validate_dataset
from daskpri.strategies import Strategy
from daskpri.strategies.base import check_int
from daskpri.training import checkpoint
from daskpri.training._probe import device_counts
from daskpri.training.evaluation import EvalSet
from daskpri.training.rounds import in_whole_rounds, whole_rounds

if TYPE_CHECKING:
    from daskpri.training._inference import ChunkedEvalSet


def check_real(name: str, value: Any, low: float, high: float) -> float:
    """``value`` as a float if it is a number in ``[low, high)``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not low <= float(value) < high:
        raise ValueError(
            f"{name} should be a number in [{low:g}, {high:g}), but got {name}={value!r}"
        )
    return float(value)


def check_float(name: str, value: Any) -> float:
    """``value`` as a float if it is a positive finite number."""
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, numbers.Real)  # numpy's numbers too
        or not (math.isfinite(float(value)) and float(value) > 0)
    ):
        raise ValueError(f"{name} should be a positive finite number, but got {name}={value!r}")
    return float(value)


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> Any:
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} should be one of {choices}, but got {value!r}")
    return value


def check_types(model: Any, client: Any) -> None:
    """``model`` should be a module, ``client`` a Client or None."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model should be a torch.nn.Module, but got {type(model).__name__}")
    if client is not None and not isinstance(client, Client):
        raise TypeError(
            f"client should be a distributed.Client, but got {type(client).__name__}"
        )
    if client is not None and client.status in ("closing", "closed"):
        raise ValueError(f"client is {client.status}: give a running distributed.Client, or "
                         "none for a LocalCluster of the trainer's own")


def check_local_steps(local_steps: Any, strategy: Strategy) -> int:
    """``local_steps``, if ``strategy`` can select a round of that many steps at once."""
    local_steps = check_int("local_steps", local_steps, 1)
    if local_steps > 1 and strategy.needs_fresh_priorities:
        raise ValueError(
            f"strategy {strategy.name!r} selects by the priorities of the previous "
            f"step, which a round of local_steps={local_steps} does not refresh; "
            "use local_steps=1 with it, or a strategy that selects within the step "
            "(uniform, loss, selective-backprop, ...)"
        )
    return local_steps


def check_eval_every(eval_every: Any, configured: Any, local_steps: int) -> int:
    """The evaluation period: ``eval_every``, else ``configured`` in whole rounds.

    A run evaluates at the end of the round of ``local_steps`` in which a
    multiple of the period falls, so a period that is neither at most a
    round nor a whole number of rounds leaves some rounds' evaluations out
    (50 steps with rounds of 16: evaluations 48 steps apart, and now and
    then 64). The configured default (``daskpri.trainer.eval-every``) is
    rounded to whole rounds; an ``eval_every`` passed is kept as given,
    with a :class:`~daskpri.DaskpriWarning` naming the even period nearest.

    Examples
    --------
    >>> check_eval_every(None, 50, 1), check_eval_every(None, 50, 16), check_eval_every(32, 50, 16)
    (50, 48, 32)
    >>> check_eval_every(8, 50, 16)  # every round
    8
    """
    if eval_every is None:
        every = check_int("eval_every", configured, 1)
        return whole_rounds(every, local_steps)
    every = check_int("eval_every", eval_every, 1)
    if not in_whole_rounds(every, local_steps):
        even = whole_rounds(every, local_steps)
        warn(
            f"eval_every={every} is not a whole number of rounds of local_steps="
            f"{local_steps}: a run evaluates at the end of the round in which a multiple "
            f"of {every} falls, so the evaluations are unevenly spaced and some rounds' are "
            f"left out; pass a multiple of {local_steps} such as {even}, or {local_steps} to "
            f"evaluate every round",
        )
    return every


#: the kinds of torch device a replica trains on, those but the CPU counted by
#: ``torch.<kind>.device_count()``
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")


def check_device(device: str | None) -> str | None:
    """``device`` if it names a torch device daskpri trains on (or is None).

    Examples
    --------
    >>> check_device("cuda:1")
    'cuda:1'
    >>> check_device("meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: device should name a torch device to train on, 'cpu', ... device='meta'
    """
    if device is not None:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError, ValueError):
            kind = None
        if kind not in DEVICE_TYPES:
            raise ValueError(
                "device should name a torch device to train on, 'cpu', 'cuda', 'cuda:N', "
                f"'mps', 'xpu' or 'xpu:N', but got device={device!r}"
            )
    return device


def check_checkpoint(
    checkpoint_path: str | os.PathLike[str] | None, checkpoint_every: int | None
) -> str | None:
    """The checkpoint file as a string, checked with ``checkpoint_every``."""
    if checkpoint_every is not None:
        check_int("checkpoint_every", checkpoint_every, 1)
        if checkpoint_path is None:
            raise ValueError("checkpoint_every= needs checkpoint_path=, the file to write")
    if checkpoint_path is not None and not isinstance(checkpoint_path, (str, os.PathLike)):
        raise TypeError(
            f"checkpoint_path should be a path, but got {type(checkpoint_path).__name__}"
        )
    if checkpoint_path is None:
        return None
    path = os.fspath(checkpoint_path)
    if os.path.isdir(path):
        raise ValueError(
            f"checkpoint_path should be a file's path, but got {path!r}, which is a directory"
        )
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):  # made when the first checkpoint is written
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"checkpoint_path should be a path under directories, but got {path!r}, "
                         f"and {parent!r} is a file")
    checkpoint.check_replaceable(path)  # which probes that the directory takes a file
    return path


def check_security(
    security: Security | bool | None, client: Client | None
) -> Security | bool | None:
    """``security``, which only a cluster the trainer starts can use."""
    if security is not None and client is not None:
        raise ValueError(
            "security= applies to the LocalCluster the trainer starts; a client brings "
            "its own: Client(address, security=Security(...))"
        )
    if security is not None and not isinstance(security, (bool, Security)):
        raise TypeError(
            "security should be a distributed.security.Security or True, but got "
            f"{type(security).__name__}"
        )
    return security


def check_budget(
    max_steps: int | None,
    max_time: float | None,
    target_accuracy: float | None,
    eval_data: xr.Dataset | str | None,
    eval_chunked: bool = False,
) -> None:
    """A fit's stopping rules (one that is bound to end, each valid), and how it evaluates."""
    if max_steps is None and max_time is None:
        raise ValueError(
            "fit needs max_steps= or max_time= (target_accuracy= alone may never be reached)"
        )
    if max_steps is not None:
        check_int("max_steps", max_steps, 0)
    if max_time is not None:
        check_float("max_time", max_time)
    if target_accuracy is not None and (
        isinstance(target_accuracy, bool) or not isinstance(target_accuracy, numbers.Real)
        or not 0.0 < target_accuracy <= 1.0
    ):
        raise ValueError(
            f"target_accuracy should be a number in (0, 1], but got {target_accuracy!r}"
        )
    if target_accuracy is not None and eval_data is None:
        raise ValueError("target_accuracy= needs eval_data= to measure accuracy on")
    if not isinstance(eval_chunked, bool):
        raise TypeError(f"eval_chunked should be True or False, but got {eval_chunked!r}")
    if eval_chunked and eval_data is None:
        raise ValueError("eval_chunked=True needs eval_data= to score on the cluster")


def _eval_dims_differ(dims: tuple[Any, ...], edims: tuple[Any, ...]) -> str:
    """Why eval_data.x of data.x's per-sample shape, with other dimension names, is refused.

    xarray lines arrays up by dimension name: features of other names are
    most likely other features, and taking them by position would be a
    guess.

    >>> print(_eval_dims_differ(("pixel",), ("feature",)))  # doctest: +NORMALIZE_WHITESPACE
    eval_data.x's dimensions besides 'sample' should be data.x's ('pixel',), as xarray lines
    them up by name, but got ('feature',) of the same shape; where they are the same
    features, rename them: eval_data = eval_data.rename({'feature': 'pixel'})
    """
    renames = {e: d for e, d in zip(edims, dims, strict=True) if e != d}
    return (f"eval_data.x's dimensions besides 'sample' should be data.x's {dims}, as xarray "
            f"lines them up by name, but got {edims} of the same shape; where they are the "
            f"same features, rename them: eval_data = eval_data.rename({renames!r})")


def open_data(
    data: xr.Dataset | str, eval_data: xr.Dataset | str | None, eval_chunked: bool = False
) -> tuple[xr.Dataset, dict[str, Any], EvalSet | ChunkedEvalSet | None]:
    """A fit's training data with its summary, and its evaluation set if any (read whole
    on the driver, or with ``eval_chunked`` opened, to score on the cluster)."""
    ds = open_dataset(data, name="data")
    info = validate_dataset(ds, name="data")
    evalset = None
    if eval_data is not None:
        eds = open_dataset(eval_data, name="eval_data")
        dims, edims = ds["x"].dims[1:], eds["x"].dims[1:]
        if edims != dims and sorted(map(str, edims)) == sorted(map(str, dims)):
            # the same dimensions in another order: lined up by name, as xarray would
            eds = eds.assign(x=eds["x"].transpose("sample", *dims))
        einfo = validate_dataset(eds, name="eval_data")
        if einfo["x_shape"] == info["x_shape"] and eds["x"].dims[1:] != dims:
            raise ValueError(_eval_dims_differ(dims, edims))
        if einfo["x_shape"] != info["x_shape"]:
            named = "" if edims == dims else (
                f" (data.x's dimensions besides 'sample' are {dims}, eval_data.x's {edims})")
            raise ValueError(
                f"eval_data.x should have per-sample shape {info['x_shape']} like data.x, "
                f"but got {einfo['x_shape']}{named}"
            )
        if eval_chunked:  # scored on the cluster, the workers reading it
            from daskpri.training._inference import ChunkedEvalSet

            path = os.path.abspath(eval_data) if isinstance(eval_data, str | os.PathLike) else None
            return ds, info, ChunkedEvalSet(eds, path)
        # read here, by the driver's threads, as it is evaluated here: not by the
        # workers of a default client, which need not see the file (nor every variable)
        # (or through the client of a cluster it is persisted on)
        evalset = EvalSet(eds[["x", "y"]].compute(scheduler=driver_scheduler(eds)))
    return ds, info, evalset


def check_strategy_model(strategy: Strategy, model: nn.Module) -> None:
    """Refuse a strategy that takes per-sample gradients on a model with batch norm.

    ``torch.func`` computes each sample's gradient on a batch of one, which
    batch norm in training mode cannot normalize (and would not be the
    batch's statistics if it could).
    """
    if not strategy.per_sample_grads:
        return
    norms = [
        f"{name or 'the model'} ({type(m).__name__})"
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    if norms:
        raise ValueError(
            f"strategy {strategy.name!r} takes per-sample gradients, one sample at a time, "
            f"which batch norm cannot normalize (layer {', '.join(norms[:5])}); "
            "use a strategy that does not (uniform, loss, selective-backprop, upper-bound, "
            "infobatch), or a normalization over each sample (GroupNorm, LayerNorm)"
        )


def check_model(model: nn.Module, ds: xr.Dataset, info: dict[str, Any]) -> int:
    """Classes the labels need, checked against the model's output and the labels.

    The check runs the model in evaluation mode, so that it leaves batch
    norm's running statistics as they were, on two samples of ``data.x``
    (the rest is not read), and reads ``data.y`` (a store's chunk by
    chunk; whole only where a label is out of range, for the message):
    each label should lie in ``[0, n_classes)`` (the data's ``n_classes``
    attribute, else the model's output width). The values of an ``x`` in
    memory (a NumPy array) are checked too (finite, within float32's
    range); those of a store or a Dask array, by each worker as it loads
    its partitions.
    """
    width = model_output_width(model, ds, info)
    n_classes = info.get("n_classes")
    if n_classes is not None and width != n_classes:
        raise ValueError(
            f"the model outputs {width} classes, but data has n_classes={n_classes}"
        )
    y_max = check_label_range(ds, n_classes, "data")
    if y_max >= width:
        raise ValueError(
            f"the model outputs {width} classes, but data.y holds label {y_max}; "
            f"labels should lie in [0, {width})"
        )
    if isinstance(ds["x"].data, np.ndarray):
        # in memory here: its values checked now, not by each worker as it loads a share
        check_values(ds["x"].data, ds["y"].values, n_classes=n_classes or width, where="data")
    return width


def check_label_range(ds: xr.Dataset, n_classes: int | None, where: str) -> int:
    """The largest label of ``ds.y``, each checked to lie in ``[0, n_classes)``.

    Read here, by the driver's threads (a store's chunk by chunk, not by a
    default client's workers), and whole only where a label is out of
    range, for the message, which names its sample and ``where`` (the
    argument the data was given as).

    >>> import numpy as np, xarray as xr
    >>> check_label_range(xr.Dataset({"y": ("sample", np.array([0, 2, 1]))}), 3, "data")
    2
    """
    scheduler = driver_scheduler(ds)
    y = ds["y"]
    y_min, y_max = (int(v) for v in dask.compute(y.min(), y.max(), scheduler=scheduler))
    if y_min < 0 or (n_classes is not None and y_max >= n_classes):
        check_labels(y.compute(scheduler=scheduler).values, n_classes=n_classes, where=where)
    return y_max


def model_output_width(model: nn.Module, ds: xr.Dataset, info: dict[str, Any]) -> int:
    """The classes ``model`` outputs, found by running it on two samples of ``data.x``.

    In evaluation mode, left as it was after; float32 parameters only, as
    the data reaches the model as float32.
    """
    other = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()
                    if p.is_floating_point() and p.dtype != torch.float32})
    if other:  # the data reaches the replicas as float32
        raise ValueError(
            f"the model's parameters should be float32, as the data daskpri feeds it is, but "
            f"some are {', '.join(other)}; call model.float() (lower-precision scoring passes "
            "are a strategy's score_dtype option)"
        )
    # a store's data read here: not by the workers of a default client
    # (or through the client of a cluster it is persisted on)
    scheduler = driver_scheduler(ds)
    two = ds["x"].isel(sample=slice(0, 2)).compute(scheduler=scheduler).values
    x0 = torch.as_tensor(np.asarray(two, dtype=np.float32))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            out = model(x0)
    except Exception as e:  # its shape, its device, or the module itself: say what failed
        raise ValueError(
            f"the model could not run on two samples of data.x (per-sample shape "
            f"{info['x_shape']}, float32, on the CPU): {type(e).__name__}: {e}"
        ) from e
    finally:
        model.train(was_training)
    if out.ndim != 2:
        raise ValueError(
            "the model should output (batch, n_classes) logits, but got shape "
            f"{tuple(out.shape)}"
        )
    return int(out.shape[1])


#: what a device that names no accelerator leaves to ask for
_DEVICE_ADVICE = ("leave device unset to train on each worker's GPU where its GPU resource "
                  "names one, else on its CPU")


def _accelerator(device: str | None) -> tuple[str, int] | None:
    """The kind and index of the accelerator ``device`` names (``'cuda'``: 0); None for the CPU.

    Examples
    --------
    >>> _accelerator("cuda"), _accelerator("xpu:2"), _accelerator("cpu")
    (('cuda', 0), ('xpu', 2), None)
    """
    if device is None:
        return None
    found = torch.device(device)
    return None if found.type == "cpu" else (found.type, found.index or 0)


def _choices(kind: str, count: int) -> str:
    """The devices that ``count`` devices of ``kind`` allow, for a message.

    Examples
    --------
    >>> _choices("cuda", 0), _choices("cuda", 1), _choices("cuda", 3)
    ("'cpu'", "'cpu', 'cuda:0'", "'cpu', 'cuda:0' to 'cuda:2'")
    """
    if count == 0:
        return "'cpu'"
    return f"'cpu', '{kind}:0'" + (f" to '{kind}:{count - 1}'" if count > 1 else "")


def _built_with(kind: str) -> str:
    """What torch was built with for ``kind``, for a message."""
    if kind == "cuda":
        return f"torch {torch.__version__}, built with CUDA {torch.version.cuda}"
    return f"torch {torch.__version__}"


def check_local_device(device: str | None) -> None:
    """Refuse an accelerator ``device`` that this machine lacks, before a LocalCluster starts.

    The trainer's own LocalCluster runs its workers on this machine, with
    its devices.
    """
    found = _accelerator(device)
    if found is None:
        return
    kind, index = found
    count = device_counts((kind,))[kind]
    if index >= count:
        raise ValueError(
            f"device={device!r}, but this machine, where the trainer's LocalCluster would run "
            f"its workers, has {count} {kind.upper()} device(s) ({_built_with(kind)}): give "
            f"device {_choices(kind, count)}, or {_DEVICE_ADVICE}, or a client of a cluster "
            "whose workers have it"
        )


def check_workers_device(
    counts: Mapping[str, Mapping[str, int]], n_workers: int, device: str | None
) -> None:
    """Refuse an accelerator ``device`` that one of the run's workers lacks.

    ``counts`` are the devices of each kind of the workers that answered
    the probe before the set-up (:mod:`daskpri.training._cluster_checks`),
    of the run's ``n_workers``: a replica's setup that failed would log its
    traceback on each worker.

    Examples
    --------
    >>> check_workers_device({"tcp://a": {"cuda": 2}}, 1, "cuda:1")
    >>> check_workers_device({"tcp://a": {"cuda": 2}, "tcp://b": {"cuda": 0}}, 2, "cuda:1")
    Traceback (most recent call last):
    ValueError: device='cuda:1', but 1 of the run's 2 worker(s) lack it (tcp://b has 0 CUDA ...
    """
    found = _accelerator(device)
    if found is None or not counts:
        return
    kind, index = found
    lacking = sorted(addr for addr, c in counts.items() if index >= c[kind])
    if not lacking:
        return
    which = ", ".join(f"{addr} has {counts[addr][kind]}" for addr in lacking[:5])
    more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
    raise ValueError(
        f"device={device!r}, but {len(lacking)} of the run's {n_workers} worker(s) lack "
        f"it ({which}{more} {kind.upper()} device(s)): give device "
        f"{_choices(kind, min(c[kind] for c in counts.values()))}, or {_DEVICE_ADVICE}"
    )


def foreign_modules(classes: Any) -> list[str]:
    """The modules of ``classes`` that a worker or the scheduler must import to rebuild them.

    Less what every daskpri process has (torch, daskpri, the standard
    library's builtins) and what cloudpickle sends by value (``__main__``,
    and modules given to ``cloudpickle.register_pickle_by_value``).

    Examples
    --------
    >>> foreign_modules(type(m) for m in nn.Sequential(nn.Linear(2, 2)).modules())
    []
    """
    import cloudpickle.cloudpickle as cp

    found = set()
    for cls in classes:
        name = cls.__module__
        if name in ("__main__", "builtins", "abc") or name.split(".")[0] in ("torch", "daskpri"):
            continue
        module = sys.modules.get(name)
        if module is not None and cp._is_registered_pickle_by_value(module):
            continue
        found.add(name)
    return sorted(found)


def check_cluster_imports(
    on_workers: Mapping[str, list[str]],
    on_scheduler: list[str],
    n_workers: int,
    of_model: list[str],
    of_strategy: list[str],
    strategy: Strategy,
) -> None:
    """Refuse a model or strategy of classes that the cluster cannot import.

    A model of layers from a module on the driver's path only (a script or
    notebook's ``mymodel.py``) unpickles on a LocalCluster's workers, which
    start with the driver's ``sys.path``, but not on a ``dask worker``
    started elsewhere: the replicas' setup would fail there with each
    worker's traceback and a bare ``No module named 'mymodel'``. A
    strategy's class goes to the workers and to the scheduler (the table).
    ``of_model`` and ``of_strategy`` are the modules of the model's and the
    strategy's classes (:func:`foreign_modules`); ``on_workers`` those that
    each worker that answered the probe before the set-up
    (:mod:`daskpri.training._cluster_checks`) of the run's ``n_workers``
    cannot import, ``on_scheduler`` those that the scheduler cannot.

    Examples
    --------
    >>> from daskpri.strategies import get_strategy
    >>> check_cluster_imports({"tcp://a": ["mynet"], "tcp://b": []}, [], 2, ["mynet"], [],
    ...                       get_strategy("uniform"))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ValueError: classes of module(s) 'mynet' (the model's layers) cannot be imported by 1 of
    the run's 2 worker(s) (tcp://a): install it where they run, or have it sent ...
    """
    missing = {addr: m for addr, m in on_workers.items() if m}
    where = [] if not missing else [
        f"{len(missing)} of the run's {n_workers} worker(s) ("
        + ", ".join(sorted(missing)[:5])
        + (f" and {len(missing) - 5} more" if len(missing) > 5 else "") + ")"]
    if on_scheduler:
        missing["the scheduler"] = on_scheduler
        where.append("the scheduler")
    if not missing:
        return
    modules = sorted({m for ms in missing.values() for m in ms})
    what = []
    if set(modules) & set(of_model):
        what.append("the model's layers")
    if set(modules) & set(of_strategy):
        what.append(f"the strategy's class {type(strategy).__qualname__}")
    files = [getattr(sys.modules.get(m), "__file__", None) for m in modules]
    upload = (f"client.upload_file({files[0]!r})" if len(modules) == 1
              and files[0] and files[0].endswith(".py") else "")
    top = modules[0].split(".")[0]
    # a strategy travels inside the steps' tasks, which distributed pickles by
    # reference whatever cloudpickle's registry says: only the model goes by value
    by_value = "" if set(modules) & set(of_strategy) else (
        f", or have it sent with the model: import cloudpickle, {top}; "
        f"cloudpickle.register_pickle_by_value({top})")
    raise ValueError(
        f"classes of module(s) {', '.join(map(repr, modules))} ({', '.join(what)}) cannot be "
        f"imported by {' and '.join(where)}: install it where they run"
        + (f", or send it with {upload}" if upload else "") + by_value
    )
