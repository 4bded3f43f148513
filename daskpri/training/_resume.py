"""A run's checkpoint: what :meth:`Trainer.save` writes and :meth:`Trainer.resume` reads.

The state written (model, optimizer, table, strategy, the trainer's
parameters, the history), the trainer rebuilt from it, and the optimizer
state reshaped to the parameters it is loaded into.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from typing import TYPE_CHECKING, Any

import dask
import numpy as np
import torch
import xarray as xr
from distributed import Client
from torch import nn

from daskpri import _config
from daskpri._warnings import warn
from daskpri.data._fingerprint import data_fingerprint, fingerprint_differs
from daskpri.models import from_spec
from daskpri.replicas.optim import make_optimizer
from daskpri.strategies import get_strategy
from daskpri.table.run import TableRun
from daskpri.table.table import PriorityTable
from daskpri.training import checkpoint

if TYPE_CHECKING:
    from daskpri.training.trainer import Trainer

#: The constructor's parameters besides the model and strategy, as a
#: checkpoint keeps them for :meth:`Trainer.resume`.
INIT_PARAMS = tuple(checkpoint.TRAINER_PARAMS)


def init_params(trainer: Trainer) -> dict[str, Any]:
    """``trainer``'s :data:`INIT_PARAMS` by name, as its checkpoint keeps them."""
    return {name: getattr(trainer, name) for name in INIT_PARAMS}


def checkpoint_state(trainer: Trainer) -> dict[str, Any]:
    """The whole run, as :meth:`Trainer.save` writes it (the table read from the scheduler)."""
    assert trainer._opt is not None
    return {
        "step": trainer.step_,
        "elapsed": trainer._elapsed,
        # placing data, building replicas, warm-ups so far (not in elapsed)
        "setup_time": trainer._setup_time,
        "model": trainer.model.state_dict(),
        "model_spec": getattr(trainer.model, "spec", None),
        "optimizer": trainer._opt.state_dict(),
        "mean_grad": trainer._mean_grad,
        "strategy": {"name": trainer.strategy.name,
                     # numpy scalars as Python numbers: the file is read weights-only
                     "params": {k: v.item() if isinstance(v, np.generic) else v
                                for k, v in trainer.strategy.get_params().items()}},
        "trainer": init_params(trainer),
        "table": checkpoint.to_storable(trainer._remote.state_dict()),
        "history": trainer._recorder.records,
        # the fingerprint of the run's data (a dict of str), which resume compares
        "data": None if trainer._data_key is None else trainer._data_key[2],
        # the last fit's early stopping, which the resumed run's first fit goes on with
        "early_stopping": (trainer._watched.state_dict() if trainer._watched is not None
                           and trainer._watched.goes_on else None),
    }


#: the setting that lets a resumed run go on with data other than its own
OTHER_DATA = "trainer.resume-other-data"


def data_fingerprint_of(ds: xr.Dataset, resumed: dict[str, Any] | None) -> dict[str, str]:
    """The fingerprint of ``ds``, once it is found to be the data of the ``resumed`` run.

    ``resumed`` is a resumed trainer's ``_resume_state`` (None: the trainer
    was not resumed). Data of another sample count is refused first (the
    table's partitions are cut for the run's), then data whose fingerprint
    is not the checkpoint's. A checkpoint written before daskpri kept one
    has none: the data is then known by its sample count alone, which a
    warning says. ``daskpri.trainer.resume-other-data`` lets a run go on
    with other data of its count (labels corrected since, say): its
    table's priorities are then those of the samples it had, until they
    are recomputed.
    """
    if resumed is not None:
        n = int(resumed["table"]["table"]["offsets"][-1])
        if n != ds.sizes["sample"]:
            raise ValueError(
                f"the checkpoint's run trained on {n} samples, but the data has "
                f"{ds.sizes['sample']}: resume it with its own data"
            )
    ours = data_fingerprint(ds)
    if resumed is None or _config.get_bool(OTHER_DATA):
        return ours
    theirs = resumed.get("data")
    if theirs is None:
        warn("the checkpoint keeps no fingerprint of its run's data (it was written by an "
             "older daskpri): the data it goes on with is checked by its sample count alone")
        return ours
    differs = fingerprint_differs(theirs, ours)
    if differs is not None:
        raise ValueError(
            f"the checkpoint's run trained on other data than this, of the same sample "
            f"count: {differs}. Resume it with its own data; to go on with this data "
            f"anyway, set dask.config.set({{'daskpri.{OTHER_DATA}': True}}) (or the "
            f"environment variable DASK_DASKPRI__TRAINER__RESUME_OTHER_DATA=true)"
        )
    return ours


