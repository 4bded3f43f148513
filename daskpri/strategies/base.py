"""The strategy interface: what to process next, and what to compute on it.

A strategy has two halves, both small:

- :meth:`Strategy.select` runs where the priority table lives (inside the
  scheduler). It is a pure function of the table's arrays, the step and an
  injected random generator, and returns one :class:`Selection` per worker
  slot: the samples whose gradient enters the update (with importance
  weights where the strategy is unbiased) and the samples whose priority is
  only refreshed.
- :meth:`Strategy.compute` runs on a worker, on the selected samples, with
  the worker's :class:`~daskpri.replicas.replica.Replica`, and returns the
  gradient sum and the fresh priorities.
"""

from __future__ import annotations

import abc
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from daskpri.replicas.replica import Replica
from daskpri.table.table import PriorityTable

_EMPTY = np.empty(0, dtype=np.int64)


class NotAhead(Exception):
    """A selection made ahead would read priorities the table does not hold yet.

    The table then takes the selection back and the driver selects the round
    once the round in flight has returned its priorities.
    """


@dataclass
class Selection:
    """The samples one worker processes in a step (global indices)."""

    #: samples whose gradient enters the update
    train: np.ndarray
    #: importance weights of ``train`` (``None``: all ones)
    weights: np.ndarray | None = None
    #: samples whose priority is recomputed without entering the update
    score: np.ndarray = field(default_factory=lambda: _EMPTY)
    #: extra arrays the worker half needs (for example a loss distribution)
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def concat_selections(selections: Sequence[Selection]) -> dict[str, Any]:
    """One worker's selections of a round's steps as a few concatenated arrays.

    ``train``: every step's train rows (``n_train`` of each); ``score`` and
    ``n_score`` likewise; ``weights``: the weighted steps' weights
    (``weighted`` marks them); ``extra``: each step's extras, ``[]`` where
    none has any. The table sends a round so, and the workers' shares are
    cut from it.

    Examples
    --------
    >>> a = concat_selections([Selection(train=np.array([3, 1])), Selection(train=np.array([2]))])
    >>> a["train"].tolist(), a["n_train"].tolist(), a["extra"]
    ([3, 1, 2], [2, 1], [])
    """
    return {
        "train": _cat([s.train for s in selections], np.int64),
        "n_train": np.array([s.train.size for s in selections], dtype=np.int64),
        "score": _cat([s.score for s in selections], np.int64),
        "n_score": np.array([s.score.size for s in selections], dtype=np.int64),
        "weighted": np.array([s.weights is not None for s in selections], dtype=bool),
        "weights": _cat([s.weights for s in selections if s.weights is not None], np.float64),
        "extra": [s.extra for s in selections] if any(s.extra for s in selections) else [],
    }


def _cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype)


class TrainRound(Sequence[list[Selection]]):
    """A round of train-only selections of one batch size, kept as rows.

    What :meth:`Strategy.select_round` may return where each step trains a
    batch per slot and scores nothing (``uniform``): a sequence of steps,
    each a list of one :class:`Selection` per slot, built when indexed; the
    table packs a slot's steps from :meth:`slot_arrays` without building
    them (a round of 512 steps on 2 workers would build 1,024).

    Parameters
    ----------
    batches : list of numpy.ndarray
        One ``(count, size)`` array per slot: the train rows of each step.

    Examples
    --------
    >>> r = TrainRound([np.array([[0, 1], [2, 3]]), np.array([[8, 9], [6, 7]])])
    >>> len(r), r.n_slots, r[1][1].train.tolist()
    (2, 2, [6, 7])
    >>> a = r.slot_arrays(1)
    >>> a["train"].tolist(), a["n_train"].tolist()
    ([8, 9, 6, 7], [2, 2])
    >>> all(np.array_equal(a[k], v) for k, v in concat_selections([s[1] for s in r]).items()
    ...     if k != "extra")
    True
    """

    def __init__(self, batches: list[np.ndarray]) -> None:
        self._batches = [np.asarray(b, dtype=np.int64) for b in batches]

    @property
    def n_slots(self) -> int:
        return len(self._batches)

    def __len__(self) -> int:
        return self._batches[0].shape[0] if self._batches else 0

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"step {i} of a round of {len(self)}")
        return [Selection(train=b[i]) for b in self._batches]

    def slot_arrays(self, slot: int) -> dict[str, Any]:
        """Slot ``slot``'s steps as :func:`concat_selections` gives them."""
        b = self._batches[slot]
        count, size = b.shape
        return {
            "train": b.ravel(),
            "n_train": np.full(count, size, dtype=np.int64),
            "score": np.empty(0, dtype=np.int64),
            "n_score": np.zeros(count, dtype=np.int64),
            "weighted": np.zeros(count, dtype=bool),
            "weights": np.empty(0, dtype=np.float64),
            "extra": [],
        }


