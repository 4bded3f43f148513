"""Selective-backprop's rules for which candidates a step keeps.

Pure functions of arrays (and, for the probabilistic rule's reference, of the
table as a :class:`~daskpri.strategies.selection.SelectContext` sees it): the
top fraction by loss, on NumPy arrays or on a tensor where it lies, and the
``CDF(L)^beta`` rule of Jiang et al. (2019) with its reference sample of the
table's losses.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from daskpri.strategies.selection import SelectContext

if TYPE_CHECKING:  # torch is the workers' (compute's): the scheduler selects without it
    import torch


def keep_top_fraction(
    losses: np.ndarray, fraction: float, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Rows of the ``ceil(fraction * n)`` highest losses, in row order.

    Ties at the cut are broken as :func:`keep_top` breaks them.

    Examples
    --------
    >>> keep_top_fraction(np.array([0.1, 0.9, 0.5, 0.2]), 0.5).tolist()
    [1, 2]
    """
    n = losses.size
    return keep_top(losses, min(n, max(1, math.ceil(fraction * n))), rng)


def keep_top(
    losses: np.ndarray, k: int, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Rows of the ``k`` highest losses, in row order.

    Where losses tie at the cut (the ``k``-th highest equals the next), the
    rows kept among the tied ones are drawn with ``rng``, so that no row is
    favoured for its position (candidates come in sample order: unseen ones,
    whose losses are all ``+inf``, would otherwise always leave the later
    samples out); without ``rng`` they go to the earlier rows. ``rng`` is
    drawn from only where such a tie occurs.

    Examples
    --------
    >>> keep_top(np.array([0.1, 0.9, 0.5, 0.9]), 2).tolist()
    [1, 3]
    >>> keep_top(np.array([0.1, 0.9, 0.5, 0.5]), 2).tolist()  # a tie at the cut
    [1, 2]
    >>> unseen = np.full(4, np.inf)  # every pair of the four, over 50 draws
    >>> len({tuple(keep_top(unseen, 2, np.random.default_rng(s))) for s in range(50)})
    6
    """
    order = np.argsort(-losses, kind="stable")
    if rng is None or k <= 0 or k >= losses.size or losses[order[k - 1]] != losses[order[k]]:
        return np.sort(order[:k])
    cut = losses[order[k - 1]]
    above = np.flatnonzero(losses > cut)
    tied = np.flatnonzero(losses == cut)
    drawn = rng.choice(tied, k - above.size, replace=False)
    return np.sort(np.concatenate([above, drawn]))


def top_rows(losses: torch.Tensor, fraction: float) -> torch.Tensor:
    """:func:`keep_top_fraction` on a tensor, where it lies: the kept rows, in row order.

    Examples
    --------
    >>> import torch
    >>> top_rows(torch.tensor([0.1, 0.9, 0.5, 0.2]), 0.5).tolist()
    [1, 2]
    """
    import torch  # (on the workers: the scheduler selects without it)

    n = losses.numel()
    keep = min(n, max(1, math.ceil(fraction * n)))
    return torch.topk(losses, keep, sorted=False).indices.sort().values


def keep_by_cdf(
    losses: np.ndarray, reference: np.ndarray, beta: float, rng: np.random.Generator
) -> np.ndarray:
    """Rows kept with probability ``CDF(L)^beta`` (Jiang et al. 2019).

    ``reference`` is a sorted sample of recent losses that defines the CDF.

    Computed without a search: with ``n`` reference losses and the uniform
    draw ``u``, ``u < CDF(L)^beta`` holds exactly when ``L`` reaches the
    reference's ``floor(u^(1/beta) * n)``-th loss (from 0), so each row
    costs a gather and a comparison. The same draws keep the same rows as
    ``np.searchsorted(reference, losses, side="right") / n`` would, but
    that binary search mispredicts a branch at most levels for keys in no
    order, 28 us against about 5 for 576 candidates in a 1,024-loss
    reference (this CPU, the stale steps' selection on the MNIST-1D CNN).

    Examples
    --------
    >>> ref = np.array([0.1, 0.2, 0.3, 0.4])
    >>> keep_by_cdf(np.array([0.05, 0.4, np.inf]), ref, 1.0, np.random.default_rng(0)).tolist()
    [1, 2]
    """
    u = rng.random(losses.size)
    if reference.size == 0:
        return np.flatnonzero(u < 1.0)
    v = u if beta == 1.0 else u ** (1.0 / beta)
    at = np.minimum((v * reference.size).astype(np.int64), reference.size - 1)
    return np.flatnonzero(losses >= reference[at])


#: how many of the table's losses make the CDF of the probabilistic rule
_REFERENCE_SIZE = 1024


#: what the probabilistic rule's CDF may be taken over (``SelectiveBackprop(cdf=...)``)
CDF_REFERENCES = ("table", "recent")


def _reference(ctx: SelectContext, cdf: str = "table") -> np.ndarray:
    """The probabilistic rule's CDF: a sorted sample of the table's losses.

    With ``cdf="table"``, a draw of the losses of all the samples seen, one
    a sample; with ``cdf="recent"``, the losses computed last (the highest
    versions), as Jiang et al.'s rolling history of the last forward passes.

    Drawn (with replacement: a draw without permutes all the losses) once
    for each state of the table: the steps of a round, selected before the
    next priorities arrive, share it. It is kept in the strategy's state,
    so that a round selected at once, step by step, after a checkpoint's
    resume or again after a round selected ahead was taken back draws the
    same. Under a staleness model other than ``keep`` the losses are
    estimated at each step, and it is drawn for each step.

    Examples
    --------
    >>> from daskpri.table.table import PriorityTable
    >>> table = PriorityTable([4])
    >>> table.update(np.arange(3), np.array([0.3, 0.1, 0.2]), step=0)
    >>> ctx = SelectContext.local(table, batch_size=2, step=1)
    >>> _reference(ctx).tolist()  # the three seen, sorted
    [0.1, 0.2, 0.3]
    >>> _reference(ctx) is ctx.state["reference"]["losses"]  # the table has not changed
    True
    >>> table = PriorityTable([2000])
    >>> table.update(np.arange(1000), np.full(1000, 2.0), step=0)
    >>> table.update(np.arange(1000, 2000), np.full(1000, 1.0), step=5)
    >>> ctx.table, ctx.state = table, {}
    >>> _reference(ctx, "recent")[[0, 975, 1023]].tolist()  # the 1,000 of step 5 first
    [1.0, 1.0, 2.0]
    """
    key = [ctx.table.n_updates, ctx.step if ctx.table.staleness != "keep" else -1]
    kept = ctx.state.get("reference")
    if kept is not None and list(kept["key"]) == key:
        return kept["losses"]
    version = ctx.table.version
    seen = np.flatnonzero(version >= 0)
    if seen.size > _REFERENCE_SIZE and cdf == "recent":
        seen = seen[np.argpartition(version[seen], seen.size - _REFERENCE_SIZE)[-_REFERENCE_SIZE:]]
    elif seen.size > _REFERENCE_SIZE:
        seen = seen[ctx.rng.integers(0, seen.size, _REFERENCE_SIZE)]
    losses = np.sort(ctx.table.estimate(ctx.step, seen))
    ctx.state["reference"] = {"key": np.asarray(key, dtype=np.int64), "losses": losses}
    return losses