def resume_trainer(
    cls: type[Trainer],
    path: str | os.PathLike[str],
    model: nn.Module | None,
    client: Client | None,
    overrides: dict[str, Any],
    state: dict[str, Any] | None = None,
) -> Trainer:
    """The body of :meth:`Trainer.resume`: a ``cls`` going on from the checkpoint at ``path``.

    ``state`` is the checkpoint as :func:`~daskpri.training.checkpoint.read`
    gave it, where the caller has read it already (the command line, which
    looks at it first): the file is read once, so what was looked at is
    what goes on, even where a running fit has written it again since.
    """
    # the rest of the constructor's arguments shape the run itself: changed,
    # the resumed run would not be the checkpointed one going on
    may_change = ("n_workers", "resources", "device", "transport", "eval_every",
                  "on_nonfinite", "security", "checkpoint_path", "checkpoint_every",
                  "schedule_steps")
    fixed = sorted(set(overrides) - set(may_change))
    if fixed:
        raise ValueError(
            f"resume takes overrides of {', '.join(may_change)}, but got "
            f"{', '.join(fixed)}: the checkpoint fixes the run's strategy and its options, "
            "seed and optimization; start a new Trainer to change them"
        )
    if state is None:
        state = checkpoint.read(path)  # every field that needs no model of the user's checked
    given = model is not None
    if model is None:
        if state["model_spec"] is None:
            raise ValueError(
                "the checkpoint's model is not a built-in one: pass model=, a module of "
                "the same architecture"
            )
        model = from_spec(state["model_spec"])
    elif not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"model should be a torch.nn.Module of the checkpoint's architecture, but got "
            f"{type(model).__name__} {model!r}"
        )
    # a refusal leaves the user's module as it was (torch copies what matches
    # before it says what does not)
    kept = {k: v.detach().clone() for k, v in model.state_dict().items()} if given else None
    try:
        return _going_on(cls, path, model, client, overrides, state)
    except BaseException:
        if kept is not None:
            model.load_state_dict(kept)
        raise


