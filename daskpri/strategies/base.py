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

The table half's types are in :mod:`daskpri.strategies.selection`; the
checks of a strategy's parameters and the shuffled walk over a worker's
samples, which the built-in strategies share, are in private modules and
importable from here too.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

# Re-exported: defined here before the module was split, and imported from here
# by the trainer, the table, the workers and strategies written outside daskpri.
from daskpri.strategies._checks import check_bool as check_bool
from daskpri.strategies._checks import check_fraction as check_fraction
from daskpri.strategies._checks import check_int as check_int
from daskpri.strategies._checks import check_number as check_number
from daskpri.strategies._checks import check_positive_int as check_positive_int
from daskpri.strategies._walk import epoch_batches as epoch_batches
from daskpri.strategies._walk import epoch_rounds as epoch_rounds
from daskpri.strategies._walk import mark_round as mark_round
from daskpri.strategies._walk import round_robin as round_robin
from daskpri.strategies._walk import walk_back as walk_back
from daskpri.strategies._walk import walk_epoch as walk_epoch
from daskpri.strategies._walk import walk_next as walk_next
from daskpri.strategies.selection import NotAhead as NotAhead
from daskpri.strategies.selection import SelectContext as SelectContext
from daskpri.strategies.selection import Selection as Selection
from daskpri.strategies.selection import TrainRound as TrainRound
from daskpri.strategies.selection import concat_selections as concat_selections

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch

    from daskpri.replicas.replica import Replica


@dataclass
class Batch:
    """The selected samples as a worker sees them, on its device.

    The worker builds it from a :class:`Selection` and hands it to
    :meth:`Strategy.compute`.

    Parameters
    ----------
    x, y : torch.Tensor
        The samples' features and labels: the train rows, then the rows
        only scored.
    indices : numpy.ndarray
        Global indices of the rows of ``x``.
    n_train : int
        How many of the first rows are train rows (``Selection.train``).
    weights : torch.Tensor, optional
        Importance weights of the train rows (``None``: all ones).
    mean_grad : torch.Tensor, optional
        The driver's running mean gradient, for strategies with
        :attr:`Strategy.uses_mean_grad`.
    extra : dict of str to numpy.ndarray
        The selection's extra arrays (``Selection.extra``).
    seed : numpy.random.Generator or sequence of int
        The generator of the worker half's random choices, or its seed.
    defer : bool, default False
        Whether :meth:`Strategy.compute` may leave the losses to the worker.

    Examples
    --------
    >>> import numpy as np, torch
    >>> batch = Batch(x=torch.zeros(3, 4), y=torch.tensor([0, 1, 1]), indices=np.array([7, 2, 9]),
    ...               n_train=2, weights=None, mean_grad=None, extra={}, seed=[0, 7])
    >>> batch.x[:batch.n_train].shape, batch.indices[batch.n_train:].tolist()
    (torch.Size([2, 4]), [9])
    """

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
        """The generator of the worker half's random choices.

        Made from :attr:`seed` on first use, then kept there, so later
        draws go on from it.

        Examples
        --------
        >>> import numpy as np, torch
        >>> batch = Batch(x=torch.zeros(2, 1), y=torch.zeros(2, dtype=torch.long),
        ...               indices=np.arange(2), n_train=2, weights=None, mean_grad=None,
        ...               extra={}, seed=[0, 7])
        >>> draws = batch.rng.integers(10, size=3)
        >>> np.array_equal(draws, np.random.default_rng([0, 7]).integers(10, size=3))
        True
        >>> batch.rng is batch.seed  # kept: the next draws go on from it
        True
        """
        if not isinstance(self.seed, np.random.Generator):
            self.seed = np.random.default_rng(list(self.seed))
        return self.seed


