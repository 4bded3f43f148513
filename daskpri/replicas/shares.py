"""One worker's samples for the steps of a round, as they travel to it.

:class:`Shares` packs a round's steps for one worker slot in a few arrays;
:class:`Share` is one step of it, located in the worker's partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from daskpri.strategies.base import concat_selections


@dataclass
class Share:
    """One worker's samples for one step, located in its partitions.

    ``pids``/``local`` locate each selected sample (partition, row), in the
    order of ``indices``: the first ``n_train`` are trained on (with
    ``weights``), the rest only scored.
    """

    pids: np.ndarray
    local: np.ndarray
    n_train: int
    weights: np.ndarray | None
    indices: np.ndarray
    extra: dict[str, np.ndarray]
    #: seeds the worker half's random choices: (run seed, step, slot)
    seed: tuple[int, int, int]


@dataclass
class Shares:
    """One worker's samples for the steps of a round, packed in a few arrays.

    A round of many steps travels as a handful of arrays rather than many
    small ones (each array is a frame of its own on the wire).
    """

    #: every step's samples (train rows first, then scored rows), concatenated
    indices: np.ndarray
    #: step ``i``'s samples are ``indices[splits[i]:splits[i + 1]]``
    splits: np.ndarray
    n_train: np.ndarray
    #: the train rows' weights of the weighted steps, concatenated
    weights: np.ndarray
    #: which steps carry weights
    weighted: np.ndarray
    #: each step's extras, or ``[]`` where no step has any
    extra: list[dict[str, np.ndarray]]
    #: (run seed, first step, slot): step ``i`` is seeded (seed, first + i, slot)
    seed: tuple[int, int, int]
    #: partition bounds along ``sample``
    bounds: np.ndarray

    @classmethod
    def pack(
        cls,
        selections: Sequence[Any],
        seed: tuple[int, int, int],
        bounds: np.ndarray,
    ) -> Shares:
        """Pack one slot's :class:`~daskpri.strategies.Selection` of each step."""
        return cls.concat(**concat_selections(selections), seed=seed, bounds=bounds)

    @classmethod
    def concat(
        cls,
        *,
        train: np.ndarray,
        n_train: np.ndarray,
        score: np.ndarray,
        n_score: np.ndarray,
        weights: np.ndarray,
        weighted: np.ndarray,
        extra: list[dict[str, np.ndarray]],
        seed: tuple[int, int, int],
        bounds: np.ndarray,
    ) -> Shares:
        """Pack one slot's steps from the arrays the table sends, without a loop over them.

        ``train``: every step's train rows, concatenated (``n_train`` of
        each); ``score`` likewise; ``weights``: the weighted steps' weights,
        concatenated; ``extra``: each step's extras, ``[]`` where none has any.

        Examples
        --------
        >>> s = Shares.concat(train=np.array([1, 2, 3]), n_train=np.array([2, 1]),
        ...     score=np.array([7]), n_score=np.array([0, 1]), weights=np.empty(0),
        ...     weighted=np.zeros(2, bool), extra=[], seed=(0, 0, 0), bounds=np.array([0, 10]))
        >>> s.indices.tolist(), s.splits.tolist()
        ([1, 2, 3, 7], [0, 2, 4])
        """
        n_train = np.asarray(n_train, dtype=np.int64)
        n_score = np.asarray(n_score, dtype=np.int64)
        sizes = n_train + n_score
        splits = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        if not n_score.any():
            indices = np.asarray(train, dtype=np.int64)
        else:  # each step's train rows, then its scored rows
            indices = np.empty(int(splits[-1]), dtype=np.int64)
            t0 = np.concatenate([[0], np.cumsum(n_train)[:-1]])
            s0 = np.concatenate([[0], np.cumsum(n_score)[:-1]])
            indices[np.arange(train.size) + np.repeat(splits[:-1] - t0, n_train)] = train
            indices[np.arange(score.size) + np.repeat(splits[:-1] + n_train - s0, n_score)] = score
        return cls(
            indices=indices,
            splits=splits,
            n_train=n_train,
            weights=np.asarray(weights, dtype=float),
            weighted=np.asarray(weighted, dtype=bool),
            extra=list(extra),
            seed=seed,
            bounds=np.asarray(bounds, dtype=np.int64),
        )

    def __len__(self) -> int:
        return int(self.n_train.size)

    def partitions(self) -> np.ndarray:
        """The partitions that the round touches, in order."""
        touched = np.zeros(max(self.bounds.size - 1, 0), dtype=bool)
        touched[np.searchsorted(self.bounds, self.indices, side="right") - 1] = True
        return np.flatnonzero(touched)

    def locate(self) -> tuple[np.ndarray, np.ndarray]:
        """(partition, row within it) of every sample of the round."""
        if not hasattr(self, "_located"):  # once per round, on the worker
            pids = np.searchsorted(self.bounds, self.indices, side="right") - 1
            self._located = (pids, self.indices - self.bounds[pids])
        return self._located

    def share(self, i: int) -> Share:
        """Step ``i`` of the round."""
        pids, local = self.locate()
        if not hasattr(self, "_w0"):  # where each step's weights start
            self._w0 = np.concatenate([[0], np.cumsum(self.n_train * self.weighted)])
        a, b = self.splits[i], self.splits[i + 1]
        w0, n = int(self._w0[i]), int(self.n_train[i])
        return Share(
            pids=pids[a:b],
            local=local[a:b],
            n_train=n,
            weights=self.weights[w0 : w0 + n] if self.weighted[i] else None,
            indices=self.indices[a:b],
            extra=self.extra[i] if self.extra else {},
            seed=(self.seed[0], self.seed[1] + i, self.seed[2]),
        )
