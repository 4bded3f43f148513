"""``upper-bound``: importance sampling by the gradient-norm upper bound.

Katharopoulos & Fleuret (2018), "Not All Samples Are Created Equal: Deep
Learning with Importance Sampling". The norm of the loss gradient with
respect to the logits bounds the full per-sample gradient norm up to a
constant, and costs a forward pass only.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from daskpri.strategies._checks import check_fraction, check_number, check_positive_int
from daskpri.strategies._walk import epoch_batches
from daskpri.strategies.base import (
    Batch,
    Computed,
    Strategy,
    check_score_dtype,
    score_dtype_of,
)
from daskpri.strategies.loss import importance_sample
from daskpri.strategies.selection import SelectContext, Selection

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch

    from daskpri.replicas.replica import Replica

#: Steps a batch's scores are awaited before it is left out of ``tau``.
_PATIENCE = 64


def logit_gradient_norms(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``||softmax(z_i) - onehot(y_i)||_2``: the norm of d CE(z_i, y_i) / d z_i.

    Parameters
    ----------
    logits : torch.Tensor, shape (n, classes)
        The logits ``z`` (detached, computed in float32).
    y : torch.Tensor, shape (n,)
        The labels.

    Returns
    -------
    torch.Tensor of float32, shape (n,)
        The norm of each row.

    Examples
    --------
    >>> import torch
    >>> z = torch.tensor([[0.0, 0.0], [10.0, -10.0]])
    >>> [round(v, 4) for v in logit_gradient_norms(z, torch.tensor([0, 1])).tolist()]
    [0.7071, 1.4142]
    """
    import torch  # (on the workers: the scheduler selects without it)
    import torch.nn.functional as F

    p = torch.softmax(logits.detach().float(), dim=1)
    return torch.linalg.vector_norm(p - F.one_hot(y, p.shape[1]).to(p.dtype), dim=1)


def variance_reduction(scores: np.ndarray) -> float:
    """``tau`` of a batch scored ``scores``: ``1 / sqrt(1 - ||g - u||^2 / ||g||^2)``.

    ``g`` are the scores normalised to sum to 1 and ``u = 1 / B``: the
    paper's estimate of the variance reduction of importance sampling, in
    units of batch-size increase. It is 1 for equal scores and ``sqrt(B)``
    when one score holds all the mass.

    Parameters
    ----------
    scores : numpy.ndarray
        The ``B`` scores of a batch (non-negative; all zero counts as equal).

    Returns
    -------
    float
        ``tau``, from 1 to ``sqrt(B)``.

    Examples
    --------
    >>> variance_reduction(np.ones(8))
    1.0
    >>> variance_reduction(np.array([1.0, 0.0, 0.0, 0.0]))
    2.0
    """
    s = np.asarray(scores, dtype=np.float64)
    u = 1.0 / s.size
    total = s.sum()
    g = s / total if total > 0 else np.full(s.size, u)
    # As VarianceReductionCondition.update in idiap/importance-sampling
    # (importance_sampling/samplers.py), the authors' reference code.
    return float(1.0 / np.sqrt(1.0 - ((g - u) ** 2).sum() / (g**2).sum()))