@dataclass
class Computed:
    """What a worker returns for its batch.

    What :meth:`Strategy.compute` returns; the fields' comments in the
    source say more.

    Parameters
    ----------
    grad : torch.Tensor or None
        ``sum_i w_i grad L_i`` over the samples backpropagated, flat;
        ``None`` where the replica kept it in the parameters' ``.grad``.
    n_grad : int
        How many samples the gradient sums.
    rows : numpy.ndarray or None
        The rows of the batch whose priority was computed (``None``: all,
        in order).
    priorities : numpy.ndarray, torch.Tensor or None
        Their priorities (``None`` where deferred).
    loss_sum : float, torch.Tensor or None
        The loss summed over the ``n_loss`` train rows (``None`` where
        deferred).
    n_loss : int
        The train rows ``loss_sum`` sums over.
    correct : int, torch.Tensor or None
        The train rows predicted right (``None`` where deferred).
    logits, labels : torch.Tensor, optional
        Deferred (:attr:`Batch.defer`): every row's logits and labels, from
        which the worker computes the priorities, loss sum and hits.

    Examples
    --------
    >>> import numpy as np
    >>> out = Computed(grad=None, n_grad=2, rows=None, priorities=np.array([0.5, 2.0]),
    ...                loss_sum=2.5, n_loss=2, correct=1)
    >>> out.loss_sum / out.n_loss
    1.25
    """

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

    Examples
    --------
    A strategy that trains on each worker's first ``k`` samples, every step:

    >>> import numpy as np
    >>> from daskpri.strategies import SelectContext, Selection, Strategy
    >>> from daskpri.table.table import PriorityTable
    >>> class FirstK(Strategy):
    ...     name = "first-k"
    ...     def __init__(self, k=2):
    ...         self.k = k
    ...     def select(self, ctx):
    ...         return [Selection(train=group[:self.k]) for group in ctx.groups]
    >>> FirstK()
    FirstK(k=2)
    >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
    >>> [s.train.tolist() for s in FirstK().select(ctx)]
    [[0, 1], [4, 5]]

    :func:`~daskpri.strategies.register_strategy` makes it available by
    name (``Trainer(model, strategy="first-k")``).
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
    #: training on them (one of :data:`SCORE_DTYPES`); the strategies
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
        """One :class:`Selection` per worker slot of ``ctx.groups``.

        Parameters
        ----------
        ctx : SelectContext
            The table, the workers' samples, the step, the batch size, the
            random generator and the strategy's state.

        Returns
        -------
        list of Selection
            One per slot, in the order of ``ctx.groups``, of the global
            indices that slot holds.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext, Uniform
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> [s.train.tolist() for s in Uniform().select(ctx)]
        [[0, 2], [6, 7]]
        """

    def select_round(
        self, ctx: SelectContext, count: int
    ) -> Sequence[list[Selection]] | None:
        """The selections of ``count`` steps from ``ctx.step`` at once, or None.

        An optional shortcut for a round of local steps: it must give what
        :meth:`select` gives step by step (and leave the same random state
        and strategy state): a list of steps, or a :class:`TrainRound`.
        ``None`` (the default): the table calls :meth:`select` once a step.

        Parameters
        ----------
        ctx : SelectContext
            As for :meth:`select`, at the round's first step.
        count : int
            Steps in the round.

        Returns
        -------
        sequence of list of Selection, or None
            ``count`` steps of one :class:`Selection` per slot, or ``None``
            to have the table call :meth:`select` step by step.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext, Uniform
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> Uniform().select_round(ctx, 3) is None  # a walk not under way yet
        True
        >>> _ = Uniform().select(ctx)
        >>> steps = Uniform().select_round(ctx, 3)
        >>> len(steps), [s.train.tolist() for s in steps[0]]
        (3, [[1, 3], [4, 5]])
        """
        return None

    def begin_round(self, ctx: SelectContext) -> None:
        """Called by the table before it selects a round (its steps from ``ctx.step``).

        A hook for strategies whose walk depends on where rounds begin
        (:func:`mark_round`); the default does nothing.

        Parameters
        ----------
        ctx : SelectContext
            As for :meth:`select`, at the round's first step.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext, Uniform
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4, 4]), batch_size=2)
        >>> Uniform().begin_round(ctx) is None
        True
        """
        return None

    def priority(self, losses: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The priorities the table keeps for rows with these losses and logits.

        Called on the worker, for every row a step forwards (trained or
        scored only). The default: the per-sample losses. A strategy that
        ranks by another score of the forward pass (``selective-backprop``'s
        ``score="entropy"``) returns it here, so that its plain and stale
        steps fill the table with what its fresh steps rank by. (A strategy
        that overrides :meth:`compute`, as ``projection`` does, sets its
        priorities there instead.)

        Parameters
        ----------
        losses : torch.Tensor, shape (n,)
            The rows' cross-entropy losses.
        logits : torch.Tensor, shape (n, classes)
            The rows' logits.

        Returns
        -------
        torch.Tensor, shape (n,)
            The rows' priorities.

        Examples
        --------
        >>> import torch
        >>> from daskpri.strategies import Uniform
        >>> Uniform().priority(torch.tensor([0.5, 2.0]), torch.zeros(2, 3))
        tensor([0.5000, 2.0000])
        """
        return losses

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        """Gradient of the train rows; losses of all rows as priorities.

        Runs on the worker. The rows only scored get a forward pass in
        :attr:`score_dtype`; the priorities are :meth:`priority`'s.

        Parameters
        ----------
        replica : Replica
            The worker's copy of the model, on its device.
        batch : Batch
            The selected samples: ``batch.n_train`` train rows, then the
            rows only scored.

        Returns
        -------
        Computed
            The weighted gradient sum of the train rows and the priorities
            of all rows (with :attr:`Batch.defer`, the logits instead).

        Examples
        --------
        >>> import numpy as np, torch
        >>> from daskpri.models import MLP
        >>> from daskpri.replicas.replica import Replica
        >>> from daskpri.strategies import Batch, Uniform
        >>> replica = Replica(MLP((4,), 3, hidden=8), "cpu")
        >>> batch = Batch(x=torch.linspace(-1, 1, 20).reshape(5, 4),
        ...               y=torch.tensor([0, 1, 2, 0, 1]), indices=np.arange(5), n_train=3,
        ...               weights=None, mean_grad=None, extra={}, seed=[0])
        >>> out = Uniform().compute(replica, batch)
        >>> out.grad.shape, out.n_grad, out.priorities.shape
        (torch.Size([67]), 3, torch.Size([5]))
        """
        import torch

        n, rows = batch.n_train, batch.x.shape[0]
        x, y = (batch.x, batch.y) if n == rows else (batch.x[:n], batch.y[:n])
        if batch.defer and batch.weights is None:
            grad, logits = replica.grad_and_logits(x, y)
            if rows > n:
                scored = replica.logits(batch.x[n:], score_dtype_of(self.score_dtype))
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
                batch.x[n:], batch.y[n:], score_dtype_of(self.score_dtype)
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

        Parameters
        ----------
        batch_size : int
            The trainer's batch size.
        samples : int
            The samples the worker holds.

        Returns
        -------
        int
            The default: the strategy's own ``batch_size`` where it has
            one, else the trainer's.

        Examples
        --------
        >>> from daskpri.strategies import Uniform
        >>> Uniform().gradients_per_step(64, 8000)
        64
        >>> Uniform(batch_size=32).gradients_per_step(64, 8000)
        32
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

        Returns
        -------
        dict of str to object
            Parameter names and values; the ``repr`` shows them.

        Examples
        --------
        >>> from daskpri.strategies import Loss
        >>> Loss(epsilon=0.5).get_params()
        {'epsilon': 0.5, 'renew': 0.0, 'batch_size': None}
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


#: The precisions a strategy's forward-only scoring passes may run in (torch's names).
SCORE_DTYPES = ("float32", "bfloat16", "float16")


def score_dtype_of(name: str) -> torch.dtype:
    """The torch dtype of ``name``, one of :data:`SCORE_DTYPES`.

    Examples
    --------
    >>> score_dtype_of("bfloat16")
    torch.bfloat16
    """
    import torch  # (on the workers, which compute; the scheduler only checks the name)

    return getattr(torch, check_score_dtype(name))


def check_score_dtype(value: Any) -> str:
    """``value`` if it names a scoring precision of :data:`SCORE_DTYPES`.

    Parameters
    ----------
    value : object
        The ``score_dtype`` a strategy was given.

    Returns
    -------
    str
        ``value``, unchanged.

    Raises
    ------
    ValueError
        If ``value`` is not one of :data:`SCORE_DTYPES`.

    Examples
    --------
    >>> check_score_dtype("bfloat16")
    'bfloat16'
    >>> check_score_dtype("fp16")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: score_dtype should be one of 'float32', ..., but got score_dtype='fp16'
    """
    if not isinstance(value, str) or value not in SCORE_DTYPES:
        raise ValueError(
            f"score_dtype should be one of {', '.join(map(repr, SCORE_DTYPES))}, "
            f"but got score_dtype={value!r}"
        )
    return value