@dataclass
class SelectContext:
    """What :meth:`Strategy.select` sees of the table and the cluster."""

    table: PriorityTable
    #: global sample indices held by each worker slot
    groups: list[np.ndarray]
    #: worker slot of each partition
    owner: np.ndarray
    step: int
    batch_size: int
    rng: np.random.Generator
    #: the strategy's own state, kept with the table and checkpointed with it
    state: dict[str, Any]
    #: where a round is selected ahead, a mask over the samples of the round
    #: the workers are computing, whose priorities the table does not hold yet
    inflight: np.ndarray | None = None

    def check_ahead(self, indices: np.ndarray) -> None:
        """Raise :class:`NotAhead` if a priority of ``indices`` is in flight.

        A strategy that selects ahead (:attr:`Strategy.selects_ahead`) calls
        it before it reads the priorities of ``indices``.
        """
        if self.inflight is not None and indices.size and self.inflight[indices].any():
            raise NotAhead(f"{int(self.inflight[indices].sum())} of the samples read are in flight")

    def candidates(self, slot: int) -> np.ndarray | slice:
        """The samples of ``slot``: a slice when they are contiguous (fast path)."""
        group = self.groups[slot]
        if group.size and int(group[-1]) - int(group[0]) + 1 == group.size:
            # groups are sorted and unique, so this span is exactly the group
            return slice(int(group[0]), int(group[-1]) + 1)
        return group

    def owner_of(self, indices: np.ndarray) -> np.ndarray:
        """The worker slot holding each of ``indices``."""
        return self.owner[self.table.partition_of(indices)]


@dataclass
class Batch:
    """The selected samples as a worker sees them, on its device."""

    x: torch.Tensor
    y: torch.Tensor
    #: global indices of the rows of ``x``
    indices: np.ndarray
    #: the first ``n_train`` rows are ``Selection.train``, the rest ``score``
    n_train: int
    weights: torch.Tensor | None
    mean_grad: torch.Tensor | None
    extra: dict[str, np.ndarray]
    #: the generator of the worker half's random choices, or the seed it is
    #: made from on first use (most steps draw nothing)
    seed: np.random.Generator | Sequence[int]
    #: the worker derives the losses, loss sum and hits of this step from its
    #: logits later, for a whole round at once: :meth:`Strategy.compute` may
    #: return a :class:`Computed` that carries ``logits`` instead
    defer: bool = False

    @property
    def rng(self) -> np.random.Generator:
        """The generator of the worker half's random choices."""
        if not isinstance(self.seed, np.random.Generator):
            self.seed = np.random.default_rng(list(self.seed))
        return self.seed


@dataclass
class Computed:
    """What a worker returns for its batch."""

    #: ``sum_i w_i grad L_i`` over the samples backpropagated (flat, on the
    #: device); ``None`` when :meth:`Replica.weighted_grad` left it in the
    #: module's ``.grad`` (the replica's ``keep_grads`` mode, for local steps)
    grad: torch.Tensor | None
    #: how many samples the gradient sums (the driver divides by the total)
    n_grad: int
    #: rows of the batch whose priority was computed (``None``: all rows, in
    #: order), and the priorities
    rows: np.ndarray | None
    #: numbers, or a tensor on the device: the worker converts a round's
    #: tensors at once at its end (each conversion on its own costs a step time)
    priorities: np.ndarray | torch.Tensor | None
    #: the loss summed over the ``n_loss`` train rows (number or 0-d tensor)
    loss_sum: float | torch.Tensor | None
    n_loss: int
    #: train rows predicted right (number or 0-d tensor)
    correct: int | torch.Tensor | None
    #: deferred (:attr:`Batch.defer`): the logits of every row (detached),
    #: whose cross-entropy losses are the priorities; ``priorities``,
    #: ``loss_sum`` and ``correct`` are then None, and the worker computes them
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None