def draw_by_scores(
    scores: np.ndarray, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``size`` of ``B`` positions with replacement, ``p`` proportional to ``scores``.

    The weights ``1 / (B p)`` make the weighted mean over the draws an
    unbiased estimate of the mean over all ``B`` positions. Scores that are
    all zero give the uniform distribution.

    Parameters
    ----------
    scores : numpy.ndarray
        The ``B`` non-negative scores.
    size : int
        Number of draws.
    rng : numpy.random.Generator
        The generator to draw from.

    Returns
    -------
    positions : numpy.ndarray of int
        The positions drawn (a position may repeat).
    weights : numpy.ndarray of float64
        Their weights ``1 / (B p)``.

    Examples
    --------
    >>> pos, w = draw_by_scores(np.array([0.0, 1.0]), 3, np.random.default_rng(0))
    >>> pos.tolist(), w.tolist()
    ([1, 1, 1], [0.5, 0.5, 0.5])
    """
    s = np.asarray(scores, dtype=np.float64)
    total = s.sum()
    p = s / total if total > 0 else np.full(s.size, 1.0 / s.size)
    return importance_sample(p, size, rng)


class UpperBound(Strategy):
    """Importance sampling by the logit-gradient norm, on when it pays.

    Each worker draws ``presample * batch_size`` candidates in a shuffled
    pass over its data, scores them with a forward pass (the norm of the
    loss gradient with respect to the logits, ``||softmax(z) - onehot(y)||``,
    an upper bound of the per-sample gradient norm up to a constant), draws
    ``batch_size`` of them with replacement proportionally to the scores and
    backpropagates those with weights ``1 / (B p_i)`` (``B`` candidates), so
    the gradient is unbiased. All candidates' scores become priorities
    (Katharopoulos & Fleuret 2018).

    Importance sampling is switched on only when the estimated variance
    reduction pays for the extra forward passes: the selection keeps (in its
    checkpointed state) an exponential moving average of ``tau`` (see
    :func:`variance_reduction`) over the scores of each step's batches,
    starting from 0 as the authors' code does (the workers' batches of a
    step pooled, as the reference's one batch), and samples by
    importance while it exceeds ``tau_threshold``, by default
    ``(B + 3 b) / (3 b)`` (``B`` forwards plus ``b`` backwards, a backward
    costing two forwards, against ``b`` plain steps). While off, each worker
    trains on ``batch_size`` samples of its shuffled pass with weight 1; their
    scores come free with that forward pass and keep ``tau`` up to date.

    Parameters
    ----------
    presample : float
        Candidates scored per step, as a multiple of ``batch_size``; ``>= 1``.
    tau_threshold : float, optional
        Switch importance sampling on when the average ``tau`` exceeds this
        (``>= 1``); ``None`` takes the cost formula above.
    smoothing : float
        Momentum of the moving average of ``tau``, in [0, 1): the weight of
        the old average (0 uses the last step's ``tau`` alone).
    batch_size : int, optional
        Samples backpropagated per worker per step; ``None`` takes the
        trainer's.
    score_dtype : {"float32", "bfloat16", "float16"}
        Precision of the forward pass that scores the candidates
        (``torch.autocast``); training steps stay in float32.

    Examples
    --------
    >>> UpperBound()  # doctest: +NORMALIZE_WHITESPACE
    UpperBound(presample=3.0, tau_threshold=None, smoothing=0.9, batch_size=None,
               score_dtype='float32')
    >>> UpperBound().threshold(32)
    2.0
    """

    name = "upper-bound"
    unbiased = True

    def __init__(
        self,
        presample: float = 3.0,
        tau_threshold: float | None = None,
        smoothing: float = 0.9,
        batch_size: int | None = None,
        score_dtype: str = "float32",
    ) -> None:
        self.presample = check_number("presample", presample, 1.0)
        self.tau_threshold = (
            None if tau_threshold is None else check_number("tau_threshold", tau_threshold, 1.0)
        )
        # The reference code's momentum is 0.9; 1 would freeze the average at 0.
        self.smoothing = check_fraction("smoothing", smoothing, high_open=True)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.score_dtype = check_score_dtype(score_dtype)

    def presample_size(self, batch_size: int) -> int:
        """Candidates ``B`` scored per worker for ``batch_size`` backpropagated.

        Parameters
        ----------
        batch_size : int
            Samples backpropagated per worker per step.

        Returns
        -------
        int
            ``ceil(presample * batch_size)``, at least ``batch_size``.

        Examples
        --------
        >>> UpperBound().presample_size(32), UpperBound(presample=1.5).presample_size(3)
        (96, 5)
        """
        return max(batch_size, math.ceil(self.presample * batch_size))

    def threshold(self, batch_size: int) -> float:
        """The ``tau`` above which importance sampling is on.

        Parameters
        ----------
        batch_size : int
            Samples backpropagated per worker per step (``b``).

        Returns
        -------
        float
            ``tau_threshold`` where given, else ``(B + 3 b) / (3 b)`` with
            ``B`` the :meth:`presample_size`.

        Examples
        --------
        >>> UpperBound().threshold(32), UpperBound(tau_threshold=1.5).threshold(32)
        (2.0, 1.5)
        """
        if self.tau_threshold is not None:
            return self.tau_threshold
        # Eq. 29 of the paper, as ImportanceTraining.sampler in the reference code.
        big, b = self.presample_size(batch_size), batch_size
        return (big + 3 * b) / (3 * b)

    def update_tau(self, ctx: SelectContext) -> float:
        """Fold the scores of earlier steps' batches, once back, into the average ``tau``.

        The batches selected at each step wait in ``ctx.state["scored"]`` until
        the table holds their scores of that step (or of the round of local
        steps it was in): one update of the average per step, in step order,
        with the ``tau`` of the workers' batches' scores pooled. A step with
        fewer than two scores back (``batch_size=1`` on one worker) leaves the
        average as it was.

        Parameters
        ----------
        ctx : SelectContext
            The context of the step being selected; its ``state`` holds the
            average (``"tau"``) and the batches awaited (``"scored"``).

        Returns
        -------
        float
            The average ``tau`` (0 before any scores are back).

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([8, 8]), batch_size=2)
        >>> strategy = UpperBound(smoothing=0.0)
        >>> batches = [s.train for s in strategy.select(ctx)]  # step 0: tau is 0, off
        >>> ctx.table.update(np.concatenate(batches), np.array([0.01, 0.01, 0.01, 2.0]), step=0)
        >>> ctx.step = 1
        >>> round(strategy.update_tau(ctx), 4)
        1.9705
        """
        state = ctx.state
        tau = float(state.get("tau", 0.0))
        scored: dict[int, dict[int, np.ndarray]] = state.setdefault("scored", {})
        for step in sorted(scored):
            batches = list(scored[step].values())
            if step >= ctx.step:  # selected again (a retried step): its scores never come
                del scored[step]
                continue
            versions = [ctx.table.version[idx] for idx in batches]
            if not any((v >= step).any() for v in versions):
                if step < ctx.step - _PATIENCE:
                    del scored[step]
                continue  # not back yet (several steps selected at once)
            pooled = []
            for idx, v in zip(batches, versions, strict=True):
                back = v[v >= step]
                if back.size:
                    # the scores of that step, or of the round of local steps it
                    # was in (a round's come back as of its last step)
                    pooled.append(ctx.table.current[idx[v == back.min()]])
            # The workers' batches together are the step's batch, the one the
            # reference code's single process scores: pooled, a batch of one
            # per worker still estimates tau.
            scores = np.concatenate(pooled) if pooled else np.empty(0)
            if scores.size > 1:
                tau = self.smoothing * tau + (1.0 - self.smoothing) * variance_reduction(scores)
            del scored[step]
        state["tau"] = tau
        return tau

    def select(self, ctx: SelectContext) -> list[Selection]:
        """Each slot's next candidates in its shuffled pass: ``B`` while on, else ``b``.

        Updates the average ``tau`` first (:meth:`update_tau`); while it
        exceeds :meth:`threshold` each selection carries ``extra["draws"]``,
        the ``b`` draws the worker makes among its candidates.

        Takes and returns what :meth:`Strategy.select` does.

        Examples
        --------
        >>> import numpy as np
        >>> from daskpri.strategies import SelectContext
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([8, 8]), batch_size=2)
        >>> strategy = UpperBound(tau_threshold=1.2, smoothing=0.0)
        >>> [s.train.tolist() for s in strategy.select(ctx)]  # off: plain batches
        [[2, 4], [10, 14]]
        >>> ctx.table.update(np.array([2, 4, 10, 14]), np.array([0.01, 0.01, 0.01, 2.0]), step=0)
        >>> ctx.step = 1
        >>> on = strategy.select(ctx)  # tau 1.97 > 1.2: on
        >>> [s.train.size for s in on], on[0].extra["draws"].tolist()
        ([6, 6], [2])
        """
        b = self.batch_size or ctx.batch_size
        on = self.update_tau(ctx) > self.threshold(b)
        size = self.presample_size(b) if on else b
        # ``draws`` tells the worker half to sample ``b`` of the candidates.
        extra = {"draws": np.array([b], dtype=np.int64)} if on else {}
        out, batches = [], {}
        for slot in range(len(ctx.groups)):
            batches[slot] = epoch_batches(ctx, slot, size)
            out.append(Selection(train=batches[slot], extra=extra))
        ctx.state["scored"][ctx.step] = batches
        ctx.state["importance"] = int(on)
        return out

    def compute(self, replica: Replica, batch: Batch) -> Computed:
        """Score the candidates, draw and backpropagate ``draws`` of them; else train plainly.

        With ``extra["draws"]`` (importance sampling on): a forward pass in
        :attr:`score_dtype` scores every row by :func:`logit_gradient_norms`,
        :func:`draw_by_scores` draws the rows to backpropagate with their
        weights. Without: the train rows' (weighted) gradient, as
        :meth:`Strategy.compute`. Either way the scores are the priorities.

        Parameters
        ----------
        replica : Replica
            The worker's copy of the model.
        batch : Batch
            The selected samples.

        Returns
        -------
        Computed
            The gradient sum of the rows backpropagated and every row's
            score.

        Examples
        --------
        >>> import numpy as np, torch
        >>> from daskpri.models import MLP
        >>> from daskpri.replicas.replica import Replica
        >>> from daskpri.strategies import Batch
        >>> replica = Replica(MLP((4,), 3, hidden=8), "cpu")
        >>> batch = Batch(x=torch.linspace(-1, 1, 20).reshape(5, 4),
        ...               y=torch.tensor([0, 1, 2, 0, 1]), indices=np.arange(5), n_train=3,
        ...               weights=None, mean_grad=None, extra={}, seed=[0])
        >>> plain = UpperBound().compute(replica, batch)
        >>> plain.n_grad, plain.priorities.shape
        (3, (5,))
        >>> batch.extra = {"draws": np.array([2])}
        >>> UpperBound().compute(replica, batch).n_grad
        2
        """
        import torch  # (on the workers: the scheduler selects without it)

        if "draws" not in batch.extra:
            return self._compute_plain(replica, batch)
        losses, logits = replica.losses(batch.x, batch.y, score_dtype_of(self.score_dtype))
        scores = logit_gradient_norms(logits, batch.y).cpu().numpy().astype(np.float64)
        pos, w = draw_by_scores(scores, int(batch.extra["draws"][0]), batch.rng)
        sel = torch.as_tensor(pos, device=batch.x.device)
        weights = torch.as_tensor(w, dtype=torch.float32, device=batch.x.device)
        grad, _ = replica.grad_and_logits(batch.x[sel], batch.y[sel], weights)
        return Computed(
            grad=grad,
            n_grad=int(pos.size),
            rows=np.arange(batch.x.shape[0]),
            priorities=scores,
            loss_sum=float(losses.sum()),
            n_loss=int(scores.size),
            correct=int((logits.argmax(1) == batch.y).sum()),
        )

    def _compute_plain(self, replica: Replica, batch: Batch) -> Computed:
        """The train rows with their weights; scores of all rows from the forward pass."""
        import torch

        n = batch.n_train
        grad, losses, logits = replica.weighted_grad(batch.x[:n], batch.y[:n], batch.weights)
        scores = logit_gradient_norms(logits, batch.y[:n])
        if batch.x.shape[0] > n:
            _, score_logits = replica.losses(
                batch.x[n:], batch.y[n:], score_dtype_of(self.score_dtype)
            )
            scores = torch.cat([scores, logit_gradient_norms(score_logits, batch.y[n:])])
        return Computed(
            grad=grad,
            n_grad=n,
            rows=np.arange(batch.x.shape[0]),
            priorities=scores.cpu().numpy().astype(np.float64),
            loss_sum=float(losses.sum()),
            n_loss=n,
            correct=int((logits.argmax(1) == batch.y[:n]).sum()),
        )
