"""The checks of a checkpoint's fields, each refusing with one line naming its field.

:func:`daskpri.training.checkpoint.read` runs :class:`_Fields` on every
checkpoint it reads; ``Trainer.resume`` uses :func:`damaged`,
:func:`load_weights` and :data:`TRAINER_PARAMS` for the checks that need the
user's model.
"""

from __future__ import annotations

import math
import os
from typing import Any, NoReturn

import numpy as np
import torch

from daskpri.data._fingerprint import KEYS as FINGERPRINT_KEYS
from daskpri.models import from_spec
from daskpri.strategies import STRATEGIES, get_strategy
from daskpri.table.table import PriorityTable
from daskpri.training.early_stopping import state_problem
from daskpri.training.history import STEP_VARIABLES, WORKER_VARIABLES


def from_storable(obj: Any) -> Any:
    """Invert :func:`to_storable` for the table's state (tensors back to numpy)."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: from_storable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_storable(v) for v in obj]
    return obj


#: The trainer's parameters that a checkpoint keeps (those of ``Trainer.__init__``
#: but the model, strategy, client and security), each with the kind of value it
#: holds and whether it may be None. ``read`` checks the kinds; ``Trainer.resume``
#: passes the values to the constructor, whose checks refuse what is out of range.
TRAINER_PARAMS: dict[str, tuple[str, bool]] = {
    "seed": ("int", False), "n_workers": ("int", True), "resources": ("dict", True),
    "batch_size": ("int", False), "learning_rate": ("real", False),
    "momentum": ("real", False), "weight_decay": ("real", False),
    "max_grad_norm": ("real", True), "label_smoothing": ("real", False),
    "precision": ("str", False),
    "optimizer": ("str", False),
    "lr_schedule": ("str", False), "schedule_steps": ("int", True),
    "warmup_steps": ("int", False),
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
        self.data(state.get("data"))  # (not in older checkpoints)
        watched = state.get("early_stopping")  # (the same)
        why = None if watched is None else state_problem(watched)
        if why is not None:
            self.wrong(f"its 'early_stopping' (the watch of the fit it was written in) {why}")
        if watched is not None:
            self.tensors_finite("early stopping's best weights", watched["best_state"] or {})
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

    def data(self, data: Any) -> None:
        """The fingerprint of the run's data, which ``resume`` compares with the data given."""
        if data is not None and not (
            isinstance(data, dict) and set(data) == set(FINGERPRINT_KEYS)
            and all(isinstance(v, str) for v in data.values())
        ):
            self.refuse("'data'", "None or the fingerprint of the run's data (a dict of str "
                        f"by key: {', '.join(map(repr, FINGERPRINT_KEYS))})", data)

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