class Strategy(abc.ABC):
    """Base class of the priority strategies.

    Subclasses set ``name``, store their parameters in ``__init__`` (validating
    them) and implement :meth:`select`; :meth:`compute` defaults to the
    weighted gradient of the train rows with the per-sample losses as
    priorities.
    """

    name: ClassVar[str] = ""
    #: the combined gradient is an unbiased estimate of the full gradient
    unbiased: ClassVar[bool] = False
    #: the training samples are drawn over the whole dataset, importance-weighted
    #: (``loss``): a worker's share of a step's draws varies, so a local step
    #: divides its weighted sum by the draws a worker expects (the batch size),
    #: not by those it got, and the workers' mean after a step is the driver's
    #: unbiased one
    draws_globally: ClassVar[bool] = False
    #: the driver keeps a running mean gradient and ships it with the weights
    uses_mean_grad: ClassVar[bool] = False
    #: how much of the running mean gradient stays at each step (its
    #: exponential decay; a strategy with ``uses_mean_grad`` may take it as
    #: an option, as ``projection`` does)
    mean_grad_decay: float = 0.9
    #: selection reads the priorities of the previous step (top-k): it cannot
    #: select several steps at once for a round of local steps
    needs_fresh_priorities: ClassVar[bool] = False
    #: :meth:`compute` takes per-sample gradients (``torch.func.vmap``, one
    #: sample at a time): modules that normalize over the batch cannot
    per_sample_grads: ClassVar[bool] = False
    #: :meth:`select` reads the table (priorities, versions). ``False`` lets the
    #: driver select the next round while the workers compute this one, before
    #: this round's priorities reach the table.
    reads_table: bool = True
    #: precision of the forward-only passes that score samples without
    #: training on them (a key of :data:`SCORE_DTYPES`); the strategies
    #: that score a presample take it as an option
    score_dtype: str = "float32"
    #: :meth:`select` reads the table, but may still select the next round
    #: while the workers compute this one: it calls
    #: :meth:`SelectContext.check_ahead` on the samples whose priorities it
    #: reads (which raises :class:`NotAhead` where one is in flight), so that a
    #: round selected ahead is the round selected after. Reads of the table as
    #: a whole (a distribution of its priorities) see it without the round in
    #: flight.
    selects_ahead: bool = False

    @abc.abstractmethod
    def select(self, ctx: SelectContext) -> list[Selection]:
        """One :class:`Selection` per worker slot of ``ctx.groups``."""

    def select_round(
        self, ctx: SelectContext, count: int
    ) -> Sequence[list[Selection]] | None:
        """The selections of ``count`` steps from ``ctx.step`` at once, or None.

        An optional shortcut for a round of local steps: it must give what
        :meth:`select` gives step by step (and leave the same random state
        and strategy state): a list of steps, or a :class:`TrainRound`.
        ``None`` (the default): the table calls :meth:`select` once a step.
        """
        return None

    def begin_round(self, ctx: SelectContext) -> None:
        """Called by the table before it selects a round (its steps from ``ctx.step``).

        A hook for strategies whose walk depends on where rounds begin
        (:func:`mark_round`); the default does nothing.
        """
        return None

    def priority(self, losses: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The priorities the table keeps for rows with these losses and logits.

        Called on the worker, for every row a step forwards (trained or
        scored only). The default: the per-sample losses. A strategy that
        ranks by another score of the forward pass (``selective-backprop``'s
        ``score="entropy"``) returns it here, so that its plain and stale
        steps fill the table with what its fresh steps rank by.
        """
        return losses

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        """Gradient of the train rows; losses of all rows as priorities."""
        n, rows = batch.n_train, batch.x.shape[0]
        x, y = (batch.x, batch.y) if n == rows else (batch.x[:n], batch.y[:n])
        if batch.defer and batch.weights is None:
            grad, logits = replica.grad_and_logits(x, y)
            if rows > n:
                scored = replica.logits(batch.x[n:], SCORE_DTYPES[self.score_dtype])
                logits = torch.cat([logits, scored])
            return Computed(
                grad=grad,
                n_grad=n,
                rows=None,
                priorities=None,
                loss_sum=None,
                n_loss=n,
                correct=None,
                logits=logits,
                labels=batch.y,
            )
        grad, losses, logits = replica.weighted_grad(x, y, batch.weights)
        priorities = self.priority(losses, logits)
        if rows > n:
            score_losses, score_logits = replica.losses(
                batch.x[n:], batch.y[n:], SCORE_DTYPES[self.score_dtype]
            )
            priorities = torch.cat([priorities, self.priority(score_losses, score_logits)])
        return Computed(
            grad=grad,
            n_grad=n,
            rows=None,
            priorities=priorities,
            loss_sum=losses.sum(),
            n_loss=n,
            correct=(logits.argmax(1) == y).sum(),
        )

    def gradients_per_step(self, batch_size: int, samples: int) -> int:
        """Samples one worker backpropagates per step (in expectation).

        ``batch_size`` is the trainer's; ``samples`` the worker's sample
        count. Benchmarks give the uniform baseline this many gradients, so
        a strategy that computes more is compared at equal gradient budget.
        """
        own = getattr(self, "batch_size", None)
        return int(own or batch_size)

    def get_params(self) -> dict[str, Any]:
        """The strategy's parameters, as given to ``__init__``.

        Those of its ``__init__``'s arguments that it keeps as attributes of
        the same name, as scikit-learn's estimators do: a checkpoint stores
        them, and a resumed run passes them to ``__init__`` again, so other
        attributes (counters, caches) are left out. An ``__init__`` taking
        ``**options`` gives every public attribute.
        """
        params = inspect.signature(type(self)).parameters.values()
        public = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return public
        names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return {k: public[k] for k in names if k in public}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"


#: The precisions a strategy's forward-only scoring passes may run in.
SCORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_score_dtype(value: Any) -> str:
    """``value`` if it names a scoring precision of :data:`SCORE_DTYPES`."""
    if not isinstance(value, str) or value not in SCORE_DTYPES:
        raise ValueError(
            f"score_dtype should be one of {', '.join(map(repr, SCORE_DTYPES))}, "
            f"but got score_dtype={value!r}"
        )
    return value


def check_fraction(name: str, value: float, *, low_open: bool = False) -> float:
    """``value`` if it is a number in [0, 1] ((0, 1] with ``low_open``)."""
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok:
        ok = (0.0 < value <= 1.0) if low_open else (0.0 <= value <= 1.0)
    if not ok:
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name} should be a number in {interval}, but got {name}={value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a bool if it is one (a NumPy bool too).

    Examples
    --------
    >>> check_bool("flag", np.True_)
    True
    >>> check_bool("flag", "no")
    Traceback (most recent call last):
    ...
    ValueError: flag should be True or False, but got flag='no'
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} should be True or False, but got {name}={value!r}")
    return bool(value)


def check_number(name: str, value: Any, low: float, *, low_open: bool = False) -> float:
    """``value`` if it is a finite number ``>= low`` (``> low`` with ``low_open``)."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and (value > low if low_open else value >= low)):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise ValueError(f"{name} should be a finite number {bound}, but got {name}={value!r}")
    return float(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int if it is an integer (not a bool) of at least ``minimum``.

    The one integer check of the package (``daskpri.training._checks``
    re-exports it; it lives here, which the training modules import).
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} should be {kind}, but got {name}={value!r}")
    return int(value)


def check_positive_int(name: str, value: int | None, *, allow_none: bool = True) -> int | None:
    """``value`` if it is a positive integer (or None where allowed)."""
    if value is None and allow_none:
        return None
    return check_int(name, value, 1)


def epoch_batches(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """The next ``size`` samples of ``slot`` in a shuffled pass over its data.

    Each slot walks a permutation of its samples (a new one each epoch), as
    mini-batch SGD does; the permutation is strategy state, so a resumed run
    continues it.
    """
    perm = _walk(ctx, slot)  # begun even for a draw of none, as the random stream expects
    group = ctx.groups[slot]
    take = min(size, group.size)
    pos = ctx.state["pos"]
    if 0 < take <= perm.size - pos[slot]:  # within the pass: most steps, one slice
        start = pos[slot]
        pos[slot] = start + take
        batch = group[perm[start : start + take]]
        batch.sort()
        return batch
    out = []
    while take > 0:  # across the end of a pass into the next
        out.append(walk_next(ctx, slot, take))
        take -= out[-1].size
    return np.sort(np.concatenate(out)) if out else _EMPTY


def epoch_rounds(ctx: SelectContext, size: int, count: int) -> list[np.ndarray] | None:
    """:func:`epoch_batches` for ``count`` steps of every slot at once, or None.

    One ``(count, size)`` array per slot (rows sorted), the steps'
    :func:`epoch_batches` in order, drawn from the same random stream: a
    slot's new permutations are drawn in the order the steps would draw
    them (by step, then slot). ``None`` where a step would take fewer than
    ``size`` (a slot smaller than a batch) or a slot's walk is not under way
    (its first pass, or its samples changed): then step by step.
    """
    perms = ctx.state.get("perm", {})
    pos = ctx.state.get("pos", {})
    total = size * count
    events = []  # (step, slot): where a slot's walk begins a pass
    for slot, group in enumerate(ctx.groups):
        perm = perms.get(slot)
        if size < 1 or group.size < size or perm is None or perm.size != group.size:
            return None
        # offsets into the round's draws of the slot where a pass begins
        starts = np.arange(perm.size - pos[slot], total, group.size)
        events += [(int(o) // size, slot) for o in starts]
    fresh: dict[int, list[np.ndarray]] = {slot: [] for slot in range(len(ctx.groups))}
    epochs = ctx.state.setdefault("epochs", {})
    for _, slot in sorted(events):
        fresh[slot].append(ctx.rng.permutation(ctx.groups[slot].size))
        epochs[slot] = epochs.get(slot, 0) + 1
    out = []
    for slot, group in enumerate(ctx.groups):
        perm, start = perms[slot], pos[slot]
        walk = np.concatenate([perm[start:], *fresh[slot]])[:total]
        if fresh[slot]:
            perms[slot] = fresh[slot][-1]
            pos[slot] = total - (perm.size - start) - (len(fresh[slot]) - 1) * group.size
        else:
            pos[slot] = start + total
        batches = group[walk].reshape(count, size)
        batches.sort(axis=1)
        out.append(batches)
    return out


def walk_next(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """Up to ``size`` next samples of ``slot``'s walk, in walk order, within one pass.

    Fewer where the current pass ends (the next call begins a new one);
    :func:`walk_back` returns unused ones to the walk.
    """
    perm = _walk(ctx, slot)
    pos = ctx.state["pos"]
    n = max(0, min(size, perm.size - pos[slot]))
    pos[slot] += n
    return ctx.groups[slot][perm[pos[slot] - n : pos[slot]]]


def walk_back(ctx: SelectContext, slot: int, n: int) -> None:
    """Return the last ``n`` samples that :func:`walk_next` gave ``slot`` to its walk."""
    ctx.state["pos"][slot] -= n


def walk_epoch(ctx: SelectContext, slot: int) -> int:
    """The epoch (from 0) of :func:`epoch_batches`'s walk that ``slot``'s next draw starts in."""
    _walk(ctx, slot)
    return int(ctx.state.get("epochs", {}).get(slot, 0))


def mark_round(ctx: SelectContext) -> None:
    """Note where each slot's walk stands as a round begins, for its next pass.

    Once a strategy marks its rounds (from :meth:`Strategy.begin_round`),
    a new pass of a slot's walk draws last the samples that the last two
    rounds drew from the pass before: the round in flight while the next
    is selected ahead, and the round being selected. Each part is shuffled
    on its own and every sample is still drawn once a pass; the next
    rounds' candidates then hold none of the round in flight's samples
    (unless a round draws more than half a pass), so a strategy
    that reads their priorities (:meth:`SelectContext.check_ahead`) can
    select ahead rather than wait for them. Marks are strategy state: a
    resumed run, and a round taken back and selected again, walk the same.

    Examples
    --------
    >>> from daskpri.table.table import PriorityTable
    >>> ctx = SelectContext(table=PriorityTable([8]), groups=[np.arange(8)],
    ...     owner=np.zeros(1, np.int64), step=0, batch_size=2,
    ...     rng=np.random.default_rng(0), state={})
    >>> mark_round(ctx); first = walk_next(ctx, 0, 4)   # a round draws half the pass
    >>> mark_round(ctx); last = walk_next(ctx, 0, 4)    # the next round ends the pass
    >>> mark_round(ctx)                                  # and a third begins the next pass
    >>> new = np.concatenate([walk_next(ctx, 0, 4), walk_next(ctx, 0, 4)])
    >>> sorted(new[4:].tolist()) == sorted(last.tolist())  # the round in flight's come last
    True
    """
    perms = ctx.state.get("perm", {})
    marks = ctx.state.setdefault("round_marks", {})
    for slot in range(len(ctx.groups)):
        if perms.get(slot) is None:
            continue
        here = np.array([[ctx.state.get("epochs", {}).get(slot, 0), ctx.state["pos"][slot]]])
        before = marks.get(slot, np.empty((0, 2), dtype=np.int64))
        marks[slot] = np.concatenate([before[-1:], here]).astype(np.int64)


def _new_pass(ctx: SelectContext, slot: int, perm: np.ndarray | None) -> np.ndarray:
    """The permutation of ``slot``'s next pass after ``perm`` (see :func:`mark_round`)."""
    size = ctx.groups[slot].size
    marks = ctx.state.get("round_marks", {}).get(slot)
    if perm is None or perm.size != size or marks is None:
        return ctx.rng.permutation(size)
    epoch = ctx.state.get("epochs", {}).get(slot, 0)
    cuts = sorted({int(p) for e, p in marks if e == epoch and 0 < p < size})
    bounds = [0, *cuts, size]
    # each part of the spent pass shuffled on its own, the most recently drawn last
    return np.concatenate(
        [perm[a:b][ctx.rng.permutation(b - a)] for a, b in zip(bounds, bounds[1:], strict=False)]
    )


def _walk(ctx: SelectContext, slot: int) -> np.ndarray:
    """``slot``'s permutation, a new one begun (and counted) where the last is spent.

    A slot whose samples changed (a worker lost or added) begins a new pass
    too. Where the strategy marks its rounds, see :func:`mark_round`.
    """
    group = ctx.groups[slot]
    perms = ctx.state.setdefault("perm", {})
    pos = ctx.state.setdefault("pos", {})
    perm = perms.get(slot)
    if perm is None or perm.size != group.size or (group.size and pos[slot] >= perm.size):
        new = _new_pass(ctx, slot, perm)
        if perm is not None:
            epochs = ctx.state.setdefault("epochs", {})
            epochs[slot] = epochs.get(slot, 0) + 1
        perm = new
        perms[slot], pos[slot] = perm, 0
    return perm


def round_robin(ctx: SelectContext, slot: int, size: int) -> np.ndarray:
    """The next ``size`` samples of ``slot`` in index order, wrapping around."""
    group = ctx.groups[slot]
    if size <= 0 or group.size == 0:
        return _EMPTY
    ptr = ctx.state.setdefault("renew", {})
    start = ptr.get(slot, 0) % group.size
    take = np.arange(start, start + min(size, group.size)) % group.size
    ptr[slot] = (start + size) % group.size
    return np.sort(group[take])
