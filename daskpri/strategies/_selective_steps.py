"""Which samples each step of ``selective-backprop`` trains, chosen on the driver.

:class:`SelectiveSteps` holds the selection half of
:class:`~daskpri.strategies.selective_backprop.SelectiveBackprop`: the
warmup's plain steps, the steps scored afresh on the workers, the stale steps
ranked or drawn by the table's losses, and the annealed steps. The strategy's
parameters and what the worker computes stay with the strategy.
"""

from __future__ import annotations

import math

import numpy as np

from daskpri.strategies._selective import _reference, keep_by_cdf, keep_top_fraction
from daskpri.strategies._walk import epoch_batches, mark_round, walk_back, walk_epoch, walk_next
from daskpri.strategies.selection import SelectContext, Selection

#: a stale step draws this times the candidates expected to fill its batch
_OVERSAMPLE = 1.5

#: marks a step trained without a scoring pass: plain (warmup, annealed) or
#: selected by stale losses (``Selection.extra`` holds arrays)
_STALE = np.ones(0, dtype=bool)


class SelectiveSteps:
    """The selection of :class:`~daskpri.strategies.selective_backprop.SelectiveBackprop`.

    A mixin: the strategy's ``__init__`` sets the parameters it reads.
    """

    fraction: float
    beta: float | None
    batch_size: int | None
    refresh: int | None
    warmup: float
    stale_beta: float | None
    prefilter: float
    wait_for_inflight: bool
    anneal_step: int | None
    recent_last: bool
    grad_scale: float
    cdf: str
    reads_table: bool

    def begin_round(self, ctx: SelectContext) -> None:
        """Mark where each slot's walk stands (:func:`mark_round`), with ``recent_last``.

        Only where the selection reads the table (:attr:`reads_table`): a
        new pass of the walk then draws the last two rounds' samples last.
        Otherwise it does nothing.

        Parameters
        ----------
        ctx : SelectContext
            As for :meth:`select`, at the round's first step.

        Examples
        --------
        >>> from daskpri.strategies.selective_backprop import SelectiveBackprop
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([8]), batch_size=2)
        >>> _ = walk_next(ctx, 0, 2)
        >>> SelectiveBackprop(recent_last=True).begin_round(ctx)  # reads no table: no mark
        >>> "round_marks" in ctx.state
        False
        >>> SelectiveBackprop(refresh=4, recent_last=True).begin_round(ctx)
        >>> ctx.state["round_marks"][0].tolist()  # slot 0's walk: epoch 0, 2 samples drawn
        [[0, 2]]
        """
        if self.recent_last and self.reads_table:
            mark_round(ctx)

    def fresh(self, epoch: int) -> bool:
        """Whether epoch ``epoch`` (counted from 0) of the walk scores afresh.

        Parameters
        ----------
        epoch : int
            An epoch of a slot's candidate walk, counted from 0.

        Returns
        -------
        bool
            True in epochs ``w, w + refresh, w + 2 refresh, ...``, where
            ``w`` is ``warmup`` rounded down (every epoch from ``w`` on
            without ``refresh``); False in the whole epochs of the warmup
            before ``w`` and in the stale epochs, ranked by the table's
            losses. (Where the warmup ends within epoch ``w``, its steps
            before that point are plain: :meth:`warming`.)

        Examples
        --------
        >>> from daskpri.strategies.selective_backprop import SelectiveBackprop
        >>> [SelectiveBackprop(refresh=3, warmup=0).fresh(e) for e in range(5)]
        [True, False, False, True, False]
        >>> [SelectiveBackprop(refresh=3, warmup=1).fresh(e) for e in range(5)]
        [False, True, False, False, True]
        >>> [SelectiveBackprop(refresh=3, warmup=0.5).fresh(e) for e in range(5)]  # from its middle
        [True, False, False, True, False]
        """
        first = math.floor(self.warmup)  # the epoch in which selection begins
        if epoch < first:
            return False
        return self.refresh is None or (epoch - first) % self.refresh == 0

    def warming(self, ctx: SelectContext, slot: int) -> bool:
        """Whether ``slot``'s next draw starts within the warmup's passes of its walk.

        Parameters
        ----------
        ctx : SelectContext
            The step's context; its ``state`` holds where each slot's walk
            stands.
        slot : int
            The worker slot, an index into ``ctx.groups``.

        Returns
        -------
        bool
            True while the draw would start before ``warmup`` passes of the
            slot's samples: its step is then plain mini-batch SGD.

        Examples
        --------
        >>> from daskpri.strategies.selective_backprop import SelectiveBackprop
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([8]), batch_size=2)
        >>> sb = SelectiveBackprop(warmup=0.5)
        >>> [(sb.warming(ctx, 0), walk_next(ctx, 0, 2).size)[0] for _ in range(5)]
        [True, True, False, False, False]
        """
        epoch = walk_epoch(ctx, slot)
        if epoch >= self.warmup:
            return False
        passed = ctx.state["pos"][slot] / max(1, ctx.groups[slot].size)
        return epoch + passed < self.warmup

    def select(self, ctx: SelectContext) -> list[Selection]:
        """Each slot's next samples in its walk: plain, candidates to score, or kept by the table.

        By where the slot's walk stands: in the warmup, and from
        ``anneal_step`` on, ``batch_size`` samples to train plainly; in a
        fresh epoch (:meth:`fresh`) ``batch_size / fraction`` candidates
        (with ``beta``, ``batch_size * (beta + 1)``) for :meth:`compute` to
        score, with ``prefilter`` the top share by the table's losses of a
        larger draw; in a stale epoch the candidates kept by the table's
        losses, the top ``fraction`` or with ``beta`` the probabilistic rule's
        until ``batch_size`` are kept, to train without a scoring pass. The
        steps trained without one carry ``extra["stale"]`` (and
        ``extra["scaled"]`` where selected and ``grad_scale`` is not 1); with
        ``beta``, the others carry the CDF's ``reference`` and the
        ``batch_size`` a step keeps at most.

        Parameters
        ----------
        ctx : SelectContext
            The table, the workers' samples, the step and the random state.

        Returns
        -------
        list of Selection
            One per worker slot.

        Examples
        --------
        >>> from daskpri.strategies.selective_backprop import SelectiveBackprop
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([8, 8]), batch_size=2)
        >>> warm = SelectiveBackprop().select(ctx)  # the warmup's first epoch: plain steps
        >>> [s.train.tolist() for s in warm], sorted(warm[0].extra)
        ([[2, 4], [10, 14]], ['stale'])
        >>> sb = SelectiveBackprop(fraction=0.5, warmup=0, refresh=2)
        >>> ctx.state = {}  # a new walk
        >>> [s.train.size for s in sb.select(ctx)]  # epoch 0 is fresh: 2 / 0.5 candidates
        [4, 4]
        >>> ctx.table.update(np.arange(16), np.arange(16.0), step=0)  # their losses
        >>> _ = sb.select(ctx)  # the rest of epoch 0
        >>> stale = sb.select(ctx)  # epoch 1: the top half of 4 candidates by the table
        >>> [s.train.tolist() for s in stale], sorted(stale[0].extra)
        ([[3, 6], [14, 15]], ['stale'])
        """
        size = self.batch_size or ctx.batch_size
        keep = self.fraction if self.beta is None else 1.0 / (self.beta + 1.0)
        n_cand = math.ceil(size / keep)
        annealed = self.anneal_step is not None and ctx.step >= self.anneal_step
        extra: dict[str, np.ndarray] = {}
        if self.beta is not None and not annealed:  # annealed steps read no CDF
            extra["reference"] = _reference(ctx, self.cdf)
            extra["batch_size"] = np.asarray(size)  # the most a fresh step keeps
        out = []
        for s in range(len(ctx.groups)):
            epoch = walk_epoch(ctx, s)
            if annealed or (epoch < self.warmup and self.warming(ctx, s)):  # plain SGD
                out.append(Selection(train=epoch_batches(ctx, s, size), extra={"stale": _STALE}))
                continue
            fresh = self.fresh(epoch)
            if not fresh and self.beta is not None:
                kept = self._draw_stale(ctx, s, size, extra["reference"])
                out.append(Selection(train=kept, extra=self._stale_extra))
                continue
            prefilter = fresh and self.prefilter < 1.0
            draw = math.ceil(n_cand / self.prefilter) if prefilter else n_cand
            cand = epoch_batches(ctx, s, draw)
            if fresh and not prefilter:
                out.append(Selection(train=cand, extra=extra))
                continue
            # ranked by the table's losses: the top share is scored afresh on the worker
            # (prefilter: the table's easy samples are not), or trained in a plain step (stale)
            if self.wait_for_inflight:
                ctx.check_ahead(cand)
            share = self.prefilter if fresh else self.fraction
            kept = cand[keep_top_fraction(ctx.table.estimate(ctx.step, cand), share, ctx.rng)]
            out.append(Selection(train=kept, extra=extra if fresh else self._stale_extra))
        return out

    @property
    def _stale_extra(self) -> dict[str, np.ndarray]:
        """A selected step's extras where it is trained without a scoring pass."""
        if self.grad_scale == 1.0:
            return {"stale": _STALE}
        return {"stale": _STALE, "scaled": _STALE}

    def _draw_stale(
        self, ctx: SelectContext, slot: int, size: int, reference: np.ndarray
    ) -> np.ndarray:
        """The probabilistic rule on the table's losses, ``size`` samples kept.

        With ``stale_beta``, its selectivity instead of ``beta``.

        As Jiang et al. run it: the walk's candidates, in order, are each kept
        with probability ``CDF(L)^beta`` until the batch is full; those after
        the last one kept stay in the walk for the next step. (Keeping from a
        fixed number of candidates would keep more than ``1/(beta+1)`` of
        them here: the walk's next candidates have not been trained this
        epoch, and their losses rank high against the table's.) Stops short
        after one pass's worth of candidates.
        """
        assert self.beta is not None
        beta = self.beta if self.stale_beta is None else self.stale_beta
        keep = 1.0 / (beta + 1.0)
        limit = ctx.groups[slot].size
        parts, need, drawn = [], size, 0
        while need > 0 and drawn < limit:
            # half again the candidates expected to fill the batch, so that one draw
            # mostly does: each costs a few numpy calls, and the table's selection is
            # on the workers' path whenever it has to wait for the round in flight
            ask = math.ceil(_OVERSAMPLE * need / keep)
            cand = walk_next(ctx, slot, min(ask, limit - drawn))
            losses = ctx.table.estimate(ctx.step, cand)
            rows = keep_by_cdf(losses, reference, beta, ctx.rng)
            if rows.size >= need:  # full: the candidates after the last kept go back
                rows = rows[:need]
                walk_back(ctx, slot, cand.size - int(rows[-1]) - 1)
                cand = cand[: int(rows[-1]) + 1]
            # only the candidates this step consumed decide what it keeps (a kept row's
            # fate depends on its own loss and draw): those are the priorities it reads
            if self.wait_for_inflight:
                ctx.check_ahead(cand)
            parts.append(cand[rows])
            need -= rows.size
            drawn += cand.size
        return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