def _going_on(
    cls: type[Trainer],
    path: str | os.PathLike[str],
    model: nn.Module,
    client: Client | None,
    overrides: dict[str, Any],
    state: dict[str, Any],
) -> Trainer:
    """A ``cls`` with ``model`` going on from ``state``, every field checked against the model."""
    damaged = checkpoint.damaged(path)
    mismatch = checkpoint.load_weights(model, state["model"])
    if mismatch:
        raise ValueError(f"model does not match the checkpoint's architecture: {mismatch}")
    stored = dict(state["trainer"])
    if stored.get("checkpoint_path") is not None:
        # A run that checkpointed goes on checkpointing, to the file the user named
        # here: never to a path the file itself names (a copied or downloaded
        # checkpoint would otherwise write over whatever that path holds).
        stored["checkpoint_path"] = os.fspath(path)
    if stored.get("checkpoint_path") is not None and "checkpoint_path" not in overrides:
        try:  # this machine's, not the checkpoint's: said so, with what to do
            checkpoint.check_writable(stored["checkpoint_path"], name="checkpoint_path")
        except ValueError as e:
            raise ValueError(
                f"{e}; a run that checkpointed goes on checkpointing to the file it is resumed "
                "from: pass checkpoint_path= a path to write to, or checkpoint_path=None to "
                "resume without checkpoints (to evaluate or predict)"
            ) from None
    params = dict(stored, **overrides)
    params.setdefault("precision", "float32")  # a checkpoint from before the option: its own
    if params.get("checkpoint_path") is None and "checkpoint_every" not in overrides:
        params["checkpoint_every"] = None  # resumed without checkpoints: no period either
    strategy = get_strategy(state["strategy"]["name"], **state["strategy"]["params"])
    # the run's own clipping: None there is none, whatever the config says now
    # (a checkpoint from before the option has none)
    with dask.config.set({"daskpri.trainer.max-grad-norm": None}):
        try:
            trainer = cls(model, strategy=strategy, client=client, **params)
        except (ValueError, TypeError):
            # the checkpoint's value, or an override's (or the client's): the
            # checkpoint's alone say which
            refused = _refused_options(cls, model, state, stored)
            if refused is None:
                raise
            raise ValueError(f"{damaged}: its trainer's options are refused: {refused}") from None
    _check_optimizer(damaged, trainer, state["optimizer"], state["mean_grad"])
    _check_selection(damaged, trainer, state)
    trainer.step_ = int(state["step"])
    trainer._elapsed = float(state["elapsed"])
    trainer._setup_time = float(state.get("setup_time", 0.0))  # (not in older ones)
    trainer._recorder.records = list(state["history"])
    trainer._metrics_sent = len(trainer._recorder.records)  # not sent again
    trainer._resumed_watch = _resumed_watch(damaged, trainer, state.get("early_stopping"))
    trainer._resume_state = {
        "optimizer": state["optimizer"],
        "mean_grad": state["mean_grad"],
        "table": checkpoint.from_storable(state["table"]),
        "data": state.get("data"),  # (not in older checkpoints)
    }
    return trainer


