"""Early stopping: a fit that ends once its evaluations stop improving, and its best model.

:class:`EarlyStopping` is the rule, as Keras' and PyTorch Lightning's
callbacks of that name and skorch's state it: the measure it watches on
``eval_data`` (``monitor``), how much a better figure must gain
(``min_delta``), how many evaluations without one end the fit
(``patience``), and whether the fit ends with the best evaluation's weights
(``restore_best``). :class:`Watch` applies it to one fit: the fit hands it
each evaluation, and it says when to stop and keeps a copy of the best
weights.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from daskpri._choices import MONITORS
from daskpri.strategies._checks import check_int, check_number

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class EarlyStopping:
    """End a fit once ``monitor`` has not improved for ``patience`` evaluations.

    Passed to :meth:`~daskpri.Trainer.fit` as ``early_stopping=`` (an
    ``int`` there is ``EarlyStopping(patience=that)``). The fit evaluates
    ``eval_data`` every ``eval_every`` steps; an evaluation improves where
    its ``monitor`` beats the best of this fit's so far by more than
    ``min_delta``, and ``patience`` evaluations in a row that do not end it
    (as Keras' ``EarlyStopping`` counts epochs). A figure that is not finite
    (a loss that diverged) never improves. As ``max_steps`` and the
    history go on from fit to fit, so does the watch: a fit given the same
    rule as the trainer's last fit goes on with its best evaluation, the
    evaluations since and its best weights, unless that fit was ended by
    ``patience`` or put its best weights back; then, or with another rule,
    it watches afresh. A checkpoint keeps the watch, and the first fit of
    a trainer resumed from it goes on with it likewise (with another rule,
    or none, it says that it watches afresh).

    Parameters
    ----------
    patience : int, default 5
        Evaluations in a row without improvement that end the fit (at least 1).
    monitor : {"accuracy", "eval_loss"}, default "accuracy"
        The figure of ``eval_data`` watched: higher is better for
        ``"accuracy"``, lower for ``"eval_loss"``. Accuracy, the figure
        ``target_accuracy`` and ``daskpri bench`` measure, is the default:
        the strategies that train on the hardest samples may raise the
        held-out loss (more confident mistakes) while the accuracy still
        climbs.
    min_delta : float, default 0.0
        The least gain that counts as an improvement (0 or more, in the
        monitor's units).
    restore_best : bool, default False
        Where the fit ends, whatever ended it (``patience``, its budget,
        ``target_accuracy``, :meth:`~daskpri.Trainer.stop` or an
        interrupt), put the weights (and buffers) of its best evaluation
        back into the model, as Keras' ``restore_best_weights``. The
        optimizer's state, the priorities and ``step_`` stay those of the
        last step; the checkpoint written as the fit ends holds the
        restored weights. The driver keeps a copy of the model for it.

    Raises
    ------
    ValueError
        If a value is out of its range, or ``monitor`` is not one of
        :data:`daskpri._choices.MONITORS`.
    TypeError
        If ``restore_best`` is not a bool.

    Notes
    -----
    After such a fit, the trainer's ``best_step_`` and ``best_score_`` are
    the step and figure of its best evaluation, and ``stopped_step_`` the
    step at which ``patience`` ended it (``None`` where something else
    did); the history's attributes ``early_stopping``, ``best_step`` and
    ``stopped_step`` (-1: not by patience) say the same.

    Examples
    --------
    >>> from daskpri import EarlyStopping
    >>> EarlyStopping(patience=3, monitor="eval_loss", restore_best=True)
    EarlyStopping(patience=3, monitor='eval_loss', min_delta=0.0, restore_best=True)
    >>> EarlyStopping(patience=0)
    Traceback (most recent call last):
        ...
    ValueError: patience should be a positive integer, but got patience=0
    >>> trainer.fit(train, eval_data=test, max_steps=5000,  # doctest: +SKIP
    ...             early_stopping=EarlyStopping(patience=5, restore_best=True))
    """

    patience: int = 5
    monitor: str = "accuracy"
    min_delta: float = 0.0
    restore_best: bool = False

    def __post_init__(self) -> None:
        # the package's own checks, and their message: "patience should be a positive
        # integer, but got patience=0"
        object.__setattr__(self, "patience", check_int("patience", self.patience, 1))
        allowed = tuple(MONITORS)  # (a tuple: an unhashable monitor is refused, not raised on)
        if self.monitor not in allowed:
            raise ValueError(f"monitor should be one of {', '.join(map(repr, allowed))}, but "
                             f"got monitor={self.monitor!r}")
        object.__setattr__(self, "min_delta", check_number("min_delta", self.min_delta, 0.0))
        if not isinstance(self.restore_best, bool):  # (a TypeError, as fit's eval_chunked's)
            raise TypeError(f"restore_best should be True or False, but got "
                            f"restore_best={self.restore_best!r}")

    @classmethod
    def from_argument(cls, value: Any) -> EarlyStopping | None:
        """``fit``'s ``early_stopping=``: ``None``, an :class:`EarlyStopping`, or an int patience.

        >>> EarlyStopping.from_argument(4)
        EarlyStopping(patience=4, monitor='accuracy', min_delta=0.0, restore_best=False)
        >>> EarlyStopping.from_argument("4")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
            ...
        TypeError: early_stopping should be None, an int (the patience) or a ..., but got '4'
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            if value < 1:
                raise ValueError("early_stopping should be None, a patience of at least 1 or "
                                 f"a daskpri.EarlyStopping, but got {value!r}")
            return cls(patience=int(value))
        raise TypeError(
            "early_stopping should be None, an int (the patience) or a daskpri.EarlyStopping, "
            f"but got {value!r}"
        )

    def improves(self, score: float, best: float | None) -> bool:
        """Whether ``score`` beats ``best`` (``None``: none yet) by more than ``min_delta``.

        >>> rule = EarlyStopping(monitor="eval_loss", min_delta=0.01)
        >>> rule.improves(0.5, None), rule.improves(0.495, 0.5), rule.improves(0.48, 0.5)
        (True, False, True)
        >>> rule.improves(float("nan"), None)
        False
        """
        if not math.isfinite(score):
            return False
        if best is None:
            return True
        if MONITORS[self.monitor] == "max":
            return score > best + self.min_delta
        return score < best - self.min_delta


class Watch:
    """One fit's :class:`EarlyStopping`: its best evaluation so far, and those since.

    Parameters
    ----------
    rule : EarlyStopping
        What to watch, and when to stop.

    Examples
    --------
    >>> from torch import nn
    >>> model = nn.Linear(2, 2)
    >>> watch = Watch(EarlyStopping(patience=2, restore_best=True))
    >>> [watch.update(step, {"accuracy": acc}, model) for step, acc in
    ...  [(9, 0.5), (19, 0.7), (29, 0.6), (39, 0.7)]]
    [False, False, False, True]
    >>> watch.best_step, watch.best_score, watch.stopped_step
    (19, 0.7, 39)
    """

    def __init__(self, rule: EarlyStopping) -> None:
        self.rule = rule
        self.best_step: int | None = None
        self.best_score: float | None = None
        #: evaluations since the best one
        self.waited = 0
        #: the step at which ``patience`` ran out (None: it has not)
        self.stopped_step: int | None = None
        #: the step whose weights :meth:`restore` put back (None: none)
        self.restored_step: int | None = None
        self._best_state: dict[str, Any] | None = None

    def update(self, step: int, record: dict[str, Any], model: nn.Module | None, *,
               last: bool = False) -> bool:
        """Take the evaluation in ``record`` (after ``step``, of ``model``); whether to stop.

        ``last``: the evaluation of a fit that ends anyway (its budget
        spent), which may be its best but is not said to be ended by
        ``patience``.
        """
        score = float(record.get(self.rule.monitor, math.nan))
        if self.rule.improves(score, self.best_score):
            self.best_step, self.best_score, self.waited = step, score, 0
            if self.rule.restore_best:
                assert model is not None
                self._best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return False
        self.waited += 1
        if self.waited >= self.rule.patience and self.stopped_step is None and not last:
            self.stopped_step = step
        return self.stopped_step is not None

    def restore(self, model: nn.Module, step: int) -> bool:
        """Put the best evaluation's weights back into ``model`` (now at ``step``); whether it did.

        Nothing to do where ``restore_best`` is off, no evaluation was
        finite, or the best is the model as it is.
        """
        if self._best_state is None or self.best_step == step:
            return False
        model.load_state_dict(self._best_state)
        self.restored_step = self.best_step
        return True

    @property
    def goes_on(self) -> bool:
        """Whether a next fit of the same rule goes on with this watch: it has not ended its fit
        (``patience`` run out) nor put the best weights back."""
        return self.stopped_step is None and self.restored_step is None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it (where it :attr:`goes_on`), for a resumed run.

        >>> watch = Watch(EarlyStopping(patience=3))
        >>> watch.update(9, {"accuracy": 0.5}, None), watch.update(19, {"accuracy": 0.4}, None)
        (False, False)
        >>> state = watch.state_dict()
        >>> again = Watch(EarlyStopping(patience=3))
        >>> again.load_state_dict(state)
        >>> again.best_step, again.best_score, again.waited
        (9, 0.5, 1)
        """
        return {"rule": dataclasses.asdict(self.rule), "best_step": self.best_step,
                "best_score": self.best_score, "waited": self.waited,
                "best_state": self._best_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict`'s (of a watch of the same rule, checked by the caller)."""
        self.best_step, self.best_score = state["best_step"], state["best_score"]
        self.waited, self._best_state = state["waited"], state["best_state"]

    def attrs(self) -> dict[str, Any]:
        """What the history's attributes say of this watch (netCDF-storable)."""
        return {
            "early_stopping": repr(self.rule),
            "monitor": self.rule.monitor,
            "best_step": -1 if self.best_step is None else self.best_step,
            "stopped_step": -1 if self.stopped_step is None else self.stopped_step,
            "restored_step": -1 if self.restored_step is None else self.restored_step,
        }


#: the keys of :meth:`Watch.state_dict`
STATE_KEYS = ("rule", "best_step", "best_score", "waited", "best_state")


def state_problem(state: Any) -> str | None:
    """What is wrong with ``state`` as a :meth:`Watch.state_dict` (None: nothing).

    A checkpoint keeps one; :func:`daskpri.training.checkpoint.read` refuses
    a checkpoint whose watch this finds wrong, saying what.

    >>> state_problem(Watch(EarlyStopping()).state_dict()) is None
    True
    >>> state_problem({"rule": {"patience": 0}, "best_step": None, "best_score": None,
    ...                "waited": 0, "best_state": None})  # doctest: +ELLIPSIS
    'its rule is refused: patience should be a positive integer, but got patience=0'
    """
    if not isinstance(state, dict) or set(state) != set(STATE_KEYS):
        return f"should be a dict of the keys {', '.join(map(repr, STATE_KEYS))}"
    if not isinstance(state["rule"], dict):
        return "its rule should be a dict of EarlyStopping's fields"
    try:
        rule = EarlyStopping(**state["rule"])
    except (TypeError, ValueError) as e:
        return f"its rule is refused: {e}"
    step, score, waited = state["best_step"], state["best_score"], state["waited"]
    if (step is None) != (score is None):
        return "its best_step and best_score should both be None (no evaluation) or neither"
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        return f"its best_step should be a step (an integer of 0 or more), but got {step!r}"
    if score is not None and (not isinstance(score, float) or not math.isfinite(score)):
        return f"its best_score should be a finite float, but got {score!r}"
    # (at most the patience: a fit whose last evaluation, at the end of its budget, used it
    # up was ended by the budget, and the next fit of the rule stops at its first evaluation
    # that does not improve)
    if (not isinstance(waited, int) or isinstance(waited, bool)
            or not 0 <= waited <= rule.patience):
        return (f"its waited should be an integer in [0, {rule.patience}] (the evaluations "
                f"since the best, within the patience), but got {waited!r}")
    best = state["best_state"]
    if best is None:
        if rule.restore_best and step is not None:
            return "its best_state should hold the best weights, as its rule restores them"
        return None
    if not isinstance(best, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in best.items()
    ):
        return "its best_state should be None or a dict of tensors by name (a state_dict)"
    return None
