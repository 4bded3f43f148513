"""The priority table: per-sample priorities and per-partition summaries.

:class:`PriorityTable` is plain numpy. The cluster holds one inside the
scheduler (see :mod:`daskpri.table.plugin`), where it survives the loss of any
worker; tests and benchmarks use it directly. Its state, saved and restored
(``state_dict``, ``load_state_dict``, ``from_state_dict``), is in
:mod:`~daskpri.table._state`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from daskpri.table._state import TableStateMixin
from daskpri.table.staleness import estimate, validate_staleness

#: Observations kept per sample: enough for the quadratic staleness fit.
HISTORY = 3


class PriorityTable(TableStateMixin):
    """Priorities of ``N`` samples cut into partitions, with their history.

    Samples are numbered globally, partition by partition: partition ``p``
    holds samples ``offsets[p]`` to ``offsets[p + 1] - 1``.

    Parameters
    ----------
    partition_sizes : sequence of int
        Number of samples in each partition; each must be positive.
    staleness : {"keep", "exp-linear", "exp-quadratic"}
        How priorities not recomputed lately are estimated.
    n_bins : int
        Bins of the priority histograms in :meth:`summaries`.

    Examples
    --------
    >>> import numpy as np
    >>> table = PriorityTable([3, 2])
    >>> table.update(np.array([0, 4]), np.array([0.5, 2.0]), step=1)
    >>> table.topk(1, np.array([0, 4]), step=1).tolist()
    [4]
    >>> table.summaries(step=1)["max"].tolist()
    [0.5, 2.0]
    """

    def __init__(
        self,
        partition_sizes: Sequence[int] | np.ndarray,
        *,
        staleness: str = "keep",
        n_bins: int = 32,
    ) -> None:
        sizes = np.asarray(partition_sizes)
        if sizes.ndim != 1 or sizes.size == 0 or not np.issubdtype(sizes.dtype, np.integer):
            raise ValueError(
                "partition_sizes should be a non-empty 1-D sequence of integers, "
                f"but got {partition_sizes!r}"
            )
        empty = np.flatnonzero(sizes <= 0)
        if empty.size:
            raise ValueError(
                f"every partition should hold at least one sample, but partition "
                f"{int(empty[0])} has {int(sizes[empty[0]])} ({empty.size} empty in all)"
            )
        if not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
            raise ValueError(f"n_bins should be a positive integer, but got n_bins={n_bins!r}")
        self.staleness = validate_staleness(staleness)
        self.n_bins = int(n_bins)
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        n = int(self.offsets[-1])
        # The newest observation in contiguous arrays (``current`` is +inf
        # where unseen, so "keep" estimates are a view and unseen samples rank
        # first in a top-k), older ones beside them for the staleness fits.
        self.current = np.full(n, np.inf, dtype=np.float64)
        self.version = np.full(n, -1, dtype=np.int64)
        self.older_p = np.zeros((n, HISTORY - 1), dtype=np.float64)
        self.older_t = np.full((n, HISTORY - 1), -1, dtype=np.int64)
        self.n_updates = 0

    # -- shape ---------------------------------------------------------------

    @property
    def n_samples(self) -> int:
        """Number of samples.

        Examples
        --------
        >>> PriorityTable([3, 2]).n_samples
        5
        """
        return int(self.offsets[-1])

    @property
    def n_partitions(self) -> int:
        """Number of partitions.

        Examples
        --------
        >>> PriorityTable([3, 2]).n_partitions
        2
        """
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        """Samples per partition.

        Examples
        --------
        >>> PriorityTable([3, 2]).sizes.tolist()
        [3, 2]
        """
        return np.diff(self.offsets)

    @property
    def priority(self) -> np.ndarray:
        """The last computed priority of each sample (``nan`` where never computed).

        A new array: the staleness model is not applied (see :meth:`estimate`).

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0, 4]), np.array([0.5, 2.0]), step=1)
        >>> table.priority.tolist()
        [0.5, nan, nan, nan, 2.0]
        """
        return np.where(self.version >= 0, self.current, np.nan)

    def observations(self, indices: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """The last observations ``(p, t)`` of ``indices``, newest first, ``(n, 3)``.

        Parameters
        ----------
        indices : ndarray of int or slice
            Global sample indices.

        Returns
        -------
        p : ndarray of float64, shape (n, 3)
            The priorities observed, newest first; 0 where there is no
            observation.
        t : ndarray of int64, shape (n, 3)
            The steps at which they were computed; -1 where there is no
            observation.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0]), np.array([0.5]), step=1)
        >>> table.update(np.array([0]), np.array([0.25]), step=3)
        >>> p, t = table.observations(np.array([0, 4]))
        >>> p.tolist(), t.tolist()
        ([[0.25, 0.5, 0.0], [0.0, 0.0, 0.0]], [[3, 1, -1], [-1, -1, -1]])
        """
        p = np.column_stack([self.current[indices], self.older_p[indices]])
        t = np.column_stack([self.version[indices], self.older_t[indices]])
        return np.where(t >= 0, p, 0.0), t

    def partition_of(self, indices: np.ndarray) -> np.ndarray:
        """The partition that holds each of ``indices``.

        Parameters
        ----------
        indices : ndarray of int
            Global sample indices, in ``[0, n_samples)``.

        Returns
        -------
        ndarray of int
            The partition of each index, in the same order.

        Examples
        --------
        >>> import numpy as np
        >>> PriorityTable([3, 2]).partition_of(np.array([0, 2, 3, 4])).tolist()
        [0, 0, 1, 1]
        """
        return np.searchsorted(self.offsets, indices, side="right") - 1

    def indices_of(self, partitions: Sequence[int] | np.ndarray) -> np.ndarray:
        """The global indices of the samples in ``partitions``, in order.

        Parameters
        ----------
        partitions : sequence of int
            Partition numbers; the samples come in the order the partitions
            are given.

        Returns
        -------
        ndarray of int64
            The global indices of their samples (empty for no partitions).

        Examples
        --------
        >>> PriorityTable([3, 2]).indices_of([1, 0]).tolist()
        [3, 4, 0, 1, 2]
        """
        parts = np.asarray(partitions, dtype=np.int64)
        if parts.size == 0:
            return np.empty(0, dtype=np.int64)
        starts, stops = self.offsets[parts], self.offsets[parts + 1]
        lengths = stops - starts
        # One arange shifted per partition, without a Python loop over samples.
        shift = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + shift

    # -- updates ---------------------------------------------------------------

    def update(self, indices: np.ndarray, priorities: np.ndarray, step: int) -> None:
        """Record freshly computed ``priorities`` of ``indices`` at ``step``.

        Values are checked before anything is written: on error the table is
        unchanged. If an index repeats, its last value wins.

        Parameters
        ----------
        indices : ndarray of int, shape (n,)
            Global sample indices, in ``[0, n_samples)``.
        priorities : ndarray of float, shape (n,)
            Their new priorities; each must be finite.
        step : int
            The step at which they were computed (``>= 0``); the staleness
            models extrapolate from it.

        Raises
        ------
        ValueError
            If the shapes differ, an index is out of range, ``step`` is
            negative or a priority is not finite.
        TypeError
            If ``indices`` are not integers.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0, 4]), np.array([0.5, 2.0]), step=1)
        >>> table.priority.tolist()
        [0.5, nan, nan, nan, 2.0]
        >>> table.update(np.array([1]), np.array([np.nan]), step=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: priorities should be finite, but got 1 non-finite value(s), first nan ...
        """
        idx = np.asarray(indices)
        val = np.asarray(priorities, dtype=np.float64)
        if idx.ndim != 1 or val.ndim != 1 or idx.shape != val.shape:
            raise ValueError(
                "indices and priorities should be 1-D arrays of one length, but got "
                f"shapes {idx.shape} and {val.shape}"
            )
        if idx.size == 0:
            return
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"indices should be integers, but got dtype {idx.dtype}")
        if not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step should be a non-negative integer, but got step={step!r}")
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.n_samples:
            bad = lo if lo < 0 else hi
            raise ValueError(f"indices should lie in [0, {self.n_samples}), but got {bad}")
        finite = np.isfinite(val)
        if not finite.all():
            where = np.flatnonzero(~finite)
            raise ValueError(
                f"priorities should be finite, but got {where.size} non-finite value(s), "
                f"first {val[where[0]]} for sample {int(idx[where[0]])}"
            )
        if self.older_p.shape[1] > 1:
            self.older_p[idx, 1:] = self.older_p[idx, :-1]
            self.older_t[idx, 1:] = self.older_t[idx, :-1]
        self.older_p[idx, 0] = self.current[idx]
        self.older_t[idx, 0] = self.version[idx]
        self.current[idx] = val
        self.version[idx] = step
        self.n_updates += idx.size

    def forget(self, indices: np.ndarray) -> None:
        """Mark ``indices`` as never computed (they get the maximum priority).

        Their history is dropped too, so a staleness model starts afresh.

        Parameters
        ----------
        indices : ndarray of int
            Global sample indices.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0, 4]), np.array([0.5, 2.0]), step=1)
        >>> table.forget(np.array([4]))
        >>> table.priority.tolist(), table.estimate(1).tolist()
        ([0.5, nan, nan, nan, nan], [0.5, inf, inf, inf, inf])
        """
        idx = np.asarray(indices, dtype=np.int64)
        self.current[idx] = np.inf
        self.version[idx] = -1
        self.older_t[idx] = -1

    # -- queries -----------------------------------------------------------------

    def estimate(self, step: int, indices: np.ndarray | slice | None = None) -> np.ndarray:
        """Priorities at ``step`` under the staleness model; ``+inf`` if unseen.

        With the ``keep`` model and a slice, this is a read-only view.

        Parameters
        ----------
        step : int
            The step to estimate the priorities at.
        indices : ndarray of int or slice, optional
            Global sample indices; ``None``: every sample.

        Returns
        -------
        ndarray of float64
            The estimates, in the order of ``indices``.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2], staleness="exp-linear")
        >>> table.update(np.array([0]), np.array([1.0]), step=0)
        >>> table.update(np.array([0]), np.array([0.5]), step=1)
        >>> table.estimate(2, np.array([0, 1])).tolist()
        [0.25, inf]
        """
        sel = slice(None) if indices is None else indices
        if self.staleness == "keep":
            out = self.current[sel]
            if isinstance(sel, slice):
                out = out.view()
                out.flags.writeable = False
            return out
        p, t = self.observations(sel)
        return estimate(p, t, step, self.staleness)

    def topk(
        self,
        k: int,
        candidates: np.ndarray | slice,
        step: int,
        rng: np.random.Generator | None = None,
        exclude: np.ndarray | None = None,
    ) -> np.ndarray:
        """The ``k`` candidates of highest estimated priority, sorted by index.

        ``candidates`` are global indices, or a slice of them (the fast path
        for a worker's contiguous partitions). Unseen samples rank first; when
        more than ``k`` are unseen, ``rng`` picks among them uniformly (by
        position when ``rng`` is None). ``exclude`` lists global indices that
        may not be picked.

        Parameters
        ----------
        k : int
            How many samples to pick; fewer come back when there are fewer
            candidates.
        candidates : ndarray of int or slice
            The global indices to pick from.
        step : int
            The step whose estimates rank them (see :meth:`estimate`).
        rng : numpy.random.Generator, optional
            Picks among more than ``k`` unseen samples.
        exclude : ndarray of int, optional
            Global indices that may not be picked.

        Returns
        -------
        ndarray of int64
            The global indices picked, sorted.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0, 1, 2, 3]), np.array([0.5, 3.0, 1.0, 2.0]), step=1)
        >>> table.topk(2, np.array([0, 1, 2, 3]), step=1).tolist()
        [1, 3]
        >>> table.topk(2, slice(0, 5), step=1).tolist()  # 4 is unseen: it ranks first
        [1, 4]
        >>> table.topk(2, slice(0, 5), step=1, exclude=np.array([1])).tolist()
        [3, 4]
        """
        est = self.estimate(step, candidates)
        if isinstance(candidates, slice):
            start, stop, _ = candidates.indices(self.n_samples)
            cand = None
            base = start
        else:
            cand = np.asarray(candidates, dtype=np.int64)
            base = 0
        excluded = np.empty(0, dtype=np.int64) if exclude is None else np.asarray(exclude)
        pos = _topk_positions(est, k, rng, excluded.size)
        picked = pos + base if cand is None else cand[pos]
        if excluded.size:
            keep = ~np.isin(picked, excluded)
            order = np.argsort(-est[pos][keep], kind="stable")[:k]
            picked = picked[keep][order]
        return np.sort(picked)

    def summaries(self, step: int) -> dict[str, np.ndarray]:
        """Per-partition summaries of the last computed priorities.

        Returns a dict of arrays over partitions: ``sum``, ``max`` (``nan``
        where nothing was computed yet), ``count`` (samples), ``seen``
        (samples with a priority), ``staleness`` (mean steps since computed,
        over seen samples), ``histogram`` (partitions x bins) and
        ``bin_edges`` (bins + 1).

        Parameters
        ----------
        step : int
            The current step, from which ``staleness`` is counted.

        Returns
        -------
        dict of str to ndarray
            The summaries above.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([3, 2])
        >>> table.update(np.array([0, 1, 4]), np.array([0.5, 1.5, 2.0]), step=1)
        >>> s = table.summaries(step=3)
        >>> s["sum"].tolist(), s["seen"].tolist(), s["staleness"].tolist()
        ([2.0, 2.0], [2, 1], [2.0, 2.0])
        >>> s["histogram"].shape, s["bin_edges"].shape
        ((2, 32), (33,))
        """
        seen = self.version >= 0
        p = self.current
        starts = self.offsets[:-1]
        total = np.add.reduceat(np.where(seen, p, 0.0), starts)
        n_seen = np.add.reduceat(seen.astype(np.int64), starts)
        pmax = np.maximum.reduceat(np.where(seen, p, -np.inf), starts)
        age = np.add.reduceat(np.where(seen, step - self.version, 0), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            staleness = np.where(n_seen > 0, age / np.maximum(n_seen, 1), np.nan)
        edges = self.bin_edges()
        pid = np.repeat(np.arange(self.n_partitions), self.sizes)
        hist, _, _ = np.histogram2d(
            pid[seen], p[seen], bins=[np.arange(self.n_partitions + 1), edges]
        )
        return {
            "sum": total,
            "max": np.where(n_seen > 0, pmax, np.nan),
            "count": self.sizes,
            "seen": n_seen,
            "staleness": staleness,
            "histogram": hist.astype(np.int64),
            "bin_edges": edges,
        }

    def bin_edges(self) -> np.ndarray:
        """Histogram bin edges spanning the computed priorities.

        Returns
        -------
        ndarray of float64, shape (n_bins + 1,)
            Evenly spaced from the smallest computed priority to the largest
            (a span of 1 where they are all equal); ``[0, 1]`` before any
            priority is computed.

        Examples
        --------
        >>> import numpy as np
        >>> table = PriorityTable([2], n_bins=4)
        >>> table.bin_edges().tolist()
        [0.0, 0.25, 0.5, 0.75, 1.0]
        >>> table.update(np.array([0, 1]), np.array([1.0, 3.0]), step=0)
        >>> table.bin_edges().tolist()
        [1.0, 1.5, 2.0, 2.5, 3.0]
        """
        seen = self.version >= 0
        if not seen.any():
            return np.linspace(0.0, 1.0, self.n_bins + 1)
        p = self.current[seen]
        lo, hi = float(p.min()), float(p.max())
        if hi <= lo:
            hi = lo + 1.0
        return np.linspace(lo, hi, self.n_bins + 1)


def _topk_positions(
    est: np.ndarray, k: int, rng: np.random.Generator | None, slack: int = 0
) -> np.ndarray:
    """Positions of the ``k + slack`` largest of ``est`` (unseen = ``+inf`` first).

    When more than ``k + slack`` are unseen, ``rng`` picks among them.
    """
    want = k + slack
    if k <= 0 or est.size == 0:
        return np.empty(0, dtype=np.int64)
    if want >= est.size:
        return np.arange(est.size)
    n_unseen = int(np.count_nonzero(np.isposinf(est)))
    if n_unseen >= want:
        pool = np.flatnonzero(np.isposinf(est))
        if rng is None:
            return pool[:want]
        return pool[rng.choice(pool.size, size=want, replace=False)]
    return np.argpartition(est, est.size - want)[est.size - want :]