def _resumed_watch(
    damaged: str, trainer: Trainer, watched: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The checkpoint's early-stopping watch (None: none), its best weights checked."""
    best = None if watched is None else watched["best_state"]
    if best is not None:
        wrong = checkpoint.load_weights(copy.deepcopy(trainer.model), best)
        if wrong is not None:
            raise ValueError(f"{damaged}: its early stopping's best weights do not fit the "
                             f"model: {wrong}")
    return watched


def _refused_options(
    cls: type[Trainer], model: nn.Module, state: dict[str, Any], stored: dict[str, Any]
) -> Exception | None:
    """Why a trainer of the checkpoint's own options is refused, if it is."""
    strategy = get_strategy(state["strategy"]["name"], **state["strategy"]["params"])
    try:
        with warnings.catch_warnings():  # (given already, by the construction that failed)
            warnings.simplefilter("ignore")
            # (where it would checkpoint is the caller's, not the checkpoint's)
            cls(model, strategy=strategy,
                **dict(stored, checkpoint_path=None, checkpoint_every=None))
    except (ValueError, TypeError) as e:
        return e
    return None


def _check_optimizer(
    damaged: str, trainer: Trainer, saved: dict[str, Any], mean_grad: torch.Tensor | None
) -> None:
    """Refuse optimizer state (and a mean gradient) that ``trainer``'s model cannot go on from.

    The state is loaded into an optimizer of the run's kind over copies of the
    model's parameters, and compared with the state that one step of that
    optimizer makes: the same buffers, of the parameters' shapes, in
    parameter groups of the run's options. ``load_state_dict`` itself checks
    little of that, and what it lets through fails at the first step, in the
    cluster.
    """
    params = [nn.Parameter(torch.zeros_like(p)) for p in trainer.model.parameters()]
    n = sum(len(g["params"]) for g in saved["param_groups"])
    if n != len(params):
        raise ValueError(f"{damaged}: its 'optimizer' holds the state of {n} parameters, but "
                         f"the model has {len(params)}")
    options = trainer._optimizer_options()
    fresh = make_optimizer(trainer.optimizer, params, options)
    for p in params:
        p.grad = torch.zeros_like(p)
    fresh.step()
    made = [set(fresh.state[p]) for p in params]
    ids = [i for group in saved["param_groups"] for i in group["params"]]
    for position, i in enumerate(ids):  # (load_state_dict maps them in this order)
        buffers = saved["state"].get(i, {})
        if buffers and set(buffers) != made[position]:
            raise ValueError(
                f"{damaged}: its 'optimizer' holds {', '.join(map(str, sorted(buffers)))} for "
                f"parameter {i}, where the run's {trainer.optimizer} keeps "
                f"{', '.join(sorted(made[position])) or 'none'}"
            )
    opt = make_optimizer(trainer.optimizer, params, options)
    try:
        opt.load_state_dict(state_shaped_like_params(opt, saved))
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise ValueError(f"{damaged}: its 'optimizer' does not load into the run's "
                         f"{trainer.optimizer}: {e}") from None
    for group, ours in zip(opt.param_groups, fresh.param_groups, strict=True):
        for key, value in ours.items():
            if key not in ("params", "lr") and key in group and group[key] != value:
                raise ValueError(
                    f"{damaged}: its 'optimizer' has {key}={group[key]!r}, where the run's "
                    f"options give {trainer.optimizer} {key}={value!r}"
                )
    for i, p in enumerate(params):
        for name, value in opt.state.get(p, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                raise ValueError(
                    f"{damaged}: its 'optimizer' holds {name} of shape {tuple(value.shape)} "
                    f"for parameter {ids[i]}, of shape {tuple(p.shape)}"
                )
    size = sum(p.numel() for p in params)
    if mean_grad is not None and mean_grad.numel() != size:
        raise ValueError(f"{damaged}: its 'mean_grad' holds {mean_grad.numel()} values, where "
                         f"the model has {size} parameters")


def _check_selection(damaged: str, trainer: Trainer, state: dict[str, Any]) -> None:
    """Refuse a table whose selection state the run's strategy cannot go on from.

    What a strategy keeps between selections (its walks, epochs, references)
    is its own, so it is tried: the next round is selected here from a copy
    of the checkpoint's table, as the scheduler would select it at the first
    step.
    """
    table = checkpoint.from_storable(copy.deepcopy(state["table"]))
    run = TableRun(
        table=PriorityTable.from_state_dict(table["table"]),
        strategy=copy.deepcopy(trainer.strategy),
        rng=np.random.default_rng(),
        owner=np.zeros(0, dtype=np.int64),
        batch_size=trainer.batch_size,
        info={},
    )
    try:
        run.load_state_dict(table)
        run.select_round_arrays(state["step"], trainer.local_steps)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ValueError(
            f"{damaged}: its table's 'strategy_state' is not one strategy "
            f"{trainer.strategy.name!r} goes on from (selecting step {state['step']}: "
            f"{type(e).__name__}: {e})"
        ) from None


def state_shaped_like_params(opt: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an optimizer's state dict) with each buffer shaped as its parameter.

    A buffer of the parameter's size in another shape (a 1-D `CNN`'s
    momentum, ``(out, in, k)``, saved before its convolutions ran as 2-D
    ones, ``(out, in, 1, k)``) takes the parameter's shape, its values in
    the same order; ``load_state_dict`` would keep the saved shape, and the
    first step would fail.
    """
    params = [p for group in opt.param_groups for p in group["params"]]
    ids = [i for group in state["param_groups"] for i in group["params"]]
    if len(ids) != len(params):
        return state  # load_state_dict says what is wrong
    shape = {i: p.shape for i, p in zip(ids, params, strict=True)}

    def shaped(i: Any, value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and i in shape
            and value.dim() > 0
            and value.shape != shape[i]
            and value.numel() == math.prod(shape[i])
        ):
            return value.reshape(shape[i])
        return value

    return {
        **state,
        "state": {i: {k: shaped(i, v) for k, v in s.items()} for i, s in state["state"].items()},
    }
