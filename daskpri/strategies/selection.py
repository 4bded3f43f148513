"""The table half's types: what :meth:`Strategy.select` sees and returns.

:class:`SelectContext` (the table and the cluster as a selection sees them),
:class:`Selection` (one worker slot's samples of a step), :class:`NotAhead`
(a selection made ahead that must wait), and a round's selections packed as
arrays for the workers (:func:`concat_selections`, :class:`TrainRound`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskpri.table.table import PriorityTable

_EMPTY = np.empty(0, dtype=np.int64)


class NotAhead(Exception):
    """A selection made ahead would read priorities the table does not hold yet.

    The table then takes the selection back and the driver selects the round
    once the round in flight has returned its priorities.

    Examples
    --------
    >>> from daskpri.table.table import PriorityTable
    >>> ctx = SelectContext.local(PriorityTable([4]), batch_size=2, step=1)
    >>> ctx.inflight = np.array([False, True, False, False])
    >>> ctx.check_ahead(np.array([0, 1]))
    Traceback (most recent call last):
    ...
    daskpri.strategies.selection.NotAhead: 1 of the samples read are in flight
    """


@dataclass
class Selection:
    """The samples one worker processes in a step (global indices).

    Parameters
    ----------
    train : numpy.ndarray
        Samples whose gradient enters the update.
    weights : numpy.ndarray, optional
        Importance weights of ``train`` (``None``: all ones).
    score : numpy.ndarray, optional
        Samples whose priority is recomputed without entering the update.
    extra : dict of str to numpy.ndarray, optional
        Extra arrays the worker half needs.

    Examples
    --------
    >>> s = Selection(train=np.array([3, 1]), score=np.array([0]))
    >>> s.weights is None, s.score.tolist(), s.extra
    (True, [0], {})
    """

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

    Parameters
    ----------
    selections : sequence of Selection
        One worker's selections, one a step.

    Returns
    -------
    dict of str to numpy.ndarray or list
        The arrays above: ``train``, ``n_train``, ``score``, ``n_score``,
        ``weighted``, ``weights`` and ``extra`` (a list).

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
        """Number of worker slots.

        Examples
        --------
        >>> TrainRound([np.zeros((3, 2)), np.ones((3, 2))]).n_slots
        2
        """
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
        """Slot ``slot``'s steps as :func:`concat_selections` gives them.

        Parameters
        ----------
        slot : int
            The worker slot.

        Returns
        -------
        dict of str to numpy.ndarray or list
            The keys of :func:`concat_selections`: the train rows of every
            step, nothing scored, no weights, no extras.

        Examples
        --------
        >>> r = TrainRound([np.array([[0, 1], [2, 3]]), np.array([[8, 9], [6, 7]])])
        >>> a = r.slot_arrays(0)
        >>> a["train"].tolist(), a["n_train"].tolist(), a["n_score"].tolist()
        ([0, 1, 2, 3], [2, 2], [0, 0])
        """
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
    """What :meth:`Strategy.select` sees of the table and the cluster.

    The table builds one for each selection.

    Parameters
    ----------
    table : PriorityTable
        The priorities of every sample.
    groups : list of numpy.ndarray
        Global sample indices held by each worker slot (sorted).
    owner : numpy.ndarray
        Worker slot of each partition.
    step : int
        The step being selected (the first of a round).
    batch_size : int
        The trainer's batch size.
    rng : numpy.random.Generator
        The random generator of the selection: a strategy draws from it
        and no other, so a run is reproducible.
    state : dict
        The strategy's own state, kept with the table and checkpointed
        with it.
    inflight : numpy.ndarray, optional
        Where a round is selected ahead, a mask over the samples whose
        priorities the workers are computing.

    Examples
    --------
    >>> from daskpri.table.table import PriorityTable
    >>> ctx = SelectContext.local(PriorityTable([2, 2, 4]), batch_size=2, owner=[0, 0, 1])
    >>> ctx.candidates(1), ctx.owner_of(np.array([1, 5])).tolist()
    (slice(4, 8, None), [0, 1])
    """

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

    @classmethod
    def local(
        cls,
        table: PriorityTable,
        batch_size: int,
        *,
        owner: Sequence[int] | np.ndarray | None = None,
        step: int = 0,
        seed: int = 0,
    ) -> SelectContext:
        """A context on ``table`` without a cluster, to try a strategy's selection.

        Parameters
        ----------
        table : PriorityTable
            The priorities.
        batch_size : int
            The trainer's batch size.
        owner : sequence of int, optional
            The worker slot of each partition; by default partition ``i`` is
            slot ``i``'s.
        step : int
            The step being selected.
        seed : int
            Seeds the selection's generator.

        Returns
        -------
        SelectContext
            With an empty strategy state, nothing in flight.

        Examples
        --------
        >>> from daskpri.table.table import PriorityTable
        >>> from daskpri.strategies import get_strategy
        >>> ctx = SelectContext.local(PriorityTable([2, 2, 4]), batch_size=2, owner=[0, 0, 1])
        >>> [g.tolist() for g in ctx.groups]
        [[0, 1, 2, 3], [4, 5, 6, 7]]
        >>> [s.train.size for s in get_strategy("uniform").select(ctx)]
        [2, 2]
        """
        slots = np.arange(table.n_partitions) if owner is None else np.asarray(owner)
        if slots.shape != (table.n_partitions,):
            raise ValueError(
                f"owner should give a worker slot for each of the table's {table.n_partitions} "
                f"partitions, but got owner={owner!r}"
            )
        groups = [table.indices_of(np.flatnonzero(slots == s)) for s in range(int(slots.max()) + 1)]
        return cls(
            table=table, groups=groups, owner=slots, step=step, batch_size=batch_size,
            rng=np.random.default_rng(seed), state={},
        )

    def check_ahead(self, indices: np.ndarray) -> None:
        """Raise :class:`NotAhead` if a priority of ``indices`` is in flight.

        A strategy that selects ahead (:attr:`Strategy.selects_ahead`) calls
        it before it reads the priorities of ``indices``.

        Parameters
        ----------
        indices : numpy.ndarray
            Global indices of the samples whose priorities are to be read.

        Raises
        ------
        NotAhead
            If the round in flight holds one of them (see :attr:`inflight`).

        Examples
        --------
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([4]), batch_size=2, step=1)
        >>> ctx.inflight = np.array([False, True, False, False])
        >>> ctx.check_ahead(np.array([0, 2]))  # none in flight: nothing happens
        >>> ctx.check_ahead(np.array([1, 2]))
        Traceback (most recent call last):
        ...
        daskpri.strategies.selection.NotAhead: 1 of the samples read are in flight
        """
        if self.inflight is not None and indices.size and self.inflight[indices].any():
            raise NotAhead(f"{int(self.inflight[indices].sum())} of the samples read are in flight")

    def candidates(self, slot: int) -> np.ndarray | slice:
        """The samples of ``slot``: a slice when they are contiguous (fast path).

        Parameters
        ----------
        slot : int
            The worker slot.

        Returns
        -------
        slice or numpy.ndarray
            Its global indices, as :meth:`PriorityTable.topk` takes them.

        Examples
        --------
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([2, 2, 4]), batch_size=2, owner=[0, 0, 1])
        >>> ctx.candidates(0)
        slice(0, 4, None)
        >>> ctx.groups[0] = np.array([0, 2, 3])
        >>> ctx.candidates(0).tolist()
        [0, 2, 3]
        """
        group = self.groups[slot]
        if group.size and int(group[-1]) - int(group[0]) + 1 == group.size:
            # groups are sorted and unique, so this span is exactly the group
            return slice(int(group[0]), int(group[-1]) + 1)
        return group

    def owner_of(self, indices: np.ndarray) -> np.ndarray:
        """The worker slot holding each of ``indices``.

        Parameters
        ----------
        indices : numpy.ndarray
            Global sample indices.

        Returns
        -------
        numpy.ndarray
            The slot of each, in the same order.

        Examples
        --------
        >>> from daskpri.table.table import PriorityTable
        >>> ctx = SelectContext.local(PriorityTable([2, 2, 4]), batch_size=2, owner=[0, 0, 1])
        >>> ctx.owner_of(np.array([5, 1, 3])).tolist()
        [1, 0, 0]
        """
        return self.owner[self.table.partition_of(indices)]
